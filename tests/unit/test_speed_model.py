"""The speed model: every part against hand-computed figures, the experts-touched formula
against a Monte Carlo of uniform top-k routing, the issue's H200 MoE measurement, DDTree's
best-first tree, bad inputs, and a fuzz of the command line."""

from __future__ import annotations

import io
import json
import math
import random
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.plan import speed_cli, speed_inputs, speed_model
from ansible.module_utils.plan.speed_inputs import SpeedModelError

REPO = Path(__file__).resolve().parents[2]
K26 = REPO / "models" / "kimi-k2.6"
QWEN = REPO / "models" / "qwen3.6-27b"
SCRIPT = REPO / "module_utils" / "plan" / "speed_model.py"
pytestmark = pytest.mark.preflight

# One TP8 rank's slice of one K2.6 MoE layer on one H200 (bf16 weights, grouped GEMM, L2
# flushed between steps): tokens -> ms, as the issue and DESIGN.md give it.
H200_MOE_SLICE = {1: 0.08, 8: 0.31, 17: 0.54, 33: 0.80, 65: 1.16, 129: 1.44, 257: 1.58}
SLICE = {"experts": 384, "top_k": 8, "hidden": 7168, "intermediate": 256, "weight_bytes": 2}


def h200() -> dict:
    return speed_inputs.profile_figures("h200")


def test_experts_touched_follows_a_monte_carlo_of_uniform_top_k_routing():
    rng = random.Random(0)
    experts, top_k = 384, 8
    for tokens in (1, 8, 33, 129, 513):
        trials = [
            len({e for _ in range(tokens) for e in rng.sample(range(experts), top_k)})
            for _ in range(200)
        ]
        simulated = sum(trials) / len(trials)
        assert speed_model.experts_touched(tokens, experts, top_k) == pytest.approx(
            simulated, rel=0.02
        )
    assert speed_model.experts_touched(1, experts, top_k) == pytest.approx(8)
    assert speed_model.experts_touched(100_000, experts, top_k) == pytest.approx(384)


def test_one_moe_layer_by_hand():
    # 8 experts x (3 x 7168 x 256) weights x 2 bytes over 4.3 TB/s, nothing else.
    layer = speed_model.moe_layer(1, 384, 8, 7168, 256, 2, 4300)
    assert layer["bytes_read"] == 8 * 3 * 7168 * 256 * 2 == 88_080_384
    assert layer["step_ms"] == pytest.approx(88_080_384 / 4.3e12 * 1e3, abs=1e-4)
    assert layer["bound"] == "memory"
    # The fixed cost per layer and the grouped GEMM's share of the bandwidth add as stated.
    slower = speed_model.moe_layer(1, 384, 8, 7168, 256, 2, 4300, 0.5, 50)
    assert slower["step_ms"] == pytest.approx(2 * 88_080_384 / 4.3e12 * 1e3 + 0.05, abs=1e-4)
    # Compute bounds it where the FLOPs take longer than the bytes (a tiny peak here).
    bound = speed_model.moe_layer(257, 384, 8, 7168, 256, 2, 4300, tflops=1)
    assert bound["bound"] == "compute"
    assert bound["compute_ms"] == pytest.approx(2 * 257 * 8 * 3 * 7168 * 256 / 1e12 * 1e3, rel=1e-3)


def test_the_h200_figures_are_the_fit_of_the_measured_moe_slice():
    rows = [
        {"experts_touched": speed_model.experts_touched(t, 384, 8), "ms": ms}
        for t, ms in H200_MOE_SLICE.items()
    ]
    overhead_us, share = speed_inputs.fit_moe_rows(rows, 4300, 7168, 256, 2)
    figures = h200()
    assert figures["moe_layer_overhead_us"] == pytest.approx(overhead_us, abs=0.5)
    assert figures["gemm_bandwidth_efficiency"] == pytest.approx(share, abs=0.001)
    # And the model gives back the measurement: within 5% from 8 tokens on, 25% at one token
    # (the fixed cost is a straight-line fit; docs/speed-model.md gives every ratio).
    for tokens, measured in H200_MOE_SLICE.items():
        predicted = speed_model.moe_layer(
            tokens,
            384,
            8,
            7168,
            256,
            2,
            figures["copy_gbs"],
            figures["gemm_bandwidth_efficiency"],
            figures["moe_layer_overhead_us"],
        )["step_ms"]
        assert predicted / measured == pytest.approx(1, abs=0.25 if tokens == 1 else 0.05)


