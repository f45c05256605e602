/*
 * test_topo.c - host topology: CHORUS_TOPO parsing, topologies from host
 * identities, and jobs over emulated hosts, where ranks of one host talk
 * over shm and ranks of different hosts over sock or libfabric's tcp
 * (prov_multi): allreduce results bitwise right, and the bytes between hosts
 * counted on the network side; default chunk sizes.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "check.h"
#include "chorus.h"
#include "comm.h"
#include "mp.h"
#include "prov.h"
#include "topo.h"

TestSuite(topo, .timeout = 240);

/* ---- parsing ---- */

static void parse_ok(const char *spec, int n, const int *want) {
  int labels[64];
  char err[256] = "";

  cr_assert_eq(topo_parse(spec, n, labels, err, sizeof(err)), 0, "%s: %s", spec, err);
  for (int r = 0; r < n; r++)
    cr_assert_eq(labels[r], want[r], "%s: rank %d on %d, want %d", spec, r, labels[r], want[r]);
}

static void parse_bad(const char *spec, int n, const char *needle) {
  int labels[64];
  char err[256] = "";

  cr_assert_eq(topo_parse(spec, n, labels, err, sizeof(err)), -1, "%s accepted", spec);
  cr_assert(strstr(err, "CHORUS_TOPO"), "%s: message does not name the variable: %s", spec, err);
  cr_assert(strstr(err, needle), "%s: message \"%s\" lacks \"%s\"", spec, err, needle);
}

Test(topo, parse_good) {
  parse_ok("", 3, (int[]){0, 0, 0});
  parse_ok("hosts=2x2", 4, (int[]){0, 0, 1, 1});
  parse_ok("hosts=3x3", 9, (int[]){0, 0, 0, 1, 1, 1, 2, 2, 2});
  parse_ok("hosts=1x5", 5, (int[]){0, 0, 0, 0, 0});
  parse_ok("hosts=4X1", 4, (int[]){0, 1, 2, 3});
  parse_ok("map=0,0,1,1,2", 5, (int[]){0, 0, 1, 1, 2});
  parse_ok("map=7,3,7", 3, (int[]){7, 3, 7});
}

Test(topo, parse_bad) {
  parse_bad("hosts=2x3", 4, "6 ranks");
  parse_bad("hosts=2x3", 4, "has 4");
  parse_bad("hosts=0x4", 4, "hosts=HxR");
  parse_bad("hosts=2", 2, "hosts=HxR");
  parse_bad("hosts=x2", 2, "hosts=HxR");
  parse_bad("hosts=2x2x", 4, "hosts=HxR");
  parse_bad("hosts=-2x-2", 4, "hosts=HxR");
  parse_bad("hosts=2x 2", 4, "hosts=HxR");
  parse_bad("map=0,1", 3, "maps 2 ranks");
  parse_bad("map=0,1,1,0", 3, "maps 4 ranks");
  parse_bad("map=0,,1", 3, "map=");
  parse_bad("map=0,1,", 2, "map=");
  parse_bad("map=-1,0", 2, "map=");
  parse_bad("map=a,b", 2, "map=");
  parse_bad("map=", 1, "maps 0 ranks");
  parse_bad("rack=2", 2, "unknown form");
}

/* ---- building ---- */

static void expect_hosts(const topo_t *t, int n, int nhosts, const int *want) {
  cr_assert_not_null(t);
  cr_assert_eq(t->nranks, n);
  cr_assert_eq(t->nhosts, nhosts, "%d hosts, want %d", t->nhosts, nhosts);
  for (int r = 0; r < n; r++)
    cr_assert_eq(t->host_of[r], want[r], "rank %d on host %d, want %d", r, t->host_of[r], want[r]);
}

Test(topo, hosts_numbered_by_lowest_rank) {
  topo_t *t = topo_from_labels((int[]){3, 3, 7, 3, 1}, 5);
  expect_hosts(t, 5, 3, (int[]){0, 0, 1, 0, 2});
  cr_assert_eq(topo_host_size(t, 0), 3);
  cr_assert_eq(topo_host_size(t, 1), 1);
  cr_assert(!topo_one_rank_per_host(t));
  char d[64];
  topo_describe(t, d, sizeof(d));
  cr_assert_str_eq(d, "3 hosts: 0 0 1 0 2");
  topo_free(t);
}

