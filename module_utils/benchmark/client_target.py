"""Where the benchmark sends its requests (Target, from base_url), and the bounded server
calls around a level: the counters and start record (server_state), the cache flush.

Runs on the host that drives the benchmark, with the standard library only. Every answer is
read within a deadline and a size, and no string kept holds the API key or the HF token.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request

from ansible.module_utils.benchmark.client_events import number
from ansible.module_utils.benchmark.stats import parse_metrics, startup_record
from ansible.module_utils.host.helpers import MASK
from ansible.module_utils.host.secret_scrub import secret_forms

# The /metrics counters a level's server delta is taken from.
METRICS = (
    "sglang:generation_tokens_total",
    "sglang:prompt_tokens_total",
    "sglang:spec_verify_calls_total",
    "sglang:num_requests_total",
)
# How long to wait for an idle server to flush its cache before a level, and per request.
FLUSH_WAIT_S = 60.0
FLUSH_REQUEST_WAIT_S = 30.0
# Largest /server_info or /metrics answer read, and the deepest JSON kept from the server.
MAX_ANSWER = 8 << 20
MAX_ERROR_ANSWER = 4096
MAX_JSON_DEPTH = 64


def masked(text: str, forms: list[str]) -> str:
    for form in forms:
        if form in text:
            text = text.replace(form, MASK)
    return text


def load_json(body: bytes | str, what: str):
    """JSON from the server; ValueError (naming `what`) for anything that is not, or that
    nests deeper than the level file keeps."""
    try:
        value = json.loads(body)
    except RecursionError:
        raise ValueError(f"{what} nests too deep") from None
    except ValueError as error:
        raise ValueError(f"{what} is not JSON ({error})") from None
    if too_deep(value, MAX_JSON_DEPTH):
        raise ValueError(f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
    return value


def too_deep(value, depth: int) -> bool:
    if depth < 0:
        return True
    if isinstance(value, dict):
        return any(too_deep(item, depth - 1) for item in value.values())
    if isinstance(value, list):
        return any(too_deep(item, depth - 1) for item in value)
    return False


def read_bounded(answer, limit: int, deadline: float, cut: bool = False) -> bytes:
    """At most `limit` bytes of an HTTP answer before `deadline` (time.monotonic): read in
    pieces, each within the socket's timeout. Longer: ValueError, or the first `limit` bytes
    when `cut` (an error body only shown in part)."""
    out = bytearray()
    read = getattr(answer, "read1", None) or answer.read
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError("the answer did not arrive within its deadline")
        piece = read(min(1 << 16, limit + 1 - len(out)))
        if not piece:
            return bytes(out)
        out += piece
        if len(out) > limit:
            if cut:
                return bytes(out[:limit])
            raise ValueError(f"answer longer than {limit} bytes")


class Target:
    """Where and how to send requests, from base_url."""

    def __init__(self, base_url: str, api_key: str, secrets=()):
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be http(s)://host[:port][/path], got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        # What results may show: no user:password@ of a URL that carries one.
        self.shown_url = f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}{parts.path}".rstrip(
            "/"
        )
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.path = parts.path.rstrip("/")
        self.netloc = parts.netloc.rsplit("@", 1)[-1]
        self.api_key = api_key
        # What no string the benchmark keeps may hold: the key, the HF token, their base64.
        self.secrets = secret_forms([api_key, *secrets])

    def mask(self, text: str) -> str:
        return masked(text, self.secrets)

    def request(self, body: dict) -> bytes:
        data = json.dumps(body).encode()
        head = [
            f"POST {self.path}/generate HTTP/1.1",
            f"Host: {self.netloc}",
            "Content-Type: application/json",
            "Accept: text/event-stream",
            f"Content-Length: {len(data)}",
            "Connection: close",
        ]
        if self.api_key:
            head.append(f"Authorization: Bearer {self.api_key}")
        return ("\r\n".join(head) + "\r\n\r\n").encode() + data

    def get(
        self, path: str, timeout: float = 30, method: str = "GET", limit: int = MAX_ANSWER
    ) -> tuple[int, bytes]:
        """(status, body) of one call, all of it within `timeout` seconds (plus one socket
        read); a body over `limit` bytes is a ValueError, an error body is cut to 4 KiB."""
        deadline = time.monotonic() + timeout
        request = urllib.request.Request(self.base_url + path, method=method)  # noqa: S310
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310
                return answer.status, read_bounded(answer, limit, deadline)
        except urllib.error.HTTPError as error:
            with error:
                return error.code, read_bounded(error, MAX_ERROR_ANSWER, deadline, cut=True)


def server_state(target: Target) -> dict:
    """The cumulative counters a level's differences are taken from, and the record of the
    server's start that tells a restart."""
    state: dict = {"metrics": {}, "startup_time": None, "avg_spec_accept_length": None}
    try:
        status, body = target.get("/server_info")
        if status == 200:
            info = load_json(body, "/server_info")
            if not isinstance(info, dict):
                raise ValueError("/server_info is not a JSON object")
            state["startup_time"] = startup_record(info)
            internal = info.get("internal_states")
            internal = internal[0] if isinstance(internal, list) and internal else None
            average = internal.get("avg_spec_accept_length") if isinstance(internal, dict) else None
            state["avg_spec_accept_length"] = average if number(average) else None
        status, body = target.get("/metrics")
        if status == 200:
            state["metrics"] = parse_metrics(body.decode("utf-8", "replace"), METRICS)
    except (OSError, ValueError) as error:
        state["error"] = target.mask(str(error))[:300]
    return state


def flush_cache(target: Target, wait_s: float = FLUSH_WAIT_S) -> str:
    """Empty the server's prefix cache before a level.

    SGLang flushes only when no request is running or waiting (python/sglang/srt/managers/
    scheduler.py flush_cache) and otherwise answers 400 "Flush cache failed."; given
    ?timeout=S it waits up to S seconds for idle (scheduler_components/flush_wrapper.py), and
    a second flush while one waits is refused. So: ask it to wait, retry until `wait_s` is
    spent (a release without the parameter answers at once), and say what happened."""
    deadline = time.monotonic() + wait_s
    last = ""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        wait = min(left, FLUSH_REQUEST_WAIT_S)
        try:
            status, body = target.get(
                f"/flush_cache?timeout={wait:.1f}", timeout=wait + 10, method="POST"
            )
        except (OSError, ValueError) as error:
            status, body = None, str(error).encode()
        if status == 200:
            return "flushed"
        last = f"HTTP {status}: {target.mask(body.decode('utf-8', 'replace'))[:200].strip()}"
        if status in (401, 403, 404, 405):
            break  # asking again will not change the answer
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    return f"not flushed ({last})"
