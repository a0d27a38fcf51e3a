"""Benchmarking a fleet through SGLang's router without hosts: what is measured in which order
(module_utils/router/fleet.py benchmark_targets), what a level records of each replica
(module_utils/benchmark/fleet.py, hostile router pages included), the level schema's `fleet`,
and the report's scaling efficiency and balance (analysis/fleet.py)."""

from __future__ import annotations

import copy
import json
import random

import pytest
from ansible.module_utils.benchmark import fleet
from ansible.module_utils.router.fleet import FleetError, benchmark_targets, fleets, local_url

from analysis import fleet as fleet_report
from analysis.results import load
from tests.support.results_tree import Plan, level_document, level_problems, write_json, write_run

REPLICA = {"kimi_server_settings": {"host": "0.0.0.0", "port": 30000}}  # noqa: S104
HOSTVARS = {
    "rt": {},
    "a1": {"ansible_host": "10.0.0.1", "kimi_router_host": "rt", **REPLICA},
    "a2": {"ansible_host": "10.0.0.2", "kimi_router_host": "rt", **REPLICA},
}
FLEET = fleets({"all": ["rt", "a1", "a2"], "kimi_router_a": ["a1", "a2"]}, HOSTVARS)["rt"]


def test_each_replica_alone_comes_first_then_the_router_at_the_same_load_per_replica():
    targets = benchmark_targets(FLEET, [1, 4], [2.5])
    assert [t["name"] for t in targets] == ["a1", "a2", "kimi_router_a"]
    assert targets[0] == {
        "name": "a1",
        "url": "http://10.0.0.1:30000",
        "concurrency": [1, 4],
        "request_rates": [2.5],
        "fleet": None,
    }
    router = targets[2]
    assert router["url"] == "http://127.0.0.1:30080" and router["concurrency"] == [2, 8]
    assert router["request_rates"] == [5.0]
    assert router["fleet"] == {
        "workers": {"a1": "http://10.0.0.1:30000", "a2": "http://10.0.0.2:30000"},
        "router_metrics_url": "http://127.0.0.1:29000/metrics",
    }
    assert local_url("fd00::9", 30080) == "http://[fd00::9]:30080"
    assert local_url("::", 29000) == "http://127.0.0.1:29000"
    assert local_url("10.0.0.9", 1) == "http://10.0.0.9:1"
    with pytest.raises(FleetError, match="the router's port must be 1-65535"):
        local_url("::", 0, "the router")
    with pytest.raises(FleetError, match="not a name or an address"):
        local_url("evil/path?x=", 1)


@pytest.mark.parametrize("levels", [[], [0], [2, -1]])
def test_a_level_below_one_request_per_replica_is_refused(levels):
    with pytest.raises(FleetError, match="benchmark_concurrency"):
        benchmark_targets(FLEET, levels)


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        ({"workers": {}}, "1 to 64"),
        ({"workers": {f"h{i}": "http://h:1" for i in range(65)}}, "1 to 64"),
        ({"workers": ["http://h:1"]}, "1 to 64"),
        ({"workers": {"a b": "http://h:1"}}, "letters, digits"),
        ({"workers": {"a": "ftp://h:1"}}, "not an http"),
        ({"workers": {"a": "http://"}}, "not an http"),
        ({"workers": {"a": 7}}, "not an http"),
        ({"workers": {"a": "http://h:1"}, "router_metrics_url": "file:///etc/passwd"}, "metrics"),
    ],
)
def test_a_bad_fleet_argument_is_named(given, needle):
    problems = fleet.check_fleet(given)
    assert problems and needle in "; ".join(problems)


def test_no_fleet_and_a_good_fleet_have_no_problem():
    assert fleet.check_fleet(None) == []
    assert fleet.check_fleet(benchmark_targets(FLEET, [1])[2]["fleet"]) == []


class Page:
    """A router metrics endpoint that answers `body` (a Target's get and mask)."""

    def __init__(self, body: bytes, status: int = 200):
        self.body, self.status = body, status

    def get(self, path, timeout=30, method="GET", limit=0):
        if limit and len(self.body) > limit:
            raise ValueError(f"answer longer than {limit} bytes")
        return self.status, self.body

    def mask(self, text):
        return text


OUTCOMES = (
    b'smg_worker_cb_outcomes_total{worker="http://10.0.0.1:30000",outcome="success"} 7\n'
    b'smg_worker_cb_outcomes_total{worker="http://10.0.0.2:30000",outcome="success"} 5\n'
    b'smg_worker_cb_outcomes_total{worker="http://10.0.0.2:30000",outcome="failure"} 1\n'
    b'smg_worker_health{worker="http://10.0.0.1:30000"} 1\n'
)


