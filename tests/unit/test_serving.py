"""Serving configs rendered into launch commands: flags, masking and bad inputs."""

from __future__ import annotations

import pytest
from ansible.module_utils.plan.serving import MASK, ServingConfigError, masked, render_all

pytestmark = pytest.mark.runtime

DEFINITIONS = {
    "ar": {"drafter": None, "runtime": "release", "args": []},
    "dflash": {
        "drafter": "dflash",
        "runtime": "release",
        "args": ["--speculative-algorithm", "DFLASH"],
        "draft_backend_flag": "--speculative-draft-attention-backend",
    },
    "ddtree": {
        "drafter": "dflash",
        "tree": True,
        "runtime": "git",
        "budgets": [16, 64],
        "budget_flag": "--speculative-ddtree-budget",
        "args": ["--page-size", 1],
    },
}
SETTINGS = {
    "pythons": {"release": "/v/bin/python", "git": "/g/bin/python"},
    "model_path": "/w/t",
    "draft_model_paths": {"dflash": "/w/d"},
    "tp_size": 8,
    "mem_fraction_static": 0.85,
    "kv_cache_dtype": "auto",
    "chunked_prefill_size": 16384,
    "attention_backends": {"target": "flashinfer", "draft": "flashinfer", "tree": "triton"},
    "host": "127.0.0.1",
    "port": 30000,
    "tool_call_parser": "kimi_k2",
    "reasoning_parser": "kimi_k2",
    "environment": {"HF_HUB_OFFLINE": 1, "HF_TOKEN": "hf_x"},
    "release": "0.5.23",
    "git": {"url": "https://example.invalid/sglang.git", "ref": "pr"},
}


def test_budgets_expand_and_tree_configs_use_the_tree_backend():
    configs = {c["name"]: c for c in render_all(DEFINITIONS, ["ar", "ddtree"], SETTINGS)}
    assert set(configs) == {"ar", "ddtree-b16", "ddtree-b64"}
    tree = configs["ddtree-b64"]["argv"]
    assert tree[0] == "/g/bin/python"
    assert tree[tree.index("--attention-backend") + 1] == "triton"
    assert tree[-2:] == ["--speculative-ddtree-budget", "64"]
    assert configs["ddtree-b64"]["runtime"] == "git+https://example.invalid/sglang.git@pr"
    assert configs["ar"]["runtime"] == "sglang==0.5.23"
    assert "--speculative-draft-model-path" not in configs["ar"]["argv"]


def test_api_key_beyond_loopback_is_required_and_masked():
    with pytest.raises(ServingConfigError, match="beyond loopback"):
        render_all(DEFINITIONS, ["ar"], {**SETTINGS, "host": "0.0.0.0"})  # noqa: S104
    [config] = render_all(
        DEFINITIONS, ["dflash"], {**SETTINGS, "host": "10.0.0.5", "api_key": "sk-secret"}
    )
    assert config["argv"][-2:] == ["--api-key", "sk-secret"]
    shown = masked(config)
    assert shown["argv"][-1] == MASK and "sk-secret" not in str(shown)
    assert shown["environment"]["HF_TOKEN"] == MASK
    assert shown["environment"]["HF_HUB_OFFLINE"] == "1"
    inline = masked(
        {
            **config,
            "argv": ["--api-key=sk-2"],
            "environment": {"hf_token": "t", "https_proxy": "u:p@h"},
        }
    )
    assert inline["argv"] == [f"--api-key={MASK}"]
    assert set(inline["environment"].values()) == {MASK}


def test_bad_inputs_fail_clearly():
    with pytest.raises(ServingConfigError, match="not defined"):
        render_all(DEFINITIONS, ["medusa"], SETTINGS)
    with pytest.raises(ServingConfigError, match=r"url and \.ref"):
        render_all(DEFINITIONS, ["ddtree"], {**SETTINGS, "git": {}})
    with pytest.raises(ServingConfigError, match="dist_init_addr"):
        render_all(DEFINITIONS, ["ar"], {**SETTINGS, "nnodes": 2, "node_rank": 1})
    with pytest.raises(ServingConfigError, match="no local path for drafter"):
        render_all(DEFINITIONS, ["dflash"], {**SETTINGS, "draft_model_paths": {}})


