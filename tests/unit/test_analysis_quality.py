"""The quality gate in the analysis: accuracy columns, accuracy_below_ar (McNemar on the
same prompts), accuracy_below_floor, and the API checks of api-check.json in the report."""

from __future__ import annotations

import csv
import json
import os
from fractions import Fraction
from pathlib import Path

import pytest

import analysis
from analysis import quality
from analysis.results import ResultsError
from tests.support.report_check import check_report
from tests.support.results_tree import (
    KIMI,
    Plan,
    Sim,
    level_document,
    level_problems,
    write_json,
    write_run,
)

pytestmark = pytest.mark.analysis

FLOORS = {
    "gsm8k": {"floor": 0.9, "source": "kit's own choice: test floor"},
    "math500": {"floor": 0.5, "source": "a published score"},
}


def scored_plan(configs: dict[str, Sim], **changes) -> Plan:
    """One host, 200 GSM8K prompts scored, mt-bench beside them unscored; short answers (the
    timings do not matter here)."""
    settings = {
        "configs": configs,
        "concurrency": (1, 8),
        "prompt_sets": ("gsm8k", "mt-bench"),
        "num_prompts": 200,
        "max_new_tokens": 8,
        "scored": {"gsm8k": "gsm8k"},
        "accuracy_floors": FLOORS,
        **changes,
    }
    return Plan(**settings)


def kinds(warnings: list[dict], kind: str) -> list[dict]:
    return [w for w in warnings if w["kind"] == kind]


