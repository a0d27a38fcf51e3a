#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module capacity_plan: per-GPU weights, KV cache pool and fit verdict."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: capacity_plan
short_description: Plan per-GPU memory for serving a model with SGLang (MLA or hybrid recurrent)
description:
  - Pure computation from HF-style config.json files; changes nothing and supports check mode.
  - Models what tensor parallelism splits and what it replicates (MLA's latent KV cache is
    replicated on every rank), compressed-tensors INT4 routed experts with their group scales,
    the BF16 rest, the vision tower and an optional drafter.
  - The KV pool is what SGLang's static memory fraction leaves after the weights, in tokens.
  - Hybrid attention/recurrent targets (C(layer_types) mixing full_attention and
    linear_attention, e.g. Qwen3.6-27B) as SGLang 0.5.23 sizes them - KV cache for the
    full-attention layers only; a recurrent (conv + SSM) state per request slot, whose pool
    takes mamba_full_memory_ratio's share first; and under speculative decoding one more
    state per verified token per running request (a DDTree tree verifies budget + 1 nodes).
    Pure-attention targets give the same figures whatever these options say.
  - Does not fail when the model does not fit; returns C(fits=false) and a C(reason).
  - Fails, naming the file, the field, what it holds and what is needed, when a config field
    the plan reads is missing, not an integer (a boolean is not one), out of its range, or
    when tp_size does not divide what SGLang splits over ranks.
