"""The report's figures, as PNG bytes: all_plots() draws every one of a report, in worker
processes when there is much to draw. Matplotlib's object API with the Agg canvas
(analysis/canvas.py): no pyplot state, no display needed.

Each function takes the summary table (analysis.tables.rows) and returns a Plot, or None when
the results hold nothing to draw (no DDTree configs, a single host). The throughput figures are
here; the DDTree budget figures in plots_ddtree.py, the latency ones in plots_latency.py, those
of measured against predicted in plots_predicted.py.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ProcessPoolExecutor

from ansible.module_utils.contract import metrics

from analysis import canvas, references
from analysis.canvas import Plot, colors, draw, labelled
from analysis.plots_ddtree import accept_vs_budget, decomposition
from analysis.plots_latency import (
    LATENCY_METRICS,
    cdf_level,
    cdf_samples,
    latency,
    latency_cdf,
    level_latencies,
    rate_plot,
    throughput_latency,
)
from analysis.plots_predicted import predicted_budget, predicted_concurrency
from analysis.results import Results, config_order, ratio
from analysis.slo import slo_text

__all__ = [
    "LATENCY_METRICS",
    "Plot",
    "accept_distribution",
    "accept_vs_budget",
    "across_hosts",
    "all_plots",
    "cdf_level",
    "cdf_samples",
    "colors",
    "compare_plot",
    "decomposition",
    "draw",
    "labelled",
    "latency",
    "latency_cdf",
    "level_latencies",
    "panel_groups",
    "pareto",
    "predicted_budget",
    "predicted_concurrency",
    "rate_plot",
    "run_decomposition",
    "speedup",
    "throughput",
    "throughput_latency",
]

# Rows of the summary table from which the figures are drawn in worker processes.
PARALLEL_ROWS = 200


def throughput(table: list[dict], palette: dict) -> canvas.Plot | None:
    keys, averaged = canvas.panel_keys(table)
    figure, axes = canvas.new_figure(len(keys))
    flagged = canvas.flagged_configs(table)
    card = references.DFLASH_K26_CARD["throughput"]
    levels = [r["concurrency"] for r in table]
    for axis, key in zip(axes, keys, strict=True):
        canvas.config_lines(axis, table, key, "output_tokens_per_s", palette, flagged)
        # The drafter card's point, where this panel is its prompt set and spans its level.
        if key[1] == card["prompt_set"] and min(levels) <= card["concurrency"] <= max(levels):
            axis.plot(
                [card["concurrency"]],
                [card["output_tokens_per_s"]],
                label="DFlash on Kimi K2.6, drafter card: GSM8K c32 (its own hardware)",
                **{**canvas.REFERENCE_STYLE, "markersize": 9},
            )
        _concurrency_panel(axis, key, averaged, levels, metrics.axis_label("output_tokens_per_s"))
    return canvas.Plot(
        "throughput",
        "Throughput against concurrency",
        "Output tokens/s of the whole server at each concurrency level, one line per serving "
        "config. Dashed: flagged by the losslessness check. Grey cross (GSM8K panels): DFlash "
        f"on Kimi K2.6 as its drafter's card gives it, {card['output_tokens_per_s']:g} tok/s at "
        f"concurrency {card['concurrency']}, on hardware and settings of its own.",
        canvas.png(figure),
    )


def _concurrency_panel(axis, key, averaged: bool, levels: list, ylabel: str) -> None:
    """A panel of a metric against concurrency: log2 levels, its host and prompt set, labels."""
    canvas.log2_axis(axis, levels)
    axis.set_title(canvas.panel_title(key, averaged), fontsize=10)
    axis.set_xlabel("concurrency (requests in flight)")
    axis.set_ylabel(ylabel)
    axis.grid(alpha=0.3)


def goodput(table: list[dict], palette: dict, slo: dict | None) -> canvas.Plot | None:
    """Goodput (requests/s whose own latencies meet every SLO) against concurrency, one line
    per config, each level's 95% interval over repeats as a bar; None without SLOs."""
    rows = [r for r in table if r.get("goodput_requests_per_s") is not None]
    if not slo or not rows:
        return None
    keys, averaged = canvas.panel_keys(rows)
    figure, axes = canvas.new_figure(len(keys))
    flagged = canvas.flagged_configs(rows)
    for axis, key in zip(axes, keys, strict=True):
        canvas.config_lines(axis, rows, key, "goodput_requests_per_s", palette, flagged)
        for row in rows:
            low, high = (
                row.get("goodput_requests_per_s_ci95_low"),
                row.get("goodput_requests_per_s_ci95_high"),
            )
            if (row["host"], row["prompt_set"]) == key and low is not None and high is not None:
                axis.vlines(row["concurrency"], low, high, color=palette[row["config"]], alpha=0.6)
        levels = [r["concurrency"] for r in rows]
        _concurrency_panel(
            axis, key, averaged, levels, metrics.axis_label("goodput_requests_per_s")
        )
    figure.suptitle(f"SLO: {slo_text(slo)}", fontsize=10)
    return canvas.Plot(
        "goodput",
        "Goodput against concurrency",
        f"Requests per second whose own TTFT, TPOT and end-to-end latency meet the SLO "
        f"({slo_text(slo)}), at each concurrency level, one line per serving config; a "
        "vertical bar is the level's 95% interval over repeats. Dashed: flagged by the "
        "losslessness check.",
        canvas.png(figure),
    )


