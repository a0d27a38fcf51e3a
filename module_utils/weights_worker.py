"""The weights download worker: fetches the missing files of one repository revision.

A program, started by library/weights_download.py (module_utils/weights_transfer.py) as
`<python> -c <this file's source> SPEC_JSON kimi-weights-worker`, where <python> is the tools
environment that holds huggingface_hub (not the module's Python, and without Ansible). Ansible
ships this file inside the module's payload because the module imports it; the module hands its
source to that Python. At the top it imports only the standard library; huggingface_hub is
imported by the transfer that uses it. The last argument, PROCESS_MARK, lets a later run of the
module recognise a worker an earlier run left behind.

SPEC: repo_id, revision, local_dir, max_workers, transfer ("hub": huggingface_hub's
snapshot_download, xet where offered; "http": plain HTTP from /resolve/ with in-file resume),
files ([{path, size}]) and missing (the paths snapshot_download is allowed to fetch).

A failure the module can explain ends the worker with one of the EXIT_* codes after one JSON
line on stderr, error_line(): {"error": <KIND_*>, "detail": ...}; last_error() reads it back.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

PROCESS_MARK = "kimi-weights-worker"
# Exit codes, so the module can tell its failures apart (anything else: a crash, retried).
EXIT_AUTH, EXIT_REVISION, EXIT_NOT_FOUND, EXIT_DISK_FULL = 2, 3, 4, 5
KIND_GATED = "gated"
KIND_INVALID_TOKEN = "invalid_token"  # noqa: S105 - an error kind, not a token
KIND_REVISION = "revision_not_found"
KIND_NOT_FOUND = "not_found"
KIND_DISK_FULL = "disk_full"
ERROR_PREFIX = '{"error"'
DETAIL_CHARS = 2000
# The kit's own partial files (plain HTTP transfer), per revision, beside huggingface_hub's.
PARTIAL_DIR = os.path.join(".cache", "huggingface", "download")
PARTIAL_SUFFIX = ".kimi.incomplete"
DEFAULT_ENDPOINT = "https://huggingface.co"
READ_TIMEOUT_S = 120


def error_line(kind: str, error: object) -> str:
    return json.dumps({"error": kind, "detail": str(error)[:DETAIL_CHARS]})


def last_error(lines: list[str]) -> dict:
    """The last error_line() among lines (the end of the worker's log), or {}."""
    for line in reversed(lines):
        if line.startswith(ERROR_PREFIX):
            try:
                found = json.loads(line)
            except ValueError:
                break
            return found if isinstance(found, dict) else {}
    return {}


def stop(code: int, kind: str, error: object) -> None:
    print(error_line(kind, error), file=sys.stderr, flush=True)
    sys.exit(code)


def partial_suffix(revision: str) -> str:
    return f".{revision[:12]}{PARTIAL_SUFFIX}"


def resolve_url(endpoint: str, repo_id: str, revision: str, path: str) -> str:
    return f"{endpoint.rstrip('/')}/{repo_id}/resolve/{revision}/{path}"


def resume_offset(have: int, size: int | None) -> int:
    """Bytes of a partial file to keep: none when it is longer than the file can be."""
    return 0 if size is not None and have > size else have


def http_failure(x_error_code: str | None, status: int) -> tuple[int, str] | None:
    """(exit code, kind) for a hub answer the module can explain; None for anything else."""
    if x_error_code == "GatedRepo":
        return EXIT_AUTH, KIND_GATED
    if status == 401:
        return EXIT_AUTH, KIND_INVALID_TOKEN
    if x_error_code == "RevisionNotFound":
        return EXIT_REVISION, KIND_REVISION
    if x_error_code == "RepoNotFound":
        return EXIT_NOT_FOUND, KIND_NOT_FOUND
    return None


def hub_transfer(spec: dict) -> None:
    # huggingface_hub's own path: xet where the hub offers it, HTTP otherwise.
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        # Only what is missing: files already verified are not looked at again.
        snapshot_download(
            repo_id=spec["repo_id"],
            revision=spec["revision"],
            local_dir=spec["local_dir"],
            max_workers=spec["max_workers"],
            allow_patterns=spec["missing"],
        )
    # GatedRepoError subclasses RepositoryNotFoundError: caught before it.
    except GatedRepoError as error:
        stop(EXIT_AUTH, KIND_GATED, error)
    except RevisionNotFoundError as error:
        stop(EXIT_REVISION, KIND_REVISION, error)
    except RepositoryNotFoundError as error:
        stop(EXIT_NOT_FOUND, KIND_NOT_FOUND, error)
    except HfHubHTTPError as error:
        if error.response is not None and error.response.status_code == 401:
            stop(EXIT_AUTH, KIND_INVALID_TOKEN, error)
        raise


def http_transfer(spec: dict) -> None:
    # Plain HTTP from /resolve/, resuming inside files with Range requests.
    import urllib.error
    import urllib.request

    endpoint = os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT)
    token = os.environ.get("HF_TOKEN")
    partial_root = os.path.join(spec["local_dir"], PARTIAL_DIR)

    def fetch(entry):
        final = os.path.join(spec["local_dir"], entry["path"])
        size = entry.get("size")
        if os.path.exists(final) and (size is None or os.path.getsize(final) == size):
            return
        part = os.path.join(partial_root, entry["path"] + partial_suffix(spec["revision"]))
        os.makedirs(os.path.dirname(part), exist_ok=True)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        have = resume_offset(os.path.getsize(part) if os.path.exists(part) else 0, size)
        if size is None or have < size:
            url = resolve_url(endpoint, spec["repo_id"], spec["revision"], entry["path"])
            request = urllib.request.Request(url)  # noqa: S310 - the hub's endpoint, http(s)
            if token:
                # Unredirected: never sent on to a storage host that a redirect points at.
                request.add_unredirected_header("Authorization", f"Bearer {token}")
            if have:
                request.add_header("Range", f"bytes={have}-")
            with urllib.request.urlopen(request, timeout=READ_TIMEOUT_S) as response:  # noqa: S310
                if have and response.status != 206:
                    have = 0
                with open(part, "ab" if have else "wb") as out:
                    while block := response.read(1 << 20):
                        out.write(block)
        if size is not None and os.path.getsize(part) != size:
            raise OSError(f"{entry['path']}: got {os.path.getsize(part)} of {size} bytes")
        os.replace(part, final)

    try:
        with ThreadPoolExecutor(spec["max_workers"]) as pool:
            list(pool.map(fetch, spec["files"]))
    except urllib.error.HTTPError as error:
        failure = http_failure(error.headers.get("X-Error-Code"), error.code)
        if failure:
            stop(*failure, error)
        raise


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    spec = json.loads(args[0])
    try:
        if spec["transfer"] == "hub":
            hub_transfer(spec)
        else:
            http_transfer(spec)
    except OSError as error:
        if error.errno == errno.ENOSPC:
            stop(EXIT_DISK_FULL, KIND_DISK_FULL, error)
        raise


if __name__ == "__main__":
    main()
