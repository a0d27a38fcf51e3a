"""The latency figures: TTFT, ITL and TPOT against concurrency, throughput against end-to-end
latency, the TTFT and ITL distributions at one level (read again from the level files' token
events), and the rate levels.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from ansible.module_utils.contract import metrics

from analysis import canvas
from analysis.results import DEFAULT_MAX_FILE_BYTES, Results, config_order, read_regular

# Latency figures draw three panels per key: past this many (host, prompt set) keys the prompt
# sets are averaged per host, which keeps the figure readable and its cost bounded.
MAX_LATENCY_KEYS = 4
LATENCY_METRICS = tuple(
    (field, metrics.label(f"{field}_p50")) for field in ("ttft_ms", "itl_ms", "tpot_ms")
)
# The CDFs read the chosen level's files again for each request's token events: at most this
# many files (one per panel and config), records per file and points per curve.
MAX_CDF_CONFIGS = 12
MAX_CDF_RECORDS = 20_000
MAX_CDF_POINTS = 4000


def _latency_keys(table: list[dict]) -> tuple[list[tuple], bool]:
    keys = sorted({(r["host"], r["prompt_set"]) for r in table})
    if len(keys) <= MAX_LATENCY_KEYS:
        return keys, False
    return sorted({(r["host"], None) for r in table})[:MAX_LATENCY_KEYS], True


def latency(table: list[dict], palette: dict) -> canvas.Plot | None:
    """TTFT, ITL and TPOT p50 (dashed) and p99 (solid) against concurrency, per config."""
    rows = [r for r in table if r.get("ttft_ms_p99") is not None]
    if not rows:
        return None
    keys, averaged = _latency_keys(rows)
    figure, axes = canvas.new_figure(3 * len(keys), width=4.6, columns=3)
    flagged = canvas.flagged_configs(table)
    levels = [r["concurrency"] for r in rows]
    for index, key in enumerate(keys):
        for column, (metric, name) in enumerate(LATENCY_METRICS):
            axis = axes[index * 3 + column]
            for stat, style in (("p99", "-"), ("p50", "--")):
                for config, points in canvas.series(rows, key, f"{metric}_{stat}").items():
                    x, y = zip(*points, strict=True)
                    bad = (key[0], config) in flagged
                    axis.plot(
                        x,
                        y,
                        marker="o" if stat == "p99" else ".",
                        color=palette[config],
                        linestyle=style,
                        alpha=1.0 if stat == "p99" else 0.7,
                        label=(config + (" (flagged)" if bad else "")) if stat == "p99" else "_",
                    )
            canvas.log2_axis(axis, levels)
            axis.set_yscale("log")
            axis.set_title(f"{name} - {canvas.panel_title(key, averaged)}", fontsize=9)
            axis.set_xlabel("concurrency")
            axis.set_ylabel(
                f"{name} {metrics.metric(f'{metric}_p50').unit} (p99 solid, p50 dashed)",
                fontsize=8,
            )
            axis.grid(alpha=0.3)
    return canvas.Plot(
        "latency",
        "TTFT, ITL and TPOT against concurrency",
        "Per config, the level's 99th (solid) and 50th (dashed) percentiles of time to first "
        "token, inter-token latency (each event's gap spread over the tokens it carried) and "
        "time per output token (a request's decode time over its tokens after the first), "
        "closed-loop levels only, on a log scale.",
        canvas.png(figure),
        details={"panels": [canvas.panel_title(k, averaged) for k in keys]},
    )


def throughput_latency(table: list[dict], palette: dict) -> canvas.Plot | None:
    """Output tokens/s against mean E2E latency, one line per config, points by concurrency."""
    rows = [r for r in table if r.get("e2e_ms_mean") is not None and r["output_tokens_per_s"]]
    if not rows:
        return None
    keys, averaged = canvas.panel_keys(rows)
    figure, axes = canvas.new_figure(len(keys), width=5.5, height=4.2)
    flagged = canvas.flagged_configs(table)
    for axis, key in zip(axes, keys, strict=True):
        latency_s = canvas.series(rows, key, "e2e_ms_mean")
        throughput_s = canvas.series(rows, key, "output_tokens_per_s")
        for config, points in latency_s.items():
            tokens = dict(throughput_s.get(config, []))
            line = [(ms / 1000.0, tokens[c], c) for c, ms in points if c in tokens]
            if not line:
                continue
            bad = (key[0], config) in flagged
            axis.plot(
                [p[0] for p in line],
                [p[1] for p in line],
                marker="o",
                color=palette[config],
                linestyle="--" if bad else "-",
                label=config + (" (flagged)" if bad else ""),
            )
            for x, y, concurrency in line:
                axis.annotate(
                    f"c{concurrency}", (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points"
                )
        axis.set_title(canvas.panel_title(key, averaged), fontsize=10)
        axis.set_xlabel("mean end-to-end latency per request (s)")
        axis.set_ylabel(metrics.axis_label("output_tokens_per_s"))
        axis.grid(alpha=0.3)
    return canvas.Plot(
        "throughput_latency",
        "Throughput against end-to-end latency",
        "Each point is one closed-loop concurrency level (its label): output tokens/s of the "
        "server against the mean time a request took from sending to its last token. Up and to "
        "the left is better; where a line turns right without rising, more concurrency only "
        "adds queueing.",
        canvas.png(figure),
    )


def latency_cdf(samples: dict, concurrency: int | None, palette: dict) -> canvas.Plot | None:
    """samples: {panel: {config: {"ttft": [...], "itl": [...], "prompt_sets": [...]}}}."""
    if not samples or concurrency is None:
        return None
    panels = sorted(samples)[: canvas.MAX_HOST_PANELS]
    figure, axes = canvas.new_figure(2 * len(panels), width=5.0, columns=2)
    drawn = {}
    for index, panel in enumerate(panels):
        configs = sorted(samples[panel], key=config_order)
        for column, (metric, name) in enumerate(
            (key, metrics.label(f"{key}_ms_p50")) for key in ("ttft", "itl")
        ):
            axis = axes[index * 2 + column]
            for config in configs:
                values = sorted(samples[panel][config][metric])
                if not values:
                    continue
                stride = max(1, len(values) // MAX_CDF_POINTS)
                points = values[::stride]
                if points[-1] != values[-1]:
                    points.append(values[-1])
                shares = [min(1.0, (i * stride + 1) / len(values)) for i in range(len(points))]
                shares[-1] = 1.0
                axis.plot(points, shares, color=palette[config], label=config, linewidth=1.4)
                drawn.setdefault(panel, {}).setdefault(config, {})[metric] = len(values)
            sets = sorted({s for c in configs for s in samples[panel][c]["prompt_sets"]})
            axis.set_xscale("log")
            axis.set_ylim(0, 1.0)
            axis.set_title(f"{name} at c{concurrency} - {panel} ({', '.join(sets)})", fontsize=9)
            per = "request" if metric == "ttft" else "token"
            axis.set_xlabel(f"{name} per {per} ({metrics.metric(f'{metric}_ms_p50').unit})")
            axis.set_ylabel("share at or below")
            axis.grid(alpha=0.3)
    return canvas.Plot(
        "latency_cdf",
        f"TTFT and ITL distributions at concurrency {concurrency}",
        f"Cumulative distributions at concurrency {concurrency}, one curve per config: each "
        "request's time to first token, and each token's inter-token latency (an event's gap "
        "spread over the tokens it carried), from the request records of the level's files. "
        "Further left is faster; the top of each curve is its tail.",
        canvas.png(figure),
        details={"concurrency": concurrency, "counts": drawn},
    )


def rate_plot(table: list[dict], palette: dict) -> canvas.Plot | None:
    """Rate levels (r<R>.json): output tokens/s and TTFT p99 against the request rate."""
    rows = [r for r in table if r.get("request_rate") is not None]
    if not rows:
        return None
    keys, averaged = _latency_keys(rows)
    figure, axes = canvas.new_figure(2 * len(keys), width=5.0, columns=2)
    for index, key in enumerate(keys):
        for column, (metric, name) in enumerate(
            (
                ("output_tokens_per_s", metrics.axis_label("output_tokens_per_s")),
                ("ttft_ms_p99", canvas.stat_label(metrics.metric("ttft_ms_p99"))),
            )
        ):
            axis = axes[index * 2 + column]
            for config, points in canvas.series(rows, key, metric, x="request_rate").items():
                x, y = zip(*points, strict=True)
                axis.plot(x, y, marker="o", color=palette[config], label=config)
            axis.set_title(f"{name} - {canvas.panel_title(key, averaged)}", fontsize=9)
            axis.set_xlabel("request rate (requests/s, Poisson arrivals)")
            axis.set_ylabel(name)
            axis.grid(alpha=0.3)
    return canvas.Plot(
        "rate",
        "Throughput and TTFT against request rate",
        "Rate levels: requests arrive as a Poisson process at the given rate (open loop), one "
        "line per config. Throughput follows the rate until the server saturates; past that "
        "point TTFT p99 climbs as requests queue.",
        canvas.png(figure),
    )


def cdf_level(table: list[dict], chosen: int | None = None) -> int | None:
    """The concurrency the CDFs are drawn at: the chosen one, else the highest closed-loop."""
    levels = {r["concurrency"] for r in table if r.get("request_rate") is None}
    if chosen is not None:
        return chosen if chosen in levels else None
    return max(levels, default=None)


_OK_FIELD = re.compile(rb'\n   "ok": (true|false)')
_EVENTS_START = re.compile(rb'\n   "events": \[')
_EVENT_PAIR = re.compile(rb"\[\n     ([^,\n]+),\n     ([^\n]+)\n    \]")


def level_latencies(path: Path, limit: int = DEFAULT_MAX_FILE_BYTES) -> tuple[list, list]:
    """(each ok request's TTFT, each token's ITL) in ms from one level file, at most
    MAX_CDF_RECORDS records. Events are (ms since sent, cumulative tokens): a gap is split
    over the tokens its event brought, as the benchmark computes itl_ms. The module's layout
    is read with regular expressions; anything else through a full parse."""
    data, _problem = read_regular(path, str(path), limit)
    if data is None:
        return [], []
    records = _fast_events(data)
    if records is None:
        try:
            document = json.loads(data)
            records = [
                (r.get("ok") is True, r.get("events") or [])
                for r in document.get("requests", [])[:MAX_CDF_RECORDS]
                if isinstance(r, dict)
            ]
        except (ValueError, RecursionError, AttributeError):
            return [], []
    ttft, itl = [], []
    for ok, events in records[:MAX_CDF_RECORDS]:
        if not ok or not events:
            continue
        try:
            pairs = [(float(t), int(n)) for t, n in events]
        except (TypeError, ValueError):
            continue
        if not all(math.isfinite(t) and t >= 0 for t, _ in pairs):
            continue
        ttft.append(pairs[0][0])
        last_time, last_tokens = pairs[0]
        for when, tokens in pairs[1:]:
            new = tokens - last_tokens
            if new <= 0:
                continue
            itl.extend([(when - last_time) / new] * min(new, 4096))
            last_time, last_tokens = when, tokens
    return ttft, itl


def _fast_events(data: bytes) -> list | None:
    """[(ok, [(ms, tokens), ...])] per record of the module's layout (indent 1: a record's
    keys three spaces in, its events' pairs four), else None."""
    oks = _OK_FIELD.findall(data)
    starts = [match.end() for match in _EVENTS_START.finditer(data)]
    if not oks or len(oks) != len(starts):
        return None
    records = []
    for ok, start in zip(oks, starts, strict=True):
        if ok != b"true" or data.startswith(b"]", start):
            records.append((False, []))
        else:
            end = data.find(b"\n   ]", start)
            if end < 0:
                return None
            records.append((True, _EVENT_PAIR.findall(data, start, end)))
        if len(records) >= MAX_CDF_RECORDS:
            break
    return records


def cdf_samples(
    results: Results, groups: dict[str, str], concurrency: int | None
) -> dict[str, dict]:
    """The CDFs' data at one concurrency: per panel group and config, one level file's (the
    first prompt set's, on the group's first host), so the cost is a file per curve."""
    if concurrency is None:
        return {}
    picked: dict[tuple, object] = {}
    for level in results.levels:
        if level.request_rate is not None or level.concurrency != concurrency or level.repeat > 1:
            continue
        key = (groups.get(level.host, level.host), level.config)
        if key not in picked:
            picked[key] = level
    out: dict[str, dict] = {}
    drawn_at_most = MAX_CDF_CONFIGS * canvas.MAX_HOST_PANELS
    for (group, config), level in list(picked.items())[:drawn_at_most]:
        # TTFT from the records' own ttft_ms (read already); ITL from their token events.
        _ttft, itl = level_latencies(Path(results.root) / level.path)
        out.setdefault(group, {})[config] = {
            "ttft": [v for v in level.ttft if not math.isnan(v)],
            "itl": itl,
            "prompt_sets": [level.prompt_set],
        }
    return out
