"""Issue 19 in the analysis: latency columns and plots, SLOs and goodput, rate and repeated
levels, under-filled levels, workloads and GPU telemetry columns, on result trees with known
answers (tests/support/results_tree.py)."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest

import analysis
from analysis import plots, plots_latency, tables
from analysis.__main__ import main
from analysis.results import ResultsError, load
from tests.support.report_check import check_report, png_size
from tests.support.results_tree import GPU_SUMMARY, Plan, Sim, write_run

pytestmark = pytest.mark.analysis
REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "docs" / "schema" / "level.schema.json").read_text())


def schema_has(*fields: str) -> bool:
    known = set(SCHEMA["properties"]) | set(SCHEMA["$defs"]["summary"]["properties"])
    return set(fields) <= known


needs_schema = pytest.mark.skipif(
    not schema_has("request_rate", "repeat", "repeats", "fill", "workload", "gpu"),
    reason="docs/schema/level.schema.json does not describe issue 19's level fields yet",
)


def csv_rows(out: Path, name: str = "summary.csv") -> list[dict]:
    with open(out / name, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def find(rows: list[dict], **match) -> dict:
    found = [r for r in rows if all(str(r[k]) == str(v) for k, v in match.items())]
    assert len(found) == 1, (match, found)
    return found[0]


# Two configs of known TPOT: "slow" decodes at 20 ms a token but starts at once, so it has
# the higher throughput; "fast" decodes at 7.6 ms a token after a 3 s prefill.
SLO_CONFIGS = {
    "ar": Sim(step_ms=20.0, prefill_ms=50.0),
    "fast": Sim(step_ms=7.6, prefill_ms=3000.0),
}


@pytest.fixture(scope="module")
def two_tpots(tmp_path_factory):
    root = tmp_path_factory.mktemp("slo") / "run"
    plan = Plan(configs=dict(SLO_CONFIGS), concurrency=(1, 4), num_prompts=8, max_new_tokens=64)
    write_run(root, plan)
    return root


def test_an_slo_on_tpot_marks_and_recommends_only_the_config_that_meets_it(two_tpots, tmp_path):
    plain = analysis.report(two_tpots, out=tmp_path / "plain")
    assert {p.config for p in plain.picks} == {"ar"}  # the higher throughput, without SLOs
    assert all(r["slo_met"] == "" for r in csv_rows(plain.out))

    outcome = analysis.report(two_tpots, out=tmp_path / "slo", slo={"tpot_ms_p99": 10.0})
    document = check_report(outcome.out)
    assert document["slo"] == {"tpot_ms_p99": 10.0}
    rows = csv_rows(outcome.out)
    for concurrency in (1, 4):
        slow, fast = (find(rows, config=c, concurrency=concurrency) for c in ("ar", "fast"))
        assert float(slow["tpot_ms_p99"]) == pytest.approx(20.0, abs=0.01)
        assert float(fast["tpot_ms_p99"]) == pytest.approx(7.6, abs=0.01)
        assert (slow["slo_met"], fast["slo_met"]) == ("false", "true")
        # Every fast request meets 10 ms; no slow one does.
        assert float(slow["goodput_requests_per_s"]) == 0.0
        level = json.loads(
            (two_tpots / "node-a" / "fast" / "gsm8k" / f"c{concurrency}.json").read_text()
        )
        expected = level["summary"]["requests_ok"] / level["summary"]["duration_s"]
        assert float(fast["goodput_requests_per_s"]) == pytest.approx(expected, rel=1e-6)
    assert [p.config for p in outcome.picks] == ["fast", "fast"]
    for pick in outcome.picks:
        assert "ar missed the SLOs: tpot_ms_p99 20.0 > 10 ms" in pick.note, pick.note
        misses = pick.slo_rejected["ar"]
        assert {m["key"] for m in misses} == {"tpot_ms_p99"}
        assert all(m["threshold"] == 10.0 and m["value"] > 19.9 for m in misses)
    assert "tpot_ms_p99 &lt;= 10 ms" in (outcome.out / "report.html").read_text()


def test_when_no_config_meets_the_slos_the_recommendation_says_so(two_tpots, tmp_path):
    outcome = analysis.report(two_tpots, out=tmp_path / "r", slo={"tpot_ms_p99": 5.0})
    assert [p.config for p in outcome.picks] == [None, None]
    for pick in outcome.picks:
        assert pick.note.startswith("no config met the SLOs (tpot_ms_p99 <= 5 ms)"), pick.note
        assert set(pick.slo_rejected) == {"ar", "fast"}


def test_goodput_counts_each_requests_own_latencies(two_tpots):
    """TTFT of the fast config is 3 s; a TTFT bound of 1 s leaves it no good request, and the
    slow config's every request has a TTFT of 50 ms but a TPOT over 10 ms."""
    results = load(two_tpots)
    table = tables.rows(results, "ar", {"ttft_ms_p99": 1000.0})
    fast = [r for r in table if r["config"] == "fast"]
    slow = [r for r in table if r["config"] == "ar"]
    assert all(r["goodput_requests_per_s"] == 0.0 and r["slo_met"] is False for r in fast)
    assert all(r["goodput_requests_per_s"] > 0 and r["slo_met"] is True for r in slow)
    both = tables.rows(results, "ar", {"ttft_ms_p99": 1000.0, "itl_ms_p50": 10.0})
    assert all(r["goodput_requests_per_s"] == 0.0 for r in both)


