"""The summary table (one row per host, prompt set, config and concurrency), the
recommendation per concurrency band, and the warnings a reader must see."""

from __future__ import annotations

import csv
import io
import itertools
import math
import re
from dataclasses import dataclass

from analysis import quality, sweep
from analysis.results import (
    CHAIN_CONTROL,
    Results,
    base_config,
    config_order,
    ddtree_budget,
    incomplete,
    parse_config_name,
    ratio,
    tp_size,
    verify_tokens_per_step,
)

COLUMNS = (
    "host",
    "profile",
    "prompt_set",
    "config",
    "base_config",
    "tp_size",
    "ddtree_budget",
    "verify_tokens_per_step",
    "concurrency",
    "output_tokens_per_s",
    "speedup_vs_ar",
    "chain_control",
    "speedup_vs_chain",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "tpot_ms_p50",
    "tpot_ms_p99",
    "accept_length_mean",
    "step_ms",
    "accepted_tokens_per_step",
    "budget_diagnosis",
    "tokens_per_s_per_user",
    "tokens_per_s_per_gpu",
    "gpus",
    "requests_ok",
    "requests_failed",
    "client_saturated",
    "server_crashed",
    "lossless",
    "mismatch_rate",
    # Scored prompt sets only (empty otherwise): correct / n, n, and how many of the n were
    # cut off or failed (counted as not correct).
    "accuracy",
    "accuracy_n",
    "accuracy_unanswered",
)
# The markdown table is for reading: the columns that tell the story.
MARKDOWN_COLUMNS = (
    "host",
    "prompt_set",
    "config",
    "concurrency",
    "output_tokens_per_s",
    "speedup_vs_ar",
    "speedup_vs_chain",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "tpot_ms_p50",
    "tpot_ms_p99",
    "accept_length_mean",
    "step_ms",
    "accepted_tokens_per_step",
    "budget_diagnosis",
    "lossless",
)
DEFAULT_BAND_EDGES = (1, 8, 32, 128)
# GPU product names to the kit's hardware profiles, for results whose provenance does not
# name the profile.
PROFILE_OF_GPU = (
    ("RTX PRO 6000", "ct200"),
    ("H200", "h200"),
    ("B200", "b200"),
    ("B300", "b300"),
)
_TP = re.compile(r"^--(?:tp-size|tp|tensor-parallel-size)$")
_PP = re.compile(r"^--(?:pp-size|pp|pipeline-parallel-size)$")


def profile_of(provenance: dict) -> str:
    if provenance.get("profile"):
        return str(provenance["profile"])
    models = ((provenance.get("gpu") or {}).get("models")) or {}
    for model in models:
        for marker, profile in PROFILE_OF_GPU:
            if marker in str(model):
                return profile
    return str(next(iter(models), ""))


def gpus_of(provenance: dict) -> int | None:
    """GPUs serving the model: TP x PP from the launch argv (TP spans nodes in SGLang; data
    parallel attention reuses the TP ranks), else the host's GPU count."""
    argv = ((provenance.get("launch") or {}).get("argv")) or []
    tp = pp = None
    for flag, value in itertools.pairwise(argv):
        if not isinstance(flag, str):
            continue
        if _TP.match(flag) and _small_count(value):
            tp = int(value)
        elif _PP.match(flag) and _small_count(value):
            pp = int(value)
    if tp:
        return tp * (pp or 1)
    count = (provenance.get("gpu") or {}).get("count")
    return count if isinstance(count, int) and count > 0 else None


def _small_count(value) -> bool:
    # isdecimal, not isdigit: int() refuses "²"; a GPU count has a few digits.
    return isinstance(value, str) and value.isdecimal() and len(value) <= 6


def is_reference(config: str, reference: str) -> bool:
    """The reference config, or it at another TP size (ar-tp4 when the reference is ar or
    ar-tp1): each TP size's speedups are against its own."""
    base, _tp, budget = parse_config_name(config)
    reference_base, _reference_tp, reference_budget = parse_config_name(reference)
    return config == reference or (
        budget is None and reference_budget is None and base == reference_base
    )


