#!/usr/bin/python
"""Ansible module sglang_benchmark: a speculative-decoding-aware load test of an SGLang server."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_benchmark
short_description: Benchmark an SGLang server at several concurrency levels, per token and per step
description:
  - Runs on the GPU host next to the server. Sends the prompts of O(prompts) to SGLang's native
    streaming C(POST /generate) with a closed loop of O(concurrency) requests in flight, one
    level after the other, and writes one C(c<N>.json) per level into O(output_dir).
  - Before each level it calls C(/flush_cache) (so no level starts with the previous one's
    prefix cache) and reads C(/server_info) and C(/metrics) before and after it, keeping only
    differences (SGLang's averages there are cumulative since the server started). SGLang
    flushes only an idle server and answers 400 otherwise; the module asks it to wait for idle
    (C(?timeout=)) and retries within a minute, and records C(not flushed (...)) in the level's
    C(server.cache) when it never was.
  - A restart during a level shows as another C(startup_time) record in C(/server_info) (the
    durations SGLang measured while starting, new with every start) or a C(/metrics) counter
    that went down.
  - Per request it measures TTFT, E2E latency, the inter-token latency of every token (the
    gap between two streamed events divided by the tokens the later one carries; with
    speculative decoding one event carries several), TPOT, the output tokens as the server
    counts them (C(meta_info.completion_tokens)), the verify steps (C(meta_info.spec_verify_ct),
    on SGLang's last event only), the accept length C(accept_length) = (output tokens - 1) /
    verify steps (the first token comes from prefill, not from a verify step), SGLang's own
    C(spec_accept_length) = output tokens / verify steps beside it, and the output text and
    token ids (for the losslessness check).
  - Per level it reports output tokens/s, requests/s, mean and p50/p90/p99 of TTFT, ITL, TPOT
    and E2E, the token-weighted mean accept length (and SGLang's, C(spec_accept_length_mean)),
    the step time (ms per forward step) and the accepted tokens per step (their quotient is a
    request's decode speed), and failures.
  - A scored prompt set (O(scoring)) has each finished answer scored against its row's
    C(answer), and every request record gains C(score) (C(outcome) correct, wrong or unanswered -
    cut off at O(max_new_tokens), failed or aborted - with the answer C(extracted) and the one
    C(expected)) and the level's summary C(accuracy) (counts, the share correct, and
    C(outcomes), one letter per request in request order).
  - The client measures itself - CPU use, event-loop lag - and marks a level C(saturated) when
    the client rather than the server may have been the limit (busy nearly all the time, or
    busy and behind - its event-loop lag p99 a quarter or more of the time between a
    request's events), and C(timing_reliable) false when its event loop ran late (p99 lag of
    2 ms or more) for whatever reason, other processes on the host included.
  - Standard library only (asyncio with raw sockets); it needs no package on the host.
    Rows of O(prompts) given as chat C(messages) are rendered with the chat template of the
    model the server reports, which needs jinja2 on the host; the benchmark role renders them
    beforehand, so its prompt files hold plain C(prompt) text.
  - Fails, after writing the level's file, when the server drops connections or restarts
    during a level (a crash), when every request of a level fails, and when the server does
    not answer at the start.
version_added: "0.1.0"
options:
  base_url:
    description: The server as seen from the host, for example C(http://127.0.0.1:30000).
    type: str
    required: true
  concurrency:
    description: Concurrency levels (requests in flight), run in the given order.
    type: list
    elements: int
    required: true
  prompts:
    description:
      - A JSONL file on the host, one JSON object a line with C(prompt) (text sent as is) or
        C(messages) (a chat, rendered through the model's chat template), and optionally C(id).
      - Every level sends the same prompts in the same order (cycled when the file has fewer
        than O(num_prompts)), so runs of different serving configs compare request by request.
    type: path
    required: true
  num_prompts:
    description: Requests per concurrency level.
    type: int
    default: 64
  max_new_tokens:
    description: Most tokens generated per request (EOS still ends a request early).
    type: int
    default: 512
  temperature:
    description: Sampling temperature; 0 is greedy, which the losslessness check needs.
    type: float
    default: 0.0
  warmup_requests:
    description: Requests sent once before the first level and not measured.
    type: int
    default: 2
  api_key:
    description: Bearer token for a server started with an API key.
    type: str
    default: ""
  hf_token:
    description:
      - The Hugging Face token of the deploy. The benchmark never sends it; it only masks it
        (as O(api_key)) in every file and message it writes.
    type: str
    default: ""
  request_timeout:
    description: Seconds one request may take from connecting to its last event.
    type: float
    default: 600
  output_dir:
    description:
      - Folder for C(c<N>.json), created when missing.
      - A C(provenance.json) already in it, or else in the folder above it (written by the
        benchmark role - kit version, run id, GPU facts, the prompt sets' sources, and
        C(records), the paths of the runtime and launch records) is copied into every level's
        C(provenance). The runtime record, the launch
        record (C(/opt/kimi/runtime/runtime.json), C(/var/lib/kimi/server/launch.json) unless
        C(records) names others) and the weights manifests of the model and drafter in the
        launch's argv are read from the host.
    type: path
    required: true
  scoring:
    description:
      - The scorer of a prompt set with reference answers (C(gsm8k) the final number,
        C(math) the last C(\\boxed{})); every row of O(prompts) then needs C(answer).
        C("") scores nothing.
      - Unset, the C(scoring) of the C(<name>.meta.json) benchmark_prompts wrote beside
        O(prompts), when there is one.
    type: str
    choices: ["", gsm8k, math]
  run_label:
    description: Label of this run (the benchmark role passes its run id), copied into every file.
    type: str
    default: ""
  config_name:
    description: Name of the serving config under test (ar, dflash, ddtree-b32, ...).
    type: str
    required: true
notes:
  - Bounded everywhere - every request by O(request_timeout), every level by the request
    timeout times the number of request waves plus a minute, every stream by its event count,
    every event by 16 MiB, every C(/server_info) and C(/metrics) answer by 8 MiB.
  - A stream that ends before its C([DONE]) event - the connection closed or the chunked body
    ended, in the middle of an event or between events - loses its request, and the level is
    marked C(crashed). A field of the wrong type in an event fails only that request.
  - Every level file is masked as a whole before it is written - every field whose name says
    key, token, secret or password, and every occurrence of O(api_key) and O(hf_token) and of
    their base64 forms (an error body that echoes the request's Authorization header) - and so
    are the module's messages.
author:
  - kimi-deploy-kit maintainers
"""

