"""Memory capacity of a Kimi K2.6 deployment per GPU: weights, drafter, KV cache pool.

Pure computation over HF-style config.json dictionaries, shared by library/capacity_plan.py
and the plan. The model follows how SGLang lays the model out under tensor parallelism, one
module per architecture: capacity_mla.py (DeepSeek-V3 style MLA targets such as Kimi K2.x),
capacity_hybrid.py (hybrid attention/recurrent targets: Qwen3.5/3.6, Qwen3-Next, with their
recurrent state) and capacity_draft.py (DFlash and EAGLE-3 drafters), on what they share in
capacity_common.py. This module dispatches between them and plans the whole server:

- The KV pool is what SGLang's static memory fraction leaves after weights:
  (usable memory x mem_fraction_static) - weights, divided by the bytes one token takes
  across the target's and the drafter's caches. Usable memory is the card's memory less an
  overhead that SGLang never sees: the driver's reserve (637 MiB on an RTX PRO 6000), the
  CUDA context and NCCL's buffers. 3 GiB reproduces the published SGLang KV pool of Kimi
  K2.5 on 8x RTX PRO 6000 (tests/unit/test_capacity.py names the source).
- On a hybrid target the recurrent pool takes its share of the static budget before the KV
  cache (capacity_hybrid.py says how SGLang 0.5.23 sizes it).

Context length (SGLang's --context-length, capacity_context.py): `auto` is the longest request
one server can hold whole - the KV pool in tokens (target and drafter caches together), capped
at the model's max_position_embeddings and, under DDTree, at what its tree mask leaves room for
(for the launch's running requests: --max-running-requests, else the 48 SGLang sets under
speculative decoding). SGLang itself warns when the pool holds fewer tokens than
--context-length and then caps a request at the pool (python/sglang/srt/managers/tp_worker.py,
TpModelWorker.get_worker_info); the plan says so before the launch, for a value the user set.

A config.json is outside input: every field read is checked first (an int that is not a bool,
within bounds far above any released model), and tp_size is checked against what SGLang
splits evenly over ranks, so a plan never holds a negative, NaN or silently wrong figure.
"""

from __future__ import annotations

import math

from ansible.module_utils.contract.launch import flag_value

# MAX_EXPERTS, MAX_HEADS, MAX_LAYERS, MAX_VOCAB, MAX_WIDTH and ignored are read from here by
# module_utils/canary/checkpoint.py, which checks its tiny checkpoints' configs with the
# plan's own bounds and field reader.
from ansible.module_utils.plan.capacity_common import (
    GIB,
    MAX_EXPERTS,  # noqa: F401
    MAX_GPU_COUNT,
    MAX_GPU_MEMORY_MIB,
    MAX_HEADS,  # noqa: F401
    MAX_KV_TOKENS,
    MAX_LAYERS,  # noqa: F401
    MAX_TP,
    MAX_VOCAB,  # noqa: F401
    MAX_WIDTH,  # noqa: F401
    MIB,
    CapacityError,
    Fields,
    bytes_per_gpu,
    checkpoint_bytes,
    divides,
    ignored,  # noqa: F401
    is_int,
    kv_dtype_bytes,
    kv_heads_split,
    text_config,
)
from ansible.module_utils.plan.capacity_context import (
    check_context_length,
    check_ddtree_budget,
    context_fit,
    tree_mask,
)
from ansible.module_utils.plan.capacity_draft import (
    check_draft,
    draft_block_size,
    draft_kv_bytes_per_token,
    draft_parameters,
)
from ansible.module_utils.plan.capacity_hybrid import (
    MAMBA_FULL_MEMORY_RATIO,
    check_hybrid,
    check_hybrid_numbers,
    check_hybrid_tp,
    hybrid_kv_bytes_per_token,
    hybrid_parameters,
    is_hybrid,
    recurrent_pools,
    recurrent_state_bytes,
    resolve_max_running_requests,
    ssm_dtype,
    states_per_request,
)
from ansible.module_utils.plan.capacity_mla import (
    check_mla_target,
    mla_kv_bytes_per_token,
    mla_parameters,
)


