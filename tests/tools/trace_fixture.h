/*
 * trace_fixture.h - writes chorus.trace.Dump files (schemas/trace.proto) as
 * the engine would, so chorus-trace can be tested on hangs built to order.
 *
 *   tf_dump_t *d = tf_new(7, 0, 4, T(12650), 0);   comm 7, rank 0 of 4
 *   tf_call(d, 42, TF_ALLREDUCE, TF_FLOAT32, 1 << 20, TF_SUM, -1, T(200), 0);
 *   tf_where(d, 42, 41, true, T(12600));            in #42, #41 finished
 *   tf_step(d, 42, 5, TF_RECV, TF_POSTED, 3, 2, T(250));
 *   tf_write(d, dir, "rank-0");                     dir/rank-0.trace
 *   tf_free(d);
 *
 * Enum values are the schema's (engine value + 1), spelled short below.
 */
#ifndef CHORUS_TRACE_FIXTURE_H
#define CHORUS_TRACE_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trace.pb-c.h"

enum {
  TF_ALLREDUCE = CHORUS__TRACE__COLL_KIND__COLL_ALLREDUCE,
  TF_BCAST = CHORUS__TRACE__COLL_KIND__COLL_BCAST,
  TF_BARRIER = CHORUS__TRACE__COLL_KIND__COLL_BARRIER,
  TF_FLOAT32 = CHORUS__TRACE__DTYPE__DTYPE_FLOAT32,
  TF_SUM = CHORUS__TRACE__OP__OP_SUM,
  TF_SEND = CHORUS__TRACE__STEP_KIND__STEP_SEND,
  TF_RECV = CHORUS__TRACE__STEP_KIND__STEP_RECV,
  TF_REDUCE = CHORUS__TRACE__STEP_KIND__STEP_REDUCE,
  TF_WAIT = CHORUS__TRACE__STEP_STATE__STATE_WAIT,
  TF_READY = CHORUS__TRACE__STEP_STATE__STATE_READY,
  TF_POSTED = CHORUS__TRACE__STEP_STATE__STATE_POSTED,
  TF_FAILED = CHORUS__TRACE__STEP_STATE__STATE_FAILED,
  TF_ALIVE = CHORUS__TRACE__PEER_VIEW__STATE__ALIVE,
  TF_SUSPECT = CHORUS__TRACE__PEER_VIEW__STATE__SUSPECT,
  TF_LOST = CHORUS__TRACE__PEER_VIEW__STATE__LOST,
  TF_TIMEOUT = CHORUS__TRACE__VERDICT__REASON__TIMEOUT,
  TF_REQUEST = CHORUS__TRACE__VERDICT__REASON__REQUEST,
  TF_PEER_LOST = CHORUS__TRACE__VERDICT__REASON__PEER_LOST,
};

/* The step machine's state and event numbers as the journal holds them
 * (engine numbering, 0-based: WAIT READY POSTED DONE FAILED). */
enum { TF_J_WAIT, TF_J_READY, TF_J_POSTED, TF_J_DONE, TF_J_FAILED };
enum { TF_E_DEP, TF_E_POSTED, TF_E_COMPLETE, TF_E_RUN, TF_E_ERROR };

typedef struct tf_dump tf_dump_t;

/* A dump of `rank` of a communicator of `size`, written at t_dump (this
 * rank's clock, ns), whose clock is rank 0's minus clock_offset_ns. */
tf_dump_t *tf_new(uint32_t comm, int rank, int size, uint64_t t_dump, int64_t clock_offset_ns);
/* A split's dump: its sub_id and each member's rank in its family's head. */
void tf_split(tf_dump_t *d, uint64_t sub_id, const uint32_t *world_of, int n);
/* The message itself, to set what the helpers do not. */
Chorus__Trace__Dump *tf_msg(tf_dump_t *d);
/* A call of the checkpoint's recent list (end 0: not finished). */
Chorus__Trace__Call *tf_call(tf_dump_t *d, uint64_t seq, int kind, int dtype, uint64_t count,
                             int op, int root, uint64_t begin, uint64_t end);
/* Where the rank stands; the current call is the recent one at last_begun.
 * progress_ns 0: unknown. */
void tf_where(tf_dump_t *d, uint64_t last_begun, uint64_t last_finished, bool in_collective,
              uint64_t progress_ns);
Chorus__Trace__Step *tf_step(tf_dump_t *d, uint64_t seq, uint32_t index, int kind, int state,
                             int peer, uint32_t chunk, uint64_t since);
void tf_message(tf_dump_t *d, uint64_t seq, uint32_t step, bool send, int peer, uint32_t msg,
                uint32_t chunk, uint64_t bytes, uint64_t posted, uint64_t done);
void tf_peer(tf_dump_t *d, int rank, int state, uint64_t last_seq, uint64_t last_heard);
void tf_verdict(tf_dump_t *d, int reason, int culprit, const char *text, uint64_t t);
void tf_fault(tf_dump_t *d, uint64_t t, const char *kind, int peer, uint64_t seq,
              const char *detail);
/* A journal record of the step machine (its names are added once). */
void tf_journal(tf_dump_t *d, uint64_t t, uint32_t step, uint64_t seq, int from, int event, int to);

/* The packed bytes (malloc'ed; *len set), or NULL. */
uint8_t *tf_pack(const tf_dump_t *d, size_t *len);
/* Writes dir/name.trace (through name.trace.tmp and a rename); 0 or -errno. */
int tf_write(const tf_dump_t *d, const char *dir, const char *name);
/* Writes `len` bytes to dir/file as they are; 0 or -errno. */
int tf_write_bytes(const char *dir, const char *file, const void *buf, size_t len);
void tf_free(tf_dump_t *d);

#endif
