"""PCIe ACS above the GPUs: the one bridge walk that preflight and host tuning share.

ACS (Access Control Services) on a PCIe bridge can send peer-to-peer requests up to the root
complex, which slows GPU-to-GPU transfers or hangs them. The walk finds every bridge between
each GPU and its root complex from sysfs and reads the bridge's ACSCtl flags with
`lspci -vvv -s BDF`. It only reads; nothing here changes ACS.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from ansible.module_utils.host.gpu_topology import normalise_bus_id
from ansible.module_utils.host.helpers import CommandFailed

BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
PCI_DEVICES = "/sys/bus/pci/devices"

# (argv) -> (exit code, stdout, stderr), as AnsibleModule.run_command answers; the modules pass
# host_helpers.DeadlineRunner, which raises CommandFailed for a command past its deadline.
RunCommand = Callable[[list[str]], tuple[int, str, str]]


def upstream_bridges(device_sysfs_path: str) -> list[str]:
    """PCI bridges between a device and its root complex, nearest first, from sysfs."""
    parts = os.path.realpath(device_sysfs_path).split(os.sep)
    chain = [part for part in parts if BDF.match(part)]
    return list(reversed(chain[:-1]))


def parse_acs(lspci_text: str) -> dict[str, str] | None:
    """ACSCtl flags of one device from `lspci -vvv -s BDF`; None when it has no ACS."""
    match = re.search(r"ACSCtl:\s*(.+)", lspci_text)
    if not match:
        return None
    return {
        flag.rstrip("+-"): ("on" if flag.endswith("+") else "off")
        for flag in match.group(1).split()
        if flag.endswith(("+", "-"))
    }


def acs_redirects(flags: dict[str, str] | None) -> bool:
    """Whether ACS sends peer-to-peer requests up to the root complex (or blocks them)."""
    if not flags:
        return False
    return flags.get("SrcValid") == "on" and (
        flags.get("ReqRedir") == "on" or flags.get("CmpltRedir") == "on"
    )


def acs_unchecked(reason: str) -> dict:
    """A report of a walk that could not run, with why."""
    return {
        "checked": False,
        "reason": reason,
        "lspci": None,
        "gpus": [],
        "bridges": [],
        "redirecting": [],
    }


def acs_report(
    bus_ids: list[str],
    lspci: str | None,
    run_command: RunCommand,
    root: str = "/",
    lspci_name: str = "lspci",
) -> dict:
    """Every bridge above the GPUs (nvidia-smi or sysfs bus ids) with its ACSCtl flags.

    `root` prefixes the sysfs path (tests point it at a fake tree). The report is checked when
    at least one GPU was found in sysfs or none was missing; GPUs not found are named in
    `reason` either way. Bridges come sorted by BDF, each with the GPUs below it. An lspci that
    ran past its deadline (run_command raised CommandFailed) leaves the report unchecked with
    that as the reason: a hung lspci says nothing about ACS, and the walk stops there.
    """
    if not lspci:
        return acs_unchecked(
            f"lspci not found ({lspci_name}): install pciutils to read the ACS state of the "
            "PCIe bridges; nothing was checked"
        )
    gpus = [normalise_bus_id(bus_id) for bus_id in bus_ids]
    devices = os.path.join(root, PCI_DEVICES.lstrip("/"))
    bridges: dict[str, dict] = {}
    missing = []
    for bus_id in gpus:
        device = os.path.join(devices, bus_id)
        if not os.path.exists(device):
            missing.append(bus_id)
            continue
        for bridge in upstream_bridges(device):
            if bridge not in bridges:
                try:
                    rc, out, _err = run_command([lspci, "-vvv", "-s", bridge])
                except CommandFailed as exc:
                    return {
                        **acs_unchecked(f"{exc} Nothing was checked"),
                        "lspci": lspci,
                        "gpus": gpus,
                    }
                flags = parse_acs(out) if rc == 0 else None
                bridges[bridge] = {
                    "bdf": bridge,
                    "acsctl": flags,
                    "redirects": acs_redirects(flags),
                    "gpus": [],
                }
            bridges[bridge]["gpus"].append(bus_id)
    ordered = [bridges[bdf] for bdf in sorted(bridges)]
    return {
        "checked": bool(bridges) or not missing,
        "reason": f"GPUs {', '.join(missing)} not found under {devices}" if missing else None,
        "lspci": lspci,
        "gpus": gpus,
        "bridges": ordered,
        "redirecting": [bridge["bdf"] for bridge in ordered if bridge["redirects"]],
    }
