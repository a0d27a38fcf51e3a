"""A kit module's logic run inside ansible-playbook's worker instead of a Python started for
it, for the modules whose work is the controller's or reads nothing of the host
(action_plugins/kit_in_process.py): the module's argument spec checked as AnsibleModule checks
it, then its act(params, check_mode). A local module run costs a Python start and the import of
its payload, about 0.2 s of CPU, on every task of every run. The module itself stays
(library/), running the same spec and act() through run_as_module, for ansible -m and docs."""

from __future__ import annotations

import json

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.parameters import remove_values


class TaskError(Exception):
    """What the module would fail_json with: its message, and the result's other keys."""

    def __init__(self, msg: str, **result):
        super().__init__(msg)
        self.result = result


def run_in_process(name: str, spec: dict, args: dict, act, check_mode: bool, **rules) -> dict:
    """The module's result for args: {'failed': True, 'msg': ...} on a bad argument or a
    TaskError, as fail_json would say it; `rules` are AnsibleModule's (required_if, ...). The
    values of no_log arguments are masked in it, as exit_json and fail_json mask them."""
    # As a module gets them: plain JSON values, without the controller's tags and lazy
    # containers (which, say, yaml.safe_dump refuses).
    plain = json.loads(json.dumps(dict(args)))
    validated = ArgumentSpecValidator(spec, **rules).validate(plain)
    if validated.error_messages:
        result = {"failed": True, "msg": f"{name}: " + "; ".join(validated.error_messages)}
    else:
        try:
            result = act(validated.validated_parameters, check_mode)
        except TaskError as error:
            result = {**error.result, "failed": True, "msg": str(error)}
    return remove_values(result, validated._no_log_values)


def run_as_module(module_class, spec: dict, act, **rules) -> None:
    """The module's main(): module_class (its AnsibleModule) checks the arguments, act() does
    the work, and its result or TaskError ends the run as exit_json or fail_json."""
    module = module_class(argument_spec=spec, supports_check_mode=True, **rules)
    try:
        result = act(module.params, module.check_mode)
    except TaskError as error:
        module.fail_json(msg=str(error), **error.result)
    module.exit_json(**result)
