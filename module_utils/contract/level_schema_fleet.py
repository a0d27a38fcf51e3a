"""$defs.fleet of the level schema: a level sent through SGLang's router
(module_utils/benchmark/fleet.py Fleet.record)."""

from __future__ import annotations

COUNT_OR_NULL = {"type": ["integer", "null"], "minimum": 0}

FLEET_WORKER = {
    "type": "object",
    "description": "One replica behind the router, over the level.",
    "properties": {
        "url": {"type": "string", "description": "The replica's URL, as the router lists it."},
        "requests": {
            **COUNT_OR_NULL,
            "description": "Requests the replica finished (its sglang:num_requests_total).",
        },
        "prompt_tokens": {**COUNT_OR_NULL, "description": "Its sglang:prompt_tokens_total."},
        "generation_tokens": {
            **COUNT_OR_NULL,
            "description": "Its sglang:generation_tokens_total.",
        },
        "router_requests": {
            **COUNT_OR_NULL,
            "description": (
                "Requests the router says it sent there and were answered "
                "(smg_worker_cb_outcomes_total outcome success); null when unread."
            ),
        },
        "router_failures": {
            **COUNT_OR_NULL,
            "description": "The same with outcome failure.",
        },
        "restarted": {
            "type": "boolean",
            "description": "The replica restarted during the level (its counters say nothing).",
        },
    },
    "required": [
        "url",
        "requests",
        "prompt_tokens",
        "generation_tokens",
        "router_requests",
        "router_failures",
        "restarted",
    ],
    "additionalProperties": False,
}

FLEET = {
    "type": "object",
    "description": (
        "Present when the level went through SGLang's router: per replica, what it served."
    ),
    "properties": {
        "workers": {
            "type": "object",
            "propertyNames": {"pattern": "^[A-Za-z0-9_.-]{1,128}$"},
            "additionalProperties": FLEET_WORKER,
            "minProperties": 1,
            "maxProperties": 64,
        },
        "router_metrics": {
            "type": "string",
            "description": "'read', or why the router's metrics could not be read.",
        },
        "balance": {
            "type": "object",
            "description": "The least and most loaded replica (requests finished).",
            "properties": {
                "min_requests": COUNT_OR_NULL,
                "max_requests": COUNT_OR_NULL,
                "min_over_max": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
            },
            "required": ["min_requests", "max_requests", "min_over_max"],
            "additionalProperties": False,
        },
    },
    "required": ["workers", "router_metrics", "balance"],
    "additionalProperties": False,
}
