"""The benchmark client against a server that misbehaves: a stream cut inside an event, fields
of the wrong type, an event line that never ends, an error body that echoes the request's
secrets. The simulator plays each fault (SGLANG_SIM_FAULT); a canned-bytes server plays the
shapes no simulator fault covers."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ansible.module_utils.benchmark import client as benchmark_client
from ansible.module_utils.benchmark.client_report import record_of
from ansible.module_utils.benchmark.client_stream import Tracker
from ansible.module_utils.benchmark.client_target import Target, server_state
from ansible.module_utils.benchmark.stream import ResponseParser

from tests.support.modules import run_module
from tests.support.results_tree import check_contract
from tests.support.sim_process import BASE, start

pytestmark = pytest.mark.benchmark
REPO = Path(__file__).resolve().parents[2]
API_KEY = "sk-fault-4f1c9a7e2b"
HF_TOKEN = "hf_FaultTokenQ8z3Lm2Xw9"


@pytest.fixture
def prompts_file(tmp_path) -> Path:
    path = tmp_path / "gsm8k.jsonl"
    path.write_text(
        "".join(json.dumps({"id": i, "prompt": f"question {i}"}) + "\n" for i in range(3))
    )
    return path


def bench_args(url: str, prompts: Path, out: Path, **extra) -> dict:
    return {
        "base_url": url,
        "concurrency": [1],
        "prompts": str(prompts),
        "num_prompts": 3,
        "max_new_tokens": 24,
        "warmup_requests": 1,
        "request_timeout": 30,
        "output_dir": str(out),
        "run_label": "faults",
        "config_name": "ar",
        **extra,
    }


def run_against(fault: str, at: int, args: dict, argv=(), **env) -> dict:
    env = {"SGLANG_SIM_STEP_MS": 2, "SGLANG_SIM_PREFILL_MS": 4, **env}
    process, _url = start([*BASE, *argv], SGLANG_SIM_FAULT=fault, SGLANG_SIM_FAULT_AT=at, **env)
    try:
        return run_module("sglang_benchmark", {**args, "base_url": _url})
    finally:
        process.kill()
        process.wait()


# -- defect 4: a cut inside an event is a crash ------------------------------------------


def test_a_stream_cut_inside_an_event_is_recorded_as_a_crash(tmp_path, prompts_file):
    # Request 1 is the warmup; request 3 is the level's second, cut in its second event.
    result = run_against("cut_event", 3, bench_args("", prompts_file, tmp_path))
    assert result["failed"], result
    assert "crashed during concurrency 1 of ar" in result["msg"], result["msg"]
    document = json.loads((tmp_path / "c1.json").read_text())
    check_contract(document, "ar", 1)
    assert document["server"]["crashed"]
    cut = document["requests"][1]
    assert not cut["ok"] and "inside an event" in cut["error"], cut["error"]
    # The requests before and after the cut ran to [DONE]: only the cut one is lost.
    assert [r["ok"] for r in document["requests"]] == [True, False, True]


class Canned:
    """A loopback server that answers every connection with the same bytes, then closes."""

    def __init__(self, answer: bytes):
        self.answer = answer
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while not self.stop.is_set():
            try:
                connection, _ = self.sock.accept()
            except OSError:
                continue
            with connection:
                connection.settimeout(5)
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    piece = connection.recv(65536)
                    if not piece:
                        break
                    head += piece
                with contextlib.suppress(OSError):  # the client may give up first
                    connection.sendall(self.answer)

    def close(self):
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()


def one_request(answer: bytes, timeout: float = 10) -> tuple[Tracker, dict]:
    server = Canned(answer)
    try:
        target = Target(server.url, "")
        loop = asyncio.new_event_loop()
        try:
            level = loop.run_until_complete(
                benchmark_client.run_level(target, [target.request({"text": "q"})], 1, timeout, 64)
            )
        finally:
            loop.close()
    finally:
        server.close()
    tracker = level["trackers"][0]
    record, _ = record_of(tracker, {"id": 0}, "0" * 64)
    return tracker, record


def event(meta, **fields) -> bytes:
    return b"data: " + json.dumps({"text": "a b", **fields, "meta_info": meta}).encode() + b"\n\n"


GOOD_FIRST = event({"completion_tokens": 1})
GOOD_LAST = event({"completion_tokens": 2, "finish_reason": {"type": "length"}})
CLOSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def chunks(*pieces: bytes, end: bool = True) -> bytes:
    body = b"".join(b"%x\r\n" % len(p) + p + b"\r\n" for p in pieces)
    return body + (b"0\r\n\r\n" if end else b"")


@pytest.mark.parametrize(
    "answer",
    [
        # Close-delimited, cut in the middle of an event's line.
        CLOSE_HEAD + GOOD_FIRST + GOOD_LAST[:20],
        # The event's line complete, its terminating blank line never sent.
        CLOSE_HEAD + GOOD_FIRST + GOOD_LAST[:-1],
        # [DONE]'s line cut.
        CLOSE_HEAD + GOOD_FIRST + GOOD_LAST + b"data: [DO",
        # Chunked, cut inside a chunk that holds an event.
        CHUNKED_HEAD + chunks(GOOD_FIRST, end=False) + b"%x\r\n" % len(GOOD_LAST) + GOOD_LAST[:9],
        # Chunked, the body ended (last chunk sent) before [DONE].
        CHUNKED_HEAD + chunks(GOOD_FIRST, GOOD_LAST),
        # Chunked, the body ended inside an event.
        CHUNKED_HEAD + chunks(GOOD_FIRST, GOOD_LAST[:30]),
    ],
    ids=[
        "close-mid-line",
        "close-no-blank-line",
        "close-mid-done",
        "chunk-cut",
        "end-no-done",
        "end-mid-event",
    ],
)
def test_every_cut_before_done_is_a_lost_request(answer):
    tracker, record = one_request(answer)
    assert tracker.lost, tracker.error
    assert not record["ok"] and record["error"]


def test_a_complete_stream_is_not_lost():
    tracker, record = one_request(CHUNKED_HEAD + chunks(GOOD_FIRST, GOOD_LAST, b"data: [DONE]\n\n"))
    assert not tracker.lost and record["ok"], record
    assert record["output_tokens"] == 2 and record["finish_reason"] == "length"


def test_a_partial_event_is_not_an_event():
    parser = ResponseParser()
    assert parser.feed(CLOSE_HEAD + GOOD_FIRST + GOOD_LAST[:20]) == [GOOD_FIRST[6:-2]]
    parser.close()
    assert parser.inside_event
    whole = ResponseParser()
    assert whole.feed(CLOSE_HEAD + GOOD_FIRST) == [GOOD_FIRST[6:-2]]
    whole.close()
    assert not whole.inside_event


# -- defect 4: every field is type-checked, a bad one is that request's error ------------


@pytest.mark.parametrize("fault", ["meta_info_string", "meta_info_list"])
def test_meta_info_that_is_not_an_object_fails_only_its_request(tmp_path, prompts_file, fault):
    result = run_against(fault, 3, bench_args("", prompts_file, tmp_path))
    assert not result.get("failed"), result
    document = json.loads((tmp_path / "c1.json").read_text())
    check_contract(document, "ar", 1)
    assert not document["server"]["crashed"]
    assert [r["ok"] for r in document["requests"]] == [True, False, True]
    assert "meta_info" in document["requests"][1]["error"]


FIELD_CASES = {
    "meta_info a string": event("completion_tokens: 2"),
    "meta_info null": event(None),
    "meta_info a number": event(7),
    "event a list": b"data: [1, 2]\n\n",
    "event a number": b"data: 12\n\n",
    "completion_tokens a string": event({"completion_tokens": "2"}),
    "completion_tokens a float": event({"completion_tokens": 2.5}),
    "completion_tokens true": event({"completion_tokens": True}),
    "completion_tokens negative": event({"completion_tokens": -2}),
    "completion_tokens huge": b'data: {"meta_info":{"completion_tokens":' + b"9" * 5000 + b"}}\n\n",
    "completion_tokens big": event({"completion_tokens": 10**30}),
    "spec_verify_ct a string": event({"completion_tokens": 2, "spec_verify_ct": "1"}),
    "spec_accept_length a string": event({"completion_tokens": 2, "spec_accept_length": "2"}),
    "spec_accept_length negative": event({"completion_tokens": 2, "spec_accept_length": -1.0}),
    "prompt_tokens a list": event({"completion_tokens": 2, "prompt_tokens": [3]}),
    "cached_tokens a float": event({"completion_tokens": 2, "cached_tokens": 0.5}),
    "finish_reason a string": event({"completion_tokens": 2, "finish_reason": "length"}),
    "text a number": event({"completion_tokens": 2}, text=5),
    "output_ids strings": event({"completion_tokens": 2}, output_ids=["a", "b"]),
    "deeply nested": b'data: {"meta_info":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n\n",
}


@pytest.mark.parametrize("case", list(FIELD_CASES))
def test_a_field_of_the_wrong_type_fails_its_request_not_the_client(case):
    answer = CHUNKED_HEAD + chunks(GOOD_FIRST, FIELD_CASES[case], b"data: [DONE]\n\n")
    tracker, record = one_request(answer)
    assert not record["ok"] and record["error"], (case, record)
    assert not tracker.lost


def test_server_state_survives_bad_server_info_and_metrics():
    for info in (b"[1]", b"{" * 5000, b"[" * 100_000 + b"]" * 100_000, b'{"startup_time": "x"}'):
        body = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(info) + info
        server = Canned(body)
        try:
            state = server_state(Target(server.url, ""))
        finally:
            server.close()
        assert state["startup_time"] is None
        # /metrics answers the same bytes: no counters come out of them.
        assert state["metrics"] == {}


def test_a_module_given_bad_server_info_fails_with_a_message(tmp_path, prompts_file):
    body = json.dumps({"tokenizer_path": ["x"], "version": 5, "internal_states": "no"}).encode()
    server = Canned(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    try:
        result = run_module("sglang_benchmark", bench_args(server.url, chats, tmp_path / "o"))
    finally:
        server.close()
    assert result["failed"] and "chat template" in result["msg"], result


# -- defect 4: one endless line is bounded ------------------------------------------------

RSS_PROBE = r"""
import asyncio, json, sys
sys.path.insert(0, sys.argv[2])
import module_utils  # noqa: F401
from ansible.module_utils.benchmark import client
from ansible.module_utils.benchmark.client_report import record_of
from ansible.module_utils.benchmark.client_target import Target

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

