#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module server_service: start, restart on change, or stop the SGLang server."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: server_service
short_description: Run the SGLang server under systemd or a supervisor, restarting on change only
description:
  - One interface over two managers. C(systemd) (where systemd is PID 1) runs the unit the
    server role wrote; C(supervisor) runs C(kimi-supervise) with the spec file the role wrote,
    which keeps the server running with a pid file, a log file and a restart policy.
  - Which launch a running server has is read from the process's own environment
    (C(KIMI_SERVER_CONFIG_HASH)), an HMAC-SHA256 of its argv, environment and secrets, keyed
    with a random key the module makes on the host (O(key_file), root-only, never returned).
    The module writes the wanted identity to O(identity_file) (root-only), which the unit and
    the supervisor load into the server's environment. With O(state=started) the server is
    started when it is not running, restarted when its identity differs from the wanted one,
    and left alone otherwise, so a second run reports no change.
  - A server started by an earlier kit carries an unkeyed hash of the same values; when that
    hash is the one of the wanted launch, the server keeps running and only the records are
    rewritten to the keyed identity (action C(recorded)).
  - O(state=stopped) stops it (and disables the unit under systemd, resetting a unit that
    failed, such as a multi-node rank whose head stopped first); the process group goes with
    it, workers included.
  - Supports check mode (reports what it would do).
version_added: "0.1.0"
options:
  state:
    description: C(started) or C(stopped).
    type: str
    choices: [started, stopped]
    default: started
  launch:
    description:
      - JSON object of the launch the server should run, C(argv), C(environment) and
        C(secrets) (the API key the server reads from its secrets file), as the role writes
        them; required with O(state=started). Never logged, as it holds secrets.
    type: str
  identity_file:
    description: Root-only file the module writes the wanted identity to (EnvironmentFile syntax).
    type: path
  key_file:
    description: Root-only file with the host's identity key, made on the host when missing.
    type: path
  spec_file:
    description: Supervisor spec (JSON) written by the server role.
    type: path
  supervisor_script:
    description: Path of C(kimi-supervise).
    type: path
  stop_timeout:
    description: Seconds to wait for the server to stop before it is killed.
    type: int
    default: 120
  start_timeout:
    description: Seconds to wait for the supervisor to report the server process started.
    type: int
    default: 30
  command_timeout:
    description:
      - Seconds one C(systemctl) command may take before it is killed with its process group
        and the task fails naming it. V(0) means O(stop_timeout) plus 60 s, as
        C(systemctl disable --now) waits for the unit's own stop.
    type: float
    default: 0
  daemon_reload:
    description: Reload systemd's units first (the unit file was just written).
    type: bool
    default: false
extends_documentation_fragment:
  - kimi_server_manager
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Start the server, restarting it only when its launch changed
  server_service:
    manager: supervisor
    launch: "{{ {'argv': argv, 'environment': environment, 'secrets': secrets} | to_json }}"
    identity_file: /etc/kimi/kimi-sglang.identity
    key_file: /etc/kimi/server-identity.key
    spec_file: /etc/kimi/sglang-supervise.json
    supervisor_script: /opt/kimi/bin/kimi-supervise
    pid_file: /var/lib/kimi/server/supervise.pid
    state_file: /var/lib/kimi/server/state.json
"""

RETURN = r"""
action:
  description:
    - What was done, C(none), C(recorded) (the running server kept, its identity records
      rewritten), C(enabled), C(started), C(restarted) or C(stopped).
  returned: always
  type: str
pid:
  description: Pid of the server process after the action (null when stopped).
  returned: always
  type: int
previous_identity:
  description:
    - How the running server's identity compared with the wanted launch, C(none) (nothing
      running, or no identity), C(current), C(legacy) (an earlier kit's unkeyed hash of this
      launch) or C(other). The identity itself is never returned.
  returned: always
  type: str
restarts:
  description: Restarts the manager had made before this action.
  returned: always
  type: int
restarts_after:
  description: The manager's restart count after this action (the health wait's baseline).
  returned: always
  type: int
