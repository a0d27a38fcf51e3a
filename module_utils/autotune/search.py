"""Autotune's search: predicted order first, a short run for every candidate, longer runs for the
best (successive halving, a third kept per rung), a failed candidate pruned with every one that
asks at least as much memory, and a stop before a trial that would not end within the budget.

The state is plain JSON (results/<run>/autotune/search.json, written by
module_utils/autotune/step.py), so each step picks up where the last one left off: next_trial()
says what to run, record_trial() takes what it measured, answer() says what was found.
"""

from __future__ import annotations

import math

from ansible.module_utils.autotune.space import candidate_key, candidates, dominates

STATE_VERSION = 1
# A third of a rung's candidates go on to the next, run three times as long.
ETA = 3
DEFAULT_RUNGS = (1, 3, 9)


class SearchError(ValueError):
    """A search state or step input that cannot be used; the message says which and why."""


def _predicted_score(knobs: dict, bands: list[int], predicted: dict) -> float | None:
    """The mean over the bands of the speed model's figure for the candidate's config, at the
    concurrency its --max-running-requests lets run; None where the model has none."""
    by_level = predicted.get(knobs.get("config")) if isinstance(predicted, dict) else None
    if not isinstance(by_level, dict):
        return None
    cap = knobs.get("--max-running-requests")
    values = []
    for band in bands:
        level = min(band, cap) if isinstance(cap, int) and cap > 0 else band
        value = by_level.get(level, by_level.get(str(level)))
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        values.append(float(value))
    return sum(values) / len(values) if values else None


def predictions(plan, bands: list[int]) -> dict:
    """{launch: {band: tokens/s}} from a plan.json (plan.yml's speed model: speed.launches
    .<launch>.levels[].by_prompt_set[].tokens_per_s, the mean over its prompt set groups), for
    the launches it predicts at every band; {} from anything else (the plan is outside input
    once written: a hand-edited one ranks nothing rather than failing the search)."""
    launches = plan.get("speed", {}).get("launches") if isinstance(plan, dict) else None
    if not isinstance(launches, dict):
        return {}
    found = {}
    for name, entry in list(launches.items())[:1000]:
        levels = entry.get("levels") if isinstance(entry, dict) else None
        by_band = {}
        for level in levels if isinstance(levels, list) else []:
            if not isinstance(level, dict) or level.get("concurrency") not in bands:
                continue
            rates = [
                group.get("tokens_per_s")
                for group in level.get("by_prompt_set") or []
                if isinstance(group, dict)
            ]
            rates = [r for r in rates if isinstance(r, (int, float)) and not isinstance(r, bool)]
            rates = [r for r in rates if math.isfinite(r) and r >= 0]
            if rates:
                by_band[level["concurrency"]] = sum(rates) / len(rates)
        if isinstance(name, str) and set(by_band) == set(bands):
            found[name] = by_band
    return found


def new_search(
    parsed: dict,
    *,
    bands: list[int],
    slo: dict,
    budget_s: float,
    started: float,
    rungs=DEFAULT_RUNGS,
    predicted: dict | None = None,
    warm_key: str | None = None,
) -> dict:
    """A search over the parsed space (space.parse_space): candidates in predicted order (the
    speed model's figure, highest first; those it cannot predict after, in the space's order),
    the warm start (the last answer's pick) before all. rungs: requests per concurrency of
    each rung's runs."""
    if not bands or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in bands):
        raise SearchError(f"bands {bands!r:.80} are not concurrency levels of 1 or more")
    if not isinstance(budget_s, (int, float)) or not 0 < budget_s <= 7 * 86400:
        raise SearchError(f"the budget {budget_s!r:.40} s is not above 0 and at most a week")
    if not rungs or any(not isinstance(r, int) or r < 1 for r in rungs):
        raise SearchError(f"rungs {rungs!r:.80} are not request counts of 1 or more")
    entries = []
    for index, knobs in enumerate(candidates(parsed)):
        key = candidate_key(knobs)
        score = _predicted_score(knobs, bands, predicted or {})
        entries.append(
            {
                "key": key,
                "knobs": knobs,
                "predicted": score,
                "order": index,
                "status": "alive",
                "reason": None,
                "scores": {},
            }
        )
    entries.sort(
        key=lambda e: (
            e["key"] != warm_key,
            e["predicted"] is None,
            -(e["predicted"] or 0.0),
            e["order"],
        )
    )
    return {
        "version": STATE_VERSION,
        "space": parsed,
        "bands": list(bands),
        "slo": dict(slo),
        "budget_s": float(budget_s),
        "started": float(started),
        "eta": ETA,
        "rungs": list(rungs),
        "rung": 0,
        "warm_key": warm_key,
        "candidates": entries,
        "trials": [],
        "done": False,
        "stop": None,
    }


