"""Contract: launch commands must be accepted by the pinned SGLang release's own parser.

CI checks argv against the committed snapshot of that parser (README.md says why and how to
regenerate it). Where the real sglang imports (`make test-contract` builds a venv for it), the
last tests compare the snapshot-built parser with the real one, option by option; with
KIT_REQUIRE_REAL_SGLANG=1 (as that target sets) they fail instead of skipping.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import os
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.plan.sglang_args import (
    ArgvError,
    build_parser,
    deprecated_flags,
    load_snapshot,
    parse_argv,
    snapshot_filename,
    snapshot_version,
    validate_argv,
)

from tests.contract.model_launch import launches, profiles

pytestmark = pytest.mark.runtime

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

TARGET = "/opt/kimi/weights/moonshotai/Kimi-K2.6"
DFLASH_DRAFT = "/opt/kimi/weights/z-lab/Kimi-K2.6-DFlash"
EAGLE3_DRAFT = "/opt/kimi/weights/lightseekorg/kimi-k2.6-eagle3.1-mla"

# The CT200 launch command the community verified (DESIGN.md), as the server role renders it.
BASE = [
    "--model-path", TARGET,
    "--trust-remote-code",
    "--tp-size", "8",
    "--mem-fraction-static", "0.85",
    "--chunked-prefill-size", "16384",
    "--attention-backend", "flashinfer",
    "--kv-cache-dtype", "auto",
    "--tool-call-parser", "kimi_k2",
    "--reasoning-parser", "kimi_k2",
    "--host", "127.0.0.1",
    "--port", "30000",
    "--enable-metrics",
]  # fmt: skip
# z-lab/Kimi-K2.6-DFlash: block size 8, draft window 4096.
DFLASH = [
    "--speculative-algorithm", "DFLASH",
    "--speculative-draft-model-path", DFLASH_DRAFT,
    "--speculative-num-draft-tokens", "8",
    "--speculative-dflash-block-size", "8",
    "--speculative-draft-window-size", "4096",
    "--speculative-draft-attention-backend", "flashinfer",
]  # fmt: skip
# lightseekorg/kimi-k2.6-eagle3.1-mla: 3 steps, top-1, 4 draft tokens.
EAGLE3 = [
    "--speculative-algorithm", "EAGLE3",
    "--speculative-draft-model-path", EAGLE3_DRAFT,
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
]  # fmt: skip

ACCEPTED = {
    "ar": BASE,
    "dflash": BASE + DFLASH,
    "eagle3": BASE + EAGLE3,
    "fp8-kv": [*BASE[:-1], "--kv-cache-dtype", "fp8_e4m3", "--enable-metrics"],
    "h200-fa3": [*BASE, "--attention-backend", "fa3"],
    "b200-trtllm": [*BASE, "--attention-backend", "trtllm_mla"],
    "equals-form": [
        *BASE,
        "--speculative-algorithm=EAGLE3",
        f"--speculative-draft-model={EAGLE3_DRAFT}",
    ],
    "cuda-graph-list": [*BASE, "--cuda-graph-bs-decode", "1", "2", "4", "8", "16"],
    "alias-spelling": [*BASE, "--tensor-parallel-size", "8"],
    "no-form": [*BASE, "--no-enable-tf32-matmul"],
    "lowercase-algorithm": [*BASE, *DFLASH[:1], "dflash", *DFLASH[2:]],
    "two-nodes": [*BASE, "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:5000"],
}

# argv -> (flag the error must name, text the message must carry).
REJECTED = {
    "misspelt": ([*BASE, "--mem-fraction-statc", "0.85"], "--mem-fraction-statc", "unrecognized"),
    "bad-choice": ([*BASE, "--attention-backend", "fa9"], "--attention-backend", "invalid choice"),
    "not-an-int": ([*BASE, "--tp-size", "eight"], "--tp-size", "invalid int value"),
    "alias-not-an-int": (
        [*BASE[:2], "--tensor-parallel-size", "8x"],
        "--tensor-parallel-size",
        "int",
    ),
    "not-a-float": ([*BASE, "--mem-fraction-static", "most"], "--mem-fraction-static", "float"),
    "bad-kv-dtype": ([*BASE, "--kv-cache-dtype", "fp8"], "--kv-cache-dtype", "invalid choice"),
    "no-model": (BASE[2:], "--model-path", "required"),
    "missing-value": ([*BASE, "--port"], "--port", "expected one argument"),
    "empty-list": (
        [*BASE, "--cuda-graph-bs-decode"],
        "--cuda-graph-bs-decode",
        "expected at least",
    ),
    "list-not-ints": (
        [*BASE, "--cuda-graph-bs-decode", "1", "two"],
        "--cuda-graph-bs-decode",
        "int",
    ),
    "retired-cuda-graph-bs": (
        [*BASE, "--cuda-graph-bs", "1", "2"],
        "--cuda-graph-bs",
        "unrecognized",
    ),
    "old-dflash-window": (
        [*BASE, *DFLASH[:-6], "--speculative-dflash-draft-window-size", "4096"],
        "--speculative-dflash-draft-window-size",
        "unrecognized",
    ),
    "switch-with-value": ([*BASE, "--trust-remote-code=yes"], "--trust-remote-code", "ignored"),
    "stray-positional": ([*BASE, "serve"], None, "unrecognized arguments: serve"),
}

# Config-free checks SGLang 0.5.23 makes at launch (speculative_hook.py); argparse passes them.
LAUNCH_REJECTED = {
    "ddtree-not-in-release": (
        [
            *BASE,
            "--speculative-algorithm",
            "DDTREE",
            "--speculative-draft-model-path",
            DFLASH_DRAFT,
        ],
        "--speculative-algorithm",
        "git ref",
    ),
    "dflash-block-mismatch": (
        [*BASE, *DFLASH[:6], "--speculative-dflash-block-size", "16"],
        "--speculative-dflash-block-size",
        "must match",
    ),
    "dflash-window-below-block": (
        [*BASE, *DFLASH[:6], "--speculative-draft-window-size", "4"],
        "--speculative-draft-window-size",
        ">=",
    ),
    "dflash-without-drafter": (
        [*BASE, "--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "8"],
        "--speculative-draft-model-path",
        "requires",
    ),
    "dflash-pipeline-parallel": (
        [*BASE, *DFLASH, "--pp-size", "2"],
        "--pp-size",
        "pp-size 1",
    ),
    "window-not-positive": (
        [*BASE, *EAGLE3, "--speculative-draft-window-size", "0"],
        "--speculative-draft-window-size",
        "positive",
    ),
    "sink-without-window": (
        [*BASE, *EAGLE3, "--speculative-draft-sink-size", "4"],
        "--speculative-draft-sink-size",
        "requires",
    ),
}

# The hybrid control's commands on the release (ar, dflash), on every profile, as the kit renders
# them from models/qwen3.6-27b/model.yml.
QWEN = "qwen3.6-27b"
QWEN_RELEASE = {
    f"{profile}-{name}": config["argv"][3:]
    for profile in profiles(QWEN)
    for name, config in launches(QWEN, profile).items()
    if config["runtime_kind"] == "release"
}


def pinned_version() -> str:
    model = yaml.safe_load((REPO / "group_vars" / "all" / "model.yml").read_text())
    return str(model["kimi_sglang_version"])


@pytest.fixture(scope="module")
def snapshot():
    return load_snapshot(HERE / snapshot_filename(pinned_version()))


def test_snapshot_is_of_the_pinned_release(snapshot):
    assert snapshot_version(snapshot) == pinned_version(), (
        f"group_vars/all/model.yml pins sglang {pinned_version()} but the snapshot is of "
        f"{snapshot_version(snapshot)}; regenerate it (tests/contract/README.md)"
    )
    assert (REPO / snapshot["generated_by"]).is_file()
    build_parser(snapshot)  # every recorded option can be rebuilt


def test_facts_the_kit_relies_on(snapshot):
    """DESIGN.md's flag facts for the pinned release, as the snapshot records them."""
    flags = snapshot["facts"]["flags"]
    assert flags["--speculative-draft-window-size"]["exists"]
    assert not flags["--speculative-dflash-draft-window-size"]["exists"]
    assert flags["--speculative-dflash-block-size"]["exists"]
    assert not flags["--cuda-graph-bs"]["exists"]
    # DFLASH is a release algorithm; DDTree is not (runtime git in serving.yml).
    assert snapshot["facts"]["speculative_algorithm_dflash_known"]
    assert not snapshot["facts"]["speculative_algorithm_ddtree_known"]
    assert not flags["--speculative-ddtree-budget"]["exists"]
    for backend in ("flashinfer", "triton", "fa3", "flashmla", "trtllm_mla", "fa4"):
        assert backend in flags["--attention-backend"]["choices"]
    assert "fp8_e4m3" in flags["--kv-cache-dtype"]["choices"]


