#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module canary_serve: each serving config's launch run on tiny checkpoints, checked,
stopped and recorded."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: canary_serve
short_description: Run a serving config's SGLang launch on a tiny checkpoint, check it, record it
description:
  - The logic is in module_utils/canary/serve.py (the actions in serve_actions.py); its
    docstring says what the canary proves and what it cannot (kernels and flags, not the real
    weights' numerics).
  - O(action=plan) works out each config's identity (argv, environment with secret values
    masked, the runtime folder the python link points at, the checkpoints' digests the argv
    names, the GPUs' UUIDs and driver from nvidia-smi) and which configs must run (not one whose
    last record passed with the same identity, unless O(rerun)); it also says whether the kit's
    server runs (it holds the GPUs). Read-only.
  - O(action=run) runs one config, O(config), within O(timeout) seconds for everything (the
    launch in a session of its own with its output in a root-only log under O(log_dir); the port
    and C(/health_generate) 200, one C(POST /generate) (8 tokens, greedy) and one chat
    completion; then the whole process group stopped, SIGTERM, SIGKILL after O(grace)). A failure
    is classified from the log's first error line (SGLang's own texts, cited in the data table)
    and gets a hint. With O(skip_reason) nothing runs and the config is recorded skipped.
    Changed when it ran. Never fails for a failed canary; the role decides.
  - O(action=record) writes the run's record to O(record) (0644; no secret in it) when its
    content changed (times aside), and returns it with a summary per host.
  - The API key and the HF token (O(secrets)) and O(secret_environment)'s values are masked out
    of everything returned or recorded.
version_added: "0.1.0"
options:
  action:
    description: plan, run or record.
    type: str
    choices: [plan, run, record]
    required: true
  record:
    description: The host's canary.json (read by plan, written by record).
    type: path
    required: true
  configs:
    description: With plan, the configs' launches (C(name), C(argv), C(environment)).
    type: list
    elements: dict
    default: []
  checkpoints:
    description: >-
      Tiny checkpoints by kind (target, dflash, eagle3), each C(path), C(bytes), C(seconds),
      C(digest).
    type: dict
    default: {}
  rerun:
    description: With plan, run every config, even one that passed with the same identity.
    type: bool
    default: false
  server:
    description:
      - With plan, how to find the kit's server - C(manager) (systemd or supervisor), C(name)
        (the unit), C(pid_file) and C(state_file) (the supervisor's).
    type: dict
    default: {}
  config:
    description: With run, the config's launch (C(name), C(argv), C(environment)).
    type: dict
  secret_environment:
    description: With run, environment entries whose values are secrets (never returned).
    type: dict
    default: {}
  identity:
    description: With run, the config's identity from plan.
    type: str
  log_dir:
    description: With run, the root-only folder of the logs (C(<config>.log)).
    type: path
  host:
    description: With run, the address the canary listens on (loopback).
    type: str
    default: 127.0.0.1
  port:
    description: With run, the canary's port.
    type: int
    default: 30100
  timeout:
    description: With run, seconds for the start and the requests together (at most 3600).
    type: float
    default: 900
  grace:
    description: With run, seconds between SIGTERM and SIGKILL of the process group.
    type: float
    default: 10
  chat_template_kwargs:
    description: With run, sent with the chat request (the model's thinking-off switch).
    type: dict
    default: {}
  secrets:
    description: Values masked out of everything recorded (the API key, the HF token).
    type: list
    elements: str
    default: []
  capabilities:
    description: >-
      With run, kimi_attention_backend_compute_capabilities (backend to compute
      capabilities), for hints.
    type: dict
    default: {}
  backends:
    description: With run, the launch's attention backends by role (target, draft, tree), for hints.
    type: dict
    default: {}
  compute_capability:
    description: With run, the GPUs' compute capability (plan's), for hints.
    type: str
    default: ""
  skip_reason:
    description: With run, record the config skipped for this reason instead of running it.
    type: str
    default: ""
  names:
    description: With record, the configs of this run in order.
    type: list
    elements: str
    default: []
  results:
    description: With record, this run's entries by config (those not run keep their recorded one).
    type: dict
    default: {}
  facts:
    description: With record, C(host), C(profile), C(model), C(compute_capability), C(started_at).
    type: dict
    default: {}
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Work out which canaries must run
  canary_serve:
    action: plan
    record: /opt/kimi/canary/canary.json
    configs: "{{ rendered.configs }}"
    checkpoints: "{{ checkpoints }}"
  register: canary_plan

- name: Run the canary of ar
  canary_serve:
    action: run
    record: /opt/kimi/canary/canary.json
    config: "{{ rendered.configs[0] }}"
    identity: "{{ canary_plan.identities.ar }}"
    log_dir: /opt/kimi/canary/logs
    timeout: 900
"""

RETURN = r"""
identities:
  description: With plan, each config's identity (sha256 hex).
  returned: plan
  type: dict
to_run:
  description: With plan, the configs that must run.
  returned: plan
  type: list
  elements: str
gpus:
  description: With plan, C(count), C(driver), C(compute_capability) of the host's GPUs.
  returned: plan
  type: dict
server_active:
  description: With plan, whether the kit's server runs (it holds the GPUs).
  returned: plan
  type: bool
entry:
  description: >-
    With run, the config's record entry (state, seconds_to_ready, first_error, failure,
    hint, ...).
  returned: run
  type: dict
name:
  description: With run, the config's name.
  returned: run
  type: str
canary:
  description: With record, the record as written (or as it stood, unchanged).
  returned: record
  type: dict
summary:
  description: >-
    With record, passed and total, each failure with its hint and log, each skip with its
    reason.
  returned: record
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.canary.serve_actions import act  # noqa: E402
from ansible.module_utils.canary.serve_inputs import CanaryError  # noqa: E402
from ansible.module_utils.host.helpers import CommandFailed  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "action": {"type": "str", "choices": ["plan", "run", "record"], "required": True},
            "record": {"type": "path", "required": True},
            "configs": {"type": "list", "elements": "dict", "default": []},
            "checkpoints": {"type": "dict", "default": {}},
            "rerun": {"type": "bool", "default": False},
            "server": {"type": "dict", "default": {}},
            "config": {"type": "dict"},
            "secret_environment": {"type": "dict", "default": {}, "no_log": True},
            "identity": {"type": "str"},
            "log_dir": {"type": "path"},
            "host": {"type": "str", "default": "127.0.0.1"},
            "port": {"type": "int", "default": 30100},
            "timeout": {"type": "float", "default": 900},
            "grace": {"type": "float", "default": 10},
            "chat_template_kwargs": {"type": "dict", "default": {}},
            "secrets": {"type": "list", "elements": "str", "default": [], "no_log": True},
            "capabilities": {"type": "dict", "default": {}},
            "backends": {"type": "dict", "default": {}},
            "compute_capability": {"type": "str", "default": ""},
            "skip_reason": {"type": "str", "default": ""},
            "names": {"type": "list", "elements": "str", "default": []},
            "results": {"type": "dict", "default": {}},
            "facts": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    try:
        result = act(module.params, module.check_mode)
    except (CanaryError, CommandFailed, RuntimeError) as error:
        module.fail_json(msg=str(error))
    except OSError as error:
        module.fail_json(msg=f"canary_serve ({module.params['action']}): {error}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
