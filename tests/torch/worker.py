"""One rank of a chorus_torch test job: `worker.py CASE...`.

Joins the default process group over "chorus" (env://: conftest.run_job sets
the variables), runs each named case, prints "PASSED <case>" after each, and
exits non-zero at the first failure (the traceback says which check). Every
rank computes every rank's inputs itself (they are functions of the rank), so
each result is checked against a reference computed here in float64.
"""
import datetime
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

import chorus_torch  # noqa: F401  (registers "chorus")

DTYPES = [torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64]
OPS = {"SUM": ReduceOp.SUM, "AVG": ReduceOp.AVG, "PRODUCT": ReduceOp.PRODUCT,
       "MIN": ReduceOp.MIN, "MAX": ReduceOp.MAX}
INTS = (torch.int8, torch.uint8, torch.int32, torch.int64)

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def data(rank, n, dtype, op="SUM", salt=0):
    """Rank `rank`'s input: small integers, exact in every dtype (products
    of 1s and 2s, sums of at most 4 values up to 8)."""
    k = torch.arange(n, dtype=torch.int64)
    if dtype == torch.bool:
        return ((k + rank + salt) % 3 != 0)
    if op == "PRODUCT":
        v = (k + rank + salt) % 2 + 1
    else:
        v = (k * 3 + rank * 5 + salt) % 8 + 1
    return v.to(dtype)


def reference(op, inputs, dtype):
    st = torch.stack([t.double() for t in inputs])
    if op == "SUM":
        r = st.sum(0)
    elif op == "PRODUCT":
        r = st.prod(0)
    elif op == "MIN":
        r = st.min(0).values
    elif op == "MAX":
        r = st.max(0).values
    elif op == "AVG":
        r = st.sum(0) / len(inputs)
        if dtype in INTS:
            r = torch.trunc(r)  # Chorus's integer average truncates
    return r.to(dtype)


def expect_equal(got, want, what):
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError(f"{what}: got {got.dtype} {tuple(got.shape)} {got.flatten()[:8]}, "
                             f"want {want.dtype} {tuple(want.shape)} {want.flatten()[:8]}")


def others(n, dtype, op="SUM", salt=0):
    return [data(r, n, dtype, op, salt) for r in range(WORLD)]


# ---------------------------------------------------------------- collectives

@case
def allreduce():
    for dtype in DTYPES:
        for op in OPS:
            for n in (37, 0, 3000):
                t = data(RANK, n, dtype, op)
                dist.all_reduce(t, op=OPS[op])
                expect_equal(t, reference(op, others(n, dtype, op), dtype),
                             f"all_reduce {dtype} {op} n={n}")
    for op in ("MIN", "MAX", "PRODUCT"):
        t = data(RANK, 29, torch.bool)
        dist.all_reduce(t, op=OPS[op])
        expect_equal(t, reference(op, others(29, torch.bool), torch.bool),
                     f"all_reduce bool {op}")
    # 2-D, and large enough for the bandwidth algorithms
    for dtype, shape in ((torch.float32, (5, 7)), (torch.float32, (1 << 20) + 3),
                         (torch.bfloat16, (257, 1024))):
        n = torch.Size(shape if isinstance(shape, tuple) else (shape,)).numel()
        t = data(RANK, n, dtype).reshape(shape)
        dist.all_reduce(t)
        expect_equal(t, reference("SUM", others(n, dtype), dtype).reshape(shape),
                     f"all_reduce {dtype} {shape}")


@case
def noncontiguous():
    """Strided views are reduced in place: the base tensor sees the result."""
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        base = data(RANK, 48, dtype).reshape(6, 8)
        view = base.t()  # non-contiguous
        assert not view.is_contiguous()
        dist.all_reduce(view)
        want = reference("SUM", [data(r, 48, dtype).reshape(6, 8) for r in range(WORLD)], dtype)
        expect_equal(base, want, f"all_reduce of a transposed view {dtype}")
        base = data(RANK, 40, dtype)
        keep = base.clone()
        dist.all_reduce(base[::2], op=ReduceOp.MAX)  # every other element only
        want = keep.clone()
        want[::2] = reference("MAX", [data(r, 40, dtype)[::2] for r in range(WORLD)], dtype)
        expect_equal(base, want, f"all_reduce of a stepped slice {dtype}")
        b = data(RANK, 30, dtype).reshape(5, 6).t()
        dist.broadcast(b, src=WORLD - 1)
        expect_equal(b, data(WORLD - 1, 30, dtype).reshape(5, 6).t(), "broadcast of a view")


