"""Repeats of a level merged into one row: the mean of every numeric column, the 95% Student-t
interval of the mean of the metrics that get one, and the Welch interval compare puts on a
difference of two runs' means."""

from __future__ import annotations

import math

from ansible.module_utils.contract import metrics

# Metrics whose mean over repeats gets a 95% interval in summary.csv.
CI_METRICS = metrics.interval_metrics()

# Two-sided 95% quantiles of Student's t by degrees of freedom; between listed ones the next
# smaller (a slightly wider, conservative interval), past the last the normal's.
T_975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    21: 2.080,
    22: 2.074,
    23: 2.069,
    24: 2.064,
    25: 2.060,
    26: 2.056,
    27: 2.052,
    28: 2.048,
    29: 2.045,
    30: 2.042,
    40: 2.021,
    60: 2.000,
    120: 1.980,
}


def t_quantile(df: float) -> float:
    """t(0.975, df) from T_975 (df rounded down: the wider interval)."""
    if not df >= 1:
        return T_975[1]
    if df > 120:
        return 1.960
    return T_975[max(k for k in T_975 if k <= df)]


def mean_interval(values: list[float]) -> tuple[float, float] | None:
    """The 95% Student-t interval of the mean of values; None with fewer than 2."""
    values = [v for v in values if v is not None]
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    half = t_quantile(n - 1) * math.sqrt(variance / n)
    return mean - half, mean + half


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
