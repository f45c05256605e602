/*
 * test_algos_b.c - allgather, reduce_scatter, alltoall, gather, scatter,
 * barrier and send/recv algorithms, run on real data through the reference
 * interpreter (sim.h): every algorithm at 1..9, 16 and 64 ranks, counts 0,
 * 1, 1009 and 65536 (the last cut into many chunks), in place and out of
 * place, every root, every dtype and op for the reductions.
 *
 * Data collectives carry values that name their origin, (rank << 21) | index
 * in int32, so a misplaced block is caught with where it came from.
 * Reductions use check.h's inputs, exact for every dtype and op. Every plan
 * is also checked for COPY steps whose ranges overlap (the executor uses
 * memcpy) and REDUCE steps whose destination partly overlaps an operand.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "algos/algos.h"
#include "check.h"
#include "sim.h"
#include "verify.h"

#define SMALL_CHUNK 1000  /* bytes: 1009 elements are several chunks */
#define LARGE_CHUNK 16384 /* bytes: 65536 int32 elements are 16 chunks a block */

static const size_t counts[] = {0, 1, 1009, 65536};
static const int ranks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16};
#define NELEMS(a) (sizeof(a) / sizeof((a)[0]))

/* by value: Criterion may hand parameters to a freshly started worker */
typedef struct algo_param {
  coll_kind coll;
  char name[16];
} algo_param_t;

static int32_t val(int rank, size_t idx) {
  return (int32_t)(((uint32_t)rank << 21) | (uint32_t)idx);
}

static size_t chunk_for(size_t count) {
  return count >= 65536 ? LARGE_CHUNK : SMALL_CHUNK;
}

static const algo_desc_t *find(coll_kind coll, const char *name) {
  const algo_desc_t *d = algo_find(coll, name);
  cr_assert_not_null(d, "%s/%s is not in algo_table", coll_kind_str(coll), name);
  return d;
}

/* ---- running ---- */

typedef struct run {
  int n;
  plan_t **plans;
  sim_buf_t *bufs;
  sim_stats_t st;
} run_t;

static void run_init(run_t *x, int n) {
  x->n = n;
  x->plans = calloc((size_t)n, sizeof(*x->plans));
  x->bufs = calloc((size_t)n, sizeof(*x->bufs));
  cr_assert(x->plans && x->bufs);
}

static void run_free(run_t *x) {
  for (int r = 0; r < x->n; r++)
    plan_free(x->plans[r]);
  free(x->plans);
  free(x->bufs);
}

static void build(run_t *x, const algo_desc_t *d, algo_args_t a) {
  for (int r = 0; r < x->n; r++) {
    a.rank = r;
    int rc = d->build(&a, &x->plans[r]);
    cr_assert_eq(rc, 0, "%s/%s: rank %d of %d, count %zu, root %d: %d", coll_kind_str(a.coll),
                 d->name, r, x->n, a.count, a.root, rc);
    cr_assert_lt(x->plans[r]->nmsgs, ALGO_MAX_MSGS);
  }
}

/* Both ranges as (space, start): space 0 is scratch (offsets), 1 memory. */
static void locate(const sim_buf_t *bf, plan_ref_t ref, int *space, uintptr_t *at) {
  *space = ref.buf == BUF_SCRATCH ? 0 : 1;
  if (ref.buf == BUF_SEND)
    *at = (uintptr_t)bf->send + ref.off;
  else if (ref.buf == BUF_RECV)
    *at = (uintptr_t)bf->recv + ref.off;
  else
    *at = ref.off;
}

/* 0: disjoint, 1: the same range, 2: partly overlapping. */
static int overlap(const sim_buf_t *bf, plan_ref_t a, plan_ref_t b, size_t bytes) {
  int sa, sb;
  uintptr_t pa, pb;
  locate(bf, a, &sa, &pa);
  locate(bf, b, &sb, &pb);
  if (sa != sb || !bytes || pa + bytes <= pb || pb + bytes <= pa)
    return 0;
  return pa == pb ? 1 : 2;
}

