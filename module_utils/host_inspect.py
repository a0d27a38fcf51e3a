"""Host-side inspection for preflight: disk, weights already present, fabric manager, PCIe ACS.

Pure helpers with their inputs passed in (paths, command output), so tests can drive them
with captured text; library/preflight_host_facts.py runs the commands.
"""

from __future__ import annotations

import os
import re

BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def nearest_existing(path: str) -> str:
    """The path itself or its closest existing ancestor: where a new directory would live."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def disk_space(path: str) -> dict:
    where = nearest_existing(path)
    stats = os.statvfs(where)
    return {
        "path": path,
        "measured_at": where,
        "free_bytes": stats.f_bavail * stats.f_frsize,
        "total_bytes": stats.f_blocks * stats.f_frsize,
    }


def bytes_present(repo_dir: str, files: list[dict]) -> dict:
    """Files already on disk with the size the hub lists (what a download would skip)."""
    present_bytes = present_files = 0
    for entry in files:
        size = entry.get("size")
        try:
            found = os.stat(os.path.join(repo_dir, entry["path"])).st_size
        except OSError:
            continue
        if size is not None and found == size:
            present_bytes += size
            present_files += 1
    return {"bytes_present": present_bytes, "files_present": present_files}


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


def pid_alive(pid: int | None) -> bool:
    """Whether a process runs: a zombie has exited, only its parent has not collected it."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
