#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module sglang_benchmark: a speculative-decoding-aware load test of an SGLang server."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_benchmark
short_description: Benchmark an SGLang server at concurrencies and request rates, per token and step
description:
  - Runs on the GPU host next to the server. Sends the prompts of O(prompts) to SGLang's native
    streaming C(POST /generate), one level after the other, and writes one level file per level
    into O(output_dir) - first the closed-loop levels, C(c<N>.json) with N requests in flight
    (O(concurrency)), then the request-rate levels, C(r<R>.json) with Poisson arrivals at R
    requests/s (O(request_rates)), at most O(max_concurrency) in flight.
  - A level sends each prompt at most once - the first min(wanted, distinct prompts) distinct
    rows of O(prompts), in file order, the same for every config so that runs compare request by
    request. A closed-loop level wants O(requests_per_concurrency) x N requests, a rate level
    ceil(R x O(rate_duration_s)), either at least O(num_prompts). A file with fewer distinct
    prompts is sent whole and the level's C(fill) says C(under_filled) (a prompt sent twice would
    be served from the radix cache). No request starts once O(level_time_budget_s) has passed
    since the level began (C(fill.stopped_by_time_budget)); those in flight finish.
  - O(repeats) runs every level that many times in a row, each after a cache flush, as
    C(c<N>.json), C(c<N>.rep2.json), ...; each file's C(repeat) and C(repeats) say which. A rate
    level's arrivals come from a generator seeded with the repeat number less one, so every
    config sees the same arrivals at a rate and repeat.
  - Rows of O(prompts) may hold C(input_ids) (token ids) instead of text. When the
    C(<name>.meta.json) beside O(prompts) describes a synthetic C(workload) (benchmark_prompts'
    C(workloads) option), every request asks for exactly its C(osl) tokens with C(ignore_eos) (and
    O(max_new_tokens) is not used), and each level file carries the C(workload).
  - With O(telemetry) the GPUs are sampled (C(nvidia-smi --query-gpu ... -lms)) from just
    before a level's first request to just after its last; the level's C(summary.gpu) holds
    power, energy, clocks, temperature, utilisation, memory and throttle reasons. Without a
    sample (O(telemetry=auto) on a host without nvidia-smi) the level's C(client.warnings) say
    why.
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
    description: Closed-loop levels (requests in flight), run in the given order, each once.
    type: list
    elements: int
    required: true
  request_rates:
    description:
      - Request-rate levels (requests per second, Poisson arrivals), run after the closed-loop
        levels in the given order. Each is named by its plain decimal (C(r0.5.json),
        C(r2.json)), so at most 6 significant digits.
    type: list
    elements: float
    default: []
  max_concurrency:
    description:
      - Most requests in flight at a rate level (a request due while the cap is full waits,
        and the wait shows in C(client.arrival_lag_ms)); 0 for no cap. The level file's
        C(concurrency) is this cap, or the level's request count without one.
    type: int
    default: 0
  rate_duration_s:
    description: Seconds of arrivals a rate level is sized for; it wants ceil(rate x this) requests.
    type: float
    default: 60
  requests_per_concurrency:
    description: Requests a closed-loop level wants per request in flight (this x N).
    type: int
    default: 10
  level_time_budget_s:
    description:
      - Seconds after a level's start past which no request starts (in-flight ones finish);
        the requests not sent are not in the level file.
    type: float
    default: 1200
  repeats:
    description: Times each level runs (1 to 100); the analysis averages them, with 95% intervals.
    type: int
    default: 1
  telemetry:
    description:
      - GPU telemetry during each level. C(auto) samples with C(nvidia-smi) when it is on the
        PATH and says in the level's C(client.warnings) when not; C(nvidia-smi) fails the
        module without it; C(off) samples nothing.
    type: str
    choices: [auto, nvidia-smi, "off"]
    default: auto
  telemetry_interval_ms:
    description: Milliseconds between GPU samples (20 to 60000).
    type: int
    default: 200
  fleet:
    description:
      - Set when O(base_url) is SGLang's router (sglang-router) in front of replicas. Each
        level then records, per replica, the requests and tokens its own C(/metrics) counted
        and the requests the router's Prometheus page says it sent there (C(fleet) in the
        level file), and the first replica's C(/server_info) stands in for the router's.
      - A stream the router cut is that request's failure, not the level's crash.
    type: dict
    suboptions:
      workers:
        description: Each replica's inventory name and URL, as the router lists it (1 to 64).
        type: dict
        required: true
      router_metrics_url:
        description: The router's Prometheus page (its C(--prometheus-host) and port), C(/metrics).
        type: str
        default: ""
  prompts:
    description:
      - A JSONL file on the host, one JSON object a line with C(prompt) (text sent as is),
        C(messages) (a chat, rendered through the model's chat template) or C(input_ids) (token
        ids sent as they are), and optionally C(id).
      - Every level sends the same prompts in the same order, never one twice (a repeated row
        is skipped), so runs of different serving configs compare request by request.
    type: path
    required: true
  num_prompts:
    description:
      - Fewest requests a level wants; it sends fewer only when O(prompts) has fewer distinct
        prompts.
    type: int
    default: 64
  max_new_tokens:
    description:
      - Most tokens generated per request (EOS still ends a request early). A workload's
        requests ask for exactly its C(osl) instead.
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
      - Folder for the level files, created when missing.
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
    timeout times the number of request waves plus a minute (and by O(level_time_budget_s)
    plus the request timeout and a minute), every stream by its event count,
    every event by 16 MiB, every C(/server_info) and C(/metrics) answer by 8 MiB.
  - A stream that ends before its C([DONE]) event - the connection closed or the chunked body
    ended, in the middle of an event or between events - loses its request, and the level is
    marked C(crashed). A field of the wrong type in an event fails only that request.
  - Every level file is masked as a whole before it is written - every field whose name says
    key, token, secret or password, and every occurrence of O(api_key) and O(hf_token) and of
    their base64 forms (an error body that echoes the request's Authorization header) - and so
    are the module's messages.
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
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

- name: A fixed-length workload at two request rates after two concurrency levels, three times
  sglang_benchmark:
    base_url: http://127.0.0.1:30000
    concurrency: [1, 16]
    request_rates: [0.5, 2]
    max_concurrency: 64
    repeats: 3
    prompts: /var/lib/kimi/benchmark/prompts/isl1024-osl1024.jsonl
    output_dir: /var/lib/kimi/benchmark/20260101T000000Z/dflash/isl1024-osl1024
    run_label: 20260101T000000Z
    config_name: dflash
"""

RETURN = r"""
files:
  description: The level files written, in order.
  returned: always
  type: list
  elements: str
summaries:
  description:
    - The C(summary) of each level, keyed by its file's name without C(.json) (C(c16),
      C(c16.rep2), C(r2.5)).
  returned: always
  type: dict
