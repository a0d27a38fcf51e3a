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
"""

from __future__ import annotations

import math
import re

GIB = 1 << 30
MIB = 1 << 20
BF16 = 2
KV_DTYPE_BYTES = {"auto": 2, "bf16": 2, "bfloat16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}


class CapacityError(Exception):
    pass


def text_config(config: dict) -> dict:
    """The language model's part of a multimodal config (or the config itself)."""
    return config.get("text_config", config)


def _ignored(name: str, patterns: list[str]) -> bool:
    """compressed-tensors `ignore`: module names, or `re:` regular expressions."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.fullmatch(pattern[3:], name):
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
    if _ignored(expert_weight, quant.get("ignore", [])):
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
    cfg = text_config(config)
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    vocab = cfg["vocab_size"]
    dense_layers = min(cfg.get("first_k_dense_replace", 0), layers)
    moe_layers = layers - dense_layers if cfg.get("n_routed_experts") else 0
    dense_layers = layers - moe_layers
    attn_replicated, attn_split = _mla_attention(cfg)
    experts = cfg.get("n_routed_experts") or 0
    expert_size = 3 * hidden * cfg.get("moe_intermediate_size", 0)
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


def draft_parameters(config: dict) -> dict[str, dict]:
    """Parameter groups of a drafter: DFlash (GQA layers) or EAGLE-3 with MLA layers."""
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
    # The fc that fuses several target layers' hidden states into the drafter's input.
    groups["fc"] = {
        "params": config.get("num_target_layers", 0) * hidden * hidden,
        "bytes": BF16,
        "split": False,
    }
    if not config.get("tie_word_embeddings"):
        groups["lm_head"] = {
            "params": config.get("draft_vocab_size", config["vocab_size"]) * hidden,
            "bytes": BF16,
            "split": True,
        }
    return groups


def bytes_per_gpu(groups: dict[str, dict], tp_size: int) -> float:
    return sum(g["params"] * g["bytes"] / (tp_size if g["split"] else 1) for g in groups.values())


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


def target_kv_bytes_per_token(config: dict, kv_cache_dtype: str) -> int:
    """MLA: (kv_lora_rank + qk_rope_head_dim) x layers x bytes, the same on every rank."""
    cfg = text_config(config)
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


def plan(
    model_config: dict,
    gpu_memory_mib: int,
    tp_size: int,
    mem_fraction_static: float,
    kv_cache_dtype: str = "auto",
    draft_model_config: dict | None = None,
    overhead_mib: int = 3072,
    min_kv_tokens: int = 16384,
) -> dict:
    """Weights per GPU, KV bytes per token and the KV pool in tokens, with a fit verdict."""
    if tp_size < 1:
        raise CapacityError(f"tp_size must be at least 1, got {tp_size}")
    if not 0 < mem_fraction_static < 1:
        raise CapacityError(
            f"mem_fraction_static must be between 0 and 1, got {mem_fraction_static}"
        )
    target = target_parameters(model_config)
    weights = bytes_per_gpu(target, tp_size)
    kv_per_token = target_kv_bytes_per_token(model_config, kv_cache_dtype)
    draft_weights = 0.0
    draft_kv = 0
    if draft_model_config:
        draft = draft_parameters(draft_model_config)
        draft_weights = bytes_per_gpu(draft, tp_size)
        draft_kv = draft_kv_bytes_per_token(draft_model_config, kv_cache_dtype, tp_size)
    usable = (gpu_memory_mib - overhead_mib) * MIB
    static_budget = usable * mem_fraction_static
    kv_pool = static_budget - weights - draft_weights
    kv_tokens = max(0, int(kv_pool // (kv_per_token + draft_kv)))
    reason = None
    if kv_pool <= 0:
        reason = (
            f"weights need {(weights + draft_weights) / GIB:.1f} GiB per GPU but the static "
            f"budget is {static_budget / GIB:.1f} GiB ({gpu_memory_mib} MiB less "
            f"{overhead_mib} MiB overhead, x mem_fraction_static {mem_fraction_static}); "
            "use more GPUs (tp_size), GPUs with more memory, or a higher mem_fraction_static"
        )
    elif kv_tokens < min_kv_tokens:
        reason = (
            f"the KV cache pool holds {kv_tokens} tokens per GPU, fewer than the "
            f"{min_kv_tokens} needed; raise mem_fraction_static, use kv_cache_dtype fp8_e4m3, "
            "or use more GPUs"
        )
    return {
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
    }
