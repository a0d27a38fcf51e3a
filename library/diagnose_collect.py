#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module diagnose_collect: one host's part of the support bundle, scrubbed."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: diagnose_collect
short_description: Collect a host's GPU, driver, kernel, runtime and kit state for a support bundle
description:
  - Writes one archive, C(host.tar.gz), into a new root-only (0700) folder under O(work_dir)
    and returns its path; the caller fetches it and removes the folder (roles/diagnose).
    Work folders of earlier runs that never came back (older than two hours) are removed.
  - Collects C(nvidia-smi -q) and C(nvidia-smi topo -m); the driver's version and modules
    (C(/proc/driver/nvidia/version), C(/proc/modules)); the fabric manager, persistence daemon
    and server unit (C(systemctl status) where systemd is PID 1, else the processes, and
    C(nv-fabricmanager --version)); C(uname -a), C(/proc/cmdline) and the NVRM/Xid lines of
    C(dmesg); per runtime of O(pythons) C(python -m pip freeze) and C(python -m
    sglang.check_env); the launch, API check, runtime, versions, canary and preflight records;
    the last O(log_lines) lines of the server's log and of each canary log; O(nccl_conf), the
    tuning state and ACS report; the server's environment and secrets files with every secret
    value masked; statvfs and C(du -d 1) of O(disk_paths).
  - Every command runs under its own deadline within O(timeout) (killed with its process group
    past it), its output capped at O(max_item_bytes) (a command that prints without end is
    killed at the cap); a tool that hung is not run again. Files are read bounded, only when
    they are regular files reached without a link (a link in a collected folder is recorded,
    never followed). What fails, hangs, is missing, absent or cut is recorded in the archive's
    C(manifest.json) (command or path, rc, seconds, why) and the module still returns ok; it
    fails only on bad options.
  - Every member, file names and the manifest included, is scrubbed of O(secrets) and of the
    secrets read on the host (the values of O(secrets_file), of O(token_files) and of the
    secret-named variables of O(env_file)), as they are, in their base64 forms and as their
    unkeyed hex digests, and of secret-looking patterns (C(hf_) tokens, bearer headers,
    C(api_key) assignments). Those values are held in memory only.
  - Read-only on the host (commands run with HOME in the work folder and no bytecode written);
    supports check mode, where it collects, returns the summary and keeps no archive.
