"""The study lock (kimi.lock.yml): what every moving reference of a study resolved to, and the
frozen runtime package sets. The logic of library/study_lock.py; it runs on the controller.

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


def _text(value, where: str, pattern: re.Pattern | None = None, empty_ok=False) -> str:
    if not isinstance(value, str) or (not value and not empty_ok) or len(value) > MAX_TEXT:
        raise LockError(f"{where} is {_shown(value)}; needed a string (at most {MAX_TEXT} chars)")
    if pattern is not None and not pattern.fullmatch(value):
        raise LockError(f"{where} is {_shown(value)}; needed one like {_example(pattern)}")
    return value


def _shown(value) -> str:
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


def _mapping(value, where: str, limit: int = MAX_ENTRIES) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise LockError(f"{where} is {type(value).__name__}; needed a mapping")
    if len(value) > limit:
        raise LockError(f"{where} has {len(value)} entries; at most {limit} are read")
    return value


def _hub_entry(entry, where: str) -> dict:
    entry = _mapping(entry, where)
    return {
        "requested": _text(entry.get("requested"), f"{where}.requested"),
        "revision": _text(entry.get("revision"), f"{where}.revision", SHA),
        "resolved_at": _text(entry.get("resolved_at", ""), f"{where}.resolved_at", empty_ok=True),
    }


def _git_entry(entry, where: str) -> dict:
    entry = _mapping(entry, where)
    checked = {
        "url": _text(entry.get("url"), f"{where}.url"),
        "ref": _text(entry.get("ref"), f"{where}.ref"),
        "commit": _text(entry.get("commit"), f"{where}.commit", SHA),
        "resolved_at": _text(entry.get("resolved_at", ""), f"{where}.resolved_at", empty_ok=True),
    }
    for key in ("url", "ref"):
        if checked[key].lstrip().startswith("-"):
            raise LockError(f"{where}.{key} begins with '-', which git would take for an option")
    _no_credentials(checked["url"], where)
    return checked


def _no_credentials(url: str, where: str) -> None:
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
    entry = _mapping(entry, where)
    built_from = _mapping(entry.get("built_from"), f"{where}.built_from")
    if not built_from:
        raise LockError(f"{where}.built_from is empty; needed the sglang version or git commit")
    packages = {}
    for given, item in _mapping(entry.get("packages"), f"{where}.packages", MAX_PACKAGES).items():
        name = _text(canonical_package(given) if isinstance(given, str) else given, where, PACKAGE)
        if name in packages:
            raise LockError(f"{where}.packages lists {name} twice (as {given!r} too)")
        item = _mapping(item, f"{where}.packages.{name}")
        sha256 = item.get("sha256")
        packages[name] = {
            "version": _text(item.get("version"), f"{where}.packages.{name}.version", VERSION),
            "sha256": None
            if sha256 is None
            else _text(sha256, f"{where}.packages.{name}.sha256", SHA256),
        }
    if not packages:
        raise LockError(f"{where}.packages is empty; needed the venv's package list")
    hashed = sum(1 for item in packages.values() if item["sha256"])
    platform = _mapping(entry.get("platform"), f"{where}.platform")
    return {
        "built_from": _plain(built_from, f"{where}.built_from"),
        "python": _text(entry.get("python"), f"{where}.python", PYTHON),
        "platform": {
            key: None
            if platform.get(key) is None
            else _text(platform[key], f"{where}.platform.{key}", PLATFORM_VALUE)
            for key in PLATFORM_KEYS
        },
        "recorded_from": _text(
            entry.get("recorded_from", ""), f"{where}.recorded_from", empty_ok=True
        ),
        "recorded_at": _text(entry.get("recorded_at", ""), f"{where}.recorded_at", empty_ok=True),
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
        return _text(value, where, empty_ok=True)
    if isinstance(value, list) and len(value) <= 64:
        return [_plain(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]
    if isinstance(value, dict) and len(value) <= 64:
        return {str(k): _plain(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
    raise LockError(f"{where} is {_shown(value)}; needed plain values")


def check_lock(data, path: str) -> dict:
    """The lock's content, checked; LockError names the entry and the fix."""
    if not isinstance(data, dict):
        raise LockError(f"{path} holds {type(data).__name__}, not a mapping")
    version = data.get("lock_version")
    if version != LOCK_VERSION:
        raise LockError(
            f"{path} has lock_version {_shown(version)}; this kit reads {LOCK_VERSION}. "
            f"Fix: {UPDATE_FIX} (writes it anew)"
        )
    unknown = sorted(set(data) - {"lock_version", "written_at", *SECTIONS})
    if unknown:
        raise LockError(f"{path} has keys this kit does not know: {', '.join(map(str, unknown))}")
    lock = empty_lock()
    if data.get("written_at") is not None:
        lock["written_at"] = _text(data["written_at"], "written_at")
    for section in ("weights", "datasets"):
        for repo, entry in _mapping(data.get(section), section).items():
            repo = _text(repo, f"{section} key", REPO_ID)
            lock[section][repo] = _hub_entry(entry, f"{section}.{repo}")
    for name, entry in _mapping(data.get("git"), "git").items():
        name = _text(name, "git key", PACKAGE)
        lock["git"][name] = _git_entry(entry, f"git.{name}")
    for kind, entry in _mapping(data.get("runtime"), "runtime").items():
        if kind not in RUNTIME_KINDS:
            raise LockError(f"runtime.{_shown(kind)}: needed one of {', '.join(RUNTIME_KINDS)}")
        lock["runtime"][kind] = check_runtime(entry, f"runtime.{kind}")
    return lock


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
        data = yaml.safe_load(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as error:
        raise LockError(f"{path} is not valid YAML: {str(error)[:300]}") from error
    try:
        return check_lock(data, path)
    except LockError as error:
        raise LockError(
            f"{path}: {error}. Fix the entry by hand, or write the lock anew: {UPDATE_FIX}"
        ) from None


def dump(lock: dict) -> str:
    body = {key: lock[key] for key in ("lock_version", "written_at", *SECTIONS) if key in lock}
    return HEADER + yaml.safe_dump(body, sort_keys=True, default_flow_style=False, width=100)


def _content(lock: dict | None) -> dict | None:
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


# -- what a run asks for ---------------------------------------------------------------------


def merge_requested(requests: list) -> dict:
    """One {weights: {repo: revision}, datasets: {repo: revision}, git: {name: {url, ref}}}
    from every host's request; two hosts asking one repository at two revisions is an error."""
    merged: dict = {"weights": {}, "datasets": {}, "git": {}}
    for request in requests or []:
        request = _mapping(request, "a host's request")
        for section in ("weights", "datasets"):
            for repo, revision in _mapping(request.get(section), section).items():
                repo = _text(repo, f"{section} repository", REPO_ID)
                revision = _text(revision, f"{section}.{repo} revision")
                if merged[section].setdefault(repo, revision) != revision:
                    raise LockError(
                        f"two hosts of this run ask {repo} at different revisions "
                        f"({merged[section][repo]} and {revision}); one study pins one"
                    )
        for name, source in _mapping(request.get("git"), "git").items():
            source = _mapping(source, f"git.{name}")
            wanted = {
                "url": _text(source.get("url"), f"git.{name}.url"),
                "ref": _text(source.get("ref"), f"git.{name}.ref"),
            }
            _no_credentials(wanted["url"], f"kimi_sglang_git ({name})")
            if merged["git"].setdefault(name, wanted) != wanted:
                raise LockError(f"two hosts of this run ask different git sources for {name}")
    return merged


def merge_known(found: list, conflicts: list | None = None) -> dict:
    """One {weights: {repo: commit}, datasets: {repo: commit}, git: {name: commit}} from what
    every host resolved; the first host's commit stands (the lock holds one), and a host that
    resolved another one (a branch moved during the run) is added to `conflicts`."""
    merged: dict = {"weights": {}, "datasets": {}, "git": {}}
    for index, item in enumerate(found or []):
        item = _mapping(item, "what a host resolved")
        for section in merged:
            for name, commit in _mapping(item.get(section), section).items():
                if not isinstance(name, str) or not isinstance(commit, str):
                    continue
                if not SHA.fullmatch(commit):
                    continue
                kept = merged[section].setdefault(name, commit)
                if kept != commit and conflicts is not None:
                    conflicts.append(
                        f"{section} {name}: host {index + 1} of the run used {commit}, an earlier "
                        f"one {kept} (it moved during the run); the lock keeps {kept}"
                    )
    return merged


def mismatches(lock: dict, requested: dict) -> list[str]:
    """Entries the lock holds for other settings than this run's, each as a sentence."""
    found = []
    for section, setting in (("weights", "revision"), ("datasets", "revision")):
        for repo, revision in requested.get(section, {}).items():
            entry = lock[section].get(repo)
            if entry and revision not in (entry["requested"], entry["revision"]):
                found.append(
                    f"{section} {repo}: the lock was made from {entry['requested']} (commit "
                    f"{entry['revision']}), this run asks {setting} {revision}"
                )
    for name, source in requested.get("git", {}).items():
        entry = lock["git"].get(name)
        if not entry:
            continue
        if entry["url"] != source["url"]:
            found.append(
                f"git {name}: the lock has url {entry['url']}, this run asks {source['url']}"
            )
        elif source["ref"] not in (entry["ref"], entry["commit"]):
            found.append(
                f"git {name}: the lock was made from ref {entry['ref']} (commit "
                f"{entry['commit']}), this run asks {source['ref']}"
            )
    return found


def pins(lock: dict | None, requested: dict) -> dict:
    """The commits this run uses: the lock's, for what the run asks and the lock holds."""
    found: dict = {"weights": {}, "datasets": {}, "git": {}}
    if lock is None:
        return found
    for section in ("weights", "datasets"):
        for repo, revision in requested.get(section, {}).items():
            entry = lock[section].get(repo)
            if entry and revision in (entry["requested"], entry["revision"]):
                found[section][repo] = entry["revision"]
    for name, source in requested.get("git", {}).items():
        entry = lock["git"].get(name)
        if (
            entry
            and entry["url"] == source["url"]
            and source["ref"] in (entry["ref"], entry["commit"])
        ):
            found["git"][name] = {key: entry[key] for key in ("url", "ref", "commit")}
    return found


def missing(lock: dict | None, requested: dict) -> list[str]:
    """What the run asks that the lock does not pin yet, as `section name` strings."""
    lock = lock or empty_lock()
    return [
        f"{section} {name}"
        for section in ("weights", "datasets", "git")
        for name in requested.get(section, {})
        if name not in lock[section]
    ]


def mismatch_error(path: str, found: list[str]) -> LockError:
    return LockError(
        f"{path} does not fit this run's settings: " + "; ".join(found) + ". Needed: the "
        "settings the lock was made from, or a lock made from these. Fix: put the settings "
        "back, or run `ansible-playbook plan.yml -i <your inventory>`, which locks what "
        f"changed (or `{UPDATE_FIX}` to resolve everything anew)"
    )


# -- resolving and recording -----------------------------------------------------------------


def resolved_entries(
    lock: dict,
    requested: dict,
    known: dict,
    resolvers: dict,
    update: bool,
    now: str,
    unresolved: list | None = None,
) -> tuple[dict, list[dict]]:
    """A new lock with every requested entry pinned: kept where the lock has it for the same
    setting (unless `update`), taken from `known` (commits the caller already resolved, e.g.
    hub_repo_info's answers: {weights: {repo: sha}}), else resolved with resolvers[section]
    (callable(name, requested) -> commit). Returns the lock and what changed. With a list
    as `unresolved`, an entry that cannot be resolved is left out and its message added there
    (plan.yml says so and goes on); without, the LockError ends the call."""
    new = {key: (dict(value) if isinstance(value, dict) else value) for key, value in lock.items()}
    changes: list[dict] = []

    def commit_of(section: str, name: str, resolve, *args):
        try:
            return resolve(*args)
        except LockError as error:
            if unresolved is None:
                raise
            unresolved.append(f"{section} {name}: {error}")
            return None

    for section in ("weights", "datasets"):
        for repo, revision in requested.get(section, {}).items():
            entry = lock[section].get(repo)
            if entry and not update and revision in (entry["requested"], entry["revision"]):
                continue
            # A commit asked for is its own answer: pinning by SHA needs no hub.
            commit = revision if SHA.fullmatch(revision) else None
            commit = (
                commit
                or (known.get(section) or {}).get(repo)
                or commit_of(section, repo, resolvers[section], repo, revision)
            )
            if commit is None:
                continue
            commit = _text(commit, f"the commit {repo}@{revision} resolved to", SHA)
            if entry and entry["revision"] == commit and entry["requested"] == revision:
                continue
            new[section][repo] = {"requested": revision, "revision": commit, "resolved_at": now}
            changes.append(
                {
                    "entry": f"{section} {repo}",
                    "requested": revision,
                    "was": entry["revision"] if entry else None,
                    "now": commit,
                }
            )
    for name, source in requested.get("git", {}).items():
        entry = lock["git"].get(name)
        same_source = entry and entry["url"] == source["url"]
        if same_source and not update and source["ref"] in (entry["ref"], entry["commit"]):
            continue
        commit = source["ref"] if SHA.fullmatch(source["ref"]) else None
        commit = (
            commit
            or (known.get("git") or {}).get(name)
            or commit_of("git", name, resolvers["git"], source["url"], source["ref"])
        )
        if commit is None:
            continue
        commit = _text(commit, f"the commit {source['ref']} of {source['url']} resolved to", SHA)
        if same_source and entry["commit"] == commit and entry["ref"] == source["ref"]:
            continue
        new["git"][name] = {**source, "commit": commit, "resolved_at": now}
        changes.append(
            {
                "entry": f"git {name}",
                "requested": source["ref"],
                "was": entry["commit"] if entry else None,
                "now": commit,
            }
        )
    return new, changes


def change_lines(changes: list[dict]) -> list[str]:
    return [
        f"{c['entry']}: {c['requested']} -> {c['now']}"
        + (f" (was {c['was']})" if c["was"] and c["was"] != c["now"] else "")
        for c in changes
    ]


def sync(
    path: str,
    requested: dict,
    *,
    known: dict | None = None,
    resolvers: dict | None = None,
    mode: str = "read",
    update: bool = False,
    check_mode: bool = False,
    tolerate_mismatch: bool = False,
    runtime_built_from: dict | None = None,
) -> dict:
    """The lock against this run's settings.

    mode `read`: no resolving; a mismatch fails; returns the pins.
    mode `record`: adds what the run used (`known`) where the lock has nothing yet; a mismatch
        fails (the run followed other settings than the lock's).
    mode `resolve` (plan.yml): entries missing or made from other settings are resolved
        (`known` first, then the resolvers); with `update` every entry, and the frozen runtime
        sets are dropped (the next deploy freezes them anew); so is a frozen set whose source
        moved (the git commit relocked, or `runtime_built_from` naming another release).
    `tolerate_mismatch` (a plan without the hub): entries that do not fit are not pinned and
    are named in `unresolved` instead of failing."""
    resolvers = resolvers or {}
    known = known or {}
    unresolved: list[str] = []
    with locked_folder(path) if not check_mode and mode != "read" else contextlib.nullcontext():
        current = load(path)
        lock = current or empty_lock()
        if mode in ("read", "record"):
            found = mismatches(lock, requested)
            if found and not tolerate_mismatch:
                raise mismatch_error(path, found)
            unresolved += [f"{line} (plan.yml with the hub locks it)" for line in found]
        if mode == "read":
            return _answer(path, current, requested, False, [], unresolved)
        if mode == "record":
            wanted = {
                section: {
                    name: value for name, value in values.items() if name not in lock[section]
                }
                for section, values in requested.items()
            }
            wanted = {
                section: {
                    name: value
                    for name, value in values.items()
                    if name in (known.get(section) or {})
                }
                for section, values in wanted.items()
            }
            new, changes = resolved_entries(lock, wanted, known, {}, False, utc_now())
        else:
            new, changes = resolved_entries(
                lock, requested, known, resolvers, update, utc_now(), unresolved
            )
            stale = _stale_runtimes(new, changes, runtime_built_from or {}, update)
            for kind in stale:
                del new["runtime"][kind]
                changes.append(
                    {
                        "entry": f"runtime {kind}",
                        "requested": "dropped",
                        "was": None,
                        "now": "dropped",
                    }
                )
        # A record with nothing new writes nothing, not even an empty first lock.
        written = (current is None and (mode == "resolve" or bool(changes))) or (
            current is not None and _content(new) != _content(current)
        )
        if written and not check_mode:
            write(path, new)
        return _answer(path, new, requested, written, changes, unresolved)


def _stale_runtimes(lock: dict, changes: list, built_from: dict, update: bool) -> list[str]:
    """Frozen sets that no longer fit: all on update; the git one when its commit was relocked;
    one whose built_from differs from what the settings build now."""
    stale = []
    for kind, entry in lock["runtime"].items():
        relocked = kind == "git" and any(c["entry"] == "git sglang" for c in changes)
        wanted = built_from.get(kind)
        moved = isinstance(wanted, dict) and any(
            entry["built_from"].get(key) != value for key, value in wanted.items()
        )
        if update or relocked or moved:
            stale.append(kind)
    return stale


def _answer(
    path: str, lock: dict | None, requested: dict, written: bool, changes: list, unresolved: list
) -> dict:
    return {
        "unresolved": unresolved,
        "path": path,
        "exists": lock is not None,
        "written": written,
        "lock": lock or {},
        "pins": pins(lock, requested),
        "missing": missing(lock, requested),
        "changes": changes,
        "messages": change_lines(changes),
    }


def record_runtime(
    path: str, kind: str, record: dict, replace: bool = False, check_mode: bool = False
) -> dict:
    """Freezes a runtime set into the lock when it holds none for `kind` (or, with replace,
    one built from another source). Returns {recorded, runtime, path}."""
    if kind not in RUNTIME_KINDS:
        raise LockError(f"kind is {_shown(kind)}; needed one of {', '.join(RUNTIME_KINDS)}")
    entry = check_runtime({**record, "recorded_at": utc_now()}, f"the {kind} runtime record")
    with locked_folder(path) if not check_mode else contextlib.nullcontext():
        current = load(path)
        lock = current or empty_lock()
        held = lock["runtime"].get(kind)
        if held and not (replace and held["built_from"] != entry["built_from"]):
            return {"recorded": False, "runtime": held, "path": path}
        lock["runtime"][kind] = entry
        if not check_mode:
            write(path, lock)
        return {"recorded": True, "runtime": entry, "path": path}


# -- resolvers (the controller's network) ------------------------------------------------------


def ls_remote_commit(output: str, url: str, ref: str) -> str:
    """The commit `git ls-remote URL REF` names for ref: an exact ref first, then the branch
    or tag it abbreviates; an annotated tag's peeled commit (`^{}`) wins over the tag object."""
    found: dict[str, str] = {}
    for line in output.splitlines()[:10000]:
        parts = line.split("\t")
        if len(parts) == 2 and SHA.fullmatch(parts[0]):
            found[parts[1]] = parts[0]
    for name in (ref, f"refs/heads/{ref}", f"refs/tags/{ref}"):
        if f"{name}^{{}}" in found:
            return found[f"{name}^{{}}"]
        if name in found:
            return found[name]
    if not found:
        raise LockError(
            f"git ref {ref} was not found at {url}. Needed: an existing branch, tag, pull-request "
            "ref (refs/pull/N/head) or commit. Fix kimi_sglang_git.ref"
        )
    raise LockError(f"git ref {ref} at {url} is ambiguous: {', '.join(sorted(found)[:5])}")


def git_resolver(run, timeout_s: float):
    """resolver(url, ref) -> commit through `git ls-remote`, under a deadline; `run` is
    host_helpers.run_with_deadline's signature."""

    def resolve(url: str, ref: str) -> str:
        if SHA.fullmatch(ref):
            return ref
        if url.lstrip().startswith("-") or ref.lstrip().startswith("-"):
            raise LockError(f"git url {url!r} or ref {ref!r} begins with '-'")
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
        rc, out, err = run(
            ["git", "ls-remote", "--", url, ref],
            timeout_s,
            env=env,
            what=f"study_lock's git timeout ({timeout_s:.0f} s)",
            max_output_bytes=16 << 20,
        )
        if rc != 0:
            raise LockError(f"`git ls-remote {url} {ref}` failed: {err.strip()[:400]}")
        return ls_remote_commit(out, url, ref)

    return resolve


def hub_resolver(kind: str, endpoint: str, token: str, request_timeout: float, deadline_s: float):
    """resolver(repo, revision) -> commit of a hub `model` or `dataset` repository, through
    huggingface_hub with module_utils/weights/hub.py's bounds (request timeout, deadline,
    retries)."""
    from ansible.module_utils.weights import hub

    if not hub.HAS_HUB:
        raise LockError("huggingface_hub is not installed in the controller's Python (make setup)")
    hub.use_request_timeout(request_timeout)
    api = hub.HfApi(endpoint=endpoint)
    deadline = hub.Deadline(deadline_s)
    info_of = api.dataset_info if kind == "dataset" else api.model_info

    def resolve(repo: str, revision: str) -> str:
        if SHA.fullmatch(revision):
            return revision
        try:
            info = hub.call_hub(
                lambda timeout: info_of(
                    repo, revision=revision, token=token or False, timeout=timeout
                ),
                deadline,
                request_timeout,
            )
        except Exception as error:
            _verdict, message = hub.classify(error, repo, revision, endpoint, bool(token))
            raise LockError(f"{kind} {message}") from None
        return _text(getattr(info, "sha", None), f"the hub's commit for {repo}@{revision}", SHA)

    return resolve
