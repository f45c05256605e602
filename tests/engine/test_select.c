/*
 * test_select.c - algorithm selection: CHORUS_ALGO parsing (good strings,
 * bad ones named in the error), byte ranges, the alpha-beta model's choices
 * at the sizes where they are well known, deterministic mode, and the
 * explanation.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "algos/algos.h"
#include "select.h"

static algo_args_t shape(coll_kind coll, int n, size_t bytes, const topo_t *t) {
  return (algo_args_t){.coll = coll,
                       .rank = 0,
                       .nranks = n,
                       .count = bytes / 4,
                       .dtype = CHORUS_FLOAT32,
                       .op = CHORUS_SUM,
                       .chunk_bytes = 256 << 10,
                       .topo = t};
}

static topo_t hosts(int h, int r, int *host_of) {
  for (int i = 0; i < h * r; i++)
    host_of[i] = i / r;
  return (topo_t){.nranks = h * r, .nhosts = h, .host_of = host_of};
}

Test(select, parses_rules) {
  select_ctx_t s;
  char err[256];
  cr_assert_eq(select_init(&s, "allreduce=ring;bcast=tree", false, err, sizeof(err)), 0, "%s", err);
  cr_assert_eq(s.nrules, 2);
  cr_assert_eq(s.rules[0].coll, COLL_ALLREDUCE);
  cr_assert_eq(s.rules[0].algo, algo_find(COLL_ALLREDUCE, "ring"));
  cr_assert_eq(s.rules[0].min_bytes, 0);
  cr_assert_eq(s.rules[0].max_bytes, SIZE_MAX);
  cr_assert_eq(s.rules[1].coll, COLL_BCAST);
  cr_assert_eq(s.rules[1].algo, algo_find(COLL_BCAST, "tree"));
  select_fini(&s);

  cr_assert_eq(select_init(&s, "allreduce=rd:0-64K,ring:64K-", false, err, sizeof(err)), 0, "%s",
               err);
  cr_assert_eq(s.nrules, 2);
  cr_assert_eq(s.rules[0].algo, algo_find(COLL_ALLREDUCE, "rd"));
  cr_assert_eq(s.rules[0].min_bytes, 0);
  cr_assert_eq(s.rules[0].max_bytes, 65536);
  cr_assert_eq(s.rules[1].algo, algo_find(COLL_ALLREDUCE, "ring"));
  cr_assert_eq(s.rules[1].min_bytes, 65536);
  cr_assert_eq(s.rules[1].max_bytes, SIZE_MAX);
  select_fini(&s);

  /* spaces, suffixes, empty parts, open lower end */
  cr_assert_eq(select_init(&s, " allreduce = rd : -1M , rhd:1M-2G ; ;allgather=bruck:512-4KiB;",
                           false, err, sizeof(err)),
               0, "%s", err);
  cr_assert_eq(s.nrules, 3);
  cr_assert_eq(s.rules[0].max_bytes, 1u << 20);
  cr_assert_eq(s.rules[1].algo, algo_find(COLL_ALLREDUCE, "rhd"));
  cr_assert_eq(s.rules[1].min_bytes, 1u << 20);
  cr_assert_eq(s.rules[1].max_bytes, (size_t)2 << 30);
  cr_assert_eq(s.rules[2].coll, COLL_ALLGATHER);
  cr_assert_eq(s.rules[2].min_bytes, 512);
  cr_assert_eq(s.rules[2].max_bytes, 4096);
  select_fini(&s);

  cr_assert_eq(select_init(&s, NULL, false, err, sizeof(err)), 0);
  cr_assert_eq(s.nrules, 0);
  cr_assert_gt(s.inter.alpha, s.intra.alpha);
  cr_assert_gt(s.inter.beta, s.intra.beta);
  cr_assert_gt(s.gamma, 0);
  select_fini(&s);
  cr_assert_eq(select_init(&s, "", false, err, sizeof(err)), 0);
  select_fini(&s);
}

