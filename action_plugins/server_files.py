# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""The server_files module's controller side: each entry's template (the role's templates/)
is rendered and each src (the role's files/) read here, as ansible.builtin.template and
ansible.builtin.copy do, and the whole list goes to the host in one module run. A secret
entry's content travels in secret_contents, which the module never returns or logs."""

from __future__ import annotations

import os

from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.plugins.action import ActionBase
from ansible.template import trust_as_template

# What the server role writes: a template or file bigger than this is not one of its own.
MAX_SOURCE_BYTES = 1 << 20


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("files", "secret_contents"))

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        entries = self._task.args.get("files") or []
        secret_contents = dict(self._task.args.get("secret_contents") or {})
        if not isinstance(entries, list):
            raise AnsibleActionFail(
                f"server_files: files must be a list of entries, found {type(entries).__name__}"
            )
        files = []
        for entry in entries:
            if not isinstance(entry, dict):
                raise AnsibleActionFail(
                    f"server_files: each entry must be a mapping, found {type(entry).__name__}"
                )
            entry = dict(entry)
            template, src = entry.pop("template", None), entry.pop("src", None)
            if template is not None and src is not None:
                raise AnsibleActionFail(
                    f"server_files: {entry.get('path')} has both a template and a src; give one"
                )
            if template is not None or src is not None:
                if entry.get("content") is not None:
                    raise AnsibleActionFail(
                        f"server_files: {entry.get('path')} has content and a "
                        f"{'template' if template is not None else 'src'}; give one"
                    )
                content = self._render(template, task_vars) if template else self._read(src)
                if entry.get("secret"):
                    secret_contents[entry.get("path")] = content
                else:
                    entry["content"] = content
            files.append(entry)
        result.update(
            self._execute_module(
                module_name="server_files",
                module_args={"files": files, "secret_contents": secret_contents},
                task_vars=task_vars,
            )
        )
        return result

    def _source(self, folder: str, name: str) -> str:
        try:
            path = self._find_needle(folder, name)
        except AnsibleError as error:
            raise AnsibleActionFail(f"server_files: {error}") from error
        if os.path.getsize(path) > MAX_SOURCE_BYTES:
            raise AnsibleActionFail(
                f"server_files: {path} is over {MAX_SOURCE_BYTES} bytes; the server's files are "
                "kilobytes"
            )
        return path

    def _read(self, name: str) -> str:
        return self._loader.get_text_file_contents(self._source("files", name))

    def _render(self, name: str, task_vars: dict) -> str:
        """As ansible.builtin.template renders (its defaults: trim_blocks, newline \\n), from the
        task's variables, with the role's template folders as the search path of includes."""
        path = self._source("templates", name)
        searchpath = []
        for folder in [
            *task_vars.get("ansible_search_path", []),
            self._loader._basedir,
            os.path.dirname(path),
        ]:
            searchpath += [os.path.join(folder, "templates"), folder]
        templar = self._templar.copy_with_new_env(
            searchpath=searchpath, available_variables=task_vars
        )
        try:
            rendered = templar.template(
                trust_as_template(self._loader.get_text_file_contents(path)),
                escape_backslashes=False,
            )
        except AnsibleError as error:
            raise AnsibleActionFail(f"server_files: rendering {name}: {error}") from error
        return "" if rendered is None else rendered
