"""The tiny K2.6 canary checkpoint on a real GPU (run_canary_h200.sh runs this).

1. Generates the tiny K2.6 target and its DFlash and EAGLE-3 drafters with the kit's own
   module_utils/canary/checkpoint.py (TP 8, seed 0, as the canary stage does), timing each.
2. Makes a text-only view of the target: text_config as config.json (DeepseekV3ForCausalLM,
   model_type deepseek_v3: transformers has no kimi_k2 type), the language model's tensors
   without their "language_model." prefix, the vision tower left out. Same bytes otherwise.
3. Loads it with transformers' DeepseekV3 class, first as it is (from_pretrained with the
   compressed-tensors quantizer, which has to take per-expert weight_packed tensors into
   transformers 5's fused experts); if that fails, decompresses the INT4 experts with
   compressed-tensors' own pack-quantized compressor first and loads the BF16 result. It
   prints which path worked, and the missing or unexpected keys of each.
4. Runs forward passes on the GPU and prints the logits' shape, whether they are finite, and
   the timings.

Every step prints one line "RESULT {json}"; the last is the summary. Standard library plus
torch, transformers, safetensors and compressed-tensors (its wheel travels: the H200 image has
none). Runs here too without a GPU (--device cpu), to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HUB = REPO / "tests" / "fixtures" / "hub-repos"
REPOS = {
    "target": "moonshotai/Kimi-K2.6",
    "dflash": "z-lab/Kimi-K2.6-DFlash",
    "eagle3": "lightseekorg/kimi-k2.6-eagle3.1-mla",
}


def report(step: str, **fields) -> dict:
    record = {"step": step, **fields}
    print("RESULT " + json.dumps(record, default=str), flush=True)
    return record


def kit_module():
    """module_utils/canary/checkpoint.py as Ansible ships it (ansible.module_utils.*), without
    Ansible installed: a namespace package over the repository's module_utils/."""
    try:
        import ansible.module_utils as module_utils
    except ImportError:
        ansible = types.ModuleType("ansible")
        ansible.__path__ = []
        module_utils = types.ModuleType("ansible.module_utils")
        module_utils.__path__ = []
        ansible.module_utils = module_utils
        sys.modules["ansible"], sys.modules["ansible.module_utils"] = ansible, module_utils
    if str(REPO / "module_utils") not in module_utils.__path__:
        module_utils.__path__.append(str(REPO / "module_utils"))
    from ansible.module_utils.canary import checkpoint as canary_checkpoint

    return canary_checkpoint


def generate(work: Path) -> dict:
    cc = kit_module()
    results = {}
    for kind, repo in REPOS.items():
        dest = work / "checkpoints" / repo
        started = time.monotonic()
        result = cc.generate(
            kind,
            str(HUB / repo),
            str(dest),
            target_dir=str(work / "checkpoints" / REPOS["target"]) if kind != "target" else None,
            tp_size=8,
            seed=0,
        )
        results[kind] = result
        report(
            "generate",
            kind=kind,
            repository=repo,
            bytes=result["bytes"],
            tensors=result["tensors"],
            seconds=round(time.monotonic() - started, 2),
            changed=result["changed"],
            digest=result["digest"],
        )
    return results


def text_view(target: Path, dest: Path) -> Path:
    from safetensors import safe_open
    from safetensors.torch import save_file

    config = json.loads((target / "config.json").read_text())
    text = dict(config["text_config"])
    text["architectures"] = ["DeepseekV3ForCausalLM"]
    text["model_type"] = "deepseek_v3"
    text.pop("auto_map", None)  # the remote code is not there; transformers' own class is used
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(text, indent=2))
    tensors = {}
    with safe_open(str(target / "model.safetensors"), "pt") as handle:
        for name in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
            if name.startswith("language_model."):
                tensors[name.removeprefix("language_model.")] = handle.get_tensor(name)
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    report("text_view", folder=str(dest), tensors=len(tensors))
    return dest


def decompressed(view: Path, dest: Path) -> Path:
    """The text view with every weight_packed module restored to BF16 by compressed-tensors."""
    from compressed_tensors.compressors import BaseCompressor, ModelCompressor
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers.utils.quantization_config import CompressedTensorsConfig

    config = json.loads((view / "config.json").read_text())
    qconfig = ModelCompressor.from_compression_config(
        CompressedTensorsConfig(**config.pop("quantization_config"))
    ).quantization_config
    (scheme,) = qconfig.config_groups.values()
    pack = BaseCompressor.get_value_from_registry(qconfig.format)
    tensors, restored = {}, 0
    with safe_open(str(view / "model.safetensors"), "pt") as handle:
        names = list(handle.keys())
        for name in names:
            if name.endswith((".weight_scale", ".weight_shape")):
                continue
            if name.endswith(".weight_packed"):
                module = name.removesuffix(".weight_packed")
                state = {
                    key: handle.get_tensor(f"{module}.{key}")
                    for key in ("weight_packed", "weight_scale", "weight_shape")
                }
                tensors[f"{module}.weight"] = pack.decompress(state, scheme)["weight"]
                restored += 1
            else:
                tensors[name] = handle.get_tensor(name)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    report("decompress", folder=str(dest), restored=restored)
    return dest


