"""A level that passed the schema, checked for what the schema cannot say (its file name, the
request records' reduced fields, the counts, the accuracy outcomes) and reduced to the fields
the analysis keeps."""

from __future__ import annotations

import math
import os
import re
from array import array

from ansible.module_utils.contract.level import LEVEL_FILE

from analysis.provenance import MAX_COUNT, reduce_provenance
from analysis.results_types import MAX_PROBLEMS
from analysis.results_values import finite, is_number, show

# The full parse's stand-in for a field a request record lacks: worded "missing".
MISSING = object()


def reduce_level(document: dict, fields: list[tuple], rel: str) -> tuple[dict | None, list[str]]:
    """Check what the schema cannot (the file name, the request records' reduced fields when
    they were not validated, the counts) of a level that passed it, and keep what the
    analysis uses."""
    config, prompt_set = document["config"], document["prompt_set"]
    problems: list[str] = []
    # Both name folders of the results tree.
    if "/" in config:
        problems.append(_expected(rel, "config", "the serving config's name", config))
    if "/" in prompt_set:
        problems.append(_expected(rel, "prompt_set", "a prompt set's name", prompt_set))
    shape = _level_shape(document, rel, problems)
    summary = document["summary"]
    kept = _Kept()
    for number, (index, ok, tokens, accept_length, *timed, prompt_tokens) in enumerate(fields):
        lines, rejected = _record_problems(
            rel, f"requests[{number}]", index, ok, tokens, accept_length, timed
        )
        problems += lines
        if rejected:
            continue
        if ok:
            kept.add(tokens, prompt_tokens, accept_length, timed)
        if len(problems) > MAX_PROBLEMS:
            break
    if not problems:
        problems += _count_problems(summary, len(fields), kept.ok_count, rel)
    if not problems and summary.get("accuracy") is not None:
        problems += accuracy_problems(summary["accuracy"], len(fields), rel)
    if problems:
        return None, problems
    return _reduced(document, kept, len(fields), shape), []


def _expected(rel: str, name: str, what: str, value=MISSING) -> str:
    found = "missing" if value is MISSING else f"found {show(value)}"
    return f"{rel}: {name}: expected {what}, {found}"


def _record_problems(
    rel: str, where: str, index, ok, tokens, accept_length, timed: list
) -> tuple[list[str], bool]:
    """(problems, whether the record is left out) of one request record's reduced fields. A
    bad index is named but keeps the record; the first other bad field leaves it out (the
    latencies are all named)."""
    lines = []
    if not isinstance(index, int) or isinstance(index, bool):
        lines.append(_expected(rel, f"{where}.index", "an integer", index))
    if not isinstance(ok, bool):
        return [*lines, _expected(rel, f"{where}.ok", "true or false", ok)], True
    count = "a count (an integer of 0 or more)"
    if not isinstance(tokens, int) or isinstance(tokens, bool) or not finite(tokens):
        return [*lines, _expected(rel, f"{where}.output_tokens", count, tokens)], True
    if tokens < 0:
        return [*lines, _expected(rel, f"{where}.output_tokens", count, tokens)], True
    if accept_length is not None and (not is_number(accept_length) or accept_length < 0):
        what = "a number of 0 or more, or null"
        return [*lines, _expected(rel, f"{where}.accept_length", what, accept_length)], True
    wrong = [
        (name, value)
        for name, value in zip(_TIMED, timed, strict=True)
        if value is not None and (not is_number(value) or value < 0)
    ]
    for name, value in wrong:
        lines.append(_expected(rel, f"{where}.{name}_ms", "a number of 0 or more, or null", value))
    return lines, bool(wrong)


class _Kept:
    """What the analysis keeps of the level's requests that succeeded."""

    def __init__(self):
        self.accept, self.weights = array("d"), array("d")
        self.latencies = {"ttft": array("d"), "tpot": array("d"), "e2e": array("d")}
        self.ok_count = 0
        self.contexts: list[tuple[int, object]] = []  # (output tokens, prompt_tokens)

    def add(self, tokens: int, prompt_tokens, accept_length, timed: list) -> None:
        self.ok_count += 1
        self.contexts.append((tokens, prompt_tokens))
        if accept_length is not None:
            self.accept.append(accept_length)
            self.weights.append(tokens)
        for name, value in zip(_TIMED, timed, strict=True):
            self.latencies[name].append(math.nan if value is None else value)


