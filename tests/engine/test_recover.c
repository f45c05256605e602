/*
 * After a failure: chorus_comm_abort from another thread unblocks a waiting
 * call at once and reaches the other ranks (chorus_comm_get_async_error);
 * survivors of a killed rank destroy their communicator and build a smaller
 * one in the same process (what an elastic trainer does), with nothing
 * leaked; dumps on request (chorus_comm_dump, SIGUSR1).
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chorus.h"
#include "mp.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

static int count_traces(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  if (!d)
    return 0;
  for (struct dirent *e; (e = readdir(d));) {
    size_t l = strlen(e->d_name);
    n += l > 6 && strcmp(e->d_name + l - 6, ".trace") == 0;
  }
  closedir(d);
  return n;
}

/* ---- abort ---- */

struct aborter {
  chorus_comm_t *c;
  double at;
};

static void *abort_later(void *arg) {
  struct aborter *a = arg;
  sleep_s(0.5);
  a->at = now_s();
  chorus_comm_abort(a->c);
  return NULL;
}

/* Rank 0 waits in an allreduce that rank 1 never joins; another thread of
 * rank 0 aborts: the call returns at once; rank 1 learns it in the
 * background and its next call fails too. */
static int abort_rank(int rank, int size, const char *addr, void *arg) {
  chorus_comm_t *c;
  float x[256] = {0};
  int bad = 0;

  if (chorus_comm_init(&c, rank, size, addr)) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    return 1;
  }
  if (rank == 0) {
    struct aborter a = {.c = c};
    pthread_t t;
    pthread_create(&t, NULL, abort_later, &a);
    chorus_result rc = chorus_allreduce(c, x, x, 256, CHORUS_FLOAT32, CHORUS_SUM);
    double late = now_s() - a.at;
    pthread_join(t, NULL);
    if (rc != CHORUS_ERR_ABORTED || late > 0.5) {
      fprintf(stderr, "rank 0: allreduce returned %s %.3f s after the abort: %s\n",
              chorus_strerror(rc), late, chorus_comm_last_error(c));
      bad = 1;
    }
  } else {
    /* the abort reaches this rank through the watchdog */
    chorus_result e = CHORUS_SUCCESS;
    double t0 = now_s();
    while (e == CHORUS_SUCCESS && now_s() - t0 < 10) {
      sleep_s(0.05);
      if (chorus_comm_get_async_error(c, &e)) {
        bad = 1;
        break;
      }
    }
    if (e != CHORUS_ERR_ABORTED || !strstr(chorus_comm_last_error(c), "rank 0")) {
      fprintf(stderr, "rank 1: async error %s: %s\n", chorus_strerror(e),
              chorus_comm_last_error(c));
      bad = 1;
    }
    chorus_result rc = chorus_allreduce(c, x, x, 256, CHORUS_FLOAT32, CHORUS_SUM);
    if (rc != CHORUS_ERR_ABORTED) {
      fprintf(stderr, "rank 1: a call after the abort returned %s\n", chorus_strerror(rc));
      bad = 1;
    }
  }
  if (chorus_comm_destroy(c)) {
    fprintf(stderr, "rank %d: destroy: %s\n", rank, chorus_last_error());
    bad = 1;
  }
  return bad;
}

Test(recover, abort_unblocks_and_spreads, .timeout = 60) {
  const char *env[] = {"CHORUS_PROVIDER=shm", "CHORUS_WATCHDOG_MS=100", NULL};
  mp_result_t r = mp_run(2, abort_rank, NULL, 40, env);
  cr_assert_eq(r.timed_out, 0, "hung");
  cr_assert_eq(r.failed, 0, "%d rank(s) failed", r.failed);
}

/* ---- rebuild after a killed rank ---- */

typedef struct rebuild {
  char addr2[64]; /* the second rendezvous */
  const char *prov;
} rebuild_t;

