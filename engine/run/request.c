/*
 * request.c - waiting on nonblocking operations.
 *
 * The progress thread completes a request (request_complete, run.c); the
 * application thread observes it (chorus_test / chorus_wait) and releases
 * it. A waiting thread drives the communicator itself while the progress
 * thread is idle (no hand-off between threads on the latency path), for as
 * long as that makes progress and CHORUS_SPIN_US more; then it sleeps on
 * the communicator's condition variable.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "eng.h"
#include "fsm.h"
#include "memcopy.h"

/* What a wait on r shows the watchdog (ckpt_block): 0 for the engine's own
 * rounds on a failed communicator. */
static uint64_t block_what(const chorus_request_t *r) {
  if (r->call_seq)
    return r->call_seq;
  if (r->coll == COLL_SEND || r->coll == COLL_RECV)
    return CKPT_BLOCK_P2P | (r->coll == COLL_RECV ? CKPT_BLOCK_RECV : 0) | (uint32_t)r->peer;
  return 0;
}

void request_wait_done(chorus_request_t *r) {
  chorus_comm_t *c = r->comm;

  if (atomic_load_explicit(&r->done, memory_order_acquire))
    return;
  if (c->set.trace)
    ckpt_block(&c->ckpt, block_what(r));
  /* poll (driving the communicator ourselves when the progress thread
   * is idle) while that moves, and CHORUS_WAIT_SPIN_US more; then sleep */
  comm_drive(c, &r->done, (uint64_t)c->set.wait_spin_us * 1000, 0);
  if (!atomic_load_explicit(&r->done, memory_order_acquire)) {
    pthread_mutex_lock(&c->lock);
    c->waiters++;
    while (!atomic_load_explicit(&r->done, memory_order_acquire))
      pthread_cond_wait(&c->cond, &c->lock);
    c->waiters--;
    pthread_mutex_unlock(&c->lock);
  }
  if (c->set.trace)
    ckpt_unblock(&c->ckpt);
}

CHORUS_API chorus_result chorus_test(chorus_request_t **req, int *done) {
  if (!req || !eng_handle_valid(*req, ENG_HANDLE_REQUEST))
    return eng_error(CHORUS_ERR_INVALID_REQUEST, "chorus_test: not a live request");
  if (!done)
    return eng_error(CHORUS_ERR_INVALID_ARG, "chorus_test: done is NULL");
  chorus_request_t *r = *req;
  if (!atomic_load_explicit(&r->done, memory_order_acquire) && r->submitted)
    comm_drive(r->comm, &r->done, 0, 1); /* one round, if the progress thread is idle */
  if (!atomic_load_explicit(&r->done, memory_order_acquire)) {
    *done = 0;
    return CHORUS_SUCCESS;
  }
  chorus_result rc = r->result;
  *done = 1;
  request_release(r);
  *req = NULL;
  return rc;
}

CHORUS_API chorus_result chorus_wait(chorus_request_t **req) {
  if (!req || !eng_handle_valid(*req, ENG_HANDLE_REQUEST))
    return eng_error(CHORUS_ERR_INVALID_REQUEST, "chorus_wait: not a live request");
  chorus_request_t *r = *req;
  if (!r->submitted && !atomic_load_explicit(&r->done, memory_order_acquire))
    return eng_error(CHORUS_ERR_INVALID_REQUEST,
                     "chorus_wait: the request is queued in an open group and starts only at "
                     "the outermost chorus_group_end (waiting now would never return)");
  request_wait_done(r);
  chorus_result rc = r->result;
  request_release(r);
  *req = NULL;
  return rc;
}
