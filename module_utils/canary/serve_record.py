"""The canary's record, canary.json on the host and on the controller: one entry per config
of a run, its schema (docs/stages.md, "Canary") and checks, building it from a run's results,
writing it only when its content changed, and the summary the deploy prints
(module_utils/canary/serve.py).

Standard library only: it ships to the hosts with the canary_serve module."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

from ansible.module_utils.canary.serve_inputs import CanaryError, check_name
from ansible.module_utils.host.helpers import TooLarge, atomic_write, read_bounded

KIND = "kimi.canary"
SCHEMA_VERSION = 1
STATES = ("ok", "failed", "skipped")
# The record on the host and the controller: one entry per config of a run.
RECORD_MAX_BYTES = 4 << 20
MAX_CONFIGS = 256


def now() -> str:
    # timezone.utc, not datetime.UTC: the hosts' Pythons may be 3.10.
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: UP017


ENTRY_FIELDS = {
    "state",
    "seconds_to_ready",
    "seconds",
    "first_error",
    "failure",
    "hint",
    "log",
    "identity",
    "reason",
    "generate",
    "chat",
    "finished_at",
}
RECORD_FIELDS = {
    "kind",
    "schema_version",
    "host",
    "profile",
    "model",
    "compute_capability",
    "started_at",
    "finished_at",
    "checkpoints",
    "configs",
    "passed",
    "failed",
    "skipped",
}


def blank_entry(identity_: str, log: str) -> dict:
    """A config's record entry before anything is known of it (failed until it passes)."""
    return {
        "state": "failed",
        "seconds_to_ready": None,
        "seconds": 0.0,
        "first_error": None,
        "failure": None,
        "hint": None,
        "log": log,
        "identity": identity_,
        "reason": None,
        "generate": None,
        "chat": None,
        "finished_at": None,
    }


def skipped(identity_: str, log: str, reason: str) -> dict:
    return {
        **blank_entry(identity_, log),
        "state": "skipped",
        "reason": reason,
        "finished_at": now(),
    }


def _optional(value, kinds) -> bool:
    return value is None or (isinstance(value, kinds) and not isinstance(value, bool))


def validate_entry(name: str, entry) -> list[str]:
    if not isinstance(entry, dict):
        return [f"configs.{name} is not an object"]
    errors = []
    if set(entry) != ENTRY_FIELDS:
        errors.append(f"configs.{name} has fields {sorted(entry)}, needed {sorted(ENTRY_FIELDS)}")
    if entry.get("state") not in STATES:
        errors.append(f"configs.{name}.state is {entry.get('state')!r}, needed one of {STATES}")
    for key in ("seconds_to_ready", "seconds"):
        if not _optional(entry.get(key), (int, float)):
            errors.append(f"configs.{name}.{key} is not a number")
    for key in ("first_error", "failure", "hint", "reason", "log", "identity", "finished_at"):
        if not _optional(entry.get(key), str):
            errors.append(f"configs.{name}.{key} is not a string")
    if not isinstance(entry.get("identity"), str) or not re.fullmatch(
        r"[0-9a-f]{64}", entry.get("identity") or ""
    ):
        errors.append(f"configs.{name}.identity is not a sha256")
    generate = entry.get("generate")
    if generate is not None and not (
        isinstance(generate, dict)
        and set(generate) == {"completion_tokens", "spec_verify_ct"}
        and all(_optional(generate[k], int) for k in generate)
    ):
        errors.append(f"configs.{name}.generate is not {{completion_tokens, spec_verify_ct}}")
    chat = entry.get("chat")
    if chat is not None and not (
        isinstance(chat, dict) and set(chat) == {"ok"} and isinstance(chat["ok"], bool)
    ):
        errors.append(f"configs.{name}.chat is not {{ok}}")
    if entry.get("state") == "failed" and not entry.get("failure"):
        errors.append(f"configs.{name} failed without a failure kind")
    if entry.get("state") == "ok" and (
        entry.get("failure") or entry.get("seconds_to_ready") is None
    ):
        errors.append(f"configs.{name} passed with a failure or without seconds_to_ready")
    return errors


def validate_record(record) -> list[str]:
    """What is wrong with a canary record (the schema of docs/stages.md, "Canary"); []."""
    if not isinstance(record, dict):
        return ["the record is not an object"]
    errors = []
    if record.get("kind") != KIND or record.get("schema_version") != SCHEMA_VERSION:
        errors.append(f"kind/schema_version are not {KIND}/{SCHEMA_VERSION}")
    if not set(record) <= RECORD_FIELDS or not {"kind", "configs"} <= set(record):
        errors.append(f"fields {sorted(record)} are not {sorted(RECORD_FIELDS)}")
    configs = record.get("configs")
    if not isinstance(configs, dict) or len(configs) > MAX_CONFIGS:
        return [*errors, "configs is not an object of at most 256 entries"]
    for name, entry in configs.items():
        try:
            check_name(name)
        except CanaryError:
            errors.append(f"config name {str(name)[:80]!r} is not a serving config name")
            continue
        errors += validate_entry(name, entry)
    for state, key in (("ok", "passed"), ("failed", "failed"), ("skipped", "skipped")):
        wanted = sorted(
            n for n, e in configs.items() if isinstance(e, dict) and e.get("state") == state
        )
        if sorted(record.get(key) or []) != wanted:
            errors.append(f"{key} does not list the configs whose state is {state}")
    checkpoints = record.get("checkpoints", {})
    if not isinstance(checkpoints, dict):
        errors.append("checkpoints is not an object")
    return errors