def test_multi_node_flags():
    [config] = render_all(
        DEFINITIONS,
        ["ar"],
        {**SETTINGS, "nnodes": 2, "node_rank": 1, "dist_init_addr": "10.0.0.1:5000"},
    )
    argv = config["argv"]
    assert argv[argv.index("--nnodes") + 1] == "2"
    assert argv[argv.index("--node-rank") + 1] == "1"
    assert argv[argv.index("--dist-init-addr") + 1] == "10.0.0.1:5000"


def test_api_key_goes_to_the_secrets_file_not_the_command_line():
    [config] = render_all(
        DEFINITIONS,
        ["ar"],
        {
            **SETTINGS,
            "host": "10.0.0.5",
            "api_key": "sk-secret",
            "secrets_file": "/etc/kimi/sglang-secrets.yaml",
        },
    )
    assert config["argv"][-2:] == ["--config", "/etc/kimi/sglang-secrets.yaml"]
    assert "sk-secret" not in config["argv"]
    assert config["secrets"] == {"api_key": "sk-secret"}
    assert masked(config)["secrets"] == {"api_key": MASK}
    # On loopback there is no key and no secrets file.
    [local] = render_all(
        DEFINITIONS, ["ar"], {**SETTINGS, "secrets_file": "/etc/kimi/sglang-secrets.yaml"}
    )
    assert "--config" not in local["argv"] and local["secrets"] == {}


def test_systemd_and_environment_file_quoting():
    import shlex

    from tests.support.modules import load_filters

    filters = load_filters()
    line = filters.systemd_exec_line(
        ["/v/bin/python", "-m", "x", "--a", "two words", "50%", "$HOME"]
    )
    assert line == '/v/bin/python -m x --a "two words" "50%%" "$$HOME"'
    env = filters.env_file_line("NCCL_X", 'a "b" \\c')
    assert env == 'NCCL_X="a \\"b\\" \\\\c"'
    # The supervisor reads it back with shlex, as systemd does with EnvironmentFile.
    assert shlex.split(env) == ['NCCL_X=a "b" \\c']
    # A carriage return ends a unit file's line as a newline does: a second setting would be
    # the argument's. Every control character is refused, in arguments, values and paths.
    for bad in ("a\nb", "a\rb", "a\x00b", "a\x1b[2Jb", "a\x7fb", "a\x85b"):
        with pytest.raises(ValueError, match="control character"):
            filters.env_file_line("K", bad)
        with pytest.raises(ValueError, match="control character"):
            filters.systemd_exec_line(["/v/bin/python", "--served-model-name", bad])
        with pytest.raises(ValueError, match="control character"):
            filters.systemd_value(bad)
    assert filters.systemd_value("/var/lib/kimi/server") == "/var/lib/kimi/server"
    with pytest.raises(ValueError, match="not a valid environment variable name"):
        filters.env_file_line("1BAD", "x")


def shipped_definitions() -> dict:
    """K2.6's kimi_serving_config_definitions as group_vars/all derives them from
    models/kimi-k2.6/model.yml (budgets: the model's kimi_ddtree_budgets)."""
    from tests.support.models import definitions

    return definitions()


def test_chain_control_comes_with_ddtree_just_before_it():
    from ansible.module_utils.plan.serving import with_controls

    definitions = shipped_definitions()
    assert with_controls(definitions, ["ar", "dflash", "ddtree"]) == [
        "ar", "dflash", "dflash-tree-backend", "ddtree"
    ]  # fmt: skip
    # A single budget named directly brings it too; named twice, it is served once.
    assert with_controls(definitions, ["ddtree-b32", "ar"]) == [
        "dflash-tree-backend", "ddtree-b32", "ar"
    ]  # fmt: skip
    assert with_controls(definitions, ["dflash-tree-backend", "ddtree"]) == [
        "dflash-tree-backend", "ddtree"
    ]  # fmt: skip
    # Without DDTree there is nothing to control.
    assert with_controls(definitions, ["ar", "dflash", "eagle3"]) == ["ar", "dflash", "eagle3"]


