/*
 * watch_srv.c - the watchdog's judge (watch_srv.h).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algos/algos.h"
#include "chorus.h"
#include "ckpt.h"
#include "eng.h"
#include "watch_srv.h"

#define WS_CALLS 16
#define WS_POLL_S 1.0 /* how long a poll waits for the ranks' fresh beats */

typedef struct wcall {
  uint64_t seq, fp, count, age_ms;
  int kind, dtype, op, root; /* engine values, -1: unknown */
  char algo[16];
  bool done;
} wcall_t;

/* A sub-communicator a rank is in, as of its last beat (Beat.subs). */
typedef struct wsub {
  uint64_t id;
  int n;
  int *members; /* ranks of this (the judge's) communicator */
  uint64_t last_begun, blocked_seq;
  double blocked_at; /* 0: the rank waits in nothing there */
  int blocked_peer;  /* a rank of the judge's communicator; -1: none */
  bool blocked_recv;
  char call[128];
} wsub_t;

#define WS_SUBS 8

typedef struct wrank {
  bool joined, bye, lost, have_beat, replied;
  double last_heard, beat_at;
  char lost_why[256];
  uint64_t last_begun, last_finished, wait_ms, quiet_ms;
  int waits_for, failed;
  bool destroying;
  /* what the application waits in (Beat.blocked_*): since blocked_at (the
   * judge's clock; 0: nothing), in collective #blocked_seq, or in a send or
   * receive (blocked_seq 0) with blocked_peer */
  double blocked_at;
  uint64_t blocked_seq;
  int blocked_peer;
  bool blocked_recv;
  char where[192], failure[512], stalled[128];
  wcall_t calls[WS_CALLS];
  int ncalls;
  /* sub-communicators; bsub: the one it waits in, set only when it waits
   * in nothing of this communicator (blocked_seq 0, blocked_peer -1) */
  wsub_t subs[WS_SUBS];
  int nsubs, bsub;
} wrank_t;

struct wsrv {
  wsrv_config_t cfg;
  wrank_t *r;
  double start;
  bool decided, polled, polling;
  double poll_until;
  int code, culprit;
};

wsrv_t *wsrv_new(const wsrv_config_t *cfg, double now) {
  wsrv_t *w = calloc(1, sizeof(*w));
  if (!w)
    return NULL;
  w->cfg = *cfg;
  w->r = calloc((size_t)cfg->size, sizeof(*w->r));
  if (!w->r) {
    free(w);
    return NULL;
  }
  for (int i = 0; i < cfg->size; i++) {
    w->r[i].waits_for = -1;
    w->r[i].blocked_peer = -1;
    w->r[i].last_heard = now;
  }
  w->start = now;
  w->culprit = -1;
  return w;
}

void wsrv_free(wsrv_t *w) {
  if (!w)
    return;
  for (int i = 0; i < w->cfg.size; i++)
    for (int k = 0; k < WS_SUBS; k++)
      free(w->r[i].subs[k].members);
  free(w->r);
  free(w);
}

bool wsrv_decided(const wsrv_t *w, int *code, int *culprit) {
  if (code)
    *code = w->code;
  if (culprit)
    *culprit = w->culprit;
  return w->decided;
}

/* ---- text ---- */

static void ranks_str(char *buf, size_t len, const int *v, int n) {
  size_t off = (size_t)snprintf(buf, len, n == 1 ? "rank " : "ranks ");
  for (int i = 0; i < n && off < len; i++) {
    char item[16];
    if (off + 32 >= len) {
      snprintf(item, sizeof(item), "%d", n);
      snprintf(buf + off, len - off, ",... (%.12s in all)", item);
      return;
    }
    snprintf(item, sizeof(item), "%s%d", i ? "," : "", v[i]);
    off += (size_t)snprintf(buf + off, len - off, "%.15s", item);
  }
}

static void call_str(const wcall_t *c, char *buf, size_t len) {
  fp_format(c->fp, buf, len);
  if (!c->fp && c->algo[0])
    snprintf(buf, len, "%s (%s)", c->kind >= 0 ? coll_kind_str(c->kind) : "?", c->algo);
}

/* ---- beats ---- */

static const wcall_t *call_at(const wrank_t *r, uint64_t seq) {
  for (int i = 0; i < r->ncalls; i++)
    if (r->calls[i].seq == seq)
      return &r->calls[i];
  return NULL;
}

static const wcall_t *open_call(const wrank_t *r) {
  for (int i = 0; i < r->ncalls; i++)
    if (!r->calls[i].done)
      return &r->calls[i];
  return NULL;
}

static bool live(const wrank_t *r) {
  return !r->lost && !r->bye;
}

static void evaluate(wsrv_t *w, double now);

void wsrv_join(wsrv_t *w, int rank, double now) {
  if (rank < 0 || rank >= w->cfg.size)
    return;
  w->r[rank].joined = true;
  w->r[rank].last_heard = now;
}

