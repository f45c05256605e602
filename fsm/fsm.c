/*
 * fsm.c - table-driven dispatch of one machine instance.
 *
 * A machine is a const array of rows; the rows of one state are read in
 * table order and the first whose event matches and whose guard accepts
 * wins:
 *
 *   {WAIT,  DEP_DONE, deps_left, count_dep, WAIT }   guard true: stay
 *   {WAIT,  DEP_DONE, NULL,      NULL,      READY}   otherwise: advance
 *
 * A taken row moves the instance to `next`, journals the transition and
 * then runs the action. An event with no row in the current state leaves
 * the state alone, is journaled with to = FSM_JOURNAL_MISS and goes to the
 * error handler, whose default prints one line per (machine, state, event)
 * and no more than FSM_MISS_LINES_PER_SEC lines a second in all.
 */
#include "fsm.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#define FSM_MAX_STATES 0xfffe /* below FSM_JOURNAL_MISS, so `to` stays unambiguous */
#define FSM_MAX_EVENTS 0xffff
#define FSM_MISS_SEEN_SLOTS 256 /* distinct (machine, state, event) misses remembered */
#define FSM_MISS_SEEN_PROBE 8
#define FSM_MISS_LINES_PER_SEC 10

static void fsm_default_error(const fsm_inst_t *inst, const fsm_event_t *ev);

static _Atomic(fsm_error_fn) fsm_error_handler = fsm_default_error;

/* Keys of misses already printed (0: free slot), and the current one-second
 * window of the line budget with the lines spent in it. */
static _Atomic uint64_t fsm_miss_seen[FSM_MISS_SEEN_SLOTS];
static _Atomic uint64_t fsm_miss_window;
static _Atomic unsigned fsm_miss_lines;

