"""A launch argv checked by the installed runtime's own parser, before the server (re)starts.

The probe (PROBE) runs in the runtime's Python, so the parser is the one that will read argv:
sglang's `ServerArgs.add_cli_args`, and where constructing the record is model-free, the whole
of `sglang.srt.server_args.prepare_server_args` (`--config` merging, parsing, `from_cli_args`).

- sglang 0.5.23 resolves lazily (`ServerArgs.resolve_once`; `__post_init__` does nothing), so
  prepare_server_args() reads no model config and touches no GPU: the probe calls it whole.
- DDTree's pull request (29907) is based on a main branch whose `ServerArgs.__post_init__`
  resolves at construction: it asks the GPU for its memory (get_device_memory_capacity) and reads
  the model's and drafter's configs. There the probe stops after the runtime's own argparse
  parser (add_cli_args, and its own ConfigArgumentMerger for `--config`).

Either way the runtime's parser decides which flags exist and what their values must be. The
config-free launch rules (module_utils/sglang_args.py RULES: the release's DFlash checks and the
pull request's DDTree checks: budget >= 1, no rejection sampling, page size 1, triton for a full
tree) are then applied by the kit to the values the runtime's parser produced, and the runtime
itself says whether it knows the speculative algorithm (SpeculativeAlgorithm.from_string). Not
reachable without the model, and left to the server: a block size read from the drafter's
config, attention backends SGLang picks by GPU and model, dp-attention resolution, and the
model-architecture and hybrid (Mamba) checks.

The probe arms SIGALRM with its deadline, so a runtime whose import hangs cannot hold the
deploy; the module's task has a timeout as well.
"""

from __future__ import annotations

import json
import re

from ansible.module_utils.sglang_args import RULES, ArgvError, launch_rule_errors

MARK = "KIMI-LAUNCH-CHECK "

# Runs in the runtime's Python: argv comes as JSON on stdin, the deadline in seconds as argv[1].
PROBE = r"""
import argparse, contextlib, dataclasses, importlib, io, json, os, signal, sys

def deadline(*_):
    print("KIMI-LAUNCH-CHECK " + json.dumps({"ok": False, "stage": "deadline", "error":
          "the runtime's parser did not answer within " + sys.argv[1] + " s"}), flush=True)
    os._exit(3)

signal.signal(signal.SIGALRM, deadline)
signal.alarm(int(sys.argv[1]))
argv = json.load(sys.stdin)
out = {"ok": False, "stage": "import", "python": sys.executable}

def plain(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return str(value)

def record_values(record):
    # 0.5.23's ServerArgs is a msgspec Struct (no __dict__ of fields), older ones dataclasses.
    names = getattr(type(record), "__struct_fields__", None)
    if names is None and dataclasses.is_dataclass(record):
        names = [field.name for field in dataclasses.fields(record)]
    if names is None:
        return dict(vars(record))
    return {name: getattr(record, name, None) for name in names}

def merge_config(parser, argv):
    for name in ("sglang.srt.utils.server_args_config_parser",
                 "sglang.srt.server_args_config_parser"):
        try:
            merger = importlib.import_module(name).ConfigArgumentMerger
        except ImportError:
            continue
        return merger(parser).merge_config_with_args(argv)
    raise RuntimeError("--config is in argv but this sglang has no ConfigArgumentMerger")

try:
    import importlib.metadata as md
    try:
        out["version"] = md.version("sglang")
    except md.PackageNotFoundError:
        out["version"] = None
    if out["version"] is None:
        out["version"] = getattr(importlib.import_module("sglang"), "__version__", None)
    server_args = importlib.import_module("sglang.srt.server_args")
    out["stage"] = "parse"
    record_is_lazy = callable(getattr(server_args.ServerArgs, "resolve_once", None))
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            if record_is_lazy and hasattr(server_args, "prepare_server_args"):
                out["mode"] = "prepare_server_args"
                values = record_values(server_args.prepare_server_args(list(argv)))
            else:
                out["mode"] = "add_cli_args"
                parser = argparse.ArgumentParser(prog="sglang serve")
                server_args.ServerArgs.add_cli_args(parser)
                parsed = merge_config(parser, list(argv)) if "--config" in argv else list(argv)
                values = vars(parser.parse_args(parsed))
        except SystemExit as error:
            # argparse prints its whole usage first; the reason is on the "error:" line.
            lines = stderr.getvalue().strip().splitlines()
            reasons = [line for line in lines if ": error:" in line]
            out["error"] = (reasons or lines[-1:] or [f"the parser exited with {error.code}"])[-1]
            values = None
        except Exception as error:
            out["error"] = f"{type(error).__name__}: {error}"
            values = None
    if values is not None:
        out["values"] = {k: plain(v) for k, v in values.items() if not k.startswith("_")}
        out["ok"] = True
        name = out["values"].get("speculative_algorithm")
        out["algorithm_known"] = None
        if name is not None:
            try:
                spec = importlib.import_module("sglang.srt.speculative.spec_info")
            except ImportError as error:
                out["algorithm_error"] = f"cannot import spec_info: {error}"
            else:
                try:
                    spec.SpeculativeAlgorithm.from_string(name)
                    out["algorithm_known"] = True
                except Exception as error:
                    out["algorithm_known"] = False
                    out["algorithm_error"] = f"{type(error).__name__}: {error}"
except BaseException as error:
    out["error"] = f"{type(error).__name__}: {error}"
signal.alarm(0)
print("KIMI-LAUNCH-CHECK " + json.dumps(out))
"""


