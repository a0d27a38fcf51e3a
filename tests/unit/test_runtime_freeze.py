"""The frozen runtime (module_utils/runtime/freeze.py and library/runtime_freeze.py) without
hosts: pip reports merged into the hash record (and the ones that cannot be trusted refused),
the lock record, the frozen requirements text, the drift and its one-line report, nvidia-smi's
driver lines, and runtime_check's expect_packages. tests/integration/test_git_runtime.py runs
them over SSH test hosts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from ansible.module_utils.runtime import freeze as rf

from tests.support.modules import run_module

pytestmark = pytest.mark.runtime

SHA_A = "a" * 64
SHA_B = "b" * 64


def report_item(name, version, download_info):
    return {"metadata": {"name": name, "version": version}, "download_info": download_info}


def archive(**info):
    return {"url": "file:///w/x.whl", "archive_info": info}


def test_report_hashes_take_both_forms_pip_writes_and_skip_what_has_none():
    report = {
        "version": "1",
        "install": [
            report_item("PyYAML", "6.0.4", archive(hashes={"sha256": SHA_A})),
            # pip 23.0 (Debian bookworm's ensurepip) writes only the older field.
            report_item("Jinja2", "3.1.6", archive(hash=f"sha256={SHA_B}")),
            report_item("sglang", "0.5.23.dev1", {"url": "file:///src", "dir_info": {}}),
            report_item("md5only", "1.0", archive(hash="md5=" + "c" * 32)),
            report_item("short", "1.0", archive(hashes={"sha256": "abc"})),
        ],
    }
    assert rf.report_hashes(report) == {"pyyaml": {"6.0.4": SHA_A}, "jinja2": {"3.1.6": SHA_B}}


@pytest.mark.parametrize(
    "item",
    [
        "not a dict",
        {"metadata": "no"},
        report_item(["list"], "1.0", archive(hashes={"sha256": SHA_A})),
        report_item("--index-url=http://evil", "1.0", archive(hashes={"sha256": SHA_A})),
        report_item("ok", "1.0 --hash=sha256:x", archive(hashes={"sha256": SHA_A})),
        report_item("ok", "1.0", archive(hashes={"sha256": SHA_A.upper()})),
        report_item("ok", "1.0", archive(hashes=["sha256", SHA_A])),
        report_item("ok", "1.0", "download_info as text"),
    ],
)
def test_report_items_that_are_not_well_formed_are_skipped(item):
    good = report_item("packaging", "26.4", archive(hashes={"sha256": SHA_A}))
    assert rf.report_hashes({"install": [item, good]}) == {"packaging": {"26.4": SHA_A}}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{cut", "not JSON"),
        ("[1, 2]", "no `install` list"),
        ('{"install": {"a": 1}}', "no `install` list"),
        ("[" * 100000 + "]" * 100000, "not JSON"),
        (" " * (rf.MAX_REPORT_BYTES + 1), "larger than"),
        (json.dumps({"install": [{}] * (rf.MAX_PACKAGES + 1)}), "more than"),
    ],
)
def test_reports_that_are_not_pips_are_refused_by_name(text, reason):
    with pytest.raises(rf.FreezeError, match=reason):
        rf.parse_report(text)


def test_merging_keeps_earlier_hashes_and_drops_damaged_record_entries():
    record = {
        "PyYAML": {"6.0.3": SHA_B},
        "bad name!": {"1.0": SHA_A},
        "jinja2": {"3.1.6": "not hex"},
        "markupsafe": "not a mapping",
    }
    merged = rf.merge_hashes(record, {"pyyaml": {"6.0.4": SHA_A}})
    assert merged == {"pyyaml": {"6.0.3": SHA_B, "6.0.4": SHA_A}}
    assert rf.merge_hashes(None, {}) == {}


def test_lock_packages_take_the_hash_of_the_installed_version_only():
    installed = {"pip": "23.0.1", "PyYAML": "6.0.4", "packaging": "26.4", "sglang": "0.5.23"}
    hashes = {"pyyaml": {"6.0.4": SHA_A}, "packaging": {"26.3": SHA_B}, "sglang": {"0.5.23": SHA_B}}
    packages, state = rf.lock_packages(installed, hashes, "release")
    assert packages == {
        "packaging": {"version": "26.4", "sha256": None},
        "pyyaml": {"version": "6.0.4", "sha256": SHA_A},
        "sglang": {"version": "0.5.23", "sha256": SHA_B},
    }
    assert state == "partial"
    git, git_state = rf.lock_packages(installed, hashes, "git")
    assert "sglang" not in git and "pip" not in git and git_state == "partial"
    assert rf.lock_packages({"pyyaml": "6.0.4"}, hashes, "release")[1] == "complete"
    assert rf.lock_packages({"packaging": "26.4"}, hashes, "release")[1] == "none"
    with pytest.raises(rf.FreezeError, match="is not name==version"):
        rf.lock_packages({"x": "1.0; rm -rf /"}, {}, "release")


def test_frozen_text_has_hashes_only_when_every_package_has_one():
    locked = {"PyYAML": {"version": "6.0.4", "sha256": SHA_A}, "sglang": {"version": "0.5.23"}}
    locked["sglang"]["sha256"] = SHA_B
    text, hashed = rf.frozen_requirements(locked, "release")
    assert hashed is True
    assert text == (f"pyyaml==6.0.4 --hash=sha256:{SHA_A}\nsglang==0.5.23 --hash=sha256:{SHA_B}\n")
    # The git kind builds sglang from its commit.
    assert rf.frozen_requirements(locked, "git")[0] == f"pyyaml==6.0.4 --hash=sha256:{SHA_A}\n"
    partial = {**locked, "jinja2": {"version": "3.1.6", "sha256": None}}
    text, hashed = rf.frozen_requirements(partial, "release")
    assert hashed is False
    assert text == "jinja2==3.1.6\npyyaml==6.0.4\nsglang==0.5.23\n"


@pytest.mark.parametrize(
    ("packages", "reason"),
    [
        ({}, "non-empty"),
        ([], "non-empty"),
        ({"--index-url": {"version": "1"}}, "no valid name"),
        ({"ok": {"version": "1\n--extra-index-url=x"}}, "no valid name"),
        # `$` would have matched before the newline.
        ({"ok": {"version": "1.0\n"}}, "no valid name"),
        ({"ok\n": {"version": "1.0"}}, "no valid name"),
        ({"ok": {"version": "1.0", "sha256": "a" * 64 + "\n"}}, "64 hex"),
        ({"ok": "1.0"}, "no valid name"),
        ({"ok": {"version": "1.0", "sha256": "zz"}}, "64 hex"),
    ],
)
def test_frozen_text_refuses_lock_entries_that_could_carry_options(packages, reason):
    with pytest.raises(rf.FreezeError, match=reason):
        rf.frozen_requirements(packages, "release")


def test_drift_names_each_package_and_ignores_pips_tooling():
    installed = {"packaging": "26.3", "Foo_Bar": "1.0", "pip": "23.0.1", "pyyaml": "6.0.4"}
    locked = {
        "packaging": {"version": "26.4", "sha256": None},
        "pyyaml": {"version": "6.0.4", "sha256": SHA_A},
        "jinja2": {"version": "3.1.6", "sha256": None},
        "pip": {"version": "24.0", "sha256": None},
    }
    drift = rf.package_drift(installed, locked)
    assert drift == [
        {"name": "foo-bar", "locked": None, "installed": "1.0"},
        {"name": "jinja2", "locked": "3.1.6", "installed": None},
        {"name": "packaging", "locked": "26.4", "installed": "26.3"},
    ]
    assert rf.drift_line(drift) == (
        "foo-bar: not locked, installed 1.0; jinja2: locked 3.1.6, not installed; "
        "packaging: locked 26.4, installed 26.3"
    )
    assert rf.package_drift(installed, {"packaging": "26.3"}, ["pip", "foo-bar", "pyyaml"]) == []
    assert rf.drift_line([]) == ""


def test_names_are_canonical():
    assert rf.canonical_name("Compressed_Tensors..X-y") == "compressed-tensors-x-y"
    assert rf.valid_name("a") and rf.valid_name("zope.interface")
    assert not rf.valid_name("-e") and not rf.valid_name("a b") and not rf.valid_name("")


def test_nvidia_smi_plain_query_gives_the_driver_and_its_cuda():
    text = (
        "==============NVSMI LOG==============\n\n"
        "Driver Version                            : 580.65.06\n"
        "CUDA Version                              : 13.0\n"
        "GPU 00000000:18:00.0\n    Product Name : NVIDIA H200\n"
        "    Driver Version : 999.0\n"
    )
    assert rf.parse_nvidia_smi_query(text) == {"driver": "580.65.06", "driver_cuda": "13.0"}
    # The test hosts' fake prints the XML tags title-cased.
    fake = "Driver Version : 580.159.04\nCuda Version   : 13.0\n"
    assert rf.parse_nvidia_smi_query(fake) == {"driver": "580.159.04", "driver_cuda": "13.0"}
    odd = "Driver Version : N/A\nCUDA Version : 13.0; rm\n"
    assert rf.parse_nvidia_smi_query(odd) == {"driver": None, "driver_cuda": None}
    assert rf.parse_nvidia_smi_query(None) == {"driver": None, "driver_cuda": None}


def report_file(tmp_path, items):
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"version": "1", "install": items}))
    return path


def test_the_module_merges_a_report_into_the_record_and_removes_it(tmp_path):
    record = tmp_path / "release-hashes.json"
    record.write_text(json.dumps({"jinja2": {"3.1.6": SHA_B}}))
    report = report_file(
        tmp_path, [report_item("PyYAML", "6.0.4", archive(hash=f"sha256={SHA_A}"))]
    )
    args = {"action": "merge_report", "report": str(report), "hashes": str(record)}
    checked = run_module("runtime_freeze", args, check_mode=True)
    assert checked["changed"] is True and report.exists()
    assert json.loads(record.read_text()) == {"jinja2": {"3.1.6": SHA_B}}
    merged = run_module("runtime_freeze", args)
    assert merged["changed"] is True and not report.exists()
    assert json.loads(record.read_text()) == {
        "jinja2": {"3.1.6": SHA_B},
        "pyyaml": {"6.0.4": SHA_A},
    }
    # pip skipped: no report, the record stays.
    again = run_module("runtime_freeze", args)
    assert again["changed"] is False and "no pip report" in again["msg"]
    report.write_text("{cut")
    refused = run_module("runtime_freeze", args)
    assert refused["failed"] is True and "is unusable: not JSON" in refused["msg"]


def test_the_module_records_the_set_with_hashes_and_the_driver(tmp_path):
    record = tmp_path / "hashes.json"
    record.write_text(json.dumps({"pyyaml": {"6.0.4": SHA_A}}))
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'Driver Version : 580.65.06'\necho 'CUDA Version : 13.0'\n")
    smi.chmod(0o755)
    args = {
        "action": "record",
        "kind": "git",
        "packages": {"pyyaml": "6.0.4", "sglang": "0.5.23.dev1", "pip": "23.0.1"},
        "hashes": str(record),
        "python_version": "3.11.2",
        "built_from": {"commit": "c" * 40, "patches": []},
        "recorded_from": "gitnode",
        "machine": "x86_64",
        "nvidia_smi_path": str(smi),
    }
    result = run_module("runtime_freeze", args)
    assert result["record"] == {
        "built_from": {"commit": "c" * 40, "patches": []},
        "python": "3.11.2",
        "platform": {"driver": "580.65.06", "driver_cuda": "13.0", "machine": "x86_64"},
        "recorded_from": "gitnode",
        "hashes": "complete",
        "packages": {"pyyaml": {"version": "6.0.4", "sha256": SHA_A}},
    }
    missing = run_module("runtime_freeze", {**args, "nvidia_smi_path": str(tmp_path / "none")})
    assert missing["record"]["platform"] == {
        "driver": None,
        "driver_cuda": None,
        "machine": "x86_64",
    }


def test_the_module_writes_the_frozen_file_and_says_how(tmp_path):
    dest = tmp_path / "release-frozen.txt"
    locked = {"pyyaml": {"version": "6.0.4", "sha256": SHA_A}}
    args = {"action": "frozen", "lock_packages": locked, "dest": str(dest)}
    assert run_module("runtime_freeze", args, check_mode=True)["changed"] and not dest.exists()
    first = run_module("runtime_freeze", args)
    assert first["changed"] is True and first["require_hashes"] is True
    assert "1 packages of runtime.release with --require-hashes" in first["message"]
    assert dest.read_text() == f"pyyaml==6.0.4 --hash=sha256:{SHA_A}\n"
    assert run_module("runtime_freeze", args)["changed"] is False
    partial = run_module(
        "runtime_freeze",
        {**args, "lock_packages": {**locked, "jinja2": {"version": "3.1.6", "sha256": None}}},
    )
    assert partial["require_hashes"] is False and "without --require-hashes" in partial["message"]
    bad = run_module("runtime_freeze", {**args, "lock_packages": {"-r/etc/x": {"version": "1"}}})
    assert bad["failed"] is True and "kimi_lock_update=true" in bad["msg"]


def test_the_module_compares_and_warns(tmp_path):
    result = run_module(
        "runtime_freeze",
        {
            "action": "compare",
            "kind": "git",
            "packages": {"packaging": "26.3", "sglang": "0.5.23.dev1"},
            "lock_packages": {"packaging": {"version": "26.4", "sha256": None}},
            "warn": True,
        },
    )
    assert result["drift_report"] == "packaging: locked 26.4, installed 26.3"
    assert "differs from the study lock's: packaging: locked 26.4, installed 26.3" in str(
        result["warnings"]
    )


def test_runtime_check_reports_the_drift_from_an_expected_set(tmp_path):
    venv = tmp_path / "venv"
    # With pip: the probe reads requirements with it and the module runs pip check.
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    site = next((venv / "lib").glob("python3.*")) / "site-packages"
    for name, version in (("demo", "1.0"), ("extra_pkg", "2.0")):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (site / "demo.py").write_text('__version__ = "1.0"\n')
    params = {"python": str(venv / "bin" / "python"), "package": "demo", "import_name": "demo"}
    locked = {"demo": {"version": "1.1", "sha256": None}, "gone": {"version": "3", "sha256": None}}
    result = run_module(
        "runtime_check", {**params, "expect_packages": locked, "fail_on_mismatch": False}
    )
    assert result["drift"] == [
        {"name": "demo", "locked": "1.1", "installed": "1.0"},
        {"name": "extra-pkg", "locked": None, "installed": "2.0"},
        {"name": "gone", "locked": "3", "installed": None},
    ]
    assert result["drift_report"] == (
        "demo: locked 1.1, installed 1.0; extra-pkg: not locked, installed 2.0; "
        "gone: locked 3, not installed"
    )
    failed = run_module(
        "runtime_check",
        {**params, "expect_packages": locked, "ignore_packages": ["extra_pkg", "gone"]},
    )
    assert failed["failed"] is True
    assert (
        "installed packages differ from the expected set: demo: locked 1.1, installed 1.0"
        in (failed["msg"])
    )
    plain = run_module("runtime_check", {**params, "fail_on_mismatch": False})
    assert plain["drift"] == [] and plain["drift_report"] == ""
