"""models/<name>/model.yml read and checked (module_utils/plan/model_data.py): the shipped models
load, and a bad name, path or field fails with the file, the field, what was found and what is
needed; a thousand random mutations of a real model.yml never raise anything else."""

from __future__ import annotations

import copy
import random
import shutil
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.plan.model_data import (
    ModelDataError,
    check_model,
    config_paths,
    known_models,
    load_model,
    serving_definitions,
)

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"


def load(models_dir, name):
    return load_model(models_dir, name, yaml.safe_load)


@pytest.fixture
def models(tmp_path):
    """A copy of the shipped K2.6 folder to break."""
    shutil.copytree(MODELS / "kimi-k2.6", tmp_path / "kimi-k2.6")
    return tmp_path


def write(models, data) -> None:
    (models / "kimi-k2.6" / "model.yml").write_text(yaml.safe_dump(data))


def raw(models) -> dict:
    return yaml.safe_load((models / "kimi-k2.6" / "model.yml").read_text())


def test_the_shipped_models_load():
    assert set(known_models(MODELS)) >= {"kimi-k2.6", "qwen3.6-27b"}
    kimi = load(MODELS, "kimi-k2.6")
    assert kimi["attention"] == "pure_attention"
    assert kimi["tp_size"] == 8
    assert kimi["serving_configs"] == ["ar", "eagle3", "dflash", "ddtree"]
    assert set(kimi["drafters"]) == {"dflash", "eagle3"}
    qwen = load(MODELS, "qwen3.6-27b")
    assert qwen["attention"] == "hybrid"
    assert qwen["tp_size"] == 1
    assert qwen["target"]["repo_id"] == "Qwen/Qwen3.6-27B"
    assert qwen["drafters"]["dflash"]["repo_id"] == "z-lab/Qwen3.6-27B-DFlash"
    # No EAGLE-3 drafter is published for it: no config may ask for one.
    assert "eagle3" not in qwen["drafters"]
    assert all(d["drafter"] != "eagle3" for d in qwen["serving_config_definitions"].values())
    for name in ("kimi-k2.6", "qwen3.6-27b"):
        for path in config_paths(load(MODELS, name), MODELS).values():
            assert Path(path).is_file() and Path(path).is_relative_to(MODELS / name)


def test_every_profile_has_the_model_choices():
    profiles = {path.stem for path in (REPO / "group_vars").glob("*.yml")}
    for name in known_models(MODELS):
        assert set(load(MODELS, name)["profiles"]) == profiles, name


@pytest.mark.parametrize("name", ["../models/kimi-k2.6", "/etc", "kimi-k2.6/dflash", "", "Kimi", 7])
def test_a_name_that_is_not_a_plain_folder_is_refused(name):
    with pytest.raises(ModelDataError, match=r"Known models .*kimi-k2.6"):
        load(MODELS, name)


def test_an_unknown_model_names_the_known_ones():
    with pytest.raises(ModelDataError, match=r"'no-such-model'.*does not exist.*kimi-k2.6"):
        load(MODELS, "no-such-model")


@pytest.mark.parametrize(
    ("path", "needed"),
    [
        ("../../etc/passwd", "inside it"),
        ("/etc/passwd", "inside it"),
        ("missing.json", "an existing file"),
        ("dflash", "an existing file"),
    ],
)
def test_a_config_path_must_stay_inside_the_folder(models, path, needed):
    data = raw(models)
    data["drafters"]["dflash"]["config"] = path
    write(models, data)
    with pytest.raises(ModelDataError, match=f"drafters.dflash.config is .*{needed}"):
        load(models, "kimi-k2.6")