@case
def broadcast():
    for dtype in DTYPES + [torch.bool]:
        for root in range(WORLD):
            t = data(RANK, 21, dtype)
            dist.broadcast(t, src=root)
            expect_equal(t, data(root, 21, dtype), f"broadcast {dtype} root {root}")
    t = data(RANK, 1 << 20, torch.float32)
    dist.broadcast(t, src=WORLD - 1)
    expect_equal(t, data(WORLD - 1, 1 << 20, torch.float32), "broadcast 4 MiB")


@case
def reduce():
    for dtype in DTYPES:
        for op in ("SUM", "MAX", "AVG"):
            for root in range(WORLD):
                t = data(RANK, 19, dtype, op)
                mine = t.clone()
                dist.reduce(t, dst=root, op=OPS[op])
                want = reference(op, others(19, dtype, op), dtype) if RANK == root else mine
                expect_equal(t, want, f"reduce {dtype} {op} root {root} (rank {RANK})")


@case
def allgather():
    for dtype in DTYPES + [torch.bool]:
        n = 13
        t = data(RANK, n, dtype)
        outs = [torch.zeros(n, dtype=dtype) for _ in range(WORLD)]
        dist.all_gather(outs, t)
        for r in range(WORLD):
            expect_equal(outs[r], data(r, n, dtype), f"all_gather {dtype} block {r}")
        out = torch.zeros(WORLD * n, dtype=dtype)
        dist.all_gather_into_tensor(out, t)
        expect_equal(out, torch.cat(others(n, dtype)), f"all_gather_into_tensor {dtype}")
    # 2-D output, non-contiguous outputs and input, in place
    t = data(RANK, 12, torch.float32).reshape(3, 4)
    out = torch.zeros(WORLD * 3, 4)
    dist.all_gather_into_tensor(out, t)
    expect_equal(out, torch.cat([x.reshape(3, 4) for x in others(12, torch.float32)]),
                 "all_gather_into_tensor 2-D")
    outs = [torch.zeros(4, 3).t() for _ in range(WORLD)]
    dist.all_gather(outs, t.t().contiguous().t())  # a non-contiguous input
    for r in range(WORLD):
        expect_equal(outs[r], data(r, 12, torch.float32).reshape(3, 4),
                     f"all_gather into transposed views, block {r}")
    out = torch.zeros(WORLD * 8, dtype=torch.int32)
    mine = out[RANK * 8:(RANK + 1) * 8]
    mine.copy_(data(RANK, 8, torch.int32))
    dist.all_gather_into_tensor(out, mine)  # in place: the input is the own block
    expect_equal(out, torch.cat(others(8, torch.int32)), "all_gather_into_tensor in place")
    big = data(RANK, 1 << 19, torch.float32)
    out = torch.empty(WORLD << 19)
    dist.all_gather_into_tensor(out, big)
    expect_equal(out, torch.cat(others(1 << 19, torch.float32)), "all_gather 2 MiB blocks")


@case
def reduce_scatter():
    for dtype in DTYPES:
        for op in OPS:
            n = 11
            ins = [data(RANK, n, dtype, op, salt=j) for j in range(WORLD)]
            out = torch.zeros(n, dtype=dtype)
            dist.reduce_scatter(out, ins, op=OPS[op])
            want = reference(op, [data(r, n, dtype, op, salt=RANK) for r in range(WORLD)], dtype)
            expect_equal(out, want, f"reduce_scatter {dtype} {op}")
            out2 = torch.zeros(n, dtype=dtype)
            dist.reduce_scatter_tensor(out2, torch.cat(ins), op=OPS[op])
            expect_equal(out2, want, f"reduce_scatter_tensor {dtype} {op}")
    # non-contiguous output, 2-D input
    ins = torch.stack([data(RANK, 10, torch.float64, salt=j) for j in range(WORLD)])
    out = torch.zeros(5, 2, dtype=torch.float64).t()
    dist.reduce_scatter_tensor(out, ins.reshape(WORLD, 2, 5))
    want = reference("SUM", [data(r, 10, torch.float64, salt=RANK) for r in range(WORLD)],
                     torch.float64).reshape(2, 5)
    expect_equal(out, want, "reduce_scatter_tensor into a transposed view")


