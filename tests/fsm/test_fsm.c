/*
 * test_fsm.c - the fsm room: table dispatch, guards, misses, the journal
 * (wraparound, concurrent appends, disabling), the machine registry, and
 * actors run to completion from a libevent loop.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <event2/event.h>

#include "fsm.h"

#define container_of(p, type, field) ((type *)((char *)(p)-offsetof(type, field)))

TestSuite(fsm, .timeout = 20);
TestSuite(journal, .timeout = 30);
TestSuite(actor, .timeout = 20);

/* ---- a step machine: WAIT -> READY -> POSTED -> DONE ---- */
enum { ST_WAIT, ST_READY, ST_POSTED, ST_DONE, ST_N };
enum { EV_DEP_DONE, EV_POST, EV_COMPLETE, EV_ABORT, EV_N };

static const char *const step_states[] = {"WAIT", "READY", "POSTED", "DONE"};
static const char *const step_events[] = {"DEP_DONE", "POST", "COMPLETE", "ABORT"};

struct step {
  fsm_inst_t inst;
  int deps;      /* inputs still missing */
  int completed; /* on_complete calls */
  int64_t bytes; /* last completion length */
  int seen_state;
};

static bool step_deps_left(fsm_inst_t *inst, const fsm_event_t *ev) {
  return container_of(inst, struct step, inst)->deps > 1;
}

static void step_count_dep(fsm_inst_t *inst, const fsm_event_t *ev) {
  container_of(inst, struct step, inst)->deps--;
}

static void step_complete(fsm_inst_t *inst, const fsm_event_t *ev) {
  struct step *st = container_of(inst, struct step, inst);

  st->completed++;
  st->bytes = ev->arg;
  st->seen_state = inst->state;
}

static const fsm_row_t step_rows[] = {
    {ST_WAIT, EV_DEP_DONE, step_deps_left, step_count_dep, ST_WAIT},
    {ST_WAIT, EV_DEP_DONE, NULL, step_count_dep, ST_READY},
    {ST_READY, EV_POST, NULL, NULL, ST_POSTED},
    {ST_POSTED, EV_COMPLETE, NULL, step_complete, ST_DONE},
};

static fsm_machine_t step_machine = {
    .name = "step",
    .nstates = ST_N,
    .state_names = step_states,
    .nevents = EV_N,
    .event_names = step_events,
    .rows = step_rows,
    .nrows = sizeof(step_rows) / sizeof(step_rows[0]),
};

static fsm_event_t ev_of(int sig, int64_t arg) {
  fsm_event_t ev = {.sig = sig, .arg = arg, .ptr = NULL};

  return ev;
}

/* The newest journal record; fails the test if there is none. */
static fsm_record_t last_record(void) {
  static fsm_record_t buf[65536];
  size_t n = fsm_journal_snapshot(buf, sizeof(buf) / sizeof(buf[0]));

  cr_assert_gt(n, 0);
  return buf[n - 1];
}

Test(fsm, step_machine_walks_its_states_and_journals_each_step) {
  struct step st = {.deps = 1};
  fsm_record_t rec[8];
  uint64_t before;
  fsm_event_t ev;
  size_t n;

  cr_assert_eq(fsm_machine_check(&step_machine), 0);
  fsm_machine_register(&step_machine);
  cr_assert_neq(step_machine.id, 0);
  fsm_init(&st.inst, &step_machine, ST_WAIT, 7, 42);
  before = fsm_journal_total();

  ev = ev_of(EV_DEP_DONE, 0);
  cr_assert_eq(fsm_dispatch(&st.inst, &ev), 0);
  cr_assert_eq(st.inst.state, ST_READY);
  ev = ev_of(EV_POST, 0);
  cr_assert_eq(fsm_dispatch(&st.inst, &ev), 0);
  cr_assert_eq(st.inst.state, ST_POSTED);
  ev = ev_of(EV_COMPLETE, 4096);
  cr_assert_eq(fsm_dispatch(&st.inst, &ev), 0);
  cr_assert_eq(st.inst.state, ST_DONE);
  cr_assert_eq(st.completed, 1);
  cr_assert_eq(st.bytes, 4096);
  cr_assert_eq(st.seen_state, ST_DONE, "the action runs after the state moved");
  cr_assert_str_eq(fsm_state_name(&step_machine, st.inst.state), "DONE");
  cr_assert_str_eq(fsm_event_name(&step_machine, EV_COMPLETE), "COMPLETE");

  cr_assert_eq(fsm_journal_total(), before + 3);
  n = fsm_journal_snapshot(rec, 3);
  cr_assert_eq(n, 3);
  const int want[3][3] = {{ST_WAIT, EV_DEP_DONE, ST_READY},
                          {ST_READY, EV_POST, ST_POSTED},
                          {ST_POSTED, EV_COMPLETE, ST_DONE}};
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(rec[i].machine, step_machine.id);
    cr_assert_eq(rec[i].actor, 7);
    cr_assert_eq(rec[i].group, 42);
    cr_assert_eq(rec[i].from, want[i][0]);
    cr_assert_eq(rec[i].event, want[i][1]);
    cr_assert_eq(rec[i].to, want[i][2]);
    cr_assert_neq(rec[i].t_ns, 0);
    if (i)
      cr_assert_geq(rec[i].t_ns, rec[i - 1].t_ns);
  }
}

Test(fsm, guard_chooses_between_rows_of_one_event) {
  struct step st = {.deps = 3};
  fsm_event_t dep = ev_of(EV_DEP_DONE, 0);

  fsm_init(&st.inst, &step_machine, ST_WAIT, 1, 1);
  cr_assert_eq(fsm_dispatch(&st.inst, &dep), 0);
  cr_assert_eq(st.inst.state, ST_WAIT);
  cr_assert_eq(st.deps, 2);
  cr_assert_eq(fsm_dispatch(&st.inst, &dep), 0);
  cr_assert_eq(st.inst.state, ST_WAIT);
  cr_assert_eq(st.deps, 1);
  cr_assert_eq(fsm_dispatch(&st.inst, &dep), 0);
  cr_assert_eq(st.inst.state, ST_READY, "guard refused: the next row is taken");
  cr_assert_eq(st.deps, 0);
}

