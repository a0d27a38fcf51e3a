"""Reading and validating a results tree: level files, losslessness reports, config status.

The layout benchmark_kimi.yml lands on the controller is

    <run>/run.json
    <run>/<host>/lossless.json
    <run>/<host>/<config>/status.json
    <run>/<host>/<config>/<prompt set>/c<N>.json

Any folder above or inside that works (a run, one host's folder, several runs' parent as
long as no level appears twice). Config and prompt set come from each file's own fields; the
host from the folder above the config's, else `provenance.host`, else the folder analysed.

Speed: a level file holds every request's record (events, text, token ids) and is mostly
that; parsing all of it with the json module runs at about 80 MB/s, too slow for 100,000
records. Files in the layout the benchmark module writes (indent 1, `requests` last) are read
in two parts: everything but the requests with json, and the four per-request fields the
analysis uses (index, ok, output_tokens, accept_length) with one regular expression over the
requests. Anything unexpected in that part (a missing field, a value of the wrong type, a
count that does not add up, another layout) falls back to a full parse, which also produces
the precise message. `strict=True` parses every file in full. Files are read in parallel.

The contract is docs/schema/level.schema.json (JSON Schema draft 2020-12, written by `make
schema` from module_utils/contract/level_schema.py), the same file the writer's tests
validate against: every level file's top level, summary and the rest but its
request records are validated against it; the request records too under `strict=True`
(the four fields above are checked either way). What the schema cannot say stays here: the
file name agrees with `concurrency`, the counts add up, one schema version per tree, one
file per level, no NaN or Infinity (not JSON) and no number past MAX_MAGNITUDE, nesting
bounded. On top of the schema the analysis types the provenance fields it reads and keeps
latencies at least 0 (tightened()); run.json, lossless.json and status.json are held to the
fields it reads (RUN_SCHEMA, ...). Every problem is one 'file: field: what' line.

Only regular files (or links to one) are read, each at most max_file_bytes (2 GiB unless
raised): a link to /dev/zero, a FIFO, a socket or a device is refused by name (read_regular).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import re
import stat
from array import array
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ansible.module_utils.contract import level_schema, metrics
from ansible.module_utils.contract.launch import TP_FLAGS, flag_value
from ansible.module_utils.contract.level import (
    API_CHECK_FILE,
    API_CHECK_KIND,
    API_CHECK_SCHEMA_VERSION,
    LEVEL_FILE,
    LOSSLESS_KIND,
    MAX_LEVEL_BYTES,
    SUPPORTED_SCHEMAS,
)
from ansible.module_utils.contract.names import (  # noqa: F401  (the analysis' names for them)
    CHAIN_CONTROL,
    MAX_TP,
    base_config,
    config_order,
)
from ansible.module_utils.contract.names import read_config_name as parse_config_name

from analysis.comparability import package_set

# The contract, relative to the repository the analysis runs from.
LEVEL_SCHEMA = Path(__file__).resolve().parent.parent / "docs" / "schema" / "level.schema.json"
# Five checks of a few short strings each: a few kilobytes. Anything far larger is not one.
API_CHECK_BYTES = 1 << 20
REPORT_KIND = "analysis.report"
MAX_DEPTH = 8  # run/host/config/prompt set/c<N>.json is 4 below a run; room for a parent
MAX_FILES = 200_000
MAX_PROBLEMS = 60
# Worker processes pay off only on trees big enough to amortise starting them.
PARALLEL_BYTES = 32 << 20
# Per file (the writer's bound; --max-file-bytes raises it).
DEFAULT_MAX_FILE_BYTES = MAX_LEVEL_BYTES
# Report folders are recognised by their report.json; a real one is a few megabytes at most.
REPORT_JSON_BYTES = 64 << 20
# No number a level holds comes near this (a petabyte, 31,000 years in ms); past it float
# arithmetic (sums, ratios, axis limits at 1.25 x the largest) loses integers or overflows.
MAX_MAGNITUDE = 1e15
# JSON nesting: the deepest a writer goes is about 6; the report embeds run.json, whose
# encoding recurses once per level.
MAX_NESTING = 64

# The module's writer (json.dump, indent=1): top-level keys sit one space in, request
# records two, their own keys three. JSON strings cannot hold a raw newline, so these byte
# patterns only ever match structure.
_REQUESTS_MARK = b'\n "requests": ['
_RECORD_FIELD = re.compile(
    rb'\n   "(index|ok|output_tokens|accept_length|ttft_ms|tpot_ms|e2e_ms|prompt_tokens)": '
    rb"([^\n]*)"
)

_MISSING = object()


class ResultsError(Exception):
    """The results cannot be analysed; `problems` holds one 'file: field: what' line each."""

    def __init__(self, problems: list[str], root: Path | None = None):
        self.problems = problems
        self.root = root
        shown = problems[:MAX_PROBLEMS]
        more = len(problems) - len(shown)
        where = f" under {root}" if root else ""
        lines = [f"{len(problems)} problem(s) with the results{where}:"]
        lines += [f"  {p}" for p in shown]
        if more:
            lines.append(f"  ... and {more} more")
        super().__init__("\n".join(lines))


@dataclass
class Level:
    """One c<N>.json, reduced to what the analysis uses."""

    path: str  # relative to the results root
    host: str
    config: str
    prompt_set: str
    concurrency: int
    schema_version: int
    run_id: str
    summary: dict
    client: dict
    crashed: bool
    settings: dict
    provenance: dict
    # Per request: accept length and output tokens of the speculative requests that succeeded.
    accept: array = field(default_factory=lambda: array("d"))
    accept_tokens: array = field(default_factory=lambda: array("d"))
    records: int = 0
    # Per request that succeeded, in record order: its TTFT, mean TPOT and E2E latency in ms
    # (NaN where the record has none: a one-token answer has no TPOT). Doubles, 24 bytes a
    # request, for goodput under SLOs and the TTFT CDF.
    ttft: array = field(default_factory=lambda: array("d"))
    tpot: array = field(default_factory=lambda: array("d"))
    e2e: array = field(default_factory=lambda: array("d"))
    # Rate mode (r<R>.json): Poisson arrivals at this many requests/s; None for a closed loop.
    request_rate: float | None = None
    arrival: str = "closed"
    repeat: int = 1  # which repeat of the level this file is
    repeats: int = 1  # how many the run asked for
    fill: dict = field(default_factory=dict)  # the level's `fill`, {} for older files
    workload: dict | None = None  # the synthetic workload's record, None for a prompt set
    # The mean context (prompt + half the output) a decode step read, over the requests that
    # succeeded with a prompt_tokens count (_context_mean), and how many were left out: the
    # speed model's context per request.
    context_tokens_mean: float | None = None
    context_skipped: int = 0

    @property
    def closed_loop(self) -> bool:
        return self.request_rate is None

    @property
    def name(self) -> str:
        """The level as its file names it: c16, r2.5."""
        return f"c{self.concurrency}" if self.request_rate is None else f"r{self.request_rate:g}"


@dataclass
class Results:
    root: Path
    levels: list[Level]
    lossless: dict[str, dict]  # host -> the losslessness report
    status: dict[tuple[str, str], dict]  # (host, config) -> status.json
    run: dict  # run.json, when there is one
    # (host, config) -> api-check.json (the server stage's checks of the OpenAI API)
    api_checks: dict[tuple[str, str], dict] = field(default_factory=dict)
    files: int = 0
    bytes_read: int = 0
    run_dir: Path | None = None  # run.json's folder, relative to root

    @property
    def hosts(self) -> list[str]:
        return sorted({level.host for level in self.levels} | {h for h, _ in self.status})

    @property
    def records(self) -> int:
        return sum(level.records for level in self.levels)


# -- discovery -------------------------------------------------------------------------


def discover(root: Path) -> dict[str, list[Path]]:
    """Level, lossless, status and run files under root, skipping hidden folders and the
    analysis's own reports. Linked folders are followed (a run spread over disks), each real
    folder once, so a link back up the tree is no loop."""
    found: dict[str, list[Path]] = {
        "level": [],
        "lossless": [],
        "status": [],
        "run": [],
        "api_check": [],
    }
    count = 0
    base_depth = len(root.parts)
    seen: set[tuple[int, int]] = set()
    for folder, dirs, files in os.walk(root, followlinks=True):
        here = Path(folder)
        depth = len(here.parts) - base_depth
        try:
            info = os.stat(here)
        except OSError:
            dirs[:] = []
            continue
        if (info.st_dev, info.st_ino) in seen:
            dirs[:] = []
            continue
        seen.add((info.st_dev, info.st_ino))
        if depth >= MAX_DEPTH or (here != root and is_report_dir(here, files)):
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            count += 1
            if count > MAX_FILES:
                raise ResultsError(
                    [f"{root}: more than {MAX_FILES} files: point at one run's folder"], root
                )
            if LEVEL_FILE.match(name):
                found["level"].append(here / name)
            elif name == "lossless.json":
                found["lossless"].append(here / name)
            elif name == "status.json":
                found["status"].append(here / name)
            elif name == "run.json":
                found["run"].append(here / name)
            elif name == API_CHECK_FILE:
                found["api_check"].append(here / name)
    return found


def is_report_dir(folder: Path, files: list[str]) -> bool:
    if "report.json" not in files:
        return False
    data, problem = read_regular(folder / "report.json", "report.json", REPORT_JSON_BYTES)
    if problem:
        return False
    try:
        return json.loads(data).get("kind", "").startswith("analysis.")
    except (ValueError, AttributeError, RecursionError):
        return False


# -- reading a file --------------------------------------------------------------------

_NOT_REGULAR = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


def _not_regular(mode: int) -> str | None:
    for test, words in _NOT_REGULAR:
        if test(mode):
            return words
    return None if stat.S_ISREG(mode) else "not a file"


def _size_text(size: int) -> str:
    return f"{size} bytes"


def read_regular(path: Path | str, rel: str, limit: int) -> tuple[bytes | None, str | None]:
    """(the file's bytes, None), or (None, a 'file: (file): why' problem). Only a regular file
    (or a link to one) of at most `limit` bytes is read: /dev/zero never ends, a FIFO blocks
    until someone writes. The file is looked at before it is opened (for the message) and
    after (through the descriptor: what was opened is what is read); O_NONBLOCK makes the
    open of a FIFO swapped in between return at once instead of waiting for a writer."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)

    def refused(words: str) -> tuple[None, str]:
        return None, f"{rel}: (file): {words}"

    def not_regular(kind: str) -> tuple[None, str]:
        return refused(f"{kind}, not a regular file; only regular files (or links to one) are read")

    def too_big(size: int) -> tuple[None, str]:
        return refused(
            f"{_size_text(size)}, over the limit of {_size_text(limit)} per file; raise it with "
            "--max-file-bytes if the file is genuine"
        )

    try:
        info = os.stat(path)
        kind = _not_regular(info.st_mode)
        if kind:
            return not_regular(kind)
        if info.st_size > limit:
            return too_big(info.st_size)
        descriptor = os.open(path, flags)
    except OSError as error:
        return refused(f"cannot be read: {error.strerror or error}")
    try:
        info = os.fstat(descriptor)
        kind = _not_regular(info.st_mode)
        if kind:
            return not_regular(kind)
        os.set_blocking(descriptor, True)
        with os.fdopen(descriptor, "rb", buffering=0, closefd=False) as handle:
            # One read of the size it has, then chunks while it grows (up to the limit).
            data = handle.read(min(info.st_size, limit) + 1) or b""
            while len(data) <= limit:
                more = handle.read(min(1 << 24, limit + 1 - len(data)))
                if not more:
                    break
                data += more
    except OSError as error:
        return refused(f"cannot be read: {error.strerror or error}")
    finally:
        os.close(descriptor)
    if len(data) > limit:
        return too_big(len(data))  # it grew while being read
    return data, None


# -- the contract ----------------------------------------------------------------------


@functools.cache
def level_validator():
    """The compiled validator of the level schema (module_utils/contract/level_schema.py,
    committed as docs/schema/level.schema.json), one per process: compiling (resolving its
    $refs) costs more than validating a level's top level. load() builds it before starting
    worker processes, which inherit it."""
    from jsonschema import Draft202012Validator, validators

    schema = tightened(level_schema.schema())
    plain_items = Draft202012Validator.VALIDATORS["items"]
    quick: dict[int, tuple] = {}

    def items(validator, value, instance, schema):
        # Most of a request record is two long lists (events, output_ids) of one simple
        # shape; the generic keyword walk costs ~10 ms a record there. A list every item of
        # which passes a plain-Python test that accepts only what `value` accepts is valid;
        # anything else takes the generic walk, which also words the error.
        if id(value) not in quick:
            quick[id(value)] = (value, _quick_test(value))
        test = quick[id(value)][1]
        simple = test is not None and "prefixItems" not in schema
        if simple and isinstance(instance, list) and all(map(test, instance)):
            return
        yield from plain_items(validator, value, instance, schema)

    checked = validators.extend(Draft202012Validator, {"items": items})
    return checked(schema)


# The parts of a level's open provenance the report reads, typed as the writers write them
# (gpu: module_utils/host/gpu_topology.py; launch and runtime: the server and runtime stages'
# records). The schema leaves these open; the analysis cannot show what it cannot read.
_PROVENANCE_READ = {
    "profile": {"type": ["string", "null"]},
    "gpu": {
        "properties": {
            "count": {"type": ["integer", "null"], "minimum": 0},
            "models": {
                "type": ["object", "null"],
                "additionalProperties": {"type": "integer", "minimum": 0},
            },
        }
    },
    "launch": {
        "properties": {
            "environment": {"type": ["object", "null"]},
            # Drawn on a log scale and added to: a count of tree nodes, not any integer.
            "budget": {"minimum": 1, "maximum": 1_000_000},
        }
    },
    "runtime": {
        "properties": {
            "release": {"type": ["object", "null"]},
            "git": {
                "type": ["object", "null"],
                "properties": {"patches": {"type": ["array", "null"]}},
            },
        }
    },
    "prompt_sets": {"additionalProperties": {"type": "object"}},
}
# Latencies cannot be negative: the summary's distributions (the client's loop lag, which
# shares their shape, may be slightly).
_LATENCIES = metrics.distributions()


def tightened(schema: dict) -> dict:
    """docs/schema/level.schema.json with what the analysis needs on top: the provenance
    fields it reads typed, and latencies at least 0. Only constraints the file does not set
    are added, so a level the analysis reads is always one the contract accepts."""
    defs = schema["$defs"]
    _add(defs["provenance"]["properties"], _PROVENANCE_READ)
    latency = json.loads(json.dumps(defs["stat"]))
    for name, value in latency["properties"].items():
        if name != "count":
            value.setdefault("minimum", 0)
    defs["latency"] = latency
    for name in _LATENCIES:
        defs["summary"]["properties"][name]["$ref"] = "#/$defs/latency"
    return schema


def _add(target: dict, extra: dict) -> None:
    for key, value in extra.items():
        if key not in target:
            target[key] = json.loads(json.dumps(value))
        elif isinstance(value, dict) and isinstance(target[key], dict):
            _add(target[key], value)


_PYTHON_TYPES = {
    "integer": (int,),
    "number": (int, float),
    "string": (str,),
    "boolean": (bool,),
    "null": (type(None),),
    "array": (list,),
    "object": (dict,),
}


def _quick_test(schema):
    """A predicate that accepts a subset of what `schema` accepts, for schemas made only of
    type, minimum, prefixItems, items: false and minItems; None for any other schema. (type()
    is exact: a bool is no integer, as in JSON; 3.0, an integer to JSON Schema, is left to
    the generic walk.)"""
    if not isinstance(schema, dict) or set(schema) - {
        "type",
        "minimum",
        "prefixItems",
        "items",
        "minItems",
    }:
        return None
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if kinds is not None and any(k not in _PYTHON_TYPES for k in kinds):
        return None
    allowed = tuple(t for k in kinds for t in _PYTHON_TYPES[k]) if kinds is not None else None
    minimum = schema.get("minimum")
    prefix = [_quick_test(s) for s in schema.get("prefixItems", [])]
    if None in prefix or ("items" in schema and schema["items"] is not False):
        return None
    closed = schema.get("items") is False
    least = schema.get("minItems", 0)

    def test(value) -> bool:
        if allowed is not None and type(value) not in allowed:
            return False
        if minimum is not None and type(value) in (int, float) and not value >= minimum:
            return False
        if type(value) is list:
            if len(value) < least or (closed and len(value) > len(prefix)):
                return False
            return all(check(item) for check, item in zip(prefix, value, strict=False))
        return True

    return test


def contract_problems(document: dict, rel: str, records: bool) -> list[str]:
    """One 'file: field: what' line per way the level breaks the schema; its request records
    are validated only when `records` (otherwise they are left out)."""
    if not records:
        document = {**document, "requests": []}
    return schema_problems(level_validator(), document, rel)


def schema_problems(validator, document, rel: str) -> list[str]:
    """The validator's errors on document as 'file: field: what' lines, at most MAX_PROBLEMS."""
    errors = list(itertools.islice(validator.iter_errors(document), MAX_PROBLEMS))
    lines: list[str] = []
    for error in sorted(errors, key=lambda e: [str(part) for part in e.absolute_path]):
        for line in _worded(error, rel):
            if line not in lines:
                lines.append(line)
    return lines


_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_:-]+$")


