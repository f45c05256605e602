/*
 * fsm.h - state machines, actors and the transition journal.
 *
 * A machine is pure data: a const table of rows {state, event, guard,
 * action, next}. fsm_dispatch() walks the rows of the current state in
 * order and takes the first whose event matches and whose guard (if any)
 * accepts; it runs the action, moves to `next` and journals the transition.
 * An event with no row in the current state is an error returned to the
 * caller and journaled as such, never undefined behaviour.
 *
 * An actor owns a mailbox: others only post events to it; a scheduler
 * (fsm_sched, driven from one libevent loop) dispatches them one at a time,
 * each to completion before the next.
 *
 * The journal is a bounded per-process ring of transitions (time, actor,
 * machine, from, event, to), safe to write from any thread, read back with
 * fsm_journal_snapshot().
 */
#ifndef CHORUS_FSM_H
#define CHORUS_FSM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;

typedef struct fsm_event {
  int sig;     /* which event */
  int64_t arg; /* small payload (status, length...) */
  void *ptr;   /* optional payload */
} fsm_event_t;

typedef struct fsm_inst fsm_inst_t;

typedef bool (*fsm_guard_fn)(fsm_inst_t *inst, const fsm_event_t *ev);
typedef void (*fsm_action_fn)(fsm_inst_t *inst, const fsm_event_t *ev);

typedef struct fsm_row {
  int state;
  int event;
  fsm_guard_fn guard;   /* NULL: always */
  fsm_action_fn action; /* NULL: none */
  int next;
} fsm_row_t;

typedef struct fsm_machine {
  const char *name;
  uint16_t id; /* journal id; fsm_machine_register() assigns; 0: none */
  int nstates;
  const char *const *state_names; /* nstates entries */
  int nevents;
  const char *const *event_names; /* nevents entries */
  const fsm_row_t *rows;
  size_t nrows;
} fsm_machine_t;

/* One running instance of a machine. Embed it in your own object. */
struct fsm_inst {
  const fsm_machine_t *machine;
  int state;
  uint32_t actor_id; /* who this is, for the journal (e.g. step index) */
  uint32_t group;    /* which run it belongs to (e.g. collective sequence) */
};

/* Returns 0, or -ENOENT when no row takes the event in the current state
 * (the state is unchanged and the miss is journaled), or -EINVAL. The state
 * moves to `next` and the transition is journaled before the action runs,
 * so an action may dispatch to its own instance again, or free it. */
int fsm_dispatch(fsm_inst_t *inst, const fsm_event_t *ev);
void fsm_init(fsm_inst_t *inst, const fsm_machine_t *m, int initial, uint32_t actor_id,
              uint32_t group);
const char *fsm_state_name(const fsm_machine_t *m, int state);
const char *fsm_event_name(const fsm_machine_t *m, int event);
/* Check a machine's table: states/events in range, names present. 0 or -EINVAL. */
int fsm_machine_check(const fsm_machine_t *m);

/* ---- journal ---- */
#define FSM_JOURNAL_MISS 0xffff /* `to` value of a journaled unhandled event */

typedef struct fsm_record {
  uint64_t t_ns; /* CLOCK_MONOTONIC */
  uint32_t actor;
  uint32_t group;
  uint16_t machine; /* fsm_machine_t.id */
  uint16_t from;
  uint16_t event;
  uint16_t to; /* FSM_JOURNAL_MISS for an event with no transition */
} fsm_record_t;

/* Capacity (records, rounded up to a power of two; 0: default 65536); call
 * before use. Calling it again discards the records held (not the total) and
 * must not race with appends or snapshots. */
void fsm_journal_configure(size_t capacity);
/* Appends are no-ops while disabled (the default is enabled). */
void fsm_journal_enable(bool on);
bool fsm_journal_enabled(void);
/* Thread safe, lock free. A writer that falls a whole ring behind drops its
 * record rather than tear a newer one. */
