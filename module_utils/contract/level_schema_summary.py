"""The level summary's nested fields (accuracy, prompt_length, gpu) as the level schema
describes them; module_utils/contract/metrics.py lists them among the summary's fields."""

from __future__ import annotations

ACCURACY = {
    "type": "object",
    "description": (
        "Present only for a scored prompt set (benchmark_prompts' scoring): its answers "
        "against the rows' references (module_utils/benchmark/scoring.py accuracy_summary), "
        "every request record counted."
    ),
    "properties": {
        "scorer": {
            "type": "string",
            "enum": [
                "gsm8k",
                "math",
            ],
            "description": (
                "gsm8k: the final number; math: the last \\boxed{...}, normalized as the "
                "MATH graders do."
            ),
        },
        "n": {
            "type": "integer",
            "minimum": 0,
            "description": "Requests scored: every record of the level.",
        },
        "correct": {
            "type": "integer",
            "minimum": 0,
            "description": "Finished answers equal to the reference.",
        },
        "wrong": {
            "type": "integer",
            "minimum": 0,
            "description": "Finished answers that differ from the reference or hold none.",
        },
        "unanswered": {
            "type": "integer",
            "minimum": 0,
            "description": (
                "Requests cut off (finish_reason length), aborted or failed, or whose text "
                "is not whole: no answer to score."
            ),
        },
        "accuracy": {
            "type": "number",
            "minimum": 0,
            "maximum": 1,
            "description": "correct / n (0 when n is 0).",
        },
        "outcomes": {
            "type": "string",
            "pattern": "^[cwu]*$",
            "description": (
                "One letter per request in request-index order (c correct, w wrong, u "
                "unanswered): two levels with the same prompts file "
                "(provenance.prompts.sha256) pair prompt by prompt."
            ),
        },
    },
    "required": [
        "scorer",
        "n",
        "correct",
        "wrong",
        "unanswered",
        "accuracy",
        "outcomes",
    ],
    "additionalProperties": False,
}

PROMPT_LENGTH = {
    "type": "object",
    "description": (
        "Present only for a long prompt set (a definition with `long`, "
        "module_utils/benchmark/long_prompts.py): the target length, the characters-based "
        "estimate of the prompts the level sent (from the set's .meta.json `length`) and "
        "what SGLang counted (the records' prompt_tokens)."
    ),
    "properties": {
        "target_tokens": {
            "type": "integer",
            "minimum": 1,
            "description": "The definition's long.tokens.",
        },
        "estimated_mean": {
            "type": [
                "number",
                "null",
            ],
            "minimum": 0,
            "description": (
                "Mean estimated tokens (characters over long.chars_per_token) of the "
                "prompts sent; null with no request."
            ),
        },
        "counted": {
            "type": "integer",
            "minimum": 0,
            "description": "Records with a prompt_tokens from SGLang.",
        },
        "prompt_tokens_min": {
            "type": [
                "integer",
                "null",
            ],
            "minimum": 1,
            "description": "Least prompt_tokens SGLang counted; null when none was.",
        },
        "prompt_tokens_mean": {
            "type": [
                "number",
                "null",
            ],
            "minimum": 0,
            "description": "Mean prompt_tokens SGLang counted; null when none was.",
        },
        "prompt_tokens_max": {
            "type": [
                "integer",
                "null",
            ],
            "minimum": 1,
            "description": "Most prompt_tokens SGLang counted; null when none was.",
        },
        "measured_over_estimated": {
            "type": [
                "number",
                "null",
            ],
            "minimum": 0,
            "description": (
                "prompt_tokens_mean over estimated_mean: the server tokenizer's characters "
                "per token against the definition's; null without both."
            ),
        },
        "on_target": {
            "type": [
                "boolean",
                "null",
            ],
            "description": (
                "prompt_tokens_mean within 25% of target_tokens; false: the server's "
                "tokenizer is off the estimate; long.chars_per_token divided by "
                "measured_over_estimated fits it. null when nothing was counted."
            ),
        },
    },
    "required": [
        "target_tokens",
        "estimated_mean",
        "counted",
        "prompt_tokens_min",
        "prompt_tokens_mean",
        "prompt_tokens_max",
        "measured_over_estimated",
        "on_target",
    ],
    "additionalProperties": False,
}

