"""A speed model of one SGLang decode step: what a healthy run should show before it runs.

For a model (its config.json and its drafter's), a hardware profile, a serving config and a
concurrency, the decode step time is the sum of its parts, each shown with what it reads,
what it computes and which of the two bounds it:

- dense_weights: every weight a step reads once (attention, norms, the dense MLP layers, the
  shared experts, the router, the LM head) per TP rank, over the copy bandwidth times the
  share a large GEMV reaches, or its FLOPs over the BF16 peak where that is longer.
- routed_experts: per MoE layer, the routed experts that T verified tokens touch,
  E * (1 - (1 - k/E)^T) of E with k per token, times one rank's slice of an expert (INT4 with
  its group scales where quantized), over the bandwidth the grouped GEMM reaches, plus a fixed
  cost per layer; both fitted to a measured MoE layer (calibration record or the profile's).
  T is every token the step verifies: the batch times 1 (AR), the draft tokens (EAGLE-3 chain),
  the block size (DFlash) or budget + 1 (DDTree), so on an MoE target a wider tree reads more
  experts until it reads them all.
- kv_cache: the KV cache each request's context reads per step (MLA's latent is not split
  over ranks); on a hybrid target also the recurrent state.
- allreduce: two TP all-reduces a layer of the step's hidden states, each a latency plus the
  message over the bus bandwidth (the host's measured all-reduce table where the tuning stage
  has one, else the profile's figure).
- drafter: the drafter's own forward (one DFlash block, or EAGLE-3's steps), its weights, the
  LM head it projects through and its all-reduces.
- tree_build: DDTree's per-request tree and mask, built on the CPU per step.
- overhead: a fixed per-step cost, plus the scheduler's when overlap scheduling is off.

Accepted tokens per step come from the drafter's published acceptance length per prompt set
(models/<model>/acceptance.json), capped by what one step can accept. For DDTree the chain's
acceptance gives a per-position rate a (1 + a + ... + a^D = the chain's length), and the tree
is built best first under its budget with a geometric rank model (the drafter's r-th choice is
right with a * (1 - a)^(r - 1)), so the expected accepted tokens are 1 plus the path
probabilities of the nodes the budget buys, capped at the block size.

Every hardware figure is data with its source (group_vars/all/speed_hardware.json); a host's
calibration record (--tags calibrate) replaces the measured ones. Standard library only: it
runs bare, `python3 module_utils/plan/speed_model.py --help`, and its `moe` subcommand predicts one
MoE layer. docs/speed-model.md gives every formula, what the model ignores and how far it was
off on the measurements it has.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import sys
from pathlib import Path

try:
    from ansible.module_utils.plan import capacity
except ImportError:
    try:  # imported from the repository root as module_utils.plan.speed_model (the analysis)
        from ansible.module_utils.plan import capacity  # type: ignore[no-redef]
    except ImportError:  # run bare: python3 module_utils/plan/speed_model.py
        import capacity  # type: ignore[no-redef]

HARDWARE_FILE = Path(__file__).resolve().parents[2] / "group_vars" / "all" / "speed_hardware.json"
HARDWARE_KEY = "kimi_speed_hardware"
HARDWARE_FIELDS = (
    "hbm_gbs",
    "copy_gbs",
    "bf16_tflops",
    "int4_tflops",
    "allreduce_busbw_gbs",
    "allreduce_latency_us",
    "gemm_bandwidth_efficiency",
    "moe_layer_overhead_us",
    "dense_bandwidth_efficiency",
    "step_overhead_ms",
    "scheduler_overhead_ms",
    "tree_build_us_per_request",
    "host_mask_gbs",
)
# Fields that are shares, not rates: (0, 1].
SHARE_FIELDS = ("gemm_bandwidth_efficiency", "dense_bandwidth_efficiency")
CALIBRATION_KIND = "kimi-speed-calibration"
CALIBRATION_SCHEMA = 1
ALGORITHMS = ("AR", "EAGLE3", "DFLASH", "DDTREE")
BF16 = 2
ALLREDUCES_PER_LAYER = 2  # after attention and after the MLP/MoE (o_proj, down_proj)
# DDTree's width cap per tree level (SGLANG_DDTREE_MAX_TOPK's default in pull request 29907).
DDTREE_MAX_TOPK = 6
# Bounds far above any real figure: a value past them is a typo or an attack, not hardware.
MAX_TOKENS = 1 << 24
MAX_CONCURRENCY = 1 << 16
MAX_CONTEXT = 1 << 24
MAX_RATE = 1e7  # GB/s, TFLOPS, us or ms
MAX_EXPERTS = 1 << 16
MAX_WIDTH = 1 << 20
MAX_BUDGET = 4096
MAX_ROWS = 1024
MAX_FILE_BYTES = 1 << 22


class SpeedModelError(ValueError):
    """Bad input, said as what was found, what is needed and how to fix it."""


def _number(value, name: str, *, low: float = 0.0, high: float = MAX_RATE, integer=False):
    """A finite number within (low, high], not a bool; an integer where asked."""
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        needed = "an integer" if integer else "a number"
        raise SpeedModelError(
            f"{name} is {value!r} ({type(value).__name__}); needed: {needed} above {low:g} and at "
            f"most {high:g}. Fix: give {name} as {needed}."
        )
    if not (math.isfinite(value) and low < value <= high):
        raise SpeedModelError(
            f"{name} is {value!r}; needed: above {low:g} and at most {high:g}. Fix: give a real "
            f"figure for {name}."
        )
    return value


# --------------------------------------------------------------------------------------------
# One MoE layer.


def experts_touched(tokens: int, experts: int, top_k: int) -> float:
    """Expected distinct experts that `tokens` tokens routed top-k uniformly touch."""
    _number(tokens, "tokens", high=MAX_TOKENS, integer=True)
    _number(experts, "experts", high=MAX_EXPERTS, integer=True)
    _number(top_k, "top_k", high=MAX_EXPERTS, integer=True)
    if top_k > experts:
        raise SpeedModelError(
            f"top_k {top_k} is more than the {experts} experts; needed: top_k <= experts. Fix: "
            "give the model's num_experts_per_tok and n_routed_experts."
        )
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def moe_layer(
    tokens: int,
    experts: int,
    top_k: int,
    hidden: int,
    intermediate: int,
    weight_bytes: float,
    bandwidth_gbs: float,
    efficiency: float = 1.0,
    overhead_us: float = 0.0,
    tflops: float | None = None,
) -> dict:
    """One MoE layer's routed experts for one step: `intermediate` is one expert's as it is
    read (one rank's slice under TP), `weight_bytes` per weight (2 for BF16, 0.5625 for INT4
    with a BF16 scale per 32), the bandwidth the copy reaches and the grouped GEMM's share of
    it. Time is the bytes read over that, or the FLOPs over `tflops` where longer, plus the
    fixed cost per layer."""
    touched = experts_touched(tokens, experts, top_k)
    _number(hidden, "hidden", high=MAX_WIDTH, integer=True)
    _number(intermediate, "intermediate", high=MAX_WIDTH, integer=True)
    _number(weight_bytes, "weight_bytes", high=64)
    _number(bandwidth_gbs, "hbm_gbs")
    _number(efficiency, "efficiency", high=1.0)
    if isinstance(overhead_us, bool) or not isinstance(overhead_us, (int, float)):
        raise SpeedModelError(f"overhead_us is {overhead_us!r}; needed: a number >= 0.")
    if not (math.isfinite(overhead_us) and 0 <= overhead_us <= MAX_RATE):
        raise SpeedModelError(f"overhead_us is {overhead_us!r}; needed: >= 0 and finite.")
    expert_params = 3 * hidden * intermediate  # gate, up and down projections
    bytes_read = touched * expert_params * weight_bytes
    memory_ms = bytes_read / (bandwidth_gbs * efficiency * 1e9) * 1e3
    flops = 2.0 * tokens * top_k * expert_params
    compute_ms = flops / (_number(tflops, "tflops") * 1e12) * 1e3 if tflops else 0.0
    return {
        "tokens": tokens,
        "experts_touched": round(touched, 3),
        "all_experts_read": touched >= experts - 0.5,
        "bytes_read": round(bytes_read),
        "memory_ms": round(memory_ms, 4),
        "compute_ms": round(compute_ms, 4),
        "bound": "compute" if compute_ms > memory_ms else "memory",
        "step_ms": round(max(memory_ms, compute_ms) + overhead_us / 1e3, 4),
    }


# --------------------------------------------------------------------------------------------
# Hardware figures: the profile's data, a host's calibration and all-reduce measurements.


def load_hardware(path: Path | str | None = None) -> dict:
    """Every profile's figures from the data file, each checked."""
    path = Path(path or HARDWARE_FILE)
    data = read_json(path, "the hardware figures")
    profiles = data.get(HARDWARE_KEY) if isinstance(data, dict) else None
    if not isinstance(profiles, dict) or not profiles:
        raise SpeedModelError(
            f"{path} holds no {HARDWARE_KEY} mapping of profiles; needed: "
            f'{{"{HARDWARE_KEY}": {{"<profile>": {{...}}}}}}. Fix: restore the file from the kit.'
        )
    return {name: check_profile(name, figures) for name, figures in profiles.items()}


