/*
 * test_ofi.c - the libfabric transport over shm, tcp (tcp;ofi_rxm), udp
 * (udp;ofi_rxd) and sockets, all on this host: loopback only.
 *
 * Every provider runs the same checks (OFI_TESTS below): message sizes
 * around the inject/CMA switch and large ones in mixed order, truncation,
 * cancel, wake-ups through wait_fd(), -EAGAIN with full queues, close with
 * posted operations, open/close cycles without leaks (200; 50 over tcp, whose
 * endpoint costs ~0.2 s to open and close: rxm's bounce buffers), and two processes
 * that sleep on their wait fd between rounds.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mp.h"
#include "prov_internal.h"
#include "prov_test.h"

#define MIB (1024 * 1024)

static prov_t *eps[2];

static void setup(void) {
  /* ctest sets these; a direct run must stay on loopback too. */
  setenv("FI_TCP_IFACE", "lo", 0);
  setenv("FI_UDP_IFACE", "lo", 0);
  setenv("FI_SOCKETS_IFACE", "lo", 0);
}

static void teardown(void) {
  pt_close_job(eps, 2);
}

TestSuite(ofi, .init = setup, .fini = teardown, .timeout = 120);

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);

  cr_assert_not_null(p);
  return p;
}

static void open_pair(const char *name) {
  char err[256] = "";
  int rc = pt_open_job(name, NULL, 2, eps, err, sizeof(err));

  cr_assert_eq(rc, 0, "open %s: %d %s", name, rc, err);
}

/* Timeouts scale with the provider: udp (rxd) moves 16 MiB slowly. */
static double slow(const char *name) {
  return strcmp(name, "udp") == 0 ? 6.0 : 1.0;
}

/* ---- what each provider is expected to be ---- */

static void check_open(const char *name, const char *prov_name, bool has_fd) {
  open_pair(name);
  for (int i = 0; i < 2; i++) {
    cr_assert_str_eq(eps[i]->name, prov_name);
    cr_assert_gt(eps[i]->ops->max_posted(eps[i]), 16);
    cr_assert_leq(eps[i]->ops->max_posted(eps[i]), 1024);
    if (has_fd)
      cr_assert_geq(eps[i]->ops->wait_fd(eps[i]), 0, "%s gives a wait fd", name);
    else
      cr_assert_eq(eps[i]->ops->wait_fd(eps[i]), -1, "%s has no wait object", name);
  }
  cr_log_info("%s: provider %s, max_posted %zu, wait_fd %d", name, eps[0]->name,
              eps[0]->ops->max_posted(eps[0]), eps[0]->ops->wait_fd(eps[0]));
}

/* ---- data: sizes around 4 KiB (inject / CMA) and large, both ways ---- */

static void check_sizes(const char *name) {
  static const size_t sizes[] = {0, 1, 4096, 4097, MIB, 16 * MIB};
  enum { N = sizeof(sizes) / sizeof(sizes[0]) };
  static const int order[N] = {5, 0, 3, 1, 4, 2};
  static pt_op_t s[2][N], r[2][N]; /* static: a failed test's teardown still completes them */
  pt_op_t *all[4 * N];
  int k = 0;

  open_pair(name);
  for (int d = 0; d < 2; d++) {
    for (int i = 0; i < N; i++) {
      pt_op_init(&s[d][i]);
      pt_op_init(&r[d][i]);
      s[d][i].buf = xmalloc(sizes[i]);
      r[d][i].buf = xmalloc(sizes[i]);
      pt_fill(s[d][i].buf, sizes[i], 100 * d + i);
      memset(r[d][i].buf, 0xee, sizes[i]);
      s[d][i].op.data = 0x0123456789abcdefULL ^ (uint64_t)(d * N + i); /* immediate data */
      all[k++] = &s[d][i];
      all[k++] = &r[d][i];
    }
  }
  /* d = 0: rank 0 -> rank 1. Receives with even i are posted before the
   * sends, odd ones after; sends go out in a mixed order. */
  for (int d = 0; d < 2; d++)
    for (int i = 0; i < N; i += 2)
      cr_assert_eq(pt_recv(eps, 2, eps[1 - d], d, &r[d][i], sizes[i], 0x5000 + i, 5000), 0);
  for (int j = 0; j < N; j++)
    for (int d = 0; d < 2; d++) {
      int i = order[j];

      cr_assert_eq(pt_send(eps, 2, eps[d], 1 - d, &s[d][i], sizes[i], 0x5000 + i, 5000), 0,
                   "send %zu: %s", sizes[i], eps[d]->last_error);
    }
  for (int d = 0; d < 2; d++)
    for (int i = 1; i < N; i += 2)
      cr_assert_eq(pt_recv(eps, 2, eps[1 - d], d, &r[d][i], sizes[i], 0x5000 + i, 5000), 0);
  cr_assert(pt_drive(eps, 2, all, 4 * N, 30000 * slow(name)), "not all completed");
  for (int d = 0; d < 2; d++) {
    for (int i = 0; i < N; i++) {
      cr_assert_eq(s[d][i].calls, 1);
      cr_assert_eq(r[d][i].calls, 1);
      cr_assert_eq(s[d][i].status, 0, "send %zu: %d %s", sizes[i], s[d][i].status,
                   eps[d]->last_error);
      cr_assert_eq(r[d][i].status, 0, "recv %zu: %d %s", sizes[i], r[d][i].status,
                   eps[1 - d]->last_error);
      cr_assert_eq(s[d][i].len, sizes[i]);
      cr_assert_eq(r[d][i].len, sizes[i]);
      cr_assert_eq(pt_check(r[d][i].buf, sizes[i], 100 * d + i), (size_t)-1, "size %zu: wrong data",
                   sizes[i]);
      /* The sockets provider (deprecated upstream) sometimes completes a
       * large message that arrived before its receive without its remote
       * CQ data: then the data is absent, never wrong (the engine skips
       * the fingerprint check of such a message). */
      uint64_t want = PROV_DATA_VALID | (0x0123456789abcdefULL ^ (uint64_t)(d * N + i));
      bool absent_ok = strcmp(name, "sockets") == 0 && r[d][i].op.data == 0;
      cr_assert(r[d][i].op.data == want || absent_ok, "size %zu: immediate data %#llx", sizes[i],
                (unsigned long long)r[d][i].op.data);
      free(s[d][i].buf);
      free(r[d][i].buf);
    }
  }
}

/* Same tag, full 64 bits, distinct only in the top bits. */
static void check_tags(const char *name) {
  static pt_op_t s[3], r[3];
  pt_op_t *all[6];
  uint64_t tags[3] = {0xffffffffffffffffull, 0x7fffffffffffffffull, 0x8000000000000001ull};
  static int vals[3] = {1, 2, 3}, got[3];

  open_pair(name);
  for (int i = 0; i < 3; i++) {
    pt_op_init(&s[i]);
    pt_op_init(&r[i]);
    s[i].buf = &vals[i];
    r[i].buf = &got[i];
    all[i] = &s[i];
    all[3 + i] = &r[i];
    cr_assert_eq(pt_recv(eps, 2, eps[1], 0, &r[i], sizeof(int), tags[2 - i], 1000), 0);
  }
  for (int i = 0; i < 3; i++)
    cr_assert_eq(pt_send(eps, 2, eps[0], 1, &s[i], sizeof(int), tags[i], 1000), 0);
  cr_assert(pt_drive(eps, 2, all, 6, 10000));
  cr_assert_eq(got[0], 3);
  cr_assert_eq(got[1], 2);
  cr_assert_eq(got[2], 1);
}

