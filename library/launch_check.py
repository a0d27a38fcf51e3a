#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module launch_check: would the installed SGLang accept this launch command?"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: launch_check
short_description: Check a server launch command with the installed runtime's own parser
description:
  - Runs a probe in the runtime's Python (O(python)) that parses the launch arguments with that
    sglang's own parser (in sglang.srt.server_args, prepare_server_args where building the record
    reads no model, as in 0.5.23; add_cli_args and its argparse parser otherwise, as on DDTree's
    pull request). No model is loaded and no GPU is touched.
  - Then applies the config-free launch rules the kit mirrors (module_utils/plan/sglang_args.py) to
    the values that parser produced, and asks the runtime whether it knows the speculative
    algorithm (module_utils/server/launch_check.py says which checks need the model and are left to
    the server).
  - Fails naming the flag when the runtime would refuse the command, so that the server role
    stops before it touches the running server.
  - Read-only; supports check mode.
version_added: "0.1.0"
options:
  python:
    description: Python of the runtime the server runs on.
    type: path
    required: true
  argv:
    description: The launch command, C(python -m sglang.launch_server ...) or its arguments.
    type: list
    elements: str
    required: true
  secrets_file:
    description: The kit's C(--config) file (API key only), left out of the check.
    type: str
    default: ""
  name:
    description: The serving config, for messages.
    type: str
    default: ""
  timeout:
    description: >-
      Seconds the probe may take (importing sglang pulls in torch). The probe stops itself
      then (SIGALRM) and reports it; a runtime hung where the alarm cannot reach it (in C
      code, or in a child it started) is killed with its whole process group a grace period
      later (a tenth of the timeout plus a second, at most 15 s), and the module fails naming
      the command. Keep both below the task's C(timeout) keyword, which kills only the module.
    type: int
    default: 300
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check the launch with the runtime's own parser
  launch_check:
    python: /opt/kimi/venv/bin/python
    argv: "{{ launch.argv }}"
    secrets_file: /etc/kimi/sglang-secrets.yaml
    name: dflash
"""

RETURN = r"""
ok:
  description: Whether the runtime would accept the command.
  returned: always
  type: bool
mode:
  description: How far the runtime's own code went (prepare_server_args or add_cli_args).
  returned: when the runtime's parser ran
  type: str
version:
  description: The runtime's sglang version.
  returned: when the runtime's parser ran
  type: str
errors:
  description: One line per reason, each naming its flag.
  returned: always
  type: list
  elements: str
flags:
  description: The flags the errors are about.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.server.launch_check import (  # noqa: E402
    LAUNCH_SPEC,
    LaunchRefused,
    check_launch,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={"python": {"type": "path", "required": True}, **LAUNCH_SPEC},
        supports_check_mode=True,
    )
    p = module.params
    try:
        facts = check_launch(p["python"], p["argv"], p["secrets_file"], p["name"], p["timeout"])
    except LaunchRefused as refused:
        module.fail_json(msg=str(refused), **refused.facts)
    module.exit_json(changed=False, **facts)


if __name__ == "__main__":
    main()
