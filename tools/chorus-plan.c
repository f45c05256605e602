/*
 * chorus-plan - what a collective's schedules do at a scale no test machine
 * has, without running them: per algorithm, the plans of every rank are
 * built, matched and run on the virtual clock of engine/plan/sim.h.
 *
 *   chorus-plan -c allreduce -n 4096 --hosts 512x8 -s 256M
 *   chorus-plan -c bcast -n 64 -s 1M --algo tree --root 3 --json
 *   chorus-plan -c allreduce -n 8 -s 64K --algo ring --dot 0 | dot -Tsvg > r0.svg
 *
 * One row per algorithm registered for the collective (or only --algo):
 *   chunk      the pipelining unit used (see below)
 *   steps      steps of the longest rank's plan
 *   msgs       messages, all ranks
 *   intra/inter  bytes one rank sends within its host / to other hosts,
 *              the maximum over ranks
 *   busiest    the directed rank pair that carries the most bytes
 *   model      select_cost: the alpha-beta closed form (select.c)
 *   sim        sim_time: the schedule on the virtual clock, link contention
 *              and the critical path included
 * and the selector's choice with its explanation. -s is the byte size of
 * the call's count (count * element size, the same size CHORUS_ALGO ranges
 * compare). Hosts are contiguous blocks of ranks.
 *
 * Chunk: the default (256 KiB, as CHORUS_CHUNK_BYTES) is doubled while the
 * plans would hold more than --max-steps steps in all (so that 4096 ranks
 * of a 256 MiB call fit in memory and seconds); --chunk fixes it.
 *
 * Exit: 0 done, 1 an algorithm failed (its row says why), 2 usage.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algos/algos.h"
#include "select.h"
#include "sim.h"

#define DEFAULT_CHUNK (256u << 10)
#define DEFAULT_MAX_STEPS (40u * 1000 * 1000)

typedef struct opts {
  coll_kind coll;
  int nranks, nhosts, per_host;
  size_t bytes;
  const char *algo;
  chorus_dtype dtype;
  chorus_op op;
  size_t chunk; /* 0: automatic */
  int root;
  int dot_rank; /* -1: none */
  bool json;
  uint64_t max_steps;
} opts_t;

static void usage(FILE *f) {
  fprintf(f, "usage: chorus-plan -c COLL -n RANKS [--hosts HxR] [-s SIZE] [--algo A] [-d DTYPE]\n"
             "                   [-o OP] [--chunk BYTES] [--root R] [--dot RANK] [--json]\n"
             "                   [--max-steps N]\n"
             "Builds every rank's plan of each algorithm for COLL, checks that sends and\n"
             "receives match, and runs them on a virtual clock (alpha-beta per link class).\n"
             "  -c COLL        allreduce, bcast, reduce, allgather, reduce_scatter, alltoall,\n"
             "                 gather, scatter, barrier, send, recv\n"
             "  -n RANKS       number of ranks (may be left out with --hosts)\n"
             "  --hosts HxR    H hosts of R ranks each, contiguous (default: one host)\n"
             "  -s SIZE        count * element size, with K, M, G suffixes (default 1M)\n"
             "  --algo A       only this algorithm\n"
             "  -d DTYPE       int8 uint8 int32 int64 float16 bfloat16 float32 float64 (float32)\n"
             "  -o OP          sum prod min max avg (sum)\n"
             "  --chunk BYTES  pipelining unit (default 256K, doubled while the plans would\n"
             "                 exceed --max-steps steps in all)\n"
             "  --max-steps N  step budget of the automatic chunk (default 40M)\n"
             "  --root R       root of rooted collectives, peer of send/recv (default 0)\n"
             "  --dot RANK     print that rank's plan (of --algo, else the selector's pick)\n"
             "                 as Graphviz dot\n"
             "  --json         rows (or the --dot schedule) as JSON, one object per line\n");
}

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "chorus-plan: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n");
  usage(stderr);
  return 2;
}

