"""The support bundle of diagnose.yml: what a person needs to tell why a host does not serve,
collected on each host into one archive and packed on the controller into one tarball.

On the host (`collect`, module diagnose_collect): GPU state (`nvidia-smi -q`, `topo -m`), the
driver's version and modules, the fabric manager, persistence daemon and server unit (systemctl
where systemd is PID 1, else the processes), the kernel (uname, cmdline, the NVRM/Xid lines of
dmesg), each runtime's `pip freeze` and `python -m sglang.check_env`, the kit's records (launch,
API check, runtime, versions, canary, preflight, tuning state, ACS report), the end of the
server's log and of each canary log, the NCCL configuration, the server's environment and
secrets files with their secret values masked, and disk usage of the kit's folders.

A broken host is what this is for, so nothing here fails the collection: every command runs
under a deadline (its own, within the collection's), its output is capped (a command printing
without end is killed at the cap), every file is read bounded and only when it is a regular
file reached without a link; what fails, hangs, is missing or is cut is recorded in the host's
manifest.json (command or path, rc, seconds, why) and the collection goes on. Only bad options
fail the module.

Secrets: the values the controller gives (the kit's API key and HF token), and those read on
the host (the server's secrets file, token files, secret-named variables of the environment
file), are masked everywhere, file names included, as they are and in their base64 and unkeyed
hex-digest forms, with the generic patterns of module_utils/host/secret_scrub.py. They are held in
memory only: never written, never returned.

On the controller (`prepare_output`, `build_bundle`, module diagnose_bundle): each host's archive
is outside input. Its members are read, never extracted: only regular files with names of safe
parts, within the host's caps, scrubbed again; everything lands under `<run id>/<host>/` in one
tarball (0600, whole or absent) with an index naming every host, reached or not.

Standard library only: the module ships it to hosts (AnsiballZ), whose Pythons may be 3.10.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import io
import json
import os
import re
import shutil
import stat
import tarfile
import tempfile
import time

from ansible.module_utils.benchmark.debug import capture
from ansible.module_utils.host.helpers import (
    MASK,
    SECRET_KEY,
    command_environment,
    mask_secrets,
    systemd_is_pid1,
)
from ansible.module_utils.host.inspection import disk_space
from ansible.module_utils.host.secret_scrub import Scrubber

HOST_KIND = "kimi.diagnose.host"
BUNDLE_KIND = "kimi.diagnose"
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
INDEX = "index.json"
# The host's work folder: mkdtemp makes it 0700, so only root reads the archive in it.
WORK_PREFIX = "kimi-diagnose."
HOST_ARCHIVE = "host.tar.gz"
# A work folder older than this was left by a run that never came back (the module's timeout
# is at most an hour): the next run removes it.
STALE_WORK_S = 2 * 3600

# Item states in the manifest.
OK = "ok"  # collected whole
CUT = "cut"  # collected, capped (the member says what was kept)
ABSENT = "absent"  # the source is not on this host (a record not written yet, no runtime)
MISSING = "missing"  # the command is not on this host
FAILED = "failed"  # a non-zero exit, an unreadable file, something not a regular file
TIMED_OUT = "timed_out"  # killed at its deadline
NOT_RUN = "not_run"  # the collection's deadline ran out first, or the tool hung before
LEFT_OUT = "left_out"  # collected but past the host's cap
COLLECTED = (OK, CUT)

# A member name is parts of these characters joined by "/": never absolute, never "." or "..",
# never hidden, never an option-like leading dash.
SAFE_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
MAX_PARTS = 6
# Kernel lines about the GPUs: the driver's NVRM messages and its Xid error reports.
XID = re.compile(r"\bXid\b|NVRM")
# A file that names secrets is read this far, no further (a secrets file is a few lines).
SECRET_FILE_MAX = 64 << 10
# Folders collected entry by entry (canary logs): at most this many files each.
FOLDER_MAX_FILES = 64
# One reason, error or stderr excerpt in the manifest.
WHY_MAX = 2000
# How much of a command's stderr goes into its member.
STDERR_MAX = 16 << 10
# What dmesg prints is read up to this much before its NVRM/Xid lines are kept.
DMESG_READ_MAX = 32 << 20


class BadInput(Exception):
    """An option the module cannot work with: found, needed, fix."""


def utc_now() -> str:
    # timezone.utc, not datetime.UTC: hosts may run Python 3.10.
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")  # noqa: UP017


# -- names --------------------------------------------------------------------------------


def safe_part(text: str, fallback: str = "_") -> str:
    """One path part that SAFE_PART accepts, made from any text (a host name, a file name):
    other characters become "_", a leading dot or dash gets a "_" before it."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", str(text))[:127]
    if cleaned[:1] in (".", "-"):
        cleaned = "_" + cleaned
    return cleaned if SAFE_PART.fullmatch(cleaned or "") else fallback


