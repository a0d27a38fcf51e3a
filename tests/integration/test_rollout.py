"""Rolling deploys (issue 21 part 5) over three SSH test hosts: -e kimi_deploy_serial=1 takes
one batch at a time through the stages, the two hosts of a kimi_cluster_* group in one batch,
and a host that fails stops the run before the next batch, which then never runs a task and
holds no lock. Only the preflight stage runs (--tags preflight): the batching and the lock are
the same for every stage."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from tests.support.hub_server import LocalHub, add_kimi_repos, token_env

pytestmark = [pytest.mark.preflight, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]

# Inventory order; roll-a and roll-c run one two-node server (roll-a its head), so with one
# host a batch they still go together, first, and roll-b after them.
HOSTS = ["roll-a", "roll-b", "roll-c"]
PAIR = ["roll-a", "roll-c"]
ROLLING_PLAY = "Deploy Kimi K2.6 through every stage, a batch of hosts at a time"
LOCK = "/var/lib/kimi/lock/lock.json"
JUDGE = "Judge every check"
RELEASE = "Release the per-host lock"
STOP = "Stop the rollout at this host's failure"
TOKEN = "hf_rollout_good_5c1d"
RESULTS = ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable")


@pytest.fixture(scope="module")
def hub():
    with LocalHub() as hub:
        hub.valid_tokens.add(TOKEN)
        add_kimi_repos(hub, {TOKEN})
        yield hub


@pytest.fixture(scope="module")
def hosts():
    from tests.support.testhosts import TestHostCluster

    cluster = TestHostCluster.up(["ct200"] * len(HOSTS), names=HOSTS)
    try:
        yield cluster
    finally:
        cluster.down()


def inventory(cluster, host_vars: dict | None = None) -> Path:
    """The test hosts' inventory with the pair in a kimi_cluster_* group."""
    cluster.write_inventory(host_vars)
    tree = yaml.safe_load(cluster.inventory.read_text())
    tree["all"]["children"]["kimi_cluster_pair"] = {"hosts": dict.fromkeys(PAIR)}
    cluster.inventory.write_text(yaml.safe_dump(tree, sort_keys=False))
    return cluster.inventory


def roll(playbook, cluster, hub, tmp_path, host_vars: dict | None = None):
    return playbook(
        "deploy_kimi.yml",
        inventory(cluster, host_vars),
        tags="preflight",
        extravars={
            "kimi_deploy_serial": 1,
            # One serving config: less for preflight to plan, the same batches.
            "kimi_serving_configs": ["ar"],
            "preflight_context_lengths_file": f"{tmp_path}/{{{{ inventory_hostname }}}}.json",
        },
        envvars={"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", **token_env(TOKEN, tmp_path)},
    )


def batches(run) -> list[list[tuple[int, str, str]]]:
    """Per batch of the rolling play (Ansible starts the play anew for each), its task results
    in the order they came: (event counter, host, task)."""
    found: list[list[tuple[int, str, str]]] = []
    in_rolling = False
    for event in run.events:
        data = event.get("event_data", {})
        if event["event"] == "playbook_on_play_start":
            in_rolling = data.get("play") == ROLLING_PLAY
            if in_rolling:
                found.append([])
        elif in_rolling and event["event"] in RESULTS:
            found[-1].append((event["counter"], data["host"], data.get("task", "?")))
    return found


def local_inventory(tmp_path: Path, hosts: dict[str, dict]) -> Path:
    """Hosts that are this machine (local connection), each with a lock file of its own under
    tmp_path; the pair in a kimi_cluster_* group. Only `always` tasks run on them: the lock."""
    folder = tmp_path / "inventory"
    folder.mkdir()
    (folder / "group_vars").symlink_to(REPO / "group_vars")
    entries = {
        name: {"kimi_host_lock_file": str(tmp_path / "locks" / name / "lock.json"), **more}
        for name, more in hosts.items()
    }
    tree = {
        "all": {
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
            "children": {
                "gpu_hosts": {"children": {"ct200": {"hosts": entries}}},
                "kimi_cluster_pair": {"hosts": {"c1": None, "c2": None}},
            },
        }
    }
    (folder / "hosts.yml").write_text(yaml.safe_dump(tree, sort_keys=False))
    return folder


def lock_left(cluster, host: str) -> bool:
    return cluster.ssh(host, f"test -e {LOCK}", check=False).returncode == 0


def test_one_batch_at_a_time_goes_through_all_its_tasks_first(playbook, hosts, hub, tmp_path):
    run = roll(playbook, hosts, hub, tmp_path)
    assert run.rc == 0 and not run.failed_hosts(), run.stdout[-8000:]
    found = batches(run)
    # The pair moves together although the inventory puts roll-b between them.
    assert [sorted({host for _, host, _ in batch}) for batch in found] == [PAIR, ["roll-b"]]
    first, second = found
    # Everything of the first batch, its lock's release included, came before the second
    # batch's first task.
    assert max(counter for counter, _, _ in first) < min(counter for counter, _, _ in second)
    for batch, members in ((first, PAIR), (second, ["roll-b"])):
        for host in members:
            tasks = [task for _, who, task in batch if who == host]
            assert JUDGE in tasks and tasks[-1] == RELEASE, (host, tasks)
    judged = run.results(JUDGE)
    assert all(not judged[host]["failed"] and judged[host]["failures"] == [] for host in HOSTS)
    # Each batch reads the study lock anew: the second follows the commit the first resolved
    # and recorded (no lock before this run).
    read = run.results("Read the study lock")
    assert read["roll-a"]["exists"] is False, read["roll-a"]
    pinned = read["roll-b"]["pins"]["weights"]
    assert set(pinned) == {"moonshotai/Kimi-K2.6"} and len(pinned["moonshotai/Kimi-K2.6"]) == 40
    assert not any(lock_left(hosts, host) for host in HOSTS), "a per-host lock was left"


