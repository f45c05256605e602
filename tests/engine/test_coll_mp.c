/*
 * Every collective x every algorithm between processes over real libfabric
 * providers (shm, tcp, and the sock transport) at 1..9 and 16 ranks, one job per (provider, ranks)
 * looping over a smaller dtype/op/count set than the in-process test; plus
 * the fused allreduce, point to point (grouped rings, crossed pairs,
 * ordered messages around a collective) and collectives of every kind in
 * flight at once. Ranks sleep rather than spin (CHORUS_SPIN_US=0): 16
 * processes share 2 cores.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "coll_check.h"
#include "mp.h"

static const cc_dtop_t zero[] = {{CHORUS_FLOAT32, CHORUS_SUM}};
static const cc_dtop_t one_red[] = {{CHORUS_INT8, CHORUS_SUM}, {CHORUS_FLOAT16, CHORUS_PROD}};
static const cc_dtop_t one_plain[] = {{CHORUS_INT8, CHORUS_SUM}, {CHORUS_FLOAT64, CHORUS_SUM}};
static const cc_dtop_t prime_red[] = {{CHORUS_FLOAT32, CHORUS_AVG}, {CHORUS_INT64, CHORUS_MAX}};
static const cc_dtop_t prime_plain[] = {{CHORUS_FLOAT16, CHORUS_SUM}, {CHORUS_INT32, CHORUS_SUM}};
static const cc_dtop_t big[] = {{CHORUS_BFLOAT16, CHORUS_SUM}};
static const cc_level_t levels[] = {
    {0, zero, 1, zero, 1},
    {1, one_red, 2, one_plain, 2},
    {1009, prime_red, 2, prime_plain, 2},
    {65537, big, 1, big, 1},
};

static int rank_main(int rank, int size, const char *addr, void *arg) {
  const bool hier = arg != NULL;
  chorus_comm_t *c;
  chorus_result rc = chorus_comm_init(&c, rank, size, addr);
  int bad = 0;

  if (rc) {
    fprintf(stderr, "rank %d: init: %s: %s\n", rank, chorus_strerror(rc), chorus_last_error());
    return 1;
  }
  cc_sweep_t sw = {
      .levels = levels, .nlevels = 4, .all_roots_upto = 3, .other_roots = 1, .hier_only = hier};
  bad += cc_sweep(c, rank, size, &sw);
  if (!hier) {
    static const size_t counts[] = {3, 0, 1009, 40000, 1, 255};
    for (int ip = 0; ip < 2; ip++)
      bad += cc_multi(c, rank, size, CHORUS_FLOAT32, CHORUS_SUM, ip, 6, counts, NULL);
    bad += cc_p2p(c, rank, size, 1009, CHORUS_INT32);
    bad += cc_p2p(c, rank, size, 70000, CHORUS_UINT8);
    bad += cc_concurrent(c, rank, size, 1009);
  }
  rc = chorus_comm_destroy(c);
  if (rc) {
    fprintf(stderr, "rank %d: destroy: %s: %s\n", rank, chorus_strerror(rc), chorus_last_error());
    bad++;
  }
  if (bad)
    fprintf(stderr, "rank %d of %d: %d failures\n", rank, size, bad);
  return bad ? 1 : 0;
}

static void run_env(const char *prov, int n, const char *topo, const char *chunk,
                    const char *extra) {
  char penv[64], tenv[64], cenv[64];
  snprintf(penv, sizeof(penv), "CHORUS_PROVIDER=%s", prov);
  snprintf(tenv, sizeof(tenv), "CHORUS_TOPO=%s", topo ? topo : "");
  snprintf(cenv, sizeof(cenv), "CHORUS_CHUNK_BYTES=%s", chunk);
  const char *envs[] = {prov[0] ? penv : "CHORUS_PROVIDER=",
                        tenv,
                        "CHORUS_CONNECT_TIMEOUT=60",
                        "CHORUS_SPIN_US=0",
                        cenv,
                        extra,
                        NULL};
  mp_result_t r = mp_run(n, rank_main, topo ? (void *)topo : NULL, 280, envs);
  cr_assert_eq(r.timed_out, 0, "%s at %d ranks: timed out", prov, n);
  cr_assert_eq(r.failed, 0, "%s at %d ranks: %d rank(s) failed", prov, n, r.failed);
}

static void run_chunk(const char *prov, int n, const char *topo, const char *chunk) {
  run_env(prov, n, topo, chunk, NULL);
}

static void run(const char *prov, int n, const char *topo) {
  run_chunk(prov, n, topo, "16K");
}

TestSuite(coll_mp, .timeout = 300);

#define JOB(prov, n)                                                                               \
  Test(coll_mp, prov##_##n) {                                                                      \
    run(#prov, n, NULL);                                                                           \
  }
JOB(shm, 1)
JOB(shm, 2)
JOB(shm, 3)
JOB(shm, 4)
JOB(shm, 5)
JOB(shm, 6)
JOB(shm, 7)
JOB(shm, 8)
JOB(shm, 9)
JOB(shm, 16)
JOB(tcp, 1)
JOB(tcp, 2)
JOB(tcp, 3)
JOB(tcp, 4)
JOB(tcp, 5)
JOB(tcp, 6)
JOB(tcp, 7)
JOB(tcp, 8)
JOB(tcp, 9)
JOB(tcp, 16)
JOB(sock, 1)
JOB(sock, 2)
JOB(sock, 3)
JOB(sock, 4)
JOB(sock, 5)
JOB(sock, 6)
JOB(sock, 7)
JOB(sock, 8)
JOB(sock, 9)
JOB(sock, 16)

/* sock with its default chunks: messages past its eager limit (64 KiB) go
 * by rendezvous inside the collectives too. */
