"""The router stage's logic without hosts: which router fronts which replicas at which URLs
(module_utils/router/fleet.py), what the replicas and the router answer (probe.py, hostile
answers included), the launcher's key handling, and the pins of the router's venv."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.host.in_process import TaskError
from ansible.module_utils.router import fleet, probe

REPO = Path(__file__).resolve().parents[2]
# The fleet settings' defaults, as the playbooks use them (the router's own URL needs its port).
DEFAULTS = dict(fleet.DEFAULTS)


def host(address="10.0.0.1", bind="0.0.0.0", port=30000, **more) -> dict:  # noqa: S104
    return {"ansible_host": address, "kimi_server_settings": {"host": bind, "port": port}, **more}


def inventory(**groups) -> tuple[dict, dict]:
    hostvars = {"rt": {"ansible_host": "10.0.0.9"}}
    found = {"all": ["rt"]}
    for group, members in groups.items():
        found[group] = list(members)
        for name, variables in members.items():
            hostvars[name] = variables
            found["all"].append(name)
    return found, hostvars


def test_each_fleet_goes_to_the_host_it_names_with_its_replicas_urls():
    groups, hostvars = inventory(
        kimi_router_a={
            "g1": host("10.0.0.1", kimi_router_host="rt", kimi_router_policy="round_robin"),
            "g2": host("fd00::2", kimi_router_host="rt", kimi_router_policy="round_robin"),
            "g3": host("10.0.0.3", bind="10.1.0.3", kimi_router_host="rt",
                       kimi_router_policy="round_robin"),
        },
        kimi_router_b={"g4": host("10.0.0.4", bind="127.0.0.1", kimi_router_host="g4")},
    )  # fmt: skip
    found = fleet.fleets(groups, hostvars, DEFAULTS)
    assert found["rt"]["group"] == "kimi_router_a"
    assert [r["url"] for r in found["rt"]["replicas"]] == [
        "http://10.0.0.1:30000",
        "http://[fd00::2]:30000",
        "http://10.1.0.3:30000",
    ]
    settings = found["rt"]["settings"]
    assert settings == {**DEFAULTS, "kimi_router_host": "rt", "kimi_router_policy": "round_robin"}
    assert found["rt"]["router_url"] == "http://127.0.0.1:30080"
    # A replica on loopback serves only a router on its own host.
    assert found["g4"]["replicas"] == [
        {"host": "g4", "url": "http://127.0.0.1:30000", "mode": "", "bootstrap_port": None}
    ]
    assert found["g4"]["settings"]["kimi_router_policy"] == "cache_aware"


@pytest.mark.parametrize(
    ("groups", "needle"),
    [
        ({"kimi_router_a": {"g1": host()}}, "set kimi_router_host under the group's vars"),
        ({"kimi_router_a": {"g1": host(kimi_router_host="nowhere")}}, "not in the inventory"),
        ({"kimi_router_a": {"g1": host(bind="127.0.0.1", kimi_router_host="rt")}},
         "serves on 127.0.0.1 only"),
        ({"kimi_router_a": {"g1": host(address="127.0.0.1", kimi_router_host="rt")}},
         "set ansible_host to the replica's address"),
        ({"kimi_router_a": {"g1": host(port=0, kimi_router_host="rt")}}, "a port 1 to 65535"),
        ({"kimi_router_a": {"g1": host(port=True, kimi_router_host="rt")}}, "a port 1 to 65535"),
        ({"kimi_router_a": {"g1": {"kimi_router_host": "rt"}}}, "is it a serving host"),
        ({"kimi_router_a": {"g1": host(kimi_router_host="rt")},
          "kimi_router_b": {"g2": host(kimi_router_host="rt")}}, "one router per host"),
        ({"kimi_router_a": {"g1": host(kimi_router_host="rt", kimi_router_policy="random"),
                            "g2": host(kimi_router_host="rt")}},
         "kimi_router_policy differs among kimi_router_a's replicas: g1 'random'"),
        ({"kimi_router_a": {"g1": host(kimi_router_host="rt", kimi_server_api_key="k1"),
                            "g2": host(kimi_router_host="rt", kimi_server_api_key="k2")}},
         "kimi_server_api_key differs among kimi_router_a's replicas. Needed"),
        ({"kimi_router_a-b": {"g1": host(kimi_router_host="rt")}}, "Fix: rename the group"),
        ({"kimi_router_a": {}}, "has no hosts"),
    ],
)  # fmt: skip
def test_a_wrong_fleet_is_refused_with_found_needed_fix(groups, needle):
    found, hostvars = inventory(**groups)
    with pytest.raises(fleet.FleetError) as caught:
        fleet.fleets(found, hostvars, DEFAULTS)
    said = str(caught.value)
    assert needle in said and said.startswith("Found:") and "Needed:" in said and "Fix:" in said
    # The replicas' keys are compared, never shown.
    assert "k1" not in said and "k2" not in said


def test_no_router_group_is_no_fleet():
    found, hostvars = inventory(gpu_hosts={"g1": host()})
    assert fleet.fleets(found, hostvars, DEFAULTS) == {}


def answers(table: dict):
    def fetch(url, api_key, timeout):
        assert timeout <= 10
        answer = table[url]
        return answer(api_key) if callable(answer) else answer

    return fetch


def test_replicas_that_do_not_answer_200_are_left_out_with_why():
    def needs_key(key):
        return (200, b"", "") if key == "k" else (401, b"", "HTTP 401")

    fetch = answers(
        {
            "http://a:1/health": (200, b"", ""),
            "http://b:1/health": (None, b"", "Connection refused"),
            "http://c:1/health": needs_key,
        }
    )
    replicas = [{"host": h, "url": f"http://{h}:1"} for h in "abc"]
    replicas.append({"host": "d", "url": "file:///etc/passwd"})
    found = probe.replica_health(replicas, "k", 5, fetch)
    assert [r["host"] for r in found["healthy"]] == ["a", "c"]
    assert found["left_out"] == [
        {"host": "b", "url": "http://b:1", "reason": "/health: Connection refused"},
        {"host": "d", "url": "file:///etc/passwd", "reason": "not an http(s) URL"},
    ]


def workers_body(*pairs) -> bytes:
    return json.dumps({"workers": [{"url": u, "is_healthy": h} for u, h in pairs]}).encode()


def test_the_wait_ends_when_the_router_lists_every_replica_healthy(tmp_path):
    a, b = ("http://a:1", True), ("http://b:1", True)
    polls = iter([workers_body(a), workers_body(a, b)])
    fetch = answers(
        {
            "http://r:9/readiness": (200, b"", ""),
            "http://r:9/workers": lambda key: (200, next(polls), ""),
        }
    )
    params = {"url": "http://r:9", "replicas": [{"url": "http://a:1"}, {"url": "http://b:1"}],
              "api_key": "k", "timeout": 30.0, "log_file": "", "log_lines": 5}  # fmt: skip
    clock = iter(range(100))
    done = probe.wait_router(params, fetch, clock=lambda: next(clock), sleep=lambda s: None)
    assert done["workers"] == [
        {"url": "http://a:1", "healthy": True},
        {"url": "http://b:1", "healthy": True},
    ]


@pytest.mark.parametrize(
    "body",
    [b"", b"null", b"[]", b'{"workers": 3}', b'{"workers": [3]}', b'{"workers": [{"url": 1}]}',
     b"{" * 100, b"[" * 200000, json.dumps({"workers": [{"url": "x"}] * 2000}).encode(),
     b"\xff\xfe"],
)  # fmt: skip
def test_a_hostile_workers_answer_is_a_named_failure_with_the_log_scrubbed(tmp_path, body):
    log = tmp_path / "router.log"
    log.write_text("starting --api-key s3cret-key\nready\n")
    fetch = answers({"http://r:9/readiness": (200, b"", ""), "http://r:9/workers": (200, body, "")})
    params = {"url": "http://r:9/", "replicas": [{"url": "http://a:1"}], "api_key": "s3cret-key",
              "timeout": 2.0, "log_file": str(log), "log_lines": 5}  # fmt: skip
    clock = iter(range(100))
    with pytest.raises(TaskError) as caught:
        probe.wait_router(params, fetch, clock=lambda: next(clock), sleep=lambda s: None)
    said = str(caught.value)
    assert said.startswith("The router at http://r:9 was not ready within 2 s: GET /workers")
    assert "s3cret-key" not in said and "ready" in said


def test_router_workers_survives_random_bytes():
    rng = random.Random(36)
    for _ in range(2000):
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
        try:
            found = probe.router_workers(body)
        except ValueError:
            continue
        assert isinstance(found, dict)


def test_the_router_venv_is_pinned_as_in_the_lock_and_the_role_says_its_version():
    def pins(path: Path) -> dict[str, str]:
        found = {}
        for line in path.read_text().splitlines():
            match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ ;\\]+)", line)
            if match:
                found[match.group(1).lower().replace("_", "-")] = match.group(2)
        return found

    host_pins = pins(REPO / "roles/router/files/requirements-host.txt")
    lock = {**pins(REPO / "requirements.lock"), **pins(REPO / "requirements-dev.lock")}
    assert {name: lock.get(name) for name in host_pins} == host_pins
    defaults = yaml.safe_load((REPO / "roles/router/defaults/main.yml").read_text())
    assert host_pins["sglang-router"] == defaults["router_version"]


def test_the_launcher_takes_the_key_from_its_file_only(tmp_path):
    launcher = REPO / "roles/router/files/kimi_router_launch.py"
    refused = subprocess.run(
        [sys.executable, str(launcher), "-", "--api-key", "x"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "comes from SECRETS_FILE" in refused.stderr
    secrets = tmp_path / "secrets.json"
    secrets.write_text(json.dumps({"api_key": 7}))
    bad = subprocess.run(
        [sys.executable, str(launcher), str(secrets), "--port", "1"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert bad.returncode != 0 and "is not text" in bad.stderr


def side(mode: str, address: str, port=8998) -> dict:
    """A replica of a disaggregated fleet: its settings' disaggregation, as group_vars set it."""
    replica = host(address, kimi_router_host="rt")
    replica["kimi_server_settings"]["disaggregation"] = {"mode": mode, "bootstrap_port": port}
    return replica


