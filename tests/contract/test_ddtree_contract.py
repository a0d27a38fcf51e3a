"""Contract of the git runtime: sglang 0.5.23's parser plus DDTree's pull request (29907).

The overlay (sglang-pr29907-overlay.json) holds what the pull request adds, each entry with its
source; README.md cites them. These tests check that the kit's DDTree commands pass it, that
each of the pull request's launch rules refuses what the pull request refuses (naming the flag),
that a misspelt DDTree flag or knob fails, and that the release alone still refuses DDTree.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.plan.sglang_args import (
    FORCED,
    RULES,
    ArgvError,
    check_argv,
    check_environment,
    contract_name,
    load_contract,
    load_snapshot,
    resolve_forced,
    validate_argv,
)

from tests.contract.model_launch import launches, profiles

pytestmark = pytest.mark.runtime

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SNAPSHOT = HERE / "sglang-0.5.23-args.json"
OVERLAY = HERE / "sglang-pr29907-overlay.json"
DRAFT = "/opt/kimi/weights/z-lab/Kimi-K2.6-DFlash"

# The ct200 DDTree command as the kit renders it (group_vars/all/serving.yml), budget last.
BASE = [
    "--model-path", "/opt/kimi/weights/moonshotai/Kimi-K2.6",
    "--trust-remote-code",
    "--tp-size", "8",
    "--mem-fraction-static", "0.85",
    "--chunked-prefill-size", "16384",
    "--kv-cache-dtype", "auto",
    "--attention-backend", "triton",
    "--tool-call-parser", "kimi_k2",
    "--reasoning-parser", "kimi_k2",
    "--host", "127.0.0.1",
    "--port", "30000",
    "--enable-metrics",
    "--speculative-draft-model-path", DRAFT,
    "--speculative-draft-attention-backend", "flashinfer",
]  # fmt: skip
DDTREE = [
    "--speculative-algorithm", "DDTREE",
    "--speculative-num-draft-tokens", "8",
    "--speculative-dflash-block-size", "8",
    "--speculative-draft-window-size", "4096",
    "--page-size", "1",
    "--disable-overlap-schedule",
]  # fmt: skip


def ddtree(budget: int | None = 32, *extra: str, base=BASE, spec=DDTREE) -> list[str]:
    argv = [*base, *spec, *extra]
    return argv + (["--speculative-ddtree-budget", str(budget)] if budget is not None else [])


def without(argv: list[str], flag: str, values: int = 1) -> list[str]:
    index = argv.index(flag)
    return argv[:index] + argv[index + 1 + values :]


def swap(argv: list[str], flag: str, value: str) -> list[str]:
    argv = list(argv)
    argv[argv.index(flag) + 1] = value
    return argv


@pytest.fixture(scope="module")
def contract():
    return load_contract(SNAPSHOT, OVERLAY)


@pytest.fixture(scope="module")
def release():
    return load_snapshot(SNAPSHOT)


@pytest.fixture(scope="module")
def overlay():
    return json.loads(OVERLAY.read_text())


def test_overlay_extends_the_pinned_snapshot_for_the_configured_ref(contract, overlay):
    serving = yaml.safe_load((REPO / "group_vars" / "all" / "serving.yml").read_text())
    model = yaml.safe_load((REPO / "group_vars" / "all" / "model.yml").read_text())
    assert overlay["overlay_of"] == f"sglang-{model['kimi_sglang_version']}-args.json"
    assert overlay["applies_to"]["ref"] == serving["kimi_sglang_git"]["ref"]
    assert contract_name(contract) == "sglang-0.5.23+pr29907"
    assert "DDTREE" in contract["speculative_algorithms"]["builtin"]
    assert "DFLASH" in contract["speculative_algorithms"]["builtin"]
    added = {s for o in overlay["options"] for s in o["option_strings"]}
    assert added == {"--speculative-ddtree-budget"}
    assert set(overlay["environment"]) == {
        "SGLANG_DDTREE_MAX_TOPK",
        "SGLANG_DDTREE_DEPTH_BONUS",
        "SGLANG_DDTREE_RANK_PROBE",
    }


def test_every_entry_has_a_source_and_the_readme_cites_it(overlay):
    readme = (HERE / "README.md").read_text()
    entries = [*overlay["options"], *overlay["launch_rules"], *overlay["facts"].values()]
    entries += list(overlay["environment"].values())
    entries.append(overlay["speculative_algorithms"])
    for entry in entries:
        source = entry["source"]
        assert source["url"].startswith("https://github.com/sgl-project/sglang/"), entry
        assert source["where"], entry
    for rule in overlay["launch_rules"]:
        assert f"`{rule['id']}`" in readme, rule["id"]
    for name in [*overlay["environment"], "--speculative-ddtree-budget", "DDTREE"]:
        assert f"`{name}`" in readme, name
    assert overlay["sources"]["pr"] in readme
    assert overlay["sources"]["commit_read"] in readme


def test_every_rule_the_overlay_names_is_enforced(overlay):
    kinds = {"refuse": RULES, "force": FORCED}
    for rule in overlay["launch_rules"]:
        assert rule["kind"] in ("refuse", "force", "note"), rule
        if rule["kind"] != "note":
            assert rule["id"] in kinds[rule["kind"]], rule["id"]


def test_a_contract_cannot_claim_a_rule_nobody_checks(tmp_path, overlay):
    bad = dict(overlay, launch_rules=[{"id": "ddtree-made-up", "kind": "refuse"}])
    path = tmp_path / "overlay.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="does not implement"):
        load_contract(SNAPSHOT, path)
    path.write_text(json.dumps(dict(overlay, overlay_of="sglang-0.5.22-args.json")))
    with pytest.raises(ValueError, match=r"not sglang-0\.5\.23-args\.json"):
        load_contract(SNAPSHOT, path)
    clash = dict(overlay["options"][0], option_strings=["--page-size"], dest="page_size")
    path.write_text(json.dumps(dict(overlay, options=[clash])))
    with pytest.raises(ValueError, match="already has"):
        load_contract(SNAPSHOT, path)


ACCEPTED = {
    # The kit's sweep, and the 8-budget variant: all full trees (budget > 7).
    **{f"kit-b{b}": ddtree(b) for b in (8, 16, 32, 64, 128)},
    # A chain (spine mode) runs on any backend: budget <= block size - 1, or left out.
    "spine-flashinfer": swap(ddtree(7), "--attention-backend", "flashinfer"),
    "default-budget": swap(ddtree(None), "--attention-backend", "flashinfer"),
    "overlap-left-on": without(ddtree(32), "--disable-overlap-schedule", 0),
    "lowercase": swap(ddtree(16), "--speculative-algorithm", "ddtree"),
    "split-backends-triton": ddtree(
        32, "--prefill-attention-backend", "triton", "--decode-attention-backend", "triton"
    ),
    "block-size-only": without(ddtree(32), "--speculative-num-draft-tokens"),
}

# argv -> (flag the error must name, text the message must carry).
REJECTED = {
    "misspelt-budget": (
        [a.replace("--speculative-ddtree-budget", "--speculative-ddtree-budgt") for a in ddtree()],
        "--speculative-ddtree-budgt",
        "did you mean --speculative-ddtree-budget",
    ),
    "budget-not-an-int": (ddtree("thirty"), "--speculative-ddtree-budget", "invalid int"),
    "budget-zero": (ddtree(0), "--speculative-ddtree-budget", ">= 1"),
    "rejection-sampling": (
        ddtree(32, "--speculative-use-rejection-sampling"),
        "--speculative-use-rejection-sampling",
        "does not support",
    ),
    "page-size-16": (swap(ddtree(), "--page-size", "16"), "--page-size", "only --page-size 1"),
    "page-size-left-out": (without(ddtree(), "--page-size"), "--page-size", "pass --page-size 1"),
    "full-tree-flashinfer": (
        swap(ddtree(16), "--attention-backend", "flashinfer"),
        "--attention-backend",
        "only the triton attention backend",
    ),
    "full-tree-fa3-decode": (
        ddtree(64, "--decode-attention-backend", "fa3"),
        "--decode-attention-backend",
        "decode attention is fa3",
    ),
    "full-tree-auto-backend": (
        without(ddtree(64), "--attention-backend"),
        "--attention-backend",
        "left to SGLang's choice",
    ),
    "budget-without-block-size": (
        without(
            without(ddtree(32), "--speculative-num-draft-tokens"), "--speculative-dflash-block-size"
        ),
        "--speculative-num-draft-tokens",
        "block size",
    ),
    # The mistake the issue warned about: budget + 1 as the draft token count.
    "draft-tokens-budget-plus-one": (
        swap(ddtree(32), "--speculative-num-draft-tokens", "33"),
        "--speculative-dflash-block-size",
        "must match",
    ),
    "no-drafter": (
        without(ddtree(), "--speculative-draft-model-path"),
        "--speculative-draft-model-path",
        "DDTREE speculative decoding requires",
    ),
    "window-below-block": (
        swap(ddtree(), "--speculative-draft-window-size", "4"),
        "--speculative-draft-window-size",
        ">=",
    ),
    "pipeline-parallel": (ddtree(32, "--pp-size", "2"), "--pp-size", "pp-size 1"),
}


@pytest.mark.parametrize("argv", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_ddtree_commands_are_accepted(contract, argv):
    validate_argv(argv, contract)


@pytest.mark.parametrize("case", REJECTED.values(), ids=REJECTED.keys())
def test_ddtree_rules_refuse_naming_the_flag(contract, case):
    argv, flag, text = case
    errors = check_argv(argv, contract)
    assert errors, argv
    assert errors[0].flag == flag
    assert text in str(errors[0])


def test_every_ddtree_flag_the_kit_uses_is_refused_when_misspelt(contract):
    argv = ddtree(32)
    validate_argv(argv, contract)
    known = {s for option in contract["options"] for s in option["option_strings"]}
    for flag in sorted({a for a in [*DDTREE, "--speculative-ddtree-budget"] if a.startswith("--")}):
        body = flag[2:]
        for typo in (f"--{body}s", f"--{body[:-1]}", f"--{body.replace('-', '_', 1)}"):
            if typo in known:
                continue
            with pytest.raises(ArgvError) as caught:
                validate_argv([typo if a == flag else a for a in argv], contract)
            assert caught.value.flag == typo


def test_the_release_alone_still_refuses_ddtree(release, contract):
    [error] = check_argv(ddtree(32), release)
    assert error.flag == "--speculative-ddtree-budget"
    assert "sglang 0.5.23 has no --speculative-ddtree-budget" in str(error)
    [error] = check_argv(ddtree(None), release)
    assert error.flag == "--speculative-algorithm" and "git ref" in str(error)
    # The overlay's rules are not the release's: DFLASH with page size 16 stays fine on both.
    dflash = [*BASE, "--speculative-algorithm", "DFLASH", "--page-size", "16"]
    assert check_argv(dflash, release) == check_argv(dflash, contract) == []


def test_all_broken_rules_are_reported_together(contract):
    argv = swap(swap(ddtree(0), "--page-size", "4"), "--attention-backend", "fa3")
    flags = [error.flag for error in check_argv(argv, contract)]
    assert flags == ["--speculative-ddtree-budget", "--page-size"]
    argv = swap(swap(ddtree(64), "--page-size", "4"), "--attention-backend", "fa3")
    flags = [error.flag for error in check_argv(argv, contract)]
    assert flags == ["--page-size", "--attention-backend"]


def test_what_the_pull_request_forces(contract):
    from ansible.module_utils.plan.sglang_args import parse_argv

    values = vars(parse_argv(without(ddtree(None), "--disable-overlap-schedule", 0), contract))
    assert values["disable_overlap_schedule"] is False
    resolved = resolve_forced(values, contract)
    assert resolved["disable_overlap_schedule"] is True
    assert resolved["speculative_ddtree_budget"] == 7  # block size - 1: a chain
    assert values["speculative_ddtree_budget"] is None  # a copy; the input is left alone
    dflash = vars(parse_argv([*BASE, "--speculative-algorithm", "DFLASH"], contract))
    assert resolve_forced(dflash, contract)["disable_overlap_schedule"] is False


def test_ddtree_environment_knobs(contract, release):
    good = {
        "SGLANG_DDTREE_MAX_TOPK": "8",
        "SGLANG_DDTREE_DEPTH_BONUS": "-0.5",
        "SGLANG_DDTREE_RANK_PROBE": "1",
        "NCCL_P2P_DISABLE": "1",
    }
    assert check_environment(good, contract) == []
    bad = {
        "SGLANG_DDTREE_MAX_TOPK": "6.5",
        "SGLANG_DDTREE_DEPTH_BONUS": "deep",
        "SGLANG_DDTREE_RANK_PROBE": "maybe",
        "SGLANG_DDTREE_MAXTOPK": "8",
    }
    problems = check_environment(bad, contract)
    assert problems == [
        "SGLANG_DDTREE_DEPTH_BONUS=deep is not a valid float; sglang 0.5.23 + pull request "
        "29907 (DDTree) would ignore it and use its default 0.2",
        "SGLANG_DDTREE_MAXTOPK is not an environment variable sglang 0.5.23 + pull request 29907 "
        "(DDTree) reads (its knobs: SGLANG_DDTREE_DEPTH_BONUS, SGLANG_DDTREE_MAX_TOPK, "
        "SGLANG_DDTREE_RANK_PROBE); did you mean SGLANG_DDTREE_MAX_TOPK?",
        "SGLANG_DDTREE_MAX_TOPK=6.5 is not a valid int; sglang 0.5.23 + pull request 29907 "
        "(DDTree) would ignore it and use its default 6",
        "SGLANG_DDTREE_RANK_PROBE=maybe is not a valid bool; sglang 0.5.23 + pull request 29907 "
        "(DDTree) would ignore it and use its default False",
    ]
    # The release reads none of them, and has no knobs to check them against.
    assert check_environment(bad, release) == []


# The hybrid control (Qwen3.6-27B, drafter block size 16) on the git runtime, every profile, as
# the kit renders it from models/qwen3.6-27b/model.yml: DDTree at the reference study's budgets
# and its chain control.
QWEN = "qwen3.6-27b"
QWEN_GIT = {
    f"{profile}-{name}": config
    for profile in profiles(QWEN)
    for name, config in launches(QWEN, profile).items()
    if config["runtime_kind"] == "git"
}


def test_hybrid_model_git_runtime_covers_the_study():
    names = {name.split("-", 1)[1] for name in QWEN_GIT}
    assert names == {"ddtree-b15", "ddtree-b32", "ddtree-b64", "dflash-tree-backend"}


@pytest.mark.parametrize("name", sorted(QWEN_GIT))
def test_hybrid_model_ddtree_commands_pass_the_git_contract_only(contract, release, name):
    argv = QWEN_GIT[name]["argv"][3:]
    validate_argv(argv, contract)
    assert check_environment(QWEN_GIT[name]["environment"], contract) == []
    if "ddtree" in name:
        assert check_argv(argv, release), "the release must refuse DDTree"


def test_hybrid_model_budgets_against_its_block_size(contract):
    """Block size 16: budget 15 is the drafter's own chain (spine mode, any backend), 32 and 64
    full trees, which the pull request verifies only on triton with page size 1."""
    from ansible.module_utils.plan.sglang_args import parse_argv

    for profile in profiles(QWEN):
        for budget in (15, 32, 64):
            argv = QWEN_GIT[f"{profile}-ddtree-b{budget}"]["argv"][3:]
            values = resolve_forced(vars(parse_argv(argv, contract)), contract)
            assert values["speculative_num_draft_tokens"] == 16
            assert values["speculative_dflash_block_size"] == 16
            assert values["speculative_ddtree_budget"] == budget
            assert values["page_size"] == 1 and values["disable_overlap_schedule"] is True
            assert values["attention_backend"] == "triton"
            errors = check_argv(swap(argv, "--attention-backend", "fa3"), contract)
            if budget <= 15:
                assert errors == [], "a chain needs no tree backend"
            else:
                assert [e.flag for e in errors] == ["--attention-backend"]
    # K2.6's block size (8) on the hybrid drafter would turn every budget into a full tree of a
    # block the drafter was not trained for: the block-size flag keeps the two in step.
    argv = swap(QWEN_GIT["ct200-ddtree-b32"]["argv"][3:], "--speculative-num-draft-tokens", "8")
    assert [e.flag for e in check_argv(argv, contract)] == ["--speculative-dflash-block-size"]


def test_hybrid_model_chain_control_differs_from_ddtree_only_in_the_tree():
    for profile in profiles(QWEN):
        control = QWEN_GIT[f"{profile}-dflash-tree-backend"]["argv"]
        for budget in (15, 32, 64):
            tree = QWEN_GIT[f"{profile}-ddtree-b{budget}"]["argv"]
            assert tree[: len(control)] == [
                "DDTREE" if arg == "DFLASH" else arg for arg in control
            ], profile
            assert tree[len(control) :] == ["--speculative-ddtree-budget", str(budget)]
            # Neither names a Mamba cache strategy: SGLang gives both the same (no_buffer with
            # page size 1 and overlap off), and the pull request's base may spell the flag
            # differently from 0.5.23 (tests/contract/README.md).
            assert not any(arg.startswith("--mamba") for arg in tree)
