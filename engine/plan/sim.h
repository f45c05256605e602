/*
 * sim.h - run every rank's plan in one process, without a transport.
 *
 * The reference interpreter for plans: steps become ready as their
 * dependencies finish; a ready SEND and the ready RECV of its peer with the
 * same (source, destination, message number) meet and copy; local steps run
 * at once. Every buffer access is checked against the sizes given. Used by
 * algorithm tests, the scale simulation and chorus-plan.
 */
#ifndef CHORUS_SIM_H
#define CHORUS_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "algos/algos.h"
#include "plan.h"

typedef struct sim_buf {
  const void *send;
  size_t send_bytes;
  void *recv;
  size_t recv_bytes;
} sim_buf_t;

typedef struct sim_stats {
  uint64_t steps;    /* steps run, all ranks */
  uint64_t messages; /* matched send/recv pairs */
  uint64_t bytes;    /* bytes moved by them */
} sim_stats_t;

/* Runs plans[r] over bufs[r] for every rank r < nranks. bufs may be NULL
 * (no data: steps are matched and counted, nothing is copied). Returns 0, or
 * a negative errno with a message in err: -EDEADLK when steps remain that
 * can never run (an unmatched send or receive, or a dependency cycle across
 * ranks), -EPROTO when a matched send and receive differ in size or a
 * message number is used twice, -EFAULT when a step reaches outside its
 * buffer, -EINVAL for a malformed plan, -ENOMEM. stats may be NULL. */
int sim_exec(plan_t *const *plans, int nranks, const sim_buf_t *bufs, sim_stats_t *stats, char *err,
             size_t errlen);

/* ---- schedules at scale: compact graphs, matching, a virtual clock ----
 *
 * A sim_graph holds every rank's plan without its buffers, as shapes: a
 * shape is a plan with each peer written relative to its rank, 32 bytes a
 * step and 4 an edge, stored once however many ranks have it. Relative means
 * (peer - rank) mod nranks, or peer ^ rank where that lines the ranks up
 * better (recursive doubling and halving; sim.c picks per graph). Each rank
 * is compared in full against the shapes stored (the previous rank's shape
 * while its plan is read, else by hash and memcmp: never guessed), so the
 * 4096 ranks of a ring share one shape of 5 (n-1) steps instead of holding
 * 84 million, and ranks that differ (a tree's) cost what their steps cost.
 * The graph is built one rank at a time (sim_graph_build frees each plan as
 * soon as it is compared or copied). verify.c checks it; sim_time runs it on
 * a virtual clock. A run counts dependencies per rank and step: in the steps
 * themselves when every rank it runs has a shape of its own (no sharing: as
 * compact as a copy per rank), else in an array of its own. */

typedef struct sim_step {
  uint64_t bytes;    /* bytes moved, reduced or copied */
  int32_t peer;      /* SEND/RECV: the other rank, relative (sim_graph_peer);
                        -1 for local steps */
  uint32_t msg : 24; /* SEND/RECV: message number (algos.h: 24 bits) */
  uint32_t kind : 8; /* enum plan_step_kind */
  uint32_t succ;     /* its successors: shape->succ[succ .. (this + 1)->succ) */
  uint32_t mate;     /* SEND/RECV: sim_graph_mate's answer (a memo) for a */
  uint32_t mate_of;  /* peer of this shape; UINT32_MAX: none yet */
  uint32_t cnt;      /* a run's dependency counter, when the shape is one
                        rank's in that run (sim_run_t) */
} sim_step_t;

typedef struct sim_sent {
  uint32_t peer;  /* relative, as sim_step_t.peer */
  uint64_t bytes; /* of all SENDs to it */
} sim_sent_t;