void wsrv_beat(wsrv_t *w, int rank, const Chorus__Boot__Beat *b, double now) {
  if (rank < 0 || rank >= w->cfg.size)
    return;
  wrank_t *r = &w->r[rank];
  r->have_beat = true;
  r->last_heard = r->beat_at = now;
  r->last_begun = b->last_begun;
  r->last_finished = b->last_finished;
  r->wait_ms = b->wait_ms;
  r->quiet_ms = b->quiet_ms;
  r->waits_for = b->waits_for >= 0 && b->waits_for < w->cfg.size ? b->waits_for : -1;
  bool was_destroying = r->destroying;
  r->destroying = b->destroying;
  r->failed = b->failed;
  r->blocked_at = b->blocked_ms ? now - (double)b->blocked_ms / 1000.0 : 0;
  r->blocked_seq = b->blocked_seq;
  r->blocked_peer = b->blocked_peer >= 0 && b->blocked_peer < w->cfg.size && !b->blocked_seq
                        ? b->blocked_peer
                        : -1;
  r->blocked_recv = b->blocked_recv;
  snprintf(r->where, sizeof(r->where), "%s", b->where ? b->where : "");
  snprintf(r->failure, sizeof(r->failure), "%s", b->failure ? b->failure : "");
  snprintf(r->stalled, sizeof(r->stalled), "%s", b->stalled ? b->stalled : "");
  r->ncalls = 0;
  size_t first = b->n_calls > WS_CALLS ? b->n_calls - WS_CALLS : 0;
  for (size_t i = first; i < b->n_calls; i++) {
    const Chorus__Boot__WatchCall *c = b->calls[i];
    wcall_t *o = &r->calls[r->ncalls++];
    o->seq = c->seq;
    o->fp = c->fp;
    o->count = c->count;
    o->age_ms = c->age_ms;
    o->kind = (int)c->kind - 1;
    o->dtype = (int)c->dtype - 1;
    o->op = (int)c->op - 1;
    o->root = c->root;
    o->done = c->done;
    snprintf(o->algo, sizeof(o->algo), "%s", c->algo ? c->algo : "");
  }
  /* sub-communicators: the wait in one counts where the rank waits in
   * nothing of this communicator */
  r->nsubs = 0;
  r->bsub = -1;
  for (size_t i = 0; i < b->n_subs && r->nsubs < WS_SUBS; i++) {
    const Chorus__Boot__SubState *bs = b->subs[i];
    wsub_t *o = &r->subs[r->nsubs];
    int *m = realloc(o->members, (bs->n_members ? bs->n_members : 1) * sizeof(int));
    if (!m)
      break;
    o->members = m;
    o->n = 0;
    for (size_t k = 0; k < bs->n_members; k++)
      if (bs->members[k] < (uint32_t)w->cfg.size)
        o->members[o->n++] = (int)bs->members[k];
    o->id = bs->id;
    o->last_begun = bs->last_begun;
    o->blocked_at = bs->blocked_ms ? now - (double)bs->blocked_ms / 1000.0 : 0;
    o->blocked_seq = bs->blocked_seq;
    o->blocked_peer = bs->blocked_peer >= 0 && bs->blocked_peer < w->cfg.size && !bs->blocked_seq
                          ? bs->blocked_peer
                          : -1;
    o->blocked_recv = bs->blocked_recv;
    snprintf(o->call, sizeof(o->call), "%s", bs->call ? bs->call : "");
    if (!b->blocked_ms && r->bsub < 0 && o->blocked_at > 0 &&
        (o->blocked_seq || o->blocked_peer >= 0)) {
      r->bsub = r->nsubs;
      r->blocked_at = o->blocked_at;
    }
    r->nsubs++;
  }
  if (b->reply)
    r->replied = true;
  /* a beat only records; the tick judges (O(ranks) a tick, not a beat),
   * unless something happened that must not wait */
  if (b->failed || b->reply || w->polling || (b->destroying && !was_destroying) ||
      (r->blocked_peer >= 0 && (double)b->blocked_ms >= w->cfg.tick_s * 1000.0) ||
      (r->bsub >= 0 && now - r->blocked_at >= w->cfg.tick_s))
    evaluate(w, now);
}

void wsrv_bye(wsrv_t *w, int rank) {
  if (rank >= 0 && rank < w->cfg.size)
    w->r[rank].bye = true;
}

void wsrv_lost(wsrv_t *w, int rank, const char *why, double now) {
  if (rank < 0 || rank >= w->cfg.size || w->r[rank].bye || w->r[rank].lost)
    return;
  w->r[rank].lost = true;
  snprintf(w->r[rank].lost_why, sizeof(w->r[rank].lost_why), "%s", why);
  evaluate(w, now);
}

void wsrv_tick(wsrv_t *w, double now) {
  evaluate(w, now);
}

/* ---- verdicts ---- */

/* One frame (bootstrap.c's framing: a big-endian length, then the
 * envelope) to every rank still listening. */
static void send_live(wsrv_t *w, const Chorus__Boot__Envelope *env) {
  size_t n = chorus__boot__envelope__get_packed_size(env);
  uint8_t *frame = malloc(n + 4);
  if (!frame)
    return;
  frame[0] = (uint8_t)(n >> 24);
  frame[1] = (uint8_t)(n >> 16);
  frame[2] = (uint8_t)(n >> 8);
  frame[3] = (uint8_t)n;
  chorus__boot__envelope__pack(env, frame + 4);
  /* rank 0, this process, last: a verdict reaches the others before it can
   * make this process end (ws_send) */
  for (int k = 1; k <= w->cfg.size; k++) {
    int i = k % w->cfg.size;
    if (w->r[i].joined && live(&w->r[i]))
      w->cfg.send(w->cfg.arg, i, frame, n + 4);
  }
  free(frame);
}

