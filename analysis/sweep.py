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

from ansible.module_utils.plan.speed_inputs import DDTREE_MAX_TOPK

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


# -- the sweep's shape past its best budget ----------------------------------------------------
#
# The pairs above judge each budget against the next. What a reader asks of a whole sweep is
# why the larger budgets do not pay, and on an MoE target there are three answers, told apart
# by the two factors of tokens/s past the best budget (the smallest within NEAR_BEST of the
# highest tokens/s per request):
#
# - collapse: accepted tokens per step fall (more than COLLAPSE_DROP below the best budget's):
#   the tree verifies fewer tokens, whatever the step costs.
# - cost growth: accepted tokens per step hold or rise but step time rises (more than
#   STEP_RISE): on K2.6 a verify step of budget + 1 tokens a request touches more routed
#   experts, E (1 - (1 - k/E)^T), until it reads them all, while one step accepts at most the
#   block size. The speed model's step times over the same budgets say whether the rise is
#   what expert coverage predicts.
# - saturation: both flat: a wider tree neither accepts more nor costs more (the drafter's
#   depth bounds what a step can accept, or the tree's early stop drops the extra nodes).
#
# A sweep whose best budget is its largest is "gain": wider trees still pay there.

COLLAPSE_SHAPE = "collapse"
COST_GROWTH = "cost_growth"
SATURATION_SHAPE = "saturation"
GAIN = "gain"
SHAPE_WORDS = {
    COLLAPSE_SHAPE: "acceptance collapse",
    COST_GROWTH: "cost growth",
    SATURATION_SHAPE: "saturation",
    GAIN: "gain",
}
# The model's step rise agrees with the measured one within this factor either way.
MODEL_AGREEMENT = 2.0
# DDTree's tree (pull request 29907 at 93e9850e): min(max(budget // depth + 1, 2), MAX_TOPK)
# branches a level, depth block size - 1; side branches more than log(budget) + 1 below the
# root's log-probability dropped (its early stop); the verify batch padded to budget + 1
# whatever was dropped. Two budgets can so build trees of about the same size.


def width_capped_from(block_size: int) -> int:
    """The smallest budget whose tree levels all take DDTREE_MAX_TOPK branches at this block
    size: budget // (block size - 1) + 1 >= DDTREE_MAX_TOPK."""
    return (DDTREE_MAX_TOPK - 1) * (block_size - 1)


