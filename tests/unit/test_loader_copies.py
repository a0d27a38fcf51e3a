"""The tests' ansible-playbook copies the files it has loaded by unpickling them
(tests/support/loader_copies.py): each caller still gets fresh objects equal to the file's,
tagged with where they came from, and a playbook does and says the same with it or without."""

from __future__ import annotations

import re
import types

from ansible.module_utils._internal._datatag import AnsibleTagHelper
from ansible.parsing.dataloader import DataLoader

from tests.support import loader_copies
from tests.support.ansible_run import run_switch_probe

# Shared references inside the file (an anchor) must stay shared in each copy, as deepcopy
# keeps them.
VARS = """
shared: &shared {limits: [1, 2, 3], name: kimi}
first: *shared
second: *shared
text: "{{ shared.name }}"
"""


def patched_loader():
    """A DataLoader class of its own, patched: the real one stays as it was in this process."""
    module = types.SimpleNamespace(DataLoader=type("Loader", (DataLoader,), {}))
    assert loader_copies.patch(module)
    return module.DataLoader()


def test_each_copy_is_fresh_equal_tagged_and_keeps_shared_references(tmp_path):
    path = tmp_path / "vars.yml"
    path.write_text(VARS)
    loader = patched_loader()
    plain = DataLoader().load_from_file(str(path))
    first = loader.load_from_file(str(path))
    first["first"]["limits"].append(4)
    first["text"] = "changed"
    second = loader.load_from_file(str(path))
    assert second == plain and second is not first
    assert second["first"] is second["second"]
    assert second["first"]["limits"] is not first["first"]["limits"]
    # Where each value came from (file, line) and whether it may be templated, as deepcopy's.
    for key in ("text", "shared"):
        assert AnsibleTagHelper.tags(second[key]) == AnsibleTagHelper.tags(plain[key])
        assert AnsibleTagHelper.tags(second[key])
    # unsafe=True is ansible-core's own kept object, as before.
    kept = loader.load_from_file(str(path), unsafe=True)
    assert kept is loader.load_from_file(str(path), unsafe=True) and kept == plain


def test_a_load_not_kept_and_data_that_does_not_pickle_are_deep_copied(tmp_path):
    path = tmp_path / "vars.yml"
    path.write_text(VARS)
    loader = patched_loader()
    fresh = loader.load_from_file(str(path), cache="none")
    assert fresh == DataLoader().load_from_file(str(path)) and not loader._FILE_CACHE
    odd = tmp_path / "odd.yml"
    odd.write_text("a: 1\n")
    loader.load_from_file(str(odd))
    # A value pickle refuses and deepcopy hands over as it is (a function made here).
    unpicklable = {"a": 1, "call": lambda: 1, "list": [1]}
    loader._FILE_CACHE[loader.path_dwim(str(odd))] = unpicklable
    copied = loader.load_from_file(str(odd))
    assert copied["call"] is unpicklable["call"] and copied["a"] == 1
    assert copied["list"] == [1] and copied["list"] is not unpicklable["list"]


def test_patching_twice_wraps_once():
    module = types.SimpleNamespace(DataLoader=type("Loader", (DataLoader,), {}))
    assert loader_copies.patch(module)
    wrapped = module.DataLoader.load_from_file
    assert not loader_copies.patch(module)
    assert module.DataLoader.load_from_file is wrapped


PLAYBOOK = """
- name: Loader probe
  hosts: localhost
  connection: local
  gather_facts: false
  vars_files:
    - vars.yml
  tasks:
    - name: Include the same tasks twice
      ansible.builtin.include_tasks: say.yml
      loop: [1, 2]
"""

SAY = """
- name: Say what the vars file and the worker's loader hold
  ansible.builtin.debug:
    msg: >-
      pickled={{ lookup('kimi_loader_probe') }} limits={{ first.limits | join(',') }}
      text={{ text }} item={{ item }}
"""

PROBE = """
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.lookup import LookupBase


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        return [getattr(DataLoader.load_from_file, "kimi_pickled_copies", False)]
"""


def run(tmp_path, on: bool) -> tuple[set[str], list[str]]:
    # Every other cache in both runs: only the copies differ.
    files = {"lookup_plugins/kimi_loader_probe.py": PROBE, "vars.yml": VARS, "say.yml": SAY}
    said = run_switch_probe(
        tmp_path, "KIT_TEST_LOADER_COPIES", on, {**files, "probe.yml": PLAYBOOK}
    )
    found = re.findall(r"pickled=(\w+) (limits=\S+\s+text=\S+ item=\d)", said)
    assert len(found) == 2, said[-3000:]
    return {flag for flag, _ in found}, [rest for _, rest in found]


def test_a_playbook_says_the_same_with_pickled_copies_and_without(tmp_path):
    flags_on, said_on = run(tmp_path, on=True)
    flags_off, said_off = run(tmp_path, on=False)
    assert (flags_on, flags_off) == ({"True"}, {"False"})
    assert said_on == said_off
    assert [re.sub(r"\s+", " ", s) for s in said_on] == [
        "limits=1,2,3 text=kimi item=1",
        "limits=1,2,3 text=kimi item=2",
    ]
