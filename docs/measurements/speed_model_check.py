"""The speed model beside every measured figure it has: predicted, measured and their ratio.

    .venv/bin/python docs/measurements/speed_model_check.py [--calibration FILE] > table.md

Standard library and the kit's module_utils only. Each row names where its measured figure
comes from; docs/speed-model.md carries the table this printed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The kit's stages under the names Ansible ships them with (module_utils/__init__.py).
sys.path.insert(0, str(REPO))
importlib.import_module("module_utils")
speed_inputs = importlib.import_module("ansible.module_utils.plan.speed_inputs")
speed_model = importlib.import_module("ansible.module_utils.plan.speed_model")

# One TP8 rank's slice of one K2.6 MoE layer on one H200 (issue 31, DESIGN.md third build).
H200_MOE_SLICE = {1: 0.08, 8: 0.31, 17: 0.54, 33: 0.80, 65: 1.16, 129: 1.44, 257: 1.58}
K26 = REPO / "models" / "kimi-k2.6"
QWEN = REPO / "models" / "qwen3.6-27b"
DFLASH = ["--speculative-algorithm", "DFLASH", "--speculative-dflash-block-size", "8"]


def moe_rows(figures: dict, measured: dict, source: str) -> list[tuple]:
    rows = []
    for tokens, ms in measured.items():
        layer = speed_model.moe_layer(
            tokens,
            384,
            8,
            7168,
            256,
            2,
            figures["copy_gbs"],
            figures["gemm_bandwidth_efficiency"],
            figures["moe_layer_overhead_us"],
        )
        rows.append(
            (
                f"{source}: one MoE layer slice, {tokens} tokens ({layer['experts_touched']:.1f} "
                "experts)",
                "ms",
                layer["step_ms"],
                ms,
            )
        )
    return rows


def whole_model_rows() -> list[tuple]:
    k26 = speed_inputs.model_inputs(K26)
    qwen = speed_inputs.model_inputs(QWEN)
    ct200 = speed_inputs.profile_figures("ct200")
    rows = []
    # Community K2.6 AR on 8x RTX PRO 6000 (DESIGN.md): 807.5 tok/s at concurrency 32; its
    # prompt and output lengths are not given: 2,048 tokens of context assumed.
    ar = speed_model.predict_launch(k26, ct200, [], 32, 2048, 8)
    rows.append(("K2.6 AR, ct200 TP8, concurrency 32 (community)", "tok/s", ar["tokens_per_s"],
                 807.5))  # fmt: skip
    # The K2.6 DFlash card: 2577 tok/s at concurrency 32 on GSM8K; its hardware is not given
    # (an 8x H200 assumed) and its acceptance is 3.6-4.9 by dataset (4.9 assumed for GSM8K).
    card = speed_model.predict_launch(
        k26, speed_inputs.profile_figures("h200"), DFLASH, 32, 2048, 8, accept_length=4.9,
        max_running_requests=48,
    )  # fmt: skip
    rows.append(("K2.6 DFlash, h200 TP8 (assumed), concurrency 32, GSM8K (drafter card)", "tok/s",
                 card["tokens_per_s"], 2577.0))  # fmt: skip
    # The hybrid control: Qwen3.6-27B on one RTX PRO 6000 (TP1), DDTree with the measured
    # tokens/s and the study's own step time estimates; acceptance as the study estimated it.
    published = {15: (173.4, 87.0, 15.0), 32: (92.0, 80.0, 5.0), 64: (64.3, 77.0, 4.0)}
    for budget, (rate, step_ms, accepted) in published.items():
        argv = ["--speculative-algorithm", "DDTREE", "--speculative-dflash-block-size", "16",
                "--speculative-ddtree-budget", str(budget)]  # fmt: skip
        one = speed_model.predict_launch(qwen, ct200, argv, 1, 2048, 1, accept_length=accepted)
        rows.append((f"Qwen3.6-27B DDTree b{budget}, ct200 TP1, step time (study's estimate)",
                     "ms", one["step_ms"], step_ms))  # fmt: skip
        rows.append((f"Qwen3.6-27B DDTree b{budget}, ct200 TP1, with the study's acceptance",
                     "tok/s", one["tokens_per_s"], rate))  # fmt: skip
    return rows


def main(argv=None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--calibration", help="a calibration record to compare as well")
    options = args.parse_args(argv)
    rows = moe_rows(speed_inputs.profile_figures("h200"), H200_MOE_SLICE, "h200 profile")
    if options.calibration:
        record = json.loads(Path(options.calibration).read_text())
        figures = speed_inputs.apply_calibration(speed_inputs.profile_figures("h200"), record)
        measured = {row["tokens"]: row["ms"] for row in record["moe"]["rows"]}
        rows += moe_rows(figures, measured, "calibration fit")
        rows += moe_rows(speed_inputs.profile_figures("h200"), measured, "h200 profile vs run")
    rows += whole_model_rows()
    print("| what | unit | predicted | measured | predicted / measured |")
    print("|---|---|---|---|---|")
    for what, unit, predicted, measured in rows:
        print(f"| {what} | {unit} | {predicted:.3f} | {measured:g} | {predicted / measured:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
