/*
 * test_bootstrap_hostile.c - a real job (forked ranks: init, an allreduce,
 * destroy) while hostile clients speak to its rendezvous over loopback.
 *
 *   test process                 job runner process (mp_run)
 *   ------------                 ---------------------------
 *   connect to rank 0's port     ranks 0..n-2: chorus_comm_init ... (wait)
 *   misbehave, expect Error+EOF  rank n-1: blocked on the `go` pipe
 *   write `go`          ------>  rank n-1: chorus_comm_init; the job forms
 *   read the runner's report <-  allreduce, destroy; report mp_run's result
 *
 * The runner is forked before the test starts any thread: ranks forked from
 * a process whose other threads they lack would make LeakSanitizer miss
 * those threads' roots and report false leaks.
 *
 * Holding the last rank keeps the job forming (its listener open) while the
 * hostile clients act, so every refusal is the server's, not the kernel's.
 * Rank 0's stderr goes to a file: each refusal must be logged there with the
 * offender's address and the reason.
 */
#define _GNU_SOURCE /* pipe2 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "bootstrap.pb-c.h"
#include "chorus.h"
#include "mp.h"

#define TOKEN "hostile-test-secret"
#define COUNT 1024
#define HELLO_TIMEOUT_S 5.0 /* BOOT_HELLO_TIMEOUT_S: CHORUS_CONNECT_TIMEOUT is larger */

static double now_s(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};

  nanosleep(&ts, NULL);
}

/* ---- the job ---- */

struct job {
  int size;
  int port;
  char addr[64];
  int go[2];           /* the last rank waits for a byte on go[0] */
  char log_path[64];   /* rank 0's stderr */
  int rank0_nofile;    /* RLIMIT_NOFILE of rank 0, 0 = unchanged */
  char env_token[128]; /* putenv strings: they must outlive the fork */
  char env_timeout[64];
  const char *env[3];
  pid_t runner;
  int report; /* read end of the runner's report */
  mp_result_t res;
  double t_go, t_done;
};

struct job_report {
  mp_result_t res;
  double t_done; /* CLOCK_MONOTONIC is the same clock in every process */
};

static int rank_body(int rank, int size, const char *unused, void *arg) {
  struct job *j = arg;
  float *in, *out;
  chorus_comm_t *c = NULL;
  chorus_result rc;
  char b;
  int i, bad = 0;

  close(j->go[1]); /* else the pipe never reports the test's end */
  if (rank == 0) {
    int fd = open(j->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
      dup2(fd, 2);
      close(fd);
    }
    if (j->rank0_nofile) {
      struct rlimit rl;
      getrlimit(RLIMIT_NOFILE, &rl);
      rl.rlim_cur = (rlim_t)j->rank0_nofile;
      if (setrlimit(RLIMIT_NOFILE, &rl)) {
        fprintf(stderr, "rank 0: setrlimit: %s\n", strerror(errno));
        return 1;
      }
    }
  }
  if (rank == size - 1) {
    struct pollfd p = {.fd = j->go[0], .events = POLLIN};
    if (poll(&p, 1, 90000) != 1 || read(j->go[0], &b, 1) != 1) {
      fprintf(stderr, "rank %d: the test never said go\n", rank);
      return 1;
    }
  }
  rc = chorus_comm_init(&c, rank, size, j->addr);
  if (rc) {
    fprintf(stderr, "rank %d: init: %s: %s\n", rank, chorus_strerror(rc), chorus_last_error());
    return 1;
  }
  in = malloc(COUNT * sizeof(float));
  out = malloc(COUNT * sizeof(float));
  for (i = 0; in && i < COUNT; i++)
    in[i] = (float)(rank + 1 + i);
  rc = in && out ? chorus_allreduce(c, in, out, COUNT, CHORUS_FLOAT32, CHORUS_SUM)
                 : CHORUS_ERR_NO_MEMORY;
  if (rc) {
    fprintf(stderr, "rank %d: allreduce: %s: %s\n", rank, chorus_strerror(rc), chorus_last_error());
    bad = 1;
  }
  for (i = 0; !bad && i < COUNT; i++) {
    float want = (float)(size * (size + 1) / 2 + size * i);
    if (out[i] != want) {
      fprintf(stderr, "rank %d: allreduce element %d is %g, want %g\n", rank, i, out[i], want);
      bad = 1;
    }
  }
  free(in);
  free(out);
  rc = chorus_comm_destroy(c);
  if (rc) {
    fprintf(stderr, "rank %d: destroy: %s\n", rank, chorus_strerror(rc));
    bad = 1;
  }
  return bad;
}

