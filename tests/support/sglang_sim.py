"""An SGLang 0.5.23 server simulator: the endpoints, stream shape, HTTP framing and start-up of
`python -m sglang.launch_server`, with step time, tokens accepted per verify step, load time,
crashes and output drift set from the environment.

Real SGLang cannot run here (no GPU, no weights). The simulator stands in for it in tests of
the server role and the benchmark, and it is only as good as its likeness, so every behaviour
below follows SGLang 0.5.23's source (paths under python/sglang/):

Arguments
    Refuses any argv its runtime's contract refuses (module_utils/plan/sglang_args.py over the
    committed parser snapshot: the pinned release's; as the fake DDTree pull-request runtime,
    plus that pull request's overlay, tests/contract/sglang-pr29907-overlay.json); `--config
    FILE.yaml` is merged first, as srt/server_args.py prepare_server_args does.

Start-up (srt/entrypoints/http_server.py launch_server, _wait_and_warmup,
_execute_server_warmup)
    The HTTP port opens only once the model is loaded (SGLANG_SIM_LOAD_SECONDS): SGLang starts
    uvicorn after its schedulers report ready, so a loading server refuses connections. Until
    the warmup request (`/generate`, "The capital city of France is", max_new_tokens 8, sent
    one second after the port opens) has generated, the server is Starting and /health and
    /health_generate answer 503 at once. A warmup that does not finish within
    SGLANG_WARMUP_TIMEOUT (600 s when unset or <= 0) kills the server (kill_process_tree, so
    SIGKILL). `--skip-server-warmup` marks it Up at once.

/health, /health_generate (http_server.py health_generate)
    Starting: 503 at once. /health answers 200 without generating only when
    SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is false (srt/environ.py: true by default).
    Otherwise a one-token request (input_ids [0], max_new_tokens 1, log_metrics False, so it
    stays out of /metrics) goes to the scheduler and the handler sleeps 1 s at a time until
    any output has arrived since it began (200, server Up) or SGLANG_HEALTH_CHECK_TIMEOUT
    (20 s) passed (503, server UnHealthy). So it always takes at least a second.

Streaming /generate (http_server.py serve_generate_request; srt/managers/tokenizer_manager.py
_handle_batch_output, _stream_one_response, _calculate_spec_decoding_metrics;
srt/managers/scheduler_components/output_streamer.py accept)
    A StreamingResponse of `data: {json}\\n\\n` events and `data: [DONE]\\n\\n`, JSON compact
    as orjson writes it. Defaults: stream_interval 1, incremental_streaming_output off, so
    `text` and `output_ids` are cumulative. The first event carries the one token prefill
    produced (completion_tokens 1); each later event carries one verify step's tokens (the
    accepted drafts plus the bonus token), or one token without speculation. When the HTTP
    side falls behind, queued outputs collapse into one event with the latest state.
    meta_info of every event: id, finish_reason (null until the last event, then
    {"type": "length", "length": N}), prompt_tokens, weight_version, num_retractions,
    reasoning_tokens, completion_tokens, cached_tokens, cached_tokens_details, and on the
    first event sent response_sent_to_client_ts. Only the last event adds e2e_latency and,
    under speculation and only when at least one verify step ran, spec_accept_rate,
    spec_accept_length, spec_num_correct_drafts, spec_num_proposed_drafts, spec_verify_ct and
    spec_correct_drafts_histogram. spec_verify_ct counts verify steps (the prefill token is
    none); spec_accept_length = completion_tokens / spec_verify_ct (prefill token included);
    spec_num_correct_drafts counts accepted drafts without the bonus token
    (scheduler_components/batch_result_processor.py); spec_num_proposed_drafts =
    spec_verify_ct x (speculative_num_draft_tokens - 1); spec_accept_rate = correct /
    proposed. A repeated prompt since the last flush reports its prefix as cached_tokens
    (the radix cache matches at most all but the last prompt token).

/generate inputs (srt/managers/io_struct.py GenerateReqInput; srt/managers/schedule_batch.py
Req.update_finish_state, _check_token_based_finish)
    `text` or `input_ids` (one prompt token each: prompt_tokens = len(input_ids)). input_ids
    that are not a list of int64 (SGLang's field validator) or are empty get 400 with
    SGLang's ErrorResponse body; so do ids outside [0, vocab_size) (config.json's, else
    K2.6's 163840), which SGLang itself does not check (see input_ids_error). With
    sampling_params.ignore_eos true no end of sequence stops a request (SGLang skips the
    stop-token check), so it decodes exactly max_new_tokens and finishes with
    {"type": "length", "length": max_new_tokens}.

HTTP framing (uvicorn's httptools/h11 protocols, starlette's StreamingResponse)
    Streams go out with `transfer-encoding: chunked`, one chunk per event, then a separate
    `0\\r\\n\\r\\n`; other answers carry content-length. Headers `date` and `server: uvicorn`
    come first, names in lower case. HTTP/1.1 connections stay open between requests unless
    the client sends `Connection: close` (then `connection: close` is answered and the
    connection closed), idle ones close after SGLANG_TIMEOUT_KEEP_ALIVE (5 s).

Authentication (srt/utils/auth.py decide_request_auth)
    With --api-key every path needs `Authorization: Bearer KEY` (401 {"error":
    "Unauthorized"}) except those starting with /health, /ready and /metrics.

/server_info (http_server.py server_info; srt/utils/common.py build_server_info;
srt/managers/scheduler.py get_init_info; scheduler_components/internal_state.py)
    The resolved server arguments (every parser destination; tokenizer_path and
    served_model_name default to the model path, random_seed to a random int, as
    srt/arg_groups/serving_hook.py resolves them), launch_command (the merged argv joined
    by spaces), status, max_total_num_tokens, max_req_input_len, hicache_object_layout,
    kv_events, startup_time, internal_states, version and frontend. startup_time is a record
    of durations measured while starting (srt/observability/startup_time.py
    build_engine_startup_time: load_weight, kv_cache_allocation, scheduler_e2e, cuda_graph
    per phase, tokenizer_e2e), not a timestamp; a restarted server measures new ones.
    internal_states[0] holds avg_spec_accept_length (decode tokens / verify steps, folded in
    every decode_log_interval = 40 decode batches, reset by /flush_cache) under speculation.
    /get_server_info is the deprecated alias. There is no raw argv field.

/flush_cache (http_server.py flush_cache; scheduler_components/flush_wrapper.py;
scheduler.py flush_cache)
    GET or POST, optional ?timeout=SECONDS. Idle: 200 "Cache flushed.\\n...". Requests
    running or waiting: 400 "Flush cache failed.\\n" at once without a timeout; with one it
    waits for idle and answers 400 "Timed out waiting for idle state." when that does not
    come; a second flush while one waits gets 400 "Another flush_cache is already in
    progress.". A flush empties the prefix cache and resets the scheduler's accept-length
    counters.

/metrics (srt/utils/common.py add_prometheus_middleware, only with --enable-metrics;
srt/observability/metrics_collector.py TokenizerMetricsCollector)
    Prometheus text with sglang:prompt_tokens_total, sglang:generation_tokens_total and
    sglang:num_requests_total (labels engine_type, is_streaming, model_name),
    sglang:spec_verify_calls_total (engine_type, model_name), all counted when a request
    with log_metrics finishes (observe_one_finished_request: the warmup counts, health
    checks do not), sglang:startup_time_seconds per phase, and the running and queued
    request gauges. Without --enable-metrics /metrics is 404.

OpenAI-compatible API (srt/entrypoints/openai/protocol.py, serving_chat.py; http_server.py
available_models)
    /v1/models lists one ModelCard, the served model name (--served-model-name, else the model
    path); /v1/models/<name> gives it or 404s. /v1/chat/completions renders the messages
    through the served folder's chat template (chat_template.jinja, else tokenizer_config.json's;
    tools and chat_template_kwargs passed to it; each message on a line without one) and runs
    the prompt through the scheduler as /generate does. The model thinks first
    (`<think> ... </think>` then the answer) unless chat_template_kwargs sets thinking (K2.6)
    or enable_thinking (Qwen) false. With --reasoning-parser and separate_reasoning (default)
    the reasoning goes to reasoning_content (kimi_k2's detector: everything before </think>,
    or before a tool-call section), otherwise it stays in content. With tools and a
    tool_choice other than none the model calls the named tool, or the first: with
    --tool-call-parser the call comes in the model's format (K2's sections for kimi_k2) and is
    parsed into tool_calls (K2's ids functions.<name>:<n>; finish_reason tool_calls; streamed
    as one tool_calls delta once whole); without one a forced choice (named or required) is
    the JSON-schema constrained `[{"name", "parameters"}]` left as content and an auto one the
    model's format as content, as serving_chat.py leaves them (_tool_call_parsing_active is
    false, so _process_tool_calls never runs). Streams: a role chunk, reasoning_content and
    content deltas, a finish chunk, a usage chunk with stream_options.include_usage, [DONE].
    A finished turn stops at its end of sequence: finish_reason stop, matched_stop the EOS id.

Reference answers (for scored prompt sets)
    With SGLANG_SIM_ANSWERS, a /generate or chat prompt that contains a known question gets a
    few words of working, then `The answer is \\boxed{X}`: the reference answer when
    draw(question) < SGLANG_SIM_ACCURACY, else a wrong one shaped like it (the number plus
    one). The draw depends on the question alone, so every config and host draws the same
    number: a config at 0.89 is wrong on a subset of what one at 0.9 got right. The answer ends
    at its end of sequence (finish_reason {"type": "stop", "matched": EOS id}) when
    max_new_tokens leaves room, else it is cut there (length); tokens, output_ids and text
    always agree.

Model folders and the GPU, before the port opens (each check cites the file that makes it)
    What SGLang reads of --model-path and --speculative-draft-model-path at start-up, in its
    order: config.json present and JSON (transformers' AutoConfig, through
    srt/utils/hf_transformers_utils.py get_config), --context-length within the config's
    (srt/configs/model_config.py _derive_context_length, the drafter built with the target's
    length), a known architecture (srt/models/registry.py; the simulator knows the kit's
    models' and has no Transformers fallback), what TP splits divisible by --tp-size
    (srt/distributed/utils.py divide(), models/deepseek_v2.py, layers/moe/fused_moe_triton/
    layer.py, layers/attention/vision.py), the weights (srt/model_loader/loader.py, weight_utils.py
    filter_duplicate_safetensors_files: safetensors files present, every shard an index names
    on disk; each header as the safetensors library checks it), compressed-tensors
    pack-quantized tensors consistent (the shapes of compressed_tensors_wNa16*.py
    create_weights; the words here are the simulator's, SGLang has none), the DFlash drafter
    against its target (speculative/dflash_utils.py: num_hidden_layers, target_layer_ids within
    the target's layers; a block size other than the run's only warns, as
    speculative/dflash_worker_v2.py does), EAGLE-3's and DFlash's hidden size against the
    target's (torch's "mat1 and mat2 shapes cannot be multiplied" at the first forward), and the
    attention backends against the GPU's compute capability (`nvidia-smi
    --query-gpu=compute_cap`, the first GPU; none checked without nvidia-smi): fa3
    (layers/attention/attention_registry.py), trtllm_mla (arg_groups/overrides.py), trtllm_mha
    (arg_groups/attention_hook.py), fa4 with MLA on SM90 (flash_attn/cute/interface.py);
    flashmla's checks are in the sgl-flash-mla wheel, not sglang's source, and are not made.
    A failure in the launch process (the arguments, the configs) prints its traceback's last
    line and exits 1; one in a scheduler (loading) prints "Scheduler hit an exception: ...",
    then "Received sigquit from a child process. It usually means the child failed." and the
    server kills itself (SIGKILL) after SGLANG_SIM_LOAD_SECONDS, before the port opens. A
    path that is no folder, or a folder with neither config.json nor safetensors files, is the
    simulator's bare stand-in: K2.6, nothing checked.

/model_info (http_server.py model_info; model_type and architectures from the served folder's
config.json, K2.6's without one); anything else: 404 {"detail": "Not Found"}.

The scheduler runs one decode step every SGLANG_SIM_STEP_MS for every running request whose
prefill (SGLANG_SIM_PREFILL_MS after admission, rounded up to a step) is done: a verify step
yields SGLANG_SIM_ACCEPT tokens under speculation, one token without. So with ACCEPT=A a
request of N tokens takes ceil((N - 1) / A) verify steps after its prefill token. Outputs are
deterministic per prompt; token ids derive from the token text.

DDTree (only as the fake DDTree pull-request runtime, whose contract has the algorithm; the
release refuses it as 0.5.23 does): the running budget (--speculative-ddtree-budget, or block
size - 1 as the pull request defaults it) picks step time and tokens per verify step from
SGLANG_SIM_DDTREE_TABLE, so a test can play a whole budget sweep (tests/support/ddtree_tables.py). A
budget the table lacks, or a row above the depth cap (min(budget, block size - 1) drafts plus
the bonus token per step: the tree is drafted from block size - 1 positions), stops the server
at start with the reason on stderr. The verifier sees budget + 1 tokens a step, and
spec_num_proposed_drafts = spec_verify_ct x (max(block size, budget + 1) - 1) (the pull
request's tokenizer_manager: a chain below the block size still proposes block size - 1
drafts a step), and the pull request's forced settings show in /server_info
(disable_overlap_schedule true, the budget resolved).

Environment (all optional):
    SGLANG_SIM_STEP_MS        decode step time, ms (default 20)
    SGLANG_SIM_ACCEPT         tokens per verify step under speculation, accepted drafts plus
                              the bonus token (default 3.0; fractional values alternate
                              between floor and ceil to average out)
    SGLANG_SIM_PREFILL_MS     time from admission to the first (prefill) token, ms (default 50)
    SGLANG_SIM_LOAD_SECONDS   loading time before the port opens (default 0)
    SGLANG_SIM_POLL_SECONDS   how often SGLang checks whether its warmup request and a
                              /health_generate request have generated (default 1, SGLang's:
                              _execute_server_warmup sleeps a second before its first request,
                              health_generate checks once a second)
    SGLANG_SIM_DIST_TIMEOUT_S how long the ranks of a multi-node server (--nnodes 2 or more)
                              wait for each other at --dist-init-addr (default 300)
    SGLANG_SIM_NO_GENERATE    "1": the model loads and the port opens, but the scheduler never
                              produces a token (warmup and health checks never complete)
    SGLANG_SIM_CRASH_AFTER    exit(1) on the client /generate request after this many
                              (default: never; the warmup and health checks do not count)
    SGLANG_SIM_CRASH_ON_START exit(1) right after parsing the arguments when "1"
    SGLANG_SIM_LOSSY          gross loss: fraction of tokens altered under speculation, as a
                              broken verifier would (default 0)
    SGLANG_SIM_DRIFT          realistic greedy drift: fraction of requests whose output under
                              speculation leaves the plain-decoding one from a token onwards
                              (position uniform over max_new_tokens, per prompt), as
                              non-bitwise-identical kernels do at near ties (default 0)
    SGLANG_SIM_MAX_RUNNING    requests decoded together (default 256)
    SGLANG_SIM_TRUTH          "1": record when each request arrived and when each of its events
                              and its [DONE] were written (server-side truth for client
                              fidelity checks): GET /sim_truth, POST /sim_truth/reset
    SGLANG_SIM_TRUTH_DIR      also append each finished request's record to <dir>/<pid>.jsonl
    SGLANG_SIM_REUSE_PORT     "1": listen with SO_REUSEPORT, so several simulators share a port
                              (the kernel spreads connections; a client can outrun one process)
    SGLANG_SIM_DDTREE_TABLE   DDTree behaviour per budget, JSON {"<budget>": {"step_ms": ..,
                              "accept": ..}} (accept: tokens per verify step, bonus included);
                              without it a DDTree server uses SGLANG_SIM_STEP_MS and _ACCEPT
    SGLANG_SIM_SPEED_MODEL    a model folder (models/<name>: config.json, the drafters'
                              configs): each decode step then takes what
                              module_utils/plan/speed_model.py predicts for this launch's argv at
                              the
                              requests decoding in it and their mean context (prompt plus the
                              tokens so far), in place of SGLANG_SIM_STEP_MS and a DDTree row's
                              step time (its accept still applies), so a healthy run measures
                              what the model predicts. With it:
    SGLANG_SIM_SPEED_PROFILE  the hardware profile (default h200)
    SGLANG_SIM_SPEED_HARDWARE the hardware figures file (default the kit's, or the copy the
                              package ships)
    SGLANG_SIM_SPEED_ALLREDUCE an all-reduce record ({results: [{bytes, time_us}]}, the tuning
                              stage's check) the step's all-reduces take their time from: a
                              host whose NCCL is slow
    SGLANG_SIM_SPEED_SLOWDOWN every step this many times the prediction (default 1): GPUs held
                              below their clocks (a power cap), which the fake nvidia-smi's
                              telemetry can show
    SGLANG_SIM_KNOBS          JSON {"optimum": {flag: value}, "penalty": p, "oom": [{flag:
                              value}], "noise": n}: a planted goodput surface for autotune's
                              tests, which no SGLang has. Every flag of "optimum" away from its
                              value (the launch's, else its parser default) makes each step
                              1 + p x |log2(value / optimum)| times as long (p default 0.5); a
                              launch at or above every value of an "oom" entry fails while it
                              loads with CUDA out of memory, as a pool too large for the GPU
                              does; each start draws a factor in 1 +- n (default 0) for all its
                              steps: noise between runs
    SGLANG_SIM_ANSWERS        JSON lines {"question": str, "answer": str}: the reference set
                              the simulator answers (see Reference answers)
    SGLANG_SIM_ACCURACY       the share of known questions answered right, 0..1 (default 1)
    SGLANG_SIM_IGNORE_PARSERS tool_call and/or reasoning, comma-separated: the server runs as
                              if launched without that parser (a parser that never engages:
                              a runtime without it, a template whose output it does not match)
Faults no SGLang release makes on purpose, but a dying server, a broken proxy or a bug can (for
the benchmark client's tests; off unless set):
    SGLANG_SIM_FAULT          cut_event: the stream stops in the middle of its second event
                              (a chunk announced whole, half of it sent, then the connection
                              closed), as when the server dies mid-write;
                              meta_info_string / meta_info_list: every event's meta_info is sent
                              as a JSON string of the object / a one-element list holding it;
                              endless_line: after the head, one `data:` line that never ends,
                              SGLANG_SIM_ENDLESS_MIB (default 20) MiB of it in 64 KiB chunks,
                              then the connection is closed (bounded here, not by the client);
                              echo_headers: 400 with a JSON error body that echoes the
                              request's headers, Authorization included, raw and base64
    SGLANG_SIM_FAULT_AT       which client /generate request the fault hits, counted as
                              SGLANG_SIM_CRASH_AFTER counts (default 1; 0: every request)
SGLang's own SGLANG_HEALTH_CHECK_TIMEOUT, SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION,
SGLANG_WARMUP_TIMEOUT, SGLANG_TIMEOUT_KEEP_ALIVE and SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN
are honoured as SGLang honours them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email.utils
import hashlib
import importlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path

VERSION = "0.5.23"
VOCAB = 163840  # Kimi K2.6's
DECODE_LOG_INTERVAL = 40  # ServerArgs.decode_log_interval's default
WARMUP_PROMPT = "The capital city of France is"
FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)
FAULTS = {"", "cut_event", "meta_info_string", "meta_info_list", "endless_line", "echo_headers"}
GRAPH_PHASES = (
    "prefill",
    "decode",
    "target_verify",
    "draft_prefill",
    "draft_decode",
    "draft_extend",
)


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass
class Settings:
    step_ms: float = field(default_factory=lambda: env_float("SGLANG_SIM_STEP_MS", 20))
    accept: float = field(default_factory=lambda: env_float("SGLANG_SIM_ACCEPT", 3.0))
    prefill_ms: float = field(default_factory=lambda: env_float("SGLANG_SIM_PREFILL_MS", 50))
    load_seconds: float = field(default_factory=lambda: env_float("SGLANG_SIM_LOAD_SECONDS", 0))
    poll_seconds: float = field(default_factory=lambda: env_float("SGLANG_SIM_POLL_SECONDS", 1))
    dist_timeout_s: float = field(
        default_factory=lambda: env_float("SGLANG_SIM_DIST_TIMEOUT_S", 300)
    )
    no_generate: bool = field(default_factory=lambda: env_bool("SGLANG_SIM_NO_GENERATE", False))
    crash_after: float = field(default_factory=lambda: env_float("SGLANG_SIM_CRASH_AFTER", 0))
    lossy: float = field(default_factory=lambda: env_float("SGLANG_SIM_LOSSY", 0))
    drift: float = field(default_factory=lambda: env_float("SGLANG_SIM_DRIFT", 0))
    max_running: int = field(default_factory=lambda: int(env_float("SGLANG_SIM_MAX_RUNNING", 256)))
    truth: bool = field(default_factory=lambda: os.environ.get("SGLANG_SIM_TRUTH") == "1")
    truth_dir: str = field(default_factory=lambda: os.environ.get("SGLANG_SIM_TRUTH_DIR", ""))
    reuse_port: bool = field(default_factory=lambda: os.environ.get("SGLANG_SIM_REUSE_PORT") == "1")
    ddtree_table: str = field(default_factory=lambda: os.environ.get("SGLANG_SIM_DDTREE_TABLE", ""))
    fault: str = field(default_factory=lambda: os.environ.get("SGLANG_SIM_FAULT", ""))
    fault_at: int = field(default_factory=lambda: int(env_float("SGLANG_SIM_FAULT_AT", 1)))
    endless_mib: float = field(default_factory=lambda: env_float("SGLANG_SIM_ENDLESS_MIB", 20))
    answers: str = field(default_factory=lambda: os.environ.get("SGLANG_SIM_ANSWERS", ""))
    knobs: str = field(default_factory=lambda: os.environ.get("SGLANG_SIM_KNOBS", ""))
    accuracy: float = field(default_factory=lambda: env_float("SGLANG_SIM_ACCURACY", 1.0))
    ignore_parsers: str = field(
        default_factory=lambda: os.environ.get("SGLANG_SIM_IGNORE_PARSERS", "")
    )
    speed_model: str = field(default_factory=lambda: os.environ.get("SGLANG_SIM_SPEED_MODEL", ""))
    speed_profile: str = field(
        default_factory=lambda: os.environ.get("SGLANG_SIM_SPEED_PROFILE", "h200")
    )
    speed_hardware: str = field(
        default_factory=lambda: os.environ.get("SGLANG_SIM_SPEED_HARDWARE", "")
    )
    speed_allreduce: str = field(
        default_factory=lambda: os.environ.get("SGLANG_SIM_SPEED_ALLREDUCE", "")
    )
    speed_slowdown: float = field(
        default_factory=lambda: env_float("SGLANG_SIM_SPEED_SLOWDOWN", 1.0)
    )
    # SGLang's own environment variables, with its defaults (srt/environ.py, http_server.py).
    health_check_timeout: float = field(
        default_factory=lambda: int(env_float("SGLANG_HEALTH_CHECK_TIMEOUT", 20))
    )
    health_generates: bool = field(
        default_factory=lambda: env_bool("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", True)
    )
    warmup_timeout: float = field(default_factory=lambda: env_float("SGLANG_WARMUP_TIMEOUT", -1))
    keep_alive_s: float = field(default_factory=lambda: env_float("SGLANG_TIMEOUT_KEEP_ALIVE", 5))


SNAPSHOT = "sglang-0.5.23-args.json"
OVERLAY = "sglang-pr29907-overlay.json"


def validator_paths() -> tuple[Path, Path, Path | None]:
    """(folder of sglang_args.py, snapshot file, overlay file or None): in the repo, the
    release's; packaged as a stand-in sglang (tests/support/fake_sglang.py), whatever the package
    ships (the fake pull-request ref adds DDTree's overlay)."""
    here = Path(__file__).resolve().parent
    if (here / "sglang_args.py").is_file():
        overlay = here / OVERLAY
        return here, here / SNAPSHOT, overlay if overlay.is_file() else None
    tests = here.parent  # tests/support/sglang_sim.py in the repo
    return tests.parent / "module_utils" / "plan", tests / "contract" / SNAPSHOT, None


def kit_root() -> Path:
    """The folder holding the kit's module_utils: the repository, or packaged as a stand-in
    sglang the copy it ships beside this file (tests/support/fake_sglang.py, kit_files)."""
    here = Path(__file__).resolve().parent
    shipped = here / "kit"
    return shipped if shipped.is_dir() else here.parents[1]


def merge_config_file(argv: list[str]) -> list[str]:
    """`sglang serve --config FILE.yaml` as prepare_server_args does it: the file's keys become
    flags placed before the command line's own, so the command line wins."""
    if "--config" not in argv:
        return argv
    index = argv.index("--config")
    import yaml

    with open(argv[index + 1], encoding="utf-8") as handle:
        data = yaml.safe_load(handle) or {}
    merged: list[str] = []
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            merged.append(flag)
        elif value is not False and value is not None:
            merged += [flag, str(value)]
    return merged + argv[:index] + argv[index + 2 :]


def parse_args(argv: list[str]) -> dict:
    """Validate against the pinned parser's snapshot; return the resolved arguments."""
    module_dir, snapshot_file, overlay_file = validator_paths()
    sys.path.insert(0, str(module_dir))
    from sglang_args import ArgvError, load_contract, parse_argv, resolve_forced, validate_argv

    snapshot = load_contract(snapshot_file, overlay_file)
    try:
        argv = merge_config_file(argv)
    except (OSError, ValueError, IndexError) as error:
        print(f"launch_server: error: --config: {error}", file=sys.stderr)
        sys.exit(2)
    try:
        validate_argv(argv, snapshot)
        namespace = parse_argv(argv, snapshot)
    except ArgvError as error:
        print(f"launch_server: error: {error}", file=sys.stderr)
        sys.exit(2)
    # What the runtime sets itself whatever argv says (DDTree: no overlap, a default budget).
    resolved = {
        k: v if isinstance(v, (str, int, float, bool, type(None), list, dict)) else str(v)
        for k, v in resolve_forced(vars(namespace), snapshot).items()
    }
    if is_ddtree(resolved):
        # _handle_dflash, which DDTree runs first: the block size flag sets the draft token
        # count; without either, SGLang falls back to 16 when the drafter's config says nothing
        # (the simulator has no drafter to read). Then the pull request's default budget.
        if resolved.get("speculative_num_draft_tokens") is None:
            resolved["speculative_num_draft_tokens"] = int(
                resolved.get("speculative_dflash_block_size") or 16
            )
        if resolved.get("speculative_ddtree_budget") is None:
            resolved["speculative_ddtree_budget"] = resolved["speculative_num_draft_tokens"] - 1
    # What srt/arg_groups/serving_hook.py fills in when the command line leaves it out.
    resolved["tokenizer_path"] = resolved.get("tokenizer_path") or resolved.get("model_path")
    resolved["served_model_name"] = resolved.get("served_model_name") or resolved.get("model_path")
    if resolved.get("random_seed") is None:
        resolved["random_seed"] = random.randint(0, 1 << 30)  # as SGLang does
    resolved["host"] = resolved.get("host") or "127.0.0.1"
    resolved["port"] = int(resolved.get("port") or 30000)
    return {"resolved": resolved, "launch_command": " ".join(argv), "argv": argv}


# Mean contexts within this many tokens share one prediction: the KV cache part changes by a
# few microseconds over it, and each new prediction costs a millisecond of the event loop.
CONTEXT_BUCKET = 32


class StepModel:
    """SGLANG_SIM_SPEED_MODEL: decode steps as long as the kit's speed model predicts for this
    launch (module_utils/plan/speed_model.py, shipped under kit/ in the stand-in package), at
    the step's batch and mean context, times SGLANG_SIM_SPEED_SLOWDOWN."""

    def __init__(self, settings: Settings, argv: list[str], resolved: dict):
        module_dir, _snapshot, _overlay = validator_paths()
        root = str(kit_root())
        if root not in sys.path:
            sys.path.insert(0, root)
        # First: the kit's stages become importable as ansible.module_utils.<stage>.
        importlib.import_module("module_utils")
        from ansible.module_utils.plan import speed_inputs, speed_model

        self.model = speed_model
        hardware = settings.speed_hardware or None
        shipped = module_dir / "speed_hardware.json"
        if hardware is None and shipped.is_file():
            hardware = shipped
        figures = speed_inputs.profile_figures(
            settings.speed_profile, speed_inputs.load_hardware(hardware)
        )
        if settings.speed_allreduce:
            with open(settings.speed_allreduce, encoding="utf-8") as handle:
                record = json.load(handle)
            figures = speed_inputs.apply_allreduce(figures, record, "SGLANG_SIM_SPEED_ALLREDUCE")
        if not 0 < settings.speed_slowdown <= 100:
            raise ValueError(
                f"SGLANG_SIM_SPEED_SLOWDOWN must be above 0 and at most 100, got "
                f"{settings.speed_slowdown:g}"
            )
        self.figures = figures
        self.inputs = speed_inputs.model_inputs(settings.speed_model)
        self.argv = argv
        self.tp = int(resolved.get("tp_size") or 1)
        self.slowdown = settings.speed_slowdown
        self.cache: dict[tuple[int, int], float] = {}
        self.step_ms(1, 1)  # a launch the model cannot predict fails at start, not mid-run

    def step_ms(self, batch: int, context: float) -> float:
        key = (max(1, batch), int(context) // CONTEXT_BUCKET)
        if key not in self.cache:
            middle = key[1] * CONTEXT_BUCKET + CONTEXT_BUCKET // 2
            predicted = self.model.predict_launch(
                self.inputs, self.figures, self.argv, key[0], max(1, middle), self.tp
            )
            self.cache[key] = predicted["step_ms"] * self.slowdown
        return self.cache[key]


def token(prompt: str, index: int, salt: str = "") -> str:
    return "w" + hashlib.blake2b(f"{salt}{prompt}\0{index}".encode(), digest_size=4).hexdigest()


def token_id(word: str) -> int:
    return int(hashlib.blake2b(word.encode(), digest_size=4).hexdigest(), 16) % VOCAB


def draw(*parts) -> float:
    """A uniform number in [0, 1) fixed by its inputs."""
    digest = hashlib.blake2b("\0".join(map(str, parts)).encode(), digest_size=4).hexdigest()
    return int(digest, 16) / (1 << 32)


EOS_ID = 163586  # K2.6's <|im_end|>, the token a finished turn matches
MAX_ANSWERS = 50_000  # rows of SGLANG_SIM_ANSWERS
THINK, END_THINK = "<think>", "</think>"


def finish_reason(request: Request) -> dict:
    """FINISH_MATCHED_TOKEN (the end of sequence) or FINISH_LENGTH, as meta_info carries them
    (srt/managers/schedule_batch.py)."""
    if request.stopped:
        return {"type": "stop", "matched": EOS_ID}
    return {"type": "length", "length": len(request.tokens)}


def load_answers(path: str) -> list[tuple[str, str]]:
    """SGLANG_SIM_ANSWERS: JSON lines of {"question": str, "answer": str}, the reference set
    the simulator can answer; longest questions first, so one that contains another wins."""
    if not path:
        return []
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if number > MAX_ANSWERS:
                raise ValueError(f"SGLANG_SIM_ANSWERS has more than {MAX_ANSWERS} rows")
            if not line.strip():
                continue
            row = json.loads(line)
            question, answer = row.get("question"), row.get("answer")
            if not (isinstance(question, str) and question.strip() and isinstance(answer, str)):
                raise ValueError(f"SGLANG_SIM_ANSWERS line {number}: needs question and answer")
            rows.append((question.strip(), answer.strip()))
    return sorted(rows, key=lambda row: -len(row[0]))


def wrong_answer(answer: str) -> str:
    """An answer that is not the reference but is shaped like one: a number one more, or the
    expression plus one."""
    plain = answer.replace(",", "").strip()
    try:
        return str(int(plain) + 1)
    except ValueError:
        pass
    try:
        return repr(float(plain) + 1)
    except ValueError:
        return f"{answer}+1"


def answer_words(question: str, answer: str, rate: float) -> tuple[list[str], list[str]]:
    """(the working, the final sentence) of the simulated answer to a known question: right
    when draw(question) < rate, so every config draws the same number and a config at a lower
    rate is wrong on a subset of what one at a higher rate got right. The working's length is
    fixed per question (6 to 31 words)."""
    value = answer if draw("answer", question) < rate else wrong_answer(answer)
    working = [token(question, i, salt="work") for i in range(6 + int(draw("len", question) * 26))]
    # One word a token, so text, tokens and output_ids agree for answers with spaces too.
    return working, ["The", "answer", "is", *f"\\boxed{{{value}}}".split(" ")]


def known_question(answers: list[tuple[str, str]], prompt: str) -> tuple[str, str] | None:
    return next(((q, a) for q, a in answers if q in prompt), None)


TOOL_SECTION = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")


def argument_example(schema: object) -> object:
    """A value of the JSON type a tool's parameter asks for."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    examples = {"integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {}}
    return examples.get(kind, "example") if isinstance(kind, str) else "example"


def called_tool(tools: list[dict], choice: object) -> dict:
    """{name, arguments} the model calls: the named tool of a forced choice, else the first
    tool, with an example value for each required parameter."""
    functions = [t.get("function") for t in tools if isinstance(t.get("function"), dict)]
    if not functions:
        raise ValueError("Each tool needs a function")
    function = functions[0]
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        function = next((f for f in functions if f.get("name") == name), None)
        if function is None:
            raise ValueError(f"Tool '{name}' not found in 'tools'.")
    parameters = function.get("parameters") if isinstance(function.get("parameters"), dict) else {}
    properties = (
        parameters.get("properties") if isinstance(parameters.get("properties"), dict) else {}
    )
    required = [r for r in parameters.get("required") or [] if isinstance(r, str)]
    arguments = {name: argument_example(properties.get(name)) for name in required}
    return {"name": str(function.get("name") or ""), "arguments": arguments}


@dataclass
class ChatTurn:
    """What one chat completion asks of the parsers: whether reasoning is split off (a
    reasoning parser, separate_reasoning, thinking left on), the tool called and how."""

    model: str
    reasoning: bool = False
    tool_parser: str = ""
    call: dict | None = None
    forced: bool = False

    def call_words(self) -> list[str]:
        """The call as the model writes it. With a tool-call parser the model's own format
        (K2's sections for kimi_k2, <tool_call> JSON otherwise); without one a forced
        tool_choice is constrained by a JSON schema to [{name, parameters}] (serving_chat.py
        get_json_schema_constraint), and an auto one is left in the model's format."""
        name, arguments = (
            self.call["name"],
            json.dumps(self.call["arguments"], separators=(",", ":")),
        )
        if not self.tool_parser and self.forced:
            return [json.dumps([{"name": name, "parameters": self.call["arguments"]}])]
        if self.tool_parser and self.tool_parser != "kimi_k2":
            return [
                "<tool_call>",
                json.dumps({"name": name, "arguments": self.call["arguments"]}),
                "</tool_call>",
            ]
        return [
            TOOL_SECTION[0],
            "<|tool_call_begin|>",
            f"functions.{name}:0",
            "<|tool_call_argument_begin|>",
            arguments,
            "<|tool_call_end|>",
            TOOL_SECTION[1],
        ]

    def split(self, tokens: list[str]) -> tuple[str, str]:
        """(reasoning, content) of the words so far: the reasoning parser (kimi_k2's detector,
        force_reasoning while thinking is on) takes everything before </think>."""
        if not self.reasoning:
            return "", " ".join(tokens)
        body = tokens[1:] if tokens[:1] == [THINK] else tokens
        if END_THINK in body:
            end = body.index(END_THINK)
            return " ".join(body[:end]), " ".join(body[end + 1 :])
        # K2's detector also ends the reasoning where a tool-call section begins.
        if TOOL_SECTION[0] in body:
            end = body.index(TOOL_SECTION[0])
            return " ".join(body[:end]), " ".join(body[end:])
        return " ".join(body), ""

    def parsed_calls(self, content: str) -> list[dict] | None:
        """The tool-call parser's tool_calls, when it runs and the whole call is in content
        (_process_tool_calls; K2's ids are functions.<name>:<index>)."""
        if self.call is None or not self.tool_parser:
            return None
        if content != " ".join(self.call_words()):
            return None
        name = self.call["name"]
        ident = (
            f"functions.{name}:0"
            if self.tool_parser == "kimi_k2"
            else f"call_{uuid.uuid4().hex[:24]}"
        )
        function = {"name": name, "arguments": json.dumps(self.call["arguments"])}
        return [{"id": ident, "index": 0, "type": "function", "function": function}]


def chat_template_of(model_path: object) -> str | None:
    """The served folder's chat template (chat_template.jinja, else tokenizer_config.json's),
    as the tokenizer loads it; None when it has none."""
    folder = Path(str(model_path or ""))
    with (
        contextlib.suppress(OSError),
        open(folder / "chat_template.jinja", encoding="utf-8") as handle,
    ):
        return handle.read(1 << 20)
    try:
        with open(folder / "tokenizer_config.json", encoding="utf-8") as handle:
            template = json.loads(handle.read(8 << 20)).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) and template else None


def render_messages(template: str | None, messages: list, tools: list, kwargs: dict) -> str:
    """The prompt of a chat completion: the messages through the chat template as
    transformers' apply_chat_template renders it (sandboxed, trim_blocks, lstrip_blocks, the
    generation prompt added, chat_template_kwargs and tools passed); without a template, each
    message on its own line."""
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError("Each message needs a role")
    if template is None:
        lines = [f"{m['role']}: {m.get('content') or ''}" for m in messages]
        return "\n".join([*lines, "assistant:"])
    import jinja2
    import jinja2.ext
    import jinja2.sandbox

    def raise_exception(text):
        raise jinja2.exceptions.TemplateError(text)

    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = lambda value, **_: json.dumps(value, ensure_ascii=False)
    environment.globals["raise_exception"] = raise_exception
    values = {**kwargs, "add_generation_prompt": True, "messages": messages}
    if tools:
        values["tools"] = tools
    try:
        return environment.from_string(template).render(**values)
    except jinja2.exceptions.TemplateError as error:
        raise ValueError(f"chat template: {error}") from None


@dataclass
class Request:
    prompt: str
    max_new_tokens: int
    stream: bool = False
    log_metrics: bool = True
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: float = field(default_factory=time.perf_counter)
    created_wall: float = field(default_factory=time.time)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    admitted: float = 0.0
    prefilled: bool = False
    tokens: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    verify_ct: int = 0
    correct_drafts: int = 0
    histogram: list[int] = field(default_factory=list)
    carry: float = 0.0
    finished: bool = False
    aborted: bool = False
    first_token_time: float = 0.0
    finished_time: float = 0.0
    sent_first: bool = False
    fault: str = ""  # SGLANG_SIM_FAULT, when it hits this request
    # What the model says, word by word, when the prompt calls for a particular answer (a
    # known question, a chat turn); None: words derived from the prompt up to max_new_tokens.
    script: list[str] | None = None
    stopped: bool = False  # finished at its end of sequence, before max_new_tokens
    # sampling_params.ignore_eos: the script's end of sequence does not stop it (past the
    # script the words derive from the prompt), so it decodes exactly max_new_tokens.
    ignore_eos: bool = False

    @property
    def limit(self) -> int:
        """Tokens it generates: its script's, cut at max_new_tokens."""
        if self.script is None or self.ignore_eos:
            return self.max_new_tokens
        return min(self.max_new_tokens, len(self.script))

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt.split())


class Simulator:
    def __init__(self, args: dict, settings: Settings, step_model: StepModel | None = None):
        self.resolved = args["resolved"]
        self.launch_command = args["launch_command"]
        self.settings = settings
        self.step_model = step_model
        self.speculative = self.resolved.get("speculative_algorithm") is not None
        self.draft_tokens = int(self.resolved.get("speculative_num_draft_tokens") or 4)
        # tokenizer_manager: spec_num_proposed_drafts = verify steps x
        # (max_speculative_num_draft_tokens - 1).
        self.proposed_per_step = self.draft_tokens - 1
        if is_ddtree(self.resolved):
            # The verifier's tokens per step: the tree's nodes plus its root. The pull request's
            # max_speculative_num_draft_tokens is max(block size, budget + 1), the block size
            # being the draft token count its _handle_dflash settles on.
            budget = int(self.resolved["speculative_ddtree_budget"])
            self.proposed_per_step = max(self.draft_tokens, budget + 1) - 1
            self.draft_tokens = budget + 1
        self.model_name = self.resolved.get("served_model_name") or ""
        self.model_type, self.architectures = model_identity(self.resolved.get("model_path"))
        self.vocab_size = vocab_size_of(self.resolved.get("model_path"))
        # Prefill-decode disaggregation (--disaggregation-mode): "prefill", "decode" or "".
        mode = str(self.resolved.get("disaggregation_mode") or "null")
        self.disaggregation = "" if mode == "null" else mode
        # A prefill server's finished bootstrap rooms, which its decode peers wait for.
        self.rooms: dict[int, asyncio.Event] = {}
        self.status = "Starting"
        self.running: list[Request] = []
        self.waiting: list[Request] = []
        self.wakeup = asyncio.Event()
        self.last_receive = 0.0  # wall time of the last output, as TokenizerManager keeps it
        self.generate_count = 0
        self.prefix_cache: set[str] = set()
        self.pending_flush: tuple[asyncio.Future, float] | None = None
        self.startup_time: dict = {}
        self.scheduler_startup_time: dict = {}
        # Prometheus counters: {(name, labels): value}
        self.counters: dict[tuple[str, tuple], float] = {}
        # Scheduler-side accept-length accounting (metrics_reporter).
        self.forward_ct_decode = 0
        self.interval_accept_tokens = 0
        self.interval_forward_ct = 0
        self.total_accept_tokens = 0
        self.total_forward_ct = 0
        self.interval_generated = 0
        self.interval_started = time.perf_counter()
        self.last_gen_throughput = 0.0
        self.last_accept_length = 0.0
        # Server-side timings when SGLANG_SIM_TRUTH=1: one record per streamed request.
        self.truth: list[dict] = []
        self.answers = load_answers(settings.answers)
        self.chat_template = chat_template_of(self.resolved.get("model_path"))
        self.created = int(time.time())

    # -- scheduler ---------------------------------------------------------------------

    def submit(self, request: Request) -> None:
        self.waiting.append(request)
        self.wakeup.set()

    def abort(self, request: Request) -> None:
        request.aborted = True
        if request in self.running:
            self.running.remove(request)
        if request in self.waiting:
            self.waiting.remove(request)

    def idle(self) -> bool:
        return not self.running and not self.waiting

    def tokens_this_step(self, request: Request) -> int:
        if not self.speculative:
            return 1
        request.carry += max(self.settings.accept, 1.0)
        count = max(1, math.floor(request.carry))
        request.carry -= count
        return count

    def next_token(self, request: Request, index: int) -> str:
        prompt = request.prompt
        # Greedy outputs under speculation are not bitwise those of plain decoding: a near tie
        # resolved the other way changes the rest of the answer.
        drifts = self.speculative and draw("drift", prompt) < self.settings.drift
        if drifts and index >= math.floor(draw("drift-at", prompt) * request.max_new_tokens):
            return token(prompt, index, salt="drift")
        script = request.script
        word = script[index] if script is not None and index < len(script) else token(prompt, index)
        # A verification bug: accepted drafts that plain decoding would not produce.
        if self.speculative and draw("lossy", index, prompt) < self.settings.lossy:
            word = "x" + word[1:]
        return word

    def append(self, request: Request, count: int) -> None:
        start = len(request.tokens)
        words = [self.next_token(request, start + i) for i in range(count)]
        request.tokens += words
        request.ids += [token_id(word) for word in words]

    def admit(self) -> None:
        while self.waiting and len(self.running) < self.settings.max_running:
            request = self.waiting.pop(0)
            request.admitted = time.monotonic()
            # The radix cache matches at most all but the last token of a prompt it has seen.
            if request.prompt in self.prefix_cache:
                request.cached_tokens = max(request.prompt_tokens - 1, 0)
            self.prefix_cache.add(request.prompt)
            self.running.append(request)

    def step_seconds(self) -> float:
        """The next decode step's time: SGLANG_SIM_STEP_MS, or the speed model's for the
        requests decoding (a step that only waits on prefills costs a one-request step)."""
        if self.step_model is None:
            return self.settings.step_ms / 1000
        decoding = [r for r in self.running if r.prefilled]
        context = (
            sum(r.prompt_tokens + len(r.tokens) for r in decoding) / len(decoding)
            if decoding
            else 1
        )
        return self.step_model.step_ms(len(decoding), context) / 1000

    async def scheduler(self) -> None:
        step = self.settings.step_ms / 1000
        deadline = time.monotonic()
        while True:
            self.admit()
            self.check_pending_flush()
            if not self.running:
                self.wakeup.clear()
                if self.pending_flush is None:
                    await self.wakeup.wait()
                else:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self.wakeup.wait(), step)
                deadline = time.monotonic()
                continue
            deadline += self.step_seconds()
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            if self.settings.no_generate:
                continue
            self.run_step()

    def run_step(self) -> None:
        now = time.monotonic()
        decoded = generated = 0
        produced = False
        for request in list(self.running):
            if not request.prefilled:
                if now - request.admitted < self.settings.prefill_ms / 1000:
                    continue
                # The first token comes from prefill, not from a verify step.
                request.prefilled = True
                request.first_token_time = time.perf_counter()
                self.append(request, 1)
            else:
                count = self.tokens_this_step(request)
                if self.speculative:
                    request.verify_ct += 1
                    correct = count - 1
                    request.correct_drafts += correct
                    if len(request.histogram) <= correct:
                        request.histogram += [0] * (correct + 1 - len(request.histogram))
                    request.histogram[correct] += 1
                # Output past max_new_tokens is cut (Req.update_finish_state); the drafts the
                # verifier accepted still count as accepted.
                self.append(request, min(count, request.limit - len(request.tokens)))
                decoded += 1
                generated += count
            produced = True
            if len(request.tokens) >= request.limit:
                # The script's end is the model's end of sequence, unless the budget cut it.
                request.stopped = len(request.tokens) < request.max_new_tokens
                self.finish(request)
            request.changed.set()
        if produced:
            self.last_receive = time.time()
        if decoded:
            self.decode_stats(decoded, generated)

    def decode_stats(self, batch: int, generated: int) -> None:
        """metrics_reporter: counts per decode batch, folded into the lifetime accept length
        (and the log line's throughput) every decode_log_interval batches."""
        self.forward_ct_decode += 1
        self.interval_generated += generated
        if self.speculative:
            self.interval_accept_tokens += generated
            self.interval_forward_ct += batch
        if self.forward_ct_decode % DECODE_LOG_INTERVAL:
            return
        now = time.perf_counter()
        self.last_gen_throughput = self.interval_generated / max(now - self.interval_started, 1e-9)
        self.interval_started, self.interval_generated = now, 0
        if self.speculative and self.interval_forward_ct:
            self.last_accept_length = self.interval_accept_tokens / self.interval_forward_ct
            self.total_accept_tokens += self.interval_accept_tokens
            self.total_forward_ct += self.interval_forward_ct
            self.interval_accept_tokens = self.interval_forward_ct = 0

    def finish(self, request: Request) -> None:
        request.finished = True
        request.finished_time = time.perf_counter()
        if request in self.running:
            self.running.remove(request)
        if request.log_metrics and self.resolved.get("enable_metrics"):
            streaming = "true" if request.stream else "false"
            labels = (("engine_type", "unified"), ("is_streaming", streaming))
            labels += (("model_name", self.model_name),)
            self.count("sglang:prompt_tokens_total", labels, request.prompt_tokens)
            self.count("sglang:generation_tokens_total", labels, len(request.tokens))
            self.count("sglang:num_requests_total", labels, 1)
            if request.verify_ct > 0:
                plain = (("engine_type", "unified"), ("model_name", self.model_name))
                self.count("sglang:spec_verify_calls_total", plain, request.verify_ct)

    def count(self, name: str, labels: tuple, value: float) -> None:
        self.counters[(name, labels)] = self.counters.get((name, labels), 0.0) + value

    # -- flush_cache ---------------------------------------------------------------------

    def flush(self) -> None:
        self.prefix_cache.clear()
        self.interval_accept_tokens = self.interval_forward_ct = 0
        self.total_accept_tokens = self.total_forward_ct = 0
        self.forward_ct_decode = self.interval_generated = 0

    def check_pending_flush(self) -> None:
        if self.pending_flush is None:
            return
        future, deadline = self.pending_flush
        if future.done():
            self.pending_flush = None
        elif self.idle():
            self.flush()
            self.pending_flush = None
            future.set_result((True, ""))
        elif time.monotonic() >= deadline:
            self.pending_flush = None
            future.set_result((False, "Timed out waiting for idle state."))

    async def flush_cache(self, timeout_s: float) -> tuple[bool, str]:
        if self.pending_flush is not None:
            return False, "Another flush_cache is already in progress."
        if timeout_s <= 0 or self.idle():
            if not self.idle():
                return False, ""
            self.flush()
            return True, ""
        future = asyncio.get_running_loop().create_future()
        self.pending_flush = (future, time.monotonic() + timeout_s)
        self.wakeup.set()
        return await future

    # -- what the server reports -----------------------------------------------------------

    def meta_info(self, request: Request, finished: bool) -> dict:
        tokens = len(request.tokens)
        meta = {
            "id": request.rid,
            "finish_reason": finish_reason(request) if finished else None,
            "prompt_tokens": request.prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
        }
        if self.resolved.get("enable_metrics"):
            meta["queue_time"] = max(request.admitted - request.created, 0.0)
        meta.update(
            reasoning_tokens=0,
            completion_tokens=tokens,
            cached_tokens=request.cached_tokens,
            cached_tokens_details=(
                {"device": request.cached_tokens, "host": 0} if request.cached_tokens else None
            ),
        )
        if not finished:
            return meta
        meta["e2e_latency"] = request.finished_time - request.created
        if self.speculative and request.verify_ct > 0:
            proposed = request.verify_ct * self.proposed_per_step
            if proposed > 0:
                meta["spec_accept_rate"] = request.correct_drafts / proposed
                meta["spec_accept_length"] = tokens / request.verify_ct
                meta["spec_num_correct_drafts"] = request.correct_drafts
                meta["spec_num_proposed_drafts"] = proposed
                meta["spec_verify_ct"] = request.verify_ct
            if request.histogram:
                meta["spec_correct_drafts_histogram"] = list(request.histogram)
        if self.resolved.get("enable_metrics"):
            meta["request_received_ts"] = request.created_wall
            meta["first_token_latency"] = request.first_token_time - request.created
            if tokens > 1 and request.finished_time > request.first_token_time:
                tpot = (request.finished_time - request.first_token_time) / (tokens - 1)
                meta["decode_throughput"] = 1.0 / tpot
        return meta

    def output(self, request: Request, finished: bool) -> dict:
        out = {
            "text": " ".join(request.tokens),
            "output_ids": list(request.ids),
            "meta_info": self.meta_info(request, finished),
        }
        if not request.sent_first:
            request.sent_first = True
            out["meta_info"]["response_sent_to_client_ts"] = time.time()
        if request.fault == "meta_info_string":
            out["meta_info"] = json.dumps(out["meta_info"])
        elif request.fault == "meta_info_list":
            out["meta_info"] = [out["meta_info"]]
        return out

    def internal_state(self) -> dict:
        state = dict(self.resolved)
        state.update(
            world_size=int(self.resolved.get("tp_size") or 1)
            * int(self.resolved.get("pp_size") or 1),
            startup_time=self.scheduler_startup_time,
            effective_max_running_requests_per_dp=self.settings.max_running,
            last_gen_throughput=self.last_gen_throughput,
        )
        if self.speculative and self.total_forward_ct > 0:
            state["avg_spec_accept_length"] = self.total_accept_tokens / self.total_forward_ct
        return state

    def server_info(self) -> dict:
        info = dict(self.resolved)
        info["launch_command"] = self.launch_command
        info.update(
            status="ready",
            max_total_num_tokens=1_000_000,
            max_req_input_len=262_143,
            startup_time=self.scheduler_startup_time,
            hicache_object_layout={
                "enabled": False,
                "backend": None,
                "page_size": self.resolved.get("page_size"),
                "hicache_object_layout": {"pools": []},
                "reason": "Hierarchical cache is disabled",
            },
        )
        info["kv_events"] = None
        info.update(
            startup_time=self.startup_time,
            internal_states=[self.internal_state()],
            version=VERSION,
            frontend="python",
        )
        return info

    def model_info(self) -> dict:
        return {
            "model_path": self.resolved.get("model_path"),
            "served_model_name": self.model_name,
            "tokenizer_path": self.resolved.get("tokenizer_path"),
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": self.resolved.get("load_format"),
            "reasoning_parser": self.resolved.get("reasoning_parser"),
            "tool_call_parser": self.resolved.get("tool_call_parser"),
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": self.model_type,
            "architectures": self.architectures,
        }

    def metrics(self) -> str:
        lines = []
        kinds = {}
        for (name, labels), value in sorted(self.counters.items()):
            base = name.removesuffix("_total")
            if base not in kinds:
                kinds[base] = True
                lines += [f"# HELP {base} {name}", f"# TYPE {base} counter"]
            text = ",".join(f'{k}="{v}"' for k, v in labels)
            lines.append(f"{name}{{{text}}} {float(value)}")
        model = f'model_name="{self.model_name}"'
        gauges = [
            ("sglang:num_running_reqs", len(self.running)),
            ("sglang:num_queue_reqs", len(self.waiting)),
            ("sglang:gen_throughput", self.last_gen_throughput),
        ]
        if self.speculative:
            gauges.append(("sglang:spec_accept_length", self.last_accept_length))
        for name, value in gauges:
            lines += [f"# HELP {name} {name}", f"# TYPE {name} gauge"]
            lines.append(
                f'{name}{{engine_type="unified",{model},pp_rank="0",tp_rank="0"}} {float(value)}'
            )
        lines += [
            "# HELP sglang:startup_time_seconds startup",
            "# TYPE sglang:startup_time_seconds gauge",
        ]
        for phase in ("load_weight", "kv_cache_allocation", "scheduler_e2e", "tokenizer_e2e"):
            value = float(self.startup_time.get(phase, 0.0))
            lines.append(
                f'sglang:startup_time_seconds{{engine_type="unified",{model},phase="{phase}"}} '
                f"{value}"
            )
        return "\n".join(lines) + "\n"

    # -- start-up ------------------------------------------------------------------------

    async def warmup(self) -> None:
        """_execute_server_warmup: one second, then an 8-token /generate; Up when it returns,
        killed when it does not within the warmup timeout."""
        await asyncio.sleep(self.settings.poll_seconds)
        request = Request(WARMUP_PROMPT, 8)
        self.submit(request)
        limit = self.settings.warmup_timeout if self.settings.warmup_timeout > 0 else 600
        deadline = time.monotonic() + limit
        while not request.finished and time.monotonic() < deadline:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(request.changed.wait(), deadline - time.monotonic())
            request.changed.clear()
        if not request.finished:
            print(
                f"Initialization failed. warmup error: no answer to the warmup request within "
                f"{limit:g} s",
                file=sys.stderr,
                flush=True,
            )
            os.kill(os.getpid(), signal.SIGKILL)
        self.status = "Up"
        print("The server is fired up and ready to roll!", flush=True)

    async def health_generate(self, path: str) -> int:
        if self.status == "Starting":
            return 503
        if not self.settings.health_generates and path == "/health":
            return 200
        request = Request("0", 1, log_metrics=False)
        self.submit(request)
        tic = time.time()
        try:
            while time.time() < tic + self.settings.health_check_timeout:
                await asyncio.sleep(self.settings.poll_seconds)
                if self.last_receive > tic:
                    self.status = "Up"
                    return 200
        finally:
            self.abort(request)
        print(
            f"Health check failed. Server couldn't get a response from detokenizer for last "
            f"{self.settings.health_check_timeout:g} seconds.",
            file=sys.stderr,
            flush=True,
        )
        self.status = "UnHealthy"
        return 503

    # -- /generate -----------------------------------------------------------------------

    def request_of(self, body: dict) -> Request:
        params = body.get("sampling_params") or {}
        text = body.get("text")
        if text is None and body.get("input_ids") is not None:
            # One prompt token a word: prompt_tokens is len(input_ids), as SGLang counts it.
            text = " ".join(map(str, body["input_ids"]))
        if text is None:
            raise ValueError("Either text, input_ids or input_embeds should be provided.")
        request = Request(
            str(text),
            int(params.get("max_new_tokens", 128)),
            stream=bool(body.get("stream")),
            ignore_eos=params.get("ignore_eos") is True,
        )
        known = known_question(self.answers, request.prompt)
        if known is not None:
            working, final = answer_words(*known, self.settings.accuracy)
            request.script = working + final
        return request

    async def generate(
        self, body: dict, reply: Http, arrival: float | None, headers: dict | None = None
    ) -> None:
        self.generate_count += 1
        crash_after = self.settings.crash_after
        if crash_after and self.generate_count > crash_after:
            print("simulated crash", file=sys.stderr, flush=True)
            os._exit(1)
        at = self.settings.fault_at
        fault = self.settings.fault if at in (0, self.generate_count) else ""
        if fault == "echo_headers":
            await reply.respond(400, echo_headers(headers or {}), "application/json")
            return
        refused = input_ids_error(body.get("input_ids"), self.vocab_size)
        if refused is not None:
            await reply.respond(400, compact(bad_request(refused)), "application/json")
            return
        try:
            request = self.request_of(body)
        except (ValueError, TypeError) as error:
            message = {"error": {"message": str(error), "code": 400}}
            await reply.respond(400, json.dumps(message).encode(), "application/json")
            return
        request.fault = fault
        if arrival is not None:
            request.created = arrival
        room = None
        if self.disaggregation:
            refused, room = await disaggregated(self, request, body)
            if refused is not None:
                await reply.respond(refused[0], compact(refused[1]), "application/json")
                return
        self.submit(request)
        try:
            if not request.stream:
                while not request.finished:
                    await request.changed.wait()
                    request.changed.clear()
                payload = compact(self.output(request, True))
                prefilled(self, room)
                await reply.respond(200, payload, "application/json")
                return
            await self.stream(request, reply)
            prefilled(self, room)
        except (ConnectionError, asyncio.CancelledError):
            # SGLang aborts a request whose client went away (create_abort_task).
            self.abort(request)
            raise

    async def stream(self, request: Request, reply: Http) -> None:
        truth = None
        if self.settings.truth and len(self.truth) < 1_000_000:
            truth = {
                "arrival": request.created,
                "prompt_sha256": hashlib.sha256(request.prompt.encode()).hexdigest(),
                "events": [],
                "done": None,
            }
            self.truth.append(truth)
        await reply.start_stream(200, "text/event-stream; charset=utf-8")
        if request.fault == "endless_line":
            await reply.endless_line(self.settings.endless_mib)
        sent = 0
        while True:
            await request.changed.wait()
            # Everything queued since the last event goes out as one, with the latest state.
            request.changed.clear()
            finished = request.finished
            event = b"data: " + compact(self.output(request, finished)) + b"\n\n"
            sent += 1
            if request.fault == "cut_event" and sent == 2:
                await reply.cut(event)
            await reply.chunk(event)
            if truth is not None:
                truth["events"].append((time.perf_counter(), len(request.tokens)))
            if finished:
                break
        await reply.chunk(b"data: [DONE]\n\n")
        if truth is not None:
            truth["done"] = time.perf_counter()
            if self.settings.truth_dir:
                path = os.path.join(self.settings.truth_dir, f"{os.getpid()}.jsonl")
                with open(path, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps(truth) + "\n")
        await reply.end_stream()

    # -- OpenAI-compatible API (srt/entrypoints/openai/) ----------------------------------

    def parser(self, kind: str) -> str:
        """The server's --<kind>-parser (tool_call, reasoning), "" without one or when
        SGLANG_SIM_IGNORE_PARSERS names it (a parser that never engages)."""
        ignored = {name.strip() for name in self.settings.ignore_parsers.split(",")}
        return "" if kind in ignored else str(self.resolved.get(f"{kind}_parser") or "")

    def models(self) -> dict:
        """http_server.py available_models: one ModelCard, the served model name."""
        card = {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "sglang",
            "root": self.model_name,
            "parent": None,
            "max_model_len": int(self.resolved.get("context_length") or 262_144),
        }
        return {"object": "list", "data": [card]}

    def chat_turn(self, body: dict) -> tuple[Request, ChatTurn]:
        """The request a chat completion becomes: the messages through the model folder's
        chat template (tools and chat_template_kwargs passed to it), and what the model says."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("Messages cannot be empty.")
        kwargs = body.get("chat_template_kwargs") or {}
        tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
        if not isinstance(kwargs, dict):
            raise ValueError("chat_template_kwargs must be an object")
        prompt = render_messages(self.chat_template, messages, tools, kwargs)
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        request = Request(prompt, int(limit) if limit else 1 << 20, stream=bool(body.get("stream")))
        thinking = (
            kwargs.get("thinking") is not False and kwargs.get("enable_thinking") is not False
        )
        turn = ChatTurn(
            model=str(body.get("model") or self.model_name),
            reasoning=bool(self.parser("reasoning"))
            and body.get("separate_reasoning", True) is not False
            and thinking,
            tool_parser=self.parser("tool_call"),
        )
        choice = body.get("tool_choice", "auto" if tools else "none")
        if tools and choice != "none":
            # The simulated model calls at once, without thinking first: nothing to split off.
            turn.reasoning = False
            turn.call = called_tool(tools, choice)
            turn.forced = choice == "required" or isinstance(choice, dict)
            request.script = turn.call_words()
            return request, turn
        known = known_question(self.answers, prompt)
        if known is not None:
            working, final = answer_words(*known, self.settings.accuracy)
        else:
            working = [token(prompt, i, salt="think") for i in range(12)]
            final = [token(prompt, i, salt="say") for i in range(12)]
        request.script = [THINK, *working, END_THINK, *final] if thinking else working + final
        return request, turn

    async def chat(self, body: dict, reply: Http, arrival: float | None) -> None:
        try:
            request, turn = self.chat_turn(body)
        except (ValueError, TypeError, LookupError) as error:
            message = {
                "object": "error",
                "message": str(error),
                "type": "BadRequest",
                "param": None,
                "code": 400,
            }
            await reply.respond(400, compact(message), "application/json")
            return
        if arrival is not None:
            request.created = arrival
        self.submit(request)
        try:
            if request.stream:
                await self.chat_stream(request, turn, reply, body)
                return
            while not request.finished:
                await request.changed.wait()
                request.changed.clear()
            await reply.respond(200, compact(self.chat_response(request, turn)), "application/json")
        except (ConnectionError, asyncio.CancelledError):
            self.abort(request)
            raise

    def chat_response(self, request: Request, turn: ChatTurn) -> dict:
        """serving_chat.py _build_chat_response: reasoning split off by the reasoning parser,
        the call parsed by the tool-call parser; without them the text stays in content."""
        reasoning, content = turn.split(request.tokens)
        calls = turn.parsed_calls(content)
        finish = finish_reason(request)["type"]
        if calls is not None:
            content, finish = "", "tool_calls" if finish == "stop" else finish
        message = {"role": "assistant", "content": content, "reasoning_content": reasoning or None}
        if calls is not None:
            message["tool_calls"] = calls
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": EOS_ID if finish == "stop" else None,
        }
        return {
            "id": request.rid,
            "object": "chat.completion",
            "created": int(request.created_wall),
            "model": turn.model,
            "choices": [choice],
            "usage": self.usage(request),
            "metadata": {"weight_version": "default"},
        }

    @staticmethod
    def usage(request: Request) -> dict:
        return {
            "prompt_tokens": request.prompt_tokens,
            "total_tokens": request.prompt_tokens + len(request.tokens),
            "completion_tokens": len(request.tokens),
            "prompt_tokens_details": None,
            "reasoning_tokens": 0,
        }

    async def chat_stream(self, request: Request, turn: ChatTurn, reply: Http, body: dict) -> None:
        """serving_chat.py _generate_chat_stream: a first chunk with the role, then per
        scheduler output the new reasoning_content or content, the call whole once parsed,
        a chunk with the finish reason, the usage chunk when asked for, then [DONE]."""

        def chunk(delta: dict, finish=None, usage=None, choices=True) -> bytes:
            if delta:  # DeltaMessage's fields, those not given null (tool_calls dropped)
                delta = {"role": None, "content": None, "reasoning_content": None, **delta}
            choice = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": EOS_ID if finish == "stop" else None,
            }
            event = {
                "id": request.rid,
                "object": "chat.completion.chunk",
                "created": int(request.created_wall),
                "model": turn.model,
                "choices": [choice] if choices else [],
                "usage": usage,
            }
            return b"data: " + compact(event) + b"\n\n"

        await reply.start_stream(200, "text/event-stream; charset=utf-8")
        await reply.chunk(chunk({"role": "assistant", "content": ""}))
        sent_reasoning, sent_content = "", ""
        while True:
            await request.changed.wait()
            request.changed.clear()
            finished = request.finished
            reasoning, content = turn.split(request.tokens)
            if len(reasoning) > len(sent_reasoning):
                delta = reasoning[len(sent_reasoning) :]
                await reply.chunk(chunk({"reasoning_content": delta}))
                sent_reasoning = reasoning
            # The tool-call parser holds the call's text back until it is whole.
            held = turn.call is not None and bool(turn.tool_parser)
            if not held and len(content) > len(sent_content):
                await reply.chunk(chunk({"content": content[len(sent_content) :]}))
                sent_content = content
            if finished:
                break
        finish = finish_reason(request)["type"]
        calls = turn.parsed_calls(content) if turn.call is not None else None
        if calls is not None:
            await reply.chunk(chunk({"tool_calls": calls}))
            finish = "tool_calls" if finish == "stop" else finish
        elif turn.call is not None and turn.tool_parser:
            await reply.chunk(chunk({"content": content}))
        await reply.chunk(chunk({}, finish=finish))
        options = body.get("stream_options") or {}
        if isinstance(options, dict) and options.get("include_usage"):
            await reply.chunk(chunk({}, usage=self.usage(request), choices=False))
        await reply.chunk(b"data: [DONE]\n\n")
        await reply.end_stream()


def echo_headers(headers: dict) -> bytes:
    """An error body that echoes the request's headers (SGLANG_SIM_FAULT=echo_headers), as a
    debugging proxy or error middleware might: Authorization first, raw and base64."""
    auth = headers.get("authorization", "")
    echoed = {"authorization": auth, **{k: v for k, v in headers.items() if k != "authorization"}}
    error = {
        "message": "Bad request",
        "authorization_b64": base64.b64encode(auth.encode()).decode(),
        "request_headers": echoed,
    }
    return compact({"error": error})


def compact(data) -> bytes:
    """JSON as orjson writes it: no spaces."""
    return json.dumps(data, separators=(",", ":"), default=str).encode()


class Http:
    """One HTTP/1.1 response on a connection, framed as uvicorn frames it."""

    def __init__(self, writer: asyncio.StreamWriter, keep_alive: bool):
        self.writer = writer
        self.keep_alive = keep_alive

    def head(self, status: int, headers: list[tuple[str, str]]) -> bytes:
        phrase = HTTPStatus(status).phrase
        lines = [f"HTTP/1.1 {status} {phrase}"]
        lines.append(f"date: {email.utils.formatdate(usegmt=True)}")
        lines.append("server: uvicorn")
        lines += [f"{name}: {value}" for name, value in headers]
        if not self.keep_alive:
            lines.append("connection: close")
        return ("\r\n".join(lines) + "\r\n").encode("latin-1")

    async def respond(self, status: int, body: bytes, content_type: str | None = None) -> None:
        headers = [("content-length", str(len(body)))]
        if content_type:
            headers.append(("content-type", content_type))
        self.writer.write(self.head(status, headers) + b"\r\n" + body)
        await self.writer.drain()

    async def start_stream(self, status: int, content_type: str) -> None:
        head = self.head(status, [("content-type", content_type)])
        self.writer.write(head + b"transfer-encoding: chunked\r\n\r\n")
        await self.writer.drain()

    async def chunk(self, data: bytes) -> None:
        self.writer.write(b"%x\r\n" % len(data) + data + b"\r\n")
        await self.writer.drain()

    async def end_stream(self) -> None:
        self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()

    async def cut(self, event: bytes) -> None:
        """SGLANG_SIM_FAULT=cut_event: the event's chunk announced whole, half of it sent, the
        connection closed."""
        self.writer.write(b"%x\r\n" % len(event) + event[: len(event) // 2])
        await self.writer.drain()
        self.writer.close()
        raise ConnectionResetError("simulated cut inside an event")

    async def endless_line(self, mib: float) -> None:
        """SGLANG_SIM_FAULT=endless_line: a `data:` line that does not end, `mib` MiB of it,
        then the connection closed."""
        await self.chunk(b'data: {"text":"')
        piece = b"a" * (64 << 10)
        for _ in range(int(mib * 16)):
            await self.chunk(piece)
        self.writer.close()
        raise ConnectionResetError("simulated endless line")


class Stamped(asyncio.StreamReader):
    accepted = 0.0


class StampedProtocol(asyncio.StreamReaderProtocol):
    """Notes when the request's first bytes were read: handlers of a burst of connections
    start one after the other, so a request's arrival is taken here, not when its handler
    runs."""

    def __init__(self, reader: Stamped, *args, **kwargs):
        super().__init__(reader, *args, **kwargs)
        self.stamped = reader

    def data_received(self, data: bytes) -> None:
        if not self.stamped.accepted:
            self.stamped.accepted = time.perf_counter()
        super().data_received(data)


def authorized(header: str | None, key: str) -> bool:
    """decide_request_auth's bearer check."""
    parts = (header or "").split(" ", 1)
    return len(parts) == 2 and parts[0].lower() == "bearer" and parts[1] == key


