"""The level files: a benchmark run of one config and prompt set (or workload), level by level.

run_benchmark() sends the prompts through the client (benchmark_client.py) at each level and
writes one level file per level and repeat, with the summary, the server's counters before
and after, the client's own load, the GPUs' telemetry and the provenance the runtime and
server stages left on the host. docs/results.md, "The level file contract",
describes the file's fields.

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
import itertools
import json
import math
import os
import re
import shutil

from ansible.module_utils.benchmark.client import (
    Target,
    client_report,
    flush_cache,
    load_json,
    record_of,
    run_level,
    server_state,
)
from ansible.module_utils.benchmark.gpu_telemetry import GpuSampler
from ansible.module_utils.benchmark.long_prompts import level_summary, target_of
from ansible.module_utils.benchmark.scoring import (
    MAX_REFERENCE_CHARS,
    SCORERS,
    accuracy_summary,
    score_request,
)
from ansible.module_utils.benchmark.stats import (
    SCHEMA_VERSION,
    chat_template_of,
    render_chat,
    server_delta,
    special_tokens,
    summarize_level,
    template_files,
)
from ansible.module_utils.host.helpers import (
    file_sha256,
    mask_secrets,
    read_json,
    write_json_atomic,
)

DEFAULT_RECORDS = {
    "runtime": "/opt/kimi/runtime/runtime.json",
    "launch": "/var/lib/kimi/server/launch.json",
}
# Longest string copied from a file or the server into the level file's provenance.
MAX_COPIED_TEXT = 512


def text_or_none(value) -> str | None:
    """A string field read from outside: kept (bounded) when it is a string, else null."""
    return value[:MAX_COPIED_TEXT] if isinstance(value, str) else None


# Most ids one input_ids row may hold (a workload's isl is at most this), and the largest id.
MAX_INPUT_IDS = 1_048_576
MAX_TOKEN_ID = 2**31 - 1
# Longest line of a prompts file (a row of MAX_INPUT_IDS ids fits), and most distinct rows
# counted: a file past that is not one the role writes.
MAX_PROMPT_LINE = 16 << 20
MAX_PROMPT_ROWS = 1_000_000
# A workload's name and bounds (module_utils/benchmark/workloads.py builds them, docs ISSUE19
# design).
WORKLOAD_NAME = re.compile(r"^isl([1-9][0-9]*)-osl([1-9][0-9]*)$")
MAX_WORKLOAD_ISL = 1_048_576
MAX_WORKLOAD_OSL = 131_072
HEX40 = re.compile(r"^[0-9a-f]{40}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
# A rate level's file is r<R>.json with R a plain decimal (format(R, "g")).
RATE_TEXT = re.compile(r"^[0-9]+(?:\.[0-9]+)?$")
MAX_REQUEST_RATE = 100_000.0
TELEMETRY_MODES = ("auto", "nvidia-smi", "off")


def prompt_kind(row: dict) -> str | None:
    """Which of its fields a row sends: input_ids, prompt or messages (first that is well
    typed, in that order), or None."""
    if "input_ids" in row:
        return "input_ids"
    if isinstance(row.get("prompt"), str):
        return "prompt"
    if isinstance(row.get("messages"), list):
        return "messages"
    return None


def row_problem(row, scorer: str | None) -> str | None:
    """What is wrong with one row of a prompts file, or None."""
    if not isinstance(row, dict):
        return "not a JSON object"
    kind = prompt_kind(row)
    if kind is None:
        return 'needs "prompt" (a string), "messages" (a list) or "input_ids" (token ids)'
    if kind == "input_ids":
        ids = row["input_ids"]
        if not isinstance(ids, list) or not 0 < len(ids) <= MAX_INPUT_IDS:
            return f'"input_ids" must be a list of 1 to {MAX_INPUT_IDS} token ids'
        if not all(type(i) is int and 0 <= i <= MAX_TOKEN_ID for i in ids):
            return f'"input_ids" must hold token ids (integers from 0 to {MAX_TOKEN_ID})'
    answer = row.get("answer")
    if scorer and not (isinstance(answer, str) and 0 < len(answer) <= MAX_REFERENCE_CHARS):
        return (
            f'scored with {scorer}, it needs "answer", the reference (a string of 1 to '
            f"{MAX_REFERENCE_CHARS} characters)"
        )
    return None


def normalized(row: dict) -> dict:
    """A valid row as the level keeps it: its id, answer and kind, and what it sends; token
    ids as their compact JSON text (a workload's rows hold up to a million ids, and Python
    ints take many times the room of their digits)."""
    kind = prompt_kind(row)
    kept = {"id": row.get("id"), "kind": kind}
    if "answer" in row:
        kept["answer"] = row["answer"]
    if kind == "input_ids":
        kept["input_ids_json"] = json.dumps(row["input_ids"], separators=(",", ":"))
    else:
        kept[kind] = row[kind]
    return kept


def content_key(row: dict) -> bytes:
    """What makes two normalized rows the same prompt to the server (ids and answers aside)."""
    if row["kind"] == "input_ids":
        text = "input_ids:" + row["input_ids_json"]
    elif row["kind"] == "prompt":
        text = "prompt:" + row["prompt"]
    else:
        text = "messages:" + json.dumps(row["messages"], sort_keys=True)
    return hashlib.sha256(text.encode()).digest()


def load_prompts(path: str, limit: int, scorer: str | None = None) -> tuple[list[dict], int]:
    """The first `limit` distinct rows of the file (normalized), in file order, and the
    number of distinct rows it holds. A row whose prompt came before is skipped: sent twice,
    the second would be served from the radix cache. With a scorer each row needs "answer",
    its reference."""
    rows: list[dict] = []
    seen: set[bytes] = set()
    with open(path, encoding="utf-8") as handle:
        for number in itertools.count(1):
            line = handle.readline(MAX_PROMPT_LINE + 1)
            if not line:
                break
            if len(line) > MAX_PROMPT_LINE:
                raise ValueError(f"{path} line {number}: longer than {MAX_PROMPT_LINE} characters")
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError) as error:
                raise ValueError(f"{path} line {number}: not JSON ({error})") from None
            problem = row_problem(row, scorer)
            if problem:
                raise ValueError(f"{path} line {number}: {problem}")
            row = normalized(row)
            key = content_key(row)
            if key in seen:
                continue
            seen.add(key)
            if len(rows) < limit:
                rows.append(row)
            if len(seen) >= MAX_PROMPT_ROWS:
                break
    if not rows:
        raise ValueError(f"{path} holds no prompts")
    return rows, len(seen)


def render_rows(rows: list[dict], server_info: dict) -> list[str | None]:
    """Prompt text per row (None for a row of token ids); chat rows through the chat template
    of the server's model."""
    if all(row["kind"] != "messages" for row in rows):
        return [row.get("prompt") for row in rows]
    folder = next(
        (
            value
            for value in (server_info.get("tokenizer_path"), server_info.get("model_path"))
            if isinstance(value, str) and value and "\0" not in value
        ),
        "",
    )
    files = template_files(folder)
    template, _source = chat_template_of(files)
    if template is None:
        raise ValueError(
            f"the prompts hold chat messages, but no chat template was found in {folder!r} "
            "(the model folder /server_info names); render them first (the benchmark role does)"
        )
    tokens = special_tokens(json.loads(files.get("tokenizer_config.json") or "{}"))
    try:
        return [
            render_chat(template, row["messages"], tokens, {})
            if row["kind"] == "messages"
            else row.get("prompt")
            for row in rows
        ]
    except ImportError:
        raise ValueError(
            "the prompts hold chat messages and rendering them needs jinja2, which this "
            "host's Python lacks; render them first (the benchmark role does)"
        ) from None