version_added: "0.1.0"
options:
  host:
    description: The host's inventory name, recorded in the manifest.
    type: str
    required: true
  secrets:
    description: Values masked wherever they appear (the kit's API key and HF token); never logged.
    type: list
    elements: str
    default: []
  work_dir:
    description: Existing absolute folder on the host that receives the root-only work folder.
    type: path
    default: /tmp
  pythons:
    description: Runtime kind to its venv's Python (one not installed is recorded absent).
    type: dict
    default: {}
  log_file:
    description: The server's log (both managers write it); its last O(log_lines) lines go in.
    type: path
    default: /var/log/kimi/sglang.log
  secrets_file:
    description: The server's root-only secrets file; its values are learned and shown masked.
    type: path
    default: /etc/kimi/sglang-secrets.yaml
  env_file:
    description: The server's environment file; secret-named variables are learned and shown masked.
    type: path
    default: /etc/kimi/kimi-sglang.env
  token_files:
    description: Files that may hold a Hugging Face token (learned to be masked, never collected).
    type: list
    elements: path
    default: []
  server_state_dir:
    description: Folder of C(launch.json) and C(api-check.json).
    type: path
    default: /var/lib/kimi/server
  runtime_state_dir:
    description: Folder of C(runtime.json) and C(versions.json).
    type: path
    default: /opt/kimi/runtime
  canary_dir:
    description: Folder of C(canary.json) and C(logs/*.log).
    type: path
    default: /opt/kimi/canary
  preflight_record:
    description: Preflight's record on the host.
    type: path
    default: /var/lib/kimi/preflight.json
  nccl_conf:
    description: NCCL's configuration file.
    type: path
    default: /etc/nccl.conf
  tuning_state:
    description: The tuning stage's record of changed values.
    type: path
    default: /var/lib/kimi/tuning-state.json
  acs_report:
    description: The tuning stage's ACS report.
    type: path
    default: /var/lib/kimi/acs-report.json
  disk_paths:
    description: Folders whose filesystem (statvfs) and usage (C(du -k -d 1)) are collected.
    type: list
    elements: path
    default: []
  unit_name:
    description: The server's systemd unit.
    type: str
    default: kimi-sglang
  fabricmanager_service:
    description: The fabric manager's systemd unit.
    type: str
    default: nvidia-fabricmanager
  persistenced_service:
    description: The persistence daemon's systemd unit.
    type: str
    default: nvidia-persistenced
  nvidia_smi:
    description: Name or path of nvidia-smi.
    type: str
    default: nvidia-smi
  systemctl:
    description: Name or path of systemctl.
    type: str
    default: systemctl
  pgrep:
    description: Name or path of pgrep.
    type: str
    default: pgrep
  dmesg:
    description: Name or path of dmesg.
    type: str
    default: dmesg
  du:
    description: Name or path of du.
    type: str
    default: du
  fabricmanager_binary:
    description: Name or path of nv-fabricmanager (absent on PCIe hosts, which is no problem).
    type: str
    default: nv-fabricmanager
  timeout:
    description: >-
      Seconds the whole collection may take; a command still running then is killed and the
      rest are recorded as not run. Keep it below the task's C(timeout) keyword, which kills
      only the module.
    type: float
    default: 600
  command_timeout:
    description: Seconds one command may take (within O(timeout)).
    type: float
    default: 60
  check_env_timeout:
    description: Seconds C(python -m sglang.check_env) may take (it imports torch and asks CUDA).
    type: float
    default: 180
  du_timeout:
    description: Seconds one C(du) may take (a runtime folder holds many files).
    type: float
    default: 60
  max_item_bytes:
    description: Most bytes of one member (a longer file keeps its start, a log its last lines).
    type: int
    default: 4194304
  max_host_bytes:
    description: Most bytes of all members together; an item past it is left out and recorded.
    type: int
    default: 33554432
  log_lines:
    description: Lines kept from the end of the server's log and of each canary log.
    type: int
    default: 500
  dmesg_lines:
    description: NVRM/Xid lines of dmesg kept (the last ones).
    type: int
    default: 2000
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Collect this host's part of the support bundle
  diagnose_collect:
    host: "{{ inventory_hostname }}"
    secrets: "{{ [kimi_server_api_key, kimi_hf_token] | select | list }}"
    pythons: "{{ kimi_runtime_pythons }}"
    disk_paths: [/opt/kimi, /opt/kimi/weights, /var/lib/kimi, /var/log/kimi]
    timeout: 600
  timeout: 720
  no_log: true
  register: collected
"""

RETURN = r"""
archive:
  description: The host's archive (absent in check mode, null then).
  returned: always
  type: str
  sample: /tmp/kimi-diagnose.abc123/host.tar.gz
work_dir:
  description: The root-only work folder to remove after the fetch (null in check mode).
  returned: always
  type: str
counts:
  description: Items per state (ok, cut, absent, missing, failed, timed_out, not_run, left_out).
  returned: always
  type: dict
  sample: {ok: 30, absent: 4, timed_out: 1}
problems:
  description: Each item not collected whole - name, status and why (scrubbed).
  returned: always
  type: list
  elements: dict
bytes:
  description: Bytes of all members before compression.
  returned: always
  type: int
seconds:
  description: How long the collection took.
  returned: always
  type: float
masked_values:
  description: How many secret values were masked (never which).
  returned: always
  type: int
secrets_from:
  description: Where the masked values were learned (file paths, never values).
  returned: always
  type: list
  elements: str
notes:
  description: What the collection noticed (a token file left on the host, the runtimes' folders).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.diagnose.collect import collect  # noqa: E402
from ansible.module_utils.diagnose.members import BadInput  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "host": {"type": "str", "required": True},
            "secrets": {"type": "list", "elements": "str", "default": [], "no_log": True},
            # mkdtemp makes a 0700 folder of its own in it: no shared name is used.
            "work_dir": {"type": "path", "default": "/tmp"},  # noqa: S108
            "pythons": {"type": "dict", "default": {}},
            "log_file": {"type": "path", "default": "/var/log/kimi/sglang.log"},
            "secrets_file": {"type": "path", "default": "/etc/kimi/sglang-secrets.yaml"},
            "env_file": {"type": "path", "default": "/etc/kimi/kimi-sglang.env"},
            "token_files": {"type": "list", "elements": "path", "default": [], "no_log": False},
            "server_state_dir": {"type": "path", "default": "/var/lib/kimi/server"},
            "runtime_state_dir": {"type": "path", "default": "/opt/kimi/runtime"},
            "canary_dir": {"type": "path", "default": "/opt/kimi/canary"},
            "preflight_record": {"type": "path", "default": "/var/lib/kimi/preflight.json"},
            "nccl_conf": {"type": "path", "default": "/etc/nccl.conf"},
            "tuning_state": {"type": "path", "default": "/var/lib/kimi/tuning-state.json"},
            "acs_report": {"type": "path", "default": "/var/lib/kimi/acs-report.json"},
            "disk_paths": {"type": "list", "elements": "path", "default": []},
            "unit_name": {"type": "str", "default": "kimi-sglang"},
            "fabricmanager_service": {"type": "str", "default": "nvidia-fabricmanager"},
            "persistenced_service": {"type": "str", "default": "nvidia-persistenced"},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "systemctl": {"type": "str", "default": "systemctl"},
            "pgrep": {"type": "str", "default": "pgrep"},
            "dmesg": {"type": "str", "default": "dmesg"},
            "du": {"type": "str", "default": "du"},
            "fabricmanager_binary": {"type": "str", "default": "nv-fabricmanager"},
            "timeout": {"type": "float", "default": 600},
            "command_timeout": {"type": "float", "default": 60},
            "check_env_timeout": {"type": "float", "default": 180},
            "du_timeout": {"type": "float", "default": 60},
            "max_item_bytes": {"type": "int", "default": 4 << 20},
            "max_host_bytes": {"type": "int", "default": 32 << 20},
            "log_lines": {"type": "int", "default": 500},
            "dmesg_lines": {"type": "int", "default": 2000},
        },
        supports_check_mode=True,
    )
    try:
        result = collect(dict(module.params), check_mode=module.check_mode)
    except BadInput as error:
        # bad_input tells the role's rescue a refusal (stop) from a broken host (record it).
        module.fail_json(msg=str(error), bad_input=True)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
