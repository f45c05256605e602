/*
 * test_chorus_run.c - the launcher, run as a user would run it, on small
 * /bin/sh programs: environment, output tagging, failure and timeout
 * handling, signal forwarding, usage errors.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mp.h"

extern char **environ;

#define LAUNCHER CHORUS_BUILD_DIR "/tools/chorus-run"

/* ---- running the launcher ---- */

typedef struct buf {
  char *data;
  size_t len, cap;
} buf_t;

typedef struct proc {
  pid_t pid;
  int fd[2];        /* its stdout and stderr; -1 at EOF */
  buf_t out[2];     /* what came out of them */
  int status;       /* wait status */
  double start;     /* monotonic */
  double elapsed;   /* s from start to exit */
  struct rusage ru; /* the launcher's own CPU use */
} proc_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void buf_append(buf_t *b, const char *p, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n + 1)
      cap *= 2;
    b->data = realloc(b->data, cap);
    cr_assert(b->data);
    b->cap = cap;
  }
  memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = '\0';
}

static void proc_start(proc_t *p, char *const argv[]) {
  memset(p, 0, sizeof(*p));
  int po[2], pe[2];
  cr_assert(pipe(po) == 0 && pipe(pe) == 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, po[1], 1);
  posix_spawn_file_actions_adddup2(&fa, pe[1], 2);
  posix_spawn_file_actions_addclose(&fa, po[0]);
  posix_spawn_file_actions_addclose(&fa, pe[0]);
  posix_spawn_file_actions_addclose(&fa, po[1]);
  posix_spawn_file_actions_addclose(&fa, pe[1]);
  p->start = now_s();
  int rc = posix_spawn(&p->pid, argv[0], &fa, NULL, argv, environ);
  cr_assert_eq(rc, 0, "posix_spawn %s: %s", argv[0], strerror(rc));
  posix_spawn_file_actions_destroy(&fa);
  close(po[1]);
  close(pe[1]);
  p->fd[0] = po[0];
  p->fd[1] = pe[0];
}

/* Read what is there within timeout_ms; returns 0 once both pipes hit EOF. */
static int proc_pump(proc_t *p, int timeout_ms) {
  struct pollfd pf[2];
  int n = 0, idx[2];
  for (int k = 0; k < 2; k++)
    if (p->fd[k] >= 0) {
      pf[n] = (struct pollfd){.fd = p->fd[k], .events = POLLIN};
      idx[n++] = k;
    }
  if (n == 0)
    return 0;
  int rc = poll(pf, (nfds_t)n, timeout_ms);
  if (rc < 0 && errno == EINTR)
    return 1;
  cr_assert(rc >= 0, "poll: %s", strerror(errno));
  for (int i = 0; i < n; i++) {
    if (!pf[i].revents)
      continue;
    char chunk[65536];
    ssize_t r = read(pf[i].fd, chunk, sizeof(chunk));
    if (r > 0) {
      buf_append(&p->out[idx[i]], chunk, (size_t)r);
    } else if (r == 0 || errno != EINTR) {
      close(p->fd[idx[i]]);
      p->fd[idx[i]] = -1;
    }
  }
  return 1;
}

/* Collect everything and wait for the launcher (killing it after 60 s). */
static void proc_finish(proc_t *p) {
  double deadline = now_s() + 60;
  while (proc_pump(p, 100))
    if (now_s() > deadline) {
      kill(p->pid, SIGKILL);
      cr_assert_fail("launcher still running after 60 s");
    }
  cr_assert(wait4(p->pid, &p->status, 0, &p->ru) == p->pid);
  p->elapsed = now_s() - p->start;
  for (int k = 0; k < 2; k++)
    if (!p->out[k].data)
      buf_append(&p->out[k], "", 0);
}

static void proc_free(proc_t *p) {
  free(p->out[0].data);
  free(p->out[1].data);
}

/* Run the launcher with these arguments to the end. */
#define RUN(p, ...)                                                                                \
  do {                                                                                             \
    char *argv_[] = {LAUNCHER, __VA_ARGS__, NULL};                                                 \
    proc_start((p), argv_);                                                                        \
    proc_finish(p);                                                                                \
  } while (0)

