"""A replica out of its router around a restart, without hosts (module_utils/router/rotation.py):
the router's worker API as sglang-router 0.3.2 answers it (read on the real router), played by
fakes, hostile answers included."""

from __future__ import annotations

import json
import random

import pytest
from ansible.module_utils.host.in_process import TaskError
from ansible.module_utils.router import probe, rotation

ROUTER = "http://127.0.0.1:30080"
REPLICA = "http://10.0.0.2:30000"
OTHER = "http://10.0.0.3:30000"


def params(**more) -> dict:
    return {"url": ROUTER, "replica_url": REPLICA, "api_key": "k", "timeout": 5.0, **more}


class Router:
    """sglang-router's worker list and a replica's /metrics, with a clock that moves on sleep."""

    def __init__(self, listed=(REPLICA, OTHER), running=(0,), answers=True, delete=202):
        self.workers = {url: {"id": f"id-{i}", "healthy": True} for i, url in enumerate(listed)}
        self.running = list(running)
        self.answers, self.delete_status = answers, delete
        self.now, self.calls = 0.0, []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds

    def body(self) -> bytes:
        return json.dumps(
            {
                "workers": [
                    {"id": w["id"], "url": url, "is_healthy": w["healthy"]}
                    for url, w in self.workers.items()
                ]
            }
        ).encode()

    def fetch(self, url, api_key, timeout):
        self.calls.append(("GET", url))
        if not self.answers:
            return None, b"", "Connection refused"
        if url == ROUTER + "/workers":
            return 200, self.body(), ""
        if url == REPLICA + "/metrics":
            held = self.running.pop(0) if len(self.running) > 1 else self.running[0]
            text = f'sglang:num_running_reqs{{model_name="k"}} {held}\nsglang:num_queue_reqs 0\n'
            return 200, text.encode(), ""
        return 404, b"", "HTTP 404"

    def send(self, method, url, api_key, timeout, body=None):
        self.calls.append((method, url, body))
        if method == "DELETE":
            ident = url.rsplit("/", 1)[1]
            for worker_url, worker in list(self.workers.items()):
                if worker["id"] == ident and self.delete_status == 202:
                    del self.workers[worker_url]
            return self.delete_status, b"", ""
        self.workers[body["url"]] = {"id": "id-new", "healthy": True}
        return 202, b"", ""

    def drain(self, **more):
        return rotation.drain(params(**more), self.fetch, self.send, self.clock, self.sleep)

    def put_back(self, **more):
        return rotation.put_back(params(**more), self.fetch, self.send, self.clock, self.sleep)


def test_a_listed_replica_is_taken_out_and_its_requests_finish_first():
    router = Router(running=(2, 1, 0))
    result = router.drain()
    assert result["changed"] and result["drained"] and result["in_flight"] == 0
    assert ("DELETE", ROUTER + "/workers/id-0", None) in router.calls
    assert list(router.workers) == [OTHER]
    assert router.now >= 2 * probe.POLL_S  # waited for two requests to finish


def test_requests_still_held_at_the_deadline_are_said_and_the_restart_goes_on():
    router = Router(running=(3,))
    result = router.drain(timeout=2.0)
    assert result["drained"] and result["in_flight"] == 3 and router.now >= 2.0


@pytest.mark.parametrize(
    ("router", "reason"),
    [
        (Router(answers=False), "Connection refused"),
        (Router(listed=(OTHER,)), "does not list it"),
    ],
)
def test_no_router_or_a_replica_it_does_not_list_is_left_alone(router, reason):
    result = router.drain()
    assert result == {"changed": False, "drained": False, "reason": result["reason"]}
    assert reason in result["reason"]
    assert not [c for c in router.calls if c[0] != "GET"]


def test_a_router_that_refuses_or_keeps_the_replica_fails_with_the_fix():
    with pytest.raises(TaskError, match=r"did not take .* out of its list"):
        Router(delete=500).drain()

    class Sticky(Router):
        def send(self, method, url, api_key, timeout, body=None):
            return 202, b"", ""  # accepted, never done

    with pytest.raises(TaskError, match="still lists"):
        Sticky().drain(timeout=2.0)


def test_a_replica_is_put_back_until_the_router_lists_it_healthy():
    router = Router(listed=(OTHER,))
    assert router.put_back()["changed"]
    posted = [c for c in router.calls if c[0] == "POST"]
    assert posted == [("POST", ROUTER + "/workers", {"url": REPLICA, "api_key": "k"})]
    # Listed already (the router restarted with it meanwhile): no second entry.
    again = Router()
    assert again.put_back()["changed"] and not [c for c in again.calls if c[0] == "POST"]


def test_putting_back_fails_with_the_fix_when_the_router_cannot_take_it():
    with pytest.raises(TaskError, match="does not answer"):
        Router(answers=False).put_back()

    class Unhealthy(Router):
        def send(self, method, url, api_key, timeout, body=None):
            self.workers[body["url"]] = {"id": "id-new", "healthy": False}
            return 202, b"", ""

    with pytest.raises(TaskError, match=r"did not list .* healthy"):
        Unhealthy(listed=(OTHER,)).put_back(timeout=2.0)


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,
        b'{"workers": {"a": 1}}',
        b'{"workers": [{"id": "../../x", "url": "http://10.0.0.2:30000"}]}',
        json.dumps(
            {"workers": [{"id": f"i{n}", "url": f"http://h{n}"} for n in range(5000)]}
        ).encode(),
        b"\xff" * 64,
    ],
)
def test_a_hostile_workers_answer_takes_nothing_out(body):
    router = Router()
    router.fetch = lambda url, key, timeout: (200, body, "")
    result = router.drain()
    assert not [c for c in router.calls if c[0] == "DELETE"], result
    assert result["drained"] is False


def test_hostile_metrics_never_raise_and_never_count_below_zero():
    rng = random.Random(3)
    for _ in range(2000):
        text = bytes(rng.randrange(256) for _ in range(rng.randrange(120)))
        if rng.random() < 0.5:
            text = b"sglang:num_running_reqs " + str(rng.uniform(-1e12, 1e12)).encode() + text
        held = rotation.in_flight(REPLICA, "", 1.0, lambda *_a, t=text: (200, t, ""))
        assert held is None or held >= 0


def test_check_mode_and_bad_urls_are_named():
    with pytest.raises(TaskError, match="needs the replica's http"):
        probe.act({**params(phase="drain", replica_url="file:///x"), "replicas": []}, False)
    assert probe.act({**params(phase="return"), "replicas": []}, True)["skipped"] == "check mode"
