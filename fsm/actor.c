/*
 * actor.c - actors, their mailboxes, and the scheduler that runs them from
 * a libevent loop.
 *
 *   any thread                               loop thread
 *   ----------                               -----------
 *   fsm_actor_post(a, ev)
 *     lock; append ev to a's mailbox;
 *     put a on the ready list if absent;
 *     first post since the last wake:
 *       write(wake_fd)  ───────────────────► fsm_sched_wake_cb
 *                                              fsm_sched_run: take the ready
 *                                              actor at the head, pop one event,
 *                                              requeue the actor if it has more,
 *                                              unlock, dispatch, lock, repeat
 *
 * Each event runs to completion before the next starts: the scheduler never
 * dispatches from inside a dispatch, and a post made by an action only
 * queues. One run dispatches at most the events pending when it began;
 * what actions post meanwhile waits for the next run, for which the loop
 * is woken again, so a chatty actor cannot starve the loop's other events.
 *
 * Waking uses an eventfd watched by the loop, so posting from other threads
 * needs no libevent thread support (no evthread_use_pthreads()).
 */
#include "fsm.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <event2/event.h>

#define FSM_BOX_MIN 8

struct fsm_sched {
  struct event_base *base; /* loop that dispatches; not owned; NULL: fsm_sched_run only */
  struct event *wake_ev;   /* persistent read event on wake_fd */
  int wake_fd;             /* eventfd posters write to wake the loop; -1 without a base */
  pthread_mutex_t lock;    /* guards the fields below and every actor's mailbox and link */
  fsm_actor_t *ready_head; /* actors with pending events, in the order they became ready */
  fsm_actor_t *ready_tail;
  size_t npending;      /* events in all mailboxes */
  size_t nactors;       /* actors initialised and not yet finalised */
  bool wake_pending;    /* wake_fd written and wake_cb not yet begun */
  bool running;         /* a fsm_sched_run is in progress */
  pthread_t run_thread; /* the thread running it; valid while running */
};

static void fsm_sched_wake(fsm_sched_t *s) {
  uint64_t one = 1;

  while (write(s->wake_fd, &one, sizeof(one)) < 0 && errno == EINTR)
    ;
}

static void fsm_sched_wake_cb(evutil_socket_t fd, short what, void *arg) {
  fsm_sched_t *s = arg;
  uint64_t n;

  while (read(fd, &n, sizeof(n)) < 0 && errno == EINTR)
    ;
  /* Clear after draining the fd: a post that still saw the flag set was
   * queued before this point and is picked up by the run below. */
  pthread_mutex_lock(&s->lock);
  s->wake_pending = false;
  pthread_mutex_unlock(&s->lock);
  fsm_sched_run(s);
}

fsm_sched_t *fsm_sched_create(struct event_base *base) {
  fsm_sched_t *s = calloc(1, sizeof(*s));

  if (!s)
    return NULL;
  s->base = base;
  s->wake_fd = -1;
  if (pthread_mutex_init(&s->lock, NULL))
    goto out_free;
  if (!base)
    return s;
  s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s->wake_fd < 0)
    goto out_lock;
  s->wake_ev = event_new(base, s->wake_fd, EV_READ | EV_PERSIST, fsm_sched_wake_cb, s);
  if (!s->wake_ev)
    goto out_fd;
  if (event_add(s->wake_ev, NULL))
    goto out_event;
  return s;

out_event:
  event_free(s->wake_ev);
out_fd:
  close(s->wake_fd);
out_lock:
  pthread_mutex_destroy(&s->lock);
out_free:
  free(s);
  return NULL;
}

