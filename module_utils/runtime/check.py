"""One run of the runtime check, as library/runtime_check.py does it: the probe run in the
environment's own Python, its findings held to what the package requires (its requirements,
pip check, the import, the source stamp, the locked package set), and the record built.

Everything the module must say comes back as a dict for exit_json, or as CheckFailed, whose
message and fields go to fail_json.
"""

from __future__ import annotations

import inspect
import json
import os

from ansible.module_utils.host.helpers import (
    CommandFailed,
    command_environment,
    marked_json,
    run_with_deadline,
)
from ansible.module_utils.runtime import freeze as runtime_freeze
from ansible.module_utils.runtime import probe as runtime_probe
from ansible.module_utils.runtime import report as runtime_report


class CheckFailed(Exception):
    """The module fails: str() is its msg, fields the other keys of its result."""

    def __init__(self, msg: str, **fields):
        super().__init__(msg)
        self.fields = fields


def run_check(params: dict, run, check_env) -> dict:
    """The module's whole run: exit_json's keys, or CheckFailed. `run(argv, shown=None)` runs a
    command under the module's deadline (AnsibleModule.run_command's answer, CommandFailed at
    the deadline); `check_env(python)` is the check_env record, asked for only with check_env."""
    p = params
    if p.get("missing_ok") and not os.path.exists(p["python"]):
        # No environment yet (a first deploy, in check mode or before its install): nothing
        # to check, and no record under fact_name, as when the task was skipped.
        return {
            "changed": False,
            "exists": False,
            "ok": False,
            "mismatches": [],
            "drift": [],
            "drift_report": "",
            "import_seconds": 0.0,
        }
    record = probe(p, run)
    mismatches = requirement_mismatches(p, record)
    mismatches += pip_check(p, record, run)
    if record["import_error"] and record["version"] is not None:
        mismatches.append(f"import {p['import_name']} failed: {record['import_error']}")
    mismatches += read_source_stamp(p["source_stamp"], record)
    drift = package_drift(p, record)
    if drift:
        mismatches.append(
            "installed packages differ from the expected set: " + runtime_freeze.drift_line(drift)
        )
    record["package"] = p["package"]
    record["kernels"] = runtime_report.kernel_versions(record["packages"])
    if p["check_env"]:
        record["check_env"] = check_env(p["python"])
    # Timing varies run to run; kept out of the record so that writing it stays idempotent.
    import_seconds = record.pop("import_seconds")
    record["ok"] = not mismatches
    record["mismatches"] = mismatches
    result = {
        "exists": True,
        "mismatches": mismatches,
        "drift": drift,
        "drift_report": runtime_freeze.drift_line(drift),
        "import_seconds": import_seconds,
        "ansible_facts": {p["fact_name"]: record},
    }
    if mismatches and p["fail_on_mismatch"]:
        raise CheckFailed(
            f"The runtime at {p['python']} does not match what {p['package']} requires: "
            + "; ".join(mismatches)
            + ". Fix: uninstall what was added to the environment by hand, or remove the "
            "environment and rerun the deploy, which recreates it with exactly these pins.",
            **result,
        )
    return {"changed": False, "ok": not mismatches, **result}


def bounded(run, argv: list[str], shown: str | None = None) -> tuple[int, str, str]:
    """run(argv), with a command killed at the deadline turned into CheckFailed."""
    try:
        return run(argv, shown=shown)
    except CommandFailed as exc:
        raise CheckFailed(
            f"{exc} A hung import or pip usually means a broken environment or a "
            "filesystem that does not answer (NFS). Fix: run the command by hand on the "
            "host; raise timeout only if it is merely slow."
        ) from exc


def probe(p: dict, run) -> dict:
    """The probe's record of the environment: the package's version and requirements, every
    installed package, the import's outcome."""
    # The probe is module_utils/runtime/probe.py: imported above, so Ansible ships it in the
    # module's payload (no file to copy, no parameter naming one), and run from its source in
    # the environment's own Python, which has no Ansible. Its MARKER line is the report.
    source = inspect.getsource(runtime_probe)
    rc, out, err = bounded(
        run,
        [p["python"], "-c", source, p["package"], p["import_name"]],
        shown=f"{p['python']} -c <runtime probe> {p['package']} {p['import_name']}",
    )
    record = marked_json(out, runtime_probe.MARKER)
    if rc != 0 or record is None:
        raise CheckFailed(
            f"could not inspect the environment of {p['python']} (exit {rc}): "
            f"{(err or out).strip()[-1500:]}. Is it a Python virtual environment? The runtime "
            "role creates it; rerun the deploy."
        )
    return record


def requirement_mismatches(p: dict, record: dict) -> list[str]:
    """The package missing or at another version than pinned, and every requirement of it that
    the environment does not meet."""
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
    return mismatches


def pip_check(p: dict, record: dict, run) -> list[str]:
    """`pip check` in the environment, recorded; its complaint as a mismatch."""
    rc, pip_out, pip_err = bounded(run, [p["python"], "-m", "pip", "check"])
    record["pip_check"] = {"ok": rc == 0, "output": (pip_out + pip_err).strip()}
    return [f"pip check: {(pip_out + pip_err).strip()}"] if rc != 0 else []


def read_source_stamp(path: str | None, record: dict) -> list[str]:
    """The git source stamp into the record (None without one); a mismatch when it is named
    but cannot be read."""
    record["source"] = None
    if not path:
        return []
    try:
        with open(path, encoding="utf-8") as handle:
            record["source"] = json.load(handle)
    except (OSError, ValueError):
        return [f"no record of the git source at {path}"]
    return []


def package_drift(p: dict, record: dict) -> list:
    """The installed packages against expect_packages (none compared without it)."""
    if p["expect_packages"] is None:
        return []
    try:
        return runtime_freeze.package_drift(
            record["packages"], p["expect_packages"], p["ignore_packages"]
        )
    except runtime_freeze.FreezeError as exc:
        raise CheckFailed(f"expect_packages cannot be compared: {exc}.") from exc


def check_env_record(python: str, timeout: float) -> dict:
    """runtime_report's check_env record of one run, under its own deadline: a report, so a
    failure is written down instead of failing the module."""
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
