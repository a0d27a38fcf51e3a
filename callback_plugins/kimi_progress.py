"""Callback kimi_progress: show a task's `progress` line on every retry of an until loop, and
describe this run for the per-host lock.

Ansible prints only "FAILED - RETRYING ... (N retries left)" while a status module is polled;
long stages (a 595 GB download, a server loading it) report a `progress` line instead, and
this callback prints it, so the person watching sees bytes, rate and ETA on every poll.

The per-host lock (module_utils/host_lock.py) needs to name this run's ansible-playbook process:
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

DOCUMENTATION = r"""
name: kimi_progress
type: notification
short_description: Print the progress line of polled status modules
description:
  - On each retry of a task whose result has a C(progress) string, print it.
requirements:
  - Enabled in ansible.cfg (callbacks_enabled).
"""

from ansible.plugins.callback import CallbackBase  # noqa: E402

HOLDER_ENV = "KIMI_RUN_HOLDER"


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

    def v2_playbook_on_start(self, playbook) -> None:
        holder = run_holder(getattr(playbook, "_file_name", "") or "", self._run_id)
        os.environ[HOLDER_ENV] = json.dumps(holder)

    def v2_runner_retry(self, result) -> None:
        progress = result._result.get("progress")
        if isinstance(progress, str) and progress:
            self._display.display(f"  [{result._host.get_name()}] {progress}")
