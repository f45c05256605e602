/*
 * test_inproc.c - the in-process transport: matching, copies, completions on
 * the owner's thread, cancel/close, wake-ups, threads, thousands of ranks.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "mp.h"
#include "prov_test.h"

#define MIB (1024 * 1024)

static prov_inproc_world_t *world;
static prov_t *eps[8];

static void open_world(int n) {
  char err[256] = "";
  int rc;

  world = prov_inproc_world_create(n);
  cr_assert_not_null(world);
  rc = pt_open_job("inproc", world, n, eps, err, sizeof(err));
  cr_assert_eq(rc, 0, "open: %d %s", rc, err);
}

static void close_world(void) {
  pt_close_job(eps, 8);
  prov_inproc_world_destroy(world);
  world = NULL;
}

static void teardown(void) {
  close_world();
}

TestSuite(inproc, .timeout = 60, .fini = teardown);

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);

  cr_assert_not_null(p);
  return p;
}

Test(inproc, open_rejects_bad_config) {
  prov_t *p = (prov_t *)0x1;
  char err[128] = "";
  prov_config_t cfg = {.name = "inproc", .rank = 0, .nranks = 2};

  cr_assert_eq(prov_open(&cfg, &p, err, sizeof(err)), -EINVAL);
  cr_assert_null(p);
  cr_assert(strstr(err, "world"), "reason: %s", err);
  world = prov_inproc_world_create(2);
  cfg.inproc_world = world;
  cfg.nranks = 3;
  cr_assert_eq(prov_open(&cfg, &p, err, sizeof(err)), -EINVAL);
  cfg.nranks = 2;
  cr_assert_eq(prov_open(&cfg, &eps[0], err, sizeof(err)), 0);
  cr_assert_str_eq(eps[0]->name, "inproc");
  cr_assert_eq(prov_open(&cfg, &p, err, sizeof(err)), -EBUSY, "same rank twice");
}

/* Sizes around the eager/rendezvous switch (4 KiB) and large ones, distinct
 * tags, half the receives posted before the sends, half after. */
Test(inproc, sizes_mixed_order) {
  static const size_t sizes[] = {0, 1, 4096, 4097, MIB, 16 * MIB};
  enum { N = sizeof(sizes) / sizeof(sizes[0]) };
  pt_op_t s[2][N], r[2][N], *all[4 * N];
  int order[N] = {5, 0, 3, 1, 4, 2};
  int k = 0;

  open_world(2);
  for (int d = 0; d < 2; d++) {
    for (int i = 0; i < N; i++) {
      pt_op_init(&s[d][i]);
      pt_op_init(&r[d][i]);
      s[d][i].buf = xmalloc(sizes[i]);
      r[d][i].buf = xmalloc(sizes[i]);
      pt_fill(s[d][i].buf, sizes[i], 100 * d + i);
      memset(r[d][i].buf, 0xee, sizes[i]);
      s[d][i].op.data = 0x7edcba9876543210ULL ^ (uint64_t)(d * N + i); /* immediate data */
      all[k++] = &s[d][i];
      all[k++] = &r[d][i];
    }
  }
  /* d: direction, 0 = rank 0 -> rank 1. Even indices posted first. */
  for (int d = 0; d < 2; d++)
    for (int i = 0; i < N; i += 2)
      cr_assert_eq(pt_recv(eps, 2, eps[1 - d], d, &r[d][i], sizes[i], 0x1000 + i, 1000), 0);
  for (int d = 0; d < 2; d++)
    for (int j = 0; j < N; j++) {
      int i = order[j];

      cr_assert_eq(pt_send(eps, 2, eps[d], 1 - d, &s[d][i], sizes[i], 0x1000 + i, 1000), 0);
    }
  for (int d = 0; d < 2; d++)
    for (int i = 1; i < N; i += 2)
      cr_assert_eq(pt_recv(eps, 2, eps[1 - d], d, &r[d][i], sizes[i], 0x1000 + i, 1000), 0);
  cr_assert(pt_drive(eps, 2, all, 4 * N, 10000), "not all completed");
  for (int d = 0; d < 2; d++) {
    for (int i = 0; i < N; i++) {
      cr_assert_eq(s[d][i].calls, 1);
      cr_assert_eq(r[d][i].calls, 1);
      cr_assert_eq(s[d][i].status, 0);
      cr_assert_eq(r[d][i].status, 0, "size %zu: %d", sizes[i], r[d][i].status);
      cr_assert_eq(s[d][i].len, sizes[i]);
      cr_assert_eq(r[d][i].len, sizes[i]);
      cr_assert_eq(pt_check(r[d][i].buf, sizes[i], 100 * d + i), (size_t)-1, "size %zu bad data",
                   sizes[i]);
      cr_assert_eq(r[d][i].op.data,
                   PROV_DATA_VALID | (0x7edcba9876543210ULL ^ (uint64_t)(d * N + i)),
                   "size %zu: immediate data %#llx", sizes[i], (unsigned long long)r[d][i].op.data);
      free(s[d][i].buf);
      free(r[d][i].buf);
    }
  }
}

