#!/usr/bin/python
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""Ansible module canary_checkpoint: a tiny same-architecture checkpoint for the canary serve."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: canary_checkpoint
short_description: Write a tiny checkpoint of a model's architecture for a canary serve
description:
  - Reads O(source_dir)/config.json (the repository's real config, fetched at the pinned
    commit) and writes into O(dest_dir) a checkpoint of the same architecture, config classes,
    attention kind, MoE routing, quantization scheme and tensor names, with small dimensions
    and random weights, so that SGLang can start on it with the real launch flags in minutes,
    before the real weights are downloaded. It tests kernels and flags, not numerics.
  - Every dimension that selects a kernel is kept (MLA's 512 + 64 latent and head dims, the
    heads per TP rank, the per-rank expert width the Marlin INT4 MoE kernels need, the Gated
    DeltaNet and gated attention heads, vision head dims, the vocabulary); the rest is scaled
    down. RV(scaled) names every dimension changed. The logic and its sources are in
    module_utils/canary/checkpoint.py; docs/models.md has the table per model.
  - Writes C(config.json), C(model.safetensors), its own C(model.safetensors.index.json), and
    copies every other small file of O(source_dir) (tokenizer, chat template, remote code) but
    the real weights and index. Nothing else in O(dest_dir) is touched.
  - Idempotent; the same inputs give the same bytes. A second run trusts a stamp of the inputs
    and of each file's size and modification time and writes nothing (changed=false); a file
    changed or truncated since is rewritten.
  - Refuses, saying what was found, what is needed and how to fix it, a config with missing
    or mistyped fields or absurd sizes, an architecture or quantization it cannot reproduce,
    a TP size that does not divide what SGLang splits, a checkpoint over O(max_bytes), and a
    path or symlink outside its folder.
  - Standard library only (runs with the host's own Python). Supports check mode (plans and
    validates, writes nothing).
version_added: "0.1.0"
options:
  kind:
    description: >-
      What to write: the target model, or a drafter (C(dflash), C(eagle3)) shaped to the tiny
      target in O(target_dir).
    type: str
    required: true
    choices: [target, dflash, eagle3]
  source_dir:
    description: The folder of the repository's real small files; its config.json decides.
    type: path
    required: true
  dest_dir:
    description: Where the tiny checkpoint goes (created); a folder of its own.
    type: path
    required: true
  target_dir:
    description: >-
      For a drafter, the tiny target's folder (written by O(kind=target)): its hidden size,
      depth and vocabulary shape the drafter.
    type: path
  tp_size:
    description: The launch's TP size; every dimension SGLang splits over ranks must divide by it.
    type: int
    default: 8
  seed:
    description: The seed of the random weights; the same inputs give the same bytes.
    type: int
    default: 0
  max_bytes:
    description: Refuse a checkpoint larger than this many bytes (all its files together).
    type: int
    default: 1073741824
author:
  - kimi-deploy-kit maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Tiny K2.6 target for the canary
  canary_checkpoint:
    kind: target
    source_dir: /opt/kimi/canary/sources/moonshotai/Kimi-K2.6
    dest_dir: /opt/kimi/canary/checkpoints/moonshotai/Kimi-K2.6
    tp_size: 8

- name: Its DFlash drafter
  canary_checkpoint:
    kind: dflash
    source_dir: /opt/kimi/canary/sources/z-lab/Kimi-K2.6-DFlash
    dest_dir: /opt/kimi/canary/checkpoints/z-lab/Kimi-K2.6-DFlash
    target_dir: /opt/kimi/canary/checkpoints/moonshotai/Kimi-K2.6
    tp_size: 8
"""

RETURN = r"""
path:
  description: The tiny checkpoint's folder (O(dest_dir)).
  returned: success
  type: str
bytes:
  description: Bytes of all its files.
  returned: success
  type: int
files:
  description: The names of the files it owns there, sorted.
  returned: success
  type: list
  elements: str
tensors:
  description: How many tensors model.safetensors holds.
  returned: success
  type: int
seconds:
  description: How long this run took (writing, or confirming the stamp).
  returned: success
  type: float
config:
  description: The tiny config.json as written.
  returned: success
  type: dict
digest:
  description: >-
    sha256 over the files' sha256s (C(name:sha256) lines, sorted): the checkpoint's identity
    for the canary (null in check mode).
  returned: success
  type: str
scaled:
  description: >-
    Every config field changed, as C(field: [real, tiny]) (real null: a field SGLang reads
    that the real config leaves to a default).
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.canary import checkpoint as cc  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "kind": {"type": "str", "required": True, "choices": list(cc.KINDS)},
            "source_dir": {"type": "path", "required": True},
            "dest_dir": {"type": "path", "required": True},
            "target_dir": {"type": "path"},
            "tp_size": {"type": "int", "default": 8},
            "seed": {"type": "int", "default": 0},
            "max_bytes": {"type": "int", "default": cc.DEFAULT_MAX_BYTES},
        },
        required_if=[("kind", "dflash", ("target_dir",)), ("kind", "eagle3", ("target_dir",))],
        supports_check_mode=True,
    )
    p = module.params
    try:
        result = cc.generate(
            p["kind"],
            p["source_dir"],
            p["dest_dir"],
            target_dir=p["target_dir"],
            tp_size=p["tp_size"],
            seed=p["seed"],
            max_bytes=p["max_bytes"],
            check_mode=module.check_mode,
        )
    except cc.CheckpointError as error:
        module.fail_json(msg=f"The tiny {p['kind']} checkpoint for {p['source_dir']}: {error}")
    except OSError as error:
        module.fail_json(
            msg=f"The tiny {p['kind']} checkpoint for {p['source_dir']}: found {error}; needed: "
            f"a readable source folder and a writable {p['dest_dir']}. Fix: check the folders' "
            "owners and the disk."
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
