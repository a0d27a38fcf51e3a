"""The SGLang simulator behaves as SGLang 0.5.23 does where the kit depends on it: pinned-parser
argv only, the stream's shape and meta_info, start-up and health, /server_info, /flush_cache,
/metrics, uvicorn's HTTP framing, and outputs that drift or break under speculation. As the fake
DDTree pull-request runtime it serves DDTree, each budget as a table row says
(tests/support/ddtree_tables.py), within the pull request's rules and depth cap."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

from tests.support import sglang_sim
from tests.support.sim_process import (
    BASE,
    DFLASH,
    EAGLE,
    SPEC_FIELDS,
    start,
    stop,
)

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.runtime


def stream(url: str, prompt: str, tokens: int, **headers) -> list:
    response = requests.post(
        f"{url}/generate",
        json={
            "text": prompt,
            "sampling_params": {"max_new_tokens": tokens, "temperature": 0},
            "stream": True,
        },
        headers=headers,
        stream=True,
        timeout=30,
    )
    return events_of(response)


def events_of(response: requests.Response) -> list:
    """A stream's `data:` events, parsed, "[DONE]" as itself."""
    events = []
    for line in response.iter_lines():
        if line.startswith(b"data: "):
            data = line[len(b"data: ") :]
            events.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return events


def raw_exchange(port: int, request: bytes, until: bytes = b"0\r\n\r\n") -> bytes:
    """What the server sends for one request, as bytes, until `until` or the close."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(request)
        received = b""
        while not received.endswith(until):
            data = connection.recv(65536)
            if not data:
                break
            received += data
        return received


def dechunk(body: bytes) -> list[bytes]:
    """The chunks of a chunked body, strictly: size line, data, CRLF; the last is empty."""
    chunks = []
    while True:
        line, _, body = body.partition(b"\r\n")
        size = int(line, 16)
        chunks.append(body[:size])
        assert body[size : size + 2] == b"\r\n"
        body = body[size + 2 :]
        if size == 0:
            assert body == b""
            return chunks


def test_rejects_what_the_pinned_parser_rejects():
    process, _url = start([*BASE, "--mem-fraction-statik", "0.8"])
    assert process.wait(timeout=20) == 2
    assert "mem-fraction-statik" in process.stderr.read()


def test_the_first_token_comes_from_prefill_and_spec_fields_only_at_the_end():
    process, url = start(
        [*BASE, *DFLASH], SGLANG_SIM_STEP_MS=10, SGLANG_SIM_ACCEPT=4, SGLANG_SIM_PREFILL_MS=20
    )
    try:
        tokens = 30
        events = stream(url, "What is 2 + 2?", tokens)
        assert events[-1] == "[DONE]"
        first, *middle, last = events[:-1]
        # Prefill gives one token; every later event is one verify step of four.
        steps = math.ceil((tokens - 1) / 4)
        assert first["meta_info"]["completion_tokens"] == 1
        assert [e["meta_info"]["completion_tokens"] for e in middle] == [
            1 + 4 * k for k in range(1, steps)
        ]
        assert len(events) == 1 + steps + 1
        for event in (first, *middle):
            assert not SPEC_FIELDS & set(event["meta_info"]), event["meta_info"]
            assert event["meta_info"]["finish_reason"] is None
        assert "response_sent_to_client_ts" in first["meta_info"]
        assert "response_sent_to_client_ts" not in middle[0]["meta_info"]
        meta = last["meta_info"]
        assert meta["completion_tokens"] == tokens
        assert meta["finish_reason"] == {"type": "length", "length": tokens}
        assert meta["spec_verify_ct"] == steps
        # SGLang's own figure counts the prefill token: completion tokens / verify steps.
        assert meta["spec_accept_length"] == tokens / steps
        assert meta["spec_num_correct_drafts"] == 3 * steps
        assert meta["spec_num_proposed_drafts"] == 7 * steps
        assert meta["spec_accept_rate"] == pytest.approx(3 / 7)
        assert meta["spec_correct_drafts_histogram"] == [0, 0, 0, steps]
        assert {"e2e_latency", "id", "prompt_tokens", "cached_tokens"} <= set(meta)
        # Cumulative text and ids, one id per token.
        assert len(last["text"].split()) == tokens and len(last["output_ids"]) == tokens
        assert middle[0]["output_ids"] == last["output_ids"][:5]
        # A request that ends with its prefill token ran no verify step: no spec fields.
        assert not SPEC_FIELDS & set(stream(url, "short", 1)[-2]["meta_info"])
    finally:
        stop(process)


def test_plain_decoding_streams_one_token_an_event_without_spec_fields():
    process, url = start(BASE, SGLANG_SIM_STEP_MS=5)
    try:
        events = stream(url, "p", 6)
        assert [e["meta_info"]["completion_tokens"] for e in events[:-1]] == [1, 2, 3, 4, 5, 6]
        assert not SPEC_FIELDS & set(events[-2]["meta_info"])
    finally:
        stop(process)


def test_streams_are_chunked_as_uvicorn_sends_them_and_connections_kept_alive():
    process, url = start(BASE, SGLANG_SIM_STEP_MS=5)
    port = int(url.rsplit(":", 1)[1])
    try:
        body = json.dumps(
            {"text": "a b c", "sampling_params": {"max_new_tokens": 3}, "stream": True}
        ).encode()
        request = (
            b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        )
        raw = raw_exchange(port, request)
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        assert lines[0] == "HTTP/1.1 200 OK"
        assert lines[1].startswith("date: ") and lines[2] == "server: uvicorn"
        assert "content-type: text/event-stream; charset=utf-8" in lines
        assert "transfer-encoding: chunked" in lines and "connection: close" in lines
        assert not any(line.startswith("content-length") for line in lines)
        chunks = dechunk(rest)
        # One chunk per event, [DONE] its own, then the empty last chunk.
        assert len(chunks) == 3 + 2
        assert all(c.startswith(b"data: {") and c.endswith(b"}\n\n") for c in chunks[:3])
        assert chunks[3:] == [b"data: [DONE]\n\n", b""]
        assert b'"completion_tokens":3' in chunks[2]  # compact JSON, as orjson writes it

        # HTTP/1.1 without Connection: close keeps the connection for the next request.
        with requests.Session() as session:
            first = session.get(f"{url}/model_info", timeout=5)
            second = session.post(
                f"{url}/generate",
                json={"text": "k", "sampling_params": {"max_new_tokens": 2}},
                timeout=5,
            )
            assert first.status_code == second.status_code == 200
            assert "connection" not in first.headers
            assert first.headers["content-length"] == str(len(first.content))
            assert second.json()["meta_info"]["completion_tokens"] == 2
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            connection.sendall(b"GET /model_info HTTP/1.1\r\nHost: x\r\n\r\n" * 2)
            time.sleep(0.5)
            both = connection.recv(65536)
            assert both.count(b"HTTP/1.1 200 OK") == 2
    finally:
        stop(process)


def generate_request(tokens: int, key: str = "") -> bytes:
    body = json.dumps(
        {"text": "a b c", "sampling_params": {"max_new_tokens": tokens}, "stream": True}
    ).encode()
    auth = f"Authorization: Bearer {key}\r\n".encode() if key else b""
    return (
        b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + auth
        + b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
        + body
    )


def test_fault_modes_hit_the_request_they_are_set_for():
    """SGLANG_SIM_FAULT: each fault as bytes on the wire, on the request SGLANG_SIM_FAULT_AT
    names and no other."""
    faults = {
        "cut_event": {},
        "meta_info_string": {},
        "meta_info_list": {},
        "endless_line": {"SGLANG_SIM_ENDLESS_MIB": 1},
        "echo_headers": {},
    }
    for fault, env in faults.items():
        argv = [*BASE, "--api-key", "sk-sim-fault-key"] if fault == "echo_headers" else BASE
        process, url = start(
            argv, wait="port", SGLANG_SIM_FAULT=fault, SGLANG_SIM_FAULT_AT=2, **env
        )
        port = int(url.rsplit(":", 1)[1])
        try:
            request = generate_request(4, "sk-sim-fault-key" if fault == "echo_headers" else "")
            clean = raw_exchange(port, request)
            hit = raw_exchange(port, request)
            after = raw_exchange(port, request)
        finally:
            stop(process)
        for whole in (clean, after):
            assert dechunk(whole.partition(b"\r\n\r\n")[2])[-2] == b"data: [DONE]\n\n"
        head, _, body = hit.partition(b"\r\n\r\n")
        if fault == "cut_event":
            # The second event's chunk announced whole, half of it sent, then the close.
            size_line, _, rest = body.split(b"\r\n", 2)[2].partition(b"\r\n")
            assert 0 < len(rest) < int(size_line, 16) and b"[DONE]" not in body
        elif fault.startswith("meta_info_"):
            events = [json.loads(c[6:]) for c in dechunk(body)[:-2]]
            kind = str if fault == "meta_info_string" else list
            assert events and all(isinstance(e["meta_info"], kind) for e in events)
        elif fault == "endless_line":
            line = b"".join(dechunk(body + b"0\r\n\r\n"))
            assert line.startswith(b'data: {"text":"') and b"\n" not in line
            assert len(line) >= 1 << 20
        else:
            assert head.startswith(b"HTTP/1.1 400")
            error = json.loads(body)["error"]
            assert error["request_headers"]["authorization"] == "Bearer sk-sim-fault-key"
            assert error["authorization_b64"] == "QmVhcmVyIHNrLXNpbS1mYXVsdC1rZXk="
    process, _url = start(BASE, wait="none", SGLANG_SIM_FAULT="nonsense")
    assert process.wait(timeout=20) == 1
    assert "SGLANG_SIM_FAULT must be one of" in process.stderr.read()


def test_loading_refuses_connections_and_warmup_comes_before_health():
    process, url = start(BASE, wait="port", SGLANG_SIM_LOAD_SECONDS=2, SGLANG_SIM_POLL_SECONDS=1)
    try:
        # The port opened only after loading; the warmup request has not run yet.
        assert "loading for 2 s" in process.stdout.readline()
        assert requests.get(f"{url}/health_generate", timeout=5).status_code == 503
        assert requests.get(f"{url}/health", timeout=5).status_code == 503
        assert requests.get(f"{url}/server_info", timeout=5).status_code == 200
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            began = time.monotonic()
            status = requests.get(f"{url}/health_generate", timeout=30).status_code
            if status == 200:
                break
        assert status == 200
        # A real one-token generation behind it: SGLang checks for output once a second.
        assert time.monotonic() - began >= 1.0
        began = time.monotonic()
        assert requests.get(f"{url}/health", timeout=30).status_code == 200
        assert time.monotonic() - began >= 1.0
        metrics = requests.get(f"{url}/metrics", timeout=5).text.splitlines()
        # The warmup (8 tokens) counts in /metrics; health checks do not.
        labels = 'engine_type="unified",is_streaming="false",model_name="/w/t"'
        assert f"sglang:generation_tokens_total{{{labels}}} 8.0" in metrics
        assert f"sglang:num_requests_total{{{labels}}} 1.0" in metrics
    finally:
        stop(process)


def test_a_server_that_cannot_generate_never_becomes_healthy():
    process, url = start(BASE, wait="port", SGLANG_SIM_NO_GENERATE=1)
    skipped, skipped_url = start(
        [*BASE, "--skip-server-warmup"],
        wait="port",
        SGLANG_SIM_NO_GENERATE=1,
        SGLANG_HEALTH_CHECK_TIMEOUT=2,
    )
    quick, quick_url = start(
        [*BASE, "--skip-server-warmup"],
        wait="port",
        SGLANG_SIM_NO_GENERATE=1,
        SGLANG_HEALTH_CHECK_TIMEOUT=2,
        SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION="false",
    )
    try:
        time.sleep(1.5)  # past the warmup's start: it never finishes
        assert requests.get(f"{url}/health_generate", timeout=5).status_code == 503
        assert requests.get(f"{url}/model_info", timeout=5).status_code == 200
        # Up without warmup, the health generation waits for output and gives up.
        began = time.monotonic()
        assert requests.get(f"{skipped_url}/health_generate", timeout=30).status_code == 503
        assert 2.0 <= time.monotonic() - began < 10
        # With generation off, /health only says the server answers.
        assert requests.get(f"{quick_url}/health", timeout=5).status_code == 200
        assert requests.get(f"{quick_url}/health_generate", timeout=30).status_code == 503
    finally:
        stop(process, skipped, quick)
    assert "Health check failed" in skipped.stderr.read()


def test_warmup_timeout_kills_the_server():
    process, _url = start(BASE, wait="port", SGLANG_SIM_NO_GENERATE=1, SGLANG_WARMUP_TIMEOUT=1)
    assert process.wait(timeout=20) == -9
    assert "Initialization failed. warmup error" in process.stderr.read()


def test_server_info_has_what_sglang_returns():
    key = "sk-sim-1"
    process, url = start([*BASE, *DFLASH, "--api-key", key], SGLANG_SIM_STEP_MS=2)
    auth = {"Authorization": f"Bearer {key}"}
    try:
        assert requests.get(f"{url}/server_info", timeout=5).status_code == 401
        info = requests.get(f"{url}/server_info", headers=auth, timeout=5).json()
        assert info["version"] == "0.5.23" and info["frontend"] == "python"
        assert info["model_path"] == info["tokenizer_path"] == info["served_model_name"] == "/w/t"
        assert info["speculative_algorithm"] == "DFLASH" and info["tp_size"] == 8
        assert info["launch_command"].startswith("--model-path /w/t ")
        assert "argv" not in info
        startup = info["startup_time"]
        assert set(startup) == {
            "load_weight",
            "kv_cache_allocation",
            "scheduler_e2e",
            "cuda_graph",
            "tokenizer_e2e",
        }
        assert isinstance(info["internal_states"], list) and info["status"] == "ready"
        # The deprecated alias answers the same; a restarted server measures a new start.
        assert requests.get(f"{url}/get_server_info", headers=auth, timeout=5).status_code == 200
        again, again_url = start([*BASE, *DFLASH], SGLANG_SIM_STEP_MS=2)
        try:
            other = requests.get(f"{again_url}/server_info", timeout=5).json()["startup_time"]
        finally:
            stop(again)
        assert other != startup
        # Health, readiness and metrics stay open; everything else needs the key.
        assert requests.get(f"{url}/metrics", timeout=5).status_code == 200
        assert requests.get(f"{url}/ready", timeout=5).status_code == 200
        refused = requests.post(f"{url}/generate", json={"text": "x"}, timeout=5)
        assert refused.status_code == 401 and refused.json() == {"error": "Unauthorized"}
        assert stream(url, "x", 2, Authorization=f"Bearer {key}")[-1] == "[DONE]"
    finally:
        stop(process)
    plain, plain_url = start([*BASE[:-3], "--host", "127.0.0.1"])
    try:
        assert "--enable-metrics" not in BASE[:-3]
        assert requests.get(f"{plain_url}/metrics", timeout=5).status_code == 404
    finally:
        stop(plain)


def test_flush_cache_refuses_while_requests_run_and_can_wait_for_idle():
    process, url = start([*BASE, *DFLASH], SGLANG_SIM_STEP_MS=20, SGLANG_SIM_ACCEPT=2)
    try:
        assert requests.post(f"{url}/flush_cache", timeout=5).status_code == 200
        first = stream(url, "same prompt here", 3)
        again = stream(url, "same prompt here", 3)
        # The radix cache holds the prompt: all but its last token come from it.
        assert first[-2]["meta_info"]["cached_tokens"] == 0
        assert again[-2]["meta_info"]["cached_tokens"] == 2
        finished = threading.Event()

        def busy():
            stream(url, "a long one", 60)  # about 30 steps of 20 ms
            finished.set()

        worker = threading.Thread(target=busy)
        worker.start()
        time.sleep(0.2)
        refused = requests.post(f"{url}/flush_cache", timeout=5)
        assert (refused.status_code, refused.text) == (400, "Flush cache failed.\n")
        late = requests.post(f"{url}/flush_cache?timeout=0.1", timeout=5)
        assert (late.status_code, late.text) == (400, "Timed out waiting for idle state.")
        waited = requests.post(f"{url}/flush_cache?timeout=20", timeout=30)
        assert waited.status_code == 200 and waited.text.startswith("Cache flushed.")
        worker.join(timeout=10)
        assert finished.is_set()
        assert stream(url, "same prompt here", 3)[-2]["meta_info"]["cached_tokens"] == 0
    finally:
        stop(process)


def test_metrics_count_finished_requests_as_sglang_does():
    process, url = start(
        [*BASE, *DFLASH], SGLANG_SIM_STEP_MS=5, SGLANG_SIM_ACCEPT=4, SGLANG_SIM_PREFILL_MS=10
    )
    try:
        before = requests.get(f"{url}/metrics", timeout=5).text
        stream(url, "count me", 21)
        after = requests.get(f"{url}/metrics", timeout=5).text
    finally:
        stop(process)

    def value(text: str, prefix: str) -> float:
        found = [line for line in text.splitlines() if line.startswith(prefix)]
        return sum(float(line.rsplit(" ", 1)[1]) for line in found)

    streaming = 'sglang:generation_tokens_total{engine_type="unified",is_streaming="true"'
    assert value(after, streaming) - value(before, streaming) == 21
    calls = "sglang:spec_verify_calls_total{"
    assert value(after, calls) - value(before, calls) == 5  # ceil(20 / 4)
    requests_line = 'sglang:num_requests_total{engine_type="unified",is_streaming="true"'
    assert value(after, requests_line) - value(before, requests_line) == 1
    assert "# TYPE sglang:generation_tokens counter" in after


def test_outputs_are_deterministic_drift_a_little_or_break_under_speculation():
    ar, ar_url = start(BASE, SGLANG_SIM_STEP_MS=2)
    exact, exact_url = start([*BASE, *EAGLE], SGLANG_SIM_ACCEPT=3, SGLANG_SIM_STEP_MS=2)
    lossy, lossy_url = start(
        [*BASE, *EAGLE], SGLANG_SIM_ACCEPT=3, SGLANG_SIM_STEP_MS=2, SGLANG_SIM_LOSSY=0.3
    )
    drift, drift_url = start(
        [*BASE, *EAGLE], SGLANG_SIM_ACCEPT=3, SGLANG_SIM_STEP_MS=2, SGLANG_SIM_DRIFT=0.25
    )
    try:
        prompts = [f"prompt {i}" for i in range(40)]
        reference = [stream(ar_url, p, 20)[-2]["output_ids"] for p in prompts]
        assert [stream(exact_url, p, 20)[-2]["output_ids"] for p in prompts] == reference
        broken = [stream(lossy_url, p, 20)[-2]["output_ids"] for p in prompts]
        assert sum(a != b for a, b in zip(broken, reference, strict=True)) >= 30
        drifted = [stream(drift_url, p, 20)[-2]["output_ids"] for p in prompts]
        changed = [(a, b) for a, b in zip(drifted, reference, strict=True) if a != b]
        # About a quarter of the answers leave the reference at one token and stay off it.
        assert 4 <= len(changed) <= 18
        for candidate, base in changed:
            first = next(i for i, (x, y) in enumerate(zip(candidate, base, strict=True)) if x != y)
            assert all(x != y for x, y in zip(candidate[first:], base[first:], strict=True))
    finally:
        stop(ar, exact, lossy, drift)


def test_load_time_and_crash():
    process, url = start(BASE, wait="none", SGLANG_SIM_LOAD_SECONDS=30)
    try:
        time.sleep(1.5)
        assert process.poll() is None
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{url}/health", timeout=5)
    finally:
        stop(process)
    process, url = start(BASE, SGLANG_SIM_CRASH_AFTER=1)
    stream(url, "one", 3)
    with pytest.raises(requests.RequestException):
        stream(url, "two", 3)
    assert process.wait(timeout=10) == 1
    process, _url = start(BASE, SGLANG_SIM_CRASH_ON_START=1)
    assert process.wait(timeout=10) == 1


def health_args(tmp_path: Path, process: subprocess.Popen, url: str, **extra) -> dict:
    """server_health's arguments for a simulator watched as the kit's supervisor would."""
    import os

    pid_file, state_file = tmp_path / "sup.pid", tmp_path / "sup.state.json"
    pid_file.write_text(str(os.getpid()))
    state = {"supervisor_pid": os.getpid(), "status": "running", "child_pid": process.pid}
    state_file.write_text(json.dumps({**state, "restarts": 0}))
    (tmp_path / "sglang.log").write_text("simulated log line\n")
    return {
        "url": url,
        "manager": "supervisor",
        "pid_file": str(pid_file),
        "state_file": str(state_file),
        "log_file": str(tmp_path / "sglang.log"),
        "since": time.time(),
        **extra,
    }


def test_the_deploys_health_wait_fails_a_server_that_loads_but_cannot_generate(tmp_path):
    from tests.support.modules import run_module

    broken, broken_url = start(BASE, wait="port", SGLANG_SIM_NO_GENERATE=1)
    working, working_url = start(BASE, wait="port", SGLANG_SIM_STEP_MS=5)
    loading, loading_url = start(BASE, wait="none", SGLANG_SIM_LOAD_SECONDS=60)
    try:
        waiting = run_module("server_health", health_args(tmp_path, loading, loading_url))
        assert waiting["state"] == "loading" and waiting["http_status"] is None

        loaded = run_module("server_health", health_args(tmp_path, broken, broken_url))
        assert loaded["state"] == "answering" and loaded["http_status"] == 503
        args = health_args(tmp_path, broken, broken_url, phase="generate", generate_timeout=3)
        args["since"] = loaded["checked_at"]
        polls = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            polls.append(run_module("server_health", args))
            if polls[-1]["state"] != "answering":
                break
            time.sleep(0.5)
        failed = polls[-1]
        assert len(polls) > 1 and polls[0]["state"] == "answering"
        assert failed["state"] == "failed"
        assert "loaded and the server answers HTTP, but it has not generated" in failed["message"]
        assert "/health_generate answered HTTP 503" in failed["message"]
        assert failed["log_tail"] == ["simulated log line"]

        # A server that generates gets through both phases.
        deadline = time.monotonic() + 30
        state = "loading"
        while state != "healthy" and time.monotonic() < deadline:
            result = run_module(
                "server_health",
                health_args(tmp_path, working, working_url, phase="generate", generate_timeout=20),
            )
            state = result["state"]
            assert state in ("answering", "healthy"), result
        assert state == "healthy"
    finally:
        stop(broken, working, loading)


# --- DDTree, as the fake DDTree pull-request runtime ---------------------------------------

DDTREE = [
    "--speculative-algorithm", "DDTREE",
    "--speculative-draft-model-path", "/w/d",
    "--speculative-num-draft-tokens", "8",
    "--speculative-dflash-block-size", "8",
    "--page-size", "1",
    "--disable-overlap-schedule",
]  # fmt: skip
TREE_BASE = [a if a != "flashinfer" else "triton" for a in BASE]


@pytest.fixture(scope="module")
def git_runtime(tmp_path_factory):
    from tests.support.fake_sglang import write_package

    return write_package(tmp_path_factory.mktemp("ddtree-runtime"), "0.5.23.dev1", ddtree=True)


def test_the_release_refuses_ddtree():
    process, _url = start([*TREE_BASE, *DDTREE, "--speculative-ddtree-budget", "16"])
    assert process.wait(timeout=20) == 2
    assert "sglang 0.5.23 has no --speculative-ddtree-budget" in process.stderr.read()
    process, _url = start([*TREE_BASE, *DDTREE])
    assert process.wait(timeout=20) == 2
    assert "does not know --speculative-algorithm DDTREE" in process.stderr.read()


def test_ddtree_runs_each_budget_as_its_table_row_says(git_runtime):
    """Budget 32 of the healthy sweep: 33 ms and 6.4 tokens a verify step; the verifier sees
    33 tokens a step, so 32 drafts are proposed per step."""
    from tests.support.ddtree_tables import HEALTHY, table_env

    table = table_env(HEALTHY)
    process, url = start(
        [*TREE_BASE, *DDTREE, "--speculative-ddtree-budget", "32"],
        runtime=git_runtime,
        SGLANG_SIM_DDTREE_TABLE=table,
        SGLANG_SIM_STEP_MS=5,
        SGLANG_SIM_ACCEPT=2,
    )
    try:
        assert process.poll() is None, process.stderr.read()
        info = requests.get(f"{url}/server_info", timeout=10).json()
        assert info["speculative_algorithm"] == "DDTREE"
        assert info["speculative_ddtree_budget"] == 32
        assert info["disable_overlap_schedule"] is True
        events = stream(url, "a prompt for the tree", 321)
        meta = events[-2]["meta_info"]
        verify = meta["spec_verify_ct"]
        assert verify == math.ceil(320 / 6.4) == 50
        assert meta["spec_num_proposed_drafts"] == verify * 32
        assert meta["spec_num_correct_drafts"] == 320 - verify
        assert max(len(meta["spec_correct_drafts_histogram"]) - 1, 0) <= 7  # the depth cap
    finally:
        stop(process)
    # One step of the row's 33 ms (not SGLANG_SIM_STEP_MS's 5) per verify step at least.
    assert meta["e2e_latency"] >= verify * 0.033


def test_a_ddtree_chain_below_the_block_size_proposes_block_size_minus_one_drafts(git_runtime):
    """The pull request's tokenizer_manager: proposed drafts = verify steps x (max(block size,
    budget + 1) - 1). Budget 4 under block size 8 is a chain that still drafts 7 a step, so
    the accept rate divides by 7 a step, not by the budget."""
    process, url = start(
        [*TREE_BASE, *DDTREE, "--speculative-ddtree-budget", "4"],
        runtime=git_runtime,
        SGLANG_SIM_DDTREE_TABLE=json.dumps({"4": {"step_ms": 5, "accept": 4}}),
    )
    try:
        assert process.poll() is None, process.stderr.read()
        meta = stream(url, "a prompt for the chain", 41)[-2]["meta_info"]
        verify = meta["spec_verify_ct"]
        assert verify == 40 / 4
        assert meta["spec_num_proposed_drafts"] == verify * 7
        assert meta["spec_num_correct_drafts"] == 40 - verify
        assert meta["spec_accept_rate"] == pytest.approx(3 / 7)
    finally:
        stop(process)


def test_ddtree_budget_default_and_the_overlap_it_forces(git_runtime):
    """No budget: block size - 1 (a chain), and overlap off though argv left it on."""
    argv = [a for a in [*TREE_BASE, *DDTREE] if a != "--disable-overlap-schedule"]
    process, url = start(argv, runtime=git_runtime, SGLANG_SIM_STEP_MS=5)
    try:
        info = requests.get(f"{url}/server_info", timeout=10).json()
        assert info["speculative_ddtree_budget"] == 7
        assert info["disable_overlap_schedule"] is True
        assert "--disable-overlap-schedule" not in info["launch_command"]
    finally:
        stop(process)


@pytest.mark.parametrize(
    "budget, table, message",
    [
        (
            "48",
            None,
            "SGLANG_SIM_DDTREE_TABLE has no row for budget 48 (it has 8, 16, 32, 64, 128)",
        ),
        ("16", {"16": {"step_ms": 30, "accept": 9.0}}, "between 1 and 8"),
        ("4", {"4": {"step_ms": 30, "accept": 5.5}}, "between 1 and 5"),
        ("16", {"16": {"step_ms": 0, "accept": 3}}, "step time must be positive"),
        ("16", {"16": {"accept": 3}}, "needs numbers step_ms and accept"),
    ],
)
def test_a_table_that_cannot_serve_the_budget_stops_the_server(git_runtime, budget, table, message):
    from tests.support.ddtree_tables import HEALTHY, table_env

    text = table_env(HEALTHY) if table is None else json.dumps(table)
    process, _url = start(
        [*TREE_BASE, *DDTREE, "--speculative-ddtree-budget", budget],
        wait="none",
        runtime=git_runtime,
        SGLANG_SIM_DDTREE_TABLE=text,
    )
    assert process.wait(timeout=20) == 1
    assert message in process.stderr.read()


def test_ddtree_keeps_the_pull_requests_launch_rules(git_runtime):
    process, _url = start(
        [*TREE_BASE, *DDTREE, "--page-size", "16", "--speculative-ddtree-budget", "16"],
        wait="none",
        runtime=git_runtime,
    )
    assert process.wait(timeout=20) == 2
    assert "DDTREE supports only --page-size 1, got 16" in process.stderr.read()


def test_the_named_sweeps_have_the_shapes_their_names_claim():
    """The tests that play these sweeps rely on their shape; a row edited later must not
    silently turn a collapse into noise or a healthy sweep into a collapse."""
    from tests.support.ddtree_tables import HEALTHY, HYBRID_COLLAPSE, pairs, tokens_per_s

    assert [kind for _, _, kind in pairs(HEALTHY)] == ["ok", "ok", "ok", "saturation"]
    assert [kind for _, _, kind in pairs(HYBRID_COLLAPSE)] == [
        "ok", "collapse", "collapse", "ok"
    ]  # fmt: skip
    for table in (HEALTHY, HYBRID_COLLAPSE):
        assert all(1 <= accept <= 8 for _, accept in table.values())  # K2.6's depth cap
    healthy = tokens_per_s(HEALTHY)
    best = max(healthy, key=healthy.get)
    assert best == 64 and healthy[32] >= 0.97 * healthy[64] > healthy[16]
    # The collapse: throughput falls with the budget once past 16, though steps get faster.
    collapse = tokens_per_s(HYBRID_COLLAPSE)
    assert collapse[16] > collapse[32] > collapse[64] > collapse[128]
    assert HYBRID_COLLAPSE[64][0] < HYBRID_COLLAPSE[16][0]


def test_the_qwen_sweep_collapses_under_its_own_depth_cap():
    """The hybrid control's sweep (budgets 15, 32, 64 at block size 16): both steps collapse,
    every row stays under 16 tokens a step, budget 15 alone reaches past K2.6's cap of 8, and the
    simulator serves it at its block size."""
    from tests.support.ddtree_tables import QWEN_HYBRID, pairs, table_env, tokens_per_s

    assert [kind for _, _, kind in pairs(QWEN_HYBRID)] == ["collapse", "collapse"]
    assert all(1 <= accept <= 16 for _, accept in QWEN_HYBRID.values())
    assert QWEN_HYBRID[15][1] > 8
    rates = tokens_per_s(QWEN_HYBRID)
    assert rates[15] > rates[32] > rates[64]
    table = table_env(QWEN_HYBRID, 0.2)
    for budget, (step, accept) in QWEN_HYBRID.items():
        resolved = {"speculative_ddtree_budget": budget, "speculative_num_draft_tokens": 16}
        assert sglang_sim.ddtree_row(resolved, table) == (pytest.approx(step * 0.2), accept)
    # At K2.6's block size the same row is impossible, and the simulator says so.
    with pytest.raises(ValueError, match="between 1 and 8"):
        sglang_sim.ddtree_row(
            {"speculative_ddtree_budget": 15, "speculative_num_draft_tokens": 8}, table
        )


def test_model_info_names_the_served_models_architecture(tmp_path):
    """/model_info's model_type and architectures come from the served folder's config.json,
    as SGLang's come from its hf_config; a bare or broken folder reads as K2.6."""
    qwen = tmp_path / "qwen"
    qwen.mkdir()
    (qwen / "config.json").write_text(
        json.dumps({"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"]})
    )
    assert sglang_sim.model_identity(str(qwen)) == ("qwen3_5", ["Qwen3_5ForConditionalGeneration"])
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('["not", "an", "object"]')
    kimi = ("kimi_k25", ["KimiK25ForConditionalGeneration"])
    for path in (str(broken), str(tmp_path / "missing"), None):
        assert sglang_sim.model_identity(path) == kimi