def check_target(config, source: str = "model_config") -> None:
    """Every field of a target config that the plan reads, by its architecture."""
    top = Fields(config, source)
    cfg = top.part("text_config", nullable=True) or top
    if "layer_types" in cfg.config:
        check_hybrid(top, cfg)
    else:
        check_mla_target(top, cfg)


def target_parameters(config: dict) -> dict[str, dict]:
    """Parameter groups of a target: count, bytes per weight, split or not."""
    check_target(config)
    return hybrid_parameters(config) if is_hybrid(config) else mla_parameters(config)


def target_kv_bytes_per_token(config: dict, kv_cache_dtype: str, tp_size: int = 1) -> int:
    """MLA: the latent, the same on every rank. Hybrid: K and V of the full-attention layers,
    split over ranks by KV heads."""
    if is_hybrid(config):
        return hybrid_kv_bytes_per_token(config, kv_cache_dtype, tp_size)
    return mla_kv_bytes_per_token(config, kv_cache_dtype)


def check_tp_size(
    tp_size: int,
    model_config: dict,
    draft_model_config: dict | None = None,
    sources: tuple[str, str] = ("model_config", "draft_model_config"),
) -> None:
    """What SGLang splits evenly over TP ranks: attention heads (python/sglang/srt/models/
    deepseek_v2.py, DeepseekV2AttentionMLA asserts num_heads % attn_tp_size == 0), dense and
    expert MLP widths (python/sglang/srt/layers/linear.py, divide() in the column-parallel
    layers), and a GQA drafter's KV heads (QKVParallelLinear: divided when there are as many
    as ranks, else each replicated over tp_size / num_key_value_heads ranks)."""
    if not is_int(tp_size) or not 1 <= tp_size <= MAX_TP:
        raise CapacityError(
            f"tp_size {tp_size!r} is out of range; needed: an integer from 1 to {MAX_TP} (the "
            "GPUs one server spans). Fix: set kimi_tp_size to the number of GPUs, e.g. 8."
        )
    fix = "set kimi_tp_size to one of them."
    target, (target_source, draft_source) = text_config(model_config), sources
    divides(
        tp_size,
        target["num_attention_heads"],
        "num_attention_heads",
        target_source,
        "SGLang gives every TP rank the same number of attention heads",
        fix,
    )
    dense = min(target.get("first_k_dense_replace", 0), target["num_hidden_layers"])
    if dense or not target.get("n_routed_experts"):
        divides(
            tp_size,
            target["intermediate_size"],
            "intermediate_size",
            target_source,
            "the dense MLP is split evenly over TP ranks",
            fix,
        )
    if target.get("n_routed_experts"):
        divides(
            tp_size,
            target["moe_intermediate_size"],
            "moe_intermediate_size",
            target_source,
            "every expert's MLP is split evenly over TP ranks",
            fix,
        )
    if is_hybrid(model_config):
        check_hybrid_tp(tp_size, target, target_source, fix)
    if not draft_model_config:
        return
    draft = draft_model_config
    why = "the drafter's layers are split over the same TP ranks as the target's"
    divides(tp_size, draft["num_attention_heads"], "num_attention_heads", draft_source, why, fix)
    divides(tp_size, draft["intermediate_size"], "intermediate_size", draft_source, why, fix)
    if "kv_lora_rank" not in draft:
        kv_heads_split(tp_size, draft["num_key_value_heads"], draft_source, why, fix)


