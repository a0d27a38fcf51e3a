"""Tiny MLA targets (Kimi K2.6 with its MoonViT tower, DeepSeek-V3 text): the real config read,
the tiny one scaled from it, its TP and kernel checks and its tensors (what is kept and why:
the docstring of module_utils/canary/checkpoint.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ansible.module_utils.canary.checkpoint_common import (
    TINY_EXPERTS,
    TINY_HIDDEN,
    TINY_INTERMEDIATE,
    TINY_Q_LORA_RANK,
    TINY_VISION_DEPTH,
    TINY_VISION_HEADS,
    Checks,
    Scaled,
    architecture,
    capture_layers,
    check_finite,
    is_int,
    quantization,
    round_to,
)
from ansible.module_utils.canary.checkpoint_specs import (
    add_biased,
    add_layer_norm,
    add_linear,
    add_mlp,
    add_norm,
    add_vit_blocks,
    add_weight,
)
from ansible.module_utils.plan.capacity import (
    MAX_EXPERTS,
    MAX_HEADS,
    MAX_KV_TOKENS,
    MAX_LAYERS,
    MAX_VOCAB,
    MAX_WIDTH,
    Fields,
    ignored,
)

ARCHITECTURES = ("KimiK25ForConditionalGeneration", "DeepseekV3ForCausalLM")


def _power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


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


@dataclass(frozen=True)
class _Real:
    """The real text model's dimensions the tiny one is built from."""

    hidden: int
    layers: int
    vocab: int
    intermediate: int
    dense: int
    experts: int
    per_token: int
    moe_width: int
    shared: int
    groups: int
    heads: int
    q_rank: int | None
    kv_rank: int
    nope: int
    rope: int
    v_dim: int
    tied: bool
    topk_method: str
    quant: dict | None


@dataclass(frozen=True)
class _Tiny:
    """The tiny text model's dimensions that differ from the real ones."""

    hidden: int
    layers: int
    experts: int
    q_rank: int | None
    intermediate: int


def _read(top: Fields, cfg: Fields, nested: bool) -> _Real:
    """Every field the tiny target depends on, checked, in the order they are reported."""
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
    check_finite(cfg, "routed_scaling_factor")
    check_finite(cfg, "rms_norm_eps")
    quant = quantization(cfg)
    if nested and top.part("quantization_config") is not None:
        quantization(top)
    return _Real(
        hidden=hidden,
        layers=layers,
        vocab=vocab,
        intermediate=intermediate,
        dense=dense,
        experts=experts,
        per_token=per_token,
        moe_width=moe_width,
        shared=shared,
        groups=groups,
        heads=heads,
        q_rank=q_rank,
        kv_rank=kv_rank,
        nope=nope,
        rope=rope,
        v_dim=v_dim,
        tied=tied,
        topk_method=topk_method,
        quant=quant,
    )


def _scale(tiny: Scaled, text: dict, path: str, real: _Real, cfg: Fields) -> _Tiny:
    """The tiny text config's dimensions, set in the tiny config and recorded as scaled."""
    hidden = min(real.hidden, TINY_HIDDEN)
    layers = capture_layers(real.layers)
    if real.dense >= layers:
        raise cfg.error(
            "first_k_dense_replace", real.dense, f"fewer than the tiny depth ({layers}) layers"
        )
    experts = _tiny_experts(real.experts, real.per_token, real.groups)
    tiny.set(text, path, "hidden_size", hidden)
    tiny.set(text, path, "num_hidden_layers", layers)
    tiny.set(text, path, "intermediate_size", min(real.intermediate, TINY_INTERMEDIATE))
    tiny.set(text, path, "n_routed_experts", experts)
    if real.q_rank is not None:
        tiny.set(text, path, "q_lora_rank", min(real.q_rank, TINY_Q_LORA_RANK))
    return _Tiny(hidden, layers, experts, text.get("q_lora_rank"), text["intermediate_size"])