def read_record(path: str) -> dict | None:
    """The previous canary.json when it is one (validate_record), else None."""
    try:
        data = read_bounded(path, RECORD_MAX_BYTES)
    except (OSError, TooLarge):
        return None
    if data is None:
        return None
    try:
        record = json.loads(data)
    except ValueError:
        return None
    return record if not validate_record(record) else None


CHECKPOINT_FIELDS = ("path", "bytes", "seconds", "digest")


def build_record(
    previous: dict | None,
    names: list[str],
    results: dict,
    facts: dict,
    checkpoints: dict,
) -> dict:
    """The record of this run: each of `names` from `results` (this run's entries), else from
    the previous record (a config not run again); configs of other runs are dropped."""
    old = (previous or {}).get("configs", {})
    configs = {}
    for name in names:
        entry = results.get(name) or old.get(name)
        if entry is None:
            raise CanaryError(
                f"{name}: no canary result and none recorded before. Needed: a result per "
                "config. Fix: rerun the canary stage (--tags canary)."
            )
        configs[name] = entry
    record = {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "host": facts.get("host"),
        "profile": facts.get("profile"),
        "model": facts.get("model"),
        "compute_capability": facts.get("compute_capability"),
        "started_at": facts.get("started_at") or now(),
        "finished_at": now(),
        "checkpoints": {
            kind: {key: (info or {}).get(key) for key in CHECKPOINT_FIELDS}
            for kind, info in sorted((checkpoints or {}).items())
        },
        "configs": configs,
        "passed": [n for n in names if configs[n]["state"] == "ok"],
        "failed": [n for n in names if configs[n]["state"] == "failed"],
        "skipped": [n for n in names if configs[n]["state"] == "skipped"],
    }
    errors = validate_record(record)
    if errors:
        raise CanaryError(f"the canary record is malformed: {'; '.join(errors[:5])}")
    return record


def comparable(record: dict | None) -> dict:
    """The record without what changes on every write (the times and the checkpoints' seconds),
    to decide whether it changed."""
    if not record:
        return {}
    return {
        **{k: v for k, v in record.items() if k not in ("started_at", "finished_at")},
        "checkpoints": {
            kind: {k: v for k, v in (info or {}).items() if k != "seconds"}
            for kind, info in (record.get("checkpoints") or {}).items()
        },
    }


def write_record(path: str, record: dict, previous: dict | None) -> tuple[dict, bool]:
    """canary.json (0644: no secret in it) written when its content changed; the record as it
    stands and whether it was written. An unchanged one keeps its times."""
    if previous is not None and comparable(previous) == comparable(record):
        return previous, False
    # Keys in the record's own order: configs as the run takes them.
    atomic_write(path, json.dumps(record, indent=1) + "\n", 0o644)
    return record, True


def line(name: str, entry: dict) -> str:
    """One config's outcome, as the stage and the deploy's summary print it."""
    if entry["state"] == "ok":
        return (
            f"{name}: ok, ready after {entry['seconds_to_ready']:g} s "
            f"({entry['seconds']:g} s in all)"
        )
    if entry["state"] == "skipped":
        return f"{name}: skipped: {entry['reason']}"
    said = (entry["first_error"] or entry["reason"] or "no error line in the log").rstrip(".")
    return f"{name}: failed ({entry['failure']}): {said}. Hint: {entry['hint']} Log: {entry['log']}"


def summary(record: dict) -> dict:
    """Per host, for the deploy's end: how many passed, each failure with its hint, and a line
    per config."""
    configs = record["configs"]
    return {
        "lines": [
            f"Canary: {len(record['passed'])} of {len(configs)} serving configs passed.",
            *(line(name, entry) for name, entry in configs.items()),
        ],
        "passed": len(record["passed"]),
        "total": len(configs),
        "failures": [
            {
                "config": name,
                "failure": configs[name]["failure"],
                "first_error": configs[name]["first_error"],
                "hint": configs[name]["hint"],
                "log": configs[name]["log"],
            }
            for name in record["failed"]
        ],
        "skipped": [
            {"config": name, "reason": configs[name]["reason"]} for name in record["skipped"]
        ],
    }
