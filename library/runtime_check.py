#!/usr/bin/python
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
  fact_name:
    description: Name of the returned fact.
    type: str
    default: kimi_runtime
  fail_on_mismatch:
    description: Fail when anything does not match; otherwise only report.
    type: bool
    default: true
author:
  - kimi-deploy-kit maintainers
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
    (python, package, version, import_version, requirements, packages, pip_check, source).
  returned: always
  type: dict
import_seconds:
  description: How long the smoke import took.
  returned: always
  type: float
"""

import json  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

# Runs in the environment's own Python: its metadata, its markers, its packaging.
PROBE = r"""
import importlib, importlib.metadata as md, json, sys, time
try:
    from packaging.requirements import Requirement
    from packaging.version import Version, InvalidVersion
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import Version, InvalidVersion
package, import_name = sys.argv[1], sys.argv[2]
def canon(name):
    return name.lower().replace("_", "-").replace(".", "-")
installed = {}
for dist in md.distributions():
    name = dist.metadata["Name"]
    if name:
        installed[canon(name)] = dist.version
out = {"python": sys.executable, "python_version": sys.version.split()[0],
       "packages": dict(sorted(installed.items())), "requirements": []}
try:
    out["version"] = md.version(package)
    requires = md.requires(package) or []
except md.PackageNotFoundError:
    out["version"] = None
    requires = []
for line in requires:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    have = installed.get(canon(req.name))
    ok = have is not None
    if ok and req.specifier:
        try:
            ok = req.specifier.contains(Version(have), prereleases=True)
        except InvalidVersion:
            ok = False
    pinned = [s.version for s in req.specifier if s.operator in ("==", "===")]
    out["requirements"].append({"name": canon(req.name), "required": str(req.specifier) or "any",
                                "installed": have, "ok": ok,
                                "pinned": pinned[0] if pinned else None})
start = time.monotonic()
try:
    module = importlib.import_module(import_name)
    out["import_version"] = getattr(module, "__version__", None)
    out["import_error"] = None
except BaseException as error:
    out["import_version"] = None
    out["import_error"] = f"{type(error).__name__}: {error}"
out["import_seconds"] = round(time.monotonic() - start, 2)
print("KIMI-RUNTIME " + json.dumps(out))
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "python": {"type": "path", "required": True},
            "package": {"type": "str", "default": "sglang"},
            "import_name": {"type": "str", "default": "sglang"},
            "expect_version": {"type": "str", "default": ""},
            "source_stamp": {"type": "path"},
            "fact_name": {"type": "str", "default": "kimi_runtime"},
            "fail_on_mismatch": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    rc, out, err = module.run_command([p["python"], "-c", PROBE, p["package"], p["import_name"]])
    line = next((x for x in out.splitlines() if x.startswith("KIMI-RUNTIME ")), None)
    if rc != 0 or line is None:
        module.fail_json(
            msg=(
                f"could not inspect the environment of {p['python']} (exit {rc}): "
                f"{(err or out).strip()[-1500:]}. Is it a Python virtual environment? The runtime "
                "role creates it; rerun the deploy."
            )
        )
    record = json.loads(line[len("KIMI-RUNTIME ") :])
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
    rc, pip_out, pip_err = module.run_command([p["python"], "-m", "pip", "check"])
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
    record["package"] = p["package"]
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
            import_seconds=import_seconds,
            ansible_facts=facts,
        )
    module.exit_json(
        changed=False,
        ok=not mismatches,
        mismatches=mismatches,
        import_seconds=import_seconds,
        ansible_facts=facts,
    )


if __name__ == "__main__":
    main()
