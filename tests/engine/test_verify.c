/*
 * test_verify.c - schedule verification: every registered algorithm passes
 * at many shapes, broken schedules (built by hand or by corrupting a real
 * ring plan) are rejected with the right code and a message naming the
 * ranks, steps and messages, and 4096 ranks verify in seconds.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "algos/algos.h"
#include "sim.h"
#include "verify.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool rooted(coll_kind c) {
  return c == COLL_BCAST || c == COLL_REDUCE || c == COLL_GATHER || c == COLL_SCATTER ||
         c == COLL_SEND || c == COLL_RECV;
}

/* algos.h defines in-place calls for these */
static bool has_inplace(coll_kind c) {
  return c != COLL_ALLTOALL && c != COLL_BARRIER && c != COLL_SEND && c != COLL_RECV;
}

/* hosts x ranks-per-host, contiguous; host_of must hold h * r ints */
static topo_t make_topo(int h, int r, int *host_of) {
  for (int i = 0; i < h * r; i++)
    host_of[i] = i / r;
  return (topo_t){.nranks = h * r, .nhosts = h, .host_of = host_of};
}

static void verify_shape(const algo_desc_t *d, int n, size_t count, int root, size_t chunk,
                         bool inplace, const topo_t *topo) {
  algo_args_t a = {.coll = d->coll,
                   .nranks = n,
                   .root = root,
                   .count = count,
                   .dtype = CHORUS_FLOAT32,
                   .op = CHORUS_SUM,
                   .inplace = inplace,
                   .chunk_bytes = chunk,
                   .topo = topo};
  char err[2048];
  int rc = verify_algo(d, &a, err, sizeof(err));
  cr_assert_eq(rc, 0, "%s %s n=%d count=%zu root=%d chunk=%zu%s%s: %d %s", coll_kind_str(d->coll),
               d->name, n, count, root, chunk, inplace ? " in place" : "", topo ? " (hosts)" : "",
               rc, err);
}

Test(verify, every_algorithm_at_many_shapes) {
  static const int ranks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16};
  static const size_t counts[] = {0, 1, 7, 97, 1000};
  static const size_t chunks[] = {16, 1 << 20};
  int nalgos = 0, nchecked = 0;

  for (const algo_desc_t *d = algo_table; d->name; d++) {
    nalgos++;
    if (d->flags & ALGO_HIERARCHICAL)
      continue; /* below, with hosts */
    for (size_t i = 0; i < sizeof(ranks) / sizeof(ranks[0]); i++) {
      int n = ranks[i];
      if ((d->coll == COLL_SEND || d->coll == COLL_RECV) && n < 2)
        continue;
      for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
        for (size_t k = 0; k < 2; k++) {
          int root = rooted(d->coll) && k ? n - 1 : 0;
          verify_shape(d, n, counts[c], root, chunks[k], k == 1 && has_inplace(d->coll), NULL);
          nchecked++;
        }
    }
  }
  cr_assert_gt(nalgos, 0);
  cr_assert_gt(nchecked, 0);
}

Test(verify, hierarchical_algorithms_with_hosts) {
  static const int shapes[][2] = {{2, 2}, {3, 3}, {2, 4}, {4, 2}, {3, 1}, {1, 4}};
  static const size_t counts[] = {0, 1, 7, 97, 1000};
  int host_of[64];

  for (const algo_desc_t *d = algo_table; d->name; d++) {
    if (!(d->flags & ALGO_HIERARCHICAL))
      continue;
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
      topo_t t = make_topo(shapes[s][0], shapes[s][1], host_of);
      for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        verify_shape(d, t.nranks, counts[c], 0, 64, false, &t);
        verify_shape(d, t.nranks, counts[c], t.nranks - 1, 1 << 20, true, &t);
      }
    }
  }
}

/* ---- hand-built broken schedules ---- */