/* Same tag from two sources: a receive takes only its source's message;
 * same source and tag: first sent, first received. */
Test(inproc, matches_source_and_fifo) {
  pt_op_t s[4], r[4], *all[8];
  int vals[4] = {10, 20, 30, 40}, got[4] = {0};

  open_world(3);
  for (int i = 0; i < 4; i++) {
    pt_op_init(&s[i]);
    pt_op_init(&r[i]);
    s[i].buf = &vals[i];
    r[i].buf = &got[i];
    all[i] = &s[i];
    all[4 + i] = &r[i];
  }
  /* rank 0 sends 10 then 20 (tag 7); rank 2 sends 30 (tag 7), 40 (tag 8). */
  cr_assert_eq(pt_send(eps, 3, eps[0], 1, &s[0], sizeof(int), 7, 100), 0);
  cr_assert_eq(pt_send(eps, 3, eps[0], 1, &s[1], sizeof(int), 7, 100), 0);
  cr_assert_eq(pt_send(eps, 3, eps[2], 1, &s[2], sizeof(int), 7, 100), 0);
  cr_assert_eq(pt_send(eps, 3, eps[2], 1, &s[3], sizeof(int), 8, 100), 0);
  cr_assert_eq(pt_recv(eps, 3, eps[1], 2, &r[0], sizeof(int), 8, 100), 0);
  cr_assert_eq(pt_recv(eps, 3, eps[1], 2, &r[1], sizeof(int), 7, 100), 0);
  cr_assert_eq(pt_recv(eps, 3, eps[1], 0, &r[2], sizeof(int), 7, 100), 0);
  cr_assert_eq(pt_recv(eps, 3, eps[1], 0, &r[3], sizeof(int), 7, 100), 0);
  cr_assert(pt_drive(eps, 3, all, 8, 1000));
  cr_assert_eq(got[0], 40);
  cr_assert_eq(got[1], 30);
  cr_assert_eq(got[2], 10);
  cr_assert_eq(got[3], 20);
}

Test(inproc, completions_only_from_owner_progress) {
  pt_op_t s, r;
  char a[8] = "abcdefg", b[8] = "";

  open_world(2);
  pt_op_init(&s);
  pt_op_init(&r);
  s.buf = a;
  r.buf = b;
  cr_assert_eq(eps[1]->ops->post_recv(eps[1], 0, b, 8, 1, &r.op), 0);
  cr_assert_eq(eps[0]->ops->post_send(eps[0], 1, a, 8, 1, &s.op), 0);
  cr_assert_eq(r.calls, 0, "callback ran on the sender's call");
  cr_assert_eq(s.calls, 0, "callback ran inside post_send");
  cr_assert_str_eq(b, "abcdefg", "data is copied at match time");
  cr_assert_eq(eps[0]->ops->progress(eps[0]), 1);
  cr_assert_eq(r.calls, 0);
  cr_assert_eq(eps[1]->ops->progress(eps[1]), 1);
  cr_assert_eq(r.calls, 1);
  cr_assert_eq(eps[1]->ops->progress(eps[1]), 0);
}

Test(inproc, truncation_is_an_error) {
  pt_op_t s, r, *all[2] = {&s, &r};
  char a[100], b[10];

  open_world(2);
  pt_op_init(&s);
  pt_op_init(&r);
  s.buf = a;
  r.buf = b;
  pt_fill(a, sizeof(a), 3);
  cr_assert_eq(pt_recv(eps, 2, eps[1], 0, &r, sizeof(b), 5, 100), 0);
  cr_assert_eq(pt_send(eps, 2, eps[0], 1, &s, sizeof(a), 5, 100), 0);
  cr_assert(pt_drive(eps, 2, all, 2, 1000));
  cr_assert_eq(r.status, -EMSGSIZE);
  cr_assert_eq(r.len, sizeof(b));
  cr_assert(strstr(eps[1]->last_error, "truncated"), "last_error: %s", eps[1]->last_error);
}

