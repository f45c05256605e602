"""Every collective and point-to-point call of the "chorus" backend against a
reference computed in Python, for every dtype and reduce op, with
non-contiguous and in-place tensors, asynchronous Work, subgroups and the
bad inputs each call rejects (worker.py holds the checks)."""
from conftest import run_cases

OPS = ["allreduce", "noncontiguous", "broadcast", "reduce", "allgather", "reduce_scatter",
       "alltoall", "gather_scatter", "coalesced", "p2p", "barrier"]


def test_collectives_2_ranks():
    run_cases(2, OPS)


def test_collectives_4_ranks_and_subgroups():
    run_cases(4, OPS + ["subgroups"], timeout=240)


def test_async_work_and_errors_2_ranks():
    res = run_cases(2, ["async_work", "async_error"])
    for out in res.outputs:
        assert "mismatched allreduce raised: chorus allreduce failed: " in out


def test_bad_inputs_2_ranks():
    res = run_cases(2, ["bad_inputs"])
    # each rank went through every bad input (the check of its exact text is in worker.py)
    assert res.outputs[0].count("bad input -> ") >= 35, res.text()


def test_single_rank():
    run_cases(1, ["allreduce", "broadcast", "allgather", "reduce_scatter", "alltoall",
                  "gather_scatter", "coalesced", "barrier"])
