"""Launch commands of a shipped model as the kit renders them, for the contract tests.

Reads models/<name>/model.yml's launch keys (serving configs, budgets, parsers, launch_args,
per-profile attention backends and memory fraction) the way group_vars/all does
(module_utils/plan/model_data.py serving_definitions) and renders them with
module_utils/plan/serving.py,
so the contract tests check the commands the kit would run, not copies of them. The config
files capacity planning reads play no part in a command, so they are not needed here.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from ansible.module_utils.plan.model_data import serving_definitions
from ansible.module_utils.plan.serving import render_all, with_controls

REPO = Path(__file__).resolve().parents[2]
WEIGHTS = "/opt/kimi/weights"
PYTHONS = {"release": "/opt/kimi/venv/bin/python", "git": "/opt/kimi/venv-git/bin/python"}
GIT = {"url": "https://github.com/sgl-project/sglang.git", "ref": "refs/pull/29907/head"}


def model(name: str) -> dict:
    return yaml.safe_load((REPO / "models" / name / "model.yml").read_text(encoding="utf-8"))


def settings(data: dict, profile: str, **host) -> dict:
    """kimi_server_settings for one host of `profile` (group_vars/all/serving.yml's keys);
    `host` overrides what the profile files hold (kv_cache_dtype, chunked_prefill_size)."""
    choices = data["profiles"][profile]
    return {
        "pythons": PYTHONS,
        "model_path": f"{WEIGHTS}/{data['target']['repo_id']}",
        "draft_model_paths": {
            key: f"{WEIGHTS}/{drafter['repo_id']}" for key, drafter in data["drafters"].items()
        },
        "tp_size": choices.get("tp_size") or data["tp_size"],
        "mem_fraction_static": choices["mem_fraction_static"],
        "kv_cache_dtype": "auto",
        "chunked_prefill_size": 16384,
        "attention_backends": {
            "target": choices["target_attention_backend"],
            "draft": choices["draft_attention_backend"],
            "tree": choices["tree_attention_backend"],
        },
        "host": "127.0.0.1",
        "port": 30000,
        "tool_call_parser": data["parsers"]["tool_call"],
        "reasoning_parser": data["parsers"]["reasoning"],
        "served_model_name": data["target"]["repo_id"],
        # auto's figure comes from a capacity plan, which these commands have none of: a
        # number stands in for it, so the contract checks the flag too.
        "context_length": 65536,
        "model_args": data.get("launch_args") or [],
        "environment": {"HF_HUB_OFFLINE": "1"},
        "release": "0.5.23",
        "git": GIT,
        **host,
    }


def launches(name: str, profile: str, tp_sizes=None, **host) -> dict[str, dict]:
    """{config name: rendered config} of every server the model's serving configs (and their
    controls) expand to on one host of `profile`."""
    data = model(name)
    definitions = serving_definitions(data, data["ddtree_budgets"], tp_sizes)
    selected = with_controls(definitions, data["serving_configs"])
    return {
        config["name"]: config
        for config in render_all(definitions, selected, settings(data, profile, **host))
    }


def profiles(name: str) -> list[str]:
    return sorted(model(name)["profiles"])
