/*
 * tree_bcast.c - binomial-tree broadcast (latency bound: ceil(log2 n)
 * hops), chunked so that a large message pipelines down the tree.
 *
 * Ranks are numbered relative to the root, v = (r - root) mod n. Rank v > 0
 * receives from v - lowbit(v); every rank v sends to v + m for each power of
 * two m below lowbit(v) (below the first power of two >= n for the root),
 * largest first.
 *
 *   v0 -> v4, v2, v1     v2 -> v3     v4 -> v6, v5     v6 -> v7
 *
 * The root sends from its send buffer (and copies it to its receive buffer
 * when not in place); every other rank receives into its receive buffer and
 * forwards from there. Chunk c of a send waits only for chunk c's receive,
 * and the steps of one chunk follow the tree: no cycle can form.
 * Message numbers: c * nbits + log2(m).
 */
#include <errno.h>

#include "algos.h"

int algo_tree_bcast(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank;
  const size_t count = a->count, es = chorus_dtype_size(a->dtype);
  const int v = algo_mod(r - a->root, n);
  plan_builder_t b;
  int rc;

  if (algo_bcast_begin(a, "tree", &b, out, &rc))
    return rc;

  const size_t ce = a->chunk_bytes / es ? a->chunk_bytes / es : 1;
  const uint32_t nch = (uint32_t)((count + ce - 1) / ce);
  int top = 1, nbits = 1;
  while (top < n) {
    top *= 2;
    nbits++;
  }
  if ((uint64_t)nch * (uint32_t)nbits >= ALGO_MAX_MSGS) {
    b.err = -E2BIG;
    return plan_build_end(&b, out);
  }
  const int low = v ? (v & -v) : top;
  const int parent = v ? algo_mod(v - low + a->root, n) : -1;
  int parent_bit = 0;
  while ((1 << parent_bit) < low)
    parent_bit++;

  for (uint32_t c = 0; c < nch; c++) {
    const size_t off = (size_t)c * ce * es;
    const size_t bytes = (count - (size_t)c * ce < ce ? count - (size_t)c * ce : ce) * es;
    uint32_t got = UINT32_MAX;
    if (parent >= 0)
      got = plan_add(&b, &(plan_step_t){.kind = STEP_RECV,
                                        .peer = parent,
                                        .msg = c * (uint32_t)nbits + (uint32_t)parent_bit,
                                        .bytes = bytes,
                                        .dst = {BUF_RECV, off}});
    int bit = parent_bit;
    for (int m = low / 2; m >= 1; m /= 2) {
      bit--;
      if (v + m >= n)
        continue;
      uint32_t s = plan_add(&b, &(plan_step_t){.kind = STEP_SEND,
                                               .peer = algo_mod(v + m + a->root, n),
                                               .msg = c * (uint32_t)nbits + (uint32_t)bit,
                                               .bytes = bytes,
                                               .src = {v ? BUF_RECV : BUF_SEND, off}});
      plan_dep(&b, got, s);
    }
  }
  return plan_build_end(&b, out);
}