def valid_member(name: str) -> bool:
    """Whether a member name is one the bundle writes: relative, of SAFE_PART parts only."""
    if not isinstance(name, str) or not name or len(name) > 512:
        return False
    parts = name.split("/")
    return len(parts) <= MAX_PARTS and all(SAFE_PART.fullmatch(part) for part in parts)


def unique(name: str, taken: set[str]) -> str:
    """name, or name-2, name-3 ... when another already took it (two host names that differ
    only in characters safe_part replaced)."""
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}-{n}"
    taken.add(candidate)
    return candidate


# -- bounded reads -------------------------------------------------------------------------


class Unreadable(Exception):
    def __init__(self, status: str, why: str):
        super().__init__(why)
        self.status, self.why = status, why


def open_regular(path: str, dir_fd: int | None = None) -> int:
    """A read-only descriptor of a regular file reached without a link in its last part
    (O_NOFOLLOW), opened non-blocking so a FIFO put where a log was expected cannot hang the
    collection. Unreadable says why not."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise Unreadable(ABSENT, "no such file") from None
    except OSError as error:
        if error.errno == errno.ELOOP:
            try:
                target = os.readlink(path, dir_fd=dir_fd)
            except OSError:
                target = "?"
            raise Unreadable(
                FAILED, f"a link (to {target}): the bundle reads no file through a link"
            ) from None
        raise Unreadable(FAILED, error.strerror or str(error)) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise Unreadable(FAILED, "not a regular file")
    return fd


def read_head(fd: int, cap: int) -> tuple[bytes, bool]:
    """(at most cap bytes from the start, whether more followed), cut at a line's end so no
    half of a secret stays for the scrubber to miss. procfs files read the same way (their
    size says 0)."""
    with os.fdopen(os.dup(fd), "rb") as handle:
        data = handle.read(cap + 1)
    if len(data) <= cap:
        return data, False
    end = data.rfind(b"\n", 0, cap)
    return (data[: end + 1] if end >= 0 else data[:cap]), True


def read_tail(fd: int, cap: int, lines: int) -> tuple[bytes, int, bool]:
    """(the last `lines` lines within the last cap bytes, the file's size, whether the lines
    kept are fewer than the file holds)."""
    size = os.fstat(fd).st_size
    start = max(0, size - cap)
    with os.fdopen(os.dup(fd), "rb") as handle:
        handle.seek(start)
        data = handle.read(cap)
    if start > 0:
        # A line cut at the window's start is dropped whole.
        data = data[data.find(b"\n") + 1 :] if b"\n" in data else b""
    kept = data.splitlines(keepends=True)
    cut = start > 0 or len(kept) > lines
    return b"".join(kept[-lines:]) if lines > 0 else b"", size, cut


# -- secrets on the host ---------------------------------------------------------------------


def unquote(value: str) -> str:
    """A YAML or environment-file scalar as its program reads it: '...' with '' doubled,
    "..." with backslash escapes, or plain (a trailing comment dropped)."""
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1].replace("''", "'")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            loaded = json.loads(value)
        except ValueError:
            return value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        return loaded if isinstance(loaded, str) else value[1:-1]
    return re.split(r"\s+#", value, maxsplit=1)[0].strip()


YAML_ITEM = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*:\s*(.*?)\s*$")
ENV_ITEM = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def secrets_file_values(text: str) -> tuple[list[str], str]:
    """(every value of the server's secrets file: all of it is secret; the file as the bundle
    shows it, each value masked)."""
    values, shown = [], []
    for line in text.splitlines():
        found = YAML_ITEM.match(line)
        if found and unquote(found.group(2)):
            values += [unquote(found.group(2)), found.group(2)]
            shown.append(f"{found.group(1)}: {MASK}")
        elif found or line.strip().startswith("#") or not line.strip():
            shown.append(line)
        else:
            # A line of another shape (a block scalar, a list item) may hold a secret: it is
            # masked (long enough not to mask ordinary words) and shown as masked.
            value = unquote(line.strip().lstrip("-"))
            if len(value) >= 8:
                values.append(value)
            shown.append(MASK)
    return [v for v in values if v and v != MASK], "\n".join(shown) + "\n"


def env_file_values(text: str) -> tuple[list[str], str]:
    """(the values of the environment file's secret-named variables; the file as the bundle
    shows it, those values masked)."""
    values, shown = [], []
    for line in text.splitlines():
        found = ENV_ITEM.match(line)
        if found and SECRET_KEY.search(found.group(1)) and unquote(found.group(2)):
            values += [unquote(found.group(2)), found.group(2).strip()]
            shown.append(f"{found.group(1)}={MASK}")
        else:
            shown.append(line)
    return [v for v in values if v and v != MASK], "\n".join(shown) + "\n"


# -- the collection on the host ----------------------------------------------------------------


def clip(text: str, limit: int = WHY_MAX) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + " [...]"


class Collection:
    """One host's collection under one deadline; `p` holds the module's options."""

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

    # -- the whole collection --------------------------------------------------------------

    def run(self) -> dict:
        p = self.p
        self.learn_secrets()
        self.open_archive()
        try:
            for step in (
                self.records,
                self.server,
                self.tuning,
                self.kernel,
                self.services,
                self.gpus,
                # The runtimes before du: what a deadline that runs out leaves out should be
                # the least telling.
                self.runtimes,
                self.disk,
            ):
                try:
                    step()
                except Exception as error:
                    # Whatever a broken host does to one step, the others still run.
                    self.record(step.__name__, "(the collector)", FAILED, why=repr(error))
            manifest = self.manifest()
            if self.tar is not None:
                add_member(self.tar, MANIFEST, self.scrub.bytes(manifest))
            self.close_archive()
        except BaseException:
            self.discard()
            raise
        if self.check_mode:
            self.discard()
        counts: dict[str, int] = {}
        for item in self.items:
            counts[item["status"]] = counts.get(item["status"], 0) + 1
        return {
            "archive": self.archive,
            "work_dir": self.work_dir,
            "host": p["host"],
            "counts": counts,
            "problems": [
                {"name": i["name"], "status": i["status"], "why": i.get("why", "")}
                for i in self.items
                if i["status"] not in COLLECTED
            ],
            "bytes": self.total,
            "seconds": round(self.clock() - self.started, 3),
            "masked_values": self.scrub.count,
            "secrets_from": self.secret_sources,
            # Notes name paths, which a secret may be part of.
            "notes": [self.scrub(note) for note in self.notes],
        }

    def manifest(self) -> bytes:
        return (
            json.dumps(
                {
                    "kind": HOST_KIND,
                    "schema_version": SCHEMA_VERSION,
                    "host": self.p["host"],
                    "finished_at": utc_now(),
                    "seconds": round(self.clock() - self.started, 3),
                    "systemd": systemd_is_pid1(),
                    "deadlines": {
                        "collection_s": self.p["timeout"],
                        "command_s": self.p["command_timeout"],
                        "check_env_s": self.p["check_env_timeout"],
                    },
                    "caps": {
                        "item_bytes": self.cap,
                        "host_bytes": self.p["max_host_bytes"],
                        "log_lines": self.p["log_lines"],
                    },
                    "bytes": self.total,
                    "masked_values": self.scrub.count,
                    "secrets_from": self.secret_sources,
                    "notes": self.notes,
                    "items": self.items,
                },
                indent=1,
            )
            + "\n"
        ).encode()

    def records(self) -> None:
        p = self.p
        for name, path in (
            ("records/launch.json", os.path.join(p["server_state_dir"], "launch.json")),
            ("records/api-check.json", os.path.join(p["server_state_dir"], "api-check.json")),
            ("records/runtime.json", os.path.join(p["runtime_state_dir"], "runtime.json")),
            ("records/versions.json", os.path.join(p["runtime_state_dir"], "versions.json")),
            ("results/canary.json", os.path.join(p["canary_dir"], "canary.json")),
            ("results/preflight.json", p["preflight_record"]),
        ):
            self.file(name, path, json_record=True)

    def server(self) -> None:
        p = self.p
        self.file("server/sglang.log", p["log_file"], tail_lines=p["log_lines"])
        self.masked_file("server/sglang-secrets.yaml", p["secrets_file"], self.secrets_file_text)
        env_name = safe_part(os.path.basename(p["env_file"] or "server.env"))
        self.masked_file(f"server/{env_name}", p["env_file"], self.env_file_text)
        self.folder("canary/logs", os.path.join(p["canary_dir"], "logs"), ".log", p["log_lines"])

    def tuning(self) -> None:
        p = self.p
        self.file("nccl/nccl.conf", p["nccl_conf"])
        self.file("tuning/tuning-state.json", p["tuning_state"], json_record=True)
        self.file("tuning/acs-report.json", p["acs_report"], json_record=True)

    def kernel(self) -> None:
        p = self.p
        self.command("kernel/uname.txt", ["uname", "-a"])
        self.file("kernel/cmdline.txt", "/proc/cmdline")
        self.file("driver/version.txt", "/proc/driver/nvidia/version")
        self.file(
            "driver/modules.txt",
            "/proc/modules",
            transform=lambda data: b"".join(
                line for line in data.splitlines(keepends=True) if line.startswith(b"nvidia")
            ),
        )
        limit = p["dmesg_lines"]

        def nvidia_lines(text: str) -> str:
            lines = [line for line in text.splitlines() if XID.search(line)]
            shown = lines[-limit:]
            head = f"[kimi diagnose: {len(lines)} NVRM/Xid lines, the last {len(shown)} kept]\n"
            return head + "".join(line + "\n" for line in shown)

        # Denied on hosts with kernel.dmesg_restrict for non-root: recorded, as anything else.
        self.command(
            "kernel/dmesg-nvrm-xid.txt", [p["dmesg"]], keep=nvidia_lines, cap=DMESG_READ_MAX
        )

    def services(self) -> None:
        p = self.p
        if systemd_is_pid1():
            for unit in (p["fabricmanager_service"], p["persistenced_service"], p["unit_name"]):
                self.command(
                    f"services/{safe_part(unit)}.txt",
                    [p["systemctl"], "status", "--no-pager", "--full", "--lines=50", unit],
                    # 3: inactive or failed, which is what the entry is for; 4: no such unit.
                    ok_codes=(0, 3),
                    absent_codes=(4,),
                )
        else:
            # Without systemd: the processes, as preflight and the supervisor see them.
            self.command(
                "services/processes.txt",
                [
                    p["pgrep"],
                    "-a",
                    "-f",
                    "nv-fabricmanager|nvidia-persistenced|sglang|kimi-supervise",
                ],
                ok_codes=(0, 1),
            )
        self.command(
            "services/nv-fabricmanager-version.txt",
            [p["fabricmanager_binary"], "--version"],
            optional=True,
        )

    def gpus(self) -> None:
        smi = self.p["nvidia_smi"]
        self.command("gpu/nvidia-smi-q.txt", [smi, "-q"])
        self.command("gpu/nvidia-smi-topo-m.txt", [smi, "topo", "-m"])

    def disk(self) -> None:
        p = self.p
        started = self.clock()
        usage = []
        for path in p["disk_paths"]:
            try:
                usage.append({**disk_space(path), "exists": os.path.lexists(path)})
            except OSError as error:
                usage.append({"path": path, "error": error.strerror or str(error)})
        self.add("disk/statvfs.json", json.dumps(usage, indent=1) + "\n", "statvfs", OK, started)
        for path in p["disk_paths"]:
            name = f"disk/du-{safe_part(path.strip('/').replace('/', '-') or 'root')}.txt"
            if not os.path.lexists(path):
                self.record(name, f"du {path}", ABSENT, self.clock(), why="no such folder")
                continue
            # One level down: the runtimes, weights and canary folders each on a line.
            self.command(name, [p["du"], "-k", "-d", "1", path], timeout=p["du_timeout"])

    def runtimes(self) -> None:
        p = self.p
        # check_env asks CUDA: on a GPU that hung nvidia-smi it hangs the same way, so it gets
        # the command deadline then, not its own longer one.
        smi_hung = self.resolve(p["nvidia_smi"]) in self.hung
        check_env_s = p["command_timeout"] if smi_hung else p["check_env_timeout"]
        for kind, python in sorted(p["pythons"].items()):
            folder = f"runtime/{safe_part(kind)}"
            started = self.clock()
            if not os.path.exists(python):
                why = f"no {kind} runtime: {python} does not exist"
                for name in ("pip-freeze.txt", "check-env.txt"):
                    self.record(f"{folder}/{name}", python, ABSENT, started, why=why)
                continue
            self.notes.append(f"The {kind} runtime {python} is {os.path.realpath(python)}.")
            self.command(
                f"{folder}/pip-freeze.txt",
                [python, "-m", "pip", "freeze", "--all", "--disable-pip-version-check"],
            )
            self.command(
                f"{folder}/check-env.txt",
                [python, "-m", "sglang.check_env"],
                timeout=check_env_s,
            )


def add_member(tar: tarfile.TarFile, name: str, data: bytes, mtime: float | None = None) -> None:
    """A regular file member, root-only when extracted, owned by nobody in particular."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o600
    info.mtime = int(time.time() if mtime is None else mtime)
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


