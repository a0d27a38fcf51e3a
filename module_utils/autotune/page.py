"""The search's page (results/<run>/<host>/autotune/search.md): what was found per band and how
sure it is, the path of the search trial by trial, and each knob's effect (the mean goodput of
the first rung's candidates at each of its values)."""

from __future__ import annotations

from ansible.module_utils.autotune.space import candidate_key


def _cell(value) -> str:
    text = "-" if value is None else (f"{value:.3g}" if isinstance(value, float) else str(value))
    return text.replace("|", "/").replace("\n", " ")[:200]


def _interval(entry: dict | None) -> str:
    if not entry:
        return "-"
    return f"{entry['goodput']:.3g} ({entry['low']:.3g} to {entry['high']:.3g})"


def _verdict(band: str, result: dict) -> str:
    best, runner, margin = result["best"], result["runner_up"], result["margin"]
    if best is None:
        return f"- c{band}: no candidate was measured."
    line = f"- c{band}: **{candidate_key(best['knobs'])}**, goodput {_interval(best)} requests/s"
    if runner is None:
        return line + " (the only candidate measured)."
    share = f" ({margin['share']:+.1%})" if margin["share"] is not None else ""
    line += f"; runner-up {candidate_key(runner['knobs'])} at {_interval(runner)}{share}"
    if margin["within_interval"]:
        return (
            line + ". The two are within each other's interval: this search cannot tell them apart."
        )
    return line + "."


def knob_effects(state: dict) -> list[str]:
    """Per knob and band, the mean first-rung goodput of the candidates at each value."""
    lines = []
    ran = [e for e in state["candidates"] if "0" in e["scores"]]
    for knob, values in state["space"].items():
        if len(values) < 2:
            continue
        for band in state["bands"]:
            cells = []
            for value in values:
                scores = [
                    e["scores"]["0"][str(band)]["goodput"]
                    for e in ran
                    if e["knobs"].get(knob) == value
                    and isinstance(e["scores"]["0"].get(str(band)), dict)
                ]
                mean = sum(scores) / len(scores) if scores else None
                cells.append(f"{_cell(value)}: {_cell(mean)}")
            lines.append(f"| {_cell(knob)} | {band} | {'; '.join(cells)} |")
    return lines


def render(state: dict, found: dict, context: dict) -> str:
    """The page's Markdown."""
    budget, spent = found["budget_s"], found["trial_seconds"]
    head = [
        f"# Autotune on {_cell(context.get('host'))} (run {_cell(context.get('run_id'))})",
        "",
        f"SLO: {_cell(context.get('slo'))}; workload {_cell(context.get('workload'))}; "
        f"bands (concurrency) {', '.join(map(str, state['bands']))}.",
        f"Stopped: {found['stop']}. {found['trials']} trials ({found['failed']} failed) of "
        f"{found['candidates']} candidates; {found['pruned']} pruned after a failure, "
        f"{found['dropped']} dropped by halving, {found['never_run']} never run. Budget "
        f"{budget / 60:.1f} min; trials took {spent / 60:.1f} min, of which "
        f"{found['overhead_seconds'] / 60:.1f} min was the search's own overhead (restarts, "
        "health waits, warmups, fetches) and the rest measurement.",
        "",
        "## Recommendation per band",
        "",
        *(_verdict(band, result) for band, result in found["bands"].items()),
        "",
        "## The search, trial by trial",
        "",
        "| trial | rung | candidate | status | "
        + " | ".join(f"goodput c{b}" for b in state["bands"])
        + " | seconds |",
        "|---|---|---|---|" + "---|" * len(state["bands"]) + "---|",
    ]
    for trial in state["trials"]:
        scores = trial.get("scores") or {}
        cells = [
            _cell(
                (scores.get(str(b)) or {}).get("goodput")
                if isinstance(scores.get(str(b)), dict)
                else None
            )
            for b in state["bands"]
        ]
        status = trial["status"] if trial["status"] != "failed" else f"failed: {trial.get('error')}"
        head.append(
            f"| {trial['id']} | {trial['rung']} | {_cell(trial['key'])} | {_cell(status)} | "
            + " | ".join(cells)
            + f" | {_cell(trial.get('seconds'))} |"
        )
    effects = knob_effects(state)
    if effects:
        head += [
            "",
            "## Knob effects (first rung: mean goodput, requests/s, per value)",
            "",
            "| knob | band | value: mean goodput |",
            "|---|---|---|",
            *effects,
        ]
    return "\n".join(head) + "\n"
