#!/usr/bin/python
"""Ansible module server_health: one poll of a loading SGLang server, for an until loop."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: server_health
short_description: Poll a starting SGLang server once, with a progress line and the log tail
description:
  - Meant for an C(until) loop while the server loads its weights (minutes for 595 GB).
  - Returns C(state=healthy) when C(GET /health_generate) answers 200 (SGLang runs a one-token
    generation for it, so the model is really serving); C(state=loading) while it does not;
    C(state=failed) at once when the server process is gone, its manager gave up, or it has
    crashed and been restarted since O(restarts_before) (a crash while loading is a problem to
    show, not to wait out).
  - C(progress) says how long it has waited and the last log line, for the kit's progress
    callback; C(log_tail) holds the last O(log_lines) lines of the server's log (journal under
    systemd, the log file under the supervisor).
  - Read-only; supports check mode.
version_added: "0.1.0"
options:
  url:
    description: Base URL of the server as seen from the host, for example http://127.0.0.1:30000.
    type: str
    required: true
  api_key:
    description: API key, sent as a bearer token (SGLang lets health checks through without).
    type: str
    default: ""
  manager:
    description: C(systemd) or C(supervisor).
    type: str
    choices: [systemd, supervisor]
    required: true
  name:
    description: Unit name under systemd.
    type: str
    default: kimi-sglang
  pid_file:
    description: Supervisor pid file.
    type: path
  state_file:
    description: Supervisor state file.
    type: path
  log_file:
    description: Server log file (supervisor).
    type: path
  since:
    description: Epoch seconds when the wait began, for the elapsed time in C(progress).
    type: float
    default: 0
  timeout:
    description: The whole wait's limit in seconds, shown in C(progress).
    type: int
    default: 0
  restarts_before:
    description: The manager's restart count when the server was (re)started by the kit.
    type: int
    default: 0
  log_lines:
    description: Lines of log to return.
    type: int
    default: 40
author:
  - kimi-deploy-kit maintainers
"""

EXAMPLES = r"""
- name: Wait until the server generates
  server_health:
    url: http://127.0.0.1:30000
    manager: systemd
    since: "{{ wait_started }}"
    timeout: 2400
  register: health
  until: health.state != 'loading'
  retries: 240
  delay: 10
"""

RETURN = r"""
state:
  description: C(healthy), C(loading) or C(failed).
  returned: always
  type: str
progress:
  description: One line for people watching.
  returned: always
  type: str
message:
  description: Why the server failed (with O(state=failed)).
  returned: always
  type: str
log_tail:
  description: Last lines of the server's log.
  returned: always
  type: list
  elements: str
elapsed:
  description: Seconds since O(since).
  returned: always
  type: float
"""

import time  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.server_control import (  # noqa: E402
    log_tail,
    supervisor_status,
    systemd_status,
)


def probe(url: str, api_key: str) -> tuple[int | None, str]:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"url must be http(s): {url}")
    request = urllib.request.Request(url.rstrip("/") + "/health_generate")  # noqa: S310
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=20) as response:  # noqa: S310 - http(s) only
            return response.status, ""
    except urllib.error.HTTPError as error:
        return error.code, f"HTTP {error.code}"
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        return None, str(reason)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "manager": {"type": "str", "choices": ["systemd", "supervisor"], "required": True},
            "name": {"type": "str", "default": "kimi-sglang"},
            "pid_file": {"type": "path"},
            "state_file": {"type": "path"},
            "log_file": {"type": "path"},
            "since": {"type": "float", "default": 0},
            "timeout": {"type": "int", "default": 0},
            "restarts_before": {"type": "int", "default": 0},
            "log_lines": {"type": "int", "default": 40},
        },
        supports_check_mode=True,
    )
    p = module.params

    def run(argv):
        return module.run_command(argv)

    if p["manager"] == "systemd":
        status = systemd_status(run, p["name"])
    else:
        status = supervisor_status(p["pid_file"], p["state_file"])
    tail = log_tail(run, p["manager"], p["name"], p["log_file"], p["log_lines"])
    elapsed = round(time.time() - p["since"], 1) if p["since"] else 0.0
    message = ""
    if not status["running"] or status["failed"]:
        message = (
            f"the server is not running (manager {p['manager']}: {status['status']}, "
            f"last exit status {status['last_exit']})"
        )
    elif status["restarts"] > p["restarts_before"]:
        message = (
            f"the server crashed while starting and was restarted "
            f"{status['restarts'] - p['restarts_before']} time(s)"
        )
    if message:
        module.exit_json(
            changed=False,
            state="failed",
            message=message,
            progress=message,
            log_tail=tail,
            elapsed=elapsed,
        )
    code, error = probe(p["url"], p["api_key"])
    if code == 200:
        state = "healthy"
        progress = f"healthy after {elapsed:.0f} s"
    else:
        state = "loading"
        limit = f" of {p['timeout']} s" if p["timeout"] else ""
        last = next((line for line in reversed(tail) if line.strip()), "(no log yet)")
        progress = (
            f"loading: {elapsed:.0f} s{limit}, /health_generate "
            f"{error or f'HTTP {code}'}; log: {last[-160:]}"
        )
    module.exit_json(
        changed=False, state=state, message="", progress=progress, log_tail=tail, elapsed=elapsed
    )


if __name__ == "__main__":
    main()
