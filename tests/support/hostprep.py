"""Fake GPU-host state on SSH test hosts for the tuning stage: kernel values under a private
/srv tree (kernel.numa_balancing and cpufreq are not namespaced, so the role's root prefix
points there), persistence mode of the fake nvidia-smi, a fake fabric manager."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

FAKES = Path(__file__).resolve().parent / "fakes"

SYS_ROOT = "/srv/fakesys"
FM_CONFIG = "/usr/local/share/nvidia/nvswitch/fabricmanager.cfg"
EXTRAVARS = {
    # The hosts' /srv is their own: the role never reaches this machine's kernel values.
    "tuning_sys_root": SYS_ROOT,
    # No GPU or torch on test hosts.
    "tuning_allreduce_check": False,
    "tuning_lspci_path": "/usr/local/bin/lspci",
    # /usr/share is shared with this machine; the host's own /usr/local is not.
    "tuning_fabricmanager_config": FM_CONFIG,
}


def put_file(cluster, host: str, path: str, data: bytes, mode: str = "0644") -> None:
    """Writes data to path on a test host through SSH (its /tmp is its own, so the controller's
    files there are not the host's); any size, as base64 on stdin."""
    cluster.ssh(
        host,
        f"mkdir -p {os.path.dirname(path)} && base64 -d > {path} && chmod {mode} {path}",
        input=base64.b64encode(data).decode(),
    )


def prepare_host(cluster, name: str, cpufreq: bool) -> None:
    """Fake kernel values under /srv, every GPU with persistence mode off."""
    lines = [
        f"mkdir -p {SYS_ROOT}/proc/sys/kernel",
        f"echo 1 > {SYS_ROOT}/proc/sys/kernel/numa_balancing",
    ]
    if cpufreq:
        for cpu in range(2):
            base = f"{SYS_ROOT}/sys/devices/system/cpu/cpu{cpu}/cpufreq"
            lines += [
                f"mkdir -p {base}",
                f"echo powersave > {base}/scaling_governor",
                f"echo 'performance powersave' > {base}/scaling_available_governors",
            ]
    gpus = 2 if name.startswith("h200") else 8
    modes = json.dumps({str(i): "Disabled" for i in range(gpus)})
    lines += [
        "mkdir -p /etc/fake-nvidia-smi",
        f"echo '{modes}' > /etc/fake-nvidia-smi/persistence_mode.json",
    ]
    cluster.ssh(name, " && ".join(lines))


# NVIDIA's packaged unit, pointed at the fake daemon and its config under /usr/local.
FM_UNIT = f"""[Unit]
Description=NVIDIA fabric manager service
After=network-online.target
Requires=network-online.target

[Service]
User=root
PrivateTmp=false
Type=forking
ExecStart=/usr/local/bin/nv-fabricmanager -c {FM_CONFIG}
LimitCORE=infinity

[Install]
WantedBy=multi-user.target
"""


def install_fabricmanager(cluster, name: str) -> None:
    """A fake nv-fabricmanager of the captures' driver version, with its config file; on a
    systemd host also its unit, installed (not enabled, not started) as the package leaves it."""
    put_file(
        cluster,
        name,
        "/usr/local/bin/nv-fabricmanager",
        (FAKES / "nv_fabricmanager").read_bytes(),
        "0755",
    )
    put_file(cluster, name, FM_CONFIG, b"LOG_LEVEL=4\n")
    if cluster.host(name).init == "systemd":
        unit = "/usr/local/lib/systemd/system/nvidia-fabricmanager.service"
        put_file(cluster, name, unit, FM_UNIT.encode())
        cluster.ssh(name, "systemctl daemon-reload")


def install_git_source(cluster, name: str, folder: Path) -> str:
    """Copies the bare repository tests/fake_sglang.build_git_source() made under folder onto a
    host (its /tmp is not the controller's) and returns the URL the git runtime clones from."""
    archive = subprocess.run(
        ["tar", "-C", str(folder), "-czf", "-", "sglang.git"],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    put_file(cluster, name, "/root/sglang-git.tgz", archive)
    cluster.ssh(name, "mkdir -p /srv/git && tar -C /srv/git -xzf /root/sglang-git.tgz")
    return "file:///srv/git/sglang.git"


def warning_text(result: dict) -> str:
    """Warnings as text, whether plain strings or ansible-core 2.19's structured summaries."""
    return json.dumps(result.get("warnings", []))


def pcie_tree(root: Path, redirecting: str) -> dict[str, str]:
    """Four PCIe switches with two GPUs each, as in the ct200 capture, as sysfs links them;
    returns the ACSCtl flags per bridge (all off but `redirecting`)."""
    acsctl = {}
    gpus = ["05", "06", "45", "46", "85", "86", "c5", "c6"]
    for switch in range(4):
        rc = switch * 0x40
        root_port = f"0000:{rc:02x}:01.1"
        upstream = f"0000:{rc + 1:02x}:00.0"
        for slot, gpu in enumerate(gpus[2 * switch : 2 * switch + 2]):
            downstream = f"0000:{rc + 2:02x}:{slot:02x}.0"
            device = (
                root / "sys/devices" / f"pci0000:{rc:02x}" / root_port / upstream / downstream
            ) / f"0000:{gpu}:00.0"
            device.mkdir(parents=True)
            link = root / "sys/bus/pci/devices" / f"0000:{gpu}:00.0"
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(device, link.parent))
            off = "SrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-"
            acsctl[downstream] = off
        acsctl[upstream] = off
    acsctl[redirecting] = (
        "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"
    )
    return acsctl