def test_a_disaggregated_fleet_gets_a_router_in_pd_mode():
    groups, hostvars = inventory(
        kimi_router_pd={"p1": side("prefill", "10.0.0.1"), "d1": side("decode", "10.0.0.2")}
    )
    replicas = fleet.fleets(groups, hostvars, DEFAULTS)["rt"]["replicas"]
    assert [(r["host"], r["mode"], r["bootstrap_port"]) for r in replicas] == [
        ("p1", "prefill", 8998),
        ("d1", "decode", None),
    ]
    assert fleet.worker_args(replicas) == [
        "--pd-disaggregation",
        "--prefill",
        "http://10.0.0.1:30000",
        "8998",
        "--decode",
        "http://10.0.0.2:30000",
    ]
    plain = [{"host": "a", "url": "http://a:1", "mode": ""}, {"host": "b", "url": "http://b:1"}]
    assert fleet.worker_args(plain) == ["--worker-urls", "http://a:1", "http://b:1"]


@pytest.mark.parametrize(
    ("members", "extra", "needle"),
    [
        ({"p1": side("prefill", "10.0.0.1")}, {}, "at least one of each"),
        ({"p1": side("prefill", "10.0.0.1"), "g2": host("10.0.0.2", kimi_router_host="rt")},
         {}, "g2 both"),
        ({"p1": side("prefill", "10.0.0.1", port=0), "d1": side("decode", "10.0.0.2")},
         {}, "bootstrap port 0"),
        ({"p1": side("prefill", "10.0.0.1"), "d1": side("decode", "10.0.0.2")},
         {"kimi_prefill_x": ["d1"], "kimi_decode_y": ["d1"]}, "not both"),
    ],
)  # fmt: skip
def test_a_wrong_disaggregated_fleet_is_refused(members, extra, needle):
    groups, hostvars = inventory(kimi_router_pd=members)
    with pytest.raises(fleet.FleetError, match=re.escape(needle)):
        fleet.fleets({**groups, **extra}, hostvars, DEFAULTS)


def test_a_disaggregated_fleet_without_a_prefill_answering_stops_the_stage():
    replicas = [
        {"host": "p1", "url": "http://p1:1", "mode": "prefill", "bootstrap_port": 8998},
        {"host": "d1", "url": "http://d1:1", "mode": "decode"},
    ]

    def fetch(url, api_key, timeout):
        return (200, b"", "") if url.startswith("http://d1") else (None, b"", "refused")

    with pytest.raises(TaskError, match="No prefill server of the fleet answered"):
        probe.replica_health(replicas, "", 1.0, fetch)
    answered = probe.replica_health(replicas, "", 1.0, lambda *a: (200, b"", ""))
    assert answered["worker_args"][:2] == ["--pd-disaggregation", "--prefill"]
