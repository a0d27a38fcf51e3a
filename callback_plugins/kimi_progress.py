"""Callback kimi_progress: show a task's `progress` line on every retry of an until loop.

Ansible prints only "FAILED - RETRYING ... (N retries left)" while a status module is polled;
long stages (a 595 GB download, a server loading it) report a `progress` line instead, and
this callback prints it, so the person watching sees bytes, rate and ETA on every poll.
"""

from __future__ import annotations

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


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "kimi_progress"
    CALLBACK_NEEDS_ENABLED = True

    def v2_runner_retry(self, result) -> None:
        progress = result._result.get("progress")
        if isinstance(progress, str) and progress:
            self._display.display(f"  [{result._host.get_name()}] {progress}")
