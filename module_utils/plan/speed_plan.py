"""The plan's speed prediction: module_utils/plan/speed_model.py over every rendered launch.

plan.yml renders each serving config's launches (one per DDTree budget and TP size) and plans
their memory; plan_speed() then predicts, for each launch at each of the benchmark's
concurrency levels, the decode step time with its parts, the accepted tokens per step and
the tokens/s per request and per server, from the launch's own argv (speed_model's
spec_from_argv), its TP size and KV cache dtype, its running-request cap, a context length
per request and the profile's hardware figures (a host's calibration record in place of the
nominal ones where the controller has it). Accepted tokens come from the drafter's published
acceptance per prompt set; sets with the same published figure share one prediction. For
each DDTree config the curve over its budgets and the budget past which the model predicts
no further gain (speed_model.ddtree_curve).

A prediction that cannot be made for one launch (no published acceptance, an algorithm the
model does not know) leaves that launch's figures null with the reason; bad hardware data
(an unknown profile, a malformed figure or calibration record) raises SpeedModelError, which
says what was found, what is needed and how to fix it.
"""

from __future__ import annotations

import math
from pathlib import Path

from ansible.module_utils.contract.launch import flag_value
from ansible.module_utils.contract.names import (
    ServingConfigError,
    config_name,
    parse_config_name,
)
from ansible.module_utils.plan import capacity, speed_inputs, speed_model
from ansible.module_utils.plan.capacity_hybrid import SPEC_MAX_RUNNING_REQUESTS
from ansible.module_utils.plan.speed_inputs import SpeedModelError

# The drafter configs speed_model knows (kimi_model_configs keys).
DRAFTERS = ("dflash", "eagle3")
# Decimal places kept in plan.json: far below what the model can tell apart, and the same
# figures on every run.
PLACES = 4
MAX_LAUNCHES = 256
MAX_LEVELS = 64
MAX_PROMPT_SETS = 64
MAX_TEXT = 500
NOMINAL_ALLREDUCE = (
    "nominal: the profile's allreduce_busbw_gbs and allreduce_latency_us (no all-reduce "
    "measurement of this host was given)"
)


def _rounded(value):
    """value with every float rounded to PLACES (a float that is not finite becomes None)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, float):
        return round(value, PLACES) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): _rounded(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(item) for item in value]
    return value


def _count(value, name: str, high: int) -> int:
    """A whole number 1..high: an int, or the digits of one (an -e key=value is a string)."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise SpeedModelError(
            f"{name} is {value!r}; needed: a whole number from 1 to {high}. Fix: set {name}."
        )
    return value


def _names(value, name: str, high: int) -> list[str]:
    if not isinstance(value, (list, tuple)) or len(value) > high:
        raise SpeedModelError(
            f"{name} is {value!r}; needed: a list of at most {high} names. Fix: set {name}."
        )
    if not all(isinstance(item, str) and 0 < len(item) <= 200 for item in value):
        raise SpeedModelError(f"{name} is {value!r}; needed: names (strings). Fix: set {name}.")
    return list(value)


def _text(value) -> str:
    return str(value)[:MAX_TEXT]


def read_record(path, what: str):
    """The JSON record at path on the controller, or None when there is no file there."""
    if not path:
        return None
    path = Path(str(path))
    if not path.exists():
        return None
    return speed_inputs.read_json(path, what)


def plan_inputs(config_paths, model_dir) -> dict:
    """speed_inputs.model_inputs() from the plan's own config paths (kimi_model_configs: target
    and each drafter's config.json) and the model folder's acceptance.json."""
    if not isinstance(config_paths, dict) or not config_paths.get("target"):
        raise SpeedModelError(
            f"the model configs are {config_paths!r}; needed: a mapping with the target's "
            "config.json path (kimi_model_configs). Fix: restore the model folder."
        )
    inputs = {"config": None, "drafters": {}, "acceptance": speed_inputs.load_acceptance(model_dir)}
    for name, path in config_paths.items():
        if name != "target" and name not in DRAFTERS:
            continue
        config = speed_inputs.read_json(Path(str(path)), f"the {name} config")
        if not isinstance(config, dict):
            raise SpeedModelError(f"the {name} config at {path} is not a JSON object.")
        if name == "target":
            inputs["config"] = config
        else:
            inputs["drafters"][name] = config
    return inputs


