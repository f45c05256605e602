/*
 * perf_common - what chorus-perf and mpi-perf share: options, sizes, check
 * patterns and output. Plain C: no Chorus or MPI here, so that the two
 * benchmarks parse, check and print identically and compare line by line
 * (scripts/bench-vs-mpi.sh relies on it). Each tool keeps its own run loop,
 * maps perf_dtype/perf_op to its library's types and describes itself with a
 * struct perf_tool.
 */
#ifndef CHORUS_TOOLS_PERF_COMMON_H
#define CHORUS_TOOLS_PERF_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define PERF_EXIT_USAGE 2
#define PERF_MiB ((size_t)1 << 20)

enum perf_dtype {
  PERF_INT8,
  PERF_UINT8,
  PERF_INT32,
  PERF_INT64,
  PERF_FLOAT16,
  PERF_BFLOAT16,
  PERF_FLOAT32,
  PERF_FLOAT64,
};

enum perf_op { PERF_SUM, PERF_PROD, PERF_MIN, PERF_MAX, PERF_AVG };

struct perf_coll_info {
  const char *name;
  const char *alias;           /* another accepted spelling, or NULL */
  double (*bus_factor)(int n); /* busbw = algbw * bus_factor(nranks) */
  bool available;              /* false until the engine offers the collective */
};

struct perf_dtype_info {
  const char *name;
  const char *alias; /* another accepted spelling, or NULL */
  enum perf_dtype id;
  size_t size;
  bool is_float;
  double exact_max; /* largest integer the type holds exactly */
  int prod_twos;    /* most factors of 2 a product may hold (in range, exact in a double) */
  double eps;       /* machine epsilon (floats), for the tolerance of avg */
  bool half;        /* float16/bfloat16: offered only where the tool says so */
};

struct perf_op_info {
  const char *name;
  enum perf_op id;
};

/* What differs between the tools in parsing and printing; static, never freed. */
struct perf_tool {
  const char *name;            /* program name in messages: "chorus-perf" */
  const char *algo;            /* "algo" column of the header and JSON */
  const char *about;           /* usage lines after the first, each ending in '\n' */
  const char *coll_help;       /* usage lines of -c, each ending in '\n' */
  const char *op_help;         /* appended to the -o usage line (may hold '\n') */
  const char *unavailable_fmt; /* usage error for an unavailable collective, one %s */
  bool half;                   /* float16 and bfloat16 are offered */
};

struct perf_options {
  const struct perf_coll_info *coll;
  const struct perf_dtype_info *dtype;
  const struct perf_op_info *op;
  size_t minbytes, maxbytes, factor;
  int iters;  /* 0: default per size */
  int warmup; /* -1: default per size */
  bool check, json, inplace;
};

/* One result line: bytes and count as run, time of the slowest rank. */
struct perf_row {
  size_t bytes, count;
  double time_us, algbw, busbw;
  int64_t wrong; /* -1: not checked */
};

/*
 * Check pattern of one (dtype, op, nranks); see perf_common.c. expect must
 * hold max(nranks, 13) doubles: the longest period.
 */
struct perf_pattern {
  enum perf_op op;
  int nranks;
  size_t period; /* the pattern repeats every `period` elements */
  int vmax;      /* sum/avg: largest value, 0 for one-hot */
  int p;         /* prod: period of the factors of 2 */
};

struct perf_pattern perf_pattern_make(const struct perf_dtype_info *dt, enum perf_op op,
                                      int nranks);
/* expect[j] = the exact result at every element i with i % period == j. */
void perf_pattern_expect(const struct perf_pattern *pt, const struct perf_dtype_info *dt,
                         double *expect);
/* Fills buf[0..count) with rank's inputs. */
void perf_pattern_fill(const struct perf_pattern *pt, const struct perf_dtype_info *dt, int rank,
                       void *buf, size_t count);
/* Returns how many of buf[0..count) differ from expect. */
uint64_t perf_pattern_count_wrong(const struct perf_pattern *pt, const struct perf_dtype_info *dt,
                                  const double *expect, const void *buf, size_t count);

/* Default timed and warmup calls for a size when -n / -w are not given. */
int perf_default_iters(size_t bytes);
int perf_default_warmup(size_t bytes);

/* True when the launcher's environment names a rank other than 0. */
bool perf_env_says_not_rank0(void);

/*
 * Parses the command line into *opt. Returns true to run; false to leave with
 * *exit_code (0 after --help, PERF_EXIT_USAGE after a usage error, reported on
 * stderr by rank 0 only).
 */
bool perf_parse_args(const struct perf_tool *tool, int argc, char **argv, struct perf_options *opt,
                     int *exit_code);

/* Table header; version is printed right after the tool's name. */
void perf_print_header(const struct perf_tool *tool, const struct perf_options *opt,
                       const char *version, int nranks, const char *provider);
/* One row of the table, or one JSON object with --json; flushes stdout. */
void perf_print_row(const struct perf_tool *tool, const struct perf_options *opt, int nranks,
                    const char *provider, const struct perf_row *r);
/* The closing lines of the table (nothing with --json). */
void perf_print_footer(const struct perf_options *opt, int rows, double busbw_sum,
                       int64_t wrong_total);

/* Seconds on the monotonic clock. */
double perf_now_s(void);

#endif
