"""The canary: each serving config's launch, on the host's real runtime and GPUs but on tiny
checkpoints of the same architecture, started, asked for one /generate and one chat
completion, and stopped, minutes before the 595 GB download; and the record of it
(canary.json, on the host and on the controller).

What it proves: the runtime starts the config's kernels and flags on these GPUs (attention
backends, speculative decoding, page size, TP size, CUDA graphs, parsers) and generates. What
it cannot prove: anything about the real weights' numerics or memory (the checkpoints are tiny
and random).

Steps, each a module action (library/canary_serve.py):
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
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from datetime import datetime, timezone

from ansible.module_utils.host.helpers import (
    MASK,
    CommandFailed,
    TooLarge,
    atomic_write,
    command_environment,
    group_members,
    read_bounded,
    run_with_deadline,
)
from ansible.module_utils.host.secret_scrub import Scrubber
from ansible.module_utils.plan.serving import is_secret_name
from ansible.module_utils.server.api_check import (
    ApiError,
    Client,
    chat_body,
    clip,
    expectations,
    launch_value,
    message_of,
)

KIND = "kimi.canary"
SCHEMA_VERSION = 1
STATES = ("ok", "failed", "skipped")
# The record on the host and the controller: one entry per config of a run.
RECORD_MAX_BYTES = 4 << 20
MAX_CONFIGS = 256
# The server's log: read from its start (one launch a file), lines clipped.
LOG_READ_BYTES = 8 << 20
LINE_MAX = 2000
FIRST_ERROR_MAX = 500
GENERATE_PROMPT = "The capital city of France is"
CHAT_PROMPT = "Reply with one word: what is the capital of France?"
MAX_NEW_TOKENS = 8
# One request may take at most this much of what is left of the deadline.
REQUEST_S = 120.0
# Between two looks at the port and /health_generate.
POLL_S = 0.5
NVIDIA_SMI_S = 60.0
# The canary's small files: what the hub lists except weights (design notes, step 2).
WEIGHT_PATTERNS = (
    "*.safetensors",
    "*.bin",
    "*.pt",
    "*.pth",
    "*.gguf",
    "*.safetensors.index.json",
)
CONFIG_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{0,127}$")


class CanaryError(Exception):
    """Bad input: the message says what was found, what is needed and the fix."""


# --- known failures -------------------------------------------------------------------------
#
# Each entry: the failure's kind, the text it matches in the server's log (SGLang's own words,
# from the file cited; the CUDA runtime's and the dynamic loader's for the kernel ones), and for
# an attention backend the backend it names. A hint is built per kind (hint()).

KNOWN_FAILURES = (
    {
        "kind": "attention_backend",
        "backend": "fa3",
        "pattern": r"FlashAttention v3 Backend requires SM>=80 and SM<=90",
        "source": "python/sglang/srt/layers/attention/attention_registry.py "
        "create_flashattention_v3_backend",
    },
    {
        "kind": "attention_backend",
        "backend": "trtllm_mla",
        "pattern": r"TRTLLM MLA backend is only supported on Blackwell GPUs",
        "source": "python/sglang/srt/arg_groups/overrides.py _mla_kv_cache_dtype_checks",
    },
    {
        "kind": "attention_backend",
        "backend": "trtllm_mha",
        "pattern": r"TRTLLM MHA backend for (?:prefill|decode) (?:requires|is only supported on)",
        "source": "python/sglang/srt/arg_groups/attention_hook.py",
    },
    {
        "kind": "attention_backend",
        "backend": "trtllm_mla",
        "pattern": r"trtllm_mla backend can only be used with MLA models",
        "source": "python/sglang/srt/layers/attention/attention_registry.py "
        "create_trtllm_mla_backend",
    },
    {
        "kind": "attention_backend",
        "backend": "trtllm_mha",
        "pattern": r"trtllm_mha backend can only be used with non-MLA models",
        "source": "python/sglang/srt/layers/attention/attention_registry.py "
        "create_trtllm_mha_backend",
    },
    {
        "kind": "attention_backend",
        "backend": "fa4",
        "pattern": r"\(head_dim, head_dim_v\)=\(\d+, \d+\) is not supported on SM\d+",
        "source": "python/sglang/kernels/ops/attention/flash_attn/cute/interface.py "
        "_validate_head_dims",
    },
    {
        "kind": "attention_backend",
        "backend": "fa4",
        "pattern": r"Unsupported compute capability[.:]",
        "source": "python/sglang/kernels/ops/attention/flash_attn/cute/interface.py",
    },
    {
        "kind": "out_of_memory",
        "pattern": r"Not enough memory\. Please try to increase --mem-fraction-static",
        "source": "python/sglang/srt/model_executor/pool_configurator.py",
    },
    {
        "kind": "out_of_memory",
        # torch's allocator (torch.OutOfMemoryError), and the CUDA runtime's own text.
        "pattern": r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory",
        "source": "torch.cuda (torch.OutOfMemoryError), as SGLang's scheduler logs it",
    },
    {
        "kind": "missing_kernel",
        # cudaErrorNoKernelImageForDevice: a kernel not built for this GPU's architecture.
        "pattern": r"no kernel image is available for execution on the device",
        "source": "the CUDA runtime (cudaErrorNoKernelImageForDevice), raised through torch",
    },
    {
        "kind": "missing_kernel",
        "pattern": r"undefined symbol: ",
        "source": "the dynamic loader, importing a kernel library (sgl_kernel, flashinfer) "
        "built against another torch or CUDA",
    },
    {
        "kind": "missing_kernel",
        "pattern": r"(?:not|isn't) (?:built|compiled) for (?:sm_?\d+|this (?:GPU|architecture))",
        "source": "a kernel library's own architecture check",
    },
    {
        "kind": "runtime_version",
        "pattern": r"(?:sglang-kernel|flashinfer_python) (?:is installed with version|with "
        r"minimum required version)",
        "source": "python/sglang/srt/utils/common.py assert_pkg_version, from "
        "srt/entrypoints/engine.py",
    },
    {
        "kind": "import_error",
        "pattern": r"\b(?:ModuleNotFoundError|ImportError): ",
        "source": "Python's import system",
    },
    {
        "kind": "context_length",
        "pattern": r"context_length \(\d+\) is greater than the derived context_length",
        "source": "python/sglang/srt/configs/model_config.py _derive_context_length",
    },
    {
        "kind": "checkpoint",
        "pattern": r"does not appear to have a file named config\.json|is not a valid JSON file"
        r"|Cannot find any model weights with|references \d+ shard file\(s\) missing"
        r"|are not supported for now|DFLASH target_layer_ids contains an out-of-range"
        r"|DFLASH requires draft num_hidden_layers|is not divisible by \d+"
        r"|mat1 and mat2 shapes cannot be multiplied|Error while deserializing header",
        "source": "python/sglang/srt/model_loader/loader.py, weight_utils.py, "
        "models/registry.py, speculative/dflash_utils.py, distributed/utils.py",
    },
)
_COMPILED = [(entry, re.compile(entry["pattern"])) for entry in KNOWN_FAILURES]
# A line that ends a Python traceback: `SomeError: text` (or a bare `AssertionError`).
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)\b(?::|$)")
ERROR_WORDS = re.compile(r"\b(?:error|failed|fatal|traceback)\b", re.IGNORECASE)


def known_failure(line: str) -> dict | None:
    for entry, pattern in _COMPILED:
        if pattern.search(line):
            return entry
    return None


def read_log_lines(path: str) -> list[str]:
    """The log's lines from its start, at most LOG_READ_BYTES, each clipped; [] when absent."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(LOG_READ_BYTES)
    except OSError:
        return []
    return [line[:LINE_MAX] for line in data.decode("utf-8", "replace").splitlines()]


