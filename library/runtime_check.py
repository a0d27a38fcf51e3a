#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module runtime_check: is a Python environment exactly what its SGLang requires?"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: runtime_check
short_description: Check an SGLang environment against the wheel's own requirements and record it
description:
  - Runs inside the environment's Python (O(python)). Reads the installed package's
    requirements from its metadata (C(Requires-Dist), markers evaluated for that Python, extras
    ignored) and compares each with what is installed. A C(==) pin must be met exactly, a range
    must be satisfied; missing packages count as mismatches.
  - Runs C(pip check) and imports the package (the smoke check), reporting its C(__version__)
    and how long the import took.
  - Returns the record as facts under O(fact_name) - versions of every installed distribution,
    the package version, the source commit when O(source_stamp) names the file the runtime role
    wrote for a git install, and every mismatch.
  - With O(fail_on_mismatch) (the default) it fails, naming each package with what is installed
    and what is required, when a requirement is not met, C(pip check) is not clean, the version
    differs from O(expect_version), or the import fails.
  - With O(check_env) it also runs C(python -m sglang.check_env) in the environment under its
    own deadline (O(check_env_timeout)) and records what it printed (bounded, anything shaped
    like a secret masked) as C(check_env), beside C(kernels), the versions of the packages that
    carry the GPU kernels (sglang-kernel or sgl-kernel, flashinfer, FlashMLA, torch, triton).
    A check_env that fails or hangs is recorded, never a mismatch.
  - Read-only; supports check mode.
version_added: "0.1.0"
options:
  python:
    description: Python of the environment.
    type: path
    required: true
  package:
    description: Distribution to check.
    type: str
    default: sglang
  import_name:
    description: Module to import for the smoke check.
    type: str
    default: sglang
  expect_version:
    description: Version the package must have (empty accepts any).
    type: str
    default: ""
  source_stamp:
    description: JSON file recording the git source (url, ref, commit, patches) of the install.
    type: path
  expect_packages:
    description:
      - The package set the environment must hold exactly (the study lock's
        C(runtime.<kind>.packages) - name to C(version) or to a mapping with C(version)).
      - Every difference is returned in RV(drift), one line in RV(drift_report), and counts as
        a mismatch. Left out, nothing is compared.
    type: dict
  ignore_packages:
    description: Packages that O(expect_packages) is not compared on (pip's own tooling).
    type: list
    elements: str
    default: [pip, setuptools, wheel]
  fact_name:
    description: Name of the returned fact.
    type: str
    default: kimi_runtime
  fail_on_mismatch:
    description: Fail when anything does not match; otherwise only report.
    type: bool
    default: true
  missing_ok:
    description: >-
      When O(python) does not exist, answer RV(exists) false and check nothing (no fact is
      set), instead of failing: the role asks once, without a C(stat) before.
    type: bool
    default: false
  timeout:
    description: >-
      Seconds the probe (which imports the package, for sglang torch too) and C(pip check)
      together may take. At the deadline the running one is killed with its whole process
      group and the module fails naming it. Keep it below the task's C(timeout) keyword,
      which kills only the module.
    type: float
    default: 420
  check_env:
    description: Run C(python -m sglang.check_env) and record its output (see above).
    type: bool
    default: false
  check_env_timeout:
    description: >-
      Seconds C(python -m sglang.check_env) may take (it imports torch and initialises CUDA);
      at the deadline it is killed with its process group and recorded as timed out.
    type: float
    default: 180
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check the release runtime
  runtime_check:
    python: /opt/kimi/venv/bin/python
    expect_version: "0.5.23"
    fact_name: kimi_runtime_release
"""

RETURN = r"""
ok:
  description: Whether everything matched.
  returned: always
  type: bool
exists:
  description: Whether O(python) exists (false only with O(missing_ok)).
  returned: always
  type: bool
mismatches:
  description: One line per unmet requirement or problem.
  returned: always
  type: list
  elements: str
ansible_facts:
  description: The record under O(fact_name)
    (python, package, version, import_version, requirements, packages, kernels, pip_check,
    source, and check_env when asked for).
  returned: when O(python) exists
  type: dict
drift:
  description: >-
    Each package whose installed version differs from O(expect_packages), as C(name),
    C(locked) and C(installed) (null where absent); empty without O(expect_packages).
  returned: always
  type: list
  elements: dict
drift_report:
  description: The drift in one line, e.g. C(packaging - locked 26.4, installed 26.3).
  returned: always
  type: str
import_seconds:
  description: How long the smoke import took.
  returned: always
  type: float
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.helpers import module_deadline, module_runner  # noqa: E402
from ansible.module_utils.runtime.check import (  # noqa: E402
    CheckFailed,
    check_env_record,
    run_check,
)
from ansible.module_utils.runtime.freeze import NOT_FROZEN  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "python": {"type": "path", "required": True},
            "package": {"type": "str", "default": "sglang"},
            "import_name": {"type": "str", "default": "sglang"},
            "expect_version": {"type": "str", "default": ""},
            "source_stamp": {"type": "path"},
            "expect_packages": {"type": "dict"},
            "ignore_packages": {"type": "list", "elements": "str", "default": list(NOT_FROZEN)},
            "fact_name": {"type": "str", "default": "kimi_runtime"},
            "fail_on_mismatch": {"type": "bool", "default": True},
            "missing_ok": {"type": "bool", "default": False},
            "timeout": {"type": "float", "default": 420},
            "check_env": {"type": "bool", "default": False},
            "check_env_timeout": {"type": "float", "default": 180},
        },
        supports_check_mode=True,
    )
    run = module_runner(module, "runtime_check", "the probe and pip check together", 420)

    def check_env(python: str) -> dict:
        # Checked only when asked for: a bad check_env_timeout fails only a run that uses it.
        timeout = module_deadline(module, "python -m sglang.check_env", 180, "check_env_timeout")
        return check_env_record(python, timeout)

    try:
        result = run_check(module.params, run, check_env)
    except CheckFailed as failed:
        module.fail_json(msg=str(failed), **failed.fields)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