Test(inproc, cancel) {
  pt_op_t r, s, s2, r2, *all[2] = {&r, &s};
  size_t big = 64 * 1024;
  char tmp[4];

  open_world(2);
  pt_op_init(&r);
  pt_op_init(&s);
  pt_op_init(&s2);
  pt_op_init(&r2);
  r.buf = tmp;
  s.buf = xmalloc(big);
  cr_assert_eq(eps[1]->ops->post_recv(eps[1], 0, tmp, 4, 99, &r.op), 0);
  /* Larger than the eager size: the send waits for its receive. */
  cr_assert_eq(eps[0]->ops->post_send(eps[0], 1, s.buf, big, 98, &s.op), 0);
  cr_assert_eq(eps[1]->ops->cancel(eps[1], &r.op), 0);
  cr_assert_eq(eps[0]->ops->cancel(eps[0], &s.op), 0);
  cr_assert(pt_drive(eps, 2, all, 2, 1000));
  cr_assert_eq(r.status, -ECANCELED);
  cr_assert_eq(s.status, -ECANCELED);
  cr_assert_eq(eps[1]->ops->cancel(eps[1], &r.op), -ENOENT, "not posted any more");
  /* The canceled send is gone: a receive for it stays pending. */
  r2.buf = xmalloc(big);
  cr_assert_eq(eps[1]->ops->post_recv(eps[1], 0, r2.buf, big, 98, &r2.op), 0);
  for (int i = 0; i < 10; i++) {
    eps[0]->ops->progress(eps[0]);
    eps[1]->ops->progress(eps[1]);
  }
  cr_assert_eq(r2.calls, 0);
  cr_assert_eq(r.calls, 1);
  cr_assert_eq(s.calls, 1);
  /* A completed op: cancel changes nothing. */
  s2.buf = s.buf;
  cr_assert_eq(pt_send(eps, 2, eps[0], 1, &s2, big, 98, 100), 0);
  pt_op_t *both[2] = {&s2, &r2};
  cr_assert(pt_drive(eps, 2, both, 2, 1000));
  cr_assert_eq(eps[1]->ops->cancel(eps[1], &r2.op), -ENOENT);
  cr_assert_eq(r2.status, 0);
  cr_assert_eq(r2.calls, 1);
  free(s.buf);
  free(r2.buf);
}

Test(inproc, close_runs_callbacks_of_posted_ops) {
  pt_op_t r[3], s;
  char buf[3][4];
  char *big = xmalloc(MIB);

  open_world(2);
  for (int i = 0; i < 3; i++) {
    pt_op_init(&r[i]);
    cr_assert_eq(eps[1]->ops->post_recv(eps[1], 0, buf[i], 4, 50 + i, &r[i].op), 0);
  }
  pt_op_init(&s);
  cr_assert_eq(eps[1]->ops->post_send(eps[1], 0, big, MIB, 77, &s.op), 0);
  eps[1]->ops->close(eps[1]);
  eps[1] = NULL;
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(r[i].calls, 1);
    cr_assert_eq(r[i].status, -ECANCELED);
  }
  cr_assert_eq(s.calls, 1);
  cr_assert_eq(s.status, -ECANCELED);
  free(big);
}

Test(inproc, eagain_past_max_posted) {
  size_t max;
  pt_op_t *r;
  char b;

  open_world(2);
  max = eps[0]->ops->max_posted(eps[0]);
  cr_assert_gt(max, 0);
  r = calloc(max + 1, sizeof(*r));
  for (size_t i = 0; i < max; i++) {
    pt_op_init(&r[i]);
    cr_assert_eq(eps[0]->ops->post_recv(eps[0], 1, &b, 1, i, &r[i].op), 0);
  }
  pt_op_init(&r[max]);
  cr_assert_eq(eps[0]->ops->post_recv(eps[0], 1, &b, 1, max, &r[max].op), -EAGAIN);
  cr_assert_eq(eps[0]->ops->cancel(eps[0], &r[0].op), 0);
  eps[0]->ops->progress(eps[0]);
  cr_assert_eq(eps[0]->ops->post_recv(eps[0], 1, &b, 1, max, &r[max].op), 0);
  close_world();
  for (size_t i = 0; i <= max; i++)
    cr_assert_eq(r[i].calls, 1);
  free(r);
}

