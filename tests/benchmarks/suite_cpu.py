"""Where make test's CPU goes: a Linux process-accounting file read back by kind of process.

The kernel writes one record per process that exits (its command name, parent, start time,
user and system CPU, minor page faults) to the file `accton` names. Around a fresh clone's run:

    apt-get install acct                  # accton; the records are the kernel's (acct v3)
    touch /tmp/suite.acct && accton /tmp/suite.acct
    bash .ci/run
    accton off
    .venv/bin/python -m tests.benchmarks.suite_cpu /tmp/suite.acct [--top 20]

Each process is charged its own CPU (not its children's) and sorted by what it is in the suite,
from its command and its ancestors': ansible-playbook (each run's own process, and the worker it
forks for every task on every host), what runs on the test hosts (under their sshd: module
runs, which are a Python started by `sh -c`; the other Pythons there, simulators, probes and
venvs; pip; the fake nvidia-smi; the rest), the pytest workers and what they start, the lint.
Processes still running when accounting stops have no record; the kernel's own time (page
faults, forks, the namespaces' network) is charged to no process, so compare the total with
`vmstat` or /usr/bin/time around the run. Needs root (accton) and the acct v3 format (Linux).
"""

from __future__ import annotations

import argparse
import collections
import math
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

# struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime,
# etime (a float in the file), then eight comp_t (utime, stime, mem, io, rw, minflt, majflt,
# swaps) and the 16-byte command name.
RECORD = struct.Struct("<BBHIIIIIIf8H16s")
ACCT_VERSION = 3
TICKS_PER_SECOND = 100  # AHZ
# A record file of a whole make test holds about 150,000 records (10 MB); more is not a run.
MAX_BYTES = 256 << 20
KINDS = (
    "ansible-playbook: each run's process",
    "ansible-playbook: task workers",
    "under ansible-playbook (local modules, ssh)",
    "test hosts: module runs",
    "test hosts: other Python (simulators, probes, venvs)",
    "test hosts: pip",
    "test hosts: fake nvidia-smi",
    "test hosts: other",
    "pytest workers",
    "started by the pytest workers",
    "lint",
    "other (make setup, make, the shell)",
)
LINT = {"ansible-lint", "yamllint", "ruff"}


@dataclass
class Process:
    pid: int
    ppid: int
    started: int
    elapsed: float
    user: float
    system: float
    minor_faults: int
    command: str

    @property
    def cpu(self) -> float:
        return self.user + self.system

    @property
    def ended(self) -> float:
        return self.started + self.elapsed


def comp_t(value: int) -> int:
    """The kernel's 16-bit float: 13 bits of mantissa, 3 of base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def elapsed_ticks(value: float) -> float:
    """The record's elapsed time; one the kernel could not have written (negative, NaN or
    infinite) counts as none, so no parent's life stretches over the whole run."""
    return value if math.isfinite(value) and value >= 0 else 0.0


def read(path: Path) -> list[Process]:
    size = path.stat().st_size
    if size > MAX_BYTES:
        sys.exit(f"{path}: {size} bytes, more than a make test's records ({MAX_BYTES} at most)")
    data = path.read_bytes()
    if len(data) % RECORD.size:
        sys.exit(f"{path}: {len(data)} bytes is not a whole number of acct v3 records")
    found = []
    for offset in range(0, len(data), RECORD.size):
        fields = RECORD.unpack_from(data, offset)
        if fields[1] & 0x0F != ACCT_VERSION:
            sys.exit(f"{path}: record {offset // RECORD.size} is not acct v3 (version {fields[1]})")
        user, system, _mem, _io, _rw, minor = (comp_t(v) for v in fields[10:16])
        found.append(
            Process(
                pid=fields[6],
                ppid=fields[7],
                started=fields[8],
                elapsed=elapsed_ticks(fields[9]) / TICKS_PER_SECOND,
                user=user / TICKS_PER_SECOND,
                system=system / TICKS_PER_SECOND,
                minor_faults=minor,
                command=fields[18].split(b"\0", 1)[0].decode("utf-8", "replace"),
            )
        )
    return found


