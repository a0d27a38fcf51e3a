"""The canary's failures: the known failure texts of SGLang (and CUDA, torch, the dynamic
loader), each cited to its source, the first error line of a server's log classified against
them, and the hint of what to change for each kind of failure (module_utils/canary/serve.py).

Standard library only: it ships to the hosts with the canary_serve module."""

from __future__ import annotations

import re

# The server's log: read from its start (one launch a file), lines clipped.
LOG_READ_BYTES = 8 << 20
LINE_MAX = 2000

# Known failures
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


def _attention_backend_hint(entry: dict | None, context: dict, capability: str) -> str:
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


def _missing_kernel_hint(entry: dict | None, context: dict, capability: str) -> str:
    return (
        f"A kernel of the runtime is not built for these GPUs (compute capability "
        f"{capability}) or for the installed torch: check the runtime's sgl-kernel and "
        "flashinfer builds (runtime.json on the host, `python -m sglang.check_env`), or "
        "choose an attention backend whose kernels this build has."
    )


def _exited_hint(entry: dict | None, context: dict, capability: str) -> str:
    return (
        f"The server exited (status {context.get('exit_code')}) before it was ready; its "
        f"log, {context.get('log')}, says why."
    )


def _never_ready_hint(entry: dict | None, context: dict, capability: str) -> str:
    return (
        f"No answer from /health_generate within {context.get('timeout_s')} s: read the "
        f"log ({context.get('log')}); raise kimi_canary_timeout_s if loading and CUDA graph "
        "capture are just slow on this host."
    )


def _not_generating_hint(entry: dict | None, context: dict, capability: str) -> str:
    return (
        "The server loads and answers HTTP but does not generate: a kernel that hangs or "
        f"fails on these GPUs at the first forward; read the log ({context.get('log')})."
    )


# The hints that name what this failure saw: the backend, the compute capability, the log.
HINT_BUILDERS = {
    "attention_backend": _attention_backend_hint,
    "missing_kernel": _missing_kernel_hint,
    "exited": _exited_hint,
    "never_ready": _never_ready_hint,
    "not_generating": _not_generating_hint,
}
# The hints that are the same for every failure of their kind.
HINTS = {
    "out_of_memory": (
        "Out of GPU memory even with the tiny checkpoint: something else holds the GPUs "
        "(nvidia-smi lists the processes: another server, a stuck job), or "
        "kimi_canary_mem_fraction_static does not fit what is free; free the GPUs or "
        "change kimi_canary_mem_fraction_static."
    ),
    "runtime_version": (
        "The runtime's kernel packages are older than SGLang needs: rebuild the runtime "
        "(the runtime stage; the study lock's frozen set may pin them: plan.yml -e "
        "kimi_lock_update=true)."
    ),
    "import_error": (
        "The runtime is missing a module or has a broken one: rerun the runtime stage "
        "(--tags runtime) and read its checks; the log names the module."
    ),
    "context_length": (
        "The canary's context length is longer than the tiny checkpoint's: lower "
        "kimi_canary_context_length."
    ),
    "checkpoint": (
        "SGLang refused the tiny checkpoint the kit generated (a mismatch between "
        "canary_checkpoint and this runtime): the log line says what it read; report it "
        "with the log, or set kimi_canary_required: false to go on."
    ),
    "port_in_use": (
        "Something already listens on the canary's port: set kimi_canary_port to a free "
        "one, or stop what listens there."
    ),
}


def hint(
    kind: str,
    entry: dict | None,
    context: dict,
) -> str | None:
    """What to try for a failure of this kind. context: compute_capability, capabilities
    (kimi_attention_backend_compute_capabilities), backends (the launch's target, draft and
    tree backends by role), argv, log, exit_code, timeout_s."""
    capability = context.get("compute_capability") or "unknown"
    build = HINT_BUILDERS.get(kind)
    if build is not None:
        return build(entry, context, capability)
    return HINTS.get(kind)
