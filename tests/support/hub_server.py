"""A local Hugging Face Hub for tests: the API subset huggingface_hub uses, nothing more,
and the redirect of LFS files to a second origin, as the real hub sends them to its CDN.

Speaks what huggingface_hub 2.x calls (with HF_ENDPOINT pointing here) for auth_check,
model_info(files_metadata=True) and snapshot_download:

    GET  /api/models/{repo}/auth-check
    GET  /api/models/{repo}[/revision/{rev}][?blobs=true]
    GET  /api/models/{repo}/tree/{rev}[/{path}]?recursive=true
    HEAD|GET /{repo}/resolve/{rev}/{path}          (Range answered with 206)

and the same for dataset repositories (add_dataset), which the benchmark's prompt sets come
from: /api/datasets/{repo}[/revision/{rev}] and /datasets/{repo}/resolve/{rev}/{path}.
It offers no xet storage (no X-Xet-* headers), so huggingface_hub downloads over HTTP even
with HF_HUB_DISABLE_XET unset.

LFS files (*.safetensors, or LFS_MIN_SIZE bytes and more) are not served by the hub itself
while `redirect_lfs` is on (the default, as on huggingface.co): HEAD and GET of their
/resolve/ URL answer 302 Found, after the hub has checked access, with

    Location: {storage}/repos/../../{repo hash}/{sha256}?response-content-disposition=..
              &Expires=..&Policy=..&Signature=..&Key-Pair-Id=..     (a signed, expiring URL)
    X-Repo-Commit, X-Linked-Etag ("{sha256}"), X-Linked-Size, Accept-Ranges,
    and the redirect's own weak ETag and "Found. Redirecting to .." text body.

That answer is all huggingface_hub 2.4.0 reads: file_download.get_hf_file_metadata takes
X-Repo-Commit, X-Linked-Etag before ETag, Location and X-Linked-Size from it, because
utils/_http._httpx2_follow_hub_redirects_with_backoff stops at a redirect to another origin;
file_download._get_metadata_or_catch_error then drops the authorization header and http_get
GETs the Location itself, resuming there with Range after a cut or a read timeout.

The storage origin is a second server on another port of the same address. Like a
presigned-URL store it checks the URL's signature and expiry (403 otherwise), refuses a request
that also carries an Authorization header (400: one auth mechanism only, as S3 answers), and
answers Range with 206. Both servers log every request with its headers (the Authorization
value hidden) for tests to assert on, e.g. that no token ever reaches the storage origin.

Errors carry the status codes and X-Error-Code headers the real hub sends, so the client
raises the same exceptions: RepoNotFound, GatedRepo, RevisionNotFound, EntryNotFound, and a
401 "Invalid credentials in Authorization header" for a bad token.

For fault tests, a hub can misbehave as real ones and attackers do:
- file names are listed verbatim, in the tree API and in model_info's siblings, and served
  under /resolve/: a repository added with a file named `../../x`, `/etc/x` or `a\\b` is a
  malicious listing;
- `hangs` (URL path prefixes): such a request is read, then never answered (the connection
  stays open until the hub stops), as a hub that accepts connections and then hangs;
- `busy` (Busy records): a request answered 429 or 5xx a number of times, optionally with
  Retry-After, before it is served normally.

Run as a program (`python -m tests.support.hub_server --repo ID --dir DIR`), it serves the
files of a folder in its own process, for benchmarks whose client must not share the hub's
interpreter.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import hashlib
import hmac
import json
import os
import secrets
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

LFS_MIN_SIZE = 1024  # files this large (or *.safetensors) are served as LFS files
CHUNK = 1 << 20
URL_LIFETIME = 3600  # seconds a redirect's signed URL stays valid, as the hub's CDN URLs
KEY_PAIR_ID = "KLOCALHUBTEST0"


@dataclass(eq=False)
class HubFile:
    """One file of a repository: bytes in memory, or a file on disk read as it is sent."""

    path: str
    data: bytes | None = None
    source: Path | None = None

    @property
    def size(self) -> int:
        return len(self.data) if self.data is not None else self.source.stat().st_size

    @property
    def is_lfs(self) -> bool:
        return self.size >= LFS_MIN_SIZE or self.path.endswith(".safetensors")

    def chunks(self, start: int, stop: int, size: int = CHUNK):
        """The bytes [start, stop) in pieces of at most `size`."""
        if self.data is not None:
            for position in range(start, stop, size):
                yield self.data[position : min(stop, position + size)]
            return
        with open(self.source, "rb") as handle:
            for position in range(start, stop, size):
                yield os.pread(handle.fileno(), min(stop, position + size) - position, position)

    def content(self) -> bytes:
        return b"".join(self.chunks(0, self.size))

    @functools.cached_property
    def git_oid(self) -> str:
        """Git's blob id: of the content, or of the LFS pointer file for LFS files."""
        content = self.lfs_pointer if self.is_lfs else self.content()
        return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()  # noqa: S324

    @functools.cached_property
    def sha256(self) -> str:
        digest = hashlib.sha256()
        for block in self.chunks(0, self.size, 8 << 20):
            digest.update(block)
        return digest.hexdigest()

    @property
    def lfs_pointer(self) -> bytes:
        return (
            f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\n"
            f"size {self.size}\n"
        ).encode()