static void verdict(wsrv_t *w, int code, int culprit, uint64_t seq, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void verdict(wsrv_t *w, int code, int culprit, uint64_t seq, const char *fmt, ...) {
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);

  w->decided = true;
  w->code = code;
  w->culprit = culprit;
  eng_log(ENG_ERR, 0, "watchdog", "verdict (%s): %s", chorus_strerror(code), text);

  uint32_t *lost = calloc((size_t)w->cfg.size, sizeof(*lost));
  size_t nlost = 0;
  for (int i = 0; lost && i < w->cfg.size; i++)
    if (w->r[i].lost)
      lost[nlost++] = (uint32_t)i;
  Chorus__Boot__Verdict v = CHORUS__BOOT__VERDICT__INIT;
  v.code = code;
  v.culprit = culprit;
  v.seq = seq;
  v.text = text;
  v.n_lost = nlost;
  v.lost = lost;
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_VERDICT;
  env.verdict = &v;
  send_live(w, &env);
  free(lost);
}

static void poll_all(wsrv_t *w, double now) {
  Chorus__Boot__Poll p = CHORUS__BOOT__POLL__INIT;
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_POLL;
  env.poll = &p;
  for (int i = 0; i < w->cfg.size; i++)
    w->r[i].replied = false;
  send_live(w, &env);
  w->polled = w->polling = true;
  w->poll_until = now + WS_POLL_S;
}

/* "ranks 0,1,3 wait in #42 allreduce(...) (rank 0 in 'RECV ...')" into buf;
 * S 0: the oldest open call of any rank. Returns S. */
static uint64_t waiting_str(const wsrv_t *w, uint64_t S, int except, char *buf, size_t len) {
  int *v = calloc((size_t)w->cfg.size, sizeof(int));
  int n = 0, first = -1;
  const wcall_t *c = NULL;

  buf[0] = '\0';
  if (!v)
    return S;
  if (!S)
    for (int i = 0; i < w->cfg.size; i++) {
      const wcall_t *oc = open_call(&w->r[i]);
      if (oc && live(&w->r[i]) && i != except && (!S || oc->seq < S))
        S = oc->seq;
    }
  for (int i = 0; S && i < w->cfg.size; i++) {
    const wcall_t *ci = call_at(&w->r[i], S);
    if (i == except || !live(&w->r[i]) || !ci || ci->done)
      continue;
    v[n++] = i;
    if (first < 0 || (!w->r[first].where[0] && w->r[i].where[0]))
      first = i, c = ci;
  }
  if (n && c) {
    char rs[256], cs[128];
    ranks_str(rs, sizeof(rs), v, n);
    call_str(c, cs, sizeof(cs));
    const char *verb = n == 1 ? "waits" : "wait";
    if (w->r[first].where[0] && n > 1)
      snprintf(buf, len, "%s %s in #%llu %s (rank %d in '%s')", rs, verb, (unsigned long long)S, cs,
               first, w->r[first].where);
    else if (w->r[first].where[0])
      snprintf(buf, len, "%s %s in #%llu %s (in '%s')", rs, verb, (unsigned long long)S, cs,
               w->r[first].where);
    else
      snprintf(buf, len, "%s %s in #%llu %s", rs, verb, (unsigned long long)S, cs);
  }
  free(v);
  return S;
}

/* Rule 1: lost ranks. Every silent rank is marked before the verdict, so
 * that a host gone at once (its link down) is named whole, and the poll
 * below does not wait for ranks that can not answer. */
static bool check_lost(wsrv_t *w, double now) {
  char wait[768];
  int first = -1, nlost = 0;
  for (int i = 0; i < w->cfg.size; i++) {
    wrank_t *r = &w->r[i];
    /* silence counts from the first heartbeat (creating a communicator
     * may take longer than the peer timeout; a rank that dies meanwhile
     * closes its connections) */
    if (!r->lost && !r->bye && r->have_beat && now - r->last_heard > w->cfg.peer_timeout_s) {
      r->lost = true;
      snprintf(r->lost_why, sizeof(r->lost_why),
               "it sent no heartbeat for %.1f s (frozen, or unreachable)", now - r->last_heard);
    }
    if (!r->lost || r->bye)
      continue;
    if (r->destroying) {
      waiting_str(w, 0, i, wait, sizeof(wait));
      if (!wait[0])
        continue; /* it left as the others will: nobody waits for it */
    }
    if (first < 0)
      first = i;
    nlost++;
  }
  if (first < 0)
    return false;
  if (!w->polled) {
    /* fresh beats first: where the others wait, for the verdict's text */
    poll_all(w, now);
    return true;
  }
  if (w->polling)
    return true;
  wrank_t *r = &w->r[first];
  uint64_t S = waiting_str(w, 0, first, wait, sizeof(wait));
  if (r->destroying) {
    verdict(w, CHORUS_ERR_DIVERGED, first, S,
            "rank %d destroyed the communicator after #%llu and left while %s: rank %d "
            "diverged (it made fewer calls)",
            first, (unsigned long long)r->last_begun, wait, first);
  } else if (nlost == 1) {
    verdict(w, CHORUS_ERR_PEER_LOST, first, S, "rank %d is lost: %s%s%s", first, r->lost_why,
            wait[0] ? "; " : "", wait);
  } else {
    /* "ranks 2,3 are lost: rank 2: why; rank 3: why" */
    char names[256] = "", whys[768] = "";
    size_t nn = 0, nw = 0;
    for (int i = 0; i < w->cfg.size; i++) {
      if (!w->r[i].lost || w->r[i].bye || w->r[i].destroying)
        continue;
      if (nn < sizeof(names))
        nn += (size_t)snprintf(names + nn, sizeof(names) - nn, "%s%d", nn ? "," : "", i);
      if (nw < sizeof(whys))
        nw += (size_t)snprintf(whys + nw, sizeof(whys) - nw, "%srank %d: %s", nw ? "; " : "", i,
                               w->r[i].lost_why);
    }
    verdict(w, CHORUS_ERR_PEER_LOST, first, S, "ranks %s are lost: %s%s%s", names, whys,
            wait[0] ? "; " : "", wait);
  }
  return true;
}

