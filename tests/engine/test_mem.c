/*
 * chorus_mem_alloc: its API, and allreduce over shm reading peers' mapped
 * buffers in place (borrowed receives) or copying out of them, with the
 * results exact whether some, all or none of the ranks use such buffers.
 */
#define _GNU_SOURCE /* sched_setaffinity */
#include <criterion/criterion.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "chorus.h"
#include "comm.h"
#include "mp.h"
#include "prov.h"

Test(mem, bad_input) {
  void *p = (void *)1;
  cr_assert_eq(chorus_mem_alloc(NULL, 64), CHORUS_ERR_INVALID_ARG);
  cr_assert(strstr(chorus_last_error(), "ptr is NULL"), "%s", chorus_last_error());
  cr_assert_eq(chorus_mem_alloc(&p, 0), CHORUS_ERR_INVALID_ARG);
  cr_assert_null(p);
  cr_assert(strstr(chorus_last_error(), "0 bytes"), "%s", chorus_last_error());
  cr_assert_eq(chorus_mem_alloc(&p, SIZE_MAX), CHORUS_ERR_NO_MEMORY);
  cr_assert_null(p);
  int x;
  cr_assert_eq(chorus_mem_free(&x), CHORUS_ERR_INVALID_ARG);
  cr_assert(strstr(chorus_last_error(), "not a buffer from chorus_mem_alloc"), "%s",
            chorus_last_error());
  cr_assert_eq(chorus_mem_free(NULL), CHORUS_SUCCESS);
  cr_assert_eq(chorus_mem_alloc(&p, 100), CHORUS_SUCCESS);
  cr_assert_eq(chorus_mem_free((char *)p + 8), CHORUS_ERR_INVALID_ARG, "inside, not the start");
  cr_assert_eq(chorus_mem_free(p), CHORUS_SUCCESS);
  cr_assert_eq(chorus_mem_free(p), CHORUS_ERR_INVALID_ARG, "freed twice");
}

Test(mem, many_regions_no_fd_growth) {
  enum { N = 40 };
  void *p[N];
  int fds = mp_count_fds();
  for (int round = 0; round < 50; round++) {
    for (int i = 0; i < N; i++) {
      cr_assert_eq(chorus_mem_alloc(&p[i], 1000 + (size_t)i * 4096), CHORUS_SUCCESS);
      memset(p[i], i, 1000 + (size_t)i * 4096);
    }
    for (int i = 0; i < N; i++)
      cr_assert_eq(((unsigned char *)p[i])[999], (unsigned char)i);
    /* free in a scrambled order: the registry stays sorted */
    for (int i = 0; i < N; i++)
      cr_assert_eq(chorus_mem_free(p[(i * 7) % N]), CHORUS_SUCCESS);
  }
  cr_assert_eq(mp_count_fds(), fds, "file descriptors leaked");
}

struct mem_case {
  int registered_mask; /* bit r: rank r uses chorus_mem_alloc */
};

static void *buf_alloc(bool reg, size_t bytes) {
  void *p = NULL;
  if (reg)
    return chorus_mem_alloc(&p, bytes) ? NULL : p;
  return posix_memalign(&p, 64, bytes) ? NULL : p;
}

static void buf_free(bool reg, void *p) {
  if (reg)
    chorus_mem_free(p);
  else
    free(p);
}

static int mem_rank(int rank, int size, const char *addr, void *arg) {
  const struct mem_case *mc = arg;
  bool reg = mc->registered_mask >> rank & 1;
  static const size_t counts[] = {16384, 1000003, 4u << 20};
  chorus_comm_t *c;
  int bad = 0;

  if (chorus_comm_init(&c, rank, size, addr)) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    return 1;
  }
  for (size_t k = 0; k < 3 && !bad; k++)
    for (int inplace = 0; inplace < 2 && !bad; inplace++)
      for (int dt = 0; dt < 2 && !bad; dt++) {
        chorus_dtype dtype = dt ? CHORUS_BFLOAT16 : CHORUS_FLOAT32;
        chorus_op op = dt ? CHORUS_AVG : CHORUS_SUM;
        size_t n = counts[k], bytes = n * chorus_dtype_size(dtype);
        void *in = buf_alloc(reg, bytes), *out = inplace ? in : buf_alloc(reg, bytes);
        if (!in || !out) {
          fprintf(stderr, "rank %d: out of memory\n", rank);
          return 1;
        }
        /* twice over the same buffers: the second run reuses the mappings */
        for (int rep = 0; rep < 2 && !bad; rep++) {
          chk_fill(in, n, dtype, op, rank);
          if (!inplace)
            memset(out, 0xA5, bytes);
          chorus_result rc = chorus_allreduce(c, in, out, n, dtype, op);
          if (rc) {
            fprintf(stderr, "rank %d: allreduce: %s\n", rank, chorus_comm_last_error(c));
            bad = 1;
          } else if (chk_verify(out, n, dtype, op, size, rank, reg ? "registered" : "malloc")) {
            bad = 1;
          }
        }
        if (!inplace)
          buf_free(reg, out);
        buf_free(reg, in);
      }
  /* Which path the data took: a rank reads its left neighbour's memory. */
  prov_ofi_rndv_stats_t st;
  if (!bad && size > 1 && prov_ofi_rndv_stats(c->prov, &st) == 0) {
    bool left_reg = mc->registered_mask >> ((rank + size - 1) % size) & 1;
    if (left_reg && (st.borrowed_bytes == 0 || st.mapped_bytes == 0 || st.cma_bytes != 0)) {
      fprintf(stderr,
              "rank %d: peer's buffers are mappable but borrowed %llu mapped %llu cma %llu\n", rank,
              (unsigned long long)st.borrowed_bytes, (unsigned long long)st.mapped_bytes,
              (unsigned long long)st.cma_bytes);
      bad = 1;
    }
    /* plain memory: chunks come through the peer's bounce region (by CMA
     * when every bounce slot is taken), never from its own buffers */
    if (!left_reg && (st.borrowed_bytes || st.mapped_bytes || st.bounce_bytes == 0)) {
      fprintf(stderr,
              "rank %d: peer's buffers are plain but borrowed %llu mapped %llu cma %llu bounce "
              "%llu\n",
              rank, (unsigned long long)st.borrowed_bytes, (unsigned long long)st.mapped_bytes,
              (unsigned long long)st.cma_bytes, (unsigned long long)st.bounce_bytes);
      bad = 1;
    }
  }
  if (chorus_comm_destroy(c))
    bad = 1;
  return bad;
}

