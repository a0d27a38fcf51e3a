#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module benchmark_debug: one serving config's debug files, scrubbed, on its host."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: benchmark_debug
short_description: Collect one serving config's server log, kernel and NCCL lines and GPU state
description:
  - Writes into O(dest) what a person debugging the config's result needs, each file scrubbed
    of O(secrets) (as they are, their base64 forms at every alignment and their unkeyed hex
    digests) and of secret-looking patterns (C(hf_) followed by 30 or more letters and digits,
    C(Authorization) bearer values, C(api_key) assignments and JSON values, C(--api-key)
    values, passwords in URLs) before it is written, and capped at O(max_bytes).
  - O(phase=begin), before the server starts, opens the config's window on the host's clock
    and removes the files an earlier attempt left (only the collector's own names).
  - O(phase=start), after the server started and before the first level, writes
    C(nvidia-smi-q-start.txt) (C(nvidia-smi -q)).
  - O(phase=end), after the last level or the failure, writes C(nvidia-smi-q-end.txt);
    C(server.log.gz), the server's log file from where it ended at O(phase=begin) (gzip; the
    unit and the supervisor both write it, every launch after the last; all of it when it
    was rotated or truncated since), and under systemd C(journal.txt.gz), C(journalctl -u)
    of the unit for the window (systemd's lines about the unit); C(nccl.txt), the log's
    C(NCCL INFO) and C(NCCL WARN) lines; C(dmesg.txt), the kernel lines with C(Xid) or C(NVRM)
    (a denied C(dmesg) is recorded in it, never a failure); C(runtime.json) and
    C(launch.json), the runtime and launch records.
  - C(collected.json) says per file its status (ok, cut, failed, denied, missing), its size
    and why it is not ok, the window, the manager and how many values were masked.
  - A command that fails or runs past its deadline is recorded, not fatal; the module fails
    only on bad options.
version_added: "0.1.0"
options:
  phase:
    description: Which part of the collection this call does.
    type: str
    required: true
    choices: [begin, start, end]
  dest:
    description: Absolute folder on the host the files are written to (not a link).
    type: path
    required: true
  config:
    description: The serving config, recorded in C(collected.json).
    type: str
    required: true
  unit_name:
    description: The systemd unit whose journal is read under systemd.
    type: str
    default: kimi-sglang
  manager:
    description: >-
      How the server runs. C(auto) takes the launch record's C(manager), else systemd when
      it is PID 1.
    type: str
    default: auto
    choices: [auto, systemd, supervisor]
  log_file:
    description: The supervisor's log file, kept whole (up to O(max_bytes)).
    type: path
    default: /var/log/kimi/sglang.log
  runtime_record:
    description: The runtime stage's record (its package list).
    type: path
    default: ""
  launch_record:
    description: The server stage's record of the running launch.
    type: path
    default: ""
  secrets:
    description: Values masked wherever they appear (the API key, the HF token); never logged.
    type: list
    elements: str
    default: []
  max_bytes:
    description: >-
      Most bytes of each file before compression; a longer log keeps its first quarter and
      its last three quarters, a longer command output its start, and the file says so.
    type: int
    default: 67108864
  nccl_lines:
    description: Most NCCL lines kept in C(nccl.txt).
    type: int
    default: 2000
  command_timeout:
    description: Seconds one command (nvidia-smi, journalctl, dmesg) may take; past it, it is
      killed with its whole process group and the file says so.
    type: float
    default: 60
  timeout:
    description: >-
      Seconds all commands of one call together may take; keep it below the task's
      C(timeout) keyword, which kills only the module.
    type: float
    default: 300
  nvidia_smi:
    description: Name or path of nvidia-smi.
    type: str
    default: nvidia-smi
  journalctl:
    description: Name or path of journalctl.
    type: str
    default: journalctl
  dmesg:
    description: Name or path of dmesg.
    type: str
    default: dmesg
notes:
  - Supports check mode (nothing is run or written).
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Open the config's debug window
  benchmark_debug:
    phase: begin
    dest: /var/lib/kimi/benchmark/20260101T120000Z/debug/dflash
    config: dflash

- name: Collect the config's debug files
  benchmark_debug:
    phase: end
    dest: /var/lib/kimi/benchmark/20260101T120000Z/debug/dflash
    config: dflash
    unit_name: kimi-sglang
    log_file: /var/log/kimi/sglang.log
    runtime_record: /opt/kimi/runtime/runtime.json
    launch_record: /var/lib/kimi/server/launch.json
    secrets: ["{{ kimi_server_api_key }}", "{{ kimi_hf_token }}"]
  no_log: true
"""

RETURN = r"""
files:
  description: Per file name its status (ok, cut, failed, denied, missing), sizes and why.
  returned: always
  type: dict
  sample: {"dmesg.txt": {"status": "denied", "why": "dmesg exited 1"}}
window:
  description: The config's window on the host's clock (since, until, as UTC and epoch).
  returned: always
  type: dict
masked_values:
  description: How many values were masked in what the collector wrote so far (never which).
  returned: always
  type: int
dest:
  description: The folder written to.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.benchmark.debug import collect  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "phase": {"type": "str", "required": True, "choices": ["begin", "start", "end"]},
            "dest": {"type": "path", "required": True},
            "config": {"type": "str", "required": True},
            "unit_name": {"type": "str", "default": "kimi-sglang"},
            "manager": {
                "type": "str",
                "default": "auto",
                "choices": ["auto", "systemd", "supervisor"],
            },
            "log_file": {"type": "path", "default": "/var/log/kimi/sglang.log"},
            "runtime_record": {"type": "path", "default": ""},
            "launch_record": {"type": "path", "default": ""},
            "secrets": {"type": "list", "elements": "str", "default": [], "no_log": True},
            "max_bytes": {"type": "int", "default": 64 << 20},
            "nccl_lines": {"type": "int", "default": 2000},
            "command_timeout": {"type": "float", "default": 60},
            "timeout": {"type": "float", "default": 300},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "journalctl": {"type": "str", "default": "journalctl"},
            "dmesg": {"type": "str", "default": "dmesg"},
        },
        supports_check_mode=True,
    )
    p = module.params
    problems = []
    if not 4096 <= p["max_bytes"] <= 1 << 30:
        problems.append(f"max_bytes is {p['max_bytes']}; needed 4096 to 1073741824")
    if not 0 <= p["nccl_lines"] <= 1_000_000:
        problems.append(f"nccl_lines is {p['nccl_lines']}; needed 0 to 1000000")
    for option in ("command_timeout", "timeout"):
        if not 0 < p[option] <= 3600:
            problems.append(f"{option} is {p[option]:g}; needed seconds above 0, at most 3600")
    if not p["dest"].startswith("/"):
        problems.append(f"dest is {p['dest']!r}; needed an absolute path")
    if problems:
        module.fail_json(msg="benchmark_debug: " + "; ".join(problems) + ". Fix the options.")
    if module.check_mode:
        module.exit_json(changed=True, files={}, window={}, masked_values=0, dest=p["dest"])
    try:
        index = collect(p)
    except (OSError, ValueError) as error:
        module.fail_json(msg=f"benchmark_debug could not write to {p['dest']}: {error}")
    module.exit_json(
        changed=True,
        files=index["files"],
        window=index["window"],
        masked_values=index["masked_values"],
        dest=p["dest"],
    )


if __name__ == "__main__":
    main()