def csv_rows(out: Path) -> list[dict]:
    with open(out / "summary.csv", newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_scored_levels_follow_the_level_contract():
    """What the tests below analyse is what the benchmark writes: a request's score and the
    summary's accuracy as docs/schema/level.schema.json has them."""
    plan = scored_plan({"ar": Sim(accuracy=0.5, unanswered=0.25)}, num_prompts=8)
    document = level_document(plan, "node-a", "ar", "gsm8k", 1)
    assert level_problems(document) == []
    assert document["summary"]["accuracy"] == {
        "scorer": "gsm8k",
        "n": 8,
        "correct": 4,
        "wrong": 2,
        "unanswered": 2,
        "accuracy": 0.5,
        "outcomes": "".join(r["score"]["outcome"][0] for r in document["requests"]),
    }
    unscored = level_document(plan, "node-a", "ar", "mt-bench", 1)
    assert "accuracy" not in unscored["summary"] and "score" not in unscored["requests"][0]


# -- McNemar ---------------------------------------------------------------------------


def exact(worse: int, better: int) -> Fraction:
    n = worse + better
    tail = term = 1
    for k in range(1, min(worse, better) + 1):
        term = term * (n - k + 1) // k  # C(n, k) from C(n, k - 1)
        tail += term
    return min(Fraction(1), 2 * Fraction(tail, 2**n))


@pytest.mark.parametrize(
    ("worse", "better", "expected"),
    [
        (0, 0, 1.0),
        (2, 0, 0.5),  # two discordant pairs one way: as likely as not
        (5, 0, 0.0625),  # 2 / 32: five one way is not yet significant at 5%
        (6, 0, 0.03125),
        (10, 3, 2 * 378 / 8192),  # 1 + 13 + 78 + 286 = 378 of 2^13
        (3, 10, 2 * 378 / 8192),
        (40, 0, 2.0**-39),
        (7, 7, 1.0),
    ],
)
def test_mcnemar_is_the_exact_two_sided_binomial_test(worse, better, expected):
    assert quality.mcnemar_p(worse, better) == pytest.approx(expected, rel=1e-12)


def test_mcnemar_in_logarithms_agrees_with_the_exact_sum_above_its_limit():
    n = quality.EXACT_PAIRS + 400
    for low in (n // 2 - 150, n // 2 - 60, n // 2):
        value = quality.mcnemar_p(n - low, low)
        assert value == pytest.approx(float(exact(n - low, low)), rel=1e-9), low


# -- accuracy against the reference ----------------------------------------------------


@pytest.fixture(scope="module")
def paired(tmp_path_factory):
    """AR right on 90% of 200 prompts; dflash on 70% (a subset of AR's); eagle3 on 89% (wrong
    on 2 prompts AR got right); ddtree-b16 at 70% but on another prompts file."""
    root = tmp_path_factory.mktemp("paired") / "run"
    plan = scored_plan(
        {
            "ar": Sim(accuracy=0.9),
            "eagle3": Sim(step_ms=24.0, accept=3.2, accuracy=0.89),
            "dflash": Sim(step_ms=26.0, accept=5.0, accuracy=0.7),
            "ddtree-b16": Sim(
                step_ms=28.0, accept=6.0, budget=16, accuracy=0.7, prompts_variant="-other"
            ),
        }
    )
    write_run(root, plan)
    return root, analysis.report(root, workers=1)


def test_accuracy_columns_follow_mismatch_rate_and_are_empty_for_unscored_sets(paired):
    _root, outcome = paired
    rows = csv_rows(outcome.out)
    header = list(rows[0])
    at = header.index("mismatch_rate")
    assert header[at + 1 : at + 4] == ["accuracy", "accuracy_n", "accuracy_unanswered"]
    expected = {"ar": "0.9", "eagle3": "0.89", "dflash": "0.7", "ddtree-b16": "0.7"}
    for row in rows:
        if row["prompt_set"] == "gsm8k":
            assert row["accuracy"] == expected[row["config"]], row
            assert (row["accuracy_n"], row["accuracy_unanswered"]) == ("200", "0"), row
        else:
            assert (row["accuracy"], row["accuracy_n"], row["accuracy_unanswered"]) == ("",) * 3
    assert len([r for r in rows if r["prompt_set"] == "gsm8k"]) == 8
    check_report(outcome.out)


def test_a_config_at_70_against_ar_at_90_is_below_ar_and_one_at_89_is_not(paired):
    _root, outcome = paired
    found = kinds(outcome.warnings, "accuracy_below_ar")
    assert sorted(w["where"] for w in found) == [
        "node-a / dflash / gsm8k / c1",
        "node-a / dflash / gsm8k / c8",
    ]
    for warning in found:
        assert warning["severity"] == "warning"
        message = warning["message"]
        assert "accuracy 0.700 (140 of 200 right, 60 wrong, 0 unanswered)" in message
        assert "against ar's 0.900 on the same prompts" in message
        assert "40 prompts right only for ar, 0 right only for dflash" in message
        assert "exact McNemar test, p = 1.8e-12 < 0.05" in message
    document = json.loads((outcome.out / "report.json").read_text())
    by = {(r["config"], r["concurrency"]): r for r in document["accuracy"]}
    eagle = by[("eagle3", 1)]
    assert (eagle["only_reference_right"], eagle["only_config_right"]) == (2, 0)
    assert eagle["p_value"] == 0.5 and eagle["verdict"] == "same"
    assert by[("dflash", 8)]["verdict"] == "worse" and by[("ar", 1)]["verdict"] == "reference"
    assert not kinds(outcome.warnings, "accuracy_below_floor")  # AR at 0.9 meets 0.9


def test_a_config_that_answers_worse_is_never_recommended(paired):
    _root, outcome = paired
    assert outcome.picks and all(p.config != "dflash" for p in outcome.picks)
    # dflash is faster than what was picked, so the recommendation says why it lost.
    assert any(
        "dflash was faster" in p.note and "answered worse than the reference" in p.note
        for p in outcome.picks
    ), [p.note for p in outcome.picks]


def test_levels_built_from_other_prompts_are_not_paired(paired):
    _root, outcome = paired
    document = json.loads((outcome.out / "report.json").read_text())
    tree = [r for r in document["accuracy"] if r["config"] == "ddtree-b16"]
    assert len(tree) == 2
    for row in tree:
        assert row["verdict"] is None and row["p_value"] is None
        assert row["note"].startswith("not compared: the prompts differ from ar's")
    assert not [
        w for w in outcome.warnings if "ddtree-b16" in w["where"] and "accuracy" in w["kind"]
    ]


def test_the_report_shows_the_accuracy_table(paired):
    _root, outcome = paired
    page = (outcome.out / "report.html").read_text()
    section = page.split('<section id="accuracy">')[1].split("</section>")[0]
    assert "McNemar" in section and "gsm8k: 0.90 (kit&#x27;s own choice: test floor)" in section
    assert section.count('<tr class="flagged">') == 2  # dflash at both levels
    markdown = (outcome.out / "summary.md").read_text()
    assert "## Accuracy" in markdown and "| node-a | gsm8k | dflash | 1 | gsm8k | 200 |" in markdown


def test_a_broken_ar_is_below_its_floor(tmp_path):
    """AR at 20% with a floor of 90%: an error naming accuracy, n, floor and source; every
    config agrees with it, so no config is below AR."""
    configs = {
        "ar": Sim(accuracy=0.2),
        "dflash": Sim(step_ms=26.0, accept=5.0, accuracy=0.2),
    }
    write_run(tmp_path / "run", scored_plan(configs, concurrency=(1,)))
    outcome = analysis.report(tmp_path / "run", workers=1)
    found = kinds(outcome.warnings, "accuracy_below_floor")
    assert [(w["where"], w["severity"]) for w in found] == [("node-a / ar / gsm8k", "error")]
    message = found[0]["message"]
    assert "scores gsm8k below the floor of 0.90 (kit's own choice: test floor)" in message
    assert "accuracy 0.200 (40 of 200 right, 160 wrong, 0 unanswered) at c1" in message
    assert "max_new_tokens" not in message  # nothing was cut off: not a budget problem
    assert not kinds(outcome.warnings, "accuracy_below_ar")
    assert outcome.warnings[0]["kind"] == "accuracy_below_floor"  # errors first


def test_the_command_line_names_the_quality_gate(tmp_path):
    import contextlib
    import io

    from analysis.__main__ import main

    configs = {"ar": Sim(accuracy=0.2), "dflash": Sim(step_ms=26.0, accept=5.0, accuracy=0.1)}
    write_run(tmp_path / "run", scored_plan(configs, concurrency=(1,)))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["report", str(tmp_path / "run"), "--workers", "1"]) == 0
    assert (
        "  quality gate: 1 accuracy_below_floor, 1 accuracy_below_ar (a broken deployment that "
        "losslessness cannot see): see the report\n"
    ) in out.getvalue()


def test_a_floor_missed_through_cut_off_answers_says_to_give_them_room(tmp_path):
    configs = {"ar": Sim(accuracy=0.3, unanswered=0.6)}
    write_run(tmp_path / "run", scored_plan(configs, concurrency=(1,)))
    outcome = analysis.report(tmp_path / "run", workers=1)
    (found,) = kinds(outcome.warnings, "accuracy_below_floor")
    message = found["message"]
    assert "(60 of 200 right, 20 wrong, 120 unanswered)" in message
    assert "120 of 200 answers were cut off or failed (max_new_tokens 8)" in message
    assert "raise benchmark_prompt_set_definitions.gsm8k.max_new_tokens" in message
    assert "benchmark_scored_chat_template_kwargs" in message
    assert "rendered with {'thinking': False}" in message
    (row,) = [r for r in csv_rows(outcome.out) if r["prompt_set"] == "gsm8k"]
    assert (row["accuracy"], row["accuracy_n"], row["accuracy_unanswered"]) == ("0.3", "200", "120")


def test_no_floor_without_floors_in_run_json(tmp_path):
    """A run whose run.json records no floors (older runs, a model without them)."""
    write_run(tmp_path / "run", scored_plan({"ar": Sim(accuracy=0.2)}, accuracy_floors=None))
    outcome = analysis.report(tmp_path / "run", workers=1)
    assert not kinds(outcome.warnings, "accuracy_below_floor")


def test_compare_shows_both_runs_accuracy(tmp_path):
    configs = {"ar": Sim(accuracy=0.9), "dflash": Sim(step_ms=26.0, accept=5.0, accuracy=0.9)}
    old = write_run(tmp_path / "old", scored_plan(configs, concurrency=(1,)))
    configs = {**configs, "dflash": Sim(step_ms=26.0, accept=5.0, accuracy=0.6)}
    new = write_run(tmp_path / "new", scored_plan(configs, concurrency=(1,)))
    outcome = analysis.compare(old, new, workers=1)
    pair = next(p for p in outcome.table if p["config"] == "dflash" and p["prompt_set"] == "gsm8k")
    assert (pair["accuracy_a"], pair["accuracy_b"]) == (0.9, 0.6)
    assert [w["where"] for w in kinds(outcome.warnings, "accuracy_below_ar")] == [
        "B: node-a / dflash / gsm8k / c1"
    ]
    with open(outcome.out / "compare.csv", newline="", encoding="utf-8") as handle:
        assert {"accuracy_a", "accuracy_b"} <= set(next(csv.DictReader(handle)))
    page = (outcome.out / "compare.html").read_text()
    assert '<th class="">accuracy_a</th>' in page


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda a: {**a, "outcomes": a["outcomes"][:-1]}, "summary.accuracy.outcomes"),
        (lambda a: {**a, "correct": a["correct"] + 1}, "summary.accuracy.correct"),
        (lambda a: {**a, "outcomes": "c" * (a["n"] - 1) + "x"}, "summary.accuracy.outcomes"),
        (lambda a: {**a, "accuracy": 0.5}, "summary.accuracy.accuracy"),
    ],
)
def test_an_accuracy_that_does_not_match_its_records_is_refused(tmp_path, change, field):
    """The outcomes are paired prompt by prompt: a string that does not match the records
    would pair the wrong answers."""
    root = write_run(tmp_path / "run", scored_plan({"ar": Sim(accuracy=0.9)}, concurrency=(1,)))
    level = root / "node-a" / "ar" / "gsm8k" / "c1.json"
    document = json.loads(level.read_text())
    document["summary"]["accuracy"] = change(document["summary"]["accuracy"])
    write_json(level, document)
    with pytest.raises(ResultsError) as caught:
        analysis.report(root, workers=1)
    assert f"node-a/ar/gsm8k/c1.json: {field}" in str(caught.value)


