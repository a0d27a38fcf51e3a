"""The metric registry: one entry per column of summary.csv, in the CSV's order, and the level
file's summary fields the MEASURED ones are read from.

The analysis derives every column list from it (summary.csv's header, the markdown and HTML
tables, the columns compare puts side by side, the metrics whose repeats give intervals, the
number formats, the plots' axis labels), and the level schema's summary (contract/level_schema.py)
is generated from SUMMARY. A metric the level file already carries is one Metric entry here; a
new level field adds its Field (its schema) too, plus the writer's computation
(module_utils/benchmark/stats.py summarize_level). A DERIVED entry names the analysis function
that computes it (computed_by), and analysis/tables.py level_columns gives its value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ansible.module_utils.contract.level_schema_summary import ACCURACY, GPU, PROMPT_LENGTH

# What a column is.
IDENTITY = "identity"  # names the level (host, config, concurrency, its TP size...)
MEASURED = "measured"  # read from the level file: summary.<field>[.<stat>]
DERIVED = "derived"  # computed by the analysis (computed_by names the function)
FLAG = "flag"  # yes or no of the level; a merged row has it when any repeat had it

# Where a column shows in the report's HTML summary table. LEAD and ALWAYS columns are always
# shown (LEAD first), PRESENT and then EXTRA ones where some row has a value (`shown`): the
# level's shape first (rate, workload, repeats), then what only some runs measure (GPU
# telemetry, SLOs). Within each, the CSV's order.
LEAD, ALWAYS, PRESENT, EXTRA, NO = "lead", "always", "present", "extra", "no"

# Display groups, in the order the registry lists them.
GROUPS = (
    "identity",
    "throughput",
    "speedup",
    "latency",
    "speculation",
    "energy",
    "load",
    "quality",
    "repeats",
    "slo",
)
# compare's columns lead with the two figures a rerun must hold: throughput and accuracy.
COMPARE_ORDER = ("throughput", "quality", "speedup", "speculation", "latency")
# The per-repeat values a merged row keeps, for compare's intervals.
REPEAT_ORDER = ("throughput", "speedup", "quality", "speculation", "latency", "energy", "slo")

# The percentiles a distribution field records (the level schema's $defs.stat, with mean, max
# and count).
PERCENTILES = ("p50", "p90", "p99")
DISTRIBUTION = "#/$defs/stat"


@dataclass(frozen=True)
class Field:
    """One property of a level file's summary, as the writer writes it."""

    name: str
    schema: dict
    required: bool = True

    @property
    def distribution(self) -> bool:
        return self.schema.get("$ref") == DISTRIBUTION


@dataclass(frozen=True)
class Metric:
    """One column of the summary rows (summary.csv unless csv is False)."""

    name: str
    kind: str
    group: str
    field: str | None = None  # MEASURED: summary.<field>
    stat: str | None = None  # MEASURED from a distribution: summary.<field>.<stat>
    computed_by: str | None = None  # the analysis function that computes it (dotted name)
    unit: str = ""  # "tokens/s", "ms", "W", "tokens/J", ...
    better: str | None = None  # "higher", "lower" or None (not a figure of merit)
    label: str = ""  # what a plot or a heading calls it
    axis: str = ""  # the axis label where a plot draws it alone (else the label)
    interval_of: str | None = None  # a 95% interval column: the metric it bounds
    csv: bool = True  # a column of summary.csv (else only in the rows)
    markdown: bool = False  # in summary.md
    html: str = NO  # LEAD, ALWAYS, PRESENT, EXTRA or NO
    shown_if: Callable | None = None  # PRESENT / EXTRA: the values that show it (else not None)
    text: bool = False  # words, left-aligned in the HTML tables
    fixed: bool = False  # a number that names the level: the same in every repeat, not averaged
    repeat: bool = False  # its per-repeat values are kept (REPEAT_ORDER)
    compared: bool = False  # side by side in compare (COMPARE_ORDER)
    digits: str | None = None  # its number format where the default (.2f) says too little

    def shown(self, value) -> bool:
        return self.shown_if(value) if self.shown_if is not None else value is not None


def _figure(description: str) -> dict:
    return {"type": ["number", "null"], "description": description, "minimum": 0}


def _count(description: str) -> dict:
    return {"type": "integer", "minimum": 0, "description": description}


def _distribution(description: str) -> dict:
    return {"$ref": DISTRIBUTION, "description": description}