def hardware_figures(hardware, profile, calibration=None, calibration_source=None) -> dict:
    """The profile's figures (checked), with the host's calibration applied when given."""
    if not isinstance(hardware, dict) or not hardware:
        raise SpeedModelError(
            f"the hardware figures are {type(hardware).__name__}; needed: a mapping of profiles "
            f"({speed_inputs.HARDWARE_KEY}, group_vars/all/speed_hardware.json). Fix: restore "
            "the file from the kit."
        )
    if not isinstance(profile, str) or profile not in hardware:
        speed_inputs.profile_figures(profile, {str(name): None for name in hardware})
    figures = speed_inputs.profile_figures(
        profile, {profile: speed_inputs.check_profile(profile, hardware[profile])}
    )
    figures["calibration"] = None
    if calibration is not None:
        where = _text(calibration_source or "the calibration record")
        try:
            figures = speed_inputs.apply_calibration(figures, calibration)
        except SpeedModelError as error:
            raise SpeedModelError(
                f"{where}: {error} (or remove the file to plan with the nominal figures)"
            ) from None
        figures["calibration"] = where
    return figures


def acceptance_groups(inputs: dict, drafter: str | None, prompt_sets: list[str]) -> list[dict]:
    """The prompt sets by the published acceptance each gets, in the benchmark's order: sets
    with the same figure share one group (AR: all of them, one token a step)."""
    if drafter is None:
        return [{"prompt_sets": list(prompt_sets), "published_accept_length": None,
                 "sources": dict.fromkeys(prompt_sets, "AR: one token a step")}]  # fmt: skip
    groups: dict = {}
    for prompt_set in prompt_sets or [None]:
        length, source = speed_inputs.published_acceptance(
            inputs["acceptance"], drafter, prompt_set
        )
        key = None if length is None else round(float(length), PLACES)
        group = groups.setdefault(
            key, {"prompt_sets": [], "published_accept_length": key, "sources": {}}
        )
        if prompt_set is not None:
            group["prompt_sets"].append(prompt_set)
        group["sources"][prompt_set or "(none)"] = _text(source)
    return list(groups.values())


def running_cap(shape: dict, capacity_cap) -> tuple[int | None, str]:
    """The launch's running-request cap and where it comes from: the capacity plan's (its
    --max-running-requests, or what a hybrid target's pools hold), else SGLang's own default
    under speculative decoding, else none (AR: SGLang sizes it from the KV pool, thousands)."""
    if capacity_cap is not None:
        cap = _count(capacity_cap, "max_running_requests", speed_inputs.MAX_CONCURRENCY)
        return cap, "the capacity plan (the launch's --max-running-requests or what its pools hold)"
    if shape["algorithm"] != "AR":
        return SPEC_MAX_RUNNING_REQUESTS, (
            f"SGLang's default under speculative decoding ({SPEC_MAX_RUNNING_REQUESTS} "
            "when the launch sets no --max-running-requests)"
        )
    return None, "none: SGLang sizes it from the KV pool (2048 or more), above every level"


def _kv_dtype(argv: list, default: str) -> str:
    value = flag_value([str(item) for item in argv], "--kv-cache-dtype")
    return str(value if value is not None else default)[:64]


def _level(inputs, figures, launch, groups, concurrency, context_tokens, options) -> dict:
    """One benchmark level of one launch: the step (the same whatever the prompts) and, per
    acceptance group, the accepted tokens and tokens/s."""
    by_set = []
    step = None
    for group in groups:
        prompt_set = group["prompt_sets"][0] if group["prompt_sets"] else None
        result = speed_model.predict_launch(
            inputs,
            figures,
            launch["argv"],
            concurrency,
            context_tokens,
            launch["tp_size"],
            prompt_set,
            **options,
        )
        step = step or result
        by_set.append(
            {
                "prompt_sets": group["prompt_sets"],
                "accepted_tokens_per_step": result["accepted_tokens_per_step"],
                "tokens_per_s_per_request": result["tokens_per_s_per_request"],
                "tokens_per_s": result["tokens_per_s"],
            }
        )
    return {
        "concurrency": concurrency,
        "batch": step["batch"],
        "step_ms": step["step_ms"],
        "parts": step["parts"],
        "by_prompt_set": by_set,
    }


