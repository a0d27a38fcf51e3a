"""The result files the benchmark writes and the analysis reads: their kinds, schema version,
names and size bound (the fields themselves: docs/schema/level.schema.json)."""

from __future__ import annotations

import re

SCHEMA_VERSION = 1
# The level schema versions the analysis reads (the schema's schema_version const; a test ties
# them).
SUPPORTED_SCHEMAS = (SCHEMA_VERSION,)
LEVEL_KIND = "sglang_benchmark.level"
LOSSLESS_KIND = "sglang_benchmark.lossless"
API_CHECK_KIND = "kimi.api_check"
API_CHECK_SCHEMA_VERSION = 1
API_CHECK_FILE = "api-check.json"
# c<N>.json (closed loop at concurrency N), r<R>.json (Poisson arrivals at R requests/s),
# and repeat k >= 2 of either: c<N>.rep<k>.json, r<R>.rep<k>.json.
LEVEL_FILE = re.compile(r"^(?:c(\d+)|r(\d+(?:\.\d+)?))(?:\.rep(\d+))?\.json$")
# A rate level's file is r<R>.json with R a plain decimal (format(R, "g")).
RATE_TEXT = re.compile(r"^[0-9]+(?:\.[0-9]+)?$")
# Largest level file read: a level of 100,000 records with their texts is well under 1 GiB;
# anything far bigger is not a level file.
MAX_LEVEL_BYTES = 2 << 30
# pip's own tooling: present in every venv at whatever version ensurepip brought, never frozen
# in the study lock (module_utils/runtime/freeze.py) and no part of what the server runs, so
# the analysis does not compare it either (analysis/comparability.py).
NOT_FROZEN = ("pip", "setuptools", "wheel")


def parse_level_file(name: str) -> tuple[int | None, float | None, int | None] | None:
    """(concurrency, request rate, repeat) a level file's name says, each None where it says
    none (c4.json: (4, None, None); r0.5.rep2.json: (None, 0.5, 2)); None for another file."""
    match = LEVEL_FILE.match(name)
    if not match:
        return None
    closed, rate, repeat = match.groups()
    return (
        int(closed) if closed is not None else None,
        float(rate) if rate is not None else None,
        int(repeat) if repeat is not None else None,
    )


def rate_text(rate: float) -> str:
    """R of r<R>.json: format(R, "g"), which must be a plain decimal that reads back as R."""
    text = format(float(rate), "g")
    if not RATE_TEXT.match(text) or float(text) != float(rate):
        raise ValueError(
            f"request rate {rate!r} has no plain decimal name ({text}); give it with at most "
            "6 significant digits, between 0.0001 and 100000"
        )
    return text


def level_stem(concurrency: int | None = None, rate: float | None = None, repeat: int = 1) -> str:
    """The name parse_level_file() reads back, without .json: c<N> for a closed loop at
    concurrency N, r<R> for Poisson arrivals at R requests/s, .rep<k> for repeat k >= 2."""
    return repeat_stem(f"c{concurrency}" if rate is None else f"r{rate_text(rate)}", repeat)


def repeat_stem(stem: str, repeat: int) -> str:
    """A level's stem at repeat k: the first keeps its name, k >= 2 adds .rep<k>."""
    return stem + (f".rep{repeat}" if repeat > 1 else "")
