/*
 * plan.c - building step graphs.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

const char *plan_step_kind_str(int kind) {
  static const char *const n[STEP_KIND_COUNT] = {"SEND", "RECV", "REDUCE", "COPY", "SCALE"};
  return (unsigned)kind < STEP_KIND_COUNT ? n[kind] : "?";
}

const char *plan_buf_str(int buf) {
  static const char *const n[BUF_COUNT] = {"send", "recv", "scratch"};
  return (unsigned)buf < BUF_COUNT ? n[buf] : "?";
}

int plan_build_begin(plan_builder_t *b, const char *algo, int rank, int nranks, size_t count,
                     chorus_dtype dtype, chorus_op op, bool inplace) {
  memset(b, 0, sizeof(*b));
  b->plan = calloc(1, sizeof(*b->plan));
  if (!b->plan)
    return -ENOMEM;
  b->plan->algo = algo;
  b->plan->rank = rank;
  b->plan->nranks = nranks;
  b->plan->count = count;
  b->plan->dtype = dtype;
  b->plan->op = op;
  b->plan->inplace = inplace;
  return 0;
}

uint32_t plan_add(plan_builder_t *b, const plan_step_t *s) {
  plan_t *p = b->plan;

  if (b->err)
    return UINT32_MAX;
  if (p->nsteps == b->cap_steps) {
    uint32_t ncap = b->cap_steps ? b->cap_steps * 2 : 64;
    plan_step_t *n = realloc(p->steps, ncap * sizeof(*n));
    if (!n) {
      b->err = -ENOMEM;
      return UINT32_MAX;
    }
    p->steps = n;
    b->cap_steps = ncap;
  }
  p->steps[p->nsteps] = *s;
  p->steps[p->nsteps].ndeps = 0;
  p->steps[p->nsteps].nsucc = 0;
  if (s->kind == STEP_SEND && s->msg >= p->nmsgs)
    p->nmsgs = s->msg + 1;
  return p->nsteps++;
}

void plan_dep(plan_builder_t *b, uint32_t from, uint32_t to) {
  if (b->err || from == UINT32_MAX || to == UINT32_MAX)
    return;
  if (b->nedges == b->cap_edges) {
    size_t ncap = b->cap_edges ? b->cap_edges * 2 : 128;
    void *n = realloc(b->edges, ncap * sizeof(*b->edges));
    if (!n) {
      b->err = -ENOMEM;
      return;
    }
    b->edges = n;
    b->cap_edges = ncap;
  }
  b->edges[b->nedges][0] = from;
  b->edges[b->nedges][1] = to;
  b->nedges++;
}

int plan_build_end(plan_builder_t *b, plan_t **out) {
  plan_t *p = b->plan;
  int rc = b->err;

  *out = NULL;
  if (rc)
    goto out_free;
  p->succ = malloc((b->nedges ? b->nedges : 1) * sizeof(*p->succ));
  if (!p->succ) {
    rc = -ENOMEM;
    goto out_free;
  }
  for (size_t e = 0; e < b->nedges; e++) {
    p->steps[b->edges[e][0]].nsucc++;
    p->steps[b->edges[e][1]].ndeps++;
  }
  uint32_t off = 0;
  for (uint32_t i = 0; i < p->nsteps; i++) {
    p->steps[i].succ_off = off;
    off += p->steps[i].nsucc;
    p->steps[i].nsucc = 0;
  }
  for (size_t e = 0; e < b->nedges; e++) {
    plan_step_t *s = &p->steps[b->edges[e][0]];
    p->succ[s->succ_off + s->nsucc++] = b->edges[e][1];
  }
  free(b->edges);
  b->edges = NULL;
  /* Scratch is what the steps reach. Algorithms declare room for their
   * slots; a plan with fewer receives than slots touches only some (a
   * 2-rank 2 MiB ring allreduce in 1 MiB chunks: one of eight 1 MiB slots),
   * and scratch past CHORUS_BUFFSIZE is allocated, and faulted in, anew by
   * every call. Never grown: a step past the declared room stays an error
   * for the plan's checks. */
  size_t used = plan_extent(p, BUF_SCRATCH);
  if (used < p->scratch_bytes)
    p->scratch_bytes = used;
  if ((rc = plan_pair_up(p)))
    goto out_free;
  *out = p;
  b->plan = NULL;
  return 0;

out_free:
  free(b->edges);
  b->edges = NULL;
  plan_free(p);
  b->plan = NULL;
  return rc;
}

void plan_free(plan_t *p) {
  if (!p)
    return;
  free(p->steps);
  free(p->succ);
  free(p->pairs);
  free(p->pair_of);
  free(p);
}

typedef struct {
  uint64_t key; /* kind (send 0, recv 1) | peer | message */
  uint32_t i;
} pair_key_t;

static int cmp_pair_key(const void *a, const void *b) {
  const pair_key_t *x = a, *y = b;
  if (x->key != y->key)
    return x->key < y->key ? -1 : 1;
  return x->i < y->i ? -1 : x->i > y->i;
}

