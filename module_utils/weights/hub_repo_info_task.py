"""The hub_repo_info task: its arguments and what it does with them, shared by the module
(library/hub_repo_info.py) and its action plugin, which runs it inside ansible-playbook's worker
(module_utils/host/in_process.py). It always ran on the controller, as a Python of its own
started for every host of every run that asks the hub (the settings check, preflight, the
weights stage, the plan): about a third of its 0.45 s of CPU was that Python's start and its
payload's import; the rest is importing huggingface_hub, which either way it needs."""

from __future__ import annotations

import os

from ansible.module_utils.host.in_process import TaskError
from ansible.module_utils.weights.hub import HAS_HUB, inspect_repos

SPEC = {
    "repos": {"type": "dict", "required": True},
    "token": {"type": "str", "default": "", "no_log": True},
    "endpoint": {"type": "str"},
    "timeout": {"type": "float", "default": 20},
    "deadline": {"type": "float", "default": 120},
}


def act(p: dict, _check_mode: bool) -> dict:
    """The module's result for checked params p (read-only: the same in check mode)."""
    if not HAS_HUB:
        raise TaskError(
            "hub_repo_info needs huggingface_hub in the controller's Python (make setup "
            "installs the pinned one)"
        )
    if not (0 < p["timeout"] <= p["deadline"]):
        raise TaskError(
            f"timeout ({p['timeout']}) must be above 0 and at most deadline ({p['deadline']})"
        )
    endpoint = p["endpoint"] or os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    repos = {}
    for name, spec in p["repos"].items():
        if not isinstance(spec, dict) or not spec.get("repo_id"):
            raise TaskError(f"repos.{name} needs a repo_id (owner/name); got {spec!r}")
        repos[name] = {"repo_id": spec["repo_id"], "revision": str(spec.get("revision") or "main")}
    found = inspect_repos(repos, p["token"], endpoint, p["timeout"], p["deadline"])
    return {"changed": False, **found}
