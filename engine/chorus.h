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
 *    calls advance while the caller computes (a small collective is first
 *    driven by its caller for a short while, and may be complete on return).
 *    chorus_comm_abort() may be called from any thread.
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
 * ---- Rendezvous through the caller's own channel (NCCL's unique id) ----
 * For launchers and frameworks with a key-value store of their own (the
 * PyTorch backend uses torch's c10d store): the process that will be rank 0
 * calls chorus_get_unique_id(), hands the bytes to every rank through that
 * channel (a store, MPI_Bcast, a file), and every rank, rank 0 included,
 * calls chorus_comm_init_rank() with them.
 *
 * chorus_get_unique_id() makes rank 0's rendezvous listener at once, on a
 * port the kernel picks (so it never collides with the launcher's ports),
 * bound to one address only: CHORUS_RENDEZVOUS_ADDR when set, else
 * MASTER_ADDR when it is an address of this host, else the first up
 * non-loopback IPv4 interface (or the one CHORUS_SOCK_IFACE names), else
 * 127.0.0.1 (a host name binds every interface, as it may resolve to a
 * loopback address locally). The id carries that address and a fresh random
 * job token, so only holders of the id can join. The listener belongs to the first communicator
 * that rank 0 of this process creates from the id and closes once the ranks have met;
 * chorus_unique_id_release() closes one never used. An id serves one communicator.
 */
#define CHORUS_UNIQUE_ID_BYTES 256
typedef struct chorus_unique_id {
  char internal[CHORUS_UNIQUE_ID_BYTES];
} chorus_unique_id;

/* Per-communicator options; zero fields take the environment's value. */
typedef struct chorus_init_opts {
  size_t struct_size;       /* sizeof(chorus_init_opts): set it (the struct may grow) */
  double timeout_s;         /* CHORUS_TIMEOUT: a collective stuck this long fails everywhere */
  double connect_timeout_s; /* CHORUS_CONNECT_TIMEOUT: forming the communicator */
} chorus_init_opts;

CHORUS_API chorus_result chorus_get_unique_id(chorus_unique_id *id);
/* Close the listener of an id that no communicator used (a no-op for an id
 * already used, or made by another process). */
CHORUS_API chorus_result chorus_unique_id_release(const chorus_unique_id *id);
/* Create a communicator of `size` ranks from an id (opts may be NULL).
 * Collective over the `size` ranks; fails with CHORUS_ERR_INVALID_ARG when
 * the bytes are not an id. */
CHORUS_API chorus_result chorus_comm_init_rank(chorus_comm_t **comm, int size,
                                               const chorus_unique_id *id, int rank,
                                               const chorus_init_opts *opts);
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
/*
 * ---- Failures, hangs and divergence ----
 * Every call is stamped with a sequence number and a fingerprint (kind,
 * dtype, count, root, op, algorithm) that its messages carry: a rank whose
 * call differs fails at the first message with CHORUS_ERR_MISMATCH (other
 * arguments) or CHORUS_ERR_DIVERGED (another collective), naming both calls
 * and ranks. A watchdog (rank 0's rendezvous server, fed by every rank's
 * heartbeats) also catches what no message shows: a rank that skipped a
 * call or left (DIVERGED), a dead or frozen rank (PEER_LOST, at once for a
 * dead process, within CHORUS_PEER_TIMEOUT for a frozen one), a call stuck
 * past CHORUS_TIMEOUT (TIMEOUT, naming the rank the others wait for). Then
 * the communicator fails as a whole: every pending call returns the code,
 * with chorus_comm_last_error() naming the culprit, and so does every later
 * call; chorus_comm_destroy() still releases everything (without waiting
 * for peers). With CHORUS_TRACE_DIR set, each rank first writes a dump
 * there, for `chorus-trace DIR`. CHORUS_TRACE=0 turns all of this off.
 */
/* Fail comm at once on this rank (any thread, even while another thread
 * waits in a call on it): every pending and later call returns
 * CHORUS_ERR_ABORTED; the watchdog passes the failure on to the other
 * ranks. Destroy the communicator afterwards. */
CHORUS_API chorus_result chorus_comm_abort(chorus_comm_t *comm);
/* *error: the failure of comm as a whole (a verdict reached in the
 * background, an abort), CHORUS_SUCCESS when none; its explanation is
 * then in chorus_comm_last_error(). */
CHORUS_API chorus_result chorus_comm_get_async_error(chorus_comm_t *comm, chorus_result *error);
/* Write this rank's trace dump (checkpoint, pending steps, journal) into
 * dir (NULL: CHORUS_TRACE_DIR) as one file; rank 0's clock offset makes
 * the ranks' files comparable. SIGUSR1 does the same for every
 * communicator with a watchdog when CHORUS_TRACE_DIR is set. */
CHORUS_API chorus_result chorus_comm_dump(chorus_comm_t *comm, const char *dir);
/* After a failure: a new communicator of the ranks still alive (all but
 * those the watchdog's verdict declared lost), in their old order, without
 * a new rendezvous (collective over the survivors; every one calls it).
 * comm stays failed: destroy it afterwards. The new communicator has no
 * watchdog of its own (rank 0's server may be gone): fingerprints still
 * catch mismatched calls; a later loss there shows as a transport error.
 * CHORUS_ERR_UNSUPPORTED for in-process jobs. */
CHORUS_API chorus_result chorus_comm_shrink(chorus_comm_t *comm, chorus_comm_t **newcomm);

/* Name of the algorithm the last collective call on comm runs ("ring",
 * "tree", ...; "" before any), for logs and benchmarks. Never NULL. */
CHORUS_API const char *chorus_comm_last_algorithm(const chorus_comm_t *comm);
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
 * ---- The other collectives ----
 * Counts are in elements of `dtype`, as in NCCL. Every rank passes the same
 * count, dtype, op and root; ranks that pass different ones fail with
 * CHORUS_ERR_MISMATCH where that can be detected. Results are bitwise
 * identical on every rank. Each blocking call has a nonblocking twin
 * (chorus_i...) that returns a request for chorus_test/chorus_wait.
 *
 *   bcast           root's sendbuf[count] -> recvbuf[count] on every rank
 *                   (sendbuf is read on the root only; sendbuf == recvbuf on
 *                   the root is in place)
 *   reduce          sendbuf[count] -> recvbuf[count] on the root (recvbuf is
 *                   ignored elsewhere and may be NULL there)
 *   allgather       sendbuf[count] -> recvbuf[nranks*count], block r from
 *                   rank r; in place when sendbuf == recvbuf + rank*count
 *   reduce_scatter  sendbuf[nranks*count] -> recvbuf[count], block `rank` of
 *                   the reduction; in place when recvbuf == sendbuf + rank*count
 *   alltoall        sendbuf[nranks*count] -> recvbuf[nranks*count]: block p of
 *                   the send buffer goes to rank p and arrives in its block
 *                   `rank` (no in-place form)
 *   gather          sendbuf[count] -> recvbuf[nranks*count] on the root
 *   scatter         root's sendbuf[nranks*count] -> recvbuf[count]
 *   barrier         returns once every rank entered it
 *   send / recv     point to point, matched in call order per (peer, comm),
 *                   whatever collectives run meanwhile; peer may not be the
 *                   caller itself; count 0 moves nothing
 * A buffer a rank ignores (the root-only ones above) is never touched there.
 * Overlapping send and receive buffers other than the in-place forms fail
 * with CHORUS_ERR_INVALID_ARG.
 */
CHORUS_API chorus_result chorus_bcast(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                      size_t count, chorus_dtype dtype, int root);
CHORUS_API chorus_result chorus_ibcast(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                       size_t count, chorus_dtype dtype, int root,
                                       chorus_request_t **req);
CHORUS_API chorus_result chorus_reduce(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                       size_t count, chorus_dtype dtype, chorus_op op, int root);
CHORUS_API chorus_result chorus_ireduce(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                        size_t count, chorus_dtype dtype, chorus_op op, int root,
                                        chorus_request_t **req);
CHORUS_API chorus_result chorus_allgather(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, chorus_dtype dtype);
CHORUS_API chorus_result chorus_iallgather(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                           size_t count, chorus_dtype dtype,
                                           chorus_request_t **req);
CHORUS_API chorus_result chorus_reduce_scatter(chorus_comm_t *comm, const void *sendbuf,
                                               void *recvbuf, size_t count, chorus_dtype dtype,
                                               chorus_op op);
CHORUS_API chorus_result chorus_ireduce_scatter(chorus_comm_t *comm, const void *sendbuf,
                                                void *recvbuf, size_t count, chorus_dtype dtype,
                                                chorus_op op, chorus_request_t **req);
CHORUS_API chorus_result chorus_alltoall(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                         size_t count, chorus_dtype dtype);
CHORUS_API chorus_result chorus_ialltoall(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, chorus_dtype dtype, chorus_request_t **req);
CHORUS_API chorus_result chorus_gather(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                       size_t count, chorus_dtype dtype, int root);
CHORUS_API chorus_result chorus_igather(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                        size_t count, chorus_dtype dtype, int root,
                                        chorus_request_t **req);
CHORUS_API chorus_result chorus_scatter(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                        size_t count, chorus_dtype dtype, int root);
CHORUS_API chorus_result chorus_iscatter(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                         size_t count, chorus_dtype dtype, int root,
                                         chorus_request_t **req);
CHORUS_API chorus_result chorus_barrier(chorus_comm_t *comm);
CHORUS_API chorus_result chorus_ibarrier(chorus_comm_t *comm, chorus_request_t **req);
CHORUS_API chorus_result chorus_send(chorus_comm_t *comm, const void *buf, size_t count,
                                     chorus_dtype dtype, int peer);
CHORUS_API chorus_result chorus_isend(chorus_comm_t *comm, const void *buf, size_t count,
                                      chorus_dtype dtype, int peer, chorus_request_t **req);
CHORUS_API chorus_result chorus_recv(chorus_comm_t *comm, void *buf, size_t count,
                                     chorus_dtype dtype, int peer);
CHORUS_API chorus_result chorus_irecv(chorus_comm_t *comm, void *buf, size_t count,
                                      chorus_dtype dtype, int peer, chorus_request_t **req);

/*
 * Fused allreduce of nbufs buffers (gradient bucketing, as DDP does): one
 * schedule reduces them all, in place when sendbufs[i] == recvbufs[i].
 * Every rank passes the same counts in the same order. Receive buffers must
 * not overlap each other nor another index's send buffer; buffers of count
 * 0 may be NULL. One request covers the whole call.
 */
CHORUS_API chorus_result chorus_allreduce_multi(chorus_comm_t *comm, const void *const *sendbufs,
                                                void *const *recvbufs, const size_t *counts,
                                                int nbufs, chorus_dtype dtype, chorus_op op);
CHORUS_API chorus_result chorus_iallreduce_multi(chorus_comm_t *comm, const void *const *sendbufs,
                                                 void *const *recvbufs, const size_t *counts,
                                                 int nbufs, chorus_dtype dtype, chorus_op op,
                                                 chorus_request_t **req);

/*
 * Grouped calls (per thread, may nest): between chorus_group_start() and the
 * matching chorus_group_end(), collective and point-to-point calls on any
 * communicator are queued, not started; blocking calls return at once. The
 * outermost chorus_group_end() starts them all together (so a send and a
 * receive between two ranks cannot deadlock) and waits for all of them; it
 * returns the first failure. Requests from nonblocking calls inside a group
 * stay valid and complete as usual; until the outermost group_end they can
 * be tested (not done) but not waited for (CHORUS_ERR_INVALID_REQUEST).
 * The buffers of every queued call, blocking ones included, must stay valid
 * until that group_end returns. A call that fails its argument checks
 * returns the error at once and queues nothing; group_end returns it too.
 * Destroying a communicator inside a group fails its queued calls
 * (CHORUS_ERR_INVALID_COMM) and frees their requests. group_end without a
 * group is CHORUS_ERR_INVALID_ARG.
 */
CHORUS_API chorus_result chorus_group_start(void);
CHORUS_API chorus_result chorus_group_end(void);

/*
 * Split a communicator (collective over `comm`): ranks passing the same
 * color form a new communicator, ordered by key, then by rank in `comm`.
 * color CHORUS_SPLIT_NONE (negative) joins none: *newcomm is set to NULL.
 */
#define CHORUS_SPLIT_NONE (-1)
CHORUS_API chorus_result chorus_comm_split(chorus_comm_t *comm, int color, int key,
                                           chorus_comm_t **newcomm);

/*
 * Memory that peers on the same host can map: allreduce and the other
 * collectives over buffers from chorus_mem_alloc skip one copy on shm
 * (peers read the data in place instead of through the kernel). Any buffer
 * works with every call. When a host's ranks outnumber its cores, calls of
 * up to CHORUS_SHM_BOUNCE bytes go through bounce slots from either kind
 * (a sender whose data is read in place waits for the receiver to run).
 * Freed with chorus_mem_free.
 */
CHORUS_API chorus_result chorus_mem_alloc(void **ptr, size_t bytes);
CHORUS_API chorus_result chorus_mem_free(void *ptr);

/*
 * Test a request: *done is set to 1 when it finished (the request is then
 * released and *req set to NULL; the return value is the operation's
 * result), else 0 and CHORUS_SUCCESS.
 */
CHORUS_API chorus_result chorus_test(chorus_request_t **req, int *done);
/* Wait for a request to finish, sleeping (not spinning) while idle; releases
 * it, sets *req to NULL and returns the operation's result. */
CHORUS_API chorus_result chorus_wait(chorus_request_t **req);

/*
 * ---- Completing requests from another thread ----
 * For frameworks that complete their operations on a thread of their own
 * (the PyTorch backend's futures). Unlike every other call on a
 * communicator, these two may run while another thread makes calls on the
 * same communicator; the request must stay unreleased until they return.
 *
 * chorus_wait_for: wait up to timeout_s seconds (negative: no limit; 0:
 * just look) for req to finish, driving the communicator as chorus_wait
 * does, without releasing it: *done is 1 once it finished (chorus_test
 * then releases it and returns its result), else 0. Several threads may
 * wait on one request at once.
 * chorus_comm_wait_any: sleep, without driving comm, until some request
 * of comm finishes or timeout_s (negative: no limit) passes; it may also
 * return early. The caller then tests its requests.
 */
CHORUS_API chorus_result chorus_wait_for(chorus_request_t *req, double timeout_s, int *done);
CHORUS_API chorus_result chorus_comm_wait_any(chorus_comm_t *comm, double timeout_s);

#ifdef __cplusplus
}
#endif
#endif /* CHORUS_H */
