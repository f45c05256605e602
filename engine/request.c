/*
 * request.c - completion of nonblocking operations.
 *
 * The progress thread completes a request (request_complete); the
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

void request_complete(chorus_request_t *req, chorus_result rc) {
  request_complete_text(req, rc, NULL);
}

void request_complete_text(chorus_request_t *req, chorus_result rc, const char *why) {
  chorus_comm_t *c = req->comm;
  char text[sizeof(c->async_text)];

  if (req->call_seq)
    ckpt_end(&c->ckpt, req->call_seq, rc);
  if (rc)
    atomic_store(&c->failed_any, true);
  if (rc && !why) {
    /* the communicator's failure explains its calls' */
    pthread_mutex_lock(&c->lock);
    if (rc == (chorus_result)atomic_load(&c->async_rc) && c->async_text[0]) {
      memcpy(text, c->async_text, sizeof(text));
      why = text;
    }
    pthread_mutex_unlock(&c->lock);
  }
  if (rc && why)
    comm_error(c, rc, "%s", why);
  else if (rc && req->call_seq)
    comm_error(c, rc, "%s #%llu (%s, %llu elements) failed: %s", coll_kind_str(req->coll),
               (unsigned long long)req->call_seq, chorus_dtype_name(req->plan->dtype),
               (unsigned long long)req->count, chorus_strerror(rc));
  else if (rc)
    comm_error(c, rc, "%s (%s, %llu elements) failed: %s", coll_kind_str(req->coll),
               chorus_dtype_name(req->plan->dtype), (unsigned long long)req->count,
               chorus_strerror(rc));
  if (!rc && req->stage_out) /* the result, out of the staging buffer (coll.c) */
    memcopy(req->stage_out, c->stage, req->stage_len);
  pthread_mutex_lock(&c->lock);
  req->result = rc;
  atomic_store_explicit(&req->done, 1, memory_order_release);
  if (c->waiters)
    pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->lock);
}

void request_release(chorus_request_t *req) {
  chorus_comm_t *c = req->comm;

  eng_handle_remove(req);
  if (req->slot)
    req->slot->refs--;
  else
    plan_free(req->plan);
  if (req->prev_live)
    req->prev_live->next_live = req->next_live;
  else
    c->live = req->next_live;
  if (req->next_live)
    req->next_live->prev_live = req->prev_live;
  free(req->xbufs);
  free(req->park_why);
  free(req->tmp);
  if (req->staged)
    c->stage_busy = false;
  if (!c->spare_req)
    c->spare_req = req; /* the next call's (coll_prepare) */
  else
    free(req);
}

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
