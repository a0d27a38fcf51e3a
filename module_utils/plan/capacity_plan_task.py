"""The capacity_plan task: its arguments and what it does with them, shared by the module
(library/capacity_plan.py) and its action plugin, which runs it inside ansible-playbook's
worker (module_utils/host/in_process.py): the plan reads the model folder's configs on the
controller and computes, and preflight and plan.yml run it for every host."""

from __future__ import annotations

from ansible.module_utils.host.in_process import TaskError
from ansible.module_utils.plan.capacity import CapacityError
from ansible.module_utils.plan.capacity_common import KV_DTYPE_BYTES
from ansible.module_utils.plan.capacity_hybrid import MAMBA_STRATEGIES, SSM_DTYPE_BYTES
from ansible.module_utils.plan.capacity_launches import plan_launch, plan_launches, read_config

LAUNCH = {
    "name": {"type": "str", "required": True},
    "tp_size": {"type": "int", "required": True},
    "launch_argv": {"type": "list", "elements": "str"},
    "draft_model_config": {"type": "path"},
}
SPEC = {
    "model_config": {"type": "path", "required": True},
    "draft_model_config": {"type": "path"},
    "gpu_memory_mib": {"type": "int", "required": True},
    "tp_size": {"type": "int"},
    "gpu_count": {"type": "int"},
    "mem_fraction_static": {"type": "float", "required": True},
    "kv_cache_dtype": {"type": "str", "default": "auto", "choices": sorted(KV_DTYPE_BYTES)},
    "overhead_mib": {"type": "int", "default": 3072},
    "min_kv_tokens": {"type": "int", "default": 16384, "no_log": False},
    "verify_tokens": {"type": "int", "no_log": False},
    "max_running_requests": {"type": "int"},
    "mamba_ssm_dtype": {"type": "str", "choices": list(SSM_DTYPE_BYTES)},
    "mamba_full_memory_ratio": {"type": "float"},
    "mamba_radix_cache_strategy": {"type": "str", "choices": list(MAMBA_STRATEGIES)},
    "disable_overlap_schedule": {"type": "bool"},
    "launch_argv": {"type": "list", "elements": "str"},
    "max_mamba_cache_size": {"type": "int"},
    "context_length": {"type": "str"},
    "launches": {"type": "list", "elements": "dict", "options": LAUNCH},
    # The workload each launch's role capacity is given at (capacity_roles.py).
    "prompt_tokens": {"type": "int", "no_log": False},
    "new_tokens": {"type": "int", "no_log": False},
}
RULES = {
    "required_one_of": [("tp_size", "launches")],
    "mutually_exclusive": [
        ("launches", "tp_size"),
        ("launches", "launch_argv"),
        ("launches", "draft_model_config"),
    ],
}


def act(params: dict, _check_mode: bool) -> dict:
    """The module's result for checked params (read-only: the same in check mode)."""
    try:
        model_config = read_config("model_config", params["model_config"])
        if params["launches"] is not None:
            return {"changed": False, "launches": plan_launches(params, model_config)}
        launch = {key: params[key] for key in ("tp_size", "launch_argv", "draft_model_config")}
        draft_config = read_config("draft_model_config", launch["draft_model_config"])
        return {"changed": False, **plan_launch(params, model_config, launch, draft_config)}
    except CapacityError as exc:
        raise TaskError(str(exc)) from None
