"""Every command a host module runs has a deadline that kills its whole process group (issue 16:
defects 3 and 8, and the standard that every subprocess has a deadline).

Each module here meets a command that hangs and starts a child that ignores SIGTERM, as a GPU
stuck in the driver leaves nvidia-smi or lspci. The module must come back within its `timeout`
plus the time to kill and reap (a loaded machine included), name the command and the deadline,
and leave no process of the hung command behind. Before the fix the modules used
AnsibleModule.run_command, which has no deadline: each of these tests waited for the hang to end
by itself (HANG_S) and then found its survivors.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest
from ansible.module_utils.host.helpers import CommandFailed, DeadlineRunner
from ansible.module_utils.tuning.pci_acs import acs_report

from tests.support.hostprep import pcie_tree, warning_text
from tests.support.modules import marked_processes, run_module
from tests.unit.test_tuning import FakeHost

DEADLINE_S = 1.5
# Killing the group (SIGKILL at once) and reaping it, with room for two loaded cores.
MARGIN_S = 2.5
# How long a hung command sleeps: bounded, and long enough that a module without a deadline
# fails the elapsed-time assertion rather than the test's own timeout.
HANG_S = 30

HANG = """\
#!{python}
import os, subprocess, sys, time
CHILD = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep({hang_s})"
if {passes!r} and sys.argv[1:3] != {passes!r}:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
with open({stamps!r}, "a") as stamps:
    stamps.write(f"{{time.monotonic()}}\\n")