static int rebuild_rank(int rank, int size, const char *addr, void *arg) {
  const rebuild_t *a = arg;
  const int dead = 2;
  chorus_comm_t *c;
  int32_t x[4096];
  int fds = mp_count_fds();
  int bad = 0;

  if (chorus_comm_init(&c, rank, size, addr)) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    return 1;
  }
  chorus_result rc = CHORUS_SUCCESS;
  for (int i = 0; i < 6 && !rc; i++)
    rc = chorus_allreduce(c, x, x, 4096, CHORUS_INT32, CHORUS_SUM); /* rank 2 dies at #3 */
  if (rc != CHORUS_ERR_PEER_LOST || !strstr(chorus_comm_last_error(c), "rank 2")) {
    fprintf(stderr, "rank %d: got %s: %s\n", rank, chorus_strerror(rc), chorus_comm_last_error(c));
    bad = 1;
  }
  if (chorus_comm_destroy(c)) {
    fprintf(stderr, "rank %d: destroy after the loss: %s\n", rank, chorus_last_error());
    bad = 1;
  }
  /* the survivors start again, renumbered, at a new rendezvous */
  unsetenv("CHORUS_FAULTS");
  int nrank = rank - (rank > dead), nsize = size - 1;
  if (chorus_comm_init(&c, nrank, nsize, a->addr2)) {
    fprintf(stderr, "rank %d: init of the smaller communicator: %s\n", rank, chorus_last_error());
    return 1;
  }
  for (int i = 0; i < 4096; i++)
    x[i] = nrank * 100000 + i;
  rc = chorus_allreduce(c, x, x, 4096, CHORUS_INT32, CHORUS_SUM);
  for (int i = 0; !rc && i < 4096; i++) {
    int32_t want = 100000 * (nsize * (nsize - 1) / 2) + nsize * i;
    if (x[i] != want) {
      fprintf(stderr, "rank %d: element %d is %d, want %d\n", rank, i, x[i], want);
      bad = 1;
      break;
    }
  }
  if (rc) {
    fprintf(stderr, "rank %d: allreduce on the smaller communicator: %s: %s\n", rank,
            chorus_strerror(rc), chorus_comm_last_error(c));
    bad = 1;
  }
  if (chorus_comm_destroy(c)) {
    fprintf(stderr, "rank %d: destroy: %s\n", rank, chorus_last_error());
    bad = 1;
  }
  if (mp_count_fds() != fds) {
    fprintf(stderr, "rank %d: %d fds before, %d after\n", rank, fds, mp_count_fds());
    bad = 1;
  }
  return bad;
}

static void rebuild(const char *prov) {
  rebuild_t a = {.prov = prov};
  char env_prov[64];
  snprintf(a.addr2, sizeof(a.addr2), "127.0.0.1:%d", mp_free_port());
  snprintf(env_prov, sizeof(env_prov), "CHORUS_PROVIDER=%s", prov);
  const char *env[] = {env_prov, "CHORUS_FAULTS=kill:rank=2,at=#3", "CHORUS_PEER_TIMEOUT=4",
                       "CHORUS_WATCHDOG_MS=200", NULL};
  mp_result_t r = mp_run(4, rebuild_rank, &a, 90, env);
  cr_assert_eq(r.timed_out, 0, "%s: hung", prov);
  cr_assert_eq(r.status[2], -SIGKILL, "%s: rank 2 was to be killed (status %d)", prov, r.status[2]);
  for (int i = 0; i < 4; i++)
    if (i != 2)
      cr_assert_eq(r.status[i], 0, "%s: rank %d failed", prov, i);
  cr_assert_eq(mp_count_dev_shm_of(&r, 4), 0, "%s: /dev/shm files left behind", prov);
}

Test(recover, rebuild_smaller_after_kill_shm, .timeout = 120) {
  rebuild("shm");
}

Test(recover, rebuild_smaller_after_kill_tcp, .timeout = 120) {
  rebuild("tcp");
}

/* ---- dumps on request ---- */

