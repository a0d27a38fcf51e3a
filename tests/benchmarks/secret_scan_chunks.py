"""CPU of the tests' secret scan (tests/support/secret_scan.py) over a weights-sized file, by
the size of the pieces it reads: every form of every secret is looked for in each piece, so a
piece that stays in the CPU's cache is searched faster.

    .venv/bin/python -m tests.benchmarks.secret_scan_chunks [--mib 64]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from tests.support import secret_scan

SECRETS = {
    "HF token": secret_scan.derived_forms("hf_AbCdEfGh1234567890abcdefghijklmnop"),
    "API key": secret_scan.derived_forms("sk-kimi-0123456789abcdef0123"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="size of the random file")
    args = parser.parse_args()
    chosen = secret_scan.CHUNK
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "weights.bin").write_bytes(os.urandom(args.mib << 20))
        for chunk in sorted({64 << 10, 1 << 20, 8 << 20, chosen}):
            secret_scan.CHUNK = chunk
            started = time.process_time()
            leaks, read = secret_scan.scan([Path(folder)], SECRETS, readable_only=False)
            spent = time.process_time() - started
            mark = " (the scan's)" if chunk == chosen else ""
            print(f"{chunk >> 10:6d} KiB pieces: {spent:.3f} CPU-s for {args.mib} MiB{mark}")
            assert read == 1 and not leaks
    secret_scan.CHUNK = chosen


if __name__ == "__main__":
    main()
