"""One run of the all-reduce check, as library/allreduce_check.py does it: the arguments
checked, the probe and the worker run (module_utils/tuning/allreduce.py), the result compared with
the
baseline and the baseline written.

Everything the module must say comes back as a dict for exit_json, or as CheckFailed, whose
message and fields go to fail_json; warnings go through the warn callable.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from datetime import datetime, timezone

from ansible.module_utils.host.helpers import atomic_write
from ansible.module_utils.tuning.allreduce import (
    AllreduceError,
    build_results,
    check_probe,
    compare,
    drop_message,
    human_bytes,
    load_baseline,
    make_baseline,
    max_size_busbw,
    message_sizes,
    parse_nccl_log,
    parse_probe,
    probe_source,
    run_in_group,
    worker_environment,
    worker_failure_message,
    worker_source,
)
from ansible.module_utils.tuning.allreduce_worker import make_config

# What a failure before any GPU was measured reports.
NOTHING = {"gpus": 0, "baseline_written": False}


class CheckFailed(Exception):
    """The module fails: str() is its msg, fields the other keys of its result."""

    def __init__(self, msg: str, **fields):
        super().__init__(msg)
        self.fields = fields


def resolve_python(requested: str, get_bin_path) -> str:
    """The runtime Python's path; get_bin_path(name) looks a bare name up on PATH."""
    binary = requested if os.path.sep in requested else get_bin_path(requested)
    if not binary or not os.path.isfile(binary) or not os.access(binary, os.X_OK):
        where = (
            f"{requested!r} is not an executable file"
            if os.path.sep in requested
            else f"{requested!r} is not on PATH {os.environ.get('PATH', '')!r}"
        )
        raise CheckFailed(
            f"python not found: {where}. Needed: the runtime virtual environment's Python, "
            "with the CUDA build of torch the server uses. Fix: run the runtime stage first, or "
            "set python to that environment's bin/python (e.g. /opt/kimi/venv/bin/python).",
            **NOTHING,
        )
    return binary


def validate(params: dict) -> list[int]:
    """The message sizes to measure; CheckFailed naming every bad parameter."""
    problems = []
    if params["warmup"] < 0:
        problems.append(f"warmup is {params['warmup']}; needed: 0 or more")
    if params["iterations"] < 1:
        problems.append(f"iterations is {params['iterations']}; needed: 1 or more")
    if params["timeout"] < 1:
        problems.append(f"timeout is {params['timeout']}; needed: 1 second or more")
    if params["max_drop_percent"] < 0:
        problems.append(f"max_drop_percent is {params['max_drop_percent']}; needed: 0 or more")
    try:
        sizes = message_sizes(params["min_bytes"], params["max_bytes"])
    except AllreduceError as exc:
        problems.append(str(exc))
        sizes = []
    if problems:
        raise CheckFailed("; ".join(problems), **NOTHING)
    return sizes


def read_baseline(path: str | None, update: bool, warn) -> dict | None:
    """The baseline, or None where there is none (or a broken one that update replaces)."""
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path) as handle:
            text = handle.read()
    except OSError as exc:
        raise CheckFailed(
            f"The baseline {path} cannot be read ({exc}). Fix: check its permissions.", **NOTHING
        ) from exc
    try:
        return load_baseline(text, path)
    except AllreduceError as exc:
        if update:
            warn(f"{exc} It is replaced because update_baseline is true.")
            return None
        raise CheckFailed(str(exc), **NOTHING) from exc


def write_baseline(path: str, baseline: dict) -> None:
    directory = os.path.dirname(path) or "."
    try:
        atomic_write(path, json.dumps(baseline, indent=2, sort_keys=True) + "\n", 0o644)
    except OSError as exc:
        raise CheckFailed(
            f"Cannot write the baseline {path} ({exc}). Fix: make {directory} writable by "
            "the user the task runs as (become: true), or choose another baseline_file.",
            gpus=baseline["gpus"],
            baseline_written=False,
        ) from exc