Test(topo, from_host_identities) {
  const char *hosts[] = {"b/1", "a/1", "b/1", NULL, "a/1", NULL};
  topo_t *t = topo_from_hosts(hosts, 6);
  /* an unknown identity is a host of its own */
  expect_hosts(t, 6, 4, (int[]){0, 1, 0, 2, 1, 3});
  topo_free(t);
  const char *one[] = {"h", "h", "h"};
  t = topo_from_hosts(one, 3);
  expect_hosts(t, 3, 1, (int[]){0, 0, 0});
  topo_free(t);
}

Test(topo, refine_and_restrict) {
  topo_t *real = topo_from_labels((int[]){0, 0, 0, 0, 1, 1, 1, 1}, 8);
  topo_t *emu = topo_from_labels((int[]){0, 0, 1, 1, 0, 0, 1, 1}, 8);
  topo_t *t = topo_refine(real, emu, 8);
  expect_hosts(t, 8, 4, (int[]){0, 0, 1, 1, 2, 2, 3, 3});
  topo_t *s = topo_sub(t, (int[]){6, 2, 3, 7}, 4);
  expect_hosts(s, 4, 2, (int[]){0, 1, 1, 0});
  topo_t *one = topo_refine(NULL, NULL, 3);
  expect_hosts(one, 3, 1, (int[]){0, 0, 0});
  topo_t *d = topo_dup(t, 8);
  expect_hosts(d, 8, 4, t->host_of);
  topo_free(real);
  topo_free(emu);
  topo_free(t);
  topo_free(s);
  topo_free(one);
  topo_free(d);
}

Test(topo, large_jobs_are_fast) {
  enum { N = 32767 };
  int *labels = malloc(N * sizeof(int));
  for (int r = 0; r < N; r++)
    labels[r] = N - r; /* one host per rank, in reverse */
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  topo_t *t = topo_from_labels(labels, N);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  cr_assert_eq(t->nhosts, N);
  cr_assert(topo_one_rank_per_host(t));
  for (int r = 0; r < N; r++)
    cr_assert_eq(t->host_of[r], r);
  double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  cr_assert_lt(s, 1.0, "%.2f s for %d ranks", s, N);
  topo_free(t);
  free(labels);
}

/* ---- communicators ---- */

Test(topo, in_process_job_honours_chorus_topo) {
  setenv("CHORUS_TOPO", "hosts=1x1", 1);
  eng_local_job_t *job = eng_local_job_create(1);
  chorus_comm_t *c;
  cr_assert_eq(eng_comm_init_local(job, 0, &c), CHORUS_SUCCESS, "%s", chorus_last_error());
  cr_assert_not_null(c->topo);
  cr_assert_eq(c->topo->nhosts, 1);
  cr_assert_str_eq(chorus_comm_provider(c), "inproc");
  cr_assert_eq(chorus_comm_destroy(c), CHORUS_SUCCESS);

  setenv("CHORUS_TOPO", "hosts=2x2", 1);
  chorus_result rc = eng_comm_init_local(job, 0, &c);
  cr_assert_eq(rc, CHORUS_ERR_ENV, "a 2x2 topology for 1 rank: %s", chorus_strerror(rc));
  cr_assert(strstr(chorus_last_error(), "CHORUS_TOPO"), "%s", chorus_last_error());
  cr_assert_null(c);
  eng_local_job_destroy(job);
  unsetenv("CHORUS_TOPO");
}

typedef struct inproc_arg {
  eng_local_job_t *job;
  int rank, size, failed;
  int nhosts, host_of[8];
} inproc_arg_t;

static void *inproc_rank(void *p) {
  inproc_arg_t *a = p;
  chorus_comm_t *c;
  enum { COUNT = 5000 };
  float *buf = malloc(COUNT * sizeof(float));

  if (eng_comm_init_local(a->job, a->rank, &c)) {
    fprintf(stderr, "rank %d: %s\n", a->rank, chorus_last_error());
    a->failed = 1;
    free(buf);
    return NULL;
  }
  a->nhosts = c->topo->nhosts;
  memcpy(a->host_of, c->topo->host_of, (size_t)a->size * sizeof(int));
  chk_fill(buf, COUNT, CHORUS_FLOAT32, CHORUS_SUM, a->rank);
  if (chorus_allreduce(c, buf, buf, COUNT, CHORUS_FLOAT32, CHORUS_SUM) ||
      chk_verify(buf, COUNT, CHORUS_FLOAT32, CHORUS_SUM, a->size, a->rank, "inproc topo"))
    a->failed = 1;
  if (chorus_comm_destroy(c))
    a->failed = 1;
  free(buf);
  return NULL;
}

