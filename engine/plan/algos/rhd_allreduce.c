/*
 * rhd_allreduce.c - Rabenseifner's allreduce: recursive-halving
 * reduce-scatter, then recursive-doubling allgather.
 *
 * Ranks fold to a power of two p2 as in rd_allreduce.c (even rank 2i < 2*rem
 * hands its vector to 2i+1 and gets the result back at the end). The vector
 * is cut into p2 segments; virtual rank v ends the reduce-scatter owning
 * segment v:
 *
 *   RS, mask m = p2/2 .. 1:  range [lo, lo+2m) (lo = v with the bits below 2m
 *     cleared) splits in two; v keeps the half its bit m points to, sends
 *     the other half to v^m and reduces what v^m sends for the kept half.
 *   AG, mask m = 1 .. p2/2:  v sends its range [lo, lo+m) to v^m and
 *     receives v^m's range, doubling what it holds.
 *
 *   p2 = 4:   RS m=2: v0,v1 keep [0,2)  v2,v3 keep [2,4)
 *             RS m=1: v0 keeps 0, v1 keeps 1, ...
 *
 * Each segment is cut into chunk-sized tiles, the unit of every message.
 * Per tile the builder remembers the last step that wrote it and the last
 * that read it: a send waits for the writer, a write (reduce, receive) for
 * both. The sends of a phase are paced (algo_pace): a phase's sends that
 * ran ahead of its peer's scratch slots held every posted slot, and the
 * peer's slots waited for the sends of another phase that could not be
 * posted (4 ranks, 256 MiB: a deadlock). Reductions are (lower vrank's value) op (higher vrank's
 * value), each element is reduced on one rank only and then copied, and AVG is scaled by the owner
 * of the segment after the reduce-scatter.
 *
 * Steps are emitted phase by phase (fold, RS steps, AG steps, unfold), tiles
 * in vector order within a phase, the same order on every rank; every
 * dependency and every scratch-slot reuse points backwards in it.
 * Message numbers: phase * ntiles + tile, phases 0 (fold) .. 2*lg+1.
 */
#include <errno.h>
#include <stdlib.h>

#include "algos.h"

#define RHD_SLOTS 8

typedef struct rhd {
  plan_builder_t *b;
  size_t count, ce, es, slot_bytes;
  int p2;
  uint32_t nchs;     /* tiles per segment */
  uint32_t *wr, *rd; /* per tile: last writer, last reader (step indices) */
  uint32_t slot_user[RHD_SLOTS], next_slot;
  uint8_t mine;     /* where this rank's unreduced input lives */
  algo_pace_t pace; /* the sends of the phase being built */
} rhd_t;

/* Tile t = segment t / nchs, chunk t % nchs: its byte offset and length. */
static size_t tile(const rhd_t *h, uint32_t t, size_t *off) {
  int k = (int)(t / h->nchs);
  size_t c = t % h->nchs, seg = algo_seg_count(h->count, h->p2, k);
  size_t cs = c * h->ce;
  *off = (algo_seg_start(h->count, h->p2, k) + cs) * h->es;
  return cs < seg ? (seg - cs < h->ce ? seg - cs : h->ce) * h->es : 0;
}

static uint8_t cur(const rhd_t *h, uint32_t t) {
  return h->wr[t] != UINT32_MAX ? BUF_RECV : h->mine;
}

static void send_tile(rhd_t *h, int peer, uint32_t msg, uint32_t t) {
  size_t off, bytes = tile(h, t, &off);
  if (!bytes)
    return;
  uint32_t s = plan_add(
      h->b,
      &(plan_step_t){
          .kind = STEP_SEND, .peer = peer, .msg = msg, .bytes = bytes, .src = {cur(h, t), off}});
  algo_pace(h->b, &h->pace, s);
  plan_dep(h->b, h->wr[t], s);
  h->rd[t] = s;
}

