"""Memory capacity of a Kimi K2.6 deployment per GPU: weights, drafter, KV cache pool.

Pure computation over HF-style config.json dictionaries, shared by library/capacity_plan.py
and the plan. The model follows how SGLang lays the model out under tensor parallelism:

- MLA attention: q_a_proj and kv_a_proj_with_mqa are replicated on every rank; q_b_proj,
  kv_b_proj and o_proj are split across ranks. The latent KV cache (kv_lora_rank +
  qk_rope_head_dim per layer and token) is NOT split: every rank holds all of it.
- MLPs, routed and shared experts, the embedding and the LM head are split across ranks;
  the router, the norms and the vision tower are replicated.
- Routed experts in compressed-tensors pack-quantized INT4 take num_bits/8 bytes per weight
  plus one BF16 scale per group; everything the quantization config ignores is BF16.
- The KV pool is what SGLang's static memory fraction leaves after weights:
  (usable memory x mem_fraction_static) - weights, divided by the bytes one token takes
  across the target's and the drafter's caches. Usable memory is the card's memory less an
  overhead that SGLang never sees: the driver's reserve (637 MiB on an RTX PRO 6000), the
  CUDA context and NCCL's buffers. 3 GiB reproduces the published SGLang KV pool of Kimi
  K2.5 on 8x RTX PRO 6000 (tests/unit/test_capacity.py names the source).

Hybrid attention/recurrent targets (Qwen3.5/3.6, Qwen3-Next: `layer_types` mixing
full_attention and linear_attention, the Gated DeltaNet) follow SGLang 0.5.23 as well:

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

Context length (SGLang's --context-length): `auto` is the longest request one server can
hold whole - the KV pool in tokens (target and drafter caches together), capped at the
model's max_position_embeddings. SGLang itself warns when the pool holds fewer tokens than
--context-length and then caps a request at the pool (python/sglang/srt/managers/tp_worker.py,
TpModelWorker.get_worker_info); the plan says so before the launch, for a value the user set.

A config.json is outside input: every field read is checked first (an int that is not a bool,
within bounds far above any released model), and tp_size is checked against what SGLang
splits evenly over ranks, so a plan never holds a negative, NaN or silently wrong figure.
"""

from __future__ import annotations

import math
import re

