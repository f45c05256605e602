/*
 * exec.c - the executor: runs a plan's steps as state machines.
 *
 * Ownership and ordering hazards:
 *  - A RECV or SEND step owns its prov_op while POSTED; the provider calls
 *    step_done() from inside prov->progress(), which dispatches the step's
 *    COMPLETE event; successors become READY and are queued, never run
 *    inline, so no dispatch nests into the provider's callback for long.
 *  - A failed run cancels its posted ops and completes only once every
 *    posted op came back (canceled or not): the provider never writes into
 *    a buffer the application already owns again.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "crc32c.h"

#include "eng.h"
#include "exec.h"
#include "memcopy.h"
#include "reduce.h"

enum { S_WAIT, S_READY, S_POSTED, S_DONE, S_FAILED, S_COUNT };
enum { E_DEP, E_POSTED, E_RUN, E_COMPLETE, E_ERROR, E_CANCEL, E_COUNT };

typedef struct exec_step {
  fsm_inst_t fsm;
  prov_op_t op;
  uint32_t deps_left;
  uint32_t index;
  exec_t *ex;
  /* Borrowed receives (PROV_OP_BORROW): a RECV into scratch whose every
   * successor only reads that range and waits for nothing else, or a RECV
   * whose one successor is a reduce that overwrites its range in place
   * (rd's first exchange), may let them read the data where the sender
   * keeps it. */
  bool borrowable;      /* RECV: posted with PROV_OP_BORROW */
  uint32_t borrow_left; /* RECV: consumers still to run before release */
  uint32_t borrow_from; /* consumer: the RECV it reads, or UINT32_MAX */
  uint8_t kind;         /* plan step kind (an orphaned run may not read its plan) */
  int peer;             /* SEND/RECV: plan step peer (likewise) */
  uint64_t since_ns;    /* when it entered its state (ctx->trace only) */
  int err;              /* FAILED by the transport: its errno */
} exec_step_t;

struct exec {
  exec_ctx_t *ctx;
  const plan_t *plan;
  uint8_t *bufs[BUF_COUNT];
  void *const *xbufs; /* extra buffers of a composed plan (exec_set_extra) */
  uint32_t msg_or;    /* or'ed into message numbers (EXEC_MSG_P2P) */
  void *own_scratch;  /* scratch of its own: past CHORUS_BUFFSIZE, or the cached one lent */
  size_t own_bytes;   /* its size (ctx->big takes it back at the end) */
  bool scratch_lent;  /* this run holds ctx->scratch */
  uint16_t seq;
  exec_step_t *steps;
  uint32_t nsteps; /* plan->nsteps, for after the plan may be gone */
  /* Ready local steps (step indices, each queued once), and the pairs
   * (plan.h) whose next step to post is ready: circular, each pair at most
   * once (inq). cur[p]: pair p's next step to post by message number,
   * UINT32_MAX once all are posted. */
  uint32_t *q_local, *q_send, *q_recv, *cur;
  uint8_t *inq;
  uint32_t ql_head, ql_tail, qs_head, qs_n, qr_head, qr_n;
  uint32_t ndone, nfailed;
  uint32_t nposted;      /* ops currently held by the provider */
  int status;            /* first error, 0 while fine */
  bool canceling;        /* exec_cancel() ran after the first error */
  bool orphan;           /* failed, completed for its caller, waits for the transport */
  uint64_t fail_ns;      /* when canceling began */
  uint64_t call_seq, fp; /* exec_set_call */
  uint8_t comm_id;       /* the tags' communicator field: ctx's, or exec_set_comm_id's */
  unsigned send_flags;   /* PROV_OP_* of every send (exec_set_bounce) */
  char *why;             /* the mismatch a receive found (malloc'd), or NULL */
  bool uncertain;        /* a mismatch seen without the sender's fingerprint */
  exec_done_fn done;
  void *arg;
  exec_t *next;
  uint32_t cap; /* steps the block holds (exec_alloc) */
};

static exec_step_t *step_of(fsm_inst_t *i) {
  return (exec_step_t *)i;
}

/* Memory of a reference: one of the three buffers, or an extra one. */
static uint8_t *at(const exec_t *ex, plan_ref_t r) {
  uint8_t *base = r.buf < BUF_COUNT ? ex->bufs[r.buf] : (uint8_t *)ex->xbufs[r.buf - BUF_COUNT];
  return base + r.off;
}

static void notify_successors(exec_step_t *st) {
  exec_t *ex = st->ex;
  const plan_step_t *ps = &ex->plan->steps[st->index];
  fsm_event_t ev = {.sig = E_DEP};

  for (uint32_t k = 0; k < ps->nsucc; k++)
    fsm_dispatch(&ex->steps[ex->plan->succ[ps->succ_off + k]].fsm, &ev);
}

/* Pair p's next step is ready: queue the pair. */
static void queue_pair(exec_t *ex, uint32_t p) {
  const uint32_t cap = ex->plan->npairs;
  ex->inq[p] = 1;
  if (ex->plan->pairs[p].kind == STEP_SEND)
    ex->q_send[(ex->qs_head + ex->qs_n++) % cap] = p;
  else
    ex->q_recv[(ex->qr_head + ex->qr_n++) % cap] = p;
}