def scorer_of(params: dict) -> str | None:
    """The module's `scoring`; unset, the one benchmark_prompts recorded beside the prompts
    (<name>.meta.json), read as untrusted: only a known scorer's name counts."""
    given = params.get("scoring")
    if given is None:
        meta = read_json(os.path.splitext(params["prompts"])[0] + ".meta.json")
        given = meta.get("scoring") if isinstance(meta, dict) else None
    return given if given in SCORERS else None


def workload_of(meta, where: str) -> dict | None:
    """The `workload` benchmark_prompts recorded beside a workload's prompts, checked field by
    field (the file is outside input) and reduced to the fields the level file carries; None
    for a prompt set. ValueError names what is wrong."""
    if not isinstance(meta, dict) or "workload" not in meta:
        return None
    given = meta["workload"]
    bad = f"{where}: workload"
    if not isinstance(given, dict):
        raise ValueError(f"{bad} is not an object")
    name = given.get("name")
    match = WORKLOAD_NAME.match(name) if isinstance(name, str) else None
    if match is None:
        raise ValueError(f"{bad}.name {text_or_none(name)!r} is not isl<N>-osl<M>")
    isl, osl = given.get("isl"), given.get("osl")
    if not (type(isl) is int and 0 < isl <= MAX_WORKLOAD_ISL):
        raise ValueError(f"{bad}.isl must be an integer from 1 to {MAX_WORKLOAD_ISL}")
    if not (type(osl) is int and 0 < osl <= MAX_WORKLOAD_OSL):
        raise ValueError(f"{bad}.osl must be an integer from 1 to {MAX_WORKLOAD_OSL}")
    if (int(match.group(1)), int(match.group(2))) != (isl, osl):
        raise ValueError(f"{bad}: name {name} but isl {isl} and osl {osl}")
    tokenizer = given.get("tokenizer")
    if not isinstance(tokenizer, dict):
        raise ValueError(f"{bad}.tokenizer is not an object")
    file, sha, revision = (tokenizer.get(k) for k in ("file", "sha256", "revision"))
    if not (isinstance(file, str) and 0 < len(file) <= 255 and "/" not in file):
        raise ValueError(f"{bad}.tokenizer.file must be a file name")
    if not (isinstance(sha, str) and HEX64.match(sha)):
        raise ValueError(f"{bad}.tokenizer.sha256 must be 64 hex digits")
    if not (revision is None or (isinstance(revision, str) and HEX40.match(revision))):
        raise ValueError(f"{bad}.tokenizer.revision must be a 40-hex commit or null")
    seed = given.get("seed")
    if not (type(seed) is int and 0 <= seed < 2**63):
        raise ValueError(f"{bad}.seed must be an integer of 0 or more")
    return {
        "name": name,
        "isl": isl,
        "osl": osl,
        "ignore_eos": True,
        "tokenizer": {"file": file, "sha256": sha, "revision": revision},
        "seed": seed,
    }