def _at_tp(values: dict, place: tuple, tp: int | None):
    """The value recorded at place for TP size tp: the same TP size's, else one whose TP size
    is unknown; a row whose TP size is unknown takes the only one there is. Never a value of
    another known TP size: a TP4 server is not measured against a TP1 one."""
    by_tp = values.get(place) or {}
    if tp in by_tp:
        return by_tp[tp]
    if None in by_tp:
        return by_tp[None]
    if tp is None and len(by_tp) == 1:
        return next(iter(by_tp.values()))
    return None


def lossless_state(results: Results, host: str, config: str, reference: str) -> tuple:
    """(state, mismatch rate): reference, passed, flagged or not checked."""
    if is_reference(config, reference):
        return "reference", None
    report = results.lossless.get(host)
    entry = (report or {}).get("configs", {}).get(config)
    if not entry or not entry.get("tokens_compared"):
        return "not checked", None
    rate = entry.get("mismatch_rate")
    return ("flagged" if entry.get("broken_verification") else "passed"), rate


def _stat(summary: dict, name: str, stat: str):
    value = summary.get(name)
    return value.get(stat) if isinstance(value, dict) else None


def rows(results: Results, reference: str = "ar") -> list[dict]:
    """One row per level, in the table's order, with speedups against the reference config on
    the same host, prompt set, concurrency and TP size; DDTree rows also against the chain
    control (CHAIN_CONTROL, or it expanded over TP sizes) there, and each budget's mark from
    the sweep's diagnosis."""
    base: dict[tuple, dict] = {}
    chain: dict[tuple, dict] = {}
    for level in results.levels:
        key = (level.host, level.prompt_set, level.concurrency)
        tp = tp_size(level.config, level.provenance)
        value = level.summary.get("output_tokens_per_s")
        if is_reference(level.config, reference) and value:
            base.setdefault(key, {})[tp] = value
        if base_config(level.config) == CHAIN_CONTROL:
            chain.setdefault(key, {})[tp] = (level.config, value)
    out = []
    for level in results.levels:
        summary = level.summary
        throughput = summary.get("output_tokens_per_s")
        tp = tp_size(level.config, level.provenance)
        key = (level.host, level.prompt_set, level.concurrency)
        ar = _at_tp(base, key, tp)
        tpot = _stat(summary, "tpot_ms", "mean")
        gpus = gpus_of(level.provenance)
        state, rate = lossless_state(results, level.host, level.config, reference)
        budget = ddtree_budget(level.config, level.provenance)
        # Only DDTree rows have a chain to be compared with; the control must have run at the
        # same host, prompt set, level and TP size.
        control, chain_value = (_at_tp(chain, key, tp) if budget is not None else None) or (
            None,
            None,
        )
        out.append(
            {
                "host": level.host,
                "profile": profile_of(level.provenance),
                "prompt_set": level.prompt_set,
                "config": level.config,
                "base_config": base_config(level.config),
                "tp_size": tp,
                "ddtree_budget": budget,
                "verify_tokens_per_step": verify_tokens_per_step(level.config, level.provenance),
                "concurrency": level.concurrency,
                "output_tokens_per_s": throughput,
                "speedup_vs_ar": ratio(throughput, ar),
                "chain_control": control,
                "speedup_vs_chain": ratio(throughput, chain_value),
                "ttft_ms_p50": _stat(summary, "ttft_ms", "p50"),
                "ttft_ms_p99": _stat(summary, "ttft_ms", "p99"),
                "tpot_ms_p50": _stat(summary, "tpot_ms", "p50"),
                "tpot_ms_p99": _stat(summary, "tpot_ms", "p99"),
                "accept_length_mean": summary.get("accept_length_mean"),
                "step_ms": summary.get("step_ms"),
                "accepted_tokens_per_step": summary.get("accepted_tokens_per_step"),
                "budget_diagnosis": None,
                # What one user sees while decoding (1000 / mean TPOT), against what each
                # GPU delivers: the two axes of the throughput-interactivity trade.
                "tokens_per_s_per_user": ratio(1000.0, tpot),
                "tokens_per_s_per_gpu": ratio(throughput, gpus),
                "gpus": gpus,
                "requests_ok": summary.get("requests_ok"),
                "requests_failed": summary.get("requests_failed"),
                "client_saturated": bool(level.client.get("saturated")),
                "server_crashed": level.crashed,
                "lossless": state,
                "mismatch_rate": rate,
                **_accuracy_columns(summary.get("accuracy")),
                "file": level.path,
            }
        )
    diagnosis = sweep.diagnose(out)
    for row in out:
        if row["ddtree_budget"] is not None:
            row["budget_diagnosis"] = diagnosis.mark(row)
    return out


