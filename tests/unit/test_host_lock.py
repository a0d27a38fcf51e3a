"""The per-host lock without hosts: take, re-enter, refuse a live holder, take over a gone one,
break, concurrent takers; the module; and the playbooks that wire it in."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.host import lock as host_lock

from tests.support.modules import run_module

REPO = Path(__file__).resolve().parents[2]
CONTROLLER = socket.gethostname()


def proc_stat(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""


def start_time(pid: int) -> int:
    return int(proc_stat(pid).rsplit(")", 1)[1].split()[19])


def holder(run_id: str, pid: int | None = None, controller: str = CONTROLLER, **extra) -> dict:
    """A holder as the controller's callback describes its run: by default this process."""
    pid = pid or os.getpid()
    if "pid_start" not in extra:
        extra["pid_start"] = start_time(pid) if controller == CONTROLLER else 12345
    return {
        "controller": controller,
        "user": "ops",
        "playbook": "deploy_kimi.yml",
        "run_id": run_id,
        "pid": pid,
        "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        "machine_id": "a" * 32,
        **extra,
    }


def dead_pid() -> tuple[int, int]:
    """A pid whose process has exited and been reaped, with its start time."""
    child = subprocess.Popen(["sleep", "30"])
    began = start_time(child.pid)
    child.kill()
    child.wait(timeout=10)
    return child.pid, began


@pytest.fixture
def lock_path(tmp_path):
    return str(tmp_path / "state" / "lock" / "lock.json")


def test_take_writes_a_root_only_lock_naming_the_holder(lock_path):
    me = holder("a1")
    result = host_lock.acquire(lock_path, me)
    assert result["acquired"] and result["previous"] is None
    record = json.loads(Path(lock_path).read_text())
    assert {key: record[key] for key in me} == me
    assert record["since"].endswith("Z") and isinstance(record["since_epoch"], (int, float))
    assert stat.S_IMODE(os.stat(lock_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(lock_path)).st_mode) == 0o700


def test_the_same_run_re_enters_without_rewriting(lock_path):
    host_lock.acquire(lock_path, holder("a1"))
    before = Path(lock_path).read_bytes(), os.stat(lock_path).st_ino
    # The benchmark runs the server role, and a deploy imports five stages: one run, one holder.
    again = host_lock.acquire(lock_path, holder("a1"))
    assert again["acquired"] and again["reentered"]
    assert (Path(lock_path).read_bytes(), os.stat(lock_path).st_ino) == before


def test_a_live_holder_on_this_controller_is_refused_with_its_details(lock_path):
    other = subprocess.Popen(["sleep", "30"])
    try:
        theirs = holder("b2", pid=other.pid, user="alice", playbook="benchmark_kimi.yml")
        host_lock.acquire(lock_path, theirs)
        first = host_lock.acquire(lock_path, holder("a1"))
        # Whether that pid lives is known only on the controller: ask it, then decide.
        assert not first["acquired"] and first["same_controller"]
        assert first["holder"]["pid"] == other.pid
        with pytest.raises(host_lock.LockHeld) as refused:
            host_lock.acquire(
                lock_path,
                holder("a1"),
                takeover={"run_id": "b2", "proc_stat": proc_stat(other.pid)},
            )
        said = str(refused.value)
        for detail in (CONTROLLER, "alice", "benchmark_kimi.yml", "b2", str(other.pid)):
            assert detail in said
        assert json.loads(Path(lock_path).read_text())["since"] in said
        assert "kimi_break_lock=true" in said
        assert json.loads(Path(lock_path).read_text())["run_id"] == "b2"
    finally:
        other.kill()
        other.wait(timeout=10)


def test_a_holder_on_another_controller_counts_as_live(lock_path):
    host_lock.acquire(lock_path, holder("b2", pid=4242, controller="elsewhere"))
    with pytest.raises(host_lock.LockHeld) as refused:
        host_lock.acquire(lock_path, holder("a1"))
    said = str(refused.value)
    assert "elsewhere" in said and "4242" in said and "kimi_break_lock=true" in said
    assert "cannot be told from here" in said


