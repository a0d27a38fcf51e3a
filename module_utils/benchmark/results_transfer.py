"""A config's results and debug files brought to the controller in one archive.

The host side (library/benchmark_results.py) packs the regular files a config left: those under
its results folder whose names match the level, status and API-check patterns (any depth), and
those directly in its debug folder, as `results/<relative path>` and `debug/<name>`. The
controller side (action_plugins/benchmark_results.py) unpacks them under the run's folder for
that host and config, the way one ansible.builtin.fetch per file placed them before, at a cost
of one module run instead of two (find) plus one per file.

The archive comes from a host, so the controller reads it as outside input: member by member,
never extracted by tarfile, only regular files whose names have the shape packing gives them,
at most MAX_MEMBERS members and max_bytes in all, written only inside the destination and
through no link. A file the host has that did not fit is named with its size and left on the
host, never cut.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fnmatch
import io
import os
import stat
import tarfile

from ansible.module_utils.diagnose.members import valid_member
from ansible.module_utils.host.archive import add_member
from ansible.module_utils.host.helpers import atomic_write

RESULTS, DEBUG = "results", "debug"
PATTERNS = ("c*.json", "r*.json", "status.json", "api-check.json")
# Far past any config's files (a level file per prompt set, level and repeat; a few debug files).
MAX_MEMBERS = 5000
# Deeper than results/<prompt set>/<level file> is not something the benchmark writes.
MAX_DEPTH = 6
FILE_MODE = 0o644


class TransferError(Exception):
    """The archive or the destination is not what a config's files can be."""


