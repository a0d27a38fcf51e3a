"""On PYTHONPATH of the playbooks the tests run (tests/support/ansible_run.py), never of the
kit's own. Caches that only save time, each in the folder its variable names:
- KIT_TEST_BYTECODE_DIR: the modules a playbook runs on the controller (delegated to localhost,
  plan.yml's) keep the bytecode of what they import from their payloads, as the test hosts' do
  (tests/support/host_bytecode.py says why);
- KIT_TEST_ANSIBALLZ_DEPS_DIR: ansible-playbook keeps what each module_utils file imports, to
  build module payloads without parsing them anew (tests/support/ansiballz_deps.py);
- KIT_TEST_JINJA_CODE_DIR: ansible-playbook keeps the code its templates compile to
  (tests/support/jinja_code_cache.py);
- KIT_TEST_ANSIBALLZ_PAYLOAD_DIR: ansible-playbook keeps the module payloads it builds from one
  run to the next (tests/support/ansiballz_payloads.py);
- KIT_TEST_YAML_DIR: ansible-playbook keeps what the YAML files of the checkout and of
  ansible-core load to (tests/support/yaml_cache.py);
- KIT_TEST_WORKER_GC=1: ansible-playbook freezes its objects before each task worker forks,
  so the worker's garbage collector does not copy them (tests/support/worker_gc.py);
- KIT_TEST_LOADER_COPIES=1: ansible-playbook copies the files it has loaded by unpickling
  rather than deep-copying them (tests/support/loader_copies.py);
- KIT_TEST_INLINE_TASKS=1: ansible-playbook runs the tasks that never reach a host, and
  resolves a false `when`, in its own process instead of a forked worker
  (tests/support/inline_tasks.py).
The last seven patch a module (ansible-core's, PyYAML's) when, if ever, the process imports it."""

import importlib.util
import os
import sys

SUPPORT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name: str, filename: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(SUPPORT, filename))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Loader:
    """A module's own loader, with `then(module)` run once the module has been executed."""

    def __init__(self, loader, then):
        self._loader, self._then = loader, then

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._then(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _AfterImport:
    """A meta path finder that hands a module, once imported, to `then`."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, self.then)
        return spec


def after_import(name: str, then) -> None:
    if name in sys.modules:
        then(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


def _install() -> None:
    folder = os.environ.get("KIT_TEST_BYTECODE_DIR")
    if folder:
        _load("kimi_test_bytecode", "host_bytecode.py").install(folder)
    for variable, filename in (
        ("KIT_TEST_ANSIBALLZ_DEPS_DIR", "ansiballz_deps.py"),
        ("KIT_TEST_JINJA_CODE_DIR", "jinja_code_cache.py"),
        ("KIT_TEST_ANSIBALLZ_PAYLOAD_DIR", "ansiballz_payloads.py"),
    ):
        folder = os.environ.get(variable)
        if folder:
            os.makedirs(folder, exist_ok=True)
            cache = _load(f"kimi_test_{filename[:-3]}", filename)
            after_import(
                cache.MODULE, lambda module, cache=cache, folder=folder: cache.patch(module, folder)
            )
    for variable, filename in (
        ("KIT_TEST_WORKER_GC", "worker_gc.py"),
        ("KIT_TEST_LOADER_COPIES", "loader_copies.py"),
        ("KIT_TEST_INLINE_TASKS", "inline_tasks.py"),
    ):
        if os.environ.get(variable) == "1":
            switch = _load(f"kimi_test_{filename[:-3]}", filename)
            after_import(switch.MODULE, switch.patch)
    folder = os.environ.get("KIT_TEST_YAML_DIR")
    if folder:
        # The owner's alone: what the checkout's files load to.
        os.makedirs(folder, mode=0o700, exist_ok=True)
        cache = _load("kimi_test_yaml_cache", "yaml_cache.py")
        after_import(
            cache.MODULE, lambda module, cache=cache, folder=folder: cache.patch(module, folder)
        )
        after_import(
            cache.META_MODULE,
            lambda module, cache=cache, folder=folder: cache.patch_meta(module, folder),
        )


_install()
