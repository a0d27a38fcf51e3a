"""The controller's settings check (module_utils/contract/settings.py, settings_host.py): the
roles' argument specs read as the one source of types and ranges, strictness where Ansible's
own validation converts, the closest name for a misspelling, and the user's setting named
behind a role option's default."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.contract import settings as spec
from ansible.module_utils.contract import settings_host as check

REPO = Path(__file__).resolve().parents[2]


def kit_options() -> dict:
    return spec.role_options(
        {
            path.parts[-3]: yaml.safe_load(path.read_text())
            for path in sorted(REPO.glob("roles/*/meta/argument_specs.yml"))
        }
    )


def test_every_number_of_every_role_states_its_range_and_the_defaults_fit_it():
    options = kit_options()
    numeric = [n for n, o in options.items() if spec.option_range(n, o)]
    assert len(numeric) >= 70
    for role_defaults in REPO.glob("roles/*/defaults/main.yml"):
        for name, value in (yaml.safe_load(role_defaults.read_text()) or {}).items():
            if name in options and not (isinstance(value, str) and "{{" in value):
                assert spec.option_problem(options[name], value) is None, (name, value)


def test_a_number_without_a_range_is_a_defect_of_the_kit():
    with pytest.raises(spec.SpecError, match="benchmark_x gives no range"):
        spec.role_options(
            {"b": {"argument_specs": {"main": {"options": {"benchmark_x": {"type": "int"}}}}}}
        )
    with pytest.raises(spec.SpecError, match="is empty"):
        spec.option_range("x", {"type": "float", "description": "Seconds. Range 5 to 1."})


@pytest.mark.parametrize(
    ("option", "value", "needed"),
    [
        ({"type": "int", "description": "Range 1 to 100."}, 0, "an integer from 1 to 100"),
        ({"type": "int", "description": "Range 1 to 100."}, "7", None),
        ({"type": "int", "description": "Range 1 to 100."}, "7.5", "an integer from 1 to 100"),
        ({"type": "int", "description": "Range 1 to 100."}, True, "an integer from 1 to 100"),
        (
            {"type": "float", "description": "Range above 0 to below 1."},
            1.0,
            "a number above 0 and below 1",
        ),
        ({"type": "float", "description": "Range above 0 to below 1."}, "0.85", None),
        (
            {"type": "float", "description": "Range above 0 to below 1."},
            "nan",
            "a number above 0 and below 1",
        ),
        ({"type": "float", "description": "Range 0 to 10."}, float("inf"), "a number from 0 to 10"),
        ({"type": "bool"}, "yes", None),
        ({"type": "bool"}, "maybe", "true or false"),
        ({"type": "str"}, ["a"], "text"),
        ({"type": "str", "choices": ["pcie", "nvlink"]}, "nvlnk", "one of pcie, nvlink"),
        ({"type": "dict"}, "a=1", "a mapping (key: value)"),
        (
            {"type": "list", "elements": "int", "description": "Range 1 to 4096."},
            "1,4,16",
            "a list of integers",
        ),
        (
            {"type": "list", "elements": "int", "description": "Range 1 to 4096."},
            [16, -8],
            "a list of integers",
        ),
        ({"type": "list", "elements": "str"}, ["ar", 3], None),
        ({"type": "list", "elements": "str"}, ["ar", ["x"]], "a list of texts"),
        ({"type": "str", "required": True}, None, "a value"),
        ({"type": "str"}, None, None),
    ],
)
def test_values_are_held_to_their_spec_strictly(option, value, needed):
    found = spec.option_problem(option, value)
    if needed is None:
        assert found is None
    else:
        assert found is not None and found[0].startswith(needed), found


def test_a_list_given_as_text_says_which_item_or_kind_is_wrong():
    option = {"type": "list", "elements": "int", "description": "Range 1 to 4096."}
    assert spec.option_problem(option, [16, -8]) == (
        "a list of integers from 1 to 4096",
        "item -8 is not",
    )
    assert spec.option_problem(option, "1,4,16") == (
        "a list of integers from 1 to 4096",
        "text, not a list",
    )


def test_any_value_gets_an_answer_never_an_exception():
    options = list(kit_options().values())
    rng = random.Random(34)
    pool = [
        None,
        True,
        0,
        -1,
        2**70,
        1.5,
        float("nan"),
        "",
        "x" * 5000,
        "12",
        [],
        [1, "a", None],
        {},
        {"a": [1]},
    ]
    for _ in range(3000):
        found = spec.option_problem(rng.choice(options), rng.choice(pool))
        assert found is None or (isinstance(found, tuple) and isinstance(found[0], str))


def test_a_misspelling_gets_the_closest_known_name_of_its_prefix():
    known = {
        "kimi_weights_dir",
        "kimi_weights_owner",
        "benchmark_concurrency",
        "kimi_benchmark_concurrency",
    }
    assert spec.closest("kimi_weigths_dir", known) == "kimi_weights_dir"
    assert spec.closest("benchmark_concurency", known) == "benchmark_concurrency"
    assert spec.closest("kimi_something_else_entirely", known) is None
    assert spec.unknown_names(
        ["kimi_weigths_dir", "kimi_weights_dir", "my_var", "server_x"], known
    ) == [
        ("kimi_weigths_dir", "kimi_weights_dir"),
        ("server_x", None),
    ]


def test_names_are_read_from_keys_and_jinja_not_from_comments():
    document = yaml.safe_load(
        "# kimi_in_a_comment: 1\n"
        'kimi_a: "{{ kimi_b | default(benchmark_c) }}"\n'
        "tasks:\n  - when: weights_d is defined\n    vars: {plan_e: 1, __kimi_private: 2}\n"
    )
    assert spec.names_in(document, set()) == {
        "kimi_a",
        "kimi_b",
        "benchmark_c",
        "weights_d",
        "plan_e",
    }


def host(values: dict, origins: dict, raws: dict | None = None):
    def value(name):
        if name not in values:
            raise KeyError(name)
        if isinstance(values[name], Exception):
            raise values[name]
        return values[name]

    return value, origins.get, (raws or {}).get


def test_a_wrong_option_names_the_users_setting_behind_its_default_once():
    options = {
        "benchmark_concurrency": {
            "type": "list",
            "elements": "int",
            "description": "Range 1 to 64.",
            "role": "benchmark",
        },
        "plan_speed_concurrency": {
            "type": "list",
            "elements": "int",
            "description": "Range 1 to 64.",
            "role": "plan",
        },
    }
    value, origin, raw = host(
        {
            "benchmark_concurrency": "1,4,16",
            "plan_speed_concurrency": "1,4,16",
            "kimi_benchmark_concurrency": [1],
        },
        {"benchmark_concurrency": "-e"},
        {"plan_speed_concurrency": "{{ benchmark_concurrency | default(kimi_x) }}"},
    )
    known = set(options) | {"kimi_benchmark_concurrency"}
    [problem] = check.option_problems(options, value, origin, raw, known)
    assert problem["found"] == "benchmark_concurrency is '1,4,16' (-e): text, not a list"
    json_form = """-e '{"benchmark_concurrency": [1, 4, 16]}'"""
    assert problem["fix"] == "give it as JSON, where a list stays a list: " + json_form
    assert "roles/benchmark/meta/argument_specs.yml" in problem["needed"]


def test_a_default_follows_to_the_inventory_file_that_set_it():
    options = {
        "preflight_tp_size": {"type": "int", "description": "Range 1 to 1024.", "role": "preflight"}
    }
    value, origin, raw = host(
        {"preflight_tp_size": 0, "kimi_tp_size": 0},
        {"kimi_tp_size": "inventory/lab/host_vars/n1.yml:3"},
        {"preflight_tp_size": "{{ kimi_tp_size }}"},
    )
    [problem] = check.option_problems(options, value, origin, raw, set(options) | {"kimi_tp_size"})
    assert (
        problem["found"]
        == "preflight_tp_size is 0, from kimi_tp_size (inventory/lab/host_vars/n1.yml:3)"
    )
    assert problem["fix"] == "set kimi_tp_size to an integer from 1 to 1024"


def test_a_template_that_fails_is_a_problem_naming_the_setting():
    options = {"kimi_x": {"type": "str", "role": "plan"}}
    value, origin, raw = host({"kimi_x": ValueError("'kimi_y' is undefined")}, {"kimi_x": "-e"})
    [problem] = check.option_problems(options, value, origin, raw, set(options))
    assert problem["found"].startswith("kimi_x cannot be worked out (-e): ")
    assert "'kimi_y' is undefined" in problem["found"] and problem["fix"].startswith(
        "set kimi_x to"
    )


def test_profiles_and_tokens():
    value, _, _ = host({}, {})
    assert (
        "none of the hardware profile groups (its groups: gpu_hosts, h100)"
        in check.profile_problem(value, ["gpu_hosts", "h100"])["found"]
    )
    value, _, _ = host({"kimi_profile": "h200"}, {})
    assert check.profile_problem(value, ["gpu_hosts", "h200"]) is None
    assert (
        "2 hardware profile groups (ct200, h200)"
        in check.profile_problem(value, ["ct200", "h200"])["found"]
    )
    repos = {"dflash": {"repo_id": "z-lab/Kimi-K2.6-DFlash"}}
    gated = {"target": False, "dflash": True, "eagle3": False}
    assert check.gated_needed(["target", "eagle3"], gated) == []
    assert check.gated_needed(["dflash", "target"], gated) == ["dflash"]
    assert check.token_problem("", [], repos) is None
    assert check.token_problem("hf_x", ["dflash"], repos) is None
    problem = check.token_problem("", check.gated_needed(["target", "dflash"], gated), repos)
    assert "gated z-lab/Kimi-K2.6-DFlash (dflash)" in problem["found"]
    assert check.problem_text(problem).count("Needed:") == 1