def test_the_moe_cli_prints_experts_touched_and_step_ms_run_bare():
    # Bare: the script's folder on sys.path, no Ansible import path, standard library only.
    done = subprocess.run(
        [sys.executable, "-E", "-s", str(SCRIPT), "moe", "--tokens", "65", "--experts", "384",
         "--top-k", "8", "--hidden", "7168", "--intermediate", "256", "--weight-bytes", "2",
         "--hbm-gbs", "4300"],
        capture_output=True, text=True, timeout=60, cwd="/", check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["experts_touched"] == pytest.approx(384 * (1 - (1 - 8 / 384) ** 65), abs=1e-3)
    assert printed["step_ms"] == pytest.approx(
        printed["experts_touched"] * 3 * 7168 * 256 * 2 / 4.3e12 * 1e3, abs=1e-3
    )


def test_the_stand_in_sglang_ships_a_speed_model_that_runs_outside_the_repository(tmp_path):
    # The simulator's step model imports the kit's speed model from the copy the stand-in
    # package ships (kit/), through the kit's own module_utils, with no repository in sight.
    from tests.support.fake_sglang import write_package

    folder = write_package(tmp_path / "package")
    probe = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from sglang import simulator; "
        "sys.path.insert(0, str(simulator.kit_root())); import module_utils; "
        "from ansible.module_utils.plan import speed_inputs, speed_model; "
        "hardware = speed_inputs.load_hardware(sys.argv[1] + '/sglang/speed_hardware.json'); "
        "inputs = speed_inputs.model_inputs(sys.argv[2]); "
        "step = speed_model.predict_launch(inputs, speed_inputs.profile_figures('h200', hardware),"
        " [], 1, 2048, 8)['step_ms']; "
        "print(json.dumps([speed_model.__file__, step]))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", probe, str(folder), str(K26)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    shipped, step_ms = json.loads(done.stdout)
    assert Path(shipped).is_relative_to(folder / "sglang" / "kit")
    expected = speed_model.predict_launch(speed_inputs.model_inputs(K26), h200(), [], 1, 2048, 8)
    assert step_ms == expected["step_ms"]


def test_chain_rate_inverts_the_chain_length():
    for length in (1.5, 3.2, 5.3, 7.9):
        rate = speed_inputs.chain_rate(length, 7)
        assert sum(rate**d for d in range(8)) == pytest.approx(length, abs=1e-6)
    assert speed_inputs.chain_rate(50, 7) == pytest.approx(1.0, abs=1e-6)  # capped at a full chain


def brute_force_tree(rate: float, budget: int, depth: int, width: int) -> float:
    """Every node of the full tree with its path probability; the budget's best ones."""
    nodes = []

    def walk(level: int, probability: float) -> None:
        for rank in range(1, width + 1):
            child = probability * rate * (1 - rate) ** (rank - 1)
            nodes.append(child)
            if level < depth:
                walk(level + 1, child)

    walk(1, 1.0)
    return 1 + sum(sorted(nodes, reverse=True)[:budget])


def test_the_best_first_tree_is_the_budget_s_most_likely_nodes():
    rate = speed_inputs.chain_rate(5.3, 7)
    for budget in (1, 3, 7, 12, 30):
        assert speed_inputs.tree_acceptance(rate, budget, 4, 3) == pytest.approx(
            brute_force_tree(rate, budget, 4, 3), abs=1e-9
        )
    # A budget of block size - 1 is the chain: the published chain length comes back.
    assert speed_inputs.tree_acceptance(rate, 7, 7) == pytest.approx(5.3, abs=1e-6)
    previous = 0.0
    for budget in (1, 7, 16, 32, 64, 128, 512):
        accepted = speed_inputs.tree_acceptance(rate, budget, 7)
        assert previous <= accepted <= 8.0
        previous = accepted


def test_every_shipped_config_s_step_shape_follows_its_flags():
    definitions = yaml.safe_load((K26 / "model.yml").read_text())["serving_config_definitions"]
    shapes = {
        name: speed_inputs.spec_from_argv(entry["args"])
        for name, entry in definitions.items()
        if "budget_flag" not in entry
    }
    assert shapes["ar"] == {"algorithm": "AR", "verify_tokens": 1, "max_accept": 1, "overlap": True}
    assert shapes["eagle3"]["verify_tokens"] == 4 and shapes["eagle3"]["max_accept"] == 4
    assert shapes["dflash"]["verify_tokens"] == 8 and shapes["dflash"]["overlap"]
    assert not shapes["dflash-tree-backend"]["overlap"]
    ddtree = speed_inputs.spec_from_argv(
        [*definitions["ddtree"]["args"], "--speculative-ddtree-budget", "32"]
    )
    assert (ddtree["verify_tokens"], ddtree["max_accept"], ddtree["overlap"]) == (33, 8, False)


def test_allreduce_by_hand_and_from_a_measured_table():
    figures = h200()
    # 2 (n - 1) / n of the message over the bus bandwidth, plus the latency.
    expected = figures["allreduce_latency_us"] + 14336 * 2 * 7 / 8 / 475e9 * 1e6
    assert speed_inputs.allreduce_us(figures, 14336, 8) == pytest.approx(expected)
    assert speed_inputs.allreduce_us(figures, 14336, 1) == 0
    measured = speed_inputs.apply_allreduce(
        figures,
        {"results": [{"bytes": 65536, "time_us": 40.0}, {"bytes": 32768, "time_us": 30.0}]},
        "test",
    )
    assert speed_inputs.allreduce_us(measured, 1000, 8) == 30.0  # below the table: latency
    assert speed_inputs.allreduce_us(measured, 49152, 8) == pytest.approx(35.0)
    assert speed_inputs.allreduce_us(measured, 131072, 8) == pytest.approx(80.0)
    assert measured["sources"]["allreduce"] == "test"


def test_an_ar_step_of_k2_6_on_h200_by_hand():
    inputs = speed_inputs.model_inputs(K26)
    figures = h200()
    result = speed_model.predict_launch(inputs, figures, [], 1, 2048, 8)
    parts = result["parts"]
    # Per TP8 rank: MLA attention (q_a, kv_a and their norms replicated; q_b, kv_b, o_proj split)
    # over 61 layers, the norms, one dense MLP layer, 60 shared experts, 60 routers, the LM head.
    attention = 61 * (7168 * 576 + 512 + 7168 * 1536 + 1536)
    attention += 61 * (512 * 64 * 256 + 64 * 128 * 7168 + 1536 * 64 * 192) // 8
    params = (
        attention
        + 123 * 7168
        + 3 * 7168 * 18432 // 8
        + 60 * 3 * 7168 * 2048 // 8
        + 60 * 384 * 7169
        + 163840 * 7168 // 8
    )
    bandwidth = figures["copy_gbs"] * figures["dense_bandwidth_efficiency"] * 1e9
    assert parts["dense_weights"]["bytes_read"] == 2 * params
    assert parts["dense_weights"]["ms"] == pytest.approx(2 * params / bandwidth * 1e3, abs=1e-3)
    # 60 MoE layers, 8 INT4 experts of one rank's slice each (0.5 byte + a BF16 scale per 32).
    expert_bytes = 8 * 3 * 7168 * 256 * (0.5 + 2 / 32)
    expert_ms = expert_bytes / (figures["copy_gbs"] * figures["gemm_bandwidth_efficiency"] * 1e6)
    expected = 60 * (expert_ms + figures["moe_layer_overhead_us"] / 1e3)
    assert parts["routed_experts"]["ms"] == pytest.approx(expected, rel=1e-3)
    # MLA's latent (512 + 64) x 61 layers x 2 bytes a token, unsplit, for 2048 tokens.
    assert parts["kv_cache"]["bytes_read"] == 2048 * 576 * 61 * 2
    assert parts["allreduce"]["count"] == 122 and parts["allreduce"]["message_bytes"] == 14336
    assert parts["overhead"]["ms"] == figures["step_overhead_ms"]
    assert result["step_ms"] == pytest.approx(sum(p["ms"] for p in parts.values()), abs=1e-3)
    assert result["accepted_tokens_per_step"] == 1.0
    assert result["tokens_per_s"] == pytest.approx(1e3 / result["step_ms"], rel=1e-3)


def test_a_wider_ddtree_tree_reads_more_experts_and_can_lose_throughput():
    inputs = speed_inputs.model_inputs(K26)
    figures = h200()
    shape = speed_inputs.spec("DDTREE", draft_tokens=8, budget=16)
    chain, _ = speed_inputs.published_acceptance(inputs["acceptance"], "dflash", "gsm8k")
    curve = speed_model.ddtree_curve(
        inputs["config"], inputs["drafters"]["dflash"], figures, shape, [16, 32, 64, 128], 1,
        2048, 8, chain,
    )  # fmt: skip
    points = curve["points"]
    touched = [p["experts_touched_per_layer"] for p in points]
    accepted = [p["accepted_tokens_per_step"] for p in points]
    assert touched == sorted(touched) and touched[-1] > 2 * touched[0]
    assert accepted == sorted(accepted) and accepted[-1] <= 8
    # Step time grows faster than acceptance: the largest budget is not the fastest.
    assert points[-1]["tokens_per_s"] < points[0]["tokens_per_s"]
    assert 1 <= curve["best_budget"] < 128


def test_eagle3_and_dflash_accept_the_published_length_capped_by_the_step():
    inputs = speed_inputs.model_inputs(K26)
    figures = h200()
    eagle = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
             "--speculative-num-draft-tokens", "4"]  # fmt: skip
    assert speed_model.predict_launch(inputs, figures, eagle, 4, 2048, 8, "gsm8k")[
        "accepted_tokens_per_step"
    ] == pytest.approx(3.2)
    dflash = ["--speculative-algorithm", "DFLASH", "--speculative-dflash-block-size", "8"]
    mbpp = speed_model.predict_launch(inputs, figures, dflash, 4, 2048, 8, "mbpp")
    assert mbpp["accepted_tokens_per_step"] == pytest.approx(4.5)
    assert "mbpp" in mbpp["acceptance_source"]
    # A set without a published figure gets the mean, said so; a given length wins.
    other = speed_model.predict_launch(inputs, figures, dflash, 4, 2048, 8, "long-32k")
    assert other["accepted_tokens_per_step"] == pytest.approx((5.3 + 5.5 + 5.3 + 4.5 + 3.7) / 5)
    assert "mean" in other["acceptance_source"]
    capped = speed_model.predict_launch(inputs, figures, dflash, 4, 2048, 8, accept_length=20)
    assert capped["accepted_tokens_per_step"] == 8
    # The drafter forward: one block over the batch, through the target's LM head.
    assert mbpp["parts"]["drafter"]["forwards"] == 1


