"""Tiny hybrid targets (Qwen3.5/3.6: gated attention and Gated DeltaNet layers, the MTP head,
the Qwen3-VL tower): the real config read, the tiny one scaled from it, its TP checks and its
tensors (what is kept and why: the docstring of module_utils/canary/checkpoint.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ansible.module_utils.canary.checkpoint_common import (
    TINY_HIDDEN,
    TINY_INTERMEDIATE,
    TINY_VISION_DEPTH,
    TINY_VISION_HEADS,
    Checks,
    Scaled,
    architecture,
    capture_layers,
    check_finite,
    round_to,
    spread,
)
from ansible.module_utils.canary.checkpoint_specs import (
    add_biased,
    add_layer_norm,
    add_mlp,
    add_norm,
    add_vit_blocks,
    add_weight,
)
from ansible.module_utils.plan.capacity import (
    MAX_HEADS,
    MAX_KV_TOKENS,
    MAX_LAYERS,
    MAX_VOCAB,
    MAX_WIDTH,
    Fields,
)

HYBRID_TYPES = ("linear_attention", "full_attention")
# The text model's tensors are under this prefix; the MTP head's and the tower's are not.
TEXT = "model.language_model."


@dataclass(frozen=True)
class _Real:
    """The real text model's dimensions the tiny one is built from."""

    hidden: int
    layers: int
    vocab: int
    intermediate: int
    types: list
    interval: int
    heads: int
    kv_heads: int
    head_dim: int
    gate: bool
    v_heads: int
    k_heads: int
    k_dim: int
    v_dim: int
    kernel: int
    mtp: int
    tied: bool


@dataclass(frozen=True)
class _Tiny:
    """The tiny text model's dimensions that differ from the real ones."""

    hidden: int
    layers: int
    intermediate: int
    types: list


def _read_layout(cfg: Fields, layers: int) -> tuple[list, int]:
    """(layer_types, full_attention_interval), which must describe the same layers."""
    types = cfg.strings("layer_types", HYBRID_TYPES, layers)
    interval = cfg.integer("full_attention_interval", layers)
    if [HYBRID_TYPES[(i + 1) % interval == 0] for i in range(layers)] != types:
        # SGLang places the layers by the interval (configs/qwen3_next.py,
        # layers_block_type), transformers by layer_types: both must agree.
        raise cfg.error("full_attention_interval", interval, "the period of layer_types")
    return types, interval


def _read_attention(cfg: Fields) -> tuple[int, int, int, bool]:
    """(heads, KV heads, head_dim, output gate) of the gated attention."""
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
    return heads, kv_heads, head_dim, gate


def _read_deltanet(cfg: Fields) -> tuple[int, int, int, int, int]:
    """(value heads, key heads, key head dim, value head dim, conv kernel) of the Gated
    DeltaNet."""
    v_heads = cfg.integer("linear_num_value_heads", MAX_HEADS)
    k_heads = cfg.integer("linear_num_key_heads", v_heads)
    if v_heads % k_heads:
        raise cfg.error("linear_num_key_heads", k_heads, f"a divisor of {v_heads}")
    k_dim = cfg.integer("linear_key_head_dim", MAX_WIDTH)
    v_dim = cfg.integer("linear_value_head_dim", MAX_WIDTH)
    kernel = cfg.integer("linear_conv_kernel_dim", 64, low=2)
    return v_heads, k_heads, k_dim, v_dim, kernel


