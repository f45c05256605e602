/*
 * mpi-perf - the chorus-perf benchmark over MPI, for comparisons.
 *
 *   mpirun -np 4 mpi-perf -c allreduce -b 8 -e 64M -f 4 -d float32 -o sum --check
 *
 * Same options (less --algo), sizes, check patterns, run loop and output
 * (table or --json, with "provider": "openmpi" or "mpich") as tools/chorus-perf.c, so
 * that results compare line by line: both take them from
 * tools/perf_common.c; this file only maps each collective to MPI:
 *
 *   allreduce MPI_Allreduce      allgather MPI_Allgather   gather  MPI_Gather
 *   bcast     MPI_Bcast          reduce_scatter            scatter MPI_Scatter
 *   reduce    MPI_Reduce           MPI_Reduce_scatter_block barrier MPI_Barrier
 *   alltoall  MPI_Alltoall       sendrecv MPI_Sendrecv (to rank+1, from rank-1)
 *
 * Where Chorus's conventions differ, the call does what Chorus's does, inside
 * the timed call: out-of-place bcast copies sendbuf to recvbuf on the root
 * (MPI_Bcast has one buffer); in-place reduce_scatter moves the block MPI
 * leaves at the start of the buffer to rank*count; MPI has no avg: it is
 * MPI_SUM followed by a local division by the number of ranks (truncating for
 * integer types). float16/bfloat16 are not offered.
 */
#include <mpi.h>

#include "perf_common.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PERF_NAME "mpi-perf"
/* The MPI picks its algorithm itself (Open MPI: coll/tuned's decision rules). */
#define PERF_ALGO "default"
/* Which MPI this binary was built against, as "provider" in its output. */
#if defined(OPEN_MPI)
#define PERF_PROVIDER "openmpi"
#elif defined(MPICH)
#define PERF_PROVIDER "mpich"
#else
#define PERF_PROVIDER "mpi"
#endif

static const struct perf_tool tool = {
    .name = PERF_NAME,
    .algo = PERF_ALGO,
    .about = "Benchmark MPI collectives over every rank of MPI_COMM_WORLD (launch with\n"
             "mpirun); rank 0 prints the results. The chorus-perf benchmark, over MPI.\n",
    .op_help = ";\n"
               "                         avg is MPI_SUM then a local division, timed with the call",
    .algo_help = NULL,
    .algo_missing =
        "--algo '%s' is not available in " PERF_NAME ": Open MPI picks its algorithms itself",
    .half = false,
    .mem_lib = "MPI_Alloc_mem",
    .mem_help = "                         MPI_Alloc_mem\n",
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

/* ---- the backend ---- */

struct mpi_ctx {
  int rank, nranks;
  char msg[MPI_MAX_ERROR_STRING + 32]; /* strerror's answer */
};

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

/* reduce_scatter in place: MPI reads the whole buffer (recvbuf - rank*count)
 * and leaves the block at its start; Chorus leaves it at rank*count. */
static int reduce_scatter(const struct mpi_ctx *x, const struct perf_call *c, MPI_Datatype t,
                          MPI_Op op) {
  size_t block = c->count * c->dtype->size * (size_t)x->rank;
  int n = (int)c->count, rc;
  if (!c->inplace)
    return MPI_Reduce_scatter_block(c->sendbuf, c->recvbuf, n, t, op, MPI_COMM_WORLD);
  rc = MPI_Reduce_scatter_block(MPI_IN_PLACE, (unsigned char *)c->recvbuf - block, n, t, op,
                                MPI_COMM_WORLD);
  if (rc == MPI_SUCCESS && block)
    memmove(c->recvbuf, (unsigned char *)c->recvbuf - block, c->count * c->dtype->size);
  return rc;
}

static int mpi_call(void *ctx, const struct perf_call *c) {
  struct mpi_ctx *x = ctx;
  MPI_Datatype t = c->coll->layout == PERF_LAYOUT_NONE ? MPI_BYTE : mpi_dtype(c->dtype->id);
  MPI_Op op = mpi_op(c->op);
  MPI_Comm w = MPI_COMM_WORLD;
  void *sb = (void *)c->sendbuf; /* MPI-3 takes const; older headers do not */
  int n = (int)c->count, rc;
  bool avg = c->coll->reduces && c->op == PERF_AVG;
  switch (c->coll->id) {
  case PERF_ALLREDUCE:
    rc = MPI_Allreduce(c->inplace ? MPI_IN_PLACE : sb, c->recvbuf, n, t, op, w);
    if (rc == MPI_SUCCESS && avg)
      avg_divide(c->dtype, c->recvbuf, c->count, x->nranks);
    return rc;
  case PERF_BCAST:
    if (c->inplace || x->rank != c->root)
      return MPI_Bcast(c->recvbuf, n, t, c->root, w);
    rc = MPI_Bcast(sb, n, t, c->root, w);
    if (rc == MPI_SUCCESS)
      memcpy(c->recvbuf, c->sendbuf, c->count * c->dtype->size);
    return rc;
  case PERF_REDUCE:
    rc = MPI_Reduce(sb, c->recvbuf, n, t, op, c->root, w);
    if (rc == MPI_SUCCESS && avg && x->rank == c->root)
      avg_divide(c->dtype, c->recvbuf, c->count, x->nranks);
    return rc;
  case PERF_ALLGATHER:
    if (c->inplace)
      return MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, c->recvbuf, n, t, w);
    return MPI_Allgather(sb, n, t, c->recvbuf, n, t, w);
  case PERF_REDUCE_SCATTER:
    rc = reduce_scatter(x, c, t, op);
    if (rc == MPI_SUCCESS && avg)
      avg_divide(c->dtype, c->recvbuf, c->count, x->nranks);
    return rc;
  case PERF_ALLTOALL:
    return MPI_Alltoall(sb, n, t, c->recvbuf, n, t, w);
  case PERF_GATHER:
    return MPI_Gather(sb, n, t, c->recvbuf, n, t, c->root, w);
  case PERF_SCATTER:
    return MPI_Scatter(sb, n, t, c->recvbuf, n, t, c->root, w);
  case PERF_BARRIER:
    return MPI_Barrier(w);
  case PERF_SENDRECV:
    return MPI_Sendrecv(sb, n, t, (x->rank + 1) % x->nranks, 0, c->recvbuf, n, t,
                        (x->rank + x->nranks - 1) % x->nranks, 0, w, MPI_STATUS_IGNORE);
  default:
    return MPI_ERR_OP;
  }
}

