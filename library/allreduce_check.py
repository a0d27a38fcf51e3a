#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
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
  - kimi-deploy-kit maintainers (!UNKNOWN)
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

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.tuning.allreduce_run import CheckFailed, run_check  # noqa: E402


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
    try:
        result = run_check(module.params, module.get_bin_path, module.warn, module.check_mode)
    except CheckFailed as failed:
        module.fail_json(msg=str(failed), **failed.fields)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
