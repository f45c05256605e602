"""Shared fixtures of the chorus_torch tests: launching ranks.

Every multi-process run goes through run_job(), which starts one Python
process per rank (tests/torch/worker.py, or any script) with the
torch.distributed environment (MASTER_ADDR=127.0.0.1, a free MASTER_PORT,
RANK, WORLD_SIZE, LOCAL_RANK), waits for all of them under a timeout and
kills the whole job (each rank is a process group of its own) when it
expires, so a hang fails the test instead of hanging the suite.

The package under test comes from PYTHONPATH (ctest sets it to
<build>/torch/python); the interpreter is the one running pytest, which
must import torch (Debian: /usr/bin/python3).
"""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "worker.py")
TRAIN_DDP = os.path.join(SOURCE_DIR, "examples", "torch", "train_ddp.py")
PYTHON = sys.executable


def pytest_configure(config):
    try:
        import chorus_torch  # noqa: F401
    except ImportError as e:
        raise pytest.UsageError(
            f"cannot import chorus_torch ({e}): run with "
            "PYTHONPATH=<build>/torch/python and a python that imports torch "
            "(ctest -L torch does both)")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JobResult:
    def __init__(self, outputs, codes, elapsed):
        self.outputs, self.codes, self.elapsed = outputs, codes, elapsed

    def text(self):
        return "\n".join(f"---- rank {r} (exit {c}) ----\n{o}"
                         for r, (o, c) in enumerate(zip(self.outputs, self.codes)))

    def check(self):
        """Every rank exited 0, else the test fails with every rank's output."""
        if any(c != 0 for c in self.codes):
            pytest.fail(f"a rank failed (exit codes {self.codes}):\n{self.text()}")
        return self


def run_job(nranks, argv, timeout=120, env=None, script=WORKER):
    """Runs `python script *argv` as nranks ranks; returns a JobResult.
    The job is killed after `timeout` seconds (the test then fails)."""
    port = free_port()
    procs, logs = [], []
    start = time.monotonic()
    for r in range(nranks):
        e = dict(os.environ)
        e.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                 WORLD_SIZE=str(nranks), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(nranks),
                 OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        if env:
            e.update({k: str(v) for k, v in env.items()})
        log = open(_log_path(r), "w+")
        logs.append(log)
        procs.append(subprocess.Popen([PYTHON, script, *map(str, argv)], env=e, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True))
    deadline = start + timeout
    codes = []
    timed_out = False
    for p in procs:
        left = deadline - time.monotonic()
        try:
            codes.append(p.wait(timeout=max(left, 0.1)))
        except subprocess.TimeoutExpired:
            timed_out = True
            break
    if timed_out:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        codes = [p.wait() for p in procs]
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
        os.unlink(log.name)
    res = JobResult(outputs, codes, time.monotonic() - start)
    if timed_out:
        pytest.fail(f"job {argv} of {nranks} ranks did not end within {timeout} s:\n{res.text()}")
    return res


_log_seq = [0]


def _log_path(rank):
    _log_seq[0] += 1
    d = os.environ.get("TMPDIR", "/tmp")
    return os.path.join(d, f"chorus-torch-test-{os.getpid()}-{_log_seq[0]}-r{rank}.log")


def run_cases(nranks, cases, timeout=120, env=None):
    """Runs worker.py's cases (names, in order, in one process group per
    job) and checks that every rank passed every one of them."""
    res = run_job(nranks, cases, timeout=timeout, env=env).check()
    for r, out in enumerate(res.outputs):
        for c in cases:
            assert f"PASSED {c}" in out, f"rank {r} did not pass {c}:\n{res.text()}"
    return res
