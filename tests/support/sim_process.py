"""Starting tests/support/sglang_sim.py as a server process: argv as the kit renders it, a free
port, and a wait for health as a deploy waits."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]

BASE = [
    "--model-path",
    "/w/t",
    "--trust-remote-code",
    "--tp-size",
    "8",
    "--attention-backend",
    "flashinfer",
    "--enable-metrics",
    "--host",
    "127.0.0.1",
]
# DFlash's speculative flags, as the kit renders them (block size 8 = draft tokens).
DFLASH = [
    "--speculative-algorithm",
    "DFLASH",
    "--speculative-draft-model-path",
    "/w/d",
    "--speculative-num-draft-tokens",
    "8",
    "--speculative-dflash-block-size",
    "8",
    "--speculative-draft-window-size",
    "4096",
]
EAGLE = [
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-draft-model-path",
    "/w/e",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "4",
]
# SGLang checks once a second whether its warmup request and a /health_generate request have
# generated (SGLANG_SIM_POLL_SECONDS, 1 by default as in SGLang): a server start took over 2 s
# of waiting. The tests that do not assert those seconds have the simulator check every tenth
# of one (test_sglang_sim.py proves the one-second checks).
QUICK_POLLS = {"SGLANG_SIM_POLL_SECONDS": "0.1"}
# The server role's simulator where a test starts one on a host and asserts nothing of its
# timing (test_server.py, test_launch_check.py): offline, loaded in a second, 5 ms a step.
SERVER_ENV = {
    **QUICK_POLLS,
    "HF_HUB_OFFLINE": "1",
    "SGLANG_SIM_LOAD_SECONDS": "1",
    "SGLANG_SIM_STEP_MS": "5",
}
SPEC_FIELDS = {
    "spec_accept_rate",
    "spec_accept_length",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_verify_ct",
    "spec_correct_drafts_histogram",
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def quiet_port(low: int = 20000, high: int = 32000) -> int:
    """A free port below the kernel's ephemeral range (ip_local_port_range starts at 32768),
    which free_port() in another xdist worker never hands out: for a server that takes long to
    open its port, during which a port from bind(0) could go to another test's server."""
    import random

    for _ in range(200):
        port = random.randint(low, high)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise AssertionError(f"no free port from {low} to {high}")


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def start(
    argv: list[str], wait: str = "healthy", runtime: Path | None = None, **env
) -> tuple[subprocess.Popen, str]:
    """Start the simulator; return once it is healthy (/health_generate answered 200, as a
    deploy waits), with wait="port" once its port accepts connections, with wait="none" at
    once; earlier when it exits. runtime: a test runtime's package folder (write_package), run
    as `python -m sglang.launch_server` is; by default the release simulator from the repo."""
    port = free_port()
    command = [sys.executable, str(REPO / "tests" / "support" / "sglang_sim.py")]
    if runtime is not None:
        command = [sys.executable, "-m", "sglang.launch_server"]
        env = {**env, "PYTHONPATH": str(runtime)}
    process = subprocess.Popen(
        [*command, *argv, "--port", str(port)],
        env={"PATH": "/usr/bin:/bin", **QUICK_POLLS, **{k: str(v) for k, v in env.items()}},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    if wait == "none":
        return process, url
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return process, url
        if port_open(port):
            if wait == "port":
                return process, url
            with_key = {}
            if "--api-key" in argv:
                with_key = {"Authorization": f"Bearer {argv[argv.index('--api-key') + 1]}"}
            answer = requests.get(f"{url}/health_generate", headers=with_key, timeout=30)
            if answer.status_code == 200:
                return process, url
        time.sleep(0.05)
    process.kill()
    process.wait()
    raise AssertionError("simulator did not start")


def stop(*processes: subprocess.Popen) -> None:
    for process in processes:
        process.kill()
        process.wait()
