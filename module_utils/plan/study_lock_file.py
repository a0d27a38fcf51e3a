"""The study lock file (kimi.lock.yml): what every moving reference of a study resolved to, and
the frozen runtime package sets; checking, reading and writing it. study_lock.py resolves and
records its entries for library/study_lock.py; both run on the controller.

A study reruns months later on other hardware only if it gets the same weights, prompts and
runtime: `main` of a hub repository, a pull-request ref of SGLang and every package pip picks
for a transitive requirement move. The lock holds, per moving reference, what it was asked for
(`requested`) and the commit it resolved to; plan.yml resolves them, and the first run without
a lock records what it used. A run whose settings ask for something else than the lock was made
from fails, naming the entry, both values and the fix, rather than quietly follow one of them.

The file is the user's (committed beside the inventory), so it is read as outside input: its
size, every key and value are checked. Writers take an exclusive flock on the lock's folder,
read, change, and replace the file atomically, so hosts recording at once never lose an entry.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import tempfile
import urllib.parse

import yaml
from ansible.module_utils.host.helpers import TooLarge, flock_within, read_bounded

LOCK_VERSION = 1
MAX_LOCK_BYTES = 8 << 20
MAX_ENTRIES = 256
MAX_PACKAGES = 8192
MAX_TEXT = 1024
# The lock's deepest value is 4 levels down (runtime.<kind>.built_from.<package>).
MAX_DEPTH = 16
SHA = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")
# What pip accepts as a version, and no more: a value that reaches a requirements line.
VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]{0,63}")
PYTHON = re.compile(r"\d+\.\d+(\.\d+)?([a-z]+\d*)?\+?")
PLATFORM_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
PACKAGE = re.compile(r"[a-z0-9]([a-z0-9-]{0,198}[a-z0-9])?")
RUNTIME_KINDS = ("release", "git")
# Beside a frozen set: where its hashes hold (a wheel is per machine architecture and Python).
PLATFORM_KEYS = ("driver", "driver_cuda", "machine")
SECTIONS = ("weights", "datasets", "git", "runtime")
HASH_STATES = ("complete", "partial", "none")
FLOCK_WAIT_S = 300
UPDATE_FIX = "ansible-playbook plan.yml -i <your inventory> -e kimi_lock_update=true"

HEADER = """\
# The study lock: what every moving reference of this study resolved to (the hub commits of
# the weights and of the prompt datasets, the SGLang git commit) and the runtime package sets
# frozen after the first build. deploy_kimi.yml and benchmark_kimi.yml follow it. Written by
# plan.yml (or by the first run without one); keep it with your inventory, and refresh it with
#   ansible-playbook plan.yml -i inventory/<profile> -e kimi_lock_update=true
"""


class LockError(Exception):
    """The lock cannot be read, or does not fit the run: the message says what and how to fix."""


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def canonical_package(name: str) -> str:
    """PEP 503's normal form, as pip compares names."""
    return re.sub(r"[-_.]+", "-", str(name)).lower()


def empty_lock() -> dict:
    return {"lock_version": LOCK_VERSION, "weights": {}, "datasets": {}, "git": {}, "runtime": {}}


# -- reading and checking ------------------------------------------------------------------


def checked_text(value, where: str, pattern: re.Pattern | None = None, empty_ok=False) -> str:
    if not isinstance(value, str) or (not value and not empty_ok) or len(value) > MAX_TEXT:
        raise LockError(f"{where} is {shown(value)}; needed a string (at most {MAX_TEXT} chars)")
    if pattern is not None and not pattern.fullmatch(value):
        raise LockError(f"{where} is {shown(value)}; needed one like {_example(pattern)}")
    return value


def shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _example(pattern: re.Pattern) -> str:
    return {
        SHA.pattern: "a 40-character commit SHA",
        SHA256.pattern: "a 64-character sha256",
        VERSION.pattern: "a package version such as 2.14.1",
        PYTHON.pattern: "a Python version such as 3.12.3",
        PLATFORM_VALUE.pattern: "a version or name such as 580.65.06 or x86_64",
        REPO_ID.pattern: "owner/name",
        PACKAGE.pattern: "a package name in PEP 503 form (torch, nvidia-cuda-runtime-cu12)",
    }.get(pattern.pattern, pattern.pattern)


def checked_mapping(value, where: str, limit: int = MAX_ENTRIES) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise LockError(f"{where} is {type(value).__name__}; needed a mapping")
    if len(value) > limit:
        raise LockError(f"{where} has {len(value)} entries; at most {limit} are read")
    return value


