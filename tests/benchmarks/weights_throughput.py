"""Benchmark: the weights_download module's two transfers against a plain fetch, and hashing.

A generated repository (default 32 files of 128 MiB, 4 GiB) is served on loopback by the local
hub in a process of its own (`python -m tests.support.hub_server`), with LFS files redirected to its
storage origin as huggingface.co redirects them to its CDN. Each round downloads the whole
repository into an empty folder four ways, in an order shuffled for each round (seeded, so a
rerun uses the same orders), each after `sync` so that no run inherits another's dirty pages:

- baseline: the plainest parallel fetch, in a Python process of its own: one GET per file
  (urllib, following the redirect), the same number of connections as the module, 1 MiB reads
  written straight to the file. No watchdog, no progress, no verification.
- curl: the same GETs by curl (`--parallel`), an independent client, for reference.
- hub: the module with the xet setting left alone, so its download process runs
  huggingface_hub's snapshot_download, which downloads over HTTP here (the local hub offers no
  xet): the default path on a host.
- http: the module with HF_HUB_DISABLE_XET=1, so its download process runs the kit's own
  parallel HTTP transfer with in-file resume: the path the watchdog falls back to after a stall.

What is timed: for baseline and curl, from starting the process to its exit. For the module,
`download_seconds` as the module reports it: from starting its download process to noticing
its exit (that process's start-up, huggingface_hub's API calls and HEADs included; the check
before and the sha256 verification after are not; those are `hash_seconds` and the module's
whole wall time, reported beside it). The ratio of a path is baseline seconds / its seconds in
the same round (1.0: as fast as the plain fetch; above 1: faster); its CPU ratio is the same
quotient of CPU seconds (1.0: as much CPU per byte as the plain fetch). Beside each time: the CPU
seconds of the process that downloaded and of the hub process (far less disturbed by other load
on the machine than wall time), and the 1-minute load average at its start. A warm-up round is
run first and not counted. A last part compares the module's parallel verification hashing
with one thread of hashlib over the same files (in the page cache).

    .venv/bin/python -m tests.benchmarks.weights_throughput [--files 32] [--mib 128]
        [--workers 8] [--rounds 5] [--json FILE] [--csv FILE]

Prints the figures and the median ratios; exits non-zero when the median ratio of the kit's
own transfer is below --min-ratio (0.8). Numbers depend on the machine: report its cores.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import platform
import random
import resource
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
REPO_ID = "bench/generated"
PATHS = ("baseline", "curl", "hub", "http")
COLUMNS = [
    "round",
    "position",
    "path",
    "seconds",
    "bytes",
    "cpu_seconds",
    "hub_cpu_seconds",
    "load_1m",
    "hash_seconds",
    "wall_seconds",
    "redirects",
    "storage_gets",
]


def generate(folder: Path, files: int, mib: int) -> None:
    """Random shards (incompressible, no two alike) and a small config, written in pieces."""
    folder.mkdir(parents=True)
    for index in range(files):
        with open(folder / f"model-{index + 1:05d}-of-{files:05d}.safetensors", "wb") as out:
            for _ in range(mib):
                out.write(os.urandom(1 << 20))
    (folder / "config.json").write_text('{"model_type": "bench"}\n')


class HubProcess:
    """tests.support.hub_server in its own interpreter; its request log is read between runs."""

    def __init__(self, folder: Path, timeout: float):
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.hub_server",
                "--repo",
                REPO_ID,
                "--dir",
                str(folder),
            ],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.info = json.loads(self._line(timeout))

    def _line(self, timeout: float) -> str:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            self.stop()
            raise RuntimeError(f"the hub process said nothing within {timeout:.0f}s")
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the hub process exited with {self.process.wait(10)}")
        return line

    def requests(self) -> list[dict]:
        """The requests logged since the last call."""
        self.process.stdin.write("requests\n")
        self.process.stdin.flush()
        return json.loads(self._line(60))

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def fetch_main(argv: list[str]) -> int:
    """The baseline, run as its own process: GET every file with N connections."""
    import urllib.request

    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True, help="the /resolve/{sha} URL of the repo")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("names", nargs="+")
    args = parser.parse_args(argv)

    def fetch(name: str) -> None:
        with (
            urllib.request.urlopen(f"{args.base}/{name}", timeout=60) as response,  # noqa: S310
            open(args.out / name, "wb") as handle,
        ):
            while block := response.read(1 << 20):
                handle.write(block)

    with ThreadPoolExecutor(args.workers) as pool:
        list(pool.map(fetch, args.names))
    return 0


def children_cpu() -> float:
    """CPU seconds of this process's reaped children (the download processes)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_fetch(hub: HubProcess, out: Path, workers: int, kind: str, timeout: float) -> dict:
    names = [entry["path"] for entry in hub.info["files"]]
    base = f"{hub.info['url']}/{REPO_ID}/resolve/{hub.info['sha']}"
    if kind == "curl":
        command = ["curl", "--silent", "--show-error", "--fail", "--location", "--parallel"]
        command += ["--parallel-max", str(workers), "--max-time", str(int(timeout))]
        for name in names:
            command += ["--output", str(out / name), f"{base}/{name}"]
    else:
        command = [sys.executable, "-m", "tests.benchmarks.weights_throughput", "fetch"]
        command += ["--base", base, "--out", str(out), "--workers", str(workers), *names]
    out.mkdir(parents=True)
    cpu = children_cpu()
    started = time.monotonic()
    subprocess.run(command, cwd=REPO_ROOT, capture_output=True, timeout=timeout, check=True)
    seconds = time.monotonic() - started
    written = sum((out / name).stat().st_size for name in names)
    return {"seconds": seconds, "bytes": written, "cpu_seconds": children_cpu() - cpu}


