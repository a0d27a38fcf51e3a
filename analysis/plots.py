"""The report's figures, as PNG bytes. Matplotlib's object API with the Agg canvas: no pyplot
state, no display needed.

Each function takes the summary table (analysis.tables.rows) and returns a Plot, or None when
the results hold nothing to draw (no DDTree configs, a single host).
"""

from __future__ import annotations

import io
import math
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis import references
from analysis.results import Results, config_order

DPI = 96
MAX_PANELS = 10
MAX_HOST_PANELS = 4
PARALLEL_ROWS = 200
FIXED_COLORS = {"ar": "#222222", "eagle3": "#e377c2", "dflash": "#1f77b4"}
OTHER_COLORS = ("#ff7f0e", "#8c564b", "#17becf", "#bcbd22", "#7f7f7f", "#d62728")
REFERENCE_STYLE = {"color": "#888888", "marker": "x", "linestyle": ":", "markersize": 7}


@dataclass
class Plot:
    name: str  # file name, name.png
    title: str
    caption: str
    png: bytes


def colors(configs: list[str]) -> dict[str, str]:
    """A stable color per config: fixed for ar, eagle3, dflash; DDTree budgets along a
    sequential map (small budgets light, large dark), so the budget reads off the color."""
    from matplotlib import colormaps

    ordered = sorted(set(configs), key=config_order)
    trees = [c for c in ordered if config_order(c)[0] == 3]
    out, other = {}, 0
    cmap = colormaps["viridis"]
    for config in ordered:
        if config in FIXED_COLORS:
            out[config] = FIXED_COLORS[config]
        elif config in trees:
            share = trees.index(config) / max(len(trees) - 1, 1)
            out[config] = cmap(0.85 - 0.75 * share)
        else:
            out[config] = OTHER_COLORS[other % len(OTHER_COLORS)]
            other += 1
    return out


def _figure(panels: int, width: float = 5.0, height: float = 3.6, columns: int | None = None):
    """A grid of panels with fixed margins in inches: no tight bounding box, which would
    draw every figure twice."""
    columns = columns or (2 if panels == 4 else min(panels, 3))
    rows = math.ceil(panels / columns)
    top, bottom, left, right = 0.9, 0.75, 0.85, 0.25  # top holds the shared legend
    total_w, total_h = width * columns, height * rows + top
    figure = Figure(figsize=(total_w, total_h), dpi=DPI)
    FigureCanvasAgg(figure)
    figure.subplots_adjust(
        left=left / total_w,
        right=1 - right / total_w,
        bottom=bottom / total_h,
        top=1 - top / total_h,
        wspace=0.95 / (width - 0.95),
        hspace=1.0 / (height - 1.0),
    )
    axes = [figure.add_subplot(rows, columns, i + 1) for i in range(panels)]
    return figure, axes


def _legend(figure, axes, columns: int = 6) -> None:
    """One legend for the figure, above the panels: every label once."""
    seen: dict[str, object] = {}
    for axis in axes:
        for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
            if label and not label.startswith("_") and label not in seen:
                seen[label] = handle
    if seen:
        figure.legend(
            list(seen.values()),
            list(seen),
            loc="upper center",
            ncol=min(columns, len(seen)),
            fontsize=8,
            frameon=False,
        )


def _png(figure) -> bytes:
    _legend(figure, figure.axes)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _panels(table: list[dict]) -> tuple[list[tuple], bool]:
    """Panel keys: (host, prompt set), or (host, None) with prompt sets averaged when there
    would be too many panels."""
    keys = sorted({(r["host"], r["prompt_set"]) for r in table})
    if len(keys) <= MAX_PANELS:
        return keys, False
    return sorted({(r["host"], None) for r in table})[:MAX_PANELS], True


def _series(table: list[dict], key: tuple, column: str) -> dict[str, list[tuple]]:
    """{config: [(concurrency, value)]} of one panel, prompt sets averaged when key[1] is None."""
    host, prompt_set = key
    cells: dict[tuple, list] = {}
    for row in table:
        if row["host"] != host or (prompt_set is not None and row["prompt_set"] != prompt_set):
            continue
        cells.setdefault((row["config"], row["concurrency"]), []).append(row[column])
    out: dict[str, list[tuple]] = {}
    for (config, concurrency), values in sorted(cells.items()):
        value = _mean(values)
        if value is not None:
            out.setdefault(config, []).append((concurrency, value))
    return dict(sorted(out.items(), key=lambda item: config_order(item[0])))


