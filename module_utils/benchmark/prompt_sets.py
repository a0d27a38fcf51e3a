# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""The benchmark's prompt sets, on the host: hub datasets fetched at a commit (under a
deadline, checked against the hub's hashes), user files, rendered through the model's chat
template, with their scorers' reference answers; and the synthetic workloads. The logic of
the benchmark_prompts module."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request

from ansible.module_utils.benchmark.chat import (
    chat_template_of,
    fill,
    prompt_of,
    render_chat,
    special_tokens,
    template_files,
)
from ansible.module_utils.benchmark.long_prompts import LongPromptError, long_rows
from ansible.module_utils.benchmark.scoring import (
    MAX_REFERENCE_CHARS,
    SCORERS,
    reference_of,
)
from ansible.module_utils.benchmark.workloads import (
    load_tokenizer,
    parse_name,
    write_workload,
)
from ansible.module_utils.host.helpers import atomic_write, file_sha256, read_json

SHA = re.compile(r"^[0-9a-f]{40}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class PromptError(Exception):
    pass


class Redirects(urllib.request.HTTPRedirectHandler):
    """Keeps the hub's hash headers of a redirect (the CDN's answer has its own ETag) and
    sends the token to the hub only, never to the host it redirects to."""

    def __init__(self):
        super().__init__()
        self.linked_etag = ""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        self.linked_etag = self.linked_etag or headers.get("X-Linked-Etag") or ""
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != req.host:
            new.remove_header("Authorization")
        return new


# The hub's "busy" answers (rate limit, overload, gateway): retried with backoff, or after
# the Retry-After it asks for, while the deadline allows.
RETRY_STATUSES = (429, 500, 502, 503, 504)
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.5, 30.0


def fetch(url: str, token: str, timeout: int, sleep=time.sleep) -> urllib.request.addinfourl:
    request = urllib.request.Request(url)  # noqa: S310 - the hub's http(s) URL
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    deadline = time.monotonic() + timeout
    backoff, tries = FIRST_BACKOFF_S, 0
    while True:
        redirects = Redirects()
        left = deadline - time.monotonic()
        if left <= 0:
            raise PromptError(f"{url}: no answer within {timeout} s")
        tries += 1
        try:
            answer = urllib.request.build_opener(redirects).open(request, timeout=left)
            answer.linked_etag = redirects.linked_etag
            return answer
        except urllib.error.HTTPError as error:
            code = error.headers.get("X-Error-Code") or ""
            asked = (error.headers.get("Retry-After") or "").strip()
            pause = float(asked) if asked.isdigit() else backoff
            if error.code not in RETRY_STATUSES or pause >= deadline - time.monotonic():
                after = f", Retry-After {asked} s" if asked.isdigit() else ""
                busy = (
                    f" ({tries} answer(s), still busy at the {timeout} s deadline{after})"
                    if error.code in RETRY_STATUSES
                    else ""
                )
                said = " ".join(part for part in (f"HTTP {error.code}", code) if part)
                raise PromptError(f"{url}: {said}{busy}") from None
            sleep(pause)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
        except (urllib.error.URLError, OSError) as error:
            raise PromptError(f"{url}: {getattr(error, 'reason', error)}") from None


def resolve(endpoint: str, repo: str, revision: str, token: str, timeout: int) -> str:
    quoted = urllib.parse.quote(revision, safe="")
    with fetch(f"{endpoint}/api/datasets/{repo}/revision/{quoted}", token, timeout) as answer:
        body = answer.read(1 << 22)
    try:
        info = json.loads(body)
    except (ValueError, RecursionError):
        info = None
    sha = info.get("sha") if isinstance(info, dict) else None
    if not isinstance(sha, str) or not SHA.match(sha):
        shown = repr(sha if isinstance(info, dict) else body[:80])[:100]
        raise PromptError(f"{repo}@{revision}: the hub answered no commit ({shown})")
    return sha


def git_blob_id(path: str) -> str:
    digest = hashlib.sha1(usedforsecurity=False)
    digest.update(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(url: str, dest: str, token: str, timeout: int) -> None:
    """To a temporary name, checked against the hub's ETag (sha256 of an LFS file, git blob
    id of a small one), then renamed: a cached file is always a whole, verified one."""
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    partial = f"{dest}.partial"
    deadline = time.monotonic() + timeout
    with fetch(url, token, timeout) as answer, open(partial, "wb") as handle:
        etag = (
            answer.linked_etag
            or answer.headers.get("X-Linked-Etag")
            or answer.headers.get("ETag")
            or ""
        ).strip('W/"')
        for block in iter(lambda: answer.read(1 << 20), b""):
            handle.write(block)
            if time.monotonic() > deadline:
                raise PromptError(f"{url}: not downloaded within {timeout} s")
    if HEX64.match(etag):
        found = file_sha256(partial)
    elif SHA.match(etag):
        found = git_blob_id(partial)
    else:
        found = etag
    if found != etag:
        os.remove(partial)
        raise PromptError(f"{url}: content hash {found} is not the hub's {etag}")
    os.replace(partial, dest)


def read_rows(path: str) -> list[dict]:
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet
        except ImportError:
            raise PromptError(
                f"{path} is parquet and this Python has no pyarrow; run the module with the "
                "runtime's Python (benchmark_prompts_python), whose sglang brings it"
            ) from None
        return pyarrow.parquet.read_table(path).to_pylist()
    with open(path, encoding="utf-8") as handle:
        if path.endswith(".json"):
            data = json.load(handle)
            return data if isinstance(data, list) else data.get("data") or data.get("rows") or []
        rows = []
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as error:
                    raise PromptError(f"{path} line {number}: not JSON ({error})") from None
        return rows


def load_template(model_dir: str) -> tuple[str, str, dict]:
    files = template_files(model_dir)
    try:
        template, source = chat_template_of(files)
        tokens = special_tokens(json.loads(files.get("tokenizer_config.json") or "{}"))
    except ValueError as error:
        raise PromptError(f"{model_dir}: unreadable tokenizer files ({error})") from None
    if template is None:
        raise PromptError(
            f"no chat template in {model_dir} (looked for chat_template.jinja, "
            "chat_template.json and tokenizer_config.json); the weights stage puts the model "
            "there, or set benchmark_chat_template_dir"
        )
    return template, source, tokens


def reference(row: dict, spec: dict, scorer: str) -> str:
    """A scored row's reference answer: a user file's `answer`, a hub row's through the set's
    `answer` template."""
    if spec.get("path"):
        answer = row.get("answer")
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            raise ValueError(f"scored with {scorer}, it needs an answer (a string or a number)")
        answer = str(answer)
    else:
        answer = fill(spec.get("answer") or "{answer}", row)
    found = reference_of(scorer, answer)
    if not found or len(found) > MAX_REFERENCE_CHARS:
        raise ValueError(
            f"its {scorer} reference is {'empty' if not found else f'{len(found)} characters'}"
            f"; a reference of 1 to {MAX_REFERENCE_CHARS} characters is needed"
        )
    return found


def prepare(spec: dict, p: dict, template: tuple[str, str, dict]) -> dict:
    """One prompt set (a hub dataset or a user file) as <name>.jsonl and <name>.meta.json in
    the output folder, each written only when it changed; its meta, with `changed`."""
    name = spec.get("name") or ""
    if not NAME.match(name):
        raise PromptError(f"prompt set name {name!r}: letters, digits, _ . - only")
    text, source_name, tokens = template
    scorer = spec.get("scoring") or None
    if scorer is not None and scorer not in SCORERS:
        raise PromptError(f"prompt set {name}: scoring {scorer!r} is none of {', '.join(SCORERS)}")
    kwargs = p["chat_template_kwargs"]
    if scorer is not None:
        kwargs = {**kwargs, **p["scored_chat_template_kwargs"]}
    source, rows = source_rows(name, spec, p)
    length = None
    if spec.get("long") is not None:
        try:
            rows, length = long_rows(name, spec, rows, p["limit"], p["model_dir"])
        except LongPromptError as error:
            raise PromptError(str(error)) from None
    chat = (text, tokens, kwargs)
    prompts = [
        prompt_row(name, index, row, spec, scorer, length, chat)
        for index, row in enumerate(rows[: p["limit"]])
    ]
    if not prompts:
        raise PromptError(f"prompt set {name}: no rows")
    described = {
        "name": name,
        "source": source,
        "rows": len(rows),
        "prompts": len(prompts),
        "template": spec.get("template"),
        "chat_template": {
            "source": source_name,
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
            "kwargs": kwargs,
        },
        "scoring": scorer,
        **({"length": length} if length is not None else {}),
    }
    return write_set(p["output_dir"], name, prompts, described)


def source_rows(name: str, spec: dict, p: dict) -> tuple[dict, list]:
    """Where the set's rows come from (a user file, or a hub dataset's file at a commit,
    fetched into the cache unless there) and the rows."""
    if spec.get("path"):
        path = spec["path"]
        return {"path": path, "sha256": file_sha256(path)}, read_rows(path)
    missing = [k for k in ("repo", "revision", "file", "template") if not spec.get(k)]
    if missing:
        raise PromptError(f"prompt set {name}: missing {', '.join(missing)}")
    repo, revision, file_name = spec["repo"], str(spec["revision"]), spec["file"]
    endpoint = p["hf_endpoint"].rstrip("/")
    sha = revision if SHA.match(revision) else None
    cached = os.path.join(p["cache_dir"], repo, sha or "-", file_name)
    if sha is None or not os.path.isfile(cached):
        sha = sha or resolve(endpoint, repo, revision, p["hf_token"], p["timeout"])
        cached = os.path.join(p["cache_dir"], repo, sha, file_name)
        if not os.path.isfile(cached):
            url = f"{endpoint}/datasets/{repo}/resolve/{sha}/{urllib.parse.quote(file_name)}"
            download(url, cached, p["hf_token"], p["timeout"])
    source = {
        "repo": repo,
        "revision": revision,
        "resolved": sha,
        "file": file_name,
        "sha256": file_sha256(cached),
    }
    return source, read_rows(cached)


def prompt_row(name, index, row, spec, scorer, length, chat) -> dict:
    """Row `index` of the set as the prompts file holds it: its id, its prompt rendered
    through the chat template (a user file's ready prompt as it is), its reference answer
    when scored. `chat`: the template, its special tokens and its kwargs."""
    text, tokens, kwargs = chat
    if not isinstance(row, dict):
        raise PromptError(f"prompt set {name} row {index}: not an object")
    try:
        if spec.get("path") and isinstance(row.get("prompt"), str):
            prompt = row["prompt"]
        else:
            messages = row.get("messages") if spec.get("path") or length else None
            if messages is None:
                messages = prompt_of(row, spec.get("template") or "{prompt}")
            prompt = render_chat(text, messages, tokens, kwargs)
        answer = reference(row, spec, scorer) if scorer is not None else None
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as error:
        raise PromptError(
            f"prompt set {name} row {index}: cannot build the prompt"
            f"{' or its answer' if scorer else ''} ({error!r}); check its template"
            f"{' and answer' if scorer else ''} against the dataset's fields"
        ) from None
    except ImportError:
        raise PromptError(
            "rendering through the chat template needs jinja2, which this Python lacks; "
            "run the module with the runtime's Python (benchmark_prompts_python)"
        ) from None
    return {"id": f"{name}-{index}", "prompt": prompt} | (
        {"answer": answer} if answer is not None else {}
    )


def write_set(output_dir: str, name: str, prompts: list[dict], described: dict) -> dict:
    """<name>.jsonl with the prompts, and <name>.meta.json with what `described` says of the
    set, its output and that output's sha256; each written only when it changed."""
    content = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in prompts).encode()
    output = os.path.join(output_dir, f"{name}.jsonl")
    digest = hashlib.sha256(content).hexdigest()
    changed = not os.path.isfile(output) or file_sha256(output) != digest
    meta = {**described, "output": output, "sha256": digest}
    if changed:
        atomic_write(output, content, 0o644)
    # The scorer can change with the same prompts and answers: the meta follows it.
    if changed or read_json(f"{output[:-6]}.meta.json") != meta:
        atomic_write(f"{output[:-6]}.meta.json", json.dumps(meta, indent=1), 0o644)
    meta["changed"] = changed
    return meta


def prepare_all(p: dict, results: dict) -> None:
    """Every prompt set, prompt file and workload the module's parameters `p` name, into
    `results` by name (filled as each is done, so a failure still shows what was written).
    Raises PromptError, WorkloadError or OSError."""
    os.makedirs(p["output_dir"], mode=0o755, exist_ok=True)
    specs = [{**spec, "name": name} for name, spec in p["sets"].items()]
    specs += [
        {"name": name, "path": path, "scoring": p["file_scoring"].get(name)}
        for name, path in p["files"].items()
    ]
    unknown = sorted(set(p["file_scoring"]) - set(p["files"]))
    if unknown:
        raise PromptError(f"file_scoring names no prompt file: {', '.join(unknown)}")
    if not specs and not p["workloads"]:
        raise PromptError("no prompt sets, no prompt files and no workloads given")
    both = sorted({spec["name"] for spec in specs} & set(p["workloads"]))
    if both:
        raise PromptError(f"a prompt set and a workload share a name: {', '.join(both)}")
    for name in p["workloads"]:
        parse_name(name)
    template = load_template(p["model_dir"]) if specs else None
    for spec in specs:
        results[spec["name"]] = prepare(spec, p, template)
    tokenizer = load_tokenizer(p["model_dir"]) if p["workloads"] else None
    for name in dict.fromkeys(p["workloads"]):
        results[name] = write_workload(name, p["workload_prompts"], tokenizer, p["output_dir"])
