"""report(): one results tree in, a folder of tables, plots and HTML out (report.html,
report.json, summary.csv and .md, recommendation.csv, predicted.csv, ddtree_diagnosis.csv,
plots/). compare() of two runs is in report_compare.py; where both write, in output.py.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from ansible.module_utils.contract import metrics
from ansible.module_utils.contract.names import REFERENCE

from analysis import autotune, fleet, html, plots, predicted, quality, sweep, tables
from analysis.output import (
    Outcome,
    OutputError,
    Staging,
    choose_out,
    markdown_code,
    markdown_text,
    now,
)
from analysis.report_rows import LOSSLESS_COLUMNS, lossless_rows, provenance, sweep_rows
from analysis.results import (
    DEFAULT_MAX_FILE_BYTES,
    SUPPORTED_SCHEMAS,
    Results,
    accuracy_floors,
    load,
    model_title,
    run_model,
)

# The HTML summary table's columns (module_utils/contract/metrics.py html): always shown.
HTML_COLUMNS = metrics.html_columns()
# Shown beside HTML_COLUMNS where the results have them.
OPTIONAL_HTML_COLUMNS = tuple(
    (m.name, lambda row, m=m: m.shown(row.get(m.name))) for m in metrics.html_optional()
)


def shown_columns(table: list[dict], columns: tuple[str, ...]) -> tuple[str, ...]:
    """columns, with each optional column some row has a value in placed after the column
    the registry puts before it (an interval beside its metric, goodput beside throughput),
    or at the end where none of those is shown."""
    extra = tuple(name for name, has in OPTIONAL_HTML_COLUMNS if any(has(r) for r in table))
    order = metrics.columns()
    shown = list(columns)
    for name in extra:
        if name in shown:
            continue
        before = [c for c in order[: order.index(name)] if c in shown]
        shown.insert(shown.index(before[-1]) + 1 if before else len(shown), name)
    return tuple(shown)


def report(
    results_dir: Path | str,
    out: Path | str | None = None,
    reference: str | None = None,
    band_edges: tuple[int, ...] = tables.DEFAULT_BAND_EDGES,
    strict: bool = False,
    workers: int | None = None,
    label: str = "",
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    slo: dict | None = None,
    cdf_concurrency: int | None = None,
) -> Outcome:
    """Tables, plots and report.html for one results tree; ResultsError or OutputError when
    it cannot (nothing is written then). A label (e.g. "SIMULATED") leads the title and every
    plot's image, title and caption. `slo` ({key: ms}, tables.parse_slo) adds slo_met and
    goodput and recommends among the configs that meet it; `cdf_concurrency` picks the level
    the latency CDFs are drawn at (default: the highest)."""
    clock = time.perf_counter()
    results_dir = Path(results_dir)
    target = choose_out(results_dir, out, "report")
    results = load(results_dir, strict=strict, workers=workers, max_file_bytes=max_file_bytes)
    seconds = {"read": time.perf_counter() - clock}
    reference = reference or str(results.run.get("reference_config") or REFERENCE)
    found = _analyse(results, results_dir, reference, band_edges, slo, cdf_concurrency)
    seconds["tables"] = time.perf_counter() - clock - seconds["read"]
    found.figures = _figures(found, workers, label)
    seconds["plots"] = time.perf_counter() - clock - seconds["read"] - seconds["tables"]
    with Staging(target) as staging:
        _write(staging, found, _title(found, label))
    seconds["total"] = time.perf_counter() - clock
    expected = found.expected
    return Outcome(
        out=target,
        files=staging.files,
        table=found.table,
        picks=found.picks,
        warnings=found.warnings,
        seconds=seconds,
        levels=len(results.levels),
        records=results.records,
        inputs=results.files,
        predicted={
            "rows": expected.rows,
            "notes": expected.note_rows(),
            "shapes": expected.shape_rows(),
        },
    )


@dataclass
class _Findings:
    """What one report shows, worked out before anything is written."""

    results: Results
    results_dir: Path
    reference: str
    band_edges: tuple[int, ...]
    slo: dict | None
    cdf_concurrency: int | None
    table: list[dict]  # tables.rows: the summary, one row per level
    diagnosis: sweep.Diagnosis
    scored: list[dict]  # quality.accuracy_rows
    picks: list  # tables.recommend
    api_checks: list[dict]
    warnings: list[dict]  # every kind, by severity
    expected: predicted.Predictions
    model: dict | None  # run.json's model; None for a run from before models were data
    pick_rows: list[dict]  # the recommendation as rows
    origin: dict  # provenance per host
    losslessness: list[dict]
    fleet: list[dict]  # fleet.rows: each fleet level against its replicas alone
    tuned: list[dict]  # autotune.rows: each host's tuned setting per band (autotune.yml)
    figures: list[plots.Plot] = field(default_factory=list)


def _analyse(
    results: Results,
    results_dir: Path,
    reference: str,
    band_edges: tuple[int, ...],
    slo: dict | None,
    cdf_concurrency: int | None,
) -> _Findings:
    """The summary table, the budget diagnosis, accuracy, the recommendation, API checks, the
    speed model's predictions and every warning; OutputError for a --cdf-concurrency the
    results have no closed-loop level at."""
    table = tables.rows(results, reference, slo)
    closed_levels = sorted({r["concurrency"] for r in tables.closed_loop(table)})
    if cdf_concurrency is not None and cdf_concurrency not in closed_levels:
        raise OutputError(
            f"--cdf-concurrency {cdf_concurrency}: no closed-loop level at that concurrency in "
            f"{results_dir}; the levels are {', '.join(map(str, closed_levels)) or 'none'}"
        )
    diagnosis = sweep.diagnose(tables.closed_loop(table))
    scored = quality.accuracy_rows(results, table, reference)
    worse = {(r["host"], r["config"]) for r in scored if r.get("verdict") == "worse"}
    picks = tables.recommend(table, band_edges, diagnosis, worse, slo)
    api_checks = quality.api_check_rows(results)
    warnings = tables.warnings(results, table, reference, diagnosis, scored, api_checks)
    # The speed model's figure for every level, its warnings among the others by severity.
    expected = predicted.predict(results, table)
    tuned, unread = autotune.rows(results_dir, results.hosts)
    order = {"error": 0, "warning": 1, "info": 2}
    warnings = sorted(
        warnings
        + predicted.all_warnings(expected)
        + [{"severity": "warning", "kind": "autotune", "where": p, "message": p} for p in unread],
        key=lambda w: order[w["severity"]],
    )
    return _Findings(
        results=results,
        results_dir=results_dir,
        reference=reference,
        band_edges=band_edges,
        slo=slo,
        cdf_concurrency=cdf_concurrency,
        table=table,
        diagnosis=diagnosis,
        scored=scored,
        picks=picks,
        api_checks=api_checks,
        warnings=warnings,
        expected=expected,
        model=run_model(results.run),
        pick_rows=tables.picks_table(picks),
        origin=provenance(results),
        losslessness=lossless_rows(results, reference),
        fleet=fleet.rows(results),
        tuned=tuned,
    )


def _figures(found: _Findings, workers: int | None, label: str) -> list[plots.Plot]:
    """Every figure of the results, then the speed model's two."""
    figures = plots.all_plots(
        found.results,
        found.table,
        found.reference,
        workers,
        label,
        found.cdf_concurrency,
        found.slo,
    )
    palette = plots.colors([r["config"] for r in found.table])
    expected = found.expected
    return figures + [
        plot
        for plot in (
            plots.draw(plots.predicted_concurrency, (expected.rows, palette), label),
            plots.draw(plots.predicted_budget, (expected.shapes,), label),
        )
        if plot is not None
    ]


