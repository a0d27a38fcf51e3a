"""The level file c<N>.json: a benchmark run of one config and prompt set, level by level.

run_benchmark() sends the prompts through the client (benchmark_client.py) at each
concurrency level and writes one level file per level, with the summary, the server's counters
before and after, the client's own load and the provenance the runtime and server stages left
on the host. README "Benchmark" describes the file's fields.
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import hashlib
import itertools
import json
import os

from ansible.module_utils.benchmark import (
    SCHEMA_VERSION,
    chat_template_of,
    render_chat,
    server_delta,
    special_tokens,
    summarize_level,
    template_files,
)
from ansible.module_utils.benchmark_client import (
    Target,
    client_report,
    flush_cache,
    load_json,
    record_of,
    run_level,
    server_state,
)
from ansible.module_utils.host_helpers import (
    file_sha256,
    mask_secrets,
    read_json,
    write_json_atomic,
)
from ansible.module_utils.long_prompts import level_summary, target_of
from ansible.module_utils.scoring import (
    MAX_REFERENCE_CHARS,
    SCORERS,
    accuracy_summary,
    score_request,
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


def load_prompts(path: str, count: int, scorer: str | None = None) -> list[dict]:
    """The first `count` rows (cycled), each {"prompt": str} or {"messages": [...]}; with a
    scorer each also holds "answer", its reference (a string of at most 1024 characters)."""
    rows: list[dict] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if len(rows) >= count:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as error:
                raise ValueError(f"{path} line {number}: not JSON ({error})") from None
            ok_prompt = isinstance(row, dict) and isinstance(row.get("prompt"), str)
            ok_chat = isinstance(row, dict) and isinstance(row.get("messages"), list)
            if not (ok_prompt or ok_chat):
                raise ValueError(
                    f'{path} line {number}: needs "prompt" (a string) or "messages" (a list)'
                )
            answer = row.get("answer")
            if scorer and not (isinstance(answer, str) and 0 < len(answer) <= MAX_REFERENCE_CHARS):
                raise ValueError(
                    f'{path} line {number}: scored with {scorer}, it needs "answer", the '
                    f"reference (a string of 1 to {MAX_REFERENCE_CHARS} characters)"
                )
            rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no prompts")
    return [rows[i % len(rows)] for i in range(count)]


def render_rows(rows: list[dict], server_info: dict) -> list[str]:
    """Prompt text per row; chat rows through the chat template of the server's model."""
    if all("prompt" in row for row in rows):
        return [row["prompt"] for row in rows]
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
            row["prompt"] if "prompt" in row else render_chat(template, row["messages"], tokens, {})
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
    # A long set's target and estimates (long_prompts), compared with SGLang's count per level.
    length = target_of(read_json(os.path.splitext(params["prompts"])[0] + ".meta.json"))
    rows = load_prompts(params["prompts"], params["num_prompts"], scorer)
    texts = render_rows(rows, server_info)
    sampling = {"max_new_tokens": params["max_new_tokens"], "temperature": params["temperature"]}
    payloads = [
        target.request({"text": text, "sampling_params": sampling, "stream": True})
        for text in texts
    ]
    shas = [hashlib.sha256(text.encode()).hexdigest() for text in texts]
    max_events = params["max_new_tokens"] + 16
    prompts_info = {
        "path": params["prompts"],
        "name": os.path.splitext(os.path.basename(params["prompts"]))[0],
        "sha256": file_sha256(params["prompts"]),
        "requests_per_level": len(texts),
        "distinct_prompts": len(set(shas)),
    }
    provenance = {
        **host_provenance(params["output_dir"]),
        "server_info": mask_secrets(server_info, target.secrets),
        "sglang_version": text_or_none(server_info.get("version")),
        "prompts": prompts_info,
    }
    settings = {
        k: params[k] for k in ("num_prompts", "max_new_tokens", "temperature", "warmup_requests")
    }
    settings.update(request_timeout_s=params["request_timeout"], base_url=target.shown_url)
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
        for concurrency in params["concurrency"]:
            flushed = flush_cache(target)
            before = server_state(target)
            started_at = now_iso()
            gc.collect()
            gc.disable()  # a collection mid-level would show up as client latency
            try:
                level = loop.run_until_complete(
                    run_level(target, payloads, concurrency, params["request_timeout"], max_events)
                )
            finally:
                gc.enable()
            ended_at = now_iso()
            after = server_state(target)
            records, itl = [], []
            for tracker in level["trackers"]:
                record, gaps = record_of(tracker, rows[tracker.index], shas[tracker.index])
                if scorer:
                    record["score"] = score_request(scorer, record, rows[tracker.index]["answer"])
                records.append(record)
                itl.extend(gaps)
            duration = level["ended"] - level["started"]
            summary = summarize_level(records, duration, itl)
            if scorer:
                summary["accuracy"] = accuracy_summary(scorer, records)
            if length is not None:
                summary["prompt_length"] = level_summary(length, records)
            delta = server_delta(before, after)
            events = sum(len(t.events) for t in level["trackers"])
            lost = [t for t in level["trackers"] if t.lost]
            document = {
                "schema_version": SCHEMA_VERSION,
                "kind": "sglang_benchmark.level",
                "run_label": params["run_label"],
                "config": params["config_name"],
                "prompt_set": prompts_info["name"],
                "concurrency": concurrency,
                "started_at": started_at,
                "ended_at": ended_at,
                "settings": settings,
                "summary": summary,
                "server": {
                    "cache": flushed,
                    "before": before,
                    "after": after,
                    "delta": delta,
                    "crashed": bool(lost) or delta["restarted"],
                },
                "client": client_report(level, events),
                "provenance": {**provenance, "started_at": started_at, "ended_at": ended_at},
                "requests": records,
            }
            path = os.path.join(params["output_dir"], f"c{concurrency}.json")
            write_json_atomic(path, mask_secrets(document, target.secrets))
            files.append(path)
            summaries[str(concurrency)] = summary
            if document["client"]["saturated"]:
                saturated.append(concurrency)
            if document["server"]["crashed"]:
                reason = lost[0].error if lost else "it restarted (new start time or counters)"
                fail(
                    f"The server crashed during concurrency {concurrency} of "
                    f"{params['config_name']}: {len(lost)} of {len(records)} requests lost "
                    f"their connection; {reason}. See the server's log.",
                    files=files,
                    summaries=summaries,
                )
            if summary["requests_ok"] == 0:
                first = next((r["error"] for r in records if r["error"]), "unknown")
                fail(
                    f"Every request at concurrency {concurrency} failed: {first}",
                    files=files,
                    summaries=summaries,
                )
    finally:
        loop.close()
    return {"files": files, "summaries": summaries, "saturated": saturated, "prompts": prompts_info}
