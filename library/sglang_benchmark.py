#!/usr/bin/python
"""Ansible module sglang_benchmark: a speculative-decoding-aware load test of an SGLang server."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_benchmark
short_description: Benchmark an SGLang server at several concurrency levels, per token and per step
description:
  - Runs on the GPU host next to the server. Sends the prompts of O(prompts) to SGLang's native
    streaming C(POST /generate) with a closed loop of O(concurrency) requests in flight, one
    level after the other, and writes one C(c<N>.json) per level into O(output_dir).
  - Before each level it calls C(/flush_cache) (so no level starts with the previous one's
    prefix cache) and reads C(/server_info) and C(/metrics) before and after it, keeping only
    differences (SGLang's averages there are cumulative since the server started). SGLang
    flushes only an idle server and answers 400 otherwise; the module asks it to wait for idle
    (C(?timeout=)) and retries within a minute, and records C(not flushed (...)) in the level's
    C(server.cache) when it never was.
  - A restart during a level shows as another C(startup_time) record in C(/server_info) (the
    durations SGLang measured while starting, new with every start) or a C(/metrics) counter
    that went down.
  - Per request it measures TTFT, E2E latency, the inter-token latency of every token (the
    gap between two streamed events divided by the tokens the later one carries; with
    speculative decoding one event carries several), TPOT, the output tokens as the server
    counts them (C(meta_info.completion_tokens)), the verify steps (C(meta_info.spec_verify_ct),
    on SGLang's last event only), the accept length C(accept_length) = (output tokens - 1) /
    verify steps (the first token comes from prefill, not from a verify step), SGLang's own
    C(spec_accept_length) = output tokens / verify steps beside it, and the output text and
    token ids (for the losslessness check).
  - Per level it reports output tokens/s, requests/s, mean and p50/p90/p99 of TTFT, ITL, TPOT
    and E2E, the token-weighted mean accept length (and SGLang's, C(spec_accept_length_mean)),
    the step time (ms per forward step) and the accepted tokens per step (their quotient is a
    request's decode speed), and failures.
  - The client measures itself - CPU use, event-loop lag - and marks a level C(saturated) when
    the client rather than the server may have been the limit (busy nearly all the time, or
    busy and behind - its event-loop lag p99 a quarter or more of the time between a
    request's events), and C(timing_reliable) false when its event loop ran late (p99 lag of
    2 ms or more) for whatever reason, other processes on the host included.
  - Standard library only (asyncio with raw sockets); it needs no package on the host.
    Rows of O(prompts) given as chat C(messages) are rendered with the chat template of the
    model the server reports, which needs jinja2 on the host; the benchmark role renders them
    beforehand, so its prompt files hold plain C(prompt) text.
  - Fails, after writing the level's file, when the server drops connections or restarts
    during a level (a crash), when every request of a level fails, and when the server does
    not answer at the start.
version_added: "0.1.0"
options:
  base_url:
    description: The server as seen from the host, for example C(http://127.0.0.1:30000).
    type: str
    required: true
  concurrency:
    description: Concurrency levels (requests in flight), run in the given order.
    type: list
    elements: int
    required: true
  prompts:
    description:
      - A JSONL file on the host, one JSON object a line with C(prompt) (text sent as is) or
        C(messages) (a chat, rendered through the model's chat template), and optionally C(id).
      - Every level sends the same prompts in the same order (cycled when the file has fewer
        than O(num_prompts)), so runs of different serving configs compare request by request.
    type: path
    required: true
  num_prompts:
    description: Requests per concurrency level.
    type: int
    default: 64
  max_new_tokens:
    description: Most tokens generated per request (EOS still ends a request early).
    type: int
    default: 512
  temperature:
    description: Sampling temperature; 0 is greedy, which the losslessness check needs.
    type: float
    default: 0.0
  warmup_requests:
    description: Requests sent once before the first level and not measured.
    type: int
    default: 2
  api_key:
    description: Bearer token for a server started with an API key.
    type: str
    default: ""
  request_timeout:
    description: Seconds one request may take from connecting to its last event.
    type: float
    default: 600
  output_dir:
    description:
      - Folder for C(c<N>.json), created when missing.
      - A C(provenance.json) already in it, or else in the folder above it (written by the
        benchmark role - kit version, run id, GPU facts, the prompt sets' sources, and
        C(records), the paths of the runtime and launch records) is copied into every level's
        C(provenance). The runtime record, the launch
        record (C(/opt/kimi/runtime/runtime.json), C(/var/lib/kimi/server/launch.json) unless
        C(records) names others) and the weights manifests of the model and drafter in the
        launch's argv are read from the host.
    type: path
    required: true
  run_label:
    description: Label of this run (the benchmark role passes its run id), copied into every file.
    type: str
    default: ""
  config_name:
    description: Name of the serving config under test (ar, dflash, ddtree-b32, ...).
    type: str
    required: true
notes:
  - Bounded everywhere - every request by O(request_timeout), every level by the request
    timeout times the number of request waves plus a minute, every stream by its event count.
  - The server's C(/server_info) can hold the API key among its arguments; the copy kept in
    C(provenance) masks every field whose name says key, token, secret or password, and any
    occurrence of O(api_key).
author:
  - kimi-deploy-kit maintainers
"""

