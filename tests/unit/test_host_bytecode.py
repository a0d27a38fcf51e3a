"""The test hosts' bytecode cache for zip imports (tests/support/host_bytecode.py): the code
that runs is the code compiling gives, with each archive's own file names; a damaged entry or
a folder that cannot be written only costs the compile."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support import host_bytecode

MODULE = """\
VALUE = sum(range(10))


def fails():
    raise ValueError("from the archive")


class Nested:
    def method(self):
        return [lambda: __file__][0]()
"""

# Imports the module from the archive in a Python of its own, with the cache installed over
# the folder given, and prints what the module gives and where its code says it comes from.
PROBE = """\
import sys, traceback
sys.path.insert(0, {support!r})
import host_bytecode
print(host_bytecode.install({folder!r}))
sys.path.insert(0, {archive!r})
import payload.module as module
print(module.VALUE, module.Nested().method())
try:
    module.fails()
except ValueError:
    print(traceback.extract_tb(sys.exc_info()[2])[-1].filename)
print(module.Nested.method.__code__.co_filename)
"""


def archive(folder: Path, name: str) -> Path:
    path = folder / f"{name}.zip"
    with zipfile.ZipFile(path, "w") as zipped:
        zipped.writestr("payload/__init__.py", "")
        zipped.writestr("payload/module.py", MODULE)
    return path


def probe(cache: Path, zipped: Path) -> list[str]:
    code = PROBE.format(
        support=str(Path(host_bytecode.__file__).parent), folder=str(cache), archive=str(zipped)
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_a_second_import_runs_the_cached_code_under_its_own_archive_s_names(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    first, second = archive(tmp_path, "first"), archive(tmp_path, "second")
    source = f"{first}/payload/module.py"
    assert probe(cache, first) == ["True", f"45 {source}", source, source]
    # One entry per source compiled: the package's __init__ and the module.
    entries = sorted(cache.iterdir())
    assert len(entries) == 2
    stamps = [entry.stat().st_mtime_ns for entry in entries]
    source = f"{second}/payload/module.py"
    assert probe(cache, second) == ["True", f"45 {source}", source, source]
    # Read, not written again.
    assert [entry.stat().st_mtime_ns for entry in sorted(cache.iterdir())] == stamps


def test_a_damaged_entry_is_compiled_again_and_replaced(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    zipped = archive(tmp_path, "payload")
    expected = probe(cache, zipped)
    for entry in cache.iterdir():
        entry.write_bytes(b"\x00not marshal data")
    assert probe(cache, zipped) == expected
    for entry in cache.iterdir():
        assert entry.read_bytes() != b"\x00not marshal data"


def test_without_its_folder_nothing_is_cached_and_imports_work(tmp_path):
    zipped = archive(tmp_path, "payload")
    source = f"{zipped}/payload/module.py"
    assert probe(tmp_path / "missing", zipped) == ["False", f"45 {source}", source, source]


ONCE_PROBE = """\
import sys, zipimport
sys.path.insert(0, {support!r})
import host_bytecode
host_bytecode.install({folder!r})
compiled = []
cached = zipimport._compile_source
zipimport._compile_source = lambda path, source: compiled.append(path) or cached(path, source)
sys.path.insert(0, {archive!r})
import payload.module as module
print(module.VALUE, module.__file__ == module.__spec__.origin)
print(*compiled, sep="\\n")
"""


def test_a_module_imported_from_an_archive_is_compiled_once(tmp_path):
    """zipimporter asks for a module's code to name its file and again to run it: the cache
    is asked once per source, so a payload's modules are read and unmarshalled once."""
    zipped = archive(tmp_path, "payload")
    code = ONCE_PROBE.format(
        support=str(Path(host_bytecode.__file__).parent),
        folder=str(tmp_path / "cache"),
        archive=str(zipped),
    )
    (tmp_path / "cache").mkdir()
    for _ in range(2):  # compiled, then loaded from the cache: once each time
        done = subprocess.run(
            [sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            "45 True",
            f"{zipped}/payload/__init__.py",
            f"{zipped}/payload/module.py",
        ]


def test_install_into_a_host_s_site_packages_writes_the_module_its_pth_line_and_the_folder(
    tmp_path,
):
    site, cache = tmp_path / "usr/local/lib/python3/dist-packages", tmp_path / "var/cache/b"
    host_bytecode.install_into(site, cache)
    assert (site / "kimi_test_bytecode.py").read_text() == Path(host_bytecode.__file__).read_text()
    assert (site / "kimi-test-bytecode.pth").read_text() == (
        "import kimi_test_bytecode; kimi_test_bytecode.install()\n"
    )
    assert cache.is_dir() and oct(cache.stat().st_mode & 0o777) == "0o755"
    # Its bytecode is there before the host's first Python would write it.
    assert Path(importlib.util.cache_from_source(str(site / "kimi_test_bytecode.py"))).is_file()


def test_the_playbooks_the_tests_run_cache_their_controller_modules_bytecode(tmp_path):
    """run_playbook's environment puts tests/support/controller_site on PYTHONPATH: a Python
    it starts (a module delegated to localhost) has the cache installed over the folder named."""
    from tests.support.ansible_run import controller_bytecode

    env = {**os.environ, **controller_bytecode(), "KIT_TEST_BYTECODE_DIR": str(tmp_path)}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import zipimport; print(getattr(zipimport._compile_source, 'kimi_test_bytecode', 0))",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "True", done.stderr


# Compiles the same source at two paths with py_compile (as pip's and ensurepip's compileall
# do) in a Python of its own with the cache over the folder given, then runs each .pyc.
COMPILE_PROBE = """\
import importlib.util, marshal, py_compile, sys
sys.path.insert(0, {support!r})
import host_bytecode
print(host_bytecode.install({folder!r}))
for source in {sources!r}:
    compiled = py_compile.compile(source, doraise=True)
    with open(compiled, "rb") as handle:
        code = marshal.loads(handle.read()[16:])
    print(code.co_filename)
    namespace = {{"__file__": source}}
    exec(code, namespace)
    print(namespace["VALUE"], namespace["Nested"]().method.__code__.co_filename)
"""


def compile_probe(cache: Path, sources: list[Path]) -> list[str]:
    code = COMPILE_PROBE.format(
        support=str(Path(host_bytecode.__file__).parent),
        folder=str(cache),
        sources=[str(s) for s in sources],
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [line.strip() for line in done.stdout.splitlines()]


def test_py_compile_of_the_same_source_elsewhere_writes_that_files_names(tmp_path):
    """What pip and ensurepip compile into each venv: the second venv's files load the first's
    code, under their own names, and the .pyc they get runs as compiled."""
    cache = tmp_path / "cache"
    cache.mkdir()
    first, second = tmp_path / "venv-a" / "module.py", tmp_path / "venv-b" / "module.py"
    for path in (first, second):
        path.parent.mkdir()
        path.write_text(MODULE)
    assert compile_probe(cache, [first]) == ["True", str(first), f"45 {first}"]
    entries = sorted(cache.iterdir())
    assert len(entries) == 1
    stamp = entries[0].stat().st_mtime_ns
    assert compile_probe(cache, [second]) == ["True", str(second), f"45 {second}"]
    # Read, not written again.
    assert sorted(cache.iterdir()) == entries and entries[0].stat().st_mtime_ns == stamp
    # Another optimization level is another entry (its code differs: no asserts, no docstrings).
    done = subprocess.run(
        [sys.executable, "-I", "-OO", "-c", COMPILE_PROBE.format(
            support=str(Path(host_bytecode.__file__).parent), folder=str(cache),
            sources=[str(second)],
        )],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(list(cache.iterdir())) == 2


def test_a_source_that_does_not_compile_fails_as_without_the_cache(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    broken = tmp_path / "broken.py"
    broken.write_text("def broken(:\n")
    code = (
        f"import sys; sys.path.insert(0, {str(Path(host_bytecode.__file__).parent)!r}); "
        f"import host_bytecode, py_compile; host_bytecode.install({str(cache)!r}); "
        f"py_compile.compile({str(broken)!r}, doraise=True)"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "SyntaxError" in done.stderr, done.stderr
    assert f'File "{broken}", line 1' in done.stderr
    assert not list(cache.iterdir())


def test_a_hosts_sitecustomize_keeps_the_original_and_installs_the_cache_in_every_python(
    tmp_path,
):
    """Where the system Python's sitecustomize.py is the host's own copy (Debian links it into
    /etc): the distribution's lines stay, and a Python that reads it, a venv's too (it has no
    site-packages of the system's), installs the cache from the file install_into wrote."""
    site, cache = tmp_path / "usr/local/lib/python3/dist-packages", tmp_path / "var/cache/b"
    host_bytecode.install_into(site, cache, pth=False)
    assert not (site / host_bytecode.PTH_NAME).exists()
    original = tmp_path / "original-sitecustomize.py"
    original.write_text("ORIGINAL_LINE = 1\n")
    target = tmp_path / "etc/python3/sitecustomize.py"
    # The cache folder is CACHE_DIR on a host; this machine has none.
    host_bytecode.write_sitecustomize(
        target, original, str(site / "kimi_test_bytecode.py"), folder=str(cache)
    )
    assert target.read_text().startswith("ORIGINAL_LINE = 1\n")
    probe = (
        "import sitecustomize, sys, zipimport; "
        "print(sitecustomize.ORIGINAL_LINE, sys.modules['kimi_test_bytecode'].__file__, "
        "getattr(zipimport._compile_source, 'kimi_test_bytecode', 0))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": str(target.parent)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", str(site / "kimi_test_bytecode.py"), "True"]