def _field(path) -> str:
    """A JSON path: summary.ttft_ms.p99, requests[3].ok; a key with other characters quoted,
    gpu.models["NVIDIA H200"], so the path ends where the message's ': ' begins."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _PLAIN_KEY.match(str(part)):
            text += f".{part}" if text else str(part)
        else:
            text += f"[{json.dumps(str(part))}]"
    return text


def _worded(error, rel: str) -> list[str]:
    where = _field(error.absolute_path)
    inside = f"{where}." if where else ""
    schema, instance = error.schema, error.instance
    known = schema.get("properties", {}) if isinstance(schema, dict) else {}
    if error.validator == "required":
        return [
            f"{rel}: {inside}{name}: expected {_expected(known[name])}, missing"
            if name in known
            else f"{rel}: {inside}{name}: missing"
            for name in error.validator_value
            if isinstance(instance, dict) and name not in instance
        ]
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        version = SUPPORTED_SCHEMAS[-1]
        return [
            f"{rel}: {inside}{name}: not a field of schema_version {version} "
            f"({LEVEL_SCHEMA.parent.parent.name}/{LEVEL_SCHEMA.parent.name}/"
            f"{LEVEL_SCHEMA.name}); a writer that adds fields bumps schema_version"
            for name in instance
            if name not in known
        ]
    where = where or "(top level)"
    if error.validator in (
        "type",
        "minimum",
        "exclusiveMinimum",
        "maximum",
        "const",
        "enum",
        "pattern",
    ):
        return [f"{rel}: {where}: expected {_expected(schema)}, found {_show(instance)}"]
    if error.validator in ("maxLength", "maxItems") and isinstance(instance, (str, list)):
        # jsonschema's own message quotes the whole value: an untrusted file's megabyte.
        unit = "characters" if isinstance(instance, str) else "items"
        return [
            f"{rel}: {where}: expected at most {error.validator_value} {unit}, found "
            f"{len(instance)}"
        ]
    return [f"{rel}: {where}: {error.message}"]


_TYPE_WORDS = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "null": "null",
    "array": "a list",
    "object": "an object",
}


def _expected(schema) -> str:
    """What a (sub)schema asks for, in the words the reader's messages use."""
    if not isinstance(schema, dict):
        return "nothing here"
    if "$ref" in schema and "type" not in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return _expected(level_validator().schema.get("$defs", {}).get(name, {}))
    if "const" in schema:
        return _show(schema["const"])
    if "enum" in schema:
        return "one of " + ", ".join(map(repr, schema["enum"]))
    kinds = schema.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    if kinds == ["integer"] and schema.get("minimum") == 0 and "maximum" not in schema:
        return "a count (an integer of 0 or more)"
    words = " or ".join(_TYPE_WORDS.get(k, k) for k in kinds if k != "null") or "a value"
    items = _expected(schema["items"]) if isinstance(schema.get("items"), dict) else ""
    if kinds == ["array"] and items.startswith(("a ", "an ")):
        # "a string" -> "a list of strings", "an integer of at least 1" -> "... integers of ..."
        first, _, rest = items.split(" ", 1)[1].partition(" ")
        words = f"a list of {first}s" + (f" {rest}" if rest else "")
    qualified = any(k in schema for k in ("minimum", "exclusiveMinimum", "maximum", "pattern"))
    if "minimum" in schema:
        words += f" of at least {schema['minimum']}"
    if "exclusiveMinimum" in schema:
        words += f" above {schema['exclusiveMinimum']}"
    if "maximum" in schema:
        words += (" and" if "minimum" in schema else " of") + f" at most {schema['maximum']}"
    if "pattern" in schema:
        words += f" matching {schema['pattern']}"
    if "null" in kinds:
        words = "null" if words == "a value" else words + (", or null" if qualified else " or null")
    return words