target = Target(sys.argv[1], "")
payload = target.request({"text": "q", "sampling_params": {"max_new_tokens": 8}, "stream": True})
before = hwm()
loop = asyncio.new_event_loop()
level = loop.run_until_complete(client.run_level(target, [payload], 1, 60, 64))
tracker = level["trackers"][0]
record, _ = record_of(tracker, {"id": 0}, "0" * 64)
print(json.dumps({"before_kib": before, "peak_kib": hwm(), "error": record["error"],
                  "lost": tracker.lost, "bytes": tracker.nbytes}))
"""


def endless_line_rss(mib: float) -> dict:
    process, url = start(BASE, SGLANG_SIM_FAULT="endless_line", SGLANG_SIM_ENDLESS_MIB=mib)
    try:
        probe = subprocess.run(
            [sys.executable, "-c", RSS_PROBE, url, str(REPO)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        process.kill()
        process.wait()
    assert probe.returncode == 0, probe.stderr
    return json.loads(probe.stdout)


def test_an_endless_event_line_fails_its_request_within_the_bound():
    """The simulator sends 20 MiB of one line, then closes: the client gives up at 16 MiB
    and its peak memory grows by little more than that bound."""
    found = endless_line_rss(20)
    assert "longer than 16 MiB" in found["error"], found
    grown_mib = (found["peak_kib"] - found["before_kib"]) / 1024
    # One bound's worth of buffered line, plus a read or two and the interpreter's slack.
    assert grown_mib < 16 + 8, found
    assert found["bytes"] < (16 << 20) + (1 << 20), found


# -- defect 5: no secret in anything the benchmark writes ---------------------------------


def base64_forms(secret: str) -> set[str]:
    """Substrings of base64 that only the secret's bytes decide, at each of the three
    alignments it can have inside a longer encoded text (std and URL-safe alphabets)."""
    forms = set()
    raw = secret.encode()
    for offset in range(3):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            text = encode(b"\0" * offset + raw + b"\0\0").decode()
            first = math.ceil(offset * 8 / 6)
            last = (offset + len(raw)) * 8 // 6  # characters wholly inside the secret's bits
            forms.add(text[first:last])
    return forms


def test_base64_forms_match_what_an_echo_holds():
    for prefix in ("", "B", "Be", "Bearer ", "Authorization: Bearer "):
        encoded = base64.b64encode(f"{prefix}{API_KEY}\r\n".encode()).decode()
        assert any(form in encoded for form in base64_forms(API_KEY)), prefix


def scan_for_secrets(folder: Path) -> list[str]:
    needles = {API_KEY, HF_TOKEN} | base64_forms(API_KEY) | base64_forms(HF_TOKEN)
    found = []
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert files
    for path in files:
        text = path.read_bytes().decode("utf-8", "replace")
        found += [f"{path.name}: {needle}" for needle in needles if needle in text]
    return found


def test_no_secret_reaches_any_file_the_benchmark_writes(tmp_path, prompts_file):
    """The server echoes the request's headers (Authorization, raw and base64) in an error;
    the launch record and the caller's provenance hold both secrets under harmless names."""
    out = tmp_path / "out"
    out.mkdir()
    launch = {
        "config": "ar",
        "argv": ["--model-path", "/w/t", "--api-key-from", f"x{API_KEY}y"],
        "environment": {"EXTRA": f"--token={HF_TOKEN}", "HF_TOKEN": HF_TOKEN},
    }
    (tmp_path / "launch.json").write_text(json.dumps(launch))
    records = {"launch": str(tmp_path / "launch.json"), "runtime": str(tmp_path / "absent")}
    (out / "provenance.json").write_text(
        json.dumps({"records": records, "note": f"by {HF_TOKEN} and {API_KEY}"})
    )
    args = bench_args("", prompts_file, out, api_key=API_KEY, hf_token=HF_TOKEN)
    result = run_against("echo_headers", 3, args, argv=["--api-key", API_KEY])
    assert not result.get("failed"), result
    document = json.loads((out / "c1.json").read_text())
    check_contract(document, "ar", 1)
    echoed = document["requests"][1]
    assert not echoed["ok"] and echoed["error"].startswith("HTTP 400"), echoed
    # The module's provenance.json input is the caller's: only what the benchmark wrote counts.
    (out / "provenance.json").unlink()
    assert scan_for_secrets(out) == []
    assert scan_for_secrets_in_text(json.dumps(result)) == []


