"""Check SGLang launch arguments against a contract: a snapshot of a runtime's own parser.

The snapshot (tests/contract/sglang-<version>-args.json, made by
tests/contract/snapshot_sglang_args.py from the real package) lists every option of
`ServerArgs.add_cli_args`. build_parser() turns it back into an argparse parser that accepts what
the real one accepts, so a rendered command can be checked without installing SGLang and torch
(several GB) on the controller or in CI. A runtime built from a pull request is the release's
snapshot plus an overlay (tests/contract/sglang-pr29907-overlay.json for DDTree): its added
options, algorithm names and launch rules, each with its source; load_contract() merges them.

In the pinned release, ServerArgs.from_cli_args adds no checks on top of argparse; the rest of
SGLang's validation runs at launch and reads the model's configs. The launch rules
(module_utils/plan/sglang_launch_rules.py, re-exported here) mirror only the checks that need
no config (RULES; the snapshot's "post_parse" section and the overlay's "launch_rules" list
them), so a command the real server would refuse at once for a reason visible in argv fails
here too. They run on values, so the deploy-time check can apply them to what the installed
runtime's own parser produced.

Standard library only, and nothing from the kit but its launch rules: importable as
ansible.module_utils.plan.sglang_args inside modules and from tests, and, copied with
sglang_launch_rules.py into the stand-in sglang (tests/support/fake_sglang.py), from its folder.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
from decimal import Decimal, InvalidOperation
from pathlib import Path

# The launch rules lie beside this file wherever it is: in the kit, or copied into the stand-in
# sglang (imported there as sglang.sglang_args, and bare by the simulator).
if __package__ == "ansible.module_utils.plan":
    from ansible.module_utils.plan import sglang_launch_rules as _rules
else:  # a copy: its folder is where the rules are
    _here = os.path.dirname(os.path.abspath(__file__))
    if _here not in sys.path:
        sys.path.insert(0, _here)
    import sglang_launch_rules as _rules

# One module object wherever the rules were found: its ArgvError is the one callers catch.
FORCED, RELEASE_RULES, RULES = _rules.FORCED, _rules.RELEASE_RULES, _rules.RULES
ArgvError, resolve_forced = _rules.ArgvError, _rules.resolve_forced
contract_algorithms, launch_rule_errors = _rules.contract_algorithms, _rules.launch_rule_errors

__all__ = [
    "FORCED",
    "RELEASE_RULES",
    "RULES",
    "ArgvError",
    "add_arguments",
    "build_parser",
    "check_argv",
    "check_environment",
    "contract_label",
    "contract_name",
    "deprecated_flags",
    "launch_rule_errors",
    "load_contract",
    "load_snapshot",
    "parse_argv",
    "resolve_forced",
    "snapshot_filename",
    "snapshot_version",
    "validate_argv",
]

_STANDARD_ACTIONS = {
    "store",
    "store_const",
    "store_true",
    "store_false",
    "append",
    "append_const",
    "count",
    "extend",
}


class _RaisingParser(argparse.ArgumentParser):
    # exit_on_error=False alone is not enough on Python 3.11: missing required options and
    # leftover arguments still go through error(), which prints and exits.
    def error(self, message):
        raise ArgvError(message)


def snapshot_filename(version: str) -> str:
    return f"sglang-{version}-args.json"


def load_snapshot(path) -> dict:
    """Read a snapshot written by snapshot_sglang_args.py; raise ValueError if it is not one."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("options"), list):
        raise ValueError(f"{path} is not an SGLang option snapshot: no 'options' list")
    if not data.get("sglang_version"):
        raise ValueError(f"{path} is not an SGLang option snapshot: no 'sglang_version'")
    return data


def snapshot_version(snapshot: dict) -> str:
    """The SGLang release the snapshot was taken from."""
    return str(snapshot["sglang_version"])


# --- argument types -------------------------------------------------------------------------
# SGLang's own type callables, rewritten here where they are small; any other recorded type
# falls back to str, which accepts every value (so the check is never stricter than SGLang).


def _json_value(value: str):
    try:
        return json.loads(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid JSON: {value}") from err


def _json_object(value: str):
    parsed = _json_value(value)
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {type(parsed).__name__}")
    return parsed


def _nullable_str(value: str):
    return None if not value or value == "None" else value


_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _human_readable_int(value: str) -> int:
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in _IEC:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'."
                )
            return int(number) * _IEC[suffix]
        try:
            return int(Decimal(number) * _SI[suffix])
        except InvalidOperation as err:
            raise argparse.ArgumentTypeError(f"Invalid integer value: '{value}'.") from err
    try:
        return int(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. Use a plain integer, SI suffixes (1k, 1M), "
            "or IEC suffixes (1Ki, 1Mi)."
        ) from err