def trial_bound(count: int, bands: int, rungs: int, eta: int = ETA) -> int:
    """The most trials a search of `count` candidates can run: every one at the first rung,
    then at most the best third of each band (their union, at most all) at each next one."""
    total, alive = 0, count
    for index in range(rungs):
        total += alive
        if index + 1 < rungs:
            alive = min(alive, bands * max(1, math.ceil(alive / eta)))
    return total


def _candidate(state: dict, key: str) -> dict:
    for entry in state["candidates"]:
        if entry["key"] == key:
            return entry
    raise SearchError(f"no candidate {key!r:.120} in the search")


def _estimate_s(state: dict, rung: int) -> float:
    """What the next trial at this rung should take: the mean of this rung's finished trials,
    else the last rung's scaled by the longer runs' share (the overhead of a trial, its restart
    and warmup, kept as it was); 0 before any trial ended (the first one always runs)."""
    done = [t for t in state["trials"] if t["status"] != "running" and t.get("seconds")]
    # A trial that failed fast (out of memory while loading) says little of one that runs.
    here = [t["seconds"] for t in done if t["rung"] == rung and t["status"] == "ok"]
    here = here or [t["seconds"] for t in done if t["rung"] == rung]
    if here:
        return sum(here) / len(here)
    before = [t for t in done if t["rung"] == rung - 1 and t["status"] == "ok"]
    if not before:
        return 0.0
    scale = state["rungs"][rung] / state["rungs"][rung - 1]
    measured = [t.get("level_seconds") or 0.0 for t in before]
    overhead = [t["seconds"] - m for t, m in zip(before, measured, strict=True)]
    return (sum(overhead) + scale * sum(measured)) / len(before)


def _finish(state: dict, stop: str) -> None:
    state["done"], state["stop"] = True, stop


def _promote(state: dict) -> bool:
    """End the current rung: keep the best third per band (at least one), drop the rest; False
    when the search is over (the last rung ran, or one candidate is left)."""
    rung = state["rung"]
    ran = [e for e in state["candidates"] if e["status"] == "alive" and str(rung) in e["scores"]]
    if rung + 1 >= len(state["rungs"]) or len(ran) <= 1:
        return False
    keep_count = max(1, math.ceil(len(ran) / state["eta"]))
    kept: set[str] = set()
    for band in state["bands"]:
        scored = [
            (e["scores"][str(rung)].get(str(band)), e)
            for e in ran
            if isinstance(e["scores"][str(rung)].get(str(band)), dict)
        ]
        scored.sort(key=lambda pair: -pair[0]["goodput"])
        kept.update(e["key"] for _, e in scored[:keep_count])
    for entry in ran:
        if entry["key"] not in kept:
            entry["status"] = "dropped"
            entry["reason"] = f"not among the best {keep_count} of a band at rung {rung}"
    state["rung"] = rung + 1
    # The server runs the last trial's candidate: if it goes on, it goes first (no restart).
    last = state["trials"][-1]["key"] if state["trials"] else None
    state["candidates"].sort(key=lambda e: e["key"] != last)
    return True


def next_trial(state: dict, now: float) -> dict | None:
    """The next trial to run ({id, key, knobs, rung, requests_per_concurrency}), or None when
    the search is over (state["stop"] says why: converged, budget, or exhausted)."""
    if state["done"]:
        return None
    if any(t["status"] == "running" for t in state["trials"]):
        raise SearchError("a trial is still running: record it before asking for the next")
    while True:
        rung = state["rung"]
        pending = [
            e
            for e in state["candidates"]
            if e["status"] == "alive" and str(rung) not in e["scores"]
        ]
        if pending:
            remaining = state["budget_s"] - (now - state["started"])
            if _estimate_s(state, rung) > remaining or remaining <= 0:
                _finish(state, "budget")
                return None
            entry = pending[0]
            trial = {
                "id": f"t{len(state['trials']) + 1:03d}",
                "key": entry["key"],
                "knobs": entry["knobs"],
                "rung": rung,
                "requests_per_concurrency": state["rungs"][rung],
                "started": now,
                "status": "running",
            }
            state["trials"].append(trial)
            return dict(trial)
        if not _promote(state):
            alive = [e for e in state["candidates"] if e["status"] == "alive"]
            _finish(state, "converged" if alive else "exhausted")
            return None


