"""The level schema's settings and provenance ($defs settings, provenance, weights_entry)."""

from __future__ import annotations

# When a level ran: the level file's own fields and its provenance's.
STARTED_AT = {
    "type": "string",
    "description": (
        "When the level started: an ISO 8601 date and time in UTC with "
        "milliseconds, as datetime.isoformat(timespec='milliseconds') writes it."
    ),
    "format": "date-time",
}
ENDED_AT = {
    "type": "string",
    "description": (
        "When the level ended: an ISO 8601 date and time in UTC with milliseconds, "
        "as datetime.isoformat(timespec='milliseconds') writes it."
    ),
    "format": "date-time",
}

SETTINGS = {
    "type": "object",
    "description": "The module's arguments that shape every level of the run.",
    "properties": {
        "num_prompts": {
            "type": "integer",
            "minimum": 1,
            "description": "Fewest requests a level wants.",
        },
        "max_new_tokens": {
            "type": "integer",
            "minimum": 1,
            "description": "Most tokens generated per request (a workload's osl).",
        },
        "temperature": {
            "type": "number",
            "description": "Sampling temperature; 0 is greedy.",
            "minimum": 0,
        },
        "warmup_requests": {
            "type": "integer",
            "minimum": 0,
            "description": "Requests sent once before the first level, not measured.",
        },
        "request_timeout_s": {
            "type": "number",
            "exclusiveMinimum": 0,
            "description": "Seconds one request may take.",
        },
        "base_url": {
            "type": "string",
            "description": "The server as the client saw it, without user:password@.",
        },
        "requests_per_concurrency": {
            "type": "integer",
            "minimum": 1,
            "description": "A closed-loop level wants this x concurrency requests.",
        },
        "rate_duration_s": {
            "type": "number",
            "exclusiveMinimum": 0,
            "description": "A rate level wants ceil(request_rate x this) requests.",
        },
        "max_concurrency": {
            "type": "integer",
            "minimum": 0,
            "description": "Cap on requests in flight at rate levels; 0 for none.",
        },
        "level_time_budget_s": {
            "type": "number",
            "exclusiveMinimum": 0,
            "description": "Seconds after a level's start past which no request starts.",
        },
        "telemetry": {
            "enum": [
                "auto",
                "nvidia-smi",
                "off",
            ],
            "description": "GPU telemetry asked for.",
        },
        "telemetry_interval_ms": {
            "type": "integer",
            "minimum": 20,
            "maximum": 60000,
            "description": "Milliseconds between GPU samples.",
        },
    },
    "required": [
        "num_prompts",
        "max_new_tokens",
        "temperature",
        "warmup_requests",
        "request_timeout_s",
        "base_url",
    ],
    "additionalProperties": False,
}