def first_error(lines: list[str]) -> tuple[str | None, dict | None]:
    """(the first error line, the known failure it is) of a log: the first line a known
    failure matches; else the exception line that ends the first traceback; else the first
    line that says error or failed. (None, None) for a log that shows none."""
    for line in lines:
        entry = known_failure(line)
        if entry is not None:
            return line.strip(), entry
    in_traceback = False
    for line in lines:
        stripped = line.strip()
        if "Traceback (most recent call last)" in line:
            in_traceback = True
        elif in_traceback and EXCEPTION_LINE.match(stripped):
            return stripped, None
    # An exception without a traceback header (a SyntaxError, a child's last words), then any
    # line that says error.
    for line in lines:
        if EXCEPTION_LINE.match(line.strip()):
            return line.strip(), None
    return next((line.strip() for line in lines if ERROR_WORDS.search(line)), None), None


def runs_on(capabilities: dict, capability: str | None) -> list[str]:
    """The backends kimi_attention_backend_compute_capabilities lists for a capability."""
    if not capability or not isinstance(capabilities, dict):
        return []
    return sorted(
        str(name)
        for name, archs in capabilities.items()
        if isinstance(archs, list) and capability in [str(a) for a in archs]
    )


def hint(
    kind: str,
    entry: dict | None,
    context: dict,
) -> str | None:
    """What to try for a failure of this kind. context: compute_capability, capabilities
    (kimi_attention_backend_compute_capabilities), backends (the launch's target, draft and
    tree backends by role), argv, log, exit_code, timeout_s."""
    capability = context.get("compute_capability") or "unknown"
    log = context.get("log")
    if kind == "attention_backend":
        backend = (entry or {}).get("backend") or "?"
        runs = runs_on(context.get("capabilities") or {}, context.get("compute_capability"))
        roles = [
            f"kimi_{role}_attention_backend"
            for role, name in sorted((context.get("backends") or {}).items())
            if name == backend
        ]
        where = " or ".join(roles) or "the launch's attention backend flags"
        return (
            f"The attention backend {backend} does not run on these GPUs (compute capability "
            f"{capability}). Backends that run here: {', '.join(runs) or 'none listed'} "
            "(kimi_attention_backend_compute_capabilities). Set "
            f"{where} to one of them (inventory or -e), or the model's profile in "
            "models/<model>/model.yml."
        )
    if kind == "out_of_memory":
        return (
            "Out of GPU memory even with the tiny checkpoint: something else holds the GPUs "
            "(nvidia-smi lists the processes: another server, a stuck job), or "
            "kimi_canary_mem_fraction_static does not fit what is free; free the GPUs or "
            "change kimi_canary_mem_fraction_static."
        )
    if kind == "missing_kernel":
        return (
            f"A kernel of the runtime is not built for these GPUs (compute capability "
            f"{capability}) or for the installed torch: check the runtime's sgl-kernel and "
            "flashinfer builds (runtime.json on the host, `python -m sglang.check_env`), or "
            "choose an attention backend whose kernels this build has."
        )
    if kind == "runtime_version":
        return (
            "The runtime's kernel packages are older than SGLang needs: rebuild the runtime "
            "(the runtime stage; the study lock's frozen set may pin them: plan.yml -e "
            "kimi_lock_update=true)."
        )
    if kind == "import_error":
        return (
            "The runtime is missing a module or has a broken one: rerun the runtime stage "
            "(--tags runtime) and read its checks; the log names the module."
        )
    if kind == "context_length":
        return (
            "The canary's context length is longer than the tiny checkpoint's: lower "
            "kimi_canary_context_length."
        )
    if kind == "checkpoint":
        return (
            "SGLang refused the tiny checkpoint the kit generated (a mismatch between "
            "canary_checkpoint and this runtime): the log line says what it read; report it "
            "with the log, or set kimi_canary_required: false to go on."
        )
    if kind == "exited":
        return (
            f"The server exited (status {context.get('exit_code')}) before it was ready; its "
            f"log, {log}, says why."
        )
    if kind == "never_ready":
        return (
            f"No answer from /health_generate within {context.get('timeout_s')} s: read the "
            f"log ({log}); raise kimi_canary_timeout_s if loading and CUDA graph capture are "
            "just slow on this host."
        )
    if kind == "not_generating":
        return (
            "The server loads and answers HTTP but does not generate: a kernel that hangs or "
            f"fails on these GPUs at the first forward; read the log ({log})."
        )
    if kind == "port_in_use":
        return (
            "Something already listens on the canary's port: set kimi_canary_port to a free "
            "one, or stop what listens there."
        )
    return None


