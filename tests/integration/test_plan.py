"""plan.yml: per-host plan files from the controller alone, for every shipped inventory."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.contract import plan_schema
from jsonschema import Draft202012Validator

from tests.support.ansible_run import local_sglang_git
from tests.support.hub_server import LocalHub, token_env

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.preflight, pytest.mark.integration]
TOKEN = "hf_plan_token_5e0a77c1"
INVENTORIES = sorted(p.name for p in (REPO / "inventory").iterdir() if p.is_dir())
MT_BENCH = "HuggingFaceH4/mt_bench_prompts"
PUBLIC_SGLANG = "https://github.com/sgl-project/sglang.git"


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
        # The prompt set whose revision is a branch (the others are pinned by commit).
        hub.add_dataset(MT_BENCH, {"raw/question.jsonl": b'{"turns": ["Hello?"]}\n'})
        hub.add_repo("Qwen/Qwen3.6-27B", {"config.json": b"{}", "q.safetensors": b"q" * 3000})
        hub.add_repo(
            "z-lab/Qwen3.6-27B-DFlash",
            {"q.safetensors": b"z" * 500},
            gated=True,
            approved_tokens={TOKEN},
        )
        yield hub


# The capacity plan's context length fields (issue 18): --context-length per launch; and
# DDTree's tree mask, which bounds it (issue 34).
CONTEXT_CAPACITY = (
    "context_length", "context_length_source", "max_context_length", "context_length_fits",
    "context_length_warning", "tree_mask_gib", "tree_mask_running_requests",
    "tree_mask_max_context",
)  # fmt: skip
# K2.6 plans from before models became data (tests/fixtures/plans-kimi-k2.6/README.md).
BEFORE_MODEL_DATA = REPO / "tests" / "fixtures" / "plans-kimi-k2.6"
# The plan fields that models as data added (issue 17), "[]" for any list index.
# The capacity plan's fields for a hybrid target's recurrent state (module_utils/plan/capacity.py,
# module_utils/plan/capacity_hybrid.py).
HYBRID_CAPACITY = (
    "attention", "verify_tokens", "max_running_requests", "mamba_ssm_dtype",
    "recurrent_state_bytes_per_request", "recurrent_state_bytes_per_verify_token",
    "verify_state_bytes_per_request", "recurrent_state_slots", "recurrent_state_gib",
    "verify_state_gib",
)  # fmt: skip
ADDED_BY_MODEL_DATA = {
    "/model",
    # The study lock (issue 20) came later; listed here so the old plans still compare.
    *(f"/study_lock/{key}" for key in ("path", "exists", "pins", "missing", "unresolved")),
    "/study_lock",
    # Whether DDTree's rules were read at the commit the study runs (issue 30).
    "/ddtree_rules",
    # The predicted decode speed per launch and benchmark level (issue 31).
    "/speed",
    # The download's time at the hosts' bandwidth, the model folder's size without the hub and
    # the disk a preflight measured (issue 34).
    "/download_time",
    "/download_estimate",
    "/disk",
    *(
        f"/serving_configs/{config}/{field}"
        for config in ("ar", "eagle3", "dflash", "ddtree", "dflash-tree-backend")
        for field in (
            "launch[]/tp_size",
            "launch[]/capacity",
            "launch[]/context_length",
            # Each launch's canary (issue 30): the same launch on the tiny checkpoints.
            "launch[]/canary",
            *(f"capacity/{key}" for key in HYBRID_CAPACITY + CONTEXT_CAPACITY),
            # Each launch's capacity by its role under prefill-decode disaggregation (issue 36).
            "capacity/role",
        )
    ),
}


def fields_changed(before, after, path: str = "") -> tuple[list[str], list[str]]:
    """(fields of before that after lacks or holds with another value, fields after adds)."""
    if isinstance(before, dict) and isinstance(after, dict):
        changed, added = [], [f"{path}/{key}" for key in after if key not in before]
        for key, value in before.items():
            if key not in after:
                changed.append(f"{path}/{key} (gone)")
            else:
                more_changed, more_added = fields_changed(value, after[key], f"{path}/{key}")
                changed += more_changed
                added += more_added
        return changed, added
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        changed, added = [], []
        for index, (old, new) in enumerate(zip(before, after, strict=True)):
            more_changed, more_added = fields_changed(old, new, f"{path}[{index}]")
            changed += more_changed
            added += more_added
        return changed, added
    return ([] if before == after else [f"{path}: {before!r} -> {after!r}"]), []


def run_plan(playbook, inventory, out: Path, endpoint: str, **extravars):
    """Writes the plan under out/; playbook() keeps its runner files elsewhere in tmp_path."""
    out.mkdir(parents=True, exist_ok=True)
    return playbook(
        "plan.yml",
        inventory,
        # One study lock for the plans of a test: a second plan finds what the first wrote.
        extravars={
            "plan_output_dir": str(out),
            "kimi_lock_file": str(out.parent / "kimi.lock.yml"),
            **extravars,
        },
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
        # docs/schema/plan.schema.json holds of what the template renders.
        errors = Draft202012Validator(plan_schema.schema()).iter_errors(plan)
        assert [f"{list(e.absolute_path)}: {e.message}" for e in errors] == []
        assert plan["profile"] == profile
        assert plan["hardware"]["gpu_model"] == declared["kimi_gpu_model"]
        assert plan["hardware"]["interconnect"] == declared["kimi_interconnect"]
        assert plan["hub"]["reachable"] is True
        assert plan["download_bytes"] == 4002 + 2000 + 1000
        assert plan["repos"]["dflash"]["access"] == "ok"
        assert len(plan["repos"]["target"]["resolved_sha"]) == 40
        # The chain control comes along with ddtree, on the same runtime and tree backend.
        assert set(plan["serving_configs"]) == {
            "ar", "eagle3", "dflash", "ddtree", "dflash-tree-backend"
        }  # fmt: skip
        assert plan["serving_configs"]["dflash-tree-backend"]["control_for"] == "ddtree"
        assert plan["serving_configs"]["ddtree"]["control_for"] is None
        for config in plan["serving_configs"].values():
            # auto: each launch's context length is its own capacity plan's figure.
            for launch in config["launch"]:
                argv, capacity = launch["argv"], launch["capacity"]
                given = int(argv[argv.index("--context-length") + 1])
                assert given == launch["context_length"] == capacity["context_length"]
                assert given == min(capacity["kv_tokens"], 262144)
                assert argv[argv.index("--served-model-name") + 1] == "moonshotai/Kimi-K2.6"
            assert config["capacity"]["fits"] is True
            assert config["capacity"]["weights_gib_per_gpu"] == pytest.approx(71.82, abs=0.01)
            # DDTree's launches plan the tree mask a step builds; the others have none.
            for launch in config["launch"]:
                argv, capacity = launch["argv"], launch["capacity"]
                if "--speculative-ddtree-budget" not in argv:
                    assert capacity["tree_mask_gib"] is None, launch["name"]
                    continue
                budget = int(argv[argv.index("--speculative-ddtree-budget") + 1])
                assert capacity["tree_mask_running_requests"] == 48
                masks = 48 * (budget + 1) * (capacity["context_length"] + budget + 1)
                assert capacity["tree_mask_gib"] == round(masks / 2**30, 2)
                assert capacity["tree_mask_max_context"] > capacity["context_length"]
        check_launch_commands(plan)
        # K2.6's settings moved into models/kimi-k2.6/: its plan may gain fields, never change one.
        before = json.loads(
            (BEFORE_MODEL_DATA / f"{profile}.json")
            .read_text()
            # Tests plan the DDTree runtime from a local repository, never the public one.
            .replace(PUBLIC_SGLANG, local_sglang_git()["url"])
        )
        before["hub"]["endpoint"] = plan["hub"]["endpoint"]
        changed, added = fields_changed(before, plan)
        assert changed == [], changed
        assert {re.sub(r"\[\d+\]", "[]", field) for field in added} <= ADDED_BY_MODEL_DATA, added
        markdown = (out / name / "plan.md").read_text()
        assert f"# Deploy plan for {name} ({profile})" in markdown
        check_speed(plan, markdown, profile)
        # The tests' DDTree ref is a local repository's: its commit is not the one the kit's
        # rules were read at, and the plan says so with both commits and the files to re-read.
        rules = plan["ddtree_rules"]
        locked = plan["study_lock"]["pins"]["git"]["sglang"]["commit"]
        assert rules["drift"] is True and rules["commit"] == locked != rules["read_at"]
        assert rules["read_at"] == "93e9850e430035f8a363fd881a6a0c5436b95108"
        assert rules["files"] == [
            "tests/contract/sglang-pr29907-overlay.json", "tests/contract/README.md"
        ]  # fmt: skip
        assert "**DDTree rules read at another commit.** " + rules["message"] in markdown
        assert locked in rules["message"] and rules["read_at"] in rules["message"]
        said = run.results("Say when the kit's DDTree rules were read at another commit")
        assert said[name]["msg"] == rules["message"]
        assert "| ddtree | dflash |" in markdown
        # The fixture hub's few bytes: well under a minute at either bandwidth.
        assert plan["download_time"] == [
            {"gbps": gbps, "seconds": round(plan["download_bytes"] * 8 / (gbps * 1e9), 1)}
            for gbps in (1.0, 10.0)
        ]
        assert (
            "Download time: under a minute at 1 Gbit/s (kimi_download_gbps), under a minute "
            "at 10 Gbit/s." in markdown
        )
        for launch in plan["serving_configs"]["ddtree"]["launch"]:
            capacity = launch["capacity"]
            assert (
                f"| {launch['name']} | 48 | {capacity['tree_mask_gib']} | "
                f"{capacity['tree_mask_max_context']} |"
            ) in markdown
        assert "| dflash-tree-backend | dflash |" in markdown
        assert "dflash-tree-backend (git+" in markdown
        assert markdown.count("Contract sglang-0.5.23: passed.") == 3
        assert markdown.count("Contract sglang-0.5.23+pr29907: passed.") == 5
        assert "FAILED" not in markdown and "Not checked" not in markdown
        # The run ends with what it wrote, printed by a task (ansible-runner and AWX show it).
        summary = run.results("Say which files the plan wrote")[name]["msg"]
        assert f"{out / name}/plan.md" in summary and f"{out / name}/plan.json" in summary
        assert f"Study lock: {out.parent / 'kimi.lock.yml'} (written)" in summary, summary
    # Plan files, and everything ansible-runner wrote (events, artifacts, stdout).
    for written in tmp_path.rglob("*"):
        if written.is_file() and written.name != "hf-token":
            assert TOKEN not in written.read_text(errors="replace"), f"token written to {written}"
    assert TOKEN not in run.stdout
    # Writing the same plan again changes nothing; the role does not depend on the profile for
    # that, so one profile shows it (each run is about 10 s of make test).
    if profile == "ct200":
        run_plan(playbook, inventory, out, hub.url).assert_unchanged()


# The benchmark's levels and prompt sets (group_vars/all/benchmark.yml), and the context per
# request they give: 200 prompt tokens plus half of 512 new ones.
LEVELS = [1, 4, 16, 64]
PROMPT_SETS = ["gsm8k", "mt-bench", "humaneval", "math500", "mbpp"]


def whole(value: float) -> int:
    """Jinja's round | int (Python's round, then the integer)."""
    return int(round(value, 0))


def speed_rates(entry: dict, level: int, prompt_set: str) -> dict:
    [found] = [lv for lv in entry["levels"] if lv["concurrency"] == level]
    [group] = [g for g in found["by_prompt_set"] if prompt_set in g["prompt_sets"]]
    return {**group, "batch": found["batch"], "step_ms": found["step_ms"]}


def best_budget_line(plan: dict, key: str) -> str:
    """plan.md's line for a DDTree config's best budgets, from plan.json."""
    speed = plan["speed"]
    curves = speed["ddtree"][key]["curves"]
    groups = []
    for curve in curves:
        if curve["prompt_sets"] not in groups:
            groups.append(curve["prompt_sets"])
    said = "; ".join(
        ", ".join(sets) + ": " + ", ".join(
            f"{c['best_budget']} at c{c['concurrency']}" for c in curves if c["prompt_sets"] == sets
        )
        for sets in groups
    )  # fmt: skip
    return (
        f"**DDTree best budget ({key}, {speed['profile']}):** the budget past which the model "
        f"predicts no further gain: {said}."
    )


def check_speed(plan: dict, markdown: str, profile: str) -> None:
    """plan.json's `speed` and plan.md's section: every launch at every benchmark level, with
    the step's parts, accepted tokens and tokens/s, DDTree's curve and best budget, sources."""
    speed = plan["speed"]
    launches = {
        launch["name"]: launch
        for config in plan["serving_configs"].values()
        for launch in config["launch"]
    }
    assert set(speed["launches"]) == set(launches)
    assert speed["profile"] == profile and speed["calibration"] is None
    assert speed["concurrency"] == LEVELS and speed["prompt_sets"] == PROMPT_SETS
    assert speed["context_tokens"] == 200 + 512 // 2
    # The all-reduce check's record stays on the host, which the plan never contacts.
    assert speed["allreduce_measured"] is False
    assert "tuning_allreduce_baseline_file" in speed["sources"]["allreduce"]
    assert "not on this controller" in speed["sources"]["calibration"]
    for field, value in speed["figures"].items():
        assert value > 0 and speed["sources"][field], field
    assert set(speed["sources"]["acceptance"]) == {"dflash", "eagle3"}
    for name, entry in speed["launches"].items():
        argv = launches[name]["argv"]
        assert entry["reason"] is None, (name, entry["reason"])
        assert entry["tp_size"] == launches[name]["tp_size"] == 8
        assert entry["kv_cache_dtype"] == argv[argv.index("--kv-cache-dtype") + 1]
        assert [level["concurrency"] for level in entry["levels"]] == LEVELS
        for level in entry["levels"]:
            assert level["step_ms"] == pytest.approx(
                sum(part["ms"] for part in level["parts"].values()), abs=0.01
            )
            for group in level["by_prompt_set"]:
                assert group["tokens_per_s"] > 0 and group["accepted_tokens_per_step"] >= 1
    # Speculative decoding runs 48 requests at once by default: c64's clients share them.
    dflash = speed_rates(speed["launches"]["dflash"], 64, "gsm8k")
    assert dflash["batch"] == 48
    assert dflash["tokens_per_s"] == pytest.approx(
        dflash["tokens_per_s_per_request"] * 64, rel=1e-3
    )
    assert speed_rates(speed["launches"]["ar"], 64, "gsm8k")["batch"] == 64
    assert speed["launches"]["ddtree-b32"]["verify_tokens_per_request"] == 33
    tree = speed["ddtree"]["ddtree"]
    assert tree["budgets"] == [16, 32, 64, 128]
    assert len(tree["curves"]) == 4 * len(LEVELS)  # DFlash's four published figures
    for curve in tree["curves"]:
        assert 1 <= curve["best_budget"] <= 128
        assert curve["best_of_budgets"] in tree["budgets"]
        assert [point["budget"] for point in curve["points"]] == tree["budgets"]
    curve = tree["curves"][-1]
    cells = " | ".join(
        f"{whole(p['tokens_per_s'])} ({round(p['step_ms'], 1)} ms, {p['accepted_tokens_per_step']})"
        for p in curve["points"]
    )
    row = (
        f"| {', '.join(curve['prompt_sets'])} | {curve['concurrency']} | {cells} | "
        f"{curve['best_of_budgets']} | {curve['best_budget']} |"
    )
    assert row in markdown, row

    assert "## Predicted decode speed" in markdown
    assert f"on the {profile} profile's\nfigures (nominal: no calibration record" in markdown
    assert best_budget_line(plan, "ddtree") in markdown
    for name in ("ar", "dflash"):
        entry = speed["launches"][name]
        group = entry["acceptance"][0]
        cells = " | ".join(
            f"{whole(rate['tokens_per_s_per_request'])} / {whole(rate['tokens_per_s'])}"
            for rate in (speed_rates(entry, level, group["prompt_sets"][0]) for level in LEVELS)
        )
        accepted = entry["levels"][0]["by_prompt_set"][0]["accepted_tokens_per_step"]
        row = f"| {name} | {', '.join(group['prompt_sets'])} | {accepted} | {cells} |"
        assert row in markdown, row
    step = speed["launches"]["ddtree-b128"]["levels"][-1]
    assert f"| ddtree-b128 | 64 | 48 | {48 * 129} | {round(step['step_ms'], 2)} |" in markdown


def kit_copy(tmp_path: Path) -> Path:
    """A kit folder whose plan/ is under tmp_path: models and contracts linked from the repo."""
    kit = tmp_path / "kit"
    (kit / "tests").mkdir(parents=True)
    (kit / "models").symlink_to(REPO / "models")
    (kit / "tests" / "contract").symlink_to(REPO / "tests" / "contract")
    return kit


def test_the_hybrid_model_plans_under_its_own_folder_at_tp1(playbook, hub, tmp_path):
    """kimi_model=qwen3.6-27b: its repositories, its configs (no EAGLE-3), TP1 on one RTX PRO
    6000 with room for every budget, launch commands both contracts accept, and a plan under
    plan/qwen3.6-27b/<host>/ that leaves K2.6's plan/<host>/ alone."""
    kit = kit_copy(tmp_path)
    (kit / "plan" / "ct200-node-01").mkdir(parents=True)
    (kit / "plan" / "ct200-node-01" / "plan.json").write_text('{"model": "K2.6, untouched"}')
    run = playbook(
        "plan.yml",
        REPO / "inventory" / "ct200",
        extravars={"kimi_model": "qwen3.6-27b", "kimi_kit_dir": str(kit)},
        envvars={"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", **token_env(TOKEN, tmp_path)},
    )
    assert run.rc == 0, run.stdout
    untouched = json.loads((kit / "plan" / "ct200-node-01" / "plan.json").read_text())
    assert untouched == {"model": "K2.6, untouched"}
    plan = json.loads((kit / "plan" / "qwen3.6-27b" / "ct200-node-01" / "plan.json").read_text())
    assert plan["model"] == {"name": "qwen3.6-27b", "title": "Qwen3.6-27B", "attention": "hybrid"}
    assert plan["hardware"]["tp_size"] == 1
    assert set(plan["repos"]) == {"target", "dflash"}
    assert plan["repos"]["target"]["repo_id"] == "Qwen/Qwen3.6-27B"
    assert plan["repos"]["dflash"]["access"] == "ok"
    assert plan["download_bytes"] == 3002 + 500
    assert set(plan["serving_configs"]) == {"ar", "dflash", "ddtree", "dflash-tree-backend"}
    launches = [launch for c in plan["serving_configs"].values() for launch in c["launch"]]
    assert sorted(launch["name"] for launch in launches) == [
        "ar", "ddtree-b15", "ddtree-b32", "ddtree-b64", "dflash", "dflash-tree-backend"
    ]  # fmt: skip
    assert plan["validation"]["failed"] == [] and plan["validation"]["unchecked"] == []
    for launch in launches:
        argv = launch["argv"]
        assert argv[argv.index("--model-path") + 1] == "/opt/kimi/weights/Qwen/Qwen3.6-27B"
        assert argv[argv.index("--tp-size") + 1] == "1"
        assert argv[argv.index("--tool-call-parser") + 1] == "qwen3_coder"
        assert argv[argv.index("--reasoning-parser") + 1] == "qwen3"
        assert launch["capacity"]["fits"] is True, launch["capacity"]
    for config in plan["serving_configs"].values():
        assert config["capacity"]["fits"] is True
        assert config["capacity"]["weights_gib_per_gpu"] < 60
    # DDTree keeps recurrent state per verified tree node: a bigger budget holds fewer tokens.
    tokens = {
        launch["budget"]: launch["capacity"]["kv_tokens"]
        for launch in plan["serving_configs"]["ddtree"]["launch"]
    }
    assert tokens[15] > tokens[32] > tokens[64] > 0
    assert plan["serving_configs"]["ddtree"]["capacity"] == min(
        (launch["capacity"] for launch in plan["serving_configs"]["ddtree"]["launch"]),
        key=lambda capacity: capacity["kv_tokens"],
    )
    markdown = (kit / "plan" / "qwen3.6-27b" / "ct200-node-01" / "plan.md").read_text()
    assert "Model: Qwen3.6-27B (`qwen3.6-27b`, hybrid)." in markdown
    # Its speed at TP1: no routed experts, its drafter's one published figure for every set,
    # the running cap its recurrent state pools allow, DDTree's curve over its own budgets.
    speed = plan["speed"]
    assert set(speed["launches"]) == {launch["name"] for launch in launches}
    for name, entry in speed["launches"].items():
        assert entry["reason"] is None and entry["tp_size"] == 1, name
        for level in entry["levels"]:
            assert "routed_experts" not in level["parts"]
            assert all(group["tokens_per_s"] > 0 for group in level["by_prompt_set"])
    dflash = speed["launches"]["dflash"]
    assert [group["prompt_sets"] for group in dflash["acceptance"]] == [PROMPT_SETS]
    assert dflash["acceptance"][0]["published_accept_length"] == 15.0
    assert dflash["max_running_requests_source"].startswith("the capacity plan")
    tree = speed["ddtree"]["ddtree"]
    assert tree["budgets"] == [15, 32, 64] and tree["block_size"] == 16
    assert all(1 <= curve["best_budget"] <= 64 for curve in tree["curves"])
    assert best_budget_line(plan, "ddtree") in markdown


