/*
 * ring_allgather.c - pipelined ring allgather.
 *
 * Block k (count elements) of recv comes from rank k. Steps s = 0 .. n-2:
 * rank r sends block (r - s) to r+1 and receives block (r - s - 1) from
 * r-1 straight into recv, to forward it at the next step. Blocks are cut
 * into chunks of at most chunk_bytes and every chunk position travels the
 * ring on its own, so chunk c+1 is on the wire while chunk c is forwarded.
 *
 *          rank0      rank1      rank2          (n = 3)
 *   s=0    b0 -->     b1 -->     b2 --> rank0
 *   s=1    b2 -->     b0 -->     b1 --> rank0
 *
 * Step 0 reads the rank's own block where the caller put it (send, or recv
 * block r in place); out of place it is also copied to recv block r, which
 * no receive writes. Dependencies: send(s, c) after recv(s-1, c). Message
 * of step s, chunk c: s*k + c (k chunks a block). Steps are built
 * chunk-major, so every dependency points backwards in one order shared by
 * all ranks.
 */
#include <errno.h>
#include <stdlib.h>

#include "algos.h"

int algo_ring_allgather(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank;
  const bool inplace = a->inplace;
  plan_builder_t b;
  algo_blocks_t blk;
  int rc;

  *out = NULL;
  if ((rc = algo_blocks_begin(a, "ring", &b, &blk)))
    return rc;
  const size_t bytes = blk.bytes, unit = blk.unit, nch = blk.nch;
  if (!bytes)
    return plan_build_end(&b, out);
  algo_allgather_own(&b, a, bytes);
  const int right = algo_mod(r + 1, n), left = algo_mod(r - 1, n);
  for (size_t c = 0; c < nch; c++) {
    size_t off = c * unit, len = bytes - off < unit ? bytes - off : unit;
    uint32_t prev = UINT32_MAX;
    for (int s = 0; s < n - 1; s++) {
      size_t ks = (size_t)algo_mod(r - s, n), kr = (size_t)algo_mod(r - s - 1, n);
      uint32_t msg = (uint32_t)((size_t)s * nch + c);
      plan_step_t st = {.kind = STEP_SEND, .peer = right, .msg = msg, .bytes = len};
      st.src = s == 0 && !inplace ? (plan_ref_t){BUF_SEND, off}
                                  : (plan_ref_t){BUF_RECV, ks * bytes + off};
      plan_step_t rv = {.kind = STEP_RECV,
                        .peer = left,
                        .msg = msg,
                        .bytes = len,
                        .dst = {BUF_RECV, kr * bytes + off}};
      uint32_t i = plan_add(&b, &st);
      plan_dep(&b, prev, i);
      prev = plan_add(&b, &rv);
    }
  }
  return plan_build_end(&b, out);
}
