"""chorus_comm_init_from_env under real torchrun (issue 43, item 1).

torchrun's store holds MASTER_PORT: its agent's with the default static
rendezvous (--master_port), the one dist.init_process_group starts there
with --standalone. A ctypes program that calls chorus_comm_init_from_env,
an allreduce and chorus_comm_destroy must start first try at 2 and 4 ranks
under both, and after dist.init_process_group("gloo"); its ranks print how
long forming the communicator took (FORMED ... seconds=...).

This file is also that program: torchrun runs it as
    python test_from_env_torchrun.py c|pg
(pg: dist.init_process_group first). The library is CHORUS_LIB when
set, else that of the build whose torch/python is on PYTHONPATH (as ctest
runs tests/torch), else the newest build*/engine/libchorus.so of the tree.
"""
import ctypes
import glob
import os
import re
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(os.path.dirname(HERE))
CHORUS_FLOAT32 = 6
CHORUS_SUM = 0
COUNT = 4096


def chorus_lib():
    lib = os.environ.get("CHORUS_LIB")
    if lib:
        return lib
    # ctest's PYTHONPATH=<build>/torch/python: that build's library
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        cand = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(entry or "."))),
                            "engine", "libchorus.so")
        if entry.rstrip("/").endswith(os.path.join("torch", "python")) and os.path.exists(cand):
            return cand
    found = glob.glob(os.path.join(SOURCE_DIR, "build*", "engine", "libchorus.so"))
    if not found:
        raise RuntimeError("no libchorus.so: set CHORUS_LIB=<build>/engine/libchorus.so")
    return max(found, key=os.path.getmtime)


def worker(mode):
    if mode == "pg":
        import torch.distributed as dist
        dist.init_process_group("gloo")
    lib = ctypes.CDLL(os.environ["CHORUS_LIB"])
    lib.chorus_last_error.restype = ctypes.c_char_p
    lib.chorus_comm_last_error.restype = ctypes.c_char_p
    lib.chorus_comm_last_error.argtypes = [ctypes.c_void_p]
    lib.chorus_allreduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    lib.chorus_comm_destroy.argtypes = [ctypes.c_void_p]
    lib.chorus_comm_rank.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    lib.chorus_comm_size.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    comm = ctypes.c_void_p()
    called = time.time()
    rc = lib.chorus_comm_init_from_env(ctypes.byref(comm))
    formed = time.time()
    if rc:
        print(f"INIT FAILED rc={rc}: {lib.chorus_last_error().decode()}", flush=True)
        sys.exit(1)
    rank, size = ctypes.c_int(), ctypes.c_int()
    lib.chorus_comm_rank(comm, ctypes.byref(rank))
    lib.chorus_comm_size(comm, ctypes.byref(size))
    buf = (ctypes.c_float * COUNT)(*([rank.value + 1.0] * COUNT))
    rc = lib.chorus_allreduce(comm, buf, buf, COUNT, CHORUS_FLOAT32, CHORUS_SUM)
    want = size.value * (size.value + 1) / 2
    if rc or any(v != want for v in buf):
        print(f"ALLREDUCE FAILED rc={rc} got {buf[0]} want {want}: "
              f"{lib.chorus_comm_last_error(comm).decode()}", flush=True)
        sys.exit(1)
    rc = lib.chorus_comm_destroy(comm)
    if rc:
        print(f"DESTROY FAILED rc={rc}", flush=True)
        sys.exit(1)
    if mode == "pg":
        import torch.distributed as dist
        dist.barrier()
        dist.destroy_process_group()
    print(f"FORMED rank={rank.value} size={size.value} seconds={formed - called:.3f} "
          f"called={called:.3f} formed={formed:.3f} exit={time.time():.3f}", flush=True)


if __name__ == "__main__":
    worker(sys.argv[1])
    sys.exit(0)

import pytest  # noqa: E402  (the worker above runs without pytest)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc, rdzv, mode, timeout=120):
    """Runs this file under torchrun; returns (exit code, output, seconds)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--redirects", "1", "--tee", "1", "--max_restarts", "0", "--monitor_interval", "1"]
    if rdzv == "standalone":
        cmd.append("--standalone")
    else:
        cmd += ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    cmd += [os.path.abspath(__file__), mode]
    env = dict(os.environ, CHORUS_LIB=chorus_lib(), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               # a rank that cannot meet fails the test in seconds, not a minute
               CHORUS_CONNECT_TIMEOUT="30")
    start = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True, text=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"torchrun {nproc} ranks, {rdzv}, {mode}: no end within {timeout} s:\n{out}")
    return p.returncode, out, time.monotonic() - start


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("rdzv", ["master_port", "standalone"])
@pytest.mark.parametrize("mode", ["c", "pg"])
def test_from_env_under_torchrun(nproc, rdzv, mode):
    rc, out, wall = torchrun(nproc, rdzv, mode)
    assert rc == 0, f"torchrun exited {rc}:\n{out}"
    ranks = re.findall(r"FORMED rank=(\d+) size=(\d+) seconds=([0-9.]+) called=([0-9.]+) "
                       r"formed=([0-9.]+)", out)
    assert sorted(int(r[0]) for r in ranks) == list(range(nproc)), out
    assert all(int(r[1]) == nproc for r in ranks), out
    assert "INIT FAILED" not in out, out
    slowest = max(float(r[2]) for r in ranks)
    # from the last rank's call to the last rank's communicator
    after_last = max(float(r[4]) for r in ranks) - max(float(r[3]) for r in ranks)
    print(f"\ntorchrun {rdzv} {mode} x{nproc}: communicator formed {after_last:.3f} s after "
          f"the last rank called (slowest rank's call {slowest:.3f} s), job {wall:.1f} s")
    # first try: far below CHORUS_CONNECT_TIMEOUT, no rank waited out a retry
    assert slowest < 10, out