static int parse_size(const char *s, size_t *out) {
  char *end;
  unsigned long long v, mul = 1;
  if (*s < '0' || *s > '9')
    return -1;
  errno = 0;
  v = strtoull(s, &end, 10);
  if (errno)
    return -1;
  switch (*end) {
  case 'k':
  case 'K':
    mul = 1ull << 10;
    end++;
    break;
  case 'm':
  case 'M':
    mul = 1ull << 20;
    end++;
    break;
  case 'g':
  case 'G':
    mul = 1ull << 30;
    end++;
    break;
  default:
    break;
  }
  if (mul > 1 && *end == 'i')
    end++;
  if (*end == 'B')
    end++;
  if (*end || v > SIZE_MAX / mul)
    return -1;
  *out = (size_t)(v * mul);
  return 0;
}

static int parse_int(const char *s, int min, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < min || v > (1 << 22))
    return -1;
  *out = (int)v;
  return 0;
}

static const char *human_bytes(double b, char *buf, size_t len) {
  static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int k = 0;
  while (b >= 1024 && k < 4) {
    b /= 1024;
    k++;
  }
  if (k == 0 || b == (double)(uint64_t)b)
    snprintf(buf, len, "%.0f %s", b, u[k]);
  else
    snprintf(buf, len, "%.1f %s", b, u[k]);
  return buf;
}

static const char *human_time(double t, char *buf, size_t len) {
  if (t < 1e-3)
    snprintf(buf, len, "%.1f us", t * 1e6);
  else if (t < 1)
    snprintf(buf, len, "%.2f ms", t * 1e3);
  else
    snprintf(buf, len, "%.3f s", t);
  return buf;
}