def _launch(inputs, figures, launch, concurrency, prompt_sets, context_tokens, kv_default):
    shape = speed_inputs.spec_from_argv(launch["argv"])
    drafter = speed_inputs.DRAFTER_OF.get(shape["algorithm"])
    cap, cap_source = running_cap(shape, launch.get("max_running_requests"))
    kv_cache_dtype = _kv_dtype(launch["argv"], kv_default)
    options = {"kv_cache_dtype": kv_cache_dtype, "max_running_requests": cap}
    groups = acceptance_groups(inputs, drafter, prompt_sets)
    levels = [
        _level(inputs, figures, launch, groups, level, context_tokens, options)
        for level in concurrency
    ]
    unknown = [group for group in groups if drafter and group["published_accept_length"] is None]
    reason = None
    if unknown:
        reason = "; ".join(
            f"tokens/s unknown for {', '.join(group['prompt_sets']) or 'the benchmark'}: "
            f"{next(iter(group['sources'].values()))}"
            for group in unknown
        )
    return (
        {
            "base": launch["base"],
            "algorithm": shape["algorithm"],
            "budget": shape.get("budget"),
            "tp_size": launch["tp_size"],
            "kv_cache_dtype": kv_cache_dtype,
            "verify_tokens_per_request": shape["verify_tokens"],
            "max_running_requests": cap,
            "max_running_requests_source": cap_source,
            "acceptance": groups,
            "levels": levels,
            "reason": reason,
        },
        shape,
        options,
    )


def _ddtree(inputs, figures, group, concurrency, prompt_sets, context_tokens) -> dict:
    """One DDTree config's curve over its budgets at each level and acceptance group."""
    first = group["launches"][0]
    shape, options = first["shape"], first["options"]
    draft = inputs["drafters"].get("dflash")
    curves = []
    for accept in acceptance_groups(inputs, "dflash", prompt_sets):
        for level in concurrency:
            curve = speed_model.ddtree_curve(
                inputs["config"],
                draft,
                figures,
                shape,
                group["budgets"],
                level,
                context_tokens,
                group["tp_size"],
                accept["published_accept_length"],
                **options,
            )
            # The model's best budget may lie outside the study's (below block size - 1, the
            # chain's own size, where no tree of the sweep pays): the best of those run too.
            rated = [point for point in curve["points"] if point["tokens_per_s"] is not None]
            best_run = max(rated, key=lambda point: point["tokens_per_s"]) if rated else None
            curves.append(
                {
                    "concurrency": level,
                    "prompt_sets": accept["prompt_sets"],
                    "published_accept_length": accept["published_accept_length"],
                    "best_budget": curve["best_budget"],
                    "best_of_budgets": best_run["budget"] if best_run else None,
                    "points": curve["points"],
                }
            )
    return {
        "base": group["base"],
        "tp_size": group["tp_size"],
        "block_size": shape["block_size"],
        "budgets": group["budgets"],
        "launches": [launch["name"] for launch in group["launches"]],
        "curves": curves,
    }


def _checked_launch(launch) -> dict:
    if not isinstance(launch, dict):
        raise SpeedModelError(f"a launch is {launch!r}; needed: serving_render's launch mapping.")
    name, argv = launch.get("name"), launch.get("argv")
    if not isinstance(name, str) or not isinstance(argv, (list, tuple)):
        raise SpeedModelError(
            f"a launch has name {name!r} and argv of type {type(argv).__name__}; needed: a name "
            "and an argv list (serving_render's configs)."
        )
    return {
        "name": name,
        "base": str(launch.get("base") or name),
        # The argv after `python -m sglang.launch_server`: the flags.
        "argv": [str(item) for item in argv],
        "tp_size": _count(launch.get("tp_size"), f"{name} tp_size", capacity.MAX_TP),
        "max_running_requests": launch.get("max_running_requests"),
    }


def plan_speed(
    launches,
    inputs: dict,
    figures: dict,
    *,
    concurrency,
    prompt_sets,
    context_tokens,
    kv_cache_dtype: str = "auto",
    allreduce=None,
    allreduce_source: str | None = None,
    sources: dict | None = None,
) -> dict:
    """The plan's `speed`: per launch (serving_render's, each with its tp_size, argv and the
    capacity plan's max_running_requests) and benchmark concurrency level the predicted step
    and rates; per DDTree config its curve and best budget; every figure's source.

    `figures` are hardware_figures()'s; `allreduce` a host's all-reduce check record (results:
    [{bytes, time_us}]) with its source, else the profile's nominal figure (said so);
    `sources` adds where the plan's own inputs come from (the context length, the levels)."""
    if not isinstance(launches, (list, tuple)) or not 0 < len(launches) <= MAX_LAUNCHES:
        raise SpeedModelError(
            f"the launches are {type(launches).__name__}; needed: 1 to {MAX_LAUNCHES} launches."
        )
    levels = _levels(concurrency)
    prompt_sets = _names(prompt_sets, "the prompt sets (kimi_prompt_sets)", MAX_PROMPT_SETS)
    context_tokens = _count(
        context_tokens,
        "the context per request (kimi_speed_context_tokens)",
        speed_inputs.MAX_CONTEXT,
    )
    figures = _with_allreduce(figures, allreduce, allreduce_source)
    predicted, ddtree_groups = _predict_launches(
        launches, inputs, figures, levels, prompt_sets, context_tokens, kv_cache_dtype
    )
    ddtree = _ddtree_curves(ddtree_groups, inputs, figures, levels, prompt_sets, context_tokens)
    return _rounded(
        {
            "profile": figures["profile"],
            "gpu": figures["gpu"],
            "interconnect": figures["interconnect"],
            # Where the host's calibration record came from, None where nominal figures hold.
            "calibration": figures.get("calibration"),
            "allreduce_measured": allreduce is not None,
            "context_tokens": context_tokens,
            "concurrency": levels,
            "prompt_sets": prompt_sets,
            "figures": {field: figures[field] for field in speed_inputs.HARDWARE_FIELDS},
            "sources": _all_sources(figures, inputs, sources),
            "launches": predicted,
            "ddtree": ddtree,
        }
    )