void fsm_sched_destroy(fsm_sched_t *s) {
  if (!s)
    return;
  if (s->wake_ev)
    event_free(s->wake_ev);
  if (s->wake_fd >= 0)
    close(s->wake_fd);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

int fsm_actor_init(fsm_actor_t *a, fsm_sched_t *s, const fsm_machine_t *m, int initial,
                   uint32_t actor_id, uint32_t group) {
  if (!a || !s || !m || initial < 0 || initial >= m->nstates)
    return -EINVAL;
  memset(a, 0, sizeof(*a));
  fsm_init(&a->inst, m, initial, actor_id, group);
  a->sched = s;
  pthread_mutex_lock(&s->lock);
  s->nactors++;
  pthread_mutex_unlock(&s->lock);
  return 0;
}

static void fsm_ready_push(fsm_sched_t *s, fsm_actor_t *a) {
  a->next_ready = NULL;
  if (s->ready_tail)
    s->ready_tail->next_ready = a;
  else
    s->ready_head = a;
  s->ready_tail = a;
  a->queued = true;
}

static fsm_actor_t *fsm_ready_pop(fsm_sched_t *s) {
  fsm_actor_t *a = s->ready_head;

  if (!a)
    return NULL;
  s->ready_head = a->next_ready;
  if (!s->ready_head)
    s->ready_tail = NULL;
  a->next_ready = NULL;
  a->queued = false;
  return a;
}

static void fsm_ready_remove(fsm_sched_t *s, fsm_actor_t *a) {
  fsm_actor_t **link = &s->ready_head, *prev = NULL;

  while (*link && *link != a) {
    prev = *link;
    link = &prev->next_ready;
  }
  if (!*link)
    return;
  *link = a->next_ready;
  if (s->ready_tail == a)
    s->ready_tail = prev;
  a->next_ready = NULL;
  a->queued = false;
}

void fsm_actor_fini(fsm_actor_t *a) {
  fsm_sched_t *s;

  if (!a || !a->sched)
    return;
  s = a->sched;
  pthread_mutex_lock(&s->lock);
  if (a->queued)
    fsm_ready_remove(s, a);
  s->npending -= a->box_len;
  s->nactors--;
  pthread_mutex_unlock(&s->lock);
  free(a->box);
  a->box = NULL;
  a->box_cap = a->box_head = a->box_len = 0;
  a->sched = NULL;
}

static int fsm_box_grow(fsm_actor_t *a) {
  size_t cap = a->box_cap ? a->box_cap * 2 : FSM_BOX_MIN;
  fsm_event_t *box;

  if (cap > SIZE_MAX / sizeof(*box))
    return -ENOMEM;
  box = malloc(cap * sizeof(*box));
  if (!box)
    return -ENOMEM;
  for (size_t i = 0; i < a->box_len; i++)
    box[i] = a->box[(a->box_head + i) & (a->box_cap - 1)];
  free(a->box);
  a->box = box;
  a->box_cap = cap;
  a->box_head = 0;
  return 0;
}

static bool fsm_sched_on_run_thread(const fsm_sched_t *s) {
  return s->running && pthread_equal(s->run_thread, pthread_self());
}

int fsm_actor_post(fsm_actor_t *a, const fsm_event_t *ev) {
  const fsm_machine_t *m;
  fsm_sched_t *s;
  bool wake = false;
  int rc = 0;

  if (!a || !ev || !a->sched)
    return -EINVAL;
  m = a->inst.machine;
  if (!m || ev->sig < 0 || ev->sig >= m->nevents)
    return -EINVAL;
  s = a->sched;
  pthread_mutex_lock(&s->lock);
  if (a->box_len == a->box_cap) {
    rc = fsm_box_grow(a);
    if (rc)
      goto out_unlock;
  }
  a->box[(a->box_head + a->box_len) & (a->box_cap - 1)] = *ev;
  a->box_len++;
  s->npending++;
  if (!a->queued)
    fsm_ready_push(s, a);
  /* A post from inside a run needs no wake: the run re-arms it on exit. */
  if (s->wake_fd >= 0 && !s->wake_pending && !fsm_sched_on_run_thread(s)) {
    s->wake_pending = true;
    wake = true;
  }
out_unlock:
  pthread_mutex_unlock(&s->lock);
  if (wake)
    fsm_sched_wake(s);
  return rc;
}

size_t fsm_sched_run(fsm_sched_t *s) {
  size_t budget, done = 0;
  bool wake = false;

  if (!s)
    return 0;
  pthread_mutex_lock(&s->lock);
  if (s->running) {
    pthread_mutex_unlock(&s->lock);
    return 0;
  }
  s->running = true;
  s->run_thread = pthread_self();
  budget = s->npending;
  while (done < budget) {
    fsm_actor_t *a = fsm_ready_pop(s);
    fsm_event_t ev;

    if (!a)
      break;
    ev = a->box[a->box_head];
    a->box_head = (a->box_head + 1) & (a->box_cap - 1);
    a->box_len--;
    s->npending--;
    if (a->box_len)
      fsm_ready_push(s, a);
    /* Unlocked so the action may post, or fini this or another actor;
     * `a` is not touched again after the dispatch. */
    pthread_mutex_unlock(&s->lock);
    fsm_dispatch(&a->inst, &ev);
    done++;
    pthread_mutex_lock(&s->lock);
  }
  s->running = false;
  if (s->npending && s->wake_fd >= 0 && !s->wake_pending) {
    s->wake_pending = true;
    wake = true;
  }
  pthread_mutex_unlock(&s->lock);
  if (wake)
    fsm_sched_wake(s);
  return done;
}

void fsm_actor_snapshot(const fsm_actor_t *a, fsm_snapshot_t *out) {
  const fsm_machine_t *m;

  if (!out)
    return;
  memset(out, 0, sizeof(*out));
  if (!a)
    return;
  m = a->inst.machine;
  out->machine = m && m->name ? m->name : "?";
  out->state = fsm_state_name(m, a->inst.state);
  out->state_id = a->inst.state;
  out->actor_id = a->inst.actor_id;
  out->group = a->inst.group;
  if (a->sched) {
    pthread_mutex_lock(&a->sched->lock);
    out->pending = a->box_len;
    pthread_mutex_unlock(&a->sched->lock);
  }
}