/* ---- a door: guards on the key pick between rows ---- */
enum { D_CLOSED, D_OPEN, D_LOCKED, D_N };
enum { DE_OPEN, DE_CLOSE, DE_LOCK, DE_UNLOCK, DE_N };

static const char *const door_states[] = {"CLOSED", "OPEN", "LOCKED"};
static const char *const door_events[] = {"OPEN", "CLOSE", "LOCK", "UNLOCK"};

struct door {
  fsm_inst_t inst;
  int64_t key;
  int bad_tries;
};

static bool door_right_key(fsm_inst_t *inst, const fsm_event_t *ev) {
  return container_of(inst, struct door, inst)->key == ev->arg;
}

static void door_count_bad(fsm_inst_t *inst, const fsm_event_t *ev) {
  container_of(inst, struct door, inst)->bad_tries++;
}

static void door_set_key(fsm_inst_t *inst, const fsm_event_t *ev) {
  container_of(inst, struct door, inst)->key = ev->arg;
}

static const fsm_row_t door_rows[] = {
    {D_CLOSED, DE_OPEN, NULL, NULL, D_OPEN},
    {D_OPEN, DE_CLOSE, NULL, NULL, D_CLOSED},
    {D_CLOSED, DE_LOCK, NULL, door_set_key, D_LOCKED},
    {D_LOCKED, DE_UNLOCK, door_right_key, NULL, D_CLOSED},
    {D_LOCKED, DE_UNLOCK, NULL, door_count_bad, D_LOCKED},
};

static fsm_machine_t door_machine = {
    .name = "door",
    .nstates = D_N,
    .state_names = door_states,
    .nevents = DE_N,
    .event_names = door_events,
    .rows = door_rows,
    .nrows = sizeof(door_rows) / sizeof(door_rows[0]),
};

Test(fsm, door_guard_takes_first_accepting_row) {
  struct door d = {0};
  fsm_event_t ev;

  cr_assert_eq(fsm_machine_check(&door_machine), 0);
  fsm_init(&d.inst, &door_machine, D_CLOSED, 0, 0);
  ev = ev_of(DE_LOCK, 1234);
  cr_assert_eq(fsm_dispatch(&d.inst, &ev), 0);
  cr_assert_eq(d.inst.state, D_LOCKED);
  ev = ev_of(DE_UNLOCK, 1);
  cr_assert_eq(fsm_dispatch(&d.inst, &ev), 0);
  cr_assert_eq(d.inst.state, D_LOCKED);
  cr_assert_eq(d.bad_tries, 1);
  ev = ev_of(DE_UNLOCK, 1234);
  cr_assert_eq(fsm_dispatch(&d.inst, &ev), 0);
  cr_assert_eq(d.inst.state, D_CLOSED);
  cr_assert_eq(d.bad_tries, 1);
  ev = ev_of(DE_OPEN, 0);
  cr_assert_eq(fsm_dispatch(&d.inst, &ev), 0);
  cr_assert_eq(d.inst.state, D_OPEN);
}

static int miss_calls;
static const fsm_inst_t *miss_inst;
static int miss_state, miss_sig;

static void record_miss(const fsm_inst_t *inst, const fsm_event_t *ev) {
  miss_calls++;
  miss_inst = inst;
  miss_state = inst->state;
  miss_sig = ev->sig;
}

Test(fsm, unhandled_event_is_enoent_journaled_and_reported) {
  struct door d = {0};
  fsm_event_t ev = ev_of(DE_CLOSE, 0);
  fsm_record_t r;
  uint64_t before;

  fsm_machine_register(&door_machine);
  fsm_set_error_handler(record_miss);
  fsm_init(&d.inst, &door_machine, D_CLOSED, 3, 9);
  before = fsm_journal_total();

  cr_assert_eq(fsm_dispatch(&d.inst, &ev), -ENOENT);
  cr_assert_eq(d.inst.state, D_CLOSED, "a miss leaves the state alone");
  cr_assert_eq(fsm_journal_total(), before + 1);
  r = last_record();
  cr_assert_eq(r.to, FSM_JOURNAL_MISS);
  cr_assert_eq(r.from, D_CLOSED);
  cr_assert_eq(r.event, DE_CLOSE);
  cr_assert_eq(r.machine, door_machine.id);
  cr_assert_eq(r.actor, 3);
  cr_assert_eq(r.group, 9);
  cr_assert_eq(miss_calls, 1);
  cr_assert_eq(miss_inst, &d.inst);
  cr_assert_eq(miss_state, D_CLOSED);
  cr_assert_eq(miss_sig, DE_CLOSE);

  fsm_set_error_handler(NULL);
  fsm_set_error_handler(record_miss);
  ev = ev_of(DE_UNLOCK, 5);
  cr_assert_eq(fsm_dispatch(&d.inst, &ev), -ENOENT);
  cr_assert_eq(miss_calls, 2);
  fsm_set_error_handler(NULL);
}

/* Runs fn with fd 2 sent to a temporary file; returns the lines written. */
static int count_stderr_lines(void (*fn)(void), char *text, size_t textsz) {
  FILE *tf = tmpfile();
  int saved, lines = 0;
  size_t len;

  cr_assert_not_null(tf);
  fflush(stderr);
  saved = dup(2);
  cr_assert_geq(saved, 0);
  cr_assert_geq(dup2(fileno(tf), 2), 0);
  fn();
  fflush(stderr);
  cr_assert_geq(dup2(saved, 2), 0);
  close(saved);
  rewind(tf);
  len = fread(text, 1, textsz - 1, tf);
  text[len] = '\0';
  fclose(tf);
  for (size_t i = 0; i < len; i++)
    lines += text[i] == '\n';
  return lines;
}