def _read(top: Fields, cfg: Fields) -> _Real:
    """Every field the tiny target depends on, checked, in the order they are reported."""
    hidden = cfg.integer("hidden_size", MAX_WIDTH)
    layers = cfg.integer("num_hidden_layers", MAX_LAYERS)
    vocab = cfg.integer("vocab_size", MAX_VOCAB)
    intermediate = cfg.integer("intermediate_size", MAX_WIDTH)
    cfg.integer("max_position_embeddings", MAX_KV_TOKENS)
    types, interval = _read_layout(cfg, layers)
    heads, kv_heads, head_dim, gate = _read_attention(cfg)
    v_heads, k_heads, k_dim, v_dim, kernel = _read_deltanet(cfg)
    cfg.choice("mamba_ssm_dtype", ("float32", "bfloat16", "float16"), default=None, nullable=True)
    mtp = cfg.integer("mtp_num_hidden_layers", 64, low=0, default=0)
    text_tied = cfg.flag("tie_word_embeddings")
    tied = top.flag("tie_word_embeddings") or text_tied
    check_finite(cfg, "rms_norm_eps")
    if cfg.part("quantization_config") or top.part("quantization_config"):
        raise cfg.error("quantization_config", "present", "none: a BF16 hybrid target")
    return _Real(
        hidden=hidden,
        layers=layers,
        vocab=vocab,
        intermediate=intermediate,
        types=types,
        interval=interval,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        gate=gate,
        v_heads=v_heads,
        k_heads=k_heads,
        k_dim=k_dim,
        v_dim=v_dim,
        kernel=kernel,
        mtp=mtp,
        tied=tied,
    )


def _scale(tiny: Scaled, path: str, real: _Real) -> _Tiny:
    """The tiny text config's dimensions and layer pattern (whole periods of the real one),
    set in the tiny config and recorded as scaled."""
    text = tiny.config["text_config"]
    hidden = min(real.hidden, TINY_HIDDEN)
    layers = capture_layers(real.layers, real.interval)
    intermediate = min(real.intermediate, TINY_INTERMEDIATE)
    tiny.set(text, path, "hidden_size", hidden)
    tiny.set(text, path, "num_hidden_layers", layers)
    tiny.set(text, path, "intermediate_size", intermediate)
    types = real.types[:layers]
    if text["layer_types"] != types:
        text["layer_types"] = types
        tiny.scaled[f"{path}layer_types"] = [f"{real.layers} layers", f"{layers} layers"]
    return _Tiny(hidden, layers, intermediate, types)


def _check(checks: Checks, path: str, real: _Real, t: _Tiny) -> None:
    checks.require(
        set(t.types) == set(real.types),
        f"layer types {sorted(set(t.types))}",
        "every layer type of the real model",
    )
    checks.splits(f"{path}num_attention_heads", real.heads, "the gated attention splits heads")
    checks.kv_heads(f"{path}num_key_value_heads", real.kv_heads)
    checks.splits(f"{path}linear_num_key_heads", real.k_heads, "the Gated DeltaNet splits heads")
    checks.splits(f"{path}linear_num_value_heads", real.v_heads, "the Gated DeltaNet splits heads")
    checks.splits(f"{path}intermediate_size", t.intermediate, "the MLP splits over ranks")


def _full_attention(specs: list, name: str, real: _Real, t: _Tiny) -> None:
    """The gated attention: q_proj carries the output gate beside the queries."""
    q_out = real.heads * real.head_dim * (2 if real.gate else 1)
    add_weight(specs, f"{name}.self_attn.q_proj", [q_out, t.hidden])
    for proj in ("k_proj", "v_proj"):
        add_weight(specs, f"{name}.self_attn.{proj}", [real.kv_heads * real.head_dim, t.hidden])
    add_weight(specs, f"{name}.self_attn.o_proj", [t.hidden, real.heads * real.head_dim])
    add_norm(specs, f"{name}.self_attn.q_norm", real.head_dim, "zeros")
    add_norm(specs, f"{name}.self_attn.k_norm", real.head_dim, "zeros")


def _mlp_and_norms(specs: list, name: str, t: _Tiny) -> None:
    add_norm(specs, f"{name}.input_layernorm", t.hidden, "zeros")
    add_norm(specs, f"{name}.post_attention_layernorm", t.hidden, "zeros")
    add_mlp(specs, "", f"{name}.mlp", t.intermediate, t.hidden, None)