def test_requests_past_the_running_cap_wait():
    inputs = speed_inputs.model_inputs(K26)
    capped = speed_model.predict_launch(inputs, h200(), [], 64, 2048, 8, max_running_requests=48)
    full = speed_model.predict_launch(inputs, h200(), [], 48, 2048, 8)
    assert capped["batch"] == 48
    assert capped["tokens_per_s"] == pytest.approx(full["tokens_per_s"])
    assert capped["tokens_per_s_per_request"] == pytest.approx(full["tokens_per_s"] / 64, abs=0.01)


def test_the_hybrid_target_reads_its_recurrent_state_and_has_no_experts():
    inputs = speed_inputs.model_inputs(QWEN)
    figures = speed_inputs.profile_figures("ct200")
    one = speed_model.predict_launch(inputs, figures, [], 1, 2048, 1)
    assert "routed_experts" not in one["parts"] and one["parts"]["allreduce"]["ms"] == 0
    tree = ["--speculative-algorithm", "DDTREE", "--speculative-dflash-block-size", "16",
            "--speculative-ddtree-budget", "64"]  # fmt: skip
    wide = speed_model.predict_launch(inputs, figures, tree, 1, 2048, 1)
    # Every verified token writes its own recurrent state: a wider tree moves more bytes.
    assert wide["parts"]["kv_cache"]["bytes_read"] > 10 * one["parts"]["kv_cache"]["bytes_read"]
    assert wide["accepted_tokens_per_step"] <= 16


