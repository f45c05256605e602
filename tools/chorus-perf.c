/*
 * chorus-perf - nccl-tests style benchmark of Chorus collectives.
 *
 *   chorus-run -n 4 -- chorus-perf -c allreduce -b 8 -e 64M -f 4 -d float32 -o sum --check
 *
 * Every rank runs the same sweep of message sizes: -b, -b*f, -b*f^2 ... up to
 * -e. Per size: warmup calls, a synchronising call, timed calls. The time of a
 * size is the mean per call of the slowest rank (its local mean, reduced with
 * MAX over ranks). Bandwidths use the definitions of nccl-tests
 * (doc/PERFORMANCE.md there), in GB/s of 1e9 bytes:
 *
 *   algbw = bytes / time
 *   busbw = algbw * factor(n)      allreduce 2(n-1)/n, broadcast/reduce 1,
 *                                  allgather/reduce_scatter/alltoall (n-1)/n
 *
 * With --check one more call per size runs on inputs whose exact result is
 * known (see "check patterns" in perf_common.c); "#wrong" is the SUM over
 * ranks of the elements that differ from it.
 *
 * tools/mpi-perf.c is the same program over MPI_Allreduce. Options, defaults,
 * patterns and output live in tools/perf_common.c so that their results
 * compare line by line; scripts/bench-vs-mpi.sh relies on it. Keep the run
 * loops in step.
 */
#include "chorus.h"

#include "perf_common.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PERF_NAME "chorus-perf"
/* The only allreduce algorithm so far; the API does not name the one it picked yet. */
#define PERF_ALGO "ring"

static const struct perf_tool tool = {
    .name = PERF_NAME,
    .algo = PERF_ALGO,
    .about = "Benchmark a collective over every rank of the job (launch with chorus-run,\n"
             "torchrun-style env, Slurm or mpirun); rank 0 prints the results.\n",
    .coll_help = "  -c, --collective NAME  allreduce (default); broadcast, reduce, allgather,\n"
                 "                         reduce_scatter, alltoall are not available yet\n",
    .op_help = "",
    .unavailable_fmt = "collective '%s' is not available yet (only allreduce is)",
    .half = true,
};

static const chorus_dtype dtype_ids[] = {
    [PERF_INT8] = CHORUS_INT8,       [PERF_UINT8] = CHORUS_UINT8,
    [PERF_INT32] = CHORUS_INT32,     [PERF_INT64] = CHORUS_INT64,
    [PERF_FLOAT16] = CHORUS_FLOAT16, [PERF_BFLOAT16] = CHORUS_BFLOAT16,
    [PERF_FLOAT32] = CHORUS_FLOAT32, [PERF_FLOAT64] = CHORUS_FLOAT64,
};

static const chorus_op op_ids[] = {
    [PERF_SUM] = CHORUS_SUM, [PERF_PROD] = CHORUS_PROD, [PERF_MIN] = CHORUS_MIN,
    [PERF_MAX] = CHORUS_MAX, [PERF_AVG] = CHORUS_AVG,
};

/* ---- the run ---- */

static void die_comm(chorus_comm_t *comm, int rank, const char *what, size_t bytes,
                     chorus_result rc) {
  fprintf(stderr, PERF_NAME ": rank %d: %s (%zu bytes) failed: %s: %s\n", rank, what, bytes,
          chorus_strerror(rc), chorus_comm_last_error(comm));
  exit(1);
}

