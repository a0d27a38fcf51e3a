"""The report's figures, as PNG bytes. Matplotlib's object API with the Agg canvas: no pyplot
state, no display needed.

Each function takes the summary table (analysis.tables.rows) and returns a Plot, or None when
the results hold nothing to draw (no DDTree configs, a single host).
"""

from __future__ import annotations

import io
import json
import math
import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ansible.module_utils.contract import metrics
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis import references, sweep
from analysis.results import (
    CHAIN_CONTROL,
    DEFAULT_MAX_FILE_BYTES,
    Results,
    config_order,
    ratio,
    read_regular,
)

DPI = 96
MAX_PANELS = 10
MAX_HOST_PANELS = 4
PARALLEL_ROWS = 200
FIXED_COLORS = {
    "ar": "#222222",
    "eagle3": "#e377c2",
    "dflash": "#1f77b4",
    CHAIN_CONTROL: "#6baed6",
}
OTHER_COLORS = ("#ff7f0e", "#8c564b", "#17becf", "#bcbd22", "#7f7f7f", "#d62728")
REFERENCE_STYLE = {"color": "#888888", "marker": "x", "linestyle": ":", "markersize": 7}
# Decomposition rows (host x concurrency level) drawn at most; each costs three panels.
MAX_DECOMPOSITION_ROWS = 16
MARKS = {
    sweep.COLLAPSED: {
        "marker": "o",
        "markersize": 15,
        "markerfacecolor": "none",
        "markeredgecolor": "#d62728",
        "markeredgewidth": 2.2,
        "linestyle": "none",
        "label": "collapsed budget",
    },
    sweep.SATURATED: {
        "marker": "s",
        "markersize": 13,
        "markerfacecolor": "none",
        "markeredgecolor": "#ff7f0e",
        "markeredgewidth": 2.0,
        "linestyle": "none",
        "label": "saturated budget",
    },
    "flagged": {
        "marker": "x",
        "markersize": 10,
        "color": "#000000",
        "markeredgewidth": 2.0,
        "linestyle": "none",
        "label": "failed losslessness",
    },
}


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


