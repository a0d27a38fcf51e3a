"""What the server stage reads from a host before a launch, in one module run
(library/server_inspect.py): the manager that runs the server, systemd's version where systemd
does, whether the launch's Python exists, the runtime folder the launch runs from, and the one
the previous launch ran from. Five stat and command tasks before, a module run each, at every
server start (the benchmark starts one per config). Read-only.

Each problem found is a message saying what was found, what is needed and how to fix it; the
module fails with them."""

from __future__ import annotations

import os
import re
import stat

from ansible.module_utils.runtime.versions import recorded_runtime

# sd_booted(): systemd runs the host (PID 1) exactly when this is a folder.
SYSTEMD_DIR = "/run/systemd/system"
# The unit sends the server's output to its log file with StandardOutput=append:, which came
# with systemd 240; an older one ignores the line and logs the API key to the journal.
SYSTEMD_APPEND_MIN = 240
MANAGERS = ("auto", "systemd", "supervisor")
_VERSION = re.compile(r"systemd ([0-9]+)\b")


def systemd_runs(path: str = SYSTEMD_DIR) -> bool:
    """Whether path is a folder (not a link to one), as the stat of it said before."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def choose_manager(requested: str, systemd: bool) -> str:
    if requested not in MANAGERS:
        raise ValueError(f"manager must be one of {', '.join(MANAGERS)}: {requested!r}")
    if requested != "auto":
        return requested
    return "systemd" if systemd else "supervisor"


def systemd_version(run) -> tuple[int | None, str]:
    """(systemd's version, or None when `systemctl --version` does not say it; its first line)."""
    code, out, err = run(["systemctl", "--version"])
    first = (out.splitlines() or [""])[0].strip()[:200]
    found = _VERSION.match(first) if code == 0 else None
    return (int(found.group(1)) if found else None), (first or err.strip()[:200])


def launch_runtime_dir(python: str) -> str:
    """The runtime folder a launch of `python` (<folder>/bin/python) runs from: the version
    folder its link points at, or the folder itself where it is no link."""
    folder = os.path.dirname(os.path.dirname(python))
    return os.path.realpath(folder) if os.path.islink(folder) else folder


def inspect(p: dict, run, check_mode: bool = False) -> dict:
    """exit_json's keys for params p, with `problems`: the messages to fail with."""
    host = p["host"]
    systemd = systemd_runs(p["systemd_dir"])
    manager = choose_manager(p["manager"], systemd)
    result: dict = {"changed": False, "manager": manager, "systemd": systemd}
    problems = []
    if manager == "systemd" and not systemd:
        problems.append(
            f"server_manager is systemd, but systemd is not PID 1 on {host} "
            f"({p['systemd_dir']} is missing). Fix: set server_manager to auto or supervisor."
        )
    if p.get("python"):
        python = p["python"]
        result["python_exists"] = os.path.lexists(python)
        result["runtime_dir"] = launch_runtime_dir(python)
        if not result["python_exists"] and not check_mode:
            problems.append(
                f"{python} does not exist on {host}; serving config {p['config']} runs on "
                f"{p['runtime']}. Fix: run the runtime stage (deploy_kimi.yml, or "
                f"playbooks/runtime.yml) with {p['config_base']} in kimi_serving_configs."
            )
    if p.get("launch_record"):
        result["previous_runtime"] = recorded_runtime(
            p["launch_record"], p["versions_dir"], p["kind"]
        )
    if p.get("check_systemd_version") and manager == "systemd" and systemd:
        version, line = systemd_version(run)
        result["systemd_version"] = version
        if version is None or version < SYSTEMD_APPEND_MIN:
            problems.append(
                f"systemd on {host} is {version or 'unknown'} ({line}); the unit needs "
                f"{SYSTEMD_APPEND_MIN} or newer to send the server's output to "
                f"{p['log_file'] or 'its log file'} "
                "instead of the journal, where the API key SGLang logs at start would be "
                "readable by the adm and systemd-journal groups. Fix: run the server under the "
                "kit's supervisor (server_manager: supervisor), or upgrade systemd."
            )
    result["problems"] = problems
    return result