CALIBRATION = {
    "schema": 1,
    "kind": "kimi-speed-calibration",
    "measured_at": "2026-12-02T00:00:00Z",
    "gpu": {"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition"},
    "copy_gbs": 1500.0,
    "moe": {
        "hidden": 7168, "intermediate": 256, "experts": 384, "top_k": 8, "weight_bytes": 2,
        "rows": [{"tokens": 1, "experts_touched": 8.0, "ms": 0.2},
                 {"tokens": 65, "experts_touched": 280.5, "ms": 3.1}],
    },
}  # fmt: skip


def test_the_plan_predicts_from_the_host_s_calibration_record_and_refuses_a_bad_one(
    playbook, hub, tmp_path
):
    """A calibration record the controller holds for the host (state/<host>/, where the
    calibration's fetch puts it) replaces the nominal figures; a malformed one stops the plan
    naming the file and the fix. The benchmark's own variables, given to plan.yml as a study
    file gives them, set the levels, prompt sets and context the plan predicts."""
    kit = kit_copy(tmp_path)
    record = kit / "state" / "ct200-node-01" / "speed-calibration.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps(CALIBRATION))
    envvars = {"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", **token_env(TOKEN, tmp_path)}
    extravars = {
        "kimi_kit_dir": str(kit),
        "plan_check_hub": False,
        "benchmark_concurrency": [2, 8],
        "benchmark_prompt_sets": ["mt-bench"],
        "benchmark_max_new_tokens": 100,
    }
    run = playbook("plan.yml", REPO / "inventory" / "ct200", extravars=extravars, envvars=envvars)
    assert run.rc == 0, run.stdout
    plan = json.loads((kit / "plan" / "ct200-node-01" / "plan.json").read_text())
    speed = plan["speed"]
    assert speed["calibration"] == f"this host's calibration record {record}"
    assert speed["figures"]["copy_gbs"] == 1500.0
    assert speed["sources"]["copy_gbs"] == (
        "this host's calibration (NVIDIA RTX PRO 6000 Blackwell Server Edition, "
        "2026-12-02T00:00:00Z)"
    )
    assert speed["sources"]["calibration"] == f"{record} (used)"
    assert speed["concurrency"] == [2, 8] and speed["prompt_sets"] == ["mt-bench"]
    assert speed["context_tokens"] == 200 + 100 // 2
    dflash = speed["launches"]["dflash"]
    assert [level["concurrency"] for level in dflash["levels"]] == [2, 8]
    assert dflash["acceptance"][0]["published_accept_length"] == 3.7
    markdown = (kit / "plan" / "ct200-node-01" / "plan.md").read_text()
    assert f"figures (this host's calibration record {record})." in markdown

    record.write_text(json.dumps({**CALIBRATION, "copy_gbs": -5}))
    run = playbook("plan.yml", REPO / "inventory" / "ct200", extravars=extravars, envvars=envvars)
    assert run.rc != 0
    [failed] = run.results(
        "Predict each launch's decode speed at the benchmark's concurrency levels"
    ).values()
    assert failed["failed"]
    assert f"this host's calibration record {record}: copy_gbs is -5" in failed["msg"]
    assert "remove the file to plan with the nominal figures" in failed["msg"]


