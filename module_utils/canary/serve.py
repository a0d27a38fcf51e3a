"""The canary: each serving config's launch, on the host's real runtime and GPUs but on tiny
checkpoints of the same architecture, started, asked for one /generate and one chat
completion, and stopped, minutes before the 595 GB download; and the record of it
(canary.json, on the host and on the controller).

What it proves: the runtime starts the config's kernels and flags on these GPUs (attention
backends, speculative decoding, page size, TP size, CUDA graphs, parsers) and generates. What
it cannot prove: anything about the real weights' numerics or memory (the checkpoints are tiny
and random).

Steps, each a module action (library/canary_serve.py, serve_actions.py):
- plan: per config its identity (a digest of what decides the outcome: argv, environment with
  secret values masked, the runtime folder its python link points at, the checkpoints' digests
  the argv names, the GPUs' UUIDs and driver) and whether it must run: a config whose last
  record passed with the same identity does not (changed=0 on a second deploy); also whether
  the kit's server is running, since it holds the GPUs.
- run: one config: the launch in a session of its own, its output to a root-only log; the
  port, then /health_generate 200, within the deadline; one POST /generate (8 tokens,
  greedy) and one POST /v1/chat/completions; the whole process group stopped (SIGTERM, then
  SIGKILL after a grace). A failure is classified from the log's first error line against
  KNOWN_FAILURES, each matched on SGLang's own text (cited), with a hint of what to change.
- record: the configs of this run into canary.json, written only when its content changed.

Everything from outside is bounded and type-checked: the server's answers (api_check.Client:
deadline, size), its log (read to LOG_READ_BYTES, lines clipped), nvidia-smi's output, the
previous record. The API key and the HF token (and every form secret_scrub knows of them) are
masked out of everything recorded; the identity digests no secret.

This file holds the plan and one canary's run; beside it, serve_inputs.py (config names,
launches, the repository's small files, the GPUs, the identity), serve_failures.py (the known
failures, the log's first error line, the hints), serve_record.py (canary.json: its schema,
building, writing, the summary) and serve_actions.py (the module's actions).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time

from ansible.module_utils.canary.serve_failures import first_error, hint, read_log_lines
from ansible.module_utils.canary.serve_inputs import (  # noqa: F401 (the filters import them here)
    CanaryError,
    identity,
    launches,
    source_files,
)
from ansible.module_utils.canary.serve_record import blank_entry, now, read_record
from ansible.module_utils.host.helpers import command_environment, group_members
from ansible.module_utils.host.secret_scrub import Scrubber
from ansible.module_utils.server.api_check import (
    ApiError,
    Client,
    chat_body,
    clip,
    expectations,
    launch_value,
    message_of,
)

FIRST_ERROR_MAX = 500
GENERATE_PROMPT = "The capital city of France is"
CHAT_PROMPT = "Reply with one word: what is the capital of France?"
MAX_NEW_TOKENS = 8
# One request may take at most this much of what is left of the deadline.
REQUEST_S = 120.0
# Between two looks at the port and /health_generate.
POLL_S = 0.5


def plan(configs: list[dict], record_path: str, checkpoints: dict, gpus: dict, rerun: bool):
    """Per config its identity and whether it must run: not when the previous record has it
    passed with the same identity (unless rerun)."""
    previous = (read_record(record_path) or {}).get("configs", {})
    identities, to_run = {}, []
    for config in configs:
        digest = identity(config, checkpoints, gpus)
        identities[config["name"]] = digest
        last = previous.get(config["name"]) or {}
        if rerun or last.get("state") != "ok" or last.get("identity") != digest:
            to_run.append(config["name"])
    return identities, to_run


# ---------------------------------------------------------------------------------------------
# One canary


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def open_log(path: str) -> int:
    """The log file, truncated, root-only (0600) before anything is written; its folder 0700."""
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def stop(process: subprocess.Popen, grace_s: float) -> int | None:
    """The whole process group: SIGTERM, then SIGKILL to what is left after grace_s; the exit
    status. The leader is reaped while waiting (host_helpers.kill_process_group would count our
    own unreaped child as alive for the whole grace)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if process.poll() is not None and not group_members(process.pid):
            break
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)
    return process.returncode


def health_status(client: Client) -> int:
    """The status /health_generate answers (its body is empty), within the client's deadline."""
    with client.exchange("GET", "/health_generate", None) as response:
        response.read(1 << 16)
        return response.status


def wait_ready(process, host, port, client_for, deadline) -> tuple[str, str]:
    """("ready" | "exited" | "never_ready" | "not_generating", detail): the port, then
    /health_generate 200 (SGLang answers 503 until its warmup request generated), before the
    deadline."""
    opened = False
    detail = ""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return "exited", f"exit status {process.returncode}"
        if not opened:
            opened = port_open(host, port)
        if opened:
            left = deadline - time.monotonic()
            try:
                status = health_status(client_for(min(REQUEST_S, max(left, 1))))
            except ApiError as error:
                detail = str(error)
            else:
                if status == 200:
                    return "ready", ""
                detail = f"/health_generate answered {status}"
        time.sleep(POLL_S)
    if process.poll() is not None:
        return "exited", f"exit status {process.returncode}"
    if opened:
        return "not_generating", detail or "the port answers, /health_generate never gave 200"
    return "never_ready", "the port never opened"


