#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module benchmark_prompts: prompt sets fetched at pinned revisions, through the chat
template of the model under test."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: benchmark_prompts
short_description: Fetch benchmark prompt sets at pinned revisions and render them for the model
description:
  - For each prompt set, fetches one file of a Hugging Face dataset repository at a pinned
    revision (a branch or tag is resolved to its commit, which is recorded), verifies it against
    the hub's hash, keeps it in O(cache_dir) (a later run with the same commit reads the cache and
    contacts nobody), turns each row into a chat message with the set's C(template), renders it
    through the chat template of the model in O(model_dir), and writes C(<name>.jsonl) (one
    object with C(id) and C(prompt) a line) and C(<name>.meta.json) (where it came from) into
    O(output_dir).
  - O(files) are JSONL files of your own on the host, one object a line with C(prompt) (text
    used as it is) or C(messages) (a chat, rendered).
  - A set with a C(scoring) (C(gsm8k) or C(math)) is scored, and each line also holds C(answer),
    the scorer's reference (from the set's C(answer) template, GSM8K's text after C(####)),
    its prompts are rendered with O(scored_chat_template_kwargs) over
    O(chat_template_kwargs) (a switch that turns thinking off, so the answer comes within the
    token budget), and C(<name>.meta.json) names the scorer (C(scoring), null when unscored).
  - Reads C(.jsonl), C(.json) and C(.parquet) files; parquet needs pyarrow and rendering needs
    jinja2, so run it with a Python that has both - the runtime's venv does (sglang depends on
    datasets and torch, which bring them).
  - O(workloads) are synthetic fixed-length workloads named C(isl<N>-osl<M>) (N input tokens,
    1 to 1048576; M output tokens, 1 to 131072), each O(workload_prompts) rows of exactly N
    token ids drawn from the ordinary (non-special) vocabulary of the tokenizer files in
    O(model_dir) (C(tiktoken.model) with C(tokenizer_config.json), else C(tokenizer.json)),
    seeded by the name, each row's first id its own, written as C(<name>.jsonl) (one object
    with C(id) and C(input_ids) a line) and C(<name>.meta.json), whose C(workload) (name,
    isl, osl, C(ignore_eos) true, the tokenizer file's name, sha256 and the model revision of
    C(kimi-manifest.json), the seed) tells the benchmark to send ids and ask for exactly M
    tokens (module_utils/workloads.py). They need no chat template, jinja2 or download.
  - Reports changed only when a prompts file's content changed.
