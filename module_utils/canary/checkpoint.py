"""Tiny same-architecture checkpoints for the canary serve (module canary_checkpoint).

The canary starts the real SGLang runtime with the real launch flags on a host's GPUs before
the 595 GB download, so that a kernel, an attention backend or a flag that does not run there
fails in minutes. What it needs is a checkpoint that takes the same code paths as the real one:
the same model class, config classes, attention kind, MoE routing, quantization scheme and
tensor names, with every dimension that selects a kernel (or a kernel's template) kept, and
everything else small. The numerics are not the real model's: the weights are random. What a
passing canary proves is kernels and flags, not output quality (docs/models.md, "Tiny canary
checkpoints", has the table of what is kept and what is scaled, per model, with the reasons).

Standard library only: the module runs with the host's own Python before any venv exists, and
writes safetensors itself. The weights come from hashlib.shake_256 over the seed and the
tensor's name (deterministic by specification, so the same inputs give the same bytes on every
host and every run), mapped to small finite bfloat16 values; norms are 1 (0 for the
zero-centred norms of Qwen3.5, whose scale is 1 + weight), biases 0, the router's correction
bias 0 (float32), the Gated DeltaNet decay A_log = ln(1..16) and dt_bias 1.

Kept, per model family (sources are sglang 0.5.23's files, python/sglang/srt/...):

- MLA targets (Kimi K2.6, DeepSeek-V3 text): kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim
  and v_head_dim exactly (FlashMLA, flashinfer's and trtllm-gen's MLA kernels are built for a
  512 + 64 latent only), and the head count, so every TP rank holds as many heads as on the
  real model at any TP size. The MoE keeps num_experts_per_tok, n_group, topk_group, the
  shared experts, first_k_dense_replace and the per-rank expert width (moe_intermediate_size):
  the Marlin INT4 MoE kernels need hidden % 128 == 0 and (moe_intermediate_size / tp) %
  max(64, group_size) == 0 (layers/quantization/marlin_utils.py,
  check_moe_marlin_supports_layer; GPTQ_MARLIN_MIN_THREAD_N 64 and _K 128 for dense Marlin).
  The routed expert count is cut to one that takes the same top-k kernel: for ungrouped
  sigmoid routing, 384 (Kimi) and any count up to 512 that is not a power of two run the
  unified Triton router moe_fused_gate, a power of two up to 384 runs flashinfer's
  fused_topk_deepseek instead (layers/moe/topk.py, biased_grouped_topk_gpu), so the tiny count
  is a power of two exactly when the real one is. The hidden size is a multiple of 256 so the
  min-latency fused QKV-A GEMM stays eligible (kernels/ops/gemm/fused_a_gemm.py,
  fused_a_gemm_weight_eligible: weight.shape[1] % 256 == 0).
- Hybrid targets (Qwen3.5/3.6): the gated attention's heads, KV heads and head_dim, the Gated
  DeltaNet's key and value heads and head dims and conv kernel, full_attention_interval and
  the layer pattern, mamba_ssm_dtype, the MTP head's depth, the rope (M-RoPE sections).
- Vision towers: head_dim and the patch geometry, with heads a multiple of the TP size
  (layers/attention/vision.py splits the heads over ranks), depth 1.
- Vocabulary: the real size (the real tokenizer's ids must embed), and the quantization config
  unchanged (compressed-tensors pack-quantized INT4 group 32 for K2.6: weight_packed int32
  [out, in/8], weight_scale bf16 [out, in/32], weight_shape int32 [2], every module the ignore
  list names stored as a BF16 weight, matched as SGLang matches it).
- Drafters: DFlash keeps heads, KV heads, head_dim, block size, mask token, layer types; its
  target_layer_ids are mapped onto the tiny target's layers (distinct, ascending, and below
  its last layer, because DeepseekV2 captures "before layer id + 1": models/deepseek_v2.py,
  set_dflash_layers_to_capture, and a capture point past the last layer is never filled).
  EAGLE-3 keeps its MLA dims, one layer, fc_norm and norm_output, the draft vocabulary, and its
  aux layer ids mapped onto the tiny target the same way (set_eagle3_layers_to_capture).

A config.json is outside input: every field read is type-checked and bounded
(capacity.Fields), and anything the generator cannot reproduce faithfully (another
architecture, quantization method or format) is refused with what was found, what is needed
and how to fix it, as is a checkpoint that would exceed max_bytes, a path outside its folder
and a symlink that leaves it.

This file holds the plan and the writing of one checkpoint; beside it, checkpoint_mla.py,
checkpoint_hybrid.py and checkpoint_draft.py build each family's tiny config and tensors from
what checkpoint_common.py (the tiny dimensions, the checks, the config readers) and
checkpoint_specs.py (tensor specifications) give them; checkpoint_files.py checks the paths and
lists the source's small files, and safetensors_writer.py writes the bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time

from ansible.module_utils.canary.checkpoint_common import (
    CheckpointError,
    checkpoint_error,
    is_int,
)
from ansible.module_utils.canary.checkpoint_draft import (
    dflash_drafter,
    eagle3_drafter,
    read_tiny_target,
)
from ansible.module_utils.canary.checkpoint_files import (
    CONFIG,
    INDEX,
    STAMP,
    STAMP_MAX_BYTES,
    WEIGHTS,
    check_path,
    confined,
    inside,
    read_json,
    source_files,
)
from ansible.module_utils.canary.checkpoint_hybrid import hybrid_target
from ansible.module_utils.canary.checkpoint_mla import mla_target
from ansible.module_utils.canary.safetensors_writer import (
    file_chunks,
    nbytes,
    safetensors_header,
    tensor_chunks,
    write_file,
)
from ansible.module_utils.host.helpers import file_sha256
from ansible.module_utils.plan.capacity import MAX_TP, CapacityError, Fields

# Bumped whenever the bytes written for the same inputs change (a test pins a digest).
GENERATOR_VERSION = 1
KINDS = ("target", "dflash", "eagle3")
DEFAULT_MAX_BYTES = 1 << 30
SEED_MAX = (1 << 63) - 1
DRAFTERS = {"dflash": dflash_drafter, "eagle3": eagle3_drafter}


# ---------------------------------------------------------------------------------------------
# The plan: the tiny config and its tensors


def _build(kind: str, config, source: str, target_dir: str | None, tp_size: int):
    """(tiny config, tensor specifications, {scaled, real}, the tiny target or None) of the
    kind's builder: a target's by its architecture family, a drafter's shaped to target_dir."""
    if kind == "target":
        if not isinstance(config, dict):
            Fields(config, source)
        text = config.get("text_config", config)
        hybrid = isinstance(text, dict) and "layer_types" in text
        make = hybrid_target if hybrid else mla_target
        return (*make(config, source, tp_size), None)
    if target_dir is None:
        raise checkpoint_error(
            "no target_dir", "the tiny target's folder for a drafter", "set target_dir"
        )
    target = read_tiny_target(check_path("target_dir", target_dir))
    return (*DRAFTERS[kind](config, source, tp_size, target), target)