def _check(checks: Checks, path: str, real: _Real, t: _Tiny) -> None:
    """The TP splits, the fused QKV-A GEMM's and Marlin MoE's shapes (module docstring)."""
    checks.splits(f"{path}num_attention_heads", real.heads, "the MLA heads split over ranks")
    checks.splits(f"{path}intermediate_size", t.intermediate, "the dense MLP splits over ranks")
    checks.splits(f"{path}moe_intermediate_size", real.moe_width, "the experts split over ranks")
    if real.shared:
        checks.splits(
            f"{path}moe_intermediate_size x n_shared_experts",
            real.moe_width * real.shared,
            "the shared experts split over ranks",
        )
    if t.q_rank is not None:
        checks.require(
            (t.q_rank + real.kv_rank + real.rope) % 16 == 0 and t.hidden % 256 == 0,
            f"fused QKV-A GEMM [{t.q_rank + real.kv_rank + real.rope}, {t.hidden}]",
            "an output multiple of 16 and an input multiple of 256 (fused_a_gemm_weight_eligible)",
        )
    quant = real.quant
    if quant is not None:
        expert = "model.layers.1.mlp.experts.0.gate_proj"
        if not ignored(expert, quant["ignore"]):
            # check_moe_marlin_supports_layer (layers/quantization/marlin_utils.py).
            per_rank = real.moe_width // checks.tp
            checks.require(
                t.hidden % 128 == 0 and per_rank % max(64, quant["group"]) == 0,
                f"Marlin MoE: hidden {t.hidden}, per-rank expert width {per_rank}",
                "hidden % 128 == 0 and per-rank width % max(64, group_size) == 0",
            )


def _attention(specs: list, prefix: str, attn: str, real: _Real, t: _Tiny) -> None:
    """One layer's MLA projections and norms, with the low-rank query where q_lora_rank is set."""
    quant = real.quant
    q_out = real.heads * (real.nope + real.rope)
    if t.q_rank is not None:
        add_linear(specs, prefix, f"{attn}.q_a_proj", t.q_rank, t.hidden, quant)
        add_norm(specs, f"{prefix}{attn}.q_a_layernorm", t.q_rank)
        add_linear(specs, prefix, f"{attn}.q_b_proj", q_out, t.q_rank, quant)
    else:
        add_linear(specs, prefix, f"{attn}.q_proj", q_out, t.hidden, quant)
    kv_a = real.kv_rank + real.rope
    add_linear(specs, prefix, f"{attn}.kv_a_proj_with_mqa", kv_a, t.hidden, quant)
    add_norm(specs, f"{prefix}{attn}.kv_a_layernorm", real.kv_rank)
    kv_b = real.heads * (real.nope + real.v_dim)
    add_linear(specs, prefix, f"{attn}.kv_b_proj", kv_b, real.kv_rank, quant)
    add_linear(specs, prefix, f"{attn}.o_proj", t.hidden, real.heads * real.v_dim, quant)


def _moe(specs: list, prefix: str, mlp: str, real: _Real, t: _Tiny) -> None:
    """One MoE layer: the router (with its correction bias under noaux_tc), the routed experts
    and the shared ones."""
    add_weight(specs, f"{prefix}{mlp}.gate", [t.experts, t.hidden])
    if real.topk_method == "noaux_tc":
        bias = f"{prefix}{mlp}.gate.e_score_correction_bias"
        specs.append((bias, "F32", [t.experts], "zeros"))
    for expert in range(t.experts):
        add_mlp(specs, prefix, f"{mlp}.experts.{expert}", real.moe_width, t.hidden, real.quant)
    if real.shared:
        width = real.moe_width * real.shared
        add_mlp(specs, prefix, f"{mlp}.shared_experts", width, t.hidden, real.quant)


def _text_specs(prefix: str, real: _Real, t: _Tiny) -> list:
    """The text model's tensors: embeddings, head, and each layer's attention and MLP (dense
    for the first first_k_dense_replace layers, MoE after)."""
    specs: list = []
    add_weight(specs, f"{prefix}model.embed_tokens", [real.vocab, t.hidden])
    if not real.tied:
        add_linear(specs, prefix, "lm_head", real.vocab, t.hidden, real.quant)
    add_norm(specs, f"{prefix}model.norm", t.hidden)
    for layer in range(t.layers):
        base = f"model.layers.{layer}"
        add_norm(specs, f"{prefix}{base}.input_layernorm", t.hidden)
        add_norm(specs, f"{prefix}{base}.post_attention_layernorm", t.hidden)
        _attention(specs, prefix, f"{base}.self_attn", real, t)
        if layer < real.dense:
            add_mlp(specs, prefix, f"{base}.mlp", t.intermediate, t.hidden, real.quant)
        else:
            _moe(specs, prefix, f"{base}.mlp", real, t)
    return specs