def _title(key: tuple, averaged: bool) -> str:
    return f"{key[0]} - {'mean over prompt sets' if averaged else key[1]}"


def _log2_axis(axis, values) -> None:
    axis.set_xscale("log", base=2)
    ticks = sorted(set(values))
    axis.set_xticks(ticks)
    axis.set_xticklabels([str(t) for t in ticks])
    axis.minorticks_off()


def _flagged(table: list[dict]) -> set[tuple]:
    return {(r["host"], r["config"]) for r in table if r["lossless"] == "flagged"}


def _config_lines(axis, rows, key, metric: str, palette: dict, flagged: set) -> None:
    """One line per config of metric against concurrency; dashed where losslessness failed."""
    for config, points in _series(rows, key, metric).items():
        x, y = zip(*points, strict=True)
        bad = (key[0], config) in flagged
        axis.plot(
            x,
            y,
            marker="o",
            color=palette[config],
            linestyle="--" if bad else "-",
            label=config + (" (flagged)" if bad else ""),
        )


def throughput(table: list[dict], palette: dict) -> Plot | None:
    keys, averaged = _panels(table)
    figure, axes = _figure(len(keys))
    flagged = _flagged(table)
    for axis, key in zip(axes, keys, strict=True):
        _config_lines(axis, table, key, "output_tokens_per_s", palette, flagged)
        _log2_axis(axis, [r["concurrency"] for r in table])
        axis.set_title(_title(key, averaged), fontsize=10)
        axis.set_xlabel("concurrency (requests in flight)")
        axis.set_ylabel("output tokens/s")
        axis.grid(alpha=0.3)
    return Plot(
        "throughput",
        "Throughput against concurrency",
        "Output tokens/s of the whole server at each concurrency level, one line per serving "
        "config. Dashed: flagged by the losslessness check.",
        _png(figure),
    )


def speedup(table: list[dict], palette: dict, reference: str) -> Plot | None:
    rows = [r for r in table if r["config"] != reference and r["speedup_vs_ar"] is not None]
    if not rows:
        return None
    keys, averaged = _panels(rows)
    figure, axes = _figure(len(keys))
    flagged = _flagged(table)
    for axis, key in zip(axes, keys, strict=True):
        _config_lines(axis, rows, key, "speedup_vs_ar", palette, flagged)
        axis.axhline(1.0, color=palette.get(reference, "#222222"), linewidth=1, label=reference)
        _log2_axis(axis, [r["concurrency"] for r in rows])
        axis.set_title(_title(key, averaged), fontsize=10)
        axis.set_xlabel("concurrency")
        axis.set_ylabel(f"speedup over {reference} (output tokens/s)")
        axis.grid(alpha=0.3)
    return Plot(
        "speedup",
        f"Speedup over {reference}",
        f"Output tokens/s of each config divided by {reference}'s on the same host, prompt set "
        "and concurrency. Speculation pays most at low concurrency, where decoding is memory "
        "bound; at high concurrency the verifier's extra tokens compete with other requests.",
        _png(figure),
    )


def _tree_rows(table: list[dict]) -> list[dict]:
    return [r for r in table if r["ddtree_budget"] is not None]


def _lowest_level(rows: list[dict]) -> dict[tuple, int]:
    """The lowest concurrency measured per (host, prompt set): where per-step figures are
    least disturbed by batching."""
    low: dict[tuple, int] = {}
    for row in rows:
        key = (row["host"], row["prompt_set"])
        low[key] = min(low.get(key, row["concurrency"]), row["concurrency"])
    return low