@dataclass
class HubRepo:
    repo_id: str
    files: dict[str, HubFile]
    gated: bool = False
    approved_tokens: set[str] = field(default_factory=set)
    branches: dict[str, str] = field(default_factory=dict)
    # Earlier commits of the repository (add_repo again moves main on): by commit SHA.
    previous: dict[str, HubRepo] = field(default_factory=dict)

    def at(self, revision: str) -> HubRepo:
        """The repository as of an earlier commit asked by its SHA, else as it is now."""
        return self.previous.get(revision, self)

    @property
    def sha(self) -> str:
        digest = hashlib.sha1(self.repo_id.encode())  # noqa: S324 - a git-like commit id
        for name in sorted(self.files):
            digest.update(name.encode() + self.files[name].git_oid.encode())
        return digest.hexdigest()

    def resolve(self, revision: str) -> str | None:
        if revision == self.sha:
            return self.sha
        return self.branches.get(revision)


@dataclass
class Stall:
    """Stop sending a file after some bytes, `times` times, wherever its body is served (the
    storage origin for redirected LFS files): hold the connection open for `seconds`, then
    close it; `seconds=0` cuts the connection at once."""

    path: str
    after_bytes: int
    seconds: float
    times: int = 1


@dataclass
class Busy:
    """Answer `status` (429 or 5xx), `times` times, to requests whose URL path starts with
    `prefix`, with a Retry-After header (seconds, or an HTTP date) when one is given."""

    prefix: str
    status: int
    times: int = 1
    retry_after: str | None = None


@dataclass
class LoggedRequest:
    method: str
    path: str
    status: int  # 0 until the answer's status line is sent
    range: str | None
    authenticated: bool  # an Authorization header came with it
    origin: str = "hub"  # "hub", or "storage" for the second origin
    repo: str | None = None  # for requests of one file: its repository and path
    file: str | None = None
    query: str = ""
    headers: dict[str, str] = field(default_factory=dict)  # Authorization's value hidden
    token_seen: bool = False  # a token the hub knows appears in the request line or a header


