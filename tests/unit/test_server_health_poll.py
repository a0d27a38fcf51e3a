"""module_utils/server/health.py's judgement of one poll without a server: the process's
status and /health_generate's answer into a state and a progress line (and control.py's
reading of that status when a stop decides whether it has anything to do). test_sglang_sim.py
runs the module against the simulator."""

from __future__ import annotations

import json
import os
import sys

import pytest
from ansible.module_utils.server import health

from tests.support.modules import run_module

PARAMS = {"timeout": 3600, "generate_timeout": 600, "phase": "load", "manager": "systemd"}
RUNNING = {"running": True, "failed": False, "restarts": 0, "status": "active", "last_exit": 0}


def test_a_stopped_or_restarted_process_is_a_failure():
    params = {**PARAMS, "restarts_before": 1}
    stopped = {**RUNNING, "running": False, "status": "inactive", "last_exit": 1}
    assert health.process_problem(params, stopped) == (
        "the server is not running (manager systemd: inactive, last exit status 1)"
    )
    restarted = {**RUNNING, "restarts": 3}
    assert health.process_problem(params, restarted) == (
        "the server crashed while starting and was restarted 2 time(s)"
    )
    assert health.process_problem(params, {**RUNNING, "restarts": 1}) == ""


def test_the_answer_is_judged_into_a_state():
    judge = health.judge_answer
    assert judge(PARAMS, 12.0, "log", 200, "", True) == ("healthy", "healthy after 12 s", "")
    state, progress, message = judge(PARAMS, 30.0, "Loading safetensors", None, "refused", False)
    assert (state, message) == ("loading", "")
    assert progress == "loading: 30 s of 3600 s, /health_generate refused; log: Loading safetensors"
    generate = {**PARAMS, "phase": "generate"}
    state, progress, message = judge(generate, 40.0, "warmup", 503, "HTTP 503", True)
    assert state == "answering" and message == ""
    assert progress.startswith(
        "loaded, not generating yet: 40 s of 600 s, /health_generate HTTP 503"
    )
    state, progress, message = judge(generate, 600.0, "warmup", 503, "HTTP 503", True)
    assert state == "failed" and progress == message
    assert "has not generated a token in 600 s" in message


def test_a_poll_of_a_failed_process_does_not_probe(monkeypatch, tmp_path):
    def no_probe(url, api_key):
        raise AssertionError("probed a server that is not running")

    monkeypatch.setattr(health, "probe", no_probe)
    monkeypatch.setattr(health, "systemd_status", lambda run, name: {**RUNNING, "failed": True})
    log = tmp_path / "server.log"
    log.write_text("started with --api-key sk-secret\n")
    params = {
        **PARAMS,
        "name": "kimi-sglang",
        "api_key": "sk-secret",
        "log_file": str(log),
        "log_lines": 40,
        "since": 0,
        "restarts_before": 0,
        "url": "http://127.0.0.1:1",
    }
    result = health.poll(params, run=None)
    assert result["state"] == "failed" and result["http_status"] is None
    assert result["elapsed"] == 0.0
    assert all("sk-secret" not in line for line in result["log_tail"])


def test_a_wait_polls_until_the_state_changes_or_its_window_ends(monkeypatch):
    """One module run stands for the until loop's retries: it returns at the first poll out of
    the phase's waiting state, or the last poll when the window ends."""
    states = iter(["loading", "loading", "answering", "healthy"])
    polls = []

    def poll(params, run):
        polls.append(params["phase"])
        return {"state": next(states)}

    now = [0.0]
    monkeypatch.setattr(health, "poll", poll)
    sleep = lambda seconds: now.__setitem__(0, now[0] + seconds)  # noqa: E731
    clock = lambda: now[0]  # noqa: E731
    load = {"phase": "load", "wait_s": 30, "poll_s": 2}
    assert health.wait(load, None, clock, sleep) == {"state": "answering"}
    assert polls == ["load"] * 3 and now[0] == 4
    # A window shorter than a poll interval polls once; a state that holds ends with the window.
    states = iter(["answering"] * 100)
    polls.clear()
    assert health.wait({**load, "phase": "generate", "wait_s": 1}, None, clock, sleep) == {
        "state": "answering"
    }
    assert len(polls) == 1
    polls.clear()
    assert health.wait({**load, "phase": "generate", "wait_s": 10}, None, clock, sleep)
    assert len(polls) == 5  # at 0, 2, 4, 6, 8 s: the next would start at the window's end
    states = iter(["failed"])
    assert health.wait({**load, "wait_s": 0}, None, clock, sleep) == {"state": "failed"}


def test_a_stop_cancels_a_units_pending_automatic_restart():
    """A multi-node rank exits when its head stops (NCCL's abort) and systemd schedules its
    restart: between the two the unit has no PID, and a stop that saw nothing to stop left it to
    start again after the teardown (tests/integration/test_server.py's two-node teardown)."""
    from ansible.module_utils.server.control import stop_needed, systemd_status

    def shown(active: str, sub: str, pid: int):
        text = f"LoadState=loaded\nActiveState={active}\nSubState={sub}\nMainPID={pid}\n"
        return systemd_status(lambda argv: (0, text, ""), "kimi-sglang")

    assert stop_needed(shown("active", "running", 975))
    assert stop_needed(shown("activating", "auto-restart", 0))
    assert not stop_needed(shown("inactive", "dead", 0))
    # A rank whose restarts were spent before the stop: still enabled, and failed.
    assert stop_needed(shown("failed", "failed", 0))
    supervised = {"manager": "supervisor", "running": False, "status": "stopped"}
    assert not stop_needed(supervised)
    assert stop_needed({**supervised, "running": True})


# A systemctl that answers `show` with the unit in the state the test gives and logs every
# command it is given.
FAKE_SYSTEMCTL = """#!{python}
import json, sys
with open({log!r}, "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1] == "show":
    print("LoadState=loaded\\nActiveState={active}\\nSubState={sub}\\nMainPID=0")
    print("UnitFileState=enabled\\nNRestarts=5\\nExecMainStatus=1")
"""


@pytest.mark.parametrize(
    ("active", "sub", "commands"),
    [
        (
            "failed",
            "failed",
            [["disable", "--now", "kimi-sglang"], ["reset-failed", "kimi-sglang"]],
        ),
        (
            "activating",
            "auto-restart",
            [["disable", "--now", "kimi-sglang"], ["reset-failed", "kimi-sglang"]],
        ),
        ("inactive", "dead", []),
    ],
)
def test_teardown_leaves_a_failed_rank_inactive_and_disabled(
    tmp_path, monkeypatch, active, sub, commands
):
    """A two-node server's rank whose restarts were spent before teardown came (its head
    stopped first) is a failed, still enabled unit: the stop disables it and resets its failed
    state, so the host ends with the unit inactive (a fresh-clone run of
    tests/integration/test_server.py's two-node teardown found it failed); a stopped unit is
    left alone."""
    log = tmp_path / "systemctl.log"
    fake = tmp_path / "bin" / "systemctl"
    fake.parent.mkdir()
    fake.write_text(
        FAKE_SYSTEMCTL.format(python=sys.executable, log=str(log), active=active, sub=sub)
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    args = {"manager": "systemd", "name": "kimi-sglang", "state": "stopped"}
    result = run_module("server_service", args)
    assert not result.get("failed"), result
    assert result["action"] == ("stopped" if commands else "none")
    assert result["changed"] is bool(commands)
    given = [json.loads(line) for line in log.read_text().splitlines()]
    assert [argv for argv in given if argv[0] != "show"] == commands
