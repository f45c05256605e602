/*
 * hier_allreduce.c - hierarchical allreduce (HCCL's "local ring + inter-host"
 * idea): most bytes cross the fast links inside a host, and only 1/L of the
 * vector per rank crosses between hosts.
 *
 * Hosts of equal size L (H hosts), per block of the vector:
 *   1. ring reduce-scatter among the L ranks of a host: local rank i ends
 *      with part i of the block reduced over its host;
 *   2. "rails": local rank i of every host allreduces part i with the others
 *      (a ring reduce-scatter and allgather among the H ranks; the owner of
 *      each sub-part scales it for AVG);
 *   3. ring allgather among the ranks of a host.
 *
 *        host 0           host 1
 *     r0  r1  r2       r3  r4  r5       1. RS in {r0,r1,r2}, {r3,r4,r5}
 *     |   |   |        |   |   |        2. rails {r0,r3} {r1,r4} {r2,r5}
 *     +---|---|--------+   |   |        3. AG in each host
 *
 * Hosts of different sizes, per block: a chain reduce inside each host to
 * its leader (its lowest rank), a ring allreduce among the leaders, a chain
 * broadcast from each leader. With no topology (or one host) the first form
 * runs with H = 1: a plain ring allreduce.
 *
 * The vector is cut into blocks of L chunks (uneven: one chunk) processed
 * one after the other in the step order, so different blocks pipeline. The
 * rings follow ring_allreduce.c: partials are reduced as received op own,
 * into the receive buffer; received chunks go to a small ring of scratch
 * slots, each taken again only after the step that last read it. Steps are
 * emitted block by block, phase by phase, ring step by ring step, the same
 * order on every rank; every dependency points backwards in it.
 * Message numbers: block * per_block + phase offset + ring step.
 */
#include <errno.h>
#include <stdlib.h>

#include "algos.h"

#define HA_SLOTS 8

typedef struct ha {
  plan_builder_t *b;
  size_t es, slot_bytes;
  uint32_t user[HA_SLOTS], next;
} ha_t;

/* Ring reduce-scatter of the elements [off, off+len) among g[0..gn) (this
 * rank is g[me]): part k is algo_seg(len, gn, k); g[me] ends with part me
 * reduced in the receive buffer and the step that finished it is returned
 * (UINT32_MAX: no step, part empty). This rank's input is in `in` (ready
 * after in_dep); sent[k] gets the step that sent part k. */
static uint32_t ha_ring_rs(ha_t *h, const int *g, int gn, int me, size_t off, size_t len,
                           uint8_t in, uint32_t in_dep, uint32_t msg0, uint32_t *sent) {
  const size_t es = h->es;
  uint32_t red = UINT32_MAX;
  for (int k = 0; k < gn; k++)
    sent[k] = UINT32_MAX;
  for (int s = 0; s < gn - 1; s++) {
    const int ks = algo_mod(me - s - 1, gn), kr = algo_mod(me - s - 2, gn);
    const size_t ls = algo_seg_count(len, gn, ks), lr = algo_seg_count(len, gn, kr);
    if (ls) {
      sent[ks] = plan_add(h->b, &(plan_step_t){.kind = STEP_SEND,
                                               .peer = g[algo_mod(me + 1, gn)],
                                               .msg = msg0 + (uint32_t)s,
                                               .bytes = ls * es,
                                               .src = {s ? BUF_RECV : in,
                                                       (off + algo_seg_start(len, gn, ks)) * es}});
      plan_dep(h->b, s ? red : in_dep, sent[ks]);
    }
    red = UINT32_MAX;
    if (!lr)
      continue;
    const size_t o = (off + algo_seg_start(len, gn, kr)) * es;
    const uint32_t slot = h->next++ % HA_SLOTS;
    const plan_ref_t tmp = {BUF_SCRATCH, slot * h->slot_bytes};
    uint32_t rv = plan_add(h->b, &(plan_step_t){.kind = STEP_RECV,
                                                .peer = g[algo_mod(me - 1, gn)],
                                                .msg = msg0 + (uint32_t)s,
                                                .bytes = lr * es,
                                                .dst = tmp});
    plan_dep(h->b, h->user[slot], rv);
    red = plan_add(h->b, &(plan_step_t){.kind = STEP_REDUCE,
                                        .bytes = lr * es,
                                        .dst = {BUF_RECV, o},
                                        .src = tmp,
                                        .src2 = {in, o}});
    plan_dep(h->b, rv, red);
    plan_dep(h->b, in_dep, red);
    h->user[slot] = red;
  }
  return red;
}