async def json_body(body: bytes, reply: Http) -> dict | None:
    """The request's JSON object, or None after answering 422 as FastAPI's validation does."""
    try:
        data = json.loads(body or b"null")
    except ValueError:
        data = None
    if not isinstance(data, dict):
        detail = {"detail": [{"loc": ["body"], "msg": "a JSON object is required"}]}
        await reply.respond(422, compact(detail), "application/json")
        return None
    return data


async def dispatch(simulator: Simulator, method, path, query, headers, body, reply, arrival):
    api_key = simulator.resolved.get("api_key")
    open_path = path.startswith(("/health", "/ready", "/metrics"))
    if api_key and not open_path and not authorized(headers.get("authorization"), api_key):
        await reply.respond(401, b'{"error":"Unauthorized"}', "application/json")
    elif path in ("/health", "/health_generate") and method == "GET":
        await reply.respond(await simulator.health_generate(path), b"")
    elif path == "/ready" and method == "GET":
        await reply.respond(200 if simulator.status == "Up" else 503, b"")
    elif path in ("/server_info", "/get_server_info") and method == "GET":
        await reply.respond(200, compact(simulator.server_info()), "application/json")
    elif path in ("/model_info", "/get_model_info") and method == "GET":
        await reply.respond(200, compact(simulator.model_info()), "application/json")
    elif path.startswith("/metrics") and simulator.resolved.get("enable_metrics"):
        text = simulator.metrics().encode()
        await reply.respond(200, text, "text/plain; version=0.0.4; charset=utf-8")
    elif path == "/flush_cache" and method in ("GET", "POST"):
        try:
            timeout = float(query.get("timeout", "0") or 0)
        except ValueError:
            timeout = -1
        if timeout < 0:
            detail = {"detail": [{"loc": ["query", "timeout"], "msg": "bad timeout"}]}
            await reply.respond(422, compact(detail), "application/json")
            return
        success, message = await simulator.flush_cache(timeout)
        text = FLUSHED if success else (message or "Flush cache failed.\n")
        await reply.respond(200 if success else 400, text.encode())
    elif path == "/sim_truth" and simulator.settings.truth:
        await reply.respond(200, json.dumps(simulator.truth).encode(), "application/json")
    elif path == "/sim_truth/reset" and simulator.settings.truth:
        simulator.truth = []
        await reply.respond(200, b"")
    elif path == "/v1/models" and method == "GET":
        await reply.respond(200, compact(simulator.models()), "application/json")
    elif path.startswith("/v1/models/") and method == "GET":
        card = simulator.models()["data"][0]
        if path[len("/v1/models/") :] == card["id"]:
            await reply.respond(200, compact(card), "application/json")
        else:
            error = {"message": f"The model '{path[len('/v1/models/') :]}' does not exist"}
            error.update(type="invalid_request_error", param="model", code="model_not_found")
            await reply.respond(404, compact({"error": error}), "application/json")
    elif path == "/v1/chat/completions" and method == "POST":
        data = await json_body(body, reply)
        if data is not None:
            await simulator.chat(data, reply, arrival)
    elif path == "/generate" and method in ("POST", "PUT"):
        data = await json_body(body, reply)
        if data is not None:
            await simulator.generate(data, reply, arrival, headers)
    elif path == "/generate":
        await reply.respond(405, b'{"detail":"Method Not Allowed"}', "application/json")
    else:
        await reply.respond(404, b'{"detail":"Not Found"}', "application/json")


