/*
 * ring_reduce_scatter.c - pipelined ring reduce-scatter.
 *
 * The first half of ring allreduce, out of place into recv[count]. Block k
 * of the n*count input ends reduced on rank k. Steps s = 0 .. n-2: rank r
 * sends its partial of block (r - s - 1) to r+1 and receives the partial of
 * block (r - s - 2) from r-1 into a scratch slot, where it adds its own
 * input; at the last step that block is (r - n) = r and the sum goes to
 * recv instead. Block k is thus reduced along the ring from rank k+1 to
 * rank k, in one order:
 *   ((in[k+1] op in[k+2]) op ...) op in[k]
 * reduce_apply(dst, received, own): the partial is always the left operand.
 *
 *   n = 3, block 0:  rank1 --in1--> rank2 (in1 op in2) --> rank0 (.. op in0)
 *
 * Blocks are cut into chunks of at most chunk_bytes; a partial lives in a
 * chunk-sized scratch slot (RS_SCRATCH_SLOTS of them, taken in turn) from
 * its receive until it is sent on. Dependencies of chunk c:
 *   recv(s)   after the last step that used its slot (the send of the
 *             partial that was there, or the final reduce)
 *   reduce(s) after recv(s)
 *   send(s)   after reduce(s-1) (s >= 1; step 0 sends the input)
 *   SCALE     after the last reduce (AVG only; rank r scales its block)
 * Message of step s, chunk c: c*(n-1) + s. Built chunk-major, so
 * dependencies and slot reuse point backwards in one order shared by all
 * ranks, the order of the message numbers, in which the executor posts a
 * pair's messages.
 */
#include <errno.h>
#include <stdlib.h>

#include "algos.h"

#define RS_SCRATCH_SLOTS 8

int algo_ring_reduce_scatter(const algo_args_t *a, plan_t **out) {
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
  if (n == 1) {
    if (!inplace) {
      plan_step_t cp = {
          .kind = STEP_COPY, .bytes = bytes, .dst = {BUF_RECV, 0}, .src = {BUF_SEND, 0}};
      plan_add(&b, &cp);
    }
    return plan_build_end(&b, out);
  }

  const int right = algo_mod(r + 1, n), left = algo_mod(r - 1, n);
  const uint32_t nslots = RS_SCRATCH_SLOTS;
  const size_t slot_bytes = unit < bytes ? unit : bytes;
  b.plan->scratch_bytes = nslots * slot_bytes;
  uint32_t slot_user[RS_SCRATCH_SLOTS], next_slot = 0;
  for (uint32_t i = 0; i < nslots; i++)
    slot_user[i] = UINT32_MAX;

  for (size_t c = 0; c < nch; c++) {
    size_t off = c * unit, len = bytes - off < unit ? bytes - off : unit;
    uint32_t red = UINT32_MAX, held_slot = 0;
    for (int s = 0; s < n - 1; s++) {
      size_t ks = (size_t)algo_mod(r - s - 1, n), kr = (size_t)algo_mod(r - s - 2, n);
      uint32_t msg = (uint32_t)(c * (size_t)(n - 1) + (size_t)s);
      plan_step_t st = {.kind = STEP_SEND, .peer = right, .msg = msg, .bytes = len};
      st.src = s == 0 ? (plan_ref_t){BUF_SEND, ks * bytes + off}
                      : (plan_ref_t){BUF_SCRATCH, held_slot * slot_bytes};
      uint32_t i = plan_add(&b, &st);
      plan_dep(&b, red, i);
      if (s > 0)
        slot_user[held_slot] = i;

      const bool last = s == n - 2;
      uint32_t slot = next_slot++ % nslots;
      size_t soff = (size_t)slot * slot_bytes;
      plan_step_t rv = {
          .kind = STEP_RECV, .peer = left, .msg = msg, .bytes = len, .dst = {BUF_SCRATCH, soff}};
      uint32_t j = plan_add(&b, &rv);
      plan_dep(&b, slot_user[slot], j);
      /* in place, block r of send is recv itself: the last reduce reads and
       * writes the same elements, which reduce_apply allows */
      plan_step_t rd = {.kind = STEP_REDUCE,
                        .bytes = len,
                        .dst = last ? (plan_ref_t){BUF_RECV, off} : (plan_ref_t){BUF_SCRATCH, soff},
                        .src = {BUF_SCRATCH, soff},
                        .src2 = {BUF_SEND, kr * bytes + off}};
      red = plan_add(&b, &rd);
      plan_dep(&b, j, red);
      slot_user[slot] = red;
      held_slot = slot;
    }
    if (a->op == CHORUS_AVG) {
      plan_step_t sc = {.kind = STEP_SCALE, .bytes = len, .dst = {BUF_RECV, off}};
      plan_dep(&b, red, plan_add(&b, &sc));
    }
  }
  return plan_build_end(&b, out);
}
