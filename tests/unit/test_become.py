"""Running as a sudo user without hosts: whether the kit escalates (kimi_become) per host and the
play that connects to GPU hosts; the test hosts' sudo user (its sudoers file, the script that
makes it, the inventory that connects as it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support import testhosts
from tests.support.ansible_run import run_playbook

REPO = Path(__file__).resolve().parents[2]
# Every playbook whose plays act on the GPU hosts over SSH; each of those plays escalates as
# kimi_become says. (lock.yml, unlock.yml and deploy_kimi.yml are checked where they are written.)
GPU_HOST_PLAYBOOKS = [
    "lock",
    "unlock",
    "preflight",
    "weights",
    "runtime",
    "canary",
    "tuning",
    "server",
    "benchmark",
    "teardown",
    "summary_deploy",
    "summary_benchmark",
]


def plays(path: Path) -> list[dict]:
    """The plays of a playbook, its imports left out."""
    return [p for p in yaml.safe_load(path.read_text()) if "hosts" in p]


@pytest.mark.parametrize("name", GPU_HOST_PLAYBOOKS)
def test_every_play_on_the_gpu_hosts_escalates_as_kimi_become_says(name):
    # Beside gpu_hosts: a template that picks among them (a rolling order, the benchmark's
    # target) or a fleet's router hosts; plays on the controller itself escalate nowhere.
    found = [
        play for play in plays(REPO / "playbooks" / f"{name}.yml") if play["hosts"] != "localhost"
    ]
    assert found and all(
        play["hosts"] == "gpu_hosts"
        or any(part in play["hosts"] for part in ("'gpu_hosts'", "__kimi_rollout", "kimi_routers"))
        for play in found
    )
    assert [play.get("become") for play in found] == ["{{ kimi_become | bool }}"] * len(found)


def test_plan_never_escalates_on_the_controller():
    found = plays(REPO / "playbooks" / "plan.yml")
    assert [play.get("become") for play in found] == [False]
    assert all(play["vars"]["ansible_connection"] == "local" for play in found)


def test_kimi_become_follows_the_user_each_host_is_reached_as(tmp_path):
    """root: no sudo (minimal images have none); any other user: sudo; an unset user is the
    controller's own (ssh logs in as it), the legacy ansible_ssh_user counts too; an explicit
    kimi_become wins either way. Templated per host within one play."""
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "group_vars").symlink_to(REPO / "group_vars")
    local = {"ansible_connection": "local"}
    hosts = {
        "as-root": {**local, "ansible_user": "root"},
        "as-nobody-set": local,
        # An empty user is no user: the controller's, as ssh would.
        "as-empty-user": {**local, "ansible_user": ""},
        "as-legacy-root": {**local, "ansible_ssh_user": "root"},
        "as-ops": {**local, "ansible_user": "ops"},
        "as-ops-told-not-to": {**local, "ansible_user": "ops", "kimi_become": False},
        "as-root-told-to": {**local, "ansible_user": "root", "kimi_become": "true"},
    }
    tree = {"all": {"children": {"gpu_hosts": {"hosts": hosts}}}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(tree))
    playbook = tmp_path / "become.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Say whether each host escalates",
                    "hosts": "gpu_hosts",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Escalates",
                            "ansible.builtin.debug": {"msg": "{{ kimi_become | bool }}"},
                        }
                    ],
                }
            ]
        )
    )
    (tmp_path / "runner").mkdir()
    # The controller's user, which ssh logs in as when nothing names one.
    run = run_playbook(str(playbook), inventory, tmp_path / "runner", envvars={"USER": "alice"})
    assert run.rc == 0, run.stdout
    said = {host: result["msg"] for host, result in run.results("Escalates").items()}
    assert said == {
        "as-root": False,
        "as-nobody-set": True,
        "as-empty-user": True,
        "as-legacy-root": False,
        "as-ops": True,
        "as-ops-told-not-to": False,
        "as-root-told-to": True,
    }


def test_the_sudoers_file_grants_the_user_everything_without_a_password(tmp_path):
    visudo = shutil.which("visudo") or "/usr/sbin/visudo"
    if not Path(visudo).exists():
        pytest.skip("sudo is not installed here (make test-deps installs it)")
    entry = testhosts.sudoers_entry(testhosts.SUDO_USER)
    assert entry == "kimiops ALL=(ALL:ALL) NOPASSWD: ALL\n"
    sudoers = tmp_path / "kimiops"
    sudoers.write_text(entry)
    checked = subprocess.run(
        [visudo, "-c", "-f", str(sudoers)], capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # A broken line is what visudo is there to catch before sudo reads it.
    sudoers.write_text(entry.replace("NOPASSWD:", "NOPASSWD"))
    broken = subprocess.run(
        [visudo, "-c", "-f", str(sudoers)], capture_output=True, text=True, timeout=30
    )
    assert broken.returncode != 0


def test_the_sudo_user_script_checks_the_file_before_sudo_reads_it():
    script = testhosts.sudo_user_script("ct200-a")
    lines = script.splitlines()
    # Checked under a name sudo's includedir skips (it has a dot), then moved into place.
    check = next(i for i, line in enumerate(lines) if line.startswith("visudo -cqf"))
    move = next(i for i, line in enumerate(lines) if line.startswith("mv "))
    assert check < move and lines[move].endswith("/etc/sudoers.d/kimiops")
    assert "mktemp /etc/sudoers.d/.new." in script and 'chmod 0440 "$new"' in script
    # Unlocked ('*', no password): sshd without PAM refuses a locked ('!') account.
    assert "usermod --password '*' kimiops" in lines
    assert lines[0] == "set -eu"
    # The same shell syntax sh will run.
    parsed = subprocess.run(["sh", "-n"], input=script, capture_output=True, text=True, timeout=10)
    assert parsed.returncode == 0, parsed.stderr


@pytest.mark.parametrize(
    ("host", "user"),
    [("ct200-a", "root"), ("ct200-a", "ops; rm -rf /"), ("ct200-a; id", "kimiops"), ("", "x")],
)
def test_the_sudo_user_script_refuses_root_and_names_a_shell_would_read(host, user):
    with pytest.raises(testhosts.TestHostError):
        testhosts.sudo_user_script(host, user)


def cluster_of(tmp_path: Path, *names: str) -> testhosts.TestHostCluster:
    """A cluster's records without hosts behind them: write_inventory reads only these."""
    cluster = testhosts.TestHostCluster(
        run_id="0000",
        state_dir=str(tmp_path),
        bridge="none",
        subnet="10.213.250.0/24",
        gateway="10.213.250.1",
    )
    for index, name in enumerate(names):
        cluster.hosts.append(
            testhosts.TestHost(
                name=name,
                profile=name.split("-")[0],
                capture="",
                address=f"10.213.250.{10 + index}",
                netns="none",
                veth="none",
                state_dir=str(tmp_path / name),
            )
        )
    return cluster


