"""The study_lock task: its arguments and what it does with them, shared by the module
(library/study_lock.py) and its action plugin, which runs it inside ansible-playbook's worker
(module_utils/host/in_process.py): the lock is the controller's file, read and recorded at the
start and end of every run."""

from __future__ import annotations

from ansible.module_utils.host.helpers import run_with_deadline
from ansible.module_utils.host.in_process import TaskError
from ansible.module_utils.plan.study_lock import (
    HubUnreachable,
    LockError,
    git_resolver,
    hub_resolver,
    merge_known,
    merge_requested,
    record_runtime,
    sync,
)

SPEC = {
    "path": {"type": "path", "required": True},
    "action": {
        "type": "str",
        "default": "read",
        "choices": ["read", "record", "resolve", "record_runtime"],
    },
    "requested": {"type": "list", "elements": "dict", "default": []},
    "known": {"type": "list", "elements": "dict", "default": []},
    "update": {"type": "bool", "default": False},
    "endpoint": {"type": "str", "default": "https://huggingface.co"},
    "token": {"type": "str", "default": "", "no_log": True},
    "kind": {"type": "str", "choices": ["release", "git"]},
    "record": {"type": "dict"},
    "replace": {"type": "bool", "default": False},
    "timeout": {"type": "float", "default": 60},
    "tolerate_mismatch": {"type": "bool", "default": False},
    "runtime_built_from": {"type": "dict", "default": {}},
}
RULES = {"required_if": [("action", "record_runtime", ("kind", "record"))]}


def act(p: dict, check_mode: bool) -> dict:
    """The module's result for checked params p; TaskError with the lock's own message."""
    try:
        if p["action"] == "record_runtime":
            result = record_runtime(p["path"], p["kind"], p["record"], p["replace"], check_mode)
            return {"changed": result["recorded"], **result}
        resolvers = {}
        conflicts: list[str] = []
        if p["action"] == "resolve":
            hub_bounds = (p["endpoint"], p["token"], p["timeout"], 4 * p["timeout"])
            resolvers = {
                "weights": hub_resolver("model", *hub_bounds),
                "datasets": hub_resolver("dataset", *hub_bounds),
                "git": git_resolver(run_with_deadline, p["timeout"]),
            }
        result = sync(
            p["path"],
            merge_requested(p["requested"]),
            known=merge_known(p["known"], conflicts),
            resolvers=resolvers,
            mode=p["action"],
            update=p["update"],
            check_mode=check_mode,
            tolerate_mismatch=p["tolerate_mismatch"],
            runtime_built_from=p["runtime_built_from"],
        )
    except HubUnreachable as error:
        raise TaskError(
            f"{error} Nothing was resolved and the study lock {p['path']} is as it was. For a "
            "plan without the hub (nothing new pinned, no download sizes from it): "
            "-e plan_check_hub=false."
        ) from None
    except LockError as error:
        raise TaskError(str(error)) from None
    result["messages"] = result["messages"] + conflicts
    # A run's record of what it resolved is its bookkeeping on the controller, as the per-host
    # lock is: a second deploy reports changed=0 whether or not the first one wrote the lock.
    return {"changed": result["written"] and p["action"] == "resolve", **result}