static const char *field_diff(const wcall_t *a, const wcall_t *b, char *buf, size_t len) {
  if (a->kind != b->kind)
    snprintf(buf, len, "another collective");
  else if (a->count != b->count)
    snprintf(buf, len, "count %llu instead of %llu", (unsigned long long)b->count,
             (unsigned long long)a->count);
  else if (a->dtype != b->dtype)
    snprintf(buf, len, "dtype %s instead of %s",
             b->dtype >= 0 ? chorus_dtype_name((chorus_dtype)b->dtype) : "?",
             a->dtype >= 0 ? chorus_dtype_name((chorus_dtype)a->dtype) : "?");
  else if (a->op != b->op)
    snprintf(buf, len, "op %s instead of %s", b->op >= 0 ? chorus_op_name((chorus_op)b->op) : "?",
             a->op >= 0 ? chorus_op_name((chorus_op)a->op) : "?");
  else if (a->root != b->root)
    snprintf(buf, len, "root %d instead of %d", b->root, a->root);
  else if (strcmp(a->algo, b->algo) != 0)
    snprintf(buf, len, "algorithm %s instead of %s (set CHORUS_ALGO alike on every rank)", b->algo,
             a->algo);
  else
    snprintf(buf, len, "fingerprint %016llx instead of %016llx", (unsigned long long)b->fp,
             (unsigned long long)a->fp);
  return buf;
}

/* The lowest seq at which two ranks' calls differ, or UINT64_MAX. */
static uint64_t conflict_seq(const wsrv_t *w) {
  /* O(ranks x calls): the first fingerprint seen per seq, in a small open
   * addressing table (every rank's recent calls span few distinct seqs
   * while the job is healthy; a full table only shortens the search) */
  enum { TAB = 1024 };
  struct {
    uint64_t seq, fp;
  } tab[TAB];
  uint64_t S = UINT64_MAX;
  int used = 0;

  memset(tab, 0, sizeof(tab));
  for (int a = 0; a < w->cfg.size; a++) {
    if (!w->r[a].have_beat || w->r[a].lost)
      continue;
    for (int k = 0; k < w->r[a].ncalls; k++) {
      const wcall_t *ca = &w->r[a].calls[k];
      if (!ca->seq || ca->seq >= S)
        continue;
      size_t h = (size_t)(ca->seq * 0x9e3779b97f4a7c15ull >> 54) % TAB;
      while (tab[h].seq && tab[h].seq != ca->seq)
        h = (h + 1) % TAB;
      if (tab[h].seq == ca->seq) {
        if (tab[h].fp != ca->fp)
          S = ca->seq;
      } else if (used < TAB / 2) {
        tab[h].seq = ca->seq;
        tab[h].fp = ca->fp;
        used++;
      }
    }
  }
  return S;
}

static bool has_conflict(const wsrv_t *w) {
  return conflict_seq(w) != UINT64_MAX;
}

/* Rule 2: calls at one seq differ. */
static bool check_conflict(wsrv_t *w) {
  const int n = w->cfg.size;
  uint64_t S = conflict_seq(w);
  if (S == UINT64_MAX)
    return false;
  for (int i = 0; i < n && eng_log_level >= ENG_DEBUG; i++) {
    const wcall_t *ci = call_at(&w->r[i], S);
    eng_log(ENG_DEBUG, 0, "watchdog", "rank %d: beat %s, last begun #%llu, call #%llu %s", i,
            w->r[i].have_beat ? "yes" : "no", (unsigned long long)w->r[i].last_begun,
            (unsigned long long)S, ci ? "present" : "absent");
  }

  /* the largest group of agreeing ranks (ties: the one with the lowest rank):
   * groups by fingerprint, made in rank order */
  const size_t nz = n > 0 ? (size_t)n : 1;
  int *votes = calloc(nz, sizeof(int)); /* per group */
  uint64_t *gfp = calloc(nz, sizeof(uint64_t));
  int *gfirst = calloc(nz, sizeof(int));
  int *bad = calloc(nz, sizeof(int));
  int *good = calloc(nz, sizeof(int));
  if (!votes || !gfp || !gfirst || !bad || !good) {
    free(votes);
    free(gfp);
    free(gfirst);
    free(bad);
    free(good);
    return false;
  }
  int ngroups = 0, bestg = -1;
  for (int a = 0; a < n; a++) {
    const wcall_t *ca = w->r[a].have_beat && !w->r[a].lost ? call_at(&w->r[a], S) : NULL;
    if (!ca)
      continue;
    int g = 0;
    while (g < ngroups && gfp[g] != ca->fp)
      g++;
    if (g == ngroups) {
      gfp[g] = ca->fp;
      gfirst[g] = a;
      ngroups++;
    }
    votes[g]++;
  }
  for (int g = 0; g < ngroups; g++)
    if (bestg < 0 || votes[g] > votes[bestg])
      bestg = g;
  int best = gfirst[bestg];
  free(gfp);
  free(gfirst);
  const wcall_t *ref = call_at(&w->r[best], S);
  int nbad = 0, ngood = 0;
  bool diverged = false;
  for (int a = 0; a < n; a++) {
    const wcall_t *ca = w->r[a].have_beat && !w->r[a].lost ? call_at(&w->r[a], S) : NULL;
    if (!ca)
      continue;
    if (ca->fp == ref->fp) {
      good[ngood++] = a;
    } else {
      bad[nbad++] = a;
      diverged |= ca->kind != ref->kind;
    }
  }
  const wcall_t *other = call_at(&w->r[bad[0]], S);
  char gs[256], bs[256], rc[128], oc[128], diff[160];
  ranks_str(gs, sizeof(gs), good, ngood);
  ranks_str(bs, sizeof(bs), bad, nbad);
  call_str(ref, rc, sizeof(rc));
  call_str(other, oc, sizeof(oc));
  if (diverged)
    verdict(w, CHORUS_ERR_DIVERGED, bad[0], S,
            "collective #%llu: %s called %s but %s called %s: rank %d diverged (its sequence of "
            "calls differs from the others': a skipped or an extra call)",
            (unsigned long long)S, gs, rc, bs, oc, bad[0]);
  else
    verdict(w, CHORUS_ERR_MISMATCH, bad[0], S,
            "collective #%llu: %s called %s but %s called %s (%s): rank %d's call does not match",
            (unsigned long long)S, gs, rc, bs, oc, field_diff(ref, other, diff, sizeof(diff)),
            bad[0]);
  free(votes);
  free(bad);
  free(good);
  return true;
}

