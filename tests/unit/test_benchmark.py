"""The benchmark without test hosts: stream parsing, statistics, the losslessness check, chat
templates, and the modules themselves against the simulator and a local hub."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from ansible.module_utils.benchmark import client_target
from ansible.module_utils.benchmark.chat import chat_template_of, fill, render_chat, special_tokens
from ansible.module_utils.benchmark.client_report import client_report
from ansible.module_utils.benchmark.client_stream import Tracker
from ansible.module_utils.benchmark.stats import (
    SCHEMA_VERSION,
    accepted_tokens_per_step,
    compare_outputs,
    distribution,
    parse_metrics,
    request_timings,
    server_delta,
    startup_record,
    summarize_level,
)
from ansible.module_utils.benchmark.stream import ResponseParser, StreamError, completion_tokens

import analysis
from analysis.results import SUPPORTED_SCHEMAS
from tests.support.hub_server import LocalHub
from tests.support.modules import assert_unchanged, run_module
from tests.support.results_tree import LEVEL_SCHEMA, TEMPLATE, check_contract, level_problems
from tests.support.sim_process import BASE, DFLASH, start

pytestmark = pytest.mark.benchmark
REPO = Path(__file__).resolve().parents[2]

# -- stream parsing -------------------------------------------------------------------


def sse(*payloads: bytes) -> bytes:
    return b"".join(b"data: " + p + b"\n\n" for p in payloads)


def chunked(body: bytes, size: int) -> bytes:
    out = b""
    for offset in range(0, len(body), size):
        piece = body[offset : offset + size]
        out += b"%x;ext=1\r\n" % len(piece) + piece + b"\r\n"
    return out + b"0\r\n\r\n"


def chunk_each(pieces: list[bytes], upper: bool = False) -> bytes:
    """One chunk per piece, as uvicorn writes one per StreamingResponse yield."""
    size = b"%X" if upper else b"%x"
    return b"".join(size % len(p) + b"\r\n" + p + b"\r\n" for p in pieces) + b"0\r\n\r\n"


HEAD = (
    b"HTTP/1.1 200 OK\r\ndate: Mon, 30 Nov 2026 12:00:00 GMT\r\nserver: uvicorn\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
)
# Events as SGLang sends them: compact JSON, cumulative text that may hold what looks like
# framing (CRLF, "data: ", a chunk size, the completion_tokens key), meta_info with the spec
# fields on the last event only.
EVENTS = [
    json.dumps(
        {
            "text": text,
            "output_ids": list(range(n)),
            "meta_info": {"id": "r1", "completion_tokens": n, **extra},
        },
        separators=(",", ":"),
    ).encode()
    for text, n, extra in (
        ("1\r\n", 1, {}),
        ('1\r\ndata: [DONE]\n\n0\r\n\r\n "completion_tokens":99', 5, {}),
        ("é" * 300, 9, {"spec_verify_ct": 2, "spec_accept_length": 4.5}),
    )
]


def feed_all(raw: bytes, cuts: list[int]) -> tuple[ResponseParser, list[bytes]]:
    parser = ResponseParser()
    found, start = [], 0
    for cut in [*cuts, len(raw)]:
        found += parser.feed(raw[start:cut])
        start = cut
    return parser, found


@pytest.mark.parametrize("split", [1, 3, 7, 64, 10_000])
def test_chunked_events_survive_any_split(split):
    events = [json.dumps({"meta_info": {"completion_tokens": n}}).encode() for n in (1, 4, 7)]
    body = sse(*events, b"[DONE]")
    raw = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\ncontent-type: text/event-stream"
        b"\r\n\r\n" + chunked(body, 5)
    )
    parser = ResponseParser()
    found = []
    for offset in range(0, len(raw), split):
        found += parser.feed(raw[offset : offset + split])
    assert found == [*events, b"[DONE]"]
    assert parser.finished and parser.status == 200


def test_uvicorn_framing_parses_at_every_read_boundary():
    """One chunk per event (uvicorn), cut into two reads at every byte, and into three at a
    spread of pairs: inside the head, the size line, its CRLF, the event, the chunk's CRLF."""
    raw = HEAD + chunk_each([b"data: " + e + b"\n\n" for e in EVENTS] + [b"data: [DONE]\n\n"])
    for cut in range(1, len(raw)):
        parser, found = feed_all(raw, [cut])
        assert found == [*EVENTS, b"[DONE]"], cut
        assert parser.finished
    for first in range(1, len(raw), 37):
        for second in range(first + 1, len(raw), 53):
            assert feed_all(raw, [first, second])[1] == [*EVENTS, b"[DONE]"]
    assert [completion_tokens(e) for e in EVENTS] == [1, 5, 9]


@pytest.mark.parametrize("seed", range(25))
def test_events_split_across_chunks_and_chunks_holding_several_events(seed):
    import random

    rng = random.Random(seed)
    body = sse(*EVENTS, b"[DONE]")
    # Chunk boundaries anywhere: mid-event, mid-"data:", between the two newlines, and
    # chunks spanning several events; hex sizes in either case, extensions on some.
    pieces, offset = [], 0
    while offset < len(body):
        size = rng.choice([1, 2, 5, 17, 64, 400, 5000])
        pieces.append(body[offset : offset + size])
        offset += size
    framed = b""
    for piece in pieces:
        size = (b"%X" if rng.random() < 0.5 else b"%x") % len(piece)
        extension = b";name=value" if rng.random() < 0.3 else b""
        framed += size + extension + b"\r\n" + piece + b"\r\n"
    trailer = b"x-trailer: 1\r\n" if seed % 2 else b""
    raw = HEAD + framed + b"0\r\n" + trailer + b"\r\n"
    cuts = sorted(rng.sample(range(1, len(raw)), min(40, len(raw) - 1)))
    parser, found = feed_all(raw, cuts)
    assert found == [*EVENTS, b"[DONE]"]
    assert parser.finished
    # What follows the last chunk (a kept-alive connection's next answer) is not this body.
    assert parser.feed(b"HTTP/1.1 200 OK\r\n\r\ndata: {}\n\n") == []


@pytest.mark.parametrize(
    "framing",
    [
        b"zz\r\ndata: 1\n\n\r\n",  # not hex
        b"-a\r\n" + b"x" * 10 + b"\r\n",  # a sign
        b"0xa\r\n" + b"x" * 10 + b"\r\n",  # a prefix int() would take
        b"1_0\r\n" + b"x" * 16 + b"\r\n",  # an underscore int() would take
        b"a\r\n" + b"x" * 10 + b"XX",  # chunk data not followed by CRLF
        b"1" * 2000,  # a size line that never ends
    ],
)
def test_bad_chunk_framing_is_refused(framing):
    parser = ResponseParser()
    with pytest.raises(StreamError):
        for offset in range(0, len(framing) + len(HEAD), 7):
            parser.feed((HEAD + framing)[offset : offset + 7])


@pytest.mark.parametrize("line", [b"d" * 512, b"data: x\n" * 64])
def test_an_endless_event_is_refused(line):
    # One line that never ends, or data lines without the blank line that ends an event.
    parser = ResponseParser()
    parser.MAX_EVENT = 1000
    parser.feed(HEAD)
    with pytest.raises(StreamError, match="longer than"):
        for _ in range(10):
            parser.feed(b"%x\r\n" % len(line) + line + b"\r\n")


def test_close_delimited_and_error_bodies():
    parser = ResponseParser()
    assert parser.feed(b'HTTP/1.1 200 OK\r\n\r\ndata: {"a": 1}\r\n\r\ndata: [DO') == [b'{"a": 1}']
    assert parser.feed(b"NE]") == []
    # A [DONE] whose line or blank line never came is no [DONE]: the stream was cut.
    parser.close()
    assert parser.inside_event
    ended = ResponseParser()
    assert ended.feed(b"HTTP/1.1 200 OK\r\n\r\ndata: [DONE]\n\n") == [b"[DONE]"]
    ended.close()
    assert not ended.inside_event
    refused = ResponseParser()
    refused.feed(b'HTTP/1.1 401 Unauthorized\r\nContent-Length: 12\r\n\r\n{"error": 1}')
    assert refused.status == 401 and refused.finished and bytes(refused.body) == b'{"error": 1}'
    with pytest.raises(StreamError):
        ResponseParser().feed(b"SSH-2.0-OpenSSH\r\n\r\n")


def test_completion_tokens_ignores_the_key_inside_the_text():
    text = 'say "completion_tokens": 999 please'
    event = json.dumps({"text": text, "meta_info": {"completion_tokens": 12}}).encode()
    assert completion_tokens(event) == 12
    assert completion_tokens(b'{"text": "no meta"}') is None
    assert completion_tokens(b'{"meta_info": {"completion_tokens":3}}') == 3


