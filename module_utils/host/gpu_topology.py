"""Parsing of nvidia-smi output into GPU facts (shared by library/gpu_facts.py and the tests).

Pure functions over text turn what the commands printed into plain data (formats follow real
captures, tests/fixtures/gpu-hosts/h200-x2); gather() runs the commands under one deadline,
killing a hung nvidia-smi with everything it started. A GPU record that lacks a field the
kit uses (name, uuid, bus id, memory, compute capability) is a failure naming the GPU, not a
null that a later stage trips over.
"""

from __future__ import annotations

import os
import re
import time
import xml.etree.ElementTree as ET

from ansible.module_utils.host.helpers import CommandFailed, run_with_deadline

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
NO_DRIVER_MARKERS = (
    "couldn't communicate with the nvidia driver",
    "nvml: driver not loaded",
    "driver/library version mismatch",
    "failed to initialize nvml",
)
NO_DEVICES_MARKERS = ("no devices were found",)
COMPUTE_CAPABILITY = re.compile(r"\d{1,3}\.\d{1,3}")
BUS_ID = re.compile(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
# Per GPU: the fields later stages read, and what each must hold.
MAX_MEMORY_MIB = 1 << 24  # 16 TiB
NEEDED_FIELDS = {
    "name": ("product_name", "the product name, e.g. NVIDIA H200"),
    "uuid": ("uuid", "the GPU's UUID"),
    "pci_bus_id": ("pci/pci_bus_id", "the PCI bus id, as 00000000:18:00.0"),
    "memory_mib": ("fb_memory_usage/total", f"the memory size, from 1 to {MAX_MEMORY_MIB} MiB"),
    "compute_capability": ("compute_cap", "the compute capability, e.g. 9.0"),
}
P2P_KINDS = {"read": "r", "write": "w", "nvlink": "n"}


class GpuFactsError(Exception):
    """A failure with a message that says what was found and how to fix it."""


def classify_failure(rc: int, stdout: str, stderr: str, command: str) -> GpuFactsError:
    """Turn a failed nvidia-smi call into the error a user can act on."""
    said = (stdout + "\n" + stderr).strip()
    lowered = said.lower()
    if any(marker in lowered for marker in NO_DRIVER_MARKERS):
        return GpuFactsError(
            f"The NVIDIA driver is not loaded or does not match its library: `{command}` "
            f"exited {rc} saying: {said!r}. Needed: a loaded NVIDIA driver whose NVML library "
            "matches it. Fix: install the driver for this kernel (or reboot after an upgrade), "
            "then check that `nvidia-smi` lists the GPUs."
        )
    if any(marker in lowered for marker in NO_DEVICES_MARKERS):
        return GpuFactsError(
            f"No GPUs found: `{command}` exited {rc} saying: {said!r}. Needed: at least one "
            "NVIDIA GPU visible to the driver. Fix: check `lspci | grep -i nvidia`, the "
            "GPUs' power and seating, and that they are not bound to vfio or hidden by the VM."
        )
    return GpuFactsError(
        f"`{command}` failed with exit code {rc}: {said!r}. Fix: run it by hand on the host "
        "and repair what it reports."
    )


def _text(element: ET.Element | None, path: str) -> str | None:
    if element is None:
        return None
    value = element.findtext(path)
    if value is None:
        return None
    value = value.strip()
    return None if value in ("", "N/A", "Unknown") else value


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    match = re.match(r"\s*(\d+)", value)
    return int(match.group(1)) if match else None


def normalise_bus_id(bus_id: str) -> str:
    """nvidia-smi's 00000000:18:00.0 as sysfs names it: 0000:18:00.0 (lower case)."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest}".lower()


def parse_query_xml(xml_text: str) -> dict:
    """`nvidia-smi -q -x` into driver, CUDA version and per-GPU records."""
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as exc:
        raise GpuFactsError(
            f"`nvidia-smi -q -x` printed something that is not XML ({exc}). Fix: run it by hand "
            "and check the driver installation."
        ) from exc
    devices = []
    for index, gpu in enumerate(root.findall("gpu")):
        mig = _text(gpu, "mig_mode/current_mig")
        devices.append(
            {
                "index": index,
                "name": _text(gpu, "product_name"),
                "architecture": _text(gpu, "product_architecture"),
                "uuid": _text(gpu, "uuid"),
                "pci_bus_id": _text(gpu, "pci/pci_bus_id") or gpu.get("id"),
                "memory_mib": _int(_text(gpu, "fb_memory_usage/total")),
                "persistence_mode": _text(gpu, "persistence_mode") == "Enabled",
                "mig_mode": mig or "N/A",
                "mig_enabled": mig == "Enabled",
                "pcie_link_gen_current": _int(
                    _text(gpu, "pci/pci_gpu_link_info/pcie_gen/current_link_gen")
                ),
                "pcie_link_gen_max": _int(
                    _text(gpu, "pci/pci_gpu_link_info/pcie_gen/max_link_gen")
                ),
                "pcie_link_width_current": _int(
                    _text(gpu, "pci/pci_gpu_link_info/link_widths/current_link_width")
                ),
                "pcie_link_width_max": _int(
                    _text(gpu, "pci/pci_gpu_link_info/link_widths/max_link_width")
                ),
                "fabric_state": _text(gpu, "fabric/state") or "N/A",
                "fabric_status": _text(gpu, "fabric/status") or "N/A",
            }
        )
    return {
        "driver_version": _text(root, "driver_version"),
        "cuda_version": _text(root, "cuda_version"),
        "devices": devices,
    }


def parse_query_csv(csv_text: str) -> dict[str, str | None]:
    """`--query-gpu=pci.bus_id,compute_cap --format=csv,noheader` keyed by bus id; None
    where nvidia-smi could not read the capability ([N/A])."""
    found = {}
    for line in csv_text.splitlines():
        if not line.strip():
            continue
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 2:
            raise GpuFactsError(f"unexpected --query-gpu line {line!r}")
        bus_id, compute_cap = parts
        found[bus_id.lower()] = compute_cap if COMPUTE_CAPABILITY.fullmatch(compute_cap) else None
    return found


def _matrix_rows(text: str) -> tuple[list[str], list[list[str]]]:
    """Header and the GPU rows of an nvidia-smi topo table (tabs, ANSI codes in the header)."""
    lines = [ANSI_ESCAPE.sub("", line).rstrip("\n") for line in text.splitlines()]
    header: list[str] | None = None
    rows = []
    for line in lines:
        cells = [cell.strip() for cell in line.split("\t")]
        if header is None:
            if any(re.fullmatch(r"GPU\d+", cell) for cell in cells):
                header = [cell for cell in cells if cell]
            continue
        if not line.strip() or line.startswith("Legend"):
            break
        label = cells[0] if cells[0] else (cells[1] if len(cells) > 1 else "")
        if re.fullmatch(r"GPU\d+", label):
            values = cells[1:] if cells[0] else cells[2:]
            rows.append([label, *values])
    if header is None:
        raise GpuFactsError(f"no GPU header row in nvidia-smi topology output: {text[:200]!r}")
    return header, rows


def parse_topo_matrix(text: str) -> dict:
    """`nvidia-smi topo -m`: GPU x GPU link types plus CPU and NUMA affinity per GPU."""
    header, rows = _matrix_rows(text)
    gpu_columns = [i for i, name in enumerate(header) if re.fullmatch(r"GPU\d+", name)]
    links, cpu_affinity, numa_affinity = [], [], []
    for row in rows:
        values = row[1:]
        links.append([values[i] if i < len(values) else "" for i in gpu_columns])
        named = dict(zip(header, values, strict=False))
        cpu_affinity.append(named.get("CPU Affinity"))
        numa = named.get("NUMA Affinity")
        numa_affinity.append(int(numa) if numa and numa.isdigit() else None)
    return {"links": links, "cpu_affinity": cpu_affinity, "numa_affinity": numa_affinity}


def parse_topo_p2p(text: str) -> list[list[str]]:
    """`nvidia-smi topo -p2p r|w|n`: GPU x GPU status (X, OK, NS, CNS, ...)."""
    header, rows = _matrix_rows(text)
    width = len([name for name in header if re.fullmatch(r"GPU\d+", name)])
    return [[cell for cell in row[1:] if cell][:width] for row in rows]


def classify_interconnect(links: list[list[str]]) -> dict:
    """nvlink when every GPU pair has NVLink, pcie otherwise, single for one GPU."""
    count = len(links)
    if count <= 1:
        return {"interconnect": "single", "nvlink_pairs": 0, "gpu_pairs": 0}
    pairs = [(i, j) for i in range(count) for j in range(i + 1, count)]
    nvlink = [(i, j) for i, j in pairs if links[i][j].upper().startswith("NV")]
    return {
        "interconnect": "nvlink" if len(nvlink) == len(pairs) else "pcie",
        "nvlink_pairs": len(nvlink),
        "gpu_pairs": len(pairs),
    }


def pairs_not_ok(matrix: list[list[str]]) -> list[list[int]]:
    """GPU pairs (i < j) whose P2P status is anything but OK."""
    bad = []
    for i, row in enumerate(matrix):
        for j, status in enumerate(row):
            if j > i and status != "OK":
                bad.append([i, j])
    return bad


def summarise_fabric(devices: list[dict]) -> dict:
    states = sorted({d["fabric_state"] for d in devices})
    statuses = sorted({d["fabric_status"] for d in devices})
    return {
        "state": states[0] if len(states) == 1 else "Mixed",
        "status": statuses[0] if len(statuses) == 1 else "Mixed",
        "per_gpu": [d["fabric_state"] for d in devices],
    }


def check_devices(devices: list[dict], parsed: dict) -> None:
    """Every GPU record holds what later stages read; fails naming the GPU and the field."""
    for device in devices:
        for field, (source, needed) in NEEDED_FIELDS.items():
            value = device.get(field)
            if field == "memory_mib":
                good = isinstance(value, int) and 1 <= value <= MAX_MEMORY_MIB
            elif field == "pci_bus_id":
                good = isinstance(value, str) and BUS_ID.fullmatch(value) is not None
            else:
                good = isinstance(value, str) and value != ""
            if not good:
                command = (
                    "nvidia-smi --query-gpu=pci.bus_id,compute_cap"
                    if source == "compute_cap"
                    else f"nvidia-smi -q -x ({source})"
                )
                raise GpuFactsError(
                    f"GPU {device['index']} ({device.get('pci_bus_id') or 'bus id unknown'}): "
                    f"{field} is missing or unreadable ({value!r} from `{command}`); needed: "
                    f"{needed}. Fix: run `nvidia-smi -q -i {device['index']}` by hand; a GPU "
                    "that reports fields as N/A or not at all is usually in a bad state (look "
                    "for Xid errors in `dmesg`, then reset the GPU or reboot the host)."
                )
    for field in ("driver_version", "cuda_version"):
        if not parsed[field]:
            raise GpuFactsError(
                f"`nvidia-smi -q -x` reports no {field}. Needed: the driver's {field}. Fix: run "
                "`nvidia-smi` by hand and repair the driver installation."
            )


def _check_square(matrix: list[list[str]], count: int, command: str) -> None:
    if len(matrix) != count or any(len(row) != count for row in matrix):
        raise GpuFactsError(
            f"`{command}` printed a {len(matrix)}-row GPU table for {count} GPUs. Needed: one "
            "row and one column per GPU that `nvidia-smi -q -x` lists. Fix: run it by hand; "
            "a GPU missing from the topology is usually in a bad state."
        )


def build_facts(
    query_xml: str,
    compute_caps: dict[str, str],
    topo_matrix: str | None,
    p2p: dict[str, str],
    numa_nodes: dict[str, int | None],
) -> dict:
    """Combine every parsed output into the gpu_facts structure."""
    parsed = parse_query_xml(query_xml)
    devices = parsed["devices"]
    if not devices:
        raise GpuFactsError(
            "nvidia-smi ran but reported no GPUs. Needed: at least one NVIDIA GPU. Fix: check "
            "`lspci | grep -i nvidia` and that the GPUs are not bound to another driver."
        )
    topo = parse_topo_matrix(topo_matrix) if topo_matrix and len(devices) > 1 else None
    if topo:
        _check_square(topo["links"], len(devices), "nvidia-smi topo -m")
    for device in devices:
        bus = device["pci_bus_id"] or ""
        device["compute_capability"] = compute_caps.get(bus.lower())
    check_devices(devices, parsed)
    for device in devices:
        bus = device["pci_bus_id"]
        numa = numa_nodes.get(bus.lower())
        if numa is None and topo and device["index"] < len(topo["numa_affinity"]):
            numa = topo["numa_affinity"][device["index"]]
        device["numa_node"] = numa
    models: dict[str, int] = {}
    for device in devices:
        models[device["name"]] = models.get(device["name"], 0) + 1
    links = topo["links"] if topo else [["X"]]
    p2p_matrices = {kind: parse_topo_p2p(text) for kind, text in p2p.items()}
    for kind, matrix in p2p_matrices.items():
        _check_square(matrix, len(devices), f"nvidia-smi topo -p2p {P2P_KINDS.get(kind, kind)}")
    facts = {
        "count": len(devices),
        "driver_version": parsed["driver_version"],
        "cuda_version": parsed["cuda_version"],
        "models": models,
        "homogeneous": len(models) == 1,
        "mig_enabled_gpus": [d["index"] for d in devices if d["mig_enabled"]],
        "persistence_mode_off_gpus": [d["index"] for d in devices if not d["persistence_mode"]],
        "devices": devices,
        "links": links,
        "p2p": p2p_matrices,
        "p2p_not_ok": {kind: pairs_not_ok(m) for kind, m in p2p_matrices.items()},
        "fabric": summarise_fabric(devices),
    }
    facts.update(classify_interconnect(links))
    return facts


def read_numa_nodes(bus_ids: list[str], sysfs: str = "/sys/bus/pci/devices") -> dict:
    """Each GPU's NUMA node from sysfs; None where the platform does not say (-1 on
    single-node machines and most VMs) or the bus id is not one (check_devices says so)."""
    nodes: dict[str, int | None] = {}
    for bus_id in bus_ids:
        try:
            with open(f"{sysfs}/{normalise_bus_id(bus_id)}/numa_node") as handle:
                value = int(handle.read(64).strip())
        except (OSError, ValueError):
            value = -1
        nodes[bus_id.lower()] = value if value >= 0 else None
    return nodes


def gather(binary: str, timeout_s: float) -> dict:
    """Run every nvidia-smi command gpu_facts needs within timeout_s in all; a command still
    running at the deadline is killed with its whole process group (a hung nvidia-smi must
    not outlive the task as an orphan)."""
    deadline = time.monotonic() + timeout_s
    env = {**os.environ, "LC_ALL": "C"}

    def smi(*args: str) -> str:
        command = [binary, *args]
        left = deadline - time.monotonic()
        if left <= 0:
            raise GpuFactsError(
                f"gpu_facts' timeout={timeout_s:g}s ran out before `{' '.join(command)}`. "
                "Fix: check why nvidia-smi is slow (`time nvidia-smi -q -x`; a GPU in a bad "
                "state, or persistence mode off on many GPUs), or raise timeout."
            )
        try:
            rc, out, err = run_with_deadline(
                command, left, env=env, what=f"what was left of gpu_facts' timeout={timeout_s:g}s"
            )
        except CommandFailed as exc:
            raise GpuFactsError(
                f"{exc} The timeout covers all of gpu_facts' nvidia-smi calls together. "
                "A hung nvidia-smi usually means a GPU stuck in the driver. Fix: look for Xid "
                "errors in `dmesg`, run the command by hand, reset the GPU or reboot the host; "
                "raise timeout only if the command is merely slow."
            ) from None
        if rc != 0:
            raise classify_failure(rc, out, err, " ".join(command))
        return out

    query_xml = smi("-q", "-x")
    compute_caps = parse_query_csv(
        smi("--query-gpu=pci.bus_id,compute_cap", "--format=csv,noheader")
    )
    devices = parse_query_xml(query_xml)["devices"]
    bus_ids = [d["pci_bus_id"] for d in devices if d["pci_bus_id"]]
    multi = len(devices) > 1
    topo = smi("topo", "-m") if multi else None
    p2p = {kind: smi("topo", "-p2p", flag) for kind, flag in P2P_KINDS.items()} if multi else {}
    return build_facts(query_xml, compute_caps, topo, p2p, read_numa_nodes(bus_ids))
