/*
 * The four ways a data-parallel job used to hang silently, over shm, tcp and sock
 * at 4 and 8 ranks: one rank skips a training step (its later calls shift),
 * calls allreduce with another count or dtype, is killed, or stalls inside
 * a collective. Each must end on every live rank within CHORUS_TIMEOUT + 5 s
 * with the right code and a message naming the culprit and the collective,
 * leave a dump from every live rank and nothing in /dev/shm (not even the
 * killed rank's region), and chorus-trace must name the same culprit. A mismatched call must fail
 * at its first message, long before the timeout.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "chorus.h"
#include "comm.h"
#include "mp.h"

#define TIMEOUT_S 4 /* CHORUS_TIMEOUT of these jobs, seconds */
/* CHORUS_TIMEOUT of the mismatch jobs: a mismatch caught by the timeout
 * would take this long, one caught at its first message far less; they
 * must end within TIMEOUT_S + 5 s as the others do */
#define MISMATCH_TIMEOUT_S 30
#define STEPS 4
#define GRAD 4096
#define PARAMS 1024

enum scenario { SC_SKIP, SC_COUNT, SC_DTYPE, SC_KILL, SC_STALL };

static const char *const sc_name[] = {"skip", "count", "dtype", "kill", "stall"};

typedef struct args {
  enum scenario sc;
  int culprit;
  char dir[256];
} args_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static chorus_result expected(enum scenario sc) {
  switch (sc) {
  case SC_SKIP:
    return CHORUS_ERR_DIVERGED;
  case SC_COUNT:
  case SC_DTYPE:
    return CHORUS_ERR_MISMATCH;
  case SC_KILL:
    return CHORUS_ERR_PEER_LOST;
  default:
    return CHORUS_ERR_TIMEOUT;
  }
}

/* A training loop: per step an allreduce of the gradients and a broadcast
 * of the parameters, then a final barrier. The culprit misbehaves at step 2. */
static int rank_main(int rank, int size, const char *addr, void *arg) {
  const args_t *a = arg;
  const bool culprit = rank == a->culprit;
  static float grad[GRAD + 1], params[PARAMS];
  chorus_comm_t *c;
  chorus_result rc = chorus_comm_init(&c, rank, size, addr);
  double t_call = 0;

  if (rc) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    return 1;
  }
  for (int step = 0; step < STEPS && !rc; step++) {
    size_t n = GRAD;
    chorus_dtype dt = CHORUS_FLOAT32;
    if (culprit && step == 2) {
      if (a->sc == SC_SKIP)
        continue; /* if loss > 100: continue */
      if (a->sc == SC_KILL)
        raise(SIGKILL);
      if (a->sc == SC_STALL)
        comm_stall(c, 120, "test: frozen at step 2");
      if (a->sc == SC_COUNT)
        n = GRAD + 1;
      if (a->sc == SC_DTYPE)
        dt = CHORUS_INT32;
    }
    t_call = now_s();
    rc = chorus_allreduce(c, grad, grad, n, dt, CHORUS_SUM);
    if (!rc) {
      t_call = now_s();
      rc = chorus_bcast(c, params, params, PARAMS, CHORUS_FLOAT32, 0);
    }
  }
  if (!rc) {
    t_call = now_s();
    rc = chorus_barrier(c);
  }
  double took = now_s() - t_call;
  char msg[1200];
  snprintf(msg, sizeof(msg), "%s", chorus_comm_last_error(c));
  int bad = 0;
  char who[32];
  snprintf(who, sizeof(who), "rank %d", a->culprit);
  if (rc != expected(a->sc)) {
    fprintf(stderr, "rank %d (%s): got %s, expected %s: %s\n", rank, sc_name[a->sc],
            chorus_strerror(rc), chorus_strerror(expected(a->sc)), msg);
    bad = 1;
  } else if (!strstr(msg, who) || !strstr(msg, "#")) {
    fprintf(stderr, "rank %d (%s): the message does not name %s and a collective: %s\n", rank,
            sc_name[a->sc], who, msg);
    bad = 1;
  } else if (took > TIMEOUT_S + 5) {
    if (a->sc == SC_COUNT || a->sc == SC_DTYPE)
      fprintf(stderr,
              "rank %d (%s): a mismatch took %.1f s (its timeout %d s, the bound %d s): not "
              "caught at the first message\n",
              rank, sc_name[a->sc], took, MISMATCH_TIMEOUT_S, TIMEOUT_S + 5);
    else
      fprintf(stderr, "rank %d (%s): failed after %.1f s, past the timeout + 5 s\n", rank,
              sc_name[a->sc], took);
    bad = 1;
  } else {
    fprintf(stderr, "rank %d (%s): %s after %.2f s: %s\n", rank, sc_name[a->sc],
            chorus_strerror(rc), took, msg);
  }
  /* a later call fails at once with the same code */
  if (!bad && chorus_barrier(c) != rc) {
    fprintf(stderr, "rank %d (%s): a later call did not fail with the same code\n", rank,
            sc_name[a->sc]);
    bad = 1;
  }
  if (chorus_comm_destroy(c)) {
    fprintf(stderr, "rank %d: destroy after the failure: %s\n", rank, chorus_last_error());
    bad = 1;
  }
  return bad;
}