def _write(staging: Staging, found: _Findings, title: str) -> None:
    """Every file of the report, into the staging folder."""
    expected = found.expected
    staging.write("summary.csv", tables.to_csv(found.table))
    staging.write("summary.md", _markdown(found, title))
    staging.write(
        "recommendation.csv", tables.to_csv(found.pick_rows, tables.pick_columns(found.slo))
    )
    staging.write("predicted.csv", tables.to_csv(expected.rows, predicted.COLUMNS))
    staging.write(
        "ddtree_diagnosis.csv", tables.to_csv(expected.shape_table(), predicted.SHAPE_COLUMNS)
    )
    if found.fleet:
        staging.write("fleet.csv", tables.to_csv(found.fleet, fleet.COLUMNS))
    if found.tuned:
        staging.write("autotune.csv", tables.to_csv(found.tuned, autotune.COLUMNS))
    for plot in found.figures:
        staging.write(f"plots/{plot.name}.png", plot.png)
    staging.write("report.html", html.page(title, _sections(found), _meta(found)))
    document = _document(found)
    staging.write("report.json", json.dumps(document, indent=1, default=str) + "\n")


def _title(found: _Findings, label: str) -> str:
    run = found.results.run
    name = run.get("run_id") or found.results_dir.resolve().name
    title = f"Speculative decoding benchmark - {model_title(found.model)} - {name}"
    return f"{label}: {title}" if label else title


