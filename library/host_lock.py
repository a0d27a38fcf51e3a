#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module host_lock: the per-host lock of deploy, benchmark and teardown."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_lock
short_description: Take or release the kit's per-host lock
description:
  - Keeps two runs of the kit off one host at once. The holder is the ansible-playbook process
    of one run (its controller, user, playbook, run id, pid and the pid's start time); the
    same run takes the lock again as often as it likes.
  - A holder from the same controller is handed back with C(acquired=false) and
    C(same_controller=true) on a first call; the controller reads /proc/<pid>/stat and calls
    again with C(takeover). A holder that is gone is then taken over with a warning naming
    it; a live one fails the task naming it and since when. A holder from another controller
    counts as live.
  - C(break_lock) takes a live lock, with a warning.
  - Never reports a change, because the lock is bookkeeping of the run, not a state of the
    host, and a second deploy that changes nothing must say so.
  - Supports check mode (nothing is written; a live holder still fails the task).
version_added: "0.1.0"
options:
  path:
    description: The lock file; its folder is made root-only (0700), the file is 0600.
    type: path
    default: /var/lib/kimi/lock/lock.json
  state:
    description: C(present) takes the lock, C(absent) releases this run's lock.
    type: str
    choices: [present, absent]
    default: present
  holder:
    description: >-
      This run: controller (hostname), machine_id, boot_id, user, playbook, run_id
      (strings), pid and pid_start (the pid's start time in clock ticks since boot).
    type: dict
    required: true
  break_lock:
    description: Take the lock even from a live holder.
    type: bool
    default: false
  takeover:
    description: >-
      The holder the controller judged (run_id) and the text of its /proc/<pid>/stat there
      (proc_stat; empty when there is no such process).
    type: dict
  wait_s:
    description: Seconds to wait for another run that is taking or releasing the lock.
    type: float
    default: 10
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Take the per-host lock
  host_lock:
    holder: "{{ kimi_lock_holder }}"
    break_lock: "{{ kimi_break_lock }}"
  register: lock

- name: Take over the lock of a run that has gone from this controller
  host_lock:
    holder: "{{ kimi_lock_holder }}"
    takeover:
      run_id: "{{ lock.holder.run_id }}"
      proc_stat: >-
        {{ lookup('ansible.builtin.file', '/proc/' ~ lock.holder.pid ~ '/stat',
                  errors='ignore') }}
  when: not lock.acquired
"""

RETURN = r"""
acquired:
  description: This run holds the lock (state present).
  returned: always
  type: bool
released:
  description: This run's lock was removed (state absent).
  returned: always
  type: bool
holder:
  description: Who holds the lock now (with since), or null.
  returned: always
  type: dict
previous:
  description: The holder that was taken over or broken, or null.
  returned: always
  type: dict
same_controller:
  description: The other holder ran on this run's controller (only there can it be judged).
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.lock import LockError, LockHeld, acquire, release  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": "/var/lib/kimi/lock/lock.json"},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "holder": {"type": "dict", "required": True},
            "break_lock": {"type": "bool", "default": False},
            "takeover": {"type": "dict"},
            "wait_s": {"type": "float", "default": 10.0},
        },
        supports_check_mode=True,
    )
    p = module.params
    base = {"changed": False, "acquired": False, "released": False, "previous": None}
    base["same_controller"] = False
    try:
        if p["state"] == "absent":
            done = release(p["path"], p["holder"], module.check_mode, p["wait_s"])
            if not done["released"] and done["holder"] is not None:
                module.warn(
                    f"The lock on this host is not this run's any more: {done['holder']['run_id']}"
                    " took it (with kimi_break_lock) while this run held it; it stays."
                )
            module.exit_json(**{**base, **done})
        done = acquire(
            p["path"],
            p["holder"],
            break_lock=p["break_lock"],
            takeover=p["takeover"],
            check_mode=module.check_mode,
            wait_s=p["wait_s"],
        )
    except LockHeld as held:
        module.fail_json(msg=str(held), **{**base, "holder": held.holder})
    except (LockError, OSError) as err:
        module.fail_json(msg=f"The per-host lock {p['path']}: {err}", **base)
    if done["note"]:
        module.warn(done["note"][0].upper() + done["note"][1:])
    module.exit_json(**{**base, **done})


if __name__ == "__main__":
    main()