version_added: "0.1.0"
options:
  sets:
    description:
      - Hub prompt sets, name to C(repo), C(revision), C(file) and C(template) - the user
        message, where C({field}) or C({field[0]}) stand for the row's values (other braces
        are kept as they are); a scored set adds C(scoring) (C(gsm8k) or C(math)) and
        C(answer), a template like C(template) giving the row's reference answer (default
        C({answer})). A long set adds C(long) (C(tokens), C(chars_per_token), C(question)) and
        C(max_new_tokens), and its prompts are the rows one after another from a first row
        of their own, about C(tokens) long, ending in C(question)
        (module_utils/long_prompts.py), with C(length) in the meta. Other keys are ignored.
    type: dict
    default: {}
  files:
    description: Your own prompt sets, name to a JSONL file on the host.
    type: dict
    default: {}
  file_scoring:
    description: Which of O(files) are scored, name to the scorer (C(gsm8k) or C(math)); each
      of their lines needs C(answer), the reference (a string or a number).
    type: dict
    default: {}
  output_dir:
    description: Folder for the rendered prompts, created when missing.
    type: path
    required: true
  cache_dir:
    description: Folder for downloaded dataset files, by repository and commit.
    type: path
    required: true
  model_dir:
    description: Model folder whose chat template is used (chat_template.jinja,
      chat_template.json or tokenizer_config.json), and whose tokenizer files
      O(workloads) draw from.
    type: path
    required: true
  chat_template_kwargs:
    description: Extra variables for the chat template (for example a thinking switch).
    type: dict
    default: {}
  scored_chat_template_kwargs:
    description: Template variables of scored sets, over O(chat_template_kwargs) (for Kimi
      K2.6 C(thinking) false).
    type: dict
    default: {}
  workloads:
    description: Synthetic workload names, each C(isl<N>-osl<M>) (for example
      C(isl1024-osl1024)).
    type: list
    elements: str
    default: []
  workload_prompts:
    description: Prompts (rows) written per workload, 1 to 100000; the benchmark sends each
      at most once a level.
    type: int
    default: 64
  limit:
    description: Most prompts kept per set (the first rows, in the dataset's order).
    type: int
    default: 64
  hf_endpoint:
    description: The hub (or a mirror).
    type: str
    default: https://huggingface.co
  hf_token:
    description: Token for gated datasets; public ones need none.
    type: str
    default: ""
  timeout:
    description: Seconds one download (and each hub request) may take.
    type: int
    default: 600
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Render GSM8K for the model under test
  benchmark_prompts:
    sets:
      gsm8k:
        repo: openai/gsm8k
        revision: e53f048856ff4f594e959d75785d2c2d37b678ee
        file: main/test-00000-of-00001.parquet
        template: "{question}"
        answer: "{answer}"
        scoring: gsm8k
    files:
      mine: /var/lib/kimi/benchmark/prompts/src/mine.jsonl
    output_dir: /var/lib/kimi/benchmark/prompts
    cache_dir: /var/lib/kimi/benchmark/datasets
    model_dir: /opt/kimi/weights/moonshotai/Kimi-K2.6
  vars:
    ansible_python_interpreter: /opt/kimi/venv/bin/python
"""

RETURN = r"""
sets:
  description: Per set - output file and its sha256, prompt count, the source (repository,
    requested and resolved revision, file and its sha256, or the user file), the chat
    template's source, sha256 and variables, and the scorer (null when unscored). Per
    workload, under its name - C(output), C(sha256), C(prompts), C(source) (C(workload) its
    name), C(scoring) null, C(changed) and C(workload) (name, isl, osl, ignore_eos,
    tokenizer file, sha256 and revision, seed), as its C(.meta.json) holds them.
  returned: always
  type: dict
"""

import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402
import urllib.error  # noqa: E402
import urllib.parse  # noqa: E402
import urllib.request  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.benchmark import (  # noqa: E402
    chat_template_of,
    fill,
    prompt_of,
    render_chat,
    special_tokens,
    template_files,
)
from ansible.module_utils.host_helpers import atomic_write, file_sha256, read_json  # noqa: E402
from ansible.module_utils.long_prompts import LongPromptError, long_rows  # noqa: E402
from ansible.module_utils.scoring import (  # noqa: E402
    MAX_REFERENCE_CHARS,
    SCORERS,
    reference_of,
)
from ansible.module_utils.workloads import (  # noqa: E402
    WorkloadError,
    load_tokenizer,
    parse_name,
    write_workload,
)

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
    if spec.get("path"):
        path = spec["path"]
        source = {"path": path, "sha256": file_sha256(path)}
        rows = read_rows(path)
    else:
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
        rows = read_rows(cached)
    length = None
    if spec.get("long") is not None:
        try:
            rows, length = long_rows(name, spec, rows, p["limit"], p["model_dir"])
        except LongPromptError as error:
            raise PromptError(str(error)) from None
    prompts = []
    for index, row in enumerate(rows[: p["limit"]]):
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
        prompts.append(
            {"id": f"{name}-{index}", "prompt": prompt}
            | ({"answer": answer} if answer is not None else {})
        )
    if not prompts:
        raise PromptError(f"prompt set {name}: no rows")
    content = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in prompts).encode()
    output = os.path.join(p["output_dir"], f"{name}.jsonl")
    digest = hashlib.sha256(content).hexdigest()
    changed = not os.path.isfile(output) or file_sha256(output) != digest
    meta = {
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
        "output": output,
        "sha256": digest,
    }
    if changed:
        atomic_write(output, content, 0o644)
    # The scorer can change with the same prompts and answers: the meta follows it.
    if changed or read_json(f"{output[:-6]}.meta.json") != meta:
        atomic_write(f"{output[:-6]}.meta.json", json.dumps(meta, indent=1), 0o644)
    meta["changed"] = changed
    return meta


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "sets": {"type": "dict", "default": {}},
            "files": {"type": "dict", "default": {}},
            "output_dir": {"type": "path", "required": True},
            "cache_dir": {"type": "path", "required": True},
            "model_dir": {"type": "path", "required": True},
            "chat_template_kwargs": {"type": "dict", "default": {}},
            "scored_chat_template_kwargs": {"type": "dict", "default": {}},
            "file_scoring": {"type": "dict", "default": {}},
            "workloads": {"type": "list", "elements": "str", "default": []},
            "workload_prompts": {"type": "int", "default": 64},
            "limit": {"type": "int", "default": 64},
            "hf_endpoint": {"type": "str", "default": "https://huggingface.co"},
            "hf_token": {"type": "str", "default": "", "no_log": True},
            "timeout": {"type": "int", "default": 600},
        },
        supports_check_mode=False,
    )
    p = module.params
    if p["limit"] < 1:
        module.fail_json(msg=f"limit must be at least 1, got {p['limit']}")
    results = {}
    try:
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
    except (PromptError, WorkloadError, OSError) as error:
        module.fail_json(msg=f"Preparing the prompts failed: {error}", sets=results)
    module.exit_json(changed=any(r["changed"] for r in results.values()), sets=results)


if __name__ == "__main__":
    main()
