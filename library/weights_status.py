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
  - With O(wait_s), waits up to that long for the download to end before it answers, reading
    the status file every half second (module_utils/weights/status.py), so that the end is
    seen when it comes, not at the next poll.
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
  wait_s:
    description: Seconds to wait for the download to end before answering (0 to 3600).
    type: float
    default: 0
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

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.weights.status import download_job_file, wait  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "status_file": {"type": "path", "required": True},
            "job_id": {"type": "str"},
            "async_dir": {"type": "path", "default": "~/.ansible_async"},
            "wait_s": {"type": "float", "default": 0},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        found = wait(p["status_file"], download_job_file(p["async_dir"], p["job_id"]), p["wait_s"])
    except ValueError as error:
        module.fail_json(msg=f"weights_status: {error}")
    module.exit_json(**found)


if __name__ == "__main__":
    main()
