"""report() and compare(): results in, a folder of tables, plots and HTML out.

Nothing that exists is overwritten. The output goes to a fresh folder: --out when given (it
must not exist, or be empty), else `report/` inside the results folder, or `report-2/`,
`report-3/`, ... when the earlier ones hold files. Everything is written to a hidden folder
beside the target first and renamed into place at the end, so a failed run leaves no half
report behind.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ansible.module_utils.contract import metrics

from analysis import comparability, html, plots, predicted, quality, sweep, tables
from analysis.results import (
    DEFAULT_MAX_FILE_BYTES,
    SUPPORTED_SCHEMAS,
    Results,
    accuracy_floors,
    config_order,
    load,
    model_title,
    ratio,
    run_model,
)

MAX_NUMBERED = 1000


class OutputError(Exception):
    """The output folder cannot be used; the message says why and what to do."""


@dataclass
class Outcome:
    out: Path
    files: list[str]
    table: list[dict]
    picks: list
    warnings: list[dict]
    seconds: dict = field(default_factory=dict)
    levels: int = 0
    records: int = 0
    inputs: int = 0
    # report: the speed model's view (report.json's predicted rows and notes, and the DDTree
    # budget diagnosis)
    predicted: dict = field(default_factory=dict)
    # compare: per run ("a", "b") its model and DDTree collapse diagnosis (report.json's)
    diagnosis: dict = field(default_factory=dict)

    @property
    def html(self) -> Path:
        return self.out / (
            "compare.html" if (self.out / "compare.html").exists() else "report.html"
        )


def _empty_dir(path: Path) -> bool:
    try:
        return path.is_dir() and not any(path.iterdir())
    except OSError as error:
        raise OutputError(_cannot_write(path, error)) from None


def _cannot_write(path: Path, error: OSError) -> str:
    """What went wrong writing under --out, in words: a full disk, no permission, a
    read-only file system, or the system's own words for anything else."""
    cause = {
        errno.ENOSPC: "no space left on the device",
        errno.EDQUOT: "the disk quota is used up",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.EROFS: "the file system is read-only",
    }.get(error.errno)
    words = error.strerror or str(error)
    why = f"{words} ({cause})" if cause and cause.lower() != words.lower() else words
    return (
        f"cannot write {path}: {why}; nothing was left behind. Free some space or choose "
        "another --out"
    )


def choose_out(parent: Path, out: Path | str | None, name: str) -> Path:
    """The folder to write: `out` if it is free, else the first free parent/name[-N]."""
    if out is not None:
        out = Path(out)
        if out.exists() and not _empty_dir(out):
            raise OutputError(
                f"{out} already exists and is not empty; nothing there is overwritten. Choose "
                "another --out, or leave it out to get a fresh folder inside the results."
            )
        return out
    for number in range(1, MAX_NUMBERED + 1):
        candidate = parent / (name if number == 1 else f"{name}-{number}")
        if not candidate.exists() or _empty_dir(candidate):
            return candidate
    raise OutputError(f"{parent} already holds {MAX_NUMBERED} {name} folders; use --out")


