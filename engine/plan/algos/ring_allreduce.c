/*
 * ring_allreduce.c - pipelined ring allreduce.
 *
 * The vector is cut into nranks segments; segment k is cut into chunks of
 * at most chunk_bytes. Every chunk position c flows around the ring on its
 * own, so sends, receives and reductions of different chunks overlap.
 *
 * Reduce-scatter, steps s = 0 .. n-2 (r = this rank, n = ranks):
 *   send segment (r - s) to r+1, receive segment (r - s - 1) from r-1 into
 *   a scratch slot, reduce it into recvbuf. Scratch is a ring of
 *   RING_SCRATCH_SLOTS chunk-sized slots taken in turn. After n-1 steps rank r holds
 *   segment (r + 1) fully reduced (and, for AVG, scales it).
 * Allgather, steps s = 0 .. n-2:
 *   send segment (r + 1 - s) to r+1, receive segment (r - s) from r-1
 *   straight into recvbuf; forward it at the next step.
 *
 *        rank0        rank1        rank2          (n = 3, RS step 0)
 *   seg0 --send-->  +=recv
 *   seg1              --send-->  +=recv
 *   seg2  +=recv  <----------------send--
 *
 * Every segment is reduced in one order (along the ring, ending at its
 * owner) and then copied, so all ranks end bitwise identical.
 *
 * Dependencies of chunk c:
 *   RS recv(s)   after the last reduce that read its scratch slot
 *   RS reduce(s) after RS recv(s)
 *   RS send(s)   after RS reduce(s-1)  (s >= 1; step 0 sends the input,
 *                paced: after RS send(0) of chunk c - ALGO_PACE)
 *   SCALE        after RS reduce(n-2)  (AVG only)
 *   AG send(0)   after RS reduce(n-2) or SCALE
 *   AG recv(s)   after RS send(s)      (that range of recvbuf is being sent)
 *   AG send(s)   after AG recv(s-1)
 * Message numbers: RS step s chunk c is s*nch + c; AG step s is (n-1+s)*nch + c.
 */
#include <errno.h>
#include <stdlib.h>

#include "algos.h"

#define RING_SCRATCH_SLOTS 8

/* Steps are built in message order: step by step, chunk by chunk within a
 * step. Every dependency, and every scratch slot's reuse, points to an
 * earlier message in that order, which is the order in which the executor
 * posts a pair's messages (exec.c), so no cycle can form across ranks
 * whatever the posting budget. */

