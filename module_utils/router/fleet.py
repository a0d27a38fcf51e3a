"""Which router fronts which replicas, from the inventory: each group kimi_router_<name> is one
fleet of serving hosts, and its kimi_router_host names the inventory host that runs the
router (one of the replicas or a CPU host). Worked out on the controller by the
kimi_router_fleets filter (filter_plugins/kimi_filters.py) before the router play; every
problem is said with what was found, what is needed and how to fix it."""

from __future__ import annotations

import ipaddress
import re

from ansible.module_utils.contract.disaggregation import side

GROUP_PREFIX = "kimi_router_"
GROUP_NAME = re.compile(r"^kimi_router_[A-Za-z0-9_]{1,64}$")
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")
ALL_INTERFACES = ("0.0.0.0", "::", "")  # noqa: S104 - a replica's bind address, read here
MAX_REPLICAS = 256
# Each fleet's settings, read from its kimi_router_<name> group's vars (the same on every
# replica), with their defaults (docs/fleet.md). Not in group_vars/all: a group's vars in the
# inventory's hosts.yml would lose to it.
DEFAULTS = {
    # The inventory host that runs the fleet's router (required).
    "kimi_router_host": "",
    # sglang-router's policy: cache_aware, round_robin, random or power_of_two.
    "kimi_router_policy": "cache_aware",
    # Where the router listens: clients send it what they sent a replica, with the replicas'
    # API key (sglang-router 0.3.2 takes one key for both sides).
    "kimi_router_bind_host": "0.0.0.0",  # noqa: S104 - the router's default, as SGLang's
    "kimi_router_port": 30080,
    # Its Prometheus metrics (requests per replica).
    "kimi_router_metrics_host": "127.0.0.1",
    "kimi_router_metrics_port": 29000,
}


class FleetError(ValueError):
    """A fleet the inventory describes wrongly: found, needed, fix."""


def _is_loopback(address: str) -> bool:
    if address.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def url_host(address: str) -> str:
    """An address as it goes into a URL (IPv6 in brackets)."""
    try:
        if ipaddress.ip_address(address.strip("[]")).version == 6:
            return f"[{address.strip('[]')}]"
    except ValueError:
        pass
    return address


def replica_url(replica: str, router_host: str, replica_vars: dict) -> str:
    """The URL the router reaches a replica at: its bind address, or, where it binds every
    interface, the address Ansible reaches it at. A replica bound to loopback is reachable
    only from itself."""
    settings = replica_vars.get("kimi_server_settings")
    if not isinstance(settings, dict):
        raise FleetError(
            f"Found: {replica} has no kimi_server_settings (is it a serving host?). Needed: "
            "every host of a kimi_router_* group serves Kimi (gpu_hosts). Fix: put only "
            "serving hosts in the group."
        )
    bind = str(settings.get("host", "")).strip()
    port = settings.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise FleetError(
            f"Found: {replica}'s server port {port!r}. Needed: a port 1 to 65535. "
            "Fix: kimi_server_port."
        )
    if _is_loopback(bind) and replica != router_host:
        raise FleetError(
            f"Found: {replica} serves on {bind} only, and its router runs on {router_host}. "
            "Needed: every replica reachable from the router host. Fix: set kimi_server_host: "
            "0.0.0.0 for the group (with kimi_server_api_key, which a server beyond loopback "
            f"needs), or run the router on {replica} alone."
        )
    if bind in ALL_INTERFACES:
        address = str(replica_vars.get("ansible_host") or replica)
        if _is_loopback(address) and replica != router_host:
            raise FleetError(
                f"Found: {replica}'s address is {address}, which is the router host's own "
                f"loopback on {router_host}. Needed: an address the router host reaches it at. "
                "Fix: set ansible_host to the replica's address."
            )
        if replica == router_host:
            address = "127.0.0.1"
    else:
        address = bind
    return f"http://{url_host(address)}:{port}"


def fleet_settings(group: str, members: list, hostvars, defaults: dict) -> dict:
    """The fleet's router settings (defaults' names) as its group's vars set them: the same on
    every replica, or the fleet is refused. The replicas' API key is compared, never returned
    (the router role reads it itself)."""
    settings = {}
    for name in [*defaults, "kimi_server_api_key"]:
        values = {host: hostvars[host].get(name, defaults.get(name)) for host in members}
        if len({repr(value) for value in values.values()}) > 1:
            shown = (
                ""
                if name == "kimi_server_api_key"
                else ": " + ", ".join(f"{host} {value!r}" for host, value in values.items())
            )
            raise FleetError(
                f"Found: {name} differs among {group}'s replicas{shown}. Needed: one value for "
                f"the fleet (its router sends every replica the same). Fix: set {name} under "
                f"{group}'s vars, not per host."
            )
        if name in defaults:
            settings[name] = values[members[0]]
    return settings