static void job_start(struct job *j, int size) {
  memset(j, 0, sizeof(*j));
  j->size = size;
  j->port = mp_free_port();
  cr_assert(j->port > 0);
  snprintf(j->addr, sizeof(j->addr), "127.0.0.1:%d", j->port);
  snprintf(j->log_path, sizeof(j->log_path), "/tmp/chorus-hostile-%d.log", (int)getpid());
  snprintf(j->env_token, sizeof(j->env_token), "CHORUS_JOB_TOKEN=%s", TOKEN);
  snprintf(j->env_timeout, sizeof(j->env_timeout), "CHORUS_CONNECT_TIMEOUT=60");
  j->env[0] = j->env_token;
  j->env[1] = j->env_timeout;
  j->env[2] = NULL;
  cr_assert(pipe2(j->go, O_CLOEXEC) == 0);
}

static void job_launch(struct job *j) {
  int p[2];

  cr_assert(pipe2(p, O_CLOEXEC) == 0);
  fflush(stdout);
  fflush(stderr);
  j->runner = fork();
  cr_assert(j->runner >= 0);
  if (j->runner == 0) {
    struct job_report rep;

    close(p[0]);
    close(j->go[1]); /* the last rank must see the test's end */
    rep.res = mp_run(j->size, rank_body, j, 120.0, j->env);
    rep.t_done = now_s();
    if (write(p[1], &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
      _exit(1);
    _exit(0);
  }
  close(p[1]);
  j->report = p[0];
}

/* Let the last rank come. */
static void job_go(struct job *j) {
  j->t_go = now_s();
  cr_assert(write(j->go[1], "g", 1) == 1);
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  char *buf;
  long n;

  if (!f)
    return strdup("");
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  buf = calloc(1, (size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n)
    buf[0] = '\0';
  fclose(f);
  return buf;
}

/* Join the job and assert every rank passed. Returns rank 0's log (free it). */
static char *job_finish(struct job *j) {
  struct job_report rep;
  char *log;
  int r, st;

  close(j->go[0]);
  close(j->go[1]);
  cr_assert_eq(read(j->report, &rep, sizeof(rep)), (ssize_t)sizeof(rep), "no report from the job");
  close(j->report);
  cr_assert_eq(waitpid(j->runner, &st, 0), j->runner);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the job runner failed (status %d)", st);
  j->res = rep.res;
  j->t_done = rep.t_done;
  log = slurp(j->log_path);
  unlink(j->log_path);
  cr_assert(log);
  fprintf(stderr, "---- rank 0's log ----\n%s----\n", log);
  cr_assert_eq(j->res.timed_out, 0, "the job hung");
  for (r = 0; r < j->size; r++)
    cr_assert_eq(j->res.status[r], 0, "rank %d failed (status %d)", r, j->res.status[r]);
  cr_assert_eq(j->res.failed, 0);
  return log;
}

/* ---- hostile clients ---- */

struct hostile {
  int fd;
  char me[64]; /* "127.0.0.1:port" as the server logs it */
};

/* Connect, retrying while rank 0 is not listening yet (or the kernel's
 * backlog is full); -1 after timeout_s. */
static int try_connect(int port, double timeout_s) {
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  double deadline = now_s() + timeout_s;

  while (now_s() < deadline) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int soerr = 0;
    socklen_t sl = sizeof(soerr);

    cr_assert(fd >= 0);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
      return fd;
    if (errno == EINPROGRESS && poll(&p, 1, 2000) == 1 &&
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0)
      return fd;
    close(fd);
    sleep_s(0.01);
  }
  return -1;
}

static struct hostile hostile_connect(struct job *j) {
  struct sockaddr_in me;
  socklen_t len = sizeof(me);
  struct hostile h;

  h.fd = try_connect(j->port, 60.0);
  cr_assert(h.fd >= 0, "cannot connect to rank 0's rendezvous %s", j->addr);
  cr_assert(getsockname(h.fd, (struct sockaddr *)&me, &len) == 0);
  snprintf(h.me, sizeof(h.me), "127.0.0.1:%d", ntohs(me.sin_port));
  return h;
}

static void send_bytes(int fd, const void *p, size_t n) {
  const uint8_t *b = p;

  while (n) {
    ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      poll(&pfd, 1, 1000);
      continue;
    }
    cr_assert(k > 0, "send: %s", strerror(errno));
    b += k;
    n -= (size_t)k;
  }
}

static void send_env(int fd, const Chorus__Boot__Envelope *env) {
  size_t n = chorus__boot__envelope__get_packed_size(env);
  uint8_t *buf = malloc(n + 4);

  cr_assert(buf);
  buf[0] = (uint8_t)(n >> 24);
  buf[1] = (uint8_t)(n >> 16);
  buf[2] = (uint8_t)(n >> 8);
  buf[3] = (uint8_t)n;
  chorus__boot__envelope__pack(env, buf + 4);
  send_bytes(fd, buf, n + 4);
  free(buf);
}

static void send_hello(int fd, const char *token, uint32_t rank, uint32_t size, uint32_t version,
                       const char *host) {
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  Chorus__Boot__Hello h = CHORUS__BOOT__HELLO__INIT;

  h.version = version;
  h.token.data = (uint8_t *)token;
  h.token.len = strlen(token);
  h.rank = rank;
  h.size = size;
  h.host = (char *)host;
  h.timeout_ms = 60000;
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_HELLO;
  env.hello = &h;
  send_env(fd, &env);
}

/* Read exactly n bytes; false on EOF, error or timeout. */
static bool read_exact(int fd, uint8_t *p, size_t n, double deadline) {
  while (n) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int left = (int)((deadline - now_s()) * 1000);
    ssize_t k;

    if (left <= 0 || poll(&pfd, 1, left) <= 0)
      return false;
    k = recv(fd, p, n, 0);
    if (k < 0 && errno == EAGAIN)
      continue;
    if (k <= 0)
      return false;
    p += k;
    n -= (size_t)k;
  }
  return true;
}

