#!/usr/bin/python
"""Ansible module allreduce_check: NCCL all-reduce bandwidth of the GPUs against a baseline."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: allreduce_check
short_description: Measure NCCL all-reduce bandwidth over all local GPUs and compare to a baseline
description:
  - Runs C(torch.distributed) C(all_reduce) of bf16 tensors over NCCL with one process per
    visible GPU, using the runtime environment's Python (O(python)) and the NCCL environment
    the server gets (O(nccl_env)).
  - Message sizes double from O(min_bytes) to O(max_bytes). Each size gets one all-reduce whose
    sum is checked, O(warmup) untimed iterations, then O(iterations) iterations timed with CUDA
    events; the time of a size is the slowest rank's mean.
  - Reports per size the time, the algorithm bandwidth (bytes / time) and the bus bandwidth
    (2(n-1)/n times the algorithm bandwidth, as nccl-tests reports it), in GB/s of 1e9 bytes.
  - Reads the transport NCCL chose (P2P/CUMEM, P2P/IPC, SHM, NET/Socket, NVLS, ...) from its
    C(NCCL_DEBUG=INFO) output.
  - Keeps a per-host baseline in O(baseline_file). Writes it when it is absent or when
    O(update_baseline=true) (then reports changed), and fails when the bus bandwidth at the
    largest size falls more than O(max_drop_percent) below it.
  - Fails with a message saying what was found and how to fix it when the Python or torch is
    missing, torch sees no GPU, NCCL errors, the sums are wrong, or the worker does not finish
    within O(timeout) seconds (then its whole process group is killed).
  - With fewer than 2 GPUs there is no all-reduce to measure; the task is skipped.
  - Supports check mode. The measurement is read-only and runs in check mode too; the baseline
    is never written in check mode.
version_added: "0.1.0"
options:
  python:
    description:
      - Python interpreter of the runtime environment (the one the server runs with), name or
        path. It must import a CUDA build of torch.
    type: str
    default: python3
  nccl_env:
    description:
      - Environment variables added to the worker processes, exactly as the server gets them
        (for example C(NCCL_P2P_DISABLE), C(NCCL_NVLS_ENABLE), C(CUDA_VISIBLE_DEVICES)).
        Booleans become C(1)/C(0), other values strings.
      - C(NCCL_DEBUG) and C(NCCL_DEBUG_SUBSYS) are always set to C(INFO) and C(INIT,GRAPH,ENV),
        and C(NCCL_DEBUG_FILE) is removed, so that the transport can be read; they change
        logging only.
    type: dict
    default: {}
  min_bytes:
    description: Smallest message size in bytes (a multiple of 2, bf16).
    type: int
    default: 32768
  max_bytes:
    description: Largest message size in bytes; sizes double from O(min_bytes) up to it.
    type: int
    default: 1073741824
  warmup:
    description: Untimed iterations per size before the timed ones.
    type: int
    default: 5
  iterations:
    description: Timed iterations per size.
    type: int
    default: 20
  timeout:
    description:
      - Seconds the whole measurement (probe and worker) may take. When it runs over, the
        worker's process group is killed and the task fails.
    type: int
    default: 300
  baseline_file:
    description:
      - Where this host's baseline JSON lives, e.g. C(/var/lib/kimi/allreduce-baseline.json).
        When unset, no baseline is read or written.
    type: path
  update_baseline:
    description:
      - Record this measurement as the new baseline even when one exists. The drop against the
        old one is still reported but does not fail the task.
    type: bool
    default: false
  max_drop_percent:
    description: Largest allowed drop of bus bandwidth at the largest size below the baseline.
    type: float
    default: 15
notes:
  - Run it while no other process uses the GPUs (before the server starts), or the figures
    and the memory it needs (2 x O(max_bytes) per GPU at most) are off.
  - GB/s here are 1e9 bytes per second.
author:
  - kimi-deploy-kit maintainers
"""

EXAMPLES = r"""
- name: Measure all-reduce bandwidth with the server's NCCL settings
  allreduce_check:
    python: /opt/kimi/venv/bin/python
    nccl_env:
      NCCL_NVLS_ENABLE: "0"
    baseline_file: /var/lib/kimi/allreduce-baseline.json
  register: allreduce

- name: Re-record the baseline after a hardware change
  allreduce_check:
    python: /opt/kimi/venv/bin/python
    baseline_file: /var/lib/kimi/allreduce-baseline.json
    update_baseline: true

- name: Show what NCCL chose
  ansible.builtin.debug:
    msg: "{{ allreduce.gpus }} GPUs over {{ allreduce.transport }}:
      {{ allreduce.busbw_GBps_max_size }} GB/s bus bandwidth at 1 GiB"
"""

