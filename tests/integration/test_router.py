"""The router stage (playbooks/router.yml, roles/router) over test hosts: three simulator
replicas (tests/support/sglang_sim.py listening beyond loopback with an API key, as a fleet's
replicas do) behind the real sglang-router 0.3.2, which the stage installs from a wheelhouse
into its own venv on `rt`, a CPU host of the inventory (not a serving host: no hardware
profile). The fleet is the inventory group kimi_router_fleet, whose kimi_router_host is rt.

One module fixture runs the stage three times: with sim-c down (left out and named, the
router serves the other two), with sim-c up again (the router restarts with all three), and
once more (nothing changes). The tests then send requests through the router and read what it
says it sent where (its Prometheus metrics), kill a replica under load, and look for the key.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import requests
import yaml

from tests.support import sim_process
from tests.support.secret_scan import derived_forms

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

REPLICAS = ["sim-a", "sim-b", "sim-c"]
ROUTER = "rt"
KEY = "kimi-router-fleet-key-7c2e90a1"
SERVER_PORT = 30000
ROUTER_PORT = 30080
METRICS_PORT = 29000
SIM_LOG = "/var/log/kimi-sim.log"
CHAT = {"model": "k", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def cluster():
    from tests.support.testhosts import TestHostCluster

    hosts = TestHostCluster.up(["ct200"] * 4, names=[*REPLICAS, ROUTER])
    try:
        write_fleet_inventory(hosts)
        yield hosts
    finally:
        hosts.down()


def write_fleet_inventory(cluster) -> None:
    """The test hosts' inventory, with rt moved out of gpu_hosts into a group of its own and
    the three replicas in kimi_router_fleet."""
    path = cluster.write_inventory()
    tree = yaml.safe_load(path.read_text())
    ct200 = tree["all"]["children"]["gpu_hosts"]["children"]["ct200"]["hosts"]
    router = ct200.pop(ROUTER)
    tree["all"]["children"]["routers"] = {"hosts": {ROUTER: router}}
    tree["all"]["children"]["kimi_router_fleet"] = {
        "hosts": {name: None for name in REPLICAS},
        "vars": {"kimi_router_host": ROUTER},
    }
    path.write_text(yaml.safe_dump(tree, sort_keys=False))


def address(cluster, host: str) -> str:
    return cluster.host(host).address


def start_replica(cluster, host: str) -> None:
    """The simulator as a replica: every interface, the fleet's key, SGLang's port."""
    argv = [a if a != "127.0.0.1" else "0.0.0.0" for a in sim_process.BASE]  # noqa: S104
    argv += ["--port", str(SERVER_PORT), "--api-key", KEY]
    cluster.ssh(
        host,
        f"setsid nohup /usr/bin/python3 {REPO}/tests/support/sglang_sim.py "
        f"{' '.join(argv)} > {SIM_LOG} 2>&1 < /dev/null &",
    )
    url = f"http://{address(cluster, host)}:{SERVER_PORT}/health"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{host}'s simulator did not start: {cluster.ssh(host, f'cat {SIM_LOG}')}")


def stop_replica(cluster, host: str) -> None:
    cluster.ssh(host, "pkill -KILL -f tests/support/sglang_sim.py", check=False)


@pytest.fixture(scope="module")
def runs(cluster, router_wheelhouse, tmp_path_factory):
    from tests.support.ansible_run import run_playbook

    extravars = {
        "kimi_server_host": "0.0.0.0",  # noqa: S104 - the replicas' bind address
        "kimi_server_api_key": KEY,
        "kimi_router_policy": "round_robin",
        "router_wheelhouse": str(router_wheelhouse),
        "router_health_check_interval_s": 1,
        "router_health_failure_threshold": 2,
        "kimi_controller_cache_dir": str(tmp_path_factory.mktemp("cache")),
    }

    def run(name: str):
        return run_playbook(
            "playbooks/router.yml",
            cluster.inventory,
            tmp_path_factory.mktemp(name),
            extravars=extravars,
        )

    for host in REPLICAS[:2]:
        start_replica(cluster, host)
    partial = run("partial")
    start_replica(cluster, REPLICAS[2])
    full = run("full")
    again = run("again")
    return {"partial": partial, "full": full, "again": again}


def router_url(cluster) -> str:
    return f"http://{address(cluster, ROUTER)}:{ROUTER_PORT}"


def router_metrics(cluster) -> str:
    return cluster.ssh(
        ROUTER,
        '/usr/bin/python3 -c "import urllib.request; print(urllib.request.urlopen('
        f"'http://127.0.0.1:{METRICS_PORT}/metrics', timeout=10).read().decode())\"",
    ).stdout


def sent_to(cluster) -> dict[str, int]:
    """Requests the router's circuit breaker counted as answered, per replica host."""
    hosts = {f"http://{address(cluster, h)}:{SERVER_PORT}": h for h in REPLICAS}
    counts = dict.fromkeys(REPLICAS, 0)
    pattern = r'smg_worker_cb_outcomes_total\{worker="([^"]+)",outcome="success"\} (\d+)'
    for url, count in re.findall(pattern, router_metrics(cluster)):
        counts[hosts[url]] += int(count)
    return counts


