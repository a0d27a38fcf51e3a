"""A local Hugging Face Hub for tests: the API subset huggingface_hub uses, nothing more.

Speaks what huggingface_hub 2.x calls (with HF_ENDPOINT pointing here and
HF_HUB_DISABLE_XET=1) for auth_check, model_info(files_metadata=True) and snapshot_download:

    GET  /api/models/{repo}/auth-check
    GET  /api/models/{repo}[/revision/{rev}][?blobs=true]
    GET  /api/models/{repo}/tree/{rev}[/{path}]?recursive=true
    HEAD|GET /{repo}/resolve/{rev}/{path}          (Range answered with 206)

and the same for dataset repositories (add_dataset), which the benchmark's prompt sets come
from: /api/datasets/{repo}[/revision/{rev}] and /datasets/{repo}/resolve/{rev}/{path}.

Errors carry the status codes and X-Error-Code headers the real hub sends, so the client
raises the same exceptions: RepoNotFound, GatedRepo, RevisionNotFound, EntryNotFound, and a
401 "Invalid credentials in Authorization header" for a bad token. Every request is logged
(method, path, status, byte range; never the token) for tests to assert on.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

LFS_MIN_SIZE = 1024  # files this large (or *.safetensors) are served as LFS files


@dataclass
class HubFile:
    path: str
    data: bytes

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def is_lfs(self) -> bool:
        return self.size >= LFS_MIN_SIZE or self.path.endswith(".safetensors")

    @functools.cached_property
    def git_oid(self) -> str:
        """Git's blob id: of the content, or of the LFS pointer file for LFS files."""
        content = self.lfs_pointer if self.is_lfs else self.data
        return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()  # noqa: S324

    @functools.cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

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
    """Stop sending a file after some bytes and hold the connection, `times` times."""

    path: str
    after_bytes: int
    seconds: float
    times: int = 1


@dataclass
class LoggedRequest:
    method: str
    path: str
    status: int
    range: str | None
    authenticated: bool


class LocalHub:
    """In-process hub server: add repos, start, point HF_ENDPOINT at .url, read .requests."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.repos: dict[str, HubRepo] = {}
        self.datasets: dict[str, HubRepo] = {}
        self.valid_tokens: set[str] = set()
        self.requests: list[LoggedRequest] = []
        self.stalls: list[Stall] = []
        # Per-connection send rate for file bodies, in bytes/s; 0 sends as fast as possible.
        self.bytes_per_second = 0
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        hub = self

        class Handler(HubRequestHandler):
            server_hub = hub

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes | Path],
        gated: bool = False,
        approved_tokens: set[str] | None = None,
    ) -> HubRepo:
        loaded = {
            name: HubFile(name, data if isinstance(data, bytes) else Path(data).read_bytes())
            for name, data in files.items()
        }
        repo = HubRepo(repo_id, loaded, gated=gated, approved_tokens=set(approved_tokens or ()))
        repo.branches["main"] = repo.sha
        self.repos[repo_id] = repo
        return repo

    def add_dataset(self, repo_id: str, files: dict[str, bytes | Path]) -> HubRepo:
        """A public dataset repository, resolved and served under /datasets/ paths."""
        repo = self.add_repo(repo_id, files)
        del self.repos[repo_id]
        self.datasets[repo_id] = repo
        return repo

    def log(self, entry: LoggedRequest) -> None:
        with self._lock:
            self.requests.append(entry)

    def start(self) -> LocalHub:
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def take_stall(self, path: str) -> Stall | None:
        with self._lock:
            for stall in self.stalls:
                if stall.path == path and stall.times > 0:
                    stall.times -= 1
                    return stall
        return None

    def fetched(self, path_suffix: str = "") -> list[LoggedRequest]:
        """GET requests of file bodies, optionally of one file."""
        return [
            r
            for r in self.requests
            if r.method == "GET" and "/resolve/" in r.path and r.path.endswith(path_suffix)
        ]

    def stop(self) -> None:
        self._stopping.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> LocalHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class HubRequestHandler(BaseHTTPRequestHandler):
    server_hub: LocalHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass  # requests go to LocalHub.requests, not stderr

    # -- dispatch ------------------------------------------------------------------------
    def do_GET(self):
        self._handle(send_body=True)

    def do_HEAD(self):
        self._handle(send_body=False)

    def _handle(self, send_body: bool) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        query = parse_qs(url.query)
        status = HTTPStatus.OK
        self._store = self.server_hub.repos
        try:
            token = self._token()
            if path.startswith("/api/models/"):
                status = self._api(path[len("/api/models/") :], query, token, send_body)
            elif path.startswith("/api/datasets/"):
                self._store = self.server_hub.datasets
                status = self._api(path[len("/api/datasets/") :], query, token, send_body)
            elif path.startswith("/datasets/") and "/resolve/" in path:
                self._store = self.server_hub.datasets
                status = self._resolve(path[len("/datasets/") :], token, send_body)
            elif "/resolve/" in path:
                status = self._resolve(path.lstrip("/"), token, send_body)
            else:
                raise HubError(404, None, "Not Found")
        except HubError as error:
            status = error.status
            self._send_json(error.status, {"error": error.message}, send_body, error)
        except (BrokenPipeError, ConnectionResetError):
            # The client went away mid-body (a killed or restarted download): expected here.
            status = 499
            self.close_connection = True
        finally:
            self.server_hub.log(
                LoggedRequest(
                    self.command,
                    path,
                    int(status),
                    self.headers.get("Range"),
                    bool(self.headers.get("Authorization")),
                )
            )

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
        if tail.startswith("tree/"):
            revision, _, prefix = tail[len("tree/") :].partition("/")
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
        sha = self._sha(repo, revision)
        hub_file = repo.files.get(file_path)
        if hub_file is None:
            raise HubError(404, "EntryNotFound", f"{file_path} does not exist on {revision}")
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
        start, end, status = 0, hub_file.size - 1, 200
        requested = self.headers.get("Range")
        if requested and requested.startswith("bytes="):
            first, _, last = requested[len("bytes=") :].partition("-")
            start = int(first or 0)
            end = min(int(last), hub_file.size - 1) if last else hub_file.size - 1
            if start >= hub_file.size:
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
        chunk = 1 << 20
        position = start
        while position < stop:
            if stall and position - start >= stall.after_bytes:
                # Hold the connection open without sending, like a stuck transfer.
                hub._stopping.wait(stall.seconds)
                self.close_connection = True
                return
            end = min(stop, position + chunk)
            if stall:
                end = (
                    min(end, start + stall.after_bytes)
                    if position - start < stall.after_bytes
                    else end
                )
            self.wfile.write(hub_file.data[position:end])
            if hub.bytes_per_second:
                time.sleep((end - position) / hub.bytes_per_second)
            position = end

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
        self.end_headers()
        if send_body:
            self.wfile.write(body)
        return status


def token_env(token: str, directory: Path) -> dict[str, str]:
    """Environment that hands a token to the kit through a 0600 file, as `hf auth login` does.

    The token itself stays out of the environment, which ansible-runner records on disk.
    """
    path = directory / "hf-token"
    path.touch(mode=0o600)
    path.write_text(token)
    return {"HF_TOKEN": "", "HF_TOKEN_PATH": str(path)}
