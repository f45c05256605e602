/*
 * test_algos_a.c - allreduce (rd, rhd, dbtree, hier), bcast (tree, chain,
 * ring, hier), reduce (tree, chain, ring) and hierarchical allgather, run
 * with real data through the reference interpreter (sim.h) and checked
 * against check.h's reference, bitwise across ranks.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "algos/algos.h"
#include "check.h"
#include "sim.h"

typedef struct algo_case {
  coll_kind coll;
  const char *name;
  algo_build_fn fn;
} algo_case_t;

static const algo_case_t algos[] = {
    {COLL_ALLREDUCE, "rd", algo_rd_allreduce},
    {COLL_ALLREDUCE, "rhd", algo_rhd_allreduce},
    {COLL_ALLREDUCE, "dbtree", algo_dbtree_allreduce},
    {COLL_ALLREDUCE, "hier", algo_hier_allreduce},
    {COLL_BCAST, "tree", algo_tree_bcast},
    {COLL_BCAST, "chain", algo_chain_bcast},
    {COLL_BCAST, "ring", algo_ring_bcast},
    {COLL_BCAST, "hier", algo_hier_bcast},
    {COLL_BCAST, "linear", algo_linear_bcast},
    {COLL_REDUCE, "tree", algo_tree_reduce},
    {COLL_REDUCE, "chain", algo_chain_reduce},
    {COLL_REDUCE, "ring", algo_ring_reduce},
    {COLL_ALLGATHER, "hier", algo_hier_allgather},
};
#define NALGOS (sizeof(algos) / sizeof(algos[0]))

typedef struct run {
  int n;
  size_t count;
  chorus_dtype dt;
  chorus_op op;
  bool inplace;
  bool own_placed; /* allgather out of place, the own block put in recv first */
  int root;
  size_t chunk;
  const topo_t *topo;
} run_t;

static bool reducing(coll_kind c) {
  return c == COLL_ALLREDUCE || c == COLL_REDUCE;
}

/* A COPY whose source and destination are the same memory (in place, the
 * send buffer lies inside the receive buffer at `base`). */
static bool self_copy(const plan_step_t *s, bool inplace, size_t base) {
  if (s->kind != STEP_COPY)
    return false;
  size_t d = s->dst.off + (s->dst.buf == BUF_SEND ? base : 0);
  size_t o = s->src.off + (s->src.buf == BUF_SEND ? base : 0);
  bool same_buf = s->dst.buf == s->src.buf ||
                  (inplace && s->dst.buf != BUF_SCRATCH && s->src.buf != BUF_SCRATCH);
  return same_buf && d == o;
}

/* Memory the step touches: up to three (space, off, bytes, writes) ranges.
 * In place the send buffer is the receive buffer from `base` on, so both
 * map to space BUF_RECV. */
typedef struct access {
  int space;
  size_t off, bytes;
  bool write;
} access_t;

static int step_access(const plan_step_t *s, bool inplace, size_t base, access_t acc[3]) {
  int k = 0;
#define ACC(ref, w)                                                                                \
  do {                                                                                             \
    bool snd = (ref).buf == BUF_SEND && inplace;                                                   \
    acc[k++] = (access_t){snd ? BUF_RECV : (ref).buf, (ref).off + (snd ? base : 0), s->bytes, w};  \
  } while (0)
  switch (s->kind) {
  case STEP_SEND:
    ACC(s->src, false);
    break;
  case STEP_RECV:
    ACC(s->dst, true);
    break;
  case STEP_REDUCE:
    ACC(s->dst, true);
    ACC(s->src, false);
    ACC(s->src2, false);
    break;
  case STEP_COPY:
    ACC(s->dst, true);
    ACC(s->src, false);
    break;
  case STEP_SCALE:
    ACC(s->dst, true);
    break;
  default:
    break;
  }
#undef ACC
  return k;
}

/* Every two steps of one rank that touch the same bytes, one of them
 * writing, are ordered by the rank's own dependencies (not only through
 * other ranks' messages), and nothing writes the send buffer. Dependencies
 * point from lower to higher step indices (the builders' order). */
