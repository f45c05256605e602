/*
 * tree_scatter.c - binomial tree scatter, any root.
 *
 * The mirror of tree_gather.c. Ranks are renumbered so the root is 0:
 * v = (r - root) mod n. The parent v - lowbit(v) sends rank v, in one
 * message, the blocks of v's whole subtree, virtual ranks [v, v + size)
 * with size = min(lowbit(v), n - v). An inner rank receives it into
 * scratch, forwards each child c = v + 2^k its part (at (c - v) blocks) and
 * copies its own block, the first, to recv; a leaf receives straight into
 * recv; the root sends straight from send.
 *
 *   n = 8 (virtual)     0 -> 4 -> 6 -> 7          subtree of 4: [4, 8)
 *                       0 -> 2 -> 3, 4 -> 5
 *                       0 -> 1
 *
 * Virtual blocks map to real ones as u -> (u + root) mod n, which wraps
 * once at u = n - root: a message is cut there, and each part into
 * chunk_bytes pieces, by both ends alike. A parent numbers its messages on
 * through its children, in order of increasing subtree offset; the child
 * recomputes the count before its own. Forwarding sends and the own-block
 * copy wait for the received pieces they read (algo_track); messages to
 * shallower ranks (lower v) come first in the shared order, so no cycle
 * forms. Scratch: the subtree's blocks, on inner non-root ranks. In place
 * at the root (recv == send + root*count) its block is not copied.
 */
#include <errno.h>

#include "algos.h"

typedef struct ts_msg {
  size_t cut, len, np_a, np; /* wrap cut and length (bytes), pieces before the cut, all pieces */
} ts_msg_t;

/* The message of subtree [c, c + size). */
static ts_msg_t ts_msg(size_t n, size_t root, size_t B, size_t unit, size_t c, size_t size) {
  size_t uw = n - root;
  ts_msg_t m = {.len = size * B};
  m.cut = uw > c && uw < c + size ? (uw - c) * B : m.len;
  m.np_a = algo_npieces(m.cut, unit);
  m.np = m.np_a + algo_npieces(m.len - m.cut, unit);
  return m;
}

static void ts_piece(const ts_msg_t *m, size_t unit, size_t i, size_t *off, size_t *len) {
  size_t base = i < m->np_a ? 0 : m->cut, end = i < m->np_a ? m->cut : m->len;
  *off = base + (i < m->np_a ? i : i - m->np_a) * unit;
  *len = end - *off < unit ? end - *off : unit;
}

static size_t subtree(size_t v, size_t n) {
  size_t low = v & (~v + 1);
  return v == 0 ? n : (low < n - v ? low : n - v);
}

int algo_tree_scatter(const algo_args_t *a, plan_t **out) {
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
  const size_t N = (size_t)n, R = (size_t)root, B = a->count * es;
  const size_t unit = algo_chunk_unit(a->chunk_bytes, es);
  const size_t v = (size_t)algo_mod(r - root, n), size = subtree(v, N);
  /* a parent's messages hold at most all blocks, cut at most once per child */
  size_t levels = 0;
  for (size_t d = 1; d < N; d <<= 1)
    levels++;
  if (algo_npieces(N * B, unit) + 2 * levels + 1 > ALGO_MAX_MSGS)
    return -E2BIG;
  if ((rc = plan_build_begin(&b, "tree", r, n, a->count, a->dtype, a->op, a->inplace)))
    return rc;
  if (!B)
    return plan_build_end(&b, out);
  const bool is_root = v == 0, staged = !is_root && size > 1;
  if (is_root && !a->inplace) {
    plan_step_t cp = {
        .kind = STEP_COPY, .bytes = B, .dst = {BUF_RECV, 0}, .src = {BUF_SEND, R * B}};
    plan_add(&b, &cp);
  }
  if (!is_root) {
    size_t parent = v - (v & (~v + 1)), msg = 0;
    for (size_t d = 1; parent + d < v; d <<= 1)
      msg += ts_msg(N, R, B, unit, parent + d, subtree(parent + d, N)).np;
    ts_msg_t m = ts_msg(N, R, B, unit, v, size);
    if (staged) {
      b.plan->scratch_bytes = size * B;
      if ((rc = algo_track_init(&tr, size * B, unit))) {
        b.err = rc;
        goto out;
      }
    }
    for (size_t i = 0; i < m.np; i++) {
      size_t off, len;
      ts_piece(&m, unit, i, &off, &len);
      plan_step_t rv = {.kind = STEP_RECV,
                        .peer = (int)((parent + R) % N),
                        .msg = (uint32_t)(msg + i),
                        .bytes = len,
                        .dst = {staged ? BUF_SCRATCH : BUF_RECV, off}};
      uint32_t j = plan_add(&b, &rv);
      if (staged)
        algo_track_write(&tr, &b, off, len, j);
    }
    if (staged) {
      plan_step_t cp = {
          .kind = STEP_COPY, .bytes = B, .dst = {BUF_RECV, 0}, .src = {BUF_SCRATCH, 0}};
      uint32_t c = plan_add(&b, &cp);
      algo_track_deps(&tr, &b, 0, B, c);
    }
  }
  size_t msg = 0;
  for (size_t d = 1; d < size; d <<= 1) {
    size_t c = v + d;
    ts_msg_t m = ts_msg(N, R, B, unit, c, subtree(c, N));
    for (size_t i = 0; i < m.np; i++) {
      size_t off, len;
      ts_piece(&m, unit, i, &off, &len);
      plan_step_t st = {
          .kind = STEP_SEND, .peer = (int)((c + R) % N), .msg = (uint32_t)(msg + i), .bytes = len};
      if (is_root) {
        size_t u = c + off / B;
        st.src = (plan_ref_t){BUF_SEND, ((u + R) % N) * B + off % B};
        plan_add(&b, &st);
      } else {
        st.src = (plan_ref_t){BUF_SCRATCH, d * B + off};
        algo_track_deps(&tr, &b, d * B + off, len, plan_add(&b, &st));
      }
    }
    msg += m.np;
  }
out:
  algo_track_free(&tr);
  return plan_build_end(&b, out);
}
