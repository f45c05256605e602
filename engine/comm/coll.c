/*
 * coll.c - every collective call, blocking and nonblocking, through one path:
 *
 *   chorus_bcast / chorus_ibcast / ...  (a coll_call_t)
 *     -> validate the arguments (one code and message per mistake)
 *     -> describe the shape (algo_args_t: topology, chunk, in place)
 *     -> select an algorithm (select.h; CHORUS_ALGO or the cost model)
 *     -> find the plan in the communicator's cache, or compile it, check it
 *        and verify it (verify.h) before its first run
 *     -> a request, handed to the progress thread at once or queued in the
 *        calling thread's group until the outermost chorus_group_end
 *
 * Point-to-point calls are plans too (COLL_SEND/COLL_RECV, the "p2p"
 * algorithm). Their tags carry a per-(peer, direction) counter as the
 * sequence field and set EXEC_MSG_P2P in the message field, so sends and
 * receives match in call order whatever collectives run meanwhile, and never
 * match a collective's message (those stay below ALGO_MAX_MSGS).
 *
 * The fused allreduce is one plan run by one request:
 *
 *   COPY sendbufs[i] -> bucket[off_i]        (pack, one step per buffer)
 *   the selected allreduce, in place on the bucket (plan_append)
 *   COPY bucket[off_i] -> recvbufs[i]        (unpack)
 *
 * where the bucket sits at the start of scratch and the allreduce's own
 * scratch after it. Each allreduce step that touches bucket bytes waits for
 * the packs of those bytes; each unpack waits for the steps that write its
 * bytes, so small buffers leave as soon as they are reduced.
 *
 * Threads: everything here runs on the application thread (the plan cache,
 * the counters and the groups are not shared with the progress thread).
 */
#define _GNU_SOURCE /* sched_getaffinity */
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "algos/algos.h"
#include "comm.h"
#include "eng.h"
#include "fault.h"
#include "fsm.h"
#include "memcopy.h"
#include "memreg.h"
#include "select.h"
#include "topo.h"
#include "verify.h"

/* One call as the application made it. */
typedef struct coll_call {
  coll_kind coll;
  const char *fn; /* the entry point, for messages ("chorus_ibcast") */
  const void *sendbuf;
  void *recvbuf;
  size_t count;
  chorus_dtype dtype;
  chorus_op op;
  int root; /* root, or peer of send/recv */
  /* fused allreduce (multi) */
  bool multi;
  const void *const *sendbufs;
  void *const *recvbufs;
  const size_t *counts;
  int nbufs;
} coll_call_t;

/* What the call needs of this rank's buffers. */
typedef struct coll_role {
  size_t send_bytes, recv_bytes; /* what the buffers must hold */
  bool send_used, recv_used;     /* false: ignored on this rank (may be NULL) */
} coll_role_t;

/* The shape a plan is compiled for: the cache key. */
typedef struct coll_shape {
  algo_args_t a;        /* what the algorithm builds (the bucket when fused) */
  const algo_desc_t *d; /* NULL: the empty plan (nothing to move) */
  const size_t *mcounts;
  int nmulti;
} coll_shape_t;

static bool coll_reduces(int coll) {
  return coll == COLL_ALLREDUCE || coll == COLL_REDUCE || coll == COLL_REDUCE_SCATTER;
}

static bool coll_rooted(int coll) {
  return coll == COLL_BCAST || coll == COLL_REDUCE || coll == COLL_GATHER || coll == COLL_SCATTER ||
         coll == COLL_SEND || coll == COLL_RECV;
}

static bool coll_p2p(int coll) {
  return coll == COLL_SEND || coll == COLL_RECV;
}

/* ---- groups (per thread) ---- */

typedef struct coll_group {
  int depth;
  chorus_result first_err; /* first failure of a call made inside the group */
  chorus_request_t **q;    /* queued requests, in call order; NULL = dropped */
  size_t n, cap;
} coll_group_t;

static _Thread_local coll_group_t tl_group;

static chorus_result group_note(chorus_result rc) {
  if (rc && tl_group.depth && !tl_group.first_err)
    tl_group.first_err = rc;
  return rc;
}

/* Room for one more queued request, taken before the request exists: a call
 * that fails after taking a sequence number would desynchronise the ranks. */
static int group_reserve(void) {
  coll_group_t *g = &tl_group;
  if (g->n < g->cap)
    return 0;
  size_t ncap = g->cap ? g->cap * 2 : 16;
  chorus_request_t **q = realloc(g->q, ncap * sizeof(*q));
  if (!q)
    return -ENOMEM;
  g->q = q;
  g->cap = ncap;
  return 0;
}

CHORUS_API chorus_result chorus_group_start(void) {
  if (tl_group.depth == 0)
    tl_group.first_err = CHORUS_SUCCESS;
  tl_group.depth++;
  return CHORUS_SUCCESS;
}

CHORUS_API chorus_result chorus_group_end(void) {
  coll_group_t *g = &tl_group;
  chorus_result first;

  if (g->depth == 0)
    return eng_error(CHORUS_ERR_INVALID_ARG,
                     "chorus_group_end: no group is open (no matching chorus_group_start)");
  if (--g->depth)
    return CHORUS_SUCCESS;
  /* Everything starts before anything is waited for: a send and the
   * receive it pairs with on the peer are both in flight. */
  for (size_t i = 0; i < g->n; i++)
    if (g->q[i])
      comm_submit(g->q[i]->comm, g->q[i], true, 0);
  first = g->first_err;
  if (first)
    eng_error(first, "chorus_group_end: a call inside the group failed: %s",
              chorus_strerror(first));
  for (size_t i = 0; i < g->n; i++) {
    chorus_request_t *r = g->q[i];
    if (!r)
      continue;
    request_wait_done(r);
    if (r->result && !first) {
      first = r->result;
      eng_error(first, "chorus_group_end: %s #%u on rank %d failed: %s", coll_kind_str(r->coll),
                r->seq, r->comm->rank, chorus_strerror(first));
    }
    if (r->grouped)
      request_release(r);
  }
  free(g->q);
  g->q = NULL;
  g->n = g->cap = 0;
  g->first_err = CHORUS_SUCCESS;
  return first;
}

void coll_comm_drop_queued(chorus_comm_t *c) {
  coll_group_t *g = &tl_group;

  for (size_t i = 0; i < g->n; i++) {
    chorus_request_t *r = g->q[i];
    if (!r || r->comm != c || r->submitted)
      continue;
    g->q[i] = NULL;
    group_note(CHORUS_ERR_INVALID_COMM);
    request_complete(r, CHORUS_ERR_INVALID_COMM);
  }
}

/* ---- validation ---- */

static bool overlaps(const void *a, size_t na, const void *b, size_t nb) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return na && nb && x < y + nb && y < x + na;
}

/* Elements of the send and receive buffers, in units of count. */
static void coll_mults(int coll, size_t n, size_t *ms, size_t *mr) {
  switch (coll) {
  case COLL_ALLGATHER:
  case COLL_GATHER:
    *ms = 1, *mr = n;
    break;
  case COLL_REDUCE_SCATTER:
  case COLL_SCATTER:
    *ms = n, *mr = 1;
    break;
  case COLL_ALLTOALL:
    *ms = n, *mr = n;
    break;
  case COLL_BARRIER:
    *ms = 0, *mr = 0;
    break;
  case COLL_SEND:
    *ms = 1, *mr = 0;
    break;
  case COLL_RECV:
    *ms = 0, *mr = 1;
    break;
  default:
    *ms = 1, *mr = 1;
    break;
  }
}