/* ---- the wait-for picture ----
 *
 * Rules 3 and 4 need no timeout: what they find can not resolve itself.
 *
 * Endings. A rank in chorus_comm_destroy (or gone with goodbye) makes no
 * more calls: its last one begun is final. A call #S that some rank began
 * and an ended rank never began can not complete. Which side is wrong is
 * the side with fewer ranks: the ended ones (they left early) or the
 * callers (an extra call after the others left). It is judged at once
 * when the ranks not yet decided (neither in #S nor ended) can not change
 * the majority; else at the timeout, by the majority of the decided.
 *
 *                ranks 0,1,3 began #S        rank 2 began #S
 *   ended before #S:   rank 2               ranks 0,1,3
 *   culprit:           rank 2 (left)        rank 2 (extra call)
 *
 * Waits. An edge X -> Y says X can not go on until Y does something:
 *   X blocked in a receive from Y, or a send to Y;
 *   X blocked in collective #n, which Y has not begun (Y live, not ended).
 * A rank is blocked when the application waits in the call (a blocking
 * call, chorus_wait) for a watchdog period or more. A cycle of such edges
 * is a deadlock, whatever the communicator does meanwhile, when its ranks
 * were blocked at once for a period: each beat says since when a rank
 * waits, and the newest beginning must precede the oldest beat by a
 * period (ranks that wait in turn, as a ping-pong does, never qualify).
 */

typedef struct ends {
  uint64_t S;          /* the call concerned */
  int *ended, *called; /* ranks, in order */
  int nended, ncalled, nundecided;
} ends_t;

static bool ended(const wrank_t *r) {
  return r->have_beat && !r->lost && r->destroying;
}

/* The lowest call begun by some rank and never begun by an ended one. */
static bool find_ends(const wsrv_t *w, ends_t *e) {
  const int n = w->cfg.size;
  uint64_t S = 0;
  for (int i = 0; i < n; i++) {
    const wcall_t *oc = live(&w->r[i]) ? open_call(&w->r[i]) : NULL;
    if (oc && (!S || oc->seq < S))
      S = oc->seq;
  }
  if (!S)
    return false;
  e->S = S;
  e->nended = e->ncalled = e->nundecided = 0;
  for (int i = 0; i < n; i++) {
    const wrank_t *r = &w->r[i];
    if (r->lost)
      continue;
    if (!r->have_beat)
      e->nundecided++;
    else if (r->last_begun >= S)
      e->called[e->ncalled++] = i;
    else if (ended(r))
      e->ended[e->nended++] = i;
    else
      e->nundecided++;
  }
  return e->nended > 0 && e->ncalled > 0;
}

static bool check_ends(wsrv_t *w, bool at_timeout) {
  const size_t nz = w->cfg.size > 0 ? (size_t)w->cfg.size : 1;
  ends_t e = {.ended = calloc(nz, sizeof(int)), .called = calloc(nz, sizeof(int))};
  bool judged = false;

  if (!e.ended || !e.called || !find_ends(w, &e))
    goto out_free;
  bool left = e.ncalled > e.nended + e.nundecided;  /* the ended ones left early */
  bool extra = e.nended > e.ncalled + e.nundecided; /* the callers made one call more */
  if (!left && !extra && !at_timeout && e.nundecided)
    goto out_free;
  if (!left && !extra)
    left = e.ncalled >= e.nended; /* the majority of the decided; a tie: those who left */
  char es[256], cs[256], call[128], wait[768];
  ranks_str(es, sizeof(es), e.ended, e.nended);
  ranks_str(cs, sizeof(cs), e.called, e.ncalled);
  const wrank_t *c0 = &w->r[e.called[0]], *e0 = &w->r[e.ended[0]];
  const wcall_t *sc = call_at(c0, e.S);
  if (sc)
    call_str(sc, call, sizeof(call));
  else
    snprintf(call, sizeof(call), "(a call)");
  if (left) {
    waiting_str(w, e.S, -1, wait, sizeof(wait));
    verdict(w, CHORUS_ERR_DIVERGED, e.ended[0], e.S,
            "%s%s%s destroyed the communicator after #%llu and will never call #%llu %s, which "
            "%s began: %s diverged (it made fewer calls: it left)",
            wait[0] ? wait : "", wait[0] ? "; " : "", es, (unsigned long long)e0->last_begun,
            (unsigned long long)e.S, call, cs, es);
  } else {
    verdict(w, CHORUS_ERR_DIVERGED, e.called[0], e.S,
            "%s called #%llu %s after %s destroyed the communicator (%s last call: #%llu): %s "
            "diverged (it called after the others left: an extra call)",
            cs, (unsigned long long)e.S, call, es, e.nended == 1 ? "its" : "their",
            (unsigned long long)e0->last_begun, cs);
  }
  judged = true;
out_free:
  free(e.ended);
  free(e.called);
  return judged;
}

