/*
 * test_multi.c - prov_multi: shm inside a host, tcp between hosts, all on
 * this machine (hosts are emulated with prov_config.host_of).
 *
 * Every endpoint of a job lives in this process and is driven by the test
 * (prov_test.h). Checked: routing (each peer on the child its host calls
 * for, counted per child; shm opened only for the ranks of the host, so it
 * can not carry cross-host data at all), data of every size both ways
 * between every pair, hosts of one rank (no shm child) and one host (no tcp
 * child), wake-ups through the combined wait fd from either child, cancel,
 * close with posted operations, and bad configurations.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "prov_internal.h"
#include "prov_test.h"

#define MAXR 6

static prov_t *eps[MAXR];
static int neps;

static void setup(void) {
  setenv("FI_TCP_IFACE", "lo", 0);
}

static void teardown(void) {
  pt_close_job(eps, neps);
  neps = 0;
}

TestSuite(multi, .init = setup, .fini = teardown, .timeout = 120);

/* pt_open_job, with a host map. */
static void open_job(const char *name, const int *host_of, int n) {
  static unsigned seq;
  char job[64], err[512] = "";
  void *addrs[MAXR] = {0};
  const void *caddrs[MAXR];
  size_t lens[MAXR];

  snprintf(job, sizeof(job), "mt-%d-%u", (int)getpid(), seq++);
  neps = n;
  memset(eps, 0, sizeof(eps));
  for (int i = 0; i < n; i++) {
    prov_config_t cfg = {.name = name, .rank = i, .nranks = n, .job_id = job, .host_of = host_of};
    int rc = prov_open(&cfg, &eps[i], err, sizeof(err));
    cr_assert_eq(rc, 0, "open %s rank %d: %d %s", name, i, rc, err);
    lens[i] = 4096;
    addrs[i] = malloc(lens[i]);
    cr_assert_eq(eps[i]->ops->getname(eps[i], addrs[i], &lens[i]), 0);
    caddrs[i] = addrs[i];
  }
  for (int i = 0; i < n; i++) {
    int rc = eps[i]->ops->add_peers(eps[i], caddrs, lens, n);
    cr_assert_eq(rc, 0, "add_peers of rank %d: %d (%s)", i, rc, eps[i]->last_error);
  }
  for (int i = 0; i < n; i++)
    free(addrs[i]);
}

/* A message of len bytes from a to b, checked. */
static void transfer(int a, int b, size_t len, uint64_t tag) {
  pt_op_t s, r;
  pt_op_t *both[2] = {&s, &r};
  char *src = malloc(len + 1), *dst = calloc(1, len + 1);

  cr_assert(src && dst);
  pt_fill(src, len, tag);
  pt_op_init(&s);
  pt_op_init(&r);
  s.buf = src;
  r.buf = dst;
  cr_assert_eq(pt_recv(eps, neps, eps[b], a, &r, len, tag, 5000), 0);
  cr_assert_eq(pt_send(eps, neps, eps[a], b, &s, len, tag, 5000), 0);
  cr_assert(pt_drive(eps, neps, both, 2, 20000), "%d -> %d, %zu bytes: never completed", a, b, len);
  cr_assert_eq(s.status, 0, "%d -> %d send: %d", a, b, s.status);
  cr_assert_eq(r.status, 0, "%d -> %d recv: %d (%s)", a, b, r.status, eps[b]->last_error);
  cr_assert_eq(r.len, len);
  cr_assert_eq(pt_check(dst, len, tag), (size_t)-1, "%d -> %d, %zu bytes: corrupted", a, b, len);
  free(src);
  free(dst);
}

static void stats(int i, prov_multi_stats_t *st) {
  cr_assert_eq(prov_multi_stats(eps[i], st), 0);
}

