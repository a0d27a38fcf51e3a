"""Polls of a starting SGLang server, as library/server_health.py does them: the process as
its manager sees it, the log's tail, and what /health_generate answers, judged into a state
(loading, answering, healthy, failed) with a progress line for the until loop; wait() polls
until the state changes or its window ends.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request

from ansible.module_utils.host.secret_scrub import Scrubber
from ansible.module_utils.server.control import file_tail, supervisor_status, systemd_status

# SGLang's /health_generate waits up to SGLANG_HEALTH_CHECK_TIMEOUT (20 s by default) for
# its one-token generation: the probe must outlast it to hear the answer.
PROBE_TIMEOUT_S = 30


def probe(url: str, api_key: str) -> tuple[int | None, str, bool]:
    """(HTTP status or None, what went wrong, whether the server took the request)."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"url must be http(s): {url}")
    request = urllib.request.Request(url.rstrip("/") + "/health_generate")  # noqa: S310
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        # http(s) only, checked above.
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S) as response:  # noqa: S310
            return response.status, "", True
    except urllib.error.HTTPError as error:
        return error.code, f"HTTP {error.code}", True
    except urllib.error.URLError as error:  # not connected, or the request not sent
        return None, str(error.reason), False
    except TimeoutError:  # sent, and no answer came
        return None, f"no answer within {PROBE_TIMEOUT_S} s", True
    except OSError as error:  # the connection broke while waiting for the answer
        return None, str(error), False


def poll(params: dict, run) -> dict:
    """The module's whole poll: exit_json's keys. `run` runs the manager's commands under the
    poll's deadline (CommandFailed, passed on, when one hangs)."""
    p = params
    status, tail = process_and_log(p, run)
    now = time.time()
    elapsed = round(now - p["since"], 1) if p["since"] else 0.0
    message = process_problem(p, status)
    code = None
    if message:
        state, progress = "failed", message
    else:
        last = next((line for line in reversed(tail) if line.strip()), "(no log yet)")
        code, error, answered = probe(p["url"], p["api_key"])
        state, progress, message = judge_answer(p, elapsed, last, code, error, answered)
    return {
        "changed": False,
        "state": state,
        "message": message,
        "progress": progress,
        "log_tail": tail,
        "elapsed": elapsed,
        "checked_at": round(now, 3),
        "http_status": code,
    }


# What each phase waits out: a poll in any other state ends the wait.
WAITING = {"load": "loading", "generate": "answering"}


def wait(params: dict, run, clock=time.monotonic, sleep=time.sleep) -> dict:
    """Polls every poll_s until the phase's waiting state ends or wait_s has passed, and
    returns the last poll: one module run stands for many of the until loop's retries (each
    retry is a module run on the host). wait_s 0 is one poll."""
    deadline = clock() + params.get("wait_s", 0)
    while True:
        result = poll(params, run)
        if result["state"] != WAITING[params["phase"]]:
            return result
        if clock() + params.get("poll_s", 1) >= deadline:
            return result
        sleep(params.get("poll_s", 1))


def process_and_log(p: dict, run) -> tuple[dict, list[str]]:
    """The server process's status from its manager, and the log's last lines, scrubbed."""
    if p["manager"] == "systemd":
        status = systemd_status(run, p["name"])
    else:
        status = supervisor_status(p["pid_file"], p["state_file"])
    # SGLang logs its resolved arguments, the API key among them; the file keeps the lines
    # of earlier launches too, whose key no_log would not know.
    scrub = Scrubber([p["api_key"]])
    return status, [scrub(line) for line in file_tail(p["log_file"], p["log_lines"])]


def process_problem(p: dict, status: dict) -> str:
    """Why the process itself failed (stopped, or restarted since the launch); empty if not."""
    if not status["running"] or status["failed"]:
        return (
            f"the server is not running (manager {p['manager']}: {status['status']}, "
            f"last exit status {status['last_exit']})"
        )
    if status["restarts"] > p["restarts_before"]:
        return (
            f"the server crashed while starting and was restarted "
            f"{status['restarts'] - p['restarts_before']} time(s)"
        )
    return ""


def judge_answer(
    p: dict, elapsed: float, last: str, code: int | None, error: str, answered: bool
) -> tuple[str, str, str]:
    """(state, progress, message) from /health_generate's answer `elapsed` seconds in; `last`
    is the log's last line."""
    answer = error or f"HTTP {code}"
    if code == 200:
        return "healthy", f"healthy after {elapsed:.0f} s", ""
    if not answered:
        limit = f" of {p['timeout']} s" if p["timeout"] else ""
        progress = f"loading: {elapsed:.0f} s{limit}, /health_generate {answer}; log: {last[-160:]}"
        return "loading", progress, ""
    if p["phase"] == "generate" and elapsed >= p["generate_timeout"]:
        message = (
            f"the model loaded and the server answers HTTP, but it has not generated a "
            f"token in {elapsed:.0f} s: /health_generate answered {answer} every time (SGLang "
            "answers 503 until its warmup request has generated, and when its one-token "
            "health generation gets no output within SGLANG_HEALTH_CHECK_TIMEOUT). Look for "
            "the scheduler's error in the log; raise server_health_generate_timeout_s only "
            "if the first generation is just slow"
        )
        return "failed", message, message
    limit = f" of {p['generate_timeout']} s" if p["phase"] == "generate" else ""
    progress = (
        f"loaded, not generating yet: {elapsed:.0f} s{limit}, /health_generate "
        f"{answer}; log: {last[-160:]}"
    )
    return "answering", progress, ""
