# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""The benchmark_results module's controller side: the host packs a config's files in one
module run, and the archive is unpacked here, under dest, as outside input
(module_utils/benchmark/results_transfer.py). The archive never reaches the task's result."""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.plugins.loader import action_loader

# The kit's module_utils, importable in ansible-playbook once kit_in_process is loaded.
action_loader.get("kit_in_process", class_only=True)

from ansible.module_utils.benchmark import results_transfer  # noqa: E402


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("config_dir", "debug_dir", "patterns", "max_bytes", "dest"))

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        dest = args.pop("dest", None)
        if not isinstance(dest, str) or not dest:
            raise AnsibleActionFail("benchmark_results: dest (the controller folder) is required")
        try:
            max_bytes = int(args.get("max_bytes", 268435456))
        except (TypeError, ValueError):
            raise AnsibleActionFail("benchmark_results: max_bytes must be a number") from None
        packed = self._execute_module(
            module_name="benchmark_results", module_args=args, task_vars=task_vars
        )
        archive = packed.pop("archive", None)
        packed.pop("members", None)
        result.update(packed)
        if packed.get("failed"):
            return result
        try:
            unpacked = results_transfer.unpack(
                results_transfer.decode(archive, max_bytes),
                self._loader.path_dwim(dest),
                max_bytes,
                check_mode=self._task.check_mode,
            )
        except results_transfer.TransferError as error:
            raise AnsibleActionFail(f"benchmark_results: {error}") from None
        left_out = [*packed.get("left_out", []), *unpacked["left_out"]]
        if left_out:
            shown = "; ".join(
                f"{item.get('path') or item.get('name')} ({item.get('why')})"
                for item in left_out[:20]
            )
            result.setdefault("warnings", []).append(
                f"{len(left_out)} file(s) stayed on the host, not brought to {dest}: {shown}. "
                "Copy them by hand, or raise benchmark_fetch_max_bytes."
            )
        result.update(
            changed=bool(unpacked["written"]),
            files=unpacked["written"],
            unchanged=unpacked["unchanged"],
            left_out=left_out,
        )
        return result
