"""The benchmark's HTTP/SSE client: requests to SGLang's streaming /generate, timed per event.

Runs on the host that drives the benchmark (the module ships it there with the module), with
the standard library only. Target says where to send; Stream stamps each read as it arrives
and a Tracker keeps one request's events; run_level keeps `concurrency` requests in flight (a
closed loop, spread over forked processes when high) or starts them at Poisson arrival times
(a request rate), within a time budget, and record_of turns a Tracker into the level file's
request record. client_report says whether the client itself was the limit; server_state and
flush_cache are the server calls around a level.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import pickle
import random
import select
import signal
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from ansible.module_utils.benchmark.stats import (
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
from ansible.module_utils.host.helpers import MASK
from ansible.module_utils.host.secret_scrub import secret_forms

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
# A closed-loop level is spread over one event loop (a forked process) per this many
# requests in flight: a decode step's burst of events, one per request, must be read well
# within a quarter of the step (see client_report). MAX_PROCESSES bounds the fork count;
# START_WAIT_S is how long a worker waits for the level's start before giving up.
STREAMS_PER_PROCESS = 64
MAX_PROCESSES = 32
START_WAIT_S = 60.0
# How long to wait for an idle server to flush its cache before a level, and per request.
FLUSH_WAIT_S = 60.0
FLUSH_REQUEST_WAIT_S = 30.0
# Largest /server_info or /metrics answer read, and the deepest JSON kept from the server.
MAX_ANSWER = 8 << 20
MAX_ERROR_ANSWER = 4096
MAX_JSON_DEPTH = 64


def masked(text: str, forms: list[str]) -> str:
    for form in forms:
        if form in text:
            text = text.replace(form, MASK)
    return text


def load_json(body: bytes | str, what: str):
    """JSON from the server; ValueError (naming `what`) for anything that is not, or that
    nests deeper than the level file keeps."""
    try:
        value = json.loads(body)
    except RecursionError:
        raise ValueError(f"{what} nests too deep") from None
    except ValueError as error:
        raise ValueError(f"{what} is not JSON ({error})") from None
    if too_deep(value, MAX_JSON_DEPTH):
        raise ValueError(f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
    return value


def too_deep(value, depth: int) -> bool:
    if depth < 0:
        return True
    if isinstance(value, dict):
        return any(too_deep(item, depth - 1) for item in value.values())
    if isinstance(value, list):
        return any(too_deep(item, depth - 1) for item in value)
    return False


def read_bounded(answer, limit: int, deadline: float, cut: bool = False) -> bytes:
    """At most `limit` bytes of an HTTP answer before `deadline` (time.monotonic): read in
    pieces, each within the socket's timeout. Longer: ValueError, or the first `limit` bytes
    when `cut` (an error body only shown in part)."""
    out = bytearray()
    read = getattr(answer, "read1", None) or answer.read
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError("the answer did not arrive within its deadline")
        piece = read(min(1 << 16, limit + 1 - len(out)))
        if not piece:
            return bytes(out)
        out += piece
        if len(out) > limit:
            if cut:
                return bytes(out[:limit])
            raise ValueError(f"answer longer than {limit} bytes")


class Target:
    """Where and how to send requests, from base_url."""

    def __init__(self, base_url: str, api_key: str, secrets=()):
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
        # What no string the benchmark keeps may hold: the key, the HF token, their base64.
        self.secrets = secret_forms([api_key, *secrets])

    def mask(self, text: str) -> str:
        return masked(text, self.secrets)

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

    def get(
        self, path: str, timeout: float = 30, method: str = "GET", limit: int = MAX_ANSWER
    ) -> tuple[int, bytes]:
        """(status, body) of one call, all of it within `timeout` seconds (plus one socket
        read); a body over `limit` bytes is a ValueError, an error body is cut to 4 KiB."""
        deadline = time.monotonic() + timeout
        request = urllib.request.Request(self.base_url + path, method=method)  # noqa: S310
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310
                return answer.status, read_bounded(answer, limit, deadline)
        except urllib.error.HTTPError as error:
            with error:
                return error.code, read_bounded(error, MAX_ERROR_ANSWER, deadline, cut=True)


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
        "mask",
        "max_events",
        "nbytes",
        "scheduled",
        "start",
    )

    def __init__(self, index: int, max_events: int, mask=str):
        self.index = index
        self.max_events = max_events
        self.mask = mask  # what an error string goes through before it is kept
        self.events: list[tuple[float, int]] = []
        self.first = self.last = None
        self.start = self.end = 0.0
        self.scheduled = None  # when a request-rate level's schedule had it start
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
            except (ValueError, RecursionError):
                shown = self.mask(payload[:4096].decode("utf-8", "replace"))
                self.error = f"undecodable event: {shown[:120]!r}"
                return
            if isinstance(data, dict) and data.get("error"):
                self.error = f"server error: {self.mask(str(data['error']))[:300]}"
                return
            problem = event_problem(data)
            if problem:
                self.error = self.mask(problem)
                return
            tokens = data["meta_info"]["completion_tokens"]
        if self.first is None:
            self.first = payload
        self.last = payload
        self.events.append((now, int(tokens)))


class Reads:
    """The reads of every stream of one event loop that arrived in one pass of it, parsed
    together at its end.

    A read is only stamped and queued when it arrives; parsing waits for the loop's next
    pass. Servers batch decode steps, so the events of every running request arrive
    together: stamping them all before parsing any keeps the last one's stamp from carrying
    the others' parsing time. One queue for all streams costs one callback per pass rather
    than one per read.
    """

    __slots__ = ("loop", "pending")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.pending: list[tuple[Stream, float, bytes]] = []

    def add(self, stream: Stream, data: bytes) -> None:
        pending = self.pending
        pending.append((stream, time.perf_counter(), data))
        if len(pending) == 1:
            self.loop.call_soon(self.parse)

    def parse(self) -> None:
        pending, self.pending = self.pending, []
        for stream, now, data in pending:
            stream.consume(now, data)


class Stream(asyncio.Protocol):
    """Sends one request and feeds the answer to its Tracker, each read stamped when it
    arrives and parsed in the loop's next pass (Reads)."""

    def __init__(self, payload: bytes, tracker: Tracker, finished: asyncio.Future, reads: Reads):
        self.payload = payload
        self.tracker = tracker
        self.finished = finished
        self.parser = ResponseParser()
        self.transport = None
        self.reads = reads

    def connection_made(self, transport) -> None:
        self.transport = transport
        # TTFT and E2E count from here: connecting is the client's cost, not the server's.
        self.tracker.connected = time.perf_counter()
        transport.write(self.payload)

    def data_received(self, data: bytes) -> None:
        self.reads.add(self, data)

    def consume(self, now: float, data: bytes) -> None:
        if self.finished.done():
            return
        tracker = self.tracker
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

    def connection_lost(self, exc) -> None:
        # Reads that arrived before the close are parsed first (all streams' queued reads:
        # they are stamped already).
        self.reads.parse()
        self.parser.close()
        self.finish(time.perf_counter(), lost=exc)

    def finish(self, now: float, error: str = "", lost=None) -> None:
        if self.finished.done():
            return
        tracker = self.tracker
        tracker.end = now
        parser = self.parser
        if error:
            tracker.error = tracker.mask(error)
        elif tracker.error:
            pass
        elif parser.status not in (None, 200):
            body = tracker.mask(bytes(parser.body).decode("utf-8", "replace"))
            tracker.error = f"HTTP {parser.status}: {body[:300]}"
        elif tracker.done_at is None:
            # The stream ended before [DONE] - the connection closed or the body ended, maybe
            # in the middle of an event: a server that went away mid-answer. A partial event
            # is no event; the request is lost, which marks the level crashed.
            tracker.lost = True
            where = "inside an event" if parser.inside_event else "before [DONE]"
            how = lost or ("the body ended" if parser.finished else "closed by the server")
            tracker.error = tracker.mask(f"connection closed {where} ({how})")
        self.finished.set_result(None)
        if self.transport is not None:
            self.transport.close()


