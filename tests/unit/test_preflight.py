"""Preflight helpers without hosts: ACS parsing, bytes present, verdict rules."""

from __future__ import annotations

import copy
import os

import pytest
from ansible.module_utils.host.inspection import bytes_present, nearest_existing
from ansible.module_utils.preflight.verdicts import evaluate
from ansible.module_utils.tuning.pci_acs import (
    acs_redirects,
    acs_report,
    parse_acs,
    upstream_bridges,
)

pytestmark = pytest.mark.preflight

LSPCI_BRIDGE = """\
03:08.0 PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0) (prog-if 00 [Normal decode])
\tCapabilities: [168 v1] Access Control Services
\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans+
\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
"""


def test_acs_flags_and_redirect():
    flags = parse_acs(LSPCI_BRIDGE)
    assert flags["SrcValid"] == "on" and flags["TransBlk"] == "off"
    assert acs_redirects(flags) is True
    assert (
        acs_redirects(
            parse_acs(
                LSPCI_BRIDGE.replace(
                    "ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl-",
                    "ReqRedir- CmpltRedir- UpstreamFwd+ EgressCtrl-",
                )
            )
        )
        is False
    )
    assert parse_acs("00:01.0 Host bridge: no capabilities") is None


def test_upstream_bridges_from_sysfs_layout(tmp_path):
    device = tmp_path / "devices/pci0000:00/0000:00:01.1/0000:02:00.0/0000:03:08.0/0000:05:00.0"
    device.mkdir(parents=True)
    link = tmp_path / "bus_pci_devices_0000:05:00.0"
    link.symlink_to(device)
    assert upstream_bridges(str(link)) == ["0000:03:08.0", "0000:02:00.0", "0000:00:01.1"]


ACS_OFF = "SrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-"
ACS_REDIRECT = "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"


def pcie_switch(root, gpus: list[str]) -> None:
    """One root port, one switch (upstream and a downstream port per GPU), linked as sysfs
    links /sys/bus/pci/devices/BDF to the device's place in the tree."""
    for slot, gpu in enumerate(gpus):
        device = root / f"sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:0{slot}.0/{gpu}"
        device.mkdir(parents=True)
        link = root / "sys/bus/pci/devices" / gpu
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(device, link.parent))


class Lspci:
    """Answers `lspci -vvv -s BDF` as lspci prints it, from bridge to ACSCtl flags; counts calls."""

    def __init__(self, acsctl: dict[str, str], failing: tuple[str, ...] = ()):
        self.acsctl, self.failing, self.asked = acsctl, failing, []

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        assert argv[:3] == ["/usr/bin/lspci", "-vvv", "-s"]
        bdf = argv[3]
        self.asked.append(bdf)
        if bdf in self.failing:
            return 1, "", f"lspci: -s: Invalid slot number {bdf}\n"
        text = f"{bdf} PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch\n"
        if bdf in self.acsctl:
            text += "\tCapabilities: [1d0 v1] Access Control Services\n"
            text += f"\t\tACSCtl:\t{self.acsctl[bdf]}\n"
        return 0, text, ""


def test_acs_report_reads_each_bridge_once_and_names_the_redirecting_ones(tmp_path):
    pcie_switch(tmp_path, ["0000:05:00.0", "0000:06:00.0"])
    lspci = Lspci(
        {"0000:01:00.0": ACS_REDIRECT, "0000:02:00.0": ACS_OFF}, failing=("0000:02:01.0",)
    )
    # nvidia-smi's 8-digit domain, upper case; a third GPU this sysfs does not have.
    bus_ids = ["00000000:05:00.0", "00000000:06:00.0", "00000000:C5:00.0"]
    report = acs_report(bus_ids, "/usr/bin/lspci", lspci, root=str(tmp_path))
    assert sorted(lspci.asked) == sorted(set(lspci.asked)), "a shared bridge was read twice"
    assert report["gpus"] == ["0000:05:00.0", "0000:06:00.0", "0000:c5:00.0"]
    assert [b["bdf"] for b in report["bridges"]] == [
        "0000:00:01.1",
        "0000:01:00.0",
        "0000:02:00.0",
        "0000:02:01.0",
    ]
    bridges = {b["bdf"]: b for b in report["bridges"]}
    assert bridges["0000:01:00.0"]["gpus"] == ["0000:05:00.0", "0000:06:00.0"]
    assert bridges["0000:02:01.0"] == {
        "bdf": "0000:02:01.0",
        "acsctl": None,
        "redirects": False,
        "gpus": ["0000:06:00.0"],
    }
    assert bridges["0000:02:00.0"]["acsctl"]["ReqRedir"] == "off"
    assert report["redirecting"] == ["0000:01:00.0"]
    # Checked (two GPUs were found), with the missing one named.
    assert report["checked"] is True
    assert report["reason"] == f"GPUs 0000:c5:00.0 not found under {tmp_path}/sys/bus/pci/devices"


def test_acs_report_not_checked_without_lspci_or_gpus_in_sysfs(tmp_path):
    lspci = Lspci({})
    none_found = acs_report(["00000000:05:00.0"], "/usr/bin/lspci", lspci, root=str(tmp_path))
    assert none_found["checked"] is False and "0000:05:00.0 not found" in none_found["reason"]
    assert none_found["bridges"] == [] and lspci.asked == []
    pcie_switch(tmp_path, ["0000:05:00.0"])
    no_lspci = acs_report(["0000:05:00.0"], None, lspci, root=str(tmp_path), lspci_name="lspci")
    assert no_lspci["checked"] is False and no_lspci["lspci"] is None
    assert no_lspci["reason"].startswith("lspci not found (lspci): install pciutils")
    assert lspci.asked == []