# -- statistics -----------------------------------------------------------------------


def test_itl_is_per_token_and_tpot_counts_after_the_first_event():
    # First event at 50 ms with 3 tokens, then 3 tokens every 30 ms, one empty event.
    events = [(0.050, 3), (0.080, 6), (0.095, 6), (0.110, 9), (0.140, 12)]
    timings = request_timings(0.0, events, done=0.141)
    assert timings["ttft_ms"] == pytest.approx(50)
    assert timings["itl_ms"] == pytest.approx([10.0] * 9)
    assert timings["tpot_ms"] == pytest.approx(90 / 9)
    assert timings["e2e_ms"] == pytest.approx(141)


def test_distribution_matches_linear_interpolation():
    values = list(range(1, 101))
    found = distribution([float(v) for v in values])
    assert found["mean"] == 50.5 and found["p50"] == 50.5
    assert found["p90"] == pytest.approx(90.1) and found["p99"] == pytest.approx(99.01)
    assert distribution([])["count"] == 0


def test_accepted_tokens_per_step_leaves_the_prefill_token_out():
    # ACCEPT=4, 30 tokens: the prefill token, then ceil(29 / 4) = 8 verify steps.
    assert accepted_tokens_per_step(30, 8) == pytest.approx(29 / 8)
    assert accepted_tokens_per_step(1, 0) is None  # only the prefill token: no verify step
    assert accepted_tokens_per_step(5, None) is None


def test_summary_weights_accept_length_by_tokens_and_decomposes_speed():
    # Two speculative requests as SGLang reports them: 100 tokens in 25 verify steps (4 per
    # step by SGLang's count, 99 / 25 after the prefill token), 10 tokens in 9 steps.
    requests = [
        {
            "ok": True,
            "output_tokens": 100,
            "spec_verify_ct": 25,
            "accept_length": 99 / 25,
            "spec_accept_length": 4.0,
            "decode_steps": 25,
            "decode_ms": 500.0,
            "ttft_ms": 50,
            "e2e_ms": 550,
            "tpot_ms": 5,
        },
        {
            "ok": True,
            "output_tokens": 10,
            "spec_verify_ct": 9,
            "accept_length": 1.0,
            "spec_accept_length": 10 / 9,
            "decode_steps": 9,
            "decode_ms": 180.0,
            "ttft_ms": 50,
            "e2e_ms": 230,
            "tpot_ms": 20,
        },
        {"ok": False, "output_tokens": 0, "error": "x"},
    ]
    summary = summarize_level(requests, duration_s=1.0, itl_ms=[5.0, 20.0])
    assert summary["accept_length_mean"] == pytest.approx((100 * 3.96 + 10 * 1) / 110, abs=1e-4)
    assert summary["spec_accept_length_mean"] == pytest.approx(
        (100 * 4 + 10 * 10 / 9) / 110, abs=1e-4
    )
    # The tokens the verify steps added over the verify steps, summed over requests.
    assert summary["accepted_tokens_per_step"] == pytest.approx((99 + 9) / 34, abs=1e-4)
    assert summary["step_ms"] == pytest.approx(680 / 34, abs=1e-4)
    # The decomposition holds: decode tokens per second = accepted per step / step time.
    decode_rate = (99 + 9) / 0.680
    assert summary["accepted_tokens_per_step"] / summary["step_ms"] * 1000 == pytest.approx(
        decode_rate, rel=1e-3
    )
    assert summary["output_tokens_per_s"] == 110
    assert (summary["requests_ok"], summary["requests_failed"]) == (2, 1)
    assert summary["effective_concurrency"] == pytest.approx(0.78)
    plain = summarize_level([{**requests[0], "spec_verify_ct": None}], 1.0, [])
    assert plain["accepted_tokens_per_step"] == 1.0 and plain["spec_accept_length_mean"] is None


def test_server_deltas_and_restarts():
    text = (
        "# TYPE sglang:generation_tokens counter\n"
        'sglang:generation_tokens_total{engine_type="unified",is_streaming="true"} 100.0\n'
        'sglang:generation_tokens_total{engine_type="unified",is_streaming="false"} 20.0\n'
        'sglang:spec_verify_calls_total{engine_type="unified"} 40.0\n'
        'sglang:num_requests_total{is_streaming="true"} 6.0\n'
        "sglang:other 5\n"
    )
    names = (
        "sglang:generation_tokens_total",
        "sglang:spec_verify_calls_total",
        "sglang:num_requests_total",
    )
    metrics = parse_metrics(text, names)
    assert metrics == {
        "sglang:generation_tokens_total": 120.0,
        "sglang:spec_verify_calls_total": 40.0,
        "sglang:num_requests_total": 6.0,
    }
    start = {"load_weight": 1.5, "scheduler_e2e": 9.25, "cuda_graph": {"decode": 3.0}}
    before = {
        "metrics": {
            "sglang:generation_tokens_total": 20.0,
            "sglang:spec_verify_calls_total": 10.0,
            "sglang:num_requests_total": 1.0,
        },
        "startup_time": start,
    }
    delta = server_delta(before, {"metrics": metrics, "startup_time": dict(start)})
    assert not delta["restarted"]
    assert delta["spec_accept_length"] == pytest.approx(100 / 30, abs=1e-4)
    # One prefill token per finished request is not a verify step's.
    assert delta["accepted_tokens_per_step"] == pytest.approx((100 - 5) / 30, abs=1e-4)
    restarted = {**start, "scheduler_e2e": 9.5}
    assert server_delta(before, {"metrics": metrics, "startup_time": restarted})["restarted"]
    went_down = server_delta({"metrics": metrics}, before)
    assert went_down["restarted"] and went_down["accepted_tokens_per_step"] is None


def test_startup_record_keeps_what_sglang_sends_and_nothing_else():
    info = {
        "startup_time": {
            "load_weight": 12.5,
            "cuda_graph": {"decode": 3.25, "odd": "x"},
            "note": "not a duration",
            "flag": True,
        }
    }
    assert startup_record(info) == {"load_weight": 12.5, "cuda_graph": {"decode": 3.25}}
    assert startup_record({"startup_time": 1700000000.5}) == 1700000000.5
    assert startup_record({"startup_time": "yesterday"}) is None
    assert startup_record({"startup_time": {str(i): 1.0 for i in range(40)}}) is None
    assert startup_record({}) is None and startup_record([]) is None


def test_comparison_counts_tokens_from_the_first_divergence():
    base = [{"index": i, "ok": True, "output_ids": list(range(10))} for i in range(4)]
    same = compare_outputs(base, [dict(r) for r in base])
    assert same["mismatch_rate"] == 0 and same["requests_mismatched"] == 0
    changed = [dict(r) for r in base]
    changed[1]["output_ids"] = [0, 1, 2, 99, 4, 5, 6, 7, 8, 9]  # diverges at 3: 7 of 10
    changed[2]["output_ids"] = list(range(8))  # ends early: 2 of 10
    changed[3] = {"index": 3, "ok": False}
    changed.append({"index": 0, "ok": True, "outputs_incomplete": True, "output_ids": None})
    found = compare_outputs(base, changed)
    assert found["requests_compared"] == 3 and found["requests_mismatched"] == 2
    assert found["tokens_mismatched"] == 9 and found["tokens_compared"] == 30
    assert found["first_divergence"] == [3, 8]
    words = compare_outputs(
        [{"index": 0, "ok": True, "text": "a b c"}], [{"index": 0, "ok": True, "text": "a x c"}]
    )
    assert words["tokens_mismatched"] == 2


# -- chat templates --------------------------------------------------------------------


def test_chat_template_sources_and_rendering():
    config = {
        "chat_template": [
            {"name": "tool_use", "template": "T"},
            {"name": "default", "template": TEMPLATE},
        ],
        "bos_token": {"content": "<s>"},
    }
    template, source = chat_template_of({"tokenizer_config.json": json.dumps(config)})
    assert source == "tokenizer_config.json" and template == TEMPLATE
    assert chat_template_of({"chat_template.jinja": "J", "tokenizer_config.json": "{}"}) == (
        "J",
        "chat_template.jinja",
    )
    assert special_tokens(config) == {"bos_token": "<s>"}
    rendered = render_chat(TEMPLATE, [{"role": "user", "content": "2+2?"}], {}, {})
    assert rendered == "<|im_user|>2+2?<|im_end|><|im_assistant|>"
    marked = "{% generation %}{{ messages[0].content | tojson }}{% endgeneration %}"
    assert render_chat(marked, [{"role": "user", "content": "é"}], {}, {}) == '"é"'
    with pytest.raises(Exception, match="no system"):
        render_chat("{{ raise_exception('no system') }}", [], {}, {})


