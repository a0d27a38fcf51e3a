"""What the client makes of a level: each request's record for the level file (record_of),
and whether the client itself limited what it measured (client_report).

Runs on the host that drives the benchmark, with the standard library only.
"""

from __future__ import annotations

import json
import sys

from ansible.module_utils.benchmark.client_events import counted, event_problem, number, token_ids
from ansible.module_utils.benchmark.client_stream import Tracker
from ansible.module_utils.benchmark.stats import (
    accepted_tokens_per_step,
    decode_steps,
    distribution,
    request_timings,
)

# The client is the limit when it is busy nearly all the time, or busy and so late that a
# burst of events (one per request per decode step) is not handled before the next is due.
# A late event loop in a mostly idle client means other processes hold the CPU: the timings
# are less precise (timing_reliable false: lag beyond the kit's 1 ms TTFT aim, with margin),
# but the client was not what limited the server.
SATURATED_CPU = 0.85
BUSY_CPU = 0.3
BEHIND_SHARE = 0.25
LATE_LAG_P99_MS = 2.0


META_FIELDS = (
    "completion_tokens",
    "spec_verify_ct",
    "spec_accept_length",
    "prompt_tokens",
    "cached_tokens",
    "finish_reason",
)


def record_of(tracker: Tracker, prompt: dict, prompt_sha: str) -> tuple[dict, list[float]]:
    """The request's record for the level file, and its per-token ITLs."""
    sent = tracker.connected or tracker.start
    record = {
        "index": tracker.index,
        "prompt_id": row_id(prompt.get("id")),
        "prompt_sha256": prompt_sha,
        "ok": False,
        "error": tracker.error or None,
        "ttft_ms": None,
        "e2e_ms": None,
        "tpot_ms": None,
        "output_tokens": 0,
        "connect_ms": (
            round((tracker.connected - tracker.start) * 1000.0, 3) if tracker.connected else None
        ),
        "events": [[round((t - sent) * 1000.0, 3), n] for t, n in tracker.events],
    }
    if tracker.last is None:
        if not tracker.error:
            record["error"] = "no event received"
        return record, []
    try:
        last = json.loads(tracker.last)
        first = json.loads(tracker.first) if tracker.first is not tracker.last else last
    except (ValueError, RecursionError) as error:
        record["error"] = f"undecodable event: {str(error)[:200]}"
        return record, []
    problem = event_problem(first) or event_problem(last)
    if problem:
        record["error"] = tracker.mask(problem)
        return record, []
    meta, first_meta = last["meta_info"], first["meta_info"]
    meta = {k: meta.get(k) for k in META_FIELDS}
    first_meta = {k: first_meta.get(k) for k in META_FIELDS}
    for name in ("completion_tokens", "spec_verify_ct", "prompt_tokens", "cached_tokens"):
        for where in (meta, first_meta):
            if not counted(where[name]):
                where[name] = None
    if not number(meta["spec_accept_length"]):
        meta["spec_accept_length"] = None
    timings = request_timings(sent, tracker.events, tracker.done_at)
    verify = meta["spec_verify_ct"]
    tokens = meta["completion_tokens"] or 0
    steps = decode_steps(first_meta, meta)
    finish = meta["finish_reason"]
    record.update(
        ok=not tracker.error,
        ttft_ms=round(timings["ttft_ms"], 3),
        e2e_ms=round(timings["e2e_ms"], 3),
        tpot_ms=round(timings["tpot_ms"], 4) if timings["tpot_ms"] is not None else None,
        output_tokens=tokens,
        prompt_tokens=meta["prompt_tokens"],
        cached_tokens=meta["cached_tokens"],
        spec_verify_ct=verify,
        accept_length=accepted_tokens_per_step(tokens, verify),
        spec_accept_length=meta["spec_accept_length"],
        decode_steps=steps,
        decode_ms=round(timings["decode_ms"], 3),
        step_ms=round(timings["decode_ms"] / steps, 4) if steps > 0 else None,
        finish_reason=str(finish.get("type"))[:40] if isinstance(finish, dict) else None,
        text=last.get("text"),
        output_ids=token_ids(last.get("output_ids")),
    )
    ids = record["output_ids"]
    if isinstance(ids, list) and len(ids) != tokens:
        # --incremental-streaming-output: the last event holds only its own tokens. Keeping
        # a fragment would make the losslessness check compare the wrong thing.
        record.update(text=None, output_ids=None, outputs_incomplete=True)
    return record, timings["itl_ms"] if record["ok"] else []