static int parse_args(int argc, char **argv, opts_t *o) {
  static const struct option longopts[] = {{"hosts", required_argument, NULL, 'H'},
                                           {"algo", required_argument, NULL, 'a'},
                                           {"chunk", required_argument, NULL, 'k'},
                                           {"root", required_argument, NULL, 'r'},
                                           {"dot", required_argument, NULL, 'D'},
                                           {"json", no_argument, NULL, 'j'},
                                           {"max-steps", required_argument, NULL, 'M'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  bool have_coll = false;
  int c;

  *o = (opts_t){.nranks = 0,
                .nhosts = 1,
                .bytes = 1u << 20,
                .dtype = CHORUS_FLOAT32,
                .op = CHORUS_SUM,
                .dot_rank = -1,
                .max_steps = DEFAULT_MAX_STEPS};
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":c:n:s:d:o:h", longopts, NULL)) != -1) {
    switch (c) {
    case 'c': {
      int k = coll_kind_parse(optarg);
      if (k < 0)
        return usage_error("unknown collective '%s'", optarg);
      o->coll = (coll_kind)k;
      have_coll = true;
      break;
    }
    case 'n':
      if (parse_int(optarg, 1, &o->nranks))
        return usage_error("bad rank count for -n: '%s'", optarg);
      break;
    case 's':
      if (parse_size(optarg, &o->bytes))
        return usage_error("bad size for -s: '%s'", optarg);
      break;
    case 'd': {
      int k = 0;
      while (k < CHORUS_DTYPE_COUNT && strcmp(chorus_dtype_name((chorus_dtype)k), optarg))
        k++;
      if (k == CHORUS_DTYPE_COUNT)
        return usage_error("unknown dtype '%s'", optarg);
      o->dtype = (chorus_dtype)k;
      break;
    }
    case 'o': {
      int k = 0;
      while (k < CHORUS_OP_COUNT && strcmp(chorus_op_name((chorus_op)k), optarg))
        k++;
      if (k == CHORUS_OP_COUNT)
        return usage_error("unknown op '%s'", optarg);
      o->op = (chorus_op)k;
      break;
    }
    case 'H': {
      char *x = strchr(optarg, 'x');
      if (!x)
        return usage_error("--hosts wants HxR (hosts x ranks per host), not '%s'", optarg);
      *x = 0;
      int bad = parse_int(optarg, 1, &o->nhosts) || parse_int(x + 1, 1, &o->per_host);
      *x = 'x';
      if (bad)
        return usage_error("--hosts wants HxR (hosts x ranks per host), not '%s'", optarg);
      break;
    }
    case 'a':
      o->algo = optarg;
      break;
    case 'k':
      if (parse_size(optarg, &o->chunk) || !o->chunk)
        return usage_error("bad size for --chunk: '%s'", optarg);
      break;
    case 'r':
      if (parse_int(optarg, 0, &o->root))
        return usage_error("bad rank for --root: '%s'", optarg);
      break;
    case 'D':
      if (parse_int(optarg, 0, &o->dot_rank))
        return usage_error("bad rank for --dot: '%s'", optarg);
      break;
    case 'j':
      o->json = true;
      break;
    case 'M': {
      size_t v;
      if (parse_size(optarg, &v) || !v)
        return usage_error("bad step count for --max-steps: '%s'", optarg);
      o->max_steps = v;
      break;
    }
    case 'h':
      usage(stdout);
      return 0;
    case ':':
      return usage_error("%s needs a value", argv[optind - 1]);
    default:
      return usage_error("unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc)
    return usage_error("unexpected argument '%s'", argv[optind]);
  if (!have_coll)
    return usage_error("%s", "-c COLL is required");
  if (o->per_host) {
    int n = o->nhosts * o->per_host;
    if (o->nranks && o->nranks != n) {
      char msg[96];
      snprintf(msg, sizeof(msg), "-n %d differs from --hosts %dx%d", o->nranks, o->nhosts,
               o->per_host);
      return usage_error("%s", msg);
    }
    o->nranks = n;
  }
  if (!o->nranks)
    return usage_error("%s", "-n RANKS (or --hosts HxR) is required");
  if (o->bytes % chorus_dtype_size(o->dtype))
    return usage_error("-s is not a whole number of %s elements", chorus_dtype_name(o->dtype));
  if (o->root >= o->nranks || o->dot_rank >= o->nranks) {
    char msg[96];
    snprintf(msg, sizeof(msg), "--%s %d is not a rank of %d", o->root >= o->nranks ? "root" : "dot",
             o->root >= o->nranks ? o->root : o->dot_rank, o->nranks);
    return usage_error("%s", msg);
  }
  if ((o->coll == COLL_SEND || o->coll == COLL_RECV) && o->nranks < 2)
    return usage_error("%s needs two ranks", coll_kind_str(o->coll));
  return -1; /* go on */
}

/* ---- one algorithm ---- */

typedef struct row {
  const algo_desc_t *d;
  size_t chunk;
  int rc;
  char err[512];
  sim_time_result_t t;
  uint64_t messages;
  double model;
} row_t;

static algo_args_t args_for(const opts_t *o, const topo_t *topo, size_t chunk) {
  return (algo_args_t){.coll = o->coll,
                       .rank = 0,
                       .nranks = o->nranks,
                       .root = o->root,
                       .count = o->bytes / chorus_dtype_size(o->dtype),
                       .dtype = o->dtype,
                       .op = o->op,
                       .chunk_bytes = chunk,
                       .topo = topo};
}

/* Steps of the biggest of a few sample ranks' plans (0, the root, the last). */
static int sample_steps(const algo_desc_t *d, algo_args_t a, uint64_t *out) {
  int who[3] = {0, a.root, a.nranks - 1};
  *out = 0;
  for (int k = 0; k < 3; k++) {
    plan_t *p = NULL;
    a.rank = who[k];
    if (d->coll == COLL_SEND || d->coll == COLL_RECV)
      a.rank = (a.root + 1) % a.nranks;
    int rc = d->build(&a, &p);
    if (rc)
      return rc;
    if (p->nsteps > *out)
      *out = p->nsteps;
    plan_free(p);
  }
  return 0;
}

static size_t choose_chunk(const opts_t *o, const algo_desc_t *d, const topo_t *topo) {
  size_t chunk = o->chunk ? o->chunk : DEFAULT_CHUNK;
  uint64_t steps, prev = UINT64_MAX;
  if (o->chunk)
    return chunk;
  while (chunk < o->bytes) {
    algo_args_t a = args_for(o, topo, chunk);
    if (sample_steps(d, a, &steps))
      break; /* the full build will report it */
    if (steps >= prev) {
      chunk /= 2; /* a bigger chunk did not help: the plans do not depend on it */
      break;
    }
    if (steps * (uint64_t)o->nranks <= o->max_steps)
      break;
    prev = steps;
    chunk *= 2;
  }
  return chunk;
}

static void run_row(const opts_t *o, const topo_t *topo, const select_ctx_t *sel, row_t *row) {
  sim_model_t m;
  sim_graph_t *g = NULL;

  sim_model_default(&m);
  m.alpha[0] = sel->intra.alpha;
  m.beta[0] = sel->intra.beta;
  m.alpha[1] = sel->inter.alpha;
  m.beta[1] = sel->inter.beta;
  m.gamma = sel->gamma;
  row->chunk = choose_chunk(o, row->d, topo);
  algo_args_t a = args_for(o, topo, row->chunk);
  row->model = select_cost(sel, row->d, &a);
  if ((row->rc = sim_graph_build(row->d, &a, &g, row->err, sizeof(row->err))))
    return;
  row->rc = sim_time(g, topo, &m, &row->t, row->err, sizeof(row->err));
  sim_graph_free(g);
}

static void print_header(const opts_t *o, const select_ctx_t *s) {
  char sz[32];
  printf("chorus-plan: %s %s (%s %s), %d ranks", coll_kind_str(o->coll),
         human_bytes((double)o->bytes, sz, sizeof(sz)), chorus_dtype_name(o->dtype),
         chorus_op_name(o->op), o->nranks);
  if (o->per_host)
    printf(" on %d hosts of %d", o->nhosts, o->per_host);
  printf("\nmodel: within a host %.1f us + %.2f GB/s, across hosts %.1f us + %.2f GB/s, "
         "reduce %.2f GB/s\n",
         s->intra.alpha * 1e6, 1e-9 / s->intra.beta, s->inter.alpha * 1e6, 1e-9 / s->inter.beta,
         1e-9 / s->gamma);
  printf("%-14s %9s %9s %11s %12s %12s %-26s %10s %10s\n", "algo", "chunk", "steps", "messages",
         "intra/rank", "inter/rank", "busiest link", "model", "sim");
}

static void print_row(const row_t *r, bool picked) {
  char name[32], ch[32], in[32], out[32], lb[32], link[64], mt[32], st[32];
  snprintf(name, sizeof(name), "%s%s", r->d->name, picked ? " *" : "");
  if (r->rc) {
    printf("%-14s %9s  failed: %s\n", name, human_bytes((double)r->chunk, ch, sizeof(ch)), r->err);
    return;
  }
  if (r->t.link_src >= 0)
    snprintf(link, sizeof(link), "%d->%d %s", r->t.link_src, r->t.link_dst,
             human_bytes((double)r->t.link_bytes, lb, sizeof(lb)));
  else
    snprintf(link, sizeof(link), "-");
  printf("%-14s %9s %9" PRIu32 " %11" PRIu64 " %12s %12s %-26s %10s %10s\n", name,
         human_bytes((double)r->chunk, ch, sizeof(ch)), r->t.max_steps, r->t.messages,
         human_bytes((double)r->t.max_sent_intra, in, sizeof(in)),
         human_bytes((double)r->t.max_sent_inter, out, sizeof(out)), link,
         human_time(r->model, mt, sizeof(mt)), human_time(r->t.time, st, sizeof(st)));
}

static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      printf("\\%c", *s);
    else if ((unsigned char)*s < 0x20)
      printf("\\u%04x", *s);
    else
      putchar(*s);
  }
  putchar('"');
}