Test(multi, routes_every_pair_by_host) {
  static const int host_of[4] = {0, 0, 1, 1};
  static const size_t sizes[] = {0, 100, 5000, 70000, 1u << 20};
  uint64_t want_sends[4][2] = {{0}};
  uint64_t want_bytes[4][2] = {{0}};

  open_job("shm+tcp", host_of, 4);
  for (int i = 0; i < 4; i++) {
    prov_multi_stats_t st;
    stats(i, &st);
    cr_assert_str_eq(eps[i]->name, "shm+tcp");
    cr_assert_str_eq(st.child_name[0], "shm");
    cr_assert_str_eq(st.child_name[1], "tcp;ofi_rxm");
    cr_assert_eq(st.child_nranks[0], 2, "shm only for the ranks of the host");
    cr_assert_eq(st.child_nranks[1], 4);
    cr_assert_geq(eps[i]->ops->wait_fd(eps[i]), 0, "shm and tcp both wake: one wait fd");
    for (int p = 0; p < 4; p++)
      cr_assert_eq(prov_multi_route(eps[i], p), host_of[p] == host_of[i] ? 0 : 1,
                   "rank %d -> %d routed wrong", i, p);
  }
  cr_assert_eq(prov_multi_route(eps[0], 4), -1);
  cr_assert_eq(prov_multi_route(eps[0], -1), -1);

  uint64_t tag = 1;
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 4; b++) {
      if (a == b)
        continue;
      for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        transfer(a, b, sizes[k], tag++);
        int via = host_of[a] == host_of[b] ? 0 : 1;
        want_sends[a][via]++;
        want_bytes[a][via] += sizes[k];
      }
    }
  for (int i = 0; i < 4; i++) {
    prov_multi_stats_t st;
    stats(i, &st);
    for (int c = 0; c < 2; c++) {
      cr_assert_eq(st.sends[c], want_sends[i][c], "rank %d child %d: %llu sends, want %llu", i, c,
                   (unsigned long long)st.sends[c], (unsigned long long)want_sends[i][c]);
      cr_assert_eq(st.send_bytes[c], want_bytes[i][c]);
    }
    cr_assert_gt(st.sends[1], 0, "rank %d sent nothing over tcp", i);
  }
}

Test(multi, shm_child_can_not_reach_other_hosts) {
  static const int host_of[3] = {0, 0, 1};

  open_job("shm+tcp", host_of, 3);
  prov_multi_stats_t st;
  stats(0, &st);
  cr_assert_eq(st.child_nranks[0], 2);
  /* rank 2 is alone on its host: no shm child, every peer over tcp */
  stats(2, &st);
  cr_assert_null(st.child_name[0]);
  cr_assert_eq(st.child_nranks[0], 0);
  cr_assert_str_eq(st.child_name[1], "tcp;ofi_rxm");
  for (int p = 0; p < 3; p++)
    cr_assert_eq(prov_multi_route(eps[2], p), 1);
  transfer(2, 0, 70000, 7);
  transfer(1, 2, 100, 8);
  transfer(0, 1, 70000, 9);
}

Test(multi, one_host_opens_no_network) {
  static const int host_of[2] = {3, 3};

  open_job("shm+tcp", host_of, 2);
  prov_multi_stats_t st;
  stats(0, &st);
  cr_assert_str_eq(st.child_name[0], "shm");
  cr_assert_null(st.child_name[1]);
  cr_assert_gt(eps[0]->ops->max_posted(eps[0]), 0);
  transfer(0, 1, 1u << 20, 3);
  stats(0, &st);
  cr_assert_eq(st.sends[0], 1);
  cr_assert_eq(st.sends[1], 0);
}

/* An armed endpoint is woken through its one fd by either child. */
Test(multi, wakeup_from_either_child) {
  static const int host_of[3] = {0, 0, 1};
  char a[64] = "ping", b[64];

  open_job("shm+tcp", host_of, 3);
  /* connect both paths first: a first send may need the peer to progress */
  transfer(1, 0, 64, 1);
  transfer(2, 0, 64, 2);
  for (int from = 1; from <= 2; from++) {
    pt_op_t s, r;
    pt_op_t *both[2] = {&s, &r};
    pt_op_init(&s);
    pt_op_init(&r);
    s.buf = a;
    r.buf = b;
    cr_assert_eq(pt_recv(eps, neps, eps[0], from, &r, sizeof(b), 0x40 + from, 1000), 0);
    cr_assert(pt_arm(eps[0], 5000), "arm() never returned 0");
    eps[0]->ops->disarm(eps[0]);
    cr_assert(pt_arm(eps[0], 5000), "arm() never returned 0");
    cr_assert_eq(pt_poll_fd(eps[0], 100), 0, "wait fd readable while idle: the loop would spin");
    /* only the sender progresses: the receiver sleeps */
    prov_t *sender[1] = {eps[from]};
    cr_assert_eq(pt_send(sender, 1, eps[from], 0, &s, sizeof(a), 0x40 + from, 5000), 0);
    int rc = pt_poll_fd(eps[0], 5000);
    cr_assert_eq(rc, 1, "armed rank 0 not woken by a message over %s", from == 1 ? "shm" : "tcp");
    eps[0]->ops->disarm(eps[0]);
    cr_assert(pt_drive(eps, neps, both, 2, 5000));
    cr_assert_eq(r.status, 0);
    cr_assert_str_eq(b, "ping");
  }
}