static void check_hazards(const plan_t *p, bool inplace, size_t base, const char *what) {
  const uint32_t ns = p->nsteps, words = (ns + 63) / 64;
  uint64_t *reach = calloc((size_t)ns * words + 1, sizeof(uint64_t));
  cr_assert(reach);
  for (uint32_t i = ns; i-- > 0;) {
    const plan_step_t *s = &p->steps[i];
    for (uint32_t k = 0; k < s->nsucc; k++) {
      uint32_t j = p->succ[s->succ_off + k];
      cr_assert_gt(j, i, "%s rank %d: step %u depends on later step %u", what, p->rank, j, i);
      reach[(size_t)i * words + j / 64] |= 1ull << (j % 64);
      for (uint32_t w = 0; w < words; w++)
        reach[(size_t)i * words + w] |= reach[(size_t)j * words + w];
    }
  }
  for (uint32_t i = 0; i < ns; i++) {
    access_t ai[3];
    int ni = step_access(&p->steps[i], inplace, base, ai);
    for (int x = 0; x < ni; x++)
      cr_assert(!(ai[x].write && ai[x].space == BUF_SEND), "%s rank %d step %u writes the input",
                what, p->rank, i);
    for (uint32_t j = i + 1; j < ns; j++) {
      if (reach[(size_t)i * words + j / 64] >> (j % 64) & 1)
        continue;
      access_t aj[3];
      int nj = step_access(&p->steps[j], inplace, base, aj);
      for (int x = 0; x < ni; x++)
        for (int y = 0; y < nj; y++) {
          if (!ai[x].write && !aj[y].write)
            continue;
          if (ai[x].space != aj[y].space || !ai[x].bytes || !aj[y].bytes)
            continue;
          bool overlap = ai[x].off < aj[y].off + aj[y].bytes && aj[y].off < ai[x].off + ai[x].bytes;
          cr_assert(!overlap, "%s rank %d: steps %u (%s) and %u (%s) race on %s [%zu, %zu)", what,
                    p->rank, i, plan_step_kind_str(p->steps[i].kind), j,
                    plan_step_kind_str(p->steps[j].kind), plan_buf_str(ai[x].space), ai[x].off,
                    ai[x].off + ai[x].bytes);
        }
    }
  }
  free(reach);
}

