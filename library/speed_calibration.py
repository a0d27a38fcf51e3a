#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module speed_calibration: the speed model's calibration record of one GPU."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: speed_calibration
short_description: Measure a GPU's copy bandwidth and the K2.6 MoE layer time for the speed model
description:
  - Runs C(module_utils/tuning/speed_calibration.py) with the runtime environment's Python
    (O(python))
    on GPU O(gpu) and writes its record to O(record_file), which the speed model
    (C(module_utils/plan/speed_model.py)) reads in place of the profile's nominal figures.
  - The program measures the GPU's device-to-device copy bandwidth and a read-only bandwidth
    over a buffer far above L2, and the time of one TP8 rank's slice of one Kimi K2.6 MoE layer
    (hidden 7168, 384 experts of intermediate 256, top-8 uniform routing from a fixed seed,
    bf16 grouped GEMMs that read only the experts touched, L2 flushed between steps) for each
    token count in O(tokens); each figure is the median of O(repeats) timed steps.
  - Keeps a good record that is already there (changed=false, nothing run) unless
    O(rerun=true); a missing or unusable record is measured (changed=true).
  - Fails with a message saying what was found and how to fix it when the Python or torch is
    missing, torch sees no GPU, the GPU has too little free memory, or the program does not
    finish within O(timeout) seconds (then its whole process group is killed).
  - Supports check mode. It says whether it would measure, and runs nothing.
version_added: "0.1.0"
options:
  python:
    description:
      - Python interpreter of the runtime environment, name or path. It must import a CUDA
        build of torch.
    type: str
    default: python3
  record_file:
    description:
      - Where the record (JSON) goes on the host, e.g.
        C(/var/lib/kimi/speed-calibration.json).
    type: path
    required: true
  tokens:
    description: Token counts of one step to time the MoE layer at (1 to 8192, each once).
    type: list
    elements: int
    default: [1, 8, 17, 33, 65, 129, 257]
  repeats:
    description: Timed steps per figure (the median is kept).
    type: int
    default: 20
  gpu:
    description: CUDA device index to measure.
    type: int
    default: 0
  rerun:
    description: Measure again even when O(record_file) holds a good record.
    type: bool
    default: false
  timeout:
    description:
      - Seconds the program may take (31 to 3600). It stops itself 30 s before; at the
        timeout its whole process group is killed and the task fails.
    type: int
    default: 600
notes:
  - Run it while nothing else uses the GPU (before the server starts, or after it stopped).
    It needs about 8 GiB free, and other work would slow the figures.
  - GB/s here are 1e9 bytes per second.
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Calibrate the speed model on GPU 0
  speed_calibration:
    python: /opt/kimi/venv/bin/python
    record_file: /var/lib/kimi/speed-calibration.json
  register: calibration

- name: Measure again after a hardware change
  speed_calibration:
    python: /opt/kimi/venv/bin/python
    record_file: /var/lib/kimi/speed-calibration.json
    rerun: true
"""

RETURN = r"""
record:
  description: >-
    The calibration record (schema 1, kind kimi-speed-calibration): gpu, torch, command,
    copy_gbs, read_gbs, and moe with its geometry and rows (tokens, experts_touched, ms,
    repeats). In check mode, the record already there, or null.
  returned: always
  type: dict
measured:
  description: Whether this run measured (false when a good record was kept, or in check mode).
  returned: always
  type: bool
record_file:
  description: Where the record is.
  returned: success
  type: str
elapsed_s:
  description: Seconds the program ran.
  returned: when measured
  type: float
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.tuning.speed_calibration_run import (  # noqa: E402
    CalibrationFailed,
    run_calibration,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "python": {"type": "str", "default": "python3"},
            "record_file": {"type": "path", "required": True},
            # Token counts of a step, not credentials (the sanity check guesses from the name).
            "tokens": {
                "type": "list",
                "elements": "int",
                "default": [1, 8, 17, 33, 65, 129, 257],
                "no_log": False,
            },
            "repeats": {"type": "int", "default": 20},
            "gpu": {"type": "int", "default": 0},
            "rerun": {"type": "bool", "default": False},
            "timeout": {"type": "int", "default": 600},
        },
        supports_check_mode=True,
    )
    try:
        result = run_calibration(module.params, module.get_bin_path, module.warn, module.check_mode)
    except CalibrationFailed as failed:
        module.fail_json(msg=str(failed), **failed.fields)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