# Each option's range and the role variable that sets it, for the message.
RANGES = {
    "timeout": (1, 3600, "diagnose_timeout_s"),
    "command_timeout": (1, 3600, "diagnose_command_timeout_s"),
    "check_env_timeout": (1, 3600, "diagnose_check_env_timeout_s"),
    "du_timeout": (1, 3600, "diagnose_du_timeout_s"),
    "max_item_bytes": (4096, 1 << 30, "diagnose_max_item_bytes"),
    "max_host_bytes": (65536, 4 << 30, "diagnose_max_host_bytes"),
    "log_lines": (1, 1_000_000, "diagnose_log_lines"),
    "dmesg_lines": (1, 1_000_000, "diagnose_dmesg_lines"),
}


def check_options(p: dict) -> None:
    """Bad options fail with found, needed, fix; everything else is recorded."""
    for key, (low, high, variable) in RANGES.items():
        if not low <= p[key] <= high:
            raise BadInput(
                f"{key} is {p[key]:g}; needed {low:g} to {high:g}. Fix: set {variable} in "
                "range (the seconds below the task's timeout, which is diagnose_timeout_s "
                "plus a margin)."
            )
    if p["max_item_bytes"] > p["max_host_bytes"]:
        raise BadInput(
            f"max_item_bytes {p['max_item_bytes']} is above max_host_bytes "
            f"{p['max_host_bytes']}; needed an item cap within the host's. Fix: lower "
            "diagnose_max_item_bytes or raise diagnose_max_host_bytes."
        )
    if not os.path.isabs(p["work_dir"]) or not os.path.isdir(p["work_dir"]):
        raise BadInput(
            f"work_dir {p['work_dir']!r} is not an existing absolute folder on the host. "
            "Needed: one to hold the host's archive until it is fetched. Fix: set "
            "diagnose_host_work_dir (default /tmp)."
        )


