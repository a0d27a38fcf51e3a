#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module host_tuning: sets host values for TP all-reduce, records and restores them."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_tuning
short_description: Set, record and restore the host settings a multi-GPU server needs
description:
  - With O(state=present), brings the host to the wanted values and records every value it
    changes, with the value it had before, in O(state_file). With O(state=restored), puts the
    recorded previous values back and removes O(state_file).
  - Sysctls (O(sysctls)) are read and written under O(root)C(/proc/sys); a sysctl this kernel
    does not have is skipped and reported. O(sysctl_conf) makes them survive a reboot.
  - The CPU frequency governor (O(cpu_governor)) is set for every CPU that has
    C(cpufreq/scaling_governor) under O(root)C(/sys/devices/system/cpu); without cpufreq (virtual
    machines) it is skipped and reported.
  - The NCCL environment (O(nccl_environment)) is written to O(nccl_conf) as C(KEY=value)
    lines, which NCCL reads at start (values already in a process environment win).
  - GPU persistence mode (O(persistence_mode)). Where systemd is PID 1, the
    O(persistenced_service) unit is enabled and started; any GPU still without persistence
    mode then gets C(nvidia-smi -pm 1). Elsewhere (containers, hosts without an init system
    that supervises daemons) C(nvidia-smi -pm 1) alone turns it on, until the next reboot.
  - The NVIDIA fabric manager (O(fabricmanager)), which NVSwitch hosts need for NVLink. Where
    systemd is PID 1 the O(fabricmanager_service) unit is enabled and started; elsewhere
    O(fabricmanager_binary) is started with O(fabricmanager_config) unless it already runs.
    Fails before changing anything when it is not installed or its version differs from the
    driver's.
  - An ACS report (O(acs_report_file)) of the PCIe bridges above the GPUs (C(lspci -vvv)
    ACSCtl). It only reports; bridges that redirect peer-to-peer traffic are also warned about.
  - O(root) prefixes every C(/proc/sys) and C(/sys) path, because those are not namespaced;
    tests point it at a fake tree. Files (O(nccl_conf), O(sysctl_conf), O(state_file),
    O(acs_report_file)) are used as given.
  - Supports check mode and diff mode; in check mode nothing is written, the state file
    included, and the result lists what would change.
