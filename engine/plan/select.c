/*
 * select.c - choosing an algorithm (select.h): CHORUS_ALGO overrides, then
 * an alpha-beta-gamma model with two link classes.
 *
 * Model. A message of b bytes costs alpha + b * beta on its link; a byte
 * reduced costs gamma. Each algorithm has the closed form of the textbooks
 * (Thakur, Rabenseifner and Gropp 2005; Chan et al. 2007), with n ranks and
 * N the bytes that matter for the collective:
 *
 *   ALLREDUCE, BCAST, REDUCE, SEND/RECV    N = count * elem    (the vector)
 *   ALLGATHER, GATHER, SCATTER             N = n * count * elem (all blocks)
 *   REDUCE_SCATTER, ALLTOALL               N = n * count * elem (the input)
 *
 *   allreduce ring    2(n-1) a + 2(n-1)/n N b + (n-1)/n N g, at 2 ranks
 *                     of one host + min(N/2, peer_cache) b (SEL_PEER_CACHE;
 *                     rhd too); at 2 ranks over a network the reduction
 *                     shows only for its last chunk while what a rank
 *                     reduces fits in wire_hide (SEL_WIRE_HIDE; rd, rhd)
 *             rd      sum over log2 n rounds (a + N b + N g)
 *             rhd     halving: rounds of N/2, N/4 .. (a + x b + x g), then
 *                     doubling back (a + x b): 2 log2 n a + 2(n-1)/n N b + ...
 *             tree    reduce + bcast on a binomial tree: 2 log2 n (a + N b)
 *                     + log2 n N g
 *             dbtree  two pipelined binary trees, each half the vector:
 *                     2 log2 n a + 2 N b + N g  (NCCL's estimate)
 *             chain   pipelined reduce then bcast along a line of n ranks:
 *                     2 (n-2+k)(a + N/k b) + N g, k = chunks
 *             hier    intra-host ring reduce-scatter and allgather
 *                     (L ranks a host), between them a ring allreduce of
 *                     the N/L part across the H hosts on the inter link:
 *                     2(L-1) a_i + 2(L-1)/L N b_i + 2(H-1) a_e
 *                     + 2(H-1)/H N/L b_e + gamma terms
 *             linear  everything to one rank and back: 2(n-1)(a + N b)
 *                     + (n-1) N g
 *   and likewise per collective below (bcast: tree log2 n (a + N b), chain
 *   (n-2+k)(a + N/k b), linear with receivers that pull a + N b ceil((n-1)
 *   / cores) (bcast_pulled), ...; allgather: ring (n-1)(a + N/n b), rd/bruck
 *   log2 n a + (n-1)/n N b, direct as the ring less the turns of n-2
 *   messages (below); alltoall: pairwise (n-1)(a + N/n b), bruck
 *   log2 n (a + N/2 b); barrier: dissemination log2 n a, ...).
 *
 * Link classes. With one host every message is intra-host. With several, a
 * round-based algorithm (rd, rhd, tree, bruck, ...) pays the inter-host link
 * only for rounds whose partners are on different hosts (found from the
 * topology: rank r and r ^ 2^k, or r + 2^k); a ring, chain or linear
 * schedule moves in lockstep, so its slowest link - across hosts - paces it.
 * An algorithm name the model does not know gets the linear formula (a
 * conservative guess: the model picks it only when nothing known fits).
 *
 * Defaults are the development machine's order of magnitude (SEL_INTRA_*,
 * SEL_INTER_*, SEL_GAMMA), not a promise about any cluster: callers may
 * overwrite the fields of select_ctx_t after select_init. SEL_GAMMA counts
 * the loads and stores around the reduction kernel, not the kernel alone,
 * so that a 2-rank allreduce keeps recursive doubling (one message, all of
 * it reduced) up to the size where the ring's halved reduction pays.
 *
 * CHORUS_ALGO grammar: rules separated by ';', each "collective=spec,spec"
 * with spec "algorithm[:min-max]", sizes in bytes with K, M, G suffixes
 * (powers of 1024), min inclusive, max exclusive, either side may be empty
 * ("64K-" = 64 KiB and up). The size compared is count * element size of
 * the call. The first rule that covers a call wins.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "select.h"

#define SEL_INTRA_ALPHA 2e-6
#define SEL_INTRA_BETA (1.0 / 5e9)
#define SEL_INTER_ALPHA 20e-6
#define SEL_INTER_BETA (1.0 / 1.2e9)
#define SEL_GAMMA (1.0 / 10e9)
/* Two ranks on one host: the ring allreduce's second half reads what the
 * peer reduced a moment before, from the peer's cache, which costs about
 * one more pass over those bytes (recursive doubling reads only the peer's
 * input); no more than the caches hold is read that way. */