# -- API checks ------------------------------------------------------------------------


def api_check(config: str, **failures) -> dict:
    """api-check.json as the server stage writes it: every check passed but those given
    ({name: (found, expected, fix)}, or None for a check not run)."""
    checks = []
    for name in ("models", "chat", "chat_stream", "tool_call", "reasoning"):
        failure = failures.get(name, ())
        if failure is None:
            checks.append(
                {
                    "name": name,
                    "passed": None,
                    "found": "not run: the launch sets no --reasoning-parser",
                    "expected": "",
                    "fix": "",
                    "ms": 0.0,
                }
            )
            continue
        found, expected, fix = failure or ("ok", "ok", "")
        checks.append(
            {
                "name": name,
                "passed": not failure,
                "found": found,
                "expected": expected,
                "fix": fix,
                "ms": 12.5,
            }
        )
    return {
        "kind": "kimi.api_check",
        "schema_version": 1,
        "checked_at": "2026-01-01T00:00:00+00:00",
        "base_url": "http://127.0.0.1:30000",
        "served_model_name": KIMI["target"]["repo_id"],
        "config": config,
        "passed": not any(failures.values()),
        "checks": checks,
    }


TOOL_FAILURE = (
    "content 'I would call get_weather' and no tool_calls",
    "a tool call to get_weather in message.tool_calls",
    "launch with --tool-call-parser kimi_k2 (kimi_server_tool_call_parser)",
)


