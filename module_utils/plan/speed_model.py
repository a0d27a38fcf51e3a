"""A speed model of one SGLang decode step: what a healthy run should show before it runs.

For a model (its config.json and its drafter's), a hardware profile, a serving config and a
concurrency, the decode step time is the sum of its parts, each shown with what it reads,
what it computes and which of the two bounds it:

- dense_weights: every weight a step reads once (attention, norms, the dense MLP layers, the
  shared experts, the router, the LM head) per TP rank, over the copy bandwidth times the
  share a large GEMV reaches, or its FLOPs over the BF16 peak where that is longer.
- routed_experts: per MoE layer, the routed experts that T verified tokens touch,
  E * (1 - (1 - k/E)^T) of E with k per token, times one rank's slice of an expert (INT4 with
  its group scales where quantized), over the bandwidth the grouped GEMM reaches, plus a fixed
  cost per layer; both fitted to a measured MoE layer (calibration record or the profile's).
  T is every token the step verifies: the batch times 1 (AR), the draft tokens (EAGLE-3 chain),
  the block size (DFlash) or budget + 1 (DDTree), so on an MoE target a wider tree reads more
  experts until it reads them all.
- kv_cache: the KV cache each request's context reads per step (MLA's latent is not split
  over ranks); on a hybrid target also the recurrent state.
- allreduce: two TP all-reduces a layer of the step's hidden states, each a latency plus the
  message over the bus bandwidth (the host's measured all-reduce table where the tuning stage
  has one, else the profile's figure).
- drafter: the drafter's own forward (one DFlash block, or EAGLE-3's steps), its weights, the
  LM head it projects through and its all-reduces.
- tree_build: DDTree's per-request tree and mask, built on the CPU per step.
- overhead: a fixed per-step cost, plus the scheduler's when overlap scheduling is off.

Accepted tokens per step come from the drafter's published acceptance length per prompt set
(models/<model>/acceptance.json), capped by what one step can accept. For DDTree the chain's
acceptance gives a per-position rate a (1 + a + ... + a^D = the chain's length), and the tree
is built best first under its budget with a geometric rank model (the drafter's r-th choice is
right with a * (1 - a)^(r - 1)), so the expected accepted tokens are 1 plus the path
probabilities of the nodes the budget buys, capped at the block size.

Every hardware figure is data with its source (group_vars/all/speed_hardware.json); a host's
calibration record (--tags calibrate) replaces the measured ones. Those inputs, the launch's
shape and the acceptance are read in speed_inputs.py, the command line is speed_cli.py.
Standard library only: it runs bare, `python3 module_utils/plan/speed_model.py --help`, and its
`moe` subcommand predicts one MoE layer. docs/speed-model.md gives every formula, what the
model ignores and how far it was off on the measurements it has.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run bare: python3 module_utils/plan/speed_model.py
    # The repository root, whose module_utils package makes the kit's stages importable as
    # ansible.module_utils.<stage>, with or without Ansible installed.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import module_utils  # noqa: F401

from ansible.module_utils.plan import capacity
from ansible.module_utils.plan.speed_inputs import (
    DRAFTER_OF,
    MAX_BUDGET,
    MAX_CONCURRENCY,
    MAX_CONTEXT,
    MAX_EXPERTS,
    MAX_RATE,
    MAX_TOKENS,
    MAX_WIDTH,
    SpeedModelError,
    accepted_per_step,
    allreduce_us,
    bounded,
    published_acceptance,
    spec,
    spec_from_argv,
)

BF16 = 2
ALLREDUCES_PER_LAYER = 2  # after attention and after the MLP/MoE (o_proj, down_proj)


# --------------------------------------------------------------------------------------------
# One MoE layer.


def experts_touched(tokens: int, experts: int, top_k: int) -> float:
    """Expected distinct experts that `tokens` tokens routed top-k uniformly touch."""
    bounded(tokens, "tokens", high=MAX_TOKENS, integer=True)
    bounded(experts, "experts", high=MAX_EXPERTS, integer=True)
    bounded(top_k, "top_k", high=MAX_EXPERTS, integer=True)
    if top_k > experts:
        raise SpeedModelError(
            f"top_k {top_k} is more than the {experts} experts; needed: top_k <= experts. Fix: "
            "give the model's num_experts_per_tok and n_routed_experts."
        )
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def moe_layer(
    tokens: int,
    experts: int,
    top_k: int,
    hidden: int,
    intermediate: int,
    weight_bytes: float,
    bandwidth_gbs: float,
    efficiency: float = 1.0,
    overhead_us: float = 0.0,
    tflops: float | None = None,
) -> dict:
    """One MoE layer's routed experts for one step: `intermediate` is one expert's as it is
    read (one rank's slice under TP), `weight_bytes` per weight (2 for BF16, 0.5625 for INT4
    with a BF16 scale per 32), the bandwidth the copy reaches and the grouped GEMM's share of
    it. Time is the bytes read over that, or the FLOPs over `tflops` where longer, plus the
    fixed cost per layer."""
    touched = experts_touched(tokens, experts, top_k)
    bounded(hidden, "hidden", high=MAX_WIDTH, integer=True)
    bounded(intermediate, "intermediate", high=MAX_WIDTH, integer=True)
    bounded(weight_bytes, "weight_bytes", high=64)
    bounded(bandwidth_gbs, "hbm_gbs")
    bounded(efficiency, "efficiency", high=1.0)
    if isinstance(overhead_us, bool) or not isinstance(overhead_us, (int, float)):
        raise SpeedModelError(f"overhead_us is {overhead_us!r}; needed: a number >= 0.")
    if not (math.isfinite(overhead_us) and 0 <= overhead_us <= MAX_RATE):
        raise SpeedModelError(f"overhead_us is {overhead_us!r}; needed: >= 0 and finite.")
    expert_params = 3 * hidden * intermediate  # gate, up and down projections
    bytes_read = touched * expert_params * weight_bytes
    memory_ms = bytes_read / (bandwidth_gbs * efficiency * 1e9) * 1e3
    flops = 2.0 * tokens * top_k * expert_params
    compute_ms = flops / (bounded(tflops, "tflops") * 1e12) * 1e3 if tflops else 0.0
    return {
        "tokens": tokens,
        "experts_touched": round(touched, 3),
        "all_experts_read": touched >= experts - 0.5,
        "bytes_read": round(bytes_read),
        "memory_ms": round(memory_ms, 4),
        "compute_ms": round(compute_ms, 4),
        "bound": "compute" if compute_ms > memory_ms else "memory",
        "step_ms": round(max(memory_ms, compute_ms) + overhead_us / 1e3, 4),
    }


# --------------------------------------------------------------------------------------------
# One decode step.


def _part(bytes_read: float, flops: float, figures: dict, efficiency_field: str, tflops_field):
    bandwidth = figures["copy_gbs"] * figures[efficiency_field] * 1e9
    memory_ms = bytes_read / bandwidth * 1e3
    compute_ms = flops / (figures[tflops_field] * 1e12) * 1e3
    return {
        "bytes_read": round(bytes_read),
        "flops": round(flops),
        "memory_ms": memory_ms,
        "compute_ms": compute_ms,
        "bound": "compute" if compute_ms > memory_ms else "memory",
        "ms": max(memory_ms, compute_ms),
    }


DENSE_SKIPPED = {"routed_experts", "embedding", "vision_tower"}


def _per_rank(group: dict, tp_size: int) -> float:
    ways = min(tp_size, group.get("split_max", tp_size)) if group["split"] else 1
    return group["params"] / ways


def step_parts(
    model_config: dict,
    draft_config: dict | None,
    figures: dict,
    shape: dict,
    batch: int,
    context_tokens: int,
    tp_size: int,
    kv_cache_dtype: str = "auto",
    sizes: dict | None = None,
) -> dict:
    """Every part of one decode step of `batch` requests at `context_tokens` each, in ms on
    one TP rank (the ranks run in step). `sizes`: a mapping kept by a caller that asks again of
    the same target config (ddtree_curve), which holds what _target_sizes read of it."""
    bounded(batch, "concurrency", high=MAX_CONCURRENCY, integer=True)
    bounded(context_tokens, "context tokens", high=MAX_CONTEXT, integer=True)
    bounded(tp_size, "tp_size", high=capacity.MAX_TP, integer=True)
    sizes = {} if sizes is None else sizes
    key = (kv_cache_dtype, tp_size)
    if key not in sizes:
        sizes[key] = _target_sizes(model_config, kv_cache_dtype, tp_size)
    target = sizes[key]
    tokens = batch * shape["verify_tokens"]
    parts: dict[str, dict] = {"dense_weights": _dense_part(target, tokens, tp_size, figures)}
    if target["cfg"].get("n_routed_experts"):
        parts["routed_experts"] = _routed_experts_part(target, tokens, tp_size, figures)
    parts["kv_cache"] = _kv_cache_part(target, shape, batch, context_tokens, tp_size, figures)
    parts["allreduce"] = _allreduce_part(target["cfg"], tokens, tp_size, figures)
    if shape["algorithm"] != "AR" and draft_config is not None:
        parts["drafter"] = drafter_part(
            draft_config,
            target["groups"],
            figures,
            shape,
            batch,
            tp_size,
            context_tokens,
            kv_cache_dtype,
        )
    if shape["algorithm"] == "DDTREE":
        parts["tree_build"] = _tree_build_part(shape, batch, context_tokens, figures)
    parts["overhead"] = _overhead_part(shape, figures)
    for part in parts.values():
        for key in ("ms", "memory_ms", "compute_ms"):
            if key in part:
                part[key] = round(part[key], 4)
    return parts


def _target_sizes(model_config: dict, kv_cache_dtype: str, tp_size: int) -> dict:
    """What the step reads of the target: its parameter groups, its text config, the KV bytes
    per token and the recurrent state per request on one rank."""
    try:
        return {
            "groups": capacity.target_parameters(model_config),
            "cfg": capacity.text_config(model_config),
            "kv_per_token": capacity.target_kv_bytes_per_token(
                model_config, kv_cache_dtype, tp_size
            ),
            "state_bytes": capacity.recurrent_state_bytes(model_config, tp_size, None),
            "hybrid": capacity.is_hybrid(model_config),
        }
    except (capacity.CapacityError, KeyError, TypeError) as error:
        raise SpeedModelError(f"the model config cannot be modelled: {error}") from None


def _dense_part(target: dict, tokens: int, tp_size: int, figures: dict) -> dict:
    """Every weight but the routed experts (and the embedding and vision tower, which a decode
    step does not run), read once per step on one rank."""
    dense_params = sum(
        _per_rank(group, tp_size)
        for name, group in target["groups"].items()
        if name not in DENSE_SKIPPED and group.get("served", True)
    )
    return _part(
        dense_params * BF16,
        2.0 * dense_params * tokens,
        figures,
        "dense_bandwidth_efficiency",
        "bf16_tflops",
    )


def _routed_experts_part(target: dict, tokens: int, tp_size: int, figures: dict) -> dict:
    """The routed experts the step's tokens touch, over every MoE layer."""
    cfg, hidden = target["cfg"], target["cfg"]["hidden_size"]
    experts = cfg["n_routed_experts"]
    moe_layers = cfg["num_hidden_layers"] - min(
        cfg.get("first_k_dense_replace", 0), cfg["num_hidden_layers"]
    )
    intermediate = cfg["moe_intermediate_size"] // tp_size
    layer = moe_layer(
        tokens,
        experts,
        cfg["num_experts_per_tok"],
        hidden,
        max(1, intermediate),
        target["groups"]["routed_experts"]["bytes"],
        figures["copy_gbs"],
        figures["gemm_bandwidth_efficiency"],
        figures["moe_layer_overhead_us"],
        figures["int4_tflops"],
    )
    return {
        "bytes_read": layer["bytes_read"] * moe_layers,
        "flops": round(2.0 * tokens * cfg["num_experts_per_tok"] * 3 * hidden * intermediate)
        * moe_layers,
        "memory_ms": layer["memory_ms"] * moe_layers,
        "compute_ms": layer["compute_ms"] * moe_layers,
        "bound": layer["bound"],
        "ms": layer["step_ms"] * moe_layers,
        "experts_touched_per_layer": layer["experts_touched"],
        "experts": experts,
        "moe_layers": moe_layers,
        "tokens": tokens,
    }


