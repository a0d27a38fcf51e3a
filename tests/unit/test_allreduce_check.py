"""allreduce_check: NCCL log parsing, bandwidth math, baseline logic, and the module's failure
paths, run against a fake runtime Python (no GPU or torch needed)."""

from __future__ import annotations

import itertools
import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from ansible.module_utils.tuning import allreduce_probe, allreduce_worker
from ansible.module_utils.tuning.allreduce import (
    AllreduceError,
    ProcessResult,
    bandwidth_row,
    build_results,
    bus_factor,
    compare,
    make_baseline,
    message_sizes,
    normalise_transport,
    parse_nccl_log,
    parse_probe,
    probe_source,
    results_csv,
    worker_environment,
    worker_source,
)

from tests.support.modules import run_module

pytestmark = pytest.mark.tuning

# Real NCCL_DEBUG=INFO lines. The "vm [n]" block is from tests/fixtures/gpu-hosts/h200-x2/
# nccl-debug-excerpt.log (host name and pids anonymised); the "vm:870:870" lines are from the
# reference loop's NCCL_DEBUG=INFO output on the 2x H200 machine of docs/measurements/README.md
# (2026-11-30, NCCL 2.28.9+cuda13.0, NV18, NCCL_NVLS_ENABLE=0).
REAL_NCCL_LOG = """\
vm [0] NCCL INFO ENV/Plugin: Could not find: libnccl-env.so
vm [0] NCCL INFO Bootstrap: Using eth0:192.0.2.2<0>
vm [0] NCCL INFO cudaDriverVersion 13000
vm [0] NCCL INFO NCCL version 2.28.9+cuda13.0
vm [1] NCCL INFO NCCL version 2.28.9+cuda13.0
vm [0] NCCL INFO Using network Socket
vm [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.
vm [1] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.
vm [0] NCCL INFO comm 0xa4f3760 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0
vm [0] NCCL INFO Channel 00/24 : 0 1
vm [0] NCCL INFO Channel 01/24 : 0 1
vm [1] NCCL INFO P2P Chunksize set to 524288
vm:870:870 [0] NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p \
channels, 32 p2p channels per peer
vm:871:871 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM
vm:870:870 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM
vm:871:871 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] via P2P/CUMEM
vm:870:870 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM
vm:870:870 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1
"""

GIB = 1 << 30


# --------------------------------------------------------------------------------------------
# Pure logic.


def test_parse_real_nccl_log():
    parsed = parse_nccl_log(REAL_NCCL_LOG)
    assert parsed["nccl_version"] == "2.28.9+cuda13.0"
    assert parsed["transport"] == "P2P/CUMEM"
    assert parsed["transports"] == {"P2P/CUMEM": 4}
    assert parsed["nccl_env_reported"] == {"NCCL_NVLS_ENABLE": "0"}
    assert parsed["nccl_warnings"] == []
    assert parsed["transport_lines"][0] == "NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM"
    # "Channel 00/24 : 0 1" is a ring listing, not a connection; "24 collnet channels" is
    # NCCL repeating its ring channel count, not CollNet.


@pytest.mark.parametrize(
    ("line", "transport"),
    [
        ("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read", "P2P/CUMEM"),
        ("Channel 03/1 : 2[2] -> 3[3] via P2P/IPC/read", "P2P/IPC"),
        ("Channel 00/0 : 0[0] -> 1[1] via P2P/direct pointer/read", "P2P/direct pointer"),
        ("Channel 01 : 0[0] -> 1[1] via SHM/direct/direct", "SHM"),
        ("Channel 00/0 : 1[1] -> 0[0] [receive] via NET/Socket/0", "NET/Socket"),
        ("Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA", "NET/IB"),
        ("Channel 00 : 0[1b000] -> 1[1c000] via P2P/IPC", "P2P/IPC"),
    ],
)
def test_transport_of_each_channel_line(line, transport):
    parsed = parse_nccl_log(f"host:1:2 [0] NCCL INFO {line}\n")
    assert parsed["transport"] == transport


