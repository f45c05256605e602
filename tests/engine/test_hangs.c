/*
 * Hangs the watchdog judges from its wait-for picture, with no timeout to
 * wait for, over shm and sock at 4 and 8 ranks (issue 44):
 *
 *   leave   the culprit destroys its communicator at step 2 and exits while
 *           the others enter that step's allreduce: every rank fails naming
 *           it within two watchdog periods, and its destroy does not wait for
 *           the timeout;
 *   extra   the culprit makes one allreduce more after the loop while the
 *           others destroy: it fails naming itself as the one that called
 *           after the others left, and nobody's destroy waits for the timeout;
 *   p2p     at step 2 the last two ranks receive from each other (a cycle of
 *           blocking receives) while the others enter the allreduce: every
 *           rank fails with the cycle, its members and the calls they wait in;
 *   p2p-coll at step 2 the culprit receives from rank 0, which is in the
 *           allreduce waiting for it: the cycle runs through the collective;
 *   root    at step 2 the culprit broadcasts from itself while the others
 *           broadcast from rank 0: its messages go to ranks that expect
 *           another sender and are never received, so ranks whose part
 *           completes without them return success and go on (then calling
 *           barriers); every rank fails with CHORUS_ERR_MISMATCH naming the
 *           culprit and its root within two periods of that broadcast (a
 *           rank that got the culprit's message at once, in its own words).
 *
 * CHORUS_TIMEOUT is long enough (TIMEOUT_S) that any of these judged at the
 * timeout fails the test; each rank prints its seconds to the verdict.
 * chorus-trace, given the job's dumps, must say the same as the verdict.
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

#define TIMEOUT_S 8 /* CHORUS_TIMEOUT of these jobs */
#define PERIOD_MS 200
/* two periods, with room for a loaded machine (2 cores, 8 ranks and more
 * jobs): still far from the timeout */
#define BOUND_S 2.5
#define STEPS 4
#define GRAD 4096

enum scenario { SC_LEAVE, SC_EXTRA, SC_P2P, SC_P2P_COLL, SC_ROOT };

static const char *const sc_name[] = {"leave", "extra", "p2p", "p2p-coll", "root"};

typedef struct args {
  enum scenario sc;
  int culprit;
} args_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Every piece of want[] (NULL-terminated) in msg. */
static int says(const char *msg, const char *const *want, int rank, const char *sc) {
  for (int i = 0; want[i]; i++)
    if (!strstr(msg, want[i])) {
      fprintf(stderr, "rank %d (%s): the message lacks \"%s\": %s\n", rank, sc, want[i], msg);
      return 1;
    }
  return 0;
}

