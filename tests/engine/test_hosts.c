/*
 * test_hosts.c - real hosts: two network namespaces, each with a hostname of
 * its own (a UTS namespace per rank) and one end of a veth pair, addresses
 * from 198.51.100.0/24 (a documentation range); 2 ranks on each. Nothing
 * is emulated: the ranks find their hosts by name, talk over shm inside a
 * host and over sock between hosts, through the veth.
 *
 *   collectives         every collective, checked exactly, shm+sock
 *   killed_rank         rank 3 (host b) dies by SIGKILL mid-allreduce: the
 *                       others fail with CHORUS_ERR_PEER_LOST naming it
 *   link_down           host b's link goes down mid-allreduce: host a's
 *                       ranks name ranks 2 and 3 lost, host b's ranks 0 and 1
 *                       (host a unreachable), within CHORUS_PEER_TIMEOUT and
 *                       two watchdog periods
 *   master_addr         rendezvous from torchrun's variables
 *   openmpi_env         rendezvous from Open MPI's variables + CHORUS_RENDEZVOUS
 *   wrong_token         a rank of host b with another job token: refused,
 *                       every rank told why
 *
 * Making namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and
 * iproute2; without them every test here says so on stderr and is skipped.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "chorus.h"
#include "comm.h"
#include "mp.h"
#include "topo.h"

TestSuite(hosts, .timeout = 240);

#define ADDR_A "198.51.100.1"
#define ADDR_B "198.51.100.2"
#define RDV_PORT 29400
#define NRANKS 4

typedef struct host_net {
  char ns[2][48];   /* namespace names (ip netns) */
  char veth[2][16]; /* the interface inside each */
  char host[2][32]; /* hostname inside each */
  const char *addr[2];
} host_net_t;

static host_net_t net;

/* One rank's report, in memory shared with the test. */
typedef struct rank_report {
  int rc;     /* first failing result, 0 when all went well */
  int iters;  /* collectives completed */
  int nhosts; /* hosts the communicator saw */
  int host_of[NRANKS];
  double t_fail;  /* CLOCK_REALTIME when the failure came back */
  double t_event; /* rank 3: when it killed itself */
  char provider[64];
  char msg[768];
} rank_report_t;

static rank_report_t *rep;