static int exit_code(const proc_t *p) {
  return WIFEXITED(p->status) ? WEXITSTATUS(p->status) : -1;
}

/* The n-th line (0-based) of s copied into out, or 0 when there is none. */
static int nth_line(const char *s, int n, char *out, size_t outlen) {
  for (int i = 0; i < n; i++) {
    s = strchr(s, '\n');
    if (!s)
      return 0;
    s++;
  }
  if (!*s)
    return 0;
  size_t len = strcspn(s, "\n");
  if (len >= outlen)
    len = outlen - 1;
  memcpy(out, s, len);
  out[len] = '\0';
  return 1;
}

static int count_lines(const char *s) {
  int n = 0;
  for (; *s; s++)
    n += *s == '\n';
  return n;
}

/* ---- tests ---- */

TestSuite(chorus_run, .timeout = 90);

Test(chorus_run, launcher_was_built) {
  cr_assert(access(LAUNCHER, X_OK) == 0, "%s is missing: build target chorus-run", LAUNCHER);
}

Test(chorus_run, environment_per_rank) {
  static const char script[] =
      "echo \"R=$RANK W=$WORLD_SIZE L=$LOCAL_RANK LW=$LOCAL_WORLD_SIZE A=$MASTER_ADDR "
      "P=$MASTER_PORT T=$CHORUS_JOB_TOKEN CR=$CHORUS_RANK CW=$CHORUS_WORLD_SIZE "
      "CV=$CHORUS_RENDEZVOUS\"";
  char first_token[64] = "";
  for (int job = 0; job < 2; job++) {
    proc_t p;
    RUN(&p, "-n", "4", "--", "/bin/sh", "-c", (char *)script);
    cr_assert_eq(exit_code(&p), 0, "status %d, stderr: %s", p.status, p.out[1].data);
    cr_assert_eq(count_lines(p.out[0].data), 4, "stdout: %s", p.out[0].data);
    int seen[4] = {0}, port0 = -1;
    char token0[64] = "";
    char line[512];
    for (int i = 0; nth_line(p.out[0].data, i, line, sizeof(line)); i++) {
      int tag, r, w, l, lw, port, cr, cw;
      char addr[64], token[64], cv[64];
      int got = sscanf(line, "[%d] R=%d W=%d L=%d LW=%d A=%63s P=%d T=%63s CR=%d CW=%d CV=%63s",
                       &tag, &r, &w, &l, &lw, addr, &port, token, &cr, &cw, cv);
      cr_assert_eq(got, 11, "line '%s'", line);
      cr_assert(r >= 0 && r < 4 && !seen[r], "line '%s'", line);
      seen[r] = 1;
      cr_assert(tag == r && l == r && cr == r && w == 4 && lw == 4 && cw == 4, "line '%s'", line);
      cr_assert_str_eq(addr, "127.0.0.1");
      cr_assert(port > 0 && port < 65536);
      char want_cv[64];
      snprintf(want_cv, sizeof(want_cv), "127.0.0.1:%d", port);
      cr_assert_str_eq(cv, want_cv);
      cr_assert_eq(strlen(token), 32, "token '%s'", token);
      cr_assert_eq(strspn(token, "0123456789abcdef"), 32, "token '%s'", token);
      if (port0 < 0) {
        port0 = port;
        strcpy(token0, token);
      }
      cr_assert_eq(port, port0, "ranks disagree on the port");
      cr_assert_str_eq(token, token0, "ranks disagree on the token");
    }
    if (job == 0)
      strcpy(first_token, token0);
    else
      cr_assert_str_neq(token0, first_token, "two jobs got the same token");
    proc_free(&p);
  }
}

