"""Small, valid safetensors files and model folders for tests: what the SGLang simulator reads
at start-up (tests/support/sglang_sim.py startup_checks) and what a local hub serves as a
repository's weights, without numpy or torch.

The format (safetensors' own): an 8-byte little-endian header length, the JSON header (name ->
dtype, shape, data_offsets into the data that follows, plus __metadata__), then the data. The
bytes of each tensor are given, or zeros, or (int32 tensors) the values given; the same inputs
give the same bytes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

WIDTH = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I64": 8, "U8": 1}


def safetensors_bytes(tensors: dict[str, tuple]) -> bytes:
    """tensors: name -> (dtype, shape) or (dtype, shape, values): values a list of ints for an
    integer tensor (little-endian), or bytes of the tensor's exact size."""
    header: dict = {"__metadata__": {"format": "pt"}}
    chunks, offset = [], 0
    for name in sorted(tensors):
        dtype, shape, *given = tensors[name]
        size = math.prod(shape) * WIDTH[dtype]
        if given and isinstance(given[0], bytes):
            data = given[0]
        elif given:
            data = b"".join(int(v).to_bytes(WIDTH[dtype], "little", signed=True) for v in given[0])
        else:
            data = bytes(size)
        assert len(data) == size, (name, len(data), size)
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        chunks.append(data)
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors aligns the data to 8 bytes
    return len(text).to_bytes(8, "little") + text + b"".join(chunks)


def packed_int4(prefix: str, rows: int, columns: int, group: int = 32) -> dict[str, tuple]:
    """One compressed-tensors pack-quantized INT4 weight as the real checkpoints hold it:
    weight_packed int32 [rows, columns / 8], weight_scale bf16 [rows, columns / group],
    weight_shape int32 [rows, columns]."""
    return {
        f"{prefix}.weight_packed": ("I32", (rows, columns // 8)),
        f"{prefix}.weight_scale": ("BF16", (rows, columns // group)),
        f"{prefix}.weight_shape": ("I32", (2,), [rows, columns]),
    }


QUANTIZATION = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "group_size": 32, "type": "int", "symmetric": True},
        }
    },
    "ignore": ["lm_head"],
}


def tiny_target_config(layers: int = 4, hidden: int = 256, heads: int = 8) -> dict:
    """A K2.6-shaped (KimiK25ForConditionalGeneration: DeepSeek-V3 MLA text model, MoE,
    compressed-tensors INT4) config with small dimensions."""
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "quantization_config": QUANTIZATION,
        "text_config": {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "kimi_k2",
            "vocab_size": 1024,
            "hidden_size": hidden,
            "intermediate_size": 512,
            "moe_intermediate_size": 64,
            "num_hidden_layers": layers,
            "first_k_dense_replace": 1,
            "n_routed_experts": 16,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "num_attention_heads": heads,
            "num_key_value_heads": heads,
            "q_lora_rank": 64,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8,
            "v_head_dim": 16,
            "max_position_embeddings": 8192,
        },
        "vision_config": {"model_type": "moonvit", "hidden_size": 64, "num_attention_heads": 8},
    }


def tiny_dflash_config(target_layers: int = 4, hidden: int = 256) -> dict:
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "dflash",
        "vocab_size": 1024,
        "hidden_size": hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "head_dim": 32,
        "block_size": 8,
        "max_position_embeddings": 8192,
        "dflash_config": {"target_layer_ids": [1, target_layers - 1]},
    }


def tiny_eagle3_config(hidden: int = 256) -> dict:
    return {
        "architectures": ["Eagle3DeepseekV2ForCausalLM"],
        "model_type": "eagle3_mla",
        "vocab_size": 1024,
        "hidden_size": hidden,
        "num_hidden_layers": 1,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "max_position_embeddings": 8192,
    }


def write_folder(folder: Path, config: dict, tensors: dict[str, tuple], shards: int = 1) -> Path:
    """A model folder: config.json, the tensors over `shards` files and, with more than one,
    model.safetensors.index.json naming them."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    names = sorted(tensors)
    if shards == 1:
        (folder / "model.safetensors").write_bytes(safetensors_bytes(tensors))
        return folder
    weight_map = {}
    for index in range(shards):
        shard = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: tensors[name] for name in names[index::shards]}
        (folder / shard).write_bytes(safetensors_bytes(part))
        weight_map.update(dict.fromkeys(part, shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


def target_tensors(config: dict) -> dict[str, tuple]:
    """A handful of the target's tensors: bf16 embeddings and one INT4 expert."""
    text = config.get("text_config", config)
    hidden = text["hidden_size"]
    return {
        "language_model.model.embed_tokens.weight": ("BF16", (text["vocab_size"], hidden)),
        **packed_int4(
            "language_model.model.layers.1.mlp.experts.0.gate_proj",
            text["moe_intermediate_size"],
            hidden,
        ),
    }


def tiny_folders(root: Path) -> dict[str, Path]:
    """A tiny target and its DFlash and EAGLE-3 drafters, as consistent folders."""
    target = tiny_target_config()
    dflash, eagle3 = tiny_dflash_config(), tiny_eagle3_config()
    return {
        "target": write_folder(root / "target", target, target_tensors(target), shards=2),
        "dflash": write_folder(root / "dflash", dflash, {"fc.weight": ("BF16", (256, 512))}),
        "eagle3": write_folder(root / "eagle3", eagle3, {"fc.weight": ("BF16", (256, 768))}),
    }
