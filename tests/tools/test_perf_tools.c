/*
 * test_perf_tools.c - chorus-perf (under chorus-run) and mpi-perf (under
 * mpirun) run as a user runs them: every collective with --check at 2 and 3
 * ranks on small sizes must report 0 wrong elements in valid JSON lines that
 * carry the collective, the algorithm and sizes sized the nccl-tests way;
 * usage errors exit 2 before any rank starts. The mpi-perf cases are skipped
 * where mpi-perf was not built or mpirun is missing.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define TOOLS CHORUS_BUILD_DIR "/tools/"
#define RUN_TIMEOUT_S 40.0
#define SWEEP "-b 8 -e 64K -f 8 -n 3 -w 1 --check --json"

/* ---- running a command ---- */

struct output {
  char *out, *err;
  int status; /* exit code, or 128 + signal */
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void append(char **buf, size_t *len, const char *p, size_t n) {
  *buf = realloc(*buf, *len + n + 1);
  cr_assert(*buf);
  memcpy(*buf + *len, p, n);
  *len += n;
  (*buf)[*len] = '\0';
}

/* Runs argv with stdin from /dev/null; kills it after RUN_TIMEOUT_S. */
static struct output run_cmd(char *const argv[]) {
  struct output o = {0};
  size_t len[2] = {0, 0};
  char **bufs[2] = {&o.out, &o.err};
  int po[2], pe[2], fds[2], status;
  posix_spawn_file_actions_t fa;
  pid_t pid;
  double start = now_s();
  bool killed = false;

  cr_assert(pipe(po) == 0 && pipe(pe) == 0);
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, po[1], 1);
  posix_spawn_file_actions_adddup2(&fa, pe[1], 2);
  posix_spawn_file_actions_addclose(&fa, po[0]);
  posix_spawn_file_actions_addclose(&fa, pe[0]);
  posix_spawn_file_actions_addclose(&fa, po[1]);
  posix_spawn_file_actions_addclose(&fa, pe[1]);
  cr_assert_eq(posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ), 0, "spawn %s", argv[0]);
  posix_spawn_file_actions_destroy(&fa);
  close(po[1]);
  close(pe[1]);
  fds[0] = po[0];
  fds[1] = pe[0];
  append(&o.out, &len[0], "", 0);
  append(&o.err, &len[1], "", 0);
  while (fds[0] >= 0 || fds[1] >= 0) {
    struct pollfd pf[2];
    int n = 0, idx[2];
    for (int i = 0; i < 2; i++)
      if (fds[i] >= 0) {
        pf[n] = (struct pollfd){.fd = fds[i], .events = POLLIN};
        idx[n++] = i;
      }
    if (!killed && now_s() - start > RUN_TIMEOUT_S) {
      kill(pid, SIGKILL);
      killed = true;
    }
    if (poll(pf, (nfds_t)n, 200) <= 0)
      continue;
    for (int k = 0; k < n; k++) {
      char chunk[4096];
      ssize_t got;
      if (!(pf[k].revents & (POLLIN | POLLHUP | POLLERR)))
        continue;
      got = read(fds[idx[k]], chunk, sizeof(chunk));
      if (got > 0) {
        append(bufs[idx[k]], &len[idx[k]], chunk, (size_t)got);
      } else if (got == 0 || errno != EINTR) {
        close(fds[idx[k]]);
        fds[idx[k]] = -1;
      }
    }
  }
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  o.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  cr_assert_not(killed, "%s ran past %.0f s; stderr:\n%s", argv[0], RUN_TIMEOUT_S, o.err);
  return o;
}

static void output_free(struct output *o) {
  free(o->out);
  free(o->err);
}

/* ---- a flat JSON object: string, number, true/false/null values ---- */

enum jtype { J_STRING, J_NUMBER, J_BOOL, J_NULL };

struct jfield {
  char key[32];
  enum jtype type;
  char str[128];
  double num;
};

struct jobj {
  struct jfield f[32];
  int n;
};

static const char *skip_ws(const char *p) {
  while (*p == ' ' || *p == '\t')
    p++;
  return p;
}

