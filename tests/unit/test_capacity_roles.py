"""Capacity by role under prefill-decode disaggregation (module_utils/plan/capacity_roles.py):
the same K2.6 launch planned as a whole server, a prefill server and a decode server, through
the capacity_plan module as plan.yml runs it, with launch commands the serving render makes."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from ansible.module_utils.plan.capacity_common import CapacityError
from ansible.module_utils.plan.capacity_roles import (
    RESERVED_DECODE_TOKENS,
    role_capacity,
    role_options,
)

from tests.support.modules import run_module

REPO = Path(__file__).resolve().parents[2]
K26 = REPO / "models" / "kimi-k2.6" / "config.json"
DFLASH = REPO / "models" / "kimi-k2.6" / "dflash" / "config.json"
pytestmark = pytest.mark.preflight

BASE = ["--model-path", "/models/k26", "--tp-size", "8", "--trust-remote-code"]
PD = ["--disaggregation-transfer-backend", "mooncake"]
ARGV = {
    "whole": BASE,
    "prefill": [*BASE, "--disaggregation-mode", "prefill", *PD],
    "decode": [*BASE, "--disaggregation-mode", "decode", *PD],
}
PROMPT, NEW = 200, 512


def planned(launches: dict, gpu_memory_mib: int = 143771, **more) -> dict:
    """capacity_plan over the launches (name: argv) on 8 GPUs (H200 unless gpu_memory_mib says
    otherwise) at 0.88, as plan.yml calls it; more: a launch's extra flags, or module options."""
    result = run_module(
        "capacity_plan",
        {
            "model_config": str(K26),
            "gpu_memory_mib": gpu_memory_mib,
            "mem_fraction_static": 0.88,
            "prompt_tokens": PROMPT,
            "new_tokens": NEW,
            "launches": [
                {"name": name, "tp_size": 8, "launch_argv": [*argv, *more.pop(name, [])]}
                for name, argv in launches.items()
            ],
            **more,
        },
    )
    assert not result.get("failed"), result
    return {launch["name"]: launch for launch in result["launches"]}


def test_each_role_holds_what_sglang_keeps_of_a_request():
    plans = planned(ARGV)
    kv = {name: plan["kv_tokens"] for name, plan in plans.items()}
    # The role changes what a request holds, not the pool: one pool size for all three.
    assert len(set(kv.values())) == 1
    pool = kv["whole"]
    whole, prefill, decode = (plans[name]["role"] for name in ("whole", "prefill", "decode"))
    assert whole["role"] == "whole" and whole["cuda_graph"] is True
    assert whole["workload_tokens_per_request"] == PROMPT + NEW
    assert whole["requests_at_workload"] == pool // (PROMPT + NEW)
    # A prefill server keeps prompts until their hand-over, without CUDA graphs (SGLang's
    # server_args turns them off).
    assert prefill["role"] == "prefill" and prefill["cuda_graph"] is False
    assert prefill["workload_tokens_per_request"] == PROMPT
    assert prefill["requests_at_workload"] == pool // PROMPT
    assert prefill["reserved_decode_tokens"] is None
    # A decode server admits a request with SGLang's 512 reserved tokens beside its context.
    assert decode["role"] == "decode" and decode["cuda_graph"] is True
    assert decode["reserved_decode_tokens"] == RESERVED_DECODE_TOKENS == 512
    assert decode["workload_tokens_per_request"] == PROMPT + NEW + 512
    assert decode["requests_at_workload"] == pool // (PROMPT + NEW + 512)
    assert prefill["requests_at_workload"] > whole["requests_at_workload"]
    assert whole["requests_at_workload"] > decode["requests_at_workload"]
    context = plans["decode"]["context_length"]
    assert decode["tokens_per_request_at_context"] == context + 512
    assert whole["tokens_per_request_at_context"] == context
    for role in (whole, prefill, decode):
        assert set(role) >= {"holds", "requests_at_context", "fits_one_request_at_context"}


def test_a_decode_servers_auto_context_leaves_its_reserve_free():
    # On 8x RTX PRO 6000 the pool (about 120,000 tokens) is shorter than K2.6's 262,144
    # positions: auto is the whole pool for a whole server, the pool less 512 for a decode one.
    plans = planned(ARGV, gpu_memory_mib=97887)
    pool = plans["whole"]["kv_tokens"]
    assert pool < 262_144 and plans["whole"]["context_length"] == pool
    decode = plans["decode"]
    assert decode["context_length"] == decode["max_context_length"] == pool - 512
    assert decode["context_length_source"] == "auto"
    assert decode["role"]["fits_one_request_at_context"] is True
    assert decode["role"]["requests_at_context"] == 1 and decode["role"]["warning"] is None
    assert plans["prefill"]["context_length"] == pool
    # On 8x H200 the model's positions are shorter than the pool: nothing to take off.
    roomy = planned(ARGV)
    assert roomy["decode"]["context_length"] == roomy["whole"]["context_length"] == 262_144


