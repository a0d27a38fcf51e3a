"""The module payloads the tests' ansible-playbook keeps from one run to the next
(tests/support/ansiballz_payloads.py): a second run uses the first run's payload, any change to
a module or module_utils file names another folder, and an ansible-core that does not look as
expected is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from tests.support import ansiballz_payloads
from tests.support.ansible_run import controller_bytecode, python_json

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = Path(sys.executable).parent / "ansible"


def ping(folder: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        **controller_bytecode(),
        "KIT_TEST_ANSIBALLZ_PAYLOAD_DIR": str(folder),
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
    }
    return subprocess.run(
        [str(ANSIBLE), "localhost", "-c", "local", "-m", "ansible.builtin.ping",
         "-e", f"ansible_python_interpreter={sys.executable}"],
        env=env, capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
    )  # fmt: skip


def test_a_second_run_uses_the_payload_the_first_built(tmp_path):
    first = ping(tmp_path)
    assert first.returncode == 0 and "ping: pong" in first.stdout, first.stdout + first.stderr
    (entry,) = [p for p in tmp_path.glob("*/ansiballz_cache/*ping*") if p.suffix != ".lock"]
    built = entry.stat()
    second = ping(tmp_path)
    assert second.returncode == 0 and "ping: pong" in second.stdout, second.stderr
    again = entry.stat()
    assert (again.st_ino, again.st_mtime_ns) == (built.st_ino, built.st_mtime_ns)
    assert [p.name for p in tmp_path.iterdir()] == [entry.parent.parent.name]


def test_any_change_to_what_a_payload_is_made_of_names_another_folder(tmp_path):
    modules, utils = tmp_path / "library", tmp_path / "module_utils"
    (utils / "stage").mkdir(parents=True)
    modules.mkdir()
    (modules / "one.py").write_text("print(1)\n")
    (utils / "stage" / "helper.py").write_text("X = 1\n")
    constants = SimpleNamespace(
        DEFAULT_MODULE_PATH=[str(modules)], DEFAULT_MODULE_UTILS_PATH=[str(utils)]
    )
    before = ansiballz_payloads.sources_digest(constants)
    # Bytecode next to the sources is not what a payload is made of.
    (utils / "stage" / "__pycache__").mkdir()
    (utils / "stage" / "__pycache__" / "helper.cpython-311.pyc").write_bytes(b"\0")
    assert ansiballz_payloads.sources_digest(constants) == before
    seen = {before}
    for change in (
        lambda: (utils / "stage" / "helper.py").write_text("X = 2\n"),
        lambda: (modules / "two.py").write_text("print(2)\n"),
        lambda: (modules / "two.py").rename(modules / "three.py"),
    ):
        change()
        digest = ansiballz_payloads.sources_digest(constants)
        assert digest not in seen
        seen.add(digest)


def test_an_ansible_core_laid_out_otherwise_is_left_alone(tmp_path):
    elsewhere = SimpleNamespace(C=SimpleNamespace(DEFAULT_LOCAL_TMP="/tmp/run"))
    assert ansiballz_payloads.patch(elsewhere, str(tmp_path)) is False
    assert elsewhere.C.DEFAULT_LOCAL_TMP == "/tmp/run"


def test_the_playbooks_the_tests_run_get_the_cache_when_they_import_module_common(tmp_path):
    env = {**os.environ, **controller_bytecode(), "KIT_TEST_ANSIBALLZ_PAYLOAD_DIR": str(tmp_path)}
    code = (
        "import json; from ansible.executor import module_common as m; "
        "print(json.dumps([getattr(m.C, 'kimi_payload_cache', False), m.C.DEFAULT_LOCAL_TMP]))"
    )
    cached, folder = python_json(code, env)
    assert cached is True and Path(folder).parent == tmp_path
