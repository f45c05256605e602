/*
 * chorus.h - the public API of Chorus, a collective-communication engine.
 *
 * Conventions
 *  - Every function returns a chorus_result: CHORUS_SUCCESS (0) or a negative
 *    code. chorus_strerror() names a code; chorus_comm_last_error() gives the
 *    detail of the last failure on a communicator (which rank, which call, why).
 *  - Handles are opaque. The engine never takes ownership of user buffers:
 *    a buffer passed to a nonblocking call must stay valid and untouched until
 *    the request completes.
 *  - Threading: a communicator may be used by one application thread at a
 *    time; each communicator runs its own progress thread, so nonblocking
 *    calls advance while the caller computes. chorus_comm_abort() may be
 *    called from any thread.
 */
#ifndef CHORUS_H
#define CHORUS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(CHORUS_BUILDING_LIBRARY)
#define CHORUS_API __attribute__((visibility("default")))
#else
#define CHORUS_API
#endif

#define CHORUS_VERSION_MAJOR 0
#define CHORUS_VERSION_MINOR 1
#define CHORUS_VERSION_PATCH 0

/* Result codes. 0 is success; errors are negative and stable. */
typedef enum chorus_result {
  CHORUS_SUCCESS = 0,
  CHORUS_ERR_INVALID_ARG = -1, /* a NULL pointer, a bad size, a bad rank */
  CHORUS_ERR_INVALID_DTYPE = -2,
  CHORUS_ERR_INVALID_OP = -3,
  CHORUS_ERR_INVALID_COMM = -4,   /* NULL or already destroyed communicator */
  CHORUS_ERR_COUNT_OVERFLOW = -5, /* count * element size overflows */
  CHORUS_ERR_NO_MEMORY = -6,
  CHORUS_ERR_TRANSPORT = -7, /* the transport (libfabric) failed */
  CHORUS_ERR_BOOTSTRAP = -8, /* rendezvous failed */
  CHORUS_ERR_AUTH = -9,      /* wrong job token */
  CHORUS_ERR_TIMEOUT = -10,
  CHORUS_ERR_PEER_LOST = -11,
  CHORUS_ERR_MISMATCH = -12,
  CHORUS_ERR_DIVERGED = -13,
  CHORUS_ERR_CORRUPT = -14,
  CHORUS_ERR_ABORTED = -15,
  CHORUS_ERR_INTERNAL = -16,
  CHORUS_ERR_UNSUPPORTED = -17,
  CHORUS_ERR_INVALID_REQUEST = -18, /* NULL, freed or foreign request */
  CHORUS_ERR_ENV = -19,             /* launcher environment missing or malformed */
} chorus_result;

typedef enum chorus_dtype {
  CHORUS_INT8 = 0,
  CHORUS_UINT8,
  CHORUS_INT32,
  CHORUS_INT64,
  CHORUS_FLOAT16,
  CHORUS_BFLOAT16,
  CHORUS_FLOAT32,
  CHORUS_FLOAT64,
  CHORUS_DTYPE_COUNT
} chorus_dtype;

typedef enum chorus_op {
  CHORUS_SUM = 0,
  CHORUS_PROD,
  CHORUS_MIN,
  CHORUS_MAX,
  CHORUS_AVG, /* sum then divide by the number of ranks (integer types truncate) */
  CHORUS_OP_COUNT
} chorus_op;

typedef struct chorus_comm chorus_comm_t;
typedef struct chorus_request chorus_request_t;

/* Name of a result code; never NULL. */
CHORUS_API const char *chorus_strerror(chorus_result rc);
/* Name of a dtype/op ("float32", "sum"), or NULL when out of range. */
CHORUS_API const char *chorus_dtype_name(chorus_dtype dtype);
CHORUS_API const char *chorus_op_name(chorus_op op);
/* Size in bytes of one element, 0 when out of range. */
CHORUS_API size_t chorus_dtype_size(chorus_dtype dtype);
/* Version string "major.minor.patch". */
CHORUS_API const char *chorus_version(void);

/*
 * Create a communicator of `size` ranks; this process is `rank`.
 * `rendezvous` is "host:port" of rank 0's rendezvous server (rank 0 listens
 * there). The job token comes from CHORUS_JOB_TOKEN (may be unset for all ranks).
 * Blocks until every rank arrived or CHORUS_CONNECT_TIMEOUT expires; on
 * timeout the message names the ranks that never arrived.
 * On failure *comm is NULL and the detail is in chorus_last_error().
 */
CHORUS_API chorus_result chorus_comm_init(chorus_comm_t **comm, int rank, int size,
                                          const char *rendezvous);
/*
 * Same, with rank, size and rendezvous taken from the launcher's environment:
 * CHORUS_RANK/CHORUS_WORLD_SIZE/CHORUS_RENDEZVOUS, torchrun (RANK, WORLD_SIZE,
 * LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Slurm (SLURM_PROCID, SLURM_NTASKS,
 * SLURM_LOCALID) or Open MPI (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK).
 */
CHORUS_API chorus_result chorus_comm_init_from_env(chorus_comm_t **comm);
/*
 * Destroy a communicator; waits for (or cancels, after an error) what is in
 * flight, then releases everything it owns. Collective: every rank calls it.
 * After it returns the handle is invalid; passing it again returns
 * CHORUS_ERR_INVALID_COMM (never a crash) as long as the memory was not reused.
 */
CHORUS_API chorus_result chorus_comm_destroy(chorus_comm_t *comm);
CHORUS_API chorus_result chorus_comm_rank(const chorus_comm_t *comm, int *rank);
CHORUS_API chorus_result chorus_comm_size(const chorus_comm_t *comm, int *size);
/* Name of the transport in use ("shm", "tcp;ofi_rxm", "inproc"...). */
CHORUS_API const char *chorus_comm_provider(const chorus_comm_t *comm);
/*
 * Detail of the last failure on `comm` (thread-local to nothing: one buffer
 * per communicator, overwritten by the next failure). Never NULL.
 */
CHORUS_API const char *chorus_comm_last_error(const chorus_comm_t *comm);
/* Detail of the last failure that had no communicator (init, bad handle),
 * per thread. Never NULL. */
CHORUS_API const char *chorus_last_error(void);

/*
 * Allreduce `count` elements of `dtype` with `op`. sendbuf == recvbuf means
 * in place. count 0 is a no-op that still validates its arguments.
 * The result is bitwise identical on every rank.
 */
CHORUS_API chorus_result chorus_allreduce(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, chorus_dtype dtype, chorus_op op);
/* Nonblocking allreduce: *req receives a request to test or wait on. */
CHORUS_API chorus_result chorus_iallreduce(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                           size_t count, chorus_dtype dtype, chorus_op op,
                                           chorus_request_t **req);

/*
 * Test a request: *done is set to 1 when it finished (the request is then
 * released and *req set to NULL; the return value is the operation's
 * result), else 0 and CHORUS_SUCCESS.
 */
CHORUS_API chorus_result chorus_test(chorus_request_t **req, int *done);
/* Wait for a request to finish, sleeping (not spinning) while idle; releases
 * it, sets *req to NULL and returns the operation's result. */
CHORUS_API chorus_result chorus_wait(chorus_request_t **req);

#ifdef __cplusplus
}
#endif
#endif /* CHORUS_H */