def _accuracy_columns(accuracy) -> dict:
    """accuracy, accuracy_n, accuracy_unanswered of a level's summary.accuracy (checked by
    analysis.results.accuracy_problems); None each for an unscored set. The accuracy is
    recomputed from the counts: the one the pairing and the warnings use."""
    if not isinstance(accuracy, dict):
        return {"accuracy": None, "accuracy_n": None, "accuracy_unanswered": None}
    n = accuracy["n"]
    return {
        "accuracy": accuracy["correct"] / n if n else None,
        "accuracy_n": n,
        "accuracy_unanswered": accuracy["unanswered"],
    }


# -- recommendation --------------------------------------------------------------------


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


def _where_list(places: list[tuple[str, int]], limit: int = 4) -> str:
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
        places = _where_list(sorted((p.prompt_set, p.concurrency) for p in pairs))
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
) -> list[Pick]:
    """Per host and concurrency band: the config with the highest mean output tokens/s over the
    band's levels and prompt sets, among those whose losslessness check passed (and the
    reference). A config is a candidate only with every level of the band measured cleanly
    (no crash, no failed request), only if it answered no scored level significantly worse
    than the reference (`less_accurate`: (host, config) pairs, analysis.quality's verdict
    "worse"), and a DDTree budget only if it collapsed at no level of the host
    (analysis.sweep). When the host's sweep saturates within the band and the best
    is a DDTree budget, the smallest budget within NEAR_BEST of the best is taken instead."""
    diagnosis = diagnosis if diagnosis is not None else sweep.diagnose(table)
    picks = []
    for host in sorted({r["host"] for r in table}):
        mine = [r for r in table if r["host"] == host]
        collapsed = diagnosis.collapsed_budgets(host)
        for label, low, high in bands(edges):
            inside = [r for r in mine if low <= r["concurrency"] <= high]
            if not inside:
                continue
            cells = {(r["prompt_set"], r["concurrency"]) for r in inside}
            scored = []
            for config in sorted({r["config"] for r in inside}, key=config_order):
                own = [r for r in inside if r["config"] == config]
                clean = [
                    r
                    for r in own
                    if r["output_tokens_per_s"] is not None
                    and not r["server_crashed"]
                    and not r["requests_failed"]
                ]
                mean = sum(r["output_tokens_per_s"] for r in clean) / len(clean) if clean else None
                speedups = [r["speedup_vs_ar"] for r in clean if r["speedup_vs_ar"] is not None]
                budget, tp = own[0]["ddtree_budget"], own[0]["tp_size"]
                scored.append(
                    {
                        "config": config,
                        "state": own[0]["lossless"],
                        "complete": len(clean) == len(cells),
                        "collapsed": collapsed.get((tp, budget)) if budget is not None else None,
                        "less_accurate": (host, config) in less_accurate,
                        "mean": mean,
                        "speedup": sum(speedups) / len(speedups) if speedups else None,
                        "budget": budget,
                        "tp": tp,
                        "saturated": sorted(
                            {r["concurrency"] for r in own if r["client_saturated"]}
                        ),
                    }
                )
            eligible = [
                s
                for s in scored
                if s["complete"]
                and s["state"] in ("passed", "reference")
                and s["mean"]
                and not s["collapsed"]
                and not s["less_accurate"]
            ]
            best = max(eligible, key=lambda s: s["mean"], default=None)
            faster = [
                s
                for s in scored
                if s["mean"] and (best is None or s["mean"] > best["mean"]) and s is not best
            ]
            notes = []
            for s in sorted(faster, key=lambda s: -s["mean"])[:3]:
                if not s["complete"]:
                    why = "missing or failed levels in this band"
                elif s["state"] not in ("passed", "reference"):
                    why = f"losslessness {s['state']}"
                elif s["less_accurate"]:
                    why = "it answered worse than the reference (see accuracy_below_ar)"
                else:
                    why = (
                        "its accepted tokens per step collapsed against a smaller budget at "
                        f"{_where_list(s['collapsed'])} (see the ddtree_budget_collapse warnings)"
                    )
                notes.append(f"{s['config']} was faster ({s['mean']:.1f} tok/s) but {why}")
            saturation = (
                diagnosis.saturations(host, low, high, best["tp"]) if best is not None else []
            )
            if best is not None and best["budget"] is not None and saturation:
                best, why = _prefer_smaller_budget(best, eligible, saturation)
                if why:
                    notes.insert(0, why)
            if best is None:
                notes.insert(0, "no config passed the losslessness check with every level clean")
            elif best["saturated"]:
                levels = ", ".join(map(str, best["saturated"]))
                notes.insert(
                    0, f"client saturated at concurrency {levels}: its throughput is a lower bound"
                )
            concurrencies = sorted({c for _, c in cells})
            picks.append(
                Pick(
                    host=host,
                    band=label,
                    config=best["config"] if best else None,
                    ddtree_budget=best["budget"] if best else None,
                    output_tokens_per_s=best["mean"] if best else None,
                    speedup_vs_ar=best["speedup"] if best else None,
                    levels=", ".join(map(str, concurrencies)),
                    note="; ".join(notes),
                )
            )
    return picks