def fleets(groups: dict, hostvars, defaults: dict | None = None) -> dict:
    """router host -> {"group", "replicas": [{"host", "url"}], "settings", "router_url",
    "metrics_url"}, for every kimi_router_* group; the URLs are as the router host reaches
    them. hostvars maps a host to its variables (Ansible's hostvars); defaults are the fleet
    settings' names and default values (DEFAULTS unless given)."""
    defaults = dict(DEFAULTS if defaults is None else defaults)
    out: dict = {}
    everyone = set(groups.get("all", []))
    for group in sorted(name for name in groups if name.startswith(GROUP_PREFIX)):
        members = list(groups[group])
        if not GROUP_NAME.match(group):
            raise FleetError(
                f"Found: the group {group!r}. Needed: kimi_router_ and up to 64 letters, digits "
                "or underscores. Fix: rename the group."
            )
        if not members:
            raise FleetError(
                f"Found: {group} has no hosts. Needed: the serving hosts its router fronts. "
                "Fix: list them under it, or remove the group."
            )
        if len(members) > MAX_REPLICAS:
            raise FleetError(
                f"Found: {group} has {len(members)} hosts. Needed: at most {MAX_REPLICAS}. "
                "Fix: split it into several groups, each with its router."
            )
        routers = {str(hostvars[host].get("kimi_router_host") or "") for host in members}
        if len(routers) != 1 or "" in routers:
            shown = ", ".join(sorted(repr(r) for r in routers))
            raise FleetError(
                f"Found: kimi_router_host {shown} among {group}'s hosts. Needed: one inventory "
                f"host that runs {group}'s router. Fix: set kimi_router_host under the group's "
                "vars (it may be one of its hosts or a CPU host of the inventory)."
            )
        router = routers.pop()
        # One server over several hosts serves its API from its head (the group's first host).
        for cluster in sorted(name for name in groups if name.startswith("kimi_cluster_")):
            others = [host for host in groups[cluster][1:] if host in members]
            if others:
                raise FleetError(
                    f"Found: {', '.join(others)} of {cluster} in {group}. Needed: only the "
                    f"head of a multi-node server ({groups[cluster][0]}, which serves its API) "
                    f"in a fleet. Fix: list {groups[cluster][0]} alone under {group}."
                )
        if router not in everyone:
            raise FleetError(
                f"Found: {group}'s kimi_router_host {router!r}, which is not in the inventory. "
                "Needed: a host of the inventory (Ansible connects to it to install the "
                "router). Fix: add it, under a group of its own such as routers."
            )
        if router in out:
            raise FleetError(
                f"Found: {router} named as the router of {out[router]['group']} and of {group}. "
                "Needed: one router per host. Fix: name another host for one of them."
            )
        settings = fleet_settings(group, members, hostvars, defaults)
        replicas = [
            {
                "host": host,
                "url": replica_url(host, router, hostvars[host]),
                **disaggregation_of(host, hostvars[host]),
            }
            for host in members
        ]
        check_disaggregation(group, replicas, groups)
        out[router] = {
            "group": group,
            "settings": settings,
            "replicas": replicas,
            **own_urls(group, settings),
        }
    return out


def own_urls(group: str, settings: dict) -> dict:
    """The fleet's router and its metrics page, as the router host reaches them."""
    router = local_url(
        settings.get("kimi_router_bind_host"), settings.get("kimi_router_port"), f"{group}'s router"
    )
    metrics = local_url(
        settings.get("kimi_router_metrics_host"),
        settings.get("kimi_router_metrics_port"),
        f"{group}'s router metrics",
    )
    return {"router_url": router, "metrics_url": metrics + "/metrics"}


def local_url(host, port, what: str = "the server") -> str:
    """http://host:port as a listener's own host reaches it (loopback where it listens on
    every interface, IPv6 in brackets): a server's (the kimi_server_url filter) or a router's.
    FleetError for a port outside 1-65535 or a host that is neither a name nor an address."""
    try:
        number = int(port)
    except (TypeError, ValueError):
        number = -1
    if not 0 < number < 65536:
        raise FleetError(f"{what}'s port must be 1-65535, got {port!r}")
    host = str(host or "")
    if host in ALL_INTERFACES:
        host = "127.0.0.1"
    try:
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    except ValueError:
        if not re.match(r"^[A-Za-z0-9.-]+$", host):
            raise FleetError(f"{what}'s host is not a name or an address: {host!r}") from None
    return f"http://{host}:{number}"


