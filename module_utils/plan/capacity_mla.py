"""Capacity of an MLA (DeepSeek-V3 style, Kimi K2.x) target, as SGLang lays it out under
tensor parallelism:

- MLA attention: q_a_proj and kv_a_proj_with_mqa are replicated on every rank; q_b_proj,
  kv_b_proj and o_proj are split across ranks. The latent KV cache (kv_lora_rank +
  qk_rope_head_dim per layer and token) is NOT split: every rank holds all of it.
- MLPs, routed and shared experts, the embedding and the LM head are split across ranks;
  the router, the norms and the vision tower are replicated.
- Routed experts in compressed-tensors pack-quantized INT4 take num_bits/8 bytes per weight
  plus one BF16 scale per group; everything the quantization config ignores is BF16.
"""

from __future__ import annotations

import math

from ansible.module_utils.plan.capacity_common import (
    BF16,
    MAX_EXPERTS,
    MAX_HEADS,
    MAX_KV_TOKENS,
    MAX_LAYERS,
    MAX_VOCAB,
    MAX_WIDTH,
    MISSING,
    Fields,
    check_quantization,
    is_int,
    kv_dtype_bytes,
    routed_expert_bytes_per_weight,
    text_config,
)


def check_mla(cfg: Fields) -> None:
    heads = cfg.integer("num_attention_heads", MAX_HEADS)
    for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank"):
        cfg.integer(name, MAX_WIDTH)
    cfg.integer("q_lora_rank", MAX_WIDTH, nullable=True, default=None)
    kv_heads = cfg.config.get("num_key_value_heads")
    if kv_heads is not None:
        cfg.integer("num_key_value_heads", heads)


def check_mla_target(top: Fields, cfg: Fields) -> None:
    """Every field of a DeepSeek-V3-style target config that the plan reads (`cfg` is the
    text config, `top` the whole one, which holds the vision tower's)."""
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
    check_mla(cfg)
    cfg.flag("tie_word_embeddings")
    cfg.integer("max_position_embeddings", MAX_KV_TOKENS, default=None, nullable=True)
    quant = cfg.part("quantization_config")
    if quant:
        check_quantization(quant)
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
            and all(is_int(k) and 1 <= k <= 64 for k in kernel)
        ):
            needed = "a list of 1 to 3 integers from 1 to 64"
            raise vision.error("merge_kernel_size", kernel, needed)


def mla_attention(cfg: dict) -> tuple[int, int]:
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


def mla_parameters(config: dict) -> dict[str, dict]:
    """Parameter groups of a DeepSeek-V3-style target: count, bytes per weight, split or not."""
    cfg = text_config(config)
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    vocab = cfg["vocab_size"]
    dense_layers = min(cfg.get("first_k_dense_replace", 0), layers)
    moe_layers = layers - dense_layers if cfg.get("n_routed_experts") else 0
    dense_layers = layers - moe_layers
    attn_replicated, attn_split = mla_attention(cfg)
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


def vision_parameters(vision: dict, text_hidden: int) -> int:
    """A ViT encoder plus the patch-merging projector into the text model."""
    width, depth = vision["hidden_size"], vision["num_hidden_layers"]
    mlp = vision["intermediate_size"]
    patch = vision.get("patch_size", 14)
    merge = math.prod(vision.get("merge_kernel_size", [2, 2]))
    block = 4 * width * width + 4 * width + 2 * width * mlp + width + mlp + 4 * width
    projector = (width * merge) ** 2 + width * merge * text_hidden
    return depth * block + 3 * patch * patch * width + projector


def mla_kv_bytes_per_token(config: dict, kv_cache_dtype: str) -> int:
    """(kv_lora_rank + qk_rope_head_dim) x layers x bytes, the same on every rank."""
    cfg = text_config(config)
    per_layer = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    return per_layer * cfg["num_hidden_layers"] * kv_dtype_bytes(kv_cache_dtype)
