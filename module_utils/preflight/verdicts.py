"""Preflight verdicts: every check's finding, in words that say what was found, what is needed
and how to fix it. Pure functions over facts gathered by other modules."""

from __future__ import annotations

from dataclasses import dataclass

from ansible.module_utils.contract.profiles import PROFILES

GIB = 1 << 30

CHECKS = (
    "gpu_count",
    "gpu_model",
    "compute_capability",
    "driver",
    "persistence_mode",
    "fabricmanager",
    "fabric_state",
    "p2p",
    "acs",
    "disk",
    "hf_token",
    "hub_access",
    "capacity",
    "context_length",
)
# Below this the INT4 Marlin MoE kernels that serve K2.6's experts do not run.
MIN_COMPUTE_CAPABILITY = (8, 0)


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


class Findings:
    def __init__(self, warn_only: list[str]):
        self.warn_only = set(warn_only)
        self.items: list[dict] = []

    def add(self, check: str, ok: bool, message: str, warn: bool = False) -> None:
        if ok:
            self.items.append({"check": check, "ok": True, "severity": "ok", "message": "passed"})
            return
        severity = "warning" if warn or check in self.warn_only else "failure"
        self.items.append({"check": check, "ok": False, "severity": severity, "message": message})

    def of(self, severity: str) -> list[str]:
        return [f"[{i['check']}] {i['message']}" for i in self.items if i["severity"] == severity]


@dataclass(frozen=True)
class Facts:
    """What one host's checks read: the gathered facts and the settings they are held to."""

    gpu: dict
    expected: dict
    backend_capabilities: dict[str, list[str]]
    host: dict
    hub: dict | None
    needed_repos: list[str]
    capacity: dict[str, dict]
    disk_headroom_gib: float

    @property
    def count(self) -> int:
        return self.gpu["count"]

    @property
    def tp_size(self) -> int:
        return self.expected["tp_size"]

    @property
    def models(self) -> str:
        return ", ".join(f"{name} x{n}" for name, n in self.gpu["models"].items())


def check_gpu_count(findings: Findings, facts: Facts) -> None:
    count, tp_size = facts.count, facts.tp_size
    findings.add(
        "gpu_count",
        count >= tp_size,
        f"found {count} GPUs ({facts.models}); needed at least {tp_size} for tp_size {tp_size}. "
        "Fix: use a host with enough GPUs, check that all are visible (`nvidia-smi -L`), "
        "or lower kimi_tp_size.",
    )


def check_gpu_model(findings: Findings, facts: Facts) -> None:
    wanted = facts.expected["gpu_model"]
    wrong = sorted({name for name in facts.gpu["models"] if not name.startswith(wanted)})
    findings.add(
        "gpu_model",
        not wrong,
        f"found {facts.models}; the {facts.expected['profile']} profile needs {wanted}. Fix: put "
        f"the host in the inventory group of its hardware profile ({', '.join(PROFILES)}), or "
        "override kimi_gpu_model for a GPU variant.",
    )


def check_compute_capability(findings: Findings, facts: Facts) -> None:
    capabilities = sorted({d["compute_capability"] for d in facts.gpu["devices"]})
    for cc in capabilities:
        found = f"compute capability {cc} ({facts.models})"
        if version_tuple(cc or "0") < MIN_COMPUTE_CAPABILITY:
            findings.add(
                "compute_capability",
                False,
                f"{found} is below 8.0; Kimi K2.6's INT4 experts need Ampere or newer. Fix: "
                "use a supported GPU (see the profiles in group_vars/).",
            )
            continue
        for role, backend in facts.expected["attention_backends"].items():
            _check_backend(findings, facts.backend_capabilities, role, backend, cc, found)


def _check_backend(
    findings: Findings,
    backend_capabilities: dict[str, list[str]],
    role: str,
    backend: str,
    cc: str,
    found: str,
) -> None:
    supported = backend_capabilities.get(backend)
    if supported is None:
        findings.add(
            "compute_capability",
            False,
            f"{role} attention backend {backend!r} is not known; known: "
            f"{', '.join(sorted(backend_capabilities))}. Fix: set it to one of them.",
        )
        return
    usable = sorted(b for b, ccs in backend_capabilities.items() if cc in ccs)
    findings.add(
        "compute_capability",
        cc in supported,
        f"{role} attention backend {backend} does not run on {found}; it needs "
        f"{' or '.join(supported)}. Fix: set the {role} backend to one that runs "
        f"there: {', '.join(usable) or 'none known'}.",
    )


