"""Repeats of a level merged into one row: the mean of every numeric column, the 95% Student-t
interval of the mean of the metrics that get one, and the Welch interval compare puts on a
difference of two runs' means."""

from __future__ import annotations

import math

from ansible.module_utils.contract import intervals, metrics

# Metrics whose mean over repeats gets a 95% interval in summary.csv.
CI_METRICS = metrics.interval_metrics()

# The t quantiles and the interval of a mean live with autotune's, in one place.
T_975, t_quantile, mean_interval = intervals.T_975, intervals.t_quantile, intervals.mean_interval


def welch_interval(a: list[float], b: list[float]) -> tuple[float, float] | None:
    """The 95% Welch interval of mean(b) - mean(a); None unless both have 2 or more values."""
    a = [v for v in a if v is not None]
    b = [v for v in b if v is not None]
    if len(a) < 2 or len(b) < 2:
        return None
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    var_a = sum((v - mean_a) ** 2 for v in a) / (len(a) - 1) / len(a)
    var_b = sum((v - mean_b) ** 2 for v in b) / (len(b) - 1) / len(b)
    spread = var_a + var_b
    diff = mean_b - mean_a
    if spread == 0:
        return diff, diff
    df = spread**2 / (var_a**2 / (len(a) - 1) + var_b**2 / (len(b) - 1))
    half = t_quantile(df) * math.sqrt(spread)
    return diff - half, diff + half


# Metrics whose per-repeat values a row keeps (repeat_values), for compare's intervals.
REPEAT_METRICS = metrics.repeat_metrics()
# Columns that name a level rather than measure it: the same in every repeat, never averaged.
_IDENTITY = metrics.fixed()


def merge_repeats(table: list[dict]) -> list[dict]:
    """One row per level from its repeats (same host, prompt set, config, concurrency and
    request rate): the mean of every numeric column, a flag (saturated, crashed, under-filled)
    set when any repeat had it, the 95% intervals of CI_METRICS, `repeats` the count, and
    `repeat_values` each metric's values for compare's intervals."""
    groups: dict[tuple, list[dict]] = {}
    for row in table:
        key = (row["host"], row["prompt_set"], row["config"], row["concurrency"])
        groups.setdefault((*key, row["request_rate"]), []).append(row)
    out = []
    for group in groups.values():
        first = dict(group[0])
        first["repeats"] = len(group)
        first["repeat_values"] = (
            {name: [r[name] for r in group] for name in REPEAT_METRICS} if len(group) > 1 else {}
        )
        if len(group) > 1:
            for name, value in group[0].items():
                values = [r[name] for r in group]
                if name in _IDENTITY or name in ("files", "file"):
                    continue
                if isinstance(value, bool):
                    first[name] = any(values)
                elif any(numeric(v) for v in values):
                    numbers = [v for v in values if numeric(v)]
                    first[name] = sum(numbers) / len(numbers)
                elif name == "slo_values":
                    first[name] = {k: _mean_of([r[name].get(k) for r in group]) for k in value}
            first["files"] = [r["file"] for r in group]
            for metric in CI_METRICS:
                interval = mean_interval([r[metric] for r in group])
                if interval is not None:
                    first[f"{metric}_ci95_low"], first[f"{metric}_ci95_high"] = interval
        out.append(first)
    return out


def numeric(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _mean_of(values) -> float | None:
    numbers = [v for v in values if numeric(v)]
    return sum(numbers) / len(numbers) if numbers else None
