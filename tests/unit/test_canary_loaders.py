"""The real loaders open the tiny canary checkpoints: compressed-tensors' own decompressor.

compressed-tensors at sglang's pin (0.18.0 for 0.5.23) runs on CPU in a venv built on first
use (tests/support/loader_venv.py: about a minute cold, stamped in tests/.state/, under a
second warm), through transformers' CompressedTensorsConfig as the HF quantizer reaches it,
and restores every INT4 weight of the tiny K2.6 to the shape its weight_shape records
(tests/support/canary_decompress.py). The safetensors reader itself is checked in
test_canary_checkpoint.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from ansible.module_utils.canary import checkpoint as cc
from ansible.module_utils.canary.safetensors_writer import safetensors_header

from tests.contract import contract_venv as cv
from tests.support import loader_venv

REPO = Path(__file__).resolve().parents[2]
HUB = REPO / "tests" / "fixtures" / "hub-repos"
DECOMPRESS = REPO / "tests" / "support" / "canary_decompress.py"
# Importing torch and transformers takes seconds; decompressing the tiny K2.6 about 3 s more.
DEADLINE_S = 300
# What sglang's wheel requires (its METADATA); a new kimi_sglang_version must be reviewed here.
SGLANG_PINS = {"0.5.23": {"compressed_tensors": "0.18.0", "transformers": "5.19.0"}}
pytestmark = pytest.mark.runtime


@pytest.fixture(scope="module")
def loader_python():
    python, info = loader_venv.ensure()
    print(f"loader venv: {info}")
    return python


@pytest.fixture(scope="module")
def k26(tmp_path_factory):
    return cc.generate(
        "target", str(HUB / "moonshotai/Kimi-K2.6"), str(tmp_path_factory.mktemp("k26") / "t")
    )


def decompress(python: Path, *folders) -> tuple[int, dict]:
    # One torch thread: on a machine the other test workers keep busy, torch's second
    # thread spun waiting for its turn and the run took twice the CPU (12.8 CPU-s against 6.3).
    done = subprocess.run(
        [str(python), str(DECOMPRESS), *map(str, folders)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.stdout.strip(), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def test_compressed_tensors_restores_every_int4_weight(loader_python, k26):
    code, report = decompress(loader_python, k26["path"])
    assert code == 0, report
    text = k26["config"]["text_config"]
    moe_layers = text["num_hidden_layers"] - text["first_k_dense_replace"]
    result = report["results"][k26["path"]]
    assert result["format"] == "pack-quantized"
    assert result["quantized"] == moe_layers * text["n_routed_experts"] * 3
    # Every BF16 projection the ignore list covers: 5 MLA projections per layer, the dense
    # layer's MLP, each MoE layer's shared expert, lm_head.
    layers, dense = text["num_hidden_layers"], text["first_k_dense_replace"]
    assert result["bf16_ignored"] == 5 * layers + 3 * dense + 3 * moe_layers + 1
    versions = report["versions"]
    pins = SGLANG_PINS[cv.pinned_version()]
    assert versions["compressed_tensors"] == pins["compressed_tensors"]
    assert versions["transformers"] == pins["transformers"]
    assert versions["torch"] == cv.TORCH.split("==")[1]


def broken(tmp_path: Path, name: str, specs: list) -> Path:
    """A checkpoint of the tiny K2.6 config holding only the given tensors."""
    folder = tmp_path / name
    folder.mkdir()
    made = cc.plan("target", str(HUB / "moonshotai/Kimi-K2.6"), None, 8)
    (folder / cc.CONFIG).write_text(json.dumps(made["config"]))
    head, ordered = safetensors_header(specs)
    with open(folder / cc.WEIGHTS, "wb") as handle:
        handle.write(head)
        for spec in ordered:
            for chunk in cc.tensor_chunks(0, *spec):
                handle.write(chunk)
    return folder


def packed(module: str, out: int, inp: int, recorded: list[int]) -> list:
    return [
        (f"{module}.weight_packed", "I32", [out, inp // 8], "packed"),
        (f"{module}.weight_scale", "BF16", [out, inp // 32], "scale"),
        (f"{module}.weight_shape", "I32", [2], ("int32", recorded)),
    ]


def test_the_decompressor_check_fails_on_broken_checkpoints(loader_python, tmp_path):
    expert = "language_model.model.layers.1.mlp.experts.0.gate_proj"
    attention = "language_model.model.layers.1.self_attn.q_a_proj"
    wrong_shape = broken(tmp_path, "shape", packed(expert, 2048, 256, [2048, 512]))
    ignored = broken(tmp_path, "ignored", packed(attention, 256, 256, [256, 256]))
    unignored = broken(
        tmp_path,
        "bf16",
        [
            (
                "language_model.model.layers.1.mlp.experts.0.up_proj.weight",
                "BF16",
                [2048, 256],
                "weight",
            )
        ],
    )
    good = broken(tmp_path, "good", packed(expert, 2048, 256, [2048, 256]))
    code, report = decompress(loader_python, wrong_shape, ignored, unignored, good)
    results = report.get("results", {})
    assert code == 1, report
    assert results[str(wrong_shape)]["failed"].startswith(expert)
    assert "the ignore list names it" in results[str(ignored)]["failed"]
    assert "no ignore entry names" in results[str(unignored)]["failed"]
    assert results[str(good)] == {"quantized": 1, "bf16_ignored": 0, "format": "pack-quantized"}