def collect(p: dict, check_mode: bool = False) -> dict:
    check_options(p)
    return Collection(p, check_mode).run()


# -- the bundle on the controller ------------------------------------------------------------

RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
STAGING_PREFIX = ".staging-"
# Members one host's archive may hold (the collection writes about 40).
HOST_MAX_MEMBERS = 1000
# The host's manifest: parsed for the index when it is at most this big.
MANIFEST_MAX = 8 << 20


def bundle_path(output_dir: str, run_id: str) -> str:
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise BadInput(
            f"run id {run_id!r}: needed letters, digits, '.', '_' or '-', starting with a "
            "letter or digit, at most 100. Fix: set diagnose_run_id so, or leave it empty for "
            "the time."
        )
    return os.path.join(output_dir, f"{run_id}.tar.gz")


def prepare_output(output_dir: str, run_id: str, check_mode: bool = False) -> dict:
    """The bundle's folder, made root-of-the-controller-user-only when new; a staging folder
    (0700) in it for the hosts' archives. Refuses a folder that cannot be written, or a bundle
    that exists, before any host is asked."""
    if not os.path.isabs(output_dir):
        raise BadInput(
            f"diagnose_output_dir {output_dir!r} is not absolute. Needed: an absolute folder "
            "on the controller. Fix: give a full path (the default is the checkout's "
            "diagnostics/)."
        )
    target = bundle_path(output_dir, run_id)
    if os.path.lexists(target):
        raise BadInput(
            f"{target} exists; a bundle is never replaced. Fix: another diagnose_run_id, or "
            "move the old bundle away."
        )
    if os.path.lexists(output_dir) and not os.path.isdir(output_dir):
        raise BadInput(
            f"diagnose_output_dir {output_dir} exists and is not a folder. Needed: a folder "
            "the controller user can write. Fix: set diagnose_output_dir to another path."
        )
    probe = output_dir
    while not os.path.isdir(probe):
        probe = os.path.dirname(probe)
    if not os.access(probe, os.W_OK | os.X_OK):
        raise BadInput(
            f"diagnose_output_dir {output_dir}: {probe} is not writable by this user "
            f"(uid {os.geteuid()}). Needed: a folder the controller user can write. Fix: "
            "change its permissions, or set diagnose_output_dir to a folder you own."
        )
    if check_mode:
        return {"output_dir": output_dir, "bundle": target, "staging_dir": None}
    try:
        os.makedirs(output_dir, mode=0o700, exist_ok=True)
        remove_stale_staging(output_dir)
        staging = tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{run_id}.", dir=output_dir)
    except OSError as error:
        raise BadInput(
            f"diagnose_output_dir {output_dir}: cannot write there "
            f"({error.strerror or error}). Needed: a folder the controller user can write, "
            "with room for the bundle. Fix: free space, fix its permissions, or set "
            "diagnose_output_dir elsewhere."
        ) from None
    return {"output_dir": output_dir, "bundle": target, "staging_dir": staging}


