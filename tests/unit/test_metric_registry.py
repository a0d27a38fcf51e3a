"""The metric registry (module_utils/contract/metrics.py) and the schemas made from data
(module_utils/contract/{level,run,plan}_schema.py): the analysis's column lists, formats and
plot labels are the ones it had when each was written out by hand, the committed schema files
are the generated ones, real documents follow them, and a metric is added with one entry."""

from __future__ import annotations

import csv
import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.module_utils.contract import (
    level_schema,
    metrics,
    plan_schema,
    run_schema,
    schema_files,
)
from jsonschema import Draft202012Validator

import analysis
from analysis import canvas, html, plots, repeats, results, results_schema, tables
from tests.support.results_tree import (
    CHAIN_CONTROL,
    GPU_SUMMARY,
    Plan,
    Sim,
    ddtree_sweep,
    write_run,
)

report_module = importlib.import_module("analysis.report")
compare_module = importlib.import_module("analysis.report_compare")

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "docs" / "schema"

# -- today's lists, as they were written out by hand ----------------------------------------

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
    "output_tokens_per_s_ci95_low",
    "output_tokens_per_s_ci95_high",
    "goodput_requests_per_s",
    "goodput_requests_per_s_ci95_low",
    "goodput_requests_per_s_ci95_high",
    "slo_met",
    "speedup_vs_ar",
    "chain_control",
    "speedup_vs_chain",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "ttft_ms_p99_ci95_low",
    "ttft_ms_p99_ci95_high",
    "tpot_ms_p50",
    "tpot_ms_p50_ci95_low",
    "tpot_ms_p50_ci95_high",
    "tpot_ms_p99",
    "itl_ms_p50",
    "itl_ms_p99",
    "e2e_ms_p50",
    "e2e_ms_p99",
    "accept_length_mean",
    "step_ms",
    "accepted_tokens_per_step",
    "budget_diagnosis",
    "tokens_per_s_per_user",
    "tokens_per_s_per_gpu",
    "gpu_power_w_mean",
    "output_tokens_per_joule",
    "gpus",
    "requests_ok",
    "requests_failed",
    "client_saturated",
    "server_crashed",
    "lossless",
    "mismatch_rate",
    "accuracy",
    "accuracy_n",
    "accuracy_unanswered",
    "request_rate",
    "workload",
    "repeats",
    "under_filled",
)
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
    "output_tokens_per_joule",
    "lossless",
)
REPEAT_METRICS = (
    "output_tokens_per_s",
    "speedup_vs_ar",
    "accuracy",
    "accept_length_mean",
    "step_ms",
    "accepted_tokens_per_step",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "tpot_ms_p50",
    "tpot_ms_p99",
    "itl_ms_p50",
    "itl_ms_p99",
    "e2e_ms_p50",
    "e2e_ms_p99",
    "output_tokens_per_joule",
    "goodput_requests_per_s",
)
IDENTITY = {
    "tp_size",
    "ddtree_budget",
    "verify_tokens_per_step",
    "concurrency",
    "gpus",
    "request_rate",
    "accuracy_n",
    "repeats",
}
HTML_COLUMNS = (
    *MARKDOWN_COLUMNS[:-1],
    "tokens_per_s_per_user",
    "tokens_per_s_per_gpu",
    "requests_failed",
    "client_saturated",
    "lossless",
    "accuracy",
)
OPTIONAL_HTML_COLUMNS = (
    "output_tokens_per_s_ci95_low",
    "output_tokens_per_s_ci95_high",
    "request_rate",
    "workload",
    "repeats",
    "under_filled",
    "goodput_requests_per_s",
    "goodput_requests_per_s_ci95_low",
    "goodput_requests_per_s_ci95_high",
    "slo_met",
    "gpu_power_w_mean",
)
COMPARED = (
    "output_tokens_per_s",
    "accuracy",
    "speedup_vs_ar",
    "accept_length_mean",
    "step_ms",
    "accepted_tokens_per_step",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "tpot_ms_p50",
    "tpot_ms_p99",
)
TEXT_COLUMNS = {
    "host",
    "profile",
    "prompt_set",
    "config",
    "lossless",
    "note",
    "band",
    "levels",
    "chain_control",
    "budget_diagnosis",
    "scorer",
    "verdict",
    "check",
    "result",
    "found",
    "expected",
    "fix",
    "figures",
    "acceptance_source",
    "slower_than_predicted",
    "budgets",
    "explanation",
}
# Every axis label the report's and compare's figures drew before the registry.
AXIS_LABELS = {
    "DDTree budget",
    "DDTree node budget",
    "ITL ms (p99 solid, p50 dashed)",
    "ITL per token (ms)",
    "TPOT ms (p99 solid, p50 dashed)",
    "TTFT ms (p99 solid, p50 dashed)",
    "TTFT p99 (ms)",
    "TTFT per request (ms)",
    "accept length (tokens per verify step)",
    "accept length per request",
    "accepted tokens per step",
    "accepted tokens per step, B / A",
    "concurrency",
    "concurrency (requests in flight)",
    "decode tokens/s per request",
    "mean end-to-end latency per request (s)",
    "output tokens/s",
    "output tokens/s (server)",
    "output tokens/s per GPU",
    "output tokens/s, B / A",
    "request rate (requests/s, Poisson arrivals)",
    "share at or below",
    "speedup over ar (output tokens/s)",
    "step time (ms per verify step)",
    "step time, B / A",
    "step time, ms",
    "tokens/s per request",
    "tokens/s per user (1000 / mean TPOT)",
}