/* A JSON string at p into out; returns the end, or NULL when malformed. */
static const char *parse_string(const char *p, char *out, size_t len) {
  size_t n = 0;
  if (*p++ != '"')
    return NULL;
  for (; *p && *p != '"'; p++) {
    char ch = *p;
    if ((unsigned char)ch < 0x20)
      return NULL;
    if (ch == '\\') {
      p++;
      if (*p == 'u') {
        for (int i = 1; i <= 4; i++)
          if (!isxdigit((unsigned char)p[i]))
            return NULL;
        p += 4;
        ch = '?';
      } else if (strchr("\"\\/bfnrt", *p) && *p) {
        ch = *p;
      } else {
        return NULL;
      }
    }
    if (n + 1 < len)
      out[n++] = ch;
  }
  if (*p != '"')
    return NULL;
  out[n] = '\0';
  return p + 1;
}

/* Parses one line; false when it is not exactly one flat JSON object. */
static bool parse_json(const char *line, struct jobj *o) {
  const char *p = skip_ws(line);
  o->n = 0;
  if (*p++ != '{')
    return false;
  p = skip_ws(p);
  if (*p == '}')
    return *skip_ws(p + 1) == '\0';
  for (;;) {
    struct jfield *f;
    if (o->n == 32)
      return false;
    f = &o->f[o->n++];
    p = parse_string(skip_ws(p), f->key, sizeof(f->key));
    if (!p)
      return false;
    p = skip_ws(p);
    if (*p++ != ':')
      return false;
    p = skip_ws(p);
    if (*p == '"') {
      f->type = J_STRING;
      p = parse_string(p, f->str, sizeof(f->str));
      if (!p)
        return false;
    } else if (!strncmp(p, "true", 4) || !strncmp(p, "false", 5)) {
      f->type = J_BOOL;
      f->num = *p == 't';
      p += *p == 't' ? 4 : 5;
    } else if (!strncmp(p, "null", 4)) {
      f->type = J_NULL;
      p += 4;
    } else {
      char *end;
      if (!(*p == '-' || isdigit((unsigned char)*p)))
        return false;
      f->type = J_NUMBER;
      f->num = strtod(p, &end);
      if (end == p)
        return false;
      p = end;
    }
    p = skip_ws(p);
    if (*p == ',') {
      p++;
      continue;
    }
    if (*p != '}')
      return false;
    return *skip_ws(p + 1) == '\0';
  }
}

static const struct jfield *jget(const struct jobj *o, const char *key) {
  for (int i = 0; i < o->n; i++)
    if (!strcmp(o->f[i].key, key))
      return &o->f[i];
  return NULL;
}

static const struct jfield *jget_type(const struct jobj *o, const char *key, enum jtype t,
                                      const char *line) {
  const struct jfield *f = jget(o, key);
  cr_assert(f, "no \"%s\" in %s", key, line);
  cr_assert_eq(f->type, t, "\"%s\" has the wrong type in %s", key, line);
  return f;
}

/* ---- the sweep and its checks ---- */

enum layout { SAME, GATHER, SCATTER, ALL, NONE };

static const struct coll {
  char name[16];
  enum layout layout;
  bool rooted, inplace;
} colls[] = {
    {"allreduce", SAME, false, true},
    {"bcast", SAME, true, true},
    {"reduce", SAME, true, false},
    {"allgather", GATHER, false, true},
    {"reduce_scatter", SCATTER, false, true},
    {"alltoall", ALL, false, false},
    {"gather", GATHER, true, false},
    {"scatter", SCATTER, true, false},
    {"barrier", NONE, false, false},
    {"sendrecv", SAME, false, false},
};
#define NCOLLS ((int)(sizeof(colls) / sizeof(colls[0])))

static const struct coll *coll_named(const char *name) {
  for (int i = 0; i < NCOLLS; i++)
    if (!strcmp(colls[i].name, name))
      return &colls[i];
  return NULL;
}

/* nccl-tests' bus factors. */
static double bus_factor(const struct coll *c, int n) {
  if (!strcmp(c->name, "allreduce"))
    return 2.0 * (n - 1) / n;
  if (c->layout == SAME)
    return 1.0; /* bcast reduce sendrecv */
  return (double)(n - 1) / n;
}