@pytest.fixture
def checked(tmp_path):
    root = write_run(
        tmp_path / "run",
        Plan(configs={"ar": Sim(), "dflash": Sim(step_ms=26.0, accept=5.0)}, concurrency=(1,)),
    )
    write_json(root / "node-a" / "ar" / "api-check.json", api_check("ar", reasoning=None))
    write_json(
        root / "node-a" / "dflash" / "api-check.json", api_check("dflash", tool_call=TOOL_FAILURE)
    )
    return root


def test_a_failed_api_check_is_an_error_naming_the_check_what_was_found_and_the_fix(checked):
    outcome = analysis.report(checked, workers=1)
    found = kinds(outcome.warnings, "api_check_failed")
    assert [(w["where"], w["severity"]) for w in found] == [("node-a / dflash", "error")]
    assert found[0]["message"] == (
        f"the OpenAI API check tool_call failed: found {TOOL_FAILURE[0]}; expected "
        f"{TOOL_FAILURE[1]}; fix: {TOOL_FAILURE[2]}"
    )
    document = check_report(outcome.out)
    results = {(r["config"], r["check"]): r["result"] for r in document["api_checks"]}
    assert len(results) == 10
    assert results[("dflash", "tool_call")] == "failed"
    assert results[("ar", "reasoning")] == "not run"
    assert results[("ar", "models")] == results[("dflash", "chat_stream")] == "passed"
    page = (outcome.out / "report.html").read_text()
    section = page.split('<section id="api">')[1].split("</section>")[0]
    assert section.count('<tr class="flagged">') == 1
    assert "launch with --tool-call-parser kimi_k2" in section
    assert "not run: the launch sets no --reasoning-parser" in section
    assert "## API checks" in (outcome.out / "summary.md").read_text()


