/*
 * perf_common - options, sizes, check patterns and output shared by
 * chorus-perf and mpi-perf; see perf_common.h.
 */
#include "perf_common.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define MiB PERF_MiB

/* ---- collectives and their bus factors ---- */

static double factor_allreduce(int n) {
  return n > 1 ? 2.0 * (n - 1) / n : 0.0;
}
static double factor_one(int n) {
  (void)n;
  return 1.0;
}
static double factor_nm1_n(int n) {
  return n > 1 ? (double)(n - 1) / n : 0.0;
}

/*
 * nccl-tests' bus factors (src/<coll>.cu there): allreduce 2(n-1)/n;
 * allgather, reduce_scatter, alltoall, gather, scatter (n-1)/n; bcast,
 * reduce, sendrecv 1. Barrier moves no data: time only.
 */
static const struct perf_coll_info colls[] = {
    {"allreduce", NULL, PERF_ALLREDUCE, PERF_LAYOUT_SAME, factor_allreduce, true, false, true},
    {"bcast", "broadcast", PERF_BCAST, PERF_LAYOUT_SAME, factor_one, false, true, true},
    {"reduce", NULL, PERF_REDUCE, PERF_LAYOUT_SAME, factor_one, true, true, false},
    {"allgather", NULL, PERF_ALLGATHER, PERF_LAYOUT_GATHER, factor_nm1_n, false, false, true},
    {"reduce_scatter", "reducescatter", PERF_REDUCE_SCATTER, PERF_LAYOUT_SCATTER, factor_nm1_n,
     true, false, true},
    {"alltoall", NULL, PERF_ALLTOALL, PERF_LAYOUT_ALL, factor_nm1_n, false, false, false},
    {"gather", NULL, PERF_GATHER, PERF_LAYOUT_GATHER, factor_nm1_n, false, true, false},
    {"scatter", NULL, PERF_SCATTER, PERF_LAYOUT_SCATTER, factor_nm1_n, false, true, false},
    {"barrier", NULL, PERF_BARRIER, PERF_LAYOUT_NONE, factor_one, false, false, false},
    {"sendrecv", NULL, PERF_SENDRECV, PERF_LAYOUT_SAME, factor_one, false, false, false},
};

/* ---- data types and ops ---- */

static const struct perf_dtype_info dtypes[] = {
    {"int8", "char", PERF_INT8, 1, false, 127.0, 6, 0.0, false, 127},
    {"uint8", NULL, PERF_UINT8, 1, false, 255.0, 7, 0.0, false, 251},
    {"int32", "int", PERF_INT32, 4, false, 2147483647.0, 30, 0.0, false, 16777213},
    {"int64", NULL, PERF_INT64, 8, false, 9007199254740992.0, 52, 0.0, false, 16777213},
    {"float16", "half", PERF_FLOAT16, 2, true, 2048.0, 15, 0x1p-10, true, 2039},
    {"bfloat16", "bf16", PERF_BFLOAT16, 2, true, 256.0, 127, 0x1p-7, true, 251},
    {"float32", "float", PERF_FLOAT32, 4, true, 16777216.0, 127, 0x1p-23, false, 16777213},
    {"float64", "double", PERF_FLOAT64, 8, true, 9007199254740992.0, 1023, 0x1p-52, false,
     16777213},
};

static const struct perf_op_info ops[] = {
    {"sum", PERF_SUM}, {"prod", PERF_PROD}, {"min", PERF_MIN}, {"max", PERF_MAX}, {"avg", PERF_AVG},
};

/* float16 and bfloat16 from and to float, rounding to nearest even. */
static uint16_t f32_to_f16(float f) {
  uint32_t x, absx, sign, h, rem;
  memcpy(&x, &f, sizeof(x));
  sign = (x >> 16) & 0x8000u;
  absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) /* inf, nan */
    return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  if (absx >= 0x477ff000u) /* >= 65520 rounds to inf */
    return (uint16_t)(sign | 0x7c00u);
  if (absx < 0x38800000u) { /* below 2^-14: subnormal; scaling by 2^24 is exact */
    float v;
    memcpy(&v, &absx, sizeof(v));
    return (uint16_t)(sign | (uint32_t)rintf(v * 16777216.0f));
  }
  h = ((((absx >> 23) - 127u + 15u) << 10) | ((absx & 0x7fffffu) >> 13));
  rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
    h++;
  return (uint16_t)(sign | h);
}

static float f16_to_f32(uint16_t h) {
  uint32_t sign = ((uint32_t)h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
  float f;
  if (e == 0) {
    f = ldexpf((float)m, -24);
    return sign ? -f : f;
  }
  x = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e - 15u + 127u) << 23) | (m << 13));
  memcpy(&f, &x, sizeof(f));
  return f;
}

static uint16_t f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof(x));
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((x >> 16) | 0x40u);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static float bf16_to_f32(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, sizeof(f));
  return f;
}

static void store_elem(const struct perf_dtype_info *dt, void *buf, size_t i, double v) {
  switch (dt->id) {
  case PERF_INT8:
    ((int8_t *)buf)[i] = (int8_t)v;
    break;
  case PERF_UINT8:
    ((uint8_t *)buf)[i] = (uint8_t)v;
    break;
  case PERF_INT32:
    ((int32_t *)buf)[i] = (int32_t)v;
    break;
  case PERF_INT64:
    ((int64_t *)buf)[i] = (int64_t)v;
    break;
  case PERF_FLOAT16:
    ((uint16_t *)buf)[i] = f32_to_f16((float)v);
    break;
  case PERF_BFLOAT16:
    ((uint16_t *)buf)[i] = f32_to_bf16((float)v);
    break;
  case PERF_FLOAT32:
    ((float *)buf)[i] = (float)v;
    break;
  default:
    ((double *)buf)[i] = v;
    break;
  }
}

