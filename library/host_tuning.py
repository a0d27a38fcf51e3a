#!/usr/bin/python
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
  - kimi-deploy-kit maintainers
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

import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.gpu_topology import normalise_bus_id  # noqa: E402
from ansible.module_utils.pci_acs import (  # noqa: E402
    acs_redirects,
    parse_acs,
    upstream_bridges,
)
from ansible.module_utils.host_tuning import (  # noqa: E402
    GPU_QUERY,
    TuningError,
    cpufreq_governor_files,
    describe,
    dump_state,
    fabricmanager_package_hint,
    file_snapshot,
    load_state,
    nccl_environment_problems,
    new_state,
    parse_gpu_query,
    parse_version,
    read_text,
    record,
    render_nccl_conf,
    render_sysctl_conf,
    sha256_text,
    snapshot_bytes,
    sysctl_path,
    sysctl_problems,
    under_root,
)

ENABLE_FROM = ("disabled",)
MASKED = ("masked", "masked-runtime")
STOP_GRACE_S = 10.0


def public(key: str, entry: dict) -> dict:
    """A change as reported: no file contents, which can be long."""
    previous = entry.get("previous")
    if entry["kind"] == "file":
        previous = {"exists": bool(previous.get("exists"))}
    return {
        "key": key,
        "description": describe(entry),
        "previous": previous,
        "value": entry.get("value"),
    }


def summarise(changes: list[dict]) -> list[str]:
    """Descriptions, with the per-GPU persistence mode changes counted in one line."""
    gpus = [c for c in changes if c["key"].startswith("persistence_mode:")]
    lines = [c["description"] for c in changes if c not in gpus]
    if gpus:
        lines.append(f"persistence mode on {len(gpus)} GPU(s): off -> on")
    return lines


