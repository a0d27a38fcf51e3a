"""What the report makes of a level's GPU telemetry (summary.gpu, written by
module_utils/gpu_telemetry.py): power and tokens per joule columns, and throttle warnings.

Level files are outside input: every field read here is type-checked and bounded, and a summary of
the wrong shape yields empty columns and no warning rather than an exception.
"""

from __future__ import annotations

import math

# What a throttle reason is called in the report.
REASON_WORDS = {"power_cap": "power cap", "thermal": "thermal", "hw_slowdown": "hardware slowdown"}
# Why the clocks being held down matters, per reason.
REASON_CONSEQUENCE = {
    "power_cap": "throughput at this level is power-limited",
    "thermal": "throughput at this level is limited by cooling",
    "hw_slowdown": "throughput at this level is limited by a hardware slowdown (power brake or "
    "external signal)",
}
# Matches module_utils/gpu_telemetry.THROTTLE_SHARE: the writer lists reasons at or above it, and a
# hand-edited or older file listing less is not worth a warning.
THROTTLE_SHARE = 0.2
MAX_POWER_W = 1.0e6  # a whole host's GPUs, with margin
MAX_CLOCK_MHZ = 1.0e5
MAX_GPU_INDEX = 1023
MAX_THROTTLED_ENTRIES = 256


def _number(value, low: float, high: float) -> float | None:
    """A finite int/float within [low, high]; bool and everything else is None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    if not math.isfinite(number) or not low <= number <= high:
        return None
    return number


def gpu_summary(summary) -> dict | None:
    """summary.gpu when it is a dict, else None."""
    if not isinstance(summary, dict):
        return None
    gpu = summary.get("gpu")
    return gpu if isinstance(gpu, dict) else None


def columns(summary, output_tokens_per_s) -> dict:
    """gpu_power_w_mean and output_tokens_per_joule for a level's summary.csv row."""
    empty = {"gpu_power_w_mean": None, "output_tokens_per_joule": None}
    gpu = gpu_summary(summary)
    if gpu is None:
        return empty
    # A mean of zero watts is no measurement (and would divide by zero).
    power = _number(gpu.get("power_w_mean"), 1e-6, MAX_POWER_W)
    if power is None:
        return empty
    tokens_per_s = _number(output_tokens_per_s, 0.0, 1.0e12)
    per_joule = round(tokens_per_s / power, 4) if tokens_per_s is not None else None
    return {"gpu_power_w_mean": round(power, 1), "output_tokens_per_joule": per_joule}


def _level_name(level) -> str:
    rate = _number(getattr(level, "request_rate", None), 0.0, 1.0e9)
    if rate is not None and rate > 0:
        return f"r{format(rate, 'g')}"
    concurrency = getattr(level, "concurrency", None)
    if isinstance(concurrency, int) and not isinstance(concurrency, bool):
        return f"c{concurrency}"
    return "c?"


def _text(value, limit: int = 200) -> str:
    return "".join(ch for ch in str(value) if ch.isprintable())[:limit]


def _throttle_message(entry: dict) -> str | None:
    reason = entry.get("reason")
    if not isinstance(reason, str) or reason not in REASON_WORDS:
        return None
    share = _number(entry.get("share"), THROTTLE_SHARE, 1.0)
    gpu_index = entry.get("gpu")
    if share is None or isinstance(gpu_index, bool) or not isinstance(gpu_index, int):
        return None
    if not 0 <= gpu_index <= MAX_GPU_INDEX:
        return None
    mean = _number(entry.get("sm_clock_mhz_mean"), 0.0, MAX_CLOCK_MHZ)
    peak = _number(entry.get("sm_clock_max_mhz"), 0.0, MAX_CLOCK_MHZ)
    clocks = ""
    if mean is not None and peak is not None:
        clocks = f" (SM clock {mean:.0f} MHz mean against {peak:.0f} MHz max)"
    elif mean is not None:
        clocks = f" (SM clock {mean:.0f} MHz mean)"
    percent = f"{share * 100:.0f}%"
    if percent == "100%" and share < 1.0:
        percent = "over 99%"  # 0.998 is not every sample
    return (
        f"GPU {gpu_index} held its clocks down for {REASON_WORDS[reason]} in "
        f"{percent} of samples{clocks}: {REASON_CONSEQUENCE[reason]}"
    )


def throttle_warnings(levels) -> list[dict]:
    """One gpu_throttled warning per (level, GPU, reason) the level's telemetry lists."""
    found = []
    if not isinstance(levels, list | tuple):
        return found
    for level in levels:
        gpu = gpu_summary(getattr(level, "summary", None))
        if gpu is None:
            continue
        entries = gpu.get("throttled")
        if not isinstance(entries, list):
            continue
        where = " / ".join(
            _text(getattr(level, attribute, "?"), 120)
            for attribute in ("host", "config", "prompt_set")
        )
        where = f"{where} / {_level_name(level)}"
        seen = set()
        for entry in entries[:MAX_THROTTLED_ENTRIES]:
            if not isinstance(entry, dict):
                continue
            message = _throttle_message(entry)
            if message is None:
                continue
            key = (entry["gpu"], entry["reason"])  # an int and a str once a message was made
            if key in seen:
                continue
            seen.add(key)
            found.append(
                {
                    "kind": "gpu_throttled",
                    "severity": "warning",
                    "where": where,
                    "message": message,
                }
            )
    return found