def test_the_inventory_connects_as_the_sudo_user_only_to_the_chosen_hosts(tmp_path):
    cluster = cluster_of(tmp_path, "ct200-a", "b200-a")
    inventory = yaml.safe_load(
        cluster.write_inventory(
            sudo_user_hosts=["ct200-a"], host_vars={"b200-a": {"kimi_model": "qwen3.6-27b"}}
        ).read_text()
    )
    assert inventory["all"]["vars"]["ansible_user"] == "root"
    groups = inventory["all"]["children"]["gpu_hosts"]["children"]
    assert groups["ct200"]["hosts"]["ct200-a"]["ansible_user"] == "kimiops"
    assert "ansible_user" not in groups["b200"]["hosts"]["b200-a"]
    # Host variables still win, the user included.
    again = yaml.safe_load(
        cluster.write_inventory(
            sudo_user_hosts=["ct200-a"], host_vars={"ct200-a": {"ansible_user": "other"}}
        ).read_text()
    )
    hosts = again["all"]["children"]["gpu_hosts"]["children"]["ct200"]["hosts"]
    assert hosts["ct200-a"]["ansible_user"] == "other"
    with pytest.raises(testhosts.TestHostError, match="h200-a"):
        cluster.write_inventory(sudo_user_hosts=["h200-a"])
