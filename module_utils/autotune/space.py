"""Autotune's search space (autotune.yml, docs/autotune.md): each knob a list of values or a range,
checked before any host is contacted, and every candidate (one value per knob) as the settings a
server launches with.

A knob is one of:
- `config`: the serving config, or a DDTree budget's launch (ddtree-b32), by name;
- an SGLang flag as the launch spells it (`--max-running-requests`), checked with its values
  against the pinned release's parser (the contract snapshot); `--mem-fraction-static` and
  `--chunked-prefill-size` become the server settings the kit renders them from, any other
  flag joins the launch's extra arguments; a switch (`--enable-...`) takes true or false;
- an NCCL environment variable (`NCCL_ALGO`), a string per value, for the server's environment.
"""

from __future__ import annotations

import itertools
import math
import re

from ansible.module_utils.plan.sglang_args import check_argv

MAX_VALUES = 64
MAX_CANDIDATES = 4096
MAX_KNOBS = 12
# A value list's strings, and a range's bounds, stay this size.
MAX_TEXT = 256
# The flags the kit renders from server settings: a knob of these sets the setting.
SETTINGS_FLAGS = {
    "--mem-fraction-static": "mem_fraction_static",
    "--chunked-prefill-size": "chunked_prefill_size",
}
# Flags the kit renders itself from other inputs: a knob may not change them behind its back.
KIT_FLAGS = frozenset(
    {
        "--model-path",
        "--model",
        "--tp-size",
        "--tp",
        "--host",
        "--port",
        "--api-key",
        "--served-model-name",
        "--context-length",
        "--speculative-algorithm",
        "--speculative-draft-model-path",
        "--speculative-ddtree-budget",
        "--speculative-num-draft-tokens",
        "--disaggregation-mode",
        "--nnodes",
        "--node-rank",
        "--dist-init-addr",
    }
)
NCCL_NAME = re.compile(r"^NCCL_[A-Z0-9_]{1,64}$")
FLAG_NAME = re.compile(r"^--[a-z0-9][a-z0-9-]{0,80}$")
# Knobs along which a larger value asks for more GPU memory: a candidate at or above a failed
# one on each of them, and equal on every other knob, is pruned (module_utils/autotune/search.py).
MEMORY_KNOBS = frozenset(
    {
        "--mem-fraction-static",
        "--max-running-requests",
        "--chunked-prefill-size",
        "--cuda-graph-max-bs-decode",
        "--cuda-graph-max-bs-prefill",
        "--max-prefill-tokens",
        "--max-total-tokens",
    }
)


class SpaceError(ValueError):
    """A search space that cannot be searched: what was found, what is needed, the fix."""


def _options(contract: dict) -> dict:
    return {
        flag: option
        for option in contract.get("options") or []
        if isinstance(option, dict)
        for flag in option.get("option_strings") or []
    }


def _scalar_ok(value) -> bool:
    if isinstance(value, bool) or value is None:
        return isinstance(value, bool)
    if isinstance(value, (int, float)):
        return math.isfinite(value)
    return isinstance(value, str) and 0 < len(value) <= MAX_TEXT


def _range_values(name: str, spec: dict) -> list:
    """The values of {min, max, step}: min, min + step, ... up to max (floats rounded to 6
    places so 0.05 steps land on 0.9, not 0.9000000000000001)."""
    unknown = set(spec) - {"min", "max", "step"}
    bounds = [spec.get(key) for key in ("min", "max", "step")]
    if unknown or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in bounds
    ):
        raise SpaceError(
            f"knob {name}: the range {spec!r:.200} is not {{min, max, step}} of finite numbers"
            f"{f' (unknown keys {sorted(unknown)})' if unknown else ''}. Fix: e.g. "
            "{min: 0.80, max: 0.92, step: 0.04}, or a list of values."
        )
    low, high, step = bounds
    if step <= 0 or high < low:
        raise SpaceError(
            f"knob {name}: the range from {low} to {high} by {step} is empty or never ends "
            "(needed: max at least min, step above 0)."
        )
    count = math.floor((high - low) / step + 1e-9) + 1
    if count > MAX_VALUES:
        raise SpaceError(
            f"knob {name}: the range from {low} to {high} by {step} has {count} values, more "
            f"than {MAX_VALUES}. Fix: a larger step or a narrower range."
        )
    whole = all(isinstance(v, int) for v in bounds)
    return [low + i * step if whole else round(low + i * step, 6) for i in range(count)]


def knob_values(name: str, spec) -> list:
    """The values of one knob's spec (a list or a range), checked for shape and size."""
    if isinstance(spec, dict):
        return _range_values(name, spec)
    if not isinstance(spec, list) or not spec:
        raise SpaceError(
            f"knob {name}: {type(spec).__name__} {spec!r:.120} is neither a non-empty list of "
            "values nor a range {min, max, step}. Fix: e.g. [64, 128] or {min: 32, max: 128, "
            "step: 32}."
        )
    if len(spec) > MAX_VALUES:
        raise SpaceError(f"knob {name}: {len(spec)} values, more than {MAX_VALUES}.")
    bad = [value for value in spec if not _scalar_ok(value)]
    if bad:
        raise SpaceError(
            f"knob {name}: {bad[0]!r:.80} is not a value (needed: a number, true/false, or a "
            f"string of 1 to {MAX_TEXT} characters)."
        )
    if len({repr(v) for v in spec}) != len(spec):
        raise SpaceError(f"knob {name}: a value is listed twice in {spec!r:.200}.")
    return list(spec)


