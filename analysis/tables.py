"""The summary table (one row per host, prompt set, config and concurrency) and its output as
CSV and markdown. The recommendation per concurrency band is analysis/recommend.py, the
warnings a reader must see analysis/warning_checks.py, repeats merged into one row
analysis/repeats.py, and the SLOs analysis/slo.py; their names are kept here too, where the
report and the tests have always read them."""

from __future__ import annotations

import csv
import io
import itertools

from ansible.module_utils.contract import metrics
from ansible.module_utils.contract.launch import PP_FLAGS, TP_FLAGS
from ansible.module_utils.contract.names import REFERENCE
from ansible.module_utils.contract.profiles import PROFILE_OF_GPU

from analysis import sweep, telemetry
from analysis.keys import at_tp, closed_loop, is_reference, level_key
from analysis.output import markdown_text
from analysis.recommend import DEFAULT_BAND_EDGES, Pick, bands, recommend
from analysis.repeats import (
    CI_METRICS,
    REPEAT_METRICS,
    T_975,
    mean_interval,
    merge_repeats,
    t_quantile,
    welch_interval,
)
from analysis.results import (
    CHAIN_CONTROL,
    Results,
    base_config,
    ddtree_budget,
    ratio,
    tp_size,
    verify_tokens_per_step,
)
from analysis.slo import (
    MAX_SLO_MS,
    SLO_FORMS,
    SLO_METRICS,
    SLO_STATS,
    SloError,
    goodput,
    parse_slo,
    slo_met,
    slo_misses,
    slo_text,
    slo_value,
    stat_of,
)
from analysis.warning_checks import COLLAPSE_MEANING, WARNING_KINDS, collapse_warnings, warnings

__all__ = [
    "CI_METRICS",
    "COLLAPSE_MEANING",
    "COLUMNS",
    "DEFAULT_BAND_EDGES",
    "DIGITS",
    "GOODPUT_COLUMNS",
    "MARKDOWN_COLUMNS",
    "MAX_SLO_MS",
    "PICK_COLUMNS",
    "PROFILE_OF_GPU",
    "REPEAT_METRICS",
    "SLO_FORMS",
    "SLO_METRICS",
    "SLO_STATS",
    "T_975",
    "WARNING_KINDS",
    "Pick",
    "SloError",
    "accuracy_columns",
    "bands",
    "closed_loop",
    "collapse_warnings",
    "fmt",
    "goodput",
    "gpus_of",
    "level_columns",
    "lossless_state",
    "mean_interval",
    "merge_repeats",
    "parse_slo",
    "pick_columns",
    "picks_table",
    "profile_of",
    "recommend",
    "rows",
    "slo_met",
    "slo_misses",
    "slo_text",
    "slo_value",
    "t_quantile",
    "to_csv",
    "to_markdown",
    "warnings",
    "welch_interval",
]

# Every column list comes from the metric registry (module_utils/contract/metrics.py), one
# entry per column.
COLUMNS = metrics.csv_columns()
# The markdown table is for reading: the columns that tell the story.
MARKDOWN_COLUMNS = metrics.markdown_columns()


def profile_of(provenance: dict) -> str:
    if provenance.get("profile"):
        return str(provenance["profile"])
    models = ((provenance.get("gpu") or {}).get("models")) or {}
    for model in models:
        for marker, profile in PROFILE_OF_GPU:
            if marker in str(model):
                return profile
    return str(next(iter(models), ""))


def gpus_of(provenance: dict) -> int | None:
    """GPUs serving the model: TP x PP from the launch argv (TP spans nodes in SGLang; data
    parallel attention reuses the TP ranks), else the host's GPU count."""
    argv = ((provenance.get("launch") or {}).get("argv")) or []
    tp = pp = None
    for flag, value in itertools.pairwise(argv):
        if not isinstance(flag, str):
            continue
        if flag in TP_FLAGS and _small_count(value):
            tp = int(value)
        elif flag in PP_FLAGS and _small_count(value):
            pp = int(value)
    if tp:
        return tp * (pp or 1)
    count = (provenance.get("gpu") or {}).get("count")
    return count if isinstance(count, int) and count > 0 else None


def _small_count(value) -> bool:
    # isdecimal, not isdigit: int() refuses "²"; a GPU count has a few digits.
    return isinstance(value, str) and value.isdecimal() and len(value) <= 6


