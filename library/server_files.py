#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module server_files: the SGLang server's folders and files, written in one step."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: server_files
short_description: Write the SGLang server's folders, files, log file and removals in one step
description:
  - The server stage's files, the benchmark's per-config records (its folder, provenance and
    status) and the weights stage's folders on the host.
  - Brings each entry of O(files) about in order, so a folder made by one entry can hold the
    next one's file. The logic is module_utils/server/files.py.
  - C(state=file) writes O(files[].content) atomically. The new content goes into a temporary
    file in the same folder, created with mode 0600 and O_EXCL, and gets its final mode before
    it is renamed over the path. No reader sees a half-written file, or a secret under a wider
    mode than asked. A file whose content and mode already match is left alone.
  - C(state=directory) makes a folder (private until its mode is set), and each missing parent
    with the same mode and owners, as C(mkdir -p) does, or sets its mode.
    C(state=touch) makes an empty file private from its first byte, or sets the mode of an
    existing one and keeps its times (a log file). C(state=absent) removes a file, or with
    O(files[].recurse) a folder and everything in it.
  - O(files[].owner) and O(files[].group) name the user and group what is made belongs to,
    looked up on the host; left out, a new one belongs to whoever the module runs as.
  - The action plugin of the same name renders O(files[].template) (from the role's
    C(templates/)) and reads O(files[].src) (from its C(files/)) on the controller, as
    M(ansible.builtin.template) and M(ansible.builtin.copy) do, and hands the content on.
  - Supports check mode and diff mode (diffs leave secret entries out).
version_added: "0.1.0"
options:
  files:
    description: The entries, in order.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path, without C(.) or C(..) parts.
        type: str
        required: true
      state:
        description: What the path should be.
        type: str
        choices: [file, directory, touch, absent]
        default: file
      mode:
        description: Octal mode as a string (C('0644')); required unless O(files[].state=absent).
        type: raw
      content:
        description: The file's text (C(state=file)), unless O(files[].secret).
        type: str
      template:
        description:
          - A template of the role's C(templates/), rendered on the controller by the action
            plugin into O(files[].content) (or O(secret_contents)).
        type: str
      src:
        description:
          - A file of the role's C(files/), read on the controller by the action plugin into
            O(files[].content).
        type: str
      secret:
        description:
          - The content is secret; it comes from O(secret_contents) under the entry's path and
            is never returned, shown in a diff or logged.
        type: bool
        default: false
      owner:
        description: The user the folder or file belongs to (a name the host knows).
        type: str
      group:
        description: The group the folder or file belongs to (a name the host knows).
        type: str
      recurse:
        description: With C(state=absent), a folder is removed with everything in it.
        type: bool
        default: false
  secret_contents:
    description: The content of each secret entry, keyed by its path. Never logged.
    type: dict
    default: {}
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Write the server's files
  server_files:
    files:
      - {path: /etc/kimi, state: directory, mode: "0755"}
      - {path: /etc/kimi/kimi-sglang.env, template: server.env.j2, mode: "0600"}
      - {path: /etc/kimi/secrets.yml, secret: true, mode: "0600"}
    secret_contents:
      /etc/kimi/secrets.yml: "api_key: {{ api_key }}\n"
"""

RETURN = r"""
changed_paths:
  description: The paths changed (or, in check mode, that would change), in order.
  type: list
  elements: str
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.server import files as server_files  # noqa: E402

ENTRY = {
    "path": {"type": "str", "required": True},
    "state": {"type": "str", "choices": list(server_files.STATES), "default": "file"},
    "mode": {"type": "raw"},
    "content": {"type": "str"},
    "template": {"type": "str"},
    "src": {"type": "str"},
    "secret": {"type": "bool", "default": False},
    "owner": {"type": "str"},
    "group": {"type": "str"},
    "recurse": {"type": "bool", "default": False},
}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "list", "elements": "dict", "default": [], "options": ENTRY},
            "secret_contents": {"type": "dict", "default": {}, "no_log": True},
        },
        supports_check_mode=True,
    )
    try:
        entries = server_files.check_entries(
            module.params["files"], module.params["secret_contents"]
        )
        entries = server_files.with_parents(entries)
        result = server_files.apply(entries, module.check_mode, module._diff)
    except server_files.FilesError as error:
        module.fail_json(msg=f"The server's files: {error}.")
    output = {"changed": result["changed"], "changed_paths": result["changed_paths"]}
    if module._diff:
        output["diff"] = result["diff"]
    module.exit_json(**output)


if __name__ == "__main__":
    main()