def test_another_machine_with_this_hostname_is_another_controller(lock_path):
    # Two machines named alike: this one's /proc says nothing about the other's pids, and
    # their boot ids differ without either having rebooted.
    host_lock.acquire(lock_path, holder("b2", machine_id="f" * 32, boot_id="0" * 36))
    with pytest.raises(host_lock.LockHeld) as refused:
        host_lock.acquire(lock_path, holder("a1"))
    assert "cannot be told from here" in str(refused.value)


@pytest.mark.parametrize("how", ["exited", "pid reused", "zombie", "controller rebooted"])
def test_a_gone_holder_is_taken_over_with_a_note(lock_path, how):
    zombie = None
    if how == "exited":
        pid, began = dead_pid()
        theirs = holder("b2", pid=pid, pid_start=began)
        seen = proc_stat(pid)
    elif how == "pid reused":
        # The pid now names another process: its start time differs.
        theirs = holder("b2")
        theirs["pid_start"] -= 1
        seen = proc_stat(os.getpid())
    elif how == "zombie":
        zombie = subprocess.Popen(["true"])
        deadline = time.monotonic() + 10
        while "Z" not in proc_stat(zombie.pid).rsplit(")", 1)[-1][:3]:
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.02)
        theirs = holder("b2", pid=zombie.pid)
        seen = proc_stat(zombie.pid)
    else:
        theirs = holder("b2", boot_id="0" * 36)
        seen = proc_stat(os.getpid())
    try:
        host_lock.acquire(lock_path, theirs)
        first = host_lock.acquire(lock_path, holder("a1"))
        if how == "controller rebooted":
            # Decided on the host: a pid from an earlier boot of this controller is gone.
            result = first
        else:
            assert not first["acquired"]
            result = host_lock.acquire(
                lock_path, holder("a1"), takeover={"run_id": "b2", "proc_stat": seen}
            )
    finally:
        if zombie:
            zombie.wait(timeout=10)
    assert result["acquired"]
    assert result["previous"]["run_id"] == "b2"
    assert "took over" in result["note"] and "b2" in result["note"]
    assert str(theirs["pid"]) in result["note"]
    assert json.loads(Path(lock_path).read_text())["run_id"] == "a1"


def test_a_takeover_judged_on_an_older_holder_does_not_replace_a_newer_one(lock_path):
    pid, began = dead_pid()
    gone = holder("b2", pid=pid, pid_start=began)
    host_lock.acquire(lock_path, gone)
    # Between the look and the takeover, a third run took over the dead holder's lock.
    host_lock.acquire(lock_path, holder("c3"), takeover={"run_id": "b2", "proc_stat": ""})
    with pytest.raises(host_lock.LockHeld) as refused:
        host_lock.acquire(lock_path, holder("a1"), takeover={"run_id": "b2", "proc_stat": ""})
    assert "c3" in str(refused.value)


def test_a_controller_without_proc_cannot_judge_and_is_refused(lock_path):
    pid, began = dead_pid()
    host_lock.acquire(lock_path, holder("b2", pid=pid, pid_start=began))
    with pytest.raises(host_lock.LockHeld) as refused:
        host_lock.acquire(lock_path, holder("a1"), takeover={"run_id": "b2", "proc_stat": None})
    assert "cannot be told" in str(refused.value) and "kimi_break_lock=true" in str(refused.value)


def test_break_takes_a_live_lock_and_says_so(lock_path):
    host_lock.acquire(lock_path, holder("b2", controller="elsewhere", user="alice"))
    result = host_lock.acquire(lock_path, holder("a1"), break_lock=True)
    assert result["acquired"] and result["previous"]["run_id"] == "b2"
    assert "broke" in result["note"] and "alice" in result["note"] and "elsewhere" in result["note"]
    assert json.loads(Path(lock_path).read_text())["run_id"] == "a1"


