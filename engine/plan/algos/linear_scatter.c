/*
 * linear_scatter.c - the root sends every rank its block directly.
 *
 * The root sends block p of send to rank p, cut into chunk_bytes messages;
 * messages to rank p are numbered p*k + i (k messages a block). Rank p
 * receives them into recv. The root copies its own block unless the call is
 * in place (recv == send + root*count).
 *
 *   root: send[p0 | p1 | root | p3] --> p0, p1, p3
 *
 * No dependencies: the root posts every send at once.
 */
#include <errno.h>

#include "algos.h"

int algo_linear_scatter(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank, root = a->root;
  const size_t es = chorus_dtype_size(a->dtype);
  plan_builder_t b;
  int rc;

  *out = NULL;
  if (n <= 0 || r < 0 || r >= n || root < 0 || root >= n || !es)
    return -EINVAL;
  if (a->count > SIZE_MAX / es / (size_t)n)
    return -E2BIG;
  const size_t bytes = a->count * es, unit = algo_chunk_unit(a->chunk_bytes, es);
  const size_t nmsg = algo_npieces(bytes, unit);
  if (nmsg && nmsg > ALGO_MAX_MSGS / (size_t)n)
    return -E2BIG;
  if ((rc = plan_build_begin(&b, "linear", r, n, a->count, a->dtype, a->op, a->inplace)))
    return rc;
  if (r != root) {
    for (size_t i = 0; i < nmsg; i++) {
      size_t off = i * unit, len = bytes - off < unit ? bytes - off : unit;
      plan_step_t rv = {.kind = STEP_RECV,
                        .peer = root,
                        .msg = (uint32_t)((size_t)r * nmsg + i),
                        .bytes = len,
                        .dst = {BUF_RECV, off}};
      plan_add(&b, &rv);
    }
    return plan_build_end(&b, out);
  }
  if (!a->inplace && bytes) {
    plan_step_t cp = {.kind = STEP_COPY,
                      .bytes = bytes,
                      .dst = {BUF_RECV, 0},
                      .src = {BUF_SEND, (size_t)root * bytes}};
    plan_add(&b, &cp);
  }
  for (int s = 1; s < n; s++) {
    int p = algo_mod(root + s, n);
    for (size_t i = 0; i < nmsg; i++) {
      size_t off = i * unit, len = bytes - off < unit ? bytes - off : unit;
      plan_step_t st = {.kind = STEP_SEND,
                        .peer = p,
                        .msg = (uint32_t)((size_t)p * nmsg + i),
                        .bytes = len,
                        .src = {BUF_SEND, (size_t)p * bytes + off}};
      plan_add(&b, &st);
    }
  }
  return plan_build_end(&b, out);
}
