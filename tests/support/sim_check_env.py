"""`python -m sglang.check_env` of the test runtimes (tests/support/fake_sglang.py ships it as
sglang/check_env.py): what sglang 0.5.23's python/sglang/check_env.py prints, one `key: value`
line each in its order (Python, CUDA available, the GPUs by name and their compute capability,
CUDA_HOME, PyTorch, the versions of its PACKAGE_LIST, NVIDIA Topology, ulimit soft), read from
the test host's own tools instead of torch, which the test runtimes lack: the GPUs from
`nvidia-smi --query-gpu` and the topology from `nvidia-smi topo -m` (the fake nvidia-smi that
replays real captures). Standard library only.

SGLANG_SIM_CHECK_ENV=fail makes it exit 1 with a traceback on stderr, =hang makes it sleep (a
CUDA initialisation that never returns), as a broken runtime's check_env would."""

from __future__ import annotations

import importlib.metadata
import os
import resource
import subprocess
import sys
import time
from collections import OrderedDict

# sglang 0.5.23's PACKAGE_LIST (python/sglang/check_env.py), in its order.
PACKAGE_LIST = [
    "sglang",
    "sglang-kernel",
    "flashinfer_python",
    "flashinfer_cubin",
    "flashinfer_jit_cache",
    "triton",
    "transformers",
    "torchao",
    "numpy",
    "aiohttp",
    "fastapi",
    "huggingface_hub",
    "interegular",
    "modelscope",
    "orjson",
    "outlines",
    "packaging",
    "psutil",
    "pydantic",
    "python-multipart",
    "pyzmq",
    "uvicorn",
    "uvloop",
    "vllm",
    "xgrammar",
    "openai",
    "tiktoken",
    "anthropic",
    "litellm",
    "torchcodec",
]


def smi(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", *args], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def device_info() -> dict:
    """As check_env's get_device_info: GPU ids by name, then by compute capability."""
    listing = smi("--query-gpu=index,name,compute_cap", "--format=csv,noheader")
    if not listing:
        return {"CUDA available": False}
    names: dict[str, list[str]] = OrderedDict()
    capabilities: dict[str, list[str]] = OrderedDict()
    for line in listing.strip().splitlines():
        index, name, capability = (part.strip() for part in line.split(",", 2))
        names.setdefault(name, []).append(index)
        capabilities.setdefault(capability, []).append(index)
    info: dict = {"CUDA available": True}
    for name, ids in names.items():
        info[f"GPU {','.join(ids)}"] = name
    for capability, ids in capabilities.items():
        info[f"GPU {','.join(ids)} Compute Capability"] = capability
    info["CUDA_HOME"] = None
    return info


def package_versions() -> dict:
    versions = {}
    for package in PACKAGE_LIST:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "Module Not Found"
    return versions


def main() -> int:
    mode = os.environ.get("SGLANG_SIM_CHECK_ENV", "")
    if mode == "hang":
        time.sleep(3600)
    if mode == "fail":
        print("Traceback (most recent call last):", file=sys.stderr)
        print("RuntimeError: CUDA driver initialization failed", file=sys.stderr)
        return 1
    info: dict = OrderedDict()
    info["Python"] = sys.version.replace("\n", "")
    info.update(device_info())
    info["PyTorch"] = "not installed (simulated runtime)"
    info.update(package_versions())
    topology = smi("topo", "-m")
    if topology is not None:
        info["NVIDIA Topology"] = "\n" + topology
    info["ulimit soft"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    for key, value in info.items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
