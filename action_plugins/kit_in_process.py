# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""The kit's modules whose work is the controller's, or reads nothing of the host, run inside
ansible-playbook's worker instead of a Python started for them (and, for serving_render, an
SSH round trip): the study lock's read and record at every run's start and end, the launch
commands rendered at every server start, the capacity plan, the wheelhouse's archive,
autotune's search steps, the hub's answers about the repositories. Each module's own spec and
act() (module_utils/<stage>/<name>_task.py), through module_utils/host/in_process.py, which
checks the arguments as AnsibleModule does and masks no_log values in the result as exit_json
does. action_plugins/<name>.py of each is this class.

Loading this file also makes the kit's module_utils importable in ansible-playbook (the other
action plugins load it for that)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# ansible-playbook does not have the kit's folder on sys.path: module_utils/__init__.py, loaded
# by path as the kit's filters load it, makes ansible.module_utils.<stage> importable.
if "module_utils" not in sys.modules:
    _init = Path(__file__).resolve().parents[1] / "module_utils" / "__init__.py"
    _spec = importlib.util.spec_from_file_location(
        "module_utils", _init, submodule_search_locations=[str(_init.parent)]
    )
    sys.modules["module_utils"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["module_utils"])

from ansible.module_utils.host.in_process import run_in_process

# Each module run here, and where its spec and act() are.
TASKS = {
    "study_lock": "ansible.module_utils.plan.study_lock_task",
    "serving_render": "ansible.module_utils.plan.serving_render_task",
    "capacity_plan": "ansible.module_utils.plan.capacity_plan_task",
    "wheelhouse_pack": "ansible.module_utils.host.wheelhouse_pack_task",
    "autotune_step": "ansible.module_utils.autotune.step_task",
    "hub_repo_info": "ansible.module_utils.weights.hub_repo_info_task",
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars or {})
        name = self._task.action.rsplit(".", 1)[-1]
        if name not in TASKS:
            raise AnsibleActionFail(
                f"kit_in_process runs {', '.join(TASKS)} (as their own actions), not {name}"
            )
        task = importlib.import_module(TASKS[name])
        result.update(
            run_in_process(
                name,
                task.SPEC,
                self._task.args,
                task.act,
                self._task.check_mode,
                **getattr(task, "RULES", {}),
            )
        )
        return result