def test_answer_rate_is_one_draw_per_question_shared_by_every_config():
    """SGLANG_SIM_ACCURACY: a question is answered right when its draw is under the rate, so a
    config at 0.89 is right on a subset of what one at 0.9 got right, and the rates come out
    as set over 200 questions."""
    questions = [(f"Question {i}: how many apples are left?", str(i * 7)) for i in range(200)]

    def right(rate: float) -> set[int]:
        found = set()
        for index, (question, answer) in enumerate(questions):
            working, final = sglang_sim.answer_words(question, answer, rate)
            assert 6 <= len(working) <= 31 and final[:3] == ["The", "answer", "is"]
            if final[3] == f"\\boxed{{{answer}}}":
                found.add(index)
            else:
                assert final[3] == f"\\boxed{{{int(answer) + 1}}}"
        return found

    high, lower, low = right(0.9), right(0.89), right(0.7)
    assert low <= lower <= high
    assert 0.84 <= len(high) / 200 <= 0.96 and 0.62 <= len(low) / 200 <= 0.78
    assert right(0.0) == set() and len(right(1.0)) == 200
    assert sglang_sim.wrong_answer("1,234") == "1235"
    assert sglang_sim.wrong_answer("0.5") == "1.5"
    assert sglang_sim.wrong_answer("\\frac{1}{2}") == "\\frac{1}{2}+1"
    # An answer with spaces is several words: the text splits into exactly its tokens.
    _working, final = sglang_sim.answer_words("Solve for y.", "y = x^2 + 1", 1.0)
    assert final == ["The", "answer", "is", "\\boxed{y", "=", "x^2", "+", "1}"]