static double load_elem(const struct perf_dtype_info *dt, const void *buf, size_t i) {
  switch (dt->id) {
  case PERF_INT8:
    return ((const int8_t *)buf)[i];
  case PERF_UINT8:
    return ((const uint8_t *)buf)[i];
  case PERF_INT32:
    return ((const int32_t *)buf)[i];
  case PERF_INT64:
    return (double)((const int64_t *)buf)[i];
  case PERF_FLOAT16:
    return f16_to_f32(((const uint16_t *)buf)[i]);
  case PERF_BFLOAT16:
    return bf16_to_f32(((const uint16_t *)buf)[i]);
  case PERF_FLOAT32:
    return ((const float *)buf)[i];
  default:
    return ((const double *)buf)[i];
  }
}

/*
 * ---- check patterns of the reductions ----
 * Rank r's element i (its global index: reduce_scatter reads block b at b*count)
 * is a small non-negative integer chosen per op so that the
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
struct perf_pattern perf_pattern_make(const struct perf_dtype_info *dt, enum perf_op op,
                                      int nranks) {
  struct perf_pattern pt = {.op = op, .nranks = nranks};
  double v;
  switch (op) {
  case PERF_PROD:
    pt.p = (nranks + dt->prod_twos - 1) / dt->prod_twos;
    if (pt.p < 2)
      pt.p = 2;
    pt.period = (size_t)pt.p;
    break;
  case PERF_MIN:
  case PERF_MAX:
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

static double pattern_value(const struct perf_pattern *pt, int rank, size_t i) {
  size_t r = (size_t)rank;
  switch (pt->op) {
  case PERF_PROD:
    return (r + i) % (size_t)pt->p == 0 ? 2.0 : 1.0;
  case PERF_MIN:
  case PERF_MAX:
    return (double)((7 * r + 3 * i) % 13);
  default:
    if (pt->vmax > 0)
      return (double)((r + i) % ((size_t)pt->vmax + 1));
    return (r + i) % (size_t)pt->nranks == 0 ? 1.0 : 0.0;
  }
}

void perf_pattern_expect(const struct perf_pattern *pt, const struct perf_dtype_info *dt,
                         double *expect) {
  for (size_t j = 0; j < pt->period; j++) {
    double acc = pattern_value(pt, 0, j);
    for (int r = 1; r < pt->nranks; r++) {
      double v = pattern_value(pt, r, j);
      if (pt->op == PERF_PROD)
        acc *= v;
      else if (pt->op == PERF_MIN)
        acc = v < acc ? v : acc;
      else if (pt->op == PERF_MAX)
        acc = v > acc ? v : acc;
      else
        acc += v;
    }
    if (pt->op == PERF_AVG)
      acc = dt->is_float ? acc / pt->nranks : floor(acc / pt->nranks);
    expect[j] = acc;
  }
}

void perf_pattern_fill(const struct perf_pattern *pt, const struct perf_dtype_info *dt, int rank,
                       void *buf, size_t count) {
  for (size_t i = 0; i < count; i++)
    store_elem(dt, buf, i, pattern_value(pt, rank, i % pt->period));
}

uint64_t perf_pattern_count_wrong(const struct perf_pattern *pt, const struct perf_dtype_info *dt,
                                  const double *expect, const void *buf, size_t first,
                                  size_t count) {
  bool approx = pt->op == PERF_AVG && dt->is_float;
  uint64_t wrong = 0;
  for (size_t i = 0; i < count; i++) {
    double got = load_elem(dt, buf, i), want = expect[(first + i) % pt->period];
    if (approx ? !(fabs(got - want) <= 2.0 * dt->eps * fabs(want)) : got != want)
      wrong++;
  }
  return wrong;
}

/*
 * ---- data patterns of the collectives that do not reduce ----
 * Element k of rank r's data is (r*A + k) % P, P = dt->prime (exact in the
 * type) and A = 7919 % P (never 0: 7919 is a prime larger than every small P).
 * A block from the wrong rank or an element from the wrong index differs
 * unless the ranks differ by a multiple of P or the shift happens to match;
 * 0xff poison (NaN, -1, 255) never matches since 255 > 251.
 */
double perf_ident_value(const struct perf_dtype_info *dt, int rank, size_t k) {
  uint64_t p = dt->prime, a = 7919u % p;
  return (double)(((uint64_t)rank % p * a + (uint64_t)(k % p)) % p);
}

void perf_ident_fill(const struct perf_dtype_info *dt, int rank, size_t first, void *buf,
                     size_t count) {
  uint64_t p = dt->prime, v = (uint64_t)perf_ident_value(dt, rank, first);
  for (size_t i = 0; i < count; i++) {
    store_elem(dt, buf, i, (double)v);
    if (++v == p)
      v = 0;
  }
}

static uint64_t ident_count_wrong(const struct perf_dtype_info *dt, int rank, size_t first,
                                  const void *buf, size_t count) {
  uint64_t p = dt->prime, v = (uint64_t)perf_ident_value(dt, rank, first), wrong = 0;
  for (size_t i = 0; i < count; i++) {
    if (load_elem(dt, buf, i) != (double)v)
      wrong++;
    if (++v == p)
      v = 0;
  }
  return wrong;
}

/* ---- options ---- */

/*
 * Defaults: 100 timed calls per size up to 1 MiB (small calls are short, and
 * a mean over few of them is at the mercy of one scheduling hiccup), 20 up to
 * 64 MiB, then fewer so that each size moves about 20 x 64 MiB (never fewer
 * than 5). 5 warmup calls, 2 past 64 MiB.
 */