@pytest.mark.parametrize("argv", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_launch_commands_are_accepted(snapshot, argv):
    validate_argv(argv, snapshot)


@pytest.mark.parametrize("argv", QWEN_RELEASE.values(), ids=QWEN_RELEASE.keys())
def test_hybrid_model_release_commands_are_accepted(snapshot, argv):
    validate_argv(argv, snapshot)


def test_hybrid_model_release_commands_carry_its_own_settings():
    """What the model's folder says reaches the command: its parsers, the drafter's block size
    (16, not K2.6's 8) and the Mamba cache strategy DFlash on a hybrid target runs with."""
    assert set(QWEN_RELEASE) == {f"{p}-{c}" for p in profiles(QWEN) for c in ("ar", "dflash")}
    for name, argv in QWEN_RELEASE.items():
        values = vars(parse_argv(argv, load_snapshot(HERE / snapshot_filename(pinned_version()))))
        assert values["tool_call_parser"] == "qwen3_coder", name
        assert values["reasoning_parser"] == "qwen3", name
        assert values["tp_size"] == 1, name
        assert values["mamba_radix_cache_strategy"] == "extra_buffer", name
        assert values["model_path"].endswith("/Qwen/Qwen3.6-27B"), name
        if name.endswith("-dflash"):
            assert values["speculative_dflash_block_size"] == 16, name
            assert values["speculative_num_draft_tokens"] == 16, name
            assert values["speculative_draft_model_path"].endswith("/z-lab/Qwen3.6-27B-DFlash")
    # SGLang 0.5.23's own pick for this architecture on SM100 (_qwen3_5_hybrid_overrides).
    b200 = QWEN_RELEASE["b200-ar"]
    assert b200[b200.index("--attention-backend") + 1] == "trtllm_mha"


def test_the_drafter_cards_older_cache_flag_is_refused(snapshot):
    """The Qwen3.5 DFlash cards launch SGLang with --mamba-scheduler-strategy, which 0.5.23
    renamed --mamba-radix-cache-strategy: copied from a card, it would stop the server."""
    argv = [*QWEN_RELEASE["ct200-dflash"], "--mamba-scheduler-strategy", "extra_buffer"]
    with pytest.raises(ArgvError) as caught:
        validate_argv(argv, snapshot)
    assert caught.value.flag == "--mamba-scheduler-strategy"
    assert "unrecognized" in str(caught.value)


def test_values_parse_as_sglang_types(snapshot):
    namespace = parse_argv(ACCEPTED["cuda-graph-list"] + DFLASH, snapshot)
    assert namespace.cuda_graph_bs_decode == [1, 2, 4, 8, 16]
    assert namespace.mem_fraction_static == 0.85
    assert namespace.speculative_draft_window_size == 4096
    assert namespace.trust_remote_code is True


@pytest.mark.parametrize("case", REJECTED.values(), ids=REJECTED.keys())
def test_bad_commands_are_rejected_naming_the_flag(snapshot, case):
    argv, flag, text = case
    with pytest.raises(ArgvError) as caught:
        validate_argv(argv, snapshot)
    assert caught.value.flag == flag
    assert text in str(caught.value)
    if flag:
        assert flag in str(caught.value)


def test_misspelt_flag_suggests_the_real_one(snapshot):
    with pytest.raises(ArgvError, match="did you mean --mem-fraction-static"):
        validate_argv([*BASE, "--mem-fraction-statc", "0.85"], snapshot)


def _misspellings(flag: str) -> list[str]:
    body = flag[2:]
    middle = len(body) // 2
    dropped = body[:middle] + body[middle + 1 :]
    swapped = body[: middle - 1] + body[middle] + body[middle - 1] + body[middle + 1 :]
    return [f"--{dropped}", f"--{swapped}", f"--{body}s"]


FLAGS_USED = sorted({a for argv in (BASE, DFLASH, EAGLE3) for a in argv if a.startswith("--")})


@pytest.mark.parametrize("flag", FLAGS_USED)
def test_every_flag_the_kit_uses_is_rejected_when_misspelt(snapshot, flag):
    # DFlash takes the EAGLE step flags too (it overrides them to 1), so one command holds
    # every flag the kit writes.
    argv = [*BASE, *DFLASH, "--speculative-num-steps", "1", "--speculative-eagle-topk", "1"]
    known = {s for option in snapshot["options"] for s in option["option_strings"]}
    validate_argv(argv, snapshot)
    for typo in _misspellings(flag):
        if typo in known:
            continue
        with pytest.raises(ArgvError) as caught:
            validate_argv([typo if a == flag else a for a in argv], snapshot)
        # Without --model-path argparse first reports the missing required option.
        assert caught.value.flag == (flag if flag == "--model-path" else typo)


def test_abbreviations_are_refused_unless_asked(snapshot):
    argv = [*BASE, "--speculative-draft-window", "4096"]
    with pytest.raises(ArgvError, match="abbreviates --speculative-draft-window-size"):
        validate_argv(argv, snapshot)
    # The real parser expands unique prefixes; allow_abbrev=None reproduces it.
    validate_argv(argv, snapshot, allow_abbrev=None)


@pytest.mark.parametrize("case", LAUNCH_REJECTED.values(), ids=LAUNCH_REJECTED.keys())
def test_launch_rules(snapshot, case):
    argv, flag, text = case
    validate_argv(argv, snapshot, launch_rules=False)  # the parser alone lets these through
    with pytest.raises(ArgvError) as caught:
        validate_argv(argv, snapshot)
    assert caught.value.flag == flag
    assert text in str(caught.value)


def test_deprecated_flags_are_reported(snapshot):
    argv = [*BASE, "--enable-dp-attention"]
    validate_argv(argv, snapshot)  # SGLang still accepts it, with a warning
    assert deprecated_flags(argv, snapshot) == [
        "--enable-dp-attention is deprecated in sglang 0.5.23; use --attn-dp-size <dp-size>"
    ]
    assert deprecated_flags(BASE, snapshot) == []


def test_help_is_not_a_launch_option(snapshot):
    with pytest.raises(ArgvError, match="prints help"):
        validate_argv([*BASE, "--help"], snapshot)


def test_load_snapshot_refuses_other_json(tmp_path):
    path = tmp_path / "not-a-snapshot.json"
    path.write_text(json.dumps({"sglang_version": "0.5.23"}))
    with pytest.raises(ValueError, match="options"):
        load_snapshot(path)


# --- cross-check with the real package (`make test-contract`; skipped where sglang is absent) --

REQUIRE_REAL = os.environ.get("KIT_REQUIRE_REAL_SGLANG") == "1"


def _cannot_cross_check(reason: str):
    """Skip, or fail where the real parser must be checked (make test-contract)."""
    if REQUIRE_REAL:
        pytest.fail(f"{reason}, but KIT_REQUIRE_REAL_SGLANG=1 requires the cross-check")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def real():
    """accepts(argv) -> (bool, message) with the real add_cli_args + from_cli_args."""
    import importlib
    import importlib.metadata

    try:
        server_args = importlib.import_module("sglang.srt.server_args")
    except ImportError as err:
        _cannot_cross_check(f"sglang's parser does not import ({err})")
    if importlib.metadata.version("sglang") != pinned_version():
        _cannot_cross_check(f"installed sglang is not the pinned {pinned_version()}")
    parser = argparse.ArgumentParser(prog="sglang serve")
    server_args.ServerArgs.add_cli_args(parser)

    def accepts(argv):
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                namespace = parser.parse_args(argv)
            server_args.ServerArgs.from_cli_args(namespace)
        except SystemExit:
            return False, stderr.getvalue()
        return True, ""

    return accepts


def _ours(argv, snapshot, **kwargs):
    try:
        validate_argv(argv, snapshot, launch_rules=False, allow_abbrev=None, **kwargs)
    except ArgvError as err:
        return False, str(err)
    return True, ""


def _sample_values(option) -> tuple[list[list[str]], list[list[str]]]:
    """Value lists the option should accept, and ones it should refuse."""
    if option["nargs"] == 0:
        return [[]], []
    type_name = option["type"] or "str"
    if option["choices"] is not None:
        good, bad = [str(option["choices"][0])], ["no-such-choice"]
    elif type_name == "int":
        good, bad = ["7"], ["7.5"]
    elif type_name == "float":
        good, bad = ["0.5"], ["half"]
    elif type_name.endswith("human_readable_int"):
        good, bad = ["4Ki"], ["4kb"]
    elif type_name in ("json.loads",) or type_name.endswith(("json_list_type", "config_arg")):
        good, bad = ["{}"], ["{not json"]
    else:
        good, bad = ["some-value"], []
    nargs = option["nargs"]
    goods = {None: [good], "?": [[], good], "+": [good, good * 2], "*": [[], good * 2]}[nargs]
    bads = [bad] if bad else []
    if nargs in (None, "+"):
        bads.append([])  # a valued option without its value
    return goods, bads


def test_cross_check_every_option_with_the_real_parser(snapshot, real):
    base = ["--model-path", TARGET]
    mismatches = []
    checked = 0
    for option in snapshot["options"]:
        if option["action"] == "help":
            continue
        goods, bads = _sample_values(option)
        for flag in option["option_strings"]:
            for values, expected in [(v, True) for v in goods] + [(v, False) for v in bads]:
                argv = [*base, flag, *values]
                theirs, ours = real(argv), _ours(argv, snapshot)
                checked += 1
                if theirs[0] != ours[0] or ours[0] != expected:
                    mismatches.append((argv, theirs, ours))
    assert checked > 1000
    assert not mismatches, mismatches[:5]


def test_cross_check_launch_commands_with_the_real_parser(snapshot, real):
    cases = [(argv, True) for argv in [*ACCEPTED.values(), *QWEN_RELEASE.values()]]
    cases += [(argv, False) for argv, _, _ in REJECTED.values()]
    cases += [([*QWEN_RELEASE["h200-dflash"], "--mamba-scheduler-strategy", "extra_buffer"], False)]
    cases += [(argv, True) for argv, _, _ in LAUNCH_REJECTED.values()]  # argparse passes them
    cases += [([*BASE, "--mem-fraction", "0.8"], True), ([*BASE, "--speculative", "x"], False)]
    for flag in FLAGS_USED:
        for typo in _misspellings(flag):
            cases.append(([*BASE, typo, "1"], None))
    for argv, expected in cases:
        theirs, ours = real(argv), _ours(argv, snapshot)
        assert theirs[0] == ours[0], (argv, theirs, ours)
        if expected is not None:
            assert ours[0] is expected, argv


def test_cross_check_speculative_algorithm_names(snapshot, real):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    for name in ["DFLASH", "dflash", "EAGLE3", "EAGLE", "NEXTN", "NGRAM", "DDTREE", "MEDUSA"]:
        try:
            SpeculativeAlgorithm.from_string(name)
            known = True
        except ValueError:
            known = False
        argv = [*BASE, "--speculative-algorithm", name, "--speculative-draft-model-path", "d"]
        try:
            validate_argv(argv, snapshot)
            ours = True
        except ArgvError:
            ours = False
        assert ours == known, name


def test_cross_check_dflash_rules_with_the_real_handler(snapshot, real):
    """The DFlash rules against sglang's own handler (private; skipped if it moves)."""
    import importlib

    try:
        hook = importlib.import_module("sglang.srt.arg_groups.speculative_hook")
    except ImportError as err:
        _cannot_cross_check(f"sglang has no arg_groups.speculative_hook ({err})")
    handle = getattr(hook, "_handle_dflash", None)
    if handle is None:
        _cannot_cross_check("sglang has no _handle_dflash")
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    cases = [
        ACCEPTED["dflash"],
        *(argv for name, argv in QWEN_RELEASE.items() if name.endswith("-dflash")),
        LAUNCH_REJECTED["dflash-block-mismatch"][0],
        LAUNCH_REJECTED["dflash-window-below-block"][0],
        LAUNCH_REJECTED["dflash-without-drafter"][0],
        LAUNCH_REJECTED["dflash-pipeline-parallel"][0],
    ]
    for argv in cases:
        # The handler checks the device before anything else; the rules are about GPUs.
        record = ServerArgs.from_cli_args(parser.parse_args([*argv, "--device", "cuda"]))
        record._input_frozen = True
        try:
            handle(record)
            theirs = True
        except ValueError:
            theirs = False
        try:
            validate_argv(argv, snapshot)
            ours = True
        except ArgvError:
            ours = False
        assert theirs == ours, argv


def test_cross_check_snapshot_is_current(snapshot, real):
    """The committed file is exactly what the script writes from the installed release."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("snap", HERE / "snapshot_sglang_args.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    path = HERE / snapshot_filename(pinned_version())
    fresh = script.render(script.build_snapshot())
    committed = path.read_text()
    diff = difflib.unified_diff(
        committed.splitlines(), fresh.splitlines(), "committed", "installed sglang", lineterm=""
    )
    assert fresh == committed, (
        f"{path.name} is stale: regenerate it with the contract venv's python "
        "(tests/contract/README.md)\n" + "\n".join(list(diff)[:40])
    )