def test_fill_keeps_latex_braces():
    row = {"question": "1+1?", "turns": ["first", "second"]}
    assert fill("{question} within \\boxed{}.", row) == "1+1? within \\boxed{}."
    assert fill("{turns[1]}", row) == "second"
    with pytest.raises(KeyError):
        fill("{missing}", row)


# -- the modules -----------------------------------------------------------------------


@pytest.fixture
def prompts_file(tmp_path) -> Path:
    path = tmp_path / "gsm8k.jsonl"
    path.write_text(
        "".join(json.dumps({"id": i, "prompt": f"question {i}"}) + "\n" for i in range(6))
    )
    return path


def bench_args(url: str, prompts: Path, out: Path, config: str, **extra) -> dict:
    return {
        "base_url": url,
        "concurrency": [1, 4],
        "prompts": str(prompts),
        "num_prompts": 8,
        "max_new_tokens": 24,
        "warmup_requests": 1,
        "request_timeout": 30,
        "output_dir": str(out),
        "run_label": "unit",
        "config_name": config,
        **extra,
    }


def bench_on_simulator(argv: list[str], env: dict, prompts: Path, out: Path, config: str, **extra):
    """sglang_benchmark's result against a simulator started with argv and env, stopped after."""
    process, url = start(argv, **env)
    try:
        return run_module("sglang_benchmark", bench_args(url, prompts, out, config, **extra))
    finally:
        process.kill()
        process.wait()


# Long enough that a loaded machine waking the simulator's sleep a few ms late each step stays
# inside the 25% the test allows: 10 ms steps read as 13 ms under make test.
MEASURED_STEP_MS = 30


def test_module_measures_steps_and_tokens_against_the_simulator(tmp_path, prompts_file):
    process, url = start(
        [*BASE, *DFLASH],
        SGLANG_SIM_STEP_MS=MEASURED_STEP_MS,
        SGLANG_SIM_ACCEPT=3,
        SGLANG_SIM_PREFILL_MS=20,
    )
    # The launch record names the target's folder (with a weights manifest) and a drafter's
    # folder without one: the level file's provenance has both kinds of weights entry.
    model = tmp_path / "model"
    model.mkdir()
    manifest = {"repo_id": "org/m", "revision": "a" * 40, "verify_mode": "sha256"}
    manifest.update(verified_at="2026-01-01T00:00:00+00:00", files={"a.safetensors": 1})
    (model / "kimi-manifest.json").write_text(json.dumps(manifest))
    argv = ["--model-path", str(model), "--speculative-draft-model-path", str(tmp_path / "d")]
    (tmp_path / "launch.json").write_text(json.dumps({"config": "dflash", "argv": argv}))
    records = {"launch": str(tmp_path / "launch.json"), "runtime": str(tmp_path / "absent")}
    try:
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "provenance.json").write_text(
            json.dumps({"kit_version": "0.1.0+t", "records": records})
        )
        result = run_module(
            "sglang_benchmark", bench_args(url, prompts_file, tmp_path / "out", "dflash")
        )
    finally:
        process.kill()
        process.wait()
    assert not result.get("failed"), result
    assert [Path(f).name for f in result["files"]] == ["c1.json", "c4.json"]
    for level in (1, 4):
        document = json.loads((tmp_path / "out" / f"c{level}.json").read_text())
        check_contract(document, "dflash", level)
        summary = document["summary"]
        # The file's 6 prompts, each once: fewer than the level wants (8 at least, 10 per
        # request in flight), so it is under-filled rather than cycled into the radix cache.
        assert summary["requests_ok"] == 6 and summary["requests_failed"] == 0
        assert document["fill"] == {
            "wanted": max(8, 10 * level),
            "unique_prompts": 6,
            "sent": 6,
            "under_filled": True,
            "stopped_by_time_budget": False,
            "time_budget_s": 1200,
        }
        assert (document["arrival"], document["request_rate"]) == ("closed", None)
        assert (document["repeat"], document["repeats"]) == (1, 1)
        assert "workload" not in document
        # 24 tokens: the prefill token, then ceil(23 / 3) = 8 verify steps of 30 ms adding
        # 23 tokens: the decomposition the kit exists to show.
        steps = math.ceil(23 / 3)
        assert summary["accepted_tokens_per_step"] == pytest.approx(23 / steps)
        assert summary["accept_length_mean"] == pytest.approx(23 / steps)
        # SGLang's own figure counts the prefill token too.
        assert summary["spec_accept_length_mean"] == pytest.approx(24 / steps)
        assert summary["step_ms"] == pytest.approx(MEASURED_STEP_MS, rel=0.25)
        assert summary["itl_ms"]["mean"] == pytest.approx(MEASURED_STEP_MS * steps / 23, rel=0.25)
        assert summary["tpot_ms"]["mean"] == pytest.approx(MEASURED_STEP_MS * steps / 23, rel=0.25)
        record = document["requests"][0]
        assert record["output_tokens"] == 24 and len(record["output_ids"]) == 24
        assert record["spec_verify_ct"] == steps and record["decode_steps"] == steps
        assert record["spec_accept_length"] == pytest.approx(24 / steps)
        # The first event is the prefill token; one event per verify step follows.
        assert record["events"][0][1] == 1 and len(record["events"]) == 1 + steps
        delta = document["server"]["delta"]
        assert delta["spec_accept_length"] == pytest.approx(24 / steps)
        assert delta["accepted_tokens_per_step"] == pytest.approx(23 / steps)
        assert not delta["restarted"]
        assert document["server"]["cache"] == "flushed"
        provenance = document["provenance"]
        assert provenance["kit_version"] == "0.1.0+t" and provenance["sglang_version"] == "0.5.23"
        assert provenance["runtime"] is None and "records" not in provenance
        assert [(w["role"], w["manifest"] is not None) for w in provenance["weights"]] == [
            ("target", True),
            ("drafter", False),
        ]
        assert provenance["weights"][0]["files"] == 1
    assert result["ansible_facts"]["sglang_benchmark"]["summaries"]["c4"]["requests_ok"] == 6


def test_the_client_waits_for_an_idle_server_to_flush_and_says_when_it_was_not():
    import threading

    module = client_target
    process, url = start(BASE, SGLANG_SIM_STEP_MS=20)
    target = module.Target(url, "")
    busy = {"text": "long", "sampling_params": {"max_new_tokens": 40}}

    def occupy():
        requests.post(url + "/generate", json=busy, timeout=30)

    try:
        worker = threading.Thread(target=occupy)
        worker.start()
        time.sleep(0.2)
        # SGLang refuses to flush while a request runs; waiting less than it runs fails...
        refused = module.flush_cache(target, wait_s=0.3)
        assert refused == "not flushed (HTTP 400: Timed out waiting for idle state.)"
        # ...waiting long enough flushes once it is done (40 steps of 20 ms).
        began = time.monotonic()
        assert module.flush_cache(target, wait_s=20) == "flushed"
        assert time.monotonic() - began < 5
        worker.join(timeout=10)
        assert module.flush_cache(target, wait_s=1) == "flushed"
    finally:
        process.kill()
        process.wait()


def test_module_fails_when_the_server_crashes_and_keeps_the_level(tmp_path, prompts_file):
    process, url = start(BASE, SGLANG_SIM_CRASH_AFTER=3, SGLANG_SIM_STEP_MS=5)
    try:
        result = run_module("sglang_benchmark", bench_args(url, prompts_file, tmp_path, "ar"))
    finally:
        process.kill()
        process.wait()
    assert result["failed"]
    assert "crashed during concurrency 1 of ar" in result["msg"]
    document = json.loads((tmp_path / "c1.json").read_text())
    assert document["server"]["crashed"] and document["summary"]["requests_failed"] > 0
    # The level file of a crash follows the contract too: requests that ran, requests cut
    # off before any event (their records hold only the first fields), the server's state
    # after it went away (with the error it gave).
    check_contract(document, "ar", 1)
    requests = document["requests"]
    assert requests[0]["ok"] and "decode_steps" in requests[0]
    assert [r for r in requests if not r["ok"] and "decode_steps" not in r]
    assert "error" in document["server"]["after"]


