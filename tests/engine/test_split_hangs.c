/*
 * Hangs inside communicators made by chorus_comm_split, judged by the
 * world's watchdog through its picture of every communicator (issue 44,
 * class 1), over shm and sock at 4 and 8 ranks.
 *
 * Every rank splits the world by parity (sub), and for depth 2 splits that
 * again by halves (a sub-communicator of a sub-communicator); then it loops
 * an allreduce in the innermost communicator and one in the world. The
 * culprit is world rank size-2; at step 2 it
 *   skip  skips the inner allreduce and goes on to the world's: the other
 *         members wait in the inner call for it, it waits in the world's
 *         call for them. Every rank fails with CHORUS_ERR_DIVERGED naming
 *         the deadlock, the culprit and the sub-communicator's call (the
 *         members from the inner call they wait in);
 *   kill  dies by SIGKILL: every survivor fails with CHORUS_ERR_PEER_LOST
 *         naming it (the members of its sub-communicators waited for ever
 *         over shm before, and got a bare transport error over sock).
 * The verdict fails every communicator of the family alike (watch.c), so
 * each rank fails in whichever call it is, within two watchdog periods
 * (BOUND_S) of that call's start, far from CHORUS_TIMEOUT; every
 * communicator's destroy returns at once afterwards. chorus-trace, given
 * the dumps (each rank's world and splits), agrees: the deadlock cycle runs
 * through the split and the culprit, or the culprit is lost.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chorus.h"
#include "mp.h"

#define TIMEOUT_S 20
#define BOUND_S 2.5
#define STEPS 4
#define GRAD 4096

enum scenario { SC_SKIP, SC_KILL };

typedef struct args {
  enum scenario sc;
  int depth; /* 1: a split of the world; 2: a split of that */
} args_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int rank_main(int rank, int size, const char *addr, void *arg) {
  const args_t *a = arg;
  const int culprit = size - 2;
  const char *sc = a->sc == SC_SKIP ? "skip" : "kill";
  static float grad[GRAD], inner[GRAD];
  chorus_comm_t *world, *sub = NULL, *subsub = NULL, *target;
  chorus_result rc = chorus_comm_init(&world, rank, size, addr);

  if (rc) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    return 1;
  }
  if ((rc = chorus_comm_split(world, rank % 2, rank, &sub))) {
    fprintf(stderr, "rank %d: split: %s\n", rank, chorus_comm_last_error(world));
    return 1;
  }
  target = sub;
  if (a->depth == 2) {
    int sr;
    chorus_comm_rank(sub, &sr);
    if ((rc = chorus_comm_split(sub, sr / 2, sr, &subsub))) {
      fprintf(stderr, "rank %d: split of the split: %s\n", rank, chorus_comm_last_error(sub));
      return 1;
    }
    target = subsub;
  }
  int tsize;
  chorus_comm_size(target, &tsize);
  /* the culprit's fellow members: those whose inner call fails */
  bool fellow = rank % 2 == culprit % 2 && (a->depth == 1 || rank / 4 == culprit / 4);
  double t_call = 0;
  chorus_comm_t *failed_in = NULL;
  for (int step = 0; step < STEPS && !rc; step++) {
    if (step == 2 && rank == culprit && a->sc == SC_KILL)
      raise(SIGKILL);
    if (!(step == 2 && rank == culprit && a->sc == SC_SKIP)) {
      t_call = now_s();
      rc = chorus_allreduce(target, inner, inner, GRAD, CHORUS_FLOAT32, CHORUS_SUM);
      if (rc) {
        failed_in = target;
        break;
      }
    }
    t_call = now_s();
    rc = chorus_allreduce(world, grad, grad, GRAD, CHORUS_FLOAT32, CHORUS_SUM);
    if (rc)
      failed_in = world;
  }
  double took = now_s() - t_call; /* in the call that failed */
  int bad = 0;
  char msg[1400], who[32];
  snprintf(msg, sizeof(msg), "%s", failed_in ? chorus_comm_last_error(failed_in) : "");
  snprintf(who, sizeof(who), "rank %d", culprit);
  chorus_result want = a->sc == SC_SKIP ? CHORUS_ERR_DIVERGED : CHORUS_ERR_PEER_LOST;
  /* the culprit's fellow members wait in the inner call it skipped; the
   * others fail wherever the verdict finds them */
  bool must_fail_inner = a->sc == SC_SKIP && fellow && rank != culprit;
  if (rc != want) {
    fprintf(stderr, "rank %d (%s, depth %d): got %s, expected %s: %s\n", rank, sc, a->depth,
            chorus_strerror(rc), chorus_strerror(want), msg);
    bad = 1;
  } else if (must_fail_inner && failed_in != target) {
    fprintf(stderr, "rank %d (%s, depth %d): failed in the world communicator, not the inner: %s\n",
            rank, sc, a->depth, msg);
    bad = 1;
  } else if (took > BOUND_S) {
    fprintf(stderr, "rank %d (%s, depth %d): judged %.2f s into its call: %s\n", rank, sc, a->depth,
            took, msg);
    bad = 1;
  } else if (!strstr(msg, who)) {
    fprintf(stderr, "rank %d (%s, depth %d): the message does not name %s: %s\n", rank, sc,
            a->depth, who, msg);
    bad = 1;
  } else if (a->sc == SC_SKIP && (!strstr(msg, "deadlock") || !strstr(msg, "sub-communicator"))) {
    fprintf(stderr, "rank %d (%s, depth %d): no deadlock through the sub-communicator: %s\n", rank,
            sc, a->depth, msg);
    bad = 1;
  } else {
    fprintf(stderr, "rank %d (%s, depth %d): %s in the %s communicator after %.2f s: %s\n", rank,
            sc, a->depth, chorus_strerror(rc), failed_in == target ? "inner" : "world", took, msg);
  }
  double t0 = now_s();
  if (subsub)
    chorus_comm_destroy(subsub);
  chorus_comm_destroy(sub);
  chorus_comm_destroy(world);
  double dtook = now_s() - t0;
  if (dtook > BOUND_S + 1) {
    fprintf(stderr, "rank %d (%s, depth %d): destroying took %.1f s\n", rank, sc, a->depth, dtook);
    bad = 1;
  }
  return bad;
}