def test_chain_control_runs_like_the_ddtree_servers_but_for_the_tree():
    """Same runtime, attention backend, page size, scheduler and drafter flags: the argv of
    dflash-tree-backend and of a DDTree budget differ only in the algorithm and the budget."""
    from ansible.module_utils.plan.serving import with_controls

    definitions = shipped_definitions()
    configs = {
        c["name"]: c
        for c in render_all(definitions, with_controls(definitions, ["ddtree"]), SETTINGS)
    }
    control, tree = configs["dflash-tree-backend"], configs["ddtree-b64"]
    assert control["control_for"] == "ddtree" and tree["control_for"] is None
    assert control["runtime"] == tree["runtime"] == "git+https://example.invalid/sglang.git@pr"
    assert control["argv"][0] == tree["argv"][0] == "/g/bin/python"
    for flag in ("--attention-backend", "--page-size", "--speculative-draft-attention-backend"):
        assert (
            control["argv"][control["argv"].index(flag) + 1]
            == (tree["argv"][tree["argv"].index(flag) + 1])
        )
    assert control["argv"][control["argv"].index("--attention-backend") + 1] == "triton"
    assert "--disable-overlap-schedule" in control["argv"]
    differing = [(a, b) for a, b in zip(control["argv"], tree["argv"], strict=False) if a != b]
    assert differing == [("DFLASH", "DDTREE")]
    assert tree["argv"][len(control["argv"]) :] == ["--speculative-ddtree-budget", "64"]
    assert control["environment"] == tree["environment"]


def test_ddtree_draft_tokens_are_the_drafter_block_size_not_budget_plus_one():
    """The pull request reads --speculative-num-draft-tokens as the DFlash block size (its
    full-tree test is budget > block size - 1); budget + 1 there would turn every budget into
    a chain of budget drafts from a drafter trained for 8."""
    configs = render_all(shipped_definitions(), ["ddtree"], SETTINGS)
    for config in configs:
        argv = config["argv"]
        block = int(argv[argv.index("--speculative-dflash-block-size") + 1])
        assert int(argv[argv.index("--speculative-num-draft-tokens") + 1]) == block == 8
        assert config["budget"] > block - 1


def test_validation_records_the_contract_verdict_per_launch():
    from pathlib import Path

    from ansible.module_utils.plan.serving import load_contracts, validation, with_controls

    contract_dir = Path(__file__).resolve().parents[1] / "contract"
    spec = {
        "release": {"snapshot": str(contract_dir / "sglang-0.5.23-args.json")},
        "git": {
            "snapshot": str(contract_dir / "sglang-0.5.23-args.json"),
            "overlay": str(contract_dir / "sglang-pr29907-overlay.json"),
        },
    }
    definitions = shipped_definitions()
    settings = {
        **SETTINGS,
        "git": {"url": "https://example.invalid/s.git", "ref": "refs/pull/29907/head"},
    }
    contracts = load_contracts(spec, settings)
    selected = with_controls(definitions, ["ar", "dflash", "ddtree"])
    verdicts = {
        c["name"]: validation(c, contracts) for c in render_all(definitions, selected, settings)
    }
    assert verdicts["ar"] == {"ok": True, "errors": [], "contract": "sglang-0.5.23"}
    assert verdicts["ddtree-b16"] == {"ok": True, "errors": [], "contract": "sglang-0.5.23+pr29907"}
    assert verdicts["dflash-tree-backend"]["ok"] is True

    # A misspelt DDTree flag, and a knob with a value the pull request would ignore.
    bad = dict(definitions)
    bad["ddtree"] = {
        **definitions["ddtree"],
        "budget_flag": "--speculative-ddtree-budgett",
        "budgets": [16],
    }
    [config] = render_all(
        bad, ["ddtree"], {**settings, "environment": {"SGLANG_DDTREE_MAX_TOPK": "wide"}}
    )
    verdict = validation(config, contracts)
    assert verdict["ok"] is False
    assert "--speculative-ddtree-budgett" in verdict["errors"][0]
    assert "did you mean --speculative-ddtree-budget" in verdict["errors"][0]
    assert "SGLANG_DDTREE_MAX_TOPK=wide is not a valid int" in verdict["errors"][1]

    # Another ref, or a pin without a snapshot: not checked, and the plan says why.
    other = load_contracts(spec, {**settings, "release": "0.5.24", "git": {"ref": "main"}})
    assert validation(config, other)["ok"] is None
    assert "made for refs/pull/29907/head, not main" in validation(config, other)["note"]
    [ar] = render_all(definitions, ["ar"], settings)
    assert "the pin is 0.5.24" in validation(ar, other)["note"]


