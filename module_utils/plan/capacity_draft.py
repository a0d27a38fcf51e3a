"""Capacity of a drafter: DFlash (GQA layers, projecting through the target's LM head) or
EAGLE-3 (MLA layers), split over the same TP ranks as its target."""

from __future__ import annotations

from ansible.module_utils.plan.capacity_common import (
    BF16,
    MAX_HEADS,
    MAX_KV_TOKENS,
    MAX_LAYERS,
    MAX_VOCAB,
    MAX_WIDTH,
    MISSING,
    Fields,
    kv_dtype_bytes,
)
from ansible.module_utils.plan.capacity_mla import check_mla, mla_attention

DRAFT_LAYER_TYPES = ("full_attention", "sliding_attention")


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
        check_mla(cfg)
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


def draft_parameters(config: dict) -> dict[str, dict]:
    """Parameter groups of a drafter: DFlash (GQA layers) or EAGLE-3 with MLA layers."""
    check_draft(config)
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    groups: dict[str, dict] = {}
    if "kv_lora_rank" in config:
        replicated, split = mla_attention(config)
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


def draft_block_size(draft_model_config: dict | None) -> int | None:
    if not draft_model_config:
        return None
    block = draft_model_config.get("block_size")
    return (
        block
        if block is not None
        else (draft_model_config.get("dflash_config") or {}).get("block_size")
    )
