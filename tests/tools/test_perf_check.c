/*
 * test_perf_check.c - the run loop and --check of chorus-perf/mpi-perf
 * (tools/perf_common.c) over a simulated backend: every rank is a thread,
 * every collective a few lines over shared pointers. A correct backend must
 * give 0 wrong for every collective, size, root and in-place form; backends
 * with planted bugs (data from the wrong rank, shifted by one index, a
 * barrier that does not wait) must be caught at every size that can show
 * them. Needs no engine and no launcher.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "perf_common.h"

#define MAX_RANKS 4

enum bug { BUG_NONE, BUG_WRONG_RANK, BUG_SHIFT, BUG_BARRIER };

struct sim {
  int n;
  enum bug bug;
  pthread_barrier_t bar;
  const double *send[MAX_RANKS]; /* each rank's call, published for the others */
  double *recv[MAX_RANKS];
  double dv[MAX_RANKS];
  int64_t iv[MAX_RANKS];
  const struct perf_options *opt;
  int rc[MAX_RANKS];
};

struct sim_rank {
  struct sim *s;
  int rank;
  struct perf_backend be;
};

static void sync_all(struct sim *s) {
  pthread_barrier_wait(&s->bar);
}

/* The rank whose data a correct backend reads as q's, after the planted bug. */
static int src(const struct sim *s, int q) {
  return s->bug == BUG_WRONG_RANK ? (q + 1) % s->n : q;
}

/* Element j of a block of c, after the planted bug. */
static size_t idx(const struct sim *s, size_t j, size_t c) {
  return s->bug == BUG_SHIFT ? (j + 1) % c : j;
}

/* With BUG_WRONG_RANK, rank 0's input is taken for the last rank's (a
 * permutation of the ranks would not change a reduction). */
static double reduce_at(const struct sim *s, enum perf_op op, size_t k) {
  double acc = s->send[0][k];
  for (int r = 1; r < s->n; r++) {
    double v = s->send[s->bug == BUG_WRONG_RANK && r == s->n - 1 ? 0 : r][k];
    if (op == PERF_PROD)
      acc *= v;
    else if (op == PERF_MIN)
      acc = v < acc ? v : acc;
    else if (op == PERF_MAX)
      acc = v > acc ? v : acc;
    else
      acc += v;
  }
  return op == PERF_AVG ? acc / s->n : acc;
}

/* Each rank computes its result into tmp from the others' inputs, then all
 * write: in place, a rank's input is its own result buffer. */
static int sim_call(void *ctx, const struct perf_call *c) {
  struct sim_rank *me = ctx;
  struct sim *s = me->s;
  int rank = me->rank, n = s->n, root = c->root;
  size_t cnt = c->count, rc_cnt = 0;
  double *tmp = NULL;

  cr_assert_eq(c->dtype->id, PERF_FLOAT64, "the simulation moves float64 only");
  if (c->coll->id == PERF_BARRIER) {
    if (s->bug != BUG_BARRIER)
      sync_all(s);
    return 0;
  }
  s->send[rank] = c->sendbuf;
  s->recv[rank] = c->recvbuf;
  sync_all(s);
  switch (c->coll->layout) {
  case PERF_LAYOUT_GATHER:
  case PERF_LAYOUT_ALL:
    rc_cnt = cnt * (size_t)n;
    break;
  default:
    rc_cnt = cnt;
    break;
  }
  tmp = calloc(rc_cnt ? rc_cnt : 1, sizeof(*tmp));
  cr_assert(tmp);
  for (size_t j = 0; j < cnt; j++) {
    size_t i = idx(s, j, cnt);
    switch (c->coll->id) {
    case PERF_ALLREDUCE:
    case PERF_REDUCE:
      tmp[j] = reduce_at(s, c->op, i);
      break;
    case PERF_REDUCE_SCATTER:
      tmp[j] = reduce_at(s, c->op, (size_t)rank * cnt + i);
      break;
    case PERF_BCAST:
      tmp[j] = s->send[src(s, root)][i];
      break;
    case PERF_SCATTER:
      tmp[j] = s->send[src(s, root)][(size_t)rank * cnt + i];
      break;
    case PERF_SENDRECV:
      tmp[j] = s->send[src(s, (rank + n - 1) % n)][i];
      break;
    case PERF_ALLGATHER:
    case PERF_GATHER:
      for (int q = 0; q < n; q++)
        tmp[(size_t)q * cnt + j] = s->send[src(s, q)][i];
      break;
    case PERF_ALLTOALL:
      for (int q = 0; q < n; q++)
        tmp[(size_t)q * cnt + j] = s->send[src(s, q)][(size_t)rank * cnt + i];
      break;
    default:
      break;
    }
  }
  sync_all(s);
  if (!((c->coll->id == PERF_REDUCE || c->coll->id == PERF_GATHER) && rank != root))
    memcpy(c->recvbuf, tmp, rc_cnt * sizeof(*tmp));
  free(tmp);
  sync_all(s);
  return 0;
}

