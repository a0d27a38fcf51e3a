"""runtime_check's probe (module_utils/runtime/probe.py) without hosts: run as the module runs
it against a small distribution on PYTHONPATH, its pure parts, and the module reading it back.
tests/integration/test_server.py runs the module over SSH against the runtime role's
environments."""

from __future__ import annotations

import importlib.metadata as md
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.module_utils.host.helpers import marked_json
from ansible.module_utils.runtime import probe as runtime_probe

from tests.support.modules import run_module

pytestmark = pytest.mark.runtime

REQUIRES = [
    "jsonschema>=1",
    "PyYAML==0.0.1",
    "no_such.package>=2",
    'pytest>=8; extra == "test"',
    'jsonschema<1; python_version < "3"',
]


def distribution(root: Path, name: str = "demo", body: str = '__version__ = "1.0"\n') -> Path:
    """An installed-looking distribution (metadata and package) to put on PYTHONPATH."""
    info = root / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    requires = "".join(f"Requires-Dist: {line}\n" for line in REQUIRES)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n{requires}")
    (root / name).mkdir()
    (root / name / "__init__.py").write_text(body)
    return root


def run_probe(pythonpath: Path, package: str = "demo") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", inspect.getsource(runtime_probe), package, package],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(pythonpath)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_probe_checks_the_requirements_the_environment_applies(tmp_path):
    done = run_probe(distribution(tmp_path))
    assert done.returncode == 0, done.stderr
    record = marked_json(done.stdout, runtime_probe.MARKER)
    assert record["version"] == "1.0" and record["import_version"] == "1.0"
    assert record["import_error"] is None and record["python"] == sys.executable
    assert record["packages"]["demo"] == "1.0"
    assert record["packages"]["jsonschema"] == md.version("jsonschema")
    # The extra and the marker that does not hold here are left out.
    by_name = {req["name"]: req for req in record["requirements"]}
    assert list(by_name) == ["jsonschema", "pyyaml", "no-such-package"]
    assert by_name["jsonschema"] == {
        "name": "jsonschema",
        "required": ">=1",
        "installed": md.version("jsonschema"),
        "ok": True,
        "pinned": None,
    }
    assert by_name["pyyaml"]["ok"] is False and by_name["pyyaml"]["pinned"] == "0.0.1"
    assert by_name["pyyaml"]["installed"] == md.version("PyYAML")
    assert by_name["no-such-package"]["installed"] is None
    assert by_name["no-such-package"]["ok"] is False


def test_probe_reports_a_failed_import_and_a_missing_package(tmp_path):
    broken = distribution(tmp_path / "broken", body="raise RuntimeError('no GPU driver')\n")
    record = marked_json(run_probe(broken).stdout, runtime_probe.MARKER)
    assert record["version"] == "1.0"
    assert record["import_error"] == "RuntimeError: no GPU driver"
    missing = marked_json(run_probe(tmp_path / "broken", "absent").stdout, runtime_probe.MARKER)
    assert missing["version"] is None and missing["requirements"] == []
    assert missing["import_error"] == "ModuleNotFoundError: No module named 'absent'"


def test_requirements_allow_prereleases_and_refuse_unreadable_versions():
    installed = {"torch": "2.14.0rc1", "odd": "not-a-version", "my-pkg": "1.0"}
    checked = runtime_probe.check_requirements(
        ["torch>=2.13", "odd==1.0", "My_Pkg==1.0"], installed
    )
    assert [(r["name"], r["ok"]) for r in checked] == [
        ("torch", True),
        ("odd", False),
        ("my-pkg", True),
    ]
    assert runtime_probe.canon("Compressed_Tensors.X") == "compressed-tensors-x"


def test_probe_output_is_read_back_with_the_same_marker():
    record = {"version": "0.5.23", "requirements": []}
    line = runtime_probe.report_line(record)
    assert line.startswith("KIMI-RUNTIME {")
    assert marked_json("pip said something\n" + line + "\n", runtime_probe.MARKER) == record
    assert marked_json("no marker here", runtime_probe.MARKER) is None
    assert marked_json(runtime_probe.MARKER + "{cut", runtime_probe.MARKER) is None
    assert marked_json(runtime_probe.MARKER + json.dumps([1]), runtime_probe.MARKER) is None


def test_the_module_names_each_unmet_requirement(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(distribution(tmp_path)))
    params = {"python": sys.executable, "package": "demo", "import_name": "demo"}
    result = run_module("runtime_check", {**params, "expect_version": "1.1"})
    assert result["failed"] is True
    [facts] = result["ansible_facts"].values()
    assert facts["version"] == "1.0" and facts["ok"] is False
    assert "demo 1.0 is installed; the kit pins 1.1" in result["mismatches"]
    assert (
        f"pyyaml: {md.version('PyYAML')}, but demo 1.0 requires pyyaml==0.0.1"
        in (result["mismatches"])
    )
    assert (
        "no-such-package: not installed, but demo 1.0 requires no-such-package>=2"
        in (result["mismatches"])
    )
    reported = run_module("runtime_check", {**params, "fail_on_mismatch": False})
    assert not reported.get("failed") and reported["ok"] is False
    assert reported["ansible_facts"]["kimi_runtime"]["package"] == "demo"


def test_the_module_fails_clearly_when_the_python_is_not_one(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'not a python' >&2\nexit 127\n")
    fake.chmod(0o755)
    result = run_module("runtime_check", {"python": str(fake)})
    assert result["failed"] is True
    assert "could not inspect the environment of" in result["msg"]
    assert "not a python" in result["msg"]
