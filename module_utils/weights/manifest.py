"""Weights on disk: manifest, verification and progress accounting.

Shared by library/weights_check.py, weights_download.py and weights_status.py. The layout of
one repository's folder (local_dir) is huggingface_hub's local_dir layout, plus the kit's
manifest beside the weights (the download worker, module_utils/weights/worker.py, writes the
kit's own partial files):

    <local_dir>/<files of the repo>
    <local_dir>/.cache/huggingface/download/<file>.metadata      huggingface_hub's own
    <local_dir>/.cache/huggingface/download/*.incomplete          partial downloads
    <local_dir>/kimi-manifest.json                                what was verified, when
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.host.helpers import file_sha256, read_json, write_json_atomic
from ansible.module_utils.weights.worker import (
    DEFAULT_ENDPOINT,
    MANIFEST,
    PARTIAL_SUFFIX,
    partial_suffix,
    unsafe_message,
    unsafe_path,
)

HF_STATE = os.path.join(".cache", "huggingface")
CHUNK = 8 << 20


# The argument spec weights_download and weights_check share (doc_fragments/
# kimi_weights_repository.py documents it).
REPOSITORY_OPTIONS = {
    "repo_id": {"type": "str", "required": True},
    "revision": {"type": "str", "required": True},
    "local_dir": {"type": "path", "required": True},
    "files": {"type": "list", "elements": "dict", "required": True},
    "verify": {"type": "str", "default": "full", "choices": ["full", "size"]},
    "rehash": {"type": "bool", "default": False},
    "hash_workers": {"type": "int", "default": 0},
}


SHA256 = re.compile(r"[0-9a-f]{64}")
BLOB_ID = re.compile(r"[0-9a-f]{40}")


class UnsafeListing(ValueError):
    """The hub's file list cannot be used as it is: a path or a field is not what it must be."""


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT


def entry_problem(entry: object) -> str | None:
    """What is wrong with one listing entry's fields, other than its path, or None."""
    if not isinstance(entry, dict):
        return f"an entry is not an object: {str(entry)[:100]!r}"
    size = entry.get("size")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
        return f"{entry.get('path')!r} has size {size!r} (needed a whole number >= 0)"
    for key, form in (("sha256", SHA256), ("blob_id", BLOB_ID)):
        value = entry.get(key)
        if value is not None and not (isinstance(value, str) and form.fullmatch(value)):
            return f"{entry.get('path')!r} has {key} {str(value)[:80]!r} (needed lowercase hex)"
    return None


def check_listing(
    local_dir: str | None, files: object, endpoint: str, repo_id: str, revision: str
) -> None:
    """Raise UnsafeListing unless every entry of the hub's file list is safe to use under
    local_dir (module_utils/weights/worker.py unsafe_path) and well-formed; the message names
    the entry and where the listing came from (hub address, repository and revision)."""
    where = {"repo_id": repo_id, "revision": revision}
    if not isinstance(files, list):
        raise UnsafeListing(f"the file list of {repo_id}@{revision} from {endpoint} is not a list")
    seen = set()
    for entry in files:
        problem = entry_problem(entry)
        if problem:
            raise UnsafeListing(
                f"the hub at {endpoint} gave a malformed file list for {repo_id}@{revision}: "
                f"{problem}. Nothing was touched."
            )
        reason = unsafe_path(local_dir, entry.get("path"))
        if reason:
            raise UnsafeListing(unsafe_message(entry.get("path"), reason, endpoint, where))
        if entry["path"] in seen:
            raise UnsafeListing(
                f"the hub at {endpoint} listed {entry['path']!r} twice for "
                f"{repo_id}@{revision}. Nothing was touched."
            )
        seen.add(entry["path"])


def file_entries(files: list[dict]) -> dict[str, dict]:
    return {entry["path"]: entry for entry in files}


