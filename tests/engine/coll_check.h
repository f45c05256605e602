/*
 * coll_check.h - every collective run against its reference, shared by the
 * in-process and the multi-process tests.
 *
 * Non-reducing collectives move values gen(rank, block, i): small integers
 * (<= 97), exact in every dtype, different per source rank and block, so a
 * block delivered to the wrong place is caught. Reducing ones use check.h's
 * inputs and exact references. Buffers a rank ignores (the root-only ones)
 * are NULL in out-of-place cases and a filled sentinel in in-place cases,
 * which must come back untouched.
 *
 * The sweep iterates algo_table, so a new algorithm is covered as soon as it
 * is registered; each call is forced onto it with eng_comm_set_algo and
 * chorus_comm_last_algorithm must name it.
 */
#ifndef CHORUS_TEST_COLL_CHECK_H
#define CHORUS_TEST_COLL_CHECK_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algos/algos.h"
#include "check.h"
#include "chorus.h"
#include "comm.h"

#define CC_SENTINEL 0xA5

static inline double cc_gen(int rank, int blk, size_t i) {
  return (double)(1 + (rank * 13 + blk * 5 + (int)(i % 1009) * 3) % 97);
}

/* One call: its parameters, buffers and the pointers passed. */
typedef struct cc_case {
  int coll; /* coll_kind (not SEND/RECV) */
  const char *algo;
  int rank, n, root;
  size_t count;
  chorus_dtype dt;
  chorus_op op;
  bool inplace;
  size_t es, sn, rn; /* element size, elements of sbuf and rbuf */
  uint8_t *sbuf, *rbuf;
  const void *sp; /* what is passed */
  void *rp;
  bool send_ignored, recv_ignored;
  chorus_request_t *req;
} cc_case_t;

static inline bool cc_reduces(int coll) {
  return coll == COLL_ALLREDUCE || coll == COLL_REDUCE || coll == COLL_REDUCE_SCATTER;
}

static inline bool cc_rooted(int coll) {
  return coll == COLL_BCAST || coll == COLL_REDUCE || coll == COLL_GATHER || coll == COLL_SCATTER;
}

static inline bool cc_has_inplace(int coll) {
  return coll != COLL_ALLTOALL && coll != COLL_BARRIER;
}

static inline void cc_set(void *buf, size_t i, chorus_dtype dt, double v) {
  chk_set(buf, i, dt, v);
}

