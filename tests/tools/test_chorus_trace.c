/*
 * test_chorus_trace.c - chorus-trace run as a user runs it, on dump
 * directories written to order (trace_fixture.h): a rank that skipped a
 * collective, a mismatched count, a killed rank (no dump), a stalled rank,
 * a wait cycle, a healthy job, truncated and foreign files, an empty
 * directory, usage errors; the HTML, Chrome JSON and dot outputs checked
 * for form and content; mutated and random dumps must never crash it.
 *
 * Built twice: test_chorus_trace (all of the above) and, with
 * TRACE_BROWSER_TEST, test_chorus_trace_browser (label browser), which loads
 * the page in headless Chromium: the script must run without an error and
 * leave the diagnosis and the culprit's lane in the DOM, and a screenshot
 * must come out. Without /usr/bin/chromium it is skipped, unless
 * CHORUS_REQUIRE_CHROMIUM=1.
 */
#define _GNU_SOURCE /* nftw, strndup */
#include <criterion/criterion.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "trace_fixture.h"

#define TRACE_TOOL CHORUS_BUILD_DIR "/tools/chorus-trace"
#define CHROMIUM "/usr/bin/chromium"

/* ---- time: each rank's clock is rank 0's minus its offset ---- */

#define BASE_NS 1000000000000ull /* rank 0's clock at the job's start */

static int64_t off_of(int r) {
  return ((int64_t)r * 7 - 10) * 1000000; /* -10 ms, -3 ms, 4 ms, ... */
}

/* rank r's clock reading at `ms` milliseconds of rank 0's */
static uint64_t L(int r, double ms) {
  return (uint64_t)((int64_t)BASE_NS + (int64_t)(ms * 1e6) - off_of(r));
}

/* ---- files ---- */

typedef struct tdir {
  char base[256];
  char dumps[300];
  char out[300];
} tdir_t;