def test_latency_columns_come_from_the_level_summary(two_tpots, tmp_path):
    outcome = analysis.report(two_tpots, out=tmp_path / "r")
    with open(outcome.out / "summary.csv", encoding="utf-8") as handle:
        header = next(csv.reader(handle))
    at = header.index("tpot_ms_p99")
    assert header[at + 1 : at + 5] == ["itl_ms_p50", "itl_ms_p99", "e2e_ms_p50", "e2e_ms_p99"]
    rows = csv_rows(outcome.out)
    for config in ("ar", "fast"):
        level = json.loads((two_tpots / "node-a" / config / "gsm8k" / "c4.json").read_text())
        row = find(rows, config=config, concurrency=4)
        for metric in ("itl_ms", "e2e_ms"):
            for stat in ("p50", "p99"):
                expected = level["summary"][metric][stat]
                assert float(row[f"{metric}_{stat}"]) == pytest.approx(expected, rel=1e-6)


def test_the_latency_plots_exist_in_the_report(two_tpots, tmp_path):
    outcome = analysis.report(two_tpots, out=tmp_path / "r")
    document = check_report(outcome.out)
    page = (outcome.out / "report.html").read_text()
    for name in ("latency", "throughput_latency", "latency_cdf"):
        assert f"plots/{name}.png" in document["plots"]
        assert f'id="plot-{name}"' in page
        width, height = png_size((outcome.out / "plots" / f"{name}.png").read_bytes())
        assert width > 300 and height > 200
    assert "rate" not in [Path(p).stem for p in document["plots"]]  # no rate levels


def test_the_cdfs_read_each_tokens_gap_at_the_chosen_level(two_tpots):
    results = load(two_tpots)
    samples = plots.cdf_samples(results, {"node-a": "node-a"}, 4)
    slow, fast = samples["node-a"]["ar"], samples["node-a"]["fast"]
    # 8 requests, 63 tokens after the first each, one token an event.
    assert len(slow["itl"]) == len(fast["itl"]) == 8 * 63
    assert all(v == pytest.approx(20.0, abs=0.01) for v in slow["itl"])
    assert all(v == pytest.approx(7.6, abs=0.01) for v in fast["itl"])
    assert len(fast["ttft"]) == 8 and min(fast["ttft"]) >= 3000.0
    table = tables.rows(results)
    assert plots.cdf_level(table) == 4 and plots.cdf_level(table, 1) == 1
    assert plots.cdf_level(table, 3) is None
    plot = plots.latency_cdf(samples, 4, plots.colors(["ar", "fast"]))
    assert plot.details["concurrency"] == 4
    assert plot.details["counts"]["node-a"]["fast"] == {"ttft": 8, "itl": 8 * 63}