# --- inputs ---------------------------------------------------------------------------------


def check_name(name) -> str:
    if not isinstance(name, str) or not CONFIG_NAME.fullmatch(name):
        raise CanaryError(
            f"serving config name {str(name)[:80]!r}: needed lower-case letters, digits, '.' "
            "and '-' (at most 128); fix kimi_canary_configs"
        )
    return name


def check_launch(config: dict) -> dict:
    """A config's launch as the module takes it: name, argv (a list of strings whose first is
    an absolute python), environment (string to string)."""
    if not isinstance(config, dict):
        raise CanaryError(f"a canary config must be an object, got {type(config).__name__}")
    name = check_name(config.get("name"))
    argv = config.get("argv")
    if (
        not isinstance(argv, list)
        or len(argv) < 4
        or not all(isinstance(a, str) for a in argv)
        or not argv[0].startswith("/")
    ):
        raise CanaryError(
            f"{name}: argv must be the rendered launch (an absolute python, -m "
            f"sglang.launch_server, flags), got {str(argv)[:200]}"
        )
    environment = config.get("environment") or {}
    if not isinstance(environment, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in environment.items()
    ):
        raise CanaryError(f"{name}: environment must map names to strings")
    return {"name": name, "argv": list(argv), "environment": dict(environment)}