RETURN = r"""
results:
  description: One row per message size.
  returned: success
  type: list
  elements: dict
  contains:
    bytes:
      description: Message size in bytes.
      type: int
      sample: 1073741824
    time_us:
      description: Mean time of one all-reduce, microseconds (the slowest rank's).
      type: float
      sample: 3180.5
    algbw_GBps:
      description: Algorithm bandwidth, bytes / time, GB/s (1e9).
      type: float
      sample: 337.6
    busbw_GBps:
      description: Bus bandwidth, 2(n-1)/n x algbw_GBps, GB/s (1e9).
      type: float
      sample: 337.6
transport:
  description: >-
    The transport(s) NCCL chose, most used first, from its C(Channel ... via ...) lines and
    its NVLS channel count; null when NCCL printed none.
  returned: success
  type: str
  sample: P2P/CUMEM
transports:
  description: Channel connections per transport.
  returned: success
  type: dict
  sample: {"P2P/CUMEM": 48}
transport_lines:
  description: The first few C(Channel ... via ...) lines NCCL printed, as evidence.
  returned: success
  type: list
  elements: str
gpus:
  description: GPUs (ranks) that took part; on a skip, GPUs visible.
  returned: always
  type: int
  sample: 8
gpu_names:
  description: Name of each GPU, as torch reports it.
  returned: success
  type: list
  elements: str
busbw_GBps_max_size:
  description: Bus bandwidth at the largest size, GB/s.
  returned: success
  type: float
  sample: 478.2
baseline:
  description: >-
    The baseline this run was compared with (the file's content before the run), null when
    there was none.
  returned: success
  type: dict
drop_percent:
  description: >-
    How far the bus bandwidth at the largest size is below the baseline, percent (negative:
    faster); null without a baseline.
  returned: success
  type: float
  sample: 1.8
baseline_written:
  description: Whether this run wrote O(baseline_file) (never in check mode).
  returned: always
  type: bool
nccl_version:
  description: NCCL version, from NCCL's log (or torch when NCCL printed none).
  returned: success
  type: str
  sample: 2.28.9+cuda13.0
nccl_env_reported:
  description: NCCL_* variables NCCL reported it took from the environment.
  returned: success
  type: dict
  sample: {"NCCL_NVLS_ENABLE": "0"}
nccl_warnings:
  description: NCCL WARN lines, if any.
  returned: success
  type: list
  elements: str
torch_version:
  description: torch version of O(python).
  returned: success
  type: str
  sample: 2.11.0+cu130
cuda_version:
  description: CUDA version torch was built for.
  returned: success
  type: str
  sample: "13.0"
elapsed_s:
  description: Seconds the worker ran.
  returned: success
  type: float
"""

import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402

from ansible.module_utils.allreduce import (  # noqa: E402
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
from ansible.module_utils.allreduce_worker import make_config  # noqa: E402
from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def resolve_python(module: AnsibleModule, requested: str) -> str:
    binary = requested if os.path.sep in requested else module.get_bin_path(requested)
    if not binary or not os.path.isfile(binary) or not os.access(binary, os.X_OK):
        where = (
            f"{requested!r} is not an executable file"
            if os.path.sep in requested
            else f"{requested!r} is not on PATH {os.environ.get('PATH', '')!r}"
        )
        module.fail_json(
            msg=f"python not found: {where}. Needed: the runtime virtual environment's Python, "
            "with the CUDA build of torch the server uses. Fix: run the runtime stage first, or "
            "set python to that environment's bin/python (e.g. /opt/kimi/venv/bin/python).",
            gpus=0,
            baseline_written=False,
        )
    return binary


def validate(module: AnsibleModule) -> list[int]:
    params = module.params
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
        module.fail_json(msg="; ".join(problems), gpus=0, baseline_written=False)
    return sizes


def read_baseline(module: AnsibleModule, path: str | None) -> dict | None:
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path) as handle:
            text = handle.read()
    except OSError as exc:
        module.fail_json(
            msg=f"The baseline {path} cannot be read ({exc}). Fix: check its permissions.",
            gpus=0,
            baseline_written=False,
        )
    try:
        return load_baseline(text, path)
    except AllreduceError as exc:
        if module.params["update_baseline"]:
            module.warn(f"{exc} It is replaced because update_baseline is true.")
            return None
        module.fail_json(msg=str(exc), gpus=0, baseline_written=False)
    return None


