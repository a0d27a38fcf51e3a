"""Service level objectives (--slo): reading them, whether a level met each, and the goodput
of the requests that met them all."""

from __future__ import annotations

from ansible.module_utils.contract.slo import (
    MAX_SLO_MS,
    SLO_FORMS,
    SLO_METRICS,
    SLO_STATS,
    SloError,
    good_requests,
    parse_slo,
)

from analysis.repeats import numeric

__all__ = [
    "MAX_SLO_MS",
    "SLO_FORMS",
    "SLO_METRICS",
    "SLO_STATS",
    "SloError",
    "goodput",
    "parse_slo",
    "slo_met",
    "slo_misses",
    "slo_text",
    "slo_value",
    "stat_of",
]


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
    meet every threshold of its kind (good_requests), over the level's duration."""
    duration = level.summary.get("duration_s")
    if not numeric(duration) or duration <= 0:
        return None
    return good_requests(level.ttft, level.tpot, level.e2e, slo) / duration


def slo_text(slo: dict) -> str:
    return ", ".join(f"{k} <= {v:g} ms" for k, v in slo.items())


def stat_of(summary: dict, name: str, stat: str):
    value = summary.get(name)
    return value.get(stat) if isinstance(value, dict) else None