def row_id(value) -> str | int | None:
    """A prompt row's id as the level file keeps it: a string or an integer, else None."""
    if isinstance(value, str):
        return value[:200]
    return value if counted(value) else None


def client_report(level: dict, events: int) -> dict:
    """Whether the client limited what it measured. A level spread over several processes is
    judged process by process: each is an event loop of its own, and one falling behind
    delays its streams' stamps whatever the others do."""
    duration = max(level["ended"] - level["started"], 1e-9)
    parts = level.get("processes") or [
        {"cpu_s": level["cpu_s"], "wall_s": level["wall_s"], "lag_ms": level["lag_ms"]}
    ]
    lag = distribution(level["lag_ms"])
    gaps = [
        (t.events[-1][0] - t.events[0][0]) * 1000.0 / (len(t.events) - 1)
        for t in level["trackers"]
        if len(t.events) > 1
    ]
    event_gap = sum(gaps) / len(gaps) if gaps else 0.0
    reasons = []
    fractions, lag_p99s = [], []
    for position, part in enumerate(parts, 1):
        cpu_fraction = part["cpu_s"] / max(part["wall_s"], 1e-9)
        lag_p99 = distribution(part["lag_ms"])["p99"] or 0.0
        fractions.append(round(cpu_fraction, 4))
        lag_p99s.append(lag_p99)
        which = f"process {position} of {len(parts)}: " if len(parts) > 1 else ""
        if cpu_fraction >= SATURATED_CPU:
            reasons.append(f"{which}client CPU {cpu_fraction:.0%} of one core")
        # Events come in bursts, one per decode step: a loop still busy with one burst when
        # the next is due is falling behind, whatever its average CPU use.
        if cpu_fraction >= BUSY_CPU and event_gap and lag_p99 >= BEHIND_SHARE * event_gap:
            reasons.append(
                f"{which}event-loop lag p99 {lag_p99:.2f} ms against {event_gap:.2f} ms "
                f"between a request's events, at {cpu_fraction:.0%} CPU"
            )
    cpu_fraction = max(fractions)
    lag_p99 = max(lag_p99s)
    warnings = []
    if lag_p99 >= LATE_LAG_P99_MS and not reasons:
        warnings.append(
            f"event-loop lag p99 {lag_p99:.2f} ms while the client used {cpu_fraction:.0%} "
            "of a core: other processes compete for the CPU; timings are less precise"
        )
    report = {
        "cpu_s": round(level["cpu_s"], 4),
        # The busiest process's share of one core (every one's below, when several).
        "cpu_fraction": round(cpu_fraction, 4),
        "loop_lag_ms": lag,
        "events": events,
        "events_per_s": round(events / duration, 2),
        "event_gap_ms": round(event_gap, 4),
        "bytes_received": sum(t.nbytes for t in level["trackers"]),
        "saturated": bool(reasons),
        "saturated_reasons": reasons,
        "timing_reliable": lag_p99 < LATE_LAG_P99_MS,
        "warnings": warnings,
        "thresholds": {
            "saturated_cpu_fraction": SATURATED_CPU,
            "busy_cpu_fraction": BUSY_CPU,
            "behind_lag_share_of_event_gap": BEHIND_SHARE,
            "late_loop_lag_p99_ms": LATE_LAG_P99_MS,
        },
        "python": sys.version.split()[0],
    }
    if len(parts) > 1:
        report["processes"] = len(parts)
        report["process_cpu_fractions"] = fractions
    # A request-rate level: how late each request started against its schedule (the loop
    # being late, or the in-flight cap being full).
    lags = [(t.start - t.scheduled) * 1000.0 for t in level["trackers"] if t.scheduled is not None]
    if lags:
        report["arrival_lag_ms"] = distribution(lags)
    return report
