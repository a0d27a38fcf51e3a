"""The files beside the levels: run.json, lossless.json, status.json and api-check.json, held
to the fields the analysis reads, and what run.json says of the model under test."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from ansible.module_utils.contract import run_schema
from ansible.module_utils.contract.level import (
    API_CHECK_KIND,
    API_CHECK_SCHEMA_VERSION,
    LOSSLESS_KIND,
)

from analysis.results_read import (
    DEFAULT_MAX_FILE_BYTES,
    parse_json,
    read_regular,
    syntax_problem,
    unparsed_problem,
)
from analysis.results_schema import schema_problems
from analysis.results_values import is_number, merged_problems, number_problems

_NAMES = {"type": "array", "items": {"type": "string", "minLength": 1}}
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
        # The model under test: the writer's own definition (runs before models were data
        # have none, and their model is unknown).
        "model": run_schema.MODEL,
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
        value = parse_json(data)
    except UnicodeDecodeError:
        return None, [f"{rel}: (file): not UTF-8 text"]
    except json.JSONDecodeError as error:
        return None, [f"{rel}: (top level): {syntax_problem(error, SIDE_FIX)}"]
    except (ValueError, RecursionError) as error:
        return None, [f"{rel}: (top level): not valid JSON: {unparsed_problem(error)}"]
    if not isinstance(value, dict):
        return None, [f"{rel}: (top level): expected a JSON object"]
    numbers = number_problems(value, rel)
    if any(line.endswith(" deep") for line in numbers):
        return None, numbers
    problems = merged_problems(numbers, schema_problems(side_validator(kind), value, rel))
    return (None, problems) if problems else (value, [])


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
        if isinstance(entry, dict) and is_number(entry.get("floor"))
    }