static void bad(const char *spec, const char *want) {
  select_ctx_t s;
  char err[256] = "";
  cr_assert_eq(select_init(&s, spec, false, err, sizeof(err)), -1, "'%s' accepted", spec);
  cr_assert(strstr(err, want), "'%s': error '%s' lacks '%s'", spec, err, want);
  cr_assert_eq(s.nrules, 0);
  cr_assert_null(s.rules);
}

Test(select, rejects_bad_rules) {
  bad("allreduce", "'allreduce': expected collective=algorithm");
  bad("allreduce=ring;allreduz=ring", "unknown collective 'allreduz'");
  bad("allreduce=nosuch", "unknown algorithm 'nosuch' for allreduce (known: ring, ");
  bad("bcast=rhd", "unknown algorithm 'rhd' for bcast");
  bad("allreduce=rd:64K", "range '64K' is not min-max");
  bad("allreduce=rd:1Q-2M", "bad size '1Q'");
  bad("allreduce=rd:0-64K,ring:64K-x", "bad size 'x'");
  bad("allreduce=rd:64K-1K", "empty range 64K-1K");
  bad("allreduce=", "an algorithm name is missing");
  bad("allreduce=ring,", "an algorithm name is missing");
  bad("allreduce=rd:99999999999999999999G-", "bad size");
}

Test(select, ranges_pick_by_size) {
  select_ctx_t s;
  char err[256], why[256];
  cr_assert_eq(select_init(&s, "allreduce=rd:0-64K,ring:64K-", false, err, sizeof(err)), 0);
  algo_args_t a = shape(COLL_ALLREDUCE, 8, 8, NULL);
  const algo_desc_t *d = select_algo(&s, &a, why, sizeof(why));
  cr_assert_str_eq(d->name, "rd", "%s", why);
  cr_assert(strstr(why, "rd (CHORUS_ALGO)"), "%s", why);
  a = shape(COLL_ALLREDUCE, 8, 65536 - 4, NULL);
  cr_assert_str_eq(select_algo(&s, &a, why, sizeof(why))->name, "rd", "%s", why);
  a = shape(COLL_ALLREDUCE, 8, 65536, NULL);
  cr_assert_str_eq(select_algo(&s, &a, why, sizeof(why))->name, "ring", "%s", why);
  a = shape(COLL_ALLREDUCE, 8, 64 << 20, NULL);
  cr_assert_str_eq(select_algo(&s, &a, why, sizeof(why))->name, "ring", "%s", why);
  cr_assert(strstr(why, "allreduce 64 MiB on 8 ranks/1 host: ring (CHORUS_ALGO)"), "%s", why);
  /* a collective without a rule goes to the model */
  a = shape(COLL_BCAST, 8, 8, NULL);
  d = select_algo(&s, &a, why, sizeof(why));
  cr_assert_not_null(d);
  cr_assert(strstr(why, "(model)"), "%s", why);
  select_fini(&s);
}

static bool latency_algo(const char *name) {
  return !strcmp(name, "rd") || !strcmp(name, "tree") || !strcmp(name, "dbtree") ||
         !strcmp(name, "dissemination") || !strcmp(name, "rhd");
}