def _count_problems(summary: dict, records: int, ok_count: int, rel: str) -> list[str]:
    """The summary's request counts against the records the file holds."""
    counted = summary["requests_ok"] + summary["requests_failed"]
    if counted != records:
        return [
            f"{rel}: summary.requests_ok: requests_ok + requests_failed is {counted}, but "
            f"the file holds {records} request records"
        ]
    if summary["requests_ok"] != ok_count:
        return [
            f"{rel}: summary.requests_ok: {summary['requests_ok']}, but {ok_count} request "
            "records have ok true"
        ]
    return []


def _reduced(document: dict, kept: _Kept, records: int, shape: dict) -> dict:
    """The level's fields the analysis keeps."""
    client, provenance = document["client"], document["provenance"]
    context_mean, context_skipped = _context_mean(kept.contexts)
    return {
        "schema_version": document["schema_version"],
        "config": document["config"],
        "prompt_set": document["prompt_set"],
        "concurrency": document["concurrency"],
        "run_id": str(document["run_label"] or provenance.get("run_id") or ""),
        "summary": dict(document["summary"]),
        "client": {
            "saturated": client["saturated"],
            "saturated_reasons": client["saturated_reasons"],
            "cpu_fraction": client["cpu_fraction"],
        },
        "crashed": document["server"]["crashed"],
        "settings": document["settings"],
        "provenance": reduce_provenance(provenance),
        "started_at": document["started_at"],
        "accept": kept.accept,
        "accept_tokens": kept.weights,
        "context_tokens_mean": context_mean,
        "context_skipped": context_skipped,
        "records": records,
        # Checked by the level schema ($defs.fleet) before it gets here.
        "fleet": document.get("fleet"),
        **kept.latencies,
        **shape,
    }


_TIMED = ("ttft", "tpot", "e2e")
# A prompt longer than this is no prompt any model here reads (K2.6's context is 262,144).
MAX_PROMPT_TOKENS = 1 << 24


def _context_mean(contexts: list[tuple[int, object]]) -> tuple[float | None, int]:
    """(mean context a decode step of the level reads, requests left out): each request's
    context grows from its prompt to prompt + output over its decode, so it reads prompt +
    output / 2 on average, weighted by its output tokens (its share of the level's steps).
    prompt_tokens is SGLang's count; a record without one, or with something that is no count
    (a string, a negative or absurd number), is left out and counted: the speed model's
    context then rests on the others, and the report says how many were skipped."""
    weight = total = 0.0
    skipped = 0
    for tokens, prompt in contexts:
        if (
            isinstance(prompt, bool)
            or not isinstance(prompt, int)
            or not 0 <= prompt <= MAX_PROMPT_TOKENS
        ):
            skipped += 1
            continue
        share = max(tokens, 1)
        weight += share
        total += share * (prompt + tokens / 2)
    return (round(total / weight, 1) if weight else None), skipped


_WORKLOAD_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