# -- one level file --------------------------------------------------------------------


def _parse(data: bytes):
    """json.loads, NaN and Infinity read as floats (so that number_problems names where they
    are: JSON has no such numbers, and the schema's "number" cannot refuse them)."""
    return json.loads(data, parse_constant=float)


def number_problems(document, rel: str, requests: bool = True) -> list[str]:
    """One 'file: field: what' line per number that is not finite or too large to compute
    with (MAX_MAGNITUDE; a request's prompt_id, a name, excepted), and per value nested deeper
    than MAX_NESTING. The request records are left out unless `requests`."""
    problems: list[str] = []
    stack = [(document, (), 0)]
    while stack and len(problems) < MAX_PROBLEMS:
        value, path, depth = stack.pop()
        if isinstance(value, dict):
            if depth >= MAX_NESTING:
                problems.append(f"{rel}: {_field(path)}: nested more than {MAX_NESTING} deep")
                continue
            for key, item in value.items():
                if not (depth == 0 and key == "requests" and not requests):
                    stack.append((item, (*path, key), depth + 1))
        elif isinstance(value, list):
            if depth >= MAX_NESTING:
                problems.append(f"{rel}: {_field(path)}: nested more than {MAX_NESTING} deep")
                continue
            stack.extend((item, (*path, i), depth + 1) for i, item in enumerate(value))
        elif (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and not _finite(value)
            and not (path[:1] == ("requests",) and path[-1] == "prompt_id")
        ):
            problems.append(
                f"{rel}: {_field(path) or '(top level)'}: expected a finite number of "
                f"magnitude at most {MAX_MAGNITUDE:g}, found {_show(value)}"
            )
    return sorted(problems)


def _finite(value) -> bool:
    """A number the analysis can compute with: finite, and at most MAX_MAGNITUDE across."""
    try:
        return math.isfinite(value) and abs(value) <= MAX_MAGNITUDE
    except OverflowError:  # an integer beyond any float
        return False


def _merged(first: list[str], second: list[str]) -> list[str]:
    """first, then the lines of second about fields first does not name."""
    named = {line.split(": ", 2)[1] for line in first}
    return first + [line for line in second if line.split(": ", 2)[1] not in named]


def read_level(
    path: str, rel: str, strict: bool = False, limit: int = DEFAULT_MAX_FILE_BYTES
) -> tuple[dict | None, list[str], int]:
    """(the level's reduced fields, problems, bytes read). Runs in worker processes."""
    data, problem = read_regular(path, rel, limit)
    if data is None:
        return None, [problem], 0
    parsed = None if strict else _fast(data)
    if parsed is None:
        try:
            document = _parse(data)
        except UnicodeDecodeError as error:
            return (
                None,
                [f"{rel}: (file): not UTF-8 text ({error.reason} at byte {error.start})"],
                len(data),
            )
        except json.JSONDecodeError as error:
            return None, [f"{rel}: {_where(error)}: {_syntax(error)}"], len(data)
        except (ValueError, RecursionError) as error:
            return None, [f"{rel}: (top level): not valid JSON: {_unparsed(error)}"], len(data)
        if not isinstance(document, dict):
            return None, [f"{rel}: (top level): expected a JSON object"], len(data)
        records = document.get("requests")
        problems: list[str] = []
        if not isinstance(records, list):
            problems.append(f"{rel}: requests: expected a list of request records")
            records = []
        fields = []
        for number, record in enumerate(records):
            if not isinstance(record, dict):
                problems.append(f"{rel}: requests[{number}]: expected an object")
                continue
            fields.append(
                (
                    record.get("index", _MISSING),
                    record.get("ok", _MISSING),
                    record.get("output_tokens", _MISSING),
                    record.get("accept_length"),
                    record.get("ttft_ms"),
                    record.get("tpot_ms"),
                    record.get("e2e_ms"),
                    record.get("prompt_tokens"),
                )
            )
        if problems:
            return None, problems, len(data)
        parsed = (document, fields)
    document, fields = parsed
    version = document.get("schema_version")
    if (
        isinstance(version, int)
        and not isinstance(version, bool)
        and version not in SUPPORTED_SCHEMAS
        and _finite(version)
    ):
        # Named once for the whole tree by load(); its fields are another contract's.
        return {"schema_version": version, "unsupported": True}, [], len(data)
    numbers = number_problems(document, rel, requests=strict)
    if any(line.endswith(" deep") for line in numbers):
        return None, numbers, len(data)  # the schema's validator recurses as deep
    problems = _merged(numbers, contract_problems(document, rel, records=strict))
    if problems:
        return None, problems, len(data)
    level, problems = _reduce(document, fields, rel)
    return level, problems, len(data)