def remove_stale_staging(output_dir: str) -> None:
    with contextlib.suppress(OSError):
        for entry in os.scandir(output_dir):
            if entry.name.startswith(STAGING_PREFIX) and entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    if time.time() - entry.stat(follow_symlinks=False).st_mtime > STALE_WORK_S:
                        shutil.rmtree(entry.path, ignore_errors=True)


def read_host_archive(path: str, max_bytes: int, scrub: Scrubber) -> tuple[list, list, dict]:
    """(members as (name, bytes), what was left out with why, the host's manifest or {}) of
    one fetched host archive, read member by member and never extracted: only regular files
    with valid names, at most max_bytes in all."""
    members, left_out, manifest = [], [], {}
    try:
        size = os.lstat(path).st_size
    except OSError as error:
        return [], [("(archive)", f"not fetched: {error.strerror or error}")], {}
    if size > max_bytes:
        return [], [("(archive)", f"{size} bytes compressed, over the cap of {max_bytes}")], {}
    total = 0
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            count = 0
            while True:
                info = tar.next()
                if info is None:
                    break
                count += 1
                name = info.name
                shown = scrub(clip(name, 200))
                if count > HOST_MAX_MEMBERS:
                    left_out.append((shown, f"more than {HOST_MAX_MEMBERS} members: the rest"))
                    break
                if not info.isreg():
                    left_out.append((shown, "not a regular file (a link, folder or device)"))
                    continue
                if not valid_member(name) or scrub(name) != name:
                    left_out.append((shown, "not a member name the bundle writes"))
                    continue
                if total + info.size > max_bytes:
                    left_out.append((shown, f"past the host's cap of {max_bytes} bytes"))
                    # Stop before reading past it: the rest of a hostile archive is not read.
                    break
                handle = tar.extractfile(info)
                data = handle.read(info.size) if handle else b""
                total += len(data)
                data = scrub.bytes(data)
                if name == MANIFEST and len(data) <= MANIFEST_MAX:
                    with contextlib.suppress(ValueError, RecursionError):
                        loaded = json.loads(data)
                        manifest = loaded if isinstance(loaded, dict) else {}
                members.append((name, data))
    except (tarfile.TarError, OSError, EOFError, ValueError) as error:
        left_out.append(("(archive)", f"unreadable from there on: {clip(str(error), 300)}"))
    return members, left_out, manifest