int algo_ring_allreduce(const algo_args_t *a, plan_t **out) {
  const int rank = a->rank, nranks = a->nranks;
  const size_t count = a->count, chunk_bytes = a->chunk_bytes;
  const chorus_dtype dtype = a->dtype;
  const chorus_op op = a->op;
  const bool inplace = a->inplace;
  const size_t es = chorus_dtype_size(dtype);
  const int n = nranks, r = rank;
  const int right = algo_mod(r + 1, n), left = algo_mod(r - 1, n);
  plan_builder_t b;
  int rc;

  *out = NULL;
  if ((rc = plan_build_begin(&b, "ring", rank, nranks, count, dtype, op, inplace)))
    return rc;

  if (n == 1 || count == 0) {
    if (!inplace && count) {
      plan_step_t cp = {
          .kind = STEP_COPY, .bytes = count * es, .dst = {BUF_RECV, 0}, .src = {BUF_SEND, 0}};
      plan_add(&b, &cp);
    }
    return plan_build_end(&b, out);
  }

  size_t chunk_elems = chunk_bytes / es ? chunk_bytes / es : 1;
  size_t max_seg = algo_seg_count(count, n, 0);
  uint32_t nch = (uint32_t)((max_seg + chunk_elems - 1) / chunk_elems);
  if (nch == 0)
    nch = 1;
  if ((uint64_t)2 * (uint64_t)(n - 1) * nch >= ALGO_MAX_MSGS) {
    b.err = -E2BIG;
    return plan_build_end(&b, out);
  }
  /* Scratch is a small ring of chunk-sized slots, reused in turn, so that a
   * chunk is still in cache when it is reduced and the footprint does not
   * grow with the message. */
  const uint32_t nslots = RING_SCRATCH_SLOTS;
  /* slots on 64-byte boundaries: see scratch_alloc in exec.c */
  size_t slot_bytes = ((chunk_elems < max_seg ? chunk_elems : max_seg) * es + 63) & ~(size_t)63;
  b.plan->scratch_bytes = nslots * slot_bytes;
  uint32_t next_slot = 0;
  algo_pace_t pace;

  algo_pace_init(&pace);

  /* per chunk position, the step indices of the previous stages */
  uint32_t *red = malloc(sizeof(uint32_t) * (size_t)(n - 1) * nch);
  uint32_t *rs_send = malloc(sizeof(uint32_t) * (size_t)(n - 1) * nch);
  uint32_t *ag_recv = malloc(sizeof(uint32_t) * (size_t)(n - 1) * nch);
  /* last reduce that read each (scratch slot, chunk): the next receive into
   * that place waits for it, whichever step it belonged to */
  uint32_t *slot_user = malloc(sizeof(uint32_t) * nslots);
  if (!red || !rs_send || !ag_recv || !slot_user) {
    b.err = -ENOMEM;
    goto out;
  }
#define IDX(s, c) ((size_t)(s)*nch + (c))

  for (uint32_t i = 0; i < nslots; i++)
    slot_user[i] = UINT32_MAX;
  /* Message order: reduce-scatter steps, then allgather steps, each chunk
   * by chunk, so that scratch slots are taken, and dependencies point, only
   * backwards in the order every rank posts a pair's messages in. */
  for (int s = 0; s < n - 1; s++) {
    for (uint32_t c = 0; c < nch; c++) {
      int ks = algo_mod(r - s, n), kr = algo_mod(r - s - 1, n);
      size_t cs = (size_t)c * chunk_elems;
      size_t ns = algo_seg_count(count, n, ks), nr = algo_seg_count(count, n, kr);
      size_t ls = cs < ns ? (ns - cs < chunk_elems ? ns - cs : chunk_elems) : 0;
      size_t lr = cs < nr ? (nr - cs < chunk_elems ? nr - cs : chunk_elems) : 0;
      uint32_t msg = (uint32_t)s * nch + c;

      rs_send[IDX(s, c)] = UINT32_MAX;
      red[IDX(s, c)] = UINT32_MAX;
      if (ls) {
        size_t off = (algo_seg_start(count, n, ks) + cs) * es;
        plan_step_t st = {.kind = STEP_SEND,
                          .peer = right,
                          .msg = msg,
                          .bytes = ls * es,
                          .src = {s == 0 ? BUF_SEND : BUF_RECV, off}};
        uint32_t i = plan_add(&b, &st);
        if (s > 0)
          plan_dep(&b, red[IDX(s - 1, c)], i);
        else
          algo_pace(&b, &pace, i);
        rs_send[IDX(s, c)] = i;
      }
      if (lr) {
        size_t off = (algo_seg_start(count, n, kr) + cs) * es;
        uint32_t slot = next_slot++ % nslots;
        size_t soff = (size_t)slot * slot_bytes;
        plan_step_t rv = {.kind = STEP_RECV,
                          .peer = left,
                          .msg = msg,
                          .bytes = lr * es,
                          .dst = {BUF_SCRATCH, soff}};
        uint32_t i = plan_add(&b, &rv);
        plan_dep(&b, slot_user[slot], i);
        plan_step_t rd = {.kind = STEP_REDUCE,
                          .bytes = lr * es,
                          .dst = {BUF_RECV, off},
                          .src = {BUF_SCRATCH, soff},
                          .src2 = {inplace ? BUF_RECV : BUF_SEND, off}};
        uint32_t j = plan_add(&b, &rd);
        plan_dep(&b, i, j);
        red[IDX(s, c)] = j;
        slot_user[slot] = j;
      }
    }
  }
  for (int s = 0; s < n - 1; s++) {
    for (uint32_t c = 0; c < nch; c++) {
      int ks = algo_mod(r + 1 - s, n), kr = algo_mod(r - s, n);
      size_t cs = (size_t)c * chunk_elems;
      size_t ns = algo_seg_count(count, n, ks), nr = algo_seg_count(count, n, kr);
      size_t ls = cs < ns ? (ns - cs < chunk_elems ? ns - cs : chunk_elems) : 0;
      size_t lr = cs < nr ? (nr - cs < chunk_elems ? nr - cs : chunk_elems) : 0;
      uint32_t msg = (uint32_t)(n - 1 + s) * nch + c;

      ag_recv[IDX(s, c)] = UINT32_MAX;
      if (ls) {
        size_t off = (algo_seg_start(count, n, ks) + cs) * es;
        plan_step_t st = {
            .kind = STEP_SEND, .peer = right, .msg = msg, .bytes = ls * es, .src = {BUF_RECV, off}};
        uint32_t i = plan_add(&b, &st);
        if (s == 0) {
          uint32_t last = red[IDX(n - 2, c)];
          if (op == CHORUS_AVG) {
            plan_step_t sc = {.kind = STEP_SCALE, .bytes = ls * es, .dst = {BUF_RECV, off}};
            uint32_t k = plan_add(&b, &sc);
            plan_dep(&b, last, k);
            last = k;
          }
          plan_dep(&b, last, i);
        } else {
          plan_dep(&b, ag_recv[IDX(s - 1, c)], i);
        }
      }
      if (lr) {
        size_t off = (algo_seg_start(count, n, kr) + cs) * es;
        plan_step_t rv = {
            .kind = STEP_RECV, .peer = left, .msg = msg, .bytes = lr * es, .dst = {BUF_RECV, off}};
        uint32_t i = plan_add(&b, &rv);
        plan_dep(&b, rs_send[IDX(s, c)], i);
        ag_recv[IDX(s, c)] = i;
      }
    }
  }
#undef IDX

out:
  free(red);
  free(rs_send);
  free(ag_recv);
  free(slot_user);
  return plan_build_end(&b, out);
}
