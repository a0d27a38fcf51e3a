"""A launch's context length: what one request can use of the KV pool, the model's positions
and, under DDTree, the tree mask every step builds; a user's --context-length checked against
them (capacity.plan() calls context_fit()).

DDTree's tree mask (pull request 29907 at 93e9850e): every step builds a (budget + 1) x
(prefix + budget + 1) boolean mask per running request, outside SGLang's static pool (which
holds weights and caches): at context 262,144 and budget 128 about 34 MB a request, 1.6 GB a
step at 48 running requests. It must fit what mem_fraction_static leaves of the usable memory,
which activations and CUDA graphs share: the longest context at which it does is a bound, not a
promise.
"""

from __future__ import annotations

from ansible.module_utils.plan.capacity_common import (
    GIB,
    MAX_KV_TOKENS,
    CapacityError,
    is_int,
    text_config,
)
from ansible.module_utils.plan.capacity_hybrid import SPEC_MAX_RUNNING_REQUESTS

MAX_DDTREE_BUDGET = 4096


def check_ddtree_budget(budget) -> None:
    """None (not DDTree) or a budget from 1 to MAX_DDTREE_BUDGET."""
    if budget is not None and (not is_int(budget) or not 1 <= budget <= MAX_DDTREE_BUDGET):
        raise CapacityError(
            f"ddtree_budget is {budget!r}; needed: a whole number from 1 to {MAX_DDTREE_BUDGET} "
            "(--speculative-ddtree-budget). Fix: the DDTree config's budget."
        )


def check_context_length(value) -> int | None:
    """None for `auto`, else the user's --context-length as an int (1 to MAX_KV_TOKENS)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not is_int(value) or not 1 <= value <= MAX_KV_TOKENS:
        raise CapacityError(
            f"context_length is {value!r}; needed: auto or a whole number of tokens from 1 to "
            f"{MAX_KV_TOKENS}. Fix: kimi_context_length."
        )
    return value


def tree_mask(budget: int | None, running: int | None, headroom: float) -> dict | None:
    """DDTree's tree mask: the running requests it is built for (the launch's cap, else
    SGLang's under speculative decoding), the memory outside the static pool it must fit
    (headroom, bytes) and the longest context at which it does. None without a budget (not
    DDTree)."""
    if budget is None:
        return None
    requests = running if running else SPEC_MAX_RUNNING_REQUESTS
    per_context_token = requests * (budget + 1)
    return {
        "budget": budget,
        "requests": requests,
        "headroom": headroom,
        "max_context": max(0, int(headroom // per_context_token) - budget - 1),
    }


def tree_mask_bytes(mask: dict, context: int) -> int:
    """One step's masks: (budget + 1) x (context + budget + 1) booleans per running request."""
    budget = mask["budget"]
    return mask["requests"] * (budget + 1) * (context + budget + 1)


def context_fit(
    kv_tokens: int, model_config: dict, requested: int | None, mask: dict | None = None
) -> dict:
    """The launch's context length and whether one request at that length fits the KV pool.

    max_context_length is the longest one request can use: the pool, capped at the model's
    max_position_embeddings (when the config has one) and, under DDTree, at the longest
    context whose tree mask (tree_mask()) fits. `auto` (requested None) takes it; a user value
    is kept as is, with a warning when one request at that length overflows the pool (SGLang
    then cuts requests at the pool), passes max_position_embeddings (SGLang refuses to start
    without SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN) or makes a step's tree mask outgrow
    the memory outside the static pool (out of memory mid-run)."""
    positions = text_config(model_config).get("max_position_embeddings")
    longest = min(kv_tokens, positions) if is_int(positions) else kv_tokens
    if mask is not None:
        # At least one token: a launch needs a context length, and the warning says why not.
        longest = max(1, min(longest, mask["max_context"]))
    context = longest if requested is None else requested
    warning = None
    if requested is not None and is_int(positions) and requested > positions:
        warning = (
            f"context_length {requested} is above the model's max_position_embeddings "
            f"{positions}: SGLang refuses to start unless "
            "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1, and outputs past it are unreliable. "
            f"Fix: kimi_context_length at most {positions}, or auto"
        )
    elif requested is not None and requested > kv_tokens:
        warning = (
            f"one request at context_length {requested} does not fit the KV pool of "
            f"{kv_tokens} tokens: SGLang cuts longer requests at the pool. Fix: "
            f"kimi_context_length {longest} or less (auto takes it), a higher "
            "mem_fraction_static, kv_cache_dtype fp8_e4m3, or a config without a drafter"
        )
    elif mask is not None and context > mask["max_context"]:
        warning = (
            f"DDTree's tree mask at context_length {context} takes "
            f"{tree_mask_bytes(mask, context) / GIB:.2f} GiB a step for {mask['requests']} "
            f"running requests at budget {mask['budget']}, more than the "
            f"{mask['headroom'] / GIB:.2f} GiB the static pool leaves (1 - mem_fraction_static): "
            "the server runs out of memory once requests grow that long. Fix: "
            + (
                f"kimi_context_length {mask['max_context']} or less (auto takes it), a smaller "
                if mask["max_context"] >= 1
                else "no context fits: a smaller "
            )
            + "budget, fewer running requests (--max-running-requests) or a lower "
            "mem_fraction_static"
        )
    return {
        "context_length": context,
        "context_length_source": "auto" if requested is None else "user",
        "max_context_length": longest,
        "context_length_fits": warning is None,
        "context_length_warning": warning,
        "tree_mask_gib": None if mask is None else round(tree_mask_bytes(mask, context) / GIB, 2),
        "tree_mask_running_requests": None if mask is None else mask["requests"],
        "tree_mask_max_context": None if mask is None else mask["max_context"],
    }