def _unparsed(error: Exception) -> str:
    if isinstance(error, RecursionError):
        return f"nested too deeply to read (more than {MAX_NESTING} levels are never written)"
    return str(error)


def _fast(data: bytes):
    """(document without requests, per-request fields) for the module's layout, else None."""
    mark = data.find(_REQUESTS_MARK)
    if mark < 0:
        return None
    # requests must be the last key, its list closed the way the writer closes it; a file cut
    # short after some record is left to the full parse, which says where it ends.
    last = data[-64:]
    closing = last.rstrip()
    if not (closing.endswith(b"\n ]\n}") or closing.endswith(b'"requests": []\n}')):
        return None
    end = len(data) - (len(last) - len(closing))
    head = data[:mark].rstrip()
    if not head.endswith(b","):
        return None
    try:
        document = _parse(head[:-1] + b"\n}")
    except (ValueError, RecursionError):
        return None
    if not isinstance(document, dict):
        return None
    fields: list[tuple] = []
    current: dict | None = None
    # findall's tuples cost less than a match object per field (7 fields a record).
    for name, raw in _RECORD_FIELD.findall(data, mark + len(_REQUESTS_MARK), end):
        raw = raw.rstrip(b",")
        if name == b"index":
            if current is not None:
                fields.append(_fields_of(current))
            current = {name: raw}
        elif current is None or name in current:
            return None
        else:
            current[name] = raw
    if current is not None:
        fields.append(_fields_of(current))
    # A record without an index would hide among its neighbours' fields: the summary's
    # request counts, checked against the records found, catch it.
    if _BAD in {v for f in fields for v in f}:
        return None
    return document, fields


_BAD = object()


def _fields_of(raw: dict) -> tuple:
    """(index, ok, output_tokens, accept_length, ttft_ms, tpot_ms, e2e_ms, prompt_tokens) from
    one record's raw values; _BAD where a value is missing or not what the full parse would
    accept, so that path reports it. prompt_tokens is only read for the speed model's context
    (never refused: a value that is no count is left out there), so it is kept as it came."""
    ok = raw.get(b"ok")

    def optional(name: bytes):
        value = raw.get(name, b"null")  # failed requests may carry none
        return None if value == b"null" else _float(value)

    return (
        _int(raw[b"index"]),
        True if ok == b"true" else False if ok == b"false" else _BAD,
        _int(raw.get(b"output_tokens", b"")),
        optional(b"accept_length"),
        optional(b"ttft_ms"),
        optional(b"tpot_ms"),
        optional(b"e2e_ms"),
        _loose_int(raw.get(b"prompt_tokens", b"null")),
    )


def _loose_int(raw: bytes):
    """A count as the full parse would give it (int, or None), else the text: what
    _context_mean skips and counts."""
    try:
        return int(raw)
    except ValueError:
        return None if raw == b"null" else raw.decode("ascii", "replace")[:40]


def _int(raw: bytes):
    try:
        return int(raw)
    except ValueError:
        return _BAD


def _float(raw: bytes):
    try:
        value = float(raw)
    except ValueError:
        return _BAD
    return value if math.isfinite(value) else _BAD


def _syntax(error: json.JSONDecodeError, fix: str = "run that level again") -> str:
    # A string with no closing quote runs to the end of the file: cut short, too.
    if error.pos >= len(error.doc.rstrip()) or error.msg.startswith("Unterminated string"):
        return (
            f"the JSON ends early (line {error.lineno} column {error.colno}): the file is "
            f"truncated, or was cut while being copied; {fix}"
        )
    return f"not valid JSON: {error.msg} (line {error.lineno} column {error.colno})"


_TOP_KEY_TEXT = re.compile(r'\n "([^"\\]+)": ')


def _where(error: json.JSONDecodeError) -> str:
    """The field the error falls in, for the module's layout: `requests[17]`, `summary`."""
    text, position = error.doc, error.pos
    keys = list(_TOP_KEY_TEXT.finditer(text, 0, position))
    if not keys:
        return "(top level)"
    name = keys[-1].group(1)
    if name != "requests":
        return name
    index = text.count("\n  {\n", keys[-1].end(), position) - 1
    return f"requests[{index}]" if index >= 0 else "requests"


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and _finite(value)


def ratio(numerator, denominator) -> float | None:
    """numerator / denominator when both are numbers, the denominator is not 0 and the
    quotient is finite (a tiny denominator can overflow it), else None."""
    if numerator is None or not denominator:
        return None
    value = numerator / denominator
    return value if math.isfinite(value) else None


