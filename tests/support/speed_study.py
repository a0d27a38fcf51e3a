"""Measured against predicted, played against the simulator: a run whose step times follow the
kit's speed model (module_utils/plan/speed_model.py), with one config slowed by a power cap and one
host whose all-reduce is slow.

Two simulated H200 hosts (TP 8) serve the kit's own launches (models/kimi-k2.6/model.yml
through module_utils/plan/serving.py, the h200 profile's attention backends) through
tests/support/sglang_sim.py with SGLANG_SIM_SPEED_MODEL: every decode step takes what the
speed model predicts for the launch at the requests decoding and their context, each config
accepts what the model expects from the published acceptance (so a healthy level's ratios sit
near 1), and the kit's sglang_benchmark module measures it with GPU telemetry from the fake
nvidia-smi (tests/support/fakes/nvidia_smi.py):

- `sim-h200`: ar, eagle3, dflash and DDTree at budgets 16 and 64, healthy, with a healthy
  all-reduce record (the profile's own figures) in each level's provenance; but eagle3 runs
  SLOWDOWN times slower than the model while the fake nvidia-smi replays the power-capped H200
  capture (docs/measurements/telemetry-h200.csv: the power-cap reason in nearly every busy
  sample, the SM clock at 1439 of 1980 MHz).
- `sim-h200-slow-nccl`: ar on a host whose all-reduce record (and so the simulator's
  all-reduces) is ALLREDUCE_SLOWER times the profile's figure.

    .venv/bin/python -m tests.support.speed_study --out DIR

writes the report there, labelled SIMULATED. Nothing here is a measurement of a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support import models
from tests.support.ansible_run import patched_environ
from tests.support.ddtree_study import HOST_PYTHONS, RENDER_SETTINGS, serve_healthy

REPO = Path(__file__).resolve().parents[2]
LABEL = "SIMULATED"
MODEL_DIR = REPO / "models" / "kimi-k2.6"
PROFILE = "h200"
PROMPT_SET = "gsm8k"  # the published acceptance's set: healthy levels accept what it gives
BUDGETS = [16, 64]
HEALTHY_HOST, SLOW_NCCL_HOST = "sim-h200", "sim-h200-slow-nccl"
POWER_CAPPED = "eagle3"
SLOWDOWN = 1.6  # the power-capped config's steps against the model's
ALLREDUCE_SLOWER = 10.0  # the slow host's all-reduce against the profile's figures
HOSTS = {
    HEALTHY_HOST: ["ar", "eagle3", "dflash", "ddtree-b16", "ddtree-b64"],
    SLOW_NCCL_HOST: ["ar"],
}
LEVELS = [1, 4]
PROMPTS = 4  # every level sends 4: c4 runs one full wave
# Long enough that a request's last verify step, cut at max_new_tokens, moves its accepted
# tokens per step by a percent or two, short enough that the slow host's c1 takes seconds.
TOKENS = 96
PREFILL_MS = 30
CAPPED_TELEMETRY = REPO / "docs" / "measurements" / "telemetry-h200.csv"
GPU_CAPTURE = REPO / "tests" / "fixtures" / "gpu-hosts" / "b200-x8"  # eight GPUs to sample
GPU_FACTS = {
    "count": 8,
    "models": {"NVIDIA H200": 8},
    "driver_version": "580.95.05",
    "cuda_version": "13.0",
    "interconnect": "nvlink",
}
TELEMETRY_HEADER = (
    "timestamp, index, name, power.draw, power.limit, clocks.sm, clocks.max.sm, clocks.mem, "
    "temperature.gpu, utilization.gpu, memory.used, clocks_event_reasons.active"
)


def launches(port: int) -> list[dict]:
    """The kit's launch commands for the study's configs on an h200 host."""
    # First: the kit's stages become importable as ansible.module_utils.<stage>.
    importlib.import_module("module_utils")
    from ansible.module_utils.plan.serving import render_all

    settings = {
        **RENDER_SETTINGS,
        "attention_backends": {"target": "fa3", "draft": "fa3", "tree": "triton"},
        "pythons": HOST_PYTHONS,
        "port": port,
    }
    definitions = models.definitions("kimi-k2.6", budgets=BUDGETS)
    return render_all(definitions, ["ar", "eagle3", "dflash", "ddtree"], settings)


def allreduce_record(host: str, slower: float = 1.0) -> dict:
    """An all-reduce record as the tuning stage's check writes it (module_utils/tuning/allreduce.py
    make_baseline) over eight GPUs: the profile's latency and bus bandwidth, `slower` times."""
    sys.path.insert(0, str(REPO))
    from ansible.module_utils.plan import speed_inputs

    figures = speed_inputs.profile_figures(PROFILE)
    rows = []
    size = 32 << 10
    while size <= 1 << 30:
        us = speed_inputs.allreduce_us(figures, size, 8) * slower
        algbw = size / (us / 1e6) / 1e9
        rows.append(
            {
                "bytes": size,
                "time_us": round(us, 3),
                "algbw_GBps": round(algbw, 2),
                "busbw_GBps": round(algbw * 2 * 7 / 8, 2),
            }
        )
        size *= 4
    return {
        "schema": 1,
        "host": host,
        "recorded_at": "2026-12-01T00:00:00Z",
        "gpus": 8,
        "gpu_names": ["NVIDIA H200"] * 8,
        "transport": "P2P/CUMEM",
        "max_bytes": rows[-1]["bytes"],
        "busbw_GBps_max_size": rows[-1]["busbw_GBps"],
        "results": rows,
    }