def test_the_study_lock_lives_beside_the_inventory_and_the_old_place_is_followed_until_moved(
    playbook, hub, tmp_path
):
    """The lab's copy of an inventory (cp -a inventory/ct200 inventory/mylab) holds its study
    lock; a lock at the repository root, where the kit kept it before, is followed while none
    is beside the inventory, and the run says where to move it."""
    kit = kit_copy(tmp_path)
    mylab = tmp_path / "inventory" / "mylab"
    mylab.mkdir(parents=True)
    shutil.copy(REPO / "inventory" / "ct200" / "hosts.yml", mylab)
    (mylab / "group_vars").symlink_to(REPO / "group_vars")
    old_place = kit / "kimi.lock.yml"
    envvars = {"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", **token_env(TOKEN, tmp_path)}
    extravars = {"kimi_kit_dir": str(kit)}
    written = playbook(
        "plan.yml",
        mylab,
        extravars={**extravars, "kimi_lock_file": str(old_place)},
        envvars=envvars,
    )
    assert written.rc == 0 and old_place.exists(), written.stdout
    extravars["kimi_lock_file"] = None  # the kit's own place

    followed = playbook("plan.yml", mylab, extravars=extravars, envvars=envvars)
    assert followed.rc == 0, followed.stdout
    moved = followed.results("Say that the study lock has moved beside the inventory")
    assert moved["ct200-node-01"]["msg"] == (
        f"The study lock {old_place} is at the repository root, where the kit kept it before; "
        "it now lives beside the inventory. This run follows it there. Fix: mv "
        f"{old_place} {mylab / 'kimi.lock.yml'} (or set kimi_lock_file)."
    )
    assert not (mylab / "kimi.lock.yml").exists()
    said = followed.results("Say which files the plan wrote")["ct200-node-01"]["msg"]
    assert f"Study lock: {old_place} (unchanged)" in said

    old_place.rename(mylab / "kimi.lock.yml")
    beside = playbook("plan.yml", mylab, extravars=extravars, envvars=envvars)
    assert beside.rc == 0, beside.stdout
    assert not beside.results("Say that the study lock has moved beside the inventory")
    said = beside.results("Say which files the plan wrote")["ct200-node-01"]["msg"]
    assert f"Study lock: {mylab / 'kimi.lock.yml'} (unchanged)" in said
    assert not old_place.exists()


