"""Looks for secrets, and for values anyone can derive from them, in files others can read.

A secret's unkeyed hash is the secret (a dictionary attack on a weak API key recovers it), and
its base64 form is what an echoed `Authorization` header carries: all of those count as a leak.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# Digests a careless change would reach for; all of them are unkeyed.
ALGORITHMS = ("md5", "sha1", "sha224", "sha256", "sha384", "sha512", "blake2b", "blake2s")
# A file larger than this is read in pieces (journals, logs, weights); a secret across two
# pieces is found through the overlap. A piece stays in the CPU's cache while every form of
# every secret is looked for in it: 64 MiB of weights took 0.24-0.28 CPU-s in 8 MiB pieces
# and 0.155-0.18 s in 1 MiB ones (tests/benchmarks/secret_scan_chunks.py).
CHUNK = 1 << 20


def derived_forms(secret: str) -> dict[str, bytes]:
    """The secret and what anyone can compute from it, each as the bytes to look for."""
    raw = secret.encode()
    forms = {"plain": raw}
    for name in ALGORITHMS:
        forms[f"{name}(secret)"] = hashlib.new(name, raw).hexdigest().encode()
    forms["base64(secret)"] = base64.b64encode(raw).rstrip(b"=")
    forms["base64(Bearer secret)"] = base64.b64encode(b"Bearer " + raw).rstrip(b"=")
    return forms


def legacy_launch_hash(argv: list[str], environment: dict, api_key: str) -> str:
    """The server role's old change-detection value: sha256 of Ansible's
    `[argv, environment, {'api_key': key}] | to_json(sort_keys=true)` (json's default
    separators, as Ansible's encoder writes them)."""
    text = json.dumps([argv, environment, {"api_key": api_key}], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Leak:
    path: Path
    form: str
    secret: str  # the secret's label, never its value

    def __str__(self) -> str:
        return f"{self.path}: {self.form} of {self.secret}"


def readable_by_others(path: Path, top: Path, folders: dict | None = None) -> bool:
    """Whether someone other than root can read the file: read permission for other users (or
    for a group other than root's) on it, and search permission on every folder from `top`
    down to it. Files under `top` are judged as the host sees them (ownership and modes are
    kept by the overlay's upper layer). `folders`: a scan's memo of each folder's verdict."""
    info = path.lstat()
    if not stat.S_ISREG(info.st_mode):
        return False
    others, group = bool(info.st_mode & stat.S_IROTH), bool(info.st_mode & stat.S_IRGRP)
    if not (others or (group and info.st_gid != 0)):
        return False
    return _searchable(path.parent, top, {} if folders is None else folders)


def _searchable(folder: Path, top: Path, folders: dict) -> bool:
    """Search permission for others on folder and every folder above it up to `top`."""
    key = (folder, top)
    if key not in folders:
        mode = folder.stat()
        if not (mode.st_mode & stat.S_IXOTH or (mode.st_mode & stat.S_IXGRP and mode.st_gid)):
            folders[key] = False
        elif folder == top or folder == folder.parent:
            folders[key] = True
        else:
            folders[key] = _searchable(folder.parent, top, folders)
    return folders[key]


def files_under(tops: Iterable[Path], exclude: Iterable[Path] = ()) -> Iterable[tuple[Path, Path]]:
    """(top, file) for every regular file under the tops, symlinks not followed."""
    excluded = {Path(p).resolve() for p in exclude}
    for top in tops:
        top = Path(top)
        if not top.exists():
            continue
        for folder, dirs, files in os.walk(top, followlinks=False):
            here = Path(folder)
            # A regular file's own path resolves to its resolved folder's (links are skipped).
            resolved = here.resolve()
            dirs[:] = [d for d in dirs if (here / d).resolve() not in excluded]
            for name in files:
                path = here / name
                try:
                    regular = stat.S_ISREG(path.lstat().st_mode)
                except FileNotFoundError:  # gone since the folder was listed
                    continue
                if regular and resolved / name not in excluded:
                    yield top, path


def scan(
    tops: Iterable[Path],
    secrets: dict[str, dict[str, bytes]],
    exclude: Iterable[Path] = (),
    readable_only: bool = True,
) -> tuple[list[Leak], int]:
    """Every leak found, and how many files were read. `secrets` maps a label to its forms
    (derived_forms plus any extra value, such as legacy_launch_hash)."""
    # Matched case-blind (a hex digest may be written in capitals): a value found as it is is
    # found lowered too.
    needles = [
        (label, form, value.lower())
        for label, forms in secrets.items()
        for form, value in forms.items()
    ]
    overlap = max(len(value) for _, _, value in needles)
    leaks: list[Leak] = []
    read = 0
    folders: dict = {}
    for top, path in files_under(tops, exclude):
        if readable_only and not readable_by_others(path, top, folders):
            continue
        read += 1
        found: set[tuple[str, str]] = set()
        tail = b""
        with path.open("rb") as handle:
            while chunk := handle.read(CHUNK):
                window = tail + chunk
                folded = window.lower()
                for label, form, value in needles:
                    if value in folded:
                        found.add((label, form))
                tail = window[-overlap:]
        leaks += [Leak(path, form, label) for label, form in sorted(found)]
    return leaks, read
