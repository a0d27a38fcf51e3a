#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module preflight_host_facts: what preflight needs to know beyond the GPUs."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_host_facts
short_description: Disk space, weights present, init system, fabric manager and PCIe ACS state
description:
  - Free space on the filesystem that holds (or will hold) the weights directory.
  - For each repository, the bytes of the listed files already on disk with the right size.
  - Whether systemd is PID 1, and whether nvidia-fabricmanager is active (the systemd unit,
    or an nv-fabricmanager process where systemd is not PID 1).
  - With I(gpu_bus_ids), the ACS control flags of every PCIe bridge above the GPUs
    (C(lspci -vvv)); bridges that redirect peer-to-peer traffic to the root complex are listed.
  - Read-only; supports check mode.
version_added: "0.1.0"
options:
  weights_dir:
    description: Directory the weights go to.
    type: path
    required: true
  repos:
    description: >-
      hub_repo_info's repos - name to repo_id and files; each repository lives in
      weights_dir/repo_id.
    type: dict
    default: {}
  check_fabricmanager:
    description: Whether to look for nvidia-fabricmanager.
    type: bool
    default: false
  gpu_bus_ids:
    description: GPU PCI bus ids whose upstream bridges' ACS state to read; empty skips it.
    type: list
    elements: str
    default: []
  lspci_path:
    description: Name or path of lspci.
    type: str
    default: lspci
  timeout:
    description: >-
      Seconds all commands together may take (systemctl, pgrep, lspci). At the deadline the
      running one is killed with its whole process group; the fabric manager state or the
      ACS report is then unknown, with the command and the deadline as the reason. Keep it
      below the task's C(timeout) keyword, which kills only the module.
    type: float
    default: 60
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Inspect the host
  preflight_host_facts:
    weights_dir: /opt/kimi/weights
    repos:
      target: {repo_id: moonshotai/Kimi-K2.6, files: [{path: config.json, size: 3000}]}
    check_fabricmanager: true
  register: host
"""

RETURN = r"""
pid1:
  description: Name of PID 1 (systemd where it manages services).
  returned: always
  type: str
  sample: systemd
disk:
  description: Free and total bytes where the weights directory is or would be created.
  returned: always
  type: dict
present:
  description: Per repository name, bytes_present and files_present.
  returned: always
  type: dict
fabricmanager:
  description: active (true, false, or null when not checked), installed, and how it was checked.
  returned: always
  type: dict
acs:
  description: >-
    The ACS report of module_utils/tuning/pci_acs.py (the one host_tuning writes) - checked, reason
    when not (or GPUs missing from sysfs), lspci used, GPU bus ids, bridges with their ACSCtl
    flags and the GPUs below them, the redirecting bridges.
  returned: always
  type: dict
"""

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.helpers import (  # noqa: E402
    CommandFailed,
    DeadlineRunner,
    module_runner,
    read_text,
    systemd_is_pid1,
)
from ansible.module_utils.host.inspection import bytes_present, disk_space  # noqa: E402
from ansible.module_utils.tuning.pci_acs import acs_report, acs_unchecked  # noqa: E402


def fabricmanager_state(module: AnsibleModule, systemd: bool, run: DeadlineRunner) -> dict:
    # Installed but stopped is the tuning stage's to fix (it starts it); not installed is not.
    installed = bool(module.get_bin_path("nv-fabricmanager", opt_dirs=["/usr/bin", "/usr/sbin"]))
    try:
        return fabricmanager_probe(module, systemd, run, installed)
    except CommandFailed as exc:
        # As with pgrep missing: unknown, and preflight_evaluate shows why.
        return {"active": None, "installed": installed, "how": str(exc), "state": "unknown"}


def fabricmanager_probe(
    module: AnsibleModule, systemd: bool, run: DeadlineRunner, installed: bool
) -> dict:
    if systemd:
        systemctl = module.get_bin_path("systemctl")
        if systemctl:
            rc, out, _err = run([systemctl, "is-active", "nvidia-fabricmanager"])
            _rc, load, _err = run(
                [systemctl, "show", "-p", "LoadState", "--value", "nvidia-fabricmanager"]
            )
            return {
                "active": rc == 0,
                "installed": installed or load.strip() == "loaded",
                "how": "systemctl is-active",
                "state": out.strip(),
            }
    pgrep = module.get_bin_path("pgrep")
    if not pgrep:
        return {"active": None, "installed": installed, "how": "pgrep missing", "state": "unknown"}
    # -f: the kernel's process name is cut to 15 characters, one short of nv-fabricmanager.
    rc, out, _err = run([pgrep, "-f", "(^|/)nv-fabricmanager( |$)"])
    return {
        "active": rc == 0,
        "installed": installed or rc == 0,
        "how": "process nv-fabricmanager",
        "state": "running" if rc == 0 else "not running",
    }


def acs_state(module: AnsibleModule, bus_ids: list[str], run: DeadlineRunner) -> dict:
    if not bus_ids:
        return acs_unchecked("not asked")
    name = module.params["lspci_path"]
    return acs_report(bus_ids, module.get_bin_path(name), run, lspci_name=name)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "weights_dir": {"type": "path", "required": True},
            "repos": {"type": "dict", "default": {}},
            "check_fabricmanager": {"type": "bool", "default": False},
            "gpu_bus_ids": {"type": "list", "elements": "str", "default": []},
            "lspci_path": {"type": "str", "default": "lspci"},
            "timeout": {"type": "float", "default": 60},
        },
        supports_check_mode=True,
    )
    params = module.params
    run = module_runner(module, "preflight_host_facts", "all commands together", 60)
    present = {
        name: bytes_present(
            os.path.join(params["weights_dir"], repo["repo_id"]), repo.get("files") or []
        )
        for name, repo in params["repos"].items()
    }
    module.exit_json(
        changed=False,
        pid1=read_text("/proc/1/comm") or "unknown",
        disk=disk_space(params["weights_dir"]),
        present=present,
        fabricmanager=(
            fabricmanager_state(module, systemd_is_pid1(), run)
            if params["check_fabricmanager"]
            else {"active": None, "how": "not checked", "state": "unknown"}
        ),
        acs=acs_state(module, params["gpu_bus_ids"], run),
    )


if __name__ == "__main__":
    main()
