/*
 * dbtree_allreduce.c - double binary tree allreduce (as NCCL's trees).
 *
 * Two binary trees over all ranks each carry half of the vector: chunks are
 * reduced up to the tree's root and broadcast back down, chunk after chunk,
 * so both trees and all levels work at once.
 *
 * A tree is the in-order binary tree over positions 1..n: node v with
 * lowest set bit L has left child v - L/2 and, as right child, the first of
 * v + L/2, v + L/4, ... that is <= n; the root is the highest power of two
 * <= n. Odd positions are leaves.
 *
 *            4                 tree 0: rank = position - 1
 *        2       6             tree 1: rank = n - position (n even, mirror)
 *      1   3   5   7                   or position shifted by one (n odd)
 *
 * Mirroring (or shifting) makes most leaves of one tree interior nodes of
 * the other, so every rank sends and receives about as much in each.
 *
 * Per chunk at a node: receive the left child's partial into a scratch slot,
 * recv = left op own; receive the right child's, recv = recv op right (the
 * in-order of the positions); send recv up (a leaf sends its input: paced,
 * algo_pace); receive the final value from the
 * parent into recv; send it to the children. The root scales for AVG before
 * sending down. Each value is reduced on one rank and then copied.
 *
 * Steps are emitted chunk-major (chunk c: tree 0, tree 1), the same order on
 * every rank. Within a (chunk, tree) the steps follow the tree, up then
 * down; across them only scratch-slot reuse links steps, always to an
 * earlier one: no cycle can form.
 * Message numbers: ((tree * nch + c) * 3 + k), k = 0 up, 1 / 2 to the left /
 * right child.
 */
#include <errno.h>
#include <stdlib.h>

#include "algos.h"

#define DBT_SLOTS 8

/* Children (0 = none) of position v in the in-order tree over 1..n. */
static void dbt_kids(int v, int n, int *l, int *r) {
  int low = v & -v;
  *l = *r = 0;
  if (low == 1)
    return;
  *l = v - low / 2;
  for (int h = low / 2; h >= 1; h /= 2)
    if (v + h <= n) {
      *r = v + h;
      return;
    }
}

static int dbt_pos(int tree, int rank, int n) {
  if (tree == 0)
    return rank + 1;
  return n % 2 == 0 ? n - rank : (rank + 1) % n + 1;
}

static int dbt_rank(int tree, int pos, int n) {
  if (tree == 0)
    return pos - 1;
  return n % 2 == 0 ? n - pos : (pos + n - 2) % n;
}

typedef struct dbt_node {
  int up, kid[2]; /* ranks, -1 = none */
  int side;       /* which child of `up` this node is (1 left, 2 right) */
} dbt_node_t;

static void dbt_node(int tree, int rank, int n, dbt_node_t *nd) {
  int v = dbt_pos(tree, rank, n), l, r;
  dbt_kids(v, n, &l, &r);
  nd->kid[0] = l ? dbt_rank(tree, l, n) : -1;
  nd->kid[1] = r ? dbt_rank(tree, r, n) : -1;
  nd->up = -1;
  nd->side = 0;
  for (int u = 1; u <= n; u++) {
    dbt_kids(u, n, &l, &r);
    if (l == v || r == v) {
      nd->up = dbt_rank(tree, u, n);
      nd->side = l == v ? 1 : 2;
      break;
    }
  }
}

