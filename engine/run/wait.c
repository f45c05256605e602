/*
 * wait.c - waiting on requests from threads other than the caller's.
 *
 * chorus_test and chorus_wait release the request they see finish, and a
 * release (like every call that starts an operation) edits the
 * communicator's lists without a lock: one application thread at a time.
 * A framework that completes its operations' futures on a thread of its
 * own (the PyTorch backend) needs two things more, both safe while
 * another thread makes calls on the same communicator:
 *
 *   chorus_wait_for       chorus_wait with a timeout and without the
 *                         release: the caller drives the communicator
 *                         exactly as chorus_wait does (no hand-off on the
 *                         latency path); whoever owns the request releases
 *                         it afterwards with chorus_test, serialised with
 *                         the communicator's other calls.
 *   chorus_comm_wait_any  sleep until some request of the communicator
 *                         finishes, without driving it (a helper thread
 *                         must not take the CPU from the caller's).
 *
 * Both sleep on the communicator's condition variable, which
 * request_complete broadcasts while anyone waits on it (c->waiters).
 */
#include <errno.h>
#include <pthread.h>
#include <time.h>

#include "comm.h"
#include "eng.h"
#include "fsm.h"

/* The absolute CLOCK_REALTIME time (the condition variable's clock)
 * timeout_s from now. */
static struct timespec wait_deadline(double timeout_s) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  long long ns = (long long)(timeout_s * 1e9);
  ts.tv_sec += (time_t)(ns / 1000000000LL);
  ts.tv_nsec += (long)(ns % 1000000000LL);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

/* Sleeps on c->cond until *flag is set, the deadline passes (timeout_s
 * >= 0) or, with any_wake, the first broadcast. */
static void wait_sleep(chorus_comm_t *c, atomic_int *flag, double timeout_s, bool any_wake) {
  struct timespec dl = wait_deadline(timeout_s < 0 ? 0 : timeout_s);

  pthread_mutex_lock(&c->lock);
  c->waiters++;
  while (!flag || !atomic_load_explicit(flag, memory_order_acquire)) {
    int rc = timeout_s < 0 ? pthread_cond_wait(&c->cond, &c->lock)
                           : pthread_cond_timedwait(&c->cond, &c->lock, &dl);
    if (rc == ETIMEDOUT || any_wake)
      break;
  }
  c->waiters--;
  pthread_mutex_unlock(&c->lock);
}

CHORUS_API chorus_result chorus_wait_for(chorus_request_t *req, double timeout_s, int *done) {
  if (!eng_handle_valid(req, ENG_HANDLE_REQUEST))
    return eng_error(CHORUS_ERR_INVALID_REQUEST, "chorus_wait_for: not a live request");
  if (!done)
    return eng_error(CHORUS_ERR_INVALID_ARG, "chorus_wait_for: done is NULL");
  *done = 0;
  chorus_comm_t *c = req->comm;
  if (atomic_load_explicit(&req->done, memory_order_acquire)) {
    *done = 1;
    return CHORUS_SUCCESS;
  }
  if (!req->submitted)
    return eng_error(CHORUS_ERR_INVALID_REQUEST,
                     "chorus_wait_for: the request is queued in an open group and starts only "
                     "at the outermost chorus_group_end");
  uint64_t start = fsm_now_ns();
  uint64_t spin_ns = (uint64_t)c->set.wait_spin_us * 1000;
  if (timeout_s >= 0 && timeout_s * 1e9 < (double)spin_ns)
    spin_ns = (uint64_t)(timeout_s * 1e9);
  /* as chorus_wait: poll while that moves and spin_ns more, then sleep */
  if (timeout_s != 0)
    comm_drive(c, &req->done, spin_ns, 0);
  if (!atomic_load_explicit(&req->done, memory_order_acquire) && timeout_s != 0) {
    double left = timeout_s < 0 ? -1 : timeout_s - (double)(fsm_now_ns() - start) / 1e9;
    if (timeout_s < 0 || left > 0)
      wait_sleep(c, &req->done, left, false);
  }
  *done = atomic_load_explicit(&req->done, memory_order_acquire) ? 1 : 0;
  return CHORUS_SUCCESS;
}

CHORUS_API chorus_result chorus_comm_wait_any(chorus_comm_t *comm, double timeout_s) {
  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return eng_error(CHORUS_ERR_INVALID_COMM,
                     "chorus_comm_wait_any: not a live communicator (NULL or destroyed)");
  if (timeout_s != 0)
    wait_sleep(comm, NULL, timeout_s, true);
  return CHORUS_SUCCESS;
}