def plan(kind: str, source_dir: str, target_dir: str | None, tp_size: int) -> dict:
    """The tiny config, the tensors and the source files, without writing anything."""
    if kind not in KINDS:
        raise checkpoint_error(f"kind {kind!r}", f"one of {', '.join(KINDS)}", "set kind")
    if not (is_int(tp_size) and 1 <= tp_size <= MAX_TP):
        raise checkpoint_error(
            f"tp_size {tp_size!r}", f"an integer from 1 to {MAX_TP}", "set tp_size"
        )
    source_dir = check_path("source_dir", source_dir)
    source = os.path.join(source_dir, CONFIG)
    config = read_json(confined(source, source_dir), "repository's config.json")
    try:
        tiny, specs, extra, target = _build(kind, config, source, target_dir, tp_size)
    except CapacityError as exc:
        raise CheckpointError(str(exc)) from None
    names = [s[0] for s in specs]
    if len(set(names)) != len(names):  # a generator defect, never input
        raise AssertionError("duplicate tensor names")
    return {
        "config": tiny,
        "specs": specs,
        "scaled": extra["scaled"],
        "real": extra.get("real"),
        "source_config_sha256": hashlib.sha256(
            json.dumps(config, sort_keys=True).encode()
        ).hexdigest(),
        "target": target,
    }