def test_api_check_text_is_bounded_in_the_report(checked):
    record = api_check("dflash", tool_call=("x" * 3999, "y", "z"))
    write_json(checked / "node-a" / "dflash" / "api-check.json", record)
    outcome = analysis.report(checked, workers=1)
    (found,) = kinds(outcome.warnings, "api_check_failed")
    assert "x" * (quality.SHOWN_CHARS - 3) + "..." in found["message"]
    assert "x" * (quality.SHOWN_CHARS - 2) not in found["message"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda r: {**r, "checks": "all good"}, "checks: expected a list"),
        (lambda r: {**r, "kind": "other"}, "kind: expected 'kimi.api_check'"),
        (
            lambda r: {**r, "checks": [{**r["checks"][0], "passed": "yes"}]},
            "checks[0].passed: expected true or false or null",
        ),
        (
            lambda r: {**r, "checks": [{**r["checks"][0], "found": "x" * 5000}]},
            "checks[0].found: expected at most 4000 characters, found 5000",
        ),
        (
            lambda r: {**r, "checks": [{**r["checks"][0], "name": "<script>"}]},
            "checks[0].name: expected a string matching",
        ),
        (lambda r: {**r, "checks": r["checks"] * 7}, "checks: expected at most 32 items, found 35"),
    ],
)
def test_an_api_check_file_out_of_shape_is_refused_by_file_and_field(checked, change, expected):
    path = checked / "node-a" / "ar" / "api-check.json"
    write_json(path, change(api_check("ar")))
    with pytest.raises(ResultsError) as caught:
        analysis.report(checked, workers=1)
    assert f"node-a/ar/api-check.json: {expected}" in str(caught.value)


def test_an_api_check_file_too_large_or_not_a_file_is_refused(checked):
    path = checked / "node-a" / "ar" / "api-check.json"
    path.write_text(" " * (2 << 20) + "{}")
    with pytest.raises(ResultsError) as caught:
        analysis.report(checked, workers=1)
    assert "node-a/ar/api-check.json: (file): " in str(caught.value)
    assert "over the limit of 1048576 bytes" in str(caught.value)
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(ResultsError) as caught:
        analysis.report(checked, workers=1)
    assert "node-a/ar/api-check.json: (file): a FIFO" in str(caught.value)


def test_the_server_stages_own_record_of_a_parser_that_does_not_engage(tmp_path):
    """module_utils/server/api_check.py's record, from the simulator launched with the tool-call
    parser asked for but not engaging, read by the report as the benchmark lands it."""
    from ansible.module_utils.server.api_check import run_checks

    from tests.support.results_tree import TEMPLATE
    from tests.support.sim_process import start, stop

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    argv = ["--model-path", str(folder), "--host", "127.0.0.1"]
    argv += ["--served-model-name", KIMI["target"]["repo_id"], "--tool-call-parser", "kimi_k2"]
    process, url = start(
        argv, SGLANG_SIM_STEP_MS=2, SGLANG_SIM_PREFILL_MS=5, SGLANG_SIM_IGNORE_PARSERS="tool_call"
    )
    try:
        # Thinking off: without a reasoning parser its markers would fail the chat check too.
        record = run_checks(
            url, argv, config="dflash", timeout=20, chat_template_kwargs={"thinking": False}
        )
    finally:
        stop(process)
    root = write_run(
        tmp_path / "run",
        Plan(configs={"ar": Sim(), "dflash": Sim(step_ms=26.0, accept=5.0)}, concurrency=(1,)),
    )
    write_json(root / "node-a" / "dflash" / "api-check.json", record)
    outcome = analysis.report(root, workers=1)
    (found,) = kinds(outcome.warnings, "api_check_failed")
    (check,) = [c for c in record["checks"] if c["name"] == "tool_call"]
    assert found["where"] == "node-a / dflash"
    assert found["message"] == (
        f"the OpenAI API check tool_call failed: found {check['found']}; expected "
        f"{check['expected']}; fix: {check['fix']}"
    )
    assert check["fix"] and check["found"]
    document = check_report(outcome.out)
    assert {r["check"]: r["result"] for r in document["api_checks"]} == {
        "models": "passed",
        "chat": "passed",
        "chat_stream": "passed",
        "tool_call": "failed",
        "reasoning": "not run",
    }


