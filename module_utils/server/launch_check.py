"""A launch argv checked by the installed runtime's own parser, before the server (re)starts.

The probe (module_utils/server/launch_probe.py) runs in the runtime's Python, so the parser is the
one
that will read argv: sglang's `ServerArgs.add_cli_args`, and where constructing the record is
model-free, the whole of `sglang.srt.server_args.prepare_server_args` (`--config` merging,
parsing, `from_cli_args`).

- sglang 0.5.23 resolves lazily (`ServerArgs.resolve_once`; `__post_init__` does nothing), so
  prepare_server_args() reads no model config and touches no GPU: the probe calls it whole.
- DDTree's pull request (29907) is based on a main branch whose `ServerArgs.__post_init__`
  resolves at construction: it asks the GPU for its memory (get_device_memory_capacity) and reads
  the model's and drafter's configs. There the probe stops after the runtime's own argparse
  parser (add_cli_args, and its own ConfigArgumentMerger for `--config`).

Either way the runtime's parser decides which flags exist and what their values must be. The
config-free launch rules (module_utils/plan/sglang_args.py RULES: the release's DFlash checks and
the
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

import inspect
import json
import re

from ansible.module_utils.host.helpers import CommandFailed, DeadlineRunner, marked_json
from ansible.module_utils.plan.sglang_args import RULES, ArgvError, launch_rule_errors
from ansible.module_utils.server import launch_probe


# The probe is module_utils/server/launch_probe.py, a program of its own so that ruff lints it and
# tests
# import it. Importing it here makes Ansible ship it in launch_check's payload (no file to copy,
# no parameter naming one); it runs from its source in the runtime's Python, which has sglang
# and no Ansible. check_launch() reads its MARKER line back with marked_json().
def probe_source() -> str:
    return inspect.getsource(launch_probe)


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


# The launch check's arguments: launch_check's own, and server_inspect's `launch`.
LAUNCH_SPEC = {
    "argv": {"type": "list", "elements": "str", "required": True},
    "secrets_file": {"type": "str", "default": ""},
    "name": {"type": "str", "default": ""},
    "timeout": {"type": "int", "default": 300},
}


class LaunchRefused(Exception):
    """The check could not run, or the runtime would refuse the launch: the message, and the
    facts (ok, mode, version, errors, flags) when the parser answered."""

    def __init__(self, msg: str, facts: dict | None = None):
        super().__init__(msg)
        self.facts = facts or {}


def check_launch(python: str, argv: list, secrets_file: str, name: str, timeout: int) -> dict:
    """The runtime's parser on the launch argv, in the runtime's Python (launch_check, and
    server_inspect's `launch`): its facts, or LaunchRefused naming the flag and the fix."""
    if timeout < 1:
        raise LaunchRefused(f"timeout must be at least 1 s, got {timeout}")
    args = probe_argv(argv, secrets_file)
    # The probe's own alarm comes first, so its report (the stage it was in) is what a slow
    # runtime gets; the kill only covers what the alarm cannot interrupt.
    grace = min(15.0, 1 + timeout / 10)
    try:
        rc, out, err = DeadlineRunner(
            timeout + grace, f"launch_check's timeout={timeout}s + {grace:g}s"
        )(
            [python, "-c", probe_source(), str(timeout)],
            data=json.dumps(args) + "\n",
            shown=f"{python} -c <launch probe> {timeout}",
        )
    except CommandFailed as exc:
        raise LaunchRefused(
            f"{exc} The runtime's parser did not answer and ignored the probe's own alarm "
            "(a hang in native code, e.g. CUDA initialisation at import). Fix: run "
            f"`{python} -c 'import sglang.srt.server_args'` on the host and look at what "
            "it waits for."
        ) from None
    result = marked_json(out, launch_probe.MARKER)
    if result is None:
        raise LaunchRefused(
            f"could not run the launch check in {python} (exit {rc}): "
            f"{(err or out).strip()[-1500:]}. Is the runtime installed? The runtime stage "
            "creates it; rerun the deploy."
        )
    errors = errors_of(result, args)
    facts = {
        "ok": not errors,
        "mode": result.get("mode"),
        "version": result.get("version"),
        "errors": [str(e) for e in errors],
        "flags": [e.flag for e in errors if e.flag],
    }
    if errors:
        config = f" of serving config {name}" if name else ""
        flags = ", ".join(facts["flags"]) or "(none named)"
        raise LaunchRefused(
            f"sglang {result.get('version')} at {python} would refuse the launch{config} "
            f"(flags: {flags}): " + "; ".join(facts["errors"]) + ". The running server was "
            "left as it is. Fix: correct or remove the flag (in kimi_server_settings.extra_args "
            "if you added it there, else in the serving config's args).",
            facts,
        )
    return facts
