"""The all-reduce check's bandwidth worker.

Usage: python allreduce_worker.py CONFIG.json. Spawns one process per GPU (torch.multiprocessing),
joins them in an NCCL process group through a file store, and for each message size: checks one
all_reduce of bf16 data for the right sum, runs warm-up iterations, then times `iterations`
all_reduce calls with CUDA events. Rank 0 writes the per-size mean time (the slowest rank's)
to the config's result_file.

A program, written out by library/allreduce_check.py into its private work folder and run there
with the runtime environment's Python (module_utils/tuning/allreduce.py says why it travels that
way;
a file, not `-c`, because torch.multiprocessing's spawn re-imports the main module by path). It
runs where torch is and Ansible is not: at the top it imports only the standard library, and
torch inside the functions that need it. make_config() is the one definition of CONFIG, used by
the module to write it.
"""

from __future__ import annotations

import json
import sys

CONFIG_KEYS = ("world_size", "sizes", "warmup", "iterations", "store", "result_file")
EXIT_USAGE = 2


def make_config(
    world_size: int, sizes: list[int], warmup: int, iterations: int, store: str, result_file: str
) -> dict:
    """The worker's CONFIG: ranks, message sizes in bytes, iterations, the file store the ranks
    meet in, and where rank 0 writes its result."""
    return {
        "world_size": world_size,
        "sizes": sizes,
        "warmup": warmup,
        "iterations": iterations,
        "store": store,
        "result_file": result_file,
    }


def flagged_sizes(sizes: list[int], flags: list[float]) -> list[int]:
    """The sizes whose flag is set (any rank saw a wrong sum there)."""
    return [n for n, f in zip(sizes, flags, strict=True) if f]


def rank_main(rank, cfg):
    import torch
    import torch.distributed as dist

    world = cfg["world_size"]
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl",
        init_method="file://" + cfg["store"],
        rank=rank,
        world_size=world,
        device_id=device,
    )
    try:
        generator = torch.Generator(device=device)
        generator.manual_seed(1234 + rank)
        expected = float(world * (world + 1) // 2)
        times_us = []
        wrong = []
        for nbytes in cfg["sizes"]:
            numel = nbytes // 2
            data = torch.full((numel,), float(rank + 1), dtype=torch.bfloat16, device=device)
            dist.all_reduce(data)
            if not bool(torch.all(data == expected)):
                wrong.append(nbytes)
            data.normal_(generator=generator)
            for _ in range(cfg["warmup"]):
                dist.all_reduce(data)
            torch.cuda.synchronize(device)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(cfg["iterations"]):
                dist.all_reduce(data)
            end.record()
            end.synchronize()
            times_us.append(start.elapsed_time(end) * 1000.0 / cfg["iterations"])
            del data
        # The collective is as slow as its slowest rank.
        slowest = torch.tensor(times_us, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        flags = torch.tensor(
            [1.0 if nbytes in wrong else 0.0 for nbytes in cfg["sizes"]],
            dtype=torch.float64,
            device=device,
        )
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        torch.cuda.synchronize(device)
        if rank == 0:
            result = {
                "sizes": cfg["sizes"],
                "time_us": slowest.tolist(),
                "wrong_sizes": flagged_sizes(cfg["sizes"], flags.tolist()),
                "world_size": world,
                "torch": torch.__version__,
                "cuda": torch.version.cuda,
                "nccl": ".".join(str(part) for part in torch.cuda.nccl.version()),
                "gpu_names": [torch.cuda.get_device_name(i) for i in range(world)],
            }
            with open(cfg["result_file"], "w") as handle:
                json.dump(result, handle)
    finally:
        dist.destroy_process_group()


def read_config(argv: list[str]) -> dict:
    """CONFIG from the one argument; exits EXIT_USAGE when it is missing or incomplete."""
    if len(argv) != 1:
        print("usage: allreduce_worker.py CONFIG.json", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    with open(argv[0]) as handle:
        cfg = json.load(handle)
    missing = [key for key in CONFIG_KEYS if not isinstance(cfg, dict) or key not in cfg]
    if missing:
        print(f"{argv[0]}: missing {', '.join(missing)}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    return cfg


def main(argv: list[str] | None = None) -> None:
    cfg = read_config(sys.argv[1:] if argv is None else argv)
    import torch.multiprocessing as mp

    mp.spawn(rank_main, args=(cfg,), nprocs=cfg["world_size"], join=True)


if __name__ == "__main__":
    main()
