/*
 * algos.h - collective algorithms: pure functions from a collective's shape
 * (rank, nranks, count, chunking, topology) to this rank's plan (plan.h).
 *
 * One file per algorithm under engine/plan/algos/. An algorithm calls no
 * transport and keeps no state, so the same builder serves the engine, the
 * in-process simulator (sim.h) and chorus-plan. Every algorithm must give
 * bitwise-identical results on all ranks: each element is reduced in one
 * order, by one rank, and then copied.
 *
 * Buffer conventions (counts in elements, as NCCL):
 *   ALLREDUCE       send[count]            -> recv[count]
 *   BCAST           root: send[count]      -> recv[count] on every rank
 *   REDUCE          send[count]            -> root: recv[count]
 *   ALLGATHER       send[count]            -> recv[nranks*count] (block r from rank r)
 *   REDUCE_SCATTER  send[nranks*count]     -> recv[count] (block r of the reduction)
 *   ALLTOALL        send[nranks*count]     -> recv[nranks*count] (send block p goes to
 *                                             rank p, arrives as its block r)
 *   GATHER          send[count]            -> root: recv[nranks*count]
 *   SCATTER         root: send[nranks*count] -> recv[count]
 *   BARRIER         nothing
 *   SEND / RECV     send[count] to peer `root` / recv[count] from peer `root`
 * In place (args.inplace): ALLREDUCE/BCAST/REDUCE send == recv; ALLGATHER
 * send == recv + rank*count; REDUCE_SCATTER recv == send + rank*count;
 * GATHER (root) send == recv + root*count; SCATTER (root) recv == send +
 * root*count. Plans for in-place calls must not COPY a range onto itself.
 *
 * Message numbers (plan.h) must stay below ALGO_MAX_MSGS (2^23; the top bit
 * of the 24-bit tag field marks point-to-point traffic); an algorithm fails
 * with -E2BIG rather than wrap.
 */
#ifndef CHORUS_ALGOS_H
#define CHORUS_ALGOS_H

#include <stdbool.h>
#include <stddef.h>

#include "../plan.h"

#define ALGO_MAX_MSGS (1u << 23)

typedef enum coll_kind {
  COLL_ALLREDUCE,
  COLL_BCAST,
  COLL_REDUCE,
  COLL_ALLGATHER,
  COLL_REDUCE_SCATTER,
  COLL_ALLTOALL,
  COLL_GATHER,
  COLL_SCATTER,
  COLL_BARRIER,
  COLL_SEND,
  COLL_RECV,
  COLL_KIND_COUNT
} coll_kind;

const char *coll_kind_str(int coll);   /* "allreduce", "bcast", ... */
int coll_kind_parse(const char *name); /* or -1 */

/* Which host each rank is on. Hosts are numbered 0..nhosts-1 in order of
 * their lowest rank; ranks of one host need not be contiguous. NULL topology
 * (or nhosts == 1) means one host. */
typedef struct topo {
  int nranks;
  int nhosts;
  const int *host_of; /* [nranks] */
} topo_t;

typedef struct algo_args {
  coll_kind coll;
  int rank, nranks;
  int root;     /* BCAST/REDUCE/GATHER/SCATTER root; SEND/RECV peer */
  size_t count; /* elements, as in the table above */
  chorus_dtype dtype;
  chorus_op op; /* reducing collectives only */
  bool inplace;
  /* allgather, out of place: the caller has put its own block into recv
   * block `rank` already (coll.c copies it there as it stages the block),
   * so the plan adds no COPY for it and reads it from send as usual */
  bool own_placed;
  size_t chunk_bytes; /* pipelining unit (> 0) */
  const topo_t *topo; /* may be NULL */
} algo_args_t;

typedef int (*algo_build_fn)(const algo_args_t *a, plan_t **out);

enum {
  ALGO_HIERARCHICAL = 1u << 0, /* uses topo; needs nhosts > 1 to differ from flat */
};

typedef struct algo_desc {
  const char *name; /* "ring", "tree", "rd", "rhd", "dbtree", "chain", "bruck", ... */
  coll_kind coll;
  algo_build_fn build;
  unsigned flags;
} algo_desc_t;

/* Every algorithm, NULL-terminated by name. */
extern const algo_desc_t algo_table[];
/* The entry for (coll, name), or NULL. */
const algo_desc_t *algo_find(coll_kind coll, const char *name);

/* ---- helpers shared by algorithm files (steps.c) ---- */
/* Segment k of `count` elements cut into n nearly equal parts (the first
 * count % n parts one longer). */
size_t algo_seg_count(size_t count, int n, int k);
size_t algo_seg_start(size_t count, int n, int k);
static inline int algo_mod(int a, int n) {
  return ((a % n) + n) % n;
}
/* The pipelining unit in bytes: chunk_bytes rounded down to whole elements
 * of `es` bytes, at least one element. */
static inline size_t algo_chunk_unit(size_t chunk_bytes, size_t es) {
  return chunk_bytes / es ? chunk_bytes / es * es : es;
}
/* Pieces of `unit` bytes needed for `bytes` (0 for 0 bytes). */
static inline size_t algo_npieces(size_t bytes, size_t unit) {
  return bytes / unit + (bytes % unit ? 1 : 0);
}

/* The start the one-round block collectives share (n blocks of count
 * elements, every block cut into the same chunks, at most one message per
 * chunk and peer position: ring allgather and reduce-scatter, direct
 * allgather, pairwise alltoall). Checks the shape (-EINVAL), sizes a block
 * and its chunks into *k (-E2BIG past ALGO_MAX_MSGS messages) and begins
 * the plan named `name` (plan_build_begin's result). */