Test(select, model_small_and_large) {
  select_ctx_t s;
  char err[256], why[256];
  cr_assert_eq(select_init(&s, NULL, false, err, sizeof(err)), 0);

  algo_args_t a = shape(COLL_ALLREDUCE, 8, 8, NULL);
  const algo_desc_t *d = select_algo(&s, &a, why, sizeof(why));
  cr_assert(latency_algo(d->name), "8 B: %s (%s)", d->name, why);
  cr_assert_str_neq(d->name, "ring", "%s", why);
  cr_assert(strstr(why, d->name), "%s", why);
  cr_assert(strstr(why, "allreduce 8 B on 8 ranks/1 host: "), "%s", why);
  cr_assert(strstr(why, "(model) < "), "%s", why);
  const algo_desc_t *ring = algo_find(COLL_ALLREDUCE, "ring");
  cr_assert_lt(select_cost(&s, d, &a), select_cost(&s, ring, &a));

  a = shape(COLL_ALLREDUCE, 8, 64 << 20, NULL);
  d = select_algo(&s, &a, why, sizeof(why));
  cr_assert(!strcmp(d->name, "ring") || !strcmp(d->name, "rhd"), "64 MiB: %s (%s)", d->name, why);
  cr_assert(strstr(why, d->name), "%s", why);
  const algo_desc_t *rd = algo_find(COLL_ALLREDUCE, "rd");
  cr_assert_lt(select_cost(&s, ring, &a), select_cost(&s, rd, &a));
  /* ring's closed form, 64 MiB at 8 ranks: 2*7 alpha + 2*7/8 N beta + 7/8 N gamma */
  double N = 64.0 * (1 << 20);
  double want = 14 * s.intra.alpha + 1.75 * N * s.intra.beta + 0.875 * N * s.gamma;
  cr_assert_float_eq(select_cost(&s, ring, &a), want, want * 1e-9);

  /* bcast: a tree for small messages */
  a = shape(COLL_BCAST, 16, 8, NULL);
  d = select_algo(&s, &a, why, sizeof(why));
  cr_assert_str_eq(d->name, "tree", "%s", why);
  /* one rank: nothing to move */
  a = shape(COLL_ALLREDUCE, 1, 1 << 20, NULL);
  cr_assert_eq(select_cost(&s, ring, &a), 0.0);
  cr_assert_not_null(select_algo(&s, &a, NULL, 0));
  select_fini(&s);
}

/* Two ranks of one host: one exchange of the whole vector (rd) up to 16
 * MiB, where the ring's half reduction starts to pay for its second half
 * (which reads what the peer just reduced: SEL_PEER_CACHE). Over a wire
 * (peer_cache 0, as coll.c sets for network providers) the ring takes over
 * between 32 and 64 KiB (select.c: 12.8-13.1 us against 14.8-15.3 at 32
 * KiB over shm). */
Test(select, two_rank_allreduce_by_size) {
  select_ctx_t s;
  char err[256], why[256];
  cr_assert_eq(select_init(&s, NULL, false, err, sizeof(err)), 0);
  static const struct {
    size_t bytes;
    const char *here, *wire;
  } cases[] = {{16 << 10, "rd", "rd"},     {32 << 10, "rd", "rd"},    {64 << 10, "rd", "ring"},
               {2 << 20, "rd", "ring"},    {16u << 20, "rd", "ring"}, {32u << 20, "ring", "ring"},
               {64u << 20, "ring", "ring"}};
  for (int wire = 0; wire < 2; wire++) {
    s.peer_cache = wire ? 0 : 4 << 20;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
      algo_args_t a = shape(COLL_ALLREDUCE, 2, cases[i].bytes, NULL);
      const algo_desc_t *d = select_algo(&s, &a, why, sizeof(why));
      cr_assert_str_eq(d->name, wire ? cases[i].wire : cases[i].here, "%zu B%s: %s", cases[i].bytes,
                       wire ? " over a wire" : "", why);
    }
  }
  select_fini(&s);
}

/* Two ranks over a network provider (select_over_network, as coll.c sets
 * for tcp and sock): the reduction of a vector cut in several chunks hides
 * behind the wire while what a rank reduces stays within wire_hide, so one
 * exchange of the whole vector (rd) beats the ring's two up to 2 MiB
 * (measured over sock and tcp, select.c: SEL_WIRE_HIDE); past it recursive
 * doubling reduces all of it from memory and the ring takes over. A vector
 * of one chunk overlaps nothing: there the ring's half reduction counts. */
