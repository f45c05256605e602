/*
 * verify.c - checking a collective's schedules before they run (verify.h).
 *
 * The plans are copied into a compact graph (sim.h: sim_graph), built one
 * rank at a time for verify_algo so that 4096 ranks fit in memory. Then:
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
 *      Steps left over lie on or behind a cycle. To name it, each stuck
 *      step points to something it waits for (a stuck predecessor, or its
 *      stuck mate); following those pointers from any stuck step must
 *      return to a step already seen, and the loop is reported.
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

typedef struct {
  uint32_t rank, step;
} vnode_t;

typedef struct {
  vnode_t *v;
  size_t n, cap;
} vstack_t;

static int vfail(char *err, size_t errlen, int rc, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return rc;
}

static int vpush(vstack_t *s, uint32_t rank, uint32_t step) {
  if (s->n == s->cap) {
    size_t ncap = s->cap ? s->cap * 2 : 4096;
    vnode_t *nv = realloc(s->v, ncap * sizeof(*nv));
    if (!nv)
      return -ENOMEM;
    s->v = nv;
    s->cap = ncap;
  }
  s->v[s->n++] = (vnode_t){rank, step};
  return 0;
}

static bool comm_kind(unsigned kind) {
  return kind == STEP_SEND || kind == STEP_RECV;
}

/* Marks step i of rank r done; pushes the successors it makes ready. */
static int release(sim_graph_t *g, vstack_t *st, uint32_t r, uint32_t i, uint64_t *done) {
  sim_rank_t *gr = &g->ranks[r];
  int rc;

  gr->steps[i].deps = V_DONE;
  (*done)++;
  for (uint32_t k = gr->succ_off[i]; k < gr->succ_off[i + 1]; k++)
    if (--gr->steps[gr->succ[k]].deps == 0 && (rc = vpush(st, r, gr->succ[k])))
      return rc;
  return 0;
}

static int describe(const sim_graph_t *g, vnode_t v, char *buf, size_t len) {
  const sim_step_t *s = &g->ranks[v.rank].steps[v.step];
  if (comm_kind(s->kind))
    return snprintf(buf, len, "rank %u step %u (%s of message %u %s rank %d)", v.rank, v.step,
                    plan_step_kind_str(s->kind), s->msg, s->kind == STEP_SEND ? "to" : "from",
                    s->peer);
  return snprintf(buf, len, "rank %u step %u (%s)", v.rank, v.step, plan_step_kind_str(s->kind));
}

/* After Kahn stopped short: find and report one cycle among the steps not
 * done. Per rank, lazily: blocker[i] = a stuck predecessor of stuck step i,
 * seen[i] = 1 + its position on the walk. */