/* The per-call count of a SWEEP size (float32), 0 when the size is skipped. */
static size_t sweep_count(const struct coll *c, size_t bytes, int n) {
  return c->layout == SAME ? bytes / 4 : bytes / 4 / (size_t)n;
}

/* What one run is expected to print. */
struct expect {
  int nranks;
  int root;       /* -1: not given (0) */
  bool inplace;   /* --inplace was given */
  bool lib;       /* --mem lib was given */
  int offset;     /* --offset */
  bool mpi;       /* provider "openmpi", algo "default" */
  char algo[16];  /* "" or the algo every line must name */
  char colls[96]; /* the -c list, in order */
};

/* After the last line of c: the sweep reached its last size (32K). */
static void assert_complete(const struct coll *c, size_t next_size, const char *out) {
  if (c->layout == NONE)
    cr_assert_eq(next_size, 64, "no barrier line in:\n%s", out);
  else
    cr_assert_gt(next_size, 65536, "%s stopped before its last size in:\n%s", c->name, out);
}

/*
 * Checks the JSON lines of a successful run: every line valid, the
 * collectives of -c in order, each with one line per size it can run, sizes
 * and counts the nccl-tests way, 0 wrong.
 */
static void check_lines(const struct output *o, const struct expect *e) {
  char list[96], *save = NULL, *line, *lsave = NULL;
  char *text = strdup(o->out);
  const struct coll *order[16];
  int ncoll = 0, ci = 0;
  size_t size = 8;

  cr_assert(text);
  snprintf(list, sizeof(list), "%s", e->colls);
  for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    order[ncoll] = coll_named(t);
    cr_assert(order[ncoll], "unknown collective %s in the test", t);
    ncoll++;
  }
  for (line = strtok_r(text, "\n", &lsave); line; line = strtok_r(NULL, "\n", &lsave)) {
    struct jobj obj;
    const struct coll *c;
    const struct jfield *f;
    size_t count;
    cr_assert(parse_json(line, &obj), "not a JSON object: %s", line);
    c = coll_named(jget_type(&obj, "collective", J_STRING, line)->str);
    cr_assert(c, "unknown collective in %s", line);
    /* the next size of this collective, or the first of the next one */
    while (ci < ncoll && order[ci] != c) {
      assert_complete(order[ci], size, o->out);
      ci++;
      size = 8;
    }
    cr_assert_lt(ci, ncoll, "collective out of order: %s", line);
    if (c->layout == NONE) {
      cr_assert_eq(size, 8, "barrier printed more than one line: %s", line);
    } else {
      while (size <= 65536 && sweep_count(c, size, e->nranks) == 0)
        size *= 8;
      cr_assert_leq(size, 65536, "a line past the last size: %s", line);
    }
    count = c->layout == NONE ? 0 : sweep_count(c, size, e->nranks);
    cr_assert_eq((size_t)jget_type(&obj, "count", J_NUMBER, line)->num, count, "%s", line);
    cr_assert_eq((size_t)jget_type(&obj, "bytes", J_NUMBER, line)->num,
                 c->layout == SAME   ? count * 4
                 : c->layout == NONE ? 0
                                     : count * 4 * (size_t)e->nranks,
                 "%s", line);
    cr_assert_eq(jget_type(&obj, "wrong", J_NUMBER, line)->num, 0, "wrong elements: %s", line);
    cr_assert_eq(jget_type(&obj, "nranks", J_NUMBER, line)->num, e->nranks, "%s", line);
    cr_assert_gt(jget_type(&obj, "time_us", J_NUMBER, line)->num, 0, "%s", line);
    f = jget_type(&obj, "algo", J_STRING, line);
    cr_assert(f->str[0], "empty algo: %s", line);
    if (e->mpi)
      cr_assert_str_eq(f->str, "default", "%s", line);
    else if (e->algo[0])
      cr_assert_str_eq(f->str, e->algo, "%s", line);
    f = jget_type(&obj, "provider", J_STRING, line);
    if (e->mpi)
      cr_assert_str_eq(f->str, "openmpi", "%s", line);
    cr_assert_eq(jget_type(&obj, "inplace", J_BOOL, line)->num, e->inplace && c->inplace, "%s",
                 line);
    cr_assert_str_eq(jget_type(&obj, "mem", J_STRING, line)->str, e->lib ? "lib" : "plain", "%s",
                     line);
    cr_assert_eq(jget_type(&obj, "offset", J_NUMBER, line)->num, e->offset, "%s", line);
    if (c->rooted)
      cr_assert_eq(jget_type(&obj, "root", J_NUMBER, line)->num, e->root < 0 ? 0 : e->root, "%s",
                   line);
    else
      jget_type(&obj, "root", J_NULL, line);
    if (c->layout == NONE) {
      jget_type(&obj, "busbw_gbs", J_NULL, line);
    } else {
      /* algbw = bytes/time in GB/s, busbw = algbw * factor; time is printed
       * to 1e-3 us and bandwidths to 1e-6 GB/s */
      double t = jget_type(&obj, "time_us", J_NUMBER, line)->num;
      double algbw = jget_type(&obj, "algbw_gbs", J_NUMBER, line)->num;
      double busbw = jget_type(&obj, "busbw_gbs", J_NUMBER, line)->num;
      double bytes = jget_type(&obj, "bytes", J_NUMBER, line)->num;
      double rel = 0.0006 / t + 1e-5;
      cr_assert_leq(fabs(algbw - bytes / (t * 1e3)), 2e-6 + rel * algbw, "algbw: %s", line);
      cr_assert_leq(fabs(busbw - algbw * bus_factor(c, e->nranks)), 2e-6 + 1e-5 * busbw,
                    "busbw: %s", line);
    }
    size *= 8;
  }
  /* every collective ran, up to its last size */
  cr_assert_eq(ci, ncoll - 1, "collectives missing in:\n%s", o->out);
  assert_complete(order[ci], size, o->out);
  free(text);
}

