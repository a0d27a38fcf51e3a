"""canary_checkpoint: tiny same-architecture checkpoints, checked against the real ones.

Every checkpoint is generated once per module (about 6 s for all five on one core) from the
realistic full configs in tests/fixtures/hub-repos/, then compared with the real repository's
tensor listing (tests/fixtures/checkpoint-listings/: K2.6 transcribed from a public listing of
the real checkpoint, the others derived from sglang 0.5.23's loaders, as each file says),
opened with the real safetensors reader, and checked field by field against the real config.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import itertools
import json
import math
import random
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from ansible.module_utils.canary import checkpoint as cc
from ansible.module_utils.canary.checkpoint_common import spread
from ansible.module_utils.canary.safetensors_writer import DTYPE_BYTES
from safetensors import safe_open

from tests.support.modules import run_module

REPO = Path(__file__).resolve().parents[2]
HUB = REPO / "tests" / "fixtures" / "hub-repos"
LISTINGS = REPO / "tests" / "fixtures" / "checkpoint-listings"
pytestmark = pytest.mark.runtime

# name: (kind, repository, the tiny target it is shaped to, TP size, listing)
CHECKPOINTS = {
    "kimi-k2.6": ("target", "moonshotai/Kimi-K2.6", None, 8),
    "kimi-k2.6-dflash": ("dflash", "z-lab/Kimi-K2.6-DFlash", "kimi-k2.6", 8),
    "kimi-k2.6-eagle3": ("eagle3", "lightseekorg/kimi-k2.6-eagle3.1-mla", "kimi-k2.6", 8),
    "qwen3.6-27b": ("target", "Qwen/Qwen3.6-27B", None, 1),
    "qwen3.6-27b-dflash": ("dflash", "z-lab/Qwen3.6-27B-DFlash", "qwen3.6-27b", 1),
}

# What the generator changes, model by model (docs/models.md has the same table, with why).
SCALED = {
    "kimi-k2.6": {
        "text_config.hidden_size": [7168, 256],
        "text_config.intermediate_size": [18432, 2048],
        "text_config.n_routed_experts": [384, 24],
        "text_config.num_hidden_layers": [61, 7],
        "text_config.q_lora_rank": [1536, 256],
        "vision_config.vt_hidden_size": [1152, 576],
        "vision_config.vt_num_attention_heads": [16, 8],
        "vision_config.vt_num_hidden_layers": [27, 1],
        "vision_config.vt_intermediate_size": [4304, 2152],
        "vision_config.hidden_size": [None, 576],
        "vision_config.num_attention_heads": [None, 8],
        "vision_config.num_hidden_layers": [None, 1],
        "vision_config.intermediate_size": [None, 2152],
        "vision_config.mm_hidden_size": [1152, 576],
        "vision_config.text_hidden_size": [7168, 256],
    },
    "kimi-k2.6-dflash": {
        "hidden_size": [7168, 256],
        "intermediate_size": [18432, 2048],
        "num_hidden_layers": [6, 2],
        "layer_types": [["full_attention"] * 6, ["full_attention"] * 2],
        "dflash_config.target_layer_ids": [[1, 12, 24, 35, 47, 58], [0, 1, 2, 3, 4, 5]],
        "num_target_layers": [61, 7],
    },
    "kimi-k2.6-eagle3": {
        "hidden_size": [7168, 256],
        "target_hidden_size": [7168, 256],
        "intermediate_size": [18432, 2048],
        "q_lora_rank": [1536, 256],
        "eagle_config.eagle_aux_hidden_state_layer_ids": [[1, 29, 57], [2, 4, 6]],
    },
    "qwen3.6-27b": {
        "text_config.hidden_size": [5120, 256],
        "text_config.intermediate_size": [17408, 2048],
        "text_config.num_hidden_layers": [64, 8],
        "text_config.layer_types": ["64 layers", "8 layers"],
        "vision_config.depth": [27, 1],
        "vision_config.hidden_size": [1152, 576],
        "vision_config.num_heads": [16, 8],
        "vision_config.intermediate_size": [4304, 2152],
        "vision_config.out_hidden_size": [5120, 256],
    },
    "qwen3.6-27b-dflash": {
        "hidden_size": [5120, 256],
        "intermediate_size": [17408, 2048],
        "num_hidden_layers": [5, 2],
        "layer_types": [
            ["sliding_attention"] * 4 + ["full_attention"],
            ["sliding_attention", "full_attention"],
        ],
        "dflash_config.target_layer_ids": [[1, 16, 31, 46, 61], [0, 2, 3, 4, 6]],
        "num_target_layers": [64, 8],
    },
}

# sha256 of each model.safetensors for seed 0 at the TP sizes above: the bytes are the
# specification's (shake_256 over seed and name), so any change to them must bump
# cc.GENERATOR_VERSION and these together.
WEIGHTS_SHA256 = {
    "kimi-k2.6": "60baa68965279d7c60a7876edcd2380577c8405cf913b0b084910146bd91e653",
    "kimi-k2.6-dflash": "63cd08589c6fdf3393f88a431207bbef462ad25fe155725ad34f5dd50d204224",
    "kimi-k2.6-eagle3": "40ae8fcd6842b5e7bb46753d106672e636d7fb385a40aca918b115fc6a8616fd",
    "qwen3.6-27b": "dbc69914bbda8828392d0dd1a7f44da5e2bb8d83b54e22676a5f83a2b132d851",
    "qwen3.6-27b-dflash": "cf236571e1144a3c74264f0feec70b15fb444832a8c54b7498e087698353e880",
}


def real_config(name: str) -> dict:
    return json.loads((HUB / CHECKPOINTS[name][1] / "config.json").read_text())


def listing(name: str) -> dict:
    return json.loads((LISTINGS / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    results = {}
    for name, (kind, repo, target, tp) in CHECKPOINTS.items():
        results[name] = cc.generate(
            kind,
            str(HUB / repo),
            str(root / name),
            target_dir=str(root / target) if target else None,
            tp_size=tp,
        )
    return results


# ---------------------------------------------------------------------------------------------
# Listing expressions: shapes as arithmetic over config fields (t.hidden_size ...)


def field(config: dict, scopes: dict, dotted: str):
    scope, _, name = dotted.partition(".")
    part = config
    for key in filter(None, scopes[scope].split(".")):
        part = part[key]
    return part[name]


def evaluate(expr: str, config: dict, scopes: dict) -> int:
    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return field(config, scopes, f"{node.value.id}.{node.attr}")
        if isinstance(node, ast.BinOp):
            left, right = walk(node.left), walk(node.right)
            ops = {ast.Add: left + right, ast.Sub: left - right, ast.Mult: left * right}
            if isinstance(node.op, ast.FloorDiv):
                assert left % right == 0, f"{expr}: {left} // {right} is not exact"
                return left // right
            return ops[type(node.op)]
        if isinstance(node, ast.Call) and node.func.id in ("len", "prod") and len(node.args) == 1:
            value = walk(node.args[0])
            return len(value) if node.func.id == "len" else math.prod(value)
        raise AssertionError(f"unsupported expression {expr!r}")

    return walk(ast.parse(expr, mode="eval"))


def expand(spec: dict, config: dict) -> dict[str, tuple[str, list[int]]]:
    """Every tensor the listing's patterns name under config: {name: (dtype, shape)}."""
    scopes, indexes = spec["scopes"], {}
    for key, where in spec["ranges"].items():
        if "layers_of" in where:
            types = field(config, scopes, where["layers_of"])
            indexes[key] = [i for i, kind in enumerate(types) if kind == where["type"]]
        else:
            low, high = (evaluate(where[k], config, scopes) for k in ("from", "to"))
            indexes[key] = list(range(low, high))
    out = {}
    for row in spec["tensors"]:
        keys = [k for k in indexes if "{" + k + "}" in row["name"]]
        shape = [evaluate(e, config, scopes) for e in row["shape"]]
        for values in itertools.product(*(indexes[k] for k in keys)):
            name = row["name"]
            for key, value in zip(keys, values, strict=True):
                name = name.replace("{" + key + "}", str(value))
            assert name not in out, name
            out[name] = (row["dtype"], shape)
    return out


