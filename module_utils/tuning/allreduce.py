"""All-reduce bandwidth check: process control and pure logic.

Shared by library/allreduce_check.py and the tests. The module runs two programs with the
runtime environment's Python: module_utils/tuning/allreduce_probe.py (is torch there, how many GPUs
does it see) and module_utils/tuning/allreduce_worker.py (one process per GPU, torch.distributed
all_reduce over NCCL, timed with CUDA events). Everything else here is plain functions over
their output: NCCL log parsing, the bandwidth arithmetic, the baseline comparison and the
messages a user can act on.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass

from ansible.module_utils.host.helpers import group_members, kill_process_group, marked_json
from ansible.module_utils.tuning import allreduce_probe, allreduce_worker
from ansible.module_utils.tuning.allreduce_probe import MARKER as PROBE_MARKER
from ansible.module_utils.tuning.allreduce_probe import TORCH_ERROR

DTYPE_BYTES = 2  # bf16
BASELINE_SCHEMA = 1
# NCCL_DEBUG=INFO for these subsystems prints the transport of every channel connection, the
# NVLS channel count and the NCCL_* variables it took from the environment.
NCCL_DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,GRAPH,ENV"}
# Logging only: dropped from the worker's environment so NCCL logs to stdout, where it is read.
DROPPED_ENV = ("NCCL_DEBUG_FILE",)
KILL_GRACE_S = 5.0


class AllreduceError(Exception):
    """A failure with a message that says what was found, what is needed and how to fix it."""


# --------------------------------------------------------------------------------------------
# Programs run with the runtime Python: module_utils/tuning/allreduce_probe.py and
# allreduce_worker.py.
# They are files of their own so that ruff lints them and tests import them. Importing them here
# makes Ansible ship them in the module's payload (it packs every module_utils file a module
# imports), so they reach the host with the module, in step with it, and allreduce_check needs
# no parameter naming a copied file (copying them like roles/server/files/kimi_supervise.py
# would). They run in the runtime's Python, not the module's, so the module hands over their
# source: the probe with -c, the worker as a file in the module's private (0700) work folder.


def probe_source() -> str:
    return inspect.getsource(allreduce_probe)


def worker_source() -> str:
    return inspect.getsource(allreduce_worker)


# --------------------------------------------------------------------------------------------
# Message sizes and bandwidth arithmetic.


def message_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """min_bytes, 2*min_bytes, ... up to max_bytes (both included when max is on the ladder)."""
    if min_bytes < DTYPE_BYTES or min_bytes % DTYPE_BYTES:
        raise AllreduceError(
            f"min_bytes is {min_bytes}; needed: a positive multiple of {DTYPE_BYTES} "
            "(bf16 elements). Fix: use e.g. 32768 (32 KiB)."
        )
    if max_bytes < min_bytes:
        raise AllreduceError(
            f"max_bytes ({max_bytes}) is below min_bytes ({min_bytes}). Fix: make max_bytes at "
            "least min_bytes, e.g. 1073741824 (1 GiB)."
        )
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= 2
    return sizes


def human_bytes(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def bus_factor(ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth factor 2(n-1)/n."""
    return 2.0 * (ranks - 1) / ranks


def bandwidth_row(nbytes: int, time_us: float, ranks: int) -> dict:
    """One result row; GB/s are 1e9 bytes per second, as nccl-tests reports them."""
    if time_us <= 0:
        raise AllreduceError(f"the worker reported a non-positive time {time_us} us for {nbytes} B")
    algbw = nbytes / (time_us * 1e-6) / 1e9
    return {
        "bytes": nbytes,
        "time_us": round(time_us, 2),
        "algbw_GBps": round(algbw, 2),
        "busbw_GBps": round(algbw * bus_factor(ranks), 2),
    }


def build_results(sizes: list[int], times_us: list[float], ranks: int) -> list[dict]:
    if len(sizes) != len(times_us):
        raise AllreduceError(
            f"the worker reported {len(times_us)} timings for {len(sizes)} message sizes"
        )
    return [bandwidth_row(n, t, ranks) for n, t in zip(sizes, times_us, strict=True)]


def results_csv(results: list[dict]) -> str:
    lines = ["bytes,time_us,algbw_GBps,busbw_GBps"]
    lines += [f"{r['bytes']},{r['time_us']},{r['algbw_GBps']},{r['busbw_GBps']}" for r in results]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# NCCL log parsing (NCCL_DEBUG=INFO). Line prefix: "host:pid:tid [dev] NCCL INFO ..."; the
# captures under tests/ anonymise it to "vm [dev] NCCL INFO ...".