Test(inproc, arm_and_wait_fd) {
  pt_op_t s, r;
  int v = 42, got = 0;
  int fd;

  open_world(2);
  fd = eps[1]->ops->wait_fd(eps[1]);
  cr_assert_geq(fd, 0);
  pt_op_init(&s);
  pt_op_init(&r);
  cr_assert_eq(eps[1]->ops->post_recv(eps[1], 0, &got, sizeof(got), 1, &r.op), 0);
  cr_assert_eq(eps[1]->ops->arm(eps[1]), 0);
  cr_assert_eq(pt_poll_fd(eps[1], 0), 0, "readable while idle");
  cr_assert_eq(eps[0]->ops->post_send(eps[0], 1, &v, sizeof(v), 1, &s.op), 0);
  cr_assert_eq(pt_poll_fd(eps[1], 1000), 1, "not woken by the message");
  eps[1]->ops->disarm(eps[1]);
  cr_assert_eq(pt_poll_fd(eps[1], 0), 0, "still readable after disarm");
  cr_assert_eq(eps[1]->ops->arm(eps[1]), -EAGAIN, "completion pending");
  cr_assert_eq(eps[1]->ops->progress(eps[1]), 1);
  cr_assert_eq(got, 42);
  cr_assert_eq(eps[1]->ops->arm(eps[1]), 0);
  eps[1]->ops->disarm(eps[1]);
  cr_assert_eq(eps[0]->ops->progress(eps[0]), 1);
  cr_assert_eq(s.calls, 1);
}

Test(inproc, message_before_receiver_opens) {
  pt_op_t s, r, *all[2] = {&s, &r};
  char err[128];
  prov_config_t cfg = {.name = "inproc", .rank = 0, .nranks = 2};
  int v = 7, got = 0;

  world = prov_inproc_world_create(2);
  cfg.inproc_world = world;
  cr_assert_eq(prov_open(&cfg, &eps[0], err, sizeof(err)), 0);
  pt_op_init(&s);
  pt_op_init(&r);
  cr_assert_eq(eps[0]->ops->post_send(eps[0], 1, &v, sizeof(v), 3, &s.op), 0);
  cfg.rank = 1;
  cr_assert_eq(prov_open(&cfg, &eps[1], err, sizeof(err)), 0);
  cr_assert_eq(eps[1]->ops->post_recv(eps[1], 0, &got, sizeof(got), 3, &r.op), 0);
  cr_assert(pt_drive(eps, 2, all, 2, 1000));
  cr_assert_eq(got, 7);
}

/* ---- threads: every rank driven by its own thread, sleeping on its fd ---- */

enum { TH_RANKS = 8, TH_MSGS = 6 };

struct th_arg {
  int rank;
  int lost;
  int bad;
};

static size_t th_size(int src, int dst, int m) {
  static const size_t sz[] = {0, 1, 4096, 4097, 65536, 300000};

  return sz[(src + dst + m) % 6];
}

static void *th_main(void *argp) {
  struct th_arg *a = argp;
  prov_t *p = eps[a->rank];
  enum { N = TH_RANKS * TH_MSGS };
  static __thread pt_op_t s[N], r[N];
  pt_op_t *all[2 * N];
  int k = 0;

  for (int peer = 0; peer < TH_RANKS; peer++) {
    for (int m = 0; m < TH_MSGS; m++) {
      int i = peer * TH_MSGS + m;
      size_t out = th_size(a->rank, peer, m), in = th_size(peer, a->rank, m);

      pt_op_init(&s[i]);
      pt_op_init(&r[i]);
      s[i].buf = malloc(out + 1);
      r[i].buf = malloc(in + 1);
      pt_fill(s[i].buf, out, (uint64_t)(a->rank * 1000 + peer * 10 + m));
      all[k++] = &s[i];
      all[k++] = &r[i];
      if (m % 2 &&
          p->ops->post_recv(p, peer, r[i].buf, in, (uint64_t)m << 32 | (unsigned)peer, &r[i].op))
        a->bad++;
      if (p->ops->post_send(p, peer, s[i].buf, out, (uint64_t)m << 32 | (unsigned)a->rank,
                            &s[i].op))
        a->bad++;
      if (m % 2 == 0 &&
          p->ops->post_recv(p, peer, r[i].buf, in, (uint64_t)m << 32 | (unsigned)peer, &r[i].op))
        a->bad++;
    }
  }
  if (!pt_sleepy_drive(p, all, 2 * N, 20000, 5000, &a->lost))
    a->bad++;
  for (int peer = 0; peer < TH_RANKS; peer++) {
    for (int m = 0; m < TH_MSGS; m++) {
      int i = peer * TH_MSGS + m;
      size_t in = th_size(peer, a->rank, m);

      if (r[i].status || r[i].len != in || s[i].status ||
          pt_check(r[i].buf, in, (uint64_t)(peer * 1000 + a->rank * 10 + m)) != (size_t)-1)
        a->bad++;
      free(s[i].buf);
      free(r[i].buf);
    }
  }
  return NULL;
}

