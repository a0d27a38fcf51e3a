#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module benchmark_lossless: speculative outputs against AR, token for token."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: benchmark_lossless
short_description: Flag serving configs whose greedy outputs differ from plain decoding
description:
  - Speculative decoding must not change what the model outputs. At temperature 0 each
    speculative config's outputs are compared token for token with the reference config's
    (C(ar)) on the same prompts, request by request, at the same concurrency level and
    prompt set (batch shapes change floating-point results, so levels are not mixed).
  - Reads the level files C(<config>/<prompt set>/c<N>.json) under O(results_dir) (one host's
    results) and writes the report to O(output).
  - Token ids are compared when the server returned them, otherwise whitespace-separated
    words of the text. Tokens from the first divergence on count as mismatched.
  - A config whose C(mismatch_rate) (mismatched over compared tokens) is above O(threshold) is
    flagged C(broken_verification). Levels at a temperature above 0, and levels without a
    reference level, are listed as not checked.
version_added: "0.1.0"
options:
  results_dir:
    description: One host's results folder, holding a folder per serving config.
    type: path
    required: true
  reference:
    description: The config whose outputs are the truth.
    type: str
    default: ar
  threshold:
    description: Highest mismatch rate (0 to 1) not flagged.
    type: float
    default: 0.1
  output:
    description: File the report is written to.
    type: path
    required: true
notes:
  - Greedy decoding is not bit-exact across kernels - a long output can drift on a near tie
    even when verification is right; such drift is late and rare, while broken verification
    diverges early and everywhere. The threshold separates the two; the report keeps where each
    request diverged (C(first_divergence)) to tell them apart.
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Compare every speculative config with AR
  benchmark_lossless:
    results_dir: results/20260101T000000Z/gpu-node-17
    output: results/20260101T000000Z/gpu-node-17/lossless.json
  delegate_to: localhost
"""

RETURN = r"""
configs:
  description: Per config - mismatch rate, tokens and requests compared and mismatched, whether
    it is flagged, and the per-level comparisons.
  returned: always
  type: dict
flagged:
  description: Configs flagged as broken verification.
  returned: always
  type: list
  elements: str
"""

import json  # noqa: E402
import os  # noqa: E402
import stat  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.benchmark.stats import compare_outputs  # noqa: E402
from ansible.module_utils.contract.level import (  # noqa: E402
    LOSSLESS_KIND,
    MAX_LEVEL_BYTES,
    SCHEMA_VERSION,
    parse_level_file,
)
from ansible.module_utils.contract.names import (  # noqa: E402
    REFERENCE,
    ServingConfigError,
    is_reference,
    parse_config_name,
    reference_at_tp,
)


def closed_loop_concurrency(name: str) -> int | None:
    """The concurrency of a closed-loop level's first repeat (c<N>.json), else None: greedy
    outputs are compared on those alone, one file per prompt set and concurrency."""
    parsed = parse_level_file(name)
    if parsed is None:
        return None
    concurrency, rate, repeat = parsed
    return concurrency if rate is None and repeat is None else None


def levels(results_dir: str) -> dict:
    """{config: {(prompt set, concurrency): path}} of the level files present."""
    found: dict = {}
    for config in sorted(os.listdir(results_dir)):
        folder = os.path.join(results_dir, config)
        if not os.path.isdir(folder):
            continue
        for prompt_set in sorted(os.listdir(folder)):
            sub = os.path.join(folder, prompt_set)
            if not os.path.isdir(sub):
                continue
            for name in os.listdir(sub):
                concurrency = closed_loop_concurrency(name)
                if concurrency is not None:
                    key = (prompt_set, concurrency)
                    found.setdefault(config, {})[key] = os.path.join(sub, name)
    return found


def load(path: str) -> dict:
    """One level file, read only when it is a regular file (a FIFO would hang, /dev/zero
    never end) of at most MAX_LEVEL_BYTES, with the fields the comparison reads checked."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path}: not a regular file")
        data = handle.read(MAX_LEVEL_BYTES + 1)
    if len(data) > MAX_LEVEL_BYTES:
        raise ValueError(f"{path}: larger than {MAX_LEVEL_BYTES >> 30} GiB")
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise ValueError(f"{path}: not JSON ({str(error)[:200]})") from None
    problem = level_problem(document)
    if problem:
        raise ValueError(f"{path}: {problem}")
    return document


