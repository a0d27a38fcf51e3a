"""What the report makes of a level's GPU telemetry (summary.gpu, sampled by
module_utils/benchmark/gpu_telemetry.py and summarised by module_utils/benchmark/gpu_summary.py):
power and tokens per joule columns, and throttle warnings.

Level files are outside input: every field read here is type-checked and bounded, and a summary of
the wrong shape yields empty columns and no warning rather than an exception.
"""

from __future__ import annotations

import itertools
import math

# The writer lists reasons active in at least THROTTLE_SHARE of the busy samples; a hand-edited
# or older file listing less is not worth a warning.
from ansible.module_utils.contract.thresholds import THROTTLE_SHARE

# What a throttle reason is called in the report.
REASON_WORDS = {"power_cap": "power cap", "thermal": "thermal", "hw_slowdown": "hardware slowdown"}
# Why the clocks being held down matters, per reason.
REASON_CONSEQUENCE = {
    "power_cap": "throughput at this level is power-limited",
    "thermal": "throughput at this level is limited by cooling",
    "hw_slowdown": "throughput at this level is limited by a hardware slowdown (power brake or "
    "external signal)",
}
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


_FLAG_VALUE = {
    "--tp-size": "tp",
    "--tp": "tp",
    "--tensor-parallel-size": "tp",
    "--pp-size": "pp",
    "--pp": "pp",
    "--pipeline-parallel-size": "pp",
    "--nnodes": "nnodes",
    "--base-gpu-id": "base",
    "--gpu-id-step": "step",
}


def server_gpu_indexes(provenance) -> list[int] | None:
    """The host's GPUs (nvidia-smi indexes) a launch serves on: TP x PP over --nnodes from
    --base-gpu-id every --gpu-id-step (SGLang's defaults 0 and 1), through the launch's
    CUDA_VISIBLE_DEVICES when it set one. None when the launch record does not say, or says
    something this cannot map (GPU UUIDs): then every GPU of the host counts."""
    launch = provenance.get("launch") if isinstance(provenance, dict) else None
    argv = launch.get("argv") if isinstance(launch, dict) else None
    if not isinstance(argv, list):
        return None
    found = {"pp": 1, "nnodes": 1, "base": 0, "step": 1}
    for flag, value in itertools.pairwise(argv):
        name = _FLAG_VALUE.get(flag) if isinstance(flag, str) else None
        if name and isinstance(value, str) and value.isdigit() and len(value) <= 4:
            found[name] = int(value)
    tp, nnodes = found.get("tp"), found["nnodes"]
    if not tp or not found["pp"] or not nnodes or not found["step"] or (tp * found["pp"]) % nnodes:
        return None
    count = tp * found["pp"] // nnodes
    indexes = [found["base"] + k * found["step"] for k in range(count)]
    environment = launch.get("environment")
    visible = environment.get("CUDA_VISIBLE_DEVICES") if isinstance(environment, dict) else None
    if visible is None:
        return indexes
    if not isinstance(visible, str) or len(visible) > 4096:
        return None
    devices = [part.strip() for part in visible.split(",") if part.strip()]
    if not all(d.isdigit() and len(d) <= 4 for d in devices) or max(indexes) >= len(devices):
        return None
    return [int(devices[i]) for i in indexes]


def _power_of(gpu: dict, indexes: list[int] | None) -> float | None:
    """Mean power of the GPUs in indexes (their per-GPU means, summed) when the summary lists
    each of them once, else the mean total over every GPU sampled."""
    entries = gpu.get("gpus")
    if indexes and isinstance(entries, list) and len(entries) <= MAX_GPU_INDEX + 1:
        means: dict[int, float | None] = {}
        for entry in entries:
            if not isinstance(entry, dict):
                continue
            index = entry.get("index")
            power = entry.get("power_w")
            if isinstance(index, int) and not isinstance(index, bool) and isinstance(power, dict):
                means[index] = None if index in means else _number(power.get("mean"), 0, 1e5)
        chosen = [means.get(i) for i in indexes]
        if all(value is not None for value in chosen) and len(set(indexes)) == len(indexes):
            return sum(chosen) or None
    return _number(gpu.get("power_w_mean"), 1e-6, MAX_POWER_W)


