#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module wheelhouse_pack: a wheelhouse folder as one cached archive, on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: wheelhouse_pack
short_description: Packs a controller wheelhouse folder into one cached tar for the hosts
description:
  - Runs on the controller (delegated to localhost). Writes every regular file under
    O(src) into O(cache_dir)/wheelhouse-<key>.tar, the key taken from the folder's path and its
    files' names, sizes and modification times, unless that archive is already there; keeps
    the most recently used four archives. The logic is module_utils/host/wheelhouse.py.
  - The weights and runtime roles copy the archive to the hosts and unpack it there with
    C(wheelhouse_unpack), one transfer instead of one per wheel.
version_added: "0.1.0"
options:
  src:
    description: The wheelhouse folder.
    type: path
    required: true
  cache_dir:
    description: Where the archives are kept (created 0700).
    type: path
    required: true
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Pack the wheelhouse
  wheelhouse_pack:
    src: /srv/wheels
    cache_dir: "{{ kimi_controller_cache_dir }}"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
path:
  description: The archive.
  returned: success
  type: str
files:
  description: How many files it holds.
  returned: success
  type: int
pruned:
  description: Older archives removed from the cache.
  returned: success
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.in_process import run_as_module  # noqa: E402
from ansible.module_utils.host.wheelhouse_pack_task import SPEC, act  # noqa: E402


def main() -> None:
    run_as_module(AnsibleModule, SPEC, act)


if __name__ == "__main__":
    main()
