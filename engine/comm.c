/*
 * comm.c - communicators: creation (bootstrap, transport, progress thread),
 * destruction, argument validation and the allreduce entry points.
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
    if (c->watch)
      watch_notify_failure(c->watch);
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

CHORUS_API chorus_result chorus_comm_abort(chorus_comm_t *comm) {
  char text[128];
  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return eng_error(CHORUS_ERR_INVALID_COMM, "chorus_comm_abort: not a live communicator");
  snprintf(text, sizeof(text), "rank %d aborted the communicator (chorus_comm_abort)", comm->rank);
  comm_fail(comm, CHORUS_ERR_ABORTED, text);
  return CHORUS_SUCCESS;
}

CHORUS_API chorus_result chorus_comm_get_async_error(chorus_comm_t *comm, chorus_result *error) {
  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return eng_error(CHORUS_ERR_INVALID_COMM,
                     "chorus_comm_get_async_error: not a live communicator");
  if (!error)
    return comm_error(comm, CHORUS_ERR_INVALID_ARG, "chorus_comm_get_async_error: error is NULL");
  *error = (chorus_result)atomic_load(&comm->async_rc);
  if (*error) {
    char text[sizeof(comm->async_text)];
    pthread_mutex_lock(&comm->lock);
    memcpy(text, comm->async_text, sizeof(text));
    pthread_mutex_unlock(&comm->lock);
    comm_error(comm, *error, "%s", text);
  }
  return CHORUS_SUCCESS;
}

CHORUS_API chorus_result chorus_comm_dump(chorus_comm_t *comm, const char *dir) {
  char path[1100];
  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return eng_error(CHORUS_ERR_INVALID_COMM, "chorus_comm_dump: not a live communicator");
  if (!dir || !*dir)
    dir = comm->set.trace_dir;
  if (!*dir)
    return comm_error(comm, CHORUS_ERR_INVALID_ARG,
                      "chorus_comm_dump: no directory (pass one, or set CHORUS_TRACE_DIR)");
  char text[64];
  snprintf(text, sizeof(text), "rank %d dumped on request (chorus_comm_dump)", comm->rank);
  int rc = dump_write(comm, dir, 2 /* Verdict.REQUEST */, -1, 0, text, NULL, 0, path, sizeof(path));
  if (rc)
    return comm_error(comm, CHORUS_ERR_INTERNAL, "chorus_comm_dump: writing into %s failed: %s",
                      dir, strerror(-rc));
  return CHORUS_SUCCESS;
}

CHORUS_API const char *chorus_comm_last_error(const chorus_comm_t *comm) {
  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return "invalid or destroyed communicator";
  return comm->last_error;
}

/* ---- in-process jobs ---- */

struct eng_local_job {
  int nranks;
  prov_inproc_world_t *world;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int arrived;
  unsigned generation;
  void **slots; /* allgather contributions */
  size_t *lens;
  /* Jobs made by chorus_comm_split belong to their communicators: the
   * last one destroyed frees the job. 0 for jobs their creator frees. */
  atomic_int comm_refs;
};

eng_local_job_t *eng_local_job_create(int nranks) {
  eng_local_job_t *j = calloc(1, sizeof(*j));
  if (!j)
    return NULL;
  j->nranks = nranks;
  j->world = prov_inproc_world_create(nranks);
  j->slots = calloc((size_t)nranks, sizeof(*j->slots));
  j->lens = calloc((size_t)nranks, sizeof(*j->lens));
  if (!j->world || !j->slots || !j->lens) {
    eng_local_job_destroy(j);
    return NULL;
  }
  pthread_mutex_init(&j->lock, NULL);
  pthread_cond_init(&j->cond, NULL);
  return j;
}

eng_local_job_t *eng_local_job_create_shared(int nranks) {
  eng_local_job_t *j = eng_local_job_create(nranks);
  if (j)
    atomic_store(&j->comm_refs, nranks);
  return j;
}

/* A communicator lets go of its job (after closing its endpoint). */
static void local_job_release(eng_local_job_t *j) {
  if (j && atomic_load(&j->comm_refs) > 0 && atomic_fetch_sub(&j->comm_refs, 1) == 1)
    eng_local_job_destroy(j);
}

void eng_local_job_destroy(eng_local_job_t *j) {
  if (!j)
    return;
  if (j->world)
    prov_inproc_world_destroy(j->world);
  free(j->slots);
  free(j->lens);
  pthread_mutex_destroy(&j->lock);
  pthread_cond_destroy(&j->cond);
  free(j);
}