def header(path: Path) -> dict[str, tuple[str, list[int]]]:
    """Names, dtypes and shapes as the real safetensors reader reports them."""
    with safe_open(str(path), "numpy") as handle:
        return {
            key: (handle.get_slice(key).get_dtype(), handle.get_slice(key).get_shape())
            for key in list(handle.keys())
        }


# ---------------------------------------------------------------------------------------------
# The listings themselves


def test_k26_listing_is_the_real_checkpoint():
    """The transcription reproduces the real listing: every row's shape, and its totals of
    208,550 tensors and 170,738,182,128 parameters."""
    spec = listing("kimi-k2.6")
    config = real_config("kimi-k2.6")
    for row in spec["tensors"]:
        shape = [evaluate(e, config, spec["scopes"]) for e in row["shape"]]
        assert shape == row["real_shape"], row["name"]
    tensors = expand(spec, config)
    assert len(tensors) == 208_550
    assert sum(math.prod(shape) for _dtype, shape in tensors.values()) == 170_738_182_128
    nbytes = sum(DTYPE_BYTES[dtype] * math.prod(shape) for dtype, shape in tensors.values())
    # The listing's "554.27 GB" of tensors is GiB (595.15 GB), as its 554.30 of files.
    assert nbytes / (1 << 30) == pytest.approx(554.27, abs=0.005)


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_listing_names_a_real_config_of_the_repository(name):
    spec = listing(name)
    assert spec["repository"] == CHECKPOINTS[name][1]
    assert spec["source"]["kind"] in ("listing", "loader")
    assert (REPO / spec["config"]) == HUB / CHECKPOINTS[name][1] / "config.json"
    expand(spec, real_config(name))  # every expression evaluates on the real config


# ---------------------------------------------------------------------------------------------
# Tensors, files, values


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_tensors_are_the_real_listings_under_the_tiny_config(generated, name):
    result = generated[name]
    expected = expand(listing(name), result["config"])
    found = header(Path(result["path"]) / cc.WEIGHTS)
    assert sorted(set(expected) - set(found)) == []  # every real pattern is there
    assert sorted(set(found) - set(expected)) == []  # and nothing else
    for tensor, (dtype, shape) in expected.items():
        assert found[tensor] == (dtype, shape), tensor
    assert result["tensors"] == len(found)


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_files_index_and_sizes(generated, name):
    result = generated[name]
    folder = Path(result["path"])
    index = json.loads((folder / cc.INDEX).read_text())
    found = header(folder / cc.WEIGHTS)
    assert index["weight_map"] == {tensor: cc.WEIGHTS for tensor in found}
    data = sum(DTYPE_BYTES[dtype] * math.prod(shape) for dtype, shape in found.values())
    assert index["metadata"]["total_size"] == data
    assert json.loads((folder / cc.CONFIG).read_text()) == result["config"]
    on_disk = {p.name for p in folder.iterdir() if not p.name.startswith(".")}
    assert sorted(on_disk) == result["files"]
    assert result["bytes"] == sum((folder / f).stat().st_size for f in result["files"])
    assert result["bytes"] < cc.DEFAULT_MAX_BYTES
    listing_text = "".join(
        f"{f}:{hashlib.sha256((folder / f).read_bytes()).hexdigest()}\n"
        for f in sorted(result["files"])
    )
    assert result["digest"] == hashlib.sha256(listing_text.encode()).hexdigest()