static void miss_the_door_often(void) {
  struct door d = {0};
  fsm_event_t close_ev = ev_of(DE_CLOSE, 0), unlock_ev = ev_of(DE_UNLOCK, 0);

  fsm_init(&d.inst, &door_machine, D_CLOSED, 0, 0);
  for (int i = 0; i < 1000; i++) {
    cr_assert_eq(fsm_dispatch(&d.inst, &close_ev), -ENOENT);
    cr_assert_eq(fsm_dispatch(&d.inst, &unlock_ev), -ENOENT);
  }
}

Test(fsm, default_error_handler_names_the_miss_once) {
  static char text[8192];
  int lines = count_stderr_lines(miss_the_door_often, text, sizeof(text));

  cr_assert_eq(lines, 2, "one line per (machine, state, event), got:\n%s", text);
  cr_assert(strstr(text, "door"), "%s", text);
  cr_assert(strstr(text, "CLOSED"), "%s", text);
  cr_assert(strstr(text, "CLOSE "), "%s", text);
  cr_assert(strstr(text, "UNLOCK"), "%s", text);
}

#define WIDE_EVENTS 40
static const char *wide_events[WIDE_EVENTS];
static const char *const wide_states[] = {"ONLY"};
static fsm_machine_t wide_machine = {
    .name = "wide",
    .nstates = 1,
    .state_names = wide_states,
    .nevents = WIDE_EVENTS,
    .event_names = wide_events,
};

static void miss_many_distinct(void) {
  fsm_inst_t inst;

  for (int i = 0; i < WIDE_EVENTS; i++)
    wide_events[i] = "E";
  fsm_init(&inst, &wide_machine, 0, 0, 0);
  for (int i = 0; i < WIDE_EVENTS; i++) {
    fsm_event_t ev = ev_of(i, 0);

    cr_assert_eq(fsm_dispatch(&inst, &ev), -ENOENT);
  }
}

Test(fsm, default_error_handler_is_rate_limited) {
  static char text[16384];
  int lines = count_stderr_lines(miss_many_distinct, text, sizeof(text));

  /* 10 a second; the burst may straddle one second boundary. */
  cr_assert_geq(lines, 10, "%s", text);
  cr_assert_leq(lines, 20, "%s", text);
}

Test(fsm, out_of_range_is_einval_and_touches_nothing) {
  struct step st = {.deps = 1};
  fsm_event_t ev = ev_of(EV_N, 0);
  uint64_t before;

  fsm_set_error_handler(record_miss);
  fsm_init(&st.inst, &step_machine, ST_WAIT, 0, 0);
  before = fsm_journal_total();
  cr_assert_eq(fsm_dispatch(&st.inst, &ev), -EINVAL);
  ev.sig = -1;
  cr_assert_eq(fsm_dispatch(&st.inst, &ev), -EINVAL);
  ev.sig = EV_DEP_DONE;
  st.inst.state = ST_N;
  cr_assert_eq(fsm_dispatch(&st.inst, &ev), -EINVAL);
  st.inst.state = -3;
  cr_assert_eq(fsm_dispatch(&st.inst, &ev), -EINVAL);
  cr_assert_eq(fsm_dispatch(NULL, &ev), -EINVAL);
  cr_assert_eq(fsm_dispatch(&st.inst, NULL), -EINVAL);
  st.inst.machine = NULL;
  cr_assert_eq(fsm_dispatch(&st.inst, &ev), -EINVAL);
  cr_assert_eq(fsm_journal_total(), before);
  cr_assert_eq(miss_calls, 0);
  cr_assert_eq(st.deps, 1);
  cr_assert_str_eq(fsm_state_name(&step_machine, 99), "?");
  cr_assert_str_eq(fsm_state_name(&step_machine, -1), "?");
  cr_assert_str_eq(fsm_event_name(&step_machine, EV_N), "?");
  cr_assert_str_eq(fsm_event_name(NULL, 0), "?");
  fsm_set_error_handler(NULL);
}

/* An action that dispatches to its own instance: the inner transition must
 * stick and be journaled after the outer one. */
enum { C_A, C_B, C_C, C_N };
enum { CE_GO, CE_MORE, CE_N };
static const char *const chain_states[] = {"A", "B", "C"};
static const char *const chain_events[] = {"GO", "MORE"};

static void chain_again(fsm_inst_t *inst, const fsm_event_t *ev) {
  fsm_event_t more = ev_of(CE_MORE, 0);

  cr_assert_eq(fsm_dispatch(inst, &more), 0);
}

static const fsm_row_t chain_rows[] = {
    {C_A, CE_GO, NULL, chain_again, C_B},
    {C_B, CE_MORE, NULL, NULL, C_C},
};

static fsm_machine_t chain_machine = {
    .name = "chain",
    .nstates = C_N,
    .state_names = chain_states,
    .nevents = CE_N,
    .event_names = chain_events,
    .rows = chain_rows,
    .nrows = 2,
};

Test(fsm, action_may_dispatch_to_its_own_instance) {
  fsm_inst_t inst;
  fsm_event_t go = ev_of(CE_GO, 0);
  fsm_record_t rec[2];

  fsm_machine_register(&chain_machine);
  fsm_init(&inst, &chain_machine, C_A, 0, 0);
  cr_assert_eq(fsm_dispatch(&inst, &go), 0);
  cr_assert_eq(inst.state, C_C);
  cr_assert_eq(fsm_journal_snapshot(rec, 2), 2);
  cr_assert_eq(rec[0].from, C_A);
  cr_assert_eq(rec[0].to, C_B);
  cr_assert_eq(rec[1].from, C_B);
  cr_assert_eq(rec[1].to, C_C);
}