def level_problem(document) -> str | None:
    """What keeps a level document from being compared, or None."""
    if not isinstance(document, dict):
        return f"expected an object, found {type(document).__name__}"
    settings = document.get("settings", {})
    if not isinstance(settings, dict):
        return "settings: expected an object"
    temperature = settings.get("temperature")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, type(None))):
        return "settings.temperature: expected a number"
    requests = document.get("requests", [])
    if not isinstance(requests, list):
        return "requests: expected a list"
    for number, record in enumerate(requests):
        where = f"requests[{number}]"
        if not isinstance(record, dict):
            return f"{where}: expected an object, found {type(record).__name__}"
        ids = record.get("output_ids")
        if ids is not None and not (
            isinstance(ids, list)
            and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
        ):
            return f"{where}.output_ids: expected a list of token ids or null"
        if record.get("text") is not None and not isinstance(record["text"], str):
            return f"{where}.text: expected a string or null"
        for name in ("index", "prompt_sha256"):
            value = record.get(name)
            if isinstance(value, bool) or not isinstance(value, (int, str, type(None))):
                return f"{where}.{name}: expected an integer or a string"
    return None


def _tp(config: str) -> int | None:
    try:
        return parse_config_name(config)[1]
    except ServingConfigError:
        return None


def reference_of(config: str, reference: str, found: dict) -> str:
    """The reference config a config is checked against: the reference's definition at the
    config's own TP size when the run expanded TP sizes (greedy outputs agree only at one TP
    size), else the reference itself."""
    at_tp = reference_at_tp(reference, _tp(config))
    return at_tp if at_tp in found else reference


def check(results_dir: str, reference: str, threshold: float) -> dict:
    found = levels(results_dir)
    references = {}
    configs = {}
    for config, files in found.items():
        if is_reference(config, reference):
            continue
        own_reference = reference_of(config, reference, found)
        base = found.get(own_reference, {})
        if base:
            references[config] = own_reference
        checked, skipped = [], []
        for key, path in sorted(files.items()):
            prompt_set, concurrency = key
            where = {"prompt_set": prompt_set, "concurrency": concurrency}
            if key not in base:
                skipped.append({**where, "reason": f"no {own_reference} level to compare with"})
                continue
            candidate, truth = load(path), load(base[key])
            temperatures = {
                candidate.get("settings", {}).get("temperature"),
                truth.get("settings", {}).get("temperature"),
            }
            if temperatures != {0.0} and temperatures != {0}:
                skipped.append({**where, "reason": f"temperature {sorted(temperatures)}, not 0"})
                continue
            result = compare_outputs(truth.get("requests", []), candidate.get("requests", []))
            checked.append({**where, **result})
        tokens = sum(c["tokens_compared"] for c in checked)
        mismatched = sum(c["tokens_mismatched"] for c in checked)
        requests = sum(c["requests_compared"] for c in checked)
        diverged = sum(c["requests_mismatched"] for c in checked)
        rate = mismatched / tokens if tokens else None
        configs[config] = {
            "mismatch_rate": round(rate, 6) if rate is not None else None,
            "request_mismatch_rate": round(diverged / requests, 6) if requests else None,
            "tokens_compared": tokens,
            "tokens_mismatched": mismatched,
            "requests_compared": requests,
            "requests_mismatched": diverged,
            "broken_verification": rate is not None and rate > threshold,
            "levels": checked,
            "not_checked": skipped,
        }
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": LOSSLESS_KIND,
        "reference": reference,
        "reference_found": bool(references) or reference in found,
        # Per config, the reference it was checked against when not `reference` itself
        # (ar-tp4 for dflash-tp4 in a run over TP sizes).
        "references": {c: r for c, r in references.items() if r != reference},
        "threshold": threshold,
        "configs": configs,
        "flagged": sorted(c for c, r in configs.items() if r["broken_verification"]),
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "results_dir": {"type": "path", "required": True},
            "reference": {"type": "str", "default": REFERENCE},
            "threshold": {"type": "float", "default": 0.1},
            "output": {"type": "path", "required": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    if not 0 <= p["threshold"] <= 1:
        module.fail_json(msg=f"threshold must be between 0 and 1, got {p['threshold']}")
    if not os.path.isdir(p["results_dir"]):
        module.fail_json(msg=f"{p['results_dir']} is not a folder of benchmark results")
    try:
        report = check(p["results_dir"], p["reference"], p["threshold"])
    except (OSError, ValueError) as error:
        module.fail_json(msg=f"Reading the results under {p['results_dir']} failed: {error}")
    content = json.dumps(report, indent=1) + "\n"
    changed = True
    if os.path.isfile(p["output"]):
        with open(p["output"], encoding="utf-8") as handle:
            changed = handle.read() != content
    if changed and not module.check_mode:
        with open(p["output"], "w", encoding="utf-8") as handle:
            handle.write(content)
    module.exit_json(
        changed=changed,
        configs={
            k: {n: v for n, v in r.items() if n != "levels"} for k, r in report["configs"].items()
        },
        flagged=report["flagged"],
        reference_found=report["reference_found"],
    )


if __name__ == "__main__":
    main()