def test_every_profile_an_inventory_names_has_every_figure_with_a_source():
    hardware = speed_inputs.load_hardware()
    for inventory in sorted((REPO / "inventory").iterdir()):
        profile = yaml.safe_load((inventory / "group_vars" / f"{inventory.name}.yml").read_text())[
            "kimi_profile"
        ]
        figures = hardware[profile]
        for field in speed_inputs.HARDWARE_FIELDS:
            assert figures[field] > 0 and figures["sources"][field].strip()


@pytest.mark.parametrize(
    ("change", "found"),
    [
        ({"hbm_gbs": {"value": 0, "source": "x"}}, "above 0"),
        ({"copy_gbs": {"value": -1, "source": "x"}}, "above 0"),
        ({"copy_gbs": {"value": float("nan"), "source": "x"}}, "real figure"),
        ({"copy_gbs": {"value": 1e12, "source": "x"}}, "at most"),
        ({"copy_gbs": {"value": "fast", "source": "x"}}, "needed: a number"),
        ({"copy_gbs": {"value": True, "source": "x"}}, "needed: a number"),
        ({"copy_gbs": {"value": 10, "source": ""}}, "no source"),
        ({"copy_gbs": 10}, "no copy_gbs figure"),
        ({"gemm_bandwidth_efficiency": {"value": 1.5, "source": "x"}}, "at most 1"),
        ({"interconnect": "carrier pigeon"}, "nvlink or pcie"),
    ],
)
def test_bad_hardware_figures_are_refused_with_what_is_needed(change, found):
    raw = json.loads(speed_inputs.HARDWARE_FILE.read_text())[speed_inputs.HARDWARE_KEY]["h200"]
    with pytest.raises(SpeedModelError, match=found) as error:
        speed_inputs.check_profile("h200", {**raw, **change})
    assert "needed" in str(error.value) or "Fix" in str(error.value)