def speedup(table: list[dict], palette: dict, reference: str) -> canvas.Plot | None:
    rows = [r for r in table if r["config"] != reference and r["speedup_vs_ar"] is not None]
    if not rows:
        return None
    keys, averaged = canvas.panel_keys(rows)
    figure, axes = canvas.new_figure(len(keys))
    flagged = canvas.flagged_configs(table)
    for axis, key in zip(axes, keys, strict=True):
        canvas.config_lines(axis, rows, key, "speedup_vs_ar", palette, flagged)
        axis.axhline(1.0, color=palette.get(reference, "#222222"), linewidth=1, label=reference)
        canvas.log2_axis(axis, [r["concurrency"] for r in rows])
        axis.set_title(canvas.panel_title(key, averaged), fontsize=10)
        axis.set_xlabel("concurrency")
        axis.set_ylabel(f"speedup over {reference} ({metrics.label('output_tokens_per_s')})")
        axis.grid(alpha=0.3)
    return canvas.Plot(
        "speedup",
        f"Speedup over {reference}",
        f"Output tokens/s of each config divided by {reference}'s on the same host, prompt set "
        "and concurrency. Speculation pays most at low concurrency, where decoding is memory "
        "bound; at high concurrency the verifier's extra tokens compete with other requests.",
        canvas.png(figure),
    )


