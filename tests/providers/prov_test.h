/*
 * prov_test.h - helpers for the transport tests: completion records, driving
 * several endpoints until a condition holds, patterned buffers.
 */
#ifndef CHORUS_TEST_PROV_H
#define CHORUS_TEST_PROV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "prov.h"

/* One posted operation and what its callback reported. */
typedef struct pt_op {
  prov_op_t op;
  int calls;  /* times done() ran: must end at exactly 1 */
  int status; /* as reported */
  size_t len; /* as reported */
  void *buf;  /* owned by the test */
  size_t cap;
  uint64_t tag;
} pt_op_t;

void pt_op_init(pt_op_t *t);
void pt_done(prov_op_t *op, int status, size_t len);

/* Milliseconds on a monotonic clock. */
double pt_now_ms(void);

/* Progress every endpoint until all ops have completed (calls >= 1) or
 * timeout; returns true if they did. A NULL entry in eps is skipped. */
bool pt_drive(prov_t **eps, int neps, pt_op_t **ops, int nops, double timeout_ms);

/* Posts with retries on -EAGAIN, progressing every endpoint in between.
 * Returns the final code (0 or a negative error, -ETIMEDOUT on timeout). */
int pt_send(prov_t **eps, int neps, prov_t *p, int peer, pt_op_t *t, size_t len, uint64_t tag,
            double timeout_ms);
int pt_recv(prov_t **eps, int neps, prov_t *p, int peer, pt_op_t *t, size_t len, uint64_t tag,
            double timeout_ms);

/* Deterministic contents for a (size, tag) message. */
void pt_fill(void *buf, size_t len, uint64_t seed);
/* Index of the first wrong byte, or (size_t)-1 if all match. */
size_t pt_check(const void *buf, size_t len, uint64_t seed);

/* Opens `n` endpoints of one job in this process, exchanges their names,
 * adds the peers and settles (as the engine does: shm's regions are then
 * mapped by every peer and gone from /dev/shm). cfg_name: provider name.
 * world: inproc world or NULL. Returns 0 or the failing code, with the
 * reason in err. */
int pt_open_job(const char *cfg_name, void *world, int n, prov_t **eps, char *err, size_t errlen);
/* The same with more settings: base gives the name and anything else
 * (faults...); rank, nranks, job_id and inproc_world are filled in. */
int pt_open_job_cfg(const prov_config_t *base, void *world, int n, prov_t **eps, char *err,
                    size_t errlen);
void pt_close_job(prov_t **eps, int n);
/* One rank of a 2-rank job whose other rank is another process: opens this
 * rank's endpoint, swaps names with the peer over `sock` (a SOCK_SEQPACKET
 * end shared with it), adds the peers and settles. Returns 0 (*out open) or the
 * failing code with the reason in err (*out NULL, nothing left open). */
int pt_open_peer(const char *cfg_name, const char *job_id, int rank, int sock, prov_t **out,
                 char *err, size_t errlen);

/* Arms p, progressing it while arm() says -EAGAIN; true once armed. */
bool pt_arm(prov_t *p, double timeout_ms);
/* Waits for wait_fd(p) to become readable; returns poll()'s answer. */
int pt_poll_fd(prov_t *p, int timeout_ms);

/* Progress p and nothing else, sleeping on its wait fd between rounds
 * (arm/poll/disarm) as the engine's event loop does, until the ops are done.
 * A poll() that times out while ops are still pending counts as a lost
 * wake-up: *lost_wakeups is incremented. With wait_fd() == -1 it naps 1 ms. */
bool pt_sleepy_drive(prov_t *p, pt_op_t **ops, int nops, double timeout_ms, int poll_ms,
                     int *lost_wakeups);

#endif