def requests_of(client_for, argv: list[str], kwargs: dict, deadline) -> tuple[dict, dict, str]:
    """(generate, chat, problem): one /generate and one chat completion; problem "" when both
    came back as they should."""
    speculative = bool(launch_value(argv, "--speculative-algorithm"))
    generate = {"completion_tokens": None, "spec_verify_ct": None}
    chat = {"ok": False}
    left = deadline - time.monotonic()
    try:
        answer = client_for(min(REQUEST_S, max(left, 1))).json(
            "POST",
            "/generate",
            {
                "text": GENERATE_PROMPT,
                "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0},
            },
        )
    except ApiError as error:
        return generate, chat, f"/generate: {error}"
    meta = answer.get("meta_info") if isinstance(answer.get("meta_info"), dict) else {}
    tokens, verify = meta.get("completion_tokens"), meta.get("spec_verify_ct")
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        generate["completion_tokens"] = tokens
    if isinstance(verify, int) and not isinstance(verify, bool):
        generate["spec_verify_ct"] = verify
    if not generate["completion_tokens"] or generate["completion_tokens"] < 1:
        return generate, chat, f"/generate gave no tokens: {clip(answer, 200)}"
    if speculative and tokens > 1 and not generate["spec_verify_ct"]:
        return generate, chat, f"/generate ran no verify step under speculation: {clip(meta, 200)}"
    left = deadline - time.monotonic()
    try:
        body = chat_body(expectations(argv), CHAT_PROMPT, MAX_NEW_TOKENS, kwargs or None)
        message = message_of(
            client_for(min(REQUEST_S, max(left, 1))).json("POST", "/v1/chat/completions", body)
        )
    except ApiError as error:
        return generate, chat, f"/v1/chat/completions: {error}"
    chat["ok"] = isinstance(message.get("content"), str) or isinstance(
        message.get("reasoning_content"), str
    )
    if not chat["ok"]:
        return generate, chat, f"/v1/chat/completions gave no text: {clip(message, 200)}"
    return generate, chat, ""


def run_one(spec: dict) -> dict:
    """One config's canary; the record entry (see validate_record). spec: config (name, argv,
    environment), secret_environment, identity, log, host, port, timeout_s, grace_s,
    chat_template_kwargs, secrets (values to mask), capabilities, backends,
    compute_capability."""
    config = spec["config"]
    argv, log = config["argv"], spec["log"]
    host, port = spec["host"], int(spec["port"])
    scrub = Scrubber([*spec.get("secrets", []), *spec.get("secret_environment", {}).values()])
    started = time.monotonic()
    entry = blank_entry(spec["identity"], log)
    context = {
        "compute_capability": spec.get("compute_capability"),
        "capabilities": spec.get("capabilities"),
        "backends": spec.get("backends"),
        "argv": argv,
        "log": log,
        "timeout_s": spec["timeout_s"],
    }

    def finish(kind: str | None, reason: str) -> dict:
        lines = read_log_lines(log)
        line, known = first_error(lines)
        if kind is not None and known is not None:
            kind = known["kind"]
        entry.update(
            state="ok" if kind is None else "failed",
            failure=kind,
            first_error=clip(scrub(line), FIRST_ERROR_MAX) if line and kind else None,
            hint=hint(kind, known, context) if kind else None,
            reason=clip(scrub(reason), FIRST_ERROR_MAX) if reason else None,
            seconds=round(time.monotonic() - started, 3),
            finished_at=now(),
        )
        return entry

    if not port_free(host, port):
        return finish("port_in_use", f"{host}:{port} is in use before the canary started")
    environment = {
        **command_environment(),
        **config["environment"],
        **spec.get("secret_environment", {}),
    }
    fd = open_log(log)
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.STDOUT,
            env=environment,
            cwd=os.path.dirname(log),
            start_new_session=True,
        )
    except OSError as error:
        os.close(fd)
        return finish("exited", f"could not start {argv[0]}: {error.strerror}")
    os.close(fd)
    deadline = started + float(spec["timeout_s"])

    def client_for(timeout: float) -> Client:
        return Client(f"http://{host}:{port}", "", timeout)

    try:
        state, detail = wait_ready(process, host, port, client_for, deadline)
        if state == "ready":
            entry["seconds_to_ready"] = round(time.monotonic() - started, 3)
            generate, chat, problem = requests_of(
                client_for, argv, spec.get("chat_template_kwargs") or {}, deadline
            )
            entry["generate"], entry["chat"] = generate, chat
            state, detail = ("ok", "") if not problem else ("not_generating", problem)
    finally:
        code = stop(process, float(spec.get("grace_s", 10)))
    context["exit_code"] = code
    if state == "exited":
        detail = f"exit status {code}"
    if state == "ok":
        return finish(None, "")
    return finish(state, detail)
