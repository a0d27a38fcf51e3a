"""Check SGLang launch arguments against a snapshot of the pinned release's own parser.

The snapshot (tests/contract/sglang-<version>-args.json, made by
tests/contract/snapshot_sglang_args.py from the real package) lists every option of
`ServerArgs.add_cli_args`. build_parser() turns it back into an argparse parser that accepts what
the real one accepts, so a rendered command can be checked without installing SGLang and torch
(several GB) on the controller or in CI.

In the pinned release, ServerArgs.from_cli_args adds no checks on top of argparse; the rest of
SGLang's validation runs at launch and reads the model's configs. validate_argv() mirrors only the
few launch-time rules that need no config (the snapshot's "post_parse" section lists them), so a
command the real server would refuse at once for a reason visible in argv fails here too.

Standard library only: importable as ansible.module_utils.sglang_args inside modules and from
tests.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path

__all__ = [
    "ArgvError",
    "build_parser",
    "deprecated_flags",
    "load_snapshot",
    "parse_argv",
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


class ArgvError(ValueError):
    """A launch command the pinned SGLang would refuse; `flag` names the offending option."""

    def __init__(self, message: str, flag: str | None = None):
        super().__init__(message)
        self.flag = flag


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
    return parser


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
    version = snapshot_version(snapshot)
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
        hint = f"sglang {version} has no {flag}"
        hints.append(f"{hint}; did you mean {guess}?" if guess else hint)
    if not flags:
        hints.append(f"sglang {version} takes no positional arguments")
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


# --- launch-time rules that need no model config -----------------------------------------


def _launch_rules(namespace: argparse.Namespace, snapshot: dict) -> None:
    version = snapshot_version(snapshot)
    algorithms = snapshot.get("speculative_algorithms")
    algorithm = getattr(namespace, "speculative_algorithm", None)
    if algorithm is not None and algorithms:
        known = (
            set(algorithms.get("builtin", []))
            | set(algorithms.get("aliases", {}))
            | set(algorithms.get("registered_plugins", []))
        )
        if algorithm.upper() not in known:
            raise ArgvError(
                f"sglang {version} does not know --speculative-algorithm {algorithm} "
                f"(it knows {', '.join(sorted(known))}); an algorithm that is not in this "
                "release needs SGLang installed from a git ref that has it",
                "--speculative-algorithm",
            )
        algorithm = algorithm.upper()

    window = getattr(namespace, "speculative_draft_window_size", None)
    if window is not None and window <= 0:
        raise ArgvError(
            f"--speculative-draft-window-size must be positive, got {window}",
            "--speculative-draft-window-size",
        )
    sink = getattr(namespace, "speculative_draft_sink_size", None)
    if sink is not None:
        if sink < 0:
            raise ArgvError(
                f"--speculative-draft-sink-size must be non-negative, got {sink}",
                "--speculative-draft-sink-size",
            )
        if window is None:
            raise ArgvError(
                "--speculative-draft-sink-size requires --speculative-draft-window-size",
                "--speculative-draft-sink-size",
            )

    if algorithm != "DFLASH":
        return
    if getattr(namespace, "speculative_draft_model_path", None) is None:
        raise ArgvError(
            "DFLASH speculative decoding requires --speculative-draft-model-path",
            "--speculative-draft-model-path",
        )
    block = getattr(namespace, "speculative_dflash_block_size", None)
    tokens = getattr(namespace, "speculative_num_draft_tokens", None)
    if block is not None:
        if block <= 0:
            raise ArgvError(
                f"DFLASH requires --speculative-dflash-block-size to be positive, got {block}",
                "--speculative-dflash-block-size",
            )
        if tokens is not None and tokens != block:
            raise ArgvError(
                "--speculative-num-draft-tokens and --speculative-dflash-block-size differ "
                f"({tokens} and {block}); for DFLASH they must match",
                "--speculative-dflash-block-size",
            )
    # Without either size SGLang reads the block size from the drafter's config, which is not
    # known here, so the window check is left to the server.
    size = tokens if tokens is not None else block
    if window is not None and size is not None and window < size:
        raise ArgvError(
            "--speculative-draft-window-size must be >= --speculative-num-draft-tokens "
            f"(block size): window {window}, block size {size}",
            "--speculative-draft-window-size",
        )


def validate_argv(
    argv: list[str],
    snapshot: dict,
    *,
    allow_abbrev: bool | None = False,
    launch_rules: bool = True,
) -> None:
    """Raise ArgvError unless the pinned SGLang's parser accepts argv (the arguments after
    `python -m sglang.launch_server`), naming the offending flag.

    launch_rules=True also applies the config-free checks SGLang makes when it starts (known
    speculative algorithm, DFlash block size and draft window); launch_rules=False checks
    exactly what add_cli_args + from_cli_args check.
    """
    namespace = parse_argv(argv, snapshot, allow_abbrev=allow_abbrev)
    if launch_rules:
        _launch_rules(namespace, snapshot)


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
