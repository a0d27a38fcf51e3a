#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module diagnose_bundle: the support bundle's folder and tarball on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: diagnose_bundle
short_description: Prepare the support bundle's folder, then pack every host into one tarball
description:
  - Runs on the controller (roles/diagnose delegates it to localhost).
  - O(step=prepare) checks that O(output_dir) can hold C(<run_id>.tar.gz) (absolute, a folder
    or creatable, writable by this user, no bundle of that name yet), makes it (0700) when
    new, and makes a staging folder (0700) in it for the hosts' archives. A folder that cannot
    be written fails saying what was found, what is needed and how to fix it, before any host
    is asked. In check mode it only checks.
  - O(step=bundle) reads each collected host's archive from the staging folder member by
    member (never extracted - only regular files with safe relative names, within the host's
    cap), scrubs them again of O(secrets), and writes C(<output_dir>/<run_id>.tar.gz) (0600,
    written beside it and linked into place, so it is whole or absent and never replaces a
    file) holding C(<run_id>/<host>/...) per host and C(<run_id>/index.json), which names
    every host with its state (collected, unreachable, failed), why, and the items not
    collected. The staging folder is removed whatever happens.
version_added: "0.1.0"
options:
  step:
    description: Which half of the work this call does.
    type: str
    required: true
    choices: [prepare, bundle]
  output_dir:
    description: Absolute folder on the controller that receives the bundle.
    type: path
    required: true
  run_id:
    description: The bundle's name without C(.tar.gz) (letters, digits, C(.), C(_), C(-)).
    type: str
    required: true
  staging_dir:
    description: The staging folder O(step=prepare) returned (O(step=bundle)).
    type: path
    default: ""
  hosts:
    description: The play's hosts, in order (O(step=bundle)).
    type: list
    elements: str
    default: []
  outcomes:
    description: >-
      Per host name (O(step=bundle)) - state (collected, unreachable, failed), why, and for a
      collected host archive, the path of its fetched archive in O(staging_dir). A host of
      O(hosts) without one is recorded as failed.
    type: dict
    default: {}
  secrets:
    description: Values masked again in every member (the kit's API key and HF token); never logged.
    type: list
    elements: str
    default: []
  max_host_bytes:
    description: Most bytes of one host's members (the collection's cap; its manifest comes on top).
    type: int
    default: 33554432
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check and make the bundle's folder
  diagnose_bundle:
    step: prepare
    output_dir: "{{ playbook_dir }}/diagnostics"
    run_id: 20260101T000000Z
  delegate_to: localhost
  run_once: true
  register: prepared
"""

RETURN = r"""
bundle:
  description: The bundle's path.
  returned: always
  type: str
  sample: /home/ops/kit/diagnostics/20260101T000000Z.tar.gz
staging_dir:
  description: The staging folder for the hosts' archives (O(step=prepare); null in check mode).
  returned: when step is prepare
  type: str
bytes:
  description: The bundle's size.
  returned: when step is bundle
  type: int
hosts:
  description: Per host - state, why and the items per state.
  returned: when step is bundle
  type: dict
unreachable_hosts:
  description: Hosts that could not be reached.
  returned: when step is bundle
  type: list
  elements: str
failed_hosts:
  description: Hosts whose collection failed (the index says why).
  returned: when step is bundle
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.diagnose.members import BadInput  # noqa: E402
from ansible.module_utils.diagnose.pack import build_bundle, prepare_output  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "step": {"type": "str", "required": True, "choices": ["prepare", "bundle"]},
            "output_dir": {"type": "path", "required": True},
            "run_id": {"type": "str", "required": True},
            "staging_dir": {"type": "path", "default": ""},
            "hosts": {"type": "list", "elements": "str", "default": []},
            "outcomes": {"type": "dict", "default": {}},
            "secrets": {"type": "list", "elements": "str", "default": [], "no_log": True},
            "max_host_bytes": {"type": "int", "default": 32 << 20},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        if p["step"] == "prepare":
            result = prepare_output(p["output_dir"], p["run_id"], check_mode=module.check_mode)
            module.exit_json(changed=bool(result["staging_dir"]), **result)
        if module.check_mode:
            module.exit_json(changed=False, bundle=None, msg="check mode: no bundle written")
        result = build_bundle(
            p["output_dir"],
            p["run_id"],
            p["staging_dir"],
            p["hosts"],
            p["outcomes"],
            p["secrets"],
            p["max_host_bytes"],
        )
    except BadInput as error:
        module.fail_json(msg=str(error))
    module.exit_json(changed=True, **result)


if __name__ == "__main__":
    main()