def test_benchmark_runs_the_chain_control_whenever_ddtree_runs(playbook, tmp_path):
    """roles/benchmark/vars/main.yml as the role evaluates it, for several selections."""
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    cases = [
        ["ar", "dflash", "ddtree"],
        ["ddtree-b16", "ar"],
        ["ar", "dflash-tree-backend", "ddtree"],
        ["ar", "eagle3", "dflash"],
        ["dflash", "ar"],
    ]
    play = [
        {
            "name": "Evaluate the benchmark and server roles' config names",
            "hosts": "localhost",
            "gather_facts": False,
            "vars_files": [
                str(root / "group_vars/all/paths.yml"),
                str(root / "group_vars/all/model.yml"),
                str(root / "group_vars/all/serving.yml"),
                str(root / "roles/benchmark/defaults/main.yml"),
                str(root / "roles/benchmark/vars/main.yml"),
            ],
            "tasks": [
                {
                    "name": "Show the configs",
                    "ansible.builtin.debug": {"msg": "{{ __benchmark_configs }}"},
                    "vars": {"benchmark_serving_configs": "{{ item }}"},
                    "loop": cases,
                },
                {
                    # kimi_serving_tp_sizes: every config over TP 1 and 4, the model's budgets.
                    "name": "Show the configs over TP sizes",
                    "ansible.builtin.debug": {"msg": "{{ __benchmark_configs }}"},
                    "vars": {
                        "benchmark_serving_configs": ["ar", "dflash", "ddtree"],
                        "kimi_serving_tp_sizes": [1, 4],
                    },
                },
                {
                    "name": "Show the config each server name belongs to",
                    "ansible.builtin.debug": {
                        "msg": "{{ ['ddtree-b32', 'ddtree-tp4-b32', 'ar-tp8', 'ar',"
                        " 'dflash-tree-backend-tp4'] | map('kimi_config_base') | list }}"
                    },
                },
            ],
        }
    ]
    path = tmp_path / "configs.yml"
    path.write_text(yaml.safe_dump(play))
    inventory = tmp_path / "hosts"
    inventory.write_text("localhost ansible_connection=local\n")
    run = playbook(path, inventory, extravars={"kimi_ddtree_budgets": [8, 16]})
    assert run.rc == 0, run.stdout
    shown = [r["msg"] for r in run.results("Show the configs")["localhost"]["results"]]
    # The lists the role's Jinja built before the names had a filter, exactly.
    assert shown == [
        ["ar", "dflash", "dflash-tree-backend", "ddtree-b8", "ddtree-b16"],
        ["ar", "dflash-tree-backend", "ddtree-b16"],
        ["ar", "dflash-tree-backend", "ddtree-b8", "ddtree-b16"],
        ["ar", "eagle3", "dflash"],
        ["ar", "dflash"],
    ]
    assert run.results("Show the configs over TP sizes")["localhost"]["msg"] == [
        "ar-tp1", "ar-tp4", "dflash-tp1", "dflash-tp4",
        "dflash-tree-backend-tp1", "dflash-tree-backend-tp4",
        "ddtree-tp1-b8", "ddtree-tp1-b16", "ddtree-tp4-b8", "ddtree-tp4-b16",
    ]  # fmt: skip
    assert run.results("Show the config each server name belongs to")["localhost"]["msg"] == [
        "ddtree", "ddtree", "ar", "ar", "dflash-tree-backend"
    ]  # fmt: skip


# --- names, TP sizes as a dimension, the model's launch args (issue 17) ---------------------


def test_config_names_parse_into_base_tp_and_budget():
    from ansible.module_utils.plan.serving import config_name, parse_config_name

    cases = {
        "ar": ("ar", None, None),
        "ar-tp4": ("ar", 4, None),
        "ddtree-b32": ("ddtree", None, 32),
        "ddtree-tp4-b32": ("ddtree", 4, 32),
        "dflash-tree-backend": ("dflash-tree-backend", None, None),
        "dflash-tree-backend-tp8": ("dflash-tree-backend", 8, None),
        "eagle3": ("eagle3", None, None),
        "qwen3.6-x-tp1-b15": ("qwen3.6-x", 1, 15),
    }
    for name, parts in cases.items():
        assert parse_config_name(name) == parts, name
        assert config_name(*parts) == name
    for bad in ["", "DDTREE", "ddtree b32", "-ar", "ar/../x", None, 32, "a" * 129]:
        with pytest.raises(ServingConfigError, match="serving config name"):
            parse_config_name(bad)


