/*
 * diag.c - who holds up a communicator, from its ranks' dumps.
 *
 * The wait-for graph: rank A waits for rank B when A has a pending RECV from
 * B (ready or posted), a SEND to B posted TR_OLD_SEND_NS ago or more, or a
 * RECV or SEND with B that the transport failed (the connection broke: A
 * waited on B until B went away). The
 * collective in question (#k) is the one most waiting ranks are in. Then, in
 * this order, the first rule that holds names the culprit:
 *
 *   1. two ranks' calls at one seq differ: other arguments -> mismatched
 *      call; another collective -> that rank diverged
 *   2. a rank others wait on left no dump, dumped on a fatal error, or is
 *      seen lost by a peer -> lost
 *   2b. ranks that destroyed the communicator before a call others are in
 *      (the watchdog's endings rule) -> those who left, or the callers'
 *      extra call
 *   3. a rank others wait on that waits on nobody (a root of the graph):
 *        not in a collective, last call before #k -> diverged (skipped #k)
 *        in an earlier collective, or in #k without waiting -> stalled
 *        past #k -> its messages were lost
 *   4. a waiting rank whose progress engine is silent far longer than every
 *      other's (TR_STALL_FACTOR, TR_STALL_MIN_NS) -> stalled
 *   5. the waits form a cycle -> deadlock cycle (no single culprit)
 *   6. the ranks' own verdicts name a rank -> blamed
 *
 *        rank 0 --RECV--> rank 3 --RECV--> rank 2 (idle at #41): diverged
 *        rank 1 --SEND-----------------------^
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"

typedef struct rinfo {
  const tr_dump_t *d;
  bool fatal;     /* its own verdict: going away */
  int lost_votes; /* peers whose view says LOST */
  bool in_coll;   /* in a collective */
  uint64_t cur;   /* in_coll: its collective's seq */
  uint64_t quiet; /* since its progress engine ran (or anything changed) */
  bool quiet_known;
  int out, in; /* wait-for edges */
} rinfo_t;

typedef struct ctx {
  const tr_comm_t *c;
  int size;
  rinfo_t *ri;
  size_t *first; /* [size + 1]: edges of rank r are first[r] .. first[r + 1] */
  tr_diag_t *d;
} ctx_t;

static bool is_lost(const ctx_t *x, int r) {
  return !x->ri[r].d || x->ri[r].fatal || x->ri[r].lost_votes > 0;
}

/* ---- per rank ---- */

static uint64_t last_change(const tr_dump_t *d) {
  const tr_ckpt_t *ck = tr_ckpt(d);
  uint64_t t = 0;
  if (!ck)
    return 0;
  for (size_t i = 0; i < ck->n_pending; i++)
    if (ck->pending[i]->since_ns > t)
      t = ck->pending[i]->since_ns;
  if (ck->current && ck->current->begin_ns > t)
    t = ck->current->begin_ns;
  if (d->n_journal && d->journal[d->n_journal - 1]->t_ns > t)
    t = d->journal[d->n_journal - 1]->t_ns;
  return t;
}

static void rank_info(ctx_t *x) {
  for (int r = 0; r < x->size; r++) {
    const tr_dump_t *d = x->c->ranks[r].d;
    rinfo_t *ri = &x->ri[r];
    ri->d = d;
    if (!d)
      continue;
    ri->fatal = d->verdict && d->verdict->reason == CHORUS__TRACE__VERDICT__REASON__FATAL;
    ri->in_coll = tr_in_coll(d);
    if (ri->in_coll) {
      const tr_ckpt_t *ck = tr_ckpt(d);
      ri->cur = ck->current && ck->current->seq ? ck->current->seq : ck->last_begun;
    }
    const tr_ckpt_t *ck = tr_ckpt(d);
    uint64_t when = ck && ck->progress_ns ? ck->progress_ns : last_change(d);
    ri->quiet = tr_age(d->t_dump_ns, when);
    ri->quiet_known = when && d->t_dump_ns >= when;
    for (size_t i = 0; i < d->n_peers; i++) {
      const Chorus__Trace__PeerView *p = d->peers[i];
      if (p->rank >= 0 && p->rank < x->size && p->rank != r &&
          p->state == CHORUS__TRACE__PEER_VIEW__STATE__LOST)
        x->ri[p->rank].lost_votes++;
    }
  }
}

/* ---- the wait-for graph ---- */

static bool blocking(const tr_step_t *s, uint64_t age) {
  if (s->state == CHORUS__TRACE__STEP_STATE__STATE_FAILED)
    return s->error && (s->kind == CHORUS__TRACE__STEP_KIND__STEP_RECV ||
                        s->kind == CHORUS__TRACE__STEP_KIND__STEP_SEND);
  if (s->kind == CHORUS__TRACE__STEP_KIND__STEP_RECV)
    return s->state == CHORUS__TRACE__STEP_STATE__STATE_READY ||
           s->state == CHORUS__TRACE__STEP_STATE__STATE_POSTED;
  if (s->kind == CHORUS__TRACE__STEP_KIND__STEP_SEND)
    return s->state == CHORUS__TRACE__STEP_STATE__STATE_POSTED && age >= TR_OLD_SEND_NS;
  return false;
}

