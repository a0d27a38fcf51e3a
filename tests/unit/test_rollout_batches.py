"""Rolling deploys (module_utils/host/rollout.py, the kimi_rollout filter): which hosts go through
every stage together, in what order, and what a bad kimi_deploy_serial says."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible.module_utils.host.rollout import RolloutError, rollout, serial_size

from tests.support.modules import load_filters

REPO = Path(__file__).resolve().parents[2]

# Inventory order a1, c2, b1, c1, d1; c1 and c2 run one two-node server (c1 is its head).
GROUPS = {
    "all": ["a1", "c2", "b1", "c1", "d1", "o1"],
    "ungrouped": [],
    "gpu_hosts": ["a1", "c2", "b1", "c1", "d1"],
    "ct200": ["a1", "c2", "b1", "c1", "d1"],
    "kimi_cluster_pair": ["c1", "c2"],
    "other": ["o1"],
}
EVERY_HOST = GROUPS["all"]


def plan(serial, groups=GROUPS, present=EVERY_HOST) -> dict:
    return rollout(serial, groups, "gpu_hosts", present)


def test_unset_is_one_batch_in_inventory_order():
    found = plan(None)
    assert found["rolling"] is False
    assert found["hosts"] == ["a1", "c2", "b1", "c1", "d1"]
    # No serial: Ansible runs every host of the play at once.
    assert found["serial"] == []
    assert found["batches"] == [found["hosts"]]


def test_one_at_a_time_keeps_the_cluster_together_at_its_first_member():
    found = plan(1)
    # The pair is larger than 1: it goes alone, head first, where its first member stood.
    assert found["batches"] == [["a1"], ["c1", "c2"], ["b1"], ["d1"]]
    assert found["serial"] == [1, 2, 1, 1]
    assert found["hosts"] == ["a1", "c1", "c2", "b1", "d1"]
    assert found["batch_of"] == {"a1": 0, "c1": 1, "c2": 1, "b1": 2, "d1": 3}


@pytest.mark.parametrize(
    ("serial", "batches"),
    [
        # A batch takes whole units up to N hosts; one that would pass N starts the next.
        (2, [["a1"], ["c1", "c2"], ["b1", "d1"]]),
        (3, [["a1", "c1", "c2"], ["b1", "d1"]]),
        (4, [["a1", "c1", "c2", "b1"], ["d1"]]),
        # N larger than the fleet: one batch, in the rolling order.
        (50, [["a1", "c1", "c2", "b1", "d1"]]),
        ("2", [["a1"], ["c1", "c2"], ["b1", "d1"]]),
        (" 3 ", [["a1", "c1", "c2"], ["b1", "d1"]]),
    ],
)
def test_batches_take_whole_units_up_to_n_hosts(serial, batches):
    found = plan(serial)
    assert found["batches"] == batches
    assert found["serial"] == [len(batch) for batch in batches]
    assert sum(found["serial"]) == len(GROUPS["gpu_hosts"])


def test_a_cluster_larger_than_n_goes_alone_and_is_never_split():
    groups = {
        **GROUPS,
        "gpu_hosts": ["a1", "x1", "x2", "x3", "b1"],
        "kimi_cluster_big": ["x3", "x1", "x2"],
    }
    everyone = [*groups["gpu_hosts"], "o1"]
    for serial in (1, 2):
        found = plan(serial, groups, everyone)
        assert ["x3", "x1", "x2"] in found["batches"], found
    assert plan(2, groups, everyone)["batches"] == [["a1"], ["x3", "x1", "x2"], ["b1"]]


def test_order_is_stable_and_follows_the_inventory():
    reordered = {**GROUPS, "gpu_hosts": ["d1", "b1", "c1", "a1", "c2"]}
    found = plan(1, reordered)
    assert found["hosts"] == ["d1", "b1", "c1", "c2", "a1"]
    assert plan(1, reordered) == found


def test_limit_leaves_hosts_out_and_keeps_what_is_left_of_a_cluster():
    # --limit c2,b1,d1,o1: the head c1 is left out; c2 goes on its own, o1 is not a GPU host.
    found = plan(2, present=["c2", "b1", "d1", "o1"])
    assert found["batches"] == [["c2", "b1"], ["d1"]]
    assert plan(None, present=["o1"])["batches"] == []


def test_a_host_in_two_clusters_is_refused_even_without_rolling():
    groups = {**GROUPS, "kimi_cluster_other": ["b1", "c2"]}
    with pytest.raises(
        RolloutError,
        match=r"c2 is in two multi-node server groups, "
        r"kimi_cluster_other and kimi_cluster_pair.*Fix: keep it in one",
    ):
        plan(None, groups)
    # A cluster group that names a host outside the play is no concern of this play.
    outside = {**GROUPS, "kimi_cluster_far": ["o1", "c2"]}
    assert plan(1, outside, present=["a1", "b1", "o1"])["batches"] == [["a1"], ["b1"]]


@pytest.mark.parametrize("value", [0, -1, "0", "-1", "abc", "1.5", 1.5, [1], "", True, "1e3"])
def test_a_bad_serial_names_the_value_what_is_needed_and_the_fix(value):
    with pytest.raises(RolloutError) as caught:
        plan(value)
    said = str(caught.value)
    assert said.startswith(f"kimi_deploy_serial is {value!r}: needed a whole number of hosts")
    assert "Fix: give a number of hosts, e.g. -e kimi_deploy_serial=2" in said


@pytest.mark.parametrize(("value", "size"), [(None, None), (1, 1), ("7", 7), (" 12 ", 12)])
def test_serial_size_takes_text_and_numbers(value, size):
    assert serial_size(value) == size


def test_the_filter_hands_over_the_plan_and_turns_errors_into_filter_errors():
    filters = load_filters().FilterModule().filters()
    assert filters["kimi_rollout"](GROUPS, "1", "gpu_hosts", EVERY_HOST) == plan(1)
    with pytest.raises(AnsibleFilterError, match="kimi_deploy_serial is 'abc'"):
        filters["kimi_rollout"](GROUPS, "abc", "gpu_hosts", EVERY_HOST)
    with pytest.raises(AnsibleFilterError, match="must be a list of host names"):
        filters["kimi_rollout"]({**GROUPS, "gpu_hosts": "a1"}, 1, "gpu_hosts", EVERY_HOST)


# The wiring of deploy_kimi.yml's rolling play (the lock plays' is in test_host_lock.py).

STAGES = ["preflight", "runtime", "canary", "weights", "tuning", "server"]
# Between tuning and the server, only when asked (--tags calibrate): the speed model's
# calibration, the tuning role's calibrate tasks.
CALIBRATE = {"step": ["tuning"], "tags": ["never", "calibrate"]}


def imports(task: dict) -> str | None:
    role = task.get("ansible.builtin.import_role")
    return task.get("ansible.builtin.import_tasks") or (role["name"] if role else None)


def test_each_batch_takes_the_lock_goes_through_every_stage_and_releases_it():
    check, rolling, router, summary = yaml.safe_load((REPO / "deploy_kimi.yml").read_text())
    # The router in front of each fleet after every batch, then the summary.
    assert router["ansible.builtin.import_playbook"] == "playbooks/router.yml"
    assert summary["ansible.builtin.import_playbook"] == "playbooks/summary_deploy.yml"
    # Every host's settings before the first batch, on the controller alone.
    assert check["hosts"] == "gpu_hosts" and check["become"] is False
    assert [imports(task) for task in check["tasks"]] == [
        "playbooks/tasks/example_hosts.yml",
        "playbooks/tasks/settings_check.yml",
    ]
    assert rolling["become"] == "{{ kimi_become | bool }}"
    blocks = [task for task in rolling["tasks"] if "block" in task]
    steps = [[imports(task) for task in block["block"]] for block in blocks]
    assert steps[0] == ["playbooks/tasks/lock.yml"] and steps[-1] == ["playbooks/tasks/unlock.yml"]
    stages = [[name for name in step if name] for step in steps[1:-1]]
    calibrate = STAGES.index("server")
    assert stages == [[s] for s in STAGES[:calibrate]] + [CALIBRATE["step"]] + [
        [s] for s in STAGES[calibrate:]
    ]
    assert blocks[1 + calibrate]["tags"] == CALIBRATE["tags"]
    assert blocks[1 + calibrate]["block"][0]["ansible.builtin.import_role"]["tasks_from"] == (
        "calibrate"
    )
    # The lock's blocks carry no stage tag: their tasks are `always`, so --tags or
    # --skip-tags of any stage still takes and releases the lock.
    tags = [block.get("tags") for block in blocks]
    assert tags == [None, *[[s] for s in STAGES[:calibrate]], CALIBRATE["tags"],
                    *[[s] for s in STAGES[calibrate:]], None]  # fmt: skip
    for block in blocks:
        assert [imports(task) for task in block["rescue"]] == ["playbooks/tasks/rollout_stop.yml"]
    for name in ("lock.yml", "unlock.yml"):
        tasks = yaml.safe_load((REPO / "playbooks" / "tasks" / name).read_text())
        assert all(task.get("tags") == ["always"] for task in tasks), name
        (play,) = yaml.safe_load((REPO / "playbooks" / name).read_text())
        assert [imports(task) for task in play["tasks"]] == [f"tasks/{name}"]
        assert play["become"] == "{{ kimi_become | bool }}"