def pareto(table: list[dict], palette: dict) -> canvas.Plot | None:
    rows = [
        r
        for r in table
        if r["tokens_per_s_per_gpu"] is not None and r["tokens_per_s_per_user"] is not None
    ]
    if not rows:
        return None
    hosts = sorted({r["host"] for r in rows})[: canvas.MAX_PANELS]
    figure, axes = canvas.new_figure(len(hosts), width=5.5, height=4.2)
    flagged = canvas.flagged_configs(table)
    for axis, host in zip(axes, hosts, strict=True):
        mine = [r for r in rows if r["host"] == host]
        points_all = []
        for config in sorted({r["config"] for r in mine}, key=config_order):
            cells: dict[int, list] = {}
            for row in mine:
                if row["config"] == config:
                    cells.setdefault(row["concurrency"], []).append(row)
            points = [
                (
                    canvas.mean(r["tokens_per_s_per_gpu"] for r in group),
                    canvas.mean(r["tokens_per_s_per_user"] for r in group),
                    concurrency,
                )
                for concurrency, group in sorted(cells.items())
            ]
            bad = (host, config) in flagged
            x = [p[0] for p in points]
            y = [p[1] for p in points]
            axis.plot(
                x,
                y,
                marker="o",
                color=palette[config],
                linestyle="--" if bad else "-",
                label=config + (" (flagged)" if bad else ""),
            )
            for px, py, concurrency in points:
                axis.annotate(
                    str(concurrency),
                    (px, py),
                    fontsize=6,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
            if not bad:
                points_all += [(px, py) for px, py, _ in points]
        frontier = _frontier(points_all)
        if len(frontier) > 1:
            fx, fy = zip(*frontier, strict=True)
            # Between two front points the better of the two is the right-hand one: "pre".
            axis.step(
                fx, fy, where="pre", color="#000000", alpha=0.35, linewidth=3, label="Pareto front"
            )
        axis.set_title(f"{host} - mean over prompt sets", fontsize=10)
        axis.set_xlabel(metrics.axis_label("tokens_per_s_per_gpu"))
        axis.set_ylabel(metrics.axis_label("tokens_per_s_per_user"))
        axis.grid(alpha=0.3)
    return canvas.Plot(
        "pareto",
        "Tokens/s per user against tokens/s per GPU",
        "Each point is one concurrency level (the number beside it). Up is a faster stream for "
        "each user, right is more work from each GPU; the grey line is the best trade available "
        "from the configs measured (flagged configs excluded).",
        canvas.png(figure),
    )


def _frontier(points: list[tuple]) -> list[tuple]:
    """Points not beaten on both axes, by ascending x."""
    best, out = -math.inf, []
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if y > best:
            out.append((x, y))
            best = y
    return sorted(out)


def accept_distribution(samples: dict[str, dict[str, list]], palette: dict) -> canvas.Plot | None:
    """samples: {panel: {config: per-request accept lengths}}."""
    if not samples:
        return None
    hosts = sorted(samples)[: canvas.MAX_PANELS]
    figure, axes = canvas.new_figure(len(hosts), width=6.0, height=3.8, columns=min(len(hosts), 2))
    for axis, host in zip(axes, hosts, strict=True):
        configs = sorted(samples[host], key=config_order)
        data, means = [], []
        for config in configs:
            values = samples[host][config]
            # Evenly spaced order statistics keep the shape and bound the drawing cost.
            stride = max(1, len(values) // 4000)
            data.append(sorted(values)[::stride])
            means.append(sum(values) / len(values))
        parts = axis.violinplot(data, showextrema=False, showmedians=True, widths=0.8)
        for body, config in zip(parts["bodies"], configs, strict=True):
            body.set_facecolor(palette[config])
            body.set_alpha(0.6)
        axis.scatter(
            range(1, len(configs) + 1), means, color="#000000", marker="_", s=200, label="mean"
        )
        axis.set_xticks(range(1, len(configs) + 1))
        axis.set_xticklabels(configs, rotation=30, ha="right", fontsize=8)
        axis.set_title(f"{host} - all prompt sets and levels", fontsize=10)
        axis.set_ylabel(f"{metrics.label('accept_length_mean')} per request")
        axis.grid(alpha=0.3, axis="y")
    return canvas.Plot(
        "accept_distribution",
        "Distribution of per-request accept length",
        "Each request's accepted tokens per verify step, (output tokens - 1) / "
        "meta_info.spec_verify_ct: the first token comes from prefill (SGLang's own "
        "spec_accept_length counts it too), over every prompt set and concurrency level; a bar "
        "marks the median, a dash the mean. A wide spread means acceptance depends strongly on "
        "the prompt.",
        canvas.png(figure),
    )


def across_hosts(table: list[dict]) -> canvas.Plot | None:
    hosts = sorted({r["host"] for r in table})
    if len(hosts) < 2:
        return None
    configs = sorted({r["config"] for r in table}, key=config_order)[:12]
    profile = {r["host"]: r["profile"] for r in table}
    figure, axes = canvas.new_figure(
        len(configs), width=4.4, height=3.4, columns=min(len(configs), 4)
    )
    # Only prompt sets every host ran, so the averages compare like with like.
    common = set.intersection(*({r["prompt_set"] for r in table if r["host"] == h} for h in hosts))
    for axis, config in zip(axes, configs, strict=True):
        for index, host in enumerate(hosts):
            cells: dict[int, list] = {}
            for row in table:
                if row["host"] == host and row["config"] == config and row["prompt_set"] in common:
                    cells.setdefault(row["concurrency"], []).append(row["output_tokens_per_s"])
            points = [
                (c, canvas.mean(v)) for c, v in sorted(cells.items()) if canvas.mean(v) is not None
            ]
            if points:
                x, y = zip(*points, strict=True)
                label = f"{host} ({profile[host]})" if profile[host] else host
                axis.plot(x, y, marker="o", color=f"C{index % 10}", label=label)
        canvas.log2_axis(axis, [r["concurrency"] for r in table])
        axis.set_title(config, fontsize=10)
        axis.set_xlabel("concurrency")
        axis.set_ylabel(metrics.axis_label("output_tokens_per_s"))
        axis.grid(alpha=0.3)
    return canvas.Plot(
        "across_hosts",
        "The same config across hosts",
        "Output tokens/s per config on each host (its hardware profile in brackets), averaged "
        f"over the prompt sets every host ran ({', '.join(sorted(common)) or 'none'}).",
        canvas.png(figure),
    )


def panel_groups(table: list[dict]) -> dict[str, str]:
    """Panel label per host: the host itself, or with more than MAX_HOST_PANELS hosts its
    hardware profile (hosts of one profile averaged), which keeps figures readable and their
    cost bounded; the across-hosts figure still shows every host."""
    hosts = sorted({r["host"] for r in table})
    if len(hosts) <= canvas.MAX_HOST_PANELS:
        return {h: h for h in hosts}
    profile = {r["host"]: r["profile"] or r["host"] for r in table}
    size = {p: sum(1 for h in hosts if profile[h] == p) for p in set(profile.values())}
    return {h: f"{profile[h]} ({size[profile[h]]} hosts, mean)" for h in hosts}


def _grouped(table: list[dict], groups: dict[str, str]) -> list[dict]:
    return [{**row, "host": groups[row["host"]]} for row in table]


def _samples(results: Results, groups: dict[str, str]) -> dict[str, dict[str, list]]:
    out: dict[str, dict[str, list]] = {}
    for level in results.levels:
        if len(level.accept):
            group = groups.get(level.host, level.host)
            out.setdefault(group, {}).setdefault(level.config, []).extend(level.accept)
    return out


def _job(job: tuple) -> canvas.Plot | None:
    return draw(*job)


def all_plots(
    results: Results,
    table: list[dict],
    reference: str,
    workers: int | None = None,
    label: str = "",
    cdf_concurrency: int | None = None,
    slo: dict | None = None,
) -> list[canvas.Plot]:
    """Every figure; drawn in worker processes when there is enough to draw (matplotlib
    spends ~0.1 s on each panel, and figures do not depend on each other). A label (e.g.
    "SIMULATED") goes into every image, title and caption."""
    palette = colors([r["config"] for r in table])
    groups = panel_groups(table)
    # The concurrency figures are of closed-loop levels; rate levels have their own.
    everything = _grouped(table, groups)
    grouped = [r for r in everything if r.get("request_rate") is None]
    table = [r for r in table if r.get("request_rate") is None]
    level = cdf_level(grouped, cdf_concurrency)
    jobs = [
        (function, args, label)
        for function, args in (
            (throughput, (grouped, palette)),
            (goodput, (grouped, palette, slo)),
            (speedup, (grouped, palette, reference)),
            (accept_vs_budget, (grouped,)),
            (decomposition, (grouped,)),
            (pareto, (grouped, palette)),
            (accept_distribution, (_samples(results, groups), palette)),
            (across_hosts, (table,)),
            (latency, (grouped, palette)),
            (throughput_latency, (grouped, palette)),
            (latency_cdf, (cdf_samples(results, groups, level), level, palette)),
            (rate_plot, (everything, palette)),
        )
    ]
    workers = workers if workers is not None else (os.cpu_count() or 1)
    if workers > 1 and len(table) >= PARALLEL_ROWS:
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
            made = list(pool.map(_job, jobs))
    else:
        made = [_job(job) for job in jobs]
    return [plot for plot in made if plot is not None]


def compare_plot(pairs: list[dict]) -> canvas.Plot | None:
    """Run B over run A per config and concurrency: throughput, step time, tokens per step."""
    keys = sorted({(r["host_a"], r["host_b"], r["prompt_set"]) for r in pairs})[:6]
    if not keys:
        return None
    palette = colors([r["config"] for r in pairs])
    figure, grid = canvas.new_figure(3 * len(keys), width=4.6, columns=3)
    panels = tuple(
        (name, f"{metrics.label(name)}, B / A")
        for name in ("output_tokens_per_s", "step_ms", "accepted_tokens_per_step")
    )
    for index, key in enumerate(keys):
        mine = [r for r in pairs if (r["host_a"], r["host_b"], r["prompt_set"]) == key]
        for column, (name, label) in enumerate(panels):
            axis = grid[index * 3 + column]
            for config in sorted({r["config"] for r in mine}, key=config_order):
                points = []
                for row in sorted(mine, key=lambda r: r["concurrency"]):
                    a, b = row[f"{name}_a"], row[f"{name}_b"]
                    quotient = ratio(b, a) if row["config"] == config else None
                    if quotient is not None:
                        points.append((row["concurrency"], quotient))
                if points:
                    x, y = zip(*points, strict=True)
                    axis.plot(x, y, marker="o", color=palette[config], label=config)
            axis.axhline(1.0, color="#888888", linewidth=1)
            canvas.log2_axis(axis, [r["concurrency"] for r in mine])
            axis.set_title(f"{key[0]} -> {key[1]} - {key[2]}", fontsize=9)
            axis.set_xlabel("concurrency")
            axis.set_ylabel(label, fontsize=8)
            axis.grid(alpha=0.3)
    return canvas.Plot(
        "compare",
        "Run B against run A",
        "Ratios of run B to run A for the same config, prompt set and concurrency: throughput, "
        "and the two factors it is made of (tokens/s = accepted tokens per step / step time).",
        canvas.png(figure),
    )


def run_decomposition(table: list[dict], side: str, heading: str) -> canvas.Plot | None:
    """One run's decomposition in a comparison: drawn as its own report draws it (hosts
    grouped alike), named decomposition-<side> and headed with the run and its model."""
    plot = decomposition(_grouped(table, panel_groups(table)), heading)
    if plot is not None:
        plot.name = f"decomposition-{side}"
    return plot
