/*
 * bruck_alltoall.c - Bruck alltoall, for small blocks.
 *
 * Position j of rank r starts as send block (r + j) mod n: the block for
 * rank r + j. Round k (bit = 2^k < n): every position j with that bit set
 * goes to rank r + bit, which keeps it at position j. A block thus moves
 * by the bits of j, (r + j) - r in all, and lands on its destination, where
 * position j holds the block from rank r - j:
 *
 *   recv block (r - j) mod n = position j      (position 0: own block)
 *
 *   n = 4, rank 0   round 0: positions {1,3} -> rank 1, {1,3} <- rank 3
 *                   round 1: positions {2,3} -> rank 2, {2,3} <- rank 2
 *
 * ceil(log2 n) messages a rank, each about n/2 blocks, instead of n-1: the
 * choice when latency dominates. A round packs its positions (COPY, one a
 * block) into the scratch area SP, sends SP, and receives into its own
 * scratch area RP_k, where the positions stay until they are packed again
 * or copied to recv at the end. Each message is cut into chunk_bytes
 * pieces; message numbers run on through the rounds.
 *
 * Dependencies: a pack COPY waits for the receive pieces that brought its
 * position and for the previous sends of the SP cells it overwrites; a send
 * piece waits for the pack COPYs it covers; a final COPY for the receive
 * pieces of its position. Everything points to earlier rounds except a
 * send's pack COPYs (local steps of its own round).
 * Scratch: (max positions of a round + all positions received) * count
 * elements, about (log2 n + 1) * n/2 blocks. No in-place form: -EINVAL.
 */
#include <errno.h>
#include <stdlib.h>

#include "algos.h"

/* Steps [lo, hi] of a piece grid of `unit` bytes that [off, off+len) touches. */
static void grid_deps(plan_builder_t *b, const uint32_t *steps, size_t nsteps, size_t unit,
                      size_t off, size_t len, uint32_t to) {
  if (!len)
    return;
  for (size_t i = off / unit; i <= (off + len - 1) / unit && i < nsteps; i++)
    plan_dep(b, steps[i], to);
}