static int cmp_edges(const void *a, const void *b) {
  const tr_edge_t *x = a, *y = b;
  if (x->from != y->from)
    return x->from < y->from ? -1 : 1;
  if (x->to != y->to)
    return x->to < y->to ? -1 : 1;
  if (x->age_ns != y->age_ns)
    return x->age_ns > y->age_ns ? -1 : 1; /* oldest first */
  return x->step->index < y->step->index ? -1 : x->step->index > y->step->index;
}

static int edge_push(tr_edge_t **e, size_t *n, size_t *cap, tr_edge_t edge) {
  if (*n == *cap) {
    size_t ncap = *cap ? *cap * 2 : 64;
    tr_edge_t *ne = realloc(*e, ncap * sizeof(*ne));
    if (!ne)
      return -ENOMEM;
    *e = ne;
    *cap = ncap;
  }
  (*e)[(*n)++] = edge;
  return 0;
}

/* A rank waiting in a call of a split of this communicator waits on the
 * split's peers: edges between their ranks here. */
static int split_edges(ctx_t *x, tr_edge_t **e, size_t *n, size_t *cap) {
  for (size_t k = 0; k < x->c->nkids; k++) {
    const tr_comm_t *kc = x->c->kids[k];
    if (!kc->world_of)
      continue;
    for (int m = 0; m < kc->size; m++) {
      const tr_dump_t *d = kc->ranks[m].d;
      const tr_ckpt_t *ck = tr_ckpt(d);
      if (!ck || !tr_in_coll(d) || kc->world_of[m] >= (uint32_t)x->size)
        continue;
      for (size_t i = 0; i < ck->n_pending; i++) {
        const tr_step_t *s = ck->pending[i];
        int p = tr_step_peer(s, kc->size, m);
        uint64_t age = tr_age(d->t_dump_ns, s->since_ns);
        if (p < 0 || !blocking(s, age) || kc->world_of[p] >= (uint32_t)x->size)
          continue;
        tr_edge_t edge = {.from = (int)kc->world_of[m],
                          .to = (int)kc->world_of[p],
                          .step = s,
                          .via = kc,
                          .dump = d,
                          .age_ns = age,
                          .nsteps = 1};
        if (edge.from != edge.to && edge_push(e, n, cap, edge))
          return -ENOMEM;
      }
    }
  }
  return 0;
}

static int build_edges(ctx_t *x) {
  size_t n = 0, cap = 0;
  tr_edge_t *e = NULL;
  for (int r = 0; r < x->size; r++) {
    const tr_dump_t *d = x->ri[r].d;
    const tr_ckpt_t *ck = tr_ckpt(d);
    if (!ck || !x->ri[r].in_coll)
      continue;
    for (size_t i = 0; i < ck->n_pending; i++) {
      const tr_step_t *s = ck->pending[i];
      int p = tr_step_peer(s, x->size, r);
      uint64_t age = tr_age(d->t_dump_ns, s->since_ns);
      if (p < 0 || !blocking(s, age))
        continue;
      if (edge_push(
              &e, &n, &cap,
              (tr_edge_t){.from = r, .to = p, .step = s, .dump = d, .age_ns = age, .nsteps = 1})) {
        free(e);
        return -ENOMEM;
      }
    }
  }
  if (split_edges(x, &e, &n, &cap)) {
    free(e);
    return -ENOMEM;
  }
  if (n)
    qsort(e, n, sizeof(*e), cmp_edges);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (m && e[m - 1].from == e[i].from && e[m - 1].to == e[i].to) {
      e[m - 1].nsteps++;
      continue;
    }
    e[m++] = e[i];
  }
  x->d->edges = e;
  x->d->nedges = m;
  for (size_t i = 0; i < m; i++) {
    x->ri[e[i].from].out++;
    x->ri[e[i].to].in++;
  }
  for (size_t i = 0, r = 0; r <= (size_t)x->size; r++) {
    while (i < m && (size_t)e[i].from < r)
      i++;
    x->first[r] = i;
  }
  return 0;
}

/* Finds a cycle (iterative DFS from the waiting ranks); marks its edges. */
static int find_cycle(ctx_t *x) {
  int n = x->size;
  uint8_t *color = calloc((size_t)n, 1); /* 0 new, 1 on the path, 2 done */
  int *path = malloc((size_t)n * sizeof(*path));
  size_t *next = malloc((size_t)n * sizeof(*next)); /* the edge to try next */
  int rc = 0;
  if (!color || !path || !next) {
    rc = -ENOMEM;
    goto out;
  }
  for (int s = 0; s < n && !x->d->ncycle; s++) {
    if (color[s] || !x->ri[s].out)
      continue;
    int depth = 0;
    path[depth++] = s;
    color[s] = 1;
    next[s] = x->first[s];
    while (depth && !x->d->ncycle) {
      int u = path[depth - 1];
      if (next[u] == x->first[u + 1]) {
        color[u] = 2;
        depth--;
        continue;
      }
      int v = x->d->edges[next[u]++].to;
      if (color[v] == 0) {
        color[v] = 1;
        next[v] = x->first[v];
        path[depth++] = v;
      } else if (color[v] == 1) {
        int at = depth - 1;
        while (path[at] != v)
          at--;
        size_t len = (size_t)(depth - at) + 1;
        x->d->cycle = malloc(len * sizeof(int));
        if (!x->d->cycle) {
          rc = -ENOMEM;
          goto out;
        }
        for (int k = at; k < depth; k++)
          x->d->cycle[x->d->ncycle++] = path[k];
        x->d->cycle[x->d->ncycle++] = v;
      }
    }
  }
  for (size_t k = 0; k + 1 < x->d->ncycle; k++) {
    int a = x->d->cycle[k], b = x->d->cycle[k + 1];
    for (size_t i = x->first[a]; i < x->first[a + 1]; i++)
      if (x->d->edges[i].to == b)
        x->d->edges[i].in_cycle = true;
  }
out:
  free(color);
  free(path);
  free(next);
  return rc;
}

