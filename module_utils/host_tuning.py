"""Host tuning: pure helpers for library/host_tuning.py (and its tests).

Paths of kernel state that is not namespaced (/proc/sys, /sys) are always built from a root
prefix, so that tests can point them at a fake tree instead of the machine they run on.
The state file records, per changed value, what it was before the first change, so that a
restore can put it back however often the tuning ran in between.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re

STATE_SCHEMA = 1
NCCL_KEY = re.compile(r"^NCCL_[A-Z0-9_]+$")
# NCCL reads at most 1023 characters of a value from its configuration file.
NCCL_VALUE_MAX = 1023
SYSCTL_NAME = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_-]+)+$")
CPU_DIR = re.compile(r"^cpu(\d+)$")
VERSION = re.compile(r"\b(\d+\.\d+(?:\.\d+)?)\b")
# The header has no "=": NCCL takes every line with one as a variable.
NCCL_CONF_HEADER = (
    "# Written by the kimi kit tuning role (NCCL environment of this host's hardware profile).\n"
    "# One KEY and value per line; variables already in a process environment win over these.\n"
)
SYSCTL_CONF_HEADER = "# Written by the kimi kit tuning role; teardown.yml removes or restores it.\n"


class TuningError(Exception):
    """A failure with a message that says what was found, what is needed and how to fix it."""


# --------------------------------------------------------------------------------------------
# Paths under the root prefix.


def under_root(root: str, path: str) -> str:
    """An absolute path as seen through the root prefix ("/" leaves it as it is)."""
    return os.path.join(root, path.lstrip("/"))


def sysctl_path(root: str, name: str) -> str:
    return under_root(root, "/proc/sys/" + name.replace(".", "/"))


def cpufreq_governor_files(root: str) -> list[tuple[str, str]]:
    """(cpu name, scaling_governor path) of every CPU with cpufreq, in CPU order."""
    base = under_root(root, "/sys/devices/system/cpu")
    try:
        names = os.listdir(base)
    except OSError:
        return []
    found = []
    for name in names:
        match = CPU_DIR.match(name)
        path = os.path.join(base, name, "cpufreq", "scaling_governor")
        if match and os.path.isfile(path):
            found.append((int(match.group(1)), name, path))
    return [(name, path) for _number, name, path in sorted(found)]


def read_text(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


# --------------------------------------------------------------------------------------------
# Inputs.


def nccl_environment_problems(env: dict) -> list[str]:
    problems = []
    for key, value in env.items():
        if not isinstance(key, str) or not NCCL_KEY.match(key):
            problems.append(
                f"key {key!r} is not an NCCL variable (needed: NCCL_ followed by capitals, "
                "digits or _)"
            )
        if not isinstance(value, str):
            problems.append(
                f"{key}={value!r} is a {type(value).__name__}; needed a string (quote it in "
                'YAML, e.g. NCCL_P2P_DISABLE: "1")'
            )
        elif not value or "\n" in value or len(value) > NCCL_VALUE_MAX:
            problems.append(
                f"{key} has an empty, multi-line or over-long value; needed one line of 1 to "
                f"{NCCL_VALUE_MAX} characters"
            )
    if str(env.get("NCCL_P2P_DISABLE", "")) == "1" and "NCCL_P2P_LEVEL" in env:
        problems.append(
            "NCCL_P2P_DISABLE=1 and NCCL_P2P_LEVEL are both set: with P2P disabled the level "
            "does nothing; keep one of the two"
        )
    return problems


def sysctl_problems(sysctls: dict) -> list[str]:
    problems = []
    for name, value in sysctls.items():
        if not SYSCTL_NAME.match(str(name)):
            problems.append(f"sysctl name {name!r} is not dotted (e.g. kernel.numa_balancing)")
        if not isinstance(value, str | int) or isinstance(value, bool) or "\n" in str(value):
            problems.append(f"sysctl {name}={value!r}: needed a one-line string or integer")
    return problems


def render_nccl_conf(env: dict[str, str]) -> str:
    return NCCL_CONF_HEADER + "".join(f"{key}={env[key]}\n" for key in sorted(env))


def render_sysctl_conf(values: dict[str, str]) -> str:
    return SYSCTL_CONF_HEADER + "".join(f"{name} = {values[name]}\n" for name in sorted(values))


# --------------------------------------------------------------------------------------------
# nvidia-smi and the fabric manager.

GPU_QUERY = "--query-gpu=index,pci.bus_id,persistence_mode,driver_version"


def parse_gpu_query(text: str) -> list[dict]:
    """`nvidia-smi GPU_QUERY --format=csv,noheader` into index, bus id, persistence, driver."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 4 or not fields[0].isdigit():
            raise TuningError(
                f"nvidia-smi printed {line.strip()!r} where index, bus id, persistence mode and "
                "driver version were expected. Fix: run `nvidia-smi "
                f"{GPU_QUERY} --format=csv,noheader` by hand; an old driver lacks these fields."
            )
        gpus.append(
            {
                "index": int(fields[0]),
                "bus_id": fields[1],
                "persistence_mode": fields[2] == "Enabled",
                "driver_version": fields[3],
            }
        )
    return gpus