# -- warnings --------------------------------------------------------------------------


# Every warning's kind, a stable name to filter on (report.json warnings[].kind).
WARNING_KINDS = (
    "config_failed",
    "broken_verification",
    "server_crashed",
    "ddtree_budget_collapse",
    "lossless_not_checked",
    "client_saturated",
    "requests_failed",
    "reference_missing",
    "mixed_kit_versions",
    "chain_control_missing",
    "low_effective_concurrency",
    "incomplete_run",
    "accuracy_below_ar",
    "accuracy_below_floor",
    "api_check_failed",
)
COLLAPSE_MEANING = (
    "A wider tree should never accept fewer tokens per step. This usually means state shared "
    "between sibling branches of the tree (recurrent or hybrid layers, such as Mamba or GDN, "
    "whose state one branch's tokens overwrite for its siblings: the published Qwen3.6-27B "
    "study fell from about 15 to 4 tokens per step between budgets 15 and 64) or a broken tree "
    "attention mask. Check: losslessness against AR (lossless.json and the Losslessness "
    "section; a broken mask usually shows as mismatches), the model's layer types (Kimi K2.6 is "
    "pure attention, MLA, and should not collapse), the tree attention backend (a full tree "
    "verifies only on triton) and the page size (1), in the launch under Provenance."
)


