/*
 * verify.c - checking a collective's schedules before they run (verify.h).
 *
 * The plans are copied into a compact graph (sim.h: sim_graph), built one
 * rank at a time for verify_algo, identical plans stored once. Then:
 *
 *   1. matching (sim_graph_match): every SEND has exactly one RECV on its
 *      peer with the same (source, destination, message) and size;
 *   2. no cycle: a send and its receive complete together (a rendezvous),
 *      so the pair is one node of the union graph, waiting for the
 *      dependencies of both and releasing the successors of both. Kahn's
 *      algorithm over that graph, with an explicit stack (no recursion):
 *
 *        rank 0:  RECV m1<-1 --> SEND m0->1        the pair (SEND m0, RECV m0)
 *        rank 1:  RECV m0<-0 --> SEND m1->0        waits for RECV m1, whose pair
 *                                                  waits for RECV m0: a cycle
 *
 *      A message also waits for the one before it on its pair (the same
 *      sender and receiver, by message number): the executor posts a pair's
 *      messages in that order, and past its posting budget only the oldest
 *      of each pair (exec.c), so the schedule must complete even one
 *      message at a time per pair:
 *
 *        rank 0:  RECV m5<-1 --> SEND m0->1,  SEND m1->1 after SEND m0
 *        rank 1:  RECV m1<-0 --> SEND m5->0                  a cycle too
 *
 *      Steps left over lie on or behind a cycle. To name it, each stuck
 *      step points to something it waits for (a stuck predecessor, or its
 *      stuck mate); following those pointers from any stuck step must
 *      return to a step already seen, and the loop is reported.
 *
 * Symmetry. When the ranks' shapes repeat with period P (sim.h: ranks r and
 * r + P have equal plans, peers written relative to the rank), moving every
 * rank r to r + P (to r ^ c, c a multiple of P, when peers are written
 * XOR) maps the union graph onto itself, and these moves, a group of n/P,
 * move every node. Kahn then runs on the quotient, P ranks whose peers are
 * taken mod P, and the answer is the same: a cycle of the real graph folds
 * onto a closed walk of the quotient, and a cycle of the quotient, followed
 * from a node, ends at a moved copy of that node; repeated at most n/P
 * times it closes, a closed walk of the real graph. A ring's 4096 ranks
 * fold onto one. A cycle found on the quotient is then named on the real
 * ranks; matching needs no second pass (sim_graph_match).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"
#include "verify.h"

#define V_POSTED (UINT32_MAX - 1) /* ready, its mate not yet */
#define V_DONE UINT32_MAX
#define V_END (UINT32_MAX - 2) /* ends a rank's list of ready steps */

typedef struct {
  uint32_t rank, step;
  bool after; /* on a cycle's path: waits for the message before it on its pair */
} vnode_t;

/* One run of Kahn's algorithm over ranks 0 .. nq-1 (nq: the period, or
 * every rank), peers taken mod nq. The order of a run does not change what
 * it finds, so it works one rank at a time while that rank has ready steps
 * (they mostly follow one another in its arrays), then the next rank in a
 * FIFO of ranks with ready steps. A ready step's counter links it into its
 * rank's list. */
typedef struct {
  sim_graph_t *g;
  int nq;
  sim_run_t c;    /* counters: dependencies left, V_POSTED, V_DONE, or the
                     next ready step of the rank (V_END: none) */
  uint32_t *head; /* [nq]: each rank's ready steps, V_END for none */
  uint32_t *fifo; /* [nq]: ranks with ready steps, each at most once */
  size_t fhead, fn;
  uint32_t cur; /* the rank worked on (not in the FIFO), or UINT32_MAX */
  uint64_t done;
  uint32_t **pnext; /* [nshapes]: per shape (of a rank < nq), each SEND/RECV's
                       next one to the same peer (pair_chains), or V_END */
} kahn_t;

static int vfail(char *err, size_t errlen, int rc, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return rc;
}

/* Step i of rank r is ready. */
static void ready(kahn_t *k, uint32_t r, uint32_t i) {
  if (k->head[r] == V_END && r != k->cur)
    k->fifo[(k->fhead + k->fn++) % (size_t)k->nq] = r;
  *sim_counter(&k->c, r, i) = k->head[r];
  k->head[r] = i;
}

static bool comm_kind(unsigned kind) {
  return kind == STEP_SEND || kind == STEP_RECV;
}

static const sim_shape_t *shape(const sim_graph_t *g, uint32_t r) {
  return &g->shapes[g->shape_of[r]];
}