Test(fsm, machine_check_rejects_bad_tables) {
  fsm_machine_t m;
  fsm_row_t rows[4];
  const char *holey[] = {"WAIT", NULL, "POSTED", "DONE"};

  memcpy(rows, step_rows, sizeof(step_rows));
  m = step_machine;
  m.rows = rows;
  cr_assert_eq(fsm_machine_check(&m), 0);

  cr_assert_eq(fsm_machine_check(NULL), -EINVAL);
  rows[2].state = ST_N;
  cr_assert_eq(fsm_machine_check(&m), -EINVAL, "state out of range");
  rows[2].state = ST_READY;
  rows[2].next = -1;
  cr_assert_eq(fsm_machine_check(&m), -EINVAL, "next out of range");
  rows[2].next = ST_POSTED;
  rows[3].event = EV_N;
  cr_assert_eq(fsm_machine_check(&m), -EINVAL, "event out of range");
  rows[3].event = EV_COMPLETE;
  cr_assert_eq(fsm_machine_check(&m), 0);

  rows[0].guard = NULL;
  cr_assert_eq(fsm_machine_check(&m), -EINVAL, "row shadowed by an unguarded row");
  rows[0].guard = step_deps_left;

  m.state_names = holey;
  cr_assert_eq(fsm_machine_check(&m), -EINVAL, "missing state name");
  m.state_names = NULL;
  cr_assert_eq(fsm_machine_check(&m), -EINVAL);
  m.state_names = step_states;
  m.event_names = NULL;
  cr_assert_eq(fsm_machine_check(&m), -EINVAL);
  m.event_names = step_events;
  m.name = NULL;
  cr_assert_eq(fsm_machine_check(&m), -EINVAL);
  m.name = "step";
  m.nstates = 0;
  cr_assert_eq(fsm_machine_check(&m), -EINVAL);
  m.nstates = ST_N;
  m.rows = NULL;
  cr_assert_eq(fsm_machine_check(&m), -EINVAL, "rows missing");
  m.rows = rows;
  cr_assert_eq(fsm_machine_check(&m), 0);
}

/* ---- journal ---- */
static fsm_record_t rec_n(uint32_t i) {
  fsm_record_t r = {
      .t_ns = 1000 + i, .actor = i, .group = ~i, .machine = 1, .from = 2, .event = 3, .to = 4};

  return r;
}

Test(journal, wraparound_keeps_the_newest_in_order) {
  fsm_record_t out[64];
  uint64_t before;
  size_t n;

  fsm_journal_configure(8);
  before = fsm_journal_total();
  for (uint32_t i = 0; i < 20; i++) {
    fsm_record_t r = rec_n(i);

    fsm_journal_append(&r);
  }
  cr_assert_eq(fsm_journal_total(), before + 20);
  n = fsm_journal_snapshot(out, 64);
  cr_assert_eq(n, 8);
  for (uint32_t i = 0; i < 8; i++) {
    fsm_record_t want = rec_n(12 + i);

    cr_assert_eq(memcmp(&out[i], &want, sizeof(want)), 0, "slot %u", i);
  }
  n = fsm_journal_snapshot(out, 3);
  cr_assert_eq(n, 3);
  cr_assert_eq(out[0].actor, 17);
  cr_assert_eq(out[1].actor, 18);
  cr_assert_eq(out[2].actor, 19);
  cr_assert_eq(fsm_journal_snapshot(out, 0), 0);
  cr_assert_eq(fsm_journal_snapshot(NULL, 4), 0);
}

Test(journal, capacity_rounds_up_and_reconfigure_clears) {
  fsm_record_t out[64];

  fsm_journal_configure(5);
  for (uint32_t i = 0; i < 3; i++) {
    fsm_record_t r = rec_n(i);

    fsm_journal_append(&r);
  }
  cr_assert_eq(fsm_journal_snapshot(out, 64), 3);
  fsm_journal_configure(5);
  cr_assert_eq(fsm_journal_snapshot(out, 64), 0, "configure discards what was held");
  for (uint32_t i = 0; i < 20; i++) {
    fsm_record_t r = rec_n(i);

    fsm_journal_append(&r);
  }
  cr_assert_eq(fsm_journal_snapshot(out, 64), 8, "5 rounds up to 8");
  cr_assert_eq(out[7].actor, 19);
}

/* The ring's pages are touched when it is made, not on the calls' path: a
 * first touch is a page fault (10 us a page measured on a virtual machine),
 * and the first lap of a lazily faulted 65536-record ring took 512 of them. */
Test(journal, first_lap_takes_no_page_faults) {
  struct rusage before, after;

  fsm_journal_configure(65536);
  cr_assert_eq(getrusage(RUSAGE_THREAD, &before), 0);
  for (uint32_t i = 0; i < 65536; i++) {
    fsm_record_t r = rec_n(i);

    fsm_journal_append(&r);
  }
  cr_assert_eq(getrusage(RUSAGE_THREAD, &after), 0);
  cr_assert_lt(after.ru_minflt - before.ru_minflt, 8, "%ld page faults filling the ring",
               after.ru_minflt - before.ru_minflt);
}

/* Nor does it ask for transparent huge pages: on the development machine,
 * whose kernel samples physical memory for a pageout scheme (DAMON), ranks
 * holding such a ring stalled together, twice a second, for up to 474 ms
 * (fsm/journal.c). No mapping of this process may carry the advice
 * (smaps' VmFlags "hg"): the ring is the only thing here that gave it. */
