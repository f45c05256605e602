/*
 * The watchdog's judge (engine/boot/watch_srv.c) on beats written to order: each
 * rule names the right culprit with the right code, a poll comes before a
 * verdict on a conflict or a loss, and judging 4096 ranks stays cheap.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bootstrap.pb-c.h"
#include "chorus.h"
#include "ckpt.h"
#include "fsm.h"
#include "watch_srv.h"

typedef struct sink {
  int polls, verdicts;
  int code, culprit;
  char text[1024];
} sink_t;

static void on_send(void *arg, int rank, const uint8_t *frame, size_t len) {
  sink_t *s = arg;
  Chorus__Boot__Envelope *env = chorus__boot__envelope__unpack(NULL, len - 4, frame + 4);
  cr_assert_not_null(env);
  if (env->msg_case == CHORUS__BOOT__ENVELOPE__MSG_POLL) {
    s->polls++;
  } else if (env->msg_case == CHORUS__BOOT__ENVELOPE__MSG_VERDICT) {
    if (rank == 0) {
      s->verdicts++;
      s->code = env->verdict->code;
      s->culprit = env->verdict->culprit;
      snprintf(s->text, sizeof(s->text), "%s", env->verdict->text);
    }
  }
  chorus__boot__envelope__free_unpacked(env, NULL);
}

static wsrv_t *judge(int n, sink_t *s) {
  wsrv_config_t cfg = {
      .size = n, .timeout_s = 10, .peer_timeout_s = 5, .tick_s = 0.2, .send = on_send, .arg = s};
  memset(s, 0, sizeof(*s));
  s->culprit = -2;
  wsrv_t *w = wsrv_new(&cfg, 0);
  cr_assert_not_null(w);
  for (int r = 0; r < n; r++)
    wsrv_join(w, r, 0);
  return w;
}

/* A beat: calls 1..last (the last `open` of them unfinished, the open ones
 * waiting wait_ms), every call an allreduce of `count` except call `odd`,
 * which is odd_fp. */
typedef struct beat_spec {
  uint64_t last;
  int open;
  uint64_t count;
  uint64_t odd;
  uint64_t odd_fp;
  uint64_t wait_ms, quiet_ms;
  int waits_for;
  bool reply;
  int failed;
  bool destroying;
  /* what the application waits in: for blocked_ms, in #blocked_seq or a
   * receive from blocked_peer */
  uint64_t blocked_ms, blocked_seq;
  int blocked_peer;
} beat_spec_t;

static void beat(wsrv_t *w, int rank, beat_spec_t b, double now) {
  Chorus__Boot__WatchCall calls[16], *pc[16];
  Chorus__Boot__Beat m = CHORUS__BOOT__BEAT__INIT;
  size_t n = 0;
  uint64_t first = b.last > 16 ? b.last - 15 : 1;
  for (uint64_t s = first; s <= b.last; s++, n++) {
    Chorus__Boot__WatchCall *c = &calls[n];
    chorus__boot__watch_call__init(c);
    c->seq = s;
    c->fp = s == b.odd ? b.odd_fp
                       : fp_make(COLL_ALLREDUCE, CHORUS_FLOAT32, b.count, -1, CHORUS_SUM, NULL);
    c->kind = (s == b.odd ? (uint32_t)fp_kind(b.odd_fp) : COLL_ALLREDUCE) + 1;
    c->dtype = CHORUS_FLOAT32 + 1;
    c->count = s == b.odd ? (b.odd_fp & 0xffffffffu) : b.count;
    c->root = -1;
    c->op = CHORUS_SUM + 1;
    c->algo = "ring";
    c->done = s + (uint64_t)b.open <= b.last;
    c->age_ms = c->done ? 1 : b.wait_ms;
    pc[n] = c;
  }
  m.last_begun = b.last;
  m.last_finished = b.last - (uint64_t)b.open;
  m.n_calls = n;
  m.calls = pc;
  m.wait_ms = b.open ? b.wait_ms : 0;
  m.quiet_ms = b.quiet_ms;
  m.waits_for = b.waits_for;
  m.where = "";
  m.failure = b.failed ? "local failure" : "";
  m.failed = b.failed;
  m.reply = b.reply;
  m.stalled = "";
  m.destroying = b.destroying;
  m.blocked_ms = b.blocked_ms;
  m.blocked_seq = b.blocked_seq;
  m.blocked_peer = b.blocked_ms && !b.blocked_seq ? b.blocked_peer : -1;
  m.blocked_recv = b.blocked_ms && !b.blocked_seq;
  wsrv_beat(w, rank, &m, now);
}

