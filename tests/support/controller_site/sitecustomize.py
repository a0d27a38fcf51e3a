"""On PYTHONPATH of the playbooks the tests run (tests/support/ansible_run.py), never of the
kit's own: the modules a playbook runs on the controller (delegated to localhost, plan.yml's)
keep the bytecode of what they import from their payloads, as the test hosts' do
(tests/support/host_bytecode.py says why), in KIT_TEST_BYTECODE_DIR."""

import importlib.util
import os


def _install() -> None:
    folder = os.environ.get("KIT_TEST_BYTECODE_DIR")
    if not folder:
        return
    path = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "host_bytecode.py"
    )
    spec = importlib.util.spec_from_file_location("kimi_test_bytecode", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install(folder)


_install()
