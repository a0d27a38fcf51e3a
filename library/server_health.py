#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module server_health: one poll of a loading SGLang server, for an until loop."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: server_health
short_description: Poll a starting SGLang server once, with a progress line and the log tail
description:
  - Meant for C(until) loops while the server loads its weights (minutes for 595 GB) and then
    warms up. SGLang 0.5.23 opens its HTTP port only once the model is loaded, then answers
    C(/health_generate) with 503 until its warmup request has generated, and afterwards runs a
    one-token generation for every C(/health_generate) (at least a second; 503 when no token
    came within its C(SGLANG_HEALTH_CHECK_TIMEOUT), 20 s by default).
  - O(phase=load) returns C(state=healthy) when C(GET /health_generate) answers 200;
    C(state=answering) when the server answers HTTP but has not generated (loaded, warming
    up, or unable to generate); C(state=loading) while nothing answers.
  - O(phase=generate) follows a server that answers, with C(healthy) on 200, C(answering) while it
    has not generated for less than O(generate_timeout) seconds since O(since), then
    C(failed) with a message saying the model loaded but cannot generate.
  - Either phase returns C(state=failed) at once when the server process is gone, its manager
    gave up, or it has crashed and been restarted since O(restarts_before) (a crash while
    loading is a problem to show, not to wait out).
  - C(progress) says how long it has waited and the last log line, for the kit's progress
    callback; C(log_tail) holds the last O(log_lines) lines of the server's log file (both
    managers write the server's output there, never to the journal, which would keep the API
    key SGLang logs), with secrets masked.
  - Read-only; supports check mode.
version_added: "0.1.0"
options:
  url:
    description: Base URL of the server as seen from the host, for example http://127.0.0.1:30000.
    type: str
    required: true
  api_key:
    description: API key, sent as a bearer token (SGLang lets health checks through without).
    type: str
    default: ""
  log_file:
    description: The server's log file (root-only), which the systemd unit and the supervisor write.
    type: path
  phase:
    description: C(load) (wait for the server to answer) or C(generate) (wait for it to generate).
    type: str
    choices: [load, generate]
    default: load
  since:
    description:
      - Epoch seconds when the wait began, for the elapsed time in C(progress).
      - With O(phase=generate), when the server was first seen answering (the C(checked_at) of
        the load phase's last poll).
    type: float
    default: 0
  timeout:
    description: The whole wait's limit in seconds, shown in C(progress).
    type: int
    default: 0
  generate_timeout:
    description:
      - With O(phase=generate), seconds an answering server may go without generating before
        the wait fails. SGLang itself gives up on its warmup after C(SGLANG_WARMUP_TIMEOUT)
        (600 s by default) and exits.
    type: int
    default: 600
  restarts_before:
    description: The manager's restart count when the server was (re)started by the kit.
    type: int
    default: 0
  log_lines:
    description: Lines of log to return.
    type: int
    default: 40
  wait_s:
    description:
      - Seconds to keep polling (every O(poll_s)) while the phase's waiting state holds
        (C(loading) for O(phase=load), C(answering) for O(phase=generate)); the last poll is
        returned as soon as the state changes, or when the window ends. One module run then
        stands for many retries of the C(until) loop. C(0) polls once. At most 600.
    type: float
    default: 0
  poll_s:
    description: Seconds between the polls of one O(wait_s) window.
    type: float
    default: 1
  command_timeout:
    description:
      - Seconds one poll's commands (C(systemctl show)) may take together; a
        command still running then is killed with its process group and the poll fails,
        naming it.
    type: float
    default: 60
extends_documentation_fragment:
  - kimi_server_manager
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Wait for the server to load
  server_health:
    url: http://127.0.0.1:30000
    manager: systemd
    since: "{{ wait_started }}"
    timeout: 2400
  register: loaded
  until: loaded.state != 'loading'
  retries: 240
  delay: 10

- name: Wait for /health_generate
  when: loaded.state in ['answering', 'healthy']
  server_health:
    url: http://127.0.0.1:30000
    manager: systemd
    phase: generate
    since: "{{ loaded.checked_at }}"
    generate_timeout: 600
  register: health
  until: health.state != 'answering'
  retries: 62
  delay: 10
"""

RETURN = r"""
state:
  description: C(healthy), C(answering), C(loading) or C(failed).
  returned: always
  type: str
progress:
  description: One line for people watching.
  returned: always
  type: str
message:
  description: Why the server failed (with RV(state=failed)).
  returned: always
  type: str
log_tail:
  description: Last lines of the server's log.
  returned: always
  type: list
  elements: str
elapsed:
  description: Seconds since O(since).
  returned: always
  type: float
checked_at:
  description: Epoch seconds of this poll.
  returned: always
  type: float
http_status:
  description: The status C(/health_generate) answered, or null when nothing answered.
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.helpers import CommandFailed, module_runner  # noqa: E402
from ansible.module_utils.server.health import wait  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "manager": {"type": "str", "choices": ["systemd", "supervisor"], "required": True},
            "name": {"type": "str", "default": "kimi-sglang"},
            "pid_file": {"type": "path"},
            "state_file": {"type": "path"},
            "log_file": {"type": "path"},
            "phase": {"type": "str", "choices": ["load", "generate"], "default": "load"},
            "since": {"type": "float", "default": 0},
            "timeout": {"type": "int", "default": 0},
            "generate_timeout": {"type": "int", "default": 600},
            "restarts_before": {"type": "int", "default": 0},
            "log_lines": {"type": "int", "default": 40},
            "wait_s": {"type": "float", "default": 0},
            "poll_s": {"type": "float", "default": 1},
            "command_timeout": {"type": "float", "default": 60},
        },
        supports_check_mode=True,
    )
    if not 0 <= module.params["wait_s"] <= 600 or not 0 < module.params["poll_s"] <= 600:
        module.fail_json(
            msg=f"server_health: wait_s is {module.params['wait_s']:g} and poll_s "
            f"{module.params['poll_s']:g}; needed: wait_s from 0 to 600 and poll_s above 0 "
            "up to 600 seconds."
        )
    # One poll's commands (systemctl show): a hung one fails this poll, naming it,
    # rather than the task's timeout killing the module and leaving the command behind.
    run = module_runner(module, "server_health", "one poll's commands", 60, "command_timeout")
    try:
        result = wait(module.params, run)
    except CommandFailed as error:
        module.fail_json(msg=str(error))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
