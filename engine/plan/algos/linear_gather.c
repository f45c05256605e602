/*
 * linear_gather.c - every rank sends its block straight to the root.
 *
 * Rank p != root sends send[count] to the root, cut into chunk_bytes
 * messages 0..k-1; the root receives them into block p of recv and copies
 * its own block unless the call is in place (send == recv + root*count).
 *
 *   p0 --\
 *   p1 ---+--> root: recv[p0 | p1 | root | p3]
 *   p3 --/
 *
 * No dependencies: the root posts every receive at once. One message per
 * rank and chunk; best for few ranks or small counts.
 */
#include <errno.h>

#include "algos.h"

int algo_linear_gather(const algo_args_t *a, plan_t **out) {
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
  if (nmsg > ALGO_MAX_MSGS)
    return -E2BIG;
  if ((rc = plan_build_begin(&b, "linear", r, n, a->count, a->dtype, a->op, a->inplace)))
    return rc;
  if (r != root) {
    for (size_t i = 0; i < nmsg; i++) {
      size_t off = i * unit, len = bytes - off < unit ? bytes - off : unit;
      plan_step_t st = {.kind = STEP_SEND,
                        .peer = root,
                        .msg = (uint32_t)i,
                        .bytes = len,
                        .src = {BUF_SEND, off}};
      plan_add(&b, &st);
    }
    return plan_build_end(&b, out);
  }
  if (!a->inplace && bytes) {
    plan_step_t cp = {.kind = STEP_COPY,
                      .bytes = bytes,
                      .dst = {BUF_RECV, (size_t)root * bytes},
                      .src = {BUF_SEND, 0}};
    plan_add(&b, &cp);
  }
  for (int p = 0; p < n; p++) {
    if (p == root)
      continue;
    for (size_t i = 0; i < nmsg; i++) {
      size_t off = i * unit, len = bytes - off < unit ? bytes - off : unit;
      plan_step_t rv = {.kind = STEP_RECV,
                        .peer = p,
                        .msg = (uint32_t)i,
                        .bytes = len,
                        .dst = {BUF_RECV, (size_t)p * bytes + off}};
      plan_add(&b, &rv);
    }
  }
  return plan_build_end(&b, out);
}
