#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module wheelhouse_unpack: a wheelhouse archive written into its folder on the host."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: wheelhouse_unpack
short_description: Unpacks a wheelhouse archive on the host, writing only what differs
description:
  - Writes each member of O(archive) (a tar of regular files, as C(wheelhouse_pack) makes)
    into O(dest) when its bytes or mode differ there, each file atomically; files in O(dest)
    that the archive lacks stay. A member named outside O(dest), a link, a device or an
    archive past the bounds fails the task and writes nothing more.
  - Records what it wrote in O(dest)/.kimi-wheelhouse.json, so that a run with the same
    archive and untouched files reads no bytes and reports no change.
  - Supports check mode. The logic is module_utils/host/wheelhouse.py.
version_added: "0.1.0"
options:
  archive:
    description: The archive on the host.
    type: path
    required: true
  dest:
    description: The wheelhouse folder on the host.
    type: path
    required: true
  mode:
    description: Mode of the files written.
    type: raw
    default: "0644"
  directory_mode:
    description: Mode of the folders created.
    type: raw
    default: "0755"
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Unpack the wheelhouse
  wheelhouse_unpack:
    archive: /opt/kimi/runtime/wheelhouse.tar
    dest: /opt/kimi/runtime/wheelhouse
"""

RETURN = r"""
written:
  description: The members written (or, in check mode, that would be).
  returned: success
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host import wheelhouse  # noqa: E402


def octal(value, name: str) -> int:
    # YAML reads an unquoted 0644 as the number 420 already.
    text = str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        mode = value
    else:
        try:
            mode = int(text, 8)
        except ValueError:
            mode = -1
    if not 0 <= mode <= 0o7777:
        raise wheelhouse.WheelhouseError(f"{name} {text!r} is not an octal file mode like 0644")
    return mode


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "archive": {"type": "path", "required": True},
            "dest": {"type": "path", "required": True},
            "mode": {"type": "raw", "default": "0644"},
            "directory_mode": {"type": "raw", "default": "0755"},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        result = wheelhouse.unpack(
            p["archive"],
            p["dest"],
            octal(p["mode"], "mode"),
            octal(p["directory_mode"], "directory_mode"),
            check=module.check_mode,
        )
    except (wheelhouse.WheelhouseError, OSError) as error:
        module.fail_json(msg=f"Unpacking the wheelhouse into {p['dest']}: {error}.")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
