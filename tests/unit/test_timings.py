"""make test's closing lines: the slowest tests by whole time and each phase's wall time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from tests.support.timings import CpuMeter, Timings, phase_of, plugins_for, summary_lines


def report(nodeid: str, duration: float, start: float, stop: float):
    return SimpleNamespace(nodeid=nodeid, duration=duration, start=start, stop=stop)


def test_a_test_s_phases_add_up_and_a_phase_spans_its_first_start_to_its_last_stop():
    timings = Timings()
    # A module's first test carries its fixture's setup: that is what makes it slow.
    timings.pytest_runtest_logreport(report("tests/integration/test_a.py::one", 90, 100, 190))
    timings.pytest_runtest_logreport(report("tests/integration/test_a.py::one", 2, 190, 192))
    timings.pytest_runtest_logreport(report("tests/unit/test_b.py::two", 1, 101, 102))
    timings.pytest_runtest_logreport(report("tests/unit/test_c.py::three", 3, 150, 153))
    figures = timings.figures()
    assert figures["slowest"] == [
        ["tests/integration/test_a.py::one", 92],
        ["tests/unit/test_c.py::three", 3],
        ["tests/unit/test_b.py::two", 1],
    ]
    # Unit before integration, whatever order the reports came in.
    assert list(figures["phases"].items()) == [("unit", 52.0), ("integration", 92.0)]
    # What each phase and file cost, added up: unit's 52 s of wall time held 4 s of tests.
    assert list(figures["test_time"].items()) == [("unit", 4.0), ("integration", 92.0)]
    assert figures["files"] == [
        ["tests/integration/test_a.py", 92.0],
        ["tests/unit/test_c.py", 3.0],
        ["tests/unit/test_b.py", 1.0],
    ]
    # The JSON file keeps every file, past the ten printed.
    assert figures["all_files"] == figures["files"]
    assert phase_of("tests/contract/test_x.py::y") == "contract"
    assert phase_of("test_x.py::y") == "other"


def test_each_worker_s_files_and_end_are_kept():
    timings = Timings()
    gw0, gw1 = (SimpleNamespace(workerinput={"workerid": name}) for name in ("gw0", "gw1"))
    for nodeid, start, stop, node in (
        ("tests/integration/test_a.py::one", 100, 190, gw0),
        ("tests/integration/test_a.py::two", 190, 200, gw0),
        ("tests/unit/test_b.py::one", 101, 102, gw1),
        ("tests/unit/test_c.py::one", 102, 130, gw1),
        ("tests/unit/test_b.py::two", 130, 131, gw0),
    ):
        timings.pytest_runtest_logreport(
            SimpleNamespace(nodeid=nodeid, duration=stop - start, start=start, stop=stop, node=node)
        )
    figures = timings.figures()
    assert figures["worker_ends"] == {"gw0": 100.0, "gw1": 30.0}
    assert figures["workers"]["gw0"] == [
        ["tests/integration/test_a.py", 0.0, 100.0],
        ["tests/unit/test_b.py", 30.0, 31.0],
    ]
    assert figures["workers"]["gw1"] == [
        ["tests/unit/test_b.py", 1.0, 2.0],
        ["tests/unit/test_c.py", 2.0, 30.0],
    ]
    lines = summary_lines(figures)
    assert "workers' last test ended (s after the first test started): gw0 100, gw1 30" in lines
    # Without xdist there is one worker, and no line for it.
    alone = Timings()
    alone.pytest_runtest_logreport(report("tests/unit/test_b.py::one", 1, 5, 6))
    assert alone.figures()["worker_ends"] == {"main": 1.0}
    assert not any(line.startswith("workers'") for line in summary_lines(alone.figures()))


def test_only_the_controller_collects_under_xdist_and_every_process_meters_cpu():
    worker = plugins_for(SimpleNamespace(workerinput={}))
    assert [type(p) for p in worker] == [CpuMeter]
    assert [type(p) for p in plugins_for(SimpleNamespace())] == [CpuMeter, Timings]


def test_a_tests_cpu_counts_the_processes_it_waited_for_and_adds_up_per_file():
    meter = CpuMeter()
    item = SimpleNamespace(nodeid="tests/integration/test_a.py::one", user_properties=[])
    meter.pytest_runtest_setup(item)
    # A child that spins for a while, waited for within the test: its CPU is the test's.
    subprocess.run(
        [sys.executable, "-c", "import time\nend = time.process_time() + 0.3\n"
         "while time.process_time() < end: pass"],
        check=True,
        timeout=60,
    )  # fmt: skip
    meter.pytest_runtest_makereport(item, SimpleNamespace(when="call"))
    assert item.user_properties == []
    meter.pytest_runtest_makereport(item, SimpleNamespace(when="teardown"))
    [(name, used)] = item.user_properties
    assert name == "cpu_s" and used >= 0.25
    timings = Timings()
    for nodeid, cpu in (
        ("tests/integration/test_a.py::one", used),
        ("tests/integration/test_a.py::two", 1.0),
        ("tests/unit/test_b.py::one", 0.5),
    ):
        timings.pytest_runtest_logreport(
            SimpleNamespace(nodeid=nodeid, duration=1.0, user_properties=[("cpu_s", cpu)])
        )
    figures = timings.figures()
    assert figures["cpu_files"][0] == ["tests/integration/test_a.py", round(used + 1.0, 1)]
    assert figures["cpu"] == {"unit": 0.5, "integration": round(used + 1.0, 1)}
    lines = summary_lines(figures)
    assert any(line.startswith("most CPU 2 files") for line in lines)
    assert any(line.startswith("phase CPU: unit 0 s, integration") for line in lines)


def test_the_closing_lines_put_lint_and_syntax_first_and_the_total_last(tmp_path):
    timings = tmp_path / "pytest.json"
    timings.write_text(
        json.dumps(
            {
                "slowest": [["tests/unit/t.py::a", 4.0]],
                "files": [["tests/unit/t.py", 4.0]],
                "test_time": {"unit": 4.0},
                "phases": {"unit": 40.0},
            }
        )
    )
    argv = [str(timings), "--phase", "total=99", "--phase", "lint=30", "--phase", "syntax=20"]
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.timings", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.splitlines()[-1] == (
        "phase wall times: lint 30 s, syntax 20 s, unit 40 s, total 99 s"
    )
    assert "4.0 s  tests/unit/t.py::a" in done.stdout
    assert "4.0 s  tests/unit/t.py\n" in done.stdout
    assert "phase test time (added up over the workers): unit 4 s" in done.stdout


def test_a_pytest_that_did_not_finish_still_gives_the_other_phases(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.timings",
            str(tmp_path / "none.json"),
            "--phase",
            "lint=5",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "pytest did not finish" in done.stderr
    assert done.stdout.splitlines()[-1] == "phase wall times: lint 5 s"


def test_the_dealing_order_names_files_that_exist_once_each():
    from tests.conftest import DEALING_ORDER, LONGEST_FIRST, MOSTLY_WAITING

    root = Path(__file__).resolve().parents[2]
    assert len(set(DEALING_ORDER)) == len(DEALING_ORDER)
    assert set(DEALING_ORDER) == set(LONGEST_FIRST) | set(MOSTLY_WAITING)
    assert [path for path in DEALING_ORDER if not (root / path).is_file()] == []