Test(chorus_run, provider_flag_and_passthrough) {
  static const char script[] = "echo \"${CHORUS_PROVIDER-unset}\"";
  proc_t p;
  unsetenv("CHORUS_PROVIDER");
  RUN(&p, "-n", "2", "--provider", "shm", "--", "/bin/sh", "-c", (char *)script);
  cr_assert_eq(exit_code(&p), 0);
  cr_assert(strstr(p.out[0].data, "[0] shm\n") && strstr(p.out[0].data, "[1] shm\n"), "%s",
            p.out[0].data);
  proc_free(&p);

  RUN(&p, "-n", "2", "--", "/bin/sh", "-c", (char *)script);
  cr_assert(strstr(p.out[0].data, "[0] unset\n") && strstr(p.out[0].data, "[1] unset\n"), "%s",
            p.out[0].data);
  proc_free(&p);

  setenv("CHORUS_PROVIDER", "tcp", 1);
  RUN(&p, "-n", "2", "--", "/bin/sh", "-c", (char *)script);
  cr_assert(strstr(p.out[0].data, "[0] tcp\n") && strstr(p.out[0].data, "[1] tcp\n"), "%s",
            p.out[0].data);
  proc_free(&p);
  RUN(&p, "-n", "1", "--provider=shm", "--", "/bin/sh", "-c", (char *)script);
  cr_assert_str_eq(p.out[0].data, "[0] shm\n");
  proc_free(&p);
  unsetenv("CHORUS_PROVIDER");
}

/*
 * Four ranks write at once: many 2000-byte lines each, a line split across
 * two writes with a pause between, a 200000-byte line (several pipe reads),
 * stderr lines, and a last line without a newline. Every line must come out
 * whole, prefixed with its own rank, in each rank's order.
 */
Test(chorus_run, output_tagged_and_never_mixed) {
  static const char script[] =
      "c=$(printf \"\\\\$(printf %o $((97 + RANK)))\"); " /* a, b, c, d */
      "line=$(head -c 2000 /dev/zero | tr '\\0' \"$c\"); "
      "echo \"e$RANK\" >&2; "
      "i=0; while [ $i -lt 300 ]; do echo \"$RANK:$i:$line\"; i=$((i + 1)); done; "
      "if [ $RANK = 1 ]; then printf 'split-'; sleep 0.2; printf 'line\\n'; fi; "
      "if [ $RANK = 3 ]; then head -c 200000 /dev/zero | tr '\\0' L; echo; fi; "
      "echo \"w$RANK\" >&2; "
      "printf \"end$RANK\"";
  proc_t p;
  RUN(&p, "-n", "4", "--", "/bin/sh", "-c", (char *)script);
  cr_assert_eq(exit_code(&p), 0, "stderr: %s", p.out[1].data);

  int next[4] = {0}, ends = 0, split = 0, longline = 0;
  const char *s = p.out[0].data;
  while (*s) {
    const char *nl = strchr(s, '\n');
    cr_assert(nl, "output does not end with a newline");
    size_t len = (size_t)(nl - s);
    int r, i, off = 0;
    cr_assert(sscanf(s, "[%d] %n", &r, &off) == 1 && off > 0 && r >= 0 && r < 4,
              "untagged line: %.60s", s);
    const char *body = s + off;
    size_t blen = len - (size_t)off;
    char tail[16];
    snprintf(tail, sizeof(tail), "end%d", r);
    if (blen == strlen(tail) && memcmp(body, tail, blen) == 0) {
      ends++;
    } else if (r == 1 && blen == 10 && memcmp(body, "split-line", 10) == 0) {
      split++;
    } else if (r == 3 && blen == 200000) {
      for (size_t k = 0; k < blen; k++)
        cr_assert_eq(body[k], 'L', "long line damaged at byte %zu", k);
      longline++;
    } else {
      int rr, n2 = 0;
      cr_assert(sscanf(body, "%d:%d:%n", &rr, &i, &n2) == 2 && rr == r, "line %.80s", s);
      cr_assert_eq(i, next[r], "rank %d: line %d came out as number %d", r, next[r], i);
      next[r]++;
      cr_assert_eq(blen - (size_t)n2, 2000, "rank %d line %d is %zu bytes", r, i,
                   blen - (size_t)n2);
      for (size_t k = (size_t)n2; k < blen; k++)
        cr_assert_eq(body[k], 'a' + r, "rank %d line %d mixed at byte %zu", r, i, k);
    }
    s = nl + 1;
  }
  for (int r = 0; r < 4; r++)
    cr_assert_eq(next[r], 300, "rank %d: %d lines", r, next[r]);
  cr_assert_eq(ends, 4);
  cr_assert_eq(split, 1);
  cr_assert_eq(longline, 1);
  for (int r = 0; r < 4; r++) {
    char want[16];
    snprintf(want, sizeof(want), "[%d] e%d\n", r, r);
    cr_assert(strstr(p.out[1].data, want), "stderr lacks %s: %s", want, p.out[1].data);
    cr_assert_null(strstr(p.out[0].data, want), "stderr line %s on stdout", want);
    snprintf(want, sizeof(want), "[%d] w%d\n", r, r);
    cr_assert(strstr(p.out[1].data, want), "stderr lacks %s: %s", want, p.out[1].data);
  }
  cr_assert_eq(count_lines(p.out[1].data), 8, "stderr: %s", p.out[1].data);
  proc_free(&p);
}

