/*
 * ring_bcast.c - van de Geijn broadcast for large messages: a binomial
 * scatter of n segments from the root, then a ring allgather.
 *
 * Ranks are numbered relative to the root, v = (r - root) mod n; segment k
 * is the k-th of n nearly equal parts of the vector. The scatter hands rank
 * v > 0 the segments [v, v + lowbit(v)) (clipped to n): it receives them from
 * v - lowbit(v) and passes [v + m, v + 2m) on to each child v + m. The ring
 * then runs n-1 steps: at step s rank v sends segment (v - s) to v+1 and
 * receives segment (v - s - 1) from v-1, except that a segment the receiver
 * already holds (from the scatter; the root holds all) is not sent at all.
 *
 *   scatter (n = 4):  v0 --[2,3]--> v2 --[3]--> v3     v0 --[1]--> v1
 *   ring step 0:      v1 --1--> v2    v2 --2--> v3    (v0 -> v1, v3 -> v0 skip)
 *
 * Every segment is cut into chunk-sized tiles, the unit of every message. A
 * tile is forwarded after it arrived (or at once by the root, from its send
 * buffer); receives land in the receive buffer at the tile's place and are
 * never overwritten. Dependencies follow the scatter tree and then the ring
 * steps forward: no cycle can form.
 * Message numbers: scatter k * nchs + c; ring step s (n + s) * nchs + c.
 */
#include <errno.h>
#include <stdlib.h>

#include "algos.h"

/* Does relative rank v hold segment k after the scatter? */
static bool rb_has(int v, int k) {
  return v == 0 || (k >= v && k < v + (v & -v));
}

int algo_ring_bcast(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank;
  const size_t count = a->count, es = chorus_dtype_size(a->dtype);
  const int v = algo_mod(r - a->root, n);
  plan_builder_t b;
  uint32_t *avail = NULL;
  int rc;

  if (algo_bcast_begin(a, "ring", &b, out, &rc))
    return rc;

  const size_t ce = a->chunk_bytes / es ? a->chunk_bytes / es : 1;
  const size_t maxseg = algo_seg_count(count, n, 0);
  const uint32_t nchs = (uint32_t)((maxseg + ce - 1) / ce);
  if ((uint64_t)(2 * n) * nchs >= ALGO_MAX_MSGS) {
    b.err = -E2BIG;
    return plan_build_end(&b, out);
  }
  const uint8_t src = v ? BUF_RECV : BUF_SEND;
  const int low = v ? (v & -v) : 0;
  int top = 1;
  while (top < n)
    top *= 2;
  /* per tile: the step that brought it here (UINT32_MAX: held from the start) */
  avail = malloc(sizeof(uint32_t) * (size_t)n * nchs);
  if (!avail) {
    b.err = -ENOMEM;
    goto out;
  }
  for (size_t t = 0; t < (size_t)n * nchs; t++)
    avail[t] = UINT32_MAX;

  /* scatter */
  if (v) {
    const int parent = algo_mod(v - low + a->root, n);
    for (int k = v; k < v + low && k < n; k++)
      for (uint32_t c = 0; c < nchs; c++) {
        size_t seg = algo_seg_count(count, n, k), cs = (size_t)c * ce;
        if (cs >= seg)
          break;
        size_t bytes = (seg - cs < ce ? seg - cs : ce) * es;
        avail[(size_t)k * nchs + c] = plan_add(
            &b, &(plan_step_t){.kind = STEP_RECV,
                               .peer = parent,
                               .msg = (uint32_t)k * nchs + c,
                               .bytes = bytes,
                               .dst = {BUF_RECV, (algo_seg_start(count, n, k) + cs) * es}});
      }
  }
  for (int m = (v ? low : top) / 2; m >= 1; m /= 2) {
    const int kid = v + m;
    if (kid >= n)
      continue;
    for (int k = kid; k < kid + m && k < n; k++)
      for (uint32_t c = 0; c < nchs; c++) {
        size_t seg = algo_seg_count(count, n, k), cs = (size_t)c * ce;
        if (cs >= seg)
          break;
        size_t bytes = (seg - cs < ce ? seg - cs : ce) * es;
        uint32_t s =
            plan_add(&b, &(plan_step_t){.kind = STEP_SEND,
                                        .peer = algo_mod(kid + a->root, n),
                                        .msg = (uint32_t)k * nchs + c,
                                        .bytes = bytes,
                                        .src = {src, (algo_seg_start(count, n, k) + cs) * es}});
        plan_dep(&b, avail[(size_t)k * nchs + c], s);
      }
  }
  /* ring allgather, skipping what the receiver holds */
  const int next = algo_mod(r + 1, n), prev = algo_mod(r - 1, n);
  for (int s = 0; s < n - 1; s++) {
    const int ks = algo_mod(v - s, n), kr = algo_mod(v - s - 1, n);
    const bool do_send = !rb_has(algo_mod(v + 1, n), ks), do_recv = !rb_has(v, kr);
    for (uint32_t c = 0; c < nchs; c++) {
      size_t cs = (size_t)c * ce;
      size_t ns = algo_seg_count(count, n, ks), nr = algo_seg_count(count, n, kr);
      uint32_t msg = (uint32_t)(n + s) * nchs + c;
      if (do_send && cs < ns) {
        uint32_t st =
            plan_add(&b, &(plan_step_t){.kind = STEP_SEND,
                                        .peer = next,
                                        .msg = msg,
                                        .bytes = (ns - cs < ce ? ns - cs : ce) * es,
                                        .src = {src, (algo_seg_start(count, n, ks) + cs) * es}});
        plan_dep(&b, avail[(size_t)ks * nchs + c], st);
      }
      if (do_recv && cs < nr)
        avail[(size_t)kr * nchs + c] = plan_add(
            &b, &(plan_step_t){.kind = STEP_RECV,
                               .peer = prev,
                               .msg = msg,
                               .bytes = (nr - cs < ce ? nr - cs : ce) * es,
                               .dst = {BUF_RECV, (algo_seg_start(count, n, kr) + cs) * es}});
    }
  }

out:
  free(avail);
  return plan_build_end(&b, out);
}
