"""The tuning role over SSH test hosts: converge, idempotence, check mode, restore through
teardown.yml, a missing fabric manager, the all-reduce check with the runtime's Python. The
tuning writes under /srv on test hosts (private to each), never this machine's own values
(real_machine_untouched compares them).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.support.hostprep import (
    EXTRAVARS,
    SYS_ROOT,
    install_fabricmanager,
    pcie_tree,
    prepare_host,
    put_file,
    warning_text,
)

REPO = Path(__file__).resolve().parents[2]
FAKES = REPO / "tests" / "support" / "fakes"
CAPTURES = REPO / "tests" / "fixtures" / "gpu-hosts"
DRIVER = "580.159.04"  # of every GPU capture
pytestmark = [pytest.mark.tuning, pytest.mark.usefixtures("real_machine_untouched")]


# --------------------------------------------------------------------------------------------
# Over SSH test hosts.

TUNE = "Tune the host and record every value changed"
RESTORE = "Restore the host values the tuning changed"


def prepare_pcie_tree(cluster, name: str, tmp_path: Path) -> None:
    """The ct200 capture's PCIe layout under /srv, a fake lspci, one redirecting bridge."""
    acsctl = pcie_tree(tmp_path / "pcie" / SYS_ROOT.lstrip("/"), redirecting="0000:42:00.0")
    archive = subprocess.run(
        ["tar", "-C", str(tmp_path / "pcie"), "-czf", "-", "srv"], capture_output=True, check=True
    ).stdout
    put_file(cluster, name, "/root/pcie.tgz", archive)
    cluster.ssh(name, "tar -C / -xzf /root/pcie.tgz && rm /root/pcie.tgz")
    put_file(cluster, name, "/etc/fake-lspci/acsctl.json", json.dumps(acsctl).encode())
    put_file(cluster, name, "/usr/local/bin/lspci", (FAKES / "lspci.py").read_bytes(), "0755")


def host_values(cluster, name: str) -> dict:
    script = textwrap.dedent(
        f"""\
        import glob, json, os, subprocess
        def read(path):
            return open(path).read().strip() if os.path.exists(path) else None
        def program(pid):
            try:
                return open(f"/proc/{{pid}}/cmdline", "rb").read().split(b"\\0")[0]
            except OSError:
                return None
        query = subprocess.run(["nvidia-smi", "--query-gpu=persistence_mode",
                                "--format=csv,noheader"], capture_output=True, text=True)
        fm = [p for p in os.listdir("/proc") if p.isdigit() and program(p) == b"nv-fabricmanager"]
        print(json.dumps({{
            "numa_balancing": read("{SYS_ROOT}/proc/sys/kernel/numa_balancing"),
            "governors": sorted({{read(p) for p in glob.glob(
                "{SYS_ROOT}/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor")}}),
            "nccl_conf": read("/etc/nccl.conf"),
            "sysctl_conf": read("/etc/sysctl.d/90-kimi-tuning.conf"),
            "persistence": sorted(set(query.stdout.split())),
            "fabricmanager_running": bool(fm),
            "state_file": read("/var/lib/kimi/tuning-state.json") is not None,
            "acs_report": read("/var/lib/kimi/acs-report.json"),
        }}))
        """
    )
    encoded = base64.b64encode(script.encode()).decode()
    out = cluster.ssh(name, f"echo {encoded} | base64 -d | python3 -")
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("test hosts need root (network and mount namespaces)")
    from tests.support.testhosts import TestHostCluster

    cluster = TestHostCluster.up(
        ["ct200", "b200", "h200"], names=["ct200-0", "b200-0", "h200-nofm"]
    )
    try:
        prepare_host(cluster, "ct200-0", cpufreq=True)
        # Like a virtual machine: no cpufreq, which the role must skip cleanly.
        prepare_host(cluster, "b200-0", cpufreq=False)
        prepare_host(cluster, "h200-nofm", cpufreq=False)
        prepare_pcie_tree(cluster, "ct200-0", tmp_path_factory.mktemp("pcie"))
        install_fabricmanager(cluster, "b200-0")
        yield cluster
    finally:
        cluster.down()