Test(chorus_run, no_tag) {
  proc_t p;
  RUN(&p, "-n", "2", "--no-tag", "--", "/bin/sh", "-c", "echo plain");
  cr_assert_eq(exit_code(&p), 0);
  cr_assert_str_eq(p.out[0].data, "plain\nplain\n");
  proc_free(&p);
}

static int pid_gone(pid_t pid) {
  if (kill(pid, 0) < 0)
    return errno == ESRCH;
  char st = mp_proc_state(pid);
  return !st || st == 'Z'; /* gone, or a zombie waiting for init */
}

/* The pid a script wrote to DIR/NAME (the file is removed), 0 if none. */
static int take_pid_file(const char *dir, const char *name) {
  char path[128];
  int pid = 0;
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  if (fscanf(f, "%d", &pid) != 1)
    pid = 0;
  fclose(f);
  unlink(path);
  return pid;
}

/* Rank 2 fails; the others sleep 60 s in a child process of their shell. The
 * job must end at once, name rank 2, and leave no sleeper behind. */
Test(chorus_run, failing_rank_stops_the_others) {
  char dir[] = "/tmp/chorus-run-test-XXXXXX";
  cr_assert(mkdtemp(dir));
  char script[512];
  snprintf(script, sizeof(script),
           "if [ $RANK = 2 ]; then sleep 0.3; echo 'rank 2 gives up' >&2; exit 3; fi; "
           "sleep 60 & echo $! > %s/pid.$RANK; wait",
           dir);
  proc_t p;
  RUN(&p, "-n", "4", "--", "/bin/sh", "-c", script);
  cr_assert_eq(exit_code(&p), 3, "status %#x, stderr: %s", p.status, p.out[1].data);
  cr_assert(strstr(p.out[1].data, "[2] rank 2 gives up\n"), "%s", p.out[1].data);
  const char *last_words = strstr(p.out[1].data, "[2] rank 2 gives up\n");
  const char *report = strstr(p.out[1].data, "chorus-run: rank 2 exited with status 3\n");
  cr_assert(report, "%s", p.out[1].data);
  cr_assert_lt(last_words, report, "the rank's last words come before the report: %s",
               p.out[1].data);
  cr_assert_lt(p.elapsed, 5.0, "the job took %.1f s", p.elapsed);
  for (int r = 0; r < 4; r++) {
    if (r == 2)
      continue;
    char name[32];
    snprintf(name, sizeof(name), "pid.%d", r);
    int pid = take_pid_file(dir, name);
    cr_assert(pid > 0, "rank %d never started its sleeper", r);
    int gone = 0;
    for (int k = 0; k < 40 && !(gone = pid_gone(pid)); k++)
      usleep(50000);
    if (!gone)
      kill(pid, SIGKILL);
    cr_assert(gone, "rank %d's sleeper %d outlived the launcher", r, pid);
  }
  rmdir(dir);
  proc_free(&p);
}

Test(chorus_run, rank_killed_by_signal) {
  proc_t p;
  RUN(&p, "-n", "3", "--", "/bin/sh", "-c", "if [ $RANK = 1 ]; then kill -9 $$; fi; exec sleep 60");
  cr_assert_neq(exit_code(&p), 0);
  cr_assert(strstr(p.out[1].data, "chorus-run: rank 1 killed by signal 9"), "%s", p.out[1].data);
  cr_assert_lt(p.elapsed, 5.0);
  proc_free(&p);
}