def test_tp_sizes_expand_like_budgets_and_reach_the_argv():
    from ansible.module_utils.plan.serving import expand

    definitions = {
        **DEFINITIONS,
        "ar": {**DEFINITIONS["ar"], "tp": [1, 4, 8]},
        "ddtree": {**DEFINITIONS["ddtree"], "tp": [1, 4]},
    }
    names = [entry[0] for entry in expand(definitions, ["ar", "dflash", "ddtree"])]
    assert names == [
        "ar-tp1", "ar-tp4", "ar-tp8", "dflash",
        "ddtree-tp1-b16", "ddtree-tp1-b64", "ddtree-tp4-b16", "ddtree-tp4-b64",
    ]  # fmt: skip
    configs = {c["name"]: c for c in render_all(definitions, ["ar", "dflash", "ddtree"], SETTINGS)}
    for name, config in configs.items():
        argv = config["argv"]
        tp = int(argv[argv.index("--tp-size") + 1])
        assert config["tp_size"] == tp
        # Without a TP list the host's size (8); with one, the name's.
        assert tp == (8 if name == "dflash" else int(name.split("-tp")[1].split("-")[0]))
    tree = configs["ddtree-tp4-b64"]
    assert (tree["base"], tree["budget"]) == ("ddtree", 64)
    assert tree["argv"][-2:] == ["--speculative-ddtree-budget", "64"]
    # One expanded name alone renders that server alone (the server role's case).
    [only] = render_all(definitions, ["ddtree-tp4-b16"], SETTINGS)
    assert only["name"] == "ddtree-tp4-b16" and only["tp_size"] == 4
    # Jinja may hand sizes over as strings of digits.
    [config] = render_all({"ar": {"tp": ["2"]}}, ["ar"], SETTINGS)
    assert config["name"] == "ar-tp2" and config["tp_size"] == 2


@pytest.mark.parametrize(
    ("tp", "message"),
    [
        ([0], r"ar: tp has 0; each must be an integer from 1 to 1024"),
        (["x"], r"ar: tp has 'x'; each must be an integer from 1 to 1024"),
        ([1025], r"ar: tp has 1025; each must be an integer from 1 to 1024"),
        ([True], r"ar: tp has True"),
        ([2.5], r"ar: tp has 2.5"),
        ([4, 4], r"ar: tp names 4 twice: \[4, 4\]"),
        ("4", r"ar: tp must be a list of integers, got '4'"),
    ],
)
def test_bad_tp_sizes_fail_naming_the_config_and_the_value(tp, message):
    with pytest.raises(ServingConfigError, match=message):
        render_all({"ar": {"tp": tp}}, ["ar"], SETTINGS)


def test_bad_selections_fail_naming_what_exists():
    definitions = {**DEFINITIONS, "ar": {**DEFINITIONS["ar"], "tp": [1, 4]}}
    with pytest.raises(ServingConfigError, match="'ddtree-b48' is not one that ddtree expands to: "
                       "ddtree-b16, ddtree-b64"):  # fmt: skip
        render_all(definitions, ["ddtree-b48"], SETTINGS)
    with pytest.raises(ServingConfigError, match="'ar-tp2' is not one that ar expands to: "):
        render_all(definitions, ["ar-tp2"], SETTINGS)
    with pytest.raises(ServingConfigError, match=r"'medusa-tp4' is not defined; known: ar, "):
        render_all(definitions, ["medusa-tp4"], SETTINGS)
    with pytest.raises(ServingConfigError, match="budgets names 16 twice"):
        render_all({"ddtree": {**DEFINITIONS["ddtree"], "budgets": [16, 16]}}, ["ddtree"], SETTINGS)
    # The same server named twice is served once.
    names = [c["name"] for c in render_all(definitions, ["ar", "ar-tp4", "ar"], SETTINGS)]
    assert names == ["ar-tp1", "ar-tp4"]


def test_controls_come_with_tp_expanded_names():
    from ansible.module_utils.plan.serving import with_controls

    definitions = shipped_definitions()
    tp = {name: {**d, "tp": [1, 4]} for name, d in definitions.items()}
    # A TP-expanded DDTree server brings the control at its own TP size.
    assert with_controls(tp, ["ar-tp4", "ddtree-tp4-b32"]) == [
        "ar-tp4", "dflash-tree-backend-tp4", "ddtree-tp4-b32"
    ]  # fmt: skip
    # Without a TP list on the control, ddtree-tp4-b32 still brings the control as it is.
    only_tree = {**definitions, "ddtree": {**definitions["ddtree"], "tp": [4]}}
    assert with_controls(only_tree, ["ddtree-tp4-b32"]) == ["dflash-tree-backend", "ddtree-tp4-b32"]
    # Today's names stay as they were.
    assert with_controls(definitions, ["ddtree-b32"]) == ["dflash-tree-backend", "ddtree-b32"]