static int rank_main(int rank, int size, const char *addr, void *arg) {
  const args_t *a = arg;
  const bool culprit = rank == a->culprit;
  const char *sc = sc_name[a->sc];
  static float grad[GRAD], params[64];
  chorus_comm_t *c;
  chorus_result rc = chorus_comm_init(&c, rank, size, addr);
  double t_call = 0, t_root = 0, t0;

  if (rc) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    return 1;
  }
  for (int step = 0; step < STEPS && !rc; step++) {
    t_call = now_s();
    if (step == 2 && a->sc == SC_LEAVE && culprit) {
      t0 = now_s();
      rc = chorus_comm_destroy(c);
      double took = now_s() - t0;
      fprintf(stderr, "rank %d (%s): left; its destroy returned %s after %.2f s\n", rank, sc,
              chorus_strerror(rc), took);
      if (took > BOUND_S + 1) {
        fprintf(stderr, "rank %d (%s): its destroy blocked %.1f s\n", rank, sc, took);
        return 1;
      }
      return 0;
    }
    if (step == 2 && a->sc == SC_P2P && rank >= size - 2) {
      int peer = rank == size - 2 ? size - 1 : size - 2;
      rc = chorus_recv(c, params, 64, CHORUS_FLOAT32, peer);
      break;
    }
    if (step == 2 && a->sc == SC_P2P_COLL && culprit) {
      rc = chorus_recv(c, params, 64, CHORUS_FLOAT32, 0);
      break;
    }
    rc = chorus_allreduce(c, grad, grad, GRAD, CHORUS_FLOAT32, CHORUS_SUM);
    if (step == 2 && a->sc == SC_ROOT)
      t_root = now_s();
    if (!rc)
      rc = chorus_bcast(c, params, params, 64, CHORUS_FLOAT32,
                        step == 2 && a->sc == SC_ROOT && culprit ? rank : 0);
  }
  if (a->sc == SC_ROOT) { /* whoever returned success goes on calling until the verdict */
    while (!rc && now_s() - t_root < BOUND_S + 2) {
      usleep(10000);
      rc = chorus_barrier(c);
    }
    t_call = t_root;
  }
  if (!rc && a->sc == SC_EXTRA && culprit) {
    t_call = now_s();
    rc = chorus_allreduce(c, grad, grad, GRAD, CHORUS_FLOAT32, CHORUS_SUM);
  }
  double took = now_s() - t_call;
  char msg[1200], who[32];
  snprintf(msg, sizeof(msg), "%s", chorus_comm_last_error(c));
  snprintf(who, sizeof(who), "rank %d", a->culprit);
  int bad = 0;
  bool fails = a->sc != SC_EXTRA || culprit;
  if (!fails) {
    if (rc) {
      fprintf(stderr, "rank %d (%s): an innocent's call failed: %s: %s\n", rank, sc,
              chorus_strerror(rc), msg);
      bad = 1;
    }
  } else if (rc != (a->sc == SC_ROOT ? CHORUS_ERR_MISMATCH : CHORUS_ERR_DIVERGED)) {
    fprintf(stderr, "rank %d (%s): got %s, expected %s: %s\n", rank, sc, chorus_strerror(rc),
            a->sc == SC_ROOT ? "CHORUS_ERR_MISMATCH" : "CHORUS_ERR_DIVERGED", msg);
    bad = 1;
  } else if (took > BOUND_S) {
    fprintf(stderr, "rank %d (%s): judged after %.2f s, not within two periods: %s\n", rank, sc,
            took, msg);
    bad = 1;
  } else {
    char a0[64], a1[64], call[64];
    const char *want[6] = {NULL};
    int p = size - 2, q = size - 1;
    switch (a->sc) {
    case SC_LEAVE:
      want[0] = who;
      want[1] = "destroyed the communicator";
      want[2] = "left";
      break;
    case SC_EXTRA:
      snprintf(a0, sizeof(a0), "rank %d called #", a->culprit);
      want[0] = a0;
      want[1] = "after the others left";
      break;
    case SC_P2P:
      snprintf(a0, sizeof(a0), "rank %d waits in recv from rank %d", p, q);
      snprintf(a1, sizeof(a1), "rank %d waits in recv from rank %d", q, p);
      want[0] = "deadlock";
      want[1] = a0;
      want[2] = a1;
      break;
    case SC_ROOT:
      /* the verdict, or the own words of a rank whose parent was the culprit */
      snprintf(a0, sizeof(a0), "rank %d called bcast(", a->culprit);
      snprintf(a1, sizeof(a1), "root %d, ", a->culprit);
      want[0] = a0;
      want[1] = a1;
      break;
    case SC_P2P_COLL:
      snprintf(a0, sizeof(a0), "rank %d waits in recv from rank 0", a->culprit);
      snprintf(call, sizeof(call), "which rank %d has not called", a->culprit);
      want[0] = "deadlock";
      want[1] = a0;
      want[2] = "rank 0 waits in #";
      want[3] = call;
      break;
    }
    bad = says(msg, want, rank, sc);
    if (!bad)
      fprintf(stderr, "rank %d (%s): %s after %.2f s: %s\n", rank, sc, chorus_strerror(rc), took,
              msg);
  }
  t0 = now_s();
  chorus_result drc = chorus_comm_destroy(c);
  double dtook = now_s() - t0;
  if (drc) {
    fprintf(stderr, "rank %d (%s): destroy: %s\n", rank, sc, chorus_last_error());
    bad = 1;
  } else if (dtook > BOUND_S + 1) {
    fprintf(stderr, "rank %d (%s): destroy blocked %.1f s\n", rank, sc, dtook);
    bad = 1;
  } else if (a->sc == SC_EXTRA) {
    fprintf(stderr, "rank %d (%s): destroy took %.2f s\n", rank, sc, dtook);
  }
  return bad;
}