typedef struct sim_shape {
  uint32_t nsteps, nedges;
  sim_step_t *steps; /* [nsteps + 1]: the last one only marks where the
                        successors end (succ = nedges) */
  uint32_t *succ;
  uint32_t *roots; /* the steps with no dependency, ascending */
  uint32_t nroots;
  uint32_t nsent;
  sim_sent_t *sent; /* bytes sent per peer, peers in the order of their first
                       SEND of more than 0 bytes */
  uint32_t nsends;  /* SEND steps */
  uint32_t nrecvs;  /* RECV steps */
  uint32_t *index;  /* (kind, peer, msg) -> its first SEND or RECV, UINT32_MAX
                       for none: open addressing, built when a memo of
                       sim_graph_mate misses (a shape whose ranks' peers
                       differ in shape), NULL until then */
  size_t index_mask;
  uint64_t hash;  /* of steps and succ */
  int first_rank; /* the lowest rank with this shape */
} sim_shape_t;

typedef struct sim_graph {
  int nranks;
  uint32_t *shape_of;  /* [nranks]: index into shapes */
  sim_shape_t *shapes; /* [nshapes] */
  uint32_t nshapes;
  bool xor_peers;  /* peers written peer ^ rank (else (peer - rank) mod nranks) */
  int period;      /* the smallest P dividing nranks with shape_of[r] ==
                      shape_of[r - P] for every r >= P (nranks: none) */
  uint64_t nsteps; /* all ranks */
  uint64_t nedges; /* dependency edges, all ranks */
  uint64_t nsends; /* = messages once matched */
  uint64_t nrecvs;
  uint32_t max_steps; /* steps of the longest plan */
  int max_steps_rank; /* its rank */
  bool matched;       /* sim_graph_match succeeded */
  void *arena;        /* where the shapes' arrays live (sim.c) */
  void *build;        /* sim.c's state while ranks are being added */
} sim_graph_t;

/* How many of the first ranks' plans choose the encoding of peers. */
#define SIM_PROBE_RANKS 8

/* Copies plans[0..nranks) (which stay the caller's). Returns 0, or -EINVAL
 * for a malformed plan (wrong rank, unknown kind, peer out of range or equal
 * to the rank, message number over 24 bits, successor out of range) or
 * -ENOMEM, with a message in err. */
int sim_graph_from_plans(plan_t *const *plans, int nranks, sim_graph_t **out, char *err,
                         size_t errlen);
/* Builds every rank's plan of `d` for the shape of `a` (a->rank ignored) and
 * copies it. SEND/RECV algorithms are built as one exchange: rank a->root
 * and the next rank, the other ranks idle. Returns 0, the builder's error
 * (naming the rank) or sim_graph_from_plans's. */
int sim_graph_build(const algo_desc_t *d, const algo_args_t *a, sim_graph_t **out, char *err,
                    size_t errlen);
/* Checks that every SEND has exactly one RECV on its peer with the same
 * (source, destination, message number) and size, and the reverse. Ranks
 * r and r + period have equal shapes, and so equal peers' shapes, so ranks
 * 0 .. period-1 stand for all: the first error is the one a walk over every
 * rank would find first. Returns 0, or -EPROTO naming the first send
 * without a receive (or the reverse), size mismatch, or message number used
 * twice, or -ENOMEM. */
int sim_graph_match(sim_graph_t *g, char *err, size_t errlen);
/* The absolute peer of step s of rank `rank`. */
static inline int sim_graph_peer(const sim_graph_t *g, int rank, const sim_step_t *s) {
  int p;
  if (g->xor_peers)
    return rank ^ s->peer;
  p = rank + s->peer;
  return p >= g->nranks ? p - g->nranks : p;
}
/* The step of rank `peer` (its SEND/RECV peer) that pairs with SEND/RECV
 * `step` of `rank`: its first step of the other kind with the same message
 * and this rank as peer, or UINT32_MAX. Memoised in the shape; a miss looks
 * it up (sim_graph_mate_find). */