def accept_vs_budget(table: list[dict]) -> Plot | None:
    trees = _tree_rows(table)
    if not trees:
        return None
    hosts = sorted({r["host"] for r in trees})[:MAX_PANELS]
    figure, axes = _figure(len(hosts))
    prompt_sets = sorted({r["prompt_set"] for r in trees})
    shade = {p: f"C{i % 10}" for i, p in enumerate(prompt_sets)}
    published = references.DFLASH_K25_ACCEPT
    for axis, host in zip(axes, hosts, strict=True):
        drawn_reference = False
        for prompt_set in prompt_sets:
            mine = [r for r in trees if r["host"] == host and r["prompt_set"] == prompt_set]
            by_budget: dict[int, list] = {}
            for row in mine:
                by_budget.setdefault(row["ddtree_budget"], []).append(row["accept_length_mean"])
            points = [(b, _mean(v)) for b, v in sorted(by_budget.items()) if _mean(v) is not None]
            if points:
                x, y = zip(*points, strict=True)
                axis.plot(x, y, marker="o", color=shade[prompt_set], label=f"DDTree, {prompt_set}")
            chain = _mean(
                r["accept_length_mean"]
                for r in table
                if r["host"] == host and r["prompt_set"] == prompt_set and r["config"] == "dflash"
            )
            if chain is not None:
                axis.axhline(
                    chain,
                    color=shade[prompt_set],
                    linestyle="--",
                    linewidth=1,
                    label=f"DFlash chain, {prompt_set}",
                )
            value = published["accept_length"].get(prompt_set)
            if value is not None:
                axis.axhline(
                    value,
                    color=shade[prompt_set],
                    linestyle=":",
                    linewidth=1,
                    label=published["source"] if not drawn_reference else None,
                )
                drawn_reference = True
        _log2_axis(axis, [r["ddtree_budget"] for r in trees])
        axis.set_title(host, fontsize=10)
        axis.set_xlabel("DDTree node budget")
        axis.set_ylabel("accept length (tokens per verify step)")
        axis.grid(alpha=0.3)
    return Plot(
        "accept_vs_budget",
        "Accept length against DDTree budget",
        "Token-weighted mean accept length (tokens each verify step added; the first token, "
        "from prefill, is no verify step's) per prompt set, averaged over concurrency levels. "
        "Dashed: DFlash's single chain on the same prompts; dotted: published DFlash figures "
        "on Kimi K2.5 (another model, for scale).",
        _png(figure),
    )


def decomposition(table: list[dict]) -> Plot | None:
    """Step time, accepted tokens per step and their quotient against the budget: the
    decomposition that explains a throughput collapse."""
    trees = _tree_rows(table)
    if not trees:
        return None
    low = _lowest_level(trees)
    trees = [r for r in trees if r["concurrency"] == low[(r["host"], r["prompt_set"])]]
    hosts = sorted({r["host"] for r in trees})[:6]
    figure, grid = _figure(3 * len(hosts), width=4.6, columns=3)
    prompt_sets = sorted({r["prompt_set"] for r in trees})
    shade = {p: f"C{i % 10}" for i, p in enumerate(prompt_sets)}
    panels = (
        ("step_ms", "step time (ms per verify step)"),
        ("accepted_tokens_per_step", "accepted tokens per step"),
        ("per_request", "tokens/s per request (= tokens per step / step time)"),
    )
    source = references.DDTREE_HYBRID
    budgets = [r["ddtree_budget"] for r in trees]  # ticks where we measured
    for row_index, host in enumerate(hosts):
        for column, (name, label) in enumerate(panels):
            axis = grid[row_index * 3 + column]
            for prompt_set in prompt_sets:
                mine = sorted(
                    (r for r in trees if r["host"] == host and r["prompt_set"] == prompt_set),
                    key=lambda r: r["ddtree_budget"],
                )
                points = []
                for row in mine:
                    if name == "per_request":
                        step, tokens = row["step_ms"], row["accepted_tokens_per_step"]
                        value = 1000.0 * tokens / step if step and tokens else None
                    else:
                        value = row[name]
                    if value is not None:
                        points.append((row["ddtree_budget"], value))
                if points:
                    x, y = zip(*points, strict=True)
                    axis.plot(x, y, marker="o", color=shade[prompt_set], label=prompt_set)
            key = {"per_request": "tokens_per_s"}.get(name, name)
            published = [(p["budget"], p[key]) for p in source["points"] if p[key] is not None]
            if published:
                x, y = zip(*published, strict=True)
                axis.plot(x, y, label=source["source"], **REFERENCE_STYLE)
            _log2_axis(axis, budgets)
            axis.set_xlabel("DDTree node budget")
            axis.set_ylabel(label, fontsize=8)
            axis.set_title(f"{host} (concurrency {min(low.values())})", fontsize=9)
            axis.grid(alpha=0.3)
    return Plot(
        "decomposition",
        "Step time and accepted tokens per step against budget",
        "tokens/s = accepted tokens per step / step time. A wider tree costs step time; it pays "
        "only while accepted tokens per step grow faster. Grey crosses: a published study on a "
        "hybrid-attention model, where tokens per step collapsed at large budgets although step "
        "time fell (Kimi K2.6 is pure attention, where wide trees should verify exactly).",
        _png(figure),
    )


