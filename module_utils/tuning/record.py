"""Host tuning: the record of original values, and one tuning run's bookkeeping.

The state file records, per changed value, what it was before the first change, so that a
restore can put it back however often the tuning ran in between (teardown restores from it;
its format is `{"schema": 1, "changes": {key: entry}}`, an entry's `kind` naming who restores
it). `TuningRun` holds what a run of library/host_tuning.py collects: the changes it made (or,
in check mode, would make), what it left alone and why, the diffs, the state file.

Paths of kernel state that is not namespaced (/proc/sys, /sys) are always built from a root
prefix, so that tests can point them at a fake tree instead of the machine they run on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import datetime, timezone

from ansible.module_utils.host.helpers import atomic_write

STATE_SCHEMA = 1


class TuningError(Exception):
    """A failure with a message that says what was found, what is needed and how to fix it."""


class TuningAbort(Exception):
    """The run stops here: what changed so far is saved to the state file, then it fails."""


class StateFileError(Exception):
    """The state file cannot be read or written; `changed` says whether values were set."""

    def __init__(self, msg: str, changed: bool = False, changes: list | None = None):
        super().__init__(msg)
        self.changed = changed
        self.changes = changes or []


# --------------------------------------------------------------------------------------------
# Paths and files.


def under_root(root: str, path: str) -> str:
    """An absolute path as seen through the root prefix ("/" leaves it as it is)."""
    return os.path.join(root, path.lstrip("/"))


def write_value(path: str, value: str) -> None:
    """A kernel value (/proc/sys, /sys): written in place, never through a temporary file."""
    with open(path, "w") as handle:
        handle.write(value)


# --------------------------------------------------------------------------------------------
# The state file.


def new_state() -> dict:
    return {"schema": STATE_SCHEMA, "changes": {}}


def load_state(text: str, path: str) -> dict:
    try:
        state = json.loads(text)
    except ValueError as exc:
        raise TuningError(
            f"The tuning state file {path} is not JSON ({exc}). It holds the values to restore; "
            "fix it by hand or, if those values are known, remove it and rerun."
        ) from exc
    schema = state.get("schema") if isinstance(state, dict) else None
    if schema != STATE_SCHEMA:
        raise TuningError(
            f"The tuning state file {path} has schema {schema!r}; this kit reads schema "
            f"{STATE_SCHEMA}. Fix: restore with the kit version that wrote "
            "it, or remove it after restoring the values by hand."
        )
    state.setdefault("changes", {})
    return state


def dump_state(state: dict) -> str:
    return json.dumps(state, indent=2) + "\n"


def record(state: dict, key: str, entry: dict, when: str) -> None:
    """Remember a change. The previous value of the first change is kept: that is what a
    restore must bring back, whatever later runs set in between."""
    old = state["changes"].get(key)
    if old is not None:
        if isinstance(old.get("previous"), dict) and entry.get("kind") == "cpufreq":
            # CPUs not seen before (brought online since) add their own previous values.
            old["previous"] = {**entry["previous"], **old["previous"]}
            old["paths"] = {**entry.get("paths", {}), **old.get("paths", {})}
        old.update({k: v for k, v in entry.items() if k not in ("previous", "paths")})
        old["updated_at"] = when
        return
    state["changes"][key] = {**entry, "recorded_at": when}


# --------------------------------------------------------------------------------------------
# Summaries.


def describe(entry: dict, restore: bool = False) -> str:
    """One line for a change, or with restore=True for putting it back, as a user reads it."""
    kind = entry["kind"]
    previous, value = entry.get("previous"), entry.get("value")
    if kind == "file":
        before = "previous content" if previous.get("exists") else "absent"
        change = (before, "managed content")
        return f"file {entry['path']}: " + " -> ".join(reversed(change) if restore else change)
    if kind == "cpufreq":
        before = ", ".join(sorted({str(gov) for gov in previous.values()}))
        change = (before, str(value))
        where = f"CPU governor on {len(previous)} CPU(s): "
        return where + " -> ".join(reversed(change) if restore else change)
    if kind == "service":
        change = tuple(
            f"{state['unit_file_state']}/{'active' if state['active'] else 'inactive'}"
            for state in (previous, value)
        )
        where = f"service {entry['unit']}: "
    elif kind == "process":
        change = tuple("running" if state else "not running" for state in (previous, value))
        where = f"process {entry['name']}: "
    elif kind == "persistence_mode":
        change = tuple("on" if state else "off" for state in (previous, value))
        where = f"GPU {entry['bus_id']} persistence mode: "
    else:
        change = (str(previous), str(value))
        where = f"{kind} {entry.get('name', entry.get('path'))}: "
    return where + " -> ".join(reversed(change) if restore else change)


def public(key: str, entry: dict) -> dict:
    """A change as reported: no file contents, which can be long."""
    previous = entry.get("previous")
    if entry["kind"] == "file":
        previous = {"exists": bool(previous.get("exists"))}
    return {
        "key": key,
        "description": describe(entry),
        "previous": previous,
        "value": entry.get("value"),
    }


def summarise(changes: list[dict]) -> list[str]:
    """Descriptions, with the per-GPU persistence mode changes counted in one line."""
    gpus = [c for c in changes if c["key"].startswith("persistence_mode:")]
    lines = [c["description"] for c in changes if c not in gpus]
    if gpus:
        lines.append(f"persistence mode on {len(gpus)} GPU(s): off -> on")
    return lines


# --------------------------------------------------------------------------------------------
# One run.

# (argv) -> (exit code, stdout, stderr), as AnsibleModule.run_command answers; the modules pass
# host_helpers.DeadlineRunner, which raises CommandFailed for a command past its deadline.
RunCommand = Callable[[list[str]], tuple[int, str, str]]
# A program name -> its path or None, as AnsibleModule.get_bin_path answers.
Which = Callable[[str], "str | None"]


class TuningRun:
    """What one run of the module knows and collects. The module's parameters, check and diff
    mode, and how to run a command, find a program and warn come in; the result goes out."""

    def __init__(
        self,
        params: dict,
        *,
        check: bool,
        diff: bool = False,
        run_command: RunCommand,
        which: Which,
        warn: Callable[[str], None],
        manager: str,
    ):
        self.params = params
        self.check = check
        self.diff = diff
        self.run = run_command
        self.which = which
        self.warn = warn
        self.manager = manager
        # timezone.utc, not datetime.UTC: hosts may run Python 3.10.
        self.now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: UP017
        self.changes: list[dict] = []
        self.not_applied: list[dict] = []
        self.diffs: list[dict] = []
        self.extra: dict = {}
        self.state_path = params["state_file"]
        self.state = new_state()
        self.state_dirty = False
        self.gpu_list: list[dict] | None = None
        self.gpu_error = ""

    def binary(self, name: str) -> str | None:
        if os.path.sep in name:
            return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
        return self.which(name)

    def result(self, **extra) -> dict:
        return {
            "changes": self.changes,
            # Not "skipped": Ansible would take a non-empty one for a skipped task.
            "not_applied": self.not_applied,
            "recorded": list(self.state["changes"]),
            "service_manager": self.manager,
            **({"gpus": self.gpu_list} if self.gpu_list is not None else {}),
            **self.extra,
            **extra,
        }

    def note(self, key: str, entry: dict) -> None:
        """A change made (or, in check mode, one that would be made)."""
        if not self.check:
            self.remember(key, entry)
        self.changes.append(public(key, entry))

    def remember(self, key: str, entry: dict) -> None:
        """Into the state file only: a change made that is reported later, or not at all."""
        record(self.state, key, entry, self.now)
        self.state_dirty = True

    def read_state(self) -> None:
        if not os.path.exists(self.state_path):
            return
        try:
            with open(self.state_path) as handle:
                self.state = load_state(handle.read(), self.state_path)
        except OSError as exc:
            raise StateFileError(
                f"Cannot read the tuning state file {self.state_path} ({exc}). Fix: run "
                "as root (become: true) or check its permissions."
            ) from exc
        except TuningError as exc:
            raise StateFileError(str(exc)) from exc

    def save_state(self) -> None:
        if self.check or not self.state_dirty:
            return
        try:
            if self.state["changes"]:
                atomic_write(self.state_path, dump_state(self.state).encode(), 0o600)
            elif os.path.exists(self.state_path):
                os.unlink(self.state_path)
        except OSError as exc:
            raise StateFileError(
                f"Cannot write the tuning state file {self.state_path} ({exc}); the values "
                f"changed so far are {[c['description'] for c in self.changes]}. Fix: make its "
                "folder writable (become: true) and rerun, which records them again.",
                changed=True,
                changes=self.changes,
            ) from exc
        self.state_dirty = False