version_added: "0.1.0"
options:
  state:
    description:
      - V(present) applies and records; V(restored) restores what O(state_file) recorded.
    type: str
    choices: [present, restored]
    default: present
  state_file:
    description: JSON record of every changed value and its previous value (mode 0600).
    type: path
    required: true
  root:
    description: Prefix of the C(/proc/sys) and C(/sys) paths read and written.
    type: path
    default: /
  sysctls:
    description: Sysctl name (dotted) to wanted value, for example C(kernel.numa_balancing=0).
    type: dict
    default: {}
  sysctl_conf:
    description:
      - A C(sysctl.d) file to write the sysctls this kernel has into, so they survive a
        reboot. Unset writes none.
    type: path
  cpu_governor:
    description: Wanted CPU frequency governor. Empty leaves the governor alone.
    type: str
    default: ""
  nccl_environment:
    description:
      - NCCL variables to write to O(nccl_conf); keys start with C(NCCL_), values are strings.
    type: dict
    default: {}
  nccl_conf:
    description: NCCL's configuration file. Unset (or O(nccl_environment) empty) writes none.
    type: path
  persistence_mode:
    description: Turn GPU persistence mode on for every GPU.
    type: bool
    default: false
  persistenced_service:
    description: systemd unit of the NVIDIA persistence daemon.
    type: str
    default: nvidia-persistenced
  fabricmanager:
    description: Make sure the NVIDIA fabric manager is installed, enabled and running.
    type: bool
    default: false
  fabricmanager_service:
    description: systemd unit of the fabric manager.
    type: str
    default: nvidia-fabricmanager
  fabricmanager_binary:
    description: The fabric manager program, name or path (asked for its version).
    type: str
    default: nv-fabricmanager
  fabricmanager_config:
    description: Its configuration file, used where it is started without systemd.
    type: path
    default: /usr/share/nvidia/nvswitch/fabricmanager.cfg
  fabricmanager_start_timeout:
    description: Seconds to wait for the fabric manager to run after starting it.
    type: int
    default: 30
  acs_report_file:
    description: Where to write the ACS report (JSON). Unset writes none.
    type: path
  lspci_path:
    description: Name or path of lspci.
    type: str
    default: lspci
  nvidia_smi_path:
    description: Name or path of nvidia-smi.
    type: str
    default: nvidia-smi
  systemctl_path:
    description: Name or path of systemctl.
    type: str
    default: systemctl
  timeout:
    description:
      - Seconds all commands together may take (nvidia-smi, systemctl, lspci and the fabric
        manager's version; not the wait of O(fabricmanager_start_timeout)). At the deadline
        the running command is killed with its whole process group and the run fails naming
        it, keeping what it changed recorded; a hung lspci leaves the ACS report unchecked
        with that reason instead. Keep it and O(fabricmanager_start_timeout) together below
        the task's C(timeout) keyword, which kills only the module.
    type: float
    default: 180
  service_manager:
    description:
      - How services are handled. V(auto) uses systemd when it is PID 1 and V(direct)
        otherwise.
    type: str
    choices: [auto, systemd, direct]
    default: auto
notes:
  - A restore puts back the recorded previous values whatever the current values are, and
    removes O(state_file) once everything is restored. The ACS report is not removed.
  - The governor and, without systemd, persistence mode and the fabric manager do not
    survive a reboot; run the tuning again after one.
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Tune a PCIe host
  host_tuning:
    state_file: /var/lib/kimi/tuning-state.json
    sysctls:
      kernel.numa_balancing: "0"
    sysctl_conf: /etc/sysctl.d/90-kimi-tuning.conf
    cpu_governor: performance
    nccl_environment:
      NCCL_P2P_DISABLE: "1"
      NCCL_IB_DISABLE: "1"
    nccl_conf: /etc/nccl.conf
    persistence_mode: true
    acs_report_file: /var/lib/kimi/acs-report.json

- name: Tune an NVSwitch host
  host_tuning:
    state_file: /var/lib/kimi/tuning-state.json
    sysctls: {kernel.numa_balancing: "0"}
    nccl_environment: {NCCL_NVLS_ENABLE: "0"}
    nccl_conf: /etc/nccl.conf
    persistence_mode: true
    fabricmanager: true

- name: Put every recorded value back
  host_tuning:
    state: restored
    state_file: /var/lib/kimi/tuning-state.json
"""

RETURN = r"""
changes:
  description: >-
    What this run changed (in check mode, would change; with O(state=restored), restored):
    per change its key, a readable description, the previous and the new value.
  returned: always
  type: list
  elements: dict
  sample: [{"key": "sysctl:kernel.numa_balancing", "description":
    "sysctl kernel.numa_balancing: 1 -> 0", "previous": "1", "value": "0"}]
not_applied:
  description: What was not done, and why (for example no cpufreq on a virtual machine).
  returned: always
  type: list
  elements: dict
  sample: [{"what": "cpu_governor", "reason": "no cpufreq under /sys/devices/system/cpu"}]
recorded:
  description: Keys the state file holds after this run.
  returned: always
  type: list
  elements: str
service_manager:
  description: systemd or direct, as used.
  returned: always
  type: str
gpus:
  description: Per GPU index, bus id, persistence mode and driver version, after the run.
  returned: when nvidia-smi was asked
  type: list
  elements: dict
fabricmanager:
  description: Fabric manager version, driver version, how it runs, whether it is running.
  returned: when O(fabricmanager=true) and O(state=present)
  type: dict
acs:
  description: >-
    The ACS report - checked, reason when not checked, lspci used, GPU bus ids, bridges with
    their ACSCtl flags and whether they redirect, the redirecting bridges.
  returned: when O(acs_report_file) is set and O(state=present)
  type: dict
msg:
  description: A one-line summary.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.helpers import DeadlineRunner  # noqa: E402
from ansible.module_utils.tuning.host_tuning import apply, new_run, restore  # noqa: E402

ARGUMENT_SPEC = {
    "state": {"type": "str", "choices": ["present", "restored"], "default": "present"},
    "state_file": {"type": "path", "required": True},
    "root": {"type": "path", "default": "/"},
    "sysctls": {"type": "dict", "default": {}},
    "sysctl_conf": {"type": "path"},
    "cpu_governor": {"type": "str", "default": ""},
    "nccl_environment": {"type": "dict", "default": {}},
    "nccl_conf": {"type": "path"},
    "persistence_mode": {"type": "bool", "default": False},
    "persistenced_service": {"type": "str", "default": "nvidia-persistenced"},
    "fabricmanager": {"type": "bool", "default": False},
    "fabricmanager_service": {"type": "str", "default": "nvidia-fabricmanager"},
    "fabricmanager_binary": {"type": "str", "default": "nv-fabricmanager"},
    "fabricmanager_config": {
        "type": "path",
        "default": "/usr/share/nvidia/nvswitch/fabricmanager.cfg",
    },
    "fabricmanager_start_timeout": {"type": "int", "default": 30},
    "acs_report_file": {"type": "path"},
    "lspci_path": {"type": "str", "default": "lspci"},
    "nvidia_smi_path": {"type": "str", "default": "nvidia-smi"},
    "systemctl_path": {"type": "str", "default": "systemctl"},
    "timeout": {"type": "float", "default": 180},
    "service_manager": {
        "type": "str",
        "choices": ["auto", "systemd", "direct"],
        "default": "auto",
    },
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    timeout = module.params["timeout"]
    if not 0 < timeout <= 3600:
        module.fail_json(
            msg=f"timeout is {timeout:g}; needed: seconds from above 0 to 3600 for all "
            "commands together. Fix: set it below the task's timeout, e.g. 180."
        )
    run = new_run(
        module.params,
        check=module.check_mode,
        diff=module._diff,
        run_command=DeadlineRunner(timeout, f"host_tuning's timeout={timeout:g}s"),
        which=module.get_bin_path,
        warn=module.warn,
    )
    outcome = restore(run) if module.params["state"] == "restored" else apply(run)
    if outcome.pop("failed", False):
        module.fail_json(**outcome)
    module.exit_json(**outcome)


if __name__ == "__main__":
    main()