def test_run_order_keeps_todays_lists_and_puts_the_reference_first():
    from ansible.module_utils.plan.serving import ordered_run

    definitions = shipped_definitions()
    budgets = definitions["ddtree"]["budgets"]
    tree = [f"ddtree-b{b}" for b in budgets]
    assert ordered_run(definitions, ["ar", "eagle3", "dflash", "ddtree"], "ar") == [
        "ar", "eagle3", "dflash", "dflash-tree-backend", *tree
    ]  # fmt: skip
    assert ordered_run(definitions, ["ddtree", "dflash", "ar"], "ar") == [
        "ar", "dflash", "dflash-tree-backend", *tree
    ]  # fmt: skip
    assert ordered_run(definitions, ["ddtree", "ddtree-b32", "ar"], "ar") == [
        "ar", "dflash-tree-backend", "ddtree-b32", *(t for t in tree if t != "ddtree-b32")
    ]  # fmt: skip
    # benchmark_ddtree_budgets replaces the model's budgets.
    assert ordered_run(definitions, ["ddtree"], None, [8, "16"]) == [
        "dflash-tree-backend", "ddtree-b8", "ddtree-b16"
    ]  # fmt: skip
    with pytest.raises(ServingConfigError, match="benchmark_ddtree_budgets has 0"):
        ordered_run(definitions, ["ddtree"], None, [0])
    # Over TP sizes the reference's servers come first, controls still before the trees.
    tp = {name: {**d, "tp": [1, 8]} for name, d in definitions.items()}
    run = ordered_run(tp, ["dflash", "ddtree", "ar"], "ar")
    assert run[:2] == ["ar-tp1", "ar-tp8"]
    assert run.index("dflash-tree-backend-tp8") < run.index("ddtree-tp1-b16")
    assert len(run) == len(set(run)) == 2 * (3 + len(budgets))


def test_model_args_follow_the_kit_model_flags_and_leave_k26_unchanged():
    """The model's launch_args go after the kit's own model flags; K2.6 has none, and its
    commands are byte for byte those of the plans written before models became data."""
    import json
    from pathlib import Path

    from tests.contract.model_launch import launches

    [config] = render_all(
        DEFINITIONS, ["dflash"], {**SETTINGS, "model_args": ["--mamba-ssm-dtype", "float32"]}
    )
    argv = config["argv"]
    at = argv.index("--mamba-ssm-dtype")
    assert argv[at - 2 : at] == ["--reasoning-parser", "kimi_k2"]
    assert argv[at : at + 3] == ["--mamba-ssm-dtype", "float32", "--host"]
    assert render_all(DEFINITIONS, ["dflash"], {**SETTINGS, "model_args": []}) == render_all(
        DEFINITIONS, ["dflash"], SETTINGS
    )
    with pytest.raises(ServingConfigError, match=r"model_args .* must be a list"):
        render_all(DEFINITIONS, ["ar"], {**SETTINGS, "model_args": "--x"})

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "plans-kimi-k2.6"
    checked = 0
    for path in sorted(fixtures.glob("*.json")):
        before = json.loads(path.read_text())
        hardware = before["hardware"]
        # auto's figure is the plan's (test_plan checks it against the capacity plan).
        planned = {
            launch["name"]: int(launch["argv"][launch["argv"].index("--context-length") + 1])
            for config in before["serving_configs"].values()
            for launch in config["launch"]
        }
        now = launches(
            "kimi-k2.6",
            before["profile"],
            kv_cache_dtype=hardware["kv_cache_dtype"],
            chunked_prefill_size=hardware["chunked_prefill_size"],
            context_length="auto",
            context_lengths=planned,
        )
        for config in before["serving_configs"].values():
            for launch in config["launch"]:
                assert now[launch["name"]]["argv"] == launch["argv"], (path.name, launch["name"])
                checked += 1
    assert checked >= 4 * 8


def test_name_filters_wrap_the_one_parser():

    from ansible.errors import AnsibleFilterError

    from tests.support.modules import load_filters

    filters = load_filters()
    assert filters.kimi_config_base("ddtree-tp4-b32") == "ddtree"
    assert filters.kimi_config_name_parts("ddtree-tp4-b32") == {
        "base": "ddtree",
        "tp": 4,
        "budget": 32,
    }
    assert filters.kimi_config_name_parts("ar") == {"base": "ar", "tp": None, "budget": None}
    definitions = shipped_definitions()
    assert filters.kimi_expanded_configs(definitions, ["dflash", "ar"], "ar") == ["ar", "dflash"]
    # An expanded name needs what its config needs.
    assert filters.kimi_needed_repos(["ddtree-b32", "ar"], definitions) == ["target", "dflash"]
    with pytest.raises(AnsibleFilterError, match="serving config name"):
        filters.kimi_config_base("DDTREE")
    with pytest.raises(AnsibleFilterError, match="'medusa' is not defined"):
        filters.kimi_expanded_configs(definitions, ["medusa"], "ar")
    with pytest.raises(AnsibleFilterError, match="needs the definitions mapping"):
        filters.kimi_expanded_configs(["ar"], ["ar"])


