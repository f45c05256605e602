/*
 * exec.h - running plans: every step is an instance of the step machine
 *
 *   WAIT --dep (last)--> READY --posted--> POSTED --complete--> DONE
 *     \--dep--> WAIT       \--run (local steps)-----------------> DONE
 *   any live state --error/cancel--> FAILED
 *
 * driven by transport completions on the communicator's progress thread.
 * Every transition is journaled (fsm journal), so a dump shows where each
 * step of each collective stands.
 */
#ifndef CHORUS_EXEC_H
#define CHORUS_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fsm.h"
#include "plan.h"
#include "prov.h"

typedef struct exec exec_t;

/* A step not done, as dumps and the watchdog see it. */
typedef struct exec_pending {
  uint64_t call_seq;
  uint16_t seq16;
  bool p2p;
  uint32_t index;
  int kind;  /* plan_step_kind */
  int state; /* the step machine's: 0 WAIT, 1 READY, 2 POSTED, 3 DONE, 4 FAILED */
  int peer;
  uint32_t msg;
  size_t bytes;
  uint64_t since_ns;
  uint32_t deps_left;
  int err; /* FAILED by the transport: its errno; 0 otherwise */
} exec_pending_t;

/* What all running plans of one communicator share. Only the progress
 * thread touches it. */
typedef struct exec_ctx {
  prov_t *prov;
  int rank;
  uint8_t comm_id;
  /* Posting budget per direction. Past it, a pair's next message still goes
   * when nothing else of that pair is held by the transport (exec.c), so up
   * to one more per peer: the transport must hold max_posted + nranks - 1.
   * comm_start keeps that much out of the budget, but never more than half
   * of what the transport holds: past that many peers (33 ranks over shm's
   * 64) the extra posts can meet a full transport, and wait for room on
   * -EAGAIN retries (slower, still correct). */
  size_t max_posted;
  size_t posted_sends, posted_recvs;
  /* [2 * peer + (0 send, 1 receive)]: operations of collectives held by the
   * transport; NULL: no posting past the budget (exec_ctx_set_peers) */
  uint32_t *inflight;
  bool requeue;   /* pairs an older run held back may go (exec.c) */
  bool stalled;   /* the last drive met -EAGAIN: retry on a timer, not on the fd */
  bool trace;     /* time-stamp steps (CHORUS_TRACE) for dumps and the watchdog */
  bool checksum;  /* CHORUS_CHECKSUM: immediate data = fingerprint hash | CRC-32C */
  exec_t *active; /* running plans, oldest first */
  exec_t *active_tail;
  void *scratch;       /* cached scratch buffer, lent to one plan at a time */
  size_t scratch_keep; /* CHORUS_BUFFSIZE: largest scratch kept between runs */
  size_t scratch_bytes;
  bool scratch_lent;
  /* The last scratch a run had of its own (a plan past scratch_keep, or
   * the cached one lent), kept for the next such run while those follow
   * each other; exec_trim gives it back after EXEC_BIG_IDLE_NS unused. */
  void *big;
  size_t big_bytes;
  uint64_t big_since; /* fsm_now_ns() when its last run ended */
  /* The steps the transport failed (a broken connection) in the last run
   * that failed so, kept for the dumps once that run is gone: the peers
   * this rank waited on until the break. Cleared by a run that succeeds. */
#define EXEC_BROKE_MAX 4
  exec_pending_t broke[EXEC_BROKE_MAX];
  size_t nbroke;
  exec_t *spare; /* the last run's memory, kept for the next (exec.c) */
} exec_ctx_t;

typedef void (*exec_done_fn)(exec_t *ex, int status, void *arg);

/* Sizes ctx->inflight for a communicator of nranks. Returns 0 or -ENOMEM. */
int exec_ctx_set_peers(exec_ctx_t *ctx, int nranks);

/* Creates a run of `plan` over the given buffers (the plan is borrowed and
 * must outlive the run). Returns NULL on allocation failure. */