version_added: "0.1.0"
options:
  launch_argv:
    description:
      - The launch command the plan is for (argv after C(-m sglang.launch_server), or the whole
        argv). Sets C(verify_tokens), C(disable_overlap_schedule), C(max_running_requests) and
        the C(mamba_*) options from its flags; an option given here explicitly wins.
    type: list
    elements: str
  model_config:
    description: Path to the target model's config.json (on the machine running the module).
    type: path
    required: true
  draft_model_config:
    description: Path to the drafter's config.json, when the serving config uses one.
    type: path
  gpu_memory_mib:
    description: Memory of one GPU as nvidia-smi reports it (gpu_facts devices[].memory_mib).
    type: int
    required: true
  tp_size:
    description: >-
      Tensor-parallel size: from 1 to 1024, dividing the attention heads and MLP widths of the
      target (and drafter) that SGLang splits evenly over ranks; fails naming the field
      otherwise. Required unless O(launches) is given.
    type: int
  gpu_count:
    description: >-
      GPUs the server can span (gpu_facts count, times the nodes of a multi-node server), when
      known. A tp_size above it gives C(fits=false) with a reason.
    type: int
  mem_fraction_static:
    description: SGLang's --mem-fraction-static.
    type: float
    required: true
  kv_cache_dtype:
    description: SGLang's --kv-cache-dtype; C(auto) keeps the model's BF16.
    type: str
    default: auto
    choices: [auto, bf16, bfloat16, fp8_e4m3, fp8_e5m2]
  overhead_mib:
    description: >-
      Memory per GPU SGLang never sees (driver reserve, CUDA context, NCCL buffers).
      The default reproduces published SGLang KV pools for Kimi K2.5 at TP8.
    type: int
    default: 3072
  min_kv_tokens:
    description: Fewest KV cache tokens per GPU that count as fitting.
    type: int
    default: 16384
  verify_tokens:
    description: >-
      Tokens the target verifies per request and step, each keeping its own recurrent state
      on a hybrid target - 1 for AR, the block size for a DFlash chain
      (--speculative-num-draft-tokens), budget + 1 for DDTree. Default the drafter's
      C(block_size), else 1.
    type: int
  max_running_requests:
    description: >-
      SGLang's --max-running-requests - the running requests whose verify states are
      reserved. Default as SGLang picks it - 48 under speculative decoding, else what the KV
      and recurrent pools allow; either way capped by the recurrent state slots.
    type: int
  mamba_ssm_dtype:
    description: SGLang's --mamba-ssm-dtype; default the config's mamba_ssm_dtype, else float32.
    type: str
    choices: [float32, bfloat16, float16]
  mamba_full_memory_ratio:
    description: >-
      SGLang's --mamba-full-memory-ratio (recurrent state to KV cache memory); 0.9, SGLang's
      default, when neither this nor C(launch_argv) says.
    type: float
  mamba_radix_cache_strategy:
    description: >-
      SGLang's --mamba-radix-cache-strategy; C(auto) resolves to extra_buffer under overlap
      scheduling, else no_buffer (page size 1). Sets the state slots per running request.
      C(auto) when neither this nor C(launch_argv) says.
    type: str
    choices: [auto, no_buffer, extra_buffer, extra_buffer_lazy]
  disable_overlap_schedule:
    description: >-
      SGLang's --disable-overlap-schedule (DDTree turns overlap off); false when neither this
      nor C(launch_argv) says.
    type: bool
  max_mamba_cache_size:
    description: >-
      SGLang's --max-mamba-cache-size - recurrent state slots, instead of
      mamba_full_memory_ratio's share of memory.
    type: int
  launches:
    description:
      - Several launches of the same target on the same GPUs, planned in one run (the
        preflight and plan stages plan every serving config), each with its own C(name),
        C(tp_size), C(launch_argv) and C(draft_model_config), the options above shared. Returns
        C(launches), each launch's plan under its C(name), instead of one plan. Not with
        O(tp_size), O(launch_argv) or O(draft_model_config); a launch that cannot be planned
        fails the run, naming it.
    type: list
    elements: dict
    suboptions:
      name:
        description: The launch's serving config name, returned with its plan.
        type: str
        required: true
      tp_size:
        description: As O(tp_size).
        type: int
        required: true
      launch_argv:
        description: As O(launch_argv).
        type: list
        elements: str
      draft_model_config:
        description: As O(draft_model_config).
        type: path
  context_length:
    description:
      - SGLang's --context-length - C(auto), or a number of tokens. C(auto) resolves to
        C(max_context_length); a number is kept, with C(context_length_warning) when one
        request that long does not fit the KV pool. Default what C(launch_argv) says, else
        C(auto).
    type: str
  prompt_tokens:
    description:
      - The workload's prompt length in tokens, for C(role)'s C(requests_at_workload) (with
        O(new_tokens)). Unset, those figures are null.
    type: int
  new_tokens:
    description:
      - The tokens each request of the workload generates (with O(prompt_tokens)).
    type: int
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Plan K2.6 with the DFlash drafter on 8x RTX PRO 6000
  capacity_plan:
    model_config: models/kimi-k2.6/config.json
    draft_model_config: models/kimi-k2.6/dflash/config.json
    gpu_memory_mib: 97887
    tp_size: 8
    mem_fraction_static: 0.85
    kv_cache_dtype: auto
  delegate_to: localhost
  register: capacity
"""

RETURN = r"""
launches:
  description: With O(launches), each launch's plan (the fields below) and its C(name).
  returned: with launches
  type: list
  elements: dict
weights_gib_per_gpu:
  description: Target weights on one GPU, GiB.
  returned: success
  type: float
  sample: 71.82
draft_weights_gib_per_gpu:
  description: Drafter weights on one GPU, GiB (0 without a drafter).
  returned: success
  type: float
checkpoint_gib:
  description: Size of the whole target checkpoint the config implies, GiB.
  returned: success
  type: float
  sample: 554.27
kv_bytes_per_token:
  description: Target KV cache bytes per token on every GPU.
  returned: success
  type: int
  sample: 70272
draft_kv_bytes_per_token:
  description: Drafter KV cache bytes per token on one GPU.
  returned: success
  type: int
kv_pool_gib:
  description: Memory left for the KV cache pool on one GPU, GiB.
  returned: success
  type: float
kv_tokens:
  description: Tokens the KV cache pool holds (target and drafter caches together).
  returned: success
  type: int
static_budget_gib:
  description: Usable memory times mem_fraction_static, GiB.
  returned: success
  type: float
fits:
  description: Whether weights fit and at least min_kv_tokens remain.
  returned: success
  type: bool
