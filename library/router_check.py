#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module router_check: the replicas' health before the router starts, the router's
own list of workers after it, and a replica taken out of that list around its restart."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: router_check
short_description: Checks a fleet's replicas, and that SGLang's router lists them healthy
description:
  - Runs on the router host. The logic is module_utils/router/probe.py.
  - With O(phase=replicas), asks each replica's C(/health) (with O(api_key)) once, within
    O(timeout) seconds, and returns those that answered 200 and those left out with why.
  - With O(phase=router), polls the router at O(url) (C(/readiness), then C(GET /workers)) until
    every replica in O(replicas) is listed and healthy, for up to O(timeout) seconds; then fails
    with the router's log tail (O(log_file)), the key scrubbed from it.
  - With O(phase=drain) (module_utils/router/rotation.py), takes O(replica_url) out of the
    router's list (C(DELETE /workers/{id})) and waits until the router no longer lists it and
    the replica holds no request, for up to O(timeout) seconds. A router that does not answer
    or does not list the replica is left alone (unchanged).
  - With O(phase=return), puts it back (C(POST /workers)) and waits until the router lists it
    healthy.
  - Phases replicas and router read only; drain and return change the router's list.
version_added: "0.1.0"
options:
  phase:
    description: C(replicas), C(router), C(drain) or C(return).
    type: str
    required: true
    choices: [replicas, router, drain, return]
  replica_url:
    description: The replica as the router lists it (O(phase=drain) and O(phase=return)).
    type: str
    default: ""
  replicas:
    description:
      - The fleet's replicas, each a dict with C(host) and C(url), and in a disaggregated fleet
        C(mode) (C(prefill) or C(decode)) and a prefill's C(bootstrap_port).
    type: list
    elements: dict
    default: []
  url:
    description: The router's URL, from the router host (every phase but replicas).
    type: str
    default: ""
  api_key:
    description: Bearer key for the replicas and the router (never logged).
    type: str
    default: ""
  timeout:
    description: Seconds per replica (O(phase=replicas)) or for the whole wait (the others).
    type: float
    default: 10.0
  log_file:
    description: The router's log, whose tail a failed wait shows.
    type: str
    default: ""
  log_lines:
    description: How many lines of it.
    type: int
    default: 40
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check each replica before the router starts
  router_check:
    phase: replicas
    replicas: [{host: gpu-a, url: "http://10.0.0.1:30000"}]
    api_key: "{{ router_api_key }}"
"""

RETURN = r"""
healthy:
  description: Replicas that answered /health with 200 (O(phase=replicas)).
  returned: success
  type: list
  elements: dict
left_out:
  description: Replicas that did not, each with C(reason) (O(phase=replicas)).
  returned: success
  type: list
  elements: dict
worker_args:
  description:
    - sglang-router's worker flags for the healthy replicas (O(phase=replicas)) -
      C(--worker-urls), or for a disaggregated fleet C(--pd-disaggregation) with
      C(--prefill URL BOOTSTRAP_PORT) and C(--decode URL) each.
  returned: success
  type: list
  elements: str
workers:
  description: The router's workers, each C(url) and C(healthy) (O(phase=router)).
  returned: success
  type: list
  elements: dict
seconds:
  description: How long the router took to list them, or the drain or return took.
  returned: success
  type: float
drained:
  description: Whether the replica was taken out of the router's list (O(phase=drain)).
  returned: success
  type: bool
in_flight:
  description: Requests the replica still held when the drain's deadline came (O(phase=drain)).
  returned: success
  type: int
reason:
  description: Why nothing was taken out (O(phase=drain)).
  returned: success
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.in_process import run_as_module  # noqa: E402
from ansible.module_utils.router.probe import SPEC, act  # noqa: E402


def main() -> None:
    run_as_module(AnsibleModule, SPEC, act)


if __name__ == "__main__":
    main()