class LocalHub:
    """In-process hub server and storage origin: add repos, start, point HF_ENDPOINT at .url,
    read .requests."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, redirect_lfs: bool = True):
        self.repos: dict[str, HubRepo] = {}
        self.datasets: dict[str, HubRepo] = {}
        self.valid_tokens: set[str] = set()
        self.requests: list[LoggedRequest] = []
        self.stalls: list[Stall] = []
        # URL path prefixes of requests that are read and never answered.
        self.hangs: list[str] = []
        self.busy: list[Busy] = []
        # Send LFS files from the storage origin, behind a 302, as the real hub does.
        self.redirect_lfs = redirect_lfs
        # Per-connection send rate for file bodies, in bytes/s; 0 sends as fast as possible.
        self.bytes_per_second = 0
        # Storage objects by URL path: (repo id, file).
        self.objects: dict[str, tuple[str, HubFile]] = {}
        self._secret = secrets.token_bytes(32)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        hub = self

        class Handler(HubRequestHandler):
            server_hub = hub

        class Storage(StorageRequestHandler):
            server_hub = hub

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.storage = ThreadingHTTPServer((host, 0), Storage)
        self.storage.daemon_threads = True
        self._threads: list[threading.Thread] = []

    @staticmethod
    def _address(server: ThreadingHTTPServer) -> str:
        host, port = server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def url(self) -> str:
        return self._address(self.server)

    @property
    def storage_url(self) -> str:
        return self._address(self.storage)

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes | Path],
        gated: bool = False,
        approved_tokens: set[str] | None = None,
    ) -> HubRepo:
        """A model repository; Path values are served from disk, not loaded into memory."""
        loaded = {
            name: HubFile(name, data)
            if isinstance(data, bytes)
            else HubFile(name, source=Path(data))
            for name, data in files.items()
        }
        repo = HubRepo(repo_id, loaded, gated=gated, approved_tokens=set(approved_tokens or ()))
        repo.branches["main"] = repo.sha
        # Adding a repository again is a new commit on main; the earlier ones stay fetchable.
        earlier = self.repos.get(repo_id) or self.datasets.get(repo_id)
        if earlier is not None and earlier.sha != repo.sha:
            repo.previous = {**earlier.previous, earlier.sha: earlier}
        self.repos[repo_id] = repo
        for hub_file in loaded.values():
            if hub_file.is_lfs:
                self.objects[self._object_path(repo_id, hub_file)] = (repo_id, hub_file)
        return repo

    def add_dataset(self, repo_id: str, files: dict[str, bytes | Path]) -> HubRepo:
        """A public dataset repository, resolved and served under /datasets/ paths."""
        repo = self.add_repo(repo_id, files)
        del self.repos[repo_id]
        self.datasets[repo_id] = repo
        return repo

    # -- the storage origin's signed URLs -------------------------------------------------
    @staticmethod
    def _object_path(repo_id: str, hub_file: HubFile) -> str:
        key = hashlib.sha256(repo_id.encode()).hexdigest()
        return f"/repos/{key[:2]}/{key[2:4]}/{key}/{hub_file.sha256}"

    def _sign(self, path: str, disposition: str, expires: str, policy: str) -> str:
        message = "\n".join((path, disposition, expires, policy)).encode()
        digest = hmac.new(self._secret, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def signed_url(self, repo_id: str, hub_file: HubFile) -> str:
        """Where the hub sends a client for an LFS file: signed, valid URL_LIFETIME seconds."""
        path = self._object_path(repo_id, hub_file)
        name = Path(hub_file.path).name
        disposition = (
            f"attachment; filename*=UTF-8''{quote(name)}; filename=\"{quote(name, safe='.-_')}\";"
        )
        expires = str(int(time.time()) + URL_LIFETIME)
        statement = {
            "Statement": [
                {
                    "Resource": f"{self.storage_url}{path}?*",
                    "Condition": {"DateLessThan": {"AWS:EpochTime": int(expires)}},
                }
            ]
        }
        policy = base64.urlsafe_b64encode(json.dumps(statement).encode()).decode().rstrip("=")
        query = urlencode(
            {
                "response-content-disposition": disposition,
                "Expires": expires,
                "Policy": policy,
                "Signature": self._sign(path, disposition, expires, policy),
                "Key-Pair-Id": KEY_PAIR_ID,
            }
        )
        return f"{self.storage_url}{path}?{query}"

    def storage_object(self, path: str, query: str) -> tuple[str, HubFile, str]:
        """The (repo id, file, content disposition) a signed URL names; HubError otherwise."""
        params = {key: values[0] for key, values in parse_qs(query).items()}
        needed = ("response-content-disposition", "Expires", "Policy", "Signature")
        if any(key not in params for key in needed) or params.get("Key-Pair-Id") != KEY_PAIR_ID:
            raise HubError(403, "AccessDenied", "Missing Key-Pair-Id query parameter or cookie")
        expected = self._sign(
            path, params["response-content-disposition"], params["Expires"], params["Policy"]
        )
        if not hmac.compare_digest(expected, params["Signature"]):
            raise HubError(403, "AccessDenied", "Invalid signature")
        if not params["Expires"].isdigit() or int(params["Expires"]) < time.time():
            raise HubError(403, "AccessDenied", "Access denied: the URL has expired")
        found = self.objects.get(path)
        if found is None:
            raise HubError(404, "NoSuchKey", "The specified key does not exist.")
        return found[0], found[1], params["response-content-disposition"]

    # -- bookkeeping --------------------------------------------------------------------
    def known_tokens(self) -> set[str]:
        stores = (*self.repos.values(), *self.datasets.values())
        return self.valid_tokens.union(*(repo.approved_tokens for repo in stores))

    def log(self, entry: LoggedRequest) -> None:
        with self._lock:
            self.requests.append(entry)

    def start(self) -> LocalHub:
        for server in (self.server, self.storage):
            thread = threading.Thread(target=server.serve_forever, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def take_stall(self, path: str) -> Stall | None:
        with self._lock:
            for stall in self.stalls:
                if stall.path == path and stall.times > 0:
                    stall.times -= 1
                    return stall
        return None

    def take_busy(self, path: str) -> Busy | None:
        with self._lock:
            for busy in self.busy:
                if path.startswith(busy.prefix) and busy.times > 0:
                    busy.times -= 1
                    return busy
        return None

    def hangs_on(self, path: str) -> bool:
        return any(path.startswith(prefix) for prefix in self.hangs)

    def fetched(self, path_suffix: str = "") -> list[LoggedRequest]:
        """GET requests that were sent a file body (by the hub, or by the storage origin after
        a redirect), optionally of one file."""
        return [
            r
            for r in self.requests
            if r.method == "GET"
            and r.file is not None
            and r.status in (200, 206, 499)
            and r.file.endswith(path_suffix)
        ]

    def at_storage(self) -> list[LoggedRequest]:
        return [r for r in self.requests if r.origin == "storage"]

    def stop(self) -> None:
        self._stopping.set()
        for server in (self.server, self.storage):
            server.shutdown()
            server.server_close()

    def __enter__(self) -> LocalHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class HubError(Exception):
    def __init__(
        self, status: int, code: str | None, message: str, headers: dict[str, str] | None = None
    ):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = headers or {}


class FileRequestHandler(BaseHTTPRequestHandler):
    """What both origins share: the request log and sending a file with Range and stalls."""

    server_hub: LocalHub
    protocol_version = "HTTP/1.1"
    origin = "hub"
    _entry: LoggedRequest | None = None

    def log_message(self, format, *args):
        pass  # requests go to LocalHub.requests, not stderr

    def do_GET(self):
        self._run(send_body=True)

    def do_HEAD(self):
        self._run(send_body=False)

    def _run(self, send_body: bool) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        # Logged on arrival, so a request the hub is holding shows up while it is held.
        self._entry = self._log_entry(path, url.query)
        status = HTTPStatus.OK
        hub = self.server_hub
        if hub.hangs_on(path):
            # Read, never answered: the client waits until it gives up or the hub stops.
            hub._stopping.wait()
            self.close_connection = True
            self._entry = None
            return
        try:
            busy = hub.take_busy(path)
            if busy:
                retry = {"Retry-After": busy.retry_after} if busy.retry_after else {}
                raise HubError(busy.status, None, f"busy ({busy.status}), try again", retry)
            status = self._handle(path, url.query, send_body)
        except HubError as error:
            status = error.status
            self._send_error(error, send_body)
        except (BrokenPipeError, ConnectionResetError):
            # The client went away mid-body (a killed or restarted download): expected here.
            status = 499
            self.close_connection = True
        finally:
            self._entry.status = int(status)
            self._entry = None

    def send_response(self, code, message=None):
        if self._entry is not None:  # None for requests refused before dispatch
            self._entry.status = int(code)
        super().send_response(code, message)

    def _handle(self, path: str, query: str, send_body: bool) -> int:
        raise NotImplementedError

    def _send_error(self, error: HubError, send_body: bool) -> None:
        raise NotImplementedError

    def _about_file(self, repo_id: str, file_path: str) -> None:
        self._entry.repo, self._entry.file = repo_id, file_path

    def _log_entry(self, path: str, query: str) -> LoggedRequest:
        hub = self.server_hub
        headers = {
            key: "<hidden>" if key.lower() == "authorization" else value
            for key, value in self.headers.items()
        }
        seen_in = " ".join([self.requestline, *self.headers.values()])
        entry = LoggedRequest(
            self.command,
            path,
            0,
            self.headers.get("Range"),
            bool(self.headers.get("Authorization")),
            origin=self.origin,
            query=query,
            headers=headers,
            token_seen=any(token in seen_in for token in hub.known_tokens()),
        )
        hub.log(entry)
        return entry

    def _send_file(self, hub_file: HubFile, headers: dict[str, str], send_body: bool) -> int:
        start, end, status = 0, hub_file.size - 1, 200
        requested = self.headers.get("Range")
        if requested and requested.startswith("bytes="):
            first, _, last = requested[len("bytes=") :].partition("-")
            if not all(part.isdigit() for part in (first, last) if part) or not (first or last):
                raise HubError(416, None, "Requested range not satisfiable")
            if first:
                start = int(first)
                end = min(int(last), hub_file.size - 1) if last else hub_file.size - 1
            else:  # the last N bytes
                start = max(0, hub_file.size - int(last))
            if start >= hub_file.size or end < start:
                raise HubError(416, None, "Requested range not satisfiable")
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{hub_file.size}"
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(end + 1 - start))
        self.end_headers()
        if send_body:
            self._send_body(hub_file, start, end + 1)
        return status

    def _send_body(self, hub_file: HubFile, start: int, stop: int) -> None:
        hub = self.server_hub
        stall = hub.take_stall(hub_file.path)
        end = min(stop, start + stall.after_bytes) if stall else stop
        for block in hub_file.chunks(start, end):
            self.wfile.write(block)
            if hub.bytes_per_second:
                time.sleep(len(block) / hub.bytes_per_second)
        if stall:
            # Hold the connection open without sending, like a stuck transfer, then drop it
            # short of its Content-Length.
            self.wfile.flush()
            hub._stopping.wait(stall.seconds)
            self.close_connection = True


class HubRequestHandler(FileRequestHandler):
    # -- dispatch ------------------------------------------------------------------------
    def _handle(self, path: str, query_text: str, send_body: bool) -> int:
        query = parse_qs(query_text)
        self._store = self.server_hub.repos
        token = self._token()
        if path.startswith("/api/models/"):
            return self._api(path[len("/api/models/") :], query, token, send_body)
        if path.startswith("/api/datasets/"):
            self._store = self.server_hub.datasets
            return self._api(path[len("/api/datasets/") :], query, token, send_body)
        if path.startswith("/datasets/") and "/resolve/" in path:
            self._store = self.server_hub.datasets
            return self._resolve(path[len("/datasets/") :], token, send_body)
        if "/resolve/" in path:
            return self._resolve(path.lstrip("/"), token, send_body)
        raise HubError(404, None, "Not Found")

    def _send_error(self, error: HubError, send_body: bool) -> None:
        self._send_json(error.status, {"error": error.message}, send_body, error)

    def _token(self) -> str | None:
        header = self.headers.get("Authorization")
        if not header:
            return None
        token = header.removeprefix("Bearer ").strip()
        if token not in self.server_hub.valid_tokens:
            raise HubError(401, None, "Invalid credentials in Authorization header")
        return token

    def _repo(self, repo_id: str, token: str | None, need_access: bool = True) -> HubRepo:
        """The repo; gated ones show their metadata to anyone, files only to approved tokens."""
        repo = self._store.get(repo_id)
        if repo is None:
            raise HubError(404, "RepoNotFound", "Repository not found")
        if need_access and repo.gated and token not in repo.approved_tokens:
            if token is None:
                raise HubError(
                    401,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted. You must have access to it "
                    "and be authenticated to access it. Please log in.",
                )
            raise HubError(
                403,
                "GatedRepo",
                f"Access to model {repo_id} is restricted and you are not in the authorized "
                "list. Visit the repository page to ask for access.",
            )
        return repo

    @staticmethod
    def _split_repo(rest: str) -> tuple[str, str]:
        parts = rest.split("/", 2)
        return "/".join(parts[:2]), parts[2] if len(parts) > 2 else ""

    # -- endpoints -----------------------------------------------------------------------
    def _api(self, rest: str, query: dict, token: str | None, send_body: bool) -> int:
        repo_id, tail = self._split_repo(rest)
        repo = self._repo(repo_id, token, need_access=tail == "auth-check")
        if tail == "auth-check":
            return self._send_json(200, {}, send_body)
        revision = "main"
        if tail.startswith("revision/"):
            revision = tail[len("revision/") :]
            tail = ""
            repo = repo.at(revision)
        if tail.startswith("tree/"):
            revision, _, prefix = tail[len("tree/") :].partition("/")
            repo = repo.at(revision)
            sha = self._sha(repo, revision)
            entries = [
                self._tree_entry(f)
                for name, f in sorted(repo.files.items())
                if not prefix or name.startswith(prefix.rstrip("/") + "/")
            ]
            return self._send_json(200, entries, send_body, sha=sha)
        if tail:
            raise HubError(404, None, f"unknown endpoint {tail}")
        sha = self._sha(repo, revision)
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for name, hub_file in sorted(repo.files.items()):
            sibling = {"rfilename": name}
            if blobs:
                sibling.update({"size": hub_file.size, "blobId": hub_file.git_oid})
                if hub_file.is_lfs:
                    sibling["lfs"] = {
                        "sha256": hub_file.sha256,
                        "size": hub_file.size,
                        "pointerSize": 134,
                    }
            siblings.append(sibling)
        info = {
            "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],  # noqa: S324 - an id only
            "id": repo_id,
            "modelId": repo_id,
            "sha": sha,
            "private": False,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "lastModified": "2026-01-01T00:00:00.000Z",
            "createdAt": "2026-01-01T00:00:00.000Z",
            "usedStorage": sum(f.size for f in repo.files.values()),
        }
        return self._send_json(200, info, send_body, sha=sha)

    @staticmethod
    def _tree_entry(hub_file: HubFile) -> dict:
        entry = {
            "type": "file",
            "path": hub_file.path,
            "size": hub_file.size,
            "oid": hub_file.git_oid,
        }
        if hub_file.is_lfs:
            entry["lfs"] = {"oid": hub_file.sha256, "size": hub_file.size, "pointerSize": 134}
        return entry

    def _sha(self, repo: HubRepo, revision: str) -> str:
        sha = repo.resolve(revision)
        if sha is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return sha

    def _resolve(self, rest: str, token: str | None, send_body: bool) -> int:
        repo_id, tail = self._split_repo(rest)
        repo = self._repo(repo_id, token)
        _resolve, revision, file_path = tail.split("/", 2)
        repo = repo.at(revision)
        sha = self._sha(repo, revision)
        hub_file = repo.files.get(file_path)
        if hub_file is None:
            raise HubError(404, "EntryNotFound", f"{file_path} does not exist on {revision}")
        self._about_file(repo_id, file_path)
        if hub_file.is_lfs and self.server_hub.redirect_lfs:
            return self._redirect(repo_id, hub_file, sha, send_body)
        etag = hub_file.sha256 if hub_file.is_lfs else hub_file.git_oid
        headers = {
            "ETag": f'"{etag}"',
            "X-Repo-Commit": sha,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if hub_file.is_lfs:
            headers["X-Linked-Etag"] = f'"{etag}"'
            headers["X-Linked-Size"] = str(hub_file.size)
        return self._send_file(hub_file, headers, send_body)

    def _redirect(self, repo_id: str, hub_file: HubFile, sha: str, send_body: bool) -> int:
        """302 to the storage origin; the file's hash and size travel on the redirect itself."""
        location = self.server_hub.signed_url(repo_id, hub_file)
        body = f"Found. Redirecting to {location}".encode()
        own_etag = hashlib.sha1(body).hexdigest()[:27]  # noqa: S324 - the redirect's own
        self.send_response(HTTPStatus.FOUND)
        for key, value in {
            "Content-Type": "text/plain; charset=utf-8",
            "Content-Length": str(len(body)),
            "Location": location,
            "X-Repo-Commit": sha,
            "Accept-Ranges": "bytes",
            "X-Linked-Size": str(hub_file.size),
            "X-Linked-Etag": f'"{hub_file.sha256}"',
            "ETag": f'W/"{len(body):x}-{own_etag}"',
            "Vary": "Origin, Accept",
        }.items():
            self.send_header(key, value)
        self.end_headers()
        if send_body:
            self.wfile.write(body)
        return HTTPStatus.FOUND

    def _send_json(
        self,
        status: int,
        payload,
        send_body: bool,
        error: HubError | None = None,
        sha: str | None = None,
    ) -> int:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if sha:
            self.send_header("X-Repo-Commit", sha)
        if error is not None:
            if error.code:
                self.send_header("X-Error-Code", error.code)
            self.send_header("X-Error-Message", error.message)
            for key, value in error.headers.items():
                self.send_header(key, value)
        self.end_headers()
        if send_body:
            self.wfile.write(body)
        return status


