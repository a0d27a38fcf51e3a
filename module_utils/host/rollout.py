"""Rolling deploys: which hosts go through every stage together, and in what order.

deploy_kimi.yml is one play whose `hosts:` and `serial:` come from here. A unit is a host, or
the hosts of one kimi_cluster_* group (they run one multi-node server together, so they never
go apart); a batch takes whole units, in inventory order, up to kimi_deploy_serial hosts, and a
unit larger than that goes alone. Without kimi_deploy_serial every host is one batch in
inventory order, as a play over gpu_hosts runs them.

`serial:` is templated before any task runs, from extra vars, play vars and magic variables
(`groups`, and `ansible_play_hosts_all`, which is every host --limit leaves while the play's
own `hosts:` is still a template): inventory variables are not there, hence an extra var.

Controller-side only (a filter imports it); standard library only.
"""

from __future__ import annotations

import re

CLUSTER_PREFIX = "kimi_cluster_"
SERIAL_FIX = (
    "Fix: give a number of hosts, e.g. -e kimi_deploy_serial=2, or leave it out to deploy "
    "every host at once"
)
WHOLE_NUMBER = re.compile(r"\s*[0-9]{1,9}\s*")


class RolloutError(ValueError):
    """The settings or the inventory do not give a rollout; the message says the fix."""


def serial_size(value) -> int | None:
    """kimi_deploy_serial as a number of hosts, or None when it is not set. `-e name=value`
    hands over text, JSON extra vars a number: both are taken, nothing else is."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and WHOLE_NUMBER.fullmatch(value):
        size = int(value)
    else:
        size = 0
    if size < 1:
        raise RolloutError(
            f"kimi_deploy_serial is {value!r}: needed a whole number of hosts, 1 or more, that "
            f"go through every stage of the deploy at a time. {SERIAL_FIX}."
        )
    return size


def _names(value, what: str) -> list[str]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(n, str) for n in value):
        raise RolloutError(f"{what} must be a list of host names, got {type(value).__name__}")
    return list(dict.fromkeys(value))


def cluster_of(groups: dict, hosts: list[str]) -> dict[str, str]:
    """host -> its kimi_cluster_* group, for the given hosts. A host in two such groups would
    be one node of two servers (its rank comes from the first group alone): refused."""
    owner: dict[str, str] = {}
    wanted = set(hosts)
    for name in sorted(groups):
        if not str(name).startswith(CLUSTER_PREFIX):
            continue
        for host in _names(groups[name], f"group {name}"):
            if host not in wanted:
                continue
            if host in owner:
                raise RolloutError(
                    f"{host} is in two multi-node server groups, {owner[host]} and {name}; "
                    "a host is a node of one server. Fix: keep it in one kimi_cluster_* group "
                    "of your inventory"
                )
            owner[host] = name
    return owner


def units(groups: dict, hosts: list[str]) -> list[list[str]]:
    """The hosts in the order given, each kimi_cluster_* group pulled together at its first
    member, in its own (rank) order; hosts outside `hosts` (--limit) are left out."""
    owner = cluster_of(groups, hosts)
    wanted = set(hosts)
    placed: set[str] = set()
    found = []
    for host in hosts:
        if host in placed:
            continue
        unit = (
            [member for member in dict.fromkeys(groups[owner[host]]) if member in wanted]
            if host in owner
            else [host]
        )
        placed.update(unit)
        found.append(unit)
    return found


def batches(units_in_order: list[list[str]], size: int) -> list[list[str]]:
    """Whole units, in order, up to `size` hosts a batch; a larger unit is a batch alone."""
    found: list[list[str]] = []
    current: list[str] = []
    for unit in units_in_order:
        if current and len(current) + len(unit) > size:
            found.append(current)
            current = []
        current = current + unit
        if len(current) >= size:
            found.append(current)
            current = []
    if current:
        found.append(current)
    return found


def rollout(serial, groups, play_group: str, present) -> dict:
    """The play's rollout: `hosts` in order, the `serial` batch sizes ([] when not rolling: one
    batch), the `batches` themselves, `batch_of` (host -> index in batches) and `rolling`.
    `present` is every host the run may act on (ansible_play_hosts_all: the inventory after
    --limit); `play_group` the play's group."""
    size = serial_size(serial)
    if not isinstance(groups, dict):
        raise RolloutError(f"groups must be the inventory's groups, got {type(groups).__name__}")
    allowed = set(_names(present, "the hosts after --limit"))
    hosts = [h for h in _names(groups.get(play_group, []), play_group) if h in allowed]
    together = units(groups, hosts)
    rolling = size is not None
    found = batches(together, size) if rolling else [hosts] if hosts else []
    return {
        "rolling": rolling,
        "hosts": [host for batch in found for host in batch],
        "serial": [len(batch) for batch in found] if rolling else [],
        "batches": found,
        "batch_of": {host: index for index, batch in enumerate(found) for host in batch},
    }
