#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module runtime_version: versioned runtime folders and the link to the active one."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: runtime_version
short_description: Versioned runtime venvs, the symlink to the active one, and rolling back
description:
  - Each build of a runtime kind lives in O(versions_dir)/<kind>-<id>, the id a short sha256
    over O(inputs) (what builds it), and O(link) (the configured venv path) is a symlink to the
    active one. The logic is module_utils/runtime/versions.py.
  - O(action=plan) names the folder O(inputs) build, whether it is built, the active version,
    the history of activations and the rollback target. Read-only.
  - O(action=switch) points O(link) at version O(name) (or the version folder O(path))
    atomically, records the activation in O(state_dir)/versions.json and removes versions
    beyond O(keep) (never the active one, the rollback target, or an unversioned one). A real
    venv found at O(link) (a host deployed before versions) is first moved under
    O(versions_dir) as <kind>-unversioned and recorded, so that it is the rollback target.
  - O(action=rollback) switches to the most recently activated version other than the one
    O(inputs) build; it fails, naming O(host), when there is none.
  - O(action=recorded) reads the launch record O(path) (the server stage's launch.json,
    bounded) for the runtime version folder it names. Read-only.
  - Supports check mode (nothing is moved, linked, written or removed).
version_added: "0.1.0"
options:
  action:
    description: The step.
    type: str
    required: true
    choices: [plan, switch, rollback, recorded]
  kind:
    description: The runtime kind.
    type: str
    choices: [release, git]
    default: release
  link:
    description: The configured venv path, a symlink to the active version.
    type: path
  versions_dir:
    description: The folder of the versions.
    type: path
    required: true
  state_dir:
    description: The folder of C(versions.json), the history of activations.
    type: path
  inputs:
    description: >-
      What builds the version (O(action=plan), O(action=rollback)); its id is a sha256 over
      them.
    type: dict
  name:
    description: The version to switch to, C(<kind>-<id>) (O(action=switch)).
    type: str
  path:
    description: >-
      The version folder to switch to (O(action=switch)) instead of O(name), or the launch
      record to read (O(action=recorded)).
    type: path
  keep:
    description: Versions of the kind kept, the active one and the rollback target among them.
    type: int
    default: 2
  update_record:
    description: >-
      O(action=switch) also sets the kind's entry of O(state_dir)/runtime.json to the record
      the runtime stage left in the version's folder (C(kimi-runtime.json)), for a switch made
      outside the runtime stage.
    type: bool
    default: false
  require_target:
    description:
      - With O(action=rollback), fail when the kind has no version to go back to; false
        returns C(target) null instead (the role goes back where it can, kind by kind).
    type: bool
    default: true
  launch_record:
    description:
      - The running server's launch record (launch.json); the version it names is never pruned
        by O(action=switch) or O(action=rollback), whatever O(keep) says.
    type: path
  host:
    description: The host, as the failure of O(action=rollback) names it.
    type: str
    default: this host
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Switch the release runtime to the version just built
  runtime_version:
    action: switch
    kind: release
    link: /opt/kimi/venv
    versions_dir: /opt/kimi/runtimes
    state_dir: /opt/kimi/runtime
    name: release-0123456789ab
"""

RETURN = r"""
name:
  description: The version O(inputs) build (O(action=plan), O(action=rollback)).
  returned: when inputs are given
  type: str
dir:
  description: Its folder (O(action=plan)); the active version's (O(action=switch)).
  returned: success
  type: str
active:
  description: The active version's name (null when the link names none).
  returned: success
  type: str
previous:
  description: What was active before the switch.
  returned: switch, rollback
  type: str
migrated:
  description: The name a real venv found at O(link) was kept under.
  returned: switch, rollback
  type: str
removed:
  description: Versions removed beyond O(keep).
  returned: switch, rollback
  type: list
  elements: str
rollback_target:
  description: The version a rollback would go to.
  returned: plan, switch
  type: str
runtime_dir:
  description: The version folder the launch record names (O(action=recorded)), or null.
  returned: recorded
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.runtime import versions as rv  # noqa: E402

REQUIRED = {
    "plan": ("link", "state_dir", "inputs"),
    "switch": ("link", "state_dir"),
    "rollback": ("link", "state_dir", "inputs"),
    "recorded": ("path",),
}


def act(module: AnsibleModule) -> dict:
    p = module.params
    check = module.check_mode
    if p["action"] == "plan":
        return {"changed": False, **rv.plan(*locate(p), p["kind"], p["inputs"])}
    if p["action"] == "switch":
        if bool(p["name"]) == bool(p["path"]):
            raise rv.VersionError("switch needs one of name and path")
        name = p["name"] or rv.name_of(p["versions_dir"], p["path"], p["kind"])
        return rv.switch(
            *locate(p),
            p["kind"],
            name,
            p["keep"],
            check,
            update_record=p["update_record"],
            in_use=in_use(p),
        )
    if p["action"] == "rollback":
        result = rv.rollback(*locate(p), p["kind"], p["inputs"], p["keep"], check, in_use=in_use(p))
        if result["target"] is None and p["require_target"]:
            history = ", ".join(e["name"] for e in result["history"]) or "none"
            module.fail_json(
                msg=f"no previous runtime on {p['host']}: the {p['kind']} runtime has no version "
                f"activated before other than {result['name']}, the one this deploy's settings "
                f"build (activations: {history}). Fix: deploy without kimi_runtime_rollback; to "
                "go back to an older SGLang, set its version (or git ref) in the settings."
            )
        return result
    return {"changed": False, **rv.recorded_runtime(p["path"], p["versions_dir"], p["kind"])}


def in_use(p: dict) -> set[str]:
    """The version the running server's launch record names, kept from pruning."""
    if not p["launch_record"]:
        return set()
    return {rv.recorded_runtime(p["launch_record"], p["versions_dir"], p["kind"])["name"]} - {None}


def locate(p: dict) -> tuple[str, str, str]:
    return p["link"], p["versions_dir"], p["state_dir"]


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "action": {"type": "str", "required": True, "choices": list(REQUIRED)},
            "kind": {"type": "str", "choices": list(rv.KINDS), "default": "release"},
            "link": {"type": "path"},
            "versions_dir": {"type": "path", "required": True},
            "state_dir": {"type": "path"},
            "inputs": {"type": "dict"},
            "name": {"type": "str"},
            "path": {"type": "path"},
            "keep": {"type": "int", "default": 2},
            "host": {"type": "str", "default": "this host"},
            "require_target": {"type": "bool", "default": True},
            "update_record": {"type": "bool", "default": False},
            "launch_record": {"type": "path"},
        },
        required_if=[("action", action, needed) for action, needed in REQUIRED.items()],
        supports_check_mode=True,
    )
    try:
        result = act(module)
    except (rv.VersionError, OSError) as error:
        module.fail_json(msg=f"The {module.params['kind']} runtime's versions: {error}.")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
