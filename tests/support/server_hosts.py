"""What the server tests read on their two test hosts (tests/integration/test_server.py):
`node`, whose PID 1 is sshd (the kit's supervisor runs the server), and `sysd`, booted by
systemd (a unit runs it)."""

from __future__ import annotations

import json

HOST = "node"  # PID 1 is sshd: the kit's supervisor runs the server
SYSD = "sysd"  # PID 1 is systemd: a unit runs the server
UNIT = "kimi-sglang"


def supervisor_state(cluster, host=HOST) -> dict:
    out = cluster.ssh(host, "cat /var/lib/kimi/server/kimi-sglang.state.json").stdout
    return json.loads(out)


def unit_show(cluster, *properties: str) -> dict:
    out = cluster.ssh(SYSD, f"systemctl show {UNIT} -p {','.join(properties)}").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def server_pid(cluster, host=HOST) -> int:
    if host == SYSD:
        return int(unit_show(cluster, "MainPID")["MainPID"])
    return int(supervisor_state(cluster, host).get("child_pid") or 0)


def restarts(cluster, host) -> int:
    if host == SYSD:
        return int(unit_show(cluster, "NRestarts")["NRestarts"])
    return int(supervisor_state(cluster, host)["restarts"])


def readable_holding(cluster, host, *values: str) -> list[str]:
    """Files under the server's folders that users other than root may read and that hold
    one of values."""
    patterns = " ".join(f"-e {value}" for value in values)
    found = cluster.ssh(
        host,
        "find /etc/kimi /var/lib/kimi /var/log/kimi /etc/systemd/system -type f -perm /044 "
        f"-print0 | xargs -0 -r grep -l -F {patterns}",
        check=False,
    )
    return found.stdout.split()


def journal(cluster) -> str:
    return cluster.ssh(SYSD, f"journalctl -u {UNIT} --no-pager -o cat").stdout


def server_log(cluster, host: str) -> str:
    """What the server printed: the unit and the supervisor both write the log file."""
    return cluster.ssh(host, "cat /var/log/kimi/sglang.log").stdout


def generate(cluster, host=HOST, port=30000, key=None) -> str:
    header = f"-H 'Authorization: Bearer {key}' " if key else ""
    return cluster.ssh(
        host,
        f"curl -s -o /dev/null -w '%{{http_code}}' {header}-X POST "
        f'-d \'{{"text": "hi", "sampling_params": {{"max_new_tokens": 4}}}}\' '
        f"http://127.0.0.1:{port}/generate",
        check=False,
    ).stdout.strip()
