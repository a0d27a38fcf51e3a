"""The benchmark's HTTP/SSE client: requests to SGLang's streaming /generate, timed per event.

Runs on the host that drives the benchmark (the module ships it there with the module), with
the standard library only. run_level, here, keeps `concurrency` requests in flight (a closed
loop, spread over forked processes when high: client_spread.py) or starts them at Poisson
arrival times (a request rate), within a time budget. The parts: client_target.py (where to
send, and the server calls around a level: server_state, flush_cache), client_stream.py (one
request: Stream stamps each read as it arrives, a Tracker keeps its events), client_loops.py
(one event loop's share of a level), client_report.py (record_of turns a Tracker into the
level file's request record; client_report says whether the client itself was the limit).
"""

from __future__ import annotations

import math
import os
import random
import time

from ansible.module_utils.benchmark.client_loops import (
    arrivals,
    closed_loop,
    level_of,
    mark_unfinished,
    measured,
)
from ansible.module_utils.benchmark.client_spread import run_spread
from ansible.module_utils.benchmark.client_target import Target

# A closed-loop level is spread over one event loop (a forked process) per this many
# requests in flight: a decode step's burst of events, one per request, must be read well
# within a quarter of the step (see client_report). MAX_PROCESSES bounds the fork count.
STREAMS_PER_PROCESS = 64
MAX_PROCESSES = 32


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


def level_deadline(count, offsets, concurrency, timeout, budget) -> float:
    """Seconds after which what a level has not finished is cancelled: a request timeout per
    wave of `concurrency` requests (after the last arrival, at a request rate), and a
    timeout past the time budget at most."""
    if offsets is None:
        waves = -(-count // max(concurrency, 1))
        deadline = timeout * waves + 60
    else:
        waves = -(-count // concurrency) if concurrency > 0 else 1
        deadline = (offsets[-1] if offsets else 0.0) + timeout * waves + 60
    return min(deadline, budget + timeout + 60)


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
    deadline = level_deadline(count, offsets, concurrency, timeout, budget)
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