@dataclass(frozen=True)
class Shape:
    """One level's sweep (host, TP size, prompt set, concurrency) and why its larger budgets
    do or do not pay. `predicted_step_ms` and `experts_touched` are the speed model's at each
    budget (None where it made none); `model_best_budget` the budget its curve peaks at."""

    host: str
    prompt_set: str
    concurrency: int
    tp_size: int | None
    budgets: tuple[int, ...]
    accepted_tokens_per_step: tuple[float, ...]
    step_ms: tuple[float, ...]
    best_budget: int
    verdict: str
    predicted_step_ms: tuple[float | None, ...] = ()
    predicted_accepted: tuple[float | None, ...] = ()
    experts_touched: tuple[float | None, ...] = ()
    experts: int | None = None
    model_best_budget: int | None = None
    block_size: int | None = None  # the drafter's, where the launch says it

    @property
    def rates(self) -> tuple[float, ...]:
        """Tokens/s per request: accepted tokens per step over step time."""
        return tuple(
            a / s * 1000.0 for a, s in zip(self.accepted_tokens_per_step, self.step_ms, strict=True)
        )

    def _at(self, values: tuple, budget: int):
        return values[self.budgets.index(budget)] if values else None

    @property
    def tail(self) -> tuple[int, int]:
        """(best budget, largest budget): the part of the sweep the verdict is about (the whole
        sweep for a gain)."""
        return (self.budgets[0] if self.verdict == GAIN else self.best_budget), self.budgets[-1]

    @property
    def accept_change(self) -> float:
        low, high = self.tail
        return (
            self._at(self.accepted_tokens_per_step, high)
            / self._at(self.accepted_tokens_per_step, low)
            - 1
        )

    @property
    def step_change(self) -> float:
        low, high = self.tail
        return self._at(self.step_ms, high) / self._at(self.step_ms, low) - 1

    @property
    def predicted_step_change(self) -> float | None:
        low, high = self.tail
        first, last = self._at(self.predicted_step_ms, low), self._at(self.predicted_step_ms, high)
        return last / first - 1 if first and last else None

    @property
    def model_agrees(self) -> bool | None:
        """Whether step time rose past the best budget as the speed model predicts (both
        within STEP_RISE, or within MODEL_AGREEMENT of each other); None without the model."""
        predicted = self.predicted_step_change
        if predicted is None:
            return None
        measured = self.step_change
        if measured <= STEP_RISE and predicted <= STEP_RISE:
            return True
        if measured <= 0 or predicted <= 0:
            return False
        return 1 / MODEL_AGREEMENT <= measured / predicted <= MODEL_AGREEMENT

    @property
    def alike_budgets(self) -> list[tuple[int, int]]:
        """Neighbouring budgets whose accepted tokens per step are within SATURATION_GAIN of
        each other."""
        pairs = itertools.pairwise(zip(self.budgets, self.accepted_tokens_per_step, strict=True))
        # Positive figures only reach a Shape (_usable); the first is the reference.
        return [
            (low, high)
            for (low, first), (high, second) in pairs
            if abs(second - first) < SATURATION_GAIN * first
        ]

    def early_stop_note(self) -> str | None:
        """Why budgets that accept alike may be the same tree, padded: None when none do."""
        alike = self.alike_budgets
        if not alike:
            return None
        named = ", ".join(f"b{low} and b{high}" for low, high in alike)
        cap = (
            f" (every level from b{width_capped_from(self.block_size)} up at block size "
            f"{self.block_size})"
            if self.block_size is not None and self.block_size > 1
            else ""
        )
        return (
            f"{named} accept within {SATURATION_GAIN:.0%} of each other: DDTree drops side "
            "branches more than log(budget) + 1 below the root's log-probability (its early "
            f"stop) and caps a tree level at {DDTREE_MAX_TOPK} branches{cap}, so they may build "
            "trees of about the same size, while every step still verifies budget + 1 tokens "
            "(padded): the larger budget pays for nodes it does not use."
        )

    def explain(self) -> str:
        note = self.early_stop_note()
        return self._verdict_words() + (f" {note}" if note else "")

    def _verdict_words(self) -> str:
        low, high = self.tail
        accept = (
            self._at(self.accepted_tokens_per_step, low),
            self._at(self.accepted_tokens_per_step, high),
        )
        step = (self._at(self.step_ms, low), self._at(self.step_ms, high))
        rate = (self._at(self.rates, low), self._at(self.rates, high))
        figures = (
            f"b{low} -> b{high}: accepted tokens per step {accept[0]:.2f} -> {accept[1]:.2f} "
            f"({self.accept_change:+.1%}), step {step[0]:.1f} -> {step[1]:.1f} ms "
            f"({self.step_change:+.1%}), {rate[0]:.1f} -> {rate[1]:.1f} tok/s per request"
        )
        model = self._model_words()
        if self.verdict == COLLAPSE_SHAPE:
            fall = min(self.accepted_tokens_per_step[self.budgets.index(low) + 1 :])
            return (
                f"acceptance collapse past b{low}: accepted tokens per step fall to {fall:.2f} "
                f"from {accept[0]:.2f} as the budget grows ({figures}). A wider tree should "
                "accept at least as many tokens; the step time is not what costs the "
                "throughput here (see ddtree_budget_collapse)."
            )
        if self.verdict == COST_GROWTH:
            return (
                f"cost growth past b{low}: accepted tokens per step hold or rise but each step "
                f"costs more ({figures}){model}. One step accepts at most the block size, while "
                "a wider tree verifies more tokens and, on an MoE target, reads more routed "
                f"experts: take b{low}"
                + (
                    f" (the model's best budget here: b{self.model_best_budget})"
                    if self.model_best_budget is not None
                    else ""
                )
                + "."
            )
        if self.verdict == SATURATION_SHAPE:
            return (
                f"saturation past b{low}: neither accepted tokens per step nor step time move "
                f"({figures}){model}. A wider tree buys nothing here (the drafter's depth bounds "
                f"what one step accepts, or the tree's early stop drops the extra nodes): take "
                f"b{low}, the smallest."
            )
        return (
            f"gain: tokens/s per request still rises to the largest budget measured ({figures})"
            f"{model}; a larger budget may pay more."
        )

    def _model_words(self) -> str:
        predicted = self.predicted_step_change
        if predicted is None:
            return ""
        low, high = self.tail
        touched = (self._at(self.experts_touched, low), self._at(self.experts_touched, high))
        coverage = (
            f", routed experts touched per layer {touched[0]:.0f} -> {touched[1]:.0f}"
            + (f" of {self.experts}" if self.experts else "")
            if touched[0] is not None and touched[1] is not None
            else ""
        )
        agrees = self.model_agrees
        how = (
            "as the speed model predicts"
            if agrees
            else "more than the speed model predicts"
            if self.step_change > predicted
            else "less than the speed model predicts"
        )
        return f"; step time {how} ({predicted:+.1%}{coverage})"

    def figures(self) -> dict:
        """report.json's ddtree_diagnosis entry."""
        return {
            "host": self.host,
            "tp_size": self.tp_size,
            "prompt_set": self.prompt_set,
            "concurrency": self.concurrency,
            "verdict": self.verdict,
            "budgets": list(self.budgets),
            "best_budget": self.best_budget,
            "model_best_budget": self.model_best_budget,
            "accepted_tokens_per_step": list(self.accepted_tokens_per_step),
            "step_ms": list(self.step_ms),
            "tokens_per_s_per_request": [round(r, 3) for r in self.rates],
            "predicted_step_ms": list(self.predicted_step_ms),
            "predicted_accepted_tokens_per_step": list(self.predicted_accepted),
            "experts_touched_per_layer": list(self.experts_touched),
            "accepted_tokens_per_step_change": round(self.accept_change, 6),
            "step_ms_change": round(self.step_change, 6),
            "predicted_step_ms_change": (
                None if self.predicted_step_change is None else round(self.predicted_step_change, 6)
            ),
            "model_agrees": self.model_agrees,
            "block_size": self.block_size,
            "alike_budgets": [list(pair) for pair in self.alike_budgets],
            "explanation": self.explain(),
        }