static void check_local_steps(const run_t *x) {
  for (int r = 0; r < x->n; r++) {
    const plan_t *p = x->plans[r];
    for (uint32_t i = 0; i < p->nsteps; i++) {
      const plan_step_t *s = &p->steps[i];
      if (s->kind == STEP_COPY)
        cr_assert_eq(overlap(&x->bufs[r], s->dst, s->src, s->bytes), 0,
                     "%s rank %d step %u: COPY onto an overlapping range", p->algo, r, i);
      if (s->kind == STEP_REDUCE) {
        cr_assert_neq(overlap(&x->bufs[r], s->dst, s->src, s->bytes), 2,
                      "%s rank %d step %u: REDUCE dst partly overlaps a", p->algo, r, i);
        cr_assert_neq(overlap(&x->bufs[r], s->dst, s->src2, s->bytes), 2,
                      "%s rank %d step %u: REDUCE dst partly overlaps b", p->algo, r, i);
      }
    }
  }
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* plan.h: a message number is unique among all the messages a rank sends */
static void check_msg_numbers(const run_t *x) {
  for (int r = 0; r < x->n; r++) {
    const plan_t *p = x->plans[r];
    uint32_t *m = malloc((p->nsteps + 1) * sizeof(*m)), k = 0;
    for (uint32_t i = 0; i < p->nsteps; i++)
      if (p->steps[i].kind == STEP_SEND)
        m[k++] = p->steps[i].msg;
    qsort(m, k, sizeof(*m), cmp_u32);
    for (uint32_t i = 1; i < k; i++)
      cr_assert_neq(m[i], m[i - 1], "%s rank %d: message %u sent twice", p->algo, r, m[i]);
    free(m);
  }
}

static void exec(run_t *x, const char *what) {
  char err[512];
  int rc = sim_exec(x->plans, x->n, x->bufs, &x->st, err, sizeof(err));
  cr_assert_eq(rc, 0, "%s: %d ranks: %s", what, x->n, err);
  rc = verify_plans(x->plans, x->n, err, sizeof(err));
  cr_assert_eq(rc, 0, "%s: %d ranks: verify: %s", what, x->n, err);
  check_local_steps(x);
  check_msg_numbers(x);
}

/* ---- allgather ---- */

/* out of place, in place, or out of place with the own block already in
 * recv (algo_args_t.own_placed, as a staged call runs) */
enum { AG_OUT, AG_INPLACE, AG_OWN_PLACED };

/* Whether a step of rank r's plan writes recv block r (bytes [lo, hi)). */
static bool writes_own_block(const plan_t *p, size_t lo, size_t hi) {
  for (uint32_t i = 0; i < p->nsteps; i++) {
    const plan_step_t *s = &p->steps[i];
    if (s->kind != STEP_SEND && s->dst.buf == BUF_RECV && s->dst.off < hi &&
        s->dst.off + s->bytes > lo)
      return true;
  }
  return false;
}

static void run_allgather(const algo_desc_t *d, int n, size_t count, int mode) {
  const size_t es = sizeof(int32_t), total = (size_t)n * count;
  const bool inplace = mode == AG_INPLACE;
  static const char *const how[] = {"", " in place", " own block placed"};
  run_t x;
  run_init(&x, n);
  algo_args_t a = {.coll = COLL_ALLGATHER,
                   .nranks = n,
                   .count = count,
                   .dtype = CHORUS_INT32,
                   .inplace = inplace,
                   .own_placed = mode == AG_OWN_PLACED,
                   .chunk_bytes = chunk_for(count)};
  build(&x, d, a);
  for (int r = 0; r < n; r++) {
    int32_t *recv = malloc(total * es + 1),
            *send = inplace ? recv + (size_t)r * count : malloc(count * es + 1);
    memset(recv, 0xab, total * es);
    for (size_t i = 0; i < count; i++)
      send[i] = val(r, i);
    if (mode == AG_OWN_PLACED) {
      /* placed, and nothing in the plan writes it again */
      memcpy(recv + (size_t)r * count, send, count * es);
      cr_assert_not(
          writes_own_block(x.plans[r], (size_t)r * count * es, (size_t)(r + 1) * count * es),
          "allgather/%s n=%d count=%zu: rank %d's plan writes its own block, placed "
          "already",
          d->name, n, count, r);
    }
    x.bufs[r] = (sim_buf_t){send, count * es, recv, total * es};
  }
  exec(&x, d->name);
  for (int r = 0; r < n; r++) {
    const int32_t *recv = x.bufs[r].recv;
    for (int k = 0; k < n; k++)
      for (size_t i = 0; i < count; i++)
        cr_assert_eq(recv[(size_t)k * count + i], val(k, i),
                     "allgather/%s n=%d count=%zu%s: rank %d block %d [%zu] = %#x", d->name, n,
                     count, how[mode], r, k, i, recv[(size_t)k * count + i]);
    cr_assert_eq(memcmp(recv, x.bufs[0].recv, total * es), 0);
  }
  for (int r = 0; r < n; r++) {
    if (!inplace)
      free((void *)x.bufs[r].send);
    free(x.bufs[r].recv);
  }
  run_free(&x);
}

/* ---- reduce_scatter ---- */

static void run_reduce_scatter(const algo_desc_t *d, int n, size_t count, chorus_dtype dt,
                               chorus_op op, bool inplace, size_t chunk) {
  const size_t es = chorus_dtype_size(dt), total = (size_t)n * count;
  run_t x;
  run_init(&x, n);
  algo_args_t a = {.coll = COLL_REDUCE_SCATTER,
                   .nranks = n,
                   .count = count,
                   .dtype = dt,
                   .op = op,
                   .inplace = inplace,
                   .chunk_bytes = chunk};
  build(&x, d, a);
  for (int r = 0; r < n; r++) {
    uint8_t *send = malloc(total * es + 1),
            *recv = inplace ? send + (size_t)r * count * es : malloc(count * es + 1);
    chk_fill(send, total, dt, op, r);
    if (!inplace)
      memset(recv, 0xab, count * es);
    x.bufs[r] = (sim_buf_t){send, total * es, recv, count * es};
  }
  exec(&x, d->name);
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < count; i++) {
      double got = chk_get(x.bufs[r].recv, i, dt);
      double want = chk_expect((size_t)r * count + i, dt, op, n);
      cr_assert(memcmp(&got, &want, sizeof(got)) == 0,
                "reduce_scatter/%s %s/%s n=%d count=%zu%s: rank %d [%zu] = %g, want %g", d->name,
                chorus_dtype_name(dt), chorus_op_name(op), n, count, inplace ? " in place" : "", r,
                i, got, want);
    }
  for (int r = 0; r < n; r++) {
    if (!inplace)
      free(x.bufs[r].recv);
    free((void *)x.bufs[r].send);
  }
  run_free(&x);
}

