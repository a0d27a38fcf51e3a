#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module autotune_step: one step of autotune's bounded search."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: autotune_step
short_description: One step of autotune's search for the best goodput under an SLO
description:
  - Runs on the controller (its action plugin runs it inside ansible-playbook's worker); the
    search's state is a JSON file of the run's results, so that each step picks up where the
    last left off (module_utils/autotune/).
  - C(start) checks the search space against the pinned runtime's parser and the SLO, orders
    the candidates (a warm start first, then the speed model's figure, highest first) and
    writes the state. C(next) gives the next trial, or says the search is done - converged
    (the last rung ran), budget (the next trial would not end within the budget) or exhausted
    (every candidate failed or was pruned).
  - C(record) scores a trial's level files on the controller (goodput per band under the SLO,
    with a 95% interval) and takes its outcome; a failed trial fails its candidate and prunes
    every untried candidate that asks at least as much memory (equal on every other knob).
  - C(finish) writes the answer into the inventory - host_vars/<host>/autotune.yml, the deploy's
    variables set to the pick of the deploy band, every band's pick, runner-up and margin under
    kimi_autotune.
options:
  action:
    description: The step (start, next, record, finish).
    type: str
    required: true
    choices: [start, next, record, finish]
  state_file:
    description: The search's state, a JSON file on the controller.
    type: path
    required: true
  space:
    description:
      - The search space (start) - knob to a list of values or a range C({min, max, step}). A
        knob is C(config), an SGLang flag as the launch spells it (checked with its values
        against O(contract)), or an NCCL environment variable.
    type: dict
  slo:
    description: The SLO as the report's --slo (start), e.g. ttft_ms_p99=2000,tpot_ms_p99=50.
    type: str
  bands:
    description: The concurrency of each band the search measures (start).
    type: list
    elements: int
  budget_minutes:
    description: The search's time budget (start); no trial starts that would end past it.
    type: float
  rungs:
    description: Requests per concurrency of each rung's runs (start); a third go on per rung.
    type: list
    elements: int
    default: [1, 3, 9]
  configs:
    description: The serving configs and launches the config knob may name (start).
    type: list
    elements: str
    default: []
  base_config:
    description: The config of a candidate without a config knob (start).
    type: str
  contract:
    description: The pinned release's parser snapshot (start, next, finish).
    type: path
  contract_overlay:
    description: The git runtime's overlay on it, when the space names its configs.
    type: path
  plan_file:
    description:
      - The host's plan.json from plan.yml (start) - its speed model's tokens/s per launch and
        band rank the candidates; those it does not predict go last. Missing, the space's order.
    type: path
  warm:
    description: The last answer (kimi_autotune), whose pick is tried first (start).
    type: dict
    default: {}
  trial_id:
    description: The trial the outcome is of (record).
    type: str
  trial_dir:
    description: The trial's results on the controller, one folder per prompt set (record).
    type: path
  trial_status:
    description: Whether the trial's server started and its benchmark ran (record).
    type: str
    choices: [ok, failed]
  trial_error:
    description: Why the trial failed (record).
    type: str
    default: ""
  inventory_dir:
    description: The inventory folder the host came from (finish).
    type: path
  host:
    description: The inventory host (finish).
    type: str
  deploy_band:
    description: The band whose pick the deploy's variables take (finish).
    type: int
  context:
    description: What the answer file records of the run (finish) - run id, SLO, workload.
    type: dict
    default: {}
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Ask for the next trial
  autotune_step:
    action: next
    state_file: results/20261206T000000Z/ct200-node-01/autotune/search.json
    contract: tests/contract/sglang-0.5.23-args.json
  register: step
"""

RETURN = r"""
candidates:
  description: The candidates of the space (start).
  returned: start
  type: int
predicted:
  description: How many of them the speed model ranked (start).
  returned: start
  type: int
first:
  description: The candidate the search tries first (start).
  returned: start
  type: str
trial_bound:
  description: >-
    The most steps C(next) can take (start) - every trial the schedule allows, plus the one
    that ends the search.
  returned: start
  type: int
done:
  description: Whether the search is over (next).
  returned: next
  type: bool
stop:
  description: Why it ended - converged, budget or exhausted (next, when done).
  returned: next
  type: str
trial:
  description: >-
    The trial - id, key, knobs, rung, requests_per_concurrency and launch (config, settings,
    extra_args, environment) on next; with its status, seconds and scores on record.
  returned: next, record
  type: dict
path:
  description: The answer file (finish).
  returned: finish
  type: str
answer:
  description: Each band's pick, runner-up and margin, and the search's figures (finish).
  returned: finish
  type: dict
document:
  description: The variables the answer file sets (finish).
  returned: finish
  type: dict
"""

from ansible.module_utils.autotune.step_task import RULES, SPEC, act  # noqa: E402
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.in_process import run_as_module  # noqa: E402


def main() -> None:
    run_as_module(AnsibleModule, SPEC, act, **RULES)


if __name__ == "__main__":
    main()
