"""The tests' ansible-playbook freezes its objects before each task worker forks
(tests/support/worker_gc.py): a worker then finds them frozen, where it finds none without
it, and the playbook does and says the same either way."""

from __future__ import annotations

import re

from tests.support import worker_gc
from tests.support.ansible_run import assert_start_patched_once, run_switch_probe

# Runs in the task's worker (a lookup does): how many objects its parent froze before the fork.
PROBE = """
import gc

from ansible.plugins.lookup import LookupBase


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        return [gc.get_freeze_count()]
"""

PLAYBOOK = """
- name: Worker probe
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Count in a loop
      ansible.builtin.set_fact:
        counted: "{{ (counted | default([])) + [item * 2] }}"
      loop: [1, 2, 3]
    - name: Say what the worker found
      ansible.builtin.debug:
        msg: "frozen={{ lookup('kimi_gc_probe') }} counted={{ counted | join(',') }}"
"""


def run(tmp_path, on: bool):
    # Every other cache in both runs: only the freeze differs.
    said = run_switch_probe(
        tmp_path,
        "KIT_TEST_WORKER_GC",
        on,
        {"lookup_plugins/kimi_gc_probe.py": PROBE, "probe.yml": PLAYBOOK},
    )
    found = re.search(r"frozen=(\d+) counted=([\d,]+)", said)
    assert found, said[-3000:]
    return int(found.group(1)), found.group(2), said


def test_a_worker_finds_its_parents_objects_frozen_and_the_run_says_the_same(tmp_path):
    frozen_on, counted_on, said_on = run(tmp_path, on=True)
    frozen_off, counted_off, said_off = run(tmp_path, on=False)
    assert frozen_off == 0
    # ansible-playbook's own objects: the plugins, the inventory, the parsed playbook.
    assert frozen_on > 10_000, frozen_on
    assert counted_on == counted_off == "2,4,6"
    assert re.sub(r"frozen=\d+", "", said_on) == re.sub(r"frozen=\d+", "", said_off)


def test_patching_twice_wraps_start_once():
    assert_start_patched_once(worker_gc.patch)
