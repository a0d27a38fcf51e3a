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
    tokens (module_utils/benchmark/workloads.py). They need no chat template, jinja2 or download.
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
        (module_utils/benchmark/long_prompts.py), with C(length) in the meta. Other keys are
        ignored.
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

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.benchmark.prompt_sets import PromptError, prepare_all  # noqa: E402
from ansible.module_utils.benchmark.workloads import WorkloadError  # noqa: E402


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
        prepare_all(p, results)
    except (PromptError, WorkloadError, OSError) as error:
        module.fail_json(msg=f"Preparing the prompts failed: {error}", sets=results)
    module.exit_json(changed=any(r["changed"] for r in results.values()), sets=results)


if __name__ == "__main__":
    main()
