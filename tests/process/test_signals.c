/*
 * Chorus leaves the process's signal dispositions as it found them: from
 * dlopen of libchorus.so through a communicator's creation, a collective and
 * its destruction, every signal 1..SIGRTMAX keeps its handler, flags and
 * mask, over shm and over sock; IPATH_NO_BACKTRACE, read by a library that
 * libfabric links, is kept as the user set it (or unset). And SIGTERM or
 * SIGINT sent to a rank blocked in a collective ends it with that signal.
 *
 * This binary calls libchorus only through dlopen (nothing of chorus_static
 * is linked in): what is measured is what loading the shared library does.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chorus.h" /* types only: the functions come from dlsym */
#include "mp.h"

#define LIBCHORUS CHORUS_BUILD_DIR "/engine/libchorus.so"

/* The API as dlsym gives it. */
typedef struct api {
  __typeof__(chorus_comm_init) *init;
  __typeof__(chorus_allreduce) *allreduce;
  __typeof__(chorus_comm_destroy) *destroy;
  __typeof__(chorus_last_error) *last_error;
} api_t;

static bool api_load(api_t *a) {
  void *h = dlopen(LIBCHORUS, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "dlopen %s: %s\n", LIBCHORUS, dlerror());
    return false;
  }
  *(void **)&a->init = dlsym(h, "chorus_comm_init");
  *(void **)&a->allreduce = dlsym(h, "chorus_allreduce");
  *(void **)&a->destroy = dlsym(h, "chorus_comm_destroy");
  *(void **)&a->last_error = dlsym(h, "chorus_last_error");
  return a->init && a->allreduce && a->destroy && a->last_error;
}

typedef struct sigs {
  struct sigaction act[NSIG];
  bool ok[NSIG];
} sigs_t;

static void sigs_take(sigs_t *s) {
  for (int sig = 1; sig < NSIG; sig++) {
    memset(&s->act[sig], 0, sizeof(s->act[sig]));
    s->ok[sig] = sigaction(sig, NULL, &s->act[sig]) == 0;
  }
}

/* Prints every signal whose disposition differs; returns how many. */
static int sigs_diff(const sigs_t *was, int rank, const char *when) {
  sigs_t now;
  int n = 0;

  sigs_take(&now);
  for (int sig = 1; sig < NSIG; sig++) {
    const struct sigaction *a = &was->act[sig], *b = &now.act[sig];
    bool same =
        was->ok[sig] == now.ok[sig] && a->sa_handler == b->sa_handler && a->sa_flags == b->sa_flags;
    /* glibc fills only the kernel's part of sa_mask */
    for (int m = 1; m < NSIG && same; m++)
      same = sigismember(&a->sa_mask, m) == sigismember(&b->sa_mask, m);
    if (same)
      continue;
    fprintf(stderr, "rank %d: %s: signal %d (%s) handler %p -> %p, flags %#x -> %#x\n", rank, when,
            sig, strsignal(sig), (void *)a->sa_handler, (void *)b->sa_handler,
            (unsigned)a->sa_flags, (unsigned)b->sa_flags);
    n++;
  }
  return n;
}

static void on_usr1(int sig) {}

/* What the environment held for IPATH_NO_BACKTRACE when the test began
 * (NULL: unset), set by each test before mp_run. */
static const char *ipath_want;

static bool ipath_kept(int rank, const char *when) {
  const char *v = getenv("IPATH_NO_BACKTRACE");
  if ((v == NULL) == (ipath_want == NULL) && (!v || strcmp(v, ipath_want) == 0))
    return true;
  fprintf(stderr, "rank %d: %s: IPATH_NO_BACKTRACE is %s, was %s\n", rank, when, v ? v : "unset",
          ipath_want ? ipath_want : "unset");
  return false;
}

static int rank_dispositions(int rank, int size, const char *rv, void *arg) {
  struct sigaction usr1 = {.sa_handler = on_usr1}, ign = {.sa_handler = SIG_IGN};
  sigs_t before;
  api_t a;
  chorus_comm_t *comm = NULL;
  int bad = 0, rc;

  /* a handler and an ignored signal of the application's own, to keep */
  sigaction(SIGUSR1, &usr1, NULL);
  sigaction(SIGPIPE, &ign, NULL);
  sigs_take(&before);
  if (!api_load(&a))
    return 1;
  bad += sigs_diff(&before, rank, "after dlopen");
  rc = a.init(&comm, rank, size, rv);
  if (rc) {
    fprintf(stderr, "rank %d: init: %d %s\n", rank, rc, a.last_error());
    return 1;
  }
  bad += sigs_diff(&before, rank, "after init");
  int32_t x[1024], y[1024];
  for (int i = 0; i < 1024; i++)
    x[i] = rank + i;
  for (int it = 0; it < 4 && !rc; it++)
    rc = a.allreduce(comm, x, y, 1024, CHORUS_INT32, CHORUS_SUM);
  if (rc || y[7] != 2 * 7 + 1) {
    fprintf(stderr, "rank %d: allreduce: %d, y[7] %d\n", rank, rc, (int)y[7]);
    return 1;
  }
  bad += sigs_diff(&before, rank, "after allreduce");
  rc = a.destroy(comm);
  if (rc) {
    fprintf(stderr, "rank %d: destroy: %d\n", rank, rc);
    return 1;
  }
  bad += sigs_diff(&before, rank, "after destroy");
  bad += !ipath_kept(rank, "after destroy");
  return bad ? 1 : 0;
}