/* ---- alltoall ---- */

static void run_alltoall(const algo_desc_t *d, int n, size_t count) {
  const size_t es = sizeof(int32_t), total = (size_t)n * count;
  run_t x;
  run_init(&x, n);
  algo_args_t a = {.coll = COLL_ALLTOALL,
                   .nranks = n,
                   .count = count,
                   .dtype = CHORUS_INT32,
                   .chunk_bytes = chunk_for(count)};
  build(&x, d, a);
  for (int r = 0; r < n; r++) {
    int32_t *send = malloc(total * es + 1), *recv = malloc(total * es + 1);
    for (size_t i = 0; i < total; i++)
      send[i] = val(r, i);
    memset(recv, 0xab, total * es);
    x.bufs[r] = (sim_buf_t){send, total * es, recv, total * es};
  }
  exec(&x, d->name);
  for (int r = 0; r < n; r++) {
    const int32_t *recv = x.bufs[r].recv;
    for (int p = 0; p < n; p++)
      for (size_t i = 0; i < count; i++)
        cr_assert_eq(recv[(size_t)p * count + i], val(p, (size_t)r * count + i),
                     "alltoall/%s n=%d count=%zu: rank %d block %d [%zu] = %#x", d->name, n, count,
                     r, p, i, recv[(size_t)p * count + i]);
  }
  for (int r = 0; r < n; r++) {
    free((void *)x.bufs[r].send);
    free(x.bufs[r].recv);
  }
  run_free(&x);
}

/* ---- gather and scatter ---- */

