/*
 * direct_allgather.c - every rank sends its block to every other rank.
 *
 * One round: rank r sends its block to r+1, r+2, .. r+n-1 and receives
 * block r-k from rank r-k straight into recv, in that order, so that at
 * position k every rank sends to the rank k ahead while it receives from
 * the rank k behind (the pairs of a shift, as in pairwise alltoall).
 * Nothing is forwarded: no receive waits for another, and a send reads the
 * caller's block (send, or recv block r in place), which no receive
 * writes, so the plan has no dependency at all. Each block is cut into
 * chunk_bytes pieces; the message of position k, piece c is (k-1)*K + c
 * (K pieces a block).
 *
 *   n = 3, rank 0:  send b0 -> 1, recv b2 <- 2;  send b0 -> 2, recv b1 <- 1
 *
 * n-1 messages a rank each way, all posted at once: as many bytes as the
 * ring, in one round instead of n-1. Where each message is one copy (shm's
 * rendezvous reads the sender's block in place) and ranks outnumber cores,
 * no rank waits for a chain of others to be scheduled first. It talks to
 * every peer, so a job's first calls pay for first contact with peers it
 * had not talked to (over shm, each sender faults in the receiver's
 * libfabric command queue page by page): slower than rd for a job's first
 * calls, faster once every pair has met.
 */
#include <errno.h>

#include "algos.h"

int algo_direct_allgather(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank;
  const bool inplace = a->inplace;
  plan_builder_t b;
  algo_blocks_t blk;
  int rc;

  *out = NULL;
  if ((rc = algo_blocks_begin(a, "direct", &b, &blk)))
    return rc;
  const size_t bytes = blk.bytes, unit = blk.unit, nch = blk.nch;
  if (!bytes)
    return plan_build_end(&b, out);
  algo_allgather_own(&b, a, bytes);
  for (int k = 1; k < n; k++) {
    const int to = algo_mod(r + k, n), from = algo_mod(r - k, n);
    for (size_t c = 0; c < nch; c++) {
      size_t off = c * unit, len = bytes - off < unit ? bytes - off : unit;
      const uint32_t msg = (uint32_t)((size_t)(k - 1) * nch + c);
      plan_step_t st = {.kind = STEP_SEND, .peer = to, .msg = msg, .bytes = len};
      st.src =
          inplace ? (plan_ref_t){BUF_RECV, (size_t)r * bytes + off} : (plan_ref_t){BUF_SEND, off};
      plan_step_t rv = {.kind = STEP_RECV,
                        .peer = from,
                        .msg = msg,
                        .bytes = len,
                        .dst = {BUF_RECV, (size_t)from * bytes + off}};
      plan_add(&b, &st);
      plan_add(&b, &rv);
    }
  }
  return plan_build_end(&b, out);
}
