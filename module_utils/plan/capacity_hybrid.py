"""Capacity of a hybrid attention/recurrent target (Qwen3.5/3.6, Qwen3-Next: `layer_types`
mixing full_attention and linear_attention, the Gated DeltaNet), following SGLang 0.5.23:

- Gated attention (GQA, with an output gate doubling q_proj): q/o split over ranks, K/V
  heads split while there are at least as many as ranks, else one per rank
  (python/sglang/srt/models/qwen3_5.py, Qwen3_5Attention). The KV cache holds the full
  attention layers only, split the same way (pool_configurator.py, DefaultPoolConfigurator
  counts mambaish full_attention_layer_ids).
- Gated DeltaNet layers: in_proj_qkvz, in_proj_ba, conv1d, A_log, dt_bias and out_proj split
  over ranks by heads. Their recurrent state per request slot and layer is a conv state
  (conv_dim / tp x (kernel - 1), bfloat16: SGLANG_MAMBA_CONV_DTYPE) and an SSM state
  (value heads / tp x value_head_dim x key_head_dim, mamba_ssm_dtype: float32 unless the config
  or the server says otherwise) (configs/mamba_utils.py, Mamba2StateShape.create and
  mamba_cache_per_req).
- The recurrent pool takes its share of the static budget before the KV cache
  (mem_cache/kv_cache_configurator.py, _handle_max_mamba_cache): mamba_full_memory_ratio
  (0.9) / (1 + ratio) of what the weights leave. Speculative decoding adds, per request slot
  (+1 padding slot), one intermediate state per verified token (memory_pool.py, MambaPool:
  intermediate_ssm_state_cache [layers, slots + 1, draft tokens, ...]); the slots are solved
  jointly, and the request count is capped by the slots over the radix cache's states per
  request (3, + 2 with extra_buffer under overlap, + 1 without: _calculate_mamba_ratio).
  A DDTree tree verifies budget + 1 nodes, each with its own state, which is why budgets
  cost memory on a hybrid target.
- An MTP head in the checkpoint counts in its size but is not loaded without NEXTN.
"""

from __future__ import annotations

from ansible.module_utils.plan.capacity_common import (
    BF16,
    MAX_HEADS,
    MAX_KV_TOKENS,
    MAX_LAYERS,
    MAX_REQUESTS,
    MAX_VOCAB,
    MAX_WIDTH,
    CapacityError,
    Fields,
    divides,
    is_int,
    kv_dtype_bytes,
    kv_heads_split,
    text_config,
)

# SGLang's dtypes of the recurrent state (configs/mamba_utils.py, mamba2_state_dtype): the SSM
# state defaults to float32, the conv state is bfloat16 (SGLANG_MAMBA_CONV_DTYPE).
SSM_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CONV_DTYPE = "bfloat16"
LAYER_TYPES = ("linear_attention", "full_attention")
# SGLang 0.5.23 defaults the plan mirrors (sources in this module's docstring).
MAMBA_FULL_MEMORY_RATIO = 0.9  # fields/schedule.py: mamba_full_memory_ratio fallback
SPEC_MAX_RUNNING_REQUESTS = 48  # speculative_hook.py: reset to 48 for speculative decoding
MAMBA_STATES_PER_REQUEST = 3  # kv_cache_configurator.py: MAMBA_CACHE_SIZE_MAX_RUNNING_...
MAMBA_STRATEGIES = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")


def is_hybrid(config: dict) -> bool:
    """A target whose text config lists its layers' types (attention and recurrent)."""
    cfg = text_config(config)
    return isinstance(cfg, dict) and "layer_types" in cfg


