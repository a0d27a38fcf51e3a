#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module weights_status: progress of a weights_download running under async."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: weights_status
short_description: Read the progress of a background weights download
description:
  - Reads the status file weights_download keeps up to date and returns bytes done and
    total, rate, ETA and files done, plus a one-line C(progress) that the kit's
    kimi_progress callback prints on every poll of an C(until) loop.
  - Notices when the download process is gone without finishing (killed, host rebooted).
  - Read-only; supports check mode.
version_added: "0.1.0"
options:
  status_file:
    description: The status file given to weights_download.
    type: path
    required: true
  job_id:
    description: >-
      The async job id of the download; when the job has ended (even before writing any
      status), the wait is over.
    type: str
  async_dir:
    description: Where Ansible keeps async job results on the host.
    type: path
    default: ~/.ansible_async
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Wait for the download, showing progress
  weights_status:
    status_file: /opt/kimi/weights/.kimi/moonshotai--Kimi-K2.6/status.json
  register: progress
  until: progress.done
  retries: 8640
  delay: 10
"""

RETURN = r"""
done:
  description: The download finished, failed, or its process is gone.
  returned: always
  type: bool
succeeded:
  description: The download finished and verified.
  returned: always
  type: bool
state:
  description: starting, checking, downloading, verifying, done, failed, gone or ended.
  returned: always
  type: str
progress:
  description: One line for people watching.
  returned: always
  type: str
status:
  description: The whole status record (bytes_done, bytes_total, rate_bytes_per_s, eta_s ...).
  returned: always
  type: dict
"""

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.helpers import pid_alive  # noqa: E402
from ansible.module_utils.weights.manifest import progress_line, read_json  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "status_file": {"type": "path", "required": True},
            "job_id": {"type": "str"},
            "async_dir": {"type": "path", "default": "~/.ansible_async"},
        },
        supports_check_mode=True,
    )
    status = read_json(module.params["status_file"])
    job = None
    if module.params["job_id"]:
        job = read_json(os.path.join(module.params["async_dir"], module.params["job_id"]))
    job_ended = bool(job) and (job.get("finished") == 1 or job.get("failed"))
    if job_ended and (status is None or status.get("state") not in ("done", "failed")):
        # The job ended without a final status: its own result says why.
        module.exit_json(
            changed=False,
            done=True,
            succeeded=False,
            state="ended",
            progress="the download job ended; collecting its result",
            status=status or {},
        )
    if status is None:
        module.exit_json(
            changed=False,
            done=False,
            succeeded=False,
            state="starting",
            progress="waiting for the download to start",
            status={},
        )
    state = status.get("state", "starting")
    if state not in ("done", "failed") and status.get("pid") and not pid_alive(status["pid"]):
        state = "gone"
        status["message"] = (
            f"the download process (pid {status['pid']}) ended without finishing, at "
            f"{status.get('bytes_done', 0)} of {status.get('bytes_total', 0)} bytes; it was "
            "killed or the host restarted. Rerun the playbook: completed files are kept."
        )
    progress = progress_line({**status, "state": state})
    if status.get("message") and state != "downloading":
        progress += f": {status['message']}"
    module.exit_json(
        changed=False,
        done=state in ("done", "failed", "gone"),
        succeeded=state == "done",
        state=state,
        progress=progress,
        status=status,
    )


if __name__ == "__main__":
    main()
