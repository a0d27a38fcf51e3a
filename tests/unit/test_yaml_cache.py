"""The cache of loaded YAML the tests' ansible-playbook keeps (tests/support/yaml_cache.py): what
ansible-core loads from the checkout's files and its own is the same with it, tags included (each
value's file, line and column, and its trust as a template), a second process constructs nothing
it constructed before, and what a test writes outside the checkout, or anything vaulted, is never
kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import yaml_cache
from tests.support.ansible_run import cache_env, python_json

REPO = Path(__file__).resolve().parents[2]

# Loads files the way ansible-core does (its DataLoader, its plugin documentation, its
# configuration definitions, the collection loader's routing table) and prints each result
# with every tag of every value, and how many YAML nodes PyYAML's constructor built.
LOAD = """
import json, sys, yaml
import yaml.constructor as constructed
built = []
original = constructed.BaseConstructor.construct_object
def counting(self, node, deep=False):
    built.append(1)
    return original(self, node, deep)
constructed.BaseConstructor.construct_object = counting
from ansible.parsing.dataloader import DataLoader
from ansible.parsing.plugin_docs import read_docstring
from ansible.module_utils._internal._datatag import AnsibleTagHelper
from ansible.utils.collection_loader._collection_finder import _get_collection_metadata
from ansible.plugins.loader import init_plugin_loader
import ansible.plugins.connection.ssh as ssh
init_plugin_loader()

def tagged(value):
    tags = sorted(repr(t) for t in AnsibleTagHelper.tags(value))
    if isinstance(value, dict):
        return [tags, type(value).__name__, [[tagged(k), tagged(v)] for k, v in value.items()]]
    if isinstance(value, list):
        return [tags, type(value).__name__, [tagged(v) for v in value]]
    return [tags, type(value).__name__, repr(value)]

loader = DataLoader()
out = {path: tagged(loader.load_from_file(path, cache="none", trusted_as_template=True))
       for path in sys.argv[1:]}
out["ssh docs"] = tagged(read_docstring(ssh.__file__)["doc"])
out["builtin routing"] = len(_get_collection_metadata("ansible.builtin")["plugin_routing"])
print(json.dumps({"out": out, "built": len(built)}))
"""


def load(folder, *paths: Path) -> dict:
    code = LOAD.replace("sys.argv[1:]", repr([str(p) for p in paths]))
    return python_json(code, cache_env("KIT_TEST_YAML_DIR", folder))


@pytest.fixture
def checkout_file():
    """Makes files in the checkout (only its files are kept), named so that no linter reads
    them, and removes them after the test."""
    made: list[Path] = []

    def make(name: str, text: str = "", folder: Path = REPO / "tests" / "support") -> Path:
        path = folder / f"yaml-cache-{name}-{os.getpid()}.txt"
        made.append(path)
        path.write_text(text)
        return path

    yield make
    for path in made:
        path.unlink(missing_ok=True)


KIT_FILES = (
    REPO / "roles" / "server" / "tasks" / "main.yml",
    REPO / "group_vars" / "all" / "model.yml",
    REPO / "plan.yml",
)


def test_ansible_core_loads_the_same_values_and_tags_from_the_cache(tmp_path):
    plain = load(None, *KIT_FILES)
    first = load(tmp_path, *KIT_FILES)
    second = load(tmp_path, *KIT_FILES)
    assert first["out"] == plain["out"] == second["out"]
    # Every value still names its file, line and column, and is trusted as a template.
    tasks = str(plain["out"][str(KIT_FILES[0])])
    assert "TrustedAsTemplate()" in tasks and f"Origin(path='{KIT_FILES[0]}', line_num=" in tasks
    assert plain["out"]["builtin routing"] >= 10
    # The first process kept what it loaded; the second built only what is not kept (ansible's
    # own files read before the harness is imported, if any).
    assert plain["built"] > 10_000 and second["built"] < plain["built"] / 20
    assert len(list(tmp_path.iterdir())) >= len(KIT_FILES) + 2


def test_a_changed_file_loads_anew_and_a_damaged_entry_is_loaded_again(tmp_path, checkout_file):
    folder = tmp_path / "cache"
    kit_file = checkout_file("probe", "- name: first\n  value: 1\n")
    first = load(folder, kit_file)["out"][str(kit_file)]
    kit_file.write_text("- name: second\n  value: 2\n")
    second = load(folder, kit_file)["out"][str(kit_file)]
    assert "'first'" in str(first) and "'second'" in str(second)
    for entry in folder.iterdir():
        entry.write_bytes(b"not a pickle")
    again = load(folder, kit_file)
    assert again["out"][str(kit_file)] == second


def test_files_outside_the_checkout_and_vaulted_ones_are_never_kept(tmp_path, checkout_file):
    folder = tmp_path / "cache"
    outside = tmp_path / "vars.yml"
    outside.write_text("kimi_server_api_key: sk-never-on-disk-7a1c\n")
    vaulted = checkout_file(
        "vault-probe", "secret: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  3634\n"
    )
    plain = load(None, outside)
    cached = load(folder, outside)
    assert cached["out"] == plain["out"]
    kept = b"".join(entry.read_bytes() for entry in folder.iterdir())
    assert b"sk-never-on-disk" not in kept
    with open(vaulted, "rb") as handle:
        assert yaml_cache._source(handle) is None
    with open(outside, "rb") as handle:
        assert yaml_cache._source(handle) is None


def test_test_state_is_never_kept(checkout_file):
    state = REPO / "tests" / ".state"
    state.mkdir(exist_ok=True)
    probe = checkout_file("probe", "hosts: {}\n", folder=state)
    with open(probe, "rb") as handle:
        assert yaml_cache._source(handle) is None
    with open(REPO / "plan.yml", "rb") as handle:
        content, tags, path = yaml_cache._source(handle)
    assert path == str(REPO / "plan.yml") and content == (REPO / "plan.yml").read_bytes()
    # The name it was opened by: the loader names each value's file by it.
    assert tags == [f"name={str(REPO / 'plan.yml')!r}"]


# A whole file vaulted (ansible-vault encrypt), loaded by DataLoader with its password: what
# yaml.load gets is the decrypted text.
VAULTED_FILE = """
import json, sys
from ansible.parsing.dataloader import DataLoader
from ansible.parsing.vault import VaultLib, VaultSecret
secret = VaultSecret(b"kimi-test-vault-password")
path = sys.argv[1]
with open(path, "wb") as handle:
    handle.write(VaultLib([("default", secret)]).encrypt(
        "kimi_server_api_key: sk-vaulted-never-kept-3e9a\\n", secret))
loader = DataLoader()
loader.set_vault_secrets([("default", secret)])
print(json.dumps(loader.load_from_file(path, cache="none")))
"""


def test_a_vaulted_file_is_never_kept_and_entries_are_the_owners_alone(tmp_path, checkout_file):
    folder = tmp_path / "cache"
    vaulted = checkout_file("vaulted")
    code = VAULTED_FILE.replace("sys.argv[1]", repr(str(vaulted)))
    env = cache_env("KIT_TEST_YAML_DIR", folder)
    assert python_json(code, env) == {"kimi_server_api_key": "sk-vaulted-never-kept-3e9a"}
    entries = list(folder.iterdir())
    assert entries, "ansible-core's own files were kept"
    assert not any(b"sk-vaulted-never-kept" in entry.read_bytes() for entry in entries)
    assert {entry.stat().st_mode & 0o777 for entry in entries} == {0o600}
    assert folder.stat().st_mode & 0o777 == 0o700