#define SEL_PEER_CACHE (4.0 * 1024 * 1024)
/* Over a network provider a 2-rank allreduce by recursive doubling reduces
 * each chunk as it arrives, in cache, while the next one is on the wire:
 * what shows is the last chunk's reduction, not N gamma, as long as what a
 * rank reduces stays in its caches; past them the reduction reads memory
 * and competes with the transport's own copies (on loopback the same
 * cores). Charged as N gamma, the ring (half the vector reduced) took over
 * well before recursive doubling stopped being faster, over sock and tcp
 * alike; 2 MiB suits both (more favours sock and hurts tcp). A vector of
 * one chunk overlaps nothing and is charged whole, so over sock a
 * one-chunk vector still goes to the ring, slightly behind rd (a
 * rendezvous costs more than the model's alpha); left as it is. */
#define SEL_WIRE_HIDE (2.0 * 1024 * 1024)

static int sfail(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* ---- parsing ---- */

static char *trim(char *s) {
  while (isspace((unsigned char)*s))
    s++;
  char *e = s + strlen(s);
  while (e > s && isspace((unsigned char)e[-1]))
    *--e = 0;
  return s;
}

/* "123", "64K", "1M", "2G", "16KiB", "4MB". Returns 0 or -1. */
static int parse_size(const char *s, size_t *out) {
  char *end;
  unsigned long long v;
  uint64_t mul = 1;

  if (!isdigit((unsigned char)*s))
    return -1;
  errno = 0;
  v = strtoull(s, &end, 10);
  if (errno)
    return -1;
  switch (toupper((unsigned char)*end)) {
  case 'K':
    mul = 1ull << 10;
    end++;
    break;
  case 'M':
    mul = 1ull << 20;
    end++;
    break;
  case 'G':
    mul = 1ull << 30;
    end++;
    break;
  default:
    break;
  }
  if (mul > 1 && *end == 'i')
    end++;
  if (*end == 'B' || *end == 'b')
    end++;
  if (*end || v > SIZE_MAX / mul)
    return -1;
  *out = (size_t)(v * mul);
  return 0;
}

static void known_algos(coll_kind coll, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = 0;
  for (const algo_desc_t *d = algo_table; d->name && off < len; d++)
    if (d->coll == coll)
      off += (size_t)snprintf(buf + off, len - off, "%s%s", off ? ", " : "", d->name);
  if (!off)
    snprintf(buf, len, "none");
}

static int add_rule(select_ctx_t *s, const select_rule_t *r) {
  select_rule_t *n = realloc(s->rules, (s->nrules + 1) * sizeof(*n));
  if (!n)
    return -1;
  s->rules = n;
  s->rules[s->nrules++] = *r;
  return 0;
}

static int parse_spec(select_ctx_t *s, coll_kind coll, char *spec, const char *rule, char *err,
                      size_t errlen) {
  select_rule_t r = {.coll = coll, .min_bytes = 0, .max_bytes = SIZE_MAX};
  char *colon = strchr(spec, ':');
  char known[256];

  if (colon)
    *colon = 0;
  char *name = trim(spec);
  if (!*name)
    return sfail(err, errlen, "CHORUS_ALGO: '%s': an algorithm name is missing", rule);
  if (!(r.algo = algo_find(coll, name))) {
    known_algos(coll, known, sizeof(known));
    return sfail(err, errlen, "CHORUS_ALGO: '%s': unknown algorithm '%s' for %s (known: %s)", rule,
                 name, coll_kind_str(coll), known);
  }
  if (colon) {
    char *range = trim(colon + 1), *dash = strchr(range, '-');
    if (!dash)
      return sfail(err, errlen, "CHORUS_ALGO: '%s': range '%s' is not min-max", rule, range);
    *dash = 0;
    char *lo = trim(range), *hi = trim(dash + 1);
    if (*lo && parse_size(lo, &r.min_bytes))
      return sfail(err, errlen, "CHORUS_ALGO: '%s': bad size '%s' (bytes, K, M or G)", rule, lo);
    if (*hi && parse_size(hi, &r.max_bytes))
      return sfail(err, errlen, "CHORUS_ALGO: '%s': bad size '%s' (bytes, K, M or G)", rule, hi);
    if (r.min_bytes >= r.max_bytes)
      return sfail(err, errlen, "CHORUS_ALGO: '%s': empty range %s-%s", rule, lo, hi);
  }
  if (add_rule(s, &r))
    return sfail(err, errlen, "CHORUS_ALGO: out of memory");
  return 0;
}

static int parse_overrides(select_ctx_t *s, char *text, char *err, size_t errlen) {
  char *save = NULL;

  for (char *part = strtok_r(text, ";", &save); part; part = strtok_r(NULL, ";", &save)) {
    char rule[160];
    part = trim(part);
    if (!*part)
      continue;
    snprintf(rule, sizeof(rule), "%s", part);
    char *eq = strchr(part, '=');
    if (!eq)
      return sfail(err, errlen, "CHORUS_ALGO: '%s': expected collective=algorithm", rule);
    *eq = 0;
    char *cname = trim(part);
    int coll = coll_kind_parse(cname);
    if (coll < 0)
      return sfail(err, errlen, "CHORUS_ALGO: '%s': unknown collective '%s'", rule, cname);
    char *rest = eq + 1, *end = rest + strlen(rest);
    /* split on ',' by hand: strtok_r's state belongs to the outer loop */
    for (char *spec = rest; spec <= end;) {
      char *comma = strchr(spec, ',');
      if (comma)
        *comma = 0;
      if (parse_spec(s, (coll_kind)coll, spec, rule, err, errlen))
        return -1;
      if (!comma)
        break;
      spec = comma + 1;
    }
  }
  return 0;
}

int select_init(select_ctx_t *s, const char *overrides, bool deterministic, char *err,
                size_t errlen) {
  memset(s, 0, sizeof(*s));
  s->intra = (select_link_t){SEL_INTRA_ALPHA, SEL_INTRA_BETA};
  s->inter = (select_link_t){SEL_INTER_ALPHA, SEL_INTER_BETA};
  s->gamma = SEL_GAMMA;
  s->peer_cache = SEL_PEER_CACHE;
  s->deterministic = deterministic;
  if (err && errlen)
    err[0] = 0;
  if (!overrides || !*overrides)
    return 0;
  char *text = strdup(overrides);
  if (!text)
    return sfail(err, errlen, "CHORUS_ALGO: out of memory");
  int rc = parse_overrides(s, text, err, errlen);
  free(text);
  if (rc)
    select_fini(s);
  return rc;
}

void select_fini(select_ctx_t *s) {
  free(s->rules);
  s->rules = NULL;
  s->nrules = 0;
}

/* Ranks outnumbering the cores take turns: a message then waits, on
 * average, for its receiver to be scheduled, which no link parameter
 * measures. Every message's alpha grows by SEL_TURN_S per rank sharing a
 * core, so algorithms with fewer rounds (tree, recursive doubling) win over
 * long pipelines (ring, chain) until the bandwidth term dominates. The
 * bytes cost more too: the ranks of a core share its copies and its
 * reductions, so beta and gamma grow by the same factor. Without that the
 * model kept recursive doubling (log2 n whole vectors a rank) past the size
 * where halving-doubling (two) wins. */
#define SEL_TURN_S 25e-6

/* What select_share_cores adds to every message's alpha: the wait for a
 * receiver's turn on a shared core (0 with a core a rank). */
static double turn(const select_ctx_t *s) {
  return s->per_core > 1 ? SEL_TURN_S * s->per_core : 0;
}

void select_over_network(select_ctx_t *s) {
  s->intra = s->inter;
  s->peer_cache = 0;
  s->wire_hide = SEL_WIRE_HIDE;
}

void select_share_cores(select_ctx_t *s, int per_core) {
  if (per_core <= 1)
    return;
  s->per_core = per_core;
  s->intra.alpha += turn(s);
  s->inter.alpha += turn(s);
  s->intra.beta *= per_core;
  s->inter.beta *= per_core;
  s->gamma *= per_core;
}

/* ---- the model ---- */

typedef struct model {
  const select_ctx_t *s;
  const algo_args_t *a;
  const int *host; /* NULL: one host */
  int nhosts;
  double n, N, m;     /* ranks, bytes (see above), one rank's block */
  select_link_t flat; /* the link that paces a lockstep schedule */
} model_t;

static int ceil_log2(int n) {
  int k = 0;
  while ((1 << k) < n)
    k++;
  return k;
}

/* The link of round k (partner distance 2^k): across hosts if any pair of
 * that round is. xor: partners r and r ^ 2^k; else r and (r + 2^k) mod n. */
static select_link_t round_link(const model_t *m, int k, bool xor) {
  const int n = (int)m->n, d = 1 << k;
  if (!m->host)
    return m->s->intra;
  for (int r = 0; r < n; r++) {
    int p = xor? (r ^ d) : (r + d) % n;
    if (p < n && m->host[p] != m->host[r])
      return m->s->inter;
  }
  return m->s->intra;
}

/* sum over the ceil(log2 n) rounds of (alpha + x_k beta + x_k g_k) where the
 * round k moves bytes(k) */
typedef double (*round_bytes_fn)(const model_t *m, int k);

static double rounds(const model_t *m, bool xor, round_bytes_fn bytes, double gamma) {
  double t = 0;
  for (int k = 0; k < ceil_log2((int)m->n); k++) {
    select_link_t l = round_link(m, k, xor);
    double x = bytes ? bytes(m, k) : 0;
    t += l.alpha + x * (l.beta + gamma);
  }
  return t;
}

static double whole_vector(const model_t *m, int k) {
  (void)k;
  return m->N;
}

/* recursive halving: the largest exchange (N/2) at the largest distance */
static double halving(const model_t *m, int k) {
  int lg = ceil_log2((int)m->n);
  return m->N / (double)(1u << (lg - k));
}

/* recursive doubling of blocks: round k moves 2^k blocks */
static double doubling_blocks(const model_t *m, int k) {
  double blocks = (double)(1u << k);
  if (blocks > m->n - blocks)
    blocks = m->n - blocks;
  return blocks * m->m;
}

static double half_input(const model_t *m, int k) {
  (void)k;
  return m->N / 2;
}

static bool is_pow2(int n) {
  return n > 0 && !(n & (n - 1));
}

/* rd and rhd fold extra ranks onto a power of two: one exchange of the
 * vector before and after */
static double fold(const model_t *m) {
  return is_pow2((int)m->n) ? 0 : 2 * (m->flat.alpha + m->N * m->flat.beta);
}

static double pipeline(const model_t *m, double hops, double bytes, double gamma) {
  size_t c = m->a->chunk_bytes ? m->a->chunk_bytes : 1;
  double k = bytes > 0 ? ceil(bytes / (double)c) : 1;
  return (hops - 1 + k) * (m->flat.alpha + bytes / k * (m->flat.beta + gamma));
}

static double linear(const model_t *m, double per_peer, double gamma, bool both_ways) {
  double n1 = m->n - 1;
  double t = n1 * (m->flat.alpha + per_peer * m->flat.beta) + n1 * per_peer * gamma;
  return both_ways ? 2 * t - n1 * per_peer * gamma : t;
}

/* hier_allreduce.c: ring reduce-scatter among the L ranks of a host, ring
 * allreduce of each 1/L part along its "rail" (local rank i of every
 * host) across the H hosts, ring allgather inside the host. */
static double hier_allreduce(const model_t *m) {
  const select_ctx_t *s = m->s;
  double L = m->n / m->nhosts, H = m->nhosts, N = m->N, part = N / L;
  double intra = 2 * (L - 1) * s->intra.alpha + 2 * (L - 1) / L * N * s->intra.beta +
                 (L - 1) / L * N * s->gamma;
  double inter = 2 * (H - 1) * s->inter.alpha + 2 * (H - 1) / H * part * s->inter.beta +
                 (H - 1) / H * part * s->gamma;
  return intra + inter;
}

/* gamma for a 2-rank allreduce over a network whose rank reduces `red`
 * bytes: only the last chunk's reduction shows while red fits in wire_hide
 * (SEL_WIRE_HIDE); gamma itself elsewhere. */
static double wire_gamma(const model_t *m, double red) {
  const double g = m->s->gamma;
  if (m->n != 2 || m->s->wire_hide <= 0 || red <= 0 || red > m->s->wire_hide)
    return g;
  const double chunk = m->a->chunk_bytes ? (double)m->a->chunk_bytes : red;
  return g * fmin(red, chunk) / red;
}

static double cost_allreduce(const model_t *m, const char *name) {
  const double n = m->n, N = m->N, g = m->s->gamma;
  const select_link_t f = m->flat;
  /* at 2 ranks ring and rhd alike send back the half they reduced */
  const double hot = n == 2 && m->nhosts <= 1 ? fmin(N / 2, m->s->peer_cache) * f.beta : 0;
  /* ring and rhd reduce half the vector at 2 ranks, rd all of it */
  const double gh = wire_gamma(m, N / 2), gw = wire_gamma(m, N);
  if (!strcmp(name, "ring"))
    return 2 * (n - 1) * f.alpha + 2 * (n - 1) / n * N * f.beta + (n - 1) / n * N * gh + hot;
  if (!strcmp(name, "rd"))
    return rounds(m, true, whole_vector, gw) + fold(m);
  if (!strcmp(name, "rhd"))
    return rounds(m, true, halving, gh) + rounds(m, true, halving, 0) + fold(m) + hot;
  if (!strcmp(name, "tree"))
    return 2 * rounds(m, true, whole_vector, 0) + ceil_log2((int)n) * N * g;
  if (!strcmp(name, "dbtree"))
    return 2 * ceil_log2((int)n) * f.alpha + 2 * N * f.beta + N * g;
  if (!strcmp(name, "chain"))
    return 2 * pipeline(m, n - 1, N, 0) + N * g;
  if (!strcmp(name, "hier") && m->host)
    return hier_allreduce(m);
  return linear(m, N, g, true);
}

/* A binomial tree's round k copies the vector 2^k times at once (fewer in
 * the last round short of a power of two). With per_core ranks a core, the
 * per-byte cost scaled by per_core (select_share_cores) prices every round as
 * if all ranks of each core copied; but the copies of round k share the
 * n / per_core cores only when there are that many: the first rounds leave
 * cores idle. Priced as if every round were crowded, the model gave large
 * broadcasts to the chain, which was the slower. */
static double tree_rounds(const model_t *m) {
  const int q = m->s->per_core;
  if (q <= 1)
    return rounds(m, true, whole_vector, 0);
  const double cores = fmax(1, ceil(m->n / q));
  double t = 0;
  for (int k = 0; k < ceil_log2((int)m->n); k++) {
    select_link_t l = round_link(m, k, true);
    double copies = fmin((double)(1 << k), m->n - (double)(1 << k));
    t += l.alpha + m->N * (l.beta / q) * ceil(copies / cores);
  }
  return t;
}

/* Whether a call of m whose blocks (the data one rank sends to all) are
 * `block` bytes is sent from a mappable buffer (coll.c, "Staging"). */
static bool staged(const model_t *m, double block) {
  return m->s->stage_block > 0 && m->N > m->s->stage_min && block <= m->s->stage_block;
}

/* A flat broadcast whose receivers pull: the root only posts a descriptor
 * each, and the n-1 copies are the receivers' own, as many at a time as
 * there are cores, every one out of the root's buffer (nothing is read that
 * a peer has just written), one turn of the scheduler for all. Only while
 * that buffer stays in the caches (peer_cache): past it every receiver reads
 * it from memory on its own, where a tree's next hop reads what the last one
 * just wrote. Below pull_min the root copies every message into a bounce
 * slot itself, n-1 copies in a row: then the root pushes (linear()). Used
 * only where ranks share cores, the only case measured. A root that sends
 * from the staging buffer keeps it past the caches: every receiver copies
 * from a mapping, no page pinned, no system call, so a staged broadcast
 * goes flat at any size. */
static bool bcast_pulled(const model_t *m) {
  const select_ctx_t *s = m->s;
  return s->pull_min > 0 && s->per_core > 1 && m->nhosts <= 1 && m->N >= s->pull_min &&
         (m->N <= s->peer_cache || staged(m, m->N));
}

static double cost_bcast(const model_t *m, const char *name) {
  const double n = m->n, N = m->N;
  const select_link_t f = m->flat;
  if (!strcmp(name, "tree"))
    return tree_rounds(m);
  if (!strcmp(name, "linear") && bcast_pulled(m)) {
    const int q = m->s->per_core;
    const double cores = fmax(1, ceil(n / q));
    return f.alpha + N * (f.beta / q) * ceil((n - 1) / cores);
  }
  if (!strcmp(name, "chain") || !strcmp(name, "ring") || !strcmp(name, "pipeline"))
    return pipeline(m, n - 1, N, 0);
  if (!strcmp(name, "dbtree"))
    return ceil_log2((int)n) * f.alpha + N * f.beta;
  if (!strcmp(name, "rd") || !strcmp(name, "scatter_allgather") || !strcmp(name, "rhd"))
    return (ceil_log2((int)n) + n - 1) * f.alpha + 2 * (n - 1) / n * N * f.beta;
  if (!strcmp(name, "hier") && m->host) {
    double p = n / m->nhosts;
    return ceil_log2(m->nhosts) * (m->s->inter.alpha + N * m->s->inter.beta) +
           ceil_log2((int)p) * (m->s->intra.alpha + N * m->s->intra.beta);
  }
  return linear(m, N, 0, false);
}

static double cost_reduce(const model_t *m, const char *name) {
  const double n = m->n, N = m->N, g = m->s->gamma;
  const select_link_t f = m->flat;
  if (!strcmp(name, "tree"))
    return rounds(m, true, whole_vector, g);
  if (!strcmp(name, "chain") || !strcmp(name, "pipeline"))
    return pipeline(m, n - 1, N, g);
  if (!strcmp(name, "ring") || !strcmp(name, "rhd"))
    return (!strcmp(name, "ring") ? 2 * (n - 1) : 2 * ceil_log2((int)n)) * f.alpha +
           2 * (n - 1) / n * N * f.beta + (n - 1) / n * N * g;
  if (!strcmp(name, "dbtree"))
    return ceil_log2((int)n) * f.alpha + N * f.beta + N * g;
  return linear(m, N, g, false);
}

/* direct_allgather.c posts its n-1 messages each way at once: as many
 * bytes as the ring, but a rank waits for its peers' turns once, not once
 * a step. With every rank on a core of its own the two price alike and the
 * table's order keeps the ring. Large blocks turn it around: it reads n-1
 * of them at once, every byte from memory, where a round of the others
 * reads what a peer wrote a moment before. Once those n-1 blocks outgrow
 * the peer cache it pays one more pass over them. */
static double cost_allgather(const model_t *m, const char *name) {
  const double n = m->n, N = m->N;
  const select_link_t f = m->flat;
  if (!strcmp(name, "ring") || !strcmp(name, "pairwise"))
    return (n - 1) * (f.alpha + m->m * f.beta);
  if (!strcmp(name, "direct")) {
    const double t = (n - 1) * (f.alpha + m->m * f.beta) - (n - 2) * turn(m->s);
    if (staged(m, m->m))
      return t;
    return (n - 1) * m->m > m->s->peer_cache ? t + (n - 1) * m->m * f.beta : t;
  }
  if (!strcmp(name, "rd"))
    return rounds(m, true, doubling_blocks, 0) + fold(m);
  if (!strcmp(name, "bruck")) /* + the final rotation into place, a local copy */
    return rounds(m, false, doubling_blocks, 0) + N * f.beta;
  if (!strcmp(name, "dissemination"))
    return rounds(m, false, doubling_blocks, 0);
  if (!strcmp(name, "hier") && m->host) {
    double p = n / m->nhosts, H = m->nhosts;
    return (p - 1) * (m->s->intra.alpha + m->m * m->s->intra.beta) +
           (H - 1) * (m->s->inter.alpha + p * m->m * m->s->inter.beta) +
           (p - 1) * (m->s->intra.alpha + (N - p * m->m) / p * m->s->intra.beta);
  }
  /* linear / direct: every block to every peer, one link each way */
  return (n - 1) * (f.alpha + m->m * f.beta);
}

static double cost_reduce_scatter(const model_t *m, const char *name) {
  const double n = m->n, g = m->s->gamma;
  const select_link_t f = m->flat;
  if (!strcmp(name, "ring") || !strcmp(name, "pairwise"))
    return (n - 1) * (f.alpha + m->m * (f.beta + g));
  if (!strcmp(name, "rhd") || !strcmp(name, "rh") || !strcmp(name, "halving"))
    return rounds(m, true, halving, g) + fold(m);
  return (n - 1) * (f.alpha + m->m * (f.beta + g)) + (n - 1) * m->m * g;
}

static double cost_alltoall(const model_t *m, const char *name) {
  const double n = m->n;
  const select_link_t f = m->flat;
  if (!strcmp(name, "bruck"))
    return rounds(m, false, half_input, 0);
  /* pairwise, linear: n-1 blocks out and in, one link each way */
  return (n - 1) * (f.alpha + m->m * f.beta);
}

static double cost_gather(const model_t *m, const char *name) {
  const double n = m->n;
  const select_link_t f = m->flat;
  if (!strcmp(name, "tree") || !strcmp(name, "binomial"))
    return ceil_log2((int)n) * f.alpha + (n - 1) * m->m * f.beta;
  return (n - 1) * (f.alpha + m->m * f.beta);
}

static double cost_barrier(const model_t *m, const char *name) {
  const double n = m->n;
  if (!strcmp(name, "dissemination") || !strcmp(name, "bruck"))
    return rounds(m, false, NULL, 0);
  if (!strcmp(name, "rd"))
    return rounds(m, true, NULL, 0) + (is_pow2((int)n) ? 0 : 2 * m->flat.alpha);
  if (!strcmp(name, "tree") || !strcmp(name, "dbtree"))
    return 2 * rounds(m, true, NULL, 0);
  return 2 * (n - 1) * m->flat.alpha;
}

static double cost_p2p(const model_t *m) {
  const algo_args_t *a = m->a;
  select_link_t l = m->s->intra;
  int me = a->rank >= 0 && a->rank < a->nranks ? a->rank : 0;
  if (m->host && a->root >= 0 && a->root < a->nranks && m->host[me] != m->host[a->root])
    l = m->s->inter;
  return l.alpha + m->N * l.beta;
}

static bool topo_usable(const algo_args_t *a) {
  const topo_t *t = a->topo;
  return t && t->nhosts > 1 && t->nranks == a->nranks && t->host_of;
}

double select_cost(const select_ctx_t *s, const algo_desc_t *d, const algo_args_t *a) {
  size_t es = chorus_dtype_size(a->dtype);
  model_t m = {.s = s, .a = a, .n = a->nranks > 0 ? a->nranks : 1};

  if (topo_usable(a)) {
    m.host = a->topo->host_of;
    m.nhosts = a->topo->nhosts;
  } else {
    m.nhosts = 1;
  }
  m.flat = m.host ? s->inter : s->intra;
  m.m = (double)a->count * (double)es;
  switch (d->coll) {
  case COLL_ALLGATHER:
  case COLL_GATHER:
  case COLL_SCATTER:
  case COLL_REDUCE_SCATTER:
  case COLL_ALLTOALL:
    m.N = m.m * m.n;
    break;
  default:
    m.N = m.m;
    break;
  }
  if (a->nranks <= 1)
    return 0;
  switch (d->coll) {
  case COLL_ALLREDUCE:
    return cost_allreduce(&m, d->name);
  case COLL_BCAST:
    return cost_bcast(&m, d->name);
  case COLL_REDUCE:
    return cost_reduce(&m, d->name);
  case COLL_ALLGATHER:
    return cost_allgather(&m, d->name);
  case COLL_REDUCE_SCATTER:
    return cost_reduce_scatter(&m, d->name);
  case COLL_ALLTOALL:
    return cost_alltoall(&m, d->name);
  case COLL_GATHER:
  case COLL_SCATTER:
    return cost_gather(&m, d->name);
  case COLL_BARRIER:
    return cost_barrier(&m, d->name);
  case COLL_SEND:
  case COLL_RECV:
    return cost_p2p(&m);
  default:
    return linear(&m, m.N, 0, true);
  }
}

/* ---- choosing ---- */

static bool reducing(coll_kind c) {
  return c == COLL_ALLREDUCE || c == COLL_REDUCE || c == COLL_REDUCE_SCATTER;
}

/* Deterministic mode: one canonical reduction order, the ring's. */
static bool allowed(const select_ctx_t *s, const algo_desc_t *d) {
  return !s->deterministic || !reducing(d->coll) || !strcmp(d->name, "ring");
}

/* Can d run a's shape? Why not in `why` (may be NULL). */
static bool runnable(const algo_desc_t *d, const algo_args_t *a, char *why, size_t len) {
  if ((d->flags & ALGO_HIERARCHICAL) && !topo_usable(a)) {
    if (why)
      snprintf(why, len, "needs ranks on more than one host");
    return false;
  }
  algo_args_t t = *a;
  if (t.rank < 0 || t.rank >= t.nranks)
    t.rank = 0;
  if (d->coll == COLL_SEND || d->coll == COLL_RECV) {
    if (t.nranks < 2 || t.root < 0 || t.root >= t.nranks)
      goto cannot;
    if (t.root == t.rank)
      t.rank = (t.root + 1) % t.nranks;
  }
  plan_t *p = NULL;
  int rc = d->build(&t, &p);
  plan_free(p);
  if (!rc)
    return true;
  if (why)
    snprintf(why, len, "its builder refuses this shape: %s", strerror(-rc));
  return false;
cannot:
  if (why)
    snprintf(why, len, "no peer %d of %d ranks", a->root, a->nranks);
  return false;
}

static void fmt_bytes(double b, char *buf, size_t len) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4 && fmod(b, 1024) == 0) {
    b /= 1024;
    u++;
  }
  if (u == 0 && b >= 1024) {
    while (b >= 1024 && u < 4) {
      b /= 1024;
      u++;
    }
    snprintf(buf, len, "%.1f %s", b, units[u]);
    return;
  }
  snprintf(buf, len, "%.0f %s", b, units[u]);
}