def _levels(concurrency) -> list[int]:
    """The benchmark's concurrency levels: one or a list, each a count, none repeated."""
    levels = concurrency if isinstance(concurrency, (list, tuple)) else [concurrency]
    if not 0 < len(levels) <= MAX_LEVELS:
        raise SpeedModelError(
            f"the concurrency levels are {concurrency!r}; needed: 1 to {MAX_LEVELS} levels. "
            "Fix: set kimi_benchmark_concurrency."
        )
    levels = [
        _count(level, "a concurrency level", speed_inputs.MAX_CONCURRENCY) for level in levels
    ]
    if len(set(levels)) != len(levels):
        raise SpeedModelError(
            f"the concurrency levels {levels} repeat one; needed: distinct levels. Fix: set "
            "kimi_benchmark_concurrency."
        )
    return levels


def _with_allreduce(figures: dict, allreduce, allreduce_source: str | None) -> dict:
    """The figures with the host's measured all-reduce table, else the profile's nominal
    figure, each with its source."""
    if allreduce is not None:
        return speed_inputs.apply_allreduce(
            figures, allreduce, allreduce_source or "this host's all-reduce check"
        )
    figures = dict(figures, sources=dict(figures["sources"]))
    figures["sources"]["allreduce"] = _text(allreduce_source or NOMINAL_ALLREDUCE)
    return figures


def _predict_launches(
    launches, inputs, figures, levels, prompt_sets, context_tokens, kv_cache_dtype
) -> tuple[dict, dict]:
    """(each launch's prediction, or why there is none; the DDTree launches grouped by their
    config, whatever budget each runs)."""
    predicted: dict = {}
    ddtree_groups: dict = {}
    for raw in launches:
        launch = _checked_launch(raw)
        try:
            entry, shape, options = _launch(
                inputs, figures, launch, levels, prompt_sets, context_tokens, kv_cache_dtype
            )
        except SpeedModelError as error:
            predicted[launch["name"]] = {
                "base": launch["base"],
                "algorithm": None,
                "levels": [],
                "reason": f"no prediction: {error}",
            }
            continue
        predicted[launch["name"]] = entry
        if shape["algorithm"] == "DDTREE":
            _add_to_ddtree_group(ddtree_groups, launch, shape, options)
    return predicted, ddtree_groups


def _add_to_ddtree_group(groups: dict, launch: dict, shape: dict, options: dict) -> None:
    try:
        base, tp, _ = parse_config_name(launch["name"])
    except ServingConfigError:
        base, tp = launch["base"], None
    group = groups.setdefault(
        config_name(base, tp),
        {"base": base, "tp_size": launch["tp_size"], "budgets": [], "launches": []},
    )
    group["budgets"].append(shape["budget"])
    group["launches"].append({"name": launch["name"], "shape": shape, "options": options})


def _ddtree_curves(groups, inputs, figures, levels, prompt_sets, context_tokens) -> dict:
    """Each DDTree config's curve over its budgets, or why there is none."""
    ddtree = {}
    for key, group in groups.items():
        group["budgets"] = sorted(set(group["budgets"]))
        try:
            ddtree[key] = _ddtree(inputs, figures, group, levels, prompt_sets, context_tokens)
        except SpeedModelError as error:
            ddtree[key] = {"base": group["base"], "curves": [], "reason": f"no curve: {error}"}
    return ddtree


def _all_sources(figures: dict, inputs: dict, sources: dict | None) -> dict:
    """Where every figure comes from: the hardware, the published acceptance and the plan's
    own inputs."""
    acceptance = {
        drafter: _text(entry.get("source", "")) for drafter, entry in inputs["acceptance"].items()
    }
    all_sources = dict(figures["sources"])
    all_sources["acceptance"] = acceptance or "none published for this model"
    all_sources.update({str(key): _text(value) for key, value in (sources or {}).items()})
    return all_sources