async def send(
    target: Target, payload: bytes, tracker: Tracker, timeout: float, reads: Reads | None = None
) -> None:
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

    stream = Stream(payload, tracker, finished, reads or Reads(loop))
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
            tracker.error = tracker.mask(f"cannot connect: {error or 'timed out'}")
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


def arrival_offsets(count: int, request_rate: float, seed: int) -> list[float]:
    """When each of `count` requests is due, in seconds from the level's start: a Poisson
    process at `request_rate` requests/s (exponential gaps from random.Random(seed)), the
    first request at 0 as SGLang's bench_serving sends it. The same seed gives the same
    schedule, so configs compared at one rate see the same arrivals."""
    if not (isinstance(request_rate, (int, float)) and math.isfinite(request_rate)):
        raise ValueError(f"request_rate must be a finite number, got {request_rate!r}")
    if request_rate <= 0:
        raise ValueError(f"request_rate must be positive, got {request_rate!r}")
    draw = random.Random(seed)  # noqa: S311 - a reproducible schedule, not a secret
    offsets, at = [], 0.0
    for index in range(count):
        if index:
            at += draw.expovariate(request_rate)
        offsets.append(at)
    return offsets


def process_count(concurrency: int) -> int:
    """Event loops (processes) a closed-loop level at `concurrency` is spread over: one per
    STREAMS_PER_PROCESS requests in flight, at most half the cores this process may use (the
    rest are the server's, on a GPU host its tokenizer and scheduler processes)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(-(-concurrency // STREAMS_PER_PROCESS), cores // 2, MAX_PROCESSES))


async def run_level(
    target: Target,
    payloads: list[bytes],
    concurrency: int,
    timeout: float,
    max_events: int,
    *,
    request_rate: float | None = None,
    seed: int = 0,
    time_budget_s: float | None = None,
    processes: int | None = None,
) -> dict:
    """Send every payload once, in order, and time each answer.

    Closed loop (request_rate None): `concurrency` requests in flight, a new one as soon as
    one ends, spread over `processes` event loops (forked processes; None: process_count)
    when more than one. Request rate: Poisson arrivals at `request_rate` requests/s
    (arrival_offsets), scheduled against the level's start on a monotonic clock, so a late
    loop does not stretch the schedule; at most `concurrency` in flight when it is above 0
    (a request due while the cap is full waits, and its lag from its due time shows in
    client_report); one event loop. Either way no request starts once `time_budget_s` has
    passed since the level began; those in flight finish. The started requests are always
    the first `sent` payloads: trackers[i].index == i.
    """
    if time_budget_s is not None and not (time_budget_s > 0 and math.isfinite(time_budget_s)):
        raise ValueError(f"time_budget_s must be a positive number, got {time_budget_s!r}")
    count = len(payloads)
    offsets = arrival_offsets(count, request_rate, seed) if request_rate is not None else None
    budget = time_budget_s if time_budget_s is not None else math.inf
    if offsets is None:
        waves = -(-count // max(concurrency, 1))
        deadline = timeout * waves + 60
    else:
        waves = -(-count // concurrency) if concurrency > 0 else 1
        deadline = (offsets[-1] if offsets else 0.0) + timeout * waves + 60
    deadline = min(deadline, budget + timeout + 60)
    if offsets is None:
        spread = processes if processes is not None else process_count(concurrency)
        spread = min(spread, concurrency, count)
        if spread > 1 and hasattr(os, "fork"):
            level = await run_spread(
                target, payloads, concurrency, timeout, max_events, budget, deadline, spread
            )
            if level is not None:
                return level
    state = {"next": 0, "stopped": False}
    started = time.perf_counter()

    def take(index: int | None = None) -> int | None:
        """The next payload's index (or `index`, when the schedule names it), or None when
        none is left or the time budget is spent."""
        index = state["next"] if index is None else index
        if index >= count:
            return None
        if time.perf_counter() - started >= budget:
            state["stopped"] = True
            return None
        state["next"] = index + 1
        return index

    if offsets is None:
        work = closed_loop(target, payloads, min(concurrency, count), timeout, max_events, take)
    else:
        work = arrivals(
            target,
            payloads,
            offsets,
            concurrency,
            timeout,
            max_events,
            take,
            started,
            budget,
            state,
        )
    part = await measured(work, deadline)
    mark_unfinished(part["trackers"], deadline, part["ended"])
    return level_of(
        part["trackers"], started, part["ended"], [part], count, state["stopped"], request_rate
    )


def level_of(trackers, started, ended, parts, count, stopped, request_rate) -> dict:
    trackers.sort(key=lambda t: t.index)
    last = max((t.done_at or t.end for t in trackers), default=ended)
    return {
        "trackers": trackers,
        "started": started,
        "ended": last,
        "cpu_s": sum(p["cpu_s"] for p in parts),
        "lag_ms": [lag for p in parts for lag in p["lag_ms"]],
        "wall_s": ended - started,
        "processes": [{k: p[k] for k in ("cpu_s", "wall_s", "lag_ms", "requests")} for p in parts],
        "sent": len(trackers),
        "stopped_by_time_budget": bool(stopped) and len(trackers) < count,
        "request_rate": request_rate,
    }


def mark_unfinished(trackers: list[Tracker], deadline: float, ended: float) -> None:
    for tracker in trackers:
        if not tracker.end:
            tracker.error = tracker.error or f"not finished within the level's {deadline:g} s"
            tracker.end = ended


async def measured(work, deadline: float) -> dict:
    """One event loop's share of a level (`work`: a coroutine that fills the trackers list
    it returns at once, then runs), with the CPU time it took and the loop's lag meanwhile;
    what is not done within `deadline` seconds is cancelled."""
    lag: list[float] = []
    stop = asyncio.Event()
    watcher = asyncio.ensure_future(watch_loop(lag, stop))
    trackers: list[Tracker] = []
    cpu_before = time.process_time()
    began = time.perf_counter()
    task = asyncio.ensure_future(work(trackers))
    _done, pending = await asyncio.wait([task], timeout=deadline)
    for late in pending:
        late.cancel()
    if pending:
        await asyncio.wait(pending)
    ended = time.perf_counter()
    cpu = time.process_time() - cpu_before
    stop.set()
    await watcher
    return {
        "trackers": trackers,
        "cpu_s": cpu,
        "wall_s": ended - began,
        "lag_ms": lag,
        "ended": ended,
        "requests": len(trackers),
    }


def closed_loop(target, payloads, workers, timeout, max_events, take):
    async def work(trackers: list[Tracker]) -> None:
        reads = Reads(asyncio.get_running_loop())

        async def worker():
            while True:
                index = take()
                if index is None:
                    return
                tracker = Tracker(index, max_events, target.mask)
                trackers.append(tracker)
                await send(target, payloads[index], tracker, timeout, reads)

        tasks = [asyncio.ensure_future(worker()) for _ in range(workers)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    return work


def arrivals(target, payloads, offsets, cap, timeout, max_events, take, started, budget, state):
    """Start each request at its due time (offsets from `started`), at most `cap` in flight
    when cap > 0; then wait for those in flight."""

    async def work(trackers: list[Tracker]) -> None:
        reads = Reads(asyncio.get_running_loop())
        limit = asyncio.Semaphore(cap) if cap > 0 else None
        running: set[asyncio.Future] = set()

        async def one(tracker: Tracker) -> None:
            try:
                await send(target, payloads[tracker.index], tracker, timeout, reads)
            finally:
                if limit is not None:
                    limit.release()

        try:
            for index, offset in enumerate(offsets):
                if offset >= budget:
                    state["stopped"] = True  # due after the budget: not waited for
                    break
                wait = started + offset - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                if limit is not None:
                    await limit.acquire()
                if take(index) is None:
                    if limit is not None:
                        limit.release()
                    break
                tracker = Tracker(index, max_events, target.mask)
                tracker.scheduled = started + offset
                trackers.append(tracker)
                task = asyncio.ensure_future(one(tracker))
                running.add(task)
                task.add_done_callback(running.discard)
            if running:
                await asyncio.wait(list(running))
        finally:
            for task in list(running):
                task.cancel()

    return work


# -- a closed-loop level spread over forked processes ----------------------------------
#
# One event loop reads every stream of its level: at concurrency 512 a decode step's burst
# of 512 events takes it longer to read than a quarter of the step, and the level is marked
# client-saturated. Forked processes, each its own loop over a share of the requests in
# flight, take the next payload from one counter in shared memory under a lock, so
# payloads still start in file order and the time budget still leaves a prefix sent. Each
# returns its trackers, CPU time and loop lag through a pipe.

TRACKER_FIELDS = (
    "index",
    "events",
    "first",
    "last",
    "start",
    "end",
    "connected",
    "done_at",
    "error",
    "lost",
    "nbytes",
    "scheduled",
)


async def run_spread(target, payloads, concurrency, timeout, max_events, budget, deadline, spread):
    """The level over `spread` processes; None when they cannot be made (no shared memory
    for the counter's lock, no fork: the caller runs the level in this process)."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    try:
        lock = context.Lock()
        # [next payload index, 1 once the budget stopped one]; the level's start
        counter = context.RawArray("q", 2)
        begun = context.RawValue("d", 0.0)
    except OSError:
        return None
    count = len(payloads)
    parent = os.getpid()

    def take() -> int | None:
        # A worker whose module process died (OOM killer, a signal to it alone) is reparented:
        # it starts nothing more, so it ends once its requests in flight do.
        if os.getppid() != parent:
            return None
        with lock:
            index = counter[0]
            if index >= count or counter[1]:
                return None
            if time.perf_counter() - begun.value >= budget:
                counter[1] = 1
                return None
            counter[0] = index + 1
            return index

    shares = [concurrency // spread + (w < concurrency % spread) for w in range(spread)]
    children: list[tuple[int, int, int]] = []
    try:
        for share in shares:
            go_read, go_write = os.pipe()
            out_read, out_write = os.pipe()
            pid = os.fork()
            if pid == 0:
                # The worker: never returns into the caller's code.
                code = 1
                try:
                    for _pid, other_go, other_out in children:
                        os.close(other_go)
                        os.close(other_out)
                    os.close(go_write)
                    os.close(out_read)
                    worker_process(
                        target,
                        payloads,
                        share,
                        timeout,
                        max_events,
                        take,
                        deadline,
                        go_read,
                        out_write,
                    )
                    code = 0
                finally:
                    os._exit(code)
            os.close(go_read)
            os.close(out_write)
            children.append((pid, go_write, out_read))
    except OSError:
        for pid, go_write, out_read in children:
            os.close(go_write)
            os.close(out_read)
            end_child(pid)
        return None
    begun.value = started = time.perf_counter()
    try:
        for _pid, go_write, _out in children:
            os.write(go_write, b"g")
            os.close(go_write)
        blobs = await read_pipes([out for _pid, _go, out in children], deadline + 30)
    finally:
        # Also when this level is cancelled: no worker outlives it.
        for pid, _go, _out in children:
            end_child(pid)
    ended = time.perf_counter()
    trackers, parts, problems = [], [], []
    for blob in blobs:
        try:
            # Bytes from this level's own forked worker, through a pipe only the two hold.
            part = pickle.loads(blob) if blob else {"error": "it ended without a result"}  # noqa: S301
        except (pickle.UnpicklingError, EOFError, ValueError) as error:
            part = {"error": f"its result was cut ({error})"}
        if "error" in part:
            problems.append(part["error"])
            continue
        for fields in part.pop("trackers"):
            tracker = Tracker(fields[0], max_events, target.mask)
            for name, value in zip(TRACKER_FIELDS, fields, strict=True):
                setattr(tracker, name, value)
            trackers.append(tracker)
        parts.append(part)
    # Requests a failed worker had started are kept, failed, so the sent ones stay the
    # first `sent` payloads.
    have = {t.index for t in trackers}
    for index in range(counter[0]):
        if index not in have:
            tracker = Tracker(index, max_events, target.mask)
            tracker.start = tracker.end = ended
            tracker.error = "the worker process running it failed: " + "; ".join(problems)[:300]
            trackers.append(tracker)
    if not parts:
        parts = [{"cpu_s": 0.0, "wall_s": ended - started, "lag_ms": [], "requests": 0}]
    return level_of(trackers, started, ended, parts, count, counter[1], None)


def worker_process(target, payloads, share, timeout, max_events, take, deadline, go, out):
    """A forked worker: wait for the start, run `share` requests in flight on a loop of its
    own, write its trackers and measures to `out`."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        ready, _, _ = select.select([go], [], [], START_WAIT_S)
        if not ready or os.read(go, 1) != b"g":
            return
        try:
            work = closed_loop(target, payloads, share, timeout, max_events, take)
            part = loop.run_until_complete(measured(work, deadline))
            mark_unfinished(part["trackers"], deadline, part["ended"])
            part["trackers"] = [
                tuple(getattr(t, name) for name in TRACKER_FIELDS) for t in part["trackers"]
            ]
        except Exception as error:  # said to the parent, which reports it
            part = {"error": f"{type(error).__name__}: {target.mask(str(error))[:200]}"}
        blob = memoryview(pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL))
        while blob:
            blob = blob[os.write(out, blob) :]
    finally:
        loop.close()


async def read_pipes(fds: list[int], wait_s: float) -> list[bytes]:
    """Everything written to each pipe until its writer closed it, within `wait_s` seconds
    (what came later is cut off)."""
    loop = asyncio.get_running_loop()
    chunks: dict[int, list[bytes]] = {fd: [] for fd in fds}
    open_fds = set(fds)
    done = loop.create_future()

    def readable(fd: int) -> None:
        try:
            piece = os.read(fd, 1 << 20)
        except BlockingIOError:
            return
        except OSError:
            piece = b""
        if piece:
            chunks[fd].append(piece)
            return
        loop.remove_reader(fd)
        open_fds.discard(fd)
        if not open_fds and not done.done():
            done.set_result(None)

    for fd in fds:
        os.set_blocking(fd, False)
        loop.add_reader(fd, readable, fd)
    try:
        await asyncio.wait_for(done, wait_s)
    except asyncio.TimeoutError:  # noqa: UP041 - not the builtin before Python 3.11
        pass
    finally:
        for fd in open_fds:
            loop.remove_reader(fd)
        for fd in fds:
            os.close(fd)
    return [b"".join(chunks[fd]) for fd in fds]


def end_child(pid: int) -> None:
    """Reap a worker: it exits once its result is written; one still running past the
    level's deadline is killed."""
    for _ in range(50):
        done, _status = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.01)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


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
    except (ValueError, RecursionError) as error:
        record["error"] = f"undecodable event: {str(error)[:200]}"
        return record, []
    problem = event_problem(first) or event_problem(last)
    if problem:
        record["error"] = tracker.mask(problem)
        return record, []
    meta, first_meta = last["meta_info"], first["meta_info"]
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
        text=last.get("text"),
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


# meta_info fields read from the server and what each must be when present (SGLang 0.5.23,
# tokenizer_manager.py _handle_batch_output, _calculate_spec_decoding_metrics).
COUNT_FIELDS = (
    "completion_tokens",
    "prompt_tokens",
    "cached_tokens",
    "spec_verify_ct",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
)
NUMBER_FIELDS = ("spec_accept_length", "spec_accept_rate")


def event_problem(data) -> str | None:
    """What makes one decoded event unusable, or None: an object whose meta_info is an
    object with a completion_tokens count, and whose other fields the benchmark reads have
    their types (counts, non-negative numbers, text a string, output_ids counts)."""
    if not isinstance(data, dict):
        return f"event is not a JSON object but {type(data).__name__}"
    meta = data.get("meta_info")
    if not isinstance(meta, dict):
        return f"event without a meta_info object (meta_info is {type(meta).__name__})"
    if "completion_tokens" not in meta:
        return "event without meta_info.completion_tokens"
    if not counted(meta["completion_tokens"]):
        return f"meta_info.completion_tokens is not a count: {shown(meta['completion_tokens'])}"
    for name in COUNT_FIELDS:
        if name in meta and meta[name] is not None and not counted(meta[name]):
            return f"meta_info.{name} is not a count: {shown(meta[name])}"
    for name in NUMBER_FIELDS:
        if name in meta and meta[name] is not None and not number(meta[name]):
            return f"meta_info.{name} is not a non-negative number: {shown(meta[name])}"
    histogram = meta.get("spec_correct_drafts_histogram")
    if histogram is not None and not (
        isinstance(histogram, list) and all(counted(item) for item in histogram)
    ):
        return "meta_info.spec_correct_drafts_histogram is not a list of counts: " + shown(
            histogram
        )
    finish = meta.get("finish_reason")
    if finish is not None and not isinstance(finish, dict):
        return f"meta_info.finish_reason is not an object: {shown(finish)}"
    if data.get("text") is not None and not isinstance(data["text"], str):
        return f"text is not a string: {shown(data['text'])}"
    if data.get("output_ids") is not None and token_ids(data["output_ids"]) is None:
        return f"output_ids is not a list of token ids: {shown(data['output_ids'])}"
    return None


def shown(value) -> str:
    return repr(value)[:60]


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
            info = load_json(body, "/server_info")
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
        state["error"] = target.mask(str(error))[:300]
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
        except (OSError, ValueError) as error:
            status, body = None, str(error).encode()
        if status == 200:
            return "flushed"
        last = f"HTTP {status}: {target.mask(body.decode('utf-8', 'replace'))[:200].strip()}"
        if status in (401, 403, 404, 405):
            break  # asking again will not change the answer
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    return f"not flushed ({last})"


def client_report(level: dict, events: int) -> dict:
    """Whether the client limited what it measured. A level spread over several processes is
    judged process by process: each is an event loop of its own, and one falling behind
    delays its streams' stamps whatever the others do."""
    duration = max(level["ended"] - level["started"], 1e-9)
    parts = level.get("processes") or [
        {"cpu_s": level["cpu_s"], "wall_s": level["wall_s"], "lag_ms": level["lag_ms"]}
    ]
    lag = distribution(level["lag_ms"])
    gaps = [
        (t.events[-1][0] - t.events[0][0]) * 1000.0 / (len(t.events) - 1)
        for t in level["trackers"]
        if len(t.events) > 1
    ]
    event_gap = sum(gaps) / len(gaps) if gaps else 0.0
    reasons = []
    fractions, lag_p99s = [], []
    for number, part in enumerate(parts, 1):
        cpu_fraction = part["cpu_s"] / max(part["wall_s"], 1e-9)
        lag_p99 = distribution(part["lag_ms"])["p99"] or 0.0
        fractions.append(round(cpu_fraction, 4))
        lag_p99s.append(lag_p99)
        which = f"process {number} of {len(parts)}: " if len(parts) > 1 else ""
        if cpu_fraction >= SATURATED_CPU:
            reasons.append(f"{which}client CPU {cpu_fraction:.0%} of one core")
        # Events come in bursts, one per decode step: a loop still busy with one burst when
        # the next is due is falling behind, whatever its average CPU use.
        if cpu_fraction >= BUSY_CPU and event_gap and lag_p99 >= BEHIND_SHARE * event_gap:
            reasons.append(
                f"{which}event-loop lag p99 {lag_p99:.2f} ms against {event_gap:.2f} ms "
                f"between a request's events, at {cpu_fraction:.0%} CPU"
            )
    cpu_fraction = max(fractions)
    lag_p99 = max(lag_p99s)
    warnings = []
    if lag_p99 >= LATE_LAG_P99_MS and not reasons:
        warnings.append(
            f"event-loop lag p99 {lag_p99:.2f} ms while the client used {cpu_fraction:.0%} "
            "of a core: other processes compete for the CPU; timings are less precise"
        )
    report = {
        "cpu_s": round(level["cpu_s"], 4),
        # The busiest process's share of one core (every one's below, when several).
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
    if len(parts) > 1:
        report["processes"] = len(parts)
        report["process_cpu_fractions"] = fractions
    # A request-rate level: how late each request started against its schedule (the loop
    # being late, or the in-flight cap being full).
    lags = [(t.start - t.scheduled) * 1000.0 for t in level["trackers"] if t.scheduled is not None]
    if lags:
        report["arrival_lag_ms"] = distribution(lags)
    return report
