"""compare(): run B against run A, the same configs, prompt sets and concurrency levels (and
request rates) side by side, into a folder of compare.csv, compare.md, compare.html,
report.json and plots/, written as report() writes (output.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from ansible.module_utils.contract import metrics
from ansible.module_utils.contract.names import REFERENCE

from analysis import comparability, html, plots, sweep, tables
from analysis.output import Outcome, Staging, choose_out, now
from analysis.report_rows import provenance, sweep_rows
from analysis.results import DEFAULT_MAX_FILE_BYTES, Results, load, model_title, ratio, run_model

# The metrics compare puts side by side (module_utils/contract/metrics.py compared).
COMPARED = metrics.compared()


def host_pairs(a: list[dict], b: list[dict]) -> list[tuple[str, str]]:
    """Same host names when the runs share any; else hosts of the same hardware profile; else
    every host of A with every host of B (one each: a rerun on other hardware)."""
    hosts_a = sorted({r["host"] for r in a})
    hosts_b = sorted({r["host"] for r in b})
    common = sorted(set(hosts_a) & set(hosts_b))
    if common:
        return [(h, h) for h in common]
    profile_a = {r["host"]: r["profile"] for r in a}
    profile_b = {r["host"]: r["profile"] for r in b}
    same = [
        (x, y) for x in hosts_a for y in hosts_b if profile_a[x] and profile_a[x] == profile_b[y]
    ]
    return (same or [(x, y) for x in hosts_a for y in hosts_b])[:64]


def compare(
    run_a: Path | str,
    run_b: Path | str,
    out: Path | str | None = None,
    reference: str | None = None,
    strict: bool = False,
    workers: int | None = None,
    label: str = "",
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    slo: dict | None = None,
) -> Outcome:
    """Run B against run A: the same configs, prompt sets and concurrency levels (and request
    rates) side by side. A label leads the title and the plot's image, title and caption, as in
    report(). Where both runs repeated a level, each compared metric says whether B - A is
    within the 95% (Welch) interval of the difference: `<metric>_within_ci95`, and the
    `within_ci95` column lists those metrics. `slo` adds each side's slo_met and goodput."""
    clock = time.perf_counter()
    run_a, run_b = Path(run_a), Path(run_b)
    target = choose_out(run_b, out, f"compare-{run_a.resolve().name}")
    results_a = load(run_a, strict=strict, workers=workers, max_file_bytes=max_file_bytes)
    results_b = load(run_b, strict=strict, workers=workers, max_file_bytes=max_file_bytes)
    reference = reference or str(results_b.run.get("reference_config") or REFERENCE)
    table_a = tables.rows(results_a, reference, slo)
    table_b = tables.rows(results_b, reference, slo)
    name_a, name_b = run_a.resolve().name, run_b.resolve().name
    sides = {
        "a": _side("A", name_a, results_a, table_a, reference),
        "b": _side("B", name_b, results_b, table_b, reference),
    }
    # What differs between the runs themselves (settings, prompts, weights, runtime, launch,
    # hardware): one warning per field, before anything either run says of itself.
    comparable = comparability.check(results_a, results_b)
    found = _Comparison(
        run_a=run_a,
        run_b=run_b,
        reference=reference,
        slo=slo,
        pairs=paired_rows(table_a, table_b, slo),
        only=_unmatched(table_a, table_b),
        sides=sides,
        comparable=comparable,
        warnings=comparable
        + [w for s in sides.values() for w in s["warnings"] if w["severity"] != "info"],
    )
    found.draw(label)
    with Staging(target) as staging:
        _write(staging, found, _title(found, label))
    return Outcome(
        out=target,
        files=staging.files,
        table=found.pairs,
        picks=[],
        warnings=found.warnings,
        seconds={"total": time.perf_counter() - clock},
        levels=len(found.pairs),
        records=results_a.records + results_b.records,
        inputs=results_a.files + results_b.files,
        diagnosis=found.diagnosis,
    )


