"""analysis.telemetry: power and tokens-per-joule columns and gpu_throttled warnings, from the real
H200 capture's summary and from hostile level files."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from analysis import telemetry
from analysis.results import Level

REPO = Path(__file__).resolve().parents[2]
H200_SUMMARY = json.loads((REPO / "docs" / "measurements" / "telemetry-h200.json").read_text())


def level(gpu, concurrency=64, **extra) -> Level:
    summary = {"output_tokens_per_s": 1000.0}
    if gpu is not None:
        summary["gpu"] = gpu
    built = Level(
        path="run/h200/fast/chat/c64.json",
        host="h200",
        config="fast",
        prompt_set="chat",
        concurrency=concurrency,
        schema_version=1,
        run_id="run",
        summary=summary,
        client={},
        crashed=False,
        settings={},
        provenance={},
    )
    for name, value in extra.items():
        setattr(built, name, value)
    return built


def test_columns_from_the_h200_capture():
    columns = telemetry.columns({"gpu": H200_SUMMARY}, 1000.0)
    assert columns == {
        "gpu_power_w_mean": 557.6,
        "output_tokens_per_joule": round(1000.0 / 557.6, 4),
    }


def test_columns_without_telemetry_or_throughput():
    empty = {"gpu_power_w_mean": None, "output_tokens_per_joule": None}
    assert telemetry.columns({}, 1000.0) == empty
    assert telemetry.columns({"gpu": None}, 1000.0) == empty
    assert telemetry.columns({"gpu": H200_SUMMARY}, None) == {
        "gpu_power_w_mean": 557.6,
        "output_tokens_per_joule": None,
    }


@pytest.mark.parametrize(
    "power",
    ["557.6", True, None, 0, -3.0, math.nan, math.inf, 1e12, [557.6], {"mean": 557.6}],
)
def test_columns_ignore_power_that_is_not_a_plausible_number(power):
    gpu = dict(H200_SUMMARY, power_w_mean=power)
    assert telemetry.columns({"gpu": gpu}, 1000.0) == {
        "gpu_power_w_mean": None,
        "output_tokens_per_joule": None,
    }


@pytest.mark.parametrize("tokens", ["1000", True, -1.0, math.nan, math.inf, [1000.0]])
def test_columns_ignore_throughput_that_is_not_a_plausible_number(tokens):
    assert telemetry.columns({"gpu": H200_SUMMARY}, tokens)["output_tokens_per_joule"] is None


@pytest.mark.parametrize("summary", [None, [], "gpu", 3, {"gpu": []}, {"gpu": "x"}])
def test_columns_ignore_summaries_of_the_wrong_shape(summary):
    assert telemetry.columns(summary, 1000.0) == {
        "gpu_power_w_mean": None,
        "output_tokens_per_joule": None,
    }


def test_throttle_warning_from_the_h200_capture():
    warnings = telemetry.throttle_warnings([level(H200_SUMMARY)])
    assert warnings == [
        {
            "kind": "gpu_throttled",
            "severity": "warning",
            "where": "h200 / fast / chat / c64",
            "message": "GPU 0 held its clocks down for power cap in over 99% of samples "
            "(SM clock 1439 MHz mean against 1980 MHz max): throughput at this level is "
            "power-limited",
        }
    ]


def test_throttle_warnings_name_each_reason_and_gpu():
    gpu = copy.deepcopy(H200_SUMMARY)
    gpu["throttled"] = [
        {"gpu": 0, "reason": "power_cap", "share": 0.93, "sm_clock_mhz_mean": 1410,
         "sm_clock_max_mhz": 1980},
        {"gpu": 3, "reason": "thermal", "share": 0.5, "sm_clock_mhz_mean": 1200,
         "sm_clock_max_mhz": None},
        {"gpu": 7, "reason": "hw_slowdown", "share": 1.0},
    ]  # fmt: skip
    messages = [w["message"] for w in telemetry.throttle_warnings([level(gpu)])]
    assert messages == [
        "GPU 0 held its clocks down for power cap in 93% of samples (SM clock 1410 MHz mean "
        "against 1980 MHz max): throughput at this level is power-limited",
        "GPU 3 held its clocks down for thermal in 50% of samples (SM clock 1200 MHz mean): "
        "throughput at this level is limited by cooling",
        "GPU 7 held its clocks down for hardware slowdown in 100% of samples: throughput at this "
        "level is limited by a hardware slowdown (power brake or external signal)",
    ]


def test_rate_levels_are_named_by_their_rate():
    rate_level = level(H200_SUMMARY, request_rate=2.5)
    assert telemetry.throttle_warnings([rate_level])[0]["where"] == "h200 / fast / chat / r2.5"


def test_levels_without_throttling_or_telemetry_warn_nothing():
    calm = dict(H200_SUMMARY, throttled=[])
    assert telemetry.throttle_warnings([level(calm), level(None)]) == []


@pytest.mark.parametrize(
    "entry",
    [
        "power_cap",
        None,
        {"gpu": 0, "reason": "cosmic_rays", "share": 0.9},
        {"gpu": 0, "reason": "power_cap", "share": "0.9"},
        {"gpu": 0, "reason": "power_cap", "share": 1.5},
        {"gpu": 0, "reason": "power_cap", "share": 0.1},
        {"gpu": 0, "reason": "power_cap", "share": math.nan},
        {"gpu": True, "reason": "power_cap", "share": 0.9},
        {"gpu": -1, "reason": "power_cap", "share": 0.9},
        {"gpu": 10**9, "reason": "power_cap", "share": 0.9},
        {"gpu": "0", "reason": "power_cap", "share": 0.9},
        {"gpu": 0, "reason": ["power_cap"], "share": 0.9},
    ],
)
def test_hostile_throttle_entries_are_ignored(entry):
    gpu = dict(H200_SUMMARY, throttled=[entry])
    assert telemetry.throttle_warnings([level(gpu)]) == []


def test_hostile_clock_figures_are_left_out_of_the_message():
    entry = {"gpu": 0, "reason": "power_cap", "share": 0.5, "sm_clock_mhz_mean": "1410",
             "sm_clock_max_mhz": math.inf}  # fmt: skip
    [warning] = telemetry.throttle_warnings([level(dict(H200_SUMMARY, throttled=[entry]))])
    assert warning["message"] == (
        "GPU 0 held its clocks down for power cap in 50% of samples: throughput at this level "
        "is power-limited"
    )


def test_hostile_levels_and_shapes_do_not_crash():
    duplicated = dict(H200_SUMMARY, throttled=H200_SUMMARY["throttled"] * 500)
    odd_host = level(H200_SUMMARY, host="h\x1b[31m" + "x" * 500)
    levels = [
        level("not a dict"),
        level(dict(H200_SUMMARY, throttled="power_cap")),
        level(dict(H200_SUMMARY, throttled={"gpu": 0})),
        SimpleNamespace(summary=None),
        SimpleNamespace(summary={"gpu": H200_SUMMARY}),  # no host, config, set or concurrency
        object(),
        level(duplicated),
        odd_host,
    ]
    warnings = telemetry.throttle_warnings(levels)
    assert [w["where"] for w in warnings] == [
        "? / ? / ? / c?",
        "h200 / fast / chat / c64",
        "h" + "[31m" + "x" * 115 + " / fast / chat / c64",
    ]
    assert telemetry.throttle_warnings(None) == []
    assert telemetry.throttle_warnings("levels") == []


def test_an_eight_gpu_host_at_its_power_limit_warns_once_per_level_across_repeats():
    def capped(shares: list[float], clock: int) -> dict:
        throttled = [
            {"gpu": index, "reason": "power_cap", "share": share, "sm_clock_mhz_mean": clock,
             "sm_clock_max_mhz": 1980}
            for index, share in enumerate(shares)
        ]  # fmt: skip
        return dict(H200_SUMMARY, throttled=throttled)

    first = level(capped([0.93] * 8, 1410))
    second = level(capped([0.998] * 8, 1450))  # the level's repeat: same host, config, set, c64
    other = level(dict(H200_SUMMARY, throttled=[
        {"gpu": 0, "reason": "power_cap", "share": 0.5},
        {"gpu": 2, "reason": "power_cap", "share": 0.5},
        {"gpu": 3, "reason": "thermal", "share": 0.4},
    ]), concurrency=16)  # fmt: skip
    warnings = telemetry.throttle_warnings([first, second, other])
    assert [(w["where"], w["message"]) for w in warnings] == [
        (
            "h200 / fast / chat / c64",
            "GPUs 0-7 held their clocks down for power cap in 93% to over 99% of samples over 2 "
            "runs (SM clock 1410 to 1450 MHz mean against 1980 MHz max): throughput at this "
            "level is power-limited",
        ),
        (
            "h200 / fast / chat / c16",
            "GPUs 0, 2 held their clocks down for power cap in 50% of samples: throughput at "
            "this level is power-limited",
        ),
        (
            "h200 / fast / chat / c16",
            "GPU 3 held its clocks down for thermal in 40% of samples: throughput at this level "
            "is limited by cooling",
        ),
    ]


def eight_gpus(power: list[float]) -> dict:
    gpus = [{"index": i, "power_w": {"mean": watts, "max": watts}} for i, watts in enumerate(power)]
    return {"power_w_mean": sum(power), "gpus": gpus}


@pytest.mark.parametrize(
    ("argv", "environment", "expected"),
    [
        (["--tp-size", "8"], {}, list(range(8))),
        (["--tp", "4"], {}, [0, 1, 2, 3]),
        (["--tp-size", "2", "--base-gpu-id", "4"], {}, [4, 5]),
        (["--tp-size", "2", "--base-gpu-id", "1", "--gpu-id-step", "2"], {}, [1, 3]),
        (["--tp-size", "2", "--pp-size", "2"], {}, [0, 1, 2, 3]),
        (["--tp-size", "16", "--nnodes", "2"], {}, list(range(8))),
        (["--tp-size", "2"], {"CUDA_VISIBLE_DEVICES": "6,7"}, [6, 7]),
        (["--tp-size", "2"], {"CUDA_VISIBLE_DEVICES": "GPU-1234,GPU-5678"}, None),
        (["--tp-size", "4"], {"CUDA_VISIBLE_DEVICES": "6,7"}, None),  # fewer than it serves on
        (["--tp-size", "3", "--nnodes", "2"], {}, None),
        ([], {}, None),
        (["--tp-size", "x"], {}, None),
        ("--tp-size 8", {}, None),
    ],
)
def test_the_gpus_a_launch_serves_on(argv, environment, expected):
    provenance = {"launch": {"argv": argv, "environment": environment}}
    assert telemetry.server_gpu_indexes(provenance) == expected


def test_power_counts_only_the_gpus_the_server_runs_on():
    # A TP4 server on an 8-GPU host: four GPUs at 650 W, four idle at 75 W.
    summary = {"gpu": eight_gpus([650.0] * 4 + [75.0] * 4)}
    served = telemetry.columns(summary, 2600.0, [0, 1, 2, 3])
    assert served == {"gpu_power_w_mean": 2600.0, "output_tokens_per_joule": 1.0}
    # Unknown GPUs, or GPUs the summary does not list: the whole host.
    assert telemetry.columns(summary, 2600.0)["gpu_power_w_mean"] == 2900.0
    assert telemetry.columns(summary, 2600.0, [0, 9])["gpu_power_w_mean"] == 2900.0
    listed_twice = {"gpu": dict(eight_gpus([650.0] * 8), gpus=eight_gpus([650.0] * 8)["gpus"] * 2)}
    assert telemetry.columns(listed_twice, 1.0, [0])["gpu_power_w_mean"] == 5200.0
