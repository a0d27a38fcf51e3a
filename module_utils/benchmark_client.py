"""The benchmark's HTTP/SSE client: requests to SGLang's streaming /generate, timed per event.

Runs on the host that drives the benchmark (the module ships it there with the module), with
the standard library only. Target says where to send; Stream stamps each read as it arrives
and a Tracker keeps one request's events; run_level keeps `concurrency` requests in flight and
record_of turns a Tracker into the level file's request record. client_report says whether the
client itself was the limit; server_state and flush_cache are the server calls around a level.
"""

from __future__ import annotations

import asyncio
import json
import math
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from ansible.module_utils.benchmark import (
    ResponseParser,
    StreamError,
    accepted_tokens_per_step,
    completion_tokens,
    decode_steps,
    distribution,
    parse_metrics,
    request_timings,
    startup_record,
)

METRICS = (
    "sglang:generation_tokens_total",
    "sglang:prompt_tokens_total",
    "sglang:spec_verify_calls_total",
    "sglang:num_requests_total",
)
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
        "prompt_id": row_id(prompt.get("id")),
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
        output_ids=token_ids(last.get("output_ids")),
    )
    ids = record["output_ids"]
    if isinstance(ids, list) and len(ids) != tokens:
        # --incremental-streaming-output: the last event holds only its own tokens. Keeping
        # a fragment would make the losslessness check compare the wrong thing.
        record.update(text=None, output_ids=None, outputs_incomplete=True)
    return record, timings["itl_ms"] if record["ok"] else []


def row_id(value) -> str | int | None:
    """A prompt row's id as the level file keeps it: a string or an integer, else None."""
    if isinstance(value, str):
        return value[:200]
    return value if counted(value) else None


def token_ids(value) -> list[int] | None:
    """The stream's output_ids when they are a list of token ids, else None."""
    if isinstance(value, list) and all(counted(item) for item in value):
        return value
    return None


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