def columns(summary, output_tokens_per_s, gpu_indexes: list[int] | None = None) -> dict:
    """gpu_power_w_mean and output_tokens_per_joule for a level's summary.csv row: the power
    of the GPUs the server runs on (gpu_indexes, from server_gpu_indexes) when the level
    sampled each of them, else of every GPU of the host (a TP4 server on an 8-GPU host would
    otherwise be charged for four idle GPUs)."""
    empty = {"gpu_power_w_mean": None, "output_tokens_per_joule": None}
    gpu = gpu_summary(summary)
    if gpu is None:
        return empty
    # A mean of zero watts is no measurement (and would divide by zero).
    power = _power_of(gpu, gpu_indexes)
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


def _throttle_entry(entry) -> tuple | None:
    """(reason, GPU index, share, SM clock mean, SM clock max) of a well-formed throttled
    entry, else None."""
    if not isinstance(entry, dict):
        return None
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
    return reason, gpu_index, share, mean, peak


def _percent(share: float) -> str:
    percent = f"{share * 100:.0f}%"
    return "over 99%" if percent == "100%" and share < 1.0 else percent  # 0.998 is not all


def _span(values: list[float], show) -> str:
    low, high = min(values), max(values)
    return show(low) if show(low) == show(high) else f"{show(low)} to {show(high)}"


def _gpu_list(indexes: list[int]) -> str:
    """GPU 3, or GPUs 0-7, or GPUs 0, 2, 5: consecutive runs as ranges."""
    ordered = sorted(set(indexes))
    if len(ordered) == 1:
        return f"GPU {ordered[0]}"
    runs, first = [], ordered[0]
    for previous, current in zip(ordered, [*ordered[1:], None], strict=True):
        if current is None or current != previous + 1:
            runs.append(str(first) if first == previous else f"{first}-{previous}")
            first = current
    return "GPUs " + ", ".join(runs)


def _throttle_message(reason: str, entries: list[tuple], runs: int) -> str:
    """One sentence for every GPU of a level (all its repeats) held down for one reason."""
    shares = [share for _reason, _gpu, share, _mean, _peak in entries]
    means = [mean for *_rest, mean, _peak in entries if mean is not None]
    peaks = [peak for *_rest, peak in entries if peak is not None]
    clocks = ""
    if means:
        clocks = f" (SM clock {_span(means, lambda v: f'{v:.0f}')} MHz mean"
        clocks += f" against {_span(peaks, lambda v: f'{v:.0f}')} MHz max)" if peaks else ")"
    gpus = _gpu_list([gpu for _reason, gpu, *_rest in entries])
    verb = "held its clocks" if gpus.startswith("GPU ") else "held their clocks"
    across = f" over {runs} runs" if runs > 1 else ""
    return (
        f"{gpus} {verb} down for {REASON_WORDS[reason]} in {_span(shares, _percent)} of "
        f"samples{across}{clocks}: {REASON_CONSEQUENCE[reason]}"
    )


def throttle_warnings(levels) -> list[dict]:
    """One gpu_throttled warning per level and reason, naming every GPU held down for it; the
    repeats of a level (c16.json, c16.rep2.json) share it. An 8-GPU host at its power limit
    thus says so once per level, not eight times per run."""
    if not isinstance(levels, list | tuple):
        return []
    groups: dict[tuple[str, str], dict] = {}
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
        counted = set()
        for entry in entries[:MAX_THROTTLED_ENTRIES]:
            parsed = _throttle_entry(entry)
            if parsed is None:
                continue
            group = groups.setdefault((where, parsed[0]), {"entries": {}, "runs": 0})
            group["entries"].setdefault((id(level), parsed[1]), parsed)
            if parsed[0] not in counted:
                counted.add(parsed[0])
                group["runs"] += 1
    return [
        {
            "kind": "gpu_throttled",
            "severity": "warning",
            "where": where,
            "message": _throttle_message(reason, list(group["entries"].values()), group["runs"]),
        }
        for (where, reason), group in groups.items()
    ]