static void check_truncation(const char *name) {
  static pt_op_t s, r;
  pt_op_t *all[2] = {&s, &r};
  static char a[100], b[10];

  open_pair(name);
  pt_op_init(&s);
  pt_op_init(&r);
  s.buf = a;
  r.buf = b;
  pt_fill(a, sizeof(a), 9);
  cr_assert_eq(pt_recv(eps, 2, eps[1], 0, &r, sizeof(b), 0x77, 1000), 0);
  cr_assert_eq(pt_send(eps, 2, eps[0], 1, &s, sizeof(a), 0x77, 1000), 0);
  cr_assert(pt_drive(eps, 2, all, 2, 10000));
  cr_assert_eq(r.calls, 1);
  if (strcmp(name, "udp") == 0) {
    cr_assert_eq(pt_check(b, sizeof(b), 9), (size_t)-1, "the part that fits arrives");
    /* Measured: rxd (libfabric 1.17) reports a truncated receive as a
     * success of the buffer's length. Pinned here so a change shows. */
    cr_assert_eq(r.status, 0, "udp now reports truncation (%d): update this test", r.status);
    cr_assert_eq(r.len, sizeof(b));
    cr_log_info("NOTE: udp;ofi_rxd does not report truncation: a short receive looks like success");
    return;
  }
  cr_assert_eq(r.status, -EMSGSIZE, "truncated receive: %d", r.status);
  cr_assert_neq(eps[1]->last_error[0], '\0', "the failure is described");
  cr_log_info("%s truncation: %s", name, eps[1]->last_error);
}

static void check_cancel(const char *name) {
  static pt_op_t r, s2, r2;
  pt_op_t *one[1] = {&r}, *two[2] = {&s2, &r2};
  static char buf[16], a = 'z', b;

  open_pair(name);
  pt_op_init(&r);
  r.buf = buf;
  cr_assert_eq(pt_recv(eps, 2, eps[1], 0, &r, sizeof(buf), 0x99, 1000), 0);
  cr_assert_eq(eps[1]->ops->cancel(eps[1], &r.op), 0);
  cr_assert(pt_drive(eps, 2, one, 1, 5000), "canceled receive never completed");
  cr_assert_eq(r.calls, 1);
  cr_assert_eq(r.status, -ECANCELED, "status %d", r.status);
  cr_assert_eq(eps[1]->ops->cancel(eps[1], &r.op), -ENOENT);
  /* The endpoint goes on working; the canceled receive takes nothing. */
  pt_op_init(&s2);
  pt_op_init(&r2);
  s2.buf = &a;
  r2.buf = &b;
  cr_assert_eq(pt_send(eps, 2, eps[0], 1, &s2, 1, 0x99, 1000), 0);
  cr_assert_eq(pt_recv(eps, 2, eps[1], 0, &r2, 1, 0x99, 1000), 0);
  cr_assert(pt_drive(eps, 2, two, 2, 10000));
  cr_assert_eq(r2.status, 0);
  cr_assert_eq(b, 'z');
  cr_assert_eq(r.calls, 1);
}

/* Many messages sent before any receive, received in the reverse order:
 * the transport keeps every unexpected one, small and large, and a receive
 * is not held up behind messages that arrived before its own. An engine
 * run may wait on its peer's later message (another call, another
 * communicator on the endpoint) before posting the receive of an earlier
 * one. (libfabric 1.17's `net` provider fails this: it holds a
 * connection's later messages behind one that came before its receive.) */
static void check_unexpected_reverse(const char *name) {
  enum { N = 48 };
  static pt_op_t s[N], r[N];
  pt_op_t *all[2 * N];
  size_t len[N];

  open_pair(name);
  for (int i = 0; i < N; i++) {
    len[i] = i % 8 == 7 ? MIB + (size_t)i : (size_t)(i * 997 % 40000);
    pt_op_init(&s[i]);
    pt_op_init(&r[i]);
    s[i].buf = xmalloc(len[i]);
    r[i].buf = xmalloc(len[i]);
    pt_fill(s[i].buf, len[i], (uint64_t)i);
    s[i].op.data = 0x5eed0000u + (uint64_t)i;
    all[2 * i] = &s[i];
    all[2 * i + 1] = &r[i];
    cr_assert_eq(pt_send(eps, 2, eps[0], 1, &s[i], len[i], 0x7000u + (unsigned)i, 5000), 0,
                 "send %d: %s", i, eps[0]->last_error);
  }
  for (int k = 0; k < 200; k++) { /* let them arrive: all unexpected */
    eps[0]->ops->progress(eps[0]);
    eps[1]->ops->progress(eps[1]);
  }
  for (int i = N - 1; i >= 0; i--) {
    pt_op_t *one[1] = {&r[i]};

    cr_assert_eq(pt_recv(eps, 2, eps[1], 0, &r[i], len[i], 0x7000u + (unsigned)i, 5000), 0);
    cr_assert(pt_drive(eps, 2, one, 1, 20000 * slow(name)),
              "receive %d (%zu B) did not complete while %d earlier messages wait", i, len[i], i);
  }
  cr_assert(pt_drive(eps, 2, all, 2 * N, 30000 * slow(name)), "not all completed");
  for (int i = 0; i < N; i++) {
    cr_assert_eq(s[i].status, 0, "send %d: %d", i, s[i].status);
    cr_assert_eq(r[i].status, 0, "recv %d: %d", i, r[i].status);
    cr_assert_eq(r[i].len, len[i]);
    cr_assert_eq(pt_check(r[i].buf, len[i], (uint64_t)i), (size_t)-1, "message %d: wrong data", i);
    bool absent_ok = strcmp(name, "sockets") == 0 && r[i].op.data == 0;
    cr_assert(r[i].op.data == (PROV_DATA_VALID | (0x5eed0000u + (uint64_t)i)) || absent_ok,
              "message %d: immediate data %#llx", i, (unsigned long long)r[i].op.data);
    free(s[i].buf);
    free(r[i].buf);
  }
}

/* arm() then a send from the peer makes wait_fd readable. */
static void check_wakeup(const char *name) {
  static pt_op_t s, r;
  pt_op_t *all[2] = {&s, &r};
  size_t big = MIB;
  char *a = xmalloc(big), *b = xmalloc(big);
  int rc;

  open_pair(name);
  /* Rings alone must do it: the backstop timer would hide a missing one. */
  prov_ofi_test_no_backstop(eps[0]);
  prov_ofi_test_no_backstop(eps[1]);
  pt_fill(a, big, 4);
  /* 0. Connect: a first send may need the peer to progress (shm, rxm). */
  pt_op_init(&s);
  pt_op_init(&r);
  s.buf = a;
  r.buf = b;
  cr_assert_eq(pt_recv(eps, 2, eps[1], 0, &r, 64, 0x0f, 1000), 0);
  cr_assert_eq(pt_send(eps, 2, eps[0], 1, &s, 64, 0x0f, 5000), 0);
  cr_assert(pt_drive(eps, 2, all, 2, 5000));
  /* 1. A small message wakes an armed receiver. */
  for (int round = 0; round < 2; round++) {
    pt_op_init(&s);
    pt_op_init(&r);
    s.buf = a;
    r.buf = b;
    cr_assert_eq(pt_recv(eps, 2, eps[1], 0, &r, 64, 0x10 + round, 1000), 0);
    /* Rings left over from connecting may wake it once, not forever. */
    cr_assert(pt_arm(eps[1], 5000), "arm() never returned 0");
    eps[1]->ops->disarm(eps[1]);
    cr_assert(pt_arm(eps[1], 5000), "arm() never returned 0");
    rc = pt_poll_fd(eps[1], 200);
    cr_assert_eq(rc, 0, "wait fd readable while idle: the loop would spin");
    cr_assert_eq(pt_send(eps, 1, eps[0], 1, &s, 64, 0x10 + round, 5000), 0);
    rc = pt_poll_fd(eps[1], 5000);
    cr_assert_eq(rc, 1, "round %d: armed receiver not woken by a message", round);
    eps[1]->ops->disarm(eps[1]);
    cr_assert(pt_drive(eps, 2, all, 2, 5000));
    cr_assert_eq(pt_check(b, 64, 4), (size_t)-1);
  }
  /* 2. A large send needs the receiver, and the receiver may need the sender
   * (rendezvous, segmentation): the sender progresses only when arm() says
   * so or its fd wakes it; the receiver spins. A lost wake-up hangs. */
  pt_op_init(&s);
  pt_op_init(&r);
  s.buf = a;
  r.buf = b;
  memset(b, 0, big);
  eps[0]->ops->disarm(eps[0]); /* drop rings left over from connecting */
  cr_assert_eq(pt_recv(eps, 1, eps[1], 0, &r, big, 0x20, 5000), 0);
  cr_assert_eq(pt_send(eps, 1, eps[0], 1, &s, big, 0x20, 5000), 0);
  {
    /* Asleep before the receiver looks at the message. */
    bool armed = pt_arm(eps[0], 5000);
    int wakes = 0;

    for (double end = pt_now_ms() + 20000; !(r.calls && s.calls) && pt_now_ms() < end;) {
      eps[1]->ops->progress(eps[1]);
      if (!armed) {
        if (eps[0]->ops->arm(eps[0]) == 0)
          armed = true;
        else
          eps[0]->ops->progress(eps[0]);
      } else if (pt_poll_fd(eps[0], 0) == 1) {
        wakes++;
        eps[0]->ops->disarm(eps[0]);
        armed = false;
        eps[0]->ops->progress(eps[0]);
      }
    }
    if (armed)
      eps[0]->ops->disarm(eps[0]);
    cr_assert_eq(r.calls, 1, "receiver did not get the large message (sender woken %d times)",
                 wakes);
    cr_assert_eq(s.calls, 1, "sleeping sender never completed (woken %d times)", wakes);
    cr_log_info("%s: 1 MiB to a sleeping sender: woken %d times", name, wakes);
  }
  cr_assert_eq(s.status, 0);
  cr_assert_eq(r.status, 0);
  cr_assert_eq(pt_check(b, big, 4), (size_t)-1);
  free(a);
  free(b);
}