class Staging:
    """A hidden folder beside the target, renamed onto it when everything is written."""

    def __init__(self, target: Path):
        self.target = target
        self.path = target.parent / f".{target.name}.tmp-{os.getpid()}"
        self.files: list[str] = []

    def __enter__(self):
        try:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            self.path.mkdir()
        except OSError as error:
            raise OutputError(_cannot_write(self.target.parent, error)) from None
        return self

    def write(self, name: str, content: str | bytes) -> None:
        path = self.path / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content, encoding="utf-8")
        except OSError as error:
            # Named as it would have been in the target: the staging folder is removed.
            raise OutputError(_cannot_write(self.target / name, error)) from None
        self.files.append(name)

    def __exit__(self, kind, value, traceback):
        if kind is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            return False
        try:
            if _empty_dir(self.target):
                self.target.rmdir()
            # rename refuses a target that exists and is not empty: a folder someone filled
            # meanwhile is left alone.
            self.path.rename(self.target)
        except OSError as error:
            shutil.rmtree(self.path, ignore_errors=True)
            raise OutputError(
                f"cannot move the report into {self.target}: {error.strerror or error}"
            ) from None
        return False


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def provenance(results: Results) -> dict:
    """Per host: hardware, versions, and per config its launch, once."""
    out: dict[str, dict] = {}
    for level in results.levels:
        info = out.setdefault(
            level.host,
            {
                "profile": tables.profile_of(level.provenance),
                "gpu": level.provenance.get("gpu"),
                "sglang_versions": set(),
                "kit_versions": set(),
                "configs": {},
                "weights": [],
                "prompts": {},
                "first_started": None,
                "last_ended": None,
            },
        )
        p = level.provenance
        info["sglang_versions"].add(p.get("sglang_version"))
        info["kit_versions"].add(p.get("kit_version"))
        launch = p.get("launch") or {}
        if level.config not in info["configs"]:
            info["configs"][level.config] = {**launch, "runtime_detail": p.get("runtime")}
        for weight in p.get("weights") or []:
            if weight not in info["weights"]:
                info["weights"].append(weight)
        prompts = p.get("prompts") or {}
        if prompts.get("sha256"):
            info["prompts"][level.prompt_set] = prompts["sha256"]
        started, ended = p.get("started_at"), p.get("ended_at")
        if isinstance(started, str) and (
            info["first_started"] is None or started < info["first_started"]
        ):
            info["first_started"] = started
        if isinstance(ended, str) and (info["last_ended"] is None or ended > info["last_ended"]):
            info["last_ended"] = ended
    for info in out.values():
        info["sglang_versions"] = sorted(map(str, info["sglang_versions"]))
        info["kit_versions"] = sorted(map(str, info["kit_versions"]))
        info["configs"] = dict(sorted(info["configs"].items(), key=lambda i: config_order(i[0])))
    return dict(sorted(out.items()))


def lossless_rows(results: Results, reference: str) -> list[dict]:
    rows = []
    for host, report in sorted(results.lossless.items()):
        for config, entry in sorted(
            report.get("configs", {}).items(), key=lambda i: config_order(i[0])
        ):
            state = (
                "flagged"
                if entry.get("broken_verification")
                else "passed"
                if entry.get("tokens_compared")
                else "not checked"
            )
            rows.append(
                {
                    "host": host,
                    "config": config,
                    "lossless": state,
                    "mismatch_rate": entry.get("mismatch_rate"),
                    "request_mismatch_rate": entry.get("request_mismatch_rate"),
                    "tokens_compared": entry.get("tokens_compared"),
                    "levels_not_checked": len(entry.get("not_checked") or []),
                    "reference": report.get("reference", reference),
                    "threshold": report.get("threshold"),
                }
            )
    return rows


LOSSLESS_COLUMNS = (
    "host",
    "config",
    "lossless",
    "mismatch_rate",
    "request_mismatch_rate",
    "tokens_compared",
    "levels_not_checked",
    "reference",
    "threshold",
)
# The HTML summary table's columns (module_utils/contract/metrics.py html): always shown.
HTML_COLUMNS = metrics.html_columns()
# Shown beside HTML_COLUMNS where the results have them.
OPTIONAL_HTML_COLUMNS = tuple(
    (m.name, lambda row, m=m: m.shown(row.get(m.name))) for m in metrics.html_optional()
)


def shown_columns(table: list[dict], columns: tuple[str, ...]) -> tuple[str, ...]:
    """columns, then each optional column some row has a value in."""
    extra = tuple(name for name, has in OPTIONAL_HTML_COLUMNS if any(has(r) for r in table))
    return (*columns, *(name for name in extra if name not in columns))


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


