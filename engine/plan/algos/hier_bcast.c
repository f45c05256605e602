/*
 * hier_bcast.c - hierarchical broadcast: a binomial tree among one leader
 * per host, then a binomial tree inside every host, chunk by chunk.
 *
 * The root leads its own host; every other host is led by its lowest rank.
 * Only H-1 copies of each chunk cross between hosts, and the two trees
 * pipeline: a leader forwards chunk c inside its host as soon as it has it.
 *
 *   leaders:  root ---> L1 ---> L3          (binomial, relative to the root's host)
 *                  \--> L2
 *   hosts:    L  ---> r ---> r              (binomial, relative to the leader)
 *
 * Trees are tree_bcast.c's: relative rank v > 0 receives from v - lowbit(v)
 * and sends to v + m for every power of two m below lowbit(v). The root
 * sends from its send buffer (and copies it to its receive buffer when not
 * in place); everyone else receives into the receive buffer and forwards
 * from there. Chunk c's forward waits only for chunk c's receive: no cycle.
 * Message numbers: leaders c * nbits + log2(m); hosts (nch + c) * nbits +
 * log2(m).
 */
#include <errno.h>
#include <stdlib.h>

#include "algos.h"

/* One chunk of a binomial broadcast among g[0..gn) rooted at g[root], this
 * rank being g[me]; `have` is the step after which this rank holds the chunk
 * (the root: UINT32_MAX). Returns it, or the receive that brings it. */
static uint32_t hb_tree(plan_builder_t *b, const int *g, int gn, int me, int root, uint32_t msg0,
                        size_t off, size_t bytes, uint8_t src, uint32_t have) {
  const int v = algo_mod(me - root, gn);
  int top = 1, bit = 0;
  while (top < gn)
    top *= 2;
  const int low = v ? (v & -v) : top;
  while ((1 << bit) < low)
    bit++;
  if (v)
    have = plan_add(b, &(plan_step_t){.kind = STEP_RECV,
                                      .peer = g[algo_mod(v - low + root, gn)],
                                      .msg = msg0 + (uint32_t)bit,
                                      .bytes = bytes,
                                      .dst = {BUF_RECV, off}});
  for (int m = low / 2; m >= 1; m /= 2) {
    bit--;
    if (v + m >= gn)
      continue;
    uint32_t s = plan_add(b, &(plan_step_t){.kind = STEP_SEND,
                                            .peer = g[algo_mod(v + m + root, gn)],
                                            .msg = msg0 + (uint32_t)bit,
                                            .bytes = bytes,
                                            .src = {src, off}});
    plan_dep(b, have, s);
  }
  return have;
}

int algo_hier_bcast(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank, root = a->root;
  const size_t count = a->count, es = chorus_dtype_size(a->dtype);
  const topo_t *tp = a->topo;
  const int nh = tp && tp->nhosts > 1 ? tp->nhosts : 1;
  plan_builder_t b;
  int *mem = NULL;
  int rc;

  *out = NULL;
  if (nh > 1 && (tp->nranks != n || !tp->host_of))
    return -EINVAL;
  if (algo_bcast_begin(a, "hier", &b, out, &rc))
    return rc;

  /* mem: leader[nh] | local[n] (my host's ranks) */
  mem = malloc(sizeof(int) * (size_t)(nh + n));
  if (!mem) {
    b.err = -ENOMEM;
    goto out;
  }
  int *leader = mem, *local = mem + nh;
  const int myhost = nh > 1 ? tp->host_of[r] : 0, roothost = nh > 1 ? tp->host_of[root] : 0;
  int L = 0, li = 0, lead = 0;
  for (int i = 0; i < nh; i++)
    leader[i] = -1;
  for (int q = 0; q < n; q++) {
    const int hq = nh > 1 ? tp->host_of[q] : 0;
    if (hq < 0 || hq >= nh) {
      b.err = -EINVAL;
      goto out;
    }
    if (leader[hq] < 0)
      leader[hq] = q;
    if (hq == myhost) {
      if (q == r)
        li = L;
      if (q == (myhost == roothost ? root : leader[hq]))
        lead = L;
      local[L++] = q;
    }
  }
  for (int i = 0; i < nh; i++)
    if (leader[i] < 0) {
      b.err = -EINVAL;
      goto out;
    }
  leader[roothost] = root;

  const size_t ce = a->chunk_bytes / es ? a->chunk_bytes / es : 1;
  const uint32_t nch = (uint32_t)((count + ce - 1) / ce);
  int nbits = 1;
  while ((1 << (nbits - 1)) < n)
    nbits++;
  if ((uint64_t)2 * nch * (uint32_t)nbits >= ALGO_MAX_MSGS) {
    b.err = -E2BIG;
    goto out;
  }
  const uint8_t src = r == root ? BUF_SEND : BUF_RECV;
  for (uint32_t c = 0; c < nch; c++) {
    const size_t off = (size_t)c * ce * es;
    const size_t bytes = (count - (size_t)c * ce < ce ? count - (size_t)c * ce : ce) * es;
    uint32_t have = UINT32_MAX;
    if (li == lead && nh > 1)
      have = hb_tree(&b, leader, nh, myhost, roothost, c * (uint32_t)nbits, off, bytes, src, have);
    if (L > 1)
      hb_tree(&b, local, L, li, lead, (nch + c) * (uint32_t)nbits, off, bytes, src, have);
  }

out:
  free(mem);
  return plan_build_end(&b, out);
}