/* CHORUS_SHM_STAGE=0: each rank's own buffers, whatever the cores (with 3
 * ranks on 2 cores plain memory would be staged; see the staging tests) */
static void run(int n, int mask) {
  struct mem_case mc = {mask};
  const char *envs[] = {"CHORUS_PROVIDER=shm", "CHORUS_SHM_STAGE=0", NULL};
  mp_result_t r = mp_run(n, mem_rank, &mc, 240, envs);
  cr_assert_eq(r.timed_out, 0, "%d ranks, mask %#x: timed out", n, mask);
  cr_assert_eq(r.failed, 0, "%d ranks, mask %#x: %d rank(s) failed", n, mask, r.failed);
}

/* Rank 0 sends bytes of value v from buf to rank 1, which receives them into
 * buf, checks them and reads its transport's counts after into *st. Returns
 * 0, or 1 after a message. */
static int send_one(chorus_comm_t *c, int rank, unsigned char *buf, size_t bytes, unsigned char v,
                    prov_ofi_rndv_stats_t *st) {
  memset(buf, rank ? 0 : v, bytes);
  chorus_result rc = rank ? chorus_recv(c, buf, bytes, CHORUS_UINT8, 0)
                          : chorus_send(c, buf, bytes, CHORUS_UINT8, 1);
  if (rc) {
    fprintf(stderr, "rank %d: %zu B: %s\n", rank, bytes, chorus_comm_last_error(c));
    return 1;
  }
  for (size_t i = 0; rank && i < bytes; i++)
    if (buf[i] != v) {
      fprintf(stderr, "rank 1: %zu B: byte %zu is %u\n", bytes, i, buf[i]);
      return 1;
    }
  if (rank && prov_ofi_rndv_stats(c->prov, st)) {
    fprintf(stderr, "rank 1: not an ofi endpoint\n");
    return 1;
  }
  return 0;
}

/* Plain memory over shm: messages up to CHORUS_SHM_BOUNCE (64 KiB by
 * default) go through the sender's bounce slots, larger ones by one CMA
 * copy from the sender's buffer (comm.c: shm_bounce). Rank 0 sends, rank 1
 * receives and checks which path each size took. */
static int bounce_rank(int rank, int size, const char *addr, void *arg) {
  (void)arg;
  static const size_t sizes[] = {32 << 10, 64 << 10, 128 << 10};
  chorus_comm_t *c;
  int bad = 0;
  unsigned char *buf = malloc(128 << 10);
  if (!buf || chorus_comm_init(&c, rank, size, addr)) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    free(buf);
    return 1;
  }
  uint64_t last_bounce = 0, last_cma = 0;
  for (size_t k = 0; k < 3 && !bad; k++) {
    prov_ofi_rndv_stats_t st;
    bad = send_one(c, rank, buf, sizes[k], (unsigned char)(k + 1), &st);
    if (bad || rank == 0)
      continue;
    bool bounced = st.bounce_bytes - last_bounce == sizes[k] && st.cma_bytes == last_cma &&
                   st.bounce_marks == k + 1;
    bool cma = st.cma_bytes - last_cma == sizes[k] && st.bounce_bytes == last_bounce;
    if (sizes[k] <= (64 << 10) ? !bounced : !cma) {
      fprintf(stderr, "rank 1: %zu B: bounce %llu -> %llu, cma %llu -> %llu, marks %llu\n",
              sizes[k], (unsigned long long)last_bounce, (unsigned long long)st.bounce_bytes,
              (unsigned long long)last_cma, (unsigned long long)st.cma_bytes,
              (unsigned long long)st.bounce_marks);
      bad = 1;
    }
    last_bounce = st.bounce_bytes;
    last_cma = st.cma_bytes;
  }
  free(buf);
  return chorus_comm_destroy(c) != CHORUS_SUCCESS || bad;
}

Test(mem, plain_memory_bounces_up_to_64_kib) {
  const char *envs[] = {"CHORUS_PROVIDER=shm", "CHORUS_SHM_BOUNCE=", NULL};
  mp_result_t r = mp_run(2, bounce_rank, NULL, 120, envs);
  cr_assert_eq(r.timed_out, 0);
  cr_assert_eq(r.failed, 0, "%d rank(s) failed", r.failed);
}

/* Keeps this process on the first `want` CPUs of its affinity mask (fewer
 * where it has fewer); *shared: fewer than two are left. 0, or 1 after a
 * message. */
