"""One run of the speed calibration, as library/speed_calibration.py does it: the arguments
checked, the record on the host kept when it is good (so a second run changes nothing), else
module_utils/tuning/speed_calibration.py run with the runtime's Python under a deadline, its record
checked and written into place.

The program travels as this module's payload (its two files are imported here, so Ansible packs
them) and is written as one file, the contract's source then the program's, into a private
(0700) work folder, where the runtime's Python runs it: it needs torch, which the module's own
Python lacks. Everything the module must say comes back as
a dict for exit_json, or as CalibrationFailed, whose message and fields go to fail_json.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import tempfile
import time

from ansible.module_utils.host.helpers import (
    CommandFailed,
    atomic_write,
    command_environment,
    marked_json,
    run_with_deadline,
)
from ansible.module_utils.tuning import speed_calibration, speed_calibration_contract
from ansible.module_utils.tuning.speed_calibration_contract import (
    DEFAULT_REPEATS,
    ERROR_MARKER,
    MARKER,
    MAX_REPEATS,
    CalibrationError,
    parse_tokens,
    record_problems,
)

MAX_TIMEOUT_S = 3600
# The program stops itself this long before the module kills it, so that a slow run ends
# with its own message (what it was doing) rather than a kill.
PROGRAM_MARGIN_S = 30
# A record larger than this is no record this program wrote.
MAX_RECORD_BYTES = 1 << 20
OUTPUT_TAIL_LINES = 20


class CalibrationFailed(Exception):
    """The module fails: str() is its msg, fields the other keys of its result."""

    def __init__(self, msg: str, **fields):
        super().__init__(msg)
        self.fields = {"measured": False, **fields}


# The program's block that imports its contract, which the contract's own text replaces in the
# one program shipped.
CONTRACT_START = "# -- contract:"
CONTRACT_END = "# -- end of contract --\n"
FUTURE = "from __future__ import annotations\n"


def program_source() -> str:
    """The program shipped: the contract's source, then the program's without its import of the
    contract and without its __future__ line (which only the first statement of a file may be)."""
    contract = inspect.getsource(speed_calibration_contract)
    program = inspect.getsource(speed_calibration)
    head, found, rest = program.partition(CONTRACT_START)
    _, ended, tail = rest.partition(CONTRACT_END)
    if not (found and ended and FUTURE in head):
        raise RuntimeError("speed_calibration.py lost its contract markers or its __future__ line")
    return contract + "\n\n" + head.replace(FUTURE, "", 1) + tail


def validate(params: dict) -> list[int]:
    """The token counts; CalibrationFailed naming every bad parameter."""
    problems = []
    tokens: list[int] = []
    try:
        tokens = parse_tokens(",".join(str(value) for value in params["tokens"]))
    except CalibrationError as exc:
        problems.append(str(exc).replace("--tokens", "tokens"))
    if not 1 <= params["repeats"] <= MAX_REPEATS:
        problems.append(
            f"repeats is {params['repeats']}; needed: 1 to {MAX_REPEATS} (e.g. {DEFAULT_REPEATS})"
        )
    if params["gpu"] < 0:
        problems.append(f"gpu is {params['gpu']}; needed: a CUDA device index, 0 or more")
    if not PROGRAM_MARGIN_S < params["timeout"] <= MAX_TIMEOUT_S:
        problems.append(
            f"timeout is {params['timeout']}; needed: seconds above {PROGRAM_MARGIN_S} and at "
            f"most {MAX_TIMEOUT_S} (e.g. 600)"
        )
    if not os.path.isabs(params["record_file"]):
        problems.append(f"record_file is {params['record_file']!r}; needed: an absolute path")
    if problems:
        raise CalibrationFailed("; ".join(problems))
    return tokens


def read_record(path: str, warn) -> dict | None:
    """The record on the host, or None where there is none or it is not a good one (then it is
    measured again, with a warning saying why)."""
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_RECORD_BYTES + 1)
        record = json.loads(raw) if len(raw) <= MAX_RECORD_BYTES else None
    except (OSError, ValueError) as exc:
        warn(f"The calibration record {path} cannot be read ({exc}); it is measured again.")
        return None
    problems = record_problems(record) if record is not None else ["it is over 1 MiB"]
    if problems:
        warn(
            f"The calibration record {path} is not a usable record ({'; '.join(problems[:5])}); "
            "it is measured again."
        )
        return None
    return record


def resolve_python(requested: str, get_bin_path) -> str:
    """The runtime Python's path; get_bin_path(name) looks a bare name up on PATH."""
    binary = requested if os.path.sep in requested else get_bin_path(requested)
    if not binary or not os.path.isfile(binary) or not os.access(binary, os.X_OK):
        raise CalibrationFailed(
            f"python not found: {requested!r} is not an executable file (or not on PATH). "
            "Needed: the runtime virtual environment's Python, with the CUDA build of torch. "
            "Fix: run the runtime stage first, or set python to that environment's bin/python "
            "(e.g. /opt/kimi/venv/bin/python)."
        )
    return binary