/* ---- calls that differ ---- */

typedef struct centry {
  uint64_t seq;
  int rank;
  const tr_call_t *call;
} centry_t;

static bool rooted(int k) {
  return k == CHORUS__TRACE__COLL_KIND__COLL_BCAST || k == CHORUS__TRACE__COLL_KIND__COLL_REDUCE ||
         k == CHORUS__TRACE__COLL_KIND__COLL_GATHER || k == CHORUS__TRACE__COLL_KIND__COLL_SCATTER;
}

static bool reducing(int k) {
  return k == CHORUS__TRACE__COLL_KIND__COLL_ALLREDUCE ||
         k == CHORUS__TRACE__COLL_KIND__COLL_REDUCE ||
         k == CHORUS__TRACE__COLL_KIND__COLL_REDUCE_SCATTER;
}

#define CMP(a, b)                                                                                  \
  do {                                                                                             \
    if ((a) != (b))                                                                                \
      return (a) < (b) ? -1 : 1;                                                                   \
  } while (0)

/* Orders calls so that equal ones (as the engine's fingerprint sees them)
 * are adjacent; 0 when they agree. */
static int cmp_calls(const tr_call_t *a, const tr_call_t *b) {
  CMP(a->kind, b->kind);
  if (a->kind == CHORUS__TRACE__COLL_KIND__COLL_BARRIER)
    return 0;
  CMP(a->dtype, b->dtype);
  CMP(a->count, b->count);
  if (reducing(a->kind))
    CMP(a->op, b->op);
  if (rooted(a->kind))
    CMP(a->root, b->root);
  return 0;
}

static int cmp_centry(const void *pa, const void *pb) {
  const centry_t *a = pa, *b = pb;
  CMP(a->seq, b->seq);
  int c = cmp_calls(a->call, b->call);
  if (c)
    return c;
  CMP(a->rank, b->rank);
  return 0;
}

static void differs(tr_buf_t *b, const tr_call_t *x, const tr_call_t *y) {
  const char *sep = "";
#define FIELD(cond, name)                                                                          \
  if (cond) {                                                                                      \
    tr_bprintf(b, "%s%s", sep, name);                                                              \
    sep = ", ";                                                                                    \
  }
  FIELD(x->dtype != y->dtype, "dtype");
  FIELD(x->count != y->count, "count");
  FIELD(reducing(x->kind) && x->op != y->op, "op");
  FIELD(rooted(x->kind) && x->root != y->root, "root");
#undef FIELD
  tr_bputs(b, *sep ? " differs" : "arguments differ");
}

typedef struct conflict {
  uint64_t seq;
  int *major; /* ranks of the largest group */
  size_t nmajor;
  int *minor; /* ranks of the culprit's group */
  size_t nminor;
  size_t ngroups;
  const tr_call_t *major_call, *minor_call;
} conflict_t;

