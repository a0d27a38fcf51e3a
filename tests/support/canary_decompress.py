"""Runs in the loader venv (tests/support/loader_venv.py): compressed-tensors' own decompressor
over tiny canary checkpoints, as transformers' compressed-tensors quantizer reaches it.

    python canary_decompress.py FOLDER...

For each checkpoint folder: the quantization config goes through transformers'
CompressedTensorsConfig and compressed-tensors' ModelCompressor.from_compression_config (what
CompressedTensorsHfQuantizer does), then every module stored as weight_packed / weight_scale /
weight_shape is restored by the pack-quantized compressor's own decompress to a BF16 weight of
the shape weight_shape records, checked against an independent unpacking (int4 nibbles,
offset 8, times the group's scale). Each stored name is checked against the config's ignore
list with compressed-tensors' own match_name: a packed module must not be ignored, and every
BF16 projection weight of the text model (attention, dense MLP, shared experts, lm_head) must
be. Prints one JSON object: per folder the counts, or the first failure.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from compressed_tensors.compressors import BaseCompressor, ModelCompressor
from compressed_tensors.utils.match import match_name
from safetensors import safe_open
from transformers.utils.quantization_config import CompressedTensorsConfig


def projection(module: str) -> bool:
    """A Linear module of the text model (what the config's "Linear" target means): the
    *_proj layers (kv_a_proj_with_mqa too) and lm_head."""
    leaf = module.rsplit(".", 1)[-1]
    return "_proj" in leaf or leaf == "lm_head"


def quantization(config: dict) -> dict:
    text = config.get("text_config", config)
    return text.get("quantization_config") or config.get("quantization_config")


def reference(
    packed: torch.Tensor, scale: torch.Tensor, shape: list[int], bits: int
) -> torch.Tensor:
    """pack_to_int32's layout read independently: value j of a row is bits j*bits.. of the
    row's words (little end first), stored with an offset of 2^(bits-1), times its group's
    scale, rounded to BF16 once (the product of an int4 and a BF16 scale is exact in FP32)."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    values = ((packed.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).reshape(shape[0], -1)
    values = values[:, : shape[1]] - (1 << (bits - 1))
    group = shape[1] // scale.shape[1]
    product = values.to(torch.float32) * scale.to(torch.float32).repeat_interleave(group, dim=1)
    return product.to(torch.bfloat16)


def check(folder: Path) -> dict:
    config = json.loads((folder / "config.json").read_text())
    quant = quantization(config)
    if quant is None:
        return {"quantized": 0, "bf16_ignored": 0, "note": "no quantization_config"}
    compressor = ModelCompressor.from_compression_config(CompressedTensorsConfig(**quant))
    qconfig = compressor.quantization_config
    (scheme,) = qconfig.config_groups.values()
    pack = BaseCompressor.get_value_from_registry(qconfig.format)
    ignore = list(qconfig.ignore or [])
    bits = scheme.weights.num_bits
    quantized = bf16_ignored = 0
    with safe_open(str(folder / "model.safetensors"), "pt") as handle:
        names = list(handle.keys())
        packed_modules = sorted(n.rsplit(".", 1)[0] for n in names if n.endswith(".weight_packed"))
        for module in packed_modules:
            state = {
                key: handle.get_tensor(f"{module}.{key}")
                for key in ("weight_packed", "weight_scale", "weight_shape")
            }
            shape = state["weight_shape"].tolist()
            try:
                weight = pack.decompress(state, scheme)["weight"]
            except (RuntimeError, ValueError, IndexError) as error:
                return {"failed": f"{module}: decompress raised {type(error).__name__}: {error}"}
            if list(weight.shape) != shape or weight.dtype != torch.bfloat16:
                return {"failed": f"{module}: {tuple(weight.shape)} {weight.dtype}, not {shape}"}
            if not torch.isfinite(weight.to(torch.float32)).all():
                return {"failed": f"{module}: non-finite values"}
            expected = reference(state["weight_packed"], state["weight_scale"], shape, bits)
            if not torch.equal(weight.view(torch.int16), expected.view(torch.int16)):
                return {"failed": f"{module}: differs from the independent unpacking"}
            sglang_name = module.removeprefix("language_model.")
            if any(match_name(sglang_name, target) for target in ignore):
                return {"failed": f"{module} is packed but the ignore list names it"}
            quantized += 1
        for name in names:
            module, _, param = name.rpartition(".")
            text = module.removeprefix("language_model.")
            if param != "weight" or not projection(text):
                continue
            if text.startswith(("vision_tower.", "mm_projector.", "model.visual.")):
                continue
            if not any(match_name(text, target) for target in ignore):
                return {"failed": f"{name} is BF16 but no ignore entry names {text}"}
            bf16_ignored += 1
    return {"quantized": quantized, "bf16_ignored": bf16_ignored, "format": qconfig.format}


def main() -> int:
    results = {folder: check(Path(folder)) for folder in sys.argv[1:]}
    versions = {
        "torch": torch.__version__,
        "compressed_tensors": __import__("compressed_tensors").__version__,
        "transformers": __import__("transformers").__version__,
    }
    print(json.dumps({"results": results, "versions": versions}))
    return 1 if any("failed" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