Test(topo, in_process_allreduce_over_emulated_hosts) {
  enum { N = 6 };
  setenv("CHORUS_TOPO", "map=0,1,0,1,2,2", 1);
  eng_local_job_t *job = eng_local_job_create(N);
  pthread_t th[N];
  inproc_arg_t a[N];
  for (int r = 0; r < N; r++) {
    a[r] = (inproc_arg_t){.job = job, .rank = r, .size = N};
    cr_assert_eq(pthread_create(&th[r], NULL, inproc_rank, &a[r]), 0);
  }
  for (int r = 0; r < N; r++)
    pthread_join(th[r], NULL);
  eng_local_job_destroy(job);
  unsetenv("CHORUS_TOPO");
  for (int r = 0; r < N; r++) {
    cr_assert_eq(a[r].failed, 0, "rank %d failed", r);
    expect_hosts(&(topo_t){.nranks = N, .nhosts = a[r].nhosts, .host_of = a[r].host_of}, N, 3,
                 (int[]){0, 1, 0, 1, 2, 2});
  }
}

/* ---- processes over emulated hosts ---- */

/* What each rank saw, in memory shared with the test (fork keeps it). */
typedef struct rank_report {
  char provider[64];
  int nhosts;
  int host_of[16];
  prov_multi_stats_t st; /* its names point into the rank's memory: */
  char net_name[64];     /* st.child_name[1] */
  int have_stats;
} rank_report_t;

static rank_report_t *reports;