/* Checks a single-buffer call; fills ro and *inplace. */
static chorus_result coll_validate(chorus_comm_t *c, const coll_call_t *k, coll_role_t *ro,
                                   bool *inplace) {
  const char *fn = k->fn;
  const bool p2p = coll_p2p(k->coll);
  const char *sname = p2p ? "buf" : "sendbuf", *rname = p2p ? "buf" : "recvbuf";
  size_t ms, mr;

  *inplace = false;
  if ((unsigned)k->dtype >= CHORUS_DTYPE_COUNT)
    return comm_error(c, CHORUS_ERR_INVALID_DTYPE, "%s: unknown datatype %d", fn, (int)k->dtype);
  if (coll_reduces(k->coll) && (unsigned)k->op >= CHORUS_OP_COUNT)
    return comm_error(c, CHORUS_ERR_INVALID_OP, "%s: unknown reduction op %d", fn, (int)k->op);
  if (coll_rooted(k->coll) && (k->root < 0 || k->root >= c->size))
    return comm_error(c, CHORUS_ERR_INVALID_ARG, "%s: %s %d out of range [0, %d)", fn,
                      p2p ? "peer" : "root", k->root, c->size);
  if (p2p && k->root == c->rank)
    return comm_error(c, CHORUS_ERR_INVALID_ARG,
                      "%s: peer %d is this rank (a rank cannot send to itself)", fn, k->root);
  const size_t es = chorus_dtype_size(k->dtype);
  coll_mults(k->coll, (size_t)c->size, &ms, &mr);
  const size_t m = ms > mr ? ms : mr;
  if (m && k->count > (SIZE_MAX / 4) / es / m)
    return comm_error(c, CHORUS_ERR_COUNT_OVERFLOW,
                      "%s: count %zu of %s (%zu bytes each)%s overflows", fn, k->count,
                      chorus_dtype_name(k->dtype), es, m > 1 ? " times the number of ranks" : "");
  ro->send_bytes = ms * k->count * es;
  ro->recv_bytes = mr * k->count * es;
  ro->send_used = ms > 0;
  ro->recv_used = mr > 0;
  const bool root = c->rank == k->root;
  if (k->coll == COLL_BCAST || k->coll == COLL_SCATTER)
    ro->send_used = root;
  if (k->coll == COLL_REDUCE || k->coll == COLL_GATHER)
    ro->recv_used = root;
  if (k->count && ro->send_used && !k->sendbuf)
    return comm_error(c, CHORUS_ERR_INVALID_ARG, "%s(%s, %zu): %s is NULL", fn,
                      chorus_dtype_name(k->dtype), k->count, sname);
  if (k->count && ro->recv_used && !k->recvbuf)
    return comm_error(c, CHORUS_ERR_INVALID_ARG, "%s(%s, %zu): %s is NULL", fn,
                      chorus_dtype_name(k->dtype), k->count, rname);
  if (!k->count || !ro->send_used || !ro->recv_used)
    return CHORUS_SUCCESS;

  /* the documented in-place forms (algos.h); any other overlap is refused */
  const uintptr_t s = (uintptr_t)k->sendbuf, r = (uintptr_t)k->recvbuf;
  const size_t blk = k->count * es;
  const char *form = NULL;
  switch (k->coll) {
  case COLL_ALLREDUCE:
  case COLL_BCAST:
  case COLL_REDUCE:
    *inplace = s == r;
    form = "sendbuf == recvbuf";
    break;
  case COLL_ALLGATHER:
    *inplace = s == r + (size_t)c->rank * blk;
    form = "sendbuf == recvbuf + rank*count";
    break;
  case COLL_REDUCE_SCATTER:
    *inplace = r == s + (size_t)c->rank * blk;
    form = "recvbuf == sendbuf + rank*count";
    break;
  case COLL_GATHER:
    *inplace = s == r + (size_t)k->root * blk;
    form = "sendbuf == recvbuf + root*count on the root";
    break;
  case COLL_SCATTER:
    *inplace = r == s + (size_t)k->root * blk;
    form = "recvbuf == sendbuf + root*count on the root";
    break;
  default:
    break;
  }
  if (!*inplace && overlaps(k->sendbuf, ro->send_bytes, k->recvbuf, ro->recv_bytes))
    return comm_error(c, CHORUS_ERR_INVALID_ARG, "%s(%s, %zu): sendbuf and recvbuf overlap %s%s%s",
                      fn, chorus_dtype_name(k->dtype), k->count,
                      form ? "without being the in-place form ("
                           : "(this call has no in-place form)",
                      form ? form : "", form ? ")" : "");
  return CHORUS_SUCCESS;
}

typedef struct span {
  uintptr_t lo, hi;
  int i;
} span_t;