static int keep_cpus(int want, bool *shared) {
  cpu_set_t set, keep;
  if (sched_getaffinity(0, sizeof(set), &set)) {
    perror("sched_getaffinity");
    return 1;
  }
  CPU_ZERO(&keep);
  for (int cpu = 0, k = 0; cpu < CPU_SETSIZE && k < want; cpu++)
    if (CPU_ISSET(cpu, &set))
      CPU_SET(cpu, &keep), k++;
  if (sched_setaffinity(0, sizeof(keep), &keep)) {
    perror("sched_setaffinity");
    return 1;
  }
  *shared = CPU_COUNT(&keep) < 2;
  return 0;
}

/* Mapped memory (chorus_mem_alloc) is read where it lies, whatever the
 * size, while ranks have cores of their own; when they outnumber the cores,
 * calls of up to the bounce size are bounced like plain memory's (a sender
 * whose message is read in place waits for the receiver to run; the 8-rank
 * 32 KiB broadcast on 2 cores took 2.7 times as long), larger ones still
 * read in place (coll.c, bounce_call), a 128 KiB allgather's 64 KiB
 * blocks too. arg: "one", both ranks on one CPU, or "two", on two
 * (one: the machine has one). Rank 0 sends from a chorus_mem_alloc buffer,
 * rank 1 receives into plain memory and checks the path each size took. */
static int mapped_bounce_rank(int rank, int size, const char *addr, void *arg) {
  static const size_t sizes[] = {32 << 10, 64 << 10, 128 << 10};
  bool shared;
  if (keep_cpus(strcmp(arg, "one") ? 2 : 1, &shared))
    return 1;
  chorus_comm_t *c;
  unsigned char *buf = NULL;
  int bad = 0;
  if (rank ? !(buf = malloc(128 << 10)) : chorus_mem_alloc((void **)&buf, 128 << 10) != 0) {
    fprintf(stderr, "rank %d: no buffer\n", rank);
    return 1;
  }
  if (chorus_comm_init(&c, rank, size, addr)) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    if (rank)
      free(buf);
    else
      chorus_mem_free(buf);
    return 1;
  }
  prov_ofi_rndv_stats_t last, st;
  if (prov_ofi_rndv_stats(c->prov, &last)) {
    fprintf(stderr, "rank %d: not an ofi endpoint\n", rank);
    bad = 1;
  }
  for (size_t k = 0; k < 3 && !bad; k++) {
    bad = send_one(c, rank, buf, sizes[k], (unsigned char)(k + 1), &st);
    if (bad || rank == 0)
      continue;
    const uint64_t bounced = st.bounce_bytes - last.bounce_bytes,
                   mapped = st.mapped_bytes - last.mapped_bytes,
                   cma = st.cma_bytes - last.cma_bytes;
    const bool want_bounce = shared && sizes[k] <= (64 << 10);
    if (cma || (want_bounce ? bounced != sizes[k] || mapped : mapped != sizes[k] || bounced)) {
      fprintf(stderr,
              "rank 1, %s CPU(s): %zu B: bounced %llu, read in place %llu, cma %llu (wanted %s)\n",
              shared ? "one" : "two", sizes[k], (unsigned long long)bounced,
              (unsigned long long)mapped, (unsigned long long)cma,
              want_bounce ? "bounced" : "in place");
      bad = 1;
    }
    last = st;
  }
  /* a 128 KiB allgather of 64 KiB blocks is past the bounce size as a call:
   * rank 0's mapped block is read in place even on one CPU */
  float *out = malloc(128 << 10);
  if (!bad && out) {
    for (int i = 0; i < 16384; i++)
      ((float *)buf)[i] = (float)(rank * 16384 + i);
    bad = chorus_allgather(c, buf, out, 16384, CHORUS_FLOAT32) != CHORUS_SUCCESS;
    for (int i = 0; !bad && i < 32768; i++)
      bad = out[i] != (float)i;
    if (bad)
      fprintf(stderr, "rank %d: allgather wrong: %s\n", rank, chorus_comm_last_error(c));
    if (!bad && rank == 1 && !prov_ofi_rndv_stats(c->prov, &st) &&
        (st.mapped_bytes - last.mapped_bytes != (64 << 10) ||
         st.bounce_bytes != last.bounce_bytes)) {
      fprintf(stderr, "rank 1: 128 KiB allgather: read in place %llu, bounced %llu\n",
              (unsigned long long)(st.mapped_bytes - last.mapped_bytes),
              (unsigned long long)(st.bounce_bytes - last.bounce_bytes));
      bad = 1;
    }
  }
  bad = bad || !out;
  free(out);
  if (chorus_comm_destroy(c))
    bad = 1;
  if (rank)
    free(buf);
  else
    chorus_mem_free(buf);
  return bad;
}

Test(mem, mapped_memory_bounces_only_when_ranks_outnumber_cores) {
  const char *envs[] = {"CHORUS_PROVIDER=shm", "CHORUS_SHM_BOUNCE=", NULL};
  mp_result_t r = mp_run(2, mapped_bounce_rank, "one", 120, envs);
  cr_assert_eq(r.timed_out, 0, "one CPU: timed out");
  cr_assert_eq(r.failed, 0, "one CPU: %d rank(s) failed", r.failed);
  r = mp_run(2, mapped_bounce_rank, "two", 120, envs);
  cr_assert_eq(r.timed_out, 0, "two CPUs: timed out");
  cr_assert_eq(r.failed, 0, "two CPUs: %d rank(s) failed", r.failed);
}