/* Allgather among the threads of a local job: same contract as boot_allgather. */
static int local_allgather(eng_local_job_t *j, int rank, const void *mine, size_t len,
                           void ***out_ptrs, size_t **out_lens) {
  pthread_mutex_lock(&j->lock);
  unsigned gen = j->generation;
  j->slots[rank] = (void *)(uintptr_t)mine;
  j->lens[rank] = len;
  if (++j->arrived == j->nranks) {
    j->arrived = 0;
    j->generation++;
    pthread_cond_broadcast(&j->cond);
  } else {
    while (j->generation == gen)
      pthread_cond_wait(&j->cond, &j->lock);
  }
  /* copy out while every contributor still waits at the second barrier below */
  size_t total = 0;
  for (int i = 0; i < j->nranks; i++)
    total += j->lens[i];
  void **ptrs = malloc((size_t)j->nranks * sizeof(void *) + total + 1);
  size_t *lens = malloc((size_t)j->nranks * sizeof(size_t));
  if (ptrs && lens) {
    uint8_t *data = (uint8_t *)(ptrs + j->nranks);
    for (int i = 0; i < j->nranks; i++) {
      memcpy(data, j->slots[i], j->lens[i]);
      ptrs[i] = data;
      lens[i] = j->lens[i];
      data += j->lens[i];
    }
  }
  /* second barrier: nobody's contribution is overwritten while others copy */
  gen = j->generation;
  if (++j->arrived == j->nranks) {
    j->arrived = 0;
    j->generation++;
    pthread_cond_broadcast(&j->cond);
  } else {
    while (j->generation == gen)
      pthread_cond_wait(&j->cond, &j->lock);
  }
  pthread_mutex_unlock(&j->lock);
  if (!ptrs || !lens) {
    free(ptrs);
    free(lens);
    return -ENOMEM;
  }
  *out_ptrs = ptrs;
  *out_lens = lens;
  return 0;
}

