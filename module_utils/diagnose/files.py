"""Reading the host's files for the support bundle: bounded, only regular files reached
without a link, never blocking on a FIFO; and the secret values of the server's secrets and
environment files, with the files as the bundle shows them (those values masked).

Standard library only: the module ships it to hosts (AnsiballZ), whose Pythons may be 3.10.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat

from ansible.module_utils.diagnose.members import ABSENT, FAILED
from ansible.module_utils.host.helpers import MASK, SECRET_KEY

# -- bounded reads -------------------------------------------------------------------------


class Unreadable(Exception):
    def __init__(self, status: str, why: str):
        super().__init__(why)
        self.status, self.why = status, why


def open_regular(path: str, dir_fd: int | None = None) -> int:
    """A read-only descriptor of a regular file reached without a link in its last part
    (O_NOFOLLOW), opened non-blocking so a FIFO put where a log was expected cannot hang the
    collection. Unreadable says why not."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise Unreadable(ABSENT, "no such file") from None
    except OSError as error:
        if error.errno == errno.ELOOP:
            try:
                target = os.readlink(path, dir_fd=dir_fd)
            except OSError:
                target = "?"
            raise Unreadable(
                FAILED, f"a link (to {target}): the bundle reads no file through a link"
            ) from None
        raise Unreadable(FAILED, error.strerror or str(error)) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise Unreadable(FAILED, "not a regular file")
    return fd


def read_head(fd: int, cap: int) -> tuple[bytes, bool]:
    """(at most cap bytes from the start, whether more followed), cut at a line's end so no
    half of a secret stays for the scrubber to miss. procfs files read the same way (their
    size says 0)."""
    with os.fdopen(os.dup(fd), "rb") as handle:
        data = handle.read(cap + 1)
    if len(data) <= cap:
        return data, False
    end = data.rfind(b"\n", 0, cap)
    return (data[: end + 1] if end >= 0 else data[:cap]), True


def read_tail(fd: int, cap: int, lines: int) -> tuple[bytes, int, bool]:
    """(the last `lines` lines within the last cap bytes, the file's size, whether the lines
    kept are fewer than the file holds)."""
    size = os.fstat(fd).st_size
    start = max(0, size - cap)
    with os.fdopen(os.dup(fd), "rb") as handle:
        handle.seek(start)
        data = handle.read(cap)
    if start > 0:
        # A line cut at the window's start is dropped whole.
        data = data[data.find(b"\n") + 1 :] if b"\n" in data else b""
    kept = data.splitlines(keepends=True)
    cut = start > 0 or len(kept) > lines
    return b"".join(kept[-lines:]) if lines > 0 else b"", size, cut


# -- secrets on the host ---------------------------------------------------------------------


def unquote(value: str) -> str:
    """A YAML or environment-file scalar as its program reads it: '...' with '' doubled,
    "..." with backslash escapes, or plain (a trailing comment dropped)."""
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1].replace("''", "'")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            loaded = json.loads(value)
        except ValueError:
            return value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        return loaded if isinstance(loaded, str) else value[1:-1]
    return re.split(r"\s+#", value, maxsplit=1)[0].strip()


YAML_ITEM = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*:\s*(.*?)\s*$")
ENV_ITEM = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def secrets_file_values(text: str) -> tuple[list[str], str]:
    """(every value of the server's secrets file: all of it is secret; the file as the bundle
    shows it, each value masked)."""
    values, shown = [], []
    for line in text.splitlines():
        found = YAML_ITEM.match(line)
        if found and unquote(found.group(2)):
            values += [unquote(found.group(2)), found.group(2)]
            shown.append(f"{found.group(1)}: {MASK}")
        elif found or line.strip().startswith("#") or not line.strip():
            shown.append(line)
        else:
            # A line of another shape (a block scalar, a list item) may hold a secret: it is
            # masked (long enough not to mask ordinary words) and shown as masked.
            value = unquote(line.strip().lstrip("-"))
            if len(value) >= 8:
                values.append(value)
            shown.append(MASK)
    return [v for v in values if v and v != MASK], "\n".join(shown) + "\n"


def env_file_values(text: str) -> tuple[list[str], str]:
    """(the values of the environment file's secret-named variables; the file as the bundle
    shows it, those values masked)."""
    values, shown = [], []
    for line in text.splitlines():
        found = ENV_ITEM.match(line)
        if found and SECRET_KEY.search(found.group(1)) and unquote(found.group(2)):
            values += [unquote(found.group(2)), found.group(2).strip()]
            shown.append(f"{found.group(1)}={MASK}")
        else:
            shown.append(line)
    return [v for v in values if v and v != MASK], "\n".join(shown) + "\n"
