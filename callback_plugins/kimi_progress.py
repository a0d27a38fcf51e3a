"""Callback kimi_progress: show a task's `progress` line on every retry of an until loop, and
describe this run for the per-host lock.

Ansible prints only "FAILED - RETRYING ... (N retries left)" while a status module is polled;
long stages (a 595 GB download, a server loading it) report a `progress` line instead, and
this callback prints it whenever it changes, so the person watching sees bytes, rate and ETA.
It does so under any stdout callback (ansible-runner's and AWX's too); the kit's own stdout
callback, kimi_readable, leaves these lines to it and drops the retry lines around them.

The per-host lock (module_utils/host/lock.py) needs to name this run's ansible-playbook process:
a callback runs in that process, before any task, while templates are rendered in worker
processes forked from it (or in it). So the callback puts the description into the
environment, KIMI_RUN_HOLDER, which every fork inherits and group_vars/all/lock.yml reads.
"""

from __future__ import annotations

import getpass
import json
import os
import secrets
import socket
import unicodedata

DOCUMENTATION = r"""
name: kimi_progress
type: notification
short_description: Print the progress line of polled status modules
description:
  - On each retry of a task whose result has a C(progress) string, print it when it differs
    from the line last printed for that host and task.
requirements:
  - Enabled in ansible.cfg (callbacks_enabled).
"""

from ansible.plugins.callback import CallbackBase  # noqa: E402

HOLDER_ENV = "KIMI_RUN_HOLDER"
# A status line, not a report: anything longer is a module gone wrong, not more to read.
PROGRESS_MAX_CHARS = 300


def progress_line(progress) -> str | None:
    """The line to show for a result's `progress`, or None when it has none. The text comes
    from the host: one line, no control characters (a terminal escape would repaint the
    screen), bounded. Empty exactly when `progress.strip()` is (kimi_readable's test)."""
    if not isinstance(progress, str):
        return None
    line = " ".join(progress.split())
    if not line:
        return None
    line = "".join("?" if unicodedata.category(char)[0] == "C" else char for char in line)
    if len(line) > PROGRESS_MAX_CHARS:
        line = line[: PROGRESS_MAX_CHARS - 1] + "\u2026"
    return line


def run_holder(playbook: str, run_id: str) -> dict:
    """This ansible-playbook process: controller (hostname, machine id), boot, user,
    playbook, run id, pid and the pid's start time (a pid reused later has another). Without
    /proc (not Linux) the start time and boot are unknown, and a lock holder cannot be judged
    gone from here."""
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            pid_start = int(handle.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            boot_id = handle.read().strip()
    except (OSError, IndexError, ValueError):
        pid_start, boot_id = 0, "unknown"
    try:
        # Hostnames repeat across machines: another machine's pids mean nothing here.
        with open("/etc/machine-id", encoding="ascii") as handle:
            machine_id = handle.read().strip() or "unknown"
    except OSError:
        machine_id = "unknown"
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    shown = os.path.relpath(playbook) if playbook else "?"
    return {
        "controller": socket.gethostname(),
        "machine_id": machine_id,
        "boot_id": boot_id,
        "user": user,
        "playbook": os.path.abspath(playbook) if shown.startswith("..") else shown,
        "run_id": run_id,
        "pid": pid,
        "pid_start": pid_start,
    }


def preload_jinja_plugins() -> None:
    """Load every filter and test plugin in this process, before the first worker forks.

    Ansible forks a worker per task and host, and a worker that templates a filter loads
    every filter plugin file unless the process it was forked from already had: the kit's
    filters import much of module_utils/, which took 40% of each worker's CPU when every worker
    loaded them anew. Loaded here, every fork inherits them."""
    from ansible.plugins.loader import filter_loader, test_loader

    for loader in (filter_loader, test_loader):
        for _plugin in loader.all():
            pass


# The kit's action plugins that read the same files for every host (a module-level warm()):
# warmed here, in the process the task's workers fork from.
WARMED_ACTIONS = frozenset({"kimi_settings_check"})


def warm_action(action: str) -> None:
    """Load a kit action plugin and fill its caches before the task's workers fork, so that
    each inherits them instead of reading the same files again."""
    name = action.rsplit(".", 1)[-1]
    if name not in WARMED_ACTIONS:
        return
    import sys

    from ansible.plugins.loader import action_loader

    plugin = action_loader.get(name, class_only=True)
    warm = getattr(sys.modules.get(getattr(plugin, "__module__", "")), "warm", None)
    if warm is not None:
        warm()


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "kimi_progress"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # One id per ansible-playbook process, whatever an inherited environment says: a
        # playbook run from a task of another run is a run of its own.
        self._run_id = secrets.token_hex(8)
        # host -> (task uuid, line last printed): a poll that moved nothing says nothing.
        self._last_line: dict[str, tuple[str, str]] = {}

    def v2_playbook_on_start(self, playbook) -> None:
        holder = run_holder(getattr(playbook, "_file_name", "") or "", self._run_id)
        os.environ[HOLDER_ENV] = json.dumps(holder)
        preload_jinja_plugins()

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        warm_action(task.action)

    def v2_runner_retry(self, result) -> None:
        line = progress_line(result.result.get("progress"))
        if line is None:
            return
        host = result.host.get_name()
        shown = (result.task._uuid, line)
        if self._last_line.get(host) == shown:
            return
        self._last_line[host] = shown
        self._display.display(f"  [{host}] {line}")