def check_profile(name: str, figures) -> dict:
    if not isinstance(figures, dict):
        raise SpeedModelError(f"hardware profile {name!r} is {figures!r}; needed: a mapping.")
    checked = {"profile": name, "gpu": str(figures.get("gpu", name))[:200]}
    interconnect = figures.get("interconnect")
    if interconnect not in ("nvlink", "pcie"):
        raise SpeedModelError(
            f"hardware profile {name!r} has interconnect {interconnect!r}; needed: nvlink or "
            "pcie. Fix: set it in the hardware figures."
        )
    checked["interconnect"] = interconnect
    sources = {}
    for field in HARDWARE_FIELDS:
        entry = figures.get(field)
        if not isinstance(entry, dict) or "value" not in entry:
            raise SpeedModelError(
                f"hardware profile {name!r} has no {field} figure; needed: "
                f'{{"value": <number>, "source": "<where it comes from>"}}. Fix: add it.'
            )
        high = 1.0 if field in SHARE_FIELDS else MAX_RATE
        checked[field] = float(_number(entry["value"], f"{name}.{field}", high=high))
        source = entry.get("source")
        if not isinstance(source, str) or not source.strip():
            raise SpeedModelError(
                f"hardware profile {name!r}'s {field} has no source; needed: where the figure "
                "comes from. Fix: add its source."
            )
        sources[field] = source[:500]
    checked["sources"] = sources
    return checked


def profile_figures(profile: str, hardware: dict | None = None) -> dict:
    hardware = hardware if hardware is not None else load_hardware()
    if not isinstance(profile, str) or profile not in hardware:
        raise SpeedModelError(
            f"hardware profile {profile!r} is not known; needed: one of "
            f"{', '.join(sorted(hardware))}. Fix: set kimi_profile (inventory) or --profile."
        )
    figures = dict(hardware[profile])
    figures["sources"] = dict(figures["sources"])
    return figures


def read_json(path: Path, what: str):
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise SpeedModelError(
            f"{what} could not be read from {path}: {error.strerror or error}. Fix: give a "
            "readable file."
        ) from None
    if len(raw) > MAX_FILE_BYTES:
        raise SpeedModelError(
            f"{what} at {path} is over {MAX_FILE_BYTES} bytes; needed: a small JSON file. Fix: "
            "give the file the kit wrote."
        )
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise SpeedModelError(
            f"{what} at {path} is not JSON ({error}). Fix: give the file the kit wrote."
        ) from None