/* More messages than the queues hold: posts say -EAGAIN, retries after
 * progress get everything through, intact and matched by tag. */
static void check_eagain(const char *name) {
  size_t max, n;
  pt_op_t *s, *r, **all, extra;
  uint32_t *out, *in;
  int eagain = 0, rc;

  open_pair(name);
  max = eps[1]->ops->max_posted(eps[1]);
  n = 4 * max;
  s = calloc(n, sizeof(*s));
  r = calloc(n, sizeof(*r));
  all = calloc(2 * n, sizeof(*all));
  out = calloc(n, sizeof(*out));
  in = calloc(n, sizeof(*in));
  /* The pool: max_posted receives, then -EAGAIN. */
  for (size_t i = 0; i < max; i++) {
    pt_op_init(&r[i]);
    r[i].buf = &in[i];
    cr_assert_eq(eps[1]->ops->post_recv(eps[1], 0, &in[i], 4, i, &r[i].op), 0, "recv %zu", i);
  }
  pt_op_init(&extra);
  rc = eps[1]->ops->post_recv(eps[1], 0, &in[0], 4, n, &extra.op);
  cr_assert_eq(rc, -EAGAIN, "receive past max_posted: %d", rc);
  for (size_t i = 0; i < n; i++) {
    pt_op_init(&s[i]);
    out[i] = (uint32_t)(i * 2654435761u);
    s[i].buf = &out[i];
    all[2 * i] = &s[i];
    all[2 * i + 1] = &r[i];
  }
  /* Sends and the remaining receives interleaved, retrying on -EAGAIN. */
  for (size_t i = 0, j = max; i < n || j < n;) {
    if (i < n) {
      rc = eps[0]->ops->post_send(eps[0], 1, &out[i], 4, i, &s[i].op);
      if (rc == 0)
        i++;
      else
        cr_assert_eq(rc, -EAGAIN, "send %zu: %d %s", i, rc, eps[0]->last_error);
      eagain += rc == -EAGAIN;
    }
    if (j < n) {
      pt_op_init(&r[j]);
      rc = eps[1]->ops->post_recv(eps[1], 0, &in[j], 4, j, &r[j].op);
      if (rc == 0)
        j++;
      else
        cr_assert_eq(rc, -EAGAIN, "recv %zu: %d", j, rc);
      eagain += rc == -EAGAIN;
    }
    eps[0]->ops->progress(eps[0]);
    eps[1]->ops->progress(eps[1]);
  }
  cr_assert(pt_drive(eps, 2, all, 2 * (int)n, 60000 * slow(name)), "not all completed");
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(s[i].status, 0);
    cr_assert_eq(r[i].status, 0, "recv %zu: %d", i, r[i].status);
    cr_assert_eq(in[i], (uint32_t)(i * 2654435761u), "message %zu", i);
  }
  cr_assert_gt(eagain, 0, "never saw -EAGAIN");
  cr_log_info("%s: %zu messages with max_posted %zu, %d -EAGAIN", name, n, max, eagain);
  free(s);
  free(r);
  free(all);
  free(out);
  free(in);
}

static void check_close_with_posted(const char *name) {
  static pt_op_t r[4], s;
  static char buf[4][8];
  char *big = xmalloc(4 * MIB);

  open_pair(name);
  for (int i = 0; i < 4; i++) {
    pt_op_init(&r[i]);
    r[i].buf = buf[i];
    cr_assert_eq(pt_recv(eps, 2, eps[0], 1, &r[i], 8, 0x300 + i, 1000), 0);
  }
  pt_op_init(&s);
  s.buf = big;
  /* Nobody receives it: it can not complete by itself. */
  cr_assert_eq(pt_send(eps, 2, eps[0], 1, &s, 4 * MIB, 0x400, 1000), 0);
  for (int i = 0; i < 20; i++) {
    eps[0]->ops->progress(eps[0]);
    eps[1]->ops->progress(eps[1]);
  }
  eps[0]->ops->close(eps[0]);
  eps[0] = NULL;
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(r[i].calls, 1, "receive %d: callback ran %d times", i, r[i].calls);
    cr_assert_eq(r[i].status, -ECANCELED);
  }
  cr_assert_eq(s.calls, 1, "send: callback ran %d times", s.calls);
  cr_assert(s.status == -ECANCELED || s.status == 0, "send status %d", s.status);
  free(big);
}

/* Files of this process in /dev/shm (the regions Chorus names
 * "chorus-<pid>-...", and libfabric's own names, "<pid>:<uid>:<n>"); other
 * processes on the host may come and go meanwhile. */
static int my_dev_shm_files(void) {
  char prefix[32], ours[32];
  DIR *d = opendir("/dev/shm");
  struct dirent *e;
  int n = 0;

  cr_assert_not_null(d);
  snprintf(prefix, sizeof(prefix), "%d:", (int)getpid());
  snprintf(ours, sizeof(ours), "chorus-%d-", (int)getpid());
  while ((e = readdir(d)))
    n += strncmp(e->d_name, prefix, strlen(prefix)) == 0 ||
         strncmp(e->d_name, ours, strlen(ours)) == 0;
  closedir(d);
  return n;
}

static void check_cycles(const char *name) {
  int fds, shm, cycles = strcmp(name, "tcp") == 0 ? 50 : 200;

  /* The first open loads libfabric's providers for good. */
  open_pair(name);
  pt_close_job(eps, 2);
  fds = mp_count_fds();
  shm = my_dev_shm_files();
  cr_assert_eq(shm, 0);
  for (int c = 0; c < cycles; c++) {
    static pt_op_t s, r;
    pt_op_t *all[2] = {&s, &r};
    static char a, b;

    a = (char)c;
    b = 0;

    open_pair(name);
    pt_op_init(&s);
    pt_op_init(&r);
    s.buf = &a;
    r.buf = &b;
    cr_assert_eq(pt_recv(eps, 2, eps[1], 0, &r, 1, 1, 1000), 0);
    cr_assert_eq(pt_send(eps, 2, eps[0], 1, &s, 1, 1, 5000), 0);
    cr_assert(pt_drive(eps, 2, all, 2, 10000), "cycle %d", c);
    cr_assert_eq(b, (char)c);
    pt_close_job(eps, 2);
    cr_assert_eq(mp_count_fds(), fds, "cycle %d leaks descriptors", c);
    cr_assert_eq(my_dev_shm_files(), 0, "cycle %d leaves files in /dev/shm", c);
  }
  cr_assert_eq(mp_count_fds(), fds);
  cr_assert_eq(my_dev_shm_files(), 0, "files left in /dev/shm");
}

