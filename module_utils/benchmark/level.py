"""The level files: a benchmark run of one config and prompt set (or workload), level by level.

run_benchmark() sends the prompts through the client (client.py) at each level and writes
one level file per level and repeat, with the summary, the server's counters before and
after, the client's own load, the GPUs' telemetry and the provenance the runtime and server
stages left on the host. docs/results.md, "The level file contract", describes the file's
fields. What a run reads before its first level (the prompts, the workload, the host's
records) is level_inputs.py.

Levels: the closed-loop ones first (c<N>.json, N requests in flight), then the request-rate
ones (r<R>.json, Poisson arrivals at R requests/s); repeat k >= 2 of a level is
c<N>.rep<k>.json or r<R>.rep<k>.json. A level sends the first min(wanted, unique) distinct
prompts of the file in file order, never one twice (a repeated prompt would be served from
the radix cache and flatter the level), and records in `fill` how far it fell short.
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import hashlib
import json
import math
import os
import shutil
from dataclasses import dataclass

from ansible.module_utils.benchmark.client import run_level
from ansible.module_utils.benchmark.client_report import client_report, record_of
from ansible.module_utils.benchmark.client_target import (
    Target,
    flush_cache,
    load_json,
    server_state,
)
from ansible.module_utils.benchmark.fleet import Fleet, check_fleet
from ansible.module_utils.benchmark.gpu_telemetry import GpuSampler
from ansible.module_utils.benchmark.level_inputs import (
    host_provenance,
    load_prompts,
    render_rows,
    scorer_of,
    text_or_none,
    workload_of,
)
from ansible.module_utils.benchmark.long_prompts import level_summary, target_of
from ansible.module_utils.benchmark.scoring import accuracy_summary, score_request
from ansible.module_utils.benchmark.stats import (
    SCHEMA_VERSION,
    server_delta,
    summarize_level,
)
from ansible.module_utils.contract.level import (
    LEVEL_KIND,
    level_stem,
    rate_text,
    repeat_stem,
)
from ansible.module_utils.host.helpers import (
    file_sha256,
    mask_secrets,
    read_json,
    write_json_atomic,
)

MAX_REQUEST_RATE = 100_000.0
TELEMETRY_MODES = ("auto", "nvidia-smi", "off")


def rate_requests(rate: float, duration_s: float) -> int:
    """Requests a rate level wants: ceil(rate x duration), rounded first so that 0.1 x 30 is
    3, not 4 (the benchmark role computes the prompts it keeps the same way)."""
    return math.ceil(round(rate * duration_s, 6))


def level_plan(params: dict) -> list[dict]:
    """Every level in the order run: closed loop, then request rate. Each with its file stem,
    the requests it wants (at least num_prompts) and its cap on requests in flight (0: none)."""
    plan = [
        {
            "stem": level_stem(concurrency),
            "arrival": "closed",
            "request_rate": None,
            "cap": concurrency,
            "wanted": max(params["num_prompts"], params["requests_per_concurrency"] * concurrency),
            "label": f"concurrency {concurrency}",
        }
        for concurrency in params["concurrency"]
    ]
    for rate in params["request_rates"]:
        rate = float(rate)
        wanted = rate_requests(rate, params["rate_duration_s"])
        plan.append(
            {
                "stem": level_stem(rate=rate),
                "arrival": "poisson",
                "request_rate": rate,
                "cap": params["max_concurrency"],
                "wanted": max(params["num_prompts"], wanted),
                "label": f"request rate {rate:g}/s",
            }
        )
    return plan


def check_params(params: dict) -> list[str]:
    """What is wrong with the module's arguments, each problem with what is needed."""
    p = params
    problems = []
    if not p["concurrency"] or any(c < 1 for c in p["concurrency"]):
        problems.append(f"concurrency must be a list of levels >= 1, got {p['concurrency']}")
    elif len(set(p["concurrency"])) != len(p["concurrency"]):
        problems.append(f"concurrency names a level twice: {p['concurrency']}")
    if p["num_prompts"] < 1 or p["max_new_tokens"] < 1:
        problems.append("num_prompts and max_new_tokens must be at least 1")
    if p["warmup_requests"] < 0 or p["request_timeout"] <= 0 or p["temperature"] < 0:
        problems.append("warmup_requests >= 0, request_timeout > 0 and temperature >= 0 needed")
    rates = p["request_rates"]
    for rate in rates:
        if not (math.isfinite(rate) and 0 < rate <= MAX_REQUEST_RATE):
            problems.append(f"request_rates: {rate!r} is not a rate above 0 and at most 100000")
            continue
        try:
            rate_text(rate)
        except ValueError as error:
            problems.append(f"request_rates: {error}")
    if len({float(r) for r in rates}) != len(rates):
        problems.append(f"request_rates names a rate twice: {rates}")
    if p["max_concurrency"] < 0:
        problems.append(f"max_concurrency must be 0 (no cap) or more, got {p['max_concurrency']}")
    if not (math.isfinite(p["rate_duration_s"]) and p["rate_duration_s"] > 0):
        problems.append(f"rate_duration_s must be above 0, got {p['rate_duration_s']}")
    if p["requests_per_concurrency"] < 1:
        problems.append(
            f"requests_per_concurrency must be at least 1, got {p['requests_per_concurrency']}"
        )
    if not (math.isfinite(p["level_time_budget_s"]) and p["level_time_budget_s"] > 0):
        problems.append(f"level_time_budget_s must be above 0, got {p['level_time_budget_s']}")
    if not 1 <= p["repeats"] <= 100:
        problems.append(f"repeats must be from 1 to 100, got {p['repeats']}")
    if not 20 <= p["telemetry_interval_ms"] <= 60_000:
        problems.append(
            f"telemetry_interval_ms must be from 20 to 60000, got {p['telemetry_interval_ms']}"
        )
    problems += check_fleet(p.get("fleet"))
    return problems


