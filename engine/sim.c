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
#include <sys/mman.h>

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

/* ---- compact graphs ---- */

static int efail(char *err, size_t errlen, int rc, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return rc;
}

static bool is_comm(unsigned kind) {
  return kind == STEP_SEND || kind == STEP_RECV;
}

/* The ranks' arrays are carved from large blocks: thousands of ranks'
 * steps sit in a few allocations, on huge pages where the kernel offers
 * them (a traversal hops between ranks; TLB misses dominate otherwise). */
typedef struct arena_block {
  struct arena_block *next;
  size_t used, cap;
} arena_block_t;

#define ARENA_BLOCK (64u << 20)
#define ARENA_ALIGN 64

static void *arena_alloc(sim_graph_t *g, size_t bytes) {
  arena_block_t *b = g->arena;
  bytes = (bytes + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
  if (!b || b->cap - b->used < bytes) {
    size_t cap = bytes + ARENA_ALIGN > ARENA_BLOCK ? bytes + ARENA_ALIGN : ARENA_BLOCK;
    void *mem;
    if (posix_memalign(&mem, 2u << 20, cap))
      return NULL;
#ifdef MADV_HUGEPAGE
    madvise(mem, cap, MADV_HUGEPAGE);
#endif
    b = mem;
    b->next = g->arena;
    b->used = ARENA_ALIGN;
    b->cap = cap;
    g->arena = b;
  }
  void *p = (char *)b + b->used;
  b->used += bytes;
  return p;
}

void sim_graph_free(sim_graph_t *g) {
  if (!g)
    return;
  for (arena_block_t *b = g->arena, *next; b; b = next) {
    next = b->next;
    free(b);
  }
  free(g->ranks);
  free(g);
}

static int graph_alloc(int nranks, sim_graph_t **out) {
  sim_graph_t *g = calloc(1, sizeof(*g));

  *out = NULL;
  if (!g)
    return -ENOMEM;
  g->ranks = calloc((size_t)nranks, sizeof(*g->ranks));
  if (!g->ranks) {
    free(g);
    return -ENOMEM;
  }
  g->nranks = nranks;
  *out = g;
  return 0;
}

/* Copies plan p as rank r of g. On error what was allocated stays in g for
 * sim_graph_free. */
static int graph_add_plan(sim_graph_t *g, int r, const plan_t *p, char *err, size_t errlen) {
  sim_rank_t *gr = &g->ranks[r];
  uint64_t ne = 0;

  if (!p)
    return efail(err, errlen, -EINVAL, "rank %d: no plan", r);
  if (p->rank != r || p->nranks != g->nranks)
    return efail(err, errlen, -EINVAL, "rank %d: plan is for rank %d of %d ranks, not of %d", r,
                 p->rank, p->nranks, g->nranks);
  for (uint32_t i = 0; i < p->nsteps; i++)
    ne += p->steps[i].nsucc;
  if (ne >= UINT32_MAX || p->nsteps >= UINT32_MAX - 3)
    return efail(err, errlen, -E2BIG, "rank %d: %u steps and %" PRIu64 " edges, too many", r,
                 p->nsteps, ne);
  gr->steps = arena_alloc(g, ((size_t)p->nsteps + 1) * sizeof(*gr->steps));
  gr->succ_off = arena_alloc(g, ((size_t)p->nsteps + 1) * sizeof(*gr->succ_off));
  gr->succ = arena_alloc(g, (ne ? ne : 1) * sizeof(*gr->succ));
  if (!gr->steps || !gr->succ_off || !gr->succ)
    return -ENOMEM;
  uint32_t e = 0;
  for (uint32_t i = 0; i < p->nsteps; i++) {
    const plan_step_t *ps = &p->steps[i];
    bool comm = is_comm(ps->kind);
    if (ps->kind >= STEP_KIND_COUNT)
      return efail(err, errlen, -EINVAL, "rank %d step %u: unknown kind %u", r, i, ps->kind);
    if (comm && (ps->peer < 0 || ps->peer >= g->nranks || ps->peer == r))
      return efail(err, errlen, -EINVAL, "rank %d step %u: %s with peer %d of %d ranks", r, i,
                   plan_step_kind_str(ps->kind), ps->peer, g->nranks);
    if (comm && ps->msg >= (1u << 24))
      return efail(err, errlen, -EINVAL, "rank %d step %u: message number %u over 24 bits", r, i,
                   ps->msg);
    gr->steps[i] = (sim_step_t){.bytes = ps->bytes,
                                .peer = comm ? ps->peer : -1,
                                .msg = comm ? ps->msg : 0,
                                .kind = ps->kind,
                                .mate = UINT32_MAX,
                                .deps = 0};
    gr->succ_off[i] = e;
    for (uint32_t k = 0; k < ps->nsucc; k++) {
      uint32_t j = p->succ[ps->succ_off + k];
      if (j >= p->nsteps)
        return efail(err, errlen, -EINVAL, "rank %d step %u: successor %u of %u steps", r, i, j,
                     p->nsteps);
      gr->succ[e++] = j;
    }
    g->nsends += ps->kind == STEP_SEND;
    g->nrecvs += ps->kind == STEP_RECV;
  }
  gr->succ_off[p->nsteps] = e;
  for (uint32_t k = 0; k < e; k++)
    gr->steps[gr->succ[k]].deps++;
  gr->nsteps = p->nsteps;
  gr->nedges = e;
  g->nsteps += p->nsteps;
  g->nedges += e;
  if (p->nsteps > g->max_steps || r == 0) {
    g->max_steps = p->nsteps;
    g->max_steps_rank = r;
  }
  return 0;
}

int sim_graph_from_plans(plan_t *const *plans, int nranks, sim_graph_t **out, char *err,
                         size_t errlen) {
  sim_graph_t *g;
  int rc;

  *out = NULL;
  if (err && errlen)
    err[0] = 0;
  if (!plans || nranks <= 0)
    return efail(err, errlen, -EINVAL, "%d ranks", nranks);
  if ((rc = graph_alloc(nranks, &g)))
    goto out_nomem;
  for (int r = 0; r < nranks; r++)
    if ((rc = graph_add_plan(g, r, plans[r], err, errlen)))
      goto out_free_graph;
  *out = g;
  return 0;

out_free_graph:
  sim_graph_free(g);
out_nomem:
  if (rc == -ENOMEM)
    efail(err, errlen, rc, "out of memory copying %d plans", nranks);
  return rc;
}

int sim_graph_build(const algo_desc_t *d, const algo_args_t *a, sim_graph_t **out, char *err,
                    size_t errlen) {
  const algo_desc_t *snd = NULL, *rcv = NULL;
  int src = -1, dst = -1, rc;
  sim_graph_t *g;

  *out = NULL;
  if (err && errlen)
    err[0] = 0;
  if (!d || !a || a->nranks <= 0)
    return efail(err, errlen, -EINVAL, "no algorithm or %d ranks", a ? a->nranks : 0);
  if (d->coll == COLL_SEND || d->coll == COLL_RECV) {
    if (a->nranks < 2 || a->root < 0 || a->root >= a->nranks)
      return efail(err, errlen, -EINVAL, "%s %s: peer %d of %d ranks", coll_kind_str(d->coll),
                   d->name, a->root, a->nranks);
    snd = d->coll == COLL_SEND ? d : algo_find(COLL_SEND, d->name);
    rcv = d->coll == COLL_RECV ? d : algo_find(COLL_RECV, d->name);
    if (!snd || !rcv)
      return efail(err, errlen, -EINVAL, "%s %s: no %s twin to pair it with",
                   coll_kind_str(d->coll), d->name, d->coll == COLL_SEND ? "recv" : "send");
    /* root is the peer: of the sender for SEND, of the receiver for RECV */
    src = d->coll == COLL_RECV ? a->root : (a->root + 1) % a->nranks;
    dst = d->coll == COLL_SEND ? a->root : (a->root + 1) % a->nranks;
  }
  if ((rc = graph_alloc(a->nranks, &g)))
    return efail(err, errlen, rc, "out of memory");
  for (int r = 0; r < a->nranks; r++) {
    algo_args_t ar = *a;
    const algo_desc_t *bd = d;
    plan_t *p = NULL;

    ar.rank = r;
    if (snd) {
      bd = r == src ? snd : r == dst ? rcv : NULL;
      ar.coll = r == src ? COLL_SEND : COLL_RECV;
      ar.root = r == src ? dst : src;
    }
    if (bd) {
      rc = bd->build(&ar, &p);
    } else {
      plan_builder_t b;
      rc = plan_build_begin(&b, d->name, r, a->nranks, a->count, a->dtype, a->op, a->inplace);
      if (!rc)
        rc = plan_build_end(&b, &p);
    }
    if (rc) {
      efail(err, errlen, rc, "%s %s: building rank %d's plan: %s", coll_kind_str(d->coll), d->name,
            r, strerror(-rc));
      goto out_free_graph;
    }
    rc = graph_add_plan(g, r, p, err, errlen);
    plan_free(p);
    if (rc) {
      if (rc == -ENOMEM)
        efail(err, errlen, rc, "out of memory copying rank %d's plan", r);
      goto out_free_graph;
    }
  }
  *out = g;
  return 0;

out_free_graph:
  sim_graph_free(g);
  return rc;
}

void sim_graph_reset_deps(sim_graph_t *g) {
  for (int r = 0; r < g->nranks; r++) {
    sim_rank_t *gr = &g->ranks[r];
    for (uint32_t i = 0; i < gr->nsteps; i++)
      gr->steps[i].deps = 0;
    for (uint32_t k = 0; k < gr->nedges; k++)
      gr->steps[gr->succ[k]].deps++;
  }
}

/* Per rank, an open-addressing table of its sends keyed by (peer, msg). */
static uint32_t *send_table_find(const sim_rank_t *gr, const uint32_t *t, size_t mask, int peer,
                                 uint32_t msg) {
  for (size_t h = hash(((uint64_t)(uint32_t)peer << 24) | msg, mask + 1);; h = (h + 1) & mask) {
    if (t[h] == UINT32_MAX)
      return (uint32_t *)&t[h];
    const sim_step_t *o = &gr->steps[t[h]];
    if (o->peer == peer && o->msg == msg)
      return (uint32_t *)&t[h];
  }
}

int sim_graph_match(sim_graph_t *g, char *err, size_t errlen) {
  const int n = g->nranks;
  uint32_t **tab = calloc((size_t)n, sizeof(*tab));
  size_t *mask = calloc((size_t)n, sizeof(*mask));
  int rc = 0;

  if (err && errlen)
    err[0] = 0;
  g->matched = false;
  if (!tab || !mask) {
    rc = -ENOMEM;
    goto out;
  }
  for (int r = 0; r < n; r++) {
    sim_rank_t *gr = &g->ranks[r];
    size_t ns = 0, cap = 4;
    for (uint32_t i = 0; i < gr->nsteps; i++) {
      gr->steps[i].mate = UINT32_MAX;
      ns += gr->steps[i].kind == STEP_SEND;
    }
    if (!ns)
      continue;
    while (cap < 2 * ns)
      cap *= 2;
    if (!(tab[r] = malloc(cap * sizeof(**tab)))) {
      rc = -ENOMEM;
      goto out;
    }
    memset(tab[r], 0xff, cap * sizeof(**tab));
    mask[r] = cap - 1;
    for (uint32_t i = 0; i < gr->nsteps; i++) {
      const sim_step_t *s = &gr->steps[i];
      if (s->kind != STEP_SEND)
        continue;
      uint32_t *slot = send_table_find(gr, tab[r], mask[r], s->peer, s->msg);
      if (*slot != UINT32_MAX) {
        rc = efail(err, errlen, -EPROTO,
                   "rank %d sends message %u to rank %d twice (steps %u and %u)", r, s->msg,
                   s->peer, *slot, i);
        goto out;
      }
      *slot = i;
    }
  }
  for (int r = 0; r < n; r++) {
    sim_rank_t *gr = &g->ranks[r];
    for (uint32_t i = 0; i < gr->nsteps; i++) {
      sim_step_t *s = &gr->steps[i];
      if (s->kind != STEP_RECV)
        continue;
      sim_rank_t *pr = &g->ranks[s->peer];
      uint32_t j =
          tab[s->peer] ? *send_table_find(pr, tab[s->peer], mask[s->peer], r, s->msg) : UINT32_MAX;
      if (j == UINT32_MAX) {
        rc = efail(err, errlen, -EPROTO,
                   "rank %d step %u receives message %u from rank %d, which never sends it", r, i,
                   s->msg, s->peer);
        goto out;
      }
      sim_step_t *o = &pr->steps[j];
      if (o->mate != UINT32_MAX) {
        rc = efail(err, errlen, -EPROTO,
                   "rank %d receives message %u from rank %d twice (steps %u and %u)", r, s->msg,
                   s->peer, o->mate, i);
        goto out;
      }
      if (o->bytes != s->bytes) {
        rc = efail(err, errlen, -EPROTO,
                   "message %u from rank %d to rank %d: sent %" PRIu64 " bytes (step %u), "
                   "received %" PRIu64 " (step %u)",
                   s->msg, s->peer, r, o->bytes, j, s->bytes, i);
        goto out;
      }
      o->mate = i;
      s->mate = j;
    }
  }
  for (int r = 0; r < n; r++) {
    const sim_rank_t *gr = &g->ranks[r];
    for (uint32_t i = 0; i < gr->nsteps; i++) {
      const sim_step_t *s = &gr->steps[i];
      if (s->kind == STEP_SEND && s->mate == UINT32_MAX) {
        rc = efail(err, errlen, -EPROTO,
                   "rank %d step %u sends message %u to rank %d, which never receives it", r, i,
                   s->msg, s->peer);
        goto out;
      }
    }
  }
  g->matched = true;
out:
  if (rc == -ENOMEM)
    efail(err, errlen, rc, "out of memory matching %" PRIu64 " messages", g->nsends);
  if (tab)
    for (int r = 0; r < n; r++)
      free(tab[r]);
  free(tab);
  free(mask);
  return rc;
}

/* ---- the virtual clock ---- */

#define VC_POSTED (UINT32_MAX - 1)  /* ready, waiting for its mate */
#define VC_RUNNING (UINT32_MAX - 2) /* its end is in the event heap */

typedef struct {
  double t;
  uint64_t seq; /* ties end in the order they were scheduled */
  uint32_t rank, step;
} vc_event_t;

typedef struct {
  sim_graph_t *g;
  const int *host; /* NULL: one host */
  const sim_model_t *m;
  double *send_free, *recv_free, *cpu_free; /* per rank: when each resource is free */
  vc_event_t *heap;
  size_t n, cap;
  uint64_t seq, done;
} vclock_t;

static bool ev_before(const vc_event_t *a, const vc_event_t *b) {
  return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static int vc_push(vclock_t *v, double t, uint32_t rank, uint32_t step) {
  if (v->n == v->cap) {
    size_t ncap = v->cap ? v->cap * 2 : 4096;
    vc_event_t *nh = realloc(v->heap, ncap * sizeof(*nh));
    if (!nh)
      return -ENOMEM;
    v->heap = nh;
    v->cap = ncap;
  }
  vc_event_t e = {t, v->seq++, rank, step};
  size_t i = v->n++;
  while (i > 0) {
    size_t up = (i - 1) / 2;
    if (!ev_before(&e, &v->heap[up]))
      break;
    v->heap[i] = v->heap[up];
    i = up;
  }
  v->heap[i] = e;
  return 0;
}

static vc_event_t vc_pop(vclock_t *v) {
  vc_event_t top = v->heap[0], last = v->heap[--v->n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= v->n)
      break;
    if (c + 1 < v->n && ev_before(&v->heap[c + 1], &v->heap[c]))
      c++;
    if (!ev_before(&v->heap[c], &last))
      break;
    v->heap[i] = v->heap[c];
    i = c;
  }
  if (v->n)
    v->heap[i] = last;
  return top;
}

static double dmax(double a, double b) {
  return a > b ? a : b;
}

/* Step i of rank r has no dependencies left at time `now`. */
static int vc_ready(vclock_t *v, uint32_t r, uint32_t i, double now) {
  sim_step_t *s = &v->g->ranks[r].steps[i];
  const sim_model_t *m = v->m;
  double start, end;

  if (!is_comm(s->kind)) {
    double per_byte = s->kind == STEP_COPY ? m->copy_beta : m->gamma;
    start = dmax(now, v->cpu_free[r]);
    end = start + (double)s->bytes * per_byte;
    v->cpu_free[r] = end;
    s->deps = VC_RUNNING;
    return vc_push(v, end, r, i);
  }
  sim_step_t *o = &v->g->ranks[s->peer].steps[s->mate];
  if (o->deps != VC_POSTED) {
    s->deps = VC_POSTED;
    return 0;
  }
  uint32_t src = s->kind == STEP_SEND ? r : (uint32_t)s->peer;
  uint32_t dst = s->kind == STEP_SEND ? (uint32_t)s->peer : r;
  int cls = v->host && v->host[src] != v->host[dst];
  start = dmax(now, dmax(v->send_free[src], v->recv_free[dst]));
  end = start + m->alpha[cls] + (double)s->bytes * m->beta[cls];
  v->send_free[src] = v->recv_free[dst] = end;
  s->deps = o->deps = VC_RUNNING;
  return vc_push(v, end, r, i);
}

static int vc_finish(vclock_t *v, uint32_t r, uint32_t i, double now) {
  sim_rank_t *gr = &v->g->ranks[r];
  int rc;

  gr->steps[i].deps = DONE;
  v->done++;
  for (uint32_t k = gr->succ_off[i]; k < gr->succ_off[i + 1]; k++) {
    uint32_t j = gr->succ[k];
    if (--gr->steps[j].deps == 0 && (rc = vc_ready(v, r, j, now)))
      return rc;
  }
  return 0;
}

/* Bytes each rank sends within and across hosts, the busiest rank pair and
 * host pair: from the graph alone, per source so memory stays O(ranks). */
static int traffic(const sim_graph_t *g, const topo_t *topo, sim_time_result_t *res) {
  const int n = g->nranks;
  const int *host = topo && topo->nhosts > 1 ? topo->host_of : NULL;
  const int nh = host ? topo->nhosts : 1;
  uint64_t *acc = calloc((size_t)(n > nh ? n : nh), sizeof(*acc));
  int *touched = malloc((size_t)(n > nh ? n : nh) * sizeof(*touched));
  int *order = NULL, *first = NULL;
  int rc = 0;

  if (!acc || !touched) {
    rc = -ENOMEM;
    goto out;
  }
  res->link_src = res->link_dst = res->hlink_src = res->hlink_dst = -1;
  for (int r = 0; r < n; r++) {
    const sim_rank_t *gr = &g->ranks[r];
    uint64_t in = 0, out = 0;
    int nt = 0;
    for (uint32_t i = 0; i < gr->nsteps; i++) {
      const sim_step_t *s = &gr->steps[i];
      if (s->kind != STEP_SEND)
        continue;
      if (host && host[s->peer] != host[r])
        out += s->bytes;
      else
        in += s->bytes;
      if (!s->bytes)
        continue;
      if (!acc[s->peer])
        touched[nt++] = s->peer;
      acc[s->peer] += s->bytes;
    }
    for (int k = 0; k < nt; k++) {
      if (acc[touched[k]] > res->link_bytes) {
        res->link_bytes = acc[touched[k]];
        res->link_src = r;
        res->link_dst = touched[k];
      }
      acc[touched[k]] = 0;
    }
    res->bytes_intra += in;
    res->bytes_inter += out;
    if (in > res->max_sent_intra || r == 0) {
      res->max_sent_intra = in;
      res->max_sent_intra_rank = r;
    }
    if (out > res->max_sent_inter || r == 0) {
      res->max_sent_inter = out;
      res->max_sent_inter_rank = r;
    }
    if (in + out > res->max_sent)
      res->max_sent = in + out;
  }
  if (!host)
    goto out;
  /* ranks grouped by host (counting sort), then per source host */
  order = malloc((size_t)n * sizeof(*order));
  first = calloc((size_t)nh + 1, sizeof(*first));
  if (!order || !first) {
    rc = -ENOMEM;
    goto out;
  }
  for (int r = 0; r < n; r++)
    first[host[r] + 1]++;
  for (int h = 0; h < nh; h++)
    first[h + 1] += first[h];
  for (int r = 0; r < n; r++)
    order[first[host[r]]++] = r;
  for (int h = nh; h > 0; h--)
    first[h] = first[h - 1];
  first[0] = 0;
  for (int h = 0; h < nh; h++) {
    int nt = 0;
    for (int k = first[h]; k < first[h + 1]; k++) {
      const sim_rank_t *gr = &g->ranks[order[k]];
      for (uint32_t i = 0; i < gr->nsteps; i++) {
        const sim_step_t *s = &gr->steps[i];
        if (s->kind != STEP_SEND || host[s->peer] == h || !s->bytes)
          continue;
        if (!acc[host[s->peer]])
          touched[nt++] = host[s->peer];
        acc[host[s->peer]] += s->bytes;
      }
    }
    for (int k = 0; k < nt; k++) {
      if (acc[touched[k]] > res->hlink_bytes) {
        res->hlink_bytes = acc[touched[k]];
        res->hlink_src = h;
        res->hlink_dst = touched[k];
      }
      acc[touched[k]] = 0;
    }
  }
out:
  free(acc);
  free(touched);
  free(order);
  free(first);
  return rc;
}

void sim_model_default(sim_model_t *m) {
  /* keep in step with select.c's defaults */
  *m = (sim_model_t){.alpha = {2e-6, 20e-6},
                     .beta = {1.0 / 5e9, 1.0 / 1.2e9},
                     .gamma = 1.0 / 4e9,
                     .copy_beta = 1.0 / 10e9};
}

int sim_time(sim_graph_t *g, const topo_t *topo, const sim_model_t *m, sim_time_result_t *res,
             char *err, size_t errlen) {
  vclock_t v = {.g = g, .m = m};
  const int n = g->nranks;
  int rc;

  memset(res, 0, sizeof(*res));
  if (err && errlen)
    err[0] = 0;
  if (topo && topo->nhosts > 1) {
    if (topo->nranks != n || !topo->host_of)
      return efail(err, errlen, -EINVAL, "topology of %d ranks for a schedule of %d", topo->nranks,
                   n);
    for (int r = 0; r < n; r++)
      if (topo->host_of[r] < 0 || topo->host_of[r] >= topo->nhosts)
        return efail(err, errlen, -EINVAL, "rank %d on host %d of %d", r, topo->host_of[r],
                     topo->nhosts);
    v.host = topo->host_of;
  }
  if (!g->matched && (rc = sim_graph_match(g, err, errlen)))
    return rc;
  if ((rc = traffic(g, topo, res)))
    goto out;
  v.send_free = calloc((size_t)n, sizeof(double));
  v.recv_free = calloc((size_t)n, sizeof(double));
  v.cpu_free = calloc((size_t)n, sizeof(double));
  if (!v.send_free || !v.recv_free || !v.cpu_free) {
    rc = -ENOMEM;
    goto out;
  }
  for (int r = 0; r < n; r++)
    for (uint32_t i = 0; i < g->ranks[r].nsteps; i++)
      if (g->ranks[r].steps[i].deps == 0 && (rc = vc_ready(&v, (uint32_t)r, i, 0.0)))
        goto out;
  while (v.n) {
    vc_event_t e = vc_pop(&v);
    const sim_step_t *s = &g->ranks[e.rank].steps[e.step];
    uint32_t last = e.rank;
    if (is_comm(s->kind)) {
      uint32_t pr = (uint32_t)s->peer, pi = s->mate;
      if (s->kind == STEP_SEND)
        last = pr;
      if ((rc = vc_finish(&v, pr, pi, e.t)))
        goto out;
      res->messages++;
      res->bytes += s->bytes;
    }
    if ((rc = vc_finish(&v, e.rank, e.step, e.t)))
      goto out;
    if (e.t >= res->time) {
      res->time = e.t;
      res->last_rank = (int)last;
    }
  }
  res->steps = v.done;
  res->max_steps = g->max_steps;
  if (v.done < g->nsteps)
    for (int r = 0; r < n; r++)
      for (uint32_t i = 0; i < g->ranks[r].nsteps; i++) {
        const sim_step_t *s = &g->ranks[r].steps[i];
        if (s->deps == DONE)
          continue;
        if (is_comm(s->kind))
          rc = efail(err, errlen, -EDEADLK,
                     "stuck: rank %d step %u (%s of message %u %s rank %d) never runs; %" PRIu64
                     " of %" PRIu64 " steps ran (a dependency cycle across ranks)",
                     r, i, plan_step_kind_str(s->kind), s->msg,
                     s->kind == STEP_SEND ? "to" : "from", s->peer, v.done, g->nsteps);
        else
          rc = efail(err, errlen, -EDEADLK,
                     "stuck: rank %d step %u (%s) never runs; %" PRIu64 " of %" PRIu64
                     " steps ran (a dependency cycle)",
                     r, i, plan_step_kind_str(s->kind), v.done, g->nsteps);
        goto out;
      }
out:
  if (rc == -ENOMEM)
    efail(err, errlen, rc, "sim_time: out of memory");
  sim_graph_reset_deps(g);
  free(v.send_free);
  free(v.recv_free);
  free(v.cpu_free);
  free(v.heap);
  return rc;
}