def test_the_derived_column_lists_are_the_ones_written_out_before():
    assert tables.COLUMNS == COLUMNS
    assert tables.CI_METRICS == (
        "output_tokens_per_s",
        "goodput_requests_per_s",
        "ttft_ms_p99",
        "tpot_ms_p50",
    )
    assert tables.MARKDOWN_COLUMNS == MARKDOWN_COLUMNS
    assert tables.REPEAT_METRICS == REPEAT_METRICS
    assert set(repeats._IDENTITY) == IDENTITY
    assert tables.SLO_METRICS == ("ttft", "itl", "tpot", "e2e")
    assert tables.SLO_STATS == ("p50", "p90", "p99")
    assert report_module.HTML_COLUMNS == HTML_COLUMNS
    assert tuple(n for n, _ in report_module.OPTIONAL_HTML_COLUMNS) == OPTIONAL_HTML_COLUMNS
    assert compare_module.COMPARED == COMPARED
    assert set(html.TEXT_COLUMNS) == TEXT_COLUMNS
    assert results_schema._LATENCIES == ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")
    assert plots.LATENCY_METRICS == (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("tpot_ms", "TPOT"))


def test_the_optional_html_columns_show_as_they_did():
    shown = {name: has for name, has in report_module.OPTIONAL_HTML_COLUMNS}
    assert not shown["request_rate"]({"request_rate": None}) and shown["request_rate"](
        {"request_rate": 2}
    )
    assert not shown["workload"]({"workload": ""}) and shown["workload"]({"workload": "isl1-osl2"})
    assert not shown["repeats"]({"repeats": 1}) and not shown["repeats"]({"repeats": None})
    assert shown["repeats"]({"repeats": 2})
    assert not shown["under_filled"]({"under_filled": False})
    assert shown["under_filled"]({"under_filled": True})
    assert shown["slo_met"]({"slo_met": False}) and not shown["slo_met"]({})


