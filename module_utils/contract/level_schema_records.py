"""The level schema's records of the server and the client ($defs server, server_state,
metrics, startup_time, client)."""

from __future__ import annotations

SERVER = {
    "type": "object",
    "description": "The server during the level.",
    "properties": {
        "cache": {
            "type": "string",
            "description": (
                "The prefix cache flush before the level: 'flushed', or 'not flushed (<last "
                "answer>)' when the server never went idle within a minute."
            ),
            "pattern": "^(flushed|not flushed \\(.*\\))$",
        },
        "before": {
            "$ref": "#/$defs/server_state",
        },
        "after": {
            "$ref": "#/$defs/server_state",
        },
        "delta": {
            "type": "object",
            "description": (
                "Counter differences over the level (module_utils/benchmark/stats.py server_delta)."
            ),
            "properties": {
                "metrics": {
                    "$ref": "#/$defs/metrics",
                    "description": "after minus before, for metrics read both times.",
                },
                "spec_accept_length": {
                    "type": [
                        "number",
                        "null",
                    ],
                    "description": (
                        "generation tokens / verify calls (tokens per verify step, prefill "
                        "tokens included); null without verify calls or after a restart."
                    ),
                },
                "accepted_tokens_per_step": {
                    "type": [
                        "number",
                        "null",
                    ],
                    "description": (
                        "(generation tokens - finished requests) / verify calls (tokens per "
                        "verify step); null as spec_accept_length, or without a request "
                        "count."
                    ),
                },
                "restarted": {
                    "type": "boolean",
                    "description": (
                        "The server restarted during the level: another startup_time, or a "
                        "counter that went down."
                    ),
                },
            },
            "required": [
                "metrics",
                "spec_accept_length",
                "accepted_tokens_per_step",
                "restarted",
            ],
            "additionalProperties": False,
        },
        "crashed": {
            "type": "boolean",
            "description": "A request lost its connection, or the server restarted.",
        },
    },
    "required": [
        "cache",
        "before",
        "after",
        "delta",
        "crashed",
    ],
    "additionalProperties": False,
}

SERVER_STATE = {
    "type": "object",
    "description": (
        "The server's cumulative counters and start record, read just before or just after "
        "the level."
    ),
    "properties": {
        "metrics": {
            "$ref": "#/$defs/metrics",
        },
        "startup_time": {
            "$ref": "#/$defs/startup_time",
        },
        "avg_spec_accept_length": {
            "type": [
                "number",
                "null",
            ],
            "description": (
                "/server_info internal_states[0].avg_spec_accept_length (SGLang's running "
                "average since the server started, tokens per verify step); null when "
                "absent or not a non-negative number."
            ),
            "minimum": 0,
        },
        "error": {
            "type": "string",
            "description": "Why /server_info or /metrics could not be read (present only then).",
        },
    },
    "required": [
        "metrics",
        "startup_time",
        "avg_spec_accept_length",
    ],
    "additionalProperties": False,
}

METRICS = {
    "type": "object",
    "description": (
        "SGLang /metrics samples summed over label sets, by metric name; only these four "
        "are read, and a metric the server does not export is absent."
    ),
    "propertyNames": {
        "enum": [
            "sglang:generation_tokens_total",
            "sglang:prompt_tokens_total",
            "sglang:spec_verify_calls_total",
            "sglang:num_requests_total",
        ],
    },
    "additionalProperties": {
        "type": "number",
    },
}

STARTUP_TIME = {
    "description": (
        "/server_info's startup_time: in SGLang 0.5.23 the durations measured while "
        "starting, in seconds, by phase (python/sglang/srt/observability/startup_time.py "
        "build_engine_startup_time), a phase either a number or an object of numbers "
        "(cuda_graph); at most 32 entries. A number from older releases is kept as it is. "
        "Null when /server_info did not answer or held nothing usable. A different record "
        "before and after a level means the server restarted."
    ),
    "type": [
        "object",
        "number",
        "null",
    ],
    "maxProperties": 32,
    "propertyNames": {
        "maxLength": 64,
    },
    "additionalProperties": {
        "type": [
            "number",
            "object",
        ],
        "maxProperties": 32,
        "additionalProperties": {
            "type": "number",
        },
    },
}

