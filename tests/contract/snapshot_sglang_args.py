"""Dump the option table of the installed SGLang's server parser to a JSON snapshot.

Run from the repo root with the python of the contract venv that `make test-contract` builds
(the pinned sglang and what its parser imports; see README.md):

    tests/.state/contract-venv/bin/python tests/contract/snapshot_sglang_args.py

The snapshot holds everything module_utils/plan/sglang_args.py needs to rebuild an equivalent
argparse
parser, so CI can validate launch commands without installing sglang and torch (several GB).
The output carries no timestamp or host detail, so regenerating from the same release and venv
gives a byte-identical file and a diff means the parser really changed (or, in
`generated_with`, the torch the venv was built with).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
GENERATED_BY = "tests/contract/snapshot_sglang_args.py"

# argparse's own action classes, by the name `add_argument(action=...)` takes.
STANDARD_ACTIONS = {
    "_StoreAction": "store",
    "_StoreConstAction": "store_const",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "_AppendAction": "append",
    "_AppendConstAction": "append_const",
    "_CountAction": "count",
    "_ExtendAction": "extend",
    "_HelpAction": "help",
    "_VersionAction": "version",
    "BooleanOptionalAction": "BooleanOptionalAction",
}

# Flags the kit's launch commands depend on, or that release notes and older docs disagree on.
WATCHED_FLAGS = [
    "--speculative-algorithm",
    "--speculative-draft-model-path",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
    "--speculative-draft-window-size",
    "--speculative-dflash-draft-window-size",
    "--speculative-dflash-block-size",
    "--speculative-ddtree-budget",
    "--speculative-draft-attention-backend",
    "--attention-backend",
    "--kv-cache-dtype",
    "--cuda-graph-bs",
    "--cuda-graph-bs-decode",
    "--cuda-graph-bs-prefill",
    "--cuda-graph-max-bs",
    "--page-size",
    "--disable-overlap-schedule",
    "--enable-metrics",
    "--tool-call-parser",
    "--reasoning-parser",
]


def type_name(func) -> str | None:
    if func is None:
        return None
    if func in (int, float, str, bool):
        return func.__name__
    if func is json.loads:
        return "json.loads"
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None)
    if module and qualname:
        return f"{module}.{qualname}"
    return repr(func)


def json_safe(value):
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    return repr(value)


def choices_list(choices) -> list | None:
    if choices is None:
        return None
    # A few options take their choices from a set; sort those so the file is reproducible.
    if isinstance(choices, set | frozenset):
        return sorted(json_safe(list(choices)), key=str)
    return json_safe(list(choices))


def describe(action: argparse.Action) -> dict:
    cls = type(action)
    entry = {
        "dest": action.dest,
        "option_strings": list(action.option_strings),
        "nargs": action.nargs,
        "type": type_name(action.type),
        "choices": choices_list(action.choices),
        "default": json_safe(action.default),
        "required": bool(action.required),
        "action": STANDARD_ACTIONS.get(cls.__name__, f"{cls.__module__}.{cls.__qualname__}"),
        "const": json_safe(action.const),
    }
    if cls.__name__ not in STANDARD_ACTIONS:
        # SGLang's own actions (deprecation shims, LoRA paths) differ from argparse's only in
        # what they store or print; what they accept is decided by nargs, type and choices.
        entry["rebuild_as"] = "store_const" if action.nargs == 0 else "store"
        if getattr(action, "new_flag", None):
            entry["deprecated"] = {"use_instead": action.new_flag}
    return entry


def speculative_algorithms() -> dict:
    """Names SGLang's launch-time resolution accepts for --speculative-algorithm.

    The parser takes any string for this flag; the name is checked later, in
    SpeculativeAlgorithm.from_string (upper-cased), when the server starts.
    """
    from sglang.srt.speculative import spec_registry
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    names = sorted(member.name for member in SpeculativeAlgorithm)
    aliases = {
        alias: SpeculativeAlgorithm.from_string(alias).name
        for alias in sorted(spec_registry._RESERVED_ALIASES)
    }
    registered = sorted(spec_registry._REGISTRY)
    return {"builtin": names, "aliases": aliases, "registered_plugins": registered}


def facts(parser: argparse.ArgumentParser, algorithms: dict) -> dict:
    by_flag = {option: action for action in parser._actions for option in action.option_strings}
    flags = {}
    for flag in WATCHED_FLAGS:
        action = by_flag.get(flag)
        flags[flag] = (
            {"exists": False}
            if action is None
            else {
                "exists": True,
                "type": type_name(action.type),
                "nargs": action.nargs,
                "choices": choices_list(action.choices),
            }
        )
    known = set(algorithms["builtin"]) | set(algorithms["aliases"])
    return {
        "flags": flags,
        "speculative_algorithm_has_parser_choices": (
            by_flag["--speculative-algorithm"].choices is not None
        ),
        "speculative_algorithm_dflash_known": "DFLASH" in known,
        "speculative_algorithm_ddtree_known": "DDTREE" in known,
    }


# What ServerArgs.from_cli_args adds on top of argparse in this release, and what the launch-time
# resolution checks that the kit mirrors; module_utils/plan/sglang_args.py implements the rules
# named
# here, and the cross-check test compares them with the real code where it can run on a CPU.
POST_PARSE_NOTES = {
    "from_cli_args": (
        "Copies the argparse Namespace into the ServerArgs record; ServerArgs.__post_init__ is a "
        "no-op in this release, so from_cli_args rejects nothing argparse accepted."
    ),
    "resolve_once": (
        "All other validation runs in ServerArgs.resolve_once() (arg_groups/pipeline.py) when "
        "the server launches. It reads the model's and drafter's Hugging Face configs and the "
        "platform, so it cannot run from a snapshot. The kit mirrors only the cheap, "
        "config-free rules below (arg_groups/speculative_hook.py)."
    ),
    "mirrored_rules": [
        "--speculative-algorithm must name a known algorithm (case-insensitive).",
        "--speculative-draft-window-size must be positive.",
        "--speculative-draft-sink-size needs --speculative-draft-window-size and must be >= 0.",
        "DFLASH: --speculative-dflash-block-size must be positive and equal "
        "--speculative-num-draft-tokens when both are given.",
        "DFLASH: --speculative-draft-window-size must be >= the block size "
        "(--speculative-num-draft-tokens, or --speculative-dflash-block-size).",
        "DFLASH needs --speculative-draft-model-path.",
    ],
    "config_file": (
        "sglang serve merges a --config YAML file into argv before parsing "
        "(prepare_server_args); the snapshot validates plain argv only."
    ),
}


def render(snapshot: dict) -> str:
    """Indented JSON with one option per line: small, and a changed flag shows as one line."""
    head = {key: value for key, value in snapshot.items() if key != "options"}
    text = json.dumps({**head, "options": None}, indent=1)
    options = ",\n".join(f"  {json.dumps(option)}" for option in snapshot["options"])
    return text.replace('"options": null', f'"options": [\n{options}\n ]') + "\n"


def build_snapshot() -> dict:
    """The snapshot of the sglang installed in this interpreter."""
    from sglang.srt.server_args import ServerArgs

    # The same construction as sglang's own prepare_server_args().
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    algorithms = speculative_algorithms()
    return {
        "sglang_version": importlib.metadata.version("sglang"),
        "generated_by": GENERATED_BY,
        "generated_with": {
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "torch": importlib.metadata.version("torch"),
        },
        "parser": {
            "prog": parser.prog,
            "allow_abbrev": parser.allow_abbrev,
            "prefix_chars": parser.prefix_chars,
            "fromfile_prefix_chars": parser.fromfile_prefix_chars,
            "add_help": parser.add_help,
        },
        "post_parse": POST_PARSE_NOTES,
        "speculative_algorithms": algorithms,
        "facts": facts(parser, algorithms),
        "options": [describe(action) for action in parser._actions],
    }


def main() -> int:
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    snapshot = build_snapshot()
    algorithms = snapshot["speculative_algorithms"]
    out = HERE / f"sglang-{snapshot['sglang_version']}-args.json"
    out.write_text(render(snapshot))

    f = snapshot["facts"]
    print(f"wrote {out.relative_to(HERE.parent.parent)}: {len(snapshot['options'])} options")
    print(f"speculative algorithms: {algorithms['builtin']} aliases {algorithms['aliases']}")
    print(f"  parser choices for --speculative-algorithm: {f['flags']['--speculative-algorithm']}")
    print(f"  DFLASH known: {f['speculative_algorithm_dflash_known']}")
    print(f"  DDTREE known: {f['speculative_algorithm_ddtree_known']}")
    for flag, info in f["flags"].items():
        if flag == "--speculative-algorithm":
            continue
        detail = "" if not info["exists"] else f" type={info['type']} nargs={info['nargs']}"
        if info.get("choices"):
            detail += f" choices={info['choices']}"
        print(f"  {flag}: {'present' if info['exists'] else 'ABSENT'}{detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
