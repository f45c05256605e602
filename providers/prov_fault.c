/*
 * prov_fault.c - a wrapper around any provider that breaks sends on
 * purpose, reproducibly, as a fault plan (fault.h) says. Opened by
 * prov_open() when cfg->faults is set; the child is the provider named.
 *
 *   post_send ── decide (first rule that targets it and draws below p)
 *      none     ──────────────────────────────► child (the caller's op)
 *      dup      ──────────────────────────────► child (the caller's op)
 *                └─ private copy, our op ─────► child (completion swallowed)
 *      corrupt  private copy, one bit flipped, our op ► child; its completion
 *               completes the caller's op
 *      drop     completion queued: the caller's op succeeds at progress()
 *      delay    held until now + ms   ┐
 *      reorder  held until the next   ├ held list (FIFO) ─ due ─► child
 *               send to the peer, 5 ms┘
 *   post_recv ─────────────────────────────────► child
 *
 * A send is counted and its injection recorded only once it was accepted
 * (a child's -EAGAIN leaves no trace, so the caller's retry draws the same).
 *
 * Ownership of the caller's op: while held, queued, or sent through our own
 * op, its internal[PROV_OP_OWNER] is this wrapper and [PROV_OP_REQ] our
 * record; otherwise it is the child's (or the child's child's, under
 * prov_multi), and cancel/release go down unchanged.
 *
 * Stall (prov_fault_stall): while it lasts progress() does nothing, new
 * sends and receives are held, and arm() sleeps on the timer alone - the
 * child's fd is taken out of the wait set so that its traffic can not wake
 * the owner into a loop of empty progress calls.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "fault.h"
#include "prov_internal.h"

#define FAULT_REORDER_NS (5 * 1000 * 1000ull) /* a reordered send waits at most 5 ms */
#define FAULT_RETRY_NS (1000 * 1000ull)       /* a held post the child refused: retry after 1 ms */
#define FAULT_COUNT_GEN (1u << 14)            /* (destination, tag) pairs per count generation */

enum rec_state {
  REC_HELD,   /* in the held list, not yet on the child */
  REC_PROXY,  /* our op (cop) is on the child */
  REC_QUEUED, /* in the completion queue */
};

struct fault_ep;

/* A send (or a receive held by a stall) the wrapper is answerable for. */
struct fault_rec {
  struct fault_rec *prev, *next; /* held list or completion queue */
  struct fault_ep *m;
  prov_op_t *user; /* the caller's op; NULL for a dup's extra copy */
  prov_op_t cop;   /* ours, on the child, when `proxy` */
  int peer;
  uint64_t tag;
  void *buf; /* what goes out (or in): the caller's buffer or `copy` */
  size_t len;
  void *copy;      /* owned payload (dup, corrupt), or NULL */
  uint64_t data;   /* immediate data of the send */
  uint64_t due_ns; /* held: post at or after this time */
  int status;      /* queued: what the caller's done() gets */
  size_t xfer;
  unsigned char state; /* enum rec_state */
  bool recv;           /* a receive held by a stall */
  bool proxy;          /* posted with cop, not with the caller's op */
  bool reorder;        /* held until the next send to peer */
};

struct rec_list {
  struct fault_rec *head, *tail;
};

/* Sends made so far per (destination, tag): open addressing, linear probe. */
struct count_entry {
  uint64_t tag;
  uint32_t peer1; /* peer + 1; 0: empty slot */
  uint32_t n;
};

struct count_gen {
  struct count_entry *e;
  size_t cap; /* power of two, 0 before the first insert */
  size_t used;
};

struct fault_ep {
  prov_t base;
  prov_t *child;
  fault_plan_t *plan;
  int rank, nranks;
  int seq_shift, seq_bits;            /* the sequence field of tags (bits 0: unknown) */
  bool transport;                     /* the plan has rules for messages */
  bool closing;                       /* close() began: posts are refused */
  uint64_t injected[FAULT_MAX_RULES]; /* per rule, for n= */
  struct rec_list held;               /* FIFO: posted in this order when due */
  struct rec_list cq;                 /* completions progress() delivers */
  struct count_gen gen[2];            /* [0] current, [1] the one before */
  uint64_t stall_until;               /* CLOCK_MONOTONIC ns; 0: not stalled */
  int epfd, tfd, child_fd;            /* wait set, timer, child's fd; -1 before wait_fd() */
  bool child_armed;                   /* arm() armed the child */
  bool child_fd_off;                  /* child's fd out of the wait set (stall) */
  unsigned swallowed;                 /* extra copies completed inside the child's progress */
  prov_fault_event_t journal[PROV_FAULT_JOURNAL];
  prov_fault_stats_t stats; /* stats.events counts journal entries ever written */
  char name[96];
  char errmsg[256];
};

