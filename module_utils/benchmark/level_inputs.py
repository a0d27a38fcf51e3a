"""What a benchmark run reads before its first level: the prompts file (each row checked,
normalized, a prompt sent twice dropped; chat rows rendered through the server's model's
template), the scorer and the workload benchmark_prompts recorded beside it, and the
provenance records the runtime and server stages left on the host.

Every file here is outside input: read bounded and checked field by field. Standard library
only (jinja2 only where chat rows are rendered).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re

from ansible.module_utils.benchmark.chat import (
    chat_template_of,
    render_chat,
    special_tokens,
    template_files,
)
from ansible.module_utils.benchmark.scoring import MAX_REFERENCE_CHARS, SCORERS
from ansible.module_utils.host.helpers import file_sha256, read_json

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


# The records of the runtime and server stages, unless provenance.json names others.
DEFAULT_RECORDS = {
    "runtime": "/opt/kimi/runtime/runtime.json",
    "launch": "/var/lib/kimi/server/launch.json",
}


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
