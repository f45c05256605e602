/*
 * rd_allreduce.c - recursive-doubling allreduce (latency bound: log2(n)
 * rounds, each exchanging the whole vector).
 *
 * With p2 the largest power of two <= n and rem = n - p2, ranks below 2*rem
 * fold first: even rank 2i sends its vector to 2i+1, which reduces it and
 * takes part as virtual rank i; ranks >= 2*rem are virtual rank r - rem.
 * In round k virtual rank v exchanges its partial vector with v ^ 2^k and
 * both compute (lower vrank's partial) op (higher vrank's partial), so the
 * two sides perform the same operation on the same operands and stay bitwise
 * identical. Finally 2i+1 sends the result back to 2i.
 *
 *   round 0:  v0 <-> v1   v2 <-> v3
 *   round 1:  v0 <-> v2   v1 <-> v3
 *
 * The vector is cut into chunks of chunk_bytes; every chunk runs the rounds
 * on its own, receiving into a small ring of chunk-sized scratch slots. The
 * first exchange out of place (no fold before it) receives straight into
 * the chunk of the receive buffer, which its reduce then overwrites in place:
 * the send reads the send buffer, and no scratch lies between the copy in
 * and the reduce (at 2 ranks no scratch at all).
 * Dependencies of chunk c: send(k) after reduce(k-1); reduce(k) after its
 * receive and after send(k) (it overwrites what the send reads); a receive
 * into a slot after the reduce that last read that slot. Steps are emitted
 * chunk-major, fold / rounds / unfold, the same order on every rank, and
 * every dependency points backwards in it, so no cycle can form.
 * Message numbers: fold c; round k (k+1)*nch + c; unfold (lg+1)*nch + c.
 */
#include <errno.h>
#include <stdlib.h>

#include "algos.h"

#define RD_SLOTS 8