def test_a_labs_inventory_copy_holds_its_own_settings_over_the_kits_defaults(playbook, tmp_path):
    """cp -a inventory/ct200 inventory/mylab, then the lab's settings in its
    group_vars/gpu_hosts.yml: they win over the kit's defaults (group_vars/all), the profile's
    settings win over them, a host's own win over both; no tracked file is edited."""
    (tmp_path / "group_vars").symlink_to(REPO / "group_vars")  # the kit, as ../../ sees it
    mylab = tmp_path / "inventory" / "mylab"
    shutil.copytree(REPO / "inventory" / "ct200", mylab, symlinks=True)
    assert (mylab / "group_vars" / "all").is_symlink()
    (mylab / "group_vars" / "gpu_hosts.yml").write_text(
        "kimi_weights_dir: /data/lab/weights\n"
        "kimi_download_gbps: 25\n"
        "kimi_gpu_model: not the profile's\n"
        "kimi_context_length: 200000\n"
    )
    hosts = yaml.safe_load((mylab / "hosts.yml").read_text())
    node = hosts["all"]["children"]["gpu_hosts"]["children"]["ct200"]["hosts"]["ct200-node-01"]
    node["kimi_download_gbps"] = 50
    (mylab / "hosts.yml").write_text(yaml.safe_dump(hosts))
    out = tmp_path / "plan"
    run = playbook(
        "plan.yml",
        mylab,
        extravars={"plan_output_dir": str(out), "plan_check_hub": False},
    )
    assert run.rc == 0, run.stdout
    plan = json.loads((out / "ct200-node-01" / "plan.json").read_text())
    assert plan["weights_dir"] == "/data/lab/weights"
    assert plan["download_time"][0]["gbps"] == 50.0
    assert plan["hardware"]["gpu_model"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    # The lab's context length outruns every pool: one warning per distinct text, naming
    # every launch it concerns (the drafted ones share their pool), in plan.md and the output.
    drafted = "dflash, dflash-tree-backend, ddtree-b16, ddtree-b32, ddtree-b64, ddtree-b128"
    markdown = (out / "ct200-node-01" / "plan.md").read_text()
    assert markdown.count("**Warning, ") == 3
    assert f"**Warning, {drafted}:** one request at context_length 200000 does not fit" in (
        markdown
    )
    said = run.results("Say which launches cannot take one request at their context length")
    lines = said["ct200-node-01"]["msg"]
    assert [line.split(":")[0] for line in lines] == ["ar", "eagle3", drafted]


def test_a_hub_that_does_not_answer_stops_the_plan_unless_it_is_not_asked(playbook, tmp_path):
    """A plan whose lock pins none of the weights and whose sizes are unknown is no plan to
    deploy from: it fails, naming the hub and both fixes, and writes no lock. With
    plan_check_hub=false it is made without the hub and says what that leaves out."""
    # A closed port on this machine: nothing leaves it.
    out, hub = tmp_path / "plan", "http://127.0.0.1:9"
    run = run_plan(playbook, REPO / "inventory" / "ct200", out, hub)
    assert run.rc != 0
    failed = run.results("Resolve the study lock")["ct200-node-01"]
    assert failed["failed"]
    assert f"the hub at {hub} could not be reached" in failed["msg"]
    assert "Fix: check proxy settings or HF_ENDPOINT" in failed["msg"]
    assert "the study lock" in failed["msg"] and "is as it was" in failed["msg"]
    assert failed["msg"].endswith("-e plan_check_hub=false.")
    assert not (tmp_path / "kimi.lock.yml").exists()
    assert not (out / "ct200-node-01" / "plan.json").exists()

    offline = run_plan(playbook, REPO / "inventory" / "ct200", out, hub, plan_check_hub=False)
    assert offline.rc == 0, offline.stdout
    plan = json.loads((out / "ct200-node-01" / "plan.json").read_text())
    assert plan["hub"]["asked"] is False and plan["download_bytes"] is None
    assert plan["download_time"] == [
        {"gbps": 1.0, "seconds": None},
        {"gbps": 10.0, "seconds": None},
    ]
    assert "nothing new is pinned" in plan["hub"]["note"]
    assert plan["serving_configs"]["ar"]["capacity"]["fits"] is True
    markdown = (out / "ct200-node-01" / "plan.md").read_text()
    assert "Download size: unknown" in markdown and "nothing new is pinned" in markdown
    said = offline.results("Say which files the plan wrote")["ct200-node-01"]["msg"]
    assert plan["hub"]["note"] in said
    # The model folder's sizes, marked as such: all but EAGLE-3's, which it does not know.
    k26 = round((554.3 + 6.5) * 2**30)
    source = "models/kimi-k2.6/model.yml"
    assert plan["download_estimate"] == {"bytes": k26, "unknown": ["eagle3"], "source": source}
    assert f"at least 560.8 GiB by the model folder's figures ({source}), which lack eagle3" in (
        markdown
    )
    assert plan["disk"] is None
    assert "Disk left after the download: unknown until preflight has measured" in markdown

    # Configs whose repositories the folder sizes all, and a host a preflight has measured.
    state = tmp_path / "state"
    (state / "ct200-node-01").mkdir(parents=True)
    free = 600 * 2**30
    disk = {"path": "/opt/kimi/weights", "measured_at": "/opt", "free_bytes": free}
    record = {"kind": "kimi.preflight", "disk": {**disk, "recorded_at": "2026-12-01T10:00:00Z"}}
    (state / "ct200-node-01" / "preflight.json").write_text(json.dumps(record))
    sized = run_plan(
        playbook,
        REPO / "inventory" / "ct200",
        out,
        hub,
        plan_check_hub=False,
        plan_state_dir=str(state),
        kimi_serving_configs=["ar", "dflash"],
    )
    assert sized.rc == 0, sized.stdout
    plan = json.loads((out / "ct200-node-01" / "plan.json").read_text())
    assert plan["download_estimate"]["unknown"] == [] and plan["download_bytes"] is None
    assert plan["download_time"][0] == {"gbps": 1.0, "seconds": round(k26 * 8 / 1e9, 1)}
    assert plan["disk"]["left_bytes"] == free - k26
    markdown = (out / "ct200-node-01" / "plan.md").read_text()
    assert f"Download size: about 560.8 GiB, the model folder's figure ({source})" in markdown
    assert "Download time: about 1 h 20 min at 1 Gbit/s" in markdown
    assert "Disk left after the download: 39.2 GiB of 600.0 GiB free on /opt" in markdown


def test_a_lock_that_pins_everything_still_needs_the_hub_for_sizes(playbook, hub, tmp_path):
    """With every entry already pinned to a commit the lock asks the hub nothing; the file
    lists and sizes still come from it, so a hub that does not answer stops the plan there."""
    out = tmp_path / "plan"
    assert run_plan(playbook, REPO / "inventory" / "ct200", out, hub.url).rc == 0
    lock = (tmp_path / "kimi.lock.yml").read_text()
    run = run_plan(playbook, REPO / "inventory" / "ct200", out, "http://127.0.0.1:9")
    assert run.rc != 0
    assert run.results("Resolve the study lock")["ct200-node-01"]["failed"] is False
    failed = run.results("Stop when the hub cannot be reached")["ct200-node-01"]
    assert failed["msg"].startswith(
        "The hub at http://127.0.0.1:9 could not be reached from the controller: "
    )
    assert failed["msg"].endswith("-e plan_check_hub=false.")
    assert (tmp_path / "kimi.lock.yml").read_text() == lock


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


def test_multi_node_ranks_and_pd_roles_come_from_inventory_groups(playbook, hub, tmp_path):
    """Two H200 hosts in one group serve one model: ranks by position, head's address. Two
    RTX PRO 6000 hosts split prefill and decode: each launch planned for what its role holds."""
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "group_vars").symlink_to(REPO / "group_vars")
    hosts = {"h200-head": {"ansible_host": "10.9.0.1"}, "h200-second": {"ansible_host": "10.9.0.2"}}
    split = {
        "ct200-prefill": {"ansible_host": "10.9.0.3"},
        "ct200-decode": {"ansible_host": "10.9.0.4"},
    }
    (inventory / "hosts.yml").write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "gpu_hosts": {
                            "children": {"h200": {"hosts": hosts}, "ct200": {"hosts": split}}
                        },
                        "kimi_cluster_pair": {"hosts": {name: None for name in hosts}},
                        "kimi_prefill_pd": {"hosts": {"ct200-prefill": None}},
                        "kimi_decode_pd": {"hosts": {"ct200-decode": None}},
                        "kimi_router_pd": {"hosts": {name: None for name in split}},
                    },
                }
            }
        )
    )
    out = tmp_path / "out"
    run = run_plan(playbook, inventory, out, hub.url)
    assert run.rc == 0, run.stdout
    check_pd_roles(out)
    for rank, name in enumerate(hosts):
        plan = json.loads((out / name / "plan.json").read_text())
        argv = plan["serving_configs"]["ar"]["launch"][0]["argv"]
        flags = argv[argv.index("--nnodes") :][:6]
        assert flags == [
            "--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", "10.9.0.1:50000"
        ]  # fmt: skip