Test(journal, ring_asks_for_no_huge_pages) {
  fsm_record_t r = rec_n(1);
  char line[512];
  int vmas = 0, advised = 0;

  fsm_journal_configure(65536); /* 2 MiB of slots: the size that asked */
  fsm_journal_append(&r);
  FILE *f = fopen("/proc/self/smaps", "r");
  cr_assert_not_null(f, "/proc/self/smaps: %s", strerror(errno));
  while (fgets(line, sizeof(line), f)) {
    if (strncmp(line, "VmFlags:", 8))
      continue;
    vmas++;
    if (strstr(line, " hg"))
      advised++;
  }
  fclose(f);
  cr_assert_gt(vmas, 0, "no VmFlags lines read");
  cr_assert_eq(advised, 0, "%d mappings asked for huge pages", advised);
}

Test(journal, disabled_appends_nothing) {
  struct step st = {.deps = 1};
  fsm_event_t ev = ev_of(EV_DEP_DONE, 0);
  fsm_record_t r = rec_n(1), out[16];
  uint64_t before;
  size_t held;

  fsm_journal_configure(16);
  fsm_journal_append(&r);
  before = fsm_journal_total();
  held = fsm_journal_snapshot(out, 16);
  cr_assert(fsm_journal_enabled());
  fsm_journal_enable(false);
  cr_assert_not(fsm_journal_enabled());
  fsm_init(&st.inst, &step_machine, ST_WAIT, 0, 0);
  cr_assert_eq(fsm_dispatch(&st.inst, &ev), 0);
  cr_assert_eq(st.inst.state, ST_READY, "dispatch still works");
  fsm_journal_append(&r);
  cr_assert_eq(fsm_journal_total(), before);
  cr_assert_eq(fsm_journal_snapshot(out, 16), held);
  fsm_journal_enable(true);
  fsm_journal_append(&r);
  cr_assert_eq(fsm_journal_total(), before + 1);
}

/* Records a writer can be recognised by: every field derives from (t, i). */
static fsm_record_t rec_ti(uint32_t t, uint32_t i) {
  fsm_record_t r = {.t_ns = ((uint64_t)t << 40) | i,
                    .actor = t,
                    .group = i,
                    .machine = (uint16_t)(0x5a5a ^ t),
                    .from = (uint16_t)i,
                    .event = (uint16_t)(i * 7 + t),
                    .to = (uint16_t)(i ^ 0xbeef)};

  return r;
}

static bool rec_sane(const fsm_record_t *r) {
  fsm_record_t want = rec_ti(r->actor, r->group);

  return r->actor < 4 && memcmp(r, &want, sizeof(want)) == 0;
}

#define NWRITERS 4

struct writer {
  pthread_t th;
  uint32_t t;
  uint32_t count;
};

static void *writer_main(void *arg) {
  struct writer *w = arg;

  for (uint32_t i = 0; i < w->count; i++) {
    fsm_record_t r = rec_ti(w->t, i);

    fsm_journal_append(&r);
  }
  return NULL;
}

Test(journal, concurrent_appends_below_capacity_lose_nothing) {
  enum { PER = 12000, CAP = 65536 };
  static fsm_record_t out[CAP];
  static unsigned char seen[NWRITERS][PER];
  struct writer w[NWRITERS];
  int64_t last[NWRITERS];
  uint64_t before;
  size_t n;

  fsm_journal_configure(CAP);
  before = fsm_journal_total();
  for (uint32_t t = 0; t < NWRITERS; t++) {
    w[t] = (struct writer){.t = t, .count = PER};
    cr_assert_eq(pthread_create(&w[t].th, NULL, writer_main, &w[t]), 0);
  }
  for (int t = 0; t < NWRITERS; t++)
    pthread_join(w[t].th, NULL);

  cr_assert_eq(fsm_journal_total(), before + NWRITERS * PER);
  n = fsm_journal_snapshot(out, CAP);
  cr_assert_eq(n, NWRITERS * PER);
  for (int t = 0; t < NWRITERS; t++)
    last[t] = -1;
  for (size_t k = 0; k < n; k++) {
    cr_assert(rec_sane(&out[k]), "garbage record at %zu", k);
    cr_assert_gt((int64_t)out[k].group, last[out[k].actor], "writer order kept");
    last[out[k].actor] = out[k].group;
    cr_assert_eq(seen[out[k].actor][out[k].group]++, 0, "duplicate record");
  }
  for (int t = 0; t < NWRITERS; t++)
    cr_assert_eq(last[t], PER - 1);
}

static volatile bool stop_reading;

static void *reader_main(void *arg) {
  static fsm_record_t out[1024];
  size_t *bad = arg;

  while (!stop_reading) {
    size_t n = fsm_journal_snapshot(out, 1024);
    int64_t last[NWRITERS] = {-1, -1, -1, -1};

    for (size_t k = 0; k < n; k++) {
      if (!rec_sane(&out[k]) || (int64_t)out[k].group <= last[out[k].actor]) {
        (*bad)++;
        continue;
      }
      last[out[k].actor] = out[k].group;
    }
  }
  return NULL;
}

Test(journal, overwriting_appends_never_show_torn_records) {
  enum { PER = 200000, CAP = 1024 };
  static fsm_record_t out[CAP];
  struct writer w[NWRITERS];
  pthread_t reader;
  size_t bad = 0, n;

  fsm_journal_configure(CAP);
  stop_reading = false;
  cr_assert_eq(pthread_create(&reader, NULL, reader_main, &bad), 0);
  for (uint32_t t = 0; t < NWRITERS; t++) {
    w[t] = (struct writer){.t = t, .count = PER};
    cr_assert_eq(pthread_create(&w[t].th, NULL, writer_main, &w[t]), 0);
  }
  for (int t = 0; t < NWRITERS; t++)
    pthread_join(w[t].th, NULL);
  stop_reading = true;
  pthread_join(reader, NULL);

  cr_assert_eq(bad, 0, "a snapshot returned a torn or out-of-order record");
  n = fsm_journal_snapshot(out, CAP);
  cr_assert_gt(n, CAP / 2);
  for (size_t k = 0; k < n; k++)
    cr_assert(rec_sane(&out[k]));
}

