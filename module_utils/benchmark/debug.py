"""What a person debugging one serving config's result needs, collected on its host: the
server's log (or the unit's journal for the config's window), the kernel's Xid/NVRM lines, the
NCCL init lines, `nvidia-smi -q` before the first level and after the last, and the runtime and
launch records. Every file is scrubbed of the secrets the module is given (and their base64
and hex-digest forms, and secret-looking patterns) before it is written, and each is capped.

Three phases, each one module call: `begin` (before the server starts: the window opens on
the host's clock, leftovers of an earlier attempt go), `start` (after the server started,
before the first level: nvidia-smi -q) and `end` (after the last level, or the failure:
everything else). collected.json says what each file holds, or why it is missing.

Standard library only: modules ship it to hosts with themselves (AnsiballZ).
"""

from __future__ import annotations

import contextlib
import datetime
import gzip
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time

from ansible.module_utils.host.helpers import (
    atomic_write,
    command_environment,
    kill_process_group,
    mask_secrets,
    systemd_is_pid1,
)
from ansible.module_utils.host.secret_scrub import Scrubber

INDEX = "collected.json"
SERVER_LOG = "server.log.gz"
JOURNAL = "journal.txt.gz"
DMESG = "dmesg.txt"
NCCL = "nccl.txt"
SMI_START = "nvidia-smi-q-start.txt"
SMI_END = "nvidia-smi-q-end.txt"
RUNTIME = "runtime.json"
LAUNCH = "launch.json"
# The only names the collector writes, and so the only ones `begin` removes.
OWN_FILES = (INDEX, SERVER_LOG, JOURNAL, DMESG, NCCL, SMI_START, SMI_END, RUNTIME, LAUNCH)

XID = re.compile(r"\bXid\b|NVRM")
NCCL_LINE = re.compile(r"NCCL (?:INFO|WARN)")
# The share of a capped file kept from its start (the server's arguments, NCCL init); the
# rest comes from its end, where a crash is.
HEAD_SHARE = 0.25


def cut_note(what: str, size: int, cap: int, how: str) -> str:
    return (
        f"\n[kimi benchmark_debug: {what} was {size} bytes, over the cap of {cap} bytes "
        f"(benchmark_debug_max_bytes): {how}]\n"
    )


def read_capped(path: str, cap: int, since: dict | None = None) -> tuple[bytes, int, bool]:
    """(bytes, size, cut) of a regular file: whole when within cap, else its first quarter and
    its last three quarters of cap, each cut at a line's edge (no half line, and so no half of
    a secret that a later scrub would miss). `since` ({device, inode, offset}, what
    log_position saw) reads only what was appended after it, when the file is still that
    file and no shorter (else it was rotated or truncated, and all of it is new). OSError for
    what is not a regular file."""
    # Non-blocking: a FIFO put where the log was expected must not hang the collector.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
        start = 0
        if since and (since.get("device"), since.get("inode")) == (info.st_dev, info.st_ino):
            offset = since.get("offset")
            if isinstance(offset, int) and 0 <= offset <= info.st_size:
                start = offset
        handle.seek(start)
        size = info.st_size - start
        if size <= cap:
            return handle.read(cap), size, False
        head = handle.read(int(cap * HEAD_SHARE))
        head = head[: head.rfind(b"\n") + 1]
        handle.seek(info.st_size - (cap - int(cap * HEAD_SHARE)))
        tail = handle.read()
        tail = tail[tail.find(b"\n") + 1 :]
    note = cut_note(
        os.path.basename(path),
        size,
        cap,
        f"{len(head)} bytes from its start and "
        f"{len(tail)} from its end kept, the middle is on the host",
    )
    return head + note.encode() + tail, size, True


class Capture:
    def __init__(self, rc=None, out=b"", err="", cut=False, problem="", timed_out=False):
        self.rc, self.out, self.err, self.cut, self.problem = rc, out, err, cut, problem
        self.timed_out = timed_out


