"""The canary's inputs: serving config names and launches as the module takes them, the
repository's small files the canary fetches, the GPUs nvidia-smi lists, and each config's
identity, the digest of what decides its outcome (module_utils/canary/serve.py).

Standard library only: it ships to the hosts with the canary_serve module."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re

from ansible.module_utils.contract.names import MAX_NAME, ServingConfigError, parse_config_name
from ansible.module_utils.contract.secrets import is_secret_name
from ansible.module_utils.host.helpers import (
    MASK,
    CommandFailed,
    command_environment,
    run_with_deadline,
)
from ansible.module_utils.server.api_check import clip

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


class CanaryError(Exception):
    """Bad input: the message says what was found, what is needed and the fix."""


# ---------------------------------------------------------------------------------------------
# Serving configs and the repository's files


def check_name(name) -> str:
    """An expanded config name of the server role's grammar (contract/names.py), which names
    the canary's folders too."""
    try:
        parse_config_name(name)
    except ServingConfigError:
        raise CanaryError(
            f"serving config name {str(name)[:80]!r}: needed lower-case letters, digits, '.' "
            f"and '-' (at most {MAX_NAME}); fix kimi_canary_configs"
        ) from None
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


# ---------------------------------------------------------------------------------------------
# The GPUs, the runtime, identity


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