/* chorus-trace's diagnosis line from the job's dumps agrees with the verdict. */
static void check_trace(const char *dir, int size, enum scenario sc, const char *what) {
  char out[16384], w[3][96];
  const int c = size - 2;
  const char *want[4] = {NULL};

  int st = mp_trace_line(dir, out, sizeof(out));
  cr_assert_eq(st, 0, "%s: chorus-trace found no culprit (exit %d):\n%s", what, st, out);
  switch (sc) {
  case SC_LEAVE:
    snprintf(w[0], sizeof(w[0]), "rank %d destroyed the communicator", c);
    snprintf(w[1], sizeof(w[1]), "rank %d diverged (it made fewer calls: it left)", c);
    break;
  case SC_EXTRA:
    snprintf(w[0], sizeof(w[0]), "rank %d called #", c);
    snprintf(w[1], sizeof(w[1]), "rank %d diverged (it called after the others left", c);
    break;
  case SC_P2P: /* "deadlock cycle 6 -> 7 -> 6", either way round */
    snprintf(w[0], sizeof(w[0]), "deadlock cycle ");
    snprintf(w[1], sizeof(w[1]), "%d -> %d", c, c + 1);
    snprintf(w[2], sizeof(w[2]), "%d -> %d", c + 1, c);
    break;
  case SC_P2P_COLL: /* through the collective: the culprit's receive from rank 0 */
    snprintf(w[0], sizeof(w[0]), "deadlock cycle ");
    snprintf(w[1], sizeof(w[1]), "%d -> 0", c);
    snprintf(w[2], sizeof(w[2]), "%d -> 0", c);
    break;
  case SC_ROOT:
    snprintf(w[0], sizeof(w[0]), "root differs");
    snprintf(w[1], sizeof(w[1]), "mismatched call at rank %d", c);
    snprintf(w[2], sizeof(w[2]), "mismatched call at rank %d", c);
    break;
  }
  want[0] = w[0];
  want[1] = w[1];
  cr_assert(strstr(out, want[0]) && (strstr(out, want[1]) || (w[2][0] && strstr(out, w[2]))),
            "%s: chorus-trace disagrees with the verdict (wants \"%s\" and \"%s\"):\n%s", what,
            want[0], want[1], out);
  cr_assert(!strstr(out, "rank 0 diverged"), "%s: chorus-trace blames rank 0:\n%s", what, out);
  cr_log_info("%s: chorus-trace: %s", what, out);
}

static void run(const char *prov, int size, enum scenario sc) {
  args_t a = {.sc = sc, .culprit = size - 2};
  char env_prov[64], env_timeout[64], env_dir[300], dir[256], cmd[300];

  snprintf(dir, sizeof(dir), "/tmp/chorus-hangs-%d-%s-%d-%s", (int)getpid(), prov, size,
           sc_name[sc]);
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
  snprintf(env_dir, sizeof(env_dir), "CHORUS_TRACE_DIR=%s", dir);
  snprintf(env_prov, sizeof(env_prov), "CHORUS_PROVIDER=%s", prov);
  snprintf(env_timeout, sizeof(env_timeout), "CHORUS_TIMEOUT=%d", TIMEOUT_S);
  const char *envs[] = {env_prov,
                        env_timeout,
                        env_dir,
                        "CHORUS_PEER_TIMEOUT=8",
                        "CHORUS_WATCHDOG_MS=200",
                        "CHORUS_CONNECT_TIMEOUT=60",
                        NULL};
  double t0 = now_s();
  mp_result_t r = mp_run(size, rank_main, &a, 60, envs);
  cr_log_info("%s %d ranks %s: %.1f s", prov, size, sc_name[sc], now_s() - t0);
  cr_assert_eq(r.timed_out, 0, "%s %d ranks %s: the job hung", prov, size, sc_name[sc]);
  for (int i = 0; i < size; i++)
    cr_assert_eq(r.status[i], 0, "%s %d ranks %s: rank %d failed (status %d)", prov, size,
                 sc_name[sc], i, r.status[i]);
  cr_assert_eq(mp_count_dev_shm_of(&r, size), 0, "%s %d ranks %s: /dev/shm files left behind", prov,
               size, sc_name[sc]);
  char label[96];
  snprintf(label, sizeof(label), "%s %d ranks %s", prov, size, sc_name[sc]);
  check_trace(dir, size, sc, label);
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

TestSuite(hangs, .timeout = 120);

#define SCENARIOS(prov, n)                                                                         \
  Test(hangs, prov##_##n##_leave) {                                                                \
    run(#prov, n, SC_LEAVE);                                                                       \
  }                                                                                                \
  Test(hangs, prov##_##n##_extra_call) {                                                           \
    run(#prov, n, SC_EXTRA);                                                                       \
  }                                                                                                \
  Test(hangs, prov##_##n##_p2p_cycle) {                                                            \
    run(#prov, n, SC_P2P);                                                                         \
  }                                                                                                \
  Test(hangs, prov##_##n##_p2p_through_collective) {                                               \
    run(#prov, n, SC_P2P_COLL);                                                                    \
  }                                                                                                \
  Test(hangs, prov##_##n##_bcast_roots_differ) {                                                   \
    run(#prov, n, SC_ROOT);                                                                        \
  }

SCENARIOS(shm, 4)
SCENARIOS(sock, 4)
SCENARIOS(shm, 8)
SCENARIOS(sock, 8)