exec_t *exec_create(exec_ctx_t *ctx, const plan_t *plan, const void *sendbuf, void *recvbuf,
                    uint16_t seq, exec_done_fn done, void *arg);
/* Before exec_start: the extra buffers of a composed plan (xbufs[i] is
 * buffer BUF_COUNT + i, plan->nxbufs of them; borrowed until the run ends)
 * and bits or'ed into every message number of its tags (point-to-point
 * traffic sets EXEC_MSG_P2P). */
#define EXEC_MSG_P2P (1u << 23)
void exec_set_extra(exec_t *ex, void *const *xbufs, uint32_t msg_or);
/* Before exec_start: the call's number (checkpoint, messages) and the
 * fingerprint its sends carry and its receives check (0: none). A receive
 * stamped otherwise fails the run with CHORUS_ERR_MISMATCH (same
 * collective, other arguments) or CHORUS_ERR_DIVERGED (another
 * collective); exec_why() then explains it (valid until the run is freed,
 * i.e. inside the done callback). */
void exec_set_call(exec_t *ex, uint64_t call_seq, uint64_t fp);
const char *exec_why(const exec_t *ex);
/* The mismatch was seen without the sender's fingerprint (a truncated
 * message): which rank is wrong, and how, only the watchdog can tell. */
bool exec_uncertain(const exec_t *ex);
/* Before exec_start: another communicator field for the run's tags (the
 * recovery rounds of chorus_comm_shrink use EXEC_COMM_RECOVERY, apart from
 * every call's sequence numbers, which the survivors may no longer share). */
#define EXEC_COMM_RECOVERY 0xff
void exec_set_comm_id(exec_t *ex, uint8_t comm_id);
/* Before exec_start: its sends go with PROV_OP_BOUNCE. */
void exec_set_bounce(exec_t *ex);
/* A failed run whose operations the transport does not give back within
 * this long completes for its caller and is kept until they come back. */
#define EXEC_ORPHAN_NS (2000ull * 1000 * 1000)
/* Starts it (progress thread): makes initial steps ready. */
void exec_start(exec_ctx_t *ctx, exec_t *ex);
/* Drives every active run: runs ready local steps, posts ready sends and
 * receives within the posting budget. Returns the number of steps advanced.
 * Finished runs get their done callback and are freed. */
size_t exec_drive(exec_ctx_t *ctx);
/* Fails every active run with `status` (cancels what is posted). */
void exec_fail_all(exec_ctx_t *ctx, int status);
/* Steps not done of the running plans (progress thread, or prog_lock),
 * then those of ctx->broke: what a dump shows. Returns how many were written (at most max). */
size_t exec_pending(const exec_ctx_t *ctx, exec_pending_t *out, size_t max);
/* What the oldest healthy run waits for: its oldest posted receive, else
 * its oldest posted send. False when nothing is posted. */
bool exec_blocker(const exec_ctx_t *ctx, exec_pending_t *out);
/* True when nothing is running. */
bool exec_idle(const exec_ctx_t *ctx);
/* Frees ctx->big when no run has used it for EXEC_BIG_IDLE_NS (now: fsm_now_ns()). */
#define EXEC_BIG_IDLE_NS (1000ull * 1000 * 1000)
void exec_trim(exec_ctx_t *ctx, uint64_t now);
void exec_ctx_fini(exec_ctx_t *ctx);

/* Tag layout (64 bits): source rank 16 | communicator 8 | sequence 16 | message 24.
 * Ranks stay below 32768, so bit 63, which the transports reserve, is 0. */
static inline uint64_t exec_tag(int src, uint8_t comm_id, uint16_t seq, uint32_t msg) {
  return ((uint64_t)(uint16_t)src << 48) | ((uint64_t)comm_id << 40) | ((uint64_t)seq << 24) |
         (msg & 0xffffffu);
}

extern fsm_machine_t exec_step_machine;

#endif