static void enqueue_ready(exec_step_t *st) {
  exec_t *ex = st->ex;
  uint32_t p;
  switch (ex->plan->steps[st->index].kind) {
  case STEP_SEND:
  case STEP_RECV:
    /* posted when its pair gets to it: a pair's steps go in message order */
    p = ex->plan->pair_of[st->index];
    if (ex->cur[p] == st->index && !ex->inq[p])
      queue_pair(ex, p);
    break;
  default:
    ex->q_local[ex->ql_tail++] = st->index;
    break;
  }
}

static bool g_last_dep(fsm_inst_t *i, const fsm_event_t *ev) {
  return step_of(i)->deps_left == 1;
}

static void a_dep(fsm_inst_t *i, const fsm_event_t *ev) {
  step_of(i)->deps_left--;
}

static void stamp(exec_step_t *st) {
  if (st->ex->ctx->trace)
    st->since_ns = fsm_stamp_ns();
}

static void a_dep_ready(fsm_inst_t *i, const fsm_event_t *ev) {
  step_of(i)->deps_left--;
  stamp(step_of(i));
  enqueue_ready(step_of(i));
}

static bool same_ref(plan_ref_t a, plan_ref_t b) {
  return a.buf == b.buf && a.off == b.off;
}

/* Where a local step reads `r`: the buffer, or the sender's memory when the
 * receive that filled r was borrowed. */
static const uint8_t *src_ptr(exec_t *ex, const exec_step_t *st, plan_ref_t r) {
  if (st->borrow_from != UINT32_MAX) {
    const exec_step_t *rv = &ex->steps[st->borrow_from];
    if (rv->op.borrowed && same_ref(ex->plan->steps[rv->index].dst, r))
      return rv->op.borrowed;
  }
  return at(ex, r);
}

static void borrow_consumed(exec_t *ex, exec_step_t *st) {
  if (st->borrow_from == UINT32_MAX)
    return;
  exec_step_t *rv = &ex->steps[st->borrow_from];
  if (--rv->borrow_left == 0 && rv->op.borrowed)
    ex->ctx->prov->ops->release(ex->ctx->prov, &rv->op);
}

static void a_run(fsm_inst_t *i, const fsm_event_t *ev) {
  exec_step_t *st = step_of(i);
  exec_t *ex = st->ex;
  const plan_t *p = ex->plan;
  const plan_step_t *ps = &p->steps[st->index];
  size_t es = chorus_dtype_size(p->dtype);

  switch (ps->kind) {
  case STEP_REDUCE:
    reduce_apply(at(ex, ps->dst), src_ptr(ex, st, ps->src), src_ptr(ex, st, ps->src2),
                 ps->bytes / es, p->dtype, p->op);
    borrow_consumed(ex, st);
    break;
  case STEP_COPY:
    memcopy(at(ex, ps->dst), src_ptr(ex, st, ps->src), ps->bytes);
    borrow_consumed(ex, st);
    break;
  case STEP_SCALE:
    reduce_scale_avg(at(ex, ps->dst), ps->bytes / es, p->dtype, p->nranks);
    break;
  default:
    break;
  }
  if (ps->bytes >= 65536)
    fsm_clock_refresh(); /* that took a while */
  ex->ndone++;
  notify_successors(st);
}

static void a_complete(fsm_inst_t *i, const fsm_event_t *ev) {
  exec_step_t *st = step_of(i);
  stamp(st);
  st->ex->ndone++;
  notify_successors(st);
}

static void a_fail(fsm_inst_t *i, const fsm_event_t *ev) {
  exec_t *ex = step_of(i)->ex;
  ex->nfailed++;
  if (!ex->status) {
    ex->status = ev->arg ? (int)ev->arg : CHORUS_ERR_TRANSPORT;
    ex->ctx->requeue = true; /* its pairs no longer hold later runs back */
  }
}

static const fsm_row_t step_rows[] = {
    {S_WAIT, E_DEP, g_last_dep, a_dep_ready, S_READY},
    {S_WAIT, E_DEP, NULL, a_dep, S_WAIT},
    {S_READY, E_POSTED, NULL, NULL, S_POSTED},
    {S_READY, E_RUN, NULL, a_run, S_DONE},
    {S_POSTED, E_COMPLETE, NULL, a_complete, S_DONE},
    {S_POSTED, E_ERROR, NULL, a_fail, S_FAILED},
    {S_POSTED, E_CANCEL, NULL, a_fail, S_FAILED},
    {S_WAIT, E_CANCEL, NULL, a_fail, S_FAILED},
    {S_READY, E_CANCEL, NULL, a_fail, S_FAILED},
    {S_READY, E_ERROR, NULL, a_fail, S_FAILED},
    /* a dependency finishing after this step was canceled is harmless */
    {S_FAILED, E_DEP, NULL, NULL, S_FAILED},
};

