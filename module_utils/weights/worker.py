"""The weights download worker: fetches the missing files of one repository revision.

A program, started by library/weights_download.py (module_utils/weights/transfer.py) as
`<python> -c <this file's source> SPEC_JSON kimi-weights-worker`, where <python> is the tools
environment that holds huggingface_hub (not the module's Python, and without Ansible). Ansible
ships this file inside the module's payload because the module imports it; the module hands its
source to that Python. At the top it imports only the standard library; huggingface_hub is
imported by the transfer that uses it. The last argument, PROCESS_MARK, lets a later run of the
module recognise a worker an earlier run left behind.

SPEC: repo_id, revision, local_dir, max_workers, transfer ("hub": huggingface_hub's
snapshot_download, xet where offered; "http": plain HTTP from /resolve/ with in-file resume),
files ([{path, size}]), missing (the paths snapshot_download is allowed to fetch), and
optionally timeout_s (connect and read deadline of each request) and retry_s (how long a
request answered 429 or 5xx is retried, Retry-After honoured within it).

Every path of the listing is checked with unsafe_path() before anything is fetched: the hub's
listing is untrusted, and a name like `../../x` would otherwise be written outside local_dir.

A failure the module can explain ends the worker with one of the EXIT_* codes after one JSON
line on stderr, error_line(): {"error": <KIND_*>, "detail": ...}; last_error() reads it back.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

PROCESS_MARK = "kimi-weights-worker"
# Exit codes, so the module can tell its failures apart (anything else: a crash, retried).
EXIT_AUTH, EXIT_REVISION, EXIT_NOT_FOUND, EXIT_DISK_FULL, EXIT_UNSAFE = 2, 3, 4, 5, 6
KIND_GATED = "gated"
KIND_INVALID_TOKEN = "invalid_token"  # noqa: S105 - an error kind, not a token
KIND_REVISION = "revision_not_found"
KIND_NOT_FOUND = "not_found"
KIND_DISK_FULL = "disk_full"
KIND_UNSAFE_PATH = "unsafe_path"
ERROR_PREFIX = '{"error"'
DETAIL_CHARS = 2000
# The kit's own partial files (plain HTTP transfer), per revision, beside huggingface_hub's.
PARTIAL_DIR = os.path.join(".cache", "huggingface", "download")
PARTIAL_SUFFIX = ".kimi.incomplete"
DEFAULT_ENDPOINT = "https://huggingface.co"
READ_TIMEOUT_S = 120
RETRY_S = 120
RETRY_STATUSES = (429, 500, 502, 503, 504)
# The kit's own files in a repository's folder, which no hub entry may overwrite.
MANIFEST = "kimi-manifest.json"
RESERVED_PREFIX = (".cache", "huggingface")
PATH_MAX_BYTES = 4096
NAME_MAX_BYTES = 255


def unsafe_path(local_dir: str | None, path: object) -> str | None:
    """Why a path from the hub's listing may not be used under local_dir, or None.

    Refused: anything not a plain relative POSIX path (absolute, '..' or '.' components, empty
    components, backslashes, NUL), the kit's own files, names longer than a filesystem takes,
    and, with local_dir given, a path that resolves outside local_dir once symlinks already
    there are followed (a symlink inside the folder that points out of it counts).
    """
    if not isinstance(path, str):
        return f"not a string ({type(path).__name__})"
    if not path:
        return "empty"
    if "\0" in path:
        return "a NUL byte"
    if "\\" in path:
        return "a backslash (not a POSIX path)"
    if path.startswith("/"):
        return "an absolute path"
    parts = path.split("/")
    if "" in parts:
        return "an empty component"
    if ".." in parts:
        return "a '..' component"
    if "." in parts:
        return "a '.' component"
    encoded = [part.encode("utf-8", "surrogateescape") for part in parts]
    if (
        sum(map(len, encoded)) + len(parts) > PATH_MAX_BYTES
        or max(map(len, encoded)) > NAME_MAX_BYTES
    ):
        return f"longer than a filesystem takes ({PATH_MAX_BYTES} bytes, {NAME_MAX_BYTES} a name)"
    if path == MANIFEST or tuple(parts[: len(RESERVED_PREFIX)]) == RESERVED_PREFIX:
        return "the kit's own bookkeeping file or folder"
    if local_dir is not None:
        root = os.path.realpath(local_dir)
        target = os.path.realpath(os.path.join(root, path))
        if os.path.commonpath([root, target]) != root or target == root:
            return f"resolves outside {local_dir} (to {target}) through a symlink"
    return None


def listing_problem(spec: dict, endpoint: str) -> str | None:
    """The first unsafe path of the spec's listing, as a message naming it and its source."""
    for entry in spec["files"]:
        reason = unsafe_path(spec["local_dir"], entry.get("path"))
        if reason:
            return unsafe_message(entry.get("path"), reason, endpoint, spec)
    return None


def unsafe_message(path: object, reason: str, endpoint: str, where: dict) -> str:
    return (
        f"the hub at {endpoint} listed an unsafe file path {path!r} for "
        f"{where['repo_id']}@{where['revision']}: {reason}. Nothing was fetched or written. Fix: "
        "check HF_ENDPOINT (kimi_hf_endpoint) points at a hub you trust."
    )


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