/* The first seq at which calls differ; 1 found, 0 none, -ENOMEM. */
static int find_conflict(ctx_t *x, conflict_t *cf) {
  size_t n = 0, cap = 0;
  centry_t *e = NULL;
  int rc = 0;
  for (int r = 0; r < x->size; r++) {
    const tr_ckpt_t *ck = tr_ckpt(x->ri[r].d);
    if (!ck)
      continue;
    size_t m = ck->n_recent + 1;
    if (n + m > cap) {
      size_t ncap = cap ? cap : 64;
      while (ncap < n + m)
        ncap *= 2;
      centry_t *ne = realloc(e, ncap * sizeof(*ne));
      if (!ne) {
        free(e);
        return -ENOMEM;
      }
      e = ne;
      cap = ncap;
    }
    for (size_t i = 0; i < m; i++) {
      const tr_call_t *c = i < ck->n_recent ? ck->recent[i] : ck->current;
      if (!c || !c->seq || c->kind == CHORUS__TRACE__COLL_KIND__COLL_UNKNOWN ||
          c->kind == CHORUS__TRACE__COLL_KIND__COLL_SEND ||
          c->kind == CHORUS__TRACE__COLL_KIND__COLL_RECV)
        continue;
      /* a rank's own records of one seq count once: the first */
      bool dup = false;
      for (size_t k = n; k-- > 0 && e[k].rank == r;)
        if (e[k].seq == c->seq)
          dup = true;
      if (!dup)
        e[n++] = (centry_t){.seq = c->seq, .rank = r, .call = c};
    }
  }
  if (n)
    qsort(e, n, sizeof(*e), cmp_centry);
  for (size_t i = 0; i < n && !rc;) {
    size_t j = i, groups = 0;
    while (j < n && e[j].seq == e[i].seq) {
      if (j == i || cmp_calls(e[j].call, e[j - 1].call))
        groups++;
      j++;
    }
    if (groups < 2) {
      i = j;
      continue;
    }
    /* largest group (ties: the one with the lowest rank); the culprit's:
     * the smallest other one (ties: lowest rank) */
    size_t best = i, best_n = 0, worst = i, worst_n = 0;
    int best_min = 0, worst_min = 0;
    for (size_t g = i; g < j;) {
      size_t h = g + 1;
      int min = e[g].rank;
      while (h < j && !cmp_calls(e[h].call, e[g].call)) {
        if (e[h].rank < min)
          min = e[h].rank;
        h++;
      }
      size_t cnt = h - g;
      if (cnt > best_n || (cnt == best_n && min < best_min)) {
        best = g;
        best_n = cnt;
        best_min = min;
      }
      g = h;
    }
    for (size_t g = i; g < j;) {
      size_t h = g + 1;
      int min = e[g].rank;
      while (h < j && !cmp_calls(e[h].call, e[g].call)) {
        if (e[h].rank < min)
          min = e[h].rank;
        h++;
      }
      size_t cnt = h - g;
      if (g != best && (!worst_n || cnt < worst_n || (cnt == worst_n && min < worst_min))) {
        worst = g;
        worst_n = cnt;
        worst_min = min;
      }
      g = h;
    }
    cf->seq = e[i].seq;
    cf->ngroups = groups;
    cf->major_call = e[best].call;
    cf->minor_call = e[worst].call;
    if (!worst_n || !best_n)
      break; /* cannot be: two groups at least */
    cf->major = malloc(best_n * sizeof(int));
    cf->minor = malloc(worst_n * sizeof(int));
    if (!cf->major || !cf->minor) {
      rc = -ENOMEM;
      break;
    }
    /* entries of a group are in rank order (the sort's last key) */
    for (size_t k = 0; k < best_n; k++)
      cf->major[cf->nmajor++] = e[best + k].rank;
    for (size_t k = 0; k < worst_n; k++)
      cf->minor[cf->nminor++] = e[worst + k].rank;
    rc = 1;
  }
  free(e);
  return rc;
}

/* ---- the paragraph ---- */

static void rank_list(tr_buf_t *b, const int *r, size_t n, const char *verb_one,
                      const char *verb_many) {
  tr_bputs(b, n == 1 ? "rank " : "ranks ");
  tr_ranks_str(b, r, n, 16);
  tr_bprintf(b, " %s", n == 1 ? verb_one : verb_many);
}

/* "ranks 0,1,3 wait; rank 3 in 'RECV chunk 2 from rank 2' for 12.4 s, ..."
 * (the waiting ranks other than `culprit`, then those that wait on it). */
static int waiters_str(ctx_t *x, tr_buf_t *b, int culprit) {
  int *w = malloc((size_t)x->size * sizeof(*w));
  size_t n = 0;
  if (!w)
    return -ENOMEM;
  for (int r = 0; r < x->size; r++)
    if ((x->ri[r].in_coll || x->ri[r].out) && r != culprit) /* out alone: waits in a split */
      w[n++] = r;
  if (!n) {
    free(w);
    tr_bputs(b, "no rank waits in it");
    return 0;
  }
  rank_list(b, w, n, "waits", "wait");
  free(w);
  size_t shown = 0, direct = 0;
  for (size_t i = 0; i < x->d->nedges; i++) {
    const tr_edge_t *e = &x->d->edges[i];
    if (culprit >= 0 && e->to != culprit)
      continue;
    direct++;
    if (shown == 3)
      continue;
    tr_bprintf(b, "%srank %d in '", shown ? ", " : "; ", e->from);
    tr_edge_step_str(b, e, x->size);
    tr_bputs(b, "' for ");
    tr_dur_str(b, e->age_ns);
    shown++;
  }
  if (direct > shown)
    tr_bprintf(b, " and %zu more", direct - shown);
  return 0;
}

static void head(ctx_t *x, tr_buf_t *b) {
  if (!x->d->seq) { /* no rank in a collective of its own: they wait in splits */
    uint64_t last = 0;
    for (int r = 0; r < x->size; r++) {
      const tr_ckpt_t *ck = x->ri[r].d ? tr_ckpt(x->ri[r].d) : NULL;
      if (ck && ck->last_begun > last)
        last = ck->last_begun;
    }
    tr_bprintf(b, "after collective #%llu, in splits: ", (unsigned long long)last);
    return;
  }
  tr_bprintf(b, "collective #%llu", (unsigned long long)x->d->seq);
  if (x->d->call) {
    tr_bputs(b, " ");
    tr_call_str(b, x->d->call);
  }
  tr_bputs(b, ": ");
}

/* The longest silence among the ranks in a collective other than r. */
static uint64_t others_quiet(ctx_t *x, int r, bool *any) {
  uint64_t top = 0;
  *any = false;
  for (int q = 0; q < x->size; q++)
    if (q != r && x->ri[q].in_coll && x->ri[q].quiet_known) {
      *any = true;
      if (x->ri[q].quiet > top)
        top = x->ri[q].quiet;
    }
  return top;
}