async def serve(args: dict, settings: Settings) -> None:
    started = time.perf_counter()
    host, port = args["resolved"]["host"], args["resolved"]["port"]
    print(
        f"simulated sglang {VERSION} loading for {settings.load_seconds:g} s "
        f"before serving on {host}:{port}",
        flush=True,
    )
    resolved = args["resolved"]
    if int(resolved.get("nnodes") or 1) > 1:
        await join_ranks(resolved, settings)
    await asyncio.sleep(settings.load_seconds)
    if int(resolved.get("node_rank") or 0) >= 1:
        await serve_rank(host, port)
        return
    if args.get("failure") is not None:
        # A scheduler failed while loading: the launch process kills its whole tree
        # (kill_process_tree of itself, so SIGKILL) before the port ever opens.
        report_failure(args["failure"])
        os.kill(os.getpid(), signal.SIGKILL)
    loaded = time.perf_counter()
    simulator = Simulator(args, settings, args.get("step_model"))
    allocated = time.perf_counter()
    simulator.scheduler_startup_time = {
        "load_weight": loaded - started,
        "kv_cache_allocation": allocated - loaded,
        "scheduler_e2e": allocated - started,
        "cuda_graph": dict.fromkeys(GRAPH_PHASES, 0.0),
    }
    scheduler = asyncio.ensure_future(simulator.scheduler())
    if simulator.disaggregation == "prefill":
        bootstrap_port = int(resolved.get("disaggregation_bootstrap_port") or 8998)
        simulator.bootstrap = await serve_bootstrap(simulator, host, bootstrap_port)
        print(f"prefill bootstrap server on port {bootstrap_port}", flush=True)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served = 0
        try:
            while True:
                # uvicorn closes an idle kept-alive connection after timeout_keep_alive.
                wait = settings.keep_alive_s if served else 300.0
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), wait)
                arrival = getattr(reader, "accepted", 0.0) or None
                if served:
                    arrival = time.perf_counter()
                lines = head.decode("latin-1").split("\r\n")
                method, target, version = lines[0].split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                body = await reader.readexactly(int(headers.get("content-length", 0) or 0))
                tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
                keep_alive = version.strip() != "HTTP/1.0" and "close" not in tokens
                path, _, query_text = target.partition("?")
                query = dict(
                    part.partition("=")[::2] for part in query_text.split("&") if "=" in part
                )
                http_ = Http(writer, keep_alive)
                await dispatch(simulator, method, path, query, headers, body, http_, arrival)
                served += 1
                if not keep_alive:
                    break
        except (
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
            ValueError,
        ):
            pass
        finally:
            writer.close()

    loop = asyncio.get_running_loop()

    def accept() -> asyncio.StreamReaderProtocol:
        reader = Stamped(limit=1 << 16)
        return StampedProtocol(reader, handle, loop=loop)

    server = await loop.create_server(
        accept, host, port, backlog=1024, reuse_port=settings.reuse_port or None
    )
    simulator.startup_time = {
        "load_weight": simulator.scheduler_startup_time["load_weight"],
        "kv_cache_allocation": simulator.scheduler_startup_time["kv_cache_allocation"],
        "scheduler_e2e": simulator.scheduler_startup_time["scheduler_e2e"],
        "cuda_graph": dict(simulator.scheduler_startup_time["cuda_graph"]),
        "tokenizer_e2e": time.perf_counter() - started,
    }
    print(f"simulated sglang {VERSION} serving on {host}:{port}", flush=True)
    skip_warmup = bool(args["resolved"].get("skip_server_warmup"))
    if skip_warmup:
        simulator.status = "Up"
    warmup = None if skip_warmup else asyncio.ensure_future(simulator.warmup())
    async with server:
        await server.serve_forever()
    scheduler.cancel()
    if warmup is not None:
        warmup.cancel()


