# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""controller_files: the kit's records on the controller (state/<host>/, results/<run>/)
written inside ansible-playbook's own worker, with the same checks, atomic writes, modes and
change reports as server_files on a host (module_utils/server/files.py). A folder and a file
each took a module run in a Python started for it (file, then copy's stat and copy) on the
controller; the records are written by every stage on every host."""

from __future__ import annotations

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

from ansible.module_utils.server import files as kit_files


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("files",))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars or {})
        entries = self._task.args.get("files")
        if not isinstance(entries, list) or not entries:
            raise AnsibleActionFail("controller_files: files must be a non-empty list of entries")
        for entry in entries:
            if isinstance(entry, dict) and ({"secret", "template", "src"} & set(entry)):
                raise AnsibleActionFail(
                    f"controller_files: {entry.get('path')}: the controller's records take "
                    "content, never a secret, template or src (render with a lookup)"
                )
        try:
            done = kit_files.apply(
                kit_files.with_parents(kit_files.check_entries([dict(e) for e in entries])),
                check_mode=self._task.check_mode,
                diff=self._task.diff,
            )
        except kit_files.FilesError as error:
            raise AnsibleActionFail(f"controller_files: {error}") from None
        result.update(changed=done["changed"], changed_paths=done["changed_paths"])
        if self._task.diff and done["diff"]:
            result["diff"] = done["diff"]
        return result