int perf_default_iters(size_t bytes) {
  size_t n;
  if (bytes <= 1 * MiB)
    return 100;
  if (bytes <= 64 * MiB)
    return 20;
  n = 20 * (64 * MiB) / bytes;
  return n < 5 ? 5 : (int)n;
}

int perf_default_warmup(size_t bytes) {
  return bytes <= 64 * MiB ? 5 : 2;
}

/*
 * Before the communicator exists only the launcher's environment says which
 * rank this is; usage messages are printed by rank 0 (or a lone process) only.
 */
bool perf_env_says_not_rank0(void) {
  static const char *const vars[] = {"CHORUS_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                     "SLURM_PROCID"};
  for (size_t i = 0; i < ARRAY_LEN(vars); i++) {
    const char *v = getenv(vars[i]);
    if (v && *v)
      return strtol(v, NULL, 10) != 0;
  }
  return false;
}

const struct perf_coll_info *perf_coll_find(const char *name) {
  for (size_t i = 0; i < ARRAY_LEN(colls); i++)
    if (!strcmp(name, colls[i].name) || (colls[i].alias && !strcmp(name, colls[i].alias)))
      return &colls[i];
  return NULL;
}

static void usage(const struct perf_tool *tool, FILE *f) {
  const char *sep = "";
  fprintf(f, "usage: %s [options]\n%s\n", tool->name, tool->about);
  fputs("  -c, --collective LIST  allreduce (default) bcast reduce allgather reduce_scatter\n"
        "                         alltoall gather scatter barrier sendrecv, a comma list\n"
        "                         of them, or all (each in turn, a table each)\n"
        "  -b, --minbytes SIZE    smallest size in bytes, K/M/G suffixes (default 8)\n"
        "  -e, --maxbytes SIZE    largest size in bytes (default 64M)\n"
        "  -f, --stepfactor N     multiply the size by N each step (default 4)\n"
        "  -d, --datatype TYPE    ",
        f);
  for (size_t i = 0; i < ARRAY_LEN(dtypes); i++) {
    if (dtypes[i].half && !tool->half)
      continue;
    fprintf(f, "%s%s", sep, dtypes[i].name);
    sep = " ";
  }
  fprintf(f,
          "\n"
          "                         (default float32)\n"
          "  -o, --op OP            sum prod min max avg (default sum); reductions only%s\n",
          tool->op_help);
  fputs("  -r, --root R           root of bcast, reduce, gather, scatter (default 0)\n", f);
  if (tool->algo_help)
    fputs(tool->algo_help, f);
  fputs("  -n, --iters N          timed calls per size (default 100 up to 1M, 20 up to\n"
        "                         64M, then 20*64M/size, at least 5)\n"
        "  -w, --warmup N         untimed calls per size first (default 5; 2 past 64M)\n"
        "      --check            verify one call per size on a known pattern; count the\n"
        "                         wrong elements (sum over ranks); exit 1 if any\n"
        "      --json             one JSON object per size instead of the table\n"
        "      --inplace          in place where the collective has that form (allreduce,\n"
        "                         bcast, allgather, reduce_scatter; the others run out of\n"
        "                         place in a list, and are refused alone)\n"
        "      --outplace         separate buffers (default)\n",
        f);
  fputs("      --mem plain|lib    where the buffers come from: plain, posix_memalign\n"
        "                         (default); lib, the library's allocator:\n",
        f);
  if (tool->mem_help)
    fputs(tool->mem_help, f);
  fputs("      --offset BYTES     each buffer starts this far past a page boundary\n"
        "                         (default 0; malloc's blocks start 16 past a line)\n",
        f);
  fputs("      --idle SECONDS     after the sweep, sit idle this long (every thread of the\n"
        "                         process left to itself) and report the CPU time the\n"
        "                         busiest rank used meanwhile, user and system\n",
        f);
  fputs("  -h, --help             this help\n"
        "\n"
        "Sizes, as in nccl-tests, are the whole buffer of the operation: the message of\n"
        "allreduce, bcast, reduce and sendrecv; the receive buffer of allgather and\n"
        "gather; the send buffer of reduce_scatter and scatter; either buffer of\n"
        "alltoall. The count of the call (count column) follows: size/nranks elements\n"
        "per block for the block collectives. Sizes are rounded down to whole elements\n"
        "(blocks); a size smaller than one is skipped. Barrier runs once, time only.\n"
        "sendrecv: each rank sends to rank+1 and receives from rank-1 (a ring).\n"
        "time: mean per call of the slowest rank; algbw = size/time; busbw = algbw *\n"
        "2(n-1)/n for allreduce, (n-1)/n for allgather, reduce_scatter, alltoall,\n"
        "gather, scatter, 1 for bcast, reduce, sendrecv (nccl-tests); GB = 1e9 B.\n"
        "--check patterns name the rank and index each element came from (exact\n"
        "results for the reductions); barrier checks that no rank left before the\n"
        "last one entered (by the realtime clock: ranks on one host, or synced clocks).\n"
        "Exit status: 0 ok, 1 error or wrong results, 2 bad arguments.\n",
        f);
}

static bool usage_error(const struct perf_tool *tool, const char *fmt, const char *arg) {
  if (!perf_env_says_not_rank0()) {
    fprintf(stderr, "%s: ", tool->name);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nTry '%s --help'.\n", tool->name);
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

/* "all" or a comma list of names; duplicates run once. */
static bool parse_colls(const struct perf_tool *tool, const char *list, struct perf_options *opt) {
  char buf[256], *save = NULL;
  if (strlen(list) >= sizeof(buf))
    return usage_error(tool, "collective list too long: '%s'", list);
  strcpy(buf, list);
  opt->ncolls = 0;
  for (char *name = strtok_r(buf, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
    const struct perf_coll_info *c = perf_coll_find(name);
    bool have = false;
    if (!strcmp(name, "all")) {
      for (size_t i = 0; i < ARRAY_LEN(colls); i++) {
        have = false;
        for (int j = 0; j < opt->ncolls; j++)
          have = have || opt->colls[j] == &colls[i];
        if (!have)
          opt->colls[opt->ncolls++] = &colls[i];
      }
      continue;
    }
    if (!c)
      return usage_error(tool, "unknown collective '%s'", name);
    for (int j = 0; j < opt->ncolls; j++)
      have = have || opt->colls[j] == c;
    if (!have)
      opt->colls[opt->ncolls++] = c;
  }
  if (opt->ncolls == 0)
    return usage_error(tool, "no collective in '%s'", list);
  return true;
}

bool perf_parse_args(const struct perf_tool *tool, int argc, char **argv, struct perf_options *opt,
                     int *exit_code) {
  enum {
    OPT_CHECK = 256,
    OPT_JSON,
    OPT_INPLACE,
    OPT_OUTPLACE,
    OPT_ALGO,
    OPT_MEM,
    OPT_IDLE,
    OPT_OFFSET
  };
  static const struct option longopts[] = {{"collective", required_argument, NULL, 'c'},
                                           {"minbytes", required_argument, NULL, 'b'},
                                           {"maxbytes", required_argument, NULL, 'e'},
                                           {"stepfactor", required_argument, NULL, 'f'},
                                           {"datatype", required_argument, NULL, 'd'},
                                           {"op", required_argument, NULL, 'o'},
                                           {"root", required_argument, NULL, 'r'},
                                           {"algo", required_argument, NULL, OPT_ALGO},
                                           {"iters", required_argument, NULL, 'n'},
                                           {"warmup", required_argument, NULL, 'w'},
                                           {"check", no_argument, NULL, OPT_CHECK},
                                           {"json", no_argument, NULL, OPT_JSON},
                                           {"inplace", no_argument, NULL, OPT_INPLACE},
                                           {"outplace", no_argument, NULL, OPT_OUTPLACE},
                                           {"mem", required_argument, NULL, OPT_MEM},
                                           {"idle", required_argument, NULL, OPT_IDLE},
                                           {"offset", required_argument, NULL, OPT_OFFSET},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  const char *coll = "allreduce", *dtype = "float32", *op = "sum";
  int c, factor = 4;

  *opt = (struct perf_options){.minbytes = 8, .maxbytes = 64 * MiB, .warmup = -1};
  *exit_code = PERF_EXIT_USAGE;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":c:b:e:f:d:o:r:n:w:h", longopts, NULL)) != -1) {
    switch (c) {
    case 'c':
      coll = optarg;
      break;
    case 'b':
      if (!parse_size(optarg, &opt->minbytes) || opt->minbytes == 0)
        return usage_error(tool, "bad size for -b: '%s'", optarg);
      break;
    case 'e':
      if (!parse_size(optarg, &opt->maxbytes) || opt->maxbytes == 0)
        return usage_error(tool, "bad size for -e: '%s'", optarg);
      break;
    case 'f':
      if (!parse_int(optarg, 1, &factor))
        return usage_error(tool, "bad step factor for -f: '%s' (an integer >= 2)", optarg);
      break;
    case 'd':
      dtype = optarg;
      break;
    case 'o':
      op = optarg;
      break;
    case 'r':
      if (!parse_int(optarg, 0, &opt->root))
        return usage_error(tool, "bad root for --root: '%s' (a rank >= 0)", optarg);
      break;
    case OPT_ALGO:
      if (!tool->algo_help)
        return usage_error(tool, tool->algo_missing, optarg);
      if (!*optarg)
        return usage_error(tool, "empty --algo%s", "");
      opt->algo = optarg;
      break;
    case 'n':
      if (!parse_int(optarg, 1, &opt->iters))
        return usage_error(tool, "bad iteration count for -n: '%s' (an integer >= 1)", optarg);
      break;
    case 'w':
      if (!parse_int(optarg, 0, &opt->warmup))
        return usage_error(tool, "bad warmup count for -w: '%s' (an integer >= 0)", optarg);
      break;
    case OPT_CHECK:
      opt->check = true;
      break;
    case OPT_JSON:
      opt->json = true;
      break;
    case OPT_INPLACE:
      opt->inplace = true;
      break;
    case OPT_OUTPLACE:
      opt->inplace = false;
      break;
    case OPT_MEM:
      if (!strcmp(optarg, "plain"))
        opt->mem = PERF_MEM_PLAIN;
      else if (!strcmp(optarg, "lib"))
        opt->mem = PERF_MEM_LIB;
      else
        return usage_error(tool, "bad memory for --mem: '%s' (plain or lib)", optarg);
      break;
    case OPT_OFFSET: {
      char *end;
      unsigned long v = strtoul(optarg, &end, 10);
      if (end == optarg || *end || optarg[0] == '-' || v > PERF_OFFSET_MAX)
        return usage_error(
            tool, "bad offset for --offset: '%s' (bytes, 0 to " PERF_STR(PERF_OFFSET_MAX) ")",
            optarg);
      opt->offset = (size_t)v;
      break;
    }
    case OPT_IDLE: {
      char *end;
      opt->idle_s = strtod(optarg, &end);
      if (end == optarg || *end || !(opt->idle_s > 0 && opt->idle_s <= 3600))
        return usage_error(tool, "bad time for --idle: '%s' (seconds, above 0, at most 3600)",
                           optarg);
      break;
    }
    case 'h':
      if (!perf_env_says_not_rank0())
        usage(tool, stdout);
      *exit_code = 0;
      return false;
    case ':':
      return usage_error(tool, "option '%s' needs an argument", argv[optind - 1]);
    default:
      if (optopt > 0 && optopt < 256) {
        char name[3] = {'-', (char)optopt, '\0'};
        return usage_error(tool, "unknown option '%s'", name);
      }
      return usage_error(tool, "unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc)
    return usage_error(tool, "unexpected argument '%s'", argv[optind]);

  if (!parse_colls(tool, coll, opt))
    return false;
  if (opt->ncolls == 1 && opt->inplace && !opt->colls[0]->inplace)
    return usage_error(tool, "%s has no in-place form", opt->colls[0]->name);
  if (opt->algo && !strchr(opt->algo, '=')) {
    if (opt->ncolls != 1)
      return usage_error(tool,
                         "--algo '%s' names no collective: with several, give "
                         "coll=algo;coll=algo",
                         opt->algo);
    if (opt->colls[0]->id == PERF_SENDRECV)
      return usage_error(tool, "sendrecv has no algorithm to choose (--algo '%s')", opt->algo);
  }
  for (size_t i = 0; i < ARRAY_LEN(dtypes) && !opt->dtype; i++)
    if ((!dtypes[i].half || tool->half) &&
        (!strcmp(dtype, dtypes[i].name) || (dtypes[i].alias && !strcmp(dtype, dtypes[i].alias))))
      opt->dtype = &dtypes[i];
  if (!opt->dtype)
    return usage_error(tool, "unknown datatype '%s'", dtype);
  for (size_t i = 0; i < ARRAY_LEN(ops) && !opt->op; i++)
    if (!strcmp(op, ops[i].name))
      opt->op = &ops[i];
  if (!opt->op)
    return usage_error(tool, "unknown op '%s'", op);
  if (opt->minbytes > opt->maxbytes)
    return usage_error(tool, "-b is larger than -e%s", "");
  if (factor < 2 && opt->minbytes != opt->maxbytes)
    return usage_error(tool, "-f must be >= 2 unless -b equals -e%s", "");
  if (opt->maxbytes / opt->dtype->size == 0)
    return usage_error(tool, "no size up to -e holds one element of %s", opt->dtype->name);
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

/* What a table or a JSON line of one collective needs besides the row. */
struct perf_table {
  const struct perf_tool *tool;
  const struct perf_backend *be;
  const struct perf_options *opt;
  const struct perf_coll_info *coll;
  bool inplace; /* as run: --inplace where the collective has the form */
};

static void print_header(const struct perf_table *t) {
  const struct perf_options *opt = t->opt;
  const struct perf_coll_info *coll = t->coll;
  printf("# %s %s: %s", t->tool->name, t->be->version, coll->name);
  if (coll->layout != PERF_LAYOUT_NONE)
    printf(" %s", opt->dtype->name);
  if (coll->reduces)
    printf(" %s", opt->op->name);
  if (coll->rooted)
    printf(", root %d", opt->root);
  if (coll->layout != PERF_LAYOUT_NONE)
    printf(", %s", t->inplace ? "in-place" : "out-of-place");
  printf(", %d ranks, provider %s, algo %s\n", t->be->nranks, t->be->provider,
         opt->algo ? opt->algo : t->tool->algo);
  if (coll->layout != PERF_LAYOUT_NONE)
    printf("# sizes %zu..%zu B x%zu, warmup ", opt->minbytes, opt->maxbytes, opt->factor);
  else
    printf("# warmup ");
  if (opt->warmup >= 0)
    printf("%d", opt->warmup);
  else
    printf("5 (2 past 64M)");
  if (opt->iters > 0)
    printf(", iters %d", opt->iters);
  else
    printf(", iters 100 (20 past 1M, 20*64M/size past 64M, >= 5)");
  printf(", check %s, memory %s, offset %zu\n#\n", opt->check ? "on" : "off",
         opt->mem == PERF_MEM_PLAIN ? "plain"
         : t->tool->mem_lib         ? t->tool->mem_lib
                                    : "lib",
         opt->offset);
  printf("# %10s  %12s  %8s  %6s  %4s  %10s  %8s  %8s  %7s  %s\n", "size", "count", "type", "redop",
         "root", "time", "algbw", "busbw", "#wrong", "algo");
  printf("# %10s  %12s  %8s  %6s  %4s  %10s  %8s  %8s  %7s\n", "(B)", "(elements)", "", "", "",
         "(us)", "(GB/s)", "(GB/s)", "");
}

static void print_row(const struct perf_table *t, const struct perf_row *r) {
  const struct perf_options *opt = t->opt;
  const struct perf_coll_info *coll = t->coll;
  bool data = coll->layout != PERF_LAYOUT_NONE;
  if (opt->json) {
    printf("{\"collective\":\"%s\",\"bytes\":%zu,\"count\":%zu,\"dtype\":\"%s\",\"op\":\"%s\","
           "\"root\":",
           coll->name, r->bytes, r->count, data ? opt->dtype->name : "none",
           coll->reduces ? opt->op->name : "none");
    if (coll->rooted)
      printf("%d", opt->root);
    else
      printf("null");
    printf(",\"nranks\":%d,\"provider\":", t->be->nranks);
    json_string(t->be->provider);
    printf(",\"algo\":");
    json_string(r->algo);
    printf(",\"time_us\":%.3f,", r->time_us);
    if (data)
      printf("\"algbw_gbs\":%.6f,\"busbw_gbs\":%.6f", r->algbw, r->busbw);
    else
      printf("\"algbw_gbs\":null,\"busbw_gbs\":null");
    printf(",\"wrong\":");
    if (r->wrong >= 0)
      printf("%" PRId64, r->wrong);
    else
      printf("null");
    printf(",\"inplace\":%s,\"mem\":\"%s\",\"offset\":%zu}\n", t->inplace ? "true" : "false",
           opt->mem == PERF_MEM_LIB ? "lib" : "plain", opt->offset);
  } else {
    char wrong[24], root[16], algbw[16], busbw[16];
    if (r->wrong >= 0)
      snprintf(wrong, sizeof(wrong), "%" PRId64, r->wrong);
    else
      snprintf(wrong, sizeof(wrong), "N/A");
    if (coll->rooted)
      snprintf(root, sizeof(root), "%d", opt->root);
    else
      snprintf(root, sizeof(root), "-");
    if (data) {
      snprintf(algbw, sizeof(algbw), "%.2f", r->algbw);
      snprintf(busbw, sizeof(busbw), "%.2f", r->busbw);
    } else {
      snprintf(algbw, sizeof(algbw), "-");
      snprintf(busbw, sizeof(busbw), "-");
    }
    printf("  %10zu  %12zu  %8s  %6s  %4s  %10.2f  %8s  %8s  %7s  %s\n", r->bytes, r->count,
           data ? opt->dtype->name : "none", coll->reduces ? opt->op->name : "none", root,
           r->time_us, algbw, busbw, wrong, r->algo);
  }
  fflush(stdout);
}

static void print_footer(const struct perf_table *t, int rows, double busbw_sum,
                         int64_t wrong_total) {
  if (t->opt->json)
    return;
  if (t->coll->layout != PERF_LAYOUT_NONE)
    printf("# Avg bus bandwidth    : %.4f GB/s\n", rows ? busbw_sum / rows : 0.0);
  if (t->opt->check)
    printf("# Wrong elements       : %" PRId64 " %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
  fflush(stdout);
}

/* ---- the run ---- */

/* Everything one collective's sweep needs. */
struct perf_runner {
  struct perf_table t;
  struct perf_pattern pt;
  double *expect; /* the reductions' expected results, one period */
  unsigned char *sendbuf, *recvbuf;
};

static void fail(const struct perf_runner *run, const char *what, size_t bytes, int rc) {
  const struct perf_backend *be = run->t.be;
  fprintf(stderr, "%s: rank %d: %s %s (%zu bytes) failed: %s\n", run->t.tool->name, be->rank, what,
          run->t.coll->name, bytes, be->strerror(be->ctx, rc));
  fflush(stderr);
  be->abort(be->ctx);
}

/* The count of the call for a size, and the size it stands for. */
static size_t coll_count(const struct perf_coll_info *coll, size_t elem, size_t bytes, int n) {
  size_t elems = bytes / elem;
  return coll->layout == PERF_LAYOUT_SAME ? elems : elems / (size_t)n;
}

static size_t send_count(const struct perf_coll_info *coll, size_t c, int n) {
  return coll->layout == PERF_LAYOUT_SCATTER || coll->layout == PERF_LAYOUT_ALL ? c * (size_t)n : c;
}

static size_t recv_count(const struct perf_coll_info *coll, size_t c, int n) {
  return coll->layout == PERF_LAYOUT_GATHER || coll->layout == PERF_LAYOUT_ALL ? c * (size_t)n : c;
}

static size_t row_bytes(const struct perf_coll_info *coll, size_t elem, size_t c, int n) {
  size_t s = send_count(coll, c, n), r = recv_count(coll, c, n);
  return (s > r ? s : r) * elem;
}

static struct perf_call make_call(const struct perf_runner *run, size_t c) {
  const struct perf_options *opt = run->t.opt;
  size_t block = c * opt->dtype->size * (size_t)run->t.be->rank;
  struct perf_call call = {.coll = run->t.coll,
                           .dtype = opt->dtype,
                           .op = opt->op->id,
                           .sendbuf = run->sendbuf,
                           .recvbuf = run->recvbuf,
                           .count = c,
                           .root = opt->root,
                           .inplace = run->t.inplace};
  if (!call.inplace)
    return call;
  switch (run->t.coll->id) {
  case PERF_ALLGATHER:
    call.sendbuf = run->recvbuf + block;
    break;
  case PERF_REDUCE_SCATTER:
    call.recvbuf = run->sendbuf + block;
    break;
  default:
    call.sendbuf = run->recvbuf;
    break;
  }
  return call;
}

/*
 * This rank's inputs of a call; with poison, the result area is first filled
 * with 0xff bytes (it matches no pattern value) unless it holds inputs.
 */
static void prepare(const struct perf_runner *run, const struct perf_call *call, bool poison) {
  const struct perf_dtype_info *dt = call->dtype;
  const struct perf_coll_info *coll = call->coll;
  int rank = run->t.be->rank, n = run->t.be->nranks;
  bool root_only = coll->id == PERF_BCAST || coll->id == PERF_SCATTER;
  bool result_is_input =
      call->inplace && (coll->id == PERF_ALLREDUCE || coll->id == PERF_REDUCE_SCATTER ||
                        (coll->id == PERF_BCAST && rank == call->root));
  size_t sc = send_count(coll, call->count, n);
  if (poison && !result_is_input)
    memset(call->recvbuf, 0xff, recv_count(coll, call->count, n) * dt->size);
  if (root_only && rank != call->root)
    return;
  if (coll->reduces)
    perf_pattern_fill(&run->pt, dt, rank, (void *)call->sendbuf, sc);
  else
    perf_ident_fill(dt, rank, 0, (void *)call->sendbuf, sc);
}

/* Elements of this rank's result that differ from the exact one. */
static int64_t count_wrong(const struct perf_runner *run, const struct perf_call *call) {
  const struct perf_dtype_info *dt = call->dtype;
  const unsigned char *res = call->recvbuf;
  int rank = run->t.be->rank, n = run->t.be->nranks;
  size_t c = call->count, bs = c * dt->size;
  uint64_t wrong = 0;
  switch (call->coll->id) {
  case PERF_ALLREDUCE:
    return (int64_t)perf_pattern_count_wrong(&run->pt, dt, run->expect, res, 0, c);
  case PERF_REDUCE:
    if (rank != call->root)
      return 0;
    return (int64_t)perf_pattern_count_wrong(&run->pt, dt, run->expect, res, 0, c);
  case PERF_REDUCE_SCATTER:
    return (int64_t)perf_pattern_count_wrong(&run->pt, dt, run->expect, res, (size_t)rank * c, c);
  case PERF_BCAST:
    return (int64_t)ident_count_wrong(dt, call->root, 0, res, c);
  case PERF_SCATTER:
    return (int64_t)ident_count_wrong(dt, call->root, (size_t)rank * c, res, c);
  case PERF_SENDRECV:
    return (int64_t)ident_count_wrong(dt, (rank + n - 1) % n, 0, res, c);
  case PERF_GATHER:
    if (rank != call->root)
      return 0;
    /* fall through */
  case PERF_ALLGATHER:
    for (int q = 0; q < n; q++)
      wrong += ident_count_wrong(dt, q, 0, res + (size_t)q * bs, c);
    return (int64_t)wrong;
  case PERF_ALLTOALL:
    for (int s = 0; s < n; s++)
      wrong += ident_count_wrong(dt, s, (size_t)rank * c, res + (size_t)s * bs, c);
    return (int64_t)wrong;
  default:
    return 0;
  }
}

/* Same-time start: nobody leaves this call before all entered it. */
static void sync_ranks(const struct perf_runner *run) {
  double one = 1.0;
  int rc = run->t.be->max_double(run->t.be->ctx, &one);
  if (rc)
    fail(run, "synchronising allreduce before", sizeof(one), rc);
}

static double realtime_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/*
 * Barrier check: the last rank enters 2 ms late; a rank that leaves before
 * the latest entry time (realtime clock, max over ranks) counts as one wrong.
 */
static int64_t check_barrier(const struct perf_runner *run, const struct perf_call *call) {
  const struct perf_backend *be = run->t.be;
  struct timespec late = {0, 2000000};
  double entered, left, last_in;
  int64_t wrong;
  int rc;
  sync_ranks(run);
  if (be->rank == be->nranks - 1)
    nanosleep(&late, NULL);
  entered = realtime_s();
  rc = be->call(be->ctx, call);
  left = realtime_s();
  if (rc)
    fail(run, "checked", 0, rc);
  last_in = entered;
  rc = be->max_double(be->ctx, &last_in);
  if (rc)
    fail(run, "allreduce of the entry times of", sizeof(last_in), rc);
  wrong = left < last_in ? 1 : 0;
  rc = be->sum_int64(be->ctx, &wrong);
  if (rc)
    fail(run, "allreduce of the wrong counts of", sizeof(wrong), rc);
  return wrong;
}

/* One row: warmup, timed calls, check. */
static int64_t run_size(const struct perf_runner *run, size_t c, size_t bytes, double *busbw) {
  const struct perf_options *opt = run->t.opt;
  const struct perf_backend *be = run->t.be;
  struct perf_call call = make_call(run, c);
  struct perf_row r = {.bytes = bytes, .count = c, .wrong = -1};
  int iters = opt->iters > 0 ? opt->iters : perf_default_iters(bytes);
  int warmup = opt->warmup >= 0 ? opt->warmup : perf_default_warmup(bytes);
  double t0, slowest;
  char algo[64];
  int rc;

  if (run->t.coll->layout != PERF_LAYOUT_NONE)
    prepare(run, &call, false);
  for (int i = 0; i < warmup; i++) {
    rc = be->call(be->ctx, &call);
    if (rc)
      fail(run, "warmup", bytes, rc);
  }
  sync_ranks(run);
  t0 = perf_now_s();
  for (int i = 0; i < iters; i++) {
    rc = be->call(be->ctx, &call);
    if (rc)
      fail(run, "timed", bytes, rc);
  }
  slowest = (perf_now_s() - t0) / iters;
  snprintf(algo, sizeof(algo), "%s", be->last_algo(be->ctx));
  r.algo = *algo ? algo : "-";
  rc = be->max_double(be->ctx, &slowest);
  if (rc)
    fail(run, "allreduce of the timings of", sizeof(slowest), rc);

  if (opt->check && run->t.coll->layout == PERF_LAYOUT_NONE) {
    r.wrong = check_barrier(run, &call);
  } else if (opt->check) {
    prepare(run, &call, true);
    rc = be->call(be->ctx, &call);
    if (rc)
      fail(run, "checked", bytes, rc);
    r.wrong = count_wrong(run, &call);
    rc = be->sum_int64(be->ctx, &r.wrong);
    if (rc)
      fail(run, "allreduce of the wrong counts of", sizeof(r.wrong), rc);
  }

  r.time_us = slowest * 1e6;
  r.algbw = slowest > 0.0 ? (double)bytes / slowest / 1e9 : 0.0;
  r.busbw = r.algbw * run->t.coll->bus_factor(be->nranks);
  *busbw = r.busbw;
  if (be->rank == 0)
    print_row(&run->t, &r);
  return r.wrong;
}

/*
 * Start-up warmup, untimed (skipped with -w 0): one call at the largest size
 * touches every buffer and transport path, then a burst of small calls lets
 * freshly started ranks settle before the first size is timed; without it
 * the first size often absorbs milliseconds of start-up noise.
 */
static void startup_warmup(const struct perf_runner *run) {
  const struct perf_options *opt = run->t.opt;
  const struct perf_backend *be = run->t.be;
  size_t elem = opt->dtype->size;
  size_t maxc = coll_count(run->t.coll, elem, opt->maxbytes, be->nranks);
  size_t minc = coll_count(run->t.coll, elem, opt->minbytes, be->nranks);
  struct perf_call call;
  int rc;
  if (run->t.coll->layout == PERF_LAYOUT_NONE)
    maxc = minc = 0;
  else if (maxc == 0)
    return;
  call = make_call(run, maxc);
  if (maxc)
    prepare(run, &call, false);
  rc = be->call(be->ctx, &call);
  if (rc)
    fail(run, "start-up warmup", row_bytes(run->t.coll, elem, maxc, be->nranks), rc);
  call = make_call(run, minc ? minc : (maxc ? 1 : 0));
  for (int i = 0; i < 20; i++) {
    rc = be->call(be->ctx, &call);
    if (rc)
      fail(run, "start-up warmup", row_bytes(run->t.coll, elem, call.count, be->nranks), rc);
  }
}

/* The sweep of one collective; returns the wrong elements over all sizes. */
static int64_t run_coll(struct perf_runner *run) {
  const struct perf_options *opt = run->t.opt;
  const struct perf_backend *be = run->t.be;
  const struct perf_coll_info *coll = run->t.coll;
  size_t elem = opt->dtype->size;
  double busbw, busbw_sum = 0.0;
  int64_t wrong, wrong_total = 0;
  int rows = 0;

  if (be->rank == 0 && !opt->json)
    print_header(&run->t);
  if (opt->warmup != 0)
    startup_warmup(run);
  if (coll->layout == PERF_LAYOUT_NONE) {
    wrong = run_size(run, 0, 0, &busbw);
    if (wrong > 0)
      wrong_total += wrong;
    rows++;
  }
  for (size_t bytes = opt->minbytes; coll->layout != PERF_LAYOUT_NONE && bytes <= opt->maxbytes;) {
    size_t c = coll_count(coll, elem, bytes, be->nranks);
    if (c > 0) {
      wrong = run_size(run, c, row_bytes(coll, elem, c, be->nranks), &busbw);
      if (wrong > 0)
        wrong_total += wrong;
      busbw_sum += busbw;
      rows++;
    }
    if (bytes > opt->maxbytes / opt->factor || opt->factor < 2)
      break;
    bytes *= opt->factor;
  }
  if (be->rank == 0)
    print_footer(&run->t, rows, busbw_sum, wrong_total);
  return wrong_total;
}

static double cpu_s(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru))
    return 0;
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

/* --idle: every rank sleeps idle_s with nothing in flight; the CPU time its
 * process used meanwhile (all threads: a progress thread's polling shows
 * here), the busiest rank's, as a line or a JSON object. */
static void report_idle(const struct perf_table *t, double idle_s) {
  const struct perf_backend *be = t->be;
  double before = cpu_s(), start = perf_now_s();
  struct timespec ts = {(time_t)idle_s, (long)((idle_s - (double)(time_t)idle_s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
  double used = cpu_s() - before, wall = perf_now_s() - start;
  if (be->max_double(be->ctx, &used))
    return;
  if (be->rank != 0)
    return;
  if (t->opt->json) {
    printf("{\"idle_s\":%.3f,\"cpu_s\":%.6f,\"cpu_pct\":%.4f,\"nranks\":%d,\"provider\":", wall,
           used, 100.0 * used / wall, be->nranks);
    json_string(be->provider);
    printf("}\n");
  } else {
    printf("# idle %.1f s: the busiest rank used %.4f s of CPU (%.3f%%)\n", wall, used,
           100.0 * used / wall);
  }
  fflush(stdout);
}

int perf_run(const struct perf_tool *tool, const struct perf_backend *be,
             const struct perf_options *opt, void *sendbuf, void *recvbuf) {
  struct perf_runner run = {
      .t = {.tool = tool, .be = be, .opt = opt}, .sendbuf = sendbuf, .recvbuf = recvbuf};
  int64_t wrong = 0;
  bool rooted = false;

  for (int i = 0; i < opt->ncolls; i++)
    rooted = rooted || opt->colls[i]->rooted;
  if (rooted && opt->root >= be->nranks) {
    char root[16];
    snprintf(root, sizeof(root), "%d", opt->root);
    if (be->rank == 0) {
      fprintf(stderr, "%s: --root %s is not a rank (%d ranks)\n", tool->name, root, be->nranks);
      fprintf(stderr, "Try '%s --help'.\n", tool->name);
    }
    return PERF_EXIT_USAGE;
  }
  /* the longest period is nranks (one-hot sums) */
  run.expect = calloc((size_t)be->nranks > 13 ? (size_t)be->nranks : 13, sizeof(*run.expect));
  if (!run.expect) {
    fprintf(stderr, "%s: rank %d: out of memory\n", tool->name, be->rank);
    be->abort(be->ctx);
  }
  run.pt = perf_pattern_make(opt->dtype, opt->op->id, be->nranks);
  perf_pattern_expect(&run.pt, opt->dtype, run.expect);

  for (int i = 0; i < opt->ncolls; i++) {
    run.t.coll = opt->colls[i];
    run.t.inplace = opt->inplace && run.t.coll->inplace;
    if (i > 0 && be->rank == 0 && !opt->json)
      printf("\n");
    /* Chorus refuses to send to this rank itself; MPI follows suit */
    if (run.t.coll->id == PERF_SENDRECV && be->nranks < 2) {
      if (be->rank == 0 && !opt->json)
        printf("# %s: sendrecv needs 2 ranks or more: skipped\n", tool->name);
      continue;
    }
    wrong += run_coll(&run);
  }
  free(run.expect);
  if (opt->idle_s > 0)
    report_idle(&run.t, opt->idle_s);
  return wrong ? 1 : 0;
}

double perf_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
