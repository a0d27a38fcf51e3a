"""Speed calibration: what one GPU of this host reads per second, and what one TP8 rank's slice
of one Kimi K2.6 MoE layer costs against the tokens of one step.

Usage:
  python3 module_utils/tuning/speed_calibration.py --out FILE [--gpu N]
      [--tokens 1,8,17,33,65,129,257]
      [--repeats R] [--deadline-s S]

It measures, on GPU N:
- copy_gbs: a device-to-device copy of a buffer far above L2 (4 GiB, less where less memory is
  free), counted as 2 x bytes / time (each byte read and written), the median of the repeats;
- read_gbs: a read-only reduction (a float32 sum) over the same buffer, bytes / time;
- per token count T, the time of one layer's routed experts on one TP8 rank: hidden 7168, 384
  experts of intermediate 2048 / 8 = 256, top-8, bf16 weights; gate_up, SiLU * mul and down as
  grouped GEMMs that read only the experts the step's routing touched. The routing is uniform
  top-8 of 384, drawn here from a fixed seed (the same experts on every machine), and the
  experts touched are counted from it. Before every timed step L2 is flushed (a buffer larger
  than L2 written, then another read, so the lines left in L2 are clean and evicting them
  costs the step no write-back), so the weights come from HBM as in a real decode step, where
  61 layers' experts pass through L2 between two visits of one layer. Times are CUDA events
  around the step alone, the median of the repeats.

The record it writes (--out, JSON; written beside and renamed into place) is what
module_utils/plan/speed_model.py reads in place of the profile's nominal figures; make_record()
and record_problems() in module_utils/tuning/speed_calibration_contract.py are its one
definition, with the arguments, the geometry and the routing. The same record goes to stdout as
one line, MARKER + JSON, which library/speed_calibration.py reads; a failure prints
ERROR_MARKER + JSON ({"error", "msg"}) instead and exits non-zero.

It runs where torch is and Ansible is not (the runtime's Python, or bare on any machine with a
CUDA torch): at the top it imports only the standard library and its contract, and torch inside
the functions that measure. Ansible packs both files with library/speed_calibration.py
(module_utils/tuning/speed_calibration_run.py imports them), which writes the contract's source
and this one's as one program into a private folder and runs it; in that program the contract's
text stands where the block between the `# -- contract` markers below imports it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# -- contract: imported here; in the program shipped its text stands in place of this block --
if __package__:
    from ansible.module_utils.tuning import speed_calibration_contract

    # One list of names below, whichever way the contract was found.
    sys.modules.setdefault("speed_calibration_contract", speed_calibration_contract)
else:  # run bare by path: the contract lies beside this file (also under python3 -I or -P)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from speed_calibration_contract import (  # noqa: F401
    DEFAULT_DEADLINE_S,
    DEFAULT_REPEATS,
    DEFAULT_TOKENS,
    DTYPE,
    ERROR_MARKER,
    EXIT_DEADLINE,
    EXIT_MEASURE,
    EXIT_MEMORY,
    EXIT_NO_GPU,
    EXIT_NO_TORCH,
    EXIT_USAGE,
    EXIT_WRITE,
    EXPERT_BYTES,
    EXPERTS,
    HIDDEN,
    INTERMEDIATE,
    KIND,
    MARKER,
    MAX_DEADLINE_S,
    MAX_REPEATS,
    MAX_TOKENS,
    MOE_GEOMETRY,
    MOE_INTERMEDIATE,
    SCHEMA,
    SEED,
    TOP_K,
    TP,
    WEIGHT_BYTES,
    CalibrationError,
    command_line,
    draw_routing,
    expected_touched,
    experts_touched,
    gbs,
    make_record,
    median,
    parse_args,
    parse_tokens,
    record_problems,
    utc_now,
    write_record,
)

# -- end of contract --

WARMUP = 3

# The copy buffer: far above any GPU's L2 (H200: 60 MB), clamped to free memory, never below
# MIN_COPY_BYTES (at 4 TB/s still 0.25 ms a copy, far above launch overhead).
COPY_BYTES = 4 << 30
MIN_COPY_BYTES = 512 << 20
# The L2 flush buffers are at least this (what triton's do_bench writes), else 4 x L2.
MIN_FLUSH_BYTES = 256 << 20
# Left free for the CUDA context's own allocations, cuBLAS workspaces, the graph pool.
RESERVE_BYTES = 1 << 30
# Lets the CPU queue the whole step behind the flush, so the timed span holds no launch gap.
SLEEP_CYCLES = 200_000

KERNEL_GROUPED = "torch._grouped_mm"
KERNEL_GROUPED_PUBLIC = "torch.nn.functional.grouped_mm"
KERNEL_LOOP = "per-expert torch.mm loop"
# Relative error allowed between the grouped GEMM and the per-expert reference (bf16 outputs,
# float32 accumulation in both, different summation order).
KERNEL_TOLERANCE = 0.02


# --------------------------------------------------------------------------------------------
# The measurement, with torch.


class Deadline:
    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def check(self, doing: str) -> None:
        if time.monotonic() > self.end:
            raise CalibrationError(
                "deadline",
                f"the run passed its deadline of {self.seconds:g} s while {doing}",
                "the whole run within --deadline-s",
                "raise --deadline-s, or measure fewer --tokens or --repeats; on a busy GPU, "
                "stop what else runs on it (nvidia-smi lists it)",
                EXIT_DEADLINE,
            )


def moe_bytes_needed(max_tokens: int, flush_bytes: int) -> int:
    """GPU memory of the MoE measurement: every expert's weights, the two flush buffers and the
    activations of the largest step (input, gate_up, activation, output, and a graph's copies)."""
    rows = max_tokens * TOP_K
    activations = rows * (HIDDEN + 2 * INTERMEDIATE + INTERMEDIATE + HIDDEN) * WEIGHT_BYTES
    return EXPERTS * EXPERT_BYTES + 2 * flush_bytes + 3 * activations


def check_memory(free: int, needed: int, gpu: int, name: str) -> None:
    if free < needed:
        raise CalibrationError(
            "memory",
            f"GPU {gpu} ({name}) has {free >> 20} MiB free",
            f"{needed >> 20} MiB free for the calibration (the MoE slice's weights, L2 flush "
            "buffers and the copy buffers)",
            "run it while nothing else holds the GPU: stop the server first (teardown.yml "
            "--tags server) or other processes nvidia-smi lists, or pick another --gpu",
            EXIT_MEMORY,
        )


def import_torch():
    try:
        import torch
    except Exception as exc:  # ImportError, or a torch that fails to load its libraries
        raise CalibrationError(
            "no_torch",
            f"{sys.executable} cannot import torch ({type(exc).__name__}: {exc})",
            "a Python with the CUDA build of PyTorch (the runtime's)",
            "run it with the runtime's Python (e.g. /opt/kimi/venv/bin/python), after the "
            "runtime stage",
            EXIT_NO_TORCH,
        ) from exc
    return torch


def open_gpu(torch, gpu: int):
    """The device and its properties; CalibrationError when torch has no such CUDA GPU."""
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        build = (
            "a CPU-only build"
            if torch.version.cuda is None
            else f"built for CUDA {torch.version.cuda}"
        )
        raise CalibrationError(
            "no_cuda",
            f"torch {torch.__version__} ({build}) sees no CUDA GPU",
            "a CUDA GPU that torch can use",
            "install the CUDA build of torch the server uses, check the driver (nvidia-smi) and "
            "CUDA_VISIBLE_DEVICES",
            EXIT_NO_GPU,
        )
    count = torch.cuda.device_count()
    if gpu >= count:
        raise CalibrationError(
            "no_cuda",
            f"--gpu is {gpu} and torch sees {count} GPU(s)",
            f"a GPU index from 0 to {count - 1}",
            "pass --gpu 0, or check CUDA_VISIBLE_DEVICES",
            EXIT_NO_GPU,
        )
    device = torch.device("cuda", gpu)
    torch.cuda.set_device(device)
    return device, torch.cuda.get_device_properties(device)


def time_steps(torch, step, repeats: int, deadline: Deadline, doing: str, before=None):
    """ms of each of `repeats` runs of step, by CUDA events around step alone; before() (the
    L2 flush) runs ahead of each one, untimed. WARMUP untimed runs first."""
    for _ in range(WARMUP):
        if before:
            before()
        step()
    torch.cuda.synchronize()
    deadline.check(doing)
    events = []
    for _ in range(repeats):
        if before:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    deadline.check(doing)
    return [start.elapsed_time(end) for start, end in events]


def measure_bandwidth(torch, device, copy_bytes: int, repeats: int, deadline: Deadline):
    """(copy ms samples, read ms samples) over a copy_bytes buffer."""
    src = torch.empty(copy_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    # Any bytes will do for a copy; for the sum, ones in every byte are a normal float32.
    src.fill_(1)
    words = src.view(torch.float32)
    copy_ms = time_steps(torch, lambda: dst.copy_(src), repeats, deadline, "timing the copy")
    # The sum's one-element result comes from the caching allocator: no cost in the timing.
    read_ms = time_steps(
        torch, lambda: torch.sum(words, dtype=torch.float32), repeats, deadline, "timing the read"
    )
    # The buffers go when this returns (the closures hold them until then).
    return copy_ms, read_ms


def grouped_mm_functions(torch) -> list:
    """The grouped GEMMs torch has, with their names: the public one first (newer torch), then
    the private one (torch 2.8 on)."""
    found = []
    for owner, name, label in (
        (torch.nn.functional, "grouped_mm", KERNEL_GROUPED_PUBLIC),
        (torch, "_grouped_mm", KERNEL_GROUPED),
    ):
        function = getattr(owner, name, None)
        if function is not None:
            found.append((function, label))
    return found


def moe_layout(torch, device, routing: list[list[int]]):
    """Rows sorted by expert (the token of each), and each expert's end row (int32, cumulative)
    as the grouped GEMM's offs takes them."""
    pairs = sorted((expert, token) for token, chosen in enumerate(routing) for expert in chosen)
    counts = [0] * EXPERTS
    for expert, _ in pairs:
        counts[expert] += 1
    ends, running = [], 0
    for count in counts:
        running += count
        ends.append(running)
    order = torch.tensor([token for _, token in pairs], dtype=torch.long, device=device)
    offs = torch.tensor(ends, dtype=torch.int32, device=device)
    spans = [(e, ends[e] - counts[e], ends[e]) for e in range(EXPERTS) if counts[e]]
    return order, offs, spans


def make_steps(torch, w13, w2, x_sorted, offs, spans, grouped):
    """The layer step two ways: the grouped GEMM over every expert's weights (empty groups are
    no work and read nothing), and the per-expert loop over the touched ones only."""
    silu = torch.nn.functional.silu
    w13_t, w2_t = w13.transpose(1, 2), w2.transpose(1, 2)

    def grouped_step():
        gate_up = grouped(x_sorted, w13_t, offs=offs)
        hidden = silu(gate_up[:, :INTERMEDIATE]) * gate_up[:, INTERMEDIATE:]
        return grouped(hidden, w2_t, offs=offs)

    def loop_step():
        out = torch.empty_like(x_sorted)
        for expert, first, end in spans:
            gate_up = torch.mm(x_sorted[first:end], w13_t[expert])
            hidden = silu(gate_up[:, :INTERMEDIATE]) * gate_up[:, INTERMEDIATE:]
            torch.mm(hidden, w2_t[expert], out=out[first:end])
        return out

    return grouped_step, loop_step


def choose_grouped(torch, candidates: list, operands: tuple) -> tuple:
    """The first grouped GEMM whose step agrees with the per-expert loop on operands (make_steps'
    w13, w2, x_sorted, offs, spans), as (function, name), or (None, None): the loop then runs."""
    want = None
    for function, name in candidates:
        grouped_step, loop_step = make_steps(torch, *operands, function)
        try:
            if want is None:
                want = loop_step()
            error = relative_error(torch, grouped_step(), want)
        except Exception as exc:  # an arch or build without the kernel, or other arguments
            print(f"{name} failed ({type(exc).__name__}: {exc})", file=sys.stderr)
            continue
        if error <= KERNEL_TOLERANCE:
            print(f"{name} agrees with the per-expert loop ({error:.2g})", file=sys.stderr)
            return function, name
        print(f"{name} disagrees with the per-expert loop ({error:.3g})", file=sys.stderr)
    return None, None


def relative_error(torch, got, want) -> float:
    scale = want.float().abs().max().item() or 1.0
    return (got.float() - want.float()).abs().max().item() / scale


def graphed(torch, step):
    """step captured as a CUDA graph (one launch, as SGLang replays decode steps), or None where
    capture fails (then the step runs eagerly)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        torch.cuda.synchronize()
    except Exception as exc:  # capture unsupported by a kernel: eager instead
        print(f"CUDA graph capture failed ({type(exc).__name__}: {exc}); eager", file=sys.stderr)
        torch.cuda.synchronize()
        return None
    return graph.replay


def measure_moe(torch, device, routings, repeats: int, deadline: Deadline, flush_bytes: int):
    """({tokens: ms samples}, kernel name, launch) for one rank's slice of one MoE layer."""
    generator = torch.Generator(device=device)
    generator.manual_seed(SEED)
    # Random weights at about the scale of trained ones: values do not change a GEMM's speed,
    # but zeros would draw less power than real data.
    w13 = torch.empty(EXPERTS, 2 * INTERMEDIATE, HIDDEN, dtype=torch.bfloat16, device=device)
    w13.normal_(0.0, 0.02, generator=generator)
    w2 = torch.empty(EXPERTS, HIDDEN, INTERMEDIATE, dtype=torch.bfloat16, device=device)
    w2.normal_(0.0, 0.02, generator=generator)
    # Written, then the other read: L2 ends up holding clean lines of `clean` only.
    dirty = torch.empty(flush_bytes, dtype=torch.uint8, device=device)
    clean = torch.zeros(flush_bytes // 4, dtype=torch.float32, device=device)
    sleep = getattr(torch.cuda, "_sleep", None)

    def flush():
        dirty.zero_()
        torch.sum(clean)
        if sleep is not None:
            sleep(SLEEP_CYCLES)

    candidates = grouped_mm_functions(torch)
    grouped, kernel = None, None
    verified = False
    graphs = True
    launches = set()
    samples = {}
    for tokens in sorted(routings):
        deadline.check(f"preparing {tokens} tokens")
        order, offs, spans = moe_layout(torch, device, routings[tokens])
        x = torch.empty(tokens, HIDDEN, dtype=torch.bfloat16, device=device)
        x.normal_(0.0, 1.0, generator=generator)
        x_sorted = x[order].contiguous()
        if not verified:
            # Once, on the first token count: a grouped GEMM must compute what the loop does
            # (offs read as each group's end row), or its times would be of something else.
            verified = True
            grouped, kernel = choose_grouped(torch, candidates, (w13, w2, x_sorted, offs, spans))
        grouped_step, loop_step = make_steps(torch, w13, w2, x_sorted, offs, spans, grouped)
        step = grouped_step if grouped is not None else loop_step
        kernel = kernel or KERNEL_LOOP
        # Once a capture failed, every later row runs eagerly too: one launch mode for all.
        replay = graphed(torch, step) if graphs else None
        graphs = replay is not None
        launches.add("cuda_graph" if graphs else "eager")
        samples[tokens] = time_steps(
            torch, replay or step, repeats, deadline, f"timing {tokens} tokens", before=flush
        )
    # A capture that failed after the first row leaves the rows before it graphed: "mixed".
    return samples, kernel, launches.pop() if len(launches) == 1 else "mixed"


def measure_gpu(args: argparse.Namespace, routings, deadline: Deadline) -> dict:
    """Everything make_record() needs, measured on --gpu with torch."""
    torch = import_torch()
    device, props = open_gpu(torch, args.gpu)
    free, _total = torch.cuda.mem_get_info(device)
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    flush_bytes = max(MIN_FLUSH_BYTES, 4 * l2)
    moe_needed = moe_bytes_needed(max(args.tokens), flush_bytes) + RESERVE_BYTES
    check_memory(free, max(moe_needed, 2 * MIN_COPY_BYTES + RESERVE_BYTES), args.gpu, props.name)
    copy_bytes = min(COPY_BYTES, (free - RESERVE_BYTES) // 2) // (1 << 20) * (1 << 20)
    deadline.check("opening the GPU")
    try:
        copy_ms, read_ms = measure_bandwidth(torch, device, copy_bytes, args.repeats, deadline)
        torch.cuda.empty_cache()
        moe_ms, kernel, launch = measure_moe(
            torch, device, routings, args.repeats, deadline, flush_bytes
        )
    except CalibrationError:
        raise
    except torch.cuda.OutOfMemoryError as exc:
        # Something else took memory after the check (another process starting on the GPU).
        raise CalibrationError(
            "memory",
            f"GPU {args.gpu} ran out of memory while measuring ({free >> 20} MiB were free at "
            f"the start; {exc})",
            f"{moe_needed >> 20} MiB free for the whole run",
            "run it while nothing else uses the GPU (nvidia-smi lists what does)",
            EXIT_MEMORY,
        ) from exc
    except Exception as exc:  # a CUDA or kernel error: said as such, not as a traceback
        raise CalibrationError(
            "measure",
            f"the measurement on GPU {args.gpu} ({props.name}) failed: {type(exc).__name__}: {exc}",
            "a GPU that runs torch's copies and GEMMs",
            "check the GPU's state (nvidia-smi, the kernel log for Xid errors) and run it "
            "again; if it repeats, report it with this output",
            EXIT_MEASURE,
        ) from exc
    return {
        "gpu": {
            "name": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "memory_mib": int(props.total_memory) >> 20,
        },
        "torch": torch.__version__,
        "copy_bytes": copy_bytes,
        "copy_ms": copy_ms,
        "read_ms": read_ms,
        "kernel": kernel,
        "launch": launch,
        "moe_ms": moe_ms,
        "l2_bytes": l2,
    }


# --------------------------------------------------------------------------------------------
# The program.


def summary_lines(record: dict, measured: dict) -> list[str]:
    """A table for people (stderr): each row's spread and the touched count's expectation."""
    lines = [
        f"GPU {record['gpu']['name']} (cc {record['gpu']['compute_capability']}, "
        f"{record['gpu']['memory_mib']} MiB), torch {record['torch']}",
        f"copy {record['copy_gbs']} GB/s, read {record['read_gbs']} GB/s over "
        f"{record['copy_bytes'] >> 20} MiB",
        f"MoE slice: {record['moe']['kernel']}, {record['moe']['launch']}, L2 flushed",
        "tokens  touched  expected  ms_median  ms_min  ms_max  GB/s_of_experts",
    ]
    for row in record["moe"]["rows"]:
        samples = measured["moe_ms"][row["tokens"]]
        lines.append(
            f"{row['tokens']:6d}  {row['experts_touched']:7d}  "
            f"{expected_touched(row['tokens']):8.1f}  {row['ms']:9.4f}  {min(samples):6.4f}  "
            f"{max(samples):6.4f}  {gbs(row['experts_touched'] * EXPERT_BYTES, row['ms']):8.1f}"
        )
    return lines


def fail(error: CalibrationError) -> int:
    print(ERROR_MARKER + json.dumps({"error": error.error, "msg": str(error)}))
    print(f"speed_calibration: {error}", file=sys.stderr)
    return error.code


def main(argv: list[str] | None = None, measure=measure_gpu) -> int:
    """measure(args, routings, deadline) -> the measurement make_record() takes; tests hand in
    one without torch."""
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        deadline = Deadline(args.deadline_s)
        routings = {tokens: draw_routing(tokens) for tokens in args.tokens}
        measured = measure(args, routings, deadline)
        record = make_record(measured, routings, command_line(args), utc_now())
        problems = record_problems(record)
        if problems:
            raise CalibrationError(
                "measure",
                "the measurement gave an unusable record: " + "; ".join(problems),
                "figures above 0 for every row",
                "run it again while nothing else uses the GPU; if it repeats, report it with "
                "this output",
                EXIT_MEASURE,
            )
        write_record(args.out, record)
    except CalibrationError as error:
        return fail(error)
    for line in summary_lines(record, measured):
        print(line, file=sys.stderr)
    print(MARKER + json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