def scan_for_secrets_in_text(text: str) -> list[str]:
    needles = {API_KEY, HF_TOKEN} | base64_forms(API_KEY) | base64_forms(HF_TOKEN)
    return [needle for needle in needles if needle in text]


def test_no_secret_in_the_failure_message_when_every_request_echoes(tmp_path, prompts_file):
    args = bench_args("", prompts_file, tmp_path, api_key=API_KEY, hf_token=HF_TOKEN)
    result = run_against("echo_headers", 0, args, argv=["--api-key", API_KEY])
    assert result["failed"] and "Every warmup request" in result["msg"], result
    assert "HTTP 400" in result["msg"]
    assert scan_for_secrets_in_text(json.dumps(result)) == []


# -- the lossless check reads level files as outside input --------------------------------


def lossless_level(folder: Path, config: str, document) -> Path:
    path = folder / config / "gsm8k" / "c1.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
    return path


GOOD_LEVEL = {
    "settings": {"temperature": 0.0},
    "requests": [{"index": 0, "ok": True, "prompt_sha256": "p", "output_ids": [1, 2]}],
}


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ([1, 2], "expected an object"),
        ({"settings": "hot", "requests": []}, "settings: expected an object"),
        ({"settings": {"temperature": [0]}, "requests": []}, "settings.temperature"),
        ({"settings": {}, "requests": {"0": 1}}, "requests: expected a list"),
        ({"settings": {}, "requests": [7]}, "requests[0]: expected an object"),
        (
            {"settings": {}, "requests": [{"index": 0, "ok": True, "output_ids": "12"}]},
            "requests[0].output_ids",
        ),
        ({"settings": {}, "requests": [{"index": [0], "ok": True}]}, "requests[0].index"),
        ({"settings": {}, "requests": [{"index": 0, "ok": True, "text": 5}]}, "requests[0].text"),
    ],
)
def test_the_lossless_check_names_the_file_and_field_of_a_bad_level(tmp_path, document, field):
    lossless_level(tmp_path, "ar", GOOD_LEVEL)
    bad = lossless_level(tmp_path, "dflash", document)
    args = {"results_dir": str(tmp_path), "output": str(tmp_path / "lossless.json")}
    result = run_module("benchmark_lossless", args)
    assert result["failed"], result
    assert str(bad) in result["msg"] and field in result["msg"], result["msg"]


