/*
 * select.h - choosing an algorithm: an alpha-beta cost model with one set of
 * parameters per link class (within a host, across hosts), and the
 * CHORUS_ALGO overrides.
 *
 * The model predicts, for each algorithm registered for a collective, the
 * time of one call from its message count, bytes per message on the critical
 * path and link classes crossed (alpha = per-message latency, beta = seconds
 * per byte, gamma = seconds per byte reduced), and picks the cheapest; the
 * explanation names the winner, its predicted time and the runner-up, so the
 * choice is never magic. CHORUS_ALGO ("allreduce=ring;bcast=tree" or with
 * byte ranges "allreduce=rd:0-64K,ring:64K-") overrides it.
 * CHORUS_DETERMINISTIC restricts reductions to algorithms whose reduction
 * order is a fixed function of (nranks, count). Each algorithm's order is,
 * but they differ from one another, and the model's choice moves with size
 * and topology; so one order is canonical, the ring's: allreduce,
 * reduce_scatter and reduce may then use only "ring" (an override naming
 * another is ignored, and the call gets NULL when no ring is registered for
 * it). Other collectives are unaffected.
 */
#ifndef CHORUS_SELECT_H
#define CHORUS_SELECT_H

#include <stdbool.h>
#include <stddef.h>

#include "algos/algos.h"

typedef struct select_link {
  double alpha; /* seconds per message */
  double beta;  /* seconds per byte */
} select_link_t;

typedef struct select_rule {
  int coll;         /* coll_kind */
  size_t min_bytes; /* inclusive */
  size_t max_bytes; /* exclusive; SIZE_MAX = no limit */
  const algo_desc_t *algo;
} select_rule_t;

typedef struct select_ctx {
  select_link_t intra, inter; /* per link class */
  double gamma;               /* seconds per byte reduced */
  /* bytes of a peer's cache a rank may read from (0: its data crosses a
   * wire anyway); see cost_allreduce */
  double peer_cache;
  /* over a network provider (select_over_network): a 2-rank allreduce
   * whose rank reduces at most this many bytes reduces each chunk while the
   * next is on the wire, so only the last chunk's reduction shows; 0: every
   * byte reduced costs gamma (see cost_allreduce) */
  double wire_hide;
  int per_core; /* ranks sharing a core (select_share_cores; 0 or 1: none) */
  /* bytes from which a message between ranks of one host is copied by its
   * receiver, out of the sender's buffer (shm's CMA rendezvous; 0: never,
   * the data crosses a wire); see cost_bcast */
  double pull_min;
  /* allgathers of more than stage_min bytes whose blocks are at most
   * stage_block bytes send from a mappable buffer (coll.c, "Staging"):
   * peers copy each block where it lies; 0: not staged */
  double stage_min, stage_block;
  bool deterministic;
  select_rule_t *rules; /* from CHORUS_ALGO, in the order given */
  size_t nrules;
} select_ctx_t;

/* Parses CHORUS_ALGO-style overrides (may be NULL or "") and sets the model
 * parameters to this machine's defaults. Returns 0, or -1 with a message in
 * err naming the bad part (unknown collective or algorithm, bad range). */
int select_init(select_ctx_t *s, const char *overrides, bool deterministic, char *err,
                size_t errlen);
void select_fini(select_ctx_t *s);

/* Fits the model to ranks that talk over a network provider (tcp, sock),
 * on one host or several: every link is the inter-host one, no peer's cache
 * is read, reductions overlap the wire (wire_hide). */
void select_over_network(select_ctx_t *s);

/* Fits the model to ranks that outnumber the cores, per_core of them a
 * core (1: nothing changes). */
void select_share_cores(select_ctx_t *s, int per_core);

/* The predicted time in seconds of `d` for `a` (a->topo may be NULL). */
double select_cost(const select_ctx_t *s, const algo_desc_t *d, const algo_args_t *a);

/* The algorithm to run `a`: an override that covers it, else the cheapest
 * allowed by the model. `why` (may be NULL) receives one line such as
 * "allreduce 16 MiB on 8 ranks/1 host: ring 2.1 ms (model) < rhd 2.9 ms". */
const algo_desc_t *select_algo(const select_ctx_t *s, const algo_args_t *a, char *why,
                               size_t whylen);

#endif
