"""What a level's GPU samples add up to: the summary.gpu document of a level file (per GPU
power, clocks, temperature, load and the share of samples each throttle reason was active,
the whole host's power and energy, and the reasons that held clocks down while busy).
module_utils/benchmark/gpu_telemetry.py samples the rows; analysis/telemetry.py reads the
summary and warns about throttling at the contract's share (contract/thresholds.py).
"""

from __future__ import annotations

import itertools

from ansible.module_utils.contract.thresholds import THROTTLE_SHARE

# Throttle reason bits (nvmlClocksEventReasons / nvidia-smi --help-query-gpu).
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80
REASON_MASKS = {
    "power_cap": REASON_SW_POWER_CAP,
    "thermal": REASON_SW_THERMAL | REASON_HW_THERMAL,
    "hw_slowdown": REASON_HW_SLOWDOWN | REASON_HW_POWER_BRAKE,
}

# Busy = utilization.gpu at or above this: an idle GPU lowers its clocks by design, and a reason
# seen only then says nothing about the level's throughput.
BUSY_UTILIZATION_PCT = 10.0
# Fewer busy samples than this (one second at 200 ms) cannot tell a level-long state.
MIN_BUSY_SAMPLES = 5


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _round(value: float | None, digits: int) -> float | int | None:
    if value is None:
        return None
    if digits == 0:
        return round(value)
    return round(value, digits)


def _present(rows: list[dict], field: str) -> list[float]:
    return [row[field] for row in rows if row[field] is not None]


def _share(rows: list[dict], mask: int) -> float | None:
    known = [row["reasons"] for row in rows if row["reasons"] is not None]
    if not known:
        return None
    return sum(1 for reasons in known if reasons & mask) / len(known)


def gpu_summary(index: int, rows: list[dict]) -> dict:
    power = _present(rows, "power.draw")
    sm = _present(rows, "clocks.sm")
    temperature = _present(rows, "temperature.gpu")
    limits = _present(rows, "power.limit")
    sm_max = _present(rows, "clocks.max.sm")
    memory = _present(rows, "memory.used")
    names = [row["name"] for row in rows if row["name"]]
    return {
        "index": index,
        "name": names[-1] if names else "",
        "samples": len(rows),
        "power_w": {
            "mean": _round(_mean(power), 1),
            "max": _round(max(power) if power else None, 1),
        },
        "power_limit_w": _round(max(limits) if limits else None, 1),
        "sm_clock_mhz": {
            "mean": _round(_mean(sm), 0),
            "min": _round(min(sm) if sm else None, 0),
            "max": _round(max(sm) if sm else None, 0),
        },
        "sm_clock_max_mhz": _round(max(sm_max) if sm_max else None, 0),
        "mem_clock_mhz": {"mean": _round(_mean(_present(rows, "clocks.mem")), 0)},
        "temperature_c": {
            "mean": _round(_mean(temperature), 1),
            "max": _round(max(temperature) if temperature else None, 1),
        },
        "utilization_pct": {"mean": _round(_mean(_present(rows, "utilization.gpu")), 1)},
        "memory_used_mib": {"max": _round(max(memory) if memory else None, 0)},
        "throttle": {
            reason: _round(_share(rows, mask), 3) for reason, mask in REASON_MASKS.items()
        },
    }


def throttled_entries(index: int, rows: list[dict], sm_clock_max: float | None) -> list[dict]:
    """Reasons active in >= THROTTLE_SHARE of the GPU's busy samples (the share given is that)."""
    busy = [
        row
        for row in rows
        if row["utilization.gpu"] is not None and row["utilization.gpu"] >= BUSY_UTILIZATION_PCT
    ]
    if len(busy) < MIN_BUSY_SAMPLES:
        return []
    found = []
    for reason, mask in REASON_MASKS.items():
        share = _share(busy, mask)
        if share is None or share < THROTTLE_SHARE:
            continue
        held = [row for row in busy if row["reasons"] is not None and row["reasons"] & mask]
        found.append(
            {
                "gpu": index,
                "reason": reason,
                "share": round(share, 3),
                "busy_samples": len(busy),
                "sm_clock_mhz_mean": _round(_mean(_present(held, "clocks.sm")), 0),
                "sm_clock_max_mhz": _round(sm_clock_max, 0),
            }
        )
    return found


def polls(rows: list[dict]) -> list[list[dict]]:
    """Rows grouped by poll: nvidia-smi prints every GPU once per interval, in ascending index
    order, so an index not above the previous row's starts the next poll (also when a row of
    the previous poll was dropped: then that poll is short, not merged with the next)."""
    grouped: list[list[dict]] = []
    for row in rows:
        if not grouped or row["index"] <= grouped[-1][-1]["index"]:
            grouped.append([])
        grouped[-1].append(row)
    return grouped


def summarize(rows: list[dict], interval_ms: int, warnings: list[str]) -> dict:
    """The summary.gpu document of a level (docs in ISSUE19 design: GPU telemetry summary)."""
    by_gpu: dict[int, list[dict]] = {}
    for row in rows:
        by_gpu.setdefault(row["index"], []).append(row)
    gpus = [gpu_summary(index, by_gpu[index]) for index in sorted(by_gpu)]
    throttled = []
    for gpu in gpus:
        throttled.extend(
            throttled_entries(gpu["index"], by_gpu[gpu["index"]], gpu["sm_clock_max_mhz"])
        )
    gpu_count = len(by_gpu)
    # Power over time: a poll counts only when every sampled GPU reported its draw in it.
    points = []
    for poll in polls(rows):
        draws = [row["power.draw"] for row in poll]
        # Only nvidia-smi's own stamps time a poll: a reading time stands in for an unreadable
        # stamp elsewhere, but pipe buffering can hold a poll's lines for seconds.
        stamped = all(row["stamped"] for row in poll)
        if stamped and len(poll) == gpu_count and all(draw is not None for draw in draws):
            points.append((poll[0]["time"], sum(draws)))
    points.sort()
    energy = None
    power_mean = None
    if len(points) >= 2 and points[-1][0] > points[0][0]:
        energy = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in itertools.pairwise(points))
        power_mean = energy / (points[-1][0] - points[0][0])
    elif points:
        power_mean = sum(p for _, p in points) / len(points)
    times = [row["time"] for row in rows if row["stamped"]] or [row["time"] for row in rows]
    return {
        "source": "nvidia-smi",
        "interval_ms": interval_ms,
        "duration_s": round(max(times) - min(times), 3) if times else 0.0,
        "samples": min((len(r) for r in by_gpu.values()), default=0),
        "power_w_mean": _round(power_mean, 1),
        "energy_j": _round(energy, 1),
        "gpus": gpus,
        "throttled": throttled,
        "warnings": list(warnings),
    }