reason:
  description: Why it does not fit, and what to change; null when it fits.
  returned: success
  type: str
attention:
  description: C(pure_attention), or C(hybrid) (attention plus recurrent layers).
  returned: success
  type: str
  sample: hybrid
verify_tokens:
  description: Tokens verified per request and step the plan used.
  returned: success
  type: int
max_running_requests:
  description: >-
    Hybrid - the running requests SGLang would allow (0 when none fits). Pure attention -
    the option as given (null when unset).
  returned: success
  type: int
recurrent_state_bytes_per_request:
  description: Conv plus SSM state of one request slot on one GPU, all recurrent layers, or 0.
  returned: success
  type: int
  sample: 153944064
recurrent_state_bytes_per_verify_token:
  description: >-
    Intermediate state one verified token keeps per request on one GPU under speculative
    decoding (0 without speculative decoding or recurrent layers).
  returned: success
  type: int
verify_state_bytes_per_request:
  description: recurrent_state_bytes_per_verify_token times verify_tokens.
  returned: success
  type: int
recurrent_state_slots:
  description: Recurrent state slots (SGLang's max_mamba_cache_size); 0 without recurrent layers.
  returned: success
  type: int
recurrent_state_gib:
  description: The recurrent state pool on one GPU (slots + 1 padding slot), GiB.
  returned: success
  type: float
verify_state_gib:
  description: The per-verify-token intermediate states on one GPU, GiB.
  returned: success
  type: float
context_length:
  description: >-
    The launch's --context-length - the user's value, or C(max_context_length) for C(auto).
  returned: success
  type: int
  sample: 81571
context_length_source:
  description: C(auto) (from this plan) or C(user).
  returned: success
  type: str
max_context_length:
  description: >-
    The longest request one server holds whole - the KV pool in tokens, capped at the model's
    max_position_embeddings and, under DDTree, at C(tree_mask_max_context).
  returned: success
  type: int
context_length_fits:
  description: >-
    Whether one request at context_length fits the KV pool (and the model), and under DDTree
    whether a step's tree mask at that context fits outside the static pool.
  returned: success
  type: bool
tree_mask_gib:
  description: >-
    DDTree only (null otherwise): one step's tree masks at context_length, a (budget + 1) x
    (context_length + budget + 1) boolean mask per running request, GiB per GPU. It lives
    outside the static pool, in the 1 - mem_fraction_static share of the usable memory.
  returned: success
  type: float
tree_mask_running_requests:
  description: >-
    DDTree only: the running requests the masks are counted for (--max-running-requests, else
    the 48 SGLang sets under speculative decoding).
  returned: success
  type: int
tree_mask_max_context:
  description: >-
    DDTree only: the longest context at which a step's tree masks fit outside the static pool
    (shared with activations and CUDA graphs: a bound, not a promise).
  returned: success
  type: int
role:
  description: >-
    The launch's capacity by its role in prefill-decode disaggregation (its
    --disaggregation-mode) - C(role) (whole, prefill or decode), what its KV pool C(holds), its
    C(cuda_graph) (SGLang turns a prefill server's off), a decode server's
    C(reserved_decode_tokens), the tokens one request takes and the requests the pool holds at
    the context length and at the workload (C(tokens_per_request_at_context),
    C(requests_at_context), C(workload_tokens_per_request), C(requests_at_workload); a prefill
    server's are prompts in flight), C(fits_one_request_at_context) and a C(warning).
  returned: success
  type: dict
context_length_warning:
  description: What does not fit and how to fix it; null when it fits.
  returned: success
  type: str
mamba_ssm_dtype:
  description: The SSM state's dtype (null without recurrent layers); conv states are bfloat16.
  returned: success
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.host.in_process import run_as_module  # noqa: E402
from ansible.module_utils.plan.capacity_plan_task import RULES, SPEC, act  # noqa: E402


def main() -> None:
    run_as_module(AnsibleModule, SPEC, act, **RULES)


if __name__ == "__main__":
    main()