@pytest.mark.parametrize(
    ("column", "text"),
    [
        ("speedup_vs_ar", "1.235"),
        ("speedup_vs_chain", "1.235"),
        ("mismatch_rate", "1.2346"),
        ("accuracy", "1.235"),
        ("reference_accuracy", "1.235"),
        ("p_value", "1.23"),
        ("output_tokens_per_s", "1.23"),
        ("", "1.23"),
    ],
)
def test_number_formats_are_the_ones_written_out_before(column, text):
    assert tables.fmt(1.23456, column) == text
    assert tables.fmt(12345.678, "output_tokens_per_s") == "12345.7"


def drawn_labels(run) -> set[str]:
    """Every x and y label the figures drawn by run() carry (PNG encoding skipped)."""
    seen: set[str] = set()
    real = canvas.png

    def record(figure, *args, **kwargs):
        for axis in figure.axes:
            seen.update(t for t in (axis.get_xlabel(), axis.get_ylabel()) if t)
        return b""

    canvas.png = record
    try:
        run()
    finally:
        canvas.png = real
    return seen


def rich_plan(**changes) -> Plan:
    """Two hosts, the chain control and a DDTree sweep, repeats, a rate level, telemetry:
    every figure the report and compare draw."""
    configs = {
        "ar": Sim(step_ms=20.0),
        CHAIN_CONTROL: Sim(step_ms=29.0, accept=4.4),
        **ddtree_sweep({8: (28.0, 5.0), 16: (30.0, 6.0)}),
    }
    settings = {
        "hosts": {"node-a": "ct200", "node-b": "h200"},
        "configs": configs,
        "concurrency": (1, 4),
        "num_prompts": 4,
        "max_new_tokens": 32,
        "repeats": 2,
        "request_rates": (2.0,),
        "gpu": dict.fromkeys(configs, GPU_SUMMARY),
    }
    return Plan(**{**settings, **changes})


def test_the_plots_axis_labels_are_the_ones_written_out_before(tmp_path):
    a = write_run(tmp_path / "a", rich_plan())
    b = write_run(tmp_path / "b", rich_plan())
    labels = drawn_labels(
        lambda: (
            analysis.report(a, out=tmp_path / "report", workers=1),
            analysis.compare(a, b, out=tmp_path / "compare", workers=1),
        )
    )
    assert labels == AXIS_LABELS


# -- the registry's own rules ---------------------------------------------------------------


def test_every_derived_entry_names_the_analysis_function_that_computes_it():
    for entry in metrics.METRICS:
        if entry.kind not in (metrics.DERIVED, metrics.FLAG) and entry.computed_by is None:
            continue
        assert entry.computed_by, entry.name
        module, _, name = entry.computed_by.rpartition(".")
        assert module.startswith("analysis."), entry
        assert callable(getattr(importlib.import_module(module), name, None)), entry


def test_every_entry_is_well_formed():
    names = [m.name for m in metrics.METRICS]
    assert len(names) == len(set(names))
    fields = {f.name: f for f in metrics.SUMMARY}
    stats = list(level_schema.STAT["properties"])
    assert tuple(s for s in stats if s.startswith("p")) == metrics.PERCENTILES
    for entry in metrics.METRICS:
        assert entry.kind in (metrics.IDENTITY, metrics.MEASURED, metrics.DERIVED, metrics.FLAG)
        assert entry.group in metrics.GROUPS, entry
        assert entry.html in (metrics.LEAD, metrics.ALWAYS, metrics.PRESENT, metrics.EXTRA, "no")
        assert entry.better in ("higher", "lower", None), entry
        assert (entry.kind == metrics.MEASURED) == (entry.field is not None), entry
        if entry.kind == metrics.MEASURED:
            # A MEASURED column reads a summary field the writer writes.
            assert entry.field in fields, entry
            assert (entry.stat is not None) == fields[entry.field].distribution, entry
            assert entry.stat is None or entry.stat in stats, entry
        if entry.interval_of:
            assert entry.interval_of in names, entry
    # Only summary.csv's columns come before the rows-only ones.
    kept = [m.csv for m in metrics.METRICS]
    assert kept == sorted(kept, reverse=True)


