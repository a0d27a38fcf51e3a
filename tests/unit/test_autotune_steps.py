"""autotune_step's steps on the controller (module_utils/autotune/step_task.py): start, next,
record and finish in order over real level files, the answer written into an inventory folder
and read back as the deploy's variables, and what it refuses (a state that is not one, a host
name or a link that would lead outside host_vars, a band without a pick)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.autotune import step_task

from tests.support.results_tree import Plan, Sim, write_run

REPO = Path(__file__).resolve().parents[2]
CONTRACT = str(REPO / "tests" / "contract" / "sglang-0.5.23-args.json")
SPACE = {"--max-running-requests": [4, 8], "NCCL_ALGO": ["Ring"]}


def step(action: str, state_file: Path, **params) -> dict:
    base = {name: None for name in step_task.SPEC}
    base.update(
        {name: spec.get("default") for name, spec in step_task.SPEC.items() if "default" in spec}
    )
    return step_task.act(
        {**base, "action": action, "state_file": str(state_file), "contract": CONTRACT, **params},
        False,
    )


def start_one_band(state: Path, running: list[int]) -> None:
    """A search over --max-running-requests alone at one band, as small as a search gets."""
    step(
        "start",
        state,
        space={"--max-running-requests": running},
        slo="tpot_ms_p99=20",
        bands=[1],
        budget_minutes=5.0,
        configs=["dflash"],
        base_config="dflash",
    )


@pytest.fixture(scope="module")
def levels(tmp_path_factory):
    """Two trials' level files: a fast config and a slow one, at concurrency 1 and 4."""
    root = tmp_path_factory.mktemp("run")
    plan = Plan(
        configs={"fast": Sim(step_ms=5.0), "slow": Sim(step_ms=30.0)},
        concurrency=(1, 4),
        num_prompts=8,
        max_new_tokens=16,
    )
    write_run(root, plan)
    return root / "node-a"


def finish(state: Path, inventory: Path) -> dict:
    """The finish step as the playbook takes it, for node-a's busiest band."""
    return step(
        "finish",
        state,
        inventory_dir=str(inventory),
        host="node-a",
        deploy_band=4,
        context={"run_id": "r1", "slo": "tpot_ms_p99=20"},
    )


def run_search(results: Path, levels: Path, inventory: Path) -> tuple[Path, dict]:
    """The steps as the playbook takes them, the state and trials under results (a host's
    folder of a run)."""
    state = results / "autotune" / "search.json"
    started = step(
        "start",
        state,
        space=SPACE,
        slo="tpot_ms_p99=20",
        bands=[1, 4],
        budget_minutes=30.0,
        rungs=[1],
        configs=["ar", "dflash"],
        base_config="dflash",
    )
    assert started["candidates"] == 2 and started["predicted"] == 0
    for source in ("fast", "slow"):
        trial = step("next", state)["trial"]
        assert trial["launch"]["environment"] == {"NCCL_ALGO": "Ring"}
        folder = results / trial["id"]
        shutil.copytree(levels / source, folder)
        step("record", state, trial_id=trial["id"], trial_dir=str(folder), trial_status="ok")
    assert step("next", state) == {"changed": False, "done": True, "stop": "converged"}
    return state, finish(state, inventory)


def test_the_steps_score_the_trials_and_write_the_pick_back(tmp_path, levels):
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    state, found = run_search(tmp_path / "results", levels, inventory)
    assert found["changed"] is True
    answer = yaml.safe_load(Path(found["path"]).read_text())
    # The fast trial (the first candidate) met the SLO; the slow one did not.
    assert answer["kimi_server_extra_args"] == ["--max-running-requests", "4"]
    assert answer["kimi_autotune_environment"] == {"NCCL_ALGO": "Ring"}
    assert answer["kimi_server_config"] == "dflash"
    band = answer["kimi_autotune"]["bands"]["4"]
    assert band["pick"]["goodput_requests_per_s"] > 0
    assert band["runner_up"]["goodput_requests_per_s"] == 0
    assert band["margin"]["within_interval"] is False
    assert answer["kimi_autotune"]["pick"] == {"--max-running-requests": 4, "NCCL_ALGO": "Ring"}
    assert Path(found["path"]) == inventory / "host_vars" / "node-a" / "autotune.yml"
    assert Path(found["path"]).read_text().startswith("# Written by autotune.yml")
    assert oct(os.stat(found["path"]).st_mode & 0o777) == "0o644"
    page = Path(found["page"]).read_text()
    assert "**--max-running-requests=4,NCCL_ALGO=Ring**" in page
    # The same answer again: nothing changes.
    again = finish(state, inventory)
    assert again["changed"] is False