Test(select, two_rank_allreduce_over_a_network) {
  select_ctx_t s;
  char err[256], why[256];
  cr_assert_eq(select_init(&s, NULL, false, err, sizeof(err)), 0);
  cr_assert_eq(s.wire_hide, 0.0);
  select_over_network(&s);
  cr_assert_eq(s.intra.alpha, s.inter.alpha);
  cr_assert_eq(s.intra.beta, s.inter.beta);
  cr_assert_eq(s.peer_cache, 0.0);
  cr_assert_gt(s.wire_hide, 0.0);
  static const struct {
    size_t chunk, bytes;
    const char *want;
  } cases[] = {
      {512 << 10, 32 << 10, "rd"},  {512 << 10, 512 << 10, "ring"}, {512 << 10, 1 << 20, "rd"},
      {512 << 10, 2 << 20, "rd"},   {512 << 10, 4 << 20, "ring"},   {512 << 10, 64u << 20, "ring"},
      {256 << 10, 512 << 10, "rd"}, {256 << 10, 2 << 20, "rd"},     {256 << 10, 4 << 20, "ring"}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    algo_args_t a = shape(COLL_ALLREDUCE, 2, cases[i].bytes, NULL);
    a.chunk_bytes = cases[i].chunk;
    const algo_desc_t *d = select_algo(&s, &a, why, sizeof(why));
    cr_assert_str_eq(d->name, cases[i].want, "%zu B in %zu B chunks: %s", cases[i].bytes,
                     cases[i].chunk, why);
  }
  /* the same links without the overlap: the ring from 512 KiB on, as before */
  s.wire_hide = 0;
  algo_args_t a = shape(COLL_ALLREDUCE, 2, 2 << 20, NULL);
  a.chunk_bytes = 512 << 10;
  cr_assert_str_eq(select_algo(&s, &a, why, sizeof(why))->name, "ring", "%s", why);
  /* more ranks than two: the overlap changes nothing */
  const algo_desc_t *ring = algo_find(COLL_ALLREDUCE, "ring");
  static const int more[] = {3, 16};
  for (size_t i = 0; i < sizeof(more) / sizeof(more[0]); i++) {
    const int n = more[i];
    algo_args_t b = shape(COLL_ALLREDUCE, n, 2 << 20, NULL);
    s.wire_hide = 0;
    double plain = select_cost(&s, ring, &b);
    select_over_network(&s);
    cr_assert_eq(select_cost(&s, ring, &b), plain, "%d ranks", n);
  }
  select_fini(&s);
}

/* Ranks sharing cores: every message costs a turn, and the bytes share the
 * core's copies, so at 8 ranks on 2 cores recursive doubling (fewest
 * messages) is kept for small vectors and halving-doubling takes over by
 * 256 KiB (measured: rd 1238-1582 us, rhd 662-743); with the turns alone
 * the model kept rd there. */
Test(select, shared_cores_move_the_allreduce_switch) {
  select_ctx_t s;
  char err[256], why[256];
  cr_assert_eq(select_init(&s, NULL, false, err, sizeof(err)), 0);
  algo_args_t a = shape(COLL_ALLREDUCE, 8, 256 << 10, NULL);
  select_link_t intra = s.intra;
  double gamma = s.gamma;
  select_share_cores(&s, 1);
  cr_assert_eq(s.intra.alpha, intra.alpha);
  cr_assert_eq(s.gamma, gamma);
  select_share_cores(&s, 4);
  cr_assert_float_eq(s.intra.beta, 4 * intra.beta, intra.beta * 1e-9);
  cr_assert_float_eq(s.gamma, 4 * gamma, gamma * 1e-9);
  cr_assert_gt(s.intra.alpha, intra.alpha);
  cr_assert_str_eq(select_algo(&s, &a, why, sizeof(why))->name, "rhd", "%s", why);
  a = shape(COLL_ALLREDUCE, 8, 32 << 10, NULL);
  cr_assert_str_eq(select_algo(&s, &a, why, sizeof(why))->name, "rd", "%s", why);
  select_fini(&s);
}

/* A large broadcast: a pipelined chain when every rank has a core, a tree
 * when 8 ranks share 2: its first rounds copy once and twice, leaving cores
 * the chain would have kept busy only by taking turns (64 MiB, a barrier
 * before each call: tree 41-43 ms, chain 65-73). The tree's price with
 * shared cores: 1, 1 and 2 unscaled copies of the vector in its three rounds. */