static uint64_t pair_key(uint8_t kind, int peer, uint32_t msg) {
  return ((uint64_t)(kind == STEP_RECV) << 56) | ((uint64_t)(uint32_t)peer << 24) |
         (msg & 0xffffffu);
}

int plan_pair_up(plan_t *p) {
  uint32_t n = 0, np = 0;
  pair_key_t *v = malloc(((size_t)p->nsteps + 1) * sizeof(*v));
  uint32_t *of = malloc(((size_t)p->nsteps * 2 + 1) * sizeof(*of));
  plan_pair_t *pairs = NULL;

  if (!v || !of)
    goto nomem;
  for (uint32_t i = 0; i < p->nsteps; i++) {
    const plan_step_t *s = &p->steps[i];
    of[i] = of[p->nsteps + i] = UINT32_MAX;
    if (s->kind == STEP_SEND || s->kind == STEP_RECV)
      v[n++] = (pair_key_t){pair_key(s->kind, s->peer, s->msg), i};
  }
  qsort(v, n, sizeof(*v), cmp_pair_key);
  for (uint32_t j = 0; j < n; j++)
    if (j == 0 || v[j].key >> 24 != v[j - 1].key >> 24)
      np++;
  if (!(pairs = malloc((np ? np : 1) * sizeof(*pairs))))
    goto nomem;
  np = 0;
  for (uint32_t j = 0; j < n; j++) {
    const plan_step_t *s = &p->steps[v[j].i];
    if (j == 0 || v[j].key >> 24 != v[j - 1].key >> 24)
      pairs[np++] = (plan_pair_t){.kind = s->kind, .peer = s->peer, .first = v[j].i};
    else
      of[p->nsteps + v[j - 1].i] = v[j].i;
    of[v[j].i] = np - 1;
  }
  free(v);
  free(p->pairs);
  free(p->pair_of);
  p->pairs = pairs;
  p->npairs = np;
  p->pair_of = of;
  p->pair_next = of + p->nsteps;
  return 0;

nomem:
  free(v);
  free(of);
  free(pairs);
  return -ENOMEM;
}

uint32_t plan_find_pair(const plan_t *p, uint8_t kind, int peer) {
  uint32_t lo = 0, hi = p->npairs;
  uint64_t key = pair_key(kind, peer, 0) >> 24;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    const plan_pair_t *q = &p->pairs[mid];
    uint64_t k = pair_key(q->kind, q->peer, 0) >> 24;
    if (k == key)
      return mid;
    if (k < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return UINT32_MAX;
}

int plan_step_refs(const plan_step_t *s, plan_ref_t refs[3]) {
  switch (s->kind) {
  case STEP_SEND:
    refs[0] = s->src;
    return 1;
  case STEP_RECV:
  case STEP_SCALE:
    refs[0] = s->dst;
    return 1;
  case STEP_COPY:
    refs[0] = s->dst;
    refs[1] = s->src;
    return 2;
  case STEP_REDUCE:
    refs[0] = s->dst;
    refs[1] = s->src;
    refs[2] = s->src2;
    return 3;
  default:
    return 0;
  }
}

size_t plan_extent(const plan_t *p, uint32_t buf) {
  size_t ext = 0;
  plan_ref_t refs[3];

  for (uint32_t i = 0; i < p->nsteps; i++) {
    int n = plan_step_refs(&p->steps[i], refs);
    for (int k = 0; k < n; k++)
      if (refs[k].buf == buf && p->steps[i].bytes && refs[k].off + p->steps[i].bytes > ext)
        ext = refs[k].off + p->steps[i].bytes;
  }
  return ext;
}

static plan_ref_t remap(plan_ref_t r, const plan_ref_t map[BUF_COUNT]) {
  plan_ref_t m = map[r.buf < BUF_COUNT ? r.buf : 0];
  return (plan_ref_t){.buf = m.buf, .off = m.off + r.off};
}

uint32_t plan_append(plan_builder_t *b, const plan_t *sub, const plan_ref_t map[BUF_COUNT],
                     uint32_t msg_off) {
  uint32_t base = b->plan ? b->plan->nsteps : 0;

  if (b->err)
    return UINT32_MAX;
  for (uint32_t i = 0; i < sub->nsteps; i++) {
    const plan_step_t *s = &sub->steps[i];
    if (s->kind >= STEP_KIND_COUNT || s->src.buf >= BUF_COUNT || s->dst.buf >= BUF_COUNT ||
        s->src2.buf >= BUF_COUNT) {
      b->err = -EINVAL;
      return UINT32_MAX;
    }
    plan_step_t t = *s;
    t.src = remap(s->src, map);
    t.src2 = remap(s->src2, map);
    t.dst = remap(s->dst, map);
    if (s->kind == STEP_SEND || s->kind == STEP_RECV)
      t.msg = s->msg + msg_off;
    if (plan_add(b, &t) == UINT32_MAX)
      return UINT32_MAX;
  }
  for (uint32_t i = 0; i < sub->nsteps; i++)
    for (uint32_t k = 0; k < sub->steps[i].nsucc; k++)
      plan_dep(b, base + i, base + sub->succ[sub->steps[i].succ_off + k]);
  return b->err ? UINT32_MAX : base;
}
