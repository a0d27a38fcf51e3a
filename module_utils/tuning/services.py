"""Host tuning: services, as systemd units where systemd is PID 1 and as detached processes
elsewhere - enabled, started, recorded, and put back on restore.

Whether systemd is PID 1, reading a unit's properties and files come from host_helpers; the
process helpers here (`pids_named`, `stop_pids`, `start_daemon`) find and stop daemons by name
(nv-fabricmanager started without systemd), which no other module does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

from ansible.module_utils.host.helpers import CommandFailed, read_text, systemd_is_pid1
from ansible.module_utils.host.helpers import parse_unit_show as unit_properties
from ansible.module_utils.tuning.record import TuningAbort, TuningError, TuningRun

ENABLE_FROM = ("disabled",)
MASKED = ("masked", "masked-runtime")
STOP_GRACE_S = 10.0


def service_manager(chosen: str) -> str:
    """systemd or direct: `chosen` unless it is auto, then systemd where it is PID 1."""
    if chosen != "auto":
        return chosen
    return "systemd" if systemd_is_pid1() else "direct"


# --------------------------------------------------------------------------------------------
# systemd units.


def systemctl(run: TuningRun) -> str:
    path = run.binary(run.params["systemctl_path"])
    if not path:
        raise TuningAbort(
            f"systemd is PID 1 but {run.params['systemctl_path']} was not found. Fix: set "
            "tuning_systemctl_path."
        )
    return path


def parse_unit_show(text: str) -> dict:
    """`systemctl show -p LoadState -p ActiveState -p UnitFileState` into loaded, unit file
    state and active."""
    props = unit_properties(text)
    return {
        "loaded": props.get("LoadState") not in (None, "", "not-found"),
        "unit_file_state": props.get("UnitFileState") or "unknown",
        "active": props.get("ActiveState") == "active",
    }


def unit(run: TuningRun, name: str) -> dict:
    argv = [systemctl(run), "show", name, "-p", "LoadState", "-p", "ActiveState"]
    rc, out, err = run.run([*argv, "-p", "UnitFileState"])
    if rc != 0:
        raise TuningAbort(f"`systemctl show {name}` exited {rc}: {(out + err).strip()}")
    return parse_unit_show(out)


def journal_tail(run: TuningRun, name: str) -> str:
    journalctl = run.which("journalctl")
    if not journalctl:
        return "(journalctl not found)"
    try:
        _rc, out, err = run.run([journalctl, "-u", name, "-n", "20", "--no-pager"])
    except CommandFailed as exc:
        # The failure it would explain is the message; a hung journalctl must not replace it.
        return f"(not read: {exc})"
    return (out + err).strip()[-3000:]


def service_entry(name: str, previous: dict, value: dict) -> dict:
    return {"kind": "service", "unit": name, "previous": previous, "value": value}


def ensure_service(run: TuningRun, name: str, why: str) -> bool:
    """Enabled and active; False when the unit does not exist."""
    info = unit(run, name)
    if not info["loaded"]:
        return False
    if info["unit_file_state"] in MASKED:
        raise TuningAbort(
            f"The {name} unit is masked; {why} needs it enabled and running. Fix: "
            f"`systemctl unmask {name}` if it was masked by mistake, then rerun."
        )
    previous = {"unit_file_state": info["unit_file_state"], "active": info["active"]}
    wanted = dict(previous)
    key = f"service:{name}"
    if info["unit_file_state"] in ENABLE_FROM:
        wanted["unit_file_state"] = "enabled"
        if not run.check:
            rc, out, err = run.run([systemctl(run), "enable", name])
            if rc != 0:
                raise TuningAbort(f"`systemctl enable {name}` failed ({rc}): {(out + err).strip()}")
            # Recorded at once: a failing start below must still leave the enable restorable.
            run.remember(key, service_entry(name, previous, wanted))
    if not info["active"]:
        wanted["active"] = True
        if not run.check:
            rc, out, err = run.run([systemctl(run), "start", name])
            if rc != 0 or not unit(run, name)["active"]:
                raise TuningAbort(
                    f"{name} did not start ({why} needs it): `systemctl start {name}` "
                    f"exited {rc}: {(out + err).strip()}. Its journal:\n"
                    f"{journal_tail(run, name)}\nFix what the journal names and rerun."
                )
    if wanted != previous:
        run.note(key, service_entry(name, previous, wanted))
    return True


def restore_service(run: TuningRun, entry: dict) -> bool:
    name, previous = entry["unit"], entry["previous"]
    info = unit(run, name)
    if not info["loaded"]:
        return False
    steps = []
    if previous["unit_file_state"] in ENABLE_FROM and info["unit_file_state"] == "enabled":
        steps.append("disable")
    if not previous["active"] and info["active"]:
        steps.append("stop")
    if not run.check:
        for step in steps:
            rc, out, err = run.run([systemctl(run), step, name])
            if rc != 0:
                raise TuningError(f"`systemctl {step} {name}` exited {rc}: {out}{err}")
    return bool(steps)


# --------------------------------------------------------------------------------------------
# Processes, where no systemd supervises them.


def pids_named(name: str) -> list[int]:
    """Processes whose program (argv[0]) is `name`; /proc is this host's own."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv0 = handle.read().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            continue
        if os.path.basename(argv0) == name:
            found.append(int(entry))
    return sorted(found)


def zombie(pid: int) -> bool:
    stat = read_text(f"/proc/{pid}/stat") or ""
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


def stop_pids(pids: list[int], grace_s: float = STOP_GRACE_S) -> list[int]:
    """SIGTERM, then SIGKILL after a grace period; the pids still alive after both."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            pids = [pid for pid in pids if os.path.exists(f"/proc/{pid}") and not zombie(pid)]
            if not pids:
                return []
            time.sleep(0.1)
    return pids


def start_daemon(argv: list[str], name: str, timeout: float, log: str) -> None:
    """Starts `argv` detached and waits until a process `name` runs; its log tail on failure."""
    # Detached, with its standard streams on /dev/null: a daemon that kept the module's
    # pipes open would block reading a command's output (and the task) forever.
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as exc:
        raise TuningAbort(f"Cannot start {' '.join(argv)} ({exc}).") from exc
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pids_named(name):
            return
        if proc.poll() not in (None, 0):
            break
        time.sleep(0.2)
    tail = read_text(log) or f"(no {log})"
    raise TuningAbort(
        f"{name} did not stay running within {timeout}s of `{' '.join(argv)}` (exit "
        f"{proc.poll()}). Its log ends:\n{tail[-3000:]}\nFix what the log names (driver "
        "version, NVSwitch state) and rerun."
    )


def restore_process(run: TuningRun, entry: dict) -> bool:
    pids = pids_named(entry["name"])
    if entry["previous"] or not pids:
        return False
    if not run.check:
        left = stop_pids(pids)
        if left:
            raise TuningError(f"{entry['name']} (pids {left}) did not stop")
    return True