int algo_rd_allreduce(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank;
  const size_t count = a->count, es = chorus_dtype_size(a->dtype);
  const bool inplace = a->inplace;
  plan_builder_t b;
  int rc;

  *out = NULL;
  if ((rc = plan_build_begin(&b, "rd", r, n, count, a->dtype, a->op, inplace)))
    return rc;
  if (n == 1 || count == 0) {
    if (!inplace && count)
      plan_add(&b, &(plan_step_t){.kind = STEP_COPY,
                                  .bytes = count * es,
                                  .dst = {BUF_RECV, 0},
                                  .src = {BUF_SEND, 0}});
    return plan_build_end(&b, out);
  }

  const size_t ce = a->chunk_bytes / es ? a->chunk_bytes / es : 1;
  const uint32_t nch = (uint32_t)((count + ce - 1) / ce);
  int p2 = 1, lg = 0;
  while (p2 * 2 <= n) {
    p2 *= 2;
    lg++;
  }
  const int rem = n - p2;
  if ((uint64_t)(lg + 2) * nch >= ALGO_MAX_MSGS) {
    b.err = -E2BIG;
    return plan_build_end(&b, out);
  }
  /* extra: folds into r+1 and only waits for the result; partner: r-1 folds
   * into this rank */
  const bool extra = r < 2 * rem && r % 2 == 0;
  const bool partner = r < 2 * rem && r % 2 == 1;
  const int vr = r < 2 * rem ? r / 2 : r - rem;
  const size_t slot_bytes = (ce < count ? ce : count) * es;
  uint32_t slot_user[RD_SLOTS], next_slot = 0;
  const uint32_t unfold_msg = (uint32_t)(lg + 1) * nch;

  b.plan->scratch_bytes = RD_SLOTS * slot_bytes;
  for (int i = 0; i < RD_SLOTS; i++)
    slot_user[i] = UINT32_MAX;

  for (uint32_t c = 0; c < nch; c++) {
    const size_t off = (size_t)c * ce * es;
    const size_t bytes = (count - (size_t)c * ce < ce ? count - (size_t)c * ce : ce) * es;
    uint8_t mine = inplace ? BUF_RECV : BUF_SEND;
    uint32_t last = UINT32_MAX; /* last step that wrote this chunk of recv */

    if (extra) {
      uint32_t s = plan_add(
          &b, &(plan_step_t){
                  .kind = STEP_SEND, .peer = r + 1, .msg = c, .bytes = bytes, .src = {mine, off}});
      uint32_t v = plan_add(&b, &(plan_step_t){.kind = STEP_RECV,
                                               .peer = r + 1,
                                               .msg = unfold_msg + c,
                                               .bytes = bytes,
                                               .dst = {BUF_RECV, off}});
      plan_dep(&b, s, v); /* in place, the result lands where the send reads */
      continue;
    }
    if (partner) {
      uint32_t slot = next_slot++ % RD_SLOTS;
      size_t soff = (size_t)slot * slot_bytes;
      uint32_t v = plan_add(&b, &(plan_step_t){.kind = STEP_RECV,
                                               .peer = r - 1,
                                               .msg = c,
                                               .bytes = bytes,
                                               .dst = {BUF_SCRATCH, soff}});
      plan_dep(&b, slot_user[slot], v);
      last = plan_add(&b, &(plan_step_t){.kind = STEP_REDUCE,
                                         .bytes = bytes,
                                         .dst = {BUF_RECV, off},
                                         .src = {BUF_SCRATCH, soff},
                                         .src2 = {mine, off}});
      plan_dep(&b, v, last);
      slot_user[slot] = last;
      mine = BUF_RECV;
    }
    for (int k = 0; k < lg; k++) {
      const int pv = vr ^ (1 << k);
      const int peer = pv < rem ? 2 * pv + 1 : pv + rem;
      const uint32_t msg = (uint32_t)(k + 1) * nch + c;
      /* out of place, the first exchange lands in recv (see the top) */
      const bool direct = mine == BUF_SEND;
      const uint32_t slot = direct ? 0 : next_slot++ % RD_SLOTS;
      const plan_ref_t land = direct ? (plan_ref_t){BUF_RECV, off}
                                     : (plan_ref_t){BUF_SCRATCH, (size_t)slot * slot_bytes};
      uint32_t s = plan_add(
          &b, &(plan_step_t){
                  .kind = STEP_SEND, .peer = peer, .msg = msg, .bytes = bytes, .src = {mine, off}});
      plan_dep(&b, last, s);
      uint32_t v = plan_add(
          &b,
          &(plan_step_t){.kind = STEP_RECV, .peer = peer, .msg = msg, .bytes = bytes, .dst = land});
      if (!direct)
        plan_dep(&b, slot_user[slot], v);
      plan_ref_t lo = {mine, off}, hi = land;
      if (vr > pv) {
        lo = hi;
        hi = (plan_ref_t){mine, off};
      }
      uint32_t red = plan_add(
          &b,
          &(plan_step_t){
              .kind = STEP_REDUCE, .bytes = bytes, .dst = {BUF_RECV, off}, .src = lo, .src2 = hi});
      plan_dep(&b, v, red);
      /* the reduce writes recv: it waits for a send that reads recv (in
       * place, or a later round); the first round out of place sends from
       * send, and its reduce, waiting only for the receive, may read the
       * peer's mapped buffer in place (exec.c: find_borrowable) */
      if (mine == BUF_RECV)
        plan_dep(&b, s, red);
      plan_dep(&b, last, red);
      if (!direct)
        slot_user[slot] = red;
      last = red;
      mine = BUF_RECV;
    }
    if (a->op == CHORUS_AVG) {
      uint32_t sc =
          plan_add(&b, &(plan_step_t){.kind = STEP_SCALE, .bytes = bytes, .dst = {BUF_RECV, off}});
      plan_dep(&b, last, sc);
      last = sc;
    }
    if (partner) {
      uint32_t s = plan_add(&b, &(plan_step_t){.kind = STEP_SEND,
                                               .peer = r - 1,
                                               .msg = unfold_msg + c,
                                               .bytes = bytes,
                                               .src = {BUF_RECV, off}});
      plan_dep(&b, last, s);
    }
  }
  return plan_build_end(&b, out);
}