def _kv_cache_part(
    target: dict, shape: dict, batch: int, context_tokens: int, tp_size: int, figures: dict
) -> dict:
    """Each request reads its whole context's KV once a step (its verified tokens share it);
    a recurrent layer's state is read and, per verified token, written."""
    cfg = target["cfg"]
    tokens = batch * shape["verify_tokens"]
    kv_bytes = batch * context_tokens * target["kv_per_token"]
    kv_bytes += batch * target["state_bytes"] * (1 + shape["verify_tokens"])
    heads = max(1, cfg["num_attention_heads"] // tp_size)
    head_width = (cfg.get("kv_lora_rank") or cfg.get("head_dim", 128)) + (
        cfg.get("qk_rope_head_dim") or 0
    )
    attention_layers = (
        cfg["layer_types"].count("full_attention") if target["hybrid"] else cfg["num_hidden_layers"]
    )
    attention_flops = 4.0 * tokens * heads * context_tokens * head_width * attention_layers
    return _part(kv_bytes, attention_flops, figures, "dense_bandwidth_efficiency", "bf16_tflops")


def _allreduce_part(cfg: dict, tokens: int, tp_size: int, figures: dict) -> dict:
    """Two TP all-reduces a layer of the step's hidden states."""
    allreduces = ALLREDUCES_PER_LAYER * cfg["num_hidden_layers"]
    message = tokens * cfg["hidden_size"] * BF16
    one_us = allreduce_us(figures, message, tp_size)
    return {
        "count": allreduces if tp_size > 1 else 0,
        "message_bytes": message,
        "ms": allreduces * one_us / 1e3,
    }


def _tree_build_part(shape: dict, batch: int, context_tokens: int, figures: dict) -> dict:
    """DDTree's per-request tree and attention mask, built on the CPU each step."""
    mask_bytes = (shape["budget"] + 1) * (context_tokens + shape["budget"] + 1)
    per_request_us = figures["tree_build_us_per_request"] + mask_bytes / (
        figures["host_mask_gbs"] * 1e3
    )
    return {"mask_bytes_per_request": mask_bytes, "ms": batch * per_request_us / 1e3}


def _overhead_part(shape: dict, figures: dict) -> dict:
    """A fixed cost per step, plus the scheduler's when overlap scheduling is off."""
    overhead = figures["step_overhead_ms"] + (
        0.0 if shape["overlap"] else figures["scheduler_overhead_ms"]
    )
    return {"overlap": shape["overlap"], "ms": overhead}


def drafter_part(
    draft_config, target_groups, figures, shape, batch, tp_size, context_tokens, kv_cache_dtype
) -> dict:
    """The drafter's forwards in one step: DFlash (and DDTree over it) one block forward;
    EAGLE-3 one forward per step of its chain. Each reads the drafter's weights and the LM head
    it projects through, and the drafter's KV over its window."""
    try:
        groups = capacity.draft_parameters(draft_config)
        kv_per_token = capacity.draft_kv_bytes_per_token(draft_config, kv_cache_dtype, tp_size)
    except (capacity.CapacityError, KeyError, TypeError) as error:
        raise SpeedModelError(f"the drafter config cannot be modelled: {error}") from None
    params = sum(_per_rank(group, tp_size) for group in groups.values())
    if "lm_head" not in groups:  # DFlash projects through the target's LM head
        params += _per_rank(target_groups["lm_head"], tp_size)
    window = int(draft_config.get("draft_window_size") or context_tokens)
    if shape["algorithm"] == "EAGLE3":
        forwards, tokens_each = shape["steps"], batch * shape["topk"]
    else:
        forwards, tokens_each = 1, batch * shape["block_size"]
    bytes_read = forwards * (params * BF16 + batch * min(window, context_tokens) * kv_per_token)
    part = _part(
        bytes_read,
        forwards * 2.0 * params * tokens_each,
        figures,
        "dense_bandwidth_efficiency",
        "bf16_tflops",
    )
    layers = draft_config["num_hidden_layers"]
    message = tokens_each * draft_config["hidden_size"] * BF16
    allreduce_ms = (
        forwards * ALLREDUCES_PER_LAYER * layers * allreduce_us(figures, message, tp_size) / 1e3
    )
    part.update(forwards=forwards, allreduce_ms=allreduce_ms, ms=part["ms"] + allreduce_ms)
    return part


def predict(
    model_config: dict,
    draft_config: dict | None,
    figures: dict,
    shape: dict,
    concurrency: int,
    context_tokens: int,
    tp_size: int,
    chain_length: float | None,
    *,
    kv_cache_dtype: str = "auto",
    max_running_requests: int | None = None,
    acceptance_source: str = "",
    sizes: dict | None = None,
) -> dict:
    """One config at one concurrency: the step time with its parts, accepted tokens per step,
    tokens/s per request and per server. Requests past the server's running cap wait, so the
    server's rate holds while each client's falls. `sizes`: step_parts' memo of the target."""
    bounded(concurrency, "concurrency", high=MAX_CONCURRENCY, integer=True)
    batch = concurrency
    if max_running_requests is not None:
        batch = min(
            batch,
            bounded(
                max_running_requests, "max_running_requests", high=MAX_CONCURRENCY, integer=True
            ),
        )
    if shape["algorithm"] != "AR" and draft_config is None:
        raise SpeedModelError(
            f"a {shape['algorithm']} config needs its drafter's config; needed: the drafter's "
            "config.json. Fix: give the drafter folder."
        )
    parts = step_parts(
        model_config,
        draft_config,
        figures,
        shape,
        batch,
        context_tokens,
        tp_size,
        kv_cache_dtype,
        sizes,
    )
    step_ms = sum(part["ms"] for part in parts.values())
    accepted = accepted_per_step(shape, chain_length)
    per_request = server = None
    if accepted is not None:
        server = batch * accepted / step_ms * 1e3
        per_request = server / concurrency
    return {
        "algorithm": shape["algorithm"],
        "concurrency": concurrency,
        "batch": batch,
        "context_tokens": context_tokens,
        "verify_tokens_per_request": shape["verify_tokens"],
        "step_ms": round(step_ms, 3),
        "parts": parts,
        "accepted_tokens_per_step": None if accepted is None else round(accepted, 3),
        "acceptance_source": acceptance_source if shape["algorithm"] != "AR" else "AR: one token",
        "tokens_per_s_per_request": None if per_request is None else round(per_request, 2),
        "tokens_per_s": None if server is None else round(server, 2),
    }


def ddtree_curve(
    model_config,
    draft_config,
    figures,
    shape: dict,
    budgets,
    concurrency,
    context_tokens,
    tp_size,
    chain_length,
    **options,
) -> dict:
    """DDTree's prediction over budgets, and the budget past which it predicts no further
    gain: where the tokens/s peaks over every budget up to the largest asked (the extra
    experts a wider tree reads cost more than the extra accepted tokens give)."""

    # Every budget up to the largest is predicted: the target config is read once for all.
    sizes: dict = {}

    def at(budget: int) -> dict:
        one = spec("DDTREE", draft_tokens=shape["block_size"], budget=budget)
        return predict(model_config, draft_config, figures, one, concurrency, context_tokens,
                       tp_size, chain_length, sizes=sizes, **options)  # fmt: skip

    points = []
    for budget in sorted(set(budgets)):
        result = at(budget)
        experts = result["parts"].get("routed_experts", {})
        points.append(
            {
                "budget": budget,
                "step_ms": result["step_ms"],
                "experts_touched_per_layer": experts.get("experts_touched_per_layer"),
                "accepted_tokens_per_step": result["accepted_tokens_per_step"],
                "tokens_per_s": result["tokens_per_s"],
            }
        )
    best = None
    if chain_length is not None:
        largest = max(max(budgets), shape["block_size"] - 1)
        best_rate = -1.0
        for budget in range(1, largest + 1):
            rate = at(budget)["tokens_per_s"]
            if rate > best_rate * (1 + 1e-9):
                best, best_rate = budget, rate
    return {"points": points, "best_budget": best}


# --------------------------------------------------------------------------------------------
# From a model folder and a rendered launch: what the plan and the report call.


def predict_launch(
    inputs: dict,
    figures: dict,
    argv,
    concurrency: int,
    context_tokens: int,
    tp_size: int,
    prompt_set: str | None = None,
    *,
    accept_length: float | None = None,
    kv_cache_dtype: str = "auto",
    max_running_requests: int | None = None,
) -> dict:
    """One rendered launch (its argv) at one concurrency: predict() with the drafter the
    algorithm uses and its published acceptance for the prompt set (or accept_length, e.g. a
    run's measured one)."""
    shape = spec_from_argv(argv)
    drafter = DRAFTER_OF.get(shape["algorithm"])
    draft_config = inputs["drafters"].get(drafter) if drafter else None
    if drafter and draft_config is None:
        raise SpeedModelError(
            f"a {shape['algorithm']} launch needs the {drafter} drafter's config; needed: "
            f"<model folder>/{drafter}/config.json. Fix: add the drafter's config to the model "
            "folder."
        )
    chain, source = (None, "")
    if drafter:
        chain, source = published_acceptance(inputs["acceptance"], drafter, prompt_set)
    if accept_length is not None and drafter:
        chain = float(bounded(accept_length, "accept_length", high=MAX_BUDGET))
        source = "given"
    result = predict(
        inputs["config"],
        draft_config,
        figures,
        shape,
        concurrency,
        context_tokens,
        tp_size,
        chain,
        kv_cache_dtype=kv_cache_dtype,
        max_running_requests=max_running_requests,
        acceptance_source=source,
    )
    result["prompt_set"] = prompt_set
    if shape["algorithm"] == "DDTREE":
        result["budget"] = shape["budget"]
    return result


if __name__ == "__main__":
    from ansible.module_utils.plan.speed_cli import main

    sys.exit(main())