/* What a rank leaves in /dev/shm under its pid (the shm transport's region,
 * "chorus-PID-RANK-NONCE") goes once the rank is reaped: rank 1 is killed
 * with two such files, rank 0 exits 0 with one; a file of another pid (rank
 * 2's child, a wrapper's program) stays. */
Test(chorus_run, regions_of_exited_ranks_are_removed) {
  char dir[] = "/tmp/chorus-run-test-XXXXXX";
  cr_assert(mkdtemp(dir));
  char script[768];
  snprintf(script, sizeof(script),
           "echo $$ > %s/pid.$RANK; "
           "if [ $RANK = 2 ]; then sh -c 'touch /dev/shm/chorus-$$-2-00000000000000c3; "
           "echo $$ > %s/child' ; sleep 1; exit 0; fi; "
           "touch /dev/shm/chorus-$$-$RANK-00000000000000a1; "
           "if [ $RANK = 1 ]; then touch /dev/shm/chorus-$$-$RANK-00000000000000b2; "
           "sleep 0.5; kill -9 $$; fi; exit 0",
           dir, dir);
  proc_t p;
  RUN(&p, "-n", "3", "--linger", "5", "--", "/bin/sh", "-c", script);
  cr_assert_eq(exit_code(&p), 128 + SIGKILL, "status %#x, stderr: %s", p.status, p.out[1].data);
  int pid[4] = {take_pid_file(dir, "pid.0"), take_pid_file(dir, "pid.1"),
                take_pid_file(dir, "pid.2"), take_pid_file(dir, "child")};
  rmdir(dir);
  for (int r = 0; r < 4; r++)
    cr_assert(pid[r] > 0, "%s of the script missing", r < 3 ? "a rank's pid" : "the child's pid");
  char path[128];
  snprintf(path, sizeof(path), "/dev/shm/chorus-%d-0-00000000000000a1", pid[0]);
  cr_assert_neq(access(path, F_OK), 0, "%s left behind by rank 0", path);
  snprintf(path, sizeof(path), "/dev/shm/chorus-%d-1-00000000000000a1", pid[1]);
  cr_assert_neq(access(path, F_OK), 0, "%s left behind by killed rank 1", path);
  snprintf(path, sizeof(path), "/dev/shm/chorus-%d-1-00000000000000b2", pid[1]);
  cr_assert_neq(access(path, F_OK), 0, "%s left behind by killed rank 1", path);
  snprintf(path, sizeof(path),
           "removed /dev/shm/chorus-%d-1-00000000000000b2, left by the rank "
           "with pid %d\n",
           pid[1], pid[1]);
  cr_assert(strstr(p.out[1].data, path), "no line for it: %s", p.out[1].data);
  snprintf(path, sizeof(path), "/dev/shm/chorus-%d-2-00000000000000c3", pid[3]);
  cr_assert_eq(access(path, F_OK), 0, "%s (not a rank's pid) was removed", path);
  unlink(path);
  proc_free(&p);
}

Test(chorus_run, exit_status) {
  proc_t p;
  RUN(&p, "-n", "3", "--", "/bin/sh", "-c", "exit 0");
  cr_assert_eq(exit_code(&p), 0);
  cr_assert_str_eq(p.out[1].data, "");
  proc_free(&p);
  RUN(&p, "-n", "1", "--", "/bin/sh", "-c", "exit 7");
  cr_assert_eq(exit_code(&p), 7);
  proc_free(&p);
  RUN(&p, "-n", "2", "--", "/bin/sh", "-c", "[ $RANK = 0 ] || exit 5");
  cr_assert_eq(exit_code(&p), 5);
  cr_assert(strstr(p.out[1].data, "rank 1 exited with status 5"), "%s", p.out[1].data);
  proc_free(&p);
}

