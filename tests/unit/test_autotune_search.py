"""Autotune's search (module_utils/autotune/search.py and space.py) over a planted objective: a
goodput surface whose optimum no default hits, an out-of-memory region, noise between runs and
a clock that each trial moves (restart, warmup, levels), against the pinned parser's contract."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from ansible.module_utils.autotune import search
from ansible.module_utils.autotune.space import (
    SpaceError,
    candidate_key,
    launch_settings,
    parse_space,
)
from ansible.module_utils.plan.sglang_args import load_contract

REPO = Path(__file__).resolve().parents[2]
CONTRACT = load_contract(REPO / "tests" / "contract" / "sglang-0.5.23-args.json")
CONFIGS = ["ar", "dflash", "ddtree-b16", "ddtree-b32", "ddtree-b64"]
SPACE = {
    "config": ["ar", "dflash", "ddtree-b32"],
    "--max-running-requests": [16, 32, 64, 128],
    "--mem-fraction-static": {"min": 0.80, "max": 0.92, "step": 0.04},
    "--cuda-graph-max-bs-decode": [8, 24, 48],
}
BANDS = [1, 16]
SLO = {"ttft_ms_p99": 2000.0, "tpot_ms_p99": 40.0}
# The planted optimum: dflash, 64 running requests, 0.88 of memory, graphs up to 24; out of
# memory from 0.88 up with 128 running requests.
OPTIMUM = {
    "config": "dflash",
    "--max-running-requests": 64,
    "--mem-fraction-static": 0.88,
    "--cuda-graph-max-bs-decode": 24,
}
RESTART_S, LEVEL_S = 40.0, 20.0


def out_of_memory(knobs: dict) -> bool:
    return knobs["--mem-fraction-static"] >= 0.88 and knobs["--max-running-requests"] >= 128


def planted(knobs: dict, band: int, rng: random.Random, noise: float) -> float:
    """Goodput (requests/s) peaking at OPTIMUM, each knob's distance costing a share."""
    base = {"ar": 6.0, "dflash": 10.0, "ddtree-b32": 8.5}[knobs["config"]]
    running = abs(knobs["--max-running-requests"] - 64) / 64
    memory = abs(knobs["--mem-fraction-static"] - 0.88) * 5
    graphs = abs(knobs["--cuda-graph-max-bs-decode"] - 24) / 48
    value = base * band**0.5 * (1 - 0.3 * running - memory - 0.2 * graphs)
    return max(value, 0.0) * (1 + rng.uniform(-noise, noise))


def run_search(budget_s: float, noise: float = 0.03, seed: int = 7, predicted=None, warm=None):
    """The whole loop as the playbook runs it, each trial advancing a clock."""
    rng = random.Random(seed)
    parsed = parse_space(SPACE, CONTRACT, CONFIGS)
    clock = 1000.0
    state = search.new_search(
        parsed,
        bands=BANDS,
        slo=SLO,
        budget_s=budget_s,
        started=clock,
        predicted=predicted,
        warm_key=warm,
    )
    tried = []
    while (trial := search.next_trial(state, clock)) is not None:
        # A trial is JSON between steps: the state must survive the round trip.
        state = json.loads(json.dumps(state))
        knobs = trial["knobs"]
        tried.append(trial)
        if out_of_memory(knobs):
            clock += RESTART_S / 2
            outcome = {"status": "failed", "error": "CUDA out of memory"}
        else:
            scale = trial["requests_per_concurrency"]
            clock += RESTART_S + LEVEL_S * scale * len(BANDS)
            scores = {
                str(band): {
                    "goodput": (g := planted(knobs, band, rng, noise)),
                    "low": g * 0.97,
                    "high": g * 1.03,
                    "seconds": LEVEL_S * scale,
                }
                for band in BANDS
            }
            outcome = {"status": "ok", "scores": scores}
        search.record_trial(state, trial["id"], outcome, clock)
    return state, tried, clock


