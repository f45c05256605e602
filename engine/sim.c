/*
 * sim.c - the reference plan interpreter (see sim.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reduce.h"
#include "sim.h"

typedef struct {
  uint64_t key; /* 0 = empty */
  uint32_t rank, step;
  bool is_send;
} slot_t;

typedef struct {
  slot_t *t;
  size_t cap, n;
} table_t;

typedef struct {
  uint32_t rank, step;
} item_t;

/* deps[r][i] counts down to 0 (ready), then: */
#define POSTED (UINT32_MAX - 1) /* a send or receive waiting for its match */
#define DONE UINT32_MAX

typedef struct {
  plan_t *const *plans;
  const sim_buf_t *bufs;
  int nranks;
  uint32_t **deps; /* per rank, per step: dependencies left */
  uint8_t **scratch;
  item_t *q; /* FIFO of ready steps */
  size_t qcap, qhead, qtail;
  table_t msgs;
  sim_stats_t st;
  char *err;
  size_t errlen;
} sim_t;

static int fail(sim_t *s, int rc, const char *fmt, ...) {
  if (s->err && s->errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, s->errlen, fmt, ap);
    va_end(ap);
  }
  return rc;
}

/* key: 1 | src 19 | dst 20 | msg 24; ranks < 2^19 */
static uint64_t msg_key(uint32_t src, uint32_t dst, uint32_t msg) {
  return (1ull << 63) | ((uint64_t)src << 44) | ((uint64_t)dst << 24) | (msg & 0xffffffu);
}

static size_t hash(uint64_t k, size_t cap) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return (size_t)k & (cap - 1);
}

static int table_grow(table_t *t) {
  size_t ncap = t->cap ? t->cap * 2 : 1024;
  slot_t *n = calloc(ncap, sizeof(*n));
  if (!n)
    return -ENOMEM;
  for (size_t i = 0; i < t->cap; i++) {
    if (!t->t[i].key)
      continue;
    size_t h = hash(t->t[i].key, ncap);
    while (n[h].key)
      h = (h + 1) & (ncap - 1);
    n[h] = t->t[i];
  }
  free(t->t);
  t->t = n;
  t->cap = ncap;
  return 0;
}

static slot_t *table_find(table_t *t, uint64_t key) {
  if (!t->cap)
    return NULL;
  for (size_t h = hash(key, t->cap);; h = (h + 1) & (t->cap - 1)) {
    if (!t->t[h].key)
      return NULL;
    if (t->t[h].key == key)
      return &t->t[h];
  }
}

static int table_put(table_t *t, const slot_t *v) {
  if ((t->n + 1) * 2 > t->cap) {
    int rc = table_grow(t);
    if (rc)
      return rc;
  }
  size_t h = hash(v->key, t->cap);
  while (t->t[h].key)
    h = (h + 1) & (t->cap - 1);
  t->t[h] = *v;
  t->n++;
  return 0;
}

/* linear probing: delete by shifting the rest of the cluster back */
static void table_del(table_t *t, slot_t *s) {
  size_t i = (size_t)(s - t->t);
  t->t[i].key = 0;
  t->n--;
  for (size_t j = (i + 1) & (t->cap - 1); t->t[j].key; j = (j + 1) & (t->cap - 1)) {
    size_t h = hash(t->t[j].key, t->cap);
    /* can the entry at j move to the hole at i? (h not in (i, j]) */
    if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
      t->t[i] = t->t[j];
      t->t[j].key = 0;
      i = j;
    }
  }
}

static int push(sim_t *s, uint32_t rank, uint32_t step) {
  if (s->qtail == s->qcap) {
    if (s->qhead > s->qcap / 2) {
      memmove(s->q, s->q + s->qhead, (s->qtail - s->qhead) * sizeof(*s->q));
      s->qtail -= s->qhead;
      s->qhead = 0;
    } else {
      size_t ncap = s->qcap ? s->qcap * 2 : 4096;
      item_t *n = realloc(s->q, ncap * sizeof(*n));
      if (!n)
        return -ENOMEM;
      s->q = n;
      s->qcap = ncap;
    }
  }
  s->q[s->qtail++] = (item_t){rank, step};
  return 0;
}

/* Resolve a reference of `bytes` to memory, checking bounds. NULL with *rc
 * set on error; NULL with *rc == 0 when running without data. */
