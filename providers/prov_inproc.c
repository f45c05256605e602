/*
 * prov_inproc.c - every rank of a job inside one process.
 *
 * Used by unit tests and by simulations of thousands of ranks. The world owns
 * one slot per rank; a slot outlives the endpoints opened on it, so a message
 * sent to a rank that has not opened yet waits there.
 *
 *   world ── slot[r] { lock, ep, posted{(src,tag)->recv}, unexpected{(src,tag)->msg} }
 *
 *   post_send S->D, under the locks of S and D (taken in rank order):
 *     D.posted has (S,tag)   copy into the receive buffer; both complete
 *     else len <= EAGER_MAX  copy into a message parked in D.unexpected;
 *                            the send completes at once (like shm's inject)
 *     else                   the send itself waits in D.unexpected
 *                            (rendezvous); D's post_recv copies from the
 *                            sender's buffer and completes both
 *   post_recv mirrors it, under the locks of D and S.
 *
 * Completions are queued on the owning endpoint and delivered only by its
 * own progress(), so callbacks always run on the owner's thread. A record
 * (struct inproc_req) belongs to the endpoint that posted it, from post to
 * delivery; other threads touch it only while holding both slot locks.
 *
 * Memory per world is O(ranks): per slot a lock and two hash tables sized
 * by what is pending, never a per-pair array.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "prov_internal.h"

#define INPROC_EAGER_MAX 4096
#define INPROC_MAX_POSTED 1024
#define INPROC_CHUNK 64
#define INPROC_ADDR_MAGIC 0x43484950u /* "CHIP" */

enum inproc_kind { INPROC_RECV, INPROC_SEND, INPROC_EAGER };

enum inproc_state {
  INPROC_FREE,    /* in the owner's free list */
  INPROC_POSTED,  /* recv in its slot's posted table */
  INPROC_WAITING, /* rendezvous send in the destination's unexpected table */
  INPROC_QUEUED,  /* on the owner's completion queue */
};

struct inproc_ep;

struct inproc_req {
  struct inproc_req *hnext; /* chain in a slot table */
  struct inproc_req *cnext; /* completion queue, free list or chunk walk */
  prov_op_t *op;            /* NULL for an eager message */
  struct inproc_ep *owner;  /* endpoint that posted it; NULL for an eager message */
  int src, dst;             /* ranks */
  uint64_t tag;
  void *buf;      /* user buffer (a send's is only read) */
  size_t len;     /* buffer length; eager: bytes of data */
  size_t xfer;    /* bytes moved, reported to done() */
  size_t msg_len; /* recv: length of the matched message (truncation report) */
  uint64_t data;  /* send: its immediate data; recv: the matched message's */
  int status;
  unsigned char kind;
  unsigned char state; /* changed under the slot locks it depends on */
  bool live;           /* owner thread only: allocated, not yet delivered */
};

struct inproc_eager {
  struct inproc_req req;
  unsigned char data[];
};

struct inproc_chunk {
  struct inproc_chunk *next;
  struct inproc_req reqs[INPROC_CHUNK];
};

struct inproc_table {
  struct inproc_req **b; /* buckets; FIFO chains so equal keys match in order */
  size_t nb;             /* power of two, 0 until first insert */
  size_t count;
};

struct inproc_slot {
  pthread_mutex_t lock;
  struct inproc_ep *ep;           /* open endpoint of this rank, NULL if none */
  struct inproc_table posted;     /* receives of ep waiting for their message */
  struct inproc_table unexpected; /* messages waiting for their receive */
};

struct prov_inproc_world {
  int nranks;
  struct inproc_slot slots[];
};

struct inproc_ep {
  prov_t base;
  prov_inproc_world_t *w;
  struct inproc_slot *slot;
  int rank;
  /* Under slot->lock: written by whichever thread completes an op. */
  struct inproc_req *cq_head, *cq_tail;
  bool armed;    /* owner may be asleep on efd */
  bool signaled; /* efd holds a count not yet read */
  int efd;       /* eventfd, created by the first wait_fd(); -1 before */
  /* Owner thread only. */
  struct inproc_req *free_list;
  struct inproc_chunk *chunks;
  size_t nsend, nrecv; /* posted, not yet delivered */
  bool closing;
  char errmsg[256];
};

