"""gpu_facts: parsing of real and built captures, and its failure paths."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest
from ansible.module_utils.host.gpu_topology import GpuFactsError, build_facts, classify_interconnect
from ansible.module_utils.host.helpers import run_with_deadline

from tests.support.modules import marked_processes, run_module

REPO = Path(__file__).resolve().parents[2]
CAPTURES = REPO / "tests" / "fixtures" / "gpu-hosts"
FAKE = REPO / "tests" / "support" / "fakes" / "nvidia_smi.py"
pytestmark = pytest.mark.preflight


@pytest.fixture
def fake_smi(monkeypatch, tmp_path):
    """Point the fake nvidia-smi at a capture; returns a function that selects one."""
    fault = tmp_path / "fault"
    monkeypatch.setenv("FAKE_NVIDIA_SMI_FAULT_FILE", str(fault))

    def use(capture: str | Path, fault_mode: str | None = None) -> str:
        path = capture if isinstance(capture, Path) else CAPTURES / capture
        monkeypatch.setenv("FAKE_NVIDIA_SMI_CAPTURE", str(path))
        if fault_mode:
            fault.write_text(fault_mode)
        return str(FAKE)

    return use


def gpu_facts(nvidia_smi: str, **kwargs) -> dict:
    result = run_module("gpu_facts", {"nvidia_smi_path": nvidia_smi}, **kwargs)
    assert not result.get("failed"), result.get("msg")
    assert result["changed"] is False
    return result["ansible_facts"]["gpu_facts"]


def test_real_h200_capture(fake_smi):
    facts = gpu_facts(fake_smi("h200-x2"))
    assert facts["count"] == 2
    assert facts["driver_version"] == "580.159.04"
    assert facts["cuda_version"] == "13.0"
    assert facts["interconnect"] == "nvlink"
    assert facts["links"] == [["X", "NV18"], ["NV18", "X"]]
    assert facts["models"] == {"NVIDIA H200": 2}
    assert facts["homogeneous"] is True
    assert facts["fabric"] == {
        "state": "Completed",
        "status": "Success",
        "per_gpu": ["Completed", "Completed"],
    }
    assert facts["p2p"]["read"] == [["X", "OK"], ["OK", "X"]]
    assert facts["p2p_not_ok"] == {"read": [], "write": [], "nvlink": []}
    first = facts["devices"][0]
    assert first["memory_mib"] == 143771
    assert first["compute_capability"] == "9.0"
    assert first["pci_bus_id"] == "00000000:00:06.0"
    assert first["persistence_mode"] is True
    assert first["mig_enabled"] is False
    assert (first["pcie_link_gen_current"], first["pcie_link_gen_max"]) == (5, 5)
    assert (first["pcie_link_width_current"], first["pcie_link_width_max"]) == (16, 16)
    # sysfs says -1 on that VM and this machine has no such device: topo -m's NUMA affinity.
    assert [d["numa_node"] for d in facts["devices"]] == [0, 0]


def test_built_ct200_capture(fake_smi):
    facts = gpu_facts(fake_smi("ct200-x8"))
    assert facts["count"] == 8
    assert facts["interconnect"] == "pcie"
    assert facts["nvlink_pairs"] == 0
    assert facts["models"] == {"NVIDIA RTX PRO 6000 Blackwell Server Edition": 8}
    assert {d["compute_capability"] for d in facts["devices"]} == {"12.0"}
    assert {d["memory_mib"] for d in facts["devices"]} == {97887}
    assert [d["numa_node"] for d in facts["devices"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert facts["fabric"]["state"] == "N/A"
    assert facts["links"][0][4] == "SYS"


def test_built_b200_capture(fake_smi):
    facts = gpu_facts(fake_smi("b200-x8"))
    assert facts["count"] == 8
    assert facts["interconnect"] == "nvlink"
    assert facts["nvlink_pairs"] == facts["gpu_pairs"] == 28
    assert {d["compute_capability"] for d in facts["devices"]} == {"10.0"}
    assert {d["memory_mib"] for d in facts["devices"]} == {183359}
    assert facts["fabric"]["state"] == "Completed"
    assert facts["p2p_not_ok"]["read"] == []


def test_check_mode_gathers_the_same_facts(fake_smi):
    assert gpu_facts(fake_smi("b200-x8"), check_mode=True)["count"] == 8


def test_missing_nvidia_smi_says_what_to_install(tmp_path):
    result = run_module("gpu_facts", {"nvidia_smi_path": str(tmp_path / "nvidia-smi")})
    assert result["failed"]
    assert "nvidia-smi not found" in result["msg"]
    assert "install the driver" in result["msg"]


def test_missing_on_path(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    result = run_module("gpu_facts", {})
    assert result["failed"]
    assert "not found on PATH" in result["msg"]


def test_driver_not_loaded(fake_smi):
    result = run_module("gpu_facts", {"nvidia_smi_path": fake_smi("h200-x2", "no-driver")})
    assert result["failed"]
    assert "NVIDIA driver is not loaded" in result["msg"]
    assert "couldn't communicate with the NVIDIA driver" in result["msg"]


def test_no_gpus(fake_smi):
    result = run_module("gpu_facts", {"nvidia_smi_path": fake_smi("h200-x2", "no-devices")})
    assert result["failed"]
    assert "No GPUs found" in result["msg"]


def test_mixed_models_and_mig(fake_smi, tmp_path):
    capture = tmp_path / "mixed"
    shutil.copytree(CAPTURES / "h200-x2", capture)
    xml = (capture / "nvidia-smi-q.xml").read_text()
    second = xml.index('<gpu id="00000000:00:07.0">')
    tail = xml[second:].replace(
        "<product_name>NVIDIA H200</product_name>",
        "<product_name>NVIDIA H100 80GB HBM3</product_name>",
        1,
    )
    tail = tail.replace(
        "<current_mig>Disabled</current_mig>", "<current_mig>Enabled</current_mig>", 1
    )
    (capture / "nvidia-smi-q.xml").write_text(xml[:second] + tail)
    facts = gpu_facts(fake_smi(capture))
    assert facts["models"] == {"NVIDIA H200": 1, "NVIDIA H100 80GB HBM3": 1}
    assert facts["homogeneous"] is False
    assert facts["mig_enabled_gpus"] == [1]


def test_partial_nvlink_counts_as_pcie():
    links = [["X", "NV4", "SYS"], ["NV4", "X", "SYS"], ["SYS", "SYS", "X"]]
    assert classify_interconnect(links) == {
        "interconnect": "pcie",
        "nvlink_pairs": 1,
        "gpu_pairs": 3,
    }


def test_single_gpu_needs_no_topology():
    xml = (CAPTURES / "h200-x2" / "nvidia-smi-q.xml").read_text()
    first_only = xml[: xml.index('<gpu id="00000000:00:07.0">')] + "</nvidia_smi_log>\n"
    facts = build_facts(first_only, {"00000000:00:06.0": "9.0"}, None, {}, {})
    assert facts["count"] == 1
    assert facts["interconnect"] == "single"


def test_hanging_nvidia_smi_is_killed_whole_within_the_deadline(fake_smi, monkeypatch):
    marker = f"gpu-facts-hang-{uuid.uuid4().hex}"
    monkeypatch.setenv("FAKE_NVIDIA_SMI_HANG_MARKER", marker)
    smi = fake_smi("h200-x2", "hang")
    started = time.monotonic()
    try:
        result = run_module("gpu_facts", {"nvidia_smi_path": smi, "timeout": 1.5})
        elapsed = time.monotonic() - started
        survivors = marked_processes(marker)
    finally:
        for pid in marked_processes(marker):
            os.kill(pid, signal.SIGKILL)
    assert result["failed"]
    # The deadline plus the time to kill and reap the group, with room for a loaded machine.
    assert elapsed < 1.5 + 2.5, elapsed
    assert survivors == [], f"processes of the hung nvidia-smi survived: {survivors}"
    assert f"`{smi} -q -x`" in result["msg"]
    assert "1.5" in result["msg"] and "timeout" in result["msg"]


def test_deadline_must_be_positive(fake_smi):
    for bad in (0, -1):
        result = run_module("gpu_facts", {"nvidia_smi_path": fake_smi("h200-x2"), "timeout": bad})
        assert result["failed"]
        assert "timeout" in result["msg"] and str(bad) in result["msg"]


def test_truncated_xml_fails_naming_the_command(fake_smi):
    result = run_module("gpu_facts", {"nvidia_smi_path": fake_smi("h200-x2", "truncated-xml")})
    assert result["failed"]
    assert "-q -x" in result["msg"] and "not XML" in result["msg"]


# Each field a GPU record needs downstream (capacity, preflight's checks, the results'
# provenance), as the -q -x capture holds it.
NEEDED_FIELDS = {
    "memory_mib": ("<fb_memory_usage>\n\t\t\t<total>143771 MiB</total>", "<fb_memory_usage>"),
    "name": ("<product_name>NVIDIA H200</product_name>", ""),
    "uuid": ("<uuid>GPU-", "<uuid_gone>GPU-"),
    "pci_bus_id": ("<pci_bus_id>00000000:00:07.0</pci_bus_id>", ""),
}


@pytest.mark.parametrize("field", sorted(NEEDED_FIELDS))
def test_incomplete_gpu_record_fails_naming_gpu_and_field(fake_smi, tmp_path, field):
    capture = tmp_path / "partial"
    shutil.copytree(CAPTURES / "h200-x2", capture)
    xml = (capture / "nvidia-smi-q.xml").read_text()
    second = xml.index('<gpu id="00000000:00:07.0">')
    old, new = NEEDED_FIELDS[field]
    assert old in xml[second:], f"the capture changed: {old!r} is not in GPU 1's record"
    tail = xml[second:].replace(old, new, 1)
    if field == "uuid":
        tail = tail.replace("</uuid>", "</uuid_gone>", 1)
    if field == "pci_bus_id":
        tail = tail.replace('<gpu id="00000000:00:07.0">', "<gpu>", 1)
    (capture / "nvidia-smi-q.xml").write_text(xml[:second] + tail)
    result = run_module("gpu_facts", {"nvidia_smi_path": fake_smi(capture)})
    assert result["failed"], f"succeeded with GPU 1's {field} missing: {result}"
    assert "GPU 1" in result["msg"] and field in result["msg"]


def test_missing_compute_capability_fails_naming_the_gpu(fake_smi, tmp_path):
    capture = tmp_path / "nocc"
    shutil.copytree(CAPTURES / "h200-x2", capture)
    csv = (capture / "query-gpu.csv").read_text().splitlines()
    # What nvidia-smi prints for a field it cannot read.
    csv[-1] = csv[-1].replace(", 9.0, ", ", [N/A], ")
    (capture / "query-gpu.csv").write_text("\n".join(csv) + "\n")
    result = run_module("gpu_facts", {"nvidia_smi_path": fake_smi(capture)})
    assert result["failed"], result
    assert "GPU 1" in result["msg"] and "compute_capability" in result["msg"]


def test_topology_with_fewer_rows_than_gpus_fails_clearly(tmp_path):
    xml = (CAPTURES / "h200-x2" / "nvidia-smi-q.xml").read_text()
    topo = (CAPTURES / "h200-x2" / "topo-m.txt").read_text()
    one_row = "\n".join(line for line in topo.splitlines() if not line.startswith("GPU1"))
    caps = {"00000000:00:06.0": "9.0", "00000000:00:07.0": "9.0"}
    with pytest.raises(GpuFactsError, match="topo -m"):
        build_facts(xml, caps, one_row, {}, {})


def test_a_child_left_behind_after_a_normal_exit_is_killed_and_does_not_block():
    """What nvidia-smi answers is read once it exits, even when something it started still
    holds its output open; that leftover is killed with the group."""
    marker = f"gpu-facts-leftover-{uuid.uuid4().hex}"
    leaver = (
        "import subprocess, sys; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[1]]); "
        "print('answered')"
    )
    started = time.monotonic()
    try:
        rc, out, _err = run_with_deadline([sys.executable, "-c", leaver, marker], 10)
        elapsed = time.monotonic() - started
        survivors = marked_processes(marker)
    finally:
        for pid in marked_processes(marker):
            os.kill(pid, signal.SIGKILL)
    assert (rc, out) == (0, "answered\n")
    assert elapsed < 5, elapsed
    assert survivors == []


def test_the_fake_answers_plain_query_from_its_capture(fake_smi):
    """`nvidia-smi -q` (the benchmark's debug snapshots) in the plain layout, from the same
    capture as -q -x."""
    rc, out, err = run_with_deadline([sys.executable, fake_smi("h200-x2"), "-q"], 30)
    assert rc == 0, err
    lines = out.splitlines()
    assert "Driver Version                              : 580.159.04" in lines
    assert sum(line.strip().startswith("Product Name") for line in lines) == 2
    assert sum(line.startswith("GPU 0000") for line in lines) == 2
