#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module weights_check: is a repository complete and intact on disk?"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: weights_check
short_description: Compare a downloaded repository with the hub's file list and the manifest
description:
  - Files whose size and modification time match a manifest entry of the same revision are
    trusted without hashing, so an intact repository is confirmed in seconds; any other file
    is hashed (C(full)) or size-checked (C(size)).
  - Refuses a file list whose paths are unsafe (absolute, C(..) components, resolving outside
    I(local_dir) through a symlink, ...) or whose fields are malformed, naming the entry and the
    hub (C(HF_ENDPOINT)), repository and revision it came from; nothing is read then.
  - Reports missing files and wrong ones (size or checksum) and never touches the weights.
    When every file is right and some had to be hashed (weights put there by hand, a lost
    manifest), it writes the manifest and reports changed, so the next run hashes nothing.
    Supports check mode (then it writes nothing).
version_added: "0.1.0"
extends_documentation_fragment:
  - kimi_weights_repository
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check the target on disk
  weights_check:
    local_dir: /opt/kimi/weights/moonshotai/Kimi-K2.6
    repo_id: moonshotai/Kimi-K2.6
    revision: 0123456789abcdef0123456789abcdef01234567
    files: "{{ hub.repos.target.files }}"
  register: on_disk
"""

RETURN = r"""
manifest_refreshed:
  description: The manifest was written with the files this check verified.
  returned: always
  type: bool
complete:
  description: Every file present and verified.
  returned: always
  type: bool
missing:
  description: Files not on disk.
  returned: always
  type: list
  elements: str
stale:
  description: Files on disk with the wrong size or checksum, with the reason.
  returned: always
  type: list
  elements: dict
bytes_missing:
  description: Bytes of the missing and wrong files.
  returned: always
  type: int
hashed:
  description: Files hashed by this check (0 when the manifest vouched for all).
  returned: always
  type: int
"""

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.weights.manifest import (  # noqa: E402
    REPOSITORY_OPTIONS,
    UnsafeListing,
    check_listing,
    hub_endpoint,
    inspect_files,
    write_manifest,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=REPOSITORY_OPTIONS,
        supports_check_mode=True,
    )
    p = module.params
    try:
        check_listing(p["local_dir"], p["files"], hub_endpoint(), p["repo_id"], p["revision"])
    except UnsafeListing as unsafe:
        module.fail_json(msg=str(unsafe))
    sizes = {f["path"]: f.get("size") or 0 for f in p["files"]}
    found = inspect_files(
        p["local_dir"],
        p["files"],
        p["revision"],
        "full" if p["rehash"] else p["verify"],
        p["hash_workers"] or os.cpu_count() or 1,
        force_hash=p["rehash"],
    )
    wrong = found["missing"] + [s["path"] for s in found["stale"]]
    # Files just hashed go into the manifest, so the next run need not read them again.
    refreshed = bool(found["hashed"]) and not wrong and not module.check_mode
    if refreshed:
        write_manifest(p["local_dir"], p["repo_id"], p["revision"], p["verify"], found["good"])
    module.exit_json(
        changed=refreshed,
        manifest_refreshed=refreshed,
        complete=not wrong,
        missing=found["missing"],
        stale=found["stale"],
        bytes_missing=sum(sizes[name] for name in wrong),
        hashed=found["hashed"],
    )


if __name__ == "__main__":
    main()
