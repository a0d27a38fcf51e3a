"""The per-host lock that keeps two runs of the kit (deploy, benchmark, teardown) off one host at
once: two deploys at once kill each other's download workers and write the same partial files.

The holder is an ansible-playbook process on a controller, described by the controller's
hostname, machine id and boot id, the pid and that pid's start time (clock ticks since boot, from
/proc/<pid>/stat), the user, the playbook and a random run id. One run re-enters its own lock
(a deploy's five stages, the benchmark's server restarts). Whether a holder is gone can be told
only on its own controller: the host hands the holder back (`same_controller`), the controller
reads /proc/<pid>/stat and asks again with that text (`takeover`), and the host takes the lock
over only when the holder is still the one judged gone. A holder on another controller counts as
live: `break_lock` (the playbooks' kimi_break_lock) is the way out.

The lock file is root-only (a 0700 folder, a 0600 file, written whole by rename); a flock on a
guard file beside it makes read-decide-write one step, so two simultaneous takers cannot both win.

Standard library only (shipped to hosts, whose Pythons may be 3.10).
"""

from __future__ import annotations

import contextlib
import json
import os
import time

from ansible.module_utils.host.helpers import flock_within, write_json_atomic

# The names of the plays that take and release the lock (playbooks/lock.yml, unlock.yml);
# the wiring test finds them by name.
TAKE_PLAY = "Take the per-host lock"
RELEASE_PLAY = "Release the per-host lock"
BREAK_HINT = "-e kimi_break_lock=true"
# Bounds on what a lock file or the controller may hand over.
MAX_FIELD = 4096
MAX_LOCK_BYTES = 64 * 1024
STRING_FIELDS = ("controller", "machine_id", "user", "playbook", "run_id", "boot_id")
INT_FIELDS = ("pid", "pid_start")


class LockError(Exception):
    """The lock could not be looked at or written (bad input, no guard in time, I/O)."""


class LockHeld(LockError):
    """Another run holds the lock; the message names it and how to go past it."""

    def __init__(self, message: str, holder: dict | None) -> None:
        super().__init__(message)
        self.holder = holder


def check_holder(value, where: str) -> dict:
    """The holder fields, type-checked and bounded; LockError naming the field otherwise."""
    if not isinstance(value, dict):
        raise LockError(f"{where}: the holder is a {type(value).__name__}, not a mapping")
    holder = {}
    for key in STRING_FIELDS:
        item = value.get(key)
        if not isinstance(item, str) or not item or len(item) > MAX_FIELD:
            raise LockError(f"{where}: holder field {key} is {item!r}; needed: a non-empty string")
        holder[key] = item
    for key in INT_FIELDS:
        item = value.get(key)
        if isinstance(item, bool) or not isinstance(item, int) or item < (1 if key == "pid" else 0):
            raise LockError(f"{where}: holder field {key} is {item!r}; needed: a whole number")
        holder[key] = item
    return holder