/* A bounced message is handed back by a mark in the receiver's doorbell
 * page, not an ack message, and the sender takes its slots back from those
 * marks once its free ones ran out: 48 ping-pongs of 32 KiB (three times the
 * 16 slots) all bounce, none falls back to CMA, each is marked, and a slot's
 * messages do not all go to the same place; then 48
 * 2-rank allreduces of 32 KiB, whose receives may lend the slot to the
 * reduction (the mark then waits for the release), stay bounced and exact. */
static int mark_rank(int rank, int size, const char *addr, void *arg) {
  (void)arg;
  enum { ROUNDS = 48, N = 8192, BYTES = N * 4 };
  chorus_comm_t *c;
  int bad = 0;
  float *in = malloc(BYTES), *out = malloc(BYTES);
  unsigned char token = 0;
  prov_ofi_rndv_stats_t st0, st1, st2;

  if (!in || !out || chorus_comm_init(&c, rank, size, addr)) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    free(in);
    free(out);
    return 1;
  }
  if (prov_ofi_rndv_stats(c->prov, &st0)) {
    fprintf(stderr, "rank %d: not an ofi endpoint\n", rank);
    bad = 1;
  }
  for (int r = 0; r < ROUNDS && !bad; r++) {
    for (int i = 0; i < N; i++)
      in[i] = rank ? 0.0f : (float)(r * N + i);
    chorus_result rc =
        rank ? chorus_recv(c, in, N, CHORUS_FLOAT32, 0) : chorus_send(c, in, N, CHORUS_FLOAT32, 1);
    if (!rc)
      rc = rank ? chorus_send(c, &token, 1, CHORUS_UINT8, 0)
                : chorus_recv(c, &token, 1, CHORUS_UINT8, 1);
    if (rc) {
      fprintf(stderr, "rank %d round %d: %s\n", rank, r, chorus_comm_last_error(c));
      bad = 1;
    }
    for (int i = 0; rank && !bad && i < N; i++)
      if (in[i] != (float)(r * N + i)) {
        fprintf(stderr, "rank 1 round %d: element %d is %g\n", r, i, (double)in[i]);
        bad = 1;
      }
  }
  if (!bad && rank == 1 && !prov_ofi_rndv_stats(c->prov, &st1) &&
      (st1.bounce_bytes - st0.bounce_bytes != (uint64_t)ROUNDS * BYTES ||
       st1.cma_bytes != st0.cma_bytes || st1.bounce_marks - st0.bounce_marks != ROUNDS)) {
    fprintf(stderr, "rank 1: %d messages: bounce %llu bytes, cma %llu, marks %llu\n", ROUNDS,
            (unsigned long long)(st1.bounce_bytes - st0.bounce_bytes),
            (unsigned long long)(st1.cma_bytes - st0.cma_bytes),
            (unsigned long long)(st1.bounce_marks - st0.bounce_marks));
    bad = 1;
  }
  /* The region is twice a core's L2 (prov_ofi.c, "Bounce slots"), and a
   * slot's messages move along its share of it: 3 messages a slot reach
   * past the first message's room in the last slot. */
  long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  uint64_t share = st0.bounce_region / 16;
  if (!bad && !prov_ofi_rndv_stats(c->prov, &st1) &&
      ((l2 > 0 && st1.bounce_region < 2 * (uint64_t)l2 && st1.bounce_region < (16u << 20)) ||
       (rank == 1 && share >= 2 * BYTES && st1.bounce_reach <= 15 * share + BYTES))) {
    fprintf(stderr,
            "rank %d: bounce region %llu bytes (L2 %ld), read up to byte %llu of rank 0's\n", rank,
            (unsigned long long)st1.bounce_region, l2, (unsigned long long)st1.bounce_reach);
    bad = 1;
  }
  prov_ofi_rndv_stats(c->prov, &st1);
  for (int r = 0; r < ROUNDS && !bad; r++) {
    for (int i = 0; i < N; i++)
      in[i] = (float)(rank + 1) * (float)(i % 1000 + r);
    if (chorus_allreduce(c, in, out, N, CHORUS_FLOAT32, CHORUS_SUM)) {
      fprintf(stderr, "rank %d allreduce %d: %s\n", rank, r, chorus_comm_last_error(c));
      bad = 1;
    }
    for (int i = 0; !bad && i < N; i++)
      if (out[i] != 3.0f * (float)(i % 1000 + r)) {
        fprintf(stderr, "rank %d allreduce %d: element %d is %g\n", rank, r, i, (double)out[i]);
        bad = 1;
      }
  }
  if (!bad && !prov_ofi_rndv_stats(c->prov, &st2) &&
      (st2.cma_bytes != st1.cma_bytes || st2.bounce_marks - st1.bounce_marks < ROUNDS)) {
    fprintf(stderr, "rank %d: %d allreduces: cma %llu bytes, marks %llu\n", rank, ROUNDS,
            (unsigned long long)(st2.cma_bytes - st1.cma_bytes),
            (unsigned long long)(st2.bounce_marks - st1.bounce_marks));
    bad = 1;
  }
  free(in);
  free(out);
  return chorus_comm_destroy(c) != CHORUS_SUCCESS || bad;
}

Test(mem, bounce_slots_come_back_by_mark) {
  const char *envs[] = {"CHORUS_PROVIDER=shm", "CHORUS_SHM_BOUNCE=", NULL};
  mp_result_t r = mp_run(2, mark_rank, NULL, 120, envs);
  cr_assert_eq(r.timed_out, 0);
  cr_assert_eq(r.failed, 0, "%d rank(s) failed", r.failed);
}