Test(select, shared_cores_give_a_large_bcast_to_the_tree) {
  select_ctx_t s;
  char err[256], why[256];
  cr_assert_eq(select_init(&s, NULL, false, err, sizeof(err)), 0);
  algo_args_t a = shape(COLL_BCAST, 8, 64 << 20, NULL);
  a.chunk_bytes = 4 << 20;
  cr_assert_str_eq(select_algo(&s, &a, why, sizeof(why))->name, "chain", "%s", why);
  const algo_desc_t *tree = algo_find(COLL_BCAST, "tree");
  double N = 64.0 * (1 << 20), beta = s.intra.beta;
  cr_assert_float_eq(select_cost(&s, tree, &a), 3 * (s.intra.alpha + N * beta), 1e-12);

  select_share_cores(&s, 4);
  cr_assert_str_eq(select_algo(&s, &a, why, sizeof(why))->name, "tree", "%s", why);
  double want = 3 * s.intra.alpha + 4 * N * beta;
  cr_assert_float_eq(select_cost(&s, tree, &a), want, want * 1e-9);
  /* and so at 2 MiB and 32 KiB */
  a = shape(COLL_BCAST, 8, 2 << 20, NULL);
  cr_assert_str_eq(select_algo(&s, &a, why, sizeof(why))->name, "tree", "%s", why);
  a = shape(COLL_BCAST, 8, 32 << 10, NULL);
  cr_assert_str_eq(select_algo(&s, &a, why, sizeof(why))->name, "tree", "%s", why);
  select_fini(&s);
}

/* A broadcast whose receivers pull (over shm, messages past the bounce
 * slots, as coll.c sets pull_min) goes flat among ranks that share cores:
 * the root posts, the n-1 receivers copy out of its buffer, as many at a
 * time as there are cores, one turn for all. Not below pull_min (the root
 * would copy into a bounce slot for each), not past the peer cache, not
 * with a core a rank (not measured), not over a wire, not across hosts. */
Test(select, shared_cores_give_a_pulled_bcast_to_linear) {
  select_ctx_t s;
  char err[256], why[256];
  cr_assert_eq(select_init(&s, NULL, false, err, sizeof(err)), 0);
  s.pull_min = (64 << 10) + 1;
  const algo_desc_t *linear = algo_find(COLL_BCAST, "linear");
  cr_assert_not_null(linear);
  algo_args_t a = shape(COLL_BCAST, 8, 2 << 20, NULL);
  cr_assert_str_neq(select_algo(&s, &a, why, sizeof(why))->name, "linear", "a core a rank: %s",
                    why);
  const double beta = s.intra.beta;
  select_share_cores(&s, 4);
  static const size_t flat[] = {256 << 10, 2 << 20, 4 << 20};
  for (size_t i = 0; i < 3; i++) {
    a = shape(COLL_BCAST, 8, flat[i], NULL);
    cr_assert_str_eq(select_algo(&s, &a, why, sizeof(why))->name, "linear", "%s", why);
    /* one turn; 7 copies on 2 cores: 4 of them in a row, at a core's speed */
    double want = s.intra.alpha + 4 * (double)flat[i] * beta;
    cr_assert_float_eq(select_cost(&s, linear, &a), want, want * 1e-9);
  }
  a = shape(COLL_BCAST, 8, 32 << 10, NULL); /* bounced: the root copies 7 times */
  cr_assert_str_eq(select_algo(&s, &a, why, sizeof(why))->name, "tree", "%s", why);
  a = shape(COLL_BCAST, 8, 64 << 20, NULL);
  a.chunk_bytes = 4 << 20;
  cr_assert_str_eq(select_algo(&s, &a, why, sizeof(why))->name, "tree", "%s", why);
  int host_of[8];
  topo_t two = hosts(2, 4, host_of);
  a = shape(COLL_BCAST, 8, 2 << 20, &two);
  cr_assert_str_neq(select_algo(&s, &a, why, sizeof(why))->name, "linear", "%s", why);
  s.pull_min = 0; /* a wire between them */
  a = shape(COLL_BCAST, 8, 2 << 20, NULL);
  cr_assert_str_eq(select_algo(&s, &a, why, sizeof(why))->name, "tree", "%s", why);
  select_fini(&s);
}