/* Marks step i of rank r done, and the successors it makes ready. */
static void release(kahn_t *k, uint32_t r, uint32_t i) {
  const sim_view_t *w = &k->c.rank[r];
  uint32_t *cnt = w->cnt;
  const size_t stride = k->c.stride;

  cnt[i * stride] = V_DONE;
  k->done++;
  for (uint32_t e = w->steps[i].succ; e < w->steps[i + 1].succ; e++)
    if (--cnt[w->succ[e] * stride] == 0)
      ready(k, r, w->succ[e]);
  uint32_t nx = k->pnext[k->g->shape_of[r]][i];
  if (nx != V_END && --cnt[nx * stride] == 0)
    ready(k, r, nx);
}

/* The executor posts a rank's messages to one peer, and its receives from
 * one peer, in the order of their message numbers, and past its posting
 * budget only the oldest of each (exec.c). So a message waits for the one
 * before it on its pair, sender and receiver agreeing which that is: the
 * schedule must complete even one message at a time per pair. next[i]: the
 * SEND (RECV) after step i to (from) the same peer by message number, V_END
 * for none or a local step. Returns 0 or -ENOMEM. */
typedef struct {
  uint64_t key;
  uint32_t i;
} pair_key_t;

static int cmp_pair_key(const void *a, const void *b) {
  uint64_t x = ((const pair_key_t *)a)->key, y = ((const pair_key_t *)b)->key;
  return x < y ? -1 : x > y;
}

static int pair_chains(const sim_shape_t *sh, uint32_t *next) {
  uint32_t n = 0;
  pair_key_t *v = malloc(((size_t)sh->nsends + sh->nrecvs + 1) * sizeof(*v));

  if (!v)
    return -ENOMEM;
  for (uint32_t i = 0; i < sh->nsteps; i++) {
    const sim_step_t *s = &sh->steps[i];
    next[i] = V_END;
    if (comm_kind(s->kind))
      v[n++] = (pair_key_t){((uint64_t)(s->kind == STEP_RECV) << 56) |
                                ((uint64_t)(uint32_t)s->peer << 24) | s->msg,
                            i};
  }
  qsort(v, n, sizeof(*v), cmp_pair_key);
  for (uint32_t j = 0; j + 1 < n; j++)
    if (v[j].key >> 24 == v[j + 1].key >> 24)
      next[v[j].i] = v[j + 1].i;
  free(v);
  return 0;
}

static int describe(const sim_graph_t *g, vnode_t v, char *buf, size_t len) {
  const sim_step_t *s = &shape(g, v.rank)->steps[v.step];
  if (comm_kind(s->kind))
    return snprintf(buf, len, "rank %u step %u (%s of message %u %s rank %d)", v.rank, v.step,
                    plan_step_kind_str(s->kind), s->msg, s->kind == STEP_SEND ? "to" : "from",
                    sim_graph_peer(g, (int)v.rank, s));
  return snprintf(buf, len, "rank %u step %u (%s)", v.rank, v.step, plan_step_kind_str(s->kind));
}

/* After Kahn stopped short on every rank: find and report one cycle among
 * the steps not done. Per rank, lazily: blocker[i] = a stuck predecessor of
 * stuck step i, seen[i] = 1 + its position on the walk. */