def test_every_launch_names_its_model_and_context_length():
    """--served-model-name on every launch; --context-length the user's number, or for auto
    the capacity plan's figure per launch name (left out while none is planned)."""
    named = {**SETTINGS, "served_model_name": "moonshotai/Kimi-K2.6"}
    configs = {c["name"]: c for c in render_all(DEFINITIONS, ["ar", "dflash"], named)}
    for config in configs.values():
        argv = config["argv"]
        assert argv[argv.index("--served-model-name") + 1] == "moonshotai/Kimi-K2.6"
        assert "--context-length" not in argv and config["context_length"] is None

    user = {
        c["name"]: c for c in render_all(DEFINITIONS, ["ar"], {**named, "context_length": 131072})
    }
    argv = user["ar"]["argv"]
    assert argv[argv.index("--context-length") + 1] == "131072"
    assert user["ar"]["context_length"] == 131072

    planned = {**named, "context_length": "auto", "context_lengths": {"dflash": 82972, "ar": 90000}}
    configs = {c["name"]: c for c in render_all(DEFINITIONS, ["ar", "dflash"], planned)}
    assert configs["dflash"]["argv"][configs["dflash"]["argv"].index("--context-length") + 1] == (
        "82972"
    )
    assert configs["ar"]["context_length"] == 90000
    # A user's number wins over what was planned for auto.
    [ar] = render_all(DEFINITIONS, ["ar"], {**planned, "context_length": "4096"})
    assert ar["context_length"] == 4096
    # A record that is not a mapping is no figure.
    [ar] = render_all(DEFINITIONS, ["ar"], {**planned, "context_lengths": ["x"]})
    assert ar["context_length"] is None


@pytest.mark.parametrize("value", [0, -5, "lots", True, 1.5, "12k"])
def test_bad_context_lengths_fail_naming_the_variable(value):
    with pytest.raises(ServingConfigError, match=r"ar: context_length .*kimi_context_length"):
        render_all(DEFINITIONS, ["ar"], {**SETTINGS, "context_length": value})
    with pytest.raises(ServingConfigError, match=r"ar: context_length"):
        render_all(DEFINITIONS, ["ar"], {**SETTINGS, "context_lengths": {"ar": value}})


READ_AT = "93e9850e430035f8a363fd881a6a0c5436b95108"
OVERLAY = {
    "sources": {"commit_read": READ_AT},
    "applies_to": {
        "url": "https://github.com/sgl-project/sglang.git",
        "ref": "refs/pull/29907/head",
    },
}
PR_GIT = {"url": "https://github.com/sgl-project/sglang.git", "ref": "refs/pull/29907/head"}


def test_ddtree_rules_drift_names_both_commits_and_the_files():
    from ansible.module_utils.plan.serving import DDTREE_RULE_FILES, ddtree_rules

    moved = "1" * 40
    drift = ddtree_rules(OVERLAY, {**PR_GIT, "commit": moved}, PR_GIT)
    assert drift["drift"] is True and drift["commit"] == moved and drift["read_at"] == READ_AT
    assert moved in drift["message"] and READ_AT in drift["message"]
    assert all(name in drift["message"] for name in DDTREE_RULE_FILES)
    assert "canary" in drift["message"]
    same = ddtree_rules(OVERLAY, {**PR_GIT, "commit": READ_AT}, PR_GIT)
    assert same["drift"] is False and READ_AT in same["message"]
    # A ref pinned by SHA is its own commit, lock or not.
    assert ddtree_rules(OVERLAY, None, {**PR_GIT, "ref": READ_AT})["drift"] is False
    assert ddtree_rules(OVERLAY, None, {**PR_GIT, "ref": moved})["drift"] is True
    # Not resolved yet (offline plan): unknown, said so.
    unknown = ddtree_rules(OVERLAY, None, PR_GIT)
    assert unknown["drift"] is None and "not in the study lock yet" in unknown["message"]