def fit_moe_rows(rows, copy_gbs: float, hidden: int, intermediate: int, weight_bytes: float):
    """Least squares of a measured MoE layer's time against the expert bytes it read:
    (overhead in us, share of the copy bandwidth) that the model then uses."""
    points = []
    for row in rows:
        touched = _number(row.get("experts_touched"), "experts_touched", high=MAX_EXPERTS)
        ms = _number(row.get("ms"), "ms")
        points.append((touched * 3 * hidden * intermediate * weight_bytes / 1e9, ms))
    if len(points) < 2 or len({x for x, _ in points}) < 2:
        raise SpeedModelError(
            f"the calibration's MoE rows give {len(points)} distinct point(s); needed: two or "
            "more token counts. Fix: rerun the calibration with its default --tokens."
        )
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum(
        (x - mean_x) ** 2 for x, _ in points
    )
    if slope <= 0:
        raise SpeedModelError(
            "the calibration's MoE times do not grow with the bytes read; needed: a measurement "
            "on an idle GPU. Fix: rerun the calibration with nothing else on the GPU."
        )
    intercept = max(0.0, mean_y - slope * mean_x)
    # slope is ms per GB: 1e3 / (share x copy_gbs).
    share = min(1.0, 1e3 / (slope * copy_gbs))
    return round(intercept * 1e3, 2), round(share, 4)


def check_calibration(record) -> dict:
    """A calibration record (module_utils/tuning/speed_calibration.py) read from a host: every field
    the model uses type-checked and bounded."""
    if not isinstance(record, dict) or record.get("kind") != CALIBRATION_KIND:
        raise SpeedModelError(
            f"the calibration record is not a {CALIBRATION_KIND} record; needed: the file "
            "--tags calibrate writes. Fix: run the calibration again."
        )
    if record.get("schema") != CALIBRATION_SCHEMA:
        raise SpeedModelError(
            f"the calibration record has schema {record.get('schema')!r}; needed: "
            f"{CALIBRATION_SCHEMA}. Fix: run the calibration again with this kit."
        )
    copy_gbs = _number(record.get("copy_gbs"), "copy_gbs")
    moe = record.get("moe")
    if not isinstance(moe, dict) or not isinstance(moe.get("rows"), list):
        raise SpeedModelError("the calibration record has no moe rows; needed: moe.rows[].")
    rows = moe["rows"]
    if not 2 <= len(rows) <= MAX_ROWS or not all(isinstance(row, dict) for row in rows):
        raise SpeedModelError(
            f"the calibration record has {len(rows)} moe rows; needed: 2 to {MAX_ROWS} mappings."
        )
    hidden = _number(moe.get("hidden"), "moe.hidden", high=MAX_WIDTH, integer=True)
    intermediate = _number(
        moe.get("intermediate"), "moe.intermediate", high=MAX_WIDTH, integer=True
    )
    weight_bytes = _number(moe.get("weight_bytes"), "moe.weight_bytes", high=64)
    overhead_us, share = fit_moe_rows(rows, copy_gbs, hidden, intermediate, weight_bytes)
    gpu = record.get("gpu") if isinstance(record.get("gpu"), dict) else {}
    return {
        "copy_gbs": float(copy_gbs),
        "moe_layer_overhead_us": overhead_us,
        "gemm_bandwidth_efficiency": share,
        "gpu": str(gpu.get("name", "?"))[:200],
        "measured_at": str(record.get("measured_at", "?"))[:64],
    }


def apply_calibration(figures: dict, record) -> dict:
    """The profile's figures with a host's measured ones in place of nominal ones."""
    calibration = check_calibration(record)
    figures = dict(figures, sources=dict(figures["sources"]))
    where = f"this host's calibration ({calibration['gpu']}, {calibration['measured_at']})"
    for field in ("copy_gbs", "moe_layer_overhead_us", "gemm_bandwidth_efficiency"):
        figures[field] = calibration[field]
        figures["sources"][field] = where
    return figures


def allreduce_table(measurement) -> list[tuple[int, float]]:
    """(bytes, time in us) rows of a host's all-reduce check (tuning stage), sorted."""
    results = measurement.get("results") if isinstance(measurement, dict) else measurement
    if not isinstance(results, list) or not 1 <= len(results) <= MAX_ROWS:
        raise SpeedModelError(
            "the all-reduce measurement has no results rows; needed: the all-reduce check's "
            "record (results: [{bytes, time_us}]). Fix: run the tuning stage's check."
        )
    rows = []
    for row in results:
        if not isinstance(row, dict):
            raise SpeedModelError(f"an all-reduce row is {row!r}; needed: {{bytes, time_us}}.")
        size = _number(row.get("bytes"), "all-reduce bytes", high=1 << 40, integer=True)
        rows.append((size, float(_number(row.get("time_us"), "all-reduce time_us"))))
    return sorted(rows)


def apply_allreduce(figures: dict, measurement, source: str) -> dict:
    figures = dict(figures, sources=dict(figures["sources"]))
    figures["allreduce_table"] = allreduce_table(measurement)
    figures["sources"]["allreduce"] = source[:500]
    return figures