static const char *const step_state_names[S_COUNT] = {"WAIT", "READY", "POSTED", "DONE", "FAILED"};
static const char *const step_event_names[E_COUNT] = {"dep",      "posted", "run",
                                                      "complete", "error",  "cancel"};

fsm_machine_t exec_step_machine = {
    .name = "step",
    .nstates = S_COUNT,
    .state_names = step_state_names,
    .nevents = E_COUNT,
    .event_names = step_event_names,
    .rows = step_rows,
    .nrows = sizeof(step_rows) / sizeof(step_rows[0]),
};

/* A received message stamped by another call than ours: the peer's call
 * differs (another collective: diverged; other arguments: mismatch). */
static int fp_mismatch(exec_t *ex, const plan_step_t *ps, uint64_t theirs, size_t len) {
  char mine[96], other[96], buf[512];
  bool diverged = fp_kind(theirs) != fp_kind(ex->fp);

  fp_format(ex->fp, mine, sizeof(mine));
  fp_format(theirs, other, sizeof(other));
  if (ex->call_seq)
    snprintf(buf, sizeof(buf),
             "collective #%llu: rank %d called %s but rank %d called %s (its message of %zu "
             "bytes carries that call's fingerprint)",
             (unsigned long long)ex->call_seq, ex->ctx->rank, mine, ps->peer, other, len);
  else
    snprintf(buf, sizeof(buf),
             "rank %d called %s but rank %d called %s (its message of %zu bytes carries that "
             "call's fingerprint)",
             ex->ctx->rank, mine, ps->peer, other, len);
  if (!ex->why)
    ex->why = strdup(buf);
  eng_log(ENG_ERR, ex->ctx->rank, "exec", "%s", buf);
  return diverged ? CHORUS_ERR_DIVERGED : CHORUS_ERR_MISMATCH;
}

/* CHORUS_CHECKSUM: the immediate data is a 31-bit hash of the fingerprint
 * above the message's CRC-32C. */
static uint64_t fp_hash31(uint64_t fp) {
  fp ^= fp >> 31;
  fp *= 0x9e3779b97f4a7c15ull;
  return (fp >> 33) & 0x7fffffffu;
}

static uint64_t send_data(const exec_t *ex, const void *buf, size_t bytes) {
  if (!ex->ctx->checksum)
    return ex->fp;
  return fp_hash31(ex->fp) << 32 | crc32c(buf, bytes);
}

/* With checksums: 0, or the step's failure (why set). */
static int check_sum(exec_t *ex, exec_step_t *st, const plan_step_t *ps, uint64_t data,
                     size_t len) {
  char buf[320];
  if (!(data & PROV_DATA_VALID))
    return 0;
  data &= ~PROV_DATA_VALID;
  if (ex->fp && (data >> 32) != fp_hash31(ex->fp)) {
    char mine[96];
    fp_format(ex->fp, mine, sizeof(mine));
    snprintf(buf, sizeof(buf),
             "collective #%llu: rank %d called %s but the message of rank %d belongs to "
             "another call (its fingerprint differs; is CHORUS_CHECKSUM set alike on every "
             "rank?)",
             (unsigned long long)ex->call_seq, ex->ctx->rank, mine, ps->peer);
    if (!ex->why)
      ex->why = strdup(buf);
    eng_log(ENG_ERR, ex->ctx->rank, "exec", "%s", buf);
    return CHORUS_ERR_MISMATCH;
  }
  const void *got = st->op.borrowed ? st->op.borrowed : at(ex, ps->dst);
  uint32_t crc = crc32c(got, len);
  if (crc == (uint32_t)data)
    return 0;
  snprintf(buf, sizeof(buf),
           "collective #%llu: the message from rank %d to rank %d (msg %u, %zu bytes) failed "
           "its checksum (CRC-32C %08x, sent as %08x): corrupted on the link from rank %d to "
           "rank %d",
           (unsigned long long)ex->call_seq, ps->peer, ex->ctx->rank, ps->msg, len, crc,
           (uint32_t)data, ps->peer, ex->ctx->rank);
  if (!ex->why)
    ex->why = strdup(buf);
  eng_log(ENG_ERR, ex->ctx->rank, "exec", "%s", buf);
  return CHORUS_ERR_CORRUPT;
}

