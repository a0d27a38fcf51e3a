"""A replica taken out of its fleet's router before its server restarts, and put back after
(the server role's start.yml, on the router host through library/router_check.py).

sglang-router 0.3.2's worker API, read on the real router: GET /workers lists {id, url,
is_healthy}; DELETE /workers/{id} and POST /workers {"url", "api_key"} answer 202 and take
effect in the background, so each is followed by polling the list. A replica out of the list
gets no new request; the ones it holds finish before the restart (its own
sglang:num_running_reqs and sglang:num_queue_reqs reach 0), within the drain's deadline.
Everything answered is untrusted, as in probe.py."""

from __future__ import annotations

import re
import time
import urllib.parse

from ansible.module_utils.benchmark.stats import parse_metrics
from ansible.module_utils.host.in_process import TaskError
from ansible.module_utils.router.probe import (
    POLL_S,
    call,
    get,
    router_workers,
    worker_entries,
)

WORKER_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
# What a replica runs and queues now (its /metrics), summed over label sets as the benchmark
# reads the server's counters (module_utils/benchmark/stats.py parse_metrics).
IN_FLIGHT = ("sglang:num_running_reqs", "sglang:num_queue_reqs")


def worker_ids(body: bytes) -> dict[str, str]:
    """url -> id from GET /workers's answer; ValueError when it is not that shape."""
    out = {}
    for worker in worker_entries(body):
        ident = worker.get("id")
        if isinstance(ident, str) and WORKER_ID.match(ident):
            out[worker["url"]] = ident
    return out


def listed(router: str, api_key: str, timeout: float, fetch) -> tuple[dict | None, str]:
    """({url: id}, "") of the router's workers, or (None, why)."""
    status, body, error = fetch(router + "/workers", api_key, timeout)
    if status != 200:
        return None, f"GET /workers answered {error or status}"
    try:
        return worker_ids(body), ""
    except ValueError as problem:
        return None, f"GET /workers answered something else ({problem})"


def in_flight(replica: str, api_key: str, timeout: float, fetch) -> int | None:
    """Requests the replica runs or queues now (its /metrics), None when it does not say."""
    status, body, _error = fetch(replica + "/metrics", api_key, timeout)
    if status != 200:
        return None
    totals = parse_metrics(body.decode("utf-8", "replace"), IN_FLIGHT)
    return int(sum(c for c in totals.values() if 0 <= c < 1e9)) if totals else None


def drain(p: dict, fetch=get, send=call, clock=time.monotonic, sleep=time.sleep) -> dict:
    """Out of the router's list, then until the replica's requests are done or the deadline.
    A router that does not answer (not deployed yet) or does not list the replica: nothing to
    take out, unchanged."""
    router, replica, key = p["url"].rstrip("/"), p["replica_url"].rstrip("/"), p["api_key"]
    step = min(p["timeout"], 10.0)
    started = clock()
    deadline = started + max(p["timeout"], 0.0)
    workers, why = listed(router, key, step, fetch)
    if workers is None or replica not in workers:
        reason = why or "the router does not list it"
        return {"changed": False, "drained": False, "reason": reason}
    status, _body, error = send(
        "DELETE", f"{router}/workers/{urllib.parse.quote(workers[replica], safe='')}", key, step
    )
    if status not in (200, 202, 204):
        raise TaskError(
            f"The router at {router} did not take {replica} out of its list (DELETE /workers: "
            f"{error or status}). Needed: the replica out before its server restarts. Fix: "
            "check the router (systemctl status kimi-router or its log), or deploy with "
            "-e server_router_rotation=false to restart without it."
        )
    while replica in (listed(router, key, step, fetch)[0] or {replica: ""}):
        if clock() >= deadline:
            raise TaskError(
                f"The router at {router} still lists {replica} {p['timeout']:g} s after it was "
                "asked to take it out. Fix: check the router's log; rerun the deploy."
            )
        sleep(POLL_S)
    while True:
        held = in_flight(replica, key, step, fetch)
        if not held or clock() >= deadline:
            break
        sleep(POLL_S)
    return {
        "changed": True,
        "drained": True,
        # Requests the replica still held when the deadline came (the restart ends them).
        "in_flight": held or 0,
        "seconds": round(clock() - started, 2),
    }


def put_back(p: dict, fetch=get, send=call, clock=time.monotonic, sleep=time.sleep) -> dict:
    """Into the router's list again, until the router lists it healthy."""
    router, replica, key = p["url"].rstrip("/"), p["replica_url"].rstrip("/"), p["api_key"]
    step = min(p["timeout"], 10.0)
    started = clock()
    deadline = started + max(p["timeout"], 0.0)
    workers, why = listed(router, key, step, fetch)
    if workers is None:
        raise TaskError(
            f"The router at {router} does not answer ({why}), so {replica} is not back in its "
            "list. Fix: run the router stage (deploy_kimi.yml --tags router), which starts "
            "the router with every healthy replica."
        )
    if replica not in workers:
        body = {"url": replica, **({"api_key": key} if key else {})}
        status, _body, error = send("POST", router + "/workers", key, step, body)
        if status not in (200, 201, 202):
            raise TaskError(
                f"The router at {router} did not take {replica} back (POST /workers: "
                f"{error or status}). Fix: run the router stage (--tags router)."
            )
    while True:
        status, body, _error = fetch(router + "/workers", key, step)
        try:
            healthy = router_workers(body).get(replica) if status == 200 else None
        except ValueError:
            healthy = None
        if healthy:
            return {"changed": True, "seconds": round(clock() - started, 2)}
        if clock() >= deadline:
            raise TaskError(
                f"The router at {router} did not list {replica} healthy within "
                f"{p['timeout']:g} s of taking it back. Fix: check the router's log and the "
                "replica's /health; run the router stage (--tags router) to start it anew."
            )
        sleep(POLL_S)
