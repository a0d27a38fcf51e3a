"""The benchmark's figures, shared by sglang_benchmark and benchmark_lossless: per-request
timings, the level's summary, the server's counters and the record of its start, and the
losslessness comparison. The stream parser is stream.py, chat templates are chat.py.

Standard library only: this runs on GPU hosts under whatever Python they have.

The stream's shape (SGLang 0.5.23, python/sglang/srt/managers/tokenizer_manager.py
_handle_batch_output): `text` and `output_ids` are cumulative; the first event carries the
one token prefill produced; each later event one verify step's tokens (the accepted drafts
and the bonus token), or one token without speculation; meta_info.completion_tokens counts
them all. Only the last event carries spec_verify_ct (verify steps, the prefill token being
none of them) and spec_accept_length = completion_tokens / spec_verify_ct, which counts the
prefill token as if a verify step had produced it. The kit's accepted tokens per step
leaves it out: (completion_tokens - 1) / spec_verify_ct, the tokens each verify step added.
"""

from __future__ import annotations

import math

from ansible.module_utils.contract.level import SCHEMA_VERSION  # noqa: F401  (re-exported)


def percentile(ordered: list[float], fraction: float) -> float:
    """Linear interpolation between closest ranks (numpy's default) of sorted values."""
    if not ordered:
        return 0.0
    position = (len(ordered) - 1) * fraction
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def distribution(values: list[float]) -> dict:
    """mean, p50, p90, p99, max and count, rounded to microseconds when in ms."""
    ordered = sorted(values)
    if not ordered:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None, "count": 0}
    return {
        "mean": round(sum(ordered) / len(ordered), 4),
        "p50": round(percentile(ordered, 0.5), 4),
        "p90": round(percentile(ordered, 0.9), 4),
        "p99": round(percentile(ordered, 0.99), 4),
        "max": round(ordered[-1], 4),
        "count": len(ordered),
    }


def request_timings(start: float, events: list[tuple[float, int]], done: float | None) -> dict:
    """Per-request timings from (arrival time, cumulative completion tokens) of each event.

    TTFT is the first event's arrival. An event's gap to the previous one is split evenly
    over the tokens it carries (speculative decoding delivers several per event), so ITL is
    per token; an event that carries none adds its gap to the next. TPOT is the decode time
    after the first event over the tokens that came after it. E2E ends at [DONE] (or the last
    event when the stream ended without it).
    """
    itl: list[float] = []
    if not events:
        return {"ttft_ms": None, "e2e_ms": None, "tpot_ms": None, "itl_ms": itl, "decode_ms": 0.0}
    first_time, first_tokens = events[0]
    last_time, last_tokens = first_time, first_tokens
    for when, tokens in events[1:]:
        new = tokens - last_tokens
        if new <= 0:
            continue
        gap = (when - last_time) * 1000.0 / new
        itl.extend([gap] * new)
        last_time, last_tokens = when, tokens
    decode_ms = (last_time - first_time) * 1000.0
    after_first = last_tokens - first_tokens
    end = done if done is not None else last_time
    return {
        "ttft_ms": (first_time - start) * 1000.0,
        "e2e_ms": (end - start) * 1000.0,
        "tpot_ms": decode_ms / after_first if after_first > 0 else None,
        "itl_ms": itl,
        "decode_ms": decode_ms,
    }


def decode_steps(first_meta: dict, last_meta: dict) -> int:
    """Forward steps between the first and the last event: verify steps under speculation,
    one per token without it.

    The first event carries the prefill token, so every verify step comes after it; SGLang
    reports spec_verify_ct only on the last event (a first event that had one would be
    subtracted, for servers that report it earlier)."""
    if last_meta.get("spec_verify_ct") is not None:
        return int(last_meta["spec_verify_ct"]) - int(first_meta.get("spec_verify_ct") or 0)
    return int(last_meta.get("completion_tokens") or 0) - int(
        first_meta.get("completion_tokens") or 0
    )


def accepted_tokens_per_step(completion_tokens: int, verify_steps) -> float | None:
    """Tokens each verify step added: (completion tokens - 1) / verify steps, the prefill
    token left out. SGLang's spec_accept_length divides all completion tokens, the prefill
    token included, by the verify steps. None without verify steps."""
    if not verify_steps or verify_steps <= 0 or completion_tokens < 1:
        return None
    return (completion_tokens - 1) / verify_steps


def _weighted(records: list[dict], field: str) -> float | None:
    """Mean of a per-request field weighted by each request's output tokens."""
    pairs = [(r["output_tokens"], r.get(field)) for r in records if r.get(field) is not None]
    weight = sum(tokens for tokens, _ in pairs)
    return round(sum(t * v for t, v in pairs) / weight, 4) if weight else None