/* ---- hash tables keyed by (source rank, tag) ---- */

static size_t key_hash(int src, uint64_t tag) {
  uint64_t x = tag ^ ((uint64_t)(uint32_t)src * 0x9e3779b97f4a7c15ull);

  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return (size_t)x;
}

static void chain_append(struct inproc_req **head, struct inproc_req *r) {
  r->hnext = NULL;
  while (*head)
    head = &(*head)->hnext;
  *head = r;
}

static int table_grow(struct inproc_table *t) {
  size_t nb = t->nb ? t->nb * 2 : 16;
  struct inproc_req **b = calloc(nb, sizeof(*b));
  size_t i;

  if (!b)
    return -ENOMEM;
  /* Walking old chains in order and appending keeps equal keys in FIFO order. */
  for (i = 0; i < t->nb; i++) {
    struct inproc_req *r = t->b[i], *next;

    for (; r; r = next) {
      next = r->hnext;
      chain_append(&b[key_hash(r->src, r->tag) & (nb - 1)], r);
    }
  }
  free(t->b);
  t->b = b;
  t->nb = nb;
  return 0;
}

static int table_append(struct inproc_table *t, struct inproc_req *r) {
  if (t->count >= t->nb) {
    int rc = table_grow(t);

    if (rc && !t->nb)
      return rc; /* a full table still works with longer chains */
  }
  chain_append(&t->b[key_hash(r->src, r->tag) & (t->nb - 1)], r);
  t->count++;
  return 0;
}

static struct inproc_req *table_take(struct inproc_table *t, int src, uint64_t tag) {
  struct inproc_req **pp, *r;

  if (!t->count)
    return NULL;
  for (pp = &t->b[key_hash(src, tag) & (t->nb - 1)]; (r = *pp); pp = &r->hnext) {
    if (r->src == src && r->tag == tag) {
      *pp = r->hnext;
      t->count--;
      return r;
    }
  }
  return NULL;
}

static bool table_remove(struct inproc_table *t, struct inproc_req *x) {
  struct inproc_req **pp, *r;

  if (!t->count)
    return false;
  for (pp = &t->b[key_hash(x->src, x->tag) & (t->nb - 1)]; (r = *pp); pp = &r->hnext) {
    if (r == x) {
      *pp = r->hnext;
      t->count--;
      return true;
    }
  }
  return false;
}

static void table_free_eager(struct inproc_table *t) {
  size_t i;

  for (i = 0; i < t->nb; i++) {
    struct inproc_req *r = t->b[i], *next;

    for (; r; r = next) {
      next = r->hnext;
      if (r->kind == INPROC_EAGER)
        free(PROV_CONTAINER_OF(r, struct inproc_eager, req));
    }
  }
  free(t->b);
  memset(t, 0, sizeof(*t));
}

/* ---- world ---- */

prov_inproc_world_t *prov_inproc_world_create(int nranks) {
  prov_inproc_world_t *w;
  int i;

  if (nranks <= 0)
    return NULL;
  w = calloc(1, sizeof(*w) + (size_t)nranks * sizeof(w->slots[0]));
  if (!w)
    return NULL;
  w->nranks = nranks;
  for (i = 0; i < nranks; i++) {
    if (pthread_mutex_init(&w->slots[i].lock, NULL))
      goto out_destroy_locks;
  }
  return w;

out_destroy_locks:
  while (i-- > 0)
    pthread_mutex_destroy(&w->slots[i].lock);
  free(w);
  return NULL;
}

/* Endpoints must be closed first; messages still parked are dropped. */
void prov_inproc_world_destroy(prov_inproc_world_t *w) {
  int i;

  if (!w)
    return;
  for (i = 0; i < w->nranks; i++) {
    table_free_eager(&w->slots[i].unexpected);
    free(w->slots[i].posted.b);
    pthread_mutex_destroy(&w->slots[i].lock);
  }
  free(w);
}

