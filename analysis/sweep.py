"""What a DDTree budget sweep says: each budget against the next larger one, per host, TP
size, prompt set and concurrency level (budgets served at different TP sizes are never paired:
a step at TP4 is not a step at TP1).

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
_ANY = object()  # saturations() of every TP size


@dataclass(frozen=True)
class Pair:
    """One budget against the next larger one measured at the same level and TP size."""

    host: str
    prompt_set: str
    concurrency: int
    low: int
    high: int
    accepted_tokens_per_step: tuple[float, float]
    step_ms: tuple[float, float]
    output_tokens_per_s: tuple[float | None, float | None]
    kind: str  # "collapse", "saturation" or "ok"
    tp_size: int | None = None  # None: the launch and the name do not say

    @property
    def level(self) -> tuple:
        """(host, TP size, prompt set, concurrency): what a sweep is grouped by."""
        return (self.host, self.tp_size, self.prompt_set, self.concurrency)

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
    # (host, TP size, prompt set, concurrency, budget) -> COLLAPSED or SATURATED
    marks: dict[tuple, str] = field(default_factory=dict)

    def collapses(self) -> dict[tuple, list[Pair]]:
        """(host, TP size, prompt set, concurrency) -> its collapsing pairs, levels in order."""
        out: dict[tuple, list[Pair]] = {}
        for pair in self.pairs:
            if pair.kind == "collapse":
                out.setdefault(pair.level, []).append(pair)
        return out

    def saturations(
        self, host: str, low: float = 1, high: float = float("inf"), tp_size=_ANY
    ) -> list[Pair]:
        return [
            p
            for p in self.pairs
            if p.kind == "saturation"
            and p.host == host
            and low <= p.concurrency <= high
            and (tp_size is _ANY or p.tp_size == tp_size)
        ]

    def collapsed_budgets(self, host: str) -> dict[tuple, list[tuple[str, int]]]:
        """(TP size, budget) -> [(prompt set, concurrency)] where it is marked collapsed on
        host."""
        out: dict[tuple, list[tuple[str, int]]] = {}
        for (mark_host, tp, prompt_set, concurrency, budget), mark in sorted(
            self.marks.items(), key=_mark_order
        ):
            if mark_host == host and mark == COLLAPSED:
                out.setdefault((tp, budget), []).append((prompt_set, concurrency))
        return out

    def mark(self, row: dict) -> str | None:
        key = (
            row["host"],
            row.get("tp_size"),
            row["prompt_set"],
            row["concurrency"],
            row["ddtree_budget"],
        )
        return self.marks.get(key)


def _mark_order(item: tuple) -> tuple:
    # TP sizes may be None (unknown): sorted as 0, so keys of mixed runs still compare.
    (host, tp, prompt_set, concurrency, budget), _mark = item
    return (host, tp or 0, prompt_set, concurrency, budget)


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
        key = (row["host"], row.get("tp_size"), row["prompt_set"], row["concurrency"])
        levels.setdefault(key, {})[budget] = row
    found = Diagnosis()
    for key in sorted(levels, key=lambda k: (k[0], k[1] or 0, *k[2:])):
        by_budget = levels[key]
        budgets = sorted(by_budget)
        collapsed_here = False
        for low, high in itertools.pairwise(budgets):
            a, b = by_budget[low], by_budget[high]
            accept = (a["accepted_tokens_per_step"], b["accepted_tokens_per_step"])
            step = (a["step_ms"], b["step_ms"])
            kind = classify(accept, step)
            host, tp, prompt_set, concurrency = key
            found.pairs.append(
                Pair(
                    host=host,
                    prompt_set=prompt_set,
                    concurrency=concurrency,
                    tp_size=tp,
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
