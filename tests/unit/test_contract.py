"""module_utils/contract/: what the results' writer and reader share, defined once. Each test
checks a contract value against what is still written out elsewhere (YAML, folders, programs
shipped as source) and that both sides read names, flags and files the same way."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.contract import launch, level, names, profiles, secrets, thresholds

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "module_utils" / "contract"


def test_the_contract_imports_only_the_standard_library_and_itself():
    for path in sorted(CONTRACT.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                assert top in sys.stdlib_module_names or module.startswith(
                    "ansible.module_utils.contract"
                ), (path.name, module)


# -- names -------------------------------------------------------------------------------


def test_the_writer_and_the_reader_share_one_grammar_and_its_bounds():
    from ansible.module_utils.plan import capacity, model_data, serving, speed_plan

    from analysis import keys, results
    from tests.support.modules import load_filters, load_module

    assert serving.ServingConfigError is names.ServingConfigError
    assert serving.parse_config_name is names.parse_config_name
    assert serving.config_name is names.config_name
    assert serving.is_reference is names.is_reference
    assert serving.reference_at_tp is names.reference_at_tp
    assert (serving.MAX_TP, serving.MAX_BUDGET) == (names.MAX_TP, names.MAX_BUDGET)
    assert (model_data.MAX_TP, model_data.MAX_BUDGET) == (names.MAX_TP, names.MAX_BUDGET)
    assert capacity.MAX_TP == names.MAX_TP
    assert speed_plan.parse_config_name is names.parse_config_name
    assert speed_plan.config_name is names.config_name
    assert results.MAX_TP == names.MAX_TP
    assert results.parse_config_name is names.read_config_name
    assert results.base_config is names.base_config
    assert results.config_order is names.config_order
    assert results.CHAIN_CONTROL == names.CHAIN_CONTROL
    assert keys.is_reference is names.is_reference
    lossless = load_module("benchmark_lossless")
    assert lossless.is_reference is names.is_reference
    assert lossless.parse_config_name is names.parse_config_name
    assert lossless.reference_at_tp is names.reference_at_tp
    filters = load_filters()
    assert filters.parse_config_name is names.parse_config_name
    assert filters.ServingConfigError is names.ServingConfigError
    assert filters.kimi_config_name_parts("x-tp2-b8") == {"base": "x", "tp": 2, "budget": 8}


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("ar", ("ar", None, None)),
        ("ar-tp4", ("ar", 4, None)),
        ("ddtree-b32", ("ddtree", None, 32)),
        ("ddtree-tp4-b32", ("ddtree", 4, 32)),
        ("qwen3.6-x-tp1-b15", ("qwen3.6-x", 1, 15)),
        ("dflash-tree-backend-tp8", ("dflash-tree-backend", 8, None)),
        # The suffixes in the other order are no TP size: the base keeps -b32.
        ("ddtree-b32-tp4", ("ddtree-b32", 4, None)),
    ],
)
def test_config_names_round_trip_through_the_grammar(name, parsed):
    assert names.parse_config_name(name) == parsed
    assert names.read_config_name(name) == parsed
    assert names.config_name(*parsed) == name
    assert names.CONFIG_NAME.match(name)


def test_the_strict_reader_refuses_what_the_grammar_does_not_name():
    for bad in ("", "a b", "Ar", "-ar", "a" * (names.MAX_NAME + 1), None, 4):
        with pytest.raises(names.ServingConfigError):
            names.parse_config_name(bad)
    # At the bound, both readers agree; past it only the strict one still parses (the writer's
    # definitions are bounded by model_data, the analysis' reading by MAX_TP and MAX_BUDGET).
    top = f"ddtree-tp{names.MAX_TP}-b{names.MAX_BUDGET}"
    assert names.read_config_name(top) == ("ddtree", names.MAX_TP, names.MAX_BUDGET)
    assert names.parse_config_name(f"ar-tp{names.MAX_TP + 1}") == ("ar", names.MAX_TP + 1, None)


def test_the_analysis_reads_any_base_with_a_budget_as_the_writer_does():
    """Before the contract the analysis took -b<B> only after `ddtree`, so another budgeted
    definition's servers had no budget in the report; now it reads what the writer renders."""
    from analysis.results import base_config, ddtree_budget, parse_config_name, tp_size

    assert names.parse_config_name("qwen3.6-x-tp1-b15") == ("qwen3.6-x", 1, 15)
    assert parse_config_name("qwen3.6-x-tp1-b15") == ("qwen3.6-x", 1, 15)
    assert base_config("qwen3.6-x-b15") == "qwen3.6-x"
    assert tp_size("qwen3.6-x-tp1-b15") == 1
    assert ddtree_budget("qwen3.6-x-tp1-b15") == 15


