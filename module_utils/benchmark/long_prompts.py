"""Long prompts: TTFT at length from a dataset the benchmark already fetches.

A long set's definition (benchmark_prompt_set_definitions) adds `long`:
{tokens: N, chars_per_token: c, question: "..."} and its own `max_new_tokens`. Each prompt
is the dataset's rows (through the set's `template`) one after another from its own first
row, about N tokens long, ending in a short question, so the answer is short and the time
is the prefill's. Prompt i starts at row i x (rows // prompts): no two prompts share their
first row, so SGLang's radix cache cannot serve one from another beyond the chat template's
head (the few tokens before the user's text).

The length is estimated from characters (N x c characters of text), since the tokenizer is
the server's. The estimate is recorded in the set's .meta.json (`length`), and each level
of the set compares it with what SGLang counted (the records' prompt_tokens) in its
summary's `prompt_length`.
"""

from __future__ import annotations

import os
import statistics

from ansible.module_utils.benchmark.chat import fill
from ansible.module_utils.host.helpers import read_json

# English prose and math through BPE tokenizers of the Kimi/DeepSeek/Qwen kind run near 4
# characters a token; a definition can say otherwise.
DEFAULT_CHARS_PER_TOKEN = 4.0
MIN_TOKENS = 16
# A bound on what one definition may ask, whatever the model: 1M tokens of text is 4 MB a
# prompt, and a prompt file of num_prompts of them.
MAX_TOKENS = 1 << 20
MAX_QUESTION_CHARS = 1024
SEPARATOR = "\n\n"
# A level's measured mean this far from the target (as a share of it) is off target: the
# characters-per-token estimate does not fit the server's tokenizer.
OFF_TARGET = 0.25


class LongPromptError(ValueError):
    pass


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def context_of(model_config) -> int | None:
    """The model's max_position_embeddings (a multimodal config's text_config's), or None."""
    if not isinstance(model_config, dict):
        return None
    text = model_config.get("text_config")
    text = text if isinstance(text, dict) else model_config
    found = text.get("max_position_embeddings")
    return found if _positive_int(found) else None


def settings_of(name: str, spec: dict, context: int | None) -> dict:
    """The definition's `long` checked: the target, the characters per token, the question,
    and the set's max_new_tokens; prompt and answer must fit the model's context."""
    given = spec.get("long")
    if not isinstance(given, dict):
        raise LongPromptError(f"prompt set {name}: long must be a mapping (tokens, question)")
    tokens = given.get("tokens")
    if not _positive_int(tokens) or not MIN_TOKENS <= tokens <= MAX_TOKENS:
        raise LongPromptError(
            f"prompt set {name}: long.tokens must be a whole number from {MIN_TOKENS} to "
            f"{MAX_TOKENS}, got {tokens!r}"
        )
    per = given.get("chars_per_token", DEFAULT_CHARS_PER_TOKEN)
    if isinstance(per, bool) or not isinstance(per, (int, float)) or not 1 <= per <= 16:
        raise LongPromptError(
            f"prompt set {name}: long.chars_per_token must be a number from 1 to 16, got {per!r}"
        )
    question = given.get("question")
    if not isinstance(question, str) or not 0 < len(question.strip()) <= MAX_QUESTION_CHARS:
        raise LongPromptError(
            f"prompt set {name}: long.question must be a text of 1 to {MAX_QUESTION_CHARS} "
            "characters (the short question the prompt ends in)"
        )
    budget = spec.get("max_new_tokens")
    if not _positive_int(budget):
        raise LongPromptError(
            f"prompt set {name}: a long set needs its own max_new_tokens (a short answer: "
            f"the time measured is the prefill's), got {budget!r}"
        )
    if context is None:
        raise LongPromptError(
            f"prompt set {name}: the model's context is unknown (no max_position_embeddings "
            "in the model folder's config.json), so a long prompt cannot be checked against it"
        )
    if tokens + budget > context:
        raise LongPromptError(
            f"prompt set {name}: {tokens} prompt tokens and {budget} new tokens exceed the "
            f"model's context of {context} tokens; lower long.tokens to at most "
            f"{context - budget}"
        )
    return {"tokens": tokens, "chars_per_token": float(per), "question": question.strip()}