def test_the_command_line_takes_slo_and_cdf_concurrency(two_tpots, tmp_path, capsys):
    out = tmp_path / "cli"
    code = main(
        [
            "report",
            str(two_tpots),
            "--out",
            str(out),
            "--slo",
            "tpot_ms_p99=10",
            "--cdf-concurrency",
            "1",
        ]
    )
    assert code == 0
    assert "SLOs: tpot_ms_p99 <= 10 ms" in capsys.readouterr().out
    document = json.loads((out / "report.json").read_text())
    assert document["slo"] == {"tpot_ms_p99": 10.0} and document["cdf_concurrency"] == 1
    assert {r["config"] for r in document["rows"] if r["slo_met"]} == {"fast"}
    code = main(["report", str(two_tpots), "--out", str(tmp_path / "x"), "--cdf-concurrency", "3"])
    assert code == 2
    assert "--cdf-concurrency 3: no closed-loop level" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("foo_ms_p99=10", "unknown metric 'foo'"),
        ("ttft_ms_p95=10", "statistic 'p95' is not recorded"),
        ("ttft_ms_p99=-5", "must be a positive number"),
        ("ttft_ms_p99=0", "must be a positive number"),
        ("ttft_ms_p99=abc", "must be a positive number"),
        ("", "--slo is empty"),
        ("ttft_ms_p99", "has no '=VALUE'"),
        ("ttft_ms_p99=10,", "has an empty entry"),
        ("ttft_ms_p99=10,ttft_ms_p99=20", "'ttft_ms_p99' is given twice"),
        ("ttft_p99=10", "is not <metric>_ms_<stat>"),
    ],
)
@pytest.mark.parametrize("command", ["report", "compare"])
def test_a_bad_slo_exits_2_naming_what_was_wrong(two_tpots, tmp_path, capsys, text, words, command):
    places = [str(two_tpots)] * (1 if command == "report" else 2)
    with pytest.raises(SystemExit) as stopped:
        main([command, *places, "--out", str(tmp_path / "o"), "--slo", text])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert words in error, error
    if "given twice" not in words:
        assert "ttft, itl, tpot, e2e" in error and "p50, p90, p99" in error, error
    assert not (tmp_path / "o").exists()


def test_parse_slo_reads_every_metric_and_statistic():
    assert tables.parse_slo(" ttft_ms_p99=2000 , tpot_ms_p99=33,e2e_ms_p50=1.5,itl_ms_p90=40") == {
        "ttft_ms_p99": 2000.0,
        "tpot_ms_p99": 33.0,
        "e2e_ms_p50": 1.5,
        "itl_ms_p90": 40.0,
    }


# -- repeats ---------------------------------------------------------------------------


@pytest.mark.parametrize("level_fields", [True, False], ids=["fields", "file-names-only"])
def test_repeats_are_averaged_with_a_student_t_interval(tmp_path, level_fields):
    if level_fields and not schema_has("repeat", "repeats"):
        pytest.skip("the schema does not describe repeat and repeats yet")
    plan = Plan(
        configs={"ar": Sim(step_ms=20.0), "dflash": Sim(step_ms=26.0, accept=4.0)},
        concurrency=(1, 4),
        num_prompts=8,
        max_new_tokens=32,
        jitter=0.3,
        repeats=3,
        level_fields=level_fields,
    )
    root = write_run(tmp_path / "run", plan)
    assert (root / "node-a" / "ar" / "gsm8k" / "c4.rep3.json").is_file()
    outcome = analysis.report(root)
    rows = csv_rows(outcome.out)
    assert len(rows) == 4  # one row per level, not per repeat
    for config in ("ar", "dflash"):
        row = find(rows, config=config, concurrency=4)
        files = ["c4.json", "c4.rep2.json", "c4.rep3.json"]
        values = [
            json.loads((root / "node-a" / config / "gsm8k" / f).read_text())["summary"][
                "output_tokens_per_s"
            ]
            for f in files
        ]
        assert row["repeats"] == "3"
        mean = sum(values) / 3
        assert float(row["output_tokens_per_s"]) == pytest.approx(mean, rel=1e-6)
        spread = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
        half = 4.303 * spread / math.sqrt(3)  # t(0.975, 2 degrees of freedom)
        assert float(row["output_tokens_per_s_ci95_low"]) == pytest.approx(mean - half, rel=1e-5)
        assert float(row["output_tokens_per_s_ci95_high"]) == pytest.approx(mean + half, rel=1e-5)
        for metric in ("tpot_ms_p50", "ttft_ms_p99"):
            low, high = float(row[f"{metric}_ci95_low"]), float(row[f"{metric}_ci95_high"])
            assert low <= float(row[metric]) <= high
    assert outcome.picks and all(p.config for p in outcome.picks)