def load(folder: Path, device: str, path: str):
    import torch
    from transformers import AutoModelForCausalLM

    started = time.monotonic()
    model, info = AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.bfloat16, output_loading_info=True
    )
    model = model.to(device).eval()
    if device == "cuda":
        torch.cuda.synchronize()
    loading = {key: sorted(value)[:20] for key, value in info.items() if value}
    report(
        "load",
        path=path,
        cls=type(model).__name__,
        seconds=round(time.monotonic() - started, 2),
        loading_info=loading,
        parameters=sum(p.numel() for p in model.parameters()),
    )
    if info.get("missing_keys") or info.get("mismatched_keys"):
        raise RuntimeError(f"incomplete load: {loading}")
    return model


def experts_match(model, view: Path) -> dict:
    """Whether the loaded model holds the checkpoint's experts: layer 1's expert 0 against
    compressed-tensors' own decompression of the same packed tensors (transformers 5 fuses
    the experts: gate_up_proj [experts, 2 x width, hidden], gate first; down_proj)."""
    import torch
    from compressed_tensors.compressors import BaseCompressor, ModelCompressor
    from safetensors import safe_open
    from transformers.utils.quantization_config import CompressedTensorsConfig

    config = json.loads((view / "config.json").read_text())
    qconfig = ModelCompressor.from_compression_config(
        CompressedTensorsConfig(**config["quantization_config"])
    ).quantization_config
    (scheme,) = qconfig.config_groups.values()
    pack = BaseCompressor.get_value_from_registry(qconfig.format)
    experts = model.model.layers[1].mlp.experts
    width = config["moe_intermediate_size"]
    loaded = {
        "gate_proj": experts.gate_up_proj[0, :width],
        "up_proj": experts.gate_up_proj[0, width:],
        "down_proj": experts.down_proj[0],
    }
    same = {}
    with safe_open(str(view / "model.safetensors"), "pt") as handle:
        for proj, tensor in loaded.items():
            module = f"model.layers.1.mlp.experts.0.{proj}"
            state = {
                key: handle.get_tensor(f"{module}.{key}")
                for key in ("weight_packed", "weight_scale", "weight_shape")
            }
            expected = pack.decompress(state, scheme)["weight"]
            same[proj] = bool(torch.equal(tensor.detach().cpu(), expected))
    return report("experts_match", layer=1, expert=0, equal=same)


def forward(model, device: str, vocab: int) -> dict:
    import torch

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (2, 64), generator=generator).to(device)
    timings = []
    with torch.inference_mode():
        for _ in range(6):
            if device == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            logits = model(input_ids=ids).logits
            if device == "cuda":
                torch.cuda.synchronize()
            timings.append(time.perf_counter() - started)
    return report(
        "forward",
        logits_shape=list(logits.shape),
        dtype=str(logits.dtype),
        finite=bool(torch.isfinite(logits).all()),
        max_abs=float(logits.float().abs().max()),
        first_ms=round(timings[0] * 1e3, 2),
        warm_ms=round(min(timings[1:]) * 1e3, 2),
        memory_gib=round(torch.cuda.max_memory_allocated() / 2**30, 3)
        if device == "cuda"
        else None,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "canary-h200")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--generate-only", action="store_true")
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    generated = generate(args.work)
    summary = {
        "sizes": {kind: result["bytes"] for kind, result in generated.items()},
        "path": None,
        "failures": {},
    }
    if args.generate_only:
        report("summary", **summary)
        return 0
    import compressed_tensors
    import torch
    import transformers

    report(
        "environment",
        python=sys.version.split()[0],
        torch=torch.__version__,
        cuda=torch.version.cuda,
        transformers=transformers.__version__,
        compressed_tensors=compressed_tensors.__version__,
        gpu=torch.cuda.get_device_name(0) if args.device == "cuda" else None,
    )
    view = text_view(Path(generated["target"]["path"]), args.work / "text")
    vocab = generated["target"]["config"]["text_config"]["vocab_size"]
    for path in ("compressed-tensors quantizer", "decompressed to bf16 first"):
        try:
            folder = (
                view if path.startswith("compressed") else decompressed(view, args.work / "bf16")
            )
            model = load(folder, args.device, path)
            summary["experts_match"] = experts_match(model, view)["equal"]
            summary["forward"] = forward(model, args.device, vocab)
            summary["path"] = path
            break
        except Exception as error:  # each way of loading is tried in turn; the report says why
            summary["failures"][path] = f"{type(error).__name__}: {str(error)[:2000]}"
            report("failed", path=path, error=summary["failures"][path])
            traceback.print_exc()
    report("summary", **summary)
    ok = (
        summary["path"] is not None
        and summary["forward"]["finite"]
        and all(summary["experts_match"].values())
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
