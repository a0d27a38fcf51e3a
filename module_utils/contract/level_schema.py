"""The level file's schema as data: schema() is docs/schema/level.schema.json (`make schema`
writes it; tests/unit/test_metric_registry.py fails when the committed file differs). The
summary's properties come from the metric registry (module_utils/contract/metrics.py); the
other $defs are literals, one file per part."""

from __future__ import annotations

import copy
import json

from ansible.module_utils.contract import metrics
from ansible.module_utils.contract.level import LEVEL_KIND, SCHEMA_VERSION
from ansible.module_utils.contract.level_schema_fleet import FLEET
from ansible.module_utils.contract.level_schema_provenance import (
    ENDED_AT,
    PROVENANCE,
    SETTINGS,
    STARTED_AT,
    WEIGHTS_ENTRY,
)
from ansible.module_utils.contract.level_schema_records import (
    CLIENT,
    METRICS,
    SERVER,
    SERVER_STATE,
    STARTUP_TIME,
)
from ansible.module_utils.contract.level_schema_request import REQUEST

SUMMARY_DESCRIPTION = (
    "The level's figures, from the records with ok true (module_utils/benchmark/stats.py "
    "summarize_level)."
)


def schema() -> dict:
    """The level schema (JSON Schema draft 2020-12), a fresh copy each call."""
    document = copy.deepcopy(HEAD)
    document["$defs"] = copy.deepcopy(
        {
            "settings": SETTINGS,
            "summary": summary(),
            "stat": STAT,
            "server": SERVER,
            "server_state": SERVER_STATE,
            "metrics": METRICS,
            "startup_time": STARTUP_TIME,
            "client": CLIENT,
            "provenance": PROVENANCE,
            "weights_entry": WEIGHTS_ENTRY,
            "request": REQUEST,
            "fleet": FLEET,
        }
    )
    return document


def summary() -> dict:
    """$defs.summary: one property per field of the registry's SUMMARY, in its order."""
    return {
        "type": "object",
        "description": SUMMARY_DESCRIPTION,
        "properties": metrics.schema_properties(),
        "required": [f.name for f in metrics.SUMMARY if f.required],
        "additionalProperties": False,
    }


def schema_json() -> str:
    """schema() as docs/schema/level.schema.json holds it."""
    return json.dumps(schema(), indent=2, ensure_ascii=False) + "\n"