Test(mem, allreduce_all_registered_2) {
  run(2, 0x3);
}
Test(mem, allreduce_all_registered_3) {
  run(3, 0x7);
}
Test(mem, allreduce_some_registered_3) {
  run(3, 0x5);
}
Test(mem, allreduce_none_registered_2) {
  run(2, 0x0);
}

/* Bytes this rank's receives copied between two readings of the
 * transport's counters: by CMA, and out of peers' mappings (mapped or
 * borrowed). */
typedef struct {
  unsigned long long cma, mapped;
} moved_t;

static moved_t moved_since(const prov_ofi_rndv_stats_t *from, const prov_ofi_rndv_stats_t *to) {
  return (moved_t){to->cma_bytes - from->cma_bytes, to->mapped_bytes + to->borrowed_bytes -
                                                        from->mapped_bytes - from->borrowed_bytes};
}

/* Whether m went the one way: all out of mappings, or all by CMA. */
static bool moved_only(moved_t m, bool mapped) {
  return mapped ? m.cma == 0 && m.mapped > 0 : m.cma > 0 && m.mapped == 0;
}

/* Staging (coll.c): with ranks outnumbering the cores, an allgather's own
 * block and a broadcast root's data from plain memory past the bounce slots
 * are sent from the communicator's mappable buffer, so peers read them in
 * place and no byte moves by CMA (allgathers then go direct, broadcasts
 * flat); results exact, in place or not, with the buffer growing, with a
 * second call live meanwhile (it runs on its own buffers, by CMA). An
 * allreduce is never staged: it goes by CMA. Three ranks on CPU 0. arg: the
 * expected path, "staged" or "cma" (CHORUS_SHM_STAGE=0 or too small a
 * limit). */
static int check_allgather(const float *out, size_t blk, int size, int rank, int pass) {
  for (int r = 0; r < size; r++)
    for (size_t i = 0; i < blk; i++)
      if (out[(size_t)r * blk + i] != (float)(r * 100000 + (int)(i % 50000) + pass)) {
        fprintf(stderr, "rank %d: allgather pass %d: block %d [%zu] = %g\n", rank, pass, r, i,
                (double)out[(size_t)r * blk + i]);
        return 1;
      }
  return 0;
}