/* The oldest pending step of r that waits on no peer (READY/WAIT). */
static const tr_step_t *idle_step(ctx_t *x, int r) {
  const tr_dump_t *d = x->ri[r].d;
  const tr_ckpt_t *ck = tr_ckpt(d);
  const tr_step_t *best = NULL;
  for (size_t i = 0; ck && i < ck->n_pending; i++) {
    const tr_step_t *s = ck->pending[i];
    uint64_t age = tr_age(d->t_dump_ns, s->since_ns);
    if (s->state != CHORUS__TRACE__STEP_STATE__STATE_READY &&
        s->state != CHORUS__TRACE__STEP_STATE__STATE_WAIT)
      continue;
    if (blocking(s, age))
      continue;
    if (!best || s->since_ns < best->since_ns)
      best = s;
  }
  return best;
}

/* ", its progress engine last ran 40.0 s before its dump (the others': within
 * 0.1 s)" and its oldest step that waits on nobody. */
static void stall_detail(ctx_t *x, tr_buf_t *b, int r) {
  const tr_dump_t *d = x->ri[r].d;
  const tr_ckpt_t *ck = tr_ckpt(d);
  bool any;
  uint64_t others = others_quiet(x, r, &any);
  if (ck && ck->progress_ns)
    tr_bputs(b, "; its progress engine last ran ");
  else
    tr_bputs(b, "; nothing moved on it for ");
  tr_dur_str(b, x->ri[r].quiet);
  tr_bputs(b, " before its dump");
  if (any) {
    tr_bputs(b, " (the others': within ");
    tr_dur_str(b, others);
    tr_bputs(b, ")");
  }
  const tr_step_t *s = idle_step(x, r);
  if (s) {
    tr_bputs(b, " and '");
    tr_step_str(b, s, x->size);
    tr_bprintf(b, "' is %s since ", tr_state_name((int)s->state));
    tr_dur_str(b, tr_age(d->t_dump_ns, s->since_ns));
  }
}

/* ---- rules ---- */

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* The seq most waiting ranks are in (ties: the highest); ranks in a
 * collective without waiting count when none waits. */
static uint64_t frontier(ctx_t *x) {
  uint64_t *v = malloc((size_t)x->size * sizeof(*v));
  uint64_t best = 0;
  if (!v)
    return 0;
  for (int pass = 0; pass < 2 && !best; pass++) {
    size_t n = 0, best_n = 0;
    for (int r = 0; r < x->size; r++)
      if (x->ri[r].in_coll && (pass || x->ri[r].out))
        v[n++] = x->ri[r].cur;
    if (n)
      qsort(v, n, sizeof(*v), cmp_u64);
    for (size_t i = 0; i < n;) {
      size_t j = i;
      while (j < n && v[j] == v[i])
        j++;
      if (j - i >= best_n) {
        best = v[i];
        best_n = j - i;
      }
      i = j;
    }
  }
  free(v);
  return best;
}

static const tr_call_t *call_of_waiters(ctx_t *x, uint64_t seq, int skip) {
  for (int r = 0; r < x->size; r++) {
    if (r == skip || !x->ri[r].in_coll)
      continue;
    const tr_call_t *c = tr_call_at(x->ri[r].d, seq);
    if (c)
      return c;
  }
  for (int r = 0; r < x->size; r++) {
    if (r == skip)
      continue;
    const tr_call_t *c = tr_call_at(x->ri[r].d, seq);
    if (c)
      return c;
  }
  return NULL;
}

static int rule_conflict(ctx_t *x, tr_buf_t *b) {
  conflict_t cf = {0};
  int rc = find_conflict(x, &cf);
  if (rc <= 0)
    goto out;
  tr_diag_t *d = x->d;
  int culprit = cf.minor[0];
  bool other_kind = cf.major_call->kind != cf.minor_call->kind;
  d->kind = other_kind ? TR_DIVERGED : TR_MISMATCH;
  d->culprit = culprit;
  d->seq = cf.seq;
  d->call = cf.major_call;
  d->culprit_call = cf.minor_call;
  tr_bprintf(b, "collective #%llu: ", (unsigned long long)cf.seq);
  rank_list(b, cf.major, cf.nmajor, "called", "called");
  tr_bputs(b, " ");
  tr_call_str(b, cf.major_call);
  tr_bputs(b, " but ");
  rank_list(b, cf.minor, cf.nminor, "called", "called");
  tr_bputs(b, " ");
  tr_call_str(b, cf.minor_call);
  if (cf.ngroups > 2)
    tr_bprintf(b, " (and %zu more different calls)", cf.ngroups - 2);
  tr_bputs(b, other_kind ? ": another collective" : ": ");
  if (!other_kind)
    differs(b, cf.major_call, cf.minor_call);
  tr_bputs(b, "; ");
  rc = waiters_str(x, b, culprit);
  if (rc)
    goto out;
  if (other_kind)
    tr_bprintf(b, ": rank %d diverged (its #%llu is %s, not %s)", culprit,
               (unsigned long long)cf.seq, tr_coll_name((int)cf.minor_call->kind),
               tr_coll_name((int)cf.major_call->kind));
  else
    tr_bprintf(b, ": mismatched call at rank %d", culprit);
  rc = 1;
out:
  free(cf.major);
  free(cf.minor);
  return rc;
}

