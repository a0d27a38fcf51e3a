"""Helpers every module that works on a host needs, written once: files written whole or not at
all, JSON and text read without raising, a program's marked JSON report, file hashes, whether
systemd runs the host, a unit's state, stopping a process group, running a command under a
deadline, and masking secrets.

Standard library only: modules ship it to hosts with themselves (AnsiballZ), and the hosts'
Pythons may be 3.10.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

from ansible.module_utils.contract.secrets import MASK

# Keys whose values are secrets: api_key, hf_token, x-api-key, password... but not
# tokenizer_path or max_prefill_tokens, which only contain the letters.
SECRET_KEY = re.compile(
    r"(?:^|[_\-.])(?:api[_\-]?key|key|token|secret|password|passwd|auth|authorization)(?:$|[_\-.])",
    re.IGNORECASE,
)


def atomic_write(path: str, data, mode: int = 0o644) -> None:
    """`path` holds `data` (bytes, text, or a binary file object read to its end in chunks: a
    wheel may be gigabytes) with `mode`, or is left as it was: never half written, never with
    looser permissions for a moment (the temporary file is created 0600 in the same folder)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            if hasattr(data, "read"):
                shutil.copyfileobj(data, handle, 1 << 20)
            else:
                handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write_json_atomic(path: str, data, mode: int = 0o644) -> None:
    """JSON (indent 1, a final newline) written with atomic_write."""
    atomic_write(path, json.dumps(data, indent=1) + "\n", mode)


def flock_within(fd: int, wait_s: float, poll_s: float = 0.05) -> bool:
    """An exclusive flock on fd, waited for at most wait_s (a blocking flock has no deadline);
    False when another holder kept it that long."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            if time.monotonic() > deadline:
                return False
            time.sleep(poll_s)


# The longest a module run waits on the host for something to end before it answers.
MAX_WAIT_S = 3600


def look_until(look, done, wait_s: float, every_s: float = 0.5):
    """look(), again every every_s until done(its answer) or wait_s has passed: the last
    answer. A poll is a module run (a Python started, Ansible's module code imported); one
    that waits sees the end when it comes, not at the next poll. ValueError for a wait outside
    0 to MAX_WAIT_S."""
    if not 0 <= wait_s <= MAX_WAIT_S:
        raise ValueError(f"wait_s must be between 0 and {MAX_WAIT_S}, found {wait_s}")
    deadline = time.monotonic() + wait_s
    found = look()
    while not done(found) and time.monotonic() + every_s <= deadline:
        time.sleep(every_s)
        found = look()
    return found


class TooLarge(Exception):
    """A file past the size its reader accepts."""


def read_bounded(path: str, limit: int) -> bytes | None:
    """At most `limit` bytes of a file, None when it does not exist; TooLarge past the limit
    (never read whole). Other OSErrors reach the caller, whose message names the file's role."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except FileNotFoundError:
        return None
    if len(data) > limit:
        raise TooLarge(f"{path} is larger than {limit} bytes")
    return data


def read_json_bounded(path: str, limit: int):
    """The JSON in a file of at most `limit` bytes (outside input: never read whole, never
    through a symbolic link); ValueError saying why not: missing, a link, too large, unreadable
    or not JSON."""
    if os.path.islink(path):
        raise ValueError(f"{path} is a symbolic link")
    try:
        data = read_bounded(path, limit)
    except TooLarge as exc:
        raise ValueError(str(exc)) from None
    except OSError as exc:
        raise ValueError(f"{path} cannot be read ({exc.strerror or exc})") from None
    if data is None:
        raise ValueError(f"{path} does not exist")
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise ValueError(f"{path} is not JSON") from None


def read_json(path: str):
    """The file's JSON, or None when it is missing, unreadable or not JSON."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def read_text(path: str) -> str | None:
    """The file's text, stripped, or None when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# A report line longer than this is not one of the kit's programs' reports: refused unread.
MARKED_JSON_MAX_CHARS = 1 << 20


def marked_json(output: str, marker: str, max_chars: int = MARKED_JSON_MAX_CHARS) -> dict | None:
    """The JSON object a program printed as its report, `marker` + JSON on one line, or None
    when there is no such line, or the last one is over max_chars, not JSON, or not an object.
    The last marked line counts: a program reports when it is done, after anything it imported
    may have printed."""
    line = None
    for candidate in output.splitlines():
        if candidate.startswith(marker):
            line = candidate
    if line is None or len(line) - len(marker) > max_chars:
        return None
    try:
        record = json.loads(line[len(marker) :])
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def systemd_is_pid1(root: str = "/") -> bool:
    """Whether systemd runs this host, as sd_booted(3) decides it: /run/systemd/system exists.
    The server role's own check (roles/server/tasks/manager.yml) and the benchmark's log
    reader ask the same question the same way."""
    return os.path.isdir(os.path.join(root, "run/systemd/system"))


def parse_unit_show(text: str) -> dict[str, str]:
    """`systemctl show -p A -p B ...` output (A=value lines) as a dict."""
    return dict(line.partition("=")[::2] for line in text.splitlines() if "=" in line)


def unit_state(run, unit: str, properties: tuple[str, ...], systemctl: str = "systemctl") -> dict:
    """The unit's properties; run(argv) -> (rc, stdout, stderr). Raises RuntimeError naming the
    unit when systemctl fails (a unit that does not exist is LoadState=not-found, not a failure)."""
    rc, out, err = run([systemctl, "show", unit, "-p", ",".join(properties)])
    if rc != 0:
        raise RuntimeError(f"`systemctl show {unit}` exited {rc}: {(err or out).strip()}")
    return parse_unit_show(out)


def pid_alive(pid: int | None) -> bool:
    """Whether a process runs: a zombie has exited, only its parent has not collected it."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def kill_process_group(pgid: int | None, grace_s: float = 10.0) -> None:
    """SIGTERM the process group, give it `grace_s` to go, then SIGKILL what is left. A group
    that is already gone, or one we may not signal, is left alone."""
    if not pgid or pgid <= 1:
        return
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class CommandFailed(Exception):
    """A command ran past its deadline (its whole process group was killed) or printed more
    than it may; the message names the command."""


# Time to reap a group leader after SIGKILL; one stuck in the kernel (a GPU hung in the
# driver) cannot be reaped at all, and the caller must not wait on it for ever.
REAP_S = 5.0


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group pgid, from /proc (empty without it)."""
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] != "Z" and fields[2] == str(pgid):
            members.append(int(entry))
    return sorted(members)