def exact_pattern(path: str) -> str:
    """An fnmatch pattern matching this one path only (a name may hold *, ? or [)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in path)


def hub_transfer(spec: dict) -> None:
    # huggingface_hub's own path: xet where the hub offers it, HTTP otherwise.
    import httpx2
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.utils import _http

    timeout = spec.get("timeout_s") or READ_TIMEOUT_S

    def client_with_deadlines():
        # huggingface_hub's session has no timeout: its tree listing would wait forever on a
        # hub that never answers. Its file requests pass their own (HF_HUB_*_TIMEOUT).
        client = _http.default_client_factory()
        client.timeout = httpx2.Timeout(timeout)
        return client

    _http.set_client_factory(client_with_deadlines)
    try:
        # Only what is missing: files already verified are not looked at again.
        snapshot_download(
            repo_id=spec["repo_id"],
            revision=spec["revision"],
            local_dir=spec["local_dir"],
            max_workers=spec["max_workers"],
            allow_patterns=[exact_pattern(path) for path in spec["missing"]],
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


def retry_after(value: str | None) -> float | None:
    """Seconds a Retry-After header asks for (its delay-seconds form), or None."""
    if value and value.strip().isdigit():
        return float(value.strip())
    return None


class HttpHub:
    """The hub's /resolve/ over plain HTTP: where it is, the token and the deadlines."""

    def __init__(self, spec: dict) -> None:
        self.endpoint = os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT)
        self.token = os.environ.get("HF_TOKEN")
        self.timeout = spec.get("timeout_s") or READ_TIMEOUT_S
        self.retry_s = spec.get("retry_s", RETRY_S)

    def timed_out(self, path: str, waiting_for: str) -> OSError:
        return OSError(
            f"{path}: the hub at {self.endpoint} timed out (no {waiting_for} within "
            f"{self.timeout:g} s)"
        )

    def request(self, repo_id: str, revision: str, path: str, have: int):
        """The GET of one file, from byte `have` on."""
        import urllib.request

        url = resolve_url(self.endpoint, repo_id, revision, path)
        request = urllib.request.Request(url)  # noqa: S310 - the hub's endpoint, http(s)
        if self.token:
            # Unredirected: never sent on to a storage host that a redirect points at.
            request.add_unredirected_header("Authorization", f"Bearer {self.token}")
        if have:
            request.add_header("Range", f"bytes={have}-")
        return request

    def opened(self, request, path: str):
        """urlopen with a deadline per request; 429 and 5xx retried with backoff, Retry-After
        honoured, for retry_s seconds at most."""
        import urllib.error
        import urllib.request

        give_up = time.monotonic() + self.retry_s
        wait = 1.0
        while True:
            try:
                return urllib.request.urlopen(request, timeout=self.timeout)  # noqa: S310
            except urllib.error.HTTPError as error:
                if error.code not in RETRY_STATUSES:
                    raise
                asked = retry_after(error.headers.get("Retry-After"))
                pause = wait if asked is None else asked
                if time.monotonic() + pause > give_up:
                    raise OSError(
                        f"{path}: the hub at {self.endpoint} answered {error.code} for "
                        f"{self.retry_s:g} s (Retry-After {asked}); giving up"
                    ) from error
                error.close()
                time.sleep(pause)
                wait = min(wait * 2, 30.0)
            except TimeoutError as error:
                raise self.timed_out(path, "answer") from error
            except urllib.error.URLError as error:
                if isinstance(error.reason, TimeoutError):
                    raise self.timed_out(path, "answer") from error
                raise


def fetch_file(hub: HttpHub, spec: dict, entry: dict) -> None:
    """One file of the listing into local_dir, through a partial file that a later run resumes;
    a file already there at its size is left alone."""
    final = os.path.join(spec["local_dir"], entry["path"])
    size = entry.get("size")
    if os.path.exists(final) and (size is None or os.path.getsize(final) == size):
        return
    partial_root = os.path.join(spec["local_dir"], PARTIAL_DIR)
    part = os.path.join(partial_root, entry["path"] + partial_suffix(spec["revision"]))
    os.makedirs(os.path.dirname(part), exist_ok=True)
    os.makedirs(os.path.dirname(final), exist_ok=True)
    have = resume_offset(os.path.getsize(part) if os.path.exists(part) else 0, size)
    if size is None or have < size:
        request = hub.request(spec["repo_id"], spec["revision"], entry["path"], have)
        with hub.opened(request, entry["path"]) as response:
            # A server that ignores the Range sends the whole file: start the part anew.
            if have and response.status != 206:
                have = 0
            append_body(hub, response, part, have, entry["path"])
    if size is not None and os.path.getsize(part) != size:
        raise OSError(f"{entry['path']}: got {os.path.getsize(part)} of {size} bytes")
    os.replace(part, final)


def append_body(hub: HttpHub, response, part: str, have: int, path: str) -> None:
    """The response's body onto the partial file (kept from byte `have`, or written anew)."""
    with open(part, "ab" if have else "wb") as out:
        try:
            while block := response.read(1 << 20):
                out.write(block)
        except TimeoutError as error:
            raise hub.timed_out(path, "bytes") from error


def http_transfer(spec: dict) -> None:
    # Plain HTTP from /resolve/, resuming inside files with Range requests.
    import urllib.error

    hub = HttpHub(spec)
    try:
        with ThreadPoolExecutor(spec["max_workers"]) as pool:
            list(pool.map(lambda entry: fetch_file(hub, spec, entry), spec["files"]))
    except urllib.error.HTTPError as error:
        failure = http_failure(error.headers.get("X-Error-Code"), error.code)
        if failure:
            stop(*failure, error)
        raise


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    spec = json.loads(args[0])
    problem = listing_problem(spec, os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT))
    if problem:
        stop(EXIT_UNSAFE, KIND_UNSAFE_PATH, problem)
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
