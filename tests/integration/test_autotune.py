"""autotune.yml over an SSH test host running the simulator as sglang, whose timing depends on
the knobs (SGLANG_SIM_KNOBS): a planted optimum no default hits (4 running requests, CUDA
graphs up to 24), a region that runs out of memory while it loads (8 running requests), and
noise between starts. The search must find the optimum within its budget, try the failing
region once, write the answer into the inventory, and the next deploy of the server stage must
launch with it (changed where the setting changed, then nothing).

A bad search space is refused on the controller before anything connects.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.support.models import place_kimi_model_files
from tests.support.results_tree import TEMPLATE
from tests.support.sim_process import QUICK_POLLS

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.benchmark, pytest.mark.integration, pytest.mark.timeout(1200)]

HOST = "tune-a"
RUN = "tune1"
OPTIMUM = {"--max-running-requests": 4, "--cuda-graph-max-bs-decode": 24}
KNOBS = {
    "optimum": OPTIMUM,
    "penalty": 0.5,
    "oom": [{"--max-running-requests": 8}],
    "noise": 0.03,
}
SPACE = {"--max-running-requests": [2, 4, 8], "--cuda-graph-max-bs-decode": [8, 24]}
SLO = "ttft_ms_p99=5000,tpot_ms_p99=500"


@pytest.fixture(scope="module")
def cluster():
    from tests.support.testhosts import TestHostCluster

    hosts = TestHostCluster.up(["ct200"], names=[HOST])
    try:
        hosts.write_inventory()
        place_kimi_model_files(hosts, HOST, TEMPLATE)
        yield hosts
    finally:
        hosts.down()


COMMON = {
    "kimi_server_config": "dflash",
    "kimi_serving_configs": ["ar", "dflash"],
    "kimi_server_environment": {
        **QUICK_POLLS,
        "HF_HUB_OFFLINE": "1",
        "SGLANG_SIM_STEP_MS": "20",
        "SGLANG_SIM_KNOBS": json.dumps(KNOBS),
    },
    "server_health_poll_s": 1,
    "server_restart_delay_s": 1,
    # Each trial is a server start: the API checks (tested with the server stage) would cost
    # every one a few seconds and prove nothing of the search.
    "kimi_server_api_check": False,
}


@pytest.fixture(scope="module")
def tuned(cluster, runtime_wheelhouse, tmp_path_factory):
    from tests.support.ansible_run import run_playbook

    runtime = run_playbook(
        "playbooks/runtime.yml",
        cluster.inventory,
        tmp_path_factory.mktemp("runtime"),
        extravars={**COMMON, "runtime_wheelhouse": str(runtime_wheelhouse)},
    )
    assert runtime.rc == 0, runtime.stdout
    results = tmp_path_factory.mktemp("results")
    run = run_playbook(
        "autotune.yml",
        cluster.inventory,
        tmp_path_factory.mktemp("autotune"),
        extravars={
            **COMMON,
            "autotune_space": SPACE,
            "autotune_slo": SLO,
            "autotune_workload": "isl64-osl16",
            "autotune_bands": [1, 4],
            "autotune_rungs": [1, 3],
            "autotune_budget_minutes": 20,
            "autotune_run_id": RUN,
            "autotune_results_dir": str(results),
            "benchmark_num_prompts": 4,
            "benchmark_warmup_requests": 1,
            "benchmark_debug": False,
        },
    )
    (results / "ansible.log").write_text(run.stdout)
    return run, results / RUN / HOST


def test_the_search_finds_the_planted_optimum_within_its_budget(cluster, tuned):
    run, results = tuned
    assert run.rc == 0, run.stdout[-6000:]
    state = json.loads((results / "autotune" / "search.json").read_text())
    trials = state["trials"]
    assert state["stop"] == "converged"
    # 6 candidates: 5 short runs (one fails, one is pruned), then the best third (2 of the 4
    # that ran) of each band: 2 to 4 longer runs.
    assert [t["rung"] for t in trials].count(0) == 5
    assert 2 <= [t["rung"] for t in trials].count(1) <= 4
    ended = max(t["ended"] for t in trials)
    assert ended - state["started"] < 20 * 60
    answer = yaml.safe_load(
        (cluster.inventory_dir / "host_vars" / HOST / "autotune.yml").read_text()
    )
    tuned_setting = answer["kimi_autotune"]
    assert tuned_setting["pick"] == OPTIMUM
    for band in ("1", "4"):
        assert tuned_setting["bands"][band]["pick"]["knobs"] == OPTIMUM
    assert answer["kimi_server_extra_args"] == [
        "--max-running-requests", "4", "--cuda-graph-max-bs-decode", "24"
    ]  # fmt: skip
    assert answer["kimi_server_config"] == "dflash"
    # Every trial is a benchmark config of its own: level files, status, provenance.
    first = results / trials[0]["id"]
    assert json.loads((first / "status.json").read_text())["status"] == "ok"
    level = json.loads((first / "isl64-osl16" / "c4.json").read_text())
    assert level["summary"]["requests_ok"] == 4
    page = (results / "autotune" / "search.md").read_text()
    assert "## Recommendation per band" in page and "## Knob effects" in page


def test_the_failing_region_is_tried_once_and_pruned(tuned):
    _run, results = tuned
    state = json.loads((results / "autotune" / "search.json").read_text())
    failed = [t for t in state["trials"] if t["status"] == "failed"]
    assert [t["knobs"] for t in failed] == [
        {"--max-running-requests": 8, "--cuda-graph-max-bs-decode": 8}
    ]
    assert "did not become healthy" in failed[0]["error"] or "OutOfMemory" in failed[0]["error"]
    pruned = [c for c in state["candidates"] if c["status"] == "pruned"]
    assert [c["knobs"] for c in pruned] == [
        {"--max-running-requests": 8, "--cuda-graph-max-bs-decode": 24}
    ]
    tried = [t["key"] for t in state["trials"]]
    assert pruned[0]["key"] not in tried


def test_the_next_deploy_launches_with_the_answer_and_then_changes_nothing(cluster, tuned):
    from tests.support.ansible_run import run_playbook

    run, _results = tuned
    assert run.rc == 0
    arguments = {
        "playbook": "playbooks/server.yml",
        "inventory": cluster.inventory,
        "extravars": COMMON,
    }
    first = run_playbook(private_dir=Path(tempfile.mkdtemp()), **arguments)
    assert first.rc == 0, first.stdout[-4000:]
    command = cluster.ssh(HOST, "cat /var/lib/kimi/server/launch.json").stdout
    argv = json.loads(command)["argv"]
    flags = argv[argv.index("--max-running-requests") :][:4]
    assert flags == ["--max-running-requests", "4", "--cuda-graph-max-bs-decode", "24"]
    # The search ended by starting the deploy's config again as the host had it (the
    # benchmark's restore): the answer's flags are a change, made by restarting.
    assert "Start the server, restarting it only when its launch changed" in (
        first.changed_tasks().get(HOST, [])
    )
    run_playbook(private_dir=Path(tempfile.mkdtemp()), **arguments).assert_unchanged()


@pytest.mark.parametrize(
    ("space", "says"),
    [
        ({}, "at least one knob"),
        ({"--max-running-requests": "64"}, "neither a non-empty list"),
        ({"--max-runing-requests": [64]}, "did you mean --max-running-requests"),
        ({"config": ["eagle9"]}, "not a serving config"),
    ],
)
def test_a_bad_search_space_is_refused_before_anything_connects(space, says, tmp_path):
    from tests.support.ansible_run import run_playbook

    inventory = tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "group_vars").symlink_to(REPO / "group_vars")
    hosts = {"unreachable": {"ansible_host": "127.0.0.1", "ansible_port": 9}}
    (inventory / "hosts.yml").write_text(
        yaml.safe_dump(
            {"all": {"children": {"gpu_hosts": {"children": {"ct200": {"hosts": hosts}}}}}}
        )
    )
    (tmp_path / "runner").mkdir()
    run = run_playbook(
        "autotune.yml",
        inventory / "hosts.yml",
        tmp_path / "runner",
        extravars={"autotune_space": space, "autotune_results_dir": str(tmp_path / "results")},
    )
    assert run.rc != 0
    assert says in run.stdout
    assert "UNREACHABLE" not in run.stdout and not (inventory / "host_vars").exists()
