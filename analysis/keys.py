"""Keys the tables, the quality gate and the plots share: where a level is measured, which
config is its reference, a value at a TP size. Nothing here imports another analysis module
but results, so that tables and quality can both import it without a loop."""

from __future__ import annotations

from analysis.results import parse_config_name


def is_reference(config: str, reference: str) -> bool:
    """The reference config, or it at another TP size (ar-tp4 when the reference is ar or
    ar-tp1): each TP size's speedups are against its own."""
    base, _tp, budget = parse_config_name(config)
    reference_base, _reference_tp, reference_budget = parse_config_name(reference)
    return config == reference or (
        budget is None and reference_budget is None and base == reference_base
    )


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
