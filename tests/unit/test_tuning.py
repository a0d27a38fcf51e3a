"""The tuning stage in-process: host_tuning against fake /proc/sys and /sys trees, and its
module_utils pieces directly (tests/integration/test_tuning.py runs the role over SSH).

kernel.numa_balancing and cpufreq are not namespaced, so every run here points the module's
root prefix at a fake tree in tmp_path; the real values of this machine are compared before
and after (real_machine_untouched). The all-reduce check: tests/unit/test_allreduce_check.py.
"""

from __future__ import annotations

import json
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible.module_utils.tuning.gpu_services import (
    fabricmanager_package_hint,
    parse_gpu_query,
    parse_version,
)
from ansible.module_utils.tuning.host_tuning import acs_warning, restore_entry
from ansible.module_utils.tuning.host_values import (
    cpufreq_governor_files,
    manage_file,
    nccl_environment_problems,
    render_nccl_conf,
    render_sysctl_conf,
    restore_file,
    sysctl_problems,
    tune_sysctls,
)
from ansible.module_utils.tuning.record import (
    TuningAbort,
    TuningError,
    TuningRun,
    describe,
    dump_state,
    load_state,
    new_state,
    public,
    record,
    summarise,
)
from ansible.module_utils.tuning.services import (
    parse_unit_show,
    pids_named,
    start_daemon,
    stop_pids,
)

from tests.support.hostprep import pcie_tree, warning_text
from tests.support.modules import assert_unchanged, load_module, run_module

REPO = Path(__file__).resolve().parents[2]
FAKES = REPO / "tests" / "support" / "fakes"
CAPTURES = REPO / "tests" / "fixtures" / "gpu-hosts"
DRIVER = "580.159.04"  # of every GPU capture
pytestmark = [pytest.mark.tuning, pytest.mark.usefixtures("real_machine_untouched")]


# --------------------------------------------------------------------------------------------
# In-process: a fake host in tmp_path.

FAKE_SYSTEMCTL = """\
#!{python}
import json, os, sys
path = os.environ["FAKE_SYSTEMCTL_STATE"]
units = json.load(open(path))
command, name = sys.argv[1], sys.argv[2]
unit = units.get(name)
if command == "show":
    if unit is None:
        print("LoadState=not-found\\nActiveState=inactive\\nUnitFileState=")
    else:
        print(f"LoadState=loaded\\nActiveState={{unit['active']}}\\nUnitFileState={{unit['file']}}")
    sys.exit(0)
if unit is None:
    print(f"Failed to {{command}} {{name}}.service: Unit not found.", file=sys.stderr)
    sys.exit(5)
if unit.get("fails") == command:
    print(f"Job for {{name}}.service failed.", file=sys.stderr)
    sys.exit(1)
changes = {{"enable": ("file", "enabled"), "disable": ("file", "disabled"),
           "start": ("active", "active"), "stop": ("active", "inactive")}}
field, value = changes[command]
unit[field] = value
json.dump(units, open(path, "w"))
"""