def write_value(path: str, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def write_file(path: str, data: bytes, mode: int) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=".host-tuning-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


class Tuner:
    def __init__(self, module: AnsibleModule):
        self.module = module
        self.params = module.params
        self.check = module.check_mode
        # timezone.utc, not datetime.UTC: hosts may run Python 3.10.
        self.now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: UP017
        self.changes: list[dict] = []
        self.not_applied: list[dict] = []
        self.diffs: list[dict] = []
        self.extra: dict = {}
        self.state_path = self.params["state_file"]
        self.state = new_state()
        self.state_dirty = False
        self.gpu_list: list[dict] | None = None
        self.gpu_error = ""
        self.manager = self.detect_manager()

    # -- plumbing ------------------------------------------------------------------------
    def detect_manager(self) -> str:
        chosen = self.params["service_manager"]
        if chosen != "auto":
            return chosen
        # /proc/1 is the host's (or container's) own PID 1: the PID namespace is per host.
        return "systemd" if read_text("/proc/1/comm") == "systemd" else "direct"

    def run(self, argv: list[str]) -> tuple[int, str, str]:
        return self.module.run_command(argv)

    def binary(self, name: str) -> str | None:
        if os.path.sep in name:
            return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
        return self.module.get_bin_path(name)

    def result(self, **extra) -> dict:
        return {
            "changes": self.changes,
            # Not "skipped": Ansible would take a non-empty one for a skipped task.
            "not_applied": self.not_applied,
            "recorded": list(self.state["changes"]),
            "service_manager": self.manager,
            **({"gpus": self.gpu_list} if self.gpu_list is not None else {}),
            **self.extra,
            **extra,
        }

    def fail(self, msg: str) -> None:
        # What was changed before the failure stays restorable.
        self.save_state()
        self.module.fail_json(
            msg=msg, changed=bool(self.changes) and not self.check, **self.result()
        )

    def note(self, key: str, entry: dict) -> None:
        """A change made (or, in check mode, one that would be made)."""
        if not self.check:
            record(self.state, key, entry, self.now)
            self.state_dirty = True
        self.changes.append(public(key, entry))

    def read_state(self) -> None:
        if not os.path.exists(self.state_path):
            return
        try:
            with open(self.state_path) as handle:
                self.state = load_state(handle.read(), self.state_path)
        except OSError as exc:
            self.module.fail_json(
                msg=f"Cannot read the tuning state file {self.state_path} ({exc}). Fix: run "
                "as root (become: true) or check its permissions.",
                changes=[],
            )
        except TuningError as exc:
            self.module.fail_json(msg=str(exc), changes=[])

    def save_state(self) -> None:
        if self.check or not self.state_dirty:
            return
        try:
            if self.state["changes"]:
                write_file(self.state_path, dump_state(self.state).encode(), 0o600)
            elif os.path.exists(self.state_path):
                os.unlink(self.state_path)
        except OSError as exc:
            self.module.fail_json(
                msg=f"Cannot write the tuning state file {self.state_path} ({exc}); the values "
                f"changed so far are {[c['description'] for c in self.changes]}. Fix: make its "
                "folder writable (become: true) and rerun, which records them again.",
                changed=True,
                changes=self.changes,
            )
        self.state_dirty = False

    # -- GPUs ----------------------------------------------------------------------------
    def query_gpus(self) -> list[dict] | None:
        smi = self.binary(self.params["nvidia_smi_path"])
        if not smi:
            self.gpu_error = f"{self.params['nvidia_smi_path']} not found"
            return None
        rc, out, err = self.run([smi, GPU_QUERY, "--format=csv,noheader"])
        if rc != 0:
            self.gpu_error = f"`nvidia-smi {GPU_QUERY}` exited {rc}: {(out + err).strip()}"
            return None
        try:
            self.gpu_list = parse_gpu_query(out)
        except TuningError as exc:
            self.gpu_error = str(exc)
            return None
        return self.gpu_list

    def gpus(self, needed_for: str) -> list[dict]:
        gpus = self.gpu_list if self.gpu_list is not None else self.query_gpus()
        if gpus is None:
            self.fail(
                f"{needed_for} needs nvidia-smi, which failed: {self.gpu_error}. Fix: install "
                "the NVIDIA driver and check that `nvidia-smi` lists the GPUs, or set "
                "tuning_nvidia_smi_path."
            )
        if not gpus:
            self.fail(f"{needed_for}: nvidia-smi lists no GPU. Fix: check the driver and GPUs.")
        return gpus

    def smi(self, *args: str) -> tuple[int, str]:
        rc, out, err = self.run([self.binary(self.params["nvidia_smi_path"]), *args])
        return rc, (out + err).strip()

    # -- systemd -------------------------------------------------------------------------
    def systemctl(self) -> str:
        path = self.binary(self.params["systemctl_path"])
        if not path:
            self.fail(
                f"systemd is PID 1 but {self.params['systemctl_path']} was not found. Fix: set "
                "tuning_systemctl_path."
            )
        return path

    def unit(self, name: str) -> dict:
        rc, out, err = self.run(
            [
                self.systemctl(),
                "show",
                name,
                "-p",
                "LoadState",
                "-p",
                "ActiveState",
                "-p",
                "UnitFileState",
            ]
        )
        if rc != 0:
            self.fail(f"`systemctl show {name}` exited {rc}: {(out + err).strip()}")
        props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        return {
            "loaded": props.get("LoadState") not in (None, "", "not-found"),
            "unit_file_state": props.get("UnitFileState") or "unknown",
            "active": props.get("ActiveState") == "active",
        }

    def journal_tail(self, name: str) -> str:
        journalctl = self.module.get_bin_path("journalctl")
        if not journalctl:
            return "(journalctl not found)"
        _rc, out, err = self.run([journalctl, "-u", name, "-n", "20", "--no-pager"])
        return (out + err).strip()[-3000:]

    def ensure_service(self, name: str, why: str) -> bool:
        """Enabled and active; False when the unit does not exist."""
        info = self.unit(name)
        if not info["loaded"]:
            return False
        if info["unit_file_state"] in MASKED:
            self.fail(
                f"The {name} unit is masked; {why} needs it enabled and running. Fix: "
                f"`systemctl unmask {name}` if it was masked by mistake, then rerun."
            )
        previous = {"unit_file_state": info["unit_file_state"], "active": info["active"]}
        wanted = dict(previous)
        key = f"service:{name}"
        if info["unit_file_state"] in ENABLE_FROM:
            wanted["unit_file_state"] = "enabled"
            if not self.check:
                rc, out, err = self.run([self.systemctl(), "enable", name])
                if rc != 0:
                    self.fail(f"`systemctl enable {name}` failed ({rc}): {(out + err).strip()}")
                record(self.state, key, self.service_entry(name, previous, wanted), self.now)
                self.state_dirty = True
        if not info["active"]:
            wanted["active"] = True
            if not self.check:
                rc, out, err = self.run([self.systemctl(), "start", name])
                if rc != 0 or not self.unit(name)["active"]:
                    self.fail(
                        f"{name} did not start ({why} needs it): `systemctl start {name}` "
                        f"exited {rc}: {(out + err).strip()}. Its journal:\n"
                        f"{self.journal_tail(name)}\nFix what the journal names and rerun."
                    )
        if wanted != previous:
            self.note(key, self.service_entry(name, previous, wanted))
        return True

    @staticmethod
    def service_entry(name: str, previous: dict, value: dict) -> dict:
        return {"kind": "service", "unit": name, "previous": previous, "value": value}

    # -- processes without systemd -------------------------------------------------------
    @staticmethod
    def pids_named(name: str) -> list[int]:
        """Processes whose program (argv[0]) is `name`; /proc is this host's own."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    argv0 = handle.read().split(b"\0", 1)[0].decode(errors="replace")
            except OSError:
                continue
            if os.path.basename(argv0) == name:
                found.append(int(entry))
        return sorted(found)

    @staticmethod
    def stop_pids(pids: list[int]) -> list[int]:
        """SIGTERM, then SIGKILL after a grace period; the pids still alive after both."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + STOP_GRACE_S
            while time.monotonic() < deadline:
                pids = [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
                pids = [pid for pid in pids if not Tuner.zombie(pid)]
                if not pids:
                    return []
                time.sleep(0.1)
        return pids

    @staticmethod
    def zombie(pid: int) -> bool:
        stat = read_text(f"/proc/{pid}/stat") or ""
        return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]

    # -- apply ---------------------------------------------------------------------------
    def validate(self) -> None:
        params = self.params
        problems = sysctl_problems(params["sysctls"])
        problems += nccl_environment_problems(params["nccl_environment"])
        if params["fabricmanager_start_timeout"] < 1:
            problems.append(
                f"fabricmanager_start_timeout is {params['fabricmanager_start_timeout']}; "
                "needed 1 second or more"
            )
        if problems:
            self.module.fail_json(
                msg="Bad tuning inputs: " + "; ".join(problems) + ". Fix: correct "
                "kimi_nccl_environment (group_vars/<profile>.yml) or the tuning_ variables.",
                changes=[],
            )

    def tune_sysctls(self) -> dict[str, str]:
        present = {}
        for name, value in sorted(self.params["sysctls"].items()):
            value = str(value)
            path = sysctl_path(self.params["root"], name)
            current = read_text(path)
            if current is None:
                self.not_applied.append(
                    {"what": f"sysctl {name}", "reason": f"{path} does not exist in this kernel"}
                )
                continue
            present[name] = value
            if current.split() == value.split():
                continue
            if not self.check:
                try:
                    write_value(path, value)
                except OSError as exc:
                    self.fail(
                        f"Cannot set {name} to {value} (found {current}; {exc}). Needed: root on "
                        "the host itself; /proc/sys is read-only in most containers. Fix: set "
                        f"it on the host (sysctl -w {name}={value}), or remove it from "
                        "tuning_sysctls."
                    )
            self.note(
                f"sysctl:{name}",
                {"kind": "sysctl", "name": name, "path": path, "previous": current, "value": value},
            )
        return present

    def tune_governor(self) -> None:
        wanted = self.params["cpu_governor"]
        if not wanted:
            return
        files = cpufreq_governor_files(self.params["root"])
        if not files:
            self.not_applied.append(
                {
                    "what": "cpu_governor",
                    "reason": "no cpufreq under "
                    f"{under_root(self.params['root'], '/sys/devices/system/cpu')} (a virtual "
                    "machine, or no cpufreq driver): nothing to set",
                }
            )
            return
        previous, paths = {}, {}
        for cpu, path in files:
            available = read_text(
                os.path.join(os.path.dirname(path), "scaling_available_governors")
            )
            if available is not None and wanted not in available.split():
                self.fail(
                    f"The CPU governor {wanted} is not available on {cpu} (available: "
                    f"{available}). Fix: set tuning_cpu_governor to one of those, or to an empty "
                    "string to leave the governor alone."
                )
            current = read_text(path)
            if current != wanted:
                previous[cpu], paths[cpu] = current, path
        if not previous:
            return
        if not self.check:
            for cpu, path in paths.items():
                try:
                    write_value(path, wanted)
                except OSError as exc:
                    self.fail(
                        f"Cannot set the {wanted} governor on {cpu} ({exc}). Needed: root on the "
                        "host; Fix: run as root, or set tuning_cpu_governor to an empty string."
                    )
        self.note(
            "cpufreq:scaling_governor",
            {
                "kind": "cpufreq",
                "name": "scaling_governor",
                "paths": paths,
                "previous": previous,
                "value": wanted,
            },
        )

    def manage_file(self, path: str, text: str) -> None:
        data = text.encode()
        snapshot = file_snapshot(path)
        if snapshot_bytes(snapshot) == data and snapshot.get("mode") == "0644":
            return
        before = snapshot_bytes(snapshot)
        self.diffs.append(
            {
                "before_header": path,
                "after_header": path,
                "before": before.decode(errors="replace") if before is not None else "",
                "after": text,
            }
        )
        if not self.check:
            try:
                write_file(path, data, 0o644)
            except OSError as exc:
                self.fail(f"Cannot write {path} ({exc}). Fix: run as root (become: true).")
        self.note(
            f"file:{path}",
            {
                "kind": "file",
                "path": path,
                "previous": snapshot,
                "value": {"sha256": sha256_text(text)},
            },
        )

    def tune_persistence(self) -> None:
        gpus = self.gpus("Turning on persistence mode")
        before = {gpu["bus_id"]: gpu["persistence_mode"] for gpu in gpus}
        if self.manager == "systemd":
            name = self.params["persistenced_service"]
            if not self.ensure_service(name, "persistence mode"):
                self.not_applied.append(
                    {
                        "what": f"service {name}",
                        "reason": "unit not found; persistence mode set with nvidia-smi -pm 1",
                    }
                )
            elif not self.check:
                # The daemon may have turned it on already (unless its unit says otherwise).
                gpus = self.query_gpus() or gpus
        if any(not gpu["persistence_mode"] for gpu in gpus) and not self.check:
            rc, out = self.smi("-pm", "1")
            after = self.query_gpus() or []
            still_off = [gpu["bus_id"] for gpu in after if not gpu["persistence_mode"]]
            if rc != 0 or still_off:
                self.fail(
                    f"Persistence mode is still off on GPUs {still_off or list(before)}: "
                    f"`nvidia-smi -pm 1` exited {rc}: {out}. Needed: root on the host (a "
                    "container cannot change it). Fix: run `nvidia-smi -pm 1` on the host, or "
                    "enable nvidia-persistenced there."
                )
        for bus_id, was_on in before.items():
            if not was_on:
                self.note(
                    f"persistence_mode:{bus_id}",
                    {
                        "kind": "persistence_mode",
                        "bus_id": bus_id,
                        "previous": False,
                        "value": True,
                    },
                )

    def check_fabricmanager(self) -> dict:
        """Installed and matching the driver; nothing is changed before this passes."""
        params = self.params
        gpus = self.gpus("The fabric manager check")
        driver = gpus[0]["driver_version"]
        name = params["fabricmanager_service"]
        program = self.binary(params["fabricmanager_binary"])
        info = {"driver_version": driver, "version": None, "how": self.manager}
        unit_found = self.manager == "systemd" and self.unit(name)["loaded"]
        if not program and not unit_found:
            where = (
                f"no {name} unit and no {params['fabricmanager_binary']} on PATH"
                if self.manager == "systemd"
                else f"no {params['fabricmanager_binary']} on PATH"
            )
            self.fail(
                f"The NVIDIA fabric manager is not installed: found {where}. Needed: NVSwitch "
                "hosts need it running, at the driver's version, or NVLink stays down and CUDA "
                f"cannot use the GPUs. Fix: {fabricmanager_package_hint(driver)}, then rerun."
            )
        if program:
            rc, out, err = self.run([program, "--version"])
            info["version"] = parse_version(out + err) if rc == 0 else None
            if info["version"] is None:
                self.module.warn(
                    f"`{program} --version` printed no version (exit {rc}); cannot compare "
                    f"it with driver {driver}."
                )
            elif info["version"] != driver:
                self.fail(
                    f"The fabric manager is version {info['version']} but the driver is "
                    f"{driver}; the fabric manager refuses to run with a different driver "
                    f"version. Fix: {fabricmanager_package_hint(driver)}, or update the driver "
                    f"to {info['version']}; then rerun."
                )
        else:
            self.module.warn(
                f"{params['fabricmanager_binary']} is not on PATH; the {name} unit exists, so "
                f"its version could not be compared with driver {driver}."
            )
        info["program"] = program
        return info

    def tune_fabricmanager(self, info: dict) -> None:
        params = self.params
        if self.manager == "systemd":
            self.ensure_service(params["fabricmanager_service"], "NVLink through NVSwitch")
            info["running"] = True
            self.extra["fabricmanager"] = info
            return
        name = os.path.basename(params["fabricmanager_binary"])
        if self.pids_named(name):
            info["running"] = True
            self.extra["fabricmanager"] = info
            return
        config = params["fabricmanager_config"]
        if not os.path.isfile(config):
            self.fail(
                f"{name} is not running and its configuration {config} does not exist. Fix: "
                "reinstall the fabric manager package, or set tuning_fabricmanager_config to "
                "its fabricmanager.cfg."
            )
        if not self.check:
            self.start_daemon([info["program"], "-c", config], name)
        info["running"] = not self.check
        self.extra["fabricmanager"] = info
        self.note(
            f"process:{name}", {"kind": "process", "name": name, "previous": False, "value": True}
        )

    def start_daemon(self, argv: list[str], name: str) -> None:
        # Detached, with its standard streams on /dev/null: a daemon that kept the module's
        # pipes open would block run_command (and the task) forever.
        timeout = self.params["fabricmanager_start_timeout"]
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            self.fail(f"Cannot start {' '.join(argv)} ({exc}).")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.pids_named(name):
                return
            if proc.poll() not in (None, 0):
                break
            time.sleep(0.2)
        log = read_text("/var/log/fabricmanager.log") or "(no /var/log/fabricmanager.log)"
        self.fail(
            f"{name} did not stay running within {timeout}s of `{' '.join(argv)}` (exit "
            f"{proc.poll()}). Its log ends:\n{log[-3000:]}\nFix what the log names (driver "
            "version, NVSwitch state) and rerun."
        )

    def acs_report(self) -> None:
        params = self.params
        report = {
            "checked": False,
            "reason": None,
            "lspci": None,
            "gpus": [],
            "bridges": [],
            "redirecting": [],
        }
        gpus = self.gpu_list if self.gpu_list is not None else self.query_gpus()
        lspci = self.binary(params["lspci_path"])
        if gpus is None:
            report["reason"] = f"nvidia-smi failed, so the GPUs are unknown: {self.gpu_error}"
        elif not lspci:
            report["reason"] = (
                f"lspci not found ({params['lspci_path']}): install pciutils to read the ACS "
                "state of the PCIe bridges; nothing was checked"
            )
        else:
            report["lspci"] = lspci
            report["gpus"] = [normalise_bus_id(gpu["bus_id"]) for gpu in gpus]
            bridges: dict[str, dict] = {}
            missing = []
            for bus_id in report["gpus"]:
                device = under_root(params["root"], f"/sys/bus/pci/devices/{bus_id}")
                if not os.path.exists(device):
                    missing.append(bus_id)
                    continue
                for bridge in upstream_bridges(device):
                    if bridge not in bridges:
                        rc, out, _err = self.run([lspci, "-vvv", "-s", bridge])
                        flags = parse_acs(out) if rc == 0 else None
                        bridges[bridge] = {
                            "bdf": bridge,
                            "acsctl": flags,
                            "redirects": acs_redirects(flags),
                            "gpus": [],
                        }
                    bridges[bridge]["gpus"].append(bus_id)
            report["bridges"] = [bridges[bdf] for bdf in sorted(bridges)]
            report["redirecting"] = [b["bdf"] for b in report["bridges"] if b["redirects"]]
            report["checked"] = bool(bridges) or not missing
            if missing:
                report["reason"] = (
                    f"GPUs {', '.join(missing)} not found under "
                    f"{under_root(params['root'], '/sys/bus/pci/devices')}"
                )
        self.extra["acs"] = report
        if report["redirecting"]:
            p2p_off = params["nccl_environment"].get("NCCL_P2P_DISABLE") == "1"
            advice = (
                "NCCL_P2P_DISABLE=1 is set, so NCCL does not send P2P through them; to use P2P, "
                "turn ACS off for these bridges (BIOS, or setpci at boot)."
                if p2p_off
                else "NCCL P2P is on: set NCCL_P2P_DISABLE=1 in kimi_nccl_environment, or turn "
                "ACS off for these bridges (BIOS, or setpci at boot)."
            )
            self.module.warn(
                f"ACS redirects peer-to-peer traffic on PCIe bridges {report['redirecting']}: "
                "GPU-to-GPU transfers through them go up to the root complex, or hang. "
                f"{advice} The kit only reports ACS, it never changes it."
            )
        elif not report["checked"]:
            self.module.warn(f"ACS not checked: {report['reason']}")
        text = json.dumps(report, indent=2, sort_keys=True) + "\n"
        path = params["acs_report_file"]
        if read_text(path) == text.strip():
            return
        self.extra["acs_report_written"] = True
        if not self.check:
            try:
                write_file(path, text.encode(), 0o644)
            except OSError as exc:
                self.fail(f"Cannot write the ACS report {path} ({exc}). Fix: run as root.")

    def present(self) -> None:
        params = self.params
        self.validate()
        self.read_state()
        fabric = self.check_fabricmanager() if params["fabricmanager"] else None
        values = self.tune_sysctls()
        self.tune_governor()
        if params["nccl_conf"] and params["nccl_environment"]:
            self.manage_file(params["nccl_conf"], render_nccl_conf(params["nccl_environment"]))
        if params["sysctl_conf"] and values:
            self.manage_file(params["sysctl_conf"], render_sysctl_conf(values))
        if params["persistence_mode"]:
            self.tune_persistence()
        if fabric is not None:
            self.tune_fabricmanager(fabric)
        if params["acs_report_file"]:
            self.acs_report()
        self.save_state()
        changed = bool(self.changes) or bool(self.extra.get("acs_report_written"))
        verb = "would change" if self.check else "changed"
        summary = (
            f"{verb} {len(self.changes)} value(s): " + "; ".join(summarise(self.changes))
            if self.changes
            else "every value already as wanted"
        )
        extra = {"diff": self.diffs} if self.diffs and self.module._diff else {}
        self.module.exit_json(changed=changed, msg=summary, **self.result(**extra))

    # -- restore -------------------------------------------------------------------------
    def restore_entry(self, entry: dict) -> bool:
        """Put one previous value back; whether anything had to change."""
        kind = entry["kind"]
        if kind == "sysctl":
            current = read_text(entry["path"])
            if current is None or current.split() == str(entry["previous"]).split():
                return False
            if not self.check:
                write_value(entry["path"], entry["previous"])
            return True
        if kind == "cpufreq":
            differs = {
                cpu: gov
                for cpu, gov in entry["previous"].items()
                if gov is not None and read_text(entry["paths"][cpu]) not in (None, gov)
            }
            if not self.check:
                for cpu, gov in differs.items():
                    write_value(entry["paths"][cpu], gov)
            return bool(differs)
        if kind == "file":
            snapshot = entry["previous"]
            current = file_snapshot(entry["path"])
            if current == snapshot:
                return False
            if not self.check:
                if snapshot.get("exists"):
                    write_file(entry["path"], snapshot_bytes(snapshot), int(snapshot["mode"], 8))
                else:
                    os.unlink(entry["path"])
            return True
        if kind == "persistence_mode":
            gpus = self.query_gpus()
            if gpus is None:
                raise TuningError(f"nvidia-smi failed: {self.gpu_error}")
            now = {gpu["bus_id"]: gpu["persistence_mode"] for gpu in gpus}
            if entry["bus_id"] not in now or now[entry["bus_id"]] == entry["previous"]:
                return False
            if not self.check:
                rc, out = self.smi("-i", entry["bus_id"], "-pm", "1" if entry["previous"] else "0")
                if rc != 0:
                    raise TuningError(f"`nvidia-smi -i {entry['bus_id']} -pm` exited {rc}: {out}")
            return True
        if kind == "service":
            name, previous = entry["unit"], entry["previous"]
            info = self.unit(name)
            if not info["loaded"]:
                return False
            steps = []
            if previous["unit_file_state"] in ENABLE_FROM and info["unit_file_state"] == "enabled":
                steps.append("disable")
            if not previous["active"] and info["active"]:
                steps.append("stop")
            if not self.check:
                for step in steps:
                    rc, out, err = self.run([self.systemctl(), step, name])
                    if rc != 0:
                        raise TuningError(f"`systemctl {step} {name}` exited {rc}: {out}{err}")
            return bool(steps)
        if kind == "process":
            pids = self.pids_named(entry["name"])
            if entry["previous"] or not pids:
                return False
            if not self.check:
                left = self.stop_pids(pids)
                if left:
                    raise TuningError(f"{entry['name']} (pids {left}) did not stop")
            return True
        raise TuningError(f"unknown kind {kind!r} in the state file")

    def restored(self) -> None:
        self.read_state()
        if not os.path.exists(self.state_path):
            self.module.exit_json(
                changed=False, msg=f"nothing to restore: no {self.state_path}", **self.result()
            )
        failures = []
        for key, entry in reversed(list(self.state["changes"].items())):
            try:
                differed = self.restore_entry(entry)
            except (TuningError, OSError, KeyError) as exc:
                failures.append(f"{key}: {exc}")
                continue
            restored = {**public(key, entry), "changed": differed}
            restored["description"] = "restore " + describe(entry, restore=True)
            self.changes.append(restored)
            if not self.check:
                del self.state["changes"][key]
                self.state_dirty = True
        self.save_state()
        if failures:
            self.module.fail_json(
                msg=f"Could not restore {len(failures)} value(s): {'; '.join(failures)}. They "
                f"stay in {self.state_path}; fix the cause and run the restore again.",
                changed=bool(self.changes) and not self.check,
                **self.result(),
            )
        verb = "would restore" if self.check else "restored"
        self.module.exit_json(
            changed=True,
            msg=f"{verb} {len(self.changes)} recorded value(s) and "
            f"{'would remove' if self.check else 'removed'} {self.state_path}",
            **self.result(),
        )


def main() -> None:
    module = AnsibleModule(
        argument_spec={
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
            "service_manager": {
                "type": "str",
                "choices": ["auto", "systemd", "direct"],
                "default": "auto",
            },
        },
        supports_check_mode=True,
    )
    tuner = Tuner(module)
    if module.params["state"] == "restored":
        tuner.restored()
    else:
        tuner.present()


if __name__ == "__main__":
    main()