/* ---- registry ---- */
#define NREG 16
static fsm_machine_t reg_machines[NREG];

static void *register_all(void *arg) {
  uintptr_t start = (uintptr_t)arg;

  for (int i = 0; i < NREG; i++)
    fsm_machine_register(&reg_machines[(start + i) % NREG]);
  return NULL;
}

Test(fsm, register_assigns_ids_idempotently_from_many_threads) {
  pthread_t th[8];
  bool used[0x10000] = {false};
  uint16_t id;

  for (int i = 0; i < NREG; i++)
    reg_machines[i] = step_machine;
  for (uintptr_t t = 0; t < 8; t++)
    cr_assert_eq(pthread_create(&th[t], NULL, register_all, (void *)(t * 5)), 0);
  for (int t = 0; t < 8; t++)
    pthread_join(th[t], NULL);
  for (int i = 0; i < NREG; i++) {
    id = reg_machines[i].id;
    cr_assert_neq(id, 0);
    cr_assert_not(used[id], "id %u given twice", id);
    used[id] = true;
    cr_assert_eq(fsm_machine_lookup(id), &reg_machines[i]);
    fsm_machine_register(&reg_machines[i]);
    cr_assert_eq(reg_machines[i].id, id, "registering again keeps the id");
  }
  fsm_machine_register(&door_machine);
  cr_assert_eq(fsm_machine_lookup(door_machine.id), &door_machine);
  cr_assert_null(fsm_machine_lookup(0));
  cr_assert_null(fsm_machine_lookup(0xfff0));
  fsm_machine_register(NULL);
}

/* ---- actors ---- */
enum { T_RUN, T_N };
enum { T_TICK, T_N_EV };
static const char *const tick_states[] = {"RUN"};
static const char *const tick_events[] = {"TICK"};

struct ticker {
  fsm_actor_t actor;
  fsm_sched_t *sched;
  struct event_base *base; /* loopbreak after `until` ticks; NULL: none */
  int depth, max_depth;
  int ticks, until;
  size_t nested_run;
  pthread_t loop_thread;
  int off_thread;
  int64_t last_arg[NWRITERS];
  int out_of_order;
  int64_t log[16];
  int nlog;
};

static void tick(fsm_inst_t *inst, const fsm_event_t *ev) {
  struct ticker *tk = container_of(inst, struct ticker, actor.inst);
  fsm_event_t again = ev_of(T_TICK, ev->arg + 1);

  tk->depth++;
  if (tk->depth > tk->max_depth)
    tk->max_depth = tk->depth;
  tk->ticks++;
  if (tk->nlog < 16)
    tk->log[tk->nlog++] = ev->arg;
  if (!pthread_equal(pthread_self(), tk->loop_thread))
    tk->off_thread++;
  tk->nested_run += fsm_sched_run(tk->sched);
  if (tk->ticks < tk->until)
    cr_assert_eq(fsm_actor_post(&tk->actor, &again), 0);
  else if (tk->base)
    event_base_loopbreak(tk->base);
  tk->depth--;
}

static const fsm_row_t tick_rows[] = {{T_RUN, T_TICK, NULL, tick, T_RUN}};
static fsm_machine_t tick_machine = {
    .name = "ticker",
    .nstates = T_N,
    .state_names = tick_states,
    .nevents = T_N_EV,
    .event_names = tick_events,
    .rows = tick_rows,
    .nrows = 1,
};

Test(actor, self_post_from_action_is_not_reentrant) {
  struct ticker tk = {.until = 5, .loop_thread = pthread_self()};
  fsm_event_t ev = ev_of(T_TICK, 0);
  fsm_snapshot_t snap;

  tk.sched = fsm_sched_create(NULL);
  cr_assert_not_null(tk.sched);
  cr_assert_eq(fsm_actor_init(&tk.actor, tk.sched, &tick_machine, T_RUN, 11, 2), 0);
  cr_assert_eq(fsm_actor_post(&tk.actor, &ev), 0);
  for (int i = 1; i <= 5; i++) {
    cr_assert_eq(fsm_sched_run(tk.sched), 1, "one run takes only what was pending");
    cr_assert_eq(tk.ticks, i);
    fsm_actor_snapshot(&tk.actor, &snap);
    cr_assert_eq(snap.pending, i < 5 ? 1 : 0);
  }
  cr_assert_eq(fsm_sched_run(tk.sched), 0);
  cr_assert_eq(tk.max_depth, 1);
  cr_assert_eq(tk.nested_run, 0, "fsm_sched_run from an action does nothing");
  for (int i = 0; i < 5; i++)
    cr_assert_eq(tk.log[i], i);
  fsm_actor_fini(&tk.actor);
  fsm_sched_destroy(tk.sched);
}

Test(actor, self_posting_actor_is_driven_by_the_loop) {
  struct ticker tk = {.until = 50, .loop_thread = pthread_self()};
  fsm_event_t ev = ev_of(T_TICK, 0);

  tk.base = event_base_new();
  cr_assert_not_null(tk.base);
  tk.sched = fsm_sched_create(tk.base);
  cr_assert_not_null(tk.sched);
  cr_assert_eq(fsm_actor_init(&tk.actor, tk.sched, &tick_machine, T_RUN, 0, 0), 0);
  cr_assert_eq(fsm_actor_post(&tk.actor, &ev), 0);
  cr_assert_eq(tk.ticks, 0, "posting outside the loop only queues");
  cr_assert_eq(event_base_dispatch(tk.base), 0);
  cr_assert(event_base_got_break(tk.base));
  cr_assert_eq(tk.ticks, 50);
  cr_assert_eq(tk.max_depth, 1);
  fsm_actor_fini(&tk.actor);
  fsm_sched_destroy(tk.sched);
  event_base_free(tk.base);
}

