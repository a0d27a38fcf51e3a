"""The DDTree budget study played against the simulator: the example report of
docs/studies/ddtree-budget.md.

Two simulated hosts run the same serving configs the kit renders for a ct200 host (ar, dflash,
the chain control dflash-tree-backend, DDTree at budgets 16, 32, 64 and 128; argv from
models/kimi-k2.6/model.yml through module_utils/plan/serving.py): `sim-healthy` plays the healthy
pure-attention sweep of tests/support/ddtree_tables.py, `sim-hybrid-collapse` the sweep shaped
like the hybrid model's collapse. Each config is served by tests/support/sglang_sim.py as the
runtime the kit
would install (the release, or the fake DDTree pull-request runtime), benchmarked by the kit's
own sglang_benchmark module, checked for losslessness, and the run is analysed with the label
SIMULATED in the title and in every plot's image, title and caption.

    .venv/bin/python -m tests.support.ddtree_study --out docs/studies/ddtree-budget [--quick]

Nothing here is a measurement of a GPU: every figure follows from the settings below.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml

from tests.support import models
from tests.support.ddtree_tables import HEALTHY, HYBRID_COLLAPSE, table_env
from tests.support.sim_process import QUICK_POLLS

REPO = Path(__file__).resolve().parents[2]
LABEL = "SIMULATED"
HOSTS = {"sim-healthy": HEALTHY, "sim-hybrid-collapse": HYBRID_COLLAPSE}
BUDGETS = [16, 32, 64, 128]
# Per config outside the DDTree table: step ms and tokens a verify step. AR steps are the
# cheapest; DFlash on the release runs with overlap scheduling, its chain control on the tree
# backend without, so a step there costs a little more. Accept 4.4 sits in the K2.6 DFlash
# drafter card's 3.6-4.9 range.
CHAIN_SETTINGS = {
    "ar": {"SGLANG_SIM_STEP_MS": "20"},
    "dflash": {"SGLANG_SIM_STEP_MS": "27", "SGLANG_SIM_ACCEPT": "4.4"},
    "dflash-tree-backend": {"SGLANG_SIM_STEP_MS": "29", "SGLANG_SIM_ACCEPT": "4.4"},
}
PREFILL_MS = 50
HOST_PYTHONS = yaml.safe_load((REPO / "group_vars/all/serving.yml").read_text())[
    "kimi_runtime_pythons"
]
PROMPT_SET = "gsm8k-like"
RENDER_SETTINGS = {
    "model_path": "/opt/kimi/weights/moonshotai/Kimi-K2.6",
    "draft_model_paths": {
        "dflash": "/opt/kimi/weights/z-lab/Kimi-K2.6-DFlash",
        "eagle3": "/opt/kimi/weights/lightseekorg/kimi-k2.6-eagle3.1-mla",
    },
    "tp_size": 8,
    "mem_fraction_static": 0.85,
    "kv_cache_dtype": "auto",
    "chunked_prefill_size": 16384,
    # K2.6's backends on the ct200 profile (models/kimi-k2.6/model.yml).
    "attention_backends": {"target": "flashinfer", "draft": "flashinfer", "tree": "triton"},
    "host": "127.0.0.1",
    "tool_call_parser": "kimi_k2",
    "reasoning_parser": "kimi_k2",
    "environment": {},
    "release": "0.5.23",
    "git": {"url": "https://github.com/sgl-project/sglang.git", "ref": "refs/pull/29907/head"},
    "extra_args": [],
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launches(port: int) -> list[dict]:
    """The kit's own launch commands for the study's configs, as on a ct200 host."""
    from ansible.module_utils.plan.serving import render_all

    import module_utils  # noqa: F401

    definitions = models.definitions("kimi-k2.6", budgets=BUDGETS)
    settings = {
        **RENDER_SETTINGS,
        # The runtimes' Pythons on a ct200 host (group_vars/all/serving.yml), as the launch
        # records show them; serve() runs the argv with this Python instead.
        "pythons": HOST_PYTHONS,
        "port": port,
    }
    selected = ["ar", "dflash", "dflash-tree-backend", "ddtree"]
    return render_all(definitions, selected, settings)


def serve(launch: dict, runtime: Path, environment: dict, log: Path) -> subprocess.Popen:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(runtime), **QUICK_POLLS, **environment}
    argv = list(launch["argv"])
    if argv and argv[0] in HOST_PYTHONS.values():
        argv[0] = sys.executable
    with log.open("w") as handle:
        return subprocess.Popen(argv, env=env, stdout=handle, stderr=subprocess.STDOUT, text=True)


def serve_healthy(launch_at, runtime: Path, environment: dict, log: Path, label: str):
    """The simulator for launch_at(port), started and healthy: (process, url, launch). A free
    port may be taken by another process before the simulator binds it (a quick run starts
    several at once, beside other tests): then another port, at most three times."""
    for attempt in range(3):
        port = free_port()
        launch = launch_at(port)
        process = serve(launch, runtime, environment, log)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, process)
            return process, url, launch
        except RuntimeError as error:
            process.kill()
            process.wait()
            tail = log.read_text(errors="replace")[-2000:]
            if "address already in use" not in tail.lower() or attempt == 2:
                raise RuntimeError(f"{label}: {error}; its log ends:\n{tail}") from None
    raise AssertionError("unreachable")


def wait_healthy(url: str, process: subprocess.Popen, timeout: float = 60) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the simulator exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health_generate", timeout=30) as answer:  # noqa: S310 - loopback
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the simulator at {url} was not healthy within {timeout} s")


def prompts(folder: Path, count: int) -> Path:
    path = folder / f"{PROMPT_SET}.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "prompt": f"Question {i}: a train leaves at {i} o'clock; when does it "
                    "arrive? Reason step by step."
                }
            )
            + "\n"
            for i in range(count)
        )
    )
    return path


def refuse_foreign(out: Path) -> None:
    """The copy replaces `out`, so `out` must be absent, empty or an earlier simulated study."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    summary = out / "summary.md"
    if out.is_dir() and summary.is_file() and summary.read_text().startswith(f"# {LABEL}: "):
        return
    raise SystemExit(
        f"{out} holds something other than an earlier simulated study; "
        "give --out a new or empty folder (nothing there is replaced)"
    )