def test_mixed_transports_nvls_and_warnings():
    log = textwrap.dedent(
        """\
        h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
        h:1:1 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read
        h:1:1 [1] NCCL INFO Channel 00 : 1[1] -> 0[0] via SHM/direct/direct
        h:1:1 [0] NCCL INFO 16 coll channels, 0 collnet channels, 16 nvls channels, 16 p2p \
channels, 2 p2p channels per peer
        h:1:1 [0] NCCL WARN Cuda failure 'out of memory'
        h:1:1 [1] NCCL WARN Cuda failure 'out of memory'
        """
    )
    parsed = parse_nccl_log(log)
    assert parsed["transports"] == {"P2P/CUMEM": 2, "SHM": 1, "NVLS": 16}
    assert parsed["transport"] == "NVLS, P2P/CUMEM, SHM"
    assert parsed["nccl_warnings"] == ["Cuda failure 'out of memory'"]
    assert parse_nccl_log("no nccl here\n")["transport"] is None


def test_normalise_transport():
    assert normalise_transport("P2P/CUMEM/read/CE") == "P2P/CUMEM"
    assert normalise_transport("NET/IB/0/GDRDMA/Shared") == "NET/IB"
    assert normalise_transport("SHM/CE/direct") == "SHM"
    assert normalise_transport("CollNet") == "CollNet"


def test_message_sizes_double_from_32k_to_1g():
    sizes = message_sizes(32 * 1024, GIB)
    assert sizes[0] == 32768 and sizes[-1] == GIB
    assert len(sizes) == 16
    assert all(b == 2 * a for a, b in itertools.pairwise(sizes))
    assert message_sizes(4096, 10000) == [4096, 8192]
    with pytest.raises(AllreduceError, match="multiple of 2"):
        message_sizes(3, 1024)
    with pytest.raises(AllreduceError, match="below min_bytes"):
        message_sizes(4096, 1024)


def test_busbw_math():
    assert bus_factor(2) == 1.0
    assert bus_factor(8) == 1.75
    # 1 GiB in 3 ms: algbw = 1073741824 / 0.003 / 1e9 = 357.91 GB/s.
    row = bandwidth_row(GIB, 3000.0, 2)
    assert row == {"bytes": GIB, "time_us": 3000.0, "algbw_GBps": 357.91, "busbw_GBps": 357.91}
    row8 = bandwidth_row(GIB, 3000.0, 8)
    assert row8["algbw_GBps"] == 357.91
    assert row8["busbw_GBps"] == round(357.913941 * 1.75, 2)
    with pytest.raises(AllreduceError, match="non-positive"):
        bandwidth_row(GIB, 0.0, 2)
    with pytest.raises(AllreduceError, match="2 timings for 3"):
        build_results([1, 2, 4], [1.0, 2.0], 2)


def test_results_csv_header():
    csv = results_csv([bandwidth_row(32768, 10.0, 2)])
    assert csv.splitlines() == ["bytes,time_us,algbw_GBps,busbw_GBps", "32768,10.0,3.28,3.28"]


def baseline_with(busbw_at_max: float, gpus: int = 2) -> dict:
    time_us = GIB / (busbw_at_max / bus_factor(gpus) * 1e9) * 1e6
    results = build_results([32768, GIB], [10.0, time_us], gpus)
    measurement = {"gpus": gpus, "results": results, "transport": "P2P/CUMEM"}
    return make_baseline(measurement, "vm", "2026-11-30T00:00:00Z")


def test_compare_within_and_beyond_the_allowed_drop():
    baseline = baseline_with(400.0)
    assert baseline["busbw_GBps_max_size"] == pytest.approx(400.0, abs=0.01)
    same = compare(baseline, 2, baseline_with(400.0)["results"], "b.json")
    assert same["drop_percent"] == pytest.approx(0.0, abs=0.01)
    slower = compare(baseline, 2, baseline_with(320.0)["results"], "b.json")
    assert slower["drop_percent"] == pytest.approx(20.0, abs=0.01)
    faster = compare(baseline, 2, baseline_with(440.0)["results"], "b.json")
    assert faster["drop_percent"] == pytest.approx(-10.0, abs=0.01)


def test_compare_refuses_what_is_not_comparable():
    with pytest.raises(AllreduceError, match="recorded with 2 GPUs; this run used 8"):
        compare(baseline_with(400.0), 8, baseline_with(700.0, gpus=8)["results"], "b.json")
    other_size = build_results([32768, 2 * GIB], [10.0, 5000.0], 2)
    with pytest.raises(AllreduceError, match="no figure for 2 GiB"):
        compare(baseline_with(400.0), 2, other_size, "b.json")