def test_the_lossless_check_reads_only_regular_files(tmp_path):
    lossless_level(tmp_path, "ar", GOOD_LEVEL)
    folder = tmp_path / "dflash" / "gsm8k"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "c1.json")
    (tmp_path / "eagle3" / "gsm8k").mkdir(parents=True)
    (tmp_path / "eagle3" / "gsm8k" / "c1.json").symlink_to("/dev/zero")
    args = {"results_dir": str(tmp_path), "output": str(tmp_path / "lossless.json")}
    for _ in range(2):
        result = subprocess.run(
            [sys.executable, "-c", LOSSLESS_RUN, json.dumps(args), str(REPO)],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        answer = json.loads(result.stdout)
        assert answer["failed"] and "not a regular file" in answer["msg"], answer
        # Whichever it met first: take it away and the other one is refused too.
        if "dflash" in answer["msg"]:
            (folder / "c1.json").unlink()
        else:
            (tmp_path / "eagle3" / "gsm8k" / "c1.json").unlink()


# In a process of its own, under a deadline: on a FIFO the old reader blocks for ever.
LOSSLESS_RUN = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
import module_utils  # noqa: F401
from tests.support.modules import run_module
print(json.dumps(run_module("benchmark_lossless", json.loads(sys.argv[1]))))
"""


@pytest.mark.parametrize("answer", [b"[1]", b"not json", b'{"sha": 5}', b"[" * 100_000])
def test_a_hub_answer_that_is_no_commit_is_a_clear_error(answer):
    from ansible.module_utils.benchmark import prompt_sets

    server = Canned(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(answer) + answer)
    try:
        with pytest.raises(prompt_sets.PromptError, match="the hub answered no commit"):
            prompt_sets.resolve(server.url, "org/set", "main", "", 10)
    finally:
        server.close()


def test_a_server_answer_that_drips_is_cut_at_its_deadline():
    """A byte every 50 ms keeps each socket read inside its timeout; the whole answer still
    has a deadline."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    stop = threading.Event()

    def drip():
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n")
            for _ in range(200):  # at most 10 s
                if stop.wait(0.05):
                    break
                with contextlib.suppress(OSError):
                    connection.sendall(b"x")

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    target = Target(f"http://127.0.0.1:{listener.getsockname()[1]}", "")
    began = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            target.get("/metrics", timeout=1)
        assert time.monotonic() - began < 3
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


# -- levels: time budget, bad arguments, bad rows and workloads ----------------------------


def test_a_level_past_its_time_budget_starts_no_more_requests(tmp_path, prompts_file):
    # One request takes 24 steps of 20 ms, ten times the budget: the first starts (the
    # budget had not passed), finishes, and no other starts after it.
    args = bench_args(
        "", prompts_file, tmp_path, requests_per_concurrency=1, level_time_budget_s=0.05
    )
    result = run_against("", 0, args, SGLANG_SIM_STEP_MS=20)
    assert not result.get("failed"), result
    document = json.loads((tmp_path / "c1.json").read_text())
    check_contract(document, "ar", 1)
    assert document["fill"] == {
        "wanted": 3,
        "unique_prompts": 3,
        "sent": 1,
        "under_filled": False,
        "stopped_by_time_budget": True,
        "time_budget_s": 0.05,
    }
    assert len(document["requests"]) == 1 and document["requests"][0]["ok"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"request_rates": [0.0]}, "request_rates: 0.0 is not a rate above 0"),
        ({"request_rates": [float("nan")]}, "request_rates: nan is not a rate above 0"),
        ({"request_rates": [1e-7]}, "has no plain decimal name (1e-07)"),
        ({"request_rates": [1.23456789]}, "has no plain decimal name (1.23457)"),
        ({"request_rates": [2, 2.0]}, "request_rates names a rate twice"),
        ({"concurrency": [4, 4]}, "concurrency names a level twice"),
        ({"max_concurrency": -1}, "max_concurrency must be 0 (no cap) or more"),
        ({"rate_duration_s": 0.0}, "rate_duration_s must be above 0"),
        ({"requests_per_concurrency": 0}, "requests_per_concurrency must be at least 1"),
        ({"level_time_budget_s": -1.0}, "level_time_budget_s must be above 0"),
        ({"repeats": 0}, "repeats must be from 1 to 100"),
        ({"telemetry_interval_ms": 5}, "telemetry_interval_ms must be from 20 to 60000"),
    ],
)
def test_bad_level_arguments_are_refused_before_any_request(tmp_path, prompts_file, extra, message):
    result = run_module(
        "sglang_benchmark", bench_args("http://127.0.0.1:9", prompts_file, tmp_path, **extra)
    )
    assert result["failed"] and message in result["msg"], result["msg"]
    assert not list(tmp_path.glob("c*.json"))