def test_bytes_present_counts_only_files_of_the_right_size(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "b").write_bytes(b"x" * 5)  # truncated
    files = [{"path": "a", "size": 10}, {"path": "b", "size": 9}, {"path": "c", "size": 3}]
    assert bytes_present(str(tmp_path), files) == {"bytes_present": 10, "files_present": 1}


def test_nearest_existing_parent(tmp_path):
    assert nearest_existing(str(tmp_path / "x" / "y")) == str(tmp_path)
    assert nearest_existing("/") == "/"
    assert os.path.isdir(nearest_existing("/definitely/not/here"))


GPU = {
    "count": 8,
    "models": {"NVIDIA B200": 8},
    "driver_version": "580.159.04",
    "devices": [{"compute_capability": "10.0"}] * 8,
    "persistence_mode_off_gpus": [],
    "fabric": {"state": "Completed", "per_gpu": ["Completed"] * 8},
    "interconnect": "nvlink",
    "nvlink_pairs": 28,
    "gpu_pairs": 28,
    "p2p_not_ok": {"read": [], "write": [], "nvlink": []},
}
EXPECTED = {
    "profile": "b200",
    "gpu_model": "NVIDIA B200",
    "tp_size": 8,
    "interconnect": "nvlink",
    "min_driver_version": "580.65.06",
    "cuda": "13.0",
    "attention_backends": {"target": "trtllm_mla", "draft": "fa4", "tree": "triton"},
}
BACKENDS = {
    "trtllm_mla": ["10.0"],
    "fa4": ["10.0"],
    "triton": ["9.0", "10.0", "12.0"],
    "fa3": ["9.0"],
}
HOST = {
    "fabricmanager": {"active": True, "state": "active", "how": "systemctl is-active"},
    "disk": {"path": "/w", "measured_at": "/", "free_bytes": 1 << 40},
    "present": {},
}


def judge(gpu=GPU, expected=EXPECTED, host=HOST, hub=None, warn_only=(), capacity=None):
    return evaluate(
        gpu, expected, BACKENDS, host, hub, ["target"], capacity or {}, 10, list(warn_only)
    )


def test_healthy_nvswitch_host_has_no_findings():
    verdict = judge()
    assert verdict["failures"] == [] and verdict["warning_messages"] == []


def test_old_driver_fails_and_can_be_downgraded():
    gpu = copy.deepcopy(GPU)
    gpu["driver_version"] = "570.86.15"
    assert "NVIDIA driver 570.86.15 found; needed 580.65.06" in judge(gpu)["failures"][0]
    downgraded = judge(gpu, warn_only=["driver"])
    assert downgraded["failures"] == [] and len(downgraded["warning_messages"]) == 1


def test_fabric_not_ready_and_p2p_broken():
    gpu = copy.deepcopy(GPU)
    gpu["fabric"] = {"state": "In Progress", "per_gpu": ["In Progress"] * 8}
    gpu["p2p_not_ok"]["read"] = [[0, 5]]
    failures = " ".join(judge(gpu)["failures"])
    assert "NVSwitch fabric state is In Progress" in failures
    assert "P2P read is not OK between GPU pairs [[0, 5]]" in failures


def test_stopped_fabric_manager_is_left_to_the_tuning_stage():
    gpu = copy.deepcopy(GPU)
    gpu["fabric"] = {"state": "Not Started", "per_gpu": ["Not Started"] * 8}
    stopped = {"active": False, "installed": True, "state": "inactive", "how": "systemctl"}
    verdict = judge(gpu, host={**HOST, "fabricmanager": stopped})
    assert verdict["failures"] == []
    warnings = " ".join(verdict["warning_messages"])
    assert "the tuning stage enables and starts it" in warnings
    assert "NVSwitch fabric state is Not Started" in warnings
    missing = {"active": False, "installed": False, "state": "inactive", "how": "systemctl"}
    failures = " ".join(judge(gpu, host={**HOST, "fabricmanager": missing})["failures"])
    assert "Fix: install nvidia-fabricmanager matching the driver" in failures


def test_pre_ampere_gpu_is_unsupported():
    gpu = copy.deepcopy(GPU)
    gpu["devices"] = [{"compute_capability": "7.0"}] * 8
    assert any("below 8.0" in f for f in judge(gpu)["failures"])


def test_unreachable_hub_skips_disk_with_a_warning():
    hub = {
        "reachable": False,
        "repos": {
            "target": {
                "access": "unreachable",
                "repo_id": "m/k",
                "message": "the hub could not be reached",
            }
        },
    }
    verdict = judge(hub=hub)
    assert any("could not be reached" in f for f in verdict["failures"])
    assert any("download size is unknown" in w for w in verdict["warning_messages"])


def test_a_context_length_beyond_the_pool_is_a_warning_never_a_failure():
    capacity = {
        "dflash": {
            "fits": True,
            "context_length_fits": False,
            "context_length_warning": "one request at context_length 200000 does not fit",
        },
        "ar": {"fits": True, "context_length_fits": True, "context_length_warning": None},
    }
    verdict = judge(capacity=capacity)
    assert verdict["failures"] == []
    assert verdict["warning_messages"] == [
        "[context_length] serving config dflash: one request at context_length 200000 does not fit."
    ]
    # A config that does not fit at all fails on capacity alone.
    verdict = judge(capacity={"dflash": {**capacity["dflash"], "fits": False, "reason": "x"}})
    assert [m.split("]")[0] for m in verdict["failures"]] == ["[capacity"]
    assert verdict["warning_messages"] == []