def build(name: str, texts: list[str], count: int, settings: dict) -> tuple[list[str], dict]:
    """`count` prompts of about settings["tokens"] tokens from the rows' `texts`, and the
    record of how (kept in the set's .meta.json as `length`).

    Prompt i takes rows from i x (len(texts) // count) on, wrapping at the end, whole rows
    until the text reaches the target's characters; a row is used at most once a prompt."""
    rows = len(texts)
    if count > rows:
        raise LongPromptError(
            f"prompt set {name}: {count} long prompts need {count} distinct first rows, and "
            f"the dataset has {rows}; lower benchmark_num_prompts to at most {rows}"
        )
    tail = SEPARATOR + settings["question"]
    want = int(settings["tokens"] * settings["chars_per_token"])
    body = want - len(tail)
    total = sum(len(text) + len(SEPARATOR) for text in texts)
    if body <= 0 or total < body:
        raise LongPromptError(
            f"prompt set {name}: a prompt of {settings['tokens']} tokens needs about {want} "
            f"characters, more than all {rows} rows of the dataset hold ({total}); lower "
            "long.tokens or take a larger dataset"
        )
    step = rows // count
    prompts, firsts, used, estimated = [], [], [], []
    for i in range(count):
        first = i * step
        parts, size, taken = [], 0, 0
        while size < body:
            text = texts[(first + taken) % rows]
            parts.append(text)
            size += len(text) + len(SEPARATOR)
            taken += 1
        prompt = SEPARATOR.join(parts) + tail
        prompts.append(prompt)
        firsts.append(first)
        used.append(taken)
        estimated.append(round(len(prompt) / settings["chars_per_token"]))
    record = {
        "target_tokens": settings["tokens"],
        "chars_per_token": settings["chars_per_token"],
        "question": settings["question"],
        "first_rows": firsts,
        "rows_used": used,
        "estimated_tokens": estimated,
    }
    return prompts, record


def long_rows(
    name: str, spec: dict, rows: list, count: int, model_dir: str
) -> tuple[list[dict], dict]:
    """benchmark_prompts' hook: the long set's rows as chat rows (one user message each) and
    its `length` record, checked against the model folder's config.json."""
    if spec.get("scoring"):
        raise LongPromptError(f"prompt set {name}: a long set is not scored (drop scoring)")
    config = read_json(os.path.join(model_dir, "config.json"))
    settings = settings_of(name, spec, context_of(config))
    texts = []
    for index, row in enumerate(rows):
        try:
            texts.append(fill(spec.get("template") or "{prompt}", row))
        except (KeyError, IndexError, TypeError, ValueError) as error:
            raise LongPromptError(
                f"prompt set {name} row {index}: its template does not fit the row ({error!r})"
            ) from None
    prompts, record = build(name, texts, count, settings)
    return [{"messages": [{"role": "user", "content": text}]} for text in prompts], record


def target_of(meta) -> dict | None:
    """A set's .meta.json `length`, read as untrusted: the target and per-prompt estimates,
    or None for a set that is not long (or a record that is not one)."""
    length = meta.get("length") if isinstance(meta, dict) else None
    if not isinstance(length, dict):
        return None
    target, estimated = length.get("target_tokens"), length.get("estimated_tokens")
    if not _positive_int(target) or target > MAX_TOKENS:
        return None
    if not isinstance(estimated, list) or not 0 < len(estimated) <= 1 << 16:
        return None
    if not all(_positive_int(value) and value <= 8 * MAX_TOKENS for value in estimated):
        return None
    return {"target_tokens": target, "estimated_tokens": estimated}


def level_summary(length: dict, records: list[dict]) -> dict:
    """A level's prompt lengths: the target, the estimate of the prompts it sent and what
    SGLang counted (prompt_tokens of the records that have one), with the measured mean over
    the estimated one and whether it is within OFF_TARGET of the target."""
    estimated = length["estimated_tokens"]
    sent = [
        estimated[r["index"] % len(estimated)]
        for r in records
        if isinstance(r.get("index"), int) and not isinstance(r.get("index"), bool)
    ]
    counted = [r["prompt_tokens"] for r in records if _positive_int(r.get("prompt_tokens"))]
    target = length["target_tokens"]
    estimate = statistics.fmean(sent) if sent else None
    measured = statistics.fmean(counted) if counted else None
    return {
        "target_tokens": target,
        "estimated_mean": round(estimate, 1) if estimate is not None else None,
        "counted": len(counted),
        "prompt_tokens_min": min(counted) if counted else None,
        "prompt_tokens_mean": round(measured, 1) if measured is not None else None,
        "prompt_tokens_max": max(counted) if counted else None,
        "measured_over_estimated": (
            round(measured / estimate, 4) if measured is not None and estimate else None
        ),
        "on_target": (
            abs(measured - target) <= OFF_TARGET * target if measured is not None else None
        ),
    }
