/*
 * Chorus as a guest in a trainer's process, at 2 ranks over shm and sock:
 *  - fork after init (a data-loader worker): the child never touches the
 *    communicator and leaves through exit(), running the process's exit
 *    handlers, while another thread of the parent is inside Chorus calls;
 *    it must end with status 0, in time, and the parent's collectives go on
 *    with the right results;
 *  - the CPU affinity the caller set (one CPU, or two) is its affinity after
 *    init, collectives and destroy, and so is a bystander thread's;
 *  - destroy leaves no thread behind (/proc/self/task).
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
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

static int count_threads(void) {
  DIR *d = opendir("/proc/self/task");
  struct dirent *e;
  int n = 0;

  if (!d)
    return -1;
  while ((e = readdir(d)))
    n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* An allreduce of count int32 whose result every rank checks. */
static int checked_allreduce(chorus_comm_t *c, int rank, int size, size_t count, int salt) {
  int32_t *x = malloc(count * sizeof(*x)), *y = malloc(count * sizeof(*y));
  int bad = 0;

  if (!x || !y) {
    free(x);
    free(y);
    return 1;
  }
  for (size_t i = 0; i < count; i++)
    x[i] = (int32_t)(rank * 1000 + (int)(i % 97) + salt);
  chorus_result rc = chorus_allreduce(c, x, y, count, CHORUS_INT32, CHORUS_SUM);
  for (size_t i = 0; i < count && !rc && !bad; i++) {
    int32_t want = (int32_t)(1000 * size * (size - 1) / 2 + size * ((int)(i % 97) + salt));
    if (y[i] != want) {
      fprintf(stderr, "rank %d: allreduce of %zu: [%zu] = %d, want %d\n", rank, count, i, (int)y[i],
              (int)want);
      bad = 1;
    }
  }
  if (rc)
    fprintf(stderr, "rank %d: allreduce of %zu: %s: %s\n", rank, count, chorus_strerror(rc),
            chorus_comm_last_error(c));
  free(x);
  free(y);
  return rc || bad;
}

static chorus_comm_t *init_or_say(int rank, int size, const char *rv) {
  chorus_comm_t *c = NULL;
  chorus_result rc = chorus_comm_init(&c, rank, size, rv);
  if (rc)
    fprintf(stderr, "rank %d: init: %s: %s\n", rank, chorus_strerror(rc), chorus_last_error());
  return c;
}

static void run2(mp_rank_fn fn, const char *provider) {
  char prov[64];
  const char *env[] = {prov, NULL};

  snprintf(prov, sizeof(prov), "CHORUS_PROVIDER=%s", provider);
  mp_result_t r = mp_run(2, fn, NULL, 90, env);
  cr_assert_eq(r.failed, 0, "%d ranks failed over %s (see above)", r.failed, provider);
  cr_assert_eq(mp_count_dev_shm_of(&r, 2), 0, "/dev/shm entries left over %s", provider);
}

/* ---- fork ---- */

/* A thread of the trainer's calling into Chorus while the main thread forks:
 * each call takes the library's locks (the handle registry's). */
static atomic_bool busy_on;
static void *busy_caller(void *arg) {
  chorus_comm_t *c = arg;
  int r;

  while (atomic_load(&busy_on)) {
    (void)chorus_comm_rank(c, &r);
    (void)chorus_comm_last_error(c);
  }
  return NULL;
}

#define FORKS 40

/* Forks a worker that allocates, prints and exit()s; 0 when it ended with
 * status 0 within 10 s. */
static int fork_worker(int rank, int i) {
  pid_t pid = fork();
  if (pid < 0)
    return 1;
  if (pid == 0) {
    char *p = malloc(1 << 16);
    if (p)
      memset(p, i, 1 << 16);
    free(p);
#ifdef __SANITIZE_ADDRESS__
    /* LeakSanitizer's check at a forked child's exit takes what the
     * parent's threads held (their stacks are no roots here) for leaks and
     * fails the child: the developer build runs the exit() path below */
    _exit(0);
#endif
    exit(0); /* not _exit: the exit handlers and destructors run */
  }
  int st = 0;
  pid_t got = 0;
  double deadline = now_s() + 10;
  while ((got = waitpid(pid, &st, WNOHANG)) == 0 && now_s() < deadline)
    usleep(1000);
  if (got == 0) {
    fprintf(stderr, "rank %d: worker %d (pid %d) still runs 10 s after fork (state %c)\n", rank, i,
            (int)pid, mp_proc_state(pid));
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return 1;
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "rank %d: worker %d ended by %s %d\n", rank, i,
            WIFSIGNALED(st) ? "signal" : "exit code",
            WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    return 1;
  }
  return 0;
}