def test_worker_environment_keeps_nccl_env_and_forces_debug():
    env = worker_environment(
        {"PATH": "/bin", "NCCL_DEBUG": "WARN", "NCCL_DEBUG_FILE": "/tmp/x.%p"},
        {"NCCL_NVLS_ENABLE": 0, "NCCL_P2P_DISABLE": True, "NCCL_IB_DISABLE": False},
    )
    assert env["PATH"] == "/bin"
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["NCCL_P2P_DISABLE"] == "1"
    assert env["NCCL_IB_DISABLE"] == "0"
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["NCCL_DEBUG_SUBSYS"] == "INIT,GRAPH,ENV"
    assert "NCCL_DEBUG_FILE" not in env


# --------------------------------------------------------------------------------------------
# The programs, imported here and run as the module runs them, in a Python without torch or
# Ansible (-I -S: the standard library alone, no site-packages, no PYTHONPATH).


def run_program(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-I", "-S", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        check=False,
    )


def test_the_programs_shipped_are_the_files_tests_import():
    assert probe_source() == Path(allreduce_probe.__file__).read_text()
    assert worker_source() == Path(allreduce_worker.__file__).read_text()


def test_probe_without_torch_reports_it_with_its_exit_code(tmp_path):
    done = run_program(["-c", probe_source()], tmp_path)
    assert done.returncode == allreduce_probe.EXIT_NO_TORCH
    [line] = done.stdout.splitlines()
    assert line.startswith(allreduce_probe.MARKER)
    report = json.loads(line[len(allreduce_probe.MARKER) :])
    assert report[allreduce_probe.TORCH_ERROR].startswith("ModuleNotFoundError: ")
    # The module reads that line with the same marker and tells the user what to fix.
    result = ProcessResult(done.returncode, done.stdout, False, [], 0.1)
    with pytest.raises(AllreduceError, match="torch is not importable by /venv/bin/python"):
        parse_probe(result, "/venv/bin/python")


def test_probe_report_line_round_trips_through_parse_probe():
    info = {"python": "3.12.3", "torch": "2.11.0+cu130", "gpus": 2, "gpu_names": ["H200"] * 2}
    line = allreduce_probe.report_line(info)
    assert line.startswith("ALLREDUCE_PROBE {")
    said = ProcessResult(0, "some warning\n" + line + "\n", False, [], 0.1)
    assert parse_probe(said, "python3") == info
    assert allreduce_probe.error_text(OSError("libcudart.so.13")) == "OSError: libcudart.so.13"


def test_worker_config_and_its_checks(tmp_path):
    config = allreduce_worker.make_config(2, [32768, 65536], 1, 2, "/w/store", "/w/result.json")
    assert tuple(config) == allreduce_worker.CONFIG_KEYS
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert allreduce_worker.read_config([str(path)]) == config
    path.write_text(json.dumps({k: v for k, v in config.items() if k != "store"}))
    with pytest.raises(SystemExit) as stopped:
        allreduce_worker.read_config([str(path)])
    assert stopped.value.code == allreduce_worker.EXIT_USAGE
    # As the host runs it: a file, no torch needed to refuse a bad invocation.
    (tmp_path / "allreduce_worker.py").write_text(worker_source())
    done = run_program(["allreduce_worker.py"], tmp_path)
    assert done.returncode == allreduce_worker.EXIT_USAGE
    assert "usage: allreduce_worker.py CONFIG.json" in done.stderr
    done = run_program(["allreduce_worker.py", str(path)], tmp_path)
    assert done.returncode == allreduce_worker.EXIT_USAGE
    assert "missing store" in done.stderr


def test_worker_reports_the_sizes_any_rank_flagged():
    sizes = [32768, 65536, 131072]
    assert allreduce_worker.flagged_sizes(sizes, [0.0, 1.0, 0.0]) == [65536]
    assert allreduce_worker.flagged_sizes(sizes, [0.0, 0.0, 0.0]) == []
    with pytest.raises(ValueError):
        allreduce_worker.flagged_sizes(sizes, [1.0])


# --------------------------------------------------------------------------------------------
# The module, against a fake runtime Python. It answers the probe (-c) like torch would and
# plays the worker (allreduce_worker.py CONFIG): NCCL lines on stderr, the result file, and
# faults chosen by FAKE_* variables.