now:
  description: The host's clock (epoch seconds) after the action.
  returned: always
  type: float
"""

import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.helpers import (  # noqa: E402
    CommandFailed,
    command_environment,
    run_with_deadline,
)
from ansible.module_utils.server.control import (  # noqa: E402
    running_config_hash,
    stop_needed,
    stop_supervisor,
    supervisor_status,
    systemd_status,
)
from ansible.module_utils.server.identity import (  # noqa: E402
    IdentityError,
    wanted_identity,
)


class Service:
    def __init__(self, module: AnsibleModule):
        self.module = module
        self.p = module.params

    def run(self, argv: list[str], check: bool = True) -> tuple[int, str, str]:
        # `systemctl disable --now` waits for the unit's own stop (TimeoutStopSec, then
        # SIGKILL): the deadline leaves systemd that time and a margin, never forever.
        limit = self.p["command_timeout"] or self.p["stop_timeout"] + 60
        try:
            rc, out, err = run_with_deadline(
                argv, limit, env=command_environment(), what=f"server_service's limit of {limit:g}s"
            )
        except CommandFailed as error:
            self.module.fail_json(msg=str(error))
        if check and rc != 0:
            self.module.fail_json(
                msg=f"{' '.join(argv)} failed (exit {rc}): {(err or out).strip()[-2000:]}"
            )
        return rc, out, err

    def status(self) -> dict:
        if self.p["manager"] == "systemd":
            try:
                return systemd_status(lambda a: self.run(a, check=False), self.p["name"])
            except RuntimeError as error:
                self.module.fail_json(msg=str(error))
        return supervisor_status(self.p["pid_file"], self.p["state_file"])

    # --- systemd ---------------------------------------------------------------------------
    def systemd_start(self, status: dict, restart: bool) -> None:
        if self.p["daemon_reload"] or status["needs_reload"] or not status["loaded"]:
            self.run(["systemctl", "daemon-reload"])
        if status["failed"]:
            self.run(["systemctl", "reset-failed", self.p["name"]])
        if not status["enabled"]:
            self.run(["systemctl", "enable", self.p["name"]])
        self.run(["systemctl", "restart" if restart else "start", self.p["name"]])

    def systemd_stop(self) -> None:
        self.run(["systemctl", "disable", "--now", self.p["name"]])
        # A stop leaves a failed unit failed, and a stop can fail one (a rank whose restarts
        # ran out meanwhile, a kill after TimeoutStopSec): teardown leaves it inactive. On a
        # unit that did not fail it changes nothing.
        self.run(["systemctl", "reset-failed", self.p["name"]], check=False)

    # --- supervisor ------------------------------------------------------------------------
    def supervisor_start(self) -> dict:
        for key in ("spec_file", "supervisor_script", "pid_file", "state_file"):
            if not self.p[key]:
                self.module.fail_json(msg=f"manager supervisor needs {key}")
        started = time.time()
        process = subprocess.Popen(
            [sys.executable, self.p["supervisor_script"], self.p["spec_file"]],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            close_fds=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + self.p["start_timeout"]
        while time.monotonic() < deadline:
            code = process.poll()
            status = supervisor_status(self.p["pid_file"], self.p["state_file"])
            if status["running"] and status["supervisor_pid"] == process.pid:
                state = self.read_state()
                if state.get("updated_at", 0) >= started and state.get("status") != "starting":
                    process.stderr.close()
                    return status
            if code is not None:
                error = process.stderr.read().decode(errors="replace").strip()
                self.module.fail_json(
                    msg=(
                        f"the supervisor exited at once (status {code}): {error or 'no output'}. "
                        f"See {self.spec().get('log_file')}."
                    )
                )
            time.sleep(0.1)
        self.module.fail_json(
            msg=(
                f"the supervisor (pid {process.pid}) did not report the server started within "
                f"{self.p['start_timeout']} s; see {self.spec().get('log_file')}"
            )
        )
        return {}

    def read_state(self) -> dict:
        try:
            with open(self.p["state_file"], encoding="utf-8") as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return {}

    def spec(self) -> dict:
        try:
            with open(self.p["spec_file"], encoding="utf-8") as handle:
                return json.load(handle)
        except (OSError, ValueError, TypeError):
            return {}

    # --- the interface ---------------------------------------------------------------------
    def ensure(self) -> None:
        status = self.status()
        running = running_config_hash(status["pid"])
        if running is None and status["manager"] == "supervisor" and status["running"]:
            # Between restarts there is no server process; the supervisor relaunches the same.
            running = self.read_state().get("config_hash") or None
        # The host's clock and the restart count the health wait measures from.
        result = {"restarts": status["restarts"], "now": time.time()}
        result["restarts_after"] = status["restarts"]
        if self.p["state"] == "stopped":
            result["previous_identity"] = "none" if running is None else "other"
            if not stop_needed(status):
                self.module.exit_json(changed=False, action="none", pid=None, **result)
            if not self.module.check_mode:
                if self.p["manager"] == "systemd":
                    self.systemd_stop()
                else:
                    stop_supervisor(status, self.p["stop_timeout"] + 10)
            self.module.exit_json(changed=True, action="stopped", pid=None, **result)
        for key in ("launch", "identity_file", "key_file"):
            if not self.p[key]:
                self.module.fail_json(msg=f"state=started needs {key}")
        try:
            wanted = wanted_identity(
                self.p["launch"],
                running,
                self.p["key_file"],
                self.p["identity_file"],
                self.p["state_file"] if self.p["manager"] == "supervisor" else None,
                keep=status["running"],
                check=self.module.check_mode,
                hide=self.module.no_log_values.add,
            )
        except (IdentityError, OSError) as error:
            self.module.fail_json(msg=str(error))
        result["previous_identity"] = wanted.match
        if status["running"] and wanted.match in ("current", "legacy"):
            # A unit change that does not touch the launch (limits, restart policy) still has
            # to reach systemd; the running server keeps going.
            reload = self.p["daemon_reload"] or status.get("needs_reload")
            if self.p["manager"] == "systemd" and reload and not self.module.check_mode:
                self.run(["systemctl", "daemon-reload"])
            if self.p["manager"] == "systemd" and not status["enabled"]:
                if not self.module.check_mode:
                    self.run(["systemctl", "enable", self.p["name"]])
                self.module.exit_json(changed=True, action="enabled", pid=status["pid"], **result)
            action = "recorded" if wanted.records_changed else "none"
            self.module.exit_json(
                changed=wanted.records_changed, action=action, pid=status["pid"], **result
            )
        action = "restarted" if status["running"] else "started"
        if self.module.check_mode:
            self.module.exit_json(changed=True, action=action, pid=status["pid"], **result)
        if self.p["manager"] == "systemd":
            self.systemd_start(status, restart=status["running"])
            after = self.status()
        else:
            if status["running"]:
                stop_supervisor(status, self.p["stop_timeout"] + 10)
            after = self.supervisor_start()
        result.update(now=time.time(), restarts_after=after.get("restarts", 0))
        self.module.exit_json(changed=True, action=action, pid=after.get("pid"), **result)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "manager": {"type": "str", "choices": ["systemd", "supervisor"], "required": True},
            "name": {"type": "str", "default": "kimi-sglang"},
            "state": {"type": "str", "choices": ["started", "stopped"], "default": "started"},
            "launch": {"type": "str", "no_log": True},
            "identity_file": {"type": "path"},
            "key_file": {"type": "path", "no_log": False},
            "spec_file": {"type": "path"},
            "supervisor_script": {"type": "path"},
            "pid_file": {"type": "path"},
            "state_file": {"type": "path"},
            "stop_timeout": {"type": "int", "default": 120},
            "command_timeout": {"type": "float", "default": 0},
            "start_timeout": {"type": "int", "default": 30},
            "daemon_reload": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    os.umask(0o022)
    Service(module).ensure()


if __name__ == "__main__":
    main()