def _cuda_graph_backend(value: str) -> str:
    if value == "tc_piecewise":
        raise argparse.ArgumentTypeError(
            "tc_piecewise was removed; select breakable, full, or disabled"
        )
    return value


_TYPES = {
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,
    "json.loads": json.loads,
    "sglang.srt.utils.common.json_list_type": _json_value,
    "sglang.srt.utils.common.nullable_str": _nullable_str,
    "sglang.srt.utils.common.human_readable_int": _human_readable_int,
    "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_backend_arg": (
        _cuda_graph_backend
    ),
    "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_config_arg": _json_object,
}


def _type(name):
    if name is None:
        return None
    return _TYPES.get(name, str)


# --- parser ---------------------------------------------------------------------------------


def build_parser(snapshot: dict, *, allow_abbrev: bool | None = None) -> argparse.ArgumentParser:
    """An argparse parser equivalent to the snapshotted one; errors raise ArgvError.

    allow_abbrev defaults to what the real parser does (argparse's prefix matching, on in
    SGLang). -h/--help is left out: it prints and exits, and is never part of a launch command.
    """
    info = snapshot.get("parser", {})
    parser = _RaisingParser(
        prog=info.get("prog", "sglang serve"),
        prefix_chars=info.get("prefix_chars", "-"),
        fromfile_prefix_chars=info.get("fromfile_prefix_chars"),
        allow_abbrev=info.get("allow_abbrev", True) if allow_abbrev is None else allow_abbrev,
        add_help=False,
        exit_on_error=False,
    )
    add_arguments(parser, snapshot)
    return parser


def add_arguments(parser: argparse.ArgumentParser, snapshot: dict) -> None:
    """Add the contract's options to parser, as ServerArgs.add_cli_args adds the real ones
    (the test runtimes' sglang.srt.server_args does exactly this)."""
    for option in snapshot["options"]:
        action = option.get("rebuild_as") or option["action"]
        if action in ("help", "version"):
            continue
        kwargs = {"dest": option["dest"]}
        if option.get("default") is not None:
            kwargs["default"] = option["default"]
        if option.get("required"):
            kwargs["required"] = True
        if action == "BooleanOptionalAction":
            kwargs["action"] = argparse.BooleanOptionalAction
            # argparse adds the --no- spelling itself.
            strings = [s for s in option["option_strings"] if not s.startswith("--no-")]
        elif action in _STANDARD_ACTIONS:
            kwargs["action"] = action
            strings = option["option_strings"]
            if action in ("store_const", "append_const"):
                kwargs["const"] = option.get("const")
            if action in ("store", "append", "extend"):
                if option.get("nargs") is not None:
                    kwargs["nargs"] = option["nargs"]
                if option.get("const") is not None and option.get("nargs") == "?":
                    kwargs["const"] = option["const"]
                if option.get("type") is not None:
                    kwargs["type"] = _type(option["type"])
                if option.get("choices") is not None:
                    kwargs["choices"] = option["choices"]
        else:
            raise ValueError(
                f"snapshot option {option['option_strings']} has action {action!r}, which "
                "build_parser cannot rebuild; regenerate the snapshot with a newer script"
            )
        if not strings:
            raise ValueError(f"snapshot option {option['dest']!r} has no option strings")
        parser.add_argument(*strings, **kwargs)


def _known_flags(snapshot: dict) -> list[str]:
    return sorted(
        {
            s
            for option in snapshot["options"]
            if option["action"] not in ("help", "version")
            for s in option["option_strings"]
        }
    )


def _closest(flag: str, snapshot: dict) -> str | None:
    matches = difflib.get_close_matches(flag, _known_flags(snapshot), n=1, cutoff=0.6)
    return matches[0] if matches else None


def _flag_of(token: str) -> str:
    return token.split("=", 1)[0]


def _unknown_flags_error(extras: list[str], snapshot: dict) -> ArgvError:
    version = contract_label(snapshot)
    flags = [_flag_of(t) for t in extras if t.startswith("-") and len(t) > 1]
    message = f"unrecognized arguments: {' '.join(extras)}"
    known = _known_flags(snapshot)
    hints = []
    for flag in flags:
        completions = [k for k in known if k.startswith(flag)]
        if len(completions) == 1:
            hints.append(f"{flag} abbreviates {completions[0]}; write flags in full")
            continue
        guess = _closest(flag, snapshot)
        hint = f"{version} has no {flag}"
        hints.append(f"{hint}; did you mean {guess}?" if guess else hint)
    if not flags:
        hints.append(f"{version} takes no positional arguments")
    return ArgvError(f"{message} ({'; '.join(hints)})", flag=flags[0] if flags else None)


# The last few parsers built, with the snapshot each came from: rebuilding the ~530 options
# takes milliseconds, which adds up when a plan validates every config on every host. Holding
# the snapshot itself keeps its id from being reused; a snapshot edited in place after use is
# not noticed (snapshots are read from files, not edited).
_PARSERS: list[tuple[dict, bool | None, argparse.ArgumentParser]] = []