# -- multi-node ----------------------------------------------------------------------------
# SGLang 0.5.23 (srt/entrypoints/engine.py _launch_subprocesses): every node's schedulers join
# torch.distributed at --dist-init-addr (the head, node rank 0, hosts its store), and each
# waits there for all --nnodes. Then the head starts its tokenizer and HTTP server; a node of
# rank 1 or more serves no API but launch_dummy_health_check_server (srt/utils): 200 to
# GET /health and /health_generate on its --host and --port. A node that dies takes NCCL's
# collectives with it: the others fail. The simulator plays the store with a line protocol
# ("rank R" from each node, "go" from the head once all joined) over one kept connection a
# node, whose end ends the other side.


# The watch on each other node's connection, kept for the server's life.
WATCHERS: set = set()


def dist_address(resolved: dict) -> tuple[str, int]:
    host, _, port = str(resolved.get("dist_init_addr") or "").rpartition(":")
    if not host or not port.isdigit():
        print(
            f"launch_server: error: --dist-init-addr {resolved.get('dist_init_addr')!r} is not "
            "HOST:PORT (needed with --nnodes above 1)",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)
    return host.strip("[]"), int(port)


def rank_lost(what: str) -> None:
    print(f"torch.distributed: {what}; NCCL communicator aborted", file=sys.stderr, flush=True)
    os._exit(1)