def test_module_refuses_bad_input_and_an_absent_server(tmp_path, prompts_file):
    bad = run_module(
        "sglang_benchmark",
        bench_args("http://127.0.0.1:9", prompts_file, tmp_path, "ar", concurrency=[0]),
    )
    assert bad["failed"] and "concurrency must be" in bad["msg"]
    gone = run_module(
        "sglang_benchmark", bench_args("http://127.0.0.1:9", prompts_file, tmp_path, "ar")
    )
    assert gone["failed"] and "does not answer /server_info" in gone["msg"]


def test_module_renders_chat_rows_with_the_servers_template(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    argv = [a if a != "/w/t" else str(model) for a in BASE]
    process, url = start(argv, SGLANG_SIM_STEP_MS=2)
    try:
        args = bench_args(url, chats, tmp_path / "out", "ar", concurrency=[2], num_prompts=2)
        result = run_module("sglang_benchmark", args)
    finally:
        process.kill()
        process.wait()
    assert not result.get("failed"), result
    document = json.loads((tmp_path / "out" / "c2.json").read_text())
    check_contract(document, "ar", 2)
    rendered = "<|im_user|>hi<|im_end|><|im_assistant|>"
    assert document["provenance"]["prompts"]["distinct_prompts"] == 1
    assert document["requests"][0]["prompt_sha256"] == hashlib.sha256(rendered.encode()).hexdigest()


def test_the_api_key_in_server_info_stays_out_of_the_level_file(tmp_path, prompts_file):
    # SGLang's /server_info holds the key twice: the api_key argument and launch_command.
    key = "sk-bench-7e1d"
    process, url = start([*BASE, "--api-key", key], SGLANG_SIM_STEP_MS=2)
    try:
        auth = {"Authorization": f"Bearer {key}"}
        info = requests.get(url + "/server_info", headers=auth, timeout=10).json()
        assert info["api_key"] == key and key in info["launch_command"]
        args = bench_args(url, prompts_file, tmp_path, "ar", concurrency=[2], api_key=key)
        result = run_module("sglang_benchmark", args)
    finally:
        process.kill()
        process.wait()
    assert not result.get("failed"), result
    text = (tmp_path / "c2.json").read_text()
    assert key not in text
    check_contract(json.loads(text), "ar", 2)
    server_info = json.loads(text)["provenance"]["server_info"]
    assert (
        server_info["api_key"] == "********"
        and "--api-key ********" in server_info["launch_command"]
    )


# -- the contract ----------------------------------------------------------------------


def test_the_schema_is_valid_and_carries_the_writers_version():
    from jsonschema import Draft202012Validator

    schema = json.loads(LEVEL_SCHEMA.read_text())
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["schema_version"]["const"] == SCHEMA_VERSION
    assert SCHEMA_VERSION in SUPPORTED_SCHEMAS  # the analysis reads what the writer writes


@pytest.fixture(scope="module")
def written_level(tmp_path_factory) -> bytes:
    """c2.json as the module writes it against the simulator (AR; the crash test covers
    failed requests, the simulator test speculative ones)."""
    folder = tmp_path_factory.mktemp("written")
    prompts = folder / "gsm8k.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"q {i}"}) + "\n" for i in range(4)))
    process, url = start(BASE, SGLANG_SIM_STEP_MS=2)
    try:
        args = bench_args(url, prompts, folder, "ar", concurrency=[2], num_prompts=4)
        result = run_module("sglang_benchmark", args)
    finally:
        process.kill()
        process.wait()
    assert not result.get("failed"), result
    return (folder / "c2.json").read_bytes()


def rename_requests_ok(document: dict) -> None:
    document["summary"]["ok_requests"] = document["summary"].pop("requests_ok")


# (change, the writer-side helper's line, the analysis' line, whether only --strict reads it)
MUTATIONS = {
    "a field renamed": (
        rename_requests_ok,
        "summary: 'requests_ok' is a required property",
        "summary.requests_ok: expected a count (an integer of 0 or more), missing",
        False,
    ),
    "a type changed": (
        lambda d: d.update(concurrency="2"),
        "concurrency: '2' is not of type 'integer'",
        "concurrency: expected an integer of at least 1, found '2'",
        False,
    ),
    "a field added": (
        lambda d: d["client"].update(gpu_busy=0.5),
        "client: Additional properties are not allowed ('gpu_busy' was unexpected)",
        "client.gpu_busy: not a field of schema_version 1 (docs/schema/level.schema.json); a "
        "writer that adds fields bumps schema_version",
        False,
    ),
    "a request record's type changed": (
        lambda d: d["requests"][1].update(finish_reason=["length"]),
        "requests.1.finish_reason: ['length'] is not of type 'string', 'null'",
        'requests[1].finish_reason: expected a string or null, found ["length"]',
        True,
    ),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_a_mutated_level_fails_the_writers_check_and_the_analysis(
    written_level, tmp_path, mutation
):
    """The writer and the reader hold the same contract: what the module wrote passes both;
    one field renamed, retyped or added, on either side alone, fails both."""
    change, writer_line, reader_line, strict = MUTATIONS[mutation]
    path = tmp_path / "run" / "h1" / "ar" / "gsm8k" / "c2.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(written_level)
    document = json.loads(written_level)
    assert level_problems(document) == []
    assert len(analysis.load(tmp_path / "run", strict=True).levels) == 1
    change(document)
    assert writer_line in level_problems(document)
    path.write_text(json.dumps(document, indent=1) + "\n")
    with pytest.raises(analysis.ResultsError) as caught:
        analysis.load(tmp_path / "run", strict=strict)
    assert f"h1/ar/gsm8k/c2.json: {reader_line}" in caught.value.problems
    if strict:  # by default the analysis reads four fields of each record, not this one
        assert len(analysis.load(tmp_path / "run").levels) == 1


def test_the_command_line_refuses_a_level_that_breaks_the_contract(written_level, tmp_path):
    path = tmp_path / "run" / "h1" / "ar" / "gsm8k" / "c2.json"
    path.parent.mkdir(parents=True)
    document = json.loads(written_level)
    rename_requests_ok(document)
    path.write_text(json.dumps(document, indent=1) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "analysis", "report", str(tmp_path / "run")],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "h1/ar/gsm8k/c2.json: summary.ok_requests: not a field of schema_version 1" in (
        done.stderr
    )
    assert not (tmp_path / "run" / "report").exists()


def dataset_rows() -> bytes:
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(5)]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def test_prompts_are_fetched_pinned_verified_cached_and_rendered(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "chat_template.jinja").write_text(TEMPLATE)
    own = tmp_path / "own.jsonl"
    own.write_text(
        json.dumps({"prompt": "raw text"})
        + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "chat"}]})
        + "\n"
    )
    with LocalHub() as hub:
        repo = hub.add_dataset("org/math", {"data/test.jsonl": dataset_rows()})
        args = {
            "sets": {
                "math": {
                    "repo": "org/math",
                    "revision": "main",
                    "file": "data/test.jsonl",
                    "template": "{question} Answer in \\boxed{}.",
                }
            },
            "files": {"own": str(own)},
            "output_dir": str(tmp_path / "prompts"),
            "cache_dir": str(tmp_path / "cache"),
            "model_dir": str(model),
            "limit": 3,
            "hf_endpoint": hub.url,
        }
        first = run_module("benchmark_prompts", args)
        assert not first.get("failed"), first
        assert first["changed"]
        math = first["sets"]["math"]
        assert math["source"]["resolved"] == repo.sha and math["prompts"] == 3 and math["rows"] == 5
        lines = [json.loads(x) for x in (tmp_path / "prompts/math.jsonl").read_text().splitlines()]
        assert lines[0] == {
            "id": "math-0",
            "prompt": "<|im_user|>What is 0 + 0? Answer in \\boxed{}.<|im_end|><|im_assistant|>",
        }
        own_lines = (tmp_path / "prompts/own.jsonl").read_text().splitlines()
        assert [json.loads(x)["prompt"] for x in own_lines] == [
            "raw text",
            "<|im_user|>chat<|im_end|><|im_assistant|>",
        ]
        # Pinned to the commit: the next run reads the cache and asks the hub nothing.
        before = len(hub.requests)
        pinned = {**args, "sets": {"math": {**args["sets"]["math"], "revision": repo.sha}}}
        second = run_module("benchmark_prompts", pinned)
        assert_unchanged(second)
        assert len(hub.requests) == before
        # A file that is not what the hub says it is never lands in the cache.
        hub.datasets["org/math"].files["data/test.jsonl"].data = b"tampered\n"
        fresh = {**args, "cache_dir": str(tmp_path / "cache2")}
        refused = run_module("benchmark_prompts", fresh)
        assert refused["failed"] and "is not the hub's" in refused["msg"]
        assert not list((tmp_path / "cache2").rglob("test.jsonl"))


