"""A data-parallel loop with one culprit, for test_hang.py (run under torchrun).

    hang_job.py MODE CULPRIT OUTDIR [TIMEOUT_S]

MODE skip: rank CULPRIT skips the allreduce of step 3 (`if loss > x:
continue`), so the others wait in their last call while it goes on to the
end. MODE kill: rank CULPRIT kills itself (SIGKILL) at step 3. Every rank
that lives writes OUTDIR/rank<R>.json: how its loop ended, the error text,
and how long its failing call took.
"""
import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import chorus_torch  # noqa: F401  (registers "chorus")

mode, culprit, outdir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
timeout_s = float(sys.argv[4]) if len(sys.argv) > 4 else 8.0

dist.init_process_group("chorus", timeout=datetime.timedelta(seconds=timeout_s))
rank = dist.get_rank()
x = torch.ones(4096)
result = {"rank": rank, "outcome": "finished", "error": "", "call_s": 0.0}
for step in range(8):
    if step == 3 and rank == culprit:
        if mode == "skip":
            continue
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        dist.all_reduce(x)
    except RuntimeError as e:
        result.update(outcome="raised", error=str(e), call_s=time.monotonic() - t0, step=step)
        break
with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
dist.destroy_process_group()
sys.exit(1 if result["outcome"] == "raised" else 0)