saturated:
  description: The levels (file names without C(.json)) at which the client marked itself saturated.
  returned: always
  type: list
  elements: str
ansible_facts:
  description: C(sglang_benchmark) - config, run label, prompts file and the summaries.
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.benchmark.client_target import masked  # noqa: E402
from ansible.module_utils.benchmark.level import (  # noqa: E402
    TELEMETRY_MODES,
    check_params,
    run_benchmark,
)
from ansible.module_utils.host.secret_scrub import secret_forms  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "base_url": {"type": "str", "required": True},
            "concurrency": {"type": "list", "elements": "int", "required": True},
            "prompts": {"type": "path", "required": True},
            "num_prompts": {"type": "int", "default": 64},
            "max_new_tokens": {"type": "int", "default": 512, "no_log": False},
            "temperature": {"type": "float", "default": 0.0},
            "warmup_requests": {"type": "int", "default": 2},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "hf_token": {"type": "str", "default": "", "no_log": True},
            "request_timeout": {"type": "float", "default": 600},
            "output_dir": {"type": "path", "required": True},
            "run_label": {"type": "str", "default": ""},
            "scoring": {"type": "str", "choices": ["", "gsm8k", "math"]},
            "config_name": {"type": "str", "required": True},
            "request_rates": {"type": "list", "elements": "float", "default": []},
            "max_concurrency": {"type": "int", "default": 0},
            "rate_duration_s": {"type": "float", "default": 60},
            "requests_per_concurrency": {"type": "int", "default": 10},
            "level_time_budget_s": {"type": "float", "default": 1200},
            "repeats": {"type": "int", "default": 1},
            "telemetry": {"type": "str", "choices": list(TELEMETRY_MODES), "default": "auto"},
            "telemetry_interval_ms": {"type": "int", "default": 200},
            "fleet": {
                "type": "dict",
                "options": {
                    "workers": {"type": "dict", "required": True},
                    "router_metrics_url": {"type": "str", "default": ""},
                },
            },
        },
        supports_check_mode=False,
    )
    p = module.params
    problems = check_params(p)
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