/* Ranks answer the poll the judge sends first; then it decides. */
static void answer_poll(wsrv_t *w, int n, const beat_spec_t *specs, double now) {
  for (int r = 0; r < n; r++) {
    beat_spec_t b = specs[r];
    b.reply = true;
    beat(w, r, b, now);
  }
}

Test(watch_srv, another_collective_is_divergence) {
  sink_t s;
  wsrv_t *w = judge(4, &s);
  uint64_t barrier = fp_make(COLL_BARRIER, CHORUS_UINT8, 0, -1, CHORUS_SUM, NULL);
  beat_spec_t b[4];
  for (int r = 0; r < 4; r++)
    b[r] = (beat_spec_t){.last = 7, .open = 1, .count = 4096, .wait_ms = 100, .waits_for = -1};
  b[2].odd = 7;
  b[2].odd_fp = barrier;
  for (int r = 0; r < 4; r++)
    beat(w, r, b[r], 1.0);
  wsrv_tick(w, 1.1);
  cr_assert_eq(s.polls, 4, "a conflict is polled first (%d polls)", s.polls);
  cr_assert_eq(s.verdicts, 0);
  answer_poll(w, 4, b, 1.2);
  cr_assert_eq(s.verdicts, 1);
  cr_assert_eq(s.code, CHORUS_ERR_DIVERGED);
  cr_assert_eq(s.culprit, 2, "%s", s.text);
  cr_assert(strstr(s.text, "#7") && strstr(s.text, "barrier()") && strstr(s.text, "ranks 0,1,3"),
            "%s", s.text);
  wsrv_free(w);
}

Test(watch_srv, other_arguments_are_a_mismatch_and_the_minority_is_blamed) {
  sink_t s;
  wsrv_t *w = judge(5, &s);
  beat_spec_t b[5];
  for (int r = 0; r < 5; r++)
    b[r] = (beat_spec_t){.last = 3, .open = 1, .count = 100, .wait_ms = 50, .waits_for = -1};
  /* rank 0 is the odd one: the majority, not the lowest rank, is right */
  b[0].odd = 3;
  b[0].odd_fp = fp_make(COLL_ALLREDUCE, CHORUS_FLOAT32, 101, -1, CHORUS_SUM, NULL);
  for (int r = 0; r < 5; r++)
    beat(w, r, b[r], 1.0);
  wsrv_tick(w, 1.1);
  answer_poll(w, 5, b, 1.2);
  cr_assert_eq(s.code, CHORUS_ERR_MISMATCH);
  cr_assert_eq(s.culprit, 0, "%s", s.text);
  cr_assert(strstr(s.text, "count 101 instead of 100"), "%s", s.text);
  wsrv_free(w);
}

Test(watch_srv, a_rank_that_never_called_diverged_at_the_timeout) {
  sink_t s;
  wsrv_t *w = judge(4, &s);
  for (int r = 0; r < 4; r++) {
    beat_spec_t b = {.last = 5, .open = 1, .count = 8, .wait_ms = 9000, .waits_for = 2};
    if (r == 2)
      b = (beat_spec_t){.last = 4, .count = 8, .waits_for = -1};
    beat(w, r, b, 1.0);
  }
  wsrv_tick(w, 1.1);
  cr_assert_eq(s.verdicts, 0, "not before the timeout");
  for (int r = 0; r < 4; r++) {
    beat_spec_t b = {.last = 5, .open = 1, .count = 8, .wait_ms = 10500, .waits_for = 2};
    if (r == 2)
      b = (beat_spec_t){.last = 4, .count = 8, .waits_for = -1};
    beat(w, r, b, 2.0);
  }
  wsrv_tick(w, 2.1);
  cr_assert_eq(s.code, CHORUS_ERR_DIVERGED);
  cr_assert_eq(s.culprit, 2, "%s", s.text);
  cr_assert(strstr(s.text, "never called #5"), "%s", s.text);
  wsrv_free(w);
}

