/*
 * rd_allgather.c - recursive doubling allgather for any rank count.
 *
 * Let p be the largest power of two <= n and e = n - p. Ranks v < p take
 * part in the doubling; rank v < e also stands for rank v + p ("folded"):
 *
 *   fold     rank p+i sends its block to rank i (i < e)
 *   round k  (d = 2^k, k < log2 p) rank v exchanges with v ^ d everything
 *            its group of d ranks holds: blocks [g, g+d) and, for the
 *            folded ones, [g+p, min(g+d, e)+p), g = v & ~(d-1)
 *   unfold   rank i sends rank p+i all of recv but block p+i
 *
 *   n = 6 (p = 4, e = 2)   fold: 4->0, 5->1
 *     round 0: 0<->1 {0,4}<->{1,5}   2<->3 {2}<->{3}
 *     round 1: 0<->2 {0,1,4,5}<->{2,3}, 1<->3 likewise
 *     unfold:  0->4, 1->5
 *
 * Everything is received straight into recv (no scratch). A message is one
 * or two contiguous ranges, each cut into chunk_bytes pieces; message
 * numbers are phase*M + piece with M the most pieces a message can have
 * (phases: fold, rounds, unfold). A send waits for the writers of the recv
 * cells it reads (algo_track); a phase's sends are built before its
 * receives, so dependencies point to earlier phases only. A power of two
 * has no fold: log2 n messages a rank for small blocks.
 */
#include <errno.h>

#include "algos.h"

typedef struct rd_range {
  size_t off, len; /* bytes of recv */
} rd_range_t;

/* The blocks a group [g, g+d) of participating ranks holds, as ranges. */
static int group_ranges(size_t g, size_t d, size_t p, size_t e, size_t B, rd_range_t out[2]) {
  int k = 0;
  out[k++] = (rd_range_t){g * B, d * B};
  if (g < e) {
    size_t hi = g + d < e ? g + d : e;
    out[k++] = (rd_range_t){(g + p) * B, (hi - g) * B};
  }
  return k;
}

typedef struct rd_ctx {
  plan_builder_t *b;
  algo_track_t *tr;
  size_t unit, M;
} rd_ctx_t;

/* Sends ranges of recv; or, from_send, the caller's block from send[0..). */
static void send_ranges(rd_ctx_t *x, int peer, uint32_t phase, const rd_range_t *rg, int nr,
                        bool from_send) {
  uint32_t msg = (uint32_t)(phase * x->M);
  for (int q = 0; q < nr; q++)
    for (size_t i = 0, np = algo_npieces(rg[q].len, x->unit); i < np; i++) {
      size_t off = i * x->unit, pl = rg[q].len - off < x->unit ? rg[q].len - off : x->unit;
      plan_step_t st = {.kind = STEP_SEND, .peer = peer, .msg = msg++, .bytes = pl};
      st.src = from_send ? (plan_ref_t){BUF_SEND, off} : (plan_ref_t){BUF_RECV, rg[q].off + off};
      uint32_t s = plan_add(x->b, &st);
      if (!from_send)
        algo_track_deps(x->tr, x->b, rg[q].off + off, pl, s);
    }
}

static void recv_ranges(rd_ctx_t *x, int peer, uint32_t phase, const rd_range_t *rg, int nr) {
  uint32_t msg = (uint32_t)(phase * x->M);
  for (int q = 0; q < nr; q++)
    for (size_t i = 0, np = algo_npieces(rg[q].len, x->unit); i < np; i++) {
      size_t off = rg[q].off + i * x->unit;
      size_t pl = rg[q].len - i * x->unit < x->unit ? rg[q].len - i * x->unit : x->unit;
      plan_step_t rv = {
          .kind = STEP_RECV, .peer = peer, .msg = msg++, .bytes = pl, .dst = {BUF_RECV, off}};
      algo_track_write(x->tr, x->b, off, pl, plan_add(x->b, &rv));
    }
}

int algo_rd_allgather(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank;
  const size_t es = chorus_dtype_size(a->dtype);
  const bool inplace = a->inplace;
  plan_builder_t b;
  algo_track_t tr;
  int rc;

  *out = NULL;
  if (n <= 0 || r < 0 || r >= n || !es)
    return -EINVAL;
  if (a->count > SIZE_MAX / es / (size_t)n)
    return -E2BIG;
  const size_t B = a->count * es, unit = algo_chunk_unit(a->chunk_bytes, es);
  size_t p = 1, rounds = 0;
  while (p * 2 <= (size_t)n)
    p *= 2, rounds++;
  const size_t e = (size_t)n - p, M = algo_npieces((size_t)n * B, unit) + 2;
  if (M > ALGO_MAX_MSGS / (rounds + 2))
    return -E2BIG;
  if ((rc = plan_build_begin(&b, "rd", r, n, a->count, a->dtype, a->op, inplace)))
    return rc;
  if (!B)
    return plan_build_end(&b, out);
  if ((rc = algo_track_init(&tr, (size_t)n * B, unit))) {
    b.err = rc;
    return plan_build_end(&b, out);
  }
  rd_ctx_t x = {&b, &tr, unit, M};
  const uint32_t own = algo_allgather_own(&b, a, B);
  if ((size_t)r < p)
    algo_track_write(&tr, &b, (size_t)r * B, B, own);
  const size_t v = (size_t)r;
  if (v >= p) {
    /* folded: hand the block over, get everything else back */
    rd_range_t mine = {v * B, B}, rest[2] = {{0, v * B}, {(v + 1) * B, (n - v - 1) * B}};
    send_ranges(&x, r - (int)p, 0, &mine, 1, !inplace);
    recv_ranges(&x, r - (int)p, (uint32_t)rounds + 1, rest, 2);
  } else {
    if (v < e) {
      rd_range_t theirs = {(v + p) * B, B};
      recv_ranges(&x, r + (int)p, 0, &theirs, 1);
    }
    for (size_t k = 0, d = 1; k < rounds; k++, d <<= 1) {
      size_t w = v ^ d;
      rd_range_t mine[2], theirs[2];
      int nm = group_ranges(v & ~(d - 1), d, p, e, B, mine);
      int nt = group_ranges(w & ~(d - 1), d, p, e, B, theirs);
      send_ranges(&x, (int)w, (uint32_t)k + 1, mine, nm, false);
      recv_ranges(&x, (int)w, (uint32_t)k + 1, theirs, nt);
    }
    if (v < e) {
      size_t f = v + p;
      rd_range_t rest[2] = {{0, f * B}, {(f + 1) * B, (n - f - 1) * B}};
      send_ranges(&x, (int)f, (uint32_t)rounds + 1, rest, 2, false);
    }
  }
  algo_track_free(&tr);
  return plan_build_end(&b, out);
}