static int stage_rank(int rank, int size, const char *addr, void *arg) {
  const bool staged = strcmp(arg, "staged") == 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  if (sched_setaffinity(0, sizeof(set), &set)) {
    perror("sched_setaffinity");
    return 1;
  }
  chorus_comm_t *c;
  if (chorus_comm_init(&c, rank, size, addr)) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    return 1;
  }
  int bad = 0;
  /* allreduce: 256 KiB, then 4 MiB, in place or not: never staged */
  prov_ofi_rndv_stats_t none = {0}, st0, st;
  static const size_t counts[] = {65536, 1u << 20};
  for (size_t k = 0; k < 2 && !bad; k++)
    for (int inplace = 0; inplace < 2 && !bad; inplace++) {
      size_t n = counts[k];
      float *in = malloc(n * sizeof(float)), *out = inplace ? in : malloc(n * sizeof(float));
      chk_fill(in, n, CHORUS_FLOAT32, CHORUS_SUM, rank);
      if (!inplace)
        memset(out, 0xA5, n * sizeof(float));
      if (chorus_allreduce(c, in, out, n, CHORUS_FLOAT32, CHORUS_SUM)) {
        fprintf(stderr, "rank %d: allreduce: %s\n", rank, chorus_comm_last_error(c));
        bad = 1;
      } else if (chk_verify(out, n, CHORUS_FLOAT32, CHORUS_SUM, size, rank, "allreduce")) {
        bad = 1;
      }
      if (!inplace)
        free(out);
      free(in);
    }
  prov_ofi_rndv_stats_t ar;
  if (!bad && prov_ofi_rndv_stats(c->prov, &ar) == 0) {
    moved_t m = moved_since(&none, &ar);
    if (!moved_only(m, false)) {
      fprintf(stderr, "rank %d: allreduce: want CMA only: cma %llu mapped+borrowed %llu\n", rank,
              m.cma, m.mapped);
      bad = 1;
    }
  } else if (!bad) {
    fprintf(stderr, "rank %d: not a prov_ofi\n", rank);
    bad = 1;
  }
  /* allgather of 3 x 400 KB (the buffer grows), in place (sendbuf = recvbuf + rank*blk) or
   * not, twice over the same buffers */
  const size_t blk = 100000;
  float *ag = malloc((size_t)size * blk * sizeof(float)), *mine = malloc(blk * sizeof(float));
  for (int pass = 0; pass < 4 && !bad; pass++) {
    bool inplace = pass & 1;
    float *src = inplace ? ag + (size_t)rank * blk : mine;
    memset(ag, 0xA5, (size_t)size * blk * sizeof(float));
    for (size_t i = 0; i < blk; i++)
      src[i] = (float)(rank * 100000 + (int)(i % 50000) + pass);
    if (chorus_allgather(c, src, ag, blk, CHORUS_FLOAT32)) {
      fprintf(stderr, "rank %d: allgather: %s\n", rank, chorus_comm_last_error(c));
      bad = 1;
    } else {
      bad = check_allgather(ag, blk, size, rank, pass);
    }
  }
  /* 3 x 8 MiB: staged, every peer reads the block where it lies, so the
   * model takes the direct allgather; unstaged, blocks past the peer cache
   * cost it one more pass (the ring) */
  const size_t big = 2u << 20;
  float *bg = malloc((size_t)size * big * sizeof(float)), *bm = malloc(big * sizeof(float));
  for (size_t i = 0; i < big; i++)
    bm[i] = (float)(rank * 100000 + (int)(i % 50000) + 7);
  if (!bad && chorus_allgather(c, bm, bg, big, CHORUS_FLOAT32)) {
    fprintf(stderr, "rank %d: allgather 8 MiB: %s\n", rank, chorus_comm_last_error(c));
    bad = 1;
  }
  if (!bad)
    bad = check_allgather(bg, big, size, rank, 7);
  if (!bad && (strcmp(chorus_comm_last_algorithm(c), "direct") == 0) != staged) {
    fprintf(stderr, "rank %d: allgather 3 x 8 MiB by %s\n", rank, chorus_comm_last_algorithm(c));
    bad = 1;
  }
  free(bg), free(bm);

  /* broadcasts of 1 MiB: the root sends from the buffer, in place or not */
  const size_t nb = 1u << 18;
  float *bb = malloc(nb * sizeof(float)), *bs = malloc(nb * sizeof(float));
  for (int root = 0; root < size && !bad; root++) {
    bool inplace = root & 1;
    float *src = inplace ? bb : bs;
    memset(bb, 0xA5, nb * sizeof(float));
    for (size_t i = 0; i < nb && rank == root; i++)
      src[i] = (float)(root * 7 + (int)(i % 1000));
    if (chorus_bcast(c, src, bb, nb, CHORUS_FLOAT32, root)) {
      fprintf(stderr, "rank %d: bcast: %s\n", rank, chorus_comm_last_error(c));
      bad = 1;
    }
    for (size_t i = 0; i < nb && !bad; i++)
      if (bb[i] != (float)(root * 7 + (int)(i % 1000))) {
        fprintf(stderr, "rank %d: bcast from %d: [%zu] = %g\n", rank, root, i, (double)bb[i]);
        bad = 1;
      }
  }
  free(bb), free(bs);

  /* 8 MiB from rank 0, past the peer cache: staged, every receiver reads
   * the root's buffer where it lies, so the model takes the flat broadcast;
   * unstaged, the tree */
  float *b8 = malloc(big * sizeof(float));
  for (size_t i = 0; i < big; i++)
    b8[i] = rank == 0 ? (float)(i % 5000) : -1.0f;
  if (!bad && chorus_bcast(c, b8, b8, big, CHORUS_FLOAT32, 0)) {
    fprintf(stderr, "rank %d: bcast 8 MiB: %s\n", rank, chorus_comm_last_error(c));
    bad = 1;
  }
  for (size_t i = 0; i < big && !bad; i++)
    if (b8[i] != (float)(i % 5000)) {
      fprintf(stderr, "rank %d: bcast 8 MiB: [%zu] = %g\n", rank, i, (double)b8[i]);
      bad = 1;
    }
  if (!bad && (strcmp(chorus_comm_last_algorithm(c), "linear") == 0) != staged) {
    fprintf(stderr, "rank %d: bcast 8 MiB by %s\n", rank, chorus_comm_last_algorithm(c));
    bad = 1;
  }
  free(b8);

  /* which path the allgathers' and broadcasts' data took */
  if (!bad && prov_ofi_rndv_stats(c->prov, &st0) == 0) {
    moved_t m = moved_since(&ar, &st0);
    if (!moved_only(m, staged)) {
      fprintf(stderr, "rank %d: want %s: cma %llu mapped+borrowed %llu\n", rank, (const char *)arg,
              m.cma, m.mapped);
      bad = 1;
    }
  } else if (!bad) {
    fprintf(stderr, "rank %d: not a prov_ofi\n", rank);
    bad = 1;
  }

  /* two nonblocking allgathers live at once: the second runs on its own
   * buffers (by CMA); both land where the caller asked */
  float *a_in = malloc(blk * sizeof(float)), *a_out = malloc((size_t)size * blk * sizeof(float));
  float *b_in = malloc(blk * sizeof(float)), *b_out = malloc((size_t)size * blk * sizeof(float));
  for (size_t i = 0; i < blk; i++) {
    a_in[i] = (float)(rank * 100000 + (int)(i % 50000) + 10);
    b_in[i] = (float)(rank * 100000 + (int)(i % 50000) + 11);
  }
  chorus_request_t *ra = NULL, *rb = NULL;
  if (!bad && (chorus_iallgather(c, a_in, a_out, blk, CHORUS_FLOAT32, &ra) ||
               chorus_iallgather(c, b_in, b_out, blk, CHORUS_FLOAT32, &rb) || chorus_wait(&rb) ||
               chorus_wait(&ra))) {
    fprintf(stderr, "rank %d: iallgather: %s\n", rank, chorus_comm_last_error(c));
    bad = 1;
  }
  if (!bad)
    bad =
        check_allgather(a_out, blk, size, rank, 10) || check_allgather(b_out, blk, size, rank, 11);
  free(a_in), free(a_out), free(b_in), free(b_out), free(ag), free(mine);

  if (!bad && staged && prov_ofi_rndv_stats(c->prov, &st) == 0 &&
      (st.cma_bytes == st0.cma_bytes ||
       st.mapped_bytes + st.borrowed_bytes == st0.mapped_bytes + st0.borrowed_bytes)) {
    fprintf(stderr,
            "rank %d: want one staged call and one by CMA: cma %llu, mapped+borrowed %llu\n", rank,
            (unsigned long long)st.cma_bytes,
            (unsigned long long)(st.mapped_bytes + st.borrowed_bytes));
    bad = 1;
  }

  /* nor is a larger allreduce */
  const size_t huge = 5u << 20; /* 20 MiB */
  float *h = malloc(huge * sizeof(float));
  chk_fill(h, huge, CHORUS_FLOAT32, CHORUS_SUM, rank);
  prov_ofi_rndv_stats_t s1 = {0}, s2 = {0};
  if (!bad && (prov_ofi_rndv_stats(c->prov, &s1) ||
               chorus_allreduce(c, h, h, huge, CHORUS_FLOAT32, CHORUS_SUM) ||
               prov_ofi_rndv_stats(c->prov, &s2))) {
    fprintf(stderr, "rank %d: allreduce 20 MiB: %s\n", rank, chorus_comm_last_error(c));
    bad = 1;
  }
  if (!bad && chk_verify(h, huge, CHORUS_FLOAT32, CHORUS_SUM, size, rank, "20 MiB"))
    bad = 1;
  moved_t m = moved_since(&s1, &s2);
  if (!bad && !moved_only(m, false)) {
    fprintf(stderr, "rank %d: allreduce 20 MiB: want CMA only: cma +%llu, mapped+borrowed +%llu\n",
            rank, m.cma, m.mapped);
    bad = 1;
  }
  free(h);
  if (chorus_comm_destroy(c))
    bad = 1;
  return bad;
}

