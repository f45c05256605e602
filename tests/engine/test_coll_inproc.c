/*
 * Every collective with every algorithm registered for it, every rank a
 * thread of this process over prov_inproc: dtypes x ops x counts {0, 1,
 * prime, large} x in place or not x roots, at 1..9 and 16 ranks, against
 * exact references (coll_check.h). Hierarchical algorithms run under an
 * emulated topology (CHORUS_TOPO); the fused allreduce, point to point and
 * concurrent nonblocking collectives of every kind too.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "coll_check.h"

typedef struct job_arg {
  eng_local_job_t *job;
  int rank, size;
  bool hier; /* a topology is set: hierarchical algorithms only */
  int failed;
} job_arg_t;

#define BIG 20011
#define ROW(dt)                                                                                    \
  {dt, CHORUS_SUM}, {dt, CHORUS_PROD}, {dt, CHORUS_MIN}, {dt, CHORUS_MAX}, {                       \
    dt, CHORUS_AVG                                                                                 \
  }
/* count 1: every dtype x op */
static const cc_dtop_t all_pairs[] __attribute__((unused)) = {
    ROW(CHORUS_INT8),    ROW(CHORUS_UINT8),    ROW(CHORUS_INT32),   ROW(CHORUS_INT64),
    ROW(CHORUS_FLOAT16), ROW(CHORUS_BFLOAT16), ROW(CHORUS_FLOAT32), ROW(CHORUS_FLOAT64),
};
#undef ROW
static const cc_dtop_t all_dtypes[] = {{CHORUS_INT8, CHORUS_SUM},    {CHORUS_UINT8, CHORUS_SUM},
                                       {CHORUS_INT32, CHORUS_SUM},   {CHORUS_INT64, CHORUS_SUM},
                                       {CHORUS_FLOAT16, CHORUS_SUM}, {CHORUS_BFLOAT16, CHORUS_SUM},
                                       {CHORUS_FLOAT32, CHORUS_SUM}, {CHORUS_FLOAT64, CHORUS_SUM}};
/* the prime count: every dtype and every op, not every pair */
static const cc_dtop_t some_pairs[] = {{CHORUS_FLOAT32, CHORUS_SUM},  {CHORUS_INT8, CHORUS_SUM},
                                       {CHORUS_UINT8, CHORUS_PROD},   {CHORUS_INT32, CHORUS_MIN},
                                       {CHORUS_INT64, CHORUS_MAX},    {CHORUS_FLOAT16, CHORUS_AVG},
                                       {CHORUS_BFLOAT16, CHORUS_SUM}, {CHORUS_FLOAT64, CHORUS_PROD},
                                       {CHORUS_FLOAT32, CHORUS_AVG},  {CHORUS_INT32, CHORUS_AVG}};
/* the large count: every element size */
static const cc_dtop_t big_pairs[] = {{CHORUS_FLOAT32, CHORUS_SUM},
                                      {CHORUS_BFLOAT16, CHORUS_AVG},
                                      {CHORUS_INT64, CHORUS_MAX},
                                      {CHORUS_UINT8, CHORUS_MIN}};
static const cc_dtop_t zero_pairs[] = {{CHORUS_FLOAT32, CHORUS_SUM}};
#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))
static const cc_level_t levels[] = {
    {0, zero_pairs, 1, zero_pairs, 1},
#ifdef __SANITIZE_ADDRESS__
    /* ten times slower: every dtype and every op, not every pair */
    {1, some_pairs, N(some_pairs), all_dtypes, N(all_dtypes)},
#else
    {1, all_pairs, N(all_pairs), all_dtypes, N(all_dtypes)},
#endif
    {97, some_pairs, N(some_pairs), big_pairs, N(big_pairs)},
    {BIG, big_pairs, N(big_pairs), big_pairs, 2},
};

static void *rank_main(void *p) {
  job_arg_t *a = p;
  chorus_comm_t *c;

  if (eng_comm_init_local(a->job, a->rank, &c)) {
    fprintf(stderr, "rank %d: init: %s\n", a->rank, chorus_last_error());
    a->failed = 1;
    return NULL;
  }
  if (a->hier && (!c->topo || c->topo->nhosts < 2)) {
    fprintf(stderr, "rank %d: CHORUS_TOPO gave no topology\n", a->rank);
    a->failed = 1;
  }
  cc_sweep_t sw = {.levels = levels,
                   .nlevels = N(levels),
                   .all_roots_upto = a->size <= 9 ? 5 : 0,
                   .other_roots = 2,
                   .inplace_pairs = 4,
                   .hier_only = a->hier};
  a->failed += cc_sweep(c, a->rank, a->size, &sw);
  a->failed += cc_multi_sweep(c, a->rank, a->size, a->hier);
  if (!a->hier) {
    a->failed += cc_p2p(c, a->rank, a->size, 1, CHORUS_INT8);
    a->failed += cc_p2p(c, a->rank, a->size, BIG, CHORUS_FLOAT64);
    a->failed += cc_concurrent(c, a->rank, a->size, 4099);
  }
  if (chorus_comm_destroy(c)) {
    fprintf(stderr, "rank %d: destroy: %s\n", a->rank, chorus_last_error());
    a->failed++;
  }
  return NULL;
}

static void run_job(int n, bool hier) {
  eng_local_job_t *job = eng_local_job_create(n);
  pthread_t th[16];
  job_arg_t args[16];

  cr_assert_not_null(job);
  for (int r = 0; r < n; r++) {
    args[r] = (job_arg_t){.job = job, .rank = r, .size = n, .hier = hier};
    cr_assert_eq(pthread_create(&th[r], NULL, rank_main, &args[r]), 0);
  }
  int failed = 0;
  for (int r = 0; r < n; r++) {
    pthread_join(th[r], NULL);
    failed += args[r].failed;
  }
  eng_local_job_destroy(job);
  cr_assert_eq(failed, 0, "%d failures over %d ranks", failed, n);
}

static void common_env(void) {
  /* small chunks: many pipelined chunks per block even at small counts */
  setenv("CHORUS_CHUNK_BYTES", "2048", 1);
  setenv("CHORUS_SPIN_US", "0", 1);
  setenv("CHORUS_VERIFY", "1", 1);
}

TestSuite(coll_inproc, .timeout = 240);

ParameterizedTestParameters(coll_inproc, ranks) {
  static int ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16};
  return cr_make_param_array(int, ns, sizeof(ns) / sizeof(ns[0]));
}

ParameterizedTest(int *n, coll_inproc, ranks) {
  common_env();
  unsetenv("CHORUS_TOPO");
  run_job(*n, false);
}

/* Hierarchical algorithms: emulated hosts, even and uneven. */
typedef struct topo_case {
  int n;
  char spec[32];
} topo_case_t;

ParameterizedTestParameters(coll_inproc, topology) {
  static topo_case_t cases[] = {{4, "hosts=2x2"},     {6, "hosts=3x2"},         {8, "hosts=2x4"},
                                {5, "map=0,0,1,1,1"}, {7, "map=1,0,1,2,0,2,2"}, {9, "hosts=3x3"},
                                {16, "hosts=4x4"}};
  return cr_make_param_array(topo_case_t, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(topo_case_t *t, coll_inproc, topology) {
  common_env();
  setenv("CHORUS_TOPO", t->spec, 1);
  run_job(t->n, true);
}