def measure(params: dict, python: str, sizes: list[int], old_baseline: dict | None) -> dict:
    """Probe torch, run the worker over every GPU; the measurement, or a skip below 2 GPUs."""
    env = worker_environment(dict(os.environ), params["nccl_env"])
    deadline = time.monotonic() + params["timeout"]
    with tempfile.TemporaryDirectory(prefix="allreduce-check-") as workdir:
        info = probe_gpus(python, env, params["timeout"], workdir)
        gpus = int(info["gpus"])
        if gpus < 2:
            return too_few_gpus(python, gpus, info, old_baseline)
        worker, nccl, measured, results = run_worker(
            params, python, env, sizes, gpus, workdir, deadline
        )
    check_sums(measured, nccl, results, gpus)
    return {
        "gpus": gpus,
        "gpu_names": measured.get("gpu_names") or info.get("gpu_names", []),
        "results": results,
        "transport": nccl["transport"],
        "nccl_version": nccl["nccl_version"] or measured.get("nccl"),
        "torch_version": measured.get("torch"),
        "cuda_version": measured.get("cuda"),
        "nccl_env": {str(k): str(v) for k, v in params["nccl_env"].items()},
        "nccl": nccl,
        "elapsed_s": worker.elapsed_s,
    }


def probe_gpus(python: str, env: dict, timeout: int, workdir: str) -> dict:
    """What the probe found in `python` (torch, the GPUs it sees); CheckFailed otherwise."""
    probe = run_in_group([python, "-c", probe_source()], env, timeout, workdir, "probe")
    if probe.timed_out:
        raise CheckFailed(
            f"`{python} -c <probe>` (import torch, count GPUs) did not finish within "
            f"timeout={timeout}s and was killed with its whole process group "
            f"(PIDs {', '.join(map(str, probe.killed_pids))}). Fix: run `{python} -c "
            "'import torch; print(torch.cuda.device_count())'` by hand; a hang there is "
            "usually the driver or a GPU in a bad state (check `nvidia-smi`).",
            **NOTHING,
        )
    try:
        info = parse_probe(probe, python)
        check_probe(info, python)
    except AllreduceError as exc:
        raise CheckFailed(str(exc), **NOTHING) from exc
    return info


def too_few_gpus(python: str, gpus: int, info: dict, old_baseline: dict | None) -> dict:
    """The skip result for a host with fewer than 2 GPUs."""
    return {
        "changed": False,
        "skipped": True,
        "msg": f"torch in {python} sees {gpus} GPU ({', '.join(info['gpu_names'])}); "
        "an all-reduce needs at least 2, so there is nothing to measure.",
        "gpus": gpus,
        "results": [],
        "transport": None,
        "busbw_GBps_max_size": None,
        "baseline": old_baseline,
        "drop_percent": None,
        "baseline_written": False,
    }


def run_worker(
    params: dict,
    python: str,
    env: dict,
    sizes: list[int],
    gpus: int,
    workdir: str,
    deadline: float,
) -> tuple:
    """Runs the worker over `gpus` GPUs in `workdir` until `deadline`: (the worker's run, NCCL's
    log read, the result file, the results per size); CheckFailed when it fails or leaves none."""
    config_path = os.path.join(workdir, "config.json")
    result_path = os.path.join(workdir, "result.json")
    worker_path = os.path.join(workdir, "allreduce_worker.py")
    with open(worker_path, "w") as handle:
        handle.write(worker_source())
    with open(config_path, "w") as handle:
        json.dump(
            make_config(
                world_size=gpus,
                sizes=sizes,
                warmup=params["warmup"],
                iterations=params["iterations"],
                store=os.path.join(workdir, "store"),
                result_file=result_path,
            ),
            handle,
        )
    remaining = max(1.0, deadline - time.monotonic())
    worker = run_in_group([python, worker_path, config_path], env, remaining, workdir, "worker")
    nccl = parse_nccl_log(worker.output)
    failed = {"gpus": gpus, "baseline_written": False, **nccl}
    if worker.timed_out or worker.rc != 0:
        raise CheckFailed(
            worker_failure_message(worker, params["timeout"], nccl),
            rc=worker.rc,
            timed_out=worker.timed_out,
            output_tail=worker.output.strip().splitlines()[-40:],
            **failed,
        )
    try:
        with open(result_path) as handle:
            measured = json.load(handle)
        results = build_results(measured["sizes"], measured["time_us"], gpus)
    except (OSError, ValueError, KeyError, AllreduceError) as exc:
        raise CheckFailed(
            f"The all-reduce worker exited 0 but left no usable result ({exc}). Its "
            f"output ended:\n{worker.output.strip()[-2000:]}\nFix: run the module again; "
            "if it repeats, report it with this output.",
            **failed,
        ) from exc
    return worker, nccl, measured, results