def check_driver(findings: Findings, facts: Facts) -> None:
    minimum = facts.expected["min_driver_version"]
    driver = facts.gpu.get("driver_version") or "0"
    findings.add(
        "driver",
        version_tuple(driver) >= version_tuple(minimum),
        f"NVIDIA driver {driver} found; needed {minimum} or newer (CUDA "
        f"{facts.expected['cuda']} builds of the pinned PyTorch). Fix: upgrade the driver and "
        "reboot.",
    )


def check_persistence_mode(findings: Findings, facts: Facts) -> None:
    off = facts.gpu.get("persistence_mode_off_gpus") or []
    findings.add(
        "persistence_mode",
        not off,
        f"persistence mode is off on GPUs {off}; needed on for every GPU (no driver re-init "
        "between processes). Fix: the tuning stage enables nvidia-persistenced, or run "
        "`nvidia-smi -pm 1`.",
    )


def check_interconnect(findings: Findings, facts: Facts) -> None:
    """NVSwitch hosts: the fabric manager, the fabric and NVLink P2P; PCIe hosts: P2P and ACS."""
    if facts.expected["interconnect"] == "nvlink":
        startable = check_fabricmanager(findings, facts)
        check_fabric_state(findings, facts, startable)
        check_nvlink_p2p(findings, facts)
    else:
        check_pcie_p2p(findings, facts)
        check_acs(findings, facts)


def check_fabricmanager(findings: Findings, facts: Facts) -> bool:
    """The fabricmanager finding; True when it is installed but stopped (startable)."""
    fabric = facts.host.get("fabricmanager") or {}
    # Installed but stopped: the tuning stage enables and starts it, so only warn here.
    startable = fabric.get("active") is not True and fabric.get("installed") is True
    findings.add(
        "fabricmanager",
        fabric.get("active") is True,
        f"nvidia-fabricmanager is {fabric.get('state', 'unknown')} ({fabric.get('how')}); "
        "NVSwitch hosts need it active, at the driver's version, or NVLink stays down. "
        + (
            "It is installed: the tuning stage enables and starts it."
            if startable
            else "Fix: install nvidia-fabricmanager matching the driver and `systemctl enable "
            "--now nvidia-fabricmanager` (on a VM whose hypervisor runs it, add "
            "fabricmanager to kimi_preflight_warn_only)."
        ),
        warn=startable,
    )
    return startable


def check_fabric_state(findings: Findings, facts: Facts, startable: bool) -> None:
    fabric = facts.gpu["fabric"]
    state = fabric["state"]
    findings.add(
        "fabric_state",
        state == "Completed",
        f"NVSwitch fabric state is {state} (per GPU: {fabric['per_gpu']}); needed "
        "Completed. Fix: start nvidia-fabricmanager, check its log "
        "(/var/log/fabricmanager.log), then `nvidia-smi -q | grep -A2 Fabric`.",
        # The fabric comes up once the tuning stage has started the fabric manager.
        warn=startable,
    )


def check_nvlink_p2p(findings: Findings, facts: Facts) -> None:
    gpu = facts.gpu
    if gpu["interconnect"] != "nvlink" and facts.count > 1:
        findings.add(
            "p2p",
            False,
            f"the profile expects NVLink between every GPU pair but `nvidia-smi topo -m` "
            f"shows NVLink on {gpu['nvlink_pairs']} of {gpu['gpu_pairs']} pairs. Fix: check "
            "the fabric manager and the NVLink state (`nvidia-smi nvlink -s`).",
        )
    for kind, pairs in (gpu.get("p2p_not_ok") or {}).items():
        findings.add(
            "p2p",
            not pairs,
            f"P2P {kind} is not OK between GPU pairs {pairs}; NVSwitch hosts need every "
            "pair OK. Fix: check the fabric manager and `nvidia-smi topo -p2p "
            f"{kind[0]}`.",
        )


def check_pcie_p2p(findings: Findings, facts: Facts) -> None:
    for kind in ("read", "write"):
        pairs = (facts.gpu.get("p2p_not_ok") or {}).get(kind) or []
        findings.add(
            "p2p",
            not pairs,
            f"PCIe P2P {kind} is not OK between GPU pairs {pairs}: NCCL falls back to "
            "host memory there, which slows the all-reduce. Fix: check BIOS settings "
            f"(ACS, IOMMU) and `nvidia-smi topo -p2p {kind[0]}`.",
            warn=True,
        )


