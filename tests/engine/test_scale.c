/*
 * test_scale.c - schedules at scale: every registered algorithm run with
 * real data at 64 ranks by the reference interpreter (sim_exec) against a
 * plain reference; ring allreduce at 4096 ranks verified and run on the
 * virtual clock (sim_time) with the byte counts the algorithm implies; the
 * algorithm the selector picks for each collective, and every hierarchical
 * one, verified at 4096 ranks on 512 hosts of 8; and schedules whose ranks
 * share plans (sim.h: shapes) checked on the folded graph exactly as on the
 * whole one. Times go to the log.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "algos/algos.h"
#include "plan.h"
#include "select.h"
#include "sim.h"
#include "verify.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* rank r's input element j (of its send buffer): small, so int32 sums are
 * exact in any order */
static int32_t input(int r, size_t j) {
  return (int32_t)(1 + ((size_t)r * 7 + j * 3) % 11);
}

typedef struct bufs {
  int32_t **send, **recv;
  size_t send_count, recv_count; /* elements per rank */
  sim_buf_t *sb;
} bufs_t;

/* Buffers by the conventions of algos.h (non-roots get the same sizes). */
static void alloc_bufs(bufs_t *b, coll_kind c, int n, size_t count) {
  size_t nc = (size_t)n * count;
  switch (c) {
  case COLL_ALLGATHER:
    b->send_count = count, b->recv_count = nc;
    break;
  case COLL_REDUCE_SCATTER:
    b->send_count = nc, b->recv_count = count;
    break;
  case COLL_ALLTOALL:
    b->send_count = nc, b->recv_count = nc;
    break;
  case COLL_GATHER:
    b->send_count = count, b->recv_count = nc;
    break;
  case COLL_SCATTER:
    b->send_count = nc, b->recv_count = count;
    break;
  case COLL_BARRIER:
    b->send_count = 0, b->recv_count = 0;
    break;
  default:
    b->send_count = count, b->recv_count = count;
    break;
  }
  b->send = calloc((size_t)n, sizeof(*b->send));
  b->recv = calloc((size_t)n, sizeof(*b->recv));
  b->sb = calloc((size_t)n, sizeof(*b->sb));
  for (int r = 0; r < n; r++) {
    b->send[r] = malloc(b->send_count * 4 + 4);
    b->recv[r] = malloc(b->recv_count * 4 + 4);
    for (size_t j = 0; j < b->send_count; j++)
      b->send[r][j] = input(r, j);
    for (size_t j = 0; j < b->recv_count; j++)
      b->recv[r][j] = -1;
    b->sb[r] = (sim_buf_t){b->send[r], b->send_count * 4, b->recv[r], b->recv_count * 4};
  }
}

static void free_bufs(bufs_t *b, int n) {
  for (int r = 0; r < n; r++) {
    free(b->send[r]);
    free(b->recv[r]);
  }
  free(b->send);
  free(b->recv);
  free(b->sb);
}

/* Expected recv[r][j]; false when that element is not defined (non-roots). */
static bool expect(coll_kind c, int n, int root, size_t count, int r, size_t j, int32_t *v) {
  int64_t s = 0;
  switch (c) {
  case COLL_ALLREDUCE:
  case COLL_REDUCE:
    if (c == COLL_REDUCE && r != root)
      return false;
    for (int q = 0; q < n; q++)
      s += input(q, j);
    *v = (int32_t)s;
    return true;
  case COLL_BCAST:
    *v = input(root, j);
    return true;
  case COLL_ALLGATHER:
    *v = input((int)(j / count), j % count);
    return true;
  case COLL_GATHER:
    if (r != root)
      return false;
    *v = input((int)(j / count), j % count);
    return true;
  case COLL_REDUCE_SCATTER:
    for (int q = 0; q < n; q++)
      s += input(q, (size_t)r * count + j);
    *v = (int32_t)s;
    return true;
  case COLL_ALLTOALL:
    *v = input((int)(j / count), (size_t)r * count + j % count);
    return true;
  case COLL_SCATTER:
    *v = input(root, (size_t)r * count + j);
    return true;
  default:
    return false;
  }
}

/* Builds every rank's plan of d (SEND/RECV: rank `root`+1 sends to rank
 * `root`, the other ranks idle), runs them with data, checks every rank. */