static int count_dumps(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  if (!d)
    return 0;
  for (struct dirent *e; (e = readdir(d));) {
    size_t l = strlen(e->d_name);
    if (l > 6 && strcmp(e->d_name + l - 6, ".trace") == 0)
      n++;
  }
  closedir(d);
  return n;
}

static void run(const char *prov, int size, enum scenario sc) {
  args_t a = {.sc = sc, .culprit = size - 2};
  char env_prov[64], env_dir[300], env_timeout[64], cmd[600], out[8192];

  snprintf(a.dir, sizeof(a.dir), "/tmp/chorus-diverge-%d-%s-%d-%s", (int)getpid(), prov, size,
           sc_name[sc]);
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", a.dir);
  cr_assert_eq(system(cmd), 0);
  snprintf(env_prov, sizeof(env_prov), "CHORUS_PROVIDER=%s", prov);
  snprintf(env_dir, sizeof(env_dir), "CHORUS_TRACE_DIR=%s", a.dir);
  /* a mismatch must be caught by the message, not the timeout */
  snprintf(env_timeout, sizeof(env_timeout), "CHORUS_TIMEOUT=%d",
           sc == SC_COUNT || sc == SC_DTYPE ? MISMATCH_TIMEOUT_S : TIMEOUT_S);
  const char *envs[] = {env_prov,
                        env_dir,
                        env_timeout,
                        "CHORUS_PEER_TIMEOUT=4",
                        "CHORUS_WATCHDOG_MS=200",
                        "CHORUS_CONNECT_TIMEOUT=60",
                        NULL};
  double t0 = now_s();
  mp_result_t r = mp_run(size, rank_main, &a, 90, envs);
  cr_log_info("%s %d ranks %s: %.1f s", prov, size, sc_name[sc], now_s() - t0);
  cr_assert_eq(r.timed_out, 0, "%s %d ranks %s: the job hung", prov, size, sc_name[sc]);
  for (int i = 0; i < size; i++) {
    if (sc == SC_KILL && i == a.culprit)
      cr_assert_eq(r.status[i], -SIGKILL, "the culprit was to be killed");
    else
      cr_assert_eq(r.status[i], 0, "%s %d ranks %s: rank %d failed (status %d)", prov, size,
                   sc_name[sc], i, r.status[i]);
  }
  /* nothing left in /dev/shm, the killed rank's region included */
  cr_assert_eq(mp_count_dev_shm_of(&r, size), 0, "%s %d ranks %s: /dev/shm files left behind", prov,
               size, sc_name[sc]);
  int live = sc == SC_KILL ? size - 1 : size;
  cr_assert_eq(count_dumps(a.dir), live, "%s %d ranks %s: %d dumps for %d live ranks", prov, size,
               sc_name[sc], count_dumps(a.dir), live);

  /* chorus-trace names the same culprit */
  snprintf(cmd, sizeof(cmd), "%s/tools/chorus-trace '%s' 2>&1", CHORUS_BUILD_DIR, a.dir);
  int st = mp_capture(cmd, out, sizeof(out));
  char who[32];
  snprintf(who, sizeof(who), "rank %d", a.culprit);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "chorus-trace found no culprit:\n%s", out);
  const char *first_line_end = strchr(out, '\n');
  size_t head = first_line_end ? (size_t)(first_line_end - out) : strlen(out);
  char diag[2048];
  snprintf(diag, sizeof(diag), "%.*s", (int)(head < sizeof(diag) - 1 ? head : sizeof(diag) - 1),
           out);
  cr_assert(strstr(out, who), "chorus-trace does not name %s:\n%s", who, out);
  cr_log_info("chorus-trace: %s", diag);
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", a.dir);
  cr_assert_eq(system(cmd), 0);
}

TestSuite(diverge, .timeout = 200);

#define SCENARIOS(prov, n)                                                                         \
  Test(diverge, prov##_##n##_skipped_step) {                                                       \
    run(#prov, n, SC_SKIP);                                                                        \
  }                                                                                                \
  Test(diverge, prov##_##n##_mismatched_count) {                                                   \
    run(#prov, n, SC_COUNT);                                                                       \
  }                                                                                                \
  Test(diverge, prov##_##n##_mismatched_dtype) {                                                   \
    run(#prov, n, SC_DTYPE);                                                                       \
  }                                                                                                \
  Test(diverge, prov##_##n##_killed_rank) {                                                        \
    run(#prov, n, SC_KILL);                                                                        \
  }                                                                                                \
  Test(diverge, prov##_##n##_stalled_rank) {                                                       \
    run(#prov, n, SC_STALL);                                                                       \
  }

SCENARIOS(shm, 4)
SCENARIOS(tcp, 4)
SCENARIOS(shm, 8)
SCENARIOS(tcp, 8)
SCENARIOS(sock, 4)
SCENARIOS(sock, 8)
