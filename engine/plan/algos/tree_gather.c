/*
 * tree_gather.c - binomial tree gather, any root.
 *
 * Ranks are renumbered so the root is 0: v = (r - root) mod n. Rank v > 0
 * sends to its parent v - lowbit(v) the blocks of its whole subtree,
 * virtual ranks [v, v + size) with size = min(lowbit(v), n - v), in one
 * message; its children are v + 2^k for 2^k < lowbit(v). An inner rank
 * stages its subtree in scratch (its own block copied to the front, each
 * child's message at (child - v) blocks) and forwards the lot; a leaf sends
 * its block straight from send; the root receives straight into recv.
 *
 *   n = 8 (virtual)     0 <- 4 <- 6 <- 7          subtree of 4: [4, 8)
 *                       0 <- 2 <- 3, 4 <- 5
 *                       0 <- 1
 *
 * ceil(log2 n) message latencies instead of n-1. Virtual blocks map to
 * real ones as u -> (u + root) mod n, which wraps once at u = n - root: a
 * message is cut there, and each part into chunk_bytes pieces, by both
 * ends alike, so the root can place every piece in its real block. Message
 * numbers are piece indices (each rank sends one message). A rank's sends
 * wait for the staging writes they read (algo_track); messages from deeper
 * ranks (higher v) come first in the shared order, so no cycle forms.
 * Scratch: the subtree's blocks, on inner ranks only. In place at the root
 * (send == recv + root*count) its block is not copied.
 */
#include <errno.h>

#include "algos.h"

typedef struct tg_msg {
  size_t cut, len, np_a, np; /* wrap cut and length (bytes), pieces before the cut, all pieces */
} tg_msg_t;

/* The message of subtree [c, c + size). */
static tg_msg_t tg_msg(size_t n, size_t root, size_t B, size_t unit, size_t c, size_t size) {
  size_t uw = n - root;
  tg_msg_t m = {.len = size * B};
  m.cut = uw > c && uw < c + size ? (uw - c) * B : m.len;
  m.np_a = algo_npieces(m.cut, unit);
  m.np = m.np_a + algo_npieces(m.len - m.cut, unit);
  return m;
}

static void tg_piece(const tg_msg_t *m, size_t unit, size_t i, size_t *off, size_t *len) {
  size_t base = i < m->np_a ? 0 : m->cut, end = i < m->np_a ? m->cut : m->len;
  *off = base + (i < m->np_a ? i : i - m->np_a) * unit;
  *len = end - *off < unit ? end - *off : unit;
}

static size_t subtree(size_t v, size_t n) {
  size_t low = v & (~v + 1);
  return v == 0 ? n : (low < n - v ? low : n - v);
}

int algo_tree_gather(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank, root = a->root;
  const size_t es = chorus_dtype_size(a->dtype);
  plan_builder_t b;
  algo_track_t tr = {0};
  int rc;

  *out = NULL;
  if (n <= 0 || r < 0 || r >= n || root < 0 || root >= n || !es)
    return -EINVAL;
  if (a->count > SIZE_MAX / es / (size_t)n)
    return -E2BIG;
  const size_t N = (size_t)n, B = a->count * es, unit = algo_chunk_unit(a->chunk_bytes, es);
  const size_t v = (size_t)algo_mod(r - root, n), size = subtree(v, N);
  if (algo_npieces(N * B, unit) + 2 > ALGO_MAX_MSGS)
    return -E2BIG;
  if ((rc = plan_build_begin(&b, "tree", r, n, a->count, a->dtype, a->op, a->inplace)))
    return rc;
  if (!B)
    return plan_build_end(&b, out);
  const bool is_root = v == 0;
  if (is_root && !a->inplace) {
    plan_step_t cp = {
        .kind = STEP_COPY, .bytes = B, .dst = {BUF_RECV, (size_t)root * B}, .src = {BUF_SEND, 0}};
    plan_add(&b, &cp);
  }
  if (size > 1 && !is_root) {
    b.plan->scratch_bytes = size * B;
    if ((rc = algo_track_init(&tr, size * B, unit))) {
      b.err = rc;
      goto out;
    }
    plan_step_t cp = {.kind = STEP_COPY, .bytes = B, .dst = {BUF_SCRATCH, 0}, .src = {BUF_SEND, 0}};
    algo_track_write(&tr, &b, 0, B, plan_add(&b, &cp));
  }
  /* children: v + 2^k below v's lowest bit (any bit for the root) */
  for (size_t d = 1; d < size; d <<= 1) {
    size_t c = v + d, cs = subtree(c, N);
    tg_msg_t m = tg_msg(N, (size_t)root, B, unit, c, cs);
    for (size_t i = 0; i < m.np; i++) {
      size_t off, len;
      tg_piece(&m, unit, i, &off, &len);
      plan_step_t rv = {.kind = STEP_RECV,
                        .peer = (int)((c + (size_t)root) % N),
                        .msg = (uint32_t)i,
                        .bytes = len};
      if (is_root) {
        size_t u = c + off / B;
        rv.dst = (plan_ref_t){BUF_RECV, ((u + (size_t)root) % N) * B + off % B};
        plan_add(&b, &rv);
      } else {
        rv.dst = (plan_ref_t){BUF_SCRATCH, d * B + off};
        algo_track_write(&tr, &b, d * B + off, len, plan_add(&b, &rv));
      }
    }
  }
  if (!is_root) {
    size_t parent = v - (v & (~v + 1));
    tg_msg_t m = tg_msg(N, (size_t)root, B, unit, v, size);
    for (size_t i = 0; i < m.np; i++) {
      size_t off, len;
      tg_piece(&m, unit, i, &off, &len);
      plan_step_t st = {.kind = STEP_SEND,
                        .peer = (int)((parent + (size_t)root) % N),
                        .msg = (uint32_t)i,
                        .bytes = len};
      st.src = size > 1 ? (plan_ref_t){BUF_SCRATCH, off} : (plan_ref_t){BUF_SEND, off};
      uint32_t s = plan_add(&b, &st);
      if (size > 1)
        algo_track_deps(&tr, &b, off, len, s);
    }
  }
out:
  algo_track_free(&tr);
  return plan_build_end(&b, out);
}