/* ---- two processes, each sleeping on its own wait fd between rounds ---- */

static const size_t xp_sizes[] = {0, 1, 4096, 4097, 65536, MIB, 16 * MIB};
enum { XP_N = sizeof(xp_sizes) / sizeof(xp_sizes[0]), XP_ROUNDS = 3 };

static int xp_rank(const char *name, int rank, int sock) {
  pt_op_t s[XP_N], r[XP_N], *all[2 * XP_N];
  char err[256];
  prov_t *p;
  int lost = 0, bad = 0, peer = 1 - rank;

  if (pt_open_peer(name, "xp", rank, sock, &p, err, sizeof(err))) {
    fprintf(stderr, "rank %d: open: %s\n", rank, err);
    return 1;
  }
  for (int round = 0; round < XP_ROUNDS; round++) {
    for (int i = 0; i < XP_N; i++) {
      pt_op_init(&s[i]);
      pt_op_init(&r[i]);
      s[i].buf = malloc(xp_sizes[i] + 1);
      r[i].buf = malloc(xp_sizes[i] + 1);
      pt_fill(s[i].buf, xp_sizes[i], (uint64_t)(rank * 100 + round * 10 + i));
      all[2 * i] = &s[i];
      all[2 * i + 1] = &r[i];
    }
    /* Rank 0 posts its receives first, rank 1 its sends first. */
    for (int k = 0; k < 2; k++) {
      for (int i = 0; i < XP_N; i++) {
        int rc = (k == rank)
                     ? pt_recv(&p, 1, p, peer, &r[i], xp_sizes[i], (uint64_t)round << 8 | i, 20000)
                     : pt_send(&p, 1, p, peer, &s[i], xp_sizes[i], (uint64_t)round << 8 | i, 20000);
        if (rc) {
          fprintf(stderr, "rank %d: post: %d %s\n", rank, rc, p->last_error);
          return 5;
        }
      }
    }
    if (!pt_sleepy_drive(p, all, 2 * XP_N, 60000, 10000, &lost)) {
      fprintf(stderr, "rank %d round %d: not all completed\n", rank, round);
      return 6;
    }
    for (int i = 0; i < XP_N; i++) {
      size_t at = r[i].status || r[i].len != xp_sizes[i]
                      ? 0
                      : pt_check(r[i].buf, xp_sizes[i], (uint64_t)(peer * 100 + round * 10 + i));

      if (s[i].status || r[i].status || r[i].len != xp_sizes[i] || at != (size_t)-1) {
        fprintf(stderr,
                "rank %d round %d: %zu bytes: send status %d, receive status %d, length %zu, "
                "first wrong byte %zd\n",
                rank, round, xp_sizes[i], s[i].status, r[i].status, r[i].len,
                at == (size_t)-1 ? (ssize_t)-1 : (ssize_t)at);
        bad++;
      }
      free(s[i].buf);
      free(r[i].buf);
    }
  }
  /* Both done before either closes. */
  if (write(sock, "x", 1) != 1 || read(sock, err, 1) != 1)
    return 7;
  p->ops->close(p);
  if (bad || lost)
    fprintf(stderr, "rank %d: %d bad messages, %d lost wake-ups\n", rank, bad, lost);
  return bad ? 8 : lost ? 9 : 0;
}

static void check_two_processes(const char *name) {
  int sv[2], st;
  pid_t pid;
  int rc;

  cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  fflush(NULL);
  pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(sv[0]);
    _exit(xp_rank(name, 1, sv[1]));
  }
  close(sv[1]);
  rc = xp_rank(name, 0, sv[0]);
  close(sv[0]);
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert_eq(rc, 0, "rank 0 failed (%d)", rc);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank 1 failed (%d)", WEXITSTATUS(st));
}

/* ---- the matrix ---- */

#define OFI_TESTS(suite, cfg_name, prov_name, has_fd)                                              \
  Test(suite, open) {                                                                              \
    check_open(cfg_name, prov_name, has_fd);                                                       \
  }                                                                                                \
  Test(suite, sizes_mixed_order) {                                                                 \
    check_sizes(cfg_name);                                                                         \
  }                                                                                                \
  Test(suite, full_64bit_tags) {                                                                   \
    check_tags(cfg_name);                                                                          \
  }                                                                                                \
  Test(suite, unexpected_reverse_order) {                                                          \
    check_unexpected_reverse(cfg_name);                                                            \
  }                                                                                                \
  Test(suite, truncation) {                                                                        \
    check_truncation(cfg_name);                                                                    \
  }                                                                                                \
  Test(suite, cancel_recv) {                                                                       \
    check_cancel(cfg_name);                                                                        \
  }                                                                                                \
  Test(suite, eagain_and_retry) {                                                                  \
    check_eagain(cfg_name);                                                                        \
  }                                                                                                \
  Test(suite, close_runs_callbacks) {                                                              \
    check_close_with_posted(cfg_name);                                                             \
  }                                                                                                \
  Test(suite, open_close_cycles, .timeout = 300) {                                                 \
    check_cycles(cfg_name);                                                                        \
  }                                                                                                \
  Test(suite, two_processes_sleeping) {                                                            \
    check_two_processes(cfg_name);                                                                 \
  }

TestSuite(ofi_shm, .init = setup, .fini = teardown, .timeout = 120);
TestSuite(ofi_tcp, .init = setup, .fini = teardown, .timeout = 120);
TestSuite(ofi_udp, .init = setup, .fini = teardown, .timeout = 240);
TestSuite(ofi_sockets, .init = setup, .fini = teardown, .timeout = 120);
TestSuite(sock, .init = setup, .fini = teardown, .timeout = 120);

OFI_TESTS(ofi_shm, "shm", "shm", true)
OFI_TESTS(ofi_tcp, "tcp", "tcp;ofi_rxm", true)
OFI_TESTS(ofi_udp, "udp", "udp;ofi_rxd", false)
OFI_TESTS(ofi_sockets, "sockets", "sockets", true)
OFI_TESTS(sock, "sock", "sock", true)

/* Kills a child holding 512 MiB and looks at it until it is a zombie:
 * returns how many looks found it gone while /proc, read right after the
 * look, still showed it alive or exiting; *looks: all the looks. */
static int look_at_a_killed_child(int *looks) {
  int pfd[2];
  cr_assert_eq(pipe(pfd), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    size_t len = (size_t)512 << 20;
    void *m =
        mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    char ok = m != MAP_FAILED;
    if (write(pfd[1], &ok, 1) != 1)
      _exit(1);
    for (;;)
      pause();
  }
  char ok = 0;
  cr_assert_eq(read(pfd[0], &ok, 1), 1);
  close(pfd[0]);
  close(pfd[1]);
  cr_assert(ok, "the child could not map 512 MiB");
  cr_assert(!prov_ofi_test_pid_dead(pid), "a live process counted as gone");
  cr_assert_eq(kill(pid, SIGKILL), 0);
  int early = 0;
  *looks = 0;
  for (char st = mp_proc_state(pid); st && st != 'Z' && st != 'X' && *looks < 10000000;
       (*looks)++) {
    bool dead = prov_ofi_test_pid_dead(pid);
    st = mp_proc_state(pid); /* after the look: not a zombie during it */
    if (dead && st && st != 'Z' && st != 'X')
      early++;
  }
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  cr_assert(prov_ofi_test_pid_dead(pid), "a reaped process not counted as gone");
  return early;
}