def allreduce_us(figures: dict, message_bytes: float, ranks: int) -> float:
    """One all-reduce of `message_bytes` over `ranks` GPUs: the measured table interpolated
    (below its smallest size, the smallest size's time: latency bound), else the latency plus
    the message over the bus bandwidth (bus bandwidth = algorithm bandwidth x 2(n-1)/n)."""
    if ranks <= 1:
        return 0.0
    table = figures.get("allreduce_table")
    if table:
        if message_bytes <= table[0][0]:
            return table[0][1]
        for (low_size, low_us), (high_size, high_us) in itertools.pairwise(table):
            if message_bytes <= high_size:
                share = (message_bytes - low_size) / (high_size - low_size)
                return low_us + share * (high_us - low_us)
        size, us = table[-1]
        return us * message_bytes / size
    bus_factor = 2.0 * (ranks - 1) / ranks
    transfer_us = message_bytes * bus_factor / (figures["allreduce_busbw_gbs"] * 1e9) * 1e6
    return figures["allreduce_latency_us"] + transfer_us


# --------------------------------------------------------------------------------------------
# Serving configs: what a launch verifies per step.


def _int_flag(argv: list, name: str, default: int | None) -> int | None:
    value = capacity.flag_value(argv, name)
    if value is None:
        return default
    try:
        number = int(str(value))
    except ValueError:
        raise SpeedModelError(
            f"{name} is {value!r} in the launch; needed: an integer. Fix: the serving "
            "config's args."
        ) from None
    return _number(number, name, high=MAX_TOKENS, integer=True)


def spec_from_argv(argv) -> dict:
    """The speculative shape of a rendered launch (serving.py's argv): the algorithm, the
    tokens each request verifies per step and what bounds its acceptance."""
    if not isinstance(argv, (list, tuple)) or not all(
        isinstance(item, (str, int, float)) and not isinstance(item, bool) for item in argv
    ):
        raise SpeedModelError(f"the launch argv is {argv!r}; needed: a list of strings.")
    argv = [str(item) for item in argv]
    algorithm = (capacity.flag_value(argv, "--speculative-algorithm") or "AR").upper()
    if algorithm == "EAGLE":
        algorithm = "EAGLE3"
    overlap = "--disable-overlap-schedule" not in argv
    if algorithm == "AR":
        return spec("AR", overlap=overlap)
    if algorithm == "EAGLE3":
        steps = _int_flag(argv, "--speculative-num-steps", 3)
        topk = _int_flag(argv, "--speculative-eagle-topk", 1)
        draft = _int_flag(argv, "--speculative-num-draft-tokens", steps + 1)
        return spec("EAGLE3", draft_tokens=draft, steps=steps, topk=topk, overlap=overlap)
    block = _int_flag(argv, "--speculative-dflash-block-size", None)
    block = block or _int_flag(argv, "--speculative-num-draft-tokens", 8)
    if algorithm == "DFLASH":
        return spec("DFLASH", draft_tokens=block, overlap=overlap)
    if algorithm == "DDTREE":
        budget = _int_flag(argv, "--speculative-ddtree-budget", None)
        if budget is None:
            raise SpeedModelError(
                "a DDTREE launch has no --speculative-ddtree-budget; needed: the budget. Fix: "
                "the ddtree config's budget_flag."
            )
        return spec("DDTREE", draft_tokens=block, budget=budget, overlap=False)
    raise SpeedModelError(
        f"speculative algorithm {algorithm!r} is not modelled; needed: one of "
        f"{', '.join(ALGORITHMS)} (or none). Fix: predict one of those."
    )


def spec(
    algorithm: str,
    *,
    draft_tokens: int | None = None,
    steps: int | None = None,
    topk: int = 1,
    budget: int | None = None,
    overlap: bool = True,
) -> dict:
    """A serving config's step shape. verify_tokens: tokens per request the target verifies
    in one step; max_accept: the most one step can accept (drafted + the bonus token)."""
    if algorithm not in ALGORITHMS:
        raise SpeedModelError(
            f"algorithm {algorithm!r} is not modelled; needed: one of {', '.join(ALGORITHMS)}."
        )
    if algorithm == "AR":
        return {"algorithm": "AR", "verify_tokens": 1, "max_accept": 1, "overlap": overlap}
    draft = _number(draft_tokens, "draft tokens", high=MAX_BUDGET, integer=True)
    if algorithm == "EAGLE3":
        steps = _number(steps if steps is not None else draft - 1, "steps", high=64, integer=True)
        topk = _number(topk, "topk", high=64, integer=True)
        return {
            "algorithm": "EAGLE3",
            "verify_tokens": draft,
            "max_accept": min(draft, steps + 1),
            "steps": steps,
            "topk": topk,
            "overlap": overlap,
        }
    if algorithm == "DFLASH":
        return {
            "algorithm": "DFLASH",
            "verify_tokens": draft,
            "max_accept": draft,
            "block_size": draft,
            "overlap": overlap,
        }
    budget = _number(budget, "budget", high=MAX_BUDGET, integer=True)
    return {
        "algorithm": "DDTREE",
        # The verify batch is padded to budget + 1 whatever the early stop drops (PR 29907).
        "verify_tokens": budget + 1,
        "max_accept": draft,
        "block_size": draft,
        "budget": budget,
        "overlap": False,
    }


# --------------------------------------------------------------------------------------------
# Acceptance.


def load_acceptance(model_dir: Path | str) -> dict:
    """A model folder's published acceptance lengths by drafter and prompt set."""
    path = Path(model_dir) / "acceptance.json"
    if not path.exists():
        return {}
    data = read_json(path, "the published acceptance")
    if not isinstance(data, dict):
        raise SpeedModelError(f"{path} is not a mapping of drafters.")
    checked = {}
    for drafter, entry in data.items():
        lengths = entry.get("accept_length") if isinstance(entry, dict) else None
        if not isinstance(lengths, dict):
            raise SpeedModelError(f"{path}: {drafter} has no accept_length mapping.")
        checked[drafter] = {
            "source": str(entry.get("source", ""))[:500],
            "accept_length": {
                str(name): float(_number(value, f"{drafter}.{name}", high=MAX_BUDGET))
                for name, value in lengths.items()
            },
        }
    return checked


