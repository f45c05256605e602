/*
 * chain_reduce.c - pipelined chain reduce (bandwidth bound for large
 * messages: after the pipeline fills, every link carries a chunk at once).
 *
 *   root <- root+1 <- root+2 <- ... <- root-1          (one chunk per message)
 *
 * Rank v = (r - root) mod n receives chunk c of v+1's partial into a scratch
 * slot, computes own op received there (the lower relative rank first) and
 * sends the slot on to v-1; the last rank sends its input, the root reduces
 * into its receive buffer and scales for AVG. Slots form a small ring; one
 * is taken again only after the send (or, at the root, the reduce) that last
 * used it. Steps are emitted chunk by chunk, the same order on every rank,
 * and every dependency points backwards in it: no cycle can form.
 * Message number: the chunk.
 */
#include <errno.h>

#include "algos.h"

#define CR_SLOTS 8

int algo_chain_reduce(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank;
  const size_t count = a->count, es = chorus_dtype_size(a->dtype);
  const int v = algo_mod(r - a->root, n);
  const uint8_t mine = (v == 0 && a->inplace) ? BUF_RECV : BUF_SEND;
  plan_builder_t b;
  int rc;

  *out = NULL;
  if ((rc = plan_build_begin(&b, "chain", r, n, count, a->dtype, a->op, a->inplace)))
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
  const int prev = algo_mod(r - 1, n), next = algo_mod(r + 1, n);
  uint32_t user[CR_SLOTS], nslot = 0;
  for (int i = 0; i < CR_SLOTS; i++)
    user[i] = UINT32_MAX;
  if (v < n - 1)
    b.plan->scratch_bytes = CR_SLOTS * slot_bytes;

  for (uint32_t c = 0; c < nch; c++) {
    const size_t off = (size_t)c * ce * es;
    const size_t bytes = (count - (size_t)c * ce < ce ? count - (size_t)c * ce : ce) * es;
    if (v == n - 1) {
      plan_add(&b,
               &(plan_step_t){
                   .kind = STEP_SEND, .peer = prev, .msg = c, .bytes = bytes, .src = {mine, off}});
      continue;
    }
    uint32_t slot = nslot++ % CR_SLOTS;
    plan_ref_t in = {BUF_SCRATCH, slot * slot_bytes};
    plan_ref_t dst = v ? in : (plan_ref_t){BUF_RECV, off};
    uint32_t rv = plan_add(
        &b, &(plan_step_t){.kind = STEP_RECV, .peer = next, .msg = c, .bytes = bytes, .dst = in});
    plan_dep(&b, user[slot], rv);
    uint32_t red = plan_add(
        &b, &(plan_step_t){
                .kind = STEP_REDUCE, .bytes = bytes, .dst = dst, .src = {mine, off}, .src2 = in});
    plan_dep(&b, rv, red);
    user[slot] = red;
    if (v) {
      uint32_t s = plan_add(
          &b, &(plan_step_t){.kind = STEP_SEND, .peer = prev, .msg = c, .bytes = bytes, .src = in});
      plan_dep(&b, red, s);
      user[slot] = s;
    } else if (a->op == CHORUS_AVG) {
      uint32_t sc =
          plan_add(&b, &(plan_step_t){.kind = STEP_SCALE, .bytes = bytes, .dst = {BUF_RECV, off}});
      plan_dep(&b, red, sc);
    }
  }
  return plan_build_end(&b, out);
}
