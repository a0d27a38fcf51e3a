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

import csv
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from tests.support import sim_process
from tests.support.fleet import add_fleet
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
        # rt moves out of gpu_hosts into a group of its own; the replicas form the fleet.
        add_fleet(hosts.write_inventory(), "kimi_router_fleet", REPLICAS, ROUTER, "routers")
        yield hosts
    finally:
        hosts.down()


def address(cluster, host: str) -> str:
    return cluster.host(host).address


def start_replica(cluster, host: str, environment: str = "", flags: tuple = ()) -> None:
    """The simulator as a replica: every interface, the fleet's key, SGLang's port."""
    argv = [a if a != "127.0.0.1" else "0.0.0.0" for a in sim_process.BASE]  # noqa: S104
    argv += ["--port", str(SERVER_PORT), "--api-key", KEY, *flags]
    quick = " ".join(f"{name}={value}" for name, value in sim_process.QUICK_POLLS.items())
    cluster.ssh(
        host,
        f"{quick} {environment} setsid nohup /usr/bin/python3 {REPO}/tests/support/sglang_sim.py "
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


def routed_again(cluster, host: str) -> None:
    """Until the router lists `host` healthy again. First the time its health checks take to
    notice a restart (two failures a second apart), so that an old answer does not count."""
    time.sleep(2.5)
    url = f"http://{address(cluster, host)}:{SERVER_PORT}"
    auth = {"Authorization": f"Bearer {KEY}"}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        workers = requests.get(f"{router_url(cluster)}/workers", headers=auth, timeout=10)
        if any(w["url"] == url and w["is_healthy"] for w in workers.json()["workers"]):
            return
        time.sleep(0.5)
    raise AssertionError(f"the router did not take {host} back within 30 s")


def router_vars(router_wheelhouse, cache: Path) -> dict:
    return {
        "kimi_server_host": "0.0.0.0",  # noqa: S104 - the replicas' bind address
        "kimi_server_api_key": KEY,
        "kimi_router_policy": "round_robin",
        "router_wheelhouse": str(router_wheelhouse),
        "router_health_check_interval_s": 1,
        "router_health_failure_threshold": 2,
        "kimi_controller_cache_dir": str(cache),
    }


@pytest.fixture(scope="module")
def runs(cluster, router_wheelhouse, tmp_path_factory):
    from tests.support.ansible_run import run_playbook

    extravars = router_vars(router_wheelhouse, tmp_path_factory.mktemp("cache"))

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


FLEET_RUN = "fleet1"
MODEL_FILES = "/opt/kimi/model-files"
FLEET = "kimi_router_fleet"
# Each level sends requests_per_concurrency (2) x its concurrency, at least num_prompts (2).
# sim-c alone: 1 warmup + 2 at c1 + 4 at c2; through the router (round robin over three) its
# share of 1 warmup + 6 at c3 is 2 or 3, of 12 at c6 four: its 12th request, at c6, kills it
# (SGLANG_SIM_CRASH_AFTER).
CRASH_AFTER = 11


@pytest.fixture(scope="module")
def fleet_bench(cluster, runs, tmp_path_factory):
    """benchmark_kimi.yml -e benchmark_target=fleet from rt, sim-c dying mid-way through the
    router's second level; then sim-c comes back for the tests after this one."""
    from tests.support.ansible_run import run_playbook
    from tests.support.models import write_kimi_tokenizer
    from tests.support.results_tree import TEMPLATE

    model = tmp_path_factory.mktemp("model")
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    write_kimi_tokenizer(model)
    for name in ("tokenizer_config.json", "tiktoken.model"):
        cluster.ssh(
            ROUTER,
            f"mkdir -p {MODEL_FILES} && cat > {MODEL_FILES}/{name}",
            input=(model / name).read_text(),
        )
    prompts = tmp_path_factory.mktemp("prompts") / "own.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": f"Count to {n}, one number a line."}) + "\n" for n in range(12)
        )
    )
    stop_replica(cluster, "sim-c")
    start_replica(cluster, "sim-c", f"SGLANG_SIM_CRASH_AFTER={CRASH_AFTER}")
    routed_again(cluster, "sim-c")
    results = tmp_path_factory.mktemp("fleet-results")
    try:
        bench = run_playbook(
            "benchmark_kimi.yml",
            cluster.inventory,
            tmp_path_factory.mktemp("fleet-bench"),
            extravars={
                "benchmark_target": "fleet",
                "kimi_server_api_key": KEY,
                "kimi_server_host": "0.0.0.0",  # noqa: S104 - the replicas' bind address
                "benchmark_api_key": KEY,
                "benchmark_prompt_sets": [],
                "benchmark_prompt_files": {"own": str(prompts)},
                # The router host serves nothing: no runtime Python, no model folder. Its
                # system Python reads prompt rows (chat rows would need jinja2).
                "benchmark_prompts_python": "/usr/bin/python3",
                "benchmark_chat_template_dir": MODEL_FILES,
                "benchmark_concurrency": [1, 2],
                "benchmark_requests_per_concurrency": 2,
                "benchmark_num_prompts": 2,
                "benchmark_max_new_tokens": 8,
                "benchmark_warmup_requests": 1,
                "benchmark_telemetry": "off",
                "benchmark_run_id": FLEET_RUN,
                "benchmark_results_dir": str(results),
            },
        )
    finally:
        stop_replica(cluster, "sim-c")
        start_replica(cluster, "sim-c")
        routed_again(cluster, "sim-c")
    out = tmp_path_factory.mktemp("fleet-report") / "report"
    analysis = subprocess.run(
        [sys.executable, "-m", "analysis", "report", str(results / FLEET_RUN), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return bench, results / FLEET_RUN, analysis, out


def fleet_level(run: Path, name: str, concurrency: int) -> dict:
    (config,) = json.loads((run / "run.json").read_text())["configs"]
    return json.loads((run / name / config / "own" / f"c{concurrency}.json").read_text())


def test_the_fleet_benchmark_measures_each_replica_alone_and_the_fleet_through_its_router(
    cluster, fleet_bench
):
    bench, run, _analysis, _out = fleet_bench
    assert bench.rc == 0 and not bench.failed_hosts(), bench.stdout[-6000:]
    record = json.loads((run / "run.json").read_text())
    assert record["hosts"] == [ROUTER] and record["status"][ROUTER][FLEET]["status"] == "ok"
    for replica in REPLICAS:
        for concurrency in (1, 2):
            alone = fleet_level(run, replica, concurrency)
            assert "fleet" not in alone and alone["summary"]["requests_failed"] == 0
            assert alone["summary"]["requests_ok"] == 2 * concurrency
    # c3: one request in flight per replica, as each had alone at c1; nothing failed.
    clean = fleet_level(run, FLEET, 3)
    assert clean["summary"]["requests_ok"] == 6 and clean["summary"]["requests_failed"] == 0
    workers = clean["fleet"]["workers"]
    assert set(workers) == set(REPLICAS) and clean["fleet"]["router_metrics"] == "read"
    for replica, served in workers.items():
        assert served["url"] == f"http://{address(cluster, replica)}:{SERVER_PORT}"
        assert served["router_requests"] == 2 and served["router_failures"] == 0, workers
        assert served["requests"] == 2 and served["generation_tokens"] > 0, workers
    assert clean["fleet"]["balance"]["min_over_max"] == 1.0


def test_a_replica_that_dies_mid_run_costs_only_the_requests_it_held(fleet_bench):
    _bench, run, _analysis, _out = fleet_bench
    level = fleet_level(run, FLEET, 6)
    summary, workers = level["summary"], level["fleet"]["workers"]
    records = level["requests"]
    failed = [r for r in records if not r["ok"]]
    # At c6 sim-c held at most two of the level's requests (and the one that killed it,
    # which the router may send elsewhere); every other request was answered.
    assert summary["requests_ok"] + summary["requests_failed"] == len(records) == 12
    assert len(failed) <= 3 and all(r["error"] for r in failed), failed
    assert not level["server"]["crashed"]
    # sim-c's counters are gone with it; the others' say what they served, nothing failed.
    assert workers["sim-c"]["requests"] is None
    for replica in ("sim-a", "sim-b"):
        assert workers[replica]["router_failures"] == 0 and workers[replica]["requests"] >= 4
    print(f"\nrequests failed at c6 when sim-c died: {len(failed)} of {len(records)}")


def test_the_report_gives_the_fleets_scaling_efficiency_and_balance(fleet_bench):
    _bench, _run, analysis, out = fleet_bench
    assert analysis.returncode == 0, analysis.stdout + analysis.stderr
    with (out / "fleet.csv").open() as handle:
        rows = {int(row["concurrency"]): row for row in csv.DictReader(handle)}
    assert set(rows) == {3, 6}
    clean = rows[3]
    assert clean["fleet"] == FLEET and clean["replicas"] == "3"
    assert clean["per_replica_concurrency"] == "1" and clean["missing"] == ""
    efficiency = float(clean["scaling_efficiency"])
    speeds = float(clean["fleet_output_tokens_per_s"]), float(clean["replicas_output_tokens_per_s"])
    assert efficiency == pytest.approx(speeds[0] / speeds[1], rel=1e-3)
    assert clean["balance_min_over_max"] == "1.0" and clean["requests_failed"] == "0"
    assert "Fleet behind the router" in (out / "summary.md").read_text()
    print(
        f"\nscaling efficiency at 1 request per replica: {efficiency:.3f} "
        f"({speeds[0]:.1f} output tokens/s through the router, {speeds[1]:.1f} for the three "
        "replicas alone, summed)"
    )


def served(cluster, host: str) -> float:
    """Requests the replica finished (its sglang:num_requests_total, every label set)."""
    answer = requests.get(
        f"http://{address(cluster, host)}:{SERVER_PORT}/metrics",
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=10,
    )
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in answer.text.splitlines()
        if line.startswith("sglang:num_requests_total")
    )


def test_a_disaggregated_fleet_runs_its_router_in_pd_mode(
    cluster, runs, fleet_bench, router_wheelhouse, tmp_path
):
    """sim-a serves prefill and sim-b decode (SGLang's --disaggregation-mode, the inventory's
    kimi_prefill_*/kimi_decode_* groups saying so): rt's router restarts in PD mode, sends each
    request to both, and the decode server's answer comes back."""
    from tests.support.ansible_run import run_playbook
    from tests.support.fleet import add_fleet, add_group, inventory_copy

    backend = ("--disaggregation-mode", "{}", "--disaggregation-transfer-backend", "mooncake")
    prefill = (*backend, "--disaggregation-bootstrap-port", "8998")
    for host, flags in (("sim-a", prefill), ("sim-b", backend)):
        stop_replica(cluster, host)
        mode = "prefill" if host == "sim-a" else "decode"
        start_replica(cluster, host, flags=tuple(f.format(mode) for f in flags))
    inventory = inventory_copy(cluster, tmp_path)
    tree = yaml.safe_load(inventory.read_text())
    del tree["all"]["children"][FLEET]
    inventory.write_text(yaml.safe_dump(tree, sort_keys=False))
    add_fleet(inventory, "kimi_router_pd", ["sim-a", "sim-b"], ROUTER)
    add_group(inventory, "kimi_prefill_pd", ["sim-a"])
    add_group(inventory, "kimi_decode_pd", ["sim-b"])
    (tmp_path / "runner").mkdir()
    pd = run_playbook(
        "playbooks/router.yml",
        inventory,
        tmp_path / "runner",
        extravars=router_vars(router_wheelhouse, tmp_path / "cache"),
    )
    assert pd.rc == 0, pd.stdout[-6000:]
    launch = json.loads(cluster.ssh(ROUTER, "cat /var/lib/kimi/router/launch.json").stdout)
    urls = {host: f"http://{address(cluster, host)}:{SERVER_PORT}" for host in ("sim-a", "sim-b")}
    argv = " ".join(launch["argv"])
    assert f"--pd-disaggregation --prefill {urls['sim-a']} 8998 --decode {urls['sim-b']}" in argv
    auth = {"Authorization": f"Bearer {KEY}"}
    workers = requests.get(f"{router_url(cluster)}/workers", headers=auth, timeout=10).json()
    assert {(w["url"], w["worker_type"]) for w in workers["workers"]} == {
        (urls["sim-a"], "prefill"),
        (urls["sim-b"], "decode"),
    }
    before = {host: served(cluster, host) for host in urls}
    body = {"text": "Say hi.", "sampling_params": {"max_new_tokens": 8}}
    for _ in range(5):
        answer = requests.post(
            f"{router_url(cluster)}/generate", json=body, headers=auth, timeout=30
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["meta_info"]["completion_tokens"] == 8  # the decode server's
    assert {host: served(cluster, host) - before[host] for host in urls} == {
        "sim-a": 5,
        "sim-b": 5,
    }