/* Ring allgather of [off, off+len) among g (parts as above): part me is in
 * the receive buffer once steps own[0..nown) are done; the others arrive
 * there, each after sent[k] (may be NULL) freed its range. got[k] gets the
 * step that brought part k (UINT32_MAX for part me or an empty part). */
static void ha_ring_ag(ha_t *h, const int *g, int gn, int me, size_t off, size_t len,
                       const uint32_t *own, int nown, uint32_t msg0, const uint32_t *sent,
                       uint32_t *got) {
  const size_t es = h->es;
  for (int k = 0; k < gn; k++)
    got[k] = UINT32_MAX;
  for (int s = 0; s < gn - 1; s++) {
    const int ks = algo_mod(me - s, gn), kr = algo_mod(me - s - 1, gn);
    const size_t ls = algo_seg_count(len, gn, ks), lr = algo_seg_count(len, gn, kr);
    if (ls) {
      uint32_t st = plan_add(
          h->b, &(plan_step_t){.kind = STEP_SEND,
                               .peer = g[algo_mod(me + 1, gn)],
                               .msg = msg0 + (uint32_t)s,
                               .bytes = ls * es,
                               .src = {BUF_RECV, (off + algo_seg_start(len, gn, ks)) * es}});
      if (s == 0)
        for (int i = 0; i < nown; i++)
          plan_dep(h->b, own[i], st);
      else
        plan_dep(h->b, got[ks], st);
    }
    if (lr) {
      got[kr] = plan_add(
          h->b, &(plan_step_t){.kind = STEP_RECV,
                               .peer = g[algo_mod(me - 1, gn)],
                               .msg = msg0 + (uint32_t)s,
                               .bytes = lr * es,
                               .dst = {BUF_RECV, (off + algo_seg_start(len, gn, kr)) * es}});
      if (sent)
        plan_dep(h->b, sent[kr], got[kr]);
    }
  }
}

static uint32_t ha_scale(ha_t *h, size_t off, size_t len, uint32_t dep) {
  if (!len)
    return dep;
  uint32_t sc = plan_add(
      h->b,
      &(plan_step_t){.kind = STEP_SCALE, .bytes = len * h->es, .dst = {BUF_RECV, off * h->es}});
  plan_dep(h->b, dep, sc);
  return sc;
}

