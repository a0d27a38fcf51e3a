"""The tests' ansible-playbook runs the tasks that never reach a host in its own process
(tests/support/inline_tasks.py): they template there instead of in a forked worker, and a
playbook reports the same, task by task and host by host, with it or without."""

from __future__ import annotations

import itertools
import json
import shutil
import sys
import types

from tests.support import inline_tasks
from tests.support.ansible_run import REPO, assert_start_patched_once, run_switch_probe

INVENTORY = f"""
h1 ansible_connection=local ansible_python_interpreter={sys.executable}
h2 ansible_connection=local ansible_python_interpreter={sys.executable}
"""

# Every kind of task the switch runs in place, with what the strategy does with their results
# (facts, registers, rescues, ignored errors, includes, a role's argument check), beside tasks
# that still fork (a module whose condition holds, a loop) and conditions that fail.
PLAYBOOK = """
- name: Inline probe
  hosts: all
  gather_facts: false
  vars:
    limit: 3
  tasks:
    - name: Set a fact from the host's name
      ansible.builtin.set_fact:
        doubled: "{{ inventory_hostname * 2 }}"
        cacheable: true
    - name: Show it
      ansible.builtin.debug:
        var: doubled
    - name: Write it on the controller
      controller_files:
        files:
          - path: "{{ record_dir }}/{{ inventory_hostname }}"
            state: directory
            mode: "0755"
          - path: "{{ record_dir }}/{{ inventory_hostname }}/doubled.txt"
            mode: "0644"
            content: "{{ doubled }}"
    - name: Check it
      ansible.builtin.assert:
        that: [doubled | length == 4]
        success_msg: fine
    - name: Fail on one host, rescued
      block:
        - name: Fail on h2
          ansible.builtin.fail:
            msg: h2 stops here
          when: inventory_hostname == 'h2'
      rescue:
        - name: Say it was rescued
          ansible.builtin.debug:
            msg: "rescued: {{ ansible_failed_result.msg }}"
    - name: A module skipped by its condition
      ansible.builtin.command: /bin/false
      when: limit > 5
    - name: A module whose condition holds
      ansible.builtin.command: echo ran
      register: ran
      changed_when: false
      when: limit > 2
    - name: Where the templating ran
      ansible.builtin.set_fact:
        templated_in: "{{ lookup('ansible.builtin.pipe', 'echo $PPID') }}"
    - name: Include tasks on h1 only
      ansible.builtin.include_tasks: included.yml
      when: inventory_hostname == 'h1'
    - name: Include the role with a good size
      ansible.builtin.include_role:
        name: probe_role
      vars:
        probe_size: 3
    - name: Include the role with a bad size, rescued
      block:
        - name: Include the role with a bad size
          ansible.builtin.include_role:
            name: probe_role
          vars:
            probe_size: many
      rescue:
        - name: Say the role refused it
          ansible.builtin.debug:
            msg: "{{ ansible_failed_result.msg }}"
    - name: An ignored failing assertion
      ansible.builtin.assert:
        that: [false]
        fail_msg: expected
      ignore_errors: true
    - name: A loop
      ansible.builtin.debug:
        msg: "{{ item }}"
      loop: [1, 2]
    - name: A secret stays out
      ansible.builtin.debug:
        msg: secret
      no_log: true
    - name: Run once, delegated and skipped
      ansible.builtin.command: /bin/false
      delegate_to: localhost
      run_once: true
      when: false
    - name: An undefined variable in a condition fails the task
      ansible.builtin.command: /bin/false
      when: nowhere_defined
      ignore_errors: true
    - name: Report
      ansible.builtin.debug:
        msg: "{{ ran.stdout }} {{ hostvars['h1'].doubled }} {{ included | default('-') }}"
"""

INCLUDED = """
- name: Set a fact in the include
  ansible.builtin.set_fact:
    included: yes-{{ inventory_hostname }}
"""

ROLE_SPEC = """
argument_specs:
  main:
    short_description: A probe
    options:
      probe_size:
        type: int
        required: true
"""

ROLE_TASKS = """
- name: Say the size
  ansible.builtin.debug:
    msg: "size {{ probe_size }}"
"""

# Writes what each host's tasks returned, host by host in the order they came, and the
# recap, as JSON on its own (ansible-core ships no JSON callback).
RECORDER = """
import json
import os

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "probe_record"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.hosts = {}

    def _keep(self, event, result):
        self.hosts.setdefault(result._host.get_name(), []).append(
            [event, result._task.get_name(), result._result]
        )

    def v2_runner_on_ok(self, result):
        self._keep("ok", result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._keep("failed ignored" if ignore_errors else "failed", result)

    def v2_runner_on_skipped(self, result):
        self._keep("skipped", result)

    def v2_runner_item_on_ok(self, result):
        self._keep("item ok", result)

    def v2_playbook_on_include(self, included_file):
        for host in included_file._hosts:
            self.hosts.setdefault(host.get_name(), []).append(
                ["include", os.path.basename(included_file._filename), None]
            )

    def v2_playbook_on_stats(self, stats):
        recap = {host: stats.summarize(host) for host in sorted(stats.processed)}
        with open(os.environ["PROBE_RECORD"], "w") as out:
            json.dump({"hosts": self.hosts, "recap": recap}, out, default=str)
"""

