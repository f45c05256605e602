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
 * A sim_graph holds every rank's plan without its buffers: 24 bytes a step
 * and 4 an edge, instead of a plan_t's ~100, so that 4096 ranks of a ring
 * (5 (n-1) steps each, 84 million in all) fit in under 3 GB. It is built
 * one rank at a time (sim_graph_build frees each plan as soon as it is
 * copied). verify.c checks it; sim_time runs it on a virtual clock. */

typedef struct sim_step {
  uint64_t bytes;    /* bytes moved, reduced or copied */
  int32_t peer;      /* SEND/RECV: the other rank; -1 for local steps */
  uint32_t msg : 24; /* SEND/RECV: message number (algos.h: 24 bits) */
  uint32_t kind : 8; /* enum plan_step_kind */
  uint32_t mate;     /* SEND/RECV once matched: the partner's step on peer */
  uint32_t deps;     /* steps this one waits for; traversals use it as their
                        counter and put it back (sim_graph_reset_deps) */
} sim_step_t;

typedef struct sim_rank {
  uint32_t nsteps, nedges;
  sim_step_t *steps;
  uint32_t *succ_off; /* [nsteps + 1]: successors of i are succ[succ_off[i] .. succ_off[i+1]) */
  uint32_t *succ;
} sim_rank_t;

typedef struct sim_graph {
  int nranks;
  sim_rank_t *ranks; /* [nranks] */
  uint64_t nsteps;   /* all ranks */
  uint64_t nedges;   /* dependency edges, all ranks */
  uint64_t nsends;   /* = messages once matched */
  uint64_t nrecvs;
  uint32_t max_steps; /* steps of the longest plan */
  int max_steps_rank; /* its rank */
  bool matched;       /* sim_graph_match succeeded */
  void *arena;        /* where the ranks' arrays live (sim.c) */
} sim_graph_t;

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
/* Pairs every SEND with the RECV of its peer (same source, destination and
 * message number) and sets their mates. Returns 0, or -EPROTO naming the
 * first send without a receive (or the reverse), size mismatch, or message
 * number used twice, or -ENOMEM. */
int sim_graph_match(sim_graph_t *g, char *err, size_t errlen);
/* Puts every step's dependency count back from the edges. */
void sim_graph_reset_deps(sim_graph_t *g);
void sim_graph_free(sim_graph_t *g);

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
 * error, with a message in err. g's dependency counts are restored. */
int sim_time(sim_graph_t *g, const topo_t *topo, const sim_model_t *m, sim_time_result_t *res,
             char *err, size_t errlen);

#endif