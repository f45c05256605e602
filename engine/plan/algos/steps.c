/*
 * steps.c - helpers the algorithm files share: segments of a count, the
 * opening steps of block and broadcast algorithms, dependency tracking over
 * a buffer's cells, and pacing of sends (see algos.h).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "algos.h"

size_t algo_seg_count(size_t count, int n, int k) {
  return count / (size_t)n + ((size_t)k < count % (size_t)n ? 1 : 0);
}

size_t algo_seg_start(size_t count, int n, int k) {
  size_t base = count / (size_t)n, extra = count % (size_t)n;
  return (size_t)k * base + ((size_t)k < extra ? (size_t)k : extra);
}

int algo_blocks_begin(const algo_args_t *a, const char *name, plan_builder_t *b, algo_blocks_t *k) {
  const int n = a->nranks, r = a->rank;
  const size_t es = chorus_dtype_size(a->dtype);

  if (n <= 0 || r < 0 || r >= n || !es)
    return -EINVAL;
  if (a->count > SIZE_MAX / es / (size_t)n)
    return -E2BIG;
  k->bytes = a->count * es;
  k->unit = algo_chunk_unit(a->chunk_bytes, es);
  k->nch = algo_npieces(k->bytes, k->unit);
  if (k->nch && k->nch > ALGO_MAX_MSGS / (size_t)n)
    return -E2BIG;
  return plan_build_begin(b, name, r, n, a->count, a->dtype, a->op, a->inplace);
}

bool algo_bcast_begin(const algo_args_t *a, const char *name, plan_builder_t *b, plan_t **out,
                      int *rc) {
  *out = NULL;
  if ((*rc = plan_build_begin(b, name, a->rank, a->nranks, a->count, a->dtype, a->op, a->inplace)))
    return true;
  if (a->count && a->rank == a->root && !a->inplace)
    plan_add(b, &(plan_step_t){.kind = STEP_COPY,
                               .bytes = a->count * chorus_dtype_size(a->dtype),
                               .dst = {BUF_RECV, 0},
                               .src = {BUF_SEND, 0}});
  if (a->count == 0 || a->nranks == 1) {
    *rc = plan_build_end(b, out);
    return true;
  }
  return false;
}

uint32_t algo_allgather_own(plan_builder_t *b, const algo_args_t *a, size_t block) {
  if (a->inplace || a->own_placed)
    return UINT32_MAX;
  plan_step_t cp = {.kind = STEP_COPY,
                    .bytes = block,
                    .dst = {BUF_RECV, (size_t)a->rank * block},
                    .src = {BUF_SEND, 0}};
  return plan_add(b, &cp);
}

int algo_track_init(algo_track_t *t, size_t bytes, size_t cell) {
  memset(t, 0, sizeof(*t));
  t->cell = cell;
  t->ncells = algo_npieces(bytes, cell);
  if (!t->ncells)
    return 0;
  t->w = calloc(t->ncells, sizeof(*t->w));
  t->n = calloc(t->ncells, sizeof(*t->n));
  t->cap = calloc(t->ncells, sizeof(*t->cap));
  if (!t->w || !t->n || !t->cap) {
    algo_track_free(t);
    return -ENOMEM;
  }
  return 0;
}

void algo_track_free(algo_track_t *t) {
  if (t->w)
    for (size_t i = 0; i < t->ncells; i++)
      free(t->w[i]);
  free(t->w);
  free(t->n);
  free(t->cap);
  memset(t, 0, sizeof(*t));
}

void algo_track_deps(const algo_track_t *t, plan_builder_t *b, size_t off, size_t bytes,
                     uint32_t to) {
  if (!bytes || to == UINT32_MAX)
    return;
  for (size_t c = off / t->cell; c <= (off + bytes - 1) / t->cell && c < t->ncells; c++)
    for (uint32_t i = 0; i < t->n[c]; i++)
      plan_dep(b, t->w[c][i], to);
}

void algo_track_write(algo_track_t *t, plan_builder_t *b, size_t off, size_t bytes, uint32_t step) {
  if (!bytes || step == UINT32_MAX)
    return;
  for (size_t c = off / t->cell; c <= (off + bytes - 1) / t->cell && c < t->ncells; c++) {
    size_t lo = c * t->cell, hi = lo + t->cell;
    if (off <= lo && off + bytes >= hi)
      t->n[c] = 0;
    if (t->n[c] == t->cap[c]) {
      uint32_t ncap = t->cap[c] ? t->cap[c] * 2 : 2;
      uint32_t *w = realloc(t->w[c], ncap * sizeof(*w));
      if (!w) {
        b->err = -ENOMEM;
        return;
      }
      t->w[c] = w;
      t->cap[c] = ncap;
    }
    t->w[c][t->n[c]++] = step;
  }
}

void algo_pace_init(algo_pace_t *p) {
  for (int i = 0; i < ALGO_PACE; i++)
    p->last[i] = UINT32_MAX;
  p->n = 0;
}

void algo_pace(plan_builder_t *b, algo_pace_t *p, uint32_t send) {
  uint32_t k = p->n++ % ALGO_PACE;

  plan_dep(b, p->last[k], send);
  p->last[k] = send;
}
