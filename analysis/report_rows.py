"""Rows report.json and the pages show, shared by report() and compare(): each host's
provenance, the losslessness verdicts, and the DDTree budget sweep's pairs.
"""

from __future__ import annotations

from analysis import sweep, tables
from analysis.results import Results, config_order


def provenance(results: Results) -> dict:
    """Per host: hardware, versions, and per config its launch, once."""
    out: dict[str, dict] = {}
    for level in results.levels:
        info = out.setdefault(
            level.host,
            {
                "profile": tables.profile_of(level.provenance),
                "gpu": level.provenance.get("gpu"),
                "sglang_versions": set(),
                "kit_versions": set(),
                "configs": {},
                "weights": [],
                "prompts": {},
                "first_started": None,
                "last_ended": None,
            },
        )
        p = level.provenance
        info["sglang_versions"].add(p.get("sglang_version"))
        info["kit_versions"].add(p.get("kit_version"))
        launch = p.get("launch") or {}
        if level.config not in info["configs"]:
            info["configs"][level.config] = {**launch, "runtime_detail": p.get("runtime")}
        for weight in p.get("weights") or []:
            if weight not in info["weights"]:
                info["weights"].append(weight)
        prompts = p.get("prompts") or {}
        if prompts.get("sha256"):
            info["prompts"][level.prompt_set] = prompts["sha256"]
        started, ended = p.get("started_at"), p.get("ended_at")
        if isinstance(started, str) and (
            info["first_started"] is None or started < info["first_started"]
        ):
            info["first_started"] = started
        if isinstance(ended, str) and (info["last_ended"] is None or ended > info["last_ended"]):
            info["last_ended"] = ended
    for info in out.values():
        info["sglang_versions"] = sorted(map(str, info["sglang_versions"]))
        info["kit_versions"] = sorted(map(str, info["kit_versions"]))
        info["configs"] = dict(sorted(info["configs"].items(), key=lambda i: config_order(i[0])))
    return dict(sorted(out.items()))


def lossless_rows(results: Results, reference: str) -> list[dict]:
    rows = []
    for host, report in sorted(results.lossless.items()):
        for config, entry in sorted(
            report.get("configs", {}).items(), key=lambda i: config_order(i[0])
        ):
            state = (
                "flagged"
                if entry.get("broken_verification")
                else "passed"
                if entry.get("tokens_compared")
                else "not checked"
            )
            rows.append(
                {
                    "host": host,
                    "config": config,
                    "lossless": state,
                    "mismatch_rate": entry.get("mismatch_rate"),
                    "request_mismatch_rate": entry.get("request_mismatch_rate"),
                    "tokens_compared": entry.get("tokens_compared"),
                    "levels_not_checked": len(entry.get("not_checked") or []),
                    "reference": report.get("reference", reference),
                    "threshold": report.get("threshold"),
                }
            )
    return rows


LOSSLESS_COLUMNS = (
    "host",
    "config",
    "lossless",
    "mismatch_rate",
    "request_mismatch_rate",
    "tokens_compared",
    "levels_not_checked",
    "reference",
    "threshold",
)
# The HTML summary table's columns (module_utils/contract/metrics.py html): always shown.


def sweep_rows(diagnosis: sweep.Diagnosis) -> list[dict]:
    """Every budget against the next, with its level, figures and verdict (report.json
    ddtree_sweep)."""
    return [
        {
            "host": p.host,
            "tp_size": p.tp_size,
            "prompt_set": p.prompt_set,
            "concurrency": p.concurrency,
            "kind": p.kind,
            **p.figures(),
        }
        for p in diagnosis.pairs
    ]
