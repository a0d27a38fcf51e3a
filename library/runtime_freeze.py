#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module runtime_freeze: the runtime role's frozen-runtime steps on a host."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: runtime_freeze
short_description: Record and reinstall a runtime venv's exact package set (the study lock's)
description:
  - The runtime role's steps for the study lock's C(runtime.<kind>) entry; the logic is
    module_utils/runtime/freeze.py.
  - O(action=merge_report) merges the pip C(--report) file O(report) into the host's hash
    record O(hashes) (name to version to sha256) and removes the report. A missing report (pip
    did not run) leaves the record as it is. Changed only when the record changed.
  - O(action=record) builds the lock record of an installed set - O(packages) with the sha256
    the hash record has for each installed version, C(hashes) complete, partial or none,
    O(python_version), O(built_from), O(recorded_from) and the platform (driver and its CUDA
    version from C(nvidia-smi -q); null without nvidia-smi). Read-only.
  - O(action=frozen) writes O(dest), the requirements file of the lock's O(lock_packages) -
    with C(--hash) per line when every package has one - and says which. Changed when the file
    changed.
  - O(action=compare) returns the drift between O(packages) and O(lock_packages), and warns
    with it when O(warn) is set. Read-only.
  - Supports check mode (nothing is written or removed).
version_added: "0.1.0"
options:
  action:
    description: The step.
    type: str
    required: true
    choices: [merge_report, record, frozen, compare]
  kind:
    description: The runtime kind; for C(git), sglang itself is not part of the set.
    type: str
    choices: [release, git]
    default: release
  report:
    description: pip's C(--report) file (O(action=merge_report)).
    type: path
  hashes:
    description: The host's hash record (O(action=merge_report) and O(action=record)).
    type: path
  packages:
    description: The installed set, name to version (runtime_check's C(packages)).
    type: dict
  lock_packages:
    description: The lock's C(runtime.<kind>.packages).
    type: dict
  python_version:
    description: The venv's Python version (O(action=record)).
    type: str
  built_from:
    description: What the set was built from (O(action=record)).
    type: dict
  recorded_from:
    description: The host the record comes from (O(action=record)).
    type: str
  machine:
    description: >-
      The host's machine architecture (C(platform.machine()), O(action=record)): wheels and
      their hashes hold for one.
    type: str
  nvidia_smi_path:
    description: nvidia-smi, asked for C(-q) (O(action=record)).
    type: str
    default: nvidia-smi
  dest:
    description: The requirements file to write (O(action=frozen)).
    type: path
  warn:
    description: Warn with the drift (O(action=compare)).
    type: bool
    default: false
  timeout:
    description: Seconds C(nvidia-smi -q) may take; then it is killed and the platform is null.
    type: float
    default: 60
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Merge the hashes pip reported
  runtime_freeze:
    action: merge_report
    report: /opt/kimi/runtime/release-pip-report.json
    hashes: /opt/kimi/runtime/release-hashes.json
"""

RETURN = r"""
record:
  description: The lock record (O(action=record)).
  returned: when action is record
  type: dict
require_hashes:
  description: Whether O(dest) carries a hash per package (O(action=frozen)).
  returned: when action is frozen
  type: bool
message:
  description: How the set is installed (O(action=frozen)).
  returned: when action is frozen
  type: str
drift:
  description: Each package that differs, as C(name), C(locked) and C(installed).
  returned: when action is compare
  type: list
  elements: dict
drift_report:
  description: The drift in one line.
  returned: when action is compare
  type: str
"""

import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.helpers import (  # noqa: E402
    CommandFailed,
    TooLarge,
    atomic_write,
    module_runner,
)
from ansible.module_utils.host.helpers import read_bounded as host_read_bounded  # noqa: E402
from ansible.module_utils.runtime import freeze as rf  # noqa: E402


def read_bounded(path: str, limit: int) -> bytes | None:
    """The file's bytes, None when it does not exist; FreezeError past `limit`."""
    try:
        return host_read_bounded(path, limit)
    except TooLarge as exc:
        raise rf.FreezeError(str(exc)) from None
    except OSError as exc:
        raise rf.FreezeError(f"{path} cannot be read: {exc}") from None


def read_hash_record(path: str) -> dict:
    """The host's hash record; an unreadable one counts as empty (the next installs refill
    it), the well-formed entries of a damaged one are kept."""
    try:
        data = read_bounded(path, rf.MAX_RECORD_BYTES)
        return rf.clean_hash_record(json.loads(data)) if data else {}
    except (rf.FreezeError, ValueError, RecursionError):
        return {}


def merge_report(module: AnsibleModule) -> None:
    p = module.params
    try:
        data = read_bounded(p["report"], rf.MAX_REPORT_BYTES)
        if data is None:
            module.exit_json(changed=False, merged=0, msg=f"no pip report at {p['report']}")
        found = rf.parse_report(data)
    except rf.FreezeError as exc:
        module.fail_json(msg=f"pip's report {p['report']} is unusable: {exc}.")
    before = read_hash_record(p["hashes"])
    after = rf.merge_hashes(before, found)
    changed = after != before
    if not module.check_mode:
        if changed:
            atomic_write(p["hashes"], json.dumps(after, indent=1, sort_keys=True) + "\n")
        # Merged: a stale report would otherwise be merged again by a run that skipped pip.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p["report"])
    module.exit_json(changed=changed, merged=sum(len(v) for v in found.values()))


def record(module: AnsibleModule) -> None:
    p = module.params
    run = module_runner(module, "runtime_freeze", "nvidia-smi -q", 60)
    try:
        rc, out, _err = run([p["nvidia_smi_path"], "-q"])
    except CommandFailed as exc:
        module.warn(f"{exc} The lock records the driver as unknown.")
        rc, out = 1, ""
    platform = rf.parse_nvidia_smi_query(out if rc == 0 else "")
    try:
        packages, hashes = rf.lock_packages(
            p["packages"] or {}, read_hash_record(p["hashes"]), p["kind"]
        )
    except rf.FreezeError as exc:
        module.fail_json(msg=f"The installed set cannot be recorded: {exc}.")
    module.exit_json(
        changed=False,
        record={
            "built_from": p["built_from"],
            "python": p["python_version"],
            "platform": {**platform, "machine": p["machine"] or None},
            "recorded_from": p["recorded_from"],
            "hashes": hashes,
            "packages": packages,
        },
    )


def frozen(module: AnsibleModule) -> None:
    p = module.params
    try:
        text, hashed = rf.frozen_requirements(p["lock_packages"], p["kind"])
    except rf.FreezeError as exc:
        module.fail_json(
            msg=f"The study lock's runtime.{p['kind']} cannot be installed: {exc}. Fix: relock "
            "with plan.yml -e kimi_lock_update=true (the next deploy records the set anew)."
        )
    try:
        current = read_bounded(p["dest"], rf.MAX_REPORT_BYTES)
    except rf.FreezeError:
        current = None
    changed = current != text.encode()
    if changed and not module.check_mode:
        atomic_write(p["dest"], text)
    count = len(text.splitlines())
    how = (
        "with --require-hashes (the lock has a sha256 for every package)"
        if hashed
        else "by version only, without --require-hashes (pip gave no sha256 for some packages)"
    )
    module.exit_json(
        changed=changed,
        path=p["dest"],
        require_hashes=hashed,
        count=count,
        message=f"Installing the study lock's {count} packages of runtime.{p['kind']} {how}.",
    )


def compare(module: AnsibleModule) -> None:
    p = module.params
    ignore = list(rf.NOT_FROZEN) + (["sglang"] if p["kind"] == "git" else [])
    try:
        drift = rf.package_drift(p["packages"] or {}, p["lock_packages"] or {}, ignore)
    except rf.FreezeError as exc:
        module.fail_json(msg=f"The package sets cannot be compared: {exc}.")
    line = rf.drift_line(drift)
    if drift and p["warn"]:
        module.warn(f"runtime.{p['kind']} differs from the study lock's: {line}")
    module.exit_json(changed=False, drift=drift, drift_report=line)


REQUIRED = {
    "merge_report": ("report", "hashes"),
    "record": ("packages", "hashes", "python_version", "built_from", "recorded_from"),
    "frozen": ("lock_packages", "dest"),
    "compare": ("packages", "lock_packages"),
}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "action": {"type": "str", "required": True, "choices": list(REQUIRED)},
            "kind": {"type": "str", "choices": ["release", "git"], "default": "release"},
            "report": {"type": "path"},
            "hashes": {"type": "path"},
            "packages": {"type": "dict"},
            "lock_packages": {"type": "dict"},
            "python_version": {"type": "str"},
            "built_from": {"type": "dict"},
            "recorded_from": {"type": "str"},
            "machine": {"type": "str"},
            "nvidia_smi_path": {"type": "str", "default": "nvidia-smi"},
            "dest": {"type": "path"},
            "warn": {"type": "bool", "default": False},
            "timeout": {"type": "float", "default": 60},
        },
        required_if=[("action", action, needed) for action, needed in REQUIRED.items()],
        supports_check_mode=True,
    )
    {"merge_report": merge_report, "record": record, "frozen": frozen, "compare": compare}[
        module.params["action"]
    ](module)


if __name__ == "__main__":
    main()