def _show(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _reduce(document: dict, fields: list[tuple], rel: str) -> tuple[dict | None, list[str]]:
    """Check what the schema cannot (the file name, the request records' reduced fields when
    they were not validated, the counts) of a level that passed it, and keep what the
    analysis uses."""
    problems: list[str] = []

    def bad(name: str, what: str, value=_MISSING) -> None:
        found = "missing" if value is _MISSING else f"found {_show(value)}"
        problems.append(f"{rel}: {name}: expected {what}, {found}")

    config, prompt_set = document["config"], document["prompt_set"]
    # Both name folders of the results tree.
    if "/" in config:
        bad("config", "the serving config's name", config)
    if "/" in prompt_set:
        bad("prompt_set", "a prompt set's name", prompt_set)
    concurrency = document["concurrency"]
    shape = _level_shape(document, rel, problems)
    summary, client, provenance = document["summary"], document["client"], document["provenance"]

    accept, weights = array("d"), array("d")
    latencies = {"ttft": array("d"), "tpot": array("d"), "e2e": array("d")}
    ok_count = 0
    contexts: list[tuple[int, object]] = []  # (output tokens, prompt_tokens) of ok requests
    for number, (index, ok, tokens, accept_length, *timed, prompt_tokens) in enumerate(fields):
        where = f"requests[{number}]"
        if not isinstance(index, int) or isinstance(index, bool):
            bad(f"{where}.index", "an integer", index)
        if not isinstance(ok, bool):
            bad(f"{where}.ok", "true or false", ok)
            continue
        if not isinstance(tokens, int) or isinstance(tokens, bool) or not _finite(tokens):
            bad(f"{where}.output_tokens", "a count (an integer of 0 or more)", tokens)
            continue
        if tokens < 0:
            bad(f"{where}.output_tokens", "a count (an integer of 0 or more)", tokens)
            continue
        if accept_length is not None and (not _number(accept_length) or accept_length < 0):
            bad(f"{where}.accept_length", "a number of 0 or more, or null", accept_length)
            continue
        wrong = [
            (name, value)
            for name, value in zip(_TIMED, timed, strict=True)
            if value is not None and (not _number(value) or value < 0)
        ]
        for name, value in wrong:
            bad(f"{where}.{name}_ms", "a number of 0 or more, or null", value)
        if wrong:
            continue
        if ok:
            ok_count += 1
            contexts.append((tokens, prompt_tokens))
            if accept_length is not None:
                accept.append(accept_length)
                weights.append(tokens)
            for name, value in zip(_TIMED, timed, strict=True):
                latencies[name].append(math.nan if value is None else value)
        if len(problems) > MAX_PROBLEMS:
            break
    if not problems:
        counted = summary["requests_ok"] + summary["requests_failed"]
        if counted != len(fields):
            problems.append(
                f"{rel}: summary.requests_ok: requests_ok + requests_failed is {counted}, but "
                f"the file holds {len(fields)} request records"
            )
        elif summary["requests_ok"] != ok_count:
            problems.append(
                f"{rel}: summary.requests_ok: {summary['requests_ok']}, but {ok_count} request "
                "records have ok true"
            )
    if not problems and summary.get("accuracy") is not None:
        problems += accuracy_problems(summary["accuracy"], len(fields), rel)
    if problems:
        return None, problems
    context_mean, context_skipped = _context_mean(contexts)
    return {
        "schema_version": document["schema_version"],
        "config": config,
        "prompt_set": prompt_set,
        "concurrency": concurrency,
        "run_id": str(document["run_label"] or provenance.get("run_id") or ""),
        "summary": dict(summary),
        "client": {
            "saturated": client["saturated"],
            "saturated_reasons": client["saturated_reasons"],
            "cpu_fraction": client["cpu_fraction"],
        },
        "crashed": document["server"]["crashed"],
        "settings": document["settings"],
        "provenance": reduce_provenance(provenance),
        "started_at": document["started_at"],
        "accept": accept,
        "accept_tokens": weights,
        "context_tokens_mean": context_mean,
        "context_skipped": context_skipped,
        "records": len(fields),
        **latencies,
        **shape,
    }, []


_TIMED = ("ttft", "tpot", "e2e")
# A prompt longer than this is no prompt any model here reads (K2.6's context is 262,144).
MAX_PROMPT_TOKENS = 1 << 24


def _context_mean(contexts: list[tuple[int, object]]) -> tuple[float | None, int]:
    """(mean context a decode step of the level reads, requests left out): each request's
    context grows from its prompt to prompt + output over its decode, so it reads prompt +
    output / 2 on average, weighted by its output tokens (its share of the level's steps).
    prompt_tokens is SGLang's count; a record without one, or with something that is no count
    (a string, a negative or absurd number), is left out and counted: the speed model's
    context then rests on the others, and the report says how many were skipped."""
    weight = total = 0.0
    skipped = 0
    for tokens, prompt in contexts:
        if (
            isinstance(prompt, bool)
            or not isinstance(prompt, int)
            or not 0 <= prompt <= MAX_PROMPT_TOKENS
        ):
            skipped += 1
            continue
        share = max(tokens, 1)
        weight += share
        total += share * (prompt + tokens / 2)
    return (round(total / weight, 1) if weight else None), skipped


_WORKLOAD_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


def _level_shape(document: dict, rel: str, problems: list[str]) -> dict:
    """How the level was driven - request_rate, arrival, repeat, repeats, fill, workload -
    checked against the file name (c<N>[.rep<k>].json, r<R>[.rep<k>].json) and typed here,
    whatever the schema says: the analysis keys its rows by them."""
    match = LEVEL_FILE.match(os.path.basename(rel))
    concurrency = document["concurrency"]
    rate = document.get("request_rate")
    if rate is not None and (not _number(rate) or rate <= 0):
        problems.append(
            f"{rel}: request_rate: expected a number above 0 or null, found {_show(rate)}"
        )
        rate = None
    if match:
        closed, named_rate, named_repeat = match.groups()
        if closed is not None and int(closed) != concurrency:
            problems.append(
                f"{rel}: concurrency: {concurrency} does not match the file name "
                f"(c{closed}.json); the file was renamed or moved"
            )
        if closed is not None and rate is not None:
            problems.append(
                f"{rel}: request_rate: {rate:g}, but the file name (c{closed}) names a closed "
                "loop; a rate level is r<R>.json"
            )
        if named_rate is not None and (
            rate is None or abs(rate - float(named_rate)) > 1e-9 * max(rate, 1)
        ):
            problems.append(
                f"{rel}: request_rate: {_show(rate)} does not match the file name "
                f"(r{named_rate}); the file was renamed or moved"
            )
    else:
        named_repeat = None
    repeat = document.get("repeat")
    if repeat is not None and (
        not isinstance(repeat, int) or isinstance(repeat, bool) or not 1 <= repeat <= MAX_COUNT
    ):
        problems.append(f"{rel}: repeat: expected an integer of at least 1, found {_show(repeat)}")
        repeat = None
    if named_repeat is not None and repeat is not None and int(named_repeat) != repeat:
        problems.append(
            f"{rel}: repeat: {repeat} does not match the file name (.rep{named_repeat}); the "
            "file was renamed or moved"
        )
    repeat = repeat or (int(named_repeat) if named_repeat else 1)
    repeats = document.get("repeats")
    if not isinstance(repeats, int) or isinstance(repeats, bool) or not 1 <= repeats <= MAX_COUNT:
        repeats = max(repeat, 1)
    fill = document.get("fill")
    if fill is not None and not isinstance(fill, dict):
        problems.append(f"{rel}: fill: expected an object, found {_show(fill)}")
        fill = None
    fill = {
        k: v
        for k, v in (fill or {}).items()
        if k in _FILL
        and (isinstance(v, bool) if k in _FILL_FLAGS else _number(v) and not isinstance(v, bool))
    }
    workload = document.get("workload")
    if workload is not None and (
        not isinstance(workload, dict)
        or not isinstance(workload.get("name"), str)
        or not _WORKLOAD_NAME.match(workload["name"])
    ):
        problems.append(
            f"{rel}: workload.name: expected a workload's name (letters, digits, ._-), found "
            f"{_show(workload.get('name') if isinstance(workload, dict) else workload)}"
        )
        workload = None
    arrival = "poisson" if rate is not None else "closed"
    return {
        "request_rate": rate,
        "arrival": arrival,
        "repeat": repeat,
        "repeats": repeats,
        "fill": fill,
        "workload": {k: v for k, v in workload.items() if k in _WORKLOAD_KEPT}
        if workload
        else None,
    }


_FILL = (
    "wanted",
    "unique_prompts",
    "sent",
    "under_filled",
    "stopped_by_time_budget",
    "time_budget_s",
)
_FILL_FLAGS = ("under_filled", "stopped_by_time_budget")
_WORKLOAD_KEPT = ("name", "isl", "osl", "ignore_eos", "seed")


_OUTCOMES = re.compile(r"^[cwu]*$")
_OUTCOME_COUNTS = (("correct", "c"), ("wrong", "w"), ("unanswered", "u"))


def accuracy_problems(accuracy, records: int, rel: str) -> list[str]:
    """What the schema cannot say of a level's summary.accuracy: one outcome character per
    request record, the counts those characters add up to, and the accuracy they give. The
    analysis pairs two configs' outcomes prompt by prompt, so a string that does not match its
    records would pair the wrong answers."""
    where = f"{rel}: summary.accuracy"
    if not isinstance(accuracy, dict):
        return [f"{where}: expected an object, found {_show(accuracy)}"]
    outcomes = accuracy.get("outcomes")
    if not isinstance(outcomes, str) or not _OUTCOMES.match(outcomes):
        return [f"{where}.outcomes: expected a string of c, w and u, found {_show(outcomes)}"]
    problems = []
    if len(outcomes) != records:
        problems.append(
            f"{where}.outcomes: {len(outcomes)} outcomes, but the file holds {records} request "
            "records (one outcome each, in request order)"
        )
    for name in ("n", "correct", "wrong", "unanswered"):
        value = accuracy.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            problems.append(f"{where}.{name}: expected a count (an integer of 0 or more)")
    if problems:
        return problems
    if accuracy["n"] != len(outcomes):
        problems.append(f"{where}.n: {accuracy['n']}, but outcomes holds {len(outcomes)}")
    for name, letter in _OUTCOME_COUNTS:
        if accuracy[name] != outcomes.count(letter):
            problems.append(
                f"{where}.{name}: {accuracy[name]}, but outcomes holds {outcomes.count(letter)} "
                f"{letter}"
            )
    value = accuracy.get("accuracy")
    expected = accuracy["correct"] / accuracy["n"] if accuracy["n"] else None
    # With no request scored the writer's accuracy is whatever it chose for 0 / 0.
    if (
        value is not None
        and expected is not None
        and (not _number(value) or abs(value - expected) > 1e-3)
    ):
        problems.append(f"{where}.accuracy: {_show(value)}, but correct / n is {expected:.4f}")
    if not isinstance(accuracy.get("scorer"), str) or len(accuracy["scorer"]) > 64:
        problems.append(
            f"{where}.scorer: expected the scorer's name, found {_show(accuracy.get('scorer'))}"
        )
    return problems


def reduce_provenance(provenance: dict) -> dict:
    """The parts of a level's provenance the report shows (the rest stays in the files)."""

    def pick(value, *names):
        return {n: value.get(n) for n in names} if isinstance(value, dict) else None

    launch = provenance.get("launch") if isinstance(provenance.get("launch"), dict) else {}
    runtime = provenance.get("runtime") if isinstance(provenance.get("runtime"), dict) else {}
    git = runtime.get("git") if isinstance(runtime.get("git"), dict) else None
    release = runtime.get("release") if isinstance(runtime.get("release"), dict) else None
    weights = provenance.get("weights") if isinstance(provenance.get("weights"), list) else []
    # The benchmark role records every prompt set by name; this level's is `prompts.name`.
    sets = provenance.get("prompt_sets")
    prompt_set = sets.get(provenance["prompts"]["name"]) if isinstance(sets, dict) else None
    return {
        "host": provenance.get("host"),
        "profile": provenance.get("profile"),
        "kit_version": provenance.get("kit_version"),
        "sglang_version": provenance.get("sglang_version"),
        "gpu": pick(
            provenance.get("gpu"),
            "count",
            "models",
            "driver_version",
            "cuda_version",
            "interconnect",
        ),
        "runtime": {
            "release": release.get("version") if release else None,
            "git": pick(git, "url", "ref", "commit", "patches") if git else None,
            # Each runtime's installed packages as a digest, for compare's comparability.
            "packages": {"release": package_set(release), "git": package_set(git)},
        },
        "launch": pick(launch, "config", "base", "budget", "runtime", "argv", "environment"),
        "weights": [pick(w, "role", "repo_id", "revision", "manifest_sha256") for w in weights[:4]],
        "prompts": pick(provenance.get("prompts"), "name", "sha256", "requests_per_level"),
        "prompt_source": prompt_set.get("source") if isinstance(prompt_set, dict) else None,
        # The chat template switches the set was rendered with (thinking off for scored sets).
        "chat_template_kwargs": _template_kwargs(prompt_set),
        "started_at": provenance.get("started_at"),
        "ended_at": provenance.get("ended_at"),
        # The host records the speed model reads where the benchmark role named them (the
        # tuning stage's all-reduce check, the host's speed calibration): bounded copies,
        # every field checked where it is used (analysis/predicted.py).
        "allreduce": _bounded(provenance.get("allreduce")),
        "speed_calibration": _bounded(provenance.get("speed_calibration")),
    }


# A host record kept for the speed model: a few levels deep, a few hundred items, short
# texts. The tuning stage's all-reduce record has a row per message size (about 16), a
# calibration record a row per token count (about 10): anything far larger is not one.
_RECORD_DEPTH = 4
_RECORD_ITEMS = 256
_RECORD_TEXT = 200


def _bounded(value, depth: int = _RECORD_DEPTH):
    """value as JSON with at most _RECORD_DEPTH levels, _RECORD_ITEMS items a list or object
    and _RECORD_TEXT characters a string; what lies deeper, and numbers that are not finite,
    become None."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value if _finite(value) else None
    if isinstance(value, str):
        return value[:_RECORD_TEXT]
    if depth <= 0:
        return None
    if isinstance(value, list):
        return [_bounded(item, depth - 1) for item in value[:_RECORD_ITEMS]]
    if isinstance(value, dict):
        return {
            str(key)[:64]: _bounded(item, depth - 1)
            for key, item in itertools.islice(value.items(), _RECORD_ITEMS)
        }
    return None


def _template_kwargs(prompt_set) -> dict | None:
    template = prompt_set.get("chat_template") if isinstance(prompt_set, dict) else None
    kwargs = template.get("kwargs") if isinstance(template, dict) else None
    if not isinstance(kwargs, dict):
        return None
    # Shown in messages: a few short scalar switches, nothing else.
    return {
        str(k)[:64]: v
        for k, v in list(kwargs.items())[:16]
        if isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= 64)
    }


# -- the other files -------------------------------------------------------------------


_NAMES = {"type": "array", "items": {"type": "string", "minLength": 1}}
# A name shown in a title: a repository id or a revision is far shorter.
_SHORT = {"type": "string", "maxLength": 200}
# run.json as roles/benchmark/tasks/main.yml writes it: the fields the analysis reads (the
# reference config, the run's name and kit, the plan the incomplete_run warnings check).
RUN_SCHEMA = {
    "type": "object",
    "properties": {
        "run_id": {"type": "string"},
        "kit_version": {"type": "string"},
        "started_at": {"type": "string"},
        "ended_at": {"type": "string"},
        "reference_config": {"type": "string", "minLength": 1},
        "hosts": _NAMES,
        "configs": _NAMES,
        "prompt_sets": _NAMES,
        "concurrency": {"type": "array", "items": {"type": "integer", "minimum": 1}},
        "request_rates": {
            "type": "array",
            "maxItems": 1000,
            "items": {"type": "number", "exclusiveMinimum": 0, "maximum": 1_000_000},
        },
        "repeats": {"type": "integer", "minimum": 1, "maximum": 100},
        "num_prompts": {"type": "integer", "minimum": 1},
        "max_new_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0},
        # The model under test (roles/benchmark's benchmark_model); runs before models were
        # data have none, and their model is unknown.
        "model": {
            "type": "object",
            "properties": {
                "name": _SHORT,
                "title": _SHORT,
                "attention": _SHORT,
                "target": {
                    "type": "object",
                    "properties": {"repo_id": _SHORT, "revision": _SHORT},
                },
                # Per prompt set the accuracy the reference config must reach, and where that
                # floor comes from (the model's model.yml accuracy.floors).
                "accuracy_floors": {
                    "type": "object",
                    "propertyNames": {"maxLength": 200},
                    "additionalProperties": {
                        "type": "object",
                        "properties": {
                            "floor": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                            "source": {"type": "string", "maxLength": 2000},
                        },
                        "required": ["floor"],
                    },
                },
            },
        },
    },
}
_RATE = {"type": ["number", "null"], "minimum": 0, "maximum": 1}
# lossless.json as library/benchmark_lossless.py writes it: the fields the report reads.
LOSSLESS_SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"const": LOSSLESS_KIND},
        "reference": {"type": "string"},
        "threshold": {"type": "number", "minimum": 0, "maximum": 1},
        "configs": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "properties": {
                    "broken_verification": {"type": "boolean"},
                    "mismatch_rate": _RATE,
                    "request_mismatch_rate": _RATE,
                    "tokens_compared": {"type": "integer", "minimum": 0},
                    "not_checked": {"type": ["array", "null"]},
                },
                "required": ["broken_verification"],
            },
        },
    },
    "required": ["configs"],
}
# api-check.json as the server stage writes it (module_utils/server/api_check.py), copied beside
# the config's levels: untrusted, so every field shown is typed and bounded.
_CHECK_TEXT = {"type": ["string", "null"], "maxLength": 4000}
API_CHECK_SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"const": API_CHECK_KIND},
        "schema_version": {"const": API_CHECK_SCHEMA_VERSION},
        "checked_at": {"type": ["string", "null"], "maxLength": 64},
        "base_url": {"type": ["string", "null"], "maxLength": 400},
        "served_model_name": {"type": ["string", "null"], "maxLength": 400},
        # Empty when the caller named none: the folder names the config then.
        "config": {"type": "string", "maxLength": 200},
        "passed": {"type": ["boolean", "null"]},
        "checks": {
            "type": "array",
            "maxItems": 32,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "pattern": "^[a-z0-9_]{1,64}$"},
                    "passed": {"type": ["boolean", "null"]},
                    "found": _CHECK_TEXT,
                    "expected": _CHECK_TEXT,
                    "fix": _CHECK_TEXT,
                    "ms": {"type": ["number", "null"], "minimum": 0},
                },
                "required": ["name", "passed"],
            },
        },
    },
    "required": ["kind", "schema_version", "checks"],
}
# status.json as roles/benchmark/tasks/config.yml writes it (status itself is checked in load).
STATUS_SCHEMA = {
    "type": "object",
    "properties": {
        "config": {"type": "string", "minLength": 1},
        "error": {"type": ["string", "null"]},
    },
}


SIDE_FIX = "restore it, or move it out of the results to analyse without it"


@functools.cache
def side_validator(name: str):
    from jsonschema import Draft202012Validator

    schema = {
        "run": RUN_SCHEMA,
        "lossless": LOSSLESS_SCHEMA,
        "status": STATUS_SCHEMA,
        "api_check": API_CHECK_SCHEMA,
    }[name]
    return Draft202012Validator(schema)


def read_small(
    path: Path, rel: str, kind: str, limit: int = DEFAULT_MAX_FILE_BYTES
) -> tuple[dict | None, list[str]]:
    """A run.json, lossless.json, status.json or api-check.json: (its object, []) or (None,
    problems)."""
    data, problem = read_regular(path, rel, limit)
    if data is None:
        return None, [problem]
    try:
        value = _parse(data)
    except UnicodeDecodeError:
        return None, [f"{rel}: (file): not UTF-8 text"]
    except json.JSONDecodeError as error:
        return None, [f"{rel}: (top level): {_syntax(error, SIDE_FIX)}"]
    except (ValueError, RecursionError) as error:
        return None, [f"{rel}: (top level): not valid JSON: {_unparsed(error)}"]
    if not isinstance(value, dict):
        return None, [f"{rel}: (top level): expected a JSON object"]
    numbers = number_problems(value, rel)
    if any(line.endswith(" deep") for line in numbers):
        return None, numbers
    problems = _merged(numbers, schema_problems(side_validator(kind), value, rel))
    return (None, problems) if problems else (value, [])


# -- the whole tree --------------------------------------------------------------------


def _config_dir(root: Path, file: Path, config: str) -> Path | None:
    """The folder named after the config, at most two levels above the file, inside root."""
    for folder in [file.parent, *file.parent.parents][:2]:
        if folder.name == config and (folder == root or root in folder.parents):
            return folder
    return None


def _host_of(root: Path, config_dir: Path | None) -> str | None:
    """The folder holding the config's folder, when that is inside root (root a run's or a
    parent folder); None when root is a host's own folder or the layout has no host level."""
    if config_dir is not None and config_dir != root and config_dir.parent != root:
        return config_dir.parent.name if root in config_dir.parent.parents else None
    return None