def check_pd_roles(out: Path) -> None:
    """The prefill and decode hosts' plans: each launch's role, what it holds per request at
    the plan's workload (200 prompt tokens, 512 new) and a decode server's auto context, which
    leaves SGLang's 512 reserved decode tokens free (module_utils/plan/capacity_roles.py)."""
    plans = {
        role: json.loads((out / f"ct200-{role}" / "plan.json").read_text())
        for role in ("prefill", "decode")
    }
    for role, plan in plans.items():
        [launch] = plan["serving_configs"]["ar"]["launch"]
        assert launch["argv"][launch["argv"].index("--disaggregation-mode") + 1] == role
        capacity = launch["capacity"]
        assert capacity["role"]["role"] == role
        assert capacity["role"]["cuda_graph"] is (role == "decode")
        pool = capacity["kv_tokens"]
        if role == "prefill":
            assert capacity["role"]["requests_at_workload"] == pool // 200
            assert capacity["context_length"] == pool
        else:
            assert capacity["role"]["requests_at_workload"] == pool // (200 + 512 + 512)
            assert capacity["context_length"] == pool - 512
            assert launch["argv"][launch["argv"].index("--context-length") + 1] == str(pool - 512)
        markdown = (out / f"ct200-{role}" / "plan.md").read_text()
        assert f"| ar | {role} | {'no' if role == 'prefill' else 'yes'} |" in markdown
        assert "**Warning" not in markdown