static Chorus__Boot__Envelope *recv_env(int fd, double timeout_s) {
  double deadline = now_s() + timeout_s;
  Chorus__Boot__Envelope *env = NULL;
  uint8_t hdr[4], *buf;
  uint32_t n;

  if (!read_exact(fd, hdr, 4, deadline))
    return NULL;
  n = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
  cr_assert(n < (1u << 20), "a %u-byte frame from the server", n);
  buf = malloc(n ? n : 1);
  cr_assert(buf);
  if (read_exact(fd, buf, n, deadline))
    env = chorus__boot__envelope__unpack(NULL, n, buf);
  free(buf);
  return env;
}

/* The server closed us (EOF or reset) within timeout_s, whatever it sent. */
static bool sees_close(int fd, double timeout_s) {
  double deadline = now_s() + timeout_s;
  uint8_t junk[512];

  for (;;) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int left = (int)((deadline - now_s()) * 1000);
    ssize_t k;

    if (left <= 0 || poll(&pfd, 1, left) <= 0)
      return false;
    k = recv(fd, junk, sizeof(junk), 0);
    if (k < 0 && errno == EAGAIN)
      continue;
    if (k <= 0)
      return true;
  }
}

/* The server answers h with an Error of `code` whose message holds
 * `needle`, closes the connection, and logs a line naming h and `why`. */