_VIA = re.compile(
    r"NCCL INFO Channel \d+(?:/\d+)? : \d+\[[0-9a-fx]+\] -> \d+\[[0-9a-fx]+\]"
    r"(?: \[(?:send|receive)\])? via (?P<via>.+?)\s*$"
)
_VERSION = re.compile(r"NCCL INFO NCCL version (?P<version>\S+)")
_FROM_ENV = re.compile(
    r"NCCL INFO (?P<name>NCCL_[A-Z0-9_]+) set by environment to (?P<value>.*?)\.?$"
)
_CHANNELS = re.compile(r"NCCL INFO (?P<summary>\d+ coll channels.*)$")
_NVLS_CHANNELS = re.compile(r"(\d+) nvls channels")
_WARN = re.compile(r"NCCL WARN (?P<text>.*)$")


def normalise_transport(via: str) -> str:
    """'P2P/CUMEM/read' -> 'P2P/CUMEM', 'SHM/direct/direct' -> 'SHM', 'NET/IB/0/GDRDMA' ->
    'NET/IB': the transport, without per-connection details."""
    parts = via.split("/")
    if parts[0] in ("P2P", "NET") and len(parts) > 1:
        return f"{parts[0]}/{parts[1]}"
    return parts[0]


def parse_nccl_log(text: str) -> dict:
    """What NCCL said about itself: version, transports per channel connection (CollNet shows
    as its own 'via' transport), the NVLS channel count, the NCCL_* variables it read from the
    environment, and its warnings."""
    transports: dict[str, int] = {}
    examples: list[str] = []
    version = None
    from_env: dict[str, str] = {}
    warnings: list[str] = []
    nvls_channels = 0
    for raw in text.splitlines():
        line = raw.rstrip()
        if "NCCL " not in line:
            continue
        match = _VIA.search(line)
        if match:
            name = normalise_transport(match.group("via"))
            transports[name] = transports.get(name, 0) + 1
            if len(examples) < 8:
                examples.append(line[line.index("NCCL INFO") :])
            continue
        match = _VERSION.search(line)
        if match:
            version = version or match.group("version")
            continue
        match = _FROM_ENV.search(line)
        if match:
            from_env[match.group("name")] = match.group("value").strip()
            continue
        match = _CHANNELS.search(line)
        if match:
            # NCCL prints its ring channel count as "collnet channels" too: only NVLS is read.
            nvls = _NVLS_CHANNELS.search(match.group("summary"))
            nvls_channels = max(nvls_channels, int(nvls.group(1)) if nvls else 0)
            continue
        match = _WARN.search(line)
        if match and match.group("text") not in warnings:
            warnings.append(match.group("text"))
    if nvls_channels:
        transports["NVLS"] = transports.get("NVLS", 0) + nvls_channels
    return {
        "nccl_version": version,
        "transports": transports,
        "transport": summarise_transports(transports),
        "transport_lines": examples,
        "nccl_env_reported": from_env,
        "nccl_warnings": warnings,
    }


def summarise_transports(transports: dict[str, int]) -> str | None:
    """The transport NCCL chose, most used first ('P2P/CUMEM', or 'P2P/CUMEM, SHM')."""
    if not transports:
        return None
    ordered = sorted(transports.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(name for name, _ in ordered)


# --------------------------------------------------------------------------------------------
# Environment of the programs run with the runtime Python.


def env_value(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def worker_environment(base: dict[str, str], nccl_env: dict | None) -> dict[str, str]:
    """base + nccl_env (as the server gets it) + NCCL_DEBUG=INFO so the transport can be read."""
    env = dict(base)
    env.update({str(k): env_value(v) for k, v in (nccl_env or {}).items()})
    for name in DROPPED_ENV:
        env.pop(name, None)
    env.update(NCCL_DEBUG_ENV)
    env["PYTHONUNBUFFERED"] = "1"
    return env


# --------------------------------------------------------------------------------------------
# Running a program in its own process group, with a deadline.


@dataclass
class ProcessResult:
    rc: int | None
    output: str  # stdout and stderr, interleaved as written (NCCL logs to stdout)
    timed_out: bool
    killed_pids: list[int]
    elapsed_s: float


def kill_group(proc: subprocess.Popen, grace_s: float = KILL_GRACE_S) -> list[int]:
    """SIGTERM the whole process group, SIGKILL what is left after grace_s. Returns the PIDs
    that were in the group when it was signalled."""
    members = group_members(proc.pid) or [proc.pid]
    # The leader is our child: until it is reaped its zombie keeps the group in existence, and
    # kill_process_group would wait out the whole grace period. Reap it while that waits.
    reaper = threading.Thread(target=_reap, args=(proc, 2 * grace_s + 1), daemon=True)
    reaper.start()
    kill_process_group(proc.pid, grace_s)
    _reap(proc, grace_s)
    return members


def _reap(proc: subprocess.Popen, timeout_s: float) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout_s)


def run_in_group(
    command: list[str], env: dict[str, str], timeout_s: float, workdir: str, name: str = "run"
) -> ProcessResult:
    """Run command in a new session (its own process group) with stdout and stderr in one file,
    so that a hung grandchild holding it open cannot block the read. On timeout the whole
    group is killed; after a normal exit any leftover member of the group is killed too.
    subprocess rather than AnsibleModule.run_command, which has no timeout and cannot kill a
    process group."""
    log_path = os.path.join(workdir, f"{name}.log")
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,
            start_new_session=True,
        )
        timed_out = False
        killed: list[int] = []
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            killed = kill_group(proc)
        else:
            # Children that outlived the worker (should not happen) must not keep GPUs busy.
            if group_members(proc.pid):
                killed = kill_group(proc)
    elapsed = time.monotonic() - started
    with open(log_path, errors="replace") as log:
        output = log.read()
    return ProcessResult(proc.returncode, output, timed_out, killed, elapsed)