# The level file's summary (module_utils/benchmark/stats.py summarize_level), in its order.
SUMMARY = (
    Field(
        "output_tokens_per_s",
        _figure(
            "Output tokens per second over the level (tokens/s); null when the level took no time."
        ),
    ),
    Field(
        "requests_per_s",
        _figure("Successful requests per second (requests/s); null when the level took no time."),
    ),
    Field("ttft_ms", _distribution("TTFT of the successful requests, milliseconds.")),
    Field(
        "itl_ms",
        _distribution(
            "Inter-token latency, milliseconds, one value per token after the first: an event's "
            "gap over the tokens it carries."
        ),
    ),
    Field("tpot_ms", _distribution("TPOT of the successful requests, milliseconds.")),
    Field("e2e_ms", _distribution("E2E latency of the successful requests, milliseconds.")),
    Field(
        "accept_length_mean",
        _figure(
            "accept_length weighted by each request's output tokens (tokens per verify step); "
            "1.0 without speculation, null with no successful request."
        ),
    ),
    Field(
        "spec_accept_length_mean",
        _figure("SGLang's spec_accept_length weighted the same way; null without speculation."),
    ),
    Field(
        "step_ms",
        _figure(
            "Milliseconds per forward step over all successful requests (decode time over "
            "decode steps); null without steps."
        ),
    ),
    Field(
        "accepted_tokens_per_step",
        _figure(
            "Tokens after the first over verify steps, summed over requests (tokens per step); "
            "1.0 without speculation, null with no successful request. Per-request decode "
            "speed = this / step_ms x 1000."
        ),
    ),
    Field("requests_ok", _count("Requests with ok true.")),
    Field(
        "requests_failed",
        _count("Requests with ok false; requests_ok + requests_failed is the number of records."),
    ),
    Field("output_tokens", _count("Output tokens of the successful requests.")),
    Field(
        "duration_s",
        {
            "type": "number",
            "description": "Seconds from the first request sent to the last one done.",
            "minimum": 0,
        },
    ),
    Field(
        "effective_concurrency",
        _figure(
            "Mean requests in flight (sum of E2E over the duration, Little's law); null when "
            "the level took no time."
        ),
    ),
    Field("accuracy", ACCURACY, required=False),
    Field("prompt_length", PROMPT_LENGTH, required=False),
    Field("gpu", GPU, required=False),
)


def _level(name: str, **extra) -> Metric:
    return Metric(name, IDENTITY, "identity", **extra)


def _latency(field: str, stat: str, label: str, **extra) -> Metric:
    return Metric(
        f"{field}_{stat}",
        MEASURED,
        "latency",
        field=field,
        stat=stat,
        unit="ms",
        better="lower",
        label=label,
        repeat=True,
        **extra,
    )


def _interval(metric: str, **extra) -> tuple[Metric, Metric]:
    """The two columns of a metric's 95% Student-t interval over repeats."""
    return tuple(
        Metric(
            f"{metric}_ci95_{end}",
            DERIVED,
            "repeats",
            computed_by="analysis.repeats.merge_repeats",
            interval_of=metric,
            **extra,
        )
        for end in ("low", "high")
    )


_ROW = "analysis.tables.level_columns"
_SHOWN = {"html": LEAD, "markdown": True}

