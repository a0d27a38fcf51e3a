"""On PYTHONPATH of the playbooks the tests run (tests/support/ansible_run.py), never of the
kit's own. Two caches that only save time:
- the modules a playbook runs on the controller (delegated to localhost, plan.yml's) keep the
  bytecode of what they import from their payloads, as the test hosts' do
  (tests/support/host_bytecode.py says why), in KIT_TEST_BYTECODE_DIR;
- ansible-playbook keeps what each module_utils file imports, so that it builds module
  payloads without parsing them anew in every run (tests/support/ansiballz_deps.py says why),
  in KIT_TEST_ANSIBALLZ_DEPS_DIR."""

import importlib.util
import os

SUPPORT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name: str, filename: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(SUPPORT, filename))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _install() -> None:
    folder = os.environ.get("KIT_TEST_BYTECODE_DIR")
    if folder:
        _load("kimi_test_bytecode", "host_bytecode.py").install(folder)
    folder = os.environ.get("KIT_TEST_ANSIBALLZ_DEPS_DIR")
    if folder:
        _load("kimi_test_ansiballz_deps", "ansiballz_deps.py").install(folder)


_install()
