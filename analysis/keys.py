"""Keys the tables, the quality gate and the plots share: where a level is measured, which
config is its reference (the writer's rule, module_utils/contract/names.py), a value at a TP
size, the closed-loop rows. Nothing here imports another analysis module, so that tables and
quality can both import it without a loop."""

from __future__ import annotations

from ansible.module_utils.contract.names import is_reference  # noqa: F401  (the writer's rule)


def at_tp(values: dict, place: tuple, tp: int | None):
    """The value recorded at place for TP size tp: the same TP size's, else one whose TP size
    is unknown; a row whose TP size is unknown takes the only one there is. Never a value of
    another known TP size: a TP4 server is not measured against a TP1 one."""
    by_tp = values.get(place) or {}
    if tp in by_tp:
        return by_tp[tp]
    if None in by_tp:
        return by_tp[None]
    if tp is None and len(by_tp) == 1:
        return next(iter(by_tp.values()))
    return None


def level_key(level) -> tuple:
    """Where a level's speedup is measured: the same host, prompt set, concurrency, request
    rate and repeat (TP size is matched apart)."""
    return (level.host, level.prompt_set, level.concurrency, level.request_rate, level.repeat)


def rows_by_file(table: list[dict]) -> dict[str, dict]:
    """Each level file's row (a row of averaged repeats holds several files)."""
    return {path: row for row in table for path in row.get("files") or [row.get("file")]}


def closed_loop(table: list[dict]) -> list[dict]:
    """The rows of closed-loop levels (c<N>.json): the ones concurrency bands, the budget
    sweep and the concurrency plots are about."""
    return [row for row in table if row.get("request_rate") is None]