static bool run_with_data(const algo_desc_t *d, int n, size_t count, int root, size_t chunk,
                          const topo_t *topo) {
  plan_t **plans = calloc((size_t)n, sizeof(*plans));
  bufs_t b;
  char err[1024];
  bool p2p = d->coll == COLL_SEND || d->coll == COLL_RECV;
  int src = (root + 1) % n;

  alloc_bufs(&b, p2p ? COLL_BCAST : d->coll, n, count);
  for (int r = 0; r < n; r++) {
    algo_args_t a = {.coll = d->coll,
                     .rank = r,
                     .nranks = n,
                     .root = root,
                     .count = count,
                     .dtype = CHORUS_INT32,
                     .op = CHORUS_SUM,
                     .chunk_bytes = chunk,
                     .topo = topo};
    const algo_desc_t *bd = d;
    if (p2p) {
      bd = r == src ? algo_find(COLL_SEND, d->name) : algo_find(COLL_RECV, d->name);
      a.coll = r == src ? COLL_SEND : COLL_RECV;
      a.root = r == src ? root : src;
      if (r != src && r != root) {
        plan_builder_t pb;
        cr_assert_eq(plan_build_begin(&pb, "idle", r, n, count, CHORUS_INT32, CHORUS_SUM, false),
                     0);
        cr_assert_eq(plan_build_end(&pb, &plans[r]), 0);
        continue;
      }
    }
    cr_assert_not_null(bd);
    int rc = bd->build(&a, &plans[r]);
    cr_assert_eq(rc, 0, "%s %s rank %d: %d", coll_kind_str(d->coll), d->name, r, rc);
  }
  int rc = sim_exec(plans, n, b.sb, NULL, err, sizeof(err));
  cr_assert_eq(rc, 0, "%s %s n=%d count=%zu: %s", coll_kind_str(d->coll), d->name, n, count, err);
  size_t checked = 0, wrong = 0;
  for (int r = 0; r < n; r++)
    for (size_t j = 0; j < b.recv_count; j++) {
      int32_t want;
      if (p2p) {
        if (r != root)
          break;
        want = input(src, j);
      } else if (!expect(d->coll, n, root, count, r, j, &want)) {
        continue;
      }
      if (b.recv[r][j] != want && wrong++ < 3)
        fprintf(stderr, "%s %s n=%d count=%zu root=%d chunk=%zu: rank %d [%zu] = %d, want %d\n",
                coll_kind_str(d->coll), d->name, n, count, root, chunk, r, j, b.recv[r][j], want);
      checked++;
    }
  if (d->coll != COLL_BARRIER && count)
    cr_assert_gt(checked, 0);
  for (int r = 0; r < n; r++)
    plan_free(plans[r]);
  free(plans);
  free_bufs(&b, n);
  return wrong == 0;
}

Test(scale, every_algorithm_64_ranks_with_data) {
  static int host_of[64];
  topo_t t = {.nranks = 64, .nhosts = 8, .host_of = host_of};
  char bad[512] = "";
  size_t off = 0;
  int ran = 0;
  for (int r = 0; r < 64; r++)
    host_of[r] = r / 8;
  for (const algo_desc_t *d = algo_table; d->name; d++) {
    const topo_t *tp = (d->flags & ALGO_HIERARCHICAL) ? &t : NULL;
    /* many chunks and uneven segments; then one chunk */
    bool ok = run_with_data(d, 64, 1000, 5, 256, tp);
    ok = run_with_data(d, 64, 67, 0, 1 << 20, tp) && ok;
    if (!ok && off < sizeof(bad))
      off += (size_t)snprintf(bad + off, sizeof(bad) - off, " %s %s;", coll_kind_str(d->coll),
                              d->name);
    ran++;
  }
  cr_assert_gt(ran, 0);
  cr_assert_eq(off, 0, "wrong results (first elements on stderr):%s", bad);
}

/* The 4096-rank ring: built once (every rank's plan, one shape shared by
 * all), verified, then timed on the virtual clock. */