/* Returns the receive's step, UINT32_MAX for an empty tile. */
static uint32_t recv_tile(rhd_t *h, int peer, uint32_t msg, uint32_t t) {
  size_t off, bytes = tile(h, t, &off);
  if (!bytes)
    return UINT32_MAX;
  uint32_t v = plan_add(
      h->b,
      &(plan_step_t){
          .kind = STEP_RECV, .peer = peer, .msg = msg, .bytes = bytes, .dst = {BUF_RECV, off}});
  plan_dep(h->b, h->wr[t], v);
  plan_dep(h->b, h->rd[t], v);
  h->wr[t] = v;
  return v;
}

/* Receive a tile into scratch and reduce it with this rank's value:
 * lower_first says whether the received value is the first operand. */
static void reduce_tile(rhd_t *h, int peer, uint32_t msg, uint32_t t, bool peer_first) {
  size_t off, bytes = tile(h, t, &off);
  if (!bytes)
    return;
  uint32_t slot = h->next_slot++ % RHD_SLOTS;
  size_t soff = (size_t)slot * h->slot_bytes;
  uint32_t v = plan_add(
      h->b,
      &(plan_step_t){
          .kind = STEP_RECV, .peer = peer, .msg = msg, .bytes = bytes, .dst = {BUF_SCRATCH, soff}});
  plan_dep(h->b, h->slot_user[slot], v);
  plan_ref_t theirs = {BUF_SCRATCH, soff}, mine = {cur(h, t), off};
  uint32_t red = plan_add(h->b, &(plan_step_t){.kind = STEP_REDUCE,
                                               .bytes = bytes,
                                               .dst = {BUF_RECV, off},
                                               .src = peer_first ? theirs : mine,
                                               .src2 = peer_first ? mine : theirs});
  plan_dep(h->b, v, red);
  plan_dep(h->b, h->wr[t], red);
  plan_dep(h->b, h->rd[t], red);
  h->slot_user[slot] = red;
  h->wr[t] = red;
}