METRICS = (
    _level("host", text=True, **_SHOWN),
    _level("profile", computed_by="analysis.tables.profile_of", text=True),
    _level("prompt_set", text=True, **_SHOWN),
    _level("config", text=True, **_SHOWN),
    _level("base_config", computed_by="analysis.results.base_config"),
    _level("tp_size", computed_by="analysis.provenance.tp_size", fixed=True),
    _level("ddtree_budget", computed_by="analysis.provenance.ddtree_budget", fixed=True),
    _level(
        "verify_tokens_per_step",
        computed_by="analysis.provenance.verify_tokens_per_step",
        fixed=True,
    ),
    _level("concurrency", fixed=True, **_SHOWN),
    Metric(
        "output_tokens_per_s",
        MEASURED,
        "throughput",
        field="output_tokens_per_s",
        unit="tokens/s",
        better="higher",
        label="output tokens/s",
        repeat=True,
        compared=True,
        **_SHOWN,
    ),
    # Each 95% interval beside its metric (summary.csv, the tables), goodput beside throughput.
    *_interval("output_tokens_per_s", html=PRESENT),
    # With --slo only: the requests/s whose own latencies meet every threshold (and its
    # interval over repeats), and whether the level's percentiles met every SLO.
    Metric(
        "goodput_requests_per_s",
        DERIVED,
        "slo",
        computed_by="analysis.slo.goodput",
        unit="requests/s",
        better="higher",
        label="goodput",
        axis="goodput (requests/s meeting every SLO)",
        repeat=True,
        html=EXTRA,
    ),
    *_interval("goodput_requests_per_s", html=EXTRA),
    Metric("slo_met", FLAG, "slo", computed_by="analysis.slo.slo_met", html=EXTRA),
    Metric(
        "speedup_vs_ar",
        DERIVED,
        "speedup",
        computed_by=_ROW,
        better="higher",
        label="speedup over the reference",
        repeat=True,
        compared=True,
        digits=".3f",
        **_SHOWN,
    ),
    Metric("chain_control", DERIVED, "speedup", computed_by=_ROW, text=True),
    Metric(
        "speedup_vs_chain",
        DERIVED,
        "speedup",
        computed_by=_ROW,
        better="higher",
        label="speedup over the chain control",
        digits=".3f",
        **_SHOWN,
    ),
    _latency("ttft_ms", "p50", "TTFT", compared=True, **_SHOWN),
    _latency("ttft_ms", "p99", "TTFT", compared=True, **_SHOWN),
    *_interval("ttft_ms_p99"),
    _latency("tpot_ms", "p50", "TPOT", compared=True, **_SHOWN),
    *_interval("tpot_ms_p50"),
    _latency("tpot_ms", "p99", "TPOT", compared=True, **_SHOWN),
    _latency("itl_ms", "p50", "ITL"),
    _latency("itl_ms", "p99", "ITL"),
    _latency("e2e_ms", "p50", "E2E"),
    _latency("e2e_ms", "p99", "E2E"),
    Metric(
        "accept_length_mean",
        MEASURED,
        "speculation",
        field="accept_length_mean",
        unit="tokens per verify step",
        better="higher",
        label="accept length",
        axis="accept length (tokens per verify step)",
        repeat=True,
        compared=True,
        **_SHOWN,
    ),
    Metric(
        "step_ms",
        MEASURED,
        "speculation",
        field="step_ms",
        unit="ms",
        better="lower",
        label="step time",
        axis="step time (ms per verify step)",
        repeat=True,
        compared=True,
        **_SHOWN,
    ),
    Metric(
        "accepted_tokens_per_step",
        MEASURED,
        "speculation",
        field="accepted_tokens_per_step",
        unit="tokens per step",
        better="higher",
        label="accepted tokens per step",
        repeat=True,
        compared=True,
        **_SHOWN,
    ),
    Metric(
        "budget_diagnosis",
        DERIVED,
        "speculation",
        computed_by="analysis.sweep.diagnose",
        text=True,
        **_SHOWN,
    ),
    # What one user sees while decoding (1000 / mean TPOT), against what each GPU delivers:
    # the two axes of the throughput-interactivity trade.
    Metric(
        "tokens_per_s_per_user",
        DERIVED,
        "throughput",
        computed_by=_ROW,
        unit="tokens/s",
        better="higher",
        label="tokens/s per user",
        axis="tokens/s per user (1000 / mean TPOT)",
        html=ALWAYS,
    ),
    Metric(
        "tokens_per_s_per_gpu",
        DERIVED,
        "throughput",
        computed_by=_ROW,
        unit="tokens/s",
        better="higher",
        label="output tokens/s per GPU",
        html=ALWAYS,
    ),
    Metric(
        "gpu_power_w_mean",
        DERIVED,
        "energy",
        computed_by="analysis.telemetry.columns",
        unit="W",
        better="lower",
        label="GPU power",
        html=EXTRA,
    ),
    Metric(
        "output_tokens_per_joule",
        DERIVED,
        "energy",
        computed_by="analysis.telemetry.columns",
        unit="tokens/J",
        better="higher",
        label="output tokens per joule",
        repeat=True,
        **_SHOWN,
    ),
    _level("gpus", computed_by="analysis.tables.gpus_of", fixed=True),
    Metric("requests_ok", MEASURED, "load", field="requests_ok", better="higher"),
    Metric(
        "requests_failed", MEASURED, "load", field="requests_failed", better="lower", html=ALWAYS
    ),
    Metric("client_saturated", FLAG, "load", computed_by=_ROW, html=ALWAYS),
    Metric("server_crashed", FLAG, "load", computed_by=_ROW),
    Metric(
        "lossless",
        DERIVED,
        "quality",
        computed_by="analysis.tables.lossless_state",
        text=True,
        markdown=True,
        html=ALWAYS,
    ),
    Metric(
        "mismatch_rate",
        DERIVED,
        "quality",
        computed_by="analysis.tables.lossless_state",
        better="lower",
        digits=".4f",
    ),
    # Scored prompt sets only (empty otherwise): correct / n, n, and how many of the n were
    # cut off or failed (counted as not correct).
    Metric(
        "accuracy",
        DERIVED,
        "quality",
        computed_by="analysis.tables.accuracy_columns",
        better="higher",
        label="accuracy",
        repeat=True,
        compared=True,
        digits=".3f",
        html=ALWAYS,
    ),
    Metric(
        "accuracy_n", DERIVED, "quality", computed_by="analysis.tables.accuracy_columns", fixed=True
    ),
    Metric(
        "accuracy_unanswered",
        DERIVED,
        "quality",
        computed_by="analysis.tables.accuracy_columns",
        better="lower",
    ),
    # Rate levels (r<R>.json) only: the Poisson arrival rate, requests/s.
    _level("request_rate", unit="requests/s", fixed=True, html=PRESENT),
    # The synthetic workload's name (isl<N>-osl<M>), empty for a prompt set.
    _level("workload", html=PRESENT, shown_if=bool),
    # Repeats of the level averaged into the row (every numeric column is their mean), and
    # the 95% Student-t interval of that mean where there are 2 or more.
    Metric(
        "repeats",
        DERIVED,
        "repeats",
        computed_by="analysis.repeats.merge_repeats",
        fixed=True,
        html=PRESENT,
        shown_if=lambda value: (value or 1) > 1,
    ),
    Metric("under_filled", FLAG, "load", computed_by=_ROW, html=PRESENT, shown_if=bool),
    # Not in summary.csv: what the latency plots and the SLOs read, and the request rate
    # goodput is a part of.
    Metric("e2e_ms_mean", MEASURED, "latency", field="e2e_ms", stat="mean", unit="ms", csv=False),
    Metric(
        "requests_per_s", MEASURED, "load", field="requests_per_s", unit="requests/s", csv=False
    ),
)