Test(scale, ring_allreduce_4096_ranks) {
  const int n = 4096;
  const size_t count = (size_t)n * 4, N = count * 4;
  const algo_desc_t *d = algo_find(COLL_ALLREDUCE, "ring");
  static int host_of[4096];
  topo_t t = {.nranks = n, .nhosts = 512, .host_of = host_of};
  algo_args_t a = {.coll = COLL_ALLREDUCE,
                   .nranks = n,
                   .count = count,
                   .dtype = CHORUS_FLOAT32,
                   .op = CHORUS_SUM,
                   .chunk_bytes = 1 << 20,
                   .topo = &t};
  char err[1024];
  sim_graph_t *g;
  sim_model_t m;
  sim_time_result_t res;

  for (int r = 0; r < n; r++)
    host_of[r] = r / 8;
  double t0 = now_s();
  cr_assert_eq(sim_graph_build(d, &a, &g, err, sizeof(err)), 0, "%s", err);
  double t1 = now_s();
  cr_assert_eq(verify_graph(g, err, sizeof(err)), 0, "%s", err);
  double t2 = now_s();
  sim_model_default(&m);
  cr_assert_eq(sim_time(g, &t, &m, &res, err, sizeof(err)), 0, "%s", err);
  double t3 = now_s();
  cr_log_info("scale: ring allreduce 4096 ranks (%" PRIu64 " steps, %u shape%s): build %.2f s, "
              "verify %.2f s, sim_time %.2f s",
              g->nsteps, g->nshapes, g->nshapes == 1 ? "" : "s", t1 - t0, t2 - t1, t3 - t2);

  /* every rank's plan is the same but for its neighbours: one shape */
  cr_assert_eq(g->nshapes, 1);
  cr_assert_eq(g->period, 1);
  /* 5 (n-1) steps a rank; 2 (n-1) messages of N/n bytes a rank */
  cr_assert_eq(g->max_steps, 5u * (n - 1));
  cr_assert_eq(g->nsteps, (uint64_t)n * 5 * (n - 1));
  cr_assert_eq(res.steps, (uint64_t)n * 5 * (n - 1));
  cr_assert_eq(res.messages, (uint64_t)n * 2 * (n - 1));
  cr_assert_eq(res.max_sent, 2 * (uint64_t)(n - 1) * N / n);
  cr_assert_eq(res.bytes, (uint64_t)n * 2 * (n - 1) * N / n);
  /* within a host 7 of every 8 links; across hosts the 8th, each carrying
   * the whole 2 (n-1)/n N */
  cr_assert_eq(res.max_sent_inter, 2 * (uint64_t)(n - 1) * N / n);
  cr_assert_eq(res.bytes_inter * 8, res.bytes);
  cr_assert_eq(res.link_bytes, 2 * (uint64_t)(n - 1) * N / n);
  cr_assert_eq(res.hlink_bytes, 2 * (uint64_t)(n - 1) * N / n);
  cr_assert_eq(res.hlink_dst, (res.hlink_src + 1) % 512);
  /* the critical path is the ring's 2 (n-1) dependent messages, paced by
   * the hosts' links: the closed form within a factor of two */
  select_ctx_t s;
  cr_assert_eq(select_init(&s, NULL, false, err, sizeof(err)), 0);
  double model = select_cost(&s, d, &a);
  cr_assert(res.time > 0.5 * model && res.time < 2 * model, "sim %g s, model %g s", res.time,
            model);
  select_fini(&s);
  sim_graph_free(g);
  cr_assert_lt(t3 - t0, 120.0, "%.1f s", t3 - t0);
}

/* Steps of d at 4096 ranks, from the plans of ranks 0 and n-1 (roots and
 * leaves differ); 0 when they cannot be built. */
static uint64_t estimate_steps(const algo_desc_t *d, algo_args_t a) {
  uint64_t est = 0;
  for (int k = 0; k < 2; k++) {
    plan_t *p = NULL;
    a.rank = k ? a.nranks - 1 : 0;
    if (d->coll == COLL_SEND || d->coll == COLL_RECV)
      a.rank = (a.root + 1) % a.nranks;
    if (d->build(&a, &p))
      return 0;
    if ((uint64_t)p->nsteps * (uint64_t)a.nranks > est)
      est = (uint64_t)p->nsteps * (uint64_t)a.nranks;
    plan_free(p);
  }
  return est;
}

/* Verifies d for a at 4096 ranks unless it is over `budget` steps;
 * returns the seconds it took (0 when skipped). */
static double verify_4096(const algo_desc_t *d, algo_args_t a, size_t bytes, uint64_t budget) {
  char err[2048];
  sim_graph_t *g;
  uint64_t est = estimate_steps(d, a);
  if (est > budget) {
    cr_log_info("scale: %s %s, %zu B, 4096 ranks: skipped, ~%" PRIu64 " steps over the %" PRIu64
                " budget",
                coll_kind_str(d->coll), d->name, bytes, est, budget);
    return 0;
  }
  double t0 = now_s();
  cr_assert_eq(sim_graph_build(d, &a, &g, err, sizeof(err)), 0, "%s %s: %s", coll_kind_str(d->coll),
               d->name, err);
  int rc = verify_graph(g, err, sizeof(err));
  double dt = now_s() - t0;
  cr_assert_eq(rc, 0, "%s %s, %zu B, 4096 ranks: %s", coll_kind_str(d->coll), d->name, bytes, err);
  cr_log_info("scale: %s %s, %zu B, 4096 ranks (512 hosts of 8): %" PRIu64
              " steps, %u shapes, period %d: %.2f s",
              coll_kind_str(d->coll), d->name, bytes, g->nsteps, g->nshapes, g->period, dt);
  sim_graph_free(g);
  return dt;
}

