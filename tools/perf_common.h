/*
 * perf_common - what chorus-perf and mpi-perf share: options, sizes, check
 * patterns, the run loop and the output. Plain C: no Chorus or MPI here, so
 * that the two benchmarks size, time, check and print identically and compare
 * line by line (scripts/bench-vs-mpi.sh relies on it). Each tool maps
 * perf_dtype/perf_op to its library's types, describes itself with a struct
 * perf_tool and lends its library to perf_run through a struct perf_backend.
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

enum perf_coll {
  PERF_ALLREDUCE,
  PERF_BCAST,
  PERF_REDUCE,
  PERF_ALLGATHER,
  PERF_REDUCE_SCATTER,
  PERF_ALLTOALL,
  PERF_GATHER,
  PERF_SCATTER,
  PERF_BARRIER,
  PERF_SENDRECV,
  PERF_COLL_COUNT
};

/*
 * How the size of a row (-b .. -e, the whole buffer of the operation, as in
 * nccl-tests) maps to buffers; c is the count passed to the call, n the
 * number of ranks, and the size is rounded down to whole elements (blocks).
 */
enum perf_layout {
  PERF_LAYOUT_SAME,    /* send c, recv c; size = c (allreduce bcast reduce sendrecv) */
  PERF_LAYOUT_GATHER,  /* send c, recv n*c; size = n*c (allgather gather) */
  PERF_LAYOUT_SCATTER, /* send n*c, recv c; size = n*c (reduce_scatter scatter) */
  PERF_LAYOUT_ALL,     /* send n*c, recv n*c; size = n*c (alltoall) */
  PERF_LAYOUT_NONE,    /* no data, one row of time only (barrier) */
};

struct perf_coll_info {
  const char *name;  /* as CHORUS_ALGO spells it, except sendrecv */
  const char *alias; /* another accepted spelling, or NULL */
  enum perf_coll id;
  enum perf_layout layout;
  double (*bus_factor)(int n); /* busbw = algbw * bus_factor(nranks) */
  bool reduces;                /* takes -o */
  bool rooted;                 /* takes --root */
  bool inplace;                /* has an in-place form */
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
  uint32_t prime;   /* a prime <= exact_max + 1: the modulus of the data patterns */
};

struct perf_op_info {
  const char *name;
  enum perf_op id;
};

/* The largest --offset: buffers stay within their first page's offset. */
#define PERF_OFFSET_MAX 4095
/* A macro's value as a string literal (PERF_STR(PERF_OFFSET_MAX): "4095"). */
#define PERF_STR_(x) #x
#define PERF_STR(x) PERF_STR_(x)

/* Where the tool puts its buffers (--mem). */
enum perf_mem {
  PERF_MEM_PLAIN, /* posix_memalign: memory the library knows nothing of (default) */
  PERF_MEM_LIB,   /* the library's own allocator (perf_tool.mem_lib) */
};

/* What differs between the tools in parsing and printing; static, never freed. */
struct perf_tool {
  const char *name;         /* program name in messages: "chorus-perf" */
  const char *algo;         /* "algo" of the header when --algo is not given */
  const char *about;        /* usage lines after the first, each ending in '\n' */
  const char *op_help;      /* appended to the -o usage line (may hold '\n') */
  const char *algo_help;    /* usage lines of --algo, or NULL: the tool has no --algo */
  const char *algo_missing; /* usage error for --algo when algo_help is NULL */
  bool half;                /* float16 and bfloat16 are offered */
  const char *mem_lib;      /* the allocator of --mem lib, as the header names it, or NULL */
  const char *mem_help;     /* usage lines of --mem lib, each ending in '\n', or NULL */
};

struct perf_options {
  const struct perf_coll_info *colls[PERF_COLL_COUNT]; /* in the order they run */
  int ncolls;
  const struct perf_dtype_info *dtype;
  const struct perf_op_info *op;
  size_t minbytes, maxbytes, factor;
  int iters;        /* 0: default per size */
  int warmup;       /* -1: default per size */
  int root;         /* rooted collectives; checked against the size by perf_run */
  const char *algo; /* --algo as given, or NULL */
  enum perf_mem mem;
  bool check, json, inplace;
  size_t offset; /* --offset: bytes each buffer starts past a page boundary */
  double idle_s; /* --idle: after the sweep, idle this long and report the CPU used (0: no) */
};

