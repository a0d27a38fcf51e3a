"""One event loop's share of a level: a closed loop (a new request as soon as one ends) or
requests started at their arrival times, measured (CPU time, the loop's lag) and bounded by
the level's deadline.

Runs on the host that drives the benchmark, with the standard library only.
"""

from __future__ import annotations

import asyncio
import time

from ansible.module_utils.benchmark.client_stream import Reads, Tracker, send

# How often the loop's lag is sampled (a short sleep, and how late it wakes up).
LAG_INTERVAL_S = 0.005


async def watch_loop(samples: list[float], stop: asyncio.Event) -> None:
    """Event-loop lag: how late a short sleep wakes up."""
    while not stop.is_set():
        before = time.perf_counter()
        await asyncio.sleep(LAG_INTERVAL_S)
        samples.append((time.perf_counter() - before - LAG_INTERVAL_S) * 1000.0)


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