static bool blocked(coll_kind c) {
  return c == COLL_ALLGATHER || c == COLL_REDUCE_SCATTER || c == COLL_ALLTOALL ||
         c == COLL_GATHER || c == COLL_SCATTER;
}

/* What a 4096-rank job would run: the selector's choice for every
 * collective at 4 KiB and 64 KiB (a rank's vector, or one block of the
 * blocked collectives), and every hierarchical algorithm, on 512 hosts of 8.
 * Schedules over the budget are named in the log: 64 KiB allreduce picks
 * rhd, 84 million steps whose ranks all differ (the order of a rank's steps
 * follows its bits), some 20 s; 4 KiB alltoall picks bruck, 118 million. */
Test(scale, selected_algorithms_4096_ranks) {
  const int n = 4096;
  const uint64_t budget = 40u * 1000 * 1000;
  const size_t sizes[] = {4096, 65536};
  static int host_of[4096];
  topo_t t = {.nranks = n, .nhosts = 512, .host_of = host_of};
  select_ctx_t s;
  char err[256];
  double total = 0;
  int done = 0;

  for (int r = 0; r < n; r++)
    host_of[r] = r / 8;
  cr_assert_eq(select_init(&s, NULL, false, err, sizeof(err)), 0, "%s", err);
  for (int c = 0; c < COLL_KIND_COUNT; c++)
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
      algo_args_t a = {.coll = (coll_kind)c,
                       .nranks = n,
                       .root = c == COLL_SEND || c == COLL_RECV ? 1 : 0,
                       .count = sizes[k] / 4,
                       .dtype = CHORUS_FLOAT32,
                       .op = CHORUS_SUM,
                       .chunk_bytes = 1 << 20,
                       .topo = &t};
      const algo_desc_t *d = select_algo(&s, &a, NULL, 0);
      cr_assert_not_null(d, "%s", coll_kind_str(c));
      double dt = verify_4096(d, a, sizes[k], budget);
      total += dt;
      done += dt > 0;
    }
  for (const algo_desc_t *d = algo_table; d->name; d++) {
    if (!(d->flags & ALGO_HIERARCHICAL))
      continue;
    algo_args_t a = {.coll = d->coll,
                     .nranks = n,
                     .count = blocked(d->coll) ? 4 : (size_t)n * 4,
                     .dtype = CHORUS_FLOAT32,
                     .op = CHORUS_SUM,
                     .chunk_bytes = 1 << 20,
                     .topo = &t};
    double dt = verify_4096(d, a, a.count * 4, budget);
    total += dt;
    done += dt > 0;
  }
  select_fini(&s);
  cr_log_info("scale: %d schedules of 4096 ranks verified in %.2f s", done, total);
  cr_assert_gt(done, 10);
}

/* A copy of p with one more dependency, from -> to (UINT32_MAX: none), and
 * one more SEND to `peer` (-1: none) that no rank receives. */
static plan_t *changed(const plan_t *p, uint32_t from, uint32_t to, int peer) {
  plan_builder_t b;
  plan_t *out;
  cr_assert_eq(
      plan_build_begin(&b, p->algo, p->rank, p->nranks, p->count, p->dtype, p->op, p->inplace), 0);
  for (uint32_t i = 0; i < p->nsteps; i++)
    cr_assert_neq(plan_add(&b, &p->steps[i]), UINT32_MAX);
  for (uint32_t i = 0; i < p->nsteps; i++)
    for (uint32_t k = 0; k < p->steps[i].nsucc; k++)
      plan_dep(&b, i, p->succ[p->steps[i].succ_off + k]);
  plan_dep(&b, from, to);
  if (peer >= 0)
    plan_add(&b,
             &(plan_step_t){.kind = STEP_SEND, .peer = peer, .msg = ALGO_MAX_MSGS - 1, .bytes = 4});
  cr_assert_eq(plan_build_end(&b, &out), 0);
  return out;
}