def parse_version(text: str) -> str | None:
    """The first dotted version in a tool's --version output."""
    match = VERSION.search(text or "")
    return match.group(1) if match else None


def fabricmanager_package_hint(driver: str) -> str:
    branch = driver.split(".", 1)[0] if driver else "<driver branch>"
    return (
        f"install the fabric manager of driver {driver or '<driver version>'} (Debian/Ubuntu: "
        f"`apt-get install nvidia-fabricmanager-{branch}` at that exact version; RHEL: "
        f"`dnf install nvidia-fabricmanager-{driver or '<version>'}`)"
    )


# --------------------------------------------------------------------------------------------
# The state file.


def new_state() -> dict:
    return {"schema": STATE_SCHEMA, "changes": {}}


def load_state(text: str, path: str) -> dict:
    try:
        state = json.loads(text)
    except ValueError as exc:
        raise TuningError(
            f"The tuning state file {path} is not JSON ({exc}). It holds the values to restore; "
            "fix it by hand or, if those values are known, remove it and rerun."
        ) from exc
    schema = state.get("schema") if isinstance(state, dict) else None
    if schema != STATE_SCHEMA:
        raise TuningError(
            f"The tuning state file {path} has schema {schema!r}; this kit reads schema "
            f"{STATE_SCHEMA}. Fix: restore with the kit version that wrote "
            "it, or remove it after restoring the values by hand."
        )
    state.setdefault("changes", {})
    return state


def dump_state(state: dict) -> str:
    return json.dumps(state, indent=2) + "\n"


def record(state: dict, key: str, entry: dict, when: str) -> None:
    """Remember a change. The previous value of the first change is kept: that is what a
    restore must bring back, whatever later runs set in between."""
    old = state["changes"].get(key)
    if old is not None:
        if isinstance(old.get("previous"), dict) and entry.get("kind") == "cpufreq":
            # CPUs not seen before (brought online since) add their own previous values.
            old["previous"] = {**entry["previous"], **old["previous"]}
            old["paths"] = {**entry.get("paths", {}), **old.get("paths", {})}
        old.update({k: v for k, v in entry.items() if k not in ("previous", "paths")})
        old["updated_at"] = when
        return
    state["changes"][key] = {**entry, "recorded_at": when}


# --------------------------------------------------------------------------------------------
# Files (their previous content is kept in the state file).


def file_snapshot(path: str) -> dict:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return {"exists": False}
    return {
        "exists": True,
        "content_b64": base64.b64encode(data).decode("ascii"),
        "mode": f"{mode:04o}",
    }


def snapshot_bytes(snapshot: dict) -> bytes | None:
    if not snapshot.get("exists"):
        return None
    return base64.b64decode(snapshot["content_b64"])


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# --------------------------------------------------------------------------------------------
# Summaries.


def describe(entry: dict, restore: bool = False) -> str:
    """One line for a change, or with restore=True for putting it back, as a user reads it."""
    kind = entry["kind"]
    previous, value = entry.get("previous"), entry.get("value")
    if kind == "file":
        before = "previous content" if previous.get("exists") else "absent"
        change = (before, "managed content")
        return f"file {entry['path']}: " + " -> ".join(reversed(change) if restore else change)
    if kind == "cpufreq":
        before = ", ".join(sorted({str(gov) for gov in previous.values()}))
        change = (before, str(value))
        where = f"CPU governor on {len(previous)} CPU(s): "
        return where + " -> ".join(reversed(change) if restore else change)
    if kind == "service":
        change = tuple(
            f"{state['unit_file_state']}/{'active' if state['active'] else 'inactive'}"
            for state in (previous, value)
        )
        where = f"service {entry['unit']}: "
    elif kind == "process":
        change = tuple("running" if state else "not running" for state in (previous, value))
        where = f"process {entry['name']}: "
    elif kind == "persistence_mode":
        change = tuple("on" if state else "off" for state in (previous, value))
        where = f"GPU {entry['bus_id']} persistence mode: "
    else:
        change = (str(previous), str(value))
        where = f"{kind} {entry.get('name', entry.get('path'))}: "
    return where + " -> ".join(reversed(change) if restore else change)