def _regular_bytes(path: str, limit: int) -> tuple[bytes | None, float, str]:
    """(content, mtime, why not) of a regular file read through no link, at most limit bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        return None, 0.0, f"unreadable: {error.strerror or error}"
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            return None, 0.0, "not a regular file"
        if info.st_size > limit:
            return None, 0.0, f"{info.st_size} bytes, past the {limit} bytes left to fetch"
        data = handle.read(limit + 1)
        if len(data) > limit:
            return None, 0.0, f"grew past the {limit} bytes left to fetch while read"
        return data, info.st_mtime, ""


def _candidates(config_dir: str, debug_dir: str, patterns) -> list[tuple[str, str]]:
    """(member name, host path) of every file to send, in a stable order; links, folders and
    anything not regular are never followed (os.walk does not descend into linked folders)."""
    found = []
    if config_dir and os.path.isdir(config_dir) and not os.path.islink(config_dir):
        for root, folders, files in os.walk(config_dir):
            folders.sort()
            relative_root = os.path.relpath(root, config_dir)
            depth = 0 if relative_root == "." else relative_root.count(os.sep) + 1
            if depth >= MAX_DEPTH:
                folders[:] = []
                continue
            for name in sorted(files):
                if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
                    relative = name if relative_root == "." else os.path.join(relative_root, name)
                    found.append((f"{RESULTS}/{relative}", os.path.join(root, name)))
    if debug_dir and os.path.isdir(debug_dir) and not os.path.islink(debug_dir):
        with os.scandir(debug_dir) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.is_file(follow_symlinks=False):
                    found.append((f"{DEBUG}/{entry.name}", entry.path))
    return found


def pack(config_dir: str, debug_dir: str, patterns, max_bytes: int) -> dict:
    """{archive: base64 of the .tar.gz, members: [{name, bytes}], left_out: [{path, why}]}."""
    members, left_out, total = [], [], 0
    buffer = io.BytesIO()
    # Level files are JSON and compress well; the debug files are gzip already.
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for name, path in _candidates(config_dir, debug_dir, patterns):
            if len(members) >= MAX_MEMBERS:
                left_out.append({"path": path, "why": f"more than {MAX_MEMBERS} files"})
                continue
            if not valid_member(name):
                left_out.append({"path": path, "why": "a name the controller would refuse"})
                continue
            data, mtime, why = _regular_bytes(path, max_bytes - total)
            if data is None:
                left_out.append({"path": path, "why": why})
                continue
            add_member(tar, name, data, FILE_MODE, mtime)
            members.append({"name": name, "bytes": len(data)})
            total += len(data)
    return {
        "archive": base64.b64encode(buffer.getvalue()).decode("ascii"),
        "members": members,
        "left_out": left_out,
    }


def archive_chars_limit(max_bytes: int) -> int:
    """The most base64 characters a packed archive of max_bytes of content can take: content
    that does not compress (the gzip debug files) comes out a little larger, with the tar's
    header and padding per member, gzip's few bytes per stored block, then base64's third."""
    raw = max_bytes + max_bytes // 1000 + (MAX_MEMBERS + 2) * 1024 + 65536
    return (raw // 3 + 1) * 4


def decode(archive, max_bytes: int) -> bytes:
    """The archive's bytes from the module's base64 text (outside input: type and size checked)."""
    if not isinstance(archive, str):
        raise TransferError(f"the host sent no archive (found {type(archive).__name__})")
    if len(archive) > archive_chars_limit(max_bytes):
        raise TransferError(f"the archive is {len(archive)} characters, past the {max_bytes} cap")
    try:
        return base64.b64decode(archive.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as error:
        raise TransferError(f"the archive is not base64: {error}") from None


def target_of(name: str) -> str | None:
    """Where a member lands below the destination, or None for a name packing never gives."""
    if not valid_member(name):
        return None
    kind, _, rest = name.partition("/")
    if kind == RESULTS and rest and rest.count("/") < MAX_DEPTH:
        return rest
    if kind == DEBUG and rest and "/" not in rest:
        return f"{DEBUG}/{rest}"
    return None


def _inside(dest: str, relative: str) -> str:
    """dest/relative, its folders made, none of them (nor the file) a link."""
    path = dest
    for part in relative.split("/")[:-1]:
        path = os.path.join(path, part)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            try:
                os.mkdir(path, 0o755)
                continue
            except FileExistsError:  # made meanwhile by another host's transfer
                info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode):
            raise TransferError(f"{path} is in the way: not a folder (a link, or a file)")
    target = os.path.join(path, relative.split("/")[-1])
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(os.lstat(target).st_mode):
            raise TransferError(f"{target} is in the way: not a regular file")
    return target


def _same(path: str, data: bytes) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(len(data) + 1) == data
    except OSError:
        return False


def _write(dest: str, relative: str, data: bytes) -> bool:
    """Whether dest/relative had to be written (False: it already held these bytes)."""
    try:
        target = _inside(dest, relative)
        if _same(target, data):
            return False
        atomic_write(target, data, FILE_MODE)
    except OSError as error:
        raise TransferError(
            f"could not write {os.path.join(dest, relative)}: {error.strerror or error}"
        ) from None
    return True


def unpack(archive: bytes, dest: str, max_bytes: int, check_mode: bool = False) -> dict:
    """Writes each valid member under dest (a file whose bytes match is left alone).
    {written: [...], unchanged: [...], left_out: [{name, why}]}, paths relative to dest."""
    written, unchanged, left_out, total, count = [], [], [], 0, 0
    if not check_mode:
        os.makedirs(dest, mode=0o755, exist_ok=True)
    if not os.path.isdir(dest) and not check_mode:
        raise TransferError(f"{dest} is not a folder")
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            while True:
                info = tar.next()
                if info is None:
                    break
                count += 1
                shown = str(info.name)[:200]
                if count > MAX_MEMBERS:
                    left_out.append({"name": shown, "why": f"more than {MAX_MEMBERS} members"})
                    break
                relative = target_of(info.name)
                if relative is None or not info.isreg():
                    why = "not a regular file" if relative else "not a name packing gives"
                    left_out.append({"name": shown, "why": why})
                    continue
                if total + info.size > max_bytes:
                    left_out.append({"name": shown, "why": f"past the cap of {max_bytes} bytes"})
                    break
                handle = tar.extractfile(info)
                data = handle.read(info.size) if handle else b""
                total += len(data)
                if check_mode:
                    target = os.path.join(dest, relative)
                    (unchanged if _same(target, data) else written).append(relative)
                    continue
                (written if _write(dest, relative, data) else unchanged).append(relative)
    except (tarfile.TarError, EOFError, OSError, ValueError) as error:
        raise TransferError(f"the archive is unreadable: {str(error)[:300]}") from None
    return {"written": written, "unchanged": unchanged, "left_out": left_out}