/* Rank 0 alone prints; the others just take part in the reductions. */
static int run(const struct perf_options *opt, chorus_comm_t *comm, int rank, int nranks,
               unsigned char *sendbuf, unsigned char *recvbuf, double *expect) {
  const struct perf_dtype_info *dt = opt->dtype;
  const char *provider = chorus_comm_provider(comm);
  struct perf_pattern pt = perf_pattern_make(dt, opt->op->id, nranks);
  void *rb = opt->inplace ? (void *)sendbuf : (void *)recvbuf; /* the result */
  double busbw_sum = 0.0;
  int64_t wrong_total = 0;
  int rows = 0;
  chorus_result rc;

  if (!provider)
    provider = "unknown";

  perf_pattern_expect(&pt, dt, expect);
  if (rank == 0 && !opt->json)
    perf_print_header(&tool, opt, chorus_version(), nranks, provider);

  /* Start-up warmup, untimed (skipped with -w 0): one call at the largest size
   * touches every buffer and transport path, then a burst of small calls lets
   * freshly started ranks settle before the first size is timed; without it
   * the first size often absorbs milliseconds of start-up noise. */
  if (opt->warmup != 0) {
    size_t maxcount = opt->maxbytes / dt->size;
    size_t mincount = opt->minbytes / dt->size ? opt->minbytes / dt->size : 1;
    perf_pattern_fill(&pt, dt, rank, sendbuf, maxcount);
    rc = chorus_allreduce(comm, sendbuf, rb, maxcount, dtype_ids[dt->id], op_ids[opt->op->id]);
    if (rc)
      die_comm(comm, rank, "start-up warmup allreduce", maxcount * dt->size, rc);
    for (int i = 0; i < 20; i++) {
      rc = chorus_allreduce(comm, sendbuf, rb, mincount, dtype_ids[dt->id], op_ids[opt->op->id]);
      if (rc)
        die_comm(comm, rank, "start-up warmup allreduce", mincount * dt->size, rc);
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
        rc = chorus_allreduce(comm, sendbuf, rb, count, dtype_ids[dt->id], op_ids[opt->op->id]);
        if (rc)
          die_comm(comm, rank, "warmup allreduce", r.bytes, rc);
      }
      /* start the clocks together: nobody leaves this call before all entered it */
      rc = chorus_allreduce(comm, &one, &sync, 1, CHORUS_FLOAT64, CHORUS_MAX);
      if (rc)
        die_comm(comm, rank, "synchronising allreduce", sizeof(one), rc);
      t0 = perf_now_s();
      for (int i = 0; i < iters; i++) {
        rc = chorus_allreduce(comm, sendbuf, rb, count, dtype_ids[dt->id], op_ids[opt->op->id]);
        if (rc)
          die_comm(comm, rank, "timed allreduce", r.bytes, rc);
      }
      local = (perf_now_s() - t0) / iters;
      rc = chorus_allreduce(comm, &local, &slowest, 1, CHORUS_FLOAT64, CHORUS_MAX);
      if (rc)
        die_comm(comm, rank, "allreduce of the timings", sizeof(local), rc);

      if (opt->check) {
        int64_t wrong, wrong_sum;
        perf_pattern_fill(&pt, dt, rank, sendbuf, count);
        if (!opt->inplace)
          memset(recvbuf, 0xff, r.bytes);
        rc = chorus_allreduce(comm, sendbuf, rb, count, dtype_ids[dt->id], op_ids[opt->op->id]);
        if (rc)
          die_comm(comm, rank, "checked allreduce", r.bytes, rc);
        wrong = (int64_t)perf_pattern_count_wrong(&pt, dt, expect, rb, count);
        rc = chorus_allreduce(comm, &wrong, &wrong_sum, 1, CHORUS_INT64, CHORUS_SUM);
        if (rc)
          die_comm(comm, rank, "allreduce of the wrong counts", sizeof(wrong), rc);
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
  chorus_comm_t *comm = NULL;
  unsigned char *sendbuf = NULL, *recvbuf = NULL;
  double *expect = NULL;
  size_t maxcount, bufbytes;
  int exit_code, rank, nranks;
  chorus_result rc;

  if (!perf_parse_args(&tool, argc, argv, &opt, &exit_code))
    return exit_code;

  /* Buffers come first: a rank that cannot allocate must fail before the
   * communicator exists, not leave the others waiting in a collective. */
  maxcount = opt.maxbytes / opt.dtype->size;
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

  rc = chorus_comm_init_from_env(&comm);
  if (rc) {
    fprintf(stderr, PERF_NAME ": chorus_comm_init_from_env failed: %s: %s\n", chorus_strerror(rc),
            chorus_last_error());
    exit_code = 1;
    goto out_free_bufs;
  }
  rc = chorus_comm_rank(comm, &rank);
  if (!rc)
    rc = chorus_comm_size(comm, &nranks);
  if (rc) {
    fprintf(stderr, PERF_NAME ": cannot read rank/size: %s: %s\n", chorus_strerror(rc),
            chorus_comm_last_error(comm));
    exit_code = 1;
    goto out_destroy;
  }
  /* the longest pattern period is nranks (one-hot sums) */
  expect = calloc((size_t)nranks > 13 ? (size_t)nranks : 13, sizeof(*expect));
  if (!expect) {
    fprintf(stderr, PERF_NAME ": rank %d: out of memory\n", rank);
    exit(1); /* the other ranks see this one lost */
  }

  exit_code = run(&opt, comm, rank, nranks, sendbuf, recvbuf, expect);

out_destroy:
  rc = chorus_comm_destroy(comm);
  if (rc) {
    fprintf(stderr, PERF_NAME ": chorus_comm_destroy failed: %s\n", chorus_strerror(rc));
    exit_code = 1;
  }
out_free_bufs:
  free(expect);
  free(recvbuf);
  free(sendbuf);
  return exit_code;
}