int algo_hier_allreduce(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank;
  const size_t count = a->count, es = chorus_dtype_size(a->dtype);
  const bool inplace = a->inplace, avg = a->op == CHORUS_AVG;
  const uint8_t mine = inplace ? BUF_RECV : BUF_SEND;
  const topo_t *tp = a->topo;
  const int nh = tp && tp->nhosts > 1 ? tp->nhosts : 1;
  plan_builder_t b;
  ha_t h = {.b = &b, .es = es};
  int *mem = NULL;
  uint32_t *u32 = NULL;
  int rc;

  *out = NULL;
  if (nh > 1 && (tp->nranks != n || !tp->host_of))
    return -EINVAL;
  if ((rc = plan_build_begin(&b, "hier", r, n, count, a->dtype, a->op, inplace)))
    return rc;
  if (n == 1 || count == 0) {
    if (!inplace && count)
      plan_add(&b, &(plan_step_t){.kind = STEP_COPY,
                                  .bytes = count * es,
                                  .dst = {BUF_RECV, 0},
                                  .src = {BUF_SEND, 0}});
    return plan_build_end(&b, out);
  }

  /* mem: hsize[nh] | local[n] (my host's ranks) | rail[nh] (my local rank's
   * peers, or the leaders) */
  mem = malloc(sizeof(int) * (size_t)(2 * nh + n));
  u32 = malloc(sizeof(uint32_t) * (size_t)(4 * (n + nh)));
  if (!mem || !u32) {
    b.err = -ENOMEM;
    goto out;
  }
  int *hsize = mem, *local = mem + nh, *rail = mem + nh + n;
  const int myhost = nh > 1 ? tp->host_of[r] : 0;
  int L = 0, li = 0;
  bool even = true;
  for (int i = 0; i < nh; i++)
    hsize[i] = 0;
  for (int q = 0; q < n; q++) {
    const int hq = nh > 1 ? tp->host_of[q] : 0;
    if (hq < 0 || hq >= nh) {
      b.err = -EINVAL;
      goto out;
    }
    if (hq == myhost) {
      if (q == r)
        li = L;
      local[L++] = q;
    }
    hsize[hq]++;
  }
  for (int i = 0; i < nh; i++) {
    if (!hsize[i]) {
      b.err = -EINVAL;
      goto out;
    }
    if (hsize[i] != L)
      even = false;
  }
  /* rail[i]: the rank of host i with local index li (even hosts), or its
   * leader, the lowest (uneven) */
  for (int i = 0; i < nh; i++)
    hsize[i] = 0;
  for (int q = 0; q < n; q++) {
    const int hq = nh > 1 ? tp->host_of[q] : 0;
    if (hsize[hq]++ == (even ? li : 0))
      rail[hq] = q;
  }

  const size_t ce = a->chunk_bytes / es ? a->chunk_bytes / es : 1;
  const size_t blk = even ? ce * (size_t)L : ce;
  const uint64_t nblk = (count + blk - 1) / blk;
  const uint32_t per = even ? (uint32_t)(2 * (L - 1) + 2 * (nh - 1)) : (uint32_t)(2 * nh);
  if (nblk * per >= ALGO_MAX_MSGS) {
    b.err = -E2BIG;
    goto out;
  }
  h.slot_bytes = (ce < count ? ce : count) * es;
  b.plan->scratch_bytes = HA_SLOTS * h.slot_bytes;
  for (int i = 0; i < HA_SLOTS; i++)
    h.user[i] = UINT32_MAX;
  uint32_t *sent = u32, *rsent = u32 + n, *got = u32 + n + nh, *rgot = u32 + 2 * n + nh;

  for (uint64_t bi = 0; bi < nblk; bi++) {
    const size_t bo = bi * blk, bl = count - bo < blk ? count - bo : blk;
    const uint32_t msg0 = (uint32_t)bi * per;
    if (even) {
      /* 1. reduce-scatter in the host; 2. rails; 3. allgather in the host */
      const size_t po = bo + algo_seg_start(bl, L, li), pl = algo_seg_count(bl, L, li);
      uint32_t fin = UINT32_MAX;
      if (L > 1)
        fin = ha_ring_rs(&h, local, L, li, bo, bl, mine, UINT32_MAX, msg0, sent);
      uint32_t own[1];
      int nown = 0;
      if (nh > 1) {
        const uint32_t m1 = msg0 + (uint32_t)(L - 1);
        uint32_t f =
            ha_ring_rs(&h, rail, nh, myhost, po, pl, L > 1 ? BUF_RECV : mine, fin, m1, rsent);
        if (avg)
          f = ha_scale(&h, po + algo_seg_start(pl, nh, myhost), algo_seg_count(pl, nh, myhost), f);
        own[0] = f;
        ha_ring_ag(&h, rail, nh, myhost, po, pl, own, 1, m1 + (uint32_t)(nh - 1), rsent, rgot);
        rgot[myhost] = f;
        nown = nh;
      } else {
        rgot[0] = avg ? ha_scale(&h, po, pl, fin) : fin;
        nown = 1;
      }
      if (L > 1)
        ha_ring_ag(&h, local, L, li, bo, bl, rgot, nown, msg0 + (uint32_t)(L - 1 + 2 * (nh - 1)),
                   sent, got);
      continue;
    }
    /* uneven hosts: 1. chain reduce to the leader (local[0]) */
    const size_t bytes = bl * es, off = bo * es;
    uint32_t val = UINT32_MAX, read_mine = UINT32_MAX;
    uint8_t vbuf = mine;
    if (L > 1 && li == L - 1) {
      read_mine = plan_add(&b, &(plan_step_t){.kind = STEP_SEND,
                                              .peer = local[li - 1],
                                              .msg = msg0,
                                              .bytes = bytes,
                                              .src = {mine, off}});
    } else if (L > 1) {
      const uint32_t slot = h.next++ % HA_SLOTS;
      const plan_ref_t tmp = {BUF_SCRATCH, slot * h.slot_bytes};
      uint32_t rv = plan_add(
          &b,
          &(plan_step_t){
              .kind = STEP_RECV, .peer = local[li + 1], .msg = msg0, .bytes = bytes, .dst = tmp});
      plan_dep(&b, h.user[slot], rv);
      val = read_mine = plan_add(&b, &(plan_step_t){.kind = STEP_REDUCE,
                                                    .bytes = bytes,
                                                    .dst = li ? tmp : (plan_ref_t){BUF_RECV, off},
                                                    .src = {mine, off},
                                                    .src2 = tmp});
      plan_dep(&b, rv, val);
      h.user[slot] = val;
      if (li) {
        h.user[slot] = plan_add(
            &b,
            &(plan_step_t){
                .kind = STEP_SEND, .peer = local[li - 1], .msg = msg0, .bytes = bytes, .src = tmp});
        plan_dep(&b, val, h.user[slot]);
      }
      vbuf = BUF_RECV;
    }
    /* 2. ring allreduce among the leaders */
    int nown = 1;
    if (li == 0) {
      if (nh > 1) {
        uint32_t f = ha_ring_rs(&h, rail, nh, myhost, bo, bl, vbuf, val, msg0 + 1, rsent);
        if (avg)
          f = ha_scale(&h, bo + algo_seg_start(bl, nh, myhost), algo_seg_count(bl, nh, myhost), f);
        ha_ring_ag(&h, rail, nh, myhost, bo, bl, &f, 1, msg0 + (uint32_t)nh, rsent, rgot);
        rgot[myhost] = f;
        nown = nh;
      } else {
        rgot[0] = avg ? ha_scale(&h, bo, bl, val) : val;
      }
    }
    /* 3. chain broadcast from the leader */
    if (L > 1) {
      const uint32_t bmsg = msg0 + (uint32_t)(2 * nh - 1);
      uint32_t have = UINT32_MAX;
      if (li > 0) {
        have = plan_add(&b, &(plan_step_t){.kind = STEP_RECV,
                                           .peer = local[li - 1],
                                           .msg = bmsg,
                                           .bytes = bytes,
                                           .dst = {BUF_RECV, off}});
        plan_dep(&b, read_mine, have);
      }
      if (li < L - 1) {
        uint32_t st = plan_add(&b, &(plan_step_t){.kind = STEP_SEND,
                                                  .peer = local[li + 1],
                                                  .msg = bmsg,
                                                  .bytes = bytes,
                                                  .src = {BUF_RECV, off}});
        if (li > 0)
          plan_dep(&b, have, st);
        else
          for (int i = 0; i < nown; i++)
            plan_dep(&b, rgot[i], st);
      }
    }
  }

out:
  free(mem);
  free(u32);
  return plan_build_end(&b, out);
}
