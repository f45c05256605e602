/*
 * fault.h - fault plans: what to break, where and how often, parsed from a
 * spec string (CHORUS_FAULTS). Transport faults (drop, delay, dup, reorder,
 * corrupt) are applied by the prov_fault wrapper to each send; call faults
 * (kill, stall) are asked for by the engine at the start of each collective
 * with fault_plan_on_call(). The grammar is described in prov.h.
 *
 * Decisions are pure functions of the plan and of what is being decided
 * (fault_hash): the same seed and the same program inject the same faults.
 *
 * Nothing here keeps state: a plan is read-only once parsed, and may be
 * shared between threads.
 */
#ifndef CHORUS_FAULT_H
#define CHORUS_FAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FAULT_MAX_RULES 64
#define FAULT_SPEC_MAX 4096        /* bytes of spec text, without the NUL */
#define FAULT_COLL_NAME_MAX 24     /* collective kind name in at=KIND#SEQ, with its NUL */
#define FAULT_DELAY_MS_MAX 600000  /* delay:ms= at most ten minutes */
#define FAULT_STALL_S_MAX 604800.0 /* stall:s= at most a week */

typedef enum fault_kind {
  FAULT_DROP,
  FAULT_DELAY,
  FAULT_DUP,
  FAULT_REORDER,
  FAULT_CORRUPT,
  FAULT_KILL,
  FAULT_STALL,
  FAULT_KIND_COUNT
} fault_kind_t;

/* One rule of a plan. A field left out of the spec holds its "any" value. */
typedef struct fault_rule {
  fault_kind_t kind;
  int rank;                       /* rank=: only this sending rank; -1: any */
  int peer;                       /* peer=: only messages to this peer; -1: any */
  bool has_at, has_from, has_to;  /* at=, from=, to= given */
  uint64_t at, from, to;          /* collective sequence numbers */
  char coll[FAULT_COLL_NAME_MAX]; /* at=KIND#SEQ: the collective kind; "" any */
  uint64_t n;                     /* n=: at most this many injections; 0: no limit */
  double p;                       /* probability per message (per call for kill/stall) */
  uint32_t ms;                    /* delay: milliseconds */
  double s;                       /* stall: seconds */
} fault_rule_t;

typedef struct fault_plan {
  uint64_t seed; /* seed=, 0 when not given */
  int nrules;
  fault_rule_t rules[FAULT_MAX_RULES];
} fault_plan_t;

/* Parses spec (NULL or "" give a plan without rules). Returns 0 and a new
 * plan in *out (free with fault_plan_free), or -EINVAL with *out NULL and a
 * one-line reason in err naming the clause and the character (counted from
 * 1) where the problem is; -ENOMEM. Any NUL-terminated input is safe. */
int fault_plan_parse(const char *spec, fault_plan_t **out, char *err, size_t errlen);
void fault_plan_free(fault_plan_t *plan);

/* Writes the plan's canonical text (parses back to an equal plan) into buf.
 * Returns its length, or -ENOSPC when len bytes do not hold it (buf then
 * holds a truncated, NUL-terminated prefix), -EINVAL without a plan; with
 * buf NULL, only the length it needs. The canonical text of a parsed plan
 * is never longer than FAULT_SPEC_MAX. */
int fault_plan_format(const fault_plan_t *plan, char *buf, size_t len);

/* True when both plans inject the same faults (seed and every rule). */
bool fault_plan_equal(const fault_plan_t *a, const fault_plan_t *b);

/* Count of rules of the transport kinds (drop..corrupt). */
int fault_plan_transport_rules(const fault_plan_t *plan);

const char *fault_kind_str(fault_kind_t kind); /* "drop", ..., "?" */
/* kill and stall act on calls; the others on messages. */
bool fault_kind_is_call(fault_kind_t kind);

/* at=create#STAGE: a stage of forming a communicator, not a collective
 * (engine/comm/comm.c, comm_create_faults); a rule with no kind never matches
 * one. */
#define FAULT_AT_CREATE "create"

/* What the engine should do at the start of a collective. */
typedef enum fault_call { FAULT_CALL_NONE, FAULT_CALL_KILL, FAULT_CALL_STALL } fault_call_t;

/* Asked by the engine as rank `rank` starts collective number seq of kind
 * kind_name (coll_kind_str's names; NULL matches only rules naming no kind).
 * The first kill or stall rule (spec order) whose rank and at= match and
 * whose draw falls below p decides; a stall gives its seconds in *stall_s
 * (may be NULL). plan NULL: FAULT_CALL_NONE. */
fault_call_t fault_plan_on_call(const fault_plan_t *plan, int rank, const char *kind_name,
                                uint64_t seq, double *stall_s);

/* ---- for prov_fault: one message against one rule ---- */

/* Does transport rule r target a message that `rank` sends to `peer`? The
 * sequence is the tag's field of seq_bits bits (0: not known, and then no
 * rule with at=, from= or to= targets it). n= is not looked at here. */
bool fault_rule_targets(const fault_rule_t *r, int rank, int peer, int seq_bits, uint64_t seq);

/* Deterministic 64-bit hash of the plan's seed, a rule index and four
 * values; fault_unit() maps it to [0, 1) for comparing with p. */
uint64_t fault_hash(uint64_t seed, uint64_t rule, uint64_t a, uint64_t b, uint64_t c, uint64_t d);
double fault_unit(uint64_t h);

#endif