static int mpi_max_double(void *ctx, double *v) {
  (void)ctx;
  return MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
}

static int mpi_sum_int64(void *ctx, int64_t *v) {
  (void)ctx;
  return MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
}

static const char *mpi_err(void *ctx, int rc) {
  struct mpi_ctx *x = ctx;
  int len = 0;
  if (MPI_Error_string(rc, x->msg, &len) != MPI_SUCCESS)
    snprintf(x->msg, sizeof(x->msg), "MPI error %d", rc);
  return x->msg;
}

static const char *mpi_algo(void *ctx) {
  (void)ctx;
  return PERF_ALGO;
}

static void mpi_die(void *ctx) {
  (void)ctx;
  MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

int main(int argc, char **argv) {
  struct perf_options opt;
  struct mpi_ctx ctx = {0};
  struct perf_backend be = {.version = NULL,
                            .provider = PERF_PROVIDER,
                            .call = mpi_call,
                            .max_double = mpi_max_double,
                            .sum_int64 = mpi_sum_int64,
                            .strerror = mpi_err,
                            .last_algo = mpi_algo,
                            .abort = mpi_die,
                            .ctx = &ctx};
  unsigned char *sendbuf = NULL, *recvbuf = NULL;
  size_t maxcount, bufbytes;
  int exit_code, rc;

  if (!perf_parse_args(&tool, argc, argv, &opt, &exit_code))
    return exit_code;
  maxcount = opt.maxbytes / opt.dtype->size;
  if (maxcount > INT_MAX) {
    if (!perf_env_says_not_rank0())
      fprintf(stderr, PERF_NAME ": -e is too large: MPI counts are int (at most %d elements)\n",
              INT_MAX);
    return PERF_EXIT_USAGE;
  }
  /* --offset: each buffer is that much longer and used from there on */
  bufbytes = maxcount * opt.dtype->size + opt.offset;
  /* Plain buffers come first, before MPI_Init, as in chorus-perf; MPI_Alloc_mem
   * needs MPI, and a rank it fails on ends the job (the others would wait). */
  if (opt.mem == PERF_MEM_PLAIN) {
    if (posix_memalign((void **)&sendbuf, 4096, bufbytes) ||
        posix_memalign((void **)&recvbuf, 4096, bufbytes)) {
      fprintf(stderr, PERF_NAME ": cannot allocate 2 x %zu bytes of buffers\n", bufbytes);
      free(sendbuf);
      return 1;
    }
  }

  rc = MPI_Init(&argc, &argv);
  if (rc != MPI_SUCCESS) {
    fprintf(stderr, PERF_NAME ": MPI_Init failed (%d)\n", rc);
    exit_code = 1;
    goto out_free_bufs;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (opt.mem == PERF_MEM_LIB &&
      ((rc = MPI_Alloc_mem((MPI_Aint)bufbytes, MPI_INFO_NULL, &sendbuf)) != MPI_SUCCESS ||
       (rc = MPI_Alloc_mem((MPI_Aint)bufbytes, MPI_INFO_NULL, &recvbuf)) != MPI_SUCCESS)) {
    fprintf(stderr, PERF_NAME ": MPI_Alloc_mem(%zu) failed (%d)\n", bufbytes, rc);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  memset(sendbuf, 0, bufbytes);
  memset(recvbuf, 0, bufbytes);
  MPI_Comm_rank(MPI_COMM_WORLD, &ctx.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ctx.nranks);
  be.version = mpi_version();
  be.rank = ctx.rank;
  be.nranks = ctx.nranks;

  exit_code = perf_run(&tool, &be, &opt, sendbuf + opt.offset, recvbuf + opt.offset);

  if (opt.mem == PERF_MEM_LIB) {
    MPI_Free_mem(recvbuf);
    MPI_Free_mem(sendbuf);
    recvbuf = sendbuf = NULL;
  }
  MPI_Finalize();
out_free_bufs:
  free(recvbuf);
  free(sendbuf);
  return exit_code;
}
