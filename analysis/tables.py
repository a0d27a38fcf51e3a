"""The summary table (one row per host, prompt set, config and concurrency), the
recommendation per concurrency band, and the warnings a reader must see."""

from __future__ import annotations

import csv
import io
import itertools
import math
import re
from dataclasses import dataclass, field

from ansible.module_utils.contract import metrics
from ansible.module_utils.contract.launch import PP_FLAGS, TP_FLAGS
from ansible.module_utils.contract.names import REFERENCE
from ansible.module_utils.contract.profiles import PROFILE_OF_GPU

from analysis import quality, sweep, telemetry
from analysis.keys import at_tp, is_reference, level_key
from analysis.results import (
    CHAIN_CONTROL,
    Results,
    base_config,
    config_order,
    ddtree_budget,
    incomplete,
    ratio,
    tp_size,
    verify_tokens_per_step,
)

# Every column list comes from the metric registry (module_utils/contract/metrics.py), one
# entry per column.
# Metrics whose mean over repeats gets a 95% interval in summary.csv.
CI_METRICS = metrics.interval_metrics()
COLUMNS = metrics.csv_columns()
# The markdown table is for reading: the columns that tell the story.
MARKDOWN_COLUMNS = metrics.markdown_columns()
DEFAULT_BAND_EDGES = (1, 8, 32, 128)


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


def _stat(summary: dict, name: str, stat: str):
    value = summary.get(name)
    return value.get(stat) if isinstance(value, dict) else None


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
    tpot = _stat(summary, "tpot_ms", "mean")
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


def closed_loop(table: list[dict]) -> list[dict]:
    """The rows of closed-loop levels (c<N>.json): the ones concurrency bands, the budget
    sweep and the concurrency plots are about."""
    return [row for row in table if row.get("request_rate") is None]


# -- repeats ---------------------------------------------------------------------------

# Two-sided 95% quantiles of Student's t by degrees of freedom; between listed ones the next
# smaller (a slightly wider, conservative interval), past the last the normal's.
T_975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    21: 2.080,
    22: 2.074,
    23: 2.069,
    24: 2.064,
    25: 2.060,
    26: 2.056,
    27: 2.052,
    28: 2.048,
    29: 2.045,
    30: 2.042,
    40: 2.021,
    60: 2.000,
    120: 1.980,
}


def t_quantile(df: float) -> float:
    """t(0.975, df) from T_975 (df rounded down: the wider interval)."""
    if not df >= 1:
        return T_975[1]
    if df > 120:
        return 1.960
    return T_975[max(k for k in T_975 if k <= df)]


def mean_interval(values: list[float]) -> tuple[float, float] | None:
    """The 95% Student-t interval of the mean of values; None with fewer than 2."""
    values = [v for v in values if v is not None]
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    half = t_quantile(n - 1) * math.sqrt(variance / n)
    return mean - half, mean + half


def welch_interval(a: list[float], b: list[float]) -> tuple[float, float] | None:
    """The 95% Welch interval of mean(b) - mean(a); None unless both have 2 or more values."""
    a = [v for v in a if v is not None]
    b = [v for v in b if v is not None]
    if len(a) < 2 or len(b) < 2:
        return None
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    var_a = sum((v - mean_a) ** 2 for v in a) / (len(a) - 1) / len(a)
    var_b = sum((v - mean_b) ** 2 for v in b) / (len(b) - 1) / len(b)
    spread = var_a + var_b
    diff = mean_b - mean_a
    if spread == 0:
        return diff, diff
    df = spread**2 / (var_a**2 / (len(a) - 1) + var_b**2 / (len(b) - 1))
    half = t_quantile(df) * math.sqrt(spread)
    return diff - half, diff + half


# Metrics whose per-repeat values a row keeps (repeat_values), for compare's intervals.
REPEAT_METRICS = metrics.repeat_metrics()
# Columns that name a level rather than measure it: the same in every repeat, never averaged.
_IDENTITY = metrics.fixed()


