/*
 * tree_reduce.c - binomial-tree reduce (latency bound: ceil(log2 n) hops),
 * chunked so that large messages pipeline up the tree.
 *
 * Ranks are numbered relative to the root, v = (r - root) mod n. For
 * m = 1, 2, 4, ...: if bit m of v is set, v sends its partial to v - m and is
 * done; otherwise, if v + m < n, it receives v + m's partial and computes
 * partial = partial op received (the lower relative rank first).
 *
 *   m=1: v1 -> v0   v3 -> v2   v5 -> v4
 *   m=2: v2 -> v0              v6 -> v4
 *   m=4: v4 -> v0
 *
 * Non-root ranks have no receive buffer to work in: partials live in scratch
 * "accumulator" slots and received chunks in "receive" slots, two small
 * rings of chunk-sized slots; a slot is taken again only after the step
 * that last used it (the reduce that read a receive slot, the send of an
 * accumulator). The root reduces into its receive buffer and scales for AVG.
 * Steps are emitted chunk-major in the order of m, the same on every rank,
 * and every dependency points backwards in it: no cycle can form.
 * Message number: the chunk (each rank sends one message per chunk).
 */
#include <errno.h>

#include "algos.h"

#define TR_RSLOTS 8
#define TR_ASLOTS 4

int algo_tree_reduce(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank;
  const size_t count = a->count, es = chorus_dtype_size(a->dtype);
  const int v = algo_mod(r - a->root, n);
  const uint8_t mine = (v == 0 && a->inplace) ? BUF_RECV : BUF_SEND;
  plan_builder_t b;
  int rc;

  *out = NULL;
  if ((rc = plan_build_begin(&b, "tree", r, n, count, a->dtype, a->op, a->inplace)))
    return rc;
  if (count == 0)
    return plan_build_end(&b, out);
  if (n == 1) {
    if (!a->inplace)
      plan_add(&b, &(plan_step_t){.kind = STEP_COPY,
                                  .bytes = count * es,
                                  .dst = {BUF_RECV, 0},
                                  .src = {BUF_SEND, 0}});
    return plan_build_end(&b, out);
  }

  const size_t ce = a->chunk_bytes / es ? a->chunk_bytes / es : 1;
  const uint32_t nch = (uint32_t)((count + ce - 1) / ce);
  if (nch >= ALGO_MAX_MSGS) {
    b.err = -E2BIG;
    return plan_build_end(&b, out);
  }
  const size_t slot_bytes = (ce < count ? ce : count) * es;
  uint32_t ruser[TR_RSLOTS], auser[TR_ASLOTS], rnext = 0, anext = 0;
  for (int i = 0; i < TR_RSLOTS; i++)
    ruser[i] = UINT32_MAX;
  for (int i = 0; i < TR_ASLOTS; i++)
    auser[i] = UINT32_MAX;
  b.plan->scratch_bytes = (TR_RSLOTS + TR_ASLOTS) * slot_bytes;

  for (uint32_t c = 0; c < nch; c++) {
    const size_t off = (size_t)c * ce * es;
    const size_t bytes = (count - (size_t)c * ce < ce ? count - (size_t)c * ce : ce) * es;
    plan_ref_t acc = {mine, off}; /* where the partial is */
    plan_ref_t dst = {BUF_RECV, off};
    uint32_t aslot = UINT32_MAX, last = UINT32_MAX;
    for (int m = 1; m < n; m *= 2) {
      if (v & m) {
        uint32_t s = plan_add(&b, &(plan_step_t){.kind = STEP_SEND,
                                                 .peer = algo_mod(v - m + a->root, n),
                                                 .msg = c,
                                                 .bytes = bytes,
                                                 .src = acc});
        plan_dep(&b, last, s);
        if (aslot != UINT32_MAX)
          auser[aslot] = s;
        break;
      }
      if (v + m >= n)
        continue;
      if (v != 0 && aslot == UINT32_MAX) {
        aslot = anext++ % TR_ASLOTS;
        dst = (plan_ref_t){BUF_SCRATCH, (TR_RSLOTS + aslot) * slot_bytes};
      }
      uint32_t slot = rnext++ % TR_RSLOTS;
      plan_ref_t in = {BUF_SCRATCH, slot * slot_bytes};
      uint32_t rv = plan_add(&b, &(plan_step_t){.kind = STEP_RECV,
                                                .peer = algo_mod(v + m + a->root, n),
                                                .msg = c,
                                                .bytes = bytes,
                                                .dst = in});
      plan_dep(&b, ruser[slot], rv);
      uint32_t red = plan_add(
          &b,
          &(plan_step_t){.kind = STEP_REDUCE, .bytes = bytes, .dst = dst, .src = acc, .src2 = in});
      plan_dep(&b, rv, red);
      plan_dep(&b, last, red);
      if (acc.buf != dst.buf || acc.off != dst.off)
        plan_dep(&b, aslot != UINT32_MAX ? auser[aslot] : UINT32_MAX, red);
      ruser[slot] = red;
      acc = dst;
      last = red;
    }
    if (v == 0 && a->op == CHORUS_AVG) {
      uint32_t sc =
          plan_add(&b, &(plan_step_t){.kind = STEP_SCALE, .bytes = bytes, .dst = {BUF_RECV, off}});
      plan_dep(&b, last, sc);
    }
  }
  return plan_build_end(&b, out);
}