subprocess.Popen([sys.executable, "-c", CHILD, {marker!r}])
time.sleep({hang_s})
"""


class Hangs:
    """Makes programs that hang (under a folder named by a unique marker, so the program's
    own command line holds it, as does its child's) and checks that none survived."""

    def __init__(self, tmp_path: Path):
        self.marker = f"deadline-hang-{uuid.uuid4().hex}"
        self.bin = tmp_path / self.marker
        self.bin.mkdir()
        # When each hang began (CLOCK_MONOTONIC, the same clock in every process).
        self.stamps = tmp_path / "hang-started"

    def program(self, name: str, hang_only_for: list[str] | None = None) -> str:
        """A program that hangs; with hang_only_for, a Python that hangs only when its first
        arguments are those (e.g. ["-m", "pip"]) and is this Python otherwise."""
        path = self.bin / name
        path.write_text(
            HANG.format(
                python=sys.executable,
                marker=self.marker,
                hang_s=HANG_S,
                passes=hang_only_for,
                stamps=str(self.stamps),
            )
        )
        path.chmod(0o755)
        return str(path)

    def first_started(self) -> float:
        return float(self.stamps.read_text().split()[0])

    def survivors(self) -> list[int]:
        return marked_processes(self.marker)

    def kill_all(self) -> None:
        for pid in marked_processes(self.marker):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def hangs(tmp_path):
    made = Hangs(tmp_path)
    yield made
    made.kill_all()


def timed(name: str, args: dict, hangs: Hangs) -> tuple[dict, float, list[int]]:
    started = time.monotonic()
    result = run_module(name, args)
    elapsed = time.monotonic() - started
    return result, elapsed, hangs.survivors()


def assert_killed_in_time(elapsed: float, survivors: list[int], deadline: float = DEADLINE_S):
    assert elapsed < deadline + MARGIN_S, f"took {elapsed:.1f}s for a {deadline}s deadline"
    assert survivors == [], f"processes of the hung command survived: {survivors}"


# --------------------------------------------------------------------------------------------
# The shared adapter.


def test_runner_answers_as_run_command_and_shares_one_deadline(hangs):
    run = DeadlineRunner(DEADLINE_S, "test's timeout=1.5s")
    assert run([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"]) == (3, "out\n", "")
    stdin = "import sys; print(sys.stdin.read()[::-1], file=sys.stderr)"
    assert run([sys.executable, "-c", stdin], data="abc") == (0, "", "cba\n")
    missing = run([str(hangs.bin / "no-such-program")])
    assert missing[0] == 127 and "no-such-program" in missing[2]
    hung = hangs.program("hung")
    started = time.monotonic()
    with pytest.raises(CommandFailed) as failed:
        run([hung, "--flag"], shown="hung --flag")
    assert_killed_in_time(time.monotonic() - started, hangs.survivors())
    assert str(failed.value).startswith("`hung --flag` did not finish within")
    assert "test's timeout=1.5s" in str(failed.value)
    # The deadline is spent: the next command is not started, and says so by name.
    with pytest.raises(CommandFailed, match=r"`true` was not run: test's timeout=1.5s ran out"):
        run(["true"])


# --------------------------------------------------------------------------------------------
# preflight_host_facts.


@pytest.mark.preflight
def test_preflight_host_facts_records_a_hung_fabric_manager_check_as_unknown(hangs, monkeypatch):
    # pgrep where systemd is not PID 1, systemctl where it is: both hang.
    hangs.program("pgrep")
    hangs.program("systemctl")
    monkeypatch.setenv("PATH", f"{hangs.bin}:{os.environ['PATH']}")
    args = {"weights_dir": str(hangs.bin / "weights"), "check_fabricmanager": True}
    result, elapsed, survivors = timed(
        "preflight_host_facts", {**args, "timeout": DEADLINE_S}, hangs
    )
    assert_killed_in_time(elapsed, survivors)
    assert not result.get("failed"), result.get("msg")
    fabric = result["fabricmanager"]
    assert fabric["active"] is None and fabric["state"] == "unknown"
    assert f"`{hangs.bin}/" in fabric["how"] and "did not finish within" in fabric["how"]
    assert "timeout=1.5s" in fabric["how"]


@pytest.mark.preflight
def test_preflight_host_facts_refuses_a_deadline_that_is_not_positive(tmp_path):
    for bad in (0, -1):
        result = run_module("preflight_host_facts", {"weights_dir": str(tmp_path), "timeout": bad})
        assert result["failed"] and "timeout" in result["msg"] and str(bad) in result["msg"]


@pytest.mark.preflight
def test_acs_report_of_a_hung_lspci_is_unchecked_with_the_command_named(hangs, tmp_path):
    pcie_tree(tmp_path, redirecting="0000:02:00.0")
    lspci = hangs.program("lspci")
    started = time.monotonic()
    report = acs_report(
        ["0000:05:00.0", "0000:06:00.0"],
        lspci,
        DeadlineRunner(DEADLINE_S, "preflight_host_facts' timeout=1.5s"),
        root=str(tmp_path),
    )
    assert_killed_in_time(time.monotonic() - started, hangs.survivors())
    assert report["checked"] is False and report["redirecting"] == []
    assert report["lspci"] == lspci and report["gpus"] == ["0000:05:00.0", "0000:06:00.0"]
    assert f"`{lspci} -vvv -s 0000:" in report["reason"]
    assert "did not finish within" in report["reason"]


# --------------------------------------------------------------------------------------------
# host_tuning.


@pytest.mark.tuning
@pytest.mark.usefixtures("real_machine_untouched")
def test_host_tuning_fails_on_a_hung_nvidia_smi_and_keeps_its_changes_restorable(
    hangs, tmp_path, monkeypatch
):
    host = FakeHost(tmp_path, monkeypatch)
    smi = hangs.program("nvidia-smi")
    args = host.args(nvidia_smi_path=smi, timeout=DEADLINE_S)
    result, elapsed, survivors = timed("host_tuning", args, hangs)
    assert_killed_in_time(elapsed, survivors)
    assert result["failed"]
    assert f"`{smi} --query-gpu=" in result["msg"] and "did not finish within" in result["msg"]
    assert "host_tuning's timeout=1.5s" in result["msg"]
    # The sysctl changed before nvidia-smi was asked stays recorded, so teardown restores it.
    assert host.get("proc/sys/kernel/numa_balancing") == "0"
    state = json.loads(host.state_file.read_text())
    assert "sysctl:kernel.numa_balancing" in state["changes"]


@pytest.mark.tuning
@pytest.mark.usefixtures("real_machine_untouched")
def test_host_tuning_reports_acs_unchecked_when_lspci_hangs(hangs, tmp_path, monkeypatch):
    host = FakeHost(tmp_path, monkeypatch)
    pcie_tree(host.root, redirecting="0000:02:00.0")
    lspci = hangs.program("lspci")
    report_file = host.tmp / "acs-report.json"
    args = host.args(
        persistence_mode=False,
        lspci_path=lspci,
        acs_report_file=str(report_file),
        timeout=DEADLINE_S,
    )
    result, elapsed, survivors = timed("host_tuning", args, hangs)
    assert_killed_in_time(elapsed, survivors)
    assert not result.get("failed"), result.get("msg")
    acs = result["acs"]
    assert acs["checked"] is False and f"`{lspci} -vvv -s 0000:" in acs["reason"]
    assert "did not finish within" in acs["reason"]
    assert json.loads(report_file.read_text()) == acs
    assert f"ACS not checked: `{lspci} -vvv -s 0000:" in warning_text(result)


@pytest.mark.tuning
@pytest.mark.usefixtures("real_machine_untouched")
def test_host_tuning_restore_goes_on_past_a_hung_systemctl(hangs, tmp_path, monkeypatch):
    host = FakeHost(tmp_path, monkeypatch, capture="h200-x2")
    host.units({"nvidia-persistenced": {"file": "disabled", "active": "inactive"}})
    applied = run_module("host_tuning", host.args(service_manager="systemd"))
    assert not applied.get("failed"), applied.get("msg")
    systemctl = hangs.program("systemctl")
    restore = {**host.restore_args(), "systemctl_path": systemctl, "service_manager": "systemd"}
    # Persistence mode is put back first (nvidia-smi -pm 0 per GPU, out of the same deadline).
    deadline = 3
    result, elapsed, survivors = timed("host_tuning", {**restore, "timeout": deadline}, hangs)
    assert_killed_in_time(elapsed, survivors, deadline)
    assert result["failed"]
    assert f"`{systemctl} show nvidia-persistenced" in result["msg"]
    assert "did not finish within" in result["msg"] and "timeout=3s" in result["msg"]
    # The values that need no command are back; the service stays recorded for the next try.
    assert host.get("proc/sys/kernel/numa_balancing") == "1"
    state = json.loads(host.state_file.read_text())
    assert "service:nvidia-persistenced" in state["changes"]
    assert "sysctl:kernel.numa_balancing" not in state["changes"]


# --------------------------------------------------------------------------------------------
# runtime_check and launch_check.


@pytest.mark.runtime
def test_runtime_check_fails_naming_a_python_that_hangs(hangs):
    python = hangs.program("python")
    args = {"python": python, "package": "demo", "import_name": "demo", "timeout": DEADLINE_S}
    result, elapsed, survivors = timed("runtime_check", args, hangs)
    assert_killed_in_time(elapsed, survivors)
    assert result["failed"]
    assert f"`{python} -c <runtime probe> demo demo` did not finish within" in result["msg"]
    assert "runtime_check's timeout=1.5s" in result["msg"]


@pytest.mark.runtime
def test_runtime_check_fails_naming_a_pip_check_that_hangs(hangs):
    python = hangs.program("python", hang_only_for=["-m", "pip"])
    # The probe itself (a real Python, about 0.3 s) takes its share of the deadline; pip
    # check hangs.
    deadline = 4
    args = {"python": python, "package": "pip", "import_name": "pip", "timeout": deadline}
    result, elapsed, survivors = timed("runtime_check", args, hangs)
    assert_killed_in_time(elapsed, survivors, deadline)
    assert result["failed"]
    assert f"`{python} -m pip check` did not finish within" in result["msg"]
    assert "runtime_check's timeout=4s" in result["msg"]


@pytest.mark.runtime
def test_runtime_check_records_a_check_env_that_hangs_and_goes_on(hangs):
    """check_env is a report: at its own deadline it is killed with its group and written down
    as timed out, and the module still answers with the rest of the record."""
    python = hangs.program("python", hang_only_for=["-m", "sglang.check_env"])
    args = {
        "python": python,
        "package": "pip",
        "import_name": "pip",
        "check_env": True,
        "check_env_timeout": DEADLINE_S,
        "fail_on_mismatch": False,
    }
    result, _, survivors = timed("runtime_check", args, hangs)
    # The probe and pip check run first, real Pythons whose time a loaded machine stretches:
    # the deadline is held from the moment the hung check_env began.
    assert_killed_in_time(time.monotonic() - hangs.first_started(), survivors)
    assert not result.get("failed"), result
    record = result["ansible_facts"]["kimi_runtime"]["check_env"]
    assert record["ok"] is False and record["rc"] is None and record["output"] == ""
    assert f"`{python} -m sglang.check_env` did not finish within" in record["error"]
    assert "check_env_timeout=1.5s" in record["error"]


@pytest.mark.runtime
def test_launch_check_kills_a_runtime_that_ignores_the_probes_own_alarm(hangs):
    python = hangs.program("python")
    args = {"python": python, "argv": [python, "-m", "sglang.launch_server"], "timeout": 1}
    result, elapsed, survivors = timed("launch_check", args, hangs)
    # The probe's own alarm gets the timeout; the kill comes a grace period after it.
    assert_killed_in_time(elapsed, survivors, 1 + 1.1)
    assert result["failed"]
    assert f"`{python} -c <launch probe> 1` did not finish within" in result["msg"]
    assert "launch_check's timeout=1s + 1.1s" in result["msg"]


# --------------------------------------------------------------------------------------------
# The server's modules: server_health polls systemd and its journal, server_service drives it.


def test_server_health_fails_a_poll_whose_systemctl_hangs(hangs, monkeypatch):
    hangs.program("systemctl")
    monkeypatch.setenv("PATH", f"{hangs.bin}:{os.environ['PATH']}")
    args = {"url": "http://127.0.0.1:9", "manager": "systemd", "command_timeout": DEADLINE_S}
    result, elapsed, survivors = timed("server_health", args, hangs)
    assert_killed_in_time(elapsed, survivors)
    assert result.get("failed"), result
    assert "`systemctl show" in result["msg"] and "command_timeout=1.5s" in result["msg"]


def test_server_service_fails_naming_a_systemctl_that_hangs(hangs, monkeypatch):
    hangs.program("systemctl")
    monkeypatch.setenv("PATH", f"{hangs.bin}:{os.environ['PATH']}")
    args = {"manager": "systemd", "name": "kimi-sglang", "state": "stopped"}
    result, elapsed, survivors = timed(
        "server_service", {**args, "command_timeout": DEADLINE_S}, hangs
    )
    assert_killed_in_time(elapsed, survivors)
    assert result.get("failed"), result
    assert "did not finish within" in result["msg"] and "`systemctl" in result["msg"]
    assert "limit of 1.5s" in result["msg"]
