"""The hub's answers about repositories, with deadlines: the logic of library/hub_repo_info.py.

Every call to the hub runs under two bounds. Each request has a connect and read timeout
(huggingface_hub's shared session has none, and model_info passes its own, None by default),
and each call, its retries included, must end by the deadline of the whole query: it runs in a
helper thread that is abandoned when the deadline passes, so a hub that sends a byte now and
then cannot stretch it either. Answers 429 and 5xx are retried with exponential backoff,
Retry-After honoured when it fits before the deadline. What the hub lists is checked before it
is passed on (module_utils/weights/manifest.py check_listing): a path like `../../x` never reaches
the
hosts.
"""

from __future__ import annotations

import functools
import threading
import time

from ansible.module_utils.weights.manifest import BLOB_ID, UnsafeListing, check_listing

try:
    import httpx2
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.utils import _http

    HAS_HUB = True
except ImportError:
    HAS_HUB = False

RETRY_STATUSES = (429, 500, 502, 503, 504)
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0


class HubTimeout(Exception):
    """The hub gave no (complete) answer before the deadline."""


class HubBusy(Exception):
    """The hub kept answering 429 or 5xx, or asked to wait past the deadline."""


class Deadline:
    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def use_request_timeout(seconds: float) -> None:
    """huggingface_hub's shared session, with a connect and read timeout for the calls that
    pass none (auth_check, the tree listing)."""

    def factory():
        client = _http.default_client_factory()
        client.timeout = httpx2.Timeout(seconds)
        return client

    _http.set_client_factory(factory)


