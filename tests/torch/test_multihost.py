"""Two real hosts under torchrun: network namespaces with hostnames of their own.

Hosts a and b are network namespaces joined by a veth pair (198.51.100.1 and
.2, a documentation range), each running `torchrun --nnodes 2 --node_rank
h --nproc_per_node 2` under a hostname of its own (`unshare --uts`), with
rank 0's host as MASTER_ADDR: the multi-node launch a user makes. Every rank
(this file, as torchrun's script) meets the others twice:
  1. chorus_comm_init_from_env through ctypes: the rendezvous id goes through
     torchrun's own TCPStore (its agent's, at MASTER_ADDR:MASTER_PORT on host a);
  2. dist.init_process_group("chorus"): through the process group's store;
and checks what it sees (2 hosts, shm+sock) and the results of collectives.

Needs root and iproute2 (namespaces, veth); without them the test is skipped
and says why.
"""
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ADDRS = ("198.51.100.1", "198.51.100.2")
CHORUS_FLOAT32 = 6
CHORUS_SUM = 0
COUNT = 100003


def worker():
    rank = int(os.environ["RANK"])
    size = int(os.environ["WORLD_SIZE"])
    lib = ctypes.CDLL(os.environ["CHORUS_LIB"])
    lib.chorus_last_error.restype = ctypes.c_char_p
    lib.chorus_comm_provider.restype = ctypes.c_char_p
    lib.chorus_comm_provider.argtypes = [ctypes.c_void_p]
    lib.chorus_comm_last_error.restype = ctypes.c_char_p
    lib.chorus_comm_last_error.argtypes = [ctypes.c_void_p]
    lib.chorus_allreduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    lib.chorus_comm_destroy.argtypes = [ctypes.c_void_p]
    comm = ctypes.c_void_p()
    rc = lib.chorus_comm_init_from_env(ctypes.byref(comm))
    if rc:
        print(f"INIT FAILED rank {rank}: {lib.chorus_last_error().decode()}", flush=True)
        sys.exit(1)
    provider = lib.chorus_comm_provider(comm).decode()
    buf = (ctypes.c_float * COUNT)(*([rank + 1.0] * COUNT))
    rc = lib.chorus_allreduce(comm, buf, buf, COUNT, CHORUS_FLOAT32, CHORUS_SUM)
    want = size * (size + 1) / 2
    if rc or buf[0] != want or buf[COUNT - 1] != want:
        print(f"C ALLREDUCE FAILED rank {rank} rc={rc} got {buf[0]} want {want}: "
              f"{lib.chorus_comm_last_error(comm).decode()}", flush=True)
        sys.exit(1)
    lib.chorus_comm_destroy(comm)

    import datetime
    import torch
    import torch.distributed as dist
    import chorus_torch  # noqa: F401  (registers "chorus")
    dist.init_process_group("chorus", timeout=datetime.timedelta(seconds=60))
    t = torch.full((COUNT,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.all(t == want), f"all_reduce: {t[:4]}"
    g = [torch.zeros(1000, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(g, torch.arange(1000, dtype=torch.int64) + 1000 * rank)
    for r in range(size):
        assert torch.equal(g[r], torch.arange(1000, dtype=torch.int64) + 1000 * r), f"gather {r}"
    b = torch.arange(5000, dtype=torch.float64) * (3 if rank == 3 else 0)
    dist.broadcast(b, src=3)
    assert torch.equal(b, torch.arange(5000, dtype=torch.float64) * 3), "broadcast"
    out = torch.zeros(size * 10, dtype=torch.int32)
    dist.all_to_all_single(out, torch.arange(size * 10, dtype=torch.int32) + 100 * rank)
    for r in range(size):
        want_block = torch.arange(rank * 10, rank * 10 + 10, dtype=torch.int32) + 100 * r
        assert torch.equal(out[r * 10:(r + 1) * 10], want_block), f"all_to_all block {r}"
    dist.barrier()
    dist.destroy_process_group()
    print(f"HOSTS OK rank={rank} host={os.uname().nodename} provider={provider}", flush=True)


if __name__ == "__main__":
    worker()
    sys.exit(0)

import pytest  # noqa: E402  (the worker above runs without pytest)

from test_from_env_torchrun import chorus_lib  # noqa: E402


def sh(*args):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture
def hosts():
    """Two network namespaces joined by a veth pair; yields their names."""
    tag = str(os.getpid())
    ns = [f"chorus-pyt-{tag}-a", f"chorus-pyt-{tag}-b"]
    veth = [f"chp{tag}a", f"chp{tag}b"]
    why = None
    if os.geteuid() != 0:
        why = "not root"
    elif not shutil.which("ip") or not shutil.which("unshare"):
        why = "no ip (iproute2) or unshare (util-linux)"
    else:
        steps = [("ip", "netns", "add", ns[0]), ("ip", "netns", "add", ns[1]),
                 ("ip", "link", "add", veth[0], "type", "veth", "peer", "name", veth[1])]
        for h in range(2):
            steps += [("ip", "link", "set", veth[h], "netns", ns[h]),
                      ("ip", "-n", ns[h], "addr", "add", f"{ADDRS[h]}/24", "dev", veth[h]),
                      ("ip", "-n", ns[h], "link", "set", veth[h], "up"),
                      ("ip", "-n", ns[h], "link", "set", "lo", "up")]
        for step in steps:
            r = sh(*step)
            if r.returncode:
                why = f"{' '.join(step)}: {r.stdout.strip()}"
                break
    if why:
        for n in ns:
            sh("ip", "netns", "del", n)
        print(f"\n*** test_multihost: SKIPPED: can not build hosts in network namespaces "
              f"({why}) ***", file=sys.stderr)
        pytest.skip(f"can not build hosts in network namespaces ({why})")
    try:
        yield ns
    finally:
        for n in ns:
            sh("ip", "netns", "del", n)


def test_two_hosts_under_torchrun(hosts):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FI_", "MASTER_", "CHORUS_"))}
    env.update(CHORUS_LIB=chorus_lib(), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               CHORUS_CONNECT_TIMEOUT="60",
               # the ranks run elsewhere (cwd): the package's path as an absolute one
               PYTHONPATH=os.pathsep.join(os.path.abspath(p) for p in
                                          env.get("PYTHONPATH", "").split(os.pathsep) if p))
    procs = []
    for h, ns in enumerate(hosts):
        run = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--node_rank", str(h), "--nproc_per_node", "2", "--master_addr", ADDRS[0],
               "--master_port", "29500", "--redirects", "1", "--tee", "1",
               "--max_restarts", "0", "--monitor_interval", "1", os.path.abspath(__file__)]
        # its own hostname: a real second host to Chorus
        cmd = ["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c",
               f"hostname chorus-host-{'ab'[h]} && exec \"$@\"", "sh"] + run
        procs.append(subprocess.Popen(cmd, env=env, cwd=HERE, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    outs, deadline = [], time.monotonic() + 240
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                try:
                    os.killpg(q.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            out, _ = p.communicate()
            outs.append(out)
            pytest.fail("two hosts under torchrun: no end within 240 s:\n" + "\n".join(outs))
        outs.append(out)
    text = "\n".join(f"==== host {'ab'[h]} (exit {p.returncode}) ====\n{o}"
                     for h, (p, o) in enumerate(zip(procs, outs)))
    assert all(p.returncode == 0 for p in procs), text
    ok = sorted({line.split("HOSTS OK ", 1)[1] for o in outs for line in o.splitlines()
                 if "HOSTS OK " in line})
    assert len(ok) == 4, text
    for r in range(4):
        line = next((x for x in ok if x.startswith(f"rank={r} ")), None)
        assert line, f"rank {r} did not finish:\n{text}"
        assert f"host=chorus-host-{'ab'[r // 2]}" in line, line
        assert "provider=shm+sock" in line, line