static void expect_refusal(struct hostile *h, Chorus__Boot__ErrorCode code, const char *needle,
                           double timeout_s) {
  Chorus__Boot__Envelope *env = recv_env(h->fd, timeout_s);

  cr_assert(env, "%s: no Error from the server within %.1f s", h->me, timeout_s);
  cr_assert_eq(env->msg_case, CHORUS__BOOT__ENVELOPE__MSG_ERROR, "%s: got message kind %d", h->me,
               env->msg_case);
  cr_assert_eq(env->error->code, code, "%s: code %d (%s), want %d", h->me, env->error->code,
               env->error->message, code);
  cr_assert(strstr(env->error->message, needle), "%s: '%s' not in '%s'", h->me, needle,
            env->error->message);
  chorus__boot__envelope__free_unpacked(env, NULL);
  cr_assert(sees_close(h->fd, 3.0), "%s: the server did not close the connection", h->me);
  close(h->fd);
  h->fd = -1;
}

/* Rank 0's log has a line naming `who` with `what` in it. */
static void expect_logged(const char *log, const char *who, const char *what) {
  char pat[128];
  const char *p = log;

  snprintf(pat, sizeof(pat), "from %s:", who);
  while ((p = strstr(p, pat))) {
    const char *eol = strchr(p, '\n');
    const char *hit = strstr(p, what);
    if (hit && (!eol || hit < eol))
      return;
    p += strlen(pat);
  }
  cr_assert_fail("rank 0 logged no line naming %s with '%s'", who, what);
}

TestSuite(bootstrap_hostile, .timeout = 150);

/* ---- wrong job token ---- */

Test(bootstrap_hostile, wrong_token) {
  struct hostile wrong, empty;
  struct job j;
  char *log;

  job_start(&j, 3);
  job_launch(&j);
  wrong = hostile_connect(&j);
  empty = hostile_connect(&j);
  /* both claim the rank that has not arrived yet: it must still get in */
  send_hello(wrong.fd, "not-" TOKEN, 2, 3, 1, "evil/host");
  send_hello(empty.fd, "", 2, 3, 1, "evil/host");
  expect_refusal(&wrong, CHORUS__BOOT__ERROR_CODE__ERROR_AUTH, "job token", 5.0);
  expect_refusal(&empty, CHORUS__BOOT__ERROR_CODE__ERROR_AUTH, "job token", 5.0);
  job_go(&j);
  log = job_finish(&j);
  expect_logged(log, wrong.me, "job token mismatch");
  expect_logged(log, empty.me, "job token mismatch");
  free(log);
}

/* ---- oversized messages ---- */

Test(bootstrap_hostile, oversized) {
  static const uint8_t huge[] = {0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4};
  uint8_t just_over[4 + 64] = {0x00, 0x01, 0x00, 0x01}; /* 64 KiB + 1: a Hello's bound */
  struct hostile a, b;
  struct job j;
  char *log;

  job_start(&j, 2);
  job_launch(&j);
  a = hostile_connect(&j);
  b = hostile_connect(&j);
  send_bytes(a.fd, huge, sizeof(huge));
  send_bytes(b.fd, just_over, sizeof(just_over));
  expect_refusal(&a, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, "size limit", 5.0);
  expect_refusal(&b, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, "size limit", 5.0);
  job_go(&j);
  log = job_finish(&j);
  expect_logged(log, a.me, "4294967295 bytes");
  expect_logged(log, b.me, "65537 bytes");
  free(log);
}

/* ---- malformed messages ---- */