def _meta(found: _Findings) -> str:
    """The line under the title: what was read, the reference, when, and the kit."""
    results, run = found.results, found.results.run
    return (
        f"{len(results.levels)} levels, {results.records} request records from "
        f"{results.files} files; hosts: {', '.join(html.esc(h) for h in results.hosts)}; "
        f"reference config: {html.esc(found.reference)}; generated {now()}"
        + (f"; kit {html.esc(run['kit_version'])}" if run.get("kit_version") else "")
    )


def _sections(found: _Findings) -> list[tuple[str, str, str]]:
    """report.html's sections: (anchor, heading, HTML)."""
    results, warnings = found.results, found.warnings
    counts = {s: sum(w["severity"] == s for w in warnings) for s in ("error", "warning", "info")}
    return [
        (
            "warnings",
            f"Warnings ({counts['error']} errors, {counts['warning']} warnings)",
            html.warnings_html(warnings),
        ),
        ("recommendation", "Recommendation", _recommendation_html(found)),
        *(
            [("autotune", "Tuned setting per band (autotune)", _tuned_html(found.tuned))]
            if found.tuned
            else []
        ),
        (
            "plots",
            "Plots",
            '<div class="plots">' + "".join(html.figure_html(p) for p in found.figures) + "</div>",
        ),
        (
            "summary",
            "Summary",
            "<p>One row per host, prompt set, config and concurrency; every column is in "
            "summary.csv. Red: flagged by the losslessness check; yellow: a saturated client, "
            "a crash, failed requests or a collapsed DDTree budget.</p>"
            + html.table_html(found.table, shown_columns(found.table, HTML_COLUMNS), _row_class),
        ),
        ("predicted", "Measured against predicted", _predicted_html(found.expected)),
        (
            "fleet",
            "Fleet behind the router",
            "<p>Each level through SGLang's router against the same prompts sent to each "
            "replica alone at concurrency / replicas: scaling efficiency is the fleet's output "
            "tokens/s over the replicas' sum; balance is the least over the most loaded "
            "replica's requests. Every column is in fleet.csv.</p>"
            + html.table_html(found.fleet, fleet.COLUMNS)
            if found.fleet
            else "<p>No level of these results went through a router.</p>",
        ),
        ("ddtree-diagnosis", "DDTree budget diagnosis", _shapes_html(found.expected)),
        ("lossless", "Losslessness", _lossless_html(found.losslessness)),
        ("accuracy", "Accuracy", _accuracy_html(found.scored, found.reference, results.run)),
        ("api", "API checks", _api_html(found.api_checks)),
        (
            "provenance",
            "Provenance",
            "<h3>Model</h3>" + html.model_html(found.model) + html.provenance_html(found.origin),
        ),
        (
            "run",
            "Run",
            html.json_block(
                {
                    "run": results.run,
                    "results": str(found.results_dir),
                    "files": results.files,
                    "megabytes_read": round(results.bytes_read / 1e6, 1),
                    "schema_versions_read": list(SUPPORTED_SCHEMAS),
                }
            ),
        ),
    ]