static int rank_fork(int rank, int size, const char *rv, void *arg) {
  chorus_comm_t *c = init_or_say(rank, size, rv);
  pthread_t busy;
  int bad = 0;

  if (!c)
    return 1;
  bad |= checked_allreduce(c, rank, size, 4096, 1);
  atomic_store(&busy_on, true);
  if (pthread_create(&busy, NULL, busy_caller, c))
    return 1;
  for (int i = 0; i < FORKS && !bad; i++) {
    /* a nonblocking call in flight on the progress thread while forking */
    int32_t x[1024], y[1024];
    chorus_request_t *req = NULL;
    for (int k = 0; k < 1024; k++)
      x[k] = rank + k + i;
    chorus_result rc = chorus_iallreduce(c, x, y, 1024, CHORUS_INT32, CHORUS_SUM, &req);
    bad |= rc != CHORUS_SUCCESS;
    bad |= fork_worker(rank, i);
    if (!rc)
      rc = chorus_wait(&req);
    if (rc || y[5] != 2 * (5 + i) + 1) {
      fprintf(stderr, "rank %d: iallreduce across fork %d: %s, y[5] %d\n", rank, i,
              chorus_strerror(rc), (int)y[5]);
      bad = 1;
    }
    bad |= checked_allreduce(c, rank, size, (size_t)1 << (8 + i % 12), i);
  }
  atomic_store(&busy_on, false);
  pthread_join(busy, NULL);
  if (chorus_comm_destroy(c)) {
    fprintf(stderr, "rank %d: destroy: %s\n", rank, chorus_last_error());
    bad = 1;
  }
  return bad;
}

TestSuite(process, .timeout = 240);

Test(process, fork_after_init_shm) {
  run2(rank_fork, "shm");
}

Test(process, fork_after_init_sock) {
  run2(rank_fork, "sock");
}

/* ---- CPU affinity ---- */

static const char *mask_str(const cpu_set_t *m, char *buf, size_t len) {
  size_t at = 0;
  buf[0] = '\0';
  for (int cpu = 0; cpu < CPU_SETSIZE && at + 8 < len; cpu++)
    if (CPU_ISSET(cpu, m))
      at += (size_t)snprintf(buf + at, len - at, "%s%d", at ? "," : "", cpu);
  return buf;
}

static bool mask_is(const cpu_set_t *want, int rank, const char *who, const char *when) {
  cpu_set_t now;
  char a[256], b[256];
  if (sched_getaffinity(0, sizeof(now), &now) == 0 && CPU_EQUAL(&now, want))
    return true;
  fprintf(stderr, "rank %d: %s %s: affinity {%s}, not the {%s} it set\n", rank, who, when,
          mask_str(&now, a, sizeof(a)), mask_str(want, b, sizeof(b)));
  return false;
}

/* A thread of the trainer's, pinned by it, that only sleeps; reports its
 * mask on request. */
static pthread_t bystander;
static cpu_set_t bystander_mask;
static atomic_int bystander_ok = -1; /* -1: not asked, 0 / 1: answer */
static atomic_bool bystander_stop;
static void *bystander_main(void *arg) {
  pthread_setaffinity_np(pthread_self(), sizeof(bystander_mask), &bystander_mask);
  while (!atomic_load(&bystander_stop))
    usleep(1000);
  cpu_set_t now;
  atomic_store(&bystander_ok,
               sched_getaffinity(0, sizeof(now), &now) == 0 && CPU_EQUAL(&now, &bystander_mask));
  return NULL;
}