def probe_argv(argv: list[str], secrets_file: str | None = None) -> list[str]:
    """The arguments the runtime's parser sees: argv after `python -m sglang.launch_server`,
    without the kit's own `--config <secrets file>` (it holds only the API key, written by the
    server role later, and is root-only)."""
    args = [str(a) for a in argv]
    if len(args) >= 3 and args[1:3] == ["-m", "sglang.launch_server"]:
        args = args[3:]
    if secrets_file:
        for index in range(len(args) - 1):
            if args[index] == "--config" and args[index + 1] == secrets_file:
                return args[:index] + args[index + 2 :]
    return args


def flag_in(message: str, argv: list[str]) -> str | None:
    """The flag an argparse message is about, as argv spells it when it does."""
    found = re.search(r"unrecognized arguments: (\S+)", message)
    if found:
        return found.group(1).split("=", 1)[0]
    candidates = re.findall(r"(--?[A-Za-z0-9][\w-]*)", message)
    used = {a.split("=", 1)[0] for a in argv}
    for candidate in candidates:
        if candidate in used:
            return candidate
    return candidates[0] if candidates else None


def parse_probe_output(stdout: str) -> dict | None:
    line = next((x for x in stdout.splitlines() if x.startswith(MARK)), None)
    if line is None:
        return None
    try:
        result = json.loads(line[len(MARK) :])
    except ValueError:
        return None
    return result if isinstance(result, dict) else None


def errors_of(result: dict, argv: list[str]) -> list[ArgvError]:
    """Why the runtime would refuse argv, from the probe's result (empty: it would start)."""
    label = f"sglang {result.get('version') or '(unknown version)'}"
    if not result.get("ok"):
        message = str(result.get("error") or "the probe failed")
        # argparse prefixes its own "usage:" lines; the last line carries the reason.
        reason = message.strip().splitlines()[-1] if message.strip() else message
        return [ArgvError(reason, flag_in(reason, argv))]
    values = result.get("values")
    if not isinstance(values, dict):
        return [ArgvError("the runtime's parser returned no values")]
    errors = []
    if result.get("algorithm_known") is False:
        algorithm = values.get("speculative_algorithm")
        errors.append(
            ArgvError(
                f"{label} does not know --speculative-algorithm {algorithm} "
                f"({result.get('algorithm_error')}); an algorithm that is not in this runtime "
                "needs SGLang installed from a git ref that has it",
                "--speculative-algorithm",
            )
        )
        return errors
    rules = [rule for rule in RULES if rule != "speculative-algorithm-known"]
    return launch_rule_errors(values, rules, label=label, algorithms=None)