static void step_done(prov_op_t *op, int status, size_t len) {
  exec_step_t *st = (exec_step_t *)((char *)op - offsetof(exec_step_t, op));
  exec_t *ex = st->ex;
  fsm_event_t ev = {.sig = E_COMPLETE};

  ex->nposted--;
  if (st->kind == STEP_SEND)
    ex->ctx->posted_sends--;
  else
    ex->ctx->posted_recvs--;
  if (ex->ctx->inflight && !(ex->msg_or & EXEC_MSG_P2P))
    ex->ctx->inflight[2 * (size_t)st->peer + (st->kind == STEP_RECV)]--;
  if (ex->orphan) /* its plan may be gone: only the count matters */
    return;
  const plan_step_t *ps = &ex->plan->steps[st->index];
  uint64_t theirs = op->data & ~PROV_DATA_VALID;
  int bad = 0;
  if (ps->kind == STEP_RECV && status == 0 && len == ps->bytes && ex->ctx->checksum &&
      (bad = check_sum(ex, st, ps, op->data, len))) {
    ev.sig = E_ERROR;
    ev.arg = bad;
  } else if (ps->kind == STEP_RECV && !ex->ctx->checksum && ex->fp &&
             (op->data & PROV_DATA_VALID) && theirs && theirs != ex->fp &&
             (status == 0 || status == -EMSGSIZE)) {
    ev.sig = E_ERROR;
    ev.arg = fp_mismatch(ex, ps, theirs, len);
  } else if (status == -EMSGSIZE) {
    ev.sig = E_ERROR;
    ev.arg = CHORUS_ERR_MISMATCH;
    char buf[256];
    snprintf(buf, sizeof(buf),
             "collective #%llu: a message from rank %d is longer than the %zu bytes this rank "
             "expects: that rank's call differs (count, dtype or collective)",
             (unsigned long long)ex->call_seq, ps->peer, ps->bytes);
    if (!ex->why)
      ex->why = strdup(buf);
    ex->uncertain = true;
    eng_log(ENG_ERR, ex->ctx->rank, "exec", "%s", buf);
  } else if (status == -ECANCELED) {
    ev.sig = E_CANCEL;
    ev.arg = ex->status ? ex->status : CHORUS_ERR_ABORTED;
  } else if (status) {
    ev.sig = E_ERROR;
    ev.arg = CHORUS_ERR_TRANSPORT;
    st->err = -status;
    eng_log(ENG_ERR, ex->ctx->rank, "exec", "%s step %u (peer %d, %zu bytes) failed: %s",
            plan_step_kind_str(ps->kind), st->index, ps->peer, ps->bytes, strerror(-status));
  } else if (ps->kind == STEP_RECV && len != ps->bytes) {
    ev.sig = E_ERROR;
    ev.arg = CHORUS_ERR_MISMATCH;
    char buf[256];
    snprintf(buf, sizeof(buf),
             "collective #%llu: rank %d sent %zu bytes where this rank expects %zu: its call "
             "differs (count, dtype or collective)",
             (unsigned long long)ex->call_seq, ps->peer, len, ps->bytes);
    if (!ex->why)
      ex->why = strdup(buf);
    ex->uncertain = !(op->data & PROV_DATA_VALID);
    eng_log(ENG_ERR, ex->ctx->rank, "exec", "%s", buf);
  }
  fsm_dispatch(&st->fsm, &ev);
}

/* Scratch starts on a page: the kernel's copy (CMA) into a destination
 * that is misaligned against a cache-line-aligned source runs three times
 * slower (rep movsb with unaligned stores), and user buffers are usually
 * aligned. Plans keep their slots at multiples of 64 bytes. */
static void *scratch_alloc(size_t bytes) {
  void *p = NULL;
  return posix_memalign(&p, 4096, bytes) ? NULL : p;
}

/* Marks the receives that may be borrowed (see exec_step_t). */
static void find_borrowable(exec_t *ex) {
  const plan_t *p = ex->plan;

  if (!ex->ctx->prov || !ex->ctx->prov->ops->release)
    return;
  for (uint32_t i = 0; i < p->nsteps; i++) {
    const plan_step_t *rv = &p->steps[i];
    const bool scratch = rv->dst.buf == BUF_SCRATCH;
    bool ok = rv->kind == STEP_RECV && rv->nsucc > 0;
    for (uint32_t k = 0; ok && k < rv->nsucc; k++) {
      const plan_step_t *c = &p->steps[p->succ[rv->succ_off + k]];
      ok = (c->kind == STEP_REDUCE || c->kind == STEP_COPY) && c->ndeps == 1 &&
           c->bytes == rv->bytes &&
           (same_ref(c->src, rv->dst) || (c->kind == STEP_REDUCE && same_ref(c->src2, rv->dst)));
      /* into scratch: consumers only read it; elsewhere: one reduce that
       * overwrites the range in place, leaving there what it would anyway */
      ok = ok && (scratch ? !same_ref(c->dst, rv->dst)
                          : rv->nsucc == 1 && c->kind == STEP_REDUCE && same_ref(c->dst, rv->dst));
    }
    if (!ok)
      continue;
    ex->steps[i].borrowable = true;
    ex->steps[i].borrow_left = rv->nsucc;
    for (uint32_t k = 0; k < rv->nsucc; k++)
      ex->steps[p->succ[rv->succ_off + k]].borrow_from = i;
  }
}

/* A run, its steps and its three queues are one block; the last block
 * released is kept for the next run of up to EXEC_SPARE_STEPS steps (most
 * calls repeat one small plan: no allocator on their path). */
#define EXEC_SPARE_STEPS 256

static size_t exec_bytes(uint32_t n) {
  size_t head = (sizeof(exec_t) + 63) & ~(size_t)63;
  return head + (size_t)n * sizeof(exec_step_t) + 4 * (size_t)n * sizeof(uint32_t) + n;
}