CONTRACT = REPO / "tests" / "contract"
SNAPSHOT = CONTRACT / "sglang-0.5.23-args.json"
OVERLAY = CONTRACT / "sglang-pr29907-overlay.json"
DDTREE_LAUNCHES = {"ddtree-b16", "ddtree-b32", "ddtree-b64", "ddtree-b128"}


def check_launch_commands(plan: dict) -> None:
    """The contract: every argv the kit renders passes its runtime's contract (the release's
    parser; for the git runtime, that plus the DDTree pull request's overlay), the plan records
    so per launch, and the same argv with one flag misspelt does not pass."""
    from ansible.module_utils.plan.sglang_args import (
        check_argv,
        load_contract,
        load_snapshot,
        validate_argv,
    )

    release = load_snapshot(SNAPSHOT)
    git = load_contract(SNAPSHOT, OVERLAY)
    launches = [
        launch for config in plan["serving_configs"].values() for launch in config["launch"]
    ]
    names = {launch["name"] for launch in launches}
    assert names == {"ar", "eagle3", "dflash", "dflash-tree-backend", *DDTREE_LAUNCHES}
    # In serving order: the chain control just before the DDTree budgets it is compared with.
    assert plan["validation"] == {
        "passed": [
            "ar", "eagle3", "dflash", "dflash-tree-backend",
            "ddtree-b16", "ddtree-b32", "ddtree-b64", "ddtree-b128",
        ],
        "failed": [],
        "unchecked": [],
    }  # fmt: skip
    for launch in launches:
        check_canary(launch)
        argv = launch["argv"]
        assert argv[1:3] == ["-m", "sglang.launch_server"]
        assert launch["environment"]["HF_HUB_OFFLINE"] == "1"
        on_git = launch["runtime"].startswith("git+")
        assert on_git == (launch["name"] in DDTREE_LAUNCHES | {"dflash-tree-backend"})
        contract = git if on_git else release
        assert launch["validation"] == {
            "ok": True,
            "errors": [],
            "contract": "sglang-0.5.23+pr29907" if on_git else "sglang-0.5.23",
        }
        validate_argv(argv[3:], contract)
        misspelt = [a.replace("--mem-fraction-static", "--mem-fraction-statik") for a in argv[3:]]
        [error] = check_argv(misspelt, contract)
        assert error.flag == "--mem-fraction-statik"
        if launch["name"] in DDTREE_LAUNCHES:
            # The release has no DDTree; a misspelt DDTree flag fails against the overlay.
            assert check_argv(argv[3:], release)[0].flag == "--speculative-ddtree-budget"
            typo = [
                a.replace("--speculative-ddtree-budget", "--speculative-ddtree-budgt")
                for a in argv[3:]
            ]
            [error] = check_argv(typo, git)
            assert error.flag == "--speculative-ddtree-budgt"
            assert "did you mean --speculative-ddtree-budget" in str(error)
            budget = int(argv[argv.index("--speculative-ddtree-budget") + 1])
            assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "8"
            assert budget > 8 - 1  # every default budget is a full tree: triton, page size 1
            assert argv[argv.index("--attention-backend") + 1] == "triton"
            assert argv[argv.index("--page-size") + 1] == "1"
            assert "--disable-overlap-schedule" in argv