static void fmt_time(double t, char *buf, size_t len) {
  if (t < 1e-3)
    snprintf(buf, len, "%.1f us", t * 1e6);
  else if (t < 1)
    snprintf(buf, len, "%.2f ms", t * 1e3);
  else
    snprintf(buf, len, "%.2f s", t);
}

typedef struct cand {
  const algo_desc_t *d;
  double t;
} cand_t;

static int cand_cmp(const void *x, const void *y) {
  const cand_t *a = x, *b = y;
  if (a->t != b->t)
    return a->t < b->t ? -1 : 1;
  return a->d < b->d ? -1 : a->d > b->d; /* table order breaks ties */
}

const algo_desc_t *select_algo(const select_ctx_t *s, const algo_args_t *a, char *why,
                               size_t whylen) {
  size_t es = chorus_dtype_size(a->dtype), bytes = a->count * es;
  char note[256] = "", shape[96], sz[32], reason[160];
  int nhosts = topo_usable(a) ? a->topo->nhosts : 1;
  const algo_desc_t *pick = NULL;
  cand_t *c = NULL;
  size_t nc = 0, ncap = 0;

  if (why && whylen)
    why[0] = 0;
  fmt_bytes((double)bytes, sz, sizeof(sz));
  snprintf(shape, sizeof(shape), "%s %s on %d ranks/%d host%s", coll_kind_str(a->coll), sz,
           a->nranks, nhosts, nhosts == 1 ? "" : "s");
  for (size_t i = 0; i < s->nrules; i++) {
    const select_rule_t *r = &s->rules[i];
    if (r->coll != (int)a->coll || bytes < r->min_bytes || bytes >= r->max_bytes)
      continue;
    if (!allowed(s, r->algo)) {
      snprintf(note, sizeof(note), "; CHORUS_ALGO's %s ignored: not deterministic", r->algo->name);
      break;
    }
    if (!runnable(r->algo, a, reason, sizeof(reason))) {
      snprintf(note, sizeof(note), "; CHORUS_ALGO's %s cannot run here (%s), model used instead",
               r->algo->name, reason);
      break;
    }
    if (why && whylen) {
      char t1[32];
      fmt_time(select_cost(s, r->algo, a), t1, sizeof(t1));
      snprintf(why, whylen, "%s: %s (CHORUS_ALGO), model says %s", shape, r->algo->name, t1);
    }
    return r->algo;
  }
  for (const algo_desc_t *d = algo_table; d->name; d++) {
    if (d->coll != a->coll || !allowed(s, d))
      continue;
    if ((d->flags & ALGO_HIERARCHICAL) && !topo_usable(a))
      continue;
    if (nc == ncap) {
      size_t n2 = ncap ? ncap * 2 : 16;
      cand_t *nn = realloc(c, n2 * sizeof(*nn));
      if (!nn)
        break;
      c = nn;
      ncap = n2;
    }
    c[nc++] = (cand_t){d, select_cost(s, d, a)};
  }
  qsort(c, nc, sizeof(*c), cand_cmp);
  size_t k = 0;
  for (; k < nc; k++)
    if (runnable(c[k].d, a, NULL, 0)) {
      pick = c[k].d;
      break;
    }
  if (why && whylen) {
    char t1[32], t2[32];
    if (!pick) {
      snprintf(why, whylen, "%s: no algorithm can run it%s%s", shape,
               s->deterministic && reducing(a->coll) ? " (deterministic: ring only)" : "", note);
    } else {
      fmt_time(c[k].t, t1, sizeof(t1));
      size_t j = k + 1;
      while (j < nc && !runnable(c[j].d, a, NULL, 0))
        j++;
      if (j < nc) {
        fmt_time(c[j].t, t2, sizeof(t2));
        snprintf(why, whylen, "%s: %s %s (model) < %s %s%s%s", shape, pick->name, t1, c[j].d->name,
                 t2, s->deterministic && reducing(a->coll) ? " (deterministic: ring only)" : "",
                 note);
      } else {
        snprintf(why, whylen, "%s: %s %s (model), the only candidate%s%s", shape, pick->name, t1,
                 s->deterministic && reducing(a->coll) ? " (deterministic: ring only)" : "", note);
      }
    }
  }
  free(c);
  return pick;
}