/* Allocates and fills the buffers, sets the pointers. 0 or -1. */
static inline int cc_setup(cc_case_t *k) {
  const size_t c = k->count, n = (size_t)k->n;
  const bool root = k->rank == k->root;

  k->es = chorus_dtype_size(k->dt);
  switch (k->coll) {
  case COLL_ALLGATHER:
  case COLL_GATHER:
    k->sn = c, k->rn = n * c;
    break;
  case COLL_REDUCE_SCATTER:
  case COLL_SCATTER:
    k->sn = n * c, k->rn = c;
    break;
  case COLL_ALLTOALL:
    k->sn = n * c, k->rn = n * c;
    break;
  case COLL_BARRIER:
    k->sn = k->rn = 0;
    break;
  default:
    k->sn = c, k->rn = c;
    break;
  }
  k->sbuf = malloc(k->sn * k->es + 16);
  k->rbuf = malloc(k->rn * k->es + 16);
  if (!k->sbuf || !k->rbuf)
    return -1;
  memset(k->sbuf, CC_SENTINEL, k->sn * k->es + 16);
  memset(k->rbuf, CC_SENTINEL, k->rn * k->es + 16);
  k->send_ignored = (k->coll == COLL_BCAST || k->coll == COLL_SCATTER) && !root;
  k->recv_ignored = (k->coll == COLL_REDUCE || k->coll == COLL_GATHER) && !root;
  switch (k->coll) {
  case COLL_ALLREDUCE:
  case COLL_REDUCE:
  case COLL_REDUCE_SCATTER:
    chk_fill(k->sbuf, k->sn, k->dt, k->op, k->rank);
    break;
  case COLL_BCAST:
    if (root)
      for (size_t i = 0; i < c; i++)
        cc_set(k->sbuf, i, k->dt, cc_gen(k->root, 0, i));
    break;
  case COLL_ALLGATHER:
  case COLL_GATHER:
    for (size_t i = 0; i < c; i++)
      cc_set(k->sbuf, i, k->dt, cc_gen(k->rank, 0, i));
    break;
  case COLL_ALLTOALL:
    for (size_t p = 0; p < n; p++)
      for (size_t i = 0; i < c; i++)
        cc_set(k->sbuf, p * c + i, k->dt, cc_gen(k->rank, (int)p, i));
    break;
  case COLL_SCATTER:
    if (root)
      for (size_t p = 0; p < n; p++)
        for (size_t i = 0; i < c; i++)
          cc_set(k->sbuf, p * c + i, k->dt, cc_gen(k->root, (int)p, i));
    break;
  default:
    break;
  }
  k->sp = k->sbuf;
  k->rp = k->rbuf;
  if (!k->inplace) {
    /* ignored buffers: NULL */
    if (k->send_ignored)
      k->sp = NULL;
    if (k->recv_ignored)
      k->rp = NULL;
    return 0;
  }
  /* in place: the documented forms; ignored buffers stay sentinels */
  const size_t blk = c * k->es;
  switch (k->coll) {
  case COLL_ALLREDUCE:
  case COLL_REDUCE:
    k->rp = k->sbuf; /* off the root of a reduce: recvbuf is ignored, sendbuf intact */
    break;
  case COLL_BCAST:
    if (root)
      k->rp = k->sbuf;
    break;
  case COLL_ALLGATHER:
    for (size_t i = 0; i < c; i++)
      cc_set(k->rbuf, (size_t)k->rank * c + i, k->dt, cc_gen(k->rank, 0, i));
    k->sp = k->rbuf + (size_t)k->rank * blk;
    break;
  case COLL_REDUCE_SCATTER:
    k->rp = k->sbuf + (size_t)k->rank * blk;
    break;
  case COLL_GATHER:
    if (root) {
      for (size_t i = 0; i < c; i++)
        cc_set(k->rbuf, (size_t)k->root * c + i, k->dt, cc_gen(k->root, 0, i));
      k->sp = k->rbuf + (size_t)k->root * blk;
    }
    break;
  case COLL_SCATTER:
    if (root)
      k->rp = k->sbuf + (size_t)k->root * blk;
    break;
  default:
    break;
  }
  return 0;
}

/* Issues the call, blocking (nb false) or not (k->req set). */
static inline chorus_result cc_start(chorus_comm_t *c, cc_case_t *k, bool nb) {
  chorus_request_t **rq = nb ? &k->req : NULL;
  switch (k->coll) {
  case COLL_ALLREDUCE:
    return nb ? chorus_iallreduce(c, k->sp, k->rp, k->count, k->dt, k->op, rq)
              : chorus_allreduce(c, k->sp, k->rp, k->count, k->dt, k->op);
  case COLL_BCAST:
    return nb ? chorus_ibcast(c, k->sp, k->rp, k->count, k->dt, k->root, rq)
              : chorus_bcast(c, k->sp, k->rp, k->count, k->dt, k->root);
  case COLL_REDUCE:
    return nb ? chorus_ireduce(c, k->sp, k->rp, k->count, k->dt, k->op, k->root, rq)
              : chorus_reduce(c, k->sp, k->rp, k->count, k->dt, k->op, k->root);
  case COLL_ALLGATHER:
    return nb ? chorus_iallgather(c, k->sp, k->rp, k->count, k->dt, rq)
              : chorus_allgather(c, k->sp, k->rp, k->count, k->dt);
  case COLL_REDUCE_SCATTER:
    return nb ? chorus_ireduce_scatter(c, k->sp, k->rp, k->count, k->dt, k->op, rq)
              : chorus_reduce_scatter(c, k->sp, k->rp, k->count, k->dt, k->op);
  case COLL_ALLTOALL:
    return nb ? chorus_ialltoall(c, k->sp, k->rp, k->count, k->dt, rq)
              : chorus_alltoall(c, k->sp, k->rp, k->count, k->dt);
  case COLL_GATHER:
    return nb ? chorus_igather(c, k->sp, k->rp, k->count, k->dt, k->root, rq)
              : chorus_gather(c, k->sp, k->rp, k->count, k->dt, k->root);
  case COLL_SCATTER:
    return nb ? chorus_iscatter(c, k->sp, k->rp, k->count, k->dt, k->root, rq)
              : chorus_scatter(c, k->sp, k->rp, k->count, k->dt, k->root);
  case COLL_BARRIER:
    return nb ? chorus_ibarrier(c, rq) : chorus_barrier(c);
  default:
    return CHORUS_ERR_INTERNAL;
  }
}

