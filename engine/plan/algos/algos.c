/*
 * algos.c - the algorithm table and the names of the collectives. The
 * helpers the algorithm files share are in steps.c (so that the table,
 * which calls every builder, is called by none of them).
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
    {"rd", COLL_ALLREDUCE, algo_rd_allreduce, 0},
    {"rhd", COLL_ALLREDUCE, algo_rhd_allreduce, 0},
    {"dbtree", COLL_ALLREDUCE, algo_dbtree_allreduce, 0},
    {"hier", COLL_ALLREDUCE, algo_hier_allreduce, ALGO_HIERARCHICAL},
    {"tree", COLL_BCAST, algo_tree_bcast, 0},
    {"chain", COLL_BCAST, algo_chain_bcast, 0},
    {"ring", COLL_BCAST, algo_ring_bcast, 0},
    {"hier", COLL_BCAST, algo_hier_bcast, ALGO_HIERARCHICAL},
    {"linear", COLL_BCAST, algo_linear_bcast, 0},
    {"tree", COLL_REDUCE, algo_tree_reduce, 0},
    {"chain", COLL_REDUCE, algo_chain_reduce, 0},
    {"ring", COLL_REDUCE, algo_ring_reduce, 0},
    {"ring", COLL_ALLGATHER, algo_ring_allgather, 0},
    {"bruck", COLL_ALLGATHER, algo_bruck_allgather, 0},
    {"rd", COLL_ALLGATHER, algo_rd_allgather, 0},
    {"direct", COLL_ALLGATHER, algo_direct_allgather, 0},
    {"hier", COLL_ALLGATHER, algo_hier_allgather, ALGO_HIERARCHICAL},
    {"ring", COLL_REDUCE_SCATTER, algo_ring_reduce_scatter, 0},
    {"rhd", COLL_REDUCE_SCATTER, algo_rhd_reduce_scatter, 0},
    {"pairwise", COLL_ALLTOALL, algo_pairwise_alltoall, 0},
    {"bruck", COLL_ALLTOALL, algo_bruck_alltoall, 0},
    {"tree", COLL_GATHER, algo_tree_gather, 0},
    {"linear", COLL_GATHER, algo_linear_gather, 0},
    {"tree", COLL_SCATTER, algo_tree_scatter, 0},
    {"linear", COLL_SCATTER, algo_linear_scatter, 0},
    {"dissemination", COLL_BARRIER, algo_dissemination_barrier, 0},
    {"p2p", COLL_SEND, algo_p2p, 0},
    {"p2p", COLL_RECV, algo_p2p, 0},
    {NULL, 0, NULL, 0},
};

const algo_desc_t *algo_find(coll_kind coll, const char *name) {
  for (const algo_desc_t *d = algo_table; d->name; d++)
    if (d->coll == coll && (!name || !strcmp(d->name, name)))
      return d;
  return NULL;
}