static exec_t *exec_alloc(exec_ctx_t *ctx, uint32_t n) {
  exec_t *ex = ctx->spare;
  uint32_t cap = n ? n : 1;
  if (ex && ex->cap >= n) {
    cap = ex->cap;
    ctx->spare = NULL;
    memset(ex, 0, exec_bytes(0) + (size_t)n * sizeof(exec_step_t));
  } else {
    ex = calloc(1, exec_bytes(cap));
    if (!ex)
      return NULL;
  }
  ex->cap = cap;
  ex->steps = (exec_step_t *)((uint8_t *)ex + exec_bytes(0));
  ex->q_local = (uint32_t *)(ex->steps + cap);
  return ex;
}

static void exec_free(exec_ctx_t *ctx, exec_t *ex) {
  if (!ctx->spare && ex->cap <= EXEC_SPARE_STEPS)
    ctx->spare = ex;
  else
    free(ex);
}

exec_t *exec_create(exec_ctx_t *ctx, const plan_t *plan, const void *sendbuf, void *recvbuf,
                    uint16_t seq, exec_done_fn done, void *arg) {
  uint32_t n = plan->nsteps;
  exec_t *ex = exec_alloc(ctx, n);

  if (!ex)
    return NULL;
  ex->nsteps = n;
  ex->q_send = ex->q_local + n;
  ex->q_recv = ex->q_send + n;
  ex->cur = ex->q_recv + n;
  ex->inq = (uint8_t *)(ex->cur + n);
  for (uint32_t p = 0; p < plan->npairs; p++) {
    ex->cur[p] = plan->pairs[p].first;
    ex->inq[p] = 0;
  }
  if (plan->scratch_bytes) {
    /* the cached buffer serves plans up to CHORUS_BUFFSIZE; a larger one
     * gets its own scratch for the run, freed when it ends */
    if (!ctx->scratch_lent && (!ctx->scratch_keep || plan->scratch_bytes <= ctx->scratch_keep)) {
      if (ctx->scratch_bytes < plan->scratch_bytes) {
        free(ctx->scratch);
        ctx->scratch = scratch_alloc(plan->scratch_bytes);
        ctx->scratch_bytes = ctx->scratch ? plan->scratch_bytes : 0;
        if (!ctx->scratch)
          goto out_free;
      }
      ctx->scratch_lent = true;
      ex->scratch_lent = true;
      ex->bufs[BUF_SCRATCH] = ctx->scratch;
    } else {
      /* A fresh buffer costs a page fault a page, which can dwarf the
       * call itself: the last run's is taken when it is large enough. */
      if (ctx->big && ctx->big_bytes >= plan->scratch_bytes) {
        ex->own_scratch = ctx->big;
        ex->own_bytes = ctx->big_bytes;
        ctx->big = NULL;
        ctx->big_bytes = 0;
      } else {
        ex->own_scratch = scratch_alloc(plan->scratch_bytes);
        ex->own_bytes = plan->scratch_bytes;
      }
      if (!ex->own_scratch)
        goto out_free;
      ex->bufs[BUF_SCRATCH] = ex->own_scratch;
    }
  }
  ex->ctx = ctx;
  ex->comm_id = ctx->comm_id;
  ex->plan = plan;
  ex->bufs[BUF_SEND] = (uint8_t *)(uintptr_t)sendbuf;
  ex->bufs[BUF_RECV] = recvbuf;
  ex->seq = seq;
  ex->done = done;
  ex->arg = arg;
  for (uint32_t i = 0; i < n; i++) {
    exec_step_t *st = &ex->steps[i];
    fsm_init(&st->fsm, &exec_step_machine, S_WAIT, i, seq);
    st->op.done = step_done;
    st->deps_left = plan->steps[i].ndeps;
    st->index = i;
    st->ex = ex;
    st->borrow_from = UINT32_MAX;
    st->kind = plan->steps[i].kind;
    st->peer = plan->steps[i].peer;
  }
  find_borrowable(ex);
  return ex;

out_free:
  exec_free(ctx, ex);
  return NULL;
}

/* Runs after the done callback, which may free the plan: ex->plan is not
 * to be read here. */
static void exec_release(exec_t *ex) {
  /* a failed run may leave borrowed receives whose readers never ran */
  for (uint32_t i = 0; i < ex->nsteps; i++)
    if (ex->steps[i].op.borrowed)
      ex->ctx->prov->ops->release(ex->ctx->prov, &ex->steps[i].op);
  if (ex->scratch_lent)
    ex->ctx->scratch_lent = false;
  if (ex->own_scratch) {
    exec_ctx_t *ctx = ex->ctx;
    if (ctx->big_bytes <= ex->own_bytes) { /* keep the larger */
      free(ctx->big);
      ctx->big = ex->own_scratch;
      ctx->big_bytes = ex->own_bytes;
      ctx->big_since = fsm_now_ns();
    } else {
      free(ex->own_scratch);
    }
  }
  free(ex->why);
  exec_free(ex->ctx, ex);
}

void exec_set_extra(exec_t *ex, void *const *xbufs, uint32_t msg_or) {
  ex->xbufs = xbufs;
  ex->msg_or = msg_or;
}