/* Allgather among ranks that share cores: the direct exchange, which waits
 * for its peers' turns once where the ring and recursive doubling wait once
 * a step, while the n-1 blocks it reads at once fit the peer cache (4 MiB:
 * 8 ranks up to 32/7 MiB in all); past that one more pass over them. With a
 * core a rank it prices as the ring and is not picked. */
Test(select, shared_cores_give_allgather_to_direct) {
  select_ctx_t s;
  char err[256], why[256];
  static const size_t sizes[] = {32 << 10, 2 << 20, 4 << 20};
  cr_assert_eq(select_init(&s, NULL, false, err, sizeof(err)), 0);
  const algo_desc_t *direct = algo_find(COLL_ALLGATHER, "direct");
  const algo_desc_t *ring = algo_find(COLL_ALLGATHER, "ring");
  cr_assert_not_null(direct);
  for (size_t i = 0; i < 3; i++) {
    algo_args_t a = shape(COLL_ALLGATHER, 8, sizes[i] / 8, NULL);
    cr_assert_eq(select_cost(&s, direct, &a), select_cost(&s, ring, &a));
    cr_assert_str_neq(select_algo(&s, &a, why, sizeof(why))->name, "direct", "%s", why);
  }
  select_share_cores(&s, 4);
  for (size_t i = 0; i < 3; i++) {
    algo_args_t a = shape(COLL_ALLGATHER, 8, sizes[i] / 8, NULL);
    cr_assert_str_eq(select_algo(&s, &a, why, sizeof(why))->name, "direct", "%s", why);
    /* the ring less six turns of 4 ranks a core */
    double want = select_cost(&s, ring, &a) - 6 * 4 * 25e-6;
    cr_assert_float_eq(select_cost(&s, direct, &a), want, 1e-12);
  }
  /* 64 MiB: 7 blocks of 8 MiB at once, one more pass; recursive doubling */
  algo_args_t big = shape(COLL_ALLGATHER, 8, 8 << 20, NULL);
  double over = select_cost(&s, ring, &big) - 6 * 4 * 25e-6 + 7 * (8 << 20) * s.intra.beta;
  cr_assert_float_eq(select_cost(&s, direct, &big), over, over * 1e-12);
  cr_assert_str_eq(select_algo(&s, &big, why, sizeof(why))->name, "rd", "%s", why);
  /* two ranks: one exchange either way, the table's order keeps the ring */
  algo_args_t two = shape(COLL_ALLGATHER, 2, 1 << 20, NULL);
  cr_assert_eq(select_cost(&s, direct, &two), select_cost(&s, ring, &two));
  select_fini(&s);
}

Test(select, hierarchical_for_many_hosts) {
  select_ctx_t s;
  char err[256], why[256];
  int host_of[64];
  topo_t t = hosts(4, 8, host_of);
  cr_assert_eq(select_init(&s, NULL, false, err, sizeof(err)), 0);
  const algo_desc_t *hier = algo_find(COLL_ALLREDUCE, "hier");
  cr_assert_not_null(hier, "no hierarchical allreduce registered");

  algo_args_t a = shape(COLL_ALLREDUCE, 32, 64 << 20, &t);
  const algo_desc_t *d = select_algo(&s, &a, why, sizeof(why));
  cr_assert_str_eq(d->name, "hier", "%s", why);
  cr_assert(strstr(why, "on 32 ranks/4 hosts: hier "), "%s", why);
  /* across hosts the flat ring is paced by the inter-host link */
  const algo_desc_t *ring = algo_find(COLL_ALLREDUCE, "ring");
  algo_args_t flat = shape(COLL_ALLREDUCE, 32, 64 << 20, NULL);
  cr_assert_gt(select_cost(&s, ring, &a), 2 * select_cost(&s, ring, &flat));

  /* without a topology hier is not a candidate */
  d = select_algo(&s, &flat, why, sizeof(why));
  cr_assert_str_neq(d->name, "hier", "%s", why);
  select_fini(&s);

  /* forced without hosts: falls back to the model and says so */
  cr_assert_eq(select_init(&s, "allreduce=hier", false, err, sizeof(err)), 0, "%s", err);
  d = select_algo(&s, &flat, why, sizeof(why));
  cr_assert_str_neq(d->name, "hier", "%s", why);
  cr_assert(strstr(why, "CHORUS_ALGO's hier cannot run here (needs ranks on more than one host)"),
            "%s", why);
  cr_assert(strstr(why, d->name), "%s", why);
  /* with hosts, the override stands */
  d = select_algo(&s, &a, why, sizeof(why));
  cr_assert_str_eq(d->name, "hier", "%s", why);
  select_fini(&s);
}