static void reports_map(void) {
  reports =
      mmap(NULL, 64 * sizeof(*reports), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(reports, MAP_FAILED);
  memset(reports, 0, 64 * sizeof(*reports));
}

static int allreduce_case(chorus_comm_t *c, int rank, int n, size_t count, chorus_dtype dt,
                          chorus_op op, int inplace) {
  size_t es = chorus_dtype_size(dt);
  char *in = malloc(count * es + 1), *out = malloc(count * es + 1);
  int bad = 0;

  chk_fill(in, count, dt, op, rank);
  chorus_result rc = chorus_allreduce(c, in, inplace ? in : out, count, dt, op);
  if (rc) {
    fprintf(stderr, "rank %d: allreduce %s/%s %zu: %s: %s\n", rank, chorus_dtype_name(dt),
            chorus_op_name(op), count, chorus_strerror(rc), chorus_comm_last_error(c));
    bad = 1;
  } else if (chk_verify(inplace ? in : out, count, dt, op, n, rank, "emulated hosts")) {
    bad = 1;
  }
  free(in);
  free(out);
  return bad;
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

static int hosts_rank(int rank, int size, const char *addr, void *arg) {
  chorus_comm_t *c;
  chorus_result rc = chorus_comm_init(&c, rank, size, addr);
  rank_report_t *me = &reports[rank];
  int bad = 0;

  if (rc) {
    fprintf(stderr, "rank %d: init: %s: %s\n", rank, chorus_strerror(rc), chorus_last_error());
    return 1;
  }
  snprintf(me->provider, sizeof(me->provider), "%s", chorus_comm_provider(c));
  me->nhosts = c->topo->nhosts;
  memcpy(me->host_of, c->topo->host_of, (size_t)size * sizeof(int));
  static const size_t counts[] = {1, 1000, 65537};
  for (int dt = 0; dt < CHORUS_DTYPE_COUNT && !bad; dt += 3)
    for (size_t k = 0; k < 3 && !bad; k++)
      bad |= allreduce_case(c, rank, size, counts[k], (chorus_dtype)dt, CHORUS_SUM, (int)k & 1);
  if (!bad)
    bad |= allreduce_case(c, rank, size, 1u << 20, CHORUS_FLOAT32, CHORUS_SUM, 1);
  if (!bad)
    bad |= allreduce_case(c, rank, size, 3001, CHORUS_BFLOAT16, CHORUS_MAX, 0);
  if (!bad)
    bad |= other_collectives(c, rank, size, "emulated hosts");
  if (prov_multi_stats(c->prov, &me->st) == 0) {
    me->have_stats = 1;
    snprintf(me->net_name, sizeof(me->net_name), "%s",
             me->st.child_name[1] ? me->st.child_name[1] : "(none)");
    for (int p = 0; p < size; p++)
      if (p != rank &&
          prov_multi_route(c->prov, p) != (c->topo->host_of[p] == c->topo->host_of[rank] ? 0 : 1)) {
        fprintf(stderr, "rank %d: peer %d routed over child %d\n", rank, p,
                prov_multi_route(c->prov, p));
        bad = 1;
      }
  }
  rc = chorus_comm_destroy(c);
  if (rc) {
    fprintf(stderr, "rank %d: destroy: %s\n", rank, chorus_last_error());
    bad = 1;
  }
  return bad;
}

/* Runs n ranks under CHORUS_TOPO=spec, between hosts over `net` ("sock",
 * the default, or "tcp": CHORUS_PROVIDER=shm+tcp); checks what every rank
 * reported. */
static void run_hosts(const char *spec, int n, int nhosts, const int *host_of, const char *net) {
  char topo[128], prov[96], want_prov[64];
  snprintf(topo, sizeof(topo), "CHORUS_TOPO=%s", spec);
  snprintf(want_prov, sizeof(want_prov), "shm+%s", net);
  snprintf(prov, sizeof(prov), "CHORUS_PROVIDER=%s", want_prov);
  bool dflt = strcmp(net, "sock") == 0;
  const char *want_net = dflt ? "sock" : "tcp;ofi_rxm";
  const char *env[] = {topo, "CHORUS_CONNECT_TIMEOUT=60", dflt ? NULL : prov, NULL};

  reports_map();
  mp_result_t r = mp_run(n, hosts_rank, NULL, 180, env);
  cr_assert_eq(r.timed_out, 0, "%s: timed out", spec);
  cr_assert_eq(r.failed, 0, "%s: %d rank(s) failed", spec, r.failed);
  uint64_t inter = 0, intra = 0;
  for (int i = 0; i < n; i++) {
    rank_report_t *me = &reports[i];
    cr_assert_str_eq(me->provider, want_prov, "rank %d", i);
    cr_assert_eq(me->nhosts, nhosts);
    for (int p = 0; p < n; p++)
      cr_assert_eq(me->host_of[p], host_of[p], "rank %d sees rank %d on host %d", i, p,
                   me->host_of[p]);
    cr_assert(me->have_stats);
    cr_assert_str_eq(me->net_name, want_net);
    int local = 0;
    for (int p = 0; p < n; p++)
      local += host_of[p] == host_of[i];
    /* shm is opened for the ranks of the host only: it can not carry
     * anything to another host, so what crossed went over the network */
    cr_assert_eq(me->st.child_nranks[0], local > 1 ? local : 0, "rank %d", i);
    inter += me->st.send_bytes[1];
    intra += me->st.send_bytes[0];
  }
  cr_assert_gt(inter, 0, "%s: nothing crossed between hosts over %s", spec, net);
  cr_assert_gt(intra, 0, "%s: nothing moved inside a host over shm", spec);
  cr_log_info("%s: %llu bytes over %s, %llu over shm", spec, (unsigned long long)inter, net,
              (unsigned long long)intra);
  munmap(reports, 64 * sizeof(*reports));
}

Test(topo, hosts_2x2_over_shm_and_sock) {
  run_hosts("hosts=2x2", 4, 2, (int[]){0, 0, 1, 1}, "sock");
}

Test(topo, hosts_2x2_over_shm_and_libfabric_tcp) {
  run_hosts("hosts=2x2", 4, 2, (int[]){0, 0, 1, 1}, "tcp");
}

Test(topo, hosts_3x3_over_shm_and_sock) {
  run_hosts("hosts=3x3", 9, 3, (int[]){0, 0, 0, 1, 1, 1, 2, 2, 2}, "sock");
}

Test(topo, interleaved_map_over_shm_and_sock) {
  run_hosts("map=0,1,0,1,2", 5, 3, (int[]){0, 1, 0, 1, 2}, "sock");
}

static int provider_rank(int rank, int size, const char *addr, void *arg) {
  chorus_comm_t *c;
  chorus_result rc = chorus_comm_init(&c, rank, size, addr);

  if (rc) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    return 1;
  }
  int bad = strcmp(chorus_comm_provider(c), (const char *)arg) != 0;
  if (bad)
    fprintf(stderr, "rank %d: provider %s, want %s\n", rank, chorus_comm_provider(c),
            (const char *)arg);
  bad |= allreduce_case(c, rank, size, 10000, CHORUS_INT32, CHORUS_SUM, 0);
  bad |= chorus_comm_destroy(c) != CHORUS_SUCCESS;
  return bad;
}

/* CHORUS_PROVIDER still forces one provider for everything; hosts of one
 * rank each need no shm; one host needs no network. */
Test(topo, provider_choice) {
  const char *forced[] = {"CHORUS_TOPO=hosts=2x2", "CHORUS_PROVIDER=tcp", NULL};
  mp_result_t r = mp_run(4, provider_rank, "tcp;ofi_rxm", 120, forced);
  cr_assert_eq(r.failed, 0, "forced tcp");
  const char *spread[] = {"CHORUS_TOPO=hosts=3x1", NULL};
  r = mp_run(3, provider_rank, "sock", 120, spread);
  cr_assert_eq(r.failed, 0, "one rank per host");
  const char *one[] = {"CHORUS_TOPO=hosts=1x3", NULL};
  r = mp_run(3, provider_rank, "shm", 120, one);
  cr_assert_eq(r.failed, 0, "one host");
}

/* An allgather of blocks of 5 MiB and 12 bytes (over sock in chunks of an
 * eighth of that, rounded up to 64 bytes: the last one shorter), checked. */
static int large_allgather(chorus_comm_t *c, int rank, int size) {
  const size_t n = (5u << 20) / 4 + 3;
  int32_t *mine = malloc(n * sizeof(int32_t)), *all = malloc((size_t)size * n * sizeof(int32_t));
  int bad = !mine || !all;
  for (size_t i = 0; i < n && !bad; i++)
    mine[i] = (int32_t)(rank * 7919 + (int)(i % 100003));
  chorus_result rc = bad ? CHORUS_ERR_NO_MEMORY : chorus_allgather(c, mine, all, n, CHORUS_INT32);
  if (rc) {
    fprintf(stderr, "rank %d: allgather of 5 MiB blocks: %s\n", rank, chorus_comm_last_error(c));
    bad = 1;
  }
  for (int r = 0; r < size && !bad; r++)
    for (size_t i = 0; i < n && !bad; i++)
      if (all[(size_t)r * n + i] != (int32_t)(r * 7919 + (int)(i % 100003))) {
        fprintf(stderr, "rank %d: allgather block %d element %zu is %d\n", rank, r, i,
                (int)all[(size_t)r * n + i]);
        bad = 1;
      }
  free(mine);
  free(all);
  return bad;
}

/* arg: "CHUNK BCAST_CHUNK ALLGATHER_CHUNK ALLGATHER_32M" the communicator
 * should pick; the last is the chunk of an allgather of 32 MiB blocks (that
 * of 1 MiB blocks is ALLGATHER_CHUNK) */
static int chunk_rank(int rank, int size, const char *addr, void *arg) {
  chorus_comm_t *c;
  size_t want, want_bcast, want_ag, want_ag32;

  if (sscanf((const char *)arg, "%zu %zu %zu %zu", &want, &want_bcast, &want_ag, &want_ag32) != 4)
    return 1;
  if (chorus_comm_init(&c, rank, size, addr)) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    return 1;
  }
  size_t ag1 = coll_call_chunk(c, COLL_ALLGATHER, 1u << 20);
  size_t ag32 = coll_call_chunk(c, COLL_ALLGATHER, 32u << 20);
  int bad = c->chunk_bytes != want || c->bcast_chunk_bytes != want_bcast ||
            c->allgather_chunk_bytes != want_ag || ag1 != want_ag || ag32 != want_ag32 ||
            coll_call_chunk(c, COLL_BCAST, 32u << 20) != want_bcast ||
            coll_call_chunk(c, COLL_ALLREDUCE, 32u << 20) != want;
  /* where they grow, a block that does not divide takes 8 chunks too, of whole lines */
  const size_t odd = (5u << 20) + 12, ag_odd = coll_call_chunk(c, COLL_ALLGATHER, odd);
  if (want_ag32 > want_ag && (ag_odd * 8 < odd || ag_odd % 64 || ag_odd * 7 >= odd)) {
    fprintf(stderr, "rank %d: allgather of %zu-byte blocks in chunks of %zu\n", rank, odd, ag_odd);
    bad = 1;
  }
  if (bad)
    fprintf(stderr,
            "rank %d over %s: chunks %zu, bcast %zu, allgather %zu (1 MiB blocks %zu, 32 MiB "
            "%zu); want %zu, %zu, %zu, %zu\n",
            rank, chorus_comm_provider(c), c->chunk_bytes, c->bcast_chunk_bytes,
            c->allgather_chunk_bytes, ag1, ag32, want, want_bcast, want_ag, want_ag32);
  bad |= allreduce_case(c, rank, size, 300000, CHORUS_INT32, CHORUS_SUM, 0);
  bad |= large_allgather(c, rank, size);
  bad |= chorus_comm_destroy(c) != CHORUS_SUCCESS;
  return bad;
}