/* "rank 0 waits in recv from rank 1" */
static void wait_edge_str(const wsrv_t *w, int x, int y, char *buf, size_t len) {
  const wrank_t *r = &w->r[x];
  if (r->bsub >= 0) {
    const wsub_t *s = &r->subs[r->bsub];
    char rs[128];
    ranks_str(rs, sizeof(rs), s->members, s->n);
    if (s->blocked_seq)
      snprintf(buf, len,
               "rank %d waits in #%llu %s of the sub-communicator of %s, which rank %d has not "
               "called",
               x, (unsigned long long)s->blocked_seq, s->call, rs, y);
    else
      snprintf(buf, len, "rank %d waits in %s rank %d in the sub-communicator of %s", x,
               s->blocked_recv ? "recv from" : "send to", y, rs);
  } else if (r->blocked_seq) {
    const wcall_t *c = call_at(r, r->blocked_seq);
    char cs[128] = "";
    if (c)
      call_str(c, cs, sizeof(cs));
    snprintf(buf, len, "rank %d waits in #%llu %s, which rank %d has not called", x,
             (unsigned long long)r->blocked_seq, cs, y);
  } else {
    snprintf(buf, len, "rank %d waits in %s rank %d", x, r->blocked_recv ? "recv from" : "send to",
             y);
  }
}

/* Blocked for a watchdog period at least, as of its last beat. */
static bool blocked(const wsrv_t *w, const wrank_t *r, double now) {
  (void)now;
  return live(r) && !r->destroying && r->blocked_at > 0 &&
         r->beat_at - r->blocked_at >= w->cfg.tick_s &&
         (r->blocked_seq || r->blocked_peer >= 0 || r->bsub >= 0);
}

static const wsub_t *sub_of(const wrank_t *r, uint64_t id) {
  for (int i = 0; i < r->nsubs; i++)
    if (r->subs[i].id == id)
      return &r->subs[i];
  return NULL;
}

/* The next node x waits for from *k on (advanced past it), -1 past the
 * last: ranks in [0, n), and for a rank blocked in a collective (of this
 * communicator or of a sub-communicator) a node of its own (n + the rank)
 * whose successors are the members that have not begun that collective. */
static int wait_next(const wsrv_t *w, int x, int *k, double now) {
  const int n = w->cfg.size;
  if (x < n) {
    const wrank_t *r = &w->r[x];
    if ((*k)++ || !blocked(w, r, now))
      return -1;
    if (r->bsub >= 0) {
      const wsub_t *s = &r->subs[r->bsub];
      return s->blocked_seq ? n + x : s->blocked_peer;
    }
    return r->blocked_seq ? n + x : r->blocked_peer;
  }
  const wrank_t *xr = &w->r[x - n];
  if (xr->bsub >= 0) {
    /* a collective of a sub-communicator: its members that have not begun it */
    const wsub_t *s = &xr->subs[xr->bsub];
    for (int i = *k; i < s->n; i++) {
      int y = s->members[i];
      const wrank_t *r = &w->r[y];
      const wsub_t *ys = sub_of(r, s->id);
      if (y != x - n && live(r) && r->have_beat && !r->destroying &&
          (!ys || ys->last_begun < s->blocked_seq)) {
        *k = i + 1;
        return y;
      }
    }
    *k = s->n;
    return -1;
  }
  uint64_t seq = xr->blocked_seq;
  for (int y = *k; y < n; y++) {
    const wrank_t *r = &w->r[y];
    if (live(r) && r->have_beat && !r->destroying && r->last_begun < seq) {
      *k = y + 1;
      return y;
    }
  }
  *k = n;
  return -1;
}