def source_files(files, max_bytes: int) -> list[dict]:
    """The canary's small files of a repository listing (hub_repo_info's files): everything
    but weights (WEIGHT_PATTERNS) and files over max_bytes (or of unknown size)."""
    if not isinstance(files, list):
        raise CanaryError(f"a repository's files must be a list, got {type(files).__name__}")
    kept = []
    for entry in files:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise CanaryError(f"a file entry needs a path, got {str(entry)[:120]}")
        path, size = entry["path"], entry.get("size")
        name = path.rsplit("/", 1)[-1]
        if any(fnmatch.fnmatch(name, pattern) for pattern in WEIGHT_PATTERNS):
            continue
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= max_bytes:
            continue
        kept.append(entry)
    return kept


# --- the GPUs, the runtime, identity --------------------------------------------------------


def gpu_facts(timeout_s: float = NVIDIA_SMI_S) -> dict:
    """UUIDs, driver and compute capability of the host's GPUs from `nvidia-smi --query-gpu`,
    under a deadline; raises CanaryError naming the command when it fails or hangs."""
    argv = ["nvidia-smi", "--query-gpu=uuid,driver_version,compute_cap", "--format=csv,noheader"]
    shown = " ".join(argv)
    try:
        rc, out, err = run_with_deadline(
            argv, timeout_s, env=command_environment(), max_output_bytes=1 << 20
        )
    except CommandFailed as error:
        raise CanaryError(f"{error} Fix: check the GPUs and their driver (nvidia-smi).") from None
    if rc != 0:
        raise CanaryError(
            f"`{shown}` exited {rc}: {clip((err or out).strip(), 200)}. Needed: the NVIDIA "
            "driver's nvidia-smi answering. Fix: check the driver (preflight names it)."
        )
    uuids, drivers, capabilities = [], set(), set()
    for line in out.splitlines()[:1024]:
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 3:
            continue
        uuid, driver, capability = parts
        if re.fullmatch(r"GPU-[0-9a-fA-F-]{8,64}", uuid) and re.fullmatch(r"\d+\.\d+", capability):
            uuids.append(uuid)
            drivers.add(driver[:40])
            capabilities.add(capability)
    if not uuids:
        raise CanaryError(
            f"`{shown}` listed no GPU (output {clip(out, 200)!r}). Needed: the host's GPUs. "
            "Fix: check the driver and the GPUs (nvidia-smi -L)."
        )
    return {
        "uuids": uuids,
        "driver": sorted(drivers)[0] if len(drivers) == 1 else ", ".join(sorted(drivers)),
        "compute_capability": sorted(capabilities)[0]
        if len(capabilities) == 1
        else ", ".join(sorted(capabilities)),
    }