@dataclass
class _Comparison:
    """What one comparison shows, worked out before anything is written."""

    run_a: Path
    run_b: Path
    reference: str
    slo: dict | None
    pairs: list[dict]  # paired_rows: one per level both runs have
    only: dict[str, list[tuple]]  # only_in_a, only_in_b: (prompt set, config, level, rate)
    sides: dict[str, dict]  # "a", "b": _side
    comparable: list[dict]  # comparability.check
    warnings: list[dict]  # comparability's first, then each run's own (info left out)
    figure: plots.Plot | None = None
    decompositions: tuple[plots.Plot, ...] = ()

    def draw(self, label: str) -> None:
        """B over A per closed-loop level, and each run's DDTree decomposition."""
        self.figure = plots.draw(
            plots.compare_plot, ([p for p in self.pairs if p["request_rate"] is None],), label
        )
        self.decompositions = tuple(
            plot
            for key, side in self.sides.items()
            if (
                plot := plots.draw(
                    plots.run_decomposition,
                    (tables.closed_loop(side["table"]), key, side["heading"]),
                    label,
                )
            )
        )

    @property
    def diagnosis(self) -> dict:
        """Per run its model and DDTree collapse diagnosis (report.json's)."""
        return {key: side["diagnosis"] for key, side in self.sides.items()}

    @property
    def figures(self) -> list[plots.Plot]:
        return ([self.figure] if self.figure else []) + list(self.decompositions)


def paired_rows(table_a: list[dict], table_b: list[dict], slo: dict | None) -> list[dict]:
    """One row per level of run A that run B has too, on paired hosts (host_pairs)."""
    index_b = {
        (r["host"], r["prompt_set"], r["config"], r["concurrency"], r["request_rate"]): r
        for r in table_b
    }
    pairs = []
    for host_a, host_b in host_pairs(table_a, table_b):
        for row in table_a:
            if row["host"] != host_a:
                continue
            other = index_b.get(
                (host_b, row["prompt_set"], row["config"], row["concurrency"], row["request_rate"])
            )
            if other is not None:
                pairs.append(_pair(host_a, host_b, row, other, slo))
    return pairs


def _pair(host_a: str, host_b: str, row: dict, other: dict, slo: dict | None) -> dict:
    """A level of run A (row) beside run B's (other): each compared metric from both, the 95%
    interval of B - A where both repeated it, the throughput ratio and the verdicts."""
    pair = {
        "host_a": host_a,
        "host_b": host_b,
        "prompt_set": row["prompt_set"],
        "config": row["config"],
        "concurrency": row["concurrency"],
        "request_rate": row["request_rate"],
        "repeats_a": row["repeats"],
        "repeats_b": other["repeats"],
    }
    within = []
    for name in COMPARED:
        pair[f"{name}_a"], pair[f"{name}_b"] = row[name], other[name]
        interval = tables.welch_interval(
            (row.get("repeat_values") or {}).get(name, []),
            (other.get("repeat_values") or {}).get(name, []),
        )
        pair[f"{name}_diff_ci95"] = list(interval) if interval else None
        inside = interval[0] <= 0 <= interval[1] if interval else None
        pair[f"{name}_within_ci95"] = inside
        if inside:
            within.append(name)
    # Which compared metrics differ by less than the runs' own spread (both sides
    # repeated): their names, "none", or empty when a side has no repeats.
    pair["within_ci95"] = (
        (", ".join(within) or "none")
        if any(pair[f"{n}_within_ci95"] is not None for n in COMPARED)
        else None
    )
    if slo:
        pair["slo_met_a"], pair["slo_met_b"] = row["slo_met"], other["slo_met"]
        pair["goodput_requests_per_s_a"] = row["goodput_requests_per_s"]
        pair["goodput_requests_per_s_b"] = other["goodput_requests_per_s"]
    pair["throughput_ratio"] = ratio(other["output_tokens_per_s"], row["output_tokens_per_s"])
    pair["lossless_a"], pair["lossless_b"] = row["lossless"], other["lossless"]
    return pair


def _unmatched(table_a: list[dict], table_b: list[dict]) -> dict[str, list[tuple]]:
    """The levels (prompt set, config, concurrency, request rate) only one run has."""
    key = ("prompt_set", "config", "concurrency", "request_rate")
    seen_a = {tuple(r[k] for k in key) for r in table_a}
    seen_b = {tuple(r[k] for k in key) for r in table_b}
    return {
        "only_in_a": sorted(seen_a - seen_b, key=_unmatched_order),
        "only_in_b": sorted(seen_b - seen_a, key=_unmatched_order),
    }


def _csv_columns(slo: dict | None) -> tuple[str, ...]:
    """compare.csv's columns."""
    return (
        "host_a",
        "host_b",
        "prompt_set",
        "config",
        "concurrency",
        "request_rate",
        "repeats_a",
        "repeats_b",
        "throughput_ratio",
        *(f"{n}_{s}" for n in COMPARED for s in ("a", "b")),
        "lossless_a",
        "lossless_b",
        *(f"{n}_within_ci95" for n in COMPARED),
        "within_ci95",
        *(
            ("slo_met_a", "slo_met_b", "goodput_requests_per_s_a", "goodput_requests_per_s_b")
            if slo
            else ()
        ),
    )