CLIENT = {
    "type": "object",
    "description": "The client's own load (module_utils/benchmark/client_report.py client_report).",
    "properties": {
        "cpu_s": {
            "type": "number",
            "description": "CPU seconds the client used during the level.",
            "minimum": 0,
        },
        "cpu_fraction": {
            "type": "number",
            "description": "cpu_s over the level's wall time (fraction of one core).",
            "minimum": 0,
        },
        "loop_lag_ms": {
            "$ref": "#/$defs/stat",
            "description": (
                "Event-loop lag, milliseconds: how late a 5 ms sleep woke up (may be "
                "slightly negative)."
            ),
        },
        "events": {
            "type": "integer",
            "minimum": 0,
            "description": "Streamed events received.",
        },
        "events_per_s": {
            "type": "number",
            "description": "Events per second over the level.",
            "minimum": 0,
        },
        "event_gap_ms": {
            "type": "number",
            "description": (
                "Mean milliseconds between one request's events; 0 when no request had two."
            ),
            "minimum": 0,
        },
        "bytes_received": {
            "type": "integer",
            "minimum": 0,
            "description": "Bytes read from the server's answers.",
        },
        "saturated": {
            "type": "boolean",
            "description": "The client, not the server, may have been the limit.",
        },
        "saturated_reasons": {
            "type": "array",
            "items": {
                "type": "string",
            },
            "description": "Why saturated (empty when not).",
        },
        "timing_reliable": {
            "type": "boolean",
            "description": "The event loop's lag p99 stayed under thresholds.late_loop_lag_p99_ms.",
        },
        "warnings": {
            "type": "array",
            "items": {
                "type": "string",
            },
            "description": (
                "Other notes about the client's timing, and why a level has no summary.gpu "
                "when telemetry was asked for."
            ),
        },
        "thresholds": {
            "type": "object",
            "description": "The limits the verdicts above used.",
            "properties": {
                "saturated_cpu_fraction": {
                    "type": "number",
                    "description": "CPU fraction of one core from which the client is saturated.",
                },
                "busy_cpu_fraction": {
                    "type": "number",
                    "description": (
                        "CPU fraction from which a late event loop counts as falling behind."
                    ),
                },
                "behind_lag_share_of_event_gap": {
                    "type": "number",
                    "description": "Loop lag p99 as a share of event_gap_ms that counts as behind.",
                },
                "late_loop_lag_p99_ms": {
                    "type": "number",
                    "description": (
                        "Loop lag p99, milliseconds, from which timings are not reliable."
                    ),
                },
            },
            "required": [
                "saturated_cpu_fraction",
                "busy_cpu_fraction",
                "behind_lag_share_of_event_gap",
                "late_loop_lag_p99_ms",
            ],
            "additionalProperties": False,
        },
        "python": {
            "type": "string",
            "description": "The Python version that ran the client.",
        },
        "arrival_lag_ms": {
            "$ref": "#/$defs/stat",
            "description": (
                "Request-rate levels only: how late each request started against its "
                "Poisson schedule, milliseconds (a late event loop, or the in-flight cap "
                "full)."
            ),
        },
        "processes": {
            "type": "integer",
            "minimum": 2,
            "description": (
                "Present when the client spread the level over several processes: how many."
            ),
        },
        "process_cpu_fractions": {
            "type": "array",
            "items": {
                "type": "number",
                "minimum": 0,
            },
            "maxItems": 1024,
            "description": "Each process's share of one core, with processes.",
        },
    },
    "required": [
        "cpu_s",
        "cpu_fraction",
        "loop_lag_ms",
        "events",
        "events_per_s",
        "event_gap_ms",
        "bytes_received",
        "saturated",
        "saturated_reasons",
        "timing_reliable",
        "warnings",
        "thresholds",
        "python",
    ],
    "additionalProperties": False,
}