def test_k26_with_its_drafters_fits_well_under_a_gib(generated):
    total = sum(
        generated[n]["bytes"] for n in ("kimi-k2.6", "kimi-k2.6-dflash", "kimi-k2.6-eagle3")
    )
    assert total < 700e6, total  # docs/models.md gives the figures
    assert generated["qwen3.6-27b"]["bytes"] + generated["qwen3.6-27b-dflash"]["bytes"] < 450e6


def test_small_files_are_copied_and_the_real_index_is_not(tmp_path, generated):
    source = tmp_path / "source"
    shutil.copytree(HUB / "z-lab/Kimi-K2.6-DFlash", source)
    (source / "tokenizer.json").write_text('{"model": "x"}')
    (source / "sub").mkdir()
    (source / "sub" / "dflash.py").write_text("# remote code\n")
    (source / "model.safetensors.index.json").write_text('{"weight_map": {"a": "shard-1"}}')
    (source / "model-00001-of-00002.safetensors").write_bytes(b"weights")
    (source / ".cache").mkdir()
    (source / ".cache" / "meta").write_text("hub client state")
    target = generated["kimi-k2.6"]["path"]
    dest = tmp_path / "dest"
    result = cc.generate("dflash", str(source), str(dest), target_dir=str(target))
    assert result["files"] == sorted(
        [
            "config.json",
            "model.safetensors",
            "model.safetensors.index.json",
            "sub/dflash.py",
            "tokenizer.json",
        ]
    )
    assert (dest / "sub" / "dflash.py").read_bytes() == (source / "sub" / "dflash.py").read_bytes()
    assert json.loads((dest / cc.INDEX).read_text())["weight_map"] != {"a": "shard-1"}
    assert not (dest / "model-00001-of-00002.safetensors").exists()
    assert not (dest / ".cache").exists()
    # A file gone from the source goes from the checkpoint; a file the module never wrote stays.
    (dest / "mine.txt").write_text("the operator's")
    (source / "tokenizer.json").unlink()
    again = cc.generate("dflash", str(source), str(dest), target_dir=str(target))
    assert again["changed"] and "tokenizer.json" not in again["files"]
    assert not (dest / "tokenizer.json").exists()
    assert (dest / "mine.txt").read_text() == "the operator's"


def bf16_words(path: Path, tensor: str) -> np.ndarray:
    """A BF16 tensor's raw 16-bit words (numpy has no bfloat16): read at the offsets the
    header gives, after the real reader has accepted the file."""
    with open(path, "rb") as handle:
        size = struct.unpack("<Q", handle.read(8))[0]
        meta = json.loads(handle.read(size))[tensor]
        begin, end = meta["data_offsets"]
        handle.seek(8 + size + begin)
        return np.frombuffer(handle.read(end - begin), dtype="<u2")


def test_values_are_small_finite_and_initialised_as_specified(generated):
    path = Path(generated["kimi-k2.6"]["path"]) / cc.WEIGHTS
    p = "language_model.model.layers.1"
    weight = bf16_words(path, f"{p}.self_attn.kv_b_proj.weight")
    exponent = (weight >> 7) & 0xFF
    assert exponent.min() == 118 and exponent.max() == 121  # |x| in [2^-9, 2^-5)
    assert ((weight >> 15) == 1).mean() == pytest.approx(0.5, abs=0.01)  # both signs
    scale = bf16_words(path, f"{p}.mlp.experts.3.down_proj.weight_scale")
    assert (scale >> 15).max() == 0 and set(np.unique((scale >> 7) & 0xFF)) == {118, 119}
    assert set(bf16_words(path, f"{p}.input_layernorm.weight")) == {0x3F80}  # 1.0
    assert set(bf16_words(path, "vision_tower.encoder.blocks.0.wqkv.bias")) == {0}
    with safe_open(str(path), "numpy") as handle:
        bias = handle.get_tensor(f"{p}.mlp.gate.e_score_correction_bias")
        assert bias.dtype == np.float32 and not bias.any()
        shape = handle.get_tensor(f"{p}.mlp.experts.0.gate_proj.weight_shape")
        assert shape.dtype == np.int32 and shape.tolist() == [2048, 256]
        down = handle.get_tensor(f"{p}.mlp.experts.0.down_proj.weight_shape")
        assert down.tolist() == [256, 2048]
        packed = handle.get_tensor(f"{p}.mlp.experts.0.gate_proj.weight_packed")
        nibbles = (packed[..., None] >> np.arange(0, 32, 4)) & 0xF
        assert sorted(np.unique(nibbles)) == list(range(16))  # every INT4 value occurs
    qwen = Path(generated["qwen3.6-27b"]["path"]) / cc.WEIGHTS
    with safe_open(str(qwen), "numpy") as handle:
        a_log = handle.get_tensor("model.language_model.layers.0.linear_attn.A_log")
        assert np.allclose(np.exp(a_log), (np.arange(48) % 16) + 1)
    assert set(bf16_words(qwen, "model.language_model.layers.0.linear_attn.dt_bias")) == {0x3F80}
    # Qwen3.5's zero-centred RMSNorms: weight 0 scales by 1.
    assert set(bf16_words(qwen, "model.language_model.norm.weight")) == {0}


