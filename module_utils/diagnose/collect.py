"""The support bundle of diagnose.yml: what a person needs to tell why a host does not serve,
collected on each host into one archive and packed on the controller into one tarball.

On the host (`collect`, module diagnose_collect; the means of it are collector.py): GPU state
(`nvidia-smi -q`, `topo -m`), the driver's version and modules, the fabric manager,
persistence daemon and server unit (systemctl where systemd is PID 1, else the processes), the
kernel (uname, cmdline, the NVRM/Xid lines of dmesg), each runtime's `pip freeze` and
`python -m sglang.check_env`, the kit's records (launch, API check, runtime, versions,
canary, preflight, tuning state, ACS report), the end of the server's log and of each canary
log, the NCCL configuration, the server's environment and secrets files with their secret
values masked, and disk usage of the kit's folders.

A broken host is what this is for, so nothing here fails the collection: every command runs
under a deadline (its own, within the collection's), its output is capped (a command printing
without end is killed at the cap), every file is read bounded and only when it is a regular
file reached without a link; what fails, hangs, is missing or is cut is recorded in the host's
manifest.json (command or path, rc, seconds, why) and the collection goes on. Only bad options
fail the module.

Secrets: the values the controller gives (the kit's API key and HF token), and those read on
the host (the server's secrets file, token files, secret-named variables of the environment
file), are masked everywhere, file names included, as they are and in their base64 and unkeyed
hex-digest forms, with the generic patterns of module_utils/host/secret_scrub.py. They are held in
memory only: never written, never returned.

On the controller (module diagnose_bundle, pack.py) each host's archive is read, never
extracted, and packed with the others into one tarball.

Standard library only: the module ships it to hosts (AnsiballZ), whose Pythons may be 3.10.
"""

from __future__ import annotations

import json
import os
import re

from ansible.module_utils.diagnose.collector import Collector
from ansible.module_utils.diagnose.members import (
    ABSENT,
    COLLECTED,
    FAILED,
    HOST_KIND,
    MANIFEST,
    OK,
    SCHEMA_VERSION,
    BadInput,
    add_member,
    safe_part,
    utc_now,
)
from ansible.module_utils.host.helpers import systemd_is_pid1
from ansible.module_utils.host.inspection import disk_space

# Kernel lines about the GPUs: the driver's NVRM messages and its Xid error reports.
XID = re.compile(r"\bXid\b|NVRM")
# What dmesg prints is read up to this much before its NVRM/Xid lines are kept.
DMESG_READ_MAX = 32 << 20