static double now_real(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int sh(const char *fmt, ...) {
  char cmd[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof(cmd), fmt, ap);
  va_end(ap);
  int st = system(cmd);
  return st == 0 ? 0 : -1;
}

static void net_down(void) {
  for (int h = 0; h < 2; h++)
    if (net.ns[h][0])
      sh("ip netns del %s 2>/dev/null", net.ns[h]);
  if (rep)
    munmap(rep, NRANKS * sizeof(*rep));
  rep = NULL;
}

/* Two hosts a and b joined by a veth pair; skips the test, loudly, where
 * namespaces can not be made. */
static void net_up(void) {
  int id = (int)getpid();
  static const char *const names[2] = {"a", "b"};

  for (int h = 0; h < 2; h++) {
    snprintf(net.ns[h], sizeof(net.ns[h]), "chorus-test-%d-%s", id, names[h]);
    snprintf(net.veth[h], sizeof(net.veth[h]), "chv%d%s", id, names[h]);
    snprintf(net.host[h], sizeof(net.host[h]), "chorus-host-%s", names[h]);
  }
  net.addr[0] = ADDR_A;
  net.addr[1] = ADDR_B;
  rep =
      mmap(NULL, NRANKS * sizeof(*rep), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(rep, MAP_FAILED);
  memset(rep, 0, NRANKS * sizeof(*rep));

  const char *why = NULL;
  if (geteuid() != 0)
    why = "not root";
  else if (sh("command -v ip >/dev/null 2>&1"))
    why = "no ip command (iproute2)";
  else if (sh("ip netns add %s 2>/dev/null && ip netns add %s 2>/dev/null", net.ns[0], net.ns[1]))
    why = "ip netns add failed";
  else if (sh("ip link add %s type veth peer name %s 2>/dev/null", net.veth[0], net.veth[1]))
    why = "no veth pair";
  for (int h = 0; h < 2 && !why; h++)
    if (sh("ip link set %s netns %s && ip -n %s addr add %s/24 dev %s && "
           "ip -n %s link set %s up && ip -n %s link set lo up",
           net.veth[h], net.ns[h], net.ns[h], net.addr[h], net.veth[h], net.ns[h], net.veth[h],
           net.ns[h]))
      why = "could not set up the veth pair";
  if (why) {
    fprintf(stderr,
            "\n*** hosts: SKIPPED: can not build hosts in network namespaces here (%s); "
            "the multi-host tests need root and iproute2 ***\n\n",
            why);
    net_down();
    cr_skip_test("can not build hosts in network namespaces (%s)", why);
  }
}

/* In the rank's process: move into its host's network namespace and give it
 * the host's name. */
static int enter_host(int rank) {
  int h = rank / 2;
  char path[128];
  snprintf(path, sizeof(path), "/run/netns/%s", net.ns[h]);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || setns(fd, CLONE_NEWNET) || unshare(CLONE_NEWUTS) ||
      sethostname(net.host[h], strlen(net.host[h]))) {
    fprintf(stderr, "rank %d: can not enter host %s: %s\n", rank, net.ns[h], strerror(errno));
    if (fd >= 0)
      close(fd);
    return -1;
  }
  close(fd);
  /* mp_run pins libfabric to loopback: here the host's own interface is
   * found as a user's would be */
  unsetenv("FI_TCP_IFACE");
  unsetenv("FI_UDP_IFACE");
  unsetenv("FI_SOCKETS_IFACE");
  return 0;
}

static void fail(rank_report_t *me, chorus_comm_t *c, int rc, const char *what) {
  if (me->rc)
    return;
  me->rc = rc ? rc : -1;
  me->t_fail = now_real();
  snprintf(me->msg, sizeof(me->msg), "%s: %s: %s", what, rc ? chorus_strerror(rc) : "wrong data",
           c ? chorus_comm_last_error(c) : chorus_last_error());
}

/* ---- every collective ---- */

static int check_i32(rank_report_t *me, const int32_t *got, const int32_t *want, size_t n,
                     const char *what) {
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i]) {
      snprintf(me->msg, sizeof(me->msg), "%s: element %zu is %d, want %d", what, i, (int)got[i],
               (int)want[i]);
      me->rc = -1;
      return -1;
    }
  return 0;
}