def test_a_row_holds_every_registry_column(tmp_path):
    root = write_run(tmp_path / "run", Plan(configs={"ar": Sim(), "dflash": Sim(accept=4.0)}))
    table = tables.rows(results.load(root))
    extra = ["slo_values", "file", "files", "repeat_values"]
    assert all(list(row) == [*metrics.columns(), *extra] for row in table)


# -- schemas --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(schema_files.FILES))
def test_the_committed_schema_is_the_generated_one(name):
    committed = (SCHEMAS / name).read_text(encoding="utf-8")
    assert committed == schema_files.FILES[name](), (
        f"docs/schema/{name} differs from module_utils/contract/: run `make schema` and "
        "commit the result"
    )
    Draft202012Validator.check_schema(json.loads(committed))


def test_schema_files_writes_every_file(tmp_path):
    written = schema_files.write(str(tmp_path))
    assert sorted(Path(p).name for p in written) == sorted(schema_files.FILES)
    for path in written:
        assert Path(path).read_text() == (SCHEMAS / Path(path).name).read_text()


def test_the_level_summary_comes_from_the_registry():
    summary = level_schema.schema()["$defs"]["summary"]
    assert list(summary["properties"]) == [f.name for f in metrics.SUMMARY]
    assert level_schema.schema() == level_schema.schema()  # fresh copies, never shared
    level_schema.schema()["$defs"]["summary"]["properties"].clear()
    assert level_schema.schema()["$defs"]["summary"]["properties"]


def test_the_analysis_validates_levels_with_the_schema_data():
    validator = results.level_validator()
    assert validator.schema == results.tightened(level_schema.schema())


def test_run_json_as_the_results_trees_write_it_follows_its_schema(tmp_path):
    root = write_run(tmp_path / "run", rich_plan(hosts={"node-a": "ct200"}, gpu={}))
    document = json.loads((root / "run.json").read_text())
    assert list(Draft202012Validator(run_schema.schema()).iter_errors(document)) == []
    broken = {**document, "repeats": 0, "telemetry": "sometimes"}
    del broken["run_id"]
    found = {e.message for e in Draft202012Validator(run_schema.schema()).iter_errors(broken)}
    assert len(found) == 3, found


def test_run_json_as_the_role_writes_it_at_its_end_follows_its_schema(tmp_path):
    root = write_run(tmp_path / "run", Plan(configs={"ar": Sim()}))
    document = {
        **json.loads((root / "run.json").read_text()),
        "max_concurrency": 0,
        "rate_duration_s": 60,
        "requests_per_concurrency": 10,
        "level_time_budget_s": 1200,
        "workloads": ["isl1024-osl256"],
        "telemetry": "auto",
        "lock": None,
        "status": {"node-a": {"ar": {"status": "ok", "output_tokens_per_s": {"gsm8k": {}}}}},
        "broken_verification": {"node-a": []},
    }
    assert list(Draft202012Validator(run_schema.schema()).iter_errors(document)) == []


def test_the_readers_run_schema_is_a_part_of_the_writers():
    """Every field the report reads is one the writer's schema describes, with the reader's
    type and bounds (the writer's may be tighter)."""
    written = run_schema.schema()["properties"]
    for name, read in results.RUN_SCHEMA["properties"].items():
        for keyword, value in read.items():
            if keyword != "properties":
                assert written[name][keyword] == value, (name, keyword)
    # The model the report reads is the writer's definition itself.
    assert results.RUN_SCHEMA["properties"]["model"] is run_schema.MODEL
    assert written["model"] == run_schema.MODEL


# Fields plan.json gained after the stored plans were written (tests/fixtures/plans-kimi-k2.6,
# README.md there; tests/integration/test_plan.py ADDED_BY_MODEL_DATA).
ADDED_SINCE = (
    "model",
    "study_lock",
    "ddtree_rules",
    "speed",
    "download_time",
    "download_estimate",
    "disk",
)
LAUNCH_ADDED_SINCE = ("tp_size", "capacity")


