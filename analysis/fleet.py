"""A fleet behind SGLang's router against its replicas alone: scaling efficiency and balance.

benchmark_kimi.yml with benchmark_target=fleet (roles/benchmark/tasks/fleet.yml) measures,
with the same prompts, each replica alone at every concurrency c (results/<run>/<replica>/)
and then the router at c x replicas (results/<run>/<fleet group>/, each level file with its
`fleet`). A fleet level's scaling efficiency is its output tokens/s over the sum of its
replicas' at c: 1.0 is a fleet that serves as its replicas do alone, side by side.
"""

from __future__ import annotations

from analysis.results_types import Level, Results
from analysis.results_values import is_number, ratio

COLUMNS = (
    "fleet",
    "config",
    "prompt_set",
    "concurrency",
    "replicas",
    "per_replica_concurrency",
    "fleet_output_tokens_per_s",
    "replicas_output_tokens_per_s",
    "scaling_efficiency",
    "requests_ok",
    "requests_failed",
    "requests_per_replica",
    "balance_min_over_max",
    "router_failures",
    "missing",
)


def rows(results: Results) -> list[dict]:
    """One row per closed-loop fleet level, in the results' order."""
    alone = {
        (level.host, level.config, level.prompt_set, level.concurrency, level.repeat): level
        for level in results.levels
        if level.fleet is None and level.closed_loop
    }
    return [
        _row(level, alone)
        for level in results.levels
        if level.fleet is not None and level.closed_loop
    ]


def _row(level: Level, alone: dict) -> dict:
    workers = level.fleet["workers"]
    count = len(workers)
    per_replica = level.concurrency // count if level.concurrency % count == 0 else None
    found = {
        name: alone.get((name, level.config, level.prompt_set, per_replica, level.repeat))
        for name in workers
    }
    missing = sorted(name for name, match in found.items() if match is None)
    fleet_speed = level.summary.get("output_tokens_per_s")
    speeds = [m.summary.get("output_tokens_per_s") for m in found.values() if m is not None]
    total = sum(speeds) if not missing and all(is_number(s) for s in speeds) else None
    efficiency = ratio(fleet_speed if is_number(fleet_speed) else None, total)
    router_failures = [w["router_failures"] for w in workers.values()]
    return {
        "fleet": level.host,
        "config": level.config,
        "prompt_set": level.prompt_set,
        "concurrency": level.concurrency,
        "replicas": count,
        "per_replica_concurrency": per_replica,
        "fleet_output_tokens_per_s": fleet_speed,
        "replicas_output_tokens_per_s": total,
        "scaling_efficiency": round(efficiency, 4) if efficiency is not None else None,
        "requests_ok": level.summary.get("requests_ok"),
        "requests_failed": level.summary.get("requests_failed"),
        "requests_per_replica": " ".join(
            f"{name}:{'?' if w['requests'] is None else w['requests']}"
            for name, w in workers.items()
        ),
        "balance_min_over_max": level.fleet["balance"]["min_over_max"],
        "router_failures": (
            sum(router_failures) if all(isinstance(f, int) for f in router_failures) else None
        ),
        "missing": " ".join(missing),
    }