static uint32_t nth_step(const plan_t *p, int kind, int nth) {
  for (uint32_t i = 0; i < p->nsteps; i++)
    if (p->steps[i].kind == kind && nth-- == 0)
      return i;
  cr_assert_fail("rank %d: no %s", p->rank, plan_step_kind_str(kind));
  return UINT32_MAX;
}

/* Every rank's plan of d at n ranks, built and checked: its graph folds
 * onto `period` ranks, peers written XOR or not as told. Then the same
 * change on every rank, so that the graph still folds: the first send made
 * to wait for the first receive, which pairs with a peer's first send (a
 * cycle, found and named on the real ranks), or one more send that nobody
 * receives (named on rank 0). */
static void fold(const char *coll, const char *name, int n, int period, bool xor_peers) {
  const algo_desc_t *d = algo_find(coll_kind_parse(coll), name);
  plan_t **p = calloc((size_t)n, sizeof(*p)), **bad = calloc((size_t)n, sizeof(*p));
  sim_graph_t *g;
  char err[2048], want[160];
  int rc;

  cr_assert_not_null(d);
  for (int r = 0; r < n; r++) {
    algo_args_t a = {.coll = d->coll,
                     .rank = r,
                     .nranks = n,
                     .count = blocked(d->coll) ? 3 : (size_t)n * 3,
                     .dtype = CHORUS_FLOAT32,
                     .op = CHORUS_SUM,
                     .chunk_bytes = 4 * 2};
    cr_assert_eq(d->build(&a, &p[r]), 0);
  }
  cr_assert_eq(sim_graph_from_plans(p, n, &g, err, sizeof(err)), 0, "%s", err);
  cr_assert_eq(g->period, period, "%s %s: period %d", coll, name, g->period);
  cr_assert_eq(g->xor_peers, xor_peers, "%s %s", coll, name);
  cr_assert_eq(verify_graph(g, err, sizeof(err)), 0, "%s", err);
  sim_graph_free(g);

  for (int r = 0; r < n; r++)
    bad[r] = changed(p[r], nth_step(p[r], STEP_RECV, 0), nth_step(p[r], STEP_SEND, 0), -1);
  cr_assert_eq(sim_graph_from_plans(bad, n, &g, err, sizeof(err)), 0, "%s", err);
  cr_assert_eq(g->period, period);
  rc = verify_graph(g, err, sizeof(err));
  cr_assert_eq(rc, -EDEADLK, "%s %s: %d %s", coll, name, rc, err);
  cr_assert(strstr(err, "dependency cycle of "), "%s", err);
  cr_assert_eq(sim_exec(bad, n, NULL, NULL, err, sizeof(err)), -EDEADLK, "%s", err);
  sim_graph_free(g);

  for (int r = 0; r < n; r++) {
    plan_free(bad[r]);
    bad[r] = changed(p[r], UINT32_MAX, UINT32_MAX, xor_peers ? r ^ 1 : (r + 1) % n);
  }
  cr_assert_eq(sim_graph_from_plans(bad, n, &g, err, sizeof(err)), 0, "%s", err);
  cr_assert_eq(g->period, period);
  rc = verify_graph(g, err, sizeof(err));
  cr_assert_eq(rc, -EPROTO, "%s %s: %d %s", coll, name, rc, err);
  snprintf(want, sizeof(want), "rank 0 step %u sends message %u to rank 1, which never receives it",
           p[0]->nsteps, ALGO_MAX_MSGS - 1);
  cr_assert(strstr(err, want), "%s: want %s", err, want);
  sim_graph_free(g);
  for (int r = 0; r < n; r++) {
    plan_free(p[r]);
    plan_free(bad[r]);
  }
  free(p);
  free(bad);
}

Test(scale, symmetric_schedules_fold) {
  fold("allreduce", "ring", 12, 1, false);
  fold("allreduce", "rd", 16, 1, true);
  fold("reduce_scatter", "rhd", 8, 4, true);
  fold("barrier", "dissemination", 10, 1, false);
  fold("alltoall", "pairwise", 6, 1, false);
}