# --------------------------------------------------------------------------------------------
# Interpreting the probe and the worker.


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def parse_probe(result: ProcessResult, python: str) -> dict:
    """The probe's JSON, or an AllreduceError that says what is wrong with the runtime Python."""
    info = marked_json(result.output, PROBE_MARKER)
    if info and TORCH_ERROR in info:
        raise AllreduceError(
            f"torch is not importable by {python} ({info[TORCH_ERROR]}). Needed: the runtime "
            "virtual environment's Python, with the CUDA build of PyTorch that the server uses. "
            "Fix: run the runtime stage first, or set python to that environment's "
            "bin/python (e.g. /opt/kimi/venv/bin/python)."
        )
    if result.rc != 0 or info is None:
        said = tail(result.output) or "(no output)"
        raise AllreduceError(
            f"`{python} -c <probe>` exited {result.rc} without reporting torch's view of the "
            f"GPUs. It said:\n{said}\nNeeded: a Python 3 that imports torch. Fix: run it by hand "
            f"(`{python} -c 'import torch; print(torch.cuda.device_count())'`) and repair what "
            "it reports."
        )
    return info


def check_probe(info: dict, python: str) -> None:
    """Fail on a torch that cannot run an NCCL all-reduce at all (no CUDA, no NCCL)."""
    if not info.get("gpus"):
        build = (
            "a CPU-only build (torch.version.cuda is None)"
            if info.get("cuda") is None
            else f"built for CUDA {info.get('cuda')}"
        )
        raise AllreduceError(
            f"torch {info.get('torch')} in {python} ({build}) sees no GPU "
            f"(cuda available: {info.get('cuda_available')}). Needed: at least 2 GPUs visible to "
            "the runtime's torch. Fix: for a CPU-only build install the CUDA wheel the server "
            "uses; otherwise check `nvidia-smi`, the driver (a newer CUDA than the driver "
            "supports fails here), and CUDA_VISIBLE_DEVICES in nccl_env or the environment."
        )
    if not info.get("nccl_available"):
        raise AllreduceError(
            f"torch {info.get('torch')} in {python} has no NCCL backend "
            "(torch.distributed.is_nccl_available() is False). Needed: a Linux CUDA build of "
            "PyTorch, which bundles NCCL. Fix: install the CUDA wheel the server uses."
        )


_PY_ERROR = re.compile(r"^\w+(?:\.\w+)*(?:Error|Exception|Exit)\b.*$")


def worker_failure_message(result: ProcessResult, timeout_s: float, nccl: dict) -> str:
    """The failure message for a worker that timed out or exited non-zero."""
    if result.timed_out:
        killed = ", ".join(str(pid) for pid in result.killed_pids) or "none left"
        return (
            f"The all-reduce worker did not finish within timeout={timeout_s:g}s and was killed "
            f"with its whole process group (SIGTERM, then SIGKILL; PIDs {killed}). A hang here "
            "is usually NCCL waiting on a peer: P2P across PCIe bridges with ACS enabled or an "
            "IOMMU in the way, a GPU stuck in a bad state, or an NVSwitch fabric that is not up. "
            f"NCCL said before it stopped:\n{tail(result.output, 10) or '(nothing)'}\nFix: "
            "check `nvidia-smi topo -m` and `lspci -vvv | grep ACSCtl`; retry with "
            "NCCL_P2P_DISABLE=1 in nccl_env to confirm a P2P problem; raise timeout only if the "
            "host is merely slow."
        )
    errors = [line.strip() for line in result.output.splitlines() if _PY_ERROR.match(line.strip())]
    warnings = nccl["nccl_warnings"]
    said = []
    if warnings:
        said.append("NCCL WARN: " + " | ".join(warnings[-5:]))
    if errors:
        said.append("error: " + " | ".join(dict.fromkeys(errors[-3:])))
    if not said:
        said.append("last output:\n" + (tail(result.output) or "(nothing)"))
    return (
        f"The all-reduce worker exited {result.rc}. " + "\n".join(said) + "\nNeeded: every GPU "
        "able to join one NCCL communicator and all-reduce. Fix: read the NCCL lines above; "
        "out-of-memory means other processes hold the GPUs (stop them first), 'unhandled "
        "system error' or 'remote process exited' usually means P2P or shared memory "
        "(/dev/shm) problems: retry with NCCL_P2P_DISABLE=1 or NCCL_SHM_DISABLE=1 in nccl_env "
        "to locate it."
    )