static void json_row(const opts_t *o, const row_t *r, bool picked) {
  printf("{\"coll\":\"%s\",\"algo\":\"%s\",\"nranks\":%d,\"nhosts\":%d,\"bytes\":%zu,"
         "\"chunk\":%zu,\"selected\":%s,\"ok\":%s",
         coll_kind_str(o->coll), r->d->name, o->nranks, o->nhosts, o->bytes, r->chunk,
         picked ? "true" : "false", r->rc ? "false" : "true");
  if (r->rc) {
    printf(",\"error\":");
    json_str(r->err);
    printf("}\n");
    return;
  }
  const sim_time_result_t *t = &r->t;
  printf(",\"steps_max\":%" PRIu32 ",\"steps\":%" PRIu64 ",\"messages\":%" PRIu64
         ",\"bytes_total\":%" PRIu64 ",\"bytes_intra\":%" PRIu64 ",\"bytes_inter\":%" PRIu64
         ",\"sent_intra_max\":%" PRIu64 ",\"sent_inter_max\":%" PRIu64 ",\"sent_max\":%" PRIu64
         ",\"link\":{\"src\":%d,\"dst\":%d,\"bytes\":%" PRIu64 "}"
         ",\"host_link\":{\"src\":%d,\"dst\":%d,\"bytes\":%" PRIu64 "}"
         ",\"model_s\":%.9g,\"sim_s\":%.9g,\"last_rank\":%d}\n",
         t->max_steps, t->steps, t->messages, t->bytes, t->bytes_intra, t->bytes_inter,
         t->max_sent_intra, t->max_sent_inter, t->max_sent, t->link_src, t->link_dst, t->link_bytes,
         t->hlink_src, t->hlink_dst, t->hlink_bytes, r->model, t->time, t->last_rank);
}

