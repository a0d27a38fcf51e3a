"""How the reader judges and words the values of untrusted files: finite numbers of a size it
can compute with, bounded nesting, and a value or a field's path short enough to quote in a
'file: field: what' line."""

from __future__ import annotations

import json
import math
import re

from analysis.results_types import MAX_PROBLEMS

# No number a level holds comes near this (a petabyte, 31,000 years in ms); past it float
# arithmetic (sums, ratios, axis limits at 1.25 x the largest) loses integers or overflows.
MAX_MAGNITUDE = 1e15
# JSON nesting: the deepest a writer goes is about 6; the report embeds run.json, whose
# encoding recurses once per level.
MAX_NESTING = 64


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and finite(value)


def ratio(numerator, denominator) -> float | None:
    """numerator / denominator when both are numbers, the denominator is not 0 and the
    quotient is finite (a tiny denominator can overflow it), else None."""
    if numerator is None or not denominator:
        return None
    value = numerator / denominator
    return value if math.isfinite(value) else None


def show(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_:-]+$")


def field_path(path) -> str:
    """A JSON path: summary.ttft_ms.p99, requests[3].ok; a key with other characters quoted,
    gpu.models["NVIDIA H200"], so the path ends where the message's ': ' begins."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _PLAIN_KEY.match(str(part)):
            text += f".{part}" if text else str(part)
        else:
            text += f"[{json.dumps(str(part))}]"
    return text


def number_problems(document, rel: str, requests: bool = True) -> list[str]:
    """One 'file: field: what' line per number that is not finite or too large to compute
    with (MAX_MAGNITUDE; a request's prompt_id, a name, excepted), and per value nested deeper
    than MAX_NESTING. The request records are left out unless `requests`."""
    problems: list[str] = []
    stack = [(document, (), 0)]
    while stack and len(problems) < MAX_PROBLEMS:
        value, path, depth = stack.pop()
        if isinstance(value, dict):
            if depth >= MAX_NESTING:
                problems.append(f"{rel}: {field_path(path)}: nested more than {MAX_NESTING} deep")
                continue
            for key, item in value.items():
                if not (depth == 0 and key == "requests" and not requests):
                    stack.append((item, (*path, key), depth + 1))
        elif isinstance(value, list):
            if depth >= MAX_NESTING:
                problems.append(f"{rel}: {field_path(path)}: nested more than {MAX_NESTING} deep")
                continue
            stack.extend((item, (*path, i), depth + 1) for i, item in enumerate(value))
        elif (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and not finite(value)
            and not (path[:1] == ("requests",) and path[-1] == "prompt_id")
        ):
            problems.append(
                f"{rel}: {field_path(path) or '(top level)'}: expected a finite number of "
                f"magnitude at most {MAX_MAGNITUDE:g}, found {show(value)}"
            )
    return sorted(problems)


def finite(value) -> bool:
    """A number the analysis can compute with: finite, and at most MAX_MAGNITUDE across."""
    try:
        return math.isfinite(value) and abs(value) <= MAX_MAGNITUDE
    except OverflowError:  # an integer beyond any float
        return False


def merged_problems(first: list[str], second: list[str]) -> list[str]:
    """first, then the lines of second about fields first does not name."""
    named = {line.split(": ", 2)[1] for line in first}
    return first + [line for line in second if line.split(": ", 2)[1] not in named]