Test(bootstrap_hostile, malformed) {
  /* a length prefix, then bytes that are no Envelope (a field of wire type 7) */
  static const uint8_t garbage[] = {0, 0, 0, 8, 0xff, 0xfe, 0xfd, 0xfc, 0x13, 0x37, 0x00, 0x01};
  /* a Hello whose length says 16 bytes but whose content stops after 3 */
  static const uint8_t truncated[] = {0, 0, 0, 5, 0x0a, 0x10, 0x08, 0x01, 0x12};
  static const uint8_t empty[] = {0, 0, 0, 0};
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  Chorus__Boot__Contribution contrib = CHORUS__BOOT__CONTRIBUTION__INIT;
  Chorus__Boot__Welcome welcome = CHORUS__BOOT__WELCOME__INIT;
  struct hostile g, t, e, ver, sz, oor, huge_rank, first_contrib, wel, ctl, nohost, dup;
  struct job j;
  char *log;

  job_start(&j, 4);
  job_launch(&j);
  g = hostile_connect(&j);
  send_bytes(g.fd, garbage, sizeof(garbage));
  t = hostile_connect(&j);
  send_bytes(t.fd, truncated, sizeof(truncated));
  e = hostile_connect(&j);
  send_bytes(e.fd, empty, sizeof(empty));
  ver = hostile_connect(&j);
  send_hello(ver.fd, TOKEN, 3, 4, 99, "evil/host");
  sz = hostile_connect(&j);
  send_hello(sz.fd, TOKEN, 3, 5, 1, "evil/host");
  oor = hostile_connect(&j);
  send_hello(oor.fd, TOKEN, 4, 4, 1, "evil/host");
  huge_rank = hostile_connect(&j);
  send_hello(huge_rank.fd, TOKEN, UINT32_MAX, 4, 1, "evil/host");
  first_contrib = hostile_connect(&j);
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_CONTRIBUTION;
  env.contribution = &contrib;
  send_env(first_contrib.fd, &env);
  wel = hostile_connect(&j);
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_WELCOME;
  env.welcome = &welcome;
  send_env(wel.fd, &env);
  /* The right token but a host identity that would end up in every rank's
   * topology and in messages: refused, and the held rank 3 still gets in. */
  ctl = hostile_connect(&j);
  send_hello(ctl.fd, TOKEN, 3, 4, 1, "evil\nchorus[0] error: forged line");
  nohost = hostile_connect(&j);
  send_hello(nohost.fd, TOKEN, 3, 4, 1, "");

  expect_refusal(&g, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, "malformed", 5.0);
  expect_refusal(&t, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, "malformed", 5.0);
  expect_refusal(&e, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, "malformed", 5.0);
  expect_refusal(&ver, CHORUS__BOOT__ERROR_CODE__ERROR_VERSION, "version 99", 5.0);
  expect_refusal(&sz, CHORUS__BOOT__ERROR_CODE__ERROR_SIZE_MISMATCH, "size mismatch", 5.0);
  expect_refusal(&oor, CHORUS__BOOT__ERROR_CODE__ERROR_BAD_RANK, "out of range", 5.0);
  expect_refusal(&huge_rank, CHORUS__BOOT__ERROR_CODE__ERROR_BAD_RANK, "out of range", 5.0);
  expect_refusal(&first_contrib, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, "not part of the job",
                 5.0);
  expect_refusal(&wel, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, "expects a Hello", 5.0);
  expect_refusal(&ctl, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, "control characters", 5.0);
  expect_refusal(&nohost, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, "empty", 5.0);

  /* Rank 0 said Hello right after it listened; give it time to be in. */
  sleep_s(1.0);
  dup = hostile_connect(&j);
  send_hello(dup.fd, TOKEN, 0, 4, 1, "evil/host");
  expect_refusal(&dup, CHORUS__BOOT__ERROR_CODE__ERROR_DUPLICATE_RANK, "already taken", 5.0);

  job_go(&j);
  log = job_finish(&j);
  expect_logged(log, g.me, "malformed message");
  expect_logged(log, t.me, "malformed message");
  expect_logged(log, e.me, "malformed message");
  expect_logged(log, ver.me, "version");
  expect_logged(log, sz.me, "size mismatch");
  expect_logged(log, oor.me, "out of range");
  expect_logged(log, huge_rank.me, "rank 4294967295 is out of range");
  expect_logged(log, first_contrib.me, "Contribution");
  expect_logged(log, wel.me, "unexpected message");
  expect_logged(log, ctl.me, "control characters");
  expect_logged(log, nohost.me, "control characters");
  expect_logged(log, dup.me, "already taken");
  cr_assert(!strstr(log, "\nchorus[0] error: forged line"), "a client's bytes forged a log line");
  free(log);
}

/* ---- clients that never speak, or speak only partly ---- */