static int rule_lost(ctx_t *x, tr_buf_t *b) {
  int best = -1;
  bool any_wait = false;
  for (int r = 0; r < x->size; r++) /* out alone: waits in a split (none in the world yet) */
    any_wait |= x->ri[r].in_coll || x->ri[r].out;
  if (!any_wait)
    return 0;
  for (int r = 0; r < x->size; r++) {
    if (!is_lost(x, r))
      continue;
    if (best < 0 || x->ri[r].in > x->ri[best].in)
      best = r;
  }
  if (best < 0 || (x->ri[best].in == 0 && x->d->nedges))
    return 0;
  tr_diag_t *d = x->d;
  const rinfo_t *ri = &x->ri[best];
  d->kind = TR_LOST;
  d->culprit = best;
  d->seq = frontier(x);
  d->call = call_of_waiters(x, d->seq, best);
  head(x, b);
  int rc = waiters_str(x, b, best);
  if (rc)
    return rc;
  tr_bprintf(b, "; rank %d ", best);
  const char *and = "";
  if (!ri->d) {
    tr_bputs(b, "left no dump");
    and = " and ";
  } else if (ri->fatal) {
    tr_bputs(b, "dumped on a fatal error");
    if (ri->d->verdict && ri->d->verdict->text[0]) {
      tr_bputs(b, " ('");
      tr_text_str(b, ri->d->verdict->text, 200);
      tr_bputs(b, "')");
    }
    and = " and ";
  } else {
    tr_bputs(b, "wrote a dump");
    and = ", but ";
  }
  if (ri->lost_votes) {
    int *v = malloc((size_t)x->size * sizeof(*v));
    size_t n = 0;
    if (!v)
      return -ENOMEM;
    for (int r = 0; r < x->size; r++) {
      const tr_dump_t *od = x->ri[r].d;
      for (size_t i = 0; od && r != best && i < od->n_peers; i++)
        if (od->peers[i]->rank == best &&
            od->peers[i]->state == CHORUS__TRACE__PEER_VIEW__STATE__LOST) {
          v[n++] = r;
          break;
        }
    }
    tr_bputs(b, and);
    rank_list(b, v, n, "saw it lost", "saw it lost");
    free(v);
  }
  tr_bprintf(b, ": rank %d lost", best);
  return 1;
}

/* Endings, as the watchdog judges them: ranks that destroyed the
 * communicator before the lowest call another rank is in, against the ranks
 * in it. More callers than ended (and undecided) ranks: the ended ones left
 * early; more ended: the callers made an extra call; a tie: those who left. */
static int rule_ends(ctx_t *x, tr_buf_t *b) {
  uint64_t S = 0;
  for (int r = 0; r < x->size; r++)
    if (x->ri[r].in_coll && !is_lost(x, r) && (!S || x->ri[r].cur < S))
      S = x->ri[r].cur;
  if (!S)
    return 0;
  int *ended = malloc((size_t)x->size * sizeof(int)),
      *called = malloc((size_t)x->size * sizeof(int));
  size_t ne = 0, nc = 0, nu = 0;
  if (!ended || !called) {
    free(ended);
    free(called);
    return -ENOMEM;
  }
  for (int r = 0; r < x->size; r++) {
    const tr_ckpt_t *ck = tr_ckpt(x->ri[r].d);
    if (is_lost(x, r))
      continue;
    if (!ck)
      nu++;
    else if (tr_last_begun(x->ri[r].d) >= S)
      called[nc++] = r;
    else if (ck->destroying)
      ended[ne++] = r;
    else
      nu++;
  }
  int rc = 0;
  if (!ne || !nc)
    goto out;
  bool left = nc > ne + nu, extra = ne > nc + nu;
  if (!left && !extra)
    left = nc >= ne;
  tr_diag_t *d = x->d;
  d->kind = TR_DIVERGED;
  d->seq = S;
  d->call = call_of_waiters(x, S, -1);
  uint64_t last = tr_last_begun(x->ri[ended[0]].d);
  head(x, b);
  if (left) {
    d->culprit = ended[0];
    if ((rc = waiters_str(x, b, -1)))
      goto out;
    tr_bputs(b, "; ");
    rank_list(b, ended, ne, "destroyed", "destroyed");
    tr_bprintf(b, " the communicator after #%llu and will never call #%llu: ",
               (unsigned long long)last, (unsigned long long)S);
    rank_list(b, ended, ne, "diverged", "diverged");
    tr_bputs(b, " (it made fewer calls: it left)");
  } else {
    d->culprit = called[0];
    rank_list(b, called, nc, "called", "called");
    tr_bprintf(b, " #%llu after ", (unsigned long long)S);
    rank_list(b, ended, ne, "destroyed", "destroyed");
    tr_bprintf(b, " the communicator (%s last call: #%llu): ", ne == 1 ? "its" : "their",
               (unsigned long long)last);
    rank_list(b, called, nc, "diverged", "diverged");
    tr_bputs(b, " (it called after the others left: an extra call)");
  }
  rc = 1;
out:
  free(ended);
  free(called);
  return rc;
}