class Collection(Collector):
    """One host's collection under one deadline; `p` holds the module's options. Each step
    collects one source (the kit's records, the server, tuning, the kernel, the services, the
    GPUs, the runtimes, the disk) and a step that fails leaves the others to run."""

    # -- the whole collection --------------------------------------------------------------

    def run(self) -> dict:
        p = self.p
        self.learn_secrets()
        self.open_archive()
        try:
            for step in (
                self.records,
                self.server,
                self.tuning,
                self.kernel,
                self.services,
                self.gpus,
                # The runtimes before du: what a deadline that runs out leaves out should be
                # the least telling.
                self.runtimes,
                self.disk,
            ):
                try:
                    step()
                except Exception as error:
                    # Whatever a broken host does to one step, the others still run.
                    self.record(step.__name__, "(the collector)", FAILED, why=repr(error))
            manifest = self.manifest()
            if self.tar is not None:
                add_member(self.tar, MANIFEST, self.scrub.bytes(manifest))
            self.close_archive()
        except BaseException:
            self.discard()
            raise
        if self.check_mode:
            self.discard()
        counts: dict[str, int] = {}
        for item in self.items:
            counts[item["status"]] = counts.get(item["status"], 0) + 1
        return {
            "archive": self.archive,
            "work_dir": self.work_dir,
            "host": p["host"],
            "counts": counts,
            "problems": [
                {"name": i["name"], "status": i["status"], "why": i.get("why", "")}
                for i in self.items
                if i["status"] not in COLLECTED
            ],
            "bytes": self.total,
            "seconds": round(self.clock() - self.started, 3),
            "masked_values": self.scrub.count,
            "secrets_from": self.secret_sources,
            # Notes name paths, which a secret may be part of.
            "notes": [self.scrub(note) for note in self.notes],
        }

    def manifest(self) -> bytes:
        return (
            json.dumps(
                {
                    "kind": HOST_KIND,
                    "schema_version": SCHEMA_VERSION,
                    "host": self.p["host"],
                    "finished_at": utc_now(),
                    "seconds": round(self.clock() - self.started, 3),
                    "systemd": systemd_is_pid1(),
                    "deadlines": {
                        "collection_s": self.p["timeout"],
                        "command_s": self.p["command_timeout"],
                        "check_env_s": self.p["check_env_timeout"],
                    },
                    "caps": {
                        "item_bytes": self.cap,
                        "host_bytes": self.p["max_host_bytes"],
                        "log_lines": self.p["log_lines"],
                    },
                    "bytes": self.total,
                    "masked_values": self.scrub.count,
                    "secrets_from": self.secret_sources,
                    "notes": self.notes,
                    "items": self.items,
                },
                indent=1,
            )
            + "\n"
        ).encode()

    def records(self) -> None:
        p = self.p
        for name, path in (
            ("records/launch.json", os.path.join(p["server_state_dir"], "launch.json")),
            ("records/api-check.json", os.path.join(p["server_state_dir"], "api-check.json")),
            ("records/runtime.json", os.path.join(p["runtime_state_dir"], "runtime.json")),
            ("records/versions.json", os.path.join(p["runtime_state_dir"], "versions.json")),
            ("results/canary.json", os.path.join(p["canary_dir"], "canary.json")),
            ("results/preflight.json", p["preflight_record"]),
        ):
            self.file(name, path, json_record=True)

    def server(self) -> None:
        p = self.p
        self.file("server/sglang.log", p["log_file"], tail_lines=p["log_lines"])
        self.masked_file("server/sglang-secrets.yaml", p["secrets_file"], self.secrets_file_text)
        env_name = safe_part(os.path.basename(p["env_file"] or "server.env"))
        self.masked_file(f"server/{env_name}", p["env_file"], self.env_file_text)
        self.folder("canary/logs", os.path.join(p["canary_dir"], "logs"), ".log", p["log_lines"])

    def tuning(self) -> None:
        p = self.p
        self.file("nccl/nccl.conf", p["nccl_conf"])
        self.file("tuning/tuning-state.json", p["tuning_state"], json_record=True)
        self.file("tuning/acs-report.json", p["acs_report"], json_record=True)

    def kernel(self) -> None:
        p = self.p
        self.command("kernel/uname.txt", ["uname", "-a"])
        self.file("kernel/cmdline.txt", "/proc/cmdline")
        self.file("driver/version.txt", "/proc/driver/nvidia/version")
        self.file(
            "driver/modules.txt",
            "/proc/modules",
            transform=lambda data: b"".join(
                line for line in data.splitlines(keepends=True) if line.startswith(b"nvidia")
            ),
        )
        limit = p["dmesg_lines"]

        def nvidia_lines(text: str) -> str:
            lines = [line for line in text.splitlines() if XID.search(line)]
            shown = lines[-limit:]
            head = f"[kimi diagnose: {len(lines)} NVRM/Xid lines, the last {len(shown)} kept]\n"
            return head + "".join(line + "\n" for line in shown)

        # Denied on hosts with kernel.dmesg_restrict for non-root: recorded, as anything else.
        self.command(
            "kernel/dmesg-nvrm-xid.txt", [p["dmesg"]], keep=nvidia_lines, cap=DMESG_READ_MAX
        )

    def services(self) -> None:
        p = self.p
        if systemd_is_pid1():
            for unit in (p["fabricmanager_service"], p["persistenced_service"], p["unit_name"]):
                self.command(
                    f"services/{safe_part(unit)}.txt",
                    [p["systemctl"], "status", "--no-pager", "--full", "--lines=50", unit],
                    # 3: inactive or failed, which is what the entry is for; 4: no such unit.
                    ok_codes=(0, 3),
                    absent_codes=(4,),
                )
        else:
            # Without systemd: the processes, as preflight and the supervisor see them.
            self.command(
                "services/processes.txt",
                [
                    p["pgrep"],
                    "-a",
                    "-f",
                    "nv-fabricmanager|nvidia-persistenced|sglang|kimi-supervise",
                ],
                ok_codes=(0, 1),
            )
        self.command(
            "services/nv-fabricmanager-version.txt",
            [p["fabricmanager_binary"], "--version"],
            optional=True,
        )

    def gpus(self) -> None:
        smi = self.p["nvidia_smi"]
        self.command("gpu/nvidia-smi-q.txt", [smi, "-q"])
        self.command("gpu/nvidia-smi-topo-m.txt", [smi, "topo", "-m"])

    def disk(self) -> None:
        p = self.p
        started = self.clock()
        usage = []
        for path in p["disk_paths"]:
            try:
                usage.append({**disk_space(path), "exists": os.path.lexists(path)})
            except OSError as error:
                usage.append({"path": path, "error": error.strerror or str(error)})
        self.add("disk/statvfs.json", json.dumps(usage, indent=1) + "\n", "statvfs", OK, started)
        for path in p["disk_paths"]:
            name = f"disk/du-{safe_part(path.strip('/').replace('/', '-') or 'root')}.txt"
            if not os.path.lexists(path):
                self.record(name, f"du {path}", ABSENT, self.clock(), why="no such folder")
                continue
            # One level down: the runtimes, weights and canary folders each on a line.
            self.command(name, [p["du"], "-k", "-d", "1", path], timeout=p["du_timeout"])

    def runtimes(self) -> None:
        p = self.p
        # check_env asks CUDA: on a GPU that hung nvidia-smi it hangs the same way, so it gets
        # the command deadline then, not its own longer one.
        smi_hung = self.resolve(p["nvidia_smi"]) in self.hung
        check_env_s = p["command_timeout"] if smi_hung else p["check_env_timeout"]
        for kind, python in sorted(p["pythons"].items()):
            folder = f"runtime/{safe_part(kind)}"
            started = self.clock()
            if not os.path.exists(python):
                why = f"no {kind} runtime: {python} does not exist"
                for name in ("pip-freeze.txt", "check-env.txt"):
                    self.record(f"{folder}/{name}", python, ABSENT, started, why=why)
                continue
            self.notes.append(f"The {kind} runtime {python} is {os.path.realpath(python)}.")
            self.command(
                f"{folder}/pip-freeze.txt",
                [python, "-m", "pip", "freeze", "--all", "--disable-pip-version-check"],
            )
            self.command(
                f"{folder}/check-env.txt",
                [python, "-m", "sglang.check_env"],
                timeout=check_env_s,
            )