/* arg: CPUs of the caller's mask: 1 (this rank's own) or 2 (all ranks'). */
static int rank_affinity(int rank, int size, const char *rv, void *arg) {
  int want_cpus = (int)(intptr_t)arg;
  cpu_set_t all, mine;
  int cpus[CPU_SETSIZE], n = 0, bad = 0;

  if (sched_getaffinity(0, sizeof(all), &all))
    return 1;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
    if (CPU_ISSET(cpu, &all))
      cpus[n++] = cpu;
  /* one CPU: not the one Chorus would take for this rank's own (local rank
   * i's is the i-th of the mask), so that keeping the mask is not luck */
  CPU_ZERO(&mine);
  for (int k = 0; k < want_cpus; k++)
    CPU_SET(cpus[(rank + 1 + k) % n], &mine);
  if (sched_setaffinity(0, sizeof(mine), &mine))
    return 1;
  CPU_ZERO(&bystander_mask);
  CPU_SET(cpus[rank % n], &bystander_mask);
  if (pthread_create(&bystander, NULL, bystander_main, NULL))
    return 1;

  chorus_comm_t *c = init_or_say(rank, size, rv);
  if (!c)
    return 1;
  bad |= !mask_is(&mine, rank, "caller", "after init");
  for (int i = 0; i < 60 && !bad; i++)
    bad |= checked_allreduce(c, rank, size, (size_t)1 << (4 + i % 18), i);
  if (chorus_barrier(c))
    bad = 1;
  bad |= !mask_is(&mine, rank, "caller", "after collectives");
  if (chorus_comm_destroy(c)) {
    fprintf(stderr, "rank %d: destroy: %s\n", rank, chorus_last_error());
    bad = 1;
  }
  bad |= !mask_is(&mine, rank, "caller", "after destroy");
  atomic_store(&bystander_stop, true);
  pthread_join(bystander, NULL);
  if (atomic_load(&bystander_ok) != 1) {
    fprintf(stderr, "rank %d: the bystander thread's affinity changed\n", rank);
    bad = 1;
  }
  return bad;
}

static void affinity_case(int cpus, const char *provider) {
  cpu_set_t all;
  cr_assert_eq(sched_getaffinity(0, sizeof(all), &all), 0);
  if (CPU_COUNT(&all) < cpus)
    cr_skip_test("%d CPUs: a mask of %d can not be set", CPU_COUNT(&all), cpus);
  char prov[64];
  const char *env[] = {prov, NULL};
  snprintf(prov, sizeof(prov), "CHORUS_PROVIDER=%s", provider);
  mp_result_t r = mp_run(2, rank_affinity, (void *)(intptr_t)cpus, 90, env);
  cr_assert_eq(r.failed, 0, "%d ranks failed over %s (see above)", r.failed, provider);
}

/* one CPU: "the application placed it", which Chorus must leave alone */
Test(process, affinity_one_cpu_kept_shm) {
  affinity_case(1, "shm");
}
Test(process, affinity_one_cpu_kept_sock) {
  affinity_case(1, "sock");
}
/* two CPUs: each rank has one of its own there (CHORUS_SPREAD_CORES), which
 * Chorus moves a caller to and gives the mask back */
Test(process, affinity_two_cpus_kept_shm) {
  affinity_case(2, "shm");
}
Test(process, affinity_two_cpus_kept_sock) {
  affinity_case(2, "sock");
}

/* ---- threads ---- */

static int rank_threads(int rank, int size, const char *rv, void *arg) {
  int before = count_threads(), bad;
  chorus_comm_t *c = init_or_say(rank, size, rv);

  if (!c)
    return 1;
  bad = checked_allreduce(c, rank, size, 1 << 16, 0);
  if (chorus_comm_destroy(c)) {
    fprintf(stderr, "rank %d: destroy: %s\n", rank, chorus_last_error());
    return 1;
  }
  /* a joined thread may linger in /proc a moment */
  int after = count_threads();
  for (int i = 0; i < 200 && after != before; i++) {
    usleep(5000);
    after = count_threads();
  }
  if (after != before) {
    fprintf(stderr, "rank %d: %d threads before init, %d after destroy\n", rank, before, after);
    bad = 1;
  }
  return bad;
}

Test(process, no_thread_after_destroy_shm) {
  run2(rank_threads, "shm");
}

Test(process, no_thread_after_destroy_sock) {
  run2(rank_threads, "sock");
}

Test(process, no_thread_after_destroy_tcp) {
  run2(rank_threads, "tcp");
}