EXAMPLES = r"""
- name: Benchmark the running server at two concurrency levels
  sglang_benchmark:
    base_url: http://127.0.0.1:30000
    concurrency: [1, 16]
    prompts: /var/lib/kimi/benchmark/prompts/gsm8k.jsonl
    num_prompts: 64
    max_new_tokens: 512
    output_dir: /var/lib/kimi/benchmark/20260101T000000Z/dflash/gsm8k
    run_label: 20260101T000000Z
    config_name: dflash
  register: bench
"""

RETURN = r"""
files:
  description: The level files written, in order.
  returned: always
  type: list
  elements: str
summaries:
  description: The C(summary) of each level, keyed by concurrency.
  returned: always
  type: dict
saturated:
  description: Concurrency levels at which the client marked itself saturated.
  returned: always
  type: list
  elements: int
ansible_facts:
  description: C(sglang_benchmark) - config, run label, prompts file and the summaries.
  returned: success
  type: dict
"""

import asyncio  # noqa: E402
import datetime  # noqa: E402
import gc  # noqa: E402
import hashlib  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import ssl  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import urllib.error  # noqa: E402
import urllib.parse  # noqa: E402
import urllib.request  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.benchmark import (  # noqa: E402
    SCHEMA_VERSION,
    ResponseParser,
    StreamError,
    accepted_tokens_per_step,
    chat_template_of,
    completion_tokens,
    decode_steps,
    distribution,
    parse_metrics,
    render_chat,
    request_timings,
    server_delta,
    special_tokens,
    startup_record,
    summarize_level,
)

METRICS = (
    "sglang:generation_tokens_total",
    "sglang:prompt_tokens_total",
    "sglang:spec_verify_calls_total",
    "sglang:num_requests_total",
)
DEFAULT_RECORDS = {
    "runtime": "/opt/kimi/runtime/runtime.json",
    "launch": "/var/lib/kimi/server/launch.json",
}
SECRET_NAME = re.compile(r"key|token|secret|password", re.IGNORECASE)
# The client is the limit when it is busy nearly all the time, or busy and so late that a
# burst of events (one per request per decode step) is not handled before the next is due.
# A late event loop in a mostly idle client means other processes hold the CPU: the timings
# are less precise (timing_reliable false: lag beyond the kit's 1 ms TTFT aim, with margin),
# but the client was not what limited the server.
SATURATED_CPU = 0.85
BUSY_CPU = 0.3
BEHIND_SHARE = 0.25
LATE_LAG_P99_MS = 2.0
LAG_INTERVAL_S = 0.005
# How long to wait for an idle server to flush its cache before a level, and per request.
FLUSH_WAIT_S = 60.0
FLUSH_REQUEST_WAIT_S = 30.0


class Target:
    """Where and how to send requests, from base_url."""

    def __init__(self, base_url: str, api_key: str):
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be http(s)://host[:port][/path], got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        # What results may show: no user:password@ of a URL that carries one.
        self.shown_url = f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}{parts.path}".rstrip(
            "/"
        )
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.path = parts.path.rstrip("/")
        self.netloc = parts.netloc.rsplit("@", 1)[-1]
        self.api_key = api_key

    def request(self, body: dict) -> bytes:
        data = json.dumps(body).encode()
        head = [
            f"POST {self.path}/generate HTTP/1.1",
            f"Host: {self.netloc}",
            "Content-Type: application/json",
            "Accept: text/event-stream",
            f"Content-Length: {len(data)}",
            "Connection: close",
        ]
        if self.api_key:
            head.append(f"Authorization: Bearer {self.api_key}")
        return ("\r\n".join(head) + "\r\n\r\n").encode() + data

    def get(self, path: str, timeout: float = 30, method: str = "GET") -> tuple[int, bytes]:
        request = urllib.request.Request(self.base_url + path, method=method)  # noqa: S310
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310
                return answer.status, answer.read(8 << 20)
        except urllib.error.HTTPError as error:
            return error.code, error.read(4096)