def test_the_analysis_takes_no_tp_size_or_budget_the_kit_cannot_render():
    """One bound on both sides: a TP size past MAX_TP (the analysis allowed 4096 before) and a
    budget past MAX_BUDGET (it allowed a million) are no TP size or budget, in a name or in
    the launch argv's --tp-size."""
    from analysis.results import ddtree_budget, tp_size

    assert tp_size(f"ar-tp{names.MAX_TP}") == names.MAX_TP
    assert tp_size(f"ar-tp{names.MAX_TP + 1}") is None
    argv = {"launch": {"argv": ["x", "--tp-size", str(names.MAX_TP + 1)]}}
    assert tp_size("ar", argv) is None
    assert tp_size("ar", {"launch": {"argv": ["x", "--tp", "8"]}}) == 8
    assert ddtree_budget(f"ddtree-b{names.MAX_BUDGET}") == names.MAX_BUDGET
    assert ddtree_budget(f"ddtree-b{names.MAX_BUDGET + 1}") is None


def test_the_lenient_reader_leaves_what_the_kit_cannot_render_whole():
    for name in (
        "ar-tp0",
        "ddtree-b0",
        "ddtree-tp0-b32",
        f"ar-tp{names.MAX_TP + 1}",
        f"ddtree-b{names.MAX_BUDGET + 1}",
        "ddtree-tp4-b²",
        "DDTREE-b32",
        "a b",
        "",
        "a" * (names.MAX_NAME + 1),
    ):
        assert names.read_config_name(name) == (name, None, None), name
        assert names.base_config(name) == name
    assert names.read_config_name(None) == ("None", None, None)
    assert names.read_config_name(f"ar-tp{names.MAX_TP}") == ("ar", names.MAX_TP, None)
    # The strict reader fails where the lenient one gives up, with serving's message.
    with pytest.raises(names.ServingConfigError, match="serving config name"):
        names.parse_config_name("a b")


def test_configs_are_ordered_known_bases_first_then_budgets_then_by_name():
    order = sorted(
        ["zeta", "ddtree-b32", "x-b8", "dflash", "dflash-tree-backend-tp4", "ar-tp4", "eagle3"],
        key=names.config_order,
    )
    assert order == [
        "ar-tp4",
        "eagle3",
        "dflash",
        "dflash-tree-backend-tp4",
        "x-b8",
        "ddtree-b32",
        "zeta",
    ]
    assert list(names.DISPLAY_ORDER) == ["ar", "eagle3", "dflash", names.CHAIN_CONTROL]


def test_a_reference_named_at_one_tp_size_is_the_reference_at_each():
    for reference in ("ar", "ar-tp1"):
        assert names.is_reference("ar-tp4", reference)
        assert names.is_reference("ar", reference)
        assert not names.is_reference("dflash-tp4", reference)
        assert names.reference_at_tp(reference, 4) == "ar-tp4"
    assert not names.is_reference("ar-b16", "ar")
    assert names.reference_at_tp("a b", 4) == "a b"
    assert names.reference_at_tp("ar-tp1", None) == "ar-tp1"


def test_the_run_starts_with_the_reference_s_servers_at_every_tp_size():
    """ordered_run puts the reference first by is_reference too: with the reference named at
    one TP size (ar-tp1), ar-tp4 (TP4's reference) comes before the configs checked
    against it."""
    from ansible.module_utils.plan.serving import ordered_run

    from tests.support.models import definitions

    tp = {name: {**d, "tp": [1, 4]} for name, d in definitions().items()}
    for reference in ("ar", "ar-tp1"):
        run = ordered_run(tp, ["dflash", "ar"], reference)
        assert run[:2] == ["ar-tp1", "ar-tp4"], reference


def test_the_default_reference_is_the_contract_s():
    defaults = yaml.safe_load((REPO / "roles/benchmark/defaults/main.yml").read_text())
    assert defaults["benchmark_reference_config"] == names.REFERENCE
    from tests.support.modules import load_module

    lossless = load_module("benchmark_lossless")
    documented = yaml.safe_load(lossless.DOCUMENTATION)["options"]["reference"]["default"]
    assert documented == names.REFERENCE


def test_the_chain_control_is_the_models_control_for_ddtree():
    checked = False
    for model in sorted((REPO / "models").glob("*/model.yml")):
        definitions = yaml.safe_load(model.read_text()).get("serving_config_definitions") or {}
        controls = {
            name: d.get("control_for") for name, d in definitions.items() if isinstance(d, dict)
        }
        if "ddtree" in definitions:
            assert controls.get(names.CHAIN_CONTROL) == "ddtree", model
            checked = True
    assert checked


# -- launch ------------------------------------------------------------------------------


