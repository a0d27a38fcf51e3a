#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module study_lock: the study lock (kimi.lock.yml) on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: study_lock
short_description: Read, resolve and record the study lock (kimi.lock.yml)
description:
  - The study lock holds what every moving reference of a study resolved to - the hub commits
    of the weights and of the prompt datasets, the SGLang git commit - and the runtime package
    sets frozen after the first build, so that a rerun months later gets the same ones.
  - Runs on the controller (delegate it to localhost). The file is read as outside input, its
    size, keys and values checked, and a bad entry fails naming it.
  - C(action=read) returns the commits the run must use (C(pins)) and fails when the lock was
    made from other settings than the run's, naming each entry, both values and the fix.
  - C(action=record) adds the commits a run resolved and used (I(known)) where the lock has
    none yet; a run without a lock writes one. It never reports a change - it is the run's
    bookkeeping on the controller - so a second deploy reports changed=0.
  - C(action=resolve) (plan.yml) resolves what the lock lacks or holds for other settings
    (I(known) first, then the hub for weights and datasets, C(git ls-remote) for git
    sources); an entry that cannot be resolved is left out and named in C(unresolved); with
    I(update) every entry, and the frozen runtime sets are dropped so that the next deploy
    freezes them anew.
  - C(action=record_runtime) freezes a runtime's package set when the lock holds none for
    that kind (or, with I(replace), one built from another source).
  - Writers hold an exclusive flock on the lock's folder and replace the file atomically.
    Supports check mode (nothing is written).
version_added: "0.1.0"
options:
  path:
    description: The lock file (kimi_lock_file).
    type: path
    required: true
  action:
    description: What to do; see the description.
    type: str
    choices: [read, record, resolve, record_runtime]
    default: read
  requested:
    description: >-
      What the run asks for, one mapping per host (they are merged; one repository at two
      revisions fails) - C(weights) and C(datasets) (repository id to revision) and C(git)
      (name to C(url) and C(ref)).
    type: list
    elements: dict
    default: []
  known:
    description: >-
      Commits the run already resolved, one mapping per host - C(weights) and C(datasets)
      (repository id to commit), C(git) (name to commit); the first host's commit stands.
    type: list
    elements: dict
    default: []
  update:
    description: With C(action=resolve), resolve every entry anew and drop the frozen runtime sets.
    type: bool
    default: false
  endpoint:
    description: The hub address repositories are resolved at (C(action=resolve)).
    type: str
    default: https://huggingface.co
  token:
    description: Hugging Face token for gated repositories; never returned or logged.
    type: str
    default: ""
  kind:
    description: The runtime kind of C(action=record_runtime).
    type: str
    choices: [release, git]
  record:
    description: >-
      The runtime set of C(action=record_runtime) - C(built_from), C(python), C(platform)
      (C(driver), C(driver_cuda)), C(recorded_from) and C(packages) (name to C(version) and
      C(sha256), null where pip gave none).
    type: dict
  replace:
    description: With C(action=record_runtime), replace a set built from another source.
    type: bool
    default: false
  tolerate_mismatch:
    description: >-
      With C(action=read), entries made from other settings are not pinned and are named in
      C(unresolved) instead of failing (plan.yml without the hub).
    type: bool
    default: false
  runtime_built_from:
    description: >-
      With C(action=resolve), what each runtime kind is built from now (C(release) -
      C(sglang) version); a frozen set built from something else is dropped, as is the git
      set when the git commit is relocked.
    type: dict
    default: {}
  timeout:
    description: Seconds each hub request and each C(git ls-remote) may take.
    type: float
    default: 60
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Resolve the study lock
  study_lock:
    path: "{{ kimi_lock_file }}"
    action: resolve
    requested: ["{{ kimi_study_requested }}"]
    known: [{weights: {moonshotai/Kimi-K2.6: 0123456789abcdef0123456789abcdef01234567}}]
    update: "{{ kimi_lock_update | bool }}"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
path:
  description: The lock file.
  returned: always
  type: str
exists:
  description: Whether a lock exists (after the call).
  returned: always
  type: bool
written:
  description: Whether the call wrote (or, in check mode, would write) the lock.
  returned: actions read, record and resolve
  type: bool
lock:
  description: The lock's content (weights, datasets, git, runtime); empty without a lock.
  returned: actions read, record and resolve
  type: dict
pins:
  description: >-
    The commits this run uses - C(weights) and C(datasets) (repository id to commit), C(git)
    (name to url, ref and commit) - for what it asks and the lock holds.
  returned: actions read, record and resolve
  type: dict
missing:
  description: What the run asks that the lock does not pin, as "section name" strings.
  returned: actions read, record and resolve
  type: list
  elements: str
unresolved:
  description: With C(action=resolve), per entry that could not be resolved, why.
  returned: actions read, record and resolve
  type: list
  elements: str
messages:
  description: One line per entry the call resolved or recorded.
  returned: actions read, record and resolve
  type: list
  elements: str
recorded:
  description: Whether C(action=record_runtime) froze the given set.
  returned: action record_runtime
  type: bool
runtime:
  description: The lock's frozen set of that kind after the call.
  returned: action record_runtime
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.in_process import run_as_module  # noqa: E402
from ansible.module_utils.plan.study_lock_task import RULES, SPEC, act  # noqa: E402


def main() -> None:
    run_as_module(AnsibleModule, SPEC, act, **RULES)


if __name__ == "__main__":
    main()
