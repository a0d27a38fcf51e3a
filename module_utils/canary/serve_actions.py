"""The canary_serve module's three actions (library/canary_serve.py): each takes the module's
parameters and returns what the module exits with, or raises CanaryError (a bad input),
CommandFailed, RuntimeError or OSError, which the module reports as its failure.

- plan: each config's identity, which configs must run, the GPUs, whether the kit's server runs.
- run: one config's canary (module_utils/canary/serve.py run_one), or its skipped entry.
- record: canary.json written when its content changed, and the summary per host.
"""

from __future__ import annotations

from ansible.module_utils.canary.serve import plan, run_one
from ansible.module_utils.canary.serve_inputs import CanaryError, check_launch, gpu_facts
from ansible.module_utils.canary.serve_record import (
    build_record,
    comparable,
    read_record,
    skipped,
    summary,
    write_record,
)
from ansible.module_utils.host.helpers import DeadlineRunner, systemd_is_pid1
from ansible.module_utils.server.control import supervisor_status, systemd_status

MAX_TIMEOUT_S = 3600


def server_active(server: dict) -> tuple[bool, str]:
    """(whether the kit's server runs, its manager's status word)."""
    if not server:
        return False, "not asked"
    if server.get("manager") == "systemd" and systemd_is_pid1():
        status = systemd_status(DeadlineRunner(60, "canary_serve's systemctl deadline"),
                                str(server.get("name") or "kimi-sglang"))  # fmt: skip
    else:
        status = supervisor_status(str(server.get("pid_file")), str(server.get("state_file")))
    return bool(status["running"]), str(status["status"])


def plan_action(p: dict) -> dict:
    """Read-only: identities, the configs to run, the GPUs and the server's state."""
    configs = [check_launch(config) for config in p["configs"]]
    gpus = gpu_facts()
    identities, to_run = plan(configs, p["record"], p["checkpoints"], gpus, p["rerun"])
    active, status = server_active(p["server"])
    return {
        "changed": False,
        "identities": identities,
        "to_run": to_run,
        "gpus": {
            "count": len(gpus["uuids"]),
            "driver": gpus["driver"],
            "compute_capability": gpus["compute_capability"],
        },
        "server_active": active,
        "server_status": status,
    }


def run_spec(p: dict, config: dict, log: str) -> dict:
    """run_one's spec from the module's parameters."""
    return {
        "config": config,
        "secret_environment": {str(k): str(v) for k, v in p["secret_environment"].items()},
        "identity": p["identity"],
        "log": log,
        "host": p["host"],
        "port": p["port"],
        "timeout_s": p["timeout"],
        "grace_s": p["grace"],
        "chat_template_kwargs": p["chat_template_kwargs"],
        "secrets": p["secrets"],
        "capabilities": p["capabilities"],
        "backends": p["backends"],
        "compute_capability": p["compute_capability"],
    }


def run_action(p: dict, check_mode: bool) -> dict:
    """One config's canary; skipped (nothing started) with skip_reason or in check mode."""
    config = check_launch(p["config"] or {})
    if not p["identity"] or not p["log_dir"]:
        raise CanaryError("action=run needs identity (from action=plan) and log_dir")
    if not 0 < p["timeout"] <= MAX_TIMEOUT_S:
        raise CanaryError(
            f"timeout is {p['timeout']:g}; needed: seconds above 0 up to {MAX_TIMEOUT_S}. "
            "Fix: kimi_canary_timeout_s."
        )
    log = f"{p['log_dir']}/{config['name']}.log"
    reason = p["skip_reason"] or ("check mode: nothing started" if check_mode else "")
    if reason:
        return {
            "changed": False,
            "name": config["name"],
            "entry": skipped(p["identity"], log, reason),
        }
    return {"changed": True, "name": config["name"], "entry": run_one(run_spec(p, config, log))}


def record_action(p: dict, check_mode: bool) -> dict:
    """The run's record written when its content changed (in check mode only compared)."""
    previous = read_record(p["record"])
    record = build_record(previous, p["names"], p["results"], p["facts"], p["checkpoints"])
    if check_mode:
        changed = comparable(record) != comparable(previous)
        return {"changed": changed, "canary": record, "summary": summary(record)}
    written, changed = write_record(p["record"], record, previous)
    return {"changed": changed, "canary": written, "summary": summary(written)}


def act(p: dict, check_mode: bool) -> dict:
    """The result of the action p names."""
    if p["action"] == "plan":
        return plan_action(p)
    if p["action"] == "run":
        return run_action(p, check_mode)
    return record_action(p, check_mode)