def healthy_telemetry(path: Path) -> Path:
    """A capture of one busy H200 at full clocks, well under its power limit, no reason set."""
    lines = [TELEMETRY_HEADER]
    for second in range(20):
        for tenth in range(5):
            stamp = f"2026/12/01 10:00:{second:02d}.{tenth * 2}00"
            lines.append(
                f"{stamp}, 0, NVIDIA H200, 420.00, 700.00, 1980, 1980, 3201, 55, 92, 120000, "
                "0x0000000000000000"
            )
    path.write_text("\n".join(lines) + "\n")
    return path


def accepted(config: str, launch: dict) -> float | None:
    """What the speed model expects a step of this config to accept on the study's prompt set
    (None for AR): the simulator is told the same, so acceptance is as published."""
    sys.path.insert(0, str(REPO))
    from ansible.module_utils.plan import speed_inputs, speed_model

    if config == "ar":
        return None
    inputs = speed_inputs.model_inputs(MODEL_DIR)
    figures = speed_inputs.profile_figures(PROFILE)
    return speed_model.predict_launch(inputs, figures, launch["argv"], 1, 100, 8, PROMPT_SET)[
        "accepted_tokens_per_step"
    ]


def sim_environment(host: str, config: str, launch: dict, record: Path) -> dict:
    environment = {
        "SGLANG_SIM_SPEED_MODEL": str(MODEL_DIR),
        "SGLANG_SIM_SPEED_PROFILE": PROFILE,
        "SGLANG_SIM_SPEED_ALLREDUCE": str(record),
        "SGLANG_SIM_PREFILL_MS": str(PREFILL_MS),
    }
    accept = accepted(config, launch)
    if config.startswith("ddtree"):
        budget = launch["budget"]
        # The table's step time is unused under the speed model; its accept is the tree's.
        environment["SGLANG_SIM_DDTREE_TABLE"] = json.dumps(
            {str(budget): {"step_ms": 1.0, "accept": accept}}
        )
    elif accept is not None:
        environment["SGLANG_SIM_ACCEPT"] = str(accept)
    if host == HEALTHY_HOST and config == POWER_CAPPED:
        environment["SGLANG_SIM_SPEED_SLOWDOWN"] = str(SLOWDOWN)
    return environment


@contextlib.contextmanager
def fake_nvidia_smi(work: Path, telemetry: Path):
    """The fake nvidia-smi first on PATH for the benchmark module (in this process), replaying
    `telemetry`; the simulators never see it (their PATH is their own)."""
    bin_dir = work / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "nvidia-smi"
    tool.write_text(
        f'#!/bin/sh\nexec "{sys.executable}" "{REPO / "tests/support/fakes/nvidia_smi.py"}" "$@"\n'
    )
    tool.chmod(0o755)
    state = work / "fake-nvidia-smi"
    state.mkdir(exist_ok=True)
    changes = {
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "FAKE_NVIDIA_SMI_CAPTURE": str(GPU_CAPTURE),
        "FAKE_NVIDIA_SMI_TELEMETRY": str(telemetry),
        "FAKE_NVIDIA_SMI_STATE_DIR": str(state),
        "FAKE_NVIDIA_SMI_FAULT_FILE": str(state / "fault"),
        "FAKE_NVIDIA_SMI_LOOP_MAX_S": "600",
    }
    with patched_environ(changes):
        yield