int algo_bruck_alltoall(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank;
  const size_t es = chorus_dtype_size(a->dtype);
  plan_builder_t b;
  int rc;

  *out = NULL;
  if (n <= 0 || r < 0 || r >= n || !es || a->inplace)
    return -EINVAL;
  size_t nrounds = 0, maxcnt = 0, allcnt = 0, nmsg = 0;
  for (size_t bit = 1; bit < (size_t)n; bit <<= 1)
    nrounds++;
  if (a->count > SIZE_MAX / es / ((size_t)n * (nrounds + 1)))
    return -E2BIG;
  const size_t B = a->count * es, unit = algo_chunk_unit(a->chunk_bytes, es);
  for (size_t bit = 1; bit < (size_t)n; bit <<= 1) {
    size_t cnt = 0;
    for (size_t j = 1; j < (size_t)n; j++)
      cnt += (j & bit) != 0;
    maxcnt = cnt > maxcnt ? cnt : maxcnt;
    allcnt += cnt;
    nmsg += algo_npieces(cnt * B, unit);
  }
  if (nmsg > ALGO_MAX_MSGS)
    return -E2BIG;
  if ((rc = plan_build_begin(&b, "bruck", r, n, a->count, a->dtype, a->op, false)))
    return rc;
  if (!B)
    return plan_build_end(&b, out);
  plan_step_t own = {.kind = STEP_COPY,
                     .bytes = B,
                     .dst = {BUF_RECV, (size_t)r * B},
                     .src = {BUF_SEND, (size_t)r * B}};
  plan_add(&b, &own);
  if (n == 1)
    return plan_build_end(&b, out);

  const size_t sp_bytes = maxcnt * B, nsp = algo_npieces(sp_bytes, unit);
  b.plan->scratch_bytes = sp_bytes + allcnt * B;
  size_t *loc_round = malloc((size_t)n * sizeof(*loc_round)); /* nrounds: still in send */
  size_t *loc_idx = malloc((size_t)n * sizeof(*loc_idx));
  size_t *rp_off = malloc(nrounds * sizeof(*rp_off));     /* RP_k in scratch */
  size_t *rp_first = malloc(nrounds * sizeof(*rp_first)); /* RP_k's pieces in rp_step */
  size_t *rp_n = malloc(nrounds * sizeof(*rp_n));
  uint32_t *rp_step = malloc((nmsg ? nmsg : 1) * sizeof(*rp_step));
  uint32_t *sp_reader = malloc(nsp * sizeof(*sp_reader)); /* last send of each SP cell */
  uint32_t *pack = malloc(maxcnt * sizeof(*pack));
  if (!loc_round || !loc_idx || !rp_off || !rp_first || !rp_n || !rp_step || !sp_reader || !pack) {
    b.err = -ENOMEM;
    goto out;
  }
  for (int j = 0; j < n; j++)
    loc_round[j] = nrounds;
  for (size_t i = 0; i < nsp; i++)
    sp_reader[i] = UINT32_MAX;

  size_t rp_next = sp_bytes, msg = 0, k = 0;
  for (size_t bit = 1; bit < (size_t)n; bit <<= 1, k++) {
    size_t cnt = 0;
    for (size_t j = bit; j < (size_t)n; j++) {
      if (!(j & bit))
        continue;
      plan_step_t cp = {.kind = STEP_COPY, .bytes = B, .dst = {BUF_SCRATCH, cnt * B}};
      if (loc_round[j] == nrounds) {
        cp.src = (plan_ref_t){BUF_SEND, (size_t)algo_mod(r + (int)j, n) * B};
      } else {
        size_t lk = loc_round[j];
        cp.src = (plan_ref_t){BUF_SCRATCH, rp_off[lk] + loc_idx[j] * B};
      }
      uint32_t c = plan_add(&b, &cp);
      if (loc_round[j] != nrounds)
        grid_deps(&b, rp_step + rp_first[loc_round[j]], rp_n[loc_round[j]], unit, loc_idx[j] * B, B,
                  c);
      grid_deps(&b, sp_reader, nsp, unit, cnt * B, B, c);
      pack[cnt++] = c;
    }
    const size_t len = cnt * B, np = algo_npieces(len, unit);
    const int to = algo_mod(r + (int)bit, n), from = algo_mod(r - (int)bit, n);
    for (size_t i = 0; i < np; i++) {
      size_t off = i * unit, pl = len - off < unit ? len - off : unit;
      plan_step_t st = {.kind = STEP_SEND,
                        .peer = to,
                        .msg = (uint32_t)(msg + i),
                        .bytes = pl,
                        .src = {BUF_SCRATCH, off}};
      uint32_t s = plan_add(&b, &st);
      for (size_t q = off / B; q <= (off + pl - 1) / B; q++)
        plan_dep(&b, pack[q], s);
      sp_reader[i] = s;
    }
    rp_off[k] = rp_next;
    rp_first[k] = msg;
    rp_n[k] = np;
    for (size_t i = 0; i < np; i++) {
      size_t off = i * unit, pl = len - off < unit ? len - off : unit;
      plan_step_t rv = {.kind = STEP_RECV,
                        .peer = from,
                        .msg = (uint32_t)(msg + i),
                        .bytes = pl,
                        .dst = {BUF_SCRATCH, rp_next + off}};
      rp_step[msg + i] = plan_add(&b, &rv);
    }
    cnt = 0;
    for (size_t j = bit; j < (size_t)n; j++)
      if (j & bit) {
        loc_round[j] = k;
        loc_idx[j] = cnt++;
      }
    rp_next += len;
    msg += np;
  }
  for (int j = 1; j < n; j++) {
    size_t lk = loc_round[j];
    plan_step_t cp = {.kind = STEP_COPY,
                      .bytes = B,
                      .dst = {BUF_RECV, (size_t)algo_mod(r - j, n) * B},
                      .src = {BUF_SCRATCH, rp_off[lk] + loc_idx[j] * B}};
    uint32_t c = plan_add(&b, &cp);
    grid_deps(&b, rp_step + rp_first[lk], rp_n[lk], unit, loc_idx[j] * B, B, c);
  }
out:
  free(loc_round);
  free(loc_idx);
  free(rp_off);
  free(rp_first);
  free(rp_n);
  free(rp_step);
  free(sp_reader);
  free(pack);
  return plan_build_end(&b, out);
}
