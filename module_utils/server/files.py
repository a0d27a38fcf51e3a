"""The server's files on the host, written in one step: its folders, its files with their
content (the unit, the supervisor and its spec, the logrotate entry, the environment, secrets
and launch records), its log file, and files it no longer reads removed.

One module run instead of one per file: a server start wrote a dozen files, each its own
AnsiballZ run. The weights stage makes its folders in one run too (the weights, its state, each
repository's, a gated one group-owned by the service group), and the benchmark clears what an
earlier attempt left in a config's folder (absent with recurse) in the run that makes it again.

Every file is written the way a secret must be, whether or not it holds one, by the kit's
atomic_write (module_utils/host/helpers.py): a temporary file in the same folder, created 0600
by mkstemp (nobody but its owner can open it while its content goes in), flushed to disk,
given its final mode, then renamed over the path. So no reader ever sees a half-written file
or a secret under a wider mode, and a file whose content, mode and owners already match is not
touched (no change reported).

Runs on the host: the standard library and the kit's host helpers."""

from __future__ import annotations

import grp
import os
import pwd
import re
import shutil
import stat

from ansible.module_utils.host.helpers import atomic_write

STATES = ("directory", "file", "touch", "absent")
# What the server role writes is kilobytes; a bound keeps a wrong argument from filling a disk.
MAX_CONTENT_BYTES = 1 << 20
MODE = re.compile(r"^0?[0-7]{3,4}$")
# A user or group name as useradd and groupadd take it (POSIX portable, 32 characters).
ACCOUNT = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")


class FilesError(Exception):
    """A file the server needs could not be written as asked: names the path and what."""


def parse_mode(value, path: str) -> int:
    text = str(value)
    if not MODE.match(text):
        raise FilesError(
            f"{path}: mode {value!r} is not an octal mode such as '0644' (needed: 3 or 4 octal "
            "digits, quoted in YAML so it is not read as a decimal number)"
        )
    return int(text, 8)


def check_path(path) -> str:
    if not isinstance(path, str) or not path:
        raise FilesError(f"a path must be a non-empty string, found {path!r}")
    if not os.path.isabs(path) or os.path.normpath(path) != path.rstrip("/") or "\0" in path:
        raise FilesError(
            f"{path!r} is not a plain absolute path (needed: starting with /, without . or .. "
            "parts or repeated slashes)"
        )
    return path


def check_entries(entries, secret_contents=None) -> list[dict]:
    """Entries as the module takes them, each checked: path, state, mode, and content, which
    an entry marked secret takes from secret_contents (keyed by path) instead of its own."""
    if not isinstance(entries, list):
        raise FilesError(f"the files must be a list, found {type(entries).__name__}")
    secret_contents = secret_contents or {}
    if not isinstance(secret_contents, dict):
        raise FilesError("the secret contents must be a mapping of path to content")
    checked = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise FilesError(f"each file must be a mapping, found {type(entry).__name__}")
        path = check_path(entry.get("path"))
        state = entry.get("state") or "file"
        if state not in STATES:
            raise FilesError(f"{path}: state {state!r} is not one of {', '.join(STATES)}")
        for unrendered in ("template", "src"):
            if entry.get(unrendered) is not None:
                raise FilesError(
                    f"{path}: {unrendered} is read on the controller by the server_files action "
                    "plugin, which did not run (needed: the kit's action_plugins in ansible.cfg)"
                )
        secret = bool(entry.get("secret"))
        content = entry.get("content")
        if secret:
            if content is not None:
                raise FilesError(f"{path}: a secret file's content goes in secret_contents")
            content = secret_contents.get(path)
            if state == "file" and content is None:
                raise FilesError(f"{path}: a secret file needs its content in secret_contents")
        if state == "file":
            if not isinstance(content, str):
                raise FilesError(f"{path}: a file needs its content as text")
            data = content.encode("utf-8")
            if len(data) > MAX_CONTENT_BYTES:
                raise FilesError(
                    f"{path}: content of {len(data)} bytes is over the {MAX_CONTENT_BYTES} bytes "
                    "a server file may have"
                )
        elif content is not None:
            raise FilesError(f"{path}: content is only for state file, not {state}")
        else:
            data = None
        mode = None
        if state != "absent":
            if entry.get("mode") is None:
                raise FilesError(f"{path}: state {state} needs a mode")
            mode = parse_mode(entry["mode"], path)
        owners = {key: check_account(entry.get(key), key, path) for key in ("owner", "group")}
        if state == "absent" and any(owners.values()):
            raise FilesError(f"{path}: owner and group are for what is made, not for absent")
        recurse = bool(entry.get("recurse"))
        if recurse and state != "absent":
            raise FilesError(f"{path}: recurse is only for absent (a folder removed whole)")
        checked.append(
            {
                "path": path,
                "state": state,
                "mode": mode,
                "data": data,
                "secret": secret,
                "recurse": recurse,
                **owners,
            }
        )
    return checked


def check_account(name, key: str, path: str) -> str | None:
    if name is None:
        return None
    if not isinstance(name, str) or not ACCOUNT.match(name):
        raise FilesError(
            f"{path}: {key} {name!r} is not a user or group name (needed: a name such as root "
            "or kimi, which the host looks up)"
        )
    return name


# Each owner field's lookup on the machine the module runs on (KeyError: no such name).
_LOOKUPS = (
    ("owner", lambda name: pwd.getpwnam(name).pw_uid),
    ("group", lambda name: grp.getgrnam(name).gr_gid),
)


def _ids(entry: dict) -> tuple[int, int]:
    """The uid and gid the entry asks for; -1 for whichever it leaves alone."""
    ids = []
    for key, lookup in _LOOKUPS:
        name = entry.get(key)
        try:
            ids.append(-1 if name is None else lookup(name))
        except KeyError:
            raise FilesError(f"{entry['path']}: there is no {key} {name!r} here") from None
    return ids[0], ids[1]