static int all_collectives(chorus_comm_t *c, int rank, rank_report_t *me) {
  enum { N = 70001 }; /* odd, past the small-message algorithms */
  const int P = NRANKS;
  int32_t *a = malloc(sizeof(int32_t) * N * P), *b = malloc(sizeof(int32_t) * N * P);
  int32_t *w = malloc(sizeof(int32_t) * N * P);
  chorus_result rc;
  int bad = 0;

#define RUN(call, what)                                                                            \
  if (!bad && (rc = (call))) {                                                                     \
    fail(me, c, rc, what);                                                                         \
    bad = 1;                                                                                       \
  }
#define CHECK(got, n, what)                                                                        \
  if (!bad)                                                                                        \
    bad = check_i32(me, got, w, n, what) != 0;

  static const size_t counts[] = {1, 1000, N};
  for (int k = 0; k < 3 && !bad; k++) {
    size_t n = counts[k];
    for (size_t i = 0; i < n; i++) {
      a[i] = (int32_t)(rank * 1000 + (int)(i % 997));
      w[i] = (int32_t)(1000 * (0 + 1 + 2 + 3) + 4 * (int)(i % 997));
    }
    RUN(chorus_allreduce(c, a, b, n, CHORUS_INT32, CHORUS_SUM), "allreduce");
    CHECK(b, n, "allreduce");
  }
  for (size_t i = 0; i < N; i++) {
    a[i] = rank == 3 ? (int32_t)(i * 7) : -1;
    w[i] = (int32_t)(i * 7);
  }
  RUN(chorus_bcast(c, a, a, N, CHORUS_INT32, 3), "bcast from host b");
  CHECK(a, N, "bcast");
  for (size_t i = 0; i < N; i++) {
    a[i] = (int32_t)(rank + (int)(i % 13));
    w[i] = (int32_t)(3 + (int)(i % 13));
  }
  RUN(chorus_reduce(c, a, b, N, CHORUS_INT32, CHORUS_MAX, 2), "reduce to host b");
  if (rank == 2)
    CHECK(b, N, "reduce");
  for (size_t i = 0; i < N; i++)
    a[i] = (int32_t)(rank * N + (int)i);
  for (size_t i = 0; i < (size_t)P * N; i++)
    w[i] = (int32_t)i;
  RUN(chorus_allgather(c, a, b, N, CHORUS_INT32), "allgather");
  CHECK(b, (size_t)P * N, "allgather");
  RUN(chorus_gather(c, a, b, N, CHORUS_INT32, 1), "gather");
  if (rank == 1)
    CHECK(b, (size_t)P * N, "gather");
  for (size_t i = 0; i < (size_t)P * N; i++)
    a[i] = (int32_t)(rank + 10 * (int)(i % 101));
  for (size_t i = 0; i < N; i++)
    w[i] = (int32_t)(6 + 40 * (int)(((size_t)rank * N + i) % 101));
  RUN(chorus_reduce_scatter(c, a, b, N, CHORUS_INT32, CHORUS_SUM), "reduce_scatter");
  CHECK(b, N, "reduce_scatter");
  /* alltoall: block p of rank r holds r*100+p, so block q of the result is q*100+rank */
  for (int p = 0; p < P; p++)
    for (size_t i = 0; i < N; i++) {
      a[(size_t)p * N + i] = (int32_t)(rank * 100 + p + (int)(i % 5));
      w[(size_t)p * N + i] = (int32_t)(p * 100 + rank + (int)(i % 5));
    }
  RUN(chorus_alltoall(c, a, b, N, CHORUS_INT32), "alltoall");
  CHECK(b, (size_t)P * N, "alltoall");
  for (size_t i = 0; i < (size_t)P * N; i++)
    a[i] = (int32_t)(i * 3);
  for (size_t i = 0; i < N; i++)
    w[i] = (int32_t)(((size_t)rank * N + i) * 3);
  RUN(chorus_scatter(c, a, b, N, CHORUS_INT32, 2), "scatter from host b");
  CHECK(b, N, "scatter");
  RUN(chorus_barrier(c), "barrier");
  /* a ring of sends, crossing between the hosts twice */
  for (size_t i = 0; i < N; i++) {
    a[i] = (int32_t)(rank * 31 + (int)i);
    w[i] = (int32_t)(((rank + P - 1) % P) * 31 + (int)i);
  }
  if (rank % 2 == 0) {
    RUN(chorus_send(c, a, N, CHORUS_INT32, (rank + 1) % P), "send");
    RUN(chorus_recv(c, b, N, CHORUS_INT32, (rank + P - 1) % P), "recv");
  } else {
    RUN(chorus_recv(c, b, N, CHORUS_INT32, (rank + P - 1) % P), "recv");
    RUN(chorus_send(c, a, N, CHORUS_INT32, (rank + 1) % P), "send");
  }
  CHECK(b, N, "send/recv");
#undef RUN
#undef CHECK
  free(a);
  free(b);
  free(w);
  return bad;
}

static void note_comm(rank_report_t *me, chorus_comm_t *c, int size) {
  snprintf(me->provider, sizeof(me->provider), "%s", chorus_comm_provider(c));
  me->nhosts = c->topo->nhosts;
  memcpy(me->host_of, c->topo->host_of, (size_t)size * sizeof(int));
}

/* How a rank makes its communicator. */
enum how { BY_ADDRESS, BY_MASTER_ADDR, BY_OPENMPI };