def _recommendation_html(found: _Findings) -> str:
    slo = found.slo
    return (
        "".join(
            f"<p><strong>{html.esc(line)}</strong></p>" for line in autotune.stated(found.tuned)
        )
        + "<p>Per host and concurrency band: the config (and DDTree budget) with the highest "
        "mean output tokens/s over the band's levels and prompt sets, among configs whose "
        "losslessness check passed and whose levels all ran cleanly. A DDTree budget whose "
        "accepted tokens per step collapsed at any level of the host is never picked; when "
        "the budget sweep saturates in the band (accepted tokens per step grow less than "
        f"{sweep.SATURATION_GAIN:.0%} for over {sweep.STEP_RISE:.0%} more step time), the "
        f"smallest budget within {sweep.NEAR_BEST:.0%} of the best throughput is "
        "preferred.</p>"
        + (
            f"<p>SLOs: {html.esc(tables.slo_text(slo))}. Only configs whose every level in "
            "the band meets them (the level's percentiles) are candidates; the note names "
            "each config that missed one, with its value and the threshold.</p>"
            if slo
            else ""
        )
        + html.table_html(found.pick_rows, tables.pick_columns(found.slo))
    )


def _lossless_html(losslessness: list[dict]) -> str:
    return (
        "<p>Greedy outputs of each speculative config against the reference, token for "
        "token, on the same prompts.</p>"
        + (
            html.table_html(losslessness, LOSSLESS_COLUMNS)
            if losslessness
            else "<p>No lossless.json found: no config can be recommended.</p>"
        )
    )


def _accuracy_html(scored: list[dict], reference: str, run: dict) -> str:
    if not scored:
        return (
            "<p>No scored prompt set in these results (sets with reference answers, such as "
            "gsm8k and math500, are scored by the benchmark).</p>"
        )
    floors = "".join(
        f"<li>{html.esc(name)}: {floor['floor']:.2f} ({html.esc(floor['source'])})</li>"
        for name, floor in sorted(accuracy_floors(run).items())
    )
    return (
        "<p>Per scored level: answers right, wrong and unanswered (cut off at the token "
        f"budget, or failed). Each config against {html.esc(reference)} on the same prompts, "
        "request by request: prompts only the reference got right, prompts only the config "
        "got right, and the exact two-sided McNemar p-value of those discordant pairs; a "
        f"config significantly worse (p &lt; {quality.SIGNIFICANCE:g}) is warned about "
        "(accuracy_below_ar), and so is a reference below its floor (accuracy_below_floor)."
        "</p>"
        + (f"<p>Floors (run.json model.accuracy_floors)</p><ul>{floors}</ul>" if floors else "")
        + html.table_html(scored, quality.ACCURACY_COLUMNS, _accuracy_class)
    )


def _accuracy_class(row: dict) -> str:
    return "flagged" if row.get("verdict") == "worse" else ""


def _api_html(rows: list[dict]) -> str:
    if not rows:
        return (
            "<p>No api-check.json in these results: the server stage's checks of the OpenAI "
            "API were off, or the run predates them.</p>"
        )
    return (
        "<p>The endpoints users call, checked by the server stage once healthy "
        "(&lt;host&gt;/&lt;config&gt;/api-check.json): /v1/models names the served model, chat "
        "answers streamed and not, a forced tool choice returns a parsed tool call, and "
        "reasoning arrives in its own field. A check whose parser is not configured is not "
        "run.</p>"
        + html.table_html(
            rows, quality.API_CHECK_COLUMNS, lambda r: "flagged" if r["result"] == "failed" else ""
        )
    )


