#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module hub_repo_info: access, pinned commit and file list of Hugging Face repos."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hub_repo_info
short_description: Check access to Hugging Face model repos and list their files at a pinned commit
description:
  - For each repository, resolves the revision (a branch, tag or commit) to its 40-character
    commit SHA, lists its files with size and LFS sha256, tells whether it is gated, and runs
    C(auth_check) with the token.
  - Never fails for an access problem; each repository gets an C(access) verdict (ok,
    missing_token, no_access, invalid_token, not_found, revision_not_found, unreachable,
    unsafe_listing) and a message, so a later task can report every problem at once.
  - C(unsafe_listing) - the hub listed a file path that is not a plain relative path
    (absolute, C(..) or empty components, backslashes, NUL, the kit's own files) or a malformed
    size or hash; the message names the entry, the hub, the repository and the revision, and
    no files are returned.
  - Every hub call has a connect and read timeout (I(timeout)) and all of them together end
    by I(deadline); answers 429 and 5xx are retried with backoff, Retry-After honoured when it
    fits. A hub that does not answer in time gives C(unreachable) with a message naming it.
  - Needs huggingface_hub on the machine that runs it (the controller's pinned environment);
    honours HF_ENDPOINT. Read-only; supports check mode.
  - Its action plugin runs it inside ansible-playbook's worker on the controller
    (module_utils/weights/hub_repo_info_task.py), not as a Python of its own.
version_added: "0.1.0"
options:
  repos:
    description: >-
      Repositories to check, keyed by what each is for (target, dflash, eagle3); each value
      has repo_id (owner/name) and revision (branch, tag or 40-character commit SHA, default main).
    type: dict
    required: true
  token:
    description: Hugging Face token; empty for none. Never returned or logged.
    type: str
    default: ""
  endpoint:
    description: Hub address; defaults to HF_ENDPOINT or the public hub.
    type: str
  timeout:
    description: Connect and read timeout of each hub request, in seconds.
    type: float
    default: 20
  deadline:
    description: >-
      Seconds all the hub calls of this query may take together, retries included; the module
      returns by then.
    type: float
    default: 120
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check hub access for the target and the DFlash drafter
  hub_repo_info:
    repos:
      target: {repo_id: moonshotai/Kimi-K2.6, revision: main}
      dflash: {repo_id: z-lab/Kimi-K2.6-DFlash, revision: main}
    token: "{{ kimi_hf_token }}"
  delegate_to: localhost
  no_log: true
  register: hub
"""

RETURN = r"""
reachable:
  description: Whether the hub answered at all.
  returned: always
  type: bool
endpoint:
  description: The hub address that was asked.
  returned: always
  type: str
repos:
  description: Per repository name, the verdict and what the hub said.
  returned: always
  type: dict
  sample:
    target:
      repo_id: moonshotai/Kimi-K2.6
      revision: main
      sha: 0123456789abcdef0123456789abcdef01234567
      gated: false
      access: ok
      message: null
      files: [{path: config.json, size: 3000, sha256: null, blob_id: 4a5c...}]
      total_bytes: 595169411072
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.in_process import run_as_module  # noqa: E402
from ansible.module_utils.weights.hub_repo_info_task import SPEC, act  # noqa: E402


def main() -> None:
    run_as_module(AnsibleModule, SPEC, act)


if __name__ == "__main__":
    main()
