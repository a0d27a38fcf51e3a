"""One level file (c<N>.json, r<R>.json): read, parsed (the fast way where it has the
writer's layout), checked against the contract and reduced to what the analysis uses."""

from __future__ import annotations

import json
import math
import re

from ansible.module_utils.contract.level import SUPPORTED_SCHEMAS

from analysis.results_read import (
    DEFAULT_MAX_FILE_BYTES,
    parse_json,
    read_regular,
    syntax_problem,
    unparsed_problem,
)
from analysis.results_reduce import MISSING, reduce_level
from analysis.results_schema import contract_problems
from analysis.results_values import finite, merged_problems, number_problems

# The module's writer (json.dump, indent=1): top-level keys sit one space in, request
# records two, their own keys three. JSON strings cannot hold a raw newline, so these byte
# patterns only ever match structure.
_REQUESTS_MARK = b'\n "requests": ['
_RECORD_FIELD = re.compile(
    rb'\n   "(index|ok|output_tokens|accept_length|ttft_ms|tpot_ms|e2e_ms|prompt_tokens)": '
    rb"([^\n]*)"
)


def read_level(
    path: str, rel: str, strict: bool = False, limit: int = DEFAULT_MAX_FILE_BYTES
) -> tuple[dict | None, list[str], int]:
    """(the level's reduced fields, problems, bytes read). Runs in worker processes."""
    data, problem = read_regular(path, rel, limit)
    if data is None:
        return None, [problem], 0
    parsed = None if strict else _fast(data)
    if parsed is None:
        parsed, problems = _full_parse(data, rel)
        if parsed is None:
            return None, problems, len(data)
    document, fields = parsed
    version = document.get("schema_version")
    if (
        isinstance(version, int)
        and not isinstance(version, bool)
        and version not in SUPPORTED_SCHEMAS
        and finite(version)
    ):
        # Named once for the whole tree by load(); its fields are another contract's.
        return {"schema_version": version, "unsupported": True}, [], len(data)
    numbers = number_problems(document, rel, requests=strict)
    if any(line.endswith(" deep") for line in numbers):
        return None, numbers, len(data)  # the schema's validator recurses as deep
    problems = merged_problems(numbers, contract_problems(document, rel, records=strict))
    if problems:
        return None, problems, len(data)
    level, problems = reduce_level(document, fields, rel)
    return level, problems, len(data)


def _full_parse(data: bytes, rel: str) -> tuple[tuple | None, list[str]]:
    """((document, per-request fields), []) from a parse of the whole file, or (None, problems):
    the path of every file the fast reader does not take, which also words what is wrong."""
    try:
        document = parse_json(data)
    except UnicodeDecodeError as error:
        return None, [f"{rel}: (file): not UTF-8 text ({error.reason} at byte {error.start})"]
    except json.JSONDecodeError as error:
        return None, [f"{rel}: {_where(error)}: {syntax_problem(error)}"]
    except (ValueError, RecursionError) as error:
        return None, [f"{rel}: (top level): not valid JSON: {unparsed_problem(error)}"]
    if not isinstance(document, dict):
        return None, [f"{rel}: (top level): expected a JSON object"]
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
                record.get("index", MISSING),
                record.get("ok", MISSING),
                record.get("output_tokens", MISSING),
                record.get("accept_length"),
                record.get("ttft_ms"),
                record.get("tpot_ms"),
                record.get("e2e_ms"),
                record.get("prompt_tokens"),
            )
        )
    return (None, problems) if problems else ((document, fields), [])


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
        document = parse_json(head[:-1] + b"\n}")
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
