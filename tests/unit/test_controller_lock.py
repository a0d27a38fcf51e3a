"""The controller's locks: exact, hashed, split, and installable on every supported Python.

Only one Python (3.11) exists on the machines that run the tests, and no registry here serves
interpreters, so the other controller Pythons are proven by resolution: pip resolves each lock
for a target Python from wheels only (--python-version, --only-binary), checking every file
against the lock's hashes and following every dependency (without --no-deps), so a missing
dependency, a package with no wheel for that Python, or a wrong hash fails. It needs the
package index, with a deadline on every pip call.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.markers import Marker, default_environment
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
DEPLOY_LOCK = REPO / "requirements.lock"
DEV_LOCK = REPO / "requirements-dev.lock"
# The controllers `make setup` supports, as the Makefile names them.
CONTROLLER_PYTHONS = tuple(
    re.search(r"^CONTROLLER_PYTHONS := (.+)$", (REPO / "Makefile").read_text(), re.M)
    .group(1)
    .split()
)
PIP_TIMEOUT = 300

PIN = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;]+)\s*(?:;(?P<marker>.*))?$"
)
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class Entry:
    name: str
    version: str
    marker: str | None
    hashes: tuple[str, ...]
    text: str


def read_lock(path: Path) -> dict[str, list[Entry]]:
    """Entries by canonical name (a name may appear once per marker). Fails on any other form."""
    entries: dict[str, list[Entry]] = {}
    logical = ""
    lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
    for line in [*lines, ""]:
        if line.startswith((" ", "\t")):
            logical += " " + line.strip().rstrip("\\").strip()
            continue
        if logical:
            head, *options = logical.split(" --")
            found = PIN.match(head.strip())
            assert found, f"{path.name}: not an exact pin: {head!r}"
            options = [f"--{option.strip()}" for option in options]
            assert all(HASH.fullmatch(o) for o in options), f"{path.name}: {head}: {options}"
            name = canonicalize_name(found["name"])
            marker = found["marker"].strip() if found["marker"] else None
            entry = Entry(name, found["version"], marker, tuple(options), logical)
            entries.setdefault(name, []).append(entry)
        logical = line.rstrip("\\").strip()
    return entries


def direct_pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            pin = PIN.match(line)
            assert pin, f"{path.name}: direct dependencies are pinned exactly: {line!r}"
            found[canonicalize_name(pin["name"])] = pin["version"]
    return found


def target_environment(python: str) -> dict[str, str]:
    """Marker variables of a CPython `python` controller on this machine's OS and CPU."""
    env = default_environment()
    env.update(
        python_version=python,
        python_full_version=f"{python}.0",
        implementation_name="cpython",
        implementation_version=f"{python}.0",
        platform_python_implementation="CPython",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine=platform.machine(),
    )
    return env


def applicable(entries: dict[str, list[Entry]], python: str) -> dict[str, Entry]:
    env = target_environment(python)
    chosen = {}
    for name, forms in entries.items():
        kept = [e for e in forms if e.marker is None or Marker(e.marker).evaluate(env)]
        assert len(kept) <= 1, f"{name}: more than one entry applies on Python {python}"
        if kept:
            chosen[name] = kept[0]
    return chosen


def resolve(entries: dict[str, Entry], python: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """pip's resolution of `entries` for `python` from wheels and hashes, without installing.

    Markers are decided here for the target (pip would decide them for the Python it runs on),
    so pip gets plain pins and hashes.
    """
    requirements = tmp_path / f"lock-{python}.txt"
    requirements.write_text(
        "".join(f"{e.name}=={e.version} {' '.join(e.hashes)}\n" for e in entries.values())
    )
    command = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
        "--disable-pip-version-check", "--no-input", "--timeout", "60", "--retries", "2",
        "--only-binary=:all:", "--python-version", python, "--target", str(tmp_path / "target"),
        "--require-hashes", "--requirement", str(requirements),
        "--report", str(tmp_path / f"report-{python}.json"), "--quiet",
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT, check=False)


def test_every_entry_is_an_exact_pin_with_hashes():
    for path in (DEPLOY_LOCK, DEV_LOCK):
        entries = read_lock(path)
        assert entries, path.name
        assert all(e.hashes for forms in entries.values() for e in forms), path.name