/* A launcher's rank, local rank, size and local size (2 ranks a host). */
static void launcher_vars(int rank, int size, const char *r, const char *lr, const char *s,
                          const char *ls) {
  char v[16];
  snprintf(v, sizeof(v), "%d", rank);
  setenv(r, v, 1);
  snprintf(v, sizeof(v), "%d", rank % 2);
  setenv(lr, v, 1);
  snprintf(v, sizeof(v), "%d", size);
  setenv(s, v, 1);
  setenv(ls, "2", 1);
}

static int collectives_rank(int rank, int size, const char *unused, void *arg) {
  enum how how = (enum how)(intptr_t)arg;
  rank_report_t *me = &rep[rank];
  chorus_comm_t *c = NULL;
  chorus_result rc;

  (void)unused;
  if (enter_host(rank))
    return 1;
  switch (how) {
  case BY_ADDRESS:
    rc = chorus_comm_init(&c, rank, size, ADDR_A ":29400");
    break;
  case BY_MASTER_ADDR:
    /* torchrun's variables; nothing listens at MASTER_PORT (no TCPStore in
     * this program), so rank 0 meets the others on MASTER_PORT+1 */
    setenv("MASTER_ADDR", ADDR_A, 1);
    setenv("MASTER_PORT", "29500", 1);
    launcher_vars(rank, size, "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE");
    rc = chorus_comm_init_from_env(&c);
    break;
  default:
    launcher_vars(rank, size, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                  "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE");
    setenv("CHORUS_RENDEZVOUS", ADDR_A ":29600", 1);
    rc = chorus_comm_init_from_env(&c);
    break;
  }
  if (rc) {
    fail(me, NULL, rc, "init");
    return 1;
  }
  note_comm(me, c, size);
  int bad = all_collectives(c, rank, me);
  if ((rc = chorus_comm_destroy(c)) && !bad) {
    fail(me, NULL, rc, "destroy");
    bad = 1;
  }
  return bad;
}

static void expect_all_right(enum how how, const char *what) {
  const char *env[] = {"CHORUS_JOB_TOKEN=hosts-test", "CHORUS_CONNECT_TIMEOUT=30", NULL};
  mp_result_t r = mp_run(NRANKS, collectives_rank, (void *)(intptr_t)how, 150, env);

  for (int i = 0; i < NRANKS; i++)
    if (rep[i].msg[0])
      fprintf(stderr, "%s: rank %d: %s\n", what, i, rep[i].msg);
  cr_assert_eq(r.timed_out, 0, "%s: timed out", what);
  cr_assert_eq(r.failed, 0, "%s: %d rank(s) failed", what, r.failed);
  for (int i = 0; i < NRANKS; i++) {
    cr_assert_str_eq(rep[i].provider, "shm+sock", "%s: rank %d", what, i);
    cr_assert_eq(rep[i].nhosts, 2, "%s: rank %d sees %d hosts", what, i, rep[i].nhosts);
    for (int p = 0; p < NRANKS; p++)
      cr_assert_eq(rep[i].host_of[p], p / 2, "%s: rank %d sees rank %d on host %d", what, i, p,
                   rep[i].host_of[p]);
  }
}

Test(hosts, collectives, .init = net_up, .fini = net_down) {
  expect_all_right(BY_ADDRESS, "by address");
}

Test(hosts, master_addr, .init = net_up, .fini = net_down) {
  expect_all_right(BY_MASTER_ADDR, "MASTER_ADDR/MASTER_PORT");
}

Test(hosts, openmpi_env, .init = net_up, .fini = net_down) {
  expect_all_right(BY_OPENMPI, "Open MPI's variables");
}

/* ---- failures ---- */

enum fault { KILL_RANK3, LINK_DOWN };

