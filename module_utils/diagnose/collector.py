"""The means of a support bundle's collection on one host: every item recorded in the
manifest, every member scrubbed of the secrets learnt first and kept within the host's cap,
files read bounded (files.py), commands run under their deadline and their cap.

Standard library only: the module ships it to hosts (AnsiballZ), whose Pythons may be 3.10.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import tarfile
import tempfile
import time

from ansible.module_utils.benchmark.debug import capture
from ansible.module_utils.diagnose.files import (
    Unreadable,
    env_file_values,
    open_regular,
    read_head,
    read_tail,
    secrets_file_values,
)
from ansible.module_utils.diagnose.members import (
    ABSENT,
    CUT,
    FAILED,
    LEFT_OUT,
    MISSING,
    NOT_RUN,
    OK,
    STALE_WORK_S,
    TIMED_OUT,
    BadInput,
    add_member,
    clip,
    safe_part,
    unique,
    valid_member,
)
from ansible.module_utils.host.helpers import command_environment, mask_secrets
from ansible.module_utils.host.secret_scrub import Scrubber

# The host's work folder: mkdtemp makes it 0700, so only root reads the archive in it.
WORK_PREFIX = "kimi-diagnose."
HOST_ARCHIVE = "host.tar.gz"
# A file that names secrets is read this far, no further (a secrets file is a few lines).
SECRET_FILE_MAX = 64 << 10
# Folders collected entry by entry (canary logs): at most this many files each.
FOLDER_MAX_FILES = 64
# How much of a command's stderr goes into its member.
STDERR_MAX = 16 << 10


class Collector:
    """The means of one host's collection under one deadline (`p` holds the module's
    options): the manifest's items, the secrets to mask, the host's archive, and the steps
    that collect one file, folder or command. Collection (collect.py) says what is collected.
    """

    def __init__(self, p: dict, check_mode: bool = False, clock=time.monotonic):
        self.p = p
        self.check_mode = check_mode
        self.clock = clock
        self.started = clock()
        self.deadline = self.started + p["timeout"]
        self.items: list[dict] = []
        self.notes: list[str] = []
        self.names: set[str] = set()
        self.total = 0
        self.hung: set[str] = set()
        self.work_dir: str | None = None
        self.archive: str | None = None
        self.tar: tarfile.TarFile | None = None
        self.secret_sources: list[str] = []
        self.scrub = Scrubber([])
        self.cap = p["max_item_bytes"]

    # -- bookkeeping -----------------------------------------------------------------

    def left(self) -> float:
        return self.deadline - self.clock()

    def record(self, name, source, status, started=None, **details) -> dict:
        item = {
            "name": name,
            "source": self.scrub(str(source)),
            "status": status,
            "seconds": round(self.clock() - started, 3) if started is not None else 0.0,
        }
        for key, value in details.items():
            item[key] = self.scrub(clip(value)) if isinstance(value, str) else value
        self.items.append(item)
        return item

    def add(self, name: str, data: bytes | str, source: str, status: str, started, **details):
        """The member, scrubbed, into the host's archive (within the host's cap), and its
        manifest entry."""
        name = unique(name, self.names)
        if not valid_member(name):
            raise ValueError(f"{name!r} is not a member name the bundle writes")
        raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
        scrubbed = self.scrub.bytes(raw)
        if self.total + len(scrubbed) > self.p["max_host_bytes"]:
            return self.record(
                name,
                source,
                LEFT_OUT,
                started,
                bytes=len(scrubbed),
                why=f"past the host's cap of {self.p['max_host_bytes']} bytes "
                f"(diagnose_max_host_bytes); collected as {status}",
            )
        self.total += len(scrubbed)
        if self.tar is not None:
            add_member(self.tar, name, scrubbed)
        return self.record(name, source, status, started, bytes=len(scrubbed), **details)

    # -- secrets -------------------------------------------------------------------------

    def learn_secrets(self) -> None:
        """The values to mask: the controller's, then those found on the host. Read here and
        held in memory only; the manifest names where they came from, never what they are."""
        values = [s for s in self.p["secrets"] if isinstance(s, str) and s]
        if values:
            self.secret_sources.append("the controller (the kit's API key and HF token)")
        self.secrets_file_text = self.env_file_text = None
        for path, parse, slot in (
            (self.p["secrets_file"], secrets_file_values, "secrets_file_text"),
            (self.p["env_file"], env_file_values, "env_file_text"),
        ):
            text = self.read_small(path)
            if text is None:
                continue
            found, shown = parse(text)
            setattr(self, slot, shown)
            if found:
                values += found
                self.secret_sources.append(path)
        for path in self.p["token_files"]:
            text = self.read_small(path)
            if text and text.strip():
                values.append(text.strip())
                self.secret_sources.append(path)
                self.notes.append(
                    f"A token file is on the host: {path} (its content is not collected; the "
                    "weights stage removes a token file an interrupted run left behind)."
                )
        self.scrub = Scrubber(list(dict.fromkeys(values)))

    def read_small(self, path: str) -> str | None:
        if not path:
            return None
        try:
            fd = open_regular(path)
        except Unreadable:
            return None
        try:
            data, _cut = read_head(fd, SECRET_FILE_MAX)
        except OSError:
            return None
        finally:
            os.close(fd)
        return data.decode("utf-8", "replace")

    # -- work folder and archive ---------------------------------------------------------

    def open_archive(self) -> None:
        parent = self.p["work_dir"]
        self.remove_stale(parent)
        try:
            self.work_dir = tempfile.mkdtemp(prefix=WORK_PREFIX, dir=parent)
        except OSError as error:
            raise BadInput(
                f"work_dir {parent}: a folder for the host's archive cannot be made there "
                f"({error.strerror or error}). Needed: a writable folder with room for up to "
                f"{self.p['max_host_bytes']} bytes. Fix: set diagnose_host_work_dir to one."
            ) from None
        if self.check_mode:
            return
        self.archive = os.path.join(self.work_dir, HOST_ARCHIVE)
        fd = os.open(self.archive, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        self._raw = os.fdopen(fd, "wb")
        # Open across the steps, each adding its member: closed by close_archive (discard on
        # failure).
        self.tar = tarfile.open(fileobj=self._raw, mode="w:gz")  # noqa: SIM115

    def remove_stale(self, parent: str) -> None:
        """Work folders of earlier runs that never came back (the controller died before the
        role removed them): only this kit's, owned by this user, 0700, old."""
        try:
            entries = list(os.scandir(parent))
        except OSError:
            return
        removed = 0
        for entry in entries:
            if not entry.name.startswith(WORK_PREFIX):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if (
                stat.S_ISDIR(info.st_mode)
                and info.st_uid == os.geteuid()
                and stat.S_IMODE(info.st_mode) == 0o700
                and time.time() - info.st_mtime > STALE_WORK_S
            ):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed += 1
        if removed:
            self.notes.append(f"Removed {removed} work folder(s) an earlier run left in {parent}.")

    def close_archive(self) -> None:
        if self.tar is not None:
            self.tar.close()
            self._raw.flush()
            os.fsync(self._raw.fileno())
            self._raw.close()
            self.tar = None

    def discard(self) -> None:
        with contextlib.suppress(Exception):
            self.close_archive()
        if self.work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)
        self.work_dir = self.archive = None

    # -- steps: files --------------------------------------------------------------------

    def file(self, name: str, path: str, tail_lines: int = 0, transform=None, json_record=False):
        """One file: whole up to the cap (or its last tail_lines lines), transformed (masking
        a format's secret fields) before the scrub."""
        started = self.clock()
        if not path:
            return self.record(name, "(no path set)", ABSENT, started, why="no path set")
        try:
            fd = open_regular(path)
        except Unreadable as error:
            return self.record(name, path, error.status, started, why=error.why)
        try:
            if tail_lines:
                data, size, cut = read_tail(fd, self.cap, tail_lines)
            else:
                data, cut = read_head(fd, self.cap)
                size = os.fstat(fd).st_size
        except OSError as error:
            return self.record(name, path, FAILED, started, why=error.strerror or str(error))
        finally:
            os.close(fd)
        details = {"source_bytes": size}
        if json_record and not cut:
            try:
                # Keys that name secrets are masked even where their value is not known.
                value = mask_secrets(json.loads(data))
                data = (json.dumps(value, indent=1, sort_keys=True) + "\n").encode()
            except (ValueError, RecursionError):
                details["why"] = "not JSON: kept as text"
        if transform is not None:
            data = transform(data)
        if cut:
            lines = data.count(b"\n")
            note = f"the last {lines} lines" if tail_lines else f"its first {len(data)} bytes"
            details["why"] = f"{size} bytes; {note} kept (diagnose_max_item_bytes, log lines)"
        return self.add(name, data, path, CUT if cut else OK, started, **details)

    def folder(self, prefix: str, path: str, suffix: str, tail_lines: int) -> None:
        """Every regular file named *suffix directly in the folder, each its last lines. The
        folder is opened without following a link, and each entry relative to it without
        following one: a link planted in it (to /etc/shadow, to ../..) is recorded, never read."""
        started = self.clock()
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            dir_fd = os.open(path, flags)
        except FileNotFoundError:
            self.record(prefix, path, ABSENT, started, why="no such folder")
            return
        except OSError as error:
            why = (
                "a link: the bundle reads no folder through a link"
                if error.errno in (errno.ELOOP, errno.ENOTDIR)
                else error.strerror or str(error)
            )
            self.record(prefix, path, FAILED, started, why=why)
            return
        try:
            names = sorted(os.listdir(dir_fd))
            chosen = [n for n in names if n.endswith(suffix) and not n.startswith(".")]
            if len(chosen) > FOLDER_MAX_FILES:
                self.record(
                    prefix,
                    path,
                    CUT,
                    started,
                    why=f"{len(chosen)} files; the first {FOLDER_MAX_FILES} by name collected",
                )
                chosen = chosen[:FOLDER_MAX_FILES]
            for entry in chosen:
                self.folder_file(prefix, path, dir_fd, entry, tail_lines)
        finally:
            os.close(dir_fd)

    def folder_file(self, prefix, path, dir_fd, entry, tail_lines) -> None:
        started = self.clock()
        # The scrub comes before safe_part: a secret in a file name is masked, then the name
        # is made safe ("*" is no safe character).
        name = f"{prefix}/{safe_part(self.scrub(entry))}"
        source = os.path.join(path, entry)
        try:
            fd = open_regular(entry, dir_fd=dir_fd)
        except Unreadable as error:
            self.record(name, source, error.status, started, why=error.why)
            return
        try:
            data, size, cut = read_tail(fd, self.cap, tail_lines)
        except OSError as error:
            self.record(name, source, FAILED, started, why=error.strerror or str(error))
            return
        finally:
            os.close(fd)
        lines = data.count(b"\n")
        extra = {"why": f"{size} bytes; its last {lines} lines kept"} if cut else {}
        self.add(name, data, source, CUT if cut else OK, started, source_bytes=size, **extra)

    def masked_file(self, name: str, path: str, shown: str | None) -> None:
        """A file whose secret values learn_secrets already masked (the shown text)."""
        started = self.clock()
        if shown is None:
            try:
                os.close(open_regular(path))
            except Unreadable as error:
                self.record(name, path, error.status, started, why=error.why)
                return
            self.record(name, path, FAILED, started, why="could not be read")
            return
        self.add(name, shown, path, OK, started, why="secret values masked")

    # -- steps: commands -------------------------------------------------------------------

    def resolve(self, program: str) -> str | None:
        if os.sep in program:
            return program if os.access(program, os.X_OK) else None
        return shutil.which(program)

    def command(
        self,
        name: str,
        argv: list[str],
        timeout: float | None = None,
        ok_codes=(0,),
        absent_codes=(),
        optional: bool = False,
        keep=None,
        env: dict | None = None,
        cap: int | None = None,
    ) -> dict:
        """One command: its output (stdout, then stderr) as the member, whatever its exit; the
        manifest entry says the exit code, how long it ran and why it is not ok. `keep`
        filters the output's text (dmesg's NVRM lines)."""
        started = self.clock()
        shown = " ".join(argv)
        binary = self.resolve(argv[0])
        if binary is None:
            status = ABSENT if optional else MISSING
            return self.record(name, shown, status, started, why=f"{argv[0]} is not on this host")
        # By its path: the release and git runtimes' pythons share a name.
        if binary in self.hung:
            return self.record(
                name,
                shown,
                NOT_RUN,
                started,
                why=f"{argv[0]} hung earlier in this collection; not run again (it would hang "
                "the same way)",
            )
        left = self.left()
        if left <= 0:
            return self.record(
                name, shown, NOT_RUN, started, why="the collection's timeout ran out first"
            )
        budget = min(timeout or self.p["command_timeout"], left)
        got = capture([binary, *argv[1:]], budget, cap or self.cap, env=env or self.env())
        text = got.out.decode("utf-8", "surrogateescape")
        if keep is not None:
            text = keep(text)
        err = got.err[:STDERR_MAX]
        body = text + (f"\n--- stderr ---\n{err}\n" if err else "")
        details: dict = {"rc": got.rc}
        if got.timed_out:
            self.hung.add(binary)
            status = TIMED_OUT
            details["why"] = (
                f"did not finish within {budget:.3g} s and was killed with its process group"
            )
        elif got.rc is None:
            status, details["why"] = FAILED, got.problem
        elif got.cut:
            status = CUT
            details["why"] = f"printed more than {cap or self.cap} bytes: killed, its start kept"
        elif got.rc in absent_codes:
            status = ABSENT
            details["why"] = f"exited {got.rc}: {err or text.strip()}"
        elif got.rc not in ok_codes:
            status = FAILED
            details["why"] = f"exited {got.rc}: {err or text.strip()[-500:]}"
        else:
            status = OK
        if got.timed_out or got.rc is None:
            body += f"\n[kimi diagnose: {details['why']}]\n"
        if not body.strip():
            # It ran: say so in the member too (pgrep finding no process is an answer).
            body = f"[kimi diagnose: `{shown}` printed nothing (exit {got.rc})]\n"
        return self.add(name, body, shown, status, started, **details)

    def env(self) -> dict:
        """Commands run with HOME and caches in the work folder and no bytecode written: pip
        and check_env then leave nothing on the host (the work folder goes afterwards)."""
        env = command_environment()
        if self.work_dir:
            env.update(HOME=self.work_dir, XDG_CACHE_HOME=os.path.join(self.work_dir, "cache"))
        env.update(PYTHONDONTWRITEBYTECODE="1", PIP_NO_CACHE_DIR="1")
        return env