FAKE_PYTHON = f"""\
#!{sys.executable}
import json, os, subprocess, sys, time

gpus = int(os.environ.get("FAKE_GPUS", "2"))
hang = os.environ.get("FAKE_HANG", "")


def hang_here():
    child = subprocess.Popen(["sleep", "300"])
    with open(os.environ["FAKE_PID_FILE"], "w") as handle:
        handle.write(str(child.pid))
    sys.stdout.write("vm [0] NCCL INFO NCCL version 2.28.9+cuda13.0\\n")
    sys.stdout.flush()
    time.sleep(300)


if sys.argv[1] == "-c":
    if hang == "probe":
        hang_here()
    print("ALLREDUCE_PROBE " + json.dumps({{
        "python": "3.12.3", "torch": "2.11.0+cu130", "cuda": "13.0",
        "cuda_available": gpus > 0, "gpus": gpus, "nccl_available": True,
        "nccl": "2.28.9", "gpu_names": ["NVIDIA H200"] * gpus,
    }}))
    sys.exit(0)

with open(sys.argv[2]) as handle:
    cfg = json.load(handle)
if os.environ.get("FAKE_ENV_FILE"):
    with open(os.environ["FAKE_ENV_FILE"], "w") as handle:
        json.dump(dict(os.environ), handle)
if hang == "worker":
    hang_here()
log = sys.stdout  # NCCL_DEBUG goes to stdout
log.write("vm [0] NCCL INFO NCCL version 2.28.9+cuda13.0\\n")
log.write("vm [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.\\n")
if os.environ.get("FAKE_NCCL_ERROR"):
    log.write("vm:1:2 [1] NCCL WARN " + os.environ["FAKE_NCCL_ERROR"] + "\\n")
    sys.stderr.write("Traceback (most recent call last):\\n  File x, line 1\\n")
    sys.stderr.write("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1, "
              "unhandled cuda error\\n")
    sys.exit(1)
for rank in range(cfg["world_size"]):
    peer = (rank + 1) % cfg["world_size"]
    for channel in range(2):
        log.write(f"vm:1:2 [{{rank}}] NCCL INFO Channel {{channel:02d}}/0 : {{rank}}[{{rank}}] "
                  f"-> {{peer}}[{{peer}}] via P2P/CUMEM\\n")
scale = float(os.environ.get("FAKE_TIME_SCALE", "1"))
times = [(8.0 + n / 360e3) * scale for n in cfg["sizes"]]
wrong = [cfg["sizes"][-1]] if os.environ.get("FAKE_WRONG_SUM") else []
with open(cfg["result_file"], "w") as handle:
    json.dump({{"sizes": cfg["sizes"], "time_us": times, "wrong_sizes": wrong,
               "world_size": cfg["world_size"], "torch": "2.11.0+cu130", "cuda": "13.0",
               "nccl": "2.28.9", "gpu_names": ["NVIDIA H200"] * cfg["world_size"]}}, handle)
"""


@pytest.fixture
def fake_python(tmp_path, monkeypatch):
    path = tmp_path / "bin" / "python"
    path.parent.mkdir()
    path.write_text(FAKE_PYTHON)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    for name in ("FAKE_GPUS", "FAKE_HANG", "FAKE_TIME_SCALE", "FAKE_NCCL_ERROR", "FAKE_WRONG_SUM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FAKE_PID_FILE", str(tmp_path / "child.pid"))
    return str(path)


SMALL = {"min_bytes": 32768, "max_bytes": GIB, "warmup": 1, "iterations": 2}


def check(python: str, baseline: Path | None = None, check_mode: bool = False, **args) -> dict:
    params = {"python": python, **SMALL, **args}
    if baseline is not None:
        params["baseline_file"] = str(baseline)
    return run_module("allreduce_check", params, check_mode=check_mode)


