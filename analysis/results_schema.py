"""The level file's contract as the reader holds it: docs/schema/level.schema.json (written by
`make schema` from module_utils/contract/level_schema.py), tightened where the analysis reads
more than the file says, compiled once, and its errors worded as 'file: field: what' lines."""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path

from ansible.module_utils.contract import level_schema, metrics
from ansible.module_utils.contract.level import SUPPORTED_SCHEMAS

from analysis.results_types import MAX_PROBLEMS
from analysis.results_values import field_path, show

# The contract, relative to the repository the analysis runs from.
LEVEL_SCHEMA = Path(__file__).resolve().parent.parent / "docs" / "schema" / "level.schema.json"


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


def _worded(error, rel: str) -> list[str]:
    where = field_path(error.absolute_path)
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
        return [f"{rel}: {where}: expected {_expected(schema)}, found {show(instance)}"]
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
        return show(schema["const"])
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
