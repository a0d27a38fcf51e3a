"""Serving configs rendered into launch commands: flags, masking and bad inputs."""

from __future__ import annotations

import pytest
from ansible.module_utils.serving import MASK, ServingConfigError, masked, render_all

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
    import importlib.util
    import shlex
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "filter_plugins" / "kimi_filters.py"
    spec = importlib.util.spec_from_file_location("kimi_filters", path)
    filters = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(filters)
    line = filters.systemd_exec_line(
        ["/v/bin/python", "-m", "x", "--a", "two words", "50%", "$HOME"]
    )
    assert line == '/v/bin/python -m x --a "two words" "50%%" "$$HOME"'
    env = filters.env_file_line("NCCL_X", 'a "b" \\c')
    assert env == 'NCCL_X="a \\"b\\" \\\\c"'
    # The supervisor reads it back with shlex, as systemd does with EnvironmentFile.
    assert shlex.split(env) == ['NCCL_X=a "b" \\c']
    with pytest.raises(ValueError, match="newline"):
        filters.env_file_line("K", "a\nb")
    with pytest.raises(ValueError, match="not a valid environment variable name"):
        filters.env_file_line("1BAD", "x")


def shipped_definitions() -> dict:
    """group_vars/all/serving.yml's definitions, budgets resolved as kimi_ddtree_budgets."""
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    serving = yaml.safe_load((root / "group_vars" / "all" / "serving.yml").read_text())
    model = yaml.safe_load((root / "group_vars" / "all" / "model.yml").read_text())
    definitions = serving["kimi_serving_config_definitions"]
    definitions["ddtree"]["budgets"] = model["kimi_ddtree_budgets"]
    return definitions


def test_chain_control_comes_with_ddtree_just_before_it():
    from ansible.module_utils.serving import with_controls

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
    from ansible.module_utils.serving import with_controls

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

    from ansible.module_utils.serving import load_contracts, validation, with_controls

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
        ["ddtree-b32", "ar"],
        ["ar", "dflash-tree-backend", "ddtree"],
        ["ar", "eagle3", "dflash"],
        ["dflash", "ar"],
    ]
    play = [
        {
            "name": "Evaluate the benchmark role's config list",
            "hosts": "localhost",
            "gather_facts": False,
            "vars_files": [
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
                }
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
    assert shown == [
        ["ar", "dflash", "dflash-tree-backend", "ddtree-b8", "ddtree-b16"],
        ["ar", "dflash-tree-backend", "ddtree-b32"],
        ["ar", "dflash-tree-backend", "ddtree-b8", "ddtree-b16"],
        ["ar", "eagle3", "dflash"],
        ["ar", "dflash"],
    ]