# -- what the analysis derives ---------------------------------------------------------------


def metric(name: str) -> Metric:
    """The entry of a column; KeyError for a name the registry does not hold."""
    for entry in METRICS:
        if entry.name == name:
            return entry
    raise KeyError(name)


def label(name: str) -> str:
    return metric(name).label or name


def axis_label(name: str) -> str:
    entry = metric(name)
    return entry.axis or entry.label or name


def columns() -> tuple[str, ...]:
    """Every key of a summary row the registry holds, summary.csv's first."""
    return tuple(m.name for m in METRICS)


def csv_columns() -> tuple[str, ...]:
    return tuple(m.name for m in METRICS if m.csv)


def markdown_columns() -> tuple[str, ...]:
    return tuple(m.name for m in METRICS if m.markdown)


def html_columns() -> tuple[str, ...]:
    """The HTML summary table's columns shown always: LEAD ones, then ALWAYS ones."""
    return tuple(m.name for place in (LEAD, ALWAYS) for m in METRICS if m.html == place)


def html_optional() -> tuple[Metric, ...]:
    """The columns the HTML summary table shows where some row has a value (Metric.shown)."""
    return tuple(m for place in (PRESENT, EXTRA) for m in METRICS if m.html == place)


def interval_metrics() -> tuple[str, ...]:
    """The metrics whose mean over repeats has a 95% interval, in summary.csv's order."""
    return tuple(dict.fromkeys(m.interval_of for m in METRICS if m.interval_of))


def _in_groups(chosen: list[Metric], order: tuple[str, ...]) -> tuple[str, ...]:
    rest = tuple(g for g in GROUPS if g not in order)
    rank = {group: index for index, group in enumerate(order + rest)}
    place = {m.name: index for index, m in enumerate(METRICS)}
    return tuple(m.name for m in sorted(chosen, key=lambda m: (rank[m.group], place[m.name])))


def compared() -> tuple[str, ...]:
    return _in_groups([m for m in METRICS if m.compared], COMPARE_ORDER)


def repeat_metrics() -> tuple[str, ...]:
    return _in_groups([m for m in METRICS if m.repeat], REPEAT_ORDER)


def fixed() -> frozenset[str]:
    """Numbers that name a level rather than measure it: never averaged over repeats."""
    return frozenset(m.name for m in METRICS if m.fixed)


def text_columns() -> frozenset[str]:
    return frozenset(m.name for m in METRICS if m.text)


def digits() -> dict[str, str]:
    return {m.name: m.digits for m in METRICS if m.digits}


def distributions() -> tuple[str, ...]:
    """The summary fields that are distributions (ttft_ms, itl_ms, tpot_ms, e2e_ms)."""
    return tuple(f.name for f in SUMMARY if f.distribution)


def measured() -> tuple[Metric, ...]:
    return tuple(m for m in METRICS if m.kind == MEASURED)


def value(summary: dict, entry: Metric):
    """A MEASURED column's value in a level's summary: summary.<field>, or its <stat> for a
    distribution; None where the level lacks it."""
    found = summary.get(entry.field)
    if entry.stat is None:
        return found
    return found.get(entry.stat) if isinstance(found, dict) else None


def schema_properties() -> dict:
    """The level schema's $defs.summary properties, one per Field of SUMMARY."""
    return {f.name: f.schema for f in SUMMARY}