def published_acceptance(acceptance: dict, drafter: str, prompt_set: str | None):
    """(length, source) for a prompt set: its own figure, else the mean of the drafter's
    figures (said so), else (None, why)."""
    entry = acceptance.get(drafter)
    if not entry or not entry["accept_length"]:
        return None, f"no published acceptance for the {drafter} drafter"
    lengths = entry["accept_length"]
    if prompt_set in lengths:
        return lengths[prompt_set], f"{entry['source']} ({prompt_set})"
    if "default" in lengths:
        return lengths["default"], f"{entry['source']} (no prompt set given)"
    mean = sum(lengths.values()) / len(lengths)
    return mean, (
        f"{entry['source']}: mean over {', '.join(sorted(lengths))} "
        f"(no figure for {prompt_set or 'an unnamed prompt set'})"
    )


def chain_rate(length: float, drafted: int) -> float:
    """Per-position acceptance a with 1 + a + ... + a^drafted = length (the chain's expected
    accepted tokens with the bonus token), by bisection."""
    length = min(max(length, 1.0), drafted + 1.0)
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if sum(mid**d for d in range(drafted + 1)) < length:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def tree_acceptance(rate: float, budget: int, depth: int, max_width: int = DDTREE_MAX_TOPK):
    """Expected accepted tokens of a best-first tree of `budget` drafted nodes, depth at most
    `depth`, at most `max_width` children a node, when the drafter's r-th choice at a position
    is right with rate * (1 - rate)^(r - 1): 1 (the bonus token) plus the path probabilities
    of the nodes chosen (the nodes with the largest ones, as DDTree picks them)."""
    if budget <= 0 or depth <= 0 or rate <= 0:
        return 1.0
    miss = 1.0 - rate
    # (negative path probability, depth, rank, parent path probability)
    frontier = [(-rate, 1, 1, 1.0)]
    total = 1.0
    for _ in range(budget):
        if not frontier:
            break
        negative, level, rank, parent = heapq.heappop(frontier)
        probability = -negative
        total += probability
        if level < depth:
            heapq.heappush(frontier, (-probability * rate, level + 1, 1, probability))
        if rank < max_width:
            sibling = parent * rate * miss**rank
            heapq.heappush(frontier, (-sibling, level, rank + 1, parent))
    return total


def accepted_per_step(shape: dict, chain_length: float | None) -> float | None:
    """Expected accepted tokens per step (SGLang's spec_accept_length: completion tokens over
    verify steps) from the drafter's published chain length."""
    if shape["algorithm"] == "AR":
        return 1.0
    if chain_length is None:
        return None
    if shape["algorithm"] != "DDTREE":
        return min(chain_length, float(shape["max_accept"]))
    drafted = shape["block_size"] - 1
    rate = chain_rate(chain_length, drafted)
    return min(tree_acceptance(rate, shape["budget"], drafted), float(shape["max_accept"]))


# --------------------------------------------------------------------------------------------
# One decode step.


def _part(bytes_read: float, flops: float, figures: dict, efficiency_field: str, tflops_field):
    bandwidth = figures["copy_gbs"] * figures[efficiency_field] * 1e9
    memory_ms = bytes_read / bandwidth * 1e3
    compute_ms = flops / (figures[tflops_field] * 1e12) * 1e3
    return {
        "bytes_read": round(bytes_read),
        "flops": round(flops),
        "memory_ms": memory_ms,
        "compute_ms": compute_ms,
        "bound": "compute" if compute_ms > memory_ms else "memory",
        "ms": max(memory_ms, compute_ms),
    }


DENSE_SKIPPED = {"routed_experts", "embedding", "vision_tower"}


def _per_rank(group: dict, tp_size: int) -> float:
    ways = min(tp_size, group.get("split_max", tp_size)) if group["split"] else 1
    return group["params"] / ways


