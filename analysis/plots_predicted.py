"""The figures of measured against predicted: each closed-loop level against the speed model
over concurrency, and each DDTree sweep against it over the budget, with the sweep's verdict.
"""

from __future__ import annotations

from ansible.module_utils.contract import metrics

from analysis import canvas, sweep
from analysis.results import config_order

# (column measured, column predicted, axis label) of the concurrency figure's panels.
PREDICTED_PANELS = (
    ("step_ms", "step_ms_predicted", canvas.with_unit("step_ms")),
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


def predicted_concurrency(rows: list[dict], palette: dict) -> canvas.Plot | None:
    """Step time, accepted tokens per step and the server's tokens/s against concurrency,
    measured (solid) and as the speed model predicts them (dashed), one color per config."""
    if not rows:
        return None
    keys = sorted({(r["host"], r["prompt_set"]) for r in rows})[:MAX_PREDICTED_KEYS]
    figure, axes = canvas.new_figure(3 * len(keys), width=4.6, columns=3)
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
            canvas.log2_axis(axis, levels)
            axis.set_title(f"{name} - {key[0]} - {key[1]}", fontsize=9)
            axis.set_xlabel("concurrency")
            axis.set_ylabel(name, fontsize=8)
            axis.grid(alpha=0.3)
    return canvas.Plot(
        "predicted_concurrency",
        "Measured against predicted, over concurrency",
        "Per config (color), what each closed-loop level measured (solid) and what the speed "
        "model predicts for its launch, hardware profile, concurrency and measured context "
        "(dashed): the decode step time, accepted tokens per step (the drafter's published "
        "acceptance) and the server's output tokens/s. Dotted, on the step-time panels: the "
        "step the profile's figures alone predict, where the host's own records (its speed "
        "calibration, its all-reduce check) changed the prediction. predicted.csv has every "
        "figure and ratio.",
        canvas.png(figure),
        details={"panels": [f"{k[0]} - {k[1]}" for k in keys]},
    )


def predicted_budget(shapes: list) -> canvas.Plot | None:
    """Per DDTree level: step time, accepted tokens per step and tokens/s per request against
    the budget, measured and as the speed model predicts them, with the sweep's verdict."""
    shapes = shapes[:MAX_SHAPE_ROWS]
    if not shapes:
        return None
    figure, axes = canvas.new_figure(3 * len(shapes), width=4.6, columns=3)
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
                canvas.with_unit("step_ms"),
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
            canvas.log2_axis(axis, budgets)
            axis.set_title(heading if column == 0 else name, fontsize=8)
            axis.set_xlabel("DDTree budget")
            axis.set_ylabel(name, fontsize=8)
            axis.grid(alpha=0.3)
    return canvas.Plot(
        "predicted_budget",
        "Measured against predicted, over the DDTree budget",
        "Per host, TP size, prompt set and level with a DDTree sweep: step time, accepted "
        "tokens per step and tokens/s per request against the budget as measured (blue); as "
        "the speed model predicts them, its step time from the routed experts each budget's "
        "verify step touches and its acceptance from the drafter's published figure (orange, "
        "dashed); the model's step time with the measured acceptance (green, dotted), which "
        "judges the step alone; the best budget as a grey line, the verdict (acceptance "
        "collapse, cost growth, saturation or gain: the DDTree budget diagnosis) in the title.",
        canvas.png(figure),
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
