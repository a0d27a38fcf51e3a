"""The recommendation: per host and concurrency band, the fastest config that passed every
gate (losslessness, clean levels, accuracy, the budget sweep, the SLOs), and a note on every
faster one passed over."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from analysis import sweep
from analysis.keys import closed_loop
from analysis.results import config_order
from analysis.slo import slo_misses, slo_text

DEFAULT_BAND_EDGES = (1, 8, 32, 128)


def bands(edges: tuple[int, ...]) -> list[tuple[str, int, int]]:
    """(label, low, high) per band from ascending upper edges: 1, 2-8, 9-32, 33-128, 129+."""
    out, low = [], 1
    for edge in edges:
        out.append((str(edge) if edge == low else f"{low}-{edge}", low, edge))
        low = edge + 1
    out.append((f"{low}+", low, math.inf))
    return out


@dataclass
class Pick:
    host: str
    band: str
    config: str | None
    ddtree_budget: int | None
    output_tokens_per_s: float | None
    speedup_vs_ar: float | None
    levels: str
    note: str
    # With SLOs: per config rejected for missing one, [{key, value, threshold, concurrency}].
    slo_rejected: dict = field(default_factory=dict)
    # With SLOs: the pick's goodput over the band's levels (mean), and its 95% interval over
    # repeats where the band is one level that has one.
    goodput_requests_per_s: float | None = None
    goodput_ci95: tuple | None = None


def where_list(places: list[tuple[str, int]], limit: int = 4) -> str:
    shown = ", ".join(f"{prompt_set} c{concurrency}" for prompt_set, concurrency in places[:limit])
    return shown + (f" and {len(places) - limit} more" if len(places) > limit else "")


def _prefer_smaller_budget(best: dict, eligible: list[dict], saturated: list) -> tuple:
    """(the pick, a note) under saturation: the smallest eligible DDTree budget at the best's
    TP size within NEAR_BEST of the best mean throughput."""
    near = [
        s
        for s in eligible
        if s["budget"] is not None
        and s["tp"] == best["tp"]
        and s["mean"] >= (1 - sweep.NEAR_BEST) * best["mean"]
    ]
    smallest = min(near, key=lambda s: s["budget"], default=best)
    if smallest["budget"] >= best["budget"]:
        return best, None
    steps: dict[tuple, list] = {}
    for pair in saturated:
        steps.setdefault((pair.low, pair.high), []).append(pair)
    described = []
    for (low, high), pairs in sorted(steps.items()):
        worst = max(pairs, key=lambda p: p.step_change - p.accept_change)
        places = where_list(sorted((p.prompt_set, p.concurrency) for p in pairs))
        described.append(
            f"b{low} -> b{high} at {places}: accepted tokens per step "
            f"{worst.accept_change:+.1%} for {worst.step_change:+.1%} step time at "
            f"{worst.prompt_set} c{worst.concurrency}"
        )
    gain = best["mean"] / smallest["mean"] - 1
    note = (
        f"{smallest['config']} rather than {best['config']} ({best['mean']:.1f} tok/s, only "
        f"{gain:.1%} faster): the budget sweep saturates ({'; '.join(described)}), so the "
        f"smallest budget within {sweep.NEAR_BEST:.0%} of the best throughput is preferred: "
        "as fast, for less verify work per step"
    )
    return smallest, note


def recommend(
    table: list[dict],
    edges: tuple[int, ...] = DEFAULT_BAND_EDGES,
    diagnosis: sweep.Diagnosis | None = None,
    less_accurate: frozenset | set = frozenset(),
    slo: dict | None = None,
) -> list[Pick]:
    """Per host and concurrency band: the config with the highest mean output tokens/s over the
    band's levels and prompt sets, among those whose losslessness check passed (and the
    reference). A config is a candidate only with every level of the band measured cleanly
    (no crash, no failed request), only if it answered no scored level significantly worse
    than the reference (`less_accurate`: (host, config) pairs, analysis.quality's verdict
    "worse"), and a DDTree budget only if it collapsed at no level of the host
    (analysis.sweep). When the host's sweep saturates within the band and the best
    is a DDTree budget, the smallest budget within NEAR_BEST of the best is taken instead.
    With `slo` ({key: ms}) a config is a candidate only if every level of the band met every
    SLO, and the note names, per config that missed one, the key, its value and the threshold.
    Only closed-loop levels are recommended from (a rate level's concurrency is a cap)."""
    table = closed_loop(table)
    diagnosis = diagnosis if diagnosis is not None else sweep.diagnose(table)
    picks = []
    for name in sorted({r["host"] for r in table}):
        mine = [r for r in table if r["host"] == name]
        host = _Host(name, diagnosis, diagnosis.collapsed_budgets(name), less_accurate, slo)
        for band in bands(edges):
            _label, low, high = band
            inside = [r for r in mine if low <= r["concurrency"] <= high]
            if inside:
                picks.append(_band_pick(host, band, inside))
    return picks


@dataclass
class _Host:
    """What every band's pick on one host is judged by."""

    name: str
    diagnosis: sweep.Diagnosis
    collapsed: dict  # {(tp, budget): where it collapsed}, analysis.sweep's
    less_accurate: frozenset | set
    slo: dict | None


def _band_pick(host: _Host, band: tuple[str, int, int], inside: list[dict]) -> Pick:
    """The pick of one band from its rows: the fastest eligible candidate, a smaller budget
    where the sweep saturates, and the notes on what was passed over and why."""
    label, low, high = band
    cells = {(r["prompt_set"], r["concurrency"]) for r in inside}
    scored = [
        _candidate(host, config, [r for r in inside if r["config"] == config], len(cells))
        for config in sorted({r["config"] for r in inside}, key=config_order)
    ]
    eligible = [s for s in scored if _eligible(s)]
    best = max(eligible, key=lambda s: s["mean"], default=None)
    notes = _passed_over(scored, best)
    saturation = (
        host.diagnosis.saturations(host.name, low, high, best["tp"]) if best is not None else []
    )
    if best is not None and best["budget"] is not None and saturation:
        best, why = _prefer_smaller_budget(best, eligible, saturation)
        if why:
            notes.insert(0, why)
    rejected = {s["config"]: s["slo_missed"] for s in scored if s["slo_missed"]}
    for config, misses in list(rejected.items())[:8]:
        notes.append(f"{config} missed the SLOs: {_misses_text(misses)}")
    lead = _lead_note(best, scored, host.slo, rejected)
    if lead is not None:
        notes.insert(0, lead)
    concurrencies = sorted({c for _, c in cells})
    return Pick(
        host=host.name,
        band=label,
        config=best["config"] if best else None,
        ddtree_budget=best["budget"] if best else None,
        output_tokens_per_s=best["mean"] if best else None,
        speedup_vs_ar=best["speedup"] if best else None,
        levels=", ".join(map(str, concurrencies)),
        note="; ".join(notes),
        slo_rejected=rejected,
        goodput_requests_per_s=best["goodput"] if best else None,
        goodput_ci95=best["goodput_ci95"] if best else None,
    )


def _candidate(host: _Host, config: str, own: list[dict], cells: int) -> dict:
    """One config's standing in a band: its mean throughput over the levels it ran cleanly,
    and each gate it passes or fails."""
    clean = [
        r
        for r in own
        if r["output_tokens_per_s"] is not None
        and not r["server_crashed"]
        and not r["requests_failed"]
    ]
    mean = sum(r["output_tokens_per_s"] for r in clean) / len(clean) if clean else None
    speedups = [r["speedup_vs_ar"] for r in clean if r["speedup_vs_ar"] is not None]
    goodputs = [r for r in clean if r.get("goodput_requests_per_s") is not None]
    interval = (
        (
            goodputs[0]["goodput_requests_per_s_ci95_low"],
            goodputs[0]["goodput_requests_per_s_ci95_high"],
        )
        if len(goodputs) == 1 and goodputs[0].get("goodput_requests_per_s_ci95_low") is not None
        else None
    )
    budget, tp = own[0]["ddtree_budget"], own[0]["tp_size"]
    missed = [
        {**miss, "concurrency": r["concurrency"], "prompt_set": r["prompt_set"]}
        for r in own
        for miss in (slo_misses(r, host.slo) if host.slo else [])
    ]
    return {
        "config": config,
        "state": own[0]["lossless"],
        "complete": len(clean) == cells,
        "collapsed": host.collapsed.get((tp, budget)) if budget is not None else None,
        "less_accurate": (host.name, config) in host.less_accurate,
        "slo_missed": missed,
        "mean": mean,
        "speedup": sum(speedups) / len(speedups) if speedups else None,
        "goodput": (
            sum(r["goodput_requests_per_s"] for r in goodputs) / len(goodputs) if goodputs else None
        ),
        "goodput_ci95": interval,
        "budget": budget,
        "tp": tp,
        "saturated": sorted({r["concurrency"] for r in own if r["client_saturated"]}),
    }


def _eligible(candidate: dict) -> bool:
    return bool(
        candidate["complete"]
        and candidate["state"] in ("passed", "reference")
        and candidate["mean"]
        and not candidate["collapsed"]
        and not candidate["less_accurate"]
        and not candidate["slo_missed"]
    )


def _passed_over(scored: list[dict], best: dict | None) -> list[str]:
    """A note on each of the (at most 3) fastest configs faster than the pick, saying why it
    was not taken; those that missed an SLO are named with the others that did."""
    faster = [
        s
        for s in scored
        if s["mean"] and (best is None or s["mean"] > best["mean"]) and s is not best
    ]
    notes = []
    for s in sorted(faster, key=lambda s: -s["mean"])[:3]:
        if s["slo_missed"]:
            continue
        if not s["complete"]:
            why = "missing or failed levels in this band"
        elif s["state"] not in ("passed", "reference"):
            why = f"losslessness {s['state']}"
        elif s["less_accurate"]:
            why = "it answered worse than the reference (see accuracy_below_ar)"
        else:
            why = (
                "its accepted tokens per step collapsed against a smaller budget at "
                f"{where_list(s['collapsed'])} (see the ddtree_budget_collapse warnings)"
            )
        notes.append(f"{s['config']} was faster ({s['mean']:.1f} tok/s) but {why}")
    return notes


def _lead_note(best: dict | None, scored: list[dict], slo: dict | None, rejected: dict):
    """The note that leads: why there is no pick, or that the pick's client saturated."""
    if (
        best is None
        and slo
        and any(not s["slo_missed"] and s["complete"] and s["mean"] for s in scored)
    ):
        return (
            "no config that meets the SLOs ("
            + slo_text(slo)
            + ") passed the losslessness check with every level clean"
        )
    if best is None and slo and rejected:
        return f"no config met the SLOs ({slo_text(slo)}) at every level"
    if best is None:
        return "no config passed the losslessness check with every level clean"
    if best["saturated"]:
        levels = ", ".join(map(str, best["saturated"]))
        return f"client saturated at concurrency {levels}: its throughput is a lower bound"
    return None


def _misses_text(misses: list[dict], limit: int = 4) -> str:
    """'tpot_ms_p99 20.1 > 10 ms at gsm8k c4, ...': the worst miss of each key first."""
    ordered = sorted(
        misses,
        key=lambda m: -(m["value"] / m["threshold"]) if m["value"] is not None else -math.inf,
    )
    text = ", ".join(
        f"{m['key']} {'not measured' if m['value'] is None else format(m['value'], '.1f')} > "
        f"{m['threshold']:g} ms at {m['prompt_set']} c{m['concurrency']}"
        for m in ordered[:limit]
    )
    return text + (f" and {len(misses) - limit} more" if len(misses) > limit else "")
