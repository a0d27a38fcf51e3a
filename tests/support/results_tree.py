"""Benchmark result trees with known answers, for the analysis tests and its speed benchmark.

write_run() lays out what benchmark_kimi.yml lands on the controller,

    <root>/run.json
    <root>/<host>/lossless.json
    <root>/<host>/<config>/status.json
    <root>/<host>/<config>/<prompt set>/c<N>.json

with level files built the way the sglang_benchmark module builds them from a server that
behaves like tests/support/sglang_sim.py (and SGLang 0.5.23): after `prefill_ms` each request gets a
first streamed event with the one token prefill produced, then one event per decode step of
`step_ms`, carrying 1 token without speculation and `accept` tokens (floor/ceil alternating,
as the simulator does) per verify step with it; spec_verify_ct and spec_accept_length come
with the last event only; a closed loop keeps `concurrency` requests in flight. The
per-request timings and the level summary come from the module's own functions
(module_utils/benchmark/stats.py), and every field is the writer's
(module_utils/benchmark/level.py),
so the files follow the contract, docs/schema/level.schema.json (level_problems() checks a
document against it, as the writer's tests do), and expected_output_tokens_per_s() gives the
throughput those settings imply.

DDTree sweeps: ddtree_sweep({budget: (step_ms, accept)}) gives one config per budget, and a
Sim's `at` overrides step time and acceptance at given concurrency levels, so a test can lay
out a sweep that collapses at some levels only. Launch argv follow the kit's serving configs:
the algorithm, --speculative-num-draft-tokens (and the DFlash block size), the DDTree budget,
and page size 1, overlap off and triton for DDTree and its chain control. A Sim's `tp` is the
launch's --tp-size (8 unless set); ddtree_sweep(table, tp=N) names its configs
ddtree-tp<N>-b<B>, as a serving config expanded over TP sizes is named. run.json carries the
plan's `model` (KIMI unless set; None leaves it out, as runs before models were data did) and
its `reference` config.

Scored prompt sets (Plan.scored, {set: scorer}): each request record carries its `score` and
the summary its `accuracy`, as the benchmark records them; a Sim's `accuracy` and
`unanswered` say which prompts it answers right, wrong or not at all, drawn the same way for
every config (so a config at 0.89 is wrong on prompts AR at 0.9 got right), and its
`prompts_variant` gives it another prompts file. Plan.accuracy_floors goes into run.json's
model.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import random
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The module's helpers are stdlib-only; Ansible ships them as ansible.module_utils.benchmark.stats,
# and the tests (conftest) make that name resolve to the repository's module_utils/.
from ansible.module_utils.benchmark.scoring import accuracy_summary  # noqa: E402
from ansible.module_utils.benchmark.stats import (  # noqa: E402
    SCHEMA_VERSION,
    accepted_tokens_per_step,
    decode_steps,
    request_timings,
    summarize_level,
)

import module_utils  # noqa: E402, F401

LEVEL_SCHEMA = REPO / "docs" / "schema" / "level.schema.json"
VOCAB = 163840
# /server_info's startup_time as SGLang 0.5.23 reports it: durations measured while starting.
STARTUP = {
    "load_weight": 512.25,
    "kv_cache_allocation": 3.5,
    "scheduler_e2e": 640.75,
    "cuda_graph": {"decode": 41.0, "target_verify": 12.5},
    "tokenizer_e2e": 650.0,
}
PROFILES = {
    "ct200": {
        "models": {"NVIDIA RTX PRO 6000 Blackwell Server Edition": 8},
        "interconnect": "pcie",
        "driver_version": "580.95.05",
    },
    "h200": {"models": {"NVIDIA H200": 8}, "interconnect": "nvlink", "driver_version": "580.95.05"},
    "b200": {"models": {"NVIDIA B200": 8}, "interconnect": "nvlink", "driver_version": "580.95.05"},
}


@dataclass(frozen=True)
class Sim:
    """One serving config as the simulator would run it."""

    step_ms: float = 20.0
    accept: float = 1.0  # tokens per decode step; 1 is plain decoding
    prefill_ms: float = 50.0
    lossy: float = 0.0  # share of tokens changed under speculation (broken verification)
    budget: int | None = None  # DDTree node budget
    # Step time grows with the batch: step_ms x (1 + batch_cost x (concurrency - 1)).
    batch_cost: float = 0.0
    # Prompts accept differently: request i's accept is accept x (1 + spread x u_i), u_i in
    # [-1, 1] fixed per prompt.
    spread: float = 0.0
    # ((concurrency, step_ms, accept), ...): that level's step time (batch cost not applied)
    # and acceptance instead.
    at: tuple[tuple[int, float, float], ...] = ()
    # --speculative-algorithm and --speculative-num-draft-tokens of the launch; None: from the
    # config's name and the kit's defaults (EAGLE3 4, DFLASH and DDTREE 8, the block size).
    algorithm: str | None = None
    draft_tokens: int | None = None
    tp: int = 8  # the launch's --tp-size
    # Scored prompt sets (Plan.scored): the share of prompts answered right, and the share cut
    # off (unanswered). Prompt i is right when its draw (a rank among the set's prompts,
    # the same for every config) is below `accuracy`, unanswered when it is at or above
    # 1 - `unanswered`, else wrong: a config at 0.89 is wrong on prompts a config at 0.9
    # got right, never right where it was wrong.
    accuracy: float | None = None
    unanswered: float = 0.0
    # Another prompts file (its sha256 differs): request i's prompt is not the reference's.
    prompts_variant: str = ""

    @property
    def speculative(self) -> bool:
        return self.accept != 1.0 or self.budget is not None

    def step_at(self, concurrency: int) -> float:
        return self.step_ms * (1 + self.batch_cost * (concurrency - 1))

    def at_level(self, concurrency: int) -> Sim:
        """This config as it runs at one concurrency level (its `at` override, if any)."""
        for level, step_ms, accept in self.at:
            if level == concurrency:
                return replace(self, step_ms=step_ms, accept=accept, batch_cost=0.0, at=())
        return self

    def accept_of(self, prompt: int) -> float:
        if not self.spread or not self.speculative:
            return self.accept
        u = ((prompt * 2654435761) % 1000) / 499.5 - 1.0
        return max(1.0, self.accept * (1 + self.spread * u))


CHAIN_CONTROL = "dflash-tree-backend"
DRAFT_TOKENS = {"EAGLE3": 4, "DFLASH": 8, "DDTREE": 8}


def ddtree_sweep(
    table: dict[int, tuple[float, float]], tp: int | None = None, **common
) -> dict[str, Sim]:
    """ddtree-b<N> configs from {budget: (step_ms, accept)}, in the shape of
    tests/support/ddtree_tables.py; with tp, ddtree-tp<T>-b<N> served at that TP size."""
    prefix = f"ddtree-tp{tp}" if tp is not None else "ddtree"
    sized = {"tp": tp} if tp is not None else {}
    return {
        f"{prefix}-b{budget}": Sim(step_ms=step, accept=accept, budget=budget, **sized, **common)
        for budget, (step, accept) in sorted(table.items())
    }


# run.json's `model` as roles/benchmark writes it (benchmark_model).
KIMI = {
    "name": "kimi-k2.6",
    "title": "Kimi K2.6",
    "attention": "pure_attention",
    "target": {"repo_id": "moonshotai/Kimi-K2.6", "revision": "a" * 40},
}
QWEN = {
    "name": "qwen3.6-27b",
    "title": "Qwen3.6-27B",
    "attention": "hybrid",
    "target": {"repo_id": "Qwen/Qwen3.6-27B", "revision": "e" * 40},
}


DEFAULT_CONFIGS = {
    "ar": Sim(step_ms=20.0),
    "eagle3": Sim(step_ms=24.0, accept=3.2),
    "dflash": Sim(step_ms=26.0, accept=5.0),
    "ddtree-b16": Sim(step_ms=28.0, accept=6.0, budget=16),
    "ddtree-b32": Sim(step_ms=31.0, accept=6.8, budget=32),
    "ddtree-b64": Sim(step_ms=38.0, accept=7.2, budget=64),
}


# summary.gpu as module_utils/benchmark/gpu_summary.py summarises a level (issue 19's design):
# eight GPUs drawing 5.6 kW together, GPU 3 held at its power cap in 90% of the samples.
GPU_SUMMARY = {
    "source": "nvidia-smi",
    "interval_ms": 200,
    "duration_s": 10.0,
    "samples": 50,
    "power_w_mean": 5600.0,
    "energy_j": 56000.0,
    "gpus": [],
    "throttled": [
        {
            "gpu": 3,
            "reason": "power_cap",
            "share": 0.9,
            "sm_clock_mhz_mean": 1410.0,
            "sm_clock_max_mhz": 1980.0,
        }
    ],
    "warnings": [],
}


@dataclass
class Plan:
    """What one run holds: hosts (name -> profile), configs per host, levels and prompts."""

    hosts: dict[str, str] = field(default_factory=lambda: {"node-a": "ct200"})
    configs: dict[str, Sim] = field(default_factory=lambda: dict(DEFAULT_CONFIGS))
    # Per host overrides: {host: {config: Sim}}, for hardware that differs.
    host_configs: dict[str, dict[str, Sim]] = field(default_factory=dict)
    concurrency: tuple[int, ...] = (1, 4, 16)
    prompt_sets: tuple[str, ...] = ("gsm8k",)
    num_prompts: int = 16
    max_new_tokens: int = 64
    temperature: float = 0.0
    jitter: float = 0.0  # relative spread of each step time (uniform +-)
    seed: int = 0
    run_id: str = "20260101T000000Z"
    # {(host, config, concurrency)} levels whose client marks itself saturated
    saturated: set = field(default_factory=set)
    # configs that crash on a host: {host: config}
    crashed: dict[str, str] = field(default_factory=dict)
    text: bool = True  # keep text and output ids in each record, as the module does
    # run.json's `model`; None: left out, as runs before models were data wrote it
    model: dict | None = field(default_factory=lambda: dict(KIMI))
    reference: str = "ar"  # run.json's reference_config, the losslessness check's truth
    # Scored prompt sets, {name: scorer}: their levels carry each request's score and the
    # summary's accuracy (Sim.accuracy of every config must be set).
    scored: dict[str, str] = field(default_factory=dict)
    # run.json model.accuracy_floors ({set: {floor, source}}); None leaves it out.
    accuracy_floors: dict | None = None
    # The chat template kwargs scored sets are rendered with (their prompt set record).
    scored_kwargs: dict = field(default_factory=lambda: {"thinking": False})
    # Issue 19's level shapes. repeats: every level k times (c<N>.json, c<N>.rep<k>.json),
    # each with its own jitter draw; request_rates: r<R>.json levels after the closed-loop
    # ones, Poisson arrivals at R/s from the level's seed with at most max_concurrency in
    # flight (0: no cap; the file's concurrency is the cap, else num_prompts).
    repeats: int = 1
    request_rates: tuple[float, ...] = ()
    max_concurrency: int = 0
    # Write the level fields of the design (repeat, repeats, arrival, request_rate, fill);
    # False lays out the files alone, as a writer before them would name its repeats.
    level_fields: bool = True
    # fill.unique_prompts (None: num_prompts); fill is written when this or a workload is
    # set, with wanted = 10 x concurrency, or rate x 60 s at a rate level (at least
    # num_prompts).
    unique_prompts: int | None = None
    # {prompt set: workload record}: those sets are synthetic workloads (the level's
    # `workload`, its name the folder's).
    workloads: dict = field(default_factory=dict)
    # {config: summary.gpu}: the telemetry summary of every level of that config.
    gpu: dict = field(default_factory=dict)
    # What two runs compared may differ in beyond the settings (issue 20's comparability):
    # args added to every config's launch argv, the launch environment, facts laid over the
    # profile's provenance.gpu, the runtime record's package list (both runtimes), the git
    # runtime's commit and the target weights' revision.
    launch_args: tuple[str, ...] = ()
    launch_environment: dict = field(default_factory=lambda: {"HF_HUB_OFFLINE": "1"})
    gpu_facts: dict = field(default_factory=dict)
    runtime_packages: dict | None = None
    git_commit: str = "c" * 40
    target_revision: str = "a" * 40
    # Host records the benchmark role copies into every level's provenance, {host: {name:
    # record}}: the tuning stage's all-reduce check ("allreduce"), the speed calibration
    # ("speed_calibration").
    records: dict = field(default_factory=dict)
    # SGLang's prompt_tokens of every request record.
    prompt_tokens: int = 120

    def sims(self, host: str) -> dict[str, Sim]:
        return {**self.configs, **self.host_configs.get(host, {})}


def expected_output_tokens_per_s(
    sim: Sim,
    concurrency: int,
    requests: int,
    tokens: int,
    stepped: bool = False,
    late_join: bool | None = None,
) -> float:
    """Throughput the simulator's settings imply (without spread): every request takes the same
    time (prefill, which gives the first token, then the steps for the rest), `concurrency` run
    together in waves.

    stepped=True follows the simulator's scheduler loop (and SGLang's): requests join at a
    step boundary and prefill ends on one, and a request that arrives during a step waits for
    its end. A wave's requests arrive a little apart: when a step boundary falls between them,
    all but the first join one step late and the wave ends a step later (late_join; by default
    assumed whenever several run together). The files write_run() lays out have no such steps."""
    sim = sim.at_level(concurrency)
    steps = len(token_steps(sim.accept if sim.speculative else 1.0, tokens - 1))
    step = sim.step_at(concurrency)
    prefill = sim.prefill_ms
    if stepped:
        late = concurrency > 1 if late_join is None else late_join and concurrency > 1
        prefill = math.ceil(prefill / step - 1e-9) * step + (step if late else 0)
    latency_s = (prefill + steps * step) / 1000.0
    waves = math.ceil(requests / concurrency)
    return requests * tokens / (waves * latency_s)


def implied_speedup_range(
    spec: Sim, ar: Sim, concurrency: int, requests: int, tokens: int
) -> tuple[float, float]:
    """The speedup over AR a live simulator run can show: whether a wave's requests straddle a
    step boundary (and so join a step late) depends on when they happen to arrive, so both ends
    are possible, and a run whose waves differ lands in between."""
    ratios = [
        expected_output_tokens_per_s(spec, concurrency, requests, tokens, True, late)
        / expected_output_tokens_per_s(ar, concurrency, requests, tokens, True, late)
        for late in (False, True)
    ]
    return min(ratios), max(ratios)


def token_steps(accept: float, tokens: int) -> list[int]:
    """Tokens each decode step delivers, as the simulator's carry does it."""
    out, carry, done = [], 0.0, 0
    for _ in range(tokens):
        if done >= tokens:
            break
        carry += accept
        count = max(1, math.floor(carry))
        carry -= count
        count = min(count, tokens - done)
        out.append(count)
        done += count
    return out


