"""Filters that read the chosen model's folder (models/<kimi_model>/, module_utils/model_data.py).

group_vars/all/model.yml calls them: every model variable there is derived from the folder the
filter reads, so inventory and extra vars still override each one.
"""

from __future__ import annotations

from pathlib import Path

import ansible.module_utils
import yaml
from ansible.errors import AnsibleFilterError

# Modules get the kit's module_utils/ shipped with them; a filter runs in the controller's own
# process, where only ansible's are importable: add the kit's folder to the same package.
_KIT_MODULE_UTILS = str(Path(__file__).resolve().parents[1] / "module_utils")
if _KIT_MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_KIT_MODULE_UTILS)

from ansible.module_utils.model_data import (  # noqa: E402
    ModelDataError,
    config_paths,
    load_model,
    serving_definitions,
)

DOCUMENTATION = r"""
name: kimi_model
short_description: Read and check a model folder of the kit
description:
  - C(kimi_model_data) loads models/<name>/model.yml, checked field by field
    (module_utils/model_data.py); an unknown name or a bad field fails naming the file, the
    field and the fix.
  - C(kimi_serving_definitions) gives the model's serving configs with the DDTree budgets and
    the TP sizes to expand over.
  - C(kimi_model_configs) gives the shipped config.json path of the target and of each drafter.
"""


def _call(function, *args):
    try:
        return function(*args)
    except ModelDataError as error:
        raise AnsibleFilterError(str(error)) from None


def kimi_model_data(name, models_dir):
    return _call(load_model, str(models_dir), name, yaml.safe_load)


def kimi_serving_definitions(model, budgets, tp_sizes=None):
    return _call(serving_definitions, model, budgets, tp_sizes)


def kimi_model_configs(model, models_dir):
    return _call(config_paths, model, str(models_dir))


class FilterModule:
    def filters(self):
        return {
            "kimi_model_data": kimi_model_data,
            "kimi_serving_definitions": kimi_serving_definitions,
            "kimi_model_configs": kimi_model_configs,
        }
