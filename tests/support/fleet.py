"""Fleets over test hosts (docs/fleet.md): an inventory's kimi_router_<name> group of replicas,
whose kimi_router_host names the host that runs its router, and steady load through a router."""

from __future__ import annotations

import contextlib
import shutil
import threading
from pathlib import Path

import requests
import yaml

REPO = Path(__file__).resolve().parents[2]


def inventory_copy(cluster, folder: Path) -> Path:
    """The test hosts' inventory file copied into folder/inventory (with the kit's group_vars),
    for groups that only some tests want."""
    inventory = folder / "inventory" / "hosts.yml"
    inventory.parent.mkdir(parents=True)
    shutil.copy(cluster.inventory, inventory)
    (inventory.parent / "group_vars").symlink_to(REPO / "group_vars")
    return inventory


def add_group(inventory: Path, group: str, hosts: list[str], variables: dict | None = None):
    """The inventory file with one more group of hosts (and its vars), in place."""
    tree = yaml.safe_load(inventory.read_text())
    tree["all"]["children"][group] = {
        "hosts": dict.fromkeys(hosts),
        **({"vars": variables} if variables else {}),
    }
    inventory.write_text(yaml.safe_dump(tree, sort_keys=False))
    return inventory


def add_fleet(
    inventory: Path,
    group: str,
    replicas: list[str],
    router: str,
    router_group: str | None = None,
) -> Path:
    """The inventory file with the fleet added, in place. With router_group, the router host
    leaves gpu_hosts for a group of that name (a CPU host, no hardware profile)."""
    if router_group:
        tree = yaml.safe_load(inventory.read_text())
        children = tree["all"]["children"]
        for profile in children["gpu_hosts"]["children"].values():
            if router in profile["hosts"]:
                children[router_group] = {"hosts": {router: profile["hosts"].pop(router)}}
        inventory.write_text(yaml.safe_dump(tree, sort_keys=False))
    return add_group(inventory, group, replicas, {"kimi_router_host": router})


@contextlib.contextmanager
def steady_load(url: str, api_key: str, most: int = 5000):
    """Requests one after another to url (a /generate) until the block ends: yields the list
    of their outcomes, each an HTTP status or the error of a request that got none."""
    answers: list = []
    stop = threading.Event()
    body = {"text": "Say hi.", "sampling_params": {"max_new_tokens": 4}}
    auth = {"Authorization": f"Bearer {api_key}"}

    def send():
        while not stop.is_set() and len(answers) < most:
            try:
                answers.append(requests.post(url, json=body, headers=auth, timeout=30).status_code)
            except requests.RequestException as error:
                answers.append(str(error))

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        yield answers
    finally:
        stop.set()
        sender.join(timeout=60)