static void run_case(const algo_case_t *al, const run_t *o) {
  const int n = o->n;
  const size_t es = chorus_dtype_size(o->dt), bytes = o->count * es;
  const bool ag = al->coll == COLL_ALLGATHER;
  const size_t rbytes = ag ? bytes * (size_t)n : bytes;
  /* inputs of bcast and allgather: the sum pattern of the owning rank */
  const chorus_op fill_op = reducing(al->coll) ? o->op : CHORUS_SUM;
  plan_t **plans = calloc((size_t)n, sizeof(*plans));
  sim_buf_t *bufs = calloc((size_t)n, sizeof(*bufs));
  uint8_t **recv = calloc((size_t)n, sizeof(*recv)), **send = calloc((size_t)n, sizeof(*send));
  uint8_t *want = malloc(rbytes + 1), *orig = malloc(bytes + 1);
  char err[256];
  cr_assert(plans && bufs && recv && send && want && orig);

  for (int r = 0; r < n; r++) {
    algo_args_t a = {.coll = al->coll,
                     .rank = r,
                     .nranks = n,
                     .root = o->root,
                     .count = o->count,
                     .dtype = o->dt,
                     .op = o->op,
                     .inplace = o->inplace,
                     .own_placed = o->own_placed,
                     .chunk_bytes = o->chunk,
                     .topo = o->topo};
    int rc = al->fn(&a, &plans[r]);
    cr_assert_eq(rc, 0, "%s/%s n=%d count=%zu rank %d: build %d", coll_kind_str(al->coll), al->name,
                 n, o->count, r, rc);
    cr_assert_lt(plans[r]->nmsgs, ALGO_MAX_MSGS + 1);
    const size_t base = ag ? (size_t)r * bytes : 0;
    if (o->count <= 1009 && n <= 9)
      check_hazards(plans[r], o->inplace, base, al->name);
    for (uint32_t i = 0; i < plans[r]->nsteps; i++)
      cr_assert(!self_copy(&plans[r]->steps[i], o->inplace, base),
                "%s/%s rank %d step %u copies a range onto itself", coll_kind_str(al->coll),
                al->name, r, i);

    recv[r] = malloc(rbytes + 1);
    memset(recv[r], 0x5a, rbytes + 1);
    bool has_send = al->coll != COLL_BCAST || r == o->root;
    bool has_recv = al->coll != COLL_REDUCE || r == o->root;
    if (o->inplace) {
      send[r] = NULL;
      uint8_t *s = recv[r] + base;
      if (has_send)
        chk_fill(s, o->count, o->dt, fill_op, r);
      bufs[r] = (sim_buf_t){s, bytes, recv[r], rbytes};
    } else {
      send[r] = malloc(bytes + 1);
      memset(send[r], 0x5a, bytes + 1);
      if (has_send)
        chk_fill(send[r], o->count, o->dt, fill_op, r);
      bufs[r] = (sim_buf_t){has_send ? send[r] : NULL, has_send ? bytes : 0,
                            has_recv ? recv[r] : NULL, has_recv ? rbytes : 0};
      if (o->own_placed) { /* placed, and no step of the plan writes it again */
        memcpy(recv[r] + base, send[r], bytes);
        for (uint32_t i = 0; i < plans[r]->nsteps; i++) {
          const plan_step_t *s = &plans[r]->steps[i];
          cr_assert(s->kind == STEP_SEND || s->dst.buf != BUF_RECV || s->dst.off >= base + bytes ||
                        s->dst.off + s->bytes <= base,
                    "allgather/%s n=%d count=%zu rank %d step %u writes the own block, placed "
                    "already",
                    al->name, n, o->count, r, i);
        }
      }
    }
  }
  sim_stats_t st;
  int rc = sim_exec(plans, n, bufs, &st, err, sizeof(err));
  cr_assert_eq(rc, 0, "%s/%s n=%d count=%zu inplace=%d root=%d: %s", coll_kind_str(al->coll),
               al->name, n, o->count, o->inplace, o->root, err);

  for (int r = 0; r < n; r++) {
    switch (al->coll) {
    case COLL_ALLREDUCE:
      if (r == 0)
        cr_assert_eq(chk_verify(recv[0], o->count, o->dt, o->op, n, 0, al->name), 0,
                     "allreduce/%s n=%d count=%zu %s/%s", al->name, n, o->count,
                     chorus_dtype_name(o->dt), chorus_op_name(o->op));
      else
        cr_assert_eq(memcmp(recv[r], recv[0], bytes), 0, "allreduce/%s rank %d differs from 0",
                     al->name, r);
      break;
    case COLL_REDUCE:
      if (r == o->root)
        cr_assert_eq(chk_verify(recv[r], o->count, o->dt, o->op, n, r, al->name), 0,
                     "reduce/%s n=%d root=%d count=%zu", al->name, n, o->root, o->count);
      break;
    case COLL_BCAST:
      chk_fill(want, o->count, o->dt, CHORUS_SUM, o->root);
      cr_assert_eq(memcmp(recv[r], want, bytes), 0, "bcast/%s n=%d root=%d count=%zu rank %d",
                   al->name, n, o->root, o->count, r);
      break;
    default:
      for (int q = 0; q < n; q++)
        chk_fill(want + (size_t)q * bytes, o->count, o->dt, CHORUS_SUM, q);
      cr_assert_eq(memcmp(recv[r], want, rbytes), 0, "allgather/%s n=%d count=%zu rank %d",
                   al->name, n, o->count, r);
      break;
    }
    /* inputs are left alone (not in place), and nothing is written past the end */
    if (send[r] && bufs[r].send) {
      chk_fill(orig, o->count, o->dt, fill_op, r);
      cr_assert_eq(memcmp(send[r], orig, bytes), 0, "%s/%s rank %d: input modified",
                   coll_kind_str(al->coll), al->name, r);
    }
    cr_assert_eq(recv[r][rbytes], 0x5a);
    /* a non-root's reduce buffer in place is its input, untouched */
    if (al->coll == COLL_REDUCE && o->inplace && r != o->root) {
      chk_fill(orig, o->count, o->dt, o->op, r);
      cr_assert_eq(memcmp(recv[r], orig, bytes), 0, "reduce/%s rank %d: input modified", al->name,
                   r);
    }
  }
  if (n > 1 && o->count >= (size_t)n)
    cr_assert_gt(st.messages, 0);
  for (int r = 0; r < n; r++) {
    free(recv[r]);
    free(send[r]);
    plan_free(plans[r]);
  }
  free(plans);
  free(bufs);
  free(recv);
  free(send);
  free(want);
  free(orig);
}