Test(watch_srv, a_silent_progress_engine_is_stalled) {
  sink_t s;
  wsrv_t *w = judge(4, &s);
  for (int r = 0; r < 4; r++) {
    beat_spec_t b = {.last = 5,
                     .open = 1,
                     .count = 8,
                     .wait_ms = 11000,
                     .quiet_ms = r == 3 ? 11000 : 100,
                     .waits_for = (r + 1) % 4};
    beat(w, r, b, 1.0);
  }
  wsrv_tick(w, 1.1);
  cr_assert_eq(s.code, CHORUS_ERR_TIMEOUT);
  cr_assert_eq(s.culprit, 3, "%s", s.text);
  cr_assert(strstr(s.text, "stalled"), "%s", s.text);
  wsrv_free(w);
}

Test(watch_srv, a_wait_cycle_has_no_single_culprit) {
  sink_t s;
  wsrv_t *w = judge(4, &s);
  static const int wf[4] = {1, 2, 0, 0};
  for (int r = 0; r < 4; r++) {
    beat_spec_t b = {
        .last = 5, .open = 1, .count = 8, .wait_ms = 11000, .quiet_ms = 100, .waits_for = wf[r]};
    beat(w, r, b, 1.0);
  }
  wsrv_tick(w, 1.1);
  cr_assert_eq(s.code, CHORUS_ERR_TIMEOUT);
  cr_assert_eq(s.culprit, -1, "%s", s.text);
  cr_assert(strstr(s.text, "cycle (0 -> 1 -> 2 -> 0)"), "%s", s.text);
  wsrv_free(w);
}

Test(watch_srv, a_rank_that_finished_lost_its_messages) {
  sink_t s;
  wsrv_t *w = judge(3, &s);
  for (int r = 0; r < 3; r++) {
    beat_spec_t b = {
        .last = 5, .open = r == 1 ? 0 : 1, .count = 8, .wait_ms = 11000, .waits_for = 1};
    beat(w, r, b, 1.0);
  }
  wsrv_tick(w, 1.1);
  cr_assert_eq(s.code, CHORUS_ERR_TIMEOUT);
  cr_assert_eq(s.culprit, 1, "%s", s.text);
  cr_assert(strstr(s.text, "never arrived"), "%s", s.text);
  wsrv_free(w);
}

Test(watch_srv, lost_at_once_and_silent_after_the_peer_timeout) {
  sink_t s;
  wsrv_t *w = judge(3, &s);
  beat_spec_t b = {.last = 2, .open = 1, .count = 8, .wait_ms = 10, .waits_for = 1};
  for (int r = 0; r < 3; r++)
    beat(w, r, b, 1.0);
  wsrv_lost(w, 1, "its connection closed", 1.5);
  cr_assert_eq(s.polls, 2, "the survivors are polled first");
  answer_poll(w, 3, (beat_spec_t[]){b, b, b}, 1.6);
  cr_assert_eq(s.code, CHORUS_ERR_PEER_LOST);
  cr_assert_eq(s.culprit, 1, "%s", s.text);
  wsrv_free(w);

  w = judge(3, &s);
  for (int r = 0; r < 3; r++)
    beat(w, r, b, 1.0);
  for (double t = 1.2; t < 5.9; t += 0.2) {
    beat(w, 0, b, t);
    beat(w, 2, b, t);
    wsrv_tick(w, t);
  }
  cr_assert_eq(s.verdicts, 0, "rank 1 is silent for less than the peer timeout");
  for (double t = 6.0; t < 8.0 && !s.verdicts; t += 0.2) {
    beat(w, 0, b, t);
    beat(w, 2, b, t);
    wsrv_tick(w, t);
  }
  cr_assert_eq(s.code, CHORUS_ERR_PEER_LOST);
  cr_assert_eq(s.culprit, 1, "%s", s.text);
  cr_assert(strstr(s.text, "heartbeat"), "%s", s.text);
  wsrv_free(w);
}

Test(watch_srv, judging_4096_ranks_is_cheap) {
  const int n = 4096;
  sink_t s;
  wsrv_t *w = judge(n, &s);
  beat_spec_t b = {.last = 40, .open = 1, .count = 1 << 20, .wait_ms = 5, .waits_for = -1};
  for (int r = 0; r < n; r++)
    beat(w, r, b, 1.0);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < 10; i++)
    wsrv_tick(w, 1.0 + 0.01 * i);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms =
      ((double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6) / 10;
  cr_assert_eq(s.verdicts, 0, "a healthy job: %s", s.text);
  cr_log_info("one tick over %d ranks: %.2f ms", n, ms);
  cr_assert(ms < 50, "a tick over %d ranks took %.1f ms", n, ms);
  wsrv_free(w);
}