def test_a_replica_that_fails_its_health_check_is_left_out_and_named(runs):
    partial = runs["partial"]
    assert partial.rc == 0 and not partial.failed_hosts(), partial.stdout[-6000:]
    warned = partial.results("Warn about the replicas left out of the router")[ROUTER]["msg"]
    assert warned.startswith("WARNING: left out of kimi_router_fleet's router: sim-c: /health:")
    record = partial.results("Say where the router serves")[ROUTER]["msg"]
    assert "replicas sim-a, sim-b; left out: sim-c" in record


def test_the_router_fronts_every_healthy_replica_and_a_rerun_changes_nothing(cluster, runs):
    full = runs["full"]
    assert full.rc == 0 and not full.failed_hosts(), full.stdout[-6000:]
    assert full.results("Start the router, restarting it only when its launch changed")[ROUTER][
        "changed"
    ]
    ready = full.results("Wait until the router lists every healthy replica")[ROUTER]
    urls = {f"http://{address(cluster, h)}:{SERVER_PORT}" for h in REPLICAS}
    assert {w["url"] for w in ready["workers"] if w["healthy"]} == urls
    runs["again"].assert_unchanged()
    launch = json.loads(cluster.ssh(ROUTER, "cat /var/lib/kimi/router/launch.json").stdout)
    assert launch["policy"] == "round_robin" and launch["left_out"] == []
    assert launch["argv"][launch["argv"].index("--policy") + 1] == "round_robin"
    assert launch["manager"] == "supervisor"


def test_requests_spread_by_policy_and_need_the_key(cluster, runs):
    before = sent_to(cluster)
    url = router_url(cluster)
    assert requests.post(f"{url}/v1/chat/completions", json=CHAT, timeout=30).status_code == 401
    auth = {"Authorization": f"Bearer {KEY}"}
    for _ in range(30):
        answer = requests.post(f"{url}/v1/chat/completions", json=CHAT, headers=auth, timeout=30)
        assert answer.status_code == 200, answer.text
    after = sent_to(cluster)
    spread = {host: after[host] - before[host] for host in REPLICAS}
    # round_robin: each replica gets its turn in order.
    assert sum(spread.values()) == 30 and all(count == 10 for count in spread.values()), spread


def test_the_router_adds_little_to_a_request(cluster, runs):
    """Not a limit: the figure for the closing note. The same request, one at a time, to a
    replica directly and through the router (which may send it to any replica)."""
    auth = {"Authorization": f"Bearer {KEY}"}
    direct = f"http://{address(cluster, 'sim-a')}:{SERVER_PORT}/v1/chat/completions"
    routed = f"{router_url(cluster)}/v1/chat/completions"
    times: dict[str, list[float]] = {direct: [], routed: []}
    for _ in range(20):
        for url, taken in times.items():
            started = time.perf_counter()
            assert requests.post(url, json=CHAT, headers=auth, timeout=30).status_code == 200
            taken.append(time.perf_counter() - started)
    alone, through = (sorted(taken)[len(taken) // 2] * 1000 for taken in times.values())
    print(
        f"\nmedian of 20 requests: {alone:.1f} ms to a replica, {through:.1f} ms through the "
        f"router: {through - alone:+.1f} ms"
    )


def test_a_replica_killed_under_load_is_taken_out(cluster, runs):
    url = router_url(cluster)
    auth = {"Authorization": f"Bearer {KEY}"}
    stop_replica(cluster, "sim-b")
    try:
        failed, deadline = 0, time.monotonic() + 6
        while time.monotonic() < deadline:
            answer = requests.post(
                f"{url}/v1/chat/completions", json=CHAT, headers=auth, timeout=30
            )
            failed += answer.status_code != 200
        # Its health checks fail within interval x threshold (2 s here): then it is out.
        workers = requests.get(f"{url}/workers", headers=auth, timeout=10).json()["workers"]
        healthy = {w["url"]: w["is_healthy"] for w in workers}
        assert healthy[f"http://{address(cluster, 'sim-b')}:{SERVER_PORT}"] is False
        before = sent_to(cluster)
        for _ in range(10):
            answer = requests.post(
                f"{url}/v1/chat/completions", json=CHAT, headers=auth, timeout=30
            )
            assert answer.status_code == 200, answer.text
        after = sent_to(cluster)
        assert after["sim-b"] == before["sim-b"]
        print(f"\nrequests failed while sim-b died: {failed}")
    finally:
        start_replica(cluster, "sim-b")


def test_the_router_key_is_never_on_its_command_line_in_a_record_or_the_output(cluster, runs):
    pid = cluster.ssh(ROUTER, "cat /var/lib/kimi/router/kimi-router.pid").stdout.strip()
    cmdline = cluster.ssh(ROUTER, f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
    assert (
        KEY not in cmdline
        and "kimi-router" in cmdline + cluster.ssh(ROUTER, f"cat /proc/{pid}/comm").stdout
    )
    mode = cluster.ssh(ROUTER, "stat -c %a /etc/kimi/kimi-router-secrets.json").stdout.strip()
    assert mode == "600"
    written = cluster.ssh(
        ROUTER,
        "cat /var/lib/kimi/router/launch.json /etc/kimi/kimi-router-supervise.json "
        "/etc/kimi/kimi-router.env /var/log/kimi/router.log",
    ).stdout
    for form in derived_forms(KEY).values():
        assert form.decode() not in written
    for name, run in runs.items():
        for path in (Path(run.private_dir) / "artifacts").rglob("*"):
            if path.is_file():
                assert KEY not in path.read_text(errors="replace"), (name, path)
