/*
 * test_split.c - chorus_comm_split between processes and in one process:
 * groups by color ordered by (key, rank), CHORUS_SPLIT_NONE, children and
 * parent running allreduce at the same time, a split of a split, the
 * children's transports chosen by their own (emulated) hosts, destroy in
 * any order, and bad arguments.
 */
#define _GNU_SOURCE /* CPU_COUNT */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "chorus.h"
#include "comm.h"
#include "mp.h"

TestSuite(split, .timeout = 240);

#define FAIL(...)                                                                                  \
  do {                                                                                             \
    fprintf(stderr, __VA_ARGS__);                                                                  \
    return 1;                                                                                      \
  } while (0)

/* Allreduce of count int32 SUM (out of place) on c, checked for c's ranks. */
static int check_allreduce(chorus_comm_t *c, size_t count, const char *what) {
  int rank, size;
  chorus_comm_rank(c, &rank);
  chorus_comm_size(c, &size);
  int32_t *in = malloc(count * 4 + 4), *out = malloc(count * 4 + 4);
  chk_fill(in, count, CHORUS_INT32, CHORUS_SUM, rank);
  chorus_result rc = chorus_allreduce(c, in, out, count, CHORUS_INT32, CHORUS_SUM);
  int bad = rc != CHORUS_SUCCESS;
  if (bad)
    fprintf(stderr, "%s rank %d: %s: %s\n", what, rank, chorus_strerror(rc),
            chorus_comm_last_error(c));
  else
    bad = chk_verify(out, count, CHORUS_INT32, CHORUS_SUM, size, rank, what) != 0;
  free(in);
  free(out);
  return bad;
}

static int expect_shape(chorus_comm_t *c, int rank, int size, const char *what) {
  int r = -1, s = -1;
  if (!c)
    FAIL("%s: no communicator\n", what);
  if (chorus_comm_rank(c, &r) || chorus_comm_size(c, &s) || r != rank || s != size)
    FAIL("%s: rank %d of %d, want %d of %d\n", what, r, s, rank, size);
  return 0;
}

/* ---- the scenarios, written once for processes and threads ---- */

typedef int (*scenario_fn)(chorus_comm_t *world, int rank, int size);

/* 8 ranks: 2 groups by parity, key = rank; 4 groups of 2 with key = -rank
 * (order reversed); a NONE color. */
static int scn_colors_and_keys(chorus_comm_t *w, int rank, int size) {
  chorus_comm_t *a, *b, *n;
  chorus_result rc;

  if ((rc = chorus_comm_split(w, rank % 2, rank, &a)))
    FAIL("rank %d: split by parity: %s: %s\n", rank, chorus_strerror(rc),
         chorus_comm_last_error(w));
  if (expect_shape(a, rank / 2, size / 2, "parity"))
    return 1;
  if ((rc = chorus_comm_split(w, rank / 2, -rank, &b)))
    FAIL("rank %d: split by pairs: %s\n", rank, chorus_comm_last_error(w));
  if (expect_shape(b, 1 - rank % 2, 2, "pairs, reversed"))
    return 1;
  int color = rank == 0 || rank == 3 ? CHORUS_SPLIT_NONE : 5;
  n = (chorus_comm_t *)0x1;
  if ((rc = chorus_comm_split(w, color, 0, &n)))
    FAIL("rank %d: split with NONE: %s\n", rank, chorus_comm_last_error(w));
  if (color == CHORUS_SPLIT_NONE && n != NULL)
    FAIL("rank %d: NONE gave a communicator\n", rank);
  if (color != CHORUS_SPLIT_NONE && expect_shape(n, rank - (rank > 3 ? 2 : 1), size - 2, "none"))
    return 1;
  int bad = check_allreduce(a, 4099, "parity") | check_allreduce(b, 17, "pairs") |
            (n ? check_allreduce(n, 1000, "none") : 0) | check_allreduce(w, 333, "world");
  bad |= chorus_comm_destroy(a) != CHORUS_SUCCESS;
  bad |= chorus_comm_destroy(b) != CHORUS_SUCCESS;
  if (n)
    bad |= chorus_comm_destroy(n) != CHORUS_SUCCESS;
  return bad;
}