Test(coll_mp, sock_3_large_chunks) {
  run_chunk("sock", 3, NULL, "256K");
}

/* A posting budget of one operation a direction: past it only each pair's
 * oldest message goes (exec.c). Every algorithm, fused and grouped calls,
 * point to point and collectives in flight at once must still complete;
 * with 16 (CHORUS_MAX_POSTED) the ring, rhd and dbtree allreduces hung at 4
 * ranks in 16 KiB chunks before pairs were posted in order. */
Test(coll_mp, shm_4_one_in_flight) {
  run_env("shm", 4, NULL, "16K", "CHORUS_MAX_POSTED=1");
}
Test(coll_mp, tcp_3_one_in_flight) {
  run_env("tcp", 3, NULL, "16K", "CHORUS_MAX_POSTED=1");
}

/* Hierarchical algorithms over emulated hosts: shm inside, tcp between. */
Test(coll_mp, hier_2x2) {
  run("", 4, "hosts=2x2");
}
Test(coll_mp, hier_uneven) {
  run("", 5, "map=0,1,0,1,1");
}
Test(coll_mp, hier_2x2_sock) {
  run("shm+sock", 4, "hosts=2x2");
}

/* Fan-in of small messages: 16 ranks each send the root 32 chunks of 4 KiB
 * a call, calls back to back. Senders ran calls ahead of the root, filled
 * its shm receive queue with messages it had not asked for yet, and the
 * job hung at the second call (prov_ofi.c, "the window"). */
enum { FAN_COUNT = 32768, FAN_CALLS = 6 };

static int32_t fan_value(int rank, int call, size_t i) {
  return (int32_t)(rank * 1000003 + call * 7919 + (int)i);
}

static int fan_in_main(int rank, int size, const char *addr, void *arg) {
  chorus_comm_t *c;
  chorus_result rc = chorus_comm_init(&c, rank, size, addr);
  int32_t *send = malloc(FAN_COUNT * sizeof(*send));
  int32_t *recv = rank == 0 ? malloc((size_t)size * FAN_COUNT * sizeof(*recv)) : NULL;
  int bad = 0;

  (void)arg;
  if (rc || !send || (rank == 0 && !recv)) {
    fprintf(stderr, "rank %d: init: %s: %s\n", rank, chorus_strerror(rc), chorus_last_error());
    return 1;
  }
  for (int call = 0; call < FAN_CALLS && !bad; call++) {
    for (size_t i = 0; i < FAN_COUNT; i++)
      send[i] = fan_value(rank, call, i);
    rc = chorus_gather(c, send, recv, FAN_COUNT, CHORUS_INT32, 0);
    if (rc) {
      fprintf(stderr, "rank %d: gather %d: %s: %s\n", rank, call, chorus_strerror(rc),
              chorus_last_error());
      bad++;
    }
    for (int r = 0; rank == 0 && r < size && !bad; r++)
      for (size_t i = 0; i < FAN_COUNT; i++)
        if (recv[(size_t)r * FAN_COUNT + i] != fan_value(r, call, i)) {
          fprintf(stderr, "gather %d: element %zu of rank %d wrong\n", call, i, r);
          bad++;
          break;
        }
  }
  rc = chorus_comm_destroy(c);
  free(send);
  free(recv);
  return bad || rc ? 1 : 0;
}

