"""Reading one file of a results tree: only a regular file (or a link to one) of a bounded
size, parsed as JSON the way every reader here parses it, its syntax errors worded."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from ansible.module_utils.contract.level import MAX_LEVEL_BYTES

from analysis.results_values import MAX_NESTING

# Per file (the writer's bound; --max-file-bytes raises it).
DEFAULT_MAX_FILE_BYTES = MAX_LEVEL_BYTES


_NOT_REGULAR = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


def _not_regular(mode: int) -> str | None:
    for test, words in _NOT_REGULAR:
        if test(mode):
            return words
    return None if stat.S_ISREG(mode) else "not a file"


def _size_text(size: int) -> str:
    return f"{size} bytes"


def read_regular(path: Path | str, rel: str, limit: int) -> tuple[bytes | None, str | None]:
    """(the file's bytes, None), or (None, a 'file: (file): why' problem). Only a regular file
    (or a link to one) of at most `limit` bytes is read: /dev/zero never ends, a FIFO blocks
    until someone writes. The file is looked at before it is opened (for the message) and
    after (through the descriptor: what was opened is what is read); O_NONBLOCK makes the
    open of a FIFO swapped in between return at once instead of waiting for a writer."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)

    def refused(words: str) -> tuple[None, str]:
        return None, f"{rel}: (file): {words}"

    def not_regular(kind: str) -> tuple[None, str]:
        return refused(f"{kind}, not a regular file; only regular files (or links to one) are read")

    def too_big(size: int) -> tuple[None, str]:
        return refused(
            f"{_size_text(size)}, over the limit of {_size_text(limit)} per file; raise it with "
            "--max-file-bytes if the file is genuine"
        )

    try:
        info = os.stat(path)
        kind = _not_regular(info.st_mode)
        if kind:
            return not_regular(kind)
        if info.st_size > limit:
            return too_big(info.st_size)
        descriptor = os.open(path, flags)
    except OSError as error:
        return refused(f"cannot be read: {error.strerror or error}")
    try:
        info = os.fstat(descriptor)
        kind = _not_regular(info.st_mode)
        if kind:
            return not_regular(kind)
        os.set_blocking(descriptor, True)
        with os.fdopen(descriptor, "rb", buffering=0, closefd=False) as handle:
            # One read of the size it has, then chunks while it grows (up to the limit).
            data = handle.read(min(info.st_size, limit) + 1) or b""
            while len(data) <= limit:
                more = handle.read(min(1 << 24, limit + 1 - len(data)))
                if not more:
                    break
                data += more
    except OSError as error:
        return refused(f"cannot be read: {error.strerror or error}")
    finally:
        os.close(descriptor)
    if len(data) > limit:
        return too_big(len(data))  # it grew while being read
    return data, None


def parse_json(data: bytes):
    """json.loads, NaN and Infinity read as floats (so that number_problems names where they
    are: JSON has no such numbers, and the schema's "number" cannot refuse them)."""
    return json.loads(data, parse_constant=float)


def syntax_problem(error: json.JSONDecodeError, fix: str = "run that level again") -> str:
    # A string with no closing quote runs to the end of the file: cut short, too.
    if error.pos >= len(error.doc.rstrip()) or error.msg.startswith("Unterminated string"):
        return (
            f"the JSON ends early (line {error.lineno} column {error.colno}): the file is "
            f"truncated, or was cut while being copied; {fix}"
        )
    return f"not valid JSON: {error.msg} (line {error.lineno} column {error.colno})"


def unparsed_problem(error: Exception) -> str:
    if isinstance(error, RecursionError):
        return f"nested too deeply to read (more than {MAX_NESTING} levels are never written)"
    return str(error)
