#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module serving_render: serving configs to launch argv, environment and runtime."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: serving_render
short_description: Render SGLang serving configs into launch commands for one host
description:
  - Pure computation (module_utils/plan/serving.py), shared by the server role and plan.yml.
  - DDTree budgets expand into one config each (C(ddtree-b16), ...); a definition with a
    C(tp) list expands over those tensor parallel sizes too (C(ar-tp4), C(ddtree-tp4-b16)),
    each server launched with its own C(--tp-size). A name in C(selected) may also be one
    expanded name, which renders that server alone.
  - The settings' C(model_args) (the model's launch_args) follow the kit's own model flags in
    every argv.
  - C(configs) has secrets masked (the API key in argv, tokens and keys in the environment);
    C(reveal=true) adds C(configs_unmasked) for the task that writes the server's files,
    which must run with C(no_log).
  - Fails with a clear message for an unknown config, a server beyond loopback without an API
    key, a git runtime without url and ref, or multi-node settings without dist_init_addr.
  - With C(add_controls), configs marked C(control_for) a selected base come along
    (C(dflash-tree-backend) whenever C(ddtree) is selected).
  - With C(contracts), each config carries C(validation) (C(ok), C(errors), C(contract)), its
    argv checked against its runtime's contract (the pinned release's parser snapshot; for the
    git runtime the snapshot plus the pull request's overlay, when made for the configured
    ref). C(ok) is null when no contract applies (C(note) says why). It never fails on them.
version_added: "0.1.0"
options:
  definitions:
    description: kimi_serving_config_definitions.
    type: dict
    required: true
  selected:
    description: Names of the configs to render (kimi_serving_configs).
    type: list
    elements: str
    required: true
  settings:
    description: Host settings (see module_utils/plan/serving.py render()); no secrets here.
    type: dict
    required: true
  api_key:
    description: The server's API key, needed when it listens beyond loopback.
    type: str
    default: ""
  reveal:
    description: Also return the configs with secrets in place.
    type: bool
    default: false
  add_controls:
    description: Also render the control configs of the selected ones (C(control_for)).
    type: bool
    default: false
  contracts:
    description:
      - Contract files on the machine the module runs on, to validate each argv against.
      - C(release.snapshot); C(git.snapshot) and C(git.overlay).
    type: dict
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Render the serving configs
  serving_render:
    definitions: "{{ kimi_serving_config_definitions }}"
    selected: "{{ kimi_serving_configs }}"
    settings: "{{ server_settings }}"
  register: rendered
"""

RETURN = r"""
configs:
  description: Per config name, argv, environment, runtime and tp_size with secrets masked.
  returned: always
  type: list
  elements: dict
selected:
  description: The base configs rendered, in order (controls included with add_controls).
  returned: always
  type: list
  elements: str
configs_unmasked:
  description: The same with secrets in place (only with reveal).
  returned: when reveal
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.in_process import run_as_module  # noqa: E402
from ansible.module_utils.plan.serving_render_task import SPEC, act  # noqa: E402


def main() -> None:
    run_as_module(AnsibleModule, SPEC, act)


if __name__ == "__main__":
    main()