/* Two children and the parent with allreduces in flight at once. */
static int scn_concurrent(chorus_comm_t *w, int rank, int size) {
  enum { COUNT = 200000 };
  chorus_comm_t *a, *b;
  int32_t *buf[3], ra, rb;
  chorus_request_t *req[3];
  int bad = 0;

  if (chorus_comm_split(w, rank % 2, 0, &a) || chorus_comm_split(w, rank / 4, 0, &b))
    FAIL("rank %d: split: %s\n", rank, chorus_comm_last_error(w));
  chorus_comm_rank(a, &ra);
  chorus_comm_rank(b, &rb);
  chorus_comm_t *cs[3] = {a, b, w};
  int rk[3] = {ra, rb, rank}, sz[3] = {size / 2, size / 2, size};
  for (int round = 0; round < 3 && !bad; round++) {
    for (int i = 0; i < 3; i++) {
      buf[i] = malloc(COUNT * 4);
      chk_fill(buf[i], COUNT, CHORUS_INT32, CHORUS_SUM, rk[i]);
    }
    /* started in a different order on every rank: they must not interfere */
    for (int k = 0; k < 3; k++) {
      int i = (k + rank) % 3;
      chorus_result rc =
          chorus_iallreduce(cs[i], buf[i], buf[i], COUNT, CHORUS_INT32, CHORUS_SUM, &req[i]);
      if (rc)
        FAIL("rank %d: iallreduce on comm %d: %s\n", rank, i, chorus_strerror(rc));
    }
    for (int i = 2; i >= 0; i--) {
      chorus_result rc = chorus_wait(&req[i]);
      if (rc) {
        fprintf(stderr, "rank %d: comm %d: %s\n", rank, i, chorus_comm_last_error(cs[i]));
        bad = 1;
      } else if (chk_verify(buf[i], COUNT, CHORUS_INT32, CHORUS_SUM, sz[i], rk[i], "concurrent")) {
        bad = 1;
      }
    }
    for (int i = 0; i < 3; i++)
      free(buf[i]);
  }
  /* children destroyed after... the parent is destroyed by the caller */
  bad |= chorus_comm_destroy(b) != CHORUS_SUCCESS;
  bad |= chorus_comm_destroy(a) != CHORUS_SUCCESS;
  return bad;
}

/* The allgather children use in place of a bootstrap (xgather.c), over
 * several rounds: contributions of 0 to 4500 bytes. */
static int xport_allgather(chorus_comm_t *c) {
  int rank = c->rank, size = c->size, bad = 0;
  size_t len = (size_t)rank * 1500;
  uint8_t *mine = malloc(len + 1);
  void **ptrs;
  size_t *lens;

  for (size_t i = 0; i < len; i++)
    mine[i] = (uint8_t)(rank * 31 + i);
  chorus_result rc = comm_xport_allgather(c, NULL, mine, len, &ptrs, &lens);
  free(mine);
  if (rc)
    FAIL("rank %d: transport allgather: %s\n", rank, chorus_comm_last_error(c));
  for (int p = 0; p < size && !bad; p++) {
    if (lens[p] != (size_t)p * 1500) {
      fprintf(stderr, "rank %d: %zu bytes from %d\n", rank, lens[p], p);
      bad = 1;
    }
    for (size_t i = 0; i < lens[p] && !bad; i++)
      if (((uint8_t *)ptrs[p])[i] != (uint8_t)(p * 31 + i)) {
        fprintf(stderr, "rank %d: byte %zu from %d wrong\n", rank, i, p);
        bad = 1;
      }
  }
  free(ptrs);
  free(lens);
  return bad;
}

/* A split of a split, and its communicators outliving their parents. */
static int scn_nested(chorus_comm_t *w, int rank, int size, chorus_comm_t **keep) {
  chorus_comm_t *a, *g;
  int ra;

  if (chorus_comm_split(w, rank % 2, rank, &a))
    FAIL("rank %d: split: %s\n", rank, chorus_comm_last_error(w));
  chorus_comm_rank(a, &ra);
  /* 4 ranks of a: 2 groups of 2, key reversing */
  if (chorus_comm_split(a, ra / 2, -ra, &g))
    FAIL("rank %d: split of a split: %s\n", rank, chorus_comm_last_error(a));
  if (expect_shape(g, 1 - ra % 2, 2, "grandchild"))
    return 1;
  int bad = check_allreduce(g, 5000, "grandchild") | check_allreduce(a, 5000, "child");
  bad |= xport_allgather(a);
  /* the child goes first; the grandchild outlives it and the world */
  bad |= chorus_comm_destroy(a) != CHORUS_SUCCESS;
  bad |= check_allreduce(g, 77, "grandchild after its parent");
  *keep = g;
  return bad;
}

