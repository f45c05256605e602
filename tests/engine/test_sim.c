/*
 * test_sim.c - the reference plan interpreter: it runs real plans to the
 * right answer, and it explains plans that cannot finish.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "algos/algos.h"
#include "check.h"
#include "sim.h"

static void run_ring(int n, size_t count, chorus_dtype dt, chorus_op op, bool inplace) {
  size_t es = chorus_dtype_size(dt), bytes = count * es;
  plan_t **plans = calloc((size_t)n, sizeof(*plans));
  sim_buf_t *bufs = calloc((size_t)n, sizeof(*bufs));
  char err[256];

  for (int r = 0; r < n; r++) {
    algo_args_t a = {.coll = COLL_ALLREDUCE,
                     .rank = r,
                     .nranks = n,
                     .count = count,
                     .dtype = dt,
                     .op = op,
                     .inplace = inplace,
                     .chunk_bytes = 64};
    cr_assert_eq(algo_ring_allreduce(&a, &plans[r]), 0);
    void *s = malloc(bytes + 1), *d = inplace ? s : malloc(bytes + 1);
    chk_fill(s, count, dt, op, r);
    bufs[r] = (sim_buf_t){s, bytes, d, bytes};
  }
  sim_stats_t st;
  int rc = sim_exec(plans, n, bufs, &st, err, sizeof(err));
  cr_assert_eq(rc, 0, "%d ranks, %zu elements: %s", n, count, err);
  for (int r = 0; r < n; r++) {
    cr_assert_eq(chk_verify(bufs[r].recv, count, dt, op, n, r, "sim"), 0, "rank %d of %d", r, n);
    cr_assert_eq(memcmp(bufs[r].recv, bufs[0].recv, bytes), 0, "rank %d differs from rank 0", r);
  }
  if (n > 1 && count >= (size_t)n)
    cr_assert_gt(st.messages, 0);
  for (int r = 0; r < n; r++) {
    if (bufs[r].recv != bufs[r].send)
      free(bufs[r].recv);
    free((void *)bufs[r].send);
    plan_free(plans[r]);
  }
  free(plans);
  free(bufs);
}

Test(sim, ring_allreduce_matches_reference) {
  static const size_t counts[] = {0, 1, 7, 97, 1000};
  for (int n = 1; n <= 9; n++)
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
      run_ring(n, counts[c], CHORUS_FLOAT32, CHORUS_SUM, false);
      run_ring(n, counts[c], CHORUS_INT32, CHORUS_MAX, true);
    }
  run_ring(16, 1000, CHORUS_BFLOAT16, CHORUS_AVG, false);
}

Test(sim, ring_allreduce_64_ranks) {
  run_ring(64, 6400, CHORUS_FLOAT32, CHORUS_SUM, false);
}

/* Two ranks that each send message 0 to the other but receive message 1:
 * nothing ever matches. */
Test(sim, unmatched_messages_are_explained) {
  plan_t *p[2];
  for (int r = 0; r < 2; r++) {
    plan_builder_t b;
    cr_assert_eq(plan_build_begin(&b, "broken", r, 2, 1, CHORUS_INT32, CHORUS_SUM, false), 0);
    plan_step_t snd = {
        .kind = STEP_SEND, .peer = 1 - r, .msg = 0, .bytes = 4, .src = {BUF_SEND, 0}};
    plan_step_t rcv = {
        .kind = STEP_RECV, .peer = 1 - r, .msg = 1, .bytes = 4, .dst = {BUF_RECV, 0}};
    plan_add(&b, &snd);
    plan_add(&b, &rcv);
    cr_assert_eq(plan_build_end(&b, &p[r]), 0);
  }
  char err[256];
  cr_assert_eq(sim_exec(p, 2, NULL, NULL, err, sizeof(err)), -EDEADLK);
  cr_assert(strstr(err, "never matched"), "%s", err);
  plan_free(p[0]);
  plan_free(p[1]);
}

/* A receive that waits for the send of the same rank, while the peer's
 * send waits for its receive: a cycle across ranks. */
Test(sim, cycles_are_explained) {
  plan_t *p[2];
  for (int r = 0; r < 2; r++) {
    plan_builder_t b;
    cr_assert_eq(plan_build_begin(&b, "cycle", r, 2, 1, CHORUS_INT32, CHORUS_SUM, false), 0);
    plan_step_t rcv = {
        .kind = STEP_RECV, .peer = 1 - r, .msg = 0, .bytes = 4, .dst = {BUF_RECV, 0}};
    plan_step_t snd = {
        .kind = STEP_SEND, .peer = 1 - r, .msg = 0, .bytes = 4, .src = {BUF_SEND, 0}};
    uint32_t i = plan_add(&b, &rcv), j = plan_add(&b, &snd);
    plan_dep(&b, i, j);
    cr_assert_eq(plan_build_end(&b, &p[r]), 0);
  }
  char err[256];
  int32_t in[2] = {1, 2}, out[2];
  sim_buf_t bufs[2] = {{&in[0], 4, &out[0], 4}, {&in[1], 4, &out[1], 4}};
  cr_assert_eq(sim_exec(p, 2, bufs, NULL, err, sizeof(err)), -EDEADLK);
  cr_assert(strstr(err, "stuck"), "%s", err);
  plan_free(p[0]);
  plan_free(p[1]);
}

Test(sim, out_of_bounds_is_caught) {
  plan_t *p[1];
  plan_builder_t b;
  cr_assert_eq(plan_build_begin(&b, "oob", 0, 1, 4, CHORUS_INT32, CHORUS_SUM, false), 0);
  plan_step_t cp = {.kind = STEP_COPY, .bytes = 16, .dst = {BUF_RECV, 4}, .src = {BUF_SEND, 0}};
  plan_add(&b, &cp);
  cr_assert_eq(plan_build_end(&b, &p[0]), 0);
  int32_t in[4] = {0}, out[4];
  sim_buf_t bufs[1] = {{in, 16, out, 16}};
  char err[256];
  cr_assert_eq(sim_exec(p, 1, bufs, NULL, err, sizeof(err)), -EFAULT);
  cr_assert(strstr(err, "outside"), "%s", err);
  plan_free(p[0]);
}