struct perf_case {
  int nranks;
  int root;
  bool inplace;
  bool lib;   /* --mem lib */
  int offset; /* --offset, when not 0 */
  char algo[16];
  char colls[96];
};

static struct output run_chorus(const struct perf_case *tc) {
  char root[8], offset[8], cmd[512], *argv[48], *save = NULL;
  int argc = 0;
  snprintf(root, sizeof(root), "%d", tc->root);
  snprintf(cmd, sizeof(cmd), "%schorus-run -n %d --no-tag --timeout 35 -- %schorus-perf -c %s %s",
           TOOLS, tc->nranks, TOOLS, tc->colls, SWEEP);
  for (char *t = strtok_r(cmd, " ", &save); t; t = strtok_r(NULL, " ", &save))
    argv[argc++] = t;
  if (tc->root >= 0) {
    argv[argc++] = "--root";
    argv[argc++] = root;
  }
  if (tc->inplace)
    argv[argc++] = "--inplace";
  if (tc->lib) {
    argv[argc++] = "--mem";
    argv[argc++] = "lib";
  }
  if (tc->offset) {
    snprintf(offset, sizeof(offset), "%d", tc->offset);
    argv[argc++] = "--offset";
    argv[argc++] = offset;
  }
  if (tc->algo[0]) {
    argv[argc++] = "--algo";
    argv[argc++] = (char *)tc->algo;
  }
  argv[argc] = NULL;
  return run_cmd(argv);
}

static bool have_mpi(void) {
  return access(TOOLS "mpi-perf", X_OK) == 0 && system("command -v mpirun >/dev/null 2>&1") == 0;
}

static struct output run_mpi(const struct perf_case *tc) {
  char root[8], offset[8], cmd[512], *argv[48], *save = NULL;
  int argc = 0;
  snprintf(root, sizeof(root), "%d", tc->root);
  snprintf(cmd, sizeof(cmd),
           "mpirun --allow-run-as-root --oversubscribe -np %d --bind-to none --mca pml ob1 "
           "--mca btl self,vader %smpi-perf -c %s %s",
           tc->nranks, TOOLS, tc->colls, SWEEP);
  for (char *t = strtok_r(cmd, " ", &save); t; t = strtok_r(NULL, " ", &save))
    argv[argc++] = t;
  if (tc->root >= 0) {
    argv[argc++] = "--root";
    argv[argc++] = root;
  }
  if (tc->inplace)
    argv[argc++] = "--inplace";
  if (tc->lib) {
    argv[argc++] = "--mem";
    argv[argc++] = "lib";
  }
  if (tc->offset) {
    snprintf(offset, sizeof(offset), "%d", tc->offset);
    argv[argc++] = "--offset";
    argv[argc++] = offset;
  }
  argv[argc] = NULL;
  return run_cmd(argv);
}

