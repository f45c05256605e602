/*
 * pairwise_alltoall.c - pairwise exchange alltoall.
 *
 * Step s = 1 .. n-1: rank r sends its block (r+s) to rank r+s and receives
 * block (r-s) of recv from rank r-s; its own block is copied. Every step
 * pairs each rank with one sender and one receiver, so no rank is flooded.
 * Blocks are cut into chunk_bytes chunks; chunk c of step s waits for chunk
 * c of step s-1 (its send for the previous receive, its receive for the
 * previous send), which keeps about one step in flight per chunk position
 * while large blocks still stream.
 *
 *   n = 4, s = 1:  0->1  1->2  2->3  3->0
 *          s = 2:  0->2  1->3  2->0  3->1
 *          s = 3:  0->3  1->0  2->1  3->2
 *
 * Message of step s, chunk c: (s-1)*k + c (k chunks a block).
 * Alltoall has no in-place form (chorus.h): inplace is -EINVAL.
 */
#include <errno.h>
#include <stdlib.h>

#include "algos.h"

int algo_pairwise_alltoall(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank;
  plan_builder_t b;
  algo_blocks_t blk;
  int rc;

  *out = NULL;
  if (a->inplace)
    return -EINVAL;
  if ((rc = algo_blocks_begin(a, "pairwise", &b, &blk)))
    return rc;
  const size_t bytes = blk.bytes, unit = blk.unit, nch = blk.nch;
  if (!bytes)
    return plan_build_end(&b, out);
  plan_step_t cp = {.kind = STEP_COPY,
                    .bytes = bytes,
                    .dst = {BUF_RECV, (size_t)r * bytes},
                    .src = {BUF_SEND, (size_t)r * bytes}};
  plan_add(&b, &cp);

  /* the previous step's send and receive of each chunk position */
  uint32_t *psend = malloc(nch * sizeof(*psend)), *precv = malloc(nch * sizeof(*precv));
  if (!psend || !precv) {
    b.err = -ENOMEM;
    goto out;
  }
  for (size_t c = 0; c < nch; c++)
    psend[c] = precv[c] = UINT32_MAX;
  for (int s = 1; s < n; s++) {
    int to = algo_mod(r + s, n), from = algo_mod(r - s, n);
    for (size_t c = 0; c < nch; c++) {
      size_t off = c * unit, len = bytes - off < unit ? bytes - off : unit;
      uint32_t msg = (uint32_t)((size_t)(s - 1) * nch + c);
      plan_step_t st = {.kind = STEP_SEND,
                        .peer = to,
                        .msg = msg,
                        .bytes = len,
                        .src = {BUF_SEND, (size_t)to * bytes + off}};
      plan_step_t rv = {.kind = STEP_RECV,
                        .peer = from,
                        .msg = msg,
                        .bytes = len,
                        .dst = {BUF_RECV, (size_t)from * bytes + off}};
      uint32_t i = plan_add(&b, &st), j = plan_add(&b, &rv);
      plan_dep(&b, precv[c], i);
      plan_dep(&b, psend[c], j);
      psend[c] = i;
      precv[c] = j;
    }
  }
out:
  free(psend);
  free(precv);
  return plan_build_end(&b, out);
}