static plan_t *begin_end(int rank, int n, const plan_step_t *steps, int nsteps,
                         const uint32_t (*deps)[2], int ndeps) {
  plan_builder_t b;
  plan_t *p;
  cr_assert_eq(plan_build_begin(&b, "hand", rank, n, 4, CHORUS_INT32, CHORUS_SUM, false), 0);
  for (int i = 0; i < nsteps; i++)
    cr_assert_neq(plan_add(&b, &steps[i]), UINT32_MAX);
  for (int i = 0; i < ndeps; i++)
    plan_dep(&b, deps[i][0], deps[i][1]);
  cr_assert_eq(plan_build_end(&b, &p), 0);
  return p;
}

#define SEND(to, m, b)                                                                             \
  { .kind = STEP_SEND, .peer = (to), .msg = (m), .bytes = (b) }
#define RECV(from, m, b)                                                                           \
  { .kind = STEP_RECV, .peer = (from), .msg = (m), .bytes = (b) }

static int check2(plan_t *p0, plan_t *p1, char *err, size_t len) {
  plan_t *p[2] = {p0, p1};
  int rc = verify_plans(p, 2, err, len);
  plan_free(p0);
  plan_free(p1);
  return rc;
}

Test(verify, send_without_receive) {
  plan_step_t s0[] = {SEND(1, 0, 4)};
  char err[2048];
  int rc =
      check2(begin_end(0, 2, s0, 1, NULL, 0), begin_end(1, 2, NULL, 0, NULL, 0), err, sizeof(err));
  cr_assert_eq(rc, -EPROTO, "%d %s", rc, err);
  cr_assert(strstr(err, "rank 0 step 0 sends message 0 to rank 1, which never receives it"), "%s",
            err);
}

Test(verify, receive_without_send) {
  plan_step_t s1[] = {RECV(0, 3, 4)};
  char err[2048];
  int rc =
      check2(begin_end(0, 2, NULL, 0, NULL, 0), begin_end(1, 2, s1, 1, NULL, 0), err, sizeof(err));
  cr_assert_eq(rc, -EPROTO, "%d %s", rc, err);
  cr_assert(strstr(err, "rank 1 step 0 receives message 3 from rank 0, which never sends it"), "%s",
            err);
}

Test(verify, size_mismatch) {
  plan_step_t s0[] = {SEND(1, 0, 8)}, s1[] = {RECV(0, 0, 4)};
  char err[2048];
  int rc =
      check2(begin_end(0, 2, s0, 1, NULL, 0), begin_end(1, 2, s1, 1, NULL, 0), err, sizeof(err));
  cr_assert_eq(rc, -EPROTO, "%d %s", rc, err);
  cr_assert(strstr(err, "message 0 from rank 0 to rank 1: sent 8 bytes"), "%s", err);
  cr_assert(strstr(err, "received 4"), "%s", err);
}

/* Acyclic while messages may overtake each other, but the executor posts a
 * pair's messages by number: m1 goes after m0, which waits for m5, which
 * waits for m1. */
Test(verify, pair_order_cycle) {
  plan_step_t s0[] = {SEND(1, 0, 4), SEND(1, 1, 4), RECV(1, 5, 4)};
  plan_step_t s1[] = {RECV(0, 0, 4), RECV(0, 1, 4), SEND(0, 5, 4)};
  const uint32_t d0[][2] = {{2, 0}}, d1[][2] = {{1, 2}};
  char err[2048];
  int rc = check2(begin_end(0, 2, s0, 3, d0, 1), begin_end(1, 2, s1, 3, d1, 1), err, sizeof(err));
  cr_assert_eq(rc, -EDEADLK, "%d %s", rc, err);
  cr_assert(strstr(err, "dependency cycle"), "%s", err);
  cr_assert(strstr(err, "(SEND of message 1 to rank 1) is posted after rank 0 step 0 (SEND of "
                        "message 0 to rank 1)") ||
                strstr(err, "(RECV of message 1 from rank 0) is posted after rank 1 step 0 (RECV "
                            "of message 0 from rank 0)"),
            "%s", err);

  /* numbered the other way round (m1 first), the same schedule passes */
  plan_step_t t0[] = {SEND(1, 1, 4), SEND(1, 0, 4), RECV(1, 5, 4)};
  plan_step_t t1[] = {RECV(0, 1, 4), RECV(0, 0, 4), SEND(0, 5, 4)};
  rc = check2(begin_end(0, 2, t0, 3, d0, 1), begin_end(1, 2, t1, 3, d1, 1), err, sizeof(err));
  cr_assert_eq(rc, 0, "%d %s", rc, err);
}