/* Rank 1 froze in #4; rank 0 is held in #6 sending to it; ranks 2 and 3
 * ran ahead to #7 (bcast leaves do). The frozen rank is named, not the first
 * rank found behind the others (the fault matrix caught that). */
Test(watch_srv, the_frozen_rank_not_the_first_behind) {
  sink_t s;
  wsrv_t *w = judge(4, &s);
  beat_spec_t b[4] = {
      {.last = 6, .open = 1, .count = 8, .wait_ms = 11000, .quiet_ms = 50, .waits_for = 1},
      {.last = 4, .open = 1, .count = 8, .wait_ms = 15000, .quiet_ms = 15000, .waits_for = -1},
      {.last = 7, .open = 1, .count = 8, .wait_ms = 11000, .quiet_ms = 50, .waits_for = 0},
      {.last = 7, .open = 1, .count = 8, .wait_ms = 11000, .quiet_ms = 50, .waits_for = 0}};
  for (int r = 0; r < 4; r++)
    beat(w, r, b[r], 1.0);
  wsrv_tick(w, 1.1);
  cr_assert_eq(s.code, CHORUS_ERR_TIMEOUT);
  cr_assert_eq(s.culprit, 1, "%s", s.text);
  cr_assert(strstr(s.text, "#4") && strstr(s.text, "rank 1"), "%s", s.text);
  wsrv_free(w);
}

/* A rank whose communicator takes longer to create than the peer timeout
 * (heartbeats start once it is made) is not declared lost meanwhile. */
Test(watch_srv, silence_counts_from_the_first_heartbeat) {
  sink_t s;
  wsrv_t *w = judge(2, &s);
  beat_spec_t b = {.last = 0, .count = 8, .waits_for = -1};
  for (double t = 0.2; t < 8.0; t += 0.2) {
    beat(w, 0, b, t); /* rank 1 still creating its communicator */
    wsrv_tick(w, t);
  }
  cr_assert_eq(s.verdicts, 0, "%s", s.text);
  beat(w, 1, b, 8.0);
  for (double t = 8.2; t < 16.0 && !s.verdicts; t += 0.2) {
    beat(w, 0, b, t);
    wsrv_tick(w, t);
  }
  cr_assert_eq(s.code, CHORUS_ERR_PEER_LOST, "silent after its first heartbeat: %s", s.text);
  cr_assert_eq(s.culprit, 1);
  wsrv_free(w);
}

/* A beat's ages come from calls copied out of the checkpoint and a clock read
 * by the watch thread. A call that the application thread begins after that
 * clock was read has begin_ns past it; its age is 0, not the 2^64 ns that
 * unsigned subtraction gives (which read as "waited past the timeout", and
 * failed a job over a call a moment old). */
Test(ckpt, age_of_a_call_begun_after_the_clock_was_read_is_zero) {
  const uint64_t now = 5000ull * 1000000; /* 5 s */
  ckpt_call_t c = {.seq = 2, .begin_ns = now + 3000};
  cr_assert_eq(ckpt_age_ms(&c, now), 0);
  c.begin_ns = now;
  cr_assert_eq(ckpt_age_ms(&c, now), 0);
  c.begin_ns = now - 1500ull * 1000000 - 999999;
  cr_assert_eq(ckpt_age_ms(&c, now), 1500);
  c.begin_ns = 0;
  cr_assert_eq(ckpt_age_ms(&c, now), 5000);
}

/* And through a real checkpoint: a call begun after the reader's clock,
 * copied by ckpt_recent, stays far below any timeout. */
Test(ckpt, a_call_begun_after_the_clock_was_read_is_not_late) {
  ckpt_t k;
  ckpt_init(&k);
  uint64_t before = fsm_now_ns();
  struct timespec ts = {0, 2 * 1000 * 1000};
  nanosleep(&ts, NULL);
  ckpt_call_t call = {.seq = 1, .count = 4, .root = -1, .begin_ns = fsm_now_ns()};
  ckpt_begin(&k, &call);
  ckpt_call_t got[CKPT_RECENT];
  cr_assert_eq(ckpt_recent(&k, got, CKPT_RECENT), 1);
  cr_assert_eq(got[0].end_ns, 0, "the call is open");
  cr_assert_lt(ckpt_age_ms(&got[0], before), 10u * 1000, "an open call a moment old aged %llu ms",
               (unsigned long long)ckpt_age_ms(&got[0], before));
  ckpt_fini(&k);
}