def lossless_state(results: Results, host: str, config: str, reference: str) -> tuple:
    """(state, mismatch rate): reference, passed, flagged or not checked."""
    if is_reference(config, reference):
        return "reference", None
    report = results.lossless.get(host)
    entry = (report or {}).get("configs", {}).get(config)
    if not entry or not entry.get("tokens_compared"):
        return "not checked", None
    rate = entry.get("mismatch_rate")
    return ("flagged" if entry.get("broken_verification") else "passed"), rate


def rows(results: Results, reference: str = REFERENCE, slo: dict | None = None) -> list[dict]:
    """One row per level, in the table's order, with speedups against the reference config on
    the same host, prompt set, concurrency (or request rate), repeat and TP size; DDTree rows
    also against the chain control (CHAIN_CONTROL, or it expanded over TP sizes) there, and
    each closed-loop budget's mark from the sweep's diagnosis. Repeats of a level are
    averaged into one row (merge_repeats). `slo` ({key: ms}, parse_slo) fills slo_met and
    goodput_requests_per_s. A row holds every column of the metric registry, MEASURED ones
    read from the level's summary, the others from level_columns."""
    baselines = _baselines(results, reference)
    out = []
    for level in results.levels:
        computed = level_columns(results, level, baselines, reference, slo)
        out.append(
            {
                **{
                    m.name: metrics.value(level.summary, m)
                    if m.kind == metrics.MEASURED
                    else computed[m.name]
                    for m in metrics.METRICS
                },
                "slo_values": {k: slo_value(level.summary, k) for k in slo} if slo else {},
                "file": level.path,
                "files": [level.path],
            }
        )
    out = merge_repeats(out)
    if slo:
        for row in out:
            row["slo_met"] = slo_met(row["slo_values"], slo)
    diagnosis = sweep.diagnose(closed_loop(out))
    for row in closed_loop(out):
        if row["ddtree_budget"] is not None:
            row["budget_diagnosis"] = diagnosis.mark(row)
    return out


def _baselines(results: Results, reference: str) -> tuple[dict, dict]:
    """Per level key and TP size: the reference's output tokens/s, and the chain control's
    (config, output tokens/s)."""
    base: dict[tuple, dict] = {}
    chain: dict[tuple, dict] = {}
    for level in results.levels:
        key = level_key(level)
        tp = tp_size(level.config, level.provenance)
        value = level.summary.get("output_tokens_per_s")
        if is_reference(level.config, reference) and value:
            base.setdefault(key, {})[tp] = value
        if base_config(level.config) == CHAIN_CONTROL:
            chain.setdefault(key, {})[tp] = (level.config, value)
    return base, chain


def level_columns(results: Results, level, baselines: tuple, reference: str, slo) -> dict:
    """The columns of a level's row that are not MEASURED: what names the level, what the
    analysis computes from it and its neighbours (speedups, per-user and per-GPU rates,
    losslessness, accuracy, power), and the placeholders rows() and merge_repeats() fill."""
    base, chain = baselines
    summary = level.summary
    throughput = summary.get("output_tokens_per_s")
    tp = tp_size(level.config, level.provenance)
    key = level_key(level)
    tpot = stat_of(summary, "tpot_ms", "mean")
    gpus = gpus_of(level.provenance)
    state, rate = lossless_state(results, level.host, level.config, reference)
    budget = ddtree_budget(level.config, level.provenance)
    # Only DDTree rows have a chain to be compared with; the control must have run at the
    # same host, prompt set, level and TP size.
    control, chain_value = (at_tp(chain, key, tp) if budget is not None else None) or (None, None)
    return {
        "host": level.host,
        "profile": profile_of(level.provenance),
        "prompt_set": level.prompt_set,
        "config": level.config,
        "base_config": base_config(level.config),
        "tp_size": tp,
        "ddtree_budget": budget,
        "verify_tokens_per_step": verify_tokens_per_step(level.config, level.provenance),
        "concurrency": level.concurrency,
        "speedup_vs_ar": ratio(throughput, at_tp(base, key, tp)),
        "chain_control": control,
        "speedup_vs_chain": ratio(throughput, chain_value),
        "budget_diagnosis": None,
        "tokens_per_s_per_user": ratio(1000.0, tpot),
        "tokens_per_s_per_gpu": ratio(throughput, gpus),
        **telemetry.columns(summary, throughput, telemetry.server_gpu_indexes(level.provenance)),
        "gpus": gpus,
        "client_saturated": bool(level.client.get("saturated")),
        "server_crashed": level.crashed,
        "lossless": state,
        "mismatch_rate": rate,
        **accuracy_columns(summary.get("accuracy")),
        "request_rate": level.request_rate,
        "workload": (level.workload or {}).get("name"),
        "repeats": 1,
        **{f"{m}_ci95_{end}": None for m in CI_METRICS for end in ("low", "high")},
        "under_filled": bool(level.fill.get("under_filled")),
        "slo_met": None,
        "goodput_requests_per_s": goodput(level, slo) if slo else None,
    }