def sweep_rows(diagnosis: sweep.Diagnosis) -> list[dict]:
    """Every budget against the next, with its level, figures and verdict (report.json
    ddtree_sweep)."""
    return [
        {
            "host": p.host,
            "tp_size": p.tp_size,
            "prompt_set": p.prompt_set,
            "concurrency": p.concurrency,
            "kind": p.kind,
            **p.figures(),
        }
        for p in diagnosis.pairs
    ]


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
    reference = reference or str(results.run.get("reference_config") or "ar")
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
    order = {"error": 0, "warning": 1, "info": 2}
    warnings = sorted(
        warnings + predicted.all_warnings(expected), key=lambda w: order[w["severity"]]
    )
    seconds["tables"] = time.perf_counter() - clock - seconds["read"]
    figures = plots.all_plots(results, table, reference, workers, label, cdf_concurrency)
    palette = plots.colors([r["config"] for r in table])
    figures += [
        plot
        for plot in (
            plots.draw(plots.predicted_concurrency, (expected.rows, palette), label),
            plots.draw(plots.predicted_budget, (expected.shapes,), label),
        )
        if plot is not None
    ]
    seconds["plots"] = time.perf_counter() - clock - seconds["read"] - seconds["tables"]
    origin = provenance(results)
    losslessness = lossless_rows(results, reference)
    pick_rows = tables.picks_table(picks)
    run = results.run
    model = run_model(run)
    name = run.get("run_id") or results_dir.resolve().name
    title = f"Speculative decoding benchmark - {model_title(model)} - {name}"
    title = f"{label}: {title}" if label else title
    counts = {s: sum(w["severity"] == s for w in warnings) for s in ("error", "warning", "info")}
    meta = (
        f"{len(results.levels)} levels, {results.records} request records from "
        f"{results.files} files; hosts: {', '.join(html.esc(h) for h in results.hosts)}; "
        f"reference config: {html.esc(reference)}; generated {_now()}"
        + (f"; kit {html.esc(run['kit_version'])}" if run.get("kit_version") else "")
    )
    sections = [
        (
            "warnings",
            f"Warnings ({counts['error']} errors, {counts['warning']} warnings)",
            html.warnings_html(warnings),
        ),
        (
            "recommendation",
            "Recommendation",
            "<p>Per host and concurrency band: the config (and DDTree budget) with the highest "
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
            + html.table_html(pick_rows, tables.PICK_COLUMNS),
        ),
        (
            "plots",
            "Plots",
            '<div class="plots">' + "".join(html.figure_html(p) for p in figures) + "</div>",
        ),
        (
            "summary",
            "Summary",
            "<p>One row per host, prompt set, config and concurrency; every column is in "
            "summary.csv. Red: flagged by the losslessness check; yellow: a saturated client, "
            "a crash, failed requests or a collapsed DDTree budget.</p>"
            + html.table_html(table, shown_columns(table, HTML_COLUMNS), _row_class),
        ),
        ("predicted", "Measured against predicted", _predicted_html(expected)),
        ("ddtree-diagnosis", "DDTree budget diagnosis", _shapes_html(expected)),
        (
            "lossless",
            "Losslessness",
            "<p>Greedy outputs of each speculative config against the reference, token for "
            "token, on the same prompts.</p>"
            + (
                html.table_html(losslessness, LOSSLESS_COLUMNS)
                if losslessness
                else "<p>No lossless.json found: no config can be recommended.</p>"
            ),
        ),
        ("accuracy", "Accuracy", _accuracy_html(scored, reference, results.run)),
        ("api", "API checks", _api_html(api_checks)),
        (
            "provenance",
            "Provenance",
            "<h3>Model</h3>" + html.model_html(model) + html.provenance_html(origin),
        ),
        (
            "run",
            "Run",
            html.json_block(
                {
                    "run": run,
                    "results": str(results_dir),
                    "files": results.files,
                    "megabytes_read": round(results.bytes_read / 1e6, 1),
                    "schema_versions_read": list(SUPPORTED_SCHEMAS),
                }
            ),
        ),
    ]
    document = {
        "kind": "analysis.report",
        "schema_version": 1,
        "generated_at": _now(),
        "results_dir": str(results_dir),
        "reference": reference,
        "band_edges": list(band_edges),
        "slo": dict(slo) if slo else None,
        "cdf_concurrency": cdf_concurrency,
        "inputs": {"files": results.files, "records": results.records, "bytes": results.bytes_read},
        "run": run,
        "model": model,
        "rows": table,
        "recommendation": pick_rows,
        "warnings": warnings,
        "ddtree_sweep": sweep_rows(diagnosis),
        "ddtree_diagnosis": expected.shape_rows(),
        "predicted": {
            "model": expected.model,
            "rows": expected.rows,
            "notes": expected.note_rows(),
        },
        "lossless": losslessness,
        "accuracy": scored,
        "api_checks": api_checks,
        "provenance": origin,
        "plots": [f"plots/{p.name}.png" for p in figures],
    }
    markdown = (
        f"# {title}\n\n"
        + (f"SLOs: {tables.slo_text(slo)}\n\n" if slo else "")
        + "## Recommendation\n\n"
        + tables.to_markdown(pick_rows, tables.PICK_COLUMNS)
        + "\n## Summary\n\n"
        + tables.to_markdown(table, shown_columns(table, tables.MARKDOWN_COLUMNS))
        + (
            "\n## Measured against predicted\n\n"
            + tables.to_markdown(expected.rows, predicted.SHORT_COLUMNS)
            if expected.rows
            else ""
        )
        + (
            "\n## DDTree budget diagnosis\n\n"
            + "".join(
                f"- {s.host} / tp{s.tp_size} / {s.prompt_set} / c{s.concurrency}: "
                f"**{sweep.SHAPE_WORDS[s.verdict]}** - {s.explain()}\n"
                for s in expected.shapes
            )
            if expected.shapes
            else ""
        )
        + (
            "\n## Accuracy\n\n" + tables.to_markdown(scored, quality.ACCURACY_COLUMNS)
            if scored
            else ""
        )
        + (
            "\n## API checks\n\n" + tables.to_markdown(api_checks, quality.API_CHECK_COLUMNS)
            if api_checks
            else ""
        )
        + (
            "\n## Warnings\n\n"
            + "".join(
                f"- **{w['severity']}** `{w['kind']}` `{w['where']}`: {w['message']}\n"
                for w in warnings
            )
            if warnings
            else ""
        )
    )
    with Staging(target) as staging:
        staging.write("summary.csv", tables.to_csv(table))
        staging.write("summary.md", markdown)
        staging.write("recommendation.csv", tables.to_csv(pick_rows, tables.PICK_COLUMNS))
        staging.write("predicted.csv", tables.to_csv(expected.rows, predicted.COLUMNS))
        staging.write(
            "ddtree_diagnosis.csv", tables.to_csv(expected.shape_table(), predicted.SHAPE_COLUMNS)
        )
        for plot in figures:
            staging.write(f"plots/{plot.name}.png", plot.png)
        staging.write("report.html", html.page(title, sections, meta))
        staging.write("report.json", json.dumps(document, indent=1, default=str) + "\n")
    seconds["total"] = time.perf_counter() - clock
    return Outcome(
        out=target,
        files=staging.files,
        table=table,
        picks=picks,
        warnings=warnings,
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


# -- compare ---------------------------------------------------------------------------

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
    reference = reference or str(results_b.run.get("reference_config") or "ar")
    table_a = tables.rows(results_a, reference, slo)
    table_b = tables.rows(results_b, reference, slo)
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
            if other is None:
                continue
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
            a_value, b_value = row["output_tokens_per_s"], other["output_tokens_per_s"]
            pair["throughput_ratio"] = ratio(b_value, a_value)
            pair["lossless_a"], pair["lossless_b"] = row["lossless"], other["lossless"]
            pairs.append(pair)
    key = ("prompt_set", "config", "concurrency", "request_rate")
    seen_a = {tuple(r[k] for k in key) for r in table_a}
    seen_b = {tuple(r[k] for k in key) for r in table_b}
    only = {
        "only_in_a": sorted(seen_a - seen_b, key=_unmatched_order),
        "only_in_b": sorted(seen_b - seen_a, key=_unmatched_order),
    }
    columns = (
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
    name_a, name_b = run_a.resolve().name, run_b.resolve().name
    sides = {
        "a": _side("A", name_a, results_a, table_a, reference),
        "b": _side("B", name_b, results_b, table_b, reference),
    }
    warnings = [w for side in sides.values() for w in side["warnings"]]
    warnings = [w for w in warnings if w["severity"] != "info"]
    # What differs between the runs themselves (settings, prompts, weights, runtime, launch,
    # hardware): one warning per field, before anything either run says of itself.
    comparable = comparability.check(results_a, results_b)
    warnings = comparable + warnings
    figure = plots.draw(
        plots.compare_plot, ([p for p in pairs if p["request_rate"] is None],), label
    )
    decompositions = [
        plot
        for key, side in sides.items()
        if (
            plot := plots.draw(
                plots.run_decomposition,
                (tables.closed_loop(side["table"]), key, side["heading"]),
                label,
            )
        )
    ]
    title = (
        f"Benchmark comparison - B: {name_b} ({sides['b']['model_title']}) against A: "
        f"{name_a} ({sides['a']['model_title']})"
    )
    title = f"{label}: {title}" if label else title
    short = (
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
    missing = "".join(
        f"<li>{esc_key(k)} only in {side[-1].upper()}</li>"
        for side in ("only_in_a", "only_in_b")
        for k in only[side][:200]
    )
    sections = [
        ("comparability", "Comparability", html.comparability_section(comparable)),
        ("table", "Side by side", html.table_html(pairs, short)),
        ("plots", "Plots", html.figure_html(figure) if figure else "<p>Nothing in common.</p>"),
        (
            "decomposition",
            "DDTree decomposition, each run",
            "<p>Each run's step time, accepted tokens per step and their quotient (tokens/s "
            "per request) against the DDTree budget, as its own report draws them, side by "
            "side whatever the two runs share.</p>"
            + (
                '<div class="plots">'
                + "".join(html.figure_html(p) for p in decompositions)
                + "</div>"
                if decompositions
                else "<p>Neither run has DDTree levels.</p>"
            )
            + "".join(
                f"<p>{html.esc(side['heading'])}: no DDTree levels.</p>"
                for key, side in sides.items()
                if not any(p.name == f"decomposition-{key}" for p in decompositions)
            ),
        ),
        *(
            (f"diagnosis-{key}", f"Collapse diagnosis, {side['heading']}", _diagnosis_html(side))
            for key, side in sides.items()
        ),
        ("unmatched", "Not in both runs", f"<ul>{missing}</ul>" if missing else "<p>None.</p>"),
        ("warnings", "Warnings", html.warnings_html(warnings)),
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
    meta = (
        f"A: {html.esc(run_a)} ({results_a.records} records); B: {html.esc(run_b)} "
        f"({results_b.records} records); {len(pairs)} levels in both; generated {_now()}"
    )
    document = {
        "kind": "analysis.compare",
        "schema_version": 1,
        "generated_at": _now(),
        "run_a": str(run_a),
        "run_b": str(run_b),
        "reference": reference,
        "slo": dict(slo) if slo else None,
        "rows": pairs,
        **{k: [list(t) for t in v] for k, v in only.items()},
        "warnings": warnings,
        "comparability": comparability.counts(comparable),
        "diagnosis": {key: side["diagnosis"] for key, side in sides.items()},
        "plots": [f"plots/{p.name}.png" for p in ([figure] if figure else []) + decompositions],
    }
    verdicts = "".join(
        f"- {side['heading']}: {side['diagnosis']['verdict']}\n" for side in sides.values()
    )
    with Staging(target) as staging:
        staging.write("compare.csv", tables.to_csv(pairs, columns))
        staging.write(
            "compare.md",
            f"# {title}\n\n## Comparability\n\n{_comparability_markdown(comparable)}\n"
            f"## DDTree collapse diagnosis\n\n{verdicts}\n## Side by side\n\n"
            + tables.to_markdown(pairs, short),
        )
        for plot in ([figure] if figure else []) + decompositions:
            staging.write(f"plots/{plot.name}.png", plot.png)
        staging.write("compare.html", html.page(title, sections, meta))
        staging.write("report.json", json.dumps(document, indent=1, default=str) + "\n")
    return Outcome(
        out=target,
        files=staging.files,
        table=pairs,
        picks=[],
        warnings=warnings,
        seconds={"total": time.perf_counter() - clock},
        levels=len(pairs),
        records=results_a.records + results_b.records,
        inputs=results_a.files + results_b.files,
        diagnosis=document["diagnosis"],
    )


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
