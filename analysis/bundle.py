"""python -m analysis bundle RESULTS_DIR --out FILE.tar.gz: one run packed for sharing, every file
scrubbed of secrets.

Masked in every file (gzip members decompressed, scrubbed and compressed again): the values of
HF_TOKEN, HUGGING_FACE_HUB_TOKEN and KIMI_SERVER_API_KEY when set, of each --secret-env
variable and of each line of --secret-file; their base64 forms at every alignment (an echoed
Authorization header) and their unkeyed hex digests; and what looks like a secret whoever
wrote it: `hf_` and 30 or more letters and digits, `Authorization: Bearer <x>`,
`api_key=<x>`, `--api-key <x>`, `"api_key": "<x>"`, a URL's password.

Confined: links are followed only to regular files inside RESULTS_DIR (a link out of it, or
to a folder, is left out and listed); members are named relative to the run's folder, never
absolute or with `..`. Bounded: a file over --max-file-bytes, and whatever would take the
whole past --max-bytes, is left out and listed. The archive is written next to --out and
linked into place, so it is whole or absent, and an existing --out is never replaced.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import stat
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ansible.module_utils.contract.secrets import CONTROLLER_SECRET_ENV as SECRET_ENV
from ansible.module_utils.host.archive import PartialArchive, add_member
from ansible.module_utils.host.secret_scrub import Scrubber

DEFAULT_MAX_FILE_BYTES = 512 << 20
DEFAULT_MAX_BYTES = 8 << 30
MAX_SECRET_FILE_BYTES = 1 << 20
MAX_FILES = 200_000


class BundleError(Exception):
    """Bad input: the message says what and how to fix it."""


@dataclass
class Bundled:
    out: Path
    members: list[str] = field(default_factory=list)
    bytes: int = 0
    masked: int = 0
    secrets: int = 0
    left_out: list[tuple[str, str]] = field(default_factory=list)


def gather_secrets(
    secret_env: list[str], secret_file: str | None, environ=os.environ
) -> tuple[list[str], list[str]]:
    """(secret values, where each kind came from, for the summary: names, never values)."""
    values, sources = [], []
    for name in SECRET_ENV:
        if environ.get(name):
            values.append(environ[name])
            sources.append(name)
    for name in secret_env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise BundleError(f"--secret-env {name!r} is no variable name")
        if not environ.get(name):
            raise BundleError(
                f"--secret-env {name}: the variable is not set or empty, so its value cannot be "
                "masked. Fix: export it, or leave the option out."
            )
        values.append(environ[name])
        sources.append(name)
    if secret_file:
        path = Path(secret_file)
        try:
            info = path.stat()
            if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_SECRET_FILE_BYTES:
                raise BundleError(
                    f"--secret-file {path}: needed a regular file of at most "
                    f"{MAX_SECRET_FILE_BYTES} bytes, one secret a line"
                )
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise BundleError(f"--secret-file {path} cannot be read: {error}") from None
        found = [line.strip() for line in lines if line.strip()]
        values += found
        sources.append(f"{len(found)} lines of {path.name}")
    return list(dict.fromkeys(values)), sources


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def member_name(top: str, rel: PurePosixPath) -> str:
    name = str(PurePosixPath(top) / rel)
    parts = PurePosixPath(name).parts
    if name.startswith("/") or ".." in parts or "." in parts or not rel.parts:
        raise BundleError(f"{name}: not a member name the bundle writes")
    return name


def candidates(root: Path) -> tuple[list[tuple[PurePosixPath, Path]], list[tuple[str, str]]]:
    """(relative name, file to read) of every regular file under root, links to regular files
    inside root read through; and what was left out, with why."""
    found, left_out = [], []
    for folder, dirs, files in os.walk(root, followlinks=False):
        here = Path(folder)
        rel_here = here.relative_to(root)
        for name in sorted(dirs):
            path = here / name
            if name.startswith("."):
                left_out.append((str(rel_here / name), "hidden folder"))
            elif path.is_symlink():
                left_out.append((str(rel_here / name), "a link to a folder: not followed"))
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not (here / d).is_symlink())
        for name in sorted(files):
            path = here / name
            rel = PurePosixPath(*(rel_here / name).parts)
            if name.startswith("."):
                left_out.append((str(rel), "hidden file"))
                continue
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                try:
                    target = path.resolve(strict=True)
                except (OSError, RuntimeError):
                    left_out.append((str(rel), "a broken link"))
                    continue
                if not _inside(target, root):
                    left_out.append((str(rel), "a link out of the results folder: not followed"))
                    continue
                info = target.stat()
                path = target
            if not stat.S_ISREG(info.st_mode):
                left_out.append((str(rel), "not a regular file"))
                continue
            found.append((rel, path))
            if len(found) > MAX_FILES:
                raise BundleError(f"{root}: more than {MAX_FILES} files: point at one run")
    return found, left_out


def read_bounded(path: Path, limit: int) -> bytes | None:
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    return None if len(data) > limit else data


def gunzip_bounded(data: bytes, limit: int) -> bytes | None:
    """The decompressed bytes of every gzip member, or None past limit; ValueError when it is
    no gzip."""
    out = bytearray()
    while data:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out += inflater.decompress(data, limit + 1 - len(out))
        except zlib.error as error:
            raise ValueError(str(error)) from None
        if len(out) > limit or inflater.unconsumed_tail:
            return None
        if not inflater.eof:
            raise ValueError("truncated")
        data = inflater.unused_data
    return bytes(out)


def bundle(
    results_dir: str,
    out: str,
    secret_env: list[str] = (),
    secret_file: str | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    environ=os.environ,
) -> Bundled:
    root, target, parent = _places(results_dir, out)
    values, sources = gather_secrets(list(secret_env), secret_file, environ)
    scrub = Scrubber(values)
    done = Bundled(out=target, secrets=len(values))
    files, done.left_out = candidates(root)
    top = root.name or "run"
    partial = PartialArchive(str(parent), prefix=f".{target.name}.")
    try:
        with partial.tar() as tar:
            _pack(tar, top, files, scrub, done, max_file_bytes, max_bytes)
            manifest = _manifest(top, done, scrub.count, sources)
            add(tar, f"{top}/BUNDLE.json", scrub.bytes(json.dumps(manifest, indent=1).encode()))
        # A link cannot replace a file: an --out that appeared meanwhile is kept.
        try:
            partial.publish(str(target), 0o644)
        except FileExistsError:
            raise BundleError(f"--out {out} appeared while packing; it was left as it is") from None
    finally:
        partial.discard()
    done.masked = scrub.count
    return done


def _places(results_dir: str, out: str) -> tuple[Path, Path, Path]:
    """(the run's folder resolved, the archive, the archive's folder resolved); BundleError
    for a results folder that is none, or an --out that is taken, misnamed or inside the run."""
    root_given = Path(results_dir)
    if not root_given.is_dir():
        raise BundleError(f"{results_dir}: not a folder; give a run's results folder")
    root = root_given.resolve()
    target = Path(out)
    if not target.name.endswith((".tar.gz", ".tgz")):
        raise BundleError(f"--out {out}: needed a file name ending in .tar.gz")
    if target.exists() or target.is_symlink():
        raise BundleError(
            f"--out {out} exists; the bundle never replaces a file. Fix: another name"
        )
    parent = target.parent.resolve()
    if not parent.is_dir():
        raise BundleError(f"--out {out}: the folder {target.parent} does not exist")
    if _inside(parent, root):
        raise BundleError(f"--out {out} is inside {results_dir}; put it outside the run")
    return root, target, parent


def _pack(tar, top, files, scrub, done: Bundled, max_file_bytes: int, max_bytes: int) -> None:
    """Every candidate file scrubbed into the archive, within the limits; what is not goes
    into done.left_out with why."""
    for rel, path in files:
        name = member_name(top, rel)
        data, why = _scrubbed(rel, path, scrub, max_file_bytes)
        if data is None:
            done.left_out.append((str(rel), why))
            continue
        if done.bytes + len(data) > max_bytes:
            done.left_out.append((str(rel), f"past --max-bytes {max_bytes} in all"))
            continue
        add(tar, name, data, path.stat().st_mtime)
        done.members.append(name)
        done.bytes += len(data)


def _scrubbed(
    rel: PurePosixPath, path: Path, scrub: Scrubber, max_file_bytes: int
) -> tuple[bytes | None, str | None]:
    """(the file's bytes scrubbed, None), a gzip file decompressed, scrubbed and compressed
    again; or (None, why it is left out)."""
    data = read_bounded(path, max_file_bytes)
    if data is None:
        return None, f"over --max-file-bytes {max_file_bytes}"
    if not rel.name.endswith(".gz"):
        return scrub.bytes(data), None
    try:
        plain = gunzip_bounded(data, max_file_bytes)
    except ValueError as error:
        # What cannot be read cannot be scrubbed: it stays home.
        return None, f"no readable gzip ({error})"
    if plain is None:
        return None, f"decompresses past --max-file-bytes {max_file_bytes}"
    return gzip.compress(scrub.bytes(plain), mtime=0), None


def _manifest(top: str, done: Bundled, masked: int, sources: list[str]) -> dict:
    """BUNDLE.json: what the archive holds, what it left out and why, and what was masked."""
    return {
        "kind": "analysis.bundle",
        "run": top,
        "members": done.members,
        "left_out": [{"path": p, "why": why} for p, why in done.left_out],
        "masked_values": masked,
        "secrets_from": sources,
    }


def add(tar: tarfile.TarFile, name: str, data: bytes, mtime: float = 0) -> None:
    """A member anyone may read once the bundle is shared, dated as its file (the manifest
    at 0)."""
    add_member(tar, name, data, 0o644, mtime)
