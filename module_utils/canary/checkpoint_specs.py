"""Tensor specifications of a tiny checkpoint: each (name, dtype, shape, fill), appended to a
list in the order a builder names them (module_utils/canary/safetensors_writer.py orders and
writes them)."""

from __future__ import annotations

import math

from ansible.module_utils.plan.capacity import ignored


def add_linear(
    specs: list, prefix: str, module: str, out: int, inp: int, quant: dict | None
) -> None:
    """One Linear module's weight, stored as prefix + module: BF16, or compressed-tensors
    pack-quantized when the config quantizes it (SGLang matches module, without the
    checkpoint's language_model. prefix, against the ignore list)."""
    name = f"{prefix}{module}"
    if quant is None or ignored(module, quant["ignore"]):
        add_weight(specs, name, [out, inp])
        return
    bits, group = quant["bits"], quant["group"]
    # pack_to_int32 (compressors/pack_quantized/helpers.py): each row's values, 32 // bits to
    # an int32 word, dense; weight_shape holds the original [out, in].
    specs.append((f"{name}.weight_packed", "I32", [out, math.ceil(inp * bits / 32)], "packed"))
    specs.append((f"{name}.weight_scale", "BF16", [out, inp // group], "scale"))
    specs.append((f"{name}.weight_shape", "I32", [2], ("int32", [out, inp])))


def add_mlp(specs: list, prefix: str, module: str, width: int, hidden: int, quant: dict | None):
    """A gated MLP (or one expert): gate_proj and up_proj [width, hidden], down_proj."""
    for proj in ("gate_proj", "up_proj"):
        add_linear(specs, prefix, f"{module}.{proj}", width, hidden, quant)
    add_linear(specs, prefix, f"{module}.down_proj", hidden, width, quant)


def add_weight(specs: list, name: str, shape: list[int]) -> None:
    """A BF16 weight of random values (a linear's, an embedding's)."""
    specs.append((f"{name}.weight", "BF16", shape, "weight"))


def add_norm(specs: list, name: str, size: int, fill: str = "ones") -> None:
    specs.append((f"{name}.weight", "BF16", [size], fill))


def add_layer_norm(specs: list, name: str, size: int) -> None:
    specs.append((f"{name}.weight", "BF16", [size], "ones"))
    specs.append((f"{name}.bias", "BF16", [size], "zeros"))


def add_biased(specs: list, name: str, out: int, inp) -> None:
    shape = [out, *inp] if isinstance(inp, list) else [out, inp]
    specs.append((f"{name}.weight", "BF16", shape, "weight"))
    specs.append((f"{name}.bias", "BF16", [out], "zeros"))


def add_vit_blocks(specs: list, prefix: str, depth: int, width: int, mlp: int, names) -> None:
    """ViT blocks as MoonViT and Qwen3-VL store them: two LayerNorms, a fused QKV and an
    output projection, a two-layer MLP, every linear with a bias; names in that order."""
    norm_a, norm_b, qkv, proj, fc_in, fc_out = names
    for block in range(depth):
        b = f"{prefix}.{block}"
        add_layer_norm(specs, f"{b}.{norm_a}", width)
        add_layer_norm(specs, f"{b}.{norm_b}", width)
        add_biased(specs, f"{b}.{qkv}", 3 * width, width)
        add_biased(specs, f"{b}.{proj}", width, width)
        add_biased(specs, f"{b}.{fc_in}", mlp, width)
        add_biased(specs, f"{b}.{fc_out}", width, mlp)