def collapse_warnings(table: list[dict], diagnosis: sweep.Diagnosis) -> list[dict]:
    """One warning per host, prompt set and concurrency level where the sweep collapses,
    listing every collapsing pair of that level."""
    state = {(r["host"], r.get("tp_size"), r["ddtree_budget"]): r["lossless"] for r in table}
    # TP sizes are named where a host's sweep ran at more than one, and only there: a run at
    # one TP size keeps the names it always had.
    sizes: dict[str, set] = {}
    for row in table:
        if row["ddtree_budget"] is not None:
            sizes.setdefault(row["host"], set()).add(row.get("tp_size"))
    found = []
    collapses = diagnosis.collapses()
    for level in sorted(collapses, key=lambda k: (k[0], k[1] or 0, *k[2:])):
        pairs = collapses[level]
        host, tp, prompt_set, concurrency = level
        marked = sorted(
            key[-1]
            for key, mark in diagnosis.marks.items()
            if key[:-1] == level and mark == sweep.COLLAPSED
        )
        checks = ", ".join(f"b{b} {state.get((host, tp, b), 'not checked')}" for b in marked)
        named = len(sizes.get(host, ())) > 1
        at = f"tp{tp if tp is not None else '?'}"
        found.append(
            {
                "kind": "ddtree_budget_collapse",
                "severity": "warning",
                "where": f"{host} / {at} / {prompt_set} / c{concurrency}"
                if named
                else f"{host} / {prompt_set} / c{concurrency}",
                "message": (
                    f"DDTree's accepted tokens per step collapse as the budget grows on {host}"
                    + (f" at TP {tp if tp is not None else 'unknown'}" if named else "")
                    + f", prompt set {prompt_set}, concurrency {concurrency}: "
                    + "; ".join(p.describe() for p in pairs)
                    + f" (a fall of more than {sweep.COLLAPSE_DROP:.0%} while step time rises "
                    f"less than {sweep.STEP_RISE:.0%}). Budgets marked collapsed, never "
                    f"recommended: {', '.join(f'b{b}' for b in marked)} (losslessness: "
                    f"{checks}). {COLLAPSE_MEANING}"
                ),
                "host": host,
                "tp_size": tp,
                "prompt_set": prompt_set,
                "concurrency": concurrency,
                "pairs": [p.figures() for p in pairs],
                "collapsed_budgets": marked,
            }
        )
    return found


def warnings(
    results: Results,
    table: list[dict],
    reference: str = "ar",
    diagnosis: sweep.Diagnosis | None = None,
    scored: list[dict] | None = None,
    api_checks: list[dict] | None = None,
) -> list[dict]:
    """What the reader must know before trusting a number: {kind, severity, where, message},
    kind one of WARNING_KINDS. `scored` and `api_checks` are analysis.quality's rows when the
    caller already built them (the report shows them too)."""
    found: list[dict] = []

    def add(kind: str, severity: str, where: str, message: str) -> None:
        found.append({"kind": kind, "severity": severity, "where": where, "message": message})

    for (host, config), status in sorted(results.status.items()):
        if status.get("status") == "failed":
            error = str(status.get("error") or "no error recorded").strip()
            add("config_failed", "error", f"{host} / {config}", f"the config failed: {error[:400]}")
    flagged = {}
    for host, report in sorted(results.lossless.items()):
        for config, entry in sorted(report.get("configs", {}).items()):
            if entry.get("broken_verification"):
                rate = entry.get("mismatch_rate") or 0.0
                flagged[(host, config)] = rate
                add(
                    "broken_verification",
                    "error",
                    f"{host} / {config}",
                    f"broken verification: {rate:.1%} of greedy output tokens differ from "
                    f"{report.get('reference', reference)} (threshold "
                    f"{report.get('threshold', 0):.0%}); its speedup is not a valid result and "
                    "it is never recommended",
                )
    unchecked = sorted({(r["host"], r["config"]) for r in table if r["lossless"] == "not checked"})
    for host, config in unchecked:
        why = (
            "no lossless.json for this host"
            if host not in results.lossless
            else "no level compared (temperature above 0, or no reference level)"
        )
        add(
            "lossless_not_checked",
            "warning",
            f"{host} / {config}",
            f"losslessness not checked ({why})",
        )
    for level, row in zip(results.levels, table, strict=True):
        where = f"{level.host} / {level.config} / {level.prompt_set} / c{level.concurrency}"
        if level.client.get("saturated"):
            reasons = "; ".join(map(str, level.client.get("saturated_reasons") or []))
            add(
                "client_saturated",
                "warning",
                where,
                "client saturated: the benchmark client, not the server, may have been the "
                f"limit ({reasons or 'marked saturated'}); throughput and latency understate "
                "the server",
            )
        if level.crashed:
            add(
                "server_crashed",
                "error",
                where,
                "the server crashed or restarted during this level",
            )
        failed = row["requests_failed"] or 0
        if failed:
            add(
                "requests_failed",
                "warning",
                where,
                f"{failed} of {failed + (row['requests_ok'] or 0)} requests failed",
            )
        effective = level.summary.get("effective_concurrency")
        expected = min(level.concurrency, level.settings.get("num_prompts") or level.concurrency)
        if isinstance(effective, (int, float)) and expected > 1 and effective < 0.75 * expected:
            add(
                "low_effective_concurrency",
                "info",
                where,
                f"only {effective:.1f} requests in flight on average (level {level.concurrency}):"
                " too few prompts per level to keep it busy, or a ramp dominated the run",
            )
    found += collapse_warnings(table, diagnosis if diagnosis is not None else sweep.diagnose(table))
    missing_ref = sorted(
        {(r["host"], r["prompt_set"]) for r in table if r["speedup_vs_ar"] is None}
        - {(r["host"], r["prompt_set"]) for r in table if is_reference(r["config"], reference)}
    )
    for host, prompt_set in missing_ref:
        add(
            "reference_missing",
            "warning",
            f"{host} / {prompt_set}",
            f"no {reference} results: speedups cannot be computed",
        )
    no_chain: dict[str, list[tuple[str, int]]] = {}
    for row in table:
        if row["ddtree_budget"] is not None and row["chain_control"] is None:
            place = (row["prompt_set"], row["concurrency"])
            if place not in no_chain.setdefault(row["host"], []):
                no_chain[row["host"]].append(place)
    for host, places in sorted(no_chain.items()):
        add(
            "chain_control_missing",
            "info",
            host,
            f"no {CHAIN_CONTROL} level beside DDTree's at {_where_list(sorted(places))}: "
            "speedup_vs_chain is empty there, and DDTree against dflash there mixes the tree "
            "with the attention backend, page size and scheduler",
        )
    for where, message in incomplete(results):
        add("incomplete_run", "warning", where, message)
    if scored is None:
        scored = quality.accuracy_rows(results, table, reference)
    if api_checks is None:
        api_checks = quality.api_check_rows(results)
    found += quality.accuracy_warnings(results, scored, reference)
    found += quality.api_check_warnings(api_checks)
    versions = {
        (lv.provenance.get("kit_version"), lv.provenance.get("sglang_version"))
        for lv in results.levels
    }
    if len({v[0] for v in versions}) > 1:
        kits = ", ".join(sorted(str(v[0]) for v in versions))
        add("mixed_kit_versions", "warning", "run", f"results from several kit versions: {kits}")
    order = {"error": 0, "warning": 1, "info": 2}
    found.sort(key=lambda w: order[w["severity"]])
    return found


