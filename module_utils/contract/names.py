"""Serving config names: the grammar the server role expands definitions to, the reference
config and the order reports show configs in.

A definition expands over its DDTree budgets and, with `tp: [..]`, over tensor parallel sizes,
one server each: `<config>`, `<config>-tp<N>`, `<config>-b<B>`, `<config>-tp<N>-b<B>`.
parse_config_name() is the writer's strict reader (module_utils/plan/serving.py renders and
checks by it); read_config_name() the analysis' lenient one, which leaves a name it cannot
read whole instead of failing: results may come from an older kit or a renamed folder.
"""

from __future__ import annotations

import re

# Bounds of what a name or a definition may expand to (module_utils/plan/model_data.py checks
# the model files against the same ones); a TP size or budget past them is not one the kit
# renders, so the analysis reads such a name whole.
MAX_TP = 1024
MAX_BUDGET = 1 << 16
MAX_NAME = 128
# Lazy base: `ddtree-tp4-b32` is (ddtree, 4, 32), never (ddtree-tp4, None, 32).
CONFIG_NAME = re.compile(
    r"^(?P<base>[a-z0-9][a-z0-9.-]*?)(?:-tp(?P<tp>[0-9]+))?(?:-b(?P<budget>[0-9]+))?$"
)
# The config every other one is measured against (speedups, greedy outputs); a run names
# another with benchmark_reference_config.
REFERENCE = "ar"
# The DFlash chain served with the DDTree servers' attention backend, page size 1 and overlap
# scheduling off: DDTree's control on equal terms (`control_for: ddtree` in models/*/model.yml).
CHAIN_CONTROL = "dflash-tree-backend"
# Where the known bases sit in tables and plots: (place, place within it). DDTree's budgets
# come next (config_order), anything else last.
DISPLAY_ORDER = {"ar": (0, 0), "eagle3": (1, 0), "dflash": (2, 0), CHAIN_CONTROL: (2, 1)}


class ServingConfigError(Exception):
    pass


def parse_config_name(name) -> tuple[str, int | None, int | None]:
    """(base, tp or None, budget or None) of an expanded config name.

    `ar` -> (ar, None, None); `ar-tp4` -> (ar, 4, None); `ddtree-b32` -> (ddtree, None, 32);
    `ddtree-tp4-b32` -> (ddtree, 4, 32). Definition names never end in -tp<N> or -b<N>
    (module_utils/plan/model_data.py refuses them), so the split is unambiguous.
    """
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
        raise ServingConfigError(
            f"a serving config name must be a string of 1 to {MAX_NAME} characters, got {name!r}"
        )
    match = CONFIG_NAME.match(name)
    if not match:
        raise ServingConfigError(
            f"serving config name {name!r} is not <config>, <config>-tp<N>, <config>-b<B> or "
            "<config>-tp<N>-b<B> (lower-case letters, digits, '.' and '-')"
        )
    tp, budget = match["tp"], match["budget"]
    return (
        match["base"],
        int(tp) if tp is not None else None,
        int(budget) if budget is not None else None,
    )


def config_name(base: str, tp: int | None = None, budget: int | None = None) -> str:
    """The name parse_config_name() reads back: base[-tp<N>][-b<B>]."""
    return (
        base
        + (f"-tp{tp}" if tp is not None else "")
        + (f"-b{budget}" if budget is not None else "")
    )


def read_config_name(name) -> tuple[str, int | None, int | None]:
    """parse_config_name() for results: a name outside the grammar, or with a TP size or
    budget out of bounds (tp0, b0, more GPUs than a TP group has), is (name, None, None)."""
    try:
        base, tp, budget = parse_config_name(name)
    except ServingConfigError:
        return str(name), None, None
    if (tp is not None and not 1 <= tp <= MAX_TP) or (
        budget is not None and not 1 <= budget <= MAX_BUDGET
    ):
        return name, None, None
    return base, tp, budget


def base_config(name) -> str:
    return read_config_name(name)[0]


def config_order(config: str) -> tuple:
    """ar, eagle3, dflash, the chain control, then budgeted configs (DDTree) by budget, then
    anything else by name; a config expanded over TP sizes by TP size within its place."""
    base, tp, budget = read_config_name(config)
    if base in DISPLAY_ORDER:
        return (*DISPLAY_ORDER[base], tp or 0, config)
    if budget is not None:
        return (3, budget, tp or 0, config)
    return (4, 0, tp or 0, config)


def is_reference(config: str, reference: str) -> bool:
    """The reference config, or its definition at another TP size (ar-tp4 when the reference
    is ar or ar-tp1): greedy outputs agree only at one TP size, so each TP size's reference
    server is that size's reference. A name outside the grammar is only itself."""
    try:
        base, _tp, budget = parse_config_name(config)
        reference_base, _reference_tp, reference_budget = parse_config_name(reference)
    except ServingConfigError:
        return config == reference
    return config == reference or (
        budget is None and reference_budget is None and base == reference_base
    )


def reference_at_tp(reference: str, tp: int | None) -> str:
    """The reference's definition at TP size tp (ar-tp4 for ar or ar-tp1 at 4); the reference
    itself where the config has no TP size or the reference is outside the grammar."""
    if tp is None:
        return reference
    try:
        base, _tp, _budget = parse_config_name(reference)
    except ServingConfigError:
        return reference
    return config_name(base, tp)