/* chunk_rank with every rank on CPU 0: two ranks share one core */
static int chunk_rank_one_core(int rank, int size, const char *addr, void *arg) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  if (sched_setaffinity(0, sizeof(set), &set)) {
    perror("sched_setaffinity");
    return 1;
  }
  return chunk_rank(rank, size, addr, arg);
}

/* Default chunks by transport: 256 KiB over shm, broadcasts in 4 MiB over
 * libfabric's tcp, and 512 KiB for everything over sock (a rendezvous a chunk),
 * where an allgather's grow to an eighth of its block;
 * a CHORUS_CHUNK_BYTES the user set is kept for everything. Ranks that
 * share a core take chunks larger by ranks per core, and broadcasts 4 MiB.
 * Two ranks over shm take 4 MiB chunks for everything (nothing forwarded,
 * nothing to overlap); more ranks than cores give allgathers 4 MiB too. */
Test(topo, chunk_defaults_by_transport) {
  const char *shm[] = {"CHORUS_PROVIDER=shm", NULL};
  const char *shm_set[] = {"CHORUS_PROVIDER=shm", "CHORUS_CHUNK_BYTES=128K", NULL};
  const char *tcp[] = {"CHORUS_PROVIDER=tcp", NULL};
  const char *sock[] = {"CHORUS_PROVIDER=sock", NULL};
  const char *sock_set[] = {"CHORUS_PROVIDER=sock", "CHORUS_CHUNK_BYTES=128K", NULL};
  mp_result_t r = mp_run(2, chunk_rank, "4194304 4194304 4194304 4194304", 120, shm);
  cr_assert_eq(r.failed, 0, "shm");
  r = mp_run(2, chunk_rank, "131072 131072 131072 131072", 120, shm_set);
  cr_assert_eq(r.failed, 0, "shm, chunk set");
  r = mp_run(2, chunk_rank, "262144 4194304 262144 262144", 120, tcp);
  cr_assert_eq(r.failed, 0, "tcp");
  r = mp_run(2, chunk_rank, "524288 524288 524288 4194304", 120, sock);
  cr_assert_eq(r.failed, 0, "sock");
  r = mp_run(2, chunk_rank, "131072 131072 131072 131072", 120, sock_set);
  cr_assert_eq(r.failed, 0, "sock, chunk set");
  r = mp_run(2, chunk_rank_one_core, "4194304 4194304 4194304 4194304", 120, shm);
  cr_assert_eq(r.failed, 0, "shm, two ranks on one core");
  r = mp_run(3, chunk_rank_one_core, "786432 4194304 4194304 4194304", 120, shm);
  cr_assert_eq(r.failed, 0, "shm, three ranks on one core");
  r = mp_run(3, chunk_rank_one_core, "131072 131072 131072 131072", 120, shm_set);
  cr_assert_eq(r.failed, 0, "shm, three ranks on one core, chunk set");
}