class Tracker:
    """One request: its events as (arrival time, cumulative tokens), first and last payload."""

    __slots__ = (
        "connected",
        "done_at",
        "end",
        "error",
        "events",
        "first",
        "index",
        "last",
        "lost",
        "max_events",
        "nbytes",
        "start",
    )

    def __init__(self, index: int, max_events: int):
        self.index = index
        self.max_events = max_events
        self.events: list[tuple[float, int]] = []
        self.first = self.last = None
        self.start = self.end = 0.0
        self.connected = None
        self.done_at = None
        self.error = ""
        self.lost = False  # the connection failed or broke: the server went away
        self.nbytes = 0

    def event(self, now: float, payload: bytes) -> None:
        if payload == b"[DONE]":
            self.done_at = now
            return
        if len(self.events) >= self.max_events:
            self.error = f"more than {self.max_events} events without [DONE]"
            return
        tokens = completion_tokens(payload)
        if tokens is None:
            try:
                data = json.loads(payload)
            except ValueError:
                self.error = f"undecodable event: {payload[:120]!r}"
                return
            if isinstance(data, dict) and data.get("error"):
                self.error = f"server error: {str(data['error'])[:300]}"
                return
            tokens = ((data.get("meta_info") if isinstance(data, dict) else None) or {}).get(
                "completion_tokens"
            )
            if tokens is None:
                self.error = "event without meta_info.completion_tokens"
                return
        if self.first is None:
            self.first = payload
        self.last = payload
        self.events.append((now, int(tokens)))


class Stream(asyncio.Protocol):
    """Sends one request and feeds the answer to its Tracker, stamping each read's arrival.

    A read is only stamped and queued when it arrives; parsing waits for the loop's next
    pass. Servers batch decode steps, so the events of every running request arrive
    together: stamping them all before parsing any keeps the last one's stamp from carrying
    the others' parsing time.
    """

    def __init__(self, payload: bytes, tracker: Tracker, finished: asyncio.Future):
        self.payload = payload
        self.tracker = tracker
        self.finished = finished
        self.parser = ResponseParser()
        self.transport = None
        self.reads: list[tuple[float, bytes]] = []
        self.loop = finished.get_loop()

    def connection_made(self, transport) -> None:
        self.transport = transport
        # TTFT and E2E count from here: connecting is the client's cost, not the server's.
        self.tracker.connected = time.perf_counter()
        transport.write(self.payload)

    def data_received(self, data: bytes) -> None:
        self.reads.append((time.perf_counter(), data))
        if len(self.reads) == 1:
            self.loop.call_soon(self.parse)

    def parse(self) -> None:
        reads, self.reads = self.reads, []
        tracker = self.tracker
        for now, data in reads:
            if self.finished.done():
                return
            tracker.nbytes += len(data)
            try:
                payloads = self.parser.feed(data)
            except StreamError as error:
                self.finish(now, f"bad response: {error}")
                return
            for payload in payloads:
                tracker.event(now, payload)
                if tracker.error or tracker.done_at is not None:
                    self.finish(now)
                    return
            if self.parser.finished:
                self.finish(now)
                return

    def connection_lost(self, exc) -> None:
        self.parse()
        now = time.perf_counter()
        for payload in self.parser.close():
            self.tracker.event(now, payload)
        self.finish(now, None, lost=exc)

    def finish(self, now: float, error: str = "", lost=None) -> None:
        if self.finished.done():
            return
        tracker = self.tracker
        tracker.end = now
        if error:
            tracker.error = error
        elif not tracker.error and self.parser.status not in (None, 200):
            body = bytes(self.parser.body[:300]).decode("utf-8", "replace")
            tracker.error = f"HTTP {self.parser.status}: {body}"
        elif not tracker.error and tracker.done_at is None and not self.parser.finished:
            # The stream ended early: a reset, or a server that went away mid-answer.
            tracker.lost = True
            tracker.error = f"connection closed before [DONE] ({lost or 'closed by the server'})"
        self.finished.set_result(None)
        if self.transport is not None:
            self.transport.close()