def run_module_once(hub: HubProcess, path: str, work: Path, workers: int) -> dict:
    from tests.support.modules import run_module

    environment = dict(os.environ)
    os.environ.update(HF_ENDPOINT=hub.info["url"], HF_HUB_DISABLE_TELEMETRY="1")
    os.environ.pop("HF_TOKEN", None)
    if path == "http":
        os.environ["HF_HUB_DISABLE_XET"] = "1"
    else:
        os.environ.pop("HF_HUB_DISABLE_XET", None)  # left alone: the host's default
    try:
        cpu = children_cpu()
        started = time.monotonic()
        result = run_module(
            "weights_download",
            {
                "repo_id": REPO_ID,
                "revision": hub.info["sha"],
                "local_dir": str(work / "module"),
                "files": hub.info["files"],
                "python": sys.executable,
                "status_file": str(work / "state" / "status.json"),
                "log_file": str(work / "state" / "download.log"),
                "max_workers": workers,
                "poll_interval": 0.5,
                # Bounded: a broken run gives up instead of hanging the benchmark.
                "stall_timeout": 60,
                "max_restarts": 1,
            },
        )
        wall = time.monotonic() - started
        cpu = children_cpu() - cpu
    finally:
        os.environ.clear()
        os.environ.update(environment)
    if result.get("failed"):
        raise RuntimeError(f"weights_download ({path}) failed: {result['msg']}")
    if result["transfers"] != [path] or result["restarts"]:
        raise RuntimeError(f"{path}: ran {result['transfers']} with {result['restarts']} restarts")
    return {
        "seconds": result["download_seconds"],
        "bytes": result["bytes_downloaded"],
        "cpu_seconds": cpu,
        "hash_seconds": result["hash_seconds"],
        "wall_seconds": wall,
    }


def check_requests(requests: list[dict], lfs_files: int) -> dict:
    """What the hub saw during one run: every LFS body from the storage origin, once."""
    at_storage = [
        r
        for r in requests
        if r["origin"] == "storage" and r["method"] == "GET" and r["status"] in (200, 206)
    ]
    if len(at_storage) != lfs_files or any(r["range"] for r in at_storage):
        raise RuntimeError(f"{len(at_storage)} storage GETs for {lfs_files} LFS files")
    return {
        "redirects": sum(1 for r in requests if r["status"] == 302),
        "storage_gets": len(at_storage),
    }