def math_set_args(tmp_path: Path, model: Path, hub_url: str) -> dict:
    """benchmark_prompts' arguments for the local hub's org/math set, unpinned."""
    return {
        "sets": {
            "math": {
                "repo": "org/math",
                "revision": "main",
                "file": "data/test.jsonl",
                "template": "{question}",
            }
        },
        "output_dir": str(tmp_path / "p"),
        "cache_dir": str(tmp_path / "c"),
        "model_dir": str(model),
        "hf_endpoint": hub_url,
    }


def test_prompts_need_a_chat_template_and_a_known_revision(tmp_path):
    empty = tmp_path / "model"
    empty.mkdir()
    with LocalHub() as hub:
        hub.add_dataset("org/math", {"data/test.jsonl": dataset_rows()})
        args = math_set_args(tmp_path, empty, hub.url)
        missing = run_module("benchmark_prompts", args)
        assert missing["failed"] and "no chat template in" in missing["msg"]
        (empty / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
        args["sets"]["math"]["revision"] = "v9"
        unknown = run_module("benchmark_prompts", args)
        assert unknown["failed"] and "RevisionNotFound" in unknown["msg"]
        args["sets"]["math"].update(revision="main", template="{nope}")
        wrong = run_module("benchmark_prompts", args)
        assert wrong["failed"] and "check its template" in wrong["msg"]


def level_file(folder: Path, config: str, level: int, outputs: list[list[int]], temp=0.0):
    path = folder / config / "gsm8k" / f"c{level}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    requests = [
        {"index": i, "ok": True, "prompt_sha256": f"p{i}", "output_ids": ids}
        for i, ids in enumerate(outputs)
    ]
    path.write_text(json.dumps({"settings": {"temperature": temp}, "requests": requests}))


def test_lossless_check_flags_configs_that_change_outputs(tmp_path):
    truth = [list(range(20)) for _ in range(4)]
    level_file(tmp_path, "ar", 1, truth)
    level_file(tmp_path, "dflash", 1, truth)
    level_file(tmp_path, "eagle3", 1, [[0, 99, *range(2, 20)]] * 4)  # diverges at token 1
    level_file(tmp_path, "ddtree-b32", 1, truth, temp=0.7)
    level_file(tmp_path, "ddtree-b32", 8, truth)
    output = tmp_path / "lossless.json"
    result = run_module("benchmark_lossless", {"results_dir": str(tmp_path), "output": str(output)})
    assert result["flagged"] == ["eagle3"]
    assert result["configs"]["dflash"]["mismatch_rate"] == 0
    assert result["configs"]["eagle3"]["mismatch_rate"] == pytest.approx(19 / 20)
    report = json.loads(output.read_text())
    skipped = report["configs"]["ddtree-b32"]["not_checked"]
    assert {s["reason"] for s in skipped} == {
        "temperature [0.0, 0.7], not 0",
        "no ar level to compare with",
    }
    again = run_module("benchmark_lossless", {"results_dir": str(tmp_path), "output": str(output)})
    assert_unchanged(again)


def test_lossless_checks_each_tp_size_against_the_reference_at_that_size(tmp_path):
    """Over TP sizes there is no plain `ar`: dflash-tp4 is held to ar-tp4's greedy outputs
    (numerics differ between TP sizes), and the references themselves are not checked."""
    at_tp1 = [list(range(20)) for _ in range(4)]
    at_tp4 = [[*range(10), *range(50, 60)] for _ in range(4)]
    level_file(tmp_path, "ar-tp1", 1, at_tp1)
    level_file(tmp_path, "ar-tp4", 1, at_tp4)
    level_file(tmp_path, "dflash-tp1", 1, at_tp1)
    level_file(tmp_path, "dflash-tp4", 1, at_tp4)
    level_file(tmp_path, "ddtree-tp4-b32", 1, at_tp1)  # TP1's outputs at TP4: flagged
    level_file(tmp_path, "ddtree-tp8-b32", 1, at_tp1)  # no ar-tp8
    output = tmp_path / "lossless.json"
    result = run_module("benchmark_lossless", {"results_dir": str(tmp_path), "output": str(output)})
    assert set(result["configs"]) == {
        "dflash-tp1",
        "dflash-tp4",
        "ddtree-tp4-b32",
        "ddtree-tp8-b32",
    }
    assert result["flagged"] == ["ddtree-tp4-b32"]
    assert result["configs"]["dflash-tp4"]["mismatch_rate"] == 0
    report = json.loads(output.read_text())
    assert report["references"] == {
        "dflash-tp1": "ar-tp1",
        "dflash-tp4": "ar-tp4",
        "ddtree-tp4-b32": "ar-tp4",
    }
    assert report["configs"]["ddtree-tp8-b32"]["not_checked"] == [
        {"prompt_set": "gsm8k", "concurrency": 1, "reason": "no ar level to compare with"}
    ]


def test_lossless_threshold_passes_realistic_drift_and_flags_broken_verification(tmp_path):
    """Against the simulator: greedy outputs that leave plain decoding's for a few requests,
    from some token on (as non-bitwise-identical kernels do), pass; gross loss is flagged."""
    prompts = tmp_path / "gsm8k.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(40)))
    runs = {
        "ar": (BASE, {}),
        "dflash": ([*BASE, *DFLASH], {"SGLANG_SIM_DRIFT": 0.1}),
        "dflash-broken": ([*BASE, *DFLASH], {"SGLANG_SIM_LOSSY": 0.05}),
    }
    for config, (argv, env) in runs.items():
        process, url = start(argv, SGLANG_SIM_STEP_MS=2, SGLANG_SIM_PREFILL_MS=4, **env)
        try:
            out = tmp_path / "host" / config / "gsm8k"
            args = bench_args(url, prompts, out, config, num_prompts=40, max_new_tokens=32)
            result = run_module("sglang_benchmark", {**args, "concurrency": [8]})
        finally:
            process.kill()
            process.wait()
        assert not result.get("failed"), result
    output = tmp_path / "lossless.json"
    report = run_module(
        "benchmark_lossless", {"results_dir": str(tmp_path / "host"), "output": str(output)}
    )
    drift, broken = report["configs"]["dflash"], report["configs"]["dflash-broken"]
    assert report["flagged"] == ["dflash-broken"]
    assert 0 < drift["mismatch_rate"] < 0.1 and 1 <= drift["requests_mismatched"] <= 10
    assert broken["mismatch_rate"] > 0.3


def test_the_hub_prompt_sets_are_pinned_but_mt_bench_which_the_study_lock_pins():
    import yaml

    root = Path(__file__).resolve().parents[2]
    # group_vars/all/benchmark.yml, where the study lock's play reads them too.
    shared = yaml.safe_load((root / "group_vars/all/benchmark.yml").read_text())
    defaults = yaml.safe_load((root / "roles/benchmark/defaults/main.yml").read_text())
    assert defaults["benchmark_prompt_sets"] == "{{ kimi_prompt_sets }}"
    assert defaults["benchmark_prompt_set_definitions"] == "{{ kimi_prompt_set_definitions }}"
    definitions = shared["kimi_prompt_set_definitions"]
    # Every set is run by default but the optional long-prompt one (TTFT at length).
    assert set(shared["kimi_prompt_sets"]) == set(definitions) - {"long-32k"}
    for name, spec in definitions.items():
        assert {"repo", "revision", "file", "template"} <= set(spec), name
        assert len(spec["revision"]) == 40 or name == "mt-bench", name
    assert os.path.basename(definitions["gsm8k"]["file"]).endswith(".parquet")


def test_the_client_says_when_it_was_the_limit():
    def level(cpu_s: float, lag_ms: float, step_s: float = 0.02) -> dict:
        tracker = Tracker(0, 100)
        tracker.events = [(i * step_s, 3 * (i + 1)) for i in range(10)]
        return {
            "trackers": [tracker],
            "started": 0.0,
            "ended": 1.0,
            "wall_s": 1.0,
            "cpu_s": cpu_s,
            "lag_ms": [lag_ms] * 100,
        }

    calm = client_report(level(0.1, 0.3), 10)
    assert not calm["saturated"] and calm["timing_reliable"] and calm["event_gap_ms"] == 20
    busy = client_report(level(0.9, 0.3), 10)
    assert busy["saturated"] and "client CPU 90%" in busy["saturated_reasons"][0]
    behind = client_report(level(0.4, 6.0), 10)
    assert behind["saturated"] and not behind["timing_reliable"]
    # Late but idle: other processes hold the CPU; the client did not limit the server.
    crowded = client_report(level(0.05, 6.0), 10)
    assert not crowded["saturated"] and not crowded["timing_reliable"]
    assert "other processes" in crowded["warnings"][0]