def check_hybrid(top: Fields, cfg: Fields) -> None:
    """Every field of a hybrid (Qwen3.5/3.6, Qwen3-Next style) target the plan reads."""
    cfg.integer("hidden_size", MAX_WIDTH)
    layers = cfg.integer("num_hidden_layers", MAX_LAYERS)
    cfg.integer("vocab_size", MAX_VOCAB)
    cfg.integer("intermediate_size", MAX_WIDTH)
    cfg.integer("max_position_embeddings", MAX_KV_TOKENS)
    types = cfg.strings("layer_types", LAYER_TYPES, layers)
    interval = cfg.integer("full_attention_interval", layers, default=None, nullable=True)
    if interval is not None:
        placed = [LAYER_TYPES[(i + 1) % interval == 0] for i in range(layers)]
        if placed != types:
            # SGLang 0.5.23 places the layers by the interval (configs/qwen3_next.py,
            # layers_block_type), transformers by layer_types: both must say the same.
            raise cfg.error(
                "full_attention_interval",
                interval,
                "the period of layer_types' full_attention layers (SGLang places the layers by it)",
            )
    heads = cfg.integer("num_attention_heads", MAX_HEADS)
    kv_heads = cfg.integer("num_key_value_heads", heads)
    if heads % kv_heads:
        raise cfg.error(
            "num_key_value_heads", kv_heads, f"a divisor of num_attention_heads ({heads})"
        )
    cfg.integer("head_dim", MAX_WIDTH)
    if not isinstance(cfg.config.get("attn_output_gate", True), bool):
        raise cfg.error("attn_output_gate", cfg.config["attn_output_gate"], "true or false")
    if "linear_attention" in types:
        value_heads = cfg.integer("linear_num_value_heads", MAX_HEADS)
        key_heads = cfg.integer("linear_num_key_heads", value_heads)
        if value_heads % key_heads:
            raise cfg.error(
                "linear_num_key_heads",
                key_heads,
                f"a divisor of linear_num_value_heads ({value_heads})",
            )
        cfg.integer("linear_key_head_dim", MAX_WIDTH)
        cfg.integer("linear_value_head_dim", MAX_WIDTH)
        # The conv state keeps kernel - 1 inputs, so a kernel of 1 leaves none.
        cfg.integer("linear_conv_kernel_dim", 64, low=2)
        cfg.choice("mamba_ssm_dtype", tuple(SSM_DTYPE_BYTES), default=None, nullable=True)
    cfg.integer("mtp_num_hidden_layers", 64, low=0, default=0)
    cfg.flag("tie_word_embeddings")
    if cfg.part("quantization_config"):
        raise cfg.error(
            "quantization_config", "present", "none: a quantized hybrid target is not modelled"
        )
    vision = top.part("vision_config")
    if vision:
        vision.integer("depth", MAX_LAYERS)
        vision.integer("hidden_size", MAX_WIDTH)
        vision.integer("intermediate_size", MAX_WIDTH)
        vision.integer("out_hidden_size", MAX_WIDTH)
        vision.integer("in_channels", 16, default=3)
        vision.integer("patch_size", 1024)
        vision.integer("temporal_patch_size", 64, default=2)
        vision.integer("spatial_merge_size", 64, default=2)
        vision.integer("num_position_embeddings", MAX_VOCAB, low=0, default=0)
        depth = vision.config["depth"]
        vision.integers("deepstack_visual_indexes", depth - 1, depth, default=[], min_length=0)


def _gated_attention(cfg: dict) -> tuple[int, int, int]:
    """(split, KV, replicated) parameter counts of one gated GQA attention block: q_proj
    (doubled by the output gate), k/v_proj, o_proj, and the q/k norms."""
    hidden, heads, head_dim = cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"]
    gate = 2 if cfg.get("attn_output_gate", True) else 1
    split = hidden * heads * head_dim * gate + heads * head_dim * hidden
    kv = 2 * hidden * cfg["num_key_value_heads"] * head_dim
    return split, kv, 2 * head_dim


def _gated_deltanet(cfg: dict) -> tuple[int, int]:
    """(split, replicated) parameter counts of one Gated DeltaNet layer: in_proj_qkvz,
    in_proj_ba, conv1d (no bias), dt_bias, A_log and out_proj split by heads; the gated
    norm (one value head wide) replicated."""
    hidden, value_heads = cfg["hidden_size"], cfg["linear_num_value_heads"]
    key_dim = cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
    value_dim = value_heads * cfg["linear_value_head_dim"]
    conv_dim = 2 * key_dim + value_dim
    split = (
        hidden * (2 * key_dim + 2 * value_dim)
        + hidden * 2 * value_heads
        + conv_dim * cfg["linear_conv_kernel_dim"]
        + 2 * value_heads
        + value_dim * hidden
    )
    return split, cfg["linear_value_head_dim"]