def write_baseline(module: AnsibleModule, path: str, baseline: dict) -> None:
    directory = os.path.dirname(path) or "."
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=".allreduce-baseline-", dir=directory)
        with os.fdopen(fd, "w") as handle:
            json.dump(baseline, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.chmod(temp, 0o644)
    except OSError as exc:
        module.fail_json(
            msg=f"Cannot write the baseline {path} ({exc}). Fix: make {directory} writable by "
            "the user the task runs as (become: true), or choose another baseline_file.",
            gpus=baseline["gpus"],
            baseline_written=False,
        )
    module.atomic_move(temp, path)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "python": {"type": "str", "default": "python3"},
            "nccl_env": {"type": "dict", "default": {}},
            "min_bytes": {"type": "int", "default": 32768},
            "max_bytes": {"type": "int", "default": 1073741824},
            "warmup": {"type": "int", "default": 5},
            "iterations": {"type": "int", "default": 20},
            "timeout": {"type": "int", "default": 300},
            "baseline_file": {"type": "path"},
            "update_baseline": {"type": "bool", "default": False},
            "max_drop_percent": {"type": "float", "default": 15.0},
        },
        supports_check_mode=True,
    )
    params = module.params
    sizes = validate(module)
    python = resolve_python(module, params["python"])
    baseline_path = params["baseline_file"]
    old_baseline = read_baseline(module, baseline_path)
    env = worker_environment(dict(os.environ), params["nccl_env"])
    deadline = time.monotonic() + params["timeout"]
    nothing = {"gpus": 0, "baseline_written": False}

    with tempfile.TemporaryDirectory(prefix="allreduce-check-") as workdir:
        probe = run_in_group(
            [python, "-c", probe_source()], env, params["timeout"], workdir, "probe"
        )
        if probe.timed_out:
            module.fail_json(
                msg=f"`{python} -c <probe>` (import torch, count GPUs) did not finish within "
                f"timeout={params['timeout']}s and was killed with its whole process group "
                f"(PIDs {', '.join(map(str, probe.killed_pids))}). Fix: run `{python} -c "
                "'import torch; print(torch.cuda.device_count())'` by hand; a hang there is "
                "usually the driver or a GPU in a bad state (check `nvidia-smi`).",
                **nothing,
            )
        try:
            info = parse_probe(probe, python)
            check_probe(info, python)
        except AllreduceError as exc:
            module.fail_json(msg=str(exc), **nothing)
        gpus = int(info["gpus"])
        if gpus < 2:
            module.exit_json(
                changed=False,
                skipped=True,
                msg=f"torch in {python} sees {gpus} GPU ({', '.join(info['gpu_names'])}); an "
                "all-reduce needs at least 2, so there is nothing to measure.",
                gpus=gpus,
                results=[],
                transport=None,
                busbw_GBps_max_size=None,
                baseline=old_baseline,
                drop_percent=None,
                baseline_written=False,
            )

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
            module.fail_json(
                msg=worker_failure_message(worker, params["timeout"], nccl),
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
            module.fail_json(
                msg=f"The all-reduce worker exited 0 but left no usable result ({exc}). Its "
                f"output ended:\n{worker.output.strip()[-2000:]}\nFix: run the module again; "
                "if it repeats, report it with this output.",
                **failed,
            )

    if measured.get("wrong_sizes"):
        module.fail_json(
            msg="The all-reduce returned wrong sums at "
            + ", ".join(human_bytes(n) for n in measured["wrong_sizes"])
            + f" over {nccl['transport']}. Data moved between GPUs is corrupted: usually "
            "P2P across PCIe bridges with ACS or an IOMMU re-routing it. Needed: correct sums. "
            "Fix: check `lspci -vvv | grep ACSCtl` (disable ACS on the GPU bridges) and retry "
            "with NCCL_P2P_DISABLE=1 in nccl_env to confirm.",
            results=results,
            **failed,
        )

    nbytes, busbw = max_size_busbw(results)
    measurement = {
        "gpus": gpus,
        "gpu_names": measured.get("gpu_names") or info.get("gpu_names", []),
        "results": results,
        "transport": nccl["transport"],
        "nccl_version": nccl["nccl_version"] or measured.get("nccl"),
        "torch_version": measured.get("torch"),
        "cuda_version": measured.get("cuda"),
        "nccl_env": {str(k): str(v) for k, v in params["nccl_env"].items()},
    }
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
        "elapsed_s": round(worker.elapsed_s, 1),
    }
    output.pop("nccl_env")

    failure = None
    if old_baseline is not None:
        try:
            comparison = compare(old_baseline, gpus, results, baseline_path)
        except AllreduceError as exc:
            if not params["update_baseline"]:
                module.fail_json(msg=str(exc), baseline_written=False, **output)
            module.warn(f"{exc} It is replaced because update_baseline is true.")
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
                    module.warn(message + " Recorded as the new baseline (update_baseline).")
                else:
                    failure = message
            if old_baseline.get("transport") != nccl["transport"]:
                module.warn(
                    f"NCCL's transport changed from {old_baseline.get('transport')} in the "
                    f"baseline to {nccl['transport']}."
                )
    if failure:
        module.fail_json(msg=failure, baseline_written=False, **output)

    write = bool(baseline_path) and (old_baseline is None or params["update_baseline"])
    written = False
    if write and not module.check_mode:
        recorded_at = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: UP017
        write_baseline(
            module, baseline_path, make_baseline(measurement, socket.gethostname(), recorded_at)
        )
        written = True
    summary = (
        f"{gpus} GPUs over {nccl['transport']}: {busbw:.1f} GB/s bus bandwidth at "
        f"{human_bytes(nbytes)}"
    )
    if output["drop_percent"] is not None:
        summary += f", {output['drop_percent']:.1f}% below the baseline"
    module.exit_json(changed=write, msg=summary, baseline_written=written, **output)


if __name__ == "__main__":
    main()