/* What chorus-trace makes of the job's dumps (the world's and every split's
 * of each rank): its diagnosis line, which must agree with the verdict: the
 * deadlock through the split for a skip, the culprit lost for a kill. */
static void check_trace(const char *dir, int size, enum scenario sc, const char *what) {
  char out[16384], want[64];
  const int culprit = size - 2;

  int st = mp_trace_line(dir, out, sizeof(out));
  cr_assert_eq(st, 0, "%s: chorus-trace found no culprit (exit %d):\n%s", what, st, out);
  if (sc == SC_SKIP) {
    const char *cyc = strstr(out, "deadlock cycle ");
    cr_assert(cyc && strstr(out, "in the split of ranks"),
              "%s: chorus-trace does not see the deadlock through the split:\n%s", what, out);
    snprintf(want, sizeof(want), " %d ", culprit);
    char ring[256];
    snprintf(ring, sizeof(ring), " %s ", cyc + strlen("deadlock cycle "));
    cr_assert(strstr(ring, want), "%s: the cycle misses rank %d:\n%s", what, culprit, out);
    cr_assert(!strstr(out, "diverged"), "%s: chorus-trace blames a rank:\n%s", what, out);
  } else {
    snprintf(want, sizeof(want), "rank %d lost", culprit);
    cr_assert(strstr(out, want), "%s: chorus-trace does not say %s:\n%s", what, want, out);
  }
  cr_log_info("%s: chorus-trace: %s", what, out);
}

static void run(const char *prov, int size, enum scenario sc, int depth) {
  args_t a = {.sc = sc, .depth = depth};
  char env_prov[64], env_timeout[64], env_dir[300], dir[256], cmd[300];

  snprintf(dir, sizeof(dir), "/tmp/chorus-split-hangs-%d-%s-%d-%d-%d", (int)getpid(), prov, size,
           (int)sc, depth);
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
  snprintf(env_dir, sizeof(env_dir), "CHORUS_TRACE_DIR=%s", dir);
  snprintf(env_prov, sizeof(env_prov), "CHORUS_PROVIDER=%s", prov);
  snprintf(env_timeout, sizeof(env_timeout), "CHORUS_TIMEOUT=%d", TIMEOUT_S);
  const char *envs[] = {env_prov,
                        env_timeout,
                        env_dir,
                        "CHORUS_PEER_TIMEOUT=10",
                        "CHORUS_WATCHDOG_MS=200",
                        "CHORUS_CONNECT_TIMEOUT=60",
                        NULL};
  double t0 = now_s();
  mp_result_t r = mp_run(size, rank_main, &a, 90, envs);
  const char *what = sc == SC_SKIP ? "skip" : "kill";
  cr_log_info("%s %d ranks %s depth %d: %.1f s", prov, size, what, depth, now_s() - t0);
  cr_assert_eq(r.timed_out, 0, "%s %d ranks %s depth %d: the job hung", prov, size, what, depth);
  for (int i = 0; i < size; i++) {
    if (sc == SC_KILL && i == size - 2) {
      cr_assert_eq(r.status[i], -SIGKILL);
      continue;
    }
    cr_assert_eq(r.status[i], 0, "%s %d ranks %s depth %d: rank %d failed (status %d)", prov, size,
                 what, depth, i, r.status[i]);
  }
  if (sc == SC_KILL) /* the killed rank can not remove its own */
    mp_remove_dev_shm_of_rank(&r, size - 2);
  cr_assert_eq(mp_count_dev_shm_of(&r, size), 0, "%s %d ranks %s: /dev/shm files left behind", prov,
               size, what);
  char label[96];
  snprintf(label, sizeof(label), "%s %d ranks %s depth %d", prov, size, what, depth);
  check_trace(dir, size, sc, label);
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

TestSuite(split_hangs, .timeout = 150);

#define SCENARIOS(prov, n)                                                                         \
  Test(split_hangs, prov##_##n##_skip) {                                                           \
    run(#prov, n, SC_SKIP, 1);                                                                     \
  }                                                                                                \
  Test(split_hangs, prov##_##n##_skip_in_a_split_of_a_split) {                                     \
    run(#prov, n, SC_SKIP, 2);                                                                     \
  }                                                                                                \
  Test(split_hangs, prov##_##n##_member_killed) {                                                  \
    run(#prov, n, SC_KILL, 1);                                                                     \
  }

SCENARIOS(shm, 4)
SCENARIOS(sock, 4)
SCENARIOS(shm, 8)
SCENARIOS(sock, 8)