Test(select, deterministic_restricts_reductions) {
  select_ctx_t s;
  char err[256], why[256];
  cr_assert_eq(select_init(&s, NULL, true, err, sizeof(err)), 0);
  static const coll_kind reducing[] = {COLL_ALLREDUCE, COLL_REDUCE_SCATTER, COLL_REDUCE};
  static const size_t sizes[] = {8, 4096, 64 << 20};
  for (size_t c = 0; c < 3; c++)
    for (size_t k = 0; k < 3; k++) {
      algo_args_t a = shape(reducing[c], 8, sizes[k], NULL);
      const algo_desc_t *d = select_algo(&s, &a, why, sizeof(why));
      if (!algo_find(reducing[c], "ring")) {
        cr_assert_null(d, "%s", why);
        continue;
      }
      cr_assert_str_eq(d->name, "ring", "%s %zu: %s", coll_kind_str(reducing[c]), sizes[k], why);
      cr_assert(strstr(why, "deterministic"), "%s", why);
    }
  /* others keep their choice */
  algo_args_t a = shape(COLL_BCAST, 16, 8, NULL);
  cr_assert_str_eq(select_algo(&s, &a, why, sizeof(why))->name, "tree", "%s", why);
  select_fini(&s);

  cr_assert_eq(select_init(&s, "allreduce=rd", true, err, sizeof(err)), 0);
  a = shape(COLL_ALLREDUCE, 8, 8, NULL);
  cr_assert_str_eq(select_algo(&s, &a, why, sizeof(why))->name, "ring", "%s", why);
  cr_assert(strstr(why, "CHORUS_ALGO's rd ignored: not deterministic"), "%s", why);
  select_fini(&s);
}

Test(select, every_algorithm_has_a_finite_cost) {
  select_ctx_t s;
  char err[256];
  int host_of[64];
  topo_t t = hosts(4, 4, host_of);
  cr_assert_eq(select_init(&s, NULL, false, err, sizeof(err)), 0);
  for (const algo_desc_t *d = algo_table; d->name; d++)
    for (int k = 0; k < 2; k++) {
      algo_args_t a = shape(d->coll, 16, 1 << 20, k ? &t : NULL);
      a.root = 1;
      double c = select_cost(&s, d, &a);
      cr_assert(c > 0 && c < 10, "%s %s: %g", coll_kind_str(d->coll), d->name, c);
      /* more bytes never cost less */
      algo_args_t big = a;
      big.count *= 4;
      cr_assert_geq(select_cost(&s, d, &big), c, "%s %s", coll_kind_str(d->coll), d->name);
    }
  /* every collective with algorithms gets one */
  for (int c = 0; c < COLL_KIND_COUNT; c++) {
    if (!algo_find((coll_kind)c, NULL))
      continue;
    algo_args_t a = shape((coll_kind)c, 16, 4096, &t);
    a.root = 1;
    char why[256];
    cr_assert_not_null(select_algo(&s, &a, why, sizeof(why)), "%s: %s", coll_kind_str(c), why);
  }
  select_fini(&s);
}
