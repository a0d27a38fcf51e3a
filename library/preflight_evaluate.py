#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module preflight_evaluate: turns gathered facts into preflight verdicts."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_evaluate
short_description: Judge whether a host can serve Kimi K2.6 with the chosen serving configs
description:
  - Pure evaluation of facts gathered by gpu_facts, preflight_host_facts, hub_repo_info and
    capacity_plan against the hardware profile and the deployment settings.
  - Fails with every problem found at once, each saying what was found, what is needed and
    how to fix it. Checks named in I(warn_only) are reported as warnings instead.
  - Supports check mode; changes nothing.
version_added: "0.1.0"
options:
  gpu_facts:
    description: ansible_facts.gpu_facts from the gpu_facts module.
    type: dict
    required: true
  expected:
    description: >-
      Profile and settings - profile, gpu_model, tp_size, interconnect, min_driver_version,
      cuda, attention_backends (role to backend name).
    type: dict
    required: true
  backend_capabilities:
    description: Attention backend name to the compute capabilities it runs on.
    type: dict
    required: true
  host:
    description: Result of preflight_host_facts.
    type: dict
    required: true
  hub:
    description: Result of hub_repo_info; omit to skip hub and disk checks.
    type: dict
  needed_repos:
    description: Repository names (keys of hub.repos) the serving configs need.
    type: list
    elements: str
    default: []
  capacity:
    description: Serving config name to its capacity_plan result.
    type: dict
    default: {}
  disk_headroom_gib:
    description: Free space to keep beyond what the download needs.
    type: float
    default: 10
  warn_only:
    description: Names of checks to report as warnings rather than failures.
    type: list
    elements: str
    default: []
    choices: [gpu_count, gpu_model, compute_capability, driver, persistence_mode, fabricmanager,
              fabric_state, p2p, acs, disk, hf_token, hub_access, capacity, context_length]
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Evaluate every preflight check
  preflight_evaluate:
    gpu_facts: "{{ ansible_facts.gpu_facts }}"
    expected: "{{ __preflight_expected }}"
    backend_capabilities: "{{ kimi_attention_backend_compute_capabilities }}"
    host: "{{ __preflight_host }}"
    hub: "{{ __preflight_hub }}"
    needed_repos: [target, dflash]
    capacity: {dflash: "{{ __capacity_result }}"}
    warn_only: [acs]
"""

RETURN = r"""
findings:
  description: Every check with ok, severity (ok, warning, failure) and message.
  returned: always
  type: list
  elements: dict
failures:
  description: Messages of the failed checks.
  returned: always
  type: list
  elements: str
warning_messages:
  description: Messages of the checks reported as warnings (also shown as Ansible warnings).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.preflight.verdicts import CHECKS, evaluate  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "gpu_facts": {"type": "dict", "required": True},
            "expected": {"type": "dict", "required": True},
            "backend_capabilities": {"type": "dict", "required": True},
            "host": {"type": "dict", "required": True},
            "hub": {"type": "dict"},
            "needed_repos": {"type": "list", "elements": "str", "default": []},
            "capacity": {"type": "dict", "default": {}},
            "disk_headroom_gib": {"type": "float", "default": 10},
            "warn_only": {
                "type": "list",
                "elements": "str",
                "default": [],
                "choices": list(CHECKS),
            },
        },
        supports_check_mode=True,
    )
    p = module.params
    verdict = evaluate(
        gpu=p["gpu_facts"],
        expected=p["expected"],
        backend_capabilities=p["backend_capabilities"],
        host=p["host"],
        hub=p["hub"],
        needed_repos=p["needed_repos"],
        capacity=p["capacity"],
        disk_headroom_gib=p["disk_headroom_gib"],
        warn_only=p["warn_only"],
    )
    for warning in verdict["warning_messages"]:
        module.warn(warning)
    if verdict["failures"]:
        count = len(verdict["failures"])
        module.fail_json(
            msg=f"Preflight found {count} problem{'s' if count > 1 else ''}: "
            + " ".join(f"({n}) {m}" for n, m in enumerate(verdict["failures"], 1)),
            **verdict,
        )
    module.exit_json(changed=False, **verdict)


if __name__ == "__main__":
    main()
