"""Speed calibration's contract: what the program takes (its arguments) and what it gives (the
record), with the MoE slice's geometry, the routing and the arithmetic both share. The first half
of one program (module_utils/tuning/speed_calibration.py is the second, which measures with torch):
the module reads the arguments' limits and checks the records it finds with this file alone.

make_record() and record_problems() are the record's one definition: module_utils/plan/
speed_model.py reads what they describe in place of the profile's nominal figures.

Standard library only, and nothing from the kit: module_utils/tuning/speed_calibration_run.py
ships this file's source and the program's as one program, and run bare the program imports it
from beside itself.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import shlex
import statistics

SCHEMA = 1
KIND = "kimi-speed-calibration"
MARKER = "SPEED_CALIBRATION "
ERROR_MARKER = "SPEED_CALIBRATION_ERROR "

# One TP8 rank's slice of one K2.6 MoE layer (the model's config.json: hidden_size 7168,
# n_routed_experts 384, moe_intermediate_size 2048, num_experts_per_tok 8). Under TP the
# experts' intermediate dimension is split across the ranks: each rank holds every expert.
HIDDEN = 7168
EXPERTS = 384
MOE_INTERMEDIATE = 2048
TP = 8
INTERMEDIATE = MOE_INTERMEDIATE // TP
TOP_K = 8
DTYPE = "bfloat16"
WEIGHT_BYTES = 2
SEED = 0
# What the MoE rows were measured on: written into every record and checked when one is read.
MOE_GEOMETRY = {
    "hidden": HIDDEN,
    "intermediate": INTERMEDIATE,
    "experts": EXPERTS,
    "top_k": TOP_K,
    "dtype": DTYPE,
    "weight_bytes": WEIGHT_BYTES,
    "l2_flushed": True,
    "seed": SEED,
}
# One expert's weights on one rank: gate and up (2 x intermediate x hidden) and down
# (hidden x intermediate).
EXPERT_BYTES = 3 * INTERMEDIATE * HIDDEN * WEIGHT_BYTES

# The token counts of the figures: 1 (a plain decode step), then 2^n + 1 (a DDTree
# verify of budget 2^n for one request) up to 257, where every expert is read.
DEFAULT_TOKENS = (1, 8, 17, 33, 65, 129, 257)
# Far past every DDTree budget times any batch the kit serves, and small enough that the
# activations stay a fraction of the weights.
MAX_TOKENS = 8192
DEFAULT_REPEATS = 20
MAX_REPEATS = 1000
DEFAULT_DEADLINE_S = 300.0
MAX_DEADLINE_S = 3600.0

EXIT_USAGE = 2
EXIT_NO_TORCH = 3
EXIT_NO_GPU = 4
EXIT_MEMORY = 5
EXIT_DEADLINE = 6
EXIT_MEASURE = 7
EXIT_WRITE = 8


class CalibrationError(Exception):
    """A failure the user can act on: what was found, what is needed, how to fix it."""

    def __init__(self, error: str, found: str, needed: str, fix: str, code: int):
        super().__init__(f"{found}. Needed: {needed}. Fix: {fix}")
        self.error = error
        self.code = code


# --------------------------------------------------------------------------------------------
# Arguments.


def parse_tokens(text: str) -> list[int]:
    """'1,8,17' -> [1, 8, 17] (sorted); CalibrationError naming what is wrong."""
    fix = "pass whole numbers separated by commas, e.g. --tokens 1,8,17,33,65,129,257"
    parts = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not part for part in parts):
        raise CalibrationError(
            "bad_tokens",
            f"--tokens is {text!r}, which has an empty entry",
            f"one or more token counts from 1 to {MAX_TOKENS}",
            fix,
            EXIT_USAGE,
        )
    values = []
    for part in parts:
        if not part.isdigit():
            raise CalibrationError(
                "bad_tokens",
                f"--tokens has {part!r}, which is not a whole number",
                f"token counts from 1 to {MAX_TOKENS}",
                fix,
                EXIT_USAGE,
            )
        values.append(int(part))
    bad = [value for value in values if not 1 <= value <= MAX_TOKENS]
    if bad:
        raise CalibrationError(
            "bad_tokens",
            f"--tokens has {', '.join(map(str, bad))}",
            f"token counts from 1 to {MAX_TOKENS} (tokens of one step)",
            fix,
            EXIT_USAGE,
        )
    repeated = sorted({value for value in values if values.count(value) > 1})
    if repeated:
        raise CalibrationError(
            "bad_tokens",
            f"--tokens names {', '.join(map(str, repeated))} more than once",
            "each token count once",
            "drop the repeats (--repeats sets how often each one is timed)",
            EXIT_USAGE,
        )
    return sorted(values)


class _Parser(argparse.ArgumentParser):
    """argparse that raises CalibrationError instead of printing usage and exiting, so every
    refusal goes out the same way (ERROR_MARKER line, exit EXIT_USAGE)."""

    def error(self, message):
        raise CalibrationError(
            "usage", message, "the arguments of --help", self.format_usage().strip(), EXIT_USAGE
        )


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = _Parser(
        prog="speed_calibration.py",
        description="Measure copy bandwidth and the K2.6 MoE layer time against tokens on one GPU.",
    )
    parser.add_argument("--out", required=True, help="where the record (JSON) is written")
    parser.add_argument("--gpu", type=int, default=0, help="CUDA device index (default 0)")
    parser.add_argument(
        "--tokens",
        default=",".join(map(str, DEFAULT_TOKENS)),
        help="token counts of one step, comma-separated (default %(default)s)",
    )
    parser.add_argument(
        "--repeats", type=int, default=DEFAULT_REPEATS, help="timed steps per figure"
    )
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=DEFAULT_DEADLINE_S,
        help="seconds the whole run may take (default %(default)s)",
    )
    args = parser.parse_args(argv)
    args.tokens = parse_tokens(args.tokens)
    if args.gpu < 0:
        raise CalibrationError(
            "usage",
            f"--gpu is {args.gpu}",
            "a CUDA device index, 0 or more",
            "pass --gpu 0 for the first GPU",
            EXIT_USAGE,
        )
    if not 1 <= args.repeats <= MAX_REPEATS:
        raise CalibrationError(
            "usage",
            f"--repeats is {args.repeats}",
            f"1 to {MAX_REPEATS} timed steps per figure",
            f"pass e.g. --repeats {DEFAULT_REPEATS}",
            EXIT_USAGE,
        )
    if not (math.isfinite(args.deadline_s) and 0 < args.deadline_s <= MAX_DEADLINE_S):
        raise CalibrationError(
            "usage",
            f"--deadline-s is {args.deadline_s:g}",
            f"seconds above 0, at most {MAX_DEADLINE_S:g}",
            f"pass e.g. --deadline-s {DEFAULT_DEADLINE_S:g}",
            EXIT_USAGE,
        )
    if not args.out or os.path.isdir(args.out):
        raise CalibrationError(
            "usage",
            f"--out is {args.out!r}, a folder" if args.out else "--out is empty",
            "the path of the record file",
            "pass e.g. --out speed-calibration.json",
            EXIT_USAGE,
        )
    return args


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this measurement (the output path left out: it is wherever
    the record is read from)."""
    return shlex.join(
        [
            "speed_calibration.py",
            "--gpu",
            str(args.gpu),
            "--tokens",
            ",".join(map(str, args.tokens)),
            "--repeats",
            str(args.repeats),
            "--deadline-s",
            f"{args.deadline_s:g}",
        ]
    )