GPU = {
    "type": "object",
    "description": (
        "Present only when the GPUs were sampled during the level "
        "(module_utils/benchmark/gpu_telemetry.py, from just before its first request to "
        "just after its last): power, energy, clocks, temperature, utilisation, memory and "
        "throttle reasons of every GPU of the host."
    ),
    "properties": {
        "source": {
            "enum": [
                "nvidia-smi",
                "nvml",
            ],
            "description": "What sampled.",
        },
        "interval_ms": {
            "type": "integer",
            "minimum": 20,
            "maximum": 60000,
            "description": "Milliseconds between samples.",
        },
        "duration_s": {
            "type": "number",
            "minimum": 0,
            "description": "Seconds from the first sample to the last.",
        },
        "samples": {
            "type": "integer",
            "minimum": 0,
            "description": "Samples per GPU (the least over the GPUs).",
        },
        "power_w_mean": {
            "type": [
                "number",
                "null",
            ],
            "minimum": 0,
            "description": (
                "Mean over time of the summed power.draw of the sampled GPUs, watts; null "
                "without a complete sample."
            ),
        },
        "energy_j": {
            "type": [
                "number",
                "null",
            ],
            "minimum": 0,
            "description": (
                "That sum integrated over the samples (trapezoid), joules; null with fewer "
                "than two complete samples."
            ),
        },
        "gpus": {
            "type": "array",
            "items": {
                "type": "object",
                "description": "One GPU over the level.",
                "properties": {
                    "index": {
                        "type": "integer",
                        "minimum": 0,
                        "maximum": 1023,
                        "description": "nvidia-smi's index.",
                    },
                    "name": {
                        "type": "string",
                        "maxLength": 96,
                        "description": "The GPU's name.",
                    },
                    "samples": {
                        "type": "integer",
                        "minimum": 0,
                        "description": "Samples of this GPU.",
                    },
                    "power_w": {
                        "type": "object",
                        "description": "power.draw, watts.",
                        "properties": {
                            "mean": {
                                "type": [
                                    "number",
                                    "null",
                                ],
                                "minimum": 0,
                                "description": "Mean.",
                            },
                            "max": {
                                "type": [
                                    "number",
                                    "null",
                                ],
                                "minimum": 0,
                                "description": "Largest.",
                            },
                        },
                        "required": [
                            "mean",
                            "max",
                        ],
                        "additionalProperties": False,
                    },
                    "power_limit_w": {
                        "type": [
                            "number",
                            "null",
                        ],
                        "minimum": 0,
                        "description": "power.limit, watts (the largest seen).",
                    },
                    "sm_clock_mhz": {
                        "type": "object",
                        "description": "clocks.sm, MHz.",
                        "properties": {
                            "mean": {
                                "type": [
                                    "number",
                                    "null",
                                ],
                                "minimum": 0,
                                "description": "Mean.",
                            },
                            "min": {
                                "type": [
                                    "number",
                                    "null",
                                ],
                                "minimum": 0,
                                "description": "Least.",
                            },
                            "max": {
                                "type": [
                                    "number",
                                    "null",
                                ],
                                "minimum": 0,
                                "description": "Largest.",
                            },
                        },
                        "required": [
                            "mean",
                            "min",
                            "max",
                        ],
                        "additionalProperties": False,
                    },
                    "sm_clock_max_mhz": {
                        "type": [
                            "number",
                            "null",
                        ],
                        "minimum": 0,
                        "description": "clocks.max.sm, MHz: the clock the GPU could run at.",
                    },
                    "mem_clock_mhz": {
                        "type": "object",
                        "description": "clocks.mem, MHz.",
                        "properties": {
                            "mean": {
                                "type": [
                                    "number",
                                    "null",
                                ],
                                "minimum": 0,
                                "description": "Mean.",
                            },
                        },
                        "required": [
                            "mean",
                        ],
                        "additionalProperties": False,
                    },
                    "temperature_c": {
                        "type": "object",
                        "description": "temperature.gpu, degrees Celsius.",
                        "properties": {
                            "mean": {
                                "type": [
                                    "number",
                                    "null",
                                ],
                                "minimum": -100,
                                "maximum": 300,
                                "description": "Mean.",
                            },
                            "max": {
                                "type": [
                                    "number",
                                    "null",
                                ],
                                "minimum": -100,
                                "maximum": 300,
                                "description": "Largest.",
                            },
                        },
                        "required": [
                            "mean",
                            "max",
                        ],
                        "additionalProperties": False,
                    },
                    "utilization_pct": {
                        "type": "object",
                        "description": "utilization.gpu, percent.",
                        "properties": {
                            "mean": {
                                "type": [
                                    "number",
                                    "null",
                                ],
                                "minimum": 0,
                                "maximum": 100,
                                "description": "Mean.",
                            },
                        },
                        "required": [
                            "mean",
                        ],
                        "additionalProperties": False,
                    },
                    "memory_used_mib": {
                        "type": "object",
                        "description": "memory.used, MiB.",
                        "properties": {
                            "max": {
                                "type": [
                                    "number",
                                    "null",
                                ],
                                "minimum": 0,
                                "description": "Largest.",
                            },
                        },
                        "required": [
                            "max",
                        ],
                        "additionalProperties": False,
                    },
                    "throttle": {
                        "type": "object",
                        "description": (
                            "Share of the GPU's samples (0 to 1) with each clock-event "
                            "reason active; null when no sample had the reasons."
                        ),
                        "properties": {
                            "power_cap": {
                                "type": [
                                    "number",
                                    "null",
                                ],
                                "minimum": 0,
                                "maximum": 1,
                                "description": "SW power cap (0x4).",
                            },
                            "thermal": {
                                "type": [
                                    "number",
                                    "null",
                                ],
                                "minimum": 0,
                                "maximum": 1,
                                "description": "SW or HW thermal slowdown (0x20, 0x40).",
                            },
                            "hw_slowdown": {
                                "type": [
                                    "number",
                                    "null",
                                ],
                                "minimum": 0,
                                "maximum": 1,
                                "description": "HW slowdown or HW power brake (0x8, 0x80).",
                            },
                        },
                        "required": [
                            "power_cap",
                            "thermal",
                            "hw_slowdown",
                        ],
                        "additionalProperties": False,
                    },
                },
                "required": [
                    "index",
                    "name",
                    "samples",
                    "power_w",
                    "power_limit_w",
                    "sm_clock_mhz",
                    "sm_clock_max_mhz",
                    "mem_clock_mhz",
                    "temperature_c",
                    "utilization_pct",
                    "memory_used_mib",
                    "throttle",
                ],
                "additionalProperties": False,
            },
            "maxItems": 64,
            "description": "Each GPU, by index.",
        },
        "throttled": {
            "type": "array",
            "items": {
                "type": "object",
                "description": (
                    "A reason active in at least 0.2 of a GPU's busy samples (utilization "
                    "10% or more)."
                ),
                "properties": {
                    "gpu": {
                        "type": "integer",
                        "minimum": 0,
                        "maximum": 1023,
                        "description": "The GPU's index.",
                    },
                    "reason": {
                        "enum": [
                            "power_cap",
                            "thermal",
                            "hw_slowdown",
                        ],
                        "description": "Which.",
                    },
                    "share": {
                        "type": "number",
                        "minimum": 0,
                        "maximum": 1,
                        "description": "Share of the busy samples with it active.",
                    },
                    "busy_samples": {
                        "type": "integer",
                        "minimum": 0,
                        "description": "The GPU's busy samples.",
                    },
                    "sm_clock_mhz_mean": {
                        "type": [
                            "number",
                            "null",
                        ],
                        "minimum": 0,
                        "description": "Mean SM clock while it was active, MHz.",
                    },
                    "sm_clock_max_mhz": {
                        "type": [
                            "number",
                            "null",
                        ],
                        "minimum": 0,
                        "description": "The GPU's clocks.max.sm, MHz.",
                    },
                },
                "required": [
                    "gpu",
                    "reason",
                    "share",
                    "sm_clock_mhz_mean",
                    "sm_clock_max_mhz",
                ],
                "additionalProperties": False,
            },
            "maxItems": 192,
            "description": "Clocks held down during the level: the report's gpu_throttled.",
        },
        "warnings": {
            "type": "array",
            "items": {
                "type": "string",
                "maxLength": 4096,
            },
            "maxItems": 64,
            "description": "What the sampler could not do (lines dropped, no sample).",
        },
    },
    "required": [
        "source",
        "interval_ms",
        "duration_s",
        "samples",
        "power_w_mean",
        "energy_j",
        "gpus",
        "throttled",
        "warnings",
    ],
    "additionalProperties": False,
}