static int sim_max_double(void *ctx, double *v) {
  struct sim_rank *me = ctx;
  struct sim *s = me->s;
  double m;
  s->dv[me->rank] = *v;
  sync_all(s);
  m = s->dv[0];
  for (int r = 1; r < s->n; r++)
    m = s->dv[r] > m ? s->dv[r] : m;
  sync_all(s);
  *v = m;
  return 0;
}

static int sim_sum_int64(void *ctx, int64_t *v) {
  struct sim_rank *me = ctx;
  struct sim *s = me->s;
  int64_t sum = 0;
  s->iv[me->rank] = *v;
  sync_all(s);
  for (int r = 0; r < s->n; r++)
    sum += s->iv[r];
  sync_all(s);
  *v = sum;
  return 0;
}

static const char *sim_strerror(void *ctx, int rc) {
  (void)ctx;
  (void)rc;
  return "simulated failure";
}

static const char *sim_algo(void *ctx) {
  (void)ctx;
  return "sim";
}

static void sim_abort(void *ctx) {
  (void)ctx;
  abort();
}

static const struct perf_tool sim_tool = {
    .name = "sim-perf",
    .algo = "sim",
    .about = "",
    .op_help = "",
    .algo_help = NULL,
    .algo_missing = "no --algo",
    .half = false,
};

/* The same with --algo, as chorus-perf has it. */
static const struct perf_tool sim_tool_algo = {
    .name = "sim-perf",
    .algo = "sim",
    .about = "",
    .op_help = "",
    .algo_help = "  --algo NAME\n",
    .algo_missing = NULL,
    .half = false,
};

static void *rank_main(void *arg) {
  struct sim_rank *me = arg;
  size_t bytes = me->s->opt->maxbytes;
  void *sendbuf = malloc(bytes), *recvbuf = malloc(bytes);
  cr_assert(sendbuf && recvbuf);
  memset(sendbuf, 0, bytes);
  memset(recvbuf, 0, bytes);
  me->s->rc[me->rank] = perf_run(&sim_tool, &me->be, me->s->opt, sendbuf, recvbuf);
  free(sendbuf);
  free(recvbuf);
  return NULL;
}

/* A parsed line of output: the fields the tests look at. */
struct out_row {
  char coll[32];
  long long bytes, count, wrong;
  bool inplace;
  char mem[8]; /* "plain" or "lib" */
};

static bool field_str(const char *line, const char *key, char *out, size_t len) {
  char pat[64];
  const char *p, *e;
  snprintf(pat, sizeof(pat), "\"%s\":\"", key);
  p = strstr(line, pat);
  if (!p)
    return false;
  p += strlen(pat);
  e = strchr(p, '"');
  if (!e || (size_t)(e - p) >= len)
    return false;
  memcpy(out, p, (size_t)(e - p));
  out[e - p] = '\0';
  return true;
}

static bool field_num(const char *line, const char *key, long long *out) {
  char pat[64];
  const char *p;
  snprintf(pat, sizeof(pat), "\"%s\":", key);
  p = strstr(line, pat);
  if (!p)
    return false;
  return sscanf(p + strlen(pat), "%lld", out) == 1;
}

