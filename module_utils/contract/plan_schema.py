"""plan.json's schema as data: what roles/plan/templates/plan.json.j2 renders per host (the
plan as data; plan.md is rendered from it). `make schema` writes it to
docs/schema/plan.schema.json. The records other stages compute (capacity, the speed model's
predictions, the DDTree rules) are typed where the plan's readers use them and left open
beyond."""

from __future__ import annotations

import json

_NAME = {"type": "string", "minLength": 1}
_NAMES = {"type": "array", "items": _NAME}
_TEXT_OR_NULL = {"type": ["string", "null"]}
_COUNT_OR_NULL = {"type": ["integer", "null"], "minimum": 0}


def _object(description: str, properties: dict, required=(), **extra) -> dict:
    found = {"type": "object", "description": description, "properties": properties}
    return {**found, **({"required": list(required)} if required else {}), **extra}


REPO = _object(
    "One repository the host needs (target or a drafter), as the hub and the study lock say.",
    {
        "repo_id": _NAME,
        "revision": _NAME,
        "resolved_sha": _TEXT_OR_NULL,
        "gated": {"type": ["boolean", "null"]},
        "access": {"type": "string"},
        "message": _TEXT_OR_NULL,
        "files": _COUNT_OR_NULL,
        "bytes": _COUNT_OR_NULL,
        "bytes_present": _COUNT_OR_NULL,
        "local_dir": _NAME,
    },
    ("repo_id", "revision", "access", "local_dir"),
)
ROLE = _object(
    "The launch's capacity by its role in prefill-decode disaggregation "
    "(module_utils/plan/capacity_roles.py): what its KV pool holds per request and how many.",
    {
        "role": {"enum": ["whole", "prefill", "decode"]},
        "holds": {"type": "string"},
        "cuda_graph": {"type": "boolean"},
        "reserved_decode_tokens": _COUNT_OR_NULL,
        "tokens_per_request_at_context": {"type": "integer", "minimum": 0},
        "requests_at_context": _COUNT_OR_NULL,
        "workload_tokens_per_request": _COUNT_OR_NULL,
        "requests_at_workload": _COUNT_OR_NULL,
        "fits_one_request_at_context": {"type": "boolean"},
        "warning": _TEXT_OR_NULL,
    },
    ("role", "holds", "requests_at_context", "fits_one_request_at_context"),
    additionalProperties=False,
)
CAPACITY = _object(
    "The capacity plan of a launch (module_utils/preflight/capacity.py): whether weights and "
    "KV cache fit the GPUs, and why not.",
    {
        "fits": {"type": "boolean"},
        "reason": _TEXT_OR_NULL,
        "kv_tokens": {"type": ["integer", "null"]},
        "weights_gib_per_gpu": {"type": ["number", "null"]},
        "context_length": {"type": ["integer", "null"]},
        "role": ROLE,
    },
    ("fits",),
)
VALIDATION = _object(
    "The launch command checked against the pinned SGLang's parser contract.",
    {
        "ok": {"type": ["boolean", "null"]},
        "contract": _TEXT_OR_NULL,
        "errors": {"type": "array", "items": {"type": "string"}},
    },
    ("ok",),
)
LAUNCH = _object(
    "One launch of the config (a DDTree config has one per budget, and one per TP size).",
    {
        "name": _NAME,
        "base": _NAME,
        "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "environment": {"type": "object", "additionalProperties": {"type": "string"}},
        "runtime": {"type": "string"},
        "runtime_kind": {"enum": ["release", "git"]},
        "budget": {"type": ["integer", "null"], "minimum": 1},
        "control_for": _TEXT_OR_NULL,
        "tp_size": {"type": "integer", "minimum": 1},
        "context_length": {"type": "integer", "minimum": 1},
        "secrets": {"type": "object"},
        "validation": VALIDATION,
        "capacity": CAPACITY,
        "canary": _object(
            "The same launch on the tiny checkpoints of the canary stage.",
            {
                "argv": {"type": "array", "items": {"type": "string"}},
                "environment": {"type": "object"},
            },
            ("argv", "environment"),
        ),
    },
    ("name", "base", "argv", "environment", "runtime", "validation", "tp_size", "capacity"),
)
SERVING_CONFIG = _object(
    "One serving config: its drafter, the repositories it needs, its tightest launch's "
    "capacity (one that does not fit, else the fewest KV tokens) and every launch.",
    {
        "drafter": _TEXT_OR_NULL,
        "control_for": _TEXT_OR_NULL,
        "repos": {**_NAMES, "minItems": 1},
        "capacity": CAPACITY,
        "launch": {"type": "array", "items": LAUNCH, "minItems": 1},
    },
    ("drafter", "control_for", "repos", "capacity", "launch"),
)
PROPERTIES = {
    "host": {**_NAME, "description": "The inventory host."},
    "profile": {**_NAME, "description": "Its hardware profile (group_vars/<profile>.yml)."},
    "model": _object(
        "The model the plan is for (plan_model, from models/<name>/model.yml).",
        {"name": _NAME, "title": {"type": "string"}, "attention": {"type": "string"}},
        ("name",),
    ),
    "hardware": _object(
        "The profile's hardware and serving figures.",
        {
            "gpu_model": {"type": "string"},
            "gpu_count": {"type": "integer", "minimum": 1},
            "gpu_memory_mib": {"type": "integer", "minimum": 1},
            "interconnect": {"type": "string"},
            "tp_size": {"type": "integer", "minimum": 1},
        },
        ("gpu_model", "gpu_count", "interconnect"),
    ),
    "weights_dir": {**_NAME, "description": "Where the host keeps the weights."},
    "hub": _object(
        "Whether the hub was asked and reached from the controller, and what that means.",
        {
            "asked": {"type": "boolean"},
            "reachable": {"type": ["boolean", "null"]},
            "endpoint": _TEXT_OR_NULL,
            "note": {"type": "string"},
        },
        ("asked", "reachable", "endpoint", "note"),
    ),
    "study_lock": _object(
        "The study lock the plan read (or wrote) and what it pins.",
        {
            "path": {"type": "string"},
            "exists": {"type": "boolean"},
            "pins": {"type": "object"},
            "missing": {"type": "array"},
            "unresolved": {"type": "array"},
        },
        ("path", "exists", "pins", "missing", "unresolved"),
    ),
    "repos": {
        "type": "object",
        "description": "Per repository the host needs (target, drafters).",
        "additionalProperties": REPO,
    },
    "download_bytes": {
        **_COUNT_OR_NULL,
        "description": "What the repositories hold in all; null when a size is unknown.",
    },
    "download_estimate": {
        "type": ["object", "null"],
        "description": (
            "Without the hub's sizes, the model folder's (models/<model>/model.yml download_gib): "
            "bytes of the repositories it sizes, those it does not, and the file; null when the "
            "hub gave every size."
        ),
        "properties": {
            "bytes": {"type": "integer", "minimum": 0},
            "unknown": {"type": "array", "items": {"type": "string"}},
            "source": {"type": "string"},
        },
        "required": ["bytes", "unknown", "source"],
    },
    "disk": {
        "type": ["object", "null"],
        "description": (
            "The weights folder's free space as the host's last preflight recorded it on the "
            "controller (state/<host>/preflight.json), and what the download would leave of it "
            "(bytes already there not counted twice); null when no preflight recorded it."
        ),
        "properties": {
            "path": _TEXT_OR_NULL,
            "measured_at": _TEXT_OR_NULL,
            "recorded_at": _TEXT_OR_NULL,
            "free_bytes": {"type": "integer", "minimum": 0},
            "left_bytes": {"type": ["integer", "null"]},
        },
        "required": ["free_bytes", "left_bytes"],
    },
    "download_time": {
        "type": "array",
        "description": (
            "The download's time at the hosts' bandwidth (kimi_download_gbps) and at 10 Gbit/s; "
            "seconds null when the size is unknown."
        ),
        "items": _object(
            "One bandwidth.",
            {
                "gbps": {"type": "number", "exclusiveMinimum": 0},
                "seconds": {"type": ["number", "null"], "minimum": 0},
            },
            ("gbps", "seconds"),
        ),
    },
    "serving_configs": {
        "type": "object",
        "description": "Per serving config.",
        "additionalProperties": SERVING_CONFIG,
    },
    "ddtree_rules": {
        "type": ["object", "null"],
        "description": (
            "Whether DDTree's rules were read at the commit the study runs; null when no "
            "launch runs the git runtime."
        ),
    },
    "speed": {
        "type": "object",
        "description": "The predicted decode speed per launch and benchmark level.",
    },
    "validation": _object(
        "The launches by what the parser contract said of them.",
        {"passed": _NAMES, "failed": _NAMES, "unchecked": _NAMES},
        ("passed", "failed", "unchecked"),
    ),
}


def schema() -> dict:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "plan.json: what deploy would do on one host",
        "description": (
            "The plan roles/plan/templates/plan.json.j2 renders for each host, from the "
            "controller only; plan.md is rendered from it."
        ),
        "type": "object",
        "properties": json.loads(json.dumps(PROPERTIES)),
        "required": list(PROPERTIES),
    }


def schema_json() -> str:
    return json.dumps(schema(), indent=2, ensure_ascii=False) + "\n"
