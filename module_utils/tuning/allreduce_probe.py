"""The all-reduce check's probe: does the runtime's Python import torch, and which GPUs, CUDA
and NCCL does that torch see?

A program, run by library/allreduce_check.py as `<runtime python> -c <this file's source>`
(module_utils/tuning/allreduce.py says why it travels that way). It runs in the runtime environment,
where torch is and Ansible is not: at the top it imports only the standard library, and torch
inside main(). It prints one line, MARKER + JSON, which module_utils/tuning/allreduce.py
parse_probe()
reads (host_helpers.marked_json) with the same MARKER and TORCH_ERROR.
"""

from __future__ import annotations

import json
import sys

MARKER = "ALLREDUCE_PROBE "
# The key of the report when torch cannot be imported; the probe then exits EXIT_NO_TORCH.
TORCH_ERROR = "torch_error"
EXIT_NO_TORCH = 3


def error_text(exc: BaseException) -> str:
    return type(exc).__name__ + ": " + str(exc)


def report_line(info: dict) -> str:
    return MARKER + json.dumps(info)


def main() -> int:
    try:
        import torch
        import torch.distributed as dist
    except Exception as exc:  # ImportError, or a torch that fails to load its libraries
        print(report_line({TORCH_ERROR: error_text(exc)}))
        sys.stdout.flush()
        return EXIT_NO_TORCH
    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gpus": torch.cuda.device_count(),
        "nccl_available": dist.is_available() and dist.is_nccl_available(),
        "nccl": None,
        "gpu_names": [],
    }
    if info["gpus"]:
        info["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(info["gpus"])]
        try:
            info["nccl"] = ".".join(str(part) for part in torch.cuda.nccl.version())
        except Exception as exc:
            info["nccl_error"] = error_text(exc)
    print(report_line(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
