"""The warnings a reader must see before trusting a number, one check per kind, run in a fixed
order (report.json warnings[], sorted by severity)."""

from __future__ import annotations

from dataclasses import dataclass

from ansible.module_utils.contract.names import REFERENCE

from analysis import quality, sweep, telemetry
from analysis.keys import closed_loop, is_reference
from analysis.recommend import where_list
from analysis.results import CHAIN_CONTROL, Results, incomplete

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
    inputs = _Inputs(results, table, reference, diagnosis, scored, api_checks)
    found = [warning for check in CHECKS for warning in check(inputs)]
    order = {"error": 0, "warning": 1, "info": 2}
    found.sort(key=lambda w: order[w["severity"]])
    return found


@dataclass
class _Inputs:
    """What the checks read: the results, the summary table, and what the caller built."""

    results: Results
    table: list[dict]
    reference: str
    diagnosis: sweep.Diagnosis | None
    scored: list[dict] | None
    api_checks: list[dict] | None


def _warning(kind: str, severity: str, where: str, message: str) -> dict:
    return {"kind": kind, "severity": severity, "where": where, "message": message}


def _config_failed(inputs: _Inputs) -> list[dict]:
    found = []
    for (host, config), status in sorted(inputs.results.status.items()):
        if status.get("status") == "failed":
            error = str(status.get("error") or "no error recorded").strip()
            found.append(
                _warning(
                    "config_failed",
                    "error",
                    f"{host} / {config}",
                    f"the config failed: {error[:400]}",
                )
            )
    return found


def _broken_verification(inputs: _Inputs) -> list[dict]:
    found = []
    for host, report in sorted(inputs.results.lossless.items()):
        for config, entry in sorted(report.get("configs", {}).items()):
            if entry.get("broken_verification"):
                rate = entry.get("mismatch_rate") or 0.0
                found.append(
                    _warning(
                        "broken_verification",
                        "error",
                        f"{host} / {config}",
                        f"broken verification: {rate:.1%} of greedy output tokens differ from "
                        f"{report.get('reference', inputs.reference)} (threshold "
                        f"{report.get('threshold', 0):.0%}); its speedup is not a valid result "
                        "and it is never recommended",
                    )
                )
    return found


def _lossless_not_checked(inputs: _Inputs) -> list[dict]:
    table, lossless = inputs.table, inputs.results.lossless
    unchecked = sorted({(r["host"], r["config"]) for r in table if r["lossless"] == "not checked"})
    found = []
    for host, config in unchecked:
        why = (
            "no lossless.json for this host"
            if host not in lossless
            else "no level compared (temperature above 0, or no reference level)"
        )
        found.append(
            _warning(
                "lossless_not_checked",
                "warning",
                f"{host} / {config}",
                f"losslessness not checked ({why})",
            )
        )
    return found


def _level_warnings(inputs: _Inputs) -> list[dict]:
    """Every level's own warnings, level by level (LEVEL_CHECKS in order for each)."""
    found = []
    for level in inputs.results.levels:
        where = f"{level.host} / {level.config} / {level.prompt_set} / {level.name}" + (
            f" rep{level.repeat}" if level.repeat > 1 else ""
        )
        for check in LEVEL_CHECKS:
            warning = check(level, where)
            if warning is not None:
                found.append(warning)
    return found


def _client_saturated(level, where: str) -> dict | None:
    if not level.client.get("saturated"):
        return None
    reasons = "; ".join(map(str, level.client.get("saturated_reasons") or []))
    return _warning(
        "client_saturated",
        "warning",
        where,
        "client saturated: the benchmark client, not the server, may have been the "
        f"limit ({reasons or 'marked saturated'}); throughput and latency understate "
        "the server",
    )


def _server_crashed(level, where: str) -> dict | None:
    if not level.crashed:
        return None
    return _warning(
        "server_crashed", "error", where, "the server crashed or restarted during this level"
    )


def _requests_failed(level, where: str) -> dict | None:
    failed = level.summary.get("requests_failed") or 0
    if not failed:
        return None
    return _warning(
        "requests_failed",
        "warning",
        where,
        f"{failed} of {failed + (level.summary.get('requests_ok') or 0)} requests failed",
    )


