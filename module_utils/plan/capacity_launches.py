"""capacity_plan's launches: what each serving config's launch is planned from, the target's and
drafters' config.json files read bounded, and every launch planned in one run (the preflight
and plan stages plan all their serving configs at once), each its own TP size, flags and
drafter, the rest shared. The memory model itself is capacity.py's."""

from __future__ import annotations

import json

from ansible.module_utils.plan.capacity import CapacityError, launch_options, plan
from ansible.module_utils.plan.capacity_roles import role_capacity, role_options

# A config.json is a few KiB; anything this large is not one.
MAX_CONFIG_BYTES = 16 << 20
# capacity_plan's options every launch shares; each one set wins over what its flags say.
SHARED_OPTIONS = (
    "verify_tokens",
    "max_running_requests",
    "mamba_ssm_dtype",
    "mamba_full_memory_ratio",
    "mamba_radix_cache_strategy",
    "disable_overlap_schedule",
    "max_mamba_cache_size",
    "context_length",
)


def read_config(option: str, path: str | None) -> dict | None:
    """The config.json at path (None without one), or CapacityError naming the option."""
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ValueError(f"over {MAX_CONFIG_BYTES} bytes")
        config = json.loads(data)
    except FileNotFoundError:
        raise CapacityError(
            f"{option}: {path} does not exist. Needed: an HF-style config.json."
        ) from None
    except (OSError, ValueError) as exc:
        raise CapacityError(f"{option}: {path} is not a readable JSON config ({exc}).") from None
    if not isinstance(config, dict):
        raise CapacityError(
            f"{option}: {path} holds a JSON {type(config).__name__}; needed: an HF-style "
            "config.json (a JSON object). Fix: point it at the model's config.json."
        )
    return config


def plan_launch(params: dict, model_config: dict, launch: dict, draft_config) -> dict:
    """One launch's plan: its own TP size, flags and drafter, the module's shared options, and
    its capacity by its role (whole, prefill or decode: capacity_roles.py) at the workload
    (params' prompt_tokens and new_tokens) where one is given. A decode server's `auto` context
    leaves its reserved decode tokens free: a longer prompt would wait for room forever."""
    argv = launch["launch_argv"] or []
    options = launch_options(argv) if argv else {}
    options.update({name: params[name] for name in SHARED_OPTIONS if params[name] is not None})
    role = role_options(argv)

    def planned_with(**overrides) -> dict:
        return plan(
            model_config,
            gpu_memory_mib=params["gpu_memory_mib"],
            tp_size=launch["tp_size"],
            mem_fraction_static=params["mem_fraction_static"],
            kv_cache_dtype=params["kv_cache_dtype"],
            draft_model_config=draft_config,
            overhead_mib=params["overhead_mib"],
            min_kv_tokens=params["min_kv_tokens"],
            gpu_count=params["gpu_count"],
            sources=(params["model_config"], launch["draft_model_config"]),
            **{**options, **overrides},
        )

    planned = planned_with()
    reserve, kv_tokens = role["reserved_decode_tokens"] or 0, planned["kv_tokens"]
    if planned["context_length_source"] == "auto" and kv_tokens > reserve > 0:
        longest = min(planned["max_context_length"], kv_tokens - reserve)
        if longest < planned["context_length"]:
            planned = planned_with(context_length=longest)
            planned.update(context_length_source="auto", max_context_length=longest)
    workload = (params.get("prompt_tokens"), params.get("new_tokens"))
    return {**planned, "role": role_capacity(planned, **role, workload=workload)}


def plan_launches(params: dict, model_config: dict) -> list[dict]:
    """Each of params["launches"] planned, under its name; each drafter's config read once. A
    launch that cannot be planned raises CapacityError naming it."""
    planned, drafts = [], {}
    for index, launch in enumerate(params["launches"]):
        path = launch["draft_model_config"]
        if path is not None and path not in drafts:
            drafts[path] = read_config(f"launches[{index}].draft_model_config", path)
        try:
            result = plan_launch(params, model_config, launch, drafts.get(path))
        except CapacityError as exc:
            raise CapacityError(f"launch {launch['name']}: {exc}") from None
        planned.append({"name": launch["name"], **result})
    return planned


def capacity_launches(configs, definitions, model_configs) -> list[dict]:
    """capacity_plan's launches for serving_render's configs: each one's TP size, its flags (the
    argv after `python -m sglang.launch_server`) and its drafter's config.json, if it has one."""
    planned = []
    for config in configs:
        drafter = definitions[config["base"]].get("drafter")
        launch = {
            "name": config["name"],
            "tp_size": config["tp_size"],
            "launch_argv": [str(arg) for arg in config["argv"][3:]],
        }
        if drafter:
            launch["draft_model_config"] = model_configs[drafter]
        planned.append(launch)
    return planned
