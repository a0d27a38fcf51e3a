"""Runs a playbook over real SSH on three namespace hosts of different profiles, one of them
booted by systemd as PID 1; a systemd host boots without acting on this machine."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support import host_bytecode
from tests.support.models import model
from tests.support.testhosts import foreign_pth_files, mounts

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration

# Per capture: GPUs the fake nvidia-smi must report.
EXPECTED_GPUS = {"ct200": 8, "h200": 2, "b200": 8}


def profile_vars(profile: str) -> dict:
    return yaml.safe_load((REPO / "group_vars" / f"{profile}.yml").read_text())


def test_playbook_over_ssh_sees_per_host_facts_and_profiles(make_testhosts, playbook):
    names = ["ct200-0", "h200-0", "b200-0"]
    cluster = make_testhosts(["ct200", "h200", "b200"], names=names, systemd=["b200-0"])
    run = playbook("tests/support/playbooks/smoke.yml", cluster.inventory)
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
        # Attention backends depend on the model too: the default model's, per profile.
        backends = model()["profiles"][host.profile]
        assert report["target_attention_backend"] == backends["target_attention_backend"]
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
    # The hosts' Pythons kept what they compiled of the module payloads, in the folder all
    # hosts share (host_bytecode.py); a venv's Python on a host, systemd's or sshd's, has the
    # cache installed too (pip and ensurepip compile there).
    probe = "import zipimport; print(getattr(zipimport._compile_source, 'kimi_test_bytecode', 0))"
    for host in cluster.hosts:
        cached = cluster.ssh(host.name, f"ls {host_bytecode.CACHE_DIR} | wc -l").stdout
        assert int(cached) > 20, (host.name, cached)
        venv = cluster.ssh(
            host.name,
            f"python3 -m venv --without-pip /tmp/probe-venv && /tmp/probe-venv/bin/python -c "
            f'"{probe}"',
        )
        assert venv.stdout.strip() == "True", (host.name, venv.stdout, venv.stderr)
        # The .pth files no package installed are this machine's, not a host's: empty there
        # (under /usr, this machine's, and under an overlaid /usr/local), kept here.
        for path in foreign_pth_files():
            seen = cluster.ssh(host.name, f"stat -c %s {path}").stdout.strip()
            assert seen == "0", (host.name, path, seen)
            assert path.stat().st_size > 0, path

    second = playbook("tests/support/playbooks/smoke.yml", cluster.inventory)
    second.assert_unchanged()


def test_a_systemd_host_boots_without_acting_on_this_machine(make_testhosts):
    # systemd's boot units, run on this machine's own filesystem, once emptied its /tmp.
    canaries = [
        Path(folder) / f"kimi-canary-{secrets.token_hex(4)}" for folder in ("/tmp", "/var/tmp")
    ]
    for canary in canaries:
        canary.write_text("still here\n")
    try:
        cluster = make_testhosts(["ct200"], names=["sd-0"], systemd=["sd-0"])
        facts = cluster.ssh(
            "sd-0",
            "cat /proc/1/comm; systemctl is-system-running; hostname; "
            "systemctl list-units --no-legend --plain --state=active "
            "--type=service,socket,timer,path,automount,swap | cut -d' ' -f1 | sort | xargs",
        ).stdout.split("\n")
        assert facts[:3] == ["systemd", "running", "sd-0"]
        # Nothing of this machine's own started: only SSH and the journal.
        assert facts[3].split() == [
            "ssh.service",
            "systemd-journald-dev-log.socket",
            "systemd-journald.service",
            "systemd-journald.socket",
        ]
        # Kernel-wide values and the machine's devices stay out of reach.
        refused = cluster.ssh(
            "sd-0", "echo 0 > /proc/sys/kernel/numa_balancing", check=False
        ).stderr
        assert "Read-only file system" in refused
        assert cluster.ssh("sd-0", "ls /dev/vda /dev/kmsg", check=False).returncode != 0
        # The host has its own journal, its own cgroup tree, and its own /tmp.
        journal = cluster.ssh("sd-0", "journalctl -u ssh --no-pager -o cat").stdout
        assert "Server listening on" in journal
        cgroup = cluster.ssh("sd-0", "cat /proc/self/cgroup").stdout
        assert "0::/system.slice/ssh.service" in cgroup
        tmp_canary, var_canary = canaries
        assert cluster.ssh("sd-0", f"test -e {tmp_canary}", check=False).returncode == 1
        # /var is copy-on-write: the host sees this machine's file, and its delete stays its own.
        cluster.ssh("sd-0", f"grep -q 'still here' {var_canary} && rm {var_canary}")
        host = cluster.hosts[0]
        assert Path(host.cgroup).is_dir()
        cluster.down()
        assert not Path(host.cgroup).exists()
    finally:
        survived = [canary.read_text() for canary in canaries if canary.exists()]
        for canary in canaries:
            canary.unlink(missing_ok=True)
    assert survived == ["still here\n"] * 2


def test_teardown_leaves_nothing_behind(make_testhosts):
    cluster = make_testhosts(["h200", "h200"], names=["h200-0", "h200-1"], systemd=["h200-1"])
    cluster.ssh("h200-0", "setsid sleep 300 >/dev/null 2>&1 < /dev/null &")
    cluster.ssh("h200-1", "systemd-run --unit=lingering sleep 300")
    namespaces = [h.netns for h in cluster.hosts]
    pids = namespace_pids(namespaces)
    assert len(pids) >= 5, "expected sshd, systemd, its journal and sshd, and two sleeps"
    state = Path(cluster.state_dir)
    # The run's files are on a tmpfs of its own, which the teardown unmounts.
    assert run_folder_mount(state) == "tmpfs"
    cgroup = Path(cluster.host("h200-1").cgroup)
    cluster.down()
    assert_gone(namespaces, state, cluster.bridge, pids)
    assert not cgroup.exists()


def test_interrupted_run_is_cleaned_up_by_the_next(tmp_path):
    """A run killed with SIGKILL leaves hosts; `down --stale` removes all of them."""
    script = (
        "import time; from tests.support.testhosts import TestHostCluster;"
        "c = TestHostCluster.up(['h200', 'h200'], names=['a', 'b'], systemd=['b']);"
        "print(c.state_dir, flush=True); time.sleep(300)"
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
        assert run_folder_mount(state) == "tmpfs"
    finally:
        owner.kill()
        owner.wait()
    from tests.support.testhosts import TestHostCluster, down_runs

    cluster = TestHostCluster.load(state)
    assert not cluster.owner_alive()
    namespaces = [h.netns for h in cluster.hosts]
    pids = namespace_pids(namespaces)
    assert pids, "the killed run's sshd should still be running"
    cgroup = Path(cluster.host("b").cgroup)
    assert cgroup.is_dir()
    removed = down_runs(stale_only=True)
    assert str(state) in removed
    assert_gone(namespaces, state, cluster.bridge, pids)
    assert not cgroup.exists()


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
    assert run_folder_mount(state) is None, "the run's tmpfs is still mounted"
    assert [pid for pid in pids if alive(pid)] == [], "a process of the removed hosts survived"


def run_folder_mount(folder: Path) -> str | None:
    """The type of the filesystem mounted at folder in this mount namespace, if any."""
    return next((kind for point, kind in mounts() if point == str(folder)), None)
