"""Signs that a run did not finish: run.json without ended_at, and the configs and levels its
plan names that left no file (the incomplete_run warnings)."""

from __future__ import annotations

import itertools
from pathlib import Path

from analysis.results_types import Results

MAX_LISTED = 6


def incomplete(results: Results) -> list[tuple[str, str]]:
    """(where, message) per sign that the run did not finish: run.json without ended_at (it
    is written at the end), and per host folder the configs and levels run.json plans that
    left no file. A config whose status.json says failed is left out (its own error says
    why), and so is a host without a folder (the other nodes of a multi-node server write
    nothing)."""
    run, run_dir = results.run, results.run_dir
    if run_dir is None:
        return []
    found: list[tuple[str, str]] = []
    if "ended_at" not in run:
        found.append(
            (
                "run",
                f"{run_dir / 'run.json'} has no ended_at: the run was interrupted (or is still "
                "running); the configs and levels it did not reach are missing from this report",
            )
        )
    plan = _Plan(run)
    base = results.root / run_dir
    inside = len(run_dir.parts)
    mine = [lv for lv in results.levels if Path(lv.path).parts[:inside] == run_dir.parts]
    have = {(lv.host, lv.config, lv.prompt_set, (lv.name, lv.repeat)) for lv in mine}
    for host in plan.hosts:
        if not (base / host).is_dir():
            continue
        for config in plan.configs:
            status = results.status.get((host, config), {})
            if status.get("status") == "failed":
                continue
            gap = _config_gap(plan, have, run_dir, host, config, status)
            if gap is not None:
                found.append((f"{host} / {config}", gap))
    return found


class _Plan:
    """The files run.json plans: per host and config, every prompt set at each concurrency
    level and request rate (named as the module names its files, c16 and r2.5), each
    repeat."""

    def __init__(self, run: dict):
        self.hosts, self.configs, self.prompt_sets = (
            list(dict.fromkeys(run.get(k) or [])) for k in ("hosts", "configs", "prompt_sets")
        )
        names = [f"c{c}" for c in dict.fromkeys(run.get("concurrency") or [])]
        names += [f"r{float(r):g}" for r in dict.fromkeys(run.get("request_rates") or [])]
        repeats = run.get("repeats") or 1
        self.levels = [(name, k) for name in dict.fromkeys(names) for k in range(1, repeats + 1)]


def _config_gap(
    plan: _Plan, have: set, run_dir: Path, host: str, config: str, status: dict
) -> str | None:
    """What is missing of one host's config, or None when nothing is."""
    present = sum((host, config, s, c) in have for s in plan.prompt_sets for c in plan.levels)
    if not present and not status:
        return (
            f"run.json plans config {config}, but {host} has no level file and no "
            "status.json for it: the run was interrupted before it, or its files "
            "were lost"
        )
    missing = len(plan.prompt_sets) * len(plan.levels) - present
    if missing <= 0:
        return None
    # The first few only: iterating stops there, however long the plan.
    shown = list(
        itertools.islice(
            (
                (s, c)
                for s in plan.prompt_sets
                for c in plan.levels
                if (host, config, s, c) not in have
            ),
            MAX_LISTED,
        )
    )
    places = ", ".join(f"{s} {name}" + (f" repeat {k}" if k > 1 else "") for s, (name, k) in shown)
    name, k = shown[0][1]
    first = (
        run_dir
        / host
        / config
        / shown[0][0]
        / (f"{name}.json" if k == 1 else f"{name}.rep{k}.json")
    )
    more = f" and {missing - len(shown)} more" if missing > len(shown) else ""
    return (
        f"run.json plans {places}{more} for {config}, but no level file holds "
        f"{'it' if missing == 1 else 'them'} ({first}"
        f"{'' if missing == 1 else ' and the others'}): the run was interrupted, "
        "or the file was lost"
    )