void fsm_journal_append(const fsm_record_t *r);
/* Copy the newest records (oldest first) into out; returns how many (<= max). */
size_t fsm_journal_snapshot(fsm_record_t *out, size_t max);
/* Total records ever appended (monotonic). */
uint64_t fsm_journal_total(void);
/* Register a machine so its id can be resolved back to names. Idempotent and
 * thread safe; register before dispatching (it writes m->id). Ids start at 1. */
void fsm_machine_register(fsm_machine_t *m);
const fsm_machine_t *fsm_machine_lookup(uint16_t id);

/* ---- actors ---- */
typedef struct fsm_actor fsm_actor_t;
typedef struct fsm_sched fsm_sched_t;

struct fsm_actor {
  fsm_inst_t inst;
  fsm_sched_t *sched;
  /* mailbox: intrusive ring of pending events */
  fsm_event_t *box;
  size_t box_cap, box_head, box_len;
  fsm_actor_t *next_ready; /* scheduler's ready list link */
  bool queued;
};

/* A scheduler runs actors' mailboxes to completion from a libevent loop.
 * Posting is thread safe (it wakes the loop through an eventfd, so libevent's
 * thread support is not needed); dispatch happens only on the loop's thread.
 * The scheduler keeps a persistent event on `base`, so event_base_dispatch()
 * returns only on loopbreak/loopexit. base NULL: no loop, the owner calls
 * fsm_sched_run(). */
fsm_sched_t *fsm_sched_create(struct event_base *base);
/* Finalise every actor first; call before freeing the base. */
void fsm_sched_destroy(fsm_sched_t *s);
int fsm_actor_init(fsm_actor_t *a, fsm_sched_t *s, const fsm_machine_t *m, int initial,
                   uint32_t actor_id, uint32_t group);
/* Drops pending events and unlinks the actor. Call on the loop thread (an
 * action may fini its own actor), once nobody posts to it any more. */
void fsm_actor_fini(fsm_actor_t *a);
/* Post an event (copied); returns 0, -ENOMEM, or -EINVAL (event out of
 * range). From an action it only queues: dispatch is never re-entrant. */
int fsm_actor_post(fsm_actor_t *a, const fsm_event_t *ev);
/* Dispatch the events pending when called, one per ready actor in turn
 * (on the loop thread); returns how many. Events posted meanwhile wait for
 * the next run (the loop is woken for them). Returns 0 if called from an
 * action. */
size_t fsm_sched_run(fsm_sched_t *s);
/* Snapshot of an actor: machine, state and queued events. The state is read
 * unlocked: call on the loop thread, or while the loop is not running. */
typedef struct fsm_snapshot {
  const char *machine;
  const char *state;
  int state_id;
  uint32_t actor_id;
  uint32_t group;
  size_t pending;
} fsm_snapshot_t;
void fsm_actor_snapshot(const fsm_actor_t *a, fsm_snapshot_t *out);

/* Error hook for unhandled events (default: log to stderr once per
 * machine/state/event, at most 10 lines a second); NULL restores the default.
 * Called on the dispatching thread. */
typedef void (*fsm_error_fn)(const fsm_inst_t *inst, const fsm_event_t *ev);
void fsm_set_error_handler(fsm_error_fn fn);

uint64_t fsm_now_ns(void);
/* CLOCK_MONOTONIC as of the kernel's last tick (a few ms behind
 * fsm_now_ns at most, never ahead), for what needs milliseconds: a fraction
 * of fsm_now_ns's cost. */
uint64_t fsm_coarse_ns(void);

/* A held clock for time stamps (the journal's, a step's `since`): between
 * fsm_clock_hold() and fsm_clock_release() on a thread, fsm_stamp_ns()
 * returns the time held, read at its first use (at most one clock read per
 * round of progress instead of one per transition, and none in a round
 * that stamps nothing: most of a waiting caller's rounds);
 * fsm_clock_refresh() makes the next stamp read the clock again, after work
 * that took time. Elsewhere fsm_stamp_ns() reads the clock. */
void fsm_clock_hold(void);
void fsm_clock_refresh(void);
void fsm_clock_release(void);
uint64_t fsm_stamp_ns(void);

#endif