def _linear_attention(specs: list, name: str, real: _Real, t: _Tiny) -> None:
    """The Gated DeltaNet: its projections, causal conv, decay and gated norm."""
    la = f"{name}.linear_attn"
    key, value = real.k_heads * real.k_dim, real.v_heads * real.v_dim
    add_weight(specs, f"{la}.in_proj_qkv", [2 * key + value, t.hidden])
    add_weight(specs, f"{la}.in_proj_z", [value, t.hidden])
    add_weight(specs, f"{la}.in_proj_b", [real.v_heads, t.hidden])
    add_weight(specs, f"{la}.in_proj_a", [real.v_heads, t.hidden])
    add_weight(specs, f"{la}.conv1d", [2 * key + value, 1, real.kernel])
    specs.append((f"{la}.A_log", "F32", [real.v_heads], "a_log"))
    specs.append((f"{la}.dt_bias", "BF16", [real.v_heads], "ones"))
    # The gated norm (RMSNormGated) scales by its weight itself.
    add_norm(specs, f"{la}.norm", real.v_dim, "ones")
    add_weight(specs, f"{la}.out_proj", [t.hidden, value])


def _text_specs(real: _Real, t: _Tiny) -> list:
    specs: list = [(f"{TEXT}embed_tokens.weight", "BF16", [real.vocab, t.hidden], "weight")]
    if not real.tied:
        add_weight(specs, "lm_head", [real.vocab, t.hidden])
    # Qwen3.5's RMSNorms scale by 1 + weight (GemmaRMSNorm in models/qwen3_5.py): 0 is 1.
    add_norm(specs, f"{TEXT}norm", t.hidden, "zeros")
    for layer, kind in enumerate(t.types):
        name = f"{TEXT}layers.{layer}"
        _mlp_and_norms(specs, name, t)
        if kind == "full_attention":
            _full_attention(specs, name, real, t)
        else:
            _linear_attention(specs, name, real, t)
    if real.mtp:
        # Qwen3.5's MTP head (models/qwen3_5_mtp.py): in the checkpoint, loaded only for NEXTN.
        add_weight(specs, "mtp.fc", [t.hidden, 2 * t.hidden])
        for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            add_norm(specs, f"mtp.{norm}", t.hidden, "zeros")
        for layer in range(real.mtp):
            _mlp_and_norms(specs, f"mtp.layers.{layer}", t)
            _full_attention(specs, f"mtp.layers.{layer}", real, t)
    return specs


def hybrid_target(config: dict, source: str, tp: int) -> tuple[dict, list, dict]:
    """The tiny config, the tensor specifications and {scaled, real} of a hybrid target."""
    top = Fields(config, source)
    architecture(top, ("Qwen3_5ForConditionalGeneration",))
    cfg = top.part("text_config", nullable=False)
    path = "text_config."
    real = _read(top, cfg)
    tiny = Scaled(config)
    t = _scale(tiny, path, real)
    checks = Checks(source, tp)
    _check(checks, path, real, t)
    specs = _text_specs(real, t)
    specs += _qwen_vision(top, tiny, t.hidden, checks)
    dims = {"hidden_size": real.hidden, "num_hidden_layers": real.layers, "vocab_size": real.vocab}
    return tiny.config, specs, {"scaled": tiny.scaled, "real": dims}


def _qwen_vision(top: Fields, tiny: Scaled, t_hidden: int, checks: Checks) -> list:
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
    t_mlp = min(mlp, round_to(mlp * t_width / width, math.lcm(8, checks.tp)))
    t_depth = max(min(depth, TINY_VISION_DEPTH), len(deepstack) + 1)
    t_deepstack = spread(deepstack, 0, depth - 1, 0, t_depth - 1) if deepstack else []
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
    add_biased(specs, f"{v}.patch_embed.proj", t_width, [channels, temporal, patch, patch])
    add_weight(specs, f"{v}.pos_embed", [positions, t_width])
    names = ("norm1", "norm2", "attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2")
    add_vit_blocks(specs, f"{v}.blocks", t_depth, t_width, t_mlp, names)
    add_layer_norm(specs, f"{v}.merger.norm", t_width)
    add_biased(specs, f"{v}.merger.linear_fc1", merged, merged)
    add_biased(specs, f"{v}.merger.linear_fc2", t_hidden, merged)
    for index in range(len(t_deepstack)):
        d = f"{v}.deepstack_merger_list.{index}"
        # Deepstack mergers normalise after the spatial shuffle (use_postshuffle_norm).
        add_layer_norm(specs, f"{d}.norm", merged)
        add_biased(specs, f"{d}.linear_fc1", merged, merged)
        add_biased(specs, f"{d}.linear_fc2", t_hidden, merged)
    return specs