chorus_result comm_allgather(chorus_comm_t *c, const void *mine, size_t len, void ***ptrs,
                             size_t **lens, double timeout_s) {
  char err[1024];
  int rc;

  if (c->local) {
    rc = local_allgather(c->local, c->rank, mine, len, ptrs, lens);
    return rc ? comm_error(c, CHORUS_ERR_NO_MEMORY, "allgather: out of memory") : 0;
  }
  if (!c->boot) /* made by chorus_comm_split: over its own transport */
    return comm_xport_allgather(c, mine, len, ptrs, lens);
  rc = boot_allgather(c->boot, mine, len, ptrs, lens, timeout_s, err, sizeof(err));
  return rc ? comm_error(c, (chorus_result)rc, "%s", err) : 0;
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
  uint64_t now = fsm_clock_hold(); /* released by progress_once */
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
static void comm_go_home(chorus_comm_t *c) {
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

bool comm_yield_due(const chorus_comm_t *c, uint64_t idle_ns, uint64_t now) {
  return idle_ns >= (now < c->yield_crowded_until ? 0 : c->yield_after_ns);
}

void comm_yielded(chorus_comm_t *c, uint64_t before, uint64_t after) {
  /* a long yield: something else ran on this core (a peer the kernel put
   * here, say): yield at once for a while */
  if (after - before > COMM_YIELD_LONG_NS)
    c->yield_crowded_until = after + COMM_YIELD_CROWDED_NS;
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
        if ((++spins & 15) == 0) {
          uint64_t now = fsm_now_ns();
          if (idle_clock_over(&idle, now, idle_ns) || now > until)
            break;
          comm_home_due(c, now);
          if (comm_yield_due(c, now - idle.first, now)) {
            sched_yield();
            comm_yielded(c, now, fsm_now_ns());
          }
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

static int progress_start(chorus_comm_t *c) {
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

static void progress_stop(chorus_comm_t *c) {
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

/* ---- creation ---- */

chorus_comm_t *comm_alloc(int rank, int size) {
  chorus_comm_t *c = calloc(1, sizeof(*c));
  if (!c)
    return NULL;
  c->rank = rank;
  c->size = size;
  c->cmd_fd = -1;
  c->home_cpu = COMM_HOME_UNSET;
  pthread_mutex_init(&c->lock, NULL);
  pthread_mutex_init(&c->prog_lock, NULL);
  pthread_cond_init(&c->cond, NULL);
  strcpy(c->last_error, "no error");
  ckpt_init(&c->ckpt);
  return c;
}

void comm_free(chorus_comm_t *c) {
  watch_family_remove(c);
  watch_stop(c->watch);
  c->watch = NULL;
  progress_stop(c);
  comm_unwedge(c, true); /* closing reads our own queue */
  /* a peer killed on this host leaves its shm region behind: remove it */
  if (c->prov && c->prov->ops->reap && c->prov->ops->reap(c->prov) > 0)
    eng_log(ENG_INFO, c->rank, "comm", "removed the shared memory of ended peers");
  if (c->prov)
    c->prov->ops->close(c->prov);
  local_job_release(c->local);
  topo_free(c->topo);
  plan_free(c->ctl_plan);
  exec_ctx_fini(&c->ex);
  if (c->boot)
    boot_close(c->boot);
  coll_comm_fini(c);
  pthread_mutex_destroy(&c->lock);
  pthread_mutex_destroy(&c->prog_lock);
  pthread_cond_destroy(&c->cond);
  ckpt_fini(&c->ckpt);
  fault_plan_free(c->faults);
  free(c->lost);
  free(c->world_of);
  free(c);
}

static size_t once_records;

static void global_once(void) {
  evthread_use_pthreads();
  fsm_journal_configure(once_records);
  fsm_machine_register(&exec_step_machine);
}

static void global_init(const chorus_settings_t *s) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;

  once_records = s->journal_records;
  pthread_once(&once, global_once);
  fsm_journal_enable(s->journal);
  eng_log_level = s->log_level;
}

/* ---- topology and transport ---- */

/* c->topo for a communicator made from scratch: the bootstrap's table of
 * hosts (one host for an in-process job), cut further by CHORUS_TOPO. */
static chorus_result comm_topo_init(chorus_comm_t *c) {
  char err[512];
  int *labels = malloc((size_t)c->size * sizeof(*labels));
  const char **hosts = malloc((size_t)c->size * sizeof(*hosts));
  topo_t *real = NULL, *emu = NULL;
  chorus_result ret = CHORUS_SUCCESS;

  if (!labels || !hosts) {
    ret = comm_error(c, CHORUS_ERR_NO_MEMORY, "out of memory");
    goto out;
  }
  if (topo_parse(c->set.topo, c->size, labels, err, sizeof(err))) {
    ret = comm_error(c, CHORUS_ERR_ENV, "%s", err);
    goto out;
  }
  emu = topo_from_labels(labels, c->size);
  if (c->boot) {
    for (int r = 0; r < c->size; r++)
      hosts[r] = boot_host_of(c->boot, r);
    real = topo_from_hosts(hosts, c->size);
  }
  c->topo = emu && (real || !c->boot) ? topo_refine(real, emu, c->size) : NULL;
  if (!c->topo) {
    ret = comm_error(c, CHORUS_ERR_NO_MEMORY, "out of memory");
    goto out;
  }
  if (eng_log_level >= ENG_DEBUG) {
    char d[256];
    topo_describe(c->topo, d, sizeof(d));
    eng_log(ENG_DEBUG, c->rank, "comm", "topology: %s", d);
  }
out:
  topo_free(real);
  topo_free(emu);
  free(hosts);
  free(labels);
  return ret;
}

/* Transport: CHORUS_PROVIDER for everything when set; else by topology:
 * shm on one host, sock (Chorus's TCP transport) when no two ranks share a
 * host, and otherwise shm inside each host with sock between hosts
 * (prov_multi). libfabric's tcp stays a CHORUS_PROVIDER choice. */
static const char *choose_provider(const chorus_comm_t *c) {
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
  const char *name = choose_provider(c);
  return strcmp(name, "inproc") != 0 && strncmp(name, "shm", 3) != 0;
}

bool comm_shm_only(const chorus_comm_t *c) {
  return strcmp(choose_provider(c), "shm") == 0;
}

bool comm_all_sock(const chorus_comm_t *c) {
  return strcmp(choose_provider(c), "sock") == 0;
}

/* Bouncing costs a second copy, and a rewrite of memory the receiver has
 * just read, to save CMA's page pinning: a gain for small messages, where
 * pinning dominates. The default stops at 64 KiB: larger slots won only
 * while the cores shared data cheaply and lost by far otherwise. When ranks
 * outnumber the cores, where two copies cost more than one, it never passes
 * 64 KiB. A lower limit is faster with two ranks on cores of their own (a
 * bounced line crosses between the cores twice) but slower when the kernel
 * keeps both on one core, where one cache beats CMA's system calls.
 * Measurements: docs/performance.md and the commits that set these. */
#define SHM_BOUNCE_SHARED (64u << 10)
size_t comm_shm_bounce(const chorus_comm_t *c) {
  size_t b = c->set.shm_bounce;
  if (b > SHM_BOUNCE_SHARED && coll_ranks_per_core(c) > 1)
    b = SHM_BOUNCE_SHARED;
  return b ? b : PROV_BOUNCE_NONE;
}

/* A transport's line about what it refused at its door (prov_config_t.log). */
static void comm_prov_log(void *arg, const char *line) {
  const chorus_comm_t *c = arg;

  eng_log(ENG_WARN, c->rank, "sock", "%s", line);
}

/* Where sock listens when CHORUS_SOCK_IFACE (or FI_TCP_IFACE) names no
 * interface: loopback when every rank is on this host; else the address
 * this rank reached rank 0's rendezvous from, the one the job's network
 * gave it; a split child, with no rendezvous, its parent's choice. ""
 * when none is known (the provider then takes the first interface up). */
static void sock_listen_addr(const chorus_comm_t *c, char *out, size_t len) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof(ss);
  const char *me = c->boot ? boot_host_of(c->boot, c->rank) : NULL;
  bool one_host = me != NULL;
  int fd = c->boot ? boot_fd(c->boot) : -1;

  out[0] = '\0';
  if (!c->boot) {
    snprintf(out, len, "%s", c->sock_listen);
    return;
  }
  for (int r = 0; one_host && r < c->size; r++) {
    const char *h = boot_host_of(c->boot, r);

    one_host = h && strcmp(h, me) == 0;
  }
  if (one_host) {
    snprintf(out, len, "127.0.0.1");
    return;
  }
  if (fd < 0 || getsockname(fd, (struct sockaddr *)&ss, &sl) != 0)
    return;
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, out, (socklen_t)len);
  } else if (ss.ss_family == AF_INET6) {
    const struct in6_addr *a = &((struct sockaddr_in6 *)&ss)->sin6_addr;

    if (IN6_IS_ADDR_V4MAPPED(a))
      inet_ntop(AF_INET, &a->s6_addr[12], out, (socklen_t)len);
  }
}

/* CHORUS_FAULTS as a plan, once. */
static chorus_result comm_faults_load(chorus_comm_t *c) {
  char err[1024];

  if (!c->set.faults[0] || c->faults)
    return CHORUS_SUCCESS;
  if (fault_plan_parse(c->set.faults, &c->faults, err, sizeof(err)))
    return comm_error(c, CHORUS_ERR_ENV, "CHORUS_FAULTS: %s", err);
  return CHORUS_SUCCESS;
}

/* CHORUS_FAULTS kill and stall rules at=create#STAGE, as this rank forms a
 * communicator from a rendezvous: it dies, or sleeps, right after stage
 * 1 (joined the rendezvous), 2 (opened its transport), 3 (inserted every
 * peer's endpoint) or 4 (started its watchdog, about to return). */
static chorus_result comm_create_faults(chorus_comm_t *c, int stage) {
  static const char *const what[] = {"", "joined the rendezvous", "opened its transport",
                                     "inserted the peers' endpoints", "started its watchdog"};
  chorus_result ret;
  char where[96];
  double s = 0;

  if (!c->set.faults[0] || !c->boot)
    return CHORUS_SUCCESS;
  if ((ret = comm_faults_load(c)))
    return ret;
  snprintf(where, sizeof(where), "create#%d, as it formed the communicator: %s", stage,
           what[stage]);
  switch (fault_plan_on_call(c->faults, c->rank, FAULT_AT_CREATE, (uint64_t)stage, &s)) {
  case FAULT_CALL_KILL:
    comm_fault_kill(c, where);
    break;
  case FAULT_CALL_STALL:
    eng_log(ENG_WARN, c->rank, "fault", "freezing this rank for %.1f s at %s (CHORUS_FAULTS)", s,
            where);
    for (uint64_t end = fsm_now_ns() + (uint64_t)(s * 1e9), now; (now = fsm_now_ns()) < end;) {
      struct timespec ts = {(time_t)((end - now) / 1000000000u), (long)((end - now) % 1000000000u)};
      nanosleep(&ts, NULL);
    }
    break;
  default:
    break;
  }
  return CHORUS_SUCCESS;
}

chorus_result comm_open_transport(chorus_comm_t *c) {
  char err[1024] = "", listen_addr[sizeof(c->sock_listen)];
  const char *name = choose_provider(c);
  const char *job_id = c->set.job_token[0] ? c->set.job_token : "chorus";
  prov_config_t cfg = {.name = name,
                       .rank = c->rank,
                       .nranks = c->size,
                       .job_id = job_id,
                       .inproc_world = c->local ? c->local->world : NULL,
                       .host_of = c->topo ? c->topo->host_of : NULL,
                       .shm_bounce = comm_shm_bounce(c),
                       .iface = c->set.sock_iface,
                       .sock_addr = listen_addr,
                       .log = comm_prov_log,
                       .log_arg = c,
                       .sock_sndbuf = c->set.sock_sndbuf};
  sock_listen_addr(c, listen_addr, sizeof(listen_addr));
  snprintf(c->sock_listen, sizeof(c->sock_listen), "%s", listen_addr);
  if (c->set.faults[0]) {
    chorus_result ret = comm_faults_load(c);
    if (ret)
      return ret;
    /* the sequence field of exec_tag(): collective numbers in tags */
    cfg.faults = c->set.faults;
    cfg.fault_tag_seq_shift = 24;
    cfg.fault_tag_seq_bits = 16;
    eng_log(ENG_WARN, c->rank, "fault", "fault injection on: %s", c->set.faults);
  }
  int rc = prov_open(&cfg, &c->prov, err, sizeof(err));
  if (rc)
    return comm_error(c, CHORUS_ERR_TRANSPORT, "opening transport '%s' failed: %s", name, err);
  return CHORUS_SUCCESS;
}

chorus_result comm_pack_endpoint(chorus_comm_t *c, const char *host, uint8_t **out,
                                 size_t *outlen) {
  uint8_t addr[2048];
  size_t alen = sizeof(addr);
  int rc;

  *out = NULL;
  *outlen = 0;
  rc = c->prov->ops->getname(c->prov, addr, &alen);
  if (rc)
    return comm_error(c, CHORUS_ERR_TRANSPORT, "transport %s: getname failed: %s", c->prov->name,
                      strerror(-rc));
  Chorus__Ep__Endpoint me = CHORUS__EP__ENDPOINT__INIT;
  me.rank = (uint32_t)c->rank;
  me.provider = (char *)c->prov->name;
  me.address.data = addr;
  me.address.len = alen;
  me.host = (char *)host;
  me.pid = (uint32_t)getpid();
  size_t plen = chorus__ep__endpoint__get_packed_size(&me);
  uint8_t *packed = malloc(plen ? plen : 1);
  if (!packed)
    return comm_error(c, CHORUS_ERR_NO_MEMORY, "out of memory");
  chorus__ep__endpoint__pack(&me, packed);
  *out = packed;
  *outlen = plen;
  return CHORUS_SUCCESS;
}

/* The CHORUS_TOPO part of a record's host field ("identity|spec"). */
static const char *record_topo(const char *host) {
  const char *bar = host ? strchr(host, '|') : NULL;
  return bar ? bar + 1 : "";
}

chorus_result comm_add_peer_records(chorus_comm_t *c, void *const *recs, const size_t *lens,
                                    const int *members, bool check_topo) {
  const void **addrs = NULL;
  size_t *alens = NULL;
  Chorus__Ep__Endpoint **eps = NULL;
  chorus_result ret = CHORUS_SUCCESS;
  int rc;

  eps = calloc((size_t)c->size, sizeof(*eps));
  addrs = calloc((size_t)c->size, sizeof(*addrs));
  alens = calloc((size_t)c->size, sizeof(*alens));
  if (!eps || !addrs || !alens) {
    ret = comm_error(c, CHORUS_ERR_NO_MEMORY, "out of memory");
    goto out;
  }
  const char *my_topo = "";
  for (int i = 0; i < c->size; i++) {
    int k = members ? members[i] : i;
    if (lens[k] == 0) {
      ret = comm_error(c, CHORUS_ERR_TRANSPORT, "rank %d could not open its transport", i);
      goto out;
    }
    eps[i] = chorus__ep__endpoint__unpack(NULL, lens[k], recs[k]);
    if (!eps[i] || eps[i]->rank != (uint32_t)i) {
      ret = comm_error(c, CHORUS_ERR_BOOTSTRAP, "malformed endpoint record from rank %d", i);
      goto out;
    }
    if (i == c->rank)
      my_topo = record_topo(eps[i]->host);
  }
  for (int i = 0; i < c->size; i++) {
    if (check_topo && strcmp(record_topo(eps[i]->host), my_topo) != 0) {
      ret = comm_error(c, CHORUS_ERR_ENV,
                       "rank %d runs with CHORUS_TOPO=\"%s\" but rank %d with \"%s\": set the "
                       "same CHORUS_TOPO on every rank",
                       i, record_topo(eps[i]->host), c->rank, my_topo);
      goto out;
    }
    if (strcmp(eps[i]->provider, c->prov->name) != 0) {
      ret = comm_error(c, CHORUS_ERR_TRANSPORT,
                       "rank %d uses transport '%s' but rank %d uses '%s': set the same "
                       "CHORUS_PROVIDER on every rank",
                       i, eps[i]->provider, c->rank, c->prov->name);
      goto out;
    }
    addrs[i] = eps[i]->address.data;
    alens[i] = eps[i]->address.len;
  }
  rc = c->prov->ops->add_peers(c->prov, addrs, alens, c->size);
  if (rc) {
    ret = comm_error(c, CHORUS_ERR_TRANSPORT,
                     "transport %s: inserting peer addresses failed: %s (%s)", c->prov->name,
                     strerror(-rc), c->prov->last_error);
    goto out;
  }
  /* every rank comes here: the peers' names (shm's /dev/shm files) go now */
  rc = c->prov->ops->settle ? c->prov->ops->settle(c->prov, c->set.connect_timeout_s) : 0;
  if (rc)
    ret = comm_error(c, rc == -ETIMEDOUT ? CHORUS_ERR_TIMEOUT : CHORUS_ERR_PEER_LOST,
                     "transport %s: waiting for the peers to map this rank's shared memory: %s",
                     c->prov->name, c->prov->last_error);
out:
  if (eps)
    for (int i = 0; i < c->size; i++)
      if (eps[i])
        chorus__ep__endpoint__free_unpacked(eps[i], NULL);
  free(eps);
  free(addrs);
  free(alens);
  return ret;
}

/* Publish our endpoint, learn everyone's, insert them into the transport. */
static chorus_result exchange_endpoints(chorus_comm_t *c, const char *host) {
  char id[512];
  uint8_t *packed;
  size_t plen;
  void **ptrs = NULL;
  size_t *lens = NULL;
  chorus_result ret;

  snprintf(id, sizeof(id), "%s|%s", host, c->set.topo);
  if ((ret = comm_pack_endpoint(c, id, &packed, &plen)))
    return ret;
  ret = comm_allgather(c, packed, plen, &ptrs, &lens, c->set.connect_timeout_s);
  free(packed);
  if (ret)
    return ret;
  ret = comm_add_peer_records(c, ptrs, lens, NULL, true);
  free(ptrs);
  free(lens);
  return ret;
}

chorus_result comm_start(chorus_comm_t *c) {
  int rc;

  c->ex.prov = c->prov;
  c->ex.rank = c->rank;
  c->ex.comm_id = 0;
  c->ex.scratch_keep = c->set.buffsize;
  c->ex.trace = c->set.trace;
  c->ex.checksum = c->set.checksum;
  /* the transport holds pm a direction; one a peer is kept for the pairs'
   * oldest messages, which go past the budget (exec.h) */
  size_t pm = c->prov->ops->max_posted(c->prov);
  size_t total = c->set.max_posted < pm ? c->set.max_posted : pm;
  size_t keep = (size_t)(c->size - 1) < total / 2 ? (size_t)(c->size - 1) : total / 2;
  c->ex.max_posted = total - keep ? total - keep : 1;
  if ((rc = exec_ctx_set_peers(&c->ex, c->size)))
    return comm_error(c, CHORUS_ERR_NO_MEMORY, "out of memory for the posting budget");
  if ((rc = progress_start(c)))
    return comm_error(c, CHORUS_ERR_INTERNAL, "starting the progress thread failed: %s",
                      strerror(-rc));
  return CHORUS_SUCCESS;
}

static chorus_result comm_setup(chorus_comm_t *c, const char *host) {
  chorus_result ret;

  if ((ret = comm_topo_init(c)) || (ret = comm_open_transport(c)) ||
      (ret = comm_create_faults(c, 2)) || (ret = exchange_endpoints(c, host)) ||
      (ret = comm_create_faults(c, 3)))
    return ret;
  return comm_start(c);
}

chorus_result comm_register(chorus_comm_t *c) {
  chorus_result ret = coll_comm_init(c);
  if (ret)
    return ret;
  if (c->home_cpu >= 0) /* the creation's waits left it where the kernel put it */
    comm_go_home(c);
  if (eng_handle_add(c, ENG_HANDLE_COMM))
    return comm_error(c, CHORUS_ERR_NO_MEMORY, "out of memory");
  return CHORUS_SUCCESS;
}

chorus_result comm_init_with(chorus_comm_t **comm, const comm_init_t *in) {
  const char *who = in->who;
  char err[1024];
  char host[256];
  chorus_comm_t *c;
  chorus_result ret;
  int rc, lfd = in->has_listen_fd ? in->listen_fd : -1;

  if (!comm) {
    ret = eng_error(CHORUS_ERR_INVALID_ARG, "%s: comm is NULL", who);
    goto out_close_listener;
  }
  *comm = NULL;
  if (in->size < 1 || in->size > 32767) {
    ret = eng_error(CHORUS_ERR_INVALID_ARG, "%s: size %d out of range [1, 32767]", who, in->size);
    goto out_close_listener;
  }
  if (in->rank < 0 || in->rank >= in->size) {
    ret = eng_error(CHORUS_ERR_INVALID_ARG, "%s: rank %d out of range [0, %d)", who, in->rank,
                    in->size);
    goto out_close_listener;
  }
  if (!in->rendezvous || !*in->rendezvous || !strchr(in->rendezvous, ':')) {
    ret = eng_error(CHORUS_ERR_INVALID_ARG, "%s: rendezvous must be \"host:port\", got %s%s%s", who,
                    in->rendezvous ? "\"" : "", in->rendezvous ? in->rendezvous : "NULL",
                    in->rendezvous ? "\"" : "");
    goto out_close_listener;
  }
  if (!(c = comm_alloc(in->rank, in->size))) {
    ret = eng_error(CHORUS_ERR_NO_MEMORY, "%s: out of memory", who);
    goto out_close_listener;
  }
  if (settings_load(&c->set, err, sizeof(err))) {
    ret = eng_error(CHORUS_ERR_ENV, "rank %d: %s", in->rank, err);
    goto out_free;
  }
  if (in->timeout_s > 0)
    c->set.timeout_s = in->timeout_s;
  if (in->connect_timeout_s > 0)
    c->set.connect_timeout_s = in->connect_timeout_s;
  global_init(&c->set);
  boot_host_identity(host, sizeof(host));
  boot_config_t bc = {.rank = in->rank,
                      .size = in->size,
                      .rendezvous = in->rendezvous,
                      .token = in->token ? in->token : c->set.job_token,
                      .timeout_s = c->set.connect_timeout_s,
                      .watch_tick_s = c->set.trace ? c->set.watchdog_ms / 1000.0 : 0,
                      .watch_timeout_s = c->set.timeout_s,
                      .watch_peer_timeout_s = c->set.peer_timeout_s,
                      .has_listen_fd = lfd >= 0,
                      .listen_fd = lfd};
  lfd = -1; /* boot_open's from here on */
  rc = boot_open(&bc, &c->boot, err, sizeof(err));
  if (rc) {
    ret = eng_error((chorus_result)rc, "rank %d: %s", in->rank, err);
    goto out_free;
  }
  if ((ret = comm_create_faults(c, 1)) || (ret = comm_setup(c, host))) {
    eng_error(ret, "%s", c->last_error);
    goto out_free;
  }
  if ((ret = comm_register(c))) {
    eng_error(ret, "%s", c->last_error);
    goto out_free;
  }
  if ((ret = watch_start(c)) || (ret = comm_create_faults(c, 4))) {
    eng_handle_remove(c);
    eng_error(ret, "%s", c->last_error);
    goto out_free;
  }
  eng_log(ENG_INFO, in->rank, "comm", "ready: %d ranks over %s", in->size, c->prov->name);
  *comm = c;
  return CHORUS_SUCCESS;

out_free:
  comm_free(c);
out_close_listener:
  if (lfd >= 0)
    close(lfd);
  return ret;
}

CHORUS_API chorus_result chorus_comm_init(chorus_comm_t **comm, int rank, int size,
                                          const char *rendezvous) {
  comm_init_t in = {
      .who = "chorus_comm_init", .rank = rank, .size = size, .rendezvous = rendezvous};

  return comm_init_with(comm, &in);
}

chorus_result eng_comm_init_local(eng_local_job_t *job, int rank, chorus_comm_t **out) {
  char err[1024];
  chorus_comm_t *c;
  chorus_result ret;

  *out = NULL;
  if (!job || rank < 0 || rank >= job->nranks)
    return eng_error(CHORUS_ERR_INVALID_ARG, "eng_comm_init_local: bad job or rank");
  if (!(c = comm_alloc(rank, job->nranks)))
    return eng_error(CHORUS_ERR_NO_MEMORY, "out of memory");
  c->local = job;
  if (settings_load(&c->set, err, sizeof(err))) {
    ret = eng_error(CHORUS_ERR_ENV, "%s", err);
    goto out_free;
  }
  global_init(&c->set);
  if ((ret = comm_setup(c, "local")) || (ret = comm_register(c))) {
    eng_error(ret, "%s", c->last_error);
    goto out_free;
  }
  *out = c;
  return CHORUS_SUCCESS;

out_free:
  comm_free(c);
  return ret;
}

CHORUS_API chorus_result chorus_comm_destroy(chorus_comm_t *comm) {
  chorus_result ret = CHORUS_SUCCESS;

  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return eng_error(CHORUS_ERR_INVALID_COMM,
                     "chorus_comm_destroy: not a live communicator (NULL or already destroyed)");
  eng_handle_remove(comm);
  atomic_store(&comm->ckpt.destroying, true);
  watch_notify_leaving(comm->watch);
  coll_comm_drop_queued(comm);
  /* Wait for what is still running: every rank issued the same calls (or
   * the communicator failed, and the executor fails them). */
  for (chorus_request_t *r = comm->live; r; r = r->next_live) {
    pthread_mutex_lock(&comm->lock);
    comm->waiters++;
    while (!atomic_load(&r->done))
      pthread_cond_wait(&comm->cond, &comm->lock);
    comm->waiters--;
    pthread_mutex_unlock(&comm->lock);
  }
  /* Nobody may close while a peer still reads from or writes to it. After
   * a failure peers may be gone or elsewhere: no rendezvous then (a peer
   * already in it fails at once: the server sees us leave). The threads of
   * an in-process job are all there: they always meet. */
  bool failed = atomic_load(&comm->async_rc) || atomic_load(&comm->failed_any);
  if (comm->size > 1 && (comm->local || !failed)) {
    void **ptrs = NULL;
    size_t *lens = NULL;
    if (comm_allgather(comm, "", 0, &ptrs, &lens, comm->set.connect_timeout_s) == 0) {
      free(ptrs);
      free(lens);
    } else if (comm->watch && watch_await_verdict(comm->watch, 2.0)) {
      /* peers left without meeting because the communicator failed while
       * this rank was done with its calls: that failure is reported (the
       * async error), this destroy did its part */
      eng_log(ENG_INFO, comm->rank, "comm", "destroy: the peers left after a failure: %s",
              comm->last_error);
    } else {
      ret = CHORUS_ERR_BOOTSTRAP;
      eng_error(ret, "%s", comm->last_error);
    }
  }
  comm_free(comm);
  return ret;
}

CHORUS_API chorus_result chorus_comm_rank(const chorus_comm_t *comm, int *rank) {
  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return eng_error(CHORUS_ERR_INVALID_COMM, "chorus_comm_rank: not a live communicator");
  if (!rank)
    return eng_error(CHORUS_ERR_INVALID_ARG, "chorus_comm_rank: rank is NULL");
  *rank = comm->rank;
  return CHORUS_SUCCESS;
}

CHORUS_API chorus_result chorus_comm_size(const chorus_comm_t *comm, int *size) {
  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return eng_error(CHORUS_ERR_INVALID_COMM, "chorus_comm_size: not a live communicator");
  if (!size)
    return eng_error(CHORUS_ERR_INVALID_ARG, "chorus_comm_size: size is NULL");
  *size = comm->size;
  return CHORUS_SUCCESS;
}

CHORUS_API const char *chorus_comm_provider(const chorus_comm_t *comm) {
  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return "invalid";
  return comm->prov->name;
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