/* Non-roots get no receive buffer at all: any access is an -EFAULT. */
static void run_gather(const algo_desc_t *d, int n, size_t count, int root, bool inplace) {
  const size_t es = sizeof(int32_t), total = (size_t)n * count;
  run_t x;
  run_init(&x, n);
  algo_args_t a = {.coll = COLL_GATHER,
                   .nranks = n,
                   .root = root,
                   .count = count,
                   .dtype = CHORUS_INT32,
                   .inplace = inplace,
                   .chunk_bytes = chunk_for(count)};
  build(&x, d, a);
  for (int r = 0; r < n; r++) {
    int32_t *recv = NULL, *send;
    if (r == root) {
      recv = malloc(total * es + 1);
      memset(recv, 0xab, total * es);
    }
    send = r == root && inplace ? recv + (size_t)r * count : malloc(count * es + 1);
    for (size_t i = 0; i < count; i++)
      send[i] = val(r, i);
    x.bufs[r] = (sim_buf_t){send, count * es, recv, r == root ? total * es : 0};
  }
  exec(&x, d->name);
  const int32_t *recv = x.bufs[root].recv;
  for (int k = 0; k < n; k++)
    for (size_t i = 0; i < count; i++)
      cr_assert_eq(recv[(size_t)k * count + i], val(k, i),
                   "gather/%s n=%d root=%d count=%zu%s: block %d [%zu] = %#x", d->name, n, root,
                   count, inplace ? " in place" : "", k, i, recv[(size_t)k * count + i]);
  for (int r = 0; r < n; r++) {
    if (!(r == root && inplace))
      free((void *)x.bufs[r].send);
    free(x.bufs[r].recv);
  }
  run_free(&x);
}

static void run_scatter(const algo_desc_t *d, int n, size_t count, int root, bool inplace) {
  const size_t es = sizeof(int32_t), total = (size_t)n * count;
  run_t x;
  run_init(&x, n);
  algo_args_t a = {.coll = COLL_SCATTER,
                   .nranks = n,
                   .root = root,
                   .count = count,
                   .dtype = CHORUS_INT32,
                   .inplace = inplace,
                   .chunk_bytes = chunk_for(count)};
  build(&x, d, a);
  for (int r = 0; r < n; r++) {
    int32_t *send = NULL, *recv;
    if (r == root) {
      send = malloc(total * es + 1);
      for (size_t i = 0; i < total; i++)
        send[i] = val(r, i);
    }
    if (r == root && inplace) {
      recv = send + (size_t)r * count;
    } else {
      recv = malloc(count * es + 1);
      memset(recv, 0xab, count * es);
    }
    x.bufs[r] = (sim_buf_t){send, r == root ? total * es : 0, recv, count * es};
  }
  exec(&x, d->name);
  for (int r = 0; r < n; r++) {
    const int32_t *recv = x.bufs[r].recv;
    for (size_t i = 0; i < count; i++)
      cr_assert_eq(recv[i], val(root, (size_t)r * count + i),
                   "scatter/%s n=%d root=%d count=%zu%s: rank %d [%zu] = %#x", d->name, n, root,
                   count, inplace ? " in place" : "", r, i, recv[i]);
  }
  for (int r = 0; r < n; r++) {
    if (!(r == root && inplace))
      free(x.bufs[r].recv);
    free((void *)x.bufs[r].send);
  }
  run_free(&x);
}

/* ---- barrier ---- */

/* Can rank y finish before rank x has entered? Not if some step of y is
 * reachable from x's steps along dependencies and send -> receive. */