async def watch_peer(reader: asyncio.StreamReader, writer, what: str) -> None:
    """Holds the writer too: a StreamWriter that is collected closes its connection."""
    with contextlib.suppress(ConnectionError, OSError):
        await reader.read()
    rank_lost(what)
    writer.close()


async def join_ranks(resolved: dict, settings: Settings) -> None:
    """Until every node of the server joined at --dist-init-addr, or the timeout's failure."""
    nnodes, rank = int(resolved["nnodes"]), int(resolved.get("node_rank") or 0)
    host, port = dist_address(resolved)
    deadline = time.monotonic() + settings.dist_timeout_s
    print(f"node {rank} of {nnodes}: joining at {host}:{port}", flush=True)
    if rank == 0:
        joined: dict[int, tuple] = {}
        everyone = asyncio.Event()

        async def arrive(reader, writer):
            line = await reader.readline()
            parts = line.decode("latin-1").split()
            if len(parts) == 2 and parts[0] == "rank" and parts[1].isdigit():
                joined[int(parts[1])] = (reader, writer)
                if len(joined) >= nnodes - 1:
                    everyone.set()
            else:
                writer.close()

        store = await asyncio.start_server(arrive, "0.0.0.0", port)  # noqa: S104 - as torch
        try:
            await asyncio.wait_for(everyone.wait(), max(deadline - time.monotonic(), 0))
        except TimeoutError:
            missing = sorted(set(range(1, nnodes)) - set(joined))
            rank_lost(f"timed out after {settings.dist_timeout_s:g} s waiting for ranks {missing}")
        store.close()
        for other, (reader, writer) in joined.items():
            writer.write(b"go\n")
            await writer.drain()
            WATCHERS.add(asyncio.ensure_future(watch_peer(reader, writer, f"node {other} left")))
        print(f"node 0 of {nnodes}: every node joined", flush=True)
        return
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(f"rank {rank}\n".encode())
            await writer.drain()
            answer = await asyncio.wait_for(reader.readline(), max(deadline - time.monotonic(), 0))
            if answer.strip() == b"go":
                break
            writer.close()
        except (OSError, TimeoutError):
            pass
        if time.monotonic() >= deadline:
            rank_lost(f"timed out after {settings.dist_timeout_s:g} s joining {host}:{port}")
        await asyncio.sleep(0.2)
    WATCHERS.add(asyncio.ensure_future(watch_peer(reader, writer, "the head (node 0) left")))
    print(f"node {rank} of {nnodes}: joined", flush=True)