/* A peer killed on this host counts as gone (comm_free then removes its shm
 * region) from the moment it is on its way out, not only once it is a
 * zombie: the kernel takes a killed process's memory apart first, which
 * under a sanitizer takes long enough for the survivors to have looked and
 * left the region behind (faults::matrix, kill/bcast/shm: "1 /dev/shm files
 * left"). Some look must find a killed child gone before it is a zombie; up
 * to 5 children, since on a loaded machine this thread may not run at all
 * between the kill and the zombie (without the change no look ever does). */
Test(ofi_shm, a_killed_peer_is_gone_before_it_is_a_zombie) {
  int early = 0, looks = 0, all = 0;
  for (int tries = 0; tries < 5 && !early; tries++) {
    early = look_at_a_killed_child(&looks);
    all += looks;
  }
  cr_assert_gt(early, 0,
               "%d looks at 5 killed children before they were zombies: none found one gone", all);
}

Test(ofi_shm, wakeup) {
  check_wakeup("shm");
}

/* Without CMA (as under Yama ptrace_scope=1) shm moves large messages in
 * segments, turn by turn: sleepers must still get them through. */
Test(ofi_shm, two_processes_sleeping_without_cma) {
  setenv("FI_SHM_DISABLE_CMA", "1", 1);
  check_two_processes("shm");
}

Test(ofi_tcp, wakeup) {
  check_wakeup("tcp");
}

Test(ofi_sockets, wakeup) {
  check_wakeup("sockets");
}

Test(sock, wakeup) {
  check_wakeup("sock");
}

Test(ofi, unknown_provider_is_a_clear_error) {
  prov_config_t cfg = {.name = "no-such-provider", .rank = 0, .nranks = 1};
  char err[256] = "";
  prov_t *p = (prov_t *)0x1;
  int rc = prov_open(&cfg, &p, err, sizeof(err));

  cr_assert_lt(rc, 0);
  cr_assert_null(p);
  cr_assert(strstr(err, "no-such-provider"), "reason names the provider: %s", err);
}

Test(ofi, post_before_add_peers_is_refused) {
  prov_config_t cfg = {.name = "shm", .rank = 0, .nranks = 2, .job_id = "x"};
  char err[256] = "", c = 0;
  pt_op_t t;

  cr_assert_eq(prov_open(&cfg, &eps[0], err, sizeof(err)), 0, "%s", err);
  pt_op_init(&t);
  cr_assert_eq(eps[0]->ops->post_recv(eps[0], 1, &c, 1, 1, &t.op), -EINVAL);
  cr_assert_eq(t.calls, 0);
}

/* udp;ofi_rxd's window must fit the socket's receive buffer, or packets are
 * dropped and resent by the thousand (and rxd 1.17 then completed large
 * receives short under load: a CI failure of two_processes_sleeping). The
 * endpoint's socket asks for 4 MiB (the kernel grants up to rmem_max,
 * doubled) and the window holds four peers' worth of 8 KiB packets in it,
 * and is no more than 16 (rxd stalled with 128 under load). */
/* Older kernels hide net.core in a network namespace other than the
 * first: then, as the library does, Linux's default. */
static long sysctl_long(const char *path) {
  FILE *f = fopen(path, "r");
  long v = 212992;

  if (!f)
    return v;
  cr_assert_eq(fscanf(f, "%ld", &v), 1);
  fclose(f);
  return v;
}

static int udp_rcvbuf_of_port(uint16_t port) {
  DIR *d = opendir("/proc/self/fd");
  int found = -1;

  cr_assert_not_null(d);
  for (struct dirent *e; (e = readdir(d));) {
    int fd = atoi(e->d_name), type = 0, size = 0;
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa), tl = sizeof(type), zl = sizeof(size);

    if (fd > 2 && getsockname(fd, (struct sockaddr *)&sa, &sl) == 0 && sa.sin_family == AF_INET &&
        ntohs(sa.sin_port) == port && getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0 &&
        type == SOCK_DGRAM && getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, &zl) == 0)
      found = size;
  }
  closedir(d);
  return found;
}

/* The endpoint's socket asks for a buffer of OFI_UDP_RCVBUF. With one peer
 * rxd keeps its own window (FI_OFI_RXD_MAX_UNACKED unset); past two ranks
 * the window is what the buffer holds for four peers, 8 to 16 packets. */
Test(ofi_udp, window_fits_the_socket_buffer) {
  unsigned char addr[512];
  size_t len = sizeof(addr);
  prov_ofi_test_addr_t a;
  struct sockaddr_in sin;
  long max = sysctl_long("/proc/sys/net/core/rmem_max");
  long dflt = sysctl_long("/proc/sys/net/core/rmem_default");
  long want = 2 * (max < (4 << 20) ? max : (4 << 20));

  if (want < dflt)
    want = dflt;
  unsetenv("FI_OFI_RXD_MAX_UNACKED");
  open_pair("udp");
  cr_assert_eq(eps[0]->ops->getname(eps[0], addr, &len), 0);
  cr_assert_eq(prov_ofi_test_addr_decode(addr, len, false, &a), 0);
  cr_assert_geq(a.fab_len, sizeof(sin));
  memcpy(&sin, a.fab, sizeof(sin));
  cr_assert_eq(sin.sin_family, AF_INET);
  int got = udp_rcvbuf_of_port(ntohs(sin.sin_port));
  cr_assert_geq(got, want, "the endpoint's socket holds %d bytes, %ld expected (rmem_max %ld)", got,
                want, max);
  cr_assert_null(getenv("FI_OFI_RXD_MAX_UNACKED"), "a pair's window is set to %s, not rxd's own",
                 getenv("FI_OFI_RXD_MAX_UNACKED"));
  pt_close_job(eps, 2);

  prov_t *four[4] = {NULL};
  char err[256] = "";
  int rc = pt_open_job("udp", NULL, 4, four, err, sizeof(err));
  cr_assert_eq(rc, 0, "open udp at 4 ranks: %d %s", rc, err);
  const char *w = getenv("FI_OFI_RXD_MAX_UNACKED");
  cr_assert_not_null(w, "at 4 ranks the rxd window is left at its default");
  long window = atol(w);
  pt_close_job(four, 4);
  cr_assert(window >= 8 && window <= 16, "window %ld", window);
  cr_assert_leq(window * 8192 * 4, (long)got > 8 * 8192 * 4 ? (long)got : 8 * 8192 * 4,
                "window %ld does not fit 4 peers in %d bytes", window, got);
  cr_log_info("udp: socket buffer %d bytes (rmem_max %ld), rxd window %ld packets past 2 ranks",
              got, max, window);
}

/* Fan-in past shm's receive queue. shm keeps a message that came before its
 * receive in the receiver's receive queue (256 entries here, shared with
 * the posted receives) and, once that is full, refuses every post to the
 * receiver. Rank 1 sends rank 0 messages rank 0 has not asked for yet until
 * the transport holds it back: that must happen before the queue is full, or
 * rank 2's message, which rank 0 waits for, could never be posted. Then rank
 * 0 takes rank 1's messages, newest first, rank 1 sends the rest as the
 * window opens again, and every message arrives intact. */