def _level_shape(document: dict, rel: str, problems: list[str]) -> dict:
    """How the level was driven - request_rate, arrival, repeat, repeats, fill, workload -
    checked against the file name (c<N>[.rep<k>].json, r<R>[.rep<k>].json) and typed here,
    whatever the schema says: the analysis keys its rows by them."""
    match = LEVEL_FILE.match(os.path.basename(rel))
    concurrency = document["concurrency"]
    rate = document.get("request_rate")
    if rate is not None and (not is_number(rate) or rate <= 0):
        problems.append(
            f"{rel}: request_rate: expected a number above 0 or null, found {show(rate)}"
        )
        rate = None
    if match:
        closed, named_rate, named_repeat = match.groups()
        if closed is not None and int(closed) != concurrency:
            problems.append(
                f"{rel}: concurrency: {concurrency} does not match the file name "
                f"(c{closed}.json); the file was renamed or moved"
            )
        if closed is not None and rate is not None:
            problems.append(
                f"{rel}: request_rate: {rate:g}, but the file name (c{closed}) names a closed "
                "loop; a rate level is r<R>.json"
            )
        if named_rate is not None and (
            rate is None or abs(rate - float(named_rate)) > 1e-9 * max(rate, 1)
        ):
            problems.append(
                f"{rel}: request_rate: {show(rate)} does not match the file name "
                f"(r{named_rate}); the file was renamed or moved"
            )
    else:
        named_repeat = None
    repeat = document.get("repeat")
    if repeat is not None and (
        not isinstance(repeat, int) or isinstance(repeat, bool) or not 1 <= repeat <= MAX_COUNT
    ):
        problems.append(f"{rel}: repeat: expected an integer of at least 1, found {show(repeat)}")
        repeat = None
    if named_repeat is not None and repeat is not None and int(named_repeat) != repeat:
        problems.append(
            f"{rel}: repeat: {repeat} does not match the file name (.rep{named_repeat}); the "
            "file was renamed or moved"
        )
    repeat = repeat or (int(named_repeat) if named_repeat else 1)
    repeats = document.get("repeats")
    if not isinstance(repeats, int) or isinstance(repeats, bool) or not 1 <= repeats <= MAX_COUNT:
        repeats = max(repeat, 1)
    fill = document.get("fill")
    if fill is not None and not isinstance(fill, dict):
        problems.append(f"{rel}: fill: expected an object, found {show(fill)}")
        fill = None
    fill = {
        k: v
        for k, v in (fill or {}).items()
        if k in _FILL
        and (isinstance(v, bool) if k in _FILL_FLAGS else is_number(v) and not isinstance(v, bool))
    }
    workload = document.get("workload")
    if workload is not None and (
        not isinstance(workload, dict)
        or not isinstance(workload.get("name"), str)
        or not _WORKLOAD_NAME.match(workload["name"])
    ):
        problems.append(
            f"{rel}: workload.name: expected a workload's name (letters, digits, ._-), found "
            f"{show(workload.get('name') if isinstance(workload, dict) else workload)}"
        )
        workload = None
    arrival = "poisson" if rate is not None else "closed"
    return {
        "request_rate": rate,
        "arrival": arrival,
        "repeat": repeat,
        "repeats": repeats,
        "fill": fill,
        "workload": {k: v for k, v in workload.items() if k in _WORKLOAD_KEPT}
        if workload
        else None,
    }


_FILL = (
    "wanted",
    "unique_prompts",
    "sent",
    "under_filled",
    "stopped_by_time_budget",
    "time_budget_s",
)
_FILL_FLAGS = ("under_filled", "stopped_by_time_budget")
_WORKLOAD_KEPT = ("name", "isl", "osl", "ignore_eos", "seed")


_OUTCOMES = re.compile(r"^[cwu]*$")
_OUTCOME_COUNTS = (("correct", "c"), ("wrong", "w"), ("unanswered", "u"))


def accuracy_problems(accuracy, records: int, rel: str) -> list[str]:
    """What the schema cannot say of a level's summary.accuracy: one outcome character per
    request record, the counts those characters add up to, and the accuracy they give. The
    analysis pairs two configs' outcomes prompt by prompt, so a string that does not match its
    records would pair the wrong answers."""
    where = f"{rel}: summary.accuracy"
    if not isinstance(accuracy, dict):
        return [f"{where}: expected an object, found {show(accuracy)}"]
    outcomes = accuracy.get("outcomes")
    if not isinstance(outcomes, str) or not _OUTCOMES.match(outcomes):
        return [f"{where}.outcomes: expected a string of c, w and u, found {show(outcomes)}"]
    problems = []
    if len(outcomes) != records:
        problems.append(
            f"{where}.outcomes: {len(outcomes)} outcomes, but the file holds {records} request "
            "records (one outcome each, in request order)"
        )
    for name in ("n", "correct", "wrong", "unanswered"):
        value = accuracy.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            problems.append(f"{where}.{name}: expected a count (an integer of 0 or more)")
    if problems:
        return problems
    if accuracy["n"] != len(outcomes):
        problems.append(f"{where}.n: {accuracy['n']}, but outcomes holds {len(outcomes)}")
    for name, letter in _OUTCOME_COUNTS:
        if accuracy[name] != outcomes.count(letter):
            problems.append(
                f"{where}.{name}: {accuracy[name]}, but outcomes holds {outcomes.count(letter)} "
                f"{letter}"
            )
    value = accuracy.get("accuracy")
    expected = accuracy["correct"] / accuracy["n"] if accuracy["n"] else None
    # With no request scored the writer's accuracy is whatever it chose for 0 / 0.
    if (
        value is not None
        and expected is not None
        and (not is_number(value) or abs(value - expected) > 1e-3)
    ):
        problems.append(f"{where}.accuracy: {show(value)}, but correct / n is {expected:.4f}")
    if not isinstance(accuracy.get("scorer"), str) or len(accuracy["scorer"]) > 64:
        problems.append(
            f"{where}.scorer: expected the scorer's name, found {show(accuracy.get('scorer'))}"
        )
    return problems