SERVER_INFO = b'HTTP/1.1 200 OK\r\ncontent-length: 21\r\n\r\n{"version": "0.5.23"}'
GOOD_WORKLOAD = {
    "name": "isl2-osl4",
    "isl": 2,
    "osl": 4,
    "ignore_eos": True,
    "tokenizer": {"file": "tokenizer.json", "sha256": "a" * 64, "revision": None},
    "seed": 7,
}


@pytest.mark.parametrize(
    ("rows", "workload", "message"),
    [
        ([{"input_ids": []}], None, 'line 1: "input_ids" must be a list of 1 to 1048576'),
        ([{"input_ids": [1, "2"]}], None, 'line 1: "input_ids" must hold token ids'),
        ([{"input_ids": [1, -2]}], None, 'line 1: "input_ids" must hold token ids'),
        ([{"input_ids": [1, True]}], None, 'line 1: "input_ids" must hold token ids'),
        ([{"input_ids": [1, 2]}, {"text": "x"}], None, 'line 2: needs "prompt"'),
        ([{"input_ids": [1, 2]}], "not an object", "workload is not an object"),
        (
            [{"input_ids": [1, 2]}],
            {**GOOD_WORKLOAD, "osl": 5},
            "name isl2-osl4 but isl 2 and osl 5",
        ),
        ([{"input_ids": [1, 2]}], {**GOOD_WORKLOAD, "name": "x"}, "is not isl<N>-osl<M>"),
        (
            [{"input_ids": [1, 2]}],
            {**GOOD_WORKLOAD, "osl": 10**6, "name": "isl2-osl1000000"},
            "osl must be an integer from 1 to 131072",
        ),
        (
            [{"input_ids": [1, 2]}],
            {**GOOD_WORKLOAD, "tokenizer": {"file": "../x"}},
            "tokenizer.file must be a file name",
        ),
        ([{"input_ids": [1, 2]}], {**GOOD_WORKLOAD, "seed": "7"}, "seed must be an integer"),
    ],
)
def test_bad_token_rows_and_workloads_fail_with_the_file_and_what_is_wrong(
    tmp_path, rows, workload, message
):
    prompts = tmp_path / "isl2-osl4.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    if workload is not None:
        (tmp_path / "isl2-osl4.meta.json").write_text(json.dumps({"workload": workload}))
    server = Canned(SERVER_INFO)
    try:
        result = run_module("sglang_benchmark", bench_args(server.url, prompts, tmp_path / "o"))
    finally:
        server.close()
    assert result["failed"] and message in result["msg"], result["msg"]
    assert str(tmp_path) in result["msg"]
    assert not (tmp_path / "o" / "c1.json").exists()