Test(coll_mp, shm_16_fan_in_small_chunks) {
  const char *envs[] = {"CHORUS_PROVIDER=shm", "CHORUS_ALGO=gather=linear", "CHORUS_CHUNK_BYTES=4K",
                        "CHORUS_SPIN_US=0", NULL};
  mp_result_t r = mp_run(16, fan_in_main, NULL, 120, envs);
  cr_assert_eq(r.timed_out, 0, "16-rank linear gather in 4 KiB chunks: timed out");
  cr_assert_eq(r.failed, 0, "%d rank(s) failed", r.failed);
}

/* Allreduces cut into more chunks than a rank may keep posted (256): a
 * rank's posted sends were all first-half sends its peer could not take
 * yet, queued ahead of the second half's, and the peer's posted receives
 * all second-half receives: both waited for good (2 ranks, 256 MiB in 256
 * KiB chunks, by the ring, rhd and dbtree; algo_pace in algos.h). Pacing
 * was not enough for dbtree and rhd at 4 ranks in 16 KiB chunks; posting
 * each pair's messages in order, and a pair's oldest past the budget
 * (exec.c), is. Here 16 MiB in place in 16 KiB chunks, checked. */
enum { BIG_COUNT = 4 << 20 };

static int big_allreduce_main(int rank, int size, const char *addr, void *arg) {
  chorus_comm_t *c;
  chorus_result rc = chorus_comm_init(&c, rank, size, addr);
  int32_t *v = malloc(BIG_COUNT * sizeof(*v));
  int bad = 0;

  (void)arg;
  if (rc || !v) {
    fprintf(stderr, "rank %d: init: %s: %s\n", rank, chorus_strerror(rc), chorus_last_error());
    return 1;
  }
  for (int call = 0; call < 2 && !bad; call++) {
    for (size_t i = 0; i < BIG_COUNT; i++)
      v[i] = (int32_t)((size_t)rank * 7 + (size_t)call + i % 1000);
    rc = chorus_allreduce(c, v, v, BIG_COUNT, CHORUS_INT32, CHORUS_SUM);
    if (rc) {
      fprintf(stderr, "rank %d: allreduce: %s: %s\n", rank, chorus_strerror(rc),
              chorus_last_error());
      bad++;
    }
    for (size_t i = 0; i < BIG_COUNT && !bad; i++) {
      int32_t want = (int32_t)(7 * size * (size - 1) / 2 + size * (call + (int)(i % 1000)));
      if (v[i] != want) {
        fprintf(stderr, "rank %d: element %zu: %d, not %d\n", rank, i, v[i], want);
        bad++;
      }
    }
  }
  rc = chorus_comm_destroy(c);
  free(v);
  return bad || rc ? 1 : 0;
}

static void run_big_allreduce(const char *algo, int n) {
  char aenv[64];
  snprintf(aenv, sizeof(aenv), "CHORUS_ALGO=allreduce=%s", algo);
  const char *envs[] = {"CHORUS_PROVIDER=shm", aenv, "CHORUS_CHUNK_BYTES=16K", "CHORUS_SPIN_US=0",
                        NULL};
  mp_result_t r = mp_run(n, big_allreduce_main, NULL, 120, envs);
  cr_assert_eq(r.timed_out, 0, "%s at %d ranks: timed out", algo, n);
  cr_assert_eq(r.failed, 0, "%s at %d ranks: %d rank(s) failed", algo, n, r.failed);
}

Test(coll_mp, allreduce_chunks_past_max_posted) {
  run_big_allreduce("ring", 2);
  run_big_allreduce("dbtree", 4);
  run_big_allreduce("rhd", 4);
}