static int explain_cycle(const sim_graph_t *g, uint64_t done, char *err, size_t errlen) {
  const int n = g->nranks;
  uint32_t **blocker = calloc((size_t)n, sizeof(*blocker));
  uint32_t **seen = calloc((size_t)n, sizeof(*seen));
  vnode_t *path = NULL;
  size_t plen = 0, pcap = 0;
  vnode_t cur = {UINT32_MAX, 0};
  int rc = -EDEADLK;

  if (!blocker || !seen) {
    rc = -ENOMEM;
    goto out;
  }
  for (int r = 0; r < n && cur.rank == UINT32_MAX; r++)
    for (uint32_t i = 0; i < g->ranks[r].nsteps; i++)
      if (g->ranks[r].steps[i].deps != V_DONE) {
        cur = (vnode_t){(uint32_t)r, i};
        break;
      }
  if (cur.rank == UINT32_MAX)
    goto out;
  for (;;) {
    const sim_rank_t *gr = &g->ranks[cur.rank];
    if (!seen[cur.rank]) {
      blocker[cur.rank] = malloc(((size_t)gr->nsteps + 1) * sizeof(uint32_t));
      seen[cur.rank] = calloc((size_t)gr->nsteps + 1, sizeof(uint32_t));
      if (!blocker[cur.rank] || !seen[cur.rank]) {
        rc = -ENOMEM;
        goto out;
      }
      for (uint32_t u = 0; u < gr->nsteps; u++)
        if (gr->steps[u].deps != V_DONE)
          for (uint32_t k = gr->succ_off[u]; k < gr->succ_off[u + 1]; k++)
            blocker[cur.rank][gr->succ[k]] = u;
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
    const sim_step_t *s = &gr->steps[cur.step];
    /* posted: waits for its mate, which is not ready; else: waits for a
     * predecessor that never finished */
    if (s->deps == V_POSTED)
      cur = (vnode_t){(uint32_t)s->peer, s->mate};
    else
      cur = (vnode_t){cur.rank, blocker[cur.rank][cur.step]};
  }
  size_t start = seen[cur.rank][cur.step] - 1, len = plen - start;
  char msg[2048];
  size_t off = 0;
  uint32_t ranks[8];
  size_t nr = 0;
  bool more = false;
  for (size_t k = 0; k < len; k++) {
    size_t j = 0;
    while (j < nr && ranks[j] != path[start + k].rank)
      j++;
    if (j < nr)
      continue;
    if (nr == 8) {
      more = true;
      break;
    }
    ranks[nr++] = path[start + k].rank;
  }
  off += (size_t)snprintf(msg + off, sizeof(msg) - off,
                          "dependency cycle of %zu steps (%" PRIu64 " of %" PRIu64
                          " steps can run) across rank%s",
                          len, done, g->nsteps, nr > 1 ? "s" : "");
  for (size_t j = 0; j < nr; j++)
    off += (size_t)snprintf(msg + off, sizeof(msg) - off, "%s %u", j ? "," : "", ranks[j]);
  off += (size_t)snprintf(msg + off, sizeof(msg) - off, "%s: ", more ? ", ..." : "");
  for (size_t k = 0; k < len && off < sizeof(msg) - 1; k++) {
    vnode_t a = path[start + k];
    const sim_step_t *s = &g->ranks[a.rank].steps[a.step];
    if (k == 12) {
      off += (size_t)snprintf(msg + off, sizeof(msg) - off, "... (%zu more) ... ", len - k);
      break;
    }
    off += (size_t)describe(g, a, msg + off, sizeof(msg) - off);
    if (off < sizeof(msg) - 1)
      off += (size_t)snprintf(msg + off, sizeof(msg) - off, "%s",
                              s->deps == V_POSTED ? " pairs with " : " waits for ");
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

/* Kahn's algorithm on the union graph; g must be matched. */
static int check_acyclic(sim_graph_t *g, char *err, size_t errlen) {
  vstack_t st = {0};
  uint64_t done = 0;
  int rc = 0;

  for (int r = 0; r < g->nranks; r++)
    for (uint32_t i = 0; i < g->ranks[r].nsteps; i++)
      if (g->ranks[r].steps[i].deps == 0 && (rc = vpush(&st, (uint32_t)r, i)))
        goto out;
  while (st.n) {
    vnode_t v = st.v[--st.n];
    sim_step_t *s = &g->ranks[v.rank].steps[v.step];
    if (!comm_kind(s->kind)) {
      if ((rc = release(g, &st, v.rank, v.step, &done)))
        goto out;
      continue;
    }
    sim_step_t *o = &g->ranks[s->peer].steps[s->mate];
    if (o->deps != V_POSTED) {
      s->deps = V_POSTED;
      continue;
    }
    if ((rc = release(g, &st, v.rank, v.step, &done)) ||
        (rc = release(g, &st, (uint32_t)s->peer, s->mate, &done)))
      goto out;
  }
  if (done < g->nsteps)
    rc = explain_cycle(g, done, err, errlen);
out:
  if (rc == -ENOMEM)
    vfail(err, errlen, rc, "out of memory ordering %" PRIu64 " steps", g->nsteps);
  free(st.v);
  sim_graph_reset_deps(g);
  return rc;
}

static int verify_graph(sim_graph_t *g, char *err, size_t errlen) {
  int rc = sim_graph_match(g, err, errlen);
  if (rc)
    return rc;
  return check_acyclic(g, err, errlen);
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