def measure(root: Path, work: Path, runtimes: dict, host: str, config: str, prompts: Path):
    """Serve one config on one simulated host and benchmark it with the kit's module."""
    from tests.support.modules import run_module

    folder = root / host / config
    folder.mkdir(parents=True)
    record = work / f"{host}-allreduce.json"
    if not record.exists():
        slower = ALLREDUCE_SLOWER if host == SLOW_NCCL_HOST else 1.0
        record.write_text(json.dumps(allreduce_record(host, slower)) + "\n")
    log = work / f"{host}-{config}.log"
    # Its runtime and simulator settings do not depend on the port it is given.
    unbound = next(item for item in launches(0) if item["name"] == config)
    kind = "git" if unbound["runtime"].startswith("git+") else "release"
    process, url, launch = serve_healthy(
        lambda port: next(item for item in launches(port) if item["name"] == config),
        Path(runtimes[kind]),
        sim_environment(host, config, unbound, record),
        log,
        f"{host} {config}",
    )
    launch_record = folder / "launch.json"
    launch_record.write_text(json.dumps({**launch, "config": config}) + "\n")
    (folder / "provenance.json").write_text(
        json.dumps(
            {
                "kit_version": "0.1.0",
                "run_id": "speed-simulated",
                "host": host,
                "config": config,
                "gpu": GPU_FACTS,
                "records": {"launch": str(launch_record), "allreduce": str(record)},
            }
        )
    )
    capped = host == HEALTHY_HOST and config == POWER_CAPPED
    telemetry = CAPPED_TELEMETRY if capped else healthy_telemetry(work / "healthy.csv")
    try:
        with fake_nvidia_smi(work, telemetry):
            result = run_module(
                "sglang_benchmark",
                {
                    "base_url": url,
                    "concurrency": LEVELS,
                    "prompts": str(prompts),
                    "num_prompts": PROMPTS,
                    "requests_per_concurrency": 2,
                    "max_new_tokens": TOKENS,
                    "warmup_requests": 1,
                    "request_timeout": 120,
                    "output_dir": str(folder / PROMPT_SET),
                    "run_label": "speed-simulated",
                    "config_name": config,
                    "telemetry": "nvidia-smi",
                    "telemetry_interval_ms": 100,
                },
            )
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if result.get("failed"):
        raise RuntimeError(f"{host} {config}: {result.get('msg')}")


def run_study(root: Path) -> Path:
    """The simulated run under root (root/run.json, root/<host>/...); returns root."""
    from tests.support.fake_sglang import write_package
    from tests.support.modules import load_module
    from tests.support.results_tree import KIMI

    work = Path(tempfile.mkdtemp(prefix="speed-study-"))
    try:
        runtimes = {
            "release": write_package(work / "release"),
            "git": write_package(work / "git", "0.5.23.dev1", ddtree=True),
        }
        prompts = work / f"{PROMPT_SET}.jsonl"
        prompts.write_text(
            "".join(
                json.dumps({"prompt": f"Question {i}: how many apples are left? Reason it out."})
                + "\n"
                for i in range(PROMPTS)
            )
        )
        root.mkdir(parents=True, exist_ok=True)
        (root / "run.json").write_text(
            json.dumps(
                {
                    "run_id": "speed-simulated",
                    "reference_config": "ar",
                    "model": KIMI,
                    "started_at": "2026-12-01T00:00:00+00:00",
                    "ended_at": "2026-12-01T01:00:00+00:00",
                }
            )
            + "\n"
        )
        for host, configs in HOSTS.items():
            for config in configs:
                measure(root, work, runtimes, host, config, prompts)
            check = load_module("benchmark_lossless").check(str(root / host), "ar", 0.1)
            (root / host / "lossless.json").write_text(json.dumps(check))
        return root
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the report's folder (new)")
    args = parser.parse_args(argv)
    import analysis

    with tempfile.TemporaryDirectory(prefix="speed-run-") as folder:
        root = run_study(Path(folder) / "speed-simulated")
        print(analysis.report(root, out=args.out, label=LABEL).out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
