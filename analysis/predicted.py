"""Measured against predicted: the speed model's figure for every closed-loop level beside
what the level measured, a warning where a step ran more than 25% slower than the model
expects with the part the run's records point at, and the speed model's view of each DDTree
sweep (analysis.sweep.shapes).

The prediction is module_utils/plan/speed_model.py's predict_launch for the level's own launch (its
argv as the provenance records it), the host's hardware profile (group_vars/all/
speed_hardware.json), the level's measured mean context per request (analysis.results:
prompt + half the output, token-weighted) and its concurrency, with the host's records laid
over the profile's nominal figures where the run recorded them: the speed calibration (copy
bandwidth, the MoE layer's fit) and the tuning stage's all-reduce check (a table of message
sizes and times, used where it was measured over as many GPUs as the launch's TP size).
Accepted tokens per step come from the drafter's published acceptance for the prompt set
(models/<model>/acceptance.json; DDTree: the tree its budget buys from that chain).

Measured: step_ms (decode time over verify steps, every request of the level), accepted
tokens per step ((output tokens - 1) over verify steps; 1 without speculation), tokens/s per
request (their quotient: a request's decode speed) and the server's output tokens/s (which
also pays prefill, the level's ramp and its drain, so its ratio sits below the others).

The model's step time does not depend on acceptance (the tokens a step verifies are fixed by
the launch), so the step-time ratio judges the step alone and the accepted-tokens ratio the
drafter alone; tokens_per_s_predicted_at_measured_acceptance is the model's step time with the
acceptance the level measured, the throughput the step alone would give.

The warnings, slower_than_predicted with the part the records point at and
acceptance_below_published, are analysis.predicted_warnings'.

Everything read from the results is outside input: the launch argv, the records, the context
and the measured figures are type-checked and bounded here or in the speed model, and a level
or record that cannot be used is skipped with a note (report.json predicted.notes), never an
exception.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from ansible.module_utils.plan import speed_inputs, speed_model

from analysis import predicted_warnings, sweep

# The report states the warnings' thresholds, read from here.
from analysis.predicted_warnings import ACCEPT_LOW as ACCEPT_LOW
from analysis.predicted_warnings import SLOW as SLOW
from analysis.results import Results, run_model

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"
# The kit's model before models were data: what a run.json without a model ran.
DEFAULT_MODEL = "kimi-k2.6"
_MODEL_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
# DFlash in SGLang 0.5.23 caps --max-running-requests at 48 when the launch leaves it unset.
DFLASH_RUNNING_CAP = 48
MAX_ARGV = 1024
MAX_ARG_CHARS = 4096
MAX_NOTE_PLACES = 200
MAX_CONTEXT = 1 << 24
# The model's own warning-free errors: a record or launch it refuses (SpeedModelError is a
# ValueError), or one shaped so oddly that a figure it reads is the wrong type.
_MODEL_ERRORS = (ValueError, TypeError, KeyError, ArithmeticError)

# predicted.csv, one row per closed-loop level predicted.
COLUMNS = (
    "host",
    "profile",
    "prompt_set",
    "config",
    "tp_size",
    "ddtree_budget",
    "concurrency",
    "batch",
    "verify_tokens_per_request",
    "context_tokens",
    "figures",
    "step_ms",
    "step_ms_predicted",
    "step_ms_ratio",
    "step_ms_predicted_profile",
    "accepted_tokens_per_step",
    "accepted_tokens_per_step_predicted",
    "accepted_tokens_per_step_ratio",
    "acceptance_source",
    "tokens_per_s_per_request",
    "tokens_per_s_per_request_predicted",
    "tokens_per_s_per_request_ratio",
    "output_tokens_per_s",
    "tokens_per_s_predicted",
    "tokens_per_s_ratio",
    "tokens_per_s_predicted_at_measured_acceptance",
    "experts_touched_per_layer",
    "slower_than_predicted",
)
# What the report's table and summary.md show.
SHORT_COLUMNS = (
    "host",
    "prompt_set",
    "config",
    "concurrency",
    "context_tokens",
    "step_ms",
    "step_ms_predicted",
    "step_ms_ratio",
    "accepted_tokens_per_step",
    "accepted_tokens_per_step_predicted",
    "accepted_tokens_per_step_ratio",
    "tokens_per_s_per_request_ratio",
    "tokens_per_s_ratio",
    "slower_than_predicted",
)
SHAPE_COLUMNS = (
    "host",
    "tp_size",
    "prompt_set",
    "concurrency",
    "verdict",
    "budgets",
    "best_budget",
    "model_best_budget",
    "accepted_tokens_per_step",
    "step_ms",
    "predicted_step_ms",
    "experts_touched_per_layer",
    "explanation",
)


@dataclass
class Predictions:
    """What report() shows: a row per predicted level, the warnings, the DDTree shapes, and
    a note for every level or record the model could not use."""

    rows: list[dict] = field(default_factory=list)
    warnings: list[dict] = field(default_factory=list)
    shapes: list[sweep.Shape] = field(default_factory=list)
    notes: dict[str, list[str]] = field(default_factory=dict)  # note -> where
    model: str | None = None

    def note(self, where: str, text: str) -> None:
        places = self.notes.setdefault(text, [])
        if len(places) < MAX_NOTE_PLACES and where not in places:
            places.append(where)

    def note_rows(self) -> list[dict]:
        return [{"note": text, "where": places} for text, places in self.notes.items()]

    def shape_rows(self) -> list[dict]:
        return [s.figures() for s in self.shapes]

    def shape_table(self) -> list[dict]:
        """The DDTree diagnosis as table cells: each list as 'a -> b -> c'."""

        def joined(values, digits: int) -> str:
            return " -> ".join("" if v is None else f"{v:.{digits}f}" for v in values)

        return [
            {
                **row,
                "verdict": sweep.SHAPE_WORDS[row["verdict"]],
                "budgets": " -> ".join(f"b{b}" for b in row["budgets"]),
                "accepted_tokens_per_step": joined(row["accepted_tokens_per_step"], 2),
                "step_ms": joined(row["step_ms"], 1),
                "predicted_step_ms": joined(row["predicted_step_ms"], 1),
                "experts_touched_per_layer": joined(row["experts_touched_per_layer"], 0),
            }
            for row in self.shape_rows()
        ]


def _positive(value, high: float = 1e12) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and 0 < value <= high else None


def _ratio(measured, predicted) -> float | None:
    """measured / predicted to 4 significant digits: 4 decimals left a ratio of 0.0487 (a
    simulated 7.7 ms step against a predicted 159) off by 0.1%."""
    if measured is None or not predicted:
        return None
    return float(f"{measured / predicted:.4g}")


def _argv(provenance: dict) -> tuple[list[str] | None, str | None]:
    """(the launch's argv, None) or (None, why it cannot be used)."""
    launch = provenance.get("launch") if isinstance(provenance, dict) else None
    argv = launch.get("argv") if isinstance(launch, dict) else None
    if not isinstance(argv, list) or not argv:
        return None, "the level records no launch argv (provenance.launch.argv)"
    if len(argv) > MAX_ARGV or not all(
        isinstance(a, str) and len(a) <= MAX_ARG_CHARS for a in argv
    ):
        return None, (
            f"the launch argv is not a list of at most {MAX_ARGV} strings (provenance.launch.argv)"
        )
    return argv, None


def _flag(argv: list[str], name: str) -> str | None:
    value = None
    for index, item in enumerate(argv):
        if item == name and index + 1 < len(argv):
            value = argv[index + 1]
        elif item.startswith(name + "="):
            value = item.split("=", 1)[1]
    return value


def _running_cap(argv: list[str], algorithm: str) -> int | None:
    value = _flag(argv, "--max-running-requests")
    if value is not None and value.isdecimal() and 0 < int(value) <= speed_inputs.MAX_CONCURRENCY:
        return int(value)
    return DFLASH_RUNNING_CAP if algorithm == "DFLASH" else None


def _model_inputs(results: Results, found: Predictions):
    """The run's model folder's config, drafters and published acceptance, or None (noted)."""
    model = run_model(results.run) or {}
    name = model.get("name") if isinstance(model, dict) else None
    if name is None:
        name = DEFAULT_MODEL
        found.note(
            "run",
            f"run.json names no model (a run from before models were data): predicted as "
            f"{DEFAULT_MODEL}, the kit's model then",
        )
    if not isinstance(name, str) or not _MODEL_NAME.match(name):
        found.note("run", f"run.json's model name {str(name)[:80]!r} is not a model folder's name")
        return None
    folder = MODELS_DIR / name
    if not (folder / "config.json").is_file():
        found.note(
            "run",
            f"no model folder models/{name} with a config.json in this kit: nothing predicted",
        )
        return None
    try:
        inputs = speed_inputs.model_inputs(folder)
    except _MODEL_ERRORS as error:
        found.note("run", f"the model folder models/{name} cannot be modelled: {error}")
        return None
    found.model = name
    return inputs


def _host_figures(
    profile_figures: dict, provenance: dict, tp: int, where: str, found: Predictions
) -> tuple[dict, list[str]]:
    """The profile's figures with the host's records laid over them, and which were."""
    figures, used = profile_figures, []
    record = provenance.get("speed_calibration")
    if record is not None:
        try:
            figures = speed_inputs.apply_calibration(figures, record)
            used.append("this host's calibration")
        except _MODEL_ERRORS as error:
            found.note(where, f"the host's speed calibration record was not used: {error}")
    record = provenance.get("allreduce")
    if record is not None:
        gpus = record.get("gpus") if isinstance(record, dict) else None
        if not isinstance(record, dict):
            found.note(where, "the host's all-reduce record is not an object: not used")
        elif isinstance(gpus, int) and not isinstance(gpus, bool) and gpus != tp:
            found.note(
                where,
                f"the host's all-reduce record was measured over {gpus} GPUs, the launch runs "
                f"TP {tp}: the profile's all-reduce figure is used",
            )
        else:
            when = str(record.get("recorded_at") or "undated")[:40]
            try:
                figures = speed_inputs.apply_allreduce(
                    figures, record, f"this host's all-reduce check ({when})"
                )
                used.append("this host's all-reduce check")
            except _MODEL_ERRORS as error:
                found.note(where, f"the host's all-reduce record was not used: {error}")
    return figures, used


def _context(levels: list, where: str, found: Predictions) -> int | None:
    means = [lv.context_tokens_mean for lv in levels if lv.context_tokens_mean is not None]
    skipped = sum(lv.context_skipped for lv in levels)
    if skipped:
        found.note(
            where,
            f"{skipped} request(s) without a usable prompt_tokens count were left out of the "
            "measured context",
        )
    if not means:
        found.note(where, "no request records a prompt_tokens count: its context is unknown")
        return None
    mean = sum(means) / len(means)
    if not 0 <= mean <= MAX_CONTEXT:
        found.note(where, f"its measured context ({mean:g} tokens) is out of range")
        return None
    return max(1, round(mean))


def predict(results: Results, table: list[dict]) -> Predictions:
    """Every closed-loop row of the summary table (analysis.tables.rows) against the speed
    model, the warnings that follow and the DDTree sweeps' shapes."""
    found = Predictions()
    try:
        hardware = speed_inputs.load_hardware()
    except _MODEL_ERRORS as error:
        found.note("run", f"the kit's hardware figures cannot be read: {error}")
        return found
    inputs = _model_inputs(results, found)
    by_path = {level.path: level for level in results.levels}
    model_points: dict[tuple, dict] = {}
    curves: dict[tuple, tuple] = {}  # DDTree level -> what ddtree_curve needs
    for row in table:
        if row.get("request_rate") is not None or inputs is None:
            continue
        levels = [by_path[f] for f in row.get("files") or [row.get("file")] if f in by_path]
        if not levels:
            continue
        where = f"{row['host']} / {row['config']} / {row['prompt_set']} / c{row['concurrency']}"
        made = _predict_row(row, levels, inputs, hardware, where, found)
        if made is None:
            continue
        prediction, figures, argv, context, tp = made
        if row.get("ddtree_budget") is not None:
            key = (row["host"], row.get("tp_size"), row["prompt_set"], row["concurrency"])
            experts = prediction["parts"].get("routed_experts", {})
            model_points[(*key, row["ddtree_budget"])] = {
                "step_ms": prediction["step_ms"],
                "accepted_tokens_per_step": prediction["accepted_tokens_per_step"],
                "experts_touched_per_layer": experts.get("experts_touched_per_layer"),
                "experts": experts.get("experts"),
                "block_size": speed_inputs.spec_from_argv(argv).get("block_size"),
            }
            curves.setdefault(key, (figures, argv, context, tp, []))[4].append(row["ddtree_budget"])
    found.shapes = sweep.shapes(table, model_points, _best_budgets(inputs, curves, found))
    return found


def _predict_row(row, levels, inputs, hardware, where, found):
    first = levels[0]
    provenance = first.provenance
    profile = row.get("profile")
    if profile not in hardware:
        found.note(
            where,
            f"hardware profile {str(profile)[:60]!r} has no figures in "
            "group_vars/all/speed_hardware.json: not predicted",
        )
        return None
    argv, why = _argv(provenance)
    if argv is None:
        found.note(where, f"{why}: not predicted")
        return None
    context = _context(levels, where, found)
    if context is None:
        return None
    tp = row.get("tp_size") or 1
    nominal = speed_inputs.profile_figures(profile, hardware)
    figures, used = _host_figures(nominal, provenance, tp, where, found)
    kv = _flag(argv, "--kv-cache-dtype") or "auto"
    try:
        shape = speed_inputs.spec_from_argv(argv)
        options = {
            "kv_cache_dtype": kv,
            "max_running_requests": _running_cap(argv, shape["algorithm"]),
        }
        prediction = speed_model.predict_launch(
            inputs, figures, argv, row["concurrency"], context, tp, row["prompt_set"], **options
        )
        profile_only = (
            speed_model.predict_launch(
                inputs, nominal, argv, row["concurrency"], context, tp, row["prompt_set"], **options
            )
            if used
            else prediction
        )
    except _MODEL_ERRORS as error:
        found.note(where, f"the speed model cannot predict this launch: {error}")
        return None
    found.rows.append(_compare(row, levels, prediction, profile_only, used, context, tp, where))
    warning = predicted_warnings.slow_warning(
        found.rows[-1], levels, prediction, profile_only, figures, nominal
    )
    if warning:
        found.rows[-1]["slower_than_predicted"] = ", ".join(warning["likely"]) or "unexplained"
        found.warnings.append(warning)
    found.rows[-1].pop("_parts")
    found.rows[-1].pop("_where")
    return prediction, figures, argv, context, tp


def _compare(row, levels, prediction, profile_only, used, context, tp, where) -> dict:
    step = _positive(row.get("step_ms"))
    accepted = _positive(row.get("accepted_tokens_per_step"), 1e6)
    served = _positive(row.get("output_tokens_per_s"))
    per_request = accepted / step * 1000.0 if step and accepted else None
    batch = prediction["batch"]
    at_measured = (
        round(batch * accepted / prediction["step_ms"] * 1000.0, 2)
        if accepted and prediction["step_ms"]
        else None
    )
    experts = prediction["parts"].get("routed_experts", {})
    return {
        "host": row["host"],
        "profile": row.get("profile"),
        "prompt_set": row["prompt_set"],
        "config": row["config"],
        "tp_size": tp,
        "ddtree_budget": row.get("ddtree_budget"),
        "concurrency": row["concurrency"],
        "batch": batch,
        "verify_tokens_per_request": prediction["verify_tokens_per_request"],
        "context_tokens": context,
        "figures": " + ".join(["the profile's figures", *used]),
        "step_ms": step,
        "step_ms_predicted": prediction["step_ms"],
        "step_ms_ratio": _ratio(step, prediction["step_ms"]),
        "step_ms_predicted_profile": profile_only["step_ms"],
        "accepted_tokens_per_step": accepted,
        "accepted_tokens_per_step_predicted": prediction["accepted_tokens_per_step"],
        "accepted_tokens_per_step_ratio": _ratio(accepted, prediction["accepted_tokens_per_step"]),
        "acceptance_source": prediction["acceptance_source"],
        "tokens_per_s_per_request": None if per_request is None else round(per_request, 3),
        "tokens_per_s_per_request_predicted": prediction["tokens_per_s_per_request"],
        "tokens_per_s_per_request_ratio": _ratio(
            per_request, prediction["tokens_per_s_per_request"]
        ),
        "output_tokens_per_s": served,
        "tokens_per_s_predicted": prediction["tokens_per_s"],
        "tokens_per_s_ratio": _ratio(served, prediction["tokens_per_s"]),
        "tokens_per_s_predicted_at_measured_acceptance": at_measured,
        "experts_touched_per_layer": experts.get("experts_touched_per_layer"),
        "slower_than_predicted": None,
        "step_parts_predicted": {name: part["ms"] for name, part in prediction["parts"].items()},
        "step_parts_predicted_profile": {
            name: part["ms"] for name, part in profile_only["parts"].items()
        },
        "files": [lv.path for lv in levels],
        "_parts": (prediction["parts"], profile_only["parts"]),
        "_where": where,
    }


# -- the DDTree curve ------------------------------------------------------------------------


def _rounded(context: int) -> int:
    """A context to two significant digits: the best budget does not move with a few percent
    of context (its KV and tree-mask parts are small), and levels of one host, prompt set and
    concurrency then share one curve of the model (each curve predicts every budget up to the
    largest: about 10 ms)."""
    digits = max(0, len(str(context)) - 2)
    return max(1, round(context, -digits))


def _best_budgets(inputs, curves: dict, found: Predictions) -> dict[tuple, int]:
    """The budget the model's curve peaks at for each DDTree level, over every budget up to
    the largest the sweep measured."""
    best: dict[tuple, int] = {}
    made: dict[str, int | None] = {}
    for key, (figures, argv, context, tp, budgets) in curves.items():
        host, _tp, prompt_set, concurrency = key
        kv = _flag(argv, "--kv-cache-dtype") or "auto"
        try:
            shape = speed_inputs.spec_from_argv(argv)
            chain, _source = speed_inputs.published_acceptance(
                inputs["acceptance"], "dflash", prompt_set
            )
            same = json.dumps(
                [figures, shape, max(budgets), concurrency, _rounded(context), tp, chain, kv],
                sort_keys=True,
                default=str,
            )
            if same not in made:
                made[same] = speed_model.ddtree_curve(
                    inputs["config"],
                    inputs["drafters"].get("dflash"),
                    figures,
                    shape,
                    [max(budgets)],
                    concurrency,
                    _rounded(context),
                    tp,
                    chain,
                    kv_cache_dtype=kv,
                )["best_budget"]
        except _MODEL_ERRORS as error:
            found.note(
                f"{host} / ddtree / {prompt_set} / c{concurrency}",
                f"the speed model's DDTree curve cannot be drawn: {error}",
            )
            continue
        if made[same] is not None:
            best[key] = made[same]
    return best


def all_warnings(found: Predictions) -> list[dict]:
    return found.warnings + predicted_warnings.acceptance_warnings(found.rows)