Test(verify, duplicated_message_number) {
  plan_step_t s0[] = {SEND(1, 5, 4), SEND(1, 5, 4)}, s1[] = {RECV(0, 5, 4), RECV(0, 5, 4)};
  char err[2048];
  int rc =
      check2(begin_end(0, 2, s0, 2, NULL, 0), begin_end(1, 2, s1, 2, NULL, 0), err, sizeof(err));
  cr_assert_eq(rc, -EPROTO, "%d %s", rc, err);
  cr_assert(strstr(err, "rank 0 sends message 5 to rank 1 twice (steps 0 and 1)"), "%s", err);

  /* the same number received twice, sent once under each of two numbers */
  plan_step_t t0[] = {SEND(1, 0, 4), SEND(1, 1, 4)}, t1[] = {RECV(0, 0, 4), RECV(0, 0, 4)};
  rc = check2(begin_end(0, 2, t0, 2, NULL, 0), begin_end(1, 2, t1, 2, NULL, 0), err, sizeof(err));
  cr_assert_eq(rc, -EPROTO, "%d %s", rc, err);
  cr_assert(strstr(err, "rank 1 receives message 0 from rank 0 twice (steps 0 and 1)"), "%s", err);
}

/* Each rank receives before it sends, and the receives wait for the other
 * rank's sends: a cycle across ranks. */
Test(verify, cross_rank_cycle) {
  plan_step_t s0[] = {RECV(1, 1, 4), SEND(1, 0, 4)}, s1[] = {RECV(0, 0, 4), SEND(0, 1, 4)};
  const uint32_t dep[][2] = {{0, 1}};
  char err[2048];
  int rc = check2(begin_end(0, 2, s0, 2, dep, 1), begin_end(1, 2, s1, 2, dep, 1), err, sizeof(err));
  cr_assert_eq(rc, -EDEADLK, "%d %s", rc, err);
  cr_assert(strstr(err, "dependency cycle of 4 steps"), "%s", err);
  cr_assert(strstr(err, "rank 0 step 0 (RECV of message 1 from rank 1)"), "%s", err);
  cr_assert(strstr(err, "rank 1 step 1 (SEND of message 1 to rank 0)"), "%s", err);
}

/* Three ranks: the cycle passes through all of them; a fourth rank's one
 * local step runs. */
Test(verify, cycle_through_three_ranks) {
  plan_t *p[4];
  const uint32_t dep[][2] = {{0, 1}};
  for (int r = 0; r < 3; r++) {
    plan_step_t s[] = {RECV((r + 2) % 3, 0, 4), SEND((r + 1) % 3, 0, 4)};
    p[r] = begin_end(r, 4, s, 2, dep, 1);
  }
  plan_step_t s3[] = {{.kind = STEP_COPY, .bytes = 4}};
  p[3] = begin_end(3, 4, s3, 1, NULL, 0);
  char err[2048];
  int rc = verify_plans(p, 4, err, sizeof(err));
  cr_assert_eq(rc, -EDEADLK, "%d %s", rc, err);
  cr_assert(strstr(err, "cycle of 6 steps"), "%s", err);
  cr_assert(strstr(err, "(1 of 7 steps can run)"), "%s", err);
  for (int r = 0; r < 4; r++)
    plan_free(p[r]);
}

Test(verify, local_cycle) {
  plan_step_t s[] = {{.kind = STEP_COPY, .bytes = 4}, {.kind = STEP_COPY, .bytes = 4}};
  const uint32_t dep[][2] = {{0, 1}, {1, 0}};
  plan_t *p[1] = {begin_end(0, 1, s, 2, dep, 2)};
  char err[2048];
  int rc = verify_plans(p, 1, err, sizeof(err));
  cr_assert_eq(rc, -EDEADLK, "%d %s", rc, err);
  cr_assert(strstr(err, "rank 0 step 1 (COPY) waits for rank 0 step 0 (COPY)") ||
                strstr(err, "rank 0 step 0 (COPY) waits for rank 0 step 1 (COPY)"),
            "%s", err);
  plan_free(p[0]);
}

