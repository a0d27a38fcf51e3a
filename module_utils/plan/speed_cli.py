"""The speed model's command line (docs/speed-model.md): `predict` one serving config's decode
step, or `moe` one MoE layer's routed experts, as JSON on stdout. Run it as
`python3 module_utils/plan/speed_model.py predict|moe ...`, which works bare.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ansible.module_utils.contract.profiles import PROFILES
from ansible.module_utils.plan.speed_inputs import (
    ALGORITHMS,
    MAX_BUDGET,
    SpeedModelError,
    apply_allreduce,
    apply_calibration,
    bounded,
    load_acceptance,
    load_config,
    load_hardware,
    profile_figures,
    published_acceptance,
    read_json,
    spec,
)
from ansible.module_utils.plan.speed_model import ddtree_curve, moe_layer, predict


def _cli_figures(args) -> dict:
    hardware = load_hardware(args.hardware) if args.hardware else load_hardware()
    figures = profile_figures(args.profile, hardware)
    if args.calibration:
        figures = apply_calibration(figures, read_json(Path(args.calibration), "calibration"))
    if args.allreduce:
        figures = apply_allreduce(
            figures,
            read_json(Path(args.allreduce), "all-reduce record"),
            f"the all-reduce record {args.allreduce}",
        )
    return figures


def _cli_predict(args) -> dict:
    model_dir = Path(args.model)
    config = load_config(model_dir / "config.json", "the model config")
    algorithm = args.algorithm.upper()
    drafter_name = {"EAGLE3": "eagle3", "DFLASH": "dflash", "DDTREE": "dflash"}.get(algorithm)
    draft_config = None
    if drafter_name:
        draft_dir = Path(args.drafter) if args.drafter else model_dir / drafter_name
        draft_config = load_config(draft_dir / "config.json", "the drafter config")
    block = args.draft_tokens or (draft_config or {}).get("block_size") or 8
    if algorithm == "EAGLE3":
        shape = spec("EAGLE3", draft_tokens=args.draft_tokens or 4, steps=args.steps)
    elif algorithm == "AR":
        shape = spec("AR")
    else:
        shape = spec(algorithm, draft_tokens=block, budget=args.budget, overlap=not args.no_overlap)
    chain, source = (None, "")
    if drafter_name:
        chain, source = published_acceptance(
            load_acceptance(model_dir), drafter_name, args.prompt_set
        )
        if args.accept_length is not None:
            chain = bounded(args.accept_length, "--accept-length", high=MAX_BUDGET)
            source = "--accept-length"
    figures = _cli_figures(args)
    options = {
        "kv_cache_dtype": args.kv_cache_dtype,
        "max_running_requests": args.max_running_requests,
        "acceptance_source": source,
    }
    result = predict(
        config,
        draft_config,
        figures,
        shape,
        args.concurrency,
        args.context,
        args.tp,
        chain,
        **options,
    )
    result["profile"] = args.profile
    result["sources"] = figures["sources"]
    if algorithm == "DDTREE" and args.budgets:
        budgets = [
            bounded(int(b), "--budgets", high=MAX_BUDGET, integer=True)
            for b in args.budgets.split(",")
        ]
        result["ddtree"] = ddtree_curve(
            config,
            draft_config,
            figures,
            shape,
            budgets,
            args.concurrency,
            args.context,
            args.tp,
            chain,
            **options,
        )
    return result


def _cli_moe(args) -> dict:
    return moe_layer(
        args.tokens,
        args.experts,
        args.top_k,
        args.hidden,
        args.intermediate,
        args.weight_bytes,
        args.hbm_gbs,
        args.efficiency,
        args.overhead_us,
    )


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="speed_model.py", description="Predict SGLang decode step times (docs/speed-model.md)."
    )
    commands = top.add_subparsers(dest="command", required=True)
    moe = commands.add_parser("moe", help="one MoE layer's routed experts for one step")
    moe.add_argument("--tokens", type=int, required=True, help="tokens the step verifies")
    moe.add_argument("--experts", type=int, required=True, help="routed experts (E)")
    moe.add_argument("--top-k", type=int, required=True, help="experts per token (k)")
    moe.add_argument("--hidden", type=int, required=True)
    moe.add_argument(
        "--intermediate",
        type=int,
        required=True,
        help="one expert's intermediate size as read (one TP rank's slice)",
    )
    moe.add_argument(
        "--weight-bytes",
        type=float,
        required=True,
        help="bytes per weight: 2 for BF16, 0.5625 for INT4 with group-32 scales",
    )
    moe.add_argument("--hbm-gbs", type=float, required=True, help="copy bandwidth, GB/s")
    moe.add_argument(
        "--efficiency",
        type=float,
        default=1.0,
        help="share of the bandwidth the grouped GEMM reaches (default 1)",
    )
    moe.add_argument("--overhead-us", type=float, default=0.0, help="fixed cost per layer")
    one = commands.add_parser("predict", help="one serving config's decode step")
    one.add_argument("--model", required=True, help="model folder (config.json, acceptance.json)")
    one.add_argument("--drafter", help="drafter folder (default: <model>/<dflash|eagle3>)")
    one.add_argument("--profile", required=True, help=f"hardware profile: {', '.join(PROFILES)}")
    one.add_argument(
        "--algorithm", default="AR", choices=[a.lower() for a in ALGORITHMS] + list(ALGORITHMS)
    )
    one.add_argument("--draft-tokens", type=int, help="EAGLE-3 draft tokens or DFlash block size")
    one.add_argument("--steps", type=int, help="EAGLE-3 steps")
    one.add_argument("--budget", type=int, help="DDTree node budget")
    one.add_argument("--budgets", help="DDTree: also predict these budgets, comma separated")
    one.add_argument("--no-overlap", action="store_true", help="overlap scheduling off")
    one.add_argument("--concurrency", type=int, default=1)
    one.add_argument("--context", type=int, default=2048, help="tokens of context per request")
    one.add_argument("--tp", type=int, default=8)
    one.add_argument("--prompt-set", help="the published acceptance's prompt set (e.g. gsm8k)")
    one.add_argument("--accept-length", type=float, help="chain acceptance length to assume")
    one.add_argument("--kv-cache-dtype", default="auto")
    one.add_argument("--max-running-requests", type=int)
    one.add_argument("--hardware", help="hardware figures file (default: the kit's)")
    one.add_argument("--calibration", help="a host's calibration record")
    one.add_argument("--allreduce", help="a host's all-reduce check record")
    return top


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        result = _cli_moe(args) if args.command == "moe" else _cli_predict(args)
    except SpeedModelError as error:
        print(f"speed_model: {error}", file=sys.stderr)
        return 2
    json.dump(result, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0
