# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Versioned runtimes: each build of a runtime kind in its own folder, the configured venv path
a symlink to the active one, and a bounded history of activations to roll back through.

A version's folder is <versions_dir>/<kind>-<id>, the id a short sha256 over what builds it
(version_id), so the same inputs find the same folder and a rerun reuses it. The link is
switched atomically (a temporary symlink renamed over it): a reader of <link>/bin/python sees
the old runtime or the new one, never neither. versions.json in the state folder lists the
activations per kind, newest last; it is read as untrusted input (bounded, type-checked) and
every name in it or given to a switch must be a version folder directly under versions_dir.
"""

from __future__ import annotations

import datetime
import errno
import hashlib
import json
import os
import re
import shutil

from ansible.module_utils.host.helpers import TooLarge, read_bounded, write_json_atomic

KINDS = ("release", "git")
ID_CHARS = 12
# A venv found as a real folder at the link's path (a host deployed before versions existed):
# kept as this version, since nothing could rebuild it.
UNVERSIONED = "unversioned"
NAME = re.compile(r"^(release|git)-([0-9a-f]{12}|unversioned)$")
HISTORY_FILE = "versions.json"
HISTORY_FORMAT = 1
# Activations kept per kind: enough to roll back through, small enough to read at once.
HISTORY_MAX = 20
HISTORY_MAX_BYTES = 64 * 1024
# launch.json of the server stage, read for the runtime folder of the previous launch; the
# runtime stage's runtime.json and each version's own record of itself (VERSION_RECORD).
LAUNCH_RECORD_MAX_BYTES = 1024 * 1024
RUNTIME_RECORD_MAX_BYTES = 4 * 1024 * 1024
RUNTIME_RECORD = "runtime.json"
VERSION_RECORD = "kimi-runtime.json"
MAX_PATH_CHARS = 4096


class VersionError(ValueError):
    """A version, link or history that cannot be used; the message says what to fix."""


def version_id(kind: str, inputs: dict) -> str:
    """The id of the build that inputs describe: the same inputs, the same id, on any host."""
    check_kind(kind)
    if not isinstance(inputs, dict):
        raise VersionError("the runtime's inputs must be a mapping")
    try:
        text = json.dumps({"kind": kind, "inputs": inputs}, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        raise VersionError(f"the runtime's inputs are not plain data: {error}") from None
    return hashlib.sha256(text.encode()).hexdigest()[:ID_CHARS]


def check_kind(kind) -> str:
    if kind not in KINDS:
        raise VersionError(f"runtime kind {kind!r} is none of {', '.join(KINDS)}")
    return kind


def check_name(name, kind: str | None = None) -> str:
    """A version folder's name (<kind>-<12 hex> or <kind>-unversioned), of kind when given."""
    if not isinstance(name, str) or not NAME.match(name):
        raise VersionError(
            f"{str(name)[:80]!r} is not a runtime version (needed: <kind>-<12 hex digits> or "
            f"<kind>-{UNVERSIONED}, kind {' or '.join(KINDS)})"
        )
    if kind is not None and not name.startswith(f"{kind}-"):
        raise VersionError(f"{name} is not a version of the {kind} runtime")
    return name


def version_dir(versions_dir: str, name: str, kind: str | None = None) -> str:
    """The folder of version name, which must stay directly under versions_dir."""
    check_name(name, kind)
    base = os.path.realpath(versions_dir)
    folder = os.path.join(base, name)
    if os.path.dirname(os.path.realpath(folder)) != base:
        raise VersionError(f"{folder} leads outside {base}")
    return folder


def name_of(versions_dir: str, path: str, kind: str | None = None) -> str:
    """The version name of a folder given by path, which must be a version under versions_dir."""
    if not isinstance(path, str) or not path or len(path) > MAX_PATH_CHARS:
        raise VersionError("a runtime folder must be a path of at most 4096 characters")
    resolved = os.path.realpath(path)
    base = os.path.realpath(versions_dir)
    if os.path.dirname(resolved) != base:
        raise VersionError(f"{path} is not a runtime version under {base}")
    return check_name(os.path.basename(resolved), kind)


def is_built(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "bin", "python"))


# --- history --------------------------------------------------------------------------------


