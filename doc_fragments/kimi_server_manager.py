"""Options of the modules that act on the running server through its manager."""

from __future__ import annotations


class ModuleDocFragment:
    # server_service and server_health find the server the same way: systemd's unit, or the
    # kit's supervisor's pid and state files.
    DOCUMENTATION = r"""
options:
  manager:
    description: C(systemd) (where it is PID 1) or C(supervisor) (the kit's own, kimi-supervise).
    type: str
    choices: [systemd, supervisor]
    required: true
  name:
    description: The systemd unit's name, or the supervised server's name in messages.
    type: str
    default: kimi-sglang
  pid_file:
    description: The supervisor's pid file (O(manager=supervisor)).
    type: path
  state_file:
    description: The supervisor's state file (O(manager=supervisor)).
    type: path
"""
