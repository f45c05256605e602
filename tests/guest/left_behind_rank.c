/*
 * left_behind_rank.c - one rank of test_left_behind's jobs: creates a
 * communicator, runs allreduces, destroys it, and dies where it is told to
 * (SIGKILL, or exit(1) without chorus_comm_destroy) as a trainer's process
 * dies: during creation, in the moments its shm region has a name, in a
 * collective or in destroy.
 *
 * Environment:
 *   LB_RANK, LB_SIZE, LB_RENDEZVOUS  set: chorus_comm_init with them (a
 *               launcher that cleans nothing up); unset: chorus-run's
 *               variables (chorus_comm_init_from_env)
 *   LB_DIE      which rank dies: a number, "all", or anything else (none)
 *   LB_HOW      kill (SIGKILL) | exit (exit(1), no destroy)
 *   LB_WHEN     init:US    US microseconds after the process started
 *               window:US  US after this rank's region shows in /dev/shm
 *               coll:K:US  US into the K-th of LB_CALLS allreduces
 *               destroy:US US into chorus_comm_destroy
 *   LB_ON_ERROR what a rank does when a call fails: destroy (then exit 1)
 *               or exit (exit(1) at once, without destroy)
 *   LB_REPORT   a file this rank appends lines to (one write each):
 *               "start PID RANK", "init PID RANK NAMED" (NAMED: files of
 *               this pid in /dev/shm once creation returned), "die PID RANK
 *               PHASE NAMED" just before it dies, "done PID RANK RC"
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <chorus.h>

#define LB_CALLS 20
#define LB_COUNT (16 * 1024) /* floats: 64 KiB a call */

enum when { W_INIT, W_WINDOW, W_COLL, W_DESTROY };

static int rank = -1, report_fd = -1;
static bool dies, by_exit;
static enum when when;
static long when_us;
static int when_call;
static atomic_int armed;                     /* the killer may start counting */
static _Atomic(const char *) phase = "init"; /* where the main thread is */

static void report(const char *fmt, ...) {
  char line[256];
  va_list ap;

  if (report_fd < 0)
    return;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  if (n > 0 && write(report_fd, line, (size_t)n) < 0)
    perror("left_behind_rank: report");
}

/* Files of this process in /dev/shm (chorus-PID-...). */
static int own_files(void) {
  char prefix[32];
  int n = 0, plen = snprintf(prefix, sizeof(prefix), "chorus-%d-", (int)getpid());
  DIR *d = opendir("/dev/shm");
  struct dirent *e;

  if (!d)
    return -1;
  while ((e = readdir(d)))
    n += strncmp(e->d_name, prefix, (size_t)plen) == 0;
  closedir(d);
  return n;
}

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, us % 1000000 * 1000};
  while (nanosleep(&ts, &ts) && errno == EINTR) {
  }
}

static atomic_int exit_now; /* the main thread exits at its next look */

/* exit(1) runs the process's exit handlers and library destructors, which
 * is only defined while no other thread is inside a library that they tear
 * down: a trainer exits from its main thread, between calls (an exception),
 * perhaps with nonblocking calls in flight. So in a collective the main
 * thread exits itself (with its allreduce in flight); in creation and
 * destroy, where it is inside Chorus, the rank ends by _exit(1), without
 * destroy and without handlers. */
static void die(void) {
  report("die %d %d %s %d\n", (int)getpid(), rank, atomic_load(&phase), own_files());
  if (by_exit && when == W_COLL) {
    atomic_store(&exit_now, 1);
    for (;;)
      pause();
  }
  if (by_exit)
    _exit(1);
  kill(getpid(), SIGKILL);
  for (;;)
    pause();
}

static void *killer(void *arg) {
  (void)arg;
  if (when == W_WINDOW) {
    /* the region shows between the transport's open and settle */
    while (own_files() <= 0 && !atomic_load(&armed))
      sleep_us(20);
    if (own_files() <= 0) { /* creation ended, and no region ever seen: not shm */
      atomic_store(&phase, "window-missed");
      die();
    }
  } else {
    while (!atomic_load(&armed))
      sleep_us(50);
  }
  sleep_us(when_us);
  die();
  return NULL;
}

