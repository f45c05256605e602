/*
 * hier_allgather.c - hierarchical allgather: gather to one leader per host,
 * a ring allgather of whole hosts' blocks among the leaders, a pipelined
 * chain broadcast inside every host.
 *
 * Each block crosses between hosts H-1 times (once per other host) instead
 * of once per other rank, and hosts may have any sizes.
 *
 *   1. every rank sends its block to its host's leader (its lowest rank);
 *   2. ring among the leaders: at step s the leader of host h sends host
 *      (h - s)'s blocks on to host h+1 and receives host (h - s - 1)'s;
 *   3. chain leader -> local 1 -> local 2 ...: each link carries every block
 *      but the receiver's own (which it already holds).
 *
 *       host 0 (r0 r2)     host 1 (r1 r3 r4)
 *     1. r2 -> r0           r3 -> r1, r4 -> r1
 *     2. r0 <---> r1 (blocks {0,2} one way, {1,3,4} the other)
 *     3. r0 -> r2           r1 -> r3 -> r4
 *
 * Blocks are cut into chunk-sized tiles, the unit of every message; a tile
 * is sent on as soon as it arrived (the chain starts with local blocks
 * while the ring still runs). Every rank first copies its own block into
 * place (not in place). Receives land in the receive buffer at the tile's
 * place and nothing is received twice; sends wait only for the arrival of
 * what they send, along the phases in order: no cycle can form.
 * Message numbers: 1. c; 2. (1 + q) * nchq + c; 3. (1 + n + q) * nchq + c
 * for block q, chunk c.
 */
#include <errno.h>
#include <stdlib.h>

#include "algos.h"

typedef struct hg {
  plan_builder_t *b;
  size_t count, ce, es;
  uint32_t nchq; /* tiles per block */
  uint32_t *avail;
} hg_t;

static size_t hg_tile(const hg_t *h, int q, uint32_t c, size_t *off) {
  size_t cs = (size_t)c * h->ce;
  *off = ((size_t)q * h->count + cs) * h->es;
  return cs < h->count ? (h->count - cs < h->ce ? h->count - cs : h->ce) * h->es : 0;
}

static void hg_send(hg_t *h, int peer, uint32_t msg0, int q) {
  for (uint32_t c = 0; c < h->nchq; c++) {
    size_t off, bytes = hg_tile(h, q, c, &off);
    uint32_t s = plan_add(h->b, &(plan_step_t){.kind = STEP_SEND,
                                               .peer = peer,
                                               .msg = msg0 + (uint32_t)q * h->nchq + c,
                                               .bytes = bytes,
                                               .src = {BUF_RECV, off}});
    plan_dep(h->b, h->avail[(size_t)q * h->nchq + c], s);
  }
}

static void hg_recv(hg_t *h, int peer, uint32_t msg0, int q) {
  for (uint32_t c = 0; c < h->nchq; c++) {
    size_t off, bytes = hg_tile(h, q, c, &off);
    h->avail[(size_t)q * h->nchq + c] =
        plan_add(h->b, &(plan_step_t){.kind = STEP_RECV,
                                      .peer = peer,
                                      .msg = msg0 + (uint32_t)q * h->nchq + c,
                                      .bytes = bytes,
                                      .dst = {BUF_RECV, off}});
  }
}

