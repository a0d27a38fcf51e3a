"""capacity_plan against published figures for Kimi K2.x INT4 at TP8.

Kimi K2-Thinking, K2.5 and K2.6 share the text architecture (DeepSeek-V3 style, MLA, 384
INT4 group-32 routed experts), so their published memory figures check the K2.6 model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from ansible.module_utils.capacity import (
    GIB,
    CapacityError,
    checkpoint_bytes,
    draft_parameters,
    plan,
    target_parameters,
)

from tests.support.modules import run_module

REPO = Path(__file__).resolve().parents[2]
K26 = REPO / "models" / "kimi-k2.6" / "config.json"
DFLASH = REPO / "models" / "kimi-k2.6" / "dflash" / "config.json"
EAGLE3 = REPO / "models" / "kimi-k2.6" / "eagle3" / "config.json"
pytestmark = pytest.mark.preflight


def config(path: Path) -> dict:
    return json.loads(path.read_text())


def test_checkpoint_size_matches_the_published_repository_size():
    # moonshotai/Kimi-K2.6 on the Hugging Face Hub: 554.30 GiB in 64 safetensors shards.
    assert checkpoint_bytes(target_parameters(config(K26))) / GIB == pytest.approx(554.30, rel=1e-3)


def test_dflash_drafter_size_matches_the_published_size():
    # z-lab/Kimi-K2.6-DFlash: about 6.5 GiB of BF16 weights.
    assert checkpoint_bytes(draft_parameters(config(DFLASH))) / GIB == pytest.approx(6.5, rel=0.05)


def test_kv_bytes_per_token_matches_published_kv_pools():
    # vLLM recipes PR #115 (github.com/vllm-project/recipes/pull/115), Kimi-K2-Thinking on
    # 8x H200 at TP8, BF16 KV: "Available KV cache memory: 46.80 GiB" and
    # "GPU KV cache size: 715,072 tokens".
    result = plan(config(K26), gpu_memory_mib=143771, tp_size=8, mem_fraction_static=0.88)
    assert result["kv_bytes_per_token"] == 70272  # (512 + 64) x 61 layers x 2 bytes
    assert pytest.approx(result["kv_bytes_per_token"], rel=1e-3) == 46.80 * GIB / 715_072
    # ktransformers issue #2007 (github.com/kvcache-ai/ktransformers/issues/2007), SGLang with
    # Kimi K2.5/K2.6: "KV Cache is allocated. #tokens: 260000, KV size: 17.02 GB" (GiB units).
    assert pytest.approx(result["kv_bytes_per_token"], rel=1e-3) == 17.02 * GIB / 260_000


def test_weights_per_gpu_match_a_published_load():
    # MoonshotAI/Kimi-K2.5 issue #34 (github.com/MoonshotAI/Kimi-K2.5/issues/34), vLLM at
    # TP8 on B300: "Model loading took 72.14 GiB memory".
    result = plan(config(K26), gpu_memory_mib=275040, tp_size=8, mem_fraction_static=0.9)
    assert result["weights_gib_per_gpu"] == pytest.approx(72.14, rel=0.02)


def test_kv_pool_on_rtx_pro_6000_matches_a_published_sglang_run():
    # voipmonitor/rtx6kpro, models/kimi-k25.md (github.com/voipmonitor/rtx6kpro): SGLang,
    # Kimi K2.5, `--tp 8 --mem-fraction-static 0.94`, BF16 KV, 8x RTX PRO 6000 Blackwell
    # Server Edition (97887 MiB each): "232K total ctx".
    result = plan(config(K26), gpu_memory_mib=97887, tp_size=8, mem_fraction_static=0.94)
    assert result["kv_tokens"] == pytest.approx(232_000, rel=0.05)


def test_ct200_profile_through_the_module():
    """The issue's figure: K2.6 on ct200 (8x RTX PRO 6000, TP8, 0.85, BF16 KV)."""
    result = run_module(
        "capacity_plan",
        {
            "model_config": str(K26),
            "gpu_memory_mib": 97887,
            "tp_size": 8,
            "mem_fraction_static": 0.85,
            "kv_cache_dtype": "auto",
        },
    )
    assert not result.get("failed"), result
    assert result["weights_gib_per_gpu"] == pytest.approx(71.82, abs=0.05)
    assert result["draft_weights_gib_per_gpu"] == 0
    assert 90_000 < result["kv_tokens"] < 120_000
    assert result["fits"] is True and result["reason"] is None