def pareto(table: list[dict], palette: dict) -> Plot | None:
    rows = [
        r
        for r in table
        if r["tokens_per_s_per_gpu"] is not None and r["tokens_per_s_per_user"] is not None
    ]
    if not rows:
        return None
    hosts = sorted({r["host"] for r in rows})[:MAX_PANELS]
    figure, axes = _figure(len(hosts), width=5.5, height=4.2)
    flagged = _flagged(table)
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
                    _mean(r["tokens_per_s_per_gpu"] for r in group),
                    _mean(r["tokens_per_s_per_user"] for r in group),
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
        axis.set_xlabel("output tokens/s per GPU")
        axis.set_ylabel("tokens/s per user (1000 / mean TPOT)")
        axis.grid(alpha=0.3)
    return Plot(
        "pareto",
        "Tokens/s per user against tokens/s per GPU",
        "Each point is one concurrency level (the number beside it). Up is a faster stream for "
        "each user, right is more work from each GPU; the grey line is the best trade available "
        "from the configs measured (flagged configs excluded).",
        _png(figure),
    )


def _frontier(points: list[tuple]) -> list[tuple]:
    """Points not beaten on both axes, by ascending x."""
    best, out = -math.inf, []
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if y > best:
            out.append((x, y))
            best = y
    return sorted(out)


def accept_distribution(samples: dict[str, dict[str, list]], palette: dict) -> Plot | None:
    """samples: {panel: {config: per-request accept lengths}}."""
    if not samples:
        return None
    hosts = sorted(samples)[:MAX_PANELS]
    figure, axes = _figure(len(hosts), width=6.0, height=3.8, columns=min(len(hosts), 2))
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
        axis.set_ylabel("accept length per request")
        axis.grid(alpha=0.3, axis="y")
    return Plot(
        "accept_distribution",
        "Distribution of per-request accept length",
        "Each request's accepted tokens per verify step, (output tokens - 1) / "
        "meta_info.spec_verify_ct: the first token comes from prefill (SGLang's own "
        "spec_accept_length counts it too), over every prompt set and concurrency level; a bar "
        "marks the median, a dash the mean. A wide spread means acceptance depends strongly on "
        "the prompt.",
        _png(figure),
    )


def across_hosts(table: list[dict]) -> Plot | None:
    hosts = sorted({r["host"] for r in table})
    if len(hosts) < 2:
        return None
    configs = sorted({r["config"] for r in table}, key=config_order)[:12]
    profile = {r["host"]: r["profile"] for r in table}
    figure, axes = _figure(len(configs), width=4.4, height=3.4, columns=min(len(configs), 4))
    # Only prompt sets every host ran, so the averages compare like with like.
    common = set.intersection(*({r["prompt_set"] for r in table if r["host"] == h} for h in hosts))
    for axis, config in zip(axes, configs, strict=True):
        for index, host in enumerate(hosts):
            cells: dict[int, list] = {}
            for row in table:
                if row["host"] == host and row["config"] == config and row["prompt_set"] in common:
                    cells.setdefault(row["concurrency"], []).append(row["output_tokens_per_s"])
            points = [(c, _mean(v)) for c, v in sorted(cells.items()) if _mean(v) is not None]
            if points:
                x, y = zip(*points, strict=True)
                label = f"{host} ({profile[host]})" if profile[host] else host
                axis.plot(x, y, marker="o", color=f"C{index % 10}", label=label)
        _log2_axis(axis, [r["concurrency"] for r in table])
        axis.set_title(config, fontsize=10)
        axis.set_xlabel("concurrency")
        axis.set_ylabel("output tokens/s")
        axis.grid(alpha=0.3)
    return Plot(
        "across_hosts",
        "The same config across hosts",
        "Output tokens/s per config on each host (its hardware profile in brackets), averaged "
        f"over the prompt sets every host ran ({', '.join(sorted(common)) or 'none'}).",
        _png(figure),
    )