@case
def alltoall():
    for dtype in DTYPES:
        n = 5  # elements per block
        inp = torch.cat([data(RANK, n, dtype, salt=p) for p in range(WORLD)])
        out = torch.zeros(WORLD * n, dtype=dtype)
        dist.all_to_all_single(out, inp)
        want = torch.cat([data(p, n, dtype, salt=RANK) for p in range(WORLD)])
        expect_equal(out, want, f"all_to_all_single {dtype}")

    # uneven: rank r sends rows(r, p) rows of width 4 to rank p, some of them none
    def rows(src, dst):
        return (src + 2 * dst) % 3

    def block(src, dst):
        k = rows(src, dst)
        return (torch.arange(k * 4, dtype=torch.int64) + 1000 * src + 100 * dst).reshape(k, 4)

    in_splits = [rows(RANK, p) for p in range(WORLD)]
    out_splits = [rows(p, RANK) for p in range(WORLD)]
    for dtype in (torch.float32, torch.int64, torch.float64):
        inp = torch.cat([block(RANK, p) for p in range(WORLD)]).to(dtype)
        out = torch.full((sum(out_splits), 4), -1).to(dtype)
        dist.all_to_all_single(out, inp, out_splits, in_splits)
        want = torch.cat([block(p, RANK) for p in range(WORLD)]).to(dtype)
        expect_equal(out, want, f"all_to_all_single uneven {dtype}")
    # only one side's splits given: the other is equal blocks
    inp = torch.cat([torch.full((2, 3), float(RANK * 10 + p)) for p in range(WORLD)])
    out = torch.zeros(WORLD * 2, 3)
    dist.all_to_all_single(out, inp, [2] * WORLD, None)
    want = torch.cat([torch.full((2, 3), float(p * 10 + RANK)) for p in range(WORLD)])
    expect_equal(out, want, "all_to_all_single with output splits only")
    # list form, a different size per peer, a non-contiguous input
    ins = [torch.full((RANK + 1, p + 1), float(RANK * 10 + p)).t().t() for p in range(WORLD)]
    ins[0] = torch.full((1 + 0, RANK + 1), float(RANK * 10)).t()
    outs = [torch.zeros(p + 1, RANK + 1) for p in range(WORLD)]
    outs[0] = torch.zeros(RANK + 1, 1)
    if RANK == 0:
        outs = [torch.zeros(1, 1)] + [torch.zeros(p + 1, 1) for p in range(1, WORLD)]
    dist.all_to_all(outs, ins)
    for p in range(WORLD):
        expect_equal(outs[p], torch.full(outs[p].shape, float(p * 10 + RANK)),
                     f"all_to_all list block from {p}")


@case
def gather_scatter():
    for dtype in DTYPES + [torch.bool]:
        for root in range(WORLD):
            t = data(RANK, 9, dtype)
            lst = [torch.zeros(9, dtype=dtype) for _ in range(WORLD)] if RANK == root else None
            dist.gather(t, gather_list=lst, dst=root)
            if RANK == root:
                for r in range(WORLD):
                    expect_equal(lst[r], data(r, 9, dtype), f"gather {dtype} root {root}")
            out = torch.zeros(9, dtype=dtype)
            src = [data(p, 9, dtype, salt=root) for p in range(WORLD)] if RANK == root else None
            dist.scatter(out, scatter_list=src, src=root)
            expect_equal(out, data(RANK, 9, dtype, salt=root), f"scatter {dtype} root {root}")
    out = torch.zeros(3, 4).t()  # scatter into a view
    src = [torch.full((4, 3), float(p)) for p in range(WORLD)] if RANK == 0 else None
    dist.scatter(out, scatter_list=src, src=0)
    expect_equal(out, torch.full((4, 3), float(RANK)), "scatter into a transposed view")


@case
def coalesced():
    for dtype in (torch.float32, torch.int32, torch.float16):
        ts = [data(RANK, 7, dtype), data(RANK, 30, dtype, salt=1).reshape(5, 6).t(),
              data(RANK, 0, dtype), data(RANK, 1000, dtype, salt=2)]
        dist.all_reduce_coalesced(ts)
        wants = [reference("SUM", others(7, dtype), dtype),
                 reference("SUM", others(30, dtype, salt=1), dtype).reshape(5, 6).t(),
                 reference("SUM", others(0, dtype), dtype),
                 reference("SUM", others(1000, dtype, salt=2), dtype)]
        for i, (t, w) in enumerate(zip(ts, wants)):
            expect_equal(t, w, f"all_reduce_coalesced {dtype} tensor {i}")