typedef struct algo_blocks {
  size_t bytes; /* a block */
  size_t unit;  /* a chunk, whole elements */
  size_t nch;   /* chunks a block (0 for an empty block) */
} algo_blocks_t;
int algo_blocks_begin(const algo_args_t *a, const char *name, plan_builder_t *b, algo_blocks_t *k);
/* An allgather's own block: out of place, a COPY of send[0, block) to recv
 * block a->rank, whose step it returns; in place or placed by the caller
 * (a->own_placed: nothing to copy) UINT32_MAX. */
uint32_t algo_allgather_own(plan_builder_t *b, const algo_args_t *a, size_t block);
/* The start every broadcast shares: begins the plan (named name) and adds the
 * root's copy of its send buffer into its receive buffer (out of place).
 * Returns true when the plan is already done, *rc then being what to return
 * (nothing to move, one rank, or an error); false when the caller goes on. */
bool algo_bcast_begin(const algo_args_t *a, const char *name, plan_builder_t *b, plan_t **out,
                      int *rc);

/* Pacing of the sends nothing else holds back (those that read only the
 * input, at the start of an allreduce): each waits for the one ALGO_PACE
 * before it in its stream. Their receiver takes at most its scratch slots
 * (8) ahead; a send further ahead only holds one of the sender's posted
 * slots (max_posted). Unpaced, past max_posted chunks both ranks' posted
 * sends were sends the peer could not take yet, queued ahead of the sends
 * of the allreduce's second half, and both ranks' posted receives were
 * receives of that second half: a deadlock (a 2-rank allreduce of 256 MiB
 * in 256 KiB chunks over shm or tcp, by the ring, rhd and dbtree). */
#define ALGO_PACE 8
typedef struct algo_pace {
  uint32_t last[ALGO_PACE]; /* the last ALGO_PACE sends, UINT32_MAX for none */
  uint32_t n;
} algo_pace_t;
void algo_pace_init(algo_pace_t *p);
/* Send step `send` waits for the send ALGO_PACE before it in p's stream. */
void algo_pace(plan_builder_t *b, algo_pace_t *p, uint32_t send);

/* Which steps wrote a buffer, cell by cell, so that a later step can wait
 * for exactly the writers of the bytes it touches (or of their cell: a
 * conservative superset, safe because every recorded writer was added to
 * the plan earlier). A writer must itself wait for the earlier writers of
 * its bytes; one that covers a whole cell replaces that cell's list. */
typedef struct algo_track {
  size_t cell; /* bytes per cell */
  size_t ncells;
  uint32_t **w;  /* per cell: writer steps, oldest first */
  uint32_t *n;   /* per cell: how many */
  uint32_t *cap; /* per cell: room */
} algo_track_t;

/* Tracks `bytes` bytes in cells of `cell` bytes (> 0). 0 or -ENOMEM. */
int algo_track_init(algo_track_t *t, size_t bytes, size_t cell);
void algo_track_free(algo_track_t *t);
/* `to` waits for the writers of every cell [off, off+bytes) touches. */
void algo_track_deps(const algo_track_t *t, plan_builder_t *b, size_t off, size_t bytes,
                     uint32_t to);
/* Records `step` as a writer of [off, off+bytes); UINT32_MAX is ignored.
 * An allocation failure is left in b->err. */
void algo_track_write(algo_track_t *t, plan_builder_t *b, size_t off, size_t bytes, uint32_t step);

/* ---- the algorithms ---- */
int algo_ring_allreduce(const algo_args_t *a, plan_t **out);
int algo_rd_allreduce(const algo_args_t *a, plan_t **out);
int algo_rhd_allreduce(const algo_args_t *a, plan_t **out);
int algo_dbtree_allreduce(const algo_args_t *a, plan_t **out);
int algo_hier_allreduce(const algo_args_t *a, plan_t **out);
int algo_tree_bcast(const algo_args_t *a, plan_t **out);
int algo_chain_bcast(const algo_args_t *a, plan_t **out);
int algo_ring_bcast(const algo_args_t *a, plan_t **out);
int algo_hier_bcast(const algo_args_t *a, plan_t **out);
int algo_linear_bcast(const algo_args_t *a, plan_t **out);
int algo_tree_reduce(const algo_args_t *a, plan_t **out);
int algo_chain_reduce(const algo_args_t *a, plan_t **out);
int algo_ring_reduce(const algo_args_t *a, plan_t **out);
int algo_hier_allgather(const algo_args_t *a, plan_t **out);
int algo_ring_allgather(const algo_args_t *a, plan_t **out);
int algo_bruck_allgather(const algo_args_t *a, plan_t **out);
int algo_direct_allgather(const algo_args_t *a, plan_t **out);
int algo_rd_allgather(const algo_args_t *a, plan_t **out);
int algo_ring_reduce_scatter(const algo_args_t *a, plan_t **out);
int algo_rhd_reduce_scatter(const algo_args_t *a, plan_t **out);
int algo_pairwise_alltoall(const algo_args_t *a, plan_t **out);
int algo_bruck_alltoall(const algo_args_t *a, plan_t **out);
int algo_tree_gather(const algo_args_t *a, plan_t **out);
int algo_linear_gather(const algo_args_t *a, plan_t **out);
int algo_tree_scatter(const algo_args_t *a, plan_t **out);
int algo_linear_scatter(const algo_args_t *a, plan_t **out);
int algo_dissemination_barrier(const algo_args_t *a, plan_t **out);
/* COLL_SEND and COLL_RECV: a->root is the peer */
int algo_p2p(const algo_args_t *a, plan_t **out);

#endif