def read_lock(path: str) -> tuple[dict | None, str | None]:
    """(record, None) for a valid lock, (None, None) for no lock, (None, why) for a bad one."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_LOCK_BYTES + 1)
    except FileNotFoundError:
        return None, None
    except OSError as err:
        return None, f"unreadable ({err.strerror})"
    if len(raw) > MAX_LOCK_BYTES:
        return None, f"larger than {MAX_LOCK_BYTES} bytes"
    try:
        record = json.loads(raw)
        holder = check_holder(record, path)
    except (ValueError, LockError) as err:
        return None, f"not a lock record ({err})"
    since = record.get("since")
    since_epoch = record.get("since_epoch")
    holder["since"] = since if isinstance(since, str) and len(since) < 64 else "an unknown time"
    if isinstance(since_epoch, (int, float)) and not isinstance(since_epoch, bool):
        holder["since_epoch"] = since_epoch
    return holder, None


def proc_state(stat_text: str) -> tuple[str, int] | None:
    """(state, start time) from the text of /proc/<pid>/stat, None when it is not one."""
    if not isinstance(stat_text, str) or ")" not in stat_text:
        return None
    fields = stat_text.rsplit(")", 1)[1].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def gone_reason(recorded: dict, proc_stat: str) -> str | None:
    """Why the recorded holder's process no longer runs, judged from the /proc/<pid>/stat text
    its controller read (empty: no such pid); None when it still runs."""
    state = proc_state(proc_stat)
    if state is None:
        return f"pid {recorded['pid']} no longer runs on {recorded['controller']}"
    if state[1] != recorded["pid_start"]:
        return f"pid {recorded['pid']} on {recorded['controller']} is now another process"
    if state[0] in ("Z", "X"):
        return f"pid {recorded['pid']} on {recorded['controller']} has exited"
    return None


def describe(holder: dict) -> str:
    return (
        f"run {holder['run_id']} of {holder['playbook']} by {holder['user']} on controller "
        f"{holder['controller']} (pid {holder['pid']}), since {holder.get('since', 'now')}"
    )


def age(holder: dict, now: float) -> str:
    since = holder.get("since_epoch")
    if since is None:
        return ""
    seconds = max(0, int(now - since))
    days, rest = divmod(seconds, 86400)
    clock = f"{rest // 3600}h{rest % 3600 // 60:02d}m{rest % 60:02d}s"
    return f" ({days}d {clock} ago)" if days else f" ({clock} ago)"


@contextlib.contextmanager
def guarded(path: str, wait_s: float, create: bool):
    """Holds the flock on the guard file beside the lock for one read-decide-write."""
    folder = os.path.dirname(path) or "."
    if create:
        os.makedirs(os.path.dirname(folder) or ".", mode=0o755, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        # A folder made by someone else before (or with a looser umask) is made root-only.
        os.chmod(folder, 0o700)
    elif not os.path.isdir(folder):
        yield
        return
    try:
        # Check mode creates nothing: without a guard file, no run has taken the lock yet.
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        fd = os.open(f"{path}.guard", flags, 0o600)
    except FileNotFoundError:
        yield
        return
    try:
        if not flock_within(fd, wait_s):
            raise LockError(
                f"{path}.guard stayed locked for {wait_s:g} s: another run is taking or "
                "releasing the lock right now, or hangs while doing so"
            )
        yield
    finally:
        os.close(fd)


def acquire(
    path: str,
    holder: dict,
    break_lock: bool = False,
    takeover: dict | None = None,
    check_mode: bool = False,
    wait_s: float = 10.0,
    now: float | None = None,
) -> dict:
    """Takes the lock for `holder`, or re-enters it. Returns acquired, reentered, holder (who
    holds it now), previous (who held it before, when taken over or broken), same_controller and
    note. A live or undecidable holder raises LockHeld, except a holder on this controller that
    was not judged yet (no `takeover`): then acquired is false and the controller is to judge.
    `takeover` is {run_id, proc_stat}: the holder the controller judged, and what it read."""
    me = check_holder(holder, "this run")
    check_takeover(takeover)
    now = time.time() if now is None else now
    result = {"acquired": False, "reentered": False, "previous": None, "same_controller": False}
    result["note"] = ""
    with guarded(path, wait_s, create=not check_mode):
        current, bad = read_lock(path)
        note = ""
        if bad is not None:
            note = broken_file_note(path, bad, break_lock)
        elif current is not None and current["run_id"] == me["run_id"]:
            return {**result, "acquired": True, "reentered": True, "holder": current}
        elif current is not None:
            # Hostnames repeat across machines; the machine id tells them apart.
            same = (current["controller"], current["machine_id"]) == (
                me["controller"],
                me["machine_id"],
            )
            result["same_controller"] = same
            who = describe(current) + age(current, now)
            note = take_over_note(current, me, same, who, break_lock, takeover)
            if note is None:
                return {**result, "holder": current, "msg": f"held by {who}"}
            result["previous"] = current
        record = {
            **me,
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            "since_epoch": now,
        }
        if not check_mode:
            write_json_atomic(path, record, mode=0o600)
        return {**result, "acquired": True, "holder": record, "note": note}


def check_takeover(takeover) -> None:
    """LockError unless `takeover` is None or {run_id, proc_stat} of strings (bounded)."""
    if takeover is not None and (
        not isinstance(takeover, dict)
        or not isinstance(takeover.get("run_id"), str)
        or not isinstance(takeover.get("proc_stat"), (str, type(None)))
        or len(takeover.get("proc_stat") or "") > MAX_FIELD
    ):
        raise LockError(f"takeover is {takeover!r}; needed: run_id and proc_stat strings")


def broken_file_note(path: str, bad: str, break_lock: bool) -> str:
    """The note for overwriting a lock file that is no lock record; LockHeld without break."""
    if not break_lock:
        raise LockHeld(
            f"The lock file {path} is {bad}. Nothing the kit writes looks like that: "
            f"find out who wrote it, then break it with {BREAK_HINT}.",
            None,
        )
    return f"broke the lock file {path}, which was {bad}"


def take_over_note(
    current: dict, me: dict, same: bool, who: str, break_lock: bool, takeover: dict | None
) -> str | None:
    """The note for taking the lock from another run (`who` describes it); None when it runs on
    this controller and the controller has not judged it yet. LockHeld when it may not be taken:
    it lives, it runs on another controller, or whether it lives cannot be told."""
    if break_lock:
        return f"broke the lock of a live {who}; that run may still be changing this host"
    if not same:
        raise LockHeld(
            f"Another run holds this host: {who}. It was taken from another "
            f"controller, so whether that run still lives cannot be told from here. "
            f"Wait for it to end; if it is gone (its controller crashed or was shut "
            f"down), break the lock with {BREAK_HINT}.",
            current,
        )
    if current["boot_id"] != me["boot_id"]:
        return f"took over the lock of {who}: controller {me['controller']} has rebooted"
    if takeover is None:
        return None
    if takeover.get("proc_stat") is None:
        # A controller without /proc cannot tell a live pid from a gone one.
        raise LockHeld(
            f"Another run holds this host: {who}. This controller has no /proc, so "
            f"whether that run still lives cannot be told from here. Wait for it to "
            f"end; if it is gone, break the lock with {BREAK_HINT}.",
            current,
        )
    if takeover["run_id"] != current["run_id"]:
        # Taken over by a third run since the controller looked: judge that one anew.
        raise LockHeld(
            f"Another run holds this host: {who} (it took the lock while this run "
            f"was judging run {takeover['run_id']}). Wait for it to end, or use "
            f"{BREAK_HINT}.",
            current,
        )
    reason = gone_reason(current, takeover["proc_stat"])
    if reason is None:
        raise LockHeld(
            f"Another run holds this host: {who}, and it is still running. Wait "
            f"for it to end. If it is stuck, stop it first; {BREAK_HINT} takes the "
            "lock from a live run.",
            current,
        )
    return f"took over the lock of {who}: {reason}"


def release(path: str, holder: dict, check_mode: bool = False, wait_s: float = 10.0) -> dict:
    """Removes the lock when `holder`'s run holds it. Returns released and holder (who holds it
    now: another run that broke this one's lock keeps it)."""
    me = check_holder(holder, "this run")
    with guarded(path, wait_s, create=not check_mode):
        current, bad = read_lock(path)
        if bad is not None or current is None or current["run_id"] != me["run_id"]:
            return {"released": False, "holder": current, "bad": bad}
        if not check_mode:
            os.unlink(path)
        return {"released": True, "holder": None, "bad": None}