def hybrid_parameters(config: dict) -> dict[str, dict]:
    """Parameter groups of a hybrid target (Qwen3.5/3.6 layout)."""
    cfg = text_config(config)
    hidden, vocab, layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    full = cfg["layer_types"].count("full_attention")
    linear = layers - full
    attn_split, attn_kv, attn_norms = _gated_attention(cfg)
    gdn_split, gdn_norm = _gated_deltanet(cfg) if linear else (0, 0)
    mlp = 3 * hidden * cfg["intermediate_size"]
    groups = {
        "embedding": {"params": vocab * hidden, "bytes": BF16, "split": True},
        "lm_head": {
            "params": 0 if cfg.get("tie_word_embeddings") else vocab * hidden,
            "bytes": BF16,
            "split": True,
        },
        "attention_split": {"params": full * attn_split, "bytes": BF16, "split": True},
        # With fewer KV heads than ranks each rank keeps one (Qwen3_5Attention).
        "attention_kv": {
            "params": full * attn_kv,
            "bytes": BF16,
            "split": True,
            "split_max": cfg["num_key_value_heads"],
        },
        "linear_attention": {"params": linear * gdn_split, "bytes": BF16, "split": True},
        "norms": {
            "params": (2 * layers + 1) * hidden + full * attn_norms + linear * gdn_norm,
            "bytes": BF16,
            "split": False,
        },
        "dense_mlp": {"params": layers * mlp, "bytes": BF16, "split": True},
    }
    vision = config.get("vision_config")
    if vision:
        groups["vision_tower"] = {
            "params": qwen_vision_parameters(vision),
            "bytes": BF16,
            "split": False,
        }
    mtp_layers = cfg.get("mtp_num_hidden_layers", 0)
    if mtp_layers:
        # fc over [embedding; hidden], its decoder layers (gated attention + MLP + 2 norms),
        # and three norms; in the checkpoint, loaded only for NEXTN speculative decoding.
        layer = attn_split + attn_kv + attn_norms + mlp + 2 * hidden
        groups["mtp"] = {
            "params": 2 * hidden * hidden + mtp_layers * layer + 3 * hidden,
            "bytes": BF16,
            "split": True,
            "served": False,
        }
    return groups


def qwen_vision_parameters(vision: dict) -> int:
    """Qwen3-VL/3.5 vision tower: a Conv3d patch embedding, learned position embeddings,
    ViT blocks (LayerNorms and linears with biases), and the 2x2 patch merger into the text
    model (plus one more merger per deepstack layer)."""
    width, mlp = vision["hidden_size"], vision["intermediate_size"]
    patch = vision["patch_size"]
    voxel = vision.get("in_channels", 3) * vision.get("temporal_patch_size", 2) * patch * patch
    embed = voxel * width + width + vision.get("num_position_embeddings", 0) * width
    block = (
        2 * width  # norm1
        + width * 3 * width
        + 3 * width  # qkv
        + width * width
        + width  # proj
        + 2 * width  # norm2
        + width * mlp
        + mlp  # fc1
        + mlp * width
        + width  # fc2
    )
    merged = width * vision.get("spatial_merge_size", 2) ** 2
    out = vision["out_hidden_size"]
    linears = merged * merged + merged + merged * out + out
    # The main merger normalises before the 2x2 shuffle, deepstack mergers after it.
    deepstack = len(vision.get("deepstack_visual_indexes", []))
    mergers = 2 * width + linears + deepstack * (2 * merged + linears)
    return embed + vision["depth"] * block + mergers


