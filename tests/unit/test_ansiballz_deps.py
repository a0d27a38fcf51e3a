"""The cache of module_utils imports the tests' ansible-playbook keeps
(tests/support/ansiballz_deps.py): payloads are the bytes ansible-core builds without it, the
parse is skipped once an entry is there, a damaged entry is parsed again, and an ansible-core
that does not look as expected is left alone. Each case runs in a Python of its own: the patch
changes ansible-core's module_common for the whole process."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.ansible_run import controller_bytecode, python_json

REPO = Path(__file__).resolve().parents[2]

# Builds each named module's payload the way ansible-core does (recursive_finder, then the
# module itself) and prints every file of it with its digest, and how many trees were parsed.
BUILD = """
import datetime, hashlib, io, json, os, sys, zipfile
sys.path.insert(0, {repo!r})
from ansible.executor import module_common
if {folder!r}:
    from tests.support import ansiballz_deps
    ansiballz_deps.patch(module_common, {folder!r})
from ansible.plugins.loader import init_plugin_loader
from ansible._internal._ansiballz import _builder
from ansible._internal._datatag._tags import Origin
init_plugin_loader()
parsed = []
import builtins; real_compile = builtins.compile
module_common.compile = lambda *a, **k: (parsed.append(a[1]), real_compile(*a, **k))[1]
payloads = {{}}
when = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
for name in {names!r}:
    path = os.path.join({repo!r}, "library", name + ".py")
    data = open(path, "rb").read()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        manager = _builder.ExtensionManager.create(task_vars={{}})
        module_common.recursive_finder(
            name, "ansible.legacy." + name, Origin(path=path).tag(data), zf, when, manager
        )
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as zf:
        payloads[name] = {{
            i.filename: hashlib.sha256(zf.read(i)).hexdigest() for i in zf.infolist()
        }}
print(json.dumps({{"payloads": payloads, "parsed": len(parsed),
    "cached": getattr(module_common.ModuleDepFinder, "kimi_cached", False)}}))
"""

NAMES = ["serving_render", "weights_download", "sglang_benchmark"]


def build(folder, names=NAMES) -> dict:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}
    return python_json(BUILD.format(repo=str(REPO), folder=str(folder or ""), names=names), env)


def test_payloads_are_the_same_bytes_and_a_second_build_parses_only_the_modules(tmp_path):
    plain = build(None)
    first = build(tmp_path)
    second = build(tmp_path)
    assert not plain["cached"] and first["cached"] and second["cached"]
    assert first["payloads"] == plain["payloads"] == second["payloads"]
    assert all(len(files) > 50 for files in plain["payloads"].values())
    # Without the cache each module_utils file is parsed once per module that reaches it.
    assert plain["parsed"] > 100
    # With it, a first build parses each file once; a second only the modules themselves
    # (their METADATA is read from their own tree).
    assert first["parsed"] < plain["parsed"] / 2
    assert second["parsed"] == len(NAMES)
    assert len(list(tmp_path.iterdir())) >= first["parsed"] - len(NAMES)


def test_a_damaged_entry_is_parsed_again_and_rewritten(tmp_path):
    clean = build(tmp_path, NAMES[:1])
    for entry in tmp_path.iterdir():
        entry.write_bytes(b"not a pickle")
    again = build(tmp_path, NAMES[:1])
    assert again["payloads"] == clean["payloads"] and again["parsed"] == clean["parsed"]
    assert build(tmp_path, NAMES[:1])["parsed"] == 1


def test_an_ansible_core_laid_out_otherwise_is_left_alone():
    from tests.support import ansiballz_deps

    class Elsewhere:
        ModuleDepFinder = None  # a future ansible-core that finds imports another way

    assert ansiballz_deps.patch(Elsewhere, "/nonexistent") is False
    assert Elsewhere.ModuleDepFinder is None


def test_the_playbooks_the_tests_run_get_the_cache_when_they_import_module_common(tmp_path):
    env = {**os.environ, **controller_bytecode(), "KIT_TEST_ANSIBALLZ_DEPS_DIR": str(tmp_path)}
    code = (
        "import json; from ansible.executor import module_common as m; "
        "print(json.dumps(getattr(m.ModuleDepFinder, 'kimi_cached', False)))"
    )
    assert python_json(code, env) is True