def _owned(found, uid: int, gid: int) -> bool:
    return (uid == -1 or found.st_uid == uid) and (gid == -1 or found.st_gid == gid)


def with_parents(entries: list[dict]) -> list[dict]:
    """Checked entries with a folder entry, of the same mode, before each folder entry for each
    of its missing parents, as mkdir -p makes them (the controller's records: state/ and
    results/ may not exist yet). Where one exists as something else, apply() says so."""
    expanded = []
    for entry in entries:
        if entry["state"] == "directory":
            missing, parent = [], os.path.dirname(entry["path"])
            while parent != os.path.dirname(parent) and _lstat(parent) is None:
                missing.append(parent)
                parent = os.path.dirname(parent)
            expanded += [{**entry, "path": path} for path in reversed(missing)]
        expanded.append(entry)
    return expanded


def _lstat(path: str):
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _same_content(path: str, found: os.stat_result, data: bytes) -> bool:
    if found.st_size != len(data):
        return False
    with open(path, "rb") as handle:
        return handle.read(len(data) + 1) == data


def _create_private(path: str, folder: bool) -> None:
    """A folder or an empty file nobody else can open until its mode is set; the times of an
    existing log file are never touched, as it is never created again."""
    if folder:
        os.mkdir(path, 0o700)
    else:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", "replace")


def _described(found) -> str:
    if found is None:
        return "absent\n"
    kind = "directory" if stat.S_ISDIR(found.st_mode) else "file"
    return f"{kind} {stat.S_IMODE(found.st_mode):04o}\n"


def _described_wanted(state: str, mode: int | None) -> str:
    if state == "absent":
        return "absent\n"
    return f"{'directory' if state == 'directory' else 'file'} {mode:04o}\n"


def apply(entries: list[dict], check_mode: bool = False, diff: bool = False) -> dict:
    """Brings each checked entry (check_entries) about, in order: a folder an entry creates may
    hold the next entry's file. Returns the paths changed and, with diff, before and after of
    each changed file that is not secret."""
    changed, diffs = [], []
    for entry in entries:
        path, state, mode, data = entry["path"], entry["state"], entry["mode"], entry["data"]
        found = _lstat(path)
        before = None
        try:
            if state == "absent":
                done = _remove(entry, found, check_mode)
            elif state in ("directory", "touch"):
                done = _make(entry, found, check_mode)
            else:
                done, before = _write(entry, found, check_mode, diff)
        except OSError as error:
            raise FilesError(f"{path}: {error.strerror or error}") from error
        if not done:
            continue
        changed.append(path)
        if diff and not entry["secret"]:
            diffs.append(
                {
                    "before_header": path,
                    "after_header": path,
                    "before": _text(before) if state == "file" else _described(found),
                    "after": _text(data) if state == "file" else _described_wanted(state, mode),
                }
            )
    return {"changed": bool(changed), "changed_paths": changed, "diff": diffs}


def _remove(entry: dict, found, check_mode: bool) -> bool:
    if found is None:
        return False
    folder = stat.S_ISDIR(found.st_mode)
    if folder and not entry["recurse"]:
        raise FilesError(
            f"{entry['path']} is a folder; only files are removed here, or a folder whole with "
            "recurse"
        )
    if not check_mode:
        if folder:
            shutil.rmtree(entry["path"])
        else:
            os.unlink(entry["path"])
    return True


def _make(entry: dict, found, check_mode: bool) -> bool:
    """A folder (directory) or an empty file (touch) with its mode and owners."""
    path, mode, folder = entry["path"], entry["mode"], entry["state"] == "directory"
    uid, gid = _ids(entry)
    if found is None:
        if check_mode:
            return True
        try:
            _create_private(path, folder)
        except FileExistsError:
            # Made by another process between the look and the create (on the controller,
            # another host's task making the same state/ folder): judged as one found there.
            found = _lstat(path)
            if found is None:
                raise
        else:
            _settle(path, mode, uid, gid)
            return True
    if not (stat.S_ISDIR if folder else stat.S_ISREG)(found.st_mode):
        raise FilesError(f"{path} exists and is not {'a folder' if folder else 'a regular file'}")
    if stat.S_IMODE(found.st_mode) == mode and _owned(found, uid, gid):
        return False
    if not check_mode:
        _settle(path, mode, uid, gid)
    return True


def _write(entry: dict, found, check_mode: bool, diff: bool) -> tuple[bool, bytes | None]:
    """A file with its content, mode and owners; the content it had, for a diff."""
    path, mode, data = entry["path"], entry["mode"], entry["data"]
    if found is not None and stat.S_ISDIR(found.st_mode):
        raise FilesError(f"{path} is a folder, not a file")
    uid, gid = _ids(entry)
    regular = found is not None and stat.S_ISREG(found.st_mode)
    if (
        regular
        and stat.S_IMODE(found.st_mode) == mode
        and _owned(found, uid, gid)
        and _same_content(path, found, data)
    ):
        return False, None
    before = None
    if diff and regular and found.st_size <= MAX_CONTENT_BYTES:
        with open(path, "rb") as handle:
            before = handle.read(MAX_CONTENT_BYTES)
    if not check_mode:
        atomic_write(path, data, mode)
        if (uid, gid) != (-1, -1):
            os.chown(path, uid, gid, follow_symlinks=False)
    return True, before


def _settle(path: str, mode: int, uid: int, gid: int) -> None:
    # Owners first: chown clears the set-id bits a mode may carry.
    if (uid, gid) != (-1, -1):
        os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(path, mode)
