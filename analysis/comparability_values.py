"""How the comparability check compares and shows one recorded value: its identity (JSON
text, whole numbers as integers, a sha256 for a long one), its shown text, cut to a bound, the
distinct values a field takes in one run, and a runtime's package set as digests.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field

from ansible.module_utils.contract.level import NOT_FROZEN

ABSENT = "(absent)"  # a flag or variable one run's launch does not have
# Bounds on what files may hold: a value's key (longer ones are compared by sha256), values
# kept per field, what a message or a summary shows, a name, a package list.
MAX_KEY = 512
MAX_DISTINCT = 1000
MAX_SHOWN = 120
MAX_SUMMARY_VALUES = 8
MAX_NAME = 200
MAX_PACKAGES = 20_000
_SEPARATORS = re.compile(r"[-_.]+")  # PEP 503 name normalisation
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _normal(value, depth: int = 0):
    """JSON-able, with whole numbers as integers, at most 32 levels deep."""
    if depth > 32:
        return "..."
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return _number(value)
    if isinstance(value, dict):
        return {str(k): _normal(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normal(v, depth + 1) for v in value]
    return str(value)


def _number(value):
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value.is_integer() and abs(value) < 2**53:
            return int(value)
    return value


def canonical(value) -> str:
    """The value's identity: a short text of its type and value, JSON with sorted keys for
    containers, a sha256 in place of a long one."""
    kind = type(value)
    if kind is str:
        if len(value) <= MAX_KEY:
            return "s" + value
        value = ["s", value]  # hashed below, apart from a list holding the same text
    elif kind is int or kind is float:
        return f"n{_number(value)!r}"
    elif kind is bool or value is None:
        return f"c{value}"
    try:
        text = json.dumps(_normal(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = json.dumps(str(type(value).__name__))
    if len(text) <= MAX_KEY:
        return text
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def shown(value) -> str:
    """A value as a message shows it: text as it is, anything else as JSON; cut to a bound."""
    if value == ABSENT:
        return "absent"
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(_normal(value), sort_keys=True, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError):
            text = type(value).__name__
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def _summary_value(value):
    """A value for report.json's a/b: itself when small, else its shown text."""
    normal = _normal(value)
    try:
        small = len(json.dumps(normal, ensure_ascii=False)) <= 2 * MAX_SHOWN
    except (TypeError, ValueError, RecursionError):
        small = False
    return normal if small else shown(value)


@dataclass
class Seen:
    """The distinct values a field takes in one run (a bounded number of them)."""

    values: dict[str, object] = field(default_factory=dict)  # canonical key -> first value
    more: bool = False  # more distinct values than MAX_DISTINCT: compared by the first ones

    def add(self, value) -> None:
        key = canonical(value)
        if key in self.values:
            return
        if len(self.values) >= MAX_DISTINCT:
            self.more = True
            return
        self.values[key] = value

    @property
    def keys(self) -> frozenset:
        return frozenset(self.values) | ({"(more)"} if self.more else frozenset())

    def text(self) -> str:
        items = sorted(shown(v) for v in self.values.values())
        head = ", ".join(items[:4])
        rest = len(items) - 4 + (1 if self.more else 0)
        return head + (f" and {rest} more" if rest > 0 else "")

    def summary(self):
        items = [self.values[k] for k in sorted(self.values)]
        if len(items) == 1 and not self.more:
            return _summary_value(items[0])
        listed = [_summary_value(v) for v in items[:MAX_SUMMARY_VALUES]]
        if len(items) > MAX_SUMMARY_VALUES or self.more:
            listed.append(f"... ({len(items)}{'+' if self.more else ''} values)")
        return listed


def package_set(record) -> dict | None:
    """A runtime's installed packages as {sha256, versions_sha256, count, hashes}: two runs
    compare package sets without carrying the lists. A package is `name: version`
    (runtime_check's record, which the levels carry) or `name: {version, sha256}` (the study
    lock's runtime). `sha256` digests every `name==version` with the package's sha256 where
    known, `versions_sha256` the same without them, so that a set recorded with hashes still
    compares with one recorded without (check()); `hashes` counts the packages with one.
    SGLang itself is left out (its release or commit is a field of its own), and so is pip's
    own tooling; names are normalised as PEP 503 says. None when the record has no package
    list."""
    packages = record.get("packages") if isinstance(record, dict) else record
    if not isinstance(packages, dict) or not packages:
        return None
    plain, hashed = [], []
    for name, entry in itertools.islice(packages.items(), MAX_PACKAGES):
        name = _SEPARATORS.sub("-", str(name)[:MAX_NAME]).lower()
        if name == "sglang" or name in NOT_FROZEN:
            continue
        version, digest = (
            (entry.get("version"), entry.get("sha256"))
            if isinstance(entry, dict)
            else (entry, None)
        )
        line = f"{name}=={str(version)[:MAX_NAME]}"
        plain.append(line)
        known = isinstance(digest, str) and _SHA256.match(digest.lower())
        hashed.append(f"{line} sha256:{digest.lower()}" if known else line)
    return {
        "sha256": _lines_digest(hashed),
        "versions_sha256": _lines_digest(plain),
        "count": len(plain),
        "hashes": sum(a != b for a, b in zip(hashed, plain, strict=True)),
    }


def _lines_digest(lines: list[str]) -> str:
    text = "\n".join(sorted(lines))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def as_dict(value) -> dict:
    """The value if it is a dict, else an empty one: a record's field read as outside input."""
    return value if isinstance(value, dict) else {}
