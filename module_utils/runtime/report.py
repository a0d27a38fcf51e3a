"""What a runtime says about itself, for runtime.json: the versions of the packages that carry
its GPU kernels, and `python -m sglang.check_env`.

A first real deploy fails, when it fails, in the kernels (flashinfer's MLA on SM120, a
sgl-kernel built without the GPU's architecture): the report keeps their versions in one
place, and check_env's own view of the machine (CUDA, the GPUs and their compute
capability, the kernel packages as sglang imports them, the topology), so a failure can be
read next to what the runtime was. check_env is a report, never a gate: a check_env that
fails or hangs is recorded as such and the stage goes on.

The output is outside input: bounded (CHECK_ENV_MAX_CHARS, the head kept, since check_env
prints the versions first and the topology last), and scrubbed of anything shaped like a
secret (it prints no environment, but an install that logs to stdout could)."""

from __future__ import annotations

from ansible.module_utils.host.secret_scrub import Scrubber

# The distributions that hold kernels a K2.6 launch runs, under each name they have been
# published as (sglang 0.5.23 requires sglang-kernel; earlier releases and git refs based on
# them sgl-kernel), plus what compiles or feeds them. Names as runtime_probe.canon writes them.
KERNEL_PACKAGES = (
    "sglang-kernel",
    "sgl-kernel",
    "flashinfer-python",
    "flashinfer-cubin",
    "flashinfer-jit-cache",
    "sgl-flash-mla",
    "flash-attn-4",
    "sgl-deep-gemm",
    "torch",
    "triton",
    "compressed-tensors",
    "transformers",
)
CHECK_ENV_MODULE = "sglang.check_env"
CHECK_ENV_MAX_CHARS = 16 << 10
ERROR_MAX_CHARS = 2000


def kernel_versions(packages: dict) -> dict:
    """{name: version or None} of KERNEL_PACKAGES from the probe's package list."""
    packages = packages if isinstance(packages, dict) else {}
    return {name: _text(packages.get(name)) for name in KERNEL_PACKAGES}


def _text(value) -> str | None:
    return value[:100] if isinstance(value, str) and value else None


def bounded(text: str, limit: int, keep: str = "head") -> tuple[str, bool]:
    """The text cut to `limit` characters (its head or its tail), and whether it was cut."""
    if len(text) <= limit:
        return text, False
    return (text[:limit] if keep == "head" else text[-limit:]), True


def check_env_record(rc: int | None, stdout: str, stderr: str, error: str | None = None) -> dict:
    """runtime.json's check_env entry from one run: ok, rc, the output (bounded, scrubbed) and,
    when it failed, why (the deadline's message, or the tail of what it printed on stderr).
    Nothing that varies between two runs of the same runtime (no duration), so writing the
    record stays idempotent."""
    scrub = Scrubber([])
    output, truncated = bounded(scrub(stdout or ""), CHECK_ENV_MAX_CHARS)
    why = None
    if error:
        why = error
    elif rc != 0:
        why = bounded(scrub((stderr or "").strip()), ERROR_MAX_CHARS, keep="tail")[0]
        why = why or f"exited with {rc} and printed nothing on stderr"
    return {
        "command": f"python -m {CHECK_ENV_MODULE}",
        "ok": error is None and rc == 0,
        "rc": rc,
        "output": output,
        "truncated": truncated,
        "error": scrub(why)[:ERROR_MAX_CHARS] if why else None,
    }