static int dump_rank(int rank, int size, const char *addr, void *arg) {
  const char *dir = arg;
  chorus_comm_t *c;
  float x[16] = {0};
  int bad = 0;

  if (chorus_comm_init(&c, rank, size, addr)) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    return 1;
  }
  if (chorus_allreduce(c, x, x, 16, CHORUS_FLOAT32, CHORUS_SUM))
    bad = 1;
  if (rank == 0) {
    if (chorus_comm_dump(c, NULL)) {
      fprintf(stderr, "rank 0: chorus_comm_dump: %s\n", chorus_comm_last_error(c));
      bad = 1;
    }
  } else {
    raise(SIGUSR1); /* the watchdog thread writes it */
    double t0 = now_s();
    char mine[64];
    snprintf(mine, sizeof(mine), "rank%05d-", rank);
    bool found = false;
    while (!found && now_s() - t0 < 5) {
      sleep_s(0.05);
      DIR *d = opendir(dir);
      for (struct dirent *e; d && (e = readdir(d));)
        found |= strncmp(e->d_name, mine, strlen(mine)) == 0 && strstr(e->d_name, ".trace");
      if (d)
        closedir(d);
    }
    if (!found) {
      fprintf(stderr, "rank %d: no dump 5 s after SIGUSR1\n", rank);
      bad = 1;
    }
  }
  if (chorus_barrier(c) || chorus_comm_destroy(c))
    bad = 1;
  return bad;
}

Test(recover, dump_on_request_and_sigusr1, .timeout = 60) {
  char dir[128], env_dir[160], cmd[400];
  snprintf(dir, sizeof(dir), "/tmp/chorus-recover-%d", (int)getpid());
  snprintf(env_dir, sizeof(env_dir), "CHORUS_TRACE_DIR=%s", dir);
  const char *env[] = {"CHORUS_PROVIDER=shm", env_dir, NULL};
  mp_result_t r = mp_run(2, dump_rank, dir, 40, env);
  cr_assert_eq(r.failed, 0, "%d rank(s) failed", r.failed);
  cr_assert_eq(count_traces(dir), 2, "%d dumps, want 2", count_traces(dir));
  /* chorus-trace reads them (no culprit: exit 1, not 2) */
  snprintf(cmd, sizeof(cmd), "%s/tools/chorus-trace '%s' >/dev/null 2>&1", CHORUS_BUILD_DIR, dir);
  int st = system(cmd);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "chorus-trace exit %d", WEXITSTATUS(st));
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

/* ---- shrink: continue without a new rendezvous ---- */