class Tree:
    """Parents by pid and time: pids come round again within a run (pid_max is 32768 here)."""

    def __init__(self, processes: list[Process]):
        self.by_pid: dict[int, list[Process]] = collections.defaultdict(list)
        for process in processes:
            self.by_pid[process.pid].append(process)

    def parent(self, process: Process) -> Process | None:
        for candidate in self.by_pid.get(process.ppid, ()):
            # Start times are whole seconds: a child started within its parent's life.
            if candidate is not process and (
                candidate.started - 1 <= process.started <= candidate.ended + 1
            ):
                return candidate
        return None

    def ancestors(self, process: Process, limit: int = 64) -> list[str]:
        names, parent = [], self.parent(process)
        while parent is not None and len(names) < limit:
            names.append(parent.command)
            parent = self.parent(parent)
        return names


def is_playbook(command: str) -> bool:
    return command.startswith("ansible-playboo")  # the name is cut at 15 characters


def kind(process: Process, ancestors: list[str]) -> str:
    command = process.command
    if command in LINT or LINT & set(ancestors):
        return "lint"
    if is_playbook(command):
        if ancestors and is_playbook(ancestors[0]):
            return "ansible-playbook: task workers"
        return "ansible-playbook: each run's process"
    if any(is_playbook(name) for name in ancestors):
        return "under ansible-playbook (local modules, ssh)"
    if command == "sshd" or "sshd" in ancestors:
        return host_kind(command, ancestors)
    if command.startswith("[pytest-xdist") or command == "pytest":
        return "pytest workers"
    if any(name.startswith("[pytest-xdist") for name in ancestors):
        return "started by the pytest workers"
    return "other (make setup, make, the shell)"


def host_kind(command: str, ancestors: list[str]) -> str:
    if command.startswith("python"):
        # Ansible runs a module as `sh -c '<python>'` (under sudo's own sh for become); a
        # Python a module or a test starts has another parent.
        module = ancestors[:1] == ["sh"]
        return (
            "test hosts: module runs"
            if module
            else "test hosts: other Python (simulators, probes, venvs)"
        )
    if command.startswith("pip"):
        return "test hosts: pip"
    if command == "nvidia-smi":
        return "test hosts: fake nvidia-smi"
    return "test hosts: other"


def summary(processes: list[Process]) -> dict[str, dict]:
    tree = Tree(processes)
    out = {
        name: {"processes": 0, "cpu": 0.0, "user": 0.0, "system": 0.0, "faults": 0}
        for name in KINDS
    }
    for process in processes:
        entry = out[kind(process, tree.ancestors(process))]
        entry["processes"] += 1
        entry["cpu"] += process.cpu
        entry["user"] += process.user
        entry["system"] += process.system
        entry["faults"] += process.minor_faults
    return out


def report(processes: list[Process], top: int) -> str:
    kinds = summary(processes)
    total = sum(entry["cpu"] for entry in kinds.values())
    lines = [
        f"{len(processes)} processes, {total:,.0f} CPU-s charged to them",
        f"{'CPU-s':>8} {'share':>6} {'processes':>9} {'per process':>11} {'sys':>5} "
        f"{'faults/proc':>11}  kind",
    ]
    for name in KINDS:
        entry = kinds[name]
        count = entry["processes"]
        if not count:
            continue
        lines.append(
            f"{entry['cpu']:8.1f} {entry['cpu'] / max(total, 1e-9):6.1%} {count:9d} "
            f"{entry['cpu'] / count:11.3f} {entry['system'] / max(entry['cpu'], 1e-9):5.0%} "
            f"{entry['faults'] // count:11d}  {name}"
        )
    by_command: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    for process in processes:
        by_command[process.command] += process.cpu
        counts[process.command] += 1
    lines.append(f"\nthe {top} commands with the most CPU:")
    lines += [f"{cpu:8.1f} {counts[name]:9d}  {name}" for name, cpu in by_command.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("acct_file", type=Path)
    parser.add_argument("--top", type=int, default=15, choices=range(1, 201), metavar="N")
    args = parser.parse_args(argv)
    print(report(read(args.acct_file), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