Test(verify, malformed_plans) {
  plan_step_t s0[] = {SEND(2, 0, 4)};
  char err[2048];
  int rc =
      check2(begin_end(0, 2, s0, 1, NULL, 0), begin_end(1, 2, NULL, 0, NULL, 0), err, sizeof(err));
  cr_assert_eq(rc, -EINVAL, "%d %s", rc, err);
  cr_assert(strstr(err, "rank 0 step 0: SEND with peer 2 of 2 ranks"), "%s", err);

  plan_step_t self[] = {SEND(0, 0, 4)};
  rc = check2(begin_end(0, 2, self, 1, NULL, 0), begin_end(1, 2, NULL, 0, NULL, 0), err,
              sizeof(err));
  cr_assert_eq(rc, -EINVAL, "%d %s", rc, err);

  plan_step_t big[] = {SEND(1, 1u << 24, 4)};
  rc =
      check2(begin_end(0, 2, big, 1, NULL, 0), begin_end(1, 2, NULL, 0, NULL, 0), err, sizeof(err));
  cr_assert_eq(rc, -EINVAL, "%d %s", rc, err);
  cr_assert(strstr(err, "over 24 bits"), "%s", err);

  /* plans in the wrong slots */
  plan_t *p[2] = {begin_end(1, 2, NULL, 0, NULL, 0), begin_end(0, 2, NULL, 0, NULL, 0)};
  cr_assert_eq(verify_plans(p, 2, err, sizeof(err)), -EINVAL);
  cr_assert(strstr(err, "rank 0: plan is for rank 1"), "%s", err);
  plan_free(p[0]);
  plan_free(p[1]);
}

/* ---- corrupting a copy of a real ring plan ---- */

#define NONE UINT32_MAX

/* A copy of p without step `drop`, with step `resize` moving `bytes`, and
 * an extra dependency from -> to (indices of p). NONE: no such change. */
static plan_t *corrupt(const plan_t *p, uint32_t drop, uint32_t resize, size_t bytes, uint32_t from,
                       uint32_t to) {
  plan_builder_t b;
  plan_t *out;
  uint32_t *idx = malloc(p->nsteps * sizeof(*idx));
  cr_assert_eq(
      plan_build_begin(&b, p->algo, p->rank, p->nranks, p->count, p->dtype, p->op, p->inplace), 0);
  b.plan->scratch_bytes = p->scratch_bytes;
  for (uint32_t i = 0; i < p->nsteps; i++) {
    plan_step_t s = p->steps[i];
    if (i == resize)
      s.bytes = bytes;
    idx[i] = i == drop ? NONE : plan_add(&b, &s);
  }
  for (uint32_t i = 0; i < p->nsteps; i++)
    for (uint32_t k = 0; k < p->steps[i].nsucc; k++)
      plan_dep(&b, idx[i], idx[p->succ[p->steps[i].succ_off + k]]);
  if (from != NONE)
    plan_dep(&b, idx[from], idx[to]);
  cr_assert_eq(plan_build_end(&b, &out), 0);
  free(idx);
  return out;
}

static uint32_t find_step(const plan_t *p, int kind, uint32_t msg) {
  for (uint32_t i = 0; i < p->nsteps; i++)
    if (p->steps[i].kind == kind && p->steps[i].msg == msg)
      return i;
  cr_assert_fail("rank %d: no %s of message %u", p->rank, plan_step_kind_str(kind), msg);
  return NONE;
}

typedef struct ring4 {
  plan_t *p[4];
} ring4_t;