def test_every_float_tensor_is_finite(generated):
    for result in generated.values():
        path = Path(result["path"]) / cc.WEIGHTS
        for tensor, (dtype, _shape) in header(path).items():
            if dtype == "BF16":
                assert ((bf16_words(path, tensor) >> 7) & 0xFF).max() < 0xFF, tensor
        with safe_open(str(path), "numpy") as handle:
            for tensor in list(handle.keys()):
                if handle.get_slice(tensor).get_dtype() == "F32":
                    assert np.isfinite(handle.get_tensor(tensor)).all(), tensor


# ---------------------------------------------------------------------------------------------
# Configs


def differences(real, tiny, path=""):
    if isinstance(real, dict) and isinstance(tiny, dict):
        out = set()
        for key in set(real) | set(tiny):
            out |= differences(
                real.get(key, "<absent>"), tiny.get(key, "<absent>"), f"{path}{key}."
            )
        return out
    return set() if real == tiny else {path.rstrip(".")}


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_every_config_field_is_kept_but_the_scaled_ones(generated, name):
    result = generated[name]
    assert result["scaled"] == SCALED[name]
    assert differences(real_config(name), result["config"]) == set(SCALED[name])
    for dotted, (_real, tiny) in result["scaled"].items():
        part = result["config"]
        for key in dotted.split("."):
            part = part[key]
        if not dotted.endswith("layer_types"):
            assert part == tiny, dotted