def check_numbers(
    gpu_memory_mib, mem_fraction_static, overhead_mib, min_kv_tokens, gpu_count
) -> None:
    """The plan's own inputs (the module's parameters), each within its range."""
    memory_ok = is_int(gpu_memory_mib) and 1 <= gpu_memory_mib <= MAX_GPU_MEMORY_MIB
    fraction = mem_fraction_static
    checks = [
        (
            "gpu_memory_mib",
            gpu_memory_mib,
            memory_ok,
            f"an integer from 1 to {MAX_GPU_MEMORY_MIB} (MiB of one GPU)",
            "pass gpu_facts' devices[].memory_mib or the profile's kimi_gpu_memory_mib.",
        ),
        (
            "mem_fraction_static",
            fraction,
            # NaN fails the comparison too.
            not isinstance(fraction, bool)
            and isinstance(fraction, float | int)
            and 0 < fraction < 1,
            "a number between 0 and 1 (exclusive)",
            "set kimi_mem_fraction_static, e.g. 0.85.",
        ),
        (
            "overhead_mib",
            overhead_mib,
            memory_ok and is_int(overhead_mib) and 0 <= overhead_mib < gpu_memory_mib,
            f"an integer from 0 to below gpu_memory_mib ({gpu_memory_mib})",
            "leave the default (3072) or measure what the driver and CUDA context take.",
        ),
        (
            "min_kv_tokens",
            min_kv_tokens,
            is_int(min_kv_tokens) and 0 <= min_kv_tokens <= MAX_KV_TOKENS,
            f"an integer from 0 to {MAX_KV_TOKENS}",
            "leave the default (16384).",
        ),
        (
            "gpu_count",
            gpu_count,
            gpu_count is None or (is_int(gpu_count) and 1 <= gpu_count <= MAX_GPU_COUNT),
            f"an integer from 1 to {MAX_GPU_COUNT}, or none when unknown",
            "pass gpu_facts' count (the GPUs the server's hosts hold together).",
        ),
    ]
    for name, value, ok, needed, fix in checks:
        if not ok:
            raise CapacityError(f"{name} is {value!r}; needed: {needed}. Fix: {fix}")


# Launch flags that decide the recurrent state's plan, and the plan() parameter each sets.
LAUNCH_FLAGS = {
    "--max-running-requests": ("max_running_requests", int),
    "--mamba-ssm-dtype": ("mamba_ssm_dtype", str),
    "--mamba-full-memory-ratio": ("mamba_full_memory_ratio", float),
    "--mamba-radix-cache-strategy": ("mamba_radix_cache_strategy", str),
    "--max-mamba-cache-size": ("max_mamba_cache_size", int),
    "--context-length": ("context_length", int),
}


def launch_options(argv) -> dict:
    """The plan() parameters a launch argv sets, so that a plan is of the command that runs:
    verify tokens (1 without speculation; budget + 1 under DDTREE, its budget defaulting to
    the draft tokens - 1 as the pull request does; else --speculative-num-draft-tokens, or the
    drafter's block size when absent), overlap scheduling, and the --mamba-*,
    --max-running-requests and --context-length flags. A value that does not parse fails
    naming the flag."""
    if not isinstance(argv, list) or not all(isinstance(item, str) for item in argv):
        raise CapacityError(f"launch_argv must be a list of strings, got {argv!r:.120}")
    options: dict = {"disable_overlap_schedule": "--disable-overlap-schedule" in argv}

    def number(flag, kind):
        text = flag_value(argv, flag)
        if text is None:
            return None
        try:
            value = kind(text)
        except ValueError:
            raise CapacityError(f"{flag} {text!r} in the launch is not a {kind.__name__}") from None
        if kind is float and not math.isfinite(value):
            raise CapacityError(f"{flag} {text!r} in the launch is not a finite number")
        return value

    for flag, (name, kind) in LAUNCH_FLAGS.items():
        value = number(flag, kind) if kind is not str else flag_value(argv, flag)
        if value is not None:
            options[name] = value
    algorithm = (flag_value(argv, "--speculative-algorithm") or "").upper()
    draft_tokens = number("--speculative-num-draft-tokens", int)
    if not algorithm or algorithm == "NONE":
        options["verify_tokens"] = 1
    elif algorithm == "DDTREE":
        budget = number("--speculative-ddtree-budget", int)
        if budget is None and draft_tokens is not None:
            budget = draft_tokens - 1
        if budget is not None:
            options["verify_tokens"] = budget + 1
            options["ddtree_budget"] = budget
    elif draft_tokens is not None:
        options["verify_tokens"] = draft_tokens
    return options