static void ring4(ring4_t *r) {
  for (int i = 0; i < 4; i++) {
    algo_args_t a = {.coll = COLL_ALLREDUCE,
                     .rank = i,
                     .nranks = 4,
                     .count = 4,
                     .dtype = CHORUS_FLOAT32,
                     .op = CHORUS_SUM,
                     .chunk_bytes = 1 << 20};
    cr_assert_eq(algo_ring_allreduce(&a, &r->p[i]), 0);
  }
  char err[256];
  cr_assert_eq(verify_plans(r->p, 4, err, sizeof(err)), 0, "%s", err);
}

static int check_swap(ring4_t *r, int rank, plan_t *bad, char *err, size_t len) {
  plan_t *good = r->p[rank];
  r->p[rank] = bad;
  int rc = verify_plans(r->p, 4, err, len);
  r->p[rank] = good;
  plan_free(bad);
  return rc;
}

static void ring4_free(ring4_t *r) {
  for (int i = 0; i < 4; i++)
    plan_free(r->p[i]);
}

Test(verify, ring_with_a_receive_dropped) {
  ring4_t r;
  char err[2048];
  ring4(&r);
  /* rank 1's receive of message 0 (reduce-scatter step 0, from rank 0) */
  uint32_t i = find_step(r.p[1], STEP_RECV, 0);
  int rc = check_swap(&r, 1, corrupt(r.p[1], i, NONE, 0, NONE, NONE), err, sizeof(err));
  cr_assert_eq(rc, -EPROTO, "%d %s", rc, err);
  cr_assert(strstr(err, "rank 0 step 0 sends message 0 to rank 1, which never receives it"), "%s",
            err);
  ring4_free(&r);
}

Test(verify, ring_with_a_resized_send) {
  ring4_t r;
  char err[2048];
  ring4(&r);
  uint32_t i = find_step(r.p[2], STEP_SEND, 3); /* allgather step 0 */
  int rc = check_swap(&r, 2, corrupt(r.p[2], NONE, i, 8, NONE, NONE), err, sizeof(err));
  cr_assert_eq(rc, -EPROTO, "%d %s", rc, err);
  cr_assert(strstr(err, "message 3 from rank 2 to rank 3: sent 8 bytes"), "%s", err);
  cr_assert(strstr(err, "received 4"), "%s", err);
  ring4_free(&r);
}

/* Every rank's first send made to wait for its first receive: each waits
 * for its left neighbour's send, which waits for its own receive, around
 * the ring - a cycle through all four ranks (no rank has a local one). */
Test(verify, ring_with_a_dependency_cycle) {
  ring4_t r;
  plan_t *bad[4];
  char err[2048];
  ring4(&r);
  for (int i = 0; i < 4; i++) {
    uint32_t snd = find_step(r.p[i], STEP_SEND, 0), rcv = find_step(r.p[i], STEP_RECV, 0);
    bad[i] = corrupt(r.p[i], NONE, NONE, 0, rcv, snd);
  }
  int rc = verify_plans(bad, 4, err, sizeof(err));
  cr_assert_eq(rc, -EDEADLK, "%d %s", rc, err);
  cr_assert(
      strstr(err, "dependency cycle of 8 steps (0 of 60 steps can run) across ranks 0, 3, 2, 1:"),
      "%s", err);
  for (int i = 0; i < 4; i++) {
    char want[64];
    snprintf(want, sizeof(want), "rank %d step 1 (RECV of message 0", i);
    cr_assert(strstr(err, want), "%s: %s missing", err, want);
  }
  /* one corrupted rank alone leaves the ring runnable: its receive pairs
   * with a send that waits for nothing */
  plan_t *good = r.p[2];
  r.p[2] = bad[2];
  cr_assert_eq(verify_plans(r.p, 4, err, sizeof(err)), 0, "%s", err);
  r.p[2] = good;
  /* the simulator agrees that the corrupted ring cannot finish */
  cr_assert_eq(sim_exec(bad, 4, NULL, NULL, err, sizeof(err)), -EDEADLK);
  for (int i = 0; i < 4; i++)
    plan_free(bad[i]);
  ring4_free(&r);
}