@pytest.mark.integration
def test_role_converges_is_idempotent_and_teardown_restores(hosts, playbook):
    good = "ct200-0,b200-0"
    before = {name: host_values(hosts, name) for name in ("ct200-0", "b200-0")}
    assert before["ct200-0"]["numa_balancing"] == "1"
    assert before["b200-0"]["persistence"] == ["Disabled"]

    check = playbook(
        "playbooks/tuning.yml", hosts.inventory, extravars=EXTRAVARS, limit=good, check=True
    )
    assert check.rc == 0, check.stdout
    assert all(check.changed().get(name) for name in ("ct200-0", "b200-0")), check.changed()
    would = {name: {c["key"] for c in res["changes"]} for name, res in check.results(TUNE).items()}
    assert "sysctl:kernel.numa_balancing" in would["ct200-0"]
    assert "file:/etc/nccl.conf" in would["b200-0"]
    assert "process:nv-fabricmanager" in would["b200-0"]
    for name in before:
        assert host_values(hosts, name) == before[name], f"check mode changed {name}"

    run = playbook("playbooks/tuning.yml", hosts.inventory, extravars=EXTRAVARS, limit=good)
    assert run.rc == 0, run.stdout
    ct200, b200 = host_values(hosts, "ct200-0"), host_values(hosts, "b200-0")
    for values in (ct200, b200):
        assert values["numa_balancing"] == "0"
        assert values["persistence"] == ["Enabled"]
        assert values["sysctl_conf"].endswith("kernel.numa_balancing = 0")
        assert values["state_file"]
    # Each profile's NCCL environment from group_vars/<profile>.yml.
    assert "NCCL_P2P_DISABLE=1" in ct200["nccl_conf"] and "NCCL_IB_DISABLE=1" in ct200["nccl_conf"]
    assert "NCCL_NVLS_ENABLE=0" in b200["nccl_conf"] and "P2P" not in b200["nccl_conf"]
    assert b200["fabricmanager_running"] and not ct200["fabricmanager_running"]
    assert ct200["governors"] == ["performance"] and b200["governors"] == []
    report = json.loads(ct200["acs_report"])
    assert report["checked"] and report["redirecting"] == ["0000:42:00.0"]
    assert b200["acs_report"] is None
    tuned = run.results(TUNE)
    assert "ACS redirects" in warning_text(tuned["ct200-0"])
    assert run.changed().get("b200-0"), "a host without cpufreq must still report its changes"
    not_applied = {item["what"]: item["reason"] for item in tuned["b200-0"]["not_applied"]}
    assert "no cpufreq" in not_applied["cpu_governor"]

    second = playbook("playbooks/tuning.yml", hosts.inventory, extravars=EXTRAVARS, limit=good)
    second.assert_unchanged()

    # The whole teardown: the server's stop (no server runs here), then the restore.
    teardown = playbook("teardown.yml", hosts.inventory, limit=good)
    assert teardown.rc == 0, teardown.stdout
    assert set(teardown.results(RESTORE)) == {"ct200-0", "b200-0"}
    for name in before:
        after = host_values(hosts, name)
        assert after["numa_balancing"] == "1"
        assert after["persistence"] == ["Disabled"]
        assert after["nccl_conf"] is None and after["sysctl_conf"] is None
        assert not after["state_file"] and not after["fabricmanager_running"]
    assert host_values(hosts, "ct200-0")["governors"] == ["powersave"]
    # The restore play alone (`--tags tuning`), with nothing left to restore.
    again = playbook(
        "teardown.yml", hosts.inventory, limit=good, envvars={"ANSIBLE_RUN_TAGS": "tuning"}
    )
    again.assert_unchanged()
    assert "nothing to restore" in again.results(RESTORE)["ct200-0"]["msg"]


@pytest.mark.integration
def test_nvswitch_host_without_fabricmanager_fails_clearly(hosts, playbook):
    run = playbook("playbooks/tuning.yml", hosts.inventory, extravars=EXTRAVARS, limit="h200-nofm")
    assert run.rc != 0
    result = run.results(TUNE)["h200-nofm"]
    assert result["failed"]
    assert "The NVIDIA fabric manager is not installed: found no nv-fabricmanager" in result["msg"]
    assert "nvidia-fabricmanager-580" in result["msg"]
    values = host_values(hosts, "h200-nofm")
    assert values["numa_balancing"] == "1" and not values["state_file"]
    assert values["nccl_conf"] is None