static int fault_rank(int rank, int size, const char *unused, void *arg) {
  enum fault fault = (enum fault)(intptr_t)arg;
  rank_report_t *me = &rep[rank];
  chorus_comm_t *c = NULL;
  enum { N = 1 << 18 };
  float *a = calloc(N, sizeof(float));
  chorus_result rc;

  (void)unused;
  if (!a || enter_host(rank))
    return 1;
  if ((rc = chorus_comm_init(&c, rank, size, ADDR_A ":29400"))) {
    fail(me, NULL, rc, "init");
    free(a);
    return 1;
  }
  note_comm(me, c, size);
  double end = now_real() + 90;
  while (now_real() < end) {
    if (fault == KILL_RANK3 && rank == 3 && me->iters == 20) {
      me->t_event = now_real();
      raise(SIGKILL);
    }
    if ((rc = chorus_allreduce(c, a, a, N, CHORUS_FLOAT32, CHORUS_SUM))) {
      fail(me, c, rc, "allreduce");
      break;
    }
    __atomic_add_fetch(&me->iters, 1, __ATOMIC_RELAXED);
  }
  chorus_comm_destroy(c);
  free(a);
  return me->rc ? 0 : 1; /* a rank that never failed is the test's failure */
}

static void *link_down_when_running(void *arg) {
  double *t_down = arg;
  double give_up = now_real() + 60;
  for (;;) {
    int least = 1 << 30;
    for (int i = 0; i < NRANKS; i++)
      least = __atomic_load_n(&rep[i].iters, __ATOMIC_RELAXED) < least
                  ? __atomic_load_n(&rep[i].iters, __ATOMIC_RELAXED)
                  : least;
    if (least >= 20 || now_real() > give_up)
      break;
    usleep(20000);
  }
  *t_down = now_real();
  if (sh("ip -n %s link set %s down", net.ns[1], net.veth[1]))
    *t_down = -1;
  return NULL;
}

/* Whether msg names the rank: "rank 3", or within a list "ranks 0,1,3". */
static bool names_rank(const char *msg, int rank) {
  for (const char *p = strstr(msg, "rank"); p; p = strstr(p + 1, "rank")) {
    const char *q = p + 4;
    if (*q == 's')
      q++;
    if (*q++ != ' ')
      continue;
    for (;;) {
      char *end;
      long v = strtol(q, &end, 10);
      if (end == q)
        break;
      if (v == rank)
        return true;
      if (*end != ',')
        break;
      q = end + 1;
    }
  }
  return false;
}

Test(hosts, killed_rank, .init = net_up, .fini = net_down) {
  const char *env[] = {"CHORUS_PEER_TIMEOUT=5", "CHORUS_TIMEOUT=60", NULL};
  mp_result_t r = mp_run(NRANKS, fault_rank, (void *)(intptr_t)KILL_RANK3, 150, env);

  cr_assert_eq(r.timed_out, 0);
  cr_assert_eq(r.status[3], -SIGKILL, "rank 3 ended with %d", r.status[3]);
  for (int i = 0; i < 3; i++) {
    fprintf(stderr, "killed_rank: rank %d (host %s): %.2f s after the kill: %s\n", i,
            net.host[i / 2], rep[i].t_fail - rep[3].t_event, rep[i].msg);
    cr_assert_eq(r.status[i], 0, "rank %d never failed", i);
    cr_assert_eq(rep[i].rc, CHORUS_ERR_PEER_LOST, "rank %d: %s", i, rep[i].msg);
    cr_assert(names_rank(rep[i].msg, 3), "rank %d does not name rank 3: %s", i, rep[i].msg);
    cr_assert_lt(rep[i].t_fail - rep[3].t_event, 5.0, "rank %d: verdict after %.1f s", i,
                 rep[i].t_fail - rep[3].t_event);
  }
}