def shape_of(accepted: list[float], steps: list[float]) -> tuple[int, str]:
    """(index of the best budget, verdict) of a sweep's accepted tokens per step and step
    times in budget order (at least two)."""
    rates = [a / s for a, s in zip(accepted, steps, strict=True)]
    top = max(rates)
    best = next(i for i, r in enumerate(rates) if r >= (1 - NEAR_BEST) * top)
    if best == len(rates) - 1:
        return best, GAIN
    if min(accepted[best + 1 :]) < (1 - COLLAPSE_DROP) * accepted[best]:
        return best, COLLAPSE_SHAPE
    if steps[-1] / steps[best] - 1 > STEP_RISE:
        return best, COST_GROWTH
    return best, SATURATION_SHAPE


def shapes(
    table: list[dict], predicted: dict | None = None, model_best: dict | None = None
) -> list[Shape]:
    """Every DDTree sweep's Shape (levels with two or more usable budgets), from the summary
    table's closed-loop rows. `predicted` maps (host, TP size, prompt set, concurrency,
    budget) to the speed model's {"step_ms", "accepted_tokens_per_step",
    "experts_touched_per_layer", "experts"} and
    `model_best` (host, TP size, prompt set, concurrency) to the budget its curve peaks at
    (analysis.predicted); a prediction's "block_size" is the drafter's, from the launch."""
    predicted, model_best = predicted or {}, model_best or {}
    levels: dict[tuple, dict[int, dict]] = {}
    for row in table:
        budget = row.get("ddtree_budget")
        if budget is None or row.get("server_crashed") or row.get("request_rate") is not None:
            continue
        if not (_usable(row.get("step_ms")) and _usable(row.get("accepted_tokens_per_step"))):
            continue
        key = (row["host"], row.get("tp_size"), row["prompt_set"], row["concurrency"])
        levels.setdefault(key, {})[budget] = row
    out = []
    for key in sorted(levels, key=lambda k: (k[0], k[1] or 0, *k[2:])):
        by_budget = levels[key]
        if len(by_budget) < 2:
            continue
        budgets = sorted(by_budget)
        accepted = [by_budget[b]["accepted_tokens_per_step"] for b in budgets]
        steps = [by_budget[b]["step_ms"] for b in budgets]
        best, verdict = shape_of(accepted, steps)
        model = [predicted.get((*key, b)) or {} for b in budgets]
        host, tp, prompt_set, concurrency = key
        out.append(
            Shape(
                host=host,
                prompt_set=prompt_set,
                concurrency=concurrency,
                tp_size=tp,
                budgets=tuple(budgets),
                accepted_tokens_per_step=tuple(accepted),
                step_ms=tuple(steps),
                best_budget=budgets[best],
                verdict=verdict,
                predicted_step_ms=tuple(m.get("step_ms") for m in model) if any(model) else (),
                predicted_accepted=tuple(m.get("accepted_tokens_per_step") for m in model)
                if any(model)
                else (),
                experts_touched=tuple(m.get("experts_touched_per_layer") for m in model)
                if any(model)
                else (),
                experts=next((m.get("experts") for m in model if m.get("experts")), None),
                model_best_budget=model_best.get(key),
                block_size=next((m["block_size"] for m in model if m.get("block_size")), None),
            )
        )
    return out