# -- output ----------------------------------------------------------------------------


def fmt(value, column: str = "") -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if column in ("speedup_vs_ar", "speedup_vs_chain"):
            return f"{value:.3f}"
        if column == "mismatch_rate":
            return f"{value:.4f}"
        if column in ("accuracy", "reference_accuracy"):
            return f"{value:.3f}"
        if column == "p_value":
            return f"{value:.3g}"
        return f"{value:.2f}" if abs(value) < 1000 else f"{value:.1f}"
    return str(value)


def to_csv(table: list[dict], columns=COLUMNS) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in table:
        writer.writerow(
            [
                ("true" if row[c] else "false")
                if isinstance(row[c], bool)
                else (
                    ""
                    if row[c] is None
                    else round(row[c], 6)
                    if isinstance(row[c], float)
                    else row[c]
                )
                for c in columns
            ]
        )
    return buffer.getvalue()


def to_markdown(table: list[dict], columns=MARKDOWN_COLUMNS) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in table:
        lines.append("| " + " | ".join(cell(fmt(row.get(c), c)) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def picks_table(picks: list[Pick]) -> list[dict]:
    return [
        {
            "host": p.host,
            "band": p.band,
            "levels": p.levels,
            "config": p.config or "(none)",
            "ddtree_budget": p.ddtree_budget,
            "output_tokens_per_s": p.output_tokens_per_s,
            "speedup_vs_ar": p.speedup_vs_ar,
            "note": p.note,
        }
        for p in picks
    ]


PICK_COLUMNS = (
    "host",
    "band",
    "levels",
    "config",
    "ddtree_budget",
    "output_tokens_per_s",
    "speedup_vs_ar",
    "note",
)
