"""One rank of the lifecycle job: `lifecycle.py CYCLES`.

Makes one TCPStore for the whole run (rank 0 serves it), then runs CYCLES
rounds of init_process_group("chorus", store=...), an all_reduce checked
against its expected sum, and destroy_process_group, after a few warm-up
rounds (torch and libchorus allocate caches once per process). It prints
the open file descriptors and the resident set size before and after, and
exits 1 unless the fd count is unchanged and RSS grew by at most 5 MiB.
"""
import datetime
import gc
import os
import sys
import time

import torch
import torch.distributed as dist

import chorus_torch  # noqa: F401

WARMUP = 5
RSS_SLACK = 5 << 20


def fds():
    return len(os.listdir("/proc/self/fd"))


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def cycle(store, rank, world, i):
    dist.init_process_group("chorus", store=dist.PrefixStore(f"cycle{i}", store), rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    t = torch.full((1024,), float(rank + 1))
    dist.all_reduce(t)
    want = world * (world + 1) / 2
    if t[0].item() != want or t[-1].item() != want:
        raise AssertionError(f"cycle {i}: all_reduce gave {t[0].item()}, want {want}")
    dist.destroy_process_group()


def main():
    cycles = int(sys.argv[1])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          rank == 0, timeout=datetime.timedelta(seconds=60))
    for i in range(WARMUP):
        cycle(store, rank, world, i)
    gc.collect()
    fd0, rss0 = fds(), rss()
    t0 = time.monotonic()
    for i in range(WARMUP, WARMUP + cycles):
        cycle(store, rank, world, i)
    gc.collect()
    fd1, rss1 = fds(), rss()
    took = time.monotonic() - t0
    print(f"rank {rank}: {cycles} init/all_reduce/destroy cycles in {took:.1f} s "
          f"({took / cycles * 1e3:.1f} ms each): fds {fd0} -> {fd1}, "
          f"RSS {rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f} MiB ({(rss1 - rss0) / 2**20:+.2f})",
          flush=True)
    ok = fd1 == fd0 and rss1 - rss0 <= RSS_SLACK
    # every rank reports before the store (rank 0's) goes
    store.add("lifecycle_done", 1)
    while store.add("lifecycle_done", 0) < world:
        time.sleep(0.01)
    if rank == 0:
        time.sleep(0.2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