def plan(
    model_config: dict,
    gpu_memory_mib: int,
    tp_size: int,
    mem_fraction_static: float,
    kv_cache_dtype: str = "auto",
    draft_model_config: dict | None = None,
    overhead_mib: int = 3072,
    min_kv_tokens: int = 16384,
    gpu_count: int | None = None,
    sources: tuple[str, str] = ("model_config", "draft_model_config"),
    verify_tokens: int | None = None,
    max_running_requests: int | None = None,
    mamba_ssm_dtype: str | None = None,
    mamba_full_memory_ratio: float = MAMBA_FULL_MEMORY_RATIO,
    mamba_radix_cache_strategy: str = "auto",
    disable_overlap_schedule: bool = False,
    max_mamba_cache_size: int | None = None,
    context_length: int | str | None = None,
    ddtree_budget: int | None = None,
) -> dict:
    """Weights per GPU, KV bytes per token and the KV pool in tokens, with a fit verdict.
    `gpu_count`: the GPUs the server can span (None when unknown); `sources` name the two
    configs in messages (their paths, when they came from files). The rest plan a hybrid
    target's recurrent state (capacity_hybrid.py) and change nothing for a pure-attention one:
    `verify_tokens` (tokens verified per request per step: 1 for AR, the block size for a
    DFlash chain, budget + 1 for DDTree; default the drafter's block size, or 1),
    `max_running_requests` (default SGLang's: 48 under speculative decoding, else what the
    pools allow), and SGLang's --mamba-ssm-dtype, --mamba-full-memory-ratio,
    --mamba-radix-cache-strategy, --disable-overlap-schedule and --max-mamba-cache-size.
    `context_length`: the launch's --context-length, `auto` (or None) for the longest one
    request can use (context_fit()), which a DDTree launch's tree mask (`ddtree_budget`) bounds."""
    requested_context = check_context_length(context_length)
    check_ddtree_budget(ddtree_budget)
    check_numbers(gpu_memory_mib, mem_fraction_static, overhead_mib, min_kv_tokens, gpu_count)
    check_hybrid_numbers(
        verify_tokens,
        max_running_requests,
        mamba_ssm_dtype,
        mamba_full_memory_ratio,
        mamba_radix_cache_strategy,
        disable_overlap_schedule,
        max_mamba_cache_size,
    )
    kv_dtype_bytes(kv_cache_dtype)
    check_target(model_config, sources[0])
    if draft_model_config is not None:
        check_draft(draft_model_config, sources[1])
    check_tp_size(tp_size, model_config, draft_model_config, sources)
    verify = _verify_tokens(model_config, draft_model_config, verify_tokens, sources[1])
    layout = {
        "verify": verify,
        "speculative": draft_model_config is not None or verify > 1,
        **_weights_part(model_config, draft_model_config, tp_size),
        **_kv_part(model_config, draft_model_config, kv_cache_dtype, tp_size),
    }
    layout["static_budget"] = (gpu_memory_mib - overhead_mib) * MIB * mem_fraction_static
    layout["weights_left"] = layout["static_budget"] - layout["weights"] - layout["draft_weights"]
    layout.update(
        _recurrent_part(
            model_config,
            tp_size,
            layout,
            mamba_ssm_dtype,
            mamba_radix_cache_strategy,
            disable_overlap_schedule,
            mamba_full_memory_ratio,
            max_mamba_cache_size,
            max_running_requests,
        )
    )
    layout["reason"] = _fit(
        layout, gpu_count, tp_size, gpu_memory_mib, overhead_mib, mem_fraction_static, min_kv_tokens
    )
    # What the static pool leaves of the usable memory holds DDTree's tree masks.
    headroom = (gpu_memory_mib - overhead_mib) * MIB - layout["static_budget"]
    mask = tree_mask(ddtree_budget, layout["requests"], headroom)
    context = context_fit(layout["kv_tokens"], model_config, requested_context, mask)
    return {**context, **_summary(layout, model_config, mamba_ssm_dtype)}