Test(mem, plain_memory_is_staged_when_ranks_share_cores) {
  const char *envs[] = {"CHORUS_PROVIDER=shm", NULL};
  mp_result_t r = mp_run(3, stage_rank, "staged", 120, envs);
  cr_assert_eq(r.timed_out, 0);
  cr_assert_eq(r.failed, 0, "%d rank(s) failed", r.failed);
}

Test(mem, staging_off_or_past_its_limit_goes_by_cma) {
  const char *off[] = {"CHORUS_PROVIDER=shm", "CHORUS_SHM_STAGE=0", NULL};
  mp_result_t r = mp_run(3, stage_rank, "cma", 120, off);
  cr_assert_eq(r.timed_out, 0);
  cr_assert_eq(r.failed, 0, "CHORUS_SHM_STAGE=0: %d rank(s) failed", r.failed);
  /* every call here is past 64 KiB */
  const char *small[] = {"CHORUS_PROVIDER=shm", "CHORUS_SHM_STAGE=64K", NULL};
  r = mp_run(3, stage_rank, "cma", 120, small);
  cr_assert_eq(r.timed_out, 0);
  cr_assert_eq(r.failed, 0, "CHORUS_SHM_STAGE=64K: %d rank(s) failed", r.failed);
}

/* what alone_step calls */
enum { ALONE_ALLGATHER, ALONE_ALLGATHER_IN_PLACE, ALONE_BCAST };

/* With ranks on cores of their own (two ranks, two CPUs), nothing is
 * staged but allgather blocks of 16 MiB and more: every other allgather
 * block and broadcast past the bounce slots goes by CMA, as everything does
 * with CHORUS_SHM_STAGE=0. On a one-CPU machine the ranks
 * share it and every such call is staged; a staged allgather's own block is
 * put into the receive buffer as it is staged (in place: left where it is).
 * arg: "alone" or "off". */
static int alone_step(chorus_comm_t *c, int rank, int size, int kind, size_t n, bool want_mapped,
                      const char *what) {
  const bool bcast = kind == ALONE_BCAST, inplace = kind == ALONE_ALLGATHER_IN_PLACE;
  float *out = malloc((size_t)size * n * sizeof(float));
  float *in = inplace ? out + (size_t)rank * n : malloc(n * sizeof(float));
  if (!inplace) /* every other byte of the result is the call's to write */
    memset(out, 0xab, (size_t)size * n * sizeof(float));
  for (size_t i = 0; i < n; i++)
    in[i] = (float)(rank * 1000 + (int)(i % 999));
  prov_ofi_rndv_stats_t s1, s2;
  int bad = prov_ofi_rndv_stats(c->prov, &s1) != 0;
  chorus_result rc = bad     ? CHORUS_ERR_INTERNAL
                     : bcast ? chorus_bcast(c, in, out, n, CHORUS_FLOAT32, 1)
                             : chorus_allgather(c, in, out, n, CHORUS_FLOAT32);
  if (rc || prov_ofi_rndv_stats(c->prov, &s2)) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, what, chorus_comm_last_error(c));
    bad = 1;
  }
  for (int r = 0; r < (bcast ? 1 : size) && !bad; r++)
    for (size_t i = 0; i < n && !bad; i++) {
      float want = (float)((bcast ? 1 : r) * 1000 + (int)(i % 999));
      if (out[(size_t)r * n + i] != want) {
        fprintf(stderr, "rank %d: %s: block %d [%zu] = %g\n", rank, what, r, i,
                (double)out[(size_t)r * n + i]);
        bad = 1;
      }
    }
  /* the receiving side counts the bytes it copied, and how */
  bool receives = !bcast || rank != 1;
  moved_t m = moved_since(&s1, &s2);
  if (!bad && receives && !moved_only(m, want_mapped)) {
    fprintf(stderr, "rank %d: %s: want %s: cma %llu mapped %llu\n", rank, what,
            want_mapped ? "mapped" : "CMA", m.cma, m.mapped);
    bad = 1;
  }
  if (!inplace)
    free(in);
  free(out);
  return bad;
}