def test_the_router_page_gives_each_workers_outcomes():
    assert fleet.router_outcomes(Page(OUTCOMES)) == {
        "outcomes": {
            "http://10.0.0.1:30000": {"success": 7, "failure": 0},
            "http://10.0.0.2:30000": {"success": 5, "failure": 1},
        }
    }
    assert fleet.router_outcomes(Page(b"", 503)) == {"error": "HTTP 503"}
    assert fleet.router_outcomes(None) == {"error": "no router metrics URL given"}


@pytest.mark.parametrize(
    "body",
    [
        b"\xff\xfe" * 1000,
        b'smg_worker_cb_outcomes_total{worker="x",outcome="success"} 1e999999\n',
        b'smg_worker_cb_outcomes_total{worker="' + b"w" * 100_000 + b'",outcome="success"} 1\n',
        "".join(
            f'smg_worker_cb_outcomes_total{{worker="http://h{i}:1",outcome="success"}} {i}\n'
            for i in range(5000)
        ).encode(),
        b"{" * 200_000,
        b"x" * (fleet.MAX_ROUTER_METRICS + 1),
    ],
)
def test_a_hostile_router_page_is_bounded_or_an_error(body):
    found = fleet.router_outcomes(Page(body))
    assert set(found) <= {"outcomes", "error"}
    assert len(found.get("outcomes", {})) <= fleet.MAX_WORKERS * 4


def test_random_router_pages_never_raise():
    rng = random.Random(7)
    for _ in range(2000):
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
        if rng.random() < 0.5:
            body = OUTCOMES[: rng.randrange(len(OUTCOMES))] + body
        fleet.router_outcomes(Page(body))


def state(requests: int, tokens: int, start="s1") -> dict:
    return {
        "metrics": {
            "sglang:num_requests_total": float(requests),
            "sglang:prompt_tokens_total": float(tokens * 2),
            "sglang:generation_tokens_total": float(tokens),
        },
        "startup_time": start,
        "avg_spec_accept_length": None,
    }


def test_a_level_records_what_each_replica_served_and_the_balance():
    group = fleet.Fleet(benchmark_targets(FLEET, [1])[2]["fleet"], "key")
    outcomes = fleet.router_outcomes(Page(OUTCOMES))
    more = fleet.router_outcomes(Page(OUTCOMES.replace(b"} 7", b"} 11").replace(b"} 5", b"} 7")))
    before = {"workers": {"a1": state(10, 100), "a2": state(3, 30)}, "router": outcomes}
    after = {"workers": {"a1": state(14, 180), "a2": state(5, 70)}, "router": more}
    record = group.record(before, after)
    assert record["workers"]["a1"] == {
        "url": "http://10.0.0.1:30000",
        "requests": 4,
        "prompt_tokens": 160,
        "generation_tokens": 80,
        "router_requests": 4,
        "router_failures": 0,
        "restarted": False,
    }
    assert (
        record["workers"]["a2"]["requests"] == 2 and record["workers"]["a2"]["router_requests"] == 2
    )
    assert record["balance"] == {"min_requests": 2, "max_requests": 4, "min_over_max": 0.5}
    assert record["router_metrics"] == "read"


def test_a_replica_that_restarted_or_a_router_that_did_counts_nothing():
    group = fleet.Fleet(benchmark_targets(FLEET, [1])[2]["fleet"], "key")
    outcomes = fleet.router_outcomes(Page(OUTCOMES))
    fewer = fleet.router_outcomes(Page(OUTCOMES.replace(b"} 7", b"} 1")))
    before = {"workers": {"a1": state(10, 100), "a2": state(3, 30)}, "router": outcomes}
    after = {
        "workers": {"a1": state(12, 120, start="s2"), "a2": {"metrics": {}, "startup_time": None}},
        "router": fewer,
    }
    record = group.record(before, after)
    a1, a2 = record["workers"]["a1"], record["workers"]["a2"]
    assert a1["restarted"] and a1["requests"] is None and a1["router_requests"] is None
    assert a2["requests"] is None and a2["router_requests"] == 0
    assert record["balance"]["min_over_max"] is None
    gone = group.record(before, {**after, "router": {"error": "timed out"}})
    assert gone["router_metrics"] == "timed out"


