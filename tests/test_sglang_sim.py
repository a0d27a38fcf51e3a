"""The SGLang simulator: pinned-parser argv only, SGLang's endpoints and streaming format."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.runtime
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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(argv: list[str], **env) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "sglang_sim.py"), *argv, "--port", str(port)],
        env={"PATH": "/usr/bin:/bin", **{k: str(v) for k, v in env.items()}},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            requests.get(f"{url}/health", timeout=1)
            return process, url
        except requests.ConnectionError:
            if process.poll() is not None:
                return process, url
            time.sleep(0.05)
    raise AssertionError("simulator did not start")


def stream(url: str, prompt: str, tokens: int) -> list[dict]:
    response = requests.post(
        f"{url}/generate",
        json={
            "text": prompt,
            "sampling_params": {"max_new_tokens": tokens, "temperature": 0},
            "stream": True,
        },
        stream=True,
        timeout=30,
    )
    events = []
    for line in response.iter_lines():
        if line.startswith(b"data: "):
            data = line[len(b"data: ") :]
            events.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return events


def test_rejects_what_the_pinned_parser_rejects():
    process, _url = start([*BASE, "--mem-fraction-statik", "0.8"])
    assert process.wait(timeout=20) == 2
    assert "mem-fraction-statik" in process.stderr.read()


def test_speculative_stream_carries_several_tokens_per_event():
    process, url = start(
        [
            *BASE,
            *DFLASH,
        ],
        SGLANG_SIM_STEP_MS=10,
        SGLANG_SIM_ACCEPT=4,
        SGLANG_SIM_PREFILL_MS=20,
    )
    try:
        assert requests.get(f"{url}/health_generate", timeout=5).status_code == 200
        events = stream(url, "What is 2 + 2?", 40)
        assert events[-1] == "[DONE]"
        last = events[-2]
        meta = last["meta_info"]
        assert meta["completion_tokens"] == 40
        assert meta["spec_verify_ct"] == 10
        assert meta["spec_accept_length"] == 4.0
        assert len(last["text"].split()) == 40  # cumulative text
        assert len(events) == 11  # ten verify steps of four tokens, then [DONE]
        info = requests.get(f"{url}/server_info", timeout=5).json()
        assert info["version"] == "0.5.23"
        assert info["internal_states"][0]["avg_spec_accept_length"] == 4.0
        assert "sglang:generation_tokens_total 40" in requests.get(f"{url}/metrics", timeout=5).text
        assert requests.post(f"{url}/flush_cache", timeout=5).status_code == 200
    finally:
        process.kill()
        process.wait()


def test_outputs_are_deterministic_and_lossy_speculation_differs():
    ar, ar_url = start(BASE)
    spec_argv = [
        *BASE,
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
    exact, exact_url = start(spec_argv, SGLANG_SIM_ACCEPT=3)
    lossy, lossy_url = start(spec_argv, SGLANG_SIM_ACCEPT=3, SGLANG_SIM_LOSSY=0.3)
    try:
        reference = stream(ar_url, "p", 30)[-2]["text"]
        assert "spec_verify_ct" not in stream(ar_url, "p", 5)[-2]["meta_info"]
        assert stream(exact_url, "p", 30)[-2]["text"] == reference
        assert stream(lossy_url, "p", 30)[-2]["text"] != reference
    finally:
        for process in (ar, exact, lossy):
            process.kill()
            process.wait()


def test_load_time_and_crash():
    process, url = start(BASE, SGLANG_SIM_LOAD_SECONDS=30)
    try:
        assert requests.get(f"{url}/health", timeout=5).status_code == 503
    finally:
        process.kill()
        process.wait()
    process, url = start(BASE, SGLANG_SIM_CRASH_AFTER=1)
    stream(url, "one", 3)
    with pytest.raises(requests.RequestException):
        stream(url, "two", 3)
    assert process.wait(timeout=10) == 1
    process, _url = start(BASE, SGLANG_SIM_CRASH_ON_START=1)
    assert process.wait(timeout=10) == 1