static int alone_rank(int rank, int size, const char *addr, void *arg) {
  const bool on = strcmp(arg, "alone") == 0;
  bool shared;
  if (keep_cpus(2, &shared))
    return 1;
  chorus_comm_t *c;
  if (chorus_comm_init(&c, rank, size, addr)) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    return 1;
  }
  const size_t mib = 1u << 18; /* floats */
  const bool st = on && shared;
  int bad = alone_step(c, rank, size, ALONE_ALLGATHER, 16 * mib, on, "allgather 2 x 16 MiB");
  bad = bad || alone_step(c, rank, size, ALONE_ALLGATHER, 8 * mib, st, "allgather 2 x 8 MiB");
  bad = bad || alone_step(c, rank, size, ALONE_ALLGATHER, mib, st, "allgather 2 x 1 MiB");
  bad = bad || alone_step(c, rank, size, ALONE_ALLGATHER, mib / 8, st, "allgather 2 x 128 KiB");
  bad = bad || alone_step(c, rank, size, ALONE_ALLGATHER_IN_PLACE, mib, st,
                          "allgather 2 x 1 MiB in place");
  /* past the bounce slots (64 KiB) */
  bad = bad || alone_step(c, rank, size, ALONE_ALLGATHER, 3 * mib / 32, st, "allgather 2 x 96 KiB");
  bad = bad || alone_step(c, rank, size, ALONE_BCAST, 8 * mib, st, "bcast 8 MiB");
  bad = bad || alone_step(c, rank, size, ALONE_BCAST, 4 * mib, st, "bcast 4 MiB");
  if (chorus_comm_destroy(c))
    bad = 1;
  return bad;
}

Test(mem, ranks_on_cores_of_their_own_send_plain_memory_by_cma) {
  const char *envs[] = {"CHORUS_PROVIDER=shm", NULL};
  mp_result_t r = mp_run(2, alone_rank, "alone", 120, envs);
  cr_assert_eq(r.timed_out, 0);
  cr_assert_eq(r.failed, 0, "%d rank(s) failed", r.failed);
  const char *off[] = {"CHORUS_PROVIDER=shm", "CHORUS_SHM_STAGE=0", NULL};
  r = mp_run(2, alone_rank, "off", 120, off);
  cr_assert_eq(r.timed_out, 0);
  cr_assert_eq(r.failed, 0, "CHORUS_SHM_STAGE=0: %d rank(s) failed", r.failed);
}

/* Scratch past CHORUS_BUFFSIZE: a plan that needs more than the cached
 * buffer gets scratch of its own, which is kept for the next such call
 * (a fresh buffer costs a page fault a page) and given back once calls have
 * not used it for EXEC_BIG_IDLE_NS. Two ranks, reduce_scatter by rhd (its
 * partials take the whole input in scratch) with 64 KiB of CHORUS_BUFFSIZE. */
static int big_scratch_rank(int rank, int size, const char *addr, void *arg) {
  (void)arg;
  const size_t count = 64 << 10; /* floats a rank: 512 KiB of input */
  float *in = malloc(2 * count * sizeof(float)), *out = malloc(count * sizeof(float));
  chorus_comm_t *c;
  int bad = 0;
  if (!in || !out || chorus_comm_init(&c, rank, size, addr)) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    free(in);
    free(out);
    return 1;
  }
  void *kept[2] = {NULL, NULL};
  size_t kept_bytes = 0;
  for (int call = 0; call < 2 && !bad; call++) {
    for (size_t i = 0; i < 2 * count; i++)
      in[i] = (float)((size_t)rank + i % 7 + (size_t)call);
    if (chorus_reduce_scatter(c, in, out, count, CHORUS_FLOAT32, CHORUS_SUM)) {
      fprintf(stderr, "rank %d: %s\n", rank, chorus_comm_last_error(c));
      bad = 1;
      break;
    }
    for (size_t i = 0; i < count && !bad; i++) {
      float want = (float)(1 + 2 * ((rank * count + i) % 7) + 2 * (size_t)call);
      if (out[i] != want) {
        fprintf(stderr, "rank %d call %d: out[%zu] %g, want %g\n", rank, call, i, out[i], want);
        bad = 1;
      }
    }
    pthread_mutex_lock(&c->prog_lock);
    kept[call] = c->ex.big;
    kept_bytes = c->ex.big_bytes;
    pthread_mutex_unlock(&c->prog_lock);
  }
  if (!bad && (!kept[0] || kept[1] != kept[0] || kept_bytes < 2 * count * sizeof(float))) {
    fprintf(stderr, "rank %d: scratch kept %p then %p (%zu B)\n", rank, kept[0], kept[1],
            kept_bytes);
    bad = 1;
  }
  /* idle: the progress thread gives it back */
  bool freed = false;
  for (int i = 0; i < 50 && !bad && !freed; i++) {
    usleep(100 * 1000);
    pthread_mutex_lock(&c->prog_lock);
    freed = c->ex.big == NULL;
    pthread_mutex_unlock(&c->prog_lock);
  }
  if (!bad && !freed) {
    fprintf(stderr, "rank %d: the scratch was still kept after 5 s idle\n", rank);
    bad = 1;
  }
  free(in);
  free(out);
  return chorus_comm_destroy(c) != CHORUS_SUCCESS || bad;
}

Test(mem, scratch_past_buffsize_is_kept_for_the_next_call_then_given_back) {
  const char *envs[] = {"CHORUS_PROVIDER=shm", "CHORUS_BUFFSIZE=64K",
                        "CHORUS_ALGO=reduce_scatter=rhd", NULL};
  mp_result_t r = mp_run(2, big_scratch_rank, NULL, 120, envs);
  cr_assert_eq(r.timed_out, 0);
  cr_assert_eq(r.failed, 0, "%d rank(s) failed", r.failed);
}