# --------------------------------------------------------------------------------------------
# Routing and arithmetic, without torch.


def draw_routing(tokens: int, experts: int = EXPERTS, top_k: int = TOP_K, seed: int = SEED):
    """Each token's top_k distinct experts, uniform over all subsets, from a generator seeded by
    seed and the token count: a row's routing is the same whatever else is measured, on every
    machine and Python (str seeds hash the same everywhere)."""
    # Not for security: a reproducible draw of experts.
    rng = random.Random(f"kimi-moe-routing:{seed}:{tokens}")  # noqa: S311
    return [rng.sample(range(experts), top_k) for _ in range(tokens)]


def experts_touched(routing: list[list[int]]) -> int:
    return len({expert for chosen in routing for expert in chosen})


def expected_touched(tokens: int, experts: int = EXPERTS, top_k: int = TOP_K) -> float:
    """E (1 - (1 - k/E)^T): experts touched by T tokens of uniform top-k routing, on average."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def median(samples: list[float]) -> float:
    return float(statistics.median(samples))


def gbs(nbytes: float, ms: float) -> float:
    """GB/s of 1e9 bytes; 0 for a time that is not above 0 (which record_problems refuses)."""
    return nbytes / (ms * 1e-3) / 1e9 if ms > 0 else 0.0


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: UP017


# --------------------------------------------------------------------------------------------
# The record.


def make_record(
    measured: dict, routings: dict[int, list[list[int]]], command: str, measured_at: str
) -> dict:
    """The calibration record from a measurement: measured holds gpu, torch, copy_bytes, copy_ms
    and read_ms (samples), kernel, launch and moe_ms ({tokens: samples})."""
    rows = []
    for tokens in sorted(routings):
        samples = measured["moe_ms"][tokens]
        rows.append(
            {
                "tokens": tokens,
                "experts_touched": experts_touched(routings[tokens]),
                "ms": round(median(samples), 5),
                "repeats": len(samples),
            }
        )
    copy_bytes = measured["copy_bytes"]
    return {
        "schema": SCHEMA,
        "kind": KIND,
        "measured_at": measured_at,
        "gpu": dict(measured["gpu"]),
        "torch": measured["torch"],
        "command": command,
        "copy_gbs": round(gbs(2 * copy_bytes, median(measured["copy_ms"])), 1),
        "read_gbs": round(gbs(copy_bytes, median(measured["read_ms"])), 1),
        "copy_bytes": copy_bytes,
        "moe": {
            **MOE_GEOMETRY,
            "kernel": measured["kernel"],
            "launch": measured["launch"],
            "rows": rows,
        },
    }


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def record_problems(record) -> list[str]:
    """What is wrong with a record, [] for a good one: the program checks what it writes, the
    module what it finds on the host."""
    if not isinstance(record, dict):
        return [f"the record is a {type(record).__name__}, not a JSON object"]
    problems = []
    if record.get("schema") != SCHEMA:
        problems.append(f"schema is {record.get('schema')!r}, needed {SCHEMA}")
    if record.get("kind") != KIND:
        problems.append(f"kind is {record.get('kind')!r}, needed {KIND!r}")
    try:
        when = datetime.datetime.strptime(str(record.get("measured_at")), "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        when = None
    if when is None:
        problems.append(
            f"measured_at is {record.get('measured_at')!r}, needed ISO-8601 UTC "
            "(e.g. 2026-12-02T10:00:00Z)"
        )
    gpu = record.get("gpu")
    if not isinstance(gpu, dict):
        problems.append("gpu is missing (needed name, compute_capability, memory_mib)")
    else:
        if not isinstance(gpu.get("name"), str) or not gpu.get("name"):
            problems.append("gpu.name is missing")
        capability = gpu.get("compute_capability")
        if not isinstance(capability, str) or not _is_capability(capability):
            problems.append(f"gpu.compute_capability is {capability!r}, needed e.g. '9.0'")
        if not _whole(gpu.get("memory_mib")) or gpu["memory_mib"] <= 0:
            problems.append(f"gpu.memory_mib is {gpu.get('memory_mib')!r}, needed MiB above 0")
    for key in ("torch", "command"):
        if not isinstance(record.get(key), str) or not record.get(key):
            problems.append(f"{key} is missing")
    for key in ("copy_gbs", "read_gbs"):
        value = record.get(key)
        # A GPU copies from tens of GB/s (a PCIe card's share) to tens of TB/s, never above 1e5.
        if not _number(value) or not 0 < value < 1e5:
            problems.append(f"{key} is {value!r}, needed GB/s above 0 and below 100000")
    moe = record.get("moe")
    if not isinstance(moe, dict):
        problems.append("moe is missing")
        return problems
    for key, value in MOE_GEOMETRY.items():
        if moe.get(key) != value or type(moe.get(key)) is not type(value):
            problems.append(f"moe.{key} is {moe.get(key)!r}, needed {value!r}")
    rows = moe.get("rows")
    if not isinstance(rows, list) or not rows:
        problems.append("moe.rows is missing or empty")
        return problems
    last = 0
    for index, row in enumerate(rows):
        where = f"moe.rows[{index}]"
        if not isinstance(row, dict):
            problems.append(f"{where} is not an object")
            continue
        tokens, touched = row.get("tokens"), row.get("experts_touched")
        if not _whole(tokens) or not 1 <= tokens <= MAX_TOKENS:
            problems.append(f"{where}.tokens is {tokens!r}, needed 1 to {MAX_TOKENS}")
            continue
        if tokens <= last:
            problems.append(f"{where}.tokens is {tokens}, needed above the row before ({last})")
        last = tokens
        most = min(EXPERTS, tokens * TOP_K)
        if not _whole(touched) or not TOP_K <= touched <= most:
            problems.append(
                f"{where}.experts_touched is {touched!r}, needed {TOP_K} to {most} "
                f"for {tokens} tokens"
            )
        if not _number(row.get("ms")) or row["ms"] <= 0:
            problems.append(f"{where}.ms is {row.get('ms')!r}, needed milliseconds above 0")
        if not _whole(row.get("repeats")) or not 1 <= row["repeats"] <= MAX_REPEATS:
            problems.append(f"{where}.repeats is {row.get('repeats')!r}, needed 1 to {MAX_REPEATS}")
    return problems


def _is_capability(text: str) -> bool:
    major, dot, minor = text.partition(".")
    return bool(dot) and major.isdigit() and minor.isdigit()


def write_record(path: str, record: dict) -> None:
    """Written beside the target and renamed into place: a reader never sees half a record."""
    directory = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        os.makedirs(directory, exist_ok=True)
        with open(temporary, "w") as handle:
            json.dump(record, handle, indent=1)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except OSError as exc:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise CalibrationError(
            "write",
            f"cannot write {path} ({exc.strerror or exc})",
            f"a writable folder {directory}",
            "choose another --out, or run as a user that may write there",
            EXIT_WRITE,
        ) from exc
