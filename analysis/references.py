"""Published figures the plots may draw beside measured ones, each with its source.

They are context, not targets: other models, other hardware, other settings. Values are kept
as published, estimates marked as such, and nothing is derived to make them agree.
"""

from __future__ import annotations

import json
from pathlib import Path

# DFlash acceptance length on Kimi K2.5 (not K2.6), block size 8, per prompt set, from the
# z-lab DFlash drafter's published evaluation. Keys are the kit's prompt set names. The figures
# live in the model folder (models/kimi-k2.6/acceptance.json), where the speed model reads them.
_K26_ACCEPTANCE = json.loads(
    (Path(__file__).resolve().parents[1] / "models" / "kimi-k2.6" / "acceptance.json").read_text()
)
DFLASH_K25_ACCEPT = {
    "source": "DFlash on Kimi K2.5 (not K2.6), published",
    "model": "Kimi K2.5",
    "accept_length": dict(_K26_ACCEPTANCE["dflash"]["accept_length"]),
}
# The K2.6 drafter's card (z-lab/Kimi-K2.6-DFlash on the Hugging Face hub), as the kit's design
# notes summarise it: acceptance length 3.6 to 4.9 depending on the dataset, and 2577 output
# tokens/s at concurrency 32 on GSM8K. No per-dataset acceptance is kept: the notes give only
# the range, and a value that cannot be cited is not drawn. The card's hardware and settings
# are not in the notes, so the throughput point is another setup's.
DFLASH_K26_CARD = {
    "source": "DFlash on Kimi K2.6, drafter card",
    "model": "Kimi K2.6",
    "accept_length_range": (3.6, 4.9),
    "accept_length": {},
    "throughput": {"prompt_set": "gsm8k", "concurrency": 32, "output_tokens_per_s": 2577.0},
}

# EAGLE-3 drafter for K2.6 (lightseekorg/kimi-k2.6-eagle3.1-mla): acceptance about 3.2 on GSM8K.
EAGLE3_K26_ACCEPT = {
    "source": "EAGLE-3 on Kimi K2.6 (lightseekorg model card)",
    "accept_length": dict(_K26_ACCEPTANCE["eagle3"]["accept_length"]),
}

# DDTree on a hybrid model: Qwen3.6-27B (attention plus recurrent GDN layers) with its DFlash
# drafter, 8x RTX PRO 6000 Blackwell at TP1. Throughput fell with the budget although step time
# fell: accepted tokens per step collapsed (sibling branches share recurrent state). The study
# measured tokens/s and estimated (~) step time and accepted tokens per step. The estimates do
# not multiply out to the measured throughput (1000 x ~5 / ~80 ms = 62.5 tok/s against 92
# measured at budget 32): both are kept as published.
DDTREE_HYBRID = {
    "source": "DDTree on Qwen3.6-27B (hybrid attention + GDN), 8x RTX PRO 6000, TP1: published",
    "model": "Qwen3.6-27B (hybrid attention + GDN)",
    "hardware": "8x RTX PRO 6000 Blackwell, TP1",
    "measured": ("tokens_per_s",),
    "estimated": ("step_ms", "accepted_tokens_per_step"),
    "points": [
        {"budget": 15, "tokens_per_s": 173.4, "step_ms": 87.0, "accepted_tokens_per_step": 15.0},
        {"budget": 32, "tokens_per_s": 92.0, "step_ms": 80.0, "accepted_tokens_per_step": 5.0},
        {"budget": 64, "tokens_per_s": 64.3, "step_ms": 77.0, "accepted_tokens_per_step": 4.0},
    ],
}


def estimated_tokens_per_s(point: dict) -> float:
    """What a published point's estimates give: accepted tokens per step / step time."""
    return 1000.0 * point["accepted_tokens_per_step"] / point["step_ms"]
