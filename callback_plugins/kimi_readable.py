"""Stdout callback kimi_readable: Ansible's default output without the retry noise.

A long stage is an until loop over a status module polled every few seconds: the default
callback says "FAILED - RETRYING: [host]: <task> (N retries left)." on every poll, which reads
as an error and buries the line that matters. With this callback a polled task shows its
`progress` line instead, and a polled task without one says once that it is waiting.

It prints no progress line itself: kimi_progress (a notification callback, always enabled
because the per-host lock needs it) does, under every stdout callback, and Ansible sends each
event to the stdout callback first. Under ansible-runner and AWX their own stdout callback
replaces this one, so the retry lines come back there and kimi_progress's lines stay; the
playbooks' summaries are tasks, so nothing the kit needs depends on this callback.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: kimi_readable
type: stdout
short_description: Default output with progress lines instead of retry noise
description:
  - Ansible's default output, except for the retries of an C(until) loop.
  - A retry whose result has a C(progress) string prints nothing here; the kimi_progress
    callback prints that line, once per change.
  - A retry without one prints a single waiting line per host and task.
  - A failed task's message is printed once, in the C([ERROR]) block with the task's origin,
    where Ansible's default output prints it again in the C(fatal) line's result (with -vvv
    it comes back there).
  - A task that only restates a failure already printed (a rescue's C(fail) with the task var
    C(kimi_restates_failure)) prints its message on one line, not as a second error; a failure
    whose message repeats the host's previous one (a rescue that adds to it for the callers)
    prints only what it adds.
  - With -vvv the default retry lines, results included, come back.
extends_documentation_fragment:
  - default_callback
  - result_format_callback
requirements:
  - Set as stdout_callback in ansible.cfg, with kimi_progress in callbacks_enabled.
"""

from ansible import constants as C  # noqa: E402
from ansible.plugins.callback.default import CallbackModule as DefaultCallback  # noqa: E402

# From -vvv on, where the default callback adds each retry's result, the person is debugging:
# every retry and its result are worth the noise.
VERBOSE_RETRIES = 3


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "kimi_readable"

    def __init__(self) -> None:
        super().__init__()
        # host -> uuid of the task it last said it waits for; one entry per host.
        self._waiting_on: dict[str, str] = {}
        # host -> the message of its last failure, which a rescue may repeat.
        self._last_failure: dict[str, str] = {}

    def v2_runner_on_failed(self, result, ignore_errors: bool = False) -> None:
        host = self.host_label(result)
        message = str(result.result.get("msg", ""))
        earlier = self._last_failure.get(host, "")
        self._last_failure[host] = message
        if self._display.verbosity >= VERBOSE_RETRIES:
            super().v2_runner_on_failed(result, ignore_errors)
            return
        if earlier and message.startswith(earlier):
            added = message[len(earlier) :].strip()
            line = f"(the error above){' ' + added if added else ''}"
        elif result.task.vars.get("kimi_restates_failure"):
            line = message
        else:
            # The default callback prints the error, message included, in an [ERROR] block with
            # the task's origin, then the result with the same msg: the result leaves it out.
            summary = self._current_task_result
            if summary is not None and summary.exception is not None and "msg" in result.result:
                result.result.pop("msg")
            super().v2_runner_on_failed(result, ignore_errors)
            return
        if self._last_task_banner != result.task._uuid:
            self._print_task_banner(result.task)
        self._display.display(f"  [{host}] {' '.join(line.split())}", color=C.COLOR_ERROR)

    def v2_runner_retry(self, result) -> None:
        if self._display.verbosity >= VERBOSE_RETRIES:
            super().v2_runner_retry(result)
            return
        task = result.task
        # With display_ok_hosts or display_skipped_hosts off the default callback holds the
        # banner back until a result shows; a progress line needs it printed first.
        if self._last_task_banner != task._uuid:
            self._print_task_banner(task)
        progress = result.result.get("progress")
        if isinstance(progress, str) and progress.strip():
            return  # kimi_progress prints it
        host = self.host_label(result)
        if self._waiting_on.get(host) == task._uuid:
            return
        self._waiting_on[host] = task._uuid
        name = (result.task_name or task.get_name()).strip()
        # attempts counts the first run, retries every run the loop may make.
        limit = result.result.get("retries")
        bound = f" (up to {limit} attempts)" if isinstance(limit, int) else ""
        self._display.display(f"  [{host}] waiting: {name}{bound}")
