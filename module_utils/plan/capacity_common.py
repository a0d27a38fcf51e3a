"""What every part of the capacity plan shares (module_utils/plan/capacity.py): the bounds on
config fields, the reader that checks them (Fields), the quantization of routed experts,
bytes per GPU, and what SGLang splits evenly over TP ranks.

Standard library only, and nothing from the other capacity modules: they all build on it.
"""

from __future__ import annotations

import re

# The largest TP size a config name may carry (contract.names); config fields are checked
# against it too.
from ansible.module_utils.contract.names import MAX_TP

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
MAX_GPU_MEMORY_MIB = 1 << 24  # 16 TiB on one GPU
MAX_GPU_COUNT = 1 << 16
MAX_KV_TOKENS = 1 << 40
MAX_REQUESTS = 1 << 20
MISSING = object()


class CapacityError(Exception):
    pass


def is_int(value) -> bool:
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
        if not is_int(value) or not low <= value <= high:
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
            and all(is_int(v) and 0 <= v <= high for v in value)
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


def text_config(config: dict) -> dict:
    """The language model's part of a multimodal config (or the config itself)."""
    return config.get("text_config") or config


def check_quantization(quant: Fields) -> None:
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


def divides(tp_size: int, count: int, field: str, source: str, why: str, hint: str) -> None:
    if count % tp_size:
        fitting = [n for n in range(1, min(count, MAX_TP) + 1) if count % n == 0][-6:]
        raise CapacityError(
            f"tp_size {tp_size} does not divide {source}'s {field} ({count}): {why}. Needed: a "
            f"tp_size that divides {count} (e.g. {', '.join(map(str, fitting))}). Fix: {hint}"
        )


def kv_heads_split(tp_size: int, kv_heads: int, source: str, why: str, fix: str) -> None:
    """GQA KV heads over TP ranks as SGLang lays them out: divided evenly, or, with fewer heads
    than ranks, each replicated over tp_size / kv_heads ranks."""
    if kv_heads >= tp_size:
        divides(tp_size, kv_heads, "num_key_value_heads", source, why, fix)
    elif tp_size % kv_heads:
        raise CapacityError(
            f"tp_size {tp_size} is not a multiple of {source}'s num_key_value_heads "
            f"({kv_heads}): with fewer KV heads than ranks SGLang replicates each over "
            f"tp_size / num_key_value_heads ranks. Needed: a tp_size that is a multiple of "
            f"{kv_heads} or divides it. Fix: {fix}"
        )
