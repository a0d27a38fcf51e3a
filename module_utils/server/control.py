"""What the server modules share: where the server process is, which launch it runs, its log.

Two managers run the server through one interface: systemd where it is PID 1, and the kit's
own supervisor (roles/server/files/kimi_supervise.py) elsewhere. Which launch a process runs
is read from its own environment (CONFIG_HASH_KEY in /proc/<pid>/environ, root-only), so the
answer is true even after a failed run left new files beside an old process. The value is a
keyed identity (module_utils/server/identity.py), or an earlier kit's unkeyed hash.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections import deque
from pathlib import Path

from ansible.module_utils.host.helpers import kill_process_group, pid_alive, unit_state
from ansible.module_utils.server.identity import IDENTITY_VARIABLE

CONFIG_HASH_KEY = IDENTITY_VARIABLE
SYSTEMD_PROPERTIES = (
    "LoadState",
    "ActiveState",
    "SubState",
    "MainPID",
    "NRestarts",
    "UnitFileState",
    "NeedDaemonReload",
    "ExecMainStatus",
    "Result",
)


def process_environment(pid: int | None) -> dict[str, str] | None:
    if not pid:
        return None
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def running_config_hash(pid: int | None) -> str | None:
    environment = process_environment(pid)
    return environment.get(CONFIG_HASH_KEY) if environment else None


def systemd_status(run, unit: str) -> dict:
    """`systemctl show` of the unit; run(argv) -> (rc, stdout, stderr)."""
    values = unit_state(run, unit, SYSTEMD_PROPERTIES)
    pid = int(values.get("MainPID") or 0)
    active = values.get("ActiveState", "")
    return {
        "manager": "systemd",
        "loaded": values.get("LoadState") == "loaded",
        "running": active in ("active", "activating", "reloading") and pid > 0,
        "status": active or "unknown",
        "sub_state": values.get("SubState", ""),
        "pid": pid or None,
        "restarts": int(values.get("NRestarts") or 0),
        "enabled": values.get("UnitFileState") == "enabled",
        "needs_reload": values.get("NeedDaemonReload") == "yes",
        "last_exit": int(values.get("ExecMainStatus") or 0),
        "failed": active == "failed",
    }


def stop_needed(status: dict) -> bool:
    """Whether a stop has something to do: a server running, or a systemd unit between a
    crash and its automatic restart (ActiveState activating, SubState auto-restart, no PID yet:
    a multi-node rank whose head just stopped), or one that failed (that rank, its restarts
    spent before the stop came). Left alone, the first starts the server again after the stop
    (`systemctl stop` cancels the pending restart); the second stays failed and enabled, to
    start again at the next boot (the stop disables it and resets its failed state)."""
    if status["running"]:
        return True
    return status["manager"] == "systemd" and status["status"] in (
        "activating",
        "reloading",
        "failed",
    )


def supervisor_status(pid_file: str, state_file: str) -> dict:
    try:
        supervisor_pid = int(Path(pid_file).read_text().strip() or 0)
    except (OSError, ValueError):
        supervisor_pid = 0
    try:
        state = json.loads(Path(state_file).read_text())
    except (OSError, ValueError):
        state = {}
    running = pid_alive(supervisor_pid) and state.get("supervisor_pid") == supervisor_pid
    status = state.get("status", "absent")
    if not running and status in ("starting", "running", "backoff"):
        # The supervisor died without writing a last state (killed with SIGKILL, host reboot).
        status = "dead"
    child = state.get("child_pid") if running else None
    return {
        "manager": "supervisor",
        "loaded": True,
        "running": running,
        "status": status,
        "supervisor_pid": supervisor_pid if running else None,
        "pid": child if pid_alive(child) else None,
        "restarts": int(state.get("restarts") or 0),
        "last_exit": state.get("last_exit"),
        "failed": status in ("gave-up", "dead"),
    }


def stop_supervisor(status: dict, timeout: float) -> None:
    """SIGTERM the supervisor (it stops the server's process group), then SIGKILL both."""
    pid = status.get("supervisor_pid")
    if not pid:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.2)
    if pid_alive(pid):
        # The server leads its own process group (the supervisor starts it so).
        kill_process_group(status.get("pid"), grace_s=0)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def file_tail(path: str, lines: int) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return [line.rstrip("\n") for line in deque(handle, maxlen=lines)]
    except OSError as error:
        return [f"(no log at {path}: {error.strerror})"]