# --------------------------------------------------------------------------------------------
# Baseline.


def max_size_busbw(results: list[dict]) -> tuple[int, float]:
    last = max(results, key=lambda row: row["bytes"])
    return last["bytes"], last["busbw_GBps"]


def make_baseline(measurement: dict, host: str, recorded_at: str) -> dict:
    nbytes, busbw = max_size_busbw(measurement["results"])
    return {
        "schema": BASELINE_SCHEMA,
        "host": host,
        "recorded_at": recorded_at,
        "gpus": measurement["gpus"],
        "gpu_names": measurement.get("gpu_names", []),
        "transport": measurement.get("transport"),
        "nccl_version": measurement.get("nccl_version"),
        "torch_version": measurement.get("torch_version"),
        "cuda_version": measurement.get("cuda_version"),
        "nccl_env": measurement.get("nccl_env", {}),
        "max_bytes": nbytes,
        "busbw_GBps_max_size": busbw,
        "results": measurement["results"],
    }


def load_baseline(text: str, path: str) -> dict:
    try:
        baseline = json.loads(text)
    except ValueError as exc:
        raise AllreduceError(
            f"The baseline {path} is not JSON ({exc}). Needed: the file this module writes. "
            "Fix: remove it, or run once with update_baseline: true to record a new one."
        ) from exc
    if not isinstance(baseline, dict) or not isinstance(baseline.get("results"), list):
        raise AllreduceError(
            f"The baseline {path} has no 'results' list. Needed: the file this module writes. "
            "Fix: remove it, or run once with update_baseline: true to record a new one."
        )
    return baseline


def baseline_busbw(baseline: dict, nbytes: int) -> float | None:
    for row in baseline.get("results", []):
        if isinstance(row, dict) and row.get("bytes") == nbytes:
            return float(row["busbw_GBps"])
    return None


def compare(baseline: dict, gpus: int, results: list[dict], path: str) -> dict:
    """Drop of bus bandwidth at the largest size against the baseline, in percent (positive:
    slower than the baseline). Raises when the two cannot be compared."""
    nbytes, busbw = max_size_busbw(results)
    if baseline.get("gpus") != gpus:
        raise AllreduceError(
            f"The baseline {path} was recorded with {baseline.get('gpus')} GPUs; this run used "
            f"{gpus}. Bus bandwidths of different GPU counts are not comparable. Fix: if the "
            "host's GPUs changed on purpose, record a new baseline with update_baseline: true."
        )
    reference = baseline_busbw(baseline, nbytes)
    if reference is None or reference <= 0:
        raise AllreduceError(
            f"The baseline {path} has no figure for {human_bytes(nbytes)} (the largest size of "
            "this run). Fix: measure the same sizes as the baseline (max_bytes), or record a new "
            "baseline with update_baseline: true."
        )
    drop = (reference - busbw) / reference * 100.0
    return {
        "bytes": nbytes,
        "busbw_GBps": busbw,
        "baseline_busbw_GBps": reference,
        "drop_percent": round(drop, 2),
    }


def drop_message(comparison: dict, baseline: dict, path: str, max_drop: float, now: str) -> str:
    return (
        f"All-reduce bus bandwidth at {human_bytes(comparison['bytes'])} is "
        f"{comparison['busbw_GBps']:.1f} GB/s, {comparison['drop_percent']:.1f}% below the "
        f"baseline {comparison['baseline_busbw_GBps']:.1f} GB/s recorded "
        f"{baseline.get('recorded_at', 'earlier')} in {path} (allowed: {max_drop:g}%). "
        f"Transport now: {now}; in the baseline: {baseline.get('transport')}. Fix: look for a "
        "changed NCCL environment (nccl_env, NCCL_P2P_DISABLE, NCCL_P2P_LEVEL), degraded "
        "links (`nvidia-smi topo -m`, `nvidia-smi nvlink -s`, PCIe link width/gen in "
        "`nvidia-smi -q`), other processes on the GPUs, or a stopped nvidia-fabricmanager; if "
        "the new figure is expected (different hardware or driver), re-record it with "
        "update_baseline: true."
    )
