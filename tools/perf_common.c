/*
 * perf_common - options, sizes, check patterns and output shared by
 * chorus-perf and mpi-perf; see perf_common.h.
 */
#include "perf_common.h"

#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define MiB PERF_MiB

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

static const struct perf_coll_info colls[] = {
    {"allreduce", NULL, factor_allreduce, true},
    {"broadcast", "bcast", factor_one, false},
    {"reduce", NULL, factor_one, false},
    {"allgather", NULL, factor_nm1_n, false},
    {"reduce_scatter", "reducescatter", factor_nm1_n, false},
    {"alltoall", NULL, factor_nm1_n, false},
};

/* ---- data types and ops ---- */

static const struct perf_dtype_info dtypes[] = {
    {"int8", "char", PERF_INT8, 1, false, 127.0, 6, 0.0, false},
    {"uint8", NULL, PERF_UINT8, 1, false, 255.0, 7, 0.0, false},
    {"int32", "int", PERF_INT32, 4, false, 2147483647.0, 30, 0.0, false},
    {"int64", NULL, PERF_INT64, 8, false, 9007199254740992.0, 52, 0.0, false},
    {"float16", "half", PERF_FLOAT16, 2, true, 2048.0, 15, 0x1p-10, true},
    {"bfloat16", "bf16", PERF_BFLOAT16, 2, true, 256.0, 127, 0x1p-7, true},
    {"float32", "float", PERF_FLOAT32, 4, true, 16777216.0, 127, 0x1p-23, false},
    {"float64", "double", PERF_FLOAT64, 8, true, 9007199254740992.0, 1023, 0x1p-52, false},
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
                                  const double *expect, const void *buf, size_t count) {
  bool approx = pt->op == PERF_AVG && dt->is_float;
  uint64_t wrong = 0;
  for (size_t i = 0; i < count; i++) {
    double got = load_elem(dt, buf, i), want = expect[i % pt->period];
    if (approx ? !(fabs(got - want) <= 2.0 * dt->eps * fabs(want)) : got != want)
      wrong++;
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

static void usage(const struct perf_tool *tool, FILE *f) {
  const char *sep = "";
  fprintf(f, "usage: %s [options]\n%s\n%s", tool->name, tool->about, tool->coll_help);
  fputs("  -b, --minbytes SIZE    smallest message in bytes, K/M/G suffixes (default 8)\n"
        "  -e, --maxbytes SIZE    largest message in bytes (default 64M)\n"
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
          "  -o, --op OP            sum prod min max avg (default sum)%s\n",
          tool->op_help);
  fputs("  -n, --iters N          timed calls per size (default 100 up to 1M, 20 up to\n"
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

bool perf_parse_args(const struct perf_tool *tool, int argc, char **argv, struct perf_options *opt,
                     int *exit_code) {
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

  *opt = (struct perf_options){.minbytes = 8, .maxbytes = 64 * MiB, .warmup = -1};
  *exit_code = PERF_EXIT_USAGE;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":c:b:e:f:d:o:n:w:h", longopts, NULL)) != -1) {
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
    case 'n':
      if (!parse_int(optarg, 1, &opt->iters))
        return usage_error(tool, "bad iteration count for -n: '%s' (an integer >= 1)", optarg);
      break;
    case 'w':
      if (!parse_int(optarg, 0, &opt->warmup))
        return usage_error(tool, "bad warmup count for -w: '%s' (an integer >= 0)", optarg);
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
      if (!perf_env_says_not_rank0())
        usage(tool, stdout);
      *exit_code = 0;
      return false;
    case ':':
      return usage_error(tool, "option '%s' needs an argument", argv[optind - 1]);
    default:
      if (optopt) {
        char name[3] = {'-', (char)optopt, '\0'};
        return usage_error(tool, "unknown option '%s'", name);
      }
      return usage_error(tool, "unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc)
    return usage_error(tool, "unexpected argument '%s'", argv[optind]);

  for (size_t i = 0; i < ARRAY_LEN(colls) && !opt->coll; i++)
    if (!strcmp(coll, colls[i].name) || (colls[i].alias && !strcmp(coll, colls[i].alias)))
      opt->coll = &colls[i];
  if (!opt->coll)
    return usage_error(tool, "unknown collective '%s'", coll);
  if (!opt->coll->available)
    return usage_error(tool, tool->unavailable_fmt, opt->coll->name);
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

void perf_print_header(const struct perf_tool *tool, const struct perf_options *opt,
                       const char *version, int nranks, const char *provider) {
  printf("# %s %s: %s %s %s, %s, %d ranks, provider %s, algo %s\n", tool->name, version,
         opt->coll->name, opt->dtype->name, opt->op->name,
         opt->inplace ? "in-place" : "out-of-place", nranks, provider, tool->algo);
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

void perf_print_row(const struct perf_tool *tool, const struct perf_options *opt, int nranks,
                    const char *provider, const struct perf_row *r) {
  if (opt->json) {
    printf("{\"collective\":\"%s\",\"bytes\":%zu,\"count\":%zu,\"dtype\":\"%s\",\"op\":\"%s\","
           "\"nranks\":%d,\"provider\":",
           opt->coll->name, r->bytes, r->count, opt->dtype->name, opt->op->name, nranks);
    json_string(provider);
    printf(",\"algo\":\"%s\",\"time_us\":%.3f,\"algbw_gbs\":%.6f,\"busbw_gbs\":%.6f,\"wrong\":",
           tool->algo, r->time_us, r->algbw, r->busbw);
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

void perf_print_footer(const struct perf_options *opt, int rows, double busbw_sum,
                       int64_t wrong_total) {
  if (opt->json)
    return;
  printf("# Avg bus bandwidth    : %.4f GB/s\n", rows ? busbw_sum / rows : 0.0);
  if (opt->check)
    printf("# Wrong elements       : %" PRId64 " %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
  fflush(stdout);
}

double perf_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