def test_one_run_has_no_interval():
    plan_rows = [{"output_tokens_per_s": 5.0}]
    assert tables.mean_interval([5.0]) is None and plan_rows
    assert tables.welch_interval([1.0, 2.0], [3.0]) is None
    low, high = tables.welch_interval([10.0, 12.0, 11.0], [10.5, 11.5, 11.0])
    assert low < 0 < high
    low, high = tables.welch_interval([10.0, 10.2, 10.1], [20.0, 20.3, 20.1])
    assert low > 0


def test_compare_says_when_a_difference_is_within_the_interval(tmp_path):
    configs = {"ar": Sim(step_ms=20.0), "dflash": Sim(step_ms=26.0, accept=4.0)}
    common = dict(concurrency=(1, 4), num_prompts=8, max_new_tokens=32, jitter=0.3, repeats=3)
    common["level_fields"] = schema_has("repeat", "repeats")
    run_a = write_run(tmp_path / "a", Plan(configs=configs, seed=1, **common))
    run_b = write_run(tmp_path / "b", Plan(configs=configs, seed=2, **common))
    faster = {
        name: Sim(step_ms=sim.step_ms / 2, accept=sim.accept) for name, sim in configs.items()
    }
    run_c = write_run(tmp_path / "c", Plan(configs=faster, seed=3, **common))
    same = analysis.compare(run_a, run_b)
    rows = csv_rows(same.out, "compare.csv")
    assert rows and all(r["output_tokens_per_s_within_ci95"] == "true" for r in rows), rows
    assert all("output_tokens_per_s" in r["within_ci95"] for r in rows)
    assert "within_ci95" in (same.out / "compare.md").read_text()
    document = json.loads((same.out / "report.json").read_text())
    assert all(len(r["output_tokens_per_s_diff_ci95"]) == 2 for r in document["rows"])
    different = analysis.compare(run_a, run_c)
    rows = csv_rows(different.out, "compare.csv")
    assert all(r["output_tokens_per_s_within_ci95"] == "false" for r in rows), rows
    assert all("output_tokens_per_s" not in r["within_ci95"] for r in rows)


def test_compare_without_repeats_leaves_the_flag_empty(two_tpots, tmp_path):
    outcome = analysis.compare(two_tpots, two_tpots, out=tmp_path / "c", slo={"tpot_ms_p99": 10.0})
    rows = csv_rows(outcome.out, "compare.csv")
    assert all(r["within_ci95"] == "" and r["output_tokens_per_s_within_ci95"] == "" for r in rows)
    assert {(r["config"], r["slo_met_a"], r["slo_met_b"]) for r in rows} == {
        ("ar", "false", "false"),
        ("fast", "true", "true"),
    }


# -- rate levels, under-filled levels, workloads, telemetry ------------------------------


@needs_schema
def test_rate_levels_get_their_own_rows_and_plot_and_stay_out_of_the_bands(tmp_path):
    plan = Plan(
        configs={"ar": Sim(step_ms=20.0), "dflash": Sim(step_ms=26.0, accept=4.0)},
        concurrency=(1, 4),
        num_prompts=8,
        max_new_tokens=32,
        request_rates=(0.5, 2.0, 8.0),
        max_concurrency=4,
    )
    root = write_run(tmp_path / "run", plan)
    assert (root / "node-a" / "ar" / "gsm8k" / "r0.5.json").is_file()
    outcome = analysis.report(root)
    document = check_report(outcome.out)
    rows = csv_rows(outcome.out)
    rates = sorted({float(r["request_rate"]) for r in rows if r["request_rate"]})
    assert rates == [0.5, 2.0, 8.0]
    for row in rows:
        if row["request_rate"]:
            assert row["concurrency"] == "4"  # the cap
    assert "plots/rate.png" in document["plots"]
    assert all(p.levels in ("1", "4") for p in outcome.picks)
    # A renamed rate file is named by the field it contradicts.
    shutil.move(
        root / "node-a" / "ar" / "gsm8k" / "r2.json", root / "node-a" / "ar" / "gsm8k" / "r3.json"
    )
    with pytest.raises(ResultsError) as error:
        load(root)
    assert "r3.json: request_rate: 2.0 does not match the file name (r3)" in str(error.value)


