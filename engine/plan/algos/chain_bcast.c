/*
 * chain_bcast.c - pipelined chain broadcast (bandwidth bound for large
 * messages: after the pipeline fills, every link carries a chunk at once).
 *
 *   root -> root+1 -> root+2 -> ... -> root-1        (one chunk per message)
 *
 * Rank v = (r - root) mod n receives chunk c from v-1 into its receive
 * buffer and forwards it to v+1; the root sends from its send buffer (and
 * copies it to its receive buffer when not in place). Chunk c's forward
 * waits only for chunk c's receive: no cycle can form.
 * Message number: the chunk.
 */
#include <errno.h>

#include "algos.h"

int algo_chain_bcast(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank;
  const size_t count = a->count, es = chorus_dtype_size(a->dtype);
  const int v = algo_mod(r - a->root, n);
  plan_builder_t b;
  int rc;

  if (algo_bcast_begin(a, "chain", &b, out, &rc))
    return rc;

  const size_t ce = a->chunk_bytes / es ? a->chunk_bytes / es : 1;
  const uint32_t nch = (uint32_t)((count + ce - 1) / ce);
  if (nch >= ALGO_MAX_MSGS) {
    b.err = -E2BIG;
    return plan_build_end(&b, out);
  }
  const int prev = algo_mod(r - 1, n), next = algo_mod(r + 1, n);
  for (uint32_t c = 0; c < nch; c++) {
    const size_t off = (size_t)c * ce * es;
    const size_t bytes = (count - (size_t)c * ce < ce ? count - (size_t)c * ce : ce) * es;
    uint32_t got = UINT32_MAX;
    if (v > 0)
      got = plan_add(
          &b,
          &(plan_step_t){
              .kind = STEP_RECV, .peer = prev, .msg = c, .bytes = bytes, .dst = {BUF_RECV, off}});
    if (v < n - 1) {
      uint32_t s = plan_add(&b, &(plan_step_t){.kind = STEP_SEND,
                                               .peer = next,
                                               .msg = c,
                                               .bytes = bytes,
                                               .src = {v ? BUF_RECV : BUF_SEND, off}});
      plan_dep(&b, got, s);
    }
  }
  return plan_build_end(&b, out);
}
