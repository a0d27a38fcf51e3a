#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module weights_download: resumable, watched, verified download of one hub repo."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: weights_download
short_description: Download one Hugging Face repo at a pinned commit, watch it, verify it
description:
  - Meant to run under C(async); poll its progress with C(weights_status).
  - Checks what is already on disk against the hub's file list (and the manifest of a
    previous run), deletes only files of the repository that are wrong, then runs
    C(snapshot_download) from I(python) (a venv holding huggingface_hub) in a child process,
    or, with xet off, a plain parallel HTTP transfer from the hub's /resolve/ endpoint that
    resumes inside partly downloaded files.
  - A watchdog restarts the child when the bytes on disk stop growing for I(stall_timeout)
    seconds (bounded by I(max_restarts)); from the first restart on, xet transfers can be
    turned off (I(xet_fallback)). After the last restart it fails naming the incomplete files.
  - Verifies every file (sizes always; sha256 of LFS files and git blob ids of small files
    in C(full) mode, hashing in parallel) and writes a manifest beside the weights.
  - The token (in I(hf_token_file)) reaches the download process only through its
    environment.
  - Fails with the free space and the bytes still needed when the disk fills; what was
    verified before stays on disk and in the manifest.
  - Refuses, before anything is written, a file list with an unsafe path (absolute, C(..)
    components, backslashes, NUL, the kit's own files, or resolving outside I(local_dir)
    through a symlink), naming the entry and the hub (C(HF_ENDPOINT)), repository and revision.
  - Each request of the download has a deadline (connect and read, 120 s, behind the
    watchdog); answers 429 and 5xx are retried with backoff, Retry-After honoured, within half
    of I(stall_timeout).
version_added: "0.1.0"
options:
  hf_token_file:
    description: >-
      File on the host holding the Hugging Face token for gated repositories (mode 0600; the
      weights role writes it for the download and removes it after). The token is read here
      and handed to the download process in its environment only, so it is never part of the
      module's arguments, a command line or the result.
    type: path
  python:
    description: Python with huggingface_hub installed.
    type: path
    required: true
  status_file:
    description: Where progress is written for weights_status.
    type: path
    required: true
  log_file:
    description: The child's output and the watchdog's log.
    type: path
    required: true
  stall_timeout:
    description: Seconds without new bytes before a restart.
    type: int
    default: 300
  max_restarts:
    description: Restarts before giving up.
    type: int
    default: 5
  xet_fallback:
    description: >-
      From the first restart on, download over plain HTTP with in-file resume instead of
      huggingface_hub's xet transfer (which has stalled on huge repos). With
      HF_HUB_DISABLE_XET=1 in the environment, plain HTTP is used from the start.
    type: bool
    default: true
  max_workers:
    description: Files downloaded in parallel.
    type: int
    default: 8
  poll_interval:
    description: Seconds between progress updates.
    type: float
    default: 1.0
extends_documentation_fragment:
  - kimi_weights_repository
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Download the target (in the background)
  weights_download:
    repo_id: moonshotai/Kimi-K2.6
    revision: 0123456789abcdef0123456789abcdef01234567
    local_dir: /opt/kimi/weights/moonshotai/Kimi-K2.6
    files: "{{ hub.repos.target.files }}"
    python: /opt/kimi/tools-venv/bin/python
    status_file: /opt/kimi/weights/.kimi/moonshotai--Kimi-K2.6/status.json
    log_file: /opt/kimi/weights/.kimi/moonshotai--Kimi-K2.6/download.log
    hf_token_file: /opt/kimi/weights/.kimi/hf-token
  async: 86400
  poll: 0
  no_log: true
"""

RETURN = r"""
manifest:
  description: Path of the manifest written beside the weights.
  returned: success
  type: str
files_total:
  description: Files in the repository.
  returned: success
  type: int
bytes_total:
  description: Bytes in the repository.
  returned: success
  type: int
bytes_downloaded:
  description: Bytes fetched by this run.
  returned: success
  type: int
download_seconds:
  description: >-
    Wall time of the transfer, summed over every download of this run: from starting the
    download process to noticing that it exited, its start-up, restarts and stalls included.
    The checks before and the verification after are not in it (see I(hash_seconds)).
  returned: success
  type: float
transfers:
  description: >-
    The transfer of each download process started, in order: C(hub) (huggingface_hub's own)
    or C(http) (the kit's plain HTTP with in-file resume).
  returned: success
  type: list
  elements: str
hashed_bytes:
  description: Bytes hashed by the final verification.
  returned: success
  type: int
hash_seconds:
  description: Time the final verification took.
  returned: success
  type: float
hash_workers:
  description: Files hashed in parallel.
  returned: success
  type: int
restarts:
  description: Watchdog restarts.
  returned: always
  type: int
repaired:
  description: Files that were on disk but wrong, and were fetched again.
  returned: success
  type: list
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.weights.manifest import REPOSITORY_OPTIONS  # noqa: E402
from ansible.module_utils.weights.transfer import Download, Failure  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            **REPOSITORY_OPTIONS,
            "python": {"type": "path", "required": True},
            "hf_token_file": {"type": "path"},
            "status_file": {"type": "path", "required": True},
            "log_file": {"type": "path", "required": True},
            "stall_timeout": {"type": "int", "default": 300},
            "max_restarts": {"type": "int", "default": 5},
            "xet_fallback": {"type": "bool", "default": True},
            "max_workers": {"type": "int", "default": 8},
            "poll_interval": {"type": "float", "default": 1.0},
        },
    )
    download = Download(module.params)
    try:
        result = download.run()
    except Failure as failure:
        download.fail(failure)
        module.fail_json(msg=str(failure), restarts=download.restarts)
    except Exception as error:
        download.fail(error)
        raise
    module.exit_json(changed=True, **result)


if __name__ == "__main__":
    main()