def load(
    root: Path | str,
    strict: bool = False,
    workers: int | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> Results:
    """Read and validate every result file under root; ResultsError lists every problem.
    Only regular files (or links to one) of at most max_file_bytes each are read."""
    root = Path(root)
    if not root.is_dir():
        raise ResultsError([f"{root}: not a folder of benchmark results"])
    found = discover(root)
    if not found["level"]:
        raise ResultsError(
            [
                f"{root}: no level files (c<N>.json, r<R>.json) found: point at a run's folder, "
                "results/<run_id>, as benchmark_kimi.yml lands it"
            ],
            root,
        )
    tasks = [(str(p), str(p.relative_to(root)), strict, max_file_bytes) for p in found["level"]]
    level_validator()  # compiled once, here, for the worker processes to inherit
    outcomes = _read_all(tasks, workers)
    problems: list[str] = []
    levels: list[Level] = []
    versions: list[tuple[str, int]] = []
    total = 0
    for (path, rel, *_options), (reduced, issues, size) in zip(tasks, outcomes, strict=True):
        total += size
        problems += issues
        if reduced is None:
            continue
        versions.append((rel, reduced["schema_version"]))
        if reduced.get("unsupported"):
            continue
        file = Path(path)
        config_dir = _config_dir(root, file, reduced["config"])
        prompt_set = reduced["prompt_set"]
        host = (
            _host_of(root, config_dir) or reduced["provenance"].get("host") or root.resolve().name
        )
        levels.append(
            Level(
                path=rel,
                host=host,
                config=reduced["config"],
                prompt_set=prompt_set,
                concurrency=reduced["concurrency"],
                schema_version=reduced["schema_version"],
                run_id=reduced["run_id"],
                summary=reduced["summary"],
                client=reduced["client"],
                crashed=reduced["crashed"],
                settings=reduced["settings"],
                provenance=reduced["provenance"],
                accept=reduced["accept"],
                accept_tokens=reduced["accept_tokens"],
                context_tokens_mean=reduced["context_tokens_mean"],
                context_skipped=reduced["context_skipped"],
                records=reduced["records"],
                ttft=reduced["ttft"],
                tpot=reduced["tpot"],
                e2e=reduced["e2e"],
                request_rate=reduced["request_rate"],
                arrival=reduced["arrival"],
                repeat=reduced["repeat"],
                repeats=reduced["repeats"],
                fill=reduced["fill"],
                workload=reduced["workload"],
            )
        )
    problems += _schema_problems(versions)
    seen: dict[tuple, str] = {}
    for level in levels:
        key = (
            level.host,
            level.config,
            level.prompt_set,
            level.concurrency,
            level.request_rate,
            level.repeat,
        )
        if key in seen:
            rate = f", request rate {level.request_rate:g}" if level.request_rate else ""
            again = f", repeat {level.repeat}" if level.repeat > 1 else ""
            problems.append(
                f"{level.path}: concurrency: a second level file for host {key[0]}, config "
                f"{key[1]}, prompt set {key[2]}, concurrency {key[3]}{rate}{again} (the first "
                f"is {seen[key]}): point at one run's folder, or use `compare` for two runs"
            )
        else:
            seen[key] = level.path

    lossless: dict[str, dict] = {}
    for path in found["lossless"]:
        rel = str(path.relative_to(root))
        report, issues = read_small(path, rel, "lossless", max_file_bytes)
        problems += issues
        if not issues:
            # Beside the config folders: its folder is the host's.
            host = path.parent.name if path.parent != root else _root_host(root, levels)
            lossless[host] = report
    status: dict[tuple[str, str], dict] = {}
    for path in found["status"]:
        rel = str(path.relative_to(root))
        record, issues = read_small(path, rel, "status", max_file_bytes)
        if issues:
            problems += issues
            continue
        config = record.get("config") if isinstance(record.get("config"), str) else None
        config = config or path.parent.name
        if record.get("status") not in ("ok", "failed"):
            problems.append(
                f"{rel}: status: expected 'ok' or 'failed', found {_show(record.get('status'))}"
            )
            continue
        status[(_host_of(root, path.parent) or _root_host(root, levels), config)] = record
    api_checks: dict[tuple[str, str], dict] = {}
    for path in found["api_check"]:
        rel = str(path.relative_to(root))
        record, issues = read_small(path, rel, "api_check", min(max_file_bytes, API_CHECK_BYTES))
        if issues:
            problems += issues
            continue
        config = record.get("config") or path.parent.name
        api_checks[(_host_of(root, path.parent) or _root_host(root, levels), config)] = record
    # A run.json that cannot be read is an error, not a file to pass over: it names the
    # reference config and the plan the incomplete_run warnings check, and a report made
    # without it would silently measure against ar and call an interrupted run complete.
    run: dict = {}
    run_dir: Path | None = None
    for path in found["run"]:
        record, issues = read_small(path, str(path.relative_to(root)), "run", max_file_bytes)
        problems += issues
        if record is not None and (path.parent == root or run_dir is None):
            run, run_dir = record, path.parent.relative_to(root)
    if problems:
        raise ResultsError(problems, root)
    levels.sort(
        key=lambda lv: (
            lv.host,
            lv.prompt_set,
            config_order(lv.config),
            lv.request_rate is not None,
            lv.request_rate or 0.0,
            lv.concurrency,
            lv.repeat,
        )
    )
    return Results(
        root=root,
        levels=levels,
        lossless=lossless,
        status=status,
        run=run,
        api_checks=api_checks,
        files=len(tasks),
        bytes_read=total,
        run_dir=run_dir,
    )


MAX_LISTED = 6


def incomplete(results: Results) -> list[tuple[str, str]]:
    """(where, message) per sign that the run did not finish: run.json without ended_at (it
    is written at the end), and per host folder the configs and levels run.json plans that
    left no file. A config whose status.json says failed is left out (its own error says
    why), and so is a host without a folder (the other nodes of a multi-node server write
    nothing)."""
    run, run_dir = results.run, results.run_dir
    if run_dir is None:
        return []
    found: list[tuple[str, str]] = []
    if "ended_at" not in run:
        found.append(
            (
                "run",
                f"{run_dir / 'run.json'} has no ended_at: the run was interrupted (or is still "
                "running); the configs and levels it did not reach are missing from this report",
            )
        )
    plan = {k: list(dict.fromkeys(run.get(k) or [])) for k in ("hosts", "configs", "prompt_sets")}
    # Every file the plan asks for: each concurrency level and request rate (named as the
    # module names its files, c16 and r2.5), each repeat.
    names = [f"c{c}" for c in dict.fromkeys(run.get("concurrency") or [])]
    names += [f"r{float(r):g}" for r in dict.fromkeys(run.get("request_rates") or [])]
    repeats = run.get("repeats") or 1
    levels = [(name, k) for name in dict.fromkeys(names) for k in range(1, repeats + 1)]
    base = results.root / run_dir
    inside = len(run_dir.parts)
    mine = [lv for lv in results.levels if Path(lv.path).parts[:inside] == run_dir.parts]
    have = {(lv.host, lv.config, lv.prompt_set, (lv.name, lv.repeat)) for lv in mine}
    for host in plan["hosts"]:
        if not (base / host).is_dir():
            continue
        for config in plan["configs"]:
            status = results.status.get((host, config), {})
            if status.get("status") == "failed":
                continue
            present = sum((host, config, s, c) in have for s in plan["prompt_sets"] for c in levels)
            if not present and not status:
                found.append(
                    (
                        f"{host} / {config}",
                        f"run.json plans config {config}, but {host} has no level file and no "
                        "status.json for it: the run was interrupted before it, or its files "
                        "were lost",
                    )
                )
                continue
            missing = len(plan["prompt_sets"]) * len(levels) - present
            if missing <= 0:
                continue
            # The first few only: iterating stops there, however long the plan.
            shown = list(
                itertools.islice(
                    (
                        (s, c)
                        for s in plan["prompt_sets"]
                        for c in levels
                        if (host, config, s, c) not in have
                    ),
                    MAX_LISTED,
                )
            )
            places = ", ".join(
                f"{s} {name}" + (f" repeat {k}" if k > 1 else "") for s, (name, k) in shown
            )
            name, k = shown[0][1]
            first = (
                run_dir
                / host
                / config
                / shown[0][0]
                / (f"{name}.json" if k == 1 else f"{name}.rep{k}.json")
            )
            more = f" and {missing - len(shown)} more" if missing > len(shown) else ""
            found.append(
                (
                    f"{host} / {config}",
                    f"run.json plans {places}{more} for {config}, but no level file holds "
                    f"{'it' if missing == 1 else 'them'} ({first}"
                    f"{'' if missing == 1 else ' and the others'}): the run was interrupted, "
                    "or the file was lost",
                )
            )
    return found


def _root_host(root: Path, levels: list[Level]) -> str:
    hosts = {lv.host for lv in levels}
    return next(iter(hosts)) if len(hosts) == 1 else root.resolve().name


def _schema_problems(versions: list[tuple[str, int]]) -> list[str]:
    """Files of more than one schema version, and versions this analysis does not read."""
    by_version: dict[int, list[str]] = {}
    for path, version in versions:
        by_version.setdefault(version, []).append(path)
    problems = []
    if len(by_version) > 1:
        # The most common version is the norm; every other file is named.
        norm = max(by_version, key=lambda v: len(by_version[v]))
        example = by_version[norm][0]
        others = len(by_version[norm]) - 1
        for version, paths in sorted(by_version.items()):
            if version == norm:
                continue
            for path in paths:
                problems.append(
                    f"{path}: schema_version: {version}, while {example} (and {others} other "
                    f"files) have {norm}: results written by different kit versions cannot be "
                    "mixed in one report; analyse each run on its own, or use `compare`"
                )
    for version, paths in sorted(by_version.items()):
        if version not in SUPPORTED_SCHEMAS:
            problems.append(
                f"{paths[0]}: schema_version: {version} is not one this analysis reads "
                f"({', '.join(map(str, SUPPORTED_SCHEMAS))}); update the kit"
                + (f" ({len(paths) - 1} more files like it)" if len(paths) > 1 else "")
            )
    return problems


def _read_one(task: tuple) -> tuple:
    return read_level(*task)


def _read_all(tasks: list[tuple], workers: int | None) -> list[tuple]:
    workers = workers if workers is not None else (os.cpu_count() or 1)
    size = sum(_size(t[0]) for t in tasks)
    if workers <= 1 or len(tasks) < 4 or size < PARALLEL_BYTES:
        return [_read_one(task) for task in tasks]
    chunk = max(1, len(tasks) // (workers * 8))
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks))) as pool:
        return list(pool.map(_read_one, tasks, chunksize=chunk))


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