static tdir_t tdir_new(void) {
  tdir_t t;
  snprintf(t.base, sizeof(t.base), "/tmp/chorus-trace-test-XXXXXX");
  cr_assert_not_null(mkdtemp(t.base));
  snprintf(t.dumps, sizeof(t.dumps), "%s/dumps", t.base);
  snprintf(t.out, sizeof(t.out), "%s/out", t.base);
  cr_assert_eq(mkdir(t.dumps, 0755), 0);
  cr_assert_eq(mkdir(t.out, 0755), 0);
  return t;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

/* Removes the directory, unless CHORUS_TRACE_KEEP is set (to look at it). */
static void tdir_free(tdir_t *t) {
  const char *keep = getenv("CHORUS_TRACE_KEEP");
  if (keep && *keep) {
    fprintf(stderr, "kept %s\n", t->base);
    return;
  }
  nftw(t->base, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  size_t cap = 1 << 16, n = 0;
  char *p = malloc(cap);
  cr_assert_not_null(p);
  for (size_t r; (r = fread(p + n, 1, cap - n - 1, f)) > 0;) {
    n += r;
    if (cap - n < 4096)
      cr_assert_not_null(p = realloc(p, cap *= 2));
  }
  p[n] = 0;
  fclose(f);
  if (len)
    *len = n;
  return p;
}

static void write_dump(tf_dump_t *d, const char *dir, const char *name) {
  cr_assert_eq(tf_write(d, dir, name), 0, "writing %s/%s", dir, name);
  tf_free(d);
}

/* ---- running the tool ---- */

typedef struct run {
  int status; /* exit code; -1: killed by a signal */
  char *out, *err;
} run_t;

static run_t run_argv(const tdir_t *t, const char *const *argv) {
  char outp[400], errp[400];
  snprintf(outp, sizeof(outp), "%s/stdout.txt", t->out);
  snprintf(errp, sizeof(errp), "%s/stderr.txt", t->out);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    int o = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
      _exit(126);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  run_t r = {.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1};
  r.out = slurp(outp, NULL);
  r.err = slurp(errp, NULL);
  cr_assert(r.out && r.err);
  cr_assert(WIFEXITED(st), "chorus-trace died of signal %d\nstdout:\n%s\nstderr:\n%s",
            WIFSIGNALED(st) ? WTERMSIG(st) : 0, r.out, r.err);
  cr_assert_null(strstr(r.err, "Sanitizer"), "sanitizer report:\n%s", r.err);
  cr_assert_null(strstr(r.err, "runtime error"), "sanitizer report:\n%s", r.err);
  return r;
}

/* chorus-trace DIR [extra args...] (NULL-terminated) */
static run_t run_on(const tdir_t *t, const char *dir, ...) {
  const char *argv[16] = {TRACE_TOOL, dir};
  int n = 2;
  va_list ap;
  va_start(ap, dir);
  for (const char *a; n < 15 && (a = va_arg(ap, const char *));)
    argv[n++] = a;
  va_end(ap);
  argv[n] = NULL;
  return run_argv(t, argv);
}

static void run_free(run_t *r) {
  free(r->out);
  free(r->err);
}

static char *first_line(const char *s) {
  const char *nl = strchr(s, '\n');
  size_t n = nl ? (size_t)(nl - s) : strlen(s);
  char *l = malloc(n + 1);
  cr_assert_not_null(l);
  memcpy(l, s, n);
  l[n] = 0;
  return l;
}

#define assert_has(text, needle)                                                                   \
  cr_assert_not_null(strstr((text), (needle)), "missing \"%s\" in:\n%s", (needle), (text))

/* ---- scenarios ---- */

/* 4 ranks in a ring allreduce #42; rank 2 finished barrier #41 and never
 * called #42 (the `if loss > 100: continue` bug). */
__attribute__((unused)) static void scenario_skip(const char *dir, uint32_t comm) {
  for (int r = 0; r < 4; r++) {
    int prev = (r + 3) % 4, next = (r + 1) % 4;
    char name[32];
    tf_dump_t *d = tf_new(comm, r, 4, L(r, 12650), off_of(r));
    tf_call(d, 40, TF_ALLREDUCE, TF_FLOAT32, 1 << 20, TF_SUM, -1, L(r, 100), L(r, 150));
    tf_call(d, 41, TF_BARRIER, 0, 0, 0, -1, L(r, 160), L(r, 170));
    for (uint32_t c = 0; c < 3; c++) {
      tf_message(d, 40, 2 * c, true, next, c, c, 1 << 20, L(r, 100 + 10 * c), L(r, 104 + 10 * c));
      tf_message(d, 40, 2 * c + 1, false, prev, c, c, 1 << 20, L(r, 101 + 10 * c),
                 L(r, 106 + 10 * c));
    }
    for (int p = 0; p < 4; p++)
      if (p != r)
        tf_peer(d, p, TF_ALIVE, 41, L(r, 170));
    if (r != 2) {
      tf_call(d, 42, TF_ALLREDUCE, TF_FLOAT32, 1 << 20, TF_SUM, -1, L(r, 200), 0);
      tf_where(d, 42, 41, true, L(r, 12600));
      tf_step(d, 42, 5, TF_RECV, TF_POSTED, prev, 2, L(r, 250));
      tf_step(d, 42, 6, TF_SEND, TF_POSTED, next, 3, L(r, 250));
      tf_step(d, 42, 7, TF_REDUCE, TF_WAIT, -1, 2, L(r, 200));
      tf_journal(d, L(r, 240), 5, 42, TF_J_WAIT, TF_E_DEP, TF_J_READY);
      tf_journal(d, L(r, 250), 5, 42, TF_J_READY, TF_E_POSTED, TF_J_POSTED);
      tf_journal(d, L(r, 245), 6, 42, TF_J_WAIT, TF_E_DEP, TF_J_READY);
      tf_journal(d, L(r, 250), 6, 42, TF_J_READY, TF_E_POSTED, TF_J_POSTED);
      tf_verdict(d, TF_TIMEOUT, -1, "collective #42 waited past CHORUS_TIMEOUT (12 s)",
                 L(r, 12640));
    } else {
      tf_where(d, 41, 41, false, L(r, 175));
      tf_verdict(d, TF_REQUEST, -1, "dump requested by rank 0", L(r, 12650));
    }
    snprintf(name, sizeof(name), "comm%u-rank-%d", comm, r);
    write_dump(d, dir, name);
  }
}

/* As scenario_skip, but rank 2 went on to the next call, a barrier, which
 * it numbers #42 too. */
__attribute__((unused)) static void scenario_skip_into_barrier(const char *dir) {
  scenario_skip(dir, 8);
  tf_dump_t *d = tf_new(8, 2, 4, L(2, 12650), off_of(2));
  tf_call(d, 40, TF_ALLREDUCE, TF_FLOAT32, 1 << 20, TF_SUM, -1, L(2, 100), L(2, 150));
  tf_call(d, 41, TF_BARRIER, 0, 0, 0, -1, L(2, 160), L(2, 170));
  tf_call(d, 42, TF_BARRIER, 0, 0, 0, -1, L(2, 180), 0);
  tf_where(d, 42, 41, true, L(2, 12600));
  tf_step(d, 42, 0, TF_RECV, TF_POSTED, 1, 0, L(2, 181));
  write_dump(d, dir, "comm8-rank-2"); /* replaces the idle one */
}

/* 4 ranks in allreduce #7; rank 2 passed count 1000, the others 1024. */
__attribute__((unused)) static void scenario_mismatch(const char *dir) {
  for (int r = 0; r < 4; r++) {
    char name[32];
    tf_dump_t *d = tf_new(3, r, 4, L(r, 5310), off_of(r));
    tf_call(d, 6, TF_ALLREDUCE, TF_FLOAT32, 1024, TF_SUM, -1, L(r, 100), L(r, 120));
    tf_call(d, 7, TF_ALLREDUCE, TF_FLOAT32, r == 2 ? 1000 : 1024, TF_SUM, -1, L(r, 300), 0);
    tf_where(d, 7, 6, true, L(r, 5300));
    tf_step(d, 7, 1, TF_RECV, TF_POSTED, (r + 3) % 4, 0, L(r, 310));
    tf_verdict(d, TF_TIMEOUT, -1, "collective #7 waited past CHORUS_TIMEOUT", L(r, 5300));
    snprintf(name, sizeof(name), "rank-%d", r);
    write_dump(d, dir, name);
  }
}

/* 4 ranks in allreduce #12; rank 3 was killed and left no dump (or, with
 * `truncated`, half of one). */
__attribute__((unused)) static void scenario_killed(const char *dir, bool truncated) {
  for (int r = 0; r < 4; r++) {
    char name[32];
    tf_dump_t *d = tf_new(5, r, 4, L(r, 8510), off_of(r));
    tf_call(d, 11, TF_ALLREDUCE, TF_FLOAT32, 65536, TF_SUM, -1, L(r, 100), L(r, 130));
    tf_call(d, 12, TF_ALLREDUCE, TF_FLOAT32, 65536, TF_SUM, -1, L(r, 500), 0);
    tf_where(d, 12, 11, true, L(r, 8500));
    tf_step(d, 12, 1, TF_RECV, TF_POSTED, (r + 3) % 4, 0, L(r, 510));
    if (r == 2)
      tf_step(d, 12, 2, TF_SEND, TF_POSTED, 3, 0, L(r, 510));
    if (r == 0) {
      tf_peer(d, 3, TF_LOST, 11, L(r, 505));
      tf_fault(d, L(r, 506), "transport", 3, 12, "fi_cq_readerr: connection reset by peer");
    }
    if (r == 2)
      tf_peer(d, 3, TF_SUSPECT, 11, L(r, 505));
    tf_verdict(d, TF_TIMEOUT, -1, "collective #12 waited past CHORUS_TIMEOUT", L(r, 8500));
    snprintf(name, sizeof(name), "rank-%d", r);
    if (r < 3) {
      write_dump(d, dir, name);
      continue;
    }
    if (truncated) {
      size_t len = 0;
      uint8_t *buf = tf_pack(d, &len);
      cr_assert_not_null(buf);
      cr_assert_eq(tf_write_bytes(dir, "rank-3.trace", buf, len / 2), 0);
      /* what an engine mid-write leaves: must be ignored, though whole */
      cr_assert_eq(tf_write_bytes(dir, "rank-3.trace.tmp", buf, len), 0);
      free(buf);
    }
    tf_free(d);
  }
}

/* 4 ranks in allreduce #12 over a transport that reports a broken
 * connection (sock): rank 3 was killed; rank 0's receive from it and rank
 * 2's send to it failed (ECONNRESET, EPIPE), and those runs are gone, so
 * the failed steps are all they show; rank 1 still waits on rank 0, and a
 * receive of its that was canceled (no error) is no wait. */
__attribute__((unused)) static void scenario_broken_connections(const char *dir) {
  for (int r = 0; r < 3; r++) {
    char name[32];
    tf_dump_t *d = tf_new(5, r, 4, L(r, 30), off_of(r));
    tf_call(d, 11, TF_ALLREDUCE, TF_FLOAT32, 65536, TF_SUM, -1, L(r, 1), L(r, 2));
    tf_call(d, 12, TF_ALLREDUCE, TF_FLOAT32, 65536, TF_SUM, -1, L(r, 10), 0);
    tf_where(d, 12, 11, true, L(r, 29));
    if (r == 0)
      tf_step(d, 12, 1, TF_RECV, TF_FAILED, 3, 0, L(r, 12))->error = ECONNRESET;
    if (r == 1) {
      tf_step(d, 12, 1, TF_RECV, TF_POSTED, 0, 0, L(r, 11));
      tf_step(d, 12, 4, TF_RECV, TF_FAILED, 2, 1, L(r, 11));
    }
    if (r == 2)
      tf_step(d, 12, 0, TF_SEND, TF_FAILED, 3, 0, L(r, 12))->error = EPIPE;
    tf_peer(d, 3, TF_LOST, 11, L(r, 12));
    tf_verdict(d, TF_PEER_LOST, 3, "rank 3 is lost", L(r, 13));
    snprintf(name, sizeof(name), "rank-%d", r);
    write_dump(d, dir, name);
  }
}

/* 4 ranks in allreduce #20, waiting in a ring; rank 1's progress engine has
 * not run for 40 s and its first send is still READY. */
__attribute__((unused)) static void scenario_stalled(const char *dir) {
  for (int r = 0; r < 4; r++) {
    char name[32];
    tf_dump_t *d = tf_new(9, r, 4, L(r, 40500), off_of(r));
    tf_call(d, 19, TF_BARRIER, 0, 0, 0, -1, L(r, 100), L(r, 110));
    tf_call(d, 20, TF_ALLREDUCE, TF_FLOAT32, 262144, TF_SUM, -1, L(r, 500), 0);
    tf_where(d, 20, 19, true, L(r, r == 1 ? 600 : 40450));
    tf_step(d, 20, 1, TF_RECV, TF_POSTED, (r + 3) % 4, 0, L(r, 550));
    if (r == 1)
      tf_step(d, 20, 2, TF_SEND, TF_READY, 2, 0, L(r, 600));
    tf_verdict(d, TF_TIMEOUT, -1, "collective #20 waited past CHORUS_TIMEOUT", L(r, 40450));
    snprintf(name, sizeof(name), "rank-%d", r);
    write_dump(d, dir, name);
  }
}

/* 2 ranks, each waiting for the other in allreduce #5, both alive. */
__attribute__((unused)) static void scenario_cycle(const char *dir) {
  for (int r = 0; r < 2; r++) {
    char name[32];
    tf_dump_t *d = tf_new(11, r, 2, L(r, 3200), off_of(r));
    tf_call(d, 5, TF_ALLREDUCE, TF_FLOAT32, 4096, TF_SUM, -1, L(r, 150), 0);
    tf_where(d, 5, 4, true, L(r, 3190));
    tf_step(d, 5, 0, TF_RECV, TF_POSTED, 1 - r, 0, L(r, 200));
    snprintf(name, sizeof(name), "rank-%d", r);
    write_dump(d, dir, name);
  }
}

/* 4 ranks split by parity (the split of ranks 0,2: sub_id 0x51): rank 2
 * skipped the split's #3 and waits in the world's #3 for rank 0, which waits
 * in the split's #3 for it; ranks 1 and 3 wait in the world's #3 too. */
__attribute__((unused)) static void scenario_split_deadlock(const char *dir) {
  static const uint32_t evens[] = {0, 2};
  for (int r = 0; r < 4; r++) {
    char name[32];
    tf_dump_t *d = tf_new(0, r, 4, L(r, 2400), off_of(r));
    tf_call(d, 2, TF_ALLREDUCE, TF_FLOAT32, 4096, TF_SUM, -1, L(r, 100), L(r, 120));
    if (r == 0) { /* in the split: the world's #2 is its last */
      tf_where(d, 2, 2, false, L(r, 2390));
    } else {
      tf_call(d, 3, TF_ALLREDUCE, TF_FLOAT32, 4096, TF_SUM, -1, L(r, 200), 0);
      tf_where(d, 3, 2, true, L(r, 2390));
      tf_step(d, 3, 0, TF_RECV, TF_POSTED, r == 3 ? 1 : 0, 0, L(r, 210));
    }
    snprintf(name, sizeof(name), "rank-%d", r);
    write_dump(d, dir, name);
  }
  for (int m = 0; m < 2; m++) {
    char name[32];
    int r = (int)evens[m];
    tf_dump_t *d = tf_new(0, m, 2, L(r, 2400), off_of(r));
    tf_split(d, 0x51, evens, 2);
    tf_call(d, 2, TF_ALLREDUCE, TF_FLOAT32, 4096, TF_SUM, -1, L(r, 130), L(r, 150));
    if (m == 0) {
      tf_call(d, 3, TF_ALLREDUCE, TF_FLOAT32, 4096, TF_SUM, -1, L(r, 160), 0);
      tf_where(d, 3, 2, true, L(r, 2390));
      tf_step(d, 3, 0, TF_RECV, TF_POSTED, 1, 0, L(r, 170));
    } else {
      tf_where(d, 2, 2, false, L(r, 2390));
    }
    snprintf(name, sizeof(name), "rank-%d-split", r);
    write_dump(d, dir, name);
  }
}

/* 4 ranks split by parity (the split of ranks 0,2: sub_id 0x52); rank 2
 * was killed before the split's #3, so quickly that the verdict reached the
 * others before any of them began the world's #3: rank 0 waits in the
 * split's #3 for it, the world's dumps show no rank in a collective. */
__attribute__((unused)) static void scenario_killed_in_a_split(const char *dir) {
  static const uint32_t evens[] = {0, 2};
  for (int r = 0; r < 4; r++) {
    char name[32];
    if (r == 2)
      continue;
    tf_dump_t *d = tf_new(0, r, 4, L(r, 40), off_of(r));
    tf_call(d, 2, TF_ALLREDUCE, TF_FLOAT32, 4096, TF_SUM, -1, L(r, 10), L(r, 12));
    tf_where(d, 2, 2, false, L(r, 12));
    tf_peer(d, 2, TF_LOST, 2, L(r, 15));
    tf_verdict(d, TF_PEER_LOST, 2, "rank 2 is lost: its watchdog connection closed", L(r, 38));
    snprintf(name, sizeof(name), "rank-%d", r);
    write_dump(d, dir, name);
  }
  tf_dump_t *d = tf_new(0, 0, 2, L(0, 40), off_of(0));
  tf_split(d, 0x52, evens, 2);
  tf_call(d, 3, TF_ALLREDUCE, TF_FLOAT32, 4096, TF_SUM, -1, L(0, 13), 0);
  tf_where(d, 3, 2, true, L(0, 39));
  tf_step(d, 3, 0, TF_RECV, TF_POSTED, 1, 0, L(0, 14));
  tf_verdict(d, TF_PEER_LOST, 1,
             "rank 2 is lost (the verdict on the communicator this one was "
             "split from; ranks as there)",
             L(0, 38));
  write_dump(d, dir, "rank-0-split");
}

/* 4 ranks: 0, 1 and 3 destroyed the communicator after #8; rank 2 called
 * #9 and waits in it for rank 0. */
__attribute__((unused)) static void scenario_extra_call(const char *dir) {
  for (int r = 0; r < 4; r++) {
    char name[32];
    tf_dump_t *d = tf_new(0, r, 4, L(r, 900), off_of(r));
    tf_call(d, 8, TF_BCAST, TF_FLOAT32, 64, 0, 0, L(r, 100), L(r, 110));
    if (r == 2) {
      tf_call(d, 9, TF_ALLREDUCE, TF_FLOAT32, 4096, TF_SUM, -1, L(r, 200), 0);
      tf_where(d, 9, 8, true, L(r, 890));
      tf_step(d, 9, 0, TF_RECV, TF_POSTED, 0, 0, L(r, 210));
    } else {
      tf_where(d, 8, 8, false, L(r, 890));
      tf_msg(d)->checkpoint->destroying = true;
    }
    snprintf(name, sizeof(name), "rank-%d", r);
    write_dump(d, dir, name);
  }
}

/* 2 ranks, both done with #5: nothing is wrong. */
__attribute__((unused)) static void scenario_healthy(const char *dir, uint32_t comm) {
  for (int r = 0; r < 2; r++) {
    char name[32];
    tf_dump_t *d = tf_new(comm, r, 2, L(r, 900), off_of(r));
    tf_call(d, 5, TF_BCAST, TF_FLOAT32, 16, 0, 0, L(r, 100), L(r, 110));
    tf_where(d, 5, 5, false, L(r, 110));
    tf_verdict(d, TF_REQUEST, -1, "dump requested", L(r, 900));
    snprintf(name, sizeof(name), "comm%u-rank-%d", comm, r);
    write_dump(d, dir, name);
  }
}

/* ---- a JSON syntax check (RFC 8259), depth-bounded ---- */

static const char *jv(const char *p, int depth);

static const char *jws(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
    p++;
  return p;
}

static const char *jstr(const char *p) {
  if (*p++ != '"')
    return NULL;
  for (;;) {
    unsigned char c = (unsigned char)*p++;
    if (c == '"')
      return p;
    if (c < 0x20)
      return NULL; /* raw control character (or the end) */
    if (c != '\\')
      continue;
    c = (unsigned char)*p++;
    if (c == 'u') {
      for (int i = 0; i < 4; i++)
        if (!isxdigit((unsigned char)*p++))
          return NULL;
    } else if (!strchr("\"\\/bfnrt", c) || !c) {
      return NULL;
    }
  }
}

static const char *jnum(const char *p) {
  if (*p == '-')
    p++;
  if (*p == '0')
    p++;
  else if (*p >= '1' && *p <= '9')
    while (isdigit((unsigned char)*p))
      p++;
  else
    return NULL;
  if (*p == '.') {
    p++;
    if (!isdigit((unsigned char)*p))
      return NULL;
    while (isdigit((unsigned char)*p))
      p++;
  }
  if (*p == 'e' || *p == 'E') {
    p++;
    if (*p == '+' || *p == '-')
      p++;
    if (!isdigit((unsigned char)*p))
      return NULL;
    while (isdigit((unsigned char)*p))
      p++;
  }
  return p;
}

static const char *jv(const char *p, int depth) {
  if (depth > 64)
    return NULL;
  p = jws(p);
  if (*p == '{' || *p == '[') {
    char close = *p == '{' ? '}' : ']';
    p = jws(p + 1);
    if (*p == close)
      return p + 1;
    for (;;) {
      if (close == '}') {
        if (!(p = jstr(jws(p))))
          return NULL;
        p = jws(p);
        if (*p++ != ':')
          return NULL;
      }
      if (!(p = jv(p, depth + 1)))
        return NULL;
      p = jws(p);
      if (*p == close)
        return p + 1;
      if (*p++ != ',')
        return NULL;
    }
  }
  if (*p == '"')
    return jstr(p);
  if (!strncmp(p, "true", 4) || !strncmp(p, "null", 4))
    return p + 4;
  if (!strncmp(p, "false", 5))
    return p + 5;
  return jnum(p);
}

static void assert_json(const char *text, const char *what) {
  const char *end = jv(text, 0);
  cr_assert_not_null(end, "%s is not JSON", what);
  cr_assert_eq(*jws(end), 0, "%s: text after the JSON value: %.60s", what, jws(end));
}

static size_t count(const char *text, const char *needle) {
  size_t n = 0;
  for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
    n++;
  return n;
}

/* ---- output checks ---- */

static void check_chrome(const char *path, int culprit, bool flows, bool waits) {
  char *j = slurp(path, NULL);
  cr_assert_not_null(j, "%s not written", path);
  assert_json(j, path);
  cr_assert_eq(strncmp(j, "{\"traceEvents\":[", 16), 0);
  assert_has(j, "\"displayTimeUnit\":\"ms\"");
  assert_has(j, "\"name\":\"process_name\"");
  assert_has(j, "\"ph\":\"X\",\"cat\":\"collective\"");
  if (waits)
    assert_has(j, "\"cat\":\"stuck\"");
  assert_has(j, "\"cat\":\"diagnosis\"");
  size_t s = count(j, "\"ph\":\"s\""), f = count(j, "\"ph\":\"f\"");
  cr_assert_eq(s, f, "flow starts %zu, finishes %zu", s, f);
  if (flows)
    cr_assert_gt(s, 0, "no flow events");
  if (culprit >= 0) {
    char want[64];
    snprintf(want, sizeof(want), "\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"rank %d", culprit,
             culprit);
    assert_has(j, want);
    assert_has(j, "CULPRIT");
  }
  free(j);
}

static void unescape_html(char *s) {
  static const struct {
    const char *e;
    char c;
  } t[] = {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&#39;", '\''}};
  char *w = s;
  for (char *r = s; *r;) {
    size_t i;
    for (i = 0; i < sizeof(t) / sizeof(t[0]); i++)
      if (!strncmp(r, t[i].e, strlen(t[i].e)))
        break;
    if (i < sizeof(t) / sizeof(t[0])) {
      *w++ = t[i].c;
      r += strlen(t[i].e);
    } else {
      *w++ = *r++;
    }
  }
  *w = 0;
}

/* The text of <p id="diagnosis">, unescaped (malloc'ed). */
static char *html_diagnosis(const char *h) {
  const char *a = strstr(h, "<p id=\"diagnosis\">");
  cr_assert_not_null(a, "no #diagnosis");
  a += strlen("<p id=\"diagnosis\">");
  const char *b = strstr(a, "</p>");
  cr_assert_not_null(b);
  char *s = strndup(a, (size_t)(b - a));
  cr_assert_not_null(s);
  unescape_html(s);
  return s;
}

static void check_html(const char *path, const char *diagnosis, int culprit) {
  char *h = slurp(path, NULL);
  cr_assert_not_null(h, "%s not written", path);
  cr_assert_eq(strncmp(h, "<!DOCTYPE html>", 15), 0);
  assert_has(h, "</html>");
  char *d = html_diagnosis(h);
  cr_assert_str_eq(d, diagnosis);
  free(d);
  if (culprit >= 0) {
    char want[64];
    snprintf(want, sizeof(want), "class=\"rank culprit");
    assert_has(h, want);
    snprintf(want, sizeof(want), "data-rank=\"%d\"><td>%d (culprit)", culprit, culprit);
    assert_has(h, want);
  }
  /* self-contained: nothing fetched */
  cr_assert_null(strstr(h, "<link"), "a <link> in the page");
  cr_assert_null(strstr(h, " src="), "a src= in the page");
  cr_assert_null(strstr(h, "@import"));
  cr_assert_null(strstr(h, "https://"));
  /* the data block is JSON and names the culprit */
  const char *tag = "<script type=\"application/json\" id=\"trace-data\">";
  const char *a = strstr(h, tag);
  cr_assert_not_null(a);
  a += strlen(tag);
  const char *b = strstr(a, "</script>");
  cr_assert_not_null(b);
  char *data = strndup(a, (size_t)(b - a));
  cr_assert_not_null(data);
  assert_json(data, "the page's data block");
  char want[32];
  snprintf(want, sizeof(want), "\"culprit\":%d", culprit);
  assert_has(data, want);
  free(data);
  /* the script made it in whole */
  assert_has(h, "getElementById('trace-data')");
  free(h);
}

static void check_dot(const char *path, int culprit) {
  char *g = slurp(path, NULL);
  cr_assert_not_null(g, "%s not written", path);
  cr_assert_eq(strncmp(g, "digraph chorus_trace {", 22), 0);
  int depth = 0;
  bool in_str = false;
  for (const char *p = g; *p; p++) {
    if (in_str) {
      if (*p == '\\' && p[1])
        p++;
      else if (*p == '"')
        in_str = false;
      else
        cr_assert_neq(*p, '\n', "newline inside a dot string");
      continue;
    }
    if (*p == '"')
      in_str = true;
    else if (*p == '{')
      depth++;
    else if (*p == '}')
      cr_assert_geq(--depth, 0);
  }
  cr_assert_eq(depth, 0, "unbalanced braces");
  cr_assert(!in_str, "unterminated string");
  assert_has(g, "subgraph cluster_wait");
  if (culprit >= 0) {
    char want[64];
    snprintf(want, sizeof(want), "\n    r%d [label=", culprit);
    const char *n = strstr(g, want);
    cr_assert_not_null(n, "no node for rank %d:\n%s", culprit, g);
    const char *eol = strchr(n + 1, '\n');
    char *line = strndup(n + 1, (size_t)(eol - n - 1));
    assert_has(line, "class=\"culprit\"");
    assert_has(line, "color=red");
    free(line);
  }
  /* Graphviz itself, when it is installed */
  if (access("/usr/bin/dot", X_OK) == 0) {
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "/usr/bin/dot -Tsvg '%s' -o /dev/null 2>&1", path);
    cr_assert_eq(system(cmd), 0, "dot rejects %s", path);
  }
  free(g);
}

/* Runs with every output and checks them; returns the diagnosis line. */
static char *run_all_outputs(const tdir_t *t, int want_status, int culprit, bool flows) {
  bool waits = want_status == 0;
  char html[400], chrome[400], dot[400];
  snprintf(html, sizeof(html), "%s/page.html", t->out);
  snprintf(chrome, sizeof(chrome), "%s/trace.json", t->out);
  snprintf(dot, sizeof(dot), "%s/wait.dot", t->out);
  run_t r =
      run_on(t, t->dumps, "--html", html, "--chrome", chrome, "--dot", dot, (const char *)NULL);
  cr_assert_eq(r.status, want_status, "exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.status,
               want_status, r.out, r.err);
  char *line = first_line(r.out);
  check_html(html, line, culprit);
  check_chrome(chrome, culprit, flows, waits);
  check_dot(dot, culprit);
  run_free(&r);
  return line;
}

#ifndef TRACE_BROWSER_TEST

/* ---- the scenarios ---- */

Test(chorus_trace, skipped_collective_names_the_rank_that_diverged) {
  tdir_t t = tdir_new();
  scenario_skip(t.dumps, 7);
  run_t r = run_on(&t, t.dumps, (const char *)NULL);
  cr_assert_eq(r.status, 0, "stdout:\n%s\nstderr:\n%s", r.out, r.err);
  cr_assert_str_empty(r.err);
  char *line = first_line(r.out);
  cr_assert_str_eq(line, "collective #42 allreduce(float32, 1048576, sum): ranks 0,1,3 wait; rank "
                         "1 in 'SEND chunk 3 to rank 2' for 12.4 s, rank 3 in 'RECV chunk 2 from "
                         "rank 2' for 12.4 s; rank 2 is at #41 barrier and never called #42: rank "
                         "2 diverged");
  assert_has(r.out, "\nwait-for graph (comm 7: 4 ranks, 4 dumps,");
  assert_has(r.out, "  rank 3 -> rank 2: RECV chunk 2 from rank 2, POSTED for 12.4 s\n");
  assert_has(r.out, "root: rank 2 (in no collective, last #41 barrier), waited on by 2  [culprit]");
  free(line);
  run_free(&r);
  line = run_all_outputs(&t, 0, 2, true);
  free(line);
  char path[400];
  snprintf(path, sizeof(path), "%s/trace.json", t.out);
  char *j = slurp(path, NULL);
  assert_has(j, "\"cat\":\"verdict\",\"name\":\"verdict: TIMEOUT\"");
  assert_has(j, "\"cat\":\"fsm\",\"name\":\"#42 step 5: step READY -posted-\\u003e POSTED\"");
  /* rank 1's clock is 3 ms behind rank 0's: #42 began at 200 ms of rank 0's */
  assert_has(j, "\"name\":\"#42 allreduce\",\"pid\":1,\"tid\":1,\"ts\":1000200000.000,");
  free(j);
  tdir_free(&t);
}

Test(chorus_trace, another_collective_at_the_same_seq_is_a_divergence) {
  tdir_t t = tdir_new();
  scenario_skip_into_barrier(t.dumps);
  char *line = run_all_outputs(&t, 0, 2, true);
  cr_assert_str_eq(line, "collective #42: ranks 0,1,3 called allreduce(float32, 1048576, sum) but "
                         "rank 2 called barrier: another collective; ranks 0,1,3 wait; rank 1 in "
                         "'SEND chunk 3 to rank 2' for 12.4 s, rank 3 in 'RECV chunk 2 from rank "
                         "2' for 12.4 s: rank 2 diverged (its #42 is barrier, not allreduce)");
  free(line);
  tdir_free(&t);
}

Test(chorus_trace, mismatched_count_names_both_calls_and_ranks) {
  tdir_t t = tdir_new();
  scenario_mismatch(t.dumps);
  char *line = run_all_outputs(&t, 0, 2, false);
  cr_assert_str_eq(line, "collective #7: ranks 0,1,3 called allreduce(float32, 1024, sum) but rank "
                         "2 called allreduce(float32, 1000, sum): count differs; ranks 0,1,3 "
                         "wait; rank 3 in 'RECV chunk 0 from rank 2' for 5.0 s: mismatched call "
                         "at rank 2");
  free(line);
  tdir_free(&t);
}

Test(chorus_trace, killed_rank_without_a_dump_is_lost) {
  tdir_t t = tdir_new();
  scenario_killed(t.dumps, false);
  char *line = run_all_outputs(&t, 0, 3, false);
  cr_assert_str_eq(line, "collective #12 allreduce(float32, 65536, sum): ranks 0,1,2 wait; rank 0 "
                         "in 'RECV chunk 0 from rank 3' for 8.0 s, rank 2 in 'SEND chunk 0 to rank "
                         "3' for 8.0 s; rank 3 left no dump and rank 0 saw it lost: rank 3 lost");
  free(line);
  run_t r = run_on(&t, t.dumps, "-v", (const char *)NULL);
  cr_assert_eq(r.status, 0);
  assert_has(r.out, "\nrank 3: no dump  [culprit]\n");
  assert_has(r.out, "    sees rank 3 LOST (last seq 11, heard 8.0 s before)\n");
  assert_has(r.out, "    verdict TIMEOUT: collective #12 waited past CHORUS_TIMEOUT\n");
  assert_has(r.out, "    #12 step 1 RECV chunk 0 from rank 3: POSTED for 8.0 s\n");
  run_free(&r);
  tdir_free(&t);
}

Test(chorus_trace, connection_broken_by_a_killed_rank_is_a_wait_on_it) {
  tdir_t t = tdir_new();
  scenario_broken_connections(t.dumps);
  char *line = run_all_outputs(&t, 0, 3, false);
  cr_assert_str_eq(line, "collective #12 allreduce(float32, 65536, sum): ranks 0,1,2 wait; rank 0 "
                         "in 'RECV chunk 0 from rank 3' for 18 ms, rank 2 in 'SEND chunk 0 to "
                         "rank 3' for 18 ms; rank 3 left no dump and ranks 0,1,2 saw it lost: rank "
                         "3 lost");
  free(line);
  run_t r = run_on(&t, t.dumps, "-v", (const char *)NULL);
  cr_assert_eq(r.status, 0);
  assert_has(r.out, "  rank 0 -> rank 3: RECV chunk 0 from rank 3, FAILED (Connection reset by "
                    "peer) for 18 ms\n");
  assert_has(r.out, "    #12 step 0 SEND chunk 0 to rank 3: FAILED (Broken pipe) for 18 ms\n");
  assert_has(r.out, "    #12 step 4 RECV chunk 1 from rank 2: FAILED for 19 ms\n");
  cr_assert_null(strstr(r.out, "rank 1 -> rank 2"), "a canceled step is no wait:\n%s", r.out);
  run_free(&r);
  tdir_free(&t);
}

Test(chorus_trace, stalled_rank_in_a_wait_cycle) {
  tdir_t t = tdir_new();
  scenario_stalled(t.dumps);
  char *line = run_all_outputs(&t, 0, 1, false);
  cr_assert_str_eq(line, "collective #20 allreduce(float32, 262144, sum): ranks 0,2,3 wait; rank 2 "
                         "in 'RECV chunk 0 from rank 1' for 40.0 s; rank 1 is in #20; its "
                         "progress engine last ran 39.9 s before its dump (the others': within "
                         "50 ms) and 'SEND chunk 0 to rank 2' is READY since 39.9 s: rank 1 "
                         "stalled");
  free(line);
  tdir_free(&t);
}

Test(chorus_trace, wait_cycle_without_a_culprit) {
  tdir_t t = tdir_new();
  scenario_cycle(t.dumps);
  char *line = run_all_outputs(&t, 0, -1, false);
  assert_has(line, "collective #5 allreduce(float32, 4096, sum): ranks 0,1 wait; ");
  assert_has(line, ": deadlock cycle 0 -> 1 -> 0");
  free(line);
  run_t r = run_on(&t, t.dumps, (const char *)NULL);
  assert_has(r.out, "\ncycle: rank 0 -> rank 1 -> rank 0\n");
  run_free(&r);
  tdir_free(&t);
}

Test(chorus_trace, deadlock_through_a_split_is_a_cycle_in_world_ranks) {
  tdir_t t = tdir_new();
  scenario_split_deadlock(t.dumps);
  char *line = run_all_outputs(&t, 0, -1, false);
  assert_has(line, "collective #3 allreduce(float32, 4096, sum): ranks 0-3 wait; rank 0 in 'in the "
                   "split of ranks 0,2 (its #3 allreduce(float32, 4096, sum)): RECV chunk 0 from "
                   "rank 2' for 2.2 s");
  assert_has(line, ": deadlock cycle 0 -> 2 -> 0 (of it, rank 0 waits on rank 2 in the split of "
                   "ranks 0,2 (its #3 allreduce(float32, 4096, sum)): RECV chunk 0 from rank 2)");
  free(line);
  run_t r = run_on(&t, t.dumps, (const char *)NULL);
  assert_has(r.out, "\nwait-for graph (comm 0: 4 ranks, 4 dumps, 4 edges):\n");
  assert_has(r.out, "  rank 0 -> rank 2: in the split of ranks 0,2 (its #3 allreduce(float32, "
                    "4096, sum)): RECV chunk 0 from rank 2, POSTED for 2.2 s  [cycle]\n");
  cr_assert_null(strstr(r.out, "diverged"), "a rank blamed:\n%s", r.out);
  run_free(&r);
  tdir_free(&t);
}

Test(chorus_trace, killed_rank_others_wait_on_only_in_a_split_is_lost) {
  tdir_t t = tdir_new();
  scenario_killed_in_a_split(t.dumps);
  char *line = run_all_outputs(&t, 0, 2, false);
  cr_assert_str_eq(line, "after collective #2, in splits: rank 0 waits; rank 0 in 'in the split of "
                         "ranks 0,2 (its #3 allreduce(float32, 4096, sum)): RECV chunk 0 from rank "
                         "2' for 26 ms; rank 2 left no dump and ranks 0,1,3 saw it lost: rank 2 "
                         "lost");
  free(line);
  tdir_free(&t);
}

Test(chorus_trace, extra_call_after_the_others_destroyed_names_the_caller) {
  tdir_t t = tdir_new();
  scenario_extra_call(t.dumps);
  char *line = run_all_outputs(&t, 0, 2, false);
  cr_assert_str_eq(line,
                   "collective #9 allreduce(float32, 4096, sum): rank 2 called #9 after ranks "
                   "0,1,3 destroyed the communicator (their last call: #8): rank 2 diverged "
                   "(it called after the others left: an extra call)");
  free(line);
  tdir_free(&t);
}

Test(chorus_trace, healthy_job_has_no_culprit) {
  tdir_t t = tdir_new();
  scenario_healthy(t.dumps, 1);
  char *line = run_all_outputs(&t, 1, -1, false);
  cr_assert_str_eq(line, "no culprit: 2 ranks are idle, the last collective begun is #5");
  free(line);
  tdir_free(&t);
}

Test(chorus_trace, truncated_and_foreign_files_are_reported_and_skipped) {
  tdir_t t = tdir_new();
  scenario_killed(t.dumps, true);
  static const char junk[] = "not a protobuf at all \xff\xff\xff\xff\xff";
  cr_assert_eq(tf_write_bytes(t.dumps, "junk.trace", junk, sizeof(junk)), 0);
  cr_assert_eq(tf_write_bytes(t.dumps, "empty.trace", "", 0), 0);
  cr_assert_eq(tf_write_bytes(t.dumps, "notes.txt", junk, sizeof(junk)), 0);
  char sub[400];
  snprintf(sub, sizeof(sub), "%s/dir.trace", t.dumps);
  cr_assert_eq(mkdir(sub, 0755), 0);
  run_t r = run_on(&t, t.dumps, (const char *)NULL);
  cr_assert_eq(r.status, 0, "stdout:\n%s\nstderr:\n%s", r.out, r.err);
  assert_has(r.err, "rank-3.trace: truncated or malformed");
  assert_has(r.err, "junk.trace: truncated or malformed");
  assert_has(r.err, "empty.trace: empty file");
  cr_assert_null(strstr(r.err, "notes.txt"));
  cr_assert_null(strstr(r.err, ".tmp"));
  cr_assert_null(strstr(r.err, "dir.trace"));
  assert_has(r.out, "rank 3 left no dump and rank 0 saw it lost: rank 3 lost");
  run_free(&r);
  tdir_free(&t);

  /* nothing readable at all */
  t = tdir_new();
  cr_assert_eq(tf_write_bytes(t.dumps, "junk.trace", junk, sizeof(junk)), 0);
  r = run_on(&t, t.dumps, (const char *)NULL);
  cr_assert_eq(r.status, 2);
  assert_has(r.err, "no readable dump");
  run_free(&r);
  tdir_free(&t);
}

Test(chorus_trace, inconsistent_dumps_are_skipped) {
  tdir_t t = tdir_new();
  scenario_skip(t.dumps, 7);
  /* a second dump of rank 1, and one that disagrees on the size */
  tf_dump_t *d = tf_new(7, 1, 4, L(1, 100), 0);
  write_dump(d, t.dumps, "zz-rank-1-again");
  d = tf_new(7, 0, 5, L(0, 100), 0);
  write_dump(d, t.dumps, "zz-size-5");
  d = tf_new(7, 9, 4, L(0, 100), 0); /* rank out of range */
  write_dump(d, t.dumps, "zz-rank-9");
  run_t r = run_on(&t, t.dumps, (const char *)NULL);
  cr_assert_eq(r.status, 0, "stdout:\n%s\nstderr:\n%s", r.out, r.err);
  assert_has(r.err, "zz-rank-1-again.trace: comm 7 rank 1: already read from comm7-rank-1.trace");
  assert_has(r.err, "zz-size-5.trace: comm 7 rank 0: size 5, but most dumps say 4");
  assert_has(r.err, "zz-rank-9.trace: its rank is out of range");
  assert_has(r.out, ": rank 2 diverged\n");
  run_free(&r);
  tdir_free(&t);
}

Test(chorus_trace, empty_directory_and_usage_errors_exit_2) {
  tdir_t t = tdir_new();
  run_t r = run_on(&t, t.dumps, (const char *)NULL);
  cr_assert_eq(r.status, 2);
  assert_has(r.err, "no readable dump");
  run_free(&r);

  const char *none[] = {TRACE_TOOL, NULL};
  r = run_argv(&t, none);
  cr_assert_eq(r.status, 2);
  assert_has(r.err, "usage: chorus-trace DIR");
  run_free(&r);

  r = run_on(&t, t.dumps, "--frobnicate", (const char *)NULL);
  cr_assert_eq(r.status, 2);
  assert_has(r.err, "unknown option '--frobnicate'");
  run_free(&r);

  r = run_on(&t, t.dumps, "--comm", "seven", (const char *)NULL);
  cr_assert_eq(r.status, 2);
  run_free(&r);

  r = run_on(&t, t.dumps, "--html", (const char *)NULL);
  cr_assert_eq(r.status, 2);
  run_free(&r);

  r = run_on(&t, "/nonexistent/chorus-trace-dir", (const char *)NULL);
  cr_assert_eq(r.status, 2);
  assert_has(r.err, "No such file or directory");
  run_free(&r);

  r = run_on(&t, "--help", (const char *)NULL);
  cr_assert_eq(r.status, 0);
  assert_has(r.out, "usage: chorus-trace DIR");
  run_free(&r);
  tdir_free(&t);
}

Test(chorus_trace, several_communicators) {
  tdir_t t = tdir_new();
  scenario_healthy(t.dumps, 1);
  scenario_skip(t.dumps, 7);
  run_t r = run_on(&t, t.dumps, (const char *)NULL);
  cr_assert_eq(r.status, 0, "stdout:\n%s\nstderr:\n%s", r.out, r.err);
  cr_assert_eq(strncmp(r.out, "comm 7: collective #42 allreduce", 32), 0, "%s", r.out);
  assert_has(r.out, "\nwithout a culprit: comm 1 (--comm ID shows one)\n");
  run_free(&r);

  r = run_on(&t, t.dumps, "--comm", "1", (const char *)NULL);
  cr_assert_eq(r.status, 1, "stdout:\n%s", r.out);
  assert_has(r.out, "comm 1: no culprit");
  run_free(&r);

  char html[400];
  snprintf(html, sizeof(html), "%s/one.html", t.out);
  r = run_on(&t, t.dumps, "--comm", "7", "--html", html, (const char *)NULL);
  cr_assert_eq(r.status, 0);
  char *h = slurp(html, NULL);
  assert_has(h, "<h1>chorus-trace: comm 7, 4 ranks, 4 dumps</h1>");
  free(h);
  run_free(&r);

  r = run_on(&t, t.dumps, "--comm", "99", (const char *)NULL);
  cr_assert_eq(r.status, 2);
  assert_has(r.err, "no dump of communicator 99; there are: 1 7");
  run_free(&r);

  r = run_on(&t, t.dumps, "--html", "/nonexistent/dir/page.html", (const char *)NULL);
  cr_assert_eq(r.status, 2, "an output that cannot be written is an error");
  run_free(&r);
  tdir_free(&t);
}

/* ---- outside bytes: mutated and random dumps ---- */

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static void run_must_not_crash(const tdir_t *t) {
  char html[400], chrome[400], dot[400];
  snprintf(html, sizeof(html), "%s/f.html", t->out);
  snprintf(chrome, sizeof(chrome), "%s/f.json", t->out);
  snprintf(dot, sizeof(dot), "%s/f.dot", t->out);
  run_t r = run_on(t, t->dumps, "-v", "--html", html, "--chrome", chrome, "--dot", dot,
                   (const char *)NULL);
  cr_assert(r.status >= 0 && r.status <= 2, "exit %d\n%s", r.status, r.err);
  if (r.status < 2) {
    char *j = slurp(chrome, NULL);
    assert_json(j, "the Chrome trace of a mutated dump");
    free(j);
    check_dot(dot, -1);
    char *h = slurp(html, NULL);
    cr_assert_not_null(h);
    const char *tag = "<script type=\"application/json\" id=\"trace-data\">";
    const char *a = strstr(h, tag), *b = a ? strstr(a, "</script>") : NULL;
    cr_assert(a && b, "no data block in the page");
    char *data = strndup(a + strlen(tag), (size_t)(b - a - strlen(tag)));
    assert_json(data, "the page's data block");
    free(data);
    free(h);
  }
  run_free(&r);
}

Test(chorus_trace, mutated_dumps_never_crash_it, .timeout = 240) {
  tdir_t src = tdir_new();
  scenario_skip(src.dumps, 7);
  char path[400];
  snprintf(path, sizeof(path), "%s/comm7-rank-0.trace", src.dumps);
  size_t len = 0;
  uint8_t *orig = (uint8_t *)slurp(path, &len);
  cr_assert_not_null(orig);
  cr_assert_gt(len, 100);
  for (int round = 0; round < 60; round++) {
    tdir_t t = tdir_new();
    for (int r = 1; r < 4; r++) {
      char from[64];
      snprintf(from, sizeof(from), "comm7-rank-%d.trace", r);
      size_t n = 0;
      snprintf(path, sizeof(path), "%s/%s", src.dumps, from);
      char *b = slurp(path, &n);
      cr_assert_not_null(b);
      cr_assert_eq(tf_write_bytes(t.dumps, from, b, n), 0);
      free(b);
    }
    uint8_t *m = malloc(len + 64);
    memcpy(m, orig, len);
    size_t n = len;
    int edits = 1 + (int)(rnd() % 8);
    for (int e = 0; e < edits; e++) {
      switch (rnd() % 4) {
      case 0: /* flip a byte */
        m[rnd() % n] ^= (uint8_t)(1 + rnd() % 255);
        break;
      case 1: /* a varint grows huge */
        m[rnd() % n] = 0xff;
        break;
      case 2: /* cut */
        n = 1 + rnd() % n;
        break;
      default: /* a byte that says "length follows" */
        m[rnd() % n] = (uint8_t)(rnd() % 2 ? 0x0a : 0x4a);
        break;
      }
    }
    cr_assert_eq(tf_write_bytes(t.dumps, "comm7-rank-0.trace", m, n), 0);
    free(m);
    run_must_not_crash(&t);
    tdir_free(&t);
  }
  free(orig);
  tdir_free(&src);
}

static int64_t wild(void) {
  static const int64_t v[] = {0,  1,  -1,    2,     3,         4,         5,         41,
                              42, 43, 65535, 65536, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN};
  return v[rnd() % (sizeof(v) / sizeof(v[0]))];
}

Test(chorus_trace, random_dumps_never_crash_it, .timeout = 240) {
  for (int round = 0; round < 60; round++) {
    tdir_t t = tdir_new();
    int size = 1 + (int)(rnd() % 6);
    for (int r = 0; r < size; r++) {
      if (rnd() % 5 == 0)
        continue; /* no dump */
      uint64_t now = rnd() % 2 ? (uint64_t)wild() : L(r, 5000);
      tf_dump_t *d = tf_new(rnd() % 3 ? 1 : (uint32_t)wild(), rnd() % 9 ? r : (int)wild(),
                            rnd() % 9 ? size : (int)wild(), now, rnd() % 3 ? 0 : wild());
      int ncalls = (int)(rnd() % 5);
      for (int c = 0; c < ncalls; c++)
        tf_call(d, rnd() % 4 ? (uint64_t)(40 + c) : (uint64_t)wild(), (int)(rnd() % 14),
                (int)(rnd() % 10), rnd() % 3 ? 1024 : (uint64_t)wild(), (int)(rnd() % 7),
                (int)wild(), rnd() % 2 ? L(r, 100 * c) : (uint64_t)wild(),
                rnd() % 2 ? 0 : (uint64_t)wild());
      tf_where(d, (uint64_t)(rnd() % 2 ? 40 + ncalls - 1 : wild()), (uint64_t)wild(), rnd() % 2,
               rnd() % 2 ? 0 : (uint64_t)wild());
      int nsteps = (int)(rnd() % 6);
      for (int s = 0; s < nsteps; s++)
        tf_step(d, (uint64_t)(rnd() % 2 ? 42 : wild()), (uint32_t)rnd(), (int)(rnd() % 8),
                (int)(rnd() % 8), rnd() % 2 ? (int)(rnd() % (unsigned)size) : (int)wild(),
                (uint32_t)rnd(), rnd() % 2 ? L(r, 200) : (uint64_t)wild());
      for (int k = (int)(rnd() % 4); k > 0; k--)
        tf_message(d, (uint64_t)(rnd() % 3), (uint32_t)rnd(), rnd() % 2,
                   rnd() % 2 ? (int)(rnd() % (unsigned)size) : (int)wild(), (uint32_t)(rnd() % 3),
                   0, (uint64_t)wild(), rnd() % 2 ? L(r, 10) : (uint64_t)wild(),
                   rnd() % 2 ? L(r, 20) : (uint64_t)wild());
      for (int k = (int)(rnd() % 3); k > 0; k--)
        tf_peer(d, (int)(rnd() % 2 ? rnd() % (unsigned)size : (uint64_t)wild()), (int)(rnd() % 6),
                (uint64_t)wild(), (uint64_t)wild());
      if (rnd() % 2)
        tf_verdict(d, (int)(rnd() % 10), (int)(rnd() % 2 ? rnd() % (unsigned)size : 0) - 1,
                   "\xff\xfe<script>alert(1)</script>\"'\n\x01", (uint64_t)wild());
      if (rnd() % 2)
        tf_fault(d, (uint64_t)wild(), "\xc3\x28", (int)wild(), (uint64_t)wild(), "&<>");
      for (int k = (int)(rnd() % 4); k > 0; k--)
        tf_journal(d, (uint64_t)wild(), (uint32_t)rnd(), (uint64_t)(rnd() % 2 ? 42 : wild()),
                   (int)(rnd() % 7), (int)(rnd() % 7), rnd() % 2 ? 0xffff : (int)(rnd() % 7));
      char name[32];
      snprintf(name, sizeof(name), "r%d", r);
      write_dump(d, t.dumps, name);
    }
    run_must_not_crash(&t);
    tdir_free(&t);
  }
}

#else /* TRACE_BROWSER_TEST */

/* ---- the page in a real browser ---- */

/* t->out/page.html after its scripts ran, as Chromium sees it; *log gets
 * Chromium's stderr, where console messages and uncaught errors show as
 * "CONSOLE" lines. */
static char *dump_dom(const tdir_t *t, char **log) {
  char cmd[2048], path[400];
  snprintf(cmd, sizeof(cmd),
           "cd '%s' && timeout 90 " CHROMIUM " --headless --no-sandbox --disable-gpu "
           "--disable-dev-shm-usage --no-first-run --user-data-dir='%s/profile-dom' "
           "--enable-logging=stderr --v=0 --window-size=1400,1000 --dump-dom "
           "'file://%s/page.html' > '%s/dom.html' 2> '%s/chromium-dom.log'",
           t->out, t->out, t->out, t->out, t->out);
  int st = system(cmd);
  snprintf(path, sizeof(path), "%s/chromium-dom.log", t->out);
  *log = slurp(path, NULL);
  cr_assert_not_null(*log);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "chromium --dump-dom failed (%d):\n%s", st,
            *log);
  snprintf(path, sizeof(path), "%s/dom.html", t->out);
  char *dom = slurp(path, NULL);
  cr_assert_not_null(dom);
  return dom;
}

Test(chorus_trace_browser, page_draws_in_headless_chromium, .timeout = 180) {
  if (access(CHROMIUM, X_OK) != 0) {
    const char *req = getenv("CHORUS_REQUIRE_CHROMIUM");
    cr_assert(!(req && !strcmp(req, "1")),
              CHROMIUM " is missing and CHORUS_REQUIRE_CHROMIUM=1 (scripts/deps.sh installs it)");
    cr_skip_test("skipped: " CHROMIUM " is not installed (scripts/deps.sh installs it; set "
                 "CHORUS_REQUIRE_CHROMIUM=1 to make this a failure)");
  }
  tdir_t t = tdir_new();
  scenario_skip(t.dumps, 7);
  char *line = run_all_outputs(&t, 0, 2, true);
  char cmd[2048], path[400];
  char *log, *dom = dump_dom(&t, &log);
  cr_assert_null(strstr(log, "CONSOLE"), "the page logged to the console:\n%s", log);
  cr_assert_null(strstr(dom, "id=\"trace-error\""), "the script failed:\n%.2000s",
                 strstr(dom, "trace-error"));
  assert_has(dom, "id=\"trace-ok\"");
  assert_has(dom, "drawn: 4 lanes, 12 messages, 6 waits");
  char *d = html_diagnosis(dom);
  cr_assert_str_eq(d, line);
  free(d);
  /* the lanes the script drew: the culprit's in red, stuck steps, arrows */
  assert_has(dom, "<g class=\"lane culprit\" data-rank=\"2\">");
  assert_has(dom, "class=\"step stuck\"");
  assert_has(dom, "class=\"msg\"");
  assert_has(dom, "class=\"wait\"");
  assert_has(dom, "<g class=\"node culprit\" data-rank=\"2\">");
  free(dom);
  free(log);

  /* a culprit without a dump still gets its (empty) lane, in red */
  tdir_t k = tdir_new();
  scenario_killed(k.dumps, false);
  free(run_all_outputs(&k, 0, 3, false));
  dom = dump_dom(&k, &log);
  cr_assert_null(strstr(log, "CONSOLE"), "the page logged to the console:\n%s", log);
  assert_has(dom, "id=\"trace-ok\"");
  assert_has(dom, "<g class=\"lane culprit missing\" data-rank=\"3\">");
  assert_has(dom, "no dump: this rank is the culprit");
  free(dom);
  free(log);
  tdir_free(&k);

  snprintf(cmd, sizeof(cmd),
           "cd '%s' && timeout 90 " CHROMIUM " --headless --no-sandbox --disable-gpu "
           "--disable-dev-shm-usage --no-first-run --user-data-dir='%s/profile-shot' "
           "--hide-scrollbars --window-size=1400,1000 --screenshot='%s/page.png' "
           "'file://%s/page.html' > '%s/chromium-shot.log' 2>&1",
           t.out, t.out, t.out, t.out, t.out);
  int st = system(cmd);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "chromium --screenshot failed (%d)", st);
  size_t n = 0;
  snprintf(path, sizeof(path), "%s/page.png", t.out);
  char *png = slurp(path, &n);
  cr_assert_not_null(png, "no screenshot");
  cr_assert_gt(n, 10000, "screenshot of %zu bytes", n);
  cr_assert_eq(memcmp(png, "\x89PNG\r\n\x1a\n", 8), 0, "not a PNG");
  free(png);
  free(line);
  tdir_free(&t);
}

#endif
