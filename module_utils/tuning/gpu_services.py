"""Host tuning: GPU services - persistence mode and the NVIDIA fabric manager - turned on,
recorded and restored, and the nvidia-smi query they share.

Where systemd is PID 1 the services are systemd units (enabled and started); elsewhere
(containers, hosts whose init does not supervise daemons) persistence mode is set with
`nvidia-smi -pm 1` and the fabric manager is started as a detached process. How units and
processes are handled is module_utils/tuning/services.py.
"""

from __future__ import annotations

import os
import re

from ansible.module_utils.host.helpers import CommandFailed
from ansible.module_utils.tuning.record import TuningAbort, TuningError, TuningRun
from ansible.module_utils.tuning.services import ensure_service, pids_named, start_daemon, unit

GPU_QUERY = "--query-gpu=index,pci.bus_id,persistence_mode,driver_version"
VERSION = re.compile(r"\b(\d+\.\d+(?:\.\d+)?)\b")


# --------------------------------------------------------------------------------------------
# nvidia-smi.


def parse_gpu_query(text: str) -> list[dict]:
    """`nvidia-smi GPU_QUERY --format=csv,noheader` into index, bus id, persistence, driver."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 4 or not fields[0].isdigit():
            raise TuningError(
                f"nvidia-smi printed {line.strip()!r} where index, bus id, persistence mode and "
                "driver version were expected. Fix: run `nvidia-smi "
                f"{GPU_QUERY} --format=csv,noheader` by hand; an old driver lacks these fields."
            )
        gpus.append(
            {
                "index": int(fields[0]),
                "bus_id": fields[1],
                "persistence_mode": fields[2] == "Enabled",
                "driver_version": fields[3],
            }
        )
    return gpus


def query_gpus(run: TuningRun) -> list[dict] | None:
    """The GPUs now (also kept in the run, for the result); None with run.gpu_error set."""
    smi = run.binary(run.params["nvidia_smi_path"])
    if not smi:
        run.gpu_error = f"{run.params['nvidia_smi_path']} not found"
        return None
    try:
        rc, out, err = run.run([smi, GPU_QUERY, "--format=csv,noheader"])
    except CommandFailed as exc:
        # What needs the GPUs fails with it; the ACS report says it is unchecked and why.
        run.gpu_error = str(exc).rstrip(".")
        return None
    if rc != 0:
        run.gpu_error = f"`nvidia-smi {GPU_QUERY}` exited {rc}: {(out + err).strip()}"
        return None
    try:
        run.gpu_list = parse_gpu_query(out)
    except TuningError as exc:
        run.gpu_error = str(exc).rstrip(".")
        return None
    return run.gpu_list


def known_gpus(run: TuningRun) -> list[dict] | None:
    """The GPUs as first queried in this run (queried now if they were not)."""
    return run.gpu_list if run.gpu_list is not None else query_gpus(run)


def gpus_for(run: TuningRun, needed_for: str) -> list[dict]:
    gpus = known_gpus(run)
    if gpus is None:
        raise TuningAbort(
            f"{needed_for} needs nvidia-smi, which failed: {run.gpu_error}. Fix: install "
            "the NVIDIA driver and check that `nvidia-smi` lists the GPUs, or set "
            "tuning_nvidia_smi_path."
        )
    if not gpus:
        raise TuningAbort(f"{needed_for}: nvidia-smi lists no GPU. Fix: check the driver and GPUs.")
    return gpus


def smi(run: TuningRun, *args: str) -> tuple[int, str]:
    rc, out, err = run.run([run.binary(run.params["nvidia_smi_path"]), *args])
    return rc, (out + err).strip()


# --------------------------------------------------------------------------------------------
# Persistence mode.


def tune_persistence(run: TuningRun) -> None:
    gpus = gpus_for(run, "Turning on persistence mode")
    before = {gpu["bus_id"]: gpu["persistence_mode"] for gpu in gpus}
    if run.manager == "systemd":
        name = run.params["persistenced_service"]
        if not ensure_service(run, name, "persistence mode"):
            run.not_applied.append(
                {
                    "what": f"service {name}",
                    "reason": "unit not found; persistence mode set with nvidia-smi -pm 1",
                }
            )
        elif not run.check:
            # The daemon may have turned it on already (unless its unit says otherwise).
            gpus = query_gpus(run) or gpus
    if any(not gpu["persistence_mode"] for gpu in gpus) and not run.check:
        rc, out = smi(run, "-pm", "1")
        after = query_gpus(run) or []
        still_off = [gpu["bus_id"] for gpu in after if not gpu["persistence_mode"]]
        if rc != 0 or still_off:
            raise TuningAbort(
                f"Persistence mode is still off on GPUs {still_off or list(before)}: "
                f"`nvidia-smi -pm 1` exited {rc}: {out}. Needed: root on the host (a "
                "container cannot change it). Fix: run `nvidia-smi -pm 1` on the host, or "
                "enable nvidia-persistenced there."
            )
    for bus_id, was_on in before.items():
        if not was_on:
            run.note(
                f"persistence_mode:{bus_id}",
                {"kind": "persistence_mode", "bus_id": bus_id, "previous": False, "value": True},
            )


def restore_persistence(run: TuningRun, entry: dict) -> bool:
    gpus = query_gpus(run)
    if gpus is None:
        raise TuningError(f"nvidia-smi failed: {run.gpu_error}")
    now = {gpu["bus_id"]: gpu["persistence_mode"] for gpu in gpus}
    if entry["bus_id"] not in now or now[entry["bus_id"]] == entry["previous"]:
        return False
    if not run.check:
        rc, out = smi(run, "-i", entry["bus_id"], "-pm", "1" if entry["previous"] else "0")
        if rc != 0:
            raise TuningError(f"`nvidia-smi -i {entry['bus_id']} -pm` exited {rc}: {out}")
    return True


# --------------------------------------------------------------------------------------------
# The fabric manager.


def parse_version(text: str) -> str | None:
    """The first dotted version in a tool's --version output."""
    match = VERSION.search(text or "")
    return match.group(1) if match else None


