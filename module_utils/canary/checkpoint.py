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
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
import stat
import struct
import tempfile
import time

from ansible.module_utils.host.helpers import file_sha256
from ansible.module_utils.plan.capacity import (
    MAX_EXPERTS,
    MAX_HEADS,
    MAX_KV_TOKENS,
    MAX_LAYERS,
    MAX_TP,
    MAX_VOCAB,
    MAX_WIDTH,
    CapacityError,
    Fields,
    ignored,
)

# Bumped whenever the bytes written for the same inputs change (a test pins a digest).
GENERATOR_VERSION = 1
KINDS = ("target", "dflash", "eagle3")
DEFAULT_MAX_BYTES = 1 << 30
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
STAMP = ".kimi-canary-checkpoint.json"
# Never copied from the source: weights and their indexes (this checkpoint has its own).
WEIGHT_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".gguf",
    ".safetensors.index.json",
    ".bin.index.json",
)
# The canary stage fetches at most 64 MiB per file (kimi_canary_source_max_file_bytes); the
# largest real small file is a tokenizer.json of about 20 MB.
COPY_MAX_FILE_BYTES = 64 << 20
COPY_MAX_FILES = 512
CONFIG_MAX_BYTES = 4 << 20
STAMP_MAX_BYTES = 4 << 20

# The tiny dimensions (each the real one where that is smaller). Why each value: the module
# docstring and docs/models.md.
TINY_HIDDEN = 256
TINY_INTERMEDIATE = 2048
TINY_Q_LORA_RANK = 256
# K2.6's DFlash drafter reads 6 target layers; a capture point must lie below the last layer,
# so a tiny target needs one layer more than the most target layers a drafter reads.
TINY_CAPTURE_POINTS = 6
TINY_EXPERTS = 24  # not a power of two: the top-k path of 384
TINY_EXPERTS_POWER_OF_TWO = 32
TINY_VISION_HEADS = 8
TINY_VISION_DEPTH = 1
TINY_DRAFT_LAYERS = 2

# Chunks of random bytes: bounds the memory one tensor takes while it is written.
CHUNK = 1 << 24
DTYPE_BYTES = {"BF16": 2, "F32": 4, "I32": 4, "I64": 8}
SEED_MAX = (1 << 63) - 1
# compressed-tensors pack-quantized: the bits SGLang's Marlin WNA16 MoE serves
# (WNA16_SUPPORTED_BITS).
SUPPORTED_BITS = (4, 8)
MARLIN_GROUPS = (32, 64, 128)

# bfloat16 from random bytes, little-endian: the low byte is 7 mantissa bits and the
# exponent's lowest bit, the high byte the sign and the exponent's upper 7 bits. Fixing the
# upper exponent bits to 59 or 60 gives exponents 118..121: |x| in [2^-9, 2^-5), finite,
# never zero or NaN. Scales (positive) take 59 only: [2^-9, 2^-7), so that dequantized INT4
# weights (-8..7 times the scale) stay small too.
HIGH_WEIGHT = bytes((r & 0x80) | (59 + (r & 1)) for r in range(256))
HIGH_SCALE = bytes(59 for _ in range(256))
BF16_ONE = b"\x80\x3f"
F32_ONE = struct.pack("<f", 1.0)


class CheckpointError(Exception):
    pass


