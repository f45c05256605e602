/*
 * ring_reduce.c - reduce for large messages: a pipelined ring
 * reduce-scatter, then every segment's owner sends it to the root.
 *
 * The reduce-scatter is ring_allreduce.c's: the vector is cut into n
 * segments, each into chunks; at step s = 0 .. n-2 rank r sends segment
 * (r - s) to r+1 and receives segment (r - s - 1) from r-1, reducing it as
 * received op own. After n-1 steps rank r holds segment (r + 1) fully
 * reduced, scales it for AVG, and sends it to the root (the root keeps its
 * own in place).
 *
 *   RS:      r0 -> r1 -> r2 -> ... -> r(n-1) -> r0      (n-1 steps)
 *   gather:  owner of segment k (rank k-1) -> root
 *
 * Only the root has a receive buffer: it works in it, while the other ranks
 * receive and reduce in scratch slots (a small ring, each slot taken again
 * only after the send that last read it). The root's receive buffer holds
 * partials that it sends on; a gathered segment lands there only after the
 * root's own send of that range. Steps are emitted chunk-major (all of chunk
 * c, then c+1), the same order on every rank, and every dependency points
 * backwards in it: no cycle can form.
 * Message numbers, chunk-major too: RS step s chunk c is c*n + s; gather
 * c*n + n-1, so that the executor, which posts a pair's messages in the
 * order of their numbers, posts them in the order above.
 */
#include <errno.h>
#include <stdlib.h>

#include "algos.h"

#define RR_SLOTS 8

int algo_ring_reduce(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank, root = a->root;
  const size_t count = a->count, es = chorus_dtype_size(a->dtype);
  const bool is_root = r == root;
  const uint8_t mine = (is_root && a->inplace) ? BUF_RECV : BUF_SEND;
  plan_builder_t b;
  uint32_t *rs_send = NULL;
  int rc;

  *out = NULL;
  if ((rc = plan_build_begin(&b, "ring", r, n, count, a->dtype, a->op, a->inplace)))
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
  const size_t maxseg = algo_seg_count(count, n, 0);
  const uint32_t nch = (uint32_t)((maxseg + ce - 1) / ce);
  if ((uint64_t)n * nch >= ALGO_MAX_MSGS) {
    b.err = -E2BIG;
    return plan_build_end(&b, out);
  }
  const size_t slot_bytes = (ce < maxseg ? ce : maxseg) * es;
  const int right = algo_mod(r + 1, n), left = algo_mod(r - 1, n);
  uint32_t user[RR_SLOTS], nslot = 0;
  for (int i = 0; i < RR_SLOTS; i++)
    user[i] = UINT32_MAX;
  b.plan->scratch_bytes = RR_SLOTS * slot_bytes;
  rs_send = malloc(sizeof(uint32_t) * (size_t)n);
  if (!rs_send) {
    b.err = -ENOMEM;
    goto out;
  }

  for (uint32_t c = 0; c < nch; c++) {
    const size_t cs = (size_t)c * ce;
    uint32_t red = UINT32_MAX, slot = UINT32_MAX;
    plan_ref_t part = {0, 0}; /* where the partial received last step is */
    size_t len = 0;
    for (int s = 0; s < n - 1; s++) {
      const int ks = algo_mod(r - s, n), kr = algo_mod(r - s - 1, n);
      const size_t ns = algo_seg_count(count, n, ks), nr = algo_seg_count(count, n, kr);
      const size_t ls = cs < ns ? (ns - cs < ce ? ns - cs : ce) : 0;
      const size_t lr = cs < nr ? (nr - cs < ce ? nr - cs : ce) : 0;
      const uint32_t msg = (uint32_t)c * (uint32_t)n + (uint32_t)s;
      rs_send[s] = UINT32_MAX;
      if (ls) {
        plan_ref_t src =
            s == 0 ? (plan_ref_t){mine, (algo_seg_start(count, n, ks) + cs) * es} : part;
        uint32_t st = plan_add(
            &b, &(plan_step_t){
                    .kind = STEP_SEND, .peer = right, .msg = msg, .bytes = ls * es, .src = src});
        plan_dep(&b, red, st);
        if (s > 0 && !is_root)
          user[slot] = st;
        rs_send[s] = st;
      }
      red = UINT32_MAX;
      len = lr;
      if (!lr)
        continue;
      size_t off = (algo_seg_start(count, n, kr) + cs) * es;
      slot = nslot++ % RR_SLOTS;
      plan_ref_t in = {BUF_SCRATCH, slot * slot_bytes};
      uint32_t rv = plan_add(
          &b,
          &(plan_step_t){.kind = STEP_RECV, .peer = left, .msg = msg, .bytes = lr * es, .dst = in});
      plan_dep(&b, user[slot], rv);
      part = is_root ? (plan_ref_t){BUF_RECV, off} : in;
      red = plan_add(
          &b,
          &(plan_step_t){
              .kind = STEP_REDUCE, .bytes = lr * es, .dst = part, .src = in, .src2 = {mine, off}});
      plan_dep(&b, rv, red);
      user[slot] = red;
    }
    /* this rank now owns chunk c of segment r+1 (len elements, at `part`) */
    if (len) {
      uint32_t last = red;
      if (a->op == CHORUS_AVG) {
        last = plan_add(&b, &(plan_step_t){.kind = STEP_SCALE, .bytes = len * es, .dst = part});
        plan_dep(&b, red, last);
      }
      if (!is_root) {
        uint32_t st =
            plan_add(&b, &(plan_step_t){.kind = STEP_SEND,
                                        .peer = root,
                                        .msg = (uint32_t)c * (uint32_t)n + (uint32_t)(n - 1),
                                        .bytes = len * es,
                                        .src = part});
        plan_dep(&b, last, st);
        user[slot] = st;
      }
    }
    if (!is_root)
      continue;
    for (int o = 0; o < n; o++) {
      const int k = algo_mod(o + 1, n);
      const size_t nk = algo_seg_count(count, n, k);
      if (o == root || cs >= nk)
        continue;
      uint32_t rv =
          plan_add(&b, &(plan_step_t){.kind = STEP_RECV,
                                      .peer = o,
                                      .msg = (uint32_t)c * (uint32_t)n + (uint32_t)(n - 1),
                                      .bytes = (nk - cs < ce ? nk - cs : ce) * es,
                                      .dst = {BUF_RECV, (algo_seg_start(count, n, k) + cs) * es}});
      /* the root sent its partial of segment k from here at step (r - k) */
      plan_dep(&b, rs_send[algo_mod(r - k, n)], rv);
    }
  }

out:
  free(rs_send);
  return plan_build_end(&b, out);
}
