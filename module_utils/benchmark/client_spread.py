"""A closed-loop level spread over forked processes, each an event loop of its own.

One event loop reads every stream of its level: at concurrency 512 a decode step's burst of
512 events takes it longer to read than a quarter of the step, and the level is marked
client-saturated. Forked processes, each its own loop over a share of the requests in
flight, take the next payload from one counter in shared memory under a lock, so payloads
still start in file order and the time budget still leaves a prefix sent. Each returns its
trackers, CPU time and loop lag through a pipe.

Runs on the host that drives the benchmark, with the standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import select
import signal
import time

from ansible.module_utils.benchmark.client_loops import (
    closed_loop,
    level_of,
    mark_unfinished,
    measured,
)
from ansible.module_utils.benchmark.client_stream import Tracker

# How long a worker waits for the level's start before giving up.
START_WAIT_S = 60.0
# What a worker sends back of each of its trackers, in this order.
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
    take = shared_take(lock, counter, begun, count, budget)
    shares = [concurrency // spread + (w < concurrency % spread) for w in range(spread)]

    def work(share: int, go: int, out: int) -> None:
        worker_process(target, payloads, share, timeout, max_events, take, deadline, go, out)

    children = fork_workers(shares, work)
    if children is None:
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
    trackers, parts, problems = gathered(blobs, max_events, target.mask)
    trackers += failed_requests(counter[0], trackers, problems, ended, max_events, target.mask)
    if not parts:
        parts = [{"cpu_s": 0.0, "wall_s": ended - started, "lag_ms": [], "requests": 0}]
    return level_of(trackers, started, ended, parts, count, counter[1], None)


def shared_take(lock, counter, begun, count: int, budget: float):
    """The workers' take(): the next payload's index from the counter they share, or None
    once none is left or the time budget is spent (which it marks in counter[1])."""
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

    return take


def fork_workers(shares: list[int], work) -> list[tuple[int, int, int]] | None:
    """A forked worker per share, running work(share, start pipe, result pipe) and exiting;
    (pid, start pipe's writing end, result pipe's reading end) of each. None when a pipe or a
    fork fails: the workers already forked are ended."""
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
                    work(share, go_read, out_write)
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
    return children


def gathered(blobs: list[bytes], max_events: int, mask) -> tuple[list, list, list]:
    """(trackers, measures, problems) from the workers' results: each worker's trackers
    rebuilt, its CPU time and lag as its part, or what went wrong with it."""
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
            tracker = Tracker(fields[0], max_events, mask)
            for name, value in zip(TRACKER_FIELDS, fields, strict=True):
                setattr(tracker, name, value)
            trackers.append(tracker)
        parts.append(part)
    return trackers, parts, problems


def failed_requests(taken: int, trackers, problems, ended, max_events, mask) -> list[Tracker]:
    """The requests a failed worker had started (of the first `taken`), kept as failed, so
    the sent ones stay the first `sent` payloads."""
    have = {t.index for t in trackers}
    failed = []
    for index in range(taken):
        if index not in have:
            tracker = Tracker(index, max_events, mask)
            tracker.start = tracker.end = ended
            tracker.error = "the worker process running it failed: " + "; ".join(problems)[:300]
            failed.append(tracker)
    return failed


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