def _error(found: str, needed: str, fix: str) -> CheckpointError:
    return CheckpointError(f"found {found}; needed: {needed}. Fix: {fix}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _round_to(value: float, step: int) -> int:
    return max(step, round(value / step) * step)


class _Scaled:
    """The tiny config under construction and the record of every dimension changed."""

    def __init__(self, config: dict):
        self.config = copy.deepcopy(config)
        self.scaled: dict[str, list] = {}

    def set(self, part: dict, path: str, name: str, tiny) -> None:
        real = part.get(name)
        if real != tiny:
            part[name] = tiny
            self.scaled[f"{path}{name}"] = [real, tiny]


# ---------------------------------------------------------------------------------------------
# Reading the configs


def _architecture(top: Fields, known: tuple[str, ...]) -> str:
    value = top.config.get("architectures")
    if not (isinstance(value, list) and len(value) == 1 and value[0] in known):
        raise top.error("architectures", value, f"one of {', '.join(map(repr, known))}")
    return value[0]


def _floats(cfg: Fields, name: str) -> None:
    value = cfg.config.get(name)
    if value is not None and not (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ):
        raise cfg.error(name, value, "a finite number")


def _quantization(cfg: Fields) -> dict | None:
    """The weight quantization the generator reproduces, or None for a BF16 model."""
    quant = cfg.part("quantization_config")
    if quant is None:
        return None
    quant.choice("quant_method", ("compressed-tensors",))
    quant.choice("format", ("pack-quantized",))
    ignore = quant.config.get("ignore", [])
    if not (isinstance(ignore, list) and len(ignore) <= 4096):
        raise quant.error("ignore", ignore, "a list of module names or re: patterns")
    for pattern in ignore:
        if not isinstance(pattern, str) or len(pattern) > 4096:
            raise quant.error("ignore", pattern, "a module name or a re: pattern (a string)")
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as exc:
                raise quant.error(
                    "ignore", pattern, f"a valid regular expression ({exc})"
                ) from None
    groups = quant.part("config_groups", nullable=False)
    if len(groups.config) != 1:
        raise groups.error("", f"{len(groups.config)} groups", "exactly one config group")
    group = groups.part(next(iter(groups.config)), nullable=False)
    if group.config.get("targets") != ["Linear"]:
        raise group.error("targets", group.config.get("targets"), '["Linear"]')
    for absent in ("input_activations", "output_activations"):
        if group.config.get(absent) is not None:
            raise group.error(absent, group.config[absent], "null (weight-only quantization)")
    weights = group.part("weights", nullable=False)
    bits = weights.integer("num_bits", 8, low=1)
    if bits not in SUPPORTED_BITS:
        raise weights.error("num_bits", bits, "4 or 8 (what SGLang's Marlin WNA16 serves)")
    weights.choice("type", ("int",))
    weights.choice("strategy", ("group",))
    size = weights.integer("group_size", MAX_WIDTH)
    if size not in MARLIN_GROUPS:
        raise weights.error("group_size", size, "32, 64 or 128 (Marlin's group sizes)")
    if weights.config.get("symmetric", True) is not True:
        raise weights.error("symmetric", weights.config.get("symmetric"), "true")
    for absent in ("actorder", "block_structure"):
        if weights.config.get(absent) is not None:
            raise weights.error(absent, weights.config[absent], "null")
    if weights.config.get("dynamic", False) is not False:
        raise weights.error("dynamic", weights.config.get("dynamic"), "false")
    return {"bits": bits, "group": size, "ignore": ignore}


def _read_json(path: str, what: str, limit: int = CONFIG_MAX_BYTES):
    """A JSON file, bounded, refusing a symlink and anything but a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise _error(
            f"no {os.path.basename(path)} in {os.path.dirname(path)}",
            f"the {what}",
            "fetch the repository's small files into that folder first (the canary stage does)",
        ) from None
    except OSError as exc:
        raise _error(
            f"{path} unreadable ({exc.strerror})",
            f"the {what} as a regular file (not a symlink)",
            "replace it with the repository's own file",
        ) from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise _error(f"{path} is not a regular file", f"the {what}", "replace it")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise _error(f"{path} over {limit} bytes", f"the {what}", "replace it with the real one")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _error(
            f"{path} is not JSON ({type(exc).__name__})",
            f"the {what}",
            "fetch the repository's config.json again",
        ) from None


# ---------------------------------------------------------------------------------------------
# Tensor specifications: (name, dtype, shape, fill)


def _linear(specs: list, prefix: str, module: str, out: int, inp: int, quant: dict | None) -> None:
    """One Linear module's weight, stored as prefix + module: BF16, or compressed-tensors
    pack-quantized when the config quantizes it (SGLang matches module, without the
    checkpoint's language_model. prefix, against the ignore list)."""
    name = f"{prefix}{module}"
    if quant is None or ignored(module, quant["ignore"]):
        _weight(specs, name, [out, inp])
        return
    bits, group = quant["bits"], quant["group"]
    # pack_to_int32 (compressors/pack_quantized/helpers.py): each row's values, 32 // bits to
    # an int32 word, dense; weight_shape holds the original [out, in].
    specs.append((f"{name}.weight_packed", "I32", [out, math.ceil(inp * bits / 32)], "packed"))
    specs.append((f"{name}.weight_scale", "BF16", [out, inp // group], "scale"))
    specs.append((f"{name}.weight_shape", "I32", [2], ("int32", [out, inp])))


def _mlp(specs: list, prefix: str, module: str, width: int, hidden: int, quant: dict | None):
    """A gated MLP (or one expert): gate_proj and up_proj [width, hidden], down_proj."""
    for proj in ("gate_proj", "up_proj"):
        _linear(specs, prefix, f"{module}.{proj}", width, hidden, quant)
    _linear(specs, prefix, f"{module}.down_proj", hidden, width, quant)


def _weight(specs: list, name: str, shape: list[int]) -> None:
    """A BF16 weight of random values (a linear's, an embedding's)."""
    specs.append((f"{name}.weight", "BF16", shape, "weight"))


def _norm(specs: list, name: str, size: int, fill: str = "ones") -> None:
    specs.append((f"{name}.weight", "BF16", [size], fill))


def _layer_norm(specs: list, name: str, size: int) -> None:
    specs.append((f"{name}.weight", "BF16", [size], "ones"))
    specs.append((f"{name}.bias", "BF16", [size], "zeros"))


def _biased(specs: list, name: str, out: int, inp) -> None:
    shape = [out, *inp] if isinstance(inp, list) else [out, inp]
    specs.append((f"{name}.weight", "BF16", shape, "weight"))
    specs.append((f"{name}.bias", "BF16", [out], "zeros"))


def _vit_blocks(specs: list, prefix: str, depth: int, width: int, mlp: int, names) -> None:
    """ViT blocks as MoonViT and Qwen3-VL store them: two LayerNorms, a fused QKV and an
    output projection, a two-layer MLP, every linear with a bias; names in that order."""
    norm_a, norm_b, qkv, proj, fc_in, fc_out = names
    for block in range(depth):
        b = f"{prefix}.{block}"
        _layer_norm(specs, f"{b}.{norm_a}", width)
        _layer_norm(specs, f"{b}.{norm_b}", width)
        _biased(specs, f"{b}.{qkv}", 3 * width, width)
        _biased(specs, f"{b}.{proj}", width, width)
        _biased(specs, f"{b}.{fc_in}", mlp, width)
        _biased(specs, f"{b}.{fc_out}", width, mlp)


class _Checks:
    """TP splits and kernel constraints, each failure naming the field and why."""

    def __init__(self, source: str, tp: int):
        self.source, self.tp = source, tp

    def splits(self, field: str, count: int, why: str) -> None:
        if count % self.tp:
            raise _error(
                f"{field} = {count} in the tiny checkpoint of {self.source}, not divisible by "
                f"tp_size {self.tp}",
                f"a multiple of {self.tp}: {why}",
                "serve at a TP size that divides it (the real model's own counts bound it)",
            )

    def kv_heads(self, field: str, count: int) -> None:
        # KV heads split while there are at least as many as ranks, else each rank keeps one
        # (models/qwen3_5.py Qwen3_5Attention, models/dflash.py DFlashAttention).
        ok = count % self.tp == 0 if count >= self.tp else self.tp % count == 0
        if not ok:
            raise _error(
                f"{field} = {count} with tp_size {self.tp} in {self.source}",
                "KV heads that divide by the TP size, or a TP size they divide",
                "serve at another TP size",
            )

    def require(self, ok: bool, found: str, needed: str) -> None:
        if not ok:
            raise _error(
                f"{found} in the tiny checkpoint of {self.source}",
                needed,
                "this model's dimensions cannot be made tiny on the kernels' terms; report it",
            )


# ---------------------------------------------------------------------------------------------
# Targets


def _capture_layers(layers: int, interval: int = 1) -> int:
    """The tiny depth: room for TINY_CAPTURE_POINTS capture points below the last layer, a
    whole number of hybrid periods."""
    depth = max(TINY_CAPTURE_POINTS + 1, interval)
    depth = math.ceil(depth / interval) * interval
    return min(layers, depth)


def _tiny_experts(real: int, per_token: int, groups: int) -> int:
    """The fewest routed experts, a multiple of 8 (expert parallelism) and of n_group, at least
    twice the experts per token, and a power of two exactly when the real count is (which
    decides the top-k kernel: module docstring)."""
    if _power_of_two(real):
        candidates = [1 << k for k in range(5, real.bit_length() - 1)]
    else:
        candidates = [c for c in range(TINY_EXPERTS, real, 8) if not _power_of_two(c)]
    for tiny in candidates:
        if tiny >= 2 * per_token and tiny % groups == 0:
            return tiny
    return real


def _mla_target(config: dict, source: str, tp: int) -> tuple[dict, list, dict]:
    top = Fields(config, source)
    arch = _architecture(top, ("KimiK25ForConditionalGeneration", "DeepseekV3ForCausalLM"))
    nested = arch == "KimiK25ForConditionalGeneration"
    cfg = top.part("text_config", nullable=False) if nested else top
    path = "text_config." if nested else ""
    hidden = cfg.integer("hidden_size", MAX_WIDTH)
    layers = cfg.integer("num_hidden_layers", MAX_LAYERS)
    vocab = cfg.integer("vocab_size", MAX_VOCAB)
    intermediate = cfg.integer("intermediate_size", MAX_WIDTH)
    dense = cfg.integer("first_k_dense_replace", layers, low=0, default=0)
    experts = cfg.integer("n_routed_experts", MAX_EXPERTS)
    per_token = cfg.integer("num_experts_per_tok", experts)
    moe_width = cfg.integer("moe_intermediate_size", MAX_WIDTH)
    shared = cfg.integer("n_shared_experts", 64, low=0, default=0)
    cfg.integer("moe_layer_freq", 1, default=1)
    groups = cfg.integer("n_group", experts, default=1)
    cfg.integer("topk_group", groups, default=1)
    if experts % groups:
        raise cfg.error("n_group", groups, f"a divisor of n_routed_experts ({experts})")
    heads = cfg.integer("num_attention_heads", MAX_HEADS)
    cfg.integer("num_key_value_heads", MAX_HEADS, default=heads)
    q_rank = cfg.integer("q_lora_rank", MAX_WIDTH, default=None, nullable=True)
    kv_rank = cfg.integer("kv_lora_rank", MAX_WIDTH)
    nope = cfg.integer("qk_nope_head_dim", MAX_WIDTH)
    rope = cfg.integer("qk_rope_head_dim", MAX_WIDTH)
    v_dim = cfg.integer("v_head_dim", MAX_WIDTH)
    cfg.integer("max_position_embeddings", MAX_KV_TOKENS, default=None, nullable=True)
    tied = cfg.flag("tie_word_embeddings")
    cfg.choice("scoring_func", ("sigmoid", "softmax"), default="sigmoid")
    topk_method = cfg.config.get("topk_method", "noaux_tc")
    if topk_method not in ("noaux_tc", "greedy", "group_limited_greedy"):
        raise cfg.error("topk_method", topk_method, "noaux_tc, greedy or group_limited_greedy")
    _floats(cfg, "routed_scaling_factor")
    _floats(cfg, "rms_norm_eps")
    quant = _quantization(cfg)
    if nested and top.part("quantization_config") is not None:
        _quantization(top)

    tiny = _Scaled(config)
    text = tiny.config["text_config"] if nested else tiny.config
    t_hidden = min(hidden, TINY_HIDDEN)
    t_layers = _capture_layers(layers)
    if dense >= t_layers:
        raise cfg.error(
            "first_k_dense_replace", dense, f"fewer than the tiny depth ({t_layers}) layers"
        )
    t_experts = _tiny_experts(experts, per_token, groups)
    tiny.set(text, path, "hidden_size", t_hidden)
    tiny.set(text, path, "num_hidden_layers", t_layers)
    tiny.set(text, path, "intermediate_size", min(intermediate, TINY_INTERMEDIATE))
    tiny.set(text, path, "n_routed_experts", t_experts)
    if q_rank is not None:
        tiny.set(text, path, "q_lora_rank", min(q_rank, TINY_Q_LORA_RANK))
    t_q_rank = text.get("q_lora_rank")
    t_inter = text["intermediate_size"]

    checks = _Checks(source, tp)
    checks.splits(f"{path}num_attention_heads", heads, "the MLA heads split over ranks")
    checks.splits(f"{path}intermediate_size", t_inter, "the dense MLP splits over ranks")
    checks.splits(f"{path}moe_intermediate_size", moe_width, "the experts split over ranks")
    if shared:
        checks.splits(
            f"{path}moe_intermediate_size x n_shared_experts",
            moe_width * shared,
            "the shared experts split over ranks",
        )
    if t_q_rank is not None:
        checks.require(
            (t_q_rank + kv_rank + rope) % 16 == 0 and t_hidden % 256 == 0,
            f"fused QKV-A GEMM [{t_q_rank + kv_rank + rope}, {t_hidden}]",
            "an output multiple of 16 and an input multiple of 256 (fused_a_gemm_weight_eligible)",
        )
    if quant is not None:
        expert = "model.layers.1.mlp.experts.0.gate_proj"
        if not ignored(expert, quant["ignore"]):
            # check_moe_marlin_supports_layer (layers/quantization/marlin_utils.py).
            checks.require(
                t_hidden % 128 == 0 and (moe_width // tp) % max(64, quant["group"]) == 0,
                f"Marlin MoE: hidden {t_hidden}, per-rank expert width {moe_width // tp}",
                "hidden % 128 == 0 and per-rank width % max(64, group_size) == 0",
            )

    prefix = "language_model." if nested else ""
    specs: list = []
    _weight(specs, f"{prefix}model.embed_tokens", [vocab, t_hidden])
    if not tied:
        _linear(specs, prefix, "lm_head", vocab, t_hidden, quant)
    _norm(specs, f"{prefix}model.norm", t_hidden)
    for layer in range(t_layers):
        base = f"model.layers.{layer}"
        _norm(specs, f"{prefix}{base}.input_layernorm", t_hidden)
        _norm(specs, f"{prefix}{base}.post_attention_layernorm", t_hidden)
        attn = f"{base}.self_attn"
        q_out = heads * (nope + rope)
        if t_q_rank is not None:
            _linear(specs, prefix, f"{attn}.q_a_proj", t_q_rank, t_hidden, quant)
            _norm(specs, f"{prefix}{attn}.q_a_layernorm", t_q_rank)
            _linear(specs, prefix, f"{attn}.q_b_proj", q_out, t_q_rank, quant)
        else:
            _linear(specs, prefix, f"{attn}.q_proj", q_out, t_hidden, quant)
        _linear(specs, prefix, f"{attn}.kv_a_proj_with_mqa", kv_rank + rope, t_hidden, quant)
        _norm(specs, f"{prefix}{attn}.kv_a_layernorm", kv_rank)
        _linear(specs, prefix, f"{attn}.kv_b_proj", heads * (nope + v_dim), kv_rank, quant)
        _linear(specs, prefix, f"{attn}.o_proj", t_hidden, heads * v_dim, quant)
        mlp = f"{base}.mlp"
        if layer < dense:
            _mlp(specs, prefix, mlp, t_inter, t_hidden, quant)
            continue
        _weight(specs, f"{prefix}{mlp}.gate", [t_experts, t_hidden])
        if topk_method == "noaux_tc":
            bias = f"{prefix}{mlp}.gate.e_score_correction_bias"
            specs.append((bias, "F32", [t_experts], "zeros"))
        for expert in range(t_experts):
            _mlp(specs, prefix, f"{mlp}.experts.{expert}", moe_width, t_hidden, quant)
        if shared:
            _mlp(specs, prefix, f"{mlp}.shared_experts", moe_width * shared, t_hidden, quant)
    if nested:
        specs += _moonvit(top, tiny, t_hidden, checks)
    real = {"hidden_size": hidden, "num_hidden_layers": layers, "vocab_size": vocab}
    return tiny.config, specs, {"scaled": tiny.scaled, "real": real}


def _moonvit(top: Fields, tiny: _Scaled, t_hidden: int, checks: _Checks) -> list:
    """K2.5/K2.6's MoonViT tower and patch-merger projector (models/kimi_k25.py). The real
    config names the tower's sizes vt_*; SGLang 0.5.23's KimiK25VisionConfig
    (configs/kimi_k25.py) builds MoonViT from hidden_size, num_attention_heads,
    num_hidden_layers and intermediate_size, whose defaults (1152, 16, 27, 4304) are the real
    tower's, while its projector reads vt_hidden_size: the tiny config states both."""
    vision = top.part("vision_config", nullable=False)
    out = tiny.config["vision_config"]

    def either(name: str) -> int:
        if f"vt_{name}" in vision.config:
            return vision.integer(f"vt_{name}", MAX_WIDTH)
        return vision.integer(name, MAX_WIDTH)

    width = either("hidden_size")
    heads = either("num_attention_heads")
    depth = either("num_hidden_layers")
    mlp = either("intermediate_size")
    if width % heads:
        raise vision.error("vt_hidden_size", width, f"a multiple of the heads ({heads})")
    head_dim = width // heads
    patch = vision.integer("patch_size", 1024, default=14)
    pos_h = vision.integer("init_pos_emb_height", 4096, default=64)
    pos_w = vision.integer("init_pos_emb_width", 4096, default=64)
    vision.integer("init_pos_emb_time", 4096, default=4)
    kernel = vision.config.get("merge_kernel_size", [2, 2])
    if not (
        isinstance(kernel, list)
        and len(kernel) == 2
        and all(_is_int(k) and 1 <= k <= 16 for k in kernel)
    ):
        raise vision.error("merge_kernel_size", kernel, "a list of 2 integers from 1 to 16")
    t_heads = min(heads, checks.tp * math.ceil(TINY_VISION_HEADS / checks.tp))
    t_width = t_heads * head_dim
    t_mlp = min(mlp, _round_to(mlp * t_width / width, math.lcm(8, checks.tp)))
    t_depth = min(depth, TINY_VISION_DEPTH)
    for name, value in (
        ("hidden_size", t_width),
        ("num_attention_heads", t_heads),
        ("num_hidden_layers", t_depth),
        ("intermediate_size", t_mlp),
    ):
        tiny.set(out, "vision_config.", f"vt_{name}", value)
        tiny.set(out, "vision_config.", name, value)
    if "mm_hidden_size" in out:
        tiny.set(out, "vision_config.", "mm_hidden_size", t_width)
    tiny.set(out, "vision_config.", "text_hidden_size", t_hidden)
    checks.splits("vision_config.vt_num_attention_heads", t_heads, "VisionAttention splits heads")
    merged = t_width * kernel[0] * kernel[1]
    specs: list = []
    _biased(specs, "vision_tower.patch_embed.proj", t_width, [3, patch, patch])
    _weight(specs, "vision_tower.patch_embed.pos_emb", [pos_h, pos_w, t_width])
    names = ("norm0", "norm1", "wqkv", "wo", "mlp.fc0", "mlp.fc1")
    _vit_blocks(specs, "vision_tower.encoder.blocks", t_depth, t_width, t_mlp, names)
    _layer_norm(specs, "vision_tower.encoder.final_layernorm", t_width)
    _layer_norm(specs, "mm_projector.pre_norm", t_width)
    _biased(specs, "mm_projector.proj.0", merged, merged)
    _biased(specs, "mm_projector.proj.2", t_hidden, merged)
    return specs


HYBRID_TYPES = ("linear_attention", "full_attention")


def _hybrid_target(config: dict, source: str, tp: int) -> tuple[dict, list, dict]:
    top = Fields(config, source)
    _architecture(top, ("Qwen3_5ForConditionalGeneration",))
    cfg = top.part("text_config", nullable=False)
    path = "text_config."
    hidden = cfg.integer("hidden_size", MAX_WIDTH)
    layers = cfg.integer("num_hidden_layers", MAX_LAYERS)
    vocab = cfg.integer("vocab_size", MAX_VOCAB)
    intermediate = cfg.integer("intermediate_size", MAX_WIDTH)
    cfg.integer("max_position_embeddings", MAX_KV_TOKENS)
    types = cfg.strings("layer_types", HYBRID_TYPES, layers)
    interval = cfg.integer("full_attention_interval", layers)
    if [HYBRID_TYPES[(i + 1) % interval == 0] for i in range(layers)] != types:
        # SGLang places the layers by the interval (configs/qwen3_next.py,
        # layers_block_type), transformers by layer_types: both must agree.
        raise cfg.error("full_attention_interval", interval, "the period of layer_types")
    heads = cfg.integer("num_attention_heads", MAX_HEADS)
    kv_heads = cfg.integer("num_key_value_heads", heads)
    if heads % kv_heads:
        raise cfg.error(
            "num_key_value_heads", kv_heads, f"a divisor of num_attention_heads ({heads})"
        )
    head_dim = cfg.integer("head_dim", MAX_WIDTH)
    gate = cfg.config.get("attn_output_gate", True)
    if not isinstance(gate, bool):
        raise cfg.error("attn_output_gate", gate, "true or false")
    v_heads = cfg.integer("linear_num_value_heads", MAX_HEADS)
    k_heads = cfg.integer("linear_num_key_heads", v_heads)
    if v_heads % k_heads:
        raise cfg.error("linear_num_key_heads", k_heads, f"a divisor of {v_heads}")
    k_dim = cfg.integer("linear_key_head_dim", MAX_WIDTH)
    v_dim = cfg.integer("linear_value_head_dim", MAX_WIDTH)
    kernel = cfg.integer("linear_conv_kernel_dim", 64, low=2)
    cfg.choice("mamba_ssm_dtype", ("float32", "bfloat16", "float16"), default=None, nullable=True)
    mtp = cfg.integer("mtp_num_hidden_layers", 64, low=0, default=0)
    text_tied = cfg.flag("tie_word_embeddings")
    tied = top.flag("tie_word_embeddings") or text_tied
    _floats(cfg, "rms_norm_eps")
    if cfg.part("quantization_config") or top.part("quantization_config"):
        raise cfg.error("quantization_config", "present", "none: a BF16 hybrid target")

    tiny = _Scaled(config)
    text = tiny.config["text_config"]
    t_hidden = min(hidden, TINY_HIDDEN)
    t_layers = _capture_layers(layers, interval)
    t_inter = min(intermediate, TINY_INTERMEDIATE)
    tiny.set(text, path, "hidden_size", t_hidden)
    tiny.set(text, path, "num_hidden_layers", t_layers)
    tiny.set(text, path, "intermediate_size", t_inter)
    t_types = types[:t_layers]
    if text["layer_types"] != t_types:
        text["layer_types"] = t_types
        tiny.scaled[f"{path}layer_types"] = [f"{layers} layers", f"{t_layers} layers"]
    checks = _Checks(source, tp)
    checks.require(
        set(t_types) == set(types),
        f"layer types {sorted(set(t_types))}",
        "every layer type of the real model",
    )
    checks.splits(f"{path}num_attention_heads", heads, "the gated attention splits heads")
    checks.kv_heads(f"{path}num_key_value_heads", kv_heads)
    checks.splits(f"{path}linear_num_key_heads", k_heads, "the Gated DeltaNet splits heads")
    checks.splits(f"{path}linear_num_value_heads", v_heads, "the Gated DeltaNet splits heads")
    checks.splits(f"{path}intermediate_size", t_inter, "the MLP splits over ranks")

    p = "model.language_model."
    specs: list = [(f"{p}embed_tokens.weight", "BF16", [vocab, t_hidden], "weight")]
    if not tied:
        _weight(specs, "lm_head", [vocab, t_hidden])
    # Qwen3.5's RMSNorms scale by 1 + weight (GemmaRMSNorm in models/qwen3_5.py): 0 is 1.
    _norm(specs, f"{p}norm", t_hidden, "zeros")
    key, value = k_heads * k_dim, v_heads * v_dim

    def full_attention(name: str) -> None:
        q_out = heads * head_dim * (2 if gate else 1)
        _weight(specs, f"{name}.self_attn.q_proj", [q_out, t_hidden])
        for proj in ("k_proj", "v_proj"):
            _weight(specs, f"{name}.self_attn.{proj}", [kv_heads * head_dim, t_hidden])
        _weight(specs, f"{name}.self_attn.o_proj", [t_hidden, heads * head_dim])
        _norm(specs, f"{name}.self_attn.q_norm", head_dim, "zeros")
        _norm(specs, f"{name}.self_attn.k_norm", head_dim, "zeros")

    def mlp_and_norms(name: str) -> None:
        _norm(specs, f"{name}.input_layernorm", t_hidden, "zeros")
        _norm(specs, f"{name}.post_attention_layernorm", t_hidden, "zeros")
        _mlp(specs, "", f"{name}.mlp", t_inter, t_hidden, None)

    for layer, kind in enumerate(t_types):
        name = f"{p}layers.{layer}"
        mlp_and_norms(name)
        if kind == "full_attention":
            full_attention(name)
            continue
        la = f"{name}.linear_attn"
        _weight(specs, f"{la}.in_proj_qkv", [2 * key + value, t_hidden])
        _weight(specs, f"{la}.in_proj_z", [value, t_hidden])
        _weight(specs, f"{la}.in_proj_b", [v_heads, t_hidden])
        _weight(specs, f"{la}.in_proj_a", [v_heads, t_hidden])
        _weight(specs, f"{la}.conv1d", [2 * key + value, 1, kernel])
        specs.append((f"{la}.A_log", "F32", [v_heads], "a_log"))
        specs.append((f"{la}.dt_bias", "BF16", [v_heads], "ones"))
        # The gated norm (RMSNormGated) scales by its weight itself.
        _norm(specs, f"{la}.norm", v_dim, "ones")
        _weight(specs, f"{la}.out_proj", [t_hidden, value])
    if mtp:
        # Qwen3.5's MTP head (models/qwen3_5_mtp.py): in the checkpoint, loaded only for NEXTN.
        _weight(specs, "mtp.fc", [t_hidden, 2 * t_hidden])
        for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            _norm(specs, f"mtp.{norm}", t_hidden, "zeros")
        for layer in range(mtp):
            mlp_and_norms(f"mtp.layers.{layer}")
            full_attention(f"mtp.layers.{layer}")
    specs += _qwen_vision(top, tiny, t_hidden, checks)
    real = {"hidden_size": hidden, "num_hidden_layers": layers, "vocab_size": vocab}
    return tiny.config, specs, {"scaled": tiny.scaled, "real": real}


def _qwen_vision(top: Fields, tiny: _Scaled, t_hidden: int, checks: _Checks) -> list:
    """Qwen3-VL's tower as Qwen3.5 uses it (models/qwen3_vl.py, Qwen3VLMoeVisionModel)."""
    vision = top.part("vision_config")
    if vision is None:
        return []
    out = tiny.config["vision_config"]
    depth = vision.integer("depth", MAX_LAYERS)
    width = vision.integer("hidden_size", MAX_WIDTH)
    heads = vision.integer("num_heads", MAX_HEADS)
    mlp = vision.integer("intermediate_size", MAX_WIDTH)
    vision.integer("out_hidden_size", MAX_WIDTH)
    channels = vision.integer("in_channels", 16, default=3)
    patch = vision.integer("patch_size", 1024)
    temporal = vision.integer("temporal_patch_size", 64, default=2)
    merge = vision.integer("spatial_merge_size", 64, default=2)
    positions = vision.integer("num_position_embeddings", MAX_VOCAB, default=2304)
    if math.isqrt(positions) ** 2 != positions:
        raise vision.error("num_position_embeddings", positions, "a square (a grid of positions)")
    deepstack = vision.integers(
        "deepstack_visual_indexes", depth - 1, depth, default=[], min_length=0
    )
    if width % heads:
        raise vision.error("hidden_size", width, f"a multiple of num_heads ({heads})")
    head_dim = width // heads
    t_heads = min(heads, checks.tp * math.ceil(TINY_VISION_HEADS / checks.tp))
    t_width = t_heads * head_dim
    t_mlp = min(mlp, _round_to(mlp * t_width / width, math.lcm(8, checks.tp)))
    t_depth = max(min(depth, TINY_VISION_DEPTH), len(deepstack) + 1)
    t_deepstack = _spread(deepstack, 0, depth - 1, 0, t_depth - 1) if deepstack else []
    tiny.set(out, "vision_config.", "depth", t_depth)
    tiny.set(out, "vision_config.", "hidden_size", t_width)
    tiny.set(out, "vision_config.", "num_heads", t_heads)
    tiny.set(out, "vision_config.", "intermediate_size", t_mlp)
    tiny.set(out, "vision_config.", "out_hidden_size", t_hidden)
    if "deepstack_visual_indexes" in out:
        tiny.set(out, "vision_config.", "deepstack_visual_indexes", t_deepstack)
    checks.splits("vision_config.num_heads", t_heads, "VisionAttention splits heads")
    checks.splits("vision_config.intermediate_size", t_mlp, "the vision MLP splits over ranks")
    merged = t_width * merge * merge
    v = "model.visual"
    specs: list = []
    _biased(specs, f"{v}.patch_embed.proj", t_width, [channels, temporal, patch, patch])
    _weight(specs, f"{v}.pos_embed", [positions, t_width])
    names = ("norm1", "norm2", "attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2")
    _vit_blocks(specs, f"{v}.blocks", t_depth, t_width, t_mlp, names)
    _layer_norm(specs, f"{v}.merger.norm", t_width)
    _biased(specs, f"{v}.merger.linear_fc1", merged, merged)
    _biased(specs, f"{v}.merger.linear_fc2", t_hidden, merged)
    for index in range(len(t_deepstack)):
        d = f"{v}.deepstack_merger_list.{index}"
        # Deepstack mergers normalise after the spatial shuffle (use_postshuffle_norm).
        _layer_norm(specs, f"{d}.norm", merged)
        _biased(specs, f"{d}.linear_fc1", merged, merged)
        _biased(specs, f"{d}.linear_fc2", t_hidden, merged)
    return specs


# ---------------------------------------------------------------------------------------------
# Drafters


def _spread(ids: list[int], real_low: int, real_high: int, low: int, high: int) -> list[int]:
    """Ascending, distinct ids from [real_low, real_high] mapped in proportion onto [low, high]."""
    count = len(ids)
    if count > high - low + 1:
        raise _error(
            f"{count} layer ids to map onto {high - low + 1} places",
            "at most as many ids as the tiny target has capture points",
            "report it: the tiny target's depth (TINY_CAPTURE_POINTS) is too small",
        )
    span = max(real_high - real_low, 1)
    mapped = [low + round((i - real_low) * (high - low) / span) for i in ids]
    for k in range(count):  # distinct and ascending, upwards from low
        mapped[k] = max(mapped[k], low if k == 0 else mapped[k - 1] + 1)
    for k in range(count - 1, -1, -1):  # and within range, downwards from high
        mapped[k] = min(mapped[k], high - (count - 1 - k))
    return mapped


def _target(target_dir: str) -> dict:
    """The tiny target's config and its real dimensions, from the stamp this module wrote."""
    try:
        stamp = _read_json(os.path.join(target_dir, STAMP), "stamp", STAMP_MAX_BYTES)
        config = _read_json(os.path.join(target_dir, CONFIG), "tiny target's config.json")
    except CheckpointError:
        stamp = config = None
    if not (
        isinstance(stamp, dict)
        and stamp.get("kind") == "target"
        and isinstance(stamp.get("real"), dict)
        and isinstance(config, dict)
    ):
        raise _error(
            f"{target_dir} holds no tiny target written by canary_checkpoint",
            "target_dir: the folder the kind=target run wrote",
            "run canary_checkpoint with kind=target first and pass its path",
        )
    real = Fields(stamp["real"], f"{target_dir}/{STAMP}", "real.")
    text = Fields(config, f"{target_dir}/{CONFIG}")
    text = text.part("text_config", nullable=True) or text
    return {
        "hidden": text.integer("hidden_size", MAX_WIDTH),
        "layers": text.integer("num_hidden_layers", MAX_LAYERS),
        "vocab": text.integer("vocab_size", MAX_VOCAB),
        "real_layers": real.integer("num_hidden_layers", MAX_LAYERS),
        "real_hidden": real.integer("hidden_size", MAX_WIDTH),
    }


def _same_vocab(cfg: Fields, target: dict) -> int:
    vocab = cfg.integer("vocab_size", MAX_VOCAB)
    if vocab != target["vocab"]:
        raise cfg.error(
            "vocab_size",
            vocab,
            f"the target's vocab_size ({target['vocab']}): it shares its embedding",
        )
    return vocab


def _dflash(config: dict, source: str, tp: int, target: dict) -> tuple[dict, list, dict]:
    cfg = Fields(config, source)
    _architecture(cfg, ("DFlashDraftModel",))
    hidden = cfg.integer("hidden_size", MAX_WIDTH)
    if hidden != target["real_hidden"]:
        raise cfg.error("hidden_size", hidden, f"the real target's ({target['real_hidden']})")
    layers = cfg.integer("num_hidden_layers", MAX_LAYERS)
    intermediate = cfg.integer("intermediate_size", MAX_WIDTH)
    _same_vocab(cfg, target)
    heads = cfg.integer("num_attention_heads", MAX_HEADS)
    kv_heads = cfg.integer("num_key_value_heads", heads)
    if heads % kv_heads:
        raise cfg.error("num_key_value_heads", kv_heads, f"a divisor of {heads}")
    head_dim = cfg.integer("head_dim", MAX_WIDTH, default=None, nullable=True)
    if head_dim is None:
        if hidden % heads:
            raise cfg.error("head_dim", head_dim, "a head size (hidden_size / heads is not whole)")
        head_dim = hidden // heads
    bias = cfg.flag("attention_bias")
    types = None
    if "layer_types" in config:
        types = cfg.strings("layer_types", ("full_attention", "sliding_attention"), layers)
        if "sliding_attention" in types:
            cfg.integer("sliding_window", MAX_KV_TOKENS)
    dflash = cfg.part("dflash_config", nullable=True)
    holder = dflash if dflash is not None and "target_layer_ids" in dflash.config else cfg
    ids = holder.integers("target_layer_ids", MAX_LAYERS - 1, MAX_LAYERS)
    if ids != sorted(set(ids)):
        raise holder.error("target_layer_ids", ids, "distinct layer ids in ascending order")
    real_layers = cfg.integer("num_target_layers", MAX_LAYERS, default=None, nullable=True)
    if real_layers is not None and real_layers != target["real_layers"]:
        raise cfg.error(
            "num_target_layers", real_layers, f"the real target's depth ({target['real_layers']})"
        )
    if ids[-1] > target["real_layers"] - 2:
        raise holder.error(
            "target_layer_ids",
            ids,
            f"ids below the target's last layer ({target['real_layers'] - 1})",
        )
    for part in (cfg, dflash):
        if part is not None and "block_size" in part.config:
            part.integer("block_size", 1024)
    mask = (dflash.config if dflash else {}).get("mask_token_id", config.get("mask_token_id"))
    if mask is not None and not (_is_int(mask) and 0 <= mask < target["vocab"]):
        raise cfg.error("dflash_config.mask_token_id", mask, "a token id of the vocabulary")

    tiny = _Scaled(config)
    t_hidden = target["hidden"]
    t_layers = min(layers, TINY_DRAFT_LAYERS)
    t_inter = min(intermediate, TINY_INTERMEDIATE)
    tiny.set(tiny.config, "", "hidden_size", t_hidden)
    tiny.set(tiny.config, "", "num_hidden_layers", t_layers)
    tiny.set(tiny.config, "", "intermediate_size", t_inter)
    if types is not None:
        # Each attention kind once, in the order the real drafter has them (Qwen3.6's
        # [sliding x 4, full] becomes [sliding, full]): the kinds are what select kernels.
        kinds = [kind for i, kind in enumerate(types) if kind not in types[:i]]
        t_layers = max(t_layers, len(kinds))
        tiny.set(tiny.config, "", "num_hidden_layers", t_layers)
        t_types = kinds + [types[-1]] * (t_layers - len(kinds))
        if t_types != types:
            tiny.config["layer_types"] = t_types
            tiny.scaled["layer_types"] = [types, t_types]
    t_ids = _spread(ids, 0, target["real_layers"] - 2, 0, target["layers"] - 2)
    where = tiny.config["dflash_config"] if holder is dflash else tiny.config
    prefix = "dflash_config." if holder is dflash else ""
    tiny.set(where, prefix, "target_layer_ids", t_ids)
    if real_layers is not None:
        tiny.set(tiny.config, "", "num_target_layers", target["layers"])
    checks = _Checks(source, tp)
    checks.splits("num_attention_heads", heads, "DFlashAttention splits heads")
    checks.kv_heads("num_key_value_heads", kv_heads)
    checks.splits("intermediate_size", t_inter, "the drafter's MLP splits over ranks")

    specs: list = []
    for layer in range(t_layers):
        name = f"layers.{layer}"
        _norm(specs, f"{name}.input_layernorm", t_hidden)
        _norm(specs, f"{name}.post_attention_layernorm", t_hidden)
        for proj, out in (("q_proj", heads), ("k_proj", kv_heads), ("v_proj", kv_heads)):
            if bias:
                _biased(specs, f"{name}.self_attn.{proj}", out * head_dim, t_hidden)
            else:
                _weight(specs, f"{name}.self_attn.{proj}", [out * head_dim, t_hidden])
        _weight(specs, f"{name}.self_attn.o_proj", [t_hidden, heads * head_dim])
        _norm(specs, f"{name}.self_attn.q_norm", head_dim)
        _norm(specs, f"{name}.self_attn.k_norm", head_dim)
        _mlp(specs, "", f"{name}.mlp", t_inter, t_hidden, None)
    _norm(specs, "norm", t_hidden)
    _weight(specs, "fc", [t_hidden, len(t_ids) * t_hidden])
    _norm(specs, "hidden_norm", t_hidden)
    return tiny.config, specs, {"scaled": tiny.scaled}


def _eagle3(config: dict, source: str, tp: int, target: dict) -> tuple[dict, list, dict]:
    cfg = Fields(config, source)
    _architecture(cfg, ("Eagle3DeepseekV2ForCausalLM",))
    hidden = cfg.integer("hidden_size", MAX_WIDTH)
    if hidden != target["real_hidden"]:
        raise cfg.error("hidden_size", hidden, f"the real target's ({target['real_hidden']})")
    target_hidden = cfg.integer("target_hidden_size", MAX_WIDTH, default=None, nullable=True)
    if target_hidden not in (None, target["real_hidden"]):
        raise cfg.error("target_hidden_size", target_hidden, f"{target['real_hidden']}")
    cfg.integer("num_hidden_layers", 1)  # models/kimi_k25_eagle3.py: one layer only
    intermediate = cfg.integer("intermediate_size", MAX_WIDTH)
    vocab = _same_vocab(cfg, target)
    draft_vocab = cfg.integer("draft_vocab_size", vocab, default=None, nullable=True)
    heads = cfg.integer("num_attention_heads", MAX_HEADS)
    q_rank = cfg.integer("q_lora_rank", MAX_WIDTH)
    kv_rank = cfg.integer("kv_lora_rank", MAX_WIDTH)
    nope = cfg.integer("qk_nope_head_dim", MAX_WIDTH)
    rope = cfg.integer("qk_rope_head_dim", MAX_WIDTH)
    v_dim = cfg.integer("v_head_dim", MAX_WIDTH)
    tied = cfg.flag("tie_word_embeddings")
    fc_norm = cfg.flag("fc_norm") or cfg.flag("use_aux_norm")
    cfg.flag("norm_output")
    eagle = cfg.part("eagle_config", nullable=True)
    holder = (
        eagle if eagle is not None and "eagle_aux_hidden_state_layer_ids" in eagle.config else cfg
    )
    ids = None
    if "eagle_aux_hidden_state_layer_ids" in holder.config:
        ids = holder.integers("eagle_aux_hidden_state_layer_ids", MAX_LAYERS - 1, 64)
        if ids != sorted(set(ids)):
            raise holder.error("eagle_aux_hidden_state_layer_ids", ids, "distinct ids, ascending")
    # set_eagle3_layers_to_capture (models/deepseek_v2.py): ids starting at 1 are layer
    # outputs (captured before id + 1), others are capture points themselves.
    points = [i + 1 for i in ids] if ids and ids[0] == 1 else ids
    if points is not None and not 1 <= points[0] <= points[-1] <= target["real_layers"] - 1:
        raise holder.error(
            "eagle_aux_hidden_state_layer_ids",
            ids,
            f"capture points within 1..{target['real_layers'] - 1}",
        )

    tiny = _Scaled(config)
    t_hidden = target["hidden"]
    t_inter = min(intermediate, TINY_INTERMEDIATE)
    t_q_rank = min(q_rank, TINY_Q_LORA_RANK)
    tiny.set(tiny.config, "", "hidden_size", t_hidden)
    if target_hidden is not None:
        tiny.set(tiny.config, "", "target_hidden_size", t_hidden)
    tiny.set(tiny.config, "", "intermediate_size", t_inter)
    tiny.set(tiny.config, "", "q_lora_rank", t_q_rank)
    count = 3
    if points is not None:
        # Written as capture points from 2 up (never starting at 1, which SGLang would shift).
        t_points = _spread(points, 1, target["real_layers"] - 1, 2, target["layers"] - 1)
        where = tiny.config["eagle_config"] if holder is eagle else tiny.config
        prefix = "eagle_config." if holder is eagle else ""
        tiny.set(where, prefix, "eagle_aux_hidden_state_layer_ids", t_points)
        count = len(t_points)
    checks = _Checks(source, tp)
    checks.splits("num_attention_heads", heads, "the MLA heads split over ranks")
    checks.splits("intermediate_size", t_inter, "the MLP splits over ranks")
    checks.splits("hidden_size", t_hidden, "fc is column-parallel")

    specs: list = []
    attn = "layers.0.self_attn"
    _weight(specs, f"{attn}.q_a_proj", [t_q_rank, 2 * t_hidden])
    _norm(specs, f"{attn}.q_a_layernorm", t_q_rank)
    _weight(specs, f"{attn}.q_b_proj", [heads * (nope + rope), t_q_rank])
    _weight(specs, f"{attn}.kv_a_proj_with_mqa", [kv_rank + rope, 2 * t_hidden])
    _norm(specs, f"{attn}.kv_a_layernorm", kv_rank)
    _weight(specs, f"{attn}.kv_b_proj", [heads * (nope + v_dim), kv_rank])
    _weight(specs, f"{attn}.o_proj", [t_hidden, heads * v_dim])
    _mlp(specs, "", "layers.0.mlp", t_inter, t_hidden, None)
    for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        _norm(specs, f"layers.0.{norm}", t_hidden)
    _weight(specs, "fc", [t_hidden, count * t_hidden])
    if fc_norm:
        for index in range(count):
            _norm(specs, f"fc_norm.{index}", t_hidden)
    _norm(specs, "norm", t_hidden)
    if not tied:
        _weight(specs, "lm_head", [draft_vocab or vocab, t_hidden])
    if draft_vocab is not None and draft_vocab < vocab:
        # d2t: draft id -> target id offsets (load_weights: hot_token_id = d2t + arange).
        specs.append(("d2t", "I64", [draft_vocab], "zeros"))
    return tiny.config, specs, {"scaled": tiny.scaled}


# ---------------------------------------------------------------------------------------------
# Writing


def _nbytes(dtype: str, shape: list[int]) -> int:
    return DTYPE_BYTES[dtype] * math.prod(shape)


def tensor_chunks(seed: int, name: str, dtype: str, shape: list[int], fill):
    """The tensor's bytes, in chunks of at most CHUNK, as the specification says."""
    total = _nbytes(dtype, shape)
    if isinstance(fill, tuple):  # ("int32", values)
        yield struct.pack(f"<{len(fill[1])}i", *fill[1])
        return
    if fill in ("weight", "scale", "packed"):
        high = HIGH_SCALE if fill == "scale" else HIGH_WEIGHT
        for index, start in enumerate(range(0, total, CHUNK)):
            size = min(CHUNK, total - start)
            key = f"kimi-canary-checkpoint\0{seed}\0{name}\0{index}".encode()
            raw = hashlib.shake_256(key).digest(size)
            if fill == "packed":  # every int32 is a valid word of packed INT4/INT8 values
                yield raw
                continue
            out = bytearray(raw)
            out[1::2] = raw[1::2].translate(high)
            yield bytes(out)
        return
    if fill == "a_log":  # A = -exp(A_log) in -1..-16, as Mamba initialises it
        values = [math.log(1 + i % 16) for i in range(shape[0])]
        yield struct.pack(f"<{shape[0]}f", *values)
        return
    unit = {"ones": BF16_ONE if dtype == "BF16" else F32_ONE, "zeros": bytes(DTYPE_BYTES[dtype])}[
        fill
    ]
    count = total // len(unit)
    step = CHUNK // len(unit)
    for start in range(0, count, step):
        yield unit * min(step, count - start)


def _header(specs: list) -> tuple[bytes, list]:
    """The safetensors header (8-byte little-endian length, then JSON padded with spaces to a
    multiple of 8) and the tensors in file order: widest dtype first, then by name, so every
    tensor starts aligned to its element size, as safetensors' own writer orders them."""
    ordered = sorted(specs, key=lambda s: (-DTYPE_BYTES[s[1]], s[0]))
    entries, offset = {}, 0
    for name, dtype, shape, _fill in ordered:
        size = _nbytes(dtype, shape)
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header = {"__metadata__": {"format": "pt"}, **dict(sorted(entries.items()))}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, ordered


def _safe_target(dest_dir: str, name: str) -> str:
    """The path to write, refusing a symlink at it or at any folder between it and dest_dir:
    the module writes only inside dest_dir and never follows a link out of it."""
    path = dest_dir
    for part in name.split("/"):
        path = os.path.join(path, part)
        if os.path.islink(path):
            raise _error(
                f"a symlink at {path}",
                "a regular file, a folder or nothing where the checkpoint writes",
                f"remove {path}; the module writes only its own files and never follows links",
            )
    return path


def _write(dest_dir: str, name: str, chunks, mode: int = 0o644) -> tuple[int, str]:
    """Writes a file whole or not at all, returning its size and sha256."""
    path = _safe_target(dest_dir, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _safe_target(dest_dir, name)  # no link made in between
    digest, size = hashlib.sha256(), 0
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
                digest.update(chunk)
                size += len(chunk)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return size, digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Paths and the source's small files


def _check_path(name: str, path) -> str:
    if not isinstance(path, str) or not path:
        raise _error(f"{name} {path!r}", "an absolute path", f"set {name}")
    if not os.path.isabs(path) or os.path.normpath(path) != path.rstrip("/") or "\0" in path:
        raise _error(
            f"{name} {path!r}",
            "an absolute, normalised path (no '..', no '.' components)",
            f"give {name} as an absolute path",
        )
    return path.rstrip("/") or "/"


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _confined(path: str, folder: str) -> str:
    """The file to read for path: itself, or where its symlink points when that is inside
    folder; a link that leaves folder is refused."""
    resolved = os.path.realpath(path)
    if not _inside(resolved, os.path.realpath(folder)):
        raise _error(
            f"{path}, a symlink to {resolved}, outside {folder}",
            "every file of the source inside its folder",
            f"replace the link with the file itself, or remove {path}",
        )
    return resolved


def _source_files(source_dir: str) -> list[tuple[str, str]]:
    """(relative name, path to read) of every small file of the repository to copy: all but
    weights, their indexes, config.json (the tiny one replaces it) and hidden entries (a hub
    client's .cache/). A symlink must resolve inside source_dir."""
    real_root = os.path.realpath(source_dir)
    found: list[tuple[str, str]] = []
    for root, dirs, files in os.walk(source_dir, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for entry in list(dirs):
            full = os.path.join(root, entry)
            if os.path.islink(full):
                if not _inside(os.path.realpath(full), real_root):
                    raise _error(
                        f"{full}, a symlink to {os.path.realpath(full)}, outside {source_dir}",
                        "every file of the source inside its folder",
                        f"replace the link with the files themselves, or remove {full}",
                    )
                dirs.remove(entry)  # a link inside: its files are copied from where they are
        for entry in sorted(files):
            full = os.path.join(root, entry)
            rel = os.path.relpath(full, source_dir)
            if entry.startswith(".") or rel == CONFIG or entry.endswith(WEIGHT_SUFFIXES):
                continue
            resolved = _confined(full, source_dir)
            info = os.stat(resolved)
            if not stat.S_ISREG(info.st_mode):
                raise _error(f"{full}, not a regular file", "regular files only", f"remove {full}")
            if info.st_size > COPY_MAX_FILE_BYTES:
                raise _error(
                    f"{full} of {info.st_size} bytes",
                    f"small files of at most {COPY_MAX_FILE_BYTES} bytes",
                    "leave weights and large files out of the source folder",
                )
            found.append((rel, resolved))
            if len(found) > COPY_MAX_FILES:
                raise _error(
                    f"more than {COPY_MAX_FILES} files in {source_dir}",
                    "a repository's small files",
                    "point source_dir at the repository's small files only",
                )
    return found


def _file_chunks(path: str):
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(CHUNK)
            if not chunk:
                return
            yield chunk


# ---------------------------------------------------------------------------------------------
# The module's work


def plan(kind: str, source_dir: str, target_dir: str | None, tp_size: int) -> dict:
    """The tiny config, the tensors and the source files, without writing anything."""
    if kind not in KINDS:
        raise _error(f"kind {kind!r}", f"one of {', '.join(KINDS)}", "set kind")
    if not (_is_int(tp_size) and 1 <= tp_size <= MAX_TP):
        raise _error(f"tp_size {tp_size!r}", f"an integer from 1 to {MAX_TP}", "set tp_size")
    source_dir = _check_path("source_dir", source_dir)
    source = os.path.join(source_dir, CONFIG)
    config = _read_json(_confined(source, source_dir), "repository's config.json")
    try:
        if kind == "target":
            if not isinstance(config, dict):
                Fields(config, source)
            text = config.get("text_config", config)
            hybrid = isinstance(text, dict) and "layer_types" in text
            make = _hybrid_target if hybrid else _mla_target
            tiny, specs, extra = make(config, source, tp_size)
            target = None
        else:
            if target_dir is None:
                raise _error(
                    "no target_dir", "the tiny target's folder for a drafter", "set target_dir"
                )
            target_dir = _check_path("target_dir", target_dir)
            target = _target(target_dir)
            make = _dflash if kind == "dflash" else _eagle3
            tiny, specs, extra = make(config, source, tp_size, target)
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
    if not (_is_int(seed) and 0 <= seed <= SEED_MAX):
        raise _error(f"seed {seed!r}", f"an integer from 0 to {SEED_MAX}", "set seed")
    if not (_is_int(max_bytes) and max_bytes >= 1):
        raise _error(f"max_bytes {max_bytes!r}", "a positive integer", "set max_bytes")
    dest_dir = _check_path("dest_dir", dest_dir)
    made = plan(kind, source_dir, target_dir, tp_size)
    source_dir = _check_path("source_dir", source_dir)
    for other, name in ((source_dir, "source_dir"), (target_dir, "target_dir")):
        if other and (_inside(dest_dir, other) or _inside(other, dest_dir)):
            raise _error(
                f"dest_dir {dest_dir} and {name} {other} overlapping",
                "separate folders",
                "write the tiny checkpoint into a folder of its own",
            )
    if os.path.islink(dest_dir):
        raise _error(f"dest_dir {dest_dir} is a symlink", "a real folder", "give the folder itself")
    copies = _source_files(source_dir)
    header, ordered = _header(made["specs"])
    weights_bytes = len(header) + sum(_nbytes(s[1], s[2]) for s in ordered)
    copied_bytes = sum(os.path.getsize(path) for _rel, path in copies)
    total = weights_bytes + copied_bytes
    if total > max_bytes:
        raise _error(
            f"a tiny {kind} checkpoint of {total} bytes for {source_dir} ({weights_bytes} of "
            f"weights)",
            f"at most max_bytes ({max_bytes})",
            "check the source config for absurd sizes (vocab_size, heads, layer counts); raise "
            "max_bytes only for a model that is larger on purpose",
        )
    inputs = {
        "generator": GENERATOR_VERSION,
        "kind": kind,
        "seed": seed,
        "tp_size": tp_size,
        "source_config_sha256": made["source_config_sha256"],
        "target": made["target"],
        "copied": [[rel, file_sha256(path)] for rel, path in copies],
    }
    stamp_path = os.path.join(dest_dir, STAMP)
    old = None
    if os.path.isfile(stamp_path) and not os.path.islink(stamp_path):
        try:
            old = _read_json(stamp_path, "stamp", STAMP_MAX_BYTES)
        except CheckpointError:
            old = None
    if _stamp_ok(dest_dir, old, inputs):
        return _result(dest_dir, old, False, time.monotonic() - started)
    config_text = (json.dumps(made["config"], indent=2, ensure_ascii=False) + "\n").encode()
    weight_map = {s[0]: WEIGHTS for s in ordered}
    index_text = (
        json.dumps(
            {"metadata": {"total_size": weights_bytes - len(header)}, "weight_map": weight_map},
            indent=2,
            sort_keys=True,
        )
        + "\n"
    ).encode()
    if check_mode:
        preview = {"config": made["config"], "scaled": made["scaled"], "tensors": len(ordered)}
        names = [CONFIG, WEIGHTS, INDEX, *(rel for rel, _ in copies)]
        return {
            "changed": True,
            "path": dest_dir,
            "bytes": total + len(config_text) + len(index_text),
            "files": sorted(names),
            "seconds": round(time.monotonic() - started, 3),
            "digest": None,
            **preview,
        }
    os.makedirs(dest_dir, mode=0o755, exist_ok=True)
    seed_ = seed

    def weights():
        yield header
        for name, dtype, shape, fill in ordered:
            yield from tensor_chunks(seed_, name, dtype, shape, fill)

    files: dict[str, dict] = {}
    for name, chunks in (
        (WEIGHTS, weights()),
        (CONFIG, [config_text]),
        (INDEX, [index_text]),
        *((rel, _file_chunks(path)) for rel, path in copies),
    ):
        size, sha = _write(dest_dir, name, chunks)
        files[name] = {
            "size": size,
            "sha256": sha,
            "mtime_ns": os.lstat(os.path.join(dest_dir, name)).st_mtime_ns,
        }
    # Files an earlier generation wrote that this one does not: owned, so removed.
    for name in (old or {}).get("files", {}) if isinstance(old, dict) else ():
        if isinstance(name, str) and name not in files:
            path = os.path.join(dest_dir, name)
            if (
                _inside(os.path.normpath(path), dest_dir)
                and os.path.isfile(path)
                and not os.path.islink(path)
            ):
                os.unlink(path)
    stamp = {
        "kind": kind,
        "inputs": inputs,
        "files": files,
        "tensors": len(ordered),
        "config": made["config"],
        "scaled": made["scaled"],
        "real": made["real"],
    }
    _write(dest_dir, STAMP, [(json.dumps(stamp, indent=1, sort_keys=True) + "\n").encode()])
    return _result(dest_dir, stamp, True, time.monotonic() - started)