def _hub_entry(entry, where: str) -> dict:
    entry = checked_mapping(entry, where)
    return {
        "requested": checked_text(entry.get("requested"), f"{where}.requested"),
        "revision": checked_text(entry.get("revision"), f"{where}.revision", SHA),
        "resolved_at": checked_text(
            entry.get("resolved_at", ""), f"{where}.resolved_at", empty_ok=True
        ),
    }


def _git_entry(entry, where: str) -> dict:
    entry = checked_mapping(entry, where)
    checked = {
        "url": checked_text(entry.get("url"), f"{where}.url"),
        "ref": checked_text(entry.get("ref"), f"{where}.ref"),
        "commit": checked_text(entry.get("commit"), f"{where}.commit", SHA),
        "resolved_at": checked_text(
            entry.get("resolved_at", ""), f"{where}.resolved_at", empty_ok=True
        ),
    }
    for key in ("url", "ref"):
        if checked[key].lstrip().startswith("-"):
            raise LockError(f"{where}.{key} begins with '-', which git would take for an option")
    check_no_credentials(checked["url"], where)
    return checked


def check_no_credentials(url: str, where: str) -> None:
    """A URL with a user or password in it would put a secret into a file meant to be
    committed (and into every run.json)."""
    try:
        parts = urllib.parse.urlsplit(url)
        secret = parts.password or (parts.username and parts.scheme in ("http", "https"))
    except ValueError:
        secret = False
    if secret:
        raise LockError(
            f"{where}.url carries credentials (user:password@); the study lock is meant to be "
            "committed. Fix: drop them from kimi_sglang_git.url and give git a credential "
            "helper (git config credential.helper) or an SSH key on the hosts"
        )


def check_runtime(entry, where: str) -> dict:
    """One frozen runtime set (runtime.<kind>), checked and in canonical form."""
    entry = checked_mapping(entry, where)
    built_from = checked_mapping(entry.get("built_from"), f"{where}.built_from")
    if not built_from:
        raise LockError(f"{where}.built_from is empty; needed the sglang version or git commit")
    packages = {}
    for given, item in checked_mapping(
        entry.get("packages"), f"{where}.packages", MAX_PACKAGES
    ).items():
        name = checked_text(
            canonical_package(given) if isinstance(given, str) else given, where, PACKAGE
        )
        if name in packages:
            raise LockError(f"{where}.packages lists {name} twice (as {given!r} too)")
        item = checked_mapping(item, f"{where}.packages.{name}")
        sha256 = item.get("sha256")
        packages[name] = {
            "version": checked_text(
                item.get("version"), f"{where}.packages.{name}.version", VERSION
            ),
            "sha256": None
            if sha256 is None
            else checked_text(sha256, f"{where}.packages.{name}.sha256", SHA256),
        }
    if not packages:
        raise LockError(f"{where}.packages is empty; needed the venv's package list")
    hashed = sum(1 for item in packages.values() if item["sha256"])
    platform = checked_mapping(entry.get("platform"), f"{where}.platform")
    return {
        "built_from": _plain(built_from, f"{where}.built_from"),
        "python": checked_text(entry.get("python"), f"{where}.python", PYTHON),
        "platform": {
            key: None
            if platform.get(key) is None
            else checked_text(platform[key], f"{where}.platform.{key}", PLATFORM_VALUE)
            for key in PLATFORM_KEYS
        },
        "recorded_from": checked_text(
            entry.get("recorded_from", ""), f"{where}.recorded_from", empty_ok=True
        ),
        "recorded_at": checked_text(
            entry.get("recorded_at", ""), f"{where}.recorded_at", empty_ok=True
        ),
        "hashes": "complete" if hashed == len(packages) else ("partial" if hashed else "none"),
        "packages": dict(sorted(packages.items())),
    }


