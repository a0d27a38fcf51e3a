"""plan.yml: per-host plan files from the controller alone, for every shipped inventory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.hub_server import LocalHub, token_env

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.preflight
TOKEN = "hf_plan_token_5e0a77c1"
INVENTORIES = sorted(p.name for p in (REPO / "inventory").iterdir() if p.is_dir())


@pytest.fixture(scope="module")
def hub():
    with LocalHub() as hub:
        hub.valid_tokens.add(TOKEN)
        hub.add_repo("moonshotai/Kimi-K2.6", {"config.json": b"{}", "a.safetensors": b"t" * 4000})
        hub.add_repo(
            "z-lab/Kimi-K2.6-DFlash",
            {"d.safetensors": b"d" * 2000},
            gated=True,
            approved_tokens={TOKEN},
        )
        hub.add_repo("lightseekorg/kimi-k2.6-eagle3.1-mla", {"e.safetensors": b"e" * 1000})
        yield hub


def run_plan(playbook, inventory, out: Path, endpoint: str):
    """Writes the plan under out/; playbook() keeps its runner files elsewhere in tmp_path."""
    out.mkdir(parents=True, exist_ok=True)
    return playbook(
        "plan.yml",
        inventory,
        extravars={"plan_output_dir": str(out)},
        envvars={
            "HF_ENDPOINT": endpoint,
            "HF_HUB_DISABLE_XET": "1",
            **token_env(TOKEN, out.parent),
        },
    )


@pytest.mark.parametrize("profile", INVENTORIES)
def test_plan_for_every_inventory(playbook, hub, tmp_path, profile):
    inventory = REPO / "inventory" / profile
    out = tmp_path / "plan"
    run = run_plan(playbook, inventory, out, hub.url)
    assert run.rc == 0, run.stdout
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    names = hosts["all"]["children"]["gpu_hosts"]["children"][profile]["hosts"]
    declared = yaml.safe_load((REPO / "group_vars" / f"{profile}.yml").read_text())
    for name in names:
        plan = json.loads((out / name / "plan.json").read_text())
        assert plan["profile"] == profile
        assert plan["hardware"]["gpu_model"] == declared["kimi_gpu_model"]
        assert plan["hardware"]["interconnect"] == declared["kimi_interconnect"]
        assert plan["hub"]["reachable"] is True
        assert plan["download_bytes"] == 4002 + 2000 + 1000
        assert plan["repos"]["dflash"]["access"] == "ok"
        assert len(plan["repos"]["target"]["resolved_sha"]) == 40
        assert set(plan["serving_configs"]) == {"ar", "eagle3", "dflash", "ddtree"}
        for config in plan["serving_configs"].values():
            assert config["capacity"]["fits"] is True
            assert config["capacity"]["weights_gib_per_gpu"] == pytest.approx(71.82, abs=0.01)
        check_launch_commands(plan)
        markdown = (out / name / "plan.md").read_text()
        assert f"# Deploy plan for {name} ({profile})" in markdown
        assert "| ddtree | dflash |" in markdown
    # Plan files, and everything ansible-runner wrote (events, artifacts, stdout).
    for written in tmp_path.rglob("*"):
        if written.is_file() and written.name != "hf-token":
            assert TOKEN not in written.read_text(errors="replace"), f"token written to {written}"
    assert TOKEN not in run.stdout
    second = run_plan(playbook, inventory, out, hub.url)
    second.assert_unchanged()


def test_plan_says_when_the_hub_is_unreachable(playbook, tmp_path):
    # A closed port on this machine: nothing leaves it.
    out = tmp_path / "plan"
    run = run_plan(playbook, REPO / "inventory" / "ct200", out, "http://127.0.0.1:9")
    assert run.rc == 0, run.stdout
    plan = json.loads((out / "ct200-node-01" / "plan.json").read_text())
    assert plan["hub"]["reachable"] is False
    assert plan["download_bytes"] is None
    assert "could not be reached" in plan["hub"]["note"]
    assert plan["serving_configs"]["ar"]["capacity"]["fits"] is True
    assert "Download size: unknown" in (out / "ct200-node-01" / "plan.md").read_text()


def test_plan_never_contacts_the_hosts(playbook, hub, tmp_path):
    """A host whose inventory insists on SSH to a closed port still gets its plan."""
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "group_vars").symlink_to(REPO / "group_vars")
    (inventory / "hosts.yml").write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "gpu_hosts": {
                            "children": {
                                "b200": {
                                    "hosts": {
                                        "unreachable-b200": {
                                            "ansible_connection": "ssh",
                                            "ansible_host": "127.0.0.1",
                                            "ansible_port": 9,
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        )
    )
    run = run_plan(playbook, inventory, tmp_path / "out", hub.url)
    assert run.rc == 0, run.stdout
    plan = json.loads((tmp_path / "out" / "unreachable-b200" / "plan.json").read_text())
    assert plan["hardware"]["target_attention_backend"] == "trtllm_mla"


def test_multi_node_ranks_come_from_an_inventory_group(playbook, hub, tmp_path):
    """Two H200 hosts in one group serve one model: ranks by position, head's address."""
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "group_vars").symlink_to(REPO / "group_vars")
    hosts = {"h200-head": {"ansible_host": "10.9.0.1"}, "h200-second": {"ansible_host": "10.9.0.2"}}
    (inventory / "hosts.yml").write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "gpu_hosts": {"children": {"h200": {"hosts": hosts}}},
                        "kimi_cluster_pair": {"hosts": {name: None for name in hosts}},
                    },
                }
            }
        )
    )
    out = tmp_path / "out"
    run = run_plan(playbook, inventory, out, hub.url)
    assert run.rc == 0, run.stdout
    for rank, name in enumerate(hosts):
        plan = json.loads((out / name / "plan.json").read_text())
        argv = plan["serving_configs"]["ar"]["launch"][0]["argv"]
        flags = argv[argv.index("--nnodes") :][:6]
        assert flags == [
            "--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", "10.9.0.1:50000"
        ]  # fmt: skip


SNAPSHOT = REPO / "tests" / "contract" / "sglang-0.5.23-args.json"


def check_launch_commands(plan: dict) -> None:
    """The contract: every release-runtime argv the kit renders passes the pinned parser, and
    the same argv with one flag misspelt does not."""
    from ansible.module_utils.sglang_args import ArgvError, load_snapshot, validate_argv

    snapshot = load_snapshot(SNAPSHOT)
    launches = [
        launch for config in plan["serving_configs"].values() for launch in config["launch"]
    ]
    names = {launch["name"] for launch in launches}
    assert names == {
        "ar",
        "eagle3",
        "dflash",
        "ddtree-b16",
        "ddtree-b32",
        "ddtree-b64",
        "ddtree-b128",
    }
    for launch in launches:
        argv = launch["argv"]
        assert argv[1:3] == ["-m", "sglang.launch_server"]
        assert launch["environment"]["HF_HUB_OFFLINE"] == "1"
        if launch["runtime"] != f"sglang=={snapshot['sglang_version']}":
            assert launch["runtime"].startswith("git+")
            continue
        validate_argv(argv[3:], snapshot)
        misspelt = [a.replace("--mem-fraction-static", "--mem-fraction-statik") for a in argv[3:]]
        with pytest.raises(ArgvError, match="mem-fraction-statik"):
            validate_argv(misspelt, snapshot)
