"""module_utils/runtime/check.py run_check without an environment: a fake runner answers the
probe and pip check, so each finding (version, requirements, pip, import, source stamp, the
locked package set) and each failure is seen on its own. test_runtime_probe.py runs the module
against a real distribution."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.host.helpers import CommandFailed
from ansible.module_utils.runtime import probe as runtime_probe
from ansible.module_utils.runtime.check import CheckFailed, run_check

PARAMS = {
    "python": "/opt/kimi/venv/bin/python",
    "package": "sglang",
    "import_name": "sglang",
    "expect_version": "",
    "source_stamp": None,
    "expect_packages": None,
    "ignore_packages": ["pip", "setuptools", "wheel"],
    "fact_name": "kimi_runtime",
    "fail_on_mismatch": True,
    "check_env": False,
}


def probe_record(**changes) -> dict:
    record = {
        "version": "0.5.0",
        "requirements": [
            {"name": "torch", "installed": "2.9.1", "required": "==2.9.1", "ok": True}
        ],
        "packages": {"sglang": "0.5.0", "torch": "2.9.1"},
        "import_error": None,
        "import_seconds": 1.5,
    }
    return {**record, **changes}


def runner(record: dict, pip_rc: int = 0, pip_out: str = "No broken requirements found.\n"):
    calls = []

    def run(argv, shown=None):
        calls.append((argv, shown))
        if argv[1] == "-c":
            return 0, f"{runtime_probe.MARKER}{json.dumps(record)}\n", ""
        return pip_rc, pip_out, ""

    run.calls = calls
    return run


def no_check_env(python):
    raise AssertionError("check_env asked for without check_env")


def test_a_matching_environment_is_ok_and_records_the_probe_without_its_timing():
    run = runner(probe_record())
    result = run_check(PARAMS, run, no_check_env)
    assert result["changed"] is False and result["ok"] is True and result["mismatches"] == []
    record = result["ansible_facts"]["kimi_runtime"]
    assert "import_seconds" not in record and result["import_seconds"] == 1.5
    assert record["pip_check"] == {"ok": True, "output": "No broken requirements found."}
    assert record["source"] is None and record["package"] == "sglang" and record["ok"] is True
    # The probe's whole source is no name: messages show it as <runtime probe>.
    assert run.calls[0][1] == "/opt/kimi/venv/bin/python -c <runtime probe> sglang sglang"
    assert run.calls[1][0] == ["/opt/kimi/venv/bin/python", "-m", "pip", "check"]


def test_every_mismatch_is_named_and_fails_with_the_facts():
    record = probe_record(
        requirements=[{"name": "torch", "installed": None, "required": "==2.9.1", "ok": False}],
        import_error="ImportError: no torch",
    )
    params = {**PARAMS, "expect_version": "0.5.1"}
    with pytest.raises(CheckFailed) as failed:
        run_check(params, runner(record, pip_rc=1, pip_out="sglang needs torch\n"), no_check_env)
    mismatches = failed.value.fields["mismatches"]
    assert mismatches == [
        "sglang 0.5.0 is installed; the kit pins 0.5.1",
        "torch: not installed, but sglang 0.5.0 requires torch==2.9.1",
        "pip check: sglang needs torch",
        "import sglang failed: ImportError: no torch",
    ]
    assert str(failed.value).startswith("The runtime at /opt/kimi/venv/bin/python does not match")
    assert failed.value.fields["ansible_facts"]["kimi_runtime"]["ok"] is False


def test_a_report_only_run_returns_the_mismatches():
    params = {**PARAMS, "fail_on_mismatch": False, "source_stamp": "/nonexistent/stamp.json"}
    result = run_check(params, runner(probe_record(version=None)), no_check_env)
    assert result["ok"] is False
    assert result["mismatches"] == [
        "sglang is not installed in /opt/kimi/venv/bin/python",
        "no record of the git source at /nonexistent/stamp.json",
    ]


def test_the_source_stamp_and_the_locked_set_are_compared(tmp_path):
    stamp = tmp_path / "stamp.json"
    stamp.write_text('{"commit": "abc"}')
    params = {
        **PARAMS,
        "source_stamp": str(stamp),
        "expect_packages": {"sglang": "0.5.0", "torch": "2.9.0"},
        "fail_on_mismatch": False,
    }
    result = run_check(params, runner(probe_record()), no_check_env)
    assert result["ansible_facts"]["kimi_runtime"]["source"] == {"commit": "abc"}
    assert result["drift"] and result["drift_report"]
    assert result["mismatches"][-1].startswith("installed packages differ from the expected set: ")


def test_check_env_is_recorded_when_asked_for():
    asked = []
    params = {**PARAMS, "check_env": True}
    result = run_check(params, runner(probe_record()), lambda python: asked.append(python) or {})
    assert asked == ["/opt/kimi/venv/bin/python"]
    assert result["ansible_facts"]["kimi_runtime"]["check_env"] == {}


def test_a_probe_that_reports_nothing_fails_naming_the_python():
    def run(argv, shown=None):
        return 1, "", "Traceback: boom"

    with pytest.raises(CheckFailed, match=r"could not inspect the environment of .* boom"):
        run_check(PARAMS, run, no_check_env)


def test_a_command_past_the_deadline_fails_with_the_fix():
    def run(argv, shown=None):
        raise CommandFailed("pip check was killed at runtime_check's timeout=1s.")

    with pytest.raises(CheckFailed, match=r"killed at .* Fix: run the command by hand"):
        run_check(PARAMS, run, no_check_env)


def test_a_missing_environment_is_answered_only_when_missing_ok(tmp_path):
    """missing_ok: the role asks without a stat before; no Python there is exists: false, no
    fact and nothing run. Without it (or with the Python there) the check runs as before."""
    params = {**PARAMS, "python": str(tmp_path / "venv" / "bin" / "python"), "missing_ok": True}
    run = runner(probe_record())
    result = run_check(params, run, no_check_env)
    assert result["exists"] is False and "ansible_facts" not in result and run.calls == []
    assert result["drift"] == [] and result["changed"] is False
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    found = run_check(params, runner(probe_record()), no_check_env)
    assert (
        found["exists"] is True and found["ok"] is True and "kimi_runtime" in found["ansible_facts"]
    )
    # Without missing_ok, a missing Python is probed all the same (the probe's error says why).
    assert run_check(
        {**PARAMS, "python": str(tmp_path / "none")}, runner(probe_record()), no_check_env
    )["exists"]