def fabricmanager_package_hint(driver: str) -> str:
    branch = driver.split(".", 1)[0] if driver else "<driver branch>"
    return (
        f"install the fabric manager of driver {driver or '<driver version>'} (Debian/Ubuntu: "
        f"`apt-get install nvidia-fabricmanager-{branch}` at that exact version; RHEL: "
        f"`dnf install nvidia-fabricmanager-{driver or '<version>'}`)"
    )


def check_fabricmanager(run: TuningRun) -> dict:
    """Installed and matching the driver; nothing is changed before this passes."""
    params = run.params
    driver = gpus_for(run, "The fabric manager check")[0]["driver_version"]
    name = params["fabricmanager_service"]
    program = run.binary(params["fabricmanager_binary"])
    info = {"driver_version": driver, "version": None, "how": run.manager}
    unit_found = run.manager == "systemd" and unit(run, name)["loaded"]
    if not program and not unit_found:
        where = (
            f"no {name} unit and no {params['fabricmanager_binary']} on PATH"
            if run.manager == "systemd"
            else f"no {params['fabricmanager_binary']} on PATH"
        )
        raise TuningAbort(
            f"The NVIDIA fabric manager is not installed: found {where}. Needed: NVSwitch "
            "hosts need it running, at the driver's version, or NVLink stays down and CUDA "
            f"cannot use the GPUs. Fix: {fabricmanager_package_hint(driver)}, then rerun."
        )
    if program:
        rc, out, err = run.run([program, "--version"])
        info["version"] = parse_version(out + err) if rc == 0 else None
        if info["version"] is None:
            run.warn(
                f"`{program} --version` printed no version (exit {rc}); cannot compare "
                f"it with driver {driver}."
            )
        elif info["version"] != driver:
            raise TuningAbort(
                f"The fabric manager is version {info['version']} but the driver is "
                f"{driver}; the fabric manager refuses to run with a different driver "
                f"version. Fix: {fabricmanager_package_hint(driver)}, or update the driver "
                f"to {info['version']}; then rerun."
            )
    else:
        run.warn(
            f"{params['fabricmanager_binary']} is not on PATH; the {name} unit exists, so "
            f"its version could not be compared with driver {driver}."
        )
    info["program"] = program
    return info


def tune_fabricmanager(run: TuningRun, info: dict) -> None:
    """Running: the unit enabled and started, or (without systemd) the program started."""
    params = run.params
    if run.manager == "systemd":
        ensure_service(run, params["fabricmanager_service"], "NVLink through NVSwitch")
        info["running"] = True
        run.extra["fabricmanager"] = info
        return
    name = os.path.basename(params["fabricmanager_binary"])
    if pids_named(name):
        info["running"] = True
        run.extra["fabricmanager"] = info
        return
    config = params["fabricmanager_config"]
    if not os.path.isfile(config):
        raise TuningAbort(
            f"{name} is not running and its configuration {config} does not exist. Fix: "
            "reinstall the fabric manager package, or set tuning_fabricmanager_config to "
            "its fabricmanager.cfg."
        )
    if not run.check:
        start_daemon(
            [info["program"], "-c", config],
            name,
            params["fabricmanager_start_timeout"],
            "/var/log/fabricmanager.log",
        )
    info["running"] = not run.check
    run.extra["fabricmanager"] = info
    run.note(f"process:{name}", {"kind": "process", "name": name, "previous": False, "value": True})