/* ---- one rank's schedule ---- */

static int print_schedule(const opts_t *o, const topo_t *topo, const algo_desc_t *d) {
  size_t chunk = choose_chunk(o, d, topo);
  algo_args_t a = args_for(o, topo, chunk);
  plan_t *p = NULL;
  int rc;

  a.rank = o->dot_rank;
  if (d->coll == COLL_SEND || d->coll == COLL_RECV) {
    if (a.rank == a.root) {
      fprintf(stderr, "chorus-plan: rank %d is its own peer (--root)\n", a.rank);
      return 2;
    }
  }
  if ((rc = d->build(&a, &p))) {
    fprintf(stderr, "chorus-plan: %s %s: building rank %d's plan: %s\n", coll_kind_str(d->coll),
            d->name, a.rank, strerror(-rc));
    return 1;
  }
  if (o->json) {
    printf("{\"coll\":\"%s\",\"algo\":\"%s\",\"rank\":%d,\"nranks\":%d,\"chunk\":%zu,"
           "\"scratch_bytes\":%zu,\"steps\":[",
           coll_kind_str(d->coll), d->name, p->rank, p->nranks, chunk, p->scratch_bytes);
    for (uint32_t i = 0; i < p->nsteps; i++) {
      const plan_step_t *s = &p->steps[i];
      printf("%s{\"i\":%u,\"kind\":\"%s\",\"bytes\":%zu", i ? "," : "", i,
             plan_step_kind_str(s->kind), s->bytes);
      if (s->kind == STEP_SEND || s->kind == STEP_RECV)
        printf(",\"peer\":%d,\"msg\":%u", s->peer, s->msg);
      printf(",\"succ\":[");
      for (uint32_t k = 0; k < s->nsucc; k++)
        printf("%s%u", k ? "," : "", p->succ[s->succ_off + k]);
      printf("]}");
    }
    printf("]}\n");
  } else {
    char b[32];
    printf("digraph \"%s %s rank %d of %d\" {\n  rankdir=TB;\n  node [shape=box, fontsize=10];\n",
           coll_kind_str(d->coll), d->name, p->rank, p->nranks);
    for (uint32_t i = 0; i < p->nsteps; i++) {
      const plan_step_t *s = &p->steps[i];
      human_bytes((double)s->bytes, b, sizeof(b));
      if (s->kind == STEP_SEND || s->kind == STEP_RECV)
        printf("  s%u [label=\"%u %s m%u %s %d\\n%s\"%s];\n", i, i, plan_step_kind_str(s->kind),
               s->msg, s->kind == STEP_SEND ? "to" : "from", s->peer, b,
               s->kind == STEP_SEND ? ", style=filled, fillcolor=lightblue"
                                    : ", style=filled, fillcolor=lightyellow");
      else
        printf("  s%u [label=\"%u %s\\n%s\"];\n", i, i, plan_step_kind_str(s->kind), b);
    }
    for (uint32_t i = 0; i < p->nsteps; i++)
      for (uint32_t k = 0; k < p->steps[i].nsucc; k++)
        printf("  s%u -> s%u;\n", i, p->succ[p->steps[i].succ_off + k]);
    printf("}\n");
  }
  plan_free(p);
  return 0;
}