def test_k26_keeps_every_dimension_that_selects_a_kernel(generated):
    real, tiny = real_config("kimi-k2.6"), generated["kimi-k2.6"]["config"]
    text = tiny["text_config"]
    for key in (
        "kv_lora_rank",
        "qk_rope_head_dim",
        "qk_nope_head_dim",
        "v_head_dim",
        "num_attention_heads",
        "num_experts_per_tok",
        "n_shared_experts",
        "first_k_dense_replace",
        "n_group",
        "topk_group",
        "moe_intermediate_size",
        "vocab_size",
        "quantization_config",
        "rope_parameters",
        "scoring_func",
        "topk_method",
    ):
        assert text[key] == real["text_config"][key], key
    assert (text["kv_lora_rank"], text["qk_rope_head_dim"]) == (512, 64)  # FlashMLA's 512 + 64
    assert text["num_attention_heads"] // 8 == 8  # 8 heads per rank at TP 8, as on the real model
    assert tiny["quantization_config"] == real["quantization_config"]
    assert tiny["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert text["n_routed_experts"] >= 2 * text["num_experts_per_tok"]
    # The top-k kernel of 384 experts (moe_fused_gate): a count that is not a power of two.
    assert text["n_routed_experts"] & (text["n_routed_experts"] - 1)
    vision = tiny["vision_config"]
    assert vision["vt_hidden_size"] // vision["vt_num_attention_heads"] == 72  # MoonViT's head_dim


def test_qwen_keeps_its_hybrid_layout(generated):
    real, tiny = real_config("qwen3.6-27b"), generated["qwen3.6-27b"]["config"]
    text, rtext = tiny["text_config"], real["text_config"]
    for key in (
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
        "full_attention_interval",
        "mamba_ssm_dtype",
        "mtp_num_hidden_layers",
        "rope_parameters",
        "vocab_size",
    ):
        assert text[key] == rtext[key], key
    interval = text["full_attention_interval"]
    assert text["layer_types"] == [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention"
        for i in range(text["num_hidden_layers"])
    ]
    vision = tiny["vision_config"]
    assert vision["hidden_size"] // vision["num_heads"] == 72
    assert vision["out_hidden_size"] == text["hidden_size"]


def test_drafters_are_shaped_to_the_tiny_target(generated):
    for drafter, target in (
        ("kimi-k2.6-dflash", "kimi-k2.6"),
        ("qwen3.6-27b-dflash", "qwen3.6-27b"),
    ):
        config, text = generated[drafter]["config"], generated[target]["config"]["text_config"]
        ids = config["dflash_config"]["target_layer_ids"]
        # Distinct and below the last layer: DeepseekV2 and Qwen3.5 capture before id + 1.
        assert ids == sorted(set(ids)) and ids[-1] <= text["num_hidden_layers"] - 2
        assert len(ids) == len(real_config(drafter)["dflash_config"]["target_layer_ids"])
        assert config["num_target_layers"] == text["num_hidden_layers"]
        assert config["hidden_size"] == text["hidden_size"]
        real = real_config(drafter)
        for key in ("block_size", "num_attention_heads", "num_key_value_heads", "head_dim"):
            assert config[key] == real[key], key
        assert config["dflash_config"]["mask_token_id"] == real["dflash_config"]["mask_token_id"]
    eagle = generated["kimi-k2.6-eagle3"]["config"]
    text = generated["kimi-k2.6"]["config"]["text_config"]
    points = eagle["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    # Capture points (ids not starting at 1, so SGLang does not shift them), below the last layer.
    assert points[0] != 1 and points == sorted(set(points))
    assert points[-1] <= text["num_hidden_layers"] - 1
    assert (eagle["kv_lora_rank"], eagle["qk_rope_head_dim"]) == (512, 64)
    assert eagle["draft_vocab_size"] == eagle["vocab_size"] == text["vocab_size"]


@pytest.mark.parametrize(
    ("ids", "real", "tiny", "low", "expected"),
    [
        ([1, 12, 24, 35, 47, 58], (0, 59), 5, 0, [0, 1, 2, 3, 4, 5]),
        ([58, 59], (0, 59), 5, 0, [4, 5]),
        ([0, 1, 2], (0, 59), 5, 0, [0, 1, 2]),
        ([2, 30, 58], (1, 60), 6, 2, [2, 4, 6]),
        ([1, 2, 3, 4, 5, 6], (0, 6), 5, 0, [0, 1, 2, 3, 4, 5]),
    ],
)
def test_layer_ids_map_distinct_ascending_and_in_range(ids, real, tiny, low, expected):
    mapped = spread(ids, real[0], real[1], low, tiny)
    assert mapped == expected
    assert mapped == sorted(set(mapped)) and low <= mapped[0] and mapped[-1] <= tiny


def test_too_many_layer_ids_are_refused():
    with pytest.raises(cc.CheckpointError, match="found 7 layer ids"):
        spread(list(range(7)), 0, 59, 0, 5)


# ---------------------------------------------------------------------------------------------
# TP sizes


def split_dims(text: dict) -> dict[str, int]:
    return {
        "heads": text["num_attention_heads"],
        "intermediate": text["intermediate_size"],
        "moe": text.get("moe_intermediate_size", text["intermediate_size"]),
    }


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_k26_tiny_dimensions_divide_and_meet_marlin_at_tp(tp):
    made = cc.plan("target", str(HUB / "moonshotai/Kimi-K2.6"), None, tp)
    text = made["config"]["text_config"]
    for dim, count in split_dims(text).items():
        assert count % tp == 0, dim
    # check_moe_marlin_supports_layer: hidden % 128, per-rank expert width % max(64, group).
    assert text["hidden_size"] % 128 == 0 and (text["moe_intermediate_size"] // tp) % 64 == 0
    assert (text["moe_intermediate_size"] // tp) == 2048 // tp  # the real per-rank width
    assert made["config"]["vision_config"]["vt_num_attention_heads"] % tp == 0
    assert (
        text["hidden_size"]
        % text["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"]
        == 0
    )


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_qwen_tiny_dimensions_divide_at_tp(tp):
    made = cc.plan("target", str(HUB / "Qwen/Qwen3.6-27B"), None, tp)
    text, vision = made["config"]["text_config"], made["config"]["vision_config"]
    for key in (
        "num_attention_heads",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "intermediate_size",
    ):
        assert text[key] % tp == 0, key
    kv = text["num_key_value_heads"]
    assert kv % tp == 0 if kv >= tp else tp % kv == 0
    assert vision["num_heads"] % tp == 0 and vision["intermediate_size"] % tp == 0


@pytest.mark.parametrize(
    ("repo", "tp", "field"),
    [
        ("moonshotai/Kimi-K2.6", 3, "num_attention_heads = 64"),
        ("moonshotai/Kimi-K2.6", 64, "Marlin MoE"),
        ("Qwen/Qwen3.6-27B", 3, "num_key_value_heads = 4 with tp_size 3"),
    ],
)
def test_a_tp_size_that_does_not_split_is_refused(repo, tp, field):
    with pytest.raises(cc.CheckpointError) as error:
        cc.plan("target", str(HUB / repo), None, tp)
    assert field in str(error.value)
    assert (
        "found" in str(error.value) and "needed" in str(error.value) and "Fix" in str(error.value)
    )


# ---------------------------------------------------------------------------------------------
# Idempotence


def test_second_run_writes_nothing_and_a_change_is_rewritten(generated, tmp_path):
    result = generated["kimi-k2.6"]
    folder = Path(result["path"])
    mtimes = {f: (folder / f).stat().st_mtime_ns for f in result["files"]}
    again = cc.generate("target", str(HUB / "moonshotai/Kimi-K2.6"), str(folder))
    assert again["changed"] is False and again["digest"] == result["digest"]
    assert again["seconds"] < 1
    assert {f: (folder / f).stat().st_mtime_ns for f in result["files"]} == mtimes
    # A file edited, or the weights truncated: rewritten, the same bytes as before.
    (folder / cc.CONFIG).write_text("{}")
    with open(folder / cc.WEIGHTS, "r+b") as handle:
        handle.truncate(1000)
    fixed = cc.generate("target", str(HUB / "moonshotai/Kimi-K2.6"), str(folder))
    assert fixed["changed"] is True and fixed["digest"] == result["digest"]
    # Another seed, other bytes.
    drafter = generated["kimi-k2.6-dflash"]
    other = cc.generate(
        "dflash",
        str(HUB / "z-lab/Kimi-K2.6-DFlash"),
        str(tmp_path / "seed1"),
        target_dir=str(folder),
        seed=1,
    )
    assert other["digest"] != drafter["digest"]
    same = cc.generate(
        "dflash",
        str(HUB / "z-lab/Kimi-K2.6-DFlash"),
        str(tmp_path / "seed0"),
        target_dir=str(folder),
    )
    assert same["digest"] == drafter["digest"]  # the same bytes in another folder


def test_changed_inputs_regenerate(generated, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(HUB / "z-lab/Qwen3.6-27B-DFlash", source)
    target = generated["qwen3.6-27b"]["path"]
    dest = tmp_path / "dest"
    first = cc.generate("dflash", str(source), str(dest), target_dir=target, tp_size=1)
    assert (
        cc.generate("dflash", str(source), str(dest), target_dir=target, tp_size=1)["changed"]
        is False
    )
    assert (
        cc.generate("dflash", str(source), str(dest), target_dir=target, tp_size=2)["changed"]
        is True
    )
    config = json.loads((source / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (source / "config.json").write_text(json.dumps(config))
    changed = cc.generate("dflash", str(source), str(dest), target_dir=target, tp_size=2)
    assert changed["changed"] is True and changed["config"]["rms_norm_eps"] == 1e-5
    assert changed["digest"] != first["digest"]


def test_weights_bytes_are_pinned(generated):
    """The bytes are part of the specification: a change needs GENERATOR_VERSION bumped."""
    found = {}
    for name, result in generated.items():
        stamp = json.loads((Path(result["path"]) / cc.STAMP).read_text())
        found[name] = stamp["files"][cc.WEIGHTS]["sha256"]
    assert cc.GENERATOR_VERSION == 1
    assert found == WEIGHTS_SHA256


# ---------------------------------------------------------------------------------------------
# Refusals


def write_config(tmp_path: Path, config, name: str = "src") -> Path:
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return folder


def refused(message: str, *parts: str) -> None:
    """A refusal says what it found (capacity.Fields words it "<field> is <value>"), what is
    needed and how to fix it, plus the given parts."""
    assert "found " in message or " is " in message, message
    for part in ("needed: ", "Fix: ", *parts):
        assert part in message, (part, message)


def mutate(config: dict, dotted: str, value) -> dict:
    out = copy.deepcopy(config)
    part = out
    *path, last = dotted.split(".")
    for key in path:
        part = part[key]
    if value is KeyError:
        del part[last]
    else:
        part[last] = value
    return out


K26 = json.loads((HUB / "moonshotai/Kimi-K2.6/config.json").read_text())
QWEN = json.loads((HUB / "Qwen/Qwen3.6-27B/config.json").read_text())


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ([1, 2], "the top level is [1, 2]"),
        ("not json", "not JSON"),
        ("[" * 100000, "not JSON"),
        (mutate(K26, "text_config", "x"), "text_config is 'x'"),
        (mutate(K26, "text_config.hidden_size", KeyError), "text_config.hidden_size is missing"),
        (mutate(K26, "text_config.hidden_size", "7168"), "text_config.hidden_size is '7168'"),
        (mutate(K26, "text_config.hidden_size", True), "text_config.hidden_size is True"),
        (mutate(K26, "text_config.hidden_size", 7168.0), "text_config.hidden_size is 7168.0"),
        (mutate(K26, "text_config.num_hidden_layers", -1), "num_hidden_layers is -1"),
        (mutate(K26, "text_config.n_routed_experts", 1 << 40), "n_routed_experts is 1099511627776"),
        (mutate(K26, "text_config.rms_norm_eps", float("nan")), "rms_norm_eps is nan"),
        (
            mutate(K26, "architectures", ["LlamaForCausalLM"]),
            "architectures is ['LlamaForCausalLM']",
        ),
        (mutate(K26, "architectures", "KimiK25ForConditionalGeneration"), "architectures is"),
        (
            mutate(K26, "text_config.quantization_config.quant_method", "fp8"),
            "quant_method is 'fp8'",
        ),
        (mutate(K26, "text_config.quantization_config.format", "naive-quantized"), "format is"),
        (
            mutate(
                K26, "text_config.quantization_config.config_groups.group_0.weights.num_bits", 3
            ),
            "num_bits is 3",
        ),
        (
            mutate(
                K26, "text_config.quantization_config.config_groups.group_0.weights.group_size", 7
            ),
            "group_size is 7",
        ),
        (
            mutate(
                K26,
                "text_config.quantization_config.config_groups.group_0.weights.symmetric",
                False,
            ),
            "symmetric is False",
        ),
        (
            mutate(K26, "text_config.quantization_config.ignore", ["re:(["]),
            "a valid regular expression",
        ),
        (mutate(K26, "text_config.first_k_dense_replace", 7), "first_k_dense_replace is 7"),
        (mutate(K26, "text_config.n_group", 5), "n_group is 5"),
        (mutate(K26, "vision_config.vt_hidden_size", 1000), "vt_hidden_size is 1000"),
        (mutate(K26, "vision_config.merge_kernel_size", [2]), "merge_kernel_size is [2]"),
        (mutate(QWEN, "text_config.full_attention_interval", 3), "full_attention_interval is 3"),
        (mutate(QWEN, "text_config.layer_types", ["full_attention"] * 63), "layer_types"),
        (mutate(QWEN, "text_config.num_key_value_heads", 5), "num_key_value_heads"),
        (
            mutate(QWEN, "text_config.quantization_config", {"quant_method": "fp8"}),
            "quantization_config",
        ),
        (
            mutate(QWEN, "vision_config.num_position_embeddings", 2300),
            "num_position_embeddings is 2300",
        ),
    ],
)
def test_bad_target_configs_are_refused(tmp_path, config, expected):
    folder = write_config(tmp_path, config)
    with pytest.raises(cc.CheckpointError) as error:
        cc.generate("target", str(folder), str(tmp_path / "dest"))
    refused(str(error.value), expected)
    assert not (tmp_path / "dest").exists()


def test_absurd_sizes_are_refused_before_anything_is_written(tmp_path):
    folder = write_config(tmp_path, mutate(K26, "text_config.vocab_size", (1 << 24) - 1))
    with pytest.raises(cc.CheckpointError) as error:
        cc.generate("target", str(folder), str(tmp_path / "dest"))
    refused(str(error.value), "at most max_bytes (1073741824)")
    assert not (tmp_path / "dest").exists()
    with pytest.raises(cc.CheckpointError, match="at most max_bytes"):
        cc.generate(
            "target", str(HUB / "moonshotai/Kimi-K2.6"), str(tmp_path / "d"), max_bytes=10**8
        )


@pytest.fixture(scope="module")
def k26_target(generated):
    return generated["kimi-k2.6"]["path"]


DFLASH = json.loads((HUB / "z-lab/Kimi-K2.6-DFlash/config.json").read_text())
EAGLE = json.loads((HUB / "lightseekorg/kimi-k2.6-eagle3.1-mla/config.json").read_text())


@pytest.mark.parametrize(
    ("kind", "config", "expected"),
    [
        ("dflash", mutate(DFLASH, "architectures", ["Qwen3ForCausalLM"]), "architectures"),
        ("dflash", mutate(DFLASH, "hidden_size", 4096), "the real target's (7168)"),
        ("dflash", mutate(DFLASH, "vocab_size", 163841), "the target's vocab_size"),
        ("dflash", mutate(DFLASH, "dflash_config.target_layer_ids", [12, 1]), "ascending"),
        ("dflash", mutate(DFLASH, "dflash_config.target_layer_ids", [1, 1, 2]), "distinct"),
        (
            "dflash",
            mutate(DFLASH, "dflash_config.target_layer_ids", [1, 60]),
            "below the target's last",
        ),
        ("dflash", mutate(DFLASH, "dflash_config.target_layer_ids", list(range(8))), "8 layer ids"),
        (
            "dflash",
            mutate(DFLASH, "dflash_config.target_layer_ids", "1,12"),
            "target_layer_ids is '1,12'",
        ),
        ("dflash", mutate(DFLASH, "dflash_config.mask_token_id", 1 << 30), "mask_token_id"),
        ("dflash", mutate(DFLASH, "num_target_layers", 62), "num_target_layers is 62"),
        ("dflash", mutate(DFLASH, "num_key_value_heads", 7), "num_key_value_heads is 7"),
        ("dflash", mutate(DFLASH, "layer_types", ["full_attention"]), "layer_types"),
        ("eagle3", mutate(EAGLE, "num_hidden_layers", 2), "num_hidden_layers is 2"),
        ("eagle3", mutate(EAGLE, "q_lora_rank", None), "q_lora_rank is None"),
        (
            "eagle3",
            mutate(EAGLE, "eagle_config.eagle_aux_hidden_state_layer_ids", [2, 61]),
            "capture points",
        ),
        ("eagle3", mutate(EAGLE, "draft_vocab_size", 1 << 20), "draft_vocab_size"),
        ("eagle3", mutate(EAGLE, "target_hidden_size", 4096), "target_hidden_size is 4096"),
    ],
)
def test_bad_drafter_configs_are_refused(tmp_path, k26_target, kind, config, expected):
    folder = write_config(tmp_path, config)
    with pytest.raises(cc.CheckpointError) as error:
        cc.generate(kind, str(folder), str(tmp_path / "dest"), target_dir=k26_target)
    refused(str(error.value), expected)


def test_a_drafter_needs_a_tiny_target(tmp_path):
    not_tiny = write_config(tmp_path, K26, "real-target")
    with pytest.raises(cc.CheckpointError) as error:
        cc.generate(
            "dflash",
            str(HUB / "z-lab/Kimi-K2.6-DFlash"),
            str(tmp_path / "d"),
            target_dir=str(not_tiny),
        )
    refused(str(error.value), "kind=target first")
    with pytest.raises(cc.CheckpointError, match="no target_dir"):
        cc.generate("eagle3", str(HUB / "lightseekorg/kimi-k2.6-eagle3.1-mla"), str(tmp_path / "d"))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"kind": "draft"}, "kind 'draft'"),
        ({"tp_size": 0}, "tp_size 0"),
        ({"tp_size": True}, "tp_size True"),
        ({"seed": -1}, "seed -1"),
        ({"seed": 1 << 64}, "seed 18446744073709551616"),
        ({"max_bytes": 0}, "max_bytes 0"),
        ({"source_dir": "relative/dir"}, "source_dir 'relative/dir'"),
        ({"source_dir": "/tmp/../etc"}, "no '..'"),
        ({"dest_dir": "dest"}, "dest_dir 'dest'"),
        ({"dest_dir": "/a/./b"}, "normalised"),
    ],
)
def test_bad_arguments_are_refused(tmp_path, args, expected):
    base = {
        "kind": "target",
        "source_dir": str(HUB / "moonshotai/Kimi-K2.6"),
        "dest_dir": str(tmp_path / "d"),
    }
    base.update(args)
    with pytest.raises(cc.CheckpointError) as error:
        cc.generate(**base)
    refused(str(error.value), expected)


def test_paths_outside_their_folder_are_refused(tmp_path, k26_target):
    # The DFlash drafter's small checkpoint keeps this quick; the rules are the same for all.
    source = tmp_path / "source"
    shutil.copytree(HUB / "z-lab/Kimi-K2.6-DFlash", source)
    outside = tmp_path / "secret.txt"
    outside.write_text("not the repository's")

    def make(dest):
        return cc.generate("dflash", str(source), str(dest), target_dir=k26_target)

    def attempt(dest):
        with pytest.raises(cc.CheckpointError) as error:
            make(dest)
        return str(error.value)

    refused(attempt(source / "tiny"), "overlapping")  # dest inside the source
    refused(attempt(tmp_path), "overlapping")  # the source inside dest
    refused(attempt(Path(k26_target) / "drafter"), "overlapping")  # inside the target
    (source / "tokenizer.model").symlink_to(outside)
    refused(attempt(tmp_path / "d1"), "a symlink to", "outside")
    (source / "tokenizer.model").unlink()
    (source / "assets").symlink_to(tmp_path, target_is_directory=True)
    refused(attempt(tmp_path / "d2"), "outside")
    (source / "assets").unlink()
    (source / "inside.json").symlink_to(source / "config.json")  # a link within: fine
    ok = make(tmp_path / "d3")
    assert "inside.json" in ok["files"] and not (tmp_path / "d3" / "inside.json").is_symlink()
    # A symlink where the checkpoint writes is never followed.
    dest = tmp_path / "d4"
    dest.mkdir()
    (dest / cc.CONFIG).symlink_to(outside)
    refused(attempt(dest), "a symlink at")
    assert outside.read_text() == "not the repository's"
    (tmp_path / "link-dest").symlink_to(tmp_path / "d5", target_is_directory=True)
    refused(attempt(tmp_path / "link-dest"), "is a symlink")
    (source / "sub").mkdir()
    (source / "sub" / "x.py").write_text("# code\n")
    dest = tmp_path / "d6"
    dest.mkdir()
    (dest / "sub").symlink_to(tmp_path, target_is_directory=True)  # a folder link on the way
    refused(attempt(dest), "a symlink at")
    assert not (tmp_path / "x.py").exists()
    (source / "config.json").rename(source / "real-config.json")
    (source / "config.json").symlink_to(HUB / "z-lab/Kimi-K2.6-DFlash/config.json")
    refused(attempt(tmp_path / "d7"), "a symlink to", "outside")


HOSTILE = [None, -1, 0, 1 << 63, 1e308, float("inf"), "7168", [], {}, True, [1, 2], {"a": 1}]


def leaves(config, path=()):
    if isinstance(config, dict):
        for key, value in config.items():
            yield from leaves(value, (*path, key))
    elif isinstance(config, list) and config and not isinstance(config[0], (dict, list)):
        yield path
        for index in range(min(len(config), 2)):
            yield (*path, index)
    else:
        yield path


def replace(config, path, value):
    out = copy.deepcopy(config)
    part = out
    for key in path[:-1]:
        part = part[key]
    part[path[-1]] = value
    return out


@pytest.mark.parametrize(
    "name", ["kimi-k2.6", "qwen3.6-27b", "kimi-k2.6-dflash", "kimi-k2.6-eagle3"]
)
def test_hostile_values_anywhere_are_refused_or_kept_within_bounds(
    tmp_path, k26_target, generated, name
):
    """Fuzz: any field of the real config set to a hostile value either gives a valid tiny
    checkpoint plan within max_bytes or a CheckpointError, never another exception."""
    kind, _repo, target, _tp = CHECKPOINTS[name]
    target_dir = generated[target]["path"] if target else None
    real = real_config(name)
    paths = list(leaves(real))
    rng = random.Random(20260)
    cases = [(p, v) for p in paths for v in HOSTILE]
    rng.shuffle(cases)
    outcomes = {"refused": 0, "planned": 0}
    for index, (path, value) in enumerate(cases[:400]):
        folder = write_config(tmp_path, replace(real, path, value), f"case{index % 4}")
        try:
            result = cc.generate(
                kind, str(folder), str(tmp_path / "d"), target_dir=target_dir, check_mode=True
            )
        except cc.CheckpointError as error:
            refused(str(error))
            outcomes["refused"] += 1
            continue
        assert result["bytes"] <= cc.DEFAULT_MAX_BYTES
        outcomes["planned"] += 1
    assert outcomes["refused"] > 50 and outcomes["planned"] > 50, outcomes
    assert not (tmp_path / "d").exists()


# ---------------------------------------------------------------------------------------------
# The Ansible module


def test_module_returns_the_designed_interface(generated, tmp_path):
    result = run_module(
        "canary_checkpoint",
        {
            "kind": "dflash",
            "source_dir": str(HUB / "z-lab/Kimi-K2.6-DFlash"),
            "dest_dir": str(tmp_path / "dflash"),
            "target_dir": generated["kimi-k2.6"]["path"],
            "tp_size": 8,
            "seed": 0,
            "max_bytes": 1 << 30,
        },
    )
    assert not result.get("failed"), result
    for key in (
        "changed",
        "path",
        "bytes",
        "files",
        "tensors",
        "seconds",
        "config",
        "digest",
        "scaled",
    ):
        assert key in result, key
    assert result["changed"] is True and result["digest"] == generated["kimi-k2.6-dflash"]["digest"]
    check = run_module(
        "canary_checkpoint",
        {
            "kind": "target",
            "source_dir": str(HUB / "Qwen/Qwen3.6-27B"),
            "dest_dir": str(tmp_path / "qwen"),
            "tp_size": 1,
        },
        check_mode=True,
    )
    assert check["changed"] is True and check["scaled"] == SCALED["qwen3.6-27b"]
    assert not (tmp_path / "qwen").exists()
    failed = run_module(
        "canary_checkpoint",
        {
            "kind": "target",
            "source_dir": str(tmp_path / "missing"),
            "dest_dir": str(tmp_path / "x"),
        },
    )
    assert failed["failed"] and "found no config.json" in failed["msg"] and "Fix:" in failed["msg"]
    needs = run_module(
        "canary_checkpoint",
        {
            "kind": "eagle3",
            "source_dir": str(HUB / "lightseekorg/kimi-k2.6-eagle3.1-mla"),
            "dest_dir": "/x",
        },
    )
    assert needs["failed"] and "target_dir" in needs["msg"]


def test_docs_table_names_every_scaled_field():
    text = (REPO / "docs" / "models.md").read_text()
    section = text.split("## Tiny canary checkpoints", 1)[1]
    for name, fields in SCALED.items():
        for dotted in fields:
            assert f"`{dotted}`" in section, (name, dotted)


def test_generation_is_fast(generated):
    # docs/models.md quotes these; the unit suite must stay quick on a 2-core CI machine.
    assert sum(result["seconds"] for result in generated.values()) < 60
