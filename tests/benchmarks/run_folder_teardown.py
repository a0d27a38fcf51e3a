"""CPU of removing a test-host run's files: file by file from the disk (what the teardown did)
against unmounting the tmpfs that holds them (tests/support/testhosts.py's run folders).

Counts the machine's busy time (/proc/stat), not only this process's: the kernel's journal and
writeback work for the disk is done outside it. Needs root (mount).

    .venv/bin/python -m tests.benchmarks.run_folder_teardown [--files 30000] [--under /tmp]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from tests.support.testhosts import mount_run_folder, remove_run_folder

PER_FOLDER = 50
FILE_BYTES = 3000  # about a venv's source file


def busy_s() -> float:
    """Seconds of CPU the machine spent on anything but idling and waiting for I/O."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def fill(folder: Path, files: int) -> None:
    for index in range(files // PER_FOLDER):
        sub = folder / f"d{index}"
        sub.mkdir()
        for number in range(PER_FOLDER):
            (sub / f"f{number}.py").write_bytes(b"x" * FILE_BYTES)


def measure(folder: Path, files: int, on_tmpfs: bool) -> tuple[float, float]:
    folder.mkdir()
    if on_tmpfs:
        mount_run_folder(folder)
    fill(folder, files)
    os.sync()
    busy, started = busy_s(), time.monotonic()
    if on_tmpfs:
        remove_run_folder(folder)
    else:
        shutil.rmtree(folder)
    return busy_s() - busy, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=30000)
    parser.add_argument("--under", default="/tmp", help="a folder on the disk the hosts used")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.under) as scratch:
        for name, on_tmpfs in (("disk, file by file", False), ("tmpfs, unmounted", True)):
            busy, wall = measure(Path(scratch) / name.split(",")[0], args.files, on_tmpfs)
            print(f"{name:20s} {args.files} files: {busy:.2f} core-s busy, {wall:.2f} s")


if __name__ == "__main__":
    main()
