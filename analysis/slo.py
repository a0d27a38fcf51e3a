"""Service level objectives (--slo): reading them, whether a level met each, and the goodput
of the requests that met them all."""

from __future__ import annotations

import math
import re

from ansible.module_utils.contract import metrics

from analysis.repeats import numeric

# The level's distributions (ttft_ms, ...) and the percentiles each records.
SLO_METRICS = tuple(name.removesuffix("_ms") for name in metrics.distributions())
SLO_STATS = metrics.PERCENTILES
SLO_FORMS = (
    "KEY=VALUE pairs separated by commas, KEY <metric>_ms_<stat> with metric one of "
    f"{', '.join(SLO_METRICS)} and stat one of {', '.join(SLO_STATS)}, VALUE a positive "
    "number of milliseconds (e.g. ttft_ms_p99=2000,tpot_ms_p99=33)"
)
_SLO_KEY = re.compile(r"^([a-z0-9]+)_ms_([a-z0-9]+)$")
_SLO_VALUE = re.compile(r"^\d+(?:\.\d+)?$")
MAX_SLO_MS = 1e9


class SloError(ValueError):
    """A --slo that cannot be read; the message names what was wrong and the allowed forms."""


def parse_slo(text: str) -> dict[str, float]:
    """{key: threshold in ms} from 'ttft_ms_p99=2000,tpot_ms_p99=33'; SloError otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise SloError(f"--slo is empty; expected {SLO_FORMS}")
    found: dict[str, float] = {}
    for part in text.split(","):
        item = part.strip()
        if not item:
            raise SloError(f"--slo {text!r} has an empty entry; expected {SLO_FORMS}")
        if "=" not in item:
            raise SloError(f"--slo entry {item[:60]!r} has no '=VALUE'; expected {SLO_FORMS}")
        key, _, raw = (p.strip() for p in item.partition("="))
        match = _SLO_KEY.match(key)
        if not match:
            raise SloError(
                f"--slo key {key[:60]!r} is not <metric>_ms_<stat>; expected {SLO_FORMS}"
            )
        metric, stat = match.groups()
        if metric not in SLO_METRICS:
            raise SloError(
                f"--slo key {key!r}: unknown metric {metric!r} (allowed: "
                f"{', '.join(SLO_METRICS)}); expected {SLO_FORMS}"
            )
        if stat not in SLO_STATS:
            raise SloError(
                f"--slo key {key!r}: statistic {stat!r} is not recorded (allowed: "
                f"{', '.join(SLO_STATS)}); expected {SLO_FORMS}"
            )
        if key in found:
            raise SloError(f"--slo key {key!r} is given twice; give each key once")
        if not _SLO_VALUE.match(raw) or not 0 < float(raw) <= MAX_SLO_MS:
            raise SloError(
                f"--slo {key}={raw[:40]!r}: the threshold must be a positive number of "
                f"milliseconds (at most {MAX_SLO_MS:g}); expected {SLO_FORMS}"
            )
        found[key] = float(raw)
    return found


def slo_value(summary: dict, key: str) -> float | None:
    """The level's percentile an SLO key names: tpot_ms_p99 -> summary.tpot_ms.p99."""
    metric, _, stat = key.partition("_ms_")
    value = stat_of(summary, f"{metric}_ms", stat)
    return value if numeric(value) else None


def slo_met(values: dict, slo: dict) -> bool:
    """Every SLO's level percentile at or under its threshold (a missing one is not met)."""
    return all(values.get(k) is not None and values[k] <= limit for k, limit in slo.items())


def slo_misses(row: dict, slo: dict) -> list[dict]:
    """{key, value, threshold} per SLO the row's level missed."""
    values = row.get("slo_values") or {}
    return [
        {"key": k, "value": values.get(k), "threshold": limit}
        for k, limit in slo.items()
        if values.get(k) is None or values[k] > limit
    ]


def goodput(level, slo: dict) -> float | None:
    """Requests/s whose own TTFT, mean TPOT (= mean ITL, for tpot and itl thresholds) and E2E
    meet every threshold of its kind, over the level's duration. A request without a TPOT (one
    token) meets the TPOT thresholds; one without a TTFT or E2E meets none."""
    duration = level.summary.get("duration_s")
    if not numeric(duration) or duration <= 0:
        return None
    limits = {}
    for key, value in slo.items():
        metric = key.split("_ms_")[0]
        metric = "tpot" if metric == "itl" else metric
        limits[metric] = min(value, limits.get(metric, math.inf))
    ttft_limit = limits.get("ttft", math.inf)
    tpot_limit = limits.get("tpot", math.inf)
    e2e_limit = limits.get("e2e", math.inf)
    good = 0
    for ttft, tpot, e2e in zip(level.ttft, level.tpot, level.e2e, strict=True):
        # NaN compares false: no TTFT or E2E fails, no TPOT passes.
        if (
            (ttft <= ttft_limit or ttft_limit == math.inf)
            and (e2e <= e2e_limit or e2e_limit == math.inf)
            and not tpot > tpot_limit
        ):
            good += 1
    return good / duration


def slo_text(slo: dict) -> str:
    return ", ".join(f"{k} <= {v:g} ms" for k, v in slo.items())


def stat_of(summary: dict, name: str, stat: str):
    value = summary.get(name)
    return value.get(stat) if isinstance(value, dict) else None