@needs_schema
def test_under_filled_levels_and_workloads_are_marked(tmp_path):
    workload = {
        "name": "isl64-osl32",
        "isl": 64,
        "osl": 32,
        "ignore_eos": True,
        "tokenizer": {"file": "tiktoken.model", "sha256": "0" * 64, "revision": None},
        "seed": 0,
    }
    plan = Plan(
        configs={"ar": Sim(step_ms=20.0), "dflash": Sim(step_ms=26.0, accept=4.0)},
        concurrency=(1, 4),
        prompt_sets=("gsm8k", "isl64-osl32"),
        num_prompts=16,
        max_new_tokens=32,
        unique_prompts=16,
        workloads={"isl64-osl32": workload},
    )
    outcome = analysis.report(write_run(tmp_path / "run", plan))
    rows = csv_rows(outcome.out)
    # c1 wants max(10, 16) = 16 prompts and has them; c4 wants 40.
    assert {(r["concurrency"], r["under_filled"]) for r in rows} == {("1", "false"), ("4", "true")}
    assert {r["workload"] for r in rows if r["prompt_set"] == "isl64-osl32"} == {"isl64-osl32"}
    assert {r["workload"] for r in rows if r["prompt_set"] == "gsm8k"} == {""}
    found = [w for w in outcome.warnings if w["kind"] == "under_filled"]
    assert len(found) == 4 and all(w["severity"] == "info" for w in found)
    assert all(w["where"].endswith("/ c4") for w in found)
    assert "16 unique prompts for the 40" in found[0]["message"]


@needs_schema
def test_telemetry_gives_tokens_per_joule_and_throttle_warnings(tmp_path):
    plan = Plan(
        configs={"ar": Sim(step_ms=20.0), "dflash": Sim(step_ms=26.0, accept=4.0)},
        concurrency=(1, 4),
        num_prompts=8,
        max_new_tokens=32,
        gpu={"dflash": GPU_SUMMARY},
    )
    outcome = analysis.report(write_run(tmp_path / "run", plan))
    with open(outcome.out / "summary.csv", encoding="utf-8") as handle:
        header = next(csv.reader(handle))
    at = header.index("tokens_per_s_per_gpu")
    assert header[at + 1 : at + 3] == ["gpu_power_w_mean", "output_tokens_per_joule"]
    rows = csv_rows(outcome.out)
    for row in rows:
        if row["config"] == "ar":
            assert row["gpu_power_w_mean"] == row["output_tokens_per_joule"] == ""
        else:
            assert float(row["gpu_power_w_mean"]) == 5600.0
            expected = float(row["output_tokens_per_s"]) / 5600.0
            assert float(row["output_tokens_per_joule"]) == pytest.approx(expected, abs=1e-4)
    throttled = [w for w in outcome.warnings if w["kind"] == "gpu_throttled"]
    assert len(throttled) == 2 and all("power cap" in w["message"] for w in throttled)
    assert "output_tokens_per_joule" in (outcome.out / "summary.md").read_text()
    assert "output_tokens_per_joule" in (outcome.out / "report.html").read_text()


def test_itl_splits_an_events_gap_over_its_tokens_in_either_layout(tmp_path):
    plan = Plan(
        configs={"ar": Sim(step_ms=20.0), "dflash": Sim(step_ms=26.0, accept=4.0)},
        concurrency=(2,),
        num_prompts=4,
        max_new_tokens=64,
    )
    root = write_run(tmp_path / "run", plan)
    path = root / "node-a" / "dflash" / "gsm8k" / "c2.json"
    ttft, itl = plots.level_latencies(path)
    # 63 tokens after the first, 4 a verify step of 26 ms: 15 steps of 4, then one of 3.
    assert len(ttft) == 4 and len(itl) == 4 * 63
    assert sorted({round(v, 3) for v in itl}) == [6.5, round(26.0 / 3, 3)]
    compact = tmp_path / "compact.json"
    compact.write_text(json.dumps(json.loads(path.read_text())))  # not the module's layout
    assert plots_latency._fast_events(compact.read_bytes()) is None
    assert plots.level_latencies(compact) == (ttft, itl)


def test_the_full_parse_reads_the_same_per_request_latencies(two_tpots):
    fast, strict = load(two_tpots), load(two_tpots, strict=True)
    for quick, full in zip(fast.levels, strict.levels, strict=True):
        assert quick.path == full.path
        for name in ("ttft", "tpot", "e2e"):
            assert list(getattr(quick, name)) == list(getattr(full, name)), (quick.path, name)
            assert len(getattr(quick, name)) == quick.summary["requests_ok"]


