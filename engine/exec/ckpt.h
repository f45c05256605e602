/*
 * ckpt.h - call fingerprints and a communicator's checkpoint.
 *
 * Fingerprint. Every call is stamped with 63 bits that every message of
 * the call carries (prov_op.data) and its receiver compares with its own:
 *
 *   bits 62..59 kind + 1   58..55 dtype + 1   54..52 op + 1   51..47 algo + 1
 *        46..32 root (0x7fff: none)           31..0 count (low 32 bits)
 *
 * Packed, not hashed, so a receiver can say what the other rank called.
 * Point-to-point sends and receives share one kind and no root, so a
 * matching pair stamps the same value. 0 means "not stamped" (internal
 * rounds): never checked.
 *
 * Checkpoint. The calls begun on a communicator, by sequence number (from
 * 1), in a small ring: begun by the application thread, finished by
 * whoever completes the request. Read by the watchdog and the dump writer.
 */
#ifndef CHORUS_CKPT_H
#define CHORUS_CKPT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "algos/algos.h"
#include "chorus.h"

#define FP_ROOT_NONE 0x7fff
#define FP_KIND_P2P COLL_SEND /* send and receive stamp the same kind */

uint64_t fp_make(int kind, chorus_dtype dtype, uint64_t count, int root, chorus_op op,
                 const algo_desc_t *algo);
/* The kind (coll_kind) a fingerprint names, -1 when none. */
int fp_kind(uint64_t fp);
/* "allreduce(float32, 1048576, sum, ring)"; counts past 2^32 show their low
 * 32 bits (the message check compares those). */
void fp_format(uint64_t fp, char *buf, size_t len);

typedef struct ckpt_call {
  uint64_t seq; /* 0: an empty entry */
  uint64_t fp;
  uint64_t count;
  int32_t root; /* -1: none */
  uint8_t kind, dtype, op;
  char algo[16];
  uint64_t begin_ns, end_ns; /* end 0: not finished */
  int32_t status;
} ckpt_call_t;

#define CKPT_RECENT 16

typedef struct ckpt {
  pthread_mutex_t lock;
  uint64_t last_begun, last_finished; /* seq; last_finished: the highest one finished */
  uint64_t nopen;                     /* calls begun and not finished */
  ckpt_call_t recent[CKPT_RECENT];    /* recent[seq % CKPT_RECENT] */
  _Atomic uint64_t progress_ns;       /* the progress loop last ran (any thread) */
  _Atomic uint64_t moved_ns;          /* a step last advanced */
  atomic_bool destroying;             /* chorus_comm_destroy was called */
  /* What an application thread waits in (request_wait_done), for the
   * watchdog's wait-for graph: block_what (CKPT_BLOCK_*) is written before
   * block_ns, which is 0 while nobody waits. With several threads waiting,
   * the last one to begin is shown, and none once any of them returns:
   * the judge sees fewer waits, never a wait that is not there. */
  _Atomic uint64_t block_what;
  _Atomic uint64_t block_ns;
} ckpt_t;

/* block_what: a collective's sequence number, or a send or receive: */
#define CKPT_BLOCK_P2P (1ull << 63)
#define CKPT_BLOCK_RECV (1ull << 62)
#define CKPT_BLOCK_PEER(what) ((int)(uint32_t)(what))

void ckpt_init(ckpt_t *k);
void ckpt_fini(ckpt_t *k);
void ckpt_begin(ckpt_t *k, const ckpt_call_t *call);
void ckpt_end(ckpt_t *k, uint64_t seq, int status);
/* Copies of the calls still in the ring, oldest first; returns how many. */
size_t ckpt_recent(ckpt_t *k, ckpt_call_t *out, size_t max);
/* The oldest unfinished call (true), or the last one begun (false; *out
 * zeroed when none). */
bool ckpt_current(ckpt_t *k, ckpt_call_t *out);
/* Milliseconds from the call's beginning to now_ns; 0 when it began later
 * (a call begun by another thread after the reader took its clock). */
uint64_t ckpt_age_ms(const ckpt_call_t *call, uint64_t now_ns);
/* The application waits in `what` from now on (0: nothing to show). */
void ckpt_block(ckpt_t *k, uint64_t what);
void ckpt_unblock(ckpt_t *k);
/* What it waits in and since when (true), or false. */
bool ckpt_blocked(ckpt_t *k, uint64_t *what, uint64_t *since_ns);

#endif
