"""A wheelhouse (a controller folder of wheels for hosts without a package index) moved to the
hosts as one archive instead of file by file.

Copying a folder with ansible.builtin.copy costs a checksum, a transfer and a module run per
file on every run, changed or not: about 20 s a host for a 15-wheel wheelhouse. pack() writes
the folder once into a tar on the controller, cached under a key of the folder's listing, so a
run copies one file (copy's own checksum keeps a second run idle) and unpack() writes on the
host only the members whose bytes differ.

Standard library only: unpack() ships to the hosts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tarfile
import tempfile

from ansible.module_utils.host.helpers import atomic_write

# A wheelhouse of SGLang with torch and its CUDA wheels is a few GB in some hundred files.
MAX_FILES = 10_000
MAX_BYTES = 256 << 30
MAX_DEPTH = 8
# Archives kept in the cache folder, the most recently used first.
KEEP_ARCHIVES = 4
RECORD = ".kimi-wheelhouse.json"
_CHUNK = 1 << 20


class WheelhouseError(Exception):
    pass


def listing(src: str) -> list[tuple[str, str, os.stat_result]]:
    """(member name, path, stat) of every regular file under src, sorted by name; a link to a
    regular file counts as that file (ansible.builtin.copy follows them too)."""
    if not os.path.isdir(src):
        raise WheelhouseError(
            f"the wheelhouse {src} is not a folder on the controller. Fix: point it at the folder "
            "of wheels (pip download -d <folder> ...) or set it to '' to use the package index"
        )
    found = []
    total = 0
    for folder, dirs, files in os.walk(src):
        relative = os.path.relpath(folder, src)
        depth = 0 if relative == "." else relative.count(os.sep) + 1
        if depth >= MAX_DEPTH:
            raise WheelhouseError(f"the wheelhouse {src} is nested deeper than {MAX_DEPTH} folders")
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            info = os.stat(path)
            if not stat.S_ISREG(info.st_mode):
                continue
            member = name if relative == "." else f"{relative}/{name}".replace(os.sep, "/")
            found.append((member, path, info))
            total += info.st_size
            if len(found) > MAX_FILES or total > MAX_BYTES:
                raise WheelhouseError(
                    f"the wheelhouse {src} holds more than {MAX_FILES} files or "
                    f"{MAX_BYTES >> 30} GiB; that is no wheelhouse"
                )
    if not found:
        raise WheelhouseError(
            f"the wheelhouse {src} holds no files. Fix: fill it (pip download -d {src} -r "
            "<requirements>) or set it to '' to use the package index"
        )
    return sorted(found)


def listing_key(src: str, files) -> str:
    """What names an archive in the cache: the folder and every file's name, size and mtime. A
    file rewritten in place with the same size within the same nanosecond is the only change it
    misses."""
    digest = hashlib.sha256(os.path.realpath(src).encode())
    for member, _path, info in files:
        digest.update(f"\0{member}\0{info.st_size}\0{info.st_mtime_ns}".encode())
    return digest.hexdigest()[:24]


def _member(name: str, info: os.stat_result) -> tarfile.TarInfo:
    # Owner, group and mode are the host's business (unpack sets them): the archive's bytes
    # depend on the files alone.
    member = tarfile.TarInfo(name)
    member.size = info.st_size
    member.mtime = int(info.st_mtime)
    member.mode = 0o644
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    return member


def pack(src: str, cache_dir: str) -> dict:
    """The archive of src in cache_dir (wheelhouse-<key>.tar), written when the cache lacks it.
    Returns its path, member count and whether it was written."""
    files = listing(src)
    os.makedirs(cache_dir, mode=0o700, exist_ok=True)
    path = os.path.join(cache_dir, f"wheelhouse-{listing_key(src, files)}.tar")
    written = not os.path.isfile(path)
    if written:
        handle, partial = tempfile.mkstemp(dir=cache_dir, prefix=".wheelhouse-", suffix=".tar")
        try:
            with (
                os.fdopen(handle, "wb") as raw,
                tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as archive,
            ):
                for member, file_path, info in files:
                    with open(file_path, "rb") as source:
                        archive.addfile(_member(member, info), source)
            os.chmod(partial, 0o600)
            # Atomic: runs packing the same folder at once each rename a whole archive.
            os.replace(partial, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise
    else:
        os.utime(path)
    return {"path": path, "files": len(files), "written": written, "pruned": _prune(cache_dir)}


def _prune(cache_dir: str) -> list[str]:
    archives = sorted(
        (entry for entry in os.scandir(cache_dir) if _is_archive(entry.name)),
        key=lambda entry: entry.stat().st_mtime,
        reverse=True,
    )
    pruned = []
    for entry in archives[KEEP_ARCHIVES:]:
        with contextlib.suppress(OSError):
            os.unlink(entry.path)
            pruned.append(entry.name)
    return pruned


def _is_archive(name: str) -> bool:
    return name.startswith("wheelhouse-") and name.endswith(".tar")


# -- on the host ---------------------------------------------------------------------------


def member_path(dest: str, name: str) -> str:
    """Where member `name` goes under dest; refuses a name that would land anywhere else."""
    parts = name.split("/")
    if (
        not name
        or name.startswith("/")
        or "\\" in name
        or "\0" in name
        or len(parts) > MAX_DEPTH
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise WheelhouseError(f"the wheelhouse archive holds a member named {name!r}")
    return os.path.join(dest, *parts)


def _members(archive: tarfile.TarFile) -> list[tarfile.TarInfo]:
    members = []
    total = 0
    for member in archive:
        if member.isdir():
            continue
        if not member.isreg():
            raise WheelhouseError(
                f"the wheelhouse archive's member {member.name!r} is not a regular file"
            )
        total += member.size
        members.append(member)
        if len(members) > MAX_FILES or total > MAX_BYTES:
            raise WheelhouseError(
                f"the wheelhouse archive holds more than {MAX_FILES} files or {MAX_BYTES >> 30} GiB"
            )
    return members


def _same_bytes(path: str, size: int, source) -> bool:
    """Whether the regular file at path (not a link) holds the member's bytes."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(info.st_mode) or info.st_size != size:
        return False
    theirs, ours = hashlib.sha256(), hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            theirs.update(chunk)
    for chunk in iter(lambda: source.read(_CHUNK), b""):
        ours.update(chunk)
    return theirs.digest() == ours.digest()