def summarize_level(requests: list[dict], duration_s: float, itl_ms: list[float]) -> dict:
    """The contract's `summary` of one concurrency level from its request records."""
    ok = [r for r in requests if r["ok"]]
    tokens = sum(r["output_tokens"] for r in ok)
    verify = [r for r in ok if r.get("spec_verify_ct")]
    steps = sum(r.get("decode_steps") or 0 for r in ok)
    decode_ms = sum(r.get("decode_ms") or 0.0 for r in ok)
    latency = sum(r["e2e_ms"] for r in ok if r.get("e2e_ms") is not None) / 1000.0
    return {
        "output_tokens_per_s": round(tokens / duration_s, 3) if duration_s > 0 else None,
        "requests_per_s": round(len(ok) / duration_s, 4) if duration_s > 0 else None,
        "ttft_ms": distribution([r["ttft_ms"] for r in ok if r.get("ttft_ms") is not None]),
        "itl_ms": distribution(itl_ms),
        "tpot_ms": distribution([r["tpot_ms"] for r in ok if r.get("tpot_ms") is not None]),
        "e2e_ms": distribution([r["e2e_ms"] for r in ok if r.get("e2e_ms") is not None]),
        # Per-request accept lengths (tokens per verify step, the prefill token left out)
        # weighted by the tokens each request produced, so a short answer does not count as
        # much as a long one. 1.0 without speculation.
        "accept_length_mean": (
            _weighted(verify, "accept_length") if verify else (1.0 if ok else None)
        ),
        # SGLang's own per-request spec_accept_length (prefill token included), weighted the
        # same way, for comparison. None without speculation.
        "spec_accept_length_mean": _weighted(verify, "spec_accept_length"),
        # The decomposition tok/s = accepted tokens per step / step time, per request: the
        # tokens the verify steps added over the verify steps, summed over requests.
        "step_ms": round(decode_ms / steps, 4) if steps else None,
        "accepted_tokens_per_step": (
            round(
                sum(r["output_tokens"] - 1 for r in verify)
                / sum(r["spec_verify_ct"] for r in verify),
                4,
            )
            if verify
            else (1.0 if ok else None)
        ),
        "requests_ok": len(ok),
        "requests_failed": len(requests) - len(ok),
        "output_tokens": tokens,
        "duration_s": round(duration_s, 4),
        # Mean requests in flight (Little's law): below the level when the server or the
        # prompts could not keep it busy.
        "effective_concurrency": round(latency / duration_s, 3) if duration_s > 0 else None,
    }


def parse_metrics(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sums of Prometheus samples by metric name over all label sets."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in names:
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if math.isfinite(value):
            totals[name] = totals.get(name, 0.0) + value
    return totals


def startup_record(info: dict):
    """What identifies one start of the server in its /server_info: `startup_time`.

    In SGLang 0.5.23 that is not a timestamp but the durations measured while starting
    (python/sglang/srt/observability/startup_time.py build_engine_startup_time: load_weight,
    kv_cache_allocation, scheduler_e2e, cuda_graph per phase, tokenizer_e2e, in seconds), set
    once by TokenizerManager.set_startup_time; a restarted server measures new ones, equal
    to the old to the last bit only by accident. A number (older releases) is kept as it is.
    Anything else, or a record too large to be that, gives None.
    """
    value = info.get("startup_time") if isinstance(info, dict) else None
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if not isinstance(value, dict) or len(value) > 32:
        return None
    record = {}
    for key, item in value.items():
        if isinstance(item, dict) and len(item) <= 32:
            item = {
                str(k): v
                for k, v in item.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
        elif not isinstance(item, (int, float)) or isinstance(item, bool):
            continue
        record[str(key)[:64]] = item
    return record or None


def server_delta(before: dict, after: dict) -> dict:
    """Server counters over one level: /metrics differences, and whether the server restarted
    in between (another startup record in /server_info, or a counter that went down).

    From the counters: SGLang's accept length (generation tokens / verify calls, each
    request's prefill token included) and accepted tokens per step (the same without one
    prefill token per finished request), server-side views of the client's figures."""
    delta = {}
    for name, value in after.get("metrics", {}).items():
        if name in before.get("metrics", {}):
            delta[name] = value - before["metrics"][name]
    restarted = any(value < 0 for value in delta.values())
    if before.get("startup_time") is not None and after.get("startup_time") is not None:
        restarted = restarted or before["startup_time"] != after["startup_time"]
    tokens = delta.get("sglang:generation_tokens_total")
    steps = delta.get("sglang:spec_verify_calls_total")
    finished = delta.get("sglang:num_requests_total")
    counted = not restarted and bool(tokens) and bool(steps) and steps > 0
    return {
        "metrics": delta,
        "spec_accept_length": round(tokens / steps, 4) if counted else None,
        "accepted_tokens_per_step": (
            round((tokens - finished) / steps, 4) if counted and finished is not None else None
        ),
        "restarted": restarted,
    }


def output_tokens_of(record: dict) -> list:
    """What to compare token for token: the server's output ids, else whitespace words."""
    ids = record.get("output_ids")
    if ids:
        return list(ids)
    return (record.get("text") or "").split()


def compare_outputs(reference: list[dict], candidate: list[dict]) -> dict:
    """Token-for-token comparison of two runs on the same prompts, request by request.

    Tokens after the first divergence count as mismatched (they were produced from a
    different prefix); a request that is only longer or shorter diverges where the shorter
    one ends. mismatch_rate = mismatched tokens / compared tokens.
    """
    by_index = {r["index"]: r for r in reference if r.get("ok")}
    compared = mismatched = requests = diverged = 0
    first: list[int] = []
    for record in candidate:
        base = by_index.get(record.get("index"))
        if not record.get("ok") or base is None:
            continue
        if record.get("prompt_sha256") != base.get("prompt_sha256"):
            continue
        if record.get("outputs_incomplete") or base.get("outputs_incomplete"):
            continue  # the server streamed increments: no whole output was kept
        a, b = output_tokens_of(base), output_tokens_of(record)
        length = max(len(a), len(b))
        common = 0
        for left, right in zip(a, b):  # noqa: B905 - stops at the shorter on purpose
            if left != right:
                break
            common += 1
        requests += 1
        compared += length
        mismatched += length - common
        if common < length:
            diverged += 1
            first.append(common)
    return {
        "requests_compared": requests,
        "requests_mismatched": diverged,
        "tokens_compared": compared,
        "tokens_mismatched": mismatched,
        "mismatch_rate": round(mismatched / compared, 6) if compared else None,
        "request_mismatch_rate": round(diverged / requests, 6) if requests else None,
        "first_divergence": sorted(first)[:64],
    }
