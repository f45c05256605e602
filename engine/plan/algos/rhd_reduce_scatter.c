/*
 * rhd_reduce_scatter.c - recursive halving reduce-scatter for any rank count.
 *
 * Let p be the largest power of two <= n and e = n - p. Ranks v < p do the
 * halving; rank v < e also stands for rank v + p and owns blocks v and v+p
 * (a "slot" v of the halving is those blocks):
 *
 *   fold     rank p+i sends its whole input to rank i (i < e), which
 *            reduces it into its own: P = in[i] op in[p+i]
 *   round k  slots [lo, hi) halve: rank v and v ^ d (d = (hi-lo)/2) each
 *            send the partial of the half the other keeps and reduce the
 *            half they keep; after log2 p rounds rank v holds slot v
 *   unfold   rank i sends the finished block p+i to rank p+i
 *
 *   n = 4: round 0  0<->2: 0 keeps {0,1}, 2 keeps {2,3}; 1<->3 likewise
 *          round 1  0<->1: 0 keeps {0}, 1 keeps {1}; 2<->3 likewise
 *
 * Operand order: the lower rank's partial is the left operand, so block k
 * is reduced as a fixed tree over the ranks, the same for any placement.
 * For AVG each block is scaled once, by the rank it ends on.
 *
 * Partials live in scratch P, laid out like the input (block k at k*count),
 * until the last round reduces block v straight into recv. Received
 * partials land in chunk-sized scratch slots (RHD_SCRATCH_SLOTS, in turn)
 * and are reduced from there. A message is one or two contiguous ranges of
 * blocks, each cut into chunk_bytes pieces; message numbers are
 * phase*M + piece (phases: fold, rounds, unfold). Steps reading P wait for
 * the writers of its cells (algo_track); a phase's sends are built before
 * its receives, so dependencies point to earlier phases or, for local
 * steps only, earlier in the same phase.
 *
 * In place (recv == block r of send): block r is never sent except by a
 * folded rank, whose receive of its result waits for those sends.
 * Scratch: n*count elements plus the slots on ranks < p.
 */
#include <errno.h>
#include <stdlib.h>

#include "algos.h"

#define RHD_SCRATCH_SLOTS 8

typedef struct rhd {
  plan_builder_t *b;
  algo_track_t tr; /* writers of P */
  size_t B, unit, M, p, e;
  size_t slot_base, slot_bytes;
  uint32_t slot_user[RHD_SCRATCH_SLOTS], next_slot;
} rhd_t;

typedef struct rhd_range {
  size_t off, len; /* bytes, input layout */
} rhd_range_t;

/* The blocks of slots [lo, hi) as ranges. */
static int slot_ranges(const rhd_t *h, size_t lo, size_t hi, rhd_range_t out[2]) {
  int k = 0;
  out[k++] = (rhd_range_t){lo * h->B, (hi - lo) * h->B};
  if (lo < h->e) {
    size_t top = hi < h->e ? hi : h->e;
    out[k++] = (rhd_range_t){(lo + h->p) * h->B, (top - lo) * h->B};
  }
  return k;
}

static size_t piece_len(size_t len, size_t i, size_t unit) {
  return len - i * unit < unit ? len - i * unit : unit;
}

/* Sends the partials of `rg` (from P when in_p, else the input). */
static void send_partials(rhd_t *h, int peer, size_t phase, const rhd_range_t *rg, int nr,
                          bool in_p) {
  uint32_t msg = (uint32_t)(phase * h->M);
  for (int q = 0; q < nr; q++)
    for (size_t i = 0, np = algo_npieces(rg[q].len, h->unit); i < np; i++) {
      size_t off = rg[q].off + i * h->unit, pl = piece_len(rg[q].len, i, h->unit);
      plan_step_t st = {.kind = STEP_SEND,
                        .peer = peer,
                        .msg = msg++,
                        .bytes = pl,
                        .src = {in_p ? BUF_SCRATCH : BUF_SEND, off}};
      uint32_t s = plan_add(h->b, &st);
      if (in_p)
        algo_track_deps(&h->tr, h->b, off, pl, s);
    }
}

/* Receives the peer's partials of `rg` and reduces them with ours (from P
 * when in_p, else the input) into P, or into recv for block `fin` (when
 * fin < n). `lower`: ours is the left operand. AVG pieces of block fin are
 * scaled. */
static void recv_reduce(rhd_t *h, int peer, size_t phase, const rhd_range_t *rg, int nr, bool in_p,
                        bool lower, size_t fin, bool avg) {
  uint32_t msg = (uint32_t)(phase * h->M);
  for (int q = 0; q < nr; q++)
    for (size_t i = 0, np = algo_npieces(rg[q].len, h->unit); i < np; i++) {
      size_t off = rg[q].off + i * h->unit, pl = piece_len(rg[q].len, i, h->unit);
      uint32_t slot = h->next_slot++ % RHD_SCRATCH_SLOTS;
      plan_ref_t theirs = {BUF_SCRATCH, h->slot_base + slot * h->slot_bytes};
      plan_ref_t ours = {in_p ? BUF_SCRATCH : BUF_SEND, off};
      bool final = off / h->B == fin;
      plan_step_t rv = {.kind = STEP_RECV, .peer = peer, .msg = msg++, .bytes = pl, .dst = theirs};
      uint32_t j = plan_add(h->b, &rv);
      plan_dep(h->b, h->slot_user[slot], j);
      plan_step_t rd = {.kind = STEP_REDUCE,
                        .bytes = pl,
                        .dst = final ? (plan_ref_t){BUF_RECV, off - fin * h->B}
                                     : (plan_ref_t){BUF_SCRATCH, off},
                        .src = lower ? ours : theirs,
                        .src2 = lower ? theirs : ours};
      uint32_t k = plan_add(h->b, &rd);
      plan_dep(h->b, j, k);
      if (in_p || !final)
        algo_track_deps(&h->tr, h->b, off, pl, k);
      if (!final)
        algo_track_write(&h->tr, h->b, off, pl, k);
      h->slot_user[slot] = k;
      if (final && avg) {
        plan_step_t sc = {.kind = STEP_SCALE, .bytes = pl, .dst = rd.dst};
        plan_dep(h->b, k, plan_add(h->b, &sc));
      }
    }
}