/* Locks one slot, or two in rank order so that two threads never deadlock. */
static void lock_pair(prov_inproc_world_t *w, int a, int b) {
  if (a == b) {
    pthread_mutex_lock(&w->slots[a].lock);
    return;
  }
  pthread_mutex_lock(&w->slots[a < b ? a : b].lock);
  pthread_mutex_lock(&w->slots[a < b ? b : a].lock);
}

static void unlock_pair(prov_inproc_world_t *w, int a, int b) {
  pthread_mutex_unlock(&w->slots[a].lock);
  if (a != b)
    pthread_mutex_unlock(&w->slots[b].lock);
}

/* ---- records and completions ---- */

static struct inproc_ep *to_ep(prov_t *p) {
  return PROV_CONTAINER_OF(p, struct inproc_ep, base);
}

static struct inproc_req *req_alloc(struct inproc_ep *ep) {
  struct inproc_req *r = ep->free_list;

  if (!r) {
    struct inproc_chunk *c = calloc(1, sizeof(*c));
    int i;

    if (!c)
      return NULL;
    c->next = ep->chunks;
    ep->chunks = c;
    for (i = INPROC_CHUNK - 1; i >= 0; i--) {
      c->reqs[i].cnext = ep->free_list;
      ep->free_list = &c->reqs[i];
    }
    r = ep->free_list;
  }
  ep->free_list = r->cnext;
  memset(r, 0, sizeof(*r));
  r->owner = ep;
  r->live = true;
  return r;
}

static void req_free(struct inproc_ep *ep, struct inproc_req *r) {
  r->live = false;
  r->state = INPROC_FREE;
  r->cnext = ep->free_list;
  ep->free_list = r;
}

/* Caller holds ep->slot->lock. Wakes the owner if it sleeps. */
static void cq_push(struct inproc_ep *ep, struct inproc_req *r) {
  r->state = INPROC_QUEUED;
  r->cnext = NULL;
  if (ep->cq_tail)
    ep->cq_tail->cnext = r;
  else
    ep->cq_head = r;
  ep->cq_tail = r;
  if (ep->armed && !ep->signaled && ep->efd >= 0) {
    uint64_t one = 1;

    /* Only fails if the counter would overflow: then it is readable anyway. */
    if (write(ep->efd, &one, sizeof(one)) == sizeof(one))
      ep->signaled = true;
  }
}

/* Copies a message into a receive; reports truncation like FI_ETRUNC. */
static void recv_fill(struct inproc_req *r, const void *data, size_t len, uint64_t imm) {
  size_t n = len < r->len ? len : r->len;

  r->data = imm;
  if (n)
    memcpy(r->buf, data, n);
  r->xfer = n;
  r->msg_len = len;
  r->status = len > r->len ? -EMSGSIZE : 0;
}

/* ---- ops ---- */

static int inproc_open(const prov_config_t *cfg, prov_t **out, char *errbuf, size_t errlen) {
  prov_inproc_world_t *w = cfg ? cfg->inproc_world : NULL;
  struct inproc_ep *ep;
  struct inproc_slot *slot;

  if (out)
    *out = NULL;
  if (!cfg || !out || !w) {
    prov_errf(errbuf, errlen, "inproc: no world (cfg->inproc_world) given");
    return -EINVAL;
  }
  if (cfg->nranks != w->nranks || cfg->rank < 0 || cfg->rank >= w->nranks) {
    prov_errf(errbuf, errlen, "inproc: rank %d of %d does not fit a world of %d ranks", cfg->rank,
              cfg->nranks, w->nranks);
    return -EINVAL;
  }
  ep = calloc(1, sizeof(*ep));
  if (!ep) {
    prov_errf(errbuf, errlen, "inproc: out of memory");
    return -ENOMEM;
  }
  ep->base.ops = &prov_inproc_ops;
  ep->base.name = "inproc";
  ep->base.last_error = ep->errmsg;
  ep->w = w;
  ep->rank = cfg->rank;
  ep->efd = -1;
  slot = &w->slots[cfg->rank];
  ep->slot = slot;

  pthread_mutex_lock(&slot->lock);
  if (slot->ep) {
    pthread_mutex_unlock(&slot->lock);
    prov_errf(errbuf, errlen, "inproc: rank %d already has an open endpoint", cfg->rank);
    goto out_free_ep;
  }
  slot->ep = ep;
  pthread_mutex_unlock(&slot->lock);
  *out = &ep->base;
  return 0;

out_free_ep:
  free(ep);
  return -EBUSY;
}