# -- names -----------------------------------------------------------------------------

# Expanded serving config names are the writer's (module_utils/contract/names.py): <config>,
# <config>-tp<N>, <config>-b<B>, <config>-tp<N>-b<B>. The analysis reads them leniently
# (parse_config_name here is contract.names.read_config_name): a name it cannot read, or with
# a TP size or budget the kit cannot render, stays whole. CHAIN_CONTROL, base_config and
# config_order come from there too.

# Flag values read from a launch argv are counts of tokens: anything past this is not one.
MAX_COUNT = 1_000_000


def _tp(text: str | None) -> int | None:
    value = _count(text)
    return value if value is not None and value <= MAX_TP else None


def tp_size(config: str, provenance: dict | None = None) -> int | None:
    """The tensor-parallel size a level was served at: the launch argv's --tp-size (or its
    aliases), else the config name's -tp<N>, else None (unknown)."""
    argv = _argv(provenance)
    for flag in TP_FLAGS:
        value = _tp(flag_value(argv, flag))
        if value is not None:
            return value
    return parse_config_name(config)[1]


def _count(text: str | None) -> int | None:
    # isdecimal, not isdigit: int() refuses "²", a digit to isdigit.
    if text is None or not text.isdecimal() or len(text) > 7:
        return None
    value = int(text)
    return value if 0 < value <= MAX_COUNT else None