static void check_barrier_order(const run_t *x) {
  const int n = x->n;
  size_t nsteps = 0;
  uint32_t *base = calloc((size_t)n + 1, sizeof(*base));
  for (int r = 0; r < n; r++)
    base[r + 1] = base[r] + x->plans[r]->nsteps;
  nsteps = base[n];
  uint8_t *seen = malloc(nsteps + 1);
  uint32_t *stack = malloc((nsteps + 1) * sizeof(*stack));
  for (int from = 0; from < n; from++) {
    size_t top = 0;
    memset(seen, 0, nsteps + 1);
    for (uint32_t i = base[from]; i < base[from + 1]; i++) {
      seen[i] = 1;
      stack[top++] = i;
    }
    while (top) {
      uint32_t g = stack[--top];
      int r = 0;
      while (g >= base[r + 1])
        r++;
      const plan_t *p = x->plans[r];
      const plan_step_t *s = &p->steps[g - base[r]];
      for (uint32_t k = 0; k < s->nsucc; k++) {
        uint32_t t = base[r] + p->succ[s->succ_off + k];
        if (!seen[t]) {
          seen[t] = 1;
          stack[top++] = t;
        }
      }
      if (s->kind == STEP_SEND) {
        const plan_t *q = x->plans[s->peer];
        for (uint32_t j = 0; j < q->nsteps; j++) {
          uint32_t t = base[s->peer] + j;
          if (q->steps[j].kind == STEP_RECV && q->steps[j].peer == r && q->steps[j].msg == s->msg &&
              !seen[t]) {
            seen[t] = 1;
            stack[top++] = t;
          }
        }
      }
    }
    for (int y = 0; y < n; y++) {
      bool any = y == from;
      for (uint32_t i = base[y]; i < base[y + 1]; i++)
        any |= seen[i];
      cr_assert(any, "barrier n=%d: rank %d can leave before rank %d enters", n, y, from);
    }
  }
  free(seen);
  free(stack);
  free(base);
}

static void run_barrier(const algo_desc_t *d, int n) {
  run_t x;
  run_init(&x, n);
  algo_args_t a = {.coll = COLL_BARRIER, .nranks = n, .dtype = CHORUS_INT32, .chunk_bytes = 64};
  build(&x, d, a);
  exec(&x, d->name);
  int rounds = 0;
  while ((1 << rounds) < n)
    rounds++;
  cr_assert_eq(x.st.messages, (uint64_t)n * (uint64_t)rounds, "n=%d", n);
  cr_assert_eq(x.st.bytes, 0);
  check_barrier_order(&x);
  if (n > 1) {
    /* one rank never enters: the others cannot finish */
    plan_builder_t b;
    plan_free(x.plans[n / 2]);
    cr_assert_eq(plan_build_begin(&b, "absent", n / 2, n, 0, CHORUS_INT32, CHORUS_SUM, false), 0);
    cr_assert_eq(plan_build_end(&b, &x.plans[n / 2]), 0);
    char err[256];
    cr_assert_eq(sim_exec(x.plans, n, x.bufs, NULL, err, sizeof(err)), -EDEADLK);
  }
  run_free(&x);
}

/* ---- send / recv ---- */

/* pairs[2i] sends to pairs[2i+1], all at once; other ranks idle. */
static void run_p2p(int n, const int *pairs, int npairs, size_t count, size_t chunk) {
  const algo_desc_t *ds = find(COLL_SEND, "p2p"), *dr = find(COLL_RECV, "p2p");
  const size_t es = sizeof(int32_t);
  run_t x;
  run_init(&x, n);
  for (int i = 0; i < npairs; i++) {
    int s = pairs[2 * i], t = pairs[2 * i + 1];
    algo_args_t a = {.coll = COLL_SEND,
                     .rank = s,
                     .nranks = n,
                     .root = t,
                     .count = count,
                     .dtype = CHORUS_INT32,
                     .chunk_bytes = chunk};
    cr_assert_eq(ds->build(&a, &x.plans[s]), 0);
    a.coll = COLL_RECV;
    a.rank = t;
    a.root = s;
    cr_assert_eq(dr->build(&a, &x.plans[t]), 0);
    int32_t *send = malloc(count * es + 1), *recv = malloc(count * es + 1);
    for (size_t k = 0; k < count; k++)
      send[k] = val(s, k);
    memset(recv, 0xab, count * es);
    x.bufs[s] = (sim_buf_t){send, count * es, NULL, 0};
    x.bufs[t] = (sim_buf_t){NULL, 0, recv, count * es};
  }
  for (int r = 0; r < n; r++)
    if (!x.plans[r]) {
      plan_builder_t b;
      cr_assert_eq(plan_build_begin(&b, "idle", r, n, 0, CHORUS_INT32, CHORUS_SUM, false), 0);
      cr_assert_eq(plan_build_end(&b, &x.plans[r]), 0);
    }
  exec(&x, "p2p");
  size_t per = count ? (count * es + chunk - 1) / chunk : 0;
  cr_assert_eq(x.st.messages, (uint64_t)npairs * per);
  for (int i = 0; i < npairs; i++) {
    int s = pairs[2 * i], t = pairs[2 * i + 1];
    const int32_t *recv = x.bufs[t].recv;
    for (size_t k = 0; k < count; k++)
      cr_assert_eq(recv[k], val(s, k), "p2p %d->%d count=%zu [%zu] = %#x", s, t, count, k, recv[k]);
    free((void *)x.bufs[s].send);
    free(x.bufs[t].recv);
  }
  run_free(&x);
}

