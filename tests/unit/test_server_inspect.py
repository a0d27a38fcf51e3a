"""server_inspect (module_utils/server/inspect.py, library/server_inspect.py): what the server
stage reads from a host before a launch, in one module run, and the failures that name the
fix. The server role's playbook runs over the test hosts (tests/integration/test_server.py, the
deploy) cover the wiring: a supervisor host and a systemd host each start a healthy server."""

from __future__ import annotations

import json
import os
import re

from tests.support.modules import run_module

VERSION = "release-0123456789ab"


def host(tmp_path, systemd: bool = False, version_line: str | None = None, hang: bool = False):
    """A host's view under tmp_path: the systemd folder (when systemd runs it), a runtime link
    at venv/ to a built version folder, a launch record naming it, and a fake systemctl."""
    systemd_dir = tmp_path / "run-systemd-system"
    if systemd:
        systemd_dir.mkdir()
    versions = tmp_path / "runtimes"
    folder = versions / VERSION
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python").write_text("#!/bin/sh\n")
    (tmp_path / "venv").symlink_to(folder)
    launch = tmp_path / "launch.json"
    launch.write_text(json.dumps({"config": "dflash", "runtime_dir": str(folder)}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    body = "sleep 30\n" if hang else f"echo '{version_line or 'systemd 252 (252.33-1~deb12u1)'}'\n"
    (bin_dir / "systemctl").write_text("#!/bin/sh\n" + body)
    (bin_dir / "systemctl").chmod(0o755)
    args = {
        "manager": "auto",
        "host": "gpu-1",
        "systemd_dir": str(systemd_dir),
        "check_systemd_version": True,
        "log_file": "/var/log/kimi/sglang.log",
        "python": str(tmp_path / "venv" / "bin" / "python"),
        "config": "ddtree-b32",
        "config_base": "ddtree",
        "runtime": "sglang@ddtree",
        "launch_record": str(launch),
        "versions_dir": str(versions),
        "kind": "release",
    }
    return args, str(bin_dir), str(folder)


def on_path(monkeypatch, bin_dir: str) -> None:
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_a_supervisor_host_gets_every_fact_of_the_launch_without_systemctl(tmp_path, monkeypatch):
    args, bin_dir, folder = host(tmp_path, hang=True)
    on_path(monkeypatch, bin_dir)
    result = run_module("server_inspect", args)
    assert not result.get("failed"), result
    assert result["manager"] == "supervisor" and result["systemd"] is False
    # No systemd: its version is never asked (the fake one would hang past the deadline).
    assert "systemd_version" not in result
    assert result["python_exists"] is True
    # The link resolves to the version folder the launch runs from.
    assert result["runtime_dir"] == folder
    assert result["previous_runtime"] == {"runtime_dir": folder, "name": VERSION, "built": True}
    assert result["problems"] == [] and result["changed"] is False


def test_a_systemd_host_reads_the_version_and_refuses_one_older_than_240(tmp_path, monkeypatch):
    args, bin_dir, _ = host(tmp_path, systemd=True)
    on_path(monkeypatch, bin_dir)
    result = run_module("server_inspect", args)
    assert not result.get("failed"), result
    found = (result["manager"], result["systemd"], result["systemd_version"])
    assert found == ("systemd", True, 252)

    old = tmp_path / "old"
    old.mkdir()
    args, bin_dir, _ = host(old, systemd=True, version_line="systemd 239 (239-78.el8)")
    on_path(monkeypatch, bin_dir)
    result = run_module("server_inspect", args)
    assert result["failed"] and result["systemd_version"] == 239
    assert "systemd on gpu-1 is 239 (systemd 239 (239-78.el8))" in result["msg"]
    assert "to send the server's output to /var/log/kimi/sglang.log" in result["msg"]
    fix = "Fix: run the server under the kit's supervisor (server_manager: supervisor)"
    assert fix in result["msg"]

    garbled = tmp_path / "garbled"
    garbled.mkdir()
    args, bin_dir, _ = host(garbled, systemd=True, version_line="not a version")
    on_path(monkeypatch, bin_dir)
    result = run_module("server_inspect", args)
    assert result["failed"] and "systemd on gpu-1 is unknown (not a version)" in result["msg"]


def test_a_systemctl_that_hangs_is_killed_at_the_deadline(tmp_path, monkeypatch):
    args, bin_dir, _ = host(tmp_path, systemd=True, hang=True)
    on_path(monkeypatch, bin_dir)
    result = run_module("server_inspect", {**args, "timeout": 0.5})
    assert result["failed"]
    # What was left of the deadline when systemctl started: 0.5 s less the module's own time
    # before it (under load a few ms: "0.497s").
    said = (
        r"server_inspect on gpu-1: `systemctl --version` did not finish within 0\.(5|4\d*)s "
        r"\(what was left of server_inspect's timeout=0\.5s\) and was killed"
    )
    assert re.search(said, result["msg"]), result["msg"]


def test_systemd_asked_for_where_it_does_not_run_fails_with_the_fix(tmp_path, monkeypatch):
    args, bin_dir, _ = host(tmp_path)
    on_path(monkeypatch, bin_dir)
    result = run_module("server_inspect", {**args, "manager": "systemd"})
    assert result["failed"]
    assert result["msg"] == (
        f"server_manager is systemd, but systemd is not PID 1 on gpu-1 ({args['systemd_dir']} "
        "is missing). Fix: set server_manager to auto or supervisor."
    )
    # A link to a folder is not the folder systemd makes at boot (sd_booted's lstat).
    real = tmp_path / "elsewhere"
    real.mkdir()
    os.symlink(real, args["systemd_dir"])
    assert run_module("server_inspect", args)["manager"] == "supervisor"
    # The supervisor asked for on a systemd host is what runs.
    os.unlink(args["systemd_dir"])
    os.mkdir(args["systemd_dir"])
    result = run_module("server_inspect", {**args, "manager": "supervisor"})
    assert result["manager"] == "supervisor" and result["systemd"] is True


def test_a_missing_runtime_fails_naming_the_stage_to_run_except_in_check_mode(tmp_path):
    args, _, _ = host(tmp_path)
    missing = {**args, "python": str(tmp_path / "venv-git" / "bin" / "python")}
    result = run_module("server_inspect", missing)
    assert result["failed"] and result["python_exists"] is False
    assert result["msg"] == (
        f"{missing['python']} does not exist on gpu-1; serving config ddtree-b32 runs on "
        "sglang@ddtree. Fix: run the runtime stage (deploy_kimi.yml, or playbooks/runtime.yml) "
        "with ddtree in kimi_serving_configs."
    )
    # In check mode the runtime stage's own check run installed nothing: not a failure.
    checked = run_module("server_inspect", missing, check_mode=True)
    assert not checked.get("failed") and checked["python_exists"] is False
    # A runtime folder that is no link is the folder itself.
    plain = tmp_path / "plain" / "bin"
    plain.mkdir(parents=True)
    (plain / "python").write_text("")
    result = run_module("server_inspect", {**args, "python": str(plain / "python")})
    assert result["runtime_dir"] == str(tmp_path / "plain")


def test_a_previous_launch_record_that_names_no_version_is_no_rollback_target(tmp_path):
    args, _, _ = host(tmp_path)
    nothing = {"runtime_dir": None, "name": None, "built": False}
    launch = tmp_path / "launch.json"
    for text in (
        "",
        "[1, 2]",
        json.dumps({"runtime_dir": "/etc"}),
        json.dumps({"runtime_dir": str(tmp_path / "runtimes" / ".." / ".." / "x")}),
        json.dumps({"runtime_dir": ["not", "a", "path"]}),
        "{" * 100_000,
    ):
        launch.write_text(text)
        result = run_module("server_inspect", args)
        assert not result.get("failed"), (text[:40], result)
        assert result["previous_runtime"] == nothing, text[:40]
    launch.unlink()
    assert run_module("server_inspect", args)["previous_runtime"] == nothing
    # Without a record to read, nothing is said about the previous launch.
    assert "previous_runtime" not in run_module("server_inspect", {**args, "launch_record": None})