def hashing(folder: Path, listing: list[dict], cores: int) -> tuple[float, float]:
    """Best of three: one thread of hashlib, then the module's parallel verification."""
    from ansible.module_utils.weights.manifest import inspect_files

    def single() -> None:
        for entry in listing:
            digest = hashlib.sha256()
            with open(folder / entry["path"], "rb") as handle:
                while block := handle.read(8 << 20):
                    digest.update(block)

    single_times, parallel_times = [], []
    for _ in range(3):
        started = time.monotonic()
        single()
        single_times.append(time.monotonic() - started)
        started = time.monotonic()
        checked = inspect_files(str(folder), listing, "r" * 40, "full", cores)
        parallel_times.append(time.monotonic() - started)
        if checked["stale"] or checked["missing"]:
            raise RuntimeError(f"hash check disagrees: {checked['stale'] or checked['missing']}")
    return min(single_times), min(parallel_times)


def measure(args: argparse.Namespace, work: Path) -> tuple[list[dict], dict]:
    """All rounds; returns the counted runs and what the hub described (files, hashing)."""
    source = work / "repo"
    started = time.monotonic()
    generate(source, args.files, args.mib)
    print(f"generated {args.files} x {args.mib} MiB in {time.monotonic() - started:.1f}s")
    hub = HubProcess(source, timeout=args.timeout)
    runs: list[dict] = []
    try:
        total = sum(entry["size"] for entry in hub.info["files"])
        lfs = sum(1 for entry in hub.info["files"] if "sha256" in entry)
        hub.requests()  # start each run's log empty
        for round_index in range(args.rounds + 1):
            order = list(PATHS)
            random.Random(round_index).shuffle(order)
            for position, path in enumerate(order, 1):
                target = work / f"run-{path}"
                os.sync()
                load = os.getloadavg()[0]
                hub_cpu = hub.cpu_seconds()
                if path in ("baseline", "curl"):
                    figures = run_fetch(hub, target, args.workers, path, args.timeout)
                else:
                    figures = run_module_once(hub, path, target, args.workers)
                figures["hub_cpu_seconds"] = hub.cpu_seconds() - hub_cpu
                if figures["bytes"] != total:
                    raise RuntimeError(f"{path}: {figures['bytes']} of {total} bytes")
                figures |= check_requests(hub.requests(), lfs)
                shutil.rmtree(target)
                label = f"round {round_index}" if round_index else "warm-up"
                print(
                    f"{label:8s} {path:8s} {figures['seconds']:7.2f}s "
                    f"{total / (1 << 20) / figures['seconds']:8.1f} MiB/s "
                    f"cpu {figures['cpu_seconds']:6.2f}s "
                    f"hub cpu {figures['hub_cpu_seconds']:6.2f}s load {load:.1f}"
                )
                if round_index:
                    runs.append(
                        {
                            "round": round_index,
                            "position": position,
                            "path": path,
                            "load_1m": load,
                            **figures,
                        }
                    )
    finally:
        hub.stop()
    single_seconds, parallel_seconds = hashing(source, hub.info["files"], os.cpu_count() or 1)
    hashing_figures = {"single_seconds": single_seconds, "parallel_seconds": parallel_seconds}
    return runs, {**hub.info, "hashing": hashing_figures}