static inline bool cc_untouched(const uint8_t *p, size_t bytes) {
  for (size_t i = 0; i < bytes; i++)
    if (p[i] != CC_SENTINEL)
      return false;
  return true;
}

static inline size_t cc_expect_gen(const cc_case_t *k, const void *buf, size_t nblk, int srcfix,
                                   int blkfix, const char *what) {
  size_t wrong = 0;
  for (size_t b = 0; b < nblk; b++)
    for (size_t i = 0; i < k->count; i++) {
      int src = srcfix >= 0 ? srcfix : (int)b, blk = blkfix >= 0 ? blkfix : (int)b;
      double got = chk_get(buf, b * k->count + i, k->dt), want = cc_gen(src, blk, i);
      if (got != want) {
        if (!wrong)
          fprintf(stderr, "rank %d n=%d %s/%s %s root %d count %zu%s: [%zu] = %g, want %g\n",
                  k->rank, k->n, coll_kind_str(k->coll), k->algo, chorus_dtype_name(k->dt), k->root,
                  k->count, k->inplace ? " in place" : "", b * k->count + i, got, want);
        wrong++;
      }
    }
  (void)what;
  return wrong;
}

static inline size_t cc_expect_red(const cc_case_t *k, const void *buf, size_t base) {
  size_t wrong = 0;
  for (size_t i = 0; i < k->count; i++) {
    double got = chk_get(buf, i, k->dt), want = chk_expect(base + i, k->dt, k->op, k->n);
    if (memcmp(&got, &want, sizeof(got)) != 0) {
      if (!wrong)
        fprintf(stderr, "rank %d n=%d %s/%s %s/%s root %d count %zu%s: [%zu] = %g, want %g\n",
                k->rank, k->n, coll_kind_str(k->coll), k->algo, chorus_dtype_name(k->dt),
                chorus_op_name(k->op), k->root, k->count, k->inplace ? " in place" : "", i, got,
                want);
      wrong++;
    }
  }
  return wrong;
}

/* Checks the results and frees the buffers; returns the number of wrong
 * elements (+1 for a touched ignored buffer). */