def _cached_parser(snapshot: dict, allow_abbrev: bool | None) -> argparse.ArgumentParser:
    for cached, abbrev, parser in _PARSERS:
        if cached is snapshot and abbrev == allow_abbrev:
            return parser
    parser = build_parser(snapshot, allow_abbrev=allow_abbrev)
    _PARSERS.insert(0, (snapshot, allow_abbrev, parser))
    del _PARSERS[4:]
    return parser


def _used_spelling(argument_name: str | None, argv: list[str]) -> str | None:
    """argparse names an option by all its spellings ("--tp-size/--tensor-parallel-size");
    name the one the command used."""
    if not argument_name:
        return None
    names = argument_name.split("/")
    used = {_flag_of(token) for token in argv}
    return next((name for name in names if name in used), names[0])


def parse_argv(
    argv: list[str], snapshot: dict, *, allow_abbrev: bool | None = False
) -> argparse.Namespace:
    """Parse argv as the pinned `sglang serve` would; raise ArgvError where it would refuse.

    allow_abbrev=False (the default here) refuses abbreviated flags that the real parser
    would expand: a rendered command should spell flags in full, because an abbreviation that
    is unique in one release can become ambiguous or change meaning in the next. Pass None to
    behave exactly like the real parser.
    """
    argv = [str(a) for a in argv]
    for token in argv:
        if token in ("-h", "--help"):
            raise ArgvError(f"{token} prints help and exits; it is not a launch option", token)
    parser = _cached_parser(snapshot, allow_abbrev)
    try:
        namespace, extras = parser.parse_known_args(argv)
    except argparse.ArgumentError as err:
        raise ArgvError(str(err), flag=_used_spelling(err.argument_name, argv)) from None
    except ArgvError as err:
        flag = next(iter(re.findall(r"(--?[\w-]+)", str(err))), None)
        raise ArgvError(str(err), flag=flag) from None
    if extras:
        raise _unknown_flags_error(extras, snapshot)
    return namespace


# --- contracts: a snapshot, optionally with an overlay ---------------------------------------
#
# A contract is a snapshot dict, optionally extended by an overlay for a runtime that is the
# release plus a pull request (tests/contract/sglang-pr29907-overlay.json): the overlay's
# options and speculative algorithm names are added, and its launch rules name which of the
# checks below apply. A bare snapshot is a contract with the release's rules.


def contract_label(contract: dict) -> str:
    """How messages name the runtime: "sglang 0.5.23", or the release plus a pull request."""
    return str(contract.get("label") or f"sglang {snapshot_version(contract)}")


def contract_name(contract: dict) -> str:
    """Short id recorded in plans: "sglang-0.5.23" or "sglang-0.5.23+pr29907"."""
    return str(contract.get("contract") or f"sglang-{snapshot_version(contract)}")


def load_contract(snapshot_path, overlay_path=None) -> dict:
    """The snapshot, with the overlay's options, algorithms and rules when one is given.

    Raises ValueError when the overlay is not one, is made for another snapshot, redefines an
    option the snapshot has, or names a rule this module does not implement (a contract must
    not claim a check nobody makes).
    """
    snapshot = load_snapshot(snapshot_path)
    if overlay_path is None:
        return snapshot
    overlay = json.loads(Path(overlay_path).read_text(encoding="utf-8"))
    if not isinstance(overlay, dict) or not isinstance(overlay.get("options"), list):
        raise ValueError(f"{overlay_path} is not an SGLang contract overlay: no 'options' list")
    base = Path(snapshot_path).name
    if overlay.get("overlay_of") != base:
        raise ValueError(
            f"{overlay_path} extends {overlay.get('overlay_of')!r}, not {base}; regenerate the "
            "overlay against the pinned release's snapshot (tests/contract/README.md)"
        )
    known = {s for option in snapshot["options"] for s in option["option_strings"]}
    dests = {option["dest"] for option in snapshot["options"]}
    options = list(snapshot["options"])
    for option in overlay["options"]:
        clash = set(option["option_strings"]) & known
        if clash or option["dest"] in dests:
            raise ValueError(
                f"{overlay_path} adds {option['option_strings']}, which the release already has"
            )
        options.append(option)
        known |= set(option["option_strings"])
        dests.add(option["dest"])
    rules = list(RELEASE_RULES)
    forced = []
    for rule in overlay.get("launch_rules") or []:
        kind, rule_id = rule.get("kind"), rule.get("id")
        if kind == "refuse" and rule_id in RULES:
            rules.append(rule_id)
        elif kind == "force" and rule_id in FORCED:
            forced.append(rule_id)
        elif kind == "note":
            continue
        else:
            raise ValueError(
                f"{overlay_path} lists launch rule {rule_id!r} ({kind}), which "
                "module_utils/plan/sglang_args.py does not implement"
            )
    algorithms = json.loads(json.dumps(snapshot.get("speculative_algorithms") or {}))
    added = (overlay.get("speculative_algorithms") or {}).get("builtin") or []
    algorithms["builtin"] = sorted(set(algorithms.get("builtin") or []) | set(added))
    merged = dict(snapshot)
    merged.update(
        options=options,
        speculative_algorithms=algorithms,
        launch_rules=rules,
        forced=forced,
        environment=overlay.get("environment") or {},
        label=overlay.get("label") or contract_label(snapshot),
        contract=overlay.get("name") or contract_name(snapshot),
        overlay=Path(overlay_path).name,
    )
    return merged