def test_generate_answers_known_questions_and_stops_or_is_cut(tmp_path):
    """A /generate prompt holding a known question gets the working, then `The answer is
    \\boxed{X}`, and stops at its end of sequence (finish_reason stop, matched the EOS id)
    with tokens, output_ids and text agreeing; a budget too small for it cuts it (length)."""
    answers = tmp_path / "answers.jsonl"
    rows = [{"question": "Tom has 3 apples and eats one. How many are left?", "answer": "2"}]
    answers.write_text("".join(json.dumps(row) + "\n" for row in rows))
    process, url = start(
        BASE, SGLANG_SIM_STEP_MS=2, SGLANG_SIM_ANSWERS=answers, SGLANG_SIM_ACCURACY=1
    )
    try:
        prompt = f"<|im_user|>{rows[0]['question']}<|im_end|><|im_assistant|>"
        whole = generate(url, prompt, 1024)
        cut = generate(url, prompt, 4)
        other = generate(url, "What is the capital of France?", 16)
    finally:
        stop(process)
    words = whole["text"].split(" ")
    assert words[-4:] == ["The", "answer", "is", "\\boxed{2}"]
    meta = whole["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": sglang_sim.EOS_ID}
    assert meta["completion_tokens"] == len(words) == len(whole["output_ids"]) < 1024
    assert cut["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert "\\boxed" not in cut["text"] and cut["text"].split(" ") == words[:4]
    assert other["meta_info"]["finish_reason"] == {"type": "length", "length": 16}


def generate(url: str, prompt: str, tokens: int) -> dict:
    body = {"text": prompt, "sampling_params": {"max_new_tokens": tokens, "temperature": 0}}
    return requests.post(f"{url}/generate", json=body, timeout=30).json()


def test_chat_applies_the_template_and_splits_reasoning_only_with_its_parser(tmp_path):
    """/v1/chat/completions renders the messages through the folder's chat template (the
    prompt's tokens are the rendered text's), splits <think>...</think> into
    reasoning_content with --reasoning-parser unless chat_template_kwargs turns thinking off,
    and streams the same text it answers whole."""
    from tests.support.results_tree import TEMPLATE

    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    plain = ["--model-path", str(tmp_path), "--host", "127.0.0.1"]
    parsed = [*plain, "--reasoning-parser", "kimi_k2", "--served-model-name", "kimi"]
    with_parser, parser_url = start(parsed, SGLANG_SIM_STEP_MS=2)
    without, plain_url = start(plain, SGLANG_SIM_STEP_MS=2)
    message = [{"role": "user", "content": "Say hello to the whole wide world"}]
    try:
        models = requests.get(f"{parser_url}/v1/models", timeout=5).json()
        split = chat(parser_url, messages=message)
        off = chat(parser_url, messages=message, chat_template_kwargs={"thinking": False})
        raw = chat(plain_url, messages=message)
        streamed = chat_events(parser_url, messages=message, stream_options={"include_usage": 1})
    finally:
        stop(with_parser, without)
    assert [card["id"] for card in models["data"]] == ["kimi"]
    rendered = "<|im_user|>Say hello to the whole wide world<|im_end|><|im_assistant|>"
    assert split["usage"]["prompt_tokens"] == len(rendered.split())
    reply = split["choices"][0]["message"]
    assert reply["reasoning_content"] and "<think>" not in reply["content"]
    assert split["choices"][0]["finish_reason"] == "stop" and split["object"] == "chat.completion"
    assert off["choices"][0]["message"]["reasoning_content"] is None
    raw_text = raw["choices"][0]["message"]["content"]
    assert raw_text.startswith("<think> ") and " </think> " in raw_text
    assert raw["choices"][0]["message"]["reasoning_content"] is None
    assert raw_text.split(" </think> ")[1] == reply["content"]
    # The stream: role first, then the same reasoning and content, a finish, the usage, [DONE].
    assert streamed[-1] == "[DONE]" and streamed[0]["choices"][0]["delta"]["role"] == "assistant"
    deltas = [e["choices"][0]["delta"] for e in streamed[1:-1] if e["choices"]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == reply["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == reply["content"]
    assert [e["choices"][0]["finish_reason"] for e in streamed[-3:-2]] == ["stop"]
    assert streamed[-2]["choices"] == [] and streamed[-2]["usage"] == split["usage"]


def test_tool_calls_are_parsed_only_with_the_tool_call_parser(tmp_path):
    """tools with a forced tool_choice: with --tool-call-parser kimi_k2 a parsed call (K2's id
    functions.<name>:<n>, finish_reason tool_calls); without it the JSON-schema constrained
    text in content and no tool_calls, as serving_chat.py leaves it."""
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"],
            },
        },
    }
    forced = {"type": "function", "function": {"name": "get_weather"}}
    argv = ["--model-path", str(tmp_path), "--host", "127.0.0.1"]
    parser, parser_url = start([*argv, "--tool-call-parser", "kimi_k2"], SGLANG_SIM_STEP_MS=2)
    plain, plain_url = start(argv, SGLANG_SIM_STEP_MS=2)
    message = [{"role": "user", "content": "weather?"}]
    try:
        parsed = chat(parser_url, messages=message, tools=[tool], tool_choice=forced)
        streamed = chat_events(parser_url, messages=message, tools=[tool], tool_choice=forced)
        unparsed = chat(plain_url, messages=message, tools=[tool], tool_choice=forced)
        unknown = requests.post(
            f"{plain_url}/v1/chat/completions",
            json={"messages": message, "tools": [tool], "tool_choice": {"function": {"name": "x"}}},
            timeout=10,
        )
    finally:
        stop(parser, plain)
    choice = parsed["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == ""
    call = choice["message"]["tool_calls"][0]
    assert call["id"] == "functions.get_weather:0" and call["type"] == "function"
    assert json.loads(call["function"]["arguments"]) == {"city": "example", "days": 1}
    stream_calls = [
        e["choices"][0]["delta"]["tool_calls"]
        for e in streamed[:-1]
        if e["choices"] and "tool_calls" in e["choices"][0]["delta"]
    ]
    assert stream_calls == [choice["message"]["tool_calls"]]
    message = unparsed["choices"][0]["message"]
    assert "tool_calls" not in message and unparsed["choices"][0]["finish_reason"] == "stop"
    assert json.loads(message["content"]) == [
        {"name": "get_weather", "parameters": {"city": "example", "days": 1}}
    ]
    assert unknown.status_code == 400 and "Tool 'x' not found" in unknown.json()["message"]


def chat(url: str, **body) -> dict:
    response = requests.post(f"{url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def chat_events(url: str, **body) -> list:
    response = requests.post(
        f"{url}/v1/chat/completions", json={**body, "stream": True}, stream=True, timeout=30
    )
    return events_of(response)


def generate_ids(url: str, ids: object, tokens: int, stream: bool = True, **params) -> list:
    """A /generate of token ids: the stream's events, or [status, body] when refused."""
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": tokens, "temperature": 0, **params},
        "stream": stream,
    }
    response = requests.post(f"{url}/generate", json=body, stream=stream, timeout=30)
    if response.status_code != 200:
        return [response.status_code, response.json()]
    return events_of(response) if stream else [response.json()]


def test_input_ids_are_the_prompt_and_ignore_eos_decodes_exactly_max_new_tokens(tmp_path):
    """Token ids count one prompt token each; with ignore_eos a request decodes exactly
    max_new_tokens (length), under speculation too (a verify step that would overshoot is
    cut), even where the model would have stopped at its end of sequence, which it still
    does without ignore_eos."""
    answers = tmp_path / "answers.jsonl"
    question = "Tom has 3 apples and eats one. How many are left?"
    answers.write_text(json.dumps({"question": question, "answer": "2"}) + "\n")
    process, url = start(
        BASE + EAGLE,
        SGLANG_SIM_STEP_MS=2,
        SGLANG_SIM_ACCEPT=3,
        SGLANG_SIM_ANSWERS=answers,
    )
    try:
        ids = [17, 163583, 0, 42, 42, 9000]
        exact = {n: generate_ids(url, ids, n, ignore_eos=True) for n in (1, 2, 7, 64)}
        plain = generate_ids(url, ids, 64)
        whole = generate_ids(url, ids, 5, stream=False, ignore_eos=True)[0]
        prompt = f"<|im_user|>{question}<|im_end|><|im_assistant|>"
        body = {"text": prompt, "sampling_params": {"max_new_tokens": 400}}
        stops = requests.post(f"{url}/generate", json=body, timeout=30).json()
        body["sampling_params"]["ignore_eos"] = True
        ignores = requests.post(f"{url}/generate", json=body, timeout=30).json()
    finally:
        stop(process)
    for wanted, events in exact.items():
        assert events[-1] == "[DONE]"
        last = events[-2]["meta_info"]
        assert last["completion_tokens"] == wanted == len(events[-2]["output_ids"])
        assert last["finish_reason"] == {"type": "length", "length": wanted}
        assert all(event["meta_info"]["prompt_tokens"] == len(ids) for event in events[:-1])
    assert plain[-2]["meta_info"]["completion_tokens"] == 64
    assert whole["meta_info"]["completion_tokens"] == 5 == len(whole["output_ids"])
    assert whole["meta_info"]["prompt_tokens"] == len(ids)
    assert stops["meta_info"]["finish_reason"]["type"] == "stop"
    assert stops["meta_info"]["completion_tokens"] < 400
    assert ignores["meta_info"]["finish_reason"] == {"type": "length", "length": 400}
    assert ignores["meta_info"]["completion_tokens"] == 400 == len(ignores["output_ids"])
    # The answer the model gave before its end of sequence is still the start of the output.
    assert ignores["text"].startswith(stops["text"])


def test_bad_input_ids_are_refused_with_sglangs_error_body():
    """input_ids that are not a list of int64 (SGLang's field validator), empty, or outside
    the vocabulary (the simulator's own check) get 400 and SGLang's ErrorResponse; nothing is
    generated for them."""
    process, url = start(BASE, SGLANG_SIM_STEP_MS=2)
    try:
        refused = {
            "string": generate_ids(url, "1 2 3", 4),
            "floats": generate_ids(url, [1.5, 2], 4),
            "later float": generate_ids(url, [1, 2.5], 4),
            "empty": generate_ids(url, [], 4),
            "too large": generate_ids(url, [1, 1 << 64], 4),
            "batch": generate_ids(url, [[1, 2], [3]], 4),
            "negative": generate_ids(url, [5, -1], 4),
            "past vocab": generate_ids(url, [sglang_sim.VOCAB], 4),
        }
        taken = generate_ids(url, [0, sglang_sim.VOCAB - 1], 3)
        metrics = requests.get(f"{url}/metrics", timeout=10).text
    finally:
        stop(process)
    for why, (status, body) in refused.items():
        assert status == 400, why
        assert body["object"] == "error" and body["code"] == 400, why
        assert body["type"] == "Bad Request" and "input_ids" in body["message"], why
    assert "outside the vocabulary" in refused["past vocab"][1]["message"]
    assert taken[-2]["meta_info"]["completion_tokens"] == 3
    # Of the streamed requests only the taken one (2 ids) was counted; the warmup is not one.
    streamed = [
        line.rsplit(" ", 1)[1]
        for line in metrics.splitlines()
        if line.startswith("sglang:prompt_tokens_total") and 'is_streaming="true"' in line
    ]
    assert streamed == ["2.0"]


def test_vocabulary_comes_from_the_served_folders_config(tmp_path):
    """The vocabulary ids are checked against: config.json's vocab_size or its text_config's
    (K2.6 and Qwen 3.6 keep it there), K2.6's without a readable one."""
    assert sglang_sim.vocab_size_of(REPO / "models" / "qwen3.6-27b") == 248320
    assert sglang_sim.vocab_size_of(REPO / "models" / "kimi-k2.6") == 163840
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    assert sglang_sim.vocab_size_of(flat) == 1000
    assert sglang_sim.input_ids_error([999], 1000) is None
    assert "outside" in sglang_sim.input_ids_error([1000], 1000)
    assert sglang_sim.vocab_size_of(tmp_path / "missing") == sglang_sim.VOCAB


def test_the_health_polls_log_tail_masks_the_api_keys_sglang_logged(tmp_path):
    """SGLang logs its resolved arguments, the API key among them, and the log file keeps the
    lines of earlier launches, whose (rotated) key no_log would not know: both are masked."""
    from tests.support.modules import run_module

    key, old = "sk-health-tail-7d2e91", "sk-rotated-away-5b8c03"
    process = subprocess.Popen(["sleep", "30"])
    try:
        args = health_args(tmp_path, process, "http://127.0.0.1:9", api_key=key)
        (tmp_path / "sglang.log").write_text(
            f"[2026-12-01 10:00:00] server_args=ServerArgs(tp_size=8, api_key='{old}')\n"
            f"[2026-12-01 11:00:00] server_args=ServerArgs(tp_size=8, api_key='{key}')\n"
            f"[2026-12-01 11:00:05] key {key} in a line of its own\n"
        )
        said = run_module("server_health", args)
    finally:
        process.kill()
        process.wait(timeout=10)
    tail = "\n".join(said["log_tail"])
    assert len(said["log_tail"]) == 3
    assert key not in tail and old not in tail, tail
    assert tail.count("api_key='********'") == 2, tail


# -- the model folders and the GPU at start-up (startup_checks) ----------------------------


def resolved_for(folders: dict, algorithm: str | None = None, **more) -> dict:
    """The resolved arguments startup_checks reads, as a launch of the tiny folders gives them."""
    resolved = {
        "model_path": str(folders["target"]),
        "tp_size": 8,
        "attention_backend": "flashinfer",
        "context_length": 4096,
    }
    if algorithm in ("DFLASH", "DDTREE"):
        resolved.update(
            speculative_algorithm=algorithm,
            speculative_draft_model_path=str(folders["dflash"]),
            speculative_num_draft_tokens=8,
            speculative_draft_attention_backend="flashinfer",
        )
    elif algorithm == "EAGLE3":
        resolved.update(
            speculative_algorithm=algorithm,
            speculative_draft_model_path=str(folders["eagle3"]),
            speculative_num_draft_tokens=4,
        )
    return {**resolved, **more}


@pytest.fixture
def folders(tmp_path, monkeypatch):
    from tests.support.safetensors_files import tiny_folders

    monkeypatch.setattr(sglang_sim, "compute_capability", lambda: (12, 0))
    return tiny_folders(tmp_path)


def failure_of(resolved: dict) -> tuple[str, str, str] | None:
    failure, _ = sglang_sim.startup_checks(resolved)
    return None if failure is None else (failure.stage, failure.kind, failure.message)


@pytest.mark.parametrize("algorithm", [None, "DFLASH", "DDTREE", "EAGLE3"])
def test_consistent_folders_start(folders, algorithm):
    assert sglang_sim.startup_checks(resolved_for(folders, algorithm)) == (None, [])


def edit_config(folder: Path, change) -> None:
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))