def _verify_tokens(
    model_config: dict, draft_model_config: dict | None, verify_tokens: int | None, source: str
) -> int:
    """Tokens the target verifies per request and step: the given count, else the drafter's
    block size, else 1; a hybrid target with a drafter needs one of the first two."""
    verify = verify_tokens or draft_block_size(draft_model_config)
    if is_hybrid(model_config) and draft_model_config and not verify:
        raise CapacityError(
            f"verify_tokens is missing and {source} names no block_size; needed: the "
            "tokens the target verifies per request and step (SGLang's "
            "--speculative-num-draft-tokens; budget + 1 for DDTree), since every one keeps "
            "its own recurrent state on a hybrid target. Fix: pass verify_tokens."
        )
    return verify or 1


def _weights_part(model_config: dict, draft_model_config: dict | None, tp_size: int) -> dict:
    """The target's parameter groups and the bytes per GPU of its and the drafter's weights."""
    target = target_parameters(model_config)
    draft_weights = 0.0
    if draft_model_config:
        draft_weights = bytes_per_gpu(draft_parameters(draft_model_config), tp_size)
    return {
        "target_groups": target,
        "weights": bytes_per_gpu(target, tp_size),
        "draft_weights": draft_weights,
    }


def _kv_part(
    model_config: dict, draft_model_config: dict | None, kv_cache_dtype: str, tp_size: int
) -> dict:
    """KV bytes one token takes on one GPU in the target's cache and in the drafter's."""
    draft_kv = 0
    if draft_model_config:
        draft_kv = draft_kv_bytes_per_token(draft_model_config, kv_cache_dtype, tp_size)
    return {
        "kv_per_token": target_kv_bytes_per_token(model_config, kv_cache_dtype, tp_size),
        "draft_kv": draft_kv,
    }


