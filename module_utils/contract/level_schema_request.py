"""The level schema's request record ($defs request): one per request the level sent."""

from __future__ import annotations

REQUEST = {
    "type": "object",
    "description": (
        "One request. Every record has the first eleven fields; the rest come together, "
        "when an event arrived and its meta_info could be read (always when ok)."
    ),
    "properties": {
        "index": {
            "type": "integer",
            "minimum": 0,
            "description": (
                "Position of the request in the level (0-based); the prompt is row index of "
                "the prompts file, cycled."
            ),
        },
        "prompt_id": {
            "type": [
                "string",
                "integer",
                "null",
            ],
            "description": (
                "The prompt row's id (benchmark_prompts writes <set>-<row>); null when the "
                "row has none."
            ),
        },
        "prompt_sha256": {
            "type": "string",
            "description": "sha256 (hex) of the prompt text as sent.",
            "pattern": "^[0-9a-f]{64}$",
        },
        "ok": {
            "type": "boolean",
            "description": "The request finished without error ([DONE] received).",
        },
        "error": {
            "type": [
                "string",
                "null",
            ],
            "description": "Why the request failed; null when ok.",
        },
        "ttft_ms": {
            "type": [
                "number",
                "null",
            ],
            "description": (
                "Time to first token, milliseconds, from the connection being made to the "
                "first streamed event; null without any event."
            ),
        },
        "e2e_ms": {
            "type": [
                "number",
                "null",
            ],
            "description": (
                "End-to-end latency, milliseconds, from the connection being made to [DONE] "
                "(or the last event when the stream ended without it); null without any "
                "event."
            ),
        },
        "tpot_ms": {
            "type": [
                "number",
                "null",
            ],
            "description": (
                "Time per output token, milliseconds: decode time after the first event "
                "over the tokens that came after it; null with one token or none."
            ),
        },
        "output_tokens": {
            "type": "integer",
            "minimum": 0,
            "description": (
                "Output tokens as the server counts them (meta_info.completion_tokens of "
                "the last event); 0 without a usable event."
            ),
        },
        "connect_ms": {
            "type": [
                "number",
                "null",
            ],
            "description": (
                "Time to connect, milliseconds (not part of TTFT or E2E); null when the "
                "connection was never made."
            ),
        },
        "events": {
            "type": "array",
            "description": (
                "Every streamed event: [milliseconds since the connection was made, "
                "cumulative output tokens]."
            ),
            "items": {
                "type": "array",
                "prefixItems": [
                    {
                        "type": "number",
                    },
                    {
                        "type": "integer",
                        "minimum": 0,
                    },
                ],
                "items": False,
                "minItems": 2,
            },
        },
        "prompt_tokens": {
            "type": [
                "integer",
                "null",
            ],
            "minimum": 0,
            "description": "meta_info.prompt_tokens of the last event (tokens); null when absent.",
        },
        "cached_tokens": {
            "type": [
                "integer",
                "null",
            ],
            "minimum": 0,
            "description": (
                "meta_info.cached_tokens of the last event (prompt tokens served from the "
                "prefix cache); null when absent."
            ),
        },
        "spec_verify_ct": {
            "type": [
                "integer",
                "null",
            ],
            "minimum": 0,
            "description": (
                "Verify steps (meta_info.spec_verify_ct, SGLang's last event); null without "
                "speculative decoding."
            ),
        },
        "accept_length": {
            "type": [
                "number",
                "null",
            ],
            "description": (
                "Tokens each verify step added, the prefill token left out: (output_tokens "
                "- 1) / spec_verify_ct; null without verify steps."
            ),
        },
        "spec_accept_length": {
            "type": [
                "number",
                "null",
            ],
            "description": (
                "SGLang's meta_info.spec_accept_length = output tokens / verify steps, the "
                "prefill token included; null when absent."
            ),
            "minimum": 0,
        },
        "decode_steps": {
            "type": "integer",
            "description": (
                "Forward steps between the first and the last event: verify steps under "
                "speculation, one per token without it."
            ),
        },
        "decode_ms": {
            "type": "number",
            "description": "Milliseconds from the first event to the last one that added tokens.",
        },
        "step_ms": {
            "type": [
                "number",
                "null",
            ],
            "description": (
                "Milliseconds per forward step: decode_ms / decode_steps; null with no step."
            ),
        },
        "finish_reason": {
            "type": [
                "string",
                "null",
            ],
            "description": (
                "meta_info.finish_reason.type of the last event (stop, length, abort), at "
                "most 40 characters; null when absent."
            ),
            "maxLength": 40,
        },
        "text": {
            "type": [
                "string",
                "null",
            ],
            "description": (
                "The output text (cumulative text of the last event); null when absent or "
                "incomplete."
            ),
        },
        "output_ids": {
            "type": [
                "array",
                "null",
            ],
            "items": {
                "type": "integer",
            },
            "description": "The output token ids (last event); null when absent or incomplete.",
        },
        "outputs_incomplete": {
            "const": True,
            "description": (
                "Present (true) only when the last event did not hold every output token "
                "(--incremental-streaming-output): text and output_ids are null then."
            ),
        },
        "score": {
            "type": "object",
            "description": (
                "Present only for a scored prompt set (module_utils/benchmark/scoring.py "
                "score_request). The answer is looked for after the reasoning's end "
                "(</think>) when the text has one."
            ),
            "properties": {
                "outcome": {
                    "enum": [
                        "correct",
                        "wrong",
                        "unanswered",
                    ],
                    "description": (
                        "unanswered: failed, cut off (finish_reason length) or aborted, or "
                        "the text is not whole; a finished answer with nothing extractable "
                        "is wrong."
                    ),
                },
                "extracted": {
                    "type": [
                        "string",
                        "null",
                    ],
                    "maxLength": 128,
                    "description": (
                        "The answer read from the output (GSM8K written plainly, 1,200.0 as "
                        "1200), cut to 128 characters; null when unanswered or none was "
                        "found."
                    ),
                },
                "expected": {
                    "type": "string",
                    "maxLength": 128,
                    "description": (
                        "The row's reference, cut to 128 characters (the comparison uses "
                        "the whole of it)."
                    ),
                },
            },
            "required": [
                "outcome",
                "extracted",
                "expected",
            ],
            "additionalProperties": False,
        },
    },
    "required": [
        "index",
        "prompt_id",
        "prompt_sha256",
        "ok",
        "error",
        "ttft_ms",
        "e2e_ms",
        "tpot_ms",
        "output_tokens",
        "connect_ms",
        "events",
    ],
    "additionalProperties": False,
    "dependentRequired": {
        "prompt_tokens": [
            "cached_tokens",
            "spec_verify_ct",
            "accept_length",
            "spec_accept_length",
            "decode_steps",
            "decode_ms",
            "step_ms",
            "finish_reason",
            "text",
            "output_ids",
        ],
        "cached_tokens": [
            "prompt_tokens",
            "spec_verify_ct",
            "accept_length",
            "spec_accept_length",
            "decode_steps",
            "decode_ms",
            "step_ms",
            "finish_reason",
            "text",
            "output_ids",
        ],
        "spec_verify_ct": [
            "prompt_tokens",
            "cached_tokens",
            "accept_length",
            "spec_accept_length",
            "decode_steps",
            "decode_ms",
            "step_ms",
            "finish_reason",
            "text",
            "output_ids",
        ],
        "accept_length": [
            "prompt_tokens",
            "cached_tokens",
            "spec_verify_ct",
            "spec_accept_length",
            "decode_steps",
            "decode_ms",
            "step_ms",
            "finish_reason",
            "text",
            "output_ids",
        ],
        "spec_accept_length": [
            "prompt_tokens",
            "cached_tokens",
            "spec_verify_ct",
            "accept_length",
            "decode_steps",
            "decode_ms",
            "step_ms",
            "finish_reason",
            "text",
            "output_ids",
        ],
        "decode_steps": [
            "prompt_tokens",
            "cached_tokens",
            "spec_verify_ct",
            "accept_length",
            "spec_accept_length",
            "decode_ms",
            "step_ms",
            "finish_reason",
            "text",
            "output_ids",
        ],
        "decode_ms": [
            "prompt_tokens",
            "cached_tokens",
            "spec_verify_ct",
            "accept_length",
            "spec_accept_length",
            "decode_steps",
            "step_ms",
            "finish_reason",
            "text",
            "output_ids",
        ],
        "step_ms": [
            "prompt_tokens",
            "cached_tokens",
            "spec_verify_ct",
            "accept_length",
            "spec_accept_length",
            "decode_steps",
            "decode_ms",
            "finish_reason",
            "text",
            "output_ids",
        ],
        "finish_reason": [
            "prompt_tokens",
            "cached_tokens",
            "spec_verify_ct",
            "accept_length",
            "spec_accept_length",
            "decode_steps",
            "decode_ms",
            "step_ms",
            "text",
            "output_ids",
        ],
        "text": [
            "prompt_tokens",
            "cached_tokens",
            "spec_verify_ct",
            "accept_length",
            "spec_accept_length",
            "decode_steps",
            "decode_ms",
            "step_ms",
            "finish_reason",
            "output_ids",
        ],
        "output_ids": [
            "prompt_tokens",
            "cached_tokens",
            "spec_verify_ct",
            "accept_length",
            "spec_accept_length",
            "decode_steps",
            "decode_ms",
            "step_ms",
            "finish_reason",
            "text",
        ],
        "outputs_incomplete": [
            "prompt_tokens",
            "cached_tokens",
            "spec_verify_ct",
            "accept_length",
            "spec_accept_length",
            "decode_steps",
            "decode_ms",
            "step_ms",
            "finish_reason",
            "text",
            "output_ids",
        ],
    },
    "if": {
        "properties": {
            "ok": {
                "const": True,
            },
        },
    },
    "then": {
        "required": [
            "prompt_tokens",
            "cached_tokens",
            "spec_verify_ct",
            "accept_length",
            "spec_accept_length",
            "decode_steps",
            "decode_ms",
            "step_ms",
            "finish_reason",
            "text",
            "output_ids",
        ],
        "properties": {
            "error": {
                "type": "null",
            },
            "ttft_ms": {
                "type": "number",
            },
            "e2e_ms": {
                "type": "number",
            },
        },
    },
    "else": {
        "properties": {
            "error": {
                "type": "string",
            },
        },
    },
}
