"""module_utils/canary/serve_actions.py: the canary_serve module's actions on their parameters,
without Ansible and without a server (the GPUs and the server's state stood in for);
test_canary.py runs the module itself and one canary against the simulator."""

from __future__ import annotations

import json
import os

import pytest
from ansible.module_utils.canary import serve_actions
from ansible.module_utils.canary.serve_inputs import CanaryError

PYTHON = "/opt/kimi/runtime/current/bin/python"
GPUS = {
    "uuids": ["GPU-00000000-0000-0000-0000-000000000000"],
    "driver": "580.1",
    "compute_capability": "9.0",
}
# The module's parameters as AnsibleModule fills them in with its defaults.
DEFAULTS = {
    "action": "plan",
    "record": "",
    "configs": [],
    "checkpoints": {},
    "rerun": False,
    "server": {},
    "config": None,
    "secret_environment": {},
    "identity": None,
    "log_dir": None,
    "host": "127.0.0.1",
    "port": 30100,
    "timeout": 900.0,
    "grace": 10.0,
    "chat_template_kwargs": {},
    "secrets": [],
    "capabilities": {},
    "backends": {},
    "compute_capability": "",
    "skip_reason": "",
    "names": [],
    "results": {},
    "facts": {},
}


def launch(name: str) -> dict:
    argv = [PYTHON, "-m", "sglang.launch_server", "--model-path", "/m"]
    return {"name": name, "argv": argv, "environment": {"HF_TOKEN": "hf_x"}}


def params(tmp_path, **changes) -> dict:
    return {**DEFAULTS, "record": str(tmp_path / "canary.json"), **changes}


@pytest.fixture
def gpus(monkeypatch):
    monkeypatch.setattr(serve_actions, "gpu_facts", lambda: GPUS)


def test_plan_runs_every_config_without_a_record_and_reports_gpus_and_server(tmp_path, gpus):
    result = serve_actions.act(params(tmp_path, configs=[launch("ar"), launch("dflash")]), False)
    assert result["changed"] is False
    assert result["to_run"] == ["ar", "dflash"]
    assert set(result["identities"]) == {"ar", "dflash"}
    assert result["gpus"] == {"count": 1, "driver": "580.1", "compute_capability": "9.0"}
    assert (result["server_active"], result["server_status"]) == (False, "not asked")


def test_plan_refuses_a_bad_launch(tmp_path, gpus):
    with pytest.raises(CanaryError, match="argv must be the rendered launch"):
        serve_actions.plan_action(params(tmp_path, configs=[{"name": "ar", "argv": ["x"]}]))


def test_a_supervised_server_without_its_files_is_not_running(tmp_path):
    server = {"manager": "supervisor", "pid_file": str(tmp_path / "pid"),
              "state_file": str(tmp_path / "state.json")}  # fmt: skip
    assert serve_actions.server_active(server) == (False, "absent")
    (tmp_path / "pid").write_text(str(os.getpid()))
    state = {"supervisor_pid": os.getpid(), "status": "running"}
    (tmp_path / "state.json").write_text(json.dumps(state))
    assert serve_actions.server_active(server) == (True, "running")


def test_run_needs_identity_log_dir_and_a_timeout_in_range(tmp_path):
    base = params(tmp_path, action="run", config=launch("ar"))
    with pytest.raises(CanaryError, match="needs identity"):
        serve_actions.act(base, False)
    base.update(identity="a" * 64, log_dir=str(tmp_path / "logs"))
    for timeout in (0.0, 3600.5):
        with pytest.raises(CanaryError) as error:
            serve_actions.act({**base, "timeout": timeout}, False)
        assert str(error.value) == (
            f"timeout is {timeout:g}; needed: seconds above 0 up to 3600. Fix: "
            "kimi_canary_timeout_s."
        )


def test_run_skips_with_a_reason_or_in_check_mode_and_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(serve_actions, "run_one", lambda spec: pytest.fail("started"))
    base = params(tmp_path, action="run", config=launch("ar"), identity="a" * 64,
                  log_dir=str(tmp_path / "logs"))  # fmt: skip
    result = serve_actions.act({**base, "skip_reason": "the server holds the GPUs"}, False)
    assert (result["changed"], result["name"]) == (False, "ar")
    entry = result["entry"]
    assert (entry["state"], entry["reason"]) == ("skipped", "the server holds the GPUs")
    assert entry["log"] == f"{tmp_path}/logs/ar.log"
    checked = serve_actions.act(base, True)["entry"]
    assert (checked["state"], checked["reason"]) == ("skipped", "check mode: nothing started")
    assert not (tmp_path / "logs").exists()


def test_run_hands_run_one_the_parameters(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(serve_actions, "run_one", lambda spec: seen.update(spec) or {"state": "ok"})
    base = params(tmp_path, action="run", config=launch("ar"), identity="a" * 64,
                  log_dir="/logs", secret_environment={"HF_TOKEN": 7}, timeout=60.0)  # fmt: skip
    assert serve_actions.act(base, False) == {
        "changed": True,
        "name": "ar",
        "entry": {"state": "ok"},
    }
    assert seen["secret_environment"] == {"HF_TOKEN": "7"}
    assert (seen["log"], seen["timeout_s"], seen["grace_s"]) == ("/logs/ar.log", 60.0, 10.0)
    assert seen["config"] == launch("ar") and seen["identity"] == "a" * 64


def test_record_writes_when_changed_and_check_mode_only_compares(tmp_path):
    entry = serve_actions.run_action(
        params(
            tmp_path,
            action="run",
            config=launch("ar"),
            identity="a" * 64,
            log_dir="/logs",
            skip_reason="held",
        ),
        False,
    )["entry"]
    args = params(tmp_path, action="record", names=["ar"], results={"ar": entry},
                  facts={"host": "h"})  # fmt: skip
    checked = serve_actions.act(args, True)
    assert checked["changed"] is True and not (tmp_path / "canary.json").exists()
    written = serve_actions.act(args, False)
    assert written["changed"] is True and written["canary"]["skipped"] == ["ar"]
    assert written["summary"]["lines"] == [
        "Canary: 0 of 1 serving configs passed.",
        "ar: skipped: held",
    ]
    assert serve_actions.act({**args, "results": {}}, False)["changed"] is False
    assert serve_actions.act({**args, "results": {}}, True)["changed"] is False
