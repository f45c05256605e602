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

/* The shapes' arrays are carved from blocks that grow with the graph (a few
 * small ones for a small graph, 64 MiB ones for thousands of ranks that
 * share nothing), on huge pages where the kernel offers them. */
typedef struct arena_block {
  struct arena_block *next;
  size_t used, cap;
} arena_block_t;

#define ARENA_FIRST (256u << 10)
#define ARENA_MAX (64u << 20)
#define ARENA_ALIGN 64

static void *arena_alloc(sim_graph_t *g, size_t bytes) {
  arena_block_t *b = g->arena;
  bytes = (bytes + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
  if (!b || b->cap - b->used < bytes) {
    size_t cap = b ? (b->cap < ARENA_MAX ? b->cap * 2 : ARENA_MAX) : ARENA_FIRST;
    void *mem;
    if (cap < bytes + ARENA_ALIGN)
      cap = bytes + ARENA_ALIGN;
    if (posix_memalign(&mem, cap >= (2u << 20) ? 2u << 20 : 4096, cap))
      return NULL;
#ifdef MADV_HUGEPAGE
    if (cap >= (2u << 20))
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

/* Gives back p, the last allocation (of `bytes`). */
static void arena_unalloc(sim_graph_t *g, void *p, size_t bytes) {
  arena_block_t *b = g->arena;
  bytes = (bytes + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
  if (b && (char *)p + bytes == (char *)b + b->used)
    b->used -= bytes;
}

/* While ranks are added: one plan converted (the arrays reused from rank to
 * rank) and the shapes by hash. */
typedef struct graph_build {
  uint32_t *ndeps; /* per step of the plan */
  uint32_t *succ;
  uint32_t cap_steps;
  size_t cap_edges;
  uint32_t cap_shapes;
  uint32_t *by_hash; /* shape indices, UINT32_MAX empty; mask + 1 slots */
  size_t mask;
  bool missed; /* the last rank was a new shape: the next one is not compared
                  with it while read (only looked up) */
} graph_build_t;

static void build_free(sim_graph_t *g) {
  graph_build_t *b = g->build;
  if (!b)
    return;
  free(b->ndeps);
  free(b->succ);
  free(b->by_hash);
  free(b);
  g->build = NULL;
}

static void index_free(sim_graph_t *g) {
  for (uint32_t k = 0; k < g->nshapes; k++) {
    free(g->shapes[k].index);
    g->shapes[k].index = NULL;
  }
}

void sim_graph_free(sim_graph_t *g) {
  if (!g)
    return;
  build_free(g);
  if (g->shapes)
    index_free(g);
  for (arena_block_t *b = g->arena, *next; b; b = next) {
    next = b->next;
    free(b);
  }
  free(g->shapes);
  free(g->shape_of);
  free(g);
}

static int graph_alloc(int nranks, sim_graph_t **out) {
  sim_graph_t *g = calloc(1, sizeof(*g));

  *out = NULL;
  if (!g)
    return -ENOMEM;
  g->nranks = nranks;
  g->period = nranks;
  g->shape_of = calloc((size_t)nranks, sizeof(*g->shape_of));
  g->build = calloc(1, sizeof(graph_build_t));
  if (!g->shape_of || !g->build) {
    sim_graph_free(g);
    return -ENOMEM;
  }
  *out = g;
  return 0;
}

/* Peers written as peer ^ rank line up the ranks of recursive doubling and
 * halving (rank r talks to r ^ 2^k), peer - rank those of rings and
 * dissemination. Plans of the first ranks (plans[0 .. k)) pick: XOR when
 * more of their SENDs and RECVs agree with rank 0's that way, and only for a
 * power of two ranks, where r -> r ^ c permutes the ranks (verify.c). */
static bool prefer_xor(plan_t *const *plans, int k, int n) {
  uint64_t add = 0, xr = 0;

  if (n < 4 || (n & (n - 1)))
    return false;
  for (int r = 1; r < k; r++) {
    const plan_t *p0 = plans[0], *p = plans[r];
    if (!p0 || !p || p->nsteps != p0->nsteps)
      continue;
    for (uint32_t i = 0; i < p0->nsteps; i++) {
      const plan_step_t *a = &p0->steps[i], *b = &p->steps[i];
      if (!is_comm(a->kind) || a->kind != b->kind || a->peer < 0 || a->peer >= n || b->peer < 0 ||
          b->peer >= n)
        continue;
      add += a->peer == (b->peer - r + n) % n;
      xr += a->peer == (b->peer ^ r);
    }
  }
  return xr > add;
}

/* Four independent multiply-xor lanes. Only narrows the candidates: two
 * plans are the same shape when memcmp says so. */
static uint64_t hash_bytes(uint64_t h, const void *data, size_t len) {
  const uint64_t k = 0x9e3779b97f4a7c15ull;
  const unsigned char *c = data;
  uint64_t l[4] = {h, h ^ 0x5555555555555555ull, h + k, h - k}, w[4];
  size_t i = 0;

  for (; i + 32 <= len; i += 32) {
    memcpy(w, c + i, 32);
    for (int j = 0; j < 4; j++)
      l[j] = (l[j] ^ w[j]) * k;
  }
  for (; i + 8 <= len; i += 8) {
    memcpy(w, c + i, 8);
    l[0] = (l[0] ^ w[0]) * k;
  }
  for (; i < len; i++)
    l[1] = (l[1] ^ c[i]) * k;
  h = l[0] ^ (l[1] >> 17) ^ (l[1] << 47) ^ (l[2] >> 31) ^ (l[2] << 33) ^ (l[3] >> 47) ^
      (l[3] << 17);
  h ^= h >> 29;
  h *= k;
  return h ^ (h >> 32);
}

/* Room in b for nsteps steps' counts and nedges edges; the edges already
 * there are kept. */
static int build_reserve(graph_build_t *b, uint32_t nsteps, size_t nedges) {
  if (nsteps + 1 > b->cap_steps) {
    uint32_t cap = b->cap_steps ? b->cap_steps : 64;
    while (cap < nsteps + 1)
      cap *= 2;
    free(b->ndeps);
    b->cap_steps = 0;
    if (!(b->ndeps = malloc(cap * sizeof(*b->ndeps))))
      return -ENOMEM;
    b->cap_steps = cap;
  }
  if (nedges > b->cap_edges || !b->succ) {
    size_t cap = b->cap_edges ? b->cap_edges : 256;
    while (cap < nedges)
      cap *= 2;
    uint32_t *n = realloc(b->succ, cap * sizeof(*n));
    if (!n)
      return -ENOMEM;
    b->succ = n;
    b->cap_edges = cap;
  }
  return 0;
}

static bool shape_equal(const sim_shape_t *s, const sim_step_t *steps, const uint32_t *succ,
                        uint32_t nsteps, uint32_t nedges) {
  return s->nsteps == nsteps && s->nedges == nedges &&
         !memcmp(s->steps, steps, (nsteps + 1) * sizeof(*steps)) &&
         !memcmp(s->succ, succ, nedges * sizeof(*succ));
}

/* Stores a new shape (its index in *id): steps, converted in the arena, and
 * b's edges and counts. */
static int shape_commit(sim_graph_t *g, graph_build_t *b, int r, sim_step_t *steps, uint32_t nsteps,
                        uint32_t nedges, uint64_t h, uint32_t *id) {
  sim_shape_t *sh;

  if (g->nshapes == b->cap_shapes) {
    uint32_t cap = b->cap_shapes ? b->cap_shapes * 2 : 16;
    sim_shape_t *n = realloc(g->shapes, cap * sizeof(*n));
    if (!n)
      return -ENOMEM;
    g->shapes = n;
    b->cap_shapes = cap;
  }
  if ((size_t)(g->nshapes + 1) * 2 > b->mask + 1 || !b->by_hash) {
    size_t cap = b->by_hash ? (b->mask + 1) * 2 : 64;
    uint32_t *t = malloc(cap * sizeof(*t));
    if (!t)
      return -ENOMEM;
    memset(t, 0xff, cap * sizeof(*t));
    for (uint32_t k = 0; k < g->nshapes; k++) {
      size_t at = g->shapes[k].hash & (cap - 1);
      while (t[at] != UINT32_MAX)
        at = (at + 1) & (cap - 1);
      t[at] = k;
    }
    free(b->by_hash);
    b->by_hash = t;
    b->mask = cap - 1;
  }
  sh = &g->shapes[g->nshapes];
  memset(sh, 0, sizeof(*sh));
  sh->nsteps = nsteps;
  sh->nedges = nedges;
  sh->hash = h;
  sh->first_rank = r;
  sh->steps = steps;
  for (uint32_t i = 0; i < nsteps; i++) {
    sh->nroots += b->ndeps[i] == 0;
    sh->nsends += steps[i].kind == STEP_SEND;
    sh->nrecvs += steps[i].kind == STEP_RECV;
  }
  sh->succ = arena_alloc(g, ((size_t)nedges + 1) * sizeof(*sh->succ));
  sh->roots = arena_alloc(g, ((size_t)sh->nroots + 1) * sizeof(*sh->roots));
  if (!sh->succ || !sh->roots)
    return -ENOMEM;
  memcpy(sh->succ, b->succ, nedges * sizeof(*sh->succ));
  for (uint32_t i = 0, k = 0; i < nsteps; i++)
    if (!b->ndeps[i])
      sh->roots[k++] = i;
  /* bytes per peer, in the order of first non-empty sends (sim_time's
   * traffic breaks ties by that order) */
  if (sh->nsends) {
    uint32_t cap = 4, *slot;
    while (cap < 2 * sh->nsends)
      cap *= 2;
    slot = malloc(cap * sizeof(*slot));
    sim_sent_t *sent = malloc(sh->nsends * sizeof(*sent));
    if (!slot || !sent) {
      free(slot);
      free(sent);
      return -ENOMEM;
    }
    memset(slot, 0xff, cap * sizeof(*slot));
    for (uint32_t i = 0; i < nsteps; i++) {
      const sim_step_t *s = &sh->steps[i];
      if (s->kind != STEP_SEND || !s->bytes)
        continue;
      size_t at = ((uint32_t)s->peer * 0x9e3779b1u) & (cap - 1);
      while (slot[at] != UINT32_MAX && sent[slot[at]].peer != (uint32_t)s->peer)
        at = (at + 1) & (cap - 1);
      if (slot[at] == UINT32_MAX) {
        slot[at] = sh->nsent;
        sent[sh->nsent++] = (sim_sent_t){(uint32_t)s->peer, 0};
      }
      sent[slot[at]].bytes += s->bytes;
    }
    free(slot);
    sh->sent = arena_alloc(g, (sh->nsent + 1) * sizeof(*sh->sent));
    if (sh->sent)
      memcpy(sh->sent, sent, sh->nsent * sizeof(*sent));
    free(sent);
    if (!sh->sent)
      return -ENOMEM;
  }
  size_t at = h & b->mask;
  while (b->by_hash[at] != UINT32_MAX)
    at = (at + 1) & b->mask;
  b->by_hash[at] = g->nshapes;
  *id = g->nshapes++;
  return 0;
}

/* Adds plan p as rank r of g: converted, then matched against the shapes
 * stored or stored as a new one. The previous rank's shape is compared step
 * by step while p is read, so the ranks of a symmetric algorithm end there
 * without writing a copy; after a rank that was a new shape (ranks that
 * share nothing), plans are converted into the arena, hashed and looked up,
 * and given back when found. On error what was allocated stays in g for
 * sim_graph_free. */
static int graph_add_plan(sim_graph_t *g, int r, const plan_t *p, char *err, size_t errlen) {
  graph_build_t *b = g->build;
  const int n = g->nranks;
  const sim_shape_t *c = NULL;
  sim_step_t *st = NULL;
  uint32_t e = 0, ns, id = UINT32_MAX;
  size_t st_bytes;
  int rc;

  if (!p)
    return efail(err, errlen, -EINVAL, "rank %d: no plan", r);
  if (p->rank != r || p->nranks != n)
    return efail(err, errlen, -EINVAL, "rank %d: plan is for rank %d of %d ranks, not of %d", r,
                 p->rank, p->nranks, n);
  ns = p->nsteps;
  if (ns >= UINT32_MAX - 3)
    return efail(err, errlen, -E2BIG, "rank %d: %u steps, too many", r, ns);
  st_bytes = ((size_t)ns + 1) * sizeof(*st);
  if ((rc = build_reserve(b, ns, 0)))
    return rc;
  if (r > 0 && g->shapes[g->shape_of[r - 1]].nsteps == ns && !b->missed)
    c = &g->shapes[g->shape_of[r - 1]];
  else if (!(st = arena_alloc(g, st_bytes)))
    return -ENOMEM;
  for (uint32_t i = 0; i < ns; i++) {
    const plan_step_t *ps = &p->steps[i];
    const uint32_t *su = p->succ + ps->succ_off;
    bool comm = is_comm(ps->kind);
    if ((uint64_t)e + ps->nsucc >= UINT32_MAX - 3)
      return efail(err, errlen, -E2BIG, "rank %d: %u steps and over %u edges, too many", r, ns, e);
    if (ps->kind >= STEP_KIND_COUNT)
      return efail(err, errlen, -EINVAL, "rank %d step %u: unknown kind %u", r, i, ps->kind);
    if (comm && (ps->peer < 0 || ps->peer >= n || ps->peer == r))
      return efail(err, errlen, -EINVAL, "rank %d step %u: %s with peer %d of %d ranks", r, i,
                   plan_step_kind_str(ps->kind), ps->peer, n);
    if (comm && ps->msg >= (1u << 24))
      return efail(err, errlen, -EINVAL, "rank %d step %u: message number %u over 24 bits", r, i,
                   ps->msg);
    for (uint32_t k = 0; k < ps->nsucc; k++)
      if (su[k] >= ns)
        return efail(err, errlen, -EINVAL, "rank %d step %u: successor %u of %u steps", r, i, su[k],
                     ns);
    const int32_t peer = !comm           ? -1
                         : g->xor_peers  ? ps->peer ^ r
                         : ps->peer >= r ? ps->peer - r
                                         : ps->peer - r + n;
    const uint32_t msg = comm ? ps->msg : 0;
    if (c) {
      /* field by field, not through a sim_step_t: its bit-fields, stored
       * and read back at once, stall the store buffer */
      const sim_step_t *cs = &c->steps[i];
      bool same = cs->bytes == ps->bytes && cs->peer == peer && cs->msg == msg &&
                  cs->kind == ps->kind && cs->succ == e && cs[1].succ - e == ps->nsucc;
      for (uint32_t k = 0; same && k < ps->nsucc; k++)
        same = c->succ[e + k] == su[k];
      if (same) {
        e += ps->nsucc;
        continue;
      }
      /* steps 0 .. i-1 are c's */
      if ((rc = build_reserve(b, ns, e)) || !(st = arena_alloc(g, st_bytes)))
        return rc ? rc : -ENOMEM;
      memcpy(st, c->steps, i * sizeof(*st));
      memcpy(b->succ, c->succ, e * sizeof(*b->succ));
      c = NULL;
    }
    if (e + ps->nsucc > b->cap_edges && (rc = build_reserve(b, ns, e + ps->nsucc)))
      return rc;
    st[i] = (sim_step_t){.bytes = ps->bytes,
                         .peer = peer,
                         .msg = msg,
                         .kind = ps->kind,
                         .succ = e,
                         .mate = UINT32_MAX,
                         .mate_of = UINT32_MAX};
    memcpy(b->succ + e, su, ps->nsucc * sizeof(*su));
    e += ps->nsucc;
  }
  if (c) {
    id = g->shape_of[r - 1];
  } else {
    st[ns] = (sim_step_t){.peer = -1, .succ = e, .mate = UINT32_MAX, .mate_of = UINT32_MAX};
    memset(b->ndeps, 0, ns * sizeof(*b->ndeps));
    for (uint32_t k = 0; k < e; k++)
      b->ndeps[b->succ[k]]++;
    uint64_t h = hash_bytes(ns, st, st_bytes);
    h = hash_bytes(h, b->succ, e * sizeof(*b->succ));
    for (size_t at = b->by_hash ? h & b->mask : 0;
         b->by_hash && b->by_hash[at] != UINT32_MAX && id == UINT32_MAX; at = (at + 1) & b->mask) {
      const sim_shape_t *sh = &g->shapes[b->by_hash[at]];
      if (sh->hash == h && shape_equal(sh, st, b->succ, ns, e))
        id = b->by_hash[at];
    }
    b->missed = id == UINT32_MAX;
    if (id != UINT32_MAX)
      arena_unalloc(g, st, st_bytes);
    else if ((rc = shape_commit(g, b, r, st, ns, e, h, &id)))
      return rc;
  }
  const sim_shape_t *sh = &g->shapes[id];
  g->shape_of[r] = id;
  g->nsteps += sh->nsteps;
  g->nedges += sh->nedges;
  g->nsends += sh->nsends;
  g->nrecvs += sh->nrecvs;
  if (sh->nsteps > g->max_steps || r == 0) {
    g->max_steps = sh->nsteps;
    g->max_steps_rank = r;
  }
  return 0;
}

/* All ranks added: the period, and the build state goes. */
static void graph_done(sim_graph_t *g) {
  const int n = g->nranks;

  build_free(g);
  g->period = n;
  for (int P = 1; P < n; P++) {
    if (n % P)
      continue;
    int r = P;
    while (r < n && g->shape_of[r] == g->shape_of[r - P])
      r++;
    if (r == n) {
      g->period = P;
      break;
    }
  }
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
  g->xor_peers = prefer_xor(plans, nranks < SIM_PROBE_RANKS ? nranks : SIM_PROBE_RANKS, nranks);
  for (int r = 0; r < nranks; r++)
    if ((rc = graph_add_plan(g, r, plans[r], err, errlen)))
      goto out_free_graph;
  graph_done(g);
  *out = g;
  return 0;

out_free_graph:
  sim_graph_free(g);
out_nomem:
  if (rc == -ENOMEM)
    efail(err, errlen, rc, "out of memory copying %d plans", nranks);
  return rc;
}

/* Rank r's plan of d for the shape of a, as sim_graph_build builds it. */
static int build_plan(const algo_desc_t *d, const algo_desc_t *snd, const algo_desc_t *rcv, int src,
                      int dst, const algo_args_t *a, int r, plan_t **p, char *err, size_t errlen) {
  algo_args_t ar = *a;
  const algo_desc_t *bd = d;
  int rc;

  *p = NULL;
  ar.rank = r;
  if (snd) {
    bd = r == src ? snd : r == dst ? rcv : NULL;
    ar.coll = r == src ? COLL_SEND : COLL_RECV;
    ar.root = r == src ? dst : src;
  }
  if (bd) {
    rc = bd->build(&ar, p);
  } else {
    plan_builder_t b;
    rc = plan_build_begin(&b, d->name, r, a->nranks, a->count, a->dtype, a->op, a->inplace);
    if (!rc)
      rc = plan_build_end(&b, p);
  }
  if (rc)
    efail(err, errlen, rc, "%s %s: building rank %d's plan: %s", coll_kind_str(d->coll), d->name, r,
          strerror(-rc));
  return rc;
}

int sim_graph_build(const algo_desc_t *d, const algo_args_t *a, sim_graph_t **out, char *err,
                    size_t errlen) {
  const algo_desc_t *snd = NULL, *rcv = NULL;
  plan_t *probe[SIM_PROBE_RANKS] = {0};
  int src = -1, dst = -1, np, rc;
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
  /* the first ranks' plans pick the peers' encoding, then join the rest */
  np = a->nranks < SIM_PROBE_RANKS ? a->nranks : SIM_PROBE_RANKS;
  for (int r = 0; r < np; r++)
    if ((rc = build_plan(d, snd, rcv, src, dst, a, r, &probe[r], err, errlen)))
      goto out_free_graph;
  g->xor_peers = prefer_xor(probe, np, a->nranks);
  for (int r = 0; r < a->nranks; r++) {
    plan_t *p = r < np ? probe[r] : NULL;
    if (!p && (rc = build_plan(d, snd, rcv, src, dst, a, r, &p, err, errlen)))
      goto out_free_graph;
    rc = graph_add_plan(g, r, p, err, errlen);
    plan_free(p);
    if (r < np)
      probe[r] = NULL;
    if (rc) {
      if (rc == -ENOMEM)
        efail(err, errlen, rc, "out of memory copying rank %d's plan", r);
      goto out_free_graph;
    }
  }
  graph_done(g);
  *out = g;
  return 0;

out_free_graph:
  for (int r = 0; r < SIM_PROBE_RANKS; r++)
    plan_free(probe[r]);
  sim_graph_free(g);
  return rc;
}

/* Steps of a shape by (kind, peer, msg): open addressing over step
 * indices, at most half full, the first step of each key kept. */
static uint64_t index_key(unsigned kind, uint32_t peer, uint32_t msg) {
  return ((uint64_t)(kind == STEP_SEND) << 56) | ((uint64_t)peer << 24) | msg;
}

/* Indexes sh's SENDs (and RECVs unless sends_only) into a new table in
 * *slot. *dup: the first SEND whose key an earlier SEND has (and *dup_of
 * that one), or UINT32_MAX. */
static int index_build(const sim_shape_t *sh, bool sends_only, uint32_t **slot, size_t *mask,
                       uint32_t *dup, uint32_t *dup_of) {
  size_t cap = 4, nc = sh->nsends + (sends_only ? 0 : (size_t)sh->nrecvs);
  uint32_t *t;

  *dup = *dup_of = UINT32_MAX;
  while (cap < 2 * nc)
    cap *= 2;
  if (!(t = malloc(cap * sizeof(*t))))
    return -ENOMEM;
  memset(t, 0xff, cap * sizeof(*t));
  for (uint32_t i = 0; i < sh->nsteps; i++) {
    const sim_step_t *s = &sh->steps[i];
    if (s->kind != STEP_SEND && (sends_only || s->kind != STEP_RECV))
      continue;
    uint64_t key = index_key(s->kind, (uint32_t)s->peer, s->msg);
    size_t at = hash(key, cap);
    while (t[at] != UINT32_MAX) {
      const sim_step_t *o = &sh->steps[t[at]];
      if (index_key(o->kind, (uint32_t)o->peer, o->msg) == key)
        break;
      at = (at + 1) & (cap - 1);
    }
    if (t[at] == UINT32_MAX)
      t[at] = i;
    else if (s->kind == STEP_SEND && *dup == UINT32_MAX)
      *dup = i, *dup_of = t[at];
  }
  *slot = t;
  *mask = cap - 1;
  return 0;
}

static uint32_t index_find(const uint32_t *t, size_t mask, const sim_shape_t *sh, unsigned kind,
                           uint32_t peer, uint32_t msg) {
  uint64_t key = index_key(kind, peer, msg);
  for (size_t at = hash(key, mask + 1);; at = (at + 1) & mask) {
    uint32_t i = t[at];
    if (i == UINT32_MAX)
      return i;
    const sim_step_t *o = &sh->steps[i];
    if (index_key(o->kind, (uint32_t)o->peer, o->msg) == key)
      return i;
  }
}

/* The peer field, written from the peer's side. */
static uint32_t peer_back(const sim_graph_t *g, const sim_step_t *s) {
  return g->xor_peers ? (uint32_t)s->peer : (uint32_t)(g->nranks - s->peer);
}

uint32_t sim_graph_mate_find(sim_graph_t *g, int rank, uint32_t step, int peer) {
  sim_step_t *s = &g->shapes[g->shape_of[rank]].steps[step];
  uint32_t ps = g->shape_of[peer], dup, dup_of;

  /* a shape shared by ranks whose peers' shapes differ: look it up */
  sim_shape_t *psh = &g->shapes[ps];
  if (!psh->index && index_build(psh, false, &psh->index, &psh->index_mask, &dup, &dup_of))
    return UINT32_MAX; /* out of memory */
  s->mate = index_find(psh->index, psh->index_mask, psh,
                       s->kind == STEP_SEND ? STEP_RECV : STEP_SEND, peer_back(g, s), s->msg);
  s->mate_of = ps;
  return s->mate;
}

/* In the order of a walk over every rank: sends used twice, then each
 * receive (no send, received twice, size), then sends never received.
 * Ranks 0 .. period-1 stand for all (sim.h). A receive that finds its send
 * sets both memos; a send whose memo is for an earlier receive of the same
 * rank is received twice. */
int sim_graph_match(sim_graph_t *g, char *err, size_t errlen) {
  const int nq = g->period;
  const uint32_t ns = g->nshapes;
  uint32_t **tab = calloc(ns ? ns : 1, sizeof(*tab));
  size_t *mask = calloc(ns ? ns : 1, sizeof(*mask));
  uint32_t *dup = malloc((ns ? ns : 1) * 2 * sizeof(*dup));
  int rc = 0;

  if (err && errlen)
    err[0] = 0;
  g->matched = false;
  if (!tab || !mask || !dup) {
    rc = -ENOMEM;
    goto out;
  }
  for (uint32_t k = 0; k < ns; k++) {
    sim_shape_t *sh = &g->shapes[k];
    for (uint32_t i = 0; i < sh->nsteps; i++)
      sh->steps[i].mate = sh->steps[i].mate_of = UINT32_MAX;
    if ((rc = index_build(sh, true, &tab[k], &mask[k], &dup[2 * k], &dup[2 * k + 1])))
      goto out;
  }
  for (int r = 0; r < nq; r++) {
    uint32_t k = g->shape_of[r];
    const sim_shape_t *sh = &g->shapes[k];
    if (sh->first_rank == r && dup[2 * k] != UINT32_MAX) {
      const sim_step_t *s = &sh->steps[dup[2 * k]];
      rc =
          efail(err, errlen, -EPROTO, "rank %d sends message %u to rank %d twice (steps %u and %u)",
                r, s->msg, sim_graph_peer(g, r, s), dup[2 * k + 1], dup[2 * k]);
      goto out;
    }
  }
  for (int r = 0; r < nq; r++) {
    const uint32_t k = g->shape_of[r];
    sim_shape_t *sh = &g->shapes[k];
    for (uint32_t i = 0; i < sh->nsteps; i++) {
      sim_step_t *s = &sh->steps[i];
      if (s->kind != STEP_RECV)
        continue;
      int p = sim_graph_peer(g, r, s);
      uint32_t pk = g->shape_of[p];
      uint32_t j =
          index_find(tab[pk], mask[pk], &g->shapes[pk], STEP_SEND, peer_back(g, s), s->msg);
      if (j == UINT32_MAX) {
        rc = efail(err, errlen, -EPROTO,
                   "rank %d step %u receives message %u from rank %d, which never sends it", r, i,
                   s->msg, p);
        goto out;
      }
      sim_step_t *o = &g->shapes[pk].steps[j];
      if (o->mate_of == k && o->mate != i) {
        rc = efail(err, errlen, -EPROTO,
                   "rank %d receives message %u from rank %d twice (steps %u and %u)", r, s->msg, p,
                   o->mate, i);
        goto out;
      }
      if (o->bytes != s->bytes) {
        rc = efail(err, errlen, -EPROTO,
                   "message %u from rank %d to rank %d: sent %" PRIu64 " bytes (step %u), "
                   "received %" PRIu64 " (step %u)",
                   s->msg, p, r, o->bytes, j, s->bytes, i);
        goto out;
      }
      s->mate = j;
      s->mate_of = pk;
      o->mate = i;
      o->mate_of = k;
    }
  }
  for (int r = 0; r < nq; r++) {
    const sim_shape_t *sh = &g->shapes[g->shape_of[r]];
    for (uint32_t i = 0; i < sh->nsteps; i++) {
      const sim_step_t *s = &sh->steps[i];
      if (s->kind == STEP_SEND && sim_graph_mate(g, r, i, sim_graph_peer(g, r, s)) == UINT32_MAX) {
        rc = efail(err, errlen, -EPROTO,
                   "rank %d step %u sends message %u to rank %d, which never receives it", r, i,
                   s->msg, sim_graph_peer(g, r, s));
        goto out;
      }
    }
  }
  g->matched = true;
out:
  if (rc == -ENOMEM)
    efail(err, errlen, rc, "out of memory matching %" PRIu64 " messages", g->nsends);
  if (tab)
    for (uint32_t k = 0; k < ns; k++)
      free(tab[k]);
  free(tab);
  free(mask);
  free(dup);
  return rc;
}

/* An array for a run: on huge pages when large (the counters of thousands
 * of ranks are touched all over; 4 KiB pages would miss the TLB on nearly
 * every step). */
static void *run_alloc(size_t bytes) {
  void *p;
  if (bytes < (2u << 20))
    return malloc(bytes ? bytes : 1);
  if (posix_memalign(&p, 2u << 20, bytes))
    return NULL;
#ifdef MADV_HUGEPAGE
  madvise(p, bytes, MADV_HUGEPAGE);
#endif
  return p;
}

int sim_run_init(sim_run_t *u, sim_graph_t *g, int nq) {
  uint64_t total = 0;
  bool own = false;

  memset(u, 0, sizeof(*u));
  if (!(u->rank = malloc((size_t)nq * sizeof(*u->rank))))
    return -ENOMEM;
  /* in the steps only when no two ranks of the run share a shape: the end
   * marker's counter marks the shapes seen */
  for (int r = 0; r < nq; r++) {
    sim_shape_t *sh = &g->shapes[g->shape_of[r]];
    own = own || sh->steps[sh->nsteps].cnt == 1;
    sh->steps[sh->nsteps].cnt = 1;
    total += sh->nsteps;
  }
  for (int r = 0; r < nq; r++)
    g->shapes[g->shape_of[r]].steps[g->shapes[g->shape_of[r]].nsteps].cnt = 0;
  if (own && !(u->own = run_alloc(total * sizeof(*u->own)))) {
    free(u->rank);
    u->rank = NULL;
    return -ENOMEM;
  }
  u->stride = own ? 1 : sizeof(sim_step_t) / sizeof(uint32_t);
  total = 0;
  for (int r = 0; r < nq; r++) {
    sim_shape_t *sh = &g->shapes[g->shape_of[r]];
    sim_view_t *v = &u->rank[r];
    v->steps = sh->steps;
    v->succ = sh->succ;
    v->cnt = own ? u->own + total : &sh->steps[0].cnt;
    total += sh->nsteps;
    for (uint32_t i = 0; i < sh->nsteps; i++)
      v->cnt[i * u->stride] = 0;
    for (uint32_t k = 0; k < sh->nedges; k++)
      v->cnt[sh->succ[k] * u->stride]++;
  }
  return 0;
}

void sim_run_fini(sim_run_t *u) {
  free(u->rank);
  free(u->own);
  memset(u, 0, sizeof(*u));
}

/* ---- the virtual clock ---- */

#define VC_POSTED (UINT32_MAX - 1)  /* ready, waiting for its mate */
#define VC_RUNNING (UINT32_MAX - 2) /* its end is in the event queue */
#define VC_AHEAD 6                  /* events prefetched ahead (vc_prefetch) */

/* The event queue. Events end in order of time, ties in the order they were
 * scheduled. Events bunch on few times (a ring of 4096 ranks keeps about
 * 4000 pending on 9 times), so the queue is a heap of times, each with a
 * FIFO of its events: a pop is O(1) but for the first event of a time, and
 * the next events are known, so their counters are loaded ahead. */
typedef struct {
  uint32_t rank, step;
} vc_event_t;

typedef struct {
  double t;
  vc_event_t *ev; /* FIFO: ev[head .. n) */
  size_t head, n, cap;
} vc_time_t;

typedef struct {
  sim_graph_t *g;
  const int *host; /* NULL: one host */
  const sim_model_t *m;
  sim_run_t c;                              /* counters: dependencies left, or VC_* / DONE */
  double *send_free, *recv_free, *cpu_free; /* per rank: when each resource is free */
  vc_time_t *times;                         /* [ntimes]: live and spare */
  uint32_t ntimes, cap_times;
  uint32_t *spare; /* free entries of times, nspare of them */
  uint32_t nspare;
  uint32_t *heap; /* live times by t; nheap of them */
  uint32_t nheap;
  uint32_t *by_t; /* live times by t's bits: UINT32_MAX empty; tmask + 1 slots */
  size_t tmask;
  uint64_t done;
} vclock_t;

static size_t t_slot(double t, size_t mask) {
  uint64_t k;
  memcpy(&k, &t, sizeof(k));
  return hash(k | 1, mask + 1);
}

static void heap_up(vclock_t *v, uint32_t i) {
  uint32_t x = v->heap[i];
  double t = v->times[x].t;
  while (i > 0) {
    uint32_t up = (i - 1) / 2;
    if (v->times[v->heap[up]].t <= t)
      break;
    v->heap[i] = v->heap[up];
    i = up;
  }
  v->heap[i] = x;
}

static void heap_pop(vclock_t *v) {
  uint32_t last = v->heap[--v->nheap], i = 0;
  double t = v->times[last].t;
  for (;;) {
    uint32_t c = 2 * i + 1;
    if (c >= v->nheap)
      break;
    if (c + 1 < v->nheap && v->times[v->heap[c + 1]].t < v->times[v->heap[c]].t)
      c++;
    if (v->times[v->heap[c]].t >= t)
      break;
    v->heap[i] = v->heap[c];
    i = c;
  }
  if (v->nheap)
    v->heap[i] = last;
}

/* by_t: linear probing, deletion by shifting the rest of the cluster back */
static int by_t_grow(vclock_t *v) {
  size_t cap = v->by_t ? (v->tmask + 1) * 2 : 64;
  uint32_t *n = malloc(cap * sizeof(*n));
  if (!n)
    return -ENOMEM;
  memset(n, 0xff, cap * sizeof(*n));
  for (uint32_t k = 0; k < v->nheap; k++) {
    size_t at = t_slot(v->times[v->heap[k]].t, cap - 1);
    while (n[at] != UINT32_MAX)
      at = (at + 1) & (cap - 1);
    n[at] = v->heap[k];
  }
  free(v->by_t);
  v->by_t = n;
  v->tmask = cap - 1;
  return 0;
}

static void by_t_del(vclock_t *v, double t) {
  size_t i = t_slot(t, v->tmask);
  while (v->times[v->by_t[i]].t != t)
    i = (i + 1) & v->tmask;
  v->by_t[i] = UINT32_MAX;
  for (size_t j = (i + 1) & v->tmask; v->by_t[j] != UINT32_MAX; j = (j + 1) & v->tmask) {
    size_t h = t_slot(v->times[v->by_t[j]].t, v->tmask);
    if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
      v->by_t[i] = v->by_t[j];
      v->by_t[j] = UINT32_MAX;
      i = j;
    }
  }
}

/* A new live time t, in *out. */
static int time_new(vclock_t *v, double t, uint32_t *out) {
  uint32_t x;
  int rc;

  if ((size_t)(v->nheap + 1) * 2 > v->tmask + 1 && (rc = by_t_grow(v)))
    return rc;
  if (v->nspare) {
    x = v->spare[--v->nspare];
  } else {
    /* times, spare and heap grow together: ntimes bounds all three */
    if (v->ntimes == v->cap_times) {
      uint32_t cap = v->cap_times ? v->cap_times * 2 : 16;
      vc_time_t *nt = realloc(v->times, cap * sizeof(*nt));
      if (!nt)
        return -ENOMEM;
      v->times = nt;
      uint32_t *ns = realloc(v->spare, cap * sizeof(*ns));
      if (!ns)
        return -ENOMEM;
      v->spare = ns;
      uint32_t *nh = realloc(v->heap, cap * sizeof(*nh));
      if (!nh)
        return -ENOMEM;
      v->heap = nh;
      v->cap_times = cap;
    }
    x = v->ntimes++;
    v->times[x] = (vc_time_t){0};
  }
  v->times[x].t = t;
  v->times[x].head = v->times[x].n = 0;
  size_t at = t_slot(t, v->tmask);
  while (v->by_t[at] != UINT32_MAX)
    at = (at + 1) & v->tmask;
  v->by_t[at] = x;
  v->heap[v->nheap++] = x;
  heap_up(v, v->nheap - 1);
  *out = x;
  return 0;
}

static int vc_push(vclock_t *v, double t, uint32_t rank, uint32_t step) {
  uint32_t x = UINT32_MAX;
  int rc;

  if (v->by_t)
    for (size_t at = t_slot(t, v->tmask); v->by_t[at] != UINT32_MAX; at = (at + 1) & v->tmask)
      if (v->times[v->by_t[at]].t == t) {
        x = v->by_t[at];
        break;
      }
  if (x == UINT32_MAX && (rc = time_new(v, t, &x)))
    return rc;
  vc_time_t *q = &v->times[x];
  if (q->n == q->cap) {
    size_t cap = q->cap ? q->cap * 2 : 64;
    vc_event_t *n = realloc(q->ev, cap * sizeof(*n));
    if (!n)
      return -ENOMEM;
    q->ev = n;
    q->cap = cap;
  }
  q->ev[q->n++] = (vc_event_t){rank, step};
  return 0;
}

/* The next event (v->nheap > 0), at *t. */
static vc_event_t vc_pop(vclock_t *v, double *t) {
  uint32_t x = v->heap[0];
  vc_time_t *q = &v->times[x];
  vc_event_t e = q->ev[q->head++];

  *t = q->t;
  if (q->head == q->n) {
    heap_pop(v);
    by_t_del(v, q->t);
    v->spare[v->nspare++] = x;
  }
  return e;
}

static void vc_free(vclock_t *v) {
  for (uint32_t x = 0; x < v->ntimes; x++)
    free(v->times[x].ev);
  free(v->times);
  free(v->spare);
  free(v->heap);
  free(v->by_t);
}

static double dmax(double a, double b) {
  return a > b ? a : b;
}

/* Step i of rank r has no dependencies left at time `now`. */
static int vc_ready(vclock_t *v, uint32_t r, uint32_t i, double now) {
  sim_graph_t *g = v->g;
  const sim_step_t *s = &v->c.rank[r].steps[i];
  const sim_model_t *m = v->m;
  double start, end;

  if (!is_comm(s->kind)) {
    double per_byte = s->kind == STEP_COPY ? m->copy_beta : m->gamma;
    start = dmax(now, v->cpu_free[r]);
    end = start + (double)s->bytes * per_byte;
    v->cpu_free[r] = end;
    *sim_counter(&v->c, r, i) = VC_RUNNING;
    return vc_push(v, end, r, i);
  }
  uint32_t p = (uint32_t)sim_graph_peer(g, (int)r, s);
  uint32_t *o = sim_counter(&v->c, p, sim_graph_mate(g, (int)r, i, (int)p));
  if (*o != VC_POSTED) {
    *sim_counter(&v->c, r, i) = VC_POSTED;
    return 0;
  }
  uint32_t src = s->kind == STEP_SEND ? r : p;
  uint32_t dst = s->kind == STEP_SEND ? p : r;
  int cls = v->host && v->host[src] != v->host[dst];
  start = dmax(now, dmax(v->send_free[src], v->recv_free[dst]));
  end = start + m->alpha[cls] + (double)s->bytes * m->beta[cls];
  v->send_free[src] = v->recv_free[dst] = end;
  *sim_counter(&v->c, r, i) = *o = VC_RUNNING;
  return vc_push(v, end, r, i);
}

static int vc_finish(vclock_t *v, uint32_t r, uint32_t i, double now) {
  const sim_view_t *w = &v->c.rank[r];
  const sim_step_t *s = &w->steps[i];
  uint32_t *cnt = w->cnt;
  const size_t stride = v->c.stride;
  int rc;

  cnt[i * stride] = DONE;
  v->done++;
  for (uint32_t k = s->succ; k < s[1].succ; k++) {
    uint32_t j = w->succ[k];
    if (--cnt[j * stride] == 0 && (rc = vc_ready(v, r, j, now)))
      return rc;
  }
  return 0;
}

/* Starts loading step i of rank r's counter and, for a SEND or RECV whose
 * mate is known, the mate's; returns the mate's rank, or -1. */
static int vc_prefetch_step(const vclock_t *v, uint32_t r, uint32_t i) {
  const sim_graph_t *g = v->g;
  const sim_step_t *s = &v->c.rank[r].steps[i];

  __builtin_prefetch(sim_counter(&v->c, r, i), 1);
  if (!is_comm(s->kind))
    return -1;
  int p = sim_graph_peer(g, (int)r, s);
  if (s->mate_of != g->shape_of[p])
    return -1;
  __builtin_prefetch(sim_counter(&v->c, (uint32_t)p, s->mate), 1);
  return p;
}

/* Starts loading the counters event e will touch: its own and its mate's,
 * their successors' and the successors' mates'. The counters of thousands
 * of ranks do not fit in cache, the order of events is the model's, and the
 * next few are known. */
static void vc_prefetch(const vclock_t *v, vc_event_t e) {
  int p = vc_prefetch_step(v, e.rank, e.step);

  for (int side = 0; side < 2 && (!side || p >= 0); side++) {
    uint32_t r = side ? (uint32_t)p : e.rank;
    uint32_t i = side ? v->c.rank[e.rank].steps[e.step].mate : e.step;
    const sim_view_t *w = &v->c.rank[r];
    for (uint32_t k = w->steps[i].succ; k < w->steps[i + 1].succ; k++)
      vc_prefetch_step(v, r, w->succ[k]);
  }
}

/* Bytes each rank sends within and across hosts, the busiest rank pair and
 * host pair: from the shapes' bytes per peer, per source so memory stays
 * O(ranks). */
static int sent_peer(const sim_graph_t *g, int r, const sim_sent_t *s) {
  sim_step_t t = {.peer = (int32_t)s->peer};
  return sim_graph_peer(g, r, &t);
}

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
    const sim_shape_t *sh = &g->shapes[g->shape_of[r]];
    uint64_t in = 0, out = 0;
    for (uint32_t k = 0; k < sh->nsent; k++) {
      int p = sent_peer(g, r, &sh->sent[k]);
      uint64_t b = sh->sent[k].bytes;
      if (host && host[p] != host[r])
        out += b;
      else
        in += b;
      if (b > res->link_bytes) {
        res->link_bytes = b;
        res->link_src = r;
        res->link_dst = p;
      }
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
      const int r = order[k];
      const sim_shape_t *sh = &g->shapes[g->shape_of[r]];
      for (uint32_t e = 0; e < sh->nsent; e++) {
        int p = sent_peer(g, r, &sh->sent[e]);
        if (host[p] == h)
          continue;
        if (!acc[host[p]])
          touched[nt++] = host[p];
        acc[host[p]] += sh->sent[e].bytes;
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
                     .gamma = 1.0 / 10e9,
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
  if (!v.send_free || !v.recv_free || !v.cpu_free || (rc = sim_run_init(&v.c, g, n))) {
    rc = -ENOMEM;
    goto out;
  }
  for (int r = 0; r < n; r++) {
    const sim_shape_t *sh = &g->shapes[g->shape_of[r]];
    for (uint32_t k = 0; k < sh->nroots; k++)
      if ((rc = vc_ready(&v, (uint32_t)r, sh->roots[k], 0.0)))
        goto out;
  }
  while (v.nheap) {
    double now;
    const vc_time_t *q = &v.times[v.heap[0]];
    if (q->head + VC_AHEAD < q->n)
      vc_prefetch(&v, q->ev[q->head + VC_AHEAD]);
    vc_event_t e = vc_pop(&v, &now);
    const sim_step_t *s = &v.c.rank[e.rank].steps[e.step];
    uint32_t last = e.rank;
    if (is_comm(s->kind)) {
      uint32_t pr = (uint32_t)sim_graph_peer(g, (int)e.rank, s);
      uint32_t pi = sim_graph_mate(g, (int)e.rank, e.step, (int)pr);
      if (s->kind == STEP_SEND)
        last = pr;
      if ((rc = vc_finish(&v, pr, pi, now)))
        goto out;
      res->messages++;
      res->bytes += s->bytes;
    }
    if ((rc = vc_finish(&v, e.rank, e.step, now)))
      goto out;
    if (now >= res->time) {
      res->time = now;
      res->last_rank = (int)last;
    }
  }
  res->steps = v.done;
  res->max_steps = g->max_steps;
  if (v.done < g->nsteps)
    for (int r = 0; r < n; r++) {
      const sim_shape_t *sh = &g->shapes[g->shape_of[r]];
      for (uint32_t i = 0; i < sh->nsteps; i++) {
        const sim_step_t *s = &sh->steps[i];
        if (*sim_counter(&v.c, (uint32_t)r, i) == DONE)
          continue;
        if (is_comm(s->kind))
          rc =
              efail(err, errlen, -EDEADLK,
                    "stuck: rank %d step %u (%s of message %u %s rank %d) never runs; %" PRIu64
                    " of %" PRIu64 " steps ran (a dependency cycle across ranks)",
                    r, i, plan_step_kind_str(s->kind), s->msg, s->kind == STEP_SEND ? "to" : "from",
                    sim_graph_peer(g, r, s), v.done, g->nsteps);
        else
          rc = efail(err, errlen, -EDEADLK,
                     "stuck: rank %d step %u (%s) never runs; %" PRIu64 " of %" PRIu64
                     " steps ran (a dependency cycle)",
                     r, i, plan_step_kind_str(s->kind), v.done, g->nsteps);
        goto out;
      }
    }
out:
  if (rc == -ENOMEM)
    efail(err, errlen, rc, "sim_time: out of memory");
  sim_run_fini(&v.c);
  free(v.send_free);
  free(v.recv_free);
  free(v.cpu_free);
  vc_free(&v);
  return rc;
}