/* Where ranks share a host, sock's connections between them take
 * CHORUS_SOCK_SNDBUF (the kernel doubles it), whether sock
 * carries everything or only what crosses emulated hosts (CHORUS_TOPO: the
 * "hosts" are this machine, so every connection is inside it); 0 leaves
 * the kernel's autotuning. arg: whether the connections must have it. */
static int sndbuf_rank(int rank, int size, const char *addr, void *arg) {
  bool want = arg != NULL;
  chorus_comm_t *c;
  prov_sock_stats_t st;
  prov_t *sock;
  int bad, most;

  if (chorus_comm_init(&c, rank, size, addr)) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    return 1;
  }
  bad = allreduce_case(c, rank, size, 1 << 20, CHORUS_FLOAT32, CHORUS_SUM, 0);
  /* shm+sock: its child between hosts */
  sock = prov_multi_child(c->prov, 1);
  if (!sock)
    sock = c->prov;
  most = 2 * (int)c->set.sock_sndbuf;
  if (prov_sock_stats(sock, &st)) {
    fprintf(stderr, "rank %d: %s carries nothing over sock\n", rank, chorus_comm_provider(c));
    bad = 1;
  } else if (st.host_conns < 1 || st.sndbuf_set != (want ? st.host_conns : 0) ||
             st.sndbuf_max <= 0 || (want && st.sndbuf_max > most)) {
    fprintf(stderr,
            "rank %d over %s: %u connections inside the host, %u given the send buffer (want "
            "%s), largest %d bytes\n",
            rank, chorus_comm_provider(c), st.host_conns, st.sndbuf_set, want ? "all" : "none",
            st.sndbuf_max);
    bad = 1;
  }
  bad |= chorus_comm_destroy(c) != CHORUS_SUCCESS;
  return bad;
}

