"""A bytecode cache for what a test host's Python imports from zip archives.

tests/support/testhosts.py installs this file into every test host's system Python, where a
.pth line imports it at start-up (`install_into`). It touches nothing of this machine.

Why: Ansible runs each module on a host as an AnsiballZ payload, a zip archive from which the
host's Python imports ansible.module_utils (about 400 KB of source). zipimport keeps no
bytecode: every task compiled all of it anew, twice over (Python 3.11's zipimporter compiles a
module once to name its file and once to run it). On the test hosts that was half of every
module's CPU, and the suite runs thousands of modules on two cores. Real hosts pay it too;
the kit cannot change that, the test harness can.

What: the code zipimport compiles is kept under CACHE_DIR (the host's own /var/cache), one
file per source digest and Python bytecode version, and loaded from there the next time, with
the archive's file names put back into it (each task's payload has a path of its own), so
tracebacks and __file__ read as without the cache. Anything that goes wrong (a folder the user
cannot write, a damaged entry) falls back to compiling: the cache can only save time.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import types
import zipimport

CACHE_DIR = "/var/cache/kimi-test-bytecode"
MODULE_NAME = "kimi_test_bytecode"
PTH_NAME = "kimi-test-bytecode.pth"


def _renamed(code: types.CodeType, filename: str) -> types.CodeType:
    consts = tuple(
        _renamed(const, filename) if isinstance(const, types.CodeType) else const
        for const in code.co_consts
    )
    return code.replace(co_filename=filename, co_consts=consts)


def cached_compiler(compile_source, folder: str):
    """zipimport._compile_source(pathname, source), kept per source under folder."""
    magic = importlib.util.MAGIC_NUMBER

    def compile_cached(pathname, source):
        # Here, not at start-up: every Python the host starts imports this file.
        import hashlib
        import marshal

        digest = hashlib.blake2b(magic + bytes(source), digest_size=20).hexdigest()
        entry = os.path.join(folder, digest)
        try:
            with open(entry, "rb") as handle:
                # Written by this host's root into a folder only root writes (install_into).
                code = marshal.loads(handle.read())  # noqa: S302
            if isinstance(code, types.CodeType):
                return _renamed(code, pathname)
        except Exception:  # noqa: S110 - a missing or damaged entry is compiled again
            pass
        code = compile_source(pathname, source)
        partial = f"{entry}.{os.getpid()}.partial"
        try:
            with open(partial, "wb") as handle:
                handle.write(marshal.dumps(code))
            os.replace(partial, entry)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(partial)
        return code

    return compile_cached


def install(folder: str = CACHE_DIR) -> bool:
    """Route zipimport's compiling through the cache, once per process."""
    current = zipimport._compile_source
    if getattr(current, "kimi_test_bytecode", False) or not os.path.isdir(folder):
        return False
    cached = cached_compiler(current, folder)
    cached.kimi_test_bytecode = True
    zipimport._compile_source = cached
    return True


def install_into(site_packages, cache_dir) -> None:
    """Put this file, its bytecode and its .pth line into a host's site-packages folder (seen
    from here), and create the cache folder the host's root writes. The bytecode is written
    here so that the host's first Python does not add it to the host's files mid-test."""
    import py_compile
    from pathlib import Path

    site_packages, cache_dir = Path(site_packages), Path(cache_dir)
    site_packages.mkdir(parents=True, exist_ok=True)
    module = site_packages / f"{MODULE_NAME}.py"
    module.write_text(Path(__file__).read_text())
    py_compile.compile(
        str(module), cfile=importlib.util.cache_from_source(str(module)), doraise=True
    )
    (site_packages / PTH_NAME).write_text(f"import {MODULE_NAME}; {MODULE_NAME}.install()\n")
    cache_dir.mkdir(parents=True, exist_ok=True)
    cache_dir.chmod(0o755)