def tail(text: str, lines: int = OUTPUT_TAIL_LINES) -> list[str]:
    return text.strip().splitlines()[-lines:]


def measure(params: dict, python: str, tokens: list[int]) -> tuple[dict, float]:
    """The program run once: (its record, seconds it took); CalibrationFailed with what it said
    when it failed, hung or left no usable record."""
    workdir = tempfile.mkdtemp(prefix="speed-calibration-")
    try:
        program = os.path.join(workdir, "speed_calibration.py")
        out = os.path.join(workdir, "record.json")
        with open(program, "w") as handle:
            handle.write(program_source())
        argv = [
            python,
            program,
            "--out",
            out,
            "--gpu",
            str(params["gpu"]),
            "--tokens",
            ",".join(map(str, tokens)),
            "--repeats",
            str(params["repeats"]),
            "--deadline-s",
            str(params["timeout"] - PROGRAM_MARGIN_S),
        ]
        env = command_environment()
        env["PYTHONUNBUFFERED"] = "1"
        started = time.monotonic()
        try:
            rc, stdout, stderr = run_with_deadline(
                argv,
                params["timeout"],
                env=env,
                what=f"speed_calibration's timeout={params['timeout']}s",
                shown=f"{python} speed_calibration.py",
            )
        except CommandFailed as exc:
            raise CalibrationFailed(
                f"{exc} Its own deadline ({params['timeout'] - PROGRAM_MARGIN_S}s) did not stop "
                "it either, so it was stuck in a GPU call: a GPU in a bad state, or one another "
                "process keeps busy. Fix: check nvidia-smi and the kernel log (Xid errors); "
                "raise timeout only if the host is merely slow.",
                timed_out=True,
            ) from exc
        elapsed = time.monotonic() - started
        said = {"rc": rc, "output_tail": tail(stderr)}
        error = marked_json(stdout, ERROR_MARKER)
        if error is not None:
            raise CalibrationFailed(
                f"The calibration with {python} failed: {error.get('msg')}",
                error=error.get("error"),
                **said,
            )
        if rc != 0:
            raise CalibrationFailed(
                f"`{python} speed_calibration.py` exited {rc} without saying why. It printed:\n"
                + "\n".join(tail(stdout + "\n" + stderr))
                + "\nFix: run it by hand (python3 module_utils/tuning/speed_calibration.py --out "
                "/tmp/calibration.json) and repair what it reports.",
                **said,
            )
        try:
            with open(out) as handle:
                record = json.load(handle)
        except (OSError, ValueError) as exc:
            record = marked_json(stdout, MARKER)
            if record is None:
                raise CalibrationFailed(
                    f"The calibration exited 0 but left no record ({exc}). Fix: run the module "
                    "again; if it repeats, report it with this output.",
                    **said,
                ) from exc
        problems = record_problems(record)
        if problems:
            raise CalibrationFailed(
                "The calibration's record is not usable: " + "; ".join(problems[:5]) + ". Fix: "
                "run it again while nothing else uses the GPU.",
                **said,
            )
        return record, elapsed
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def summary(record: dict) -> str:
    rows = ", ".join(
        f"{row['tokens']} tokens {row['ms']:.3f} ms ({row['experts_touched']} experts)"
        for row in record["moe"]["rows"]
    )
    return (
        f"{record['gpu']['name']} ({record['measured_at']}): copy {record['copy_gbs']} GB/s, "
        f"read {record['read_gbs']} GB/s; MoE slice ({record['moe']['kernel']}): {rows}"
    )


def run_calibration(params: dict, get_bin_path, warn, check_mode: bool) -> dict:
    """The module's whole run: exit_json's keys, or CalibrationFailed."""
    tokens = validate(params)
    path = params["record_file"]
    existing = read_record(path, warn)
    if existing is not None and not params["rerun"]:
        return {
            "changed": False,
            "measured": False,
            "record": existing,
            "record_file": path,
            "msg": f"Kept the record on the host; rerun: true measures again. {summary(existing)}",
        }
    if check_mode:
        return {
            "changed": True,
            "measured": False,
            "record": existing,
            "record_file": path,
            "msg": f"Would measure on GPU {params['gpu']} and write {path} (check mode).",
        }
    python = resolve_python(params["python"], get_bin_path)
    record, elapsed = measure(params, python, tokens)
    try:
        atomic_write(path, json.dumps(record, indent=1) + "\n", 0o644)
    except OSError as exc:
        raise CalibrationFailed(
            f"Cannot write the calibration record {path} ({exc}). Fix: make its folder "
            "writable by the user the task runs as (become: true), or choose another "
            "record_file.",
            record=record,
        ) from exc
    return {
        "changed": True,
        "measured": True,
        "record": record,
        "record_file": path,
        "elapsed_s": round(elapsed, 1),
        "msg": f"Measured. {summary(record)}",
    }