def empty_history() -> dict:
    return {"format": HISTORY_FORMAT, "kinds": {kind: [] for kind in KINDS}}


def parse_history(data: bytes, path: str) -> dict:
    """versions.json's content, type-checked; VersionError names what is wrong and the fix."""
    fix = (
        f"Fix: move {path} aside; the versions stay where they are and the next switch starts "
        "a new history (a rollback then needs one more switch first)."
    )
    try:
        history = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise VersionError(f"{path} is not JSON ({error}). {fix}") from None
    if (
        not isinstance(history, dict)
        or type(history.get("format")) is not int
        or (history["format"] != HISTORY_FORMAT)
    ):
        raise VersionError(f"{path} is not a runtime history of format {HISTORY_FORMAT}. {fix}")
    kinds = history.get("kinds")
    if not isinstance(kinds, dict) or not set(kinds) <= set(KINDS):
        raise VersionError(f"{path}: kinds must map {' and '.join(KINDS)} to lists. {fix}")
    parsed = empty_history()
    for kind, entries in kinds.items():
        if not isinstance(entries, list) or len(entries) > HISTORY_MAX:
            raise VersionError(
                f"{path}: kinds.{kind} must be a list of at most {HISTORY_MAX} entries. {fix}"
            )
        for entry in entries:
            if (
                not isinstance(entry, dict)
                or not isinstance(entry.get("at"), str)
                or len(entry["at"]) > 64
            ):
                raise VersionError(f"{path}: kinds.{kind} has an entry without name and at. {fix}")
            try:
                check_name(entry.get("name"), kind)
            except VersionError as error:
                raise VersionError(f"{path}: kinds.{kind}: {error}. {fix}") from None
            parsed["kinds"][kind].append({"name": entry["name"], "at": entry["at"]})
    return parsed


def read_history(state_dir: str) -> dict:
    path = os.path.join(state_dir, HISTORY_FILE)
    try:
        data = read_bounded(path, HISTORY_MAX_BYTES)
    except TooLarge:
        raise VersionError(
            f"{path} is larger than {HISTORY_MAX_BYTES} bytes, which no history of "
            f"{HISTORY_MAX} activations per kind reaches. Fix: move it aside."
        ) from None
    return empty_history() if data is None else parse_history(data, path)


def write_history(state_dir: str, history: dict) -> None:
    write_json_atomic(os.path.join(state_dir, HISTORY_FILE), history)


def activated(history: dict, kind: str, name: str, at: str) -> None:
    entries = history["kinds"][kind]
    entries.append({"name": name, "at": at})
    del entries[:-HISTORY_MAX]


def rollback_target(history: dict, kind: str, other_than: str | None, versions_dir: str):
    """The most recently activated version of kind that is not other_than and is still built."""
    for entry in reversed(history["kinds"][kind]):
        name = entry["name"]
        if name != other_than and is_built(version_dir(versions_dir, name, kind)):
            return name
    return None


# --- the link ---------------------------------------------------------------------------------


def link_state(link: str, versions_dir: str) -> tuple[str, str | None]:
    """(state, active version): state is link (to a version, or to a folder elsewhere: None),
    folder (a real venv: to be migrated), absent, or other (a file: refused)."""
    if os.path.islink(link):
        try:
            return "link", name_of(versions_dir, link)
        except VersionError:
            return "link", None
    if os.path.isdir(link):
        return "folder", None
    if os.path.lexists(link):
        return "other", None
    return "absent", None


def migrate(link: str, versions_dir: str, kind: str) -> str:
    """Moves the real venv at link under versions_dir as <kind>-unversioned; its name.

    `python -m` keeps working from a moved venv (pyvenv.cfg names the base Python, not the
    venv's own place); its console scripts do not, their shebangs name the old path, and the
    kit runs none of them."""
    name = f"{kind}-{UNVERSIONED}"
    dest = version_dir(versions_dir, name, kind)
    if os.path.lexists(dest):
        raise VersionError(
            f"{link} is a real folder, and {dest} (an earlier one, kept when versions came in) "
            f"exists too. Fix: move one of them aside by hand; the kit deletes neither"
        )
    os.makedirs(os.path.dirname(dest), mode=0o755, exist_ok=True)
    try:
        # A rename only: a copy across filesystems would take minutes while the running
        # server's files were deleted from under it, and the link would be missing meanwhile.
        os.rename(link, dest)
    except OSError as error:
        if error.errno not in (errno.EXDEV, errno.EBUSY):
            raise
        why = "another filesystem" if error.errno == errno.EXDEV else "a mount point"
        raise VersionError(
            f"{link} (a venv of an earlier kit) cannot be renamed to {dest}: "
            f"{error.strerror} ({why}). "
            "Fix: set kimi_runtime_versions_dir to a folder on the same filesystem as "
            f"{link}, or move {link} there by hand and link it back"
        ) from None
    return name