def rewrite_weights(folder: Path, tensors: dict) -> None:
    from tests.support.safetensors_files import safetensors_bytes

    for path in folder.glob("*.safetensors*"):
        path.unlink()
    (folder / "model.safetensors").write_bytes(safetensors_bytes(tensors))


def test_config_json_missing_or_broken_is_transformers_error(folders):
    target = folders["target"]
    (target / "config.json").unlink()
    stage, kind, message = failure_of(resolved_for(folders))
    assert (stage, kind) == ("server_args", "OSError")
    assert message.startswith(f"{target} does not appear to have a file named config.json.")
    (target / "config.json").write_text("{not json")
    assert failure_of(resolved_for(folders)) == (
        "server_args",
        "OSError",
        f"It looks like the config file at '{target}/config.json' is not a valid JSON file.",
    )


def test_an_unknown_architecture_is_refused_with_the_registrys_words(folders):
    edit_config(folders["target"], lambda c: c.update(architectures=["NoSuchModel"]))
    stage, kind, message = failure_of(resolved_for(folders))
    assert (stage, kind) == ("scheduler", "ValueError")
    assert message.startswith("Model architectures ['NoSuchModel'] are not supported for now.")


@pytest.mark.parametrize(
    ("change", "tp", "message"),
    [
        # MLA's heads: models/deepseek_v2.py's bare assert.
        (lambda c: None, 3, ""),
        (lambda c: c["text_config"].update(intermediate_size=500), 8, "500 is not divisible by 8"),
        (lambda c: c["text_config"].update(moe_intermediate_size=60), 8, ""),
        (
            lambda c: c["vision_config"].update(num_attention_heads=12),
            8,
            "12 is not divisible by 8",
        ),
    ],
)
def test_what_tp_splits_must_divide_by_the_tp_size(folders, change, tp, message):
    edit_config(folders["target"], change)
    assert failure_of(resolved_for(folders, tp_size=tp)) == ("scheduler", "AssertionError", message)