def step_parts(
    model_config: dict,
    draft_config: dict | None,
    figures: dict,
    shape: dict,
    batch: int,
    context_tokens: int,
    tp_size: int,
    kv_cache_dtype: str = "auto",
) -> dict:
    """Every part of one decode step of `batch` requests at `context_tokens` each, in ms on
    one TP rank (the ranks run in step)."""
    _number(batch, "concurrency", high=MAX_CONCURRENCY, integer=True)
    _number(context_tokens, "context tokens", high=MAX_CONTEXT, integer=True)
    _number(tp_size, "tp_size", high=capacity.MAX_TP, integer=True)
    try:
        groups = capacity.target_parameters(model_config)
        cfg = capacity.text_config(model_config)
        kv_per_token = capacity.target_kv_bytes_per_token(model_config, kv_cache_dtype, tp_size)
        state_bytes = capacity.recurrent_state_bytes(model_config, tp_size, None)
    except (capacity.CapacityError, KeyError, TypeError) as error:
        raise SpeedModelError(f"the model config cannot be modelled: {error}") from None
    tokens = batch * shape["verify_tokens"]
    hidden = cfg["hidden_size"]
    parts: dict[str, dict] = {}

    dense_params = sum(
        _per_rank(group, tp_size)
        for name, group in groups.items()
        if name not in DENSE_SKIPPED and group.get("served", True)
    )
    parts["dense_weights"] = _part(
        dense_params * BF16,
        2.0 * dense_params * tokens,
        figures,
        "dense_bandwidth_efficiency",
        "bf16_tflops",
    )

    experts = cfg.get("n_routed_experts") or 0
    if experts:
        moe_layers = cfg["num_hidden_layers"] - min(
            cfg.get("first_k_dense_replace", 0), cfg["num_hidden_layers"]
        )
        intermediate = cfg["moe_intermediate_size"] // tp_size
        layer = moe_layer(
            tokens,
            experts,
            cfg["num_experts_per_tok"],
            hidden,
            max(1, intermediate),
            groups["routed_experts"]["bytes"],
            figures["copy_gbs"],
            figures["gemm_bandwidth_efficiency"],
            figures["moe_layer_overhead_us"],
            figures["int4_tflops"],
        )
        parts["routed_experts"] = {
            "bytes_read": layer["bytes_read"] * moe_layers,
            "flops": round(2.0 * tokens * cfg["num_experts_per_tok"] * 3 * hidden * intermediate)
            * moe_layers,
            "memory_ms": layer["memory_ms"] * moe_layers,
            "compute_ms": layer["compute_ms"] * moe_layers,
            "bound": layer["bound"],
            "ms": layer["step_ms"] * moe_layers,
            "experts_touched_per_layer": layer["experts_touched"],
            "experts": experts,
            "moe_layers": moe_layers,
            "tokens": tokens,
        }

    # Each request reads its whole context's KV once a step (its verified tokens share it);
    # a recurrent layer's state is read and, per verified token, written.
    kv_bytes = batch * context_tokens * kv_per_token
    kv_bytes += batch * state_bytes * (1 + shape["verify_tokens"])
    heads = max(1, cfg["num_attention_heads"] // tp_size)
    head_width = (cfg.get("kv_lora_rank") or cfg.get("head_dim", 128)) + (
        cfg.get("qk_rope_head_dim") or 0
    )
    attention_layers = (
        cfg["layer_types"].count("full_attention")
        if capacity.is_hybrid(model_config)
        else cfg["num_hidden_layers"]
    )
    attention_flops = 4.0 * tokens * heads * context_tokens * head_width * attention_layers
    parts["kv_cache"] = _part(
        kv_bytes, attention_flops, figures, "dense_bandwidth_efficiency", "bf16_tflops"
    )

    allreduces = ALLREDUCES_PER_LAYER * cfg["num_hidden_layers"]
    message = tokens * hidden * BF16
    one_us = allreduce_us(figures, message, tp_size)
    parts["allreduce"] = {
        "count": allreduces if tp_size > 1 else 0,
        "message_bytes": message,
        "ms": allreduces * one_us / 1e3,
    }

    if shape["algorithm"] != "AR" and draft_config is not None:
        parts["drafter"] = drafter_part(
            draft_config, groups, figures, shape, batch, tp_size, context_tokens, kv_cache_dtype
        )
    if shape["algorithm"] == "DDTREE":
        mask_bytes = (shape["budget"] + 1) * (context_tokens + shape["budget"] + 1)
        per_request_us = figures["tree_build_us_per_request"] + mask_bytes / (
            figures["host_mask_gbs"] * 1e3
        )
        parts["tree_build"] = {
            "mask_bytes_per_request": mask_bytes,
            "ms": batch * per_request_us / 1e3,
        }
    overhead = figures["step_overhead_ms"] + (
        0.0 if shape["overlap"] else figures["scheduler_overhead_ms"]
    )
    parts["overhead"] = {"overlap": shape["overlap"], "ms": overhead}
    for part in parts.values():
        for key in ("ms", "memory_ms", "compute_ms"):
            if key in part:
                part[key] = round(part[key], 4)
    return parts


def drafter_part(
    draft_config, target_groups, figures, shape, batch, tp_size, context_tokens, kv_cache_dtype
) -> dict:
    """The drafter's forwards in one step: DFlash (and DDTree over it) one block forward;
    EAGLE-3 one forward per step of its chain. Each reads the drafter's weights and the LM head
    it projects through, and the drafter's KV over its window."""
    try:
        groups = capacity.draft_parameters(draft_config)
        kv_per_token = capacity.draft_kv_bytes_per_token(draft_config, kv_cache_dtype, tp_size)
    except (capacity.CapacityError, KeyError, TypeError) as error:
        raise SpeedModelError(f"the drafter config cannot be modelled: {error}") from None
    params = sum(_per_rank(group, tp_size) for group in groups.values())
    if "lm_head" not in groups:  # DFlash projects through the target's LM head
        params += _per_rank(target_groups["lm_head"], tp_size)
    window = int(draft_config.get("draft_window_size") or context_tokens)
    if shape["algorithm"] == "EAGLE3":
        forwards, tokens_each = shape["steps"], batch * shape["topk"]
    else:
        forwards, tokens_each = 1, batch * shape["block_size"]
    bytes_read = forwards * (params * BF16 + batch * min(window, context_tokens) * kv_per_token)
    part = _part(
        bytes_read,
        forwards * 2.0 * params * tokens_each,
        figures,
        "dense_bandwidth_efficiency",
        "bf16_tflops",
    )
    layers = draft_config["num_hidden_layers"]
    message = tokens_each * draft_config["hidden_size"] * BF16
    allreduce_ms = (
        forwards * ALLREDUCES_PER_LAYER * layers * allreduce_us(figures, message, tp_size) / 1e3
    )
    part.update(forwards=forwards, allreduce_ms=allreduce_ms, ms=part["ms"] + allreduce_ms)
    return part


def predict(
    model_config: dict,
    draft_config: dict | None,
    figures: dict,
    shape: dict,
    concurrency: int,
    context_tokens: int,
    tp_size: int,
    chain_length: float | None,
    *,
    kv_cache_dtype: str = "auto",
    max_running_requests: int | None = None,
    acceptance_source: str = "",
) -> dict:
    """One config at one concurrency: the step time with its parts, accepted tokens per step,
    tokens/s per request and per server. Requests past the server's running cap wait, so the
    server's rate holds while each client's falls."""
    _number(concurrency, "concurrency", high=MAX_CONCURRENCY, integer=True)
    batch = concurrency
    if max_running_requests is not None:
        batch = min(
            batch,
            _number(
                max_running_requests, "max_running_requests", high=MAX_CONCURRENCY, integer=True
            ),
        )
    if shape["algorithm"] != "AR" and draft_config is None:
        raise SpeedModelError(
            f"a {shape['algorithm']} config needs its drafter's config; needed: the drafter's "
            "config.json. Fix: give the drafter folder."
        )
    parts = step_parts(
        model_config, draft_config, figures, shape, batch, context_tokens, tp_size, kv_cache_dtype
    )
    step_ms = sum(part["ms"] for part in parts.values())
    accepted = accepted_per_step(shape, chain_length)
    per_request = server = None
    if accepted is not None:
        server = batch * accepted / step_ms * 1e3
        per_request = server / concurrency
    return {
        "algorithm": shape["algorithm"],
        "concurrency": concurrency,
        "batch": batch,
        "context_tokens": context_tokens,
        "verify_tokens_per_request": shape["verify_tokens"],
        "step_ms": round(step_ms, 3),
        "parts": parts,
        "accepted_tokens_per_step": None if accepted is None else round(accepted, 3),
        "acceptance_source": acceptance_source if shape["algorithm"] != "AR" else "AR: one token",
        "tokens_per_s_per_request": None if per_request is None else round(per_request, 2),
        "tokens_per_s": None if server is None else round(server, 2),
    }


def ddtree_curve(
    model_config,
    draft_config,
    figures,
    shape: dict,
    budgets,
    concurrency,
    context_tokens,
    tp_size,
    chain_length,
    **options,
) -> dict:
    """DDTree's prediction over budgets, and the budget past which it predicts no further
    gain: where the tokens/s peaks over every budget up to the largest asked (the extra
    experts a wider tree reads cost more than the extra accepted tokens give)."""

    def at(budget: int) -> dict:
        one = spec("DDTREE", draft_tokens=shape["block_size"], budget=budget)
        return predict(model_config, draft_config, figures, one, concurrency, context_tokens,
                       tp_size, chain_length, **options)  # fmt: skip

    points = []
    for budget in sorted(set(budgets)):
        result = at(budget)
        experts = result["parts"].get("routed_experts", {})
        points.append(
            {
                "budget": budget,
                "step_ms": result["step_ms"],
                "experts_touched_per_layer": experts.get("experts_touched_per_layer"),
                "accepted_tokens_per_step": result["accepted_tokens_per_step"],
                "tokens_per_s": result["tokens_per_s"],
            }
        )
    best = None
    if chain_length is not None:
        largest = max(max(budgets), shape["block_size"] - 1)
        best_rate = -1.0
        for budget in range(1, largest + 1):
            rate = at(budget)["tokens_per_s"]
            if rate > best_rate * (1 + 1e-9):
                best, best_rate = budget, rate
    return {"points": points, "best_budget": best}


# --------------------------------------------------------------------------------------------
# From a model folder and a rendered launch: what the plan and the report call.

DRAFTER_OF = {"EAGLE3": "eagle3", "DFLASH": "dflash", "DDTREE": "dflash"}


def model_inputs(model_dir: Path | str, drafter_dirs: dict | None = None) -> dict:
    """A model folder's config.json, each drafter's (<model>/<drafter>/config.json unless
    drafter_dirs names another folder) and its published acceptance."""
    model_dir = Path(model_dir)
    drafters = {}
    for name in ("dflash", "eagle3"):
        folder = Path((drafter_dirs or {}).get(name) or model_dir / name)
        if (folder / "config.json").exists():
            drafters[name] = _load_config(folder / "config.json", f"the {name} drafter config")
    return {
        "config": _load_config(model_dir / "config.json", "the model config"),
        "drafters": drafters,
        "acceptance": load_acceptance(model_dir),
    }


def predict_launch(
    inputs: dict,
    figures: dict,
    argv,
    concurrency: int,
    context_tokens: int,
    tp_size: int,
    prompt_set: str | None = None,
    *,
    accept_length: float | None = None,
    kv_cache_dtype: str = "auto",
    max_running_requests: int | None = None,
) -> dict:
    """One rendered launch (its argv) at one concurrency: predict() with the drafter the
    algorithm uses and its published acceptance for the prompt set (or accept_length, e.g. a
    run's measured one)."""
    shape = spec_from_argv(argv)
    drafter = DRAFTER_OF.get(shape["algorithm"])
    draft_config = inputs["drafters"].get(drafter) if drafter else None
    if drafter and draft_config is None:
        raise SpeedModelError(
            f"a {shape['algorithm']} launch needs the {drafter} drafter's config; needed: "
            f"<model folder>/{drafter}/config.json. Fix: add the drafter's config to the model "
            "folder."
        )
    chain, source = (None, "")
    if drafter:
        chain, source = published_acceptance(inputs["acceptance"], drafter, prompt_set)
    if accept_length is not None and drafter:
        chain = float(_number(accept_length, "accept_length", high=MAX_BUDGET))
        source = "given"
    result = predict(
        inputs["config"],
        draft_config,
        figures,
        shape,
        concurrency,
        context_tokens,
        tp_size,
        chain,
        kv_cache_dtype=kv_cache_dtype,
        max_running_requests=max_running_requests,
        acceptance_source=source,
    )
    result["prompt_set"] = prompt_set
    if shape["algorithm"] == "DDTREE":
        result["budget"] = shape["budget"]
    return result


# --------------------------------------------------------------------------------------------
# The command line.


def _load_config(path: Path, what: str) -> dict:
    config = read_json(path, what)
    if not isinstance(config, dict):
        raise SpeedModelError(f"{what} at {path} is not a JSON object.")
    return config


def _cli_figures(args) -> dict:
    hardware = load_hardware(args.hardware) if args.hardware else load_hardware()
    figures = profile_figures(args.profile, hardware)
    if args.calibration:
        figures = apply_calibration(figures, read_json(Path(args.calibration), "calibration"))
    if args.allreduce:
        figures = apply_allreduce(
            figures,
            read_json(Path(args.allreduce), "all-reduce record"),
            f"the all-reduce record {args.allreduce}",
        )
    return figures


def _cli_predict(args) -> dict:
    model_dir = Path(args.model)
    config = _load_config(model_dir / "config.json", "the model config")
    algorithm = args.algorithm.upper()
    drafter_name = {"EAGLE3": "eagle3", "DFLASH": "dflash", "DDTREE": "dflash"}.get(algorithm)
    draft_config = None
    if drafter_name:
        draft_dir = Path(args.drafter) if args.drafter else model_dir / drafter_name
        draft_config = _load_config(draft_dir / "config.json", "the drafter config")
    block = args.draft_tokens or (draft_config or {}).get("block_size") or 8
    if algorithm == "EAGLE3":
        shape = spec("EAGLE3", draft_tokens=args.draft_tokens or 4, steps=args.steps)
    elif algorithm == "AR":
        shape = spec("AR")
    else:
        shape = spec(algorithm, draft_tokens=block, budget=args.budget, overlap=not args.no_overlap)
    chain, source = (None, "")
    if drafter_name:
        chain, source = published_acceptance(
            load_acceptance(model_dir), drafter_name, args.prompt_set
        )
        if args.accept_length is not None:
            chain = _number(args.accept_length, "--accept-length", high=MAX_BUDGET)
            source = "--accept-length"
    figures = _cli_figures(args)
    options = {
        "kv_cache_dtype": args.kv_cache_dtype,
        "max_running_requests": args.max_running_requests,
        "acceptance_source": source,
    }
    result = predict(
        config,
        draft_config,
        figures,
        shape,
        args.concurrency,
        args.context,
        args.tp,
        chain,
        **options,
    )
    result["profile"] = args.profile
    result["sources"] = figures["sources"]
    if algorithm == "DDTREE" and args.budgets:
        budgets = [
            _number(int(b), "--budgets", high=MAX_BUDGET, integer=True)
            for b in args.budgets.split(",")
        ]
        result["ddtree"] = ddtree_curve(
            config,
            draft_config,
            figures,
            shape,
            budgets,
            args.concurrency,
            args.context,
            args.tp,
            chain,
            **options,
        )
    return result


def _cli_moe(args) -> dict:
    return moe_layer(
        args.tokens,
        args.experts,
        args.top_k,
        args.hidden,
        args.intermediate,
        args.weight_bytes,
        args.hbm_gbs,
        args.efficiency,
        args.overhead_us,
    )


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="speed_model.py", description="Predict SGLang decode step times (docs/speed-model.md)."
    )
    commands = top.add_subparsers(dest="command", required=True)
    moe = commands.add_parser("moe", help="one MoE layer's routed experts for one step")
    moe.add_argument("--tokens", type=int, required=True, help="tokens the step verifies")
    moe.add_argument("--experts", type=int, required=True, help="routed experts (E)")
    moe.add_argument("--top-k", type=int, required=True, help="experts per token (k)")
    moe.add_argument("--hidden", type=int, required=True)
    moe.add_argument(
        "--intermediate",
        type=int,
        required=True,
        help="one expert's intermediate size as read (one TP rank's slice)",
    )
    moe.add_argument(
        "--weight-bytes",
        type=float,
        required=True,
        help="bytes per weight: 2 for BF16, 0.5625 for INT4 with group-32 scales",
    )
    moe.add_argument("--hbm-gbs", type=float, required=True, help="copy bandwidth, GB/s")
    moe.add_argument(
        "--efficiency",
        type=float,
        default=1.0,
        help="share of the bandwidth the grouped GEMM reaches (default 1)",
    )
    moe.add_argument("--overhead-us", type=float, default=0.0, help="fixed cost per layer")
    one = commands.add_parser("predict", help="one serving config's decode step")
    one.add_argument("--model", required=True, help="model folder (config.json, acceptance.json)")
    one.add_argument("--drafter", help="drafter folder (default: <model>/<dflash|eagle3>)")
    one.add_argument("--profile", required=True, help="hardware profile: ct200, h200, b200, b300")
    one.add_argument(
        "--algorithm", default="AR", choices=[a.lower() for a in ALGORITHMS] + list(ALGORITHMS)
    )
    one.add_argument("--draft-tokens", type=int, help="EAGLE-3 draft tokens or DFlash block size")
    one.add_argument("--steps", type=int, help="EAGLE-3 steps")
    one.add_argument("--budget", type=int, help="DDTree node budget")
    one.add_argument("--budgets", help="DDTree: also predict these budgets, comma separated")
    one.add_argument("--no-overlap", action="store_true", help="overlap scheduling off")
    one.add_argument("--concurrency", type=int, default=1)
    one.add_argument("--context", type=int, default=2048, help="tokens of context per request")
    one.add_argument("--tp", type=int, default=8)
    one.add_argument("--prompt-set", help="the published acceptance's prompt set (e.g. gsm8k)")
    one.add_argument("--accept-length", type=float, help="chain acceptance length to assume")
    one.add_argument("--kv-cache-dtype", default="auto")
    one.add_argument("--max-running-requests", type=int)
    one.add_argument("--hardware", help="hardware figures file (default: the kit's)")
    one.add_argument("--calibration", help="a host's calibration record")
    one.add_argument("--allreduce", help="a host's all-reduce check record")
    return top


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        result = _cli_moe(args) if args.command == "moe" else _cli_predict(args)
    except SpeedModelError as error:
        print(f"speed_model: {error}", file=sys.stderr)
        return 2
    json.dump(result, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