/* A dependency from a late step back to an early one of the same rank. */
Test(verify, ring_with_a_local_cycle) {
  ring4_t r;
  char err[2048];
  ring4(&r);
  uint32_t snd = find_step(r.p[0], STEP_SEND, 2), rcv = find_step(r.p[0], STEP_RECV, 5);
  int rc = check_swap(&r, 0, corrupt(r.p[0], NONE, NONE, 0, rcv, snd), err, sizeof(err));
  cr_assert_eq(rc, -EDEADLK, "%d %s", rc, err);
  cr_assert(strstr(err, "SEND of message 2 to rank 1"), "%s", err);
  cr_assert(strstr(err, "RECV of message 5 from rank 3"), "%s", err);
  ring4_free(&r);
}

/* ---- 4096 ranks ---- */

static size_t scale_count(coll_kind c) {
  switch (c) {
  case COLL_ALLGATHER:
  case COLL_REDUCE_SCATTER:
  case COLL_ALLTOALL:
  case COLL_GATHER:
  case COLL_SCATTER:
    return 4; /* per block: n blocks */
  default:
    return 4096 * 4;
  }
}

Test(verify, ring_allreduce_4096_ranks) {
  const algo_desc_t *d = algo_find(COLL_ALLREDUCE, "ring");
  algo_args_t a = {.coll = COLL_ALLREDUCE,
                   .nranks = 4096,
                   .count = 4096 * 4,
                   .dtype = CHORUS_FLOAT32,
                   .op = CHORUS_SUM,
                   .chunk_bytes = 1 << 20};
  char err[2048];
  double t0 = now_s();
  int rc = verify_algo(d, &a, err, sizeof(err));
  double dt = now_s() - t0;
  cr_assert_eq(rc, 0, "%s", err);
  fprintf(stderr, "verify: ring allreduce, 4096 ranks: %.2f s\n", dt);
  cr_assert_lt(dt, 60.0, "took %.1f s", dt);
}

Test(verify, every_algorithm_4096_ranks) {
  static int host_of[4096];
  topo_t t = make_topo(512, 8, host_of);
  const uint64_t budget = 40u * 1000 * 1000; /* steps, all ranks */
  int done = 0;

  for (const algo_desc_t *d = algo_table; d->name; d++) {
    if (d->coll == COLL_ALLREDUCE && !strcmp(d->name, "ring"))
      continue; /* above */
    algo_args_t a = {.coll = d->coll,
                     .nranks = 4096,
                     .root = d->coll == COLL_SEND || d->coll == COLL_RECV ? 1 : 0,
                     .count = scale_count(d->coll),
                     .dtype = CHORUS_FLOAT32,
                     .op = CHORUS_SUM,
                     .chunk_bytes = 1 << 20,
                     .topo = &t};
    /* estimate from the plans of ranks 0 and n-1 (roots and leaves) */
    uint64_t est = 0;
    for (int k = 0; k < 2; k++) {
      plan_t *p = NULL;
      a.rank = k ? 4095 : 0;
      if (d->coll == COLL_SEND || d->coll == COLL_RECV)
        a.rank = 0;
      cr_assert_eq(d->build(&a, &p), 0, "%s %s rank %d", coll_kind_str(d->coll), d->name, a.rank);
      if ((uint64_t)p->nsteps * 4096 > est)
        est = (uint64_t)p->nsteps * 4096;
      plan_free(p);
    }
    if (est > budget) {
      fprintf(stderr, "verify: %s %s at 4096 ranks skipped: ~%llu steps\n", coll_kind_str(d->coll),
              d->name, (unsigned long long)est);
      continue;
    }
    char err[2048];
    double t0 = now_s();
    int rc = verify_algo(d, &a, err, sizeof(err));
    double dt = now_s() - t0;
    cr_assert_eq(rc, 0, "%s %s: %s", coll_kind_str(d->coll), d->name, err);
    fprintf(stderr, "verify: %s %s, 4096 ranks (~%llu steps): %.2f s\n", coll_kind_str(d->coll),
            d->name, (unsigned long long)est, dt);
    cr_assert_lt(dt, 60.0);
    done++;
  }
  cr_assert_gt(done, 0);
}