Test(chorus_run, timeout) {
  proc_t p;
  RUN(&p, "-n", "3", "--timeout", "1", "--", "/bin/sh", "-c", "[ $RANK = 1 ] && exit 0; sleep 60");
  cr_assert_eq(exit_code(&p), 124, "status %#x: %s", p.status, p.out[1].data);
  cr_assert(strstr(p.out[1].data, "timeout"), "%s", p.out[1].data);
  cr_assert(strstr(p.out[1].data, "ranks still running: 0 2\n"), "%s", p.out[1].data);
  cr_assert_lt(p.elapsed, 4.0, "took %.1f s", p.elapsed);
  cr_assert_geq(p.elapsed, 0.9);
  proc_free(&p);

  /* ranks that ignore SIGTERM get SIGKILL after the 2 s grace period */
  RUN(&p, "-n", "2", "--timeout", "0.5", "--", "/bin/sh", "-c", "trap '' TERM; sleep 60");
  cr_assert_eq(exit_code(&p), 124, "status %#x: %s", p.status, p.out[1].data);
  cr_assert(strstr(p.out[1].data, "SIGKILL"), "%s", p.out[1].data);
  cr_assert(p.elapsed > 2.0 && p.elapsed < 6.0, "took %.1f s", p.elapsed);
  proc_free(&p);
}

Test(chorus_run, signals_are_forwarded) {
  static const char script[] = "trap 'echo got TERM; exit 0' TERM; echo ready; sleep 60 & wait";
  char *argv[] = {LAUNCHER, "-n", "2", "--", "/bin/sh", "-c", (char *)script, NULL};
  proc_t p;
  proc_start(&p, argv);
  double deadline = now_s() + 20;
  while ((!p.out[0].data || !strstr(p.out[0].data, "[0] ready") ||
          !strstr(p.out[0].data, "[1] ready")) &&
         now_s() < deadline)
    proc_pump(&p, 100);
  kill(p.pid, SIGTERM);
  proc_finish(&p);
  cr_assert_eq(exit_code(&p), 128 + SIGTERM, "status %#x: %s", p.status, p.out[1].data);
  cr_assert(strstr(p.out[0].data, "[0] got TERM\n") && strstr(p.out[0].data, "[1] got TERM\n"),
            "%s", p.out[0].data);
  cr_assert_lt(p.elapsed, 10.0);
  proc_free(&p);
}

/* The launcher sleeps in poll(): a 1.5 s job costs it next to no CPU. */
Test(chorus_run, no_busy_waiting) {
  proc_t p;
  RUN(&p, "-n", "4", "--", "/bin/sh", "-c", "sleep 1.5");
  cr_assert_eq(exit_code(&p), 0);
  double cpu = (double)p.ru.ru_utime.tv_sec + (double)p.ru.ru_utime.tv_usec * 1e-6 +
               (double)p.ru.ru_stime.tv_sec + (double)p.ru.ru_stime.tv_usec * 1e-6;
  cr_assert_lt(cpu, 0.3,
               "the launcher used %.2f s of CPU (children included: it waits "
               "for them)",
               cpu);
  proc_free(&p);
}

static void expect_usage_error(char **args, const char *what) {
  proc_t p;
  proc_start(&p, args);
  proc_finish(&p);
  cr_assert_eq(exit_code(&p), 2, "%s: status %#x", what, p.status);
  cr_assert(strstr(p.out[1].data, "chorus-run: "), "%s: no message: '%s'", what, p.out[1].data);
  cr_assert_str_eq(p.out[0].data, "", "%s", what);
  proc_free(&p);
}