def now_iso() -> str:
    # timezone.utc, not datetime.UTC: hosts may run Python 3.10.
    return datetime.datetime.now(datetime.timezone.utc).isoformat(  # noqa: UP017
        timespec="milliseconds"
    )


def run_benchmark(params: dict, fail) -> dict:
    """Every level of `params` (the module's arguments); `fail(msg, **extra)` does not return.

    Nothing it writes or says holds the API key or the HF token (params hf_token, never
    sent): error strings are masked where they are made, and each level document as a whole
    before it is written."""
    target = Target(params["base_url"], params["api_key"], [params.get("hf_token") or ""])
    fleet = params.get("fleet")
    fleet = Fleet(fleet, params["api_key"], [params.get("hf_token") or ""]) if fleet else None
    raw_fail = fail

    def fail(msg, **extra):
        raw_fail(target.mask(msg), **extra)

    run = prepare(params, target, fail, fleet)
    os.makedirs(params["output_dir"], mode=0o755, exist_ok=True)
    loop = asyncio.new_event_loop()
    written = Written()
    try:
        warm_up(loop, target, params, run, fail)
        run_levels(loop, target, params, run, written, fail)
    finally:
        loop.close()
    return {
        "files": written.files,
        "summaries": written.summaries,
        "saturated": written.saturated,
        "prompts": {**run.prompts_base, "unique_prompts": run.unique},
    }


@dataclass
class Prepared:
    """What every level of a run shares, read and checked before the first."""

    plan: list  # level_plan
    rows: list  # the prompts file's rows sent, normalized (load_prompts)
    unique: int  # distinct rows the file holds
    payloads: list  # each row's request, ready to send
    shas: list  # each row's prompt_sha256
    max_events: int
    scorer: str | None
    length: dict | None  # a long set's target (long_prompts)
    workload: dict | None
    prompts_base: dict  # the prompts file: path, name, sha256
    provenance: dict
    settings: dict
    fleet: Fleet | None = None  # a level sent through SGLang's router (benchmark/fleet.py)


class Written:
    """The level files written so far, for the result and for a failure's message."""

    def __init__(self):
        self.files: list[str] = []
        self.summaries: dict[str, dict] = {}
        self.saturated: list[str] = []