/* A recorder: logs (actor, arg) in dispatch order. */
enum { R_ON, R_N };
enum { R_MSG, R_QUIT, R_N_EV };
static const char *const rec_states[] = {"ON"};
static const char *const rec_events[] = {"MSG", "QUIT"};

static int64_t order_log[4096];
static int norder;

static void rec_msg(fsm_inst_t *inst, const fsm_event_t *ev) {
  if (norder < 4096)
    order_log[norder++] = (int64_t)inst->actor_id << 32 | ev->arg;
}

static void rec_quit(fsm_inst_t *inst, const fsm_event_t *ev) {
  fsm_actor_fini(container_of(inst, fsm_actor_t, inst));
}

static const fsm_row_t rec_rows[] = {
    {R_ON, R_MSG, NULL, rec_msg, R_ON},
    {R_ON, R_QUIT, NULL, rec_quit, R_ON},
};
static fsm_machine_t rec_machine = {
    .name = "recorder",
    .nstates = R_N,
    .state_names = rec_states,
    .nevents = R_N_EV,
    .event_names = rec_events,
    .rows = rec_rows,
    .nrows = 2,
};

Test(actor, mailbox_grows_and_keeps_fifo_order) {
  fsm_sched_t *s = fsm_sched_create(NULL);
  fsm_actor_t a;
  fsm_snapshot_t snap;

  cr_assert_not_null(s);
  cr_assert_eq(fsm_actor_init(&a, s, &rec_machine, R_ON, 0, 0), 0);
  norder = 0;
  for (int i = 0; i < 1000; i++) {
    fsm_event_t ev = ev_of(R_MSG, i);

    cr_assert_eq(fsm_actor_post(&a, &ev), 0);
    if (i == 3)
      cr_assert_eq(fsm_sched_run(s), 4, "drain mid-way so the ring wraps");
  }
  fsm_actor_snapshot(&a, &snap);
  cr_assert_eq(snap.pending, 996);
  cr_assert_eq(fsm_sched_run(s), 996);
  cr_assert_eq(norder, 1000);
  for (int i = 0; i < 1000; i++)
    cr_assert_eq(order_log[i], i);
  fsm_actor_fini(&a);
  fsm_sched_destroy(s);
}

Test(actor, ready_actors_take_turns) {
  fsm_sched_t *s = fsm_sched_create(NULL);
  fsm_actor_t a, b;
  const int64_t want[] = {1L << 32 | 0,  2L << 32 | 10, 1L << 32 | 1,
                          2L << 32 | 11, 1L << 32 | 2,  2L << 32 | 12};

  cr_assert_eq(fsm_actor_init(&a, s, &rec_machine, R_ON, 1, 0), 0);
  cr_assert_eq(fsm_actor_init(&b, s, &rec_machine, R_ON, 2, 0), 0);
  norder = 0;
  for (int i = 0; i < 3; i++) {
    fsm_event_t ea = ev_of(R_MSG, i), eb = ev_of(R_MSG, 10 + i);

    cr_assert_eq(fsm_actor_post(&a, &ea), 0);
    cr_assert_eq(fsm_actor_post(&b, &eb), 0);
  }
  cr_assert_eq(fsm_sched_run(s), 6);
  cr_assert_eq(norder, 6);
  for (int i = 0; i < 6; i++)
    cr_assert_eq(order_log[i], want[i], "at %d", i);
  fsm_actor_fini(&a);
  fsm_actor_fini(&b);
  fsm_sched_destroy(s);
}

Test(actor, fini_drops_pending_and_unlinks) {
  fsm_sched_t *s = fsm_sched_create(NULL);
  fsm_actor_t a, b, c;
  fsm_event_t msg = ev_of(R_MSG, 5), quit = ev_of(R_QUIT, 0);
  fsm_snapshot_t snap;

  cr_assert_eq(fsm_actor_init(&a, s, &rec_machine, R_ON, 1, 0), 0);
  cr_assert_eq(fsm_actor_init(&b, s, &rec_machine, R_ON, 2, 0), 0);
  cr_assert_eq(fsm_actor_init(&c, s, &rec_machine, R_ON, 3, 0), 0);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(fsm_actor_post(&a, &msg), 0);
  cr_assert_eq(fsm_actor_post(&b, &msg), 0);
  cr_assert_eq(fsm_actor_post(&b, &msg), 0);
  cr_assert_eq(fsm_actor_post(&c, &quit), 0);
  cr_assert_eq(fsm_actor_post(&c, &msg), 0);
  cr_assert_eq(fsm_actor_post(&c, &msg), 0);
  norder = 0;

  fsm_actor_fini(&a);
  fsm_actor_snapshot(&a, &snap);
  cr_assert_eq(snap.pending, 0);
  cr_assert_null(a.box);
  cr_assert_null(a.sched);
  fsm_actor_fini(&a);
  cr_assert_eq(fsm_actor_post(&a, &msg), -EINVAL, "a finalised actor takes no posts");

  /* b, then c (which finis itself and drops its two MSGs), then b. */
  cr_assert_eq(fsm_sched_run(s), 3);
  cr_assert_eq(norder, 2);
  cr_assert_eq(order_log[0], 2L << 32 | 5);
  cr_assert_eq(order_log[1], 2L << 32 | 5);
  cr_assert_null(c.sched);
  cr_assert_eq(fsm_sched_run(s), 0);
  fsm_actor_fini(&b);
  fsm_sched_destroy(s);
}

