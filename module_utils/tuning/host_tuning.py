"""Host tuning: what library/host_tuning.py does, in order - apply and record, or restore.

The subsystems live beside it: host values (sysctls, CPU governor, configuration files) in
tuning_host_values.py, GPU services (persistence mode, fabric manager) in
tuning_gpu_services.py, units and processes in tuning_services.py, the record of previous
values in tuning_record.py, and the PCIe ACS walk shared with preflight in pci_acs.py. Each
entry point returns the module's result; `failed` in it says to fail.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from ansible.module_utils.host.helpers import CommandFailed, atomic_write, read_text
from ansible.module_utils.tuning.gpu_services import (
    check_fabricmanager,
    known_gpus,
    restore_persistence,
    tune_fabricmanager,
    tune_persistence,
)
from ansible.module_utils.tuning.host_values import (
    nccl_environment_problems,
    restore_cpufreq,
    restore_file,
    restore_sysctl,
    sysctl_problems,
    tune_files,
    tune_governor,
    tune_sysctls,
)
from ansible.module_utils.tuning.pci_acs import acs_report, acs_unchecked
from ansible.module_utils.tuning.record import (
    RunCommand,
    StateFileError,
    TuningAbort,
    TuningError,
    TuningRun,
    Which,
    describe,
    public,
    summarise,
)
from ansible.module_utils.tuning.services import (
    restore_process,
    restore_service,
    service_manager,
)

# Who puts back a recorded entry, by its kind in the state file.
RESTORERS = {
    "sysctl": restore_sysctl,
    "cpufreq": restore_cpufreq,
    "file": restore_file,
    "persistence_mode": restore_persistence,
    "service": restore_service,
    "process": restore_process,
}


def new_run(
    params: dict,
    *,
    check: bool,
    diff: bool,
    run_command: RunCommand,
    which: Which,
    warn: Callable[[str], None],
) -> TuningRun:
    return TuningRun(
        params,
        check=check,
        diff=diff,
        run_command=run_command,
        which=which,
        warn=warn,
        manager=service_manager(params["service_manager"]),
    )


def input_problems(params: dict) -> list[str]:
    problems = sysctl_problems(params["sysctls"])
    problems += nccl_environment_problems(params["nccl_environment"])
    if params["fabricmanager_start_timeout"] < 1:
        problems.append(
            f"fabricmanager_start_timeout is {params['fabricmanager_start_timeout']}; "
            "needed 1 second or more"
        )
    return problems


def aborted(run: TuningRun, msg: str) -> dict:
    """The failure result; what was changed before it stays recorded, so restorable."""
    try:
        run.save_state()
    except StateFileError as exc:
        return state_file_failed(exc)
    return {
        "failed": True,
        "msg": msg,
        "changed": bool(run.changes) and not run.check,
        **run.result(),
    }


def state_file_failed(exc: StateFileError) -> dict:
    return {"failed": True, "msg": str(exc), "changed": exc.changed, "changes": exc.changes}


def then_save(run: TuningRun, work: Callable[[], None]) -> dict | None:
    """Does `work`, then saves the state file; the failure result, or None if all went well."""
    try:
        work()
    except (TuningAbort, CommandFailed) as exc:
        return aborted(run, str(exc))
    try:
        run.save_state()
    except StateFileError as exc:
        return state_file_failed(exc)
    return None


# --------------------------------------------------------------------------------------------
# The ACS report.


def acs_warning(redirecting: list[str], p2p_disabled: bool) -> str:
    advice = (
        "NCCL_P2P_DISABLE=1 is set, so NCCL does not send P2P through them; to use P2P, "
        "turn ACS off for these bridges (BIOS, or setpci at boot)."
        if p2p_disabled
        else "NCCL P2P is on: set NCCL_P2P_DISABLE=1 in kimi_nccl_environment, or turn "
        "ACS off for these bridges (BIOS, or setpci at boot)."
    )
    return (
        f"ACS redirects peer-to-peer traffic on PCIe bridges {redirecting}: "
        "GPU-to-GPU transfers through them go up to the root complex, or hang. "
        f"{advice} The kit only reports ACS, it never changes it."
    )


def report_acs(run: TuningRun) -> None:
    """The ACS report into the result, a warning, and the report file (not a recorded change:
    teardown leaves it)."""
    params = run.params
    gpus = known_gpus(run)
    if gpus is None:
        report = acs_unchecked(f"nvidia-smi failed, so the GPUs are unknown: {run.gpu_error}")
    else:
        report = acs_report(
            [gpu["bus_id"] for gpu in gpus],
            run.binary(params["lspci_path"]),
            run.run,
            root=params["root"],
            lspci_name=params["lspci_path"],
        )
    run.extra["acs"] = report
    if report["redirecting"]:
        p2p_disabled = params["nccl_environment"].get("NCCL_P2P_DISABLE") == "1"
        run.warn(acs_warning(report["redirecting"], p2p_disabled))
    elif not report["checked"]:
        run.warn(f"ACS not checked: {report['reason']}")
    text = json.dumps(report, indent=2, sort_keys=True) + "\n"
    path = params["acs_report_file"]
    if read_text(path) == text.strip():
        return
    run.extra["acs_report_written"] = True
    if not run.check:
        try:
            atomic_write(path, text.encode(), 0o644)
        except OSError as exc:
            raise TuningAbort(
                f"Cannot write the ACS report {path} ({exc}). Fix: run as root."
            ) from exc


# --------------------------------------------------------------------------------------------
# state=present.


def apply(run: TuningRun) -> dict:
    """Brings the host to the wanted values and records every change (state=present)."""
    params = run.params
    problems = input_problems(params)
    if problems:
        return {
            "failed": True,
            "msg": "Bad tuning inputs: " + "; ".join(problems) + ". Fix: correct "
            "kimi_nccl_environment (group_vars/<profile>.yml) or the tuning_ variables.",
            "changes": [],
        }
    try:
        run.read_state()
    except StateFileError as exc:
        return state_file_failed(exc)

    def tune() -> None:
        # Before any change: a missing or mismatched fabric manager fails the run untouched.
        fabric = check_fabricmanager(run) if params["fabricmanager"] else None
        sysctls_present = tune_sysctls(run)
        tune_governor(run)
        tune_files(run, sysctls_present)
        if params["persistence_mode"]:
            tune_persistence(run)
        if fabric is not None:
            tune_fabricmanager(run, fabric)
        if params["acs_report_file"]:
            report_acs(run)

    failure = then_save(run, tune)
    if failure:
        return failure
    verb = "would change" if run.check else "changed"
    summary = (
        f"{verb} {len(run.changes)} value(s): " + "; ".join(summarise(run.changes))
        if run.changes
        else "every value already as wanted"
    )
    extra = {"diff": run.diffs} if run.diffs and run.diff else {}
    changed = bool(run.changes) or bool(run.extra.get("acs_report_written"))
    return {"changed": changed, "msg": summary, **run.result(**extra)}


# --------------------------------------------------------------------------------------------
# state=restored.


def restore_entry(run: TuningRun, entry: dict) -> bool:
    """Put one previous value back; whether anything had to change."""
    restorer = RESTORERS.get(entry["kind"])
    if restorer is None:
        raise TuningError(f"unknown kind {entry['kind']!r} in the state file")
    return restorer(run, entry)


def restore(run: TuningRun) -> dict:
    """Puts back every recorded previous value, newest first, and removes the state file."""
    try:
        run.read_state()
    except StateFileError as exc:
        return state_file_failed(exc)
    if not os.path.exists(run.state_path):
        return {"changed": False, "msg": f"nothing to restore: no {run.state_path}", **run.result()}
    failures = []

    def put_back() -> None:
        for key, entry in reversed(list(run.state["changes"].items())):
            try:
                differed = restore_entry(run, entry)
            # A hung command fails its entry; entries that need none are still put back.
            except (TuningError, CommandFailed, OSError, KeyError) as exc:
                failures.append(f"{key}: {exc}")
                continue
            restored = {**public(key, entry), "changed": differed}
            restored["description"] = "restore " + describe(entry, restore=True)
            run.changes.append(restored)
            if not run.check:
                del run.state["changes"][key]
                run.state_dirty = True

    failure = then_save(run, put_back)
    if failure:
        return failure
    if failures:
        return {
            "failed": True,
            "msg": f"Could not restore {len(failures)} value(s): {'; '.join(failures)}. They "
            f"stay in {run.state_path}; fix the cause and run the restore again.",
            "changed": bool(run.changes) and not run.check,
            **run.result(),
        }
    verb = "would restore" if run.check else "restored"
    return {
        "changed": True,
        "msg": f"{verb} {len(run.changes)} recorded value(s) and "
        f"{'would remove' if run.check else 'removed'} {run.state_path}",
        **run.result(),
    }