/* Rule 4: a cycle of waits (rule 3: check_ends). */
static bool check_deadlock(wsrv_t *w, double now) {
  const int n = w->cfg.size, nn = 2 * n;
  uint8_t *color = calloc(nn > 0 ? (size_t)nn : 1, 1); /* 0 new, 1 on the path, 2 done */
  int *stack = calloc(nn > 0 ? (size_t)nn : 1, sizeof(int));
  int *next = calloc(nn > 0 ? (size_t)nn : 1, sizeof(int));
  bool judged = false;

  if (!color || !stack || !next)
    goto out_free;
  for (int s0 = 0; s0 < n && !judged; s0++) {
    if (color[s0] || !blocked(w, &w->r[s0], now))
      continue;
    int sp = 0;
    stack[sp++] = s0;
    color[s0] = 1;
    next[s0] = 0;
    while (sp && !judged) {
      int x = stack[sp - 1];
      int y = wait_next(w, x, &next[x], now);
      if (y < 0) {
        color[x] = 2;
        sp--;
        continue;
      }
      if (color[y] == 0) {
        color[y] = 1;
        next[y] = 0;
        stack[sp++] = y;
        continue;
      }
      if (color[y] != 1)
        continue;
      /* a cycle: the path from y to the top, then back to y */
      int k = sp - 1;
      while (stack[k] != y)
        k--;
      double since = 0, until = now;
      for (int j = k; j < sp; j++)
        if (stack[j] < n) {
          const wrank_t *r = &w->r[stack[j]];
          since = r->blocked_at > since ? r->blocked_at : since;
          until = r->beat_at < until ? r->beat_at : until;
        }
      if (until - since < w->cfg.tick_s)
        continue; /* not seen blocked together long enough yet */
      char text[1024], edge[256], wait[768];
      size_t off = (size_t)snprintf(text, sizeof(text), "deadlock: ");
      int first = -1;
      for (int j = k; j < sp; j++) {
        int a = stack[j];
        if (a >= n)
          continue;
        /* the rank it waits for: the next on the path, past a collective's
         * node; after the top, y (a rank: a collective's node is reached
         * from its own rank only) */
        int b = j + 1 < sp ? stack[j + 1] : y;
        if (b >= n)
          b = j + 2 < sp ? stack[j + 2] : y;
        if (first < 0)
          first = a;
        wait_edge_str(w, a, b, edge, sizeof(edge));
        if (off < sizeof(text))
          off += (size_t)snprintf(text + off, sizeof(text) - off, "%s%s", a == first ? "" : ", ",
                                  edge);
      }
      uint64_t S = waiting_str(w, 0, -1, wait, sizeof(wait));
      verdict(w, CHORUS_ERR_DIVERGED, -1, S,
              "%s: the ranks' calls do not match (each waits for the next); no single culprit%s%s",
              text, wait[0] ? "; " : "", wait);
      judged = true;
    }
  }
out_free:
  free(color);
  free(stack);
  free(next);
  return judged;
}

