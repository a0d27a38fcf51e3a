"""Options of the modules that work on one downloaded repository: which one, where, and how its
files are checked."""

from __future__ import annotations


class ModuleDocFragment:
    # weights_download and weights_check take the same repository and verification options
    # (module_utils/weights/manifest.py REPOSITORY_OPTIONS is their argument spec).
    DOCUMENTATION = r"""
options:
  repo_id:
    description: Repository id, owner/name; written into the manifest.
    type: str
    required: true
  revision:
    description: 40-character commit SHA the files must belong to.
    type: str
    required: true
  local_dir:
    description: Folder of the repository (the download goes into it).
    type: path
    required: true
  files:
    description: The hub's file list (path, size, sha256, blob_id) from hub_repo_info.
    type: list
    elements: dict
    required: true
  verify:
    description: C(full) hashes files the manifest does not vouch for; C(size) checks sizes only.
    type: str
    default: full
    choices: [full, size]
  rehash:
    description: Hash every file even when the manifest vouches for it.
    type: bool
    default: false
  hash_workers:
    description: Files hashed in parallel; 0 means one per CPU.
    type: int
    default: 0
"""
