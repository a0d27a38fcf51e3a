"""The shipped models' data for tests, read the way group_vars/all reads it
(module_utils/model_data.py), so that tests never copy a model's flags or repositories."""

from __future__ import annotations

from pathlib import Path

import yaml

from module_utils.model_data import config_paths, load_model, serving_definitions

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
DEFAULT = "kimi-k2.6"


def model(name: str = DEFAULT) -> dict:
    return load_model(MODELS, name, yaml.safe_load)


def definitions(name: str = DEFAULT, budgets=None, tp_sizes=None) -> dict:
    """kimi_serving_config_definitions as group_vars/all gives them for the model: budgets
    default to the model's kimi_ddtree_budgets."""
    data = model(name)
    return serving_definitions(
        data, data["ddtree_budgets"] if budgets is None else budgets, tp_sizes
    )


def configs(name: str = DEFAULT) -> dict[str, str]:
    """kimi_model_configs: the shipped config.json of the target and of each drafter."""
    return config_paths(model(name), MODELS)