static uint8_t *ref(sim_t *s, uint32_t rank, uint32_t step, plan_ref_t r, size_t bytes, int *rc) {
  const plan_t *p = s->plans[rank];
  uint8_t *base;
  size_t size;

  *rc = 0;
  if (!s->bufs)
    return NULL;
  switch (r.buf) {
  case BUF_SEND:
    base = (uint8_t *)s->bufs[rank].send;
    size = s->bufs[rank].send_bytes;
    break;
  case BUF_RECV:
    base = s->bufs[rank].recv;
    size = s->bufs[rank].recv_bytes;
    break;
  case BUF_SCRATCH:
    base = s->scratch[rank];
    size = p->scratch_bytes;
    break;
  default:
    *rc = fail(s, -EINVAL, "rank %u step %u: unknown buffer %u", rank, step, r.buf);
    return NULL;
  }
  if (r.off > size || bytes > size - r.off || (!base && bytes)) {
    *rc = fail(s, -EFAULT, "rank %u step %u (%s): %s buffer [%zu, %zu) outside its %zu bytes", rank,
               step, plan_step_kind_str(p->steps[step].kind), plan_buf_str(r.buf), r.off,
               r.off + bytes, size);
    return NULL;
  }
  return base + r.off;
}

static int finish(sim_t *s, uint32_t rank, uint32_t step) {
  const plan_t *p = s->plans[rank];
  const plan_step_t *ps = &p->steps[step];

  s->st.steps++;
  s->deps[rank][step] = DONE;
  for (uint32_t k = 0; k < ps->nsucc; k++) {
    uint32_t j = p->succ[ps->succ_off + k];
    if (--s->deps[rank][j] == 0) {
      int rc = push(s, rank, j);
      if (rc)
        return rc;
    }
  }
  return 0;
}

static int run_local(sim_t *s, uint32_t rank, uint32_t step) {
  const plan_t *p = s->plans[rank];
  const plan_step_t *ps = &p->steps[step];
  size_t es = chorus_dtype_size(p->dtype);
  int rc = 0;
  uint8_t *d, *a, *b;

  switch (ps->kind) {
  case STEP_REDUCE:
    if (!es || ps->bytes % es)
      return fail(s, -EINVAL, "rank %u step %u: REDUCE of %zu bytes, not whole elements", rank,
                  step, ps->bytes);
    d = ref(s, rank, step, ps->dst, ps->bytes, &rc);
    if (!rc)
      a = ref(s, rank, step, ps->src, ps->bytes, &rc);
    if (!rc)
      b = ref(s, rank, step, ps->src2, ps->bytes, &rc);
    if (rc)
      return rc;
    if (d)
      reduce_apply(d, a, b, ps->bytes / es, p->dtype, p->op);
    break;
  case STEP_COPY:
    d = ref(s, rank, step, ps->dst, ps->bytes, &rc);
    if (!rc)
      a = ref(s, rank, step, ps->src, ps->bytes, &rc);
    if (rc)
      return rc;
    if (d && d != a)
      memmove(d, a, ps->bytes);
    break;
  case STEP_SCALE:
    if (!es || ps->bytes % es)
      return fail(s, -EINVAL, "rank %u step %u: SCALE of %zu bytes, not whole elements", rank, step,
                  ps->bytes);
    d = ref(s, rank, step, ps->dst, ps->bytes, &rc);
    if (rc)
      return rc;
    if (d)
      reduce_scale_avg(d, ps->bytes / es, p->dtype, p->nranks);
    break;
  default:
    return fail(s, -EINVAL, "rank %u step %u: unknown kind %u", rank, step, ps->kind);
  }
  return finish(s, rank, step);
}

static int run_comm(sim_t *s, uint32_t rank, uint32_t step) {
  const plan_step_t *ps = &s->plans[rank]->steps[step];
  bool is_send = ps->kind == STEP_SEND;
  int rc;

  if (ps->peer < 0 || ps->peer >= s->nranks || ps->peer == (int)rank)
    return fail(s, -EINVAL, "rank %u step %u: %s with peer %d of %d ranks", rank, step,
                plan_step_kind_str(ps->kind), ps->peer, s->nranks);
  uint32_t src = is_send ? rank : (uint32_t)ps->peer, dst = is_send ? (uint32_t)ps->peer : rank;
  uint64_t key = msg_key(src, dst, ps->msg);
  slot_t *o = table_find(&s->msgs, key);
  if (!o) {
    s->deps[rank][step] = POSTED;
    return table_put(&s->msgs, &(slot_t){key, rank, step, is_send});
  }
  if (o->is_send == is_send)
    return fail(s, -EPROTO, "rank %u: message %u %s rank %u is %s twice (steps %u and %u)", rank,
                ps->msg, is_send ? "to" : "from", ps->peer, is_send ? "sent" : "received", o->step,
                step);
  uint32_t orank = o->rank, ostep = o->step;
  table_del(&s->msgs, o);
  const plan_step_t *os = &s->plans[orank]->steps[ostep];
  const plan_step_t *snd = is_send ? ps : os, *rcv = is_send ? os : ps;
  if (snd->bytes != rcv->bytes)
    return fail(s, -EPROTO, "message %u from rank %u to rank %u: sent %zu bytes, received %zu",
                ps->msg, src, dst, snd->bytes, rcv->bytes);
  uint8_t *from = ref(s, src, is_send ? step : ostep, snd->src, snd->bytes, &rc);
  if (rc)
    return rc;
  uint8_t *to = ref(s, dst, is_send ? ostep : step, rcv->dst, rcv->bytes, &rc);
  if (rc)
    return rc;
  if (to && snd->bytes)
    memmove(to, from, snd->bytes);
  s->st.messages++;
  s->st.bytes += snd->bytes;
  if ((rc = finish(s, rank, step)))
    return rc;
  return finish(s, orank, ostep);
}

