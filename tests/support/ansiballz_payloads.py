"""A cache of the module payloads (AnsiballZ archives) the tests' ansible-playbook builds, kept
across playbook runs.

tests/support/controller_site/sitecustomize.py installs it into the playbooks the tests run
(never into the kit's own). It touches nothing of the kit and nothing of a host.

Why: ansible-core builds each module's payload (the module and every module_utils file it
reaches, found, read and compressed into a zip archive) once per playbook run, in a cache under
the run's own temporary folder, which goes with the run. The suite runs over a hundred playbooks,
each building the same dozen payloads again: a tenth of ansible-playbook's CPU.

What: module_common's view of ansible-core's constants is the real one except for
DEFAULT_LOCAL_TMP, the folder ansible-core keeps its payload cache in, which becomes a folder
under the given one named by a digest of everything a payload is built from: the ansible-core
and Python versions, and the name and content of every file in the module and module_utils
folders the configuration names. ansible-core's own locking and write-then-rename keep
concurrent runs apart. A change to any of those files names another folder, so a payload is
never one of an older source. If ansible-core's internals are not the ones this was written
against, nothing is installed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os

MODULE = "ansible.executor.module_common"


class _Constants:
    """ansible.constants, with the payload cache's folder as DEFAULT_LOCAL_TMP."""

    kimi_payload_cache = True

    def __init__(self, real, local_tmp: str):
        self._real, self.DEFAULT_LOCAL_TMP = real, local_tmp

    def __getattr__(self, name):
        return getattr(self._real, name)


def sources_digest(constants) -> str:
    """What every payload this process builds is made of, as one digest."""
    import ansible

    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{ansible.__version__}|{importlib.util.MAGIC_NUMBER.hex()}".encode())
    folders = [
        *(constants.DEFAULT_MODULE_PATH or []),
        *(constants.DEFAULT_MODULE_UTILS_PATH or []),
    ]
    for folder in folders:
        digest.update(b"\0folder\0" + os.fsencode(folder))
        for root, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                path = os.path.join(root, name)
                digest.update(b"\0file\0" + os.fsencode(os.path.relpath(path, folder)) + b"\0")
                with open(path, "rb") as handle:
                    digest.update(handle.read())
    return digest.hexdigest()


def patch(module_common, folder: str) -> bool:
    """Keep module_common's payload cache under folder, across playbook runs."""
    constants = getattr(module_common, "C", None)
    if constants is None or getattr(constants, "kimi_payload_cache", False):
        return False
    # The one use of DEFAULT_LOCAL_TMP this relies on: the payload cache's folder.
    if not hasattr(module_common, "_CachedModule"):
        return False
    try:
        local_tmp = os.path.join(folder, sources_digest(constants))
        os.makedirs(local_tmp, exist_ok=True)
    except (OSError, TypeError, AttributeError):
        return False
    module_common.C = _Constants(constants, local_tmp)
    return True
