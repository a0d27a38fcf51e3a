"""Runs a playbook over real SSH on three namespace hosts of different profiles."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.integration

# Per capture: GPUs the fake nvidia-smi must report.
EXPECTED_GPUS = {"ct200": 8, "h200": 2, "b200": 8}


def profile_vars(profile: str) -> dict:
    return yaml.safe_load((REPO / "group_vars" / f"{profile}.yml").read_text())


def test_playbook_over_ssh_sees_per_host_facts_and_profiles(make_testhosts, playbook):
    cluster = make_testhosts(["ct200", "h200", "b200"])
    run = playbook("tests/playbooks/smoke.yml", cluster.inventory)
    assert run.rc == 0, run.stdout
    reports = {host: res["msg"] for host, res in run.results("Report what this host is").items()}
    assert set(reports) == {"ct200-0", "h200-0", "b200-0"}

    for host in cluster.hosts:
        report = reports[host.name]
        declared = profile_vars(host.profile)
        assert report["hostname"] == host.name
        assert report["address"] == host.address
        assert report["profile"] == host.profile
        assert report["gpu_model"] == declared["kimi_gpu_model"]
        assert report["interconnect"] == declared["kimi_interconnect"]
        assert report["target_attention_backend"] == declared["kimi_target_attention_backend"]
        gpus = [line.split(", ") for line in report["gpus"]]
        assert len(gpus) == EXPECTED_GPUS[host.profile]
        # The capture a host replays agrees with the profile its group declares.
        assert {name for name, _cc, _mem in gpus} == {declared["kimi_gpu_model"]}
        assert {cc for _name, cc, _mem in gpus} == {declared["kimi_gpu_compute_capability"]}
        # Every host wrote the same path; each still reads its own marker.
        assert report["marker"] == host.name

    # Profiles really differ between the hosts, not just their names.
    assert len({r["compute_capability"] for r in reports.values()}) == 3
    assert len({r["interconnect"] for r in reports.values()}) == 2
    assert not Path("/opt/kimi/smoke-marker").exists(), "a host wrote to the controller"

    second = playbook("tests/playbooks/smoke.yml", cluster.inventory)
    assert second.rc == 0, second.stdout
    assert sum(second.changed().values()) == 0


def test_teardown_leaves_nothing_behind(make_testhosts):
    cluster = make_testhosts(["h200", "h200"])
    cluster.ssh("h200-0", "setsid sleep 300 >/dev/null 2>&1 < /dev/null &")
    namespaces = [h.netns for h in cluster.hosts]
    pids = namespace_pids(namespaces)
    assert len(pids) >= 3, "expected two sshd and the detached sleep"
    state = Path(cluster.state_dir)
    cluster.down()
    assert_gone(namespaces, state, cluster.bridge, pids)


def test_interrupted_run_is_cleaned_up_by_the_next(tmp_path):
    """A run killed with SIGKILL leaves hosts; `down --stale` removes all of them."""
    script = (
        "import time; from tests.testhosts import TestHostCluster;"
        "c = TestHostCluster.up(['h200']); print(c.state_dir, flush=True); time.sleep(300)"
    )
    owner = subprocess.Popen(
        [subprocess.sys.executable, "-c", script],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        state = Path(owner.stdout.readline().strip())
        assert (state / "state.json").is_file()
    finally:
        owner.kill()
        owner.wait()
    from tests.testhosts import TestHostCluster, down_runs

    cluster = TestHostCluster.load(state)
    assert not cluster.owner_alive()
    namespaces = [h.netns for h in cluster.hosts]
    pids = namespace_pids(namespaces)
    assert pids, "the killed run's sshd should still be running"
    removed = down_runs(stale_only=True)
    assert str(state) in removed
    assert_gone(namespaces, state, cluster.bridge, pids)


def namespace_pids(namespaces: list[str]) -> list[int]:
    pids = []
    for netns in namespaces:
        out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
        pids += [int(pid) for pid in out.stdout.split()]
    return pids


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie that nobody reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def assert_gone(namespaces: list[str], state: Path, bridge: str, pids: list[int]) -> None:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for netns in namespaces:
        assert netns not in listed
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert bridge not in links
    assert not state.exists()
    assert [pid for pid in pids if alive(pid)] == [], "a process of the removed hosts survived"
