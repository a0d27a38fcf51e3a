"""A trial's goodput (module_utils/autotune/score.py) is the report's goodput of the same level
files (analysis: tables.rows with the same SLO), and level files are outside input: hostile
ones end in a named refusal or no measurement, never in a figure."""

from __future__ import annotations

import json
import math
import os
import random

import pytest
from ansible.module_utils.autotune.score import (
    MAX_TRIAL_LEVEL_BYTES,
    ScoreError,
    level_goodput,
    read_level,
    trial_scores,
    wilson,
)

from analysis import tables
from analysis.results import load
from tests.support.results_tree import Plan, Sim, write_run

SLO = {"ttft_ms_p99": 1000.0, "tpot_ms_p99": 15.0}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    plan = Plan(
        configs={"ar": Sim(step_ms=20.0), "fast": Sim(step_ms=7.6)},
        concurrency=(1, 4),
        num_prompts=8,
        max_new_tokens=32,
        jitter=0.9,
        repeats=2,
    )
    write_run(root, plan)
    return root


def test_a_trials_goodput_is_the_reports_goodput_of_its_level_files(run):
    rows = tables.rows(load(run), "ar", SLO)
    for config in ("ar", "fast"):
        scores = trial_scores(str(run / "node-a" / config), [1, 4, 16], SLO)
        assert scores[16] is None  # no level at 16: the trial did not reach it
        for band in (1, 4):
            report = [r for r in rows if r["config"] == config and r["concurrency"] == band]
            expected = sum(r["goodput_requests_per_s"] for r in report) / len(report)
            assert scores[band]["goodput"] == pytest.approx(expected, rel=1e-5)
            assert scores[band]["repeats"] == 2
            assert scores[band]["low"] <= scores[band]["goodput"] <= scores[band]["high"]
    assert trial_scores(str(run / "node-a" / "ar"), [1], SLO)[1]["goodput"] == 0.0


def test_one_run_gets_wilsons_interval_of_its_good_share(run):
    path = run / "node-a" / "fast" / "gsm8k" / "c4.json"
    one = level_goodput([str(path)], SLO)
    level = json.loads(path.read_text())
    rate = level["summary"]["requests_ok"] / level["summary"]["duration_s"]
    low, high = wilson(one["good"], one["requests"])
    assert (one["low"], one["high"]) == pytest.approx((low * rate, high * rate), rel=1e-5)
    assert wilson(8, 8)[1] == 1.0 and 0 < wilson(8, 8)[0] < 1
    assert wilson(0, 8)[0] == 0.0


def test_failed_requests_meet_no_slo(tmp_path, run):
    level = json.loads((run / "node-a" / "fast" / "gsm8k" / "c1.json").read_text())
    for record in level["requests"][:3]:
        record["ok"] = False
    path = tmp_path / "c1.json"
    path.write_text(json.dumps(level))
    scored = level_goodput([str(path)], SLO)
    assert scored["failed"] == 3 and scored["good"] == len(level["requests"]) - 3


def test_hostile_level_files_are_refused_by_name(tmp_path, run):
    good = json.loads((run / "node-a" / "fast" / "gsm8k" / "c1.json").read_text())
    cases = {
        "not-json": b"{nope",
        "deep": b"[" * 100_000,
        "list": b"[1, 2]",
        "kind": json.dumps({**good, "kind": "other"}).encode(),
        "duration": json.dumps({**good, "summary": {"duration_s": "fast"}}).encode(),
        "zero": json.dumps({**good, "summary": {"duration_s": 0}}).encode(),
        "requests": json.dumps({**good, "requests": {"a": 1}}).encode(),
        "record": json.dumps({**good, "requests": [1, 2]}).encode(),
    }
    for name, data in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_bytes(data)
        with pytest.raises(ScoreError, match=str(path)):
            read_level(str(path))
    big = tmp_path / "big.json"
    with open(big, "wb") as handle:
        handle.truncate(MAX_TRIAL_LEVEL_BYTES + 1)
    with pytest.raises(ScoreError, match="larger than"):
        read_level(str(big))
    # Latencies of any type count as none, never as a figure.
    odd = {**good, "requests": [{"ok": True, "ttft_ms": v, "tpot_ms": v, "e2e_ms": v}
                                 for v in ("1", None, True, [], 1e400, -5)]}  # fmt: skip
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(odd).replace("Infinity", "1e400"))
    read = read_level(str(path))
    assert [math.isnan(v) for v in read["ttft"]] == [True, True, True, True, True, False]


def test_links_and_stray_files_in_a_trial_folder_are_not_read(tmp_path, run):
    trial = tmp_path / "trial"
    (trial / "gsm8k").mkdir(parents=True)
    source = run / "node-a" / "fast" / "gsm8k" / "c1.json"
    (trial / "gsm8k" / "c1.json").symlink_to(source)
    (trial / "linked").symlink_to(run / "node-a" / "fast" / "gsm8k")
    (trial / "gsm8k" / "notes.txt").write_text("not a level")
    assert trial_scores(str(trial), [1], SLO) == {1: None}
    assert trial_scores(str(tmp_path / "missing"), [1, 4], SLO) == {1: None, 4: None}


def test_random_bytes_never_score(tmp_path):
    rng = random.Random(38)
    path = tmp_path / "c1.json"
    for _ in range(300):
        path.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300))))
        with pytest.raises(ScoreError):
            read_level(str(path))
    os.remove(path)