static int explain_stuck(sim_t *s) {
  for (size_t h = 0; h < s->msgs.cap; h++) {
    const slot_t *o = &s->msgs.t[h];
    if (!o->key)
      continue;
    const plan_step_t *ps = &s->plans[o->rank]->steps[o->step];
    return fail(s, -EDEADLK,
                "stuck: rank %u step %u (%s of message %u %s rank %d, %zu bytes) is never matched",
                o->rank, o->step, plan_step_kind_str(ps->kind), ps->msg, o->is_send ? "to" : "from",
                ps->peer, ps->bytes);
  }
  for (int r = 0; r < s->nranks; r++)
    for (uint32_t i = 0; i < s->plans[r]->nsteps; i++)
      if (s->deps[r][i] != DONE)
        return fail(s, -EDEADLK, "stuck: rank %d step %u (%s) waits for %u steps that never finish",
                    r, i, plan_step_kind_str(s->plans[r]->steps[i].kind), s->deps[r][i]);
  return fail(s, -EDEADLK, "stuck");
}

int sim_exec(plan_t *const *plans, int nranks, const sim_buf_t *bufs, sim_stats_t *stats, char *err,
             size_t errlen) {
  sim_t s = {.plans = plans, .bufs = bufs, .nranks = nranks, .err = err, .errlen = errlen};
  int rc = 0;

  if (err && errlen)
    err[0] = 0;
  if (nranks <= 0 || !plans || nranks >= (1 << 19))
    return fail(&s, -EINVAL, "sim_exec: %d ranks", nranks);
  s.deps = calloc((size_t)nranks, sizeof(*s.deps));
  s.scratch = calloc((size_t)nranks, sizeof(*s.scratch));
  if (!s.deps || !s.scratch) {
    rc = -ENOMEM;
    goto out;
  }
  for (int r = 0; r < nranks; r++) {
    const plan_t *p = plans[r];
    if (!p || p->rank != r || p->nranks != nranks) {
      rc = fail(&s, -EINVAL, "rank %d: plan %s", r, !p ? "missing" : "is for another rank/size");
      goto out;
    }
    s.deps[r] = malloc(((size_t)p->nsteps + 1) * sizeof(uint32_t));
    if (!s.deps[r] || (bufs && p->scratch_bytes && !(s.scratch[r] = calloc(1, p->scratch_bytes)))) {
      rc = -ENOMEM;
      goto out;
    }
    for (uint32_t i = 0; i < p->nsteps; i++)
      if ((s.deps[r][i] = p->steps[i].ndeps) == 0 && (rc = push(&s, (uint32_t)r, i)))
        goto out;
  }
  while (s.qhead < s.qtail) {
    item_t it = s.q[s.qhead++];
    const plan_step_t *ps = &plans[it.rank]->steps[it.step];
    rc = (ps->kind == STEP_SEND || ps->kind == STEP_RECV) ? run_comm(&s, it.rank, it.step)
                                                          : run_local(&s, it.rank, it.step);
    if (rc)
      goto out;
  }
  for (int r = 0; r < nranks && !rc; r++)
    for (uint32_t i = 0; i < plans[r]->nsteps; i++)
      if (s.deps[r][i] != DONE) {
        rc = explain_stuck(&s);
        break;
      }
out:
  if (rc == -ENOMEM)
    fail(&s, rc, "sim_exec: out of memory");
  if (stats)
    *stats = s.st;
  if (s.deps)
    for (int r = 0; r < nranks; r++)
      free(s.deps[r]);
  if (s.scratch)
    for (int r = 0; r < nranks; r++)
      free(s.scratch[r]);
  free(s.deps);
  free(s.scratch);
  free(s.q);
  free(s.msgs.t);
  return rc;
}