# A busy GPU whose SM clock averaged below this share of its maximum was held down, recorded
# reason or not (the H200 under a power-capped matmul ran at 1448 of 1980 MHz, 0.73).
LOW_CLOCK_SHARE = 0.8
BUSY_UTILIZATION_PCT = 50.0


def held_down(summary, gpu_indexes: list[int] | None = None) -> dict | None:
    """What a level's telemetry says of the clocks of the GPUs the server runs on (all
    sampled GPUs when gpu_indexes is None or none of them was sampled), for the speed model's
    warning: None without telemetry; else {"reason": the throttle reason held longest
    (power_cap, thermal, hw_slowdown), "clocks" for busy GPUs below LOW_CLOCK_SHARE of their
    maximum SM clock without a recorded reason, or None; "share": that reason's largest share
    of busy samples; "gpus": the GPUs it held; "sm_clock_mhz_mean" and "sm_clock_max_mhz"}.
    Entries of the wrong shape are skipped, as throttle_warnings skips them."""
    gpu = gpu_summary(summary)
    if gpu is None:
        return None
    wanted = set(gpu_indexes or ())
    entries = gpu.get("throttled")
    parsed = [
        found
        for entry in (entries if isinstance(entries, list) else [])[:MAX_THROTTLED_ENTRIES]
        if (found := _throttle_entry(entry)) is not None
    ]
    if wanted and any(p[1] in wanted for p in parsed):
        parsed = [p for p in parsed if p[1] in wanted]
    if parsed:
        strongest = max(
            REASON_WORDS, key=lambda r: max((p[2] for p in parsed if p[0] == r), default=0)
        )
        held = [p for p in parsed if p[0] == strongest]
        means = [p[3] for p in held if p[3] is not None]
        peaks = [p[4] for p in held if p[4] is not None]
        return {
            "reason": strongest,
            "share": max(p[2] for p in held),
            "gpus": sorted({p[1] for p in held}),
            "sm_clock_mhz_mean": sum(means) / len(means) if means else None,
            "sm_clock_max_mhz": max(peaks) if peaks else None,
        }
    low = []
    listed = gpu.get("gpus")
    for entry in (listed if isinstance(listed, list) else [])[: MAX_GPU_INDEX + 1]:
        if not isinstance(entry, dict):
            continue
        index = entry.get("index")
        if isinstance(index, bool) or not isinstance(index, int):
            continue
        if wanted and index not in wanted:
            continue
        clock = entry.get("sm_clock_mhz")
        mean = _number(clock.get("mean"), 0.0, MAX_CLOCK_MHZ) if isinstance(clock, dict) else None
        peak = _number(entry.get("sm_clock_max_mhz"), 1.0, MAX_CLOCK_MHZ)
        use = entry.get("utilization_pct")
        busy = _number(use.get("mean"), 0.0, 100.0) if isinstance(use, dict) else None
        if mean is None or peak is None or busy is None or busy < BUSY_UTILIZATION_PCT:
            continue
        if mean < LOW_CLOCK_SHARE * peak:
            low.append((index, mean, peak))
    if low:
        return {
            "reason": "clocks",
            "share": None,
            "gpus": sorted(i for i, _m, _p in low),
            "sm_clock_mhz_mean": sum(m for _i, m, _p in low) / len(low),
            "sm_clock_max_mhz": max(p for _i, _m, p in low),
        }
    return {
        "reason": None,
        "share": None,
        "gpus": [],
        "sm_clock_mhz_mean": None,
        "sm_clock_max_mhz": None,
    }


def gpu_list(indexes: list[int]) -> str:
    """GPU 3, or GPUs 0-7: for messages outside this module."""
    return _gpu_list(indexes) if indexes else "the GPUs"
