/*
 * bruck_allgather.c - Bruck allgather for any rank count.
 *
 * Rank r gathers in a scratch work area W of n blocks whose position j
 * holds block (r + j) mod n. Position 0 is its own block. Round k, with
 * d = 2^k and m = min(d, n - d) blocks: send positions [0, m) to rank r - d
 * and receive positions [d, d + m) from rank r + d. After ceil(log2 n)
 * rounds W holds every block, rotated by r; the final rotation is one COPY
 * per received piece, into recv block (r + j) mod n, made as soon as the
 * piece lands (a piece that straddles the wrap is copied in two parts).
 *
 *   n = 5, rank 0     W: [0]                  round 0: recv [1]
 *                     W: [0 1]                round 1: recv [2 3]
 *                     W: [0 1 2 3]            round 2: recv [4]
 *                     recv = W rotated by 0
 *
 * One message per round for small blocks: ceil(log2 n) latencies. Each
 * round's message is cut into pieces of chunk_bytes; message numbers run on
 * through the rounds (same piece counts on every rank). A send waits for
 * the writers of the work-area cells it reads (algo_track); all sends of a
 * round are built before its receives, so every dependency points to an
 * earlier round. Round 0 sends the caller's own block where it is (send,
 * or recv block r in place). Scratch: n*count elements (W); Bruck is the
 * small-message allgather.
 */
#include <errno.h>

#include "algos.h"

int algo_bruck_allgather(const algo_args_t *a, plan_t **out) {
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
  size_t total = 0;
  for (size_t d = 1; d < (size_t)n; d <<= 1)
    total += algo_npieces((d < (size_t)n - d ? d : (size_t)n - d) * B, unit);
  if (total > ALGO_MAX_MSGS)
    return -E2BIG;
  if ((rc = plan_build_begin(&b, "bruck", r, n, a->count, a->dtype, a->op, inplace)))
    return rc;
  if (!B)
    return plan_build_end(&b, out);
  algo_allgather_own(&b, a, B);
  if (n == 1)
    return plan_build_end(&b, out);
  const plan_ref_t own =
      inplace ? (plan_ref_t){BUF_RECV, (size_t)r * B} : (plan_ref_t){BUF_SEND, 0};
  b.plan->scratch_bytes = (size_t)n * B;
  if ((rc = algo_track_init(&tr, (size_t)n * B, unit))) {
    b.err = rc;
    return plan_build_end(&b, out);
  }
  if (n > 2) {
    /* position 0 of W, read from round 1 on */
    plan_step_t cp = {.kind = STEP_COPY, .bytes = B, .dst = {BUF_SCRATCH, 0}, .src = own};
    algo_track_write(&tr, &b, 0, B, plan_add(&b, &cp));
  }
  uint32_t msg = 0;
  for (size_t d = 1; d < (size_t)n; d <<= 1) {
    const size_t m = d < (size_t)n - d ? d : (size_t)n - d, len = m * B;
    const size_t np = algo_npieces(len, unit);
    const int to = algo_mod(r - (int)d, n), from = algo_mod(r + (int)d, n);
    for (size_t i = 0; i < np; i++) {
      size_t off = i * unit, pl = len - off < unit ? len - off : unit;
      plan_step_t st = {.kind = STEP_SEND, .peer = to, .msg = msg + (uint32_t)i, .bytes = pl};
      st.src = d == 1 ? (plan_ref_t){own.buf, own.off + off} : (plan_ref_t){BUF_SCRATCH, off};
      uint32_t s = plan_add(&b, &st);
      if (d > 1)
        algo_track_deps(&tr, &b, off, pl, s);
    }
    for (size_t i = 0; i < np; i++) {
      size_t off = i * unit, pl = len - off < unit ? len - off : unit;
      size_t woff = d * B + off;
      plan_step_t rv = {.kind = STEP_RECV,
                        .peer = from,
                        .msg = msg + (uint32_t)i,
                        .bytes = pl,
                        .dst = {BUF_SCRATCH, woff}};
      uint32_t j = plan_add(&b, &rv);
      algo_track_write(&tr, &b, woff, pl, j);
      /* rotate: W byte x goes to recv byte ((r + x/B) mod n)*B + x%B; the
       * positions from n - r on wrap to the start of recv */
      size_t wrap = (size_t)(n - r) * B;
      size_t cut = woff < wrap && wrap < woff + pl ? wrap - woff : pl;
      for (size_t part = 0, po = 0; po < pl; part++) {
        size_t plen = part == 0 ? cut : pl - cut;
        size_t x = woff + po;
        size_t dst = x < wrap ? x + (size_t)r * B : x - wrap;
        plan_step_t cp = {
            .kind = STEP_COPY, .bytes = plen, .dst = {BUF_RECV, dst}, .src = {BUF_SCRATCH, x}};
        plan_dep(&b, j, plan_add(&b, &cp));
        po += plen;
      }
    }
    msg += (uint32_t)np;
  }
  algo_track_free(&tr);
  return plan_build_end(&b, out);
}