def panel_groups(table: list[dict]) -> dict[str, str]:
    """Panel label per host: the host itself, or with more than MAX_HOST_PANELS hosts its
    hardware profile (hosts of one profile averaged), which keeps figures readable and their
    cost bounded; the across-hosts figure still shows every host."""
    hosts = sorted({r["host"] for r in table})
    if len(hosts) <= MAX_HOST_PANELS:
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


def _job(job: tuple) -> Plot | None:
    function, args = job
    return function(*args)


def all_plots(
    results: Results, table: list[dict], reference: str, workers: int | None = None
) -> list[Plot]:
    """Every figure; drawn in worker processes when there is enough to draw (matplotlib
    spends ~0.1 s on each panel, and figures do not depend on each other)."""
    palette = colors([r["config"] for r in table])
    groups = panel_groups(table)
    grouped = _grouped(table, groups)
    jobs = [
        (throughput, (grouped, palette)),
        (speedup, (grouped, palette, reference)),
        (accept_vs_budget, (grouped,)),
        (decomposition, (grouped,)),
        (pareto, (grouped, palette)),
        (accept_distribution, (_samples(results, groups), palette)),
        (across_hosts, (table,)),
    ]
    workers = workers if workers is not None else (os.cpu_count() or 1)
    if workers > 1 and len(table) >= PARALLEL_ROWS:
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
            made = list(pool.map(_job, jobs))
    else:
        made = [_job(job) for job in jobs]
    return [plot for plot in made if plot is not None]


def compare_plot(pairs: list[dict]) -> Plot | None:
    """Run B over run A per config and concurrency: throughput, step time, tokens per step."""
    keys = sorted({(r["host_a"], r["host_b"], r["prompt_set"]) for r in pairs})[:6]
    if not keys:
        return None
    palette = colors([r["config"] for r in pairs])
    figure, grid = _figure(3 * len(keys), width=4.6, columns=3)
    panels = (
        ("output_tokens_per_s", "output tokens/s, B / A"),
        ("step_ms", "step time, B / A"),
        ("accepted_tokens_per_step", "accepted tokens per step, B / A"),
    )
    for index, key in enumerate(keys):
        mine = [r for r in pairs if (r["host_a"], r["host_b"], r["prompt_set"]) == key]
        for column, (name, label) in enumerate(panels):
            axis = grid[index * 3 + column]
            for config in sorted({r["config"] for r in mine}, key=config_order):
                points = []
                for row in sorted(mine, key=lambda r: r["concurrency"]):
                    a, b = row[f"{name}_a"], row[f"{name}_b"]
                    if row["config"] == config and a and b is not None:
                        points.append((row["concurrency"], b / a))
                if points:
                    x, y = zip(*points, strict=True)
                    axis.plot(x, y, marker="o", color=palette[config], label=config)
            axis.axhline(1.0, color="#888888", linewidth=1)
            _log2_axis(axis, [r["concurrency"] for r in mine])
            axis.set_title(f"{key[0]} -> {key[1]} - {key[2]}", fontsize=9)
            axis.set_xlabel("concurrency")
            axis.set_ylabel(label, fontsize=8)
            axis.grid(alpha=0.3)
    return Plot(
        "compare",
        "Run B against run A",
        "Ratios of run B to run A for the same config, prompt set and concurrency: throughput, "
        "and the two factors it is made of (tokens/s = accepted tokens per step / step time).",
        _png(figure),
    )
