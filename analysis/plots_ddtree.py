"""The DDTree budget figures: accept length against the budget, and the decomposition of
tokens/s per request into step time and accepted tokens per step, one row per host and level,
with the sweep's collapsed and saturated budgets marked and a published study beside them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ansible.module_utils.contract import metrics

from analysis import canvas, references, sweep
from analysis.results import CHAIN_CONTROL

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


def _tree_rows(table: list[dict]) -> list[dict]:
    return [r for r in table if r["ddtree_budget"] is not None]


# Line styles of a sweep's TP sizes, past the first.
TP_DASHES = ("-", "-.", (0, (5, 1)), (0, (1, 1)))


def accept_vs_budget(table: list[dict]) -> canvas.Plot | None:
    trees = _tree_rows(table)
    if not trees:
        return None
    hosts = sorted({r["host"] for r in trees})[: canvas.MAX_PANELS]
    figure, axes = canvas.new_figure(len(hosts))
    prompt_sets = sorted({r["prompt_set"] for r in trees})
    shade = {p: f"C{i % 10}" for i, p in enumerate(prompt_sets)}
    card = references.DFLASH_K26_CARD
    low, high = card["accept_length_range"]
    # A sweep at several TP sizes gets a line per TP size (dashes past the first), never an
    # average across them.
    sizes = sorted({r.get("tp_size") for r in trees}, key=lambda t: t or 0)
    for axis, host in zip(axes, hosts, strict=True):
        drawn_reference = False
        for prompt_set in prompt_sets:
            color = shade[prompt_set]
            _budget_lines(axis, trees, host, prompt_set, sizes, color)
            _chain_line(axis, table, host, prompt_set, color)
            drawn_reference |= _published_line(axis, prompt_set, color, drawn_reference)
        axis.axhspan(
            low,
            high,
            color="#bbbbbb",
            alpha=0.25,
            linewidth=0,
            label=f"{card['source']}: {low:g}-{high:g} by dataset",
        )
        canvas.log2_axis(axis, [r["ddtree_budget"] for r in trees])
        axis.set_title(host, fontsize=10)
        axis.set_xlabel("DDTree node budget")
        axis.set_ylabel(metrics.axis_label("accept_length_mean"))
        axis.grid(alpha=0.3)
    return canvas.Plot(
        "accept_vs_budget",
        "Accept length against DDTree budget",
        "Token-weighted mean accept length (tokens each verify step added; the first token, "
        "from prefill, is no verify step's) per prompt set, averaged over concurrency levels. "
        f"Dashed: DFlash's single chain on the same prompts ({CHAIN_CONTROL}, the chain on the "
        "DDTree servers' backend, where it ran, else dflash). Grey band: the K2.6 drafter's "
        f"card, acceptance {low:g} to {high:g} depending on the dataset (no per-dataset values "
        "are drawn: none can be cited); dotted: published DFlash figures on Kimi K2.5, another "
        "model, per prompt set.",
        canvas.png(figure),
    )


def _budget_lines(axis, trees: list[dict], host: str, prompt_set: str, sizes, color) -> None:
    """The host's DDTree accept length against the budget on one prompt set, a line per TP
    size (named where there are several)."""
    for index, tp in enumerate(sizes):
        by_budget: dict[int, list] = {}
        for row in trees:
            if row["host"] == host and row["prompt_set"] == prompt_set and row.get("tp_size") == tp:
                by_budget.setdefault(row["ddtree_budget"], []).append(row["accept_length_mean"])
        points = [
            (b, canvas.mean(v)) for b, v in sorted(by_budget.items()) if canvas.mean(v) is not None
        ]
        if points:
            x, y = zip(*points, strict=True)
            at = f", TP{tp if tp is not None else '?'}" if len(sizes) > 1 else ""
            axis.plot(
                x,
                y,
                marker="o",
                color=color,
                linestyle=TP_DASHES[index % len(TP_DASHES)],
                label=f"DDTree, {prompt_set}{at}",
            )


def _chain_line(axis, table: list[dict], host: str, prompt_set: str, color) -> None:
    """The single chain's accept length on the same prompts, dashed: the chain control where
    it ran, else dflash."""
    for name in (CHAIN_CONTROL, "dflash"):
        chain = canvas.mean(
            r["accept_length_mean"]
            for r in table
            if r["host"] == host
            and r["prompt_set"] == prompt_set
            and r.get("base_config", r["config"]) == name
        )
        if chain is not None:
            axis.axhline(
                chain,
                color=color,
                linestyle="--",
                linewidth=1,
                label=f"{name} (chain), {prompt_set}",
            )
            return


def _published_line(axis, prompt_set: str, color, named: bool) -> bool:
    """The published DFlash accept length on Kimi K2.5 for the prompt set, dotted (its source
    in the legend once); whether there is one."""
    published = references.DFLASH_K25_ACCEPT
    value = published["accept_length"].get(prompt_set)
    if value is None:
        return False
    axis.axhline(
        value,
        color=color,
        linestyle=":",
        linewidth=1,
        label=published["source"] if not named else None,
    )
    return True


def _cell_means(rows: list[dict], columns: tuple[str, ...]) -> dict[str, float | None]:
    return {c: canvas.mean(r[c] for r in rows) for c in columns}


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
                **{**canvas.REFERENCE_STYLE, "linestyle": "-"},
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
            axis.plot(
                budgets, values, label="published study: ~estimated", **canvas.REFERENCE_STYLE
            )
            for x, y in zip(budgets, values, strict=True):
                axis.annotate(
                    f"~{y:g}", (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points"
                )
        canvas.log2_axis(axis, budgets)
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


def decomposition(table: list[dict], heading: str = "") -> canvas.Plot | None:
    """Step time, accepted tokens per step and their quotient against the budget, one row per
    host (and TP size, where the sweep ran at several) and concurrency level: the
    decomposition that explains a throughput collapse. A heading (the run and its model, in a
    comparison) goes into the image, the title and the caption."""
    cells = _decomposition_cells(table)
    if not cells:
        return None
    keys = sorted(cells, key=_tp_key)[:MAX_DECOMPOSITION_ROWS]
    prompt_sets = sorted({p for key in keys for p in cells[key]})
    drawing = _Decomposition(
        cells=cells,
        chain=_chain_levels(table),
        prompt_sets=prompt_sets,
        shade={p: f"C{i % 10}" for i, p in enumerate(prompt_sets)},
        budgets=sorted({b for key in keys for by in cells[key].values() for b in by}),
    )
    # The TP size is named where the sweep ran at more than one.
    several = len({tp for _, tp, _ in keys}) > 1
    figure, grid = canvas.new_figure(3 * (len(keys) + 1), width=4.6, height=3.2, columns=3, top=1.3)
    for index, (host, tp, level) in enumerate(keys):
        where = f"{host} TP{tp if tp is not None else '?'}" if several else host
        for column, panel in enumerate(DECOMPOSITION_PANELS):
            drawing.panel(grid[index * 3 + column], (host, tp, level), where, panel)
    if any(drawing.control(host, tp, level, None) for host, tp, level in keys):
        grid[0].plot(
            [],
            [],
            color="#555555",
            linestyle="--",
            label=f"{CHAIN_CONTROL}: the chain at the same level (dashed, the prompt set's colour)",
        )
    drawing.panels += _reference_row(grid[len(keys) * 3 : len(keys) * 3 + 3])
    if heading:
        figure.text(0.995, 0.005, heading, fontsize=11, fontweight="bold", ha="right", va="bottom")
    title = "Step time and accepted tokens per step against budget, per concurrency level"
    return canvas.Plot(
        "decomposition",
        f"{heading}: {title}" if heading else title,
        _decomposition_caption(heading, len(cells) - len(keys)),
        canvas.png(figure, legend_columns=3, order=_decomposition_order(prompt_sets)),
        details={
            "panels": drawing.panels,
            "marks": drawing.marked,
            "flagged": sorted(drawing.flagged),
        },
    )


@dataclass
class _Decomposition:
    """What one decomposition figure is drawn from, and what it drew (its Plot's details)."""

    cells: dict[tuple, dict[str, dict[int, dict]]]  # _decomposition_cells
    chain: dict[tuple, dict]  # _chain_levels
    prompt_sets: list[str]
    shade: dict[str, str]  # a colour per prompt set
    budgets: list[int]
    panels: list[str] = field(default_factory=list)
    marked: dict[tuple, str] = field(default_factory=dict)
    flagged: set[tuple] = field(default_factory=set)

    def control(self, host, tp, level, prompt_set) -> dict | None:
        """The chain control's values: at the same TP size, else one whose TP size is
        unknown."""
        found = self.chain.get((host, tp, level, prompt_set))
        return found if found is not None else self.chain.get((host, None, level, prompt_set))

    def panel(self, axis, key: tuple, where: str, panel: tuple) -> None:
        """One panel of a host and level's row: a line per prompt set, and on the accepted
        tokens panel the most one step accepts."""
        name, label, short = panel
        host, tp, level = key
        for prompt_set in self.prompt_sets:
            self._prompt_set_line(axis, key, where, name, prompt_set)
        cap = (self.control(host, tp, level, None) or {}).get("verify_tokens_per_step")
        if name == "accepted_tokens_per_step" and cap:
            axis.axhline(
                cap,
                color="#555555",
                linestyle=":",
                linewidth=1,
                label="most one step accepts (the drafter's block size)",
            )
        canvas.log2_axis(axis, self.budgets)
        axis.set_xlabel("DDTree node budget")
        axis.set_ylabel(label, fontsize=8)
        axis.set_title(f"{where}, concurrency {level}: {short}", fontsize=9)
        axis.grid(alpha=0.3)
        self.panels.append(f"{where} c{level}: {short}")

    def _prompt_set_line(self, axis, key: tuple, where: str, name: str, prompt_set: str) -> None:
        """One prompt set's values against the budget, its budgets' marks, and its chain
        control dashed."""
        host, tp, level = key
        by_budget = self.cells[key].get(prompt_set, {})
        points = [(b, v[name], v) for b, v in sorted(by_budget.items()) if v[name]]
        if not points:
            return
        color = self.shade[prompt_set]
        axis.plot(
            [b for b, _, _ in points],
            [y for _, y, _ in points],
            marker="o",
            color=color,
            label=prompt_set,
        )
        for budget, y, values in points:
            if values["mark"]:
                axis.plot([budget], [y], **MARKS[values["mark"]])
                self.marked[(where, prompt_set, level, budget)] = values["mark"]
            if values["flagged"]:
                axis.plot([budget], [y], **MARKS["flagged"])
                self.flagged.add((where, prompt_set, level, budget))
        control = self.control(host, tp, level, prompt_set)
        if control and control[name]:
            axis.axhline(control[name], color=color, linestyle="--", linewidth=1)


def _decomposition_caption(heading: str, left_out: int) -> str:
    source = references.DDTREE_HYBRID
    points = source["points"]
    measured = ", ".join(f"{p['tokens_per_s']:g}" for p in points)
    steps = ", ".join(f"~{p['step_ms']:g}" for p in points)
    tokens = ", ".join(f"~{p['accepted_tokens_per_step']:g}" for p in points)
    implied = ", ".join(f"{references.estimated_tokens_per_s(p):.1f}" for p in points)
    return (
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
        + (f" {left_out} more host and level rows are in summary.csv." if left_out else "")
    )
