"""launch_check's probe: parse a launch argv with the installed sglang's own parser.

A program, run by library/launch_check.py as `<runtime python> -c <this file's source> SECONDS`
with the argv as JSON on stdin (module_utils/server/launch_check.py says what it checks and why).
The
runtime's Python has sglang and no Ansible: at the top this file imports only the standard
library, and sglang inside main(). It prints one line, MARKER + JSON; library/launch_check.py
reads it with module_utils/host/helpers.py marked_json() and the same MARKER. SIGALRM ends it
after SECONDS with a "deadline" report and EXIT_DEADLINE, so a runtime whose import hangs cannot
hold the deploy.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import io
import json
import os
import signal
import sys

MARKER = "KIMI-LAUNCH-CHECK "
EXIT_DEADLINE = 3
CONFIG_MERGERS = (
    "sglang.srt.utils.server_args_config_parser",
    "sglang.srt.server_args_config_parser",
)


def report_line(out: dict) -> str:
    return MARKER + json.dumps(out)


# Tuples in isinstance, not unions: the runtime's Python may be older than the controller's.
def plain(value):
    """value as JSON can carry it: containers walked, anything else as its str()."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return str(value)


def record_values(record) -> dict:
    # 0.5.23's ServerArgs is a msgspec Struct (no __dict__ of fields), older ones dataclasses.
    names = getattr(type(record), "__struct_fields__", None)
    if names is None and dataclasses.is_dataclass(record):
        names = [field.name for field in dataclasses.fields(record)]
    if names is None:
        return dict(vars(record))
    return {name: getattr(record, name, None) for name in names}


def parser_error(stderr: str, code) -> str:
    """Why argparse stopped: it prints its whole usage first; the reason is on the "error:"
    line."""
    lines = stderr.strip().splitlines()
    reasons = [line for line in lines if ": error:" in line]
    return (reasons or lines[-1:] or [f"the parser exited with {code}"])[-1]


def merge_config(parser, argv):
    for name in CONFIG_MERGERS:
        try:
            merger = importlib.import_module(name).ConfigArgumentMerger
        except ImportError:
            continue
        return merger(parser).merge_config_with_args(argv)
    raise RuntimeError("--config is in argv but this sglang has no ConfigArgumentMerger")


def main(argv: list[str] | None = None) -> None:
    seconds = (sys.argv[1:] if argv is None else argv)[0]

    def deadline(*_):
        error = "the runtime's parser did not answer within " + seconds + " s"
        print(report_line({"ok": False, "stage": "deadline", "error": error}), flush=True)
        os._exit(EXIT_DEADLINE)

    signal.signal(signal.SIGALRM, deadline)
    signal.alarm(int(seconds))
    launch = json.load(sys.stdin)
    out = {"ok": False, "stage": "import", "python": sys.executable}
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
                    values = record_values(server_args.prepare_server_args(list(launch)))
                else:
                    out["mode"] = "add_cli_args"
                    parser = argparse.ArgumentParser(prog="sglang serve")
                    server_args.ServerArgs.add_cli_args(parser)
                    parsed = (
                        merge_config(parser, list(launch)) if "--config" in launch else list(launch)
                    )
                    values = vars(parser.parse_args(parsed))
            except SystemExit as error:
                out["error"] = parser_error(stderr.getvalue(), error.code)
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
    print(report_line(out))


if __name__ == "__main__":
    main()
