/*
 * plan.h - a collective compiled for one rank: a graph of steps.
 *
 * A step is SEND (a byte range to a peer), RECV (from a peer into a byte
 * range), REDUCE (dst = a op b over elements), COPY (dst = src) or SCALE
 * (dst /= nranks, the end of CHORUS_AVG). A step runs when every step it
 * depends on is done. Byte ranges name one of three buffers: the user's send
 * buffer, the user's receive buffer, or the communicator's scratch buffer.
 *
 * Algorithms (engine/plan/algos/) are pure functions from (rank, nranks, count,
 * chunking) to a plan; they call no transport. The executor (exec.c) runs a
 * plan; the same plan could be run in-process for thousands of ranks.
 *
 * Messages: a SEND of rank r and the RECV of its peer that matches it carry
 * the same `msg` number, unique among the messages r sends in one plan.
 */
#ifndef CHORUS_PLAN_H
#define CHORUS_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chorus.h"

enum plan_step_kind { STEP_SEND, STEP_RECV, STEP_REDUCE, STEP_COPY, STEP_SCALE, STEP_KIND_COUNT };
enum plan_buf { BUF_SEND, BUF_RECV, BUF_SCRATCH, BUF_COUNT };

const char *plan_step_kind_str(int kind);
const char *plan_buf_str(int buf);

typedef struct plan_ref {
  uint32_t buf; /* enum plan_buf, or BUF_COUNT + i: extra buffer i of the run (plan->nxbufs) */
  size_t off;   /* bytes */
} plan_ref_t;

typedef struct plan_step {
  uint8_t kind;      /* enum plan_step_kind */
  int peer;          /* SEND/RECV */
  uint32_t msg;      /* SEND/RECV: message number (see above) */
  size_t bytes;      /* bytes moved or reduced */
  plan_ref_t dst;    /* RECV, REDUCE, COPY, SCALE */
  plan_ref_t src;    /* SEND, REDUCE (a), COPY */
  plan_ref_t src2;   /* REDUCE (b) */
  uint32_t ndeps;    /* steps this one waits for */
  uint32_t succ_off; /* its successors: plan->succ[succ_off .. succ_off+nsucc) */
  uint32_t nsucc;
} plan_step_t;

/* The SENDs to one peer, or the RECVs from one peer, of a plan: a pair.
 * The executor posts each pair's steps in the order of their message
 * numbers (exec.c), and the verifier checks that this order can not
 * deadlock (verify.c). */
typedef struct plan_pair {
  uint8_t kind; /* STEP_SEND or STEP_RECV */
  int peer;
  uint32_t first; /* its step with the lowest message number */
} plan_pair_t;

typedef struct plan {
  const char *algo; /* "ring", ... */
  int rank, nranks;
  size_t count;
  chorus_dtype dtype;
  chorus_op op;
  bool inplace;
  size_t scratch_bytes; /* scratch the plan needs */
  uint32_t nsteps;
  plan_step_t *steps;
  uint32_t *succ;  /* successor lists, CSR */
  uint32_t nmsgs;  /* msg numbers used are < nmsgs */
  uint32_t nxbufs; /* extra buffers the run supplies (composed plans; 0 for algorithms) */
  /* pairs (plan_build_end): sorted by (kind, peer) */
  uint32_t npairs;
  plan_pair_t *pairs;
  uint32_t *pair_of;   /* [nsteps]: a SEND's or RECV's pair, UINT32_MAX for local steps */
  uint32_t *pair_next; /* [nsteps]: the next step of its pair by message number, or UINT32_MAX;
                        * in pair_of's allocation (pair_of + nsteps), freed with it */
} plan_t;

/* ---- building ---- */
typedef struct plan_builder {
  plan_t *plan;
  uint32_t cap_steps;
  uint32_t (*edges)[2]; /* (from, to) */
  size_t nedges, cap_edges;
  int err;
} plan_builder_t;

/* Starts an empty plan; returns 0 or -ENOMEM. */
int plan_build_begin(plan_builder_t *b, const char *algo, int rank, int nranks, size_t count,
                     chorus_dtype dtype, chorus_op op, bool inplace);
/* Add a step; returns its index, or UINT32_MAX after an allocation failure
 * (remembered: plan_build_end then fails). */
uint32_t plan_add(plan_builder_t *b, const plan_step_t *s);
/* `to` waits for `from`. UINT32_MAX on either side is ignored (no step). */
void plan_dep(plan_builder_t *b, uint32_t from, uint32_t to);
/* Finish: builds the successor lists and the pairs. Returns 0 with *out
 * set, or -ENOMEM. */
int plan_build_end(plan_builder_t *b, plan_t **out);
void plan_free(plan_t *p);
/* (Re)builds p's pairs from its steps' kinds, peers and message numbers
 * (plan_build_end does; a caller that rewrites them calls it again).
 * Returns 0 or -ENOMEM (p's pairs then unchanged). */
int plan_pair_up(plan_t *p);
/* The pair of (kind, peer) in p, or UINT32_MAX. */
uint32_t plan_find_pair(const plan_t *p, uint8_t kind, int peer);

/* ---- inspecting and composing ---- */
/* The buffer references step `s` reads or writes (SEND: src; RECV: dst;
 * REDUCE: dst, src, src2; COPY: dst, src; SCALE: dst), the one it writes
 * first. Returns how many (0..3) were stored in refs. */
int plan_step_refs(const plan_step_t *s, plan_ref_t refs[3]);
/* Bytes of buffer `buf` the plan reaches: max over its references of
 * off + bytes (0 when it never names the buffer). */
size_t plan_extent(const plan_t *p, uint32_t buf);
/* Appends every step of `sub` to b with its dependencies, each reference r
 * rewritten to {map[r.buf].buf, map[r.buf].off + r.off} (sub's references
 * must name BUF_SEND, BUF_RECV or BUF_SCRATCH) and every message number
 * offset by msg_off. sub's steps land contiguously: returns the index of the
 * first, or UINT32_MAX after a failure (remembered: plan_build_end fails).
 * Scratch size, nxbufs and the dependencies between the appended steps and
 * the others are the caller's. */
uint32_t plan_append(plan_builder_t *b, const plan_t *sub, const plan_ref_t map[BUF_COUNT],
                     uint32_t msg_off);

#endif
