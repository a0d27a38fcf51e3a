"""A cache of what each module_utils file imports, for the ansible-playbook the tests run.

tests/support/controller_site/sitecustomize.py installs it into the playbooks the tests run
(never into the kit's own). It touches nothing of the kit and nothing of a host.

Why: to build a module's payload, ansible-core parses the module and every module_utils file it
reaches into a syntax tree (module_common.recursive_finder) to find their imports, once per
module per playbook run: about 0.3 s of CPU for each of the kit's modules, which import the
kit's 1 MB of module_utils. The suite runs hundreds of playbooks on two cores.

What: the imports a file's tree yields (ModuleDepFinder's submodules and optional_imports) are
a function of the file's name, its source and whether it is a package's __init__, so they are
kept on disk under a digest of those (and of the ansible-core and Python versions), and read
back instead of parsing the file again. The payload is byte for byte what ansible-core builds
without the cache: only the parse is skipped. If ansible-core's internals are not the ones
this was written against, nothing is installed.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import pickle

MODULE = "ansible.executor.module_common"


class _Source:
    """What _compile_module_ast was given, parsed only if something needs the tree."""

    __slots__ = ("_tree", "name", "source")

    def __init__(self, name, source):
        self.name, self.source, self._tree = name, source, None

    def tree(self, compile_tree):
        if self._tree is None:
            self._tree = compile_tree(self.name, self.source)
        return self._tree


def patch(module_common, folder: str) -> bool:
    """Route module_common's import discovery through the cache in folder."""
    compile_tree = getattr(module_common, "_compile_module_ast", None)
    finder = getattr(module_common, "ModuleDepFinder", None)
    metadata = getattr(module_common, "_get_module_metadata", None)
    if not (callable(compile_tree) and isinstance(finder, type) and callable(metadata)):
        return False
    if getattr(finder, "kimi_cached", False):
        return False
    import ansible

    salt = f"{ansible.__version__}|{importlib.util.MAGIC_NUMBER.hex()}".encode()

    def compile_later(name, source):
        return _Source(name, source)

    def find(module_fqn, tree, is_pkg_init):
        # ModuleDepFinder's __init__ names itself through the module's global (super(...)).
        module_common.ModuleDepFinder = finder
        try:
            return finder(module_fqn, tree, is_pkg_init)
        finally:
            module_common.ModuleDepFinder = CachedDepFinder

    def module_metadata(tree):
        return metadata(tree.tree(compile_tree) if isinstance(tree, _Source) else tree)

    class CachedDepFinder:
        kimi_cached = True

        def __init__(self, module_fqn, tree, is_pkg_init=False):
            self.module_fqn, self.is_pkg_init = module_fqn, is_pkg_init
            if not isinstance(tree, _Source):
                found = find(module_fqn, tree, is_pkg_init)
                self.submodules, self.optional_imports = found.submodules, found.optional_imports
                return
            source = tree.source if isinstance(tree.source, bytes) else tree.source.encode()
            key = hashlib.blake2b(
                b"\0".join([salt, module_fqn.encode(), b"%d" % bool(is_pkg_init), source]),
                digest_size=20,
            ).hexdigest()
            entry = os.path.join(folder, key)
            try:
                with open(entry, "rb") as handle:
                    # Written by this harness, in the checkout's own tests/.state.
                    submodules, optional = pickle.load(handle)  # noqa: S301
                self.submodules, self.optional_imports = set(submodules), set(optional)
                return
            except Exception:  # noqa: S110 - a missing or damaged entry is parsed again
                pass
            found = find(module_fqn, tree.tree(compile_tree), is_pkg_init)
            self.submodules, self.optional_imports = found.submodules, found.optional_imports
            partial = f"{entry}.{os.getpid()}.partial"
            try:
                with open(partial, "wb") as handle:
                    pickle.dump((sorted(self.submodules), sorted(self.optional_imports)), handle)
                os.replace(partial, entry)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(partial)

    module_common._compile_module_ast = compile_later
    module_common._get_module_metadata = module_metadata
    module_common.ModuleDepFinder = CachedDepFinder
    return True