void exec_set_call(exec_t *ex, uint64_t call_seq, uint64_t fp) {
  ex->call_seq = call_seq;
  ex->fp = fp & ~PROV_DATA_VALID;
}

const char *exec_why(const exec_t *ex) {
  return ex->why;
}

void exec_set_comm_id(exec_t *ex, uint8_t comm_id) {
  ex->comm_id = comm_id;
}

void exec_set_bounce(exec_t *ex) {
  ex->send_flags |= PROV_OP_BOUNCE;
}

bool exec_uncertain(const exec_t *ex) {
  return ex->uncertain;
}

void exec_start(exec_ctx_t *ctx, exec_t *ex) {
  uint64_t now = ctx->trace ? fsm_stamp_ns() : 0;
  for (uint32_t i = 0; i < ex->plan->nsteps; i++) {
    exec_step_t *st = &ex->steps[i];
    st->since_ns = now;
    if (st->deps_left == 0) {
      /* no dependency: WAIT -> READY directly, journaled like any other */
      st->deps_left = 1;
      fsm_event_t ev = {.sig = E_DEP};
      fsm_dispatch(&st->fsm, &ev);
    }
  }
  if (ctx->active_tail)
    ctx->active_tail->next = ex;
  else
    ctx->active = ex;
  ctx->active_tail = ex;
}

static int post_step(exec_ctx_t *ctx, exec_t *ex, uint32_t idx) {
  const plan_step_t *ps = &ex->plan->steps[idx];
  exec_step_t *st = &ex->steps[idx];
  int rc;

  if (ps->kind == STEP_SEND) {
    st->op.flags = ex->send_flags | (ex->msg_or & EXEC_MSG_P2P ? PROV_OP_P2P : 0);
    st->op.data = send_data(ex, at(ex, ps->src), ps->bytes);
    rc = ctx->prov->ops->post_send(ctx->prov, ps->peer, at(ex, ps->src), ps->bytes,
                                   exec_tag(ctx->rank, ex->comm_id, ex->seq, ps->msg | ex->msg_or),
                                   &st->op);
  } else {
    st->op.flags = st->borrowable ? PROV_OP_BORROW : 0;
    rc = ctx->prov->ops->post_recv(ctx->prov, ps->peer, at(ex, ps->dst), ps->bytes,
                                   exec_tag(ps->peer, ex->comm_id, ex->seq, ps->msg | ex->msg_or),
                                   &st->op);
  }
  if (rc == 0) {
    stamp(st);
    ex->nposted++;
    if (ps->kind == STEP_SEND)
      ctx->posted_sends++;
    else
      ctx->posted_recvs++;
    if (ctx->inflight && !(ex->msg_or & EXEC_MSG_P2P))
      ctx->inflight[2 * (size_t)ps->peer + (ps->kind == STEP_RECV)]++;
    fsm_event_t ev = {.sig = E_POSTED};
    fsm_dispatch(&st->fsm, &ev);
  } else if (rc != -EAGAIN) {
    eng_log(ENG_ERR, ctx->rank, "exec", "posting %s step %u (peer %d) failed: %s",
            plan_step_kind_str(ps->kind), idx, ps->peer, strerror(-rc));
    fsm_event_t ev = {.sig = E_ERROR, .arg = CHORUS_ERR_TRANSPORT};
    st->err = -rc;
    fsm_dispatch(&st->fsm, &ev);
  }
  return rc;
}

static void exec_cancel(exec_ctx_t *ctx, exec_t *ex) {
  fsm_event_t ev = {.sig = E_CANCEL, .arg = ex->status};
  for (uint32_t i = 0; i < ex->plan->nsteps; i++) {
    exec_step_t *st = &ex->steps[i];
    if (st->fsm.state == S_POSTED)
      ctx->prov->ops->cancel(ctx->prov, &st->op);
    else if (st->fsm.state == S_WAIT || st->fsm.state == S_READY)
      fsm_dispatch(&st->fsm, &ev);
  }
}

/* Whether no older run still has steps of pair p's kind and peer to post:
 * a pair's messages are posted in the order of the calls, then of their
 * message numbers, the order the peer posts the other side in. Point-to-point
 * runs stand apart (the user orders them). */
static bool pair_owned(const exec_ctx_t *ctx, const exec_t *ex, uint32_t p) {
  const plan_pair_t *pp = &ex->plan->pairs[p];

  if (ctx->active == ex || (ex->msg_or & EXEC_MSG_P2P))
    return true;
  for (const exec_t *o = ctx->active; o && o != ex; o = o->next) {
    if (o->status || (o->msg_or & EXEC_MSG_P2P)) /* a failed run's plan may be gone */
      continue;
    uint32_t q = plan_find_pair(o->plan, pp->kind, pp->peer);
    if (q != UINT32_MAX && o->cur[q] != UINT32_MAX)
      return false;
  }
  return true;
}

/* Within the posting budget; past it, a pair's oldest message (nothing of
 * its pair held by the transport) still goes: every pair can always move
 * its next message, so a schedule the verifier passed can not deadlock on
 * the budget, however small (verify.c checks it one message at a time per
 * pair). */