static struct expect expect_of(const struct perf_case *tc, bool mpi) {
  struct expect e = {.nranks = tc->nranks,
                     .root = tc->root,
                     .inplace = tc->inplace,
                     .lib = tc->lib,
                     .offset = tc->offset,
                     .mpi = mpi};
  snprintf(e.algo, sizeof(e.algo), "%s", tc->algo);
  if (!strcmp(tc->colls, "all"))
    snprintf(e.colls, sizeof(e.colls),
             "allreduce,bcast,reduce,allgather,reduce_scatter,"
             "alltoall,gather,scatter,barrier,sendrecv");
  else
    snprintf(e.colls, sizeof(e.colls), "%s", tc->colls);
  return e;
}

/* Every collective alone at 2 and 3 ranks, then roots, in-place, and every
 * collective over buffers from chorus_mem_alloc (--mem lib), out of place
 * and in place; buffers off their lines (--offset) in place and over
 * library memory. */
static struct perf_case *cases(size_t *n) {
  static struct perf_case all[2 * NCOLLS + 4];
  size_t k = 0;
  for (int r = 2; r <= 3; r++)
    for (int i = 0; i < NCOLLS; i++) {
      all[k] = (struct perf_case){.nranks = r, .root = -1};
      snprintf(all[k++].colls, sizeof(all[0].colls), "%.15s", colls[i].name);
    }
  all[k] = (struct perf_case){.nranks = 3, .root = 2};
  snprintf(all[k++].colls, sizeof(all[0].colls), "bcast,reduce,gather,scatter");
  all[k] = (struct perf_case){.nranks = 3, .root = -1, .inplace = true, .offset = 16};
  snprintf(all[k++].colls, sizeof(all[0].colls), "allreduce,bcast,allgather,reduce_scatter");
  all[k] = (struct perf_case){.nranks = 3, .root = 1, .lib = true, .offset = 40};
  snprintf(all[k++].colls, sizeof(all[0].colls), "all");
  all[k] = (struct perf_case){.nranks = 3, .root = -1, .inplace = true, .lib = true};
  snprintf(all[k++].colls, sizeof(all[0].colls), "allreduce,bcast,allgather,reduce_scatter");
  *n = k;
  return all;
}

TestSuite(perf_tools, .timeout = 60);

ParameterizedTestParameters(perf_tools, chorus_perf_check) {
  size_t n;
  struct perf_case *all = cases(&n);
  return cr_make_param_array(struct perf_case, all, n);
}

ParameterizedTest(struct perf_case *tc, perf_tools, chorus_perf_check) {
  struct output o = run_chorus(tc);
  struct expect e = expect_of(tc, false);
  cr_assert_eq(o.status, 0, "chorus-perf -c %s at %d ranks exited %d; stderr:\n%s", tc->colls,
               tc->nranks, o.status, o.err);
  check_lines(&o, &e);
  output_free(&o);
}

/* mpirun starts slowly: every collective in one run (-c all) per case. */
ParameterizedTestParameters(perf_tools, mpi_perf_check) {
  static struct perf_case all[] = {
      {.nranks = 2, .root = -1, .colls = "all"},
      {.nranks = 3, .root = -1, .colls = "all"},
      {.nranks = 3, .root = 2, .colls = "bcast,reduce,gather,scatter"},
      {.nranks = 3,
       .root = -1,
       .inplace = true,
       .colls = "allreduce,bcast,allgather,reduce_scatter"},
      {.nranks = 2, .root = -1, .lib = true, .offset = 16, .colls = "all"},
  };
  return cr_make_param_array(struct perf_case, all, sizeof(all) / sizeof(all[0]));
}