def runtime_dir(argv: list[str]) -> str:
    """The runtime version folder the launch's python runs from (the venv link resolved)."""
    return os.path.realpath(os.path.dirname(os.path.dirname(argv[0])))


def masked_environment(environment: dict) -> dict:
    """The environment as plans and records show it (serving.py masked()'s rule)."""
    return {k: (MASK if is_secret_name(k) else v) for k, v in sorted(environment.items())}


def launches(configs: list[dict], extra: dict) -> dict:
    """The canary launches of serving_render's unmasked configs: per config its name, base,
    runtime kind, TP size, argv and environment (plus extra[name], kimi_canary_environment)
    with secret values masked, and apart from them, by name, the secret entries themselves."""
    if not isinstance(configs, list) or not isinstance(extra or {}, dict):
        raise CanaryError("launches needs serving_render's configs and a mapping of environments")
    shown, secrets = [], {}
    for config in configs:
        name = check_name(config.get("name"))
        added = (extra or {}).get(name) or {}
        if not isinstance(added, dict):
            raise CanaryError(
                f"kimi_canary_environment[{name!r}] must map names to strings, got "
                f"{type(added).__name__}"
            )
        environment = {**config["environment"], **{str(k): str(v) for k, v in added.items()}}
        shown.append(
            {
                "name": name,
                "base": config["base"],
                "runtime_kind": config["runtime_kind"],
                "tp_size": config["tp_size"],
                "argv": list(config["argv"]),
                "environment": masked_environment(environment),
            }
        )
        secrets[name] = {k: v for k, v in environment.items() if is_secret_name(k)}
    return {"launches": shown, "secret_environment": secrets}