def _flag_argv(flag: str, value, option: dict) -> list[str]:
    """What the value adds to a launch: a switch's flag alone (true) or nothing (false)."""
    if option.get("action") in ("store_true", "store_false"):
        if not isinstance(value, bool):
            raise SpaceError(
                f"knob {flag} is a switch: its values are true (the flag is given) or false "
                f"(it is not), not {value!r:.80}."
            )
        return [flag] if value else []
    return [flag, str(value).lower() if isinstance(value, bool) else str(value)]


def _check_flag(flag: str, values: list, contract: dict, options: dict) -> None:
    if not FLAG_NAME.match(flag):
        raise SpaceError(f"knob {flag!r:.90} is not a flag as SGLang spells one (--like-this).")
    if flag in KIT_FLAGS:
        raise SpaceError(
            f"knob {flag} is rendered by the kit from its own settings; tune it through them "
            "(the config knob for the drafter and DDTree budget), not as a knob."
        )
    option = options.get(flag)
    if option is None:
        errors = check_argv(["--model-path", "/m", flag, "1"], contract)
        hint = f" ({errors[0]})" if errors else ""
        raise SpaceError(
            f"knob {flag}: the pinned runtime does not know this flag{hint}. Fix: a flag of "
            f"`python -m sglang.launch_server --help` for this runtime."
        )
    for value in values:
        errors = check_argv(["--model-path", "/m", *_flag_argv(flag, value, option)], contract)
        if errors:
            raise SpaceError(f"knob {flag}: value {value!r:.80} is refused: {errors[0]}")


def parse_space(space, contract: dict, configs: list[str]) -> dict[str, list]:
    """{knob: values} of a search space, every knob and value checked: `config` among
    `configs` (the serving configs and their launches), flags against the contract, NCCL
    variables by name. SpaceError saying what is wrong and how to fix it."""
    if not isinstance(space, dict) or not space:
        raise SpaceError(
            f"autotune_space is {type(space).__name__} {space!r:.120}; needed: a mapping of at "
            "least one knob to its values, e.g. {config: [dflash, ddtree-b32], "
            "--max-running-requests: [32, 64]}."
        )
    if len(space) > MAX_KNOBS:
        raise SpaceError(f"autotune_space has {len(space)} knobs, more than {MAX_KNOBS}.")
    options = _options(contract)
    parsed: dict[str, list] = {}
    for name, spec in space.items():
        if not isinstance(name, str):
            raise SpaceError(f"knob {name!r:.80} is not a name")
        values = knob_values(name, spec)
        if name == "config":
            unknown = [v for v in values if v not in configs]
            if unknown:
                raise SpaceError(
                    f"knob config: {unknown[0]!r:.80} is not a serving config of this model "
                    f"(known: {', '.join(configs)})."
                )
        elif name.startswith("NCCL"):
            if not NCCL_NAME.match(name):
                raise SpaceError(
                    f"knob {name!r:.90} is not an NCCL variable name (NCCL_LIKE_THIS)."
                )
            values = [str(v).lower() if isinstance(v, bool) else str(v) for v in values]
        else:
            _check_flag(name, values, contract, options)
        parsed[name] = values
    count = math.prod(len(values) for values in parsed.values())
    if count > MAX_CANDIDATES:
        raise SpaceError(
            f"autotune_space has {count} candidates (the product of its knobs' values), more "
            f"than {MAX_CANDIDATES}. Fix: fewer values per knob, or fewer knobs."
        )
    return parsed


def candidates(parsed: dict[str, list]) -> list[dict]:
    """Every candidate, one value per knob, in the space's own order."""
    names = list(parsed)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*parsed.values())]


def candidate_key(candidate: dict) -> str:
    """A stable name of a candidate: its knobs sorted, values as written."""
    return ",".join(f"{name}={candidate[name]}" for name in sorted(candidate))


def launch_settings(candidate: dict, contract: dict, base_config: str) -> dict:
    """What the candidate changes in a launch: {config, settings (server settings' keys),
    extra_args, environment}. `base_config` is the config when the space has no config knob."""
    options = _options(contract)
    settings, extra, environment = {}, [], {}
    for name, value in candidate.items():
        if name == "config":
            continue
        if name.startswith("NCCL"):
            environment[name] = str(value)
        elif name in SETTINGS_FLAGS:
            settings[SETTINGS_FLAGS[name]] = value
        else:
            extra += _flag_argv(name, value, options.get(name) or {})
    return {
        "config": candidate.get("config", base_config),
        "settings": settings,
        "extra_args": extra,
        "environment": environment,
    }


def dominates(candidate: dict, failed: dict) -> bool:
    """Whether the candidate asks at least as much memory as a failed one: equal on every knob
    but the memory knobs (MEMORY_KNOBS), at or above it on each of those."""
    if set(candidate) != set(failed):
        return False
    for name, value in candidate.items():
        other = failed[name]
        if name in MEMORY_KNOBS and isinstance(value, (int, float)):
            if not isinstance(other, (int, float)) or value < other:
                return False
        elif value != other:
            return False
    return True
