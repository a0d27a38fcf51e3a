"""What every figure of the report is drawn with: the Plot it becomes, the colors, the grid of
panels with fixed margins, the one legend above them, the PNG with the run's label stamped in,
and the small helpers the figures share (panel keys, series, axes). Matplotlib's object API
with the Agg canvas: no pyplot state, no display needed.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field

import matplotlib
from ansible.module_utils.contract import metrics
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis.results import CHAIN_CONTROL, config_order

# Host, prompt set and config names come from the results, which are outside input: a `$` in
# one would make matplotlib parse the text as math (and fail on a name like "gpu$\frac{a$").
# No figure of the report uses math: every text is drawn as it is, in every process that
# draws (the worker processes import this module too).
matplotlib.rcParams["text.parse_math"] = False
# Titles at the top of their panel, where matplotlib's automatic placement puts them unless an
# x axis is drawn above the panel (none of the report's is): the placement measured every
# panel's tick labels again at each draw. The same PNG bytes, about 8% less CPU a report.
matplotlib.rcParams["axes.titley"] = 1.0

DPI = 96
MAX_PANELS = 10
MAX_HOST_PANELS = 4
FIXED_COLORS = {
    "ar": "#222222",
    "eagle3": "#e377c2",
    "dflash": "#1f77b4",
    CHAIN_CONTROL: "#6baed6",
}
OTHER_COLORS = ("#ff7f0e", "#8c564b", "#17becf", "#bcbd22", "#7f7f7f", "#d62728")
REFERENCE_STYLE = {"color": "#888888", "marker": "x", "linestyle": ":", "markersize": 7}


@dataclass
class Plot:
    name: str  # file name, name.png
    title: str
    caption: str
    png: bytes
    # What was drawn, for tests and report.json readers: panel titles, marks.
    details: dict = field(default_factory=dict)


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


def new_figure(
    panels: int,
    width: float = 5.0,
    height: float = 3.6,
    columns: int | None = None,
    top: float = 0.9,
):
    """A grid of panels with fixed margins in inches: no tight bounding box, which would
    draw every figure twice. `top` holds the shared legend."""
    columns = columns or (2 if panels == 4 else min(panels, 3))
    rows = math.ceil(panels / columns)
    bottom, left, right = 0.75, 0.85, 0.25
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
    figure.kit_margins = (top, bottom)  # inches, for _legend to grow the top
    return figure, axes


# Legend text at fontsize 8: about this many inches a character, plus the handle and gaps.
LEGEND_CHAR_IN = 0.062
LEGEND_HANDLE_IN = 0.55
LEGEND_ROW_IN = 0.2


def _legend(figure, axes, columns: int = 6, order=None) -> None:
    """One legend for the figure, above the panels: every label once, in the order `order`
    (a label's sort key) gives, else as first drawn."""
    seen: dict[str, object] = {}
    for axis in axes:
        for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
            if label and not label.startswith("_") and label not in seen:
                seen[label] = handle
    if order is not None:
        seen = dict(sorted(seen.items(), key=lambda item: order(item[0])))
    if not seen:
        return
    # As many columns as fit the figure's width; the top grows to hold the rows they make.
    width, height = figure.get_size_inches()
    entry = LEGEND_HANDLE_IN + LEGEND_CHAR_IN * max(map(len, seen))
    columns = max(1, min(columns, len(seen), int((width - 0.2) // entry)))
    rows = math.ceil(len(seen) / columns)
    top, bottom = getattr(figure, "kit_margins", (0.9, 0.75))
    needed = 0.35 + LEGEND_ROW_IN * rows
    if needed > top:
        height += needed - top
        figure.set_size_inches(width, height)
        figure.subplots_adjust(top=1 - needed / height, bottom=bottom / height)
    figure.legend(
        list(seen.values()),
        list(seen),
        loc="upper center",
        ncol=columns,
        fontsize=8,
        frameon=False,
    )


# A label every figure carries inside its image (e.g. "SIMULATED"), so a plot copied out of
# the report still says what it shows; set per figure job (worker processes included).
_STAMP = ""


def png(figure, legend_columns: int = 6, order=None) -> bytes:
    _legend(figure, figure.axes, legend_columns, order)
    if _STAMP:
        figure.text(
            0.005, 0.005, _STAMP, fontsize=11, fontweight="bold", color="#b00020", va="bottom"
        )
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def stat_label(metric: metrics.Metric) -> str:
    """'TTFT p99 (ms)': a distribution's statistic, with its unit."""
    return f"{metric.label} {metric.stat} ({metric.unit})"


def with_unit(name: str) -> str:
    """'step time, ms'."""
    return f"{metrics.label(name)}, {metrics.metric(name).unit}"


def mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def panel_keys(table: list[dict]) -> tuple[list[tuple], bool]:
    """Panel keys: (host, prompt set), or (host, None) with prompt sets averaged when there
    would be too many panels."""
    keys = sorted({(r["host"], r["prompt_set"]) for r in table})
    if len(keys) <= MAX_PANELS:
        return keys, False
    return sorted({(r["host"], None) for r in table})[:MAX_PANELS], True


def series(
    table: list[dict], key: tuple, column: str, x: str = "concurrency"
) -> dict[str, list[tuple]]:
    """{config: [(x, value)]} of one panel (x the concurrency, or the request rate), prompt
    sets averaged when key[1] is None."""
    host, prompt_set = key
    cells: dict[tuple, list] = {}
    for row in table:
        if row["host"] != host or (prompt_set is not None and row["prompt_set"] != prompt_set):
            continue
        cells.setdefault((row["config"], row[x]), []).append(row[column])
    out: dict[str, list[tuple]] = {}
    for (config, at), values in sorted(cells.items()):
        value = mean(values)
        if value is not None:
            out.setdefault(config, []).append((at, value))
    return dict(sorted(out.items(), key=lambda item: config_order(item[0])))


def panel_title(key: tuple, averaged: bool) -> str:
    return f"{key[0]} - {'mean over prompt sets' if averaged else key[1]}"


def log2_axis(axis, values) -> None:
    axis.set_xscale("log", base=2)
    ticks = sorted(set(values))
    axis.set_xticks(ticks)
    axis.set_xticklabels([str(t) for t in ticks])
    axis.minorticks_off()


def flagged_configs(table: list[dict]) -> set[tuple]:
    return {(r["host"], r["config"]) for r in table if r["lossless"] == "flagged"}


def config_lines(axis, rows, key, metric: str, palette: dict, flagged: set) -> None:
    """One line per config of metric against concurrency; dashed where losslessness failed."""
    for config, points in series(rows, key, metric).items():
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


def draw(function, args: tuple, label: str = "") -> Plot | None:
    """One figure, with the label (if any) in its image, title and caption."""
    global _STAMP  # per process: set while one figure is drawn
    _STAMP = label
    try:
        plot = function(*args)
    finally:
        _STAMP = ""
    return labelled(plot, label) if plot is not None else None


def labelled(plot: Plot, label: str) -> Plot:
    """The plot's title and caption led by the label (its image carries it already)."""
    if not label:
        return plot
    plot.title = f"{label}: {plot.title}"
    plot.caption = f"{label}. {plot.caption}"
    return plot