static int rule_root(ctx_t *x, tr_buf_t *b) {
  int best = -1;
  for (int r = 0; r < x->size; r++) {
    if (!x->ri[r].in || x->ri[r].out || is_lost(x, r))
      continue;
    if (best < 0 || x->ri[r].in > x->ri[best].in)
      best = r;
  }
  if (best < 0)
    return 0;
  tr_diag_t *d = x->d;
  const rinfo_t *ri = &x->ri[best];
  uint64_t k = frontier(x);
  uint64_t lb = tr_last_begun(ri->d);
  d->culprit = best;
  d->seq = k;
  d->call = call_of_waiters(x, k, best);
  head(x, b);
  int rc = waiters_str(x, b, best);
  if (rc)
    return rc;
  const tr_call_t *at = tr_current(ri->d);
  if (!ri->in_coll && lb < k) {
    d->kind = TR_DIVERGED;
    if (lb && at) {
      tr_bprintf(b, "; rank %d is at #%llu ", best, (unsigned long long)lb);
      tr_call_str(b, at);
      tr_bprintf(b, " and never called #%llu", (unsigned long long)k);
    } else {
      tr_bprintf(b, "; rank %d never called #%llu", best, (unsigned long long)k);
    }
    tr_bprintf(b, ": rank %d diverged", best);
  } else if (!ri->in_coll || ri->cur > k) {
    d->kind = TR_LOST_MSG;
    tr_bprintf(b, "; rank %d has left #%llu and is ", best, (unsigned long long)k);
    if (ri->in_coll)
      tr_bprintf(b, "in #%llu", (unsigned long long)ri->cur);
    else
      tr_bprintf(b, "in no collective (its last call: #%llu)", (unsigned long long)lb);
    tr_bprintf(b, ": the messages they wait for from rank %d were lost", best);
  } else {
    d->kind = TR_STALLED;
    if (ri->cur < k) {
      tr_bprintf(b, "; rank %d is still in #%llu ", best, (unsigned long long)ri->cur);
      tr_call_str(b, tr_call_at(ri->d, ri->cur));
    } else {
      tr_bprintf(b, "; rank %d is in #%llu but waits for no peer", best, (unsigned long long)k);
    }
    stall_detail(x, b, best);
    tr_bprintf(b, ": rank %d stalled", best);
  }
  return 1;
}

static int rule_stale(ctx_t *x, tr_buf_t *b) {
  /* the two longest silences: r's rivals are the first, or the second for r itself */
  int top = -1, n = 0;
  uint64_t second = 0;
  for (int r = 0; r < x->size; r++) {
    if (!x->ri[r].in_coll || !x->ri[r].quiet_known)
      continue;
    n++;
    if (top < 0 || x->ri[r].quiet > x->ri[top].quiet) {
      if (top >= 0)
        second = x->ri[top].quiet;
      top = r;
    } else if (x->ri[r].quiet > second) {
      second = x->ri[r].quiet;
    }
  }
  int best = -1;
  if (n >= 2 && x->ri[top].quiet >= TR_STALL_MIN_NS && x->ri[top].quiet / TR_STALL_FACTOR >= second)
    best = top;
  if (best < 0)
    return 0;
  tr_diag_t *d = x->d;
  d->kind = TR_STALLED;
  d->culprit = best;
  d->seq = x->ri[best].cur;
  d->call = tr_call_at(x->ri[best].d, d->seq);
  head(x, b);
  int rc = waiters_str(x, b, best);
  if (rc)
    return rc;
  tr_bprintf(b, "; rank %d is in #%llu", best, (unsigned long long)d->seq);
  stall_detail(x, b, best);
  tr_bprintf(b, ": rank %d stalled", best);
  return 1;
}

static int rule_cycle(ctx_t *x, tr_buf_t *b) {
  tr_diag_t *d = x->d;
  if (!d->ncycle)
    return 0;
  d->kind = TR_CYCLE;
  d->culprit = -1;
  d->seq = frontier(x);
  d->call = call_of_waiters(x, d->seq, -1);
  head(x, b);
  int rc = waiters_str(x, b, -1);
  if (rc)
    return rc;
  tr_bputs(b, "; their waits form a cycle and no rank is behind, lost or stalled: deadlock cycle ");
  for (size_t i = 0; i < d->ncycle; i++) {
    if (i == 16 && d->ncycle > 18) {
      tr_bprintf(b, " -> ... (%zu ranks)", d->ncycle - 1);
      i = d->ncycle - 2;
      continue;
    }
    tr_bprintf(b, "%s%d", i ? " -> " : "", d->cycle[i]);
  }
  /* a wait of the cycle inside a split says where */
  size_t shown = 0;
  for (size_t k = 0; k + 1 < d->ncycle && shown < 2; k++)
    for (size_t i = x->first[d->cycle[k]]; i < x->first[d->cycle[k] + 1]; i++) {
      const tr_edge_t *e = &d->edges[i];
      if (e->to != d->cycle[k + 1] || !e->via)
        continue;
      tr_bprintf(b, "%s rank %d waits on rank %d ", shown ? "," : " (of it,", e->from, e->to);
      tr_edge_step_str(b, e, x->size);
      shown++;
      break;
    }
  if (shown)
    tr_bputs(b, ")");
  return 1;
}