def _short_columns(pairs: list[dict], slo: dict | None) -> tuple[str, ...]:
    """The side-by-side table's columns, on the page and in compare.md."""
    return (
        "host_a",
        "host_b",
        "prompt_set",
        "config",
        "concurrency",
        "throughput_ratio",
        "output_tokens_per_s_a",
        "output_tokens_per_s_b",
        "step_ms_a",
        "step_ms_b",
        "accepted_tokens_per_step_a",
        "accepted_tokens_per_step_b",
        "accuracy_a",
        "accuracy_b",
        *(("within_ci95",) if any(p["within_ci95"] is not None for p in pairs) else ()),
        *(("slo_met_a", "slo_met_b") if slo else ()),
    )


def _title(found: _Comparison, label: str) -> str:
    sides = found.sides
    title = (
        f"Benchmark comparison - B: {found.run_b.resolve().name} ({sides['b']['model_title']}) "
        f"against A: {found.run_a.resolve().name} ({sides['a']['model_title']})"
    )
    return f"{label}: {title}" if label else title


def _write(staging: Staging, found: _Comparison, title: str) -> None:
    """Every file of the comparison, into the staging folder."""
    pairs = found.pairs
    short = _short_columns(pairs, found.slo)
    verdicts = "".join(
        f"- {side['heading']}: {side['diagnosis']['verdict']}\n" for side in found.sides.values()
    )
    staging.write("compare.csv", tables.to_csv(pairs, _csv_columns(found.slo)))
    staging.write(
        "compare.md",
        f"# {title}\n\n## Comparability\n\n{_comparability_markdown(found.comparable)}\n"
        f"## DDTree collapse diagnosis\n\n{verdicts}\n## Side by side\n\n"
        + tables.to_markdown(pairs, short),
    )
    for plot in found.figures:
        staging.write(f"plots/{plot.name}.png", plot.png)
    staging.write("compare.html", html.page(title, _sections(found, short), _meta(found)))
    document = _document(found)
    staging.write("report.json", json.dumps(document, indent=1, default=str) + "\n")