/* ---- one case of any collective ---- */

/* every root up to 9 ranks, except for the largest count (roots 0, 3, 6) */
static int step_roots(int n, size_t count) {
  return n > 9 ? 5 : count >= 65536 ? 3 : 1;
}

static void run_case(const algo_param_t *p, int n, size_t count) {
  const algo_desc_t *d = find(p->coll, p->name);
  switch (p->coll) {
  case COLL_ALLGATHER:
    run_allgather(d, n, count, AG_OUT);
    run_allgather(d, n, count, AG_INPLACE);
    run_allgather(d, n, count, AG_OWN_PLACED);
    break;
  case COLL_REDUCE_SCATTER:
    run_reduce_scatter(d, n, count, CHORUS_FLOAT32, CHORUS_SUM, false, chunk_for(count));
    run_reduce_scatter(d, n, count, CHORUS_INT32, CHORUS_AVG, true, chunk_for(count));
    break;
  case COLL_ALLTOALL:
    run_alltoall(d, n, count);
    break;
  case COLL_GATHER:
    for (int root = 0; root < n; root += step_roots(n, count)) {
      run_gather(d, n, count, root, false);
      run_gather(d, n, count, root, true);
    }
    break;
  case COLL_SCATTER:
    for (int root = 0; root < n; root += step_roots(n, count)) {
      run_scatter(d, n, count, root, false);
      run_scatter(d, n, count, root, true);
    }
    break;
  case COLL_BARRIER:
    run_barrier(d, n);
    break;
  default:
    cr_assert_fail("no runner for %s", coll_kind_str(p->coll));
  }
}

static algo_param_t algos[] = {
    {COLL_ALLGATHER, "ring"},        {COLL_ALLGATHER, "bruck"},     {COLL_ALLGATHER, "rd"},
    {COLL_ALLGATHER, "direct"},      {COLL_REDUCE_SCATTER, "ring"}, {COLL_REDUCE_SCATTER, "rhd"},
    {COLL_ALLTOALL, "pairwise"},     {COLL_ALLTOALL, "bruck"},      {COLL_GATHER, "tree"},
    {COLL_GATHER, "linear"},         {COLL_SCATTER, "tree"},        {COLL_SCATTER, "linear"},
    {COLL_BARRIER, "dissemination"},
};

/* every algorithm x ranks 1..9, 16 x counts x in place / out of place
 * (gather/scatter: every root up to 9 ranks) */
ParameterizedTestParameters(algos_b, matrix) {
  return cr_make_param_array(algo_param_t, algos, NELEMS(algos));
}

ParameterizedTest(algo_param_t *p, algos_b, matrix, .timeout = 120) {
  for (size_t i = 0; i < NELEMS(ranks); i++)
    for (size_t c = 0; c < NELEMS(counts); c++)
      run_case(p, ranks[i], counts[c]);
}

ParameterizedTestParameters(algos_b, ranks_64) {
  return cr_make_param_array(algo_param_t, algos, NELEMS(algos));
}

ParameterizedTest(algo_param_t *p, algos_b, ranks_64, .timeout = 120) {
  run_case(p, 64, 1009);
}