@case
def p2p():
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    for dtype in DTYPES + [torch.bool]:
        t = data(RANK, 17, dtype)
        got = torch.zeros(17, dtype=dtype)
        if RANK % 2 == 0:
            dist.send(t, nxt)
            dist.recv(got, prv)
        else:
            dist.recv(got, prv)
            dist.send(t, nxt)
        expect_equal(got, data(prv, 17, dtype), f"send/recv {dtype}")
    # nonblocking, several in flight, into a view, 4 MiB
    big = data(RANK, 1 << 20, torch.float32)
    gbig = torch.zeros(1 << 20)
    view = torch.zeros(4, 6).t()
    reqs = [dist.isend(big, nxt), dist.irecv(gbig, prv),
            dist.isend(data(RANK, 24, torch.float32).reshape(6, 4), nxt), dist.irecv(view, prv)]
    for r in reqs:
        r.wait()
    expect_equal(gbig, data(prv, 1 << 20, torch.float32), "isend/irecv 4 MiB")
    expect_equal(view, data(prv, 24, torch.float32).reshape(6, 4), "irecv into a view")
    ops = [dist.P2POp(dist.isend, data(RANK, 5, torch.int64), nxt),
           dist.P2POp(dist.irecv, got64 := torch.zeros(5, dtype=torch.int64), prv)]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    expect_equal(got64, data(prv, 5, torch.int64), "batch_isend_irecv")


@case
def barrier():
    for _ in range(3):
        dist.barrier()
    t0 = time.monotonic()
    if RANK == 0:
        time.sleep(0.4)
    dist.barrier()
    waited = time.monotonic() - t0
    if RANK != 0 and waited < 0.3:
        raise AssertionError(f"barrier returned after {waited:.3f} s while rank 0 slept 0.4 s")


# ---------------------------------------------------------------- asynchrony

@case
def async_work():
    t = data(RANK, 1 << 18, torch.float32)
    work = dist.all_reduce(t, async_op=True)
    spins = 0
    while not work.is_completed():
        spins += 1
        time.sleep(0.0005)
    assert work.is_success(), "a finished allreduce is not a success"
    assert work.wait() is True
    expect_equal(t, reference("SUM", others(1 << 18, torch.float32), torch.float32),
                 "async all_reduce (polled)")
    # several in flight, waited for in reverse order; futures and callbacks
    ts = [data(RANK, 1000 + i, torch.float64, salt=i) for i in range(6)]
    works = [dist.all_reduce(x, async_op=True) for x in ts]
    futs = [w.get_future() for w in works[:3]]
    doubled = futs[0].then(lambda f: f.value()[0] * 2)
    for w in reversed(works):
        w.wait()
    for i, x in enumerate(ts):
        want = reference("SUM", others(1000 + i, torch.float64, salt=i), torch.float64)
        expect_equal(x, want, f"async all_reduce {i}")
        if i < 3:
            expect_equal(futs[i].wait()[0], want, f"future value {i}")
    expect_equal(doubled.wait(), 2 * ts[0], "future then()")
    # a future's value without anyone calling wait() (as DDP uses it)
    x = data(RANK, 64, torch.float32)
    fut = dist.all_reduce(x, async_op=True).get_future()
    deadline = time.monotonic() + 30
    while not fut.done():
        if time.monotonic() > deadline:
            raise AssertionError("a future nobody waits for did not complete in 30 s")
        time.sleep(0.001)
    expect_equal(fut.value()[0], reference("SUM", others(64, torch.float32), torch.float32),
                 "future completed by the completion thread")
    # the computation goes on while the operation runs
    y = data(RANK, 1 << 20, torch.float32)
    w = dist.all_reduce(y, async_op=True)
    z = torch.ones(256, 256) @ torch.ones(256, 256)
    w.wait()
    assert z[0, 0].item() == 256
    # wait(timeout): a receive whose send comes 1.5 s later
    if RANK in (0, 1):
        peer = 1 - RANK
        buf = torch.zeros(8)
        if RANK == 0:
            w = dist.irecv(buf, peer)
            t0 = time.monotonic()
            try:
                w.wait(timeout=datetime.timedelta(seconds=0.5))
            except RuntimeError as e:
                took = time.monotonic() - t0
                assert str(e) == ("chorus recv: Work.wait timed out after 500 ms (the operation "
                                  "goes on; wait again or destroy the group)"), str(e)
                assert 0.45 < took < 1.5, f"wait(timeout=0.5 s) took {took:.3f} s"
            else:
                raise AssertionError("wait(timeout) on an unmatched receive returned")
            assert not w.is_completed()
            w.wait()
            expect_equal(buf, torch.arange(8.0), "the receive, after its timeout")
        else:
            time.sleep(1.5)
            dist.send(torch.arange(8.0), peer)
    dist.barrier()