def test_measures_and_writes_the_baseline_when_absent(fake_python, tmp_path):
    baseline = tmp_path / "state" / "allreduce-baseline.json"
    result = check(fake_python, baseline, nccl_env={"NCCL_NVLS_ENABLE": "0"})
    assert not result.get("failed"), result.get("msg")
    assert result["changed"] is True and result["baseline_written"] is True
    assert result["gpus"] == 2
    assert result["transport"] == "P2P/CUMEM"
    assert result["transports"] == {"P2P/CUMEM": 4}
    assert result["nccl_version"] == "2.28.9+cuda13.0"
    assert result["nccl_env_reported"] == {"NCCL_NVLS_ENABLE": "0"}
    assert [row["bytes"] for row in result["results"]] == message_sizes(32768, GIB)
    assert set(result["results"][0]) == {"bytes", "time_us", "algbw_GBps", "busbw_GBps"}
    last = result["results"][-1]
    assert last["busbw_GBps"] == last["algbw_GBps"]  # 2 ranks: 2(n-1)/n = 1
    assert result["busbw_GBps_max_size"] == last["busbw_GBps"]
    assert result["baseline"] is None and result["drop_percent"] is None
    stored = json.loads(baseline.read_text())
    assert stored["gpus"] == 2 and stored["max_bytes"] == GIB
    assert stored["busbw_GBps_max_size"] == last["busbw_GBps"]
    assert stored["transport"] == "P2P/CUMEM"
    assert stored["nccl_env"] == {"NCCL_NVLS_ENABLE": "0"}
    assert stored["results"] == result["results"]

    again = check(fake_python, baseline)
    assert not again.get("failed"), again.get("msg")
    assert again["changed"] is False and again["baseline_written"] is False
    assert again["drop_percent"] == pytest.approx(0.0, abs=0.01)
    assert again["baseline"]["busbw_GBps_max_size"] == last["busbw_GBps"]


def test_fails_when_busbw_drops_beyond_the_limit(fake_python, tmp_path, monkeypatch):
    baseline = tmp_path / "allreduce-baseline.json"
    assert not check(fake_python, baseline).get("failed")
    recorded = baseline.read_text()

    monkeypatch.setenv("FAKE_TIME_SCALE", "1.1")  # about 9% slower: within 15%
    within = check(fake_python, baseline)
    assert not within.get("failed"), within.get("msg")
    assert 8 < within["drop_percent"] < 10

    monkeypatch.setenv("FAKE_TIME_SCALE", "1.25")  # 20% slower
    slower = check(fake_python, baseline)
    assert slower["failed"] is True
    assert "20.0% below the baseline" in slower["msg"]
    assert "allowed: 15%" in slower["msg"]
    assert "update_baseline: true" in slower["msg"]
    assert slower["drop_percent"] == pytest.approx(20.0, abs=0.05)
    assert slower["results"] and slower["baseline_written"] is False
    assert baseline.read_text() == recorded

    assert not check(fake_python, baseline, max_drop_percent=25).get("failed")

    updated = check(fake_python, baseline, update_baseline=True)
    assert not updated.get("failed"), updated.get("msg")
    assert updated["changed"] is True and updated["baseline_written"] is True
    assert updated["drop_percent"] == pytest.approx(20.0, abs=0.05)
    assert json.loads(baseline.read_text())["busbw_GBps_max_size"] == updated["busbw_GBps_max_size"]


def test_check_mode_measures_but_never_writes(fake_python, tmp_path, monkeypatch):
    baseline = tmp_path / "allreduce-baseline.json"
    result = check(fake_python, baseline, check_mode=True)
    assert not result.get("failed"), result.get("msg")
    assert result["results"]
    assert result["changed"] is True  # it would write one
    assert result["baseline_written"] is False
    assert not baseline.exists()

    assert check(fake_python, baseline)["baseline_written"] is True
    recorded = baseline.read_text()
    monkeypatch.setenv("FAKE_TIME_SCALE", "0.5")
    updated = check(fake_python, baseline, check_mode=True, update_baseline=True)
    assert updated["changed"] is True and updated["baseline_written"] is False
    assert baseline.read_text() == recorded


def test_no_baseline_file_means_no_comparison(fake_python):
    result = check(fake_python)
    assert not result.get("failed"), result.get("msg")
    assert result["changed"] is False and result["baseline_written"] is False
    assert result["baseline"] is None and result["drop_percent"] is None


def test_baseline_of_other_gpu_count_or_broken_json(fake_python, tmp_path, monkeypatch):
    baseline = tmp_path / "allreduce-baseline.json"
    monkeypatch.setenv("FAKE_GPUS", "4")
    assert check(fake_python, baseline)["baseline_written"] is True
    monkeypatch.setenv("FAKE_GPUS", "2")
    result = check(fake_python, baseline)
    assert result["failed"] is True
    assert "recorded with 4 GPUs; this run used 2" in result["msg"]

    baseline.write_text("{not json")
    broken = check(fake_python, baseline)
    assert broken["failed"] is True
    assert "is not JSON" in broken["msg"] and "update_baseline: true" in broken["msg"]
    fixed = check(fake_python, baseline, update_baseline=True)
    assert not fixed.get("failed"), fixed.get("msg")
    assert fixed["baseline_written"] is True
    assert json.loads(baseline.read_text())["gpus"] == 2