def word(prompt: int, index: int) -> tuple[str, int]:
    value = (prompt * 7919 + index * 104729 + 12345) % (1 << 32)
    return f"w{value:08x}", value % VOCAB


def outputs(prompt: int, tokens: int, lossy: float) -> tuple[str, list[int]]:
    words, ids = [], []
    for index in range(tokens):
        text, number = word(prompt, index)
        # Same rule for every level, so a lossy config is lossy everywhere.
        if lossy and (prompt * 31 + index * 17) % 1000 < lossy * 1000:
            text, number = "x" + text[1:], (number + 1) % VOCAB
        words.append(text)
        ids.append(number)
    return " ".join(words), ids


def level_document(
    plan: Plan,
    host: str,
    config: str,
    prompt_set: str,
    concurrency: int,
    repeat: int = 1,
    rate: float | None = None,
) -> dict:
    """One level file's document: closed loop at `concurrency`, or with `rate` Poisson
    arrivals at that many requests/s (at most `concurrency` in flight)."""
    sim = plan.sims(host)[config].at_level(concurrency)
    seed = f"{plan.seed}/{host}/{config}/{prompt_set}/{concurrency}"
    seed += (f"/r{rate:g}" if rate is not None else "") + (f"/rep{repeat}" if repeat > 1 else "")
    rng = random.Random(hashlib.sha256(seed.encode()).digest())
    step_s = sim.step_at(concurrency) / 1000.0
    crash = plan.crashed.get(host) == config
    requests, itl = [], []
    free_at = [0.0] * min(concurrency, plan.num_prompts)  # when each worker is free, s
    arrivals, clock = [], 0.0
    for _ in range(plan.num_prompts):
        arrivals.append(clock)
        clock += rng.expovariate(rate) if rate is not None else 0.0
    for index in range(plan.num_prompts):
        worker = min(range(len(free_at)), key=free_at.__getitem__)
        sent = max(free_at[worker], arrivals[index])
        connected = sent + 0.0001
        now = connected + sim.prefill_ms / 1000.0
        # Prefill gives the first token; the decode (verify) steps give the rest.
        events, total = [(now, 1)], 1
        accept = sim.accept_of(index) if sim.speculative else 1.0
        for count in token_steps(accept, plan.max_new_tokens - 1):
            now += step_s * (1 + rng.uniform(-plan.jitter, plan.jitter))
            total += count
            events.append((now, total))
        failed = crash and index >= plan.num_prompts // 2
        if failed:
            events = events[: len(events) // 3]
        done = None if failed else now
        free_at[worker] = events[-1][0] if failed and events else now
        record, gaps = record_of(
            plan, sim, index, prompt_set, connected, sent, events, done, failed
        )
        if prompt_set in plan.scored:
            record["score"] = score_of(plan, sim, prompt_set, index, failed)
            if record["score"]["outcome"] != "unanswered":
                record["finish_reason"] = "stop"
        requests.append(record)
        if record["ok"]:
            itl.extend(gaps)
    duration = max(free_at)
    summary = summarize_level(requests, duration, itl)
    if prompt_set in plan.scored:
        summary["accuracy"] = accuracy_summary(plan.scored[prompt_set], requests)
    if config in plan.gpu:
        summary["gpu"] = plan.gpu[config]
    started = f"2026-01-01T00:{concurrency % 60:02d}:00.000+00:00"
    saturated = (host, config, concurrency) in plan.saturated
    provenance = provenance_of(plan, host, config, prompt_set, sim)
    shape = {}
    if plan.level_fields and (plan.repeats > 1 or plan.request_rates):
        shape = {
            "request_rate": rate,
            "arrival": "closed" if rate is None else "poisson",
            "repeat": repeat,
            "repeats": plan.repeats,
        }
    if plan.unique_prompts is not None or prompt_set in plan.workloads:
        # A closed loop wants 10 x concurrency, a rate level rate x 60 s (the defaults).
        wanted = max(10 * concurrency if rate is None else math.ceil(rate * 60), plan.num_prompts)
        unique = plan.unique_prompts if plan.unique_prompts is not None else plan.num_prompts
        shape["fill"] = {
            "wanted": wanted,
            "unique_prompts": unique,
            "sent": plan.num_prompts,
            "under_filled": unique < wanted,
            "stopped_by_time_budget": False,
            "time_budget_s": 1200.0,
        }
    if prompt_set in plan.workloads:
        shape["workload"] = plan.workloads[prompt_set]
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "sglang_benchmark.level",
        "run_label": plan.run_id,
        "config": config,
        "prompt_set": prompt_set,
        "concurrency": concurrency,
        **shape,
        "started_at": started,
        "ended_at": started,
        "settings": {
            "num_prompts": plan.num_prompts,
            "max_new_tokens": plan.max_new_tokens,
            "temperature": plan.temperature,
            "warmup_requests": 2,
            "request_timeout_s": 600.0,
            "base_url": "http://127.0.0.1:30000",
        },
        "summary": summary,
        "server": {
            "cache": "flushed",
            "before": {"metrics": {}, "startup_time": STARTUP, "avg_spec_accept_length": None},
            "after": {"metrics": {}, "startup_time": STARTUP, "avg_spec_accept_length": None},
            "delta": {
                "metrics": {},
                "spec_accept_length": None,
                "accepted_tokens_per_step": None,
                "restarted": False,
            },
            "crashed": crash,
        },
        "client": {
            "cpu_s": 0.1,
            "cpu_fraction": 0.92 if saturated else 0.05,
            "loop_lag_ms": {
                "mean": 0.1,
                "p50": 0.1,
                "p90": 0.2,
                "p99": 3.0 if saturated else 0.3,
                "max": 3.5 if saturated else 0.4,
                "count": 200,
            },
            "events": sum(len(r["events"]) for r in requests),
            "events_per_s": 1000.0,
            "event_gap_ms": round(step_s * 1000.0, 4),
            "bytes_received": 0,
            "saturated": saturated,
            "saturated_reasons": ["client CPU 92% of one core"] if saturated else [],
            "timing_reliable": not saturated,
            "warnings": [],
            "thresholds": {
                "saturated_cpu_fraction": 0.85,
                "busy_cpu_fraction": 0.3,
                "behind_lag_share_of_event_gap": 0.25,
                "late_loop_lag_p99_ms": 2.0,
            },
            "python": sys.version.split()[0],
        },
        "provenance": {**provenance, "started_at": started, "ended_at": started},
        "requests": requests,
    }


