"""deploy_kimi.yml end to end over SSH test hosts: preflight, weights from a local hub, the
runtime (the simulator packaged as sglang 0.5.23), tuning (kernel values under a private
tree) and the server, on a PCIe ct200 host and an NVSwitch b200 host at once; a second run
changes nothing and does not restart the servers; plan.yml lists what deploy ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hostprep import EXTRAVARS as TUNING_VARS
from tests.hostprep import install_fabricmanager, prepare_host
from tests.hub_server import LocalHub, token_env

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.runtime, pytest.mark.integration]

TOKEN = "hf_deploy_good_2b7e41"
HOSTS = ["ct200-a", "b200-a"]


@pytest.fixture(scope="module")
def cluster():
    from tests.testhosts import TestHostCluster

    hosts = TestHostCluster.up(["ct200", "b200"], names=HOSTS)
    try:
        for name in HOSTS:
            prepare_host(hosts, name, cpufreq=False)
        install_fabricmanager(hosts, "b200-a")
        yield hosts
    finally:
        hosts.down()


@pytest.fixture(scope="module")
def hub(cluster):
    with LocalHub(host=cluster.gateway) as hub:
        hub.valid_tokens.add(TOKEN)
        shards = {f"model-{i:05d}-of-00004.safetensors": bytes([i]) * 400_000 for i in range(4)}
        hub.add_repo(
            "moonshotai/Kimi-K2.6",
            {"config.json": (REPO / "models/kimi-k2.6/config.json").read_bytes(), **shards},
        )
        hub.add_repo(
            "z-lab/Kimi-K2.6-DFlash",
            {"config.json": b'{"block_size": 8}', "model.safetensors": b"d" * 200_000},
            gated=True,
            approved_tokens={TOKEN},
        )
        yield hub


@pytest.fixture(scope="module")
def deploy(cluster, hub, wheelhouse, runtime_wheelhouse, tmp_path_factory):
    from tests.ansible_run import run_playbook

    secrets = tmp_path_factory.mktemp("secrets")
    extravars = {
        **TUNING_VARS,
        "kimi_serving_configs": ["ar", "dflash"],
        "kimi_server_config": "dflash",
        "kimi_hf_endpoint": hub.url,
        "kimi_server_environment": {"HF_HUB_OFFLINE": "1", "SGLANG_SIM_LOAD_SECONDS": "2"},
        "weights_controller_state_dir": str(Path(cluster.state_dir) / "controller-state"),
        "weights_wheelhouse": str(wheelhouse),
        "weights_poll_interval": 1,
        "weights_download_environment": {"HF_HUB_DISABLE_XET": "1"},
        "runtime_wheelhouse": str(runtime_wheelhouse),
        "server_health_poll_s": 1,
    }

    def run(name: str):
        return run_playbook(
            "deploy_kimi.yml",
            cluster.inventory,
            tmp_path_factory.mktemp(name),
            extravars=extravars,
            envvars={**token_env(TOKEN, secrets), "HF_HUB_DISABLE_XET": "1"},
        )

    first = run("deploy-1")
    pids = {name: server_pid(cluster, name) for name in HOSTS} if first.rc == 0 else {}
    second = run("deploy-2")
    return first, second, pids, extravars


def server_pid(cluster, host: str) -> int:
    state = cluster.ssh(host, "cat /var/lib/kimi/server/kimi-sglang.state.json").stdout
    return int(json.loads(state)["child_pid"])


def test_deploy_ends_with_a_healthy_server_on_every_host(cluster, deploy):
    first, _, _, _ = deploy
    assert first.rc == 0, first.stdout
    health = first.results("Wait for /health_generate")
    assert {host: health[host]["state"] for host in HOSTS} == dict.fromkeys(HOSTS, "healthy")
    for host in HOSTS:
        launch = json.loads(cluster.ssh(host, "cat /var/lib/kimi/server/launch.json").stdout)
        assert launch["config"] == "dflash" and launch["runtime"] == "sglang==0.5.23"
        assert launch["argv"][0] == "/opt/kimi/venv/bin/python"
        assert "/opt/kimi/weights/z-lab/Kimi-K2.6-DFlash" in launch["argv"]
        # The profile's NCCL settings reach the server and /etc/nccl.conf alike.
        nccl = cluster.ssh(host, "cat /etc/nccl.conf").stdout
        for key, value in launch["environment"].items():
            if key.startswith("NCCL_"):
                assert f"{key}={value}" in nccl
    ct200 = json.loads(cluster.ssh("ct200-a", "cat /var/lib/kimi/server/launch.json").stdout)
    assert ct200["environment"]["NCCL_P2P_DISABLE"] == "1"
    b200 = json.loads(cluster.ssh("b200-a", "cat /var/lib/kimi/server/launch.json").stdout)
    argv = b200["argv"]
    assert argv[argv.index("--attention-backend") + 1] == "trtllm_mla"


def test_second_deploy_changes_nothing_and_keeps_the_servers(cluster, deploy):
    first, second, pids, _ = deploy
    assert first.rc == 0, first.stdout
    assert second.rc == 0, second.stdout
    assert sum(second.changed().values()) == 0, second.changed()
    assert {name: server_pid(cluster, name) for name in HOSTS} == pids
    actions = second.results("Start the server, restarting it only when its launch changed")
    assert {actions[h]["action"] for h in HOSTS} == {"none"}


def test_plan_lists_what_deploy_runs(cluster, deploy, tmp_path):
    from tests.ansible_run import run_playbook

    _, _, _, extravars = deploy
    plan_dir = tmp_path / "plan"
    (tmp_path / "runner").mkdir()
    run = run_playbook(
        "plan.yml",
        cluster.inventory,
        tmp_path / "runner",
        extravars={
            **extravars,
            "plan_output_dir": str(plan_dir),
            "plan_state_dir": extravars["weights_controller_state_dir"],
        },
    )
    assert run.rc == 0, run.stdout
    for host in HOSTS:
        plan = json.loads((plan_dir / host / "plan.json").read_text())
        launches = {c["name"]: c for c in plan["serving_configs"]["dflash"]["launch"]}
        deployed = json.loads(cluster.ssh(host, "cat /var/lib/kimi/server/launch.json").stdout)
        assert launches["dflash"]["argv"] == deployed["argv"]
        assert launches["dflash"]["environment"] == deployed["environment"]
