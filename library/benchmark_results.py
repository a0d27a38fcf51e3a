#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module benchmark_results: one serving config's results and debug files, packed."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: benchmark_results
short_description: Bring one serving config's level, status and debug files to the controller
description:
  - On the host, packs into one archive the regular files under O(config_dir) (at any depth)
    whose names match O(patterns), as C(results/<path below config_dir>), and the regular files
    directly in O(debug_dir), as C(debug/<name>). Links and anything else that is not a regular
    file are never followed or sent. The logic is module_utils/benchmark/results_transfer.py.
  - The action plugin of the same name runs this module and unpacks the archive on the
    controller into O(dest), where C(ansible.builtin.fetch) of each file used to put them
    (C(results/X) as C(dest/X), C(debug/X) as C(dest/debug/X)). It reads the archive as outside
    input (only member names of that shape, only regular files, at most O(max_bytes) in all),
    writes each file atomically and leaves a file alone when its bytes already match.
  - A file that does not fit under O(max_bytes) stays on the host, and the result names it in
    RV(left_out) with the reason. Nothing on the host is changed.
  - Supports check mode (the controller's files are compared, not written).
version_added: "0.1.0"
options:
  config_dir:
    description: The config's results folder on the host; absent means no results to send.
    type: path
    required: true
  debug_dir:
    description: The config's debug folder on the host; empty or absent sends no debug files.
    type: path
    default: ""
  patterns:
    description: Shell patterns of the result file names to send.
    type: list
    elements: str
    default: ["c*.json", "r*.json", "status.json", "api-check.json"]
  max_bytes:
    description: The most bytes of file content to send for the config.
    type: int
    default: 268435456
  dest:
    description: The controller folder the files land in (used by the action plugin only).
    type: path
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Bring the config's results and debug files to the controller
  benchmark_results:
    config_dir: /var/lib/kimi/benchmarks/run-1/dflash
    debug_dir: /var/lib/kimi/benchmarks/run-1/debug/dflash
    dest: results/run-1/ct200-a/dflash
"""

RETURN = r"""
files:
  description: The files written on the controller (or, in check mode, that would be), relative
    to O(dest).
  returned: success
  type: list
  elements: str
unchanged:
  description: The files the controller already held with the same bytes.
  returned: success
  type: list
  elements: str
left_out:
  description: What was not brought over, each with C(path) (on the host) or C(name) (the
    archive member) and C(why).
  returned: success
  type: list
  elements: dict
members:
  description: What the host packed, each with C(name) and C(bytes) (the module's own result,
    which the action plugin replaces with RV(files)).
  returned: success
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.benchmark import results_transfer  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "config_dir": {"type": "path", "required": True},
            "debug_dir": {"type": "path", "default": ""},
            "patterns": {
                "type": "list",
                "elements": "str",
                "default": list(results_transfer.PATTERNS),
            },
            "max_bytes": {"type": "int", "default": 268435456},
            "dest": {"type": "path"},
        },
        supports_check_mode=True,
    )
    if module.params["max_bytes"] < 1:
        module.fail_json(msg="benchmark_results: max_bytes must be 1 or more.")
    packed = results_transfer.pack(
        module.params["config_dir"],
        module.params["debug_dir"],
        module.params["patterns"],
        module.params["max_bytes"],
    )
    module.exit_json(changed=False, **packed)


if __name__ == "__main__":
    main()