@needs_schema
def test_a_missing_rate_level_or_repeat_is_an_incomplete_run(tmp_path):
    plan = Plan(
        configs={"ar": Sim(step_ms=20.0)},
        concurrency=(1,),
        num_prompts=4,
        max_new_tokens=16,
        request_rates=(2.5,),
        repeats=2,
    )
    root = write_run(tmp_path / "run", plan)
    outcome = analysis.report(root, out=tmp_path / "whole")
    assert [w for w in outcome.warnings if w["kind"] == "incomplete_run"] == []
    (root / "node-a" / "ar" / "gsm8k" / "r2.5.rep2.json").unlink()
    (root / "node-a" / "ar" / "gsm8k" / "c1.rep2.json").unlink()
    outcome = analysis.report(root, out=tmp_path / "cut")
    [warning] = [w for w in outcome.warnings if w["kind"] == "incomplete_run"]
    assert warning["message"] == (
        "run.json plans gsm8k c1 repeat 2, gsm8k r2.5 repeat 2 for ar, but no level file holds "
        "them (node-a/ar/gsm8k/c1.rep2.json and the others): the run was interrupted, or the "
        "file was lost"
    )


def test_goodput_leads_the_recommendation_the_summary_the_command_line_and_a_plot(tmp_path, capsys):
    """With SLOs: the pick's goodput and its interval beside its throughput in the first
    table (recommendation), goodput beside throughput in the summary, every interval beside its
    metric, the command line's summary saying it, and a goodput plot that names the SLO."""
    root = tmp_path / "run"
    plan = Plan(
        configs=dict(SLO_CONFIGS), concurrency=(1,), num_prompts=8, max_new_tokens=64, repeats=3
    )
    write_run(root, plan)
    out = tmp_path / "report"
    assert main(["report", str(root), "--out", str(out), "--slo", "tpot_ms_p99=10"]) == 0
    said = capsys.readouterr().out
    [pick_line] = [line for line in said.splitlines() if "recommended on node-a" in line]
    assert "fast (goodput " in pick_line and "requests/s, 95% " in pick_line, pick_line

    with open(out / "recommendation.csv", encoding="utf-8") as handle:
        header = next(csv.reader(handle))
    at = header.index("output_tokens_per_s")
    assert header[at + 1 : at + 4] == list(tables.GOODPUT_COLUMNS)
    with open(out / "recommendation.csv", encoding="utf-8") as handle:
        [pick] = list(csv.DictReader(handle))
    low, high = (float(pick[f"goodput_requests_per_s_ci95_{end}"]) for end in ("low", "high"))
    assert low <= float(pick["goodput_requests_per_s"]) <= high

    with open(out / "summary.csv", encoding="utf-8") as handle:
        header = next(csv.reader(handle))
    for metric in ("output_tokens_per_s", "goodput_requests_per_s", "ttft_ms_p99", "tpot_ms_p50"):
        at = header.index(metric)
        assert header[at + 1 : at + 3] == [f"{metric}_ci95_low", f"{metric}_ci95_high"], metric
    assert header.index("goodput_requests_per_s") < header.index("speedup_vs_ar")
    markdown = (out / "summary.md").read_text()
    summary_header = markdown.split("## Summary")[1].split("\n")[2]
    cells = [c.strip() for c in summary_header.strip("|").split("|")]
    at = cells.index("output_tokens_per_s")
    assert cells[at + 1 : at + 6] == [
        "output_tokens_per_s_ci95_low",
        "output_tokens_per_s_ci95_high",
        "goodput_requests_per_s",
        "goodput_requests_per_s_ci95_low",
        "goodput_requests_per_s_ci95_high",
    ], cells
    document = check_report(out)
    assert "plots/goodput.png" in document["plots"]
    page = (out / "report.html").read_text()
    assert "Goodput against concurrency" in page and "tpot_ms_p99 &lt;= 10 ms" in page


def test_without_slos_there_is_no_goodput_plot_or_column(two_tpots, tmp_path):
    outcome = analysis.report(two_tpots, out=tmp_path / "plain")
    assert "plots/goodput.png" not in check_report(outcome.out)["plots"]
    with open(outcome.out / "recommendation.csv", encoding="utf-8") as handle:
        assert "goodput_requests_per_s" not in next(csv.reader(handle))
