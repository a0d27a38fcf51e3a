"""A kit module's logic run inside ansible-playbook's worker (module_utils/host/in_process.py,
the study_lock action plugin): the same answer as the module's own run for the same arguments,
the same refusals of bad arguments, and no_log values masked as exit_json masks them."""

from __future__ import annotations

import shutil

import pytest
from ansible.module_utils.host.in_process import TaskError, run_in_process
from ansible.module_utils.plan import study_lock_task as task

from tests.support.modules import run_module

A = "a" * 40
TARGET = "moonshotai/Kimi-K2.6"
REQUESTED = {"weights": {TARGET: "main"}, "datasets": {}, "git": {}}


def both(tmp_path, args: dict, check_mode: bool = False) -> tuple[dict, dict]:
    """The module's result and the in-process one for args, each on its own copy of the lock
    folder as it was before."""
    module_dir, process_dir = tmp_path / "module", tmp_path / "process"
    shutil.copytree(tmp_path / "lock", module_dir)
    shutil.copytree(tmp_path / "lock", process_dir)
    module = run_module(
        "study_lock", {**args, "path": str(module_dir / "kimi.lock.yml")}, check_mode=check_mode
    )
    process = run_in_process(
        "study_lock",
        task.SPEC,
        {**args, "path": str(process_dir / "kimi.lock.yml")},
        task.act,
        check_mode,
        **task.RULES,
    )
    shutil.rmtree(module_dir)
    shutil.rmtree(process_dir)
    return module, process


# What exit_json adds to any result: the arguments, and the file's attributes where the result
# names a path (AnsibleModule.add_path_info); nothing of the kit reads them.
ADDED_BY_EXIT_JSON = {"invocation", "uid", "gid", "owner", "group", "mode", "state", "size"}


def same(module: dict, process: dict) -> None:
    """Equal but for the paths, which differ by the copy's folder."""
    kept = {key: value for key, value in module.items() if key not in ADDED_BY_EXIT_JSON}
    assert repr(kept).replace("/module/", "/X/") == repr(process).replace("/process/", "/X/")


@pytest.mark.parametrize("check_mode", [False, True])
def test_record_then_read_answer_as_the_module_does(tmp_path, check_mode):
    (tmp_path / "lock").mkdir()
    record = {"action": "record", "requested": [REQUESTED], "known": [{"weights": {TARGET: A}}]}
    module, process = both(tmp_path, record, check_mode)
    same(module, process)
    # Written (in check mode: would be), and no change reported: the run's bookkeeping.
    assert process["written"] is True and process["changed"] is False
    # Now with the lock a first record wrote.
    lock = str(tmp_path / "lock" / "kimi.lock.yml")
    wrote = run_in_process("study_lock", task.SPEC, {**record, "path": lock}, task.act, False)
    assert wrote["written"]
    module, process = both(tmp_path, {"action": "read", "requested": [REQUESTED]})
    same(module, process)
    assert process["pins"]["weights"] == {TARGET: A}


def test_bad_arguments_are_refused_as_the_module_refuses_them(tmp_path):
    (tmp_path / "lock").mkdir()
    for args in (
        {"action": "forget"},
        {"action": "record_runtime"},
        {"action": "read", "requested": "not a list"},
    ):
        module, process = both(tmp_path, args)
        assert module["failed"] and process["failed"], (module, process)
        assert process["msg"].startswith("study_lock: ")
        # The module's own wording of the same refusal.
        assert process["msg"].removeprefix("study_lock: ") == module["msg"], args


def test_no_log_values_never_reach_the_result():
    spec = {"token": {"type": "str", "no_log": True}, "say": {"type": "str"}}

    def echo(p, _check):
        if p["say"] == "fail":
            raise TaskError(f"the hub refused {p['token']}", token_seen=p["token"])
        return {"changed": False, "said": f"with {p['token']}"}

    done = run_in_process("echo", spec, {"token": "hf_secret_value", "say": "ok"}, echo, False)
    assert done == {"changed": False, "said": "with ********"}
    failed = run_in_process("echo", spec, {"token": "hf_secret_value", "say": "fail"}, echo, False)
    # A value that is the secret itself is replaced whole, as exit_json replaces it.
    assert failed == {
        "failed": True,
        "msg": "the hub refused ********",
        "token_seen": "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER",
    }
