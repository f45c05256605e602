/*
 * mpi-perf - the chorus-perf benchmark over MPI_Allreduce, for comparisons.
 *
 *   mpirun -np 4 mpi-perf -b 8 -e 64M -f 4 -d float32 -o sum --check
 *
 * Same options, defaults, check patterns and output (table or --json, with
 * "provider":"openmpi") as tools/chorus-perf.c, so that results compare line
 * by line: both take them from tools/perf_common.c. Only allreduce;
 * float16/bfloat16 are not offered. MPI has no avg: it is MPI_SUM followed by a local division by
 * the number of ranks (truncating for integer types), inside the timed call.
 *
 * Per size: warmup calls, a synchronising call, timed calls. The time of a
 * size is the mean per call of the slowest rank (MAX over ranks). Bandwidths
 * use the definitions of nccl-tests, in GB/s of 1e9 bytes:
 *   algbw = bytes / time,  busbw = algbw * 2(n-1)/n
 * "#wrong" is the SUM over ranks of the elements that differ from the exact
 * result.
 */
#include <mpi.h>

#include "perf_common.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PERF_NAME "mpi-perf"
/* Open MPI picks its algorithm itself (coll/tuned decision rules). */
#define PERF_ALGO "default"
#define PERF_PROVIDER "openmpi"

static const struct perf_tool tool = {
    .name = PERF_NAME,
    .algo = PERF_ALGO,
    .about = "Benchmark MPI_Allreduce over every rank of MPI_COMM_WORLD (launch with\n"
             "mpirun); rank 0 prints the results. The chorus-perf benchmark, over MPI.\n",
    .coll_help = "  -c, --collective NAME  allreduce (default; the only one)\n",
    .op_help = "; avg is MPI_SUM then\n"
               "                         a local division, timed with the call",
    .unavailable_fmt = "collective '%s' is not available in " PERF_NAME " (only allreduce is)",
    .half = false,
};

/* float16 and bfloat16 are not offered (tool.half), so never looked up. */
static MPI_Datatype mpi_dtype(enum perf_dtype id) {
  switch (id) {
  case PERF_INT8:
    return MPI_INT8_T;
  case PERF_UINT8:
    return MPI_UINT8_T;
  case PERF_INT32:
    return MPI_INT32_T;
  case PERF_INT64:
    return MPI_INT64_T;
  case PERF_FLOAT32:
    return MPI_FLOAT;
  default:
    return MPI_DOUBLE;
  }
}

/* MPI_SUM for avg, divided afterwards. */
static MPI_Op mpi_op(enum perf_op id) {
  switch (id) {
  case PERF_PROD:
    return MPI_PROD;
  case PERF_MIN:
    return MPI_MIN;
  case PERF_MAX:
    return MPI_MAX;
  default:
    return MPI_SUM;
  }
}

/* "(Open MPI v4.1.4)": the library's version string up to its first comma, in parentheses. */
static const char *mpi_version(void) {
  static char v[MPI_MAX_LIBRARY_VERSION_STRING + 2];
  int len = 0;
  if (MPI_Get_library_version(v + 1, &len) != MPI_SUCCESS)
    return "(MPI)";
  v[0] = '(';
  v[1 + strcspn(v + 1, ",\n")] = '\0';
  strcat(v, ")");
  return v;
}

/* ---- the run ---- */

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
static void avg_divide(const struct perf_dtype_info *dt, void *buf, size_t count, int nranks) {
  switch (dt->id) {
  case PERF_INT8:
    for (size_t i = 0; i < count; i++)
      ((int8_t *)buf)[i] = (int8_t)(((int8_t *)buf)[i] / nranks);
    break;
  case PERF_UINT8:
    for (size_t i = 0; i < count; i++)
      ((uint8_t *)buf)[i] = (uint8_t)(((uint8_t *)buf)[i] / nranks);
    break;
  case PERF_INT32:
    for (size_t i = 0; i < count; i++)
      ((int32_t *)buf)[i] /= nranks;
    break;
  case PERF_INT64:
    for (size_t i = 0; i < count; i++)
      ((int64_t *)buf)[i] /= nranks;
    break;
  case PERF_FLOAT32:
    for (size_t i = 0; i < count; i++)
      ((float *)buf)[i] /= (float)nranks;
    break;
  default:
    for (size_t i = 0; i < count; i++)
      ((double *)buf)[i] /= (double)nranks;
    break;
  }
}