uint64_t fsm_now_ns(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static _Thread_local uint64_t fsm_held_ns;
static _Thread_local bool fsm_held;

uint64_t fsm_coarse_ns(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void fsm_clock_hold(void) {
  fsm_held_ns = 0; /* read at the first stamp */
  fsm_held = true;
}

void fsm_clock_refresh(void) {
  fsm_held_ns = 0;
}

void fsm_clock_release(void) {
  fsm_held = false;
}

uint64_t fsm_stamp_ns(void) {
  if (!fsm_held)
    return fsm_now_ns();
  if (!fsm_held_ns)
    fsm_held_ns = fsm_now_ns();
  return fsm_held_ns;
}

void fsm_init(fsm_inst_t *inst, const fsm_machine_t *m, int initial, uint32_t actor_id,
              uint32_t group) {
  if (!inst)
    return;
  inst->machine = m;
  inst->state = initial;
  inst->actor_id = actor_id;
  inst->group = group;
}

static const char *fsm_name(const char *const *names, int n, int i) {
  if (!names || i < 0 || i >= n || !names[i])
    return "?";
  return names[i];
}

const char *fsm_state_name(const fsm_machine_t *m, int state) {
  return m ? fsm_name(m->state_names, m->nstates, state) : "?";
}

const char *fsm_event_name(const fsm_machine_t *m, int event) {
  return m ? fsm_name(m->event_names, m->nevents, event) : "?";
}

static int fsm_names_check(const char *const *names, int n, int max) {
  if (n <= 0 || n > max || !names)
    return -EINVAL;
  for (int i = 0; i < n; i++)
    if (!names[i])
      return -EINVAL;
  return 0;
}

static int fsm_row_check(const fsm_machine_t *m, size_t i) {
  const fsm_row_t *r = &m->rows[i];

  if (r->state < 0 || r->state >= m->nstates || r->next < 0 || r->next >= m->nstates ||
      r->event < 0 || r->event >= m->nevents)
    return -EINVAL;
  /* A row after an unguarded row for the same state and event is never taken. */
  for (size_t j = 0; j < i; j++)
    if (m->rows[j].state == r->state && m->rows[j].event == r->event && !m->rows[j].guard)
      return -EINVAL;
  return 0;
}

int fsm_machine_check(const fsm_machine_t *m) {
  if (!m || !m->name)
    return -EINVAL;
  if (fsm_names_check(m->state_names, m->nstates, FSM_MAX_STATES) ||
      fsm_names_check(m->event_names, m->nevents, FSM_MAX_EVENTS))
    return -EINVAL;
  if (m->nrows && !m->rows)
    return -EINVAL;
  for (size_t i = 0; i < m->nrows; i++)
    if (fsm_row_check(m, i))
      return -EINVAL;
  return 0;
}

static void fsm_journal_note(const fsm_inst_t *inst, int from, int event, int to) {
  fsm_record_t r;

  if (!fsm_journal_enabled())
    return;
  r.t_ns = fsm_stamp_ns();
  r.actor = inst->actor_id;
  r.group = inst->group;
  r.machine = inst->machine->id;
  r.from = (uint16_t)from;
  r.event = (uint16_t)event;
  r.to = (uint16_t)to;
  fsm_journal_append(&r);
}

int fsm_dispatch(fsm_inst_t *inst, const fsm_event_t *ev) {
  const fsm_machine_t *m;
  fsm_error_fn on_error;
  int from;

  if (!inst || !ev || !inst->machine)
    return -EINVAL;
  m = inst->machine;
  from = inst->state;
  if (from < 0 || from >= m->nstates || ev->sig < 0 || ev->sig >= m->nevents)
    return -EINVAL;

  for (size_t i = 0; i < m->nrows; i++) {
    const fsm_row_t *r = &m->rows[i];

    if (r->state != from || r->event != ev->sig)
      continue;
    if (r->guard && !r->guard(inst, ev))
      continue;
    if (r->next < 0 || r->next >= m->nstates)
      return -EINVAL;
    /* State and journal first: the action may dispatch to this instance
     * again (its record must come after ours) or free it. */
    inst->state = r->next;
    fsm_journal_note(inst, from, ev->sig, r->next);
    if (r->action)
      r->action(inst, ev);
    return 0;
  }

  fsm_journal_note(inst, from, ev->sig, FSM_JOURNAL_MISS);
  on_error = atomic_load_explicit(&fsm_error_handler, memory_order_acquire);
  on_error(inst, ev);
  return -ENOENT;
}

void fsm_set_error_handler(fsm_error_fn fn) {
  atomic_store_explicit(&fsm_error_handler, fn ? fn : fsm_default_error, memory_order_release);
}

static uint64_t fsm_miss_key(const fsm_machine_t *m, int state, int event) {
  uint64_t k = (uint64_t)(uintptr_t)m ^ ((uint64_t)(uint32_t)state << 20) ^
               ((uint64_t)(uint32_t)event << 42);

  k ^= k >> 30;
  k *= 0xbf58476d1ce4e5b9ull;
  k ^= k >> 27;
  k *= 0x94d049bb133111ebull;
  k ^= k >> 31;
  return k ? k : 1;
}

/* True the first time a key is seen; false after, and when its probe run is
 * full (then only the line budget limits it). */
static bool fsm_miss_first(uint64_t key) {
  for (unsigned i = 0; i < FSM_MISS_SEEN_PROBE; i++) {
    _Atomic uint64_t *slot = &fsm_miss_seen[(key + i) % FSM_MISS_SEEN_SLOTS];
    uint64_t cur = atomic_load_explicit(slot, memory_order_relaxed);

    if (cur == key)
      return false;
    if (!cur && atomic_compare_exchange_strong(slot, &cur, key))
      return true;
    if (cur == key)
      return false;
  }
  return true;
}

static bool fsm_miss_budget(void) {
  uint64_t now = fsm_now_ns() / 1000000000u;
  uint64_t window = atomic_load_explicit(&fsm_miss_window, memory_order_relaxed);

  if (window != now && atomic_compare_exchange_strong(&fsm_miss_window, &window, now))
    atomic_store_explicit(&fsm_miss_lines, 0, memory_order_relaxed);
  return atomic_fetch_add_explicit(&fsm_miss_lines, 1, memory_order_relaxed) <
         FSM_MISS_LINES_PER_SEC;
}

static void fsm_default_error(const fsm_inst_t *inst, const fsm_event_t *ev) {
  const fsm_machine_t *m = inst->machine;

  if (!fsm_miss_first(fsm_miss_key(m, inst->state, ev->sig)) || !fsm_miss_budget())
    return;
  fprintf(stderr,
          "chorus fsm: machine %s: event %s (%d) has no transition in state %s (%d)"
          " [actor %u group %u]\n",
          m->name ? m->name : "?", fsm_event_name(m, ev->sig), ev->sig,
          fsm_state_name(m, inst->state), inst->state, inst->actor_id, inst->group);
}
