"""The benchmark client's level runner: Poisson arrivals, the in-flight cap, the time budget
and which requests a level keeps, against the simulator (short steps) or a local server that
holds every answer until told to go on."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import pickle
import signal
import statistics
import threading
import time

import pytest
from ansible.module_utils.benchmark import client as benchmark_client
from ansible.module_utils.benchmark.client import level_deadline
from ansible.module_utils.benchmark.client_report import client_report
from ansible.module_utils.benchmark.client_spread import TRACKER_FIELDS, failed_requests, gathered
from ansible.module_utils.benchmark.client_stream import Tracker
from ansible.module_utils.benchmark.client_target import Target

from tests.support.sim_process import BASE, start, stop

pytestmark = pytest.mark.benchmark


def test_poisson_schedule_of_a_seed_is_fixed_and_has_the_rate_it_was_asked():
    offsets = benchmark_client.arrival_offsets(4000, 8.0, seed=7)
    assert offsets == benchmark_client.arrival_offsets(4000, 8.0, seed=7)
    assert offsets != benchmark_client.arrival_offsets(4000, 8.0, seed=8)
    assert offsets[0] == 0.0
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert all(gap >= 0 for gap in gaps)
    # Exponential gaps of mean 1/8 s: over 3999 of them the sample mean is within 5% (its
    # standard error is 1.6%), and their spread equals their mean, as a Poisson process's.
    assert statistics.fmean(gaps) == pytest.approx(0.125, rel=0.05)
    assert statistics.pstdev(gaps) == pytest.approx(0.125, rel=0.08)
    # Not evenly spaced: a share of gaps under a tenth of the mean, none for a fixed rate.
    assert sum(gap < 0.0125 for gap in gaps) / len(gaps) == pytest.approx(0.095, abs=0.02)


@pytest.mark.parametrize("rate", [0, -1.0, float("inf"), float("nan")])
def test_a_rate_that_is_no_rate_is_refused(rate):
    with pytest.raises(ValueError, match="request_rate"):
        benchmark_client.arrival_offsets(3, rate, 0)


@pytest.fixture(scope="module")
def simulator():
    env = {"SGLANG_SIM_STEP_MS": 2, "SGLANG_SIM_PREFILL_MS": 2, "SGLANG_SIM_ACCEPT": 1}
    process, url = start(BASE, **env)
    try:
        yield url
    finally:
        stop(process)


def payloads_for(target, count: int, tokens: int = 8) -> list[bytes]:
    body = {"max_new_tokens": tokens, "temperature": 0.0}
    return [
        target.request({"text": f"question {i}", "sampling_params": body, "stream": True})
        for i in range(count)
    ]


def run(coroutine):
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


def peak_in_flight(trackers) -> int:
    edges = sorted([(t.start, 1) for t in trackers] + [(t.end, -1) for t in trackers])
    peak = running = 0
    for _when, change in edges:
        running += change
        peak = max(peak, running)
    return peak


def test_closed_loop_sends_every_payload_once_and_keeps_them_in_order(simulator):
    target = Target(simulator, "")
    level = run(benchmark_client.run_level(target, payloads_for(target, 12), 4, 60, 64))
    assert level["sent"] == 12 and not level["stopped_by_time_budget"]
    assert [t.index for t in level["trackers"]] == list(range(12))
    assert all(not t.error and t.done_at for t in level["trackers"])
    assert all(t.scheduled is None for t in level["trackers"])
    assert 1 < peak_in_flight(level["trackers"]) <= 4
    report = client_report(level, sum(len(t.events) for t in level["trackers"]))
    assert "arrival_lag_ms" not in report


def test_rate_mode_starts_requests_on_their_schedule_and_reports_their_lag(simulator):
    target = Target(simulator, "")
    payloads = payloads_for(target, 10)
    level = run(benchmark_client.run_level(target, payloads, 0, 60, 64, request_rate=50.0, seed=3))
    offsets = benchmark_client.arrival_offsets(10, 50.0, 3)
    assert level["sent"] == 10 and level["request_rate"] == 50.0
    for tracker, offset in zip(level["trackers"], offsets, strict=True):
        assert tracker.scheduled == pytest.approx(level["started"] + offset, abs=1e-9)
        assert tracker.start >= tracker.scheduled
        assert not tracker.error
    report = client_report(level, sum(len(t.events) for t in level["trackers"]))
    assert report["arrival_lag_ms"]["count"] == 10
    assert report["arrival_lag_ms"]["p50"] >= 0


class HeldServer:
    """A local HTTP server whose answers wait until `release` is set: how many requests the
    client had open at once is then exact, not a matter of timing. With `release_after`
    (requests, seconds) it sets `release` itself that long after that many are open at once:
    a hold measured from the requests' arrival, not from before the client started (a
    client's fork can take a second on a loaded machine)."""

    def __init__(self, release_after: tuple[int, float] | None = None):
        self.release = threading.Event()
        self.release_after = release_after
        self.open = 0
        self.peak = 0
        self.total = 0
        self.lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self.serve, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(10)

    def serve(self, ready):
        asyncio.set_event_loop(self.loop)

        async def handle(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            with self.lock:
                self.open += 1
                self.total += 1
                self.peak = max(self.peak, self.open)
                if self.release_after and self.open >= self.release_after[0]:
                    self.loop.call_later(self.release_after[1], self.release.set)
                    self.release_after = None
            while not self.release.is_set():
                await asyncio.sleep(0.005)
            event = b'data: {"text":"a","meta_info":{"completion_tokens":1}}\n\ndata: [DONE]\n\n'
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"content-length: %d\r\n\r\n" % len(event) + event
            )
            await writer.drain()
            with self.lock:
                self.open -= 1
            writer.close()

        async def main():
            self.closing = asyncio.Event()
            server = await asyncio.start_server(handle, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            async with server:
                await self.closing.wait()

        self.loop.run_until_complete(main())
        self.loop.close()

    def close(self):
        self.release.set()
        self.loop.call_soon_threadsafe(self.closing.set)
        self.thread.join(10)


def test_rate_mode_never_has_more_in_flight_than_its_cap():
    # 1000 requests/s: all 12 are due within a few ms, and the server holds each answer
    # until 0.5 s after every request the cap lets out has arrived.
    server = HeldServer(release_after=(3, 0.5))
    try:
        target = Target(f"http://127.0.0.1:{server.port}", "")
        level = run(
            benchmark_client.run_level(
                target, payloads_for(target, 12), 3, 60, 64, request_rate=1000.0
            )
        )
    finally:
        server.close()
    assert level["sent"] == 12
    assert all(not t.error for t in level["trackers"]), level["trackers"][0].error
    assert server.peak == 3
    assert peak_in_flight(level["trackers"]) == 3
    # The ones the cap held started late against their schedule, and the report says so.
    report = client_report(level, 12)
    assert report["arrival_lag_ms"]["max"] >= 400


@pytest.mark.parametrize("rate", [None, 1000.0])
def test_the_time_budget_stops_new_requests_and_keeps_only_those_started(rate):
    # Two in flight, held 1 s: the budget of 0.3 s passes while the first two run, so no
    # third one starts; the two finish.
    server = HeldServer(release_after=(2, 1.0))
    try:
        target = Target(f"http://127.0.0.1:{server.port}", "")
        level = run(
            benchmark_client.run_level(
                target, payloads_for(target, 10), 2, 60, 64, request_rate=rate, time_budget_s=0.3
            )
        )
    finally:
        server.close()
    assert level["sent"] == 2 and level["stopped_by_time_budget"]
    assert [t.index for t in level["trackers"]] == [0, 1]
    assert all(not t.error and t.done_at for t in level["trackers"])


def test_a_budget_that_outlasts_the_level_stops_nothing(simulator):
    target = Target(simulator, "")
    level = run(
        benchmark_client.run_level(target, payloads_for(target, 5), 2, 60, 64, time_budget_s=600)
    )
    assert level["sent"] == 5 and not level["stopped_by_time_budget"]


@pytest.mark.parametrize("budget", [0, -1, float("nan")])
def test_a_budget_that_is_no_budget_is_refused(budget):
    with pytest.raises(ValueError, match="time_budget_s"):
        run(benchmark_client.run_level(None, [], 1, 1, 1, time_budget_s=budget))


def test_a_level_spread_over_processes_sends_each_payload_once_in_order(simulator):
    target = Target(simulator, "")
    level = run(
        benchmark_client.run_level(target, payloads_for(target, 24), 6, 60, 64, processes=3)
    )
    assert level["sent"] == 24 and not level["stopped_by_time_budget"]
    assert [t.index for t in level["trackers"]] == list(range(24))
    assert all(not t.error and t.done_at and t.events for t in level["trackers"])
    # Each process ran its share: two requests in flight each, six in all.
    assert len(level["processes"]) == 3
    assert all(p["requests"] >= 2 for p in level["processes"])
    assert sum(p["requests"] for p in level["processes"]) == 24
    assert 1 < peak_in_flight(level["trackers"]) <= 6
    # Every tracker came back whole: the same answer as the simulator gives one process.
    alone = run(benchmark_client.run_level(target, payloads_for(target, 1), 1, 60, 64))
    spread, single = (json.loads(t["trackers"][0].last) for t in (level, alone))
    assert spread["output_ids"] == single["output_ids"] and spread["text"] == single["text"]
    assert spread["meta_info"]["completion_tokens"] == 8
    report = client_report(level, sum(len(t.events) for t in level["trackers"]))
    assert report["processes"] == 3 and len(report["process_cpu_fractions"]) == 3


def test_processes_share_one_time_budget_and_leave_a_prefix_sent():
    # Four in flight over two processes, held 2.5 s from their arrival: the budget of 2 s
    # (time for both forked workers to start, on a loaded machine too) passes while they run.
    server = HeldServer(release_after=(4, 2.5))
    try:
        target = Target(f"http://127.0.0.1:{server.port}", "")
        level = run(
            benchmark_client.run_level(
                target, payloads_for(target, 20), 4, 60, 64, time_budget_s=2.0, processes=2
            )
        )
    finally:
        server.close()
    assert level["sent"] == 4 and level["stopped_by_time_budget"]
    assert [t.index for t in level["trackers"]] == [0, 1, 2, 3]
    assert all(not t.error for t in level["trackers"])
    assert server.peak == 4


def test_one_process_behind_marks_a_spread_level_saturated():
    tracker = Tracker(0, 100)
    tracker.events = [(i * 0.02, 3 * (i + 1)) for i in range(10)]
    calm = {"cpu_s": 0.1, "wall_s": 1.0, "lag_ms": [0.3] * 100, "requests": 1}
    behind = {"cpu_s": 0.5, "wall_s": 1.0, "lag_ms": [6.0] * 100, "requests": 1}
    level = {
        "trackers": [tracker],
        "started": 0.0,
        "ended": 1.0,
        "wall_s": 1.0,
        "cpu_s": 0.6,
        "lag_ms": calm["lag_ms"] + behind["lag_ms"],
        "processes": [calm, behind],
    }
    report = client_report(level, 10)
    assert report["saturated"] and report["saturated_reasons"][0].startswith("process 2 of 2")
    assert report["cpu_fraction"] == 0.5 and report["process_cpu_fractions"] == [0.1, 0.5]
    level["processes"] = [calm, calm]
    assert not client_report(level, 10)["saturated"]


def test_the_workers_of_a_module_that_died_start_nothing_more():
    """The module process killed alone (the OOM killer, say) mid-level: its forked workers
    finish the requests they have in flight and start no other."""
    server = HeldServer()
    try:
        target = Target(f"http://127.0.0.1:{server.port}", "")
        payloads = payloads_for(target, 40)
        module = os.fork()
        if module == 0:
            try:
                run(benchmark_client.run_level(target, payloads, 4, 60, 64, processes=2))
            finally:
                os._exit(0)
        deadline = time.monotonic() + 20
        while server.peak < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(module, signal.SIGKILL)
        os.waitpid(module, 0)
        server.release.set()
        # Orphans that went on would start their next requests within milliseconds.
        time.sleep(1.0)
        assert (server.peak, server.total) == (4, 4)
    finally:
        server.release.set()
        server.close()


def test_a_levels_deadline_is_a_timeout_per_wave_within_the_time_budget():
    # 10 requests, 4 in flight: 3 waves of a 5 s timeout, and a minute's margin.
    assert level_deadline(10, None, 4, 5.0, math.inf) == 3 * 5.0 + 60
    # At a rate: the waves start after the last arrival; without a cap all are one wave.
    assert level_deadline(10, [0.0, 2.5], 4, 5.0, math.inf) == 2.5 + 3 * 5.0 + 60
    assert level_deadline(10, [0.0, 2.5], 0, 5.0, math.inf) == 2.5 + 5.0 + 60
    # The time budget bounds it: the last request starts before it and has its timeout.
    assert level_deadline(1000, None, 1, 5.0, 30.0) == 30.0 + 5.0 + 60


def test_a_spread_level_keeps_the_requests_of_a_worker_that_failed_as_failed():
    """A worker that sent nothing back, or a result cut short, is a problem; the requests it
    had taken are kept failed with the reason, so the sent ones stay the first payloads."""
    tracker = Tracker(0, 100)
    tracker.events, tracker.start, tracker.end, tracker.nbytes = [(1.0, 3)], 0.5, 1.5, 42
    part = {
        "trackers": [tuple(getattr(tracker, name) for name in TRACKER_FIELDS)],
        "cpu_s": 0.1,
        "wall_s": 1.0,
        "lag_ms": [0.2],
        "requests": 1,
    }
    blobs = [pickle.dumps(part), b"", pickle.dumps(part)[:10]]
    trackers, parts, problems = gathered(blobs, 100, str)
    assert [(t.index, t.events, t.nbytes, t.end) for t in trackers] == [(0, [(1.0, 3)], 42, 1.5)]
    assert parts == [{"cpu_s": 0.1, "wall_s": 1.0, "lag_ms": [0.2], "requests": 1}]
    assert problems[0] == "it ended without a result"
    assert problems[1].startswith("its result was cut")
    failed = failed_requests(3, trackers, problems, 9.0, 100, str)
    assert [(t.index, t.start, t.end) for t in failed] == [(1, 9.0, 9.0), (2, 9.0, 9.0)]
    assert all(t.error.startswith("the worker process running it failed: it ended") for t in failed)
