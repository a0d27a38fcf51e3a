"""A level sent through SGLang's router: what each replica behind it did meanwhile.

sglang-router 0.3.2 has no /server_info or /metrics of its own on its serving port (both
404, measured on the real router), and its Prometheus endpoint counts requests per worker
(`smg_worker_cb_outcomes_total{worker=URL,outcome=success|failure}`, its circuit breaker's
outcomes) but no tokens. So a fleet level reads, before and after it: each replica's own
/metrics (requests finished, prompt and generated tokens: the same counters as a level's
server delta) and the router's per-worker outcomes. The first replica's /server_info stands
in for the router's (what the prompts are rendered for, and the provenance).

Runs on the host that drives the benchmark; every answer is bounded as client_target's are.
"""

from __future__ import annotations

import re
import urllib.parse

from ansible.module_utils.benchmark.client_target import Target, server_state
from ansible.module_utils.benchmark.stats import server_delta

MAX_WORKERS = 64
WORKER_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
# The router's metrics page: a few kilobytes per worker; far more is not one.
MAX_ROUTER_METRICS = 4 << 20
ROUTER_OUTCOME = re.compile(
    r'^smg_worker_cb_outcomes_total\{worker="([^"]{1,512})",outcome="(success|failure)"\} '
    r"([0-9.eE+]{1,32})$"
)
COUNTERS = {
    "requests": "sglang:num_requests_total",
    "prompt_tokens": "sglang:prompt_tokens_total",
    "generation_tokens": "sglang:generation_tokens_total",
}


def check_fleet(fleet) -> list[str]:
    """What is wrong with the module's `fleet` argument (None: not a fleet level)."""
    if fleet is None:
        return []
    problems = []
    workers = fleet.get("workers")
    if not isinstance(workers, dict) or not 1 <= len(workers) <= MAX_WORKERS:
        return [f"fleet.workers must map 1 to {MAX_WORKERS} replica names to their URLs"]
    for name, url in workers.items():
        if not isinstance(name, str) or not WORKER_NAME.match(name):
            problems.append(f"fleet.workers: {name!r} is not a name of letters, digits and _.-")
        elif not http_url(url):
            problems.append(f"fleet.workers.{name}: {url!r} is not an http(s)://host:port URL")
    metrics = fleet.get("router_metrics_url") or ""
    if metrics and not http_url(metrics):
        problems.append(f"fleet.router_metrics_url: {metrics!r} is not an http(s) URL")
    return problems


def http_url(value) -> bool:
    if not isinstance(value, str) or len(value) > 2048:
        return False
    try:
        parts = urllib.parse.urlsplit(value)
        return parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:
        return False


class Fleet:
    """The replicas behind the router a level is sent to, and the router's metrics."""

    def __init__(self, fleet: dict, api_key: str, secrets=()):
        self.workers = {
            name: Target(url, api_key, secrets) for name, url in sorted(fleet["workers"].items())
        }
        metrics = fleet.get("router_metrics_url") or ""
        # The router's metrics port takes no key (sglang-router serves it open).
        self.router_metrics = Target(metrics, "", secrets) if metrics else None

    def first(self) -> Target:
        return next(iter(self.workers.values()))

    def state(self) -> dict:
        """Each replica's counters and start record, and the router's outcomes per worker."""
        return {
            "workers": {name: server_state(target) for name, target in self.workers.items()},
            "router": router_outcomes(self.router_metrics),
        }

    def record(self, before: dict, after: dict) -> dict:
        """The level file's `fleet`: per replica, what it served over the level."""
        workers = {}
        for name, target in self.workers.items():
            delta = server_delta(before["workers"][name], after["workers"][name])
            counted = {
                key: int(delta["metrics"][metric])
                if metric in delta["metrics"] and not delta["restarted"]
                else None
                for key, metric in COUNTERS.items()
            }
            url = target.shown_url
            routed = outcome_delta(before["router"], after["router"], url)
            workers[name] = {
                "url": url,
                **counted,
                "router_requests": routed["success"],
                "router_failures": routed["failure"],
                "restarted": delta["restarted"],
            }
        errors = [after["router"].get("error"), before["router"].get("error")]
        return {
            "workers": workers,
            "router_metrics": next((e for e in errors if e), None) or "read",
            "balance": balance([w["requests"] for w in workers.values()]),
        }


def router_outcomes(target: Target | None) -> dict:
    """{"outcomes": {worker URL: {success, failure}}} from the router's Prometheus page, or
    {"error": why} (never raised: a level is not lost to its metrics)."""
    if target is None:
        return {"error": "no router metrics URL given"}
    try:
        status, body = target.get("", timeout=15, limit=MAX_ROUTER_METRICS)
    except (OSError, ValueError) as error:
        return {"error": target.mask(str(error))[:300]}
    if status != 200:
        return {"error": f"HTTP {status}"}
    outcomes: dict[str, dict[str, int]] = {}
    for line in body.decode("utf-8", "replace").splitlines():
        found = ROUTER_OUTCOME.match(line)
        if not found:
            continue
        try:
            count = int(float(found[3]))
        except (ValueError, OverflowError):
            continue
        url = found[1].rstrip("/")
        if len(outcomes) < MAX_WORKERS * 4 or url in outcomes:
            outcomes.setdefault(url, {"success": 0, "failure": 0})[found[2]] = count
    return {"outcomes": outcomes}


def outcome_delta(before: dict, after: dict, url: str) -> dict:
    """The router's outcomes for one worker over the level; None where it could not say."""
    if "outcomes" not in before or "outcomes" not in after:
        return {"success": None, "failure": None}
    old = before["outcomes"].get(url, {"success": 0, "failure": 0})
    new = after["outcomes"].get(url, {"success": 0, "failure": 0})
    delta = {key: new[key] - old[key] for key in ("success", "failure")}
    # A counter that went down: the router restarted; its counts say nothing of this level.
    return delta if min(delta.values()) >= 0 else {"success": None, "failure": None}


def balance(requests: list) -> dict:
    """How evenly the replicas were loaded: the least and most loaded replica's requests and
    their ratio (1 is even; 0 is a replica that got none)."""
    counted = [r for r in requests if isinstance(r, int)]
    if len(counted) != len(requests) or not counted or max(counted) <= 0:
        return {"min_requests": None, "max_requests": None, "min_over_max": None}
    low, high = min(counted), max(counted)
    return {"min_requests": low, "max_requests": high, "min_over_max": round(low / high, 4)}