GIB = 1 << 30
MIB = 1 << 20
BF16 = 2
KV_DTYPE_BYTES = {"auto": 2, "bf16": 2, "bfloat16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}


# Bounds on config fields: far above any released model, low enough that every product
# below stays exact in a float.
MAX_WIDTH = 1 << 20  # hidden and intermediate sizes, ranks, head dimensions
MAX_LAYERS = 4096
MAX_HEADS = 1 << 16
MAX_EXPERTS = 1 << 16
MAX_VOCAB = 1 << 24
MAX_TP = 1024
MAX_GPU_MEMORY_MIB = 1 << 24  # 16 TiB on one GPU
MAX_GPU_COUNT = 1 << 16
MAX_KV_TOKENS = 1 << 40
MAX_REQUESTS = 1 << 20
MISSING = object()
# SGLang's dtypes of the recurrent state (configs/mamba_utils.py, mamba2_state_dtype): the SSM
# state defaults to float32, the conv state is bfloat16 (SGLANG_MAMBA_CONV_DTYPE).
SSM_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CONV_DTYPE = "bfloat16"
LAYER_TYPES = ("linear_attention", "full_attention")
DRAFT_LAYER_TYPES = ("full_attention", "sliding_attention")
# SGLang 0.5.23 defaults the plan mirrors (sources in the module docstring).
MAMBA_FULL_MEMORY_RATIO = 0.9  # fields/schedule.py: mamba_full_memory_ratio fallback
SPEC_MAX_RUNNING_REQUESTS = 48  # speculative_hook.py: reset to 48 for speculative decoding
MAMBA_STATES_PER_REQUEST = 3  # kv_cache_configurator.py: MAMBA_CACHE_SIZE_MAX_RUNNING_...
MAMBA_STRATEGIES = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")


class CapacityError(Exception):
    pass


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Fields:
    """Reads one config (or a part of it) and fails naming the file, the field, what was
    found and what is needed."""

    def __init__(self, config, source: str, prefix: str = ""):
        self.source, self.prefix = source, prefix
        if not isinstance(config, dict):
            raise self.error("", config, "a JSON object")
        self.config = config

    def error(self, name: str, value, needed: str) -> CapacityError:
        field = f"{self.prefix}{name}" or "the top level"
        found = "missing" if value is MISSING else f"{value!r}"
        return CapacityError(
            f"{self.source}: {field} is {found}; needed: {needed}. Fix: correct {field} in "
            f"{self.source} (copy the model's config.json from its hub repository unchanged)."
        )

    def integer(self, name: str, high: int, low: int = 1, default=MISSING, nullable=False) -> int:
        value = self.config.get(name, default)
        if value is None and nullable:
            return None
        if not _is_int(value) or not low <= value <= high:
            raise self.error(name, value, f"an integer from {low} to {high}")
        return value

    def flag(self, name: str) -> bool:
        value = self.config.get(name, False)
        if not isinstance(value, bool):
            raise self.error(name, value, "true or false")
        return value

    def choice(self, name: str, choices, default=MISSING, nullable=False):
        value = self.config.get(name, default)
        if value is None and nullable:
            return None
        if not isinstance(value, str) or value not in choices:
            raise self.error(name, value, f"one of {', '.join(map(repr, choices))}")
        return value

    def strings(self, name: str, choices, length: int) -> list[str]:
        value = self.config.get(name, MISSING)
        if not (
            isinstance(value, list)
            and len(value) == length
            and all(isinstance(v, str) and v in choices for v in value)
        ):
            raise self.error(
                name, value, f"a list of {length} entries, each one of {', '.join(choices)}"
            )
        return value

    def integers(
        self, name: str, high: int, max_length: int, default=MISSING, min_length: int = 1
    ) -> list[int]:
        value = self.config.get(name, default)
        if not (
            isinstance(value, list)
            and min_length <= len(value) <= max_length
            and all(_is_int(v) and 0 <= v <= high for v in value)
        ):
            raise self.error(
                name, value, f"a list of {min_length} to {max_length} integers from 0 to {high}"
            )
        return value

    def part(self, name: str, nullable: bool = True) -> Fields | None:
        value = self.config.get(name)
        if value is None and nullable:
            return None
        if not isinstance(value, dict):
            raise self.error(name, value, "a JSON object")
        return Fields(value, self.source, f"{self.prefix}{name}.")


def _check_mla(cfg: Fields) -> None:
    heads = cfg.integer("num_attention_heads", MAX_HEADS)
    for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank"):
        cfg.integer(name, MAX_WIDTH)
    cfg.integer("q_lora_rank", MAX_WIDTH, nullable=True, default=None)
    kv_heads = cfg.config.get("num_key_value_heads")
    if kv_heads is not None:
        cfg.integer("num_key_value_heads", heads)


def check_target(config, source: str = "model_config") -> None:
    """Every field of a DeepSeek-V3-style target config that the plan reads."""
    top = Fields(config, source)
    cfg = top.part("text_config", nullable=True) or top
    if "layer_types" in cfg.config:
        _check_hybrid(top, cfg)
        return
    cfg.integer("hidden_size", MAX_WIDTH)
    layers = cfg.integer("num_hidden_layers", MAX_LAYERS)
    cfg.integer("vocab_size", MAX_VOCAB)
    cfg.integer("intermediate_size", MAX_WIDTH)
    cfg.integer("first_k_dense_replace", layers, low=0, default=0)
    experts = cfg.integer("n_routed_experts", MAX_EXPERTS, low=0, default=None, nullable=True)
    # Read (and so checked) even without routed experts: the shared experts use it too.
    cfg.integer(
        "moe_intermediate_size",
        MAX_WIDTH,
        default=MISSING if experts else None,
        nullable=not experts,
    )
    cfg.integer("n_shared_experts", MAX_EXPERTS, low=0, default=None, nullable=True)
    _check_mla(cfg)
    cfg.flag("tie_word_embeddings")
    cfg.integer("max_position_embeddings", MAX_KV_TOKENS, default=None, nullable=True)
    quant = cfg.part("quantization_config")
    if quant:
        _check_quantization(quant)
    vision = top.part("vision_config")
    if vision:
        vision.integer("hidden_size", MAX_WIDTH)
        vision.integer("num_hidden_layers", MAX_LAYERS)
        vision.integer("intermediate_size", MAX_WIDTH)
        vision.integer("patch_size", 1024, default=14)
        kernel = vision.config.get("merge_kernel_size", [2, 2])
        if not (
            isinstance(kernel, list)
            and 1 <= len(kernel) <= 3
            and all(_is_int(k) and 1 <= k <= 64 for k in kernel)
        ):
            needed = "a list of 1 to 3 integers from 1 to 64"
            raise vision.error("merge_kernel_size", kernel, needed)


def is_hybrid(config: dict) -> bool:
    """A target whose text config lists its layers' types (attention and recurrent)."""
    cfg = text_config(config)
    return isinstance(cfg, dict) and "layer_types" in cfg


def _check_hybrid(top: Fields, cfg: Fields) -> None:
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


def _check_quantization(quant: Fields) -> None:
    method = quant.config.get("quant_method")
    if method != "compressed-tensors":
        # routed_expert_bytes_per_weight says which methods are modelled.
        return
    ignore = quant.config.get("ignore", [])
    if not isinstance(ignore, list) or not all(isinstance(p, str) for p in ignore):
        raise quant.error("ignore", ignore, "a list of module names or re: patterns")
    for pattern in ignore:
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as exc:
                needed = f"a valid regular expression ({exc})"
                raise quant.error("ignore", pattern, needed) from None
    groups = quant.part("config_groups")
    if groups is None:
        return
    for name in groups.config:
        weights = groups.part(name, nullable=False).part("weights", nullable=False)
        weights.integer("num_bits", 32)
        weights.integer("group_size", MAX_WIDTH, default=None, nullable=True)
        symmetric = weights.config.get("symmetric", True)
        if not isinstance(symmetric, bool):
            raise weights.error("symmetric", symmetric, "true or false")


def check_draft(config, source: str = "draft_model_config") -> None:
    """Every field of a drafter config (DFlash with GQA layers, or EAGLE-3 with MLA)."""
    cfg = Fields(config, source)
    hidden = cfg.integer("hidden_size", MAX_WIDTH)
    cfg.integer("num_hidden_layers", MAX_LAYERS)
    cfg.integer("intermediate_size", MAX_WIDTH)
    cfg.integer("vocab_size", MAX_VOCAB)
    cfg.integer("draft_vocab_size", MAX_VOCAB, default=None, nullable=True)
    cfg.integer("num_target_layers", MAX_LAYERS, low=0, default=0)
    cfg.flag("tie_word_embeddings")
    architectures = config.get("architectures", [])
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise cfg.error("architectures", architectures, "a list of class names")
    dflash = cfg.part("dflash_config")
    if dflash and "target_layer_ids" in dflash.config:
        dflash.integers("target_layer_ids", MAX_LAYERS - 1, MAX_LAYERS)
    cfg.integer("block_size", MAX_LAYERS, default=None, nullable=True)
    if "layer_types" in config:
        layers = config["num_hidden_layers"]
        if "sliding_attention" in cfg.strings("layer_types", DRAFT_LAYER_TYPES, layers):
            cfg.integer("sliding_window", MAX_KV_TOKENS)
    if "kv_lora_rank" in config:
        _check_mla(cfg)
        return
    heads = cfg.integer("num_attention_heads", MAX_HEADS)
    kv_heads = cfg.integer("num_key_value_heads", heads)
    if heads % kv_heads:
        raise cfg.error(
            "num_key_value_heads", kv_heads, f"a divisor of num_attention_heads ({heads})"
        )
    head_dim = cfg.integer("head_dim", MAX_WIDTH, default=None, nullable=True)
    if head_dim is None and hidden % heads:
        raise cfg.error(
            "head_dim",
            MISSING,
            f"a head size, since hidden_size {hidden} is not a multiple of "
            f"num_attention_heads {heads}",
        )


def text_config(config: dict) -> dict:
    """The language model's part of a multimodal config (or the config itself)."""
    return config.get("text_config") or config


def ignored(name: str, patterns: list[str]) -> bool:
    """Whether compressed-tensors' `ignore` list leaves module `name` unquantized, as SGLang
    0.5.23 decides it (layers/quantization/compressed_tensors/utils.py,
    check_equal_or_regex_match): a `re:` pattern matches from the start of the name
    (re.match, not a full match), a plain name matches the name or a dotted suffix of it."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], name):
                return True
        elif name == pattern or name.endswith("." + pattern):
            return True
    return False


def routed_expert_bytes_per_weight(cfg: dict) -> float:
    """Bytes per routed-expert weight under the checkpoint's quantization config."""
    quant = cfg.get("quantization_config")
    if not quant:
        return BF16
    method = quant.get("quant_method")
    if method != "compressed-tensors":
        raise CapacityError(
            f"quantization method {method!r} is not modelled; needed: compressed-tensors "
            "(Kimi K2.6's INT4 experts) or none"
        )
    expert_weight = "model.layers.1.mlp.experts.0.gate_proj"
    if ignored(expert_weight, quant.get("ignore", [])):
        return BF16
    groups = list(quant.get("config_groups", {}).values())
    if not groups:
        return BF16
    weights = groups[0]["weights"]
    bits, group = weights["num_bits"], weights.get("group_size") or 0
    scale = BF16 / group if group else 0  # one BF16 scale per group of weights
    zero = 0 if weights.get("symmetric", True) else bits / 8 / max(group, 1)
    return bits / 8 + scale + zero


def _mla_attention(cfg: dict) -> tuple[int, int]:
    """(replicated, split) parameter counts of one MLA attention block."""
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    kv_rank, q_rank = cfg["kv_lora_rank"], cfg.get("q_lora_rank")
    replicated = hidden * (kv_rank + rope) + kv_rank  # kv_a_proj_with_mqa + its norm
    split = kv_rank * heads * (nope + v) + heads * v * hidden  # kv_b_proj + o_proj
    if q_rank:
        replicated += hidden * q_rank + q_rank  # q_a_proj + its norm
        split += q_rank * heads * (nope + rope)  # q_b_proj
    else:
        split += hidden * heads * (nope + rope)
    return replicated, split


def target_parameters(config: dict) -> dict[str, dict]:
    """Parameter groups of a DeepSeek-V3-style target: count, bytes per weight, split or not."""
    check_target(config)
    if is_hybrid(config):
        return hybrid_parameters(config)
    cfg = text_config(config)
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    vocab = cfg["vocab_size"]
    dense_layers = min(cfg.get("first_k_dense_replace", 0), layers)
    moe_layers = layers - dense_layers if cfg.get("n_routed_experts") else 0
    dense_layers = layers - moe_layers
    attn_replicated, attn_split = _mla_attention(cfg)
    experts = cfg.get("n_routed_experts") or 0
    expert_size = 3 * hidden * (cfg.get("moe_intermediate_size") or 0)
    groups = {
        "embedding": {"params": vocab * hidden, "bytes": BF16, "split": True},
        "lm_head": {
            "params": 0 if cfg.get("tie_word_embeddings") else vocab * hidden,
            "bytes": BF16,
            "split": True,
        },
        "attention_replicated": {
            "params": layers * attn_replicated,
            "bytes": BF16,
            "split": False,
        },
        "attention_split": {"params": layers * attn_split, "bytes": BF16, "split": True},
        "norms": {"params": (2 * layers + 1) * hidden, "bytes": BF16, "split": False},
        "dense_mlp": {
            "params": dense_layers * 3 * hidden * cfg["intermediate_size"],
            "bytes": BF16,
            "split": True,
        },
        "routed_experts": {
            "params": moe_layers * experts * expert_size,
            "bytes": routed_expert_bytes_per_weight(cfg),
            "split": True,
        },
        "shared_experts": {
            "params": moe_layers * (cfg.get("n_shared_experts") or 0) * expert_size,
            "bytes": BF16,
            "split": True,
        },
        "router": {"params": moe_layers * experts * (hidden + 1), "bytes": BF16, "split": False},
    }
    vision = config.get("vision_config")
    if vision:
        groups["vision_tower"] = {
            "params": vision_parameters(vision, hidden),
            "bytes": BF16,
            "split": False,
        }
    return groups


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


def vision_parameters(vision: dict, text_hidden: int) -> int:
    """A ViT encoder plus the patch-merging projector into the text model."""
    width, depth = vision["hidden_size"], vision["num_hidden_layers"]
    mlp = vision["intermediate_size"]
    patch = vision.get("patch_size", 14)
    merge = math.prod(vision.get("merge_kernel_size", [2, 2]))
    block = 4 * width * width + 4 * width + 2 * width * mlp + width + mlp + 4 * width
    projector = (width * merge) ** 2 + width * merge * text_hidden
    return depth * block + 3 * patch * patch * width + projector


def draft_parameters(config: dict) -> dict[str, dict]:
    """Parameter groups of a drafter: DFlash (GQA layers) or EAGLE-3 with MLA layers."""
    check_draft(config)
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    groups: dict[str, dict] = {}
    if "kv_lora_rank" in config:
        replicated, split = _mla_attention(config)
        groups["attention_replicated"] = {
            "params": layers * replicated,
            "bytes": BF16,
            "split": False,
        }
        groups["attention_split"] = {"params": layers * split, "bytes": BF16, "split": True}
    else:
        heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
        head_dim = config.get("head_dim") or hidden // heads
        split = hidden * head_dim * (2 * heads + 2 * kv_heads)
        groups["attention_split"] = {"params": layers * split, "bytes": BF16, "split": True}
    groups["mlp"] = {
        "params": layers * 3 * hidden * config["intermediate_size"],
        "bytes": BF16,
        "split": True,
    }
    groups["norms"] = {"params": (2 * layers + 1) * hidden, "bytes": BF16, "split": False}
    # The fc that fuses several target layers' hidden states into the drafter's input: as
    # many as dflash_config.target_layer_ids lists (SGLang's DFlash reads it, where
    # num_target_layers is the target's depth), else the kit's num_target_layers count.
    fused = config.get("num_target_layers", 0)
    layer_ids = (config.get("dflash_config") or {}).get("target_layer_ids")
    if layer_ids:
        fused = len(layer_ids)
    groups["fc"] = {"params": fused * hidden * hidden, "bytes": BF16, "split": False}
    # SGLang's DFlashDraftModel always projects through the target's LM head.
    if not config.get("tie_word_embeddings") and "DFlashDraftModel" not in config.get(
        "architectures", []
    ):
        groups["lm_head"] = {
            "params": (config.get("draft_vocab_size") or config["vocab_size"]) * hidden,
            "bytes": BF16,
            "split": True,
        }
    return groups


def _ways(group: dict, tp_size: int) -> int:
    """Ranks one group is split over: all of them, at most split_max (heads that cannot be
    split further are replicated), or none."""
    return min(tp_size, group.get("split_max", tp_size)) if group["split"] else 1


def bytes_per_gpu(groups: dict[str, dict], tp_size: int) -> float:
    return sum(
        g["params"] * g["bytes"] / _ways(g, tp_size)
        for g in groups.values()
        if g.get("served", True)
    )


def checkpoint_bytes(groups: dict[str, dict]) -> float:
    return sum(g["params"] * g["bytes"] for g in groups.values())


def kv_dtype_bytes(kv_cache_dtype: str) -> int:
    try:
        return KV_DTYPE_BYTES[kv_cache_dtype]
    except KeyError:
        raise CapacityError(
            f"kv_cache_dtype {kv_cache_dtype!r} is not known; use one of "
            f"{', '.join(sorted(KV_DTYPE_BYTES))}"
        ) from None


def target_kv_bytes_per_token(config: dict, kv_cache_dtype: str, tp_size: int = 1) -> int:
    """MLA: (kv_lora_rank + qk_rope_head_dim) x layers x bytes, the same on every rank.
    Hybrid: K and V of the full-attention layers only, their KV heads split over ranks (one
    per rank when there are fewer heads than ranks)."""
    cfg = text_config(config)
    if is_hybrid(config):
        full = cfg["layer_types"].count("full_attention")
        per_rank = max(1, cfg["num_key_value_heads"] // tp_size)
        return 2 * per_rank * cfg["head_dim"] * full * kv_dtype_bytes(kv_cache_dtype)
    per_layer = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    return per_layer * cfg["num_hidden_layers"] * kv_dtype_bytes(kv_cache_dtype)


def draft_kv_bytes_per_token(config: dict, kv_cache_dtype: str, tp_size: int) -> int:
    size = kv_dtype_bytes(kv_cache_dtype)
    layers = config["num_hidden_layers"]
    if "kv_lora_rank" in config:
        return (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * layers * size
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    # KV heads are split across ranks; with fewer heads than ranks each rank keeps one.
    per_rank = max(1, config["num_key_value_heads"] // tp_size)
    return 2 * per_rank * head_dim * layers * size


def _divides(tp_size: int, count: int, field: str, source: str, why: str, hint: str) -> None:
    if count % tp_size:
        fitting = [n for n in range(1, min(count, MAX_TP) + 1) if count % n == 0][-6:]
        raise CapacityError(
            f"tp_size {tp_size} does not divide {source}'s {field} ({count}): {why}. Needed: a "
            f"tp_size that divides {count} (e.g. {', '.join(map(str, fitting))}). Fix: {hint}"
        )


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
    if not _is_int(tp_size) or not 1 <= tp_size <= MAX_TP:
        raise CapacityError(
            f"tp_size {tp_size!r} is out of range; needed: an integer from 1 to {MAX_TP} (the "
            "GPUs one server spans). Fix: set kimi_tp_size to the number of GPUs, e.g. 8."
        )
    fix = "set kimi_tp_size to one of them."
    target, (target_source, draft_source) = text_config(model_config), sources
    _divides(
        tp_size,
        target["num_attention_heads"],
        "num_attention_heads",
        target_source,
        "SGLang gives every TP rank the same number of attention heads",
        fix,
    )
    dense = min(target.get("first_k_dense_replace", 0), target["num_hidden_layers"])
    if dense or not target.get("n_routed_experts"):
        _divides(
            tp_size,
            target["intermediate_size"],
            "intermediate_size",
            target_source,
            "the dense MLP is split evenly over TP ranks",
            fix,
        )
    if target.get("n_routed_experts"):
        _divides(
            tp_size,
            target["moe_intermediate_size"],
            "moe_intermediate_size",
            target_source,
            "every expert's MLP is split evenly over TP ranks",
            fix,
        )
    if is_hybrid(model_config):
        _check_hybrid_tp(tp_size, target, target_source, fix)
    if not draft_model_config:
        return
    draft = draft_model_config
    why = "the drafter's layers are split over the same TP ranks as the target's"
    _divides(tp_size, draft["num_attention_heads"], "num_attention_heads", draft_source, why, fix)
    _divides(tp_size, draft["intermediate_size"], "intermediate_size", draft_source, why, fix)
    if "kv_lora_rank" not in draft:
        _kv_heads_split(tp_size, draft["num_key_value_heads"], draft_source, why, fix)


def _kv_heads_split(tp_size: int, kv_heads: int, source: str, why: str, fix: str) -> None:
    """GQA KV heads over TP ranks as SGLang lays them out: divided evenly, or, with fewer heads
    than ranks, each replicated over tp_size / kv_heads ranks."""
    if kv_heads >= tp_size:
        _divides(tp_size, kv_heads, "num_key_value_heads", source, why, fix)
    elif tp_size % kv_heads:
        raise CapacityError(
            f"tp_size {tp_size} is not a multiple of {source}'s num_key_value_heads "
            f"({kv_heads}): with fewer KV heads than ranks SGLang replicates each over "
            f"tp_size / num_key_value_heads ranks. Needed: a tp_size that is a multiple of "
            f"{kv_heads} or divides it. Fix: {fix}"
        )


def _check_hybrid_tp(tp_size: int, target: dict, source: str, fix: str) -> None:
    """What SGLang 0.5.23 splits evenly in a hybrid target (python/sglang/srt/models/
    qwen3_5.py): the attention's KV heads (divided, or each replicated when fewer than the
    ranks) and the Gated DeltaNet's key and value heads (num_k_heads // attn_tp_size)."""
    why = "SGLang gives every TP rank the same number of KV heads"
    _kv_heads_split(tp_size, target["num_key_value_heads"], source, why, fix)
    if "linear_attention" in target["layer_types"]:
        why = "the Gated DeltaNet layers split their heads evenly over TP ranks"
        for field in ("linear_num_key_heads", "linear_num_value_heads"):
            _divides(tp_size, target[field], field, source, why, fix)


def check_numbers(
    gpu_memory_mib, mem_fraction_static, overhead_mib, min_kv_tokens, gpu_count
) -> None:
    """The plan's own inputs (the module's parameters), each within its range."""
    memory_ok = _is_int(gpu_memory_mib) and 1 <= gpu_memory_mib <= MAX_GPU_MEMORY_MIB
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
            memory_ok and _is_int(overhead_mib) and 0 <= overhead_mib < gpu_memory_mib,
            f"an integer from 0 to below gpu_memory_mib ({gpu_memory_mib})",
            "leave the default (3072) or measure what the driver and CUDA context take.",
        ),
        (
            "min_kv_tokens",
            min_kv_tokens,
            _is_int(min_kv_tokens) and 0 <= min_kv_tokens <= MAX_KV_TOKENS,
            f"an integer from 0 to {MAX_KV_TOKENS}",
            "leave the default (16384).",
        ),
        (
            "gpu_count",
            gpu_count,
            gpu_count is None or (_is_int(gpu_count) and 1 <= gpu_count <= MAX_GPU_COUNT),
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


def flag_value(argv: list, flag: str) -> str | None:
    """The value argparse would give flag (`--flag value` or `--flag=value`, the last wins)."""
    found = None
    for index, item in enumerate(argv):
        if item == flag and index + 1 < len(argv):
            found = str(argv[index + 1])
        elif isinstance(item, str) and item.startswith(flag + "="):
            found = item[len(flag) + 1 :]
    return found


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
    elif draft_tokens is not None:
        options["verify_tokens"] = draft_tokens
    return options


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
        return value is None or (_is_int(value) and 1 <= value <= high)

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


def _draft_block_size(draft_model_config: dict | None) -> int | None:
    if not draft_model_config:
        return None
    block = draft_model_config.get("block_size")
    return (
        block
        if block is not None
        else (draft_model_config.get("dflash_config") or {}).get("block_size")
    )


def _recurrent_pools(
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
) -> dict:
    """Weights per GPU, KV bytes per token and the KV pool in tokens, with a fit verdict.
    `gpu_count`: the GPUs the server can span (None when unknown); `sources` name the two
    configs in messages (their paths, when they came from files). The rest plan a hybrid
    target's recurrent state (module docstring) and change nothing for a pure-attention one:
    `verify_tokens` (tokens verified per request per step: 1 for AR, the block size for a
    DFlash chain, budget + 1 for DDTree; default the drafter's block size, or 1),
    `max_running_requests` (default SGLang's: 48 under speculative decoding, else what the
    pools allow), and SGLang's --mamba-ssm-dtype, --mamba-full-memory-ratio,
    --mamba-radix-cache-strategy, --disable-overlap-schedule and --max-mamba-cache-size.
    `context_length`: the launch's --context-length, `auto` (or None) for the longest one
    request can use (context_fit())."""
    requested_context = check_context_length(context_length)
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
    hybrid = is_hybrid(model_config)
    verify = verify_tokens or _draft_block_size(draft_model_config) or 1
    if (
        hybrid
        and draft_model_config
        and not (verify_tokens or _draft_block_size(draft_model_config))
    ):
        raise CapacityError(
            f"verify_tokens is missing and {sources[1]} names no block_size; needed: the "
            "tokens the target verifies per request and step (SGLang's "
            "--speculative-num-draft-tokens; budget + 1 for DDTree), since every one keeps "
            "its own recurrent state on a hybrid target. Fix: pass verify_tokens."
        )
    target = target_parameters(model_config)
    weights = bytes_per_gpu(target, tp_size)
    kv_per_token = target_kv_bytes_per_token(model_config, kv_cache_dtype, tp_size)
    draft_weights = 0.0
    draft_kv = 0
    if draft_model_config:
        draft = draft_parameters(draft_model_config)
        draft_weights = bytes_per_gpu(draft, tp_size)
        draft_kv = draft_kv_bytes_per_token(draft_model_config, kv_cache_dtype, tp_size)
    usable = (gpu_memory_mib - overhead_mib) * MIB
    static_budget = usable * mem_fraction_static
    kv_pool = static_budget - weights - draft_weights
    weights_left = kv_pool
    per_request = recurrent_state_bytes(model_config, tp_size, mamba_ssm_dtype)
    speculative = draft_model_config is not None or verify > 1
    ratio = states_per_request(mamba_radix_cache_strategy, disable_overlap_schedule)
    slots, requests, state_bytes, verify_bytes = 0, max_running_requests, 0.0, 0.0
    if per_request and weights_left > 0:
        slots, _, state_bytes, verify_bytes = _recurrent_pools(
            weights_left,
            per_request,
            verify,
            speculative,
            max_running_requests,
            ratio,
            mamba_full_memory_ratio,
            max_mamba_cache_size,
        )
        kv_pool = weights_left - verify_bytes - state_bytes
    kv_tokens = max(0, int(kv_pool // (kv_per_token + draft_kv)))
    if per_request:
        requests = _max_running_requests(
            kv_tokens, text_config(model_config), max_running_requests, speculative, slots // ratio
        )
    reason = None
    if gpu_count is not None and tp_size > gpu_count:
        reason = (
            f"tp_size {tp_size} needs {tp_size} GPUs but {gpu_count} GPUs are there; lower "
            "tp_size (kimi_tp_size) or use hosts with more GPUs"
        )
    elif weights_left <= 0:
        reason = (
            f"weights need {(weights + draft_weights) / GIB:.1f} GiB per GPU but the static "
            f"budget is {static_budget / GIB:.1f} GiB ({gpu_memory_mib} MiB less "
            f"{overhead_mib} MiB overhead, x mem_fraction_static {mem_fraction_static}); "
            "use more GPUs (tp_size), GPUs with more memory, or a higher mem_fraction_static"
        )
    elif per_request and (slots <= 0 or requests <= 0 or kv_pool <= 0):
        reason = (
            f"the recurrent state of one request takes {per_request / MIB:.1f} MiB per GPU, and "
            f"{verify} verified tokens a step need {verify * per_request / GIB:.2f} GiB more "
            f"per request; after {(weights + draft_weights) / GIB:.1f} GiB of weights SGLang's "
            f"pools hold {max(slots, 0)} state slots ({ratio} per running request), "
            f"{max(requests or 0, 0)} running requests and {kv_tokens} KV tokens; lower "
            "verify_tokens (the DDTree budget), set --max-mamba-cache-size / "
            "--max-running-requests, raise --mamba-full-memory-ratio, use "
            "--mamba-ssm-dtype bfloat16, or use more GPUs"
        )
    elif kv_tokens < min_kv_tokens:
        reason = (
            f"the KV cache pool holds {kv_tokens} tokens per GPU, fewer than the "
            f"{min_kv_tokens} needed; raise mem_fraction_static, use kv_cache_dtype fp8_e4m3, "
            "or use more GPUs"
        )
    context = context_fit(kv_tokens, model_config, requested_context)
    return {
        **context,
        "weights_gib_per_gpu": round(weights / GIB, 2),
        "draft_weights_gib_per_gpu": round(draft_weights / GIB, 2),
        "checkpoint_gib": round(checkpoint_bytes(target) / GIB, 2),
        "kv_bytes_per_token": kv_per_token,
        "draft_kv_bytes_per_token": draft_kv,
        "kv_pool_gib": round(max(kv_pool, 0) / GIB, 2),
        "kv_tokens": kv_tokens,
        "static_budget_gib": round(static_budget / GIB, 2),
        "fits": reason is None,
        "reason": reason,
        "attention": "hybrid" if hybrid else "pure_attention",
        "verify_tokens": verify,
        "max_running_requests": requests,
        "recurrent_state_bytes_per_request": per_request,
        "recurrent_state_bytes_per_verify_token": per_request if speculative else 0,
        "verify_state_bytes_per_request": per_request * verify if speculative else 0,
        "recurrent_state_slots": max(slots, 0),
        "recurrent_state_gib": round(state_bytes / GIB, 2),
        "verify_state_gib": round(verify_bytes / GIB, 2),
        "mamba_ssm_dtype": ssm_dtype(model_config, mamba_ssm_dtype) if per_request else None,
    }


def _max_running_requests(
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


def check_context_length(value) -> int | None:
    """None for `auto`, else the user's --context-length as an int (1 to MAX_KV_TOKENS)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not _is_int(value) or not 1 <= value <= MAX_KV_TOKENS:
        raise CapacityError(
            f"context_length is {value!r}; needed: auto or a whole number of tokens from 1 to "
            f"{MAX_KV_TOKENS}. Fix: kimi_context_length."
        )
    return value


def context_fit(kv_tokens: int, model_config: dict, requested: int | None) -> dict:
    """The launch's context length and whether one request at that length fits the KV pool.

    max_context_length is the longest one request can use: the pool, capped at the model's
    max_position_embeddings (when the config has one). `auto` (requested None) takes it; a
    user value is kept as is, with a warning when one request at that length overflows the
    pool (SGLang then cuts requests at the pool) or passes max_position_embeddings (SGLang
    refuses to start without SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN)."""
    positions = text_config(model_config).get("max_position_embeddings")
    longest = min(kv_tokens, positions) if _is_int(positions) else kv_tokens
    warning = None
    if requested is not None and _is_int(positions) and requested > positions:
        warning = (
            f"context_length {requested} is above the model's max_position_embeddings "
            f"{positions}: SGLang refuses to start unless "
            "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1, and outputs past it are unreliable. "
            f"Fix: kimi_context_length at most {positions}, or auto"
        )
    elif requested is not None and requested > kv_tokens:
        warning = (
            f"one request at context_length {requested} does not fit the KV pool of "
            f"{kv_tokens} tokens: SGLang cuts longer requests at the pool. Fix: "
            f"kimi_context_length {longest} or less (auto takes it), a higher "
            "mem_fraction_static, kv_cache_dtype fp8_e4m3, or a config without a drafter"
        )
    return {
        "context_length": longest if requested is None else requested,
        "context_length_source": "auto" if requested is None else "user",
        "max_context_length": longest,
        "context_length_fits": warning is None,
        "context_length_warning": warning,
    }