# What a canary's argv may change of its launch's: the tiny checkpoints' paths, the memory
# and context, where it listens, and the API key (a loopback canary has none).
CANARY_FLAGS = {
    "--model-path",
    "--speculative-draft-model-path",
    "--mem-fraction-static",
    "--context-length",
    "--host",
    "--port",
    "--config",
    "--api-key",
}


def flag_values(argv: list[str]) -> dict[str, list[str]]:
    """A launch argv (after `python -m sglang.launch_server`) as flag -> its values, in order."""
    flags: dict[str, list[str]] = {}
    current = None
    for arg in argv[3:]:
        if arg.startswith("--"):
            current = arg
            flags.setdefault(current, [])
        else:
            assert current is not None, argv
            flags[current].append(arg)
    return flags


def check_canary(launch: dict) -> None:
    """plan.json's canary of a launch: the same runtime python and the same flags in the same
    order, but for CANARY_FLAGS; the same environment plus HF_HUB_OFFLINE."""
    canary = launch["canary"]
    real, tiny = flag_values(launch["argv"]), flag_values(canary["argv"])
    assert canary["argv"][:3] == launch["argv"][:3]
    differ = {flag for flag in real.keys() | tiny.keys() if real.get(flag) != tiny.get(flag)}
    assert differ <= CANARY_FLAGS, (launch["name"], differ - CANARY_FLAGS)
    others = [f for f in real if f not in CANARY_FLAGS]
    assert others == [f for f in tiny if f not in CANARY_FLAGS], launch["name"]
    assert tiny["--host"] == ["127.0.0.1"] and tiny["--port"] == ["30100"]
    assert tiny["--mem-fraction-static"] == ["0.3"] and tiny["--context-length"] == ["8192"]
    assert "--config" not in tiny and "--api-key" not in tiny
    assert tiny["--model-path"] == ["/opt/kimi/canary/checkpoints/moonshotai/Kimi-K2.6"]
    for path in tiny.get("--speculative-draft-model-path", []):
        assert path.startswith("/opt/kimi/canary/checkpoints/"), path
    assert canary["environment"] == {**launch["environment"], "HF_HUB_OFFLINE": "1"}


def test_plan_records_launch_commands_the_runtime_would_refuse(playbook, hub, tmp_path):
    """A tree backend DDTree cannot use (FA3, as Hopper hosts had before the pull request's
    rule was known): the DDTree launches fail in plan.json and plan.md, the rest pass."""
    out = tmp_path / "plan"
    out.mkdir()
    run = playbook(
        "plan.yml",
        REPO / "inventory" / "h200",
        extravars={"plan_output_dir": str(out), "kimi_tree_attention_backend": "fa3"},
        envvars={"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", **token_env(TOKEN, tmp_path)},
    )
    assert run.rc == 0, run.stdout
    host = next(p.name for p in out.iterdir())
    plan = json.loads((out / host / "plan.json").read_text())
    assert set(plan["validation"]["failed"]) == DDTREE_LAUNCHES
    assert set(plan["validation"]["passed"]) == {"ar", "eagle3", "dflash", "dflash-tree-backend"}
    [launch] = plan["serving_configs"]["ddtree"]["launch"][:1]
    assert launch["validation"]["ok"] is False
    assert launch["validation"]["contract"] == "sglang-0.5.23+pr29907"
    [error] = launch["validation"]["errors"]
    assert "supports only the triton attention backend" in error
    markdown = (out / host / "plan.md").read_text()
    assert "**Launch commands the runtime would refuse: ddtree-b16, ddtree-b32" in markdown
    assert markdown.count("**FAILED** against sglang-0.5.23+pr29907:") == 4
    assert "prefill attention is fa3: pass --attention-backend triton" in markdown