# ---------------------------------------------------------------------------------------------
# The checks before anything is written


def _check_numbers(seed, max_bytes) -> None:
    if not (is_int(seed) and 0 <= seed <= SEED_MAX):
        raise checkpoint_error(f"seed {seed!r}", f"an integer from 0 to {SEED_MAX}", "set seed")
    if not (is_int(max_bytes) and max_bytes >= 1):
        raise checkpoint_error(f"max_bytes {max_bytes!r}", "a positive integer", "set max_bytes")


def _check_folders(dest_dir: str, source_dir: str, target_dir: str | None) -> None:
    """dest_dir a real folder of its own, apart from the source and the target."""
    for other, name in ((source_dir, "source_dir"), (target_dir, "target_dir")):
        if other and (inside(dest_dir, other) or inside(other, dest_dir)):
            raise checkpoint_error(
                f"dest_dir {dest_dir} and {name} {other} overlapping",
                "separate folders",
                "write the tiny checkpoint into a folder of its own",
            )
    if os.path.islink(dest_dir):
        raise checkpoint_error(
            f"dest_dir {dest_dir} is a symlink", "a real folder", "give the folder itself"
        )


def _check_size(kind: str, source_dir: str, weights_bytes: int, total: int, max_bytes: int):
    if total > max_bytes:
        raise checkpoint_error(
            f"a tiny {kind} checkpoint of {total} bytes for {source_dir} ({weights_bytes} of "
            f"weights)",
            f"at most max_bytes ({max_bytes})",
            "check the source config for absurd sizes (vocab_size, heads, layer counts); raise "
            "max_bytes only for a model that is larger on purpose",
        )


# ---------------------------------------------------------------------------------------------
# The stamp: what was written, from which inputs


def _previous_stamp(dest_dir: str):
    """The stamp an earlier generation left, or None (absent, a link or unreadable)."""
    stamp_path = os.path.join(dest_dir, STAMP)
    if os.path.isfile(stamp_path) and not os.path.islink(stamp_path):
        try:
            return read_json(stamp_path, "stamp", STAMP_MAX_BYTES)
        except CheckpointError:
            return None
    return None


def _stamp_ok(dest_dir: str, stamp, inputs: dict) -> bool:
    if not (isinstance(stamp, dict) and stamp.get("inputs") == inputs):
        return False
    files = stamp.get("files")
    if not isinstance(files, dict) or not files:
        return False
    for name, meta in files.items():
        if not (isinstance(name, str) and isinstance(meta, dict)):
            return False
        path = os.path.join(dest_dir, name)
        try:
            info = os.lstat(path)
        except OSError:
            return False
        if not stat.S_ISREG(info.st_mode):
            return False
        if info.st_size != meta.get("size") or info.st_mtime_ns != meta.get("mtime_ns"):
            return False
    return True


def _result(dest_dir: str, stamp: dict, changed: bool, seconds: float) -> dict:
    files = stamp["files"]
    listing = "".join(f"{name}:{files[name]['sha256']}\n" for name in sorted(files))
    return {
        "changed": changed,
        "path": dest_dir,
        "bytes": sum(meta["size"] for meta in files.values()),
        "files": sorted(files),
        "tensors": stamp["tensors"],
        "seconds": round(seconds, 3),
        "config": stamp["config"],
        "digest": hashlib.sha256(listing.encode()).hexdigest(),
        "scaled": stamp["scaled"],
    }


# ---------------------------------------------------------------------------------------------
# Writing


def _config_and_index(config: dict, ordered: list, tensor_bytes: int) -> tuple[bytes, bytes]:
    """config.json and model.safetensors.index.json as written."""
    config_text = (json.dumps(config, indent=2, ensure_ascii=False) + "\n").encode()
    weight_map = {s[0]: WEIGHTS for s in ordered}
    index_text = (
        json.dumps(
            {"metadata": {"total_size": tensor_bytes}, "weight_map": weight_map},
            indent=2,
            sort_keys=True,
        )
        + "\n"
    ).encode()
    return config_text, index_text


