"""Published figures the plots may draw beside measured ones, each with its source.

They are context, not targets: other models, other hardware. The sources are the ones the
kit's design notes cite.
"""

from __future__ import annotations

# DFlash acceptance length on Kimi K2.5 (block size 8), per prompt set, from the z-lab DFlash
# drafter's published evaluation. Keys are the kit's prompt set names.
DFLASH_K25_ACCEPT = {
    "source": "DFlash on Kimi K2.5, block 8 (z-lab, published)",
    "accept_length": {
        "gsm8k": 5.3,
        "math500": 5.5,
        "humaneval": 5.3,
        "mbpp": 4.5,
        "mt-bench": 3.7,
    },
}

# EAGLE-3 drafter for K2.6 (lightseekorg/kimi-k2.6-eagle3.1-mla): acceptance about 3.2 on GSM8K.
EAGLE3_K26_ACCEPT = {
    "source": "EAGLE-3 on Kimi K2.6 (lightseekorg model card)",
    "accept_length": {"gsm8k": 3.2},
}

# DDTree on a hybrid-attention model (Qwen3.6-27B, Mamba/GDN layers) at TP1: throughput fell
# with the budget although step time fell, because accepted tokens per step collapsed
# (sibling branches corrupt recurrent state). Step time and tokens per step are given where
# the study gave them; tokens per step at budget 15 and 64 follow from tok/s x step time.
DDTREE_HYBRID = {
    "source": "DDTree on Qwen3.6-27B hybrid attention, TP1 (published study)",
    "points": [
        {"budget": 15, "tokens_per_s": 173.0, "step_ms": 87.0, "accepted_tokens_per_step": 15.1},
        {"budget": 32, "tokens_per_s": 92.0, "step_ms": None, "accepted_tokens_per_step": None},
        {"budget": 64, "tokens_per_s": 64.0, "step_ms": 77.0, "accepted_tokens_per_step": 4.9},
    ],
}