#define NSILENT 24

/* Silent and half-speaking clients connected before the last rank do not
 * delay the job: it forms at once (well before their Hello deadline) and
 * they are closed when it does. */
Test(bootstrap_hostile, silent_clients_do_not_block) {
  static const uint8_t half_header[] = {0, 0};
  static const uint8_t half_body[] = {0, 0, 0, 40, 0x0a, 0x10, 0x08};
  struct hostile h[NSILENT];
  struct job j;
  double took;
  char *log;
  int i;

  job_start(&j, 3);
  job_launch(&j);
  for (i = 0; i < NSILENT; i++) {
    h[i] = hostile_connect(&j);
    if (i % 3 == 1)
      send_bytes(h[i].fd, half_header, sizeof(half_header));
    else if (i % 3 == 2)
      send_bytes(h[i].fd, half_body, sizeof(half_body));
  }
  job_go(&j);
  log = job_finish(&j);
  took = j.t_done - j.t_go;
  cr_assert(took < HELLO_TIMEOUT_S - 0.5,
            "the job took %.2f s with silent clients connected: they held it up", took);
  for (i = 0; i < NSILENT; i++) {
    cr_assert(sees_close(h[i].fd, 5.0), "%s was never closed", h[i].me);
    close(h[i].fd);
    expect_logged(log, h[i].me, "the job formed before it said Hello");
  }
  free(log);
}

struct trickle {
  int fd;
  volatile bool stop;
};

/* One byte of a Hello frame every 0.3 s: never a whole Hello in time. */
static void *trickle_main(void *arg) {
  static const uint8_t frame[] = {0, 0, 0, 60, 0x0a, 0x3a, 0x08, 0x01, 0x12, 0x04};
  struct trickle *t = arg;
  size_t i;

  for (i = 0; !t->stop; i++) {
    if (send(t->fd, &frame[i % sizeof(frame)], 1, MSG_NOSIGNAL) != 1)
      break;
    sleep_s(0.3);
  }
  return NULL;
}

/* While the job is still forming, each such client is closed at its own
 * Hello deadline with an Error saying so. */
Test(bootstrap_hostile, hello_deadline) {
  static const uint8_t half_header[] = {0, 0};
  static const uint8_t half_body[] = {0, 0, 0, 40, 0x0a, 0x10, 0x08};
  struct hostile silent, hh, hb, slow;
  struct trickle tr;
  pthread_t th;
  struct job j;
  double t0;
  char *log;

  job_start(&j, 2);
  job_launch(&j);
  silent = hostile_connect(&j);
  t0 = now_s();
  hh = hostile_connect(&j);
  send_bytes(hh.fd, half_header, sizeof(half_header));
  hb = hostile_connect(&j);
  send_bytes(hb.fd, half_body, sizeof(half_body));
  slow = hostile_connect(&j);
  tr.fd = slow.fd;
  tr.stop = false;
  cr_assert(pthread_create(&th, NULL, trickle_main, &tr) == 0);

  expect_refusal(&silent, CHORUS__BOOT__ERROR_CODE__ERROR_TIMEOUT, "no Hello within",
                 HELLO_TIMEOUT_S + 3.0);
  cr_assert(now_s() - t0 > HELLO_TIMEOUT_S - 1.0, "closed after %.2f s, before its deadline",
            now_s() - t0);
  expect_refusal(&hh, CHORUS__BOOT__ERROR_CODE__ERROR_TIMEOUT, "no Hello within", 3.0);
  expect_refusal(&hb, CHORUS__BOOT__ERROR_CODE__ERROR_TIMEOUT, "no Hello within", 3.0);
  /* the trickler's socket is shared with its thread: read it, then stop it */
  {
    Chorus__Boot__Envelope *env = recv_env(slow.fd, 3.0);
    cr_assert(env && env->msg_case == CHORUS__BOOT__ENVELOPE__MSG_ERROR &&
                  env->error->code == CHORUS__BOOT__ERROR_CODE__ERROR_TIMEOUT,
              "the slow client was not refused at its deadline");
    chorus__boot__envelope__free_unpacked(env, NULL);
    cr_assert(sees_close(slow.fd, 3.0), "the slow client was not closed");
  }
  tr.stop = true;
  pthread_join(th, NULL);
  close(slow.fd);

  job_go(&j);
  log = job_finish(&j);
  expect_logged(log, silent.me, "no Hello within");
  expect_logged(log, hh.me, "no Hello within");
  expect_logged(log, hb.me, "no Hello within");
  expect_logged(log, slow.me, "no Hello within");
  free(log);
}