def test_drafter_takes_weights_and_kv_from_the_pool():
    alone = plan(config(K26), 97887, 8, 0.85)
    dflash = plan(config(K26), 97887, 8, 0.85, draft_model_config=config(DFLASH))
    eagle = plan(config(K26), 97887, 8, 0.85, draft_model_config=config(EAGLE3))
    assert dflash["draft_weights_gib_per_gpu"] == pytest.approx(6.38 / 8 + 0.43, abs=0.1)
    # 8 KV heads over 8 ranks: one per rank, 6 layers, K and V, BF16.
    assert dflash["draft_kv_bytes_per_token"] == 2 * 1 * 128 * 6 * 2
    assert eagle["draft_kv_bytes_per_token"] == 576 * 2
    assert dflash["kv_tokens"] < alone["kv_tokens"]
    assert eagle["kv_tokens"] < alone["kv_tokens"]


def test_fp8_kv_halves_the_bytes_per_token():
    bf16 = plan(config(K26), 97887, 8, 0.85)
    fp8 = plan(config(K26), 97887, 8, 0.85, kv_cache_dtype="fp8_e4m3")
    assert fp8["kv_bytes_per_token"] * 2 == bf16["kv_bytes_per_token"]
    assert fp8["kv_tokens"] == pytest.approx(2 * bf16["kv_tokens"], rel=1e-3)


def test_too_few_gpus_does_not_fit_and_says_why():
    result = plan(config(K26), 97887, 4, 0.85)
    assert result["fits"] is False
    assert "weights need" in result["reason"] and "tp_size" in result["reason"]


def test_small_kv_pool_does_not_fit():
    result = plan(config(K26), 97887, 8, 0.80, min_kv_tokens=200_000)
    assert result["fits"] is False
    assert "KV cache pool holds" in result["reason"]


def test_bad_inputs_fail_clearly(tmp_path):
    missing = run_module(
        "capacity_plan",
        {
            "model_config": str(tmp_path / "nope.json"),
            "gpu_memory_mib": 1,
            "tp_size": 1,
            "mem_fraction_static": 0.5,
        },
    )
    assert missing["failed"] and "does not exist" in missing["msg"]
    broken = tmp_path / "config.json"
    broken.write_text("{not json")
    bad_json = run_module(
        "capacity_plan",
        {
            "model_config": str(broken),
            "gpu_memory_mib": 1,
            "tp_size": 1,
            "mem_fraction_static": 0.5,
        },
    )
    assert bad_json["failed"] and "not a readable JSON" in bad_json["msg"]
    broken.write_text('{"hidden_size": 7168}')
    incomplete = run_module(
        "capacity_plan",
        {
            "model_config": str(broken),
            "gpu_memory_mib": 97887,
            "tp_size": 1,
            "mem_fraction_static": 0.5,
        },
    )
    assert incomplete["failed"] and "num_hidden_layers is missing" in incomplete["msg"]
    not_object = module_plan(tmp_path, target=[])
    assert not_object["failed"] and "a JSON object" in not_object["msg"]
    out_of_range = run_module(
        "capacity_plan",
        {
            "model_config": str(K26),
            "gpu_memory_mib": 97887,
            "tp_size": 8,
            "mem_fraction_static": 1.5,
        },
    )
    assert out_of_range["failed"] and "between 0 and 1" in out_of_range["msg"]


def module_plan(tmp_path, target: dict | list | None = None, draft: dict | None = None, **params):
    """capacity_plan through the module, with configs written to files (None: the real ones)."""
    args = {"gpu_memory_mib": 97887, "tp_size": 8, "mem_fraction_static": 0.85, **params}
    args["model_config"] = str(K26)
    if target is not None:
        args["model_config"] = str(tmp_path / "target.json")
        Path(args["model_config"]).write_text(json.dumps(target))
    if draft is not None:
        args["draft_model_config"] = str(tmp_path / "draft.json")
        Path(args["draft_model_config"]).write_text(json.dumps(draft))
    return run_module("capacity_plan", args)


@pytest.mark.parametrize("tp_size", [1_000_000, 0, -8, 3, 128, True])
def test_tp_size_out_of_range_fails(tmp_path, tp_size):
    result = module_plan(tmp_path, tp_size=tp_size)
    assert result.get("failed"), f"tp_size={tp_size} gave {result}"
    assert f"tp_size {tp_size}" in result["msg"]
    assert "Fix:" in result["msg"]


def test_tp_size_that_does_not_divide_the_heads_names_them(tmp_path):
    result = module_plan(tmp_path, tp_size=3)
    assert "num_attention_heads" in result["msg"] and "64" in result["msg"]
    assert str(K26) in result["msg"]


def test_tp_size_over_the_gpus_there_does_not_fit(tmp_path):
    result = module_plan(tmp_path, tp_size=8, gpu_count=2)
    assert not result.get("failed"), result.get("msg")
    assert result["fits"] is False
    assert "tp_size 8" in result["reason"] and "2 GPUs" in result["reason"]
    assert module_plan(tmp_path, tp_size=8, gpu_count=8)["fits"] is True