def test_a_failed_host_stops_the_run_before_the_next_batch(playbook, hosts, hub, tmp_path):
    # roll-a's preflight asks for GPUs its host does not have.
    run = roll(playbook, hosts, hub, tmp_path, {"roll-a": {"kimi_gpu_model": "NVIDIA B300"}})
    assert run.rc != 0
    assert run.results(JUDGE)["roll-a"]["failed"], run.stdout[-8000:]
    said = run.results(STOP)["roll-a"]
    assert said["failed"]
    assert 'roll-a failed at "Judge every check"' in said["msg"], said
    assert "stops in batch 1 of 2 (roll-a, roll-c)" in said["msg"], said
    assert "Not deployed: roll-b." in said["msg"], said
    assert "run the same command again" in said["msg"], said
    # Its batch stopped with it after the stage (roll-c passed preflight, then went no
    # further: no release), and the run went no further either.
    found = batches(run)
    assert [sorted({host for _, host, _ in batch}) for batch in found] == [PAIR]
    assert not run.results(JUDGE)["roll-c"]["failed"]
    assert RELEASE not in {task for _, _, task in found[0]}
    # Only the controller's check of every host's settings, before the first batch, saw it.
    assert not any(
        event.get("event_data", {}).get("host") == "roll-b"
        for event in run.events
        if event["event"].startswith("runner_")
        and event["event_data"].get("play") != "Check every host's settings before the first batch"
    ), "roll-b ran a task"
    assert not lock_left(hosts, "roll-b"), "roll-b, never reached, holds a lock"


def test_limit_is_applied_before_the_batches_are_cut(playbook, tmp_path):
    """--limit leaves out the pair's head: what is left of the pair goes on its own unit, and
    batch sizes count only the hosts the run acts on."""
    run = playbook(
        "deploy_kimi.yml",
        local_inventory(tmp_path, {name: {} for name in ["a1", "c2", "b1", "c1", "d1"]}),
        tags="none",
        limit="c2,b1,d1",
        extravars={"kimi_deploy_serial": 2},
    )
    assert run.rc == 0, run.stdout[-8000:]
    # Unlimited, the batches would be a1 | c1, c2 | b1, d1.
    assert [sorted({host for _, host, _ in batch}) for batch in batches(run)] == [
        ["b1", "c2"],
        ["d1"],
    ]


def test_an_unreachable_host_stops_the_rollout_before_the_next_batch(playbook, tmp_path):
    """An unreachable host does not count towards max_fail_percentage: its batch-mate goes on,
    and the next batch stops before it takes any lock."""
    unreachable = {
        "ansible_connection": "ssh",
        "ansible_host": "127.0.0.1",
        "ansible_port": 1,
        "ansible_user": "nobody",
    }
    run = playbook(
        "deploy_kimi.yml",
        local_inventory(tmp_path, {"a1": {}, "u1": unreachable, "b1": {}}),
        tags="none",
        extravars={"kimi_deploy_serial": 2},
    )
    assert run.rc != 0
    assert set(run.stats.get("dark", {})) == {"u1"}
    stopped = run.results("Stop before this batch when a host of an earlier one dropped out")
    assert stopped["b1"]["failed"], run.stdout[-8000:]
    assert stopped["b1"]["msg"].startswith(
        "u1 dropped out of an earlier batch (unreachable), so the rollout stops here. "
        "Not deployed: u1, b1. Fix the cause and run the same command again"
    ), stopped
    assert run.results(RELEASE)["a1"]["failed"] is False
    assert "b1" not in run.results("Take the per-host lock")
    assert not (tmp_path / "locks" / "b1" / "lock.json").exists()


def test_kimi_deploy_serial_in_the_inventory_stops_before_any_host_is_touched(playbook, tmp_path):
    """Ansible cuts the batches without inventory variables: set there, the value would make
    the whole fleet one batch while the play believed it rolled. The run stops first."""
    folder = local_inventory(tmp_path, {name: {} for name in ["a1", "b1", "d1"]})
    tree = yaml.safe_load((folder / "hosts.yml").read_text())
    tree["all"]["vars"]["kimi_deploy_serial"] = 1
    (folder / "hosts.yml").write_text(yaml.safe_dump(tree, sort_keys=False))
    run = playbook("deploy_kimi.yml", folder, tags="none")
    assert run.rc != 0
    stopped = run.results("Stop when kimi_deploy_serial comes from the inventory")
    said = next(iter(stopped.values()))
    assert said["failed"], run.stdout[-8000:]
    assert "this run would deploy 3 hosts at once" in said["msg"], said
    assert "-e kimi_deploy_serial=1" in said["msg"], said
    assert "Take the per-host lock" not in {
        event.get("event_data", {}).get("task") for event in run.events
    }
    assert not (tmp_path / "locks").exists()