def measure(job: dict) -> str:
    """Serve one config on one simulated host and benchmark it with the kit's module."""
    from tests.support.modules import run_module

    config, scale = job["config"], job["scale"]
    # Which runtime serves it does not depend on the port.
    launch = next(item for item in launches(0) if item["name"] == config)
    kind = "git" if launch["runtime"].startswith("git+") else "release"
    environment = {
        "SGLANG_SIM_PREFILL_MS": str(PREFILL_MS * scale),
        "SGLANG_SIM_DDTREE_TABLE": table_env(job["table"], scale),
        **{
            key: str(float(value) * scale) if key == "SGLANG_SIM_STEP_MS" else value
            for key, value in CHAIN_SETTINGS.get(config, {}).items()
        },
    }
    folder = Path(job["folder"])
    folder.mkdir(parents=True)
    record = folder / "launch.json"
    record.write_text(json.dumps({**launch, "config": config}) + "\n")
    (folder / "provenance.json").write_text(
        json.dumps({"host": job["host"], "config": config, "records": {"launch": str(record)}})
    )
    log = Path(job["work"]) / f"{job['host']}-{config}.log"
    process, url, launch = serve_healthy(
        lambda port: next(item for item in launches(port) if item["name"] == config),
        Path(job["runtimes"][kind]),
        environment,
        log,
        f"{job['host']} {config}",
    )
    record.write_text(json.dumps({**launch, "config": config}) + "\n")
    try:
        result = run_module(
            "sglang_benchmark",
            {
                "base_url": url,
                "concurrency": job["levels"],
                "prompts": job["prompts"],
                "num_prompts": job["count"],
                "max_new_tokens": job["tokens"],
                "warmup_requests": 1,
                "request_timeout": 120,
                "output_dir": str(folder / PROMPT_SET),
                "run_label": "ddtree-budget-simulated",
                "config_name": config,
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
        raise RuntimeError(f"{job['host']} {config}: {result.get('msg')}")
    return f"{job['host']} {config}: {len(job['levels'])} levels"


def run_study(out: Path, quick: bool = False) -> Path:
    """The whole study into `out`. A full run serves one config at a time, as a host does, so
    the simulated step times are not disturbed by each other; the quick run (a smoke check of
    this script) serves them side by side."""
    from tests.support.fake_sglang import write_package
    from tests.support.modules import load_module

    refuse_foreign(out)
    levels = [1, 4] if quick else [1, 4, 16]
    count, tokens = (4, 64) if quick else (16, 256)
    # Steps of a tenth (about 3 ms) were measured up to 10% long on a loaded 2-core machine,
    # enough to hide the planted collapse (step time -3.2%, the rule's bound +5%).
    scale = 0.3 if quick else 1.0
    work = Path(tempfile.mkdtemp(prefix="ddtree-study-"))
    try:
        runtimes = {
            "release": str(write_package(work / "release")),
            "git": str(write_package(work / "git", "0.5.23.dev1", ddtree=True)),
        }
        prompt_file = str(prompts(work, count))
        root = work / "run" / "ddtree-budget-simulated"
        root.mkdir(parents=True)
        (root / "run.json").write_text(
            json.dumps({"run_id": "ddtree-budget-simulated", "reference_config": "ar"}) + "\n"
        )
        configs = [launch["name"] for launch in launches(0)]
        jobs = [
            {
                "host": host,
                "table": table,
                "config": config,
                "scale": scale,
                "levels": levels,
                "count": count,
                "tokens": tokens,
                "prompts": prompt_file,
                "runtimes": runtimes,
                "folder": str(root / host / config),
                "work": str(work),
            }
            for host, table in HOSTS.items()
            for config in configs
        ]
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=6 if quick else 1, mp_context=context) as pool:
            for line in pool.map(measure, jobs):
                print(line, flush=True)
        for host in HOSTS:
            check = load_module("benchmark_lossless").check(str(root / host), "ar", 0.1)
            (root / host / "lossless.json").write_text(json.dumps(check))
        import analysis

        outcome = analysis.report(root, out=work / "report", label=LABEL)
        # Each sweep's decomposition alone too, for a page that shows one of them.
        alone = {
            host: analysis.report(root / host, out=work / f"report-{host}", label=LABEL).out
            for host in HOSTS
        }
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(outcome.out, out)
        for host, folder in alone.items():
            shutil.copy(folder / "plots" / "decomposition.png", out / f"decomposition-{host}.png")
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where the report is copied")
    parser.add_argument(
        "--quick", action="store_true", help="two levels, few short requests, steps at 0.3"
    )
    args = parser.parse_args(argv)
    print(run_study(args.out, args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
