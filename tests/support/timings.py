"""Where the suite's time goes: the slowest tests, the files that use the most CPU, and each
phase's wall time.

A pytest plugin (tests/conftest.py loads it) and a program. In a pytest run it prints, at the
end, the SLOWEST tests by their whole time (setup, call and teardown: a module's first test
carries its fixture, which is the cost worth seeing), the SLOWEST_FILES files by their tests'
time added up, each phase's test time added up over the xdist workers (phases share the
workers, so a phase's wall time says when it ran, its added-up time what it cost) and each
phase's wall time, from its first test's start to its last test's end, across the workers.
The suite is CPU-bound on two cores, so each file's CPU is the cost that counts: every worker
(CpuMeter, which runs in each xdist worker) measures its own process's CPU and that of the
processes it waited for (test hosts, ansible-playbook, simulators: getrusage's children) from a
test's setup to its teardown, and the controller adds them up per file (a file runs in one
worker: --dist loadfile). Processes that outlive their test are counted when they are reaped.
Where KIT_TIMINGS_FILE names a file it writes the same figures there as JSON, which

    python -m tests.support.timings FILE --phase lint=SECONDS --phase syntax=SECONDS ...

prints as the last lines of make test, beside the lint and syntax phases it timed itself.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from pathlib import Path

SLOWEST = 20
SLOWEST_FILES = 10
# A test's phase is its top folder under tests/.
PHASES = ("unit", "contract", "integration")


def phase_of(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


def cpu_seconds() -> float:
    """This process's CPU and that of the children it waited for, user and system."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class CpuMeter:
    """In each process that runs tests: a test's CPU from its setup to its teardown, handed to
    the controller on the teardown report (user_properties travel with xdist's reports)."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}

    def pytest_runtest_setup(self, item) -> None:
        self.started[item.nodeid] = cpu_seconds()

    def pytest_runtest_makereport(self, item, call) -> None:
        if call.when == "teardown" and item.nodeid in self.started:
            used = cpu_seconds() - self.started.pop(item.nodeid)
            item.user_properties.append(("cpu_s", round(used, 3)))


class Timings:
    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.per_test: dict[str, float] = {}
        self.cpu_per_test: dict[str, float] = {}
        self.spans: dict[str, list[float]] = {}
        # Per xdist worker, its files in the order it ran them, each [path, start, stop]: a
        # worker that ends long before the others shows CPU the suite's end left unused.
        self.workers: dict[str, list[list]] = {}

    def pytest_runtest_logreport(self, report) -> None:
        # Under xdist the controller gets every worker's reports, start and stop included.
        self.per_test[report.nodeid] = self.per_test.get(report.nodeid, 0.0) + report.duration
        for name, value in getattr(report, "user_properties", ()):
            if name == "cpu_s" and isinstance(value, (int, float)):
                path = report.nodeid.split("::")[0]
                self.cpu[path] = self.cpu.get(path, 0.0) + value
                self.cpu_per_test[report.nodeid] = value
        start, stop = getattr(report, "start", 0.0), getattr(report, "stop", 0.0)
        if start and stop:
            span = self.spans.setdefault(phase_of(report.nodeid), [start, stop])
            span[0], span[1] = min(span[0], start), max(span[1], stop)
            ran = self.workers.setdefault(worker_of(report), [])
            path = report.nodeid.split("::")[0]
            if ran and ran[-1][0] == path:
                ran[-1][1], ran[-1][2] = min(ran[-1][1], start), max(ran[-1][2], stop)
            else:
                ran.append([path, start, stop])

    def figures(self) -> dict:
        first = min((start for ran in self.workers.values() for _, start, _ in ran), default=0.0)
        slowest = sorted(self.per_test.items(), key=lambda item: item[1], reverse=True)
        per_file: dict[str, float] = {}
        per_phase: dict[str, float] = {}
        for nodeid, seconds in self.per_test.items():
            path = nodeid.split("::")[0]
            per_file[path] = per_file.get(path, 0.0) + seconds
            per_phase[phase_of(nodeid)] = per_phase.get(phase_of(nodeid), 0.0) + seconds
        files = sorted(per_file.items(), key=lambda item: item[1], reverse=True)
        cpu_files = sorted(self.cpu.items(), key=lambda item: item[1], reverse=True)
        cpu_phases: dict[str, float] = {}
        for path, seconds in self.cpu.items():
            cpu_phases[phase_of(path + "::")] = cpu_phases.get(phase_of(path + "::"), 0.0) + seconds
        return {
            "cpu_files": [[path, round(seconds, 1)] for path, seconds in cpu_files[:SLOWEST_FILES]],
            "all_cpu_files": [[path, round(seconds, 1)] for path, seconds in cpu_files],
            # Each test's CPU (the JSON file only): where a costly file spends it.
            "cpu_tests": [
                [nodeid, round(seconds, 2)]
                for nodeid, seconds in sorted(self.cpu_per_test.items(), key=lambda item: -item[1])
            ],
            "cpu": {
                phase: round(seconds, 1)
                for phase, seconds in sorted(cpu_phases.items(), key=_phase_rank)
            },
            "slowest": [[nodeid, round(seconds, 2)] for nodeid, seconds in slowest[:SLOWEST]],
            "files": [[path, round(seconds, 1)] for path, seconds in files[:SLOWEST_FILES]],
            # Every file, for a profile beyond the printed ten (the JSON file only).
            "all_files": [[path, round(seconds, 1)] for path, seconds in files],
            "test_time": {
                phase: round(seconds, 1)
                for phase, seconds in sorted(per_phase.items(), key=_phase_rank)
            },
            "phases": {
                phase: round(stop - start, 1)
                for phase, (start, stop) in sorted(self.spans.items(), key=_phase_rank)
            },
            "tests": len(self.per_test),
            # Seconds after the first test's start: when each worker finished its last test,
            # and (the JSON file only) each file it ran, with its span.
            "worker_ends": {
                worker: round(max(stop for _, _, stop in ran) - first, 1)
                for worker, ran in sorted(self.workers.items())
            },
            "workers": {
                worker: [
                    [path, round(start - first, 1), round(stop - first, 1)]
                    for path, start, stop in ran
                ]
                for worker, ran in sorted(self.workers.items())
            },
        }

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.per_test:
            return
        figures = self.figures()
        for line in summary_lines(figures):
            terminalreporter.write_line(line)
        target = os.environ.get("KIT_TIMINGS_FILE")
        if target:
            Path(target).write_text(json.dumps(figures, indent=1) + "\n")


def worker_of(report) -> str:
    """The xdist worker that ran the test (gw0, gw1, ...); "main" without xdist."""
    node = getattr(report, "node", None)
    return str(getattr(node, "workerinput", {}).get("workerid", "main"))


def _phase_rank(item) -> int:
    return PHASES.index(item[0]) if item[0] in PHASES else len(PHASES)


def summary_lines(figures: dict, phases_outside: dict | None = None) -> list[str]:
    lines = [f"slowest {len(figures['slowest'])} tests (setup + call + teardown):"]
    lines += [f"  {seconds:8.1f} s  {nodeid}" for nodeid, seconds in figures["slowest"]]
    if figures.get("files"):
        lines.append(f"slowest {len(figures['files'])} files (their tests' time added up):")
        lines += [f"  {seconds:8.1f} s  {path}" for path, seconds in figures["files"]]
    if figures.get("cpu_files"):
        lines.append(
            f"most CPU {len(figures['cpu_files'])} files (their processes and the ones they "
            "waited for):"
        )
        lines += [f"  {seconds:8.1f} s  {path}" for path, seconds in figures["cpu_files"]]
    if figures.get("cpu"):
        lines.append(
            "phase CPU: "
            + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in figures["cpu"].items())
        )
    if figures.get("test_time"):
        lines.append(
            "phase test time (added up over the workers): "
            + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in figures["test_time"].items())
        )
    if len(figures.get("worker_ends") or {}) > 1:
        lines.append(
            "workers' last test ended (s after the first test started): "
            + ", ".join(f"{name} {seconds:.0f}" for name, seconds in figures["worker_ends"].items())
        )
    outside = dict(phases_outside or {})
    total = outside.pop("total", None)
    walls = {**outside, **figures["phases"], **({} if total is None else {"total": total})}
    lines.append(
        "phase wall times: "
        + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in walls.items())
    )
    return lines


def plugins_for(config) -> list:
    """The meter in every process that runs tests (each xdist worker, or the one process
    without xdist); the summary only in the process that sees every report."""
    found: list = [CpuMeter()]
    if not hasattr(config, "workerinput"):
        found.append(Timings())
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="make test's closing lines: where time went")
    parser.add_argument("timings", type=Path, help="the file KIT_TIMINGS_FILE named")
    parser.add_argument(
        "--phase", action="append", default=[], metavar="NAME=SECONDS", help="a phase timed outside"
    )
    args = parser.parse_args(argv)
    outside = {}
    for item in args.phase:
        name, _, seconds = item.partition("=")
        outside[name] = float(seconds)
    try:
        figures = json.loads(args.timings.read_text())
    except (OSError, ValueError) as error:
        print(
            f"no pytest timings in {args.timings} ({error}): pytest did not finish", file=sys.stderr
        )
        figures = {"slowest": [], "phases": {}}
    for line in summary_lines(figures, outside):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
