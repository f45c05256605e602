"""The hang every data-parallel user knows, over "chorus" under torchrun:
one rank skips a step, or is killed. Every live rank that waits for it
raises a Python exception within the process group's timeout + 5 s, naming
the culprit rank and the collective; dumps land in CHORUS_TRACE_DIR; and
torchrun exits non-zero instead of hanging."""
import glob
import json
import os
import subprocess
import time

import pytest

from conftest import PYTHON, HERE, free_port

TIMEOUT_S = 8.0
JOB = os.path.join(HERE, "hang_job.py")


def torchrun(nranks, mode, culprit, tmp_path):
    out = tmp_path / "out"
    dumps = tmp_path / "dumps"
    out.mkdir()
    dumps.mkdir()
    env = dict(os.environ, CHORUS_TRACE_DIR=str(dumps), OMP_NUM_THREADS="1")
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", str(nranks),
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           "--redirects", "1", "--tee", "1", JOB, mode, str(culprit), str(out), str(TIMEOUT_S)]
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=TIMEOUT_S + 90, text=True, start_new_session=True)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"torchrun did not end within {TIMEOUT_S + 90} s:\n{e.output}")
    took = time.monotonic() - start
    results = {}
    for f in glob.glob(str(out / "rank*.json")):
        with open(f) as fh:
            r = json.load(fh)
        results[r["rank"]] = r
    return p, took, results, sorted(os.listdir(dumps))


@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.parametrize("mode", ["skip", "kill"])
def test_culprit_is_named(nranks, mode, tmp_path):
    culprit = nranks - 1
    p, took, results, dumps = torchrun(nranks, mode, culprit, tmp_path)
    log = p.stdout
    print(f"{mode} at {nranks} ranks: torchrun exit {p.returncode} after {took:.1f} s")
    assert p.returncode != 0, f"torchrun exited 0:\n{log}"
    waiters = [r for r in range(nranks) if r != culprit]
    for r in waiters:
        assert r in results, f"rank {r} wrote no result:\n{log}"
        res = results[r]
        print(f"  rank {r}: {res['outcome']} after {res['call_s']:.1f} s: {res['error'][:300]}")
        assert res["outcome"] == "raised", f"rank {r} did not raise:\n{log}"
        assert res["call_s"] <= TIMEOUT_S + 5, f"rank {r} raised after {res['call_s']:.1f} s"
        assert f"rank {culprit}" in res["error"], f"rank {r}'s error names no culprit: {res}"
        assert "allreduce" in res["error"], f"rank {r}'s error names no collective: {res}"
    if mode == "kill":
        assert culprit not in results, "the killed rank wrote a result"
    # every rank that lived wrote a dump for chorus-trace
    assert len(dumps) >= len(waiters), f"dumps in CHORUS_TRACE_DIR: {dumps}\n{log}"