def manifest_summary(manifest: dict) -> dict:
    """Counts per state and the items not collected, from a host's manifest (outside input:
    every field type-checked, strings clipped)."""
    items = manifest.get("items") if isinstance(manifest.get("items"), list) else []
    counts: dict[str, int] = {}
    problems = []
    for item in items[:HOST_MAX_MEMBERS]:
        if not isinstance(item, dict):
            continue
        status = str(item.get("status", "?"))[:32]
        counts[status] = counts.get(status, 0) + 1
        if status not in COLLECTED:
            problems.append(
                {
                    "name": clip(item.get("name", "?"), 200),
                    "status": status,
                    "source": clip(item.get("source", ""), 300),
                    "why": clip(item.get("why", ""), 500),
                }
            )
    return {"counts": counts, "problems": problems}


def build_bundle(
    output_dir: str,
    run_id: str,
    staging_dir: str,
    hosts: list[str],
    outcomes: dict,
    secrets: list[str],
    max_host_bytes: int,
) -> dict:
    """One tarball of every host's members under <run id>/<host>/ and <run id>/index.json,
    written next to its name and linked into place (whole or absent, never replacing a file),
    0600. The staging folder is removed whatever happens."""
    target = bundle_path(output_dir, run_id)
    scrub = Scrubber([s for s in secrets if isinstance(s, str) and s])
    staging = os.path.realpath(staging_dir) if staging_dir else ""
    index_hosts: dict[str, dict] = {}
    folders: set[str] = set()
    keys: set[str] = set()
    written = 0
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{run_id}.", suffix=".partial", dir=output_dir)
    except OSError as error:
        raise BadInput(
            f"diagnose_output_dir {output_dir}: the bundle cannot be written there "
            f"({error.strerror or error}). Fix: free space or fix its permissions, then run "
            "diagnose.yml again."
        ) from None
    try:
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            for name in map(str, hosts):
                host = outcomes.get(name) if isinstance(outcomes.get(name), dict) else {}
                if not host:
                    host = {
                        "state": "failed",
                        "why": "no outcome recorded: the play stopped on this host before it",
                    }
                folder = unique(safe_part(scrub(name)), folders)
                entry = {
                    "folder": f"{run_id}/{folder}",
                    "state": str(host.get("state", "failed")),
                    "why": scrub(clip(host.get("why") or "")),
                }
                archive = host.get("archive") or ""
                if entry["state"] == "collected":
                    real = os.path.realpath(archive) if archive else ""
                    if not staging or os.path.dirname(real) != staging:
                        entry.update(state="failed", why="its archive is not in the staging folder")
                    else:
                        # The host's cap leaves its manifest out of the count.
                        members, left_out, manifest = read_host_archive(
                            real, max_host_bytes + MANIFEST_MAX, scrub
                        )
                        for member_name, data in members:
                            add_member(tar, f"{run_id}/{folder}/{member_name}", data)
                            written += len(data)
                        entry.update(manifest_summary(manifest))
                        entry["members"] = len(members)
                        if left_out:
                            entry["left_out"] = [{"name": n, "why": w} for n, w in left_out]
                        if not manifest:
                            entry["why"] = entry["why"] or "no readable manifest.json"
                index_hosts[unique(scrub(name), keys)] = entry
            index = {
                "kind": BUNDLE_KIND,
                "schema_version": SCHEMA_VERSION,
                "run_id": run_id,
                "created_at": utc_now(),
                "hosts": index_hosts,
                "unreachable": sorted(
                    h for h, e in index_hosts.items() if e["state"] == "unreachable"
                ),
                "failed": sorted(h for h, e in index_hosts.items() if e["state"] == "failed"),
                "masked_on_controller": scrub.count,
            }
            add_member(tar, f"{run_id}/{INDEX}", scrub.bytes(json.dumps(index, indent=1).encode()))
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(temporary, 0o600)
        try:
            os.link(temporary, target)
        except FileExistsError:
            raise BadInput(f"{target} appeared while packing; it was left as it is") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if staging_dir:
            shutil.rmtree(staging_dir, ignore_errors=True)
    return {
        "bundle": target,
        "bytes": os.path.getsize(target),
        "member_bytes": written,
        "hosts": {
            h: {k: e[k] for k in ("state", "why", "counts") if k in e}
            for h, e in index_hosts.items()
        },
        # Not `unreachable` or `failed`: Ansible reads those keys of a result as its state.
        "unreachable_hosts": index["unreachable"],
        "failed_hosts": index["failed"],
    }