def test_a_link_out_of_the_folder_is_refused(models, tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    (models / "kimi-k2.6" / "linked.json").symlink_to(outside)
    data = raw(models)
    data["target"]["config"] = "linked.json"
    write(models, data)
    with pytest.raises(ModelDataError, match=r"target.config .*stays inside"):
        load(models, "kimi-k2.6")


def _set(data, dotted, value):
    *parents, last = dotted.split(".")
    for part in parents:
        data = data[part]
    data[last] = value


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("name", "other", "name is 'other'; needed the folder's name"),
        ("attention", "mamba", "attention is 'mamba'; needed one of pure_attention, hybrid"),
        ("tp_size", "8", "tp_size is '8'; needed an integer from 1 to 1024"),
        ("tp_size", True, "tp_size is True"),
        ("tp_size", 0, "tp_size is 0"),
        ("tp_size", 4096, "tp_size is 4096"),
        ("ddtree_budgets", [16, 16], "no value twice"),
        ("ddtree_budgets", [0], "integers from 1"),
        ("ddtree_budgets", "16", "a list of 1 to"),
        ("target.repo_id", "no-slash", "target.repo_id is 'no-slash'; needed a hub repository id"),
        ("target.revision", "--upload-pack=x", "target.revision is '--upload-pack=x'"),
        ("drafters.eagle3", "a string", "drafters.eagle3 is 'a string'; needed a mapping"),
        ("serving_configs", ["ar", "medusa"], "needed a non-empty list of defined configs"),
        ("serving_config_definitions.eagle3.drafter", "medusa", "needed null or a drafter"),
        ("serving_config_definitions.ar.runtime", "docker", "needed one of release, git"),
        ("serving_config_definitions.ar.tree", "yes", "needed true or false"),
        ("serving_config_definitions.ar.args", ["--x\n--y"], "one line"),
        ("serving_config_definitions.ar.tp", [1, 0], "integers from 1 to 1024"),
        ("serving_config_definitions.ar.colour", "red", "only the keys of a serving config"),
        ("serving_config_definitions.dflash-tree-backend.control_for", "x", "a serving config"),
        ("serving_config_definitions.ddtree.budget_flag", "budget", "needed a --flag"),
        ("parsers.tool_call", "kimi k2", "parsers.tool_call is 'kimi k2'"),
        ("profiles.ct200.mem_fraction_static", 1.5, "needed a number between 0 and 1"),
        ("profiles.ct200.target_attention_backend", None, "target_attention_backend is None"),
        ("launch_args", "--x", "launch_args is '--x'"),
        ("accuracy", "on", "accuracy is 'on'; needed a mapping"),
        ("accuracy.floors.gsm8k.floor", 1.5, "needed a share of right answers above 0"),
        ("accuracy.floors.gsm8k.floor", True, "accuracy.floors.gsm8k.floor is True"),
        ("accuracy.floors.gsm8k.source", "", "accuracy.floors.gsm8k.source is ''"),
        ("accuracy.floors.gsm8k", 0.9, "accuracy.floors.gsm8k is 0.9; needed a mapping"),
        ("accuracy.chat_template_kwargs.thinking", [False], "a boolean, number or short string"),
        ("accuracy.chat_template_kwargs", ["thinking"], "needed a mapping"),
    ],
)
def test_a_bad_field_is_named_with_what_is_needed(models, field, value, message):
    data = raw(models)
    _set(data, field, value)
    write(models, data)
    with pytest.raises(ModelDataError) as caught:
        load(models, "kimi-k2.6")
    assert str(models / "kimi-k2.6" / "model.yml") in str(caught.value)
    assert message in str(caught.value)


def test_a_config_named_like_an_expansion_is_refused(models):
    data = raw(models)
    data["serving_config_definitions"]["ddtree-b16"] = {"drafter": None, "args": []}
    write(models, data)
    with pytest.raises(ModelDataError, match="not ending in -tp<N>"):
        load(models, "kimi-k2.6")


@pytest.mark.parametrize("text", ["[1, 2]", "a: [", "", "\x00"])
def test_a_file_that_is_not_a_mapping_fails_cleanly(models, text):
    (models / "kimi-k2.6" / "model.yml").write_text(text)
    with pytest.raises(ModelDataError, match=r"model\.yml"):
        load(models, "kimi-k2.6")


def test_an_oversized_file_is_refused_before_parsing(models):
    (models / "kimi-k2.6" / "model.yml").write_bytes(b"#" * (2 << 20))
    with pytest.raises(ModelDataError, match="over 1048576 bytes"):
        load(models, "kimi-k2.6")


def test_serving_definitions_sweep_budgets_and_tp_sizes():
    kimi = load(MODELS, "kimi-k2.6")
    plain = serving_definitions(kimi, [16, 32])
    assert plain["ddtree"]["budgets"] == [16, 32]
    assert "budgets" not in plain["dflash"] and "tp" not in plain["dflash"]
    swept = serving_definitions(kimi, [16], [1, 4, 8])
    assert all(definition["tp"] == [1, 4, 8] for definition in swept.values())
    # The model's data is never changed by a caller's sweep.
    assert "tp" not in kimi["serving_config_definitions"]["ar"]
    assert "budgets" not in kimi["serving_config_definitions"]["ddtree"]
    for budgets, tp_sizes in (([0], []), ([16, 16], []), ([16], ["4"]), ([16], [True])):
        with pytest.raises(ModelDataError, match="Fix kimi_"):
            serving_definitions(kimi, budgets, tp_sizes)


def _mutate(value, rng: random.Random):
    choices = [None, True, -1, 0, 2**40, 1.5, float("nan"), "", "x" * 2000, "../x", [], {}, [0]]
    if isinstance(value, dict) and value and rng.random() < 0.7:
        key = rng.choice(list(value))
        if rng.random() < 0.15:
            del value[key]
        else:
            value[key] = _mutate(value[key], rng)
        return value
    if isinstance(value, list) and value and rng.random() < 0.7:
        index = rng.randrange(len(value))
        value[index] = _mutate(value[index], rng)
        return value
    return rng.choice(choices)


def test_random_mutations_fail_only_with_model_data_errors():
    folder = MODELS / "kimi-k2.6"
    original = yaml.safe_load((folder / "model.yml").read_text())
    rng = random.Random(17)
    refused = 0
    for _ in range(1000):
        data = _mutate(copy.deepcopy(original), rng)
        try:
            checked = check_model(data, folder)
        except ModelDataError:
            refused += 1
            continue
        # What passes is well formed enough for the serving renderer.
        serving_definitions(checked, checked["ddtree_budgets"])
        assert isinstance(checked["tp_size"], int)
    assert refused > 500