def test_the_search_finds_the_planted_optimum_within_its_budget():
    budget = 8 * 3600
    state, tried, clock = run_search(budget)
    found = search.answer(state)
    assert clock - 1000.0 <= budget
    assert found["stop"] == "converged"
    for band in ("1", "16"):
        assert found["bands"][band]["best"]["knobs"] == OPTIMUM
    # 144 candidates: every one not pruned ran short, a third of them (per band) longer.
    assert found["candidates"] == 144
    rungs = [sum(t["rung"] == r for t in tried) for r in range(3)]
    assert rungs[0] == 144 - found["pruned"]
    assert 0 < rungs[2] < rungs[1] < rungs[0]
    assert rungs[1] <= len(BANDS) * -(-(rungs[0] - found["failed"]) // 3)
    assert found["overhead_seconds"] > 0
    assert found["level_seconds"] + found["overhead_seconds"] == pytest.approx(
        found["trial_seconds"]
    )


def test_the_failing_region_is_tried_once_and_never_again():
    state, tried, _ = run_search(8 * 3600)
    failing = [t for t in tried if out_of_memory(t["knobs"])]
    # One failure per config and graph size at most: the rest of its region was pruned.
    region = {(t["knobs"]["config"], t["knobs"]["--cuda-graph-max-bs-decode"]) for t in failing}
    assert len(failing) == len(region)
    keys = [t["key"] for t in tried]
    assert len(keys) == len({(t["key"], t["rung"]) for t in tried})
    pruned = [e for e in state["candidates"] if e["status"] == "pruned"]
    assert pruned and all(out_of_memory(e["knobs"]) for e in pruned)
    assert all("which failed" in e["reason"] for e in pruned)


def test_a_short_budget_stops_before_a_trial_that_would_not_fit():
    budget = 30 * 60
    state, _tried, clock = run_search(budget)
    found = search.answer(state)
    assert found["stop"] == "budget"
    # The last trial started within the budget; one more of its kind would have overrun it.
    assert clock - 1000.0 <= budget + RESTART_S + 2 * LEVEL_S
    assert found["never_run"] > 0
    assert found["bands"]["16"]["best"] is not None


def test_predicted_order_runs_the_speed_models_favourite_first_and_a_warm_start_before_it():
    predicted = {"ddtree-b32": {1: 90.0, 16: 900.0}, "dflash": {1: 80.0, 16: 800.0}}
    _state, tried, _ = run_search(30 * 60, predicted=predicted)
    assert tried[0]["knobs"]["config"] == "ddtree-b32"
    warm = candidate_key(OPTIMUM)
    _state, tried, _ = run_search(30 * 60, predicted=predicted, warm=warm)
    assert tried[0]["key"] == warm


def test_candidates_within_each_others_interval_are_said_to_be():
    state, _, _ = run_search(8 * 3600, noise=0.0)
    found = search.answer(state)
    margin = found["bands"]["16"]["margin"]
    assert set(margin) == {"goodput", "share", "within_interval"}
    best, runner = found["bands"]["16"]["best"], found["bands"]["16"]["runner_up"]
    assert margin["within_interval"] is (best["low"] <= runner["high"])


def test_a_candidate_becomes_launch_settings():
    parsed = parse_space(
        {**SPACE, "NCCL_ALGO": ["Ring", "Tree"], "--enable-mixed-chunk": [True, False]},
        CONTRACT,
        CONFIGS,
    )
    knobs = {name: values[0] for name, values in parsed.items()}
    launch = launch_settings(knobs, CONTRACT, "ar")
    assert launch == {
        "config": "ar",
        "settings": {"mem_fraction_static": 0.8},
        "extra_args": [
            "--max-running-requests", "16", "--cuda-graph-max-bs-decode", "8",
            "--enable-mixed-chunk",
        ],
        "environment": {"NCCL_ALGO": "Ring"},
    }  # fmt: skip
    assert launch_settings({**knobs, "--enable-mixed-chunk": False}, CONTRACT, "ar")[
        "extra_args"
    ] == ["--max-running-requests", "16", "--cuda-graph-max-bs-decode", "8"]


@pytest.mark.parametrize(
    ("space", "says"),
    [
        ({}, "at least one knob"),
        ([], "at least one knob"),
        ({"config": []}, "non-empty list"),
        ({"config": "dflash"}, "non-empty list"),
        ({"config": ["eagle7"]}, "not a serving config"),
        ({"--max-running-requests": ["many"]}, "invalid int value"),
        ({"--max-running-requests": [16, 16]}, "listed twice"),
        ({"--cuda-graph-max-bs": [8]}, "did you mean --cuda-graph-max-bs-decode"),
        ({"--tp-size": [4, 8]}, "rendered by the kit"),
        ({"--enable-mixed-chunk": [1]}, "is a switch"),
        ({"--mem-fraction-static": {"min": 0.9, "max": 0.8, "step": 0.1}}, "empty or never"),
        ({"--mem-fraction-static": {"min": 0.1, "max": 0.9, "step": 0.001}}, "more than 64"),
        ({"--mem-fraction-static": {"min": "a", "max": 1, "step": 1}}, "finite numbers"),
        ({"--mem-fraction-static": {"min": 0, "max": 1, "step": float("nan")}}, "finite"),
        ({"NCCL_algo": ["Ring"]}, "not an NCCL variable"),
        ({"rm -rf /": [1]}, "not a flag"),
        ({f"--x{i}": [1] for i in range(13)}, "more than 12"),
        (
            {
                "--max-running-requests": list(range(1, 65)),
                "--chunked-prefill-size": list(range(1, 65)),
                "NCCL_ALGO": ["Ring", "Tree"],
            },
            "8192 candidates",
        ),
    ],
)
def test_a_bad_search_space_is_refused_saying_what_and_how_to_fix(space, says):
    with pytest.raises(SpaceError, match=says):
        parse_space(space, CONTRACT, CONFIGS)


def test_random_spaces_end_in_candidates_or_a_named_refusal():
    rng = random.Random(37)
    names = ["config", "--max-running-requests", "--mem-fraction-static", "NCCL_PROTO", "--bogus"]
    values = [1, 0.5, -3, "x", True, None, [], {}, "dflash", 10**30, float("inf"), "\x00"]
    for _ in range(500):
        space = {
            rng.choice(names): (
                [rng.choice(values) for _ in range(rng.randrange(0, 4))]
                if rng.random() < 0.7
                else {k: rng.choice(values) for k in rng.sample(["min", "max", "step", "x"], 3)}
            )
            for _ in range(rng.randrange(0, 4))
        }
        try:
            parsed = parse_space(space, CONTRACT, CONFIGS)
        except SpaceError as exc:
            assert str(exc)
            continue
        state = search.new_search(parsed, bands=[1], slo=SLO, budget_s=60, started=0.0)
        assert len(state["candidates"]) >= 1


def test_the_trial_bound_holds_every_search_and_is_reached():
    # The planted search, 144 candidates, two bands, three rungs.
    state, tried, _ = run_search(8 * 3600)
    bound = search.trial_bound(144, len(BANDS), 3)
    assert len(tried) <= bound
    assert search.trial_bound(6, 2, 2) == 6 + 4
    assert search.trial_bound(1, 4, 3) == 3
    assert search.trial_bound(96, 4, 3) == 96 * 3
    rng = random.Random(39)
    for count in range(1, 40):
        for bands in (1, 2, 5):
            parsed = {"--max-running-requests": list(range(1, count + 1))}
            state = search.new_search(
                parsed, bands=list(range(1, bands + 1)), slo=SLO, budget_s=86400.0, started=0.0
            )
            steps = 0
            while search.next_trial(state, 0.0) is not None:
                steps += 1
                trial = state["trials"][-1]
                scores = {
                    str(b): {"goodput": rng.random(), "low": 0, "high": 1} for b in state["bands"]
                }
                search.record_trial(state, trial["id"], {"status": "ok", "scores": scores}, 0.0)
            assert steps <= search.trial_bound(count, bands, 3)