def test_bad_inputs_are_refused_with_what_is_needed():
    with pytest.raises(SpeedModelError, match="not known; needed: one of b200, b300, ct200, h200"):
        speed_inputs.profile_figures("a100")
    for bad in (0, -1, 1.5, True, "8", None, 1 << 30):
        with pytest.raises(SpeedModelError, match="needed"):
            speed_model.experts_touched(bad, 384, 8)
    with pytest.raises(SpeedModelError, match="top_k <= experts"):
        speed_model.experts_touched(1, 8, 9)
    with pytest.raises(SpeedModelError, match="not modelled"):
        speed_inputs.spec_from_argv(["--speculative-algorithm", "MEDUSA"])
    with pytest.raises(SpeedModelError, match="budget"):
        speed_inputs.spec_from_argv(["--speculative-algorithm", "DDTREE"])
    with pytest.raises(SpeedModelError, match="an integer"):
        speed_inputs.spec_from_argv(["--speculative-algorithm", "DFLASH",
                                    "--speculative-dflash-block-size", "eight"])  # fmt: skip
    with pytest.raises(SpeedModelError, match="list of strings"):
        speed_inputs.spec_from_argv("--speculative-algorithm DFLASH")
    inputs = speed_inputs.model_inputs(QWEN)
    with pytest.raises(SpeedModelError, match="eagle3 drafter's config"):
        speed_model.predict_launch(inputs, h200(), ["--speculative-algorithm", "EAGLE3"], 1, 8, 1)
    with pytest.raises(SpeedModelError, match="concurrency"):
        speed_model.predict_launch(inputs, h200(), [], 0, 2048, 1)
    with pytest.raises(SpeedModelError, match="cannot be modelled"):
        speed_model.predict(
            {"hidden_size": 1}, None, h200(), speed_inputs.spec("AR"), 1, 8, 1, None
        )


def calibration(rows=None, **change) -> dict:
    record = {
        "schema": 1,
        "kind": "kimi-speed-calibration",
        "measured_at": "2026-12-02T00:00:00Z",
        "gpu": {"name": "NVIDIA H200"},
        "copy_gbs": 4000.0,
        "moe": {
            **SLICE,
            "rows": rows
            or [
                {"tokens": t, "experts_touched": speed_model.experts_touched(t, 384, 8), "ms": ms}
                for t, ms in H200_MOE_SLICE.items()
            ],
        },
    }
    record.update(change)
    return record