def _stamp(path: str) -> list[int]:
    info = os.lstat(path)
    return [info.st_size, info.st_mtime_ns]


def _recorded(dest: str) -> dict:
    try:
        with open(os.path.join(dest, RECORD), encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _unchanged(archive_path: str, dest: str, file_mode: int) -> bool:
    """Whether the last unpack of this very archive file still stands: the archive and every
    file it wrote have the size and mtime recorded then, and the files their mode."""
    record = _recorded(dest)
    files = record.get("files")
    if record.get("archive") != _stamp(archive_path) or not isinstance(files, dict) or not files:
        return False
    for name, stamp in files.items():
        try:
            path = member_path(dest, name)
            info = os.lstat(path)
        except (WheelhouseError, OSError):
            return False
        if (
            not stat.S_ISREG(info.st_mode)
            or [info.st_size, info.st_mtime_ns] != stamp
            or stat.S_IMODE(info.st_mode) != file_mode
        ):
            return False
    return True


def unpack(
    archive_path: str, dest: str, file_mode: int = 0o644, dir_mode: int = 0o755, check=False
) -> dict:
    """Writes into dest every member of the archive whose bytes or mode differ there; files
    already in dest that the archive lacks stay (as a copy of the folder leaves them)."""
    if _unchanged(archive_path, dest, file_mode):
        return {"changed": False, "written": []}
    try:
        with tarfile.open(archive_path, mode="r:") as archive:
            return _unpack_members(archive, archive_path, dest, file_mode, dir_mode, check)
    except (tarfile.TarError, EOFError) as error:
        raise WheelhouseError(
            f"{archive_path} is no wheelhouse archive or a broken one ({error})"
        ) from error


def _unpack_members(archive, archive_path, dest, file_mode, dir_mode, check) -> dict:
    # Every name is checked before the first byte is written.
    members = [(member, member_path(dest, member.name)) for member in _members(archive)]
    dest_real = os.path.realpath(dest)
    written = []
    for member, path in members:
        if check:
            if not _same_bytes(path, member.size, archive.extractfile(member)):
                written.append(member.name)
            continue
        _folders(dest, os.path.dirname(path), dest_real, dir_mode)
        if not _same_bytes(path, member.size, archive.extractfile(member)):
            atomic_write(path, archive.extractfile(member), file_mode)
            written.append(member.name)
        elif stat.S_IMODE(os.lstat(path).st_mode) != file_mode:
            os.chmod(path, file_mode)
            written.append(member.name)
    if not check:
        files = {member.name: _stamp(path) for member, path in members}
        _write_record(dest, {"archive": _stamp(archive_path), "files": files})
    return {"changed": bool(written), "written": written}


def _folders(dest: str, folder: str, dest_real: str, dir_mode: int) -> None:
    os.makedirs(folder, mode=dir_mode, exist_ok=True)
    real = os.path.realpath(folder)
    if real != dest_real and not real.startswith(dest_real + os.sep):
        raise WheelhouseError(f"{folder} leads out of {dest} (a link in the way)")


def _write_record(dest: str, record: dict) -> None:
    atomic_write(os.path.join(dest, RECORD), json.dumps(record), 0o644)