def point(link: str, target: str) -> None:
    """link -> target, atomically: a temporary symlink renamed over the old one."""
    temporary = f"{link}.kimi-switch-{os.getpid()}"
    if os.path.lexists(temporary):
        os.unlink(temporary)
    os.symlink(target, temporary)
    try:
        os.replace(temporary, link)
    except OSError:
        os.unlink(temporary)
        raise


# --- pruning ----------------------------------------------------------------------------------


def prune_candidates(versions_dir: str, kind: str, history: dict, keep_names: set[str]):
    """Version folders of kind that may go, oldest activation first (never activated: first)."""
    try:
        found = sorted(os.listdir(versions_dir))
    except FileNotFoundError:
        return []
    order = {entry["name"]: index for index, entry in enumerate(history["kinds"][kind])}
    names = [
        name
        for name in found
        if NAME.match(name)
        and name.startswith(f"{kind}-")
        and not name.endswith(f"-{UNVERSIONED}")
        and name not in keep_names
        and not os.path.islink(os.path.join(versions_dir, name))
    ]
    return sorted(names, key=lambda name: order.get(name, -1))


def prune(
    versions_dir: str,
    kind: str,
    history: dict,
    active: str,
    keep: int,
    check: bool,
    also_keep: set[str] | frozenset[str] = frozenset(),
):
    """Removes versions of kind beyond keep: never the active one, never the rollback target,
    never one in also_keep (the version the link pointed at before: a server may still run
    on it), never an unversioned one (nothing could rebuild it). The names removed."""
    target = rollback_target(history, kind, active, versions_dir)
    kept = {active} | ({target} if target else set()) | set(also_keep)
    candidates = prune_candidates(versions_dir, kind, history, kept)
    room = max(keep - len(kept), 0)
    doomed = candidates[: max(len(candidates) - room, 0)]
    if not check:
        for name in doomed:
            shutil.rmtree(version_dir(versions_dir, name, kind))
    return doomed


# --- actions ----------------------------------------------------------------------------------


def now_text() -> str:
    # timezone.utc, not datetime.UTC: hosts may run Python 3.10.
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: UP017


def plan(link: str, versions_dir: str, state_dir: str, kind: str, inputs: dict) -> dict:
    """Where the inputs' version lives, whether it is built, what is active, the history."""
    name = f"{check_kind(kind)}-{version_id(kind, inputs)}"
    folder = version_dir(versions_dir, name, kind)
    state, active = link_state(link, versions_dir)
    history = read_history(state_dir)
    return {
        "name": name,
        "dir": folder,
        "built": is_built(folder),
        "active": active,
        "link_state": state,
        "history": history["kinds"][kind],
        "rollback_target": rollback_target(history, kind, name, versions_dir),
    }