static bool may_post(const exec_ctx_t *ctx, const exec_t *ex, uint32_t p) {
  const plan_pair_t *pp = &ex->plan->pairs[p];
  const bool send = pp->kind == STEP_SEND;

  if ((send ? ctx->posted_sends : ctx->posted_recvs) < ctx->max_posted)
    return true;
  return ctx->inflight && !(ex->msg_or & EXEC_MSG_P2P) &&
         ctx->inflight[2 * (size_t)pp->peer + !send] == 0;
}

/* Posts what the queued pairs of one kind have ready, round robin over the
 * pairs. Returns 0, or the error a post failed with (the run then fails). */
static int post_pairs(exec_ctx_t *ctx, exec_t *ex, bool send, size_t *moved) {
  uint32_t *q = send ? ex->q_send : ex->q_recv;
  uint32_t *head = send ? &ex->qs_head : &ex->qr_head, *n = send ? &ex->qs_n : &ex->qr_n;
  const uint32_t cap = ex->plan->npairs;
  uint32_t tries = *n; /* pairs looked at since the last post */

  while (*n && tries) {
    const uint32_t p = q[*head], idx = ex->cur[p];
    *head = (*head + 1) % cap;
    (*n)--;
    if (!pair_owned(ctx, ex, p)) { /* ctx->requeue brings it back */
      ex->inq[p] = 0;
      tries--;
      continue;
    }
    if (!may_post(ctx, ex, p)) {
      q[(*head + (*n)++) % cap] = p;
      tries--;
      continue;
    }
    int rc = post_step(ctx, ex, idx);
    if (rc == -EAGAIN) { /* this peer's window, or the transport full: the others may go */
      ctx->stalled = true;
      q[(*head + (*n)++) % cap] = p;
      tries--;
      continue;
    }
    (*moved)++;
    const uint32_t nx = ex->plan->pair_next[idx];
    ex->cur[p] = nx;
    if (nx != UINT32_MAX && ex->steps[nx].fsm.state == S_READY) {
      q[(*head + (*n)++) % cap] = p;
    } else {
      ex->inq[p] = 0;
      if (nx == UINT32_MAX && ctx->active != ctx->active_tail)
        ctx->requeue = true; /* a later run may wait for this pair */
    }
    if (rc)
      return rc;
    tries = *n;
  }
  return 0;
}

/* One pass over one run; returns steps advanced. */
static size_t drive_one(exec_ctx_t *ctx, exec_t *ex) {
  size_t moved = 0;

  if (ex->status)
    return 0;
  /* receives first: a posted receive lets the peer's send complete */
  if (post_pairs(ctx, ex, false, &moved) || post_pairs(ctx, ex, true, &moved))
    return moved;
  /* local steps (copies, reductions) last: what is ready to go on the wire
   * is on its way while we copy (a root that copied its whole buffer first
   * kept its receivers waiting) */
  while (ex->ql_head < ex->ql_tail) {
    fsm_event_t ev = {.sig = E_RUN};
    fsm_dispatch(&ex->steps[ex->q_local[ex->ql_head++]].fsm, &ev);
    moved++;
  }
  return moved;
}

/* Queues again the pairs that were held back by an older run (pair_owned). */
static void requeue_pairs(exec_ctx_t *ctx) {
  ctx->requeue = false;
  for (exec_t *ex = ctx->active; ex; ex = ex->next) {
    if (ex->status)
      continue;
    for (uint32_t p = 0; p < ex->plan->npairs; p++) {
      uint32_t idx = ex->cur[p];
      if (idx != UINT32_MAX && !ex->inq[p] && ex->steps[idx].fsm.state == S_READY)
        queue_pair(ex, p);
    }
  }
}

/* Step i of a run as dumps and the watchdog see it. */
static exec_pending_t pending_of(const exec_t *ex, uint32_t i) {
  const exec_step_t *st = &ex->steps[i];
  const plan_step_t *ps = &ex->plan->steps[i];
  return (exec_pending_t){.call_seq = ex->call_seq,
                          .seq16 = ex->seq,
                          .p2p = (ex->msg_or & EXEC_MSG_P2P) != 0,
                          .index = i,
                          .kind = ps->kind,
                          .state = st->fsm.state,
                          .peer = ps->peer,
                          .msg = ps->msg,
                          .bytes = ps->bytes,
                          .since_ns = st->since_ns,
                          .deps_left = st->fsm.state == S_WAIT ? st->deps_left : 0,
                          .err = st->fsm.state == S_FAILED ? st->err : 0};
}

/* A failed run's steps that the transport failed, kept past the run. */
static void keep_broken(exec_ctx_t *ctx, const exec_t *ex) {
  size_t n = 0;
  for (uint32_t i = 0; i < ex->nsteps && n < EXEC_BROKE_MAX; i++)
    if (ex->steps[i].fsm.state == S_FAILED && ex->steps[i].err)
      ctx->broke[n++] = pending_of(ex, i);
  if (n)
    ctx->nbroke = n;
}

