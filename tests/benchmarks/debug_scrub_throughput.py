"""Benchmark: what scrubbing costs the debug collection and the bundle.

Generates a server log of --mib MiB (SGLang's decode-batch lines, NCCL INFO lines and, every
10000 lines, a line with the API key, the HF token or an Authorization header), then times:

- baseline: gzip of the log's bytes alone (what a collector that scrubbed nothing would pay);
- collector: module_utils/benchmark/debug.py's `end` phase on that log (read, scrub with two
  secrets and the patterns, gzip, NCCL lines, index), no nvidia-smi/dmesg/journalctl on PATH;
- bundle: `analysis.bundle` over a run holding the collector's server.log.gz and a level file
  of the same size (decompress, scrub, recompress, scrub, tar.gz).

    .venv/bin/python -m tests.benchmarks.debug_scrub_throughput [--mib 64] [--rounds 3]

Prints the median seconds and MiB/s of each and the ratio to the baseline, and checks that
no secret is left in the collector's output. Numbers depend on the machine: report its cores.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
API_KEY = "sk-bench-0123456789abcdef0123"
HF_TOKEN = "hf_" + "Ab1" * 12


def make_log(path: Path, mib: int) -> int:
    decode = (
        "[2026-01-01 00:00:00 TP0] Decode batch. #running-req: 64, #token: 123456, token usage: "
        "0.12, cuda graph: True, gen throughput (token/s): 2345.67, #queue-req: 0\n"
    )
    nccl = "node-17:1234:1234 [0] NCCL INFO Channel 00/32 : 0 1 2 3 4 5 6 7 via P2P/CUMEM\n"
    secret_lines = [
        f"server_args=ServerArgs(api_key='{API_KEY}', tp_size=8)\n",
        f"token {HF_TOKEN}\n",
        "echo " + base64.b64encode(f"Bearer {API_KEY}".encode()).decode() + "\n",
    ]
    target = mib << 20
    written = 0
    with path.open("w") as handle:
        i = 0
        while written < target:
            line = nccl if i % 50 == 0 else decode
            if i % 10000 == 0:
                line = secret_lines[(i // 10000) % 3]
            handle.write(line)
            written += len(line)
            i += 1
    return written


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    # First: the kit's stages become importable as ansible.module_utils.<stage>.
    importlib.import_module("module_utils")
    from ansible.module_utils.benchmark.debug import collect

    from analysis.bundle import bundle

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        log = tmp / "sglang.log"
        size = make_log(log, args.mib)
        data = log.read_bytes()
        os.environ["PATH"] = str(tmp / "empty-bin")
        params = {
            "dest": str(tmp / "run" / "h" / "ar" / "debug"),
            "config": "ar",
            "unit_name": "kimi-sglang",
            "manager": "supervisor",
            "log_file": str(log),
            "runtime_record": "",
            "launch_record": "",
            "secrets": [API_KEY, HF_TOKEN],
            "max_bytes": size + (1 << 20),
            "nccl_lines": 2000,
            "command_timeout": 60,
            "timeout": 600,
            "nvidia_smi": "nvidia-smi",
            "journalctl": "journalctl",
            "dmesg": "dmesg",
        }
        collect({**params, "phase": "begin"})
        level = tmp / "run" / "h" / "ar" / "gsm8k" / "c64.json"
        level.parent.mkdir(parents=True)
        level.write_text(json.dumps({"requests": [{"text": data[:size].decode()}]}))
        results = {"baseline": [], "collector": [], "bundle": []}
        env = {"KIMI_SERVER_API_KEY": API_KEY, "HF_TOKEN": HF_TOKEN}
        for round_ in range(args.rounds):
            results["baseline"].append(timed(lambda: gzip.compress(data, mtime=0)))
            results["collector"].append(timed(lambda: collect({**params, "phase": "end"})))
            out = tmp / f"b{round_}.tar.gz"
            results["bundle"].append(
                timed(lambda out=out: bundle(str(tmp / "run"), str(out), environ=env))
            )
        stored = gzip.decompress((Path(params["dest"]) / "server.log.gz").read_bytes())
        assert API_KEY.encode() not in stored and HF_TOKEN.encode() not in stored
    base = statistics.median(results["baseline"])
    print(f"{os.cpu_count()} CPUs; log {size / 2**20:.0f} MiB; median of {args.rounds} rounds")
    for name, times in results.items():
        seconds = statistics.median(times)
        mib = size / 2**20 * (2 if name == "bundle" else 1)
        print(
            f"  {name:9s} {seconds:6.2f} s  {mib / seconds:7.1f} MiB/s  x{seconds / base:.2f} "
            "of the baseline"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