/* Rule 6: a call waits past the timeout. */
static bool check_timeout(wsrv_t *w) {
  const int n = w->cfg.size;
  const uint64_t limit_ms = (uint64_t)(w->cfg.timeout_s * 1000.0);
  uint64_t S = 0;
  char wait[768];

  bool late = false;
  for (int i = 0; i < n && !late; i++)
    late = live(&w->r[i]) && open_call(&w->r[i]) && w->r[i].wait_ms >= limit_ms;
  if (!late)
    return false;
  /* the job is held up from its oldest open call on: whoever holds that up */
  for (int i = 0; i < n; i++) {
    const wcall_t *oc = live(&w->r[i]) ? open_call(&w->r[i]) : NULL;
    if (oc && (!S || oc->seq < S))
      S = oc->seq;
  }
  waiting_str(w, S, -1, wait, sizeof(wait));

  /* calls past the others' endings: the majority of the decided */
  if (check_ends(w, true))
    return true;

  /* a stall that was injected says so */
  for (int i = 0; i < n; i++)
    if (live(&w->r[i]) && w->r[i].stalled[0]) {
      verdict(w, CHORUS_ERR_TIMEOUT, i, S, "%s; rank %d is stalled: %s", wait, i, w->r[i].stalled);
      return true;
    }

  /* a rank that has not reached S */
  for (int i = 0; i < n; i++) {
    const wrank_t *r = &w->r[i];
    if (r->lost || !r->have_beat || call_at(r, S) || r->last_begun >= S)
      continue;
    if (r->bye) {
      verdict(w, CHORUS_ERR_DIVERGED, i, S,
              "%s; rank %d destroyed the communicator after #%llu and left without calling "
              "#%llu: rank %d diverged (it made fewer calls)",
              wait, i, (unsigned long long)r->last_begun, (unsigned long long)S, i);
      return true;
    }
    const wcall_t *oc = open_call(r);
    char cs[128];
    if (oc && oc->seq < S) {
      call_str(oc, cs, sizeof(cs));
      verdict(w, CHORUS_ERR_TIMEOUT, i, S,
              "%s; rank %d is still in #%llu %s%s%s%s, which the others finished: rank %d is "
              "stuck",
              wait, i, (unsigned long long)oc->seq, cs, r->where[0] ? " (in '" : "", r->where,
              r->where[0] ? "')" : "", i);
      return true;
    }
    const wcall_t *last = call_at(r, r->last_begun);
    if (last)
      call_str(last, cs, sizeof(cs));
    else
      snprintf(cs, sizeof(cs), "none");
    if (r->destroying)
      verdict(w, CHORUS_ERR_DIVERGED, i, S,
              "%s; rank %d is destroying the communicator after #%llu %s and never called "
              "#%llu: rank %d diverged",
              wait, i, (unsigned long long)r->last_begun, cs, (unsigned long long)S, i);
    else if (r->blocked_at > 0 && r->blocked_peer >= 0)
      /* held up by a send or receive: say which, and whom it waits for */
      verdict(w, CHORUS_ERR_DIVERGED, i, S,
              "%s; rank %d never called #%llu: it waits in %s rank %d (for %.1f s, after its "
              "#%llu %s): rank %d diverged (its send or receive has no match)",
              wait, i, (unsigned long long)S, r->blocked_recv ? "recv from" : "send to",
              r->blocked_peer, r->beat_at - r->blocked_at, (unsigned long long)r->last_begun, cs,
              i);
    else
      verdict(w, CHORUS_ERR_DIVERGED, i, S,
              "%s; rank %d never called #%llu (its last call, #%llu %s, began %.1f s ago): rank "
              "%d diverged (skipped the call, or stalls outside Chorus)",
              wait, i, (unsigned long long)S, (unsigned long long)r->last_begun, cs,
              last ? (double)last->age_ms / 1000.0 : 0.0, i);
    return true;
  }

  /* everyone is in S or past it: a silent progress engine, then the wait-for chain */
  int qmax = -1;
  uint64_t q1 = 0, q2 = 0;
  for (int i = 0; i < n; i++) {
    if (!live(&w->r[i]))
      continue;
    uint64_t q = w->r[i].quiet_ms;
    if (q > q1) {
      q2 = q1;
      q1 = q;
      qmax = i;
    } else if (q > q2) {
      q2 = q;
    }
  }
  uint64_t floor_ms = (uint64_t)(3 * w->cfg.tick_s * 1000.0);
  if (floor_ms < 2000)
    floor_ms = 2000;
  if (qmax >= 0 && q1 > floor_ms && q1 > 4 * q2 + 1000) {
    verdict(w, CHORUS_ERR_TIMEOUT, qmax, S,
            "%s; rank %d's progress engine has not run for %.1f s: rank %d is stalled", wait, qmax,
            (double)q1 / 1000.0, qmax);
    return true;
  }
  bool *seen = calloc(n > 0 ? (size_t)n : 1, sizeof(bool));
  if (!seen)
    return false;
  int x = -1;
  for (int i = 0; i < n && x < 0; i++) {
    const wcall_t *ci = call_at(&w->r[i], S);
    if (live(&w->r[i]) && ci && !ci->done)
      x = i;
  }
  int path[64], np = 0;
  while (x >= 0 && !seen[x]) {
    seen[x] = true;
    if (np < 64)
      path[np++] = x;
    const wcall_t *cx = call_at(&w->r[x], S);
    if (!live(&w->r[x]) || !cx || cx->done || w->r[x].waits_for < 0)
      break;
    x = w->r[x].waits_for;
  }
  if (x >= 0 && seen[x] && np > 1 && path[np - 1] != x) {
    /* a cycle */
    char cyc[256];
    size_t off = 0;
    int k = 0;
    while (k < np && path[k] != x)
      k++;
    for (int j = k; j < np && off < sizeof(cyc); j++)
      off += (size_t)snprintf(cyc + off, sizeof(cyc) - off, "%d -> ", path[j]);
    if (off < sizeof(cyc))
      snprintf(cyc + off, sizeof(cyc) - off, "%d", x);
    verdict(w, CHORUS_ERR_TIMEOUT, -1, S,
            "%s; ranks wait for each other in a cycle (%s): a message was lost or the schedule "
            "deadlocks; no single culprit",
            wait, cyc);
  } else if (x >= 0) {
    const wcall_t *cx = call_at(&w->r[x], S);
    if (cx && cx->done)
      verdict(w, CHORUS_ERR_TIMEOUT, x, S,
              "%s; rank %d finished #%llu but what it sent never arrived: its messages were "
              "lost on the way (rank %d)",
              wait, x, (unsigned long long)S, x);
    else
      verdict(w, CHORUS_ERR_TIMEOUT, x, S,
              "%s; rank %d%s%s%s waits for nobody: rank %d holds the others up", wait, x,
              w->r[x].where[0] ? " (in '" : "", w->r[x].where, w->r[x].where[0] ? "')" : "", x);
  } else {
    verdict(w, CHORUS_ERR_TIMEOUT, -1, S, "%s past the timeout (%.1f s)", wait, w->cfg.timeout_s);
  }
  free(seen);
  return true;
}

static void evaluate(wsrv_t *w, double now) {
  if (w->decided)
    return;
  if (w->polling) {
    bool all = true;
    for (int i = 0; i < w->cfg.size; i++)
      if (w->r[i].joined && live(&w->r[i]) && !w->r[i].replied)
        all = false;
    if (all || now >= w->poll_until)
      w->polling = false;
  }
  if (check_lost(w, now) || w->polling)
    return;
  /* a failure a rank reported: fresh beats first, so the culprit is named */
  int failed = -1;
  for (int i = 0; i < w->cfg.size && failed < 0; i++)
    if (w->r[i].failed && live(&w->r[i]))
      failed = i;
  if (failed >= 0 && !w->polled) {
    poll_all(w, now);
    return;
  }
  if (!w->polled && has_conflict(w)) {
    /* every rank's call at that seq first: the culprit is the odd one out */
    poll_all(w, now);
    return;
  }
  if (check_conflict(w))
    return;
  /* before the endings: a rank that failed (a corrupt message, a lost
   * link) and then destroyed did not leave; its failure is the cause */
  if (failed >= 0) {
    char wait[768];
    uint64_t S = waiting_str(w, 0, failed, wait, sizeof(wait));
    verdict(w, w->r[failed].failed, -1, S, "rank %d failed: %s%s%s", failed, w->r[failed].failure,
            wait[0] ? "; " : "", wait);
    return;
  }
  if (check_ends(w, false) || check_deadlock(w, now))
    return;
  check_timeout(w);
}