async def send(target: Target, payload: bytes, tracker: Tracker, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    tracker.start = time.perf_counter()

    def expire():
        if not finished.done():
            tracker.error = f"timed out after {timeout:g} s"
            tracker.end = time.perf_counter()
            finished.set_result(None)
            if stream.transport is not None:
                stream.transport.abort()

    stream = Stream(payload, tracker, finished)
    timer = loop.call_at(loop.time() + timeout, expire)
    try:
        await asyncio.wait_for(
            loop.create_connection(
                lambda: stream,
                target.host,
                target.port,
                ssl=target.ssl,
                server_hostname=target.host if target.ssl else None,
            ),
            timeout,
        )
    # asyncio.TimeoutError is not the builtin before Python 3.11 (hosts may run 3.10).
    except (OSError, asyncio.TimeoutError) as error:  # noqa: UP041
        if not finished.done():
            tracker.lost = True
            tracker.error = f"cannot connect: {error or 'timed out'}"
            tracker.end = time.perf_counter()
            finished.set_result(None)
    try:
        await finished
    finally:
        timer.cancel()


async def watch_loop(samples: list[float], stop: asyncio.Event) -> None:
    """Event-loop lag: how late a short sleep wakes up."""
    while not stop.is_set():
        before = time.perf_counter()
        await asyncio.sleep(LAG_INTERVAL_S)
        samples.append((time.perf_counter() - before - LAG_INTERVAL_S) * 1000.0)


async def run_level(
    target: Target,
    payloads: list[bytes],
    concurrency: int,
    timeout: float,
    max_events: int,
) -> dict:
    """Keep `concurrency` requests in flight until every payload was sent once."""
    trackers = [Tracker(index, max_events) for index in range(len(payloads))]
    cursor = iter(range(len(payloads)))

    async def worker():
        for index in cursor:
            await send(target, payloads[index], trackers[index], timeout)

    lag: list[float] = []
    stop = asyncio.Event()
    watcher = asyncio.ensure_future(watch_loop(lag, stop))
    waves = -(-len(payloads) // max(concurrency, 1))
    deadline = timeout * waves + 60
    cpu_before = time.process_time()
    started = time.perf_counter()
    workers = [asyncio.ensure_future(worker()) for _ in range(min(concurrency, len(payloads)))]
    _done, pending = await asyncio.wait(workers, timeout=deadline)
    for task in pending:
        task.cancel()
    ended = time.perf_counter()
    cpu = time.process_time() - cpu_before
    stop.set()
    await watcher
    for tracker in trackers:
        if not tracker.end:
            tracker.error = tracker.error or f"not finished within the level's {deadline:g} s"
            tracker.end = ended
    last = max((t.done_at or t.end for t in trackers), default=ended)
    return {
        "trackers": trackers,
        "started": started,
        "ended": last,
        "cpu_s": cpu,
        "lag_ms": lag,
        "wall_s": ended - started,
    }


def record_of(tracker: Tracker, prompt: dict, prompt_sha: str) -> tuple[dict, list[float]]:
    """The request's record for the level file, and its per-token ITLs."""
    sent = tracker.connected or tracker.start
    record = {
        "index": tracker.index,
        "prompt_id": prompt.get("id"),
        "prompt_sha256": prompt_sha,
        "ok": False,
        "error": tracker.error or None,
        "ttft_ms": None,
        "e2e_ms": None,
        "tpot_ms": None,
        "output_tokens": 0,
        "connect_ms": (
            round((tracker.connected - tracker.start) * 1000.0, 3) if tracker.connected else None
        ),
        "events": [[round((t - sent) * 1000.0, 3), n] for t, n in tracker.events],
    }
    if tracker.last is None:
        if not tracker.error:
            record["error"] = "no event received"
        return record, []
    try:
        last = json.loads(tracker.last)
        first = json.loads(tracker.first) if tracker.first is not tracker.last else last
    except ValueError as error:
        record["error"] = f"undecodable event: {error}"
        return record, []
    meta = last.get("meta_info") if isinstance(last, dict) else None
    first_meta = first.get("meta_info") if isinstance(first, dict) else None
    if not isinstance(meta, dict) or not isinstance(first_meta, dict):
        record["error"] = "event without a meta_info object"
        return record, []
    meta = {k: meta.get(k) for k in META_FIELDS}
    first_meta = {k: first_meta.get(k) for k in META_FIELDS}
    for name in ("completion_tokens", "spec_verify_ct", "prompt_tokens", "cached_tokens"):
        for where in (meta, first_meta):
            if not counted(where[name]):
                where[name] = None
    if not number(meta["spec_accept_length"]):
        meta["spec_accept_length"] = None
    timings = request_timings(sent, tracker.events, tracker.done_at)
    verify = meta["spec_verify_ct"]
    tokens = meta["completion_tokens"] or 0
    steps = decode_steps(first_meta, meta)
    finish = meta["finish_reason"]
    record.update(
        ok=not tracker.error,
        ttft_ms=round(timings["ttft_ms"], 3),
        e2e_ms=round(timings["e2e_ms"], 3),
        tpot_ms=round(timings["tpot_ms"], 4) if timings["tpot_ms"] is not None else None,
        output_tokens=tokens,
        prompt_tokens=meta["prompt_tokens"],
        cached_tokens=meta["cached_tokens"],
        spec_verify_ct=verify,
        accept_length=accepted_tokens_per_step(tokens, verify),
        spec_accept_length=meta["spec_accept_length"],
        decode_steps=steps,
        decode_ms=round(timings["decode_ms"], 3),
        step_ms=round(timings["decode_ms"] / steps, 4) if steps > 0 else None,
        finish_reason=str(finish.get("type"))[:40] if isinstance(finish, dict) else None,
        text=last.get("text") if isinstance(last.get("text"), str) else None,
        output_ids=last.get("output_ids") if isinstance(last.get("output_ids"), list) else None,
    )
    ids = record["output_ids"]
    if isinstance(ids, list) and len(ids) != tokens:
        # --incremental-streaming-output: the last event holds only its own tokens. Keeping
        # a fragment would make the losslessness check compare the wrong thing.
        record.update(text=None, output_ids=None, outputs_incomplete=True)
    return record, timings["itl_ms"] if record["ok"] else []


META_FIELDS = (
    "completion_tokens",
    "spec_verify_ct",
    "spec_accept_length",
    "prompt_tokens",
    "cached_tokens",
    "finish_reason",
)


def counted(value) -> bool:
    """A count from the server: a non-negative integer."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 40


def number(value) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def mask(value, secrets: list[str]):
    """A copy with secret-looking fields and the given secret values masked."""
    if isinstance(value, dict):
        return {
            k: (
                "***"
                if SECRET_NAME.search(str(k)) and v not in (None, "", False)
                else mask(v, secrets)
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [mask(v, secrets) for v in value]
    if isinstance(value, str):
        for secret in secrets:
            if secret:
                value = value.replace(secret, "***")
    return value


def read_json(path: str):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_prompts(path: str, count: int) -> list[dict]:
    """The first `count` rows (cycled), each {"prompt": str} or {"messages": [...]}."""
    rows: list[dict] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if len(rows) >= count:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as error:
                raise ValueError(f"{path} line {number}: not JSON ({error})") from None
            ok_prompt = isinstance(row, dict) and isinstance(row.get("prompt"), str)
            ok_chat = isinstance(row, dict) and isinstance(row.get("messages"), list)
            if not (ok_prompt or ok_chat):
                raise ValueError(
                    f'{path} line {number}: needs "prompt" (a string) or "messages" (a list)'
                )
            rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no prompts")
    return [rows[i % len(rows)] for i in range(count)]


def render_rows(rows: list[dict], server_info: dict) -> list[str]:
    """Prompt text per row; chat rows through the chat template of the server's model."""
    if all("prompt" in row for row in rows):
        return [row["prompt"] for row in rows]
    folder = server_info.get("tokenizer_path") or server_info.get("model_path") or ""
    files = {}
    for name in ("chat_template.jinja", "chat_template.json", "tokenizer_config.json"):
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as handle:
                files[name] = handle.read()
        except OSError:
            pass
    template, _source = chat_template_of(files)
    if template is None:
        raise ValueError(
            f"the prompts hold chat messages, but no chat template was found in {folder!r} "
            "(the model folder /server_info names); render them first (the benchmark role does)"
        )
    tokens = special_tokens(json.loads(files.get("tokenizer_config.json") or "{}"))
    try:
        return [
            row["prompt"] if "prompt" in row else render_chat(template, row["messages"], tokens, {})
            for row in rows
        ]
    except ImportError:
        raise ValueError(
            "the prompts hold chat messages and rendering them needs jinja2, which this "
            "host's Python lacks; render them first (the benchmark role does)"
        ) from None


def server_state(target: Target) -> dict:
    """The cumulative counters a level's differences are taken from, and the record of the
    server's start that tells a restart."""
    state: dict = {"metrics": {}, "startup_time": None, "avg_spec_accept_length": None}
    try:
        status, body = target.get("/server_info")
        if status == 200:
            info = json.loads(body)
            if not isinstance(info, dict):
                raise ValueError("/server_info is not a JSON object")
            state["startup_time"] = startup_record(info)
            internal = info.get("internal_states")
            internal = internal[0] if isinstance(internal, list) and internal else None
            average = internal.get("avg_spec_accept_length") if isinstance(internal, dict) else None
            state["avg_spec_accept_length"] = average if number(average) else None
        status, body = target.get("/metrics")
        if status == 200:
            state["metrics"] = parse_metrics(body.decode("utf-8", "replace"), METRICS)
    except (OSError, ValueError) as error:
        state["error"] = str(error)
    return state


def flush_cache(target: Target, wait_s: float = FLUSH_WAIT_S) -> str:
    """Empty the server's prefix cache before a level.

    SGLang flushes only when no request is running or waiting (python/sglang/srt/managers/
    scheduler.py flush_cache) and otherwise answers 400 "Flush cache failed."; given
    ?timeout=S it waits up to S seconds for idle (scheduler_components/flush_wrapper.py), and
    a second flush while one waits is refused. So: ask it to wait, retry until `wait_s` is
    spent (a release without the parameter answers at once), and say what happened."""
    deadline = time.monotonic() + wait_s
    last = ""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        wait = min(left, FLUSH_REQUEST_WAIT_S)
        try:
            status, body = target.get(
                f"/flush_cache?timeout={wait:.1f}", timeout=wait + 10, method="POST"
            )
        except OSError as error:
            status, body = None, str(error).encode()
        if status == 200:
            return "flushed"
        last = f"HTTP {status}: {body[:200].decode('utf-8', 'replace').strip()}"
        if status in (401, 403, 404, 405):
            break  # asking again will not change the answer
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    return f"not flushed ({last})"


def now_iso() -> str:
    # timezone.utc, not datetime.UTC: hosts may run Python 3.10.
    return datetime.datetime.now(datetime.timezone.utc).isoformat(  # noqa: UP017
        timespec="milliseconds"
    )


def write_json(path: str, data: dict) -> None:
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1, sort_keys=False)
        handle.write("\n")
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


def client_report(level: dict, events: int) -> dict:
    duration = max(level["ended"] - level["started"], 1e-9)
    lag = distribution(level["lag_ms"])
    lag_p99 = lag["p99"] or 0.0
    cpu_fraction = level["cpu_s"] / max(level["wall_s"], 1e-9)
    gaps = [
        (t.events[-1][0] - t.events[0][0]) * 1000.0 / (len(t.events) - 1)
        for t in level["trackers"]
        if len(t.events) > 1
    ]
    event_gap = sum(gaps) / len(gaps) if gaps else 0.0
    reasons = []
    if cpu_fraction >= SATURATED_CPU:
        reasons.append(f"client CPU {cpu_fraction:.0%} of one core")
    # Events come in bursts, one per decode step: a loop still busy with one burst when the
    # next is due is falling behind, whatever its average CPU use.
    if cpu_fraction >= BUSY_CPU and event_gap and lag_p99 >= BEHIND_SHARE * event_gap:
        reasons.append(
            f"event-loop lag p99 {lag_p99:.2f} ms against {event_gap:.2f} ms between a "
            f"request's events, at {cpu_fraction:.0%} CPU"
        )
    warnings = []
    if lag_p99 >= LATE_LAG_P99_MS and not reasons:
        warnings.append(
            f"event-loop lag p99 {lag_p99:.2f} ms while the client used {cpu_fraction:.0%} "
            "of a core: other processes compete for the CPU; timings are less precise"
        )
    return {
        "cpu_s": round(level["cpu_s"], 4),
        "cpu_fraction": round(cpu_fraction, 4),
        "loop_lag_ms": lag,
        "events": events,
        "events_per_s": round(events / duration, 2),
        "event_gap_ms": round(event_gap, 4),
        "bytes_received": sum(t.nbytes for t in level["trackers"]),
        "saturated": bool(reasons),
        "saturated_reasons": reasons,
        "timing_reliable": lag_p99 < LATE_LAG_P99_MS,
        "warnings": warnings,
        "thresholds": {
            "saturated_cpu_fraction": SATURATED_CPU,
            "busy_cpu_fraction": BUSY_CPU,
            "behind_lag_share_of_event_gap": BEHIND_SHARE,
            "late_loop_lag_p99_ms": LATE_LAG_P99_MS,
        },
        "python": sys.version.split()[0],
    }


def weights_provenance(launch: dict | None) -> list[dict]:
    """The weights manifest (kimi-manifest.json) of the model and drafter the server runs."""
    argv = (launch or {}).get("argv") or []
    found = []
    for flag, value in itertools.pairwise(argv):
        if flag not in ("--model-path", "--speculative-draft-model-path"):
            continue
        path = os.path.join(value, "kimi-manifest.json")
        manifest = read_json(path)
        entry = {"role": "target" if flag == "--model-path" else "drafter", "path": value}
        if isinstance(manifest, dict):
            entry.update(
                manifest=path,
                manifest_sha256=file_sha256(path),
                repo_id=manifest.get("repo_id"),
                revision=manifest.get("revision"),
                verify_mode=manifest.get("verify_mode"),
                verified_at=manifest.get("verified_at"),
                files=len(manifest.get("files") or {}),
            )
        else:
            entry["manifest"] = None
        found.append(entry)
    return found


def host_provenance(output_dir: str) -> dict:
    """What the caller recorded (provenance.json beside the results) and the records the
    runtime and server stages left on the host, read now: the launch is the running one."""
    given = read_json(os.path.join(output_dir, "provenance.json"))
    if given is None:  # one file for the prompt sets of a config, in the folder above theirs
        given = read_json(os.path.join(os.path.dirname(output_dir.rstrip("/")), "provenance.json"))
    given = given if isinstance(given, dict) else {}
    paths = {**DEFAULT_RECORDS, **(given.pop("records", None) or {})}
    found = dict(given)
    for name, path in paths.items():
        found[name] = read_json(path)
    found["weights"] = weights_provenance(found.get("launch"))
    return found


def run(params: dict, fail) -> dict:
    target = Target(params["base_url"], params["api_key"])
    try:
        status, body = target.get("/server_info")
        if status != 200:
            raise OSError(f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}")
        server_info = json.loads(body)
    except (OSError, ValueError) as error:
        fail(
            f"The SGLang server at {target.shown_url} does not answer /server_info: {error}. "
            "Start it (the server stage) and check base_url."
        )
    rows = load_prompts(params["prompts"], params["num_prompts"])
    texts = render_rows(rows, server_info)
    sampling = {"max_new_tokens": params["max_new_tokens"], "temperature": params["temperature"]}
    payloads = [
        target.request({"text": text, "sampling_params": sampling, "stream": True})
        for text in texts
    ]
    shas = [hashlib.sha256(text.encode()).hexdigest() for text in texts]
    max_events = params["max_new_tokens"] + 16
    prompts_info = {
        "path": params["prompts"],
        "name": os.path.splitext(os.path.basename(params["prompts"]))[0],
        "sha256": file_sha256(params["prompts"]),
        "requests_per_level": len(texts),
        "distinct_prompts": len(set(shas)),
    }
    provenance = {
        **host_provenance(params["output_dir"]),
        "server_info": mask(server_info, [params["api_key"]]),
        "sglang_version": server_info.get("version"),
        "prompts": prompts_info,
    }
    settings = {
        k: params[k] for k in ("num_prompts", "max_new_tokens", "temperature", "warmup_requests")
    }
    settings.update(request_timeout_s=params["request_timeout"], base_url=target.shown_url)
    os.makedirs(params["output_dir"], mode=0o755, exist_ok=True)

    loop = asyncio.new_event_loop()
    files, summaries, saturated = [], {}, []
    try:
        if params["warmup_requests"]:
            count = params["warmup_requests"]
            warm = loop.run_until_complete(
                run_level(
                    target,
                    [payloads[i % len(payloads)] for i in range(count)],
                    count,
                    params["request_timeout"],
                    max_events,
                )
            )
            errors = [t.error for t in warm["trackers"] if t.error]
            if len(errors) == count:
                fail(f"Every warmup request to {target.shown_url} failed: {errors[0]}")
        for concurrency in params["concurrency"]:
            flushed = flush_cache(target)
            before = server_state(target)
            started_at = now_iso()
            gc.collect()
            gc.disable()  # a collection mid-level would show up as client latency
            try:
                level = loop.run_until_complete(
                    run_level(target, payloads, concurrency, params["request_timeout"], max_events)
                )
            finally:
                gc.enable()
            ended_at = now_iso()
            after = server_state(target)
            records, itl = [], []
            for tracker in level["trackers"]:
                record, gaps = record_of(tracker, rows[tracker.index], shas[tracker.index])
                records.append(record)
                itl.extend(gaps)
            duration = level["ended"] - level["started"]
            summary = summarize_level(records, duration, itl)
            delta = server_delta(before, after)
            events = sum(len(t.events) for t in level["trackers"])
            lost = [t for t in level["trackers"] if t.lost]
            document = {
                "schema_version": SCHEMA_VERSION,
                "kind": "sglang_benchmark.level",
                "run_label": params["run_label"],
                "config": params["config_name"],
                "prompt_set": prompts_info["name"],
                "concurrency": concurrency,
                "started_at": started_at,
                "ended_at": ended_at,
                "settings": settings,
                "summary": summary,
                "server": {
                    "cache": flushed,
                    "before": before,
                    "after": after,
                    "delta": delta,
                    "crashed": bool(lost) or delta["restarted"],
                },
                "client": client_report(level, events),
                "provenance": {**provenance, "started_at": started_at, "ended_at": ended_at},
                "requests": records,
            }
            path = os.path.join(params["output_dir"], f"c{concurrency}.json")
            write_json(path, document)
            files.append(path)
            summaries[str(concurrency)] = summary
            if document["client"]["saturated"]:
                saturated.append(concurrency)
            if document["server"]["crashed"]:
                reason = lost[0].error if lost else "it restarted (new start time or counters)"
                fail(
                    f"The server crashed during concurrency {concurrency} of "
                    f"{params['config_name']}: {len(lost)} of {len(records)} requests lost "
                    f"their connection; {reason}. See the server's log.",
                    files=files,
                    summaries=summaries,
                )
            if summary["requests_ok"] == 0:
                first = next((r["error"] for r in records if r["error"]), "unknown")
                fail(
                    f"Every request at concurrency {concurrency} failed: {first}",
                    files=files,
                    summaries=summaries,
                )
    finally:
        loop.close()
    return {"files": files, "summaries": summaries, "saturated": saturated, "prompts": prompts_info}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "base_url": {"type": "str", "required": True},
            "concurrency": {"type": "list", "elements": "int", "required": True},
            "prompts": {"type": "path", "required": True},
            "num_prompts": {"type": "int", "default": 64},
            "max_new_tokens": {"type": "int", "default": 512},
            "temperature": {"type": "float", "default": 0.0},
            "warmup_requests": {"type": "int", "default": 2},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "request_timeout": {"type": "float", "default": 600},
            "output_dir": {"type": "path", "required": True},
            "run_label": {"type": "str", "default": ""},
            "config_name": {"type": "str", "required": True},
        },
        supports_check_mode=False,
    )
    p = module.params
    problems = []
    if not p["concurrency"] or any(c < 1 for c in p["concurrency"]):
        problems.append(f"concurrency must be a list of levels >= 1, got {p['concurrency']}")
    if p["num_prompts"] < 1 or p["max_new_tokens"] < 1:
        problems.append("num_prompts and max_new_tokens must be at least 1")
    if p["warmup_requests"] < 0 or p["request_timeout"] <= 0 or p["temperature"] < 0:
        problems.append("warmup_requests >= 0, request_timeout > 0 and temperature >= 0 needed")
    if problems:
        module.fail_json(msg="; ".join(problems))

    def fail(msg, **extra):
        module.fail_json(msg=msg, **extra)

    try:
        result = run(p, fail)
    except (OSError, ValueError) as error:
        module.fail_json(msg=f"Benchmark of {p['config_name']} failed: {error}")
    module.exit_json(
        changed=True,
        files=result["files"],
        summaries=result["summaries"],
        saturated=result["saturated"],
        ansible_facts={
            "sglang_benchmark": {
                "config": p["config_name"],
                "run_label": p["run_label"],
                "prompts": result["prompts"],
                "summaries": result["summaries"],
            }
        },
    )


if __name__ == "__main__":
    main()