static inline size_t cc_check(cc_case_t *k) {
  const size_t c = k->count, n = (size_t)k->n, blk = c * k->es;
  const bool root = k->rank == k->root;
  size_t bad = 0;

  switch (k->coll) {
  case COLL_ALLREDUCE:
    bad = cc_expect_red(k, k->rp, 0);
    break;
  case COLL_REDUCE:
    if (root) {
      bad = cc_expect_red(k, k->rp, 0);
    } else {
      /* the input is intact, the ignored recvbuf untouched */
      uint8_t *ref = malloc(blk + 1);
      chk_fill(ref, c, k->dt, k->op, k->rank);
      bad = memcmp(ref, k->sbuf, blk) != 0;
      free(ref);
      if (!k->inplace && !cc_untouched(k->rbuf, blk))
        bad++;
    }
    break;
  case COLL_REDUCE_SCATTER:
    bad = cc_expect_red(k, k->rp, (size_t)k->rank * c);
    break;
  case COLL_BCAST:
    bad = cc_expect_gen(k, k->rp, 1, k->root, 0, "bcast");
    if (!root && k->inplace && !cc_untouched(k->sbuf, blk))
      bad++;
    break;
  case COLL_ALLGATHER:
    bad = cc_expect_gen(k, k->rp, n, -1, 0, "allgather");
    break;
  case COLL_ALLTOALL:
    bad = cc_expect_gen(k, k->rp, n, -1, k->rank, "alltoall");
    break;
  case COLL_GATHER:
    if (root)
      bad = cc_expect_gen(k, k->rp, n, -1, 0, "gather");
    else if (!cc_untouched(k->rbuf, n * blk))
      bad = 1;
    break;
  case COLL_SCATTER:
    bad = cc_expect_gen(k, k->rp, 1, k->root, k->rank, "scatter");
    if (!root && !cc_untouched(k->sbuf, n * blk))
      bad++;
    break;
  default:
    break;
  }
  if (bad &&
      (k->coll == COLL_REDUCE || k->coll == COLL_GATHER || k->coll == COLL_SCATTER ||
       k->coll == COLL_BCAST) &&
      !root)
    fprintf(stderr, "rank %d n=%d %s/%s count %zu root %d: ignored or input buffer changed\n",
            k->rank, k->n, coll_kind_str(k->coll), k->algo, c, k->root);
  free(k->sbuf);
  free(k->rbuf);
  k->sbuf = k->rbuf = NULL;
  return bad;
}

/* One call, checked. Returns 0 when right. */
static inline int cc_run(chorus_comm_t *c, cc_case_t *k, bool nb) {
  if (cc_setup(k)) {
    fprintf(stderr, "rank %d: out of memory\n", k->rank);
    free(k->sbuf);
    free(k->rbuf);
    return 1;
  }
  if (getenv("CC_TRACE"))
    fprintf(stderr, "rank %d: %s/%s %s/%s count %zu root %d%s%s\n", k->rank, coll_kind_str(k->coll),
            k->algo, chorus_dtype_name(k->dt), chorus_op_name(k->op), k->count, k->root,
            k->inplace ? " in place" : "", nb ? " nb" : "");
  chorus_result rc = cc_start(c, k, nb);
  if (!rc && nb)
    rc = chorus_wait(&k->req);
  if (rc) {
    fprintf(stderr, "rank %d n=%d %s/%s %s count %zu root %d%s: %s: %s\n", k->rank, k->n,
            coll_kind_str(k->coll), k->algo ? k->algo : "auto", chorus_dtype_name(k->dt), k->count,
            k->root, k->inplace ? " in place" : "", chorus_strerror(rc), chorus_comm_last_error(c));
    free(k->sbuf);
    free(k->rbuf);
    return 1;
  }
  if (k->algo && strcmp(chorus_comm_last_algorithm(c), k->algo) != 0) {
    fprintf(stderr, "rank %d: %s ran %s, forced %s\n", k->rank, coll_kind_str(k->coll),
            chorus_comm_last_algorithm(c), k->algo);
    free(k->sbuf);
    free(k->rbuf);
    return 1;
  }
  return cc_check(k) ? 1 : 0;
}

/* ---- the sweep ---- */

typedef struct cc_dtop {
  chorus_dtype dt;
  chorus_op op;
} cc_dtop_t;

/* One count and the (dtype, op) pairs run at it: `red` for reducing
 * collectives, `plain` (dtype only) for the others. */
typedef struct cc_level {
  size_t count;
  const cc_dtop_t *red;
  int nred;
  const cc_dtop_t *plain;
  int nplain;
} cc_level_t;