@case
def async_error():
    """A failure on a subgroup's communicator reaches Work.wait and the
    future as a RuntimeError naming the collective; the default group
    goes on working."""
    g = dist.new_group([0, 1])
    if RANK in (0, 1):
        t = torch.ones(10 + 2 * RANK)  # different counts: Chorus sees the mismatch
        w = dist.all_reduce(t, group=g, async_op=True)
        fut = w.get_future()
        try:
            w.wait()
        except RuntimeError as e:
            msg = str(e)
            assert msg.startswith("chorus allreduce failed: "), msg
            assert "allreduce" in msg[len("chorus allreduce failed: "):], msg
            print(f"rank {RANK}: mismatched allreduce raised: {msg}")
        else:
            raise AssertionError("a mismatched allreduce succeeded")
        assert w.is_completed() and not w.is_success()
        try:
            fut.wait()
        except RuntimeError as e:
            assert str(e) == msg, (str(e), msg)
        else:
            raise AssertionError("the failed allreduce's future holds a value")
        try:
            dist.all_reduce(torch.ones(3), group=g)
        except RuntimeError as e:
            assert "failed earlier" in str(e), str(e)
        else:
            raise AssertionError("a failed communicator ran another allreduce")
    dist.destroy_process_group(g)
    t = torch.ones(4)
    dist.all_reduce(t)
    expect_equal(t, torch.full((4,), float(WORLD)), "the default group after a subgroup failed")


# ---------------------------------------------------------------- groups

@case
def subgroups():
    groups = {"01": [0, 1], "23": [2, 3], "13": [1, 3], "123": [1, 2, 3], "all": list(range(WORLD))}
    made = {k: dist.new_group(v) for k, v in groups.items() if max(v) < WORLD}
    for name, ranks in groups.items():
        if name not in made or RANK not in ranks:
            continue
        g = made[name]
        assert dist.get_world_size(g) == len(ranks) and dist.get_rank(g) == ranks.index(RANK)
        t = torch.full((5,), float(RANK + 1))
        dist.all_reduce(t, group=g)
        expect_equal(t, torch.full((5,), float(sum(r + 1 for r in ranks))), f"group {name}")
        b = torch.full((3,), float(RANK))
        dist.broadcast(b, src=ranks[-1], group=g)  # a global rank
        expect_equal(b, torch.full((3,), float(ranks[-1])), f"broadcast in group {name}")
        outs = [torch.zeros(2) for _ in ranks]
        dist.all_gather(outs, torch.full((2,), float(RANK)), group=g)
        for i, r in enumerate(ranks):
            expect_equal(outs[i], torch.full((2,), float(r)), f"all_gather in group {name}")
    for g in made.values():
        dist.destroy_process_group(g)
    t = torch.ones(2)
    dist.all_reduce(t)
    expect_equal(t, torch.full((2,), float(WORLD)), "the default group after subgroups")


# ---------------------------------------------------------------- bad inputs

def raises(exc, message, fn):
    try:
        fn()
    except exc as e:
        if str(e) != message:
            raise AssertionError(f"wrong message:\n  got:  {str(e)!r}\n  want: {message!r}")
        print(f"bad input -> {exc.__name__}: {message}")
    else:
        raise AssertionError(f"no {exc.__name__} for: {message}")


