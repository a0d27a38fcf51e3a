"""A launch's capacity by its role in prefill-decode disaggregation: what its KV pool holds per
request and how many requests that makes, for the whole server, a prefill server and a decode
server alike (capacity_launches.plan_launch adds it to every launch's plan).

Read in SGLang's source (0.5.x, srt/server_args.py and srt/disaggregation/):
- A prefill server (`--disaggregation-mode prefill`) holds each prompt's KV cache from its
  prefill until the decode server has taken it over, never the output; SGLang turns its CUDA
  graphs off (`disable_cuda_graph = True`, "Cuda graph is disabled for prefill server").
- A decode server (`--disaggregation-mode decode`) receives whole prompts' KV caches and
  decodes on them. It admits a request only while its pool keeps `--num-reserved-decode-tokens`
  (512 by default) free for every request it runs, receives or queues
  (`DecodePreallocQueue._allocatable_tokens`): each request costs its context plus that reserve.
- Any other server holds whole requests, prompt and output.
"""

from __future__ import annotations

from ansible.module_utils.contract.disaggregation import MODES
from ansible.module_utils.contract.launch import flag_value
from ansible.module_utils.plan.capacity_common import MAX_KV_TOKENS, CapacityError, is_int
from ansible.module_utils.plan.capacity_hybrid import SPEC_MAX_RUNNING_REQUESTS

# SGLang's --num-reserved-decode-tokens default (server_args.py).
RESERVED_DECODE_TOKENS = 512
HOLDS = {
    "whole": "whole requests: prompt and output",
    "prefill": "prompts only, from their prefill until the decode server has taken their KV cache",
    "decode": (
        "whole contexts handed over by the prefill servers, each with the "
        "--num-reserved-decode-tokens SGLang keeps free for its decode"
    ),
}


def role_options(argv) -> dict:
    """The launch's role (whole, prefill or decode) and a decode server's reserve, from its
    --disaggregation-mode and --num-reserved-decode-tokens; CapacityError for a bad value."""
    mode = flag_value(argv, "--disaggregation-mode")
    if mode in (None, "", "null"):
        return {"role": "whole", "reserved_decode_tokens": None}
    if mode not in MODES:
        raise CapacityError(
            f"--disaggregation-mode {mode!r} in the launch is none of null, prefill, decode"
        )
    if mode == "prefill":
        return {"role": mode, "reserved_decode_tokens": None}
    text = flag_value(argv, "--num-reserved-decode-tokens")
    reserved = RESERVED_DECODE_TOKENS if text is None else text
    if isinstance(reserved, str):
        if not reserved.isdigit() or int(reserved) > MAX_KV_TOKENS:
            raise CapacityError(
                f"--num-reserved-decode-tokens {text!r} in the launch is not a whole number "
                f"from 0 to {MAX_KV_TOKENS}"
            )
        reserved = int(reserved)
    return {"role": mode, "reserved_decode_tokens": reserved}


def check_workload(prompt_tokens, new_tokens) -> None:
    """Both None (no workload given) or each a whole number of tokens in bounds."""
    for name, value, least in (("prompt_tokens", prompt_tokens, 1), ("new_tokens", new_tokens, 0)):
        if value is not None and (not is_int(value) or not least <= value <= MAX_KV_TOKENS):
            raise CapacityError(
                f"{name} is {value!r}; needed: a whole number of tokens from {least} to "
                f"{MAX_KV_TOKENS}, or none. Fix: the plan's prompt length (kimi_prompt_tokens) "
                "or new tokens (benchmark_max_new_tokens)."
            )


def role_capacity(
    planned: dict,
    role: str,
    reserved_decode_tokens: int | None,
    workload: tuple = (None, None),
) -> dict:
    """The role's figures from a launch's plan (its kv_tokens, context_length,
    max_running_requests and whether it speculates): the tokens one request takes at the
    launch's context and at the workload (its prompt tokens and new tokens, when given), the
    requests the pool holds at each, and a warning when one request at the context length does
    not fit the role's share of the pool. The requests are capped at --max-running-requests,
    else at the 48 SGLang sets under speculative decoding: its request slots bound a prefill
    server's prompts in flight too (each keeps its slot until its KV cache is taken over)."""
    prompt_tokens, new_tokens = workload
    check_workload(prompt_tokens, new_tokens)
    kv_tokens, context = planned["kv_tokens"], planned["context_length"]
    reserve = reserved_decode_tokens or 0
    at_context = context + reserve
    per_request = None
    if prompt_tokens is not None and new_tokens is not None:
        per_request = prompt_tokens if role == "prefill" else prompt_tokens + new_tokens + reserve
    speculative = (planned.get("verify_tokens") or 1) > 1 or bool(
        planned.get("draft_weights_gib_per_gpu")
    )
    cap = planned.get("max_running_requests")
    if cap is None and speculative:
        cap = SPEC_MAX_RUNNING_REQUESTS

    def held(tokens: int | None) -> int | None:
        if tokens is None:
            return None
        # A launch whose weights leave no pool plans a context of 0: no request fits.
        count = kv_tokens // tokens if tokens > 0 else 0
        return min(count, cap) if is_int(cap) and cap >= 0 else count

    warning = None
    if role == "decode" and at_context > kv_tokens:
        warning = (
            f"a decode server admits a request only with {reserve} tokens "
            "(--num-reserved-decode-tokens) free beside its context: one request at "
            f"context_length {context} needs {at_context} of the {kv_tokens} KV tokens, so the "
            f"longest prompts wait forever. Fix: kimi_context_length {max(kv_tokens - reserve, 1)} "
            "or less, or a smaller --num-reserved-decode-tokens"
        )
    return {
        "role": role,
        "holds": HOLDS[role],
        "cuda_graph": role != "prefill",
        "reserved_decode_tokens": reserved_decode_tokens,
        "tokens_per_request_at_context": at_context,
        "requests_at_context": held(at_context),
        "workload_tokens_per_request": per_request,
        "requests_at_workload": held(per_request),
        "fits_one_request_at_context": 0 < at_context <= kv_tokens,
        "warning": warning,
    }