def _row_class(row: dict) -> str:
    if row.get("lossless") == "flagged":
        return "flagged"
    if (
        row.get("client_saturated")
        or row.get("server_crashed")
        or row.get("requests_failed")
        or row.get("budget_diagnosis") == "collapsed"
    ):
        return "warn"
    return ""


def _predicted_html(expected: predicted.Predictions) -> str:
    notes = "".join(
        f"<li>{html.esc(n['note'])} ({html.esc(', '.join(n['where'][:8]))}"
        + (f" and {len(n['where']) - 8} more" if len(n["where"]) > 8 else "")
        + ")</li>"
        for n in expected.note_rows()[:100]
    )
    intro = (
        "<p>Each closed-loop level against the speed model (module_utils/plan/speed_model.py): its "
        "own launch, the host's hardware profile, the level's measured mean context per "
        "request (prompt plus half the output) and concurrency, with the host's speed "
        "calibration and all-reduce check laid over the profile's figures where the run "
        "recorded them (figures). Ratios are measured over predicted: step time (decode time "
        "over verify steps), accepted tokens per step (against the drafter's published "
        "acceptance), tokens/s per request (their quotient) and per server (output tokens/s, "
        "which also pays prefill and the level's ramp). The model's step time does not depend "
        "on acceptance, so the two are judged apart; "
        "tokens_per_s_predicted_at_measured_acceptance is the model's step with the measured "
        f"acceptance. A step more than {predicted.SLOW:.0%} above the model warns "
        "(slower_than_predicted, naming the likely part); acceptance more than "
        f"{1 - predicted.ACCEPT_LOW:.0%} below the published figure warns too "
        "(acceptance_below_published). Every column is in predicted.csv; the plots "
        "predicted_concurrency and predicted_budget draw both.</p>"
    )
    table = (
        html.table_html(
            expected.rows,
            predicted.SHORT_COLUMNS,
            lambda r: "warn" if r.get("slower_than_predicted") else "",
        )
        if expected.rows
        else "<p>No level could be predicted (see the notes).</p>"
    )
    listed = (
        f"<p>Not predicted, or predicted without a record:</p><ul>{notes}</ul>" if notes else ""
    )
    return intro + table + listed


def _shapes_html(expected: predicted.Predictions) -> str:
    if not expected.shapes:
        return "<p>No DDTree sweep of two or more budgets at one level: nothing to diagnose.</p>"
    return (
        "<p>Per host, TP size, prompt set and level: why the larger budgets do or do not pay, "
        "from the two factors of tokens/s past the best budget (the smallest within "
        f"{sweep.NEAR_BEST:.0%} of the highest tokens/s per request). Acceptance collapse: "
        f"accepted tokens per step fall more than {sweep.COLLAPSE_DROP:.0%}; cost growth: they "
        f"hold or rise while step time rises more than {sweep.STEP_RISE:.0%}, which on an MoE "
        "target the speed model predicts from the routed experts a wider verify step touches "
        "(predicted_step_ms, experts_touched_per_layer); saturation: both flat; gain: the "
        "largest budget is still the best. ddtree_diagnosis.csv holds every row.</p>"
        + html.table_html(expected.shape_table(), predicted.SHAPE_COLUMNS)
    )


