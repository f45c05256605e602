/*
 * algos.c - the algorithm table and helpers shared by algorithm files.
 */
#include <string.h>

#include "algos.h"

static const char *const coll_names[COLL_KIND_COUNT] = {
    "allreduce", "bcast",   "reduce", "allgather", "reduce_scatter", "alltoall", "gather",
    "scatter",   "barrier", "send",   "recv"};

const char *coll_kind_str(int coll) {
  return (unsigned)coll < COLL_KIND_COUNT ? coll_names[coll] : "?";
}

int coll_kind_parse(const char *name) {
  if (!name)
    return -1;
  for (int i = 0; i < COLL_KIND_COUNT; i++)
    if (!strcmp(name, coll_names[i]))
      return i;
  return -1;
}

/* Keep one line per algorithm; the first entry of a collective is its
 * fallback when selection has nothing better. */
const algo_desc_t algo_table[] = {
    {"ring", COLL_ALLREDUCE, algo_ring_allreduce, 0},
    {NULL, 0, NULL, 0},
};

const algo_desc_t *algo_find(coll_kind coll, const char *name) {
  for (const algo_desc_t *d = algo_table; d->name; d++)
    if (d->coll == coll && (!name || !strcmp(d->name, name)))
      return d;
  return NULL;
}

size_t algo_seg_count(size_t count, int n, int k) {
  return count / (size_t)n + ((size_t)k < count % (size_t)n ? 1 : 0);
}

size_t algo_seg_start(size_t count, int n, int k) {
  size_t base = count / (size_t)n, extra = count % (size_t)n;
  return (size_t)k * base + ((size_t)k < extra ? (size_t)k : extra);
}