def _await_group_gone(pgid: int, within_s: float) -> list[int]:
    """SIGKILL takes effect asynchronously: wait (bounded) until no member of the group runs.
    Returns those still running at the end."""
    end = time.monotonic() + within_s
    while (left := group_members(pgid)) and time.monotonic() < end:
        time.sleep(0.01)
    return left


def _wait_unreaped(pid: int, timeout_s: float) -> None:
    """Wait for pid to exit without reaping it; subprocess.TimeoutExpired at the deadline."""
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise subprocess.TimeoutExpired(str(pid), timeout_s)
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.05)


def run_with_deadline(
    argv: list[str],
    timeout_s: float,
    env: dict[str, str] | None = None,
    max_output_bytes: int = 64 << 20,
    what: str = "its deadline",
    data: str | None = None,
    shown: str | None = None,
) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of argv, as AnsibleModule.run_command answers, but bounded:
    the command runs in a session of its own, and at `timeout_s` its whole process group is
    killed (SIGTERM, then SIGKILL) and CommandFailed names the command and the deadline
    (`what` says where the deadline comes from). run_command has no deadline and kills nothing;
    an Ansible task timeout kills the module and leaves the command running as an orphan.
    Output goes to unlinked temporary files, so a child that keeps a pipe open cannot block
    the read; whatever the command leaves running in its group after it exits is killed.
    `data` is the command's standard input; `shown` replaces argv in messages (a `-c` program's
    whole source is no name)."""
    shown = shown or " ".join(argv)
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.TemporaryFile() as given,
    ):
        # A file, not a pipe: a command that never reads its input cannot block the write.
        given.write((data or "").encode())
        given.seek(0)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=given if data is not None else subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            return 127, "", f"`{shown}` could not start: {exc}"
        try:
            _wait_unreaped(proc.pid, timeout_s)
        except BaseException as exc:
            kill_process_group(proc.pid, grace_s=0)
            left = _await_group_gone(proc.pid, REAP_S)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0 if left else REAP_S)
            stuck = (
                f" Processes {left} did not exit even after SIGKILL (stuck in the kernel, "
                "typically in a driver call)."
                if left
                else ""
            )
            if isinstance(exc, subprocess.TimeoutExpired):
                raise CommandFailed(
                    f"`{shown}` did not finish within {timeout_s:.3g}s ({what}) and was killed "
                    f"with its whole process group.{stuck}"
                ) from None
            raise
        # The leader is a zombie until reaped, so the group's id cannot name anyone else yet.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        _await_group_gone(proc.pid, REAP_S)
        texts = []
        for handle in (out, err):
            handle.seek(0)
            data = handle.read(max_output_bytes + 1)
            if len(data) > max_output_bytes:
                raise CommandFailed(f"`{shown}` printed more than {max_output_bytes} bytes.")
            texts.append(data.decode("utf-8", errors="replace"))
    return proc.returncode, texts[0], texts[1]


def command_environment() -> dict[str, str]:
    """This process's environment as AnsibleModule.run_command hands it to a command: without
    the PYTHONPATH entries of the module's own payload, which would shadow the packages of a
    Python the command runs (a runtime's venv)."""
    env = dict(os.environ)
    if "PYTHONPATH" in env:
        paths = [
            path
            for path in env["PYTHONPATH"].split(":")
            if path and not path.endswith(("/ansible_modlib.zip", "/debug_dir"))
        ]
        if paths:
            env["PYTHONPATH"] = ":".join(paths)
        else:
            del env["PYTHONPATH"]
    return env


class DeadlineRunner:
    """AnsibleModule.run_command's call shape, (argv) -> (exit code, stdout, stderr), for every
    command of one module run under one deadline for all of them together (`timeout_s` from
    now; `what` names it in messages, e.g. "host_tuning's timeout=180s"). A command still
    running at the deadline is killed with its whole process group and CommandFailed names it
    and the deadline; once the deadline has passed, the next command is not started and
    CommandFailed says so. Callers decide per command whether that fails the module or leaves
    something unknown, with the message as the reason."""

    def __init__(self, timeout_s: float, what: str):
        self.timeout_s = timeout_s
        self.what = what
        self.deadline = time.monotonic() + timeout_s

    def __call__(
        self, argv: list[str], data: str | None = None, shown: str | None = None
    ) -> tuple[int, str, str]:
        argv = [str(arg) for arg in argv]
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise CommandFailed(f"`{shown or ' '.join(argv)}` was not run: {self.what} ran out.")
        return run_with_deadline(
            argv,
            left,
            env=command_environment(),
            what=f"what was left of {self.what}",
            data=data,
            shown=shown,
        )


def module_deadline(module, covers: str, example: int, option: str = "timeout") -> float:
    """The module's own deadline option, checked: seconds above 0, at most an hour (a task's
    timeout keyword kills only the module, never what it started, so this one must come
    first). `covers` says what it bounds in the message."""
    value = module.params[option]
    if not 0 < value <= 3600:
        module.fail_json(
            msg=f"{option} is {value:g}; needed: seconds from above 0 to 3600 for {covers}. "
            f"Fix: set it below the task's timeout, e.g. {example}."
        )
    return value


def module_runner(module, name: str, covers: str, example: int, option: str = "timeout"):
    """A DeadlineRunner for a module's commands under its checked deadline option."""
    value = module_deadline(module, covers, example, option)
    return DeadlineRunner(value, f"{name}'s {option}={value:g}s")


def mask_secrets(value, secrets: list[str] | tuple[str, ...] = ()):
    """A copy with the values of secret-looking keys and every occurrence of the given secret
    values replaced by MASK; empty values stay (an empty key is no secret, and says so)."""
    if isinstance(value, dict):
        return {
            key: (
                MASK
                if SECRET_KEY.search(str(key)) and item not in (None, "", False)
                else mask_secrets(item, secrets)
            )
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [mask_secrets(item, secrets) for item in value]
    if isinstance(value, str):
        for secret in secrets:
            if secret:
                value = value.replace(secret, MASK)
    return value