int algo_hier_allgather(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank;
  const size_t count = a->count, es = chorus_dtype_size(a->dtype);
  const topo_t *tp = a->topo;
  const int nh = tp && tp->nhosts > 1 ? tp->nhosts : 1;
  plan_builder_t b;
  hg_t h = {.b = &b, .count = count, .es = es};
  int *mem = NULL;
  int rc;

  *out = NULL;
  if (nh > 1 && (tp->nranks != n || !tp->host_of))
    return -EINVAL;
  if ((rc = plan_build_begin(&b, "hier", r, n, count, a->dtype, a->op, a->inplace)))
    return rc;
  if (count == 0)
    return plan_build_end(&b, out);
  const uint32_t own = algo_allgather_own(&b, a, count * es);
  if (n == 1)
    return plan_build_end(&b, out);

  h.ce = a->chunk_bytes / es ? a->chunk_bytes / es : 1;
  h.nchq = (uint32_t)((count + h.ce - 1) / h.ce);
  if ((uint64_t)(2 * n + 1) * h.nchq >= ALGO_MAX_MSGS) {
    b.err = -E2BIG;
    return plan_build_end(&b, out);
  }
  /* mem: host[n] (host of each rank) | leader[nh] | local[n] (my host's ranks) */
  mem = malloc(sizeof(int) * (size_t)(2 * n + nh));
  h.avail = malloc(sizeof(uint32_t) * (size_t)n * h.nchq);
  if (!mem || !h.avail) {
    b.err = -ENOMEM;
    goto out;
  }
  int *host = mem, *leader = mem + n, *local = mem + n + nh;
  const int myhost = nh > 1 ? tp->host_of[r] : 0;
  int L = 0, li = 0;
  for (int i = 0; i < nh; i++)
    leader[i] = -1;
  for (int q = 0; q < n; q++) {
    host[q] = nh > 1 ? tp->host_of[q] : 0;
    if (host[q] < 0 || host[q] >= nh) {
      b.err = -EINVAL;
      goto out;
    }
    if (leader[host[q]] < 0)
      leader[host[q]] = q;
    if (host[q] == myhost) {
      if (q == r)
        li = L;
      local[L++] = q;
    }
  }
  for (int i = 0; i < nh; i++)
    if (leader[i] < 0) {
      b.err = -EINVAL;
      goto out;
    }
  for (size_t t = 0; t < (size_t)n * h.nchq; t++)
    h.avail[t] = UINT32_MAX;
  for (uint32_t c = 0; c < h.nchq; c++)
    h.avail[(size_t)r * h.nchq + c] = own;

  /* 1. gather to the leader */
  if (li > 0) {
    for (uint32_t c = 0; c < h.nchq; c++) {
      size_t off, bytes = hg_tile(&h, 0, c, &off);
      plan_add(&b, &(plan_step_t){.kind = STEP_SEND,
                                  .peer = local[0],
                                  .msg = c,
                                  .bytes = bytes,
                                  .src = {BUF_SEND, off}});
    }
  } else {
    for (int j = 1; j < L; j++)
      for (uint32_t c = 0; c < h.nchq; c++) {
        size_t off, bytes = hg_tile(&h, local[j], c, &off);
        h.avail[(size_t)local[j] * h.nchq + c] =
            plan_add(&b, &(plan_step_t){.kind = STEP_RECV,
                                        .peer = local[j],
                                        .msg = c,
                                        .bytes = bytes,
                                        .dst = {BUF_RECV, off}});
      }
  }
  /* 2. ring of whole hosts among the leaders */
  if (li == 0)
    for (int s = 0; s < nh - 1; s++) {
      const int hs = algo_mod(myhost - s, nh), hr = algo_mod(myhost - s - 1, nh);
      for (int q = 0; q < n; q++)
        if (host[q] == hs)
          hg_send(&h, leader[algo_mod(myhost + 1, nh)], h.nchq, q);
      for (int q = 0; q < n; q++)
        if (host[q] == hr)
          hg_recv(&h, leader[algo_mod(myhost - 1, nh)], h.nchq, q);
    }
  /* 3. chain inside the host, every block but the receiver's own */
  const uint32_t m3 = (uint32_t)(1 + n) * h.nchq;
  if (li > 0)
    for (int q = 0; q < n; q++)
      if (q != r)
        hg_recv(&h, local[li - 1], m3, q);
  if (li < L - 1)
    for (int q = 0; q < n; q++)
      if (q != local[li + 1])
        hg_send(&h, local[li + 1], m3, q);

out:
  free(mem);
  free(h.avail);
  return plan_build_end(&b, out);
}
