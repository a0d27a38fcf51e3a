"""Service level objectives as the report's --slo and autotune's autotune_slo give them: reading
them, and which requests met them all (analysis/slo.py computes a level's goodput from it,
module_utils/autotune/score.py a trial's). Standard library and the metric registry only."""

from __future__ import annotations

import math
import re

from ansible.module_utils.contract import metrics

# The level's distributions (ttft_ms, ...) and the percentiles each records.
SLO_METRICS = tuple(name.removesuffix("_ms") for name in metrics.distributions())
SLO_STATS = metrics.PERCENTILES
SLO_FORMS = (
    "KEY=VALUE pairs separated by commas, KEY <metric>_ms_<stat> with metric one of "
    f"{', '.join(SLO_METRICS)} and stat one of {', '.join(SLO_STATS)}, VALUE a positive "
    "number of milliseconds (e.g. ttft_ms_p99=2000,tpot_ms_p99=33)"
)
_SLO_KEY = re.compile(r"^([a-z0-9]+)_ms_([a-z0-9]+)$")
_SLO_VALUE = re.compile(r"^\d+(?:\.\d+)?$")
MAX_SLO_MS = 1e9


class SloError(ValueError):
    """A --slo that cannot be read; the message names what was wrong and the allowed forms."""


def parse_slo(text: str) -> dict[str, float]:
    """{key: threshold in ms} from 'ttft_ms_p99=2000,tpot_ms_p99=33'; SloError otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise SloError(f"--slo is empty; expected {SLO_FORMS}")
    found: dict[str, float] = {}
    for part in text.split(","):
        item = part.strip()
        if not item:
            raise SloError(f"--slo {text!r} has an empty entry; expected {SLO_FORMS}")
        if "=" not in item:
            raise SloError(f"--slo entry {item[:60]!r} has no '=VALUE'; expected {SLO_FORMS}")
        key, _, raw = (p.strip() for p in item.partition("="))
        match = _SLO_KEY.match(key)
        if not match:
            raise SloError(
                f"--slo key {key[:60]!r} is not <metric>_ms_<stat>; expected {SLO_FORMS}"
            )
        metric, stat = match.groups()
        if metric not in SLO_METRICS:
            raise SloError(
                f"--slo key {key!r}: unknown metric {metric!r} (allowed: "
                f"{', '.join(SLO_METRICS)}); expected {SLO_FORMS}"
            )
        if stat not in SLO_STATS:
            raise SloError(
                f"--slo key {key!r}: statistic {stat!r} is not recorded (allowed: "
                f"{', '.join(SLO_STATS)}); expected {SLO_FORMS}"
            )
        if key in found:
            raise SloError(f"--slo key {key!r} is given twice; give each key once")
        if not _SLO_VALUE.match(raw) or not 0 < float(raw) <= MAX_SLO_MS:
            raise SloError(
                f"--slo {key}={raw[:40]!r}: the threshold must be a positive number of "
                f"milliseconds (at most {MAX_SLO_MS:g}); expected {SLO_FORMS}"
            )
        found[key] = float(raw)
    return found


def slo_limits(slo: dict) -> dict[str, float]:
    """The tightest threshold per request metric (ttft, tpot, e2e): a request's own latencies
    are single values, so every percentile's threshold applies to each of them, and an itl
    threshold is a tpot one (a request's mean ITL is its TPOT)."""
    limits: dict[str, float] = {}
    for key, value in slo.items():
        metric = key.split("_ms_")[0]
        metric = "tpot" if metric == "itl" else metric
        limits[metric] = min(value, limits.get(metric, math.inf))
    return limits


def good_requests(ttft, tpot, e2e, slo: dict) -> int:
    """How many requests (parallel lists of each one's TTFT, TPOT and E2E in ms, NaN where it
    has none) meet every threshold of its kind. A request without a TPOT (one token) meets the
    TPOT thresholds; one without a TTFT or E2E meets none."""
    limits = slo_limits(slo)
    ttft_limit = limits.get("ttft", math.inf)
    tpot_limit = limits.get("tpot", math.inf)
    e2e_limit = limits.get("e2e", math.inf)
    good = 0
    for first, per_token, whole in zip(ttft, tpot, e2e, strict=True):
        # NaN compares false: no TTFT or E2E fails, no TPOT passes.
        if (
            (first <= ttft_limit or ttft_limit == math.inf)
            and (whole <= e2e_limit or e2e_limit == math.inf)
            and not per_token > tpot_limit
        ):
            good += 1
    return good