Test(ofi_shm, fan_in_stops_at_the_window) {
  enum { N = 2000 };
  static pt_op_t s[N], r[N], s2, r2;
  static uint64_t out[N], in[N];
  uint64_t one = 0x1234, got = 0;
  prov_t *ep3[3];
  pt_op_t *w[1] = {&r2};
  prov_ofi_rndv_stats_t st;
  char err[256] = "";
  int sent = 0, rc;

  cr_assert_eq(pt_open_job("shm", NULL, 3, ep3, err, sizeof(err)), 0, "open: %s", err);
  pt_op_init(&r2);
  r2.buf = &got;
  cr_assert_eq(ep3[0]->ops->post_recv(ep3[0], 2, &got, sizeof(got), 7, &r2.op), 0);
  for (int i = 0; i < N; i++) {
    pt_op_init(&s[i]);
    out[i] = 0xf10dull << 32 | (uint64_t)i;
    s[i].buf = &out[i];
  }
  /* as far as rank 1 may go without rank 0 taking anything */
  for (int k = 0; k < 100 && sent < N; k++) {
    while (sent < N && (rc = ep3[1]->ops->post_send(ep3[1], 0, &out[sent], sizeof(out[sent]),
                                                    0x100u + (unsigned)sent, &s[sent].op)) == 0)
      sent++;
    cr_assert(sent == N || rc == -EAGAIN, "send %d: %d %s", sent, rc, ep3[1]->last_error);
    for (int e = 0; e < 3; e++)
      ep3[e]->ops->progress(ep3[e]);
  }
  /* the queue holds 256 (OFI_SHM_QUEUE_SIZE); the windows get 96 of it */
  cr_assert_lt(sent, 128, "rank 1 sent %d messages rank 0 had not asked for", sent);
  pt_op_init(&s2);
  s2.buf = &one;
  cr_assert_eq(pt_send(ep3, 3, ep3[2], 0, &s2, sizeof(one), 7, 20000), 0,
               "rank 2's message refused after rank 1's %d (%s)", sent, ep3[2]->last_error);
  cr_assert(pt_drive(ep3, 3, w, 1, 20000), "rank 0's receive from rank 2 never completed");
  cr_assert_eq(r2.status, 0);
  cr_assert_eq(got, one);
  cr_assert_eq(prov_ofi_rndv_stats(ep3[1], &st), 0);
  cr_assert_gt(st.window_waits, 0);
  cr_log_info("shm fan-in: rank 1 held back after %d messages (%llu waits)", sent,
              (unsigned long long)st.window_waits);
  /* what came, newest first; then the rest, each sent and taken in turn */
  for (int k = 0; k < N; k++) {
    int i = k < sent ? sent - 1 - k : k;
    pt_op_t *one_op[2] = {&r[i], &s[i]};

    pt_op_init(&r[i]);
    r[i].buf = &in[i];
    if (k >= sent)
      cr_assert_eq(pt_send(ep3, 3, ep3[1], 0, &s[i], sizeof(out[i]), 0x100u + (unsigned)i, 20000),
                   0, "send %d: %s", i, ep3[1]->last_error);
    cr_assert_eq(pt_recv(ep3, 3, ep3[0], 1, &r[i], sizeof(in[i]), 0x100u + (unsigned)i, 20000), 0);
    cr_assert(pt_drive(ep3, 3, one_op, 2, 20000), "message %d never went through", i);
    cr_assert_eq(s[i].status, 0, "send %d: %d", i, s[i].status);
    cr_assert_eq(r[i].status, 0, "message %d: %d", i, r[i].status);
    cr_assert_eq(r[i].len, sizeof(in[i]));
    cr_assert_eq(in[i], out[i], "message %d: %#llx", i, (unsigned long long)in[i]);
  }
  pt_close_job(ep3, 3);
}

/* The window's shares: a spare copy (a fault's duplicate, never taken) goes
 * only while a quarter of the window is free and is then refused for good
 * (-ENOBUFS); a point-to-point send is held back (-EAGAIN) past half; a
 * collective's send still goes after both. Rank 0 takes nothing until the
 * end. 2 ranks: a window of 48. */
/* The doorbell page: bounce_done[], taken[] and ack_ring[] (written on
 * every bounced message, every receive and every ring ack) each begin a
 * cache line of their own, off the header's line, whose `sleeping` peers
 * read after every post; every array fits in what the page needs. Jobs of
 * more than 256 ranks have no ack rings. */
Test(ofi_shm, doorbell_arrays_on_lines_of_their_own) {
  static const int ns[] = {1, 2, 3, 8, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1000, 4096};

  for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
    const size_t n = (size_t)ns[k], words = (n + 63) / 64;
    size_t off[4];
    size_t need = prov_ofi_test_db_layout(ns[k], off);

    cr_assert_eq(off[0] % 64, 0, "%zu ranks: bounce_done[] at %zu", n, off[0]);
    cr_assert_eq(off[1] % 64, 0, "%zu ranks: taken[] at %zu", n, off[1]);
    cr_assert_geq(off[0], 64, "%zu ranks: bounce_done[] on the header's line", n);
    cr_assert_geq(off[0], 16 + words * 8, "%zu ranks: bounce_done[] over want[]", n);
    cr_assert_geq(off[1], off[0] + n * 4, "%zu ranks: taken[] over bounce_done[]", n);
    cr_assert_geq(off[2], off[1] + n * 4, "%zu ranks: taken_want[] over taken[]", n);
    cr_assert_eq(off[2] % 8, 0, "%zu ranks: taken_want[] at %zu", n, off[2]);
    cr_assert_geq(need, off[2] + words * 8, "%zu ranks: the page needs %zu", n, need);
    if (n > 256) {
      cr_assert_eq(off[3], 0, "%zu ranks: ack rings at %zu", n, off[3]);
      continue;
    }
    /* a ring: its head's line, then 16 entries of 16 bytes */
    cr_assert_eq(off[3] % 64, 0, "%zu ranks: ack_ring[] at %zu", n, off[3]);
    cr_assert_geq(off[3], off[2] + words * 8, "%zu ranks: ack_ring[] over taken_want[]", n);
    cr_assert_geq(need, off[3] + n * (64 + 16 * 16), "%zu ranks: the page needs %zu", n, need);
  }
}

/* Rendezvous acks (128 KiB messages: CMA) come by the receiver's ring in
 * its doorbell page, not as messages, while at most 16 are due from one
 * receiver: 24 sends posted before any receive, the first 16 are acked by
 * ring and the rest by message; once those are read the ring serves again.
 * Every message arrives intact and every send completes once. */
Test(ofi_shm, rendezvous_acks_come_by_ring_while_it_has_room) {
  enum { N = 24, MORE = 4, LEN = 128 << 10 };
  static pt_op_t s[N + MORE], r[N + MORE];
  prov_ofi_rndv_stats_t st0, st1;
  prov_t *ep[2];
  char err[256] = "";

  cr_assert_eq(pt_open_job("shm", NULL, 2, ep, err, sizeof(err)), 0, "open: %s", err);
  cr_assert_eq(prov_ofi_rndv_stats(ep[0], &st0), 0);
  for (int i = 0; i < N + MORE; i++) {
    pt_op_init(&s[i]);
    pt_op_init(&r[i]);
    s[i].buf = malloc(LEN);
    r[i].buf = malloc(LEN);
    cr_assert(s[i].buf && r[i].buf);
    pt_fill(s[i].buf, LEN, 0x5100u + (unsigned)i);
    memset(r[i].buf, 0, LEN);
  }
  for (int i = 0; i < N; i++)
    cr_assert_eq(pt_send(ep, 2, ep[1], 0, &s[i], LEN, 0x500u + (unsigned)i, 20000), 0,
                 "send %d: %s", i, ep[1]->last_error);
  for (int i = 0; i < N; i++)
    cr_assert_eq(pt_recv(ep, 2, ep[0], 1, &r[i], LEN, 0x500u + (unsigned)i, 20000), 0,
                 "receive %d: %s", i, ep[0]->last_error);
  pt_op_t *all[2 * N];
  for (int i = 0; i < N; i++) {
    all[2 * i] = &s[i];
    all[2 * i + 1] = &r[i];
  }
  cr_assert(pt_drive(ep, 2, all, 2 * N, 20000), "the %d messages never all went through", N);
  cr_assert_eq(prov_ofi_rndv_stats(ep[0], &st1), 0);
  cr_assert_eq(st1.ring_acks - st0.ring_acks, 16, "%llu of %d acked by ring",
               (unsigned long long)(st1.ring_acks - st0.ring_acks), N);
  /* one at a time: each finds the ring read and empty again */
  for (int i = N; i < N + MORE; i++) {
    pt_op_t *two[2] = {&s[i], &r[i]};
    cr_assert_eq(pt_recv(ep, 2, ep[0], 1, &r[i], LEN, 0x500u + (unsigned)i, 20000), 0);
    cr_assert_eq(pt_send(ep, 2, ep[1], 0, &s[i], LEN, 0x500u + (unsigned)i, 20000), 0);
    cr_assert(pt_drive(ep, 2, two, 2, 20000), "message %d never went through", i);
  }
  cr_assert_eq(prov_ofi_rndv_stats(ep[0], &st1), 0);
  cr_assert_eq(st1.ring_acks - st0.ring_acks, 16 + MORE);
  cr_assert_eq(st1.cma_bytes - st0.cma_bytes, (uint64_t)(N + MORE) * LEN);
  for (int i = 0; i < N + MORE; i++) {
    cr_assert_eq(s[i].calls, 1, "send %d completed %d times", i, s[i].calls);
    cr_assert_eq(r[i].calls, 1, "receive %d completed %d times", i, r[i].calls);
    cr_assert_eq(s[i].status, 0, "send %d: %d", i, s[i].status);
    cr_assert_eq(r[i].status, 0, "receive %d: %d", i, r[i].status);
    cr_assert_eq(r[i].len, (size_t)LEN);
    cr_assert_eq(pt_check(r[i].buf, LEN, 0x5100u + (unsigned)i), (size_t)-1,
                 "message %d: wrong data", i);
    free(s[i].buf);
    free(r[i].buf);
  }
  pt_close_job(ep, 2);
}