int algo_dbtree_allreduce(const algo_args_t *a, plan_t **out) {
  const int n = a->nranks, r = a->rank;
  const size_t count = a->count, es = chorus_dtype_size(a->dtype);
  const bool inplace = a->inplace;
  const uint8_t mine = inplace ? BUF_RECV : BUF_SEND;
  plan_builder_t b;
  int rc;

  *out = NULL;
  if ((rc = plan_build_begin(&b, "dbtree", r, n, count, a->dtype, a->op, inplace)))
    return rc;
  if (n == 1 || count == 0) {
    if (!inplace && count)
      plan_add(&b, &(plan_step_t){.kind = STEP_COPY,
                                  .bytes = count * es,
                                  .dst = {BUF_RECV, 0},
                                  .src = {BUF_SEND, 0}});
    return plan_build_end(&b, out);
  }

  const size_t ce = a->chunk_bytes / es ? a->chunk_bytes / es : 1;
  const size_t half = algo_seg_count(count, 2, 0);
  const uint32_t nch = (uint32_t)((half + ce - 1) / ce);
  if ((uint64_t)nch * 6 >= ALGO_MAX_MSGS) {
    b.err = -E2BIG;
    return plan_build_end(&b, out);
  }
  const size_t slot_bytes = (ce < half ? ce : half) * es;
  uint32_t slot_user[DBT_SLOTS], next_slot = 0;
  dbt_node_t nd[2];
  algo_pace_t pace[2]; /* per tree, a leaf's sends up (of its input) */

  b.plan->scratch_bytes = DBT_SLOTS * slot_bytes;
  for (int i = 0; i < DBT_SLOTS; i++)
    slot_user[i] = UINT32_MAX;
  dbt_node(0, r, n, &nd[0]);
  dbt_node(1, r, n, &nd[1]);
  algo_pace_init(&pace[0]);
  algo_pace_init(&pace[1]);

  for (uint32_t c = 0; c < nch; c++)
    for (int t = 0; t < 2; t++) {
      const size_t len = algo_seg_count(count, 2, t), cs = (size_t)c * ce;
      if (cs >= len)
        continue;
      const size_t bytes = (len - cs < ce ? len - cs : ce) * es;
      const size_t off = (algo_seg_start(count, 2, t) + cs) * es;
      const uint32_t msg = ((uint32_t)t * nch + c) * 3;
      const dbt_node_t *d = &nd[t];
      uint8_t val = mine;
      uint32_t last = UINT32_MAX;

      for (int k = 0; k < 2; k++) {
        if (d->kid[k] < 0)
          continue;
        uint32_t slot = next_slot++ % DBT_SLOTS;
        size_t soff = (size_t)slot * slot_bytes;
        uint32_t v = plan_add(&b, &(plan_step_t){.kind = STEP_RECV,
                                                 .peer = d->kid[k],
                                                 .msg = ((uint32_t)t * nch + c) * 3,
                                                 .bytes = bytes,
                                                 .dst = {BUF_SCRATCH, soff}});
        plan_dep(&b, slot_user[slot], v);
        plan_ref_t kid = {BUF_SCRATCH, soff}, own = {val, off};
        uint32_t red = plan_add(&b, &(plan_step_t){.kind = STEP_REDUCE,
                                                   .bytes = bytes,
                                                   .dst = {BUF_RECV, off},
                                                   .src = k == 0 ? kid : own,
                                                   .src2 = k == 0 ? own : kid});
        plan_dep(&b, v, red);
        plan_dep(&b, last, red);
        slot_user[slot] = red;
        last = red;
        val = BUF_RECV;
      }
      if (d->up >= 0) {
        uint32_t s = plan_add(
            &b,
            &(plan_step_t){
                .kind = STEP_SEND, .peer = d->up, .msg = msg, .bytes = bytes, .src = {val, off}});
        if (last == UINT32_MAX)
          algo_pace(&b, &pace[t], s);
        else
          plan_dep(&b, last, s);
        last = plan_add(&b, &(plan_step_t){.kind = STEP_RECV,
                                           .peer = d->up,
                                           .msg = msg + (uint32_t)d->side,
                                           .bytes = bytes,
                                           .dst = {BUF_RECV, off}});
        plan_dep(&b, s, last); /* the final value overwrites what went up */
      } else if (a->op == CHORUS_AVG) {
        uint32_t sc = plan_add(
            &b, &(plan_step_t){.kind = STEP_SCALE, .bytes = bytes, .dst = {BUF_RECV, off}});
        plan_dep(&b, last, sc);
        last = sc;
      }
      for (int k = 0; k < 2; k++) {
        if (d->kid[k] < 0)
          continue;
        uint32_t s = plan_add(&b, &(plan_step_t){.kind = STEP_SEND,
                                                 .peer = d->kid[k],
                                                 .msg = msg + 1 + (uint32_t)k,
                                                 .bytes = bytes,
                                                 .src = {BUF_RECV, off}});
        plan_dep(&b, last, s);
      }
    }
  return plan_build_end(&b, out);
}