def check_argv(
    argv: list[str], contract: dict, *, allow_abbrev: bool | None = False
) -> list[ArgvError]:
    """Every reason the contract's runtime would refuse argv: the parser's error alone when it
    refuses, otherwise each config-free launch rule broken (empty: accepted)."""
    try:
        namespace = parse_argv(argv, contract, allow_abbrev=allow_abbrev)
    except ArgvError as error:
        return [error]
    return launch_rule_errors(
        vars(namespace),
        contract.get("launch_rules") or RELEASE_RULES,
        label=contract_label(contract),
        algorithms=contract_algorithms(contract),
    )


def validate_argv(
    argv: list[str],
    snapshot: dict,
    *,
    allow_abbrev: bool | None = False,
    launch_rules: bool = True,
) -> None:
    """Raise ArgvError unless the contract's parser accepts argv (the arguments after
    `python -m sglang.launch_server`), naming the offending flag.

    snapshot is a contract: a bare snapshot (load_snapshot) or one with an overlay
    (load_contract). launch_rules=True also applies the config-free checks SGLang makes when
    it starts (known speculative algorithm, DFlash block size and draft window, and the
    overlay's rules); launch_rules=False checks exactly what add_cli_args + from_cli_args check.
    """
    if not launch_rules:
        parse_argv(argv, snapshot, allow_abbrev=allow_abbrev)
        return
    errors = check_argv(argv, snapshot, allow_abbrev=allow_abbrev)
    if errors:
        raise errors[0]


_ENV_BOOLS = {"true": True, "1": True, "yes": True, "y": True}
_ENV_BOOLS.update({"false": False, "0": False, "no": False, "n": False})


def _env_value(kind: str, text: str):
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "bool":
        if text.lower() not in _ENV_BOOLS:
            raise ValueError(text)
        return _ENV_BOOLS[text.lower()]
    return text


def check_environment(environment: dict, contract: dict) -> list[str]:
    """Problems with the contract's environment knobs in environment.

    The pull request's server reads a knob with a bad value as its default (with only a
    warning in its log), so a study would silently run another setting; a name with the
    knobs' prefix that is not one of them is most likely misspelt.
    """
    knobs = contract.get("environment") or {}
    if not knobs:
        return []
    # The knobs' common prefix up to an underscore (SGLANG_DDTREE_): a name with it is meant
    # to be one of them.
    names = sorted(knobs)
    common = names[0]
    for name in names[1:]:
        while not name.startswith(common):
            common = common[:-1]
    prefix = common[: common.rindex("_") + 1] if common.count("_") >= 2 else None
    problems = []
    for name, value in sorted((environment or {}).items()):
        if name in knobs:
            kind = knobs[name].get("type", "str")
            try:
                _env_value(kind, str(value))
            except ValueError:
                problems.append(
                    f"{name}={value} is not a valid {kind}; {contract_label(contract)} would "
                    f"ignore it and use its default {knobs[name].get('default')!r}"
                )
        elif prefix and name.startswith(prefix):
            guess = difflib.get_close_matches(name, list(knobs), n=1, cutoff=0.6)
            hint = f"; did you mean {guess[0]}?" if guess else ""
            problems.append(
                f"{name} is not an environment variable {contract_label(contract)} reads "
                f"(its knobs: {', '.join(sorted(knobs))}){hint}"
            )
    return problems


def deprecated_flags(argv: list[str], snapshot: dict) -> list[str]:
    """Deprecated flags in argv, each with what the snapshot says to use instead.

    SGLang accepts them with a warning, so validate_argv does too; a renderer can refuse them.
    """
    replacements = {
        s: option["deprecated"]["use_instead"]
        for option in snapshot["options"]
        if option.get("deprecated")
        for s in option["option_strings"]
    }
    found = []
    for token in argv:
        flag = _flag_of(str(token))
        if flag in replacements:
            found.append(
                f"{flag} is deprecated in sglang {snapshot_version(snapshot)}; "
                f"use {replacements[flag]}"
            )
    return found