def test_prompt_sets_ride_out_a_busy_hub_within_the_deadline(tmp_path):
    """429 and 5xx from the hub are retried with backoff (Retry-After when it fits the
    deadline); a hub still busy at the deadline, or asking to wait past it, fails naming it."""
    from tests.support.hub_server import Busy

    model = tmp_path / "model"
    model.mkdir()
    (model / "chat_template.jinja").write_text(TEMPLATE)
    with LocalHub() as hub:
        repo = hub.add_dataset("org/math", {"data/test.jsonl": dataset_rows()})
        args = {**math_set_args(tmp_path, model, hub.url), "timeout": 20}
        hub.busy += [
            Busy("/api/datasets/org/math/revision/", 429, times=1, retry_after="1"),
            Busy("/datasets/org/math/resolve/", 503, times=2),
        ]
        done = run_module("benchmark_prompts", args)
        assert not done.get("failed"), done
        assert done["sets"]["math"]["source"]["resolved"] == repo.sha
        hub.busy.append(Busy("/api/datasets/org/math/revision/", 429, times=1, retry_after="3600"))
        started = time.monotonic()
        refused = run_module("benchmark_prompts", {**args, "cache_dir": str(tmp_path / "c2")})
        assert time.monotonic() - started < 5
        assert refused["failed"] and "429" in refused["msg"] and hub.url in refused["msg"]
        assert "Retry-After 3600" in refused["msg"]


# -- scored prompt sets ------------------------------------------------------------------


def scored_rows(count: int) -> list[dict]:
    """GSM8K-shaped rows: a question, and a worked solution ending in "#### <number>"."""
    return [
        {
            "question": f"Sam has {i} apples and buys {i + 3}. How many?",
            "answer": f"{i} + {i + 3} = <<{i}+{i + 3}={2 * i + 3}>>{2 * i + 3}\n#### {2 * i + 3}",
        }
        for i in range(count)
    ]