class StorageRequestHandler(FileRequestHandler):
    """The second origin: serves a file to whoever holds a valid signed URL, and nothing
    else; an Authorization header beside the signature is refused."""

    origin = "storage"

    def _handle(self, path: str, query: str, send_body: bool) -> int:
        if self.headers.get("Authorization"):
            raise HubError(
                400,
                "InvalidArgument",
                "Only one auth mechanism allowed; only the Signature query parameter or the "
                "Authorization header should be specified",
            )
        repo_id, hub_file, disposition = self.server_hub.storage_object(path, query)
        self._about_file(repo_id, hub_file.path)
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Disposition": disposition,
            "ETag": f'"{hub_file.sha256}"',
            "Accept-Ranges": "bytes",
            "Cache-Control": "public, max-age=604800, immutable",
        }
        return self._send_file(hub_file, headers, send_body)

    def _send_error(self, error: HubError, send_body: bool) -> None:
        body = (
            f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{error.code}</Code>"
            f"<Message>{error.message}</Message></Error>"
        ).encode()
        self.send_response(error.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        for key, value in error.headers.items():
            self.send_header(key, value)
        self.end_headers()
        if send_body:
            self.wfile.write(body)


def add_kimi_repos(hub: LocalHub, approved_tokens: set[str]) -> None:
    """K2.6's target (its real config.json, four small shards), the gated DFlash drafter (open
    to approved_tokens) and the EAGLE-3 drafter, small enough for a preflight or plan run."""
    config = Path(__file__).resolve().parents[2] / "models/kimi-k2.6/config.json"
    shards = {f"model-{i:05d}-of-00004.safetensors": bytes([i]) * 300_000 for i in range(4)}
    hub.add_repo("moonshotai/Kimi-K2.6", {"config.json": config.read_bytes(), **shards})
    hub.add_repo(
        "z-lab/Kimi-K2.6-DFlash",
        {"config.json": b"{}", "model.safetensors": b"d" * 200_000},
        gated=True,
        approved_tokens=approved_tokens,
    )
    hub.add_repo(
        "lightseekorg/kimi-k2.6-eagle3.1-mla",
        {"config.json": b"{}", "model.safetensors": b"e" * 100_000},
    )


FIXTURE_REPOS = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "hub-repos"


def fixture_repo_files(repo_id: str, shards: int = 1, shard_bytes: int = 200_000) -> dict:
    """A repository as the real one lists its small files (tests/fixtures/hub-repos/<id>: the
    real config.json, tokenizer and chat template files), plus `shards` small but valid
    safetensors files standing in for its weights: what the canary fetches (the small files
    only) and what the SGLang simulator opens at start-up."""
    from tests.support.safetensors_files import safetensors_bytes

    folder = FIXTURE_REPOS / repo_id
    if not folder.is_dir():
        raise FileNotFoundError(f"no fixture repository {folder}")
    files: dict = {
        path.relative_to(folder).as_posix(): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }
    for index in range(shards):
        name = (
            "model.safetensors"
            if shards == 1
            else f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        )
        filler = bytes([index]) * shard_bytes
        files[name] = safetensors_bytes({f"shard{index}.filler": ("U8", (shard_bytes,), filler)})
    return files


def add_fixture_repos(hub: LocalHub, model_data: dict, approved_tokens: set[str]) -> None:
    """A model's target and drafters (model.yml's repositories) from the fixture repositories,
    those model.yml marks gated (the DFlash drafters) gated as on the hub."""
    hub.add_repo(
        model_data["target"]["repo_id"],
        fixture_repo_files(model_data["target"]["repo_id"], shards=4),
    )
    for drafter in (model_data.get("drafters") or {}).values():
        gated = bool(drafter.get("gated"))
        hub.add_repo(
            drafter["repo_id"],
            fixture_repo_files(drafter["repo_id"]),
            gated=gated,
            approved_tokens=approved_tokens if gated else None,
        )


def token_env(token: str, directory: Path) -> dict[str, str]:
    """Environment that hands a token to the kit through a 0600 file, as `hf auth login` does.

    The token itself stays out of the environment, which ansible-runner records on disk.
    """
    path = directory / "hf-token"
    path.touch(mode=0o600)
    path.write_text(token)
    return {"HF_TOKEN": "", "HF_TOKEN_PATH": str(path)}


def main() -> int:
    """Serve the files of a folder as one repository, in this process, until stdin closes.

    Prints one JSON line first: url, storage_url, repo_id, sha and the file list (path, size,
    sha256 of LFS files, blob_id of the others) as hub_repo_info reports it. Then each line
    "requests" on stdin is answered with one JSON line: the requests logged since the last one.
    """
    parser = argparse.ArgumentParser(description=main.__doc__.split("\n\n")[0])
    parser.add_argument("--repo", required=True, help="repository id, owner/name")
    parser.add_argument("--dir", required=True, type=Path, help="folder whose files it serves")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--no-redirect", action="store_true", help="serve LFS files itself")
    args = parser.parse_args()
    files = {
        str(path.relative_to(args.dir)): path
        for path in sorted(args.dir.rglob("*"))
        if path.is_file()
    }
    hub = LocalHub(host=args.host, redirect_lfs=not args.no_redirect)
    repo = hub.add_repo(args.repo, files)
    listing = [
        {"path": f.path, "size": f.size}
        | ({"sha256": f.sha256} if f.is_lfs else {"blob_id": f.git_oid})
        for f in repo.files.values()
    ]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with hub:
        print(
            json.dumps(
                {
                    "url": hub.url,
                    "storage_url": hub.storage_url,
                    "repo_id": args.repo,
                    "sha": repo.sha,
                    "files": listing,
                }
            ),
            flush=True,
        )
        with contextlib.suppress(ValueError, OSError):
            while line := sys.stdin.readline():
                if line.strip() == "requests":
                    with hub._lock:
                        taken, hub.requests = hub.requests, []
                    print(json.dumps([asdict(r) for r in taken]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
