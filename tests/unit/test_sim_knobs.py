"""The simulator's planted goodput surface for autotune (SGLANG_SIM_KNOBS): steps slower away
from the optimum, out of memory in its region as SGLang fails while it loads, noise between
starts, and --max-running-requests honoured as SGLang's scheduler honours it."""

from __future__ import annotations

import json
import re
import time

import requests

from tests.support.sim_process import BASE, start, stop

KNOBS = {
    "optimum": {"--cuda-graph-max-bs-decode": 24, "--max-running-requests": 64},
    "penalty": 0.5,
    "oom": [{"--mem-fraction-static": 0.9, "--max-running-requests": 128}],
}


def factor_of(process) -> float:
    """The factor the simulator printed at start (its first lines of stdout)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        match = re.search(r"every step ([0-9.]+) times as long", line)
        if match:
            return float(match.group(1))
    raise AssertionError("no SGLANG_SIM_KNOBS line")


def test_steps_grow_away_from_the_planted_optimum_and_the_cap_holds():
    at = ["--cuda-graph-max-bs-decode", "24", "--max-running-requests", "64"]
    process, url = start([*BASE, *at], SGLANG_SIM_KNOBS=json.dumps(KNOBS))
    try:
        assert factor_of(process) == 1.0
        info = requests.get(f"{url}/server_info", timeout=10).json()
        assert info["max_running_requests"] == 64
    finally:
        stop(process)
    # 48 is one doubling from 24 (x1.5), 16 two from 64 (x2): 3 times as long.
    away = ["--cuda-graph-max-bs-decode", "48", "--max-running-requests", "16"]
    process, _ = start([*BASE, *away], SGLANG_SIM_KNOBS=json.dumps(KNOBS))
    try:
        assert factor_of(process) == 3.0
    finally:
        stop(process)


def test_a_launch_in_the_oom_region_fails_while_it_loads():
    big = ["--mem-fraction-static", "0.92", "--max-running-requests", "256"]
    process, url = start([*BASE, *big], wait="none", SGLANG_SIM_KNOBS=json.dumps(KNOBS))
    assert process.wait(timeout=20) != 0
    stderr = process.stderr.read()
    assert "Scheduler hit an exception" in stderr
    assert "torch.OutOfMemoryError: CUDA out of memory" in stderr
    # Just below one bound of the region: it starts.
    below = ["--mem-fraction-static", "0.88", "--max-running-requests", "256"]
    process, url = start([*BASE, *below], SGLANG_SIM_KNOBS=json.dumps(KNOBS))
    try:
        assert requests.get(f"{url}/health", timeout=10).status_code == 200
    finally:
        stop(process)


def test_noise_draws_a_factor_per_start_and_a_bad_spec_stops_the_server():
    noisy = {"optimum": {}, "noise": 0.2}
    factors = set()
    for _ in range(3):
        process, _ = start(BASE, wait="port", SGLANG_SIM_KNOBS=json.dumps(noisy))
        try:
            factors.add(factor_of(process))
        finally:
            stop(process)
    assert len(factors) > 1 and all(0.8 <= f <= 1.2 for f in factors)
    process, _ = start(BASE, wait="none", SGLANG_SIM_KNOBS="[1]")
    assert process.wait(timeout=20) == 1
    assert "SGLANG_SIM_KNOBS: SGLANG_SIM_KNOBS is not a JSON object" in process.stderr.read()
