# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""controller_files: the kit's records on the controller (state/<host>/, results/<run>/)
written inside ansible-playbook's own worker, with the same checks, atomic writes, modes and
change reports as server_files on a host (module_utils/server/files.py). A folder and a file
each took a module run in a Python started for it (file, then copy's stat and copy) on the
controller; the records are written by every stage on every host."""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.plugins.loader import action_loader

# The kit's module_utils, importable in ansible-playbook once kit_in_process is loaded.
action_loader.get("kit_in_process", class_only=True)

from ansible.module_utils.server import files as kit_files  # noqa: E402


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
