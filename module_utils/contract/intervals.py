"""Intervals shared by the analysis (analysis/repeats.py) and autotune's search
(module_utils/autotune/score.py): the 95% Student-t interval of a mean. Standard library only."""

from __future__ import annotations

import math

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