# Everything but $defs, in the file's order.
HEAD = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "c<N>.json or r<R>.json: one level of sglang_benchmark",
    "description": (
        "The level file module_utils/benchmark/level.py writes (json, indent 1, `requests` "
        "last), one per level (c<N>.json closed loop, r<R>.json request rate; "
        "c<N>.rep<k>.json and r<R>.rep<k>.json repeat k >= 2 of it), config and prompt set "
        "or workload. Times are in milliseconds (fields ending in _ms) or seconds (_s); "
        "token counts are tokens as the server counts them. A change to any field (removed, "
        "renamed, retyped, made required) needs a new schema_version here and in "
        "module_utils/benchmark/stats.py SCHEMA_VERSION; an optional field may be added "
        "within a version (summary.accuracy and a request's score came so, for scored "
        "prompt sets; request_rate, arrival, repeat, repeats, fill, workload and "
        "summary.gpu for request rates, repeats, workloads and GPU telemetry)."
    ),
    "type": "object",
    "properties": {
        "schema_version": {
            "const": SCHEMA_VERSION,
            "description": "Version of this contract.",
        },
        "kind": {
            "const": LEVEL_KIND,
            "description": "What the file is.",
        },
        "run_label": {
            "type": "string",
            "description": "The run's label (the benchmark role passes its run id); may be empty.",
        },
        "config": {
            "type": "string",
            "description": "The serving config benchmarked (ar, dflash, ddtree-b32, ...).",
            "minLength": 1,
        },
        "prompt_set": {
            "type": "string",
            "description": "The prompt set: the prompts file's name without extension.",
        },
        "concurrency": {
            "type": "integer",
            "minimum": 1,
            "description": (
                "Closed loop (arrival closed or absent): requests kept in flight, the file "
                "is c<concurrency>.json. Request rate: the cap on requests in flight (the "
                "module's max_concurrency; without a cap, the level's request count)."
            ),
        },
        "request_rate": {
            "type": [
                "number",
                "null",
            ],
            "exclusiveMinimum": 0,
            "maximum": 100000,
            "description": (
                "Requests per second of a request-rate level (Poisson arrivals; the file is "
                "r<request_rate>.json); null for a closed-loop level."
            ),
        },
        "arrival": {
            "enum": [
                "closed",
                "poisson",
            ],
            "description": (
                "closed: a closed loop of `concurrency` requests in flight; poisson: "
                "arrivals at request_rate per second with exponential gaps, at most "
                "`concurrency` in flight. Absent in files older than request rates: closed."
            ),
        },
        "repeat": {
            "type": "integer",
            "minimum": 1,
            "maximum": 100,
            "description": (
                "Which run of the level this is (1: c<N>.json, k >= 2: c<N>.rep<k>.json); "
                "at most repeats."
            ),
        },
        "repeats": {
            "type": "integer",
            "minimum": 1,
            "maximum": 100,
            "description": "How many runs of each level were asked for.",
        },
        "fill": {
            "type": "object",
            "description": (
                "How many requests the level wanted, had and sent. A level never sends a "
                "prompt twice: it sends the first min(wanted, unique_prompts) distinct "
                "prompts of the file, in file order, and none once its time budget has "
                "passed."
            ),
            "properties": {
                "wanted": {
                    "type": "integer",
                    "minimum": 1,
                    "description": (
                        "Requests the level wanted: requests_per_concurrency x concurrency "
                        "(closed loop) or ceil(request_rate x rate_duration_s) (request "
                        "rate), at least num_prompts."
                    ),
                },
                "unique_prompts": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Distinct prompts the prompts file holds.",
                },
                "sent": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Requests started (the records of the level).",
                },
                "under_filled": {
                    "type": "boolean",
                    "description": (
                        "unique_prompts < wanted: the whole set was sent and the level is "
                        "smaller than asked; its throughput understates a full level."
                    ),
                },
                "stopped_by_time_budget": {
                    "type": "boolean",
                    "description": (
                        "No request started after time_budget_s, so fewer than min(wanted, "
                        "unique_prompts) were sent."
                    ),
                },
                "time_budget_s": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "description": "Seconds after the level's start past which no request started.",
                },
            },
            "required": [
                "wanted",
                "unique_prompts",
                "sent",
                "under_filled",
                "stopped_by_time_budget",
                "time_budget_s",
            ],
            "additionalProperties": False,
        },
        "workload": {
            "type": "object",
            "description": (
                "Present only for a synthetic fixed-length workload (benchmark_prompts' "
                "workloads, module_utils/benchmark/workloads.py): every request sends isl "
                "token ids and asks for exactly osl tokens with ignore_eos."
            ),
            "properties": {
                "name": {
                    "type": "string",
                    "pattern": "^isl[1-9][0-9]*-osl[1-9][0-9]*$",
                    "maxLength": 32,
                    "description": "isl<N>-osl<M>.",
                },
                "isl": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 1048576,
                    "description": "Input tokens of every prompt.",
                },
                "osl": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 131072,
                    "description": "Output tokens every request asks for.",
                },
                "ignore_eos": {
                    "const": True,
                    "description": "EOS does not end a request early.",
                },
                "tokenizer": {
                    "type": "object",
                    "description": "The model folder's tokenizer file the ids were drawn from.",
                    "properties": {
                        "file": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 255,
                            "pattern": "^[^/]+$",
                            "description": "Its name (tiktoken.model or tokenizer.json).",
                        },
                        "sha256": {
                            "type": "string",
                            "pattern": "^[0-9a-f]{64}$",
                            "description": "sha256 (hex) of the file.",
                        },
                        "revision": {
                            "type": [
                                "string",
                                "null",
                            ],
                            "pattern": "^[0-9a-f]{40}$",
                            "description": "The commit of the weights' manifest; null without one.",
                        },
                    },
                    "required": [
                        "file",
                        "sha256",
                        "revision",
                    ],
                    "additionalProperties": False,
                },
                "seed": {
                    "type": "integer",
                    "minimum": 0,
                    "description": (
                        "Seed of the draws (from the workload's name: the same prompts everywhere)."
                    ),
                },
            },
            "required": [
                "name",
                "isl",
                "osl",
                "ignore_eos",
                "tokenizer",
                "seed",
            ],
            "additionalProperties": False,
        },
        "started_at": STARTED_AT,
        "ended_at": ENDED_AT,
        "settings": {
            "$ref": "#/$defs/settings",
        },
        "summary": {
            "$ref": "#/$defs/summary",
        },
        "server": {
            "$ref": "#/$defs/server",
        },
        "client": {
            "$ref": "#/$defs/client",
        },
        "provenance": {
            "$ref": "#/$defs/provenance",
        },
        "fleet": {
            "$ref": "#/$defs/fleet",
        },
        "requests": {
            "type": "array",
            "items": {
                "$ref": "#/$defs/request",
            },
            "description": "One record per request, in the order sent.",
        },
    },
    "required": [
        "schema_version",
        "kind",
        "run_label",
        "config",
        "prompt_set",
        "concurrency",
        "started_at",
        "ended_at",
        "settings",
        "summary",
        "server",
        "client",
        "provenance",
        "requests",
    ],
    "additionalProperties": False,
    "allOf": [
        {
            "if": {
                "properties": {
                    "arrival": {
                        "const": "poisson",
                    },
                },
                "required": [
                    "arrival",
                ],
            },
            "then": {
                "properties": {
                    "request_rate": {
                        "type": "number",
                    },
                },
                "required": [
                    "request_rate",
                ],
            },
            "else": {
                "properties": {
                    "request_rate": {
                        "type": "null",
                    },
                },
            },
        },
    ],
}
# A distribution of one summary field (ttft_ms, itl_ms, tpot_ms, e2e_ms): metrics.PERCENTILES
# and the mean, max and count.
STAT = {
    "type": "object",
    "description": (
        "A distribution: mean, p50, p90 and p99 (linear interpolation between closest "
        "ranks, numpy's default), max and count, rounded to 4 decimals. Every value but "
        "count is null when count is 0. The unit is the field's (milliseconds for every "
        "*_ms)."
    ),
    "properties": {
        "mean": {
            "type": [
                "number",
                "null",
            ],
            "description": "Mean.",
        },
        "p50": {
            "type": [
                "number",
                "null",
            ],
            "description": "Median.",
        },
        "p90": {
            "type": [
                "number",
                "null",
            ],
            "description": "90th percentile.",
        },
        "p99": {
            "type": [
                "number",
                "null",
            ],
            "description": "99th percentile.",
        },
        "max": {
            "type": [
                "number",
                "null",
            ],
            "description": "Largest value.",
        },
        "count": {
            "type": "integer",
            "minimum": 0,
            "description": "Number of values.",
        },
    },
    "required": [
        "mean",
        "p50",
        "p90",
        "p99",
        "max",
        "count",
    ],
    "additionalProperties": False,
}
