"""One request of the benchmark's client: sent over its own connection, its answer stamped
read by read as it arrives (Stream, Reads) and kept event by event (Tracker).

Runs on the host that drives the benchmark, with the standard library only.
"""

from __future__ import annotations

import asyncio
import json
import time

from ansible.module_utils.benchmark.client_events import event_problem
from ansible.module_utils.benchmark.client_target import Target
from ansible.module_utils.benchmark.stream import ResponseParser, StreamError, completion_tokens


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