ParameterizedTest(struct perf_case *tc, perf_tools, mpi_perf_check) {
  struct output o;
  struct expect e = expect_of(tc, true);
  if (!have_mpi())
    cr_skip_test("mpi-perf or mpirun missing");
  o = run_mpi(tc);
  cr_assert_eq(o.status, 0, "mpi-perf -c %s at %d ranks exited %d; stderr:\n%s", tc->colls,
               tc->nranks, o.status, o.err);
  check_lines(&o, &e);
  output_free(&o);
}

/* --algo chain for bcast (not the model's choice for small sizes): what runs
 * and is reported at every size. */
Test(perf_tools, chorus_perf_algo_is_reported) {
  struct perf_case tc = {.nranks = 3, .root = -1};
  struct output o;
  struct expect e;
  snprintf(tc.colls, sizeof(tc.colls), "bcast");
  snprintf(tc.algo, sizeof(tc.algo), "chain");
  o = run_chorus(&tc);
  e = expect_of(&tc, false);
  cr_assert_eq(o.status, 0, "exit %d; stderr:\n%s", o.status, o.err);
  check_lines(&o, &e);
  output_free(&o);
}

/* Usage errors: exit 2 and a message, before any communicator. */
Test(perf_tools, usage_errors) {
  static const char *const chorus_bad[][6] = {
      {"-c", "nope"},
      {"-c", "alltoall", "--inplace"},
      {"-c", "all", "--algo", "tree"},
      {"-c", "sendrecv", "--algo", "ring"},
      {"-c", "bcast", "--mem", "shared"},
      {"--idle", "0"},
      {"--idle", "ten"},
      {"--offset", "4096"},
      {"--offset", "-1"},
      {"--offset", "16B"},
  };
  for (size_t i = 0; i < sizeof(chorus_bad) / sizeof(chorus_bad[0]); i++) {
    char *argv[8] = {TOOLS "chorus-perf"};
    struct output o;
    for (int k = 0; k < 6 && chorus_bad[i][k]; k++)
      argv[k + 1] = (char *)chorus_bad[i][k];
    o = run_cmd(argv);
    cr_assert_eq(o.status, 2, "chorus-perf %s %s: exit %d", argv[1], argv[2], o.status);
    cr_assert(strstr(o.err, "chorus-perf: "), "no message: %s", o.err);
    output_free(&o);
  }
  if (access(TOOLS "mpi-perf", X_OK) == 0) {
    char *argv[] = {TOOLS "mpi-perf", "-c", "bcast", "--algo", "tree", NULL};
    struct output o = run_cmd(argv);
    cr_assert_eq(o.status, 2, "mpi-perf --algo: exit %d", o.status);
    cr_assert(strstr(o.err, "not available"), "%s", o.err);
    output_free(&o);
  }
}

/* --idle: a communicator left idle past its spin windows costs next to no
 * CPU (no busy-waiting while idle); a thread that polled would use the
 * whole second. */
Test(perf_tools, idle_communicators_use_next_to_no_cpu) {
  char *argv[] = {TOOLS "chorus-run",
                  "-n",
                  "2",
                  "--no-tag",
                  "--timeout",
                  "35",
                  "--",
                  TOOLS "chorus-perf",
                  "-c",
                  "allreduce",
                  "-b",
                  "8",
                  "-e",
                  "8",
                  "-n",
                  "100",
                  "--json",
                  "--idle",
                  "2",
                  NULL};
  struct output o = run_cmd(argv);
  cr_assert_eq(o.status, 0, "exit %d; stderr:\n%s", o.status, o.err);
  const char *line = strstr(o.out, "{\"idle_s\":");
  cr_assert(line, "no idle report in:\n%s", o.out);
  double idle = 0, pct = -1;
  cr_assert_eq(sscanf(line, "{\"idle_s\":%lf,\"cpu_s\":%*f,\"cpu_pct\":%lf", &idle, &pct), 2, "%s",
               line);
  cr_assert(idle >= 2.0, "idle %.3f s", idle);
  cr_assert(pct >= 0 && pct < 10, "an idle rank used %.2f%% of a core: %s", pct, line);
  output_free(&o);
}