def test_mutations_of_what_the_quality_gate_reads_end_in_a_report_or_a_named_refusal(tmp_path):
    """300 seeded mutations (tests/unit/test_analysis_fuzz.py's) of a level's summary.accuracy,
    run.json's accuracy floors and an api-check.json: each ends in a report or a refusal whose
    every problem names a file and a field, never in an exception."""
    import contextlib
    import io
    import random
    import shutil

    from analysis.__main__ import main
    from tests.unit.test_analysis_fuzz import PROBLEM, mutate

    # Each figure is drawn once per distinct input (tests/unit/conftest.py).
    configs = {"ar": Sim(accuracy=0.5), "dflash": Sim(step_ms=25, accept=4, accuracy=0.25)}
    tree = write_run(
        tmp_path / "run", scored_plan(configs, concurrency=(1,), num_prompts=4, max_new_tokens=4)
    )
    write_json(
        tree / "node-a" / "dflash" / "api-check.json", api_check("dflash", chat=TOOL_FAILURE)
    )
    # (file, the part of it mutated)
    targets = [
        ("node-a/dflash/gsm8k/c1.json", ("summary", "accuracy")),
        ("node-a/ar/gsm8k/c1.json", ("summary", "accuracy")),
        ("run.json", ("model", "accuracy_floors")),
        ("node-a/dflash/api-check.json", ()),
    ]
    originals = {name: (tree / name).read_bytes() for name, _ in targets}
    rng = random.Random(18)
    failures, outcomes = [], {0: 0, 2: 0}
    for number in range(300):
        name, inside = rng.choice(targets)
        document = json.loads(originals[name])
        parent = document
        for key in inside:
            parent = parent[key]
        mutated, path, what, raw = mutate(parent, rng)
        if inside:
            holder = document
            for key in inside[:-1]:
                holder = holder[key]
            holder[inside[-1]] = mutated
        else:
            document = mutated
        text = json.dumps(document, indent=1) + "\n"
        (tree / name).write_text(text.replace('"__RAW__"', raw) if raw else text)
        label = f"#{number} {name} {'.'.join(map(str, (*inside, *path)))} {what}"
        out, stderr = tmp_path / f"out-{number}", io.StringIO()
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
                status = main(["report", str(tree), "--out", str(out), "--workers", "1"])
        except BaseException as error:  # any escape is the finding
            failures.append(f"{label}: {type(error).__name__}: {error}")
            continue
        finally:
            (tree / name).write_bytes(originals[name])
            shutil.rmtree(out, ignore_errors=True)
        lines = stderr.getvalue().splitlines()
        if status == 2:
            problems = [PROBLEM.match(line) for line in lines[1:] if not line.startswith("  ...")]
            if not all(problems) or name not in {m.group(1) for m in problems}:
                failures.append(f"{label}: {stderr.getvalue()[:600]}")
        elif status != 0 or lines:
            failures.append(f"{label}: exit {status}: {stderr.getvalue()[-500:]}")
        outcomes[status] = outcomes.get(status, 0) + 1
    assert failures == [], f"{len(failures)}:\n" + "\n".join(failures[:30])
    assert outcomes[0] >= 30 and outcomes[2] >= 150, outcomes