def _low_effective_concurrency(level, where: str) -> dict | None:
    effective = level.summary.get("effective_concurrency")
    expected = min(level.concurrency, level.settings.get("num_prompts") or level.concurrency)
    if not (
        level.closed_loop
        and isinstance(effective, (int, float))
        and expected > 1
        and effective < 0.75 * expected
    ):
        return None
    return _warning(
        "low_effective_concurrency",
        "info",
        where,
        f"only {effective:.1f} requests in flight on average (level {level.concurrency}):"
        " too few prompts per level to keep it busy, or a ramp dominated the run",
    )


def _under_filled(level, where: str) -> dict | None:
    fill = level.fill
    if not (fill.get("under_filled") and level.repeat == 1):
        return None
    return _warning(
        "under_filled",
        "info",
        where,
        f"under-filled: {fill.get('unique_prompts', '?')} unique prompts for the "
        f"{fill.get('wanted', '?')} a full level wants (10 x concurrency, never "
        "repeated into the radix cache); its throughput understates a full level",
    )


def _gpu_throttled(inputs: _Inputs) -> list[dict]:
    return telemetry.throttle_warnings(inputs.results.levels)


def _budget_collapse(inputs: _Inputs) -> list[dict]:
    diagnosis = inputs.diagnosis
    if diagnosis is None:
        diagnosis = sweep.diagnose(closed_loop(inputs.table))
    return collapse_warnings(inputs.table, diagnosis)


def _reference_missing(inputs: _Inputs) -> list[dict]:
    table, reference = inputs.table, inputs.reference
    missing = sorted(
        {(r["host"], r["prompt_set"]) for r in table if r["speedup_vs_ar"] is None}
        - {(r["host"], r["prompt_set"]) for r in table if is_reference(r["config"], reference)}
    )
    return [
        _warning(
            "reference_missing",
            "warning",
            f"{host} / {prompt_set}",
            f"no {reference} results: speedups cannot be computed",
        )
        for host, prompt_set in missing
    ]


def _chain_control_missing(inputs: _Inputs) -> list[dict]:
    no_chain: dict[str, list[tuple[str, int]]] = {}
    for row in closed_loop(inputs.table):
        if row["ddtree_budget"] is not None and row["chain_control"] is None:
            place = (row["prompt_set"], row["concurrency"])
            if place not in no_chain.setdefault(row["host"], []):
                no_chain[row["host"]].append(place)
    return [
        _warning(
            "chain_control_missing",
            "info",
            host,
            f"no {CHAIN_CONTROL} level beside DDTree's at {where_list(sorted(places))}: "
            "speedup_vs_chain is empty there, and DDTree against dflash there mixes the tree "
            "with the attention backend, page size and scheduler",
        )
        for host, places in sorted(no_chain.items())
    ]


def _incomplete_run(inputs: _Inputs) -> list[dict]:
    return [
        _warning("incomplete_run", "warning", where, message)
        for where, message in incomplete(inputs.results)
    ]


def _accuracy(inputs: _Inputs) -> list[dict]:
    scored = inputs.scored
    if scored is None:
        scored = quality.accuracy_rows(inputs.results, inputs.table, inputs.reference)
    return quality.accuracy_warnings(inputs.results, scored, inputs.reference)


def _api_checks(inputs: _Inputs) -> list[dict]:
    api_checks = inputs.api_checks
    if api_checks is None:
        api_checks = quality.api_check_rows(inputs.results)
    return quality.api_check_warnings(api_checks)


def _mixed_kit_versions(inputs: _Inputs) -> list[dict]:
    versions = {
        (lv.provenance.get("kit_version"), lv.provenance.get("sglang_version"))
        for lv in inputs.results.levels
    }
    if len({v[0] for v in versions}) <= 1:
        return []
    kits = ", ".join(sorted(str(v[0]) for v in versions))
    message = f"results from several kit versions: {kits}"
    return [_warning("mixed_kit_versions", "warning", "run", message)]


# The checks of every level, in the order a level's warnings are listed.
LEVEL_CHECKS = (
    _client_saturated,
    _server_crashed,
    _requests_failed,
    _low_effective_concurrency,
    _under_filled,
)
# The checks in the order their warnings are listed (then sorted by severity, stably).
CHECKS = (
    _config_failed,
    _broken_verification,
    _lossless_not_checked,
    _level_warnings,
    _gpu_throttled,
    _budget_collapse,
    _reference_missing,
    _chain_control_missing,
    _incomplete_run,
    _accuracy,
    _api_checks,
    _mixed_kit_versions,
)