def switch(
    link: str,
    versions_dir: str,
    state_dir: str,
    kind: str,
    name: str,
    keep: int = 2,
    check: bool = False,
    at: str | None = None,
    update_record: bool = False,
    in_use: set[str] | frozenset[str] = frozenset(),
) -> dict:
    """Points link at version name (built), migrating a real venv found there first; records
    the activation and prunes to keep versions; with update_record, runtime.json's entry too.
    in_use: versions a running server was started on (its launch record's), never pruned:
    after A -> B with the server still on A (its stage failed before the restart), a switch to
    C would otherwise remove A, and the rollback with it. changed when the link, a folder or
    runtime.json changed."""
    if keep < 1:
        raise VersionError(f"keep must be 1 or more, not {keep}")
    folder = version_dir(versions_dir, name, check_kind(kind))
    if not is_built(folder):
        raise VersionError(f"{folder} holds no built runtime ({folder}/bin/python is missing)")
    at = at or now_text()
    history = read_history(state_dir)
    state, active = link_state(link, versions_dir)
    if state == "other":
        raise VersionError(f"{link} is neither a folder nor a symlink. Fix: move it aside")
    migrated = None
    if state == "folder":
        migrated = f"{kind}-{UNVERSIONED}" if check else migrate(link, versions_dir, kind)
        # The migrated venv was the active runtime: recorded so that it is the rollback target.
        activated(history, kind, migrated, at)
        active = migrated
    previous = active
    # A history moved aside (or lost) no longer names the active version: it goes back in, so
    # that it stays the rollback target and is not pruned.
    if active and active != name and active not in {e["name"] for e in history["kinds"][kind]}:
        activated(history, kind, active, at)
    changed = migrated is not None or state != "link" or active != name
    if changed:
        if not check:
            point(link, folder)
        activated(history, kind, name, at)
    removed = prune(
        versions_dir,
        kind,
        history,
        name,
        keep,
        check,
        ({previous} if previous else set()) | set(in_use),
    )
    if (changed or removed) and not check:
        write_history(state_dir, history)
    recorded = update_record and restore_record(state_dir, kind, folder, check)
    return {
        "changed": bool(changed or removed or recorded),
        "active": name,
        "dir": folder,
        "previous": previous,
        "migrated": migrated,
        "removed": removed,
        "history": history["kinds"][kind],
        "rollback_target": rollback_target(history, kind, name, versions_dir),
    }


def rollback(
    link: str,
    versions_dir: str,
    state_dir: str,
    kind: str,
    inputs: dict,
    keep: int = 2,
    check: bool = False,
    at: str | None = None,
    in_use: set[str] | frozenset[str] = frozenset(),
) -> dict:
    """Switches to the most recently activated version other than the one inputs build (so a
    second rollback finds that one active and changes nothing); target None when there is
    none (the caller says so). in_use as switch's."""
    planned = plan(link, versions_dir, state_dir, kind, inputs)
    target = planned["rollback_target"]
    if target is None:
        return {"changed": False, "target": None, "name": planned["name"], **planned}
    result = switch(link, versions_dir, state_dir, kind, target, keep, check, at, in_use=in_use)
    return {**result, "target": target, "name": planned["name"]}


def read_record(path: str, limit: int = RUNTIME_RECORD_MAX_BYTES):
    """A JSON object the kit wrote (runtime.json, a version's record, launch.json), at most
    limit bytes; None when it is missing, unreadable or not an object (never trusted)."""
    try:
        data = read_bounded(path, limit)
        record = json.loads(data.decode("utf-8")) if data is not None else None
    except (OSError, TooLarge, UnicodeDecodeError, ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def restore_record(state_dir: str, kind: str, folder: str, check: bool = False) -> bool:
    """runtime.json's entry for kind becomes what the runtime stage recorded in the version's
    folder (null when it holds none, an unversioned one): after a switch the server stage makes,
    the benchmark's provenance names the runtime that runs. Whether runtime.json changed."""
    path = os.path.join(state_dir, RUNTIME_RECORD)
    current = read_record(path) or {}
    wanted = {**current, check_kind(kind): read_record(os.path.join(folder, VERSION_RECORD))}
    if wanted == current:
        return False
    if not check:
        write_json_atomic(path, wanted)
    return True


def recorded_runtime(path: str, versions_dir: str, kind: str | None = None) -> dict:
    """The runtime folder the launch record at path names (runtime_dir), when it is a version
    under versions_dir: {runtime_dir, name, built}, None, None and False when there is none or
    the record is unreadable (the previous launch then is not known)."""
    nothing = {"runtime_dir": None, "name": None, "built": False}
    record = read_record(path, LAUNCH_RECORD_MAX_BYTES)
    folder = record.get("runtime_dir") if record is not None else None
    if not isinstance(folder, str):
        return nothing
    try:
        name = name_of(versions_dir, folder, kind)
    except VersionError:
        return nothing
    folder = version_dir(versions_dir, name, kind)
    return {"runtime_dir": folder, "name": name, "built": is_built(folder)}