@pytest.mark.parametrize("host", ["..", "a/b", "", "x\x00y"])
def test_a_host_name_that_leaves_host_vars_is_refused(tmp_path, levels, host):
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    state, _ = run_search(tmp_path / "results", levels, inventory)
    with pytest.raises(step_task.TaskError, match="cannot name a host_vars folder"):
        step("finish", state, inventory_dir=str(inventory), host=host, deploy_band=4)


def test_a_link_in_the_way_is_refused_and_nothing_is_written_through_it(tmp_path, levels):
    inventory = tmp_path / "inventory"
    (inventory / "host_vars").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (inventory / "host_vars" / "node-a").symlink_to(elsewhere)
    with pytest.raises(step_task.TaskError, match="symbolic link"):
        run_search(tmp_path / "results", levels, inventory)
    assert list(elsewhere.iterdir()) == []


def test_a_band_without_a_pick_writes_nothing_but_the_page(tmp_path):
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    state = tmp_path / "search.json"
    start_one_band(state, [4])
    trial = step("next", state)["trial"]
    step("record", state, trial_id=trial["id"], trial_dir=str(tmp_path / "none"),
         trial_status="failed", trial_error="CUDA out of memory")  # fmt: skip
    assert step("next", state)["stop"] == "exhausted"
    with pytest.raises(step_task.TaskError, match="no candidate was measured at band 1"):
        step("finish", state, inventory_dir=str(inventory), host="node-a", deploy_band=1)
    assert not (inventory / "host_vars").exists()
    assert "failed: CUDA out of memory" in (tmp_path / "search.md").read_text()


@pytest.mark.parametrize(
    "content", [b"", b"[]", b"{nope", json.dumps({"version": 99}).encode(), b"{" * 100_000]
)
def test_a_state_that_is_not_one_is_refused(tmp_path, content):
    state = tmp_path / "search.json"
    state.write_bytes(content)
    with pytest.raises(step_task.TaskError, match=r"search state|not a search state"):
        step("next", state)


def test_a_trial_recorded_twice_or_out_of_turn_is_refused(tmp_path):
    state = tmp_path / "search.json"
    start_one_band(state, [4, 8])
    trial = step("next", state)["trial"]
    with pytest.raises(step_task.TaskError, match="still running"):
        step("next", state)
    record = {"trial_id": trial["id"], "trial_dir": str(tmp_path), "trial_status": "failed"}
    step("record", state, **record)
    with pytest.raises(step_task.TaskError, match="no running trial"):
        step("record", state, **record)


def test_the_report_of_an_autotune_run_states_the_tuned_setting(tmp_path, levels):
    import analysis

    run = tmp_path / "run"
    write_run(
        run,
        Plan(configs={"ar": Sim(step_ms=20.0)}, concurrency=(1, 4), num_prompts=8),
    )
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    # The search's state where autotune.yml keeps it: results/<run>/<host>/autotune/.
    state, _found = run_search(run / "node-a", levels, inventory)
    assert state == run / "node-a" / "autotune" / "search.json"
    outcome = analysis.report(run, out=tmp_path / "report", slo={"tpot_ms_p99": 20.0})
    summary = (outcome.out / "summary.md").read_text()
    assert (
        "Tuned setting on node-a (autotune.yml, written to host_vars/node-a/autotune.yml): "
        "c1: --max-running-requests=4,NCCL_ALGO=Ring" in summary
    )
    rows = json.loads((outcome.out / "report.json").read_text())["autotune"]
    assert [(r["band"], r["tuned_setting"]) for r in rows] == [
        (1, "--max-running-requests=4,NCCL_ALGO=Ring"),
        (4, "--max-running-requests=4,NCCL_ALGO=Ring"),
    ]
    assert rows[0]["runner_up"] == "--max-running-requests=8,NCCL_ALGO=Ring"
    assert (outcome.out / "autotune.csv").is_file()
    assert "Tuned setting per band (autotune)" in (outcome.out / "report.html").read_text()
    # A state that is not one is named among the warnings, never read as a search.
    state.write_text("[1, 2]")
    hostile = analysis.report(run, out=tmp_path / "report2")
    warned = json.loads((hostile.out / "report.json").read_text())["warnings"]
    assert any(w["kind"] == "autotune" and "not a search state" in w["message"] for w in warned)
    assert not (hostile.out / "autotune.csv").exists()