def _argv(provenance: dict | None):
    launch = (provenance or {}).get("launch") or {}
    return launch.get("argv") if isinstance(launch, dict) else None


def ddtree_budget(config: str, provenance: dict | None = None) -> int | None:
    """The DDTree node budget: the launch record's, else the argv's
    --speculative-ddtree-budget under --speculative-algorithm DDTREE, else the name's
    (ddtree-b<N>, ddtree-tp<T>-b<N>)."""
    launch = (provenance or {}).get("launch") or {}
    if isinstance(launch.get("budget"), int) and not isinstance(launch.get("budget"), bool):
        return launch["budget"]
    argv = _argv(provenance)
    if (flag_value(argv, "--speculative-algorithm") or "").upper() == "DDTREE":
        budget = _count(flag_value(argv, "--speculative-ddtree-budget"))
        if budget is not None:
            return budget
    return parse_config_name(config)[2]


def verify_tokens_per_step(config: str, provenance: dict | None = None) -> int | None:
    """Tokens the target verifies per step: budget + 1 for DDTree (the pull request sizes its
    verify CUDA graphs so), the draft token count for a chain (--speculative-num-draft-tokens,
    else the DFlash block size), 1 without speculation; None when the launch argv does not
    say."""
    budget = ddtree_budget(config, provenance)
    if budget is not None:
        return budget + 1
    argv = _argv(provenance)
    if not isinstance(argv, list) or not argv:
        return None
    algorithm = flag_value(argv, "--speculative-algorithm")
    if algorithm is None or algorithm.upper() == "NONE":
        return 1
    # A DDTREE launch without a budget defaults to draft tokens - 1 nodes: draft tokens verified.
    return _count(flag_value(argv, "--speculative-num-draft-tokens")) or _count(
        flag_value(argv, "--speculative-dflash-block-size")
    )


def run_model(run: dict) -> dict | None:
    """run.json's model ({name, title, attention, target: {repo_id, revision}}), each field a
    string or None; None when the run does not record it (a run from before models were
    data: its model is unknown). load() has checked the types against RUN_SCHEMA."""
    model = run.get("model") if isinstance(run, dict) else None
    if not isinstance(model, dict):
        return None
    target = model.get("target") if isinstance(model.get("target"), dict) else {}

    def text(value) -> str | None:
        return value if isinstance(value, str) and value else None

    return {
        "name": text(model.get("name")),
        "title": text(model.get("title")),
        "attention": text(model.get("attention")),
        "target": {
            "repo_id": text(target.get("repo_id")),
            "revision": text(target.get("revision")),
        },
    }


def model_title(model: dict | None) -> str:
    """How a report names the model: its title, else its name, else its repository, else
    "model unknown"."""
    if not model:
        return "model unknown"
    return (
        model.get("title")
        or model.get("name")
        or (model.get("target") or {}).get("repo_id")
        or "model unknown"
    )


def accuracy_floors(run: dict) -> dict[str, dict]:
    """run.json's model.accuracy_floors: {prompt set: {floor, source}}, the accuracy the
    reference config must reach on each scored set; {} when the run records none (a run from
    before answers were scored, or a model without floors). load() has checked the types."""
    model = run.get("model") if isinstance(run, dict) else None
    floors = model.get("accuracy_floors") if isinstance(model, dict) else None
    if not isinstance(floors, dict):
        return {}
    return {
        name: {"floor": float(entry["floor"]), "source": str(entry.get("source") or "")}
        for name, entry in floors.items()
        if isinstance(entry, dict) and _number(entry.get("floor"))
    }
