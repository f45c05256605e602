/*
 * mp.c - multi-process test fixture.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mp.h"

/* Present only in sanitizer builds: ranks leave through _exit(), which skips
 * LeakSanitizer's exit-time check, so run it by hand. */
extern int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

int mp_free_port(void) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(a);
  int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;

  if (fd < 0)
    return -1;
  if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

double mp_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* True when a thread of this process other than the caller is running or
 * runnable (not blocked in the kernel). */
static bool other_thread_busy(void) {
  DIR *d = opendir("/proc/self/task");
  struct dirent *e;
  long self = (long)syscall(SYS_gettid);
  bool busy = false;

  if (!d)
    return false;
  while (!busy && (e = readdir(d))) {
    char path[300], buf[512], *close_paren;
    long tid = strtol(e->d_name, NULL, 10);
    if (tid <= 0 || tid == self)
      continue;
    snprintf(path, sizeof(path), "/proc/self/task/%ld/stat", tid);
    FILE *f = fopen(path, "r");
    if (!f)
      continue;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    close_paren = strrchr(buf, ')');
    busy = close_paren && close_paren[1] == ' ' && close_paren[2] == 'R';
  }
  closedir(d);
  return busy;
}

/* In a sanitizer build a rank's leak check takes every allocator lock, and a
 * lock that another thread (Criterion's reporter, a test's server thread) held
 * at fork() stays held in the child for ever: the check hangs. So fork only
 * once the other threads have stayed blocked in the kernel for a few
 * milliseconds; a thread inside an allocation is running or runnable. */
