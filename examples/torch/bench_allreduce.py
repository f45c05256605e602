#!/usr/bin/env python3
"""bench_allreduce.py - time torch.distributed.all_reduce over a backend.

    torchrun --standalone --nproc_per_node 2 --redirects 1 --tee 1 \\
        examples/torch/bench_allreduce.py --backend chorus --sizes 32K,2M,64M

Measures as chorus-perf does, so the figures compare: per size, `--warmup`
untimed calls, then `--iters` timed calls (default: 100 up to 1 MiB, 20 up
to 64 MiB, fewer past); time is the mean per call of the slowest rank;
algbw = bytes / time, busbw = algbw * 2(n-1)/n (nccl-tests), GB = 1e9 B.
Sizes are the tensor's bytes (float32 by default), reduced in place with
SUM. Rank 0 prints one JSON object per size (--json) or a table.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "int32": torch.int32, "int64": torch.int64}


def size_arg(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s.rstrip("KMG")) * mult)


def default_iters(nbytes):
    if nbytes <= 1 << 20:
        return 100
    if nbytes <= 64 << 20:
        return 20
    return max(5, 20 * (64 << 20) // nbytes)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="chorus", choices=["chorus", "gloo"])
    p.add_argument("--sizes", default="32K,2M,64M", help="comma list, K/M/G suffixes")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--iters", type=int, default=0, help="timed calls per size (default: by size)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.backend == "chorus":
        import chorus_torch  # noqa: F401
    dist.init_process_group(args.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    dtype = DTYPES[args.dtype]
    esize = torch.empty(0, dtype=dtype).element_size()
    if rank == 0 and not args.json:
        print(f"# all_reduce over {args.backend}, {n} ranks, {args.dtype}, in place")
        print(f"{'bytes':>12} {'time_us':>10} {'algbw_GB/s':>11} {'busbw_GB/s':>11}")
    for nbytes in map(size_arg, args.sizes.split(",")):
        count = nbytes // esize
        t = torch.ones(count, dtype=dtype)
        iters = args.iters or default_iters(nbytes)
        for _ in range(args.warmup):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        mine = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        sec = mine.item()
        algbw = count * esize / sec / 1e9
        busbw = algbw * 2 * (n - 1) / n
        if rank == 0:
            rec = {"backend": args.backend, "bytes": count * esize, "count": count,
                   "dtype": args.dtype, "nranks": n, "iters": iters, "time_us": sec * 1e6,
                   "algbw_gbs": algbw, "busbw_gbs": busbw}
            if args.json:
                print(json.dumps(rec), flush=True)
            else:
                print(f"{rec['bytes']:>12} {sec * 1e6:>10.1f} {algbw:>11.3f} {busbw:>11.3f}",
                      flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