/* ---- a flood of connections ---- */

#define NFLOOD 600

/* More silent connections than rank 0 has descriptors: the server keeps a
 * bounded number of them waiting, dropping the oldest silent ones, so the
 * last rank is accepted at once instead of after the strangers' deadline. */
Test(bootstrap_hostile, connection_flood) {
  struct hostile first;
  int *fds, i, nfds = 0;
  struct job j;
  double took;
  char *log;

  job_start(&j, 3);
  j.rank0_nofile = 256;
  job_launch(&j);
  first = hostile_connect(&j);
  /* ranks 1..n-2 connect within their retry backoff of rank 0's listen */
  sleep_s(1.5);
  fds = calloc(NFLOOD, sizeof(*fds));
  cr_assert(fds);
  for (i = 0; i < NFLOOD; i++) {
    int fd = try_connect(j.port, 2.0);
    if (fd >= 0)
      fds[nfds++] = fd;
  }
  cr_assert(nfds > 300, "only %d flood connections got through", nfds);
  job_go(&j);
  log = job_finish(&j);
  took = j.t_done - j.t_go;
  cr_assert(took < HELLO_TIMEOUT_S - 0.5,
            "the job took %.2f s behind %d silent connections: they held up the accept", took,
            nfds);
  cr_assert(sees_close(first.fd, 5.0), "%s was never closed", first.me);
  close(first.fd);
  for (i = 0; i < nfds; i++) {
    cr_assert(sees_close(fds[i], 5.0), "flood connection %d was never closed", i);
    close(fds[i]);
  }
  free(fds);
  cr_assert(strstr(log, "waiting to say Hello"), "no drop of a waiting connection was logged");
  /* not flooded: a line each for the first ones, then lines that count */
  {
    int lines = 0, counted = 0;
    const char *p;

    for (p = log; (p = strstr(p, "dropped the connection from ")); p++)
      lines++;
    for (p = log; (p = strstr(p, " more connections dropped in the last ")); p++) {
      const char *q = p;

      while (q > log && q[-1] >= '0' && q[-1] <= '9')
        q--;
      counted += atoi(q);
    }
    cr_assert_leq(lines, 2 * 32 + 8, "%d drops logged one by one: the log is flooded", lines);
    cr_assert_geq(lines + counted, nfds, "%d drops shown and %d counted for %d connections", lines,
                  counted, nfds);
  }
  free(log);
}

/* A burst of junk connections does not hide a wrong-token Hello that
 * follows it: the junk goes past the log's budget of lines (counted in a
 * summary line), the Hello's refusal still has a line of its own naming
 * it, at the default level. */
#define NJUNK 48

Test(bootstrap_hostile, wrong_token_after_junk_is_logged) {
  static const uint8_t garbage[] = {0, 0, 0, 8, 0xff, 0xfe, 0xfd, 0xfc, 0x13, 0x37, 0x00, 0x01};
  struct hostile junk[NJUNK], wrong;
  struct job j;
  char *log;

  job_start(&j, 3);
  job_launch(&j);
  for (int i = 0; i < NJUNK; i++) {
    junk[i] = hostile_connect(&j);
    send_bytes(junk[i].fd, garbage, sizeof(garbage));
  }
  for (int i = 0; i < NJUNK; i++)
    expect_refusal(&junk[i], CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, "malformed", 5.0);
  wrong = hostile_connect(&j);
  send_hello(wrong.fd, "not-" TOKEN, 2, 3, 1, "evil/host");
  expect_refusal(&wrong, CHORUS__BOOT__ERROR_CODE__ERROR_AUTH, "job token", 5.0);
  job_go(&j);
  log = job_finish(&j);
  expect_logged(log, wrong.me, "job token mismatch");
  expect_logged(log, junk[0].me, "malformed message");
  cr_assert(strstr(log, " more connections dropped in the last "),
            "the junk past the budget is not counted in the log");
  free(log);
}

