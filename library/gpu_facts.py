#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module gpu_facts: GPU inventory and topology of a host, from nvidia-smi."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather NVIDIA GPU facts, topology and P2P status from nvidia-smi
description:
  - Runs C(nvidia-smi -q -x), C(nvidia-smi --query-gpu=pci.bus_id,compute_cap),
    C(nvidia-smi topo -m) and C(nvidia-smi topo -p2p) for n (NVLink), r (read) and w (write),
    reads each GPU's NUMA node from sysfs (falling back to the topology's NUMA affinity),
    and returns them as C(ansible_facts.gpu_facts).
  - Read-only; supports check mode.
  - Fails with a message saying what was found and how to fix it when nvidia-smi is missing,
    the driver is not loaded, or no GPU is visible.
version_added: "0.1.0"
options:
  nvidia_smi_path:
    description: Name or path of nvidia-smi.
    type: str
    default: nvidia-smi
  timeout:
    description: >-
      Seconds all nvidia-smi calls together may take. At the deadline the running one is
      killed with every process it started (its whole process group) and the module fails
      naming the command. Keep it below the task's C(timeout) keyword, which kills only the
      module and would leave a hung nvidia-smi behind.
    type: float
    default: 60
notes:
  - A GPU in a bad state can make nvidia-smi hang; the C(timeout) option bounds it.
  - Fails naming the GPU and the field when a GPU's record lacks its name, UUID, PCI bus id,
    memory size or compute capability.
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Gather GPU facts
  gpu_facts:

- name: Use a specific nvidia-smi
  gpu_facts:
    nvidia_smi_path: /usr/local/nvidia/bin/nvidia-smi

- name: Show the interconnect
  ansible.builtin.debug:
    msg: "{{ ansible_facts.gpu_facts.count }} GPUs over {{ ansible_facts.gpu_facts.interconnect }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to ansible_facts.
  returned: always
  type: complex
  contains:
    gpu_facts:
      description: GPUs, driver and topology.
      returned: always
      type: complex
      contains:
        count:
          description: Number of GPUs.
          type: int
          sample: 8
        driver_version:
          description: NVIDIA driver version.
          type: str
          sample: "580.159.04"
        cuda_version:
          description: Highest CUDA version the driver supports.
          type: str
          sample: "13.0"
        models:
          description: GPU product names with their counts (more than one key for mixed hosts).
          type: dict
          sample: {"NVIDIA H200": 8}
        homogeneous:
          description: Whether every GPU is the same model.
          type: bool
        devices:
          description: >-
            One record per GPU - index, name, architecture, uuid, memory_mib,
            compute_capability (as "9.0"), pci_bus_id, numa_node, persistence_mode,
            mig_mode, mig_enabled, pcie_link_gen_current, pcie_link_gen_max,
            pcie_link_width_current, pcie_link_width_max, fabric_state, fabric_status.
          type: list
          elements: dict
        interconnect:
          description: >-
            C(nvlink) when every GPU pair has NVLink, C(pcie) otherwise, C(single) for one GPU.
          type: str
          sample: nvlink
        links:
          description: GPU x GPU link types from C(topo -m) (X, NV18, PIX, PXB, PHB, NODE, SYS).
          type: list
          elements: list
        p2p:
          description: GPU x GPU P2P status matrices keyed by read, write and nvlink.
          type: dict
        p2p_not_ok:
          description: Per matrix, the GPU pairs whose status is not OK.
          type: dict
        fabric:
          description: NVSwitch fabric state and status summarised over GPUs, and per GPU.
          type: dict
          sample: {"state": "Completed", "status": "Success", "per_gpu": ["Completed"]}
        mig_enabled_gpus:
          description: Indexes of GPUs with MIG enabled.
          type: list
          elements: int
        persistence_mode_off_gpus:
          description: Indexes of GPUs with persistence mode off.
          type: list
          elements: int
"""

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.gpu_topology import GpuFactsError, gather  # noqa: E402
from ansible.module_utils.host.helpers import module_deadline  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "nvidia_smi_path": {"type": "str", "default": "nvidia-smi"},
            "timeout": {"type": "float", "default": 60},
        },
        supports_check_mode=True,
    )
    timeout = module_deadline(module, "all nvidia-smi calls together", 60)
    requested = module.params["nvidia_smi_path"]
    binary = requested if os.path.sep in requested else module.get_bin_path(requested)
    if not binary or not os.access(binary, os.X_OK):
        module.fail_json(
            msg=(
                f"nvidia-smi not found: {requested!r} is not an executable file"
                if os.path.sep in requested
                else f"nvidia-smi not found on PATH {os.environ.get('PATH', '')!r}"
            )
            + (
                ". Needed: the NVIDIA driver, which ships "
                "nvidia-smi. Fix: install the driver (e.g. the distribution's nvidia-driver "
                "package or NVIDIA's .run installer) or set nvidia_smi_path."
            )
        )

    try:
        facts = gather(binary, timeout)
    except GpuFactsError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, ansible_facts={"gpu_facts": facts})


if __name__ == "__main__":
    main()
