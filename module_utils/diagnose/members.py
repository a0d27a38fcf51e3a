"""What the support bundle is made of, on the host and on the controller alike: its kinds and
files, the states of the manifest's items, member names that are always safe, and one
archive member.

Standard library only: the modules ship it to hosts (AnsiballZ), whose Pythons may be 3.10.
"""

from __future__ import annotations

import datetime
import re
import tarfile
import time

from ansible.module_utils.host import archive

HOST_KIND = "kimi.diagnose.host"
BUNDLE_KIND = "kimi.diagnose"
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
INDEX = "index.json"
# A work folder older than this was left by a run that never came back (the module's timeout
# is at most an hour): the next run removes it.
STALE_WORK_S = 2 * 3600

# Item states in the manifest.
OK = "ok"  # collected whole
CUT = "cut"  # collected, capped (the member says what was kept)
ABSENT = "absent"  # the source is not on this host (a record not written yet, no runtime)
MISSING = "missing"  # the command is not on this host
FAILED = "failed"  # a non-zero exit, an unreadable file, something not a regular file
TIMED_OUT = "timed_out"  # killed at its deadline
NOT_RUN = "not_run"  # the collection's deadline ran out first, or the tool hung before
LEFT_OUT = "left_out"  # collected but past the host's cap
COLLECTED = (OK, CUT)

# A member name is parts of these characters joined by "/": never absolute, never "." or "..",
# never hidden, never an option-like leading dash.
SAFE_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
MAX_PARTS = 6
# One reason, error or stderr excerpt in the manifest.
WHY_MAX = 2000


class BadInput(Exception):
    """An option the module cannot work with: found, needed, fix."""


def utc_now() -> str:
    # timezone.utc, not datetime.UTC: hosts may run Python 3.10.
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")  # noqa: UP017


def clip(text: str, limit: int = WHY_MAX) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + " [...]"


# -- names --------------------------------------------------------------------------------


def safe_part(text: str, fallback: str = "_") -> str:
    """One path part that SAFE_PART accepts, made from any text (a host name, a file name):
    other characters become "_", a leading dot or dash gets a "_" before it."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", str(text))[:127]
    if cleaned[:1] in (".", "-"):
        cleaned = "_" + cleaned
    return cleaned if SAFE_PART.fullmatch(cleaned or "") else fallback


def valid_member(name: str) -> bool:
    """Whether a member name is one the bundle writes: relative, of SAFE_PART parts only."""
    if not isinstance(name, str) or not name or len(name) > 512:
        return False
    parts = name.split("/")
    return len(parts) <= MAX_PARTS and all(SAFE_PART.fullmatch(part) for part in parts)


def unique(name: str, taken: set[str]) -> str:
    """name, or name-2, name-3 ... when another already took it (two host names that differ
    only in characters safe_part replaced)."""
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}-{n}"
    taken.add(candidate)
    return candidate


def add_member(tar: tarfile.TarFile, name: str, data: bytes, mtime: float | None = None) -> None:
    """A regular file member, root-only when extracted, owned by nobody in particular, dated
    now unless given a time."""
    archive.add_member(tar, name, data, 0o600, time.time() if mtime is None else mtime)