static int explain_cycle(kahn_t *k, char *err, size_t errlen) {
  sim_graph_t *g = k->g;
  const int n = g->nranks;
  uint32_t **blocker = calloc((size_t)n, sizeof(*blocker));
  uint32_t **seen = calloc((size_t)n, sizeof(*seen));
  vnode_t *path = NULL;
  size_t plen = 0, pcap = 0;
  vnode_t cur = {UINT32_MAX, 0, false};
  int rc = -EDEADLK;

  if (!blocker || !seen) {
    rc = -ENOMEM;
    goto out;
  }
  for (int r = 0; r < n && cur.rank == UINT32_MAX; r++)
    for (uint32_t i = 0; i < shape(g, (uint32_t)r)->nsteps; i++)
      if (*sim_counter(&k->c, (uint32_t)r, i) != V_DONE) {
        cur = (vnode_t){(uint32_t)r, i, false};
        break;
      }
  if (cur.rank == UINT32_MAX)
    goto out;
  for (;;) {
    const sim_shape_t *sh = shape(g, cur.rank);
    if (!seen[cur.rank]) {
      blocker[cur.rank] = malloc(((size_t)sh->nsteps + 1) * sizeof(uint32_t));
      seen[cur.rank] = calloc((size_t)sh->nsteps + 1, sizeof(uint32_t));
      if (!blocker[cur.rank] || !seen[cur.rank]) {
        rc = -ENOMEM;
        goto out;
      }
      const uint32_t *nx = k->pnext[g->shape_of[cur.rank]];
      for (uint32_t u = 0; u < sh->nsteps; u++)
        if (*sim_counter(&k->c, cur.rank, u) != V_DONE) {
          for (uint32_t e = sh->steps[u].succ; e < sh->steps[u + 1].succ; e++)
            blocker[cur.rank][sh->succ[e]] = u;
          if (nx[u] != V_END) /* high bit: the pair's order */
            blocker[cur.rank][nx[u]] = u | 0x80000000u;
        }
    }
    if (seen[cur.rank][cur.step])
      break;
    if (plen == pcap) {
      size_t ncap = pcap ? pcap * 2 : 64;
      vnode_t *np = realloc(path, ncap * sizeof(*np));
      if (!np) {
        rc = -ENOMEM;
        goto out;
      }
      path = np;
      pcap = ncap;
    }
    path[plen++] = cur;
    seen[cur.rank][cur.step] = (uint32_t)plen;
    const sim_step_t *s = &sh->steps[cur.step];
    /* posted: waits for its mate, which is not ready; else: waits for a
     * predecessor that never finished */
    if (*sim_counter(&k->c, cur.rank, cur.step) == V_POSTED) {
      int p = sim_graph_peer(g, (int)cur.rank, s);
      cur = (vnode_t){(uint32_t)p, sim_graph_mate(g, (int)cur.rank, cur.step, p), false};
    } else {
      uint32_t b = blocker[cur.rank][cur.step];
      path[plen - 1].after = (b & 0x80000000u) != 0;
      cur = (vnode_t){cur.rank, b & 0x7fffffffu, false};
    }
  }
  size_t start = seen[cur.rank][cur.step] - 1, len = plen - start;
  char msg[2048];
  size_t off = 0;
  uint32_t ranks[8];
  size_t nr = 0;
  bool more = false;
  for (size_t j = 0; j < len; j++) {
    size_t q = 0;
    while (q < nr && ranks[q] != path[start + j].rank)
      q++;
    if (q < nr)
      continue;
    if (nr == 8) {
      more = true;
      break;
    }
    ranks[nr++] = path[start + j].rank;
  }
  off += (size_t)snprintf(msg + off, sizeof(msg) - off,
                          "dependency cycle of %zu steps (%" PRIu64 " of %" PRIu64
                          " steps can run) across rank%s",
                          len, k->done, g->nsteps, nr > 1 ? "s" : "");
  for (size_t j = 0; j < nr; j++)
    off += (size_t)snprintf(msg + off, sizeof(msg) - off, "%s %u", j ? "," : "", ranks[j]);
  off += (size_t)snprintf(msg + off, sizeof(msg) - off, "%s: ", more ? ", ..." : "");
  for (size_t j = 0; j < len && off < sizeof(msg) - 1; j++) {
    vnode_t a = path[start + j];
    if (j == 12) {
      off += (size_t)snprintf(msg + off, sizeof(msg) - off, "... (%zu more) ... ", len - j);
      break;
    }
    off += (size_t)describe(g, a, msg + off, sizeof(msg) - off);
    if (off < sizeof(msg) - 1)
      off += (size_t)snprintf(msg + off, sizeof(msg) - off, "%s",
                              *sim_counter(&k->c, a.rank, a.step) == V_POSTED ? " pairs with "
                              : a.after                                       ? " is posted after "
                                                                              : " waits for ");
  }
  if (off < sizeof(msg) - 1)
    describe(g, path[start], msg + off, sizeof(msg) - off);
  vfail(err, errlen, rc, "%s", msg);

out:
  if (rc == -ENOMEM)
    vfail(err, errlen, rc, "out of memory explaining a dependency cycle");
  for (int r = 0; r < n; r++) {
    if (blocker)
      free(blocker[r]);
    if (seen)
      free(seen[r]);
  }
  free(blocker);
  free(seen);
  free(path);
  return rc;
}

/* Kahn's algorithm on the union graph of ranks 0 .. nq-1, nq the period or
 * every rank; g must be matched. -EDEADLK: a cycle (named when nq is every
 * rank). */
