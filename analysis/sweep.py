"""What a DDTree budget sweep says: each budget against the next larger one, per host, prompt
set and concurrency level.

tokens/s per request = accepted tokens per step / step time, so a larger budget pays only while
its accepted tokens per step grow faster than its step time. Two shapes do not pay:

- collapse: accepted tokens per step fall by more than COLLAPSE_DROP while step time rises by
  less than STEP_RISE (or falls). A wider tree should never accept fewer tokens: on the Qwen3.6
  hybrid it was sibling branches sharing recurrent state; a broken tree mask looks the same.
- saturation: accepted tokens per step grow by less than SATURATION_GAIN while step time grows
  by more than STEP_RISE: the tree has reached what the drafter's depth allows, and only the
  verify work keeps growing.

At a level with a collapse, every budget that accepts more than COLLAPSE_DROP fewer tokens per
step than some smaller budget at that level for less than STEP_RISE more step time is marked
collapsed, so a budget past the collapsing pair that stays collapsed (budget 128 after a fall
from 16 to 32 to 64) is marked too. The larger budget of a saturated pair is marked saturated.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

COLLAPSE_DROP = 0.10
STEP_RISE = 0.05
SATURATION_GAIN = 0.05
# With saturation, the recommendation takes the smallest budget this close to the best.
NEAR_BEST = 0.03

COLLAPSED = "collapsed"
SATURATED = "saturated"


@dataclass(frozen=True)
class Pair:
    """One budget against the next larger one measured at the same level."""

    host: str
    prompt_set: str
    concurrency: int
    low: int
    high: int
    accepted_tokens_per_step: tuple[float, float]
    step_ms: tuple[float, float]
    output_tokens_per_s: tuple[float | None, float | None]
    kind: str  # "collapse", "saturation" or "ok"

    @property
    def accept_change(self) -> float:
        low, high = self.accepted_tokens_per_step
        return high / low - 1

    @property
    def step_change(self) -> float:
        low, high = self.step_ms
        return high / low - 1

    def describe(self) -> str:
        (a, b), (s, t) = self.accepted_tokens_per_step, self.step_ms
        rates = self.output_tokens_per_s
        speed = (
            f", {rates[0]:.1f} -> {rates[1]:.1f} tok/s"
            if rates[0] is not None and rates[1] is not None
            else ""
        )
        return (
            f"b{self.low} -> b{self.high}: accepted tokens per step {a:.2f} -> {b:.2f} "
            f"({self.accept_change:+.1%}), step {s:.1f} -> {t:.1f} ms ({self.step_change:+.1%})"
            f"{speed}"
        )

    def figures(self) -> dict:
        return {
            "budgets": [self.low, self.high],
            "accepted_tokens_per_step": list(self.accepted_tokens_per_step),
            "step_ms": list(self.step_ms),
            "output_tokens_per_s": list(self.output_tokens_per_s),
            "accepted_tokens_per_step_change": round(self.accept_change, 6),
            "step_ms_change": round(self.step_change, 6),
        }


def classify(accept: tuple[float, float], step: tuple[float, float]) -> str:
    """ "collapse", "saturation" or "ok" for a budget and the next larger one."""
    accept_change = accept[1] / accept[0] - 1
    step_change = step[1] / step[0] - 1
    if accept_change < -COLLAPSE_DROP and step_change < STEP_RISE:
        return "collapse"
    if accept_change < SATURATION_GAIN and step_change > STEP_RISE:
        return "saturation"
    return "ok"


@dataclass
class Diagnosis:
    pairs: list[Pair] = field(default_factory=list)
    # (host, prompt set, concurrency, budget) -> COLLAPSED or SATURATED
    marks: dict[tuple, str] = field(default_factory=dict)

    def collapses(self) -> dict[tuple, list[Pair]]:
        """(host, prompt set, concurrency) -> its collapsing pairs, levels in order."""
        out: dict[tuple, list[Pair]] = {}
        for pair in self.pairs:
            if pair.kind == "collapse":
                out.setdefault((pair.host, pair.prompt_set, pair.concurrency), []).append(pair)
        return out

    def saturations(self, host: str, low: float = 1, high: float = float("inf")) -> list[Pair]:
        return [
            p
            for p in self.pairs
            if p.kind == "saturation" and p.host == host and low <= p.concurrency <= high
        ]

    def collapsed_budgets(self, host: str) -> dict[int, list[tuple[str, int]]]:
        """budget -> [(prompt set, concurrency)] where it is marked collapsed on host."""
        out: dict[int, list[tuple[str, int]]] = {}
        for (mark_host, prompt_set, concurrency, budget), mark in sorted(self.marks.items()):
            if mark_host == host and mark == COLLAPSED:
                out.setdefault(budget, []).append((prompt_set, concurrency))
        return out

    def mark(self, row: dict) -> str | None:
        key = (row["host"], row["prompt_set"], row["concurrency"], row["ddtree_budget"])
        return self.marks.get(key)


def _usable(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def diagnose(table: list[dict]) -> Diagnosis:
    """Pairs and marks of every DDTree sweep in the summary table (analysis.tables.rows)."""
    levels: dict[tuple, dict[int, dict]] = {}
    for row in table:
        budget = row.get("ddtree_budget")
        if budget is None or row.get("server_crashed"):
            continue
        if not (_usable(row.get("step_ms")) and _usable(row.get("accepted_tokens_per_step"))):
            continue
        key = (row["host"], row["prompt_set"], row["concurrency"])
        levels.setdefault(key, {})[budget] = row
    found = Diagnosis()
    for key in sorted(levels):
        by_budget = levels[key]
        budgets = sorted(by_budget)
        collapsed_here = False
        for low, high in itertools.pairwise(budgets):
            a, b = by_budget[low], by_budget[high]
            accept = (a["accepted_tokens_per_step"], b["accepted_tokens_per_step"])
            step = (a["step_ms"], b["step_ms"])
            kind = classify(accept, step)
            found.pairs.append(
                Pair(
                    *key,
                    low=low,
                    high=high,
                    accepted_tokens_per_step=accept,
                    step_ms=step,
                    output_tokens_per_s=(a["output_tokens_per_s"], b["output_tokens_per_s"]),
                    kind=kind,
                )
            )
            if kind == "saturation":
                found.marks[(*key, high)] = SATURATED
            collapsed_here |= kind == "collapse"
        if not collapsed_here:
            continue
        for index, budget in enumerate(budgets):
            row = by_budget[budget]
            for smaller in budgets[:index]:
                other = by_budget[smaller]
                pair = (other["accepted_tokens_per_step"], row["accepted_tokens_per_step"])
                if classify(pair, (other["step_ms"], row["step_ms"])) == "collapse":
                    found.marks[(*key, budget)] = COLLAPSED
                    break
    return found