def _sections(found: _Comparison, short: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """compare.html's sections: (anchor, heading, HTML)."""
    sides, figure = found.sides, found.figure
    missing = "".join(
        f"<li>{esc_key(k)} only in {side[-1].upper()}</li>"
        for side in ("only_in_a", "only_in_b")
        for k in found.only[side][:200]
    )
    return [
        ("comparability", "Comparability", html.comparability_section(found.comparable)),
        ("table", "Side by side", html.table_html(found.pairs, short)),
        ("plots", "Plots", html.figure_html(figure) if figure else "<p>Nothing in common.</p>"),
        ("decomposition", "DDTree decomposition, each run", _decomposition_html(found)),
        *(
            (f"diagnosis-{key}", f"Collapse diagnosis, {side['heading']}", _diagnosis_html(side))
            for key, side in sides.items()
        ),
        ("unmatched", "Not in both runs", f"<ul>{missing}</ul>" if missing else "<p>None.</p>"),
        ("warnings", "Warnings", html.warnings_html(found.warnings)),
        (
            "provenance",
            "Provenance",
            "".join(
                f"<h3>{html.esc(side['heading'])}</h3>"
                + html.model_html(side["model"])
                + html.provenance_html(provenance(side["results"]))
                for side in sides.values()
            ),
        ),
    ]


def _decomposition_html(found: _Comparison) -> str:
    decompositions = found.decompositions
    return (
        "<p>Each run's step time, accepted tokens per step and their quotient (tokens/s "
        "per request) against the DDTree budget, as its own report draws them, side by "
        "side whatever the two runs share.</p>"
        + (
            '<div class="plots">' + "".join(html.figure_html(p) for p in decompositions) + "</div>"
            if decompositions
            else "<p>Neither run has DDTree levels.</p>"
        )
        + "".join(
            f"<p>{html.esc(side['heading'])}: no DDTree levels.</p>"
            for key, side in found.sides.items()
            if not any(p.name == f"decomposition-{key}" for p in decompositions)
        )
    )


def _meta(found: _Comparison) -> str:
    """The line under the title: the two runs, what they share, when."""
    records_a = found.sides["a"]["results"].records
    records_b = found.sides["b"]["results"].records
    return (
        f"A: {html.esc(found.run_a)} ({records_a} records); B: {html.esc(found.run_b)} "
        f"({records_b} records); {len(found.pairs)} levels in both; generated {now()}"
    )


def _document(found: _Comparison) -> dict:
    """report.json of a comparison."""
    return {
        "kind": "analysis.compare",
        "schema_version": 1,
        "generated_at": now(),
        "run_a": str(found.run_a),
        "run_b": str(found.run_b),
        "reference": found.reference,
        "slo": dict(found.slo) if found.slo else None,
        "rows": found.pairs,
        **{k: [list(t) for t in v] for k, v in found.only.items()},
        "warnings": found.warnings,
        "comparability": comparability.counts(found.comparable),
        "diagnosis": found.diagnosis,
        "plots": [f"plots/{p.name}.png" for p in found.figures],
    }


def _comparability_markdown(found: list[dict]) -> str:
    if not found:
        return "No differences in settings, prompts, weights, runtime, launches or hardware.\n"
    return "".join(f"- `{w['kind']}` {w['message']}\n" for w in found)


# Columns of the budget diagnosis rows in a comparison's per-run section.
SWEEP_COLUMNS = (
    "host",
    "tp_size",
    "prompt_set",
    "concurrency",
    "budgets",
    "kind",
    "accepted_tokens_per_step",
    "step_ms",
    "output_tokens_per_s",
)
COLLAPSED_VERDICT, HEALTHY_VERDICT, NO_DDTREE_VERDICT = "collapsed", "healthy", "no ddtree"


def _side(letter: str, name: str, results: Results, table: list[dict], reference: str) -> dict:
    """One run of a comparison: its warnings (where prefixed with the letter), model and
    collapse diagnosis."""
    diagnosis = sweep.diagnose(tables.closed_loop(table))
    found = tables.warnings(results, table, reference, diagnosis)
    collapses = [w for w in found if w["kind"] == "ddtree_budget_collapse"]
    model = run_model(results.run)
    has_ddtree = any(r["ddtree_budget"] is not None for r in table)
    verdict = (
        COLLAPSED_VERDICT if collapses else HEALTHY_VERDICT if has_ddtree else NO_DDTREE_VERDICT
    )
    return {
        "results": results,
        "table": table,
        "model": model,
        "model_title": model_title(model),
        "heading": f"{letter}: {name} ({model_title(model)})",
        "warnings": [{**w, "where": f"{letter}: {w['where']}"} for w in found],
        "diagnosis": {
            "run": name,
            "model": model,
            "verdict": verdict,
            "collapses": collapses,
            "ddtree_sweep": sweep_rows(diagnosis),
            # Each sweep's shape past its best budget, from the measured figures alone (a
            # comparison does not run the speed model; each run's report does).
            "shapes": [s.figures() for s in sweep.shapes(tables.closed_loop(table))],
        },
    }


def _diagnosis_html(side: dict) -> str:
    diagnosis = side["diagnosis"]
    verdict = diagnosis["verdict"]
    if verdict == NO_DDTREE_VERDICT:
        return "<p>No DDTree levels in this run: nothing to diagnose.</p>"
    collapses = diagnosis["collapses"]
    listed = (
        html.warnings_html(collapses)
        if collapses
        else "<p>No collapse: no budget accepts fewer tokens per step than a smaller one at "
        "the same level and TP size.</p>"
    )
    rows = [
        {
            **row,
            "budgets": " -> ".join(f"b{b}" for b in row["budgets"]),
            **{
                name: " -> ".join(tables.fmt(v, name) for v in row[name])
                for name in ("accepted_tokens_per_step", "step_ms", "output_tokens_per_s")
            },
        }
        for row in diagnosis["ddtree_sweep"]
    ]
    return (
        f"<p>Verdict: <b>{html.esc(verdict)}</b>.</p>"
        + listed
        + "<p>Each budget against the next larger one at the same host, TP size, prompt set "
        "and level.</p>"
        + (html.table_html(rows, SWEEP_COLUMNS) if rows else "<p>A single budget: no pairs.</p>")
        + "".join(
            f"<p>{html.esc(shape['host'])} / tp{html.esc(shape['tp_size'])} / "
            f"{html.esc(shape['prompt_set'])} / c{shape['concurrency']}: "
            f"{html.esc(shape['explanation'])}</p>"
            for shape in diagnosis.get("shapes", [])
        )
    )


def _unmatched_order(key: tuple) -> tuple:
    prompt_set, config, concurrency, rate = key
    return (prompt_set, config, rate is not None, rate or 0.0, concurrency)


def esc_key(key: tuple) -> str:
    prompt_set, config, concurrency, rate = key
    level = f"concurrency {concurrency}" if rate is None else f"request rate {rate:g}/s"
    return html.esc(f"{config} / {prompt_set} / {level}")
