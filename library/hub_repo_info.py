#!/usr/bin/python
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
    missing_token, no_access, invalid_token, not_found, revision_not_found, unreachable)
    and a message, so a later task can report every problem at once.
  - Needs huggingface_hub on the machine that runs it (the controller's pinned environment);
    honours HF_ENDPOINT. Read-only; supports check mode.
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
    description: Seconds per hub request.
    type: float
    default: 20
author:
  - kimi-deploy-kit maintainers
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

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule, missing_required_lib  # noqa: E402

try:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    HAS_HUB = True
except ImportError:
    HAS_HUB = False


def repo_page(endpoint: str, repo_id: str) -> str:
    return f"{endpoint.rstrip('/')}/{repo_id}"


def classify(error: Exception, repo_id: str, revision: str, endpoint: str, has_token: bool):
    """(access verdict, message) for an exception from the hub client."""
    page = repo_page(endpoint, repo_id)
    if isinstance(error, GatedRepoError):
        if not has_token:
            return "missing_token", (
                f"{repo_id} is gated and no Hugging Face token was given. Needed: a token of an "
                f"account with approved access. Fix: request access on {page}, then export "
                "HF_TOKEN or set kimi_hf_token (ansible-vault)."
            )
        return "no_access", (
            f"{repo_id} is gated and the token's account has no approved access. Needed: "
            f"approval on {page}. Fix: request access there (log in with the token's account) "
            "and rerun once it is granted."
        )
    if isinstance(error, RevisionNotFoundError):
        return "revision_not_found", (
            f"revision {revision!r} does not exist in {repo_id}. Needed: an existing branch, "
            f"tag or 40-character commit SHA. Fix: pick one from {page}/commits/main and set "
            "the repository's revision variable."
        )
    if isinstance(error, RepositoryNotFoundError):
        return "not_found", (
            f"{repo_id} was not found (or is private to another account). Needed: an existing "
            "repository id. Fix: check the spelling of the repository variable."
        )
    if isinstance(error, HfHubHTTPError) and getattr(error, "response", None) is not None:
        if error.response.status_code == 401:
            return "invalid_token", (
                "the Hugging Face token was rejected as invalid (401). Needed: a valid token. "
                "Fix: create a read token at https://huggingface.co/settings/tokens and export "
                "HF_TOKEN or set kimi_hf_token."
            )
        return "unreachable", f"the hub answered {error.response.status_code} for {repo_id}"
    return "unreachable", (
        f"the hub at {endpoint} could not be reached ({type(error).__name__}). Needed: "
        "network access to the hub from the controller. Fix: check proxy settings or "
        "HF_ENDPOINT."
    )


def inspect(api, repo: dict, token: str | bool, endpoint: str) -> dict:
    has_token = bool(token)
    record = {
        "repo_id": repo["repo_id"],
        "revision": repo["revision"],
        "sha": None,
        "gated": None,
        "access": "ok",
        "message": None,
        "files": [],
        "total_bytes": None,
    }
    try:
        info = api.model_info(
            repo["repo_id"], revision=repo["revision"], files_metadata=True, token=token
        )
        record["sha"] = info.sha
        record["gated"] = bool(info.gated)
        files = []
        for sibling in info.siblings or []:
            lfs = getattr(sibling, "lfs", None)
            files.append(
                {
                    "path": sibling.rfilename,
                    "size": sibling.size,
                    "sha256": lfs.sha256 if lfs else None,
                    "blob_id": getattr(sibling, "blob_id", None),
                }
            )
        record["files"] = files
        record["total_bytes"] = sum(f["size"] or 0 for f in files)
        api.auth_check(repo["repo_id"], token=token)
    except Exception as error:
        record["access"], record["message"] = classify(
            error, repo["repo_id"], repo["revision"], endpoint, has_token
        )
    return record


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "repos": {"type": "dict", "required": True},
            "token": {"type": "str", "default": "", "no_log": True},
            "endpoint": {"type": "str"},
            "timeout": {"type": "float", "default": 20},
        },
        supports_check_mode=True,
    )
    if not HAS_HUB:
        module.fail_json(msg=missing_required_lib("huggingface_hub"))
    endpoint = (
        module.params["endpoint"] or os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    )
    os.environ["HF_HUB_ETAG_TIMEOUT"] = str(module.params["timeout"])
    api = HfApi(endpoint=endpoint)
    # False, not None: never fall back to a token cached on the controller.
    token = module.params["token"] or False
    repos = {}
    for name, spec in module.params["repos"].items():
        if not isinstance(spec, dict) or not spec.get("repo_id"):
            module.fail_json(msg=f"repos.{name} needs a repo_id (owner/name); got {spec!r}")
        repo = {"repo_id": spec["repo_id"], "revision": str(spec.get("revision") or "main")}
        repos[name] = inspect(api, repo, token, endpoint)
    reachable = any(r["access"] != "unreachable" for r in repos.values())
    module.exit_json(changed=False, reachable=reachable, endpoint=endpoint, repos=repos)


if __name__ == "__main__":
    main()