def record_of(plan, sim, index, prompt_set, connected, sent, events, done, failed):
    """One request's record, field for field as sglang_benchmark's record_of writes it, and
    its per-token gaps."""
    timings = request_timings(connected, events, done)
    tokens = events[-1][1] if events else 0
    # Every event after the first (prefill) one is a verify step; SGLang counts them on the
    # last event only.
    verify = (len(events) - 1 or None) if sim.speculative else None
    first_meta = {"completion_tokens": events[0][1] if events else 0}
    last_meta = {"completion_tokens": tokens, "spec_verify_ct": verify}
    steps = decode_steps(first_meta, last_meta) if events else 0
    text, ids = outputs(index, tokens, sim.lossy if sim.speculative else 0.0)
    record = {
        "index": index,
        "prompt_id": None,
        "prompt_sha256": hashlib.sha256(f"{prompt_set}/{index}".encode()).hexdigest(),
        "ok": not failed,
        "error": "connection closed before [DONE] (closed by the server)" if failed else None,
        "ttft_ms": round(timings["ttft_ms"], 3) if events else None,
        "e2e_ms": round(timings["e2e_ms"], 3) if events else None,
        "tpot_ms": round(timings["tpot_ms"], 4) if timings["tpot_ms"] is not None else None,
        "output_tokens": tokens,
        "connect_ms": round((connected - sent) * 1000.0, 3),
        "events": [[round((t - connected) * 1000.0, 3), n] for t, n in events],
        "prompt_tokens": plan.prompt_tokens,
        "cached_tokens": 0,
        "spec_verify_ct": verify,
        "accept_length": accepted_tokens_per_step(tokens, verify),
        "spec_accept_length": tokens / verify if verify else None,
        "decode_steps": steps,
        "decode_ms": round(timings["decode_ms"], 3),
        "step_ms": round(timings["decode_ms"] / steps, 4) if steps > 0 else None,
        "finish_reason": "length",
        "text": text if plan.text else None,
        "output_ids": ids if plan.text else None,
    }
    return record, timings["itl_ms"]