PROVENANCE = {
    "type": "object",
    "description": (
        "Where the figures come from. The caller's provenance.json (beside the results or "
        "in the folder above; the benchmark role writes kit_version, run_id, host, config, "
        "gpu and prompt_sets) is copied in whole except its `records`, which names the host "
        "records read into it (runtime and launch by default; a caller may name more, each "
        "stored under its name). So this object is open; the fields listed are typed."
    ),
    "properties": {
        "kit_version": {
            "type": "string",
            "description": "The kit's version (benchmark role).",
        },
        "run_id": {
            "type": "string",
            "description": "The run's id (benchmark role).",
        },
        "host": {
            "type": "string",
            "description": "The inventory host name (benchmark role).",
        },
        "config": {
            "type": "string",
            "description": "The serving config (benchmark role).",
        },
        "gpu": {
            "type": [
                "object",
                "null",
            ],
            "description": "The gpu_facts module's facts (benchmark role); null when not gathered.",
        },
        "prompt_sets": {
            "type": "object",
            "description": (
                "benchmark_prompts' record of each prompt set by name (source, commit, file "
                "and chat-template sha256) (benchmark role)."
            ),
        },
        "runtime": {
            "type": [
                "object",
                "null",
            ],
            "description": (
                "The runtime stage's record (runtime.json) as read when the level ran; null "
                "when absent or unreadable."
            ),
        },
        "launch": {
            "type": [
                "object",
                "null",
            ],
            "description": (
                "The server stage's launch record (launch.json: config, base, budget, "
                "runtime, argv, environment with secrets masked, ...) as read when the "
                "level ran; null when absent or unreadable."
            ),
            "properties": {
                "argv": {
                    "type": "array",
                    "items": {
                        "type": "string",
                    },
                },
                "budget": {
                    "type": [
                        "integer",
                        "null",
                    ],
                },
            },
        },
        "weights": {
            "type": "array",
            "items": {
                "$ref": "#/$defs/weights_entry",
            },
            "description": "One entry per model folder in the launch argv.",
        },
        "server_info": {
            "type": "object",
            "description": (
                "/server_info at the start, every field whose name says key, token, secret "
                "or password masked, and the API key wherever it occurs."
            ),
        },
        "sglang_version": {
            "type": [
                "string",
                "null",
            ],
            "description": "/server_info's version.",
        },
        "prompts": {
            "type": "object",
            "description": "The prompts file the levels sent.",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "The file on the host.",
                },
                "name": {
                    "type": "string",
                    "description": "Its name without extension: the prompt set.",
                },
                "sha256": {
                    "type": "string",
                    "description": "sha256 (hex) of the file.",
                    "pattern": "^[0-9a-f]{64}$",
                },
                "requests_per_level": {
                    "type": "integer",
                    "minimum": 1,
                    "description": (
                        "Requests the level was to send: min(fill.wanted, "
                        "fill.unique_prompts) (num_prompts in files older than fill)."
                    ),
                },
                "distinct_prompts": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Distinct prompts among them.",
                },
            },
            "required": [
                "path",
                "name",
                "sha256",
                "requests_per_level",
                "distinct_prompts",
            ],
            "additionalProperties": False,
        },
        "started_at": STARTED_AT,
        "ended_at": ENDED_AT,
    },
    "required": [
        "runtime",
        "launch",
        "weights",
        "server_info",
        "sglang_version",
        "prompts",
        "started_at",
        "ended_at",
    ],
}

WEIGHTS_ENTRY = {
    "type": "object",
    "description": (
        "The weights manifest (kimi-manifest.json) of a model folder in the launch argv."
    ),
    "properties": {
        "role": {
            "enum": [
                "target",
                "drafter",
            ],
            "description": "--model-path (target) or --speculative-draft-model-path.",
        },
        "path": {
            "type": "string",
            "description": "The model folder from the argv.",
        },
        "manifest": {
            "type": [
                "string",
                "null",
            ],
            "description": (
                "Path of kimi-manifest.json; null when it could not be read (the fields "
                "below are then absent)."
            ),
        },
        "manifest_sha256": {
            "type": "string",
            "description": "sha256 (hex) of the manifest file.",
            "pattern": "^[0-9a-f]{64}$",
        },
        "repo_id": {
            "type": [
                "string",
                "null",
            ],
            "description": "The manifest's repo_id.",
        },
        "revision": {
            "type": [
                "string",
                "null",
            ],
            "description": "The manifest's revision (commit).",
        },
        "verify_mode": {
            "type": [
                "string",
                "null",
            ],
            "description": "The manifest's verify_mode.",
        },
        "verified_at": {
            "type": [
                "string",
                "null",
            ],
            "description": "The manifest's verified_at.",
        },
        "files": {
            "type": "integer",
            "minimum": 0,
            "description": "Files the manifest lists.",
        },
    },
    "required": [
        "role",
        "path",
        "manifest",
    ],
    "additionalProperties": False,
    "if": {
        "properties": {
            "manifest": {
                "type": "string",
            },
        },
    },
    "then": {
        "required": [
            "manifest_sha256",
            "repo_id",
            "revision",
            "verify_mode",
            "verified_at",
            "files",
        ],
    },
    "else": {
        "maxProperties": 3,
    },
}
