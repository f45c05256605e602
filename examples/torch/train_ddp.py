#!/usr/bin/env python3
"""train_ddp.py - DistributedDataParallel training of an MLP on synthetic data.

Launch it like any torch.distributed program, for example:

    torchrun --standalone --nproc_per_node 2 --redirects 1 --tee 1 \\
        examples/torch/train_ddp.py --backend chorus --steps 100

(Debian's torchrun needs `--redirects 1 --tee 1`). Without torchrun, set RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT yourself. `--backend chorus` imports
chorus_torch (PYTHONPATH=<build>/torch/python in a build tree).

Everything is seeded: the model (same on every rank), each rank's batches
(seed + rank) and the targets (a fixed random "teacher" network), so two runs
with the same arguments compute the same thing; `--save FILE` writes the final
parameters (rank 0, one flat float tensor, torch.save) for comparing backends.

Rank 0 prints the loss (averaged over the ranks) every --log-every steps, then
"median step time" (forward, backward with its gradient allreduces, optimizer
step; the first --warmup steps left out) and the number of parameters.

--overlap FILE records, for every step, when each gradient bucket's allreduce
was launched and when its future completed, against when the backward pass
finished computing (the input's gradient, the last one autograd computes) and
when loss.backward() returned; it writes them as JSON and prints a summary.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.nn.parallel import DistributedDataParallel as DDP

IN_FEATURES = 64
OUT_FEATURES = 16


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="chorus", choices=["chorus", "gloo"])
    p.add_argument("--hook", default="none", choices=["none", "fp16", "bf16", "powersgd"])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--params", type=float, default=1e6,
                   help="approximate number of model parameters (default 1e6; 1e7 = 10M)")
    p.add_argument("--layers", type=int, default=3, help="hidden layers (default 3)")
    p.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads per rank (default 1: one core per rank)")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the median")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--save", help="write the final parameters here (rank 0)")
    p.add_argument("--overlap", help="write bucket launch/completion times here (JSON, rank 0)")
    return p.parse_args(argv)


def hidden_width(params, layers):
    """Width h of `layers` hidden layers so that the MLP has about `params`
    parameters: IN*h + (layers-1)*h*h + h*OUT (+ biases)."""
    a = max(layers - 1, 0)
    b = IN_FEATURES + OUT_FEATURES + layers
    if a == 0:
        return max(1, int(params / b))
    return max(1, int((-b + math.sqrt(b * b + 4 * a * params)) / (2 * a)))


def make_model(width, layers):
    mods, d = [], IN_FEATURES
    for _ in range(layers):
        mods += [nn.Linear(d, width), nn.Tanh()]
        d = width
    mods.append(nn.Linear(d, OUT_FEATURES))
    return nn.Sequential(*mods)


def bf16_hook(state, bucket):
    """torch's bf16_compress_hook under another name: DDP refuses that name
    unless torch was built with CUDA 11 and NCCL 2.10 (a check meant for
    NCCL); Chorus reduces bfloat16 on the CPU."""
    return default_hooks.bf16_compress_hook(state, bucket)


class OverlapRecorder:
    """A comm hook wrapper that timestamps each bucket's launch and the
    completion of its future (perf_counter seconds)."""

    def __init__(self, inner, inner_state):
        self.inner, self.inner_state = inner, inner_state
        self.events = []  # (bucket index, launch, done)

    def hook(self, _state, bucket):
        t0 = time.perf_counter()
        fut = self.inner(self.inner_state, bucket)
        index = bucket.index()

        def done(f):
            self.events.append((index, t0, time.perf_counter()))
            return f.value()

        return fut.then(done)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.backend == "chorus":
        import chorus_torch  # noqa: F401  (registers the backend)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    width = hidden_width(args.params, args.layers)
    torch.manual_seed(args.seed)
    model = make_model(width, args.layers)
    teacher = make_model(32, 1)  # fixed targets: the loss can fall
    nparams = sum(p.numel() for p in model.parameters())
    ddp = DDP(model, bucket_cap_mb=args.bucket_mb)

    hook, state = None, None
    if args.hook == "fp16":
        hook = default_hooks.fp16_compress_hook
    elif args.hook == "bf16":
        hook = bf16_hook
    elif args.hook == "powersgd":
        state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                       start_powerSGD_iter=2, min_compression_rate=0.5,
                                       random_seed=args.seed)
        hook = powerSGD.powerSGD_hook
    recorder = None
    if args.overlap:
        if hook is None:
            hook = default_hooks.allreduce_hook
        recorder = OverlapRecorder(hook, state)
        ddp.register_comm_hook(None, recorder.hook)
    elif hook is not None:
        ddp.register_comm_hook(state, hook)

    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed + 1000 * (rank + 1))
    losses, times, steps_log = [], [], []
    for step in range(args.steps):
        x = torch.randn(args.batch, IN_FEATURES, generator=gen)
        with torch.no_grad():
            y = teacher(x)
        t0 = time.perf_counter()
        stamp = {}
        if recorder:
            x.requires_grad_(True)
            # dL/dx is the last gradient autograd computes: the end of the
            # backward computation, before DDP waits for its buckets
            x.register_hook(lambda g: stamp.__setitem__("compute_end", time.perf_counter()))
            recorder.events.clear()
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        tb = time.perf_counter()
        loss.backward()
        te = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
        if recorder:
            steps_log.append({
                "step": step,
                "backward_start": 0.0,
                "compute_end": stamp["compute_end"] - tb,
                "backward_return": te - tb,
                "buckets": [{"index": i, "launch": a - tb, "done": b - tb}
                            for i, a, b in sorted(recorder.events)],
            })
        avg = loss.detach().clone()
        dist.all_reduce(avg)  # the mean loss over the ranks, for the log
        losses.append(avg.item() / world)
        if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            print(f"step {step:4d} loss {losses[-1]:.6f}", flush=True)

    timed = times[args.warmup:] if len(times) > args.warmup else times
    if rank == 0:
        print(f"backend {args.backend} hook {args.hook} ranks {world} params {nparams} "
              f"(width {width}) steps {args.steps}")
        print(f"median step time {statistics.median(timed) * 1e3:.3f} ms "
              f"(first loss {losses[0]:.6f}, last loss {losses[-1]:.6f})", flush=True)
        if args.save:
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            torch.save({"params": flat, "losses": losses}, args.save)
        if recorder:
            summarize_overlap(steps_log, args.overlap)
    dist.destroy_process_group()


def summarize_overlap(steps_log, path):
    with open(path, "w") as f:
        json.dump(steps_log, f, indent=1)
    started = finished = total = 0
    for s in steps_log[1:]:  # step 0 builds the buckets: left out
        for b in s["buckets"]:
            total += 1
            started += b["launch"] < s["compute_end"]
            finished += b["done"] < s["compute_end"]
    last = steps_log[-1]
    print(f"overlap: {started} of {total} bucket allreduces launched before the backward "
          f"computation ended, {finished} completed before it (steps 1..{len(steps_log) - 1})")
    print(f"last step (ms from backward start): compute end {last['compute_end'] * 1e3:.3f}, "
          f"backward returned {last['backward_return'] * 1e3:.3f}")
    for b in last["buckets"]:
        print(f"  bucket {b['index']}: launched {b['launch'] * 1e3:8.3f}  "
              f"completed {b['done'] * 1e3:8.3f}")
    print(f"overlap: timestamps of every step in {path}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