/*
 * Runs perf_run on n threads with args (after "sim-perf --json"); returns
 * the exit code of rank 0 and the rows printed.
 */
static int run_sim(int n, enum bug bug, const char *args, struct out_row *rows, int maxrows,
                   int *nrows) {
  char buf[512], *argv[32], *save = NULL, line[1024];
  int argc = 0, exit_code, saved, fd;
  struct perf_options opt;
  struct sim s = {.n = n, .bug = bug, .opt = &opt};
  struct sim_rank ranks[MAX_RANKS];
  pthread_t th[MAX_RANKS];
  char path[] = "/tmp/test_perf_check.XXXXXX";
  FILE *f;

  snprintf(buf, sizeof(buf), "sim-perf --json %s", args);
  for (char *t = strtok_r(buf, " ", &save); t && argc < 31; t = strtok_r(NULL, " ", &save))
    argv[argc++] = t;
  argv[argc] = NULL;
  optind = 0;
  cr_assert(perf_parse_args(&sim_tool, argc, argv, &opt, &exit_code), "bad args: %s", args);
  pthread_barrier_init(&s.bar, NULL, (unsigned)n);

  fd = mkstemp(path);
  cr_assert(fd >= 0);
  fflush(stdout);
  saved = dup(1);
  dup2(fd, 1);
  for (int r = 0; r < n; r++) {
    ranks[r] = (struct sim_rank){.s = &s, .rank = r};
    ranks[r].be = (struct perf_backend){.version = "test",
                                        .provider = "sim",
                                        .rank = r,
                                        .nranks = n,
                                        .ctx = &ranks[r],
                                        .call = sim_call,
                                        .max_double = sim_max_double,
                                        .sum_int64 = sim_sum_int64,
                                        .strerror = sim_strerror,
                                        .last_algo = sim_algo,
                                        .abort = sim_abort};
    cr_assert_eq(pthread_create(&th[r], NULL, rank_main, &ranks[r]), 0);
  }
  for (int r = 0; r < n; r++)
    pthread_join(th[r], NULL);
  fflush(stdout);
  dup2(saved, 1);
  close(saved);
  pthread_barrier_destroy(&s.bar);

  f = fdopen(fd, "r");
  cr_assert(f);
  rewind(f);
  *nrows = 0;
  while (fgets(line, sizeof(line), f)) {
    struct out_row *o = &rows[*nrows];
    char inplace[8] = "";
    cr_assert_lt(*nrows, maxrows);
    cr_assert_eq(line[0], '{', "not a JSON line: %s", line);
    cr_assert(field_str(line, "collective", o->coll, sizeof(o->coll)), "%s", line);
    cr_assert(field_num(line, "bytes", &o->bytes) && field_num(line, "count", &o->count), "%s",
              line);
    cr_assert(field_num(line, "wrong", &o->wrong), "no wrong count: %s", line);
    cr_assert(field_str(line, "algo", inplace, sizeof(inplace)) && !strcmp(inplace, "sim"));
    o->inplace = strstr(line, "\"inplace\":true") != NULL;
    cr_assert(field_str(line, "mem", o->mem, sizeof(o->mem)), "no mem: %s", line);
    (*nrows)++;
  }
  fclose(f);
  unlink(path);
  for (int r = 1; r < n; r++)
    cr_assert_eq(s.rc[r], s.rc[0], "ranks disagree on the exit code");
  return s.rc[0];
}

/* Parameters are copied into each test's process: strings inline, no pointers. */
struct sim_case {
  int n;
  char args[64];
};

ParameterizedTestParameters(perf_check, correct_backend_zero_wrong) {
  static struct sim_case cases[] = {
      {1, "-c all"},
      {2, "-c all"},
      {3, "-c all"},
      {3, "-c all --inplace"},
      {3, "-c all --root 2"},
      {4, "-c all --root 3 --inplace -o prod"},
      {3, "-c allreduce,reduce,reduce_scatter -o min"},
      {3, "-c allreduce,reduce,reduce_scatter -o max"},
      {4, "-c allreduce,reduce,reduce_scatter -o avg"},
  };
  return cr_make_param_array(struct sim_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct sim_case *tc, perf_check, correct_backend_zero_wrong) {
  char args[256];
  struct out_row rows[128];
  int nrows;
  snprintf(args, sizeof(args), "%s -d float64 -b 8 -e 4K -f 4 -n 2 -w 1 --check", tc->args);
  cr_assert_eq(run_sim(tc->n, BUG_NONE, args, rows, 128, &nrows), 0, "%s", args);
  cr_assert_gt(nrows, 0);
  for (int i = 0; i < nrows; i++) {
    const struct perf_coll_info *c = perf_coll_find(rows[i].coll);
    cr_assert(c, "unknown collective %s", rows[i].coll);
    cr_assert_eq(rows[i].wrong, 0, "%s %lld B: %lld wrong", rows[i].coll, rows[i].bytes,
                 rows[i].wrong);
    /* sizes as nccl-tests: the whole buffer, count per block */
    if (c->layout == PERF_LAYOUT_SAME)
      cr_assert_eq(rows[i].bytes, rows[i].count * 8);
    else if (c->layout != PERF_LAYOUT_NONE)
      cr_assert_eq(rows[i].bytes, rows[i].count * 8 * tc->n);
    cr_assert_eq(rows[i].inplace, strstr(tc->args, "--inplace") && c->inplace);
  }
}

struct bug_case {
  enum bug bug;
  char coll[24];
  char args[40];
};

ParameterizedTestParameters(perf_check, planted_bugs_are_caught) {
  static struct bug_case cases[] = {
      {BUG_WRONG_RANK, "allreduce", "-o sum"},
      {BUG_WRONG_RANK, "reduce", "-o sum --root 1"},
      {BUG_WRONG_RANK, "reduce_scatter", "-o sum"},
      {BUG_WRONG_RANK, "bcast", "--root 2"},
      {BUG_WRONG_RANK, "bcast", "--inplace"},
      {BUG_WRONG_RANK, "allgather", ""},
      {BUG_WRONG_RANK, "allgather", "--inplace"},
      {BUG_WRONG_RANK, "alltoall", ""},
      {BUG_WRONG_RANK, "gather", "--root 1"},
      {BUG_WRONG_RANK, "scatter", ""},
      {BUG_WRONG_RANK, "sendrecv", ""},
      {BUG_SHIFT, "allreduce", "-o sum"},
      {BUG_SHIFT, "reduce_scatter", "-o max"},
      {BUG_SHIFT, "bcast", ""},
      {BUG_SHIFT, "allgather", ""},
      {BUG_SHIFT, "alltoall", ""},
      {BUG_SHIFT, "gather", ""},
      {BUG_SHIFT, "scatter", "--root 2"},
      {BUG_SHIFT, "sendrecv", ""},
      {BUG_BARRIER, "barrier", ""},
  };
  return cr_make_param_array(struct bug_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct bug_case *tc, perf_check, planted_bugs_are_caught) {
  char args[256];
  struct out_row rows[32];
  int nrows;
  snprintf(args, sizeof(args), "-c %s %s -d float64 -b 8 -e 4K -f 4 -n 2 -w 1 --check", tc->coll,
           tc->args);
  cr_assert_eq(run_sim(3, tc->bug, args, rows, 32, &nrows), 1, "%s: exit code", args);
  cr_assert_gt(nrows, 0);
  for (int i = 0; i < nrows; i++) {
    /* a shift by one within a block of one element changes nothing */
    if (tc->bug == BUG_SHIFT && rows[i].count < 2)
      continue;
    cr_assert_gt(rows[i].wrong, 0, "%s: %lld B: bug not caught", args, rows[i].bytes);
  }
}

Test(perf_check, ident_pattern_names_rank_and_index) {
  static const char *const types[] = {"int8", "uint8", "int32", "float32", "float64"};
  struct perf_options opt;
  int exit_code;
  for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
    char *argv[] = {"x", "-d", (char *)types[t], NULL};
    optind = 0;
    cr_assert(perf_parse_args(&sim_tool, 3, argv, &opt, &exit_code));
    /* ranks 0..7 differ at every index, and index k differs from k+1 */
    for (size_t k = 0; k < 300; k++)
      for (int r = 0; r < 8; r++) {
        double v = perf_ident_value(opt.dtype, r, k);
        cr_assert(v >= 0 && v <= opt.dtype->exact_max);
        cr_assert_neq(v, perf_ident_value(opt.dtype, r, k + 1));
        for (int q = r + 1; q < 8; q++)
          cr_assert_neq(v, perf_ident_value(opt.dtype, q, k), "%s r %d q %d k %zu", types[t], r, q,
                        k);
      }
  }
}

Test(perf_check, algo_option) {
  static const char *const bad[] = {"-c all --algo tree", "-c bcast,reduce --algo tree",
                                    "-c sendrecv --algo ring"};
  static const char *const good[] = {"-c bcast --algo tree", "-c all --algo bcast=tree",
                                     "-c bcast,reduce --algo bcast=tree;reduce=ring"};
  for (int ok = 0; ok < 2; ok++)
    for (size_t i = 0; i < 3; i++) {
      char buf[128], *argv[16], *save = NULL;
      int argc = 0, exit_code = -1;
      struct perf_options opt;
      snprintf(buf, sizeof(buf), "x %s", ok ? good[i] : bad[i]);
      for (char *t = strtok_r(buf, " ", &save); t; t = strtok_r(NULL, " ", &save))
        argv[argc++] = t;
      argv[argc] = NULL;
      optind = 0;
      cr_assert_eq(perf_parse_args(&sim_tool_algo, argc, argv, &opt, &exit_code), ok, "%s",
                   ok ? good[i] : bad[i]);
      if (ok)
        cr_assert_not_null(opt.algo);
      else
        cr_assert_eq(exit_code, PERF_EXIT_USAGE);
    }
}

/* --mem: plain by default, lib when asked; every JSON line says which. */
Test(perf_check, mem_option) {
  static const char *const args[] = {"-c allreduce,bcast", "-c allreduce,bcast --mem lib",
                                     "-c allreduce,bcast --mem lib --mem plain"};
  static const char *const want[] = {"plain", "lib", "plain"};
  for (size_t i = 0; i < 3; i++) {
    char buf[96];
    struct out_row rows[32];
    int nrows;
    snprintf(buf, sizeof(buf), "%s -d float64 -b 8 -e 64 -f 8 -n 1 -w 0 --check", args[i]);
    cr_assert_eq(run_sim(2, BUG_NONE, buf, rows, 32, &nrows), 0, "%s", buf);
    cr_assert_eq(nrows, 4, "%s: %d lines", buf, nrows);
    for (int k = 0; k < nrows; k++)
      cr_assert_str_eq(rows[k].mem, want[i], "%s", buf);
  }
}

Test(perf_check, usage_errors) {
  static const char *const bad[] = {
      "-c nope",
      "-c alltoall --inplace",
      "-c all --algo tree",
      "-c allreduce --algo ring",
      "--root -1",
      "-c ,",
      "--mem nope",
      "--mem",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    char buf[128], *argv[16], *save = NULL;
    int argc = 0, exit_code = -1;
    struct perf_options opt;
    snprintf(buf, sizeof(buf), "x %s", bad[i]);
    for (char *t = strtok_r(buf, " ", &save); t; t = strtok_r(NULL, " ", &save))
      argv[argc++] = t;
    argv[argc] = NULL;
    optind = 0;
    cr_assert_not(perf_parse_args(&sim_tool, argc, argv, &opt, &exit_code), "%s", bad[i]);
    cr_assert_eq(exit_code, PERF_EXIT_USAGE, "%s", bad[i]);
  }
}