def test_weights_missing_an_index_shard_or_a_broken_header(folders):
    target = folders["target"]
    shard = sorted(target.glob("*.safetensors"))[0]
    shard.unlink()
    stage, kind, message = failure_of(resolved_for(folders))
    assert (stage, kind) == ("scheduler", "RuntimeError")
    assert message == (
        f"model.safetensors.index.json references 1 shard file(s) missing from {target} "
        f"(incomplete download?): ['{shard.name}']"
    )
    shard.write_bytes((10**9).to_bytes(8, "little") + b"{}")
    assert failure_of(resolved_for(folders)) == (
        "scheduler",
        "safetensors_rust.SafetensorError",
        "Error while deserializing header: HeaderTooLarge",
    )
    for path in target.glob("*.safetensors*"):
        path.unlink()
    assert failure_of(resolved_for(folders)) == (
        "scheduler",
        "RuntimeError",
        f"Cannot find any model weights with `{target}`",
    )


def test_compressed_tensors_weights_must_carry_consistent_scale_and_shape(folders):
    from tests.support.safetensors_files import packed_int4

    target, expert = folders["target"], "language_model.model.layers.1.mlp.experts.0.up_proj"
    good = packed_int4(expert, 64, 256)
    rewrite_weights(target, good)
    assert failure_of(resolved_for(folders)) is None
    cases = {
        "has no weight_scale or no weight_shape beside it": {
            k: v for k, v in good.items() if not k.endswith("weight_scale")
        },
        "unpacks to [64, 256] but weight_shape says [64, 512]": {
            **good,
            f"{expert}.weight_shape": ("I32", (2,), [64, 512]),
        },
        "needs weight_scale [64, 8] (group size 32), found [64, 4]": {
            **good,
            f"{expert}.weight_scale": ("BF16", (64, 4)),
        },
        "is BF16 [64, 32], not a 2-D int32 tensor": {
            **good,
            f"{expert}.weight_packed": ("BF16", (64, 32)),
        },
    }
    for problem, tensors in cases.items():
        rewrite_weights(target, tensors)
        assert failure_of(resolved_for(folders)) == (
            "scheduler",
            "ValueError",
            f"compressed-tensors checkpoint: {expert}.weight_packed {problem}",
        ), problem


