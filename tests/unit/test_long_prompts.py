"""The long-prompt set (TTFT at length): prompts sized from characters, distinct from their
first row, bounded by the model's context and the dataset, and each level's comparison of
the estimate with what the server counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.benchmark.long_prompts import (
    LongPromptError,
    build,
    context_of,
    level_summary,
    settings_of,
    target_of,
)

import analysis
from tests.support.hub_server import LocalHub
from tests.support.modules import run_module
from tests.support.results_tree import TEMPLATE, level_problems
from tests.support.sim_process import BASE, start, stop

REPO = Path(__file__).resolve().parents[2]
QUESTION = "How many problems mention money? Answer with one number."
NAMES = ["Ann", "Bob", "Cleo", "Dev", "Eli", "Fay", "Gus"]


def questions(count: int) -> list[str]:
    """Word problems of varied length, each different from the next."""
    return [
        f"{NAMES[i % 7]} has {i + 3} apples and buys {i * 7 % 11 + 1} more at the market"
        + " on a sunny morning" * (i % 4)
        + f". How many apples does {NAMES[i % 7]} have now, in problem {i}?"
        for i in range(count)
    ]


def spec(tokens=1000, **extra) -> dict:
    long = {"tokens": tokens, "question": QUESTION, **extra.pop("long", {})}
    return {"template": "{question}", "long": long, "max_new_tokens": 64, **extra}


def test_prompts_start_at_rows_of_their_own_and_reach_the_target():
    texts = questions(200)
    settings = settings_of("long", spec(1000, long={"chars_per_token": 4.0}), 8192)
    prompts, record = build("long", texts, 10, settings)
    assert record["first_rows"] == [i * 20 for i in range(10)]
    for prompt, first, used, estimate in zip(
        prompts, record["first_rows"], record["rows_used"], record["estimated_tokens"], strict=True
    ):
        # The first row decides the radix cache's reuse: each prompt opens with its own.
        assert prompt.startswith(texts[first] + "\n\n")
        assert prompt.endswith("\n\n" + QUESTION)
        # Whole rows until 4000 characters: at most one row over.
        assert 4000 <= len(prompt) < 4000 + max(map(len, texts)) + 2
        assert estimate == round(len(prompt) / 4.0)
        assert prompt.count("\n\n") == used  # rows_used rows, then the question
    assert len({p[:40] for p in prompts}) == 10
    # The last prompt wraps to the dataset's first rows and uses none twice.
    wide = settings_of("long", spec(1800), 8192)
    many, rec = build("long", texts[:60], 3, wide)
    assert rec["first_rows"] == [0, 20, 40]
    assert rec["rows_used"][2] <= 60 and texts[0] in many[2]


@pytest.mark.parametrize(
    ("definition", "context", "said"),
    [
        (spec(10000), 8192, "exceed the model's context of 8192 tokens; lower long.tokens to"),
        (spec(8129), 8192, "lower long.tokens to at most 8128"),
        (spec(1000), None, "the model's context is unknown"),
        (spec(True), 8192, "long.tokens must be a whole number"),
        (spec("32k"), 8192, "long.tokens must be a whole number"),
        (spec(1 << 21), 1 << 22, "long.tokens must be a whole number"),
        (spec(1000, long={"chars_per_token": 0.5}), 8192, "chars_per_token must be a number"),
        (spec(1000, long={"question": " "}), 8192, "long.question must be a text"),
        (spec(1000, max_new_tokens=None), 8192, "needs its own max_new_tokens"),
        ({"long": [1000]}, 8192, "long must be a mapping"),
    ],
)
def test_a_definition_beyond_the_context_or_malformed_fails_clearly(definition, context, said):
    with pytest.raises(LongPromptError, match="prompt set long-32k: ") as caught:
        settings_of("long-32k", definition, context)
    assert said in str(caught.value)


def test_a_set_needs_a_first_row_per_prompt_and_enough_text():
    texts = questions(30)
    settings = settings_of("long", spec(1000), 8192)
    with pytest.raises(LongPromptError, match="31 long prompts need 31 distinct first rows"):
        build("long", texts, 31, settings)
    whole = sum(len(t) + 2 for t in texts)
    big = settings_of("long", spec(whole // 4 + 100), 1 << 20)
    with pytest.raises(
        LongPromptError, match=f"than all 30 rows of the dataset hold \\({whole}\\)"
    ):
        build("long", texts, 2, big)


def test_context_comes_from_the_text_config_of_a_multimodal_model():
    kimi = json.loads((REPO / "models/kimi-k2.6/config.json").read_text())
    assert context_of(kimi) == 262144
    assert context_of({"text_config": {"max_position_embeddings": 4096}}) == 4096
    assert context_of({"max_position_embeddings": "4096"}) is None
    assert context_of(None) is None


def test_level_summary_compares_the_servers_count_with_the_estimate():
    length = {"target_tokens": 1000, "estimated_tokens": [1000, 1100]}
    records = [
        {"index": 0, "prompt_tokens": 800},
        {"index": 1, "prompt_tokens": 900},
        {"index": 2, "prompt_tokens": None},  # failed: counted nowhere, sent all the same
        {"index": 3, "prompt_tokens": True},
    ]
    summary = level_summary(length, records)
    assert summary == {
        "target_tokens": 1000,
        "estimated_mean": 1050.0,
        "counted": 2,
        "prompt_tokens_min": 800,
        "prompt_tokens_mean": 850.0,
        "prompt_tokens_max": 900,
        "measured_over_estimated": round(850 / 1050, 4),
        "on_target": True,
    }
    far = level_summary(length, [{"index": 0, "prompt_tokens": 700}])
    assert far["on_target"] is False and far["measured_over_estimated"] == 0.7
    none = level_summary(length, [{"index": 0, "prompt_tokens": None}])
    assert none["on_target"] is None and none["prompt_tokens_mean"] is None


@pytest.mark.parametrize(
    "meta",
    [
        None,
        {"length": None},
        {"length": {"target_tokens": "1000", "estimated_tokens": [1000]}},
        {"length": {"target_tokens": 1000, "estimated_tokens": []}},
        {"length": {"target_tokens": 1000, "estimated_tokens": [1000, -1]}},
        {"length": {"target_tokens": 1000, "estimated_tokens": "1000"}},
    ],
)
def test_a_meta_without_a_sound_length_is_not_a_long_set(meta):
    assert target_of(meta) is None


def test_the_kit_defines_long_32k_outside_the_default_sets():
    # group_vars/all/benchmark.yml, which the benchmark role's defaults take.
    shared = yaml.safe_load((REPO / "group_vars/all/benchmark.yml").read_text())
    defaults = {
        "benchmark_prompt_set_definitions": shared["kimi_prompt_set_definitions"],
        "benchmark_prompt_sets": shared["kimi_prompt_sets"],
    }
    definition = defaults["benchmark_prompt_set_definitions"]["long-32k"]
    assert "long-32k" not in defaults["benchmark_prompt_sets"]
    kimi = json.loads((REPO / "models/kimi-k2.6/config.json").read_text())
    settings = settings_of("long-32k", definition, context_of(kimi))
    assert settings["tokens"] == 32768 and definition["max_new_tokens"] <= 64
    # The dataset is one the benchmark already fetches, at the same commit.
    gsm8k = defaults["benchmark_prompt_set_definitions"]["gsm8k"]
    assert {k: definition[k] for k in ("repo", "revision", "file")} == {
        k: gsm8k[k] for k in ("repo", "revision", "file")
    }


def test_a_long_set_run_against_the_simulator_records_prompt_tokens_near_the_target(tmp_path):
    """benchmark_prompts renders the set, sglang_benchmark sends it: the level's records hold
    what the server counted (the simulator counts words), near the target when the
    characters per token fit that tokenizer, and summary.prompt_length says so."""
    texts = questions(120)
    rows = "".join(json.dumps({"question": q, "answer": "#### 1"}) + "\n" for q in texts)
    model = tmp_path / "model"
    model.mkdir()
    (model / "chat_template.jinja").write_text(TEMPLATE)
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    joined = "\n\n".join(texts)
    per_word = len(joined) / len(joined.split())  # the simulator's tokenizer
    target = 3000
    definition = spec(target, long={"chars_per_token": per_word})
    with LocalHub() as hub:
        hub.add_dataset("org/gsm", {"test.jsonl": rows.encode()})
        definition.update(repo="org/gsm", revision="main", file="test.jsonl")
        args = {
            "sets": {"long-3k": definition},
            "output_dir": str(tmp_path / "prompts"),
            "cache_dir": str(tmp_path / "cache"),
            "model_dir": str(model),
            "limit": 6,
            "hf_endpoint": hub.url,
        }
        made = run_module("benchmark_prompts", args)
        too_long = run_module(
            "benchmark_prompts",
            {
                **args,
                "sets": {"long-3k": {**definition, "long": {"tokens": 8150, "question": "?"}}},
            },
        )
    assert not made.get("failed"), made
    assert too_long["failed"] and "exceed the model's context of 8192 tokens" in too_long["msg"]
    meta = made["sets"]["long-3k"]
    assert meta["length"]["target_tokens"] == target and meta["prompts"] == 6
    lines = [json.loads(x) for x in Path(meta["output"]).read_text().splitlines()]
    assert len({line["prompt"][:60] for line in lines}) == 6
    process, url = start(BASE, SGLANG_SIM_STEP_MS=1)
    try:
        level = run_module(
            "sglang_benchmark",
            {
                "base_url": url,
                "concurrency": [2],
                "prompts": meta["output"],
                "num_prompts": 6,
                "max_new_tokens": 8,
                "warmup_requests": 0,
                "request_timeout": 60,
                "output_dir": str(tmp_path / "out"),
                "run_label": "unit",
                "config_name": "ar",
            },
        )
    finally:
        stop(process)
    assert not level.get("failed"), level
    document = json.loads((tmp_path / "out" / "c2.json").read_text())
    assert level_problems(document) == []
    tree = tmp_path / "run" / "h1" / "ar" / "long-3k"
    tree.mkdir(parents=True)
    (tree / "c2.json").write_text(json.dumps(document))
    assert len(analysis.load(tmp_path / "run", strict=True).levels) == 1
    counted = [r["prompt_tokens"] for r in document["requests"]]
    assert all(abs(c - target) <= 0.05 * target for c in counted), counted
    found = document["summary"]["prompt_length"]
    assert found["counted"] == 6 and found["on_target"] is True
    assert found["prompt_tokens_mean"] == round(sum(counted) / 6, 1)
    assert 0.95 <= found["measured_over_estimated"] <= 1.05