static int allreduce(const struct perf_options *opt, void *sendbuf, void *recvbuf, size_t count,
                     int nranks) {
  int rc = MPI_Allreduce(sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf, recvbuf, (int)count,
                         mpi_dtype(opt->dtype->id), mpi_op(opt->op->id), MPI_COMM_WORLD);
  if (rc == MPI_SUCCESS && opt->op->id == PERF_AVG)
    avg_divide(opt->dtype, recvbuf, count, nranks);
  return rc;
}

/* Rank 0 alone prints; the others just take part in the reductions. */
static int run(const struct perf_options *opt, int rank, int nranks, unsigned char *sendbuf,
               unsigned char *recvbuf, double *expect) {
  const struct perf_dtype_info *dt = opt->dtype;
  const char *provider = PERF_PROVIDER;
  struct perf_pattern pt = perf_pattern_make(dt, opt->op->id, nranks);
  void *rb = opt->inplace ? (void *)sendbuf : (void *)recvbuf; /* the result */
  double busbw_sum = 0.0;
  int64_t wrong_total = 0;
  int rows = 0, rc;

  perf_pattern_expect(&pt, dt, expect);
  if (rank == 0 && !opt->json)
    perf_print_header(&tool, opt, mpi_version(), nranks, provider);

  /* Start-up warmup, untimed (skipped with -w 0): one call at the largest size
   * touches every buffer and transport path, then a burst of small calls lets
   * freshly started ranks settle before the first size is timed; without it
   * the first size often absorbs milliseconds of start-up noise. */
  if (opt->warmup != 0) {
    size_t maxcount = opt->maxbytes / dt->size;
    size_t mincount = opt->minbytes / dt->size ? opt->minbytes / dt->size : 1;
    perf_pattern_fill(&pt, dt, rank, sendbuf, maxcount);
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
      struct perf_row r = {.bytes = count * dt->size, .count = count, .wrong = -1};
      int iters = opt->iters > 0 ? opt->iters : perf_default_iters(r.bytes);
      int warmup = opt->warmup >= 0 ? opt->warmup : perf_default_warmup(r.bytes);
      double t0, local, slowest, one = 1.0, sync;

      perf_pattern_fill(&pt, dt, rank, sendbuf, count);
      for (int i = 0; i < warmup; i++) {
        rc = allreduce(opt, sendbuf, rb, count, nranks);
        if (rc)
          die_mpi(rank, "warmup allreduce", r.bytes, rc);
      }
      /* start the clocks together, the same way chorus-perf does */
      rc = MPI_Allreduce(&one, &sync, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (rc)
        die_mpi(rank, "synchronising allreduce", sizeof(one), rc);
      t0 = perf_now_s();
      for (int i = 0; i < iters; i++) {
        rc = allreduce(opt, sendbuf, rb, count, nranks);
        if (rc)
          die_mpi(rank, "timed allreduce", r.bytes, rc);
      }
      local = (perf_now_s() - t0) / iters;
      rc = MPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (rc)
        die_mpi(rank, "allreduce of the timings", sizeof(local), rc);

      if (opt->check) {
        int64_t wrong, wrong_sum;
        perf_pattern_fill(&pt, dt, rank, sendbuf, count);
        if (!opt->inplace)
          memset(recvbuf, 0xff, r.bytes);
        rc = allreduce(opt, sendbuf, rb, count, nranks);
        if (rc)
          die_mpi(rank, "checked allreduce", r.bytes, rc);
        wrong = (int64_t)perf_pattern_count_wrong(&pt, dt, expect, rb, count);
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
        perf_print_row(&tool, opt, nranks, provider, &r);
    }
    if (bytes > opt->maxbytes / opt->factor || opt->factor < 2)
      break;
    bytes *= opt->factor;
  }

  if (rank == 0)
    perf_print_footer(opt, rows, busbw_sum, wrong_total);
  return wrong_total ? 1 : 0;
}

int main(int argc, char **argv) {
  struct perf_options opt;
  unsigned char *sendbuf = NULL, *recvbuf = NULL;
  double *expect = NULL;
  size_t maxcount, bufbytes;
  int exit_code, rank, nranks, rc;

  if (!perf_parse_args(&tool, argc, argv, &opt, &exit_code))
    return exit_code;
  maxcount = opt.maxbytes / opt.dtype->size;
  if (maxcount > INT_MAX) {
    if (!perf_env_says_not_rank0())
      fprintf(stderr, PERF_NAME ": -e is too large: MPI counts are int (at most %d elements)\n",
              INT_MAX);
    return PERF_EXIT_USAGE;
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