/* ---- the wait-for picture: no timeout needed ---- */

Test(watch_srv, a_rank_that_leaves_while_the_others_call_is_named_at_once) {
  sink_t s;
  wsrv_t *w = judge(4, &s);
  for (int r = 0; r < 4; r++)
    beat(w, r, (beat_spec_t){.last = 5, .open = 1, .count = 4096, .wait_ms = 300, .waits_for = 2},
         1.0);
  /* rank 2 never began #5: it is in chorus_comm_destroy after #4 */
  beat(w, 2, (beat_spec_t){.last = 4, .count = 4096, .waits_for = -1, .destroying = true}, 1.0);
  wsrv_tick(w, 1.2);
  cr_assert_eq(s.verdicts, 1, "no verdict at once: %s", s.text);
  cr_assert_eq(s.code, CHORUS_ERR_DIVERGED);
  cr_assert_eq(s.culprit, 2, "%s", s.text);
  cr_assert(strstr(s.text, "rank 2 destroyed the communicator after #4"), "%s", s.text);
  wsrv_free(w);
}

/* Ranks that failed (a corrupt message) and then destroyed did not leave:
 * the verdict is their failure, not a divergence. */
Test(watch_srv, a_rank_that_failed_then_destroyed_is_a_failure_not_a_leaver) {
  sink_t s;
  wsrv_t *w = judge(4, &s);
  beat_spec_t b[4];
  for (int r = 0; r < 4; r++) {
    b[r] = (beat_spec_t){.last = 6, .open = 1, .count = 4096, .wait_ms = 300, .waits_for = 2};
    if (r >= 2)
      b[r] = (beat_spec_t){.last = 5,
                           .count = 4096,
                           .waits_for = -1,
                           .failed = CHORUS_ERR_CORRUPT,
                           .destroying = true};
    beat(w, r, b[r], 1.0);
  }
  wsrv_tick(w, 1.2);
  answer_poll(w, 4, b, 1.3);
  wsrv_tick(w, 1.4);
  cr_assert_eq(s.verdicts, 1, "no verdict: %s", s.text);
  cr_assert_eq(s.code, CHORUS_ERR_CORRUPT, "verdict %d: %s", s.code, s.text);
  cr_assert(strstr(s.text, "rank 2 failed: local failure"), "%s", s.text);
  cr_assert(!strstr(s.text, "diverged"), "%s", s.text);
  wsrv_free(w);
}

Test(watch_srv, a_call_after_the_others_left_names_the_caller) {
  sink_t s;
  wsrv_t *w = judge(4, &s);
  for (int r = 0; r < 4; r++)
    beat(w, r, (beat_spec_t){.last = 4, .count = 4096, .waits_for = -1, .destroying = true}, 1.0);
  beat(w, 2, (beat_spec_t){.last = 5, .open = 1, .count = 4096, .wait_ms = 300, .waits_for = 0},
       1.0);
  wsrv_tick(w, 1.2);
  cr_assert_eq(s.verdicts, 1, "no verdict at once: %s", s.text);
  cr_assert_eq(s.code, CHORUS_ERR_DIVERGED);
  cr_assert_eq(s.culprit, 2, "the lowest innocent blamed: %s", s.text);
  cr_assert(strstr(s.text, "rank 2 called #5"), "%s", s.text);
  cr_assert(strstr(s.text, "ranks 0,1,3 destroyed the communicator"), "%s", s.text);
  wsrv_free(w);
}

Test(watch_srv, a_leaver_waits_for_the_undecided_when_they_could_tip_it) {
  sink_t s;
  wsrv_t *w = judge(4, &s);
  /* ranks 0,1 in #5, rank 2 left after #4, rank 3 not yet at #5: 2 against 1 + 1 */
  for (int r = 0; r < 2; r++)
    beat(w, r, (beat_spec_t){.last = 5, .open = 1, .count = 4096, .wait_ms = 300, .waits_for = 2},
         1.0);
  beat(w, 2, (beat_spec_t){.last = 4, .count = 4096, .waits_for = -1, .destroying = true}, 1.0);
  beat(w, 3, (beat_spec_t){.last = 4, .count = 4096, .waits_for = -1}, 1.0);
  wsrv_tick(w, 1.2);
  cr_assert_eq(s.verdicts, 0, "%s", s.text);
  /* rank 3 calls #5: 3 against 1 */
  beat(w, 3, (beat_spec_t){.last = 5, .open = 1, .count = 4096, .wait_ms = 10, .waits_for = 2},
       1.4);
  wsrv_tick(w, 1.4);
  cr_assert_eq(s.verdicts, 1);
  cr_assert_eq(s.culprit, 2, "%s", s.text);
  wsrv_free(w);
}