def fleet_block(requests=(2, 2)) -> dict:
    names = ("a1", "a2")
    return {
        "workers": {
            name: {
                "url": f"http://10.0.0.{i + 1}:30000",
                "requests": count,
                "prompt_tokens": 10 * count,
                "generation_tokens": 64 * count,
                "router_requests": count,
                "router_failures": 0,
                "restarted": False,
            }
            for i, (name, count) in enumerate(zip(names, requests, strict=True))
        },
        "router_metrics": "read",
        "balance": fleet.balance(list(requests)),
    }


def test_the_level_schema_takes_a_fleet_and_refuses_a_wrong_one():
    plan = Plan(concurrency=(2,), num_prompts=4)
    document = level_document(plan, "node-a", "ar", "gsm8k", 2)
    assert level_problems({**document, "fleet": fleet_block()}) == []
    for broken in (
        {**fleet_block(), "extra": 1},
        {**fleet_block(), "workers": {}},
        {**fleet_block(), "workers": {"a b": fleet_block()["workers"]["a1"]}},
    ):
        assert level_problems({**document, "fleet": broken})
    negative = copy.deepcopy(fleet_block())
    negative["workers"]["a1"]["requests"] = -1
    assert level_problems({**document, "fleet": negative})


def test_the_report_puts_the_fleet_beside_its_replicas_alone(tmp_path):
    plan = Plan(
        hosts={"a1": "ct200", "a2": "ct200", "kimi_router_a": "ct200"},
        configs={"ar": Plan().configs["ar"]},
        concurrency=(1, 2),
        num_prompts=4,
    )
    root = write_run(tmp_path / "run", plan)
    for concurrency in (1, 2):
        path = root / "kimi_router_a" / "ar" / "gsm8k" / f"c{concurrency}.json"
        document = json.loads(path.read_text())
        write_json(path, {**document, "fleet": fleet_block()})
    rows = {row["concurrency"]: row for row in fleet_report.rows(load(root))}
    paired = rows[2]
    alone = [
        json.loads((root / host / "ar" / "gsm8k" / "c1.json").read_text())["summary"]
        for host in ("a1", "a2")
    ]
    fleet_level = json.loads((root / "kimi_router_a" / "ar" / "gsm8k" / "c2.json").read_text())
    total = sum(s["output_tokens_per_s"] for s in alone)
    assert paired["per_replica_concurrency"] == 1 and paired["missing"] == ""
    assert paired["replicas_output_tokens_per_s"] == pytest.approx(total)
    assert paired["scaling_efficiency"] == pytest.approx(
        fleet_level["summary"]["output_tokens_per_s"] / total, rel=1e-3
    )
    assert paired["requests_per_replica"] == "a1:2 a2:2"
    assert paired["balance_min_over_max"] == 1.0 and paired["router_failures"] == 0
    # Three requests over two replicas is no load per replica: nothing to compare with.
    odd = rows[1]
    assert odd["per_replica_concurrency"] is None and odd["scaling_efficiency"] is None
    assert odd["missing"] == "a1 a2"


def test_a_fleet_lists_only_the_head_of_a_multi_node_server():
    groups = {
        "all": ["rt", "a1", "a2"],
        "kimi_router_a": ["a1", "a2"],
        "kimi_cluster_x": ["a1", "a2"],
    }
    with pytest.raises(FleetError, match=r"only the head of a multi-node server \(a1,"):
        fleets(groups, HOSTVARS)
    assert (
        fleets({**groups, "kimi_router_a": ["a1"]}, HOSTVARS)["rt"]["replicas"][0]["host"] == "a1"
    )


def test_a_disaggregated_fleet_is_measured_through_its_router_only():
    split = {
        **FLEET,
        "replicas": [
            {**FLEET["replicas"][0], "mode": "prefill", "bootstrap_port": 8998},
            {**FLEET["replicas"][1], "mode": "decode", "bootstrap_port": None},
        ],
    }
    [router] = benchmark_targets(split, [1, 4])
    assert router["name"] == "kimi_router_a" and router["concurrency"] == [1, 4]
    assert set(router["fleet"]["workers"]) == {"a1", "a2"}


@pytest.mark.parametrize(
    ("target", "needle"),
    [
        ("fleet", "the inventory has no kimi_router_* group"),
        ("fleets", 'benchmark_target is "fleets"'),
    ],
)
def test_a_fleet_benchmark_without_a_fleet_or_a_wrong_target_stops_before_any_host(target, needle):
    """On the shipped example inventory (no fleet), on the controller: no host is contacted."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            "inventory/ct200",
            "benchmark_kimi.yml",
            "-e",
            f"benchmark_target={target}",
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode != 0 and needle in run.stdout + run.stderr
    assert "ct200-" not in run.stdout.split("PLAY RECAP")[-1]