typedef struct cc_sweep {
  const cc_level_t *levels;
  int nlevels;
  int all_roots_upto; /* every root when n <= this, else 0, n/2, n-1 */
  int other_roots;    /* pairs per level at roots other than the first */
  int inplace_pairs;  /* pairs per level also run in place (0: all) */
  bool hier_only;     /* only ALGO_HIERARCHICAL algorithms (a topology is set) */
  bool with_hier;     /* include them */
} cc_sweep_t;

/* Every collective x algorithm x case of sw. Returns failures. */
static inline int cc_sweep(chorus_comm_t *c, int rank, int n, const cc_sweep_t *sw) {
  int bad = 0, calls = 0;
  char spec[128];

  for (const algo_desc_t *d = algo_table; d->name; d++) {
    if (d->coll == COLL_SEND || d->coll == COLL_RECV)
      continue;
    bool hier = (d->flags & ALGO_HIERARCHICAL) != 0;
    if ((hier && !sw->with_hier && !sw->hier_only) || (!hier && sw->hier_only))
      continue;
    snprintf(spec, sizeof(spec), "%s=%s", coll_kind_str(d->coll), d->name);
    if (eng_comm_set_algo(c, spec)) {
      fprintf(stderr, "rank %d: eng_comm_set_algo(%s): %s\n", rank, spec,
              chorus_comm_last_error(c));
      return bad + 1;
    }
    int roots[64], nroots = 1;
    roots[0] = 0;
    if (cc_rooted(d->coll) && n <= sw->all_roots_upto) {
      for (int r = 0; r < n; r++)
        roots[r] = r;
      nroots = n;
    } else if (cc_rooted(d->coll)) {
      /* 0, the middle and the last, without repeats */
      if (n / 2 > 0)
        roots[nroots++] = n / 2;
      if (n - 1 > n / 2)
        roots[nroots++] = n - 1;
    }
    const bool red = cc_reduces(d->coll);
    for (int ri = 0; ri < nroots; ri++)
      for (int li = 0; li < sw->nlevels; li++) {
        const cc_level_t *lv = &sw->levels[li];
        int ncomb = red ? lv->nred : lv->nplain;
        if (d->coll == COLL_BARRIER)
          ncomb = 1;
        if (ri > 0 && ncomb > sw->other_roots)
          ncomb = sw->other_roots;
        for (int m = 0; m < ncomb; m++) {
          cc_dtop_t dto = red ? lv->red[m] : lv->plain[m];
          bool ipok = cc_has_inplace(d->coll) && (!sw->inplace_pairs || m < sw->inplace_pairs);
          for (int ip = 0; ip < (ipok ? 2 : 1); ip++) {
            cc_case_t k = {.coll = d->coll,
                           .algo = d->name,
                           .rank = rank,
                           .n = n,
                           .root = roots[ri],
                           .count = d->coll == COLL_BARRIER ? 0 : lv->count,
                           .dt = d->coll == COLL_BARRIER ? CHORUS_UINT8 : dto.dt,
                           .op = red ? dto.op : CHORUS_SUM,
                           .inplace = ip == 1};
            if (cc_run(c, &k, (calls++ & 1) != 0))
              bad++;
          }
        }
      }
  }
  return bad;
}

/* ---- fused allreduce ---- */

/* nbufs buffers of the given counts (element j of buffer b carries global
 * index base_b + j), as ONE request: the sequence number moves by one and a
 * single request is live while it runs. */