def _figure(
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


def _png(figure, legend_columns: int = 6, order=None) -> bytes:
    _legend(figure, figure.axes, legend_columns, order)
    if _STAMP:
        figure.text(
            0.005, 0.005, _STAMP, fontsize=11, fontweight="bold", color="#b00020", va="bottom"
        )
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _stat_label(metric: metrics.Metric) -> str:
    """'TTFT p99 (ms)': a distribution's statistic, with its unit."""
    return f"{metric.label} {metric.stat} ({metric.unit})"


def _with_unit(name: str) -> str:
    """'step time, ms'."""
    return f"{metrics.label(name)}, {metrics.metric(name).unit}"


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


def _series(
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
        value = _mean(values)
        if value is not None:
            out.setdefault(config, []).append((at, value))
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
    card = references.DFLASH_K26_CARD["throughput"]
    levels = [r["concurrency"] for r in table]
    for axis, key in zip(axes, keys, strict=True):
        _config_lines(axis, table, key, "output_tokens_per_s", palette, flagged)
        # The drafter card's point, where this panel is its prompt set and spans its level.
        if key[1] == card["prompt_set"] and min(levels) <= card["concurrency"] <= max(levels):
            axis.plot(
                [card["concurrency"]],
                [card["output_tokens_per_s"]],
                label="DFlash on Kimi K2.6, drafter card: GSM8K c32 (its own hardware)",
                **{**REFERENCE_STYLE, "markersize": 9},
            )
        _log2_axis(axis, levels)
        axis.set_title(_title(key, averaged), fontsize=10)
        axis.set_xlabel("concurrency (requests in flight)")
        axis.set_ylabel(metrics.axis_label("output_tokens_per_s"))
        axis.grid(alpha=0.3)
    return Plot(
        "throughput",
        "Throughput against concurrency",
        "Output tokens/s of the whole server at each concurrency level, one line per serving "
        "config. Dashed: flagged by the losslessness check. Grey cross (GSM8K panels): DFlash "
        f"on Kimi K2.6 as its drafter's card gives it, {card['output_tokens_per_s']:g} tok/s at "
        f"concurrency {card['concurrency']}, on hardware and settings of its own.",
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
        axis.set_ylabel(f"speedup over {reference} ({metrics.label('output_tokens_per_s')})")
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


def accept_vs_budget(table: list[dict]) -> Plot | None:
    trees = _tree_rows(table)
    if not trees:
        return None
    hosts = sorted({r["host"] for r in trees})[:MAX_PANELS]
    figure, axes = _figure(len(hosts))
    prompt_sets = sorted({r["prompt_set"] for r in trees})
    shade = {p: f"C{i % 10}" for i, p in enumerate(prompt_sets)}
    published = references.DFLASH_K25_ACCEPT
    card = references.DFLASH_K26_CARD
    low, high = card["accept_length_range"]
    # A sweep at several TP sizes gets a line per TP size (dashes past the first), never an
    # average across them.
    sizes = sorted({r.get("tp_size") for r in trees}, key=lambda t: t or 0)
    dashes = ("-", "-.", (0, (5, 1)), (0, (1, 1)))
    for axis, host in zip(axes, hosts, strict=True):
        drawn_reference = False
        for prompt_set in prompt_sets:
            for index, tp in enumerate(sizes):
                mine = [
                    r
                    for r in trees
                    if r["host"] == host
                    and r["prompt_set"] == prompt_set
                    and r.get("tp_size") == tp
                ]
                by_budget: dict[int, list] = {}
                for row in mine:
                    by_budget.setdefault(row["ddtree_budget"], []).append(row["accept_length_mean"])
                points = [
                    (b, _mean(v)) for b, v in sorted(by_budget.items()) if _mean(v) is not None
                ]
                if points:
                    x, y = zip(*points, strict=True)
                    at = f", TP{tp if tp is not None else '?'}" if len(sizes) > 1 else ""
                    axis.plot(
                        x,
                        y,
                        marker="o",
                        color=shade[prompt_set],
                        linestyle=dashes[index % len(dashes)],
                        label=f"DDTree, {prompt_set}{at}",
                    )
            for name in (CHAIN_CONTROL, "dflash"):
                chain = _mean(
                    r["accept_length_mean"]
                    for r in table
                    if r["host"] == host
                    and r["prompt_set"] == prompt_set
                    and r.get("base_config", r["config"]) == name
                )
                if chain is not None:
                    axis.axhline(
                        chain,
                        color=shade[prompt_set],
                        linestyle="--",
                        linewidth=1,
                        label=f"{name} (chain), {prompt_set}",
                    )
                    break
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
        axis.axhspan(
            low,
            high,
            color="#bbbbbb",
            alpha=0.25,
            linewidth=0,
            label=f"{card['source']}: {low:g}-{high:g} by dataset",
        )
        _log2_axis(axis, [r["ddtree_budget"] for r in trees])
        axis.set_title(host, fontsize=10)
        axis.set_xlabel("DDTree node budget")
        axis.set_ylabel(metrics.axis_label("accept_length_mean"))
        axis.grid(alpha=0.3)
    return Plot(
        "accept_vs_budget",
        "Accept length against DDTree budget",
        "Token-weighted mean accept length (tokens each verify step added; the first token, "
        "from prefill, is no verify step's) per prompt set, averaged over concurrency levels. "
        f"Dashed: DFlash's single chain on the same prompts ({CHAIN_CONTROL}, the chain on the "
        "DDTree servers' backend, where it ran, else dflash). Grey band: the K2.6 drafter's "
        f"card, acceptance {low:g} to {high:g} depending on the dataset (no per-dataset values "
        "are drawn: none can be cited); dotted: published DFlash figures on Kimi K2.5, another "
        "model, per prompt set.",
        _png(figure),
    )


def _cell_means(rows: list[dict], columns: tuple[str, ...]) -> dict[str, float | None]:
    return {c: _mean(r[c] for r in rows) for c in columns}


def _tp_key(key: tuple) -> tuple:
    # TP sizes may be None (unknown); sorted first, beside known ones.
    host, tp, level = key
    return (host, tp or 0, level)


def _decomposition_cells(table: list[dict]) -> dict[tuple, dict[str, dict[int, dict]]]:
    """{(host, TP size, level): {prompt set: {budget: drawn values and marks}}}, hosts of one
    panel group averaged. A budget is marked where any of its rows is."""
    cells: dict[tuple, dict[str, dict[int, list]]] = {}
    for row in _tree_rows(table):
        key = (row["host"], row.get("tp_size"), row["concurrency"])
        group = cells.setdefault(key, {}).setdefault(row["prompt_set"], {})
        group.setdefault(row["ddtree_budget"], []).append(row)
    out: dict[tuple, dict[str, dict[int, dict]]] = {}
    for key, by_set in cells.items():
        for prompt_set, by_budget in by_set.items():
            for budget, rows in by_budget.items():
                values = _cell_means(rows, ("step_ms", "accepted_tokens_per_step"))
                step, tokens = values["step_ms"], values["accepted_tokens_per_step"]
                marks = {r["budget_diagnosis"] for r in rows}
                out.setdefault(key, {}).setdefault(prompt_set, {})[budget] = {
                    "step_ms": step,
                    "accepted_tokens_per_step": tokens,
                    # The identity the figure is about, on the values drawn.
                    "per_request": 1000.0 * tokens / step if step and tokens else None,
                    "mark": sweep.COLLAPSED
                    if sweep.COLLAPSED in marks
                    else sweep.SATURATED
                    if sweep.SATURATED in marks
                    else None,
                    "flagged": any(r["lossless"] == "flagged" for r in rows),
                }
    return out


def _chain_levels(table: list[dict]) -> dict[tuple, dict]:
    """{(host, TP size, level, prompt set): the chain control's drawn values}, and its draft
    tokens (the drafter's block size: the most one step can accept) under (host, TP size,
    level, None)."""
    groups: dict[tuple, list] = {}
    for row in table:
        if row.get("base_config", row["config"]) == CHAIN_CONTROL:
            where = (row["host"], row.get("tp_size"), row["concurrency"])
            groups.setdefault((*where, row["prompt_set"]), []).append(row)
            groups.setdefault((*where, None), []).append(row)
    out = {}
    for key, rows in groups.items():
        values = _cell_means(
            rows, ("step_ms", "accepted_tokens_per_step", "verify_tokens_per_step")
        )
        step, tokens = values["step_ms"], values["accepted_tokens_per_step"]
        values["per_request"] = 1000.0 * tokens / step if step and tokens else None
        out[key] = values
    return out


# (column, axis label, short name): the registry's step time and accepted tokens per step, and
# their quotient, which is no column.
DECOMPOSITION_PANELS = (
    *(
        (name, metrics.axis_label(name), metrics.label(name))
        for name in ("step_ms", "accepted_tokens_per_step")
    ),
    ("per_request", "decode tokens/s per request", "tokens/s"),
)


def _reference_row(axes) -> list[str]:
    """The published hybrid study, as published, in a row of its own."""
    source = references.DDTREE_HYBRID
    points = source["points"]
    budgets = [p["budget"] for p in points]
    title = f"published: {source['model']}\n{source['hardware']}\n"
    drawn = []
    for axis, (name, label, short) in zip(axes, DECOMPOSITION_PANELS, strict=True):
        if name == "per_request":
            measured = [p["tokens_per_s"] for p in points]
            axis.plot(
                budgets,
                measured,
                label="published study: tok/s measured",
                **{**REFERENCE_STYLE, "linestyle": "-"},
            )
            implied = [references.estimated_tokens_per_s(p) for p in points]
            axis.plot(
                budgets,
                implied,
                color="#888888",
                marker="o",
                markerfacecolor="none",
                linestyle=":",
                label="published study: ~tokens per step / ~step time (does not match)",
            )
            for x, y in zip(budgets, measured, strict=True):
                axis.annotate(
                    f"{y:g}", (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points"
                )
            for x, y in zip(budgets, implied, strict=True):
                axis.annotate(
                    f"{y:.1f}", (x, y), fontsize=7, xytext=(4, -9), textcoords="offset points"
                )
        else:
            values = [p[name] for p in points]
            axis.plot(budgets, values, label="published study: ~estimated", **REFERENCE_STYLE)
            for x, y in zip(budgets, values, strict=True):
                axis.annotate(
                    f"~{y:g}", (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points"
                )
        _log2_axis(axis, budgets)
        axis.margins(x=0.12)
        axis.set_xlabel("DDTree node budget")
        axis.set_ylabel(label, fontsize=8)
        kind = "~estimated"
        if name == "per_request":
            kind = "measured; hollow: ~estimates multiplied"
        axis.set_ylim(0, 1.25 * max(p.get(name, p["tokens_per_s"]) for p in points))
        axis.set_title(f"{title}{short} ({kind})", fontsize=8)
        axis.grid(alpha=0.3)
        drawn.append(f"{title.strip().replace(chr(10), ', ')}: {short}")
    return drawn


def _decomposition_order(prompt_sets: list[str]):
    """Legend order: prompt sets, the chain, the cap, the marks, the published study."""
    marks = [m["label"] for m in MARKS.values()]

    def key(label: str) -> tuple:
        if label in prompt_sets:
            return (0, prompt_sets.index(label))
        if label.startswith(CHAIN_CONTROL):
            return (1, 0)
        if label in marks:
            return (3, marks.index(label))
        if label.startswith("published"):
            return (4, 0)
        return (2, 0)

    return key


def decomposition(table: list[dict], heading: str = "") -> Plot | None:
    """Step time, accepted tokens per step and their quotient against the budget, one row per
    host (and TP size, where the sweep ran at several) and concurrency level: the
    decomposition that explains a throughput collapse. A heading (the run and its model, in a
    comparison) goes into the image, the title and the caption."""
    cells = _decomposition_cells(table)
    if not cells:
        return None
    keys = sorted(cells, key=_tp_key)[:MAX_DECOMPOSITION_ROWS]
    chain = _chain_levels(table)
    # The TP size is named where the sweep ran at more than one; the chain at the same TP
    # size is the control, else one whose TP size is unknown.
    several = len({tp for _, tp, _ in keys}) > 1

    def control_of(host, tp, level, prompt_set):
        found = chain.get((host, tp, level, prompt_set))
        return found if found is not None else chain.get((host, None, level, prompt_set))

    prompt_sets = sorted({p for key in keys for p in cells[key]})
    shade = {p: f"C{i % 10}" for i, p in enumerate(prompt_sets)}
    budgets = sorted({b for key in keys for by in cells[key].values() for b in by})
    figure, grid = _figure(3 * (len(keys) + 1), width=4.6, height=3.2, columns=3, top=1.3)
    panels, marked, flagged = [], {}, set()
    for index, (host, tp, level) in enumerate(keys):
        where = f"{host} TP{tp if tp is not None else '?'}" if several else host
        for column, (name, label, short) in enumerate(DECOMPOSITION_PANELS):
            axis = grid[index * 3 + column]
            for prompt_set in prompt_sets:
                by_budget = cells[(host, tp, level)].get(prompt_set, {})
                points = [(b, v[name], v) for b, v in sorted(by_budget.items()) if v[name]]
                if not points:
                    continue
                axis.plot(
                    [b for b, _, _ in points],
                    [y for _, y, _ in points],
                    marker="o",
                    color=shade[prompt_set],
                    label=prompt_set,
                )
                for budget, y, values in points:
                    if values["mark"]:
                        axis.plot([budget], [y], **MARKS[values["mark"]])
                        marked[(where, prompt_set, level, budget)] = values["mark"]
                    if values["flagged"]:
                        axis.plot([budget], [y], **MARKS["flagged"])
                        flagged.add((where, prompt_set, level, budget))
                control = control_of(host, tp, level, prompt_set)
                if control and control[name]:
                    axis.axhline(
                        control[name], color=shade[prompt_set], linestyle="--", linewidth=1
                    )
            cap = (control_of(host, tp, level, None) or {}).get("verify_tokens_per_step")
            if name == "accepted_tokens_per_step" and cap:
                axis.axhline(
                    cap,
                    color="#555555",
                    linestyle=":",
                    linewidth=1,
                    label="most one step accepts (the drafter's block size)",
                )
            _log2_axis(axis, budgets)
            axis.set_xlabel("DDTree node budget")
            axis.set_ylabel(label, fontsize=8)
            axis.set_title(f"{where}, concurrency {level}: {short}", fontsize=9)
            axis.grid(alpha=0.3)
            panels.append(f"{where} c{level}: {short}")
    if any(control_of(host, tp, level, None) for host, tp, level in keys):
        grid[0].plot(
            [],
            [],
            color="#555555",
            linestyle="--",
            label=f"{CHAIN_CONTROL}: the chain at the same level (dashed, the prompt set's colour)",
        )
    panels += _reference_row(grid[len(keys) * 3 : len(keys) * 3 + 3])
    source = references.DDTREE_HYBRID
    points = source["points"]
    measured = ", ".join(f"{p['tokens_per_s']:g}" for p in points)
    steps = ", ".join(f"~{p['step_ms']:g}" for p in points)
    tokens = ", ".join(f"~{p['accepted_tokens_per_step']:g}" for p in points)
    implied = ", ".join(f"{references.estimated_tokens_per_s(p):.1f}" for p in points)
    left_out = len(cells) - len(keys)
    if heading:
        figure.text(0.995, 0.005, heading, fontsize=11, fontweight="bold", ha="right", va="bottom")
    title = "Step time and accepted tokens per step against budget, per concurrency level"
    return Plot(
        "decomposition",
        f"{heading}: {title}" if heading else title,
        (f"{heading}. " if heading else "")
        + "tokens/s per request = accepted tokens per step / step time. One row per host and "
        "concurrency level, one line per prompt set: a wider tree costs step time and pays only "
        "while accepted tokens per step grow faster. Dashed: "
        f"{CHAIN_CONTROL}, DFlash's chain on the DDTree servers' backend, page size and "
        "scheduler, at the same level; dotted: the most one step can accept (the drafter's "
        "block size). Red ring: a collapsed budget (accepted tokens per step more than "
        f"{sweep.COLLAPSE_DROP:.0%} below a smaller budget's for less than "
        f"{sweep.STEP_RISE:.0%} more step time; see the ddtree_budget_collapse warnings); "
        f"orange square: saturated (under {sweep.SATURATION_GAIN:.0%} more tokens per step for "
        f"over {sweep.STEP_RISE:.0%} more step time); black cross: failed the losslessness "
        f"check. Bottom row, grey: a published study on another model and hardware, "
        f"{source['model']} on {source['hardware']}, budgets "
        f"{', '.join(str(p['budget']) for p in points)}: throughput measured ({measured} tok/s), "
        f"step time ({steps} ms) and accepted tokens per step ({tokens}) estimated. The "
        f"estimates do not multiply out to the measured throughput ({implied} tok/s, hollow "
        "circles); both are drawn as published."
        + (f" {left_out} more host and level rows are in summary.csv." if left_out else ""),
        _png(figure, legend_columns=3, order=_decomposition_order(prompt_sets)),
        details={"panels": panels, "marks": marked, "flagged": sorted(flagged)},
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
        axis.set_xlabel(metrics.axis_label("tokens_per_s_per_gpu"))
        axis.set_ylabel(metrics.axis_label("tokens_per_s_per_user"))
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
        axis.set_ylabel(f"{metrics.label('accept_length_mean')} per request")
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
        axis.set_ylabel(metrics.axis_label("output_tokens_per_s"))
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


def draw(function, args: tuple, label: str = "") -> Plot | None:
    """One figure, with the label (if any) in its image, title and caption."""
    global _STAMP  # per process: set while one figure is drawn
    _STAMP = label
    try:
        plot = function(*args)
    finally:
        _STAMP = ""
    return labelled(plot, label) if plot is not None else None


def _job(job: tuple) -> Plot | None:
    return draw(*job)


def labelled(plot: Plot, label: str) -> Plot:
    """The plot's title and caption led by the label (its image carries it already)."""
    if not label:
        return plot
    plot.title = f"{label}: {plot.title}"
    plot.caption = f"{label}. {plot.caption}"
    return plot


def all_plots(
    results: Results,
    table: list[dict],
    reference: str,
    workers: int | None = None,
    label: str = "",
    cdf_concurrency: int | None = None,
) -> list[Plot]:
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


def compare_plot(pairs: list[dict]) -> Plot | None:
    """Run B over run A per config and concurrency: throughput, step time, tokens per step."""
    keys = sorted({(r["host_a"], r["host_b"], r["prompt_set"]) for r in pairs})[:6]
    if not keys:
        return None
    palette = colors([r["config"] for r in pairs])
    figure, grid = _figure(3 * len(keys), width=4.6, columns=3)
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


def run_decomposition(table: list[dict], side: str, heading: str) -> Plot | None:
    """One run's decomposition in a comparison: drawn as its own report draws it (hosts
    grouped alike), named decomposition-<side> and headed with the run and its model."""
    plot = decomposition(_grouped(table, panel_groups(table)), heading)
    if plot is not None:
        plot.name = f"decomposition-{side}"
    return plot


# -- latency ---------------------------------------------------------------------------

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


def latency(table: list[dict], palette: dict) -> Plot | None:
    """TTFT, ITL and TPOT p50 (dashed) and p99 (solid) against concurrency, per config."""
    rows = [r for r in table if r.get("ttft_ms_p99") is not None]
    if not rows:
        return None
    keys, averaged = _latency_keys(rows)
    figure, axes = _figure(3 * len(keys), width=4.6, columns=3)
    flagged = _flagged(table)
    levels = [r["concurrency"] for r in rows]
    for index, key in enumerate(keys):
        for column, (metric, name) in enumerate(LATENCY_METRICS):
            axis = axes[index * 3 + column]
            for stat, style in (("p99", "-"), ("p50", "--")):
                for config, points in _series(rows, key, f"{metric}_{stat}").items():
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
            _log2_axis(axis, levels)
            axis.set_yscale("log")
            axis.set_title(f"{name} - {_title(key, averaged)}", fontsize=9)
            axis.set_xlabel("concurrency")
            axis.set_ylabel(
                f"{name} {metrics.metric(f'{metric}_p50').unit} (p99 solid, p50 dashed)",
                fontsize=8,
            )
            axis.grid(alpha=0.3)
    return Plot(
        "latency",
        "TTFT, ITL and TPOT against concurrency",
        "Per config, the level's 99th (solid) and 50th (dashed) percentiles of time to first "
        "token, inter-token latency (each event's gap spread over the tokens it carried) and "
        "time per output token (a request's decode time over its tokens after the first), "
        "closed-loop levels only, on a log scale.",
        _png(figure),
        details={"panels": [_title(k, averaged) for k in keys]},
    )


def throughput_latency(table: list[dict], palette: dict) -> Plot | None:
    """Output tokens/s against mean E2E latency, one line per config, points by concurrency."""
    rows = [r for r in table if r.get("e2e_ms_mean") is not None and r["output_tokens_per_s"]]
    if not rows:
        return None
    keys, averaged = _panels(rows)
    figure, axes = _figure(len(keys), width=5.5, height=4.2)
    flagged = _flagged(table)
    for axis, key in zip(axes, keys, strict=True):
        latency_s = _series(rows, key, "e2e_ms_mean")
        throughput_s = _series(rows, key, "output_tokens_per_s")
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
        axis.set_title(_title(key, averaged), fontsize=10)
        axis.set_xlabel("mean end-to-end latency per request (s)")
        axis.set_ylabel(metrics.axis_label("output_tokens_per_s"))
        axis.grid(alpha=0.3)
    return Plot(
        "throughput_latency",
        "Throughput against end-to-end latency",
        "Each point is one closed-loop concurrency level (its label): output tokens/s of the "
        "server against the mean time a request took from sending to its last token. Up and to "
        "the left is better; where a line turns right without rising, more concurrency only "
        "adds queueing.",
        _png(figure),
    )


def latency_cdf(samples: dict, concurrency: int | None, palette: dict) -> Plot | None:
    """samples: {panel: {config: {"ttft": [...], "itl": [...], "prompt_sets": [...]}}}."""
    if not samples or concurrency is None:
        return None
    panels = sorted(samples)[:MAX_HOST_PANELS]
    figure, axes = _figure(2 * len(panels), width=5.0, columns=2)
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
    return Plot(
        "latency_cdf",
        f"TTFT and ITL distributions at concurrency {concurrency}",
        f"Cumulative distributions at concurrency {concurrency}, one curve per config: each "
        "request's time to first token, and each token's inter-token latency (an event's gap "
        "spread over the tokens it carried), from the request records of the level's files. "
        "Further left is faster; the top of each curve is its tail.",
        _png(figure),
        details={"concurrency": concurrency, "counts": drawn},
    )


def rate_plot(table: list[dict], palette: dict) -> Plot | None:
    """Rate levels (r<R>.json): output tokens/s and TTFT p99 against the request rate."""
    rows = [r for r in table if r.get("request_rate") is not None]
    if not rows:
        return None
    keys, averaged = _latency_keys(rows)
    figure, axes = _figure(2 * len(keys), width=5.0, columns=2)
    for index, key in enumerate(keys):
        for column, (metric, name) in enumerate(
            (
                ("output_tokens_per_s", metrics.axis_label("output_tokens_per_s")),
                ("ttft_ms_p99", _stat_label(metrics.metric("ttft_ms_p99"))),
            )
        ):
            axis = axes[index * 2 + column]
            for config, points in _series(rows, key, metric, x="request_rate").items():
                x, y = zip(*points, strict=True)
                axis.plot(x, y, marker="o", color=palette[config], label=config)
            axis.set_title(f"{name} - {_title(key, averaged)}", fontsize=9)
            axis.set_xlabel("request rate (requests/s, Poisson arrivals)")
            axis.set_ylabel(name)
            axis.grid(alpha=0.3)
    return Plot(
        "rate",
        "Throughput and TTFT against request rate",
        "Rate levels: requests arrive as a Poisson process at the given rate (open loop), one "
        "line per config. Throughput follows the rate until the server saturates; past that "
        "point TTFT p99 climbs as requests queue.",
        _png(figure),
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
    for (group, config), level in list(picked.items())[: MAX_CDF_CONFIGS * MAX_HOST_PANELS]:
        # TTFT from the records' own ttft_ms (read already); ITL from their token events.
        _ttft, itl = level_latencies(Path(results.root) / level.path)
        out.setdefault(group, {})[config] = {
            "ttft": [v for v in level.ttft if not math.isnan(v)],
            "itl": itl,
            "prompt_sets": [level.prompt_set],
        }
    return out


# -- measured against predicted ----------------------------------------------------------------

# (column measured, column predicted, axis label) of the concurrency figure's panels.
PREDICTED_PANELS = (
    ("step_ms", "step_ms_predicted", _with_unit("step_ms")),
    (
        "accepted_tokens_per_step",
        "accepted_tokens_per_step_predicted",
        metrics.label("accepted_tokens_per_step"),
    ),
    (
        "output_tokens_per_s",
        "tokens_per_s_predicted",
        f"{metrics.label('output_tokens_per_s')} (server)",
    ),
)
MAX_PREDICTED_KEYS = 4
MAX_SHAPE_ROWS = 8


def _measured_and_predicted(axis, points: dict, palette: dict) -> None:
    """One config's measured (solid) and predicted (dashed) line per entry of points:
    {config: [(x, measured, predicted)]}."""
    for config, values in points.items():
        values = sorted(values)
        color = palette.get(config, "#444444")
        measured = [(x, m) for x, m, _p in values if m is not None]
        model = [(x, p) for x, _m, p in values if p is not None]
        if measured:
            axis.plot(*zip(*measured, strict=True), marker="o", color=color, label=config)
        if model:
            axis.plot(
                *zip(*model, strict=True),
                marker=".",
                linestyle="--",
                color=color,
                alpha=0.8,
                label="_",
            )


def _style_legend(axis) -> None:
    """Proxy entries saying which line is which."""
    axis.plot([], [], color="#444444", marker="o", label="measured (solid)")
    axis.plot([], [], color="#444444", marker=".", linestyle="--", label="predicted (dashed)")
    axis.plot(
        [],
        [],
        color="#444444",
        linestyle=":",
        label="predicted on the profile's figures alone (dotted, where the host's records differ)",
    )


def _profile_only(axis, rows: list[dict], palette: dict) -> None:
    """The step the profile's figures alone predict, where the host's records (calibration,
    all-reduce) changed it: the gap a slow host's own records explain."""
    points: dict[str, list] = {}
    for row in sorted(rows, key=lambda r: (config_order(r["config"]), r["concurrency"])):
        # A record within a percent of the profile's figures would draw over the dashed line.
        if (
            abs(row["step_ms_predicted_profile"] - row["step_ms_predicted"])
            > 0.01 * row["step_ms_predicted"]
        ):
            points.setdefault(row["config"], []).append(
                (row["concurrency"], row["step_ms_predicted_profile"])
            )
    for config, values in points.items():
        axis.plot(
            *zip(*values, strict=True),
            linestyle=":",
            color=palette.get(config, "#444444"),
            label="_",
        )


def predicted_concurrency(rows: list[dict], palette: dict) -> Plot | None:
    """Step time, accepted tokens per step and the server's tokens/s against concurrency,
    measured (solid) and as the speed model predicts them (dashed), one color per config."""
    if not rows:
        return None
    keys = sorted({(r["host"], r["prompt_set"]) for r in rows})[:MAX_PREDICTED_KEYS]
    figure, axes = _figure(3 * len(keys), width=4.6, columns=3)
    levels = [r["concurrency"] for r in rows]
    for index, key in enumerate(keys):
        mine = [r for r in rows if (r["host"], r["prompt_set"]) == key]
        for column, (measured, model, name) in enumerate(PREDICTED_PANELS):
            axis = axes[index * 3 + column]
            points: dict[str, list] = {}
            for row in sorted(mine, key=lambda r: (config_order(r["config"]), r["concurrency"])):
                points.setdefault(row["config"], []).append(
                    (row["concurrency"], row[measured], row[model])
                )
            _measured_and_predicted(axis, points, palette)
            if column == 0:
                _profile_only(axis, mine, palette)
            if index == 0 and column == 0:
                _style_legend(axis)
            _log2_axis(axis, levels)
            axis.set_title(f"{name} - {key[0]} - {key[1]}", fontsize=9)
            axis.set_xlabel("concurrency")
            axis.set_ylabel(name, fontsize=8)
            axis.grid(alpha=0.3)
    return Plot(
        "predicted_concurrency",
        "Measured against predicted, over concurrency",
        "Per config (color), what each closed-loop level measured (solid) and what the speed "
        "model predicts for its launch, hardware profile, concurrency and measured context "
        "(dashed): the decode step time, accepted tokens per step (the drafter's published "
        "acceptance) and the server's output tokens/s. Dotted, on the step-time panels: the "
        "step the profile's figures alone predict, where the host's own records (its speed "
        "calibration, its all-reduce check) changed the prediction. predicted.csv has every "
        "figure and ratio.",
        _png(figure),
        details={"panels": [f"{k[0]} - {k[1]}" for k in keys]},
    )


def predicted_budget(shapes: list) -> Plot | None:
    """Per DDTree level: step time, accepted tokens per step and tokens/s per request against
    the budget, measured and as the speed model predicts them, with the sweep's verdict."""
    shapes = shapes[:MAX_SHAPE_ROWS]
    if not shapes:
        return None
    figure, axes = _figure(3 * len(shapes), width=4.6, columns=3)
    measured_style = {"marker": "o", "color": "#1f77b4", "label": "measured"}
    model_style = {
        "marker": ".",
        "linestyle": "--",
        "color": "#ff7f0e",
        "label": "speed model (published acceptance)",
    }
    step_only = {
        "marker": ".",
        "linestyle": ":",
        "color": "#2ca02c",
        "label": "speed model's step time, measured acceptance",
    }
    for index, shape in enumerate(shapes):
        budgets = list(shape.budgets)
        panels = (
            (
                _with_unit("step_ms"),
                list(shape.step_ms),
                [(list(shape.predicted_step_ms), model_style)],
            ),
            (
                metrics.label("accepted_tokens_per_step"),
                list(shape.accepted_tokens_per_step),
                [(list(shape.predicted_accepted), model_style)],
            ),
            (
                "tokens/s per request",
                list(shape.rates),
                [
                    (_model_rates(shape, shape.predicted_accepted), model_style),
                    (_model_rates(shape, shape.accepted_tokens_per_step), step_only),
                ],
            ),
        )
        heading = (
            f"{shape.host} - tp{shape.tp_size} - {shape.prompt_set} - c{shape.concurrency}: "
            f"{sweep.SHAPE_WORDS[shape.verdict]}"
        )
        for column, (name, measured, models) in enumerate(panels):
            axis = axes[index * 3 + column]
            axis.plot(budgets, measured, **measured_style)
            for values, style in models:
                points = [
                    (b, v) for b, v in zip(budgets, values or [], strict=False) if v is not None
                ]
                if points:
                    axis.plot(*zip(*points, strict=True), **style)
            axis.axvline(shape.best_budget, color="#888888", linewidth=1, linestyle=":")
            _log2_axis(axis, budgets)
            axis.set_title(heading if column == 0 else name, fontsize=8)
            axis.set_xlabel("DDTree budget")
            axis.set_ylabel(name, fontsize=8)
            axis.grid(alpha=0.3)
    return Plot(
        "predicted_budget",
        "Measured against predicted, over the DDTree budget",
        "Per host, TP size, prompt set and level with a DDTree sweep: step time, accepted "
        "tokens per step and tokens/s per request against the budget as measured (blue); as "
        "the speed model predicts them, its step time from the routed experts each budget's "
        "verify step touches and its acceptance from the drafter's published figure (orange, "
        "dashed); the model's step time with the measured acceptance (green, dotted), which "
        "judges the step alone; the best budget as a grey line, the verdict (acceptance "
        "collapse, cost growth, saturation or gain: the DDTree budget diagnosis) in the title.",
        _png(figure),
        details={"rows": [f"{s.host} {s.prompt_set} c{s.concurrency} {s.verdict}" for s in shapes]},
    )


def _model_rates(shape, accepted) -> list[float | None] | None:
    """Tokens/s per request from the model's step time and the given acceptance."""
    if not shape.predicted_step_ms or not accepted:
        return None
    return [
        a / p * 1000.0 if p and a is not None else None
        for a, p in zip(accepted, shape.predicted_step_ms, strict=True)
    ]