def _document(found: _Findings) -> dict:
    """report.json: everything the page shows, as data."""
    results, expected = found.results, found.expected
    return {
        "kind": "analysis.report",
        "schema_version": 1,
        "generated_at": now(),
        "results_dir": str(found.results_dir),
        "reference": found.reference,
        "band_edges": list(found.band_edges),
        "slo": dict(found.slo) if found.slo else None,
        "cdf_concurrency": found.cdf_concurrency,
        "inputs": {"files": results.files, "records": results.records, "bytes": results.bytes_read},
        "run": results.run,
        "model": found.model,
        "rows": found.table,
        "recommendation": found.pick_rows,
        "warnings": found.warnings,
        "ddtree_sweep": sweep_rows(found.diagnosis),
        "ddtree_diagnosis": expected.shape_rows(),
        "predicted": {
            "model": expected.model,
            "rows": expected.rows,
            "notes": expected.note_rows(),
        },
        "lossless": found.losslessness,
        "fleet": found.fleet,
        "autotune": found.tuned,
        "accuracy": found.scored,
        "api_checks": found.api_checks,
        "provenance": found.origin,
        "plots": [f"plots/{p.name}.png" for p in found.figures],
    }


def _markdown(found: _Findings, title: str) -> str:
    """summary.md: the recommendation and the summary, then what else the results hold."""
    slo, table = found.slo, found.table
    return (
        f"# {markdown_text(title)}\n\n"
        + (f"SLOs: {tables.slo_text(slo)}\n\n" if slo else "")
        + "## Recommendation\n\n"
        + tables.to_markdown(found.pick_rows, tables.pick_columns(found.slo))
        + "".join(f"\n{markdown_text(line)}\n" for line in autotune.stated(found.tuned))
        + (
            "\n## Tuned setting per band (autotune)\n\n"
            + tables.to_markdown(found.tuned, autotune.COLUMNS)
            if found.tuned
            else ""
        )
        + "\n## Summary\n\n"
        + tables.to_markdown(table, shown_columns(table, tables.MARKDOWN_COLUMNS))
        + _predicted_markdown(found.expected)
        + (
            "\n## Fleet behind the router\n\n" + tables.to_markdown(found.fleet, fleet.COLUMNS)
            if found.fleet
            else ""
        )
        + (
            "\n## Accuracy\n\n" + tables.to_markdown(found.scored, quality.ACCURACY_COLUMNS)
            if found.scored
            else ""
        )
        + (
            "\n## API checks\n\n" + tables.to_markdown(found.api_checks, quality.API_CHECK_COLUMNS)
            if found.api_checks
            else ""
        )
        + (
            "\n## Warnings\n\n"
            + "".join(
                f"- **{w['severity']}** `{w['kind']}` `{markdown_code(w['where'])}`: "
                f"{markdown_text(w['message'])}\n"
                for w in found.warnings
            )
            if found.warnings
            else ""
        )
    )


def _tuned_html(tuned: list[dict]) -> str:
    """The search's pick per host and band, stated as the tuned setting (autotune.yml wrote it
    to host_vars/<host>/autotune.yml); its trials are the configs t001... of this report."""
    return (
        "<p>What autotune found per host and band: the setting with the best goodput under its "
        "SLO, its 95% interval, the runner-up and the margin; <em>within_interval</em> true "
        "means the search could not tell the two apart. The deploy's variables were written "
        "to host_vars/&lt;host&gt;/autotune.yml; each trial is a config (t001, ...) of the "
        "tables below, and results/&lt;run&gt;/&lt;host&gt;/autotune/search.md gives the path "
        "of the search. Every column is in autotune.csv.</p>"
        + html.table_html(tuned, autotune.COLUMNS)
    )


def _predicted_markdown(expected: predicted.Predictions) -> str:
    """summary.md's sections of the speed model: the levels against it, the budget verdicts."""
    return (
        "\n## Measured against predicted\n\n"
        + tables.to_markdown(expected.rows, predicted.SHORT_COLUMNS)
        if expected.rows
        else ""
    ) + (
        "\n## DDTree budget diagnosis\n\n"
        + "".join(
            f"- {markdown_text(s.host)} / tp{s.tp_size} / {markdown_text(s.prompt_set)} / "
            f"c{s.concurrency}: **{sweep.SHAPE_WORDS[s.verdict]}** - {markdown_text(s.explain())}\n"
            for s in expected.shapes
        )
        if expected.shapes
        else ""
    )
