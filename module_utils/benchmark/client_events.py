"""What an event of SGLang's stream must be before the benchmark reads it: the fields it
reads and their types (counts, non-negative numbers, text, token ids).

Standard library only: this runs on the host that drives the benchmark.
"""

from __future__ import annotations

import math

# meta_info fields read from the server and what each must be when present (SGLang 0.5.23,
# tokenizer_manager.py _handle_batch_output, _calculate_spec_decoding_metrics).
COUNT_FIELDS = (
    "completion_tokens",
    "prompt_tokens",
    "cached_tokens",
    "spec_verify_ct",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
)
NUMBER_FIELDS = ("spec_accept_length", "spec_accept_rate")


def event_problem(data) -> str | None:
    """What makes one decoded event unusable, or None: an object whose meta_info is an
    object with a completion_tokens count, and whose other fields the benchmark reads have
    their types (counts, non-negative numbers, text a string, output_ids counts)."""
    if not isinstance(data, dict):
        return f"event is not a JSON object but {type(data).__name__}"
    meta = data.get("meta_info")
    if not isinstance(meta, dict):
        return f"event without a meta_info object (meta_info is {type(meta).__name__})"
    if "completion_tokens" not in meta:
        return "event without meta_info.completion_tokens"
    if not counted(meta["completion_tokens"]):
        return f"meta_info.completion_tokens is not a count: {shown(meta['completion_tokens'])}"
    for name in COUNT_FIELDS:
        if name in meta and meta[name] is not None and not counted(meta[name]):
            return f"meta_info.{name} is not a count: {shown(meta[name])}"
    for name in NUMBER_FIELDS:
        if name in meta and meta[name] is not None and not number(meta[name]):
            return f"meta_info.{name} is not a non-negative number: {shown(meta[name])}"
    histogram = meta.get("spec_correct_drafts_histogram")
    if histogram is not None and not (
        isinstance(histogram, list) and all(counted(item) for item in histogram)
    ):
        return "meta_info.spec_correct_drafts_histogram is not a list of counts: " + shown(
            histogram
        )
    finish = meta.get("finish_reason")
    if finish is not None and not isinstance(finish, dict):
        return f"meta_info.finish_reason is not an object: {shown(finish)}"
    if data.get("text") is not None and not isinstance(data["text"], str):
        return f"text is not a string: {shown(data['text'])}"
    if data.get("output_ids") is not None and token_ids(data["output_ids"]) is None:
        return f"output_ids is not a list of token ids: {shown(data['output_ids'])}"
    return None


def shown(value) -> str:
    return repr(value)[:60]


def token_ids(value) -> list[int] | None:
    """The stream's output_ids when they are a list of token ids, else None."""
    if isinstance(value, list) and all(counted(item) for item in value):
        return value
    return None


def counted(value) -> bool:
    """A count from the server: a non-negative integer."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 40


def number(value) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )
