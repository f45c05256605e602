/*
 * mpi-perf - the chorus-perf benchmark over MPI_Allreduce, for comparisons.
 *
 *   mpirun -np 4 mpi-perf -b 8 -e 64M -f 4 -d float32 -o sum --check
 *
 * Same options, defaults, check patterns and output (table or --json, with
 * "provider":"openmpi") as tools/chorus-perf.c, so that results compare line
 * by line; keep the two in step. Only allreduce; float16/bfloat16 are not
 * offered. MPI has no avg: it is MPI_SUM followed by a local division by the
 * number of ranks (truncating for integer types), inside the timed call.
 *
 * Per size: warmup calls, a synchronising call, timed calls. The time of a
 * size is the mean per call of the slowest rank (MAX over ranks). Bandwidths
 * use the definitions of nccl-tests, in GB/s of 1e9 bytes:
 *   algbw = bytes / time,  busbw = algbw * 2(n-1)/n
 * "#wrong" is the SUM over ranks of the elements that differ from the exact
 * result.
 */
#include <mpi.h>

#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define PERF_NAME "mpi-perf"
/* Open MPI picks its algorithm itself (coll/tuned decision rules). */
#define PERF_ALGO "default"
#define PERF_PROVIDER "openmpi"
#define EXIT_USAGE 2
#define MiB ((size_t)1 << 20)

/* ---- collectives and their bus factors ---- */

static double factor_allreduce(int n) {
  return n > 1 ? 2.0 * (n - 1) / n : 0.0;
}
static double factor_one(int n) {
  return 1.0;
}
static double factor_nm1_n(int n) {
  return n > 1 ? (double)(n - 1) / n : 0.0;
}

struct coll_info {
  const char *name;
  const char *alias;           /* another accepted spelling, or NULL */
  double (*bus_factor)(int n); /* busbw = algbw * bus_factor(nranks) */
  bool available;              /* false until the engine offers the collective */
};

static const struct coll_info colls[] = {
    {"allreduce", NULL, factor_allreduce, true},
    {"broadcast", "bcast", factor_one, false},
    {"reduce", NULL, factor_one, false},
    {"allgather", NULL, factor_nm1_n, false},
    {"reduce_scatter", "reducescatter", factor_nm1_n, false},
    {"alltoall", NULL, factor_nm1_n, false},
};

/* ---- data types ---- */

enum perf_dtype { DT_INT8, DT_UINT8, DT_INT32, DT_INT64, DT_FLOAT32, DT_FLOAT64 };

enum perf_op { OP_SUM, OP_PROD, OP_MIN, OP_MAX, OP_AVG };

struct dtype_info {
  const char *name;
  const char *alias; /* another accepted spelling, or NULL */
  enum perf_dtype id;
  MPI_Datatype mpi;
  size_t size;
  bool is_float;
  double exact_max; /* largest integer the type holds exactly */
  int prod_twos;    /* most factors of 2 a product may hold (in range, exact in a double) */
  double eps;       /* machine epsilon (floats), for the tolerance of avg */
};

static const struct dtype_info dtypes[] = {
    {"int8", "char", DT_INT8, MPI_INT8_T, 1, false, 127.0, 6, 0.0},
    {"uint8", NULL, DT_UINT8, MPI_UINT8_T, 1, false, 255.0, 7, 0.0},
    {"int32", "int", DT_INT32, MPI_INT32_T, 4, false, 2147483647.0, 30, 0.0},
    {"int64", NULL, DT_INT64, MPI_INT64_T, 8, false, 9007199254740992.0, 52, 0.0},
    {"float32", "float", DT_FLOAT32, MPI_FLOAT, 4, true, 16777216.0, 127, 0x1p-23},
    {"float64", "double", DT_FLOAT64, MPI_DOUBLE, 8, true, 9007199254740992.0, 1023, 0x1p-52},
};

struct op_info {
  const char *name;
  enum perf_op id;
  MPI_Op mpi; /* MPI_SUM for avg, divided afterwards */
};

static const struct op_info ops[] = {
    {"sum", OP_SUM, MPI_SUM}, {"prod", OP_PROD, MPI_PROD}, {"min", OP_MIN, MPI_MIN},
    {"max", OP_MAX, MPI_MAX}, {"avg", OP_AVG, MPI_SUM},
};

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static void store_elem(const struct dtype_info *dt, void *buf, size_t i, double v) {
  switch (dt->id) {
  case DT_INT8:
    ((int8_t *)buf)[i] = (int8_t)v;
    break;
  case DT_UINT8:
    ((uint8_t *)buf)[i] = (uint8_t)v;
    break;
  case DT_INT32:
    ((int32_t *)buf)[i] = (int32_t)v;
    break;
  case DT_INT64:
    ((int64_t *)buf)[i] = (int64_t)v;
    break;
  case DT_FLOAT32:
    ((float *)buf)[i] = (float)v;
    break;
  default:
    ((double *)buf)[i] = v;
    break;
  }
}

static double load_elem(const struct dtype_info *dt, const void *buf, size_t i) {
  switch (dt->id) {
  case DT_INT8:
    return ((const int8_t *)buf)[i];
  case DT_UINT8:
    return ((const uint8_t *)buf)[i];
  case DT_INT32:
    return ((const int32_t *)buf)[i];
  case DT_INT64:
    return (double)((const int64_t *)buf)[i];
  case DT_FLOAT32:
    return ((const float *)buf)[i];
  default:
    return ((const double *)buf)[i];
  }
}

/*
 * ---- check patterns ----
 * Rank r's element i is a small non-negative integer chosen per op so that the
 * exact result fits the type exactly, for any number of ranks n:
 *   sum, avg  (r + i) % (v+1), v = min(6, exact_max / n): the sum is <= exact_max;
 *             when n > exact_max (v = 0), one-hot: 1 where (r + i) % n == 0.
 *   prod      2 where (r + i) % p == 0, else 1, p = max(2, ceil(n / prod_twos)):
 *             at most prod_twos factors of 2 per element.
 *   min, max  (7r + 3i) % 13.
 * Each pattern repeats in i with a short period, so the expected result is
 * computed once per period. avg expects sum / n, truncated for integer types;
 * for float types it tolerates 2 ulps, since sum * (1/n) and sum / n may differ.
 */
struct pattern {
  enum perf_op op;
  int nranks;
  size_t period; /* the pattern repeats every `period` elements */
  int vmax;      /* sum/avg: largest value, 0 for one-hot */
  int p;         /* prod: period of the factors of 2 */
};

static struct pattern pattern_make(const struct dtype_info *dt, enum perf_op op, int nranks) {
  struct pattern pt = {.op = op, .nranks = nranks};
  double v;
  switch (op) {
  case OP_PROD:
    pt.p = (nranks + dt->prod_twos - 1) / dt->prod_twos;
    if (pt.p < 2)
      pt.p = 2;
    pt.period = (size_t)pt.p;
    break;
  case OP_MIN:
  case OP_MAX:
    pt.period = 13;
    break;
  default: /* sum, avg */
    v = floor(dt->exact_max / nranks);
    pt.vmax = v > 6.0 ? 6 : (int)v;
    pt.period = pt.vmax > 0 ? (size_t)pt.vmax + 1 : (size_t)nranks;
    break;
  }
  return pt;
}

static double pattern_value(const struct pattern *pt, int rank, size_t i) {
  size_t r = (size_t)rank;
  switch (pt->op) {
  case OP_PROD:
    return (r + i) % (size_t)pt->p == 0 ? 2.0 : 1.0;
  case OP_MIN:
  case OP_MAX:
    return (double)((7 * r + 3 * i) % 13);
  default:
    if (pt->vmax > 0)
      return (double)((r + i) % ((size_t)pt->vmax + 1));
    return (r + i) % (size_t)pt->nranks == 0 ? 1.0 : 0.0;
  }
}

/* expect[j] = the exact result at every element i with i % period == j. */
static void pattern_expect(const struct pattern *pt, const struct dtype_info *dt, double *expect) {
  for (size_t j = 0; j < pt->period; j++) {
    double acc = pattern_value(pt, 0, j);
    for (int r = 1; r < pt->nranks; r++) {
      double v = pattern_value(pt, r, j);
      if (pt->op == OP_PROD)
        acc *= v;
      else if (pt->op == OP_MIN)
        acc = v < acc ? v : acc;
      else if (pt->op == OP_MAX)
        acc = v > acc ? v : acc;
      else
        acc += v;
    }
    if (pt->op == OP_AVG)
      acc = dt->is_float ? acc / pt->nranks : floor(acc / pt->nranks);
    expect[j] = acc;
  }
}

static void pattern_fill(const struct pattern *pt, const struct dtype_info *dt, int rank, void *buf,
                         size_t count) {
  for (size_t i = 0; i < count; i++)
    store_elem(dt, buf, i, pattern_value(pt, rank, i % pt->period));
}

static uint64_t pattern_count_wrong(const struct pattern *pt, const struct dtype_info *dt,
                                    const double *expect, const void *buf, size_t count) {
  bool approx = pt->op == OP_AVG && dt->is_float;
  uint64_t wrong = 0;
  for (size_t i = 0; i < count; i++) {
    double got = load_elem(dt, buf, i), want = expect[i % pt->period];
    if (approx ? !(fabs(got - want) <= 2.0 * dt->eps * fabs(want)) : got != want)
      wrong++;
  }
  return wrong;
}

/* ---- options ---- */

struct options {
  const struct coll_info *coll;
  const struct dtype_info *dtype;
  const struct op_info *op;
  size_t minbytes, maxbytes, factor;
  int iters;  /* 0: default per size */
  int warmup; /* -1: default per size */
  bool check, json, inplace;
};

/*
 * Defaults: 100 timed calls per size up to 1 MiB (small calls are short, and
 * a mean over few of them is at the mercy of one scheduling hiccup), 20 up to
 * 64 MiB, then fewer so that each size moves about 20 x 64 MiB (never fewer
 * than 5). 5 warmup calls, 2 past 64 MiB.
 */
static int default_iters(size_t bytes) {
  size_t n;
  if (bytes <= 1 * MiB)
    return 100;
  if (bytes <= 64 * MiB)
    return 20;
  n = 20 * (64 * MiB) / bytes;
  return n < 5 ? 5 : (int)n;
}

static int default_warmup(size_t bytes) {
  return bytes <= 64 * MiB ? 5 : 2;
}

/*
 * Before the communicator exists only the launcher's environment says which
 * rank this is; usage messages are printed by rank 0 (or a lone process) only.
 */
static bool env_says_not_rank0(void) {
  static const char *const vars[] = {"CHORUS_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                     "SLURM_PROCID"};
  for (size_t i = 0; i < ARRAY_LEN(vars); i++) {
    const char *v = getenv(vars[i]);
    if (v && *v)
      return strtol(v, NULL, 10) != 0;
  }
  return false;
}

static void usage(FILE *f) {
  fprintf(f, "usage: " PERF_NAME " [options]\n"
             "Benchmark MPI_Allreduce over every rank of MPI_COMM_WORLD (launch with\n"
             "mpirun); rank 0 prints the results. The chorus-perf benchmark, over MPI.\n"
             "\n"
             "  -c, --collective NAME  allreduce (default; the only one)\n"
             "  -b, --minbytes SIZE    smallest message in bytes, K/M/G suffixes (default 8)\n"
             "  -e, --maxbytes SIZE    largest message in bytes (default 64M)\n"
             "  -f, --stepfactor N     multiply the size by N each step (default 4)\n"
             "  -d, --datatype TYPE    int8 uint8 int32 int64 float32 float64\n"
             "                         (default float32)\n"
             "  -o, --op OP            sum prod min max avg (default sum); avg is MPI_SUM then\n"
             "                         a local division, timed with the call\n"
             "  -n, --iters N          timed calls per size (default 100 up to 1M, 20 up to\n"
             "                         64M, then 20*64M/size, at least 5)\n"
             "  -w, --warmup N         untimed calls per size first (default 5; 2 past 64M)\n"
             "      --check            verify one call per size on a known pattern; count the\n"
             "                         wrong elements (sum over ranks); exit 1 if any\n"
             "      --json             one JSON object per size instead of the table\n"
             "      --inplace          sendbuf == recvbuf\n"
             "      --outplace         separate buffers (default)\n"
             "  -h, --help             this help\n"
             "\n"
             "Sizes smaller than one element are skipped; a size that is not a multiple of\n"
             "the element size is rounded down to whole elements.\n"
             "time: mean per call of the slowest rank; algbw = bytes/time;\n"
             "busbw = algbw * 2(n-1)/n for allreduce (nccl-tests definitions); GB = 1e9 B.\n"
             "Exit status: 0 ok, 1 error or wrong results, 2 bad arguments.\n");
}

static bool usage_error(const char *fmt, const char *arg) {
  if (!env_says_not_rank0()) {
    fprintf(stderr, PERF_NAME ": ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nTry '" PERF_NAME " --help'.\n");
  }
  return false;
}

/* "8", "64K", "4M", "1G", "32KiB", "2MB", "100B": binary multiples. */
static bool parse_size(const char *s, size_t *out) {
  char *end;
  unsigned long long v, mult = 1;
  if (*s < '0' || *s > '9')
    return false;
  v = strtoull(s, &end, 10);
  switch (*end) {
  case 'k':
  case 'K':
    mult = 1ull << 10;
    break;
  case 'm':
  case 'M':
    mult = 1ull << 20;
    break;
  case 'g':
  case 'G':
    mult = 1ull << 30;
    break;
  default:
    break;
  }
  if (mult > 1)
    end++;
  if (mult > 1 && !strcasecmp(end, "ib"))
    end += 2;
  else if (!strcasecmp(end, "b"))
    end++;
  if (*end || v > SIZE_MAX / mult)
    return false;
  *out = (size_t)(v * mult);
  return true;
}

static bool parse_int(const char *s, int min, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (end == s || *end || v < min || v > 1000000000L)
    return false;
  *out = (int)v;
  return true;
}

/* Returns true to run, false on a usage error; *exit_code says how to leave. */
static bool parse_args(int argc, char **argv, struct options *opt, int *exit_code) {
  static const struct option longopts[] = {{"collective", required_argument, NULL, 'c'},
                                           {"minbytes", required_argument, NULL, 'b'},
                                           {"maxbytes", required_argument, NULL, 'e'},
                                           {"stepfactor", required_argument, NULL, 'f'},
                                           {"datatype", required_argument, NULL, 'd'},
                                           {"op", required_argument, NULL, 'o'},
                                           {"iters", required_argument, NULL, 'n'},
                                           {"warmup", required_argument, NULL, 'w'},
                                           {"check", no_argument, NULL, 'C'},
                                           {"json", no_argument, NULL, 'J'},
                                           {"inplace", no_argument, NULL, 'I'},
                                           {"outplace", no_argument, NULL, 'O'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  const char *coll = "allreduce", *dtype = "float32", *op = "sum";
  int c, factor = 4;

  *opt = (struct options){.minbytes = 8, .maxbytes = 64 * MiB, .warmup = -1};
  *exit_code = EXIT_USAGE;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":c:b:e:f:d:o:n:w:h", longopts, NULL)) != -1) {
    switch (c) {
    case 'c':
      coll = optarg;
      break;
    case 'b':
      if (!parse_size(optarg, &opt->minbytes) || opt->minbytes == 0)
        return usage_error("bad size for -b: '%s'", optarg);
      break;
    case 'e':
      if (!parse_size(optarg, &opt->maxbytes) || opt->maxbytes == 0)
        return usage_error("bad size for -e: '%s'", optarg);
      break;
    case 'f':
      if (!parse_int(optarg, 1, &factor))
        return usage_error("bad step factor for -f: '%s' (an integer >= 2)", optarg);
      break;
    case 'd':
      dtype = optarg;
      break;
    case 'o':
      op = optarg;
      break;
    case 'n':
      if (!parse_int(optarg, 1, &opt->iters))
        return usage_error("bad iteration count for -n: '%s' (an integer >= 1)", optarg);
      break;
    case 'w':
      if (!parse_int(optarg, 0, &opt->warmup))
        return usage_error("bad warmup count for -w: '%s' (an integer >= 0)", optarg);
      break;
    case 'C':
      opt->check = true;
      break;
    case 'J':
      opt->json = true;
      break;
    case 'I':
      opt->inplace = true;
      break;
    case 'O':
      opt->inplace = false;
      break;
    case 'h':
      if (!env_says_not_rank0())
        usage(stdout);
      *exit_code = 0;
      return false;
    case ':':
      return usage_error("option '%s' needs an argument", argv[optind - 1]);
    default:
      if (optopt) {
        char name[3] = {'-', (char)optopt, '\0'};
        return usage_error("unknown option '%s'", name);
      }
      return usage_error("unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc)
    return usage_error("unexpected argument '%s'", argv[optind]);

  for (size_t i = 0; i < ARRAY_LEN(colls) && !opt->coll; i++)
    if (!strcmp(coll, colls[i].name) || (colls[i].alias && !strcmp(coll, colls[i].alias)))
      opt->coll = &colls[i];
  if (!opt->coll)
    return usage_error("unknown collective '%s'", coll);
  if (!opt->coll->available)
    return usage_error("collective '%s' is not available in " PERF_NAME " (only allreduce is)",
                       opt->coll->name);
  for (size_t i = 0; i < ARRAY_LEN(dtypes) && !opt->dtype; i++)
    if (!strcmp(dtype, dtypes[i].name) || (dtypes[i].alias && !strcmp(dtype, dtypes[i].alias)))
      opt->dtype = &dtypes[i];
  if (!opt->dtype)
    return usage_error("unknown datatype '%s'", dtype);
  for (size_t i = 0; i < ARRAY_LEN(ops) && !opt->op; i++)
    if (!strcmp(op, ops[i].name))
      opt->op = &ops[i];
  if (!opt->op)
    return usage_error("unknown op '%s'", op);
  if (opt->minbytes > opt->maxbytes)
    return usage_error("-b is larger than -e%s", "");
  if (factor < 2 && opt->minbytes != opt->maxbytes)
    return usage_error("-f must be >= 2 unless -b equals -e%s", "");
  if (opt->maxbytes / opt->dtype->size == 0)
    return usage_error("no size up to -e holds one element of %s", opt->dtype->name);
  opt->factor = (size_t)factor;
  return true;
}

/* ---- output ---- */

static void json_string(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      printf("\\%c", ch);
    else if (ch < 0x20)
      printf("\\u%04x", ch);
    else
      putchar(ch);
  }
  putchar('"');
}

struct row {
  size_t bytes, count;
  double time_us, algbw, busbw;
  int64_t wrong; /* -1: not checked */
};

/* "Open MPI v4.1.4": the library's version string up to its first comma. */
static const char *mpi_version(void) {
  static char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  if (MPI_Get_library_version(v, &len) != MPI_SUCCESS)
    return "MPI";
  v[strcspn(v, ",\n")] = '\0';
  return v;
}

static void print_header(const struct options *opt, int nranks, const char *provider) {
  printf("# " PERF_NAME " (%s): %s %s %s, %s, %d ranks, provider %s, algo %s\n", mpi_version(),
         opt->coll->name, opt->dtype->name, opt->op->name,
         opt->inplace ? "in-place" : "out-of-place", nranks, provider, PERF_ALGO);
  printf("# sizes %zu..%zu B x%zu, warmup ", opt->minbytes, opt->maxbytes, opt->factor);
  if (opt->warmup >= 0)
    printf("%d", opt->warmup);
  else
    printf("5 (2 past 64M)");
  if (opt->iters > 0)
    printf(", iters %d", opt->iters);
  else
    printf(", iters 100 (20 past 1M, 20*64M/size past 64M, >= 5)");
  printf(", check %s\n#\n", opt->check ? "on" : "off");
  printf("# %10s  %12s  %8s  %6s  %10s  %8s  %8s  %7s\n", "size", "count", "type", "redop", "time",
         "algbw", "busbw", "#wrong");
  printf("# %10s  %12s  %8s  %6s  %10s  %8s  %8s  %7s\n", "(B)", "(elements)", "", "", "(us)",
         "(GB/s)", "(GB/s)", "");
}

static void print_row(const struct options *opt, int nranks, const char *provider,
                      const struct row *r) {
  if (opt->json) {
    printf("{\"collective\":\"%s\",\"bytes\":%zu,\"count\":%zu,\"dtype\":\"%s\",\"op\":\"%s\","
           "\"nranks\":%d,\"provider\":",
           opt->coll->name, r->bytes, r->count, opt->dtype->name, opt->op->name, nranks);
    json_string(provider);
    printf(",\"algo\":\"%s\",\"time_us\":%.3f,\"algbw_gbs\":%.6f,\"busbw_gbs\":%.6f,\"wrong\":",
           PERF_ALGO, r->time_us, r->algbw, r->busbw);
    if (r->wrong >= 0)
      printf("%" PRId64, r->wrong);
    else
      printf("null");
    printf(",\"inplace\":%s}\n", opt->inplace ? "true" : "false");
  } else {
    char wrong[24];
    if (r->wrong >= 0)
      snprintf(wrong, sizeof(wrong), "%" PRId64, r->wrong);
    else
      snprintf(wrong, sizeof(wrong), "N/A");
    printf("  %10zu  %12zu  %8s  %6s  %10.2f  %8.2f  %8.2f  %7s\n", r->bytes, r->count,
           opt->dtype->name, opt->op->name, r->time_us, r->algbw, r->busbw, wrong);
  }
  fflush(stdout);
}

/* ---- the run ---- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die_mpi(int rank, const char *what, size_t bytes, int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
    snprintf(msg, sizeof(msg), "MPI error %d", rc);
  fprintf(stderr, PERF_NAME ": rank %d: %s (%zu bytes) failed: %s\n", rank, what, bytes, msg);
  MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

/* avg: the sum divided by the number of ranks, as Chorus defines it. */
static void avg_divide(const struct dtype_info *dt, void *buf, size_t count, int nranks) {
  switch (dt->id) {
  case DT_INT8:
    for (size_t i = 0; i < count; i++)
      ((int8_t *)buf)[i] = (int8_t)(((int8_t *)buf)[i] / nranks);
    break;
  case DT_UINT8:
    for (size_t i = 0; i < count; i++)
      ((uint8_t *)buf)[i] = (uint8_t)(((uint8_t *)buf)[i] / nranks);
    break;
  case DT_INT32:
    for (size_t i = 0; i < count; i++)
      ((int32_t *)buf)[i] /= nranks;
    break;
  case DT_INT64:
    for (size_t i = 0; i < count; i++)
      ((int64_t *)buf)[i] /= nranks;
    break;
  case DT_FLOAT32:
    for (size_t i = 0; i < count; i++)
      ((float *)buf)[i] /= (float)nranks;
    break;
  default:
    for (size_t i = 0; i < count; i++)
      ((double *)buf)[i] /= (double)nranks;
    break;
  }
}

static int allreduce(const struct options *opt, void *sendbuf, void *recvbuf, size_t count,
                     int nranks) {
  int rc = MPI_Allreduce(sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf, recvbuf, (int)count,
                         opt->dtype->mpi, opt->op->mpi, MPI_COMM_WORLD);
  if (rc == MPI_SUCCESS && opt->op->id == OP_AVG)
    avg_divide(opt->dtype, recvbuf, count, nranks);
  return rc;
}

/* Rank 0 alone prints; the others just take part in the reductions. */
static int run(const struct options *opt, int rank, int nranks, unsigned char *sendbuf,
               unsigned char *recvbuf, double *expect) {
  const struct dtype_info *dt = opt->dtype;
  const char *provider = PERF_PROVIDER;
  struct pattern pt = pattern_make(dt, opt->op->id, nranks);
  void *rb = opt->inplace ? (void *)sendbuf : (void *)recvbuf; /* the result */
  double busbw_sum = 0.0;
  int64_t wrong_total = 0;
  int rows = 0, rc;

  pattern_expect(&pt, dt, expect);
  if (rank == 0 && !opt->json)
    print_header(opt, nranks, provider);

  /* Start-up warmup, untimed (skipped with -w 0): one call at the largest size
   * touches every buffer and transport path, then a burst of small calls lets
   * freshly started ranks settle before the first size is timed; without it
   * the first size often absorbs milliseconds of start-up noise. */
  if (opt->warmup != 0) {
    size_t maxcount = opt->maxbytes / dt->size;
    size_t mincount = opt->minbytes / dt->size ? opt->minbytes / dt->size : 1;
    pattern_fill(&pt, dt, rank, sendbuf, maxcount);
    rc = allreduce(opt, sendbuf, rb, maxcount, nranks);
    if (rc)
      die_mpi(rank, "start-up warmup allreduce", maxcount * dt->size, rc);
    for (int i = 0; i < 20; i++) {
      rc = allreduce(opt, sendbuf, rb, mincount, nranks);
      if (rc)
        die_mpi(rank, "start-up warmup allreduce", mincount * dt->size, rc);
    }
  }

  for (size_t bytes = opt->minbytes; bytes <= opt->maxbytes;) {
    size_t count = bytes / dt->size;
    if (count > 0) {
      struct row r = {.bytes = count * dt->size, .count = count, .wrong = -1};
      int iters = opt->iters > 0 ? opt->iters : default_iters(r.bytes);
      int warmup = opt->warmup >= 0 ? opt->warmup : default_warmup(r.bytes);
      double t0, local, slowest, one = 1.0, sync;

      pattern_fill(&pt, dt, rank, sendbuf, count);
      for (int i = 0; i < warmup; i++) {
        rc = allreduce(opt, sendbuf, rb, count, nranks);
        if (rc)
          die_mpi(rank, "warmup allreduce", r.bytes, rc);
      }
      /* start the clocks together, the same way chorus-perf does */
      rc = MPI_Allreduce(&one, &sync, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (rc)
        die_mpi(rank, "synchronising allreduce", sizeof(one), rc);
      t0 = now_s();
      for (int i = 0; i < iters; i++) {
        rc = allreduce(opt, sendbuf, rb, count, nranks);
        if (rc)
          die_mpi(rank, "timed allreduce", r.bytes, rc);
      }
      local = (now_s() - t0) / iters;
      rc = MPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (rc)
        die_mpi(rank, "allreduce of the timings", sizeof(local), rc);

      if (opt->check) {
        int64_t wrong, wrong_sum;
        pattern_fill(&pt, dt, rank, sendbuf, count);
        if (!opt->inplace)
          memset(recvbuf, 0xff, r.bytes);
        rc = allreduce(opt, sendbuf, rb, count, nranks);
        if (rc)
          die_mpi(rank, "checked allreduce", r.bytes, rc);
        wrong = (int64_t)pattern_count_wrong(&pt, dt, expect, rb, count);
        rc = MPI_Allreduce(&wrong, &wrong_sum, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        if (rc)
          die_mpi(rank, "allreduce of the wrong counts", sizeof(wrong), rc);
        r.wrong = wrong_sum;
        wrong_total += wrong_sum;
      }

      r.time_us = slowest * 1e6;
      r.algbw = slowest > 0.0 ? (double)r.bytes / slowest / 1e9 : 0.0;
      r.busbw = r.algbw * opt->coll->bus_factor(nranks);
      busbw_sum += r.busbw;
      rows++;
      if (rank == 0)
        print_row(opt, nranks, provider, &r);
    }
    if (bytes > opt->maxbytes / opt->factor || opt->factor < 2)
      break;
    bytes *= opt->factor;
  }

  if (rank == 0 && !opt->json) {
    printf("# Avg bus bandwidth    : %.4f GB/s\n", rows ? busbw_sum / rows : 0.0);
    if (opt->check)
      printf("# Wrong elements       : %" PRId64 " %s\n", wrong_total,
             wrong_total ? "FAILED" : "OK");
    fflush(stdout);
  }
  return wrong_total ? 1 : 0;
}

int main(int argc, char **argv) {
  struct options opt;
  unsigned char *sendbuf = NULL, *recvbuf = NULL;
  double *expect = NULL;
  size_t maxcount, bufbytes;
  int exit_code, rank, nranks, rc;

  if (!parse_args(argc, argv, &opt, &exit_code))
    return exit_code;
  maxcount = opt.maxbytes / opt.dtype->size;
  if (maxcount > INT_MAX) {
    if (!env_says_not_rank0())
      fprintf(stderr, PERF_NAME ": -e is too large: MPI counts are int (at most %d elements)\n",
              INT_MAX);
    return EXIT_USAGE;
  }
  bufbytes = maxcount * opt.dtype->size;
  if (posix_memalign((void **)&sendbuf, 4096, bufbytes) ||
      (!opt.inplace && posix_memalign((void **)&recvbuf, 4096, bufbytes))) {
    fprintf(stderr, PERF_NAME ": cannot allocate %s%zu bytes of buffers\n",
            opt.inplace ? "" : "2 x ", bufbytes);
    free(sendbuf);
    return 1;
  }
  memset(sendbuf, 0, bufbytes);
  if (recvbuf)
    memset(recvbuf, 0, bufbytes);

  rc = MPI_Init(&argc, &argv);
  if (rc != MPI_SUCCESS) {
    fprintf(stderr, PERF_NAME ": MPI_Init failed (%d)\n", rc);
    exit_code = 1;
    goto out_free_bufs;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  expect = calloc((size_t)nranks > 13 ? (size_t)nranks : 13, sizeof(*expect));
  if (!expect) {
    fprintf(stderr, PERF_NAME ": rank %d: out of memory\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

  exit_code = run(&opt, rank, nranks, sendbuf, recvbuf, expect);

  MPI_Finalize();
out_free_bufs:
  free(expect);
  free(recvbuf);
  free(sendbuf);
  return exit_code;
}
