"""A bytecode cache for what a test host's Python compiles: imports from zip archives, and
the files pip and ensurepip compile into a new venv.

tests/support/testhosts.py installs this file into every test host's system Python and has
every Python of the host (a venv's too) load it at start-up, from the host's sitecustomize.py
where the distribution links that file into /etc (Debian, Ubuntu), or else from a .pth line that
only the system Python reads (`install_into`). It touches nothing of this machine.

Why: Ansible runs each module on a host as an AnsiballZ payload, a zip archive from which the
host's Python imports ansible.module_utils (about 400 KB of source). zipimport keeps no
bytecode: every task compiled all of it anew, twice over (Python 3.11's zipimporter reads and
compiles a module once to name its file and once to run it; the second call now takes the
first's code). On the test hosts that was half of every module's CPU, and the suite runs
thousands of modules on two cores. And every venv the roles create compiles pip and
setuptools (ensurepip, about 700 files: half of the 3 CPU-seconds a venv takes), every pip
install the files it installs: the same sources on every host, in every test. Real hosts pay
it too; the kit cannot change that, the test harness can.

What: the code a source compiles to is kept under CACHE_DIR, one file per source digest, Python
bytecode version and optimization level, and loaded from there the next time, with the file
names put back into it (each task's payload and each venv has paths of its own), so tracebacks,
__file__ and the .pyc files pip writes read as without the cache. The test hosts share one such
folder (testhosts.py binds it at CACHE_DIR on each): what one host compiled, the next loads.
Anything that goes wrong (a folder the user cannot write, a damaged entry) falls back to
compiling: the cache can only save time.
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


# Set while _cached runs: what it imports may need compiling too (hashlib under -OO on a Python
# that ships no .opt-2.pyc, Debian's), and that compile goes straight to the compiler.
_busy = False


def _cached(folder: str, key: bytes, filename: str, compile_now):
    """The code of key's source, from folder, under filename; else compile_now(), kept."""
    global _busy
    if _busy:
        return compile_now()
    _busy = True
    try:
        return _cached_once(folder, key, filename, compile_now)
    finally:
        _busy = False


def _cached_once(folder: str, key: bytes, filename: str, compile_now):
    # Here, not at start-up: every Python the host starts imports this file.
    import hashlib
    import marshal

    entry = os.path.join(folder, hashlib.blake2b(key, digest_size=20).hexdigest())
    try:
        with open(entry, "rb") as handle:
            # Written by a host's root into a folder only root writes (install_into).
            code = marshal.loads(handle.read())  # noqa: S302
        if isinstance(code, types.CodeType):
            return _renamed(code, filename)
    except Exception:  # noqa: S110 - a missing or damaged entry is compiled again
        pass
    code = compile_now()
    # Hosts share the folder and each has its own process ids: the name must not meet another's.
    partial = f"{entry}.{os.getpid()}.{os.urandom(6).hex()}.partial"
    try:
        with open(partial, "wb") as handle:
            handle.write(marshal.dumps(code))
        os.replace(partial, entry)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(partial)
    return code


def cached_compiler(compile_source, folder: str):
    """zipimport._compile_source(pathname, source), kept per source under folder."""
    magic = importlib.util.MAGIC_NUMBER

    def compile_cached(pathname, source):
        return _cached(
            folder, magic + bytes(source), pathname, lambda: compile_source(pathname, source)
        )

    return compile_cached


def remembered_module_code(get_module_code):
    """zipimport._get_module_code(importer, fullname), which an import from a zip archive asks
    for twice (zipimporter.get_filename names the spec's file, get_code runs it), each time
    reading, decompressing and compiling the source: the second call takes the first's code.
    Once: a third call reads the archive again."""
    first = {}

    def module_code(importer, fullname):
        key = (importer.archive, importer.prefix, fullname)
        found = first.pop(key, None)
        if found is None:
            found = first[key] = get_module_code(importer, fullname)
        return found

    return module_code


def cached_source_to_code(source_to_code, folder: str):
    """SourceLoader.source_to_code(data, path, _optimize), what imports of a .py file without
    its .pyc, py_compile and so compileall (pip, ensurepip) compile with, kept per source and
    optimization level under folder. A str source (no coding cookie read) is compiled as is."""
    magic = importlib.util.MAGIC_NUMBER

    def source_to_code_cached(self, data, path, *, _optimize=-1):
        def compile_now():
            return source_to_code(self, data, path, _optimize=_optimize)

        if not isinstance(data, (bytes, bytearray)) or not isinstance(path, str):
            return compile_now()
        import sys

        level = sys.flags.optimize if _optimize == -1 else _optimize
        key = magic + b"source_to_code optimize=%d\n" % level + bytes(data)
        return _cached(folder, key, path, compile_now)

    return source_to_code_cached


def install(folder: str = CACHE_DIR) -> bool:
    """Route zipimport's and the source loader's compiling through the cache, once per
    process."""
    from importlib import _bootstrap_external

    current = zipimport._compile_source
    if getattr(current, "kimi_test_bytecode", False) or not os.path.isdir(folder):
        return False
    cached = cached_compiler(current, folder)
    cached.kimi_test_bytecode = True
    zipimport._compile_source = cached
    zipimport._get_module_code = remembered_module_code(zipimport._get_module_code)
    loader = _bootstrap_external.SourceLoader
    loader.source_to_code = cached_source_to_code(loader.source_to_code, folder)
    return True


# What a host's sitecustomize.py gains: this file, loaded by path (a venv's Python has no
# site-packages of the system's on its path, and must not), then install().
SITECUSTOMIZE = """
# The test harness's bytecode cache (tests/support/host_bytecode.py); written by
# tests/support/testhosts.py into this test host's own /etc.
def _kimi_test_bytecode():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location({name!r}, {path!r})
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[{name!r}] = module
    module.install({folder!r})


try:
    _kimi_test_bytecode()
except Exception:  # noqa: S110 - the cache only saves time
    pass
"""


def install_into(site_packages, cache_dir, pth: bool = True) -> None:
    """Put this file and its bytecode into a host's site-packages folder (seen from here),
    with the .pth line by which the host's system Python loads it (pth), and create the cache
    folder the host's root writes. The bytecode is written here so that the host's first
    Python does not add it to the host's files mid-test."""
    import py_compile
    from pathlib import Path

    site_packages, cache_dir = Path(site_packages), Path(cache_dir)
    site_packages.mkdir(parents=True, exist_ok=True)
    module = site_packages / f"{MODULE_NAME}.py"
    module.write_text(Path(__file__).read_text())
    py_compile.compile(
        str(module), cfile=importlib.util.cache_from_source(str(module)), doraise=True
    )
    if pth:
        (site_packages / PTH_NAME).write_text(f"import {MODULE_NAME}; {MODULE_NAME}.install()\n")
    cache_dir.mkdir(parents=True, exist_ok=True)
    cache_dir.chmod(0o755)


def write_sitecustomize(target, original, module_path: str, folder: str = CACHE_DIR) -> None:
    """target (a host's own copy of its system Python's sitecustomize.py, seen from here):
    the original file's text, then SITECUSTOMIZE loading this file from module_path (where the
    host sees what install_into put there), so that every Python of the host, a venv's too,
    installs the cache over folder."""
    from pathlib import Path

    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = Path(original).read_text() if Path(original).is_file() else ""
    target.write_text(
        text + SITECUSTOMIZE.format(name=MODULE_NAME, path=module_path, folder=folder)
    )