int algo_rhd_allreduce(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank;
  const size_t count = a->count, es = chorus_dtype_size(a->dtype);
  const bool inplace = a->inplace;
  plan_builder_t b;
  rhd_t h = {.b = &b, .count = count, .es = es};
  int rc;

  *out = NULL;
  if ((rc = plan_build_begin(&b, "rhd", r, n, count, a->dtype, a->op, inplace)))
    return rc;
  if (n == 1 || count == 0) {
    if (!inplace && count)
      plan_add(&b, &(plan_step_t){.kind = STEP_COPY,
                                  .bytes = count * es,
                                  .dst = {BUF_RECV, 0},
                                  .src = {BUF_SEND, 0}});
    return plan_build_end(&b, out);
  }

  int p2 = 1, lg = 0;
  while (p2 * 2 <= n) {
    p2 *= 2;
    lg++;
  }
  const int rem = n - p2;
  const bool extra = r < 2 * rem && r % 2 == 0, partner = r < 2 * rem && r % 2 == 1;
  const int vr = r < 2 * rem ? r / 2 : r - rem;
  h.p2 = p2;
  h.ce = a->chunk_bytes / es ? a->chunk_bytes / es : 1;
  size_t maxseg = algo_seg_count(count, p2, 0);
  h.nchs = (uint32_t)((maxseg + h.ce - 1) / h.ce);
  if (h.nchs == 0)
    h.nchs = 1;
  const uint64_t nt64 = (uint64_t)p2 * h.nchs;
  if (nt64 * (uint64_t)(2 * lg + 2) >= ALGO_MAX_MSGS) {
    b.err = -E2BIG;
    return plan_build_end(&b, out);
  }
  const uint32_t ntiles = (uint32_t)nt64;
  h.slot_bytes = (h.ce < maxseg ? h.ce : maxseg) * es;
  h.mine = inplace ? BUF_RECV : BUF_SEND;
  b.plan->scratch_bytes = RHD_SLOTS * h.slot_bytes;
  for (int i = 0; i < RHD_SLOTS; i++)
    h.slot_user[i] = UINT32_MAX;
  algo_pace_init(&h.pace);
  h.wr = malloc(sizeof(uint32_t) * ntiles);
  h.rd = malloc(sizeof(uint32_t) * ntiles);
  if (!h.wr || !h.rd) {
    b.err = -ENOMEM;
    goto out;
  }
  for (uint32_t t = 0; t < ntiles; t++)
    h.wr[t] = h.rd[t] = UINT32_MAX;

  const uint32_t unfold = (uint32_t)(2 * lg + 1) * ntiles;
  if (extra) {
    algo_pace_init(&h.pace);
    for (uint32_t t = 0; t < ntiles; t++)
      send_tile(&h, r + 1, t, t);
    for (uint32_t t = 0; t < ntiles; t++)
      recv_tile(&h, r + 1, unfold + t, t);
    goto out;
  }
  if (partner)
    for (uint32_t t = 0; t < ntiles; t++)
      reduce_tile(&h, r - 1, t, t, true);

  /* reduce-scatter */
  for (int j = 0; j < lg; j++) {
    const int m = p2 >> (j + 1), pv = vr ^ m, peer = pv < rem ? 2 * pv + 1 : pv + rem;
    const int lo = vr & ~(2 * m - 1);
    const int keep = (vr & m) ? lo + m : lo;
    const uint32_t msg0 = (uint32_t)(1 + j) * ntiles;
    algo_pace_init(&h.pace);
    for (uint32_t t = (uint32_t)lo * h.nchs; t < (uint32_t)(lo + 2 * m) * h.nchs; t++) {
      int k = (int)(t / h.nchs);
      if (k >= keep && k < keep + m)
        reduce_tile(&h, peer, msg0 + t, t, pv < vr);
      else
        send_tile(&h, peer, msg0 + t, t);
    }
  }
  if (a->op == CHORUS_AVG)
    for (uint32_t t = (uint32_t)vr * h.nchs; t < (uint32_t)(vr + 1) * h.nchs; t++) {
      size_t off, bytes = tile(&h, t, &off);
      if (!bytes)
        continue;
      uint32_t sc =
          plan_add(&b, &(plan_step_t){.kind = STEP_SCALE, .bytes = bytes, .dst = {BUF_RECV, off}});
      plan_dep(&b, h.wr[t], sc);
      h.wr[t] = sc;
    }
  /* allgather */
  for (int j = 0; j < lg; j++) {
    const int m = 1 << j, pv = vr ^ m, peer = pv < rem ? 2 * pv + 1 : pv + rem;
    const int mylo = vr & ~(m - 1), plo = pv & ~(m - 1);
    const int lo = mylo < plo ? mylo : plo;
    const uint32_t msg0 = (uint32_t)(1 + lg + j) * ntiles;
    algo_pace_init(&h.pace);
    for (uint32_t t = (uint32_t)lo * h.nchs; t < (uint32_t)(lo + 2 * m) * h.nchs; t++) {
      int k = (int)(t / h.nchs);
      if (k >= mylo && k < mylo + m) {
        send_tile(&h, peer, msg0 + t, t);
      } else {
        /* Also after our own tile at the same place is final (when the
         * peer's is, about): its last reader, the reduce-scatter send,
         * finishes long before, and receives posted that early filled
         * max_posted ahead of the reduce-scatter's (4 ranks, 256 MiB: a
         * deadlock). */
        uint32_t own = (uint32_t)mylo * h.nchs + (t - (uint32_t)plo * h.nchs);
        uint32_t before = h.wr[own];
        plan_dep(&b, before, recv_tile(&h, peer, msg0 + t, t));
      }
    }
  }
  algo_pace_init(&h.pace);
  if (partner)
    for (uint32_t t = 0; t < ntiles; t++)
      send_tile(&h, r - 1, unfold + t, t);

out:
  free(h.wr);
  free(h.rd);
  return plan_build_end(&b, out);
}