uint32_t sim_graph_mate_find(sim_graph_t *g, int rank, uint32_t step, int peer);
static inline uint32_t sim_graph_mate(sim_graph_t *g, int rank, uint32_t step, int peer) {
  const sim_step_t *s = &g->shapes[g->shape_of[rank]].steps[step];
  return s->mate_of == g->shape_of[peer] ? s->mate : sim_graph_mate_find(g, rank, step, peer);
}
void sim_graph_free(sim_graph_t *g);

/* A run over ranks 0 .. nq-1 of a graph (sim_time: every rank; verify.c:
 * the period): per rank, its shape's arrays and its dependency counters,
 * cnt[i * stride] for step i. */
typedef struct sim_view {
  sim_step_t *steps;
  const uint32_t *succ;
  uint32_t *cnt;
} sim_view_t;

typedef struct sim_run {
  sim_view_t *rank; /* [nq] */
  uint32_t stride;  /* 1, or sizeof(sim_step_t) / 4: in the steps */
  uint32_t *own;    /* the counters, when not in the steps */
} sim_run_t;

/* Sets u up for ranks 0 .. nq-1 of g, every counter at its step's number
 * of dependencies. One run of a graph at a time: counters may live in its
 * shapes. Returns 0 or -ENOMEM. */
int sim_run_init(sim_run_t *u, sim_graph_t *g, int nq);
void sim_run_fini(sim_run_t *u);
static inline uint32_t *sim_counter(const sim_run_t *u, uint32_t rank, uint32_t step) {
  return u->rank[rank].cnt + (size_t)step * u->stride;
}

/* Costs on the virtual clock. A message of b bytes between ranks of one
 * host takes alpha[0] + b * beta[0], between hosts alpha[1] + b * beta[1];
 * it starts when its send and receive are both ready and the sender's send
 * link and the receiver's receive link are free, and holds both links until
 * it ends (alpha included: a rank starts one message at a time in each
 * direction). REDUCE and SCALE take b * gamma, COPY b * copy_beta, one
 * local step at a time per rank, overlapping its messages. */
typedef struct sim_model {
  double alpha[2];  /* s per message: [0] within a host, [1] across hosts */
  double beta[2];   /* s per byte */
  double gamma;     /* s per byte reduced or scaled */
  double copy_beta; /* s per byte copied */
} sim_model_t;

/* The same defaults as select.c's model (see there), copy at 10 GB/s. */
void sim_model_default(sim_model_t *m);

typedef struct sim_time_result {
  double time;             /* s: when the last step of any rank ends */
  int last_rank;           /* the rank that ends last */
  uint64_t steps;          /* all ranks */
  uint64_t messages;       /* matched pairs */
  uint64_t bytes;          /* bytes of all messages */
  uint32_t max_steps;      /* steps of the longest plan */
  uint64_t bytes_intra;    /* all messages within hosts */
  uint64_t bytes_inter;    /* all messages across hosts */
  uint64_t max_sent_intra; /* bytes one rank sends within its host: max over ranks */
  int max_sent_intra_rank;
  uint64_t max_sent_inter; /* bytes one rank sends to other hosts: max over ranks */
  int max_sent_inter_rank;
  uint64_t max_sent;      /* all bytes one rank sends: max over ranks */
  int link_src, link_dst; /* the busiest directed rank pair (-1: no message) */
  uint64_t link_bytes;
  int hlink_src, hlink_dst; /* the busiest directed host pair (-1: one host) */
  uint64_t hlink_bytes;
} sim_time_result_t;

/* Runs g (matching it first if needed) on the virtual clock of `m`, hosts
 * from topo (NULL: one host; topo->nranks must equal g->nranks). Returns 0,
 * -EDEADLK when steps can never run, -EINVAL, -ENOMEM, or sim_graph_match's
 * error, with a message in err. */
int sim_time(sim_graph_t *g, const topo_t *topo, const sim_model_t *m, sim_time_result_t *res,
             char *err, size_t errlen);

#endif