def benchmark_targets(fleet: dict, concurrency: list, rates: list = ()) -> list[dict]:
    """What a fleet benchmark measures from the router host (roles/benchmark/tasks/fleet.yml),
    in order: each replica alone at every concurrency and request rate, then the router at
    each of them times the replicas (the same load per replica), with what the level needs to
    read each replica and the router's metrics. `fleet` is one value of fleets()."""
    replicas = fleet["replicas"]
    levels = [int(c) for c in concurrency]
    if not levels or min(levels) < 1:
        raise FleetError(
            f"Found: benchmark_concurrency {concurrency!r}. Needed: levels of at least 1 "
            "request per replica. Fix: benchmark_concurrency."
        )

    workers = {replica["host"]: replica["url"] for replica in replicas}
    # A prefill or a decode server alone serves no request: a disaggregated fleet is measured
    # through its router only.
    split = any(replica.get("mode") for replica in replicas)
    alone = (
        []
        if split
        else [
            {
                "name": replica["host"],
                "url": replica["url"],
                "concurrency": levels,
                "request_rates": [float(r) for r in rates],
                "fleet": None,
            }
            for replica in replicas
        ]
    )
    load = 1 if split else len(replicas)
    return [
        *alone,
        {
            "name": fleet["group"],
            "url": fleet["router_url"],
            "concurrency": [c * load for c in levels],
            "request_rates": [float(r) * load for r in rates],
            "fleet": {
                "workers": workers,
                "router_metrics_url": fleet["metrics_url"],
            },
        },
    ]


def disaggregation_of(host: str, replica_vars: dict) -> dict:
    """{"mode": "prefill" | "decode" | "", "bootstrap_port": the prefill's or None}."""
    settings = replica_vars.get("kimi_server_settings") or {}
    try:
        mode, port = side(settings.get("disaggregation") if isinstance(settings, dict) else None)
    except ValueError as error:
        raise FleetError(
            f"Found: {host}'s {error}. Needed: a prefill server with a bootstrap port, or a "
            "decode server. Fix: its kimi_prefill_*/kimi_decode_* group and "
            "kimi_disaggregation_bootstrap_port."
        ) from None
    return {"mode": mode, "bootstrap_port": port}


def check_disaggregation(group: str, replicas: list[dict], groups: dict) -> None:
    """A fleet serves whole requests on every replica, or splits them: prefill servers and
    decode servers, each side at least one, behind a router in PD mode."""
    for replica in replicas:
        sides = [
            name
            for name in groups
            if name.startswith(("kimi_prefill_", "kimi_decode_"))
            and replica["host"] in groups[name]
        ]
        if len({name.split("_")[1] for name in sides}) > 1:
            raise FleetError(
                f"Found: {replica['host']} in {', '.join(sorted(sides))}. Needed: a host serves "
                "prefill or decode, not both. Fix: keep it in one of those groups."
            )
    modes = {replica["mode"] for replica in replicas}
    if modes == {""}:
        return
    if "" in modes or modes != {"prefill", "decode"}:
        shown = ", ".join(f"{r['host']} {r['mode'] or 'both'}" for r in replicas)
        raise FleetError(
            f"Found: {group}'s replicas serve {shown}. Needed: a disaggregated fleet of "
            "prefill and decode servers only, at least one of each. Fix: put each of its hosts "
            "in a kimi_prefill_* or a kimi_decode_* group, or none of them."
        )


def worker_args(healthy: list[dict]) -> list[str]:
    """sglang-router's worker flags for the replicas that answered: --worker-urls, or in PD
    mode --pd-disaggregation with --prefill URL BOOTSTRAP_PORT and --decode URL each."""
    if not any(replica.get("mode") for replica in healthy):
        return ["--worker-urls", *(replica["url"] for replica in healthy)]
    argv = ["--pd-disaggregation"]
    for replica in healthy:
        if replica.get("mode") == "prefill":
            argv += ["--prefill", replica["url"], str(replica["bootstrap_port"])]
    for replica in healthy:
        if replica.get("mode") == "decode":
            argv += ["--decode", replica["url"]]
    return argv
