"""One repository's download, watched and verified: the logic of library/weights_download.py.

The module checks what is on disk (module_utils/weights/manifest.py), starts the download worker
(module_utils/weights/worker.py) in the tools environment's Python, restarts it when the bytes
on disk stop growing, verifies the result and writes the manifest. Progress goes to the status
file that weights_status reads.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import signal
import subprocess
import time

from ansible.module_utils.host.helpers import kill_process_group, write_json_atomic
from ansible.module_utils.host.inspection import disk_space
from ansible.module_utils.weights import worker as weights_worker
from ansible.module_utils.weights.manifest import (
    UnsafeListing,
    bytes_on_disk,
    check_listing,
    hub_endpoint,
    inspect_files,
    now_iso,
    remove_other_partials,
    remove_stale,
    write_manifest,
)
from ansible.module_utils.weights.worker import (
    EXIT_AUTH,
    EXIT_DISK_FULL,
    EXIT_NOT_FOUND,
    EXIT_REVISION,
    EXIT_UNSAFE,
    KIND_INVALID_TOKEN,
    PROCESS_MARK,
    READ_TIMEOUT_S,
    last_error,
)

GIB = 1 << 30


class Failure(Exception):
    pass


def detach_and_follow_parent() -> None:
    """In the child: its own process group (so the watchdog can kill all of it), and killed
    by the kernel when the module dies (so no orphan keeps writing after a kill or timeout)."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def kill_previous_worker(pid_file: str) -> None:
    """A worker left running by an earlier run whose module was killed outright."""
    try:
        with open(pid_file) as handle:
            pid = int(handle.read().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            ours = PROCESS_MARK.encode() in handle.read()
    except (OSError, ValueError):
        return
    if ours:
        # No grace: the worker keeps no state a SIGTERM would let it save.
        kill_process_group(pid, grace_s=0)


class Download:
    def __init__(self, params: dict):
        self.p = params
        self.files = self.p["files"]
        self.total = sum(f.get("size") or 0 for f in self.files)
        self.restarts = 0
        self.status = {
            "repo_id": self.p["repo_id"],
            "revision": self.p["revision"],
            "pid": os.getpid(),
            "state": "checking",
            "bytes_total": self.total,
            "bytes_done": 0,
            "files_total": len(self.files),
            "files_done": 0,
            "rate_bytes_per_s": 0,
            "eta_s": None,
            "restarts": 0,
            "message": None,
            "started": now_iso(),
        }
        self.workers = self.p["hash_workers"] or os.cpu_count() or 1
        self.transfer_now: str | None = None
        self.transfers: list[str] = []
        self.download_seconds = 0.0
        self.pid_file = os.path.join(os.path.dirname(self.p["status_file"]), "worker.pid")

    # -- bookkeeping -------------------------------------------------------------------
    def log(self, line: str) -> None:
        os.makedirs(os.path.dirname(self.p["log_file"]), exist_ok=True)
        with open(self.p["log_file"], "a") as handle:
            handle.write(f"{now_iso()} watchdog: {line}\n")

    def publish(self, **changes) -> None:
        self.status.update(changes, updated=now_iso())
        os.makedirs(os.path.dirname(self.p["status_file"]), exist_ok=True)
        write_json_atomic(self.p["status_file"], self.status)

    # -- steps ---------------------------------------------------------------------------
    def record(self, good: dict) -> None:
        write_manifest(
            self.p["local_dir"], self.p["repo_id"], self.p["revision"], self.p["verify"], good
        )

    def on_disk(self) -> tuple[int, int]:
        return bytes_on_disk(self.p["local_dir"], self.files, self.p["revision"], self.transfer_now)

    def check(self, first: bool = False) -> dict:
        # rehash re-reads everything once; later checks trust what that one verified.
        rehash = self.p["rehash"] and first
        return inspect_files(
            self.p["local_dir"],
            self.files,
            self.p["revision"],
            "full" if rehash else self.p["verify"],
            self.workers,
            force_hash=rehash,
        )

    def free(self) -> int:
        return disk_space(self.p["local_dir"])["free_bytes"]

    def ensure_space(self, needed: int) -> None:
        free = self.free()
        if free < needed:
            raise Failure(self.disk_message(free, needed))

    def disk_message(self, free: int, needed: int) -> str:
        return (
            f"not enough disk space for {self.p['repo_id']} in {self.p['local_dir']}: "
            f"{free / GIB:.2f} GiB free, {needed / GIB:.2f} GiB still needed. Files already "
            "verified stay on disk and in the manifest. Fix: free space or point "
            "kimi_weights_dir at a larger filesystem, then rerun to resume."
        )

    def incomplete_files(self) -> list[str]:
        missing = []
        for entry in self.files:
            path = os.path.join(self.p["local_dir"], entry["path"])
            try:
                if entry.get("size") is not None and os.path.getsize(path) != entry["size"]:
                    missing.append(entry["path"])
            except OSError:
                missing.append(entry["path"])
        return missing

    def transfer(self) -> str:
        """huggingface_hub (xet where offered) first; plain HTTP with in-file resume when xet
        is off, and from the first restart on with xet_fallback."""
        if os.environ.get("HF_HUB_DISABLE_XET") == "1":
            return "http"
        return "http" if self.restarts and self.p["xet_fallback"] else "hub"

    def spawn(self) -> subprocess.Popen:
        env = dict(os.environ)
        env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
        env.pop("HF_TOKEN", None)
        if self.p["hf_token_file"]:
            try:
                with open(self.p["hf_token_file"]) as handle:
                    token = handle.read().strip()
            except OSError as error:
                raise Failure(
                    f"cannot read the token file {self.p['hf_token_file']}: {error}"
                ) from error
            if token:
                env["HF_TOKEN"] = token
        transfer = self.transfer()
        if transfer == "http":
            remove_other_partials(self.p["local_dir"], self.p["revision"], transfer)
        spec = {
            "repo_id": self.p["repo_id"],
            "revision": self.p["revision"],
            "local_dir": self.p["local_dir"],
            "max_workers": self.p["max_workers"],
            "transfer": transfer,
            "files": [{"path": f["path"], "size": f.get("size")} for f in self.files],
            "missing": self.incomplete_files(),
            # Each request's own deadline (READ_TIMEOUT_S) backs up the watchdog, which acts
            # first on a short stall_timeout; a busy hub is waited for within half of the
            # watchdog's window, so the wait is not taken for a stall.
            "timeout_s": READ_TIMEOUT_S,
            "retry_s": max(1, self.p["stall_timeout"] // 2),
        }
        self.log(f"transfer: {spec['transfer']}")
        log = open(self.p["log_file"], "a")  # noqa: SIM115 - handed to the child
        try:
            # The worker is module_utils/weights/worker.py: imported above, so Ansible ships it
            # in this module's payload, and handed as source to the tools environment's Python
            # (huggingface_hub, no Ansible); its exit codes and error kinds come from the same
            # import. A copied file (as roles/server/files/kimi_supervise.py is) would need a
            # parameter naming it, and could fall out of step with the module.
            child = subprocess.Popen(
                # The marker lets a later run recognise a worker this module left behind.
                [
                    self.p["python"],
                    "-c",
                    inspect.getsource(weights_worker),
                    json.dumps(spec),
                    PROCESS_MARK,
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                preexec_fn=detach_and_follow_parent,
            )
        finally:
            log.close()
        self.transfer_now = transfer
        self.transfers.append(transfer)
        with open(self.pid_file, "w") as handle:
            handle.write(f"{child.pid}\n")
        return child

    @staticmethod
    def stop(child: subprocess.Popen) -> None:
        # A stalled transfer has nothing worth saving: no grace before SIGKILL.
        kill_process_group(child.pid, grace_s=0)
        child.wait()

    def worker_error(self) -> dict:
        """The worker's last JSON error line, if it printed one."""
        try:
            with open(self.p["log_file"]) as handle:
                lines = handle.read().splitlines()[-50:]
        except OSError:
            return {}
        return last_error(lines)

    def watch(self) -> int:
        """Run the child until it finishes; restart it on stalls and crashes."""
        downloaded_before, _ = self.on_disk()
        started = time.monotonic()
        child = self.spawn()
        last_bytes, last_growth = downloaded_before, time.monotonic()
        window = [(time.monotonic(), downloaded_before)]
        while True:
            # Wake often to notice the child's exit; publish progress every poll_interval.
            deadline = time.monotonic() + self.p["poll_interval"]
            while child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            done, files_done = self.on_disk()
            now = time.monotonic()
            window = [(t, b) for t, b in window if now - t <= 10] + [(now, done)]
            rate = (window[-1][1] - window[0][1]) / max(now - window[0][0], 1e-6)
            eta = (self.total - done) / rate if rate > 0 else None
            self.publish(
                state="downloading",
                bytes_done=min(done, self.total),
                files_done=files_done,
                rate_bytes_per_s=max(rate, 0),
                eta_s=eta,
                restarts=self.restarts,
            )
            if done > last_bytes:
                last_bytes, last_growth = done, now
            code = child.poll()
            if code == 0:
                break
            if code is not None:
                self.handle_exit(code)
                reason = f"the download process exited with code {code}"
            elif now - last_growth > self.p["stall_timeout"]:
                self.stop(child)
                reason = (
                    f"no new bytes for {self.p['stall_timeout']}s at "
                    f"{done / GIB:.2f} of {self.total / GIB:.2f} GiB"
                )
            else:
                continue
            self.restarts += 1
            if self.restarts > self.p["max_restarts"]:
                incomplete = self.incomplete_files()
                raise Failure(
                    f"download of {self.p['repo_id']} from {hub_endpoint()} gave up after "
                    f"{self.p['max_restarts']} restarts ({reason}). Incomplete files: "
                    f"{', '.join(incomplete) or 'none'}. "
                    f"Log: {self.p['log_file']}. Fix: check the host's connection to the hub, "
                    "then rerun: completed files are kept."
                )
            xet = " with xet off (plain HTTP)" if self.p["xet_fallback"] else ""
            self.log(f"{reason}; restart {self.restarts}/{self.p['max_restarts']}{xet}")
            child = self.spawn()
            last_growth = time.monotonic()
        # Summed: a verification that finds a wrong file downloads again.
        self.download_seconds += time.monotonic() - started
        fetched, _ = self.on_disk()
        return max(0, fetched - downloaded_before)

    def handle_exit(self, code: int) -> None:
        error = self.worker_error()
        detail = error.get("detail", "")
        repo = self.p["repo_id"]
        if code == EXIT_DISK_FULL:
            done, _ = self.on_disk()
            raise Failure(self.disk_message(self.free(), max(0, self.total - done)))
        if code == EXIT_AUTH:
            kind = error.get("error")
            if kind == KIND_INVALID_TOKEN:
                raise Failure(
                    f"the hub rejected the Hugging Face token while downloading {repo} (401). "
                    "Fix: set a valid token (HF_TOKEN, kimi_hf_token or `hf auth login`)."
                )
            raise Failure(
                f"{repo} is gated and the token has no approved access (or none was given). "
                f"Fix: request access on the repository's page and set the token. ({detail})"
            )
        if code == EXIT_REVISION:
            raise Failure(
                f"revision {self.p['revision']} does not exist in {repo}. Fix: set the "
                "repository's revision variable to an existing commit."
            )
        if code == EXIT_UNSAFE:
            raise Failure(detail)
        if code == EXIT_NOT_FOUND:
            raise Failure(f"{repo} was not found on the hub. Fix: check the repository id.")

    def fail(self, failure: Exception) -> None:
        """The status file and the log say why the download ended."""
        if isinstance(failure, Failure):
            self.publish(state="failed", message=str(failure))
            self.log(f"failed: {failure}")
        else:
            self.publish(state="failed", message=f"{type(failure).__name__}: {failure}")

    def run(self) -> dict:
        problem = argument_problem(self.p)
        if problem:
            raise Failure(problem)
        try:
            check_listing(
                self.p["local_dir"],
                self.files,
                hub_endpoint(),
                self.p["repo_id"],
                self.p["revision"],
            )
        except UnsafeListing as unsafe:
            raise Failure(str(unsafe)) from unsafe
        os.makedirs(self.p["local_dir"], exist_ok=True)
        kill_previous_worker(self.pid_file)
        self.publish(state="checking")
        before = self.check(first=True)
        # What is verified now stays usable, whatever happens to the rest.
        self.record(before["good"])
        repaired = [s["path"] for s in before["stale"]]
        remove_stale(self.p["local_dir"], repaired)
        fetched = 0
        attempts = self.p["max_restarts"] + 1
        for _attempt in range(attempts):
            needed = sum(f.get("size") or 0 for f in self.files if f["path"] not in before["good"])
            if not needed and not before["missing"] and not before["stale"]:
                break
            partial, _ = self.on_disk()
            good_bytes = sum(r["size"] for r in before["good"].values())
            self.ensure_space(max(0, needed - max(0, partial - good_bytes)))
            self.log(f"downloading {self.p['repo_id']}@{self.p['revision']}")
            fetched += self.watch()
            self.publish(state="verifying")
            started = time.monotonic()
            before = self.check()
            self.hash_seconds = time.monotonic() - started
            self.record(before["good"])
            if not before["stale"] and not before["missing"]:
                break
            wrong = [s["path"] for s in before["stale"]] + before["missing"]
            self.log(f"after download, wrong or missing: {', '.join(wrong)}; fetching again")
            repaired += [s["path"] for s in before["stale"]]
            remove_stale(self.p["local_dir"], [s["path"] for s in before["stale"]])
        else:
            raise Failure(
                f"{self.p['repo_id']} still has wrong or missing files after {attempts} "
                "downloads: " + ", ".join([s["path"] for s in before["stale"]] + before["missing"])
            )
        self.publish(
            state="done",
            bytes_done=self.total,
            files_done=len(self.files),
            eta_s=0,
            message="verified",
        )
        return {
            "manifest": os.path.join(self.p["local_dir"], "kimi-manifest.json"),
            "files_total": len(self.files),
            "bytes_total": self.total,
            "bytes_downloaded": fetched,
            "download_seconds": round(self.download_seconds, 3),
            "hashed_bytes": before["hashed_bytes"],
            "hash_seconds": round(getattr(self, "hash_seconds", 0.0), 3),
            "hash_workers": self.workers,
            "restarts": self.restarts,
            "repaired": sorted(set(repaired)),
            "transfers": self.transfers,
        }


def argument_problem(params: dict) -> str | None:
    """What is wrong with the arguments before anything is touched, or None."""
    revision = params["revision"]
    if len(revision) != 40 or any(c not in "0123456789abcdef" for c in revision):
        return (
            f"revision must be a 40-character commit SHA, got {revision!r}; the weights "
            "stage resolves branch names through the hub first."
        )
    if not os.access(params["python"], os.X_OK):
        return (
            f"{params['python']} is not an executable Python; the weights "
            "stage installs huggingface_hub into its tools venv first."
        )
    return None
