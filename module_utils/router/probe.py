"""What the router stage asks over HTTP on the router host (library/router_check.py): each
replica's /health before the router starts (one that fails is left out and named, not the
fleet failed), and, after a (re)start, the router's /readiness and its own list of workers
(GET /workers, sglang-router 0.3.2) until every replica it was given is there and healthy.

Everything the router and the replicas answer is untrusted: bodies are read up to a bound,
every field is type-checked, and each request has a deadline."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from ansible.module_utils.host.in_process import TaskError
from ansible.module_utils.host.secret_scrub import Scrubber
from ansible.module_utils.router.fleet import worker_args
from ansible.module_utils.server.control import file_tail

MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_WORKERS = 1024
POLL_S = 0.5

SPEC = {
    "phase": {
        "type": "str",
        "required": True,
        "choices": ["replicas", "router", "drain", "return"],
    },
    # phase drain and return: the replica, at the URL the router lists it by.
    "replica_url": {"type": "str", "default": ""},
    "replicas": {"type": "list", "elements": "dict", "default": []},
    "url": {"type": "str", "default": ""},
    "api_key": {"type": "str", "default": "", "no_log": True},
    "timeout": {"type": "float", "default": 10.0},
    "log_file": {"type": "str", "default": ""},
    "log_lines": {"type": "int", "default": 40},
}


def get(url: str, api_key: str, timeout: float) -> tuple[int | None, bytes, str]:
    """(HTTP status or None, body up to MAX_BODY_BYTES, what went wrong)."""
    return call("GET", url, api_key, timeout)


def call(
    method: str, url: str, api_key: str, timeout: float, body: dict | None = None
) -> tuple[int | None, bytes, str]:
    """One request within `timeout` seconds, a JSON body where given: as get()."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"url must be http(s): {url}")
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)  # noqa: S310 - http(s) only
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return response.status, response.read(MAX_BODY_BYTES), ""
    except urllib.error.HTTPError as error:
        return error.code, b"", f"HTTP {error.code}"
    except urllib.error.URLError as error:
        return None, b"", str(error.reason)
    except (TimeoutError, OSError) as error:
        return None, b"", str(error) or type(error).__name__


def replica_health(replicas: list, api_key: str, timeout: float, fetch=get) -> dict:
    """Each replica's /health: the healthy ones, and the others with why."""
    healthy, left_out = [], []
    for replica in replicas:
        host, url = str(replica.get("host", "")), str(replica.get("url", ""))
        if not url.startswith(("http://", "https://")):
            left_out.append({"host": host, "url": url, "reason": "not an http(s) URL"})
            continue
        status, _body, error = fetch(url.rstrip("/") + "/health", api_key, timeout)
        side = {k: replica.get(k) for k in ("mode", "bootstrap_port") if replica.get(k)}
        if status == 200:
            healthy.append({"host": host, "url": url, **side})
        else:
            reason = error or f"HTTP {status}"
            left_out.append({"host": host, "url": url, "reason": f"/health: {reason}", **side})
    modes = {replica.get("mode") for replica in replicas} - {None, ""}
    missing = modes - {replica.get("mode") for replica in healthy}
    if missing and healthy:
        # A disaggregated fleet with no prefill (or no decode) server answering serves nothing.
        raise TaskError(
            f"No {' or '.join(sorted(missing))} server of the fleet answered its /health: "
            + "; ".join(f"{r['host']}: {r['reason']}" for r in left_out)
            + ". Needed: at least one prefill and one decode server. Fix: deploy them "
            "(deploy_kimi.yml) and check that this host reaches them."
        )
    return {
        "changed": False,
        "healthy": healthy,
        "left_out": left_out,
        "worker_args": worker_args(healthy) if healthy else [],
    }


def worker_entries(body: bytes) -> list[dict]:
    """The workers of GET /workers's answer, each a dict with a url (cut to 2048 characters);
    ValueError when it is not that shape."""
    try:
        data = json.loads(body)
    except RecursionError:  # 4 MB of brackets
        raise ValueError("nested too deep") from None
    workers = data.get("workers") if isinstance(data, dict) else None
    if not isinstance(workers, list) or len(workers) > MAX_WORKERS:
        raise ValueError("no list of workers")
    for worker in workers:
        if not isinstance(worker, dict) or not isinstance(worker.get("url"), str):
            raise ValueError("a worker without a url")
    return [{**worker, "url": worker["url"][:2048]} for worker in workers]


def router_workers(body: bytes) -> dict[str, bool]:
    """url -> healthy, from GET /workers's answer; ValueError when it is not that shape."""
    return {worker["url"]: worker.get("is_healthy") is True for worker in worker_entries(body)}


def _state(url: str, api_key: str, timeout: float, fetch) -> tuple[bool, dict, str]:
    """(ready, workers, what is missing) of the router once."""
    status, _body, error = fetch(url + "/readiness", "", timeout)
    if status is None:
        return False, {}, f"the router does not answer ({error})"
    status, body, error = fetch(url + "/workers", api_key, timeout)
    if status != 200:
        return False, {}, f"GET /workers answered {error or status}"
    try:
        return True, router_workers(body), ""
    except ValueError as problem:
        return False, {}, f"GET /workers answered something else ({problem})"


def wait_router(p: dict, fetch=get, clock=time.monotonic, sleep=time.sleep) -> dict:
    """Polls the router until every wanted replica is in its list and healthy."""
    url = p["url"].rstrip("/")
    wanted = [str(r.get("url", "")) for r in p["replicas"]]
    started = clock()
    deadline = started + max(p["timeout"], 0.0)
    while True:
        ready, workers, problem = _state(url, p["api_key"], min(p["timeout"], 10.0), fetch)
        missing = [w for w in wanted if not workers.get(w)]
        if ready and not missing:
            return {
                "changed": False,
                "workers": [{"url": w, "healthy": h} for w, h in sorted(workers.items())],
                "seconds": round(clock() - started, 2),
            }
        if clock() >= deadline:
            break
        sleep(POLL_S)
    found = problem or (
        "its workers list lacks or marks unhealthy " + ", ".join(missing)
        if missing
        else "no workers"
    )
    tail = Scrubber([p["api_key"]]).text(
        "\n".join(file_tail(p["log_file"], p["log_lines"])) if p["log_file"] else ""
    )
    raise TaskError(
        f"The router at {url} was not ready within {p['timeout']:g} s: {found}. Needed: every "
        "replica that passed its health check listed and healthy. Fix: what the router's log "
        f"says (below); run the router stage again once the replicas answer.\n{tail}".rstrip(),
        log_tail=tail.splitlines(),
    )


def act(p: dict, check_mode: bool) -> dict:
    if p["phase"] == "replicas":
        return replica_health(p["replicas"], p["api_key"], p["timeout"])
    if not p["url"]:
        raise TaskError(f"router_check phase={p['phase']} needs the router's url")
    if p["phase"] == "router":
        return wait_router(p)
    # Imported here: rotation.py builds on this module.
    from ansible.module_utils.router import rotation

    if not p["replica_url"].startswith(("http://", "https://")):
        raise TaskError(f"router_check phase={p['phase']} needs the replica's http(s) URL")
    if check_mode:
        return {"changed": True, "drained": False, "skipped": "check mode"}
    return rotation.drain(p) if p["phase"] == "drain" else rotation.put_back(p)
