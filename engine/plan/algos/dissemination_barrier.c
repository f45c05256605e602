/*
 * dissemination_barrier.c - dissemination barrier (Hensgen, Finkel, Manber).
 *
 * Rounds k = 0 .. ceil(log2 n)-1: send an empty message to r + 2^k and
 * receive one from r - 2^k. Round k starts once round k-1's message has
 * arrived, so after the last round rank r has heard, directly or through
 * others, from every rank: none can leave before all have entered.
 *
 *   n = 5   round 0: r -> r+1   round 1: r -> r+2   round 2: r -> r+4
 *
 * Message k is round k's. One rank: an empty plan.
 */
#include <errno.h>

#include "algos.h"

int algo_dissemination_barrier(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank;
  plan_builder_t b;
  int rc;

  *out = NULL;
  if (n <= 0 || r < 0 || r >= n)
    return -EINVAL;
  if ((rc = plan_build_begin(&b, "dissemination", r, n, 0, a->dtype, a->op, false)))
    return rc;
  uint32_t prev = UINT32_MAX;
  for (uint32_t k = 0; n > 1 && ((size_t)1 << k) < (size_t)n; k++) {
    int d = 1 << k;
    plan_step_t st = {
        .kind = STEP_SEND, .peer = algo_mod(r + d, n), .msg = k, .src = {BUF_SEND, 0}};
    plan_step_t rv = {
        .kind = STEP_RECV, .peer = algo_mod(r - d, n), .msg = k, .dst = {BUF_RECV, 0}};
    uint32_t i = plan_add(&b, &st), j = plan_add(&b, &rv);
    plan_dep(&b, prev, i);
    plan_dep(&b, prev, j);
    prev = j;
  }
  return plan_build_end(&b, out);
}
