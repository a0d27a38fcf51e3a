"""What every part of the tiny-checkpoint generator (module_utils/canary/checkpoint.py) shares:
the tiny dimensions, CheckpointError, the tiny config under construction with its record of
what was scaled, the TP and kernel checks on it, the reading of the real config's architecture
and quantization, and the tiny depth and layer ids.
"""

from __future__ import annotations

import copy
import math
import re

from ansible.module_utils.plan.capacity import MAX_WIDTH, Fields

# The tiny dimensions (each the real one where that is smaller). Why each value: the docstring
# of module_utils/canary/checkpoint.py and docs/models.md.
TINY_HIDDEN = 256
TINY_INTERMEDIATE = 2048
TINY_Q_LORA_RANK = 256
# K2.6's DFlash drafter reads 6 target layers; a capture point must lie below the last layer,
# so a tiny target needs one layer more than the most target layers a drafter reads.
TINY_CAPTURE_POINTS = 6
TINY_EXPERTS = 24  # not a power of two: the top-k path of 384
TINY_EXPERTS_POWER_OF_TWO = 32
TINY_VISION_HEADS = 8
TINY_VISION_DEPTH = 1
TINY_DRAFT_LAYERS = 2

# compressed-tensors pack-quantized: the bits SGLang's Marlin WNA16 MoE serves
# (WNA16_SUPPORTED_BITS).
SUPPORTED_BITS = (4, 8)
MARLIN_GROUPS = (32, 64, 128)


class CheckpointError(Exception):
    pass


def checkpoint_error(found: str, needed: str, fix: str) -> CheckpointError:
    return CheckpointError(f"found {found}; needed: {needed}. Fix: {fix}")


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def round_to(value: float, step: int) -> int:
    return max(step, round(value / step) * step)


class Scaled:
    """The tiny config under construction and the record of every dimension changed."""

    def __init__(self, config: dict):
        self.config = copy.deepcopy(config)
        self.scaled: dict[str, list] = {}

    def set(self, part: dict, path: str, name: str, tiny) -> None:
        real = part.get(name)
        if real != tiny:
            part[name] = tiny
            self.scaled[f"{path}{name}"] = [real, tiny]


# ---------------------------------------------------------------------------------------------
# Reading the configs


def architecture(top: Fields, known: tuple[str, ...]) -> str:
    value = top.config.get("architectures")
    if not (isinstance(value, list) and len(value) == 1 and value[0] in known):
        raise top.error("architectures", value, f"one of {', '.join(map(repr, known))}")
    return value[0]


def check_finite(cfg: Fields, name: str) -> None:
    value = cfg.config.get(name)
    if value is not None and not (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ):
        raise cfg.error(name, value, "a finite number")


def quantization(cfg: Fields) -> dict | None:
    """The weight quantization the generator reproduces, or None for a BF16 model."""
    quant = cfg.part("quantization_config")
    if quant is None:
        return None
    quant.choice("quant_method", ("compressed-tensors",))
    quant.choice("format", ("pack-quantized",))
    ignore = quant.config.get("ignore", [])
    if not (isinstance(ignore, list) and len(ignore) <= 4096):
        raise quant.error("ignore", ignore, "a list of module names or re: patterns")
    for pattern in ignore:
        if not isinstance(pattern, str) or len(pattern) > 4096:
            raise quant.error("ignore", pattern, "a module name or a re: pattern (a string)")
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as exc:
                raise quant.error(
                    "ignore", pattern, f"a valid regular expression ({exc})"
                ) from None
    groups = quant.part("config_groups", nullable=False)
    if len(groups.config) != 1:
        raise groups.error("", f"{len(groups.config)} groups", "exactly one config group")
    group = groups.part(next(iter(groups.config)), nullable=False)
    if group.config.get("targets") != ["Linear"]:
        raise group.error("targets", group.config.get("targets"), '["Linear"]')
    for absent in ("input_activations", "output_activations"):
        if group.config.get(absent) is not None:
            raise group.error(absent, group.config[absent], "null (weight-only quantization)")
    weights = group.part("weights", nullable=False)
    bits = weights.integer("num_bits", 8, low=1)
    if bits not in SUPPORTED_BITS:
        raise weights.error("num_bits", bits, "4 or 8 (what SGLang's Marlin WNA16 serves)")
    weights.choice("type", ("int",))
    weights.choice("strategy", ("group",))
    size = weights.integer("group_size", MAX_WIDTH)
    if size not in MARLIN_GROUPS:
        raise weights.error("group_size", size, "32, 64 or 128 (Marlin's group sizes)")
    if weights.config.get("symmetric", True) is not True:
        raise weights.error("symmetric", weights.config.get("symmetric"), "true")
    for absent in ("actorder", "block_structure"):
        if weights.config.get(absent) is not None:
            raise weights.error(absent, weights.config[absent], "null")
    if weights.config.get("dynamic", False) is not False:
        raise weights.error("dynamic", weights.config.get("dynamic"), "false")
    return {"bits": bits, "group": size, "ignore": ignore}


class Checks:
    """TP splits and kernel constraints, each failure naming the field and why."""

    def __init__(self, source: str, tp: int):
        self.source, self.tp = source, tp

    def splits(self, field: str, count: int, why: str) -> None:
        if count % self.tp:
            raise checkpoint_error(
                f"{field} = {count} in the tiny checkpoint of {self.source}, not divisible by "
                f"tp_size {self.tp}",
                f"a multiple of {self.tp}: {why}",
                "serve at a TP size that divides it (the real model's own counts bound it)",
            )

    def kv_heads(self, field: str, count: int) -> None:
        # KV heads split while there are at least as many as ranks, else each rank keeps one
        # (models/qwen3_5.py Qwen3_5Attention, models/dflash.py DFlashAttention).
        ok = count % self.tp == 0 if count >= self.tp else self.tp % count == 0
        if not ok:
            raise checkpoint_error(
                f"{field} = {count} with tp_size {self.tp} in {self.source}",
                "KV heads that divide by the TP size, or a TP size they divide",
                "serve at another TP size",
            )

    def require(self, ok: bool, found: str, needed: str) -> None:
        if not ok:
            raise checkpoint_error(
                f"{found} in the tiny checkpoint of {self.source}",
                needed,
                "this model's dimensions cannot be made tiny on the kernels' terms; report it",
            )


# ---------------------------------------------------------------------------------------------
# Layer ids


def capture_layers(layers: int, interval: int = 1) -> int:
    """The tiny depth: room for TINY_CAPTURE_POINTS capture points below the last layer, a
    whole number of hybrid periods."""
    depth = max(TINY_CAPTURE_POINTS + 1, interval)
    depth = math.ceil(depth / interval) * interval
    return min(layers, depth)


def spread(ids: list[int], real_low: int, real_high: int, low: int, high: int) -> list[int]:
    """Ascending, distinct ids from [real_low, real_high] mapped in proportion onto [low, high]."""
    count = len(ids)
    if count > high - low + 1:
        raise checkpoint_error(
            f"{count} layer ids to map onto {high - low + 1} places",
            "at most as many ids as the tiny target has capture points",
            "report it: the tiny target's depth (TINY_CAPTURE_POINTS) is too small",
        )
    span = max(real_high - real_low, 1)
    mapped = [low + round((i - real_low) * (high - low) / span) for i in ids]
    for k in range(count):  # distinct and ascending, upwards from low
        mapped[k] = max(mapped[k], low if k == 0 else mapped[k - 1] + 1)
    for k in range(count - 1, -1, -1):  # and within range, downwards from high
        mapped[k] = min(mapped[k], high - (count - 1 - k))
    return mapped