static int shrink_rank(int rank, int size, const char *addr, void *arg) {
  chorus_comm_t *c, *s = NULL;
  int32_t x[70000]; /* large enough for the rendezvous paths */
  int fds = mp_count_fds();
  int bad = 0;

  if (chorus_comm_init(&c, rank, size, addr)) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    return 1;
  }
  chorus_result rc = CHORUS_SUCCESS;
  /* rank 1 dies at #2; rank 3 makes one call only and learns of the loss in
   * the background: the survivors have begun different numbers of calls */
  for (int i = 0; i < (rank == 3 ? 1 : 6) && !rc; i++)
    rc = chorus_allreduce(c, x, x, 16, CHORUS_INT32, CHORUS_SUM);
  for (double t0 = now_s(); rank == 3 && !rc && now_s() - t0 < 20;) {
    sleep_s(0.05);
    chorus_comm_get_async_error(c, &rc);
  }
  if (rc != CHORUS_ERR_PEER_LOST) {
    fprintf(stderr, "rank %d: got %s: %s\n", rank, chorus_strerror(rc), chorus_comm_last_error(c));
    bad = 1;
  }
  rc = chorus_comm_shrink(c, &s);
  if (rc || !s) {
    fprintf(stderr, "rank %d: shrink: %s: %s\n", rank, chorus_strerror(rc),
            chorus_comm_last_error(c));
    chorus_comm_destroy(c);
    return 1;
  }
  int nrank = -1, nsize = -1;
  chorus_comm_rank(s, &nrank);
  chorus_comm_size(s, &nsize);
  if (nsize != size - 1 || nrank != rank - (rank > 1)) {
    fprintf(stderr, "rank %d: shrunk to rank %d of %d\n", rank, nrank, nsize);
    bad = 1;
  }
  for (size_t n = 1; n <= 70000 && !bad; n *= 70) {
    for (size_t i = 0; i < n; i++)
      x[i] = nrank * 1000 + (int32_t)(i % 1000);
    rc = chorus_allreduce(s, x, x, n, CHORUS_INT32, CHORUS_SUM);
    for (size_t i = 0; !rc && i < n; i++) {
      int32_t want = 1000 * (nsize * (nsize - 1) / 2) + nsize * (int32_t)(i % 1000);
      if (x[i] != want) {
        fprintf(stderr, "rank %d: count %zu element %zu is %d, want %d\n", rank, n, i, x[i], want);
        bad = 1;
        break;
      }
    }
    if (rc) {
      fprintf(stderr, "rank %d: allreduce of %zu after shrink: %s: %s\n", rank, n,
              chorus_strerror(rc), chorus_comm_last_error(s));
      bad = 1;
    }
  }
  if (chorus_comm_destroy(s) || chorus_comm_destroy(c)) {
    fprintf(stderr, "rank %d: destroy: %s\n", rank, chorus_last_error());
    bad = 1;
  }
  if (mp_count_fds() != fds) {
    fprintf(stderr, "rank %d: %d fds before, %d after\n", rank, fds, mp_count_fds());
    bad = 1;
  }
  return bad;
}

static void shrink(const char *prov) {
  char env_prov[64];
  snprintf(env_prov, sizeof(env_prov), "CHORUS_PROVIDER=%s", prov);
  const char *env[] = {env_prov, "CHORUS_FAULTS=kill:rank=1,at=#2", "CHORUS_WATCHDOG_MS=200", NULL};
  mp_result_t r = mp_run(4, shrink_rank, NULL, 90, env);
  cr_assert_eq(r.timed_out, 0, "%s: hung", prov);
  cr_assert_eq(r.status[1], -SIGKILL, "%s: rank 1 was to be killed", prov);
  for (int i = 0; i < 4; i++)
    if (i != 1)
      cr_assert_eq(r.status[i], 0, "%s: rank %d failed", prov, i);
  cr_assert_eq(mp_count_dev_shm_of(&r, 4), 0, "%s: /dev/shm files left behind", prov);
}

Test(recover, shrink_after_kill_shm, .timeout = 120) {
  shrink("shm");
}

Test(recover, shrink_after_kill_tcp, .timeout = 120) {
  shrink("tcp");
}

/* ---- a frozen rank (SIGSTOP): its heartbeats stop ---- */

static int frozen_rank(int rank, int size, const char *addr, void *arg) {
  chorus_comm_t *c;
  float x[1024] = {0};
  int bad = 0;

  if (chorus_comm_init(&c, rank, size, addr)) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    return 1;
  }
  chorus_result rc = CHORUS_SUCCESS;
  double t_call = now_s();
  for (int i = 0; i < 6 && !rc; i++) {
    if (rank == 2 && i == 2) {
      /* frozen for good; a child of ours ends it after the test's bound */
      pid_t me = getpid();
      if (fork() == 0) {
        sleep_s(8);
        kill(me, SIGKILL);
        _exit(0);
      }
      raise(SIGSTOP);
    }
    t_call = now_s();
    rc = chorus_allreduce(c, x, x, 1024, CHORUS_FLOAT32, CHORUS_SUM);
  }
  double took = now_s() - t_call;
  if (rc != CHORUS_ERR_PEER_LOST || !strstr(chorus_comm_last_error(c), "rank 2") ||
      !strstr(chorus_comm_last_error(c), "heartbeat") || took > 3.0 + 2.0) {
    fprintf(stderr, "rank %d: got %s after %.1f s: %s\n", rank, chorus_strerror(rc), took,
            chorus_comm_last_error(c));
    bad = 1;
  }
  if (chorus_comm_destroy(c)) {
    fprintf(stderr, "rank %d: destroy: %s\n", rank, chorus_last_error());
    bad = 1;
  }
  return bad;
}