Test(algos_b, reduce_scatter_every_dtype_and_op, .timeout = 120) {
  static const int ns[] = {3, 6, 8};
  for (size_t k = 0; k < NELEMS(ns); k++)
    for (int dt = 0; dt < CHORUS_DTYPE_COUNT; dt++)
      for (int op = 0; op < CHORUS_OP_COUNT; op++) {
        run_reduce_scatter(find(COLL_REDUCE_SCATTER, "ring"), ns[k], 101, dt, op, false, 64);
        run_reduce_scatter(find(COLL_REDUCE_SCATTER, "ring"), ns[k], 101, dt, op, true, 64);
        run_reduce_scatter(find(COLL_REDUCE_SCATTER, "rhd"), ns[k], 101, dt, op, false, 64);
        run_reduce_scatter(find(COLL_REDUCE_SCATTER, "rhd"), ns[k], 101, dt, op, true, 64);
      }
}

/* counts below the rank count leave most blocks empty on some ranks */
Test(algos_b, counts_below_ranks, .timeout = 60) {
  for (size_t i = 0; i < NELEMS(algos); i++)
    for (size_t count = 1; count <= 3; count++)
      run_case(&algos[i], 7, count);
}

Test(algos_b, send_recv_pairs, .timeout = 60) {
  static const int one[] = {0, 1}, back[] = {3, 0}, many[] = {0, 5, 6, 1, 2, 7, 4, 3};
  for (size_t c = 0; c < NELEMS(counts); c++) {
    size_t chunk = counts[c] >= 65536 ? LARGE_CHUNK : 100;
    run_p2p(2, one, 1, counts[c], chunk);
    run_p2p(4, back, 1, counts[c], chunk);
    run_p2p(8, many, 4, counts[c], chunk);
  }
  run_p2p(64, (const int[]){63, 0, 17, 40}, 2, 1009, 256);
}

Test(algos_b, send_recv_rejects_self_and_bad_peer) {
  plan_t *p = NULL;
  algo_args_t a = {.coll = COLL_SEND,
                   .rank = 2,
                   .nranks = 4,
                   .root = 2,
                   .count = 4,
                   .dtype = CHORUS_INT32,
                   .chunk_bytes = 64};
  cr_assert_eq(algo_p2p(&a, &p), -EINVAL);
  a.root = 4;
  cr_assert_eq(algo_p2p(&a, &p), -EINVAL);
  a.coll = COLL_BARRIER;
  a.root = 1;
  cr_assert_eq(algo_p2p(&a, &p), -EINVAL);
  cr_assert_null(p);
}

Test(algos_b, alltoall_has_no_in_place_form) {
  plan_t *p = NULL;
  algo_args_t a = {.coll = COLL_ALLTOALL,
                   .rank = 0,
                   .nranks = 4,
                   .count = 4,
                   .dtype = CHORUS_INT32,
                   .inplace = true,
                   .chunk_bytes = 64};
  cr_assert_eq(algo_pairwise_alltoall(&a, &p), -EINVAL);
  cr_assert_eq(algo_bruck_alltoall(&a, &p), -EINVAL);
  cr_assert_null(p);
}

/* More than 2^24 messages: -E2BIG, never a wrapped message number. */
Test(algos_b, message_numbers_never_wrap) {
  for (size_t i = 0; i < NELEMS(algos); i++) {
    if (algos[i].coll == COLL_BARRIER)
      continue;
    const algo_desc_t *d = find(algos[i].coll, algos[i].name);
    for (int r = 0; r < 4; r++) {
      plan_t *p = NULL;
      algo_args_t a = {.coll = algos[i].coll,
                       .rank = r,
                       .nranks = 4,
                       .root = 1,
                       .count = ((size_t)1 << 24) + 1,
                       .dtype = CHORUS_INT8,
                       .chunk_bytes = 1};
      int rc = d->build(&a, &p);
      cr_assert_eq(rc, -E2BIG, "%s/%s rank %d: %d", coll_kind_str(algos[i].coll), d->name, r, rc);
      cr_assert_null(p);
    }
  }
  plan_t *p = NULL;
  algo_args_t a = {.coll = COLL_SEND,
                   .rank = 0,
                   .nranks = 2,
                   .root = 1,
                   .count = ((size_t)1 << 24) + 1,
                   .dtype = CHORUS_INT8,
                   .chunk_bytes = 1};
  cr_assert_eq(algo_p2p(&a, &p), -E2BIG);
}

/* The pipelined rings keep a fixed scratch footprint however large the
 * message; the log-round algorithms send one message a round when blocks
 * are small. */