def summarize(args: argparse.Namespace, runs: list[dict], info: dict) -> dict:
    total = sum(entry["size"] for entry in info["files"])
    mib = total / (1 << 20)
    summary: dict = {
        "repository": {
            "files": len(info["files"]),
            "bytes": total,
            "lfs_files": sum(1 for entry in info["files"] if "sha256" in entry),
            "redirected_to_storage_origin": True,
        },
        "workers": args.workers,
        "rounds": args.rounds,
        "machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
    }
    print(
        f"repository: {len(info['files'])} files, {mib:.0f} MiB, LFS files redirected to the "
        f"storage origin; {args.workers} connections; {os.cpu_count()} cores; medians of "
        f"{args.rounds} rounds"
    )
    for path in PATHS:
        mine = [r for r in runs if r["path"] == path]
        median = statistics.median(r["seconds"] for r in mine)
        summary[path] = {
            "median_seconds": median,
            "median_mib_per_s": mib / median,
            "median_cpu_seconds": statistics.median(r["cpu_seconds"] for r in mine),
            "median_hub_cpu_seconds": statistics.median(r["hub_cpu_seconds"] for r in mine),
        }
        line = (
            f"{path:8s} {median:7.2f}s {mib / median:8.1f} MiB/s "
            f"cpu {summary[path]['median_cpu_seconds']:6.2f}s"
        )
        if path != "baseline":
            pairs = [
                (base, r)
                for r in mine
                for base in runs
                if base["path"] == "baseline" and base["round"] == r["round"]
            ]
            ratios = [base["seconds"] / r["seconds"] for base, r in pairs]
            cpu_ratios = [base["cpu_seconds"] / r["cpu_seconds"] for base, r in pairs]
            summary[path] |= {
                "ratios": ratios,
                "median_ratio": statistics.median(ratios),
                "cpu_ratios": cpu_ratios,
                "median_cpu_ratio": statistics.median(cpu_ratios),
            }
            line += (
                f"  ratio to baseline {statistics.median(ratios):.2f} "
                f"(rounds {min(ratios):.2f}-{max(ratios):.2f}), "
                f"CPU ratio {statistics.median(cpu_ratios):.2f}"
            )
        if path in ("hub", "http"):
            summary[path] |= {
                "median_hash_seconds": statistics.median(r["hash_seconds"] for r in mine),
                "median_wall_seconds": statistics.median(r["wall_seconds"] for r in mine),
            }
        print(line)
    single, parallel = info["hashing"]["single_seconds"], info["hashing"]["parallel_seconds"]
    summary["hashing"] = {
        "single_thread_mib_per_s": mib / single,
        "parallel_mib_per_s": mib / parallel,
        "parallel_workers": os.cpu_count(),
        "ratio": single / parallel,
    }
    print(f"sha256 one thread {mib / single:8.1f} MiB/s, parallel {mib / parallel:8.1f} MiB/s")
    print(f"hashing ratio (parallel / one thread): {single / parallel:.2f}")
    return summary


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "fetch":
        return fetch_main(sys.argv[2:])
    # The kit's module_utils, under the names Ansible ships them with to a module.
    sys.path.insert(0, str(REPO_ROOT))
    import module_utils  # noqa: F401

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=32)
    parser.add_argument("--mib", type=int, default=128, help="size of each file")
    parser.add_argument("--workers", type=int, default=8, help="parallel connections")
    parser.add_argument("--rounds", type=int, default=5, help="counted rounds, after a warm-up")
    parser.add_argument("--min-ratio", type=float, default=0.8)
    parser.add_argument("--json", type=Path, help="write every run and the summary here")
    parser.add_argument("--csv", type=Path, help="write one line per run here")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per download")
    args = parser.parse_args()
    if not shutil.which("curl"):
        parser.error("curl is needed for the reference fetch")

    work = Path(tempfile.mkdtemp(prefix="weights-bench-"))
    try:
        runs, info = measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = summarize(args, runs, info)
    if args.json:
        rounded = json.loads(
            json.dumps({"summary": summary, "runs": runs}),
            parse_float=lambda text: round(float(text), 4),
        )
        args.json.write_text(json.dumps(rounded, indent=2) + "\n")
    if args.csv:
        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, COLUMNS, extrasaction="ignore")
            writer.writeheader()
            for run in runs:
                writer.writerow(
                    {
                        key: round(value, 3) if isinstance(value, float) else value
                        for key, value in ((key, run.get(key, "")) for key in COLUMNS)
                    }
                )
    return 0 if summary["http"]["median_ratio"] >= args.min_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