NOT_FOUND = (404, compact({"detail": "Not Found"}))


async def one_request_server(route, host: str, port: int) -> asyncio.AbstractServer:
    """A side port's server (a rank's health check, a prefill's bootstrap port): one GET a
    connection, answered with what `await route(path, query)` gives, (status, body)."""

    async def answer(reader, writer):
        with contextlib.suppress(ConnectionError, ValueError, asyncio.IncompleteReadError):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            target = head.split(b" ", 2)[1].decode("latin-1") if head.count(b" ") >= 2 else ""
            path, _, query = target.partition("?")
            status, body = await route(path, query)
            await Http(writer, keep_alive=False).respond(status, body, "application/json")
        writer.close()

    return await asyncio.start_server(answer, host, port)


async def serve_rank(host: str, port: int) -> None:
    """launch_dummy_health_check_server: /health and /health_generate answer 200, nothing else."""

    async def route(path: str, _query: str):
        return (200, b"") if path in ("/health", "/health_generate") else NOT_FOUND

    server = await one_request_server(route, host, port)
    print(f"simulated sglang {VERSION} rank health check on {host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


# -- prefill-decode disaggregation ---------------------------------------------------------
# SGLang's router in PD mode (sglang-router 0.3.2, read on the real router) registers each
# worker with GET /health, /server_info and /model_info, then sends every request to one prefill
# and one decode server alike, with bootstrap_host (the prefill's host), bootstrap_port (its
# --disaggregation-bootstrap-port) and bootstrap_room (a random integer) added, and answers
# with the decode server's reply. In SGLang 0.5.23 the prefill server computes the prompt and
# its first token and hands the KV cache to the decode server over the transfer backend,
# which finds it through the prefill's bootstrap server (disaggregation/common/conn.py,
# GET /route); a request without a room has no decode peer to reach. The simulator plays the
# hand-over on the bootstrap port: GET /sim/kv?room=R answers once the prefill finished R.
KV_WAIT_S = 30.0
MAX_ROOMS = 10_000


def bootstrap_of(body: dict) -> tuple[str, int, int] | None:
    host, port, room = (body.get(k) for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room"))
    if not isinstance(host, str) or not host or len(host) > 255:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (port, room)):
        return None
    return host, port, room


async def disaggregated(simulator, request, body: dict):
    """((status, answer), None) to refuse, or (None, the room a prefill server finishes)."""
    found = bootstrap_of(body)
    if found is None:
        return (
            (400, {"error": {"message": "disaggregated serving needs bootstrap_host, "
                   "bootstrap_port and bootstrap_room (send it through the router in PD mode)",
                   "code": 400}}),
            None,
        )  # fmt: skip
    host, port, room = found
    if simulator.disaggregation == "prefill":
        # The prefill server stops at the first token; the decode server goes on from it.
        request.max_new_tokens = 1
        return None, room
    try:
        await asyncio.wait_for(fetch_kv(host, port, room), KV_WAIT_S)
    except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError) as error:
        message = f"KV transfer from the prefill server {host}:{port} failed: {error or 'timeout'}"
        return (500, {"error": {"message": message, "code": 500}}), None
    return None, None