@pytest.mark.parametrize("profile", ["b200", "b300", "ct200", "h200"])
def test_the_stored_plans_follow_the_plan_schema_but_for_later_fields(profile):
    schema = plan_schema.schema()
    schema["required"] = [k for k in schema["required"] if k not in ADDED_SINCE]
    launch = schema["properties"]["serving_configs"]["additionalProperties"]["properties"]
    items = launch["launch"]["items"]
    items["required"] = [k for k in items["required"] if k not in LAUNCH_ADDED_SINCE]
    plan = json.loads(
        (REPO / "tests" / "fixtures" / "plans-kimi-k2.6" / f"{profile}.json").read_text()
    )
    assert list(Draft202012Validator(schema).iter_errors(plan)) == []
    plan["serving_configs"]["ar"]["launch"][0]["argv"] = []
    del plan["hub"]
    assert len(list(Draft202012Validator(schema).iter_errors(plan))) == 2


# -- adding a metric ------------------------------------------------------------------------

NEW_METRIC = """
METRICS = (
    *METRICS,
    Metric(
        "spec_accept_length_mean",
        MEASURED,
        "speculation",
        field="spec_accept_length_mean",
        better="higher",
        label="SGLang's accept length",
        compared=True,
        html=ALWAYS,
    ),
)
"""


def test_a_metric_is_one_registry_entry(tmp_path):
    """spec_accept_length_mean, which the writer already puts in the level summary, reaches
    summary.csv, the report's HTML table and compare's output with one entry appended to a
    copy of the registry, and nothing else changed."""
    copy = tmp_path / "kit"
    for folder in ("module_utils", "analysis"):
        shutil.copytree(REPO / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    # The models' published figures the report reads; data, not code.
    (copy / "models").symlink_to(REPO / "models")
    registry = copy / "module_utils" / "contract" / "metrics.py"
    registry.write_text(registry.read_text() + NEW_METRIC)
    configs = {"ar": Sim(step_ms=20.0), "dflash": Sim(step_ms=26.0, accept=5.0)}
    plan = Plan(configs=configs, concurrency=(1, 4), num_prompts=4, max_new_tokens=32)
    a, b = write_run(tmp_path / "a", plan), write_run(tmp_path / "b", plan)

    def analysis_of(*argv: str) -> None:
        run = subprocess.run(
            [sys.executable, "-m", "analysis", *argv, "--workers", "1"],
            cwd=copy,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stdout + run.stderr

    analysis_of("report", str(a), "--out", str(tmp_path / "report"))
    analysis_of("compare", str(a), str(b), "--out", str(tmp_path / "compare"))
    with open(tmp_path / "report" / "summary.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert rows[0].keys() >= {"spec_accept_length_mean"}
    dflash = [r for r in rows if r["config"] == "dflash"]
    assert dflash and all(float(r["spec_accept_length_mean"]) > 1 for r in dflash)
    page = (tmp_path / "report" / "report.html").read_text()
    assert '<th class="">spec_accept_length_mean</th>' in page
    with open(tmp_path / "compare" / "compare.csv", newline="", encoding="utf-8") as handle:
        pairs = list(csv.DictReader(handle))
    assert {"spec_accept_length_mean_a", "spec_accept_length_mean_b"} <= pairs[0].keys()
    assert any(p["spec_accept_length_mean_a"] for p in pairs)
    # The kit itself is unchanged: the column is the copy's alone.
    assert "spec_accept_length_mean" not in tables.COLUMNS


def test_docs_analysis_names_every_summary_column():
    text = (REPO / "docs" / "analysis.md").read_text()
    for name in metrics.csv_columns():
        low = name.removesuffix("_high") + "_low"
        assert f"`{name}`" in text or (name.endswith("_high") and f"`{low}`/`_high`" in text), name