static _Noreturn int failed(chorus_comm_t *comm, const char *what, chorus_result rc) {
  const char *on_error = getenv("LB_ON_ERROR");
  fprintf(stderr, "left_behind_rank %d: %s: %s: %s\n", rank, what, chorus_strerror(rc),
          comm ? chorus_comm_last_error(comm) : chorus_last_error());
  if (comm && !(on_error && strcmp(on_error, "exit") == 0))
    chorus_comm_destroy(comm);
  report("done %d %d 1\n", (int)getpid(), rank);
  if (dies) { /* the victim dies as planned (from here), whatever failed first */
    atomic_store(&armed, 1);
    for (;;) { /* exit(1) in a collective: the killer asks this thread to exit (die()) */
      if (atomic_load(&exit_now))
        exit(1);
      sleep_us(1000);
    }
  }
  exit(1);
}

int main(void) {
  const char *r = getenv("LB_RANK"), *die_env = getenv("LB_DIE"), *how = getenv("LB_HOW");
  const char *w = getenv("LB_WHEN"), *rep = getenv("LB_REPORT");
  chorus_comm_t *comm = NULL;
  chorus_result rc;
  pthread_t t;

  if (rep && (report_fd = open(rep, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600)) < 0) {
    perror("left_behind_rank: LB_REPORT");
    return 2;
  }
  rank = r ? atoi(r) : atoi(getenv("CHORUS_RANK") ? getenv("CHORUS_RANK") : "-1");
  dies = die_env && (strcmp(die_env, "all") == 0 ||
                     (isdigit((unsigned char)die_env[0]) && atoi(die_env) == rank));
  by_exit = how && strcmp(how, "exit") == 0;
  report("start %d %d\n", (int)getpid(), rank);
  if (dies) {
    if (!w) {
      when = W_INIT;
    } else if (sscanf(w, "init:%ld", &when_us) == 1) {
      when = W_INIT;
    } else if (sscanf(w, "window:%ld", &when_us) == 1) {
      when = W_WINDOW;
    } else if (sscanf(w, "coll:%d:%ld", &when_call, &when_us) == 2) {
      when = W_COLL;
    } else if (sscanf(w, "destroy:%ld", &when_us) == 1) {
      when = W_DESTROY;
    } else {
      fprintf(stderr, "left_behind_rank: bad LB_WHEN %s\n", w);
      return 2;
    }
    if (when == W_INIT)
      atomic_store(&armed, 1);
    if (pthread_create(&t, NULL, killer, NULL)) {
      perror("left_behind_rank: pthread_create");
      return 2;
    }
  }

  if (r)
    rc = chorus_comm_init(&comm, rank, atoi(getenv("LB_SIZE")), getenv("LB_RENDEZVOUS"));
  else
    rc = chorus_comm_init_from_env(&comm);
  if (rc)
    return failed(NULL, "chorus_comm_init", rc);
  report("init %d %d %d\n", (int)getpid(), rank, own_files());
  if (dies && when == W_WINDOW)
    atomic_store(&armed, 1); /* creation is over: the killer stops looking */

  float *buf = calloc(LB_COUNT, sizeof(float));
  if (!buf)
    return failed(comm, "calloc", CHORUS_ERR_NO_MEMORY);
  atomic_store(&phase, "coll");
  for (int k = 0; k < LB_CALLS; k++) {
    if (dies && when == W_COLL && k == when_call)
      atomic_store(&armed, 1);
    chorus_request_t *req = NULL;
    int done = 0;
    if ((rc = chorus_iallreduce(comm, buf, buf, LB_COUNT, CHORUS_FLOAT32, CHORUS_SUM, &req)))
      return failed(comm, "chorus_iallreduce", rc);
    while (!done) {
      if (atomic_load(&exit_now))
        exit(1); /* an exception in the trainer's main thread, the call in flight */
      if ((rc = chorus_test(&req, &done)))
        return failed(comm, "chorus_allreduce", rc);
      if (!done)
        sleep_us(20);
    }
  }
  free(buf);
  atomic_store(&phase, "destroy");
  if (dies && when == W_DESTROY)
    atomic_store(&armed, 1);
  rc = chorus_comm_destroy(comm);
  atomic_store(&phase, "after");
  report("done %d %d %d\n", (int)getpid(), rank, rc ? 1 : 0);
  if (dies) { /* not dead yet: wait for it */
    for (;;) {
      if (atomic_load(&exit_now))
        exit(1);
      sleep_us(1000);
    }
  }
  return rc ? 1 : 0;
}
