"""Named DDTree budget sweeps for the simulator (SGLANG_SIM_DDTREE_TABLE).

Each table maps a budget to (step ms, accepted tokens per verify step, the bonus token
included). A verify step accepts at most min(budget, block size - 1) + 1 tokens: the K2.6
DFlash drafter's block size is 8 (at most 8 tokens a step), Qwen3.6-27B's is 16 (at most 16).
Every row stays under its model's cap (the simulator refuses one above it). These are simulated
figures, not measurements.

HEALTHY: what pure attention (MLA) should give. Accepted tokens per step rise with the budget
and saturate near the cap; step time rises slowly. Pairs (budget -> next): no collapse anywhere;
64 -> 128 is saturated (+2.9% tokens a step for +11.4% step time), and 32 is within 3% of the
best throughput (64).

HYBRID_COLLAPSE: shaped like the Qwen3.6-27B hybrid (attention + GDN) study, where budgets 15,
32, 64 ran at about 87, 80, 77 ms a step and 15, 5, 4 tokens a step (173.4, 92, 64.3 tok/s):
accepted tokens per step fall while step time falls too. On K2.6's cap of 8: 16 -> 32 and
32 -> 64 collapse (tokens a step -60% and -21%, step time -7.4% and -3.2%); 8 -> 16 is still
healthy and 64 -> 128 falls only 9.1% (under the 10% threshold).

QWEN_HYBRID: the same study on its own model, Qwen3.6-27B's budgets 15, 32 and 64 and its block
size 16, at the published step times and tokens a step (87, 80, 77 ms; 15, 5, 4 tokens): the
hybrid control as the kit serves it. 15 -> 32 collapses (-66.7% tokens a step, -8.0% step time)
and so does 32 -> 64 (-20%, -3.75%); budget 15 is the fastest (172 tok/s a request against 62.5
and 51.9). The published throughputs (173.4, 92, 64.3 tok/s) do not multiply out of these
rounded estimates past budget 15; the table keeps the estimates, whose ratios are what the
diagnosis reads.
"""

from __future__ import annotations

import itertools
import json

# A collapse: tokens a step fall by more than this while step time rises by less than STEP_RISE.
COLLAPSE_DROP = 0.10
STEP_RISE = 0.05
# Saturation: tokens a step grow by less than this while step time grows by more than STEP_RISE.
SATURATION_GAIN = 0.05

HEALTHY: dict[int, tuple[float, float]] = {
    8: (30.0, 4.6),
    16: (31.5, 5.6),
    32: (33.0, 6.4),
    64: (35.0, 6.8),
    128: (39.0, 7.0),
}

HYBRID_COLLAPSE: dict[int, tuple[float, float]] = {
    8: (33.0, 6.2),
    16: (34.0, 7.0),
    32: (31.5, 2.8),
    64: (30.5, 2.2),
    128: (30.0, 2.0),
}

QWEN_HYBRID: dict[int, tuple[float, float]] = {
    15: (87.0, 15.0),
    32: (80.0, 5.0),
    64: (77.0, 4.0),
}

TABLES = {"healthy": HEALTHY, "hybrid-collapse": HYBRID_COLLAPSE, "qwen-hybrid": QWEN_HYBRID}


def table_env(table: dict[int, tuple[float, float]], step_scale: float = 1.0) -> str:
    """The table as SGLANG_SIM_DDTREE_TABLE wants it. step_scale shrinks every step time alike
    (a test runs faster); the diagnosis reads ratios between budgets, which it keeps."""
    rows = {
        str(budget): {"step_ms": round(step * step_scale, 4), "accept": accept}
        for budget, (step, accept) in table.items()
    }
    return json.dumps(rows)


def tokens_per_s(table: dict[int, tuple[float, float]]) -> dict[int, float]:
    """Decode throughput per request a budget gives: tokens a step / step time."""
    return {budget: accept / step * 1000 for budget, (step, accept) in table.items()}


def pairs(table: dict[int, tuple[float, float]]) -> list[tuple[int, int, str]]:
    """(budget, next budget, "collapse" | "saturation" | "ok") by the issue's thresholds."""
    budgets = sorted(table)
    found = []
    for low, high in itertools.pairwise(budgets):
        (step_a, accept_a), (step_b, accept_b) = table[low], table[high]
        accept_change = accept_b / accept_a - 1
        step_change = step_b / step_a - 1
        if accept_change < -COLLAPSE_DROP and step_change < STEP_RISE:
            kind = "collapse"
        elif accept_change < SATURATION_GAIN and step_change > STEP_RISE:
            kind = "saturation"
        else:
            kind = "ok"
        found.append((low, high, kind))
    return found