def test_plan_says_when_no_contract_covers_the_git_ref(playbook, hub, tmp_path):
    out = tmp_path / "plan"
    out.mkdir()
    git = {"url": "https://github.com/sgl-project/sglang.git", "ref": "main", "patches": []}
    run = playbook(
        "plan.yml",
        REPO / "inventory" / "ct200",
        extravars={"plan_output_dir": str(out), "kimi_sglang_git": git, "plan_check_hub": False},
    )
    assert run.rc == 0, run.stdout
    plan = json.loads((out / "ct200-node-01" / "plan.json").read_text())
    assert set(plan["validation"]["unchecked"]) == DDTREE_LAUNCHES | {"dflash-tree-backend"}
    note = plan["serving_configs"]["ddtree"]["launch"][0]["validation"]["note"]
    assert "made for refs/pull/29907/head, not main" in note
    assert (
        "Not checked against a contract: dflash-tree-backend"
        in (out / "ct200-node-01" / "plan.md").read_text()
    )


def test_plan_locks_every_moving_reference_and_keeps_the_lock(playbook, tmp_path):
    """plan.yml resolves main, the prompt sets' branch and the DDTree ref to commits in the
    study lock; the hub moving on does not move a later plan; kimi_lock_update does."""
    git = local_sglang_git()
    with LocalHub() as moving:
        moving.valid_tokens.add(TOKEN)
        first = moving.add_repo("moonshotai/Kimi-K2.6", {"a.safetensors": b"1" * 100})
        moving.add_repo("z-lab/Kimi-K2.6-DFlash", {"d.safetensors": b"d"}, gated=True,
                        approved_tokens={TOKEN})  # fmt: skip
        moving.add_repo("lightseekorg/kimi-k2.6-eagle3.1-mla", {"e.safetensors": b"e"})
        dataset = moving.add_dataset(MT_BENCH, {"raw/question.jsonl": b'{"turns": ["Hi"]}\n'})
        out = tmp_path / "plan"
        lock_path = tmp_path / "kimi.lock.yml"
        run = run_plan(playbook, REPO / "inventory" / "ct200", out, moving.url)
        assert run.rc == 0, run.stdout
        lock = yaml.safe_load(lock_path.read_text())
        assert lock["weights"]["moonshotai/Kimi-K2.6"]["requested"] == "main"
        assert lock["weights"]["moonshotai/Kimi-K2.6"]["revision"] == first.sha
        assert set(lock["weights"]) == {
            "moonshotai/Kimi-K2.6", "z-lab/Kimi-K2.6-DFlash", "lightseekorg/kimi-k2.6-eagle3.1-mla"
        }  # fmt: skip
        assert lock["datasets"][MT_BENCH] == {
            "requested": "main",
            "revision": dataset.sha,
            "resolved_at": lock["datasets"][MT_BENCH]["resolved_at"],
        }
        # The pinned prompt sets are their own commits.
        gsm8k = lock["datasets"]["openai/gsm8k"]
        assert gsm8k["requested"] == gsm8k["revision"] == "e53f048856ff4f594e959d75785d2c2d37b678ee"
        source = json.loads((REPO / "tests/.state/default-sglang-git/source.json").read_text())
        assert lock["git"]["sglang"]["url"] == git["url"]
        assert lock["git"]["sglang"]["ref"] == "refs/pull/29907/head"
        assert lock["git"]["sglang"]["commit"] == source["commit"]
        assert lock["runtime"] == {}
        plan = json.loads((out / "ct200-node-01" / "plan.json").read_text())
        assert plan["repos"]["target"]["revision"] == "main"
        assert plan["repos"]["target"]["resolved_sha"] == first.sha
        assert plan["study_lock"]["missing"] == [] and plan["study_lock"]["unresolved"] == []
        written = lock_path.read_bytes()

        # main moves on at the hub: the lock, and what a deploy would download, do not.
        moved = moving.add_repo("moonshotai/Kimi-K2.6", {"a.safetensors": b"2" * 100})
        assert moved.sha != first.sha
        again = run_plan(playbook, REPO / "inventory" / "ct200", out, moving.url)
        assert again.rc == 0, again.stdout
        assert lock_path.read_bytes() == written
        kept = again.results("Resolve the study lock")["ct200-node-01"]
        assert not kept["changed"] and not kept["written"] and kept["messages"] == []

        refreshed = playbook(
            "plan.yml",
            REPO / "inventory" / "ct200",
            extravars={
                "plan_output_dir": str(out),
                "kimi_lock_file": str(lock_path),
                "kimi_lock_update": True,
            },
            envvars={
                "HF_ENDPOINT": moving.url,
                "HF_HUB_DISABLE_XET": "1",
                **token_env(TOKEN, tmp_path),
            },
        )
        assert refreshed.rc == 0, refreshed.stdout
        relocked = yaml.safe_load(lock_path.read_text())
        assert relocked["weights"]["moonshotai/Kimi-K2.6"]["revision"] == moved.sha
        said = refreshed.results("Resolve the study lock")["ct200-node-01"]["messages"]
        assert f"weights moonshotai/Kimi-K2.6: main -> {moved.sha} (was {first.sha})" in said
        plan = json.loads((out / "ct200-node-01" / "plan.json").read_text())
        assert plan["repos"]["target"]["resolved_sha"] == moved.sha


def test_a_plan_offline_reads_the_lock_and_a_bad_lock_fails_naming_it(playbook, tmp_path):
    lock_path = tmp_path / "kimi.lock.yml"
    lock_path.write_text("lock_version: 1\nweights: {'moonshotai/Kimi-K2.6': {requested: main}}\n")
    out = tmp_path / "plan"
    run = playbook(
        "plan.yml",
        REPO / "inventory" / "ct200",
        extravars={
            "plan_output_dir": str(out),
            "kimi_lock_file": str(lock_path),
            "plan_check_hub": False,
        },
    )
    assert run.rc != 0
    assert f"{lock_path}: weights.moonshotai/Kimi-K2.6.revision is None" in run.stdout
    assert "kimi_lock_update=true" in run.stdout


@pytest.mark.parametrize("entry", ["deploy_kimi.yml", "benchmark_kimi.yml", "teardown.yml"])
def test_the_shipped_example_inventory_stops_before_any_connection(playbook, entry):
    """Run unedited, the main command says which file to copy and what to set, instead of
    SSH to the example's documentation address answering `No route to host`."""
    run = playbook(entry, REPO / "inventory" / "ct200")
    assert run.rc != 0
    assert not run.stats.get("dark"), "a host was contacted"
    said = run.results("Stop when the inventory still holds an example host")["ct200-node-01"]
    assert said["failed"]
    assert said["msg"].startswith(
        "inventory/ct200/hosts.yml still holds the example host ct200-node-01 (ansible_host "
        "192.0.2.10, a documentation address)."
    )
    assert "cp -a inventory/ct200 inventory/mylab" in said["msg"]