/* A rendezvous send whose ack is due by ring ends on cancel (-ECANCELED) at
 * the next progress, once. The receiver then still takes the message and
 * acks it in the ring: that late ack must not end the next send, which took
 * the same slot; that one completes on its own ack, and its data arrives. */
Test(ofi_shm, a_cancelled_send_ignores_its_late_ring_ack) {
  enum { LEN = 128 << 10 };
  static pt_op_t a, b, ra, rb;
  prov_ofi_rndv_stats_t st;
  prov_t *ep[2];
  char err[256] = "";
  void *abuf = malloc(LEN), *bbuf = malloc(LEN), *rabuf = malloc(LEN), *rbbuf = malloc(LEN);

  cr_assert(abuf && bbuf && rabuf && rbbuf);
  cr_assert_eq(pt_open_job("shm", NULL, 2, ep, err, sizeof(err)), 0, "open: %s", err);
  pt_op_init(&a);
  pt_op_init(&b);
  pt_op_init(&ra);
  pt_op_init(&rb);
  pt_fill(abuf, LEN, 0xa);
  pt_fill(bbuf, LEN, 0xb);
  a.buf = abuf;
  b.buf = bbuf;
  ra.buf = rabuf;
  rb.buf = rbbuf;
  cr_assert_eq(pt_send(ep, 2, ep[1], 0, &a, LEN, 0x600, 20000), 0, "%s", ep[1]->last_error);
  for (int k = 0; k < 20; k++)
    ep[1]->ops->progress(ep[1]);
  cr_assert_eq(a.calls, 0, "the send completed with nobody receiving it");
  cr_assert_eq(ep[1]->ops->cancel(ep[1], &a.op), 0);
  pt_op_t *one[1] = {&a};
  cr_assert(pt_drive(&ep[1], 1, one, 1, 5000), "the cancelled send never ended");
  cr_assert_eq(a.status, -ECANCELED, "cancelled send: %d", a.status);
  cr_assert_eq(pt_send(ep, 2, ep[1], 0, &b, LEN, 0x601, 20000), 0, "%s", ep[1]->last_error);
  /* the old descriptor is taken and acked first */
  cr_assert_eq(pt_recv(ep, 2, ep[0], 1, &ra, LEN, 0x600, 20000), 0);
  pt_op_t *old[1] = {&ra};
  cr_assert(pt_drive(&ep[0], 1, old, 1, 5000), "the cancelled send's message never came");
  for (int k = 0; k < 20; k++)
    ep[1]->ops->progress(ep[1]);
  cr_assert_eq(b.calls, 0, "the next send ended on the cancelled one's ack");
  cr_assert_eq(pt_recv(ep, 2, ep[0], 1, &rb, LEN, 0x601, 20000), 0);
  pt_op_t *rest[2] = {&b, &rb};
  cr_assert(pt_drive(ep, 2, rest, 2, 20000), "the next send never went through");
  cr_assert_eq(b.status, 0, "send: %d", b.status);
  cr_assert_eq(rb.status, 0, "receive: %d", rb.status);
  cr_assert_eq(pt_check(rbbuf, LEN, 0xb), (size_t)-1, "wrong data after the cancel");
  cr_assert_eq(a.calls, 1, "the cancelled send completed %d times", a.calls);
  cr_assert_eq(b.calls, 1, "the next send completed %d times", b.calls);
  cr_assert_eq(prov_ofi_rndv_stats(ep[0], &st), 0);
  cr_assert_eq(st.ring_acks, 2, "%llu ring acks", (unsigned long long)st.ring_acks);
  pt_close_job(ep, 2);
  free(abuf);
  free(bbuf);
  free(rabuf);
  free(rbbuf);
}

/* A sender reads the peer's count of the messages it took only when the
 * count it read last leaves no room: 1000 messages, each taken before the
 * next is sent, look at it once a window's worth, not once a message (that
 * took the count's cache line from the receiver on every send). */
Test(ofi_shm, the_window_is_looked_at_once_a_window) {
  enum { N = 1000 };
  static pt_op_t s[N], r[N];
  static uint64_t out[N], in[N];
  prov_ofi_rndv_stats_t st;
  prov_t *ep[2];
  char err[256] = "";

  cr_assert_eq(pt_open_job("shm", NULL, 2, ep, err, sizeof(err)), 0, "open: %s", err);
  for (int i = 0; i < N; i++) {
    pt_op_t *two[2] = {&r[i], &s[i]};

    pt_op_init(&s[i]);
    pt_op_init(&r[i]);
    out[i] = 0x7a6bull << 32 | (uint64_t)i;
    s[i].buf = &out[i];
    r[i].buf = &in[i];
    cr_assert_eq(pt_recv(ep, 2, ep[0], 1, &r[i], sizeof(in[i]), 0x100u + (unsigned)i, 20000), 0);
    cr_assert_eq(pt_send(ep, 2, ep[1], 0, &s[i], sizeof(out[i]), 0x100u + (unsigned)i, 20000), 0,
                 "send %d: %s", i, ep[1]->last_error);
    cr_assert(pt_drive(ep, 2, two, 2, 20000), "message %d never went through", i);
    cr_assert_eq(r[i].status, 0, "message %d: %d", i, r[i].status);
    cr_assert_eq(in[i], out[i], "message %d: %#llx", i, (unsigned long long)in[i]);
  }
  cr_assert_eq(prov_ofi_rndv_stats(ep[1], &st), 0);
  cr_log_info("shm window: %llu looks at the peer's count in %d messages",
              (unsigned long long)st.window_looks, N);
  cr_assert_gt(st.window_looks, 0, "the window was never looked at");
  cr_assert_leq(st.window_looks, N / 8, "%llu looks in %d messages",
                (unsigned long long)st.window_looks, N);
  cr_assert_eq(st.window_waits, 0);
  pt_close_job(ep, 2);
}

/* A stream of numbered 8-byte messages from rank 1 to rank 0 (the held
 * sender test below). */
enum { HELD_N = 400 };
struct held_stream {
  prov_t *ep[2];
  pt_op_t s[HELD_N], r[HELD_N];
  uint64_t out[HELD_N], in[HELD_N];
  int sent, took, rc;
};

/* Rank 1 posts until the window holds it back (rc -EAGAIN; that send,
 * `sent`, is posted again next time) or all are sent. */
static void held_post_on(struct held_stream *h) {
  prov_t *p = h->ep[1];

  while (h->sent < HELD_N &&
         (h->rc = p->ops->post_send(p, 0, &h->out[h->sent], sizeof(h->out[h->sent]),
                                    0x100u + (unsigned)h->sent, &h->s[h->sent].op)) == 0)
    h->sent++;
  cr_assert(h->sent == HELD_N || h->rc == -EAGAIN, "send %d: %d %s", h->sent, h->rc, p->last_error);
}

