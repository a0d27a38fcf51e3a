"""A trial's goodput per concurrency band, read from the level files its benchmark brought to the
controller (results/<run>/<host>/<trial>/<prompt set>/c<N>[.rep<k>].json): requests/s whose
own TTFT, TPOT and E2E meet the SLO (module_utils/contract/slo.py, the report's own rule), with
a 95% interval. Level files are outside input: read bounded, every field type-checked; a file
that is not a level counts as no measurement, never as a figure."""

from __future__ import annotations

import math
import os

from ansible.module_utils.contract.intervals import mean_interval
from ansible.module_utils.contract.level import LEVEL_KIND, parse_level_file
from ansible.module_utils.contract.slo import good_requests
from ansible.module_utils.host.helpers import read_json_bounded

# A trial's level is a few hundred requests: far under this.
MAX_TRIAL_LEVEL_BYTES = 64 << 20
MAX_REQUESTS = 100_000
# A goodput over a single run: the 95% Wilson interval of its fraction of good requests.
Z_95 = 1.96


class ScoreError(ValueError):
    """A level file that cannot be scored; the message names the file and the field."""


def _number(value) -> float:
    """A request's latency as a float, NaN where it has none (null) or is no finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value) if math.isfinite(value) else math.nan


def read_level(path: str) -> dict:
    """{duration_s, ttft, tpot, e2e, requests, failed} of one level file; ScoreError otherwise."""
    try:
        level = read_json_bounded(path, MAX_TRIAL_LEVEL_BYTES)
    except ValueError as exc:
        raise ScoreError(f"{exc} (a trial's level file)") from None
    if not isinstance(level, dict) or level.get("kind") != LEVEL_KIND:
        raise ScoreError(f"{path}: not a level file (kind {LEVEL_KIND})")
    summary, requests = level.get("summary"), level.get("requests")
    duration = summary.get("duration_s") if isinstance(summary, dict) else None
    if isinstance(duration, bool) or not isinstance(duration, (int, float)):
        raise ScoreError(f"{path}: summary.duration_s is not a number")
    if not math.isfinite(duration) or duration <= 0:
        raise ScoreError(f"{path}: summary.duration_s {duration} is not above 0")
    if not isinstance(requests, list) or len(requests) > MAX_REQUESTS:
        raise ScoreError(f"{path}: requests is not a list of at most {MAX_REQUESTS}")
    rows = [r for r in requests if isinstance(r, dict)]
    if len(rows) != len(requests):
        raise ScoreError(f"{path}: a request record is not an object")
    ok = [r.get("ok") is True for r in rows]

    def latencies(field: str, ok_only: bool) -> list[float]:
        # A failed request meets no SLO: its TTFT and E2E count as none.
        return [
            _number(r.get(field)) if fine or not ok_only else math.nan
            for r, fine in zip(rows, ok, strict=True)
        ]

    return {
        "duration_s": float(duration),
        "requests": len(rows),
        "failed": ok.count(False),
        "ttft": latencies("ttft_ms", True),
        "tpot": latencies("tpot_ms", False),
        "e2e": latencies("e2e_ms", True),
    }


def wilson(good: int, total: int) -> tuple[float, float]:
    """The 95% Wilson interval of a fraction good/total (total above 0)."""
    share = good / total
    denominator = 1 + Z_95**2 / total
    centre = (share + Z_95**2 / (2 * total)) / denominator
    half = Z_95 * math.sqrt(share * (1 - share) / total + Z_95**2 / (4 * total**2)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def level_goodput(paths: list[str], slo: dict) -> dict:
    """Goodput over a level's repeats: their mean, and its 95% interval (Student's t over the
    repeats with two or more, else Wilson's on the one run's share of good requests, times its
    requests per second); requests and failures summed."""
    runs = [read_level(path) for path in paths]
    if not runs:
        raise ScoreError("no level file to score")
    rates = []
    for run in runs:
        good = good_requests(run["ttft"], run["tpot"], run["e2e"], slo)
        run["good"] = good
        rates.append(good / run["duration_s"])
    mean = sum(rates) / len(rates)
    interval = mean_interval(rates)
    if interval is None:
        run = runs[0]
        if run["requests"]:
            low, high = wilson(run["good"], run["requests"])
            per_second = run["requests"] / run["duration_s"]
            interval = (low * per_second, high * per_second)
        else:
            interval = (0.0, 0.0)
    return {
        "goodput": round(mean, 6),
        "low": round(max(interval[0], 0.0), 6),
        "high": round(interval[1], 6),
        "repeats": len(runs),
        "requests": sum(r["requests"] for r in runs),
        "good": sum(r["good"] for r in runs),
        "failed": sum(r["failed"] for r in runs),
        "seconds": round(sum(r["duration_s"] for r in runs), 3),
    }


def trial_scores(trial_dir: str, bands: list[int], slo: dict) -> dict:
    """{band: level_goodput} of the trial's level files at each band's concurrency, over every
    prompt set folder under trial_dir (sets pooled: a band's runs are all its files). A band
    without a file is missing (None): the trial did not reach it."""
    found: dict[int, list[str]] = {band: [] for band in bands}
    try:
        sets = sorted(os.listdir(trial_dir))
    except OSError:
        return dict.fromkeys(bands)
    for name in sets:
        folder = os.path.join(trial_dir, name)
        if os.path.islink(folder) or not os.path.isdir(folder):
            continue
        for file in sorted(os.listdir(folder)):
            parsed = parse_level_file(file)
            path = os.path.join(folder, file)
            if parsed is None or os.path.islink(path) or not os.path.isfile(path):
                continue
            concurrency = parsed[0]
            if concurrency in found:
                found[concurrency].append(path)
    return {band: level_goodput(paths, slo) if paths else None for band, paths in found.items()}