def test_dev_lock_adds_only_what_the_deploy_lock_lacks():
    deploy, dev = read_lock(DEPLOY_LOCK), read_lock(DEV_LOCK)
    assert not set(deploy) & set(dev)
    # The tools of tests and lint stay out of what a controller that only deploys installs;
    # ansible-runner is the deploy lock's (the execution environment runs every job with it).
    assert {"pytest", "ansible-lint", "ruff", "yamllint"} <= set(dev)
    assert not {"pytest", "ansible-lint", "ruff", "yamllint"} & set(deploy)
    assert {"ansible-core", "ansible-runner", "dumb-init"} <= set(deploy)


def test_direct_dependencies_are_locked_at_their_pins():
    deploy, dev = read_lock(DEPLOY_LOCK), read_lock(DEV_LOCK)
    for source, lock in (("requirements.in", deploy), ("requirements-dev.in", {**deploy, **dev})):
        for name, version in direct_pins(REPO / source).items():
            assert [e.version for e in lock.get(name, [])] == [version], (source, name)


def test_no_collection_package_and_no_collection_used():
    """The `ansible` package (473 MB of collections) is left out because nothing uses one."""
    locked = set(read_lock(DEPLOY_LOCK)) | set(read_lock(DEV_LOCK))
    assert "ansible" not in locked
    fqcn = re.compile(
        r"^\s*(?:-\s+)?([a-z0-9_]+\.[a-z0-9_]+)\.[a-z0-9_]+:"  # a task's module
        r"|(?:lookup|query)\(\s*['\"]([a-z0-9_]+\.[a-z0-9_]+)\.[a-z0-9_]+['\"]"
        r"|\|\s*([a-z0-9_]+\.[a-z0-9_]+)\.[a-z0-9_]+\b"  # a filter or test
        r"|\bis\s+(?:not\s+)?([a-z0-9_]+\.[a-z0-9_]+)\.[a-z0-9_]+\b",
        re.MULTILINE,
    )
    skipped = {".state", "fixtures", ".venv", ".git"}
    files = [
        path
        for pattern in ("*.yml", "*.yaml", "*.j2")
        for path in REPO.rglob(pattern)
        if not skipped & set(path.relative_to(REPO).parts)
    ]
    assert len(files) > 20
    used = {
        collection
        for path in files
        for match in fqcn.finditer(path.read_text())
        for collection in match.groups()
        if collection
    }
    assert used <= {"ansible.builtin", "ansible.legacy"}, (
        "collections in use: add them to the locks"
    )


def test_check_fails_on_a_lock_missing_a_dependency(tmp_path):
    """The resolution below is a real check: jinja2 without its markupsafe does not resolve."""
    jinja2 = applicable(read_lock(DEPLOY_LOCK), "3.13")["jinja2"]
    result = resolve({"jinja2": jinja2}, "3.13", tmp_path)
    assert result.returncode != 0
    assert "markupsafe" in result.stderr.lower()


LOCK_SETS = {"deploy": (DEPLOY_LOCK,), "deploy+dev": (DEPLOY_LOCK, DEV_LOCK)}


# Each resolution costs seconds of CPU (pip hashes every wheel), so only the ones nothing else
# proves: `make setup` installs both locks on 3.11 for real (then `pip check`), so 3.11 checks
# the deploy lock alone, the environment of a controller that only deploys; 3.12 and 3.13 check
# both locks together, which holds every entry of each.
@pytest.mark.parametrize(
    ("python", "locks"), [("3.11", "deploy"), ("3.12", "deploy+dev"), ("3.13", "deploy+dev")]
)
def test_locks_resolve_from_wheels_and_hashes_on_each_controller_python(python, locks, tmp_path):
    entries = {}
    for path in LOCK_SETS[locks]:
        entries.update(read_lock(path))
    wanted = applicable(entries, python)
    result = resolve(wanted, python, tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads((tmp_path / f"report-{python}.json").read_text())
    chosen = {
        canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
        for item in report["install"]
    }
    assert chosen == {name: e.version for name, e in wanted.items()}
    files = [item["download_info"]["url"].rsplit("/", 1)[-1] for item in report["install"]]
    assert all(name.endswith(".whl") for name in files)