static int span_cmp(const void *a, const void *b) {
  const span_t *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Checks a fused allreduce; sets *total (elements). */
static chorus_result multi_validate(chorus_comm_t *c, const coll_call_t *k, size_t *total) {
  const char *fn = k->fn;
  const int nb = k->nbufs;

  *total = 0;
  if (nb < 0)
    return comm_error(c, CHORUS_ERR_INVALID_ARG, "%s: nbufs %d is negative", fn, nb);
  if (nb > 0 && (!k->sendbufs || !k->recvbufs || !k->counts))
    return comm_error(c, CHORUS_ERR_INVALID_ARG, "%s: %s is NULL", fn,
                      !k->sendbufs   ? "sendbufs"
                      : !k->recvbufs ? "recvbufs"
                                     : "counts");
  if ((unsigned)k->dtype >= CHORUS_DTYPE_COUNT)
    return comm_error(c, CHORUS_ERR_INVALID_DTYPE, "%s: unknown datatype %d", fn, (int)k->dtype);
  if ((unsigned)k->op >= CHORUS_OP_COUNT)
    return comm_error(c, CHORUS_ERR_INVALID_OP, "%s: unknown reduction op %d", fn, (int)k->op);
  const size_t es = chorus_dtype_size(k->dtype), limit = (SIZE_MAX / 4) / es;
  size_t sum = 0, nz = 0;
  for (int i = 0; i < nb; i++) {
    if (k->counts[i] > limit - sum)
      return comm_error(c, CHORUS_ERR_COUNT_OVERFLOW,
                        "%s: counts[%d] = %zu of %s (%zu bytes each) overflows the total", fn, i,
                        k->counts[i], chorus_dtype_name(k->dtype), es);
    sum += k->counts[i];
  }
  for (int i = 0; i < nb; i++) {
    if (!k->counts[i])
      continue;
    nz++;
    if (!k->sendbufs[i] || !k->recvbufs[i])
      return comm_error(c, CHORUS_ERR_INVALID_ARG, "%s(%s): %s[%d] is NULL", fn,
                        chorus_dtype_name(k->dtype), !k->sendbufs[i] ? "sendbufs" : "recvbufs", i);
    size_t bytes = k->counts[i] * es;
    if (k->sendbufs[i] != k->recvbufs[i] && overlaps(k->sendbufs[i], bytes, k->recvbufs[i], bytes))
      return comm_error(c, CHORUS_ERR_INVALID_ARG,
                        "%s(%s): sendbufs[%d] and recvbufs[%d] overlap without being equal "
                        "(pass the same pointer for in place)",
                        fn, chorus_dtype_name(k->dtype), i, i);
  }
  *total = sum;
  if (nz < 2)
    return CHORUS_SUCCESS;

  /* receive buffers pairwise disjoint, and no send buffer inside another
   * index's receive buffer: O(n log n) over the sorted receive ranges */
  span_t *sp = malloc(nz * sizeof(*sp));
  if (!sp)
    return comm_error(c, CHORUS_ERR_NO_MEMORY, "%s: out of memory", fn);
  size_t m = 0;
  for (int i = 0; i < nb; i++)
    if (k->counts[i]) {
      sp[m].lo = (uintptr_t)k->recvbufs[i];
      sp[m].hi = sp[m].lo + k->counts[i] * es;
      sp[m++].i = i;
    }
  qsort(sp, m, sizeof(*sp), span_cmp);
  chorus_result ret = CHORUS_SUCCESS;
  for (size_t j = 1; j < m && !ret; j++)
    if (sp[j].lo < sp[j - 1].hi)
      ret = comm_error(c, CHORUS_ERR_INVALID_ARG, "%s(%s): recvbufs[%d] and recvbufs[%d] overlap",
                       fn, chorus_dtype_name(k->dtype), sp[j - 1].i, sp[j].i);
  for (int i = 0; i < nb && !ret; i++) {
    if (!k->counts[i] || k->sendbufs[i] == k->recvbufs[i])
      continue;
    uintptr_t lo = (uintptr_t)k->sendbufs[i], hi = lo + k->counts[i] * es;
    size_t a = 0, b = m; /* first span ending after lo */
    while (a < b) {
      size_t mid = (a + b) / 2;
      if (sp[mid].hi <= lo)
        a = mid + 1;
      else
        b = mid;
    }
    if (a < m && sp[a].lo < hi && sp[a].i != i)
      ret = comm_error(c, CHORUS_ERR_INVALID_ARG,
                       "%s(%s): sendbufs[%d] overlaps recvbufs[%d] (written while it is read)", fn,
                       chorus_dtype_name(k->dtype), i, sp[a].i);
  }
  free(sp);
  return ret;
}

/* ---- compiling ---- */

static uint64_t align64(uint64_t x) {
  return (x + 63) & ~(uint64_t)63;
}

/* Index range [*a, *b) of the non-empty buffers (sorted offsets) that
 * overlap bucket bytes [lo, hi). */
static void bucket_find(const size_t *off, const size_t *len, const int *nzi, int nnz, size_t lo,
                        size_t hi, int *a, int *b) {
  int x = 0, y = nnz;
  while (x < y) {
    int mid = (x + y) / 2;
    if (off[nzi[mid]] + len[nzi[mid]] <= lo)
      x = mid + 1;
    else
      y = mid;
  }
  *a = x;
  while (x < nnz && off[nzi[x]] < hi)
    x++;
  *b = x;
}

/* The fused allreduce: pack, sh's allreduce on the bucket, unpack. */
static int compose_multi(const coll_call_t *k, const coll_shape_t *sh, plan_t **out) {
  const int nb = k->nbufs;
  const size_t es = chorus_dtype_size(sh->a.dtype);
  plan_t *sub = NULL;
  plan_builder_t b;
  size_t *off = NULL, *len = NULL;
  uint32_t *pack = NULL, *unpack = NULL;
  int *nzi = NULL, nnz = 0;
  int rc;

  *out = NULL;
  if ((rc = sh->d->build(&sh->a, &sub)))
    return rc;
  if ((rc = plan_build_begin(&b, sub->algo, sh->a.rank, sh->a.nranks, sh->a.count, sh->a.dtype,
                             sh->a.op, false)))
    goto out;
  off = malloc((size_t)nb * sizeof(*off));
  len = malloc((size_t)nb * sizeof(*len));
  pack = malloc((size_t)nb * sizeof(*pack));
  unpack = malloc((size_t)nb * sizeof(*unpack));
  nzi = malloc((size_t)nb * sizeof(*nzi));
  if (!off || !len || !pack || !unpack || !nzi) {
    b.err = -ENOMEM;
    goto end;
  }
  size_t pos = 0;
  for (int i = 0; i < nb; i++) {
    off[i] = pos;
    len[i] = k->counts[i] * es;
    pos += len[i];
    pack[i] = unpack[i] = UINT32_MAX;
    if (!len[i])
      continue;
    nzi[nnz++] = i;
    plan_step_t cp = {.kind = STEP_COPY,
                      .bytes = len[i],
                      .dst = {BUF_SCRATCH, off[i]},
                      .src = {BUF_COUNT + 2 * (uint32_t)i, 0}};
    pack[i] = plan_add(&b, &cp);
  }
  const size_t bucket = align64(pos);
  const plan_ref_t map[BUF_COUNT] = {[BUF_SEND] = {BUF_SCRATCH, 0},
                                     [BUF_RECV] = {BUF_SCRATCH, 0},
                                     [BUF_SCRATCH] = {BUF_SCRATCH, bucket}};
  uint32_t base = plan_append(&b, sub, map, 0);
  if (base == UINT32_MAX)
    goto end;
  for (int i = 0; i < nb; i++) {
    if (!len[i])
      continue;
    plan_step_t cp = {.kind = STEP_COPY,
                      .bytes = len[i],
                      .dst = {BUF_COUNT + 2 * (uint32_t)i + 1, 0},
                      .src = {BUF_SCRATCH, off[i]}};
    unpack[i] = plan_add(&b, &cp);
    plan_dep(&b, pack[i], unpack[i]);
  }
  for (uint32_t s = 0; s < sub->nsteps; s++) {
    const plan_step_t *st = &sub->steps[s];
    plan_ref_t refs[3];
    int nr = plan_step_refs(st, refs), x, y;
    for (int j = 0; j < nr; j++) {
      if (refs[j].buf != BUF_SEND && refs[j].buf != BUF_RECV)
        continue;
      bucket_find(off, len, nzi, nnz, refs[j].off, refs[j].off + st->bytes, &x, &y);
      for (int q = x; q < y; q++) {
        plan_dep(&b, pack[nzi[q]], base + s);
        /* refs[0] is what a writing step writes: the unpack waits for it */
        if (j == 0 && st->kind != STEP_SEND)
          plan_dep(&b, base + s, unpack[nzi[q]]);
      }
    }
  }
  b.plan->scratch_bytes = bucket + sub->scratch_bytes;
  b.plan->nxbufs = 2 * (uint32_t)nb;
end:
  rc = plan_build_end(&b, out);
out:
  plan_free(sub);
  free(off);
  free(len);
  free(pack);
  free(unpack);
  free(nzi);
  return rc;
}

static const char *shape_str(const coll_shape_t *sh, char *buf, size_t len) {
  snprintf(buf, len, "%s of %zu %s on %d ranks", coll_kind_str(sh->a.coll), sh->a.count,
           chorus_dtype_name(sh->a.dtype), sh->a.nranks);
  return buf;
}

/* Every step well formed and inside the buffers the call provides. */
static chorus_result check_plan(chorus_comm_t *c, const coll_call_t *k, const coll_shape_t *sh,
                                const coll_role_t *ro, const plan_t *p, size_t ext[2]) {
  const char *name = sh->d ? sh->d->name : "none";
  uint32_t maxmsg = 0;
  plan_ref_t refs[3];
  char shp[128];

  for (uint32_t i = 0; i < p->nsteps; i++) {
    const plan_step_t *s = &p->steps[i];
    if (s->kind >= STEP_KIND_COUNT)
      return comm_error(c, CHORUS_ERR_INTERNAL, "%s: algorithm %s: step %u has unknown kind %u",
                        k->fn, name, i, s->kind);
    if (s->kind == STEP_SEND || s->kind == STEP_RECV) {
      if (s->peer < 0 || s->peer >= c->size || s->peer == c->rank)
        return comm_error(c, CHORUS_ERR_INTERNAL, "%s: algorithm %s: step %u names peer %d", k->fn,
                          name, i, s->peer);
      if (s->msg + 1 > maxmsg)
        maxmsg = s->msg + 1;
    }
    int n = plan_step_refs(s, refs);
    for (int j = 0; j < n; j++)
      if (refs[j].buf >= BUF_COUNT + p->nxbufs)
        return comm_error(c, CHORUS_ERR_INTERNAL, "%s: algorithm %s: step %u names buffer %u",
                          k->fn, name, i, refs[j].buf);
  }
  if (maxmsg > ALGO_MAX_MSGS || p->nmsgs > ALGO_MAX_MSGS)
    return comm_error(c, CHORUS_ERR_UNSUPPORTED,
                      "%s: %s with %s needs %u messages, more than the %u a collective may use "
                      "(raise CHORUS_CHUNK_BYTES)",
                      k->fn, shape_str(sh, shp, sizeof(shp)), name,
                      maxmsg > p->nmsgs ? maxmsg : p->nmsgs, ALGO_MAX_MSGS);
  ext[0] = plan_extent(p, BUF_SEND);
  ext[1] = plan_extent(p, BUF_RECV);
  size_t sext = plan_extent(p, BUF_SCRATCH);
  if ((ro->send_used && ext[0] > ro->send_bytes) || (ro->recv_used && ext[1] > ro->recv_bytes) ||
      sext > p->scratch_bytes) {
    bool s = ro->send_used && ext[0] > ro->send_bytes, r = ro->recv_used && ext[1] > ro->recv_bytes;
    return comm_error(c, CHORUS_ERR_INTERNAL,
                      "%s: algorithm %s for %s reaches byte %zu of %s, which holds %zu", k->fn,
                      name, shape_str(sh, shp, sizeof(shp)),
                      s   ? ext[0]
                      : r ? ext[1]
                          : sext,
                      s   ? "sendbuf"
                      : r ? "recvbuf"
                          : "scratch",
                      s   ? ro->send_bytes
                      : r ? ro->recv_bytes
                          : p->scratch_bytes);
  }
  return CHORUS_SUCCESS;
}

static chorus_result compile(chorus_comm_t *c, const coll_call_t *k, const coll_shape_t *sh,
                             const coll_role_t *ro, plan_t **out, size_t ext[2]) {
  char err[512], shp[128];
  plan_t *p = NULL;
  plan_builder_t b;
  chorus_result ret;
  int rc;

  *out = NULL;
  if (!sh->d) {
    rc = plan_build_begin(&b, "none", c->rank, c->size, 0, sh->a.dtype, sh->a.op, false);
    if (!rc)
      rc = plan_build_end(&b, &p);
    if (rc)
      return comm_error(c, CHORUS_ERR_NO_MEMORY, "%s: out of memory", k->fn);
    *out = p;
    ext[0] = ext[1] = 0;
    return CHORUS_SUCCESS;
  }
  rc = sh->nmulti ? compose_multi(k, sh, &p) : sh->d->build(&sh->a, &p);
  if (rc == -ENOMEM)
    return comm_error(c, CHORUS_ERR_NO_MEMORY, "%s: out of memory compiling %s (%s)", k->fn,
                      shape_str(sh, shp, sizeof(shp)), sh->d->name);
  if (rc == -E2BIG)
    return comm_error(c, CHORUS_ERR_UNSUPPORTED,
                      "%s: algorithm %s cannot run %s: it would need %u or more messages "
                      "(raise CHORUS_CHUNK_BYTES)",
                      k->fn, sh->d->name, shape_str(sh, shp, sizeof(shp)), ALGO_MAX_MSGS);
  if (rc || !p)
    return comm_error(c, CHORUS_ERR_UNSUPPORTED, "%s: algorithm %s cannot build %s: %s", k->fn,
                      sh->d->name, shape_str(sh, shp, sizeof(shp)), strerror(rc ? -rc : EINVAL));
  if ((ret = check_plan(c, k, sh, ro, p, ext))) {
    plan_free(p);
    return ret;
  }
  /* a broken schedule never runs: every rank's plan of this shape is
   * built and checked against the others before the first run */
  if (c->set.verify && !coll_p2p(sh->a.coll)) {
    rc = verify_algo(sh->d, &sh->a, err, sizeof(err));
    if (rc) {
      plan_free(p);
      if (rc == -ENOMEM)
        return comm_error(c, CHORUS_ERR_NO_MEMORY, "%s: out of memory verifying %s", k->fn,
                          sh->d->name);
      return comm_error(c, CHORUS_ERR_INTERNAL, "%s: algorithm %s failed verification for %s: %s",
                        k->fn, sh->d->name, shape_str(sh, shp, sizeof(shp)), err);
    }
  }
  eng_log(ENG_DEBUG, c->rank, "coll", "compiled %s with %s: %u steps, %u messages, %zu scratch",
          shape_str(sh, shp, sizeof(shp)), sh->d->name, p->nsteps, p->nmsgs, p->scratch_bytes);
  *out = p;
  return CHORUS_SUCCESS;
}

static bool slot_is(const comm_plan_slot_t *s, const coll_shape_t *sh) {
  return s->plan && s->coll == (int)sh->a.coll && s->algo == sh->d && s->count == sh->a.count &&
         s->dtype == sh->a.dtype && s->op == sh->a.op && s->root == sh->a.root &&
         s->inplace == sh->a.inplace && s->own_placed == sh->a.own_placed &&
         s->chunk_bytes == sh->a.chunk_bytes && s->nmulti == sh->nmulti &&
         (!sh->nmulti || !memcmp(s->mcounts, sh->mcounts, (size_t)sh->nmulti * sizeof(size_t)));
}

/* The plan for sh: a cache slot (its refs taken) or, when every slot is in
 * use, an uncached plan the request will own (*slot NULL). */
static chorus_result plan_get(chorus_comm_t *c, const coll_call_t *k, const coll_shape_t *sh,
                              const coll_role_t *ro, comm_plan_slot_t **slot, plan_t **plan,
                              size_t ext[2]) {
  comm_plan_slot_t *victim = NULL;
  chorus_result ret;

  *slot = NULL;
  *plan = NULL;
  c->uses++;
  for (int i = 0; i < COMM_PLAN_CACHE; i++) {
    comm_plan_slot_t *s = &c->plans[i];
    if (slot_is(s, sh)) {
      s->last_use = c->uses;
      s->refs++;
      *slot = s;
      *plan = s->plan;
      ext[0] = s->extent[0];
      ext[1] = s->extent[1];
      return CHORUS_SUCCESS;
    }
    if (s->refs == 0 && (!victim || !s->plan || (victim->plan && s->last_use < victim->last_use)))
      victim = s;
  }
  plan_t *p;
  size_t *mc = NULL;
  if ((ret = compile(c, k, sh, ro, &p, ext)))
    return ret;
  if (victim && sh->nmulti) {
    mc = malloc((size_t)sh->nmulti * sizeof(*mc));
    if (mc)
      memcpy(mc, sh->mcounts, (size_t)sh->nmulti * sizeof(*mc));
    else
      victim = NULL; /* run it uncached */
  }
  if (!victim) {
    *plan = p;
    return CHORUS_SUCCESS;
  }
  plan_free(victim->plan);
  free(victim->mcounts);
  *victim = (comm_plan_slot_t){.plan = p,
                               .coll = sh->a.coll,
                               .algo = sh->d,
                               .count = sh->a.count,
                               .dtype = sh->a.dtype,
                               .op = sh->a.op,
                               .root = sh->a.root,
                               .inplace = sh->a.inplace,
                               .own_placed = sh->a.own_placed,
                               .chunk_bytes = sh->a.chunk_bytes,
                               .mcounts = mc,
                               .nmulti = sh->nmulti,
                               .extent = {ext[0], ext[1]},
                               .refs = 1,
                               .last_use = c->uses};
  *slot = victim;
  *plan = p;
  return CHORUS_SUCCESS;
}

/* ---- requests ---- */

/* Selection memo: the cost model and its test build run once per shape. */
static const algo_desc_t *sel_memo_find(const chorus_comm_t *c, const algo_args_t *a) {
  for (unsigned i = 0; i < sizeof(c->sel_memo) / sizeof(c->sel_memo[0]); i++) {
    const struct comm_sel_memo *m = &c->sel_memo[i];
    if (m->d && m->coll == (int)a->coll && m->count == a->count && m->dtype == (int)a->dtype &&
        m->op == (int)a->op && m->root == a->root && m->inplace == a->inplace &&
        m->chunk_bytes == a->chunk_bytes)
      return m->d;
  }
  return NULL;
}

static void sel_memo_put(chorus_comm_t *c, const algo_args_t *a, const algo_desc_t *d) {
  unsigned n = sizeof(c->sel_memo) / sizeof(c->sel_memo[0]);
  c->sel_memo[c->sel_memo_next++ % n] = (struct comm_sel_memo){
      d, (int)a->coll, (int)a->dtype, (int)a->op, a->root, a->inplace, a->count, a->chunk_bytes};
}

/* Validates, selects, compiles: a request ready to start (not yet handed
 * to the progress thread). */
/* CHORUS_FAULTS kill and stall rules, as this rank begins call #seq. */
static void call_faults(chorus_comm_t *c, int coll, uint64_t seq) {
  double s = 0;
  char why[96];
  switch (fault_plan_on_call(c->faults, c->rank, coll_kind_str(coll), seq, &s)) {
  case FAULT_CALL_KILL:
    snprintf(why, sizeof(why), "#%llu %s", (unsigned long long)seq, coll_kind_str(coll));
    comm_fault_kill(c, why);
    break;
  case FAULT_CALL_STALL:
    snprintf(why, sizeof(why), "injected at #%llu %s by CHORUS_FAULTS", (unsigned long long)seq,
             coll_kind_str(coll));
    comm_stall(c, s, why);
    break;
  default:
    break;
  }
}

/*
 * Staging. Over shm a message from a buffer peers can map (chorus_mem_alloc)
 * is read where it lies: copied out of it, or reduced straight from it
 * (PROV_OP_BORROW); from any other buffer the receiver copies it through
 * the kernel (CMA: a system call, page pinning, then the copy). When a
 * host's ranks outnumber its cores, an allgather's own block, or a
 * broadcast root's data, from plain memory past the bounce slots
 * (CHORUS_SHM_BOUNCE) is copied into the communicator's own mappable
 * buffer, of up to CHORUS_SHM_STAGE bytes, and sent from there; peers copy
 * it where it lies straight into their own buffers, which the plan fills as
 * usual. Allgathers then take the direct algorithm (every peer reads every
 * block from its owner: select.c, cost_allgather), not one that forwards
 * what it received out of plain memory; broadcasts go flat (every receiver
 * reads the root's buffer: select.c, bcast_pulled).
 * With ranks on cores of their own, only an allgather's own block of
 * STAGE_ALONE_BLOCK_MIN or more is staged (its plan unchanged).
 * The buffer serves one live request at a time; another call meanwhile
 * runs on its own buffers, as does every call when a region can not be
 * made. Staged or not is each rank's own choice: it changes where the data
 * lies, not the schedule.
 *
 * Tried and left: an allgather in place in the buffer, copied out whole
 * (slower than sending from it); a broadcast staged at every rank (slower
 * than unstaged); an allreduce run in place in the buffer, and staging with
 * ranks on cores of their own from smaller sizes (an allgather's blocks
 * from 128 KiB, a broadcast from 8 MiB): each lost on some machine where it
 * applied (docs/performance.md).
 */
size_t coll_call_chunk(const chorus_comm_t *c, int coll, size_t block) {
  if (coll == COLL_BCAST)
    return c->bcast_chunk_bytes;
  if (coll != COLL_ALLGATHER)
    return c->chunk_bytes;
  size_t n = c->allgather_chunks, grown = 0;
  if (n) /* an nth of the block, rounded up to whole lines */
    grown = ((block + n - 1) / n + 63) / 64 * 64;
  return grown > c->allgather_chunk_bytes ? grown : c->allgather_chunk_bytes;
}

/* With ranks on cores of their own, an allgather's own block is staged from
 * this size: each rank copies its block in while the peer does the same,
 * and past half the last-level cache the kernel's copy (CMA, every page
 * pinned) falls further behind a user copy that streams (MEMCOPY_STREAM)
 * than the copy in costs. Smaller blocks lost by it. */
#define STAGE_ALONE_BLOCK_MIN ((size_t)16 << 20)

/* Whether k runs staged, and the buffer it takes (*need bytes, allocated). */
static bool stage_plan(chorus_comm_t *c, const coll_call_t *k, const coll_role_t *ro,
                       size_t *need) {
  if (k->multi || !k->count || c->stage_busy || !c->stage_shm || !c->set.shm_stage)
    return false;
  if (k->coll != COLL_ALLGATHER && !(k->coll == COLL_BCAST && c->rank == k->root))
    return false;
  if (c->per_core <= 1 && !(k->coll == COLL_ALLGATHER && ro->send_bytes >= STAGE_ALONE_BLOCK_MIN))
    return false;
  const size_t bytes = ro->recv_bytes, bounce = c->shm_bounce, max = c->set.shm_stage;
  /* what is sent from the buffer: the own block, or the root's data */
  *need = k->coll == COLL_ALLGATHER ? ro->send_bytes : bytes;
  memreg_info_t mi;
  if (*need > max || (bounce != PROV_BOUNCE_NONE && bytes <= bounce) ||
      memreg_lookup(k->recvbuf, bytes, &mi) ||
      (ro->send_used && memreg_lookup(k->sendbuf, ro->send_bytes, &mi)))
    return false;
  if (c->stage_bytes < *need) {
    size_t want = (size_t)1 << 20;
    while (want < *need)
      want <<= 1;
    if (want > max)
      want = *need;
    void *p;
    if (memreg_alloc(&p, want))
      return false;
    if (c->stage)
      memreg_free(c->stage);
    c->stage = p;
    c->stage_bytes = want;
  }
  return true;
}

/* Runs r staged: this rank's data in (and an allgather's own block into
 * recvbuf as well, where its plan was built own_placed), sent from the
 * buffer; the plan fills recvbuf. */
static void stage_begin(chorus_comm_t *c, const coll_call_t *k, size_t need, bool own_placed,
                        chorus_request_t *r) {
  unsigned char *st = c->stage;
  r->staged = true;
  c->stage_busy = true;
  if (own_placed)
    memcopy_twice(st, (unsigned char *)k->recvbuf + (size_t)c->rank * need, k->sendbuf, need);
  else
    memcopy(st, k->sendbuf, need);
  r->sendbuf = st;
  r->recvbuf = k->recvbuf;
}

/* Whether k's sends bounce whatever their memory (PROV_OP_BOUNCE): a call
 * of up to the bounce size among ranks that outnumber the cores, whose
 * plain memory is bounced and not staged. From a buffer peers map, such a
 * message read in place holds its sender until the receiver is scheduled.
 * Larger calls are read in place, staged or not (bouncing their small
 * messages too was slower). */
static bool bounce_call(const chorus_comm_t *c, const coll_call_t *k, const coll_role_t *ro) {
  const size_t bounce = c->shm_bounce;
  const size_t bytes = ro->send_bytes > ro->recv_bytes ? ro->send_bytes : ro->recv_bytes;
  return !k->multi && c->per_core > 1 && bounce != PROV_BOUNCE_NONE && bytes <= bounce;
}

static chorus_result coll_prepare(chorus_comm_t *c, const coll_call_t *k, chorus_request_t **out,
                                  bool handle) {
  const bool multi = k->multi;
  coll_role_t ro = {0};
  coll_shape_t sh = {.nmulti = 0};
  bool inplace = false;
  size_t count = k->count, ext[2] = {0, 0};
  chorus_result ret;
  char why[256] = "";

  *out = NULL;
  if (multi)
    ret = multi_validate(c, k, &count);
  else
    ret = coll_validate(c, k, &ro, &inplace);
  if (ret)
    return ret;
  size_t stage_need = 0;
  const bool staged = !multi && stage_plan(c, k, &ro, &stage_need);
  if (staged)
    inplace = false;
  const size_t chunk = coll_call_chunk(c, k->coll, count * chorus_dtype_size(k->dtype));
  sh.a = (algo_args_t){.coll = k->coll,
                       .rank = c->rank,
                       .nranks = c->size,
                       .root = coll_rooted(k->coll) ? k->root : 0,
                       .count = count,
                       .dtype = k->dtype,
                       .op = coll_reduces(k->coll) ? k->op : CHORUS_SUM,
                       .inplace = multi || inplace,
                       /* staging copies the own block into place too */
                       .own_placed = staged && k->coll == COLL_ALLGATHER,
                       .chunk_bytes = chunk,
                       .topo = c->topo};
  const algo_desc_t *d = sel_memo_find(c, &sh.a);
  if (!d) {
    d = select_algo(&c->sel, &sh.a, eng_log_level >= ENG_DEBUG ? why : NULL, sizeof(why));
    if (d) {
      sel_memo_put(c, &sh.a, d);
      eng_log(ENG_DEBUG, c->rank, "coll", "%s: %s (%s)", k->fn, d->name, why);
    }
  }
  if (!d) {
    if (!why[0])
      select_algo(&c->sel, &sh.a, why, sizeof(why));
    return comm_error(c, CHORUS_ERR_UNSUPPORTED, "%s: no algorithm can run it (%s)", k->fn, why);
  }
  if (c->last_algo_d != d) {
    snprintf(c->last_algo, sizeof(c->last_algo), "%s", d->name);
    c->last_algo_d = d;
  }
  /* nothing to move: an empty plan, whatever the algorithm (a barrier
   * always synchronises) */
  sh.d = count == 0 && k->coll != COLL_BARRIER ? NULL : d;
  if (!sh.d)
    sh.a.inplace = false;
  if (multi && sh.d) {
    sh.mcounts = k->counts;
    sh.nmulti = k->nbufs;
  }

  chorus_request_t *r = c->spare_req;
  if (r) {
    c->spare_req = NULL;
    memset(r, 0, sizeof(*r));
  } else if (!(r = calloc(1, sizeof(*r)))) {
    return comm_error(c, CHORUS_ERR_NO_MEMORY, "%s: out of memory", k->fn);
  }
  if ((ret = plan_get(c, k, &sh, &ro, &r->slot, &r->plan, ext))) {
    free(r);
    return ret;
  }
  r->comm = c;
  r->coll = (uint8_t)k->coll;
  r->sendbuf = k->sendbuf;
  r->recvbuf = k->recvbuf;
  /* a buffer this rank ignores is never touched: the plan gets our own */
  size_t tsend = !ro.send_used ? ext[0] : 0, trecv = !ro.recv_used ? ext[1] : 0;
  if (tsend || trecv) {
    r->tmp = malloc(align64(tsend) + trecv);
    if (!r->tmp)
      goto out_nomem;
    if (tsend)
      r->sendbuf = r->tmp;
    if (trecv)
      r->recvbuf = (uint8_t *)r->tmp + align64(tsend);
  }
  if (sh.nmulti) {
    r->xbufs = malloc(2 * (size_t)k->nbufs * sizeof(*r->xbufs));
    if (!r->xbufs)
      goto out_nomem;
    for (int i = 0; i < k->nbufs; i++) {
      r->xbufs[2 * i] = (void *)(uintptr_t)k->sendbufs[i];
      r->xbufs[2 * i + 1] = k->recvbufs[i];
    }
  }
  if (handle && eng_handle_add(r, ENG_HANDLE_REQUEST))
    goto out_nomem;
  r->handle = handle;
  /* nothing can fail from here: the sequence numbers are taken */
  if (staged && sh.d)
    stage_begin(c, k, stage_need, sh.a.own_placed, r);
  r->count = count;
  r->bounce = bounce_call(c, k, &ro);
  if (coll_p2p(k->coll)) {
    r->seq = c->p2p_seq[2 * k->root + (k->coll == COLL_RECV)]++;
    r->peer = k->root;
    r->msg_or = EXEC_MSG_P2P;
    if (c->set.trace)
      r->fp = fp_make(FP_KIND_P2P, k->dtype, count, -1, CHORUS_SUM, NULL);
  } else {
    r->call_seq = ++c->seq;
    r->seq = (uint16_t)r->call_seq;
    if (c->set.trace) {
      int root = coll_rooted(k->coll) ? k->root : -1;
      chorus_op op = coll_reduces(k->coll) ? k->op : CHORUS_SUM;
      r->fp = fp_make(k->coll, k->dtype, count, root, op, d);
      ckpt_call_t call = {.seq = r->call_seq,
                          .fp = r->fp,
                          .count = count,
                          .root = root,
                          .kind = (uint8_t)k->coll,
                          .dtype = (uint8_t)k->dtype,
                          .op = (uint8_t)op,
                          .begin_ns = fsm_now_ns()};
      /* not snprintf: this runs on every call, and formatting cost more
       * than the rest of the checkpoint */
      size_t l = strnlen(d->name, sizeof(call.algo) - 1);
      memcpy(call.algo, d->name, l);
      call.algo[l] = '\0';
      ckpt_begin(&c->ckpt, &call);
    }
    if (c->faults)
      call_faults(c, k->coll, r->call_seq);
  }
  r->next_live = c->live;
  if (c->live)
    c->live->prev_live = r;
  c->live = r;
  *out = r;
  return CHORUS_SUCCESS;

out_nomem:
  if (r->slot)
    r->slot->refs--;
  else
    plan_free(r->plan);
  free(r->tmp);
  free(r->xbufs);
  free(r);
  return comm_error(c, CHORUS_ERR_NO_MEMORY, "%s: out of memory", k->fn);
}

/* Starting. A nonblocking call waited for at once (torch's synchronous
 * calls: the backend must post, then wait) cost more than the blocking
 * call: its first round left the transport armed for the sleeping progress
 * thread, so the peer rang its doorbell, the thread woke, found the caller
 * driving and stepped aside again. A small call's caller now drives it for
 * up to START_DRIVE_NS before it returns: waited for at once, or with its
 * peers already there, it is complete by then; else the progress thread
 * takes it on as before. Larger calls keep to one round, so that they
 * overlap the caller's work from the start (DDP's buckets), and so do
 * ranks crowding the cores, where a caller's drive holds up the peers it
 * waits for, and point-to-point calls (a receive is mostly posted before
 * its send leaves: driving it would only spin). Measurements: the commit
 * that set these. */
#define START_DRIVE_NS (20 * 1000)
#define START_DRIVE_MAX_BYTES (64u << 10)
#define START_DRIVE_RANKS_PER_CORE 2

/* How long the caller of nonblocking call r drives it as it starts. */
static uint64_t start_drive_ns(const chorus_comm_t *c, const coll_call_t *k,
                               const chorus_request_t *r) {
  if (k->coll == COLL_SEND || k->coll == COLL_RECV ||
      r->count * chorus_dtype_size(k->dtype) > START_DRIVE_MAX_BYTES)
    return 0;
  return c->start_drive_ns;
}

static chorus_result coll_issue(chorus_comm_t *comm, const coll_call_t *k, chorus_request_t **req,
                                bool blocking) {
  chorus_request_t *r;
  chorus_result ret;

  if (req)
    *req = NULL;
  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return group_note(eng_error(CHORUS_ERR_INVALID_COMM,
                                "%s: not a live communicator (NULL or destroyed)", k->fn));
  if (!blocking && !req)
    return group_note(comm_error(comm, CHORUS_ERR_INVALID_ARG, "%s: req is NULL", k->fn));
  chorus_result failed = (chorus_result)atomic_load(&comm->async_rc);
  if (failed) {
    char text[sizeof(comm->async_text)];
    pthread_mutex_lock(&comm->lock);
    memcpy(text, comm->async_text, sizeof(text));
    pthread_mutex_unlock(&comm->lock);
    return group_note(
        comm_error(comm, failed, "%s: the communicator failed earlier: %s", k->fn, text));
  }
  if (tl_group.depth && group_reserve())
    return group_note(comm_error(comm, CHORUS_ERR_NO_MEMORY, "%s: out of memory", k->fn));
  /* a blocking call's request never reaches its caller: no handle */
  if ((ret = coll_prepare(comm, k, &r, !blocking || tl_group.depth)))
    return group_note(ret);
  if (tl_group.depth) {
    r->grouped = blocking;
    tl_group.q[tl_group.n++] = r;
    if (req)
      *req = r;
    return CHORUS_SUCCESS;
  }
  /* a blocking call drives it itself (comm_drive): no wake-up; a small
   * nonblocking one is driven a while by its caller first ("Starting") */
  comm_submit(comm, r, !blocking, blocking ? 0 : start_drive_ns(comm, k, r));
  if (!blocking) {
    *req = r;
    return CHORUS_SUCCESS;
  }
  request_wait_done(r);
  ret = r->result;
  request_release(r);
  return ret;
}

/* Blocking and nonblocking forms of one call. */
static chorus_result coll_run(chorus_comm_t *comm, coll_call_t k) {
  return coll_issue(comm, &k, NULL, true);
}

static chorus_result coll_irun(chorus_comm_t *comm, coll_call_t k, chorus_request_t **req) {
  return coll_issue(comm, &k, req, false);
}

#define CALL(kind, name, ...) ((coll_call_t){.coll = (kind), .fn = (name), __VA_ARGS__})

/* ---- the entry points ---- */

CHORUS_API chorus_result chorus_allreduce(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, chorus_dtype dtype, chorus_op op) {
  return coll_run(comm, CALL(COLL_ALLREDUCE, "chorus_allreduce", .sendbuf = sendbuf,
                             .recvbuf = recvbuf, .count = count, .dtype = dtype, .op = op));
}

CHORUS_API chorus_result chorus_iallreduce(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                           size_t count, chorus_dtype dtype, chorus_op op,
                                           chorus_request_t **req) {
  return coll_irun(comm,
                   CALL(COLL_ALLREDUCE, "chorus_iallreduce", .sendbuf = sendbuf, .recvbuf = recvbuf,
                        .count = count, .dtype = dtype, .op = op),
                   req);
}

CHORUS_API chorus_result chorus_bcast(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                      size_t count, chorus_dtype dtype, int root) {
  return coll_run(comm, CALL(COLL_BCAST, "chorus_bcast", .sendbuf = sendbuf, .recvbuf = recvbuf,
                             .count = count, .dtype = dtype, .root = root));
}

CHORUS_API chorus_result chorus_ibcast(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                       size_t count, chorus_dtype dtype, int root,
                                       chorus_request_t **req) {
  return coll_irun(comm,
                   CALL(COLL_BCAST, "chorus_ibcast", .sendbuf = sendbuf, .recvbuf = recvbuf,
                        .count = count, .dtype = dtype, .root = root),
                   req);
}

CHORUS_API chorus_result chorus_reduce(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                       size_t count, chorus_dtype dtype, chorus_op op, int root) {
  return coll_run(comm, CALL(COLL_REDUCE, "chorus_reduce", .sendbuf = sendbuf, .recvbuf = recvbuf,
                             .count = count, .dtype = dtype, .op = op, .root = root));
}

CHORUS_API chorus_result chorus_ireduce(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                        size_t count, chorus_dtype dtype, chorus_op op, int root,
                                        chorus_request_t **req) {
  return coll_irun(comm,
                   CALL(COLL_REDUCE, "chorus_ireduce", .sendbuf = sendbuf, .recvbuf = recvbuf,
                        .count = count, .dtype = dtype, .op = op, .root = root),
                   req);
}

CHORUS_API chorus_result chorus_allgather(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, chorus_dtype dtype) {
  return coll_run(comm, CALL(COLL_ALLGATHER, "chorus_allgather", .sendbuf = sendbuf,
                             .recvbuf = recvbuf, .count = count, .dtype = dtype));
}

CHORUS_API chorus_result chorus_iallgather(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                           size_t count, chorus_dtype dtype,
                                           chorus_request_t **req) {
  return coll_irun(comm,
                   CALL(COLL_ALLGATHER, "chorus_iallgather", .sendbuf = sendbuf, .recvbuf = recvbuf,
                        .count = count, .dtype = dtype),
                   req);
}

CHORUS_API chorus_result chorus_reduce_scatter(chorus_comm_t *comm, const void *sendbuf,
                                               void *recvbuf, size_t count, chorus_dtype dtype,
                                               chorus_op op) {
  return coll_run(comm, CALL(COLL_REDUCE_SCATTER, "chorus_reduce_scatter", .sendbuf = sendbuf,
                             .recvbuf = recvbuf, .count = count, .dtype = dtype, .op = op));
}

CHORUS_API chorus_result chorus_ireduce_scatter(chorus_comm_t *comm, const void *sendbuf,
                                                void *recvbuf, size_t count, chorus_dtype dtype,
                                                chorus_op op, chorus_request_t **req) {
  return coll_irun(comm,
                   CALL(COLL_REDUCE_SCATTER, "chorus_ireduce_scatter", .sendbuf = sendbuf,
                        .recvbuf = recvbuf, .count = count, .dtype = dtype, .op = op),
                   req);
}

CHORUS_API chorus_result chorus_alltoall(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                         size_t count, chorus_dtype dtype) {
  return coll_run(comm, CALL(COLL_ALLTOALL, "chorus_alltoall", .sendbuf = sendbuf,
                             .recvbuf = recvbuf, .count = count, .dtype = dtype));
}

CHORUS_API chorus_result chorus_ialltoall(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, chorus_dtype dtype,
                                          chorus_request_t **req) {
  return coll_irun(comm,
                   CALL(COLL_ALLTOALL, "chorus_ialltoall", .sendbuf = sendbuf, .recvbuf = recvbuf,
                        .count = count, .dtype = dtype),
                   req);
}

CHORUS_API chorus_result chorus_gather(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                       size_t count, chorus_dtype dtype, int root) {
  return coll_run(comm, CALL(COLL_GATHER, "chorus_gather", .sendbuf = sendbuf, .recvbuf = recvbuf,
                             .count = count, .dtype = dtype, .root = root));
}

CHORUS_API chorus_result chorus_igather(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                        size_t count, chorus_dtype dtype, int root,
                                        chorus_request_t **req) {
  return coll_irun(comm,
                   CALL(COLL_GATHER, "chorus_igather", .sendbuf = sendbuf, .recvbuf = recvbuf,
                        .count = count, .dtype = dtype, .root = root),
                   req);
}

CHORUS_API chorus_result chorus_scatter(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                        size_t count, chorus_dtype dtype, int root) {
  return coll_run(comm, CALL(COLL_SCATTER, "chorus_scatter", .sendbuf = sendbuf, .recvbuf = recvbuf,
                             .count = count, .dtype = dtype, .root = root));
}

CHORUS_API chorus_result chorus_iscatter(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                         size_t count, chorus_dtype dtype, int root,
                                         chorus_request_t **req) {
  return coll_irun(comm,
                   CALL(COLL_SCATTER, "chorus_iscatter", .sendbuf = sendbuf, .recvbuf = recvbuf,
                        .count = count, .dtype = dtype, .root = root),
                   req);
}

CHORUS_API chorus_result chorus_barrier(chorus_comm_t *comm) {
  return coll_run(comm, CALL(COLL_BARRIER, "chorus_barrier", .dtype = CHORUS_UINT8));
}

CHORUS_API chorus_result chorus_ibarrier(chorus_comm_t *comm, chorus_request_t **req) {
  return coll_irun(comm, CALL(COLL_BARRIER, "chorus_ibarrier", .dtype = CHORUS_UINT8), req);
}

CHORUS_API chorus_result chorus_send(chorus_comm_t *comm, const void *buf, size_t count,
                                     chorus_dtype dtype, int peer) {
  return coll_run(comm, CALL(COLL_SEND, "chorus_send", .sendbuf = buf, .count = count,
                             .dtype = dtype, .root = peer));
}

CHORUS_API chorus_result chorus_isend(chorus_comm_t *comm, const void *buf, size_t count,
                                      chorus_dtype dtype, int peer, chorus_request_t **req) {
  return coll_irun(
      comm,
      CALL(COLL_SEND, "chorus_isend", .sendbuf = buf, .count = count, .dtype = dtype, .root = peer),
      req);
}

CHORUS_API chorus_result chorus_recv(chorus_comm_t *comm, void *buf, size_t count,
                                     chorus_dtype dtype, int peer) {
  return coll_run(comm, CALL(COLL_RECV, "chorus_recv", .recvbuf = buf, .count = count,
                             .dtype = dtype, .root = peer));
}

CHORUS_API chorus_result chorus_irecv(chorus_comm_t *comm, void *buf, size_t count,
                                      chorus_dtype dtype, int peer, chorus_request_t **req) {
  return coll_irun(
      comm,
      CALL(COLL_RECV, "chorus_irecv", .recvbuf = buf, .count = count, .dtype = dtype, .root = peer),
      req);
}

CHORUS_API chorus_result chorus_allreduce_multi(chorus_comm_t *comm, const void *const *sendbufs,
                                                void *const *recvbufs, const size_t *counts,
                                                int nbufs, chorus_dtype dtype, chorus_op op) {
  coll_call_t k = {.coll = COLL_ALLREDUCE,
                   .fn = "chorus_allreduce_multi",
                   .multi = true,
                   .sendbufs = sendbufs,
                   .recvbufs = recvbufs,
                   .counts = counts,
                   .nbufs = nbufs,
                   .dtype = dtype,
                   .op = op};
  return coll_issue(comm, &k, NULL, true);
}

CHORUS_API chorus_result chorus_iallreduce_multi(chorus_comm_t *comm, const void *const *sendbufs,
                                                 void *const *recvbufs, const size_t *counts,
                                                 int nbufs, chorus_dtype dtype, chorus_op op,
                                                 chorus_request_t **req) {
  coll_call_t k = {.coll = COLL_ALLREDUCE,
                   .fn = "chorus_iallreduce_multi",
                   .multi = true,
                   .sendbufs = sendbufs,
                   .recvbufs = recvbufs,
                   .counts = counts,
                   .nbufs = nbufs,
                   .dtype = dtype,
                   .op = op};
  return coll_issue(comm, &k, req, false);
}

CHORUS_API const char *chorus_comm_last_algorithm(const chorus_comm_t *comm) {
  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return "";
  return comm->last_algo;
}

/* ---- communicator state ---- */

/* Ranks that share this rank's machine: by the bootstrap's host identity,
 * else (split children, in-process jobs) by the topology. *index (may be
 * NULL) receives this rank's place among them, in rank order. */
static int ranks_here(const chorus_comm_t *c, int *index) {
  int n = 0, k = 0;
  if (c->boot) {
    const char *me = boot_host_of(c->boot, c->rank);
    for (int r = 0; r < c->size; r++) {
      const char *h = boot_host_of(c->boot, r);
      bool same = h && me && strcmp(h, me) == 0;
      n += same;
      k += same && r < c->rank;
    }
    n = n ? n : 1;
  } else if (c->topo) {
    n = topo_host_size(c->topo, c->topo->host_of[c->rank]);
    for (int r = 0; r < c->rank; r++)
      k += c->topo->host_of[r] == c->topo->host_of[c->rank];
  } else {
    n = c->size;
    k = c->rank;
  }
  if (index)
    *index = k;
  return n;
}

int coll_ranks_per_core(const chorus_comm_t *c) {
  cpu_set_t set;
  long cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
  if (cores <= 0)
    cores = sysconf(_SC_NPROCESSORS_ONLN);
  int here = ranks_here(c, NULL);
  return cores <= 0 || here <= cores ? 1 : (int)((here + cores - 1) / cores);
}

/* Bouncing costs a second copy, and a rewrite of memory the receiver has
 * just read, to save CMA's page pinning: a gain for small messages, where
 * pinning dominates. The default stops at 64 KiB: larger slots won only
 * while the cores shared data cheaply and lost by far otherwise. Past two
 * ranks a core, where two copies cost more than one, it never passes
 * 64 KiB; at two a core one cache holds both copies and larger slots pay.
 * A lower limit is faster with two ranks on cores of their own (a bounced
 * line crosses between the cores twice) but slower when the kernel keeps
 * both on one core, where one cache beats CMA's system calls.
 * Measurements: docs/performance.md and the commits that set these. */
#define SHM_BOUNCE_SHARED (64u << 10)
#define SHM_BOUNCE_SHARED_PER_CORE 2
static size_t shm_bounce_for(const chorus_comm_t *c, int per_core) {
  size_t b = c->set.shm_bounce;
  if (b > SHM_BOUNCE_SHARED && per_core > SHM_BOUNCE_SHARED_PER_CORE)
    b = SHM_BOUNCE_SHARED;
  return b ? b : PROV_BOUNCE_NONE;
}

size_t comm_shm_bounce(const chorus_comm_t *c) {
  return shm_bounce_for(c, coll_ranks_per_core(c));
}

/* This rank's own CPU (comm.h: COMM_HOME_EVERY_NS): local rank i takes the
 * i-th CPU of the creating thread's affinity mask, when the host's ranks fit
 * in it; -1 when they do not (they take turns anyway), for a one-CPU mask (a
 * launcher or the application placed the rank) and with
 * CHORUS_SPREAD_CORES=0. */
static int home_cpu(const chorus_comm_t *c) {
  cpu_set_t set;
  if (!c->set.spread_cores || sched_getaffinity(0, sizeof(set), &set) != 0)
    return -1;
  int k, cores = CPU_COUNT(&set), here = ranks_here(c, &k);
  if (cores < 2 || here < 2 || here > cores)
    return -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
    if (CPU_ISSET(cpu, &set) && k-- == 0)
      return cpu;
  return -1;
}

/* Ranks outnumbering the cores take turns (select_share_cores: the model's
 * side). The default chunk grows by the ranks a core: a pipeline can not
 * overlap more stages than there are cores, while every chunk costs a
 * turn. A chunk size the user set is kept. */
#define SEL_DEFAULT_CHUNK (256 * 1024) /* CHORUS_CHUNK_BYTES's default (settings.c) */
/* Over a network provider, every chunk is a message of its own, and past
 * rxm's eager size a rendezvous with its round trips. A chunk of a
 * reduction pays for itself, overlapping the reduction with the next
 * transfer; a chunk of a broadcast overlaps nothing on two ranks and little
 * more on a few: bcast takes chunks of SEL_NET_BCAST_CHUNK. Not allgather,
 * whose messages cross in both directions. Over sock a rendezvous is
 * cheaper and a broadcast takes sock's chunk below. */
#define SEL_NET_BCAST_CHUNK (4u << 20)
/* So do broadcasts among ranks that outnumber the cores: a chunk overlaps
 * nothing while every core is busy, and each costs a turn. */
/* Over sock the other collectives take 512 KiB chunks: a rendezvous (RTS,
 * CTS) per chunk costs a round trip there too (larger chunks lost at 2 MiB,
 * and a 64 MiB allreduce lost a little at 512 KiB). */
#define SEL_SOCK_CHUNK (512u << 10)
/* ... and an allgather's chunks grow with its block past 8 of them, so that
 * no block takes more than SEL_SOCK_AG_CHUNKS rendezvous (a block in one
 * message lost to two at 2 MiB). */
#define SEL_SOCK_AG_CHUNKS 8
static void sel_fit_cores(chorus_comm_t *c, select_ctx_t *s, int per_core) {
  const bool dflt = c->set.chunk_bytes == SEL_DEFAULT_CHUNK; /* else kept as set */
  const bool net = comm_intra_network(c);
  const bool sock = comm_all_sock(c);
  const size_t bounce = c->shm_bounce;
  /* ranks of one host that talk over tcp (say) pay its costs, not shm's:
   * at 2 ranks, a small allreduce by recursive doubling (one exchange of
   * the whole vector) then beats the ring (two of half of it) */
  if (net) {
    select_over_network(s);
  } else {
    /* over shm a message past the bounce slots is copied by its receiver */
    s->pull_min = bounce == PROV_BOUNCE_NONE ? 1 : (double)bounce + 1;
  }
  select_share_cores(s, per_core);
  if (c->set.shm_stage && per_core > 1 && comm_shm_only(c)) {
    s->stage_min = bounce == PROV_BOUNCE_NONE ? 0 : (double)bounce;
    s->stage_block = (double)c->set.shm_stage;
  }
  c->chunk_bytes = dflt ? SEL_DEFAULT_CHUNK * (size_t)per_core : c->set.chunk_bytes;
  if (dflt && c->chunk_bytes < SEL_SOCK_CHUNK && sock)
    c->chunk_bytes = SEL_SOCK_CHUNK;
  const bool grow = dflt && c->chunk_bytes < SEL_NET_BCAST_CHUNK;
  c->bcast_chunk_bytes =
      grow && ((net && !sock) || per_core > 1) ? SEL_NET_BCAST_CHUNK : c->chunk_bytes;
  /* An allgather among ranks that outnumber the cores likewise. Below 8
   * MiB a block is one chunk either way. */
  c->allgather_chunk_bytes = grow && per_core > 1 ? SEL_NET_BCAST_CHUNK : c->chunk_bytes;
  c->allgather_chunks = dflt && sock ? SEL_SOCK_AG_CHUNKS : 0;
  /* Two ranks over shm: a broadcast or an allgather forwards nothing, and
   * each chunk is one more rendezvous (descriptor, CMA copy, ack).
   * Reductions alike: between two ranks the receiver pulls every chunk and
   * reduces it itself, so chunks overlap nothing either. */
  if (dflt && !net && c->size == 2 && c->chunk_bytes < SEL_NET_BCAST_CHUNK)
    c->chunk_bytes = c->bcast_chunk_bytes = c->allgather_chunk_bytes = SEL_NET_BCAST_CHUNK;
}

chorus_result coll_comm_init(chorus_comm_t *c) {
  char err[512];

  if (select_init(&c->sel, c->set.algo, c->set.deterministic, err, sizeof(err)))
    return comm_error(c, CHORUS_ERR_ENV, "CHORUS_ALGO=\"%s\": %s", c->set.algo, err);
  /* the machine's shape, once: its system call stays off the calls' path */
  const int per_core = c->per_core = coll_ranks_per_core(c);
  c->shm_bounce = shm_bounce_for(c, per_core);
  sel_fit_cores(c, &c->sel, per_core);
  c->yield_after_ns = per_core > 1 ? 0 : COMM_YIELD_AFTER_NS;
  c->start_drive_ns = per_core > START_DRIVE_RANKS_PER_CORE ? 0 : START_DRIVE_NS;
  c->stage_shm = comm_shm_only(c);
  if (c->home_cpu == COMM_HOME_UNSET) /* else a split or shrink's parent's */
    c->home_cpu = home_cpu(c);
  c->sel_ready = true;
  c->last_algo[0] = '\0';
  c->p2p_seq = calloc(2 * (size_t)c->size, sizeof(*c->p2p_seq));
  if (!c->p2p_seq)
    return comm_error(c, CHORUS_ERR_NO_MEMORY, "out of memory");
  return CHORUS_SUCCESS;
}

void coll_comm_fini(chorus_comm_t *c) {
  while (c->live) {
    chorus_request_t *r = c->live;
    c->live = r->next_live;
    eng_handle_remove(r);
    if (!r->slot)
      plan_free(r->plan);
    free(r->xbufs);
    free(r->park_why);
    free(r->tmp);
    free(r);
  }
  free(c->spare_req);
  c->spare_req = NULL;
  if (c->stage)
    memreg_free(c->stage);
  c->stage = NULL;
  c->stage_bytes = 0;
  c->stage_busy = false;
  for (int i = 0; i < COMM_PLAN_CACHE; i++) {
    plan_free(c->plans[i].plan);
    free(c->plans[i].mcounts);
    c->plans[i].plan = NULL;
    c->plans[i].mcounts = NULL;
  }
  if (c->sel_ready)
    select_fini(&c->sel);
  c->sel_ready = false;
  free(c->p2p_seq);
  c->p2p_seq = NULL;
}

chorus_result eng_comm_set_algo(chorus_comm_t *c, const char *spec) {
  select_ctx_t s;
  char err[512];

  if (!eng_handle_valid(c, ENG_HANDLE_COMM))
    return eng_error(CHORUS_ERR_INVALID_COMM, "eng_comm_set_algo: not a live communicator");
  if (select_init(&s, spec, c->set.deterministic, err, sizeof(err)))
    return comm_error(c, CHORUS_ERR_ENV, "eng_comm_set_algo(\"%s\"): %s", spec ? spec : "", err);
  sel_fit_cores(c, &s, c->per_core); /* the shape coll_comm_init found */
  if (c->sel_ready)
    select_fini(&c->sel);
  c->sel = s;
  c->sel_ready = true;
  memset(c->sel_memo, 0, sizeof(c->sel_memo)); /* new rules: choose again */
  return CHORUS_SUCCESS;
}