def rate_text(rate: float) -> str:
    """R of r<R>.json: format(R, "g"), which must be a plain decimal that reads back as R."""
    text = format(float(rate), "g")
    if not RATE_TEXT.match(text) or float(text) != float(rate):
        raise ValueError(
            f"request rate {rate!r} has no plain decimal name ({text}); give it with at most "
            "6 significant digits, between 0.0001 and 100000"
        )
    return text


def rate_requests(rate: float, duration_s: float) -> int:
    """Requests a rate level wants: ceil(rate x duration), rounded first so that 0.1 x 30 is
    3, not 4 (the benchmark role computes the prompts it keeps the same way)."""
    return math.ceil(round(rate * duration_s, 6))


def level_plan(params: dict) -> list[dict]:
    """Every level in the order run: closed loop, then request rate. Each with its file stem,
    the requests it wants (at least num_prompts) and its cap on requests in flight (0: none)."""
    plan = [
        {
            "stem": f"c{concurrency}",
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
                "stem": f"r{rate_text(rate)}",
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
    return problems


def now_iso() -> str:
    # timezone.utc, not datetime.UTC: hosts may run Python 3.10.
    return datetime.datetime.now(datetime.timezone.utc).isoformat(  # noqa: UP017
        timespec="milliseconds"
    )


def weights_provenance(launch: dict | None) -> list[dict]:
    """The weights manifest (kimi-manifest.json) of the model and drafter the server runs."""
    argv = launch.get("argv") if isinstance(launch, dict) else None
    argv = [item for item in argv if isinstance(item, str)] if isinstance(argv, list) else []
    found = []
    for flag, value in itertools.pairwise(argv):
        if flag not in ("--model-path", "--speculative-draft-model-path"):
            continue
        path = os.path.join(value, "kimi-manifest.json")
        manifest = read_json(path)
        entry = {"role": "target" if flag == "--model-path" else "drafter", "path": value}
        if isinstance(manifest, dict):
            entry.update(
                manifest=path,
                manifest_sha256=file_sha256(path),
                repo_id=text_or_none(manifest.get("repo_id")),
                revision=text_or_none(manifest.get("revision")),
                verify_mode=text_or_none(manifest.get("verify_mode")),
                verified_at=text_or_none(manifest.get("verified_at")),
                files=len(files) if isinstance(files := manifest.get("files"), (dict, list)) else 0,
            )
        else:
            entry["manifest"] = None
        found.append(entry)
    return found


def host_provenance(output_dir: str) -> dict:
    """What the caller recorded (provenance.json beside the results) and the records the
    runtime and server stages left on the host, read now: the launch is the running one."""
    given = read_json(os.path.join(output_dir, "provenance.json"))
    if given is None:  # one file for the prompt sets of a config, in the folder above theirs
        given = read_json(os.path.join(os.path.dirname(output_dir.rstrip("/")), "provenance.json"))
    given = given if isinstance(given, dict) else {}
    paths = {**DEFAULT_RECORDS, **(given.pop("records", None) or {})}
    found = dict(given)
    for name, path in paths.items():
        found[name] = read_json(path)
    found["weights"] = weights_provenance(found.get("launch"))
    return found


def run_benchmark(params: dict, fail) -> dict:
    """Every level of `params` (the module's arguments); `fail(msg, **extra)` does not return.

    Nothing it writes or says holds the API key or the HF token (params hf_token, never
    sent): error strings are masked where they are made, and each level document as a whole
    before it is written."""
    target = Target(params["base_url"], params["api_key"], [params.get("hf_token") or ""])
    raw_fail = fail

    def fail(msg, **extra):
        raw_fail(target.mask(msg), **extra)

    plan = level_plan(params)
    if params["telemetry"] == "nvidia-smi" and shutil.which("nvidia-smi") is None:
        fail(
            "telemetry nvidia-smi was asked for, but nvidia-smi is not on this host's PATH. "
            "Install the NVIDIA driver's utilities, or set telemetry to auto (sample when "
            "nvidia-smi is there) or off."
        )
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
    scorer = scorer_of(params)
    meta_path = os.path.splitext(params["prompts"])[0] + ".meta.json"
    meta = read_json(meta_path)
    # A long set's target and estimates (long_prompts), compared with SGLang's count per level.
    length = target_of(meta)
    workload = workload_of(meta, meta_path)
    rows, unique = load_prompts(params["prompts"], max(level["wanted"] for level in plan), scorer)
    texts = render_rows(rows, server_info)
    # A synthetic workload decodes exactly its output length: EOS does not end it early.
    max_new_tokens = workload["osl"] if workload else params["max_new_tokens"]
    sampling = {"max_new_tokens": max_new_tokens, "temperature": params["temperature"]}
    if workload:
        sampling["ignore_eos"] = True
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
    del texts
    max_events = max_new_tokens + 16
    prompts_base = {
        "path": params["prompts"],
        "name": os.path.splitext(os.path.basename(params["prompts"]))[0],
        "sha256": file_sha256(params["prompts"]),
    }
    provenance = {
        **host_provenance(params["output_dir"]),
        "server_info": mask_secrets(server_info, target.secrets),
        "sglang_version": text_or_none(server_info.get("version")),
    }
    settings = {
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
    os.makedirs(params["output_dir"], mode=0o755, exist_ok=True)

    loop = asyncio.new_event_loop()
    files, summaries, saturated = [], {}, []
    try:
        if params["warmup_requests"]:
            count = params["warmup_requests"]
            warm = loop.run_until_complete(
                run_level(
                    target,
                    [payloads[i % len(payloads)] for i in range(count)],
                    count,
                    params["request_timeout"],
                    max_events,
                )
            )
            errors = [t.error for t in warm["trackers"] if t.error]
            if len(errors) == count:
                fail(f"Every warmup request to {target.shown_url} failed: {errors[0]}")
        for level_spec in plan:
            # Never a prompt twice: a set smaller than the level wants is sent whole, once.
            count = min(level_spec["wanted"], len(payloads))
            prompts_info = {
                **prompts_base,
                "requests_per_level": count,
                "distinct_prompts": len(set(shas[:count])),
            }
            for repeat in range(1, params["repeats"] + 1):
                document, level = run_one_level(
                    loop,
                    target,
                    params,
                    level_spec,
                    repeat,
                    payloads[:count],
                    max_events,
                )
                records, itl = [], []
                for tracker in level["trackers"]:
                    record, gaps = record_of(tracker, rows[tracker.index], shas[tracker.index])
                    if scorer:
                        record["score"] = score_request(
                            scorer, record, rows[tracker.index]["answer"]
                        )
                    records.append(record)
                    itl.extend(gaps)
                duration = level["ended"] - level["started"]
                summary = summarize_level(records, duration, itl)
                if scorer:
                    summary["accuracy"] = accuracy_summary(scorer, records)
                if length is not None:
                    summary["prompt_length"] = level_summary(length, records)
                if level["gpu"] is not None:
                    summary["gpu"] = level["gpu"]
                client = client_report(level, sum(len(t.events) for t in level["trackers"]))
                if level["gpu"] is None and params["telemetry"] != "off":
                    # Visible where the level's other measurement caveats are.
                    client["warnings"].append(f"no GPU telemetry: {level['gpu_reason']}")
                document.update(
                    fill={
                        "wanted": level_spec["wanted"],
                        "unique_prompts": unique,
                        "sent": level["sent"],
                        "under_filled": unique < level_spec["wanted"],
                        "stopped_by_time_budget": level["stopped_by_time_budget"],
                        "time_budget_s": params["level_time_budget_s"],
                    },
                )
                if workload:
                    document["workload"] = workload
                delta = server_delta(level["before"], level["after"])
                lost = [t for t in level["trackers"] if t.lost]
                document.update(
                    started_at=level["started_at"],
                    ended_at=level["ended_at"],
                    settings=settings,
                    summary=summary,
                    server={
                        "cache": level["flushed"],
                        "before": level["before"],
                        "after": level["after"],
                        "delta": delta,
                        "crashed": bool(lost) or delta["restarted"],
                    },
                    client=client,
                    provenance={
                        **provenance,
                        "prompts": prompts_info,
                        "started_at": level["started_at"],
                        "ended_at": level["ended_at"],
                    },
                    requests=records,
                )
                stem = level_spec["stem"] + (f".rep{repeat}" if repeat > 1 else "")
                path = os.path.join(params["output_dir"], f"{stem}.json")
                write_json_atomic(path, mask_secrets(document, target.secrets))
                files.append(path)
                summaries[stem] = summary
                if document["client"]["saturated"]:
                    saturated.append(stem)
                where = level_spec["label"]
                if params["repeats"] > 1:
                    where += f" (repeat {repeat} of {params['repeats']})"
                if document["server"]["crashed"]:
                    reason = lost[0].error if lost else "it restarted (new start time or counters)"
                    fail(
                        f"The server crashed during {where} of "
                        f"{params['config_name']}: {len(lost)} of {len(records)} requests lost "
                        f"their connection; {reason}. See the server's log.",
                        files=files,
                        summaries=summaries,
                    )
                if summary["requests_ok"] == 0:
                    first = next((r["error"] for r in records if r["error"]), "unknown")
                    fail(
                        f"Every request at {where} failed: {first}",
                        files=files,
                        summaries=summaries,
                    )
    finally:
        loop.close()
    return {
        "files": files,
        "summaries": summaries,
        "saturated": saturated,
        "prompts": {**prompts_base, "unique_prompts": unique},
    }


def run_one_level(loop, target, params, level_spec, repeat, payloads, max_events):
    """One level's requests, between a cache flush and the server's state before and after,
    with the GPUs sampled from just before the first request to just after the last. Returns
    the level document's head (its fields in the file's order) and run_level's result with
    the server calls' and the sampler's findings added."""
    document = {
        "schema_version": SCHEMA_VERSION,
        "kind": "sglang_benchmark.level",
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
        flushed=flushed,
        before=before,
        after=after,
        started_at=started_at,
        ended_at=ended_at,
        gpu=gpu,
        gpu_reason=sampler.reason,
    )
    return document, level