struct inproc_addr {
  uint32_t magic;
  int32_t rank;
};

static int inproc_getname(prov_t *p, void *addr, size_t *len) {
  struct inproc_addr a = {INPROC_ADDR_MAGIC, to_ep(p)->rank};

  return prov_copy_name(&a, sizeof(a), addr, len);
}

static int inproc_add_peers(prov_t *p, const void *const *addrs, const size_t *lens, int n) {
  struct inproc_ep *ep = to_ep(p);
  int i;

  if (n != ep->w->nranks || !addrs || !lens) {
    snprintf(ep->errmsg, sizeof(ep->errmsg), "inproc: add_peers got %d of %d ranks", n,
             ep->w->nranks);
    return -EINVAL;
  }
  for (i = 0; i < n; i++) {
    struct inproc_addr a;

    if (lens[i] != sizeof(a) || !addrs[i])
      goto out_bad_addr;
    memcpy(&a, addrs[i], sizeof(a));
    if (a.magic != INPROC_ADDR_MAGIC || a.rank != i)
      goto out_bad_addr;
  }
  return 0;

out_bad_addr:
  snprintf(ep->errmsg, sizeof(ep->errmsg), "inproc: address of rank %d is not an inproc address",
           i);
  return -EINVAL;
}

static int check_post(struct inproc_ep *ep, int peer, size_t len, const void *buf, prov_op_t *op,
                      size_t posted) {
  if (ep->closing)
    return -ESHUTDOWN;
  if (!op || !op->done || peer < 0 || peer >= ep->w->nranks || (len && !buf))
    return -EINVAL;
  if (posted >= INPROC_MAX_POSTED)
    return -EAGAIN;
  return 0;
}

static int inproc_post_send(prov_t *p, int peer, const void *buf, size_t len, uint64_t tag,
                            prov_op_t *op) {
  struct inproc_ep *ep = to_ep(p);
  prov_inproc_world_t *w = ep->w;
  struct inproc_slot *dslot;
  struct inproc_req *r, *rv;
  int rc = check_post(ep, peer, len, buf, op, ep->nsend);

  if (rc)
    return rc;
  r = req_alloc(ep);
  if (!r)
    return -ENOMEM;
  r->kind = INPROC_SEND;
  r->op = op;
  r->src = ep->rank;
  r->dst = peer;
  r->tag = tag;
  r->buf = (void *)(uintptr_t)buf;
  r->len = len;
  r->data = op->data & ~PROV_DATA_VALID;
  op->internal[PROV_OP_OWNER] = p;
  op->internal[PROV_OP_REQ] = r;
  dslot = &w->slots[peer];

  lock_pair(w, ep->rank, peer);
  rv = table_take(&dslot->posted, ep->rank, tag);
  if (rv) {
    recv_fill(rv, buf, len, r->data);
    cq_push(rv->owner, rv);
    r->xfer = len;
    cq_push(ep, r);
  } else if (len <= INPROC_EAGER_MAX) {
    struct inproc_eager *m = malloc(sizeof(*m) + len);

    if (!m) {
      rc = -ENOMEM;
      goto out_unlock;
    }
    memset(&m->req, 0, sizeof(m->req));
    m->req.kind = INPROC_EAGER;
    m->req.src = ep->rank;
    m->req.dst = peer;
    m->req.tag = tag;
    m->req.len = len;
    m->req.data = r->data;
    if (len)
      memcpy(m->data, buf, len);
    rc = table_append(&dslot->unexpected, &m->req);
    if (rc) {
      free(m);
      goto out_unlock;
    }
    r->xfer = len;
    cq_push(ep, r);
  } else {
    r->state = INPROC_WAITING;
    rc = table_append(&dslot->unexpected, r);
    if (rc)
      goto out_unlock;
  }
  unlock_pair(w, ep->rank, peer);
  ep->nsend++;
  return 0;

out_unlock:
  unlock_pair(w, ep->rank, peer);
  op->internal[PROV_OP_OWNER] = NULL;
  req_free(ep, r);
  return rc;
}