Test(chorus_run, bad_usage) {
  char *zero[] = {LAUNCHER, "-n", "0", "--", "/bin/true", NULL};
  char *negative[] = {LAUNCHER, "-n", "-3", "--", "/bin/true", NULL};
  char *junk[] = {LAUNCHER, "-n", "4x", "--", "/bin/true", NULL};
  char *no_dashes[] = {LAUNCHER, "-n", "2", "/bin/true", NULL};
  char *nothing[] = {LAUNCHER, "-n", "2", NULL};
  char *no_program[] = {LAUNCHER, "-n", "2", "--", NULL};
  char *unknown[] = {LAUNCHER, "--frobnicate", "--", "/bin/true", NULL};
  char *not_found[] = {LAUNCHER, "-n", "2", "--", "no-such-program-chorus", NULL};
  char *bad_path[] = {LAUNCHER, "-n", "2", "--", "/nonexistent/prog", NULL};
  char *bad_timeout[] = {LAUNCHER, "--timeout", "soon", "--", "/bin/true", NULL};
  char *missing_value[] = {LAUNCHER, "--provider", NULL};
  expect_usage_error(zero, "-n 0");
  expect_usage_error(negative, "-n -3");
  expect_usage_error(junk, "-n 4x");
  expect_usage_error(no_dashes, "no --");
  expect_usage_error(nothing, "nothing to run");
  expect_usage_error(no_program, "nothing after --");
  expect_usage_error(unknown, "unknown option");
  expect_usage_error(not_found, "program not in PATH");
  expect_usage_error(bad_path, "program path missing");
  expect_usage_error(bad_timeout, "bad timeout");
  expect_usage_error(missing_value, "option without value");
}

Test(chorus_run, help) {
  proc_t p;
  RUN(&p, "--help");
  cr_assert_eq(exit_code(&p), 0);
  const char *must[] = {"-n N", "--provider",       "--timeout",   "--no-tag", "--tag-output",
                        "RANK", "CHORUS_JOB_TOKEN", "MASTER_PORT", "124",      "SIGKILL"};
  for (size_t i = 0; i < sizeof(must) / sizeof(must[0]); i++)
    cr_assert(strstr(p.out[0].data, must[i]), "--help does not mention %s", must[i]);
  proc_free(&p);
}

/* After a rank fails the others may end on their own within --linger (a
 * Chorus job's survivors report the failure): they are not signalled. */
Test(chorus_run, linger_lets_the_others_end_on_their_own) {
  proc_t p;
  RUN(&p, "-n", "3", "--linger", "5", "--", "/bin/sh", "-c",
      "if [ $RANK = 1 ]; then exit 3; fi; sleep 1; echo \"rank $RANK reports the loss\"; exit 0");
  cr_assert_eq(exit_code(&p), 3, "status %#x: %s", p.status, p.out[1].data);
  cr_assert(strstr(p.out[0].data, "[0] rank 0 reports the loss"), "%s", p.out[0].data);
  cr_assert(strstr(p.out[0].data, "[2] rank 2 reports the loss"), "%s", p.out[0].data);
  cr_assert(!strstr(p.out[1].data, "stopping the other ranks"), "%s", p.out[1].data);
  cr_assert_lt(p.elapsed, 4.0, "the job took %.1f s", p.elapsed);
  proc_free(&p);

  /* the survivors of a Chorus job fail too, each naming the loss: a second
   * failure does not cut the linger short for the third rank */
  RUN(&p, "-n", "3", "--linger", "5", "--", "/bin/sh", "-c",
      "if [ $RANK = 1 ]; then exit 3; fi; if [ $RANK = 0 ]; then sleep 0.3; else sleep 1.5; fi; "
      "echo \"rank $RANK reports the loss\"; exit 4");
  cr_assert_eq(exit_code(&p), 3, "status %#x: %s", p.status, p.out[1].data);
  cr_assert(strstr(p.out[0].data, "[0] rank 0 reports the loss"), "%s", p.out[0].data);
  cr_assert(strstr(p.out[0].data, "[2] rank 2 reports the loss"), "%s", p.out[0].data);
  cr_assert(strstr(p.out[1].data, "rank 0 exited with status 4"), "%s", p.out[1].data);
  cr_assert(!strstr(p.out[1].data, "stopping the other ranks"), "%s", p.out[1].data);
  cr_assert_lt(p.elapsed, 4.0, "the job took %.1f s", p.elapsed);
  proc_free(&p);

  /* past the linger time they are stopped */
  RUN(&p, "-n", "2", "--linger", "0.5", "--", "/bin/sh", "-c",
      "if [ $RANK = 1 ]; then exit 3; fi; exec sleep 60");
  cr_assert_eq(exit_code(&p), 3);
  cr_assert(strstr(p.out[1].data, "stopping the other ranks"), "%s", p.out[1].data);
  cr_assert_lt(p.elapsed, 4.0, "the job took %.1f s", p.elapsed);
  proc_free(&p);
}