def _plain(value, where: str, depth: int = 0):
    """Strings, numbers, booleans, lists and mappings of them, bounded: built_from's shape."""
    if depth > 4:
        raise LockError(f"{where} is nested too deeply")
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return checked_text(value, where, empty_ok=True)
    if isinstance(value, list) and len(value) <= 64:
        return [_plain(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]
    if isinstance(value, dict) and len(value) <= 64:
        return {str(k): _plain(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
    raise LockError(f"{where} is {shown(value)}; needed plain values")


def check_lock(data, path: str) -> dict:
    """The lock's content, checked; LockError names the entry and the fix."""
    if not isinstance(data, dict):
        raise LockError(f"{path} holds {type(data).__name__}, not a mapping")
    version = data.get("lock_version")
    if version != LOCK_VERSION:
        raise LockError(
            f"{path} has lock_version {shown(version)}; this kit reads {LOCK_VERSION}. "
            f"Fix: {UPDATE_FIX} (writes it anew)"
        )
    unknown = sorted(set(data) - {"lock_version", "written_at", *SECTIONS})
    if unknown:
        raise LockError(f"{path} has keys this kit does not know: {', '.join(map(str, unknown))}")
    lock = empty_lock()
    if data.get("written_at") is not None:
        lock["written_at"] = checked_text(data["written_at"], "written_at")
    for section in ("weights", "datasets"):
        for repo, entry in checked_mapping(data.get(section), section).items():
            repo = checked_text(repo, f"{section} key", REPO_ID)
            lock[section][repo] = _hub_entry(entry, f"{section}.{repo}")
    for name, entry in checked_mapping(data.get("git"), "git").items():
        name = checked_text(name, "git key", PACKAGE)
        lock["git"][name] = _git_entry(entry, f"git.{name}")
    for kind, entry in checked_mapping(data.get("runtime"), "runtime").items():
        if kind not in RUNTIME_KINDS:
            raise LockError(f"runtime.{shown(kind)}: needed one of {', '.join(RUNTIME_KINDS)}")
        lock["runtime"][kind] = check_runtime(entry, f"runtime.{kind}")
    return lock


class _LockLoader(yaml.SafeLoader):
    """The safe loader without aliases and with a bound on nesting: the kit writes neither,
    and a lock of a few hundred bytes whose aliases expand to millions of items stalled every
    run (each playbook reads the lock first), while thousands of nested brackets overflowed
    Python's stack. Pure Python, so that its composer is the one bounded here."""

    _depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(
                None, None, "an alias (*name), which a study lock never holds", mark
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"values nested deeper than {MAX_DEPTH}, which a study lock never is",
                    self.peek_event().start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load(path: str) -> dict | None:
    """The lock at path, checked, or None when there is none."""
    try:
        raw = read_bounded(path, MAX_LOCK_BYTES)
    except TooLarge:
        raise LockError(
            f"{path} is larger than {MAX_LOCK_BYTES >> 20} MiB; it is not a study lock"
        ) from None
    except OSError as error:
        raise LockError(f"{path} cannot be read: {error.strerror}") from error
    if raw is None:
        return None
    try:
        data = yaml.load(raw.decode("utf-8"), Loader=_LockLoader)  # noqa: S506 - a safe loader
    except (UnicodeDecodeError, yaml.YAMLError) as error:
        raise LockError(
            f"{path} is not a study lock's YAML: {str(error)[:300]}. Fix: {UPDATE_FIX}"
        ) from error
    try:
        return check_lock(data, path)
    except LockError as error:
        raise LockError(
            f"{path}: {error}. Fix the entry by hand, or write the lock anew: {UPDATE_FIX}"
        ) from None


def dump(lock: dict) -> str:
    body = {key: lock[key] for key in ("lock_version", "written_at", *SECTIONS) if key in lock}
    return HEADER + yaml.safe_dump(body, sort_keys=True, default_flow_style=False, width=100)


def lock_content(lock: dict | None) -> dict | None:
    """What a lock says, without when it was written: two equal contents need no write."""
    if lock is None:
        return None
    return {key: value for key, value in lock.items() if key != "written_at"}


def _unwritable(path: str, error: OSError) -> LockError:
    return LockError(
        f"{path} cannot be written ({error.strerror or error}). Needed: a folder this user can "
        "write. Fix: set kimi_lock_file to such a path (for AWX, one that outlives the job)"
    )


@contextlib.contextmanager
def locked_folder(path: str, wait_s: float = FLOCK_WAIT_S):
    """An exclusive flock on a hidden file beside the lock (a writable fd: NFS emulates flock
    with fcntl locks, which need one), waited for at most wait_s."""
    folder, name = os.path.split(os.path.abspath(path))
    try:
        os.makedirs(folder, mode=0o755, exist_ok=True)
        fd = os.open(os.path.join(folder, f".{name}.flock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise _unwritable(path, error) from error
    try:
        try:
            held = flock_within(fd, wait_s, poll_s=0.2)
        except OSError as error:
            raise _unwritable(path, error) from error
        if not held:
            raise LockError(
                f"another run has held {path} for over {wait_s:.0f} s (its flock on "
                f"{folder}/.{name}.flock). Fix: wait for it to end, then rerun"
            )
        yield
    finally:
        os.close(fd)


def write(path: str, lock: dict) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    lock["written_at"] = utc_now()
    try:
        fd, temporary = tempfile.mkstemp(prefix=".kimi-lock-", dir=folder)
    except OSError as error:
        raise _unwritable(path, error) from error
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(dump(lock))
            handle.flush()
            os.fsync(handle.fileno())
        # Nothing secret is in it; others reading the study's lock is the point.
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(error, OSError):
            raise _unwritable(path, error) from error
        raise