/* hosts of ranks round robin over `nh` hosts (non-contiguous) */
static topo_t rr_topo(int n, int nh, int *host_of) {
  for (int q = 0; q < n; q++)
    host_of[q] = q % nh;
  return (topo_t){.nranks = n, .nhosts = nh < n ? nh : n, .host_of = host_of};
}

static void run_all_shapes(const algo_case_t *al, int n, const topo_t *topo) {
  static const size_t counts[] = {0, 1, 1009, 65536};
  for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++)
    for (int ip = 0; ip < 2; ip++) {
      run_t o = {.n = n,
                 .count = counts[ci],
                 .dt = CHORUS_FLOAT32,
                 .op = ip ? CHORUS_AVG : CHORUS_SUM,
                 .inplace = ip,
                 .root = n / 2,
                 .chunk = counts[ci] > 2000 ? 4096 : 64,
                 .topo = topo};
      if (al->coll == COLL_ALLREDUCE && ip)
        o.dt = CHORUS_INT32;
      run_case(al, &o);
    }
}

Test(algos_a, every_algorithm_every_shape, .timeout = 120) {
  static const int ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16};
  int host_of[16];
  for (size_t i = 0; i < NALGOS; i++)
    for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
      run_all_shapes(&algos[i], ns[k], NULL);
      if (strcmp(algos[i].name, "hier") == 0 && ns[k] > 1) {
        topo_t t = rr_topo(ns[k], 2, host_of);
        run_all_shapes(&algos[i], ns[k], &t);
      }
    }
}

Test(algos_a, every_dtype_and_op, .timeout = 120) {
  static const int ns[] = {5, 8};
  int host_of[8];
  for (size_t i = 0; i < NALGOS; i++)
    for (size_t k = 0; k < 2; k++) {
      topo_t t = rr_topo(ns[k], 2, host_of);
      for (int dt = 0; dt < CHORUS_DTYPE_COUNT; dt++)
        for (int op = 0; op < CHORUS_OP_COUNT; op++) {
          if (!reducing(algos[i].coll) && op > 0)
            break;
          run_t o = {.n = ns[k],
                     .count = 1009,
                     .dt = (chorus_dtype)dt,
                     .op = (chorus_op)op,
                     .inplace = (dt + op) % 2,
                     .root = 1,
                     .chunk = 200,
                     .topo = strcmp(algos[i].name, "hier") == 0 ? &t : NULL};
          run_case(&algos[i], &o);
        }
    }
}

Test(algos_a, bcast_and_reduce_every_root, .timeout = 120) {
  for (size_t i = 0; i < NALGOS; i++) {
    if (algos[i].coll != COLL_BCAST && algos[i].coll != COLL_REDUCE)
      continue;
    for (int n = 1; n <= 9; n++) {
      int host_of[9] = {0, 0, 1, 0, 2, 1, 2, 2, 0}; /* non-contiguous, numbered by lowest rank */
      int nh = n >= 5 ? 3 : n >= 3 ? 2 : 1;
      topo_t t = {.nranks = n, .nhosts = nh, .host_of = host_of};
      for (int root = 0; root < n; root++)
        for (int ip = 0; ip < 2; ip++) {
          run_t o = {.n = n,
                     .count = ip ? 1 : 777,
                     .dt = CHORUS_INT32,
                     .op = CHORUS_SUM,
                     .inplace = ip,
                     .root = root,
                     .chunk = 64,
                     .topo = &t};
          run_case(&algos[i], &o);
        }
    }
  }
}

