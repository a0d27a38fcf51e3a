#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module server_inspect: what the server stage reads from a host before a launch."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: server_inspect
short_description: Read what a host has for an SGLang server launch, in one module run
description:
  - Reads, without changing anything, what the server stage decides a launch on. The logic is
    module_utils/server/inspect.py.
  - The manager that runs the server, O(manager) itself or, with C(auto), C(systemd) where
    systemd is PID 1 (O(systemd_dir) is a folder) and the kit's supervisor elsewhere.
  - With O(check_systemd_version), systemd's version from C(systemctl --version) where the
    manager is systemd; the unit needs 240 or newer (C(StandardOutput=append:)).
  - With O(python), whether the launch's Python exists and the runtime folder the launch runs
    from (the version folder the link C(<runtime>/bin/python) sits under points at).
  - With O(launch_record), the runtime version folder the previous launch ran from (the server
    stage's C(launch.json), bounded), for the rollback.
  - With O(launch), where the launch's Python exists, the launch argv checked by that runtime's
    own parser, as C(launch_check) checks it (module_utils/server/launch_check.py), in the
    same module run, giving C(ok), C(mode), C(version), C(errors) and C(flags), or a failure
    naming the flag the runtime would refuse, before anything of the running server changes.
  - Fails, saying what was found, what is needed and how to fix it, when systemd is asked for
    where it does not run, when the launch's Python is missing (not in check mode), or when
    systemd is too old.
version_added: "0.1.0"
options:
  manager:
    description: What keeps the server running (the role's C(server_manager)).
    type: str
    choices: [auto, systemd, supervisor]
    default: auto
  host:
    description: The host, as messages name it.
    type: str
    default: this host
  systemd_dir:
    description: The folder that exists where systemd is PID 1.
    type: path
    default: /run/systemd/system
  check_systemd_version:
    description: Read systemd's version where the manager is systemd.
    type: bool
    default: false
  log_file:
    description: The server's log file, as the message about an old systemd names it.
    type: str
    default: ""
  python:
    description: The launch's Python (its argv[0]).
    type: path
  config:
    description: The serving config, as the message about a missing Python names it.
    type: str
    default: ""
  config_base:
    description: The config it belongs to (C(ddtree) for C(ddtree-b32)), for the fix.
    type: str
    default: ""
  runtime:
    description: The runtime the config runs on, for the same message.
    type: str
    default: ""
  launch_record:
    description: The previous launch's record (C(launch.json)).
    type: path
  versions_dir:
    description: The folder of the runtime versions (with O(launch_record)).
    type: path
  kind:
    description: The runtime kind of the launch.
    type: str
    choices: [release, git]
    default: release
  timeout:
    description: Seconds C(systemctl --version) may take; at the deadline it is killed.
    type: float
    default: 60
  launch:
    description:
      - The launch to check with the runtime's parser (C(launch_check)'s options C(argv),
        C(secrets_file), C(name) and C(timeout), the probe's seconds).
    type: dict
    suboptions:
      argv:
        description: The launch command, as C(launch_check)'s C(argv).
        type: list
        elements: str
        required: true
      secrets_file:
        description: As C(launch_check)'s (the kit's C(--config) file, not checked).
        type: str
        default: ""
      name:
        description: As C(launch_check)'s (the config its messages name).
        type: str
        default: ""
      timeout:
        description: As C(launch_check)'s (the probe's seconds).
        type: int
        default: 300
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Look at what the host has for this launch
  server_inspect:
    manager: auto
    host: "{{ inventory_hostname }}"
    check_systemd_version: true
    python: /opt/kimi/venv/bin/python
    config: dflash
    config_base: dflash
    runtime: sglang==0.5.23
    launch_record: /var/lib/kimi/server/launch.json
    versions_dir: /opt/kimi/runtimes
  register: inspected
"""

RETURN = r"""
manager:
  description: C(systemd) or C(supervisor).
  returned: always
  type: str
systemd:
  description: Whether systemd runs the host.
  returned: always
  type: bool
systemd_version:
  description: systemd's version (null when C(systemctl --version) does not say it).
  returned: with O(check_systemd_version), where the manager is systemd
  type: int
python_exists:
  description: Whether O(python) exists.
  returned: with O(python)
  type: bool
runtime_dir:
  description: The runtime folder the launch runs from.
  returned: with O(python)
  type: str
previous_runtime:
  description: >-
    The previous launch's runtime version folder (C(runtime_dir), C(name), C(built)); nulls
    and false when there is none or the record is unreadable.
  returned: with O(launch_record)
  type: dict
problems:
  description: What stops the launch (empty on success).
  returned: always
  type: list
  elements: str
ok:
  description: The runtime's parser accepts the launch.
  returned: with O(launch), where the launch's Python exists
  type: bool
mode:
  description: How far the probe parsed (C(prepare_server_args) or C(add_cli_args)).
  returned: with O(launch), where the launch's Python exists
  type: str
version:
  description: The runtime's sglang version.
  returned: with O(launch), where the launch's Python exists
  type: str
errors:
  description: What the runtime would refuse.
  returned: with O(launch), where the launch's Python exists
  type: list
  elements: str
flags:
  description: The flags the errors are about.
  returned: with O(launch), where the launch's Python exists
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.helpers import CommandFailed, DeadlineRunner  # noqa: E402
from ansible.module_utils.server.inspect import MANAGERS, inspect  # noqa: E402
from ansible.module_utils.server.launch_check import (  # noqa: E402
    LAUNCH_SPEC,
    LaunchRefused,
    check_launch,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "manager": {"type": "str", "choices": list(MANAGERS), "default": "auto"},
            "host": {"type": "str", "default": "this host"},
            "systemd_dir": {"type": "path", "default": "/run/systemd/system"},
            "check_systemd_version": {"type": "bool", "default": False},
            "log_file": {"type": "str", "default": ""},
            "python": {"type": "path"},
            "config": {"type": "str", "default": ""},
            "config_base": {"type": "str", "default": ""},
            "runtime": {"type": "str", "default": ""},
            "launch_record": {"type": "path"},
            "versions_dir": {"type": "path"},
            "kind": {"type": "str", "choices": ["release", "git"], "default": "release"},
            "timeout": {"type": "float", "default": 60},
            "launch": {"type": "dict", "options": LAUNCH_SPEC},
        },
        required_by={"launch_record": "versions_dir", "launch": "python"},
        supports_check_mode=True,
    )
    if not 0 < module.params["timeout"] <= 3600:
        module.fail_json(msg="server_inspect: timeout must be seconds from above 0 to 3600.")
    timeout = module.params["timeout"]
    run = DeadlineRunner(timeout, f"server_inspect's timeout={timeout:g}s")
    try:
        result = inspect(module.params, run, module.check_mode)
    except CommandFailed as error:
        module.fail_json(msg=f"server_inspect on {module.params['host']}: {error}")
    if result["problems"]:
        module.fail_json(msg=" ".join(result["problems"]), **result)
    launch = module.params["launch"]
    if launch and result.get("python_exists"):
        try:
            result.update(
                check_launch(
                    module.params["python"],
                    launch["argv"],
                    launch["secrets_file"],
                    launch["name"],
                    launch["timeout"],
                )
            )
        except LaunchRefused as refused:
            module.fail_json(msg=str(refused), **result, **refused.facts)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