/* ---- the byte-buffer entry points the fuzzers use ---- */

static size_t frame_of(const Chorus__Boot__Envelope *env, uint8_t *buf) {
  size_t n = chorus__boot__envelope__get_packed_size(env);

  buf[0] = (uint8_t)(n >> 24);
  buf[1] = (uint8_t)(n >> 16);
  buf[2] = (uint8_t)(n >> 8);
  buf[3] = (uint8_t)n;
  chorus__boot__envelope__pack(env, buf + 4);
  return n + 4;
}

static size_t hello_frame(uint8_t *buf, uint32_t rank, uint32_t size) {
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  Chorus__Boot__Hello h = CHORUS__BOOT__HELLO__INIT;

  h.version = 1;
  h.rank = rank;
  h.size = size;
  h.host = "bytes/host";
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_HELLO;
  env.hello = &h;
  return frame_of(&env, buf);
}

static size_t contrib_frame(uint8_t *buf, uint64_t round) {
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  Chorus__Boot__Contribution m = CHORUS__BOOT__CONTRIBUTION__INIT;

  m.round = round;
  m.data.data = (uint8_t *)"abc";
  m.data.len = 3;
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_CONTRIBUTION;
  env.contribution = &m;
  return frame_of(&env, buf);
}

static size_t bye_frame(uint8_t *buf) {
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  Chorus__Boot__Bye bye = CHORUS__BOOT__BYE__INIT;

  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_BYE;
  env.bye = &bye;
  return frame_of(&env, buf);
}

Test(bootstrap_hostile, bytes_entry_points) {
  uint8_t a[256], b[256], c[64], *streams[3] = {a, b, c};
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  Chorus__Boot__Welcome w = CHORUS__BOOT__WELCOME__INIT;
  Chorus__Boot__Gathered g = CHORUS__BOOT__GATHERED__INIT;
  ProtobufCBinaryData data[2] = {{1, (uint8_t *)"x"}, {1, (uint8_t *)"y"}};
  char *hosts[2] = {"h0", "h1"};
  size_t lens[3];
  uint8_t reply[256];
  size_t n;

  /* two members who say Hello, contribute a round and leave, one stranger */
  lens[0] = hello_frame(a, 0, 2);
  lens[0] += contrib_frame(a + lens[0], 0);
  lens[0] += bye_frame(a + lens[0]);
  lens[1] = hello_frame(b, 1, 2);
  lens[1] += contrib_frame(b + lens[1], 0);
  lens[1] += bye_frame(b + lens[1]);
  memcpy(c, "\0\0\0\3xyz", 7);
  lens[2] = 7;
  cr_assert_eq(boot_serve_bytes(2, "", (const uint8_t *const *)streams, lens, 3), 0);
  cr_assert_eq(boot_serve_bytes(0, "", NULL, NULL, 0), -EINVAL);

  /* a client answered Welcome then one Gathered round, then end of file */
  w.size = 2;
  w.n_hosts = 2;
  w.hosts = hosts;
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_WELCOME;
  env.welcome = &w;
  n = frame_of(&env, reply);
  g.round = 0;
  g.n_data = 2;
  g.data = data;
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_GATHERED;
  env.gathered = &g;
  n += frame_of(&env, reply + n);
  cr_assert_eq(boot_client_bytes(1, 2, reply, n, 1), 0);
  /* a second round finds the end of file: the server is gone */
  cr_assert_eq(boot_client_bytes(1, 2, reply, n, 2), CHORUS_ERR_PEER_LOST);
  /* a Welcome of the wrong size */
  cr_assert_eq(boot_client_bytes(0, 3, reply, n, 0), CHORUS_ERR_BOOTSTRAP);
}