def log_position(path: str) -> dict | None:
    """Where the server's log ends now ({device, inode, offset}), so that the config's end
    reads only its own lines: the file keeps every earlier launch's. None without a file."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    return {"device": info.st_dev, "inode": info.st_ino, "offset": info.st_size}


def capture(argv: list[str], timeout_s: float, cap: int, env: dict | None = None) -> Capture:
    """argv's output, at most cap bytes of it (more on stdout or on stderr: the command is
    killed and the head kept), within timeout_s (past it: killed with its whole process
    group). Never raises: what went wrong is the problem. `env` replaces the module's
    command environment (module_utils/diagnose/collector.py points HOME at its work folder)."""
    env = dict(command_environment() if env is None else env)
    env["LC_ALL"] = "C"
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,
            )
        except OSError as error:
            return Capture(problem=f"`{argv[0]}` could not start: {error}")
        deadline = time.monotonic() + max(timeout_s, 0)
        cut = timed_out = False
        while proc.poll() is None:
            # stderr too: a command that floods it would fill the host's temporary folder.
            if os.fstat(out.fileno()).st_size > cap or os.fstat(err.fileno()).st_size > cap:
                cut = True
            elif time.monotonic() > deadline:
                timed_out = True
            else:
                time.sleep(0.02)
                continue
            kill_process_group(proc.pid, grace_s=0)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            break
        # What the command left running in its group after it exited.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, 9)
        out.seek(0)
        data = out.read(cap + 1)
        err.seek(0)
        problem = ""
        if timed_out:
            problem = f"`{' '.join(argv)}` did not finish within {timeout_s:.3g} s and was killed"
        if len(data) > cap:
            cut = True
            data = data[: data.rfind(b"\n", 0, cap) + 1]
        return Capture(
            proc.returncode,
            data,
            err.read(64 << 10).decode("utf-8", "replace").strip(),
            cut,
            problem,
            timed_out,
        )


def utc(epoch: float) -> str:
    # timezone.utc, not datetime.UTC: hosts may run Python 3.10.
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).isoformat()  # noqa: UP017


class Collector:
    def __init__(self, p: dict, now=time.time):
        self.p = p
        self.dest = p["dest"]
        self.cap = p["max_bytes"]
        self.scrub = Scrubber(p["secrets"] or [])
        self.now = now
        self.deadline = time.monotonic() + p["timeout"]
        self.index = self._read_index()

    # -- the index ---------------------------------------------------------------------

    def _read_index(self) -> dict:
        try:
            with open(os.path.join(self.dest, INDEX), encoding="utf-8") as handle:
                index = json.load(handle)
        except (OSError, ValueError):
            index = None
        if not isinstance(index, dict) or not isinstance(index.get("files"), dict):
            index = {"files": {}, "window": {}}
        index.setdefault("window", {})
        return index

    def note(self, name: str, status: str, **details) -> None:
        self.index["files"][name] = {"status": status, **details}

    def write(self, name: str, data: bytes | str, **details) -> str:
        """Scrubbed text written atomically; a .gz name is compressed (no timestamp in the
        header: the same text gives the same bytes). Returns the scrubbed text."""
        text = data.decode("utf-8", "surrogateescape") if isinstance(data, bytes) else data
        scrubbed = self.scrub(text)
        raw = scrubbed.encode("utf-8", "surrogateescape")
        stored = gzip.compress(raw, mtime=0) if name.endswith(".gz") else raw
        atomic_write(os.path.join(self.dest, name), stored)
        details.setdefault("status", "ok")
        self.note(name, bytes=len(raw), stored_bytes=len(stored), **details)
        return scrubbed

    def finish(self, phase: str) -> dict:
        self.index.update(
            kind="kimi.benchmark_debug",
            config=self.p["config"],
            masked_values=self.index.get("masked_values", 0) + self.scrub.count,
        )
        self.index.setdefault("phases", []).append({"phase": phase, "at": utc(self.now())})
        # The index holds only what the collector wrote itself: scrubbed all the same.
        atomic_write(os.path.join(self.dest, INDEX), self.scrub(json.dumps(self.index, indent=1)))
        return self.index

    def left(self) -> float:
        return min(self.p["command_timeout"], self.deadline - time.monotonic())

    def run(self, argv: list[str], cap: int | None = None) -> Capture:
        budget = self.left()
        if budget <= 0:
            return Capture(
                problem=f"`{' '.join(argv)}` was not run: the collector's timeout ran out"
            )
        return capture(argv, budget, self.cap if cap is None else cap)

    # -- the phases --------------------------------------------------------------------

    def begin(self) -> dict:
        prepare_dest(self.dest)
        window = {"since": utc(self.now()), "since_epoch": self.now()}
        position = log_position(self.p["log_file"])
        if position is not None:
            window["log_from"] = position
        self.index = {"files": {}, "window": window}
        return self.finish("begin")

    def start(self) -> dict:
        prepare_dest(self.dest, clear=False)
        self.nvidia_smi(SMI_START)
        return self.finish("start")

    def end(self) -> dict:
        prepare_dest(self.dest, clear=False)
        until = self.now()
        self.index["window"].update(until=utc(until), until_epoch=until)
        if SMI_START not in self.index["files"]:
            self.note(SMI_START, "missing", why="the config ended before its first level")
        self.nvidia_smi(SMI_END)
        log_text = self.server_log(until)
        self.nccl(log_text)
        self.dmesg()
        for name, option in ((RUNTIME, "runtime_record"), (LAUNCH, "launch_record")):
            self.record(name, self.p[option])
        return self.finish("end")

    # -- the files ---------------------------------------------------------------------

    def nvidia_smi(self, name: str) -> None:
        binary = shutil.which(self.p["nvidia_smi"])
        if not binary:
            why = f"{self.p['nvidia_smi']} is not on this host's PATH"
            self.write(
                name, f"[kimi benchmark_debug: not taken: {why}]\n", status="missing", why=why
            )
            return
        got = self.run([binary, "-q"])
        if got.problem or got.rc != 0:
            why = got.problem or f"nvidia-smi -q exited {got.rc}: {got.err[:2000]}"
            self.write(
                name,
                got.out + f"\n[kimi benchmark_debug: {why}]\n".encode(),
                status="failed",
                why=why,
            )
            return
        if got.cut:
            self.write(
                name,
                got.out
                + cut_note("nvidia-smi -q", len(got.out), self.cap, "its start kept").encode(),
                status="cut",
            )
            return
        self.write(name, got.out)

    def manager(self) -> str:
        chosen = self.p["manager"]
        if chosen != "auto":
            return chosen
        launch = read_json_capped(self.p["launch_record"], 1 << 20)
        recorded = launch.get("manager") if isinstance(launch, dict) else None
        if recorded in ("systemd", "supervisor"):
            return recorded
        return "systemd" if systemd_is_pid1() else "supervisor"

    def server_log(self, until: float) -> str:
        """The server's log file from where it ended at the config's begin (both managers
        write the server's output there, each launch after the last) and,
        under systemd, the unit's journal for the window (systemd's own lines: starts, exits,
        restarts); the log's scrubbed text, for the NCCL lines."""
        manager = self.manager()
        self.index["manager"] = manager
        if manager == "systemd":
            self.unit_journal(until)
        path = self.p["log_file"]
        since = self.index["window"].get("log_from")
        since = since if isinstance(since, dict) else None
        try:
            data, size, cut = read_capped(path, self.cap, since)
        except OSError as error:
            self.note(SERVER_LOG, "missing", why=f"{path}: {error.strerror or error}")
            return ""
        text = data.decode("utf-8", "surrogateescape")
        return self.write(
            SERVER_LOG, text, status="cut" if cut else "ok", source=path, source_bytes=size
        )

    def unit_journal(self, until: float) -> None:
        journalctl = shutil.which(self.p["journalctl"])
        if not journalctl:
            self.note(JOURNAL, "missing", why=f"{self.p['journalctl']} is not on PATH")
            return
        since = self.index["window"].get("since_epoch")
        argv = [journalctl, "-u", self.p["unit_name"], "--no-pager", "-o", "short-iso"]
        if isinstance(since, (int, float)):
            argv += [f"--since=@{int(since)}"]
        argv += [f"--until=@{int(until) + 1}"]
        got = self.run(argv)
        if got.problem or got.rc != 0:
            why = got.problem or f"journalctl exited {got.rc}: {got.err[:2000]}"
            self.note(JOURNAL, "failed", why=self.scrub(why))
            return
        text = got.out.decode("utf-8", "surrogateescape")
        if got.cut:
            text += cut_note(
                "the journal",
                len(got.out),
                self.cap,
                "its start kept; journalctl -u on the host has the rest",
            )
        self.write(
            JOURNAL,
            text,
            status="cut" if got.cut else "ok",
            source=f"journalctl -u {self.p['unit_name']}",
        )

    def nccl(self, log_text: str) -> None:
        limit = self.p["nccl_lines"]
        lines = [line for line in log_text.splitlines() if NCCL_LINE.search(line)]
        body = "\n".join(lines[:limit])
        body = body[: self.cap]
        if not lines:
            body = (
                "[kimi benchmark_debug: no NCCL INFO lines in the server's log; "
                "NCCL_DEBUG=INFO in the launch environment prints them]"
            )
        elif len(lines) > limit:
            body += (
                f"\n[kimi benchmark_debug: {len(lines)} NCCL lines, the first {limit} "
                "kept (benchmark_debug_nccl_lines)]"
            )
        self.write(NCCL, body + "\n", lines=min(len(lines), limit), found=len(lines))

    def dmesg(self) -> None:
        binary = shutil.which(self.p["dmesg"])
        if not binary:
            why = f"{self.p['dmesg']} is not on this host's PATH"
            self.write(
                DMESG, f"[kimi benchmark_debug: not read: {why}]\n", status="denied", why=why
            )
            return
        got = self.run([binary])
        if got.problem or got.rc != 0:
            # Unprivileged or namespaced hosts (kernel.dmesg_restrict) refuse: recorded, and
            # the benchmark goes on.
            why = got.problem or f"dmesg exited {got.rc}: {got.err[:500] or 'no message'}"
            self.write(
                DMESG, f"[kimi benchmark_debug: not read: {why}]\n", status="denied", why=why
            )
            return
        lines = [
            line
            for line in got.out.decode("utf-8", "surrogateescape").splitlines()
            if XID.search(line)
        ]
        body = "\n".join(lines) + ("\n" if lines else "")
        if got.cut:
            body += cut_note("dmesg", len(got.out), self.cap, "lines of its start searched")
        if not lines:
            body += "[kimi benchmark_debug: no Xid or NVRM lines in the kernel's log]\n"
        self.write(DMESG, body, status="cut" if got.cut else "ok", lines=len(lines))

    def record(self, name: str, path: str) -> None:
        if not path:
            self.note(name, "missing", why="no record path given")
            return
        try:
            data, size, cut = read_capped(path, self.cap)
        except OSError as error:
            self.note(name, "missing", why=f"{path}: {error.strerror or error}")
            return
        if not cut:
            with contextlib.suppress(ValueError, RecursionError):
                # Keys that name secrets are masked even where their value is unknown.
                value = mask_secrets(json.loads(data))
                self.write(name, json.dumps(value, indent=1, sort_keys=True) + "\n", source=path)
                return
        self.write(name, data, status="cut" if cut else "ok", source=path, source_bytes=size)


def read_json_capped(path: str, cap: int):
    try:
        data, _, cut = read_capped(path, cap)
        return None if cut else json.loads(data)
    except (OSError, ValueError, RecursionError):
        return None


def prepare_dest(dest: str, clear: bool = True) -> None:
    """The folder, made when missing; a link there is refused (what is written goes only where
    the role says). `clear` removes what an earlier attempt wrote, and nothing else."""
    if not os.path.isabs(dest):
        raise ValueError(f"dest must be an absolute path, got {dest!r}")
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISLNK(os.lstat(dest).st_mode):
            raise ValueError(f"dest {dest} is a link; give the folder itself")
    os.makedirs(dest, mode=0o755, exist_ok=True)
    if clear:
        for name in OWN_FILES:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(dest, name))


def collect(p: dict, now=time.time) -> dict:
    """One phase's work; the index (collected.json) it leaves."""
    collector = Collector(p, now)
    return getattr(collector, p["phase"])()