static int check_acyclic(sim_graph_t *g, int nq, char *err, size_t errlen) {
  kahn_t k = {.g = g, .nq = nq, .cur = UINT32_MAX};
  uint64_t total = 0;
  int rc = 0;

  k.head = malloc((size_t)nq * sizeof(*k.head));
  k.fifo = malloc((size_t)nq * sizeof(*k.fifo));
  k.pnext = calloc(g->nshapes, sizeof(*k.pnext));
  if (!k.head || !k.fifo || !k.pnext || (rc = sim_run_init(&k.c, g, nq))) {
    rc = -ENOMEM;
    goto out;
  }
  /* a rank reaching every shape, for explain_cycle: all of them (nq is
   * every rank when it runs) */
  for (int r = 0; r < g->nranks; r++) {
    uint32_t si = g->shape_of[r];
    if (k.pnext[si])
      continue;
    if (!(k.pnext[si] = malloc(((size_t)g->shapes[si].nsteps + 1) * sizeof(uint32_t))) ||
        pair_chains(&g->shapes[si], k.pnext[si])) {
      rc = -ENOMEM;
      goto out;
    }
  }
  for (int r = 0; r < nq; r++) {
    const sim_shape_t *sh = shape(g, (uint32_t)r);
    const uint32_t *nx = k.pnext[g->shape_of[r]];
    total += sh->nsteps;
    k.head[r] = V_END;
    for (uint32_t i = 0; i < sh->nsteps; i++)
      if (nx[i] != V_END)
        ++*sim_counter(&k.c, (uint32_t)r, nx[i]);
    for (uint32_t j = sh->nroots; j-- > 0;)
      if (*sim_counter(&k.c, (uint32_t)r, sh->roots[j]) == 0)
        ready(&k, (uint32_t)r, sh->roots[j]);
  }
  while (k.fn) {
    const uint32_t r = k.fifo[k.fhead];
    const sim_view_t *w = &k.c.rank[r];
    k.fhead = (k.fhead + 1) % (size_t)nq;
    k.fn--;
    k.cur = r;
    while (k.head[r] != V_END) {
      const uint32_t i = k.head[r];
      const sim_step_t *s = &w->steps[i];
      uint32_t *cnt = sim_counter(&k.c, r, i);
      k.head[r] = *cnt;
      if (!comm_kind(s->kind)) {
        release(&k, r, i);
        continue;
      }
      int p = sim_graph_peer(g, (int)r, s);
      uint32_t j = sim_graph_mate(g, (int)r, i, p);
      uint32_t q = (uint32_t)(p % nq);
      if (*sim_counter(&k.c, q, j) != V_POSTED) {
        *cnt = V_POSTED;
        continue;
      }
      release(&k, r, i);
      release(&k, q, j);
    }
    k.cur = UINT32_MAX;
  }
  if (k.done < total)
    rc = nq == g->nranks ? explain_cycle(&k, err, errlen) : -EDEADLK;
out:
  if (rc == -ENOMEM)
    vfail(err, errlen, rc, "out of memory ordering %" PRIu64 " steps", g->nsteps);
  free(k.head);
  free(k.fifo);
  for (uint32_t si = 0; k.pnext && si < g->nshapes; si++)
    free(k.pnext[si]);
  free(k.pnext);
  sim_run_fini(&k.c);
  return rc;
}

int verify_graph(sim_graph_t *g, char *err, size_t errlen) {
  int rc = sim_graph_match(g, err, errlen);
  if (rc)
    return rc;
  rc = check_acyclic(g, g->period, err, errlen);
  if (rc == -EDEADLK && g->period < g->nranks)
    rc = check_acyclic(g, g->nranks, err, errlen);
  return rc;
}

int verify_plans(plan_t *const *plans, int nranks, char *err, size_t errlen) {
  sim_graph_t *g;
  int rc = sim_graph_from_plans(plans, nranks, &g, err, errlen);
  if (rc)
    return rc;
  rc = verify_graph(g, err, errlen);
  sim_graph_free(g);
  return rc;
}

int verify_algo(const algo_desc_t *d, const algo_args_t *a, char *err, size_t errlen) {
  sim_graph_t *g;
  int rc = sim_graph_build(d, a, &g, err, errlen);
  if (rc)
    return rc;
  rc = verify_graph(g, err, errlen);
  if (rc && err && errlen) {
    char tmp[2304];
    snprintf(tmp, sizeof(tmp), "%s %s on %d ranks: %s", coll_kind_str(d->coll), d->name, a->nranks,
             err);
    snprintf(err, errlen, "%s", tmp);
  }
  sim_graph_free(g);
  return rc;
}