async def fetch_kv(host: str, port: int, room: int) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(f"GET /sim/kv?room={room} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        await writer.drain()
        status = (await reader.readline()).split(b" ", 2)
        if len(status) < 2 or status[1] != b"200":
            raise ValueError(f"room {room} was never prefilled")
    finally:
        writer.close()


def prefilled(simulator, room: int | None) -> None:
    if room is None or simulator.disaggregation != "prefill":
        return
    if len(simulator.rooms) >= MAX_ROOMS:
        simulator.rooms.pop(next(iter(simulator.rooms)))
    simulator.rooms.setdefault(room, asyncio.Event()).set()


async def serve_bootstrap(simulator, host: str, port: int) -> asyncio.AbstractServer:
    """The prefill server's bootstrap port: /health, /route, and the simulator's /sim/kv."""

    async def route(path: str, query: str):
        if path == "/health":
            return 200, compact("OK")
        if path == "/route":
            return 200, compact({"rank_ip": host, "rank_port": port})
        if path == "/sim/kv" and query.startswith("room=") and query[5:].isdigit():
            event = simulator.rooms.setdefault(int(query[5:]), asyncio.Event())
            try:
                await asyncio.wait_for(event.wait(), KV_WAIT_S)
            except TimeoutError:
                return 404, compact({"detail": "room never prefilled"})
            return 200, compact({"room": int(query[5:])})
        return NOT_FOUND

    return await one_request_server(route, "0.0.0.0", port)  # noqa: S104 - as SGLang's


def vocab_size_of(model_path: object) -> int:
    """The served folder's vocab_size (config.json's, or its text_config's, as SGLang's
    model_config reads the text model's); K2.6's when the folder has none."""
    try:
        with open(Path(str(model_path)) / "config.json", "rb") as handle:
            config = json.loads(handle.read(1 << 20))
    except (OSError, ValueError, TypeError):
        return VOCAB
    for part in (config, config.get("text_config") if isinstance(config, dict) else None):
        size = part.get("vocab_size") if isinstance(part, dict) else None
        if isinstance(size, int) and not isinstance(size, bool) and 0 < size <= 1 << 24:
            return size
    return VOCAB


def input_ids_error(ids: object, vocab_size: int) -> str | None:
    """Why /generate refuses these input_ids, None when it takes them (or none were given).

    SGLang 0.5.23 checks their type while parsing the body (io_struct.py GenerateReqInput.
    input_ids, srt/utils/field_validators.py validate_list_i64_1d: a list whose first element
    is an int and that packs into int64) and answers 400 (http_server.py's
    RequestValidationError handler); it does not check them against the vocabulary (only
    token_ids_logprob is). The simulator also refuses ids outside [0, vocab_size): on a GPU
    such an id reads no embedding row of its own, so a benchmark that sends one measures a
    broken prompt, and a test should hear about it. Batches (a list of lists) are SGLang's,
    but no caller of the kit sends them: refused too."""
    if ids is None:
        return None
    if not isinstance(ids, list):
        return f"input_ids: Value error, must be list or null; got {type(ids).__name__}"
    if ids and isinstance(ids[0], list):
        return "input_ids: the simulator takes one prompt a request, not a batch"
    if ids and not isinstance(ids[0], int):
        return f"input_ids: Value error, elements must be int; got {type(ids[0]).__name__}"
    for value in ids:
        if not isinstance(value, int) or not -(1 << 63) <= value < 1 << 63:
            return "input_ids: Value error, contains non-int64 element"
    if not ids:
        return "input_ids cannot be empty."
    outside = next((value for value in ids if not 0 <= value < vocab_size), None)
    if outside is not None:
        return f"input_ids: token id {outside} is outside the vocabulary [0, {vocab_size})"
    return None


def bad_request(message: str) -> dict:
    """SGLang's ErrorResponse for a body its validation refused (http_server.py)."""
    return {
        "object": "error",
        "message": message,
        "type": "Bad Request",
        "param": None,
        "code": 400,
    }


def model_identity(model_path: object) -> tuple[str, list[str]]:
    """(model_type, architectures) from the served folder's config.json, as SGLang reads its
    hf_config, so a server of another model does not claim to be K2.6; K2.6's when the folder
    has no readable config (the simulator is often started on a bare path)."""
    fallback = ("kimi_k25", ["KimiK25ForConditionalGeneration"])
    try:
        with open(Path(str(model_path)) / "config.json", "rb") as handle:
            config = json.loads(handle.read(1 << 20))
    except (OSError, ValueError, TypeError):
        return fallback
    if not isinstance(config, dict):
        return fallback
    model_type, architectures = config.get("model_type"), config.get("architectures")
    if not isinstance(model_type, str) or not isinstance(architectures, list):
        return fallback
    return model_type[:100], [str(name)[:200] for name in architectures[:8]]


def is_ddtree(resolved: dict) -> bool:
    return str(resolved.get("speculative_algorithm") or "").upper() == "DDTREE"


def ddtree_row(resolved: dict, table_text: str) -> tuple[float, float]:
    """(step ms, tokens per verify step) of the running budget from SGLANG_SIM_DDTREE_TABLE;
    ValueError says what is wrong with the table for this server."""
    budget = int(resolved["speculative_ddtree_budget"])
    try:
        table = json.loads(table_text)
    except ValueError as error:
        raise ValueError(f"SGLANG_SIM_DDTREE_TABLE is not JSON: {error}") from None
    if not isinstance(table, dict) or not table:
        raise ValueError("SGLANG_SIM_DDTREE_TABLE must be an object of budget -> row")
    row = table.get(str(budget))
    if row is None:
        have = ", ".join(sorted(table, key=lambda k: (len(k), k)))
        raise ValueError(
            f"SGLANG_SIM_DDTREE_TABLE has no row for budget {budget} (it has {have}); add "
            "one, or run a budget it has"
        )
    try:
        step_ms, accept = float(row["step_ms"]), float(row["accept"])
    except (TypeError, KeyError, ValueError):
        raise ValueError(
            f"SGLANG_SIM_DDTREE_TABLE row for budget {budget} needs numbers step_ms and "
            f"accept, got {row!r}"
        ) from None
    block = int(resolved.get("speculative_num_draft_tokens") or 0) or int(
        resolved.get("speculative_dflash_block_size") or 0
    )
    cap = min(budget, block - 1) + 1 if block else budget + 1
    if not (step_ms > 0 and 1 <= accept <= cap):
        raise ValueError(
            f"SGLANG_SIM_DDTREE_TABLE row for budget {budget} ({step_ms:g} ms, {accept:g} "
            f"tokens a step) is impossible: step time must be positive and tokens a step "
            f"between 1 and {cap} (at most min(budget, block size - 1) drafts, plus the bonus "
            "token)"
        )
    return step_ms, accept


# -- the model folders and the GPU, as SGLang reads them at start-up --------------------------

# config.json and an index are small files; a safetensors header may hold 100 MB (safetensors'
# own limit, MAX_HEADER_SIZE, in its Rust reader).
CONFIG_MAX_BYTES = 8 << 20
SAFETENSORS_HEADER_MAX = 100_000_000
SAFETENSORS_FILES_MAX = 4096
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
# The architectures SGLang 0.5.23 serves among those the kit's models and drafters name
# (srt/models/: kimi_k25.py, deepseek_v2.py, kimi_k25_eagle3.py, dflash.py, qwen3_5.py,
# llama_eagle3.py EntryClass); the real registry knows many more.
ARCHITECTURES = (
    "KimiK25ForConditionalGeneration", "DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM",
    "Eagle3DeepseekV2ForCausalLM", "DFlashDraftModel", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5ForCausalLM", "LlamaForCausalLMEagle3",
)  # fmt: skip
# srt/configs/model_config.py: the architectures whose attention_arch is MLA (a subset: those
# above).
MLA_ARCHITECTURES = {
    "KimiK25ForConditionalGeneration",
    "DeepseekV3ForCausalLM",
    "DeepseekV2ForCausalLM",
    "Eagle3DeepseekV2ForCausalLM",
}
FA3 = (
    "FlashAttention v3 Backend requires SM>=80 and SM<=90. "
    "Please use `--attention-backend flashinfer`."
)
TRTLLM_MLA = (
    "TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x). "
    "Please use a different backend."
)


class StartupFailure(Exception):
    """What SGLang raises at start-up: the exception's type and text, and where it is raised:
    `server_args` (the launch process, before anything loads: a traceback, exit status 1) or
    `scheduler` (a scheduler process while it loads: "Scheduler hit an exception", then the
    launch process kills the whole tree)."""

    def __init__(self, stage: str, kind: str, message: str):
        super().__init__(message)
        self.stage, self.kind, self.message = stage, kind, message


def read_config(folder: Path) -> dict | None:
    """config.json of a model folder as transformers' AutoConfig reads it (SGLang's
    srt/utils/hf_transformers_utils.py get_config), or None for the simulator's bare stand-in:
    a path that is no folder, or a folder with neither config.json nor weights (tests start the
    simulator on those, and it answers as K2.6). transformers' own words when it is missing or
    not JSON (transformers/utils/hub.py cached_files, configuration_utils.py)."""
    if not folder.is_dir():
        return None
    path = folder / "config.json"
    if not path.is_file():
        if not any(folder.glob("*.safetensors")):
            return None
        raise StartupFailure(
            "server_args",
            "OSError",
            f"{folder} does not appear to have a file named config.json. Checkout "
            f"'https://huggingface.co/{folder}/tree/None' for available files.",
        )
    bad = StartupFailure(
        "server_args",
        "OSError",
        f"It looks like the config file at '{path}' is not a valid JSON file.",
    )
    try:
        with open(path, "rb") as handle:
            data = handle.read(CONFIG_MAX_BYTES + 1)
        config = json.loads(data) if len(data) <= CONFIG_MAX_BYTES else None
    except (OSError, ValueError):
        raise bad from None
    if not isinstance(config, dict):
        raise bad
    return config


def text_part(config: dict) -> dict:
    """The text model's config (a multimodal model's text_config), as ModelConfig's
    hf_text_config."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def number(config: dict, key: str, default=None):
    value = config.get(key, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def safetensors_header(path: Path) -> dict:
    """A safetensors file's header (name -> dtype, shape, data_offsets), checked as the
    safetensors library checks it before anything is read; ValueError with its error's name
    (SafetensorError: "Error while deserializing header: ...")."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        start = handle.read(8)
        if len(start) < 8:
            raise ValueError("HeaderTooSmall")
        length = int.from_bytes(start, "little")
        if length > SAFETENSORS_HEADER_MAX:
            raise ValueError("HeaderTooLarge")
        if 8 + length > size:
            raise ValueError("MetadataIncompleteBuffer")
        try:
            header = json.loads(handle.read(length))
        except ValueError:
            raise ValueError("InvalidHeaderDeserialization") from None
    if not isinstance(header, dict):
        raise ValueError("InvalidHeaderDeserialization")
    header.pop("__metadata__", None)
    data = size - 8 - length
    for name, info in header.items():
        try:
            begin, end = info["data_offsets"]
            count = math.prod(int(n) for n in info["shape"])
            width = DTYPE_BYTES[info["dtype"]]
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"InvalidHeaderDeserialization ({name})") from None
        if not (0 <= begin <= end <= data) or end - begin != count * width:
            raise ValueError(f"InvalidOffset({name})")
    return header


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files a load reads (srt/model_loader/loader.py _prepare_weights,
    weight_utils.py filter_duplicate_safetensors_files): every *.safetensors, or with an index
    those it names, each of which must be there."""
    files = sorted(folder.glob("*.safetensors"))[:SAFETENSORS_FILES_MAX]
    if not files:
        raise StartupFailure(
            "scheduler", "RuntimeError", f"Cannot find any model weights with `{folder}`"
        )
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return files
    try:
        with open(index, "rb") as handle:
            weight_map = json.loads(handle.read(CONFIG_MAX_BYTES))["weight_map"]
        named = {str(shard) for shard in weight_map.values()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise StartupFailure(
            "scheduler", "KeyError", "'weight_map'"
        ) from None  # json.load(f)["weight_map"] of a file without one
    missing = sorted(name for name in named if not (folder / name).is_file())
    if missing:
        raise StartupFailure(
            "scheduler",
            "RuntimeError",
            f"model.safetensors.index.json references {len(missing)} shard file(s) missing "
            f"from {folder} (incomplete download?): {missing}",
        )
    return [path for path in files if path.name in named]


def tensors_of(folder: Path) -> dict[str, dict]:
    """Every tensor of the folder's weights (name -> dtype, shape, file, offsets)."""
    tensors: dict = {}
    for path in weight_files(folder):
        try:
            header = safetensors_header(path)
        except (OSError, ValueError) as error:
            raise StartupFailure(
                "scheduler",
                "safetensors_rust.SafetensorError",
                f"Error while deserializing header: {error}",
            ) from None
        for name, info in header.items():
            tensors[name] = {**info, "file": path}
    return tensors


def int_values(tensor: dict, limit: int = 8) -> list[int]:
    """The first values of a small integer tensor (a weight_shape), read bounded."""
    width = DTYPE_BYTES[tensor["dtype"]]
    begin, end = tensor["data_offsets"]
    with open(tensor["file"], "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        handle.seek(8 + length + begin)
        data = handle.read(min(end - begin, limit * width))
    return [
        int.from_bytes(data[i : i + width], "little", signed=True)
        for i in range(0, len(data), width)
    ]


def pack_quantized(config: dict) -> tuple[int, int] | None:
    """(bits, group size) of a compressed-tensors pack-quantized checkpoint's weights, from
    quantization_config's first config group; None for another format."""
    quant = config.get("quantization_config") or text_part(config).get("quantization_config")
    if not isinstance(quant, dict) or quant.get("quant_method") != "compressed-tensors":
        return None
    groups = quant.get("config_groups")
    for group in groups.values() if isinstance(groups, dict) else []:
        weights = group.get("weights") if isinstance(group, dict) else None
        if isinstance(weights, dict):
            return number(weights, "num_bits", 4), number(weights, "group_size", -1)
    return None


def check_compressed_tensors(config: dict, tensors: dict) -> None:
    """Each packed weight with its scale and shape, their shapes as the scheme builds its
    parameters (srt/layers/quantization/compressed_tensors/schemes/compressed_tensors_wNa16.py
    and _wNa16_moe.py create_weights: weight_packed int32 [out, in / (32 / bits)],
    weight_scale [out, in / group_size], weight_shape [out, in]). SGLang itself gives no clear
    message here (a missing scale keeps its initial value, a wrong shape breaks the Marlin
    repack): the words are the simulator's."""
    scheme = pack_quantized(config)
    if scheme is None:
        return
    bits, group = scheme
    pack = 32 // bits if bits in (2, 4, 8) else 8
    for name in sorted(tensors):
        if not name.endswith(".weight_packed"):
            continue
        base = name[: -len(".weight_packed")]
        packed = tensors[name]
        scale, shape = tensors.get(base + ".weight_scale"), tensors.get(base + ".weight_shape")
        problem = None
        if scale is None or shape is None:
            problem = "has no weight_scale or no weight_shape beside it"
        elif packed["dtype"] != "I32" or len(packed["shape"]) != 2:
            problem = f"is {packed['dtype']} {packed['shape']}, not a 2-D int32 tensor"
        else:
            rows, columns = packed["shape"][0], packed["shape"][1] * pack
            recorded = int_values(shape) if shape["dtype"] in ("I32", "I64") else []
            groups = columns // group if group > 0 else 1
            if recorded[:2] != [rows, columns]:
                problem = f"unpacks to [{rows}, {columns}] but weight_shape says {recorded[:2]}"
            elif list(scale["shape"]) != [rows, groups]:
                problem = (
                    f"needs weight_scale [{rows}, {groups}] (group size {group}), found "
                    f"{scale['shape']}"
                )
        if problem:
            raise StartupFailure(
                "scheduler",
                "ValueError",
                f"compressed-tensors checkpoint: {name} {problem}",
            )


def check_divisible(config: dict, tp: int) -> None:
    """What TP splits must divide by --tp-size, each raised where SGLang raises it:
    srt/distributed/utils.py divide() ("{a} is not divisible by {b}") for attention heads
    (layers/linear.py QKVParallelLinear), key/value heads (the KV heads over TP, or TP over
    them when there are fewer), the dense MLP (MergedColumnParallelLinear) and vision heads
    (layers/attention/vision.py VisionAttention); a bare assert for MLA's heads
    (models/deepseek_v2.py: num_heads % attn_tp_size) and the experts' intermediate size
    (layers/moe/fused_moe_triton/layer.py)."""
    text = text_part(config)
    mla = bool(set(config.get("architectures") or []) & MLA_ARCHITECTURES)

    def divide(numerator, denominator) -> None:
        if numerator and denominator and numerator % denominator:
            raise StartupFailure(
                "scheduler", "AssertionError", f"{numerator} is not divisible by {denominator}"
            )

    heads = number(text, "num_attention_heads")
    if mla and heads and heads % tp:
        raise StartupFailure("scheduler", "AssertionError", "")
    divide(heads, tp)
    kv = number(text, "num_key_value_heads")
    if kv and not mla:
        divide(tp, kv) if tp >= kv else divide(kv, tp)
    divide(number(text, "intermediate_size"), tp)
    moe = number(text, "moe_intermediate_size")
    if moe and moe % tp:
        raise StartupFailure("scheduler", "AssertionError", "")
    vision = config.get("vision_config")
    if isinstance(vision, dict):
        divide(number(vision, "num_attention_heads") or number(vision, "num_heads"), tp)


def derived_context_length(config: dict) -> int:
    """srt/utils/hf_transformers/common.py get_context_length: the first of its keys, times a
    rope scaling factor, else 2048."""
    text = text_part(config)
    scaling = text.get("rope_scaling") if isinstance(text.get("rope_scaling"), dict) else None
    factor = 1
    plain = not scaling or "original_max_position_embeddings" in scaling
    if not plain and scaling.get("rope_type") != "llama3":
        given = scaling.get("factor", 1)
        factor = given if isinstance(given, (int, float)) and not isinstance(given, bool) else 1
    for key in ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                "max_position_embeddings"):  # fmt: skip
        if number(text, key) is not None:
            return int(factor * number(text, key))
    return 2048


