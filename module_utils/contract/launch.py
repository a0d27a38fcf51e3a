"""Reading a rendered launch argv (`python -m sglang.launch_server ...`): the plan's capacity
and speed model, the server's API check and the analysis read its flags the same way."""

from __future__ import annotations

# SGLang's aliases of one option each (server_args.py): any of them sets the TP or PP size.
TP_FLAGS = ("--tp-size", "--tp", "--tensor-parallel-size")
PP_FLAGS = ("--pp-size", "--pp", "--pipeline-parallel-size")


def flag_value(argv, flag: str) -> str | None:
    """The value argparse would give `flag` in argv (`--flag value` or `--flag=value`, the last
    one winning), or None when it is absent or argv is not a list. Items that are not strings
    are no flags (a launch record read from a results file may hold anything)."""
    if not isinstance(argv, (list, tuple)):
        return None
    found = None
    for index, item in enumerate(argv):
        if not isinstance(item, str):
            continue
        if item == flag and index + 1 < len(argv):
            found = str(argv[index + 1])
        elif item.startswith(flag + "="):
            found = item[len(flag) + 1 :]
    return found