def draw(plan: Plan, prompt_set: str, index: int) -> float:
    """Prompt index's rank among the set's prompts, over their count: every value k / n once,
    so a rate r makes exactly round(r n) prompts fall below it."""
    return _ranks(plan.seed, prompt_set, plan.num_prompts)[index] / plan.num_prompts


@functools.cache
def _ranks(seed: int, prompt_set: str, count: int) -> dict[int, int]:
    order = sorted(
        range(count), key=lambda i: hashlib.sha256(f"{seed}/{prompt_set}/{i}".encode()).digest()
    )
    return {prompt: rank for rank, prompt in enumerate(order)}


def score_of(plan: Plan, sim: Sim, prompt_set: str, index: int, failed: bool) -> dict:
    """A request's score as the benchmark records it (module_utils/benchmark/scoring.py's
    outcome)."""
    expected = str(index * 3 + 7)
    value = draw(plan, prompt_set, index)
    if failed or value >= 1 - sim.unanswered - 1e-9:
        return {"outcome": "unanswered", "extracted": None, "expected": expected}
    if value < (sim.accuracy or 0.0) - 1e-9:
        return {"outcome": "correct", "extracted": expected, "expected": expected}
    return {"outcome": "wrong", "extracted": str(index * 3 + 8), "expected": expected}