Test(multi, cancel_goes_to_the_right_child) {
  static const int host_of[4] = {0, 0, 1, 1};
  static char buf[2][16];

  open_job("shm+tcp", host_of, 4);
  for (int k = 0; k < 2; k++) {
    int peer = k == 0 ? 1 : 2;
    pt_op_t r;
    pt_op_t *one[1] = {&r};
    pt_op_init(&r);
    r.buf = buf[k];
    cr_assert_eq(pt_recv(eps, neps, eps[0], peer, &r, sizeof(buf[k]), 0x77, 1000), 0);
    cr_assert_eq(eps[0]->ops->cancel(eps[0], &r.op), 0);
    cr_assert(pt_drive(eps, neps, one, 1, 5000), "canceled receive never completed");
    cr_assert_eq(r.calls, 1);
    cr_assert_eq(r.status, -ECANCELED, "peer %d: status %d", peer, r.status);
    cr_assert_eq(eps[0]->ops->cancel(eps[0], &r.op), -ENOENT);
  }
  /* still works afterwards, both ways */
  transfer(1, 0, 10, 0x77);
  transfer(2, 0, 10, 0x77);
}

Test(multi, close_with_posted_operations) {
  static const int host_of[4] = {0, 0, 1, 1};
  static pt_op_t r[2];
  static char buf[2][32];

  open_job("shm+tcp", host_of, 4);
  for (int k = 0; k < 2; k++) {
    pt_op_init(&r[k]);
    r[k].buf = buf[k];
    cr_assert_eq(pt_recv(eps, neps, eps[0], k == 0 ? 1 : 3, &r[k], 32, 0x55, 1000), 0);
  }
  eps[0]->ops->close(eps[0]);
  eps[0] = NULL;
  for (int k = 0; k < 2; k++) {
    cr_assert_eq(r[k].calls, 1, "receive %d not ended by close", k);
    cr_assert_eq(r[k].status, -ECANCELED);
  }
}

Test(multi, max_posted_is_the_smaller) {
  static const int host_of[3] = {0, 0, 1};

  open_job("shm+tcp", host_of, 3);
  prov_config_t c1 = {.name = "shm", .rank = 0, .nranks = 2, .job_id = "mx"};
  prov_config_t c2 = {.name = "tcp", .rank = 0, .nranks = 3, .job_id = "mx"};
  prov_t *a = NULL, *b = NULL;
  char err[256];
  cr_assert_eq(prov_open(&c1, &a, err, sizeof(err)), 0, "%s", err);
  cr_assert_eq(prov_open(&c2, &b, err, sizeof(err)), 0, "%s", err);
  size_t ma = a->ops->max_posted(a), mb = b->ops->max_posted(b);
  a->ops->close(a);
  b->ops->close(b);
  cr_assert_eq(eps[0]->ops->max_posted(eps[0]), ma < mb ? ma : mb);
}

Test(multi, bad_configurations) {
  static const int host_of[2] = {0, 1};
  static const char *const bad[] = {"shm+", "+tcp", "shm+tcp+udp"};
  char err[256];
  prov_t *p = (prov_t *)0x1;

  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    prov_config_t cfg = {.name = bad[i], .rank = 0, .nranks = 2, .job_id = "x", .host_of = host_of};
    err[0] = '\0';
    cr_assert_eq(prov_open(&cfg, &p, err, sizeof(err)), -EINVAL, "%s", bad[i]);
    cr_assert_null(p);
    cr_assert(strstr(err, "pair of providers"), "%s: %s", bad[i], err);
  }
  prov_config_t nomap = {.name = "shm+tcp", .rank = 0, .nranks = 2, .job_id = "x"};
  cr_assert_eq(prov_open(&nomap, &p, err, sizeof(err)), -EINVAL);
  cr_assert(strstr(err, "host map"), "%s", err);
  prov_config_t nosuch = {
      .name = "shm+nosuchprov", .rank = 0, .nranks = 2, .job_id = "x", .host_of = host_of};
  cr_assert_neq(prov_open(&nosuch, &p, err, sizeof(err)), 0);
  cr_assert(strstr(err, "nosuchprov"), "%s", err);
  cr_assert_null(p);

  /* an address that is not ours is refused by add_peers */
  open_job("shm+tcp", host_of, 2);
  const char junk[16] = "not an address";
  const void *addrs[2] = {junk, junk};
  size_t lens[2] = {sizeof(junk), sizeof(junk)};
  prov_config_t cfg = {
      .name = "shm+tcp", .rank = 0, .nranks = 2, .job_id = "y", .host_of = host_of};
  cr_assert_eq(prov_open(&cfg, &p, err, sizeof(err)), 0, "%s", err);
  cr_assert_eq(p->ops->add_peers(p, addrs, lens, 2), -EINVAL);
  cr_assert(strstr(p->last_error, "not a chorus"), "%s", p->last_error);
  pt_op_t t;
  pt_op_init(&t);
  cr_assert_eq(p->ops->post_send(p, 1, junk, 1, 1, &t.op), -EINVAL, "post before add_peers");
  p->ops->close(p);
}