static void frozen(const char *prov) {
  char env_prov[64];
  snprintf(env_prov, sizeof(env_prov), "CHORUS_PROVIDER=%s", prov);
  const char *env[] = {env_prov, "CHORUS_PEER_TIMEOUT=3", "CHORUS_TIMEOUT=30",
                       "CHORUS_WATCHDOG_MS=200", NULL};
  mp_result_t r = mp_run(4, frozen_rank, NULL, 60, env);
  cr_assert_eq(r.timed_out, 0, "%s: hung", prov);
  cr_assert_eq(r.status[2], -SIGKILL, "%s: rank 2 was frozen, then killed", prov);
  /* rank 2 died after the others had gone, so nobody removed its shm
   * region: the launcher's work (chorus-run does it), the harness's here */
  mp_remove_dev_shm_of_rank(&r, 2);
  for (int i = 0; i < 4; i++)
    if (i != 2)
      cr_assert_eq(r.status[i], 0, "%s: rank %d failed", prov, i);
  cr_assert_eq(mp_count_dev_shm_of(&r, 4), 0, "%s: /dev/shm files left behind", prov);
}

Test(recover, frozen_rank_is_lost_shm, .timeout = 120) {
  frozen("shm");
}

Test(recover, frozen_rank_is_lost_tcp, .timeout = 120) {
  frozen("tcp");
}

/* ---- a fatal signal: the dying rank still leaves its dump ---- */

static int fatal_rank(int rank, int size, const char *addr, void *arg) {
  chorus_comm_t *c;
  float x[16] = {0};

  /* as in a plain program: Criterion's worker catches SIGABRT itself, and
   * Chorus leaves a handler the application installed alone */
  signal(SIGABRT, SIG_DFL);
  if (chorus_comm_init(&c, rank, size, addr)) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    return 1;
  }
  if (chorus_allreduce(c, x, x, 16, CHORUS_FLOAT32, CHORUS_SUM))
    return 1;
  if (rank == 1)
    abort(); /* SIGABRT: the handler has the watchdog thread write the dump first */
  chorus_result rc = chorus_allreduce(c, x, x, 16, CHORUS_FLOAT32, CHORUS_SUM);
  chorus_comm_destroy(c);
  return rc != CHORUS_ERR_PEER_LOST;
}

Test(recover, fatal_signal_dumps, .timeout = 60) {
  char dir[128], env_dir[160], cmd[400];
  snprintf(dir, sizeof(dir), "/tmp/chorus-fatal-%d", (int)getpid());
  snprintf(env_dir, sizeof(env_dir), "CHORUS_TRACE_DIR=%s", dir);
  const char *env[] = {"CHORUS_PROVIDER=shm", env_dir, "CHORUS_WATCHDOG_MS=200", NULL};
  mp_result_t r = mp_run(2, fatal_rank, NULL, 40, env);
  cr_assert_eq(r.timed_out, 0, "hung");
  cr_assert_eq(r.status[1], -SIGABRT, "rank 1 was to abort (status %d)", r.status[1]);
  cr_assert_eq(r.status[0], 0, "rank 0 failed");
  cr_assert_eq(count_traces(dir), 2, "%d dumps, want 2 (the dying rank's too)", count_traces(dir));
  /* chorus-trace names the dead rank */
  snprintf(cmd, sizeof(cmd), "%s/tools/chorus-trace '%s' 2>&1 | grep -q 'rank 1'", CHORUS_BUILD_DIR,
           dir);
  cr_assert_eq(system(cmd), 0, "chorus-trace does not name rank 1");
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}