@pytest.mark.parametrize(
    "overlay, locked",
    [
        (None, None),
        ({"sources": {"commit_read": "not-a-sha"}}, {"commit": "1" * 40}),
        ({"sources": []}, {"commit": 12}),
        ({"sources": "x", "applies_to": 3}, {"commit": "1" * 40}),
        (OVERLAY, {"commit": "../../etc"}),
        (OVERLAY, ["1" * 40]),
    ],
)
def test_ddtree_rules_reads_hostile_values_as_unknown(overlay, locked):
    from ansible.module_utils.plan.serving import ddtree_rules

    try:
        result = ddtree_rules(overlay, locked, PR_GIT)
    except (AttributeError, TypeError) as error:  # pragma: no cover - the failure it guards
        pytest.fail(f"ddtree_rules raised {error!r}")
    assert result["drift"] is None


def test_each_tp_size_is_checked_against_its_own_reference_server():
    """With the reference named at a TP size (ar-tp1), ar-tp4 is TP4's reference, not a config
    to check against TP1's outputs (greedy outputs agree only at one TP size); the lossless
    module and the analysis read it the same way."""
    from ansible.module_utils.plan.serving import is_reference, reference_at_tp

    from analysis import keys
    from tests.support.modules import load_module

    lossless = load_module("benchmark_lossless")
    found = {"ar-tp1": {}, "ar-tp4": {}, "dflash-tp1": {}, "dflash-tp4": {}}
    for reference in ("ar", "ar-tp1"):
        assert [c for c in found if lossless.is_reference(c, reference)] == ["ar-tp1", "ar-tp4"]
        assert [c for c in found if keys.is_reference(c, reference)] == ["ar-tp1", "ar-tp4"]
        assert lossless.reference_of("dflash-tp4", reference, found) == "ar-tp4"
        assert lossless.reference_of("dflash-tp1", reference, found) == "ar-tp1"
    assert lossless.reference_of("dflash", "ar", {"ar": {}, "dflash": {}}) == "ar"
    # A budgeted config is never a reference; a name outside the grammar is only itself.
    assert not is_reference("ddtree-b16", "ddtree")
    assert is_reference("a b", "a b") and not is_reference("a b", "a")
    assert reference_at_tp("ar-tp1", 8) == "ar-tp8" and reference_at_tp("ar", None) == "ar"


def test_prefill_and_decode_servers_get_sglangs_disaggregation_flags_checked_by_its_parser():
    from pathlib import Path

    from ansible.module_utils.plan.serving import load_contracts, validation, with_controls

    contract_dir = Path(__file__).resolve().parents[1] / "contract"
    snapshot = str(contract_dir / "sglang-0.5.23-args.json")
    contracts = load_contracts({"release": {"snapshot": snapshot}}, SETTINGS)
    definitions = shipped_definitions()
    side = {"transfer_backend": "mooncake", "bootstrap_port": 8998, "ib_device": ""}
    argvs = {}
    for mode in ("prefill", "decode"):
        settings = {**SETTINGS, "disaggregation": {**side, "mode": mode}}
        for config in render_all(
            definitions, with_controls(definitions, ["ar", "dflash"]), settings
        ):
            assert validation(config, contracts)["ok"], (mode, config["name"])
            argvs[mode, config["name"]] = config["argv"]
    prefill, decode = argvs["prefill", "ar"], argvs["decode", "ar"]
    assert prefill[prefill.index("--disaggregation-mode") + 1] == "prefill"
    assert prefill[prefill.index("--disaggregation-bootstrap-port") + 1] == "8998"
    assert decode[decode.index("--disaggregation-mode") + 1] == "decode"
    assert "--disaggregation-bootstrap-port" not in decode
    assert "--disaggregation-transfer-backend" in decode
    # A host in neither group serves both: no flag at all.
    [both] = render_all(definitions, ["ar"], {**SETTINGS, "disaggregation": {**side, "mode": ""}})
    assert not [arg for arg in both["argv"] if arg.startswith("--disaggregation")]
    with pytest.raises(ServingConfigError, match="neither prefill nor decode"):
        render_all(definitions, ["ar"], {**SETTINGS, "disaggregation": {"mode": "both"}})
    with pytest.raises(ServingConfigError, match="bootstrap_port"):
        render_all(
            definitions,
            ["ar"],
            {**SETTINGS, "disaggregation": {"mode": "prefill", "bootstrap_port": 0}},
        )
