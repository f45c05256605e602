/*
 * chorus-perf - nccl-tests style benchmark of Chorus collectives.
 *
 *   chorus-run -n 4 -- chorus-perf -c allreduce -b 8 -e 64M -f 4 -d float32 -o sum --check
 *   chorus-run -n 4 -- chorus-perf -c bcast --root 2 --algo tree -b 1K -e 16M
 *   chorus-run -n 4 -- chorus-perf -c all -e 1M --check --json
 *
 * Every rank runs the same sweep of sizes: -b, -b*f, -b*f^2 ... up to -e,
 * each the whole buffer of the operation as in nccl-tests. Per size: warmup
 * calls, a synchronising call, timed calls. The time of a size is the mean
 * per call of the slowest rank (its local mean, reduced with MAX over ranks).
 * Bandwidths use the definitions of nccl-tests (doc/PERFORMANCE.md there), in
 * GB/s of 1e9 bytes:
 *
 *   algbw = bytes / time
 *   busbw = algbw * factor(n)      allreduce 2(n-1)/n; bcast, reduce, sendrecv 1;
 *                                  allgather, reduce_scatter, alltoall, gather,
 *                                  scatter (n-1)/n
 *
 * With --check one more call per size runs on inputs whose exact result is
 * known (see the patterns in perf_common.c); "#wrong" is the SUM over ranks
 * of the elements that differ from it. The "algo" column is what
 * chorus_comm_last_algorithm names after the timed calls.
 *
 * --algo sets CHORUS_ALGO before the communicator exists: a bare name applies
 * to the one collective of -c ("tree" with -c bcast is "bcast=tree"), a value
 * holding '=' is passed as it is; either goes in front of a CHORUS_ALGO
 * already in the environment.
 *
 * tools/mpi-perf.c is the same program over MPI. Options, sizes, patterns,
 * the run loop and the output live in tools/perf_common.c so that their
 * results compare line by line; scripts/bench-vs-mpi.sh relies on it. This
 * file only maps each collective to its Chorus call.
 */
#include "chorus.h"

#include "perf_common.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PERF_NAME "chorus-perf"