def identity(config: dict, checkpoints: dict, gpus: dict) -> str:
    """sha256 of what decides a canary's outcome; no secret reaches it (secret-named
    environment values are masked first), so it can be recorded where others read it."""
    argv = config["argv"]
    used = {
        kind: (info or {}).get("digest")
        for kind, info in sorted((checkpoints or {}).items())
        if isinstance(info, dict) and info.get("path") in argv
    }
    inputs = {
        "argv": argv,
        "environment": masked_environment(config["environment"]),
        "runtime_dir": runtime_dir(argv),
        "checkpoints": used,
        "gpus": gpus.get("uuids"),
        "driver": gpus.get("driver"),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def read_record(path: str) -> dict | None:
    """The previous canary.json when it is one (validate_record), else None."""
    try:
        data = read_bounded(path, RECORD_MAX_BYTES)
    except (OSError, TooLarge):
        return None
    if data is None:
        return None
    try:
        record = json.loads(data)
    except ValueError:
        return None
    return record if not validate_record(record) else None


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


# --- one canary -----------------------------------------------------------------------------


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


def now() -> str:
    # timezone.utc, not datetime.UTC: the hosts' Pythons may be 3.10.
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: UP017


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


def blank_entry(identity_: str, log: str) -> dict:
    """A config's record entry before anything is known of it (failed until it passes)."""
    return {
        "state": "failed",
        "seconds_to_ready": None,
        "seconds": 0.0,
        "first_error": None,
        "failure": None,
        "hint": None,
        "log": log,
        "identity": identity_,
        "reason": None,
        "generate": None,
        "chat": None,
        "finished_at": None,
    }


def skipped(identity_: str, log: str, reason: str) -> dict:
    return {
        **blank_entry(identity_, log),
        "state": "skipped",
        "reason": reason,
        "finished_at": now(),
    }


# --- the record -----------------------------------------------------------------------------

ENTRY_FIELDS = {
    "state",
    "seconds_to_ready",
    "seconds",
    "first_error",
    "failure",
    "hint",
    "log",
    "identity",
    "reason",
    "generate",
    "chat",
    "finished_at",
}
RECORD_FIELDS = {
    "kind",
    "schema_version",
    "host",
    "profile",
    "model",
    "compute_capability",
    "started_at",
    "finished_at",
    "checkpoints",
    "configs",
    "passed",
    "failed",
    "skipped",
}


def _optional(value, kinds) -> bool:
    return value is None or (isinstance(value, kinds) and not isinstance(value, bool))


def validate_entry(name: str, entry) -> list[str]:
    if not isinstance(entry, dict):
        return [f"configs.{name} is not an object"]
    errors = []
    if set(entry) != ENTRY_FIELDS:
        errors.append(f"configs.{name} has fields {sorted(entry)}, needed {sorted(ENTRY_FIELDS)}")
    if entry.get("state") not in STATES:
        errors.append(f"configs.{name}.state is {entry.get('state')!r}, needed one of {STATES}")
    for key in ("seconds_to_ready", "seconds"):
        if not _optional(entry.get(key), (int, float)):
            errors.append(f"configs.{name}.{key} is not a number")
    for key in ("first_error", "failure", "hint", "reason", "log", "identity", "finished_at"):
        if not _optional(entry.get(key), str):
            errors.append(f"configs.{name}.{key} is not a string")
    if not isinstance(entry.get("identity"), str) or not re.fullmatch(
        r"[0-9a-f]{64}", entry.get("identity") or ""
    ):
        errors.append(f"configs.{name}.identity is not a sha256")
    generate = entry.get("generate")
    if generate is not None and not (
        isinstance(generate, dict)
        and set(generate) == {"completion_tokens", "spec_verify_ct"}
        and all(_optional(generate[k], int) for k in generate)
    ):
        errors.append(f"configs.{name}.generate is not {{completion_tokens, spec_verify_ct}}")
    chat = entry.get("chat")
    if chat is not None and not (
        isinstance(chat, dict) and set(chat) == {"ok"} and isinstance(chat["ok"], bool)
    ):
        errors.append(f"configs.{name}.chat is not {{ok}}")
    if entry.get("state") == "failed" and not entry.get("failure"):
        errors.append(f"configs.{name} failed without a failure kind")
    if entry.get("state") == "ok" and (
        entry.get("failure") or entry.get("seconds_to_ready") is None
    ):
        errors.append(f"configs.{name} passed with a failure or without seconds_to_ready")
    return errors


def validate_record(record) -> list[str]:
    """What is wrong with a canary record (the schema of docs/stages.md, "Canary"); []."""
    if not isinstance(record, dict):
        return ["the record is not an object"]
    errors = []
    if record.get("kind") != KIND or record.get("schema_version") != SCHEMA_VERSION:
        errors.append(f"kind/schema_version are not {KIND}/{SCHEMA_VERSION}")
    if not set(record) <= RECORD_FIELDS or not {"kind", "configs"} <= set(record):
        errors.append(f"fields {sorted(record)} are not {sorted(RECORD_FIELDS)}")
    configs = record.get("configs")
    if not isinstance(configs, dict) or len(configs) > MAX_CONFIGS:
        return [*errors, "configs is not an object of at most 256 entries"]
    for name, entry in configs.items():
        if not isinstance(name, str) or not CONFIG_NAME.fullmatch(name):
            errors.append(f"config name {str(name)[:80]!r} is not a serving config name")
            continue
        errors += validate_entry(name, entry)
    for state, key in (("ok", "passed"), ("failed", "failed"), ("skipped", "skipped")):
        wanted = sorted(
            n for n, e in configs.items() if isinstance(e, dict) and e.get("state") == state
        )
        if sorted(record.get(key) or []) != wanted:
            errors.append(f"{key} does not list the configs whose state is {state}")
    checkpoints = record.get("checkpoints", {})
    if not isinstance(checkpoints, dict):
        errors.append("checkpoints is not an object")
    return errors


CHECKPOINT_FIELDS = ("path", "bytes", "seconds", "digest")


def build_record(
    previous: dict | None,
    names: list[str],
    results: dict,
    facts: dict,
    checkpoints: dict,
) -> dict:
    """The record of this run: each of `names` from `results` (this run's entries), else from
    the previous record (a config not run again); configs of other runs are dropped."""
    old = (previous or {}).get("configs", {})
    configs = {}
    for name in names:
        entry = results.get(name) or old.get(name)
        if entry is None:
            raise CanaryError(
                f"{name}: no canary result and none recorded before. Needed: a result per "
                "config. Fix: rerun the canary stage (--tags canary)."
            )
        configs[name] = entry
    record = {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "host": facts.get("host"),
        "profile": facts.get("profile"),
        "model": facts.get("model"),
        "compute_capability": facts.get("compute_capability"),
        "started_at": facts.get("started_at") or now(),
        "finished_at": now(),
        "checkpoints": {
            kind: {key: (info or {}).get(key) for key in CHECKPOINT_FIELDS}
            for kind, info in sorted((checkpoints or {}).items())
        },
        "configs": configs,
        "passed": [n for n in names if configs[n]["state"] == "ok"],
        "failed": [n for n in names if configs[n]["state"] == "failed"],
        "skipped": [n for n in names if configs[n]["state"] == "skipped"],
    }
    errors = validate_record(record)
    if errors:
        raise CanaryError(f"the canary record is malformed: {'; '.join(errors[:5])}")
    return record


def comparable(record: dict | None) -> dict:
    """The record without what changes on every write (the times and the checkpoints' seconds),
    to decide whether it changed."""
    if not record:
        return {}
    return {
        **{k: v for k, v in record.items() if k not in ("started_at", "finished_at")},
        "checkpoints": {
            kind: {k: v for k, v in (info or {}).items() if k != "seconds"}
            for kind, info in (record.get("checkpoints") or {}).items()
        },
    }


def write_record(path: str, record: dict, previous: dict | None) -> tuple[dict, bool]:
    """canary.json (0644: no secret in it) written when its content changed; the record as it
    stands and whether it was written. An unchanged one keeps its times."""
    if previous is not None and comparable(previous) == comparable(record):
        return previous, False
    # Keys in the record's own order: configs as the run takes them.
    atomic_write(path, json.dumps(record, indent=1) + "\n", 0o644)
    return record, True


def line(name: str, entry: dict) -> str:
    """One config's outcome, as the stage and the deploy's summary print it."""
    if entry["state"] == "ok":
        return (
            f"{name}: ok, ready after {entry['seconds_to_ready']:g} s "
            f"({entry['seconds']:g} s in all)"
        )
    if entry["state"] == "skipped":
        return f"{name}: skipped: {entry['reason']}"
    said = (entry["first_error"] or entry["reason"] or "no error line in the log").rstrip(".")
    return f"{name}: failed ({entry['failure']}): {said}. Hint: {entry['hint']} Log: {entry['log']}"


def summary(record: dict) -> dict:
    """Per host, for the deploy's end: how many passed, each failure with its hint, and a line
    per config."""
    configs = record["configs"]
    return {
        "lines": [
            f"Canary: {len(record['passed'])} of {len(configs)} serving configs passed.",
            *(line(name, entry) for name, entry in configs.items()),
        ],
        "passed": len(record["passed"]),
        "total": len(configs),
        "failures": [
            {
                "config": name,
                "failure": configs[name]["failure"],
                "first_error": configs[name]["first_error"],
                "hint": configs[name]["hint"],
                "log": configs[name]["log"],
            }
            for name in record["failed"]
        ],
        "skipped": [
            {"config": name, "reason": configs[name]["reason"]} for name in record["skipped"]
        ],
    }
