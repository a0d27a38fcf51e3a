#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module server_api_check: the OpenAI-compatible API of a healthy server, checked."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: server_api_check
short_description: Check the OpenAI-compatible endpoints users call, and record the outcome
description:
  - Run once the server is healthy. Checks C(GET /v1/models) (the served model's name),
    C(POST /v1/chat/completions) non-streamed and streamed, a request with C(tools) and a forced
    C(tool_choice) (a parsed tool call comes back) and a request that reasons (the reasoning in
    C(reasoning_content), not in the content). What the server must do comes from its launch
    argv (C(--served-model-name), else C(--model-path); C(--tool-call-parser);
    C(--reasoning-parser)); a check whose parser the launch lacks is not run (passed null).
  - Writes the record to O(dest) (mode 0644; the API key never in it) and returns it. Does not
    fail on a failed check, the caller decides (the server role fails with RV(failures) when
    C(kimi_server_api_check_fatal) is true).
  - Changed when the recorded outcome differs from the one already at O(dest) (times aside).
  - The logic is in module_utils/server/api_check.py.
version_added: "0.1.0"
options:
  url:
    description: Base URL of the server as seen from the host, for example http://127.0.0.1:30000.
    type: str
    required: true
  api_key:
    description: API key, sent as a bearer token; never logged or recorded.
    type: str
    default: ""
  argv:
    description: The server's launch command (the masked one the role shows is enough).
    type: list
    elements: str
    required: true
  config:
    description: The serving config's name, recorded.
    type: str
    default: ""
  chat_template_kwargs:
    description:
      - Sent with the two chat checks (the model's switch that turns thinking off, so a short
        answer comes within their token budget); not with the reasoning check.
    type: dict
    default: {}
  timeout:
    description: Seconds one request may take, streams included.
    type: float
    default: 120
  dest:
    description: Where the record is written (api-check.json beside the launch record).
    type: path
    required: true
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check the OpenAI-compatible API
  server_api_check:
    url: http://127.0.0.1:30000
    argv: "{{ launch.argv }}"
    config: dflash
    dest: /var/lib/kimi/server/api-check.json
  register: api_check
"""

RETURN = r"""
record:
  description: What api-check.json holds (kind kimi.api_check, schema_version 1, checks).
  returned: always
  type: dict
passed:
  description: False when any check failed (a check not run does not fail).
  returned: always
  type: bool
failures:
  description: One line per failed check, with what was found, expected and the fix.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.helpers import read_json, write_json_atomic  # noqa: E402
from ansible.module_utils.server.api_check import failures, outcome_of, run_checks  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "argv": {"type": "list", "elements": "str", "required": True},
            "config": {"type": "str", "default": ""},
            "chat_template_kwargs": {"type": "dict", "default": {}},
            "timeout": {"type": "float", "default": 120},
            "dest": {"type": "path", "required": True},
        },
    )
    p = module.params
    if p["timeout"] <= 0:
        module.fail_json(msg=f"timeout must be positive, got {p['timeout']}")
    try:
        record = run_checks(
            p["url"],
            p["argv"],
            config=p["config"],
            api_key=p["api_key"],
            timeout=p["timeout"],
            chat_template_kwargs=p["chat_template_kwargs"],
        )
    except ValueError as error:
        module.fail_json(msg=str(error))
    changed = outcome_of(read_json(p["dest"])) != outcome_of(record)
    try:
        write_json_atomic(p["dest"], record, 0o644)
    except OSError as error:
        module.fail_json(msg=f"cannot write {p['dest']}: {error}")
    module.exit_json(
        changed=changed, record=record, passed=record["passed"], failures=failures(record)
    )


if __name__ == "__main__":
    main()