def write_exe(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


class FakeHost:
    """A fake root tree, a fake nvidia-smi and systemctl, and the module arguments for them."""

    def __init__(self, tmp_path: Path, monkeypatch, capture: str = "ct200-x8"):
        self.tmp = tmp_path
        self.root = tmp_path / "root"
        self.etc = tmp_path / "etc"
        self.bin = tmp_path / "bin"
        self.smi_state = tmp_path / "fake-nvidia-smi"
        self.units_file = tmp_path / "units.json"
        self.set("proc/sys/kernel/numa_balancing", "1\n")
        for cpu in range(4):
            self.set(f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor", "powersave\n")
            self.set(
                f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_available_governors",
                "performance powersave\n",
            )
        monkeypatch.setenv("FAKE_NVIDIA_SMI_CAPTURE", str(CAPTURES / capture))
        monkeypatch.setenv("FAKE_NVIDIA_SMI_STATE_DIR", str(self.smi_state))
        monkeypatch.setenv("FAKE_NVIDIA_SMI_FAULT_FILE", str(self.smi_state / "fault"))
        monkeypatch.setenv("FAKE_SYSTEMCTL_STATE", str(self.units_file))
        self.smi = write_exe(
            self.bin / "nvidia-smi",
            f'#!/bin/sh\nexec {sys.executable} {FAKES / "nvidia_smi.py"} "$@"\n',
        )
        # Never the machine's own systemctl, even by accident: a fake in every argument set.
        self.systemctl = write_exe(
            self.bin / "systemctl", FAKE_SYSTEMCTL.format(python=sys.executable)
        )
        self.units({})
        gpus = 8 if capture.endswith("x8") else 2
        self.persistence({str(i): "Disabled" for i in range(gpus)})

    def set(self, relative: str, text: str) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def get(self, relative: str) -> str:
        return (self.root / relative).read_text().strip()

    def units(self, units: dict) -> None:
        self.units_file.write_text(json.dumps(units))

    def unit_state(self) -> dict:
        return json.loads(self.units_file.read_text())

    def persistence(self, modes: dict) -> None:
        self.smi_state.mkdir(exist_ok=True)
        (self.smi_state / "persistence_mode.json").write_text(json.dumps(modes))

    def persistence_modes(self) -> set[str]:
        out = subprocess.run(
            [str(self.smi), "--query-gpu=persistence_mode", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return set(out.split())

    @property
    def state_file(self) -> Path:
        return self.tmp / "var" / "tuning-state.json"

    @property
    def nccl_conf(self) -> Path:
        return self.etc / "nccl.conf"

    @property
    def sysctl_conf(self) -> Path:
        return self.etc / "sysctl.d" / "90-kimi-tuning.conf"

    def args(self, **overrides) -> dict:
        return {
            "state_file": str(self.state_file),
            "root": str(self.root),
            "sysctls": {"kernel.numa_balancing": "0"},
            "sysctl_conf": str(self.sysctl_conf),
            "cpu_governor": "performance",
            "nccl_environment": {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1"},
            "nccl_conf": str(self.nccl_conf),
            "persistence_mode": True,
            "nvidia_smi_path": str(self.smi),
            "systemctl_path": str(self.systemctl),
            "lspci_path": str(self.bin / "no-lspci"),
            "service_manager": "direct",
            **overrides,
        }

    def restore_args(self) -> dict:
        return {
            "state": "restored",
            "state_file": str(self.state_file),
            "nvidia_smi_path": str(self.smi),
            "systemctl_path": str(self.systemctl),
            "service_manager": "direct",
        }

    def values(self) -> dict:
        return {
            "numa_balancing": self.get("proc/sys/kernel/numa_balancing"),
            "governors": {
                self.get(f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor")
                for cpu in range(4)
            },
            "nccl_conf": self.nccl_conf.read_text() if self.nccl_conf.exists() else None,
            "sysctl_conf": self.sysctl_conf.read_text() if self.sysctl_conf.exists() else None,
            "persistence": self.persistence_modes(),
        }


@pytest.fixture
def host(tmp_path, monkeypatch):
    return FakeHost(tmp_path, monkeypatch)


def test_apply_sets_and_records_every_value_then_changes_nothing(host):
    result = run_module("host_tuning", host.args())
    assert not result.get("failed"), result["msg"]
    assert result["changed"]
    values = host.values()
    assert values["numa_balancing"] == "0"
    assert values["governors"] == {"performance"}
    assert values["persistence"] == {"Enabled"}
    assert "NCCL_IB_DISABLE=1\nNCCL_P2P_DISABLE=1\n" in values["nccl_conf"]
    # NCCL takes every line with "=" as a variable: the header must have none.
    assert all("=" not in line for line in values["nccl_conf"].splitlines() if line.startswith("#"))
    assert "kernel.numa_balancing = 0\n" in values["sysctl_conf"]

    state = json.loads(host.state_file.read_text())
    assert stat.S_IMODE(host.state_file.stat().st_mode) == 0o600
    changes = state["changes"]
    assert changes["sysctl:kernel.numa_balancing"]["previous"] == "1"
    assert changes["cpufreq:scaling_governor"]["previous"] == {
        f"cpu{i}": "powersave" for i in range(4)
    }
    assert changes[f"file:{host.nccl_conf}"]["previous"] == {"exists": False}
    assert sum(key.startswith("persistence_mode:") for key in changes) == 8
    assert result["recorded"] == list(changes)
    descriptions = [c["description"] for c in result["changes"]]
    assert "sysctl kernel.numa_balancing: 1 -> 0" in descriptions
    assert "CPU governor on 4 CPU(s): powersave -> performance" in descriptions

    again = run_module("host_tuning", host.args())
    assert_unchanged(again)
    assert again["changes"] == []
    assert json.loads(host.state_file.read_text()) == state


def test_check_mode_reports_and_changes_nothing(host):
    before = host.values()
    result = run_module("host_tuning", host.args(), check_mode=True)
    assert result["changed"]
    assert {c["key"] for c in result["changes"]} >= {
        "sysctl:kernel.numa_balancing",
        "cpufreq:scaling_governor",
        f"file:{host.nccl_conf}",
        f"file:{host.sysctl_conf}",
    }
    assert result["msg"].startswith("would change")
    assert host.values() == before
    assert not host.state_file.exists()


def test_restore_brings_previous_values_back(host):
    host.etc.mkdir(parents=True)
    host.nccl_conf.write_text("NCCL_DEBUG=WARN\n")
    host.nccl_conf.chmod(0o640)
    before = host.values()
    assert run_module("host_tuning", host.args())["changed"]
    assert host.values() != before

    check = run_module("host_tuning", host.restore_args(), check_mode=True)
    assert check["changed"] and check["msg"].startswith("would restore")
    assert host.state_file.exists()

    restored = run_module("host_tuning", host.restore_args())
    assert not restored.get("failed"), restored["msg"]
    assert restored["changed"]
    descriptions = [c["description"] for c in restored["changes"]]
    assert "restore sysctl kernel.numa_balancing: 0 -> 1" in descriptions
    assert f"restore file {host.nccl_conf}: managed content -> previous content" in descriptions
    assert host.values() == before
    assert stat.S_IMODE(host.nccl_conf.stat().st_mode) == 0o640
    assert not host.sysctl_conf.exists()
    assert not host.state_file.exists()

    again = run_module("host_tuning", host.restore_args())
    assert_unchanged(again)
    assert "nothing to restore" in again["msg"]


def test_first_previous_value_is_kept_across_runs(host):
    run_module("host_tuning", host.args())
    host.set("proc/sys/kernel/numa_balancing", "2\n")
    rerun = run_module("host_tuning", host.args())
    assert [c["key"] for c in rerun["changes"]] == ["sysctl:kernel.numa_balancing"]
    state = json.loads(host.state_file.read_text())
    assert state["changes"]["sysctl:kernel.numa_balancing"]["previous"] == "1"
    run_module("host_tuning", host.restore_args())
    assert host.get("proc/sys/kernel/numa_balancing") == "1"


def test_missing_sysctl_and_cpufreq_are_skipped_cleanly(tmp_path, monkeypatch):
    host = FakeHost(tmp_path, monkeypatch, capture="h200-x2")
    (host.root / "proc").rename(tmp_path / "gone-proc")
    (host.root / "sys").rename(tmp_path / "gone-sys")
    result = run_module("host_tuning", host.args())
    assert not result.get("failed"), result["msg"]
    skipped = {s["what"]: s["reason"] for s in result["not_applied"]}
    assert "does not exist in this kernel" in skipped["sysctl kernel.numa_balancing"]
    assert "no cpufreq" in skipped["cpu_governor"]
    # Only the sysctls the kernel has go to the sysctl.d file: here none, so no file.
    assert not host.sysctl_conf.exists()
    assert host.persistence_modes() == {"Enabled"}


def test_governor_the_kernel_lacks_fails_clearly(host):
    result = run_module("host_tuning", host.args(cpu_governor="ondemand"))
    assert result["failed"]
    assert "The CPU governor ondemand is not available on cpu0" in result["msg"]
    assert "performance powersave" in result["msg"]
    assert "tuning_cpu_governor" in result["msg"]


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({"NCCL_P2P_DISABLE": 1}, "is a int; needed a string"),
        ({"P2P_DISABLE": "1"}, "is not an NCCL variable"),
        ({"NCCL_P2P_DISABLE": "1", "NCCL_P2P_LEVEL": "PIX"}, "keep one of the two"),
        ({"NCCL_ALGO": "Ring\nTree"}, "multi-line"),
    ],
    ids=["integer", "not-nccl", "p2p-contradiction", "newline"],
)
def test_bad_nccl_environment_fails_before_changing_anything(host, environment, expected):
    result = run_module("host_tuning", host.args(nccl_environment=environment))
    assert result["failed"]
    assert expected in result["msg"]
    assert "kimi_nccl_environment" in result["msg"]
    assert host.get("proc/sys/kernel/numa_balancing") == "1"
    assert not host.state_file.exists()


def test_persistence_refused_fails_and_keeps_what_changed_restorable(host):
    (host.smi_state / "persistence_mode.denied").write_text("")
    result = run_module("host_tuning", host.args())
    assert result["failed"]
    assert "Persistence mode is still off" in result["msg"]
    assert "Insufficient Permissions" in result["msg"]
    assert "root on the host" in result["msg"]
    # What was changed before the failure is recorded, so teardown can still put it back.
    state = json.loads(host.state_file.read_text())
    assert "sysctl:kernel.numa_balancing" in state["changes"]
    (host.smi_state / "persistence_mode.denied").unlink()
    run_module("host_tuning", host.restore_args())
    assert host.get("proc/sys/kernel/numa_balancing") == "1"


def test_corrupt_state_file_fails_clearly(host):
    host.state_file.parent.mkdir(parents=True)
    host.state_file.write_text("{not json")
    result = run_module("host_tuning", host.args())
    assert result["failed"]
    assert "is not JSON" in result["msg"] and "values to restore" in result["msg"]
    assert host.get("proc/sys/kernel/numa_balancing") == "1"


def nvswitch_host(tmp_path, monkeypatch, fm_version: str | None = DRIVER) -> FakeHost:
    host = FakeHost(tmp_path, monkeypatch, capture="b200-x8")
    if fm_version:
        write_exe(
            host.bin / "nv-fabricmanager",
            f"#!/bin/sh\necho 'Fabric Manager version is : {fm_version}'\n",
        )
    return host


def systemd_args(host: FakeHost, **overrides) -> dict:
    return host.args(
        **{
            "service_manager": "systemd",
            "fabricmanager": True,
            "fabricmanager_binary": str(host.bin / "nv-fabricmanager"),
            "nccl_environment": {"NCCL_NVLS_ENABLE": "0"},
            **overrides,
        }
    )


def test_systemd_services_are_enabled_started_and_restored(tmp_path, monkeypatch):
    host = nvswitch_host(tmp_path, monkeypatch)
    host.units(
        {
            "nvidia-persistenced": {"file": "disabled", "active": "inactive"},
            "nvidia-fabricmanager": {"file": "disabled", "active": "inactive"},
        }
    )
    result = run_module("host_tuning", systemd_args(host))
    assert not result.get("failed"), result["msg"]
    assert result["service_manager"] == "systemd"
    assert result["fabricmanager"]["version"] == DRIVER
    assert host.unit_state() == {
        "nvidia-persistenced": {"file": "enabled", "active": "active"},
        "nvidia-fabricmanager": {"file": "enabled", "active": "active"},
    }
    descriptions = [c["description"] for c in result["changes"]]
    assert "service nvidia-fabricmanager: disabled/inactive -> enabled/active" in descriptions
    assert_unchanged(run_module("host_tuning", systemd_args(host)))

    restore = {**host.restore_args(), "service_manager": "systemd"}
    assert run_module("host_tuning", restore)["changed"]
    assert host.unit_state() == {
        "nvidia-persistenced": {"file": "disabled", "active": "inactive"},
        "nvidia-fabricmanager": {"file": "disabled", "active": "inactive"},
    }
    assert host.persistence_modes() == {"Disabled"}


def test_fabricmanager_that_will_not_start_shows_its_journal(tmp_path, monkeypatch):
    host = nvswitch_host(tmp_path, monkeypatch)
    host.units({"nvidia-fabricmanager": {"file": "enabled", "active": "failed", "fails": "start"}})
    result = run_module("host_tuning", systemd_args(host))
    assert result["failed"]
    assert "nvidia-fabricmanager did not start" in result["msg"]
    assert "Its journal" in result["msg"]


@pytest.mark.parametrize("manager", ["systemd", "direct"])
def test_missing_fabricmanager_fails_before_changing_anything(tmp_path, monkeypatch, manager):
    host = nvswitch_host(tmp_path, monkeypatch, fm_version=None)
    result = run_module("host_tuning", systemd_args(host, service_manager=manager))
    assert result["failed"]
    assert "The NVIDIA fabric manager is not installed" in result["msg"]
    assert "nvidia-fabricmanager-580" in result["msg"] and DRIVER in result["msg"]
    assert host.get("proc/sys/kernel/numa_balancing") == "1"
    assert not host.state_file.exists()


def test_fabricmanager_of_another_driver_version_fails_clearly(tmp_path, monkeypatch):
    host = nvswitch_host(tmp_path, monkeypatch, fm_version="570.86.15")
    host.units({"nvidia-fabricmanager": {"file": "enabled", "active": "active"}})
    result = run_module("host_tuning", systemd_args(host))
    assert result["failed"]
    assert f"version 570.86.15 but the driver is {DRIVER}" in result["msg"]
    assert host.get("proc/sys/kernel/numa_balancing") == "1"


def test_acs_report_names_redirecting_bridges_and_changes_nothing(host, monkeypatch):
    acsctl = pcie_tree(host.root, redirecting="0000:02:00.0")
    (host.tmp / "acsctl.json").write_text(json.dumps(acsctl))
    monkeypatch.setenv("FAKE_LSPCI_ACSCTL", str(host.tmp / "acsctl.json"))
    lspci = write_exe(
        host.bin / "lspci", f'#!/bin/sh\nexec {sys.executable} {FAKES / "lspci.py"} "$@"\n'
    )
    report_file = host.tmp / "var" / "acs-report.json"
    args = host.args(lspci_path=str(lspci), acs_report_file=str(report_file))
    result = run_module("host_tuning", args)
    acs = result["acs"]
    assert acs["checked"] and acs["reason"] is None
    assert len(acs["gpus"]) == 8
    # Per switch: root port, upstream port, two downstream ports.
    assert len(acs["bridges"]) == 16
    assert acs["redirecting"] == ["0000:02:00.0"]
    assert json.loads(report_file.read_text()) == acs
    warnings = warning_text(result)
    assert "ACS redirects" in warnings and "NCCL_P2P_DISABLE=1 is set" in warnings
    assert not any(c["key"].startswith("acs") for c in result["changes"])

    again = run_module("host_tuning", args)
    assert_unchanged(again)
    with_p2p = run_module("host_tuning", {**args, "nccl_environment": {"NCCL_P2P_LEVEL": "PIX"}})
    assert "NCCL P2P is on: set NCCL_P2P_DISABLE=1" in warning_text(with_p2p)


def test_acs_report_without_lspci_says_so(host):
    report_file = host.tmp / "acs-report.json"
    result = run_module("host_tuning", host.args(acs_report_file=str(report_file)))
    assert not result["acs"]["checked"]
    assert "lspci not found" in result["acs"]["reason"]
    assert "install pciutils" in json.loads(report_file.read_text())["reason"]


def test_fake_nvidia_smi_persistence_mode(host):
    """The fake keeps `-pm` in its state file and reports it in the query and the XML."""
    out = subprocess.run(
        [str(host.smi), "-i", "00000000:06:00.0", "-pm", "1"], capture_output=True, text=True
    )
    assert out.returncode == 0
    assert out.stdout == "Enabled Legacy persistence mode for GPU 00000000:06:00.0.\nAll done.\n"
    xml = subprocess.run([str(host.smi), "-q", "-x"], capture_output=True, text=True).stdout
    assert xml.count("<persistence_mode>Enabled</persistence_mode>") == 1
    assert xml.count("<persistence_mode>Disabled</persistence_mode>") == 7


# --------------------------------------------------------------------------------------------
# The module_utils pieces directly: no module run, no host.


def run_argv(argv: list[str]) -> tuple[int, str, str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr


def tuning_run(tmp_path: Path, check: bool = False, **params) -> tuple[TuningRun, list[str]]:
    """A run with the module's own defaults, as AnsibleModule would hand them over."""
    spec = load_module("host_tuning").ARGUMENT_SPEC
    defaults = {name: option.get("default") for name, option in spec.items()}
    warnings: list[str] = []
    run = TuningRun(
        {**defaults, "state_file": str(tmp_path / "state.json"), **params},
        check=check,
        run_command=run_argv,
        which=shutil.which,
        warn=warnings.append,
        manager="direct",
    )
    return run, warnings


def test_record_keeps_the_first_previous_value_and_merges_new_cpus():
    state = new_state()
    record(state, "sysctl:a.b", {"kind": "sysctl", "previous": "1", "value": "0"}, "t1")
    record(state, "sysctl:a.b", {"kind": "sysctl", "previous": "2", "value": "0"}, "t2")
    assert state["changes"]["sysctl:a.b"] == {
        "kind": "sysctl",
        "previous": "1",
        "value": "0",
        "recorded_at": "t1",
        "updated_at": "t2",
    }
    first = {"kind": "cpufreq", "previous": {"cpu0": "powersave"}, "paths": {"cpu0": "/p0"}}
    record(state, "cpufreq:g", {**first, "value": "performance"}, "t1")
    # cpu0 was set meanwhile (its previous now reads performance); cpu1 came online.
    later = {"kind": "cpufreq", "previous": {"cpu0": "performance", "cpu1": "ondemand"}}
    record(state, "cpufreq:g", {**later, "paths": {"cpu1": "/p1"}, "value": "performance"}, "t2")
    entry = state["changes"]["cpufreq:g"]
    assert entry["previous"] == {"cpu0": "powersave", "cpu1": "ondemand"}
    assert entry["paths"] == {"cpu0": "/p0", "cpu1": "/p1"}
    assert load_state(dump_state(state), "s.json") == state


@pytest.mark.parametrize(
    ("text", "expected"),
    [("{not json", "is not JSON"), ('{"schema": 2, "changes": {}}', "has schema 2")],
)
def test_state_file_of_another_kind_is_refused(text, expected):
    with pytest.raises(TuningError, match=expected):
        load_state(text, "/var/lib/kimi/tuning-state.json")


def test_descriptions_and_summary_as_a_user_reads_them():
    service = {
        "kind": "service",
        "unit": "nvidia-persistenced",
        "previous": {"unit_file_state": "disabled", "active": False},
        "value": {"unit_file_state": "enabled", "active": True},
    }
    assert describe(service) == "service nvidia-persistenced: disabled/inactive -> enabled/active"
    assert describe(service, restore=True).endswith("enabled/active -> disabled/inactive")
    snapshot = {"exists": True, "content_b64": "eA==", "mode": "0640"}
    file_entry = {"kind": "file", "path": "/etc/nccl.conf", "previous": snapshot, "value": {}}
    # A file's previous content stays in the state file, out of the reported change.
    assert public("file:/etc/nccl.conf", file_entry)["previous"] == {"exists": True}
    gpus = [
        public(
            f"persistence_mode:{bus}",
            {"kind": "persistence_mode", "bus_id": bus, "previous": False, "value": True},
        )
        for bus in ("00000000:05:00.0", "00000000:06:00.0")
    ]
    sysctl = {"kind": "sysctl", "name": "kernel.numa_balancing", "previous": "1", "value": "0"}
    assert summarise([public("sysctl:kernel.numa_balancing", sysctl), *gpus]) == [
        "sysctl kernel.numa_balancing: 1 -> 0",
        "persistence mode on 2 GPU(s): off -> on",
    ]


def test_inputs_are_checked_before_anything_changes():
    assert sysctl_problems({"kernel.numa_balancing": "0", "vm.swappiness": 10}) == []
    problems = sysctl_problems({"numa": "0", "kernel.x": True, "kernel.y": "1\n2"})
    assert len(problems) == 3 and "is not dotted" in problems[0]
    assert nccl_environment_problems({"NCCL_ALGO": "Ring", "NCCL_MIN_NCHANNELS": "8"}) == []
    assert "over-long" in nccl_environment_problems({"NCCL_ALGO": "x" * 1024})[0]
    conf = render_nccl_conf({"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1"})
    assert conf.endswith("NCCL_IB_DISABLE=1\nNCCL_P2P_DISABLE=1\n")
    assert render_sysctl_conf({"kernel.numa_balancing": "0"}).endswith(
        "kernel.numa_balancing = 0\n"
    )


def test_governor_files_in_cpu_order_and_only_with_cpufreq(tmp_path):
    for cpu in (10, 2, 0):
        governor = tmp_path / f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor"
        governor.parent.mkdir(parents=True)
        governor.write_text("powersave\n")
    (tmp_path / "sys/devices/system/cpu/cpu3").mkdir()  # offline: no cpufreq
    (tmp_path / "sys/devices/system/cpu/cpufreq").mkdir()  # not a CPU
    files = cpufreq_governor_files(str(tmp_path))
    assert [cpu for cpu, _path in files] == ["cpu0", "cpu2", "cpu10"]
    assert cpufreq_governor_files(str(tmp_path / "nothing")) == []


def test_sysctls_in_check_mode_are_noted_not_written_nor_recorded(tmp_path):
    path = tmp_path / "proc/sys/kernel/numa_balancing"
    path.parent.mkdir(parents=True)
    path.write_text("1\n")
    sysctls = {"kernel.numa_balancing": "0", "kernel.no_such": "1"}
    run, _warnings = tuning_run(tmp_path, check=True, root=str(tmp_path), sysctls=sysctls)
    assert tune_sysctls(run) == {"kernel.numa_balancing": "0"}
    assert path.read_text() == "1\n"
    assert [c["description"] for c in run.changes] == ["sysctl kernel.numa_balancing: 1 -> 0"]
    assert run.not_applied[0]["what"] == "sysctl kernel.no_such"
    assert run.state["changes"] == {}
    run.save_state()
    assert not Path(run.state_path).exists()


def test_managed_file_restores_content_and_mode_or_removes_it(tmp_path):
    kept, created = tmp_path / "etc/nccl.conf", tmp_path / "etc/sysctl.d/90-kimi.conf"
    kept.parent.mkdir(parents=True)
    kept.write_text("NCCL_DEBUG=WARN\n")
    kept.chmod(0o640)
    run, _warnings = tuning_run(tmp_path)
    manage_file(run, str(kept), "NCCL_ALGO=Ring\n")
    manage_file(run, str(created), "kernel.numa_balancing = 0\n")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o644 and created.exists()
    assert run.diffs[0]["before"] == "NCCL_DEBUG=WARN\n"
    entries = run.state["changes"]
    assert entries[f"file:{created}"]["previous"] == {"exists": False}
    # The second time the content is as wanted: no change, no diff.
    manage_file(run, str(kept), "NCCL_ALGO=Ring\n")
    assert len(run.changes) == 2
    assert restore_file(run, entries[f"file:{kept}"])
    assert kept.read_text() == "NCCL_DEBUG=WARN\n"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640
    assert restore_file(run, entries[f"file:{created}"]) and not created.exists()
    assert not restore_file(run, entries[f"file:{created}"])


def test_nvidia_smi_query_and_fabricmanager_version():
    text = "0, 00000000:05:00.0, Disabled, 580.159.04\n\n1, 00000000:06:00.0, Enabled, 580.159.04\n"
    gpus = parse_gpu_query(text)
    assert [(g["index"], g["persistence_mode"]) for g in gpus] == [(0, False), (1, True)]
    with pytest.raises(TuningError, match="an old driver lacks these fields"):
        parse_gpu_query("0, 00000000:05:00.0, [N/A]\n")
    assert parse_version("Fabric Manager version is : 580.159.04") == "580.159.04"
    assert parse_version("no version here") is None
    hint = fabricmanager_package_hint("580.159.04")
    assert "nvidia-fabricmanager-580" in hint and "nvidia-fabricmanager-580.159.04" in hint


def test_unit_show_parsed_for_loaded_enabled_and_active():
    shown = "LoadState=loaded\nActiveState=active\nUnitFileState=enabled\n"
    assert parse_unit_show(shown) == {
        "loaded": True,
        "unit_file_state": "enabled",
        "active": True,
    }
    missing = parse_unit_show("LoadState=not-found\nActiveState=inactive\nUnitFileState=\n")
    assert missing == {"loaded": False, "unit_file_state": "unknown", "active": False}


def test_processes_found_by_program_name_and_stopped():
    proc = subprocess.Popen(["sleep", "60"])
    try:
        # Popen returns once exec has begun; the kernel fills /proc/<pid>/cmdline a moment
        # later, so the new process may need a few looks to show its name.
        deadline = time.monotonic() + 5
        while proc.pid not in pids_named("sleep") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.pid in pids_named("sleep")
        # It exits on SIGTERM; left a zombie until collected, it counts as stopped.
        assert stop_pids([proc.pid], grace_s=5) == []
        assert proc.wait(timeout=5) == -signal.SIGTERM
        assert proc.pid not in pids_named("sleep")
    finally:
        proc.kill()
        proc.wait(timeout=5)


def test_a_daemon_that_exits_fails_with_its_log(tmp_path):
    log = tmp_path / "daemon.log"
    log.write_text("NVSwitch not found\n")
    with pytest.raises(TuningAbort) as failed:
        start_daemon(["false"], "kimi-never-runs", 5, str(log))
    assert "kimi-never-runs did not stay running within 5s" in str(failed.value)
    assert "NVSwitch not found" in str(failed.value)


def test_restore_of_an_unknown_kind_is_refused_by_name(tmp_path):
    run, _warnings = tuning_run(tmp_path)
    with pytest.raises(TuningError, match="unknown kind 'sysfs'"):
        restore_entry(run, {"kind": "sysfs", "previous": "1"})


def test_acs_warning_advises_by_the_nccl_p2p_setting():
    bridges = ["0000:02:00.0"]
    disabled, enabled = acs_warning(bridges, True), acs_warning(bridges, False)
    assert "['0000:02:00.0']" in disabled and "NCCL_P2P_DISABLE=1 is set" in disabled
    assert "NCCL P2P is on: set NCCL_P2P_DISABLE=1" in enabled
    assert all("never changes it" in text for text in (disabled, enabled))
