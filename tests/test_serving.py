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

    path = Path(__file__).resolve().parent.parent / "filter_plugins" / "kimi_filters.py"
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