# Each option's range and the role variable that sets it, for the message.
RANGES = {
    "timeout": (1, 3600, "diagnose_timeout_s"),
    "command_timeout": (1, 3600, "diagnose_command_timeout_s"),
    "check_env_timeout": (1, 3600, "diagnose_check_env_timeout_s"),
    "du_timeout": (1, 3600, "diagnose_du_timeout_s"),
    "max_item_bytes": (4096, 1 << 30, "diagnose_max_item_bytes"),
    "max_host_bytes": (65536, 4 << 30, "diagnose_max_host_bytes"),
    "log_lines": (1, 1_000_000, "diagnose_log_lines"),
    "dmesg_lines": (1, 1_000_000, "diagnose_dmesg_lines"),
}


def check_options(p: dict) -> None:
    """Bad options fail with found, needed, fix; everything else is recorded."""
    for key, (low, high, variable) in RANGES.items():
        if not low <= p[key] <= high:
            raise BadInput(
                f"{key} is {p[key]:g}; needed {low:g} to {high:g}. Fix: set {variable} in "
                "range (the seconds below the task's timeout, which is diagnose_timeout_s "
                "plus a margin)."
            )
    if p["max_item_bytes"] > p["max_host_bytes"]:
        raise BadInput(
            f"max_item_bytes {p['max_item_bytes']} is above max_host_bytes "
            f"{p['max_host_bytes']}; needed an item cap within the host's. Fix: lower "
            "diagnose_max_item_bytes or raise diagnose_max_host_bytes."
        )
    if not os.path.isabs(p["work_dir"]) or not os.path.isdir(p["work_dir"]):
        raise BadInput(
            f"work_dir {p['work_dir']!r} is not an existing absolute folder on the host. "
            "Needed: one to hold the host's archive until it is fetched. Fix: set "
            "diagnose_host_work_dir (default /tmp)."
        )


def collect(p: dict, check_mode: bool = False) -> dict:
    check_options(p)
    return Collection(p, check_mode).run()