def test_one_flag_reader_with_each_caller_s_edge_cases():
    from ansible.module_utils.plan import capacity
    from ansible.module_utils.server.api_check import launch_value

    argv = ["python", "--tp-size", "4", "--x=1", "--x", "2", "--tp-size=8", 3, "--end"]
    assert launch.flag_value(argv, "--tp-size") == "8"
    assert launch.flag_value(argv, "--x") == "2"
    assert launch.flag_value(argv, "--end") is None
    assert launch.flag_value(argv, "--absent") is None
    assert launch.flag_value("--tp-size 4", "--tp-size") is None
    assert launch.flag_value(None, "--tp-size") is None
    assert launch.flag_value(["--a", 5], "--a") == "5"
    # The API check's form: "" when absent, items as text.
    assert launch_value(argv, "--absent") == ""
    assert launch_value(["--port", 8000], "--port") == "8000"
    assert launch_value(["--name="], "--name") == ""
    # One reader for the plan (capacity, speed model) and the analysis.
    from ansible.module_utils.plan import speed_inputs, speed_plan

    from analysis import results

    assert capacity.flag_value is speed_inputs.flag_value is launch.flag_value
    assert speed_plan.flag_value is results.flag_value is launch.flag_value


def test_the_tables_count_gpus_over_the_contract_s_tp_and_pp_aliases():
    from analysis.tables import gpus_of

    for tp in launch.TP_FLAGS:
        for pp in launch.PP_FLAGS:
            assert gpus_of({"launch": {"argv": ["x", tp, "4", pp, "2"]}}) == 8, (tp, pp)
    assert gpus_of({"launch": {"argv": ["--tp-size=4"]}, "gpu": {"count": 2}}) == 2


# -- secrets -----------------------------------------------------------------------------


def test_one_mask_and_one_secret_rule():
    from ansible.module_utils.host import helpers, secret_scrub
    from ansible.module_utils.plan import serving

    from analysis import bundle
    from analysis import comparability_facts as comparability

    assert helpers.MASK == secret_scrub.MASK == comparability.MASK == serving.MASK
    assert secrets.MASK == "********"
    assert serving.is_secret_name is secrets.is_secret_name
    assert bundle.SECRET_ENV == secrets.CONTROLLER_SECRET_ENV
    assert comparability.is_secret_name is secrets.is_secret_name
    assert comparability.SECRET_FLAGS == secrets.SECRET_FLAGS
    masked = comparability.launch_environment({"MY_TOKEN": "x", "CUDA_HOME": "/usr"})
    assert masked == {"MY_TOKEN": secrets.MASK, "CUDA_HOME": "/usr"}
    for name in (*secrets.LAUNCH_SECRET_ENV, "my_password", "https_proxy"):
        assert secrets.is_secret_name(name), name
    assert not secrets.is_secret_name("CUDA_VISIBLE_DEVICES")


def test_the_bundle_help_names_every_controller_secret():
    from analysis.__main__ import parser

    text = parser()._subparsers._group_actions[0].choices["bundle"].description
    for name in secrets.CONTROLLER_SECRET_ENV:
        assert name in text
    assert "HF_TOKEN, HUGGING_FACE_HUB_TOKEN and KIMI_SERVER_API_KEY when set" in text


# -- profiles ----------------------------------------------------------------------------


def test_the_profiles_are_the_inventory_groups_and_the_hardware_figures():
    group_vars = {path.stem: path for path in (REPO / "group_vars").glob("*.yml")}
    assert sorted(group_vars) == sorted(profiles.PROFILES)
    for profile, path in group_vars.items():
        data = yaml.safe_load(path.read_text())
        assert data["kimi_profile"] == profile
        assert data["kimi_gpu_model"] == profiles.GPU_MODEL[profile]
    hardware = json.loads((REPO / "group_vars/all/speed_hardware.json").read_text())
    assert sorted(hardware["kimi_speed_hardware"]) == sorted(profiles.PROFILES)
    inventories = [path.name for path in (REPO / "inventory").iterdir() if path.is_dir()]
    assert sorted(inventories) == sorted(profiles.PROFILES)


def test_the_profile_messages_name_every_profile():
    import argparse

    from ansible.module_utils.plan.speed_cli import parser
    from ansible.module_utils.preflight import verdicts

    [commands] = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)]
    [profile] = [a for a in commands.choices["predict"]._actions if a.dest == "profile"]
    assert profile.help == "hardware profile: " + ", ".join(profiles.PROFILES)
    # The preflight's gpu_model fix names the profiles from the contract, not a copy.
    assert "ct200, h200" not in Path(verdicts.__file__).read_text()
    assert verdicts.PROFILES is profiles.PROFILES


def test_each_profile_is_told_by_its_gpu_s_name():
    from analysis.tables import PROFILE_OF_GPU, profile_of

    assert PROFILE_OF_GPU is profiles.PROFILE_OF_GPU
    for profile in profiles.PROFILES:
        assert profiles.GPU_MARKER[profile] in profiles.GPU_MODEL[profile]
        gpu = {"models": {profiles.GPU_MODEL[profile]: 8}}
        assert profile_of({"gpu": gpu}) == profile
    assert profile_of({"gpu": {"models": {"NVIDIA H200 NVL": 8}}}) == "h200"