/* Bad arguments are refused without touching anything. */
static int scn_arguments(chorus_comm_t *w, int rank, int size) {
  chorus_comm_t *n = (chorus_comm_t *)0x1;
  if (chorus_comm_split(w, 0, 0, NULL) != CHORUS_ERR_INVALID_ARG ||
      !strstr(chorus_comm_last_error(w), "newcomm is NULL"))
    FAIL("NULL newcomm: %s\n", chorus_comm_last_error(w));
  if (chorus_comm_split(w, -2, 0, &n) != CHORUS_ERR_INVALID_ARG ||
      !strstr(chorus_comm_last_error(w), "color -2"))
    FAIL("color -2: %s\n", chorus_comm_last_error(w));
  if (n != NULL)
    FAIL("color -2: *newcomm not cleared\n");
  if (chorus_comm_split(NULL, 0, 0, &n) != CHORUS_ERR_INVALID_COMM)
    FAIL("NULL comm accepted\n");
  return 0;
}

/* ---- between processes ---- */

typedef struct mp_arg {
  scenario_fn fn;
  int nested;
  int destroy_parent_first;
} mp_arg_t;

static int mp_rank(int rank, int size, const char *addr, void *p) {
  mp_arg_t *a = p;
  chorus_comm_t *w, *keep = NULL;
  chorus_result rc = chorus_comm_init(&w, rank, size, addr);
  if (rc)
    FAIL("rank %d: init: %s\n", rank, chorus_last_error());
  int bad = a->nested ? scn_nested(w, rank, size, &keep) : a->fn(w, rank, size);
  if ((rc = chorus_comm_destroy(w)))
    FAIL("rank %d: destroy: %s\n", rank, chorus_last_error());
  if (keep) {
    bad |= check_allreduce(keep, 999, "grandchild after the world");
    bad |= chorus_comm_destroy(keep) != CHORUS_SUCCESS;
  }
  return bad;
}

static void run_mp(mp_arg_t *a, int n, const char *topo) {
  const char *env[] = {"CHORUS_CONNECT_TIMEOUT=60", topo, NULL};
  mp_result_t r = mp_run(n, mp_rank, a, 200, env);
  cr_assert_eq(r.timed_out, 0, "timed out");
  cr_assert_eq(r.failed, 0, "%d rank(s) failed", r.failed);
}

Test(split, colors_keys_and_none) {
  run_mp(&(mp_arg_t){.fn = scn_colors_and_keys}, 8, NULL);
}

Test(split, children_and_parent_in_flight_together) {
  run_mp(&(mp_arg_t){.fn = scn_concurrent}, 8, NULL);
}

Test(split, split_of_a_split_outlives_its_parents) {
  run_mp(&(mp_arg_t){.nested = 1}, 8, NULL);
}

Test(split, bad_arguments) {
  char addr[64];
  chorus_comm_t *w, *c;
  snprintf(addr, sizeof(addr), "127.0.0.1:%d", mp_free_port());
  cr_assert_eq(chorus_comm_init(&w, 0, 1, addr), CHORUS_SUCCESS, "%s", chorus_last_error());
  cr_assert_eq(scn_arguments(w, 0, 1), 0);
  /* one rank: a child of one */
  cr_assert_eq(chorus_comm_split(w, 3, 0, &c), CHORUS_SUCCESS, "%s", chorus_comm_last_error(w));
  cr_assert_eq(expect_shape(c, 0, 1, "solo child"), 0);
  cr_assert_eq(check_allreduce(c, 10, "solo child"), 0);
  cr_assert_eq(chorus_comm_destroy(w), CHORUS_SUCCESS);
  /* a destroyed parent */
  chorus_comm_t *n = (chorus_comm_t *)0x1;
  cr_assert_eq(chorus_comm_split(w, 0, 0, &n), CHORUS_ERR_INVALID_COMM);
  cr_assert(strstr(chorus_last_error(), "not a live communicator"), "%s", chorus_last_error());
  cr_assert_eq(chorus_comm_destroy(c), CHORUS_SUCCESS);
}