Test(watch_srv, a_cycle_of_receives_is_a_deadlock_at_once) {
  sink_t s;
  wsrv_t *w = judge(4, &s);
  for (int r = 0; r < 2; r++)
    beat(w, r,
         (beat_spec_t){.last = 5,
                       .open = 1,
                       .count = 4096,
                       .wait_ms = 500,
                       .waits_for = 2,
                       .blocked_ms = 500,
                       .blocked_seq = 5},
         1.0);
  beat(w, 2,
       (beat_spec_t){
           .last = 4, .count = 4096, .waits_for = -1, .blocked_ms = 300, .blocked_peer = 3},
       1.0);
  beat(w, 3,
       (beat_spec_t){
           .last = 4, .count = 4096, .waits_for = -1, .blocked_ms = 300, .blocked_peer = 2},
       1.0);
  wsrv_tick(w, 1.1);
  cr_assert_eq(s.verdicts, 1, "no verdict at once");
  cr_assert_eq(s.code, CHORUS_ERR_DIVERGED);
  cr_assert(strstr(s.text, "deadlock: rank 2 waits in recv from rank 3, rank 3 waits in recv "
                           "from rank 2"),
            "%s", s.text);
  cr_assert(strstr(s.text, "ranks 0,1 wait in #5"), "%s", s.text);
  wsrv_free(w);
}

Test(watch_srv, a_receive_against_a_collective_is_a_deadlock) {
  sink_t s;
  wsrv_t *w = judge(4, &s);
  for (int r = 0; r < 4; r++)
    beat(w, r,
         (beat_spec_t){.last = 5,
                       .open = 1,
                       .count = 4096,
                       .wait_ms = 500,
                       .waits_for = 2,
                       .blocked_ms = 500,
                       .blocked_seq = 5},
         1.0);
  beat(w, 2,
       (beat_spec_t){
           .last = 4, .count = 4096, .waits_for = -1, .blocked_ms = 300, .blocked_peer = 0},
       1.0);
  wsrv_tick(w, 1.1);
  cr_assert_eq(s.verdicts, 1, "no verdict at once");
  cr_assert(strstr(s.text, "rank 2 waits in recv from rank 0"), "%s", s.text);
  cr_assert(strstr(s.text, "rank 0 waits in #5 allreduce"), "%s", s.text);
  cr_assert(strstr(s.text, "which rank 2 has not called"), "%s", s.text);
  wsrv_free(w);
}

Test(watch_srv, receives_in_turn_are_no_deadlock) {
  sink_t s;
  wsrv_t *w = judge(2, &s);
  /* a ping-pong with slow turns: rank 0 waited from 0.5 to its beat at 1.0,
   * rank 1 from 1.5 to its beat at 2.0: never both at once */
  beat(w, 0,
       (beat_spec_t){
           .last = 4, .count = 4096, .waits_for = -1, .blocked_ms = 500, .blocked_peer = 1},
       1.0);
  beat(w, 1,
       (beat_spec_t){
           .last = 4, .count = 4096, .waits_for = -1, .blocked_ms = 500, .blocked_peer = 0},
       2.0);
  wsrv_tick(w, 2.0);
  cr_assert_eq(s.verdicts, 0, "%s", s.text);
  /* and a short wait is no wait */
  beat(
      w, 0,
      (beat_spec_t){.last = 4, .count = 4096, .waits_for = -1, .blocked_ms = 50, .blocked_peer = 1},
      2.0);
  beat(
      w, 1,
      (beat_spec_t){.last = 4, .count = 4096, .waits_for = -1, .blocked_ms = 50, .blocked_peer = 0},
      2.0);
  wsrv_tick(w, 2.0);
  cr_assert_eq(s.verdicts, 0, "%s", s.text);
  wsrv_free(w);
}
