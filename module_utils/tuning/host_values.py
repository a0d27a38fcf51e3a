"""Host tuning: host values - sysctls, the CPU frequency governor, and the configuration files
(NCCL's nccl.conf and a sysctl.d file) - set, recorded and restored.

Each `tune_*` function brings one kind of value to what the run's parameters ask for and
notes every change in the run (module_utils/tuning/record.py); each `restore_*` function puts
one recorded entry back and says whether anything had to change.
"""

from __future__ import annotations

import base64
import os
import re

from ansible.module_utils.host.helpers import atomic_write, read_text, text_sha256
from ansible.module_utils.tuning.record import (
    TuningAbort,
    TuningRun,
    under_root,
    write_value,
)

NCCL_KEY = re.compile(r"^NCCL_[A-Z0-9_]+$")
# NCCL reads at most 1023 characters of a value from its configuration file.
NCCL_VALUE_MAX = 1023
SYSCTL_NAME = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_-]+)+$")
CPU_DIR = re.compile(r"^cpu(\d+)$")
# The header has no "=": NCCL takes every line with one as a variable.
NCCL_CONF_HEADER = (
    "# Written by the kimi kit tuning role (NCCL environment of this host's hardware profile).\n"
    "# One KEY and value per line; variables already in a process environment win over these.\n"
)
SYSCTL_CONF_HEADER = "# Written by the kimi kit tuning role; teardown.yml removes or restores it.\n"
MANAGED_FILE_MODE = "0644"


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
# Sysctls.


def sysctl_path(root: str, name: str) -> str:
    return under_root(root, "/proc/sys/" + name.replace(".", "/"))


def tune_sysctls(run: TuningRun) -> dict[str, str]:
    """Sets the sysctls this kernel has; returns them (name to wanted value)."""
    present = {}
    for name, value in sorted(run.params["sysctls"].items()):
        value = str(value)
        path = sysctl_path(run.params["root"], name)
        current = read_text(path)
        if current is None:
            run.not_applied.append(
                {"what": f"sysctl {name}", "reason": f"{path} does not exist in this kernel"}
            )
            continue
        present[name] = value
        if current.split() == value.split():
            continue
        if not run.check:
            try:
                write_value(path, value)
            except OSError as exc:
                raise TuningAbort(
                    f"Cannot set {name} to {value} (found {current}; {exc}). Needed: root on "
                    "the host itself; /proc/sys is read-only in most containers. Fix: set "
                    f"it on the host (sysctl -w {name}={value}), or remove it from "
                    "tuning_sysctls."
                ) from exc
        run.note(
            f"sysctl:{name}",
            {"kind": "sysctl", "name": name, "path": path, "previous": current, "value": value},
        )
    return present


def restore_sysctl(run: TuningRun, entry: dict) -> bool:
    current = read_text(entry["path"])
    if current is None or current.split() == str(entry["previous"]).split():
        return False
    if not run.check:
        write_value(entry["path"], entry["previous"])
    return True


# --------------------------------------------------------------------------------------------
# The CPU frequency governor.


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


def tune_governor(run: TuningRun) -> None:
    wanted = run.params["cpu_governor"]
    if not wanted:
        return
    files = cpufreq_governor_files(run.params["root"])
    if not files:
        run.not_applied.append(
            {
                "what": "cpu_governor",
                "reason": "no cpufreq under "
                f"{under_root(run.params['root'], '/sys/devices/system/cpu')} (a virtual "
                "machine, or no cpufreq driver): nothing to set",
            }
        )
        return
    previous, paths = {}, {}
    for cpu, path in files:
        available = read_text(os.path.join(os.path.dirname(path), "scaling_available_governors"))
        if available is not None and wanted not in available.split():
            raise TuningAbort(
                f"The CPU governor {wanted} is not available on {cpu} (available: "
                f"{available}). Fix: set tuning_cpu_governor to one of those, or to an empty "
                "string to leave the governor alone."
            )
        current = read_text(path)
        if current != wanted:
            previous[cpu], paths[cpu] = current, path
    if not previous:
        return
    if not run.check:
        for cpu, path in paths.items():
            try:
                write_value(path, wanted)
            except OSError as exc:
                raise TuningAbort(
                    f"Cannot set the {wanted} governor on {cpu} ({exc}). Needed: root on the "
                    "host; Fix: run as root, or set tuning_cpu_governor to an empty string."
                ) from exc
    run.note(
        "cpufreq:scaling_governor",
        {
            "kind": "cpufreq",
            "name": "scaling_governor",
            "paths": paths,
            "previous": previous,
            "value": wanted,
        },
    )


def restore_cpufreq(run: TuningRun, entry: dict) -> bool:
    differs = {
        cpu: gov
        for cpu, gov in entry["previous"].items()
        if gov is not None and read_text(entry["paths"][cpu]) not in (None, gov)
    }
    if not run.check:
        for cpu, gov in differs.items():
            write_value(entry["paths"][cpu], gov)
    return bool(differs)


# --------------------------------------------------------------------------------------------
# Configuration files (their previous content is kept in the state file).


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


def manage_file(run: TuningRun, path: str, text: str) -> None:
    """The file holds `text` with mode 0644; its previous content and mode are recorded."""
    data = text.encode()
    snapshot = file_snapshot(path)
    before = snapshot_bytes(snapshot)
    if before == data and snapshot.get("mode") == MANAGED_FILE_MODE:
        return
    run.diffs.append(
        {
            "before_header": path,
            "after_header": path,
            "before": before.decode(errors="replace") if before is not None else "",
            "after": text,
        }
    )
    if not run.check:
        try:
            atomic_write(path, data, int(MANAGED_FILE_MODE, 8))
        except OSError as exc:
            raise TuningAbort(
                f"Cannot write {path} ({exc}). Fix: run as root (become: true)."
            ) from exc
    run.note(
        f"file:{path}",
        {
            "kind": "file",
            "path": path,
            "previous": snapshot,
            "value": {"sha256": text_sha256(text)},
        },
    )


def tune_files(run: TuningRun, sysctls_present: dict[str, str]) -> None:
    """nccl.conf from the NCCL environment; the sysctl.d file from the sysctls the kernel has."""
    params = run.params
    if params["nccl_conf"] and params["nccl_environment"]:
        manage_file(run, params["nccl_conf"], render_nccl_conf(params["nccl_environment"]))
    if params["sysctl_conf"] and sysctls_present:
        manage_file(run, params["sysctl_conf"], render_sysctl_conf(sysctls_present))


def restore_file(run: TuningRun, entry: dict) -> bool:
    snapshot = entry["previous"]
    if file_snapshot(entry["path"]) == snapshot:
        return False
    if not run.check:
        if snapshot.get("exists"):
            atomic_write(entry["path"], snapshot_bytes(snapshot), int(snapshot["mode"], 8))
        else:
            os.unlink(entry["path"])
    return True
