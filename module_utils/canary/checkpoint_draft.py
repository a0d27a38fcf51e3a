"""Tiny drafters, shaped to the tiny target they serve with: DFlash (z-lab's block drafters)
and EAGLE-3 (the MLA drafter of Kimi K2.6). The real config read, the tiny one scaled to the
target's width and capture points, its TP checks and its tensors (what is kept and why: the
docstring of module_utils/canary/checkpoint.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ansible.module_utils.canary.checkpoint_common import (
    TINY_DRAFT_LAYERS,
    TINY_INTERMEDIATE,
    TINY_Q_LORA_RANK,
    CheckpointError,
    Checks,
    Scaled,
    architecture,
    checkpoint_error,
    is_int,
    spread,
)
from ansible.module_utils.canary.checkpoint_files import CONFIG, STAMP, STAMP_MAX_BYTES, read_json
from ansible.module_utils.canary.checkpoint_specs import add_biased, add_mlp, add_norm, add_weight
from ansible.module_utils.plan.capacity import (
    MAX_HEADS,
    MAX_KV_TOKENS,
    MAX_LAYERS,
    MAX_VOCAB,
    MAX_WIDTH,
    Fields,
)

EAGLE3_IDS = "eagle_aux_hidden_state_layer_ids"


def read_tiny_target(target_dir: str) -> dict:
    """The tiny target's config and its real dimensions, from the stamp this module wrote."""
    try:
        stamp = read_json(os.path.join(target_dir, STAMP), "stamp", STAMP_MAX_BYTES)
        config = read_json(os.path.join(target_dir, CONFIG), "tiny target's config.json")
    except CheckpointError:
        stamp = config = None
    if not (
        isinstance(stamp, dict)
        and stamp.get("kind") == "target"
        and isinstance(stamp.get("real"), dict)
        and isinstance(config, dict)
    ):
        raise checkpoint_error(
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


def _real_width(cfg: Fields, target: dict) -> int:
    hidden = cfg.integer("hidden_size", MAX_WIDTH)
    if hidden != target["real_hidden"]:
        raise cfg.error("hidden_size", hidden, f"the real target's ({target['real_hidden']})")
    return hidden


# ---------------------------------------------------------------------------------------------
# DFlash


@dataclass(frozen=True)
class _DFlash:
    """The real DFlash drafter's dimensions the tiny one is built from."""

    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    bias: bool
    types: list | None
    ids: list
    ids_in_dflash_config: bool
    real_layers: int | None


def _dflash_attention(cfg: Fields, hidden: int) -> tuple[int, int, int, bool]:
    """(heads, KV heads, head_dim, attention_bias); head_dim from the width where absent."""
    heads = cfg.integer("num_attention_heads", MAX_HEADS)
    kv_heads = cfg.integer("num_key_value_heads", heads)
    if heads % kv_heads:
        raise cfg.error("num_key_value_heads", kv_heads, f"a divisor of {heads}")
    head_dim = cfg.integer("head_dim", MAX_WIDTH, default=None, nullable=True)
    if head_dim is None:
        if hidden % heads:
            raise cfg.error("head_dim", head_dim, "a head size (hidden_size / heads is not whole)")
        head_dim = hidden // heads
    return heads, kv_heads, head_dim, cfg.flag("attention_bias")


def _dflash_layer_types(cfg: Fields, config: dict, layers: int) -> list | None:
    if "layer_types" not in config:
        return None
    types = cfg.strings("layer_types", ("full_attention", "sliding_attention"), layers)
    if "sliding_attention" in types:
        cfg.integer("sliding_window", MAX_KV_TOKENS)
    return types


def _dflash_capture(cfg: Fields, dflash: Fields | None, target: dict):
    """(the part that holds target_layer_ids, the ids, num_target_layers or None): distinct,
    ascending ids below the real target's last layer."""
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
    return holder, ids, real_layers


def _dflash_block(cfg: Fields, dflash: Fields | None, config: dict, target: dict) -> None:
    """The block size and the mask token, wherever the config keeps them."""
    for part in (cfg, dflash):
        if part is not None and "block_size" in part.config:
            part.integer("block_size", 1024)
    mask = (dflash.config if dflash else {}).get("mask_token_id", config.get("mask_token_id"))
    if mask is not None and not (is_int(mask) and 0 <= mask < target["vocab"]):
        raise cfg.error("dflash_config.mask_token_id", mask, "a token id of the vocabulary")


def _read_dflash(cfg: Fields, config: dict, target: dict) -> _DFlash:
    """Every field the tiny drafter depends on, checked, in the order they are reported."""
    architecture(cfg, ("DFlashDraftModel",))
    hidden = _real_width(cfg, target)
    layers = cfg.integer("num_hidden_layers", MAX_LAYERS)
    intermediate = cfg.integer("intermediate_size", MAX_WIDTH)
    _same_vocab(cfg, target)
    heads, kv_heads, head_dim, bias = _dflash_attention(cfg, hidden)
    types = _dflash_layer_types(cfg, config, layers)
    dflash = cfg.part("dflash_config", nullable=True)
    holder, ids, real_layers = _dflash_capture(cfg, dflash, target)
    _dflash_block(cfg, dflash, config, target)
    return _DFlash(
        layers=layers,
        intermediate=intermediate,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        bias=bias,
        types=types,
        ids=ids,
        ids_in_dflash_config=holder is dflash,
        real_layers=real_layers,
    )


def _scale_dflash(tiny: Scaled, real: _DFlash, target: dict) -> tuple[int, int, list]:
    """(tiny layers, tiny MLP width, tiny target_layer_ids), set in the tiny config."""
    t_layers = min(real.layers, TINY_DRAFT_LAYERS)
    t_inter = min(real.intermediate, TINY_INTERMEDIATE)
    tiny.set(tiny.config, "", "hidden_size", target["hidden"])
    tiny.set(tiny.config, "", "num_hidden_layers", t_layers)
    tiny.set(tiny.config, "", "intermediate_size", t_inter)
    types = real.types
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
    t_ids = spread(real.ids, 0, target["real_layers"] - 2, 0, target["layers"] - 2)
    where = tiny.config["dflash_config"] if real.ids_in_dflash_config else tiny.config
    prefix = "dflash_config." if real.ids_in_dflash_config else ""
    tiny.set(where, prefix, "target_layer_ids", t_ids)
    if real.real_layers is not None:
        tiny.set(tiny.config, "", "num_target_layers", target["layers"])
    return t_layers, t_inter, t_ids


def _dflash_specs(real: _DFlash, t_hidden: int, t_layers: int, t_inter: int, reads: int):
    """The drafter's layers, its norm, and fc over the `reads` target hidden states it reads."""
    specs: list = []
    head_dim = real.head_dim
    for layer in range(t_layers):
        name = f"layers.{layer}"
        add_norm(specs, f"{name}.input_layernorm", t_hidden)
        add_norm(specs, f"{name}.post_attention_layernorm", t_hidden)
        for proj, out in (
            ("q_proj", real.heads),
            ("k_proj", real.kv_heads),
            ("v_proj", real.kv_heads),
        ):
            if real.bias:
                add_biased(specs, f"{name}.self_attn.{proj}", out * head_dim, t_hidden)
            else:
                add_weight(specs, f"{name}.self_attn.{proj}", [out * head_dim, t_hidden])
        add_weight(specs, f"{name}.self_attn.o_proj", [t_hidden, real.heads * head_dim])
        add_norm(specs, f"{name}.self_attn.q_norm", head_dim)
        add_norm(specs, f"{name}.self_attn.k_norm", head_dim)
        add_mlp(specs, "", f"{name}.mlp", t_inter, t_hidden, None)
    add_norm(specs, "norm", t_hidden)
    add_weight(specs, "fc", [t_hidden, reads * t_hidden])
    add_norm(specs, "hidden_norm", t_hidden)
    return specs


def dflash_drafter(config: dict, source: str, tp: int, target: dict) -> tuple[dict, list, dict]:
    """The tiny config, the tensor specifications and {scaled} of a DFlash drafter."""
    cfg = Fields(config, source)
    real = _read_dflash(cfg, config, target)
    tiny = Scaled(config)
    t_layers, t_inter, t_ids = _scale_dflash(tiny, real, target)
    checks = Checks(source, tp)
    checks.splits("num_attention_heads", real.heads, "DFlashAttention splits heads")
    checks.kv_heads("num_key_value_heads", real.kv_heads)
    checks.splits("intermediate_size", t_inter, "the drafter's MLP splits over ranks")
    specs = _dflash_specs(real, target["hidden"], t_layers, t_inter, len(t_ids))
    return tiny.config, specs, {"scaled": tiny.scaled}


# ---------------------------------------------------------------------------------------------
# EAGLE-3


@dataclass(frozen=True)
class _Eagle3:
    """The real EAGLE-3 drafter's dimensions the tiny one is built from."""

    target_hidden: int | None
    intermediate: int
    vocab: int
    draft_vocab: int | None
    heads: int
    q_rank: int
    kv_rank: int
    nope: int
    rope: int
    v_dim: int
    tied: bool
    fc_norm: bool
    points: list | None
    ids_in_eagle_config: bool


def _eagle3_points(cfg: Fields, target: dict) -> tuple[bool, list | None]:
    """(whether eagle_config holds the aux layer ids, the capture points they name or None)."""
    eagle = cfg.part("eagle_config", nullable=True)
    holder = eagle if eagle is not None and EAGLE3_IDS in eagle.config else cfg
    ids = None
    if EAGLE3_IDS in holder.config:
        ids = holder.integers(EAGLE3_IDS, MAX_LAYERS - 1, 64)
        if ids != sorted(set(ids)):
            raise holder.error(EAGLE3_IDS, ids, "distinct ids, ascending")
    # set_eagle3_layers_to_capture (models/deepseek_v2.py): ids starting at 1 are layer
    # outputs (captured before id + 1), others are capture points themselves.
    points = [i + 1 for i in ids] if ids and ids[0] == 1 else ids
    if points is not None and not 1 <= points[0] <= points[-1] <= target["real_layers"] - 1:
        raise holder.error(
            EAGLE3_IDS,
            ids,
            f"capture points within 1..{target['real_layers'] - 1}",
        )
    return holder is eagle, points


def _read_eagle3(cfg: Fields, target: dict) -> _Eagle3:
    """Every field the tiny drafter depends on, checked, in the order they are reported."""
    architecture(cfg, ("Eagle3DeepseekV2ForCausalLM",))
    _real_width(cfg, target)
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
    in_eagle_config, points = _eagle3_points(cfg, target)
    return _Eagle3(
        target_hidden=target_hidden,
        intermediate=intermediate,
        vocab=vocab,
        draft_vocab=draft_vocab,
        heads=heads,
        q_rank=q_rank,
        kv_rank=kv_rank,
        nope=nope,
        rope=rope,
        v_dim=v_dim,
        tied=tied,
        fc_norm=fc_norm,
        points=points,
        ids_in_eagle_config=in_eagle_config,
    )


def _scale_eagle3(tiny: Scaled, real: _Eagle3, target: dict) -> tuple[int, int, int]:
    """(tiny MLP width, tiny q_lora_rank, hidden states fc reads), set in the tiny config."""
    t_hidden = target["hidden"]
    t_inter = min(real.intermediate, TINY_INTERMEDIATE)
    t_q_rank = min(real.q_rank, TINY_Q_LORA_RANK)
    tiny.set(tiny.config, "", "hidden_size", t_hidden)
    if real.target_hidden is not None:
        tiny.set(tiny.config, "", "target_hidden_size", t_hidden)
    tiny.set(tiny.config, "", "intermediate_size", t_inter)
    tiny.set(tiny.config, "", "q_lora_rank", t_q_rank)
    count = 3
    if real.points is not None:
        # Written as capture points from 2 up (never starting at 1, which SGLang would shift).
        t_points = spread(real.points, 1, target["real_layers"] - 1, 2, target["layers"] - 1)
        where = tiny.config["eagle_config"] if real.ids_in_eagle_config else tiny.config
        prefix = "eagle_config." if real.ids_in_eagle_config else ""
        tiny.set(where, prefix, EAGLE3_IDS, t_points)
        count = len(t_points)
    return t_inter, t_q_rank, count


def _eagle3_specs(real: _Eagle3, t_hidden: int, t_inter: int, t_q_rank: int, count: int):
    """The one MLA layer (its inputs twice the width: embedding and hidden state), fc over the
    `count` aux hidden states with their norms, the head and d2t."""
    specs: list = []
    attn = "layers.0.self_attn"
    add_weight(specs, f"{attn}.q_a_proj", [t_q_rank, 2 * t_hidden])
    add_norm(specs, f"{attn}.q_a_layernorm", t_q_rank)
    add_weight(specs, f"{attn}.q_b_proj", [real.heads * (real.nope + real.rope), t_q_rank])
    add_weight(specs, f"{attn}.kv_a_proj_with_mqa", [real.kv_rank + real.rope, 2 * t_hidden])
    add_norm(specs, f"{attn}.kv_a_layernorm", real.kv_rank)
    add_weight(specs, f"{attn}.kv_b_proj", [real.heads * (real.nope + real.v_dim), real.kv_rank])
    add_weight(specs, f"{attn}.o_proj", [t_hidden, real.heads * real.v_dim])
    add_mlp(specs, "", "layers.0.mlp", t_inter, t_hidden, None)
    for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        add_norm(specs, f"layers.0.{norm}", t_hidden)
    add_weight(specs, "fc", [t_hidden, count * t_hidden])
    if real.fc_norm:
        for index in range(count):
            add_norm(specs, f"fc_norm.{index}", t_hidden)
    add_norm(specs, "norm", t_hidden)
    if not real.tied:
        add_weight(specs, "lm_head", [real.draft_vocab or real.vocab, t_hidden])
    if real.draft_vocab is not None and real.draft_vocab < real.vocab:
        # d2t: draft id -> target id offsets (load_weights: hot_token_id = d2t + arange).
        specs.append(("d2t", "I64", [real.draft_vocab], "zeros"))
    return specs


def eagle3_drafter(config: dict, source: str, tp: int, target: dict) -> tuple[dict, list, dict]:
    """The tiny config, the tensor specifications and {scaled} of an EAGLE-3 drafter."""
    cfg = Fields(config, source)
    real = _read_eagle3(cfg, target)
    tiny = Scaled(config)
    t_inter, t_q_rank, count = _scale_eagle3(tiny, real, target)
    checks = Checks(source, tp)
    checks.splits("num_attention_heads", real.heads, "the MLA heads split over ranks")
    checks.splits("intermediate_size", t_inter, "the MLP splits over ranks")
    checks.splits("hidden_size", target["hidden"], "fc is column-parallel")
    specs = _eagle3_specs(real, target["hidden"], t_inter, t_q_rank, count)
    return tiny.config, specs, {"scaled": tiny.scaled}