def check_acs(findings: Findings, facts: Facts) -> None:
    acs = facts.host.get("acs") or {}
    if not acs.get("checked"):
        findings.add(
            "acs",
            False,
            f"the ACS state of the PCIe bridges above the GPUs was not checked: "
            f"{acs.get('reason')}.",
            warn=True,
        )
        return
    redirecting = acs.get("redirecting") or []
    findings.add(
        "acs",
        not redirecting,
        f"ACS redirects peer-to-peer traffic to the root complex on bridges "
        f"{', '.join(redirecting)}; GPU P2P then crosses the CPU or hangs. Fix: disable "
        "ACS in the BIOS, or `setpci -s BDF ECAP_ACS+6.w=0000` for each bridge at boot.",
    )


def check_hub(findings: Findings, facts: Facts) -> None:
    evaluate_hub(findings, facts.hub, facts.needed_repos, facts.host, facts.disk_headroom_gib)


def check_capacity(findings: Findings, facts: Facts) -> None:
    for config, result in facts.capacity.items():
        findings.add(
            "capacity",
            bool(result.get("fits")),
            f"serving config {config} does not fit on {facts.count} x {facts.models} at "
            f"tp_size {facts.tp_size}: {result.get('reason')}.",
        )


def check_context_length(findings: Findings, facts: Facts) -> None:
    # Always a warning: a server whose context length outruns its pool still serves, and
    # SGLang cuts longer requests at the pool.
    for config, result in facts.capacity.items():
        if result.get("fits") and "context_length_fits" in result:
            findings.add(
                "context_length",
                bool(result["context_length_fits"]),
                f"serving config {config}: {result.get('context_length_warning')}.",
                warn=True,
            )


# In the order of the findings: the GPUs, the interconnect, the hub and disk, then capacity.
CHECK_FUNCTIONS = (
    check_gpu_count,
    check_gpu_model,
    check_compute_capability,
    check_driver,
    check_persistence_mode,
    check_interconnect,
    check_hub,
    check_capacity,
    check_context_length,
)


def evaluate(
    gpu: dict,
    expected: dict,
    backend_capabilities: dict[str, list[str]],
    host: dict,
    hub: dict | None,
    needed_repos: list[str],
    capacity: dict[str, dict],
    disk_headroom_gib: float,
    warn_only: list[str],
) -> dict:
    """All findings for one host. `expected` holds the profile and the deployment settings."""
    findings = Findings(warn_only)
    facts = Facts(
        gpu, expected, backend_capabilities, host, hub, needed_repos, capacity, disk_headroom_gib
    )
    for check in CHECK_FUNCTIONS:
        check(findings, facts)
    return {
        "findings": findings.items,
        "failures": findings.of("failure"),
        "warning_messages": findings.of("warning"),
    }


def evaluate_hub(
    findings: Findings, hub: dict | None, needed: list[str], host: dict, headroom_gib: float
) -> None:
    if hub is None:
        return
    repos = hub.get("repos") or {}
    for name in needed:
        repo = repos.get(name)
        if repo is None:
            continue
        access = repo["access"]
        check = "hf_token" if access in ("missing_token", "invalid_token") else "hub_access"
        findings.add(check, access == "ok", f"{name} ({repo['repo_id']}): {repo['message']}")
    if not hub.get("reachable"):
        findings.add(
            "disk",
            False,
            "the download size is unknown because the hub could not be reached, so free disk "
            "space was not checked.",
            warn=True,
        )
        return
    to_download = 0
    for name in needed:
        repo = repos.get(name) or {}
        if repo.get("total_bytes") is None:
            continue
        present = (host.get("present") or {}).get(name, {}).get("bytes_present", 0)
        to_download += max(0, repo["total_bytes"] - present)
    disk = host["disk"]
    needed_bytes = to_download + headroom_gib * GIB
    findings.add(
        "disk",
        disk["free_bytes"] >= needed_bytes,
        f"free space for {disk['path']} (measured at {disk['measured_at']}) is "
        f"{disk['free_bytes'] / GIB:.1f} GiB; needed {needed_bytes / GIB:.1f} GiB "
        f"({to_download / GIB:.1f} GiB still to download + {headroom_gib:g} GiB headroom). "
        "Fix: free space, mount a larger volume there, or set kimi_weights_dir to a "
        "filesystem with room.",
    )
