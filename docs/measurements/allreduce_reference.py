"""Plain all-reduce timing loop: the reference the allreduce_check module is held against.

Independent of the module on purpose (torchrun instead of torch.multiprocessing, rank 0's own
timing instead of the slowest rank's). One process per GPU:

    python3 -m torch.distributed.run --standalone --nproc_per_node 2 allreduce_reference.py

Rank 0 prints CSV: bytes,time_us,algbw_GBps,busbw_GBps (GB/s = 1e9 bytes/s; busbw is
2(n-1)/n x algbw, as nccl-tests reports it) for bf16 messages of 32 KiB .. 1 GiB.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--min-bytes", type=int, default=32 << 10)
    parser.add_argument("--max-bytes", type=int, default=1 << 30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print("bytes,time_us,algbw_GBps,busbw_GBps", flush=True)
    nbytes = args.min_bytes
    while nbytes <= args.max_bytes:
        x = torch.randn(nbytes // 2, dtype=torch.bfloat16, device="cuda")
        for _ in range(args.warmup):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iterations):
            dist.all_reduce(x)
        end.record()
        torch.cuda.synchronize()
        time_us = start.elapsed_time(end) * 1000.0 / args.iterations
        algbw = nbytes / (time_us * 1e-6) / 1e9
        busbw = algbw * 2 * (world - 1) / world
        if rank == 0:
            print(f"{nbytes},{time_us:.2f},{algbw:.2f},{busbw:.2f}", flush=True)
        del x
        nbytes *= 2
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