@case
def bad_inputs():
    W = WORLD
    f4 = torch.ones(4)
    # torch's Python layer checks some arguments before the backend does:
    # those go to the process group object directly
    pg = dist.distributed_c10d._get_default_group()
    meta = torch.empty(4, device="meta")
    raises(TypeError, "chorus allgather_into_tensor: the input is on meta; the chorus backend "
           "takes CPU tensors only", lambda: dist.all_gather_into_tensor(torch.empty(4 * W), meta))
    raises(TypeError, "chorus alltoall_base: the output is on meta; the chorus backend takes "
           "CPU tensors only", lambda: dist.all_to_all_single(torch.empty(4 * W, device="meta"),
                                                                torch.ones(4 * W)))
    raises(TypeError, "chorus allreduce: the tensor is not a dense (strided) tensor; sparse "
           "tensors are not supported", lambda: dist.all_reduce(torch.ones(3).to_sparse()))
    raises(TypeError, "chorus allreduce: the tensor has dtype torch.int16, not supported "
           "(supported: torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, "
           "torch.bfloat16, torch.float32, torch.float64, torch.bool)",
           lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)))
    raises(TypeError, "chorus broadcast: the tensor has dtype torch.complex64, not supported "
           "(supported: torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, "
           "torch.bfloat16, torch.float32, torch.float64, torch.bool)",
           lambda: dist.broadcast(torch.ones(3, dtype=torch.complex64), 0))
    for op in ("BAND", "BOR", "BXOR"):
        raises(ValueError, f"chorus allreduce: reduce op {op} is not supported (supported: SUM, "
               "AVG, PRODUCT, MIN, MAX)", lambda: dist.all_reduce(f4, op=getattr(ReduceOp, op)))
    raises(ValueError, "chorus allreduce: reduce op PREMUL_SUM is not supported (supported: SUM, "
           "AVG, PRODUCT, MIN, MAX)",
           lambda: dist.all_reduce(f4, op=dist._make_nccl_premul_sum(2.0)))
    raises(ValueError, "chorus reduce_scatter_tensor: reduce op BXOR is not supported "
           "(supported: SUM, AVG, PRODUCT, MIN, MAX)",
           lambda: dist.reduce_scatter_tensor(f4, torch.ones(4 * W), op=ReduceOp.BXOR))
    raises(ValueError, "chorus allreduce: reduce op SUM on torch.bool is not supported (MAX is "
           "a logical or, MIN and PRODUCT a logical and)",
           lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool)))
    raises(ValueError, f"chorus broadcast: root {W + 3} is not a rank of this group of {W}",
           lambda: dist.broadcast(f4, W + 3))
    raises(ValueError, f"chorus reduce: root -1 is not a rank of this group of {W}",
           lambda: dist.reduce(f4, -1))
    raises(ValueError, f"chorus gather: root {W} is not a rank of this group of {W}",
           lambda: dist.gather(f4, None, dst=W))
    raises(ValueError, f"chorus scatter: root {W} is not a rank of this group of {W}",
           lambda: dist.scatter(f4, None, src=W))
    mixed = [torch.zeros(4) for _ in range(W)]
    mixed[-1] = torch.zeros(4, dtype=torch.float64)
    raises(TypeError, f"chorus allgather: output {W - 1} has dtype torch.float64 but the input "
           "has torch.float32 (one dtype per call)", lambda: pg.allgather([mixed], [f4]))
    sized = [torch.zeros(4) for _ in range(W)]
    sized[0] = torch.zeros(5)
    raises(ValueError, "chorus allgather: output 0 has shape [5] but the input has [4] (one "
           "shape per call)", lambda: dist.all_gather(sized, f4))
    raises(ValueError, f"chorus allgather: output list length {W + 1}, expected {W}",
           lambda: dist.all_gather([torch.zeros(4) for _ in range(W + 1)], f4))
    raises(ValueError, f"chorus reduce_scatter: input 1 has shape [3] but the output has [4] "
           "(one shape per call)",
           lambda: dist.reduce_scatter(f4, [torch.ones(4)] + [torch.ones(3)] * (W - 1)))
    raises(ValueError, f"chorus reduce_scatter: input list length {W - 1}, expected {W}",
           lambda: dist.reduce_scatter(f4, [torch.ones(4)] * (W - 1)))
    raises(TypeError, "chorus allreduce_coalesced: tensor 1 has dtype torch.float64 but tensor "
           "0 has torch.float32 (one dtype per call)",
           lambda: pg.allreduce_coalesced([f4, torch.ones(2, dtype=torch.float64)],
                                          dist.AllreduceCoalescedOptions()))
    raises(ValueError, f"chorus allgather_into_tensor: output elements {4 * W + 1}, expected "
           f"{4 * W}", lambda: dist.all_gather_into_tensor(torch.zeros(4 * W + 1), f4))
    raises(TypeError, "chorus allgather_into_tensor: the output has dtype torch.int32 but the "
           "input has torch.float32 (one dtype per call)",
           lambda: dist.all_gather_into_tensor(torch.zeros(4 * W, dtype=torch.int32), f4))
    raises(ValueError, f"chorus reduce_scatter_tensor: input elements {4 * W - 1}, expected "
           f"{4 * W}", lambda: dist.reduce_scatter_tensor(f4, torch.ones(4 * W - 1)))
    raises(ValueError, f"chorus alltoall_base: the input split sizes add up to {W + 1} but its "
           f"first dimension is {W}",
           lambda: dist.all_to_all_single(torch.zeros(W), torch.ones(W), [1] * W,
                                          [1] * (W - 1) + [2]))
    raises(ValueError, f"chorus alltoall_base: {W + 1} output split sizes for a group of {W}",
           lambda: dist.all_to_all_single(torch.zeros(W), torch.ones(W), [1] * (W + 1), [1] * W))
    raises(ValueError, "chorus alltoall_base: negative input split size -1",
           lambda: dist.all_to_all_single(torch.zeros(W), torch.ones(W), [1] * W,
                                          [-1] + [1] * (W - 2) + [2]))
    raises(ValueError, f"chorus alltoall_base: {W * 2 + 1} elements do not divide into {W} "
           "equal blocks",
           lambda: dist.all_to_all_single(torch.zeros(W * 2 + 1), torch.ones(W * 2 + 1)))
    raises(ValueError, f"chorus alltoall_base: output elements {W}, expected {2 * W}",
           lambda: dist.all_to_all_single(torch.zeros(W), torch.ones(2 * W)))
    raises(ValueError, f"chorus alltoall: input list length {W - 1}, expected {W}",
           lambda: dist.all_to_all([f4.clone() for _ in range(W)], [f4] * (W - 1)))
    if RANK != 0:
        go = dist.GatherOptions()
        go.rootRank = 0
        raises(ValueError, f"chorus gather: only the root (rank 0) passes an output list; rank "
               f"{RANK} passed {W} tensors",
               lambda: pg.gather([[f4.clone() for _ in range(W)]], [f4], go))
    else:
        raises(ValueError, f"chorus scatter: input list length {W + 1}, expected {W}",
               lambda: dist.scatter(f4, [f4.clone() for _ in range(W + 1)], src=0))
    raises(ValueError, f"chorus send: destination {RANK} is this rank itself",
           lambda: dist.send(f4, RANK))
    raises(ValueError, f"chorus recv: source {W} is not a rank of this group of {W}",
           lambda: dist.recv(f4, W))
    raises(ValueError, "chorus send: tag 7 is not supported: Chorus matches a pair's messages in "
           "the order of the calls; pass tag=0", lambda: dist.send(f4, (RANK + 1) % W, tag=7))
    raises(ValueError, "chorus recv: a receive from any source (src=None) is not supported: "
           "name the source rank", lambda: dist.recv(f4))
    raises(ValueError, "chorus allreduce: expects exactly one tensor per process, got 2",
           lambda: pg.allreduce([f4, f4.clone()]))
    raises(ValueError, "chorus broadcast: rootTensor 1 but there is one tensor per process",
           lambda: pg.broadcast([f4], _bopts(1)))
    # nothing above reached the communicator: it still works
    t = torch.ones(6)
    dist.all_reduce(t)
    expect_equal(t, torch.full((6,), float(W)), "allreduce after the bad inputs")


def _bopts(root_tensor):
    o = dist.BroadcastOptions()
    o.rootRank = 0
    o.rootTensor = root_tensor
    return o


def main(argv):
    dist.init_process_group("chorus", timeout=datetime.timedelta(seconds=60))
    assert dist.get_backend() == "chorus"
    for name in argv:
        try:
            CASES[name]()
        except BaseException:
            # out at once: a normal exit would destroy the group, which
            # waits for the other ranks (up to CHORUS_CONNECT_TIMEOUT)
            traceback.print_exc()
            print(f"FAILED {name}", flush=True)
            sys.stderr.flush()
            os._exit(1)
        print(f"PASSED {name}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