def check_context_length(config: dict, resolved: dict, draft: bool, stage: str) -> None:
    """srt/configs/model_config.py _derive_context_length: --context-length above what the
    model's config allows refuses to start unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN
    is set; a draft model is built with the target's context length."""
    wanted = resolved.get("context_length")
    derived = derived_context_length(config)
    if wanted is None or int(wanted) <= derived:
        return
    if env_bool("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", False):
        return
    reason = "Target model's" if draft else "User-specified"
    raise StartupFailure(
        stage,
        "ValueError",
        f"Warning: {reason} context_length ({wanted}) is greater than the derived "
        f"context_length ({derived}). This may lead to incorrect model outputs or CUDA errors. "
        "Note that the derived context_length may differ from max_position_embeddings in the "
        "model's config. To allow overriding this maximum, set the env var "
        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1",
    )


def check_architectures(config: dict) -> None:
    """srt/models/registry.py _raise_for_unsupported. SGLang first tries its Transformers
    fallback for an architecture it does not know; the simulator has none."""
    names = config.get("architectures")
    names = [str(n)[:200] for n in names[:8]] if isinstance(names, list) else []
    if not names or not any(name in ARCHITECTURES for name in names):
        raise StartupFailure(
            "scheduler",
            "ValueError",
            f"Model architectures {names} are not supported for now. Supported "
            f"architectures: {list(ARCHITECTURES)}",
        )


def matmul_error(tokens: int, features: int, weight_in: int, weight_out: int) -> StartupFailure:
    """torch's F.linear on inputs the layer was not built for (the first forward: the warmup or
    CUDA graph capture), as a scheduler logs it."""
    return StartupFailure(
        "scheduler",
        "RuntimeError",
        f"mat1 and mat2 shapes cannot be multiplied ({tokens}x{features} and "
        f"{weight_in}x{weight_out})",
    )


def check_dflash(draft: dict, target: dict, resolved: dict) -> list[str]:
    """The DFlash drafter against its target (srt/speculative/dflash_utils.py
    parse_dflash_draft_config, resolve_target_layer_ids; model_runner_components/
    spec_aux_hidden_state.py resolves them against the running target's layers). Its fc
    projects len(target_layer_ids) x hidden features (models/dflash.py), so a target of another
    hidden size fails its first forward. A block size other than the run's is only a warning
    (speculative/dflash_worker_v2.py). Returns the warnings."""
    nested = draft.get("dflash_config") if isinstance(draft.get("dflash_config"), dict) else {}
    layers = number(target_text := text_part(target), "num_hidden_layers", 0)
    ids = nested.get("target_layer_ids", draft.get("target_layer_ids"))
    if ids is None:
        if number(draft, "num_hidden_layers") is None:
            raise StartupFailure(
                "scheduler",
                "ValueError",
                "DFLASH requires draft num_hidden_layers in config. Got config without "
                "num_hidden_layers.",
            )
        ids = list(range(number(draft, "num_hidden_layers")))
    ids = [i for i in ids if isinstance(i, int)] if isinstance(ids, list) else []
    for index, value in enumerate(ids):
        if value < 0 or value >= layers:
            raise StartupFailure(
                "scheduler",
                "ValueError",
                "DFLASH target_layer_ids contains an out-of-range layer id. "
                f"target_layer_ids[{index}]={value}, target_num_layers={layers}.",
            )
    hidden, target_hidden = number(draft, "hidden_size"), number(target_text, "hidden_size")
    if hidden and target_hidden and hidden != target_hidden:
        features = len(ids) or 1
        raise matmul_error(8, features * target_hidden, features * hidden, hidden)
    warnings = []
    block = nested.get("block_size", draft.get("block_size"))
    running = resolved.get("speculative_num_draft_tokens")
    if isinstance(block, int) and running is not None and int(running) != block:
        warnings.append(
            f"DFLASH block size mismatch: using speculative_num_draft_tokens={running} but "
            f"draft config block_size={block}."
        )
    return warnings


def check_eagle3(draft: dict, target: dict) -> None:
    """EAGLE-3's fc takes three target layers' hidden states (target_hidden_size, else its own
    hidden_size: srt/models/llama_eagle3.py, kimi_k25_eagle3.py): a target of another hidden
    size fails the first forward."""
    hidden = number(draft, "hidden_size")
    expected = number(draft, "target_hidden_size") or hidden
    actual = number(text_part(target), "hidden_size")
    if hidden and expected and actual and expected != actual:
        raise matmul_error(8, 3 * actual, 3 * expected, hidden)


def compute_capability() -> tuple[int, int] | None:
    """The first GPU's compute capability, as torch.cuda.get_device_capability() reads it,
    from `nvidia-smi --query-gpu=compute_cap --format=csv,noheader` (30 s deadline); None
    without nvidia-smi (the unit tests' machine: nothing to check against)."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = (done.stdout.strip().splitlines() or [""])[0].strip()
    major, _, minor = first.partition(".")
    if done.returncode != 0 or not (major.isdigit() and minor.isdigit()):
        return None
    return int(major), int(minor)


def check_backend(backend: object, mla: bool, capability: tuple[int, int], draft: bool) -> None:
    """An attention backend on this GPU, each with the text 0.5.23 raises:
    fa3 (srt/layers/attention/attention_registry.py create_flashattention_v3_backend: SM 9.x,
    or 8.x without MLA), trtllm_mla (srt/arg_groups/overrides.py _mla_kv_cache_dtype_checks:
    Blackwell, SM 10.x to 12.x, checked with the arguments; attention_registry.py: MLA models
    only), trtllm_mha (arg_groups/attention_hook.py: SM 9.x, 10.x, 12.x; attention_registry.py:
    not MLA), fa4 with MLA on SM 9.x (the absorbed MLA shape, head dims 64 and 512, which
    flash_attn/cute/interface.py _validate_head_dims refuses there, at the first forward).
    flashmla's architecture checks live in the sgl-flash-mla wheel, not in sglang's source:
    the simulator checks none."""
    major = capability[0]
    name = str(backend or "")
    if name == "fa3" and not (major == 9 or (major == 8 and not mla)):
        raise StartupFailure("scheduler", "AssertionError", FA3)
    if name == "trtllm_mla":
        if not draft and major not in (10, 11, 12):
            raise StartupFailure("server_args", "ValueError", TRTLLM_MLA)
        if not mla:
            raise StartupFailure(
                "scheduler", "ValueError", "trtllm_mla backend can only be used with MLA models."
            )
    if name == "trtllm_mha":
        if major not in (9, 10, 12):
            raise StartupFailure(
                "server_args",
                "ValueError",
                "TRTLLM MHA backend for prefill requires Hopper (SM90), Blackwell (SM100), or "
                "SM120 GPUs. Please use a different prefill backend.",
            )
        if mla:
            raise StartupFailure(
                "scheduler",
                "ValueError",
                "trtllm_mha backend can only be used with non-MLA models.",
            )
    if name == "fa4" and mla and major == 9:
        raise StartupFailure(
            "scheduler",
            "AssertionError",
            "(head_dim, head_dim_v)=(64, 512) is not supported on SM90. head_dim and "
            "head_dim_v must be between 8 and 256 and divisible by 8, or both equal to 512.",
        )


def startup_checks(resolved: dict) -> tuple[StartupFailure | None, list[str]]:
    """What SGLang checks of the model folders and the GPU before it serves, in its order
    (arguments, the target's config, its weights, the drafter, the attention backends): the
    first failure, and the warnings it logs. A bare stand-in folder (read_config) is not
    checked."""
    warnings: list[str] = []
    try:
        target = read_config(Path(str(resolved.get("model_path") or "")))
        draft_path = resolved.get("speculative_draft_model_path")
        draft = read_config(Path(str(draft_path))) if draft_path else None
        capability = compute_capability()
        mla = target is not None and bool(
            set(target.get("architectures") or []) & MLA_ARCHITECTURES
        )
        if capability is not None:
            check_backend(resolved.get("attention_backend"), mla, capability, draft=False)
        if target is not None:
            check_context_length(target, resolved, draft=False, stage="server_args")
            check_architectures(target)
            check_divisible(target, int(resolved.get("tp_size") or 1))
            check_compressed_tensors(target, tensors_of(Path(str(resolved["model_path"]))))
        if draft is not None:
            check_architectures(draft)
            tensors_of(Path(str(draft_path)))
            check_context_length(draft, resolved, draft=True, stage="scheduler")
            algorithm = str(resolved.get("speculative_algorithm") or "").upper()
            if target is not None and algorithm in ("DFLASH", "DDTREE"):
                warnings += check_dflash(draft, target, resolved)
            if target is not None and algorithm == "EAGLE3":
                check_eagle3(draft, target)
            if capability is not None:
                draft_mla = bool(set(draft.get("architectures") or []) & MLA_ARCHITECTURES)
                backend = resolved.get("speculative_draft_attention_backend")
                check_backend(backend, draft_mla, capability, draft=True)
    except StartupFailure as failure:
        return failure, warnings
    return None, warnings


def knob_effects(resolved: dict, text: str) -> tuple[float, StartupFailure | None]:
    """SGLANG_SIM_KNOBS on this launch (its resolved arguments, parser defaults included): the
    factor on every step and, for a launch in an "oom" region, the failure its scheduler hits
    while it allocates the KV cache. A flag without a value (None) is 4 doublings away."""
    spec = json.loads(text)
    if not isinstance(spec, dict):
        raise ValueError("SGLANG_SIM_KNOBS is not a JSON object")

    def value(flag: str) -> float:
        dest = flag.lstrip("-").replace("-", "_")
        found = resolved.get(dest)
        return float(found) if isinstance(found, (int, float)) and found > 0 else 0.0

    penalty, factor = float(spec.get("penalty", 0.5)), 1.0
    for flag, best in (spec.get("optimum") or {}).items():
        current = value(flag)
        distance = abs(math.log2(current / float(best))) if current > 0 else 4.0
        factor *= 1 + penalty * distance
    for region in spec.get("oom") or []:
        if all(value(flag) >= float(bound) for flag, bound in region.items()):
            return factor, StartupFailure(
                "scheduler",
                "torch.OutOfMemoryError",
                "CUDA out of memory. Tried to allocate 7.50 GiB. GPU 0 has a total capacity of "
                "139.81 GiB of which 3.12 GiB is free.",
            )
    noise = float(spec.get("noise", 0))
    return factor * (1 + random.uniform(-noise, noise)), None


def report_failure(failure: StartupFailure) -> None:
    """The failure as SGLang's output shows it (stderr): the exception line a traceback ends
    with; from a scheduler, behind "Scheduler hit an exception" (srt/managers/scheduler.py
    run_scheduler_process) and followed by the launch process's "Received sigquit from a child
    process" (srt/entrypoints/engine.py launch_phase_sigquit_handler)."""
    line = f"{failure.kind}: {failure.message}" if failure.message else failure.kind
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    if failure.stage == "scheduler":
        print(
            f"[{stamp} TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
            f"  (simulated)\n{line}\n",
            file=sys.stderr,
            flush=True,
        )
        print(
            f"[{stamp}] Received sigquit from a child process. It usually means the child failed.",
            file=sys.stderr,
            flush=True,
        )
        return
    print(f"Traceback (most recent call last):\n  (simulated)\n{line}", file=sys.stderr, flush=True)


def log_server_args(resolved: dict) -> None:
    """What SGLang's engine logs first (`logger.info(f"{server_args=}")`, the ServerArgs
    dataclass' repr): every resolved argument, the API key among them in the clear, into
    whatever takes the server's output. The kit must keep that output root-only."""
    shown = ", ".join(f"{name}={value!r}" for name, value in resolved.items())
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp}] server_args=ServerArgs({shown})", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    log_server_args(args["resolved"])
    if os.environ.get("SGLANG_SIM_CRASH_ON_START") == "1":
        print("simulated crash on start", file=sys.stderr)
        return 1
    failure, warnings = startup_checks(args["resolved"])
    for warning in warnings:
        print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] WARNING {warning}", file=sys.stderr)
    if failure is not None and failure.stage == "server_args":
        report_failure(failure)
        return 1
    args["failure"] = failure
    settings = Settings()
    if settings.fault not in FAULTS:
        print(f"SGLANG_SIM_FAULT must be one of {sorted(FAULTS)}", file=sys.stderr, flush=True)
        return 1
    try:
        load_answers(settings.answers)
    except (OSError, ValueError) as error:
        print(f"SGLANG_SIM_ANSWERS: {error}", file=sys.stderr, flush=True)
        return 1
    if not 0 <= settings.accuracy <= 1:
        print("SGLANG_SIM_ACCURACY must be between 0 and 1", file=sys.stderr, flush=True)
        return 1
    resolved = args["resolved"]
    # SGLang decodes at most --max-running-requests together (the scheduler's req pool).
    if resolved.get("max_running_requests"):
        settings.max_running = min(settings.max_running, int(resolved["max_running_requests"]))
    if is_ddtree(resolved) and settings.ddtree_table:
        try:
            settings.step_ms, settings.accept = ddtree_row(resolved, settings.ddtree_table)
        except ValueError as error:
            print(f"launch_server: error: {error}", file=sys.stderr, flush=True)
            return 1
        print(
            f"DDTree budget {resolved['speculative_ddtree_budget']}: "
            f"{settings.step_ms:g} ms and {settings.accept:g} tokens per verify step "
            f"(SGLANG_SIM_DDTREE_TABLE)",
            flush=True,
        )
    if settings.knobs:
        try:
            factor, oom = knob_effects(resolved, settings.knobs)
        except (ValueError, TypeError, ZeroDivisionError) as error:
            print(f"SGLANG_SIM_KNOBS: {error}", file=sys.stderr, flush=True)
            return 1
        settings.step_ms *= factor
        settings.speed_slowdown *= factor
        args["failure"] = args["failure"] or oom
        print(f"SGLANG_SIM_KNOBS: every step {factor:.3f} times as long", flush=True)
    if settings.speed_model:
        try:
            args["step_model"] = StepModel(settings, args["argv"], resolved)
        except (OSError, ValueError, TypeError, KeyError) as error:
            print(f"SGLANG_SIM_SPEED_MODEL: {error}", file=sys.stderr, flush=True)
            return 1
        print(
            f"step times from the speed model ({settings.speed_profile}, "
            f"{args['step_model'].step_ms(1, 1):.3f} ms at one request, slowdown "
            f"{settings.speed_slowdown:g})",
            flush=True,
        )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args, settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