VOLATILE = {"start", "end", "delta", "templated_in"}


def steady(value):
    """What the recorder wrote, without timings and without the probe's process id."""
    if isinstance(value, dict):
        return {k: steady(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [steady(v) for v in value]
    return value


def run(tmp_path, on: bool) -> dict:
    records = tmp_path / "records"
    shutil.rmtree(records, ignore_errors=True)
    # There before the run: else the host whose task comes first makes it and says so, and
    # forked, which one does is a race (CI saw h2 win once).
    records.mkdir()
    record = tmp_path / f"record-{on}.json"
    # Every other cache in both runs: only the switch differs.
    run_switch_probe(
        tmp_path,
        "KIT_TEST_INLINE_TASKS",
        on,
        {
            "probe.yml": PLAYBOOK,
            "included.yml": INCLUDED,
            "inventory.ini": INVENTORY,
            "roles/probe_role/meta/argument_specs.yml": ROLE_SPEC,
            "roles/probe_role/tasks/main.yml": ROLE_TASKS,
            "callbacks/probe_record.py": RECORDER,
        },
        inventory=str(tmp_path / "inventory.ini"),
        extra_args=("-e", f"record_dir={records}"),
        ANSIBLE_CALLBACK_PLUGINS=f"{tmp_path / 'callbacks'}:{REPO / 'callback_plugins'}",
        ANSIBLE_CALLBACKS_ENABLED="probe_record",
        ANSIBLE_ROLES_PATH=str(tmp_path / "roles"),
        PROBE_RECORD=str(record),
    )
    assert (records / "h2" / "doubled.txt").read_text() == "h2h2"
    return json.loads(record.read_text())


def templated_in(report: dict) -> dict[str, str]:
    return {
        host: result["ansible_facts"]["templated_in"]
        for host, events in report["hosts"].items()
        for _, task, result in events
        if task == "Where the templating ran"
    }


def test_tasks_that_only_template_run_in_place_and_the_run_reports_the_same(tmp_path):
    inline = run(tmp_path, on=True)
    forked = run(tmp_path, on=False)
    # In place, both hosts' templating ran in ansible-playbook itself: one process. Forked,
    # each in a worker of its own.
    assert len(set(templated_in(inline).values())) == 1, templated_in(inline)
    assert len(set(templated_in(forked).values())) == 2, templated_in(forked)
    assert sorted(inline["hosts"]) == sorted(forked["hosts"]) == ["h1", "h2"]
    # Host by host and task by task, so that a failure shows the task that differs.
    for host, events in inline["hosts"].items():
        for said, also in itertools.zip_longest(events, forked["hosts"][host]):
            assert steady(said) == steady(also), host
    assert inline["recap"] == forked["recap"]
    said = {(event, task) for events in inline["hosts"].values() for event, task, _ in events}
    for expected in (
        ("ok", "Set a fact in the include"),
        ("ok", "Write it on the controller"),
        ("ok", "Say the role refused it"),
        ("ok", "probe_role : Say the size"),
        ("ok", "Say it was rescued"),
        ("skipped", "A module skipped by its condition"),
        ("failed ignored", "An undefined variable in a condition fails the task"),
        ("item ok", "A loop"),
    ):
        assert expected in said, expected
    assert inline["recap"]["h2"]["rescued"] == 2 and inline["recap"]["h1"]["ignored"] == 2


def fake_task(action: str, **fields):
    """What inline_kind reads of a task: by default one without loop, timeout, async or when."""
    values = {"loop_with": None, "loop": None, "async_val": 0, "timeout": 0, "when": []}
    return types.SimpleNamespace(action=action, **{**values, **fields})


def test_only_tasks_without_a_loop_a_timeout_or_async_run_in_place():
    assert inline_tasks.inline_kind(fake_task("ansible.builtin.set_fact")) == "run"
    assert inline_tasks.inline_kind(fake_task("debug", when=["x"])) == "run"
    assert inline_tasks.inline_kind(fake_task("ansible.builtin.command", when=["x"])) == "when"
    assert inline_tasks.inline_kind(fake_task("ansible.builtin.command")) is None
    assert inline_tasks.inline_kind(fake_task("debug", loop=[1])) is None
    assert inline_tasks.inline_kind(fake_task("debug", loop_with="items")) is None
    assert inline_tasks.inline_kind(fake_task("assert", timeout=5)) is None
    assert inline_tasks.inline_kind(fake_task("ansible.builtin.command", async_val=10)) is None


def test_patching_twice_wraps_start_once():
    # A module task without a condition: it forks, through the wrapped start.
    assert_start_patched_once(inline_tasks.patch, fake_task("ansible.builtin.command"))
