#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module venv_pins: whether a Python can make venvs, and a venv already holds pins."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: venv_pins
short_description: Check that a Python can create venvs and whether a venv holds every pin
description:
  - Runs O(python) to check that it has C(venv) and C(ensurepip), and returns its version.
  - Reads O(venv) (its C(pyvenv.cfg) and the C(METADATA) of each installed distribution, never
    running it) and says whether it already holds every C(name==version) pin of
    O(requirements), made by a Python of the same major.minor as O(python). A pin missing or
    different, another Python's venv, a requirement that is not a plain pin, or anything
    unreadable gives RV(satisfied=false) with the reason, and pip decides.
  - The logic is module_utils/host/venv_pins.py. Changes nothing; runs in check mode.
version_added: "0.1.0"
options:
  python:
    description: The Python that creates the venv.
    type: path
    required: true
  venv:
    description: The venv to read.
    type: path
    required: true
  requirements:
    description: The requirements file's text.
    type: str
    default: ""
  timeout:
    description: Seconds O(python) may take to answer.
    type: float
    default: 60
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check the host's Python and the tools venv
  venv_pins:
    python: /usr/bin/python3
    venv: /opt/kimi/tools-venv
    requirements: "{{ lookup('ansible.builtin.file', 'requirements-host.txt') }}"
  register: tools_venv
"""

RETURN = r"""
can_create:
  description: Whether O(python) imports C(venv) and C(ensurepip).
  returned: always
  type: bool
error:
  description: Why O(python) cannot create a venv, when it cannot.
  returned: always
  type: str
python_version:
  description: O(python)'s major.minor, when it answered.
  returned: always
  type: str
satisfied:
  description: Whether O(venv) already holds every pin of O(requirements).
  returned: always
  type: bool
why:
  description: Why the venv is not satisfied (empty when it is).
  returned: always
  type: str
"""

import json  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.helpers import (  # noqa: E402
    CommandFailed,
    command_environment,
    run_with_deadline,
)
from ansible.module_utils.host.venv_pins import satisfied  # noqa: E402

PROBE = "import ensurepip, json, sys, venv; print(json.dumps('%d.%d' % sys.version_info[:2]))"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "python": {"type": "path", "required": True},
            "venv": {"type": "path", "required": True},
            "requirements": {"type": "str", "default": ""},
            "timeout": {"type": "float", "default": 60},
        },
        supports_check_mode=True,
    )
    if not 0 < module.params["timeout"] <= 3600:
        module.fail_json(msg="venv_pins: timeout must be seconds from above 0 to 3600.")
    result = {"changed": False, "can_create": False, "error": "", "python_version": ""}
    try:
        rc, out, err = run_with_deadline(
            [module.params["python"], "-c", PROBE],
            module.params["timeout"],
            env=command_environment(),
            max_output_bytes=1 << 16,
            what="venv_pins' timeout",
            shown=f"{module.params['python']} -c 'import venv, ensurepip'",
        )
    except CommandFailed as error:
        rc, out, err = 1, "", str(error)
    version = ""
    if rc == 0:
        try:
            version = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            version = ""
    if rc == 0 and isinstance(version, str) and version:
        result.update(can_create=True, python_version=version)
        ok, why = satisfied(module.params["venv"], version, module.params["requirements"])
    else:
        result["error"] = (err or out).strip()[-2000:] or f"exit code {rc}"
        ok, why = False, "the Python cannot create a venv"
    module.exit_json(satisfied=ok, why=why, **result)


if __name__ == "__main__":
    main()