def test_a_context_length_beyond_the_configs_refuses_unless_allowed(folders, monkeypatch):
    stage, kind, message = failure_of(resolved_for(folders, context_length=16384))
    assert (stage, kind) == ("server_args", "ValueError")
    assert message.startswith(
        "Warning: User-specified context_length (16384) is greater than the derived "
        "context_length (8192)."
    )
    assert message.endswith("set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")
    # The drafter is built with the target's context length: one without the key has 2048.
    edit_config(folders["dflash"], lambda c: c.pop("max_position_embeddings"))
    said = failure_of(resolved_for(folders, "DFLASH"))
    assert said[:2] == ("scheduler", "ValueError")
    assert said[2].startswith("Warning: Target model's context_length (4096) is greater than ")
    monkeypatch.setenv("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "1")
    assert failure_of(resolved_for(folders, "DFLASH", context_length=16384)) is None


def test_the_dflash_drafter_against_its_target(folders):
    dflash = folders["dflash"]
    edit_config(dflash, lambda c: c["dflash_config"].update(target_layer_ids=[1, 4]))
    assert failure_of(resolved_for(folders, "DFLASH")) == (
        "scheduler",
        "ValueError",
        "DFLASH target_layer_ids contains an out-of-range layer id. target_layer_ids[1]=4, "
        "target_num_layers=4.",
    )
    edit_config(dflash, lambda c: (c.pop("dflash_config"), c.pop("num_hidden_layers")))
    assert failure_of(resolved_for(folders, "DDTREE"))[2] == (
        "DFLASH requires draft num_hidden_layers in config. Got config without num_hidden_layers."
    )
    edit_config(dflash, lambda c: c.update(num_hidden_layers=2, hidden_size=128))
    assert failure_of(resolved_for(folders, "DFLASH")) == (
        "scheduler",
        "RuntimeError",
        "mat1 and mat2 shapes cannot be multiplied (8x512 and 256x128)",
    )
    # A block size other than the run's is a warning only, as SGLang logs it.
    edit_config(dflash, lambda c: c.update(hidden_size=256, block_size=16))
    failure, warnings = sglang_sim.startup_checks(resolved_for(folders, "DFLASH"))
    assert failure is None
    assert warnings == [
        "DFLASH block size mismatch: using speculative_num_draft_tokens=8 but draft config "
        "block_size=16."
    ]


def test_the_eagle3_drafter_takes_three_target_layers_of_its_hidden_size(folders):
    edit_config(folders["eagle3"], lambda c: c.update(target_hidden_size=512))
    assert failure_of(resolved_for(folders, "EAGLE3")) == (
        "scheduler",
        "RuntimeError",
        "mat1 and mat2 shapes cannot be multiplied (8x768 and 1536x256)",
    )


NOT_MHA = "trtllm_mha backend can only be used with non-MLA models."


@pytest.mark.parametrize(
    ("capability", "where", "backend", "expected"),
    [
        ((12, 0), "target", "fa3", ("scheduler", "AssertionError", sglang_sim.FA3)),
        ((9, 0), "target", "fa3", None),
        ((12, 0), "draft", "fa3", ("scheduler", "AssertionError", sglang_sim.FA3)),
        ((9, 0), "target", "trtllm_mla", ("server_args", "ValueError", sglang_sim.TRTLLM_MLA)),
        # SGLang's own check lets SM120 through (is_blackwell covers SM 10.x to 12.x).
        ((12, 0), "target", "trtllm_mla", None),
        ((10, 0), "target", "trtllm_mha", ("scheduler", "ValueError", NOT_MHA)),
        ((9, 0), "target", "fa4", ("scheduler", "AssertionError",
                                    "(head_dim, head_dim_v)=(64, 512) is not supported on SM90. "
                                    "head_dim and head_dim_v must be between 8 and 256 and "
                                    "divisible by 8, or both equal to 512.")),
        ((10, 0), "target", "fa4", None),
        ((12, 0), "target", "flashinfer", None),
        ((12, 0), "target", "triton", None),
    ],
)  # fmt: skip
def test_attention_backends_against_the_gpus_compute_capability(
    folders, monkeypatch, capability, where, backend, expected
):
    monkeypatch.setattr(sglang_sim, "compute_capability", lambda: capability)
    key = "attention_backend" if where == "target" else "speculative_draft_attention_backend"
    assert failure_of(resolved_for(folders, "DFLASH", **{key: backend})) == expected


def fake_nvidia_smi(folder: Path, capability: str) -> Path:
    """A folder whose nvidia-smi answers --query-gpu=compute_cap as the real one does."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\nprintf '{capability}\\n{capability}\\n'\n")
    script.chmod(0o755)
    return folder


def test_a_backend_the_gpu_does_not_run_stops_the_server_before_its_port_opens(tmp_path):
    """On SM120 fa3 fails in the scheduler, after loading: its exception, the launch process's
    sigquit line, the whole server killed; trtllm_mla on SM90 fails with the arguments, exit 1."""
    from tests.support.safetensors_files import tiny_folders

    folders = tiny_folders(tmp_path / "models")
    argv = [a if a != "/w/t" else str(folders["target"]) for a in BASE]
    sm120 = fake_nvidia_smi(tmp_path / "sm120", "12.0")
    fa3 = [a if a != "flashinfer" else "fa3" for a in argv]
    process, _ = start(fa3, wait="none", PATH=f"{sm120}:/usr/bin:/bin")
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == -9, stderr
    assert "Scheduler hit an exception: Traceback (most recent call last):" in stderr
    assert f"\nAssertionError: {sglang_sim.FA3}\n" in stderr
    assert "Received sigquit from a child process. It usually means the child failed." in stderr
    sm90 = fake_nvidia_smi(tmp_path / "sm90", "9.0")
    trtllm = [a if a != "flashinfer" else "trtllm_mla" for a in argv]
    process, _ = start(trtllm, wait="none", PATH=f"{sm90}:/usr/bin:/bin")
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 1 and f"\nValueError: {sglang_sim.TRTLLM_MLA}" in stderr
    # The same folder serves where the backend runs.
    healthy, url = start(argv, PATH=f"{sm120}:/usr/bin:/bin")
    try:
        assert requests.get(f"{url}/health_generate", timeout=30).status_code == 200
    finally:
        stop(healthy)