def _recurrent_part(
    model_config: dict,
    tp_size: int,
    layout: dict,
    mamba_ssm_dtype: str | None,
    mamba_radix_cache_strategy: str,
    disable_overlap_schedule: bool,
    mamba_full_memory_ratio: float,
    max_mamba_cache_size: int | None,
    max_running_requests: int | None,
) -> dict:
    """What the weights leave split between the recurrent state's pools (none on a
    pure-attention target) and the KV cache: its bytes and tokens, and the running requests
    the pools hold."""
    per_request = recurrent_state_bytes(model_config, tp_size, mamba_ssm_dtype)
    ratio = states_per_request(mamba_radix_cache_strategy, disable_overlap_schedule)
    weights_left, speculative = layout["weights_left"], layout["speculative"]
    slots, requests, state_bytes, verify_bytes = 0, max_running_requests, 0.0, 0.0
    kv_pool = weights_left
    if per_request and weights_left > 0:
        slots, _, state_bytes, verify_bytes = recurrent_pools(
            weights_left,
            per_request,
            layout["verify"],
            speculative,
            max_running_requests,
            ratio,
            mamba_full_memory_ratio,
            max_mamba_cache_size,
        )
        kv_pool = weights_left - verify_bytes - state_bytes
    kv_tokens = max(0, int(kv_pool // (layout["kv_per_token"] + layout["draft_kv"])))
    if per_request:
        requests = resolve_max_running_requests(
            kv_tokens, text_config(model_config), max_running_requests, speculative, slots // ratio
        )
    return {
        "per_request": per_request,
        "ratio": ratio,
        "slots": slots,
        "requests": requests,
        "state_bytes": state_bytes,
        "verify_bytes": verify_bytes,
        "kv_pool": kv_pool,
        "kv_tokens": kv_tokens,
    }


def _fit(
    layout: dict,
    gpu_count: int | None,
    tp_size: int,
    gpu_memory_mib: int,
    overhead_mib: int,
    mem_fraction_static: float,
    min_kv_tokens: int,
) -> str | None:
    """Why the plan does not fit (the first reason found), or None when it fits."""
    weights = layout["weights"] + layout["draft_weights"]
    per_request, slots, requests = layout["per_request"], layout["slots"], layout["requests"]
    verify, kv_tokens = layout["verify"], layout["kv_tokens"]
    if gpu_count is not None and tp_size > gpu_count:
        return (
            f"tp_size {tp_size} needs {tp_size} GPUs but {gpu_count} GPUs are there; lower "
            "tp_size (kimi_tp_size) or use hosts with more GPUs"
        )
    if layout["weights_left"] <= 0:
        return (
            f"weights need {weights / GIB:.1f} GiB per GPU but the static "
            f"budget is {layout['static_budget'] / GIB:.1f} GiB ({gpu_memory_mib} MiB less "
            f"{overhead_mib} MiB overhead, x mem_fraction_static {mem_fraction_static}); "
            "use more GPUs (tp_size), GPUs with more memory, or a higher mem_fraction_static"
        )
    if per_request and (slots <= 0 or requests <= 0 or layout["kv_pool"] <= 0):
        return (
            f"the recurrent state of one request takes {per_request / MIB:.1f} MiB per GPU, and "
            f"{verify} verified tokens a step need {verify * per_request / GIB:.2f} GiB more "
            f"per request; after {weights / GIB:.1f} GiB of weights SGLang's "
            f"pools hold {max(slots, 0)} state slots ({layout['ratio']} per running request), "
            f"{max(requests or 0, 0)} running requests and {kv_tokens} KV tokens; lower "
            "verify_tokens (the DDTree budget), set --max-mamba-cache-size / "
            "--max-running-requests, raise --mamba-full-memory-ratio, use "
            "--mamba-ssm-dtype bfloat16, or use more GPUs"
        )
    if kv_tokens < min_kv_tokens:
        return (
            f"the KV cache pool holds {kv_tokens} tokens per GPU, fewer than the "
            f"{min_kv_tokens} needed; raise mem_fraction_static, use kv_cache_dtype fp8_e4m3, "
            "or use more GPUs"
        )
    return None


def _summary(layout: dict, model_config: dict, mamba_ssm_dtype: str | None) -> dict:
    """The plan's figures as library/capacity_plan.py returns them."""
    per_request, verify = layout["per_request"], layout["verify"]
    speculative = layout["speculative"]
    return {
        "weights_gib_per_gpu": round(layout["weights"] / GIB, 2),
        "draft_weights_gib_per_gpu": round(layout["draft_weights"] / GIB, 2),
        "checkpoint_gib": round(checkpoint_bytes(layout["target_groups"]) / GIB, 2),
        "kv_bytes_per_token": layout["kv_per_token"],
        "draft_kv_bytes_per_token": layout["draft_kv"],
        "kv_pool_gib": round(max(layout["kv_pool"], 0) / GIB, 2),
        "kv_tokens": layout["kv_tokens"],
        "static_budget_gib": round(layout["static_budget"] / GIB, 2),
        "fits": layout["reason"] is None,
        "reason": layout["reason"],
        "attention": "hybrid" if is_hybrid(model_config) else "pure_attention",
        "verify_tokens": verify,
        "max_running_requests": layout["requests"],
        "recurrent_state_bytes_per_request": per_request,
        "recurrent_state_bytes_per_verify_token": per_request if speculative else 0,
        "verify_state_bytes_per_request": per_request * verify if speculative else 0,
        "recurrent_state_slots": max(layout["slots"], 0),
        "recurrent_state_gib": round(layout["state_bytes"] / GIB, 2),
        "verify_state_gib": round(layout["verify_bytes"] / GIB, 2),
        "mamba_ssm_dtype": ssm_dtype(model_config, mamba_ssm_dtype) if per_request else None,
    }