static int rule_blamed(ctx_t *x, tr_buf_t *b) {
  int *votes = calloc((size_t)x->size, sizeof(*votes));
  int best = -1, first = -1;
  if (!votes)
    return -ENOMEM;
  for (int r = 0; r < x->size; r++) {
    const tr_dump_t *d = x->ri[r].d;
    if (!d || !d->verdict || d->verdict->culprit < 0 || d->verdict->culprit >= x->size)
      continue;
    int c = d->verdict->culprit;
    if (c == r && d->verdict->reason != CHORUS__TRACE__VERDICT__REASON__DIVERGED &&
        d->verdict->reason != CHORUS__TRACE__VERDICT__REASON__MISMATCH)
      continue;
    votes[c]++;
    if (best < 0 || votes[c] > votes[best])
      best = c;
  }
  if (best < 0) {
    free(votes);
    return 0;
  }
  for (int r = 0; r < x->size && first < 0; r++) {
    const tr_dump_t *d = x->ri[r].d;
    if (d && d->verdict && d->verdict->culprit == best)
      first = r;
  }
  tr_diag_t *d = x->d;
  d->kind = TR_BLAMED;
  d->culprit = best;
  d->seq = frontier(x);
  d->call = call_of_waiters(x, d->seq, -1);
  const Chorus__Trace__Verdict *v = x->ri[first].d->verdict;
  tr_bprintf(b,
             "the dumps show no wait on another rank, but %d rank%s own verdict%s blame%s rank %d",
             votes[best], votes[best] == 1 ? "'s" : "s'", votes[best] == 1 ? "" : "s",
             votes[best] == 1 ? "s" : "", best);
  tr_bprintf(b, " (rank %d: %s", first, tr_reason_name((int)v->reason));
  if (v->text[0]) {
    tr_bputs(b, " '");
    tr_text_str(b, v->text, 200);
    tr_bputs(b, "'");
  }
  tr_bprintf(b, "): rank %d blamed", best);
  free(votes);
  return 1;
}

static void no_culprit(ctx_t *x, tr_buf_t *b) {
  int *w = malloc((size_t)x->size * sizeof(*w));
  size_t nw = 0, nmiss = 0, nidle = 0;
  uint64_t top = 0;
  for (int r = 0; r < x->size; r++) {
    if (!x->ri[r].d) {
      nmiss++;
      continue;
    }
    if (x->ri[r].in_coll && w)
      w[nw++] = r;
    else if (!x->ri[r].in_coll)
      nidle++;
    if (tr_last_begun(x->ri[r].d) > top)
      top = tr_last_begun(x->ri[r].d);
  }
  tr_bputs(b, "no culprit: ");
  if (nw) {
    x->d->seq = frontier(x);
    x->d->call = call_of_waiters(x, x->d->seq, -1);
    rank_list(b, w, nw, "is", "are");
    tr_bprintf(b, " in collective #%llu ", (unsigned long long)x->d->seq);
    tr_call_str(b, x->d->call);
    tr_bputs(b, " but no step of theirs waits on another rank");
    if (nidle)
      tr_bprintf(b, "; %zu rank%s in no collective", nidle, nidle == 1 ? " is" : "s are");
  } else {
    tr_bprintf(b, "%zu rank%s idle, the last collective begun is #%llu", nidle,
               nidle == 1 ? " is" : "s are", (unsigned long long)top);
  }
  if (nmiss)
    tr_bprintf(b, "; %zu rank%s left no dump", nmiss, nmiss == 1 ? "" : "s");
  free(w);
}

static void pick_fsm_rank(ctx_t *x) {
  tr_diag_t *d = x->d;
  int c = d->culprit;
  d->fsm_rank = -1;
  if (c >= 0 && tr_ckpt(x->ri[c].d) && tr_ckpt(x->ri[c].d)->n_pending)
    d->fsm_rank = c;
  for (size_t i = 0; i < d->nedges && d->fsm_rank < 0; i++)
    if (c < 0 || d->edges[i].to == c)
      d->fsm_rank = d->edges[i].from;
  for (int r = 0; r < x->size && d->fsm_rank < 0; r++)
    if (x->ri[r].in_coll && tr_ckpt(x->ri[r].d)->n_pending)
      d->fsm_rank = r;
}

int tr_diagnose(const tr_comm_t *c, tr_diag_t *out) {
  tr_buf_t b = {0};
  ctx_t x = {.c = c, .size = c->size, .d = out};
  int rc = 0;
  *out = (tr_diag_t){.comm = c, .culprit = -1, .fsm_rank = -1};
  x.ri = calloc((size_t)c->size, sizeof(*x.ri));
  x.first = calloc((size_t)c->size + 1, sizeof(*x.first));
  if (!x.ri || !x.first) {
    rc = -ENOMEM;
    goto out;
  }
  rank_info(&x);
  if ((rc = build_edges(&x)) || (rc = find_cycle(&x)))
    goto out;
  static int (*const rules[])(ctx_t *, tr_buf_t *) = {
      rule_conflict, rule_lost, rule_ends, rule_root, rule_stale, rule_cycle, rule_blamed};
  rc = 0;
  for (size_t i = 0; i < sizeof(rules) / sizeof(rules[0]) && rc == 0; i++) {
    tr_bclear(&b);
    rc = rules[i](&x, &b);
  }
  if (rc < 0)
    goto out;
  if (rc == 0) {
    tr_bclear(&b);
    out->kind = TR_NONE;
    out->culprit = -1;
    no_culprit(&x, &b);
  }
  rc = 0;
  if (b.oom) {
    rc = -ENOMEM;
    goto out;
  }
  pick_fsm_rank(&x);
  out->text = b.p;
  b.p = NULL;
out:
  tr_bfree(&b);
  free(x.ri);
  free(x.first);
  return rc;
}

void tr_diag_free(tr_diag_t *d) {
  free(d->edges);
  free(d->cycle);
  free(d->text);
  *d = (tr_diag_t){.culprit = -1, .fsm_rank = -1};
}