def prepare(params: dict, target: Target, fail, fleet: Fleet | None = None) -> Prepared:
    """The run's plan, prompts (as payloads), scorer, workload and provenance; `fail` when
    telemetry asked for cannot be had or the server does not answer. Through a router, the
    first replica's /server_info stands in for the router's, which has none."""
    plan = level_plan(params)
    if params["telemetry"] == "nvidia-smi" and shutil.which("nvidia-smi") is None:
        fail(
            "telemetry nvidia-smi was asked for, but nvidia-smi is not on this host's PATH. "
            "Install the NVIDIA driver's utilities, or set telemetry to auto (sample when "
            "nvidia-smi is there) or off."
        )
    server_info = server_info_of(fleet.first() if fleet else target, fail)
    scorer = scorer_of(params)
    meta_path = os.path.splitext(params["prompts"])[0] + ".meta.json"
    meta = read_json(meta_path)
    # A long set's target and estimates (long_prompts), compared with SGLang's count per level.
    length = target_of(meta)
    workload = workload_of(meta, meta_path)
    rows, unique = load_prompts(params["prompts"], max(level["wanted"] for level in plan), scorer)
    # A synthetic workload decodes exactly its output length: EOS does not end it early.
    max_new_tokens = workload["osl"] if workload else params["max_new_tokens"]
    sampling = {"max_new_tokens": max_new_tokens, "temperature": params["temperature"]}
    if workload:
        sampling["ignore_eos"] = True
    payloads, shas = payloads_of(target, rows, render_rows(rows, server_info), sampling)
    return Prepared(
        plan=plan,
        rows=rows,
        unique=unique,
        payloads=payloads,
        shas=shas,
        max_events=max_new_tokens + 16,
        scorer=scorer,
        length=length,
        workload=workload,
        prompts_base={
            "path": params["prompts"],
            "name": os.path.splitext(os.path.basename(params["prompts"]))[0],
            "sha256": file_sha256(params["prompts"]),
        },
        provenance={
            **host_provenance(params["output_dir"]),
            "server_info": mask_secrets(server_info, target.secrets),
            "sglang_version": text_or_none(server_info.get("version")),
        },
        settings=settings_of(params, max_new_tokens, target),
        fleet=fleet,
    )


def server_info_of(target: Target, fail) -> dict:
    """The server's /server_info, a JSON object; `fail` when it does not answer one."""
    try:
        status, body = target.get("/server_info")
        if status != 200:
            raise OSError(f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}")
        server_info = load_json(body, "/server_info")
        if not isinstance(server_info, dict):
            raise ValueError(f"/server_info is not a JSON object but {type(server_info).__name__}")
    except (OSError, ValueError) as error:
        fail(
            f"The SGLang server at {target.shown_url} does not answer /server_info: {error}. "
            "Start it (the server stage) and check base_url."
        )
    return server_info


def payloads_of(target: Target, rows: list, texts: list, sampling: dict) -> tuple[list, list]:
    """Each row's streamed /generate request (its text, or its token ids where it has no
    text) and the sha256 of what it sends."""
    payloads, shas = [], []
    for row, text in zip(rows, texts, strict=True):
        if text is None:
            ids = json.loads(row["input_ids_json"])
            body = {"input_ids": ids, "sampling_params": sampling, "stream": True}
            shas.append(hashlib.sha256(row["input_ids_json"].encode()).hexdigest())
        else:
            body = {"text": text, "sampling_params": sampling, "stream": True}
            shas.append(hashlib.sha256(text.encode()).hexdigest())
        payloads.append(target.request(body))
    return payloads, shas


def settings_of(params: dict, max_new_tokens: int, target: Target) -> dict:
    """The run's settings as every level file records them."""
    return {
        "num_prompts": params["num_prompts"],
        "max_new_tokens": max_new_tokens,
        "temperature": params["temperature"],
        "warmup_requests": params["warmup_requests"],
        "request_timeout_s": params["request_timeout"],
        "base_url": target.shown_url,
        "requests_per_concurrency": params["requests_per_concurrency"],
        "rate_duration_s": params["rate_duration_s"],
        "max_concurrency": params["max_concurrency"],
        "level_time_budget_s": params["level_time_budget_s"],
        "telemetry": params["telemetry"],
        "telemetry_interval_ms": params["telemetry_interval_ms"],
    }


