"""Where report() and compare() write: a fresh folder, filled through a hidden staging folder
beside it and renamed into place at the end, so a failed run leaves no half report behind; and
the Outcome they return.

Nothing that exists is overwritten. The output goes to --out when given (it must not exist, or
be empty), else `report/` inside the results folder, or `report-2/`, `report-3/`, ... when the
earlier ones hold files.
"""

from __future__ import annotations

import datetime
import errno
import html
import os
import shutil
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

MAX_NUMBERED = 1000


class OutputError(Exception):
    """The output folder cannot be used; the message says why and what to do."""


@dataclass
class Outcome:
    out: Path
    files: list[str]
    table: list[dict]
    picks: list
    warnings: list[dict]
    seconds: dict = field(default_factory=dict)
    levels: int = 0
    records: int = 0
    inputs: int = 0
    # report: the speed model's view (report.json's predicted rows and notes, and the DDTree
    # budget diagnosis)
    predicted: dict = field(default_factory=dict)
    # compare: per run ("a", "b") its model and DDTree collapse diagnosis (report.json's)
    diagnosis: dict = field(default_factory=dict)

    @property
    def html(self) -> Path:
        return self.out / (
            "compare.html" if (self.out / "compare.html").exists() else "report.html"
        )


def _empty_dir(path: Path) -> bool:
    try:
        return path.is_dir() and not any(path.iterdir())
    except OSError as error:
        raise OutputError(_cannot_write(path, error)) from None


def _cannot_write(path: Path, error: OSError) -> str:
    """What went wrong writing under --out, in words: a full disk, no permission, a
    read-only file system, or the system's own words for anything else."""
    cause = {
        errno.ENOSPC: "no space left on the device",
        errno.EDQUOT: "the disk quota is used up",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.EROFS: "the file system is read-only",
    }.get(error.errno)
    words = error.strerror or str(error)
    why = f"{words} ({cause})" if cause and cause.lower() != words.lower() else words
    return (
        f"cannot write {path}: {why}; nothing was left behind. Free some space or choose "
        "another --out"
    )


def choose_out(parent: Path, out: Path | str | None, name: str) -> Path:
    """The folder to write: `out` if it is free, else the first free parent/name[-N]."""
    if out is not None:
        out = Path(out)
        if out.exists() and not _empty_dir(out):
            raise OutputError(
                f"{out} already exists and is not empty; nothing there is overwritten. Choose "
                "another --out, or leave it out to get a fresh folder inside the results."
            )
        return out
    for number in range(1, MAX_NUMBERED + 1):
        candidate = parent / (name if number == 1 else f"{name}-{number}")
        if not candidate.exists() or _empty_dir(candidate):
            return candidate
    raise OutputError(f"{parent} already holds {MAX_NUMBERED} {name} folders; use --out")


class Staging:
    """A hidden folder beside the target, renamed onto it when everything is written."""

    def __init__(self, target: Path):
        self.target = target
        self.path = target.parent / f".{target.name}.tmp-{os.getpid()}"
        self.files: list[str] = []

    def __enter__(self):
        try:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            self.path.mkdir()
        except OSError as error:
            raise OutputError(_cannot_write(self.target.parent, error)) from None
        return self

    def write(self, name: str, content: str | bytes) -> None:
        path = self.path / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content, encoding="utf-8")
        except OSError as error:
            # Named as it would have been in the target: the staging folder is removed.
            raise OutputError(_cannot_write(self.target / name, error)) from None
        self.files.append(name)

    def __exit__(self, kind, value, traceback):
        if kind is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            return False
        try:
            if _empty_dir(self.target):
                self.target.rmdir()
            # rename refuses a target that exists and is not empty: a folder someone filled
            # meanwhile is left alone.
            self.path.rename(self.target)
        except OSError as error:
            shutil.rmtree(self.path, ignore_errors=True)
            raise OutputError(
                f"cannot move the report into {self.target}: {error.strerror or error}"
            ) from None
        return False


def terminal_text(text: str) -> str:
    """text for a terminal: each control or format character but the newline (an escape
    sequence that would repaint the screen or hide what follows, a bidirectional override)
    shown as '?'. Names in the results are outside input."""
    return "".join(
        "?" if unicodedata.category(char)[0] == "C" and char != "\n" else char for char in text
    )


def markdown_text(text: str) -> str:
    """text for summary.md's prose and table cells: HTML escaped (a host name is not markup),
    each control character '?', a table's | and a line break kept from ending the cell."""
    text = terminal_text(str(text)).replace("\n", " ")
    return html.escape(text, quote=False).replace("|", "\\|").replace("`", "&#96;")


def markdown_code(text: str) -> str:
    """text for a code span of summary.md (markup there is shown as it is): each control
    character '?', a backtick, which would end the span, an apostrophe, one line."""
    return terminal_text(str(text)).replace("\n", " ").replace("`", "'")


def now() -> str:
    """The time a report says it was generated at."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