static struct fault_ep *to_fault(prov_t *p) {
  return PROV_CONTAINER_OF(p, struct fault_ep, base);
}

/* The same table without release(), for a child that never borrows: the
 * engine reads a NULL release as "do not ask to borrow", and must read the
 * wrapper as it reads the child. */
static const prov_ops_t fault_ops_no_release;

static bool is_fault(prov_t *p) {
  return p && (p->ops == &prov_fault_ops || p->ops == &fault_ops_no_release);
}

static uint64_t now_ns(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* last_error follows the child after each call into it, as prov_multi's. */
static prov_t *enter(struct fault_ep *m) {
  m->base.last_error = m->child->last_error;
  return m->child;
}

static void seterr(struct fault_ep *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void seterr(struct fault_ep *m, const char *fmt, ...) {
  va_list ap;
  int n = snprintf(m->errmsg, sizeof(m->errmsg), "fault rank %d: ", m->rank);

  m->base.last_error = m->errmsg;
  if (n < 0 || (size_t)n >= sizeof(m->errmsg))
    return;
  va_start(ap, fmt);
  vsnprintf(m->errmsg + n, sizeof(m->errmsg) - (size_t)n, fmt, ap);
  va_end(ap);
}

static void journal(struct fault_ep *m, fault_kind_t kind, int peer, uint64_t tag, const char *fmt,
                    ...) __attribute__((format(printf, 5, 6)));
static void journal(struct fault_ep *m, fault_kind_t kind, int peer, uint64_t tag, const char *fmt,
                    ...) {
  prov_fault_event_t *e = &m->journal[m->stats.events++ % PROV_FAULT_JOURNAL];
  va_list ap;

  e->t_ns = now_ns();
  e->kind = fault_kind_str(kind);
  e->peer = peer;
  e->tag = tag;
  va_start(ap, fmt);
  vsnprintf(e->detail, sizeof(e->detail), fmt, ap);
  va_end(ap);
}

/* ---- lists ---- */

static void list_push(struct rec_list *l, struct fault_rec *r) {
  r->next = NULL;
  r->prev = l->tail;
  if (l->tail)
    l->tail->next = r;
  else
    l->head = r;
  l->tail = r;
}

static void list_unlink(struct rec_list *l, struct fault_rec *r) {
  if (r->prev)
    r->prev->next = r->next;
  else
    l->head = r->next;
  if (r->next)
    r->next->prev = r->prev;
  else
    l->tail = r->prev;
  r->prev = r->next = NULL;
}

/* ---- sends counted per (destination, tag) ---- */

static size_t count_slot(const struct count_gen *g, int peer, uint64_t tag) {
  return (size_t)fault_hash(0, 0, (uint64_t)(uint32_t)peer, tag, 0, 0) & (g->cap - 1);
}

static struct count_entry *count_find(const struct count_gen *g, int peer, uint64_t tag) {
  if (!g->cap)
    return NULL;
  for (size_t i = count_slot(g, peer, tag);; i = (i + 1) & (g->cap - 1)) {
    struct count_entry *e = &g->e[i];

    if (!e->peer1)
      return NULL;
    if (e->peer1 == (uint32_t)peer + 1 && e->tag == tag)
      return e;
  }
}

static int count_insert(struct count_gen *g, int peer, uint64_t tag, uint32_t n) {
  struct count_entry *e;

  if ((g->used + 1) * 2 > g->cap) {
    size_t cap = g->cap ? g->cap * 2 : 64;
    struct count_gen bigger = {.e = calloc(cap, sizeof(*bigger.e)), .cap = cap};

    if (!bigger.e)
      return -ENOMEM;
    for (size_t i = 0; i < g->cap; i++)
      if (g->e[i].peer1)
        count_insert(&bigger, (int)(g->e[i].peer1 - 1), g->e[i].tag, g->e[i].n);
    free(g->e);
    *g = bigger;
  }
  for (size_t i = count_slot(g, peer, tag);; i = (i + 1) & (g->cap - 1)) {
    e = &g->e[i];
    if (!e->peer1)
      break;
  }
  e->peer1 = (uint32_t)peer + 1;
  e->tag = tag;
  e->n = n;
  g->used++;
  return 0;
}

static uint32_t count_get(const struct fault_ep *m, int peer, uint64_t tag) {
  const struct count_entry *e = count_find(&m->gen[0], peer, tag);

  if (!e)
    e = count_find(&m->gen[1], peer, tag);
  return e ? e->n : 0;
}

/* Two generations bound the memory: when the current one is full it
 * becomes the old one and the oldest is forgotten. */
static void count_bump(struct fault_ep *m, int peer, uint64_t tag) {
  struct count_entry *e = count_find(&m->gen[0], peer, tag);
  uint32_t n;

  if (e) {
    if (e->n < UINT32_MAX)
      e->n++;
    return;
  }
  n = count_get(m, peer, tag);
  if (m->gen[0].used >= FAULT_COUNT_GEN) {
    free(m->gen[1].e);
    m->gen[1] = m->gen[0];
    memset(&m->gen[0], 0, sizeof(m->gen[0]));
  }
  /* out of memory: the pair counts from n again next time; nothing worse */
  (void)count_insert(&m->gen[0], peer, tag, n < UINT32_MAX ? n + 1 : n);
}

/* ---- decisions ---- */

struct decision {
  int rule;   /* index in the plan, -1: no fault */
  uint64_t h; /* the draw's hash: corrupt takes its bit from it */
};

static struct decision decide(const struct fault_ep *m, int peer, uint64_t tag, size_t len) {
  struct decision d = {.rule = -1};
  uint64_t seq = 0, count;
  const fault_plan_t *plan = m->plan;

  if (!m->transport)
    return d;
  if (m->seq_bits > 0)
    seq = (tag >> m->seq_shift) & ((1ull << m->seq_bits) - 1);
  count = count_get(m, peer, tag);
  for (int i = 0; i < plan->nrules; i++) {
    const fault_rule_t *r = &plan->rules[i];
    uint64_t h;

    if (!fault_rule_targets(r, m->rank, peer, m->seq_bits, seq))
      continue;
    if ((r->n && m->injected[i] >= r->n) || (r->kind == FAULT_CORRUPT && !len))
      continue;
    h = fault_hash(plan->seed, (uint64_t)i, (uint64_t)(uint32_t)m->rank, (uint64_t)(uint32_t)peer,
                   tag, count);
    if (r->p < 1.0 && !(fault_unit(h) < r->p))
      continue;
    d.rule = i;
    d.h = h;
    return d;
  }
  return d;
}

/* ---- records ---- */

static struct fault_rec *rec_new(struct fault_ep *m, prov_op_t *user, int peer, const void *buf,
                                 size_t len, uint64_t tag) {
  struct fault_rec *r = calloc(1, sizeof(*r));

  if (!r)
    return NULL;
  r->m = m;
  r->user = user;
  r->peer = peer;
  r->tag = tag;
  r->buf = (void *)(uintptr_t)buf;
  r->len = len;
  if (user) {
    r->data = user->data & ~PROV_DATA_VALID;
    user->internal[PROV_OP_OWNER] = &m->base;
    user->internal[PROV_OP_REQ] = r;
  }
  return r;
}

static void rec_free(struct fault_rec *r) {
  free(r->copy);
  free(r);
}

static void rec_disown(struct fault_rec *r) {
  if (r->user) {
    r->user->internal[PROV_OP_OWNER] = NULL;
    r->user->internal[PROV_OP_REQ] = NULL;
  }
}

/* The caller's op completes with status at the next progress(); an extra
 * copy (no caller) is simply dropped. */
static void rec_queue(struct fault_ep *m, struct fault_rec *r, int status, size_t xfer) {
  if (!r->user) {
    rec_free(r);
    return;
  }
  r->status = status;
  r->xfer = xfer;
  r->state = REC_QUEUED;
  list_push(&m->cq, r);
}

static void rec_hold(struct fault_ep *m, struct fault_rec *r, uint64_t due) {
  r->due_ns = due;
  r->state = REC_HELD;
  list_push(&m->held, r);
}

static void rec_deliver(struct fault_rec *r) {
  prov_op_t *user = r->user;
  int status = r->status;
  size_t xfer = r->xfer;

  if (r->recv)
    user->data = 0; /* a receive that never happened carries no data */
  rec_disown(r);
  rec_free(r);
  user->done(user, status, xfer);
}

/* Our op on the child completed: the caller's op completes with it. */
static void proxy_done(prov_op_t *cop, int status, size_t len) {
  struct fault_rec *r = PROV_CONTAINER_OF(cop, struct fault_rec, cop);

  r->status = status;
  r->xfer = len;
  rec_deliver(r);
}

/* A dup's extra copy completed: nobody is told. */
static void extra_done(prov_op_t *cop, int status, size_t len) {
  struct fault_rec *r = PROV_CONTAINER_OF(cop, struct fault_rec, cop);

  r->m->swallowed++;
  rec_free(r);
}

/* Hands r to the child: the caller's op itself, or our op for a proxy
 * (which then lives on until cop completes). The caller unlinks and frees. */
static int rec_post(struct fault_ep *m, struct fault_rec *r) {
  prov_t *c = enter(m);
  int rc;

  if (r->recv) {
    rc = c->ops->post_recv(c, r->peer, r->buf, r->len, r->tag, r->user);
  } else if (r->proxy) {
    memset(&r->cop, 0, sizeof(r->cop));
    r->cop.done = r->user ? proxy_done : extra_done;
    r->cop.data = r->data;
    /* a dup's copy is never taken: the child may refuse it (-ENOBUFS) */
    r->cop.flags = r->user ? r->user->flags : PROV_OP_SPARE;
    rc = c->ops->post_send(c, r->peer, r->buf, r->len, r->tag, &r->cop);
  } else {
    rc = c->ops->post_send(c, r->peer, r->buf, r->len, r->tag, r->user);
  }
  if (rc == 0 && r->proxy)
    r->state = REC_PROXY;
  return rc;
}

/* Posts a held record. -EAGAIN: it keeps its place, retried in 1 ms;
 * another error completes it with that status. */
static int held_post(struct fault_ep *m, struct fault_rec *r, uint64_t now) {
  int rc = rec_post(m, r);

  if (rc == -EAGAIN) {
    r->due_ns = now + FAULT_RETRY_NS;
    r->reorder = false;
    return rc;
  }
  list_unlink(&m->held, r);
  if (rc == 0) {
    if (!r->proxy)
      rec_free(r); /* the caller's op is the child's now */
    return 0;
  }
  seterr(m, "held %s to peer %d tag %#llx: %s (%s)", r->recv ? "receive" : "send", r->peer,
         (unsigned long long)r->tag, strerror(-rc), m->child->last_error);
  rec_queue(m, r, rc, 0);
  return rc;
}

static void timer_set(struct fault_ep *m, uint64_t due) {
  struct itimerspec its = {{0, 0}, {0, 0}};

  if (m->tfd < 0)
    return;
  if (due) {
    its.it_value.tv_sec = (time_t)(due / 1000000000ull);
    its.it_value.tv_nsec = (long)(due % 1000000000ull);
  }
  timerfd_settime(m->tfd, due ? TFD_TIMER_ABSTIME : 0, &its, NULL);
}

static void child_fd_listen(struct fault_ep *m, bool on) {
  struct epoll_event ev = {.events = on ? EPOLLIN : 0};

  if (m->epfd < 0 || m->child_fd_off == !on)
    return;
  if (epoll_ctl(m->epfd, EPOLL_CTL_MOD, m->child_fd, &ev) == 0)
    m->child_fd_off = !on;
}

/* Ends a stall that is over, then posts what is due, in order. Stops at the
 * first post the child refuses for now (-EAGAIN): later ones would be too,
 * and must not overtake it. */
static void flush(struct fault_ep *m, uint64_t now) {
  struct fault_rec *r, *next;

  if (m->stall_until && now >= m->stall_until)
    m->stall_until = 0;
  if (m->stall_until)
    return;
  for (r = m->held.head; r; r = next) {
    next = r->next;
    if (r->due_ns > now)
      continue;
    if (held_post(m, r, now) == -EAGAIN)
      break;
  }
}

/* ---- open ---- */

static void fault_free(struct fault_ep *m) {
  if (m->child)
    m->child->ops->close(m->child);
  if (m->epfd >= 0)
    close(m->epfd);
  if (m->tfd >= 0)
    close(m->tfd);
  free(m->gen[0].e);
  free(m->gen[1].e);
  fault_plan_free(m->plan);
  free(m);
}

/* A rule's sequence numbers must fit the tags' field, or it would match
 * some other collective than the one named. */
static int check_seq_fit(const struct fault_ep *m, char *errbuf, size_t errlen) {
  for (int i = 0; i < m->plan->nrules; i++) {
    const fault_rule_t *r = &m->plan->rules[i];
    uint64_t top = 0;

    if (fault_kind_is_call(r->kind) || m->seq_bits <= 0)
      continue;
    top = r->has_at ? r->at : 0;
    if (r->has_from && r->from > top)
      top = r->from;
    if (r->has_to && r->to > top)
      top = r->to;
    if (top >> m->seq_bits) {
      prov_errf(errbuf, errlen,
                "fault: rule %d (%s): sequence #%llu does not fit the tags' %d-bit sequence field",
                i + 1, fault_kind_str(r->kind), (unsigned long long)top, m->seq_bits);
      return -EINVAL;
    }
  }
  return 0;
}

static int fault_open(const prov_config_t *cfg, prov_t **out, char *errbuf, size_t errlen) {
  char cerr[512] = "";
  prov_config_t ccfg;
  struct fault_ep *m;
  int rc;

  if (out)
    *out = NULL;
  if (!cfg || !out || !cfg->name || cfg->nranks <= 0 || cfg->rank < 0 || cfg->rank >= cfg->nranks) {
    prov_errf(errbuf, errlen, "fault: bad configuration");
    return -EINVAL;
  }
  if (cfg->fault_tag_seq_bits < 0 || cfg->fault_tag_seq_bits > 63 || cfg->fault_tag_seq_shift < 0 ||
      (cfg->fault_tag_seq_bits && cfg->fault_tag_seq_shift + cfg->fault_tag_seq_bits > 64)) {
    prov_errf(errbuf, errlen, "fault: tag sequence field (shift %d, %d bits) is not within 64 bits",
              cfg->fault_tag_seq_shift, cfg->fault_tag_seq_bits);
    return -EINVAL;
  }
  m = calloc(1, sizeof(*m));
  if (!m) {
    prov_errf(errbuf, errlen, "fault: out of memory");
    return -ENOMEM;
  }
  m->epfd = m->tfd = m->child_fd = -1;
  m->rank = cfg->rank;
  m->nranks = cfg->nranks;
  m->seq_shift = cfg->fault_tag_seq_shift;
  m->seq_bits = cfg->fault_tag_seq_bits;
  m->base.ops = &prov_fault_ops;
  m->base.name = m->name;
  m->base.last_error = m->errmsg;
  rc = fault_plan_parse(cfg->faults, &m->plan, cerr, sizeof(cerr));
  if (rc) {
    prov_errf(errbuf, errlen, "%s", cerr);
    goto out_free;
  }
  rc = check_seq_fit(m, errbuf, errlen);
  if (rc)
    goto out_free;
  m->transport = fault_plan_transport_rules(m->plan) > 0;
  ccfg = *cfg;
  ccfg.faults = NULL;
  rc = prov_open(&ccfg, &m->child, cerr, sizeof(cerr));
  if (rc) {
    prov_errf(errbuf, errlen, "fault: opening %s: %s", cfg->name, cerr);
    goto out_free;
  }
  if (!m->child->ops->release)
    m->base.ops = &fault_ops_no_release;
  snprintf(m->name, sizeof(m->name), "fault(%s)", m->child->name);
  *out = &m->base;
  return 0;

out_free:
  fault_free(m);
  return rc;
}

/* ---- peers ---- */

static int fault_getname(prov_t *p, void *addr, size_t *len) {
  prov_t *c = enter(to_fault(p));

  return c->ops->getname(c, addr, len);
}

static int fault_add_peers(prov_t *p, const void *const *addrs, const size_t *lens, int n) {
  prov_t *c = enter(to_fault(p));

  return c->ops->add_peers(c, addrs, lens, n);
}

/* ---- data ---- */

static int check_post(struct fault_ep *m, int peer, size_t len, const void *buf, prov_op_t *op) {
  if (m->closing)
    return -ESHUTDOWN;
  if (!op || !op->done || peer < 0 || peer >= m->nranks || (len && !buf))
    return -EINVAL;
  return 0;
}

/* A private copy of the payload, or NULL (out of memory: no fault then). */
static void *payload_copy(const void *buf, size_t len) {
  void *c = malloc(len ? len : 1);

  if (c && len)
    memcpy(c, buf, len);
  return c;
}

/* The caller's next send to peer went by: reordered sends held for it
 * follow it now. */
static void release_reordered(struct fault_ep *m, int peer, struct fault_rec *except,
                              uint64_t now) {
  struct fault_rec *r, *next;

  for (r = m->held.head; r; r = next) {
    next = r->next;
    if (!r->reorder || r->peer != peer || r == except)
      continue;
    r->reorder = false;
    r->due_ns = now;
    list_unlink(&m->held, r);
    list_push(&m->held, r);
    if (!m->stall_until)
      held_post(m, r, now);
  }
}

/* Counts an injection of rule i (stats, n=) and journals it. */
static void note_injection(struct fault_ep *m, int i, int peer, uint64_t tag, size_t len,
                           size_t bit) {
  const fault_rule_t *rule = &m->plan->rules[i];

  m->injected[i]++;
  switch (rule->kind) {
  case FAULT_DROP:
    m->stats.drop++;
    journal(m, FAULT_DROP, peer, tag, "rule %d: dropped, %zu bytes", i + 1, len);
    break;
  case FAULT_DELAY:
    m->stats.delay++;
    journal(m, FAULT_DELAY, peer, tag, "rule %d: held %u ms, %zu bytes", i + 1, (unsigned)rule->ms,
            len);
    break;
  case FAULT_DUP:
    m->stats.dup++;
    journal(m, FAULT_DUP, peer, tag, "rule %d: sent twice, %zu bytes", i + 1, len);
    break;
  case FAULT_REORDER:
    m->stats.reorder++;
    journal(m, FAULT_REORDER, peer, tag, "rule %d: held for the next send to peer %d, %zu bytes",
            i + 1, peer, len);
    break;
  case FAULT_CORRUPT:
    m->stats.corrupt++;
    journal(m, FAULT_CORRUPT, peer, tag, "rule %d: bit %zu of byte %zu flipped, %zu bytes", i + 1,
            bit % 8, bit / 8, len);
    break;
  default:
    break;
  }
}

static int fault_post_send(prov_t *p, int peer, const void *buf, size_t len, uint64_t tag,
                           prov_op_t *op) {
  struct fault_ep *m = to_fault(p);
  struct fault_rec *r = NULL, *extra = NULL;
  const fault_rule_t *rule;
  struct decision d;
  void *copy = NULL;
  int kind, rc = check_post(m, peer, len, buf, op);
  size_t bit = 0;
  uint64_t now;

  if (rc)
    return rc;
  now = now_ns();
  flush(m, now);
  d = decide(m, peer, tag, len);
  rule = d.rule >= 0 ? &m->plan->rules[d.rule] : NULL;
  kind = rule ? (int)rule->kind : -1;
  if (kind == FAULT_DUP || kind == FAULT_CORRUPT) {
    copy = payload_copy(buf, len);
    if (!copy)
      kind = -1; /* out of memory: this one goes unharmed */
  }

  switch (kind) {
  case -1:
    if (m->stall_until) {
      r = rec_new(m, op, peer, buf, len, tag);
      if (!r)
        return -ENOMEM;
      rec_hold(m, r, now);
    } else {
      prov_t *c = enter(m);

      rc = c->ops->post_send(c, peer, buf, len, tag, op);
      if (rc)
        return rc;
    }
    break;
  case FAULT_DUP:
    extra = rec_new(m, NULL, peer, copy, len, tag);
    if (!extra) {
      free(copy);
      return -ENOMEM;
    }
    extra->copy = copy;
    extra->proxy = true;
    extra->data = op->data & ~PROV_DATA_VALID;
    if (m->stall_until) {
      r = rec_new(m, op, peer, buf, len, tag);
      if (!r) {
        rec_free(extra);
        return -ENOMEM;
      }
      rec_hold(m, r, now);
      rec_hold(m, extra, now);
      extra = NULL;
    } else {
      prov_t *c = enter(m);

      rc = c->ops->post_send(c, peer, buf, len, tag, op);
      if (rc) {
        rec_free(extra);
        return rc;
      }
    }
    break;
  case FAULT_CORRUPT:
    r = rec_new(m, op, peer, copy, len, tag);
    if (!r) {
      free(copy);
      return -ENOMEM;
    }
    r->copy = copy;
    r->proxy = true;
    bit = (size_t)(d.h >> 3) % len * 8 + (size_t)(d.h & 7);
    ((unsigned char *)copy)[bit / 8] ^= (unsigned char)(1u << (bit % 8));
    if (m->stall_until) {
      rec_hold(m, r, now);
    } else {
      rc = rec_post(m, r);
      if (rc) {
        rec_disown(r);
        rec_free(r);
        return rc;
      }
    }
    break;
  default: /* drop, delay, reorder: the caller's op is ours for now */
    r = rec_new(m, op, peer, buf, len, tag);
    if (!r)
      return -ENOMEM;
    if (kind == FAULT_DROP) {
      rec_queue(m, r, 0, len);
    } else if (kind == FAULT_DELAY) {
      rec_hold(m, r, now + (uint64_t)rule->ms * 1000000ull);
    } else {
      r->reorder = true;
      rec_hold(m, r, now + FAULT_REORDER_NS);
    }
    break;
  }

  /* accepted: from here on it counts */
  m->stats.sends++;
  if (m->transport)
    count_bump(m, peer, tag);
  if (kind >= 0)
    note_injection(m, d.rule, peer, tag, len, bit);
  if (extra) {
    rc = rec_post(m, extra);
    if (rc == -EAGAIN)
      rec_hold(m, extra, now + FAULT_RETRY_NS);
    else if (rc)
      rec_free(extra); /* the copy is lost; the original went */
  }
  release_reordered(m, peer, kind == FAULT_REORDER ? r : NULL, now);
  return 0;
}

static int fault_post_recv(prov_t *p, int peer, void *buf, size_t len, uint64_t tag,
                           prov_op_t *op) {
  struct fault_ep *m = to_fault(p);
  struct fault_rec *r;
  prov_t *c;
  uint64_t now;
  int rc = check_post(m, peer, len, buf, op);

  if (rc)
    return rc;
  now = now_ns();
  flush(m, now);
  if (m->stall_until) {
    r = rec_new(m, op, peer, buf, len, tag);
    if (!r)
      return -ENOMEM;
    r->recv = true;
    rec_hold(m, r, now);
    return 0;
  }
  c = enter(m);
  return c->ops->post_recv(c, peer, buf, len, tag, op);
}

static int fault_cancel(prov_t *p, prov_op_t *op) {
  struct fault_ep *m = to_fault(p);
  struct fault_rec *r;
  prov_t *c;

  if (!op)
    return -ENOENT;
  if (op->internal[PROV_OP_OWNER] != p) {
    c = enter(m);
    return c->ops->cancel(c, op);
  }
  r = op->internal[PROV_OP_REQ];
  switch (r->state) {
  case REC_HELD:
    list_unlink(&m->held, r);
    rec_queue(m, r, -ECANCELED, 0);
    return 0;
  case REC_PROXY:
    c = enter(m);
    return c->ops->cancel(c, &r->cop);
  default:
    return 0; /* completed already; its callback is on its way */
  }
}

static void fault_release(prov_t *p, prov_op_t *op) {
  struct fault_ep *m = to_fault(p);
  prov_t *c = m->child;

  if (c->ops->release && op && op->internal[PROV_OP_OWNER] != p) {
    enter(m);
    c->ops->release(c, op);
  }
}

/* Delivers what was queued on entry (callbacks may queue more). */
static int deliver_queued(struct fault_ep *m) {
  struct fault_rec *r = m->cq.head, *next;
  int n = 0;

  m->cq.head = m->cq.tail = NULL;
  for (; r; r = next) {
    next = r->next;
    rec_deliver(r);
    n++;
  }
  return n;
}

static int fault_progress(prov_t *p) {
  struct fault_ep *m = to_fault(p);
  prov_t *c;
  int rc, n;

  flush(m, now_ns());
  if (m->stall_until)
    return 0;
  m->swallowed = 0;
  c = enter(m);
  rc = c->ops->progress(c);
  n = rc > 0 ? rc - (int)m->swallowed : 0;
  n += deliver_queued(m);
  return n ? n : (rc < 0 ? rc : 0);
}

/* The wait set is made on first use, as inproc's eventfd is. */
static int fault_wait_fd(prov_t *p) {
  struct fault_ep *m = to_fault(p);
  struct epoll_event ev = {.events = EPOLLIN};
  int cfd;

  if (m->epfd >= 0)
    return m->epfd;
  cfd = m->child->ops->wait_fd(m->child);
  if (cfd < 0)
    return -1;
  m->epfd = epoll_create1(EPOLL_CLOEXEC);
  m->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (m->epfd < 0 || m->tfd < 0 || epoll_ctl(m->epfd, EPOLL_CTL_ADD, cfd, &ev) ||
      epoll_ctl(m->epfd, EPOLL_CTL_ADD, m->tfd, &ev)) {
    seterr(m, "wait set: %s", strerror(errno));
    if (m->epfd >= 0)
      close(m->epfd);
    if (m->tfd >= 0)
      close(m->tfd);
    m->epfd = m->tfd = -1;
    return -1;
  }
  m->child_fd = cfd;
  return m->epfd;
}

static int fault_arm(prov_t *p) {
  struct fault_ep *m = to_fault(p);
  uint64_t now = now_ns(), due = 0;
  int rc;

  if (m->stall_until) {
    if (now >= m->stall_until)
      return -EAGAIN; /* progress() ends it */
    /* frozen: deaf to the child until the stall is over */
    child_fd_listen(m, false);
    timer_set(m, m->stall_until);
    return 0;
  }
  if (m->cq.head)
    return -EAGAIN;
  for (struct fault_rec *r = m->held.head; r; r = r->next)
    if (!due || r->due_ns < due)
      due = r->due_ns;
  if (due && due <= now)
    return -EAGAIN;
  child_fd_listen(m, true);
  rc = m->child->ops->arm(m->child);
  if (rc)
    return rc;
  m->child_armed = true;
  timer_set(m, due);
  return 0;
}

static void fault_disarm(prov_t *p) {
  struct fault_ep *m = to_fault(p);

  if (m->child_armed)
    m->child->ops->disarm(m->child);
  m->child_armed = false;
  timer_set(m, 0); /* also clears an expiry not read */
}

static size_t fault_max_posted(prov_t *p) {
  prov_t *c = to_fault(p)->child;

  return c->ops->max_posted(c);
}

/* Every callback runs once: held ops with -ECANCELED (queued drops with
 * their success), ops on the child through the child's close. */
static void fault_close(prov_t *p) {
  struct fault_ep *m = to_fault(p);
  struct fault_rec *r;

  m->closing = true;
  while ((r = m->held.head)) {
    list_unlink(&m->held, r);
    rec_queue(m, r, -ECANCELED, 0);
  }
  if (m->child_armed)
    m->child->ops->disarm(m->child);
  m->child->ops->close(m->child);
  m->child = NULL;
  while (m->cq.head)
    deliver_queued(m);
  fault_free(m);
}

/* ---- introspection ---- */

int prov_fault_events(prov_t *p, prov_fault_event_t *out, int max) {
  struct fault_ep *m;
  uint64_t have, k;

  if (!is_fault(p) || max < 0 || (max && !out))
    return -EINVAL;
  m = to_fault(p);
  have = m->stats.events < PROV_FAULT_JOURNAL ? m->stats.events : PROV_FAULT_JOURNAL;
  k = have < (uint64_t)max ? have : (uint64_t)max;
  for (uint64_t i = 0; i < k; i++)
    out[i] = m->journal[(m->stats.events - k + i) % PROV_FAULT_JOURNAL];
  return (int)k;
}

int prov_fault_stats(prov_t *p, prov_fault_stats_t *out) {
  if (!is_fault(p) || !out)
    return -EINVAL;
  *out = to_fault(p)->stats;
  return 0;
}

prov_t *prov_fault_child(prov_t *p) {
  return is_fault(p) ? to_fault(p)->child : NULL;
}

int prov_fault_stall(prov_t *p, double seconds) {
  struct fault_ep *m;

  if (!is_fault(p) || !(seconds >= 0.0) || seconds > FAULT_STALL_S_MAX)
    return -EINVAL;
  m = to_fault(p);
  m->stall_until = seconds > 0.0 ? now_ns() + (uint64_t)(seconds * 1e9) : 0;
  m->stats.stall++;
  if (seconds > 0.0)
    journal(m, FAULT_STALL, -1, 0, "frozen for %.3f s", seconds);
  else
    journal(m, FAULT_STALL, -1, 0, "stall ended");
  return 0;
}

static int fault_reap(prov_t *p) {
  prov_t *c = to_fault(p)->child;
  return c && c->ops->reap ? c->ops->reap(c) : 0;
}

static int fault_settle(prov_t *p, double timeout_s) {
  prov_t *c = enter(to_fault(p));
  return c->ops->settle ? c->ops->settle(c, timeout_s) : 0;
}

static int fault_drop_peer(prov_t *p, int peer) {
  prov_t *c = enter(to_fault(p));
  return c->ops->drop_peer ? c->ops->drop_peer(c, peer) : 0;
}

/* From a thread outside the transport: the child as it is (no enter). */
static int fault_unwedge(prov_t *p) {
  prov_t *c = to_fault(p)->child;
  return c->ops->unwedge ? c->ops->unwedge(c) : 0;
}

/* The same table twice but for release(): see fault_ops_no_release's use. */
#define FAULT_OPS(release_fn)                                                                      \
  {                                                                                                \
    .size = sizeof(prov_ops_t), .name = "fault", .open = fault_open, .getname = fault_getname,     \
    .add_peers = fault_add_peers, .post_send = fault_post_send, .post_recv = fault_post_recv,      \
    .cancel = fault_cancel, .progress = fault_progress, .wait_fd = fault_wait_fd,                  \
    .arm = fault_arm, .disarm = fault_disarm, .max_posted = fault_max_posted,                      \
    .close = fault_close, .release = release_fn, .reap = fault_reap, .settle = fault_settle,       \
    .drop_peer = fault_drop_peer, .unwedge = fault_unwedge,                                        \
  }

const prov_ops_t prov_fault_ops = FAULT_OPS(fault_release);
static const prov_ops_t fault_ops_no_release = FAULT_OPS(NULL);