# -- thresholds --------------------------------------------------------------------------


def test_the_writer_and_the_reader_throttle_at_one_share():
    from ansible.module_utils.benchmark import gpu_summary

    from analysis import telemetry

    assert gpu_summary.THROTTLE_SHARE is telemetry.THROTTLE_SHARE is thresholds.THROTTLE_SHARE


# -- level files -------------------------------------------------------------------------


def test_the_record_kinds_and_versions_are_the_contract_s():
    from ansible.module_utils.benchmark import stats
    from ansible.module_utils.contract import level_schema
    from ansible.module_utils.plan import speed_inputs
    from ansible.module_utils.runtime import freeze
    from ansible.module_utils.server import api_check
    from ansible.module_utils.tuning import speed_calibration

    from analysis import comparability_values as comparability
    from analysis import results

    assert stats.SCHEMA_VERSION == level.SCHEMA_VERSION
    assert level.SCHEMA_VERSION in results.SUPPORTED_SCHEMAS
    schema = json.loads((REPO / "docs/schema/level.schema.json").read_text())
    assert schema["properties"]["schema_version"]["const"] == level.SCHEMA_VERSION
    assert schema["properties"]["kind"]["const"] == level.LEVEL_KIND
    head = level_schema.schema()["properties"]
    assert (head["schema_version"]["const"], head["kind"]["const"]) == (
        level.SCHEMA_VERSION,
        level.LEVEL_KIND,
    )
    assert (api_check.KIND, api_check.SCHEMA_VERSION) == (
        level.API_CHECK_KIND,
        level.API_CHECK_SCHEMA_VERSION,
    )
    properties = results.API_CHECK_SCHEMA["properties"]
    assert properties["kind"]["const"] == level.API_CHECK_KIND
    assert properties["schema_version"]["const"] == level.API_CHECK_SCHEMA_VERSION
    assert results.LOSSLESS_SCHEMA["properties"]["kind"]["const"] == level.LOSSLESS_KIND
    assert results.DEFAULT_MAX_FILE_BYTES == level.MAX_LEVEL_BYTES
    assert freeze.NOT_FROZEN == comparability.NOT_FROZEN == level.NOT_FROZEN
    # Shipped as source to the hosts, it keeps its own literal.
    assert speed_calibration.KIND == speed_inputs.CALIBRATION_KIND


def test_the_benchmark_copies_the_api_check_under_the_contract_s_name():
    config = (REPO / "roles/benchmark/tasks/config.yml").read_text()
    assert f"/{level.API_CHECK_FILE}" in config


def test_level_file_names_parse_into_concurrency_rate_and_repeat():
    assert level.parse_level_file("c4.json") == (4, None, None)
    assert level.parse_level_file("c4.rep2.json") == (4, None, 2)
    assert level.parse_level_file("r0.5.json") == (None, 0.5, None)
    assert level.parse_level_file("r2.rep3.json") == (None, 2.0, 3)
    for name in ("status.json", "c4.json.tmp", "c.json", "lossless.json", "c4"):
        assert level.parse_level_file(name) is None, name


def test_the_writer_names_levels_as_the_reader_parses_them():
    from ansible.module_utils.benchmark import level as benchmark_level

    for concurrency, rate in ((4, None), (None, 0.5), (None, 2.0), (None, 0.0001)):
        for repeat in (1, 2, 10):
            name = level.level_stem(concurrency, rate, repeat) + ".json"
            assert level.parse_level_file(name) == (
                concurrency,
                rate,
                repeat if repeat > 1 else None,
            ), name
    plan = benchmark_level.level_plan(
        {
            "concurrency": [1, 8],
            "num_prompts": 1,
            "requests_per_concurrency": 1,
            "request_rates": [0.5],
            "rate_duration_s": 10,
            "max_concurrency": 0,
        }
    )
    assert [entry["stem"] for entry in plan] == ["c1", "c8", "r0.5"]
    with pytest.raises(ValueError, match="no plain decimal name"):
        level.rate_text(1e-7)


def test_the_lossless_check_reads_closed_loop_first_repeats_only(tmp_path):
    from tests.support.modules import load_module

    lossless = load_module("benchmark_lossless")
    folder = tmp_path / "ar" / "gsm8k"
    folder.mkdir(parents=True)
    for name in ("c4.json", "c8.json", "c4.rep2.json", "r0.5.json", "status.json"):
        (folder / name).write_text("{}")
    found = lossless.levels(str(tmp_path))
    assert sorted(found["ar"]) == [("gsm8k", 4), ("gsm8k", 8)]