def _preview(dest_dir: str, made: dict, tensors: int, names: list, size: int, seconds: float):
    """The result in check mode: what would be written, no digest."""
    return {
        "changed": True,
        "path": dest_dir,
        "bytes": size,
        "files": sorted(names),
        "seconds": round(seconds, 3),
        "digest": None,
        "config": made["config"],
        "scaled": made["scaled"],
        "tensors": tensors,
    }


def _weights(seed: int, header: bytes, ordered: list):
    yield header
    for name, dtype, shape, fill in ordered:
        yield from tensor_chunks(seed, name, dtype, shape, fill)


def _write_files(dest_dir: str, contents) -> dict[str, dict]:
    """Each (name, chunks) written; per name its size, sha256 and mtime_ns (for the stamp)."""
    files: dict[str, dict] = {}
    for name, chunks in contents:
        size, sha = write_file(dest_dir, name, chunks)
        files[name] = {
            "size": size,
            "sha256": sha,
            "mtime_ns": os.lstat(os.path.join(dest_dir, name)).st_mtime_ns,
        }
    return files


def _remove_stale(dest_dir: str, old, files: dict) -> None:
    """Files an earlier generation wrote that this one does not: owned, so removed."""
    for name in (old or {}).get("files", {}) if isinstance(old, dict) else ():
        if isinstance(name, str) and name not in files:
            path = os.path.join(dest_dir, name)
            if (
                inside(os.path.normpath(path), dest_dir)
                and os.path.isfile(path)
                and not os.path.islink(path)
            ):
                os.unlink(path)


def generate(
    kind: str,
    source_dir: str,
    dest_dir: str,
    target_dir: str | None = None,
    tp_size: int = 8,
    seed: int = 0,
    max_bytes: int = DEFAULT_MAX_BYTES,
    check_mode: bool = False,
) -> dict:
    """Writes (or confirms) the tiny checkpoint of one repository and returns the module's
    result: changed, path, bytes, files, tensors, seconds, config, digest, scaled."""
    started = time.monotonic()
    _check_numbers(seed, max_bytes)
    dest_dir = check_path("dest_dir", dest_dir)
    made = plan(kind, source_dir, target_dir, tp_size)
    source_dir = check_path("source_dir", source_dir)
    _check_folders(dest_dir, source_dir, target_dir)
    copies = source_files(source_dir)
    header, ordered = safetensors_header(made["specs"])
    weights_bytes = len(header) + sum(nbytes(s[1], s[2]) for s in ordered)
    total = weights_bytes + sum(os.path.getsize(path) for _rel, path in copies)
    _check_size(kind, source_dir, weights_bytes, total, max_bytes)
    inputs = {
        "generator": GENERATOR_VERSION,
        "kind": kind,
        "seed": seed,
        "tp_size": tp_size,
        "source_config_sha256": made["source_config_sha256"],
        "target": made["target"],
        "copied": [[rel, file_sha256(path)] for rel, path in copies],
    }
    old = _previous_stamp(dest_dir)
    if _stamp_ok(dest_dir, old, inputs):
        return _result(dest_dir, old, False, time.monotonic() - started)
    config_text, index_text = _config_and_index(
        made["config"], ordered, weights_bytes - len(header)
    )
    if check_mode:
        names = [CONFIG, WEIGHTS, INDEX, *(rel for rel, _ in copies)]
        size = total + len(config_text) + len(index_text)
        return _preview(dest_dir, made, len(ordered), names, size, time.monotonic() - started)
    os.makedirs(dest_dir, mode=0o755, exist_ok=True)
    files = _write_files(
        dest_dir,
        (
            (WEIGHTS, _weights(seed, header, ordered)),
            (CONFIG, [config_text]),
            (INDEX, [index_text]),
            *((rel, file_chunks(path)) for rel, path in copies),
        ),
    )
    _remove_stale(dest_dir, old, files)
    stamp = {
        "kind": kind,
        "inputs": inputs,
        "files": files,
        "tensors": len(ordered),
        "config": made["config"],
        "scaled": made["scaled"],
        "real": made["real"],
    }
    write_file(dest_dir, STAMP, [(json.dumps(stamp, indent=1, sort_keys=True) + "\n").encode()])
    return _result(dest_dir, stamp, True, time.monotonic() - started)
