"""Benchmark: weights download and verification throughput against plain baselines.

Serves a generated repository from the local hub on loopback, then measures
1. the weights_download module (snapshot_download in a child, watchdog, manifest) against a
   plain parallel HTTP fetch of the same files with the same number of connections, and
2. the verification hashing (parallel, as the module does it) against single-threaded
   hashlib over the same files.

    .venv/bin/python -m tests.benchmarks.weights_throughput [--files 30] [--mib 32]

Prints the figures and the ratios; exits non-zero when the download ratio is below 0.8.
Numbers depend on the machine: report them with its core count.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from tests.hub_server import LocalHub
from tests.modules import run_module

REPO_ID = "bench/generated"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=30)
    parser.add_argument("--mib", type=int, default=32, help="size of each file")
    parser.add_argument("--workers", type=int, default=8, help="parallel connections")
    args = parser.parse_args()

    import ansible.module_utils

    ansible.module_utils.__path__.append(str(Path(__file__).resolve().parents[2] / "module_utils"))
    from ansible.module_utils.weights import inspect_files

    generator = random.Random(1)
    files = {
        f"shard-{i:03d}.safetensors": generator.randbytes(args.mib << 20) for i in range(args.files)
    }
    total = sum(len(data) for data in files.values())
    with LocalHub() as hub:
        hub.add_repo(REPO_ID, files)
        sha = hub.repos[REPO_ID].sha
        listing = [
            {"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            for name, data in files.items()
        ]
        work = Path(tempfile.mkdtemp(prefix="weights-bench-"))
        try:
            # Plain parallel fetch: the ceiling of what loopback HTTP gives this machine.
            plain_dir = work / "plain"
            plain_dir.mkdir()
            session = requests.Session()
            adapter = requests.adapters.HTTPAdapter(pool_maxsize=args.workers)
            session.mount("http://", adapter)

            def fetch(name: str) -> None:
                url = f"{hub.url}/{REPO_ID}/resolve/{sha}/{name}"
                with session.get(url, stream=True, timeout=60) as response:
                    response.raise_for_status()
                    with open(plain_dir / name, "wb") as handle:
                        for block in response.iter_content(1 << 20):
                            handle.write(block)

            started = time.monotonic()
            with ThreadPoolExecutor(args.workers) as pool:
                list(pool.map(fetch, files))
            plain_seconds = time.monotonic() - started

            # The module, as the weights stage runs it (child process, watchdog, verify).
            os.environ.update(
                HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1"
            )
            module_dir = work / "module"
            result = run_module(
                "weights_download",
                {
                    "repo_id": REPO_ID,
                    "revision": sha,
                    "local_dir": str(module_dir),
                    "files": listing,
                    "python": sys.executable,
                    "status_file": str(work / "state" / "status.json"),
                    "log_file": str(work / "state" / "download.log"),
                    "max_workers": args.workers,
                    "poll_interval": 0.5,
                },
            )
            if result.get("failed"):
                print(result["msg"], file=sys.stderr)
                return 2
            module_seconds = result["download_seconds"]

            # Hashing: the module's parallel verification against one thread of hashlib,
            # alternating, best of three each (the files are in the page cache for both).
            cores = os.cpu_count() or 1

            def single() -> None:
                for name in files:
                    digest = hashlib.sha256()
                    with open(plain_dir / name, "rb") as handle:
                        while block := handle.read(8 << 20):
                            digest.update(block)

            single_times, parallel_times = [], []
            for _ in range(3):
                started = time.monotonic()
                single()
                single_times.append(time.monotonic() - started)
                started = time.monotonic()
                checked = inspect_files(str(plain_dir), listing, sha, "full", cores)
                parallel_times.append(time.monotonic() - started)
            single_seconds, parallel_seconds = min(single_times), min(parallel_times)
            assert not checked["stale"] and not checked["missing"]
        finally:
            shutil.rmtree(work, ignore_errors=True)

    mib = total / (1 << 20)
    ratio = plain_seconds / module_seconds
    print(
        f"repository: {args.files} files, {mib:.0f} MiB, {args.workers} connections, "
        f"{os.cpu_count()} cores"
    )
    print(f"plain parallel HTTP fetch: {mib / plain_seconds:8.1f} MiB/s ({plain_seconds:.2f} s)")
    print(f"weights_download module:   {mib / module_seconds:8.1f} MiB/s ({module_seconds:.2f} s)")
    print(f"download ratio (module / plain): {ratio:.2f} (target >= 0.8)")
    print(f"sha256 single thread:       {mib / single_seconds:8.1f} MiB/s")
    print(f"sha256 parallel ({os.cpu_count()} workers): {mib / parallel_seconds:8.1f} MiB/s")
    print(f"hashing ratio (parallel / single): {single_seconds / parallel_seconds:.2f}")
    return 0 if ratio >= 0.8 else 1


if __name__ == "__main__":
    sys.exit(main())