Test(algos_b, scratch_and_message_counts) {
  for (int r = 0; r < 5; r++) {
    plan_t *p;
    algo_args_t a = {.coll = COLL_REDUCE_SCATTER,
                     .rank = r,
                     .nranks = 5,
                     .count = 1 << 20,
                     .dtype = CHORUS_FLOAT32,
                     .chunk_bytes = 4096};
    cr_assert_eq(algo_ring_reduce_scatter(&a, &p), 0);
    cr_assert_leq(p->scratch_bytes, 8 * 4096);
    plan_free(p);
    a.coll = COLL_ALLGATHER;
    cr_assert_eq(algo_ring_allgather(&a, &p), 0);
    cr_assert_eq(p->scratch_bytes, 0);
    plan_free(p);
  }
  static const struct {
    coll_kind coll;
    const char *name;
    int n, rounds;
  } cases[] = {
      {COLL_ALLGATHER, "bruck", 7, 3},    {COLL_ALLGATHER, "rd", 8, 3},
      {COLL_ALLGATHER, "direct", 7, 6},   {COLL_ALLTOALL, "bruck", 9, 4},
      {COLL_REDUCE_SCATTER, "rhd", 8, 3}, {COLL_GATHER, "tree", 9, 1},
      {COLL_SCATTER, "tree", 9, 1},
  };
  for (size_t i = 0; i < NELEMS(cases); i++) {
    const algo_desc_t *d = find(cases[i].coll, cases[i].name);
    run_t x;
    run_init(&x, cases[i].n);
    algo_args_t a = {.coll = cases[i].coll,
                     .nranks = cases[i].n,
                     .count = 2,
                     .dtype = CHORUS_INT32,
                     .chunk_bytes = 1 << 20};
    build(&x, d, a);
    cr_assert_eq(sim_exec(x.plans, x.n, NULL, &x.st, NULL, 0), 0);
    /* gather/scatter: one message per non-root rank */
    uint64_t want = (uint64_t)x.n * (uint64_t)cases[i].rounds;
    if (cases[i].coll == COLL_GATHER || cases[i].coll == COLL_SCATTER)
      want = (uint64_t)x.n - 1;
    cr_assert_eq(x.st.messages, want, "%s/%s: %llu messages", coll_kind_str(cases[i].coll), d->name,
                 (unsigned long long)x.st.messages);
    run_free(&x);
  }
}

/* The direct allgather waits for nothing: every send and receive of a rank
 * is ready at once (one of each per peer and chunk, the sends reading the
 * caller's block), and each peer's block lands where it belongs. */
Test(algos_b, direct_allgather_has_no_dependencies) {
  for (int ip = 0; ip < 2; ip++)
    for (int r = 0; r < 5; r++) {
      plan_t *p;
      algo_args_t a = {.coll = COLL_ALLGATHER,
                       .rank = r,
                       .nranks = 5,
                       .count = 3000,
                       .dtype = CHORUS_FLOAT32,
                       .inplace = ip,
                       .chunk_bytes = 4096};
      cr_assert_eq(algo_direct_allgather(&a, &p), 0);
      int sends = 0, recvs = 0, copies = 0;
      for (uint32_t i = 0; i < p->nsteps; i++) {
        const plan_step_t *st = &p->steps[i];
        cr_assert_eq(st->ndeps, 0, "rank %d step %u waits", r, i);
        if (st->kind == STEP_SEND) {
          sends++;
          cr_assert_eq(st->src.buf, ip ? BUF_RECV : BUF_SEND);
          cr_assert_eq(st->src.off, (ip ? (size_t)r * 12000 : 0) + st->msg % 3 * 4096);
        } else if (st->kind == STEP_RECV) {
          recvs++;
          cr_assert_eq(st->dst.off, (size_t)st->peer * 12000 + st->msg % 3 * 4096);
          cr_assert_eq(st->msg / 3, (uint32_t)algo_mod(r - st->peer, 5) - 1);
        } else {
          copies++;
        }
      }
      /* 12000 bytes: 3 chunks a block, to each of 4 peers */
      cr_assert_eq(sends, 12);
      cr_assert_eq(recvs, 12);
      cr_assert_eq(copies, ip ? 0 : 1);
      plan_free(p);
    }
}