Test(topo, sock_inside_a_host_takes_a_small_send_buffer) {
  const char *sock[] = {"CHORUS_PROVIDER=sock", NULL};
  const char *sock_off[] = {"CHORUS_PROVIDER=sock", "CHORUS_SOCK_SNDBUF=0", NULL};
  const char *hosts[] = {"CHORUS_TOPO=hosts=2x2", NULL};
  mp_result_t r = mp_run(2, sndbuf_rank, "on", 120, sock);
  cr_assert_eq(r.failed, 0, "sock");
  r = mp_run(2, sndbuf_rank, NULL, 120, sock_off);
  cr_assert_eq(r.failed, 0, "sock, CHORUS_SOCK_SNDBUF=0");
  r = mp_run(4, sndbuf_rank, "on", 120, hosts);
  cr_assert_eq(r.failed, 0, "shm+sock between two emulated hosts of two ranks");
}

static int bad_topo_rank(int rank, int size, const char *addr, void *arg) {
  chorus_comm_t *c = NULL;
  /* every rank its own view: rank 0 two hosts, rank 1 one */
  setenv("CHORUS_TOPO", rank == 0 ? "hosts=2x1" : "hosts=1x2", 1);
  chorus_result rc = chorus_comm_init(&c, rank, size, addr);
  if (rc != CHORUS_ERR_ENV || c) {
    fprintf(stderr, "rank %d: init returned %s, want CHORUS_ERR_ENV\n", rank, chorus_strerror(rc));
    if (c)
      chorus_comm_destroy(c);
    return 1;
  }
  if (!strstr(chorus_last_error(), "CHORUS_TOPO")) {
    fprintf(stderr, "rank %d: message lacks CHORUS_TOPO: %s\n", rank, chorus_last_error());
    return 1;
  }
  return 0;
}

Test(topo, ranks_that_disagree_are_refused) {
  const char *env[] = {"CHORUS_CONNECT_TIMEOUT=20", NULL};
  mp_result_t r = mp_run(2, bad_topo_rank, NULL, 60, env);
  cr_assert_eq(r.timed_out, 0);
  cr_assert_eq(r.failed, 0);
}

static int size_mismatch_rank(int rank, int size, const char *addr, void *arg) {
  chorus_comm_t *c = NULL;
  chorus_result rc = chorus_comm_init(&c, rank, size, addr);
  if (rc != CHORUS_ERR_ENV || c) {
    fprintf(stderr, "rank %d: init returned %s, want CHORUS_ERR_ENV\n", rank, chorus_strerror(rc));
    return 1;
  }
  if (!strstr(chorus_last_error(), "CHORUS_TOPO") || !strstr(chorus_last_error(), "6 ranks")) {
    fprintf(stderr, "rank %d: unclear message: %s\n", rank, chorus_last_error());
    return 1;
  }
  return 0;
}

Test(topo, topology_of_the_wrong_size_is_refused) {
  const char *env[] = {"CHORUS_TOPO=hosts=2x3", "CHORUS_CONNECT_TIMEOUT=20", NULL};
  mp_result_t r = mp_run(2, size_mismatch_rank, NULL, 60, env);
  cr_assert_eq(r.timed_out, 0);
  cr_assert_eq(r.failed, 0);
}