Test(algos_a, hierarchical_topologies, .timeout = 120) {
  static const struct {
    int n, nh;
    int host_of[12];
  } topos[] = {
      {4, 2, {0, 0, 1, 1}},                          /* 2x2 */
      {9, 3, {0, 0, 0, 1, 1, 1, 2, 2, 2}},           /* 3x3 */
      {8, 4, {0, 0, 1, 1, 2, 2, 3, 3}},              /* 4 hosts x 2 */
      {8, 2, {0, 0, 0, 0, 1, 1, 1, 1}},              /* 2 hosts x 4 */
      {6, 3, {0, 0, 0, 1, 2, 2}},                    /* uneven 3,1,2 */
      {6, 3, {0, 1, 0, 2, 0, 2}},                    /* uneven, non-contiguous */
      {8, 2, {0, 1, 1, 0, 0, 1, 0, 1}},              /* 2x4 non-contiguous */
      {9, 3, {0, 1, 2, 2, 1, 0, 0, 1, 2}},           /* 3x3 non-contiguous */
      {7, 4, {0, 1, 2, 3, 0, 0, 0}},                 /* one big host, three single */
      {12, 3, {0, 0, 1, 2, 1, 0, 2, 1, 0, 2, 1, 0}}, /* uneven 5,4,3 */
  };
  static const size_t counts[] = {0, 1, 1009, 65536};
  for (size_t i = 0; i < NALGOS; i++) {
    if (strcmp(algos[i].name, "hier") != 0)
      continue;
    for (size_t k = 0; k < sizeof(topos) / sizeof(topos[0]); k++) {
      topo_t t = {.nranks = topos[k].n, .nhosts = topos[k].nh, .host_of = topos[k].host_of};
      for (size_t ci = 0; ci < 4; ci++)
        for (int ip = 0; ip < 3; ip++) { /* 2: an allgather's own block placed */
          if (ip == 2 && algos[i].coll != COLL_ALLGATHER)
            continue;
          run_t o = {.n = topos[k].n,
                     .count = counts[ci],
                     .dt = ip == 1 ? CHORUS_FLOAT64 : CHORUS_BFLOAT16,
                     .op = ip == 1 ? CHORUS_AVG : CHORUS_MAX,
                     .inplace = ip == 1,
                     .own_placed = ip == 2,
                     .root = topos[k].n - 1,
                     .chunk = counts[ci] > 2000 ? 8192 : 48,
                     .topo = &t};
          run_case(&algos[i], &o);
        }
    }
  }
}

Test(algos_a, sixty_four_ranks, .timeout = 120) {
  int host_of[64], uneven[64];
  topo_t even = rr_topo(64, 8, host_of);
  for (int q = 0; q < 64; q++)
    uneven[q] = q < 30 ? 0 : q < 31 ? 1 : q < 50 ? 2 : 3;
  topo_t odd = {.nranks = 64, .nhosts = 4, .host_of = uneven};
  for (size_t i = 0; i < NALGOS; i++)
    for (int ip = 0; ip < 2; ip++) {
      run_t o = {.n = 64,
                 .count = 6400,
                 .dt = CHORUS_FLOAT32,
                 .op = CHORUS_SUM,
                 .inplace = ip,
                 .root = 37,
                 .chunk = 1024,
                 .topo = ip ? &odd : &even};
      run_case(&algos[i], &o);
    }
}

/* Scratch stays a few chunks however long the vector. */
Test(algos_a, scratch_is_bounded) {
  int host_of[8];
  topo_t t = rr_topo(8, 2, host_of);
  for (size_t i = 0; i < NALGOS; i++)
    for (int r = 0; r < 8; r++) {
      algo_args_t a = {.coll = algos[i].coll,
                       .rank = r,
                       .nranks = 8,
                       .root = 3,
                       .count = 1 << 20,
                       .dtype = CHORUS_FLOAT32,
                       .op = CHORUS_SUM,
                       .chunk_bytes = 4096,
                       .topo = &t};
      plan_t *p;
      cr_assert_eq(algos[i].fn(&a, &p), 0);
      cr_assert_leq(p->scratch_bytes, 16 * 4096, "%s/%s: %zu bytes of scratch",
                    coll_kind_str(algos[i].coll), algos[i].name, p->scratch_bytes);
      plan_free(p);
    }
}

/* Scratch is no larger than the steps reach: a plan with fewer receives
 * into scratch than its algorithm has slots keeps only those (a 2-rank
 * 2 MiB ring allreduce in 1 MiB chunks declared eight 1 MiB slots for its
 * one receive: past CHORUS_BUFFSIZE, so every call allocated, and faulted
 * in, 8 MiB of its own). */
Test(algos_a, scratch_is_what_the_steps_reach) {
  int host_of[8];
  for (int n = 2; n <= 8; n += 6) {
    topo_t t = rr_topo(n, 2, host_of);
    for (size_t i = 0; i < NALGOS; i++)
      for (int r = 0; r < n; r++) {
        algo_args_t a = {.coll = algos[i].coll,
                         .rank = r,
                         .nranks = n,
                         .root = 1,
                         .count = 1 << 19,
                         .dtype = CHORUS_FLOAT32,
                         .op = CHORUS_SUM,
                         .chunk_bytes = 1 << 20,
                         .topo = &t};
        plan_t *p;
        cr_assert_eq(algos[i].fn(&a, &p), 0);
        cr_assert_eq(p->scratch_bytes, plan_extent(p, BUF_SCRATCH),
                     "%s/%s at %d ranks: %zu bytes of scratch, steps reach %zu",
                     coll_kind_str(algos[i].coll), algos[i].name, n, p->scratch_bytes,
                     plan_extent(p, BUF_SCRATCH));
        plan_free(p);
      }
  }
}