def accuracy_columns(accuracy) -> dict:
    """accuracy, accuracy_n, accuracy_unanswered of a level's summary.accuracy (checked by
    analysis.results.accuracy_problems); None each for an unscored set. The accuracy is
    recomputed from the counts: the one the pairing and the warnings use."""
    if not isinstance(accuracy, dict):
        return {"accuracy": None, "accuracy_n": None, "accuracy_unanswered": None}
    n = accuracy["n"]
    return {
        "accuracy": accuracy["correct"] / n if n else None,
        "accuracy_n": n,
        "accuracy_unanswered": accuracy["unanswered"],
    }


# -- output ----------------------------------------------------------------------------


# Number formats where the default (.2f, .1f from 1000) says too little: the registry's, and
# those of the other tables' columns.
DIGITS = {**metrics.digits(), "reference_accuracy": ".3f", "p_value": ".3g"}


def fmt(value, column: str = "") -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if column in DIGITS:
            return format(value, DIGITS[column])
        return f"{value:.2f}" if abs(value) < 1000 else f"{value:.1f}"
    return str(value)


def to_csv(table: list[dict], columns=COLUMNS) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in table:
        writer.writerow(
            [
                ("true" if row[c] else "false")
                if isinstance(row[c], bool)
                else (
                    ""
                    if row[c] is None
                    else round(row[c], 6)
                    if isinstance(row[c], float)
                    else row[c]
                )
                for c in columns
            ]
        )
    return buffer.getvalue()


def to_markdown(table: list[dict], columns=MARKDOWN_COLUMNS) -> str:
    def cell(text: str) -> str:
        return markdown_text(text)

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in table:
        lines.append("| " + " | ".join(cell(fmt(row.get(c), c)) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def pick_columns(slo: dict | None) -> tuple[str, ...]:
    """The recommendation's columns: with SLOs, the pick's goodput and its interval beside its
    throughput."""
    if not slo:
        return PICK_COLUMNS
    at = PICK_COLUMNS.index("output_tokens_per_s") + 1
    return (*PICK_COLUMNS[:at], *GOODPUT_COLUMNS, *PICK_COLUMNS[at:])


def picks_table(picks: list[Pick]) -> list[dict]:
    return [
        {
            "host": p.host,
            "band": p.band,
            "levels": p.levels,
            "config": p.config or "(none)",
            "ddtree_budget": p.ddtree_budget,
            "output_tokens_per_s": p.output_tokens_per_s,
            "speedup_vs_ar": p.speedup_vs_ar,
            "goodput_requests_per_s": p.goodput_requests_per_s,
            "goodput_requests_per_s_ci95_low": p.goodput_ci95[0] if p.goodput_ci95 else None,
            "goodput_requests_per_s_ci95_high": p.goodput_ci95[1] if p.goodput_ci95 else None,
            "note": p.note,
            # report.json only: per config that missed an SLO, each {key, value, threshold,
            # concurrency, prompt_set}.
            "slo_rejected": p.slo_rejected,
        }
        for p in picks
    ]


GOODPUT_COLUMNS = (
    "goodput_requests_per_s",
    "goodput_requests_per_s_ci95_low",
    "goodput_requests_per_s_ci95_high",
)
PICK_COLUMNS = (
    "host",
    "band",
    "levels",
    "config",
    "ddtree_budget",
    "output_tokens_per_s",
    "speedup_vs_ar",
    "note",
)
