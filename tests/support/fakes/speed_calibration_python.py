#!/usr/bin/python3
"""A stand-in for the runtime's Python when it runs module_utils/tuning/speed_calibration.py: test
hosts
have neither GPU nor torch. It runs the program it is given (arguments, deadline, routing, the
record, its check and its atomic write are the program's own) with figures in place of what
torch would measure: the 4.3 TB/s copy and the MoE slice's times of the issue's H200 run,
modelled as a fixed cost plus the touched experts' bytes at 2.7 TB/s. Any other program it runs
with this Python.

FAKE_CALIBRATION_GPU names the GPU (default NVIDIA H200); FAKE_CALIBRATION_LOG, when set, gets
one line per measurement, so a test can count them.
"""

from __future__ import annotations

import importlib.util
import os
import sys

COPY_GBS = 4300.0
READ_GBS = 3900.0
EXPERT_GBS = 2700.0
OVERHEAD_MS = 0.03


def measure(args, routings, deadline):
    program = sys.modules["speed_calibration"]
    if os.environ.get("FAKE_CALIBRATION_LOG"):
        with open(os.environ["FAKE_CALIBRATION_LOG"], "a") as log:
            log.write(program.command_line(args) + "\n")
    copy_bytes = program.COPY_BYTES
    moe_ms = {}
    for tokens, routing in routings.items():
        read = program.experts_touched(routing) * program.EXPERT_BYTES
        moe_ms[tokens] = [OVERHEAD_MS + read / (EXPERT_GBS * 1e6)] * args.repeats
    return {
        "gpu": {
            "name": os.environ.get("FAKE_CALIBRATION_GPU", "NVIDIA H200"),
            "compute_capability": "9.0",
            "memory_mib": 143771,
        },
        "torch": "2.11.0+cu130",
        "copy_bytes": copy_bytes,
        "copy_ms": [2 * copy_bytes / (COPY_GBS * 1e6)] * args.repeats,
        "read_ms": [copy_bytes / (READ_GBS * 1e6)] * args.repeats,
        "kernel": program.KERNEL_GROUPED,
        "launch": "cuda_graph",
        "moe_ms": moe_ms,
    }


def main() -> int:
    if len(sys.argv) < 2 or os.path.basename(sys.argv[1]) != "speed_calibration.py":
        # Any other program: this Python, as the runtime's would run it.
        os.execv(sys.executable, [sys.executable, *sys.argv[1:]])  # noqa: S606
    spec = importlib.util.spec_from_file_location("speed_calibration", sys.argv[1])
    program = importlib.util.module_from_spec(spec)
    sys.modules["speed_calibration"] = program
    spec.loader.exec_module(program)
    return program.main(sys.argv[2:], measure=measure)


if __name__ == "__main__":
    sys.exit(main())