/* Recursive doubling out of place receives its first exchange straight into
 * the receive buffer, which that exchange's reduce then overwrites in place:
 * no scratch lies between the copy in and the reduce (at 2 ranks none at
 * all). In place the receive buffer is what the send reads, so the receive
 * goes to scratch. A 2-rank 2 MiB allreduce over shm, 10 interleaved rounds,
 * medians: 406 us through scratch, 364 straight in (Open MPI 344). */
Test(algos_a, rd_first_exchange_lands_in_recv) {
  const int ns[] = {2, 3, 4, 8};
  for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++)
    for (int ip = 0; ip < 2; ip++)
      for (int r = 0; r < ns[ni]; r++) {
        const int n = ns[ni];
        algo_args_t a = {.coll = COLL_ALLREDUCE,
                         .rank = r,
                         .nranks = n,
                         .count = 4096,
                         .dtype = CHORUS_FLOAT32,
                         .op = CHORUS_SUM,
                         .inplace = ip,
                         .chunk_bytes = 4096};
        plan_t *p;
        cr_assert_eq(algo_rd_allreduce(&a, &p), 0);
        int p2 = 1, lg = 0;
        while (p2 * 2 <= n) {
          p2 *= 2;
          lg++;
        }
        const bool folds = r < 2 * (n - p2); /* fold into a power of two, see rd_allreduce.c */
        const bool extra = folds && r % 2 == 0;
        int into_recv = 0, into_scratch = 0;
        for (uint32_t k = 0; k < p->nsteps; k++)
          if (p->steps[k].kind == STEP_RECV) {
            into_recv += p->steps[k].dst.buf == BUF_RECV;
            into_scratch += p->steps[k].dst.buf == BUF_SCRATCH;
          }
        /* 4 chunks; an extra rank only sends its vector and receives the result */
        int want_recv = extra ? 4 : (!ip && !folds ? 4 : 0);
        int want_scratch = extra ? 0 : 4 * (lg + folds) - want_recv;
        cr_assert_eq(into_recv, want_recv, "%d ranks, rank %d, %s: %d receives into recv, want %d",
                     n, r, ip ? "in place" : "out of place", into_recv, want_recv);
        cr_assert_eq(into_scratch, want_scratch,
                     "%d ranks, rank %d, %s: %d receives into scratch, want %d", n, r,
                     ip ? "in place" : "out of place", into_scratch, want_scratch);
        if (n == 2 && !ip)
          cr_assert_eq(p->scratch_bytes, 0, "2 ranks out of place: %zu bytes of scratch",
                       p->scratch_bytes);
        plan_free(p);
      }
}

/* More messages than 24 bits can number: refused, nothing leaked. */
Test(algos_a, too_many_messages_is_e2big) {
  for (size_t i = 0; i < NALGOS; i++) {
    algo_args_t a = {.coll = algos[i].coll,
                     .rank = 1,
                     .nranks = 4,
                     .root = 0,
                     .count = (size_t)1 << 26,
                     .dtype = CHORUS_INT8,
                     .op = CHORUS_SUM,
                     .chunk_bytes = 1};
    plan_t *p = (plan_t *)&a;
    cr_assert_eq(algos[i].fn(&a, &p), -E2BIG, "%s/%s", coll_kind_str(algos[i].coll), algos[i].name);
    cr_assert_null(p);
  }
}

/* Every algorithm is in the table under its name. */
Test(algos_a, registered) {
  for (size_t i = 0; i < NALGOS; i++) {
    const algo_desc_t *d = algo_find(algos[i].coll, algos[i].name);
    cr_assert_not_null(d, "%s/%s", coll_kind_str(algos[i].coll), algos[i].name);
    cr_assert_eq(d->build, algos[i].fn);
    cr_assert_eq(!!(d->flags & ALGO_HIERARCHICAL), strcmp(algos[i].name, "hier") == 0);
  }
  cr_assert_eq(algo_find(COLL_ALLREDUCE, NULL)->build, algo_ring_allreduce);
}