/* bcast from the last rank, allgather and barrier, checked exactly. */
static int other_collectives(chorus_comm_t *c, int rank, int size, const char *what) {
  enum { BN = 100000, GN = 1000 };
  int32_t *b = malloc(BN * sizeof(int32_t)), *g = malloc((size_t)size * GN * sizeof(int32_t));
  int32_t mine[GN];
  int bad = 0, root = size - 1;
  chorus_result rc;

  for (int i = 0; i < BN; i++)
    b[i] = rank == root ? i * 3 + root : -1;
  for (int i = 0; i < GN; i++)
    mine[i] = rank * GN + i;
  if ((rc = chorus_bcast(c, b, b, BN, CHORUS_INT32, root)) ||
      (rc = chorus_allgather(c, mine, g, GN, CHORUS_INT32)) || (rc = chorus_barrier(c))) {
    fprintf(stderr, "%s rank %d: %s: %s\n", what, rank, chorus_strerror(rc),
            chorus_comm_last_error(c));
    bad = 1;
  }
  for (int i = 0; i < BN && !bad; i++)
    if (b[i] != i * 3 + root) {
      fprintf(stderr, "%s rank %d: bcast element %d is %d\n", what, rank, i, (int)b[i]);
      bad = 1;
    }
  for (int i = 0; i < size * GN && !bad; i++)
    if (g[i] != i) {
      fprintf(stderr, "%s rank %d: allgather element %d is %d\n", what, rank, i, (int)g[i]);
      bad = 1;
    }
  free(b);
  free(g);
  return bad;
}

/* Children over emulated hosts take the transport their hosts call for. */
static int topo_rank(int rank, int size, const char *addr, void *p) {
  chorus_comm_t *w, *across, *inside, *mixed;
  chorus_result rc = chorus_comm_init(&w, rank, size, addr);
  if (rc)
    FAIL("rank %d: init: %s\n", rank, chorus_last_error());
  /* hosts=2x4: ranks 0-3 on host 0, 4-7 on host 1 */
  if (chorus_comm_split(w, rank % 4, 0, &across) || chorus_comm_split(w, rank / 4, 0, &inside) ||
      chorus_comm_split(w, rank % 2, 0, &mixed))
    FAIL("rank %d: split: %s\n", rank, chorus_comm_last_error(w));
  int bad = 0;
  const char *want[3] = {"sock", "shm", "shm+sock"};
  chorus_comm_t *cs[3] = {across, inside, mixed};
  for (int i = 0; i < 3; i++) {
    if (strcmp(chorus_comm_provider(cs[i]), want[i])) {
      fprintf(stderr, "rank %d: child %d over %s, want %s\n", rank, i, chorus_comm_provider(cs[i]),
              want[i]);
      bad = 1;
    }
    bad |= check_allreduce(cs[i], 30000, want[i]);
    int r, s;
    chorus_comm_rank(cs[i], &r);
    chorus_comm_size(cs[i], &s);
    bad |= other_collectives(cs[i], r, s, want[i]);
  }
  if (mixed->topo->nhosts != 2 || inside->topo->nhosts != 1 || across->topo->nhosts != 2)
    FAIL("rank %d: child topologies %d %d %d hosts\n", rank, across->topo->nhosts,
         inside->topo->nhosts, mixed->topo->nhosts);
  prov_multi_stats_t st;
  if (prov_multi_stats(mixed->prov, &st) || st.child_nranks[0] != 2 || st.sends[1] == 0)
    FAIL("rank %d: mixed child: shm for %d ranks, %llu sends between hosts\n", rank,
         st.child_nranks[0], (unsigned long long)st.sends[1]);
  /* parent first, then the children */
  bad |= chorus_comm_destroy(w) != CHORUS_SUCCESS;
  for (int i = 0; i < 3; i++)
    bad |= chorus_comm_destroy(cs[i]) != CHORUS_SUCCESS;
  return bad;
}

Test(split, children_choose_transports_by_their_hosts) {
  const char *env[] = {"CHORUS_CONNECT_TIMEOUT=60", "CHORUS_TOPO=hosts=2x4", NULL};
  mp_result_t r = mp_run(8, topo_rank, NULL, 200, env);
  cr_assert_eq(r.timed_out, 0, "timed out");
  cr_assert_eq(r.failed, 0, "%d rank(s) failed", r.failed);
}

/* ---- in one process ---- */

typedef struct th_arg {
  eng_local_job_t *job;
  mp_arg_t *a;
  int rank, size, failed;
} th_arg_t;

static void *th_rank(void *p) {
  th_arg_t *t = p;
  chorus_comm_t *w, *keep = NULL;

  if (eng_comm_init_local(t->job, t->rank, &w)) {
    fprintf(stderr, "rank %d: init: %s\n", t->rank, chorus_last_error());
    t->failed = 1;
    return NULL;
  }
  t->failed = t->a->nested ? scn_nested(w, t->rank, t->size, &keep) : t->a->fn(w, t->rank, t->size);
  t->failed |= chorus_comm_destroy(w) != CHORUS_SUCCESS;
  if (keep) {
    t->failed |= check_allreduce(keep, 999, "grandchild after the world");
    t->failed |= chorus_comm_destroy(keep) != CHORUS_SUCCESS;
  }
  return NULL;
}