int algo_rhd_reduce_scatter(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank;
  const size_t es = chorus_dtype_size(a->dtype);
  const bool inplace = a->inplace, avg = a->op == CHORUS_AVG;
  plan_builder_t b;
  rhd_t h = {.b = &b};
  uint32_t *fold = NULL;
  int rc;

  *out = NULL;
  if (n <= 0 || r < 0 || r >= n || !es)
    return -EINVAL;
  if (a->count > SIZE_MAX / es / (size_t)n / 2)
    return -E2BIG;
  h.B = a->count * es;
  h.unit = algo_chunk_unit(a->chunk_bytes, es);
  h.p = 1;
  size_t rounds = 0;
  while (h.p * 2 <= (size_t)n)
    h.p *= 2, rounds++;
  h.e = (size_t)n - h.p;
  h.M = algo_npieces((size_t)n * h.B, h.unit) + 2;
  if (h.M > ALGO_MAX_MSGS / (rounds + 2))
    return -E2BIG;
  if ((rc = plan_build_begin(&b, "rhd", r, n, a->count, a->dtype, a->op, inplace)))
    return rc;
  if (!h.B)
    return plan_build_end(&b, out);
  if (n == 1) {
    if (!inplace) {
      plan_step_t cp = {
          .kind = STEP_COPY, .bytes = h.B, .dst = {BUF_RECV, 0}, .src = {BUF_SEND, 0}};
      plan_add(&b, &cp);
    }
    return plan_build_end(&b, out);
  }

  const size_t v = (size_t)r, total = (size_t)n * h.B;
  const size_t unfold_phase = rounds + 1;
  if (v >= h.p) {
    /* folded: the whole input out, the finished block back */
    const size_t nf = algo_npieces(total, h.unit);
    if (!(fold = malloc(nf * sizeof(*fold)))) {
      b.err = -ENOMEM;
      goto out;
    }
    for (size_t i = 0; i < nf; i++) {
      size_t pl = piece_len(total, i, h.unit);
      plan_step_t st = {.kind = STEP_SEND,
                        .peer = r - (int)h.p,
                        .msg = (uint32_t)i,
                        .bytes = pl,
                        .src = {BUF_SEND, i * h.unit}};
      fold[i] = plan_add(&b, &st);
    }
    uint32_t msg = (uint32_t)(unfold_phase * h.M);
    for (size_t i = 0, np = algo_npieces(h.B, h.unit); i < np; i++) {
      size_t off = i * h.unit, pl = piece_len(h.B, i, h.unit);
      plan_step_t rv = {.kind = STEP_RECV,
                        .peer = r - (int)h.p,
                        .msg = msg++,
                        .bytes = pl,
                        .dst = {BUF_RECV, off}};
      uint32_t j = plan_add(&b, &rv);
      if (inplace)
        for (size_t f = (v * h.B + off) / h.unit; f <= (v * h.B + off + pl - 1) / h.unit; f++)
          plan_dep(&b, fold[f], j);
      if (avg) {
        plan_step_t sc = {.kind = STEP_SCALE, .bytes = pl, .dst = {BUF_RECV, off}};
        plan_dep(&b, j, plan_add(&b, &sc));
      }
    }
    goto out;
  }

  h.slot_bytes = h.unit < total ? h.unit : total;
  h.slot_base = total;
  b.plan->scratch_bytes = total + RHD_SCRATCH_SLOTS * h.slot_bytes;
  for (int i = 0; i < RHD_SCRATCH_SLOTS; i++)
    h.slot_user[i] = UINT32_MAX;
  if ((rc = algo_track_init(&h.tr, total, h.unit))) {
    b.err = rc;
    goto out;
  }
  bool in_p = false;
  if (v < h.e) {
    rhd_range_t all = {0, total};
    recv_reduce(&h, r + (int)h.p, 0, &all, 1, false, true, SIZE_MAX, false);
    in_p = true;
  }
  size_t lo = 0, hi = h.p;
  for (size_t k = 0; k < rounds; k++) {
    size_t d = (hi - lo) / 2, mid = lo + d;
    bool lower = v < mid;
    size_t klo = lower ? lo : mid, khi = lower ? mid : hi;
    size_t slo = lower ? mid : lo, shi = lower ? hi : mid;
    rhd_range_t keep[2], give[2];
    int nk = slot_ranges(&h, klo, khi, keep), ng = slot_ranges(&h, slo, shi, give);
    int peer = (int)(v ^ d);
    send_partials(&h, peer, k + 1, give, ng, in_p);
    recv_reduce(&h, peer, k + 1, keep, nk, in_p, lower, k + 1 == rounds ? v : SIZE_MAX, avg);
    in_p = true;
    lo = klo;
    hi = khi;
  }
  if (v < h.e) {
    rhd_range_t theirs = {(v + h.p) * h.B, h.B};
    send_partials(&h, r + (int)h.p, unfold_phase, &theirs, 1, true);
  }
out:
  free(fold);
  algo_track_free(&h.tr);
  return plan_build_end(&b, out);
}