/* Rank 0 takes the next message (driving itself alone) and checks it. */
static void held_take_one(struct held_stream *h) {
  prov_t *p = h->ep[0];
  int i = h->took;
  pt_op_t *one[1] = {&h->r[i]};

  cr_assert_eq(
      p->ops->post_recv(p, 1, &h->in[i], sizeof(h->in[i]), 0x100u + (unsigned)i, &h->r[i].op), 0,
      "receive %d: %s", i, p->last_error);
  cr_assert(pt_drive(h->ep, 1, one, 1, 20000), "message %d never arrived", i);
  cr_assert_eq(h->in[i], h->out[i], "message %d: %#llx", i, (unsigned long long)h->in[i]);
  h->took++;
}

/* A sender held back by the window is rung when the peer takes one of its
 * messages only if it sleeps. Asking for the ring at every refusal (the bit
 * in the peer's taken_want[]) made a sender that polls, as a broadcast root
 * running ahead does, cost its receiver a sendto() per message: 2-rank 16 B
 * broadcast, reduce and gather over shm took 3.2-3.8 us a call instead of
 * 1.4. Rank 1 fills rank 0's window; rank 0 takes 200 messages one at a time
 * while rank 1 polls and posts again: no rings. Then rank 1 sleeps (arm())
 * with its window full: one take wakes it, with one ring, and no timer (the
 * backstop is off). Every message arrives intact. */
Test(ofi_shm, a_held_sender_is_rung_only_when_it_sleeps) {
  enum { POLLED = 200 };
  static struct held_stream h;
  prov_ofi_rndv_stats_t st0, st1 = {0};
  char err[256] = "";

  cr_assert_eq(pt_open_job("shm", NULL, 2, h.ep, err, sizeof(err)), 0, "open: %s", err);
  prov_ofi_test_no_backstop(h.ep[0]);
  prov_ofi_test_no_backstop(h.ep[1]);
  for (int i = 0; i < HELD_N; i++) {
    pt_op_init(&h.s[i]);
    pt_op_init(&h.r[i]);
    h.out[i] = 0x4e1dull << 32 | (uint64_t)i;
    h.s[i].buf = &h.out[i];
    h.r[i].buf = &h.in[i];
  }
  for (int k = 0; k < 1000 && !st1.window_waits; k++) {
    held_post_on(&h);
    h.ep[0]->ops->progress(h.ep[0]); /* first contact */
    h.ep[1]->ops->progress(h.ep[1]);
    cr_assert_eq(prov_ofi_rndv_stats(h.ep[1], &st1), 0);
  }
  cr_assert_gt(st1.window_waits, 0, "rank 1 sent %d messages, never held back", h.sent);
  /* rank 1 polls */
  while (h.took < POLLED) {
    held_take_one(&h);
    h.ep[1]->ops->progress(h.ep[1]);
    held_post_on(&h);
  }
  cr_assert_eq(prov_ofi_rndv_stats(h.ep[0], &st0), 0);
  cr_assert_eq(prov_ofi_rndv_stats(h.ep[1], &st1), 0);
  cr_log_info("shm held sender, polling: %d taken, %llu held back, %llu rings", POLLED,
              (unsigned long long)st1.window_waits, (unsigned long long)st0.window_rings);
  cr_assert_geq(st1.window_waits, POLLED, "rank 1 was held back %llu times in %d takes",
                (unsigned long long)st1.window_waits, POLLED);
  cr_assert_eq(st0.window_rings, 0, "rank 0 rang rank 1, which polled, %llu times in %d takes",
               (unsigned long long)st0.window_rings, POLLED);
  /* rank 1 sleeps, held back */
  cr_assert_eq(h.rc, -EAGAIN);
  cr_assert(pt_arm(h.ep[1], 5000), "rank 1, held back, never armed");
  h.ep[1]->ops->disarm(h.ep[1]); /* rings of the first contact, if any */
  cr_assert(pt_arm(h.ep[1], 5000), "rank 1, held back, never armed");
  cr_assert_eq(pt_poll_fd(h.ep[1], 100), 0, "rank 1 woken with nothing taken");
  held_take_one(&h);
  cr_assert_eq(pt_poll_fd(h.ep[1], 5000), 1, "rank 1 slept on through rank 0's take");
  h.ep[1]->ops->disarm(h.ep[1]);
  cr_assert_eq(prov_ofi_rndv_stats(h.ep[0], &st0), 0);
  cr_assert_eq(st0.window_rings, 1, "%llu rings for one take",
               (unsigned long long)st0.window_rings);
  h.ep[1]->ops->progress(h.ep[1]);
  held_post_on(&h);
  cr_assert_gt(h.sent, h.took + 1, "rank 1 woken but still held back");
  /* the rest, each side polling */
  while (h.took < HELD_N) {
    held_take_one(&h);
    h.ep[1]->ops->progress(h.ep[1]);
    held_post_on(&h);
  }
  pt_op_t *all[HELD_N];
  for (int i = 0; i < HELD_N; i++)
    all[i] = &h.s[i];
  cr_assert(pt_drive(h.ep, 2, all, HELD_N, 20000), "rank 1's sends never all completed");
  for (int i = 0; i < HELD_N; i++)
    cr_assert_eq(h.s[i].status, 0, "send %d: %d", i, h.s[i].status);
  pt_close_job(h.ep, 2);
}

Test(ofi_shm, window_shares) {
  enum { N = 64 };
  static pt_op_t s[N], r[N];
  static uint64_t out[N], in[N];
  prov_t *ep[2];
  char err[256] = "";
  int n = 0, spare = 0, p2p = 0, coll = 0, rc;

  cr_assert_eq(pt_open_job("shm", NULL, 2, ep, err, sizeof(err)), 0, "open: %s", err);
  for (int i = 0; i < N; i++) {
    pt_op_init(&s[i]);
    out[i] = 0x5a5aull << 32 | (uint64_t)i;
    s[i].buf = &out[i];
  }
  for (unsigned kind = 0; kind < 3; kind++) {
    const unsigned flags = kind == 0 ? PROV_OP_SPARE : kind == 1 ? PROV_OP_P2P : 0;
    int *count = kind == 0 ? &spare : kind == 1 ? &p2p : &coll;
    /* -EAGAIN also while the first contact is made: looked at again */
    for (int tries = 0; n < N && tries < 100;) {
      s[n].op.flags = flags;
      rc = ep[1]->ops->post_send(ep[1], 0, &out[n], sizeof(out[n]), 0x100u + (unsigned)n, &s[n].op);
      if (rc == 0) {
        n++;
        (*count)++;
      } else if (rc == -EAGAIN) {
        tries++;
      } else {
        break;
      }
      for (int e = 0; e < 2; e++)
        ep[e]->ops->progress(ep[e]);
    }
    cr_assert_eq(rc, kind == 0 ? -ENOBUFS : -EAGAIN, "kind %u after %d: %d", kind, n, rc);
  }
  cr_log_info("shm window shares: %d spare, then %d p2p, then %d of a collective", spare, p2p,
              coll);
  cr_assert_gt(spare, 0);
  cr_assert_gt(p2p, 0);
  cr_assert_gt(coll, 0);
  cr_assert_lt(spare, spare + p2p);
  cr_assert_leq(spare + p2p, (spare + p2p + coll) / 2 + 1);
  /* every message comes through intact */
  for (int i = 0; i < n; i++) {
    pt_op_t *two[2] = {&r[i], &s[i]};
    pt_op_init(&r[i]);
    r[i].buf = &in[i];
    cr_assert_eq(pt_recv(ep, 2, ep[0], 1, &r[i], sizeof(in[i]), 0x100u + (unsigned)i, 20000), 0);
    cr_assert(pt_drive(ep, 2, two, 2, 20000), "message %d never went through", i);
    cr_assert_eq(r[i].status, 0);
    cr_assert_eq(in[i], out[i]);
  }
  pt_close_job(ep, 2);
}