def test_an_unreadable_lock_is_refused_unless_broken(lock_path):
    os.makedirs(os.path.dirname(lock_path), mode=0o700)
    Path(lock_path).write_text('{"run_id": 7}')
    with pytest.raises(host_lock.LockHeld) as refused:
        host_lock.acquire(lock_path, holder("a1"))
    assert lock_path in str(refused.value) and "kimi_break_lock=true" in str(refused.value)
    assert host_lock.acquire(lock_path, holder("a1"), break_lock=True)["acquired"]


def test_release_removes_only_its_own_lock(lock_path):
    host_lock.acquire(lock_path, holder("a1"))
    assert host_lock.release(lock_path, holder("b2"))["released"] is False
    assert Path(lock_path).exists()
    assert host_lock.release(lock_path, holder("a1"))["released"] is True
    assert not Path(lock_path).exists()
    assert host_lock.release(lock_path, holder("a1"))["released"] is False


def test_check_mode_writes_nothing(lock_path):
    result = host_lock.acquire(lock_path, holder("a1"), check_mode=True)
    assert result["acquired"] and not Path(lock_path).exists()
    host_lock.acquire(lock_path, holder("a1"))
    assert host_lock.release(lock_path, holder("a1"), check_mode=True)["released"]
    assert Path(lock_path).exists()


def _take(path: str, run_id: str, barrier, results) -> None:
    """One taker in its own process: all of them start together at the barrier."""
    try:
        barrier.wait(timeout=20)
        result = host_lock.acquire(path, holder(run_id), wait_s=20)
        results.put((run_id, result["acquired"], result["holder"]["run_id"]))
    except BaseException as err:  # the parent reports whatever went wrong
        results.put((run_id, None, repr(err)))
    finally:
        os._exit(0)


def test_concurrent_takers_exactly_one_wins(lock_path):
    os.makedirs(os.path.dirname(lock_path), mode=0o700)
    context = multiprocessing.get_context("fork")
    takers = 8
    for _attempt in range(3):
        if os.path.exists(lock_path):
            os.unlink(lock_path)
        barrier, results = context.Barrier(takers), context.SimpleQueue()
        processes = [
            context.Process(target=_take, args=(lock_path, f"r{i}", barrier, results))
            for i in range(takers)
        ]
        for process in processes:
            process.start()
        deadline = time.monotonic() + 60
        for process in processes:
            process.join(timeout=max(0.1, deadline - time.monotonic()))
        stuck = [process for process in processes if process.is_alive()]
        for process in stuck:
            process.kill()
            process.join(timeout=10)
        assert not stuck, "a taker hung"
        outcome = [results.get() for _ in range(takers)]
        assert all(won is not None for _, won, _ in outcome), outcome
        winners = [run_id for run_id, won, _ in outcome if won]
        assert len(winners) == 1, outcome
        assert json.loads(Path(lock_path).read_text())["run_id"] == winners[0]
        # Every loser was shown the winner (a live holder on this controller: the first pass
        # hands it back for the controller to judge).
        assert all(won or seen == winners[0] for _, won, seen in outcome)


def test_holder_fields_are_type_checked():
    with pytest.raises(host_lock.LockError, match="pid"):
        host_lock.acquire("/nonexistent/lock.json", {**holder("a1"), "pid": "12"})
    with pytest.raises(host_lock.LockError, match="run_id"):
        host_lock.acquire("/nonexistent/lock.json", {**holder("a1"), "run_id": ""})


# The module, as Ansible runs it.


def test_module_takes_and_releases_without_reporting_a_change(lock_path):
    args = {"path": lock_path, "holder": holder("a1")}
    taken = run_module("host_lock", args)
    assert taken["acquired"] and taken["changed"] is False, taken
    assert run_module("host_lock", args)["changed"] is False
    released = run_module("host_lock", {**args, "state": "absent"})
    assert released["released"] and released["changed"] is False
    assert not Path(lock_path).exists()