static void settle_threads(void) {
  int calm = 0;

  if (!__lsan_do_recoverable_leak_check)
    return;
  for (int i = 0; i < 5000 && calm < 3; i++) {
    calm = other_thread_busy() ? 0 : calm + 1;
    struct timespec ts = {0, 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

mp_result_t mp_run(int size, mp_rank_fn fn, void *arg, double timeout_s, const char *const *env) {
  mp_result_t res = {0};
  res.started = (long)time(NULL);
  pid_t pids[64];
  char addr[64];
  int port = mp_free_port();

  if (size < 1 || size > 64 || port < 0) {
    res.failed = size;
    return res;
  }
  snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < size; r++) {
    settle_threads();
    pids[r] = fork();
    res.pids[r] = pids[r];
    if (pids[r] == 0) {
      for (const char *const *e = env; e && *e; e++)
        putenv((char *)*e);
      setenv("FI_TCP_IFACE", "lo", 0);
      setenv("FI_UDP_IFACE", "lo", 0);
      setenv("FI_SOCKETS_IFACE", "lo", 0);
      int rc = fn(r, size, addr, arg);
      if (__lsan_do_recoverable_leak_check && __lsan_do_recoverable_leak_check()) {
        fprintf(stderr, "rank %d: LeakSanitizer found leaks\n", r);
        rc = 1;
      }
      fflush(stdout);
      fflush(stderr);
      _exit(rc ? 1 : 0);
    }
    if (pids[r] < 0) {
      res.failed++;
      res.status[r] = -1;
    }
  }
  int left = 0;
  for (int r = 0; r < size; r++)
    left += pids[r] > 0;
  double deadline = mp_now_s() + timeout_s;
  while (left > 0) {
    int st;
    /* only the ranks' pids: waitpid(-1) also reaped children of the test's
     * other threads (system()'s shell, which then returned -1) */
    pid_t p = 0;
    for (int r = 0; r < size && p <= 0; r++)
      if (pids[r] > 0)
        p = waitpid(pids[r], &st, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < size; r++) {
        if (pids[r] != p)
          continue;
        pids[r] = 0;
        left--;
        res.ended[r] = mp_now_s();
        if (WIFEXITED(st))
          res.status[r] = WEXITSTATUS(st);
        else
          res.status[r] = -WTERMSIG(st);
        if (res.status[r]) {
          res.failed++;
          fprintf(stderr, "mp_run: rank %d %s %d\n", r,
                  WIFEXITED(st) ? "exited with status" : "killed by signal",
                  WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        }
      }
      continue;
    }
    if (mp_now_s() > deadline) {
      res.timed_out = 1;
      for (int r = 0; r < size; r++) {
        if (pids[r] > 0) {
          fprintf(stderr, "mp_run: rank %d still running after %.0f s: killed\n", r, timeout_s);
          kill(pids[r], SIGKILL);
          waitpid(pids[r], NULL, 0);
          pids[r] = 0;
          res.status[r] = -SIGKILL;
          res.failed++;
          left--;
        }
      }
      break;
    }
    struct timespec ts = {0, 2 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return res;
}

static int count_dir(const char *path) {
  DIR *d = opendir(path);
  struct dirent *e;
  int n = 0;

  if (!d)
    return -1;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
      n++;
  closedir(d);
  return n;
}

int mp_count_fds(void) {
  int n = count_dir("/proc/self/fd");
  return n > 0 ? n - 1 : n; /* the directory stream's own fd */
}

/* Files named after a rank's pid (ranks [from, to)), made since the ranks
 * started (pids wrap: an older file is another, earlier process's, left by
 * a crash): reported and counted, or removed and counted. */
static int dev_shm_walk(const mp_result_t *r, int from, int to, bool remove) {
  const int *pids = r->pids;
  DIR *d = opendir("/dev/shm");
  struct dirent *e;
  int found = 0;

  if (!d)
    return -1;
  while ((e = readdir(d))) {
    int pid;
    unsigned a, b;
    char tail;
    if (sscanf(e->d_name, "%d:%u:%u%c", &pid, &a, &b, &tail) != 3 &&
        sscanf(e->d_name, "chorus-%d-", &pid) != 1)
      continue;
    char path[300];
    struct stat st;
    snprintf(path, sizeof(path), "/dev/shm/%s", e->d_name);
    if (stat(path, &st) || (long)st.st_ctime < r->started - 1)
      continue;
    for (int i = from; i < to; i++) {
      if (pids[i] != pid)
        continue;
      if (remove) {
        found += unlink(path) == 0;
      } else {
        fprintf(stderr, "mp: /dev/shm/%s left behind by rank %d (pid %d)\n", e->d_name, i, pid);
        found++;
      }
    }
  }
  closedir(d);
  return found;
}

int mp_count_dev_shm_of(const mp_result_t *r, int n) {
  return dev_shm_walk(r, 0, n, false);
}

int mp_remove_dev_shm_of_rank(const mp_result_t *r, int rank) {
  return dev_shm_walk(r, rank, rank + 1, true);
}

char mp_proc_state(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *rp = strrchr(buf, ')');
  return rp && rp[1] == ' ' ? rp[2] : 0;
}

long mp_rss_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kib = -1;

  if (!f)
    return -1;
  while (fgets(line, sizeof(line), f))
    if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
      break;
  fclose(f);
  return kib;
}

int mp_capture(const char *cmd, char *out, size_t len) {
  FILE *p = popen(cmd, "r");
  size_t got = 0;

  if (len)
    out[0] = '\0';
  if (!p)
    return -1;
  while (len && got < len - 1) {
    size_t n = fread(out + got, 1, len - 1 - got, p);
    if (!n)
      break;
    got += n;
  }
  if (len)
    out[got] = '\0';
  char sink[4096]; /* the rest, so that the command is not killed by SIGPIPE */
  while (fread(sink, 1, sizeof(sink), p) > 0) {
  }
  return pclose(p);
}

int mp_trace_line(const char *dir, char *line, size_t len) {
  char cmd[1200];

  snprintf(cmd, sizeof(cmd), "%s/tools/chorus-trace '%s' 2>&1", CHORUS_BUILD_DIR, dir);
  int st = mp_capture(cmd, line, len);
  line[strcspn(line, "\n")] = '\0';
  return st < 0 || !WIFEXITED(st) ? -1 : WEXITSTATUS(st);
}