def record_trial(state: dict, trial_id: str, outcome: dict, now: float) -> dict:
    """Take a trial's outcome: {status: ok|failed, error, scores: {band: goodput record or
    None}, level_seconds}. A failed trial, or one that measured no band, fails its candidate
    and prunes every candidate still alive that asks at least as much memory (never tried)."""
    trial = next((t for t in state["trials"] if t["id"] == trial_id), None)
    if trial is None or trial["status"] != "running":
        raise SearchError(f"no running trial {trial_id!r:.40} in the search")
    entry = _candidate(state, trial["key"])
    scores = outcome.get("scores") if isinstance(outcome.get("scores"), dict) else {}
    measured = {str(b): scores.get(str(b), scores.get(b)) for b in state["bands"]}
    ok = outcome.get("status") == "ok" and any(isinstance(v, dict) for v in measured.values())
    trial.update(
        status="ok" if ok else "failed",
        ended=now,
        seconds=round(max(now - trial["started"], 0.0), 3),
        level_seconds=round(
            sum(v.get("seconds") or 0.0 for v in measured.values() if isinstance(v, dict)), 3
        ),
        scores=measured,
        error=None if ok else str(outcome.get("error") or "no level was measured")[:2000],
    )
    if ok:
        entry["scores"][str(trial["rung"])] = measured
        return trial
    entry["status"], entry["reason"] = "failed", trial["error"]
    for other in state["candidates"]:
        if other["status"] == "alive" and dominates(other["knobs"], entry["knobs"]):
            other["status"] = "pruned"
            other["reason"] = f"asks at least as much memory as {entry['key']}, which failed"
    return trial


def _pick(entry: dict, band: int) -> dict | None:
    """The candidate's figure at its deepest rung that measured the band."""
    for rung in sorted(entry["scores"], key=int, reverse=True):
        score = entry["scores"][rung].get(str(band))
        if isinstance(score, dict):
            return {"key": entry["key"], "knobs": entry["knobs"], "rung": int(rung), **score}
    return None


def answer(state: dict) -> dict:
    """Per band: the best candidate (the deepest rung first, then the highest goodput), the
    runner-up, the margin between them and whether their intervals overlap (then the pick is
    not told apart from the runner-up by this search); and the search's own figures."""
    bands = {}
    for band in state["bands"]:
        picks = [p for p in (_pick(e, band) for e in state["candidates"]) if p]
        picks.sort(key=lambda p: (-p["rung"], -p["goodput"]))
        best = picks[0] if picks else None
        runner = picks[1] if len(picks) > 1 else None
        margin = None
        if best and runner:
            margin = {
                "goodput": round(best["goodput"] - runner["goodput"], 6),
                "share": round(best["goodput"] / runner["goodput"] - 1, 4)
                if runner["goodput"] > 0
                else None,
                "within_interval": best["low"] <= runner["high"],
            }
        bands[str(band)] = {"best": best, "runner_up": runner, "margin": margin}
    trials = [t for t in state["trials"] if t["status"] != "running"]
    seconds = sum(t.get("seconds") or 0.0 for t in trials)
    levels = sum(t.get("level_seconds") or 0.0 for t in trials)
    statuses = [e["status"] for e in state["candidates"]]
    return {
        "bands": bands,
        "stop": state["stop"],
        "trials": len(trials),
        "failed": sum(t["status"] == "failed" for t in trials),
        "candidates": len(statuses),
        "pruned": statuses.count("pruned"),
        "dropped": statuses.count("dropped"),
        "never_run": sum(
            s == "alive" and not e["scores"]
            for s, e in zip(statuses, state["candidates"], strict=True)
        ),
        "budget_s": state["budget_s"],
        "trial_seconds": round(seconds, 3),
        "level_seconds": round(levels, 3),
        # What the search spent besides measuring: restarts, health waits, warmups, fetches.
        "overhead_seconds": round(seconds - levels, 3),
    }