def model_of(plan: Plan) -> dict:
    """run.json's model: the plan's, with its accuracy floors when it has them."""
    floors = plan.accuracy_floors
    return {**plan.model, **({"accuracy_floors": floors} if floors is not None else {})}


def provenance_of(plan: Plan, host: str, config: str, prompt_set: str, sim: Sim) -> dict:
    profile = PROFILES[plan.hosts[host]]
    argv = ["python", "-m", "sglang.launch_server", "--model-path", "/w/t"]
    argv += ["--tp-size", str(sim.tp)]
    algorithm = algorithm_of(config, sim)
    if algorithm is not None:
        tokens = str(sim.draft_tokens or DRAFT_TOKENS.get(algorithm, 4))
        argv += ["--speculative-algorithm", algorithm, "--speculative-num-draft-tokens", tokens]
        if algorithm in ("DFLASH", "DDTREE"):
            argv += ["--speculative-dflash-block-size", tokens]
    if sim.budget is not None:
        argv += ["--speculative-ddtree-budget", str(sim.budget)]
    git = sim.budget is not None or config.startswith(CHAIN_CONTROL)
    if git:
        argv += ["--page-size", "1", "--disable-overlap-schedule", "--attention-backend", "triton"]
    argv += list(plan.launch_args)
    packages = {"packages": plan.runtime_packages} if plan.runtime_packages is not None else {}
    return {
        "kit_version": "0.1.0",
        "run_id": plan.run_id,
        "host": host,
        "config": config,
        "gpu": {
            "count": 8,
            "models": profile["models"],
            "driver_version": profile["driver_version"],
            "cuda_version": "13.0",
            "interconnect": profile["interconnect"],
            **plan.gpu_facts,
        },
        "prompt_sets": {
            prompt_set: {
                "name": prompt_set,
                "source": {"repo": f"datasets/{prompt_set}", "resolved": "b" * 40},
                "sha256": "0" * 64,
                "scoring": plan.scored.get(prompt_set),
                "chat_template": {
                    "source": "chat_template.jinja",
                    "sha256": "f" * 64,
                    "kwargs": plan.scored_kwargs if prompt_set in plan.scored else {},
                },
            }
        },
        "runtime": {
            "release": {"version": "0.5.23", **packages},
            "git": {"commit": plan.git_commit, **packages} if git else None,
        },
        "launch": {
            "config": config,
            "base": "ddtree" if sim.budget is not None else config.split("-tp")[0],
            "budget": sim.budget,
            "runtime": "git" if git else "release",
            "argv": argv,
            "environment": dict(plan.launch_environment),
        },
        "weights": [
            {
                "role": "target",
                "path": "/w/t",
                "manifest": "/w/t/kimi-manifest.json",
                "manifest_sha256": "d" * 64,
                "repo_id": "moonshotai/Kimi-K2.6",
                "revision": plan.target_revision,
                "verify_mode": "sha256",
                "verified_at": "2026-01-01T00:00:00+00:00",
                "files": 64,
            }
        ],
        "server_info": {"version": "0.5.23"},
        "sglang_version": "0.5.23",
        "prompts": {
            "path": f"/var/lib/kimi/benchmark/prompts/{prompt_set}.jsonl",
            "name": prompt_set,
            "sha256": hashlib.sha256((prompt_set + sim.prompts_variant).encode()).hexdigest(),
            "requests_per_level": plan.num_prompts,
            "distinct_prompts": plan.num_prompts,
        },
        **plan.records.get(host, {}),
    }