Test(actor, snapshot_and_bad_posts) {
  fsm_sched_t *s = fsm_sched_create(NULL);
  fsm_actor_t a;
  fsm_event_t bad = ev_of(R_N_EV, 0), ok = ev_of(R_MSG, 1);
  fsm_snapshot_t snap;

  cr_assert_eq(fsm_actor_init(NULL, s, &rec_machine, R_ON, 0, 0), -EINVAL);
  cr_assert_eq(fsm_actor_init(&a, NULL, &rec_machine, R_ON, 0, 0), -EINVAL);
  cr_assert_eq(fsm_actor_init(&a, s, &rec_machine, R_N, 0, 0), -EINVAL);
  cr_assert_eq(fsm_actor_init(&a, s, &rec_machine, R_ON, 77, 5), 0);
  cr_assert_eq(fsm_actor_post(&a, &bad), -EINVAL);
  cr_assert_eq(fsm_actor_post(&a, NULL), -EINVAL);
  cr_assert_eq(fsm_actor_post(&a, &ok), 0);
  cr_assert_eq(fsm_actor_post(&a, &ok), 0);
  fsm_actor_snapshot(&a, &snap);
  cr_assert_str_eq(snap.machine, "recorder");
  cr_assert_str_eq(snap.state, "ON");
  cr_assert_eq(snap.state_id, R_ON);
  cr_assert_eq(snap.actor_id, 77);
  cr_assert_eq(snap.group, 5);
  cr_assert_eq(snap.pending, 2);
  fsm_actor_fini(&a);
  fsm_sched_destroy(s);
}

/* ---- cross-thread posting ---- */
struct poster {
  pthread_t th;
  struct ticker *tk;
  uint32_t t, count;
  unsigned delay_ms;
};

static void counted(fsm_inst_t *inst, const fsm_event_t *ev) {
  struct ticker *tk = container_of(inst, struct ticker, actor.inst);
  int t = (int)(ev->arg >> 32);

  if (!pthread_equal(pthread_self(), tk->loop_thread))
    tk->off_thread++;
  if ((ev->arg & 0xffffffff) <= tk->last_arg[t] && tk->last_arg[t] >= 0)
    tk->out_of_order++;
  tk->last_arg[t] = ev->arg & 0xffffffff;
  if (++tk->ticks == tk->until)
    event_base_loopbreak(tk->base);
}

static const fsm_row_t counted_rows[] = {{T_RUN, T_TICK, NULL, counted, T_RUN}};
static fsm_machine_t counted_machine = {
    .name = "counted",
    .nstates = T_N,
    .state_names = tick_states,
    .nevents = T_N_EV,
    .event_names = tick_events,
    .rows = counted_rows,
    .nrows = 1,
};

static void *poster_main(void *arg) {
  struct poster *p = arg;

  if (p->delay_ms)
    usleep(p->delay_ms * 1000);
  for (uint32_t i = 0; i < p->count; i++) {
    fsm_event_t ev = ev_of(T_TICK, (int64_t)p->t << 32 | i);

    if (fsm_actor_post(&p->tk->actor, &ev))
      abort();
  }
  return NULL;
}

static double cpu_seconds(void) {
  struct rusage ru;

  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

Test(actor, post_from_another_thread_wakes_an_idle_loop) {
  struct ticker tk = {.until = 1, .loop_thread = pthread_self(), .last_arg = {-1, -1, -1, -1}};
  struct poster p = {.tk = &tk, .t = 0, .count = 1, .delay_ms = 300};
  double cpu;

  tk.base = event_base_new();
  tk.sched = fsm_sched_create(tk.base);
  cr_assert_not_null(tk.sched);
  cr_assert_eq(fsm_actor_init(&tk.actor, tk.sched, &counted_machine, T_RUN, 0, 0), 0);
  cr_assert_eq(pthread_create(&p.th, NULL, poster_main, &p), 0);
  cpu = cpu_seconds();
  cr_assert_eq(event_base_dispatch(tk.base), 0);
  cpu = cpu_seconds() - cpu;
  pthread_join(p.th, NULL);
  cr_assert_eq(tk.ticks, 1);
  cr_assert_eq(tk.off_thread, 0, "dispatched on the loop thread");
  cr_assert_lt(cpu, 0.15, "the loop slept while waiting (%.3f s of CPU)", cpu);
  fsm_actor_fini(&tk.actor);
  fsm_sched_destroy(tk.sched);
  event_base_free(tk.base);
}

Test(actor, many_threads_post_and_the_loop_dispatches_all) {
  enum { PER = 20000 };
  struct ticker tk = {
      .until = NWRITERS * PER, .loop_thread = pthread_self(), .last_arg = {-1, -1, -1, -1}};
  struct poster p[NWRITERS];

  tk.base = event_base_new();
  tk.sched = fsm_sched_create(tk.base);
  cr_assert_not_null(tk.sched);
  cr_assert_eq(fsm_actor_init(&tk.actor, tk.sched, &counted_machine, T_RUN, 0, 0), 0);
  for (uint32_t t = 0; t < NWRITERS; t++) {
    p[t] = (struct poster){.tk = &tk, .t = t, .count = PER, .delay_ms = t * 5};
    cr_assert_eq(pthread_create(&p[t].th, NULL, poster_main, &p[t]), 0);
  }
  cr_assert_eq(event_base_dispatch(tk.base), 0);
  for (int t = 0; t < NWRITERS; t++)
    pthread_join(p[t].th, NULL);
  cr_assert_eq(tk.ticks, NWRITERS * PER);
  cr_assert_eq(tk.off_thread, 0);
  cr_assert_eq(tk.out_of_order, 0, "each poster's events arrive in its order");
  for (int t = 0; t < NWRITERS; t++)
    cr_assert_eq(tk.last_arg[t], PER - 1);
  cr_assert_eq(fsm_sched_run(tk.sched), 0);
  fsm_actor_fini(&tk.actor);
  fsm_sched_destroy(tk.sched);
  event_base_free(tk.base);
}