static inline int cc_multi(chorus_comm_t *c, int rank, int n, chorus_dtype dt, chorus_op op,
                           bool inplace, int nbufs, const size_t *counts, const char *algo) {
  const size_t es = chorus_dtype_size(dt);
  void **s = calloc((size_t)nbufs, sizeof(void *)), **r = calloc((size_t)nbufs, sizeof(void *));
  int bad = 0;
  size_t base = 0;

  for (int b = 0; b < nbufs; b++) {
    s[b] = malloc(counts[b] * es + 1);
    r[b] = inplace ? s[b] : malloc(counts[b] * es + 1);
    for (size_t j = 0; j < counts[b]; j++)
      chk_set(s[b], j, dt, chk_input(rank, base + j, op));
    base += counts[b];
  }
  uint16_t seq0 = c->seq;
  chorus_request_t *req = NULL;
  chorus_result rc =
      chorus_iallreduce_multi(c, (const void *const *)s, r, counts, nbufs, dt, op, &req);
  int live = 0;
  for (chorus_request_t *q = c->live; q; q = q->next_live)
    live++;
  if (!rc && ((uint16_t)(c->seq - seq0) != 1 || live != 1)) {
    fprintf(stderr, "rank %d: fused allreduce of %d buffers: %u sequence numbers, %d requests\n",
            rank, nbufs, (unsigned)(uint16_t)(c->seq - seq0), live);
    bad++;
  }
  if (!rc)
    rc = chorus_wait(&req);
  if (rc) {
    fprintf(stderr, "rank %d: fused allreduce: %s: %s\n", rank, chorus_strerror(rc),
            chorus_comm_last_error(c));
    bad++;
  } else {
    if (algo && strcmp(chorus_comm_last_algorithm(c), algo) != 0)
      bad++;
    base = 0;
    for (int b = 0; b < nbufs; b++) {
      for (size_t j = 0; j < counts[b]; j++) {
        double got = chk_get(r[b], j, dt), want = chk_expect(base + j, dt, op, n);
        if (memcmp(&got, &want, sizeof(got)) != 0) {
          if (bad < 3)
            fprintf(stderr, "rank %d n=%d fused %s %s/%s%s buffer %d [%zu] = %g, want %g\n", rank,
                    n, algo ? algo : "auto", chorus_dtype_name(dt), chorus_op_name(op),
                    inplace ? " in place" : "", b, j, got, want);
          bad++;
          break;
        }
      }
      base += counts[b];
    }
  }
  for (int b = 0; b < nbufs; b++) {
    if (!inplace)
      free(r[b]);
    free(s[b]);
  }
  free(s);
  free(r);
  return bad;
}

/* Every allreduce algorithm (hierarchical ones when with_hier) fused over
 * buffers of different sizes, in place and not. */
static inline int cc_multi_sweep(chorus_comm_t *c, int rank, int n, bool with_hier) {
  static const size_t counts[] = {1, 0, 97, 4099, 3, 1024, 0, 17, 20011, 5};
  const int nb = (int)(sizeof(counts) / sizeof(counts[0]));
  static const cc_dtop_t dtops[] = {
      {CHORUS_FLOAT32, CHORUS_SUM}, {CHORUS_INT8, CHORUS_MAX}, {CHORUS_BFLOAT16, CHORUS_AVG}};
  int bad = 0;
  char spec[128];

  for (const algo_desc_t *d = algo_table; d->name; d++) {
    if (d->coll != COLL_ALLREDUCE || ((d->flags & ALGO_HIERARCHICAL) && !with_hier))
      continue;
    snprintf(spec, sizeof(spec), "allreduce=%s", d->name);
    if (eng_comm_set_algo(c, spec))
      return bad + 1;
    for (size_t m = 0; m < sizeof(dtops) / sizeof(dtops[0]); m++)
      for (int ip = 0; ip < 2; ip++)
        bad += cc_multi(c, rank, n, dtops[m].dt, dtops[m].op, ip, nb, counts, d->name);
    /* many small buffers, and one */
    size_t many[300];
    for (int i = 0; i < 300; i++)
      many[i] = (size_t)(i % 7);
    bad += cc_multi(c, rank, n, CHORUS_INT32, CHORUS_SUM, false, 300, many, d->name);
    bad += cc_multi(c, rank, n, CHORUS_FLOAT64, CHORUS_PROD, true, 1, counts + 2, d->name);
  }
  eng_comm_set_algo(c, "");
  return bad;
}

/* ---- point to point ---- */

static inline void cc_fill_p2p(void *buf, size_t count, chorus_dtype dt, int src, int dst, int k) {
  for (size_t i = 0; i < count; i++)
    chk_set(buf, i, dt, cc_gen(src, dst * 3 + k, i));
}