def test_module_refuses_a_live_holder_and_warns_on_a_break(lock_path):
    run_module("host_lock", {"path": lock_path, "holder": holder("b2", controller="elsewhere")})
    refused = run_module("host_lock", {"path": lock_path, "holder": holder("a1")})
    assert refused["failed"] and "elsewhere" in refused["msg"]
    assert refused["holder"]["run_id"] == "b2"
    broken = run_module(
        "host_lock", {"path": lock_path, "holder": holder("a1"), "break_lock": True}
    )
    assert broken["acquired"] and not broken.get("failed")
    # ansible-core 2.19 returns warnings as structured summaries: look at their text.
    assert "elsewhere" in json.dumps(broken["warnings"]), broken


def test_module_check_mode_writes_nothing(lock_path):
    result = run_module("host_lock", {"path": lock_path, "holder": holder("a1")}, check_mode=True)
    assert result["acquired"] and not os.path.exists(lock_path)


# The wiring: which playbooks take the lock, and where.

# deploy_kimi.yml is one rolling play that takes and releases the lock in each batch: its
# wiring is checked in test_rollout_batches.py.
ENTRY = ["benchmark_kimi.yml", "teardown.yml"]
STAGES = ["preflight", "runtime", "canary", "weights", "tuning", "server", "benchmark", "teardown"]


# Modules that run on the controller alone: a play of only these does not act on a host.
CONTROLLER_ONLY = {"ansible.builtin.debug", "ansible.builtin.set_fact", "ansible.builtin.assert"}


def expand(
    path: Path, inherited: dict | None = None, with_summaries: bool = False
) -> list[tuple[str, dict]]:
    """The plays a playbook runs, in order, with the vars its imports hand them; the closing
    summary plays (only debug and the like: they never act on a host) left out."""
    plays = []
    for entry in yaml.safe_load(path.read_text()):
        imported = entry.get("ansible.builtin.import_playbook") or entry.get("import_playbook")
        given = {**(inherited or {}), **entry.get("vars", {})}
        if imported:
            plays += expand(path.parent / imported, given, with_summaries)
        elif with_summaries or not only_on_the_controller(entry):
            plays.append((entry["name"], {**entry.get("vars", {}), **given}))
    return plays


def only_on_the_controller(play: dict) -> bool:
    tasks = [*play.get("pre_tasks", []), *play.get("tasks", []), *play.get("post_tasks", [])]
    return (
        bool(tasks) and not play.get("roles") and all(set(task) & CONTROLLER_ONLY for task in tasks)
    )


@pytest.mark.parametrize("playbook", ["benchmark_kimi.yml"])
def test_the_closing_summaries_come_after_the_release_and_act_on_no_host(playbook):
    names = [name for name, _ in expand(REPO / playbook, with_summaries=True)]
    released = len(names) - 1 - names[::-1].index(host_lock.RELEASE_PLAY)
    assert names[released + 1 :], "a summary closes the run"
    acting = [name for name, _ in expand(REPO / playbook)]
    # Before the release, only plays on the controller (checks of the run's inputs) beside them.
    assert [name for name in names[: released + 1] if name in acting] == acting


@pytest.mark.parametrize("playbook", ENTRY + [f"playbooks/{stage}.yml" for stage in STAGES])
def test_every_playbook_that_acts_on_hosts_holds_the_lock_throughout(playbook):
    plays = expand(REPO / playbook)
    names = [name for name, _ in plays]
    assert names[0] == host_lock.TAKE_PLAY, names
    assert names[-1] == host_lock.RELEASE_PLAY, names
    assert not plays[-1][1].get("kimi_lock_keep"), "the last release must release"
    # No release in the middle lets another run in between two stages of one deploy.
    for name, given in plays[:-1]:
        if name == host_lock.RELEASE_PLAY:
            assert given.get("kimi_lock_keep") is True, playbook


def test_plan_does_not_touch_the_lock():
    names = [name for name, _ in expand(REPO / "plan.yml")]
    assert host_lock.TAKE_PLAY not in names and host_lock.RELEASE_PLAY not in names