def hybrid_kv_bytes_per_token(config: dict, kv_cache_dtype: str, tp_size: int) -> int:
    """K and V of the full-attention layers only, their KV heads split over ranks (one per
    rank when there are fewer heads than ranks)."""
    cfg = text_config(config)
    full = cfg["layer_types"].count("full_attention")
    per_rank = max(1, cfg["num_key_value_heads"] // tp_size)
    return 2 * per_rank * cfg["head_dim"] * full * kv_dtype_bytes(kv_cache_dtype)


def check_hybrid_tp(tp_size: int, target: dict, source: str, fix: str) -> None:
    """What SGLang 0.5.23 splits evenly in a hybrid target (python/sglang/srt/models/
    qwen3_5.py): the attention's KV heads (divided, or each replicated when fewer than the
    ranks) and the Gated DeltaNet's key and value heads (num_k_heads // attn_tp_size)."""
    why = "SGLang gives every TP rank the same number of KV heads"
    kv_heads_split(tp_size, target["num_key_value_heads"], source, why, fix)
    if "linear_attention" in target["layer_types"]:
        why = "the Gated DeltaNet layers split their heads evenly over TP ranks"
        for field in ("linear_num_key_heads", "linear_num_value_heads"):
            divides(tp_size, target[field], field, source, why, fix)


def check_hybrid_numbers(
    verify_tokens,
    max_running_requests,
    mamba_ssm_dtype,
    mamba_full_memory_ratio,
    mamba_radix_cache_strategy,
    disable_overlap_schedule,
    max_mamba_cache_size,
) -> None:
    """The parameters of the recurrent state's plan, each within its range (checked for
    every target, so a bad value never passes unnoticed on a pure-attention one)."""
    ratio = mamba_full_memory_ratio

    def count(value, high):
        return value is None or (is_int(value) and 1 <= value <= high)

    checks = [
        (
            "verify_tokens",
            verify_tokens,
            count(verify_tokens, MAX_LAYERS),
            f"an integer from 1 to {MAX_LAYERS} (1 for AR, the block size for a DFlash chain, "
            "budget + 1 for DDTree), or none for the drafter's block size",
        ),
        (
            "max_running_requests",
            max_running_requests,
            count(max_running_requests, MAX_REQUESTS),
            f"an integer from 1 to {MAX_REQUESTS}, or none for SGLang's choice",
        ),
        (
            "mamba_ssm_dtype",
            mamba_ssm_dtype,
            mamba_ssm_dtype is None or mamba_ssm_dtype in SSM_DTYPE_BYTES,
            f"one of {', '.join(SSM_DTYPE_BYTES)}, or none for the model's config",
        ),
        (
            "mamba_full_memory_ratio",
            ratio,
            # NaN and infinity fail the comparison too.
            not isinstance(ratio, bool) and isinstance(ratio, float | int) and 0 < ratio <= 1e3,
            "a number above 0 and at most 1000 (SGLang's default 0.9)",
        ),
        (
            "mamba_radix_cache_strategy",
            mamba_radix_cache_strategy,
            isinstance(mamba_radix_cache_strategy, str)
            and mamba_radix_cache_strategy in MAMBA_STRATEGIES,
            f"one of {', '.join(MAMBA_STRATEGIES)}",
        ),
        (
            "disable_overlap_schedule",
            disable_overlap_schedule,
            isinstance(disable_overlap_schedule, bool),
            "true or false",
        ),
        (
            "max_mamba_cache_size",
            max_mamba_cache_size,
            count(max_mamba_cache_size, MAX_REQUESTS),
            f"an integer from 1 to {MAX_REQUESTS}, or none for SGLang's share of memory",
        ),
    ]
    for name, value, ok, needed in checks:
        if not ok:
            raise CapacityError(
                f"{name} is {value!r}; needed: {needed}. Fix: pass the value SGLang is "
                "launched with (or leave it unset)."
            )
    if mamba_radix_cache_strategy == "extra_buffer_lazy" and disable_overlap_schedule:
        raise CapacityError(
            "mamba_radix_cache_strategy extra_buffer_lazy needs overlap scheduling; needed: "
            "disable_overlap_schedule false, or another strategy (SGLang asserts the same)."
        )


def recurrent_state_bytes(config: dict, tp_size: int, mamba_ssm_dtype: str | None) -> int:
    """Conv plus SSM state of one request slot on one GPU over every recurrent layer
    (SGLang's mamba_cache_per_req for Mamba2StateShape.create); 0 without recurrent layers."""
    if not is_hybrid(config):
        return 0
    cfg = text_config(config)
    linear = cfg["layer_types"].count("linear_attention")
    if not linear:
        return 0
    key_dim = cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
    value_dim = cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"]
    conv = (2 * key_dim + value_dim) // tp_size * (cfg["linear_conv_kernel_dim"] - 1)
    ssm = (
        cfg["linear_num_value_heads"]
        // tp_size
        * cfg["linear_value_head_dim"]
        * cfg["linear_key_head_dim"]
    )
    dtype = ssm_dtype(config, mamba_ssm_dtype)
    return (conv * SSM_DTYPE_BYTES[CONV_DTYPE] + ssm * SSM_DTYPE_BYTES[dtype]) * linear


def ssm_dtype(config: dict, override: str | None) -> str:
    """The server's --mamba-ssm-dtype, else the config's mamba_ssm_dtype, else float32."""
    return override or text_config(config).get("mamba_ssm_dtype") or "float32"


def states_per_request(strategy: str, disable_overlap_schedule: bool) -> int:
    """Recurrent state slots the radix cache keeps per running request (SGLang's
    _calculate_mamba_ratio): 3, plus the extra buffer's tracking slots (2 under overlap
    scheduling, 1 without or lazy). `auto` resolves as SGLang does for page size 1:
    extra_buffer under overlap scheduling, else no_buffer (arg_groups/overrides.py,
    _mamba_radix_cache_resolution)."""
    if strategy == "auto":
        strategy = "no_buffer" if disable_overlap_schedule else "extra_buffer"
    if strategy == "no_buffer":
        return MAMBA_STATES_PER_REQUEST
    if strategy == "extra_buffer_lazy":
        return MAMBA_STATES_PER_REQUEST + 1
    return MAMBA_STATES_PER_REQUEST + (1 if disable_overlap_schedule else 2)


def recurrent_pools(
    rest: float,
    per_request: int,
    verify_tokens: int,
    speculative: bool,
    max_running_requests: int | None,
    ratio: int,
    mamba_full_memory_ratio: float,
    max_mamba_cache_size: int | None,
) -> tuple[int, int, float, float]:
    """SGLang 0.5.23's _handle_max_mamba_cache: (state slots, requests whose verify states
    are reserved, persistent state bytes, verify state bytes). Slots come from the explicit
    --max-mamba-cache-size, else from mamba_full_memory_ratio's share of what the weights
    leave, solved jointly with the verify states under speculative decoding."""
    if max_mamba_cache_size is not None:
        slots = max_mamba_cache_size
    else:
        budget = rest * mamba_full_memory_ratio / (1 + mamba_full_memory_ratio)
        if speculative:
            slots = int(
                (budget - per_request * (1 + verify_tokens))
                // (per_request * (1 + verify_tokens / ratio))
            )
        else:
            slots = int((budget - per_request) // per_request)
    held = 0
    verify_state = 0.0
    if speculative:
        held = min(max_running_requests or SPEC_MAX_RUNNING_REQUESTS, max(slots, 0) // ratio)
        # +1: the pool's padding slot.
        verify_state = float(per_request * (held + 1) * verify_tokens)
    return slots, held, float((slots + 1) * per_request), verify_state


def resolve_max_running_requests(
    kv_tokens: int, cfg: dict, requested: int | None, speculative: bool, state_cap: int
) -> int:
    """SGLang's resolve_max_num_reqs: the requested count (48 under speculative decoding when
    none is), else an estimate from the KV pool and context length (2048 to 4096); at most
    half the KV tokens, and at most the recurrent slots over the states per request."""
    if requested is None and speculative:
        requested = SPEC_MAX_RUNNING_REQUESTS
    if requested is not None:
        count = min(requested, kv_tokens // 2)
    else:
        estimated = int(kv_tokens / cfg["max_position_embeddings"] * 512)
        count = min(max(min(estimated, 4096), 2048), kv_tokens // 2)
    return max(0, min(count, state_cap))
