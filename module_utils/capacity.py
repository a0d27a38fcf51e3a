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
MISSING = object()


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
    check_target(config)
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
    # The fc that fuses several target layers' hidden states into the drafter's input.
    groups["fc"] = {
        "params": config.get("num_target_layers", 0) * hidden * hidden,
        "bytes": BF16,
        "split": False,
    }
    if not config.get("tie_word_embeddings"):
        groups["lm_head"] = {
            "params": (config.get("draft_vocab_size") or config["vocab_size"]) * hidden,
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
    if not draft_model_config:
        return
    draft = draft_model_config
    why = "the drafter's layers are split over the same TP ranks as the target's"
    _divides(tp_size, draft["num_attention_heads"], "num_attention_heads", draft_source, why, fix)
    _divides(tp_size, draft["intermediate_size"], "intermediate_size", draft_source, why, fix)
    if "kv_lora_rank" not in draft:
        kv_heads = draft["num_key_value_heads"]
        if kv_heads >= tp_size:
            _divides(tp_size, kv_heads, "num_key_value_heads", draft_source, why, fix)
        elif tp_size % kv_heads:
            raise CapacityError(
                f"tp_size {tp_size} is not a multiple of {draft_source}'s num_key_value_heads "
                f"({kv_heads}): with fewer KV heads than ranks SGLang replicates each over "
                f"tp_size / num_key_value_heads ranks. Needed: a tp_size that is a multiple of "
                f"{kv_heads} or divides it. Fix: {fix}"
            )


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
) -> dict:
    """Weights per GPU, KV bytes per token and the KV pool in tokens, with a fit verdict.
    `gpu_count`: the GPUs the server can span (None when unknown); `sources` name the two
    configs in messages (their paths, when they came from files)."""
    check_numbers(gpu_memory_mib, mem_fraction_static, overhead_mib, min_kv_tokens, gpu_count)
    kv_dtype_bytes(kv_cache_dtype)
    check_target(model_config, sources[0])
    if draft_model_config is not None:
        check_draft(draft_model_config, sources[1])
    check_tp_size(tp_size, model_config, draft_model_config, sources)
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
    if gpu_count is not None and tp_size > gpu_count:
        reason = (
            f"tp_size {tp_size} needs {tp_size} GPUs but {gpu_count} GPUs are there; lower "
            "tp_size (kimi_tp_size) or use hosts with more GPUs"
        )
    elif kv_pool <= 0:
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