Test(hosts, link_down, .init = net_up, .fini = net_down) {
  const double peer_timeout = 4, period = 0.5;
  const char *env[] = {"CHORUS_PEER_TIMEOUT=4", "CHORUS_WATCHDOG_MS=500", "CHORUS_TIMEOUT=60",
                       NULL};
  pthread_t th;
  double t_down = 0;

  cr_assert_eq(pthread_create(&th, NULL, link_down_when_running, &t_down), 0);
  mp_result_t r = mp_run(NRANKS, fault_rank, (void *)(intptr_t)LINK_DOWN, 150, env);
  pthread_join(th, NULL);
  cr_assert_gt(t_down, 0, "could not take the link down");
  cr_assert_eq(r.timed_out, 0);
  for (int i = 0; i < NRANKS; i++) {
    double after = rep[i].t_fail - t_down;
    fprintf(stderr, "link_down: rank %d (host %s): %.2f s after the link went down: %s\n", i,
            net.host[i / 2], after, rep[i].msg);
    cr_assert_eq(r.status[i], 0, "rank %d never failed", i);
    cr_assert_eq(rep[i].rc, CHORUS_ERR_PEER_LOST, "rank %d: %s", i, rep[i].msg);
    if (i < 2)
      cr_assert(names_rank(rep[i].msg, 2) && names_rank(rep[i].msg, 3),
                "rank %d (host a) does not name ranks 2 and 3: %s", i, rep[i].msg);
    else
      cr_assert(names_rank(rep[i].msg, 0) && names_rank(rep[i].msg, 1) &&
                    strstr(rep[i].msg, net.host[0]),
                "rank %d (host b) does not name ranks 0 and 1 of host a: %s", i, rep[i].msg);
    /* silence is counted from the last beat before the link went down (a
     * period at most) and judged on a tick (another); a second of slack */
    cr_assert_lt(after, peer_timeout + 2 * period + 1.0,
                 "rank %d: verdict %.1f s after the link went down", i, after);
  }
}

static int token_rank(int rank, int size, const char *unused, void *arg) {
  rank_report_t *me = &rep[rank];
  chorus_comm_t *c = NULL;

  (void)unused;
  (void)arg;
  if (enter_host(rank))
    return 1;
  setenv("CHORUS_JOB_TOKEN", rank == 3 ? "not-the-secret" : "s3cret", 1);
  double t0 = now_real();
  chorus_result rc = chorus_comm_init(&c, rank, size, ADDR_A ":29400");
  if (!rc) {
    snprintf(me->msg, sizeof(me->msg), "init succeeded");
    chorus_comm_destroy(c);
    return 1;
  }
  fail(me, NULL, rc, "init");
  me->t_event = t0;
  return 0;
}

/* The stranger is refused at once; the others keep waiting for the real rank 3
 * (a stranger must not be able to end a job), and at CHORUS_CONNECT_TIMEOUT
 * say that rank 3 never came and that a client claiming it had the wrong
 * token. */
Test(hosts, wrong_token, .init = net_up, .fini = net_down) {
  const double connect_timeout = 8;
  const char *env[] = {"CHORUS_CONNECT_TIMEOUT=8", NULL};
  mp_result_t r = mp_run(NRANKS, token_rank, NULL, 120, env);

  cr_assert_eq(r.timed_out, 0);
  for (int i = 0; i < NRANKS; i++) {
    double took = rep[i].t_fail - rep[i].t_event;
    fprintf(stderr, "wrong_token: rank %d (host %s): %.2f s: %s\n", i, net.host[i / 2], took,
            rep[i].msg);
    cr_assert_eq(r.status[i], 0, "rank %d: %s", i, rep[i].msg);
    cr_assert(strstr(rep[i].msg, "token"), "rank %d does not say why: %s", i, rep[i].msg);
    if (i == 3)
      cr_assert_lt(took, 3.0, "rank 3 refused after %.1f s", took);
    else
      cr_assert_lt(took, connect_timeout + 3.0, "rank %d: %.1f s", i, took);
  }
  cr_assert_eq(rep[3].rc, CHORUS_ERR_AUTH, "rank 3: %s", rep[3].msg);
  for (int i = 0; i < 3; i++)
    cr_assert(names_rank(rep[i].msg, 3), "rank %d does not name rank 3: %s", i, rep[i].msg);
}
