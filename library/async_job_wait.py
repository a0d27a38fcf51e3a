#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module async_job_wait: wait on the host for a background (async) task to end."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: async_job_wait
short_description: Wait on the host for a task started with async and poll 0, then give its result
description:
  - Waits up to O(wait_s) for the background job to end, reading its result file every half
    second (module_utils/host/async_job.py), so that its end is seen when it comes and not at
    Ansible's next poll.
  - Once the job has ended, returns the started module's result as async_status does (its
    own arguments left out), fails when that module failed, with its message, and removes
    the job's result file, as Ansible's own poll does.
  - Before then, returns RV(finished) false; run it in an C(until) loop.
version_added: "0.1.0"
options:
  jid:
    description: The job id the async task registered (C(ansible_job_id)).
    type: str
    required: true
  async_dir:
    description: Where Ansible keeps async job results on the host.
    type: path
    default: ~/.ansible_async
  wait_s:
    description: Seconds to wait for the job to end before answering (0 to 3600).
    type: float
    default: 0
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Start the long task
  ansible.builtin.command: /usr/local/bin/long-task
  async: 3600
  poll: 0
  register: job

- name: Wait for it, ten seconds a check at most
  async_job_wait:
    jid: "{{ job.ansible_job_id }}"
    wait_s: 10
  register: done
  until: done.finished
  retries: 362
  delay: 0
"""

RETURN = r"""
finished:
  description: The job has ended; the started module's own result comes with it.
  returned: always
  type: bool
ansible_job_id:
  description: The job id.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.async_job import check  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "jid": {"type": "str", "required": True},
            "async_dir": {"type": "path", "default": "~/.ansible_async"},
            "wait_s": {"type": "float", "default": 0},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        result = check(p["async_dir"], p["jid"], p["wait_s"])
    except ValueError as error:
        module.fail_json(msg=f"async_job_wait: {error}")
    if result.get("failed"):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
