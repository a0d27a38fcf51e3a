"""The speed model's inputs (module_utils/plan/speed_model.py): the hardware figures of each
profile with their sources, a host's calibration and all-reduce measurements in place of
nominal figures, the speculative shape of a rendered launch, and the drafter's published
acceptance turned into accepted tokens per step.

Every hardware figure is data with its source (group_vars/all/speed_hardware.json); a host's
calibration record (--tags calibrate) replaces the measured ones. Standard library only.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
import math
from pathlib import Path

from ansible.module_utils.contract.launch import flag_value

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


def bounded(value, name: str, *, low: float = 0.0, high: float = MAX_RATE, integer=False):
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
        checked[field] = float(bounded(entry["value"], f"{name}.{field}", high=high))
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
        touched = bounded(row.get("experts_touched"), "experts_touched", high=MAX_EXPERTS)
        ms = bounded(row.get("ms"), "ms")
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
    copy_gbs = bounded(record.get("copy_gbs"), "copy_gbs")
    moe = record.get("moe")
    if not isinstance(moe, dict) or not isinstance(moe.get("rows"), list):
        raise SpeedModelError("the calibration record has no moe rows; needed: moe.rows[].")
    rows = moe["rows"]
    if not 2 <= len(rows) <= MAX_ROWS or not all(isinstance(row, dict) for row in rows):
        raise SpeedModelError(
            f"the calibration record has {len(rows)} moe rows; needed: 2 to {MAX_ROWS} mappings."
        )
    hidden = bounded(moe.get("hidden"), "moe.hidden", high=MAX_WIDTH, integer=True)
    intermediate = bounded(
        moe.get("intermediate"), "moe.intermediate", high=MAX_WIDTH, integer=True
    )
    weight_bytes = bounded(moe.get("weight_bytes"), "moe.weight_bytes", high=64)
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
        size = bounded(row.get("bytes"), "all-reduce bytes", high=1 << 40, integer=True)
        rows.append((size, float(bounded(row.get("time_us"), "all-reduce time_us"))))
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
    value = flag_value(argv, name)
    if value is None:
        return default
    try:
        number = int(str(value))
    except ValueError:
        raise SpeedModelError(
            f"{name} is {value!r} in the launch; needed: an integer. Fix: the serving "
            "config's args."
        ) from None
    return bounded(number, name, high=MAX_TOKENS, integer=True)


def spec_from_argv(argv) -> dict:
    """The speculative shape of a rendered launch (serving.py's argv): the algorithm, the
    tokens each request verifies per step and what bounds its acceptance."""
    if not isinstance(argv, (list, tuple)) or not all(
        isinstance(item, (str, int, float)) and not isinstance(item, bool) for item in argv
    ):
        raise SpeedModelError(f"the launch argv is {argv!r}; needed: a list of strings.")
    argv = [str(item) for item in argv]
    algorithm = (flag_value(argv, "--speculative-algorithm") or "AR").upper()
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
    draft = bounded(draft_tokens, "draft tokens", high=MAX_BUDGET, integer=True)
    if algorithm == "EAGLE3":
        steps = bounded(steps if steps is not None else draft - 1, "steps", high=64, integer=True)
        topk = bounded(topk, "topk", high=64, integer=True)
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
    budget = bounded(budget, "budget", high=MAX_BUDGET, integer=True)
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
                str(name): float(bounded(value, f"{drafter}.{name}", high=MAX_BUDGET))
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


# chain_rate and tree_acceptance are pure and ddtree_curve asks them the same question for every
# budget up to the largest, at every level of every config (a thousand times a plan).
@functools.lru_cache(maxsize=4096)
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


@functools.lru_cache(maxsize=4096)
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
# A model folder: its config, its drafters' and their published acceptance.


def load_config(path: Path, what: str) -> dict:
    config = read_json(path, what)
    if not isinstance(config, dict):
        raise SpeedModelError(f"{what} at {path} is not a JSON object.")
    return config


DRAFTER_OF = {"EAGLE3": "eagle3", "DFLASH": "dflash", "DDTREE": "dflash"}


def model_inputs(model_dir: Path | str, drafter_dirs: dict | None = None) -> dict:
    """A model folder's config.json, each drafter's (<model>/<drafter>/config.json unless
    drafter_dirs names another folder) and its published acceptance."""
    model_dir = Path(model_dir)
    drafters = {}
    for name in ("dflash", "eagle3"):
        folder = Path((drafter_dirs or {}).get(name) or model_dir / name)
        if (folder / "config.json").exists():
            drafters[name] = load_config(folder / "config.json", f"the {name} drafter config")
    return {
        "config": load_config(model_dir / "config.json", "the model config"),
        "drafters": drafters,
        "acceptance": load_acceptance(model_dir),
    }