def test_busbw_uses_the_rank_count(fake_python, monkeypatch):
    monkeypatch.setenv("FAKE_GPUS", "8")
    result = check(fake_python)
    last = result["results"][-1]
    assert result["gpus"] == 8
    assert last["busbw_GBps"] == pytest.approx(last["algbw_GBps"] * 1.75, abs=0.02)


def test_nccl_env_reaches_the_worker(fake_python, tmp_path, monkeypatch):
    env_file = tmp_path / "env.json"
    monkeypatch.setenv("FAKE_ENV_FILE", str(env_file))
    monkeypatch.setenv("NCCL_DEBUG_FILE", "/tmp/nccl.%p.log")
    result = check(fake_python, nccl_env={"NCCL_NVLS_ENABLE": "0", "NCCL_P2P_DISABLE": True})
    assert not result.get("failed"), result.get("msg")
    seen = json.loads(env_file.read_text())
    assert seen["NCCL_NVLS_ENABLE"] == "0"
    assert seen["NCCL_P2P_DISABLE"] == "1"
    assert seen["NCCL_DEBUG"] == "INFO"
    assert "NCCL_DEBUG_FILE" not in seen


def process_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return state[state.rfind(")") + 2] == "Z"


@pytest.mark.parametrize("where", ["worker", "probe"])
def test_hang_is_killed_with_its_process_group(fake_python, tmp_path, monkeypatch, where):
    monkeypatch.setenv("FAKE_HANG", where)
    started = time.monotonic()
    result = check(fake_python, tmp_path / "b.json", timeout=3)
    assert time.monotonic() - started < 30
    assert result["failed"] is True
    assert "timeout=3s" in result["msg"]
    assert "killed with its whole process group" in result["msg"]
    assert result["baseline_written"] is False
    child = int((tmp_path / "child.pid").read_text())
    assert str(child) in result["msg"]
    deadline = time.monotonic() + 5
    while not process_gone(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert process_gone(child), "the worker's child survived the timeout"
    assert not (tmp_path / "b.json").exists()
    if where == "worker":
        assert result["timed_out"] is True
        assert "NCCL version 2.28.9" in result["msg"]  # what NCCL said before it stopped


def test_nccl_error_is_reported(fake_python, monkeypatch):
    monkeypatch.setenv("FAKE_NCCL_ERROR", "Cuda failure 'out of memory'")
    result = check(fake_python)
    assert result["failed"] is True
    assert "exited 1" in result["msg"]
    assert "NCCL WARN: Cuda failure 'out of memory'" in result["msg"]
    assert "DistBackendError" in result["msg"]
    assert result["nccl_warnings"] == ["Cuda failure 'out of memory'"]


def test_wrong_sums_fail(fake_python, monkeypatch):
    monkeypatch.setenv("FAKE_WRONG_SUM", "1")
    result = check(fake_python)
    assert result["failed"] is True
    assert "wrong sums at 1 GiB over P2P/CUMEM" in result["msg"]
    assert "NCCL_P2P_DISABLE=1" in result["msg"]


def test_one_gpu_is_skipped(fake_python, monkeypatch):
    monkeypatch.setenv("FAKE_GPUS", "1")
    result = check(fake_python)
    assert not result.get("failed"), result.get("msg")
    assert result["skipped"] is True and result["changed"] is False
    assert result["gpus"] == 1 and result["results"] == []
    assert "at least 2" in result["msg"]


def test_no_gpu_fails(fake_python, monkeypatch):
    monkeypatch.setenv("FAKE_GPUS", "0")
    result = check(fake_python)
    assert result["failed"] is True
    assert "sees no GPU" in result["msg"] and "nvidia-smi" in result["msg"]


@pytest.mark.parametrize("python", ["/nonexistent/bin/python3", "no-such-python-3.99"])
def test_missing_python(python):
    result = check(python)
    assert result["failed"] is True
    assert result["msg"].startswith("python not found")
    assert python in result["msg"]
    assert "runtime stage" in result["msg"]


def test_torch_missing_in_the_system_python():
    system = "/usr/bin/python3"
    if not os.access(system, os.X_OK):
        pytest.skip("no /usr/bin/python3")
    result = check(system)
    if not result.get("failed"):
        pytest.skip("/usr/bin/python3 has torch here")
    assert "torch is not importable by /usr/bin/python3" in result["msg"]
    assert "ModuleNotFoundError" in result["msg"]
    assert "bin/python" in result["msg"]


def test_real_probe_against_a_stub_torch(tmp_path, monkeypatch):
    """The embedded probe itself, on a stub torch package that reports one GPU."""
    stub = tmp_path / "stub" / "torch"
    (stub / "distributed").mkdir(parents=True)
    (stub / "__init__.py").write_text(
        textwrap.dedent(
            """\
            import types
            __version__ = "2.11.0+cu130"
            version = types.SimpleNamespace(cuda="13.0")
            def _count():
                return 1
            cuda = types.SimpleNamespace(
                is_available=lambda: True,
                device_count=_count,
                get_device_name=lambda i: "NVIDIA H200",
                nccl=types.SimpleNamespace(version=lambda: (2, 28, 9)),
            )
            """
        )
    )
    (stub / "distributed" / "__init__.py").write_text(
        "def is_available():\n    return True\n\ndef is_nccl_available():\n    return True\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(stub.parent))
    result = check(sys.executable)
    assert not result.get("failed"), result.get("msg")
    assert result["skipped"] is True
    assert "sees 1 GPU (NVIDIA H200)" in result["msg"]


def test_bad_parameters():
    result = check(sys.executable, iterations=0, min_bytes=3)
    assert result["failed"] is True
    assert "iterations is 0" in result["msg"] and "multiple of 2" in result["msg"]


# The module's run (module_utils/tuning/allreduce_run.py) and process-group kill, called directly.


def test_kill_group_ends_a_group_that_obeys_sigterm_without_waiting_out_the_grace():
    from ansible.module_utils.tuning.allreduce import kill_group

    proc = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True)
    time.sleep(0.3)  # both sleeps started
    started = time.monotonic()
    members = kill_group(proc, grace_s=10)
    assert time.monotonic() - started < 5, "it waited for the leader's zombie"
    assert proc.pid in members and len(members) == 3
    assert proc.returncode is not None
    assert all(process_gone(pid) for pid in members)


def test_kill_group_sigkills_what_ignores_sigterm():
    from ansible.module_utils.tuning.allreduce import kill_group

    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", stubborn], start_new_session=True)
    time.sleep(0.5)  # the handler is installed
    started = time.monotonic()
    kill_group(proc, grace_s=1)
    assert 0.9 < time.monotonic() - started < 5
    assert proc.returncode == -9


def test_run_arguments_baseline_read_and_write(tmp_path):
    from ansible.module_utils.tuning.allreduce_run import (
        CheckFailed,
        read_baseline,
        resolve_python,
        validate,
        write_baseline,
    )

    params = {"warmup": 0, "iterations": 1, "timeout": 1, "max_drop_percent": 0.0}
    assert validate({**params, "min_bytes": 32768, "max_bytes": 131072}) == [32768, 65536, 131072]
    with pytest.raises(CheckFailed) as bad:
        validate({**params, "warmup": -1, "timeout": 0, "min_bytes": 1, "max_bytes": 2})
    assert str(bad.value).startswith("warmup is -1; needed: 0 or more; timeout is 0")
    assert bad.value.fields == {"gpus": 0, "baseline_written": False}

    assert resolve_python("python", lambda name: sys.executable) == sys.executable
    with pytest.raises(CheckFailed, match="'python' is not on PATH"):
        resolve_python("python", lambda name: None)

    warnings: list[str] = []
    path = tmp_path / "state" / "baseline.json"
    assert read_baseline(str(path), False, warnings.append) is None
    write_baseline(str(path), {"gpus": 2, "results": []})
    assert path.read_text() == '{\n  "gpus": 2,\n  "results": []\n}\n'
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert read_baseline(str(path), False, warnings.append) == {"gpus": 2, "results": []}
    path.write_text("{cut")
    with pytest.raises(CheckFailed, match="is not JSON"):
        read_baseline(str(path), False, warnings.append)
    assert read_baseline(str(path), True, warnings.append) is None
    assert warnings and warnings[0].endswith("replaced because update_baseline is true.")
    # A folder that cannot be made (a file is in the way) fails even for root.
    with pytest.raises(CheckFailed, match="Cannot write the baseline") as failed:
        write_baseline(str(path / "b.json"), {"gpus": 4})
    assert failed.value.fields == {"gpus": 4, "baseline_written": False}