def check_sums(measured: dict, nccl: dict, results: list[dict], gpus: int) -> None:
    """CheckFailed when the worker found wrong all-reduce sums at any size."""
    if measured.get("wrong_sizes"):
        raise CheckFailed(
            "The all-reduce returned wrong sums at "
            + ", ".join(human_bytes(n) for n in measured["wrong_sizes"])
            + f" over {nccl['transport']}. Data moved between GPUs is corrupted: usually "
            "P2P across PCIe bridges with ACS or an IOMMU re-routing it. Needed: correct sums. "
            "Fix: check `lspci -vvv | grep ACSCtl` (disable ACS on the GPU bridges) and retry "
            "with NCCL_P2P_DISABLE=1 in nccl_env to confirm.",
            results=results,
            gpus=gpus,
            baseline_written=False,
            **nccl,
        )


def run_check(params: dict, get_bin_path, warn, check_mode: bool) -> dict:
    """The module's whole run: exit_json's keys, or CheckFailed."""
    sizes = validate(params)
    python = resolve_python(params["python"], get_bin_path)
    baseline_path = params["baseline_file"]
    old_baseline = read_baseline(baseline_path, params["update_baseline"], warn)
    measurement = measure(params, python, sizes, old_baseline)
    if measurement.get("skipped"):
        return measurement
    nccl = measurement.pop("nccl")
    elapsed_s = measurement.pop("elapsed_s")
    gpus, results = measurement["gpus"], measurement["results"]
    nbytes, busbw = max_size_busbw(results)
    output = {
        **measurement,
        "transports": nccl["transports"],
        "transport_lines": nccl["transport_lines"],
        "nccl_env_reported": nccl["nccl_env_reported"],
        "nccl_warnings": nccl["nccl_warnings"],
        "busbw_GBps_max_size": busbw,
        "baseline": old_baseline,
        "baseline_file": baseline_path,
        "drop_percent": None,
        "elapsed_s": round(elapsed_s, 1),
    }
    output.pop("nccl_env")

    failure = None
    if old_baseline is not None:
        try:
            comparison = compare(old_baseline, gpus, results, baseline_path)
        except AllreduceError as exc:
            if not params["update_baseline"]:
                raise CheckFailed(str(exc), baseline_written=False, **output) from exc
            warn(f"{exc} It is replaced because update_baseline is true.")
        else:
            output["drop_percent"] = comparison["drop_percent"]
            if comparison["drop_percent"] > params["max_drop_percent"]:
                message = drop_message(
                    comparison,
                    old_baseline,
                    baseline_path,
                    params["max_drop_percent"],
                    nccl["transport"],
                )
                if params["update_baseline"]:
                    warn(message + " Recorded as the new baseline (update_baseline).")
                else:
                    failure = message
            if old_baseline.get("transport") != nccl["transport"]:
                warn(
                    f"NCCL's transport changed from {old_baseline.get('transport')} in the "
                    f"baseline to {nccl['transport']}."
                )
    if failure:
        raise CheckFailed(failure, baseline_written=False, **output)

    write = bool(baseline_path) and (old_baseline is None or params["update_baseline"])
    written = False
    if write and not check_mode:
        recorded_at = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: UP017
        write_baseline(baseline_path, make_baseline(measurement, socket.gethostname(), recorded_at))
        written = True
    summary = (
        f"{gpus} GPUs over {nccl['transport']}: {busbw:.1f} GB/s bus bandwidth at "
        f"{human_bytes(nbytes)}"
    )
    if output["drop_percent"] is not None:
        summary += f", {output['drop_percent']:.1f}% below the baseline"
    return {"changed": write, "msg": summary, "baseline_written": written, **output}