static int inproc_post_recv(prov_t *p, int peer, void *buf, size_t len, uint64_t tag,
                            prov_op_t *op) {
  struct inproc_ep *ep = to_ep(p);
  prov_inproc_world_t *w = ep->w;
  struct inproc_eager *eager = NULL;
  struct inproc_req *r, *m;
  int rc = check_post(ep, peer, len, buf, op, ep->nrecv);

  if (rc)
    return rc;
  r = req_alloc(ep);
  if (!r)
    return -ENOMEM;
  r->kind = INPROC_RECV;
  r->op = op;
  r->src = peer;
  r->dst = ep->rank;
  r->tag = tag;
  r->buf = buf;
  r->len = len;
  op->internal[PROV_OP_OWNER] = p;
  op->internal[PROV_OP_REQ] = r;

  lock_pair(w, ep->rank, peer);
  m = table_take(&ep->slot->unexpected, peer, tag);
  if (!m) {
    r->state = INPROC_POSTED;
    rc = table_append(&ep->slot->posted, r);
    if (rc) {
      unlock_pair(w, ep->rank, peer);
      op->internal[PROV_OP_OWNER] = NULL;
      req_free(ep, r);
      return rc;
    }
  } else if (m->kind == INPROC_EAGER) {
    eager = PROV_CONTAINER_OF(m, struct inproc_eager, req);
    recv_fill(r, eager->data, m->len, m->data);
    cq_push(ep, r);
  } else {
    /* Rendezvous: the sender (rank `peer`, locked) is still waiting. */
    recv_fill(r, m->buf, m->len, m->data);
    m->xfer = m->len;
    cq_push(m->owner, m);
    cq_push(ep, r);
  }
  unlock_pair(w, ep->rank, peer);
  free(eager);
  ep->nrecv++;
  return 0;
}

static int inproc_cancel(prov_t *p, prov_op_t *op) {
  struct inproc_ep *ep = to_ep(p);
  struct inproc_req *r;
  int other;

  if (!op || op->internal[PROV_OP_OWNER] != p)
    return -ENOENT;
  r = op->internal[PROV_OP_REQ];
  other = r->kind == INPROC_RECV ? ep->rank : r->dst;
  lock_pair(ep->w, ep->rank, other);
  if (r->state == INPROC_POSTED && table_remove(&ep->slot->posted, r)) {
    r->status = -ECANCELED;
    cq_push(ep, r);
  } else if (r->state == INPROC_WAITING && table_remove(&ep->w->slots[r->dst].unexpected, r)) {
    r->status = -ECANCELED;
    cq_push(ep, r);
  }
  unlock_pair(ep->w, ep->rank, other);
  return 0;
}

static int inproc_progress(prov_t *p) {
  struct inproc_ep *ep = to_ep(p);
  struct inproc_req *r, *next;
  int n = 0;

  pthread_mutex_lock(&ep->slot->lock);
  r = ep->cq_head;
  ep->cq_head = ep->cq_tail = NULL;
  pthread_mutex_unlock(&ep->slot->lock);

  /* Only what was queued on entry: callbacks may post and complete more. */
  for (; r; r = next) {
    prov_op_t *op = r->op;
    int status = r->status;
    size_t xfer = r->xfer;

    next = r->cnext;
    if (r->kind == INPROC_RECV)
      op->data = status == -ECANCELED ? 0 : PROV_DATA_VALID | r->data;
    if (r->kind == INPROC_SEND)
      ep->nsend--;
    else
      ep->nrecv--;
    if (status == -EMSGSIZE)
      snprintf(ep->errmsg, sizeof(ep->errmsg),
               "inproc rank %d: message from rank %d tag %#llx truncated: %zu bytes into %zu",
               ep->rank, r->src, (unsigned long long)r->tag, r->msg_len, r->len);
    req_free(ep, r);
    op->internal[PROV_OP_OWNER] = NULL;
    op->internal[PROV_OP_REQ] = NULL;
    op->done(op, status, xfer);
    n++;
  }
  return n;
}