Test(inproc, threads_all_to_all_sleeping_on_fds) {
  pthread_t th[TH_RANKS];
  struct th_arg args[TH_RANKS];

  open_world(TH_RANKS);
  for (int i = 0; i < TH_RANKS; i++) {
    args[i] = (struct th_arg){.rank = i};
    cr_assert_eq(pthread_create(&th[i], NULL, th_main, &args[i]), 0);
  }
  for (int i = 0; i < TH_RANKS; i++) {
    pthread_join(th[i], NULL);
    cr_expect_eq(args[i].bad, 0, "rank %d: %d failures", i, args[i].bad);
    cr_expect_eq(args[i].lost, 0, "rank %d: %d lost wake-ups", i, args[i].lost);
  }
}

/* ---- scale: thousands of ranks in one thread, no descriptors ---- */

Test(inproc, ring_of_4096_ranks, .timeout = 120) {
  enum { N = 4096 };
  prov_t **p = calloc(N, sizeof(*p));
  pt_op_t *s = calloc(N, sizeof(*s)), *r = calloc(N, sizeof(*r));
  uint64_t *out = calloc(N, sizeof(*out)), *in = calloc(N, sizeof(*in));
  int fds = mp_count_fds();
  long rss0 = mp_rss_kib();
  char err[256] = "";
  int rc, pending;

  world = prov_inproc_world_create(N);
  cr_assert_not_null(world);
  rc = pt_open_job("inproc", world, N, p, err, sizeof(err));
  cr_assert_eq(rc, 0, "%s", err);
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < N; i++) {
      pt_op_init(&s[i]);
      pt_op_init(&r[i]);
      out[i] = (uint64_t)i * 7919 + (uint64_t)round;
      cr_assert_eq(p[i]->ops->post_recv(p[i], (i + N - 1) % N, &in[i], 8, round, &r[i].op), 0);
      cr_assert_eq(p[i]->ops->post_send(p[i], (i + 1) % N, &out[i], 8, round, &s[i].op), 0);
    }
    do {
      pending = 0;
      for (int i = 0; i < N; i++) {
        p[i]->ops->progress(p[i]);
        pending += !r[i].calls + !s[i].calls;
      }
    } while (pending);
    for (int i = 0; i < N; i++)
      cr_assert_eq(in[i], (uint64_t)((i + N - 1) % N) * 7919 + (uint64_t)round);
  }
  cr_assert_eq(mp_count_fds(), fds, "a rank that never asks for wait_fd holds no descriptor");
  cr_expect_lt(mp_rss_kib() - rss0, 64 * 1024, "memory for %d ranks: %ld KiB", N,
               mp_rss_kib() - rss0);
  pt_close_job(p, N);
  free(p);
  free(s);
  free(r);
  free(out);
  free(in);
}

Test(inproc, open_close_cycles_leak_no_fds) {
  int fds = mp_count_fds();

  for (int c = 0; c < 200; c++) {
    pt_op_t s, r;
    char a = 'x', b = 0;

    open_world(2);
    cr_assert_geq(eps[0]->ops->wait_fd(eps[0]), 0);
    cr_assert_geq(eps[1]->ops->wait_fd(eps[1]), 0);
    pt_op_init(&s);
    pt_op_init(&r);
    cr_assert_eq(eps[1]->ops->post_recv(eps[1], 0, &b, 1, 1, &r.op), 0);
    cr_assert_eq(eps[0]->ops->post_send(eps[0], 1, &a, 1, 1, &s.op), 0);
    pt_op_t *all[2] = {&s, &r};
    cr_assert(pt_drive(eps, 2, all, 2, 1000));
    cr_assert_eq(b, 'x');
    close_world();
  }
  cr_assert_eq(mp_count_fds(), fds);
}