int main(int argc, char **argv) {
  opts_t o;
  select_ctx_t sel;
  char err[256], why[512];
  int *host_of = NULL, rc = parse_args(argc, argv, &o);
  topo_t topo, *tp = NULL;

  if (rc >= 0)
    return rc;
  if (select_init(&sel, NULL, false, err, sizeof(err))) {
    fprintf(stderr, "chorus-plan: %s\n", err);
    return 1;
  }
  if (o.per_host && o.nhosts > 1) {
    if (!(host_of = malloc((size_t)o.nranks * sizeof(*host_of)))) {
      fprintf(stderr, "chorus-plan: out of memory\n");
      return 1;
    }
    for (int r = 0; r < o.nranks; r++)
      host_of[r] = r / o.per_host;
    topo = (topo_t){.nranks = o.nranks, .nhosts = o.nhosts, .host_of = host_of};
    tp = &topo;
  }
  const algo_desc_t *only = NULL;
  if (o.algo && !(only = algo_find(o.coll, o.algo))) {
    char known[256] = "";
    size_t off = 0;
    for (const algo_desc_t *d = algo_table; d->name; d++)
      if (d->coll == o.coll && off < sizeof(known))
        off += (size_t)snprintf(known + off, sizeof(known) - off, "%s%s", off ? ", " : "", d->name);
    fprintf(stderr, "chorus-plan: no algorithm '%s' for %s (known: %s)\n", o.algo,
            coll_kind_str(o.coll), off ? known : "none");
    free(host_of);
    return 2;
  }
  algo_args_t sa = args_for(&o, tp, o.chunk ? o.chunk : DEFAULT_CHUNK);
  const algo_desc_t *pick = select_algo(&sel, &sa, why, sizeof(why));

  if (o.dot_rank >= 0) {
    const algo_desc_t *d = only ? only : pick;
    rc = d ? print_schedule(&o, tp, d) : 1;
    if (!d)
      fprintf(stderr, "chorus-plan: no algorithm for %s: %s\n", coll_kind_str(o.coll), why);
    free(host_of);
    select_fini(&sel);
    return rc;
  }
  if (!o.json)
    print_header(&o, &sel);
  rc = 0;
  for (const algo_desc_t *d = algo_table; d->name; d++) {
    if (d->coll != o.coll || (only && d != only))
      continue;
    if ((d->flags & ALGO_HIERARCHICAL) && !tp) {
      if (!o.json)
        printf("%-14s (needs more than one host: --hosts)\n", d->name);
      continue;
    }
    row_t row = {.d = d};
    run_row(&o, tp, &sel, &row);
    if (row.rc)
      rc = 1;
    if (o.json)
      json_row(&o, &row, d == pick);
    else
      print_row(&row, d == pick);
    fflush(stdout);
  }
  if (o.json) {
    printf("{\"selected\":");
    if (pick)
      json_str(pick->name);
    else
      printf("null");
    printf(",\"why\":");
    json_str(why);
    printf("}\n");
  } else {
    printf("selected: %s (%s)\n", pick ? pick->name : "none", why);
  }
  free(host_of);
  select_fini(&sel);
  return rc;
}