def within(call, seconds: float):
    """call() run in a daemon thread, given up (HubTimeout) after `seconds`."""
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = call()
        except BaseException as error:  # handed to the caller's thread
            outcome["error"] = error

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(max(0.0, seconds))
    if worker.is_alive():
        raise HubTimeout(f"no answer within {seconds:.0f} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def retry_after(response) -> float | None:
    """Seconds asked for by a Retry-After header in its delay-seconds form, or None."""
    value = (getattr(response, "headers", None) or {}).get("Retry-After")
    if isinstance(value, str) and value.strip().isdigit():
        return float(value.strip())
    return None


def status_of(error: Exception) -> int | None:
    response = getattr(error, "response", None)
    return getattr(response, "status_code", None) if response is not None else None


def call_hub(call, deadline: Deadline, request_timeout: float, sleep=time.sleep):
    """call(timeout) with retries on 429/5xx, within the deadline; HubTimeout or HubBusy when
    it cannot end in time."""
    backoff = FIRST_BACKOFF_S
    tries = 0
    while True:
        left = deadline.left()
        if left <= 0:
            raise HubTimeout(f"no answer within {deadline.seconds:.0f} s")
        tries += 1
        try:
            return within(functools.partial(call, min(request_timeout, left)), left)
        except HubTimeout:
            raise HubTimeout(f"no answer within {deadline.seconds:.0f} s") from None
        except httpx2.TimeoutException as error:
            raise HubTimeout(
                f"no answer within {min(request_timeout, left):.0f} s ({type(error).__name__})"
            ) from error
        except HfHubHTTPError as error:
            status = status_of(error)
            if status not in RETRY_STATUSES:
                raise
            asked = retry_after(error.response)
            pause = backoff if asked is None else asked
            if pause >= deadline.left():
                after = f", Retry-After {asked:.0f} s" if asked is not None else ""
                raise HubBusy(
                    f"it answered {status} {tries} time(s){after}, past the "
                    f"{deadline.seconds:.0f} s deadline"
                ) from error
            sleep(pause)
            backoff = min(backoff * 2, MAX_BACKOFF_S)


def repo_page(endpoint: str, repo_id: str) -> str:
    return f"{endpoint.rstrip('/')}/{repo_id}"


def classify(error: Exception, repo_id: str, revision: str, endpoint: str, has_token: bool):
    """(access verdict, message) for an exception from the hub client or call_hub."""
    page = repo_page(endpoint, repo_id)
    if isinstance(error, UnsafeListing):
        return "unsafe_listing", str(error)
    if isinstance(error, (HubTimeout, HubBusy)):
        return "unreachable", (
            f"the hub at {endpoint} could not be reached for {repo_id}@{revision}: {error}. "
            "Needed: a hub that answers. Fix: check the network, proxy settings or "
            "HF_ENDPOINT, or retry later."
        )
    if isinstance(error, GatedRepoError):
        if not has_token:
            return "missing_token", (
                f"{repo_id} is gated and no Hugging Face token was given. Needed: a token of an "
                f"account with approved access. Fix: request access on {page}, then export "
                "HF_TOKEN or set kimi_hf_token (ansible-vault)."
            )
        return "no_access", (
            f"{repo_id} is gated and the token's account has no approved access. Needed: "
            f"approval on {page}. Fix: request access there (log in with the token's account) "
            "and rerun once it is granted."
        )
    if isinstance(error, RevisionNotFoundError):
        return "revision_not_found", (
            f"revision {revision!r} does not exist in {repo_id}. Needed: an existing branch, "
            f"tag or 40-character commit SHA. Fix: pick one from {page}/commits/main and set "
            "the repository's revision variable."
        )
    if isinstance(error, RepositoryNotFoundError):
        return "not_found", (
            f"{repo_id} was not found (or is private to another account). Needed: an existing "
            "repository id. Fix: check the spelling of the repository variable."
        )
    status = status_of(error)
    if isinstance(error, HfHubHTTPError) and status is not None:
        if status == 401:
            return "invalid_token", (
                "the Hugging Face token was rejected as invalid (401). Needed: a valid token. "
                "Fix: create a read token at https://huggingface.co/settings/tokens and export "
                "HF_TOKEN or set kimi_hf_token."
            )
        return "unreachable", f"the hub at {endpoint} answered {status} for {repo_id}"
    return "unreachable", (
        f"the hub at {endpoint} could not be reached ({type(error).__name__}). Needed: "
        "network access to the hub from the controller. Fix: check proxy settings or "
        "HF_ENDPOINT."
    )


def listing(info, endpoint: str, repo: dict) -> list[dict]:
    """The files of a model_info answer, type-checked and their paths judged safe."""
    files = []
    for sibling in info.siblings or []:
        lfs = getattr(sibling, "lfs", None)
        files.append(
            {
                "path": getattr(sibling, "rfilename", None),
                "size": getattr(sibling, "size", None),
                "sha256": getattr(lfs, "sha256", None) if lfs else None,
                "blob_id": getattr(sibling, "blob_id", None),
            }
        )
    check_listing(None, files, endpoint, repo["repo_id"], repo["revision"])
    return files


def inspect(
    api, repo: dict, token: str | bool, endpoint: str, deadline: Deadline, request_timeout: float
) -> dict:
    record = {
        "repo_id": repo["repo_id"],
        "revision": repo["revision"],
        "sha": None,
        "gated": None,
        "access": "ok",
        "message": None,
        "files": [],
        "total_bytes": None,
    }
    try:
        info = call_hub(
            lambda timeout: api.model_info(
                repo["repo_id"],
                revision=repo["revision"],
                files_metadata=True,
                token=token,
                timeout=timeout,
            ),
            deadline,
            request_timeout,
        )
        sha = getattr(info, "sha", None)
        if not (isinstance(sha, str) and BLOB_ID.fullmatch(sha)):
            raise UnsafeListing(
                f"the hub at {endpoint} gave no 40-character commit for "
                f"{repo['repo_id']}@{repo['revision']} (got {str(sha)[:60]!r})"
            )
        files = listing(info, endpoint, repo)
        record["sha"] = sha
        record["gated"] = bool(info.gated)
        record["files"] = files
        record["total_bytes"] = sum(f["size"] or 0 for f in files)
        # auth_check takes no timeout: the session's (use_request_timeout) applies.
        call_hub(
            lambda _timeout: api.auth_check(repo["repo_id"], token=token),
            deadline,
            request_timeout,
        )
    except Exception as error:
        record["files"], record["total_bytes"] = [], None
        record["access"], record["message"] = classify(
            error, repo["repo_id"], repo["revision"], endpoint, bool(token)
        )
    return record


def inspect_repos(
    repos: dict, token: str, endpoint: str, request_timeout: float, deadline_s: float
) -> dict:
    """hub_repo_info's result: per repository its verdict, commit and files; the deadline
    covers every call of the query."""
    use_request_timeout(request_timeout)
    api = HfApi(endpoint=endpoint)
    deadline = Deadline(deadline_s)
    # False, not None: never fall back to a token cached on the controller.
    found = {
        name: inspect(api, repo, token or False, endpoint, deadline, request_timeout)
        for name, repo in repos.items()
    }
    reachable = any(r["access"] != "unreachable" for r in found.values())
    return {"reachable": reachable, "endpoint": endpoint, "repos": found}