/* The eventfd is made on first use: a simulation of thousands of ranks
 * driven by one thread never asks, and so holds no descriptors. */
static int inproc_wait_fd(prov_t *p) {
  struct inproc_ep *ep = to_ep(p);
  int fd;

  if (ep->efd >= 0)
    return ep->efd;
  fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0)
    return -1;
  pthread_mutex_lock(&ep->slot->lock);
  ep->efd = fd;
  pthread_mutex_unlock(&ep->slot->lock);
  return fd;
}

static int inproc_arm(prov_t *p) {
  struct inproc_ep *ep = to_ep(p);
  int rc = 0;

  pthread_mutex_lock(&ep->slot->lock);
  if (ep->cq_head)
    rc = -EAGAIN;
  else
    ep->armed = true;
  pthread_mutex_unlock(&ep->slot->lock);
  return rc;
}

static void inproc_disarm(prov_t *p) {
  struct inproc_ep *ep = to_ep(p);
  uint64_t v;

  pthread_mutex_lock(&ep->slot->lock);
  ep->armed = false;
  if (ep->signaled) {
    /* EFD_NONBLOCK: a failed read only means nothing was left to read. */
    if (read(ep->efd, &v, sizeof(v)) < 0)
      v = 0;
    ep->signaled = false;
  }
  pthread_mutex_unlock(&ep->slot->lock);
}

static size_t inproc_max_posted(prov_t *p) {
  return INPROC_MAX_POSTED;
}

static void inproc_close(prov_t *p) {
  struct inproc_ep *ep = to_ep(p);
  prov_inproc_world_t *w = ep->w;
  struct inproc_slot *slot = ep->slot;
  struct inproc_chunk *c, *cnext;
  struct inproc_req *r;
  size_t b;
  int i;

  ep->closing = true;

  /* 1. Our receives. */
  pthread_mutex_lock(&slot->lock);
  for (b = 0; b < slot->posted.nb; b++) {
    struct inproc_req *next;

    for (r = slot->posted.b[b]; r; r = next) {
      next = r->hnext;
      r->status = -ECANCELED;
      cq_push(ep, r);
    }
    slot->posted.b[b] = NULL;
  }
  slot->posted.count = 0;
  pthread_mutex_unlock(&slot->lock);

  /* 2. Our rendezvous sends parked at their destinations. */
  for (c = ep->chunks; c; c = c->next) {
    for (i = 0; i < INPROC_CHUNK; i++) {
      r = &c->reqs[i];
      if (r->kind != INPROC_SEND || !r->live)
        continue;
      lock_pair(w, ep->rank, r->dst);
      if (r->state == INPROC_WAITING && table_remove(&w->slots[r->dst].unexpected, r)) {
        r->status = -ECANCELED;
        cq_push(ep, r);
      }
      unlock_pair(w, ep->rank, r->dst);
    }
  }

  /* 3. Detach. Messages parked for this rank (eager copies, other ranks'
   * rendezvous sends) stay in the slot for its next endpoint, as they do
   * before the first one opens. */
  pthread_mutex_lock(&slot->lock);
  slot->ep = NULL;
  pthread_mutex_unlock(&slot->lock);

  /* 4. Nothing of ours is reachable by other threads now: deliver. */
  while (inproc_progress(p) > 0)
    ;

  if (ep->efd >= 0)
    close(ep->efd);
  for (c = ep->chunks; c; c = cnext) {
    cnext = c->next;
    free(c);
  }
  free(ep);
}

const prov_ops_t prov_inproc_ops = {
    .size = sizeof(prov_ops_t),
    .name = "inproc",
    .open = inproc_open,
    .getname = inproc_getname,
    .add_peers = inproc_add_peers,
    .post_send = inproc_post_send,
    .post_recv = inproc_post_recv,
    .cancel = inproc_cancel,
    .progress = inproc_progress,
    .wait_fd = inproc_wait_fd,
    .arm = inproc_arm,
    .disarm = inproc_disarm,
    .max_posted = inproc_max_posted,
    .close = inproc_close,
};
