"""The serving_render task: its arguments and what it does with them, shared by the module
(library/serving_render.py) and its action plugin, which runs it inside ansible-playbook's
worker (module_utils/host/in_process.py): rendering launch commands from the definitions and
settings reads nothing of the host, and the server stage renders at every start."""

from __future__ import annotations

from ansible.module_utils.host.in_process import TaskError
from ansible.module_utils.plan.serving import (
    ServingConfigError,
    load_contracts,
    masked,
    render_all,
    validation,
    with_controls,
)

SPEC = {
    "definitions": {"type": "dict", "required": True},
    "selected": {"type": "list", "elements": "str", "required": True},
    "settings": {"type": "dict", "required": True},
    "api_key": {"type": "str", "default": "", "no_log": True},
    "reveal": {"type": "bool", "default": False},
    "add_controls": {"type": "bool", "default": False},
    "contracts": {"type": "dict"},
}


def act(p: dict, _check_mode: bool) -> dict:
    """The module's result for checked params p (read-only: the same in check mode)."""
    settings = dict(p["settings"], api_key=p["api_key"])
    definitions = p["definitions"]
    selected = p["selected"]
    if p["add_controls"]:
        selected = with_controls(definitions, selected)
    try:
        configs = render_all(definitions, selected, settings)
    except (ServingConfigError, KeyError) as error:
        raise TaskError(f"cannot render the serving configs: {error}") from None
    if p["contracts"] is not None:
        contracts = load_contracts(p["contracts"], settings)
        for config in configs:
            # Checked masked: a message quoting argv must not carry the API key.
            config["validation"] = validation(masked(config), contracts)
    result = {"changed": False, "selected": selected, "configs": [masked(c) for c in configs]}
    if p["reveal"]:
        result["configs_unmasked"] = configs
    return result