static void dispositions(const char *provider, const char *ipath) {
  char prov[64];
  const char *env[] = {prov, NULL};

  snprintf(prov, sizeof(prov), "CHORUS_PROVIDER=%s", provider);
  if (ipath)
    setenv("IPATH_NO_BACKTRACE", ipath, 1);
  else
    unsetenv("IPATH_NO_BACKTRACE");
  ipath_want = ipath;
  mp_result_t r = mp_run(2, rank_dispositions, NULL, 60, env);
  cr_assert_eq(r.failed, 0, "%d ranks failed over %s (see above)", r.failed, provider);
  cr_assert_eq(mp_count_dev_shm_of(&r, 2), 0, "/dev/shm entries left");
}

TestSuite(signals, .timeout = 240);

Test(signals, dispositions_kept_shm) {
  dispositions("shm", NULL);
}

Test(signals, dispositions_kept_sock) {
  dispositions("sock", NULL);
}

Test(signals, dispositions_kept_shm_sock) {
  dispositions("shm+sock", NULL);
}

/* A user's own setting is theirs, whatever it says. */
Test(signals, ipath_no_backtrace_kept) {
  dispositions("shm", "0");
}

/* ---- a signal ends a rank blocked in a collective ---- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Rank 1 enters an allreduce that rank 0 never joins; once it is in, it is
 * sent `sig`; it must die of it within 5 s. */
static void signal_in_collective(const char *provider, int sig) {
  char rv[64];
  int ready[2];
  pid_t pid[2];
  mp_result_t r = {0};

  unsetenv("IPATH_NO_BACKTRACE");
  snprintf(rv, sizeof(rv), "127.0.0.1:%d", mp_free_port());
  cr_assert_eq(pipe(ready), 0);
  r.started = (long)time(NULL);
  fflush(stderr);
  for (int rank = 0; rank < 2; rank++) {
    pid[rank] = r.pids[rank] = fork();
    cr_assert_geq(pid[rank], 0);
    if (pid[rank])
      continue;
    api_t a;
    chorus_comm_t *comm = NULL;
    int32_t x[256] = {0}, y[256];
    close(ready[0]);
    setenv("CHORUS_PROVIDER", provider, 1);
    if (!api_load(&a) || a.init(&comm, rank, 2, rv)) {
      fprintf(stderr, "rank %d: init failed\n", rank);
      _exit(3);
    }
    if (rank == 1) {
      if (write(ready[1], "x", 1) != 1)
        _exit(3);
      a.allreduce(comm, x, y, 256, CHORUS_INT32, CHORUS_SUM);
      fprintf(stderr, "rank 1: the allreduce returned\n");
      _exit(4);
    }
    pause(); /* rank 0: killed by the test */
    _exit(5);
  }
  close(ready[1]);
  char c;
  cr_assert_eq(read(ready[0], &c, 1), 1, "rank 1 did not reach its allreduce");
  close(ready[0]);
  usleep(300 * 1000); /* well inside the allreduce, blocked */
  cr_assert_eq(mp_proc_state(pid[1]) != 0, 1, "rank 1 is gone before the signal");
  kill(pid[1], sig);
  int st = 0;
  double deadline = now_s() + 5;
  pid_t got = 0;
  while ((got = waitpid(pid[1], &st, WNOHANG)) == 0 && now_s() < deadline)
    usleep(10 * 1000);
  if (got == 0) {
    kill(pid[1], SIGKILL);
    waitpid(pid[1], &st, 0);
  }
  kill(pid[0], SIGKILL);
  waitpid(pid[0], NULL, 0);
  mp_remove_dev_shm_of_rank(&r, 0);
  mp_remove_dev_shm_of_rank(&r, 1);
  cr_assert_neq(got, 0, "rank 1 still ran 5 s after %s", strsignal(sig));
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == sig, "rank 1 ended by %s %d, not by signal %d (%s)",
            WIFSIGNALED(st) ? "signal" : "exit code",
            WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st), sig, strsignal(sig));
}

Test(signals, sigterm_ends_rank_shm) {
  signal_in_collective("shm", SIGTERM);
}

Test(signals, sigint_ends_rank_shm) {
  signal_in_collective("shm", SIGINT);
}

Test(signals, sigterm_ends_rank_sock) {
  signal_in_collective("sock", SIGTERM);
}

Test(signals, sigint_ends_rank_sock) {
  signal_in_collective("sock", SIGINT);
}