def merge_repeats(table: list[dict]) -> list[dict]:
    """One row per level from its repeats (same host, prompt set, config, concurrency and
    request rate): the mean of every numeric column, a flag (saturated, crashed, under-filled)
    set when any repeat had it, the 95% intervals of CI_METRICS, `repeats` the count, and
    `repeat_values` each metric's values for compare's intervals."""
    groups: dict[tuple, list[dict]] = {}
    for row in table:
        key = (row["host"], row["prompt_set"], row["config"], row["concurrency"])
        groups.setdefault((*key, row["request_rate"]), []).append(row)
    out = []
    for group in groups.values():
        first = dict(group[0])
        first["repeats"] = len(group)
        first["repeat_values"] = (
            {name: [r[name] for r in group] for name in REPEAT_METRICS} if len(group) > 1 else {}
        )
        if len(group) > 1:
            for name, value in group[0].items():
                values = [r[name] for r in group]
                if name in _IDENTITY or name in ("files", "file"):
                    continue
                if isinstance(value, bool):
                    first[name] = any(values)
                elif any(_numeric(v) for v in values):
                    numbers = [v for v in values if _numeric(v)]
                    first[name] = sum(numbers) / len(numbers)
                elif name == "slo_values":
                    first[name] = {k: _mean_of([r[name].get(k) for r in group]) for k in value}
            first["files"] = [r["file"] for r in group]
            for metric in CI_METRICS:
                interval = mean_interval([r[metric] for r in group])
                if interval is not None:
                    first[f"{metric}_ci95_low"], first[f"{metric}_ci95_high"] = interval
        out.append(first)
    return out