def mla_target(config: dict, source: str, tp: int) -> tuple[dict, list, dict]:
    """The tiny config, the tensor specifications and {scaled, real} of an MLA target."""
    top = Fields(config, source)
    nested = architecture(top, ARCHITECTURES) == "KimiK25ForConditionalGeneration"
    cfg = top.part("text_config", nullable=False) if nested else top
    path = "text_config." if nested else ""
    real = _read(top, cfg, nested)
    tiny = Scaled(config)
    text = tiny.config["text_config"] if nested else tiny.config
    t = _scale(tiny, text, path, real, cfg)
    checks = Checks(source, tp)
    _check(checks, path, real, t)
    specs = _text_specs("language_model." if nested else "", real, t)
    if nested:
        specs += _moonvit(top, tiny, t.hidden, checks)
    dims = {"hidden_size": real.hidden, "num_hidden_layers": real.layers, "vocab_size": real.vocab}
    return tiny.config, specs, {"scaled": tiny.scaled, "real": dims}


def _moonvit_sizes(vision: Fields) -> tuple[int, int, int, int]:
    """(width, heads, depth, mlp) of the tower, each from its vt_ name where the config has it."""

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
    return width, heads, depth, mlp


def _moonvit(top: Fields, tiny: Scaled, t_hidden: int, checks: Checks) -> list:
    """K2.5/K2.6's MoonViT tower and patch-merger projector (models/kimi_k25.py). The real
    config names the tower's sizes vt_*; SGLang 0.5.23's KimiK25VisionConfig
    (configs/kimi_k25.py) builds MoonViT from hidden_size, num_attention_heads,
    num_hidden_layers and intermediate_size, whose defaults (1152, 16, 27, 4304) are the real
    tower's, while its projector reads vt_hidden_size: the tiny config states both."""
    vision = top.part("vision_config", nullable=False)
    out = tiny.config["vision_config"]
    width, heads, depth, mlp = _moonvit_sizes(vision)
    head_dim = width // heads
    patch = vision.integer("patch_size", 1024, default=14)
    pos_h = vision.integer("init_pos_emb_height", 4096, default=64)
    pos_w = vision.integer("init_pos_emb_width", 4096, default=64)
    vision.integer("init_pos_emb_time", 4096, default=4)
    kernel = vision.config.get("merge_kernel_size", [2, 2])
    if not (
        isinstance(kernel, list)
        and len(kernel) == 2
        and all(is_int(k) and 1 <= k <= 16 for k in kernel)
    ):
        raise vision.error("merge_kernel_size", kernel, "a list of 2 integers from 1 to 16")
    t_heads = min(heads, checks.tp * math.ceil(TINY_VISION_HEADS / checks.tp))
    t_width = t_heads * head_dim
    t_mlp = min(mlp, round_to(mlp * t_width / width, math.lcm(8, checks.tp)))
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
    add_biased(specs, "vision_tower.patch_embed.proj", t_width, [3, patch, patch])
    add_weight(specs, "vision_tower.patch_embed.pos_emb", [pos_h, pos_w, t_width])
    names = ("norm0", "norm1", "wqkv", "wo", "mlp.fc0", "mlp.fc1")
    add_vit_blocks(specs, "vision_tower.encoder.blocks", t_depth, t_width, t_mlp, names)
    add_layer_norm(specs, "vision_tower.encoder.final_layernorm", t_width)
    add_layer_norm(specs, "mm_projector.pre_norm", t_width)
    add_biased(specs, "mm_projector.proj.0", merged, merged)
    add_biased(specs, "mm_projector.proj.2", t_hidden, merged)
    return specs
