/*
 * linear_bcast.c - flat broadcast: the root sends to every other rank
 * itself, and each receiver takes the root's data directly (one hop).
 *
 *   v0 -> v1, v2, ..., v(n-1)
 *
 * Over shm every receiver copies from the root's own buffer (by CMA, or in
 * place when it is mapped), all at once, and nobody forwards data that a
 * peer has just written. The root sends from its send buffer (and copies it
 * to its receive buffer when not in place); others receive into their
 * receive buffer. Chunk c to each rank is message c of that pair; no step
 * depends on another, so no cycle can form.
 */
#include <errno.h>

#include "algos.h"

int algo_linear_bcast(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks;
  const size_t total = a->count * chorus_dtype_size(a->dtype);
  plan_builder_t b;
  int rc;

  if (algo_bcast_begin(a, "linear", &b, out, &rc))
    return rc;

  const size_t unit = algo_chunk_unit(a->chunk_bytes, chorus_dtype_size(a->dtype));
  const size_t nch = algo_npieces(total, unit);
  if (nch >= ALGO_MAX_MSGS) {
    b.err = -E2BIG;
    return plan_build_end(&b, out);
  }
  for (uint32_t c = 0; c < nch; c++) {
    const size_t off = c * unit, bytes = total - off < unit ? total - off : unit;
    if (a->rank != a->root)
      plan_add(&b, &(plan_step_t){.kind = STEP_RECV,
                                  .peer = a->root,
                                  .msg = c,
                                  .bytes = bytes,
                                  .dst = {BUF_RECV, off}});
    else
      for (int u = 1; u < n; u++)
        plan_add(&b, &(plan_step_t){.kind = STEP_SEND,
                                    .peer = algo_mod(u + a->root, n),
                                    .msg = c,
                                    .bytes = bytes,
                                    .src = {BUF_SEND, off}});
  }
  return plan_build_end(&b, out);
}