/* One result line: bytes and count as run, time of the slowest rank. */
struct perf_row {
  size_t bytes, count;
  double time_us, algbw, busbw;
  int64_t wrong;    /* -1: not checked */
  const char *algo; /* algorithm that ran, never NULL */
};

/*
 * One call as perf_run asks a backend to make it, with the argument
 * conventions of chorus.h: count is the count of the call (per block for the
 * block collectives); in place, sendbuf and recvbuf alias as chorus.h says
 * (allgather: sendbuf == recvbuf + rank*count; reduce_scatter: recvbuf ==
 * sendbuf + rank*count; others: sendbuf == recvbuf). sendrecv sends sendbuf
 * to rank+1 and receives recvbuf from rank-1 (mod n). The backend leaves the
 * result where Chorus would.
 */
struct perf_call {
  const struct perf_coll_info *coll;
  const struct perf_dtype_info *dtype;
  enum perf_op op;
  const void *sendbuf;
  void *recvbuf;
  size_t count;
  int root;
  bool inplace;
};

/* A tool's library, lent to perf_run. Every slot is filled. */
struct perf_backend {
  const char *version;  /* printed after the tool's name */
  const char *provider; /* transport name, never NULL */
  int rank, nranks;
  void *ctx; /* passed back to every function */
  /* Makes one call; 0 or the library's error code. */
  int (*call)(void *ctx, const struct perf_call *c);
  /* In place over every rank: the largest *v / the sum of *v. 0 or an error code. */
  int (*max_double)(void *ctx, double *v);
  int (*sum_int64)(void *ctx, int64_t *v);
  /* Name of an error code of this library; never NULL. */
  const char *(*strerror)(void *ctx, int rc);
  /* Algorithm of the last call; never NULL. */
  const char *(*last_algo)(void *ctx);
  /* Ends the job after a failure on this rank; never returns. */
  void (*abort)(void *ctx);
};

/*
 * Check pattern of the reductions for one (dtype, op, nranks); see
 * perf_common.c. expect must hold max(nranks, 13) doubles: the longest period.
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
/* Returns how many of buf[0..count) differ from the result at global indices
 * first..first+count-1. */
uint64_t perf_pattern_count_wrong(const struct perf_pattern *pt, const struct perf_dtype_info *dt,
                                  const double *expect, const void *buf, size_t first,
                                  size_t count);

/*
 * Data pattern of the collectives that move data without reducing it: the
 * value of element k of rank r's data, (r*A + k) % dt->prime, names the rank
 * and the index it came from (up to the prime) and is exact in the type.
 */
double perf_ident_value(const struct perf_dtype_info *dt, int rank, size_t k);
/* buf[i] = perf_ident_value(dt, rank, first + i), i < count. */
void perf_ident_fill(const struct perf_dtype_info *dt, int rank, size_t first, void *buf,
                     size_t count);

/* Default timed and warmup calls for a size when -n / -w are not given. */
int perf_default_iters(size_t bytes);
int perf_default_warmup(size_t bytes);

/* True when the launcher's environment names a rank other than 0. */
bool perf_env_says_not_rank0(void);

/* The collective called name (or alias), or NULL. */
const struct perf_coll_info *perf_coll_find(const char *name);

/*
 * Parses the command line into *opt. Returns true to run; false to leave with
 * *exit_code (0 after --help, PERF_EXIT_USAGE after a usage error, reported on
 * stderr by rank 0 only).
 */
bool perf_parse_args(const struct perf_tool *tool, int argc, char **argv, struct perf_options *opt,
                     int *exit_code);

/*
 * Runs every collective of opt over the size sweep and prints (rank 0) a
 * table per collective or JSON lines. sendbuf and recvbuf hold opt->maxbytes
 * each. Returns the exit code: 0, 1 on wrong results, PERF_EXIT_USAGE when
 * --root is not a rank. A failed call is reported and ends the job through
 * be->abort.
 */
int perf_run(const struct perf_tool *tool, const struct perf_backend *be,
             const struct perf_options *opt, void *sendbuf, void *recvbuf);

/* Seconds on the monotonic clock. */
double perf_now_s(void);

#endif
