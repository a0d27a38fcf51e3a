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
mismatches:
  description: One line per unmet requirement or problem.
  returned: always
  type: list
  elements: str
ansible_facts:
  description: The record under O(fact_name)
    (python, package, version, import_version, requirements, packages, kernels, pip_check,
    source, and check_env when asked for).
  returned: always
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

import inspect  # noqa: E402
import json  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.helpers import (  # noqa: E402
    CommandFailed,
    command_environment,
    marked_json,
    module_deadline,
    module_runner,
    run_with_deadline,
)
from ansible.module_utils.runtime import freeze as runtime_freeze  # noqa: E402
from ansible.module_utils.runtime import probe as runtime_probe  # noqa: E402
from ansible.module_utils.runtime import report as runtime_report  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "python": {"type": "path", "required": True},
            "package": {"type": "str", "default": "sglang"},
            "import_name": {"type": "str", "default": "sglang"},
            "expect_version": {"type": "str", "default": ""},
            "source_stamp": {"type": "path"},
            "expect_packages": {"type": "dict"},
            "ignore_packages": {
                "type": "list",
                "elements": "str",
                "default": list(runtime_freeze.NOT_FROZEN),
            },
            "fact_name": {"type": "str", "default": "kimi_runtime"},
            "fail_on_mismatch": {"type": "bool", "default": True},
            "timeout": {"type": "float", "default": 420},
            "check_env": {"type": "bool", "default": False},
            "check_env_timeout": {"type": "float", "default": 180},
        },
        supports_check_mode=True,
    )
    p = module.params
    deadline_run = module_runner(module, "runtime_check", "the probe and pip check together", 420)

    def run(argv: list[str], shown: str | None = None) -> tuple[int, str, str]:
        try:
            return deadline_run(argv, shown=shown)
        except CommandFailed as exc:
            module.fail_json(
                msg=f"{exc} A hung import or pip usually means a broken environment or a "
                "filesystem that does not answer (NFS). Fix: run the command by hand on the "
                "host; raise timeout only if it is merely slow."
            )

    # The probe is module_utils/runtime/probe.py: imported above, so Ansible ships it in this
    # module's payload (no file to copy, no parameter naming one), and run from its source in
    # the environment's own Python, which has no Ansible. Its MARKER line is the report.
    probe = inspect.getsource(runtime_probe)
    rc, out, err = run(
        [p["python"], "-c", probe, p["package"], p["import_name"]],
        shown=f"{p['python']} -c <runtime probe> {p['package']} {p['import_name']}",
    )
    record = marked_json(out, runtime_probe.MARKER)
    if rc != 0 or record is None:
        module.fail_json(
            msg=(
                f"could not inspect the environment of {p['python']} (exit {rc}): "
                f"{(err or out).strip()[-1500:]}. Is it a Python virtual environment? The runtime "
                "role creates it; rerun the deploy."
            )
        )
    mismatches = []
    if record["version"] is None:
        mismatches.append(f"{p['package']} is not installed in {p['python']}")
    elif p["expect_version"] and record["version"] != p["expect_version"]:
        mismatches.append(
            f"{p['package']} {record['version']} is installed; the kit pins {p['expect_version']}"
        )
    for req in record["requirements"]:
        if not req["ok"]:
            have = req["installed"] or "not installed"
            mismatches.append(
                f"{req['name']}: {have}, but {p['package']} {record['version']} requires "
                f"{req['name']}{req['required'] if req['required'] != 'any' else ''}"
            )
    rc, pip_out, pip_err = run([p["python"], "-m", "pip", "check"])
    record["pip_check"] = {"ok": rc == 0, "output": (pip_out + pip_err).strip()}
    if rc != 0:
        mismatches.append(f"pip check: {(pip_out + pip_err).strip()}")
    if record["import_error"] and record["version"] is not None:
        mismatches.append(f"import {p['import_name']} failed: {record['import_error']}")
    record["source"] = None
    if p["source_stamp"]:
        try:
            with open(p["source_stamp"], encoding="utf-8") as handle:
                record["source"] = json.load(handle)
        except (OSError, ValueError):
            mismatches.append(f"no record of the git source at {p['source_stamp']}")
    drift = []
    if p["expect_packages"] is not None:
        try:
            drift = runtime_freeze.package_drift(
                record["packages"], p["expect_packages"], p["ignore_packages"]
            )
        except runtime_freeze.FreezeError as exc:
            module.fail_json(msg=f"expect_packages cannot be compared: {exc}.")
        if drift:
            mismatches.append(
                "installed packages differ from the expected set: "
                + runtime_freeze.drift_line(drift)
            )
    record["package"] = p["package"]
    record["kernels"] = runtime_report.kernel_versions(record["packages"])
    if p["check_env"]:
        record["check_env"] = check_env(module, p["python"])
    # Timing varies run to run; kept out of the record so that writing it stays idempotent.
    import_seconds = record.pop("import_seconds")
    record["ok"] = not mismatches
    record["mismatches"] = mismatches
    facts = {p["fact_name"]: record}
    if mismatches and p["fail_on_mismatch"]:
        module.fail_json(
            msg=(
                f"The runtime at {p['python']} does not match what {p['package']} requires: "
                + "; ".join(mismatches)
                + ". Fix: uninstall what was added to the environment by hand, or remove the "
                "environment and rerun the deploy, which recreates it with exactly these pins."
            ),
            mismatches=mismatches,
            drift=drift,
            drift_report=runtime_freeze.drift_line(drift),
            import_seconds=import_seconds,
            ansible_facts=facts,
        )
    module.exit_json(
        changed=False,
        ok=not mismatches,
        mismatches=mismatches,
        drift=drift,
        drift_report=runtime_freeze.drift_line(drift),
        import_seconds=import_seconds,
        ansible_facts=facts,
    )


def check_env(module, python: str) -> dict:
    """runtime_report's check_env record of one run, under its own deadline: a report, so a
    failure is written down instead of failing the module."""
    timeout = module_deadline(module, "python -m sglang.check_env", 180, "check_env_timeout")
    argv = [python, "-m", runtime_report.CHECK_ENV_MODULE]
    try:
        rc, out, err = run_with_deadline(
            argv,
            timeout,
            env=command_environment(),
            max_output_bytes=4 << 20,
            what=f"runtime_check's check_env_timeout={timeout:g}s",
        )
    except CommandFailed as exc:
        return runtime_report.check_env_record(None, "", "", error=str(exc))
    return runtime_report.check_env_record(rc, out, err)


if __name__ == "__main__":
    main()
