"""The plan's speed prediction (module_utils/plan/speed_plan.py): per launch and benchmark level the
step, accepted tokens and tokens/s against figures worked out by hand, the prompt sets grouped
by their published acceptance, running caps, DDTree curves per config, the host's calibration
and all-reduce records, and what it refuses or leaves null with a reason."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.plan import speed_inputs, speed_model, speed_plan
from ansible.module_utils.plan.speed_inputs import SpeedModelError

REPO = Path(__file__).resolve().parents[2]
K26 = REPO / "models" / "kimi-k2.6"
HARDWARE = json.loads((REPO / "group_vars" / "all" / "speed_hardware.json").read_text())[
    "kimi_speed_hardware"
]
SETS = ["gsm8k", "mt-bench", "humaneval", "math500", "mbpp"]
LEVELS = [1, 4, 16, 64]
pytestmark = pytest.mark.preflight


def free_profile(step_ms: float = 10.0, scheduler_ms: float = 5.0) -> dict:
    """A profile whose every bandwidth and peak is so high that a step is its fixed overhead
    (plus the scheduler's without overlap scheduling), to 0.1%: figures a hand can check."""
    fast = {"value": speed_inputs.MAX_RATE, "source": "test: as fast as the model allows"}
    tiny = {"value": 1e-6, "source": "test: next to nothing"}
    return {
        "gpu": "test GPU",
        "interconnect": "nvlink",
        **dict.fromkeys(
            ("hbm_gbs", "copy_gbs", "bf16_tflops", "int4_tflops", "allreduce_busbw_gbs",
             "host_mask_gbs"),
            fast,
        ),
        **dict.fromkeys(
            ("allreduce_latency_us", "moe_layer_overhead_us", "tree_build_us_per_request"), tiny
        ),
        "gemm_bandwidth_efficiency": {"value": 1.0, "source": "test"},
        "dense_bandwidth_efficiency": {"value": 1.0, "source": "test"},
        "step_overhead_ms": {"value": step_ms, "source": "test: the whole step"},
        "scheduler_overhead_ms": {"value": scheduler_ms, "source": "test: no overlap"},
    }  # fmt: skip


def inputs() -> dict:
    return speed_plan.plan_inputs(
        {
            "target": str(K26 / "config.json"),
            "dflash": str(K26 / "dflash" / "config.json"),
            "eagle3": str(K26 / "eagle3" / "config.json"),
        },
        K26,
    )


def launch(name: str, tp_size: int = 8, budget: int | None = None, **extra) -> dict:
    """A launch as serving_render gives it: the model's own speculative args for its config."""
    definitions = yaml.safe_load((K26 / "model.yml").read_text())["serving_config_definitions"]
    base = name.split("-tp")[0].split("-b")[0] if name.startswith("ddtree") else name
    argv = ["python", "-m", "sglang.launch_server", "--tp-size", str(tp_size),
            "--kv-cache-dtype", "auto", *map(str, definitions[base]["args"])]  # fmt: skip
    if budget is not None:
        argv += ["--speculative-ddtree-budget", str(budget)]
    return {"name": name, "base": base, "argv": argv, "tp_size": tp_size, **extra}


SHIPPED = [
    launch("ar"),
    launch("eagle3"),
    launch("dflash"),
    launch("dflash-tree-backend"),
    *(launch(f"ddtree-b{b}", budget=b) for b in (16, 32, 64, 128)),
]


def plan(launches=None, figures=None, **options) -> dict:
    options = {"concurrency": LEVELS, "prompt_sets": SETS, "context_tokens": 456, **options}
    figures = figures or speed_plan.hardware_figures({"free": free_profile()}, "free")
    return speed_plan.plan_speed(
        SHIPPED if launches is None else launches, inputs(), figures, **options
    )


def rates(entry: dict, level: int, prompt_set: str) -> dict:
    [found] = [lv for lv in entry["levels"] if lv["concurrency"] == level]
    [group] = [g for g in found["by_prompt_set"] if prompt_set in g["prompt_sets"]]
    return {**group, "step_ms": found["step_ms"], "batch": found["batch"]}


def test_a_step_that_is_its_overhead_gives_the_rates_a_hand_works_out():
    speed = plan()
    launches = speed["launches"]
    # AR: one token a step, 10 ms a step: 100 tok/s a request, 400 at c4, no cap under c64.
    ar = rates(launches["ar"], 1, "gsm8k")
    assert ar["step_ms"] == pytest.approx(10.0, rel=1e-3)
    assert ar["accepted_tokens_per_step"] == 1.0
    assert ar["tokens_per_s"] == pytest.approx(100.0, rel=1e-3)
    c4 = rates(launches["ar"], 4, "mt-bench")
    assert c4["tokens_per_s"] == pytest.approx(400.0, rel=1e-3)
    assert c4["tokens_per_s_per_request"] == pytest.approx(100.0, rel=1e-3)
    assert rates(launches["ar"], 64, "mbpp")["batch"] == 64
    assert launches["ar"]["max_running_requests"] is None
    # DFlash at c64 runs 48 at once (SGLang's cap under speculative decoding): 48 x 5.3
    # tokens per 10 ms step for the server, shared by 64 clients.
    dflash = rates(launches["dflash"], 64, "gsm8k")
    assert dflash["batch"] == 48 and launches["dflash"]["max_running_requests"] == 48
    assert "48" in launches["dflash"]["max_running_requests_source"]
    assert dflash["accepted_tokens_per_step"] == 5.3
    assert dflash["tokens_per_s"] == pytest.approx(48 * 5.3 / 0.010, rel=1e-3)
    assert dflash["tokens_per_s_per_request"] == pytest.approx(48 * 5.3 / 0.010 / 64, rel=1e-3)
    assert rates(launches["dflash"], 1, "mt-bench")["tokens_per_s"] == pytest.approx(370, rel=1e-3)
    # Overlap scheduling off (the chain control, DDTree): the scheduler's 5 ms more a step.
    control = rates(launches["dflash-tree-backend"], 1, "math500")
    assert control["step_ms"] == pytest.approx(15.0, rel=1e-3)
    assert control["tokens_per_s"] == pytest.approx(5.5 / 0.015, rel=1e-3)
    # EAGLE-3 has a figure for gsm8k only: every set gets it (the mean of one figure).
    eagle3 = launches["eagle3"]
    assert [group["prompt_sets"] for group in eagle3["acceptance"]] == [SETS]
    assert rates(eagle3, 16, "humaneval")["tokens_per_s"] == pytest.approx(
        16 * 3.2 / 0.010, rel=1e-3
    )
    # DDTree at budget 32 verifies 33 tokens a request; its tree accepts more than the chain.
    b32 = launches["ddtree-b32"]
    assert (b32["budget"], b32["verify_tokens_per_request"]) == (32, 33)
    tree = rates(b32, 4, "gsm8k")
    assert 5.3 < tree["accepted_tokens_per_step"] <= 8
    assert tree["tokens_per_s"] == pytest.approx(
        4 * tree["accepted_tokens_per_step"] / 0.015, rel=1e-3
    )


def test_prompt_sets_with_the_same_published_acceptance_share_one_prediction():
    speed = plan()
    groups = speed["launches"]["dflash"]["acceptance"]
    assert [(g["prompt_sets"], g["published_accept_length"]) for g in groups] == [
        (["gsm8k", "humaneval"], 5.3), (["mt-bench"], 3.7), (["math500"], 5.5), (["mbpp"], 4.5)
    ]  # fmt: skip
    assert "gsm8k" in groups[0]["sources"]["gsm8k"]
    assert "humaneval" in groups[0]["sources"]["humaneval"]
    [ar] = speed["launches"]["ar"]["acceptance"]
    assert ar["prompt_sets"] == SETS and ar["published_accept_length"] is None
    for level in speed["launches"]["dflash"]["levels"]:
        assert [g["prompt_sets"] for g in level["by_prompt_set"]] == [
            g["prompt_sets"] for g in groups
        ]
    # The step is the launch's, whatever the prompts.
    assert speed["concurrency"] == LEVELS and speed["prompt_sets"] == SETS


def test_each_launch_carries_its_parts_and_every_figure_its_source():
    figures = speed_plan.hardware_figures(HARDWARE, "h200")
    speed = plan(figures=figures)
    assert speed["profile"] == "h200" and speed["calibration"] is None
    assert speed["allreduce_measured"] is False
    assert speed["sources"]["allreduce"].startswith("nominal")
    assert set(speed["figures"]) == set(speed_inputs.HARDWARE_FIELDS)
    assert set(speed_inputs.HARDWARE_FIELDS) <= set(speed["sources"])
    assert set(speed["sources"]["acceptance"]) == {"dflash", "eagle3"}
    for name, entry in speed["launches"].items():
        assert [level["concurrency"] for level in entry["levels"]] == LEVELS, name
        for level in entry["levels"]:
            parts = level["parts"]
            assert level["step_ms"] == pytest.approx(sum(p["ms"] for p in parts.values()), abs=0.01)
            expected = {"dense_weights", "routed_experts", "kv_cache", "allreduce", "overhead"}
            assert expected <= set(parts)
            assert ("drafter" in parts) == (name != "ar")
            assert ("tree_build" in parts) == name.startswith("ddtree")
            # Server tokens/s is the running requests' accepted tokens over the step.
            for group in level["by_prompt_set"]:
                assert group["tokens_per_s"] == pytest.approx(
                    level["batch"] * group["accepted_tokens_per_step"] / level["step_ms"] * 1e3,
                    rel=1e-3,
                )
    # AR at c1 by hand: one token per step.
    ar = speed["launches"]["ar"]["levels"][0]
    assert ar["by_prompt_set"][0]["tokens_per_s"] == pytest.approx(1e3 / ar["step_ms"], rel=1e-3)
    # The same inputs give the same plan, to the byte (plan.json is compared across runs).
    assert json.dumps(speed, sort_keys=True) == json.dumps(plan(figures=figures), sort_keys=True)


def test_ddtree_gets_a_curve_and_best_budget_per_config_level_and_prompt_set():
    figures = speed_plan.hardware_figures(HARDWARE, "h200")
    speed = plan(figures=figures)
    [tree] = speed["ddtree"].values()
    assert list(speed["ddtree"]) == ["ddtree"]
    assert tree["budgets"] == [16, 32, 64, 128] and tree["block_size"] == 8
    assert tree["launches"] == ["ddtree-b16", "ddtree-b32", "ddtree-b64", "ddtree-b128"]
    assert len(tree["curves"]) == 4 * len(LEVELS)  # four acceptance groups x four levels
    for curve in tree["curves"]:
        assert [point["budget"] for point in curve["points"]] == [16, 32, 64, 128]
        # The curve's points are the DDTree launches' own predictions.
        for point in curve["points"]:
            launched = rates(
                speed["launches"][f"ddtree-b{point['budget']}"],
                curve["concurrency"],
                curve["prompt_sets"][0],
            )
            assert point["tokens_per_s"] == launched["tokens_per_s"]
            assert point["step_ms"] == launched["step_ms"]
        # The best budget is the model's argmax over every budget up to the largest.
        shape = speed_inputs.spec_from_argv(SHIPPED[-1]["argv"])
        best = max(
            range(1, 129),
            key=lambda b: (
                speed_model.predict(
                    inputs()["config"], inputs()["drafters"]["dflash"], figures,
                    speed_inputs.spec("DDTREE", draft_tokens=8, budget=b), curve["concurrency"],
                    456, 8, curve["published_accept_length"], max_running_requests=48,
                )["tokens_per_s"],
                -b,
            ),
        )  # fmt: skip
        assert curve["best_budget"] == best, curve
        # And the best of the budgets the study runs.
        run = max(curve["points"], key=lambda point: point["tokens_per_s"])
        assert curve["best_of_budgets"] == run["budget"]
        assert shape["block_size"] == 8
    # Launches over two TP sizes are two DDTree configs.
    tp = plan(
        launches=[
            launch("ddtree-tp4-b16", tp_size=4, budget=16),
            launch("ddtree-tp4-b64", tp_size=4, budget=64),
            launch("ddtree-b16", budget=16),
        ],
        figures=figures,
        concurrency=[1],
    )
    assert sorted(tp["ddtree"]) == ["ddtree", "ddtree-tp4"]
    assert tp["ddtree"]["ddtree-tp4"]["budgets"] == [16, 64]
    assert tp["ddtree"]["ddtree-tp4"]["tp_size"] == 4


def test_the_capacity_plan_s_running_cap_holds_where_it_has_one():
    speed = plan(launches=[launch("ar", max_running_requests=16), launch("dflash")])
    ar = rates(speed["launches"]["ar"], 64, "gsm8k")
    assert ar["batch"] == 16 and ar["tokens_per_s"] == pytest.approx(1600, rel=1e-3)
    assert ar["tokens_per_s_per_request"] == pytest.approx(25, rel=1e-3)
    assert speed["launches"]["ar"]["max_running_requests_source"].startswith("the capacity plan")


def test_a_launch_the_model_cannot_predict_is_null_with_its_reason():
    no_acceptance = inputs()
    no_acceptance["acceptance"] = {}
    figures = speed_plan.hardware_figures(HARDWARE, "ct200")
    ngram = {"name": "ngram", "argv": ["--speculative-algorithm", "NGRAM"], "tp_size": 8}
    speed = speed_plan.plan_speed(
        [*SHIPPED, ngram],
        no_acceptance,
        figures,
        concurrency=[1, 64],
        prompt_sets=SETS,
        context_tokens=456,
    )
    launches = speed["launches"]
    assert launches["ngram"]["levels"] == [] and "NGRAM" in launches["ngram"]["reason"]
    assert launches["ngram"]["reason"].startswith("no prediction: speculative algorithm")
    dflash = launches["dflash"]
    assert dflash["reason"] == (
        "tokens/s unknown for gsm8k, mt-bench, humaneval, math500, mbpp: no published "
        "acceptance for the dflash drafter"
    )
    level = dflash["levels"][0]
    assert level["step_ms"] > 0  # the step is still predicted
    assert level["by_prompt_set"][0]["tokens_per_s"] is None
    assert level["by_prompt_set"][0]["accepted_tokens_per_step"] is None
    assert launches["ar"]["reason"] is None
    assert launches["ar"]["levels"][0]["by_prompt_set"][0]["tokens_per_s"] > 0
    for curve in speed["ddtree"]["ddtree"]["curves"]:
        assert curve["best_budget"] is None and curve["best_of_budgets"] is None
        assert all(point["tokens_per_s"] is None for point in curve["points"])
    assert speed["sources"]["acceptance"] == "none published for this model"
    # A drafter whose config the model folder lacks: that launch only.
    drafterless = inputs()
    del drafterless["drafters"]["eagle3"]
    speed = speed_plan.plan_speed(
        SHIPPED, drafterless, figures, concurrency=[1], prompt_sets=SETS, context_tokens=456
    )
    assert "needs the eagle3 drafter's config" in speed["launches"]["eagle3"]["reason"]
    assert speed["launches"]["dflash"]["reason"] is None


def calibration_record(**change) -> dict:
    rows = [
        {"tokens": t, "experts_touched": speed_model.experts_touched(t, 384, 8), "ms": ms}
        for t, ms in {1: 0.08, 8: 0.31, 17: 0.54, 33: 0.80, 65: 1.16, 129: 1.44, 257: 1.58}.items()
    ]
    record = {
        "schema": 1,
        "kind": "kimi-speed-calibration",
        "measured_at": "2026-12-02T00:00:00Z",
        "gpu": {"name": "NVIDIA H200"},
        "copy_gbs": 3000.0,
        "moe": {"hidden": 7168, "intermediate": 256, "experts": 384, "top_k": 8,
                "weight_bytes": 2, "rows": rows},
    }  # fmt: skip
    record.update(change)
    return record


def test_the_host_s_calibration_and_all_reduce_records_replace_the_nominal_figures():
    nominal = speed_plan.hardware_figures(HARDWARE, "h200")
    calibrated = speed_plan.hardware_figures(
        HARDWARE, "h200", calibration_record(), "this host's calibration record /x/cal.json"
    )
    assert calibrated["copy_gbs"] == 3000.0 and nominal["copy_gbs"] == 4300
    speed = plan(figures=calibrated)
    assert speed["calibration"] == "this host's calibration record /x/cal.json"
    assert speed["figures"]["copy_gbs"] == 3000.0
    assert speed["sources"]["copy_gbs"].startswith("this host's calibration (NVIDIA H200")
    assert speed["sources"]["hbm_gbs"] == nominal["sources"]["hbm_gbs"]
    # A slower copy makes the weight-bound AR step dearer.
    before = plan(figures=nominal)["launches"]["ar"]["levels"][0]["step_ms"]
    assert speed["launches"]["ar"]["levels"][0]["step_ms"] > before
    # A measured all-reduce of 100 us at every size: 122 of them a step (61 layers x 2).
    table = {"results": [{"bytes": 1, "time_us": 100.0}, {"bytes": 1 << 30, "time_us": 100.0}]}
    measured = plan(figures=nominal, allreduce=table, allreduce_source="this host's check")
    assert measured["allreduce_measured"] is True
    assert measured["sources"]["allreduce"] == "this host's check"
    allreduce = measured["launches"]["ar"]["levels"][0]["parts"]["allreduce"]
    assert allreduce["ms"] == pytest.approx(12.2)


@pytest.mark.parametrize(
    ("hardware", "profile", "found"),
    [
        (HARDWARE, "a100",
         "hardware profile 'a100' is not known; needed: one of b200, b300, ct200, h200"),
        ({}, "h200", "needed: a mapping of profiles"),
        ([], "h200", "needed: a mapping of profiles"),
        ({"h200": {**HARDWARE["h200"], "hbm_gbs": {"value": -1, "source": "x"}}}, "h200",
         "h200.hbm_gbs is -1"),
        ({"h200": {**HARDWARE["h200"], "copy_gbs": {"value": "fast", "source": "x"}}}, "h200",
         "needed: a number"),
        ({"h200": {k: v for k, v in HARDWARE["h200"].items() if k != "step_overhead_ms"}}, "h200",
         "has no step_overhead_ms figure"),
        ({"h200": {**HARDWARE["h200"], "bf16_tflops": {"value": 989}}}, "h200", "has no source"),
        ({"h200": {**HARDWARE["h200"], "interconnect": "infiniband"}}, "h200",
         "interconnect 'infiniband'"),
        ({"h200": "fast"}, "h200", "needed: a mapping"),
    ],
)  # fmt: skip
def test_bad_hardware_data_fails_saying_what_is_needed(hardware, profile, found):
    with pytest.raises(SpeedModelError, match=r"Fix|needed") as raised:
        speed_plan.hardware_figures(hardware, profile)
    assert found in str(raised.value)


def test_a_malformed_calibration_record_fails_naming_the_file():
    for record in (calibration_record(schema=9), calibration_record(copy_gbs=0), [1, 2]):
        with pytest.raises(SpeedModelError) as raised:
            speed_plan.hardware_figures(HARDWARE, "h200", record, "this host's record /x/c.json")
        message = str(raised.value)
        assert message.startswith("this host's record /x/c.json: ")
        assert "remove the file to plan with the nominal figures" in message


@pytest.mark.parametrize(
    ("change", "found"),
    [
        ({"concurrency": [0, 4]}, "a concurrency level is 0"),
        ({"concurrency": [1, 1]}, "repeat one"),
        ({"concurrency": []}, "1 to 64 levels"),
        ({"concurrency": [True]}, "a concurrency level is True"),
        ({"context_tokens": "lots"}, "kimi_speed_context_tokens"),
        ({"context_tokens": 0}, "kimi_speed_context_tokens"),
        ({"prompt_sets": "gsm8k"}, "kimi_prompt_sets"),
        ({"prompt_sets": [1]}, "kimi_prompt_sets"),
    ],
)
def test_bad_plan_inputs_are_refused(change, found):
    with pytest.raises(SpeedModelError, match=found):
        plan(launches=[launch("ar")], **change)


def test_digit_strings_from_the_command_line_are_whole_numbers():
    # -e kimi_speed_context_tokens=1024 arrives as a string.
    speed = plan(launches=[launch("ar")], context_tokens="1024", concurrency=["1", 4])
    assert speed["context_tokens"] == 1024 and speed["concurrency"] == [1, 4]


def test_bad_launches_are_refused():
    for launches, found in (
        ([], "1 to 256 launches"),
        ("ar", "1 to 256 launches"),
        (["ar"], "needed: serving_render's launch mapping"),
        ([{"name": "ar", "argv": "python"}], "an argv list"),
        ([{"name": "ar", "argv": [], "tp_size": 0}], "ar tp_size is 0"),
    ):
        with pytest.raises(SpeedModelError, match=found):
            plan(launches=launches)


def test_the_shipped_model_configs_and_acceptance_are_the_inputs():
    loaded = inputs()
    assert loaded["config"] == json.loads((K26 / "config.json").read_text())
    assert set(loaded["drafters"]) == {"dflash", "eagle3"}
    assert loaded["acceptance"]["dflash"]["accept_length"]["mt-bench"] == 3.7
    with pytest.raises(SpeedModelError, match=r"target's config\.json path"):
        speed_plan.plan_inputs({}, K26)
    with pytest.raises(SpeedModelError, match="could not be read"):
        speed_plan.plan_inputs({"target": str(K26 / "missing.json")}, K26)
    # What plan_speed is given is not changed by it.
    launches = copy.deepcopy(SHIPPED)
    plan(launches=launches, concurrency=[1])
    assert launches == SHIPPED


def test_a_record_that_is_not_there_is_none_and_one_that_is_is_read(tmp_path):
    assert speed_plan.read_record(tmp_path / "absent.json", "x") is None
    assert speed_plan.read_record("", "x") is None
    (tmp_path / "cal.json").write_text(json.dumps(calibration_record()))
    assert speed_plan.read_record(tmp_path / "cal.json", "x")["copy_gbs"] == 3000.0
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(SpeedModelError, match="is not JSON"):
        speed_plan.read_record(tmp_path / "bad.json", "the host's calibration record")