size_t exec_drive(exec_ctx_t *ctx) {
  size_t moved = 0;
  exec_t *prev = NULL, *ex = ctx->active;

  ctx->stalled = false;
  while (ex) {
    exec_t *next = ex->next;
    if (ctx->requeue)
      requeue_pairs(ctx);
    if (!ex->orphan)
      moved += drive_one(ctx, ex);
    if (ex->status && !ex->canceling) {
      ex->canceling = true;
      ex->fail_ns = fsm_now_ns();
      exec_cancel(ctx, ex);
    }
    bool finished = ex->nposted == 0 && (ex->orphan || ex->ndone == ex->nsteps ||
                                         (ex->status && ex->ndone + ex->nfailed == ex->nsteps));
    if (finished) {
      if (prev)
        prev->next = next;
      else
        ctx->active = next;
      if (ctx->active_tail == ex)
        ctx->active_tail = prev;
      if (!ex->orphan && ex->status)
        keep_broken(ctx, ex);
      else if (!ex->orphan)
        ctx->nbroke = 0;
      if (!ex->orphan)
        ex->done(ex, ex->status, ex->arg);
      exec_release(ex);
      moved++;
    } else if (ex->status && !ex->orphan && fsm_now_ns() - ex->fail_ns > EXEC_ORPHAN_NS) {
      /* Some transports can not cancel a send a peer never takes (tcp's
       * rendezvous): the caller gets its failure now; the run stays until
       * the transport gives the operations back (or is closed). */
      eng_log(ENG_WARN, ctx->rank, "exec",
              "collective #%llu failed; %u operations the transport could not cancel are left "
              "to it",
              (unsigned long long)ex->call_seq, ex->nposted);
      keep_broken(ctx, ex);
      ex->done(ex, ex->status, ex->arg);
      ex->orphan = true;
      moved++;
      prev = ex;
    } else {
      prev = ex;
    }
    ex = next;
  }
  return moved;
}

void exec_fail_all(exec_ctx_t *ctx, int status) {
  for (exec_t *ex = ctx->active; ex; ex = ex->next) {
    if (!ex->status)
      ex->status = status;
    if (!ex->canceling) {
      ex->canceling = true;
      ex->fail_ns = fsm_now_ns();
      exec_cancel(ctx, ex);
    }
  }
}

size_t exec_pending(const exec_ctx_t *ctx, exec_pending_t *out, size_t max) {
  size_t n = 0;
  for (const exec_t *ex = ctx->active; ex; ex = ex->next) {
    if (ex->orphan)
      continue;
    for (uint32_t i = 0; i < ex->nsteps; i++) {
      if (ex->steps[i].fsm.state == S_DONE)
        continue;
      if (n == max)
        return n;
      out[n++] = pending_of(ex, i);
    }
  }
  for (size_t i = 0; i < ctx->nbroke && n < max; i++)
    out[n++] = ctx->broke[i];
  return n;
}

bool exec_blocker(const exec_ctx_t *ctx, exec_pending_t *out) {
  /* the oldest run's oldest posted receive, else its oldest posted send */
  for (const exec_t *ex = ctx->active; ex; ex = ex->next) {
    if (ex->orphan || ex->status)
      continue;
    const exec_step_t *best = NULL;
    for (int pass = 0; pass < 2 && !best; pass++)
      for (uint32_t i = 0; i < ex->nsteps; i++) {
        const exec_step_t *st = &ex->steps[i];
        if (st->fsm.state != S_POSTED || st->kind != (pass ? STEP_SEND : STEP_RECV))
          continue;
        if (!best || st->since_ns < best->since_ns)
          best = st;
      }
    if (!best)
      continue;
    *out = pending_of(ex, best->index);
    return true;
  }
  return false;
}

bool exec_idle(const exec_ctx_t *ctx) {
  return ctx->active == NULL;
}

void exec_trim(exec_ctx_t *ctx, uint64_t now) {
  if (ctx->big && now - ctx->big_since >= EXEC_BIG_IDLE_NS) {
    free(ctx->big);
    ctx->big = NULL;
    ctx->big_bytes = 0;
  }
}

int exec_ctx_set_peers(exec_ctx_t *ctx, int nranks) {
  uint32_t *f = calloc(2 * (size_t)(nranks > 0 ? nranks : 1), sizeof(*f));
  if (!f)
    return -ENOMEM;
  free(ctx->inflight);
  ctx->inflight = f;
  return 0;
}

void exec_ctx_fini(exec_ctx_t *ctx) {
  /* runs left behind (orphans, after the transport closed): free them */
  while (ctx->active) {
    exec_t *ex = ctx->active;
    ctx->active = ex->next;
    for (uint32_t i = 0; i < ex->nsteps; i++)
      ex->steps[i].op.borrowed = NULL; /* the transport is gone */
    exec_release(ex);
  }
  ctx->active_tail = NULL;
  free(ctx->scratch);
  ctx->scratch = NULL;
  ctx->scratch_bytes = 0;
  free(ctx->big);
  ctx->big = NULL;
  ctx->big_bytes = 0;
  free(ctx->spare);
  ctx->spare = NULL;
  free(ctx->inflight);
  ctx->inflight = NULL;
}