/* The virtual clock on a case small enough to work out by hand. */
Test(scale, sim_time_two_ranks_by_hand) {
  const algo_desc_t *d = algo_find(COLL_ALLREDUCE, "ring");
  algo_args_t a = {.coll = COLL_ALLREDUCE,
                   .nranks = 2,
                   .count = 1000,
                   .dtype = CHORUS_FLOAT32,
                   .op = CHORUS_SUM,
                   .chunk_bytes = 1 << 20};
  sim_graph_t *g;
  sim_model_t m = {.alpha = {1e-6, 10e-6}, .beta = {1e-9, 1e-8}, .gamma = 2e-9, .copy_beta = 0};
  sim_time_result_t res;
  char err[256];
  cr_assert_eq(sim_graph_build(d, &a, &g, err, sizeof(err)), 0, "%s", err);
  cr_assert_eq(sim_time(g, NULL, &m, &res, err, sizeof(err)), 0, "%s", err);
  /* each rank: send 2000 B and receive 2000 B at once (1 us + 2 us), reduce
   * 2000 B (4 us), then the allgather message (3 us): 10 us */
  cr_assert_float_eq(res.time, 10e-6, 1e-12, "%g", res.time);
  cr_assert_eq(res.messages, 4);
  cr_assert_eq(res.max_sent, 4000);
  /* across hosts: 10 + 20 us per message */
  int host_of[2] = {0, 1};
  topo_t t = {.nranks = 2, .nhosts = 2, .host_of = host_of};
  cr_assert_eq(sim_time(g, &t, &m, &res, err, sizeof(err)), 0, "%s", err);
  cr_assert_float_eq(res.time, 2 * 30e-6 + 4e-6, 1e-12, "%g", res.time);
  cr_assert_eq(res.max_sent_inter, 4000);
  cr_assert_eq(res.max_sent_intra, 0);
  cr_assert_eq(res.hlink_bytes, 4000);
  /* the graph is reusable: its dependency counts were put back */
  cr_assert_eq(sim_time(g, &t, &m, &res, err, sizeof(err)), 0, "%s", err);
  cr_assert_float_eq(res.time, 64e-6, 1e-12);
  sim_graph_free(g);
}

/* One rank's link is a bottleneck: a linear gather's root receives n-1
 * messages one at a time. */
Test(scale, sim_time_models_link_contention) {
  const algo_desc_t *d = algo_find(COLL_GATHER, "linear");
  cr_assert_not_null(d);
  algo_args_t a = {.coll = COLL_GATHER,
                   .nranks = 9,
                   .count = 250,
                   .dtype = CHORUS_FLOAT32,
                   .op = CHORUS_SUM,
                   .chunk_bytes = 1 << 20};
  sim_graph_t *g;
  sim_model_t m = {.alpha = {1e-6, 1e-6}, .beta = {1e-9, 1e-9}, .gamma = 0, .copy_beta = 0};
  sim_time_result_t res;
  char err[256];
  cr_assert_eq(sim_graph_build(d, &a, &g, err, sizeof(err)), 0, "%s", err);
  cr_assert_eq(sim_time(g, NULL, &m, &res, err, sizeof(err)), 0, "%s", err);
  /* 8 messages of 1000 B into the root, 2 us each, one after another */
  cr_assert_float_eq(res.time, 16e-6, 1e-12, "%g", res.time);
  cr_assert_eq(res.messages, 8);
  cr_assert_eq(res.last_rank, 0);
  sim_graph_free(g);
}

/* A cycle stops the clock with the same code as sim_exec. */
Test(scale, sim_time_reports_a_cycle) {
  plan_t *p[2];
  for (int r = 0; r < 2; r++) {
    plan_builder_t b;
    cr_assert_eq(plan_build_begin(&b, "cycle", r, 2, 1, CHORUS_INT32, CHORUS_SUM, false), 0);
    plan_step_t rcv = {.kind = STEP_RECV, .peer = 1 - r, .msg = 0, .bytes = 4};
    plan_step_t snd = {.kind = STEP_SEND, .peer = 1 - r, .msg = 0, .bytes = 4};
    uint32_t i = plan_add(&b, &rcv), j = plan_add(&b, &snd);
    plan_dep(&b, i, j);
    cr_assert_eq(plan_build_end(&b, &p[r]), 0);
  }
  sim_graph_t *g;
  sim_model_t m;
  sim_time_result_t res;
  char err[512];
  sim_model_default(&m);
  cr_assert_eq(sim_graph_from_plans(p, 2, &g, err, sizeof(err)), 0, "%s", err);
  cr_assert_eq(sim_time(g, NULL, &m, &res, err, sizeof(err)), -EDEADLK);
  cr_assert(strstr(err, "stuck: rank 0 step 0 (RECV of message 0 from rank 1) never runs"), "%s",
            err);
  sim_graph_free(g);
  plan_free(p[0]);
  plan_free(p[1]);
}