def algorithm_of(config: str, sim: Sim) -> str | None:
    if sim.algorithm is not None:
        return sim.algorithm
    if sim.budget is not None:
        return "DDTREE"
    if not sim.speculative:
        return None
    for prefix, name in (("dflash", "DFLASH"), ("eagle", "EAGLE3")):
        if config.startswith(prefix):
            return name
    return config.upper()


@functools.cache
def level_schema_validator():
    """The level file's contract as the writer's tests apply it: jsonschema as it comes, on
    its own (the analysis compiles its own validator from the same file)."""
    from jsonschema import Draft202012Validator

    schema = json.loads(LEVEL_SCHEMA.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def level_problems(document) -> list[str]:
    """Every way a level document breaks docs/schema/level.schema.json, 'field: message'
    each; empty when it follows it."""
    return sorted(
        f"{'.'.join(map(str, error.absolute_path)) or '(top level)'}: {error.message}"
        for error in level_schema_validator().iter_errors(document)
    )


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # indent=1, as the module writes them: the size the analysis must read fast.
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def write_run(root: Path, plan: Plan | None = None, lossless: bool = True) -> Path:
    """The run's folder under root (root itself); returns it."""
    from tests.support.modules import load_module

    plan = plan or Plan()
    root.mkdir(parents=True, exist_ok=True)
    write_json(
        root / "run.json",
        {
            "run_id": plan.run_id,
            "kit_version": "0.1.0",
            "started_at": "2026-01-01T00:00:00+00:00",
            "ended_at": "2026-01-01T01:00:00+00:00",
            "hosts": list(plan.hosts),
            "configs": list(plan.configs),
            "reference_config": plan.reference,
            "prompt_sets": list(plan.prompt_sets),
            "concurrency": list(plan.concurrency),
            "request_rates": list(plan.request_rates),
            "repeats": plan.repeats,
            "num_prompts": plan.num_prompts,
            "max_new_tokens": plan.max_new_tokens,
            "temperature": plan.temperature,
            **({"model": model_of(plan)} if plan.model is not None else {}),
        },
    )
    checker = load_module("benchmark_lossless") if lossless else None
    for host in plan.hosts:
        for config in plan.sims(host):
            crashed = plan.crashed.get(host) == config
            # The module stops a config at its first crashed level: only that file lands.
            levels = [(s, c, None) for s in plan.prompt_sets for c in plan.concurrency]
            cap = plan.max_concurrency or plan.num_prompts
            levels += [(s, cap, r) for s in plan.prompt_sets for r in plan.request_rates]
            for prompt_set, concurrency, rate in levels[:1] if crashed else levels:
                for repeat in range(1, (1 if crashed else plan.repeats) + 1):
                    document = level_document(
                        plan, host, config, prompt_set, concurrency, repeat, rate
                    )
                    name = f"c{concurrency}" if rate is None else f"r{format(rate, 'g')}"
                    name += f".rep{repeat}" if repeat > 1 else ""
                    write_json(root / host / config / prompt_set / f"{name}.json", document)
            status = {"config": config, "status": "ok", "output_tokens_per_s": {}}
            if crashed:
                status = {
                    "config": config,
                    "status": "failed",
                    "task": "Run the benchmark on one prompt set",
                    "error": f"The server crashed during concurrency 1 of {config}",
                    "log_tail": ["simulated crash"],
                }
            write_json(root / host / config / "status.json", status)
        if checker is not None:
            report = checker.check(str(root / host), plan.reference, 0.1)
            write_json(root / host / "lossless.json", report)
    return root


TEMPLATE = (
    "{% for m in messages %}<|im_{{ m.role }}|>{{ m.content }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_assistant|>{% endif %}"
)


def check_contract(document: dict, config: str, concurrency: int) -> None:
    """What docs/results.md promises of every c<N>.json: docs/schema/level.schema.json, and what
    a schema cannot say."""
    assert level_problems(document) == []
    assert document["config"] == config and document["concurrency"] == concurrency
    summary = document["summary"]
    assert summary["requests_ok"] + summary["requests_failed"] == len(document["requests"])
    assert [r["index"] for r in document["requests"]] == list(range(len(document["requests"])))