def _numeric(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _mean_of(values) -> float | None:
    numbers = [v for v in values if _numeric(v)]
    return sum(numbers) / len(numbers) if numbers else None


# -- SLOs ------------------------------------------------------------------------------

# The level's distributions (ttft_ms, ...) and the percentiles each records.
SLO_METRICS = tuple(name.removesuffix("_ms") for name in metrics.distributions())
SLO_STATS = metrics.PERCENTILES
SLO_FORMS = (
    "KEY=VALUE pairs separated by commas, KEY <metric>_ms_<stat> with metric one of "
    f"{', '.join(SLO_METRICS)} and stat one of {', '.join(SLO_STATS)}, VALUE a positive "
    "number of milliseconds (e.g. ttft_ms_p99=2000,tpot_ms_p99=33)"
)
_SLO_KEY = re.compile(r"^([a-z0-9]+)_ms_([a-z0-9]+)$")
_SLO_VALUE = re.compile(r"^\d+(?:\.\d+)?$")
MAX_SLO_MS = 1e9


class SloError(ValueError):
    """A --slo that cannot be read; the message names what was wrong and the allowed forms."""


def parse_slo(text: str) -> dict[str, float]:
    """{key: threshold in ms} from 'ttft_ms_p99=2000,tpot_ms_p99=33'; SloError otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise SloError(f"--slo is empty; expected {SLO_FORMS}")
    found: dict[str, float] = {}
    for part in text.split(","):
        item = part.strip()
        if not item:
            raise SloError(f"--slo {text!r} has an empty entry; expected {SLO_FORMS}")
        if "=" not in item:
            raise SloError(f"--slo entry {item[:60]!r} has no '=VALUE'; expected {SLO_FORMS}")
        key, _, raw = (p.strip() for p in item.partition("="))
        match = _SLO_KEY.match(key)
        if not match:
            raise SloError(
                f"--slo key {key[:60]!r} is not <metric>_ms_<stat>; expected {SLO_FORMS}"
            )
        metric, stat = match.groups()
        if metric not in SLO_METRICS:
            raise SloError(
                f"--slo key {key!r}: unknown metric {metric!r} (allowed: "
                f"{', '.join(SLO_METRICS)}); expected {SLO_FORMS}"
            )
        if stat not in SLO_STATS:
            raise SloError(
                f"--slo key {key!r}: statistic {stat!r} is not recorded (allowed: "
                f"{', '.join(SLO_STATS)}); expected {SLO_FORMS}"
            )
        if key in found:
            raise SloError(f"--slo key {key!r} is given twice; give each key once")
        if not _SLO_VALUE.match(raw) or not 0 < float(raw) <= MAX_SLO_MS:
            raise SloError(
                f"--slo {key}={raw[:40]!r}: the threshold must be a positive number of "
                f"milliseconds (at most {MAX_SLO_MS:g}); expected {SLO_FORMS}"
            )
        found[key] = float(raw)
    return found


def slo_value(summary: dict, key: str) -> float | None:
    """The level's percentile an SLO key names: tpot_ms_p99 -> summary.tpot_ms.p99."""
    metric, _, stat = key.partition("_ms_")
    value = _stat(summary, f"{metric}_ms", stat)
    return value if _numeric(value) else None


def slo_met(values: dict, slo: dict) -> bool:
    """Every SLO's level percentile at or under its threshold (a missing one is not met)."""
    return all(values.get(k) is not None and values[k] <= limit for k, limit in slo.items())


def slo_misses(row: dict, slo: dict) -> list[dict]:
    """{key, value, threshold} per SLO the row's level missed."""
    values = row.get("slo_values") or {}
    return [
        {"key": k, "value": values.get(k), "threshold": limit}
        for k, limit in slo.items()
        if values.get(k) is None or values[k] > limit
    ]


def goodput(level, slo: dict) -> float | None:
    """Requests/s whose own TTFT, mean TPOT (= mean ITL, for tpot and itl thresholds) and E2E
    meet every threshold of its kind, over the level's duration. A request without a TPOT (one
    token) meets the TPOT thresholds; one without a TTFT or E2E meets none."""
    duration = level.summary.get("duration_s")
    if not _numeric(duration) or duration <= 0:
        return None
    limits = {}
    for key, value in slo.items():
        metric = key.split("_ms_")[0]
        metric = "tpot" if metric == "itl" else metric
        limits[metric] = min(value, limits.get(metric, math.inf))
    ttft_limit = limits.get("ttft", math.inf)
    tpot_limit = limits.get("tpot", math.inf)
    e2e_limit = limits.get("e2e", math.inf)
    good = 0
    for ttft, tpot, e2e in zip(level.ttft, level.tpot, level.e2e, strict=True):
        # NaN compares false: no TTFT or E2E fails, no TPOT passes.
        if (
            (ttft <= ttft_limit or ttft_limit == math.inf)
            and (e2e <= e2e_limit or e2e_limit == math.inf)
            and not tpot > tpot_limit
        ):
            good += 1
    return good / duration


def slo_text(slo: dict) -> str:
    return ", ".join(f"{k} <= {v:g} ms" for k, v in slo.items())


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


# -- recommendation --------------------------------------------------------------------


def bands(edges: tuple[int, ...]) -> list[tuple[str, int, int]]:
    """(label, low, high) per band from ascending upper edges: 1, 2-8, 9-32, 33-128, 129+."""
    out, low = [], 1
    for edge in edges:
        out.append((str(edge) if edge == low else f"{low}-{edge}", low, edge))
        low = edge + 1
    out.append((f"{low}+", low, math.inf))
    return out


@dataclass
class Pick:
    host: str
    band: str
    config: str | None
    ddtree_budget: int | None
    output_tokens_per_s: float | None
    speedup_vs_ar: float | None
    levels: str
    note: str
    # With SLOs: per config rejected for missing one, [{key, value, threshold, concurrency}].
    slo_rejected: dict = field(default_factory=dict)


def _where_list(places: list[tuple[str, int]], limit: int = 4) -> str:
    shown = ", ".join(f"{prompt_set} c{concurrency}" for prompt_set, concurrency in places[:limit])
    return shown + (f" and {len(places) - limit} more" if len(places) > limit else "")


def _prefer_smaller_budget(best: dict, eligible: list[dict], saturated: list) -> tuple:
    """(the pick, a note) under saturation: the smallest eligible DDTree budget at the best's
    TP size within NEAR_BEST of the best mean throughput."""
    near = [
        s
        for s in eligible
        if s["budget"] is not None
        and s["tp"] == best["tp"]
        and s["mean"] >= (1 - sweep.NEAR_BEST) * best["mean"]
    ]
    smallest = min(near, key=lambda s: s["budget"], default=best)
    if smallest["budget"] >= best["budget"]:
        return best, None
    steps: dict[tuple, list] = {}
    for pair in saturated:
        steps.setdefault((pair.low, pair.high), []).append(pair)
    described = []
    for (low, high), pairs in sorted(steps.items()):
        worst = max(pairs, key=lambda p: p.step_change - p.accept_change)
        places = _where_list(sorted((p.prompt_set, p.concurrency) for p in pairs))
        described.append(
            f"b{low} -> b{high} at {places}: accepted tokens per step "
            f"{worst.accept_change:+.1%} for {worst.step_change:+.1%} step time at "
            f"{worst.prompt_set} c{worst.concurrency}"
        )
    gain = best["mean"] / smallest["mean"] - 1
    note = (
        f"{smallest['config']} rather than {best['config']} ({best['mean']:.1f} tok/s, only "
        f"{gain:.1%} faster): the budget sweep saturates ({'; '.join(described)}), so the "
        f"smallest budget within {sweep.NEAR_BEST:.0%} of the best throughput is preferred: "
        "as fast, for less verify work per step"
    )
    return smallest, note


def recommend(
    table: list[dict],
    edges: tuple[int, ...] = DEFAULT_BAND_EDGES,
    diagnosis: sweep.Diagnosis | None = None,
    less_accurate: frozenset | set = frozenset(),
    slo: dict | None = None,
) -> list[Pick]:
    """Per host and concurrency band: the config with the highest mean output tokens/s over the
    band's levels and prompt sets, among those whose losslessness check passed (and the
    reference). A config is a candidate only with every level of the band measured cleanly
    (no crash, no failed request), only if it answered no scored level significantly worse
    than the reference (`less_accurate`: (host, config) pairs, analysis.quality's verdict
    "worse"), and a DDTree budget only if it collapsed at no level of the host
    (analysis.sweep). When the host's sweep saturates within the band and the best
    is a DDTree budget, the smallest budget within NEAR_BEST of the best is taken instead.
    With `slo` ({key: ms}) a config is a candidate only if every level of the band met every
    SLO, and the note names, per config that missed one, the key, its value and the threshold.
    Only closed-loop levels are recommended from (a rate level's concurrency is a cap)."""
    table = closed_loop(table)
    diagnosis = diagnosis if diagnosis is not None else sweep.diagnose(table)
    picks = []
    for host in sorted({r["host"] for r in table}):
        mine = [r for r in table if r["host"] == host]
        collapsed = diagnosis.collapsed_budgets(host)
        for label, low, high in bands(edges):
            inside = [r for r in mine if low <= r["concurrency"] <= high]
            if not inside:
                continue
            cells = {(r["prompt_set"], r["concurrency"]) for r in inside}
            scored = []
            for config in sorted({r["config"] for r in inside}, key=config_order):
                own = [r for r in inside if r["config"] == config]
                clean = [
                    r
                    for r in own
                    if r["output_tokens_per_s"] is not None
                    and not r["server_crashed"]
                    and not r["requests_failed"]
                ]
                mean = sum(r["output_tokens_per_s"] for r in clean) / len(clean) if clean else None
                speedups = [r["speedup_vs_ar"] for r in clean if r["speedup_vs_ar"] is not None]
                budget, tp = own[0]["ddtree_budget"], own[0]["tp_size"]
                missed = [
                    {**miss, "concurrency": r["concurrency"], "prompt_set": r["prompt_set"]}
                    for r in own
                    for miss in (slo_misses(r, slo) if slo else [])
                ]
                scored.append(
                    {
                        "config": config,
                        "state": own[0]["lossless"],
                        "complete": len(clean) == len(cells),
                        "collapsed": collapsed.get((tp, budget)) if budget is not None else None,
                        "less_accurate": (host, config) in less_accurate,
                        "slo_missed": missed,
                        "mean": mean,
                        "speedup": sum(speedups) / len(speedups) if speedups else None,
                        "budget": budget,
                        "tp": tp,
                        "saturated": sorted(
                            {r["concurrency"] for r in own if r["client_saturated"]}
                        ),
                    }
                )
            eligible = [
                s
                for s in scored
                if s["complete"]
                and s["state"] in ("passed", "reference")
                and s["mean"]
                and not s["collapsed"]
                and not s["less_accurate"]
                and not s["slo_missed"]
            ]
            best = max(eligible, key=lambda s: s["mean"], default=None)
            faster = [
                s
                for s in scored
                if s["mean"] and (best is None or s["mean"] > best["mean"]) and s is not best
            ]
            notes = []
            for s in sorted(faster, key=lambda s: -s["mean"])[:3]:
                if s["slo_missed"]:
                    continue  # named below, with every config that missed an SLO
                if not s["complete"]:
                    why = "missing or failed levels in this band"
                elif s["state"] not in ("passed", "reference"):
                    why = f"losslessness {s['state']}"
                elif s["less_accurate"]:
                    why = "it answered worse than the reference (see accuracy_below_ar)"
                else:
                    why = (
                        "its accepted tokens per step collapsed against a smaller budget at "
                        f"{_where_list(s['collapsed'])} (see the ddtree_budget_collapse warnings)"
                    )
                notes.append(f"{s['config']} was faster ({s['mean']:.1f} tok/s) but {why}")
            saturation = (
                diagnosis.saturations(host, low, high, best["tp"]) if best is not None else []
            )
            if best is not None and best["budget"] is not None and saturation:
                best, why = _prefer_smaller_budget(best, eligible, saturation)
                if why:
                    notes.insert(0, why)
            rejected = {s["config"]: s["slo_missed"] for s in scored if s["slo_missed"]}
            for config, misses in list(rejected.items())[:8]:
                notes.append(f"{config} missed the SLOs: {_misses_text(misses)}")
            if (
                best is None
                and slo
                and any(not s["slo_missed"] and s["complete"] and s["mean"] for s in scored)
            ):
                notes.insert(
                    0,
                    "no config that meets the SLOs ("
                    + slo_text(slo)
                    + ") passed the losslessness check with every level clean",
                )
            elif best is None and slo and rejected:
                notes.insert(0, f"no config met the SLOs ({slo_text(slo)}) at every level")
            elif best is None:
                notes.insert(0, "no config passed the losslessness check with every level clean")
            elif best["saturated"]:
                levels = ", ".join(map(str, best["saturated"]))
                notes.insert(
                    0, f"client saturated at concurrency {levels}: its throughput is a lower bound"
                )
            concurrencies = sorted({c for _, c in cells})
            picks.append(
                Pick(
                    host=host,
                    band=label,
                    config=best["config"] if best else None,
                    ddtree_budget=best["budget"] if best else None,
                    output_tokens_per_s=best["mean"] if best else None,
                    speedup_vs_ar=best["speedup"] if best else None,
                    levels=", ".join(map(str, concurrencies)),
                    note="; ".join(notes),
                    slo_rejected=rejected,
                )
            )
    return picks


def _misses_text(misses: list[dict], limit: int = 4) -> str:
    """'tpot_ms_p99 20.1 > 10 ms at gsm8k c4, ...': the worst miss of each key first."""
    ordered = sorted(
        misses,
        key=lambda m: -(m["value"] / m["threshold"]) if m["value"] is not None else -math.inf,
    )
    text = ", ".join(
        f"{m['key']} {'not measured' if m['value'] is None else format(m['value'], '.1f')} > "
        f"{m['threshold']:g} ms at {m['prompt_set']} c{m['concurrency']}"
        for m in ordered[:limit]
    )
    return text + (f" and {len(misses) - limit} more" if len(misses) > limit else "")


# -- warnings --------------------------------------------------------------------------


# Every warning's kind, a stable name to filter on (report.json warnings[].kind).
WARNING_KINDS = (
    "config_failed",
    "broken_verification",
    "server_crashed",
    "ddtree_budget_collapse",
    "lossless_not_checked",
    "client_saturated",
    "requests_failed",
    "reference_missing",
    "mixed_kit_versions",
    "chain_control_missing",
    "low_effective_concurrency",
    "incomplete_run",
    "accuracy_below_ar",
    "accuracy_below_floor",
    "api_check_failed",
    "gpu_throttled",
    "under_filled",
    # analysis/predicted.py: the speed model against the measurement.
    "slower_than_predicted",
    "acceptance_below_published",
)
COLLAPSE_MEANING = (
    "A wider tree should never accept fewer tokens per step. This usually means state shared "
    "between sibling branches of the tree (recurrent or hybrid layers, such as Mamba or GDN, "
    "whose state one branch's tokens overwrite for its siblings: the published Qwen3.6-27B "
    "study fell from about 15 to 4 tokens per step between budgets 15 and 64) or a broken tree "
    "attention mask. Check: losslessness against AR (lossless.json and the Losslessness "
    "section; a broken mask usually shows as mismatches), the model's layer types (Kimi K2.6 is "
    "pure attention, MLA, and should not collapse), the tree attention backend (a full tree "
    "verifies only on triton) and the page size (1), in the launch under Provenance."
)


def collapse_warnings(table: list[dict], diagnosis: sweep.Diagnosis) -> list[dict]:
    """One warning per host, prompt set and concurrency level where the sweep collapses,
    listing every collapsing pair of that level."""
    state = {(r["host"], r.get("tp_size"), r["ddtree_budget"]): r["lossless"] for r in table}
    # TP sizes are named where a host's sweep ran at more than one, and only there: a run at
    # one TP size keeps the names it always had.
    sizes: dict[str, set] = {}
    for row in table:
        if row["ddtree_budget"] is not None:
            sizes.setdefault(row["host"], set()).add(row.get("tp_size"))
    found = []
    collapses = diagnosis.collapses()
    for level in sorted(collapses, key=lambda k: (k[0], k[1] or 0, *k[2:])):
        pairs = collapses[level]
        host, tp, prompt_set, concurrency = level
        marked = sorted(
            key[-1]
            for key, mark in diagnosis.marks.items()
            if key[:-1] == level and mark == sweep.COLLAPSED
        )
        checks = ", ".join(f"b{b} {state.get((host, tp, b), 'not checked')}" for b in marked)
        named = len(sizes.get(host, ())) > 1
        at = f"tp{tp if tp is not None else '?'}"
        found.append(
            {
                "kind": "ddtree_budget_collapse",
                "severity": "warning",
                "where": f"{host} / {at} / {prompt_set} / c{concurrency}"
                if named
                else f"{host} / {prompt_set} / c{concurrency}",
                "message": (
                    f"DDTree's accepted tokens per step collapse as the budget grows on {host}"
                    + (f" at TP {tp if tp is not None else 'unknown'}" if named else "")
                    + f", prompt set {prompt_set}, concurrency {concurrency}: "
                    + "; ".join(p.describe() for p in pairs)
                    + f" (a fall of more than {sweep.COLLAPSE_DROP:.0%} while step time rises "
                    f"less than {sweep.STEP_RISE:.0%}). Budgets marked collapsed, never "
                    f"recommended: {', '.join(f'b{b}' for b in marked)} (losslessness: "
                    f"{checks}). {COLLAPSE_MEANING}"
                ),
                "host": host,
                "tp_size": tp,
                "prompt_set": prompt_set,
                "concurrency": concurrency,
                "pairs": [p.figures() for p in pairs],
                "collapsed_budgets": marked,
            }
        )
    return found


def warnings(
    results: Results,
    table: list[dict],
    reference: str = REFERENCE,
    diagnosis: sweep.Diagnosis | None = None,
    scored: list[dict] | None = None,
    api_checks: list[dict] | None = None,
) -> list[dict]:
    """What the reader must know before trusting a number: {kind, severity, where, message},
    kind one of WARNING_KINDS. `scored` and `api_checks` are analysis.quality's rows when the
    caller already built them (the report shows them too)."""
    found: list[dict] = []

    def add(kind: str, severity: str, where: str, message: str) -> None:
        found.append({"kind": kind, "severity": severity, "where": where, "message": message})

    for (host, config), status in sorted(results.status.items()):
        if status.get("status") == "failed":
            error = str(status.get("error") or "no error recorded").strip()
            add("config_failed", "error", f"{host} / {config}", f"the config failed: {error[:400]}")
    flagged = {}
    for host, report in sorted(results.lossless.items()):
        for config, entry in sorted(report.get("configs", {}).items()):
            if entry.get("broken_verification"):
                rate = entry.get("mismatch_rate") or 0.0
                flagged[(host, config)] = rate
                add(
                    "broken_verification",
                    "error",
                    f"{host} / {config}",
                    f"broken verification: {rate:.1%} of greedy output tokens differ from "
                    f"{report.get('reference', reference)} (threshold "
                    f"{report.get('threshold', 0):.0%}); its speedup is not a valid result and "
                    "it is never recommended",
                )
    unchecked = sorted({(r["host"], r["config"]) for r in table if r["lossless"] == "not checked"})
    for host, config in unchecked:
        why = (
            "no lossless.json for this host"
            if host not in results.lossless
            else "no level compared (temperature above 0, or no reference level)"
        )
        add(
            "lossless_not_checked",
            "warning",
            f"{host} / {config}",
            f"losslessness not checked ({why})",
        )
    for level in results.levels:
        where = f"{level.host} / {level.config} / {level.prompt_set} / {level.name}" + (
            f" rep{level.repeat}" if level.repeat > 1 else ""
        )
        if level.client.get("saturated"):
            reasons = "; ".join(map(str, level.client.get("saturated_reasons") or []))
            add(
                "client_saturated",
                "warning",
                where,
                "client saturated: the benchmark client, not the server, may have been the "
                f"limit ({reasons or 'marked saturated'}); throughput and latency understate "
                "the server",
            )
        if level.crashed:
            add(
                "server_crashed",
                "error",
                where,
                "the server crashed or restarted during this level",
            )
        failed = level.summary.get("requests_failed") or 0
        if failed:
            add(
                "requests_failed",
                "warning",
                where,
                f"{failed} of {failed + (level.summary.get('requests_ok') or 0)} requests failed",
            )
        effective = level.summary.get("effective_concurrency")
        expected = min(level.concurrency, level.settings.get("num_prompts") or level.concurrency)
        if (
            level.closed_loop
            and isinstance(effective, (int, float))
            and expected > 1
            and effective < 0.75 * expected
        ):
            add(
                "low_effective_concurrency",
                "info",
                where,
                f"only {effective:.1f} requests in flight on average (level {level.concurrency}):"
                " too few prompts per level to keep it busy, or a ramp dominated the run",
            )
        fill = level.fill
        if fill.get("under_filled") and level.repeat == 1:
            add(
                "under_filled",
                "info",
                where,
                f"under-filled: {fill.get('unique_prompts', '?')} unique prompts for the "
                f"{fill.get('wanted', '?')} a full level wants (10 x concurrency, never "
                "repeated into the radix cache); its throughput understates a full level",
            )
    found += telemetry.throttle_warnings(results.levels)
    found += collapse_warnings(
        table, diagnosis if diagnosis is not None else sweep.diagnose(closed_loop(table))
    )
    missing_ref = sorted(
        {(r["host"], r["prompt_set"]) for r in table if r["speedup_vs_ar"] is None}
        - {(r["host"], r["prompt_set"]) for r in table if is_reference(r["config"], reference)}
    )
    for host, prompt_set in missing_ref:
        add(
            "reference_missing",
            "warning",
            f"{host} / {prompt_set}",
            f"no {reference} results: speedups cannot be computed",
        )
    no_chain: dict[str, list[tuple[str, int]]] = {}
    for row in closed_loop(table):
        if row["ddtree_budget"] is not None and row["chain_control"] is None:
            place = (row["prompt_set"], row["concurrency"])
            if place not in no_chain.setdefault(row["host"], []):
                no_chain[row["host"]].append(place)
    for host, places in sorted(no_chain.items()):
        add(
            "chain_control_missing",
            "info",
            host,
            f"no {CHAIN_CONTROL} level beside DDTree's at {_where_list(sorted(places))}: "
            "speedup_vs_chain is empty there, and DDTree against dflash there mixes the tree "
            "with the attention backend, page size and scheduler",
        )
    for where, message in incomplete(results):
        add("incomplete_run", "warning", where, message)
    if scored is None:
        scored = quality.accuracy_rows(results, table, reference)
    if api_checks is None:
        api_checks = quality.api_check_rows(results)
    found += quality.accuracy_warnings(results, scored, reference)
    found += quality.api_check_warnings(api_checks)
    versions = {
        (lv.provenance.get("kit_version"), lv.provenance.get("sglang_version"))
        for lv in results.levels
    }
    if len({v[0] for v in versions}) > 1:
        kits = ", ".join(sorted(str(v[0]) for v in versions))
        add("mixed_kit_versions", "warning", "run", f"results from several kit versions: {kits}")
    order = {"error": 0, "warning": 1, "info": 2}
    found.sort(key=lambda w: order[w["severity"]])
    return found


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
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in table:
        lines.append("| " + " | ".join(cell(fmt(row.get(c), c)) for c in columns) + " |")
    return "\n".join(lines) + "\n"


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
            "note": p.note,
            # report.json only: per config that missed an SLO, each {key, value, threshold,
            # concurrency, prompt_set}.
            "slo_rejected": p.slo_rejected,
        }
        for p in picks
    ]


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
