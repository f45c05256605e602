/*
 * run.c - a communicator at work: its errors and failure, the progress
 * thread, callers driving it, requests handed to it and their completion.
 * comm.c makes and destroys communicators; coll.c turns calls into requests.
 *
 * Threads: the application thread calls the API; the transport and the
 * executor belong to whoever holds `prog_lock`: the communicator's progress
 * thread, or an application thread waiting for a request while the
 * progress thread is idle (comm_drive). They meet in the command queue
 * (application -> executor, under `lock`, with an eventfd to wake a
 * sleeping progress thread for nonblocking calls) and in request completion
 * (an atomic flag plus a condition variable for sleepers).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "algos/algos.h"
#include "comm.h"
#include "endpoint.pb-c.h"
#include "eng.h"
#include "fsm.h"
#include "fault.h"
#include "topo.h"
#include "watch.h"

/* Wakes the progress thread: a count on its eventfd (any thread). A full
 * counter (EAGAIN) is a wake-up already pending. */
static void progress_kick(chorus_comm_t *c) {
  uint64_t one = 1;
  if (c->cmd_fd >= 0 && write(c->cmd_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
    eng_log(ENG_WARN, c->rank, "progress", "eventfd write: %s", strerror(errno));
}

/* ---- errors ---- */

chorus_result comm_error(chorus_comm_t *c, chorus_result rc, const char *fmt, ...) {
  char msg[sizeof(c->last_error)];
  va_list ap;

  int n = snprintf(msg, sizeof(msg), "rank %d: ", c->rank);
  va_start(ap, fmt);
  vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&c->lock);
  memcpy(c->last_error, msg, sizeof(msg));
  pthread_mutex_unlock(&c->lock);
  eng_log(ENG_DEBUG, c->rank, "comm", "%s (%s)", msg, chorus_strerror(rc));
  return rc;
}

void watch_bell_ring(watch_bell_t *b, int bit) {
  uint64_t one = 1;
  atomic_fetch_or(&b->req, bit);
  if (write(b->efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
    eng_log(ENG_WARN, b->rank, "watchdog", "eventfd write: %s", strerror(errno));
}

chorus_result comm_fail(chorus_comm_t *c, chorus_result rc, const char *text) {
  bool first = false;

  pthread_mutex_lock(&c->lock);
  if (!atomic_load(&c->async_rc)) {
    snprintf(c->async_text, sizeof(c->async_text), "%s", text);
    atomic_store(&c->async_rc, (int)rc);
    atomic_store(&c->abort_pending, 1);
    first = true;
  }
  chorus_result now = (chorus_result)atomic_load(&c->async_rc);
  pthread_mutex_unlock(&c->lock);
  if (first) {
    eng_log(ENG_ERR, c->rank, "comm", "communicator failed (%s): %s", chorus_strerror(rc), text);
    progress_kick(c);
    if (c->watch_bell) /* tell the judge now */
      watch_bell_ring(c->watch_bell, WATCH_REQ_FAIL);
  }
  return now;
}

void comm_note_lost(chorus_comm_t *c, const uint32_t *lost, size_t n) {
  pthread_mutex_lock(&c->lock);
  if (!c->lost)
    c->lost = calloc((size_t)c->size, sizeof(bool));
  for (size_t i = 0; c->lost && i < n; i++)
    if (lost[i] < (uint32_t)c->size)
      c->lost[lost[i]] = true;
  pthread_mutex_unlock(&c->lock);
}

#define COMM_UNWEDGE_NS (250ull * 1000 * 1000)

void comm_unwedge(chorus_comm_t *c, bool now) {
  if (!atomic_load(&c->async_rc) || !c->prov || !c->prov->ops->unwedge)
    return;
  uint64_t t = fsm_now_ns(), due = atomic_load(&c->unwedge_after);
  if (!now &&
      (t < due || !atomic_compare_exchange_strong(&c->unwedge_after, &due, t + COMM_UNWEDGE_NS)))
    return;
  int n = c->prov->ops->unwedge(c->prov);
  if (n > 0)
    eng_log(ENG_WARN, c->rank, "comm",
            "freed %d shared-memory queue lock%s that a process killed inside the transport had "
            "left taken: calls waiting on %s return now",
            n, n > 1 ? "s" : "", n > 1 ? "them" : "it");
}

void comm_stall(chorus_comm_t *c, double seconds, const char *why) {
  snprintf(c->stall_why, sizeof(c->stall_why), "%s", why ? why : "");
  atomic_store(&c->stall_until_ns, fsm_now_ns() + (uint64_t)(seconds * 1e9));
  eng_log(ENG_WARN, c->rank, "fault", "progress stalled for %.1f s (%s)", seconds, c->stall_why);
}

void comm_fault_kill(const chorus_comm_t *c, const char *where) {
  eng_log(ENG_WARN, c->rank, "fault", "killing this rank at %s (CHORUS_FAULTS)", where);
  fflush(NULL);
  raise(SIGKILL);
}

/* ---- progress thread ---- */

static void on_wake(evutil_socket_t fd, short what, void *arg) {
  chorus_comm_t *c = arg;
  uint64_t v;
  if (fd == c->cmd_fd && read(c->cmd_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
    eng_log(ENG_WARN, c->rank, "progress", "eventfd read: %s", strerror(errno));
}

static void on_timer(evutil_socket_t fd, short what, void *arg) {}

/* The verdict comes within a poll (1 s) of the judge hearing of it: give
 * it time on a loaded machine too. */
#define COMM_PARK_NS (5000ull * 1000 * 1000)

static void request_exec_done(exec_t *ex, int status, void *arg) {
  chorus_request_t *req = arg;
  chorus_comm_t *c = req->comm;
  const char *why = exec_why(ex);

  bool uncertain = status == CHORUS_ERR_MISMATCH && exec_uncertain(ex);
  /* a split child has no watchdog of its own: its family's head passes the
   * verdicts that concern it on (watch.c, "Families") */
  bool judged = c->watch || (c->family && c->world_of);
  if ((status == CHORUS_ERR_TRANSPORT || uncertain) && judged) {
    chorus_result verdict = (chorus_result)atomic_load(&c->async_rc);
    if (verdict) {
      /* the communicator failed already: its verdict explains this too (a
       * survivor of a lost rank that leaves closes its connections to
       * ranks still in the call: over sock their receives fail at once) */
      request_complete(req, verdict);
      return;
    }
    /* a peer's endpoint went away, or sent a message too long for a call we
     * can not name: the watchdog knows who and why, shortly */
    if (!c->parked)
      c->parked_until = fsm_now_ns() + COMM_PARK_NS;
    req->park_rc = (chorus_result)status;
    req->park_why = why ? strdup(why) : NULL;
    req->next_parked = c->parked;
    c->parked = req;
    return;
  }
  if (why && (status == CHORUS_ERR_MISMATCH || status == CHORUS_ERR_DIVERGED ||
              status == CHORUS_ERR_CORRUPT)) {
    /* the whole communicator fails: peers may wait for us in this call */
    comm_fail(req->comm, (chorus_result)status, why);
    request_complete_text(req, (chorus_result)status, why);
    return;
  }
  request_complete(req, (chorus_result)status);
}

/* A failure (comm_fail) fails the runs it found in flight, once. Applied
 * at the start of a round and again before new runs start: a recovery
 * round (chorus_comm_shrink) is submitted once its caller has seen the
 * failure, and a run it starts must not be failed by that failure's
 * abort, which a round already under way when the failure came would
 * otherwise apply only in the next round. */
static void apply_abort(chorus_comm_t *c) {
  if (!atomic_load_explicit(&c->abort_pending, memory_order_acquire) ||
      !atomic_exchange(&c->abort_pending, 0))
    return;
  exec_fail_all(&c->ex, atomic_load(&c->async_rc));
  /* Peers the verdict named lost will not take or finish what is in flight
   * with them (a link down leaves a half-sent message the transport can not
   * cancel): drop them, so that the callers get the failure now. */
  const prov_ops_t *ops = c->prov ? c->prov->ops : NULL;
  if (!ops || !ops->drop_peer)
    return;
  pthread_mutex_lock(&c->lock);
  for (int p = 0; c->lost && p < c->size; p++)
    if (c->lost[p] && p != c->rank)
      ops->drop_peer(c->prov, p);
  pthread_mutex_unlock(&c->lock);
}

/* Start the runs of queued requests. */
static size_t start_commands(chorus_comm_t *c) {
  size_t n = 0;

  apply_abort(c);

  pthread_mutex_lock(&c->lock);
  chorus_request_t *head = c->cmd_head;
  c->cmd_head = c->cmd_tail = NULL;
  atomic_store(&c->cmd_pending, 0);
  pthread_mutex_unlock(&c->lock);
  while (head) {
    chorus_request_t *req = head;
    head = head->next_cmd;
    req->next_cmd = NULL;
    chorus_result failed = (chorus_result)atomic_load(&c->async_rc);
    if (failed && !req->internal) {
      request_complete(req, failed);
      continue;
    }
    exec_t *ex = exec_create(&c->ex, req->plan, req->sendbuf, req->recvbuf, req->seq,
                             request_exec_done, req);
    if (!ex) {
      comm_error(c, CHORUS_ERR_NO_MEMORY, "%s #%u: out of memory starting the run",
                 coll_kind_str(req->coll), req->seq);
      request_complete(req, CHORUS_ERR_NO_MEMORY);
      continue;
    }
    exec_set_extra(ex, req->xbufs, req->msg_or);
    exec_set_call(ex, req->call_seq, req->fp);
    if (req->recovery)
      exec_set_comm_id(ex, EXEC_COMM_RECOVERY);
    if (req->bounce)
      exec_set_bounce(ex);
    exec_start(&c->ex, ex);
    n++;
  }
  return n;
}

/* What the transport owes peers, sent without polling it where the
 * provider can (prov_ops_t.flush), else a round of its progress. */
static int transport_flush(prov_t *p) {
  return p->ops->flush ? p->ops->flush(p) : p->ops->progress(p);
}

/* One round of progress: new commands' first sends, transport, new
 * commands, runs. Under prog_lock. With `transport` false the transport is
 * only flushed (prov_ops_t.flush: what it owes peers, completions it holds)
 * where it can be, not polled for news. */
static size_t progress_round(chorus_comm_t *c, bool transport) {
  prov_t *p = c->prov;
  size_t n = 0;
  uint64_t stall = atomic_load_explicit(&c->stall_until_ns, memory_order_relaxed);
  if (stall) {
    uint64_t now = fsm_now_ns();
    if (now < stall && !atomic_load(&c->async_rc)) { /* a failure ends the stall */
      /* frozen (fault injection): nothing moves, a little at a time */
      uint64_t left = stall - now;
      struct timespec ts = {0, (long)(left < 10000000 ? left : 10000000)};
      nanosleep(&ts, NULL);
      return 0;
    }
    atomic_store(&c->stall_until_ns, 0);
  }
  fsm_clock_hold();               /* released by progress_once */
  uint64_t now = fsm_coarse_ns(); /* for milliseconds: the trace's quiet time, parking */
  if (c->ex.trace)
    atomic_store_explicit(&c->ckpt.progress_ns, now, memory_order_relaxed);
  apply_abort(c);
  if (c->parked) {
    chorus_result v = (chorus_result)atomic_load(&c->async_rc);
    if (v || now > c->parked_until) {
      while (c->parked) {
        chorus_request_t *r = c->parked;
        c->parked = r->next_parked;
        char *why = r->park_why;
        r->park_why = NULL;
        if (!v && r->park_rc == CHORUS_ERR_MISMATCH && why)
          comm_fail(c, r->park_rc, why); /* no verdict: our own view spreads */
        request_complete_text(r, v ? v : r->park_rc, v ? NULL : why);
        free(why);
        n++;
      }
    }
  }
  if (atomic_load_explicit(&c->cmd_pending, memory_order_acquire)) {
    /* New runs post their first sends before the transport is polled: a
     * blocking call's first round used to poll it (epoll_wait over sock, a
     * system call) before its sends went out, for news the round after them
     * finds as well. */
    n += start_commands(c);
    n += exec_drive(&c->ex);
  }
  int pc = transport ? p->ops->progress(p) : transport_flush(p);

  if (pc > 0) {
    n += (size_t)pc;
    fsm_clock_refresh(); /* the transport may have copied for a while */
  } else if (pc < 0 && !exec_idle(&c->ex)) {
    comm_error(c, CHORUS_ERR_TRANSPORT, "transport progress failed: %s", strerror(-pc));
    exec_fail_all(&c->ex, CHORUS_ERR_TRANSPORT);
  }
  if (atomic_load_explicit(&c->cmd_pending, memory_order_acquire))
    n += start_commands(c);
  n += exec_drive(&c->ex);
  return n;
}

/* One round of progress (progress_round), time stamps held at its start
 * (fsm_clock_hold). */
static size_t progress_once(chorus_comm_t *c, bool transport) {
  size_t n = progress_round(c, transport);
  fsm_clock_release();
  return n;
}

/* Moves the calling thread to home_cpu when it runs elsewhere: a one-CPU
 * affinity makes the kernel migrate it at once, and the old mask, restored
 * right after, lets the kernel move it again as it sees fit (nothing stays
 * pinned). Skipped when home_cpu left the thread's mask or the mask holds
 * one CPU (the application placed it). */
void comm_go_home(chorus_comm_t *c) {
  cpu_set_t old, one;
  int from = sched_getcpu();
  atomic_fetch_add_explicit(&c->home_looks, 1, memory_order_relaxed);
  if (from == c->home_cpu || sched_getaffinity(0, sizeof(old), &old) != 0 ||
      !CPU_ISSET(c->home_cpu, &old) || CPU_COUNT(&old) < 2)
    return;
  CPU_ZERO(&one);
  CPU_SET(c->home_cpu, &one);
  if (sched_setaffinity(0, sizeof(one), &one) != 0)
    return;
  if (sched_setaffinity(0, sizeof(old), &old) != 0)
    eng_log(ENG_WARN, c->rank, "progress", "cannot restore the thread's CPU affinity: %s",
            strerror(errno));
  atomic_fetch_add_explicit(&c->home_moves, 1, memory_order_relaxed);
  eng_log(ENG_DEBUG, c->rank, "progress", "on CPU %d, not its own: moved to CPU %d", from,
          c->home_cpu);
}

/* A waiting driver's look at its CPU (comm_go_home), at most every
 * COMM_HOME_EVERY_NS: with prog_lock, polling, and without it, while the
 * progress thread holds the lock (under load that can be the whole spin:
 * the caller then slept where it was). Drivers of one communicator may race
 * on home_after; a second look is harmless. */
static void comm_home_due(chorus_comm_t *c, uint64_t now) {
  if (c->home_cpu < 0 || now < atomic_load_explicit(&c->home_after, memory_order_relaxed))
    return;
  atomic_store_explicit(&c->home_after, now + COMM_HOME_EVERY_NS, memory_order_relaxed);
  comm_go_home(c);
}

bool comm_yield_due(const chorus_comm_t *c, uint64_t idle_ns) {
  return idle_ns >= c->yield_after_ns;
}

bool idle_clock_over(idle_clock_t *ic, uint64_t now, uint64_t limit) {
  if (!ic->first)
    ic->first = now;
  else if (now - ic->last < IDLE_CLOCK_GAP_NS)
    ic->spent += now - ic->last;
  ic->last = now;
  return ic->spent > limit || now - ic->first > IDLE_CLOCK_WALL * limit;
}

/* Returns whether it left work in flight when it last dropped prog_lock
 * (false when the progress thread held it throughout). */
static bool comm_drive_locked(chorus_comm_t *c, atomic_int *flag, uint64_t idle_ns,
                              unsigned max_rounds, bool start_only, uint64_t wall_ns) {
  idle_clock_t idle = {0};
  unsigned spins = 0, rounds = 0;
  /* ranks that share a core get it back after every idle round: the peer
   * this rank waits for may be the one waiting for the core */
  const unsigned every = c->per_core > 1 ? 0 : COMM_YIELD_EVERY_MASK;
  uint64_t until = wall_ns ? fsm_now_ns() + wall_ns : UINT64_MAX;

  while (!atomic_load_explicit(flag, memory_order_acquire)) {
    if (pthread_mutex_trylock(&c->prog_lock) == 0) {
      prov_t *p = c->prov;
      bool was_armed = c->armed;
      /* the progress thread sleeps: while we poll, peers need not ring it */
      if (was_armed) {
        p->ops->disarm(p);
        c->armed = false;
      }
      while (!atomic_load_explicit(flag, memory_order_acquire)) {
        size_t n = progress_once(c, !start_only);
        if (max_rounds && ++rounds >= max_rounds)
          break;
        if (n) {
          idle = (idle_clock_t){0};
          if (wall_ns && fsm_now_ns() > until)
            break;
          continue;
        }
        if ((++spins & every) == 0) {
          uint64_t now = fsm_now_ns();
          if (idle_clock_over(&idle, now, idle_ns) || now > until)
            break;
          comm_home_due(c, now);
          if (comm_yield_due(c, now - idle.first))
            sched_yield();
        }
      }
      /* The progress thread sleeps (it set `sleeping` under this lock):
       * whatever is still in flight must be able to wake it. */
      bool quiet = !atomic_load(&c->cmd_pending) && !c->ex.stalled;
      bool all_done = quiet && exec_idle(&c->ex) && !c->parked;
      if (was_armed || atomic_load(&c->sleeping)) {
        if (all_done) {
          /* Nothing in flight: leave the transport disarmed (re-arming
           * costs system calls on every call, and nobody needs waking
           * until the application calls again; the sleeper's idle timer
           * re-arms it anyway). */
          /* flush what the transport still owes peers */
          (void)transport_flush(p);
        } else if (atomic_load(&c->aside)) {
          atomic_store(&c->handoff, 1); /* comm_drive wakes it when the last driver is out */
        } else if (quiet && (c->armed || p->ops->arm(p) == 0)) {
          c->armed = true;
        } else {
          progress_kick(c);
        }
      }
      pthread_mutex_unlock(&c->prog_lock);
      return !all_done;
    }
    /* the progress thread is at work: let it */
    if (max_rounds)
      return false;
    if ((++spins & 63) == 0) {
      uint64_t now = fsm_now_ns();
      if (idle_clock_over(&idle, now, idle_ns))
        return false;
      comm_home_due(c, now);
      sched_yield();
    }
  }
  return false;
}

static void comm_drive_as(chorus_comm_t *c, atomic_int *flag, uint64_t idle_ns, unsigned max_rounds,
                          bool start_only, uint64_t wall_ns) {
  atomic_fetch_add(&c->drivers, 1);
  bool left = comm_drive_locked(c, flag, idle_ns, max_rounds, start_only, wall_ns);
  /* The last driver out wakes a progress thread that stepped aside if work
   * is left for it: this request, still open (the caller is about to sleep
   * on it), or what a driver left in flight (`handoff`, or this one's
   * `left`: a progress thread that stepped aside without the lock,
   * progress_relock, may have done so after this driver looked). */
  if (atomic_fetch_sub(&c->drivers, 1) == 1 && atomic_load(&c->aside) &&
      (atomic_exchange(&c->handoff, 0) || left ||
       !atomic_load_explicit(flag, memory_order_acquire)))
    progress_kick(c);
}

void comm_drive(chorus_comm_t *c, atomic_int *flag, uint64_t idle_ns, unsigned max_rounds) {
  comm_drive_as(c, flag, idle_ns, max_rounds, false, 0);
}

/* Whether the progress thread should sleep aside now, its `aside` flag
 * set and fenced: a driver is there, with no command for this thread and
 * no stop. */
static bool aside_due(chorus_comm_t *c) {
  return atomic_load(&c->drivers) && !atomic_load(&c->cmd_pending) && !atomic_load(&c->stop);
}

/* Sleeps aside (without prog_lock): on the eventfd and the timer at tv,
 * not on the transport, whose traffic a driver is reading. */
static void progress_nap_aside(chorus_comm_t *c, const struct timeval *tv) {
  if (c->ev_wait)
    event_del(c->ev_wait);
  evtimer_add(c->ev_timer, tv);
  event_base_loop(c->base, EVLOOP_ONCE);
  evtimer_del(c->ev_timer);
  if (c->ev_wait)
    event_add(c->ev_wait, NULL);
  /* the driver may be the one stuck in the transport */
  comm_unwedge(c, false);
}

/* Takes prog_lock (the progress thread, after a sleep or a yield). While
 * an application thread drives (comm_drive), it takes and drops the lock
 * on every call, and a progress thread blocked on the mutex was woken by
 * each unlock only to find it taken again: a futex wake-up per call, on
 * whichever core the scheduler chose, often another rank's, whose small
 * calls then ran many times slower for tens of milliseconds at a time. So
 * while there is a driver this thread
 * steps aside, sleeping on its eventfd and timer, flagged `sleeping` and
 * `aside` so that the last driver out kicks it when it leaves work in
 * flight (comm_drive_as), and tries again. It never waits on the mutex
 * itself. Returns with the lock, the transport disarmed. */
static void progress_relock(chorus_comm_t *c) {
  while (pthread_mutex_trylock(&c->prog_lock)) {
    if (!atomic_load(&c->drivers) || atomic_load(&c->stop)) {
      /* a short holder (the watchdog's look, a dump): wait by yielding, not
       * on the mutex, which a driver arriving now would keep taken */
      sched_yield();
      continue;
    }
    int was_sleeping = atomic_load(&c->sleeping), was_aside = atomic_load(&c->aside);
    atomic_store(&c->sleeping, 1);
    atomic_store(&c->aside, 1);
    /* Dekker with comm_drive_as's exit: drivers-- then aside?, against
     * aside=1 then drivers? */
    atomic_thread_fence(memory_order_seq_cst);
    if (aside_due(c)) {
      struct timeval tv = {0, 100000};
      progress_nap_aside(c, &tv);
    } else {
      sched_yield(); /* a command for us: its submitter drops the lock soon */
    }
    atomic_store(&c->aside, was_aside);
    atomic_store(&c->sleeping, was_sleeping);
  }
  if (c->armed) { /* a driver armed it for us: we poll now */
    c->prov->ops->disarm(c->prov);
    c->armed = false;
  }
}

/* Sleep on the event base (the fds added to it, the timer at tv) without
 * prog_lock. Under prog_lock; returns with it. The event base is this
 * thread's alone. */
static void progress_sleep(chorus_comm_t *c, const struct timeval *tv) {
  evtimer_add(c->ev_timer, tv);
  pthread_mutex_unlock(&c->prog_lock);
  event_base_loop(c->base, EVLOOP_ONCE);
  evtimer_del(c->ev_timer);
  progress_relock(c);
}

/* An application thread drives (see `drivers`): sleep on the eventfd and
 * the timer alone until it is gone. Under prog_lock; returns with it. */
static void progress_step_aside(chorus_comm_t *c) {
  atomic_store(&c->aside, 1);
  atomic_store(&c->sleeping, 1);
  /* Dekker with comm_drive's exit: drivers-- then aside?, against aside=1
   * then drivers? */
  atomic_thread_fence(memory_order_seq_cst);
  if (aside_due(c)) {
    if (c->armed) {
      c->prov->ops->disarm(c->prov);
      c->armed = false;
    }
    bool idle = exec_idle(&c->ex) && !c->parked;
    struct timeval tv = {idle ? 1 : 0, idle ? 0 : 100000};
    pthread_mutex_unlock(&c->prog_lock);
    progress_nap_aside(c, &tv);
    progress_relock(c);
  }
  atomic_store(&c->sleeping, 0);
  atomic_store(&c->aside, 0);
}

static void *progress_main(void *arg) {
  chorus_comm_t *c = arg;
  prov_t *p = c->prov;
  const uint64_t spin_ns = (uint64_t)c->set.spin_us * 1000;
  uint64_t idle_since = 0;
  unsigned backoff_us = 16;

  atomic_store(&c->prog_tid, (int)gettid());
  pthread_mutex_lock(&c->prog_lock);
  while (!atomic_load(&c->stop)) {
    if (atomic_load_explicit(&c->drivers, memory_order_relaxed) &&
        !atomic_load_explicit(&c->cmd_pending, memory_order_relaxed)) {
      progress_step_aside(c);
      idle_since = 0;
      continue;
    }
    size_t n = progress_once(c, true);
    if (n) {
      idle_since = 0;
      backoff_us = 16;
      continue;
    }
    uint64_t now = fsm_now_ns();
    if (!idle_since)
      idle_since = now;
    if (now - idle_since < spin_ns) {
      /* let a waiting application thread take over */
      pthread_mutex_unlock(&c->prog_lock);
      sched_yield();
      progress_relock(c);
      continue;
    }

    /* Sleep. Dekker with the poster: sleeping=1 then re-check the queue;
     * the poster queues then checks sleeping. */
    atomic_store(&c->sleeping, 1);
    if (atomic_load(&c->cmd_pending) || atomic_load(&c->stop) || p->ops->arm(p) != 0) {
      atomic_store(&c->sleeping, 0);
      continue;
    }
    c->armed = true;
    struct timeval tv;
    if (p->ops->wait_fd(p) < 0 || c->ex.stalled) {
      /* the transport can not wake us, or a post met -EAGAIN (a connection
       * being set up does not signal the fd): poll on a timer, backing off to 1 ms */
      tv.tv_sec = 0;
      tv.tv_usec = backoff_us;
      if (backoff_us < 1000)
        backoff_us *= 2;
    } else {
      /* a safety net only: wake-ups come from the fd; an idle wake-up
       * also gives back the scratch that calls stopped using (exec_trim) */
      bool idle = exec_idle(&c->ex) && !c->parked;
      exec_trim(&c->ex, fsm_now_ns());
      tv.tv_sec = idle ? 1 : 0;
      tv.tv_usec = idle ? 0 : 100000;
    }
    progress_sleep(c, &tv);
    if (c->armed) {
      p->ops->disarm(p);
      c->armed = false;
    }
    atomic_store(&c->sleeping, 0);
    idle_since = 0;
  }
  pthread_mutex_unlock(&c->prog_lock);
  return NULL;
}

static void progress_wake(chorus_comm_t *c) {
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load(&c->sleeping))
    progress_kick(c);
}

int comm_progress_start(chorus_comm_t *c) {
  c->cmd_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (c->cmd_fd < 0)
    return -errno;
  c->base = event_base_new();
  if (!c->base)
    return -ENOMEM;
  c->ev_cmd = event_new(c->base, c->cmd_fd, EV_READ | EV_PERSIST, on_wake, c);
  c->ev_timer = evtimer_new(c->base, on_timer, c);
  if (!c->ev_cmd || !c->ev_timer || event_add(c->ev_cmd, NULL))
    return -ENOMEM;
  int wfd = c->prov->ops->wait_fd(c->prov);
  if (wfd >= 0) {
    c->ev_wait = event_new(c->base, wfd, EV_READ | EV_PERSIST, on_wake, c);
    if (!c->ev_wait || event_add(c->ev_wait, NULL))
      return -ENOMEM;
  }
  int rc = pthread_create(&c->thread, NULL, progress_main, c);
  if (rc)
    return -rc;
  pthread_setname_np(c->thread, "chorus-progress"); /* for top -H, gdb, perf */
  c->thread_started = true;
  return 0;
}

void comm_progress_stop(chorus_comm_t *c) {
  if (c->thread_started) {
    atomic_store(&c->stop, 1);
    progress_kick(c);
    /* it may be stuck in the transport (comm_unwedge) */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 250000000;
    if (ts.tv_nsec >= 1000000000) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000;
    }
    while (pthread_timedjoin_np(c->thread, NULL, &ts) == ETIMEDOUT) {
      comm_unwedge(c, false);
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_sec++;
    }
    c->thread_started = false;
  }
  if (c->ev_wait)
    event_free(c->ev_wait);
  if (c->ev_cmd)
    event_free(c->ev_cmd);
  if (c->ev_timer)
    event_free(c->ev_timer);
  if (c->base)
    event_base_free(c->base);
  if (c->cmd_fd >= 0)
    close(c->cmd_fd);
  c->ev_wait = c->ev_cmd = c->ev_timer = NULL;
  c->base = NULL;
  c->cmd_fd = -1;
}

/* Transport: CHORUS_PROVIDER for everything when set; else by topology:
 * shm on one host, sock (Chorus's TCP transport) when no two ranks share a
 * host, and otherwise shm inside each host with sock between hosts
 * (prov_multi). libfabric's tcp stays a CHORUS_PROVIDER choice. */
const char *comm_provider_choice(const chorus_comm_t *c) {
  if (c->local)
    return "inproc";
  if (c->set.provider[0])
    return c->set.provider;
  if (!c->topo || c->topo->nhosts <= 1)
    return "shm";
  if (topo_one_rank_per_host(c->topo))
    return "sock";
  return "shm+sock";
}

bool comm_intra_network(const chorus_comm_t *c) {
  const char *name = comm_provider_choice(c);
  return strcmp(name, "inproc") != 0 && strncmp(name, "shm", 3) != 0;
}

bool comm_shm_only(const chorus_comm_t *c) {
  return strcmp(comm_provider_choice(c), "shm") == 0;
}

bool comm_all_sock(const chorus_comm_t *c) {
  return strcmp(comm_provider_choice(c), "sock") == 0;
}

/* ---- requests: completion and release ---- */

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
  pthread_mutex_lock(&c->lock);
  req->result = rc;
  atomic_store_explicit(&req->done, 1, memory_order_release);
  if (c->waiters)
    pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->lock);
}

void request_release(chorus_request_t *req) {
  chorus_comm_t *c = req->comm;

  if (req->handle)
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

/* ---- requests to the progress thread ---- */

void comm_submit(chorus_comm_t *c, chorus_request_t *req, bool wake, uint64_t drive_ns) {
  req->submitted = true;
  pthread_mutex_lock(&c->lock);
  if (c->cmd_tail)
    c->cmd_tail->next_cmd = req;
  else
    c->cmd_head = req;
  c->cmd_tail = req;
  atomic_store_explicit(&c->cmd_pending, 1, memory_order_release);
  pthread_mutex_unlock(&c->lock);
  if (!wake)
    return;
  /* Start it from this thread when the progress engine is free: its first
   * sends are posted before the call returns, and a sleeping progress thread
   * is not woken (a wake-up and a switch to it cost more than a small
   * exchange on shm), only armed to wake when the transport has news. When
   * the engine is busy, its holder starts it; a sleeper is woken all the
   * same when the request is still queued. That round only flushes the
   * transport where it can (sock: completions of sends that went out at
   * once, no epoll_wait): the caller who waits polls it next. With drive_ns
   * the caller drives it in full for up to that long instead (coll.c,
   * "Starting"). */
  if (drive_ns)
    comm_drive_as(c, &req->done, drive_ns, 0, false, drive_ns);
  else
    comm_drive_as(c, &req->done, 0, 1, true, 0);
  if (atomic_load(&c->cmd_pending))
    progress_wake(c);
}