def test_a_calibration_record_replaces_the_measured_figures_and_names_itself():
    figures = speed_inputs.apply_calibration(h200(), calibration())
    assert figures["copy_gbs"] == 4000.0
    assert figures["gemm_bandwidth_efficiency"] == pytest.approx(0.659 * 4300 / 4000, abs=0.002)
    assert "calibration" in figures["sources"]["copy_gbs"]
    assert figures["hbm_gbs"] == 4800  # a nominal figure stays


@pytest.mark.parametrize(
    ("record", "found"),
    [
        ([], "not a kimi-speed-calibration record"),
        (calibration(kind="other"), "not a kimi-speed-calibration record"),
        (calibration(schema=2), "schema 2"),
        (calibration(copy_gbs="fast"), "copy_gbs"),
        (calibration(moe={"rows": "x"}), "no moe rows"),
        (calibration(rows=[{"experts_touched": 8, "ms": 0.1}] * 2), "distinct point"),
        (calibration(rows=[{"experts_touched": 8, "ms": 1.0}, {"experts_touched": 300, "ms": 0.1}]),
         "do not grow"),
        (calibration(rows=[{"experts_touched": 8, "ms": -1}, {"experts_touched": 9, "ms": 1}]),
         "ms is -1"),
    ],
)  # fmt: skip
def test_bad_calibration_records_are_refused(record, found):
    with pytest.raises(SpeedModelError, match=found):
        speed_inputs.apply_calibration(h200(), record)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = speed_cli.main(argv)
        except SystemExit as exit_:  # argparse's own refusal
            code = exit_.code
    return code, out.getvalue(), err.getvalue()


def test_the_predict_cli_gives_parts_sources_and_a_ddtree_curve():
    code, out, err = run_cli(
        ["predict", "--model", str(K26), "--profile", "ct200", "--algorithm", "ddtree",
         "--budget", "32", "--budgets", "16,32,64", "--concurrency", "4", "--prompt-set", "gsm8k"]
    )  # fmt: skip
    assert code == 0, err
    result = json.loads(out)
    assert set(result["parts"]) >= {"dense_weights", "routed_experts", "kv_cache", "allreduce",
                                     "drafter", "tree_build", "overhead"}  # fmt: skip
    assert [p["budget"] for p in result["ddtree"]["points"]] == [16, 32, 64]
    assert "PCIe" in result["sources"]["allreduce_busbw_gbs"]


FUZZ_VALUES = ["0", "-1", "1", "8", "1e309", "nan", "inf", "x", "", "99999999999", "7.5", "0x10"]
FUZZ_FLAGS = {
    "moe": ["--tokens", "--experts", "--top-k", "--hidden", "--intermediate", "--weight-bytes",
            "--hbm-gbs", "--efficiency", "--overhead-us"],
    "predict": ["--profile", "--algorithm", "--budget", "--budgets", "--concurrency", "--context",
                "--tp", "--accept-length", "--draft-tokens", "--steps", "--kv-cache-dtype",
                "--max-running-requests", "--calibration", "--prompt-set"],
}  # fmt: skip


def test_a_fuzz_of_the_cli_raises_no_traceback():
    rng = random.Random(31)
    for _ in range(400):
        command = rng.choice(sorted(FUZZ_FLAGS))
        argv = [command]
        if command == "predict":
            argv += ["--model", str(rng.choice([K26, QWEN, REPO]))]
        for flag in rng.sample(FUZZ_FLAGS[command], rng.randint(0, len(FUZZ_FLAGS[command]))):
            argv += [flag, rng.choice([*FUZZ_VALUES, "h200", "ddtree", "eagle3", "/etc/passwd"])]
        code, out, err = run_cli(argv)
        assert code in (0, 2), (argv, err)
        assert "Traceback" not in err
        if code == 0:
            result = json.loads(out)
            assert all(
                math.isfinite(v) for v in (result.get("step_ms"), result.get("tokens_per_s"))
                if isinstance(v, float)
            )  # fmt: skip
