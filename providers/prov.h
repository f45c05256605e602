/*
 * prov.h - the transport interface: one ops table, several implementations.
 *
 *   prov_ofi     libfabric RDM endpoint with tagged messages (shm, tcp, udp,
 *                sockets, verbs...), chosen by name.
 *   prov_inproc  every rank inside one process (unit tests, simulation).
 *
 * Model
 *  - A transport instance is one endpoint of one rank. Peers are numbered
 *    0..n-1 (ranks) after add_peers().
 *  - Messages are tagged (64 bits; bit 63 is reserved for the transports'
 *    own messages and must be 0). A receive names the source peer and the
 *    tag; a message matches only a receive with the same source and tag.
 *    Messages between one pair with distinct tags may complete in any order.
 *  - Operations complete asynchronously: the caller embeds a prov_op in its
 *    own object and gets its `done` callback, from inside progress(), with
 *    status 0 or a negative errno-style code (-ECANCELED after cancel).
 *  - Nothing is thread safe: one thread (the owner's progress thread) calls
 *    every op of an instance. Callbacks may post new operations.
 *  - post_send/post_recv return 0, or -EAGAIN when the provider's queues are
 *    full (drive progress() and retry), or another negative error.
 *
 * Waiting without spinning
 *  progress() never blocks. To sleep, the owner calls arm(): it returns 0
 *  when it is safe to sleep until wait_fd() becomes readable (or a timer
 *  fires), or -EAGAIN when completions are pending (call progress() again).
 *  After waking, the owner calls disarm(). wait_fd() may be -1, meaning the
 *  provider can not wake the owner: sleep on a timer only, with backoff.
 */
#ifndef CHORUS_PROV_H
#define CHORUS_PROV_H

#include <stddef.h>
#include <stdint.h>

typedef struct prov prov_t;
typedef struct prov_op prov_op_t;

/* Completion callback: status 0 or -errno; len = bytes received/sent. */
typedef void (*prov_done_fn)(prov_op_t *op, int status, size_t len);

/* Embedded by the caller in its own object (container_of to get back). */
struct prov_op {
  prov_done_fn done;
  void *internal[4]; /* owned by the provider while the op is posted */
};

/* Settings a transport is opened with. */
typedef struct prov_config {
  const char *name;   /* "shm", "tcp", "udp", "sockets", "verbs", "inproc"... */
  int rank;           /* this endpoint's rank */
  int nranks;         /* ranks in the job */
  const char *job_id; /* unique per job (e.g. the rendezvous token); for names */
  void *inproc_world; /* prov_inproc only: the shared world object */
} prov_config_t;

typedef struct prov_ops {
  size_t size; /* sizeof(prov_ops_t), for versioning */
  const char *name;
  /* Open an endpoint. On failure *out is NULL and a negative code returns;
   * a human-readable reason is written to errbuf (errlen bytes). */
  int (*open)(const prov_config_t *cfg, prov_t **out, char *errbuf, size_t errlen);
  /* This endpoint's address, opaque bytes to be exchanged between ranks.
   * *len in: buffer size; out: bytes used (-ENOSPC if too small). */
  int (*getname)(prov_t *p, void *addr, size_t *len);
  /* Insert all ranks' addresses; addrs[i] of lens[i] bytes is rank i. */
  int (*add_peers)(prov_t *p, const void *const *addrs, const size_t *lens, int n);
  int (*post_send)(prov_t *p, int peer, const void *buf, size_t len, uint64_t tag, prov_op_t *op);
  int (*post_recv)(prov_t *p, int peer, void *buf, size_t len, uint64_t tag, prov_op_t *op);
  /* Cancel a posted op; its callback then runs with -ECANCELED (or its real
   * status if it had already completed). */
  int (*cancel)(prov_t *p, prov_op_t *op);
  /* Drive the provider; runs callbacks. Returns completions delivered (>=0) or <0. */
  int (*progress)(prov_t *p);
  int (*wait_fd)(prov_t *p);
  int (*arm)(prov_t *p);
  void (*disarm)(prov_t *p);
  /* Largest number of receives / sends the caller should keep posted. */
  size_t (*max_posted)(prov_t *p);
  /* Cancels what is posted (callbacks run), then frees everything. */
  void (*close)(prov_t *p);
} prov_ops_t;

struct prov {
  const prov_ops_t *ops;
  const char *name; /* provider in use, e.g. "shm" or "tcp;ofi_rxm" */
  /* Detail of the latest failure seen by this instance (a failed post, an
   * error completion: which peer, tag and the provider's own words), "" if
   * none. Owned by the instance; read it right after the failure (e.g. from
   * the done callback that got status < 0) to log it. */
  const char *last_error;
};

/* Registry. */
extern const prov_ops_t prov_ofi_ops;
extern const prov_ops_t prov_inproc_ops;

/* Open by name: "inproc" -> prov_inproc, anything else -> prov_ofi. */
int prov_open(const prov_config_t *cfg, prov_t **out, char *errbuf, size_t errlen);

/* In-process world shared by the ranks of one simulated job. */
typedef struct prov_inproc_world prov_inproc_world_t;
prov_inproc_world_t *prov_inproc_world_create(int nranks);
void prov_inproc_world_destroy(prov_inproc_world_t *w);

#endif
