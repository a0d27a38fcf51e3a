"""run.json's schema as data: the record roles/benchmark/tasks/main.yml writes at the run's
start and again, with how it ended, at its end (to_nice_json, sorted keys). `make schema`
writes it to docs/schema/run.schema.json. analysis/results_side.py RUN_SCHEMA is the subset the
report reads, with the same bounds; its model is MODEL itself."""

from __future__ import annotations

import json

_NAMES = {"type": "array", "items": {"type": "string", "minLength": 1}}
_SHORT = {"type": "string", "maxLength": 200}
_PINS = {"type": "object", "description": "The study lock's pins of that kind, as it holds them."}


def _field(kind, description: str, **bounds) -> dict:
    return {"type": kind, "description": description, **bounds}


MODEL = {
    "type": "object",
    "description": (
        "The model under test (roles/benchmark's benchmark_model, from models/<name>/model.yml); "
        "runs from before models were data have none."
    ),
    "properties": {
        "name": {**_SHORT, "description": "The model's folder name under models/."},
        "title": {**_SHORT, "description": "Its name in titles."},
        "attention": {**_SHORT, "description": "pure_attention or hybrid (recurrent layers)."},
        "target": {
            "type": "object",
            "description": "The target weights.",
            "properties": {"repo_id": _SHORT, "revision": _SHORT},
        },
        "accuracy_floors": {
            "type": "object",
            "description": (
                "Per prompt set the accuracy the reference config must reach, and where that "
                "floor comes from (model.yml accuracy.floors)."
            ),
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
}
LOCK = {
    "type": ["object", "null"],
    "description": (
        "The study lock the run used (playbooks/lock.yml), so that compare can tell reruns of "
        "other weights, prompts or runtimes apart; null when no lock play ran."
    ),
    "properties": {
        "file": {"type": ["string", "null"], "description": "The lock file's path."},
        "weights": _PINS,
        "datasets": _PINS,
        "git": _PINS,
        "runtime": {
            "type": "object",
            "description": (
                "Per runtime what decides its behaviour: built_from, python, platform, hashes, "
                "packages."
            ),
            "additionalProperties": {"type": "object"},
        },
    },
}
STATUS = {
    "type": "object",
    "description": (
        "Written at the run's end: per host, per serving config, how it ended (its status.json "
        "less the config's name)."
    ),
    "additionalProperties": {
        "type": "object",
        "additionalProperties": {
            "type": "object",
            "properties": {
                "status": {"enum": ["ok", "failed"]},
                "output_tokens_per_s": {"type": "object"},
                "error": {"type": "string"},
            },
            "required": ["status"],
        },
    },
}
PROPERTIES = {
    "run_id": _field("string", "The run's folder name under the results directory.", minLength=1),
    "kit_version": _field("string", "pyproject.toml's version, +<commit> in a git checkout."),
    "started_at": _field("string", "When the run started, ISO 8601 in UTC."),
    "ended_at": _field("string", "Written at the run's end: when it ended, ISO 8601 in UTC."),
    "hosts": {**_NAMES, "description": "Every host of the play."},
    "model": MODEL,
    "configs": {**_NAMES, "description": "The serving configs benchmarked, in order."},
    "reference_config": _field(
        "string", "The losslessness check's and the speedups' reference config.", minLength=1
    ),
    "prompt_sets": {**_NAMES, "description": "The prompt sets' names."},
    "concurrency": {
        "type": "array",
        "description": "The closed-loop levels (requests in flight).",
        "items": {"type": "integer", "minimum": 1},
    },
    "request_rates": {
        "type": "array",
        "description": "The request-rate levels, requests per second (Poisson arrivals).",
        "maxItems": 1000,
        "items": {"type": "number", "exclusiveMinimum": 0, "maximum": 1_000_000},
    },
    "max_concurrency": _field(
        "integer", "Most requests in flight at a rate level; 0 for no cap.", minimum=0
    ),
    "rate_duration_s": _field(
        "number", "Seconds of arrivals a rate level is sized for.", exclusiveMinimum=0
    ),
    "requests_per_concurrency": _field(
        "integer", "Requests a closed-loop level wants per request in flight.", minimum=1
    ),
    "level_time_budget_s": _field(
        "number", "Seconds after a level's start past which no request starts.", exclusiveMinimum=0
    ),
    "repeats": _field("integer", "Runs of each level.", minimum=1, maximum=100),
    "workloads": {
        "type": "array",
        "description": "Synthetic fixed-length workloads, isl<N>-osl<M>.",
        "items": {"type": "string", "pattern": "^isl[0-9]+-osl[0-9]+$"},
    },
    "telemetry": {
        "enum": ["auto", "nvidia-smi", "off"],
        "description": "GPU telemetry per level (benchmark_telemetry).",
    },
    "num_prompts": _field("integer", "Prompts per prompt set.", minimum=1),
    "max_new_tokens": _field("integer", "Output tokens a request may produce.", minimum=1),
    "temperature": _field("number", "Sampling temperature; 0 is greedy.", minimum=0),
    "lock": LOCK,
    "status": STATUS,
    "broken_verification": {
        "type": "object",
        "description": (
            "Written at the run's end: per host, the configs the losslessness check flagged."
        ),
        "additionalProperties": _NAMES,
    },
}
# Every run.json has these, from the first writer on (the later fields are optional: older
# runs lack them, and ended_at, status and broken_verification come only at the run's end).
REQUIRED = [
    "run_id",
    "kit_version",
    "started_at",
    "hosts",
    "configs",
    "reference_config",
    "prompt_sets",
    "concurrency",
    "num_prompts",
    "max_new_tokens",
    "temperature",
]


def schema() -> dict:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "run.json: one run of benchmark_kimi.yml",
        "description": (
            "The run record roles/benchmark/tasks/main.yml writes into the run's folder on the "
            "controller: the plan at the start, how each host's configs ended at the end."
        ),
        "type": "object",
        "properties": json.loads(json.dumps(PROPERTIES)),
        "required": list(REQUIRED),
    }


def schema_json() -> str:
    return json.dumps(schema(), indent=2, ensure_ascii=False) + "\n"