def test_scored_sets_carry_references_and_render_with_the_scored_switch(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    # A template that shows the thinking switch it was rendered with.
    (model / "chat_template.jinja").write_text(
        TEMPLATE + "{% if thinking is defined and not thinking %}<think></think>{% endif %}"
    )
    rows = [*scored_rows(3), {"question": "Big one?", "answer": "1000 + 234\n#### 1,234"}]
    own = tmp_path / "own.jsonl"
    own.write_text(
        json.dumps({"prompt": "p0", "answer": 7})
        + "\n"
        + json.dumps({"prompt": "p1", "answer": "x"})
        + "\n"
    )
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    with LocalHub() as hub:
        hub.add_dataset("org/gsm", {"test.jsonl": data})
        spec = {"repo": "org/gsm", "revision": "main", "file": "test.jsonl"}
        args = {
            "sets": {
                "gsm8k": {
                    **spec,
                    "template": "{question}",
                    "answer": "{answer}",
                    "scoring": "gsm8k",
                    "max_new_tokens": 1024,
                },
                "plain": {**spec, "template": "{question}"},
            },
            "files": {"own": str(own), "unscored": str(own)},
            "file_scoring": {"own": "math"},
            "output_dir": str(tmp_path / "prompts"),
            "cache_dir": str(tmp_path / "cache"),
            "model_dir": str(model),
            "chat_template_kwargs": {"extra": 1},
            "scored_chat_template_kwargs": {"thinking": False},
            "hf_endpoint": hub.url,
        }
        result = run_module("benchmark_prompts", args)
        assert not result.get("failed"), result

        def lines(name):
            text = (tmp_path / "prompts" / f"{name}.jsonl").read_text()
            return [json.loads(line) for line in text.splitlines()]

        def meta(name):
            return json.loads((tmp_path / "prompts" / f"{name}.meta.json").read_text())

        scored = lines("gsm8k")
        assert [row["answer"] for row in scored] == ["3", "5", "7", "1,234"]
        assert scored[0]["prompt"] == (
            "<|im_user|>Sam has 0 apples and buys 3. How many?<|im_end|><|im_assistant|>"
            "<think></think>"
        )
        assert meta("gsm8k")["scoring"] == "gsm8k" == result["sets"]["gsm8k"]["scoring"]
        assert meta("gsm8k")["chat_template"]["kwargs"] == {"extra": 1, "thinking": False}
        # An unscored set keeps its rows, template variables and no scorer.
        assert all("answer" not in row for row in lines("plain"))
        assert not lines("plain")[0]["prompt"].endswith("<think></think>")
        assert meta("plain")["scoring"] is None
        assert meta("plain")["chat_template"]["kwargs"] == {"extra": 1}
        assert [(row["prompt"], row["answer"]) for row in lines("own")] == [
            ("p0", "7"),
            ("p1", "x"),
        ]
        assert meta("own")["scoring"] == "math" and meta("unscored")["scoring"] is None
        assert all("answer" not in row for row in lines("unscored"))

        # The scorer changes and the prompts do not: the meta follows, nothing else changed.
        rescored = run_module("benchmark_prompts", {**args, "file_scoring": {"own": "gsm8k"}})
        assert not rescored["changed"] and meta("own")["scoring"] == "gsm8k"

        # A scored row without a usable reference, an unknown scorer, a scorer for no file.
        own.write_text(json.dumps({"prompt": "p0"}) + "\n")
        missing = run_module("benchmark_prompts", args)
        assert (
            missing["failed"] and "row 0: cannot build the prompt or its answer" in (missing["msg"])
        )
        own.write_text(json.dumps({"prompt": "p0", "answer": "9" * 1025}) + "\n")
        too_long = run_module("benchmark_prompts", args)
        assert too_long["failed"] and "1025 characters" in too_long["msg"]
        bad = {**args, "sets": {"gsm8k": {**args["sets"]["gsm8k"], "scoring": "mmlu"}}}
        unknown = run_module("benchmark_prompts", bad)
        assert unknown["failed"] and "scoring 'mmlu' is none of gsm8k, math" in unknown["msg"]
        stray = run_module("benchmark_prompts", {**args, "file_scoring": {"nope": "gsm8k"}})
        assert stray["failed"] and "file_scoring names no prompt file: nope" in stray["msg"]


def test_scored_levels_record_each_answer_and_the_levels_accuracy(tmp_path):
    """The simulator answers a known question right when its draw is below the rate; the
    level file must say which requests were right, wrong or cut off."""
    from tests.support.sglang_sim import draw

    count = 12
    questions = [f"Question {i}: what is {i} times 7?" for i in range(count)]
    answers = tmp_path / "answers.jsonl"
    answers.write_text(
        "".join(
            json.dumps({"question": q, "answer": str(7 * i)}) + "\n"
            for i, q in enumerate(questions)
        )
    )
    prompts = tmp_path / "gsm8k.jsonl"
    prompts.write_text(
        "".join(
            json.dumps(
                {"id": f"gsm8k-{i}", "prompt": f"<|im_user|>{q}<|im_end|>", "answer": str(7 * i)}
            )
            + "\n"
            for i, q in enumerate(questions)
        )
    )
    # The scorer comes from the meta benchmark_prompts writes beside the prompts.
    (tmp_path / "gsm8k.meta.json").write_text(json.dumps({"scoring": "gsm8k"}))
    right = [draw("answer", q) < 0.5 for q in questions]
    assert 0 < sum(right) < count  # both outcomes are exercised
    process, url = start(
        BASE, SGLANG_SIM_STEP_MS=2, SGLANG_SIM_ANSWERS=answers, SGLANG_SIM_ACCURACY=0.5
    )
    try:
        roomy = bench_args(
            url,
            prompts,
            tmp_path / "roomy",
            "ar",
            concurrency=[4],
            num_prompts=count,
            max_new_tokens=64,
        )
        result = run_module("sglang_benchmark", roomy)
        assert not result.get("failed"), result
        # Three tokens cannot hold the working and the answer: every request is cut off.
        tight = bench_args(
            url,
            prompts,
            tmp_path / "tight",
            "ar",
            concurrency=[4],
            num_prompts=count,
            max_new_tokens=3,
        )
        cut = run_module("sglang_benchmark", tight)
        assert not cut.get("failed"), cut
        # scoring "" turns the meta's scorer off.
        plain = bench_args(
            url, prompts, tmp_path / "plain", "ar", concurrency=[1], num_prompts=2, scoring=""
        )
        unscored = run_module("sglang_benchmark", plain)
        assert not unscored.get("failed"), unscored
    finally:
        process.kill()
        process.wait()
    document = json.loads((tmp_path / "roomy" / "c4.json").read_text())
    check_contract(document, "ar", 4)
    expected = "".join("c" if r else "w" for r in right)
    assert document["summary"]["accuracy"] == {
        "scorer": "gsm8k",
        "n": count,
        "correct": sum(right),
        "wrong": count - sum(right),
        "unanswered": 0,
        "accuracy": sum(right) / count,
        "outcomes": expected,
    }
    for i, record in enumerate(document["requests"]):
        assert record["finish_reason"] == "stop"
        wanted = str(7 * i) if right[i] else str(7 * i + 1)
        assert record["score"] == {
            "outcome": "correct" if right[i] else "wrong",
            "extracted": wanted,
            "expected": str(7 * i),
        }
    tight_doc = json.loads((tmp_path / "tight" / "c4.json").read_text())
    check_contract(tight_doc, "ar", 4)
    assert tight_doc["summary"]["accuracy"]["outcomes"] == "u" * count
    assert {r["finish_reason"] for r in tight_doc["requests"]} == {"length"}
    plain_doc = json.loads((tmp_path / "plain" / "c1.json").read_text())
    assert "accuracy" not in plain_doc["summary"]
    assert all("score" not in r for r in plain_doc["requests"])


def test_a_scored_level_refuses_prompts_without_references(tmp_path, prompts_file):
    process, url = start(BASE, SGLANG_SIM_STEP_MS=2)
    try:
        args = bench_args(url, prompts_file, tmp_path / "out", "ar", scoring="math")
        refused = run_module("sglang_benchmark", args)
    finally:
        process.kill()
        process.wait()
    assert refused["failed"]
    assert 'line 1: scored with math, it needs "answer"' in refused["msg"]
    assert not (tmp_path / "out" / "c1.json").exists()


def test_role_defaults_score_gsm8k_and_math500_with_their_own_budgets():
    import yaml

    root = Path(__file__).resolve().parents[2]
    defaults = yaml.safe_load((root / "roles/benchmark/defaults/main.yml").read_text())
    shared = yaml.safe_load((root / "group_vars/all/benchmark.yml").read_text())
    definitions = shared["kimi_prompt_set_definitions"]
    scored = {name: spec for name, spec in definitions.items() if spec.get("scoring")}
    assert {n: (s["scoring"], s["answer"], s["max_new_tokens"]) for n, s in scored.items()} == {
        "gsm8k": ("gsm8k", "{answer}", 1024),
        "math500": ("math", "{answer}", 2048),
    }
    assert defaults["benchmark_prompt_file_scoring"] == {}
    assert (
        "kimi_model_data.accuracy.chat_template_kwargs"
        in (defaults["benchmark_scored_chat_template_kwargs"])
    )


# -- levels: fill, repeats, request rates, workloads, telemetry ----------------------------


def level_doc(folder: Path, stem: str) -> dict:
    return json.loads((folder / f"{stem}.json").read_text())


def test_a_level_sends_each_distinct_prompt_once_in_file_order(tmp_path):
    """Never a prompt twice (it would come from the radix cache): a repeated row is skipped,
    a level sends the first distinct rows up to what it wants, and a set smaller than that
    is sent whole and marked under-filled."""
    prompts = tmp_path / "own.jsonl"
    texts = ["q0", "q1", "q0", "q2", "q3"]  # row 2 repeats row 0
    prompts.write_text(
        "".join(json.dumps({"id": i, "prompt": t}) + "\n" for i, t in enumerate(texts))
    )
    result = bench_on_simulator(
        BASE,
        {"SGLANG_SIM_STEP_MS": 2},
        prompts,
        tmp_path / "out",
        "ar",
        concurrency=[2, 4, 8],
        num_prompts=3,
        requests_per_concurrency=1,
    )
    assert not result.get("failed"), result
    assert list(result["summaries"]) == ["c2", "c4", "c8"]
    expected = {  # level: (wanted, the row ids sent)
        2: (3, [0, 1, 3]),
        4: (4, [0, 1, 3, 4]),
        8: (8, [0, 1, 3, 4]),
    }
    for level, (wanted, ids) in expected.items():
        document = level_doc(tmp_path / "out", f"c{level}")
        check_contract(document, "ar", level)
        assert [r["prompt_id"] for r in document["requests"]] == ids
        assert len({r["prompt_sha256"] for r in document["requests"]}) == len(ids)
        assert document["fill"] == {
            "wanted": wanted,
            "unique_prompts": 4,
            "sent": len(ids),
            "under_filled": wanted > 4,
            "stopped_by_time_budget": False,
            "time_budget_s": 1200,
        }
        assert document["provenance"]["prompts"]["requests_per_level"] == len(ids)
        assert document["provenance"]["prompts"]["distinct_prompts"] == len(ids)
        # Every request was measured from a flushed cache: nothing of a prompt was cached.
        assert all(r["cached_tokens"] == 0 for r in document["requests"])


def test_repeats_write_a_file_per_run_each_from_a_flushed_cache(tmp_path, prompts_file):
    result = bench_on_simulator(
        BASE,
        {"SGLANG_SIM_STEP_MS": 2},
        prompts_file,
        tmp_path,
        "ar",
        concurrency=[1, 2],
        num_prompts=3,
        requests_per_concurrency=1,
        repeats=3,
    )
    assert not result.get("failed"), result
    stems = ["c1", "c1.rep2", "c1.rep3", "c2", "c2.rep2", "c2.rep3"]
    assert [Path(f).name for f in result["files"]] == [f"{s}.json" for s in stems]
    assert list(result["summaries"]) == stems
    for stem in stems:
        document = level_doc(tmp_path, stem)
        level = int(stem.split(".")[0][1:])
        check_contract(document, "ar", level)
        repeat = int(stem.split(".rep")[1]) if ".rep" in stem else 1
        assert (document["repeat"], document["repeats"]) == (repeat, 3)
        assert document["server"]["cache"] == "flushed"
        assert document["summary"]["requests_ok"] == 3
        # The same prompts in the same order in every repeat: the analysis pairs them.
        assert [r["prompt_id"] for r in document["requests"]] == [0, 1, 2]
        assert all(r["cached_tokens"] == 0 for r in document["requests"])


def test_rate_levels_follow_the_closed_loop_ones_with_poisson_arrivals(tmp_path, prompts_file):
    result = bench_on_simulator(
        BASE,
        {"SGLANG_SIM_STEP_MS": 2},
        prompts_file,
        tmp_path,
        "ar",
        concurrency=[2],
        num_prompts=1,
        requests_per_concurrency=1,
        request_rates=[2.5, 40],
        rate_duration_s=0.8,
        max_concurrency=3,
    )
    assert not result.get("failed"), result
    assert [Path(f).name for f in result["files"]] == ["c2.json", "r2.5.json", "r40.json"]
    assert list(result["summaries"]) == ["c2", "r2.5", "r40"]
    closed = level_doc(tmp_path, "c2")
    assert (closed["arrival"], closed["request_rate"], closed["concurrency"]) == ("closed", None, 2)
    # 2.5/s for 0.8 s wants 2 requests; 40/s wants 32, more than the file's 6 prompts.
    for stem, rate, wanted, sent in (("r2.5", 2.5, 2, 2), ("r40", 40.0, 32, 6)):
        document = level_doc(tmp_path, stem)
        check_contract(document, "ar", 3)  # concurrency: the cap on requests in flight
        assert document["arrival"] == "poisson" and document["request_rate"] == rate
        assert document["fill"]["wanted"] == wanted and document["fill"]["sent"] == sent
        assert document["fill"]["under_filled"] is (wanted > 6)
        assert document["summary"]["requests_ok"] == sent
        # Each request's start against its Poisson schedule.
        assert document["client"]["arrival_lag_ms"]["count"] == sent
        assert document["settings"]["max_concurrency"] == 3
        assert document["settings"]["rate_duration_s"] == 0.8


def test_rate_levels_without_a_cap_record_their_request_count_as_concurrency(
    tmp_path, prompts_file
):
    result = bench_on_simulator(
        BASE,
        {"SGLANG_SIM_STEP_MS": 2},
        prompts_file,
        tmp_path,
        "ar",
        concurrency=[1],
        num_prompts=1,
        requests_per_concurrency=1,
        request_rates=[50],
        rate_duration_s=0.1,
    )
    assert not result.get("failed"), result
    document = level_doc(tmp_path, "r50")
    check_contract(document, "ar", 5)
    assert document["fill"]["sent"] == 5


def workload_files(folder: Path, name: str, rows: list[list[int]]) -> Path:
    """A workload's prompts file and .meta.json, shaped as benchmark_prompts writes them."""
    isl, osl = (int(part[3:]) for part in name.split("-"))
    prompts = folder / f"{name}.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": k, "input_ids": ids}) + "\n" for k, ids in enumerate(rows))
    )
    workload = {
        "name": name,
        "isl": isl,
        "osl": osl,
        "ignore_eos": True,
        "tokenizer": {"file": "tiktoken.model", "sha256": "ab" * 32, "revision": "c" * 40},
        "seed": 1234,
    }
    (folder / f"{name}.meta.json").write_text(
        json.dumps({"workload": workload, "sha256": "0" * 64})
    )
    return prompts