@pytest.mark.integration
def test_nvswitch_profile_without_nvls_choice_fails_clearly(hosts, playbook):
    run = playbook(
        "playbooks/tuning.yml",
        hosts.inventory,
        extravars={**EXTRAVARS, "kimi_nccl_environment": {"NCCL_DEBUG": "WARN"}},
        limit="b200-0",
    )
    assert run.rc != 0
    result = run.results("Check the NVSwitch profile's NVLS choice")["b200-0"]
    assert "does not set NCCL_NVLS_ENABLE" in result["msg"]
    assert "group_vars/b200.yml" in result["msg"]


FAKE_RUNTIME_PYTHON = """\
#!/bin/sh
# Stands in for the runtime's Python: keeps the environment it was given, and reports a torch
# that sees one GPU, so that the all-reduce check has nothing to measure.
env > /root/allreduce-env
echo 'ALLREDUCE_PROBE {"python": "3.12.3", "torch": "2.11.0+cu130", "cuda": "13.0", \
"cuda_available": true, "gpus": 1, "nccl_available": true, "nccl": "2.28.9", \
"gpu_names": ["NVIDIA RTX PRO 6000 Blackwell Server Edition"]}'
"""


@pytest.mark.integration
def test_allreduce_check_runs_with_the_runtime_python_and_nccl_environment(hosts, playbook):
    put_file(hosts, "ct200-0", "/root/fake-python", FAKE_RUNTIME_PYTHON.encode(), "0755")
    extravars = {
        **EXTRAVARS,
        "tuning_allreduce_check": True,
        "tuning_allreduce_python": "/root/fake-python",
    }
    run = playbook("playbooks/tuning.yml", hosts.inventory, extravars=extravars, limit="ct200-0")
    assert run.rc == 0, run.stdout
    # The module ran (the probe left its environment behind) and, with one GPU, skipped.
    skipped = [
        event
        for event in run.events
        if event["event"] == "runner_on_skipped"
        and event["event_data"].get("task") == "Measure all-reduce with the tuned NCCL environment"
    ]
    assert len(skipped) == 1
    env = hosts.ssh("ct200-0", "cat /root/allreduce-env").stdout.splitlines()
    assert {"NCCL_P2P_DISABLE=1", "NCCL_MIN_NCHANNELS=8", "NCCL_IB_DISABLE=1"} <= set(env)
    restore = playbook(
        "teardown.yml", hosts.inventory, limit="ct200-0", envvars={"ANSIBLE_RUN_TAGS": "tuning"}
    )
    assert restore.rc == 0, restore.stdout


CALIBRATE = "Calibrate the speed model on this host's GPU"


@pytest.mark.integration
def test_calibrate_tag_records_on_host_and_controller_and_a_second_run_changes_nothing(
    hosts, playbook, tmp_path
):
    """deploy_kimi.yml --tags calibrate: the calibration alone (no stage), its record on the host
    and fetched to the controller; the second run keeps it (changed=0)."""
    from ansible.module_utils.tuning.speed_calibration import record_problems

    fake = (FAKES / "speed_calibration_python.py").read_bytes()
    put_file(hosts, "h200-nofm", "/root/fake-calibration-python", fake, "0755")
    state = tmp_path / "state"
    extravars = {
        **EXTRAVARS,
        "tuning_speed_calibration_python": "/root/fake-calibration-python",
        "kimi_controller_state_dir": str(state),
    }

    def calibrate():
        return playbook(
            "deploy_kimi.yml",
            hosts.inventory,
            extravars=extravars,
            limit="h200-nofm",
            tags="calibrate",
        )

    run = calibrate()
    assert run.rc == 0, run.stdout[-8000:]
    assert run.results(CALIBRATE)["h200-nofm"]["measured"] is True
    # Only the calibration ran: no stage's tasks (the tuning's own first of all).
    assert not run.results(TUNE) and not run.results("Gather GPU facts")
    on_host = hosts.ssh("h200-nofm", "cat /var/lib/kimi/speed-calibration.json").stdout
    record = json.loads(on_host)
    assert record_problems(record) == [] and record["gpu"]["name"] == "NVIDIA H200"
    assert [row["tokens"] for row in record["moe"]["rows"]] == [1, 8, 17, 33, 65, 129, 257]
    assert (state / "h200-nofm" / "speed-calibration.json").read_text() == on_host

    second = calibrate()
    second.assert_unchanged()
    assert second.results(CALIBRATE)["h200-nofm"]["measured"] is False
    assert hosts.ssh("h200-nofm", "cat /var/lib/kimi/speed-calibration.json").stdout == on_host
