"""Benchmark: `python -m analysis report` over a results tree of 100,000+ request records.

Builds a run the size of a large study at the kit's defaults - 12 hosts (ct200, h200 and
b200 profiles), 8 serving configs (ar, eagle3, dflash, DDTree at budgets 8 to 64 and its chain
control dflash-tree-backend), 5 prompt sets, concurrency 1, 4, 16 and 64, 64 requests per level
of 512 new tokens, every record with
its events, text and token ids as the benchmark module writes them (indent 1) - then times the
report end to end in a fresh interpreter (start-up, reading, tables, plots, HTML), as a user
runs it.

    .venv/bin/python -m tests.benchmarks.analysis_speed [--hosts 12] [--strict] [--keep]

Level files of one host per profile come from tests/support/results_tree.py (the module's own
summary functions); the other hosts and prompt sets are byte copies with their names changed,
which costs the reader exactly what distinct files would. The tree is about 2.1 GB and is
read warm from the page cache (just written). Exits non-zero when the report takes 10 s or
more; report the figure with the machine's core count.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.results_tree import CHAIN_CONTROL, DEFAULT_CONFIGS, Plan, Sim, write_run

REPO = Path(__file__).resolve().parent.parent.parent
PROFILES = ("ct200", "h200", "b200")
PROMPT_SETS = ("gsm8k", "mt-bench", "humaneval", "math500", "mbpp")
LIMIT_S = 10.0


def configs_for(profile: int) -> dict[str, Sim]:
    """The default configs, faster on NVLink profiles, with per-prompt spread in acceptance
    and a step time that grows with the batch."""
    scale = (1.0, 0.7, 0.55)[profile]
    out = {
        name: Sim(
            step_ms=sim.step_ms * scale,
            accept=sim.accept,
            budget=sim.budget,
            batch_cost=0.01,
            spread=0.25,
        )
        for name, sim in DEFAULT_CONFIGS.items()
    }
    out["ddtree-b8"] = Sim(step_ms=27 * scale, accept=5.4, budget=8, batch_cost=0.01, spread=0.25)
    out[CHAIN_CONTROL] = Sim(step_ms=27 * scale, accept=5.0, batch_cost=0.01, spread=0.25)
    return out


def build(root: Path, hosts: int, num_prompts: int, max_new_tokens: int) -> int:
    """The tree under root; returns the number of request records."""
    base = root / ".base"
    for number, profile in enumerate(PROFILES):
        plan = Plan(
            hosts={f"gen-{profile}": profile},
            configs=configs_for(number),
            concurrency=(1, 4, 16, 64),
            prompt_sets=(PROMPT_SETS[0],),
            num_prompts=num_prompts,
            max_new_tokens=max_new_tokens,
            jitter=0.05,
        )
        write_run(base, plan)
    shutil.copy2(base / "run.json", root / "run.json")
    records = 0
    for index in range(hosts):
        profile = PROFILES[index % len(PROFILES)]
        host = f"node-{index:02d}-{profile}"
        source = base / f"gen-{profile}"
        target = root / host
        target.mkdir(parents=True)
        (target / "lossless.json").write_bytes((source / "lossless.json").read_bytes())
        for config_dir in sorted(p for p in source.iterdir() if p.is_dir()):
            (target / config_dir.name).mkdir()
            shutil.copy2(config_dir / "status.json", target / config_dir.name / "status.json")
            for level in sorted((config_dir / PROMPT_SETS[0]).glob("c*.json")):
                data = level.read_bytes().replace(
                    f'"host": "gen-{profile}"'.encode(), f'"host": "{host}"'.encode()
                )
                for prompt_set in PROMPT_SETS:
                    renamed = data.replace(
                        f'"prompt_set": "{PROMPT_SETS[0]}"'.encode(),
                        f'"prompt_set": "{prompt_set}"'.encode(),
                    ).replace(
                        f'"name": "{PROMPT_SETS[0]}"'.encode(), f'"name": "{prompt_set}"'.encode()
                    )
                    folder = target / config_dir.name / prompt_set
                    folder.mkdir(exist_ok=True)
                    (folder / level.name).write_bytes(renamed)
                    records += num_prompts
    shutil.rmtree(base)
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=12)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--strict", action="store_true", help="also time a --strict report")
    parser.add_argument("--keep", action="store_true", help="keep the generated tree")
    parser.add_argument("--dir", type=Path, help="where to build the tree (default: a temp dir)")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="analysis-speed-", dir=args.dir))
    try:
        clock = time.perf_counter()
        records = build(root, args.hosts, args.num_prompts, args.max_new_tokens)
        size = sum(p.stat().st_size for p in root.rglob("c*.json"))
        files = sum(1 for _ in root.rglob("c*.json"))
        print(
            f"built {records} request records in {files} level files, {size / 1e9:.2f} GB, "
            f"in {time.perf_counter() - clock:.1f} s ({os.cpu_count()} CPUs)"
        )
        runs = [("report", [])] + ([("report --strict", ["--strict"])] if args.strict else [])
        worst = 0.0
        for number, (label, extra) in enumerate(runs):
            out = root / f"out-{number}"
            command = [sys.executable, "-m", "analysis", "report", str(root), "--out", str(out)]
            clock = time.perf_counter()
            done = subprocess.run(
                command + extra, cwd=REPO, capture_output=True, text=True, check=False
            )
            elapsed = time.perf_counter() - clock
            if done.returncode != 0:
                print(done.stdout + done.stderr)
                return 1
            print(f"{label}: {elapsed:.2f} s ({done.stdout.splitlines()[0]})")
            if not extra:
                worst = elapsed
        return 0 if worst < LIMIT_S else 1
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