static const struct perf_tool tool = {
    .name = PERF_NAME,
    .algo = "auto",
    .about = "Benchmark collectives over every rank of the job (launch with chorus-run,\n"
             "torchrun-style env, Slurm or mpirun); rank 0 prints the results.\n",
    .op_help = "",
    .algo_help =
        "      --algo NAME        force the algorithm: NAME alone applies to the one\n"
        "                         collective of -c (bcast with tree: bcast=tree);\n"
        "                         or CHORUS_ALGO syntax, e.g. 'allreduce=ring;bcast=tree'\n",
    .algo_missing = "--algo '%s' is not available",
    .half = true,
    .mem_lib = "chorus_mem_alloc",
    .mem_help = "                         chorus_mem_alloc, which ranks of one host map: shm\n"
                "                         peers read the data where it lies (no kernel copy)\n",
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

/* ---- the backend ---- */

struct chorus_ctx {
  chorus_comm_t *comm;
  int rank, nranks;
  char msg[1024]; /* strerror's answer */
};

/* The ring exchange of nccl-tests' sendrecv: to rank+1, from rank-1. */
static int sendrecv(struct chorus_ctx *x, const struct perf_call *c) {
  chorus_dtype t = dtype_ids[c->dtype->id];
  chorus_request_t *sreq = NULL, *rreq = NULL;
  chorus_result rc, rc2;
  rc = chorus_isend(x->comm, c->sendbuf, c->count, t, (x->rank + 1) % x->nranks, &sreq);
  if (rc)
    return rc;
  rc = chorus_irecv(x->comm, c->recvbuf, c->count, t, (x->rank + x->nranks - 1) % x->nranks, &rreq);
  if (!rc)
    rc = chorus_wait(&rreq);
  rc2 = chorus_wait(&sreq);
  return rc ? rc : rc2;
}

static int chorus_call(void *ctx, const struct perf_call *c) {
  struct chorus_ctx *x = ctx;
  chorus_dtype t = dtype_ids[c->dtype->id];
  chorus_op op = op_ids[c->op];
  switch (c->coll->id) {
  case PERF_ALLREDUCE:
    return chorus_allreduce(x->comm, c->sendbuf, c->recvbuf, c->count, t, op);
  case PERF_BCAST:
    return chorus_bcast(x->comm, c->sendbuf, c->recvbuf, c->count, t, c->root);
  case PERF_REDUCE:
    return chorus_reduce(x->comm, c->sendbuf, c->recvbuf, c->count, t, op, c->root);
  case PERF_ALLGATHER:
    return chorus_allgather(x->comm, c->sendbuf, c->recvbuf, c->count, t);
  case PERF_REDUCE_SCATTER:
    return chorus_reduce_scatter(x->comm, c->sendbuf, c->recvbuf, c->count, t, op);
  case PERF_ALLTOALL:
    return chorus_alltoall(x->comm, c->sendbuf, c->recvbuf, c->count, t);
  case PERF_GATHER:
    return chorus_gather(x->comm, c->sendbuf, c->recvbuf, c->count, t, c->root);
  case PERF_SCATTER:
    return chorus_scatter(x->comm, c->sendbuf, c->recvbuf, c->count, t, c->root);
  case PERF_BARRIER:
    return chorus_barrier(x->comm);
  case PERF_SENDRECV:
    return sendrecv(x, c);
  default:
    return CHORUS_ERR_UNSUPPORTED;
  }
}

static int chorus_max_double(void *ctx, double *v) {
  struct chorus_ctx *x = ctx;
  double in = *v;
  return chorus_allreduce(x->comm, &in, v, 1, CHORUS_FLOAT64, CHORUS_MAX);
}

static int chorus_sum_int64(void *ctx, int64_t *v) {
  struct chorus_ctx *x = ctx;
  int64_t in = *v;
  return chorus_allreduce(x->comm, &in, v, 1, CHORUS_INT64, CHORUS_SUM);
}

static const char *chorus_err(void *ctx, int rc) {
  struct chorus_ctx *x = ctx;
  snprintf(x->msg, sizeof(x->msg), "%s: %s", chorus_strerror((chorus_result)rc),
           chorus_comm_last_error(x->comm));
  return x->msg;
}

static const char *chorus_algo(void *ctx) {
  struct chorus_ctx *x = ctx;
  return chorus_comm_last_algorithm(x->comm);
}

/* The other ranks see this one lost. */
static void chorus_die(void *ctx) {
  (void)ctx;
  exit(1);
}

/* --algo into CHORUS_ALGO, ahead of what the environment already says. */
static int set_algo(const struct perf_options *opt) {
  const char *old = getenv("CHORUS_ALGO");
  char val[1024];
  int n;
  if (strchr(opt->algo, '='))
    n = snprintf(val, sizeof(val), "%s", opt->algo);
  else
    n = snprintf(val, sizeof(val), "%s=%s", opt->colls[0]->name, opt->algo);
  if (n >= 0 && (size_t)n < sizeof(val) && old && *old)
    n += snprintf(val + n, sizeof(val) - (size_t)n, ";%s", old);
  if (n < 0 || (size_t)n >= sizeof(val)) {
    fprintf(stderr, PERF_NAME ": --algo is too long\n");
    return -1;
  }
  if (setenv("CHORUS_ALGO", val, 1)) {
    perror(PERF_NAME ": setenv CHORUS_ALGO");
    return -1;
  }
  return 0;
}

/* One buffer of -e bytes, from where --mem says, starting --offset bytes in:
 * *base is what buf_free takes. 0, or -1 after a message. */
static int buf_alloc(const struct perf_options *opt, unsigned char **base, unsigned char **buf,
                     size_t bytes) {
  *buf = NULL;
  if (opt->mem == PERF_MEM_LIB) {
    chorus_result rc = chorus_mem_alloc((void **)base, bytes + opt->offset);
    if (rc) {
      *base = NULL;
      fprintf(stderr, PERF_NAME ": chorus_mem_alloc(%zu) failed: %s: %s\n", bytes + opt->offset,
              chorus_strerror(rc), chorus_last_error());
      return -1;
    }
  } else if (posix_memalign((void **)base, 4096, bytes + opt->offset)) {
    *base = NULL;
    fprintf(stderr, PERF_NAME ": cannot allocate %zu bytes of buffer\n", bytes + opt->offset);
    return -1;
  }
  *buf = *base + opt->offset;
  return 0;
}

static void buf_free(const struct perf_options *opt, unsigned char *base) {
  if (opt->mem == PERF_MEM_LIB)
    (void)chorus_mem_free(base);
  else
    free(base);
}

int main(int argc, char **argv) {
  struct perf_options opt;
  struct chorus_ctx ctx = {0};
  struct perf_backend be = {.call = chorus_call,
                            .max_double = chorus_max_double,
                            .sum_int64 = chorus_sum_int64,
                            .strerror = chorus_err,
                            .last_algo = chorus_algo,
                            .abort = chorus_die,
                            .ctx = &ctx};
  unsigned char *sendbuf = NULL, *recvbuf = NULL, *sendbase = NULL, *recvbase = NULL;
  size_t bufbytes;
  int exit_code;
  chorus_result rc;

  if (!perf_parse_args(&tool, argc, argv, &opt, &exit_code))
    return exit_code;
  if (opt.algo && set_algo(&opt))
    return 1;

  /* Buffers come first: a rank that cannot allocate must fail before the
   * communicator exists, not leave the others waiting in a collective. Every
   * collective's buffers fit in -e bytes each (sizes are whole buffers). */
  bufbytes = opt.maxbytes / opt.dtype->size * opt.dtype->size;
  if (buf_alloc(&opt, &sendbase, &sendbuf, bufbytes) ||
      buf_alloc(&opt, &recvbase, &recvbuf, bufbytes)) {
    buf_free(&opt, sendbase);
    return 1;
  }
  memset(sendbuf, 0, bufbytes);
  memset(recvbuf, 0, bufbytes);

  rc = chorus_comm_init_from_env(&ctx.comm);
  if (rc) {
    fprintf(stderr, PERF_NAME ": chorus_comm_init_from_env failed: %s: %s\n", chorus_strerror(rc),
            chorus_last_error());
    exit_code = 1;
    goto out_free_bufs;
  }
  rc = chorus_comm_rank(ctx.comm, &ctx.rank);
  if (!rc)
    rc = chorus_comm_size(ctx.comm, &ctx.nranks);
  if (rc) {
    fprintf(stderr, PERF_NAME ": cannot read rank/size: %s: %s\n", chorus_strerror(rc),
            chorus_comm_last_error(ctx.comm));
    exit_code = 1;
    goto out_destroy;
  }
  be.version = chorus_version();
  be.provider = chorus_comm_provider(ctx.comm);
  if (!be.provider)
    be.provider = "unknown";
  be.rank = ctx.rank;
  be.nranks = ctx.nranks;

  exit_code = perf_run(&tool, &be, &opt, sendbuf, recvbuf);

out_destroy:
  rc = chorus_comm_destroy(ctx.comm);
  if (rc) {
    fprintf(stderr, PERF_NAME ": chorus_comm_destroy failed: %s\n", chorus_strerror(rc));
    exit_code = 1;
  }
out_free_bufs:
  buf_free(&opt, recvbase);
  buf_free(&opt, sendbase);
  return exit_code;
}