def git_blob_sha1(path: str) -> str:
    digest = hashlib.sha1(usedforsecurity=False)
    digest.update(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def hash_matches(path: str, entry: dict) -> tuple[bool, str]:
    """Compare a file with the hub's sha256 (LFS) or git blob id (small files)."""
    if entry.get("sha256"):
        actual = file_sha256(path)
        return actual == entry["sha256"], actual
    if entry.get("blob_id"):
        actual = git_blob_sha1(path)
        return actual == entry["blob_id"], actual
    return True, ""


def inspect_files(
    local_dir: str,
    files: list[dict],
    revision: str,
    mode: str,
    workers: int,
    force_hash: bool = False,
) -> dict:
    """What is on disk against the hub's list and the manifest of earlier runs.

    mode "size" checks sizes only. mode "full" hashes every file the manifest does not vouch
    for: a manifest entry of the same revision whose size and modification time still match,
    and which was hashed when it was written, is trusted without reading the file again
    (force_hash re-reads everything). Returns good (path -> manifest record), missing, stale
    (wrong size or checksum), and how much was hashed.
    """
    manifest = read_json(os.path.join(local_dir, MANIFEST)) or {}
    recorded = manifest.get("files", {}) if manifest.get("revision") == revision else {}
    good, missing, stale, to_hash = {}, [], [], []
    for entry in files:
        path = os.path.join(local_dir, entry["path"])
        try:
            stat = os.stat(path)
        except OSError:
            missing.append(entry["path"])
            continue
        if entry.get("size") is not None and stat.st_size != entry["size"]:
            reason = f"size {stat.st_size}, expected {entry['size']}"
            stale.append({"path": entry["path"], "reason": reason})
            continue
        record = recorded.get(entry["path"])
        unchanged = (
            record is not None
            and record.get("size") == stat.st_size
            and record.get("mtime_ns") == stat.st_mtime_ns
        )
        if mode == "size":
            good[entry["path"]] = record if unchanged else _record(entry, stat, None)
        elif unchanged and record.get("hash_checked") and not force_hash:
            good[entry["path"]] = record
        else:
            to_hash.append((entry, stat))

    def check(item):
        entry, stat = item
        ok, actual = hash_matches(os.path.join(local_dir, entry["path"]), entry)
        return entry, stat, ok, actual

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for entry, stat, ok, actual in pool.map(check, to_hash):
            if ok:
                good[entry["path"]] = _record(entry, stat, actual)
            else:
                stale.append({"path": entry["path"], "reason": "checksum mismatch"})
    return {
        "good": good,
        "missing": missing,
        "stale": stale,
        "hashed": len(to_hash),
        "hashed_bytes": sum(stat.st_size for _entry, stat in to_hash),
    }


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _record(entry: dict, stat: os.stat_result, digest: str | None) -> dict:
    return {
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256": entry.get("sha256"),
        "blob_id": entry.get("blob_id"),
        "hash_checked": bool(digest),
        "verified_at": now_iso(),
    }


def write_manifest(local_dir: str, repo_id: str, revision: str, mode: str, good: dict) -> str:
    """The manifest: per file its size, mtime, expected hash and when it was verified."""
    path = os.path.join(local_dir, MANIFEST)
    write_json_atomic(
        path,
        {
            "repo_id": repo_id,
            "revision": revision,
            "verify_mode": mode,
            "verified_at": now_iso(),
            "files": dict(sorted(good.items())),
        },
    )
    return path


def remove_stale(local_dir: str, paths: list[str]) -> None:
    """Delete wrong files and huggingface_hub's record of them, so they are fetched again.

    Only files of the repository are touched; anything else in the folder stays.
    """
    for name in paths:
        for path in (
            os.path.join(local_dir, name),
            os.path.join(local_dir, HF_STATE, "download", f"{name}.metadata"),
        ):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


def partial_files(local_dir: str, revision: str, transfer: str | None = None) -> list[str]:
    """Partial downloads: the kit's own (per revision) and, for the hub transfer, hub ones."""
    mine = partial_suffix(revision)
    found = []
    for root, _dirs, names in os.walk(os.path.join(local_dir, HF_STATE, "download")):
        for name in names:
            if name.endswith(mine) or (
                transfer in (None, "hub")
                and name.endswith(".incomplete")
                and not name.endswith(PARTIAL_SUFFIX)
            ):
                found.append(os.path.join(root, name))
    return found


def remove_other_partials(local_dir: str, revision: str, transfer: str) -> None:
    """Partial files no transfer of this revision will resume: leftovers of another revision,
    and huggingface_hub's own once the plain HTTP transfer has taken over."""
    keep = set(partial_files(local_dir, revision, transfer))
    for root, _dirs, names in os.walk(os.path.join(local_dir, HF_STATE, "download")):
        for name in names:
            path = os.path.join(root, name)
            if name.endswith(".incomplete") and path not in keep:
                with contextlib.suppress(OSError):
                    os.remove(path)


def bytes_on_disk(
    local_dir: str, files: list[dict], revision: str = "", transfer: str | None = None
) -> tuple[int, int]:
    """(bytes downloaded so far, files complete): finished files plus partial downloads."""
    done = complete = 0
    for entry in files:
        try:
            size = os.path.getsize(os.path.join(local_dir, entry["path"]))
        except OSError:
            continue
        if entry.get("size") is None or size == entry["size"]:
            done += size
            complete += 1
    for path in partial_files(local_dir, revision, transfer):
        with contextlib.suppress(OSError):
            done += os.path.getsize(path)
    return done, complete


def progress_line(status: dict) -> str:
    total = status.get("bytes_total") or 0
    done = status.get("bytes_done") or 0
    percent = 100.0 * done / total if total else 0.0
    rate = status.get("rate_bytes_per_s") or 0
    eta = status.get("eta_s")
    eta_text = "unknown" if eta is None else _duration(eta)
    return (
        f"{status.get('repo_id')}: {status.get('state')} {_size(done)} of {_size(total)} "
        f"({percent:.1f}%), {_size(rate)}/s, ETA {eta_text}, files "
        f"{status.get('files_done', 0)}/{status.get('files_total', 0)}, restarts "
        f"{status.get('restarts', 0)}"
    )


def _size(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"