def warm_up(loop, target: Target, params: dict, run: Prepared, fail) -> None:
    """The warmup requests, all at once; `fail` when every one of them failed."""
    if not params["warmup_requests"]:
        return
    count = params["warmup_requests"]
    warm = loop.run_until_complete(
        run_level(
            target,
            [run.payloads[i % len(run.payloads)] for i in range(count)],
            count,
            params["request_timeout"],
            run.max_events,
        )
    )
    errors = [t.error for t in warm["trackers"] if t.error]
    if len(errors) == count:
        fail(f"Every warmup request to {target.shown_url} failed: {errors[0]}")


def run_levels(loop, target: Target, params: dict, run: Prepared, written: Written, fail) -> None:
    """Every level of the plan, each repeat written to its file as soon as it ends; `fail`
    when the server crashed during one or every request of one failed."""
    for level_spec in run.plan:
        # Never a prompt twice: a set smaller than the level wants is sent whole, once.
        count = min(level_spec["wanted"], len(run.payloads))
        prompts_info = {
            **run.prompts_base,
            "requests_per_level": count,
            "distinct_prompts": len(set(run.shas[:count])),
        }
        for repeat in range(1, params["repeats"] + 1):
            document, level = run_one_level(
                loop,
                target,
                params,
                level_spec,
                repeat,
                run.payloads[:count],
                run.max_events,
                run.fleet,
            )
            records, itl = records_of(level, run)
            summary = summary_of(level, records, itl, run)
            client = client_of(level, params)
            complete(document, level, level_spec, params, run, prompts_info, summary, client)
            document["requests"] = records
            stem = repeat_stem(level_spec["stem"], repeat)
            write_level(document, stem, params, target, written)
            check_level(document, level, level_spec, repeat, params, written, fail)


def records_of(level: dict, run: Prepared) -> tuple[list[dict], list[float]]:
    """The level's request records (scored, with a scorer) and every request's ITLs."""
    records, itl = [], []
    for tracker in level["trackers"]:
        row = run.rows[tracker.index]
        record, gaps = record_of(tracker, row, run.shas[tracker.index])
        if run.scorer:
            record["score"] = score_request(run.scorer, record, row["answer"])
        records.append(record)
        itl.extend(gaps)
    return records, itl


def summary_of(level: dict, records: list[dict], itl: list[float], run: Prepared) -> dict:
    """The level's summary: its figures, and its accuracy, prompt lengths and GPUs where the
    run has them."""
    summary = summarize_level(records, level["ended"] - level["started"], itl)
    if run.scorer:
        summary["accuracy"] = accuracy_summary(run.scorer, records)
    if run.length is not None:
        summary["prompt_length"] = level_summary(run.length, records)
    if level["gpu"] is not None:
        summary["gpu"] = level["gpu"]
    return summary


def client_of(level: dict, params: dict) -> dict:
    """The client's report on its own load, with telemetry that was asked for and not had."""
    client = client_report(level, sum(len(t.events) for t in level["trackers"]))
    if level["gpu"] is None and params["telemetry"] != "off":
        # Visible where the level's other measurement caveats are.
        client["warnings"].append(f"no GPU telemetry: {level['gpu_reason']}")
    return client


def complete(document, level, level_spec, params, run, prompts_info, summary, client) -> None:
    """The level document after its head (run_one_level's), in the file's order up to its
    requests: fill, workload, times, settings, summary, server, client, provenance."""
    document["fill"] = {
        "wanted": level_spec["wanted"],
        "unique_prompts": run.unique,
        "sent": level["sent"],
        "under_filled": run.unique < level_spec["wanted"],
        "stopped_by_time_budget": level["stopped_by_time_budget"],
        "time_budget_s": params["level_time_budget_s"],
    }
    if run.workload:
        document["workload"] = run.workload
    delta = server_delta(level["before"], level["after"])
    # Through a router a stream it cut is one request's failure, not a server's crash: the
    # router itself has no start record to tell a restart by, and a replica that died is in
    # the level's `fleet`.
    lost = any(t.lost for t in level["trackers"]) and run.fleet is None
    document.update(
        started_at=level["started_at"],
        ended_at=level["ended_at"],
        settings=run.settings,
        summary=summary,
        server={
            "cache": level["flushed"],
            "before": level["before"],
            "after": level["after"],
            "delta": delta,
            "crashed": lost or delta["restarted"],
        },
        client=client,
        provenance={
            **run.provenance,
            "prompts": prompts_info,
            "started_at": level["started_at"],
            "ended_at": level["ended_at"],
        },
    )
    if run.fleet is not None:
        document["fleet"] = run.fleet.record(level["fleet_before"], level["fleet_after"])