def test_a_decode_server_whose_reserve_leaves_no_room_for_its_context_is_warned():
    pool = planned({"whole": BASE}, gpu_memory_mib=97887)["whole"]["kv_tokens"]
    tight = ["--context-length", str(pool - 100)]
    plans = planned(ARGV, gpu_memory_mib=97887, whole=tight, decode=list(tight))
    decode = plans["decode"]["role"]
    assert decode["fits_one_request_at_context"] is False and decode["requests_at_context"] == 0
    assert "--num-reserved-decode-tokens" in decode["warning"]
    assert f"kimi_context_length {pool - 512} or less" in decode["warning"]
    assert plans["whole"]["role"]["warning"] is None
    assert plans["whole"]["role"]["fits_one_request_at_context"] is True
    # A smaller reserve of the launch's own makes room.
    short = planned(
        ARGV,
        gpu_memory_mib=97887,
        decode=[*tight, "--num-reserved-decode-tokens", "64"],
    )["decode"]["role"]
    assert short["warning"] is None and short["reserved_decode_tokens"] == 64
    assert short["tokens_per_request_at_context"] == pool - 100 + 64
    assert short["workload_tokens_per_request"] == PROMPT + NEW + 64


def test_running_request_caps_bound_every_role():
    cap = ["--max-running-requests", "16"]
    plans = planned(ARGV, whole=cap, prefill=cap, decode=list(cap))
    assert {plan["role"]["requests_at_workload"] for plan in plans.values()} == {16}
    # Under speculative decoding SGLang caps running requests at 48 unless told otherwise; its
    # request slots hold a prefill server's prompts until their hand-over too.
    dflash = ["--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "8"]
    drafted = planned({role: [*argv, *dflash] for role, argv in ARGV.items()})
    assert {plan["role"]["requests_at_workload"] for plan in drafted.values()} == {48}
    assert planned(ARGV)["prefill"]["role"]["requests_at_workload"] > 48


def test_without_a_workload_the_roles_keep_their_context_figures_only():
    result = run_module(
        "capacity_plan",
        {
            "model_config": str(K26),
            "draft_model_config": str(DFLASH),
            "gpu_memory_mib": 143771,
            "tp_size": 8,
            "mem_fraction_static": 0.88,
            "launch_argv": ARGV["prefill"],
        },
    )
    assert not result.get("failed"), result
    role = result["role"]
    assert role["role"] == "prefill" and role["requests_at_workload"] is None
    assert role["requests_at_context"] == result["kv_tokens"] // result["context_length"]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--disaggregation-mode", "both"], "--disaggregation-mode 'both'"),
        (
            ["--disaggregation-mode", "decode", "--num-reserved-decode-tokens", "-1"],
            "--num-reserved-decode-tokens '-1'",
        ),
        (
            ["--disaggregation-mode", "decode", "--num-reserved-decode-tokens", "9" * 20],
            "--num-reserved-decode-tokens",
        ),
    ],
)
def test_a_bad_role_flag_fails_naming_the_flag(argv, named):
    with pytest.raises(CapacityError, match=named.replace("'", ".")):
        role_options(argv)
    result = run_module(
        "capacity_plan",
        {
            "model_config": str(K26),
            "gpu_memory_mib": 143771,
            "mem_fraction_static": 0.88,
            "launches": [{"name": "bad", "tp_size": 8, "launch_argv": [*BASE, *argv]}],
        },
    )
    assert result["failed"] and "launch bad" in result["msg"] and "--" in result["msg"]


@pytest.mark.parametrize(
    ("workload", "named"),
    [((0, 10), "prompt_tokens"), ((10, -1), "new_tokens"), ((True, 1), "prompt_tokens")],
)
def test_a_bad_workload_is_refused_naming_it(workload, named):
    plan = {"kv_tokens": 1000, "context_length": 100, "max_running_requests": None}
    with pytest.raises(CapacityError, match=named):
        role_capacity(plan, "whole", None, workload=workload)


def test_random_role_flags_end_in_a_plan_or_a_named_refusal():
    rng = random.Random(36)
    values = ["prefill", "decode", "null", "", "0", "512", "-3", "1e9", "x" * 300, "\x00", "٣"]
    for _ in range(400):
        kv_tokens = rng.choice([0, 1, 511, 50_000])
        plan = {
            "kv_tokens": kv_tokens,
            "context_length": min(kv_tokens, 40_000),
            "max_running_requests": rng.choice([None, 0, 48]),
            "verify_tokens": rng.choice([1, 8]),
        }
        argv = [
            rng.choice(["--disaggregation-mode", "--num-reserved-decode-tokens", "--tp-size"])
            if index % 2 == 0
            else rng.choice(values)
            for index in range(rng.randrange(0, 8))
        ]
        try:
            options = role_options(argv)
        except CapacityError as exc:
            assert str(exc).startswith(("--disaggregation-mode", "--num-reserved-decode-tokens"))
            continue
        role = role_capacity(plan, **options, workload=(rng.randrange(1, 9000), 512))
        assert role["role"] in ("whole", "prefill", "decode")
        assert 0 <= role["requests_at_workload"] <= plan["kv_tokens"]
        assert role["fits_one_request_at_context"] is (
            0 < role["tokens_per_request_at_context"] <= plan["kv_tokens"]
        )
        assert 0 <= role["requests_at_context"] <= max(plan["kv_tokens"], 0)