static void run_threads(mp_arg_t *a, int n) {
  eng_local_job_t *job = eng_local_job_create(n);
  pthread_t th[8];
  th_arg_t t[8];
  cr_assert_not_null(job);
  for (int r = 0; r < n; r++) {
    t[r] = (th_arg_t){.job = job, .a = a, .rank = r, .size = n};
    cr_assert_eq(pthread_create(&th[r], NULL, th_rank, &t[r]), 0);
  }
  int failed = 0;
  for (int r = 0; r < n; r++) {
    pthread_join(th[r], NULL);
    failed += t[r].failed;
  }
  eng_local_job_destroy(job);
  cr_assert_eq(failed, 0, "%d of %d ranks failed", failed, n);
}

Test(split, in_process_colors_keys_and_none) {
  run_threads(&(mp_arg_t){.fn = scn_colors_and_keys}, 8);
}

Test(split, in_process_concurrent) {
  run_threads(&(mp_arg_t){.fn = scn_concurrent}, 8);
}

Test(split, in_process_nested) {
  run_threads(&(mp_arg_t){.nested = 1}, 8);
}

/* A child's ranks are numbered afresh, but its own core (CHORUS_SPREAD_CORES)
 * is the process's: in reverse order, rank 1 is the child's first rank and
 * would otherwise take rank 0's core. */
static int home_rank(int rank, int size, const char *addr, void *p) {
  (void)p;
  chorus_comm_t *w, *c;
  if (chorus_comm_init(&w, rank, size, addr))
    FAIL("rank %d: init: %s\n", rank, chorus_last_error());
  if (chorus_comm_split(w, 0, -rank, &c))
    FAIL("rank %d: split: %s\n", rank, chorus_comm_last_error(w));
  int bad = expect_shape(c, size - 1 - rank, size, "reversed");
  if (w->home_cpu < 0) {
    fprintf(stderr, "rank %d of %d: no core of its own\n", rank, size);
    bad = 1;
  }
  if (c->home_cpu != w->home_cpu) {
    fprintf(stderr, "rank %d: the child's own core is %d, the world's %d\n", rank, c->home_cpu,
            w->home_cpu);
    bad = 1;
  }
  bad |= check_allreduce(c, 64, "reversed");
  bad |= chorus_comm_destroy(c) != CHORUS_SUCCESS;
  bad |= chorus_comm_destroy(w) != CHORUS_SUCCESS;
  return bad;
}

Test(split, children_keep_the_process_core) {
  cpu_set_t set;
  cr_assert_eq(sched_getaffinity(0, sizeof(set), &set), 0);
  if (CPU_COUNT(&set) < 2)
    cr_skip_test("one CPU: no ranks with cores of their own");
  const char *env[] = {"CHORUS_CONNECT_TIMEOUT=60", NULL};
  mp_result_t r = mp_run(2, home_rank, NULL, 60, env);
  cr_assert_eq(r.timed_out, 0, "timed out");
  cr_assert_eq(r.failed, 0, "%d rank(s) failed", r.failed);
}

/* Many splits and destroys: no growth in descriptors. */
static int cycle_rank(int rank, int size, const char *addr, void *p) {
  chorus_comm_t *w, *c;
  if (chorus_comm_init(&w, rank, size, addr))
    FAIL("rank %d: init: %s\n", rank, chorus_last_error());
  int fds0 = -1, bad = 0;
  for (int i = 0; i < 30 && !bad; i++) {
    if (chorus_comm_split(w, rank % 2, i % 2 ? rank : -rank, &c))
      FAIL("rank %d: split %d: %s\n", rank, i, chorus_comm_last_error(w));
    bad |= check_allreduce(c, 64, "cycle");
    bad |= chorus_comm_destroy(c) != CHORUS_SUCCESS;
    if (i == 4)
      fds0 = mp_count_fds();
  }
  int fds1 = mp_count_fds();
  if (fds1 > fds0)
    FAIL("rank %d: %d fds after 5 cycles, %d after 30\n", rank, fds0, fds1);
  bad |= chorus_comm_destroy(w) != CHORUS_SUCCESS;
  return bad;
}

Test(split, repeated_split_and_destroy_leaks_nothing) {
  const char *env[] = {"CHORUS_CONNECT_TIMEOUT=60", NULL};
  mp_result_t r = mp_run(4, cycle_rank, NULL, 200, env);
  cr_assert_eq(r.timed_out, 0, "timed out");
  cr_assert_eq(r.failed, 0, "%d rank(s) failed", r.failed);
}