def test_drafter_kv_heads_must_split_over_tp(tmp_path):
    # 6 KV heads over 8 ranks: neither divides the other.
    draft = config(DFLASH) | {"num_attention_heads": 48, "num_key_value_heads": 6}
    result = module_plan(tmp_path, draft=draft)
    assert result.get("failed"), result
    assert "tp_size 8" in result["msg"] and "num_key_value_heads (6)" in result["msg"]
    assert "draft.json" in result["msg"]
    ungrouped = module_plan(tmp_path, draft=config(DFLASH) | {"num_key_value_heads": 3})
    assert ungrouped.get("failed"), ungrouped
    assert "num_key_value_heads is 3" in ungrouped["msg"]


# (field, value) mutations of K2.6's text config that must fail, and why they are wrong.
BAD_TARGET_FIELDS = [
    ("num_hidden_layers", -61),
    ("num_hidden_layers", 0),
    ("vocab_size", -163840),
    ("vocab_size", True),
    ("hidden_size", "7168"),
    ("hidden_size", 7168.5),
    ("kv_lora_rank", None),
    ("n_routed_experts", -384),
    ("moe_intermediate_size", -2048),
    ("first_k_dense_replace", -1),
    ("num_attention_heads", 10**12),
    ("intermediate_size", [18432]),
    ("q_lora_rank", False),
    ("tie_word_embeddings", "no"),
]


@pytest.mark.parametrize(("field", "value"), BAD_TARGET_FIELDS)
def test_bad_target_config_field_fails_naming_file_field_and_value(tmp_path, field, value):
    target = config(K26)
    target["text_config"][field] = value
    result = module_plan(tmp_path, target=target)
    assert result.get("failed"), f"{field}={value!r} gave {result}"
    message = result["msg"]
    assert str(tmp_path / "target.json") in message
    assert field in message and repr(value) in message
    assert "needed" in message and "Fix:" in message


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("vision_config.num_hidden_layers", -27),
        ("vision_config.merge_kernel_size", [2, -2]),
        ("quantization_config.config_groups.group_0.weights.num_bits", -4),
        ("quantization_config.config_groups.group_0.weights.group_size", "32"),
        ("quantization_config.ignore", "lm_head"),
        ("text_config", []),
    ],
)
def test_bad_nested_config_fails_naming_the_field(tmp_path, where, value):
    target = config(K26)
    *parents, last = where.split(".")
    node = target if where.startswith(("vision", "text")) else target["text_config"]
    for key in parents:
        node = node[key]
    node[last] = value
    result = module_plan(tmp_path, target=target)
    assert result.get("failed"), f"{where}={value!r} gave {result}"
    assert last in result["msg"] and "target.json" in result["msg"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_hidden_layers", -6), ("vocab_size", 0), ("head_dim", -128), ("num_target_layers", -5)],
)
def test_bad_drafter_field_fails(tmp_path, field, value):
    result = module_plan(tmp_path, draft=config(DFLASH) | {field: value})
    assert result.get("failed"), f"{field}={value!r} gave {result}"
    assert field in result["msg"] and "draft.json" in result["msg"]


@pytest.mark.parametrize(
    "params",
    [
        {"mem_fraction_static": float("nan")},
        {"mem_fraction_static": 0.0},
        {"mem_fraction_static": 1.0},
        {"gpu_memory_mib": -97887},
        {"gpu_memory_mib": 0},
        {"overhead_mib": -1},
        {"overhead_mib": 97887},
        {"min_kv_tokens": -1},
        {"gpu_count": 0},
    ],
)
def test_bad_numbers_fail(tmp_path, params):
    result = module_plan(tmp_path, **params)
    assert result.get("failed"), f"{params} gave {result}"
    assert next(iter(params)) in result["msg"]


def test_no_negative_or_nan_result_over_random_configs():
    """Whatever the config holds, plan() either refuses it or returns finite, non-negative
    numbers (random mutations of the real config, a fixed seed)."""
    import random

    rng = random.Random(16)
    base = config(K26)
    fields = [k for k, v in base["text_config"].items() if isinstance(v, int | bool)]
    values = [-(10**9), -1, 0, 1, 2, 7, 10**3, 10**9, 10**15, True, 1.5, "8", None]
    refused = 0
    for _ in range(300):
        target = json.loads(json.dumps(base))
        for field in rng.sample(fields, 2):
            target["text_config"][field] = rng.choice(values)
        try:
            result = plan(
                target,
                gpu_memory_mib=rng.choice([1024, 97887, 10**7]),
                tp_size=rng.choice([1, 2, 8, 64]),
                mem_fraction_static=0.85,
            )
        except CapacityError:
            refused += 1
            continue
        for key, value in result.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                assert math.isfinite(value) and value >= 0, (key, value, target["text_config"])
    assert refused > 0