static inline size_t cc_check_p2p(const void *buf, size_t count, chorus_dtype dt, int src, int dst,
                                  int k) {
  for (size_t i = 0; i < count; i++)
    if (chk_get(buf, i, dt) != cc_gen(src, dst * 3 + k, i)) {
      fprintf(stderr, "rank %d: message %d from %d: [%zu] = %g, want %g\n", dst, k, src, i,
              chk_get(buf, i, dt), cc_gen(src, dst * 3 + k, i));
      return 1;
    }
  return 0;
}

/* Rings in groups, every pair nonblocking in crossed orders, several
 * messages per pair in order, blocking pairs, and p2p around a collective. */
static inline int cc_p2p(chorus_comm_t *c, int rank, int n, size_t count, chorus_dtype dt) {
  const size_t es = chorus_dtype_size(dt), bytes = count * es + 1;
  const int right = (rank + 1) % n, left = (rank + n - 1) % n;
  int bad = 0;
  chorus_result rc;

  if (n < 2)
    return 0;
  /* 1. grouped ring: blocking calls, started together */
  {
    void *s = malloc(bytes), *r = malloc(bytes);
    cc_fill_p2p(s, count, dt, rank, right, 0);
    chorus_group_start();
    chorus_send(c, s, count, dt, right);
    chorus_recv(c, r, count, dt, left);
    rc = chorus_group_end();
    if (rc) {
      fprintf(stderr, "rank %d: grouped ring: %s: %s\n", rank, chorus_strerror(rc),
              chorus_last_error());
      bad++;
    } else {
      bad += (int)cc_check_p2p(r, count, dt, left, rank, 0);
    }
    free(s);
    free(r);
  }
  /* 2. every peer: receives posted in rising order, sends in falling order */
  {
    void **s = calloc((size_t)n, sizeof(void *)), **r = calloc((size_t)n, sizeof(void *));
    chorus_request_t **rs = calloc((size_t)n, sizeof(void *)),
                     **rr = calloc((size_t)n, sizeof(void *));
    for (int p = 0; p < n; p++) {
      if (p == rank)
        continue;
      s[p] = malloc(bytes);
      r[p] = malloc(bytes);
      cc_fill_p2p(s[p], count, dt, rank, p, 1);
      if (chorus_irecv(c, r[p], count, dt, p, &rr[p]))
        bad++;
    }
    for (int p = n - 1; p >= 0; p--)
      if (p != rank && chorus_isend(c, s[p], count, dt, p, &rs[p]))
        bad++;
    for (int p = 0; p < n; p++) {
      if (p == rank)
        continue;
      if (chorus_wait(&rs[p]) || chorus_wait(&rr[p])) {
        fprintf(stderr, "rank %d: pair with %d: %s\n", rank, p, chorus_comm_last_error(c));
        bad++;
      } else {
        bad += (int)cc_check_p2p(r[p], count, dt, p, rank, 1);
      }
      free(s[p]);
      free(r[p]);
    }
    free(s);
    free(r);
    free(rs);
    free(rr);
  }
  /* 3. three messages to the right in order, a collective in between */
  {
    void *s[3], *r[3];
    chorus_request_t *qs[3], *qr[3];
    float x = (float)rank;
    for (int m = 0; m < 3; m++) {
      s[m] = malloc(bytes);
      r[m] = malloc(bytes);
      cc_fill_p2p(s[m], count, dt, rank, right, m);
      if (chorus_isend(c, s[m], count, dt, right, &qs[m]))
        bad++;
    }
    if (chorus_allreduce(c, &x, &x, 1, CHORUS_FLOAT32, CHORUS_SUM) || x != (float)(n * (n - 1) / 2))
      bad++;
    for (int m = 0; m < 3; m++)
      if (chorus_irecv(c, r[m], count, dt, left, &qr[m]))
        bad++;
    for (int m = 0; m < 3; m++) {
      if (chorus_wait(&qs[m]) || chorus_wait(&qr[m]))
        bad++;
      else
        bad += (int)cc_check_p2p(r[m], count, dt, left, rank, m);
      free(s[m]);
      free(r[m]);
    }
  }
  /* 4. blocking pairs (rank ^ 1): the lower sends first */
  {
    int p = rank ^ 1;
    if (p < n) {
      void *s = malloc(bytes), *r = malloc(bytes);
      cc_fill_p2p(s, count, dt, rank, p, 2);
      if (rank < p)
        rc = chorus_send(c, s, count, dt, p) || chorus_recv(c, r, count, dt, p);
      else
        rc = chorus_recv(c, r, count, dt, p) || chorus_send(c, s, count, dt, p);
      if (rc) {
        fprintf(stderr, "rank %d: blocking pair: %s\n", rank, chorus_comm_last_error(c));
        bad++;
      } else {
        bad += (int)cc_check_p2p(r, count, dt, p, rank, 2);
      }
      free(s);
      free(r);
    }
  }
  return bad;
}