def write_level(document: dict, stem: str, params: dict, target: Target, written: Written):
    """The level file <stem>.json, masked as a whole, and what the result says of it."""
    path = os.path.join(params["output_dir"], f"{stem}.json")
    write_json_atomic(path, mask_secrets(document, target.secrets))
    written.files.append(path)
    written.summaries[stem] = document["summary"]
    if document["client"]["saturated"]:
        written.saturated.append(stem)


def check_level(document, level, level_spec, repeat, params, written: Written, fail) -> None:
    """`fail`, with the files written so far, when the server crashed during the level or
    every request of it failed."""
    where = level_spec["label"]
    if params["repeats"] > 1:
        where += f" (repeat {repeat} of {params['repeats']})"
    records = document["requests"]
    if document["server"]["crashed"]:
        lost = [t for t in level["trackers"] if t.lost]
        reason = lost[0].error if lost else "it restarted (new start time or counters)"
        fail(
            f"The server crashed during {where} of "
            f"{params['config_name']}: {len(lost)} of {len(records)} requests lost "
            f"their connection; {reason}. See the server's log.",
            files=written.files,
            summaries=written.summaries,
        )
    if document["summary"]["requests_ok"] == 0:
        first = next((r["error"] for r in records if r["error"]), "unknown")
        fail(
            f"Every request at {where} failed: {first}",
            files=written.files,
            summaries=written.summaries,
        )


def run_one_level(loop, target, params, level_spec, repeat, payloads, max_events, fleet=None):
    """One level's requests, between a cache flush and the server's state before and after,
    with the GPUs sampled from just before the first request to just after the last. Returns
    the level document's head (its fields in the file's order) and run_level's result with
    the server calls' and the sampler's findings added."""
    document = {
        "schema_version": SCHEMA_VERSION,
        "kind": LEVEL_KIND,
        "run_label": params["run_label"],
        "config": params["config_name"],
        "prompt_set": os.path.splitext(os.path.basename(params["prompts"]))[0],
        # Rate levels: the cap on requests in flight; with none, every request may be.
        "concurrency": level_spec["cap"] or len(payloads),
        "request_rate": level_spec["request_rate"],
        "arrival": level_spec["arrival"],
        "repeat": repeat,
        "repeats": params["repeats"],
    }
    flushed = flush_cache(target)
    before = server_state(target)
    fleet_before = fleet.state() if fleet else None
    sampler = GpuSampler(mode=params["telemetry"], interval_ms=params["telemetry_interval_ms"])
    sampler.start()
    started_at = now_iso()
    gc.collect()
    gc.disable()  # a collection mid-level would show up as client latency
    try:
        level = loop.run_until_complete(
            run_level(
                target,
                payloads,
                level_spec["cap"],
                params["request_timeout"],
                max_events,
                request_rate=level_spec["request_rate"],
                # The same arrivals for every config at a rate; another draw per repeat.
                seed=repeat - 1,
                time_budget_s=params["level_time_budget_s"],
            )
        )
    finally:
        gc.enable()
        gpu = sampler.stop()
    ended_at = now_iso()
    after = server_state(target)
    level.update(
        fleet_before=fleet_before,
        fleet_after=fleet.state() if fleet else None,
        flushed=flushed,
        before=before,
        after=after,
        started_at=started_at,
        ended_at=ended_at,
        gpu=gpu,
        gpu_reason=sampler.reason,
    )
    return document, level
