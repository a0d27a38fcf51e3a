"""Host-side inspection for preflight: disk, weights already present, live processes.

Pure helpers with their inputs passed in (paths, command output), so tests can drive them
with captured text; library/preflight_host_facts.py runs the commands. The PCIe ACS walk is
module_utils/tuning/pci_acs.py, shared with host tuning.
"""

from __future__ import annotations

import os


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