/* Collectives of every kind in flight at once (nonblocking, then waited in
 * reverse order), with a p2p ring among them. */
static inline int cc_concurrent(chorus_comm_t *c, int rank, int n, size_t count) {
  static const int kinds[] = {COLL_BCAST,          COLL_ALLREDUCE, COLL_ALLGATHER, COLL_ALLTOALL,
                              COLL_REDUCE_SCATTER, COLL_BARRIER,   COLL_REDUCE,    COLL_GATHER,
                              COLL_SCATTER,        COLL_ALLREDUCE};
  enum { NK = sizeof(kinds) / sizeof(kinds[0]) };
  cc_case_t k[NK];
  int bad = 0;
  const size_t es = chorus_dtype_size(CHORUS_INT32);
  void *ps = malloc(count * es + 1), *pr = malloc(count * es + 1);
  chorus_request_t *qs = NULL, *qr = NULL;

  eng_comm_set_algo(c, "");
  for (int i = 0; i < NK; i++) {
    k[i] = (cc_case_t){.coll = kinds[i],
                       .algo = NULL,
                       .rank = rank,
                       .n = n,
                       .root = i % n,
                       .count = kinds[i] == COLL_BARRIER ? 0 : count + (size_t)i,
                       .dt = i % 2 ? CHORUS_FLOAT32 : CHORUS_INT32,
                       .op = i == 9 ? CHORUS_MAX : CHORUS_SUM,
                       .inplace = i % 3 == 0 && cc_has_inplace(kinds[i])};
    if (cc_setup(&k[i]) || cc_start(c, &k[i], true)) {
      fprintf(stderr, "rank %d: concurrent %s: %s\n", rank, coll_kind_str(kinds[i]),
              chorus_comm_last_error(c));
      return bad + 1;
    }
    if (i == NK / 2 && n > 1) {
      cc_fill_p2p(ps, count, CHORUS_INT32, rank, (rank + 1) % n, 0);
      if (chorus_isend(c, ps, count, CHORUS_INT32, (rank + 1) % n, &qs) ||
          chorus_irecv(c, pr, count, CHORUS_INT32, (rank + n - 1) % n, &qr))
        bad++;
    }
  }
  for (int i = NK - 1; i >= 0; i--) {
    chorus_result rc = chorus_wait(&k[i].req);
    if (rc) {
      fprintf(stderr, "rank %d: concurrent %s: %s\n", rank, coll_kind_str(kinds[i]),
              chorus_comm_last_error(c));
      bad++;
    }
    k[i].algo = "auto";
    if (cc_check(&k[i]))
      bad++;
  }
  if (n > 1) {
    if (chorus_wait(&qs) || chorus_wait(&qr))
      bad++;
    else
      bad += (int)cc_check_p2p(pr, count, CHORUS_INT32, (rank + n - 1) % n, rank, 0);
  }
  free(ps);
  free(pr);
  return bad;
}

#endif