EXAMPLES = r"""
- name: Benchmark the running server at two concurrency levels
  sglang_benchmark:
    base_url: http://127.0.0.1:30000
    concurrency: [1, 16]
    prompts: /var/lib/kimi/benchmark/prompts/gsm8k.jsonl
    num_prompts: 64
    max_new_tokens: 512
    output_dir: /var/lib/kimi/benchmark/20260101T000000Z/dflash/gsm8k
    run_label: 20260101T000000Z
    config_name: dflash
  register: bench
"""

RETURN = r"""
files:
  description: The level files written, in order.
  returned: always
  type: list
  elements: str
summaries:
  description: The C(summary) of each level, keyed by concurrency.
  returned: always
  type: dict
saturated:
  description: Concurrency levels at which the client marked itself saturated.
  returned: always
  type: list
  elements: int
ansible_facts:
  description: C(sglang_benchmark) - config, run label, prompts file and the summaries.
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.benchmark_client import masked, secret_forms  # noqa: E402
from ansible.module_utils.benchmark_level import run_benchmark  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "base_url": {"type": "str", "required": True},
            "concurrency": {"type": "list", "elements": "int", "required": True},
            "prompts": {"type": "path", "required": True},
            "num_prompts": {"type": "int", "default": 64},
            "max_new_tokens": {"type": "int", "default": 512},
            "temperature": {"type": "float", "default": 0.0},
            "warmup_requests": {"type": "int", "default": 2},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "hf_token": {"type": "str", "default": "", "no_log": True},
            "request_timeout": {"type": "float", "default": 600},
            "output_dir": {"type": "path", "required": True},
            "run_label": {"type": "str", "default": ""},
            "scoring": {"type": "str", "choices": ["", "gsm8k", "math"]},
            "config_name": {"type": "str", "required": True},
        },
        supports_check_mode=False,
    )
    p = module.params
    problems = []
    if not p["concurrency"] or any(c < 1 for c in p["concurrency"]):
        problems.append(f"concurrency must be a list of levels >= 1, got {p['concurrency']}")
    if p["num_prompts"] < 1 or p["max_new_tokens"] < 1:
        problems.append("num_prompts and max_new_tokens must be at least 1")
    if p["warmup_requests"] < 0 or p["request_timeout"] <= 0 or p["temperature"] < 0:
        problems.append("warmup_requests >= 0, request_timeout > 0 and temperature >= 0 needed")
    if problems:
        module.fail_json(msg="; ".join(problems))

    def fail(msg, **extra):
        module.fail_json(msg=msg, **extra)

    try:
        result = run_benchmark(p, fail)
    except (OSError, ValueError) as error:
        shown = masked(str(error), secret_forms([p["api_key"], p["hf_token"]]))
        module.fail_json(msg=f"Benchmark of {p['config_name']} failed: {shown}")
    module.exit_json(
        changed=True,
        files=result["files"],
        summaries=result["summaries"],
        saturated=result["saturated"],
        ansible_facts={
            "sglang_benchmark": {
                "config": p["config_name"],
                "run_label": p["run_label"],
                "prompts": result["prompts"],
                "summaries": result["summaries"],
            }
        },
    )


if __name__ == "__main__":
    main()