def test_a_workload_sends_token_ids_and_decodes_exactly_its_output_length(tmp_path):
    """Every prompt is a known question to the simulator, whose scripted answer ends (EOS)
    well before 64 tokens: only ignore_eos makes every request decode exactly the osl."""
    rows = [[1000 + 10 * k + i for i in range(8)] for k in range(6)]
    answers = tmp_path / "answers.jsonl"
    answers.write_text(
        "".join(
            json.dumps({"question": " ".join(map(str, ids)), "answer": "7"}) + "\n" for ids in rows
        )
    )
    prompts = workload_files(tmp_path, "isl8-osl64", rows)
    plain = tmp_path / "plain"
    plain.mkdir()
    plain_prompts = plain / "isl8-osl64.jsonl"
    plain_prompts.write_text(prompts.read_text())  # the same rows without the workload's meta
    process, url = start(BASE, SGLANG_SIM_STEP_MS=1, SGLANG_SIM_ANSWERS=answers)
    try:
        args = bench_args(
            url,
            prompts,
            tmp_path / "out",
            "ar",
            concurrency=[3],
            num_prompts=6,
            max_new_tokens=5,
            requests_per_concurrency=1,
        )
        result = run_module("sglang_benchmark", args)
        control = run_module(
            "sglang_benchmark",
            bench_args(
                url,
                plain_prompts,
                plain / "out",
                "ar",
                concurrency=[3],
                num_prompts=6,
                max_new_tokens=64,
                requests_per_concurrency=1,
            ),
        )
    finally:
        process.kill()
        process.wait()
    assert not result.get("failed"), result
    assert not control.get("failed"), control
    document = level_doc(tmp_path / "out", "c3")
    check_contract(document, "ar", 3)
    assert document["workload"]["name"] == "isl8-osl64" and document["workload"]["osl"] == 64
    assert document["settings"]["max_new_tokens"] == 64  # the osl, not the module's 5
    assert len(document["requests"]) == 6
    for record, ids in zip(document["requests"], rows, strict=True):
        assert record["ok"] and record["output_tokens"] == 64
        assert record["prompt_tokens"] == 8 and record["finish_reason"] == "length"
        assert (
            record["prompt_sha256"]
            == hashlib.sha256(json.dumps(ids, separators=(",", ":")).encode()).hexdigest()
        )
    # Without the workload (no ignore_eos) the same prompts end at their answer.
    stopped = level_doc(plain / "out", "c3")
    assert "workload" not in stopped
    assert all(r["ok"] and r["output_tokens"] < 64 for r in stopped["requests"])
    assert {r["finish_reason"] for r in stopped["requests"]} == {"stop"}


FAKE_SMI = """#!{python}
import sys, time, datetime
# A probe of the reasons field answers once; -lms N prints a poll of two GPUs every N ms.
if "-lms" not in sys.argv:
    print("0x0000000000000000")
    sys.exit(0)
interval = int(sys.argv[sys.argv.index("-lms") + 1]) / 1000.0
row = "NVIDIA H200, 690.5, 700.00, 1500, 1980, 2619, 70, 98, 80000, 0x0000000000000004"
end = time.time() + 60
while time.time() < end:
    now = datetime.datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
    for index in (0, 1):
        print(f"{{now}}, {{index}}, {{row}}")
    sys.stdout.flush()
    time.sleep(interval)
"""


def test_telemetry_summarises_the_gpus_during_each_level(tmp_path, prompts_file, monkeypatch):
    tools = tmp_path / "bin"
    tools.mkdir()
    smi = tools / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    # Long enough for several polls at 20 ms: 6 requests of 24 tokens at 10 ms a step.
    result = bench_on_simulator(
        BASE,
        {"SGLANG_SIM_STEP_MS": 10},
        prompts_file,
        tmp_path / "out",
        "ar",
        concurrency=[2],
        num_prompts=6,
        requests_per_concurrency=1,
        telemetry="nvidia-smi",
        telemetry_interval_ms=20,
    )
    assert not result.get("failed"), result
    document = level_doc(tmp_path / "out", "c2")
    check_contract(document, "ar", 2)
    gpu = document["summary"]["gpu"]
    assert gpu["source"] == "nvidia-smi" and gpu["interval_ms"] == 20
    assert [g["index"] for g in gpu["gpus"]] == [0, 1] and gpu["samples"] >= 2
    assert gpu["power_w_mean"] == pytest.approx(2 * 690.5)
    assert gpu["gpus"][0]["throttle"]["power_cap"] == 1.0
    assert result["summaries"]["c2"]["gpu"] == gpu
    assert not any("telemetry" in w for w in document["client"]["warnings"])
    # The reader takes the telemetry summary as the writer wrote it.
    run = tmp_path / "run" / "h1" / "ar" / "gsm8k"
    run.mkdir(parents=True)
    (run / "c2.json").write_text((tmp_path / "out" / "c2.json").read_text())
    assert len(analysis.load(tmp_path / "run", strict=True).levels) == 1
    # The sampler is gone once the level is.
    from tests.support.modules import marked_processes

    assert marked_processes(str(smi)) == []


def test_without_nvidia_smi_auto_telemetry_says_why_and_the_level_runs(
    tmp_path, prompts_file, monkeypatch
):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    process, url = start(BASE, SGLANG_SIM_STEP_MS=2)
    try:
        auto = run_module(
            "sglang_benchmark",
            bench_args(url, prompts_file, tmp_path / "auto", "ar", concurrency=[1]),
        )
        off = run_module(
            "sglang_benchmark",
            bench_args(url, prompts_file, tmp_path / "off", "ar", concurrency=[1], telemetry="off"),
        )
        required = run_module(
            "sglang_benchmark",
            bench_args(
                url,
                prompts_file,
                tmp_path / "required",
                "ar",
                concurrency=[1],
                telemetry="nvidia-smi",
            ),
        )
    finally:
        process.kill()
        process.wait()
    assert not auto.get("failed") and not off.get("failed"), (auto, off)
    document = level_doc(tmp_path / "auto", "c1")
    check_contract(document, "ar", 1)
    assert "gpu" not in document["summary"]
    assert "no GPU telemetry: nvidia-smi not found on PATH" in document["client"]["warnings"]
    quiet = level_doc(tmp_path / "off", "c1")
    assert "gpu" not in quiet["summary"]
    assert not any("telemetry" in w for w in quiet["client"]["warnings"])
    assert required["failed"] and "nvidia-smi is not on this host's PATH" in required["msg"]
    assert not (tmp_path / "required").exists()


def test_the_analysis_reads_every_kind_of_level_the_module_writes(tmp_path):
    """Workload, closed loop and request rate, each repeated: the reader's contract (the
    schema, tightened) accepts what the writer writes, file names included."""
    rows = [[1000 + 10 * k + i for i in range(8)] for k in range(6)]
    prompts = workload_files(tmp_path, "isl8-osl16", rows)
    out = tmp_path / "run" / "h1" / "ar" / "isl8-osl16"
    result = bench_on_simulator(
        BASE,
        {"SGLANG_SIM_STEP_MS": 1},
        prompts,
        out,
        "ar",
        concurrency=[1, 2],
        request_rates=[20, 2.5],
        rate_duration_s=0.4,
        repeats=2,
        num_prompts=1,
        requests_per_concurrency=2,
    )
    assert not result.get("failed"), result
    stems = ["c1", "c1.rep2", "c2", "c2.rep2", "r20", "r20.rep2", "r2.5", "r2.5.rep2"]
    assert list(result["summaries"]) == stems
    for stem in stems:
        assert level_problems(level_doc(out, stem)) == []
    levels = analysis.load(tmp_path / "run", strict=True).levels
    assert sorted(level.path for level in levels) == sorted(
        f"h1/ar/isl8-osl16/{stem}.json" for stem in stems
    )
