/*
 * prov_multi.c - two transports side by side, each peer routed to one:
 * the first for the ranks of this rank's host, the second for the others.
 * Opened by a name "A+B" ("shm+tcp") with cfg->host_of.
 *
 *   ranks      0 1 2 3 4 5          host_of  0 0 0 1 1 1   (we are rank 1)
 *   child 0    A: 3 ranks {0,1,2}    peers 0,1,2 -> A as 0,1,2
 *   child 1    B: all 6 ranks        peers 3,4,5 -> B as 3,4,5
 *
 * Child A is opened for the ranks of our host only (renumbered 0..k-1), so
 * it can not reach another host even by mistake; child B is opened for
 * every rank, as the engine numbers them, and is used for the other hosts.
 * A child is not opened when it would have no peer (a host of one rank; a
 * job on one host).
 *
 * Address (getname): magic, the two children's lengths, their addresses.
 *
 * Waiting: wait_fd() is an epoll set over both children's wait fds (or the
 * one child's fd itself); when a child has none, -1 (the owner sleeps on a
 * timer). arm() arms both, so either child's completion wakes the owner.
 *
 * Completions come straight from the children (the caller's prov_op goes
 * down unchanged); a child marks the op as its own (PROV_OP_OWNER), which
 * is how cancel() and release() find it again.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "prov_internal.h"

#define MULTI_ADDR_MAGIC 0x43484d55u /* "CHMU" */
#define MULTI_ADDR_MAX 1024
#define MULTI_NAME_MAX 64

struct multi_child {
  prov_t *p; /* NULL when not opened */
  int nranks;
  uint64_t sends, send_bytes, recvs;
};

struct multi_ep {
  prov_t base;
  int rank, nranks;
  int host; /* ours */
  char name[MULTI_NAME_MAX];
  char child_name[2][MULTI_NAME_MAX];
  char errmsg[256];
  struct multi_child child[2];
  int *host_of;       /* [nranks], a copy */
  unsigned char *via; /* [nranks]: child carrying traffic with the peer */
  int *index;         /* [nranks]: the peer's number in that child */
  bool peers_added;
  int epfd; /* epoll set over both children's fds, or -1 */
  int wfd;  /* what wait_fd() answers */
  unsigned char addr[MULTI_ADDR_MAX];
  size_t addrlen;
};

static struct multi_ep *to_multi(prov_t *p) {
  return PROV_CONTAINER_OF(p, struct multi_ep, base);
}

static void multi_seterr(struct multi_ep *m, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void multi_seterr(struct multi_ep *m, const char *fmt, ...) {
  va_list ap;
  int n = snprintf(m->errmsg, sizeof(m->errmsg), "multi %s rank %d: ", m->name, m->rank);

  m->base.last_error = m->errmsg;
  if (n < 0 || (size_t)n >= sizeof(m->errmsg))
    return;
  va_start(ap, fmt);
  vsnprintf(m->errmsg + n, sizeof(m->errmsg) - (size_t)n, fmt, ap);
  va_end(ap);
}

/* A failure inside a child is best told in the child's words: last_error
 * follows the child that was last called, so a done callback that got an
 * error reads the right one. */
static prov_t *multi_enter(struct multi_ep *m, int i) {
  prov_t *c = m->child[i].p;

  m->base.last_error = c->last_error;
  return c;
}

/* ---- open ---- */

static int multi_split_name(const char *name, char (*out)[MULTI_NAME_MAX]) {
  const char *plus = strchr(name, '+');
  size_t a = plus ? (size_t)(plus - name) : 0, b = plus ? strlen(plus + 1) : 0;

  if (!plus || !a || !b || a >= MULTI_NAME_MAX || b >= MULTI_NAME_MAX || strchr(plus + 1, '+'))
    return -EINVAL;
  memcpy(out[0], name, a);
  out[0][a] = '\0';
  memcpy(out[1], plus + 1, b + 1);
  return 0;
}

static int multi_open_wait(struct multi_ep *m, char *errbuf, size_t errlen) {
  int fds[2], n = 0;

  for (int i = 0; i < 2; i++) {
    if (!m->child[i].p)
      continue;
    fds[n] = m->child[i].p->ops->wait_fd(m->child[i].p);
    if (fds[n] < 0) {
      m->wfd = -1; /* a child that can not wake us: the owner polls on a timer */
      return 0;
    }
    n++;
  }
  if (n == 1) {
    m->wfd = fds[0];
    return 0;
  }
  m->epfd = epoll_create1(EPOLL_CLOEXEC);
  if (m->epfd < 0)
    goto out_errno;
  for (int i = 0; i < n; i++) {
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};

    if (epoll_ctl(m->epfd, EPOLL_CTL_ADD, fds[i], &ev))
      goto out_close;
  }
  m->wfd = m->epfd;
  return 0;

out_close:
  close(m->epfd);
  m->epfd = -1;
out_errno:
  prov_errf(errbuf, errlen, "multi %s: wait set: %s", m->name, strerror(errno));
  return -errno;
}

static int multi_build_addr(struct multi_ep *m, char *errbuf, size_t errlen) {
  uint32_t magic = MULTI_ADDR_MAGIC;
  size_t off = 8;
  uint16_t lens[2] = {0, 0};

  for (int i = 0; i < 2; i++) {
    size_t len = sizeof(m->addr) - off;
    int rc;

    if (!m->child[i].p)
      continue;
    rc = m->child[i].p->ops->getname(m->child[i].p, m->addr + off, &len);
    if (rc) {
      prov_errf(errbuf, errlen, "multi %s: getname of %s: %s", m->name, m->child_name[i],
                strerror(-rc));
      return rc;
    }
    lens[i] = (uint16_t)len;
    off += len;
  }
  memcpy(m->addr, &magic, 4);
  memcpy(m->addr + 4, &lens[0], 2);
  memcpy(m->addr + 6, &lens[1], 2);
  m->addrlen = off;
  return 0;
}

static void multi_free(struct multi_ep *m) {
  for (int i = 0; i < 2; i++)
    if (m->child[i].p)
      m->child[i].p->ops->close(m->child[i].p);
  if (m->epfd >= 0)
    close(m->epfd);
  free(m->host_of);
  free(m->via);
  free(m->index);
  free(m);
}

static int multi_open(const prov_config_t *cfg, prov_t **out, char *errbuf, size_t errlen) {
  char cerr[512] = "";
  struct multi_ep *m;
  int lsize = 0, lrank = 0, rc;

  if (out)
    *out = NULL;
  if (!cfg || !out || !cfg->name || cfg->nranks <= 0 || cfg->rank < 0 || cfg->rank >= cfg->nranks) {
    prov_errf(errbuf, errlen, "multi: bad configuration");
    return -EINVAL;
  }
  if (!cfg->host_of) {
    prov_errf(errbuf, errlen, "multi %s: no host map (prov_config.host_of) given", cfg->name);
    return -EINVAL;
  }
  m = calloc(1, sizeof(*m));
  if (!m) {
    prov_errf(errbuf, errlen, "multi: out of memory");
    return -ENOMEM;
  }
  m->epfd = m->wfd = -1;
  m->rank = cfg->rank;
  m->nranks = cfg->nranks;
  m->base.ops = &prov_multi_ops;
  m->base.name = m->name;
  m->base.last_error = m->errmsg;
  snprintf(m->name, sizeof(m->name), "%s", cfg->name);
  if (multi_split_name(cfg->name, m->child_name)) {
    prov_errf(errbuf, errlen,
              "multi: \"%s\" is not a pair of providers \"inside+between\" (e.g. shm+tcp)",
              cfg->name);
    rc = -EINVAL;
    goto out_free;
  }
  m->host_of = malloc((size_t)m->nranks * sizeof(*m->host_of));
  m->via = malloc((size_t)m->nranks);
  m->index = malloc((size_t)m->nranks * sizeof(*m->index));
  if (!m->host_of || !m->via || !m->index) {
    prov_errf(errbuf, errlen, "multi: out of memory");
    rc = -ENOMEM;
    goto out_free;
  }
  memcpy(m->host_of, cfg->host_of, (size_t)m->nranks * sizeof(*m->host_of));
  m->host = m->host_of[m->rank];
  for (int r = 0; r < m->nranks; r++) {
    if (m->host_of[r] != m->host)
      continue;
    if (r == m->rank)
      lrank = lsize;
    lsize++;
  }

  /* child 0 inside the host, child 1 between hosts: only those with a peer */
  if (lsize > 1 || m->nranks == 1) {
    prov_config_t c0 = {.name = m->child_name[0],
                        .rank = lrank,
                        .nranks = lsize,
                        .job_id = cfg->job_id,
                        .shm_bounce = cfg->shm_bounce,
                        .iface = cfg->iface,
                        .sock_addr = cfg->sock_addr,
                        .log = cfg->log,
                        .log_arg = cfg->log_arg,
                        .sock_sndbuf = cfg->sock_sndbuf};

    rc = prov_open(&c0, &m->child[0].p, cerr, sizeof(cerr));
    if (rc) {
      prov_errf(errbuf, errlen, "multi %s: opening %s for the %d ranks of host %d: %s", m->name,
                m->child_name[0], lsize, m->host, cerr);
      goto out_free;
    }
    m->child[0].nranks = lsize;
  }
  if (lsize < m->nranks) {
    prov_config_t c1 = {.name = m->child_name[1],
                        .rank = m->rank,
                        .nranks = m->nranks,
                        .job_id = cfg->job_id,
                        .shm_bounce = cfg->shm_bounce,
                        .iface = cfg->iface,
                        .sock_addr = cfg->sock_addr,
                        .log = cfg->log,
                        .log_arg = cfg->log_arg,
                        .sock_sndbuf = cfg->sock_sndbuf};

    rc = prov_open(&c1, &m->child[1].p, cerr, sizeof(cerr));
    if (rc) {
      prov_errf(errbuf, errlen, "multi %s: opening %s between hosts: %s", m->name, m->child_name[1],
                cerr);
      goto out_free;
    }
    m->child[1].nranks = m->nranks;
  }
  for (int r = 0, l = 0; r < m->nranks; r++) {
    if (m->host_of[r] == m->host && m->child[0].p) {
      m->via[r] = 0;
      m->index[r] = l++;
    } else {
      m->via[r] = 1;
      m->index[r] = r;
    }
  }
  if ((rc = multi_open_wait(m, errbuf, errlen)) || (rc = multi_build_addr(m, errbuf, errlen)))
    goto out_free;
  *out = &m->base;
  return 0;

out_free:
  multi_free(m);
  return rc;
}

/* ---- peers ---- */

static int multi_getname(prov_t *p, void *addr, size_t *len) {
  struct multi_ep *m = to_multi(p);

  return prov_copy_name(m->addr, m->addrlen, addr, len);
}

/* Splits a peer's address into its two parts (len 0: that child absent). */
static int multi_parse(const void *addr, size_t len, const unsigned char **part, size_t *plen) {
  const unsigned char *a = addr;
  uint32_t magic;
  uint16_t l0, l1;

  if (!a || len < 8)
    return -EINVAL;
  memcpy(&magic, a, 4);
  memcpy(&l0, a + 4, 2);
  memcpy(&l1, a + 6, 2);
  if (magic != MULTI_ADDR_MAGIC || (size_t)8 + l0 + l1 != len)
    return -EINVAL;
  part[0] = a + 8;
  plen[0] = l0;
  part[1] = a + 8 + l0;
  plen[1] = l1;
  return 0;
}

int prov_multi_test_addr_parse(const void *addr, size_t len, const unsigned char **part,
                               size_t *plen) {
  return multi_parse(addr, len, part, plen);
}

static int multi_add_peers(prov_t *p, const void *const *addrs, const size_t *lens, int n) {
  struct multi_ep *m = to_multi(p);
  const void **sub[2] = {NULL, NULL};
  size_t *sublen[2] = {NULL, NULL};
  int rc = 0, r;

  if (m->peers_added) {
    multi_seterr(m, "add_peers called twice");
    return -EALREADY;
  }
  if (n != m->nranks || !addrs || !lens) {
    multi_seterr(m, "add_peers got %d addresses for %d ranks", n, m->nranks);
    return -EINVAL;
  }
  for (int i = 0; i < 2; i++) {
    if (!m->child[i].p)
      continue;
    sub[i] = calloc((size_t)m->child[i].nranks, sizeof(*sub[i]));
    sublen[i] = calloc((size_t)m->child[i].nranks, sizeof(*sublen[i]));
    if (!sub[i] || !sublen[i]) {
      rc = -ENOMEM;
      multi_seterr(m, "out of memory");
      goto out_free;
    }
  }
  for (r = 0; r < n; r++) {
    const unsigned char *part[2];
    size_t plen[2];

    if (multi_parse(addrs[r], lens[r], part, plen)) {
      multi_seterr(m, "address of rank %d is not a chorus %s address", r, m->name);
      rc = -EINVAL;
      goto out_free;
    }
    for (int i = 0; i < 2; i++) {
      int k;

      if (!m->child[i].p)
        continue;
      if (i == 0 && m->host_of[r] != m->host)
        continue;
      k = i == 0 ? m->index[r] : r;
      if (!plen[i]) {
        multi_seterr(m, "rank %d (host %d) has no %s address", r, m->host_of[r], m->child_name[i]);
        rc = -EINVAL;
        goto out_free;
      }
      sub[i][k] = part[i];
      sublen[i][k] = plen[i];
    }
  }
  for (int i = 0; i < 2; i++) {
    if (!m->child[i].p)
      continue;
    rc = m->child[i].p->ops->add_peers(m->child[i].p, sub[i], sublen[i], m->child[i].nranks);
    if (rc) {
      multi_seterr(m, "%s: %s", m->child_name[i], m->child[i].p->last_error);
      goto out_free;
    }
  }
  m->peers_added = true;

out_free:
  for (int i = 0; i < 2; i++) {
    free(sub[i]);
    free(sublen[i]);
  }
  return rc;
}

/* ---- data ---- */

static int multi_post_send(prov_t *p, int peer, const void *buf, size_t len, uint64_t tag,
                           prov_op_t *op) {
  struct multi_ep *m = to_multi(p);
  int rc;

  if (!m->peers_added || peer < 0 || peer >= m->nranks)
    return -EINVAL;
  int i = m->via[peer];
  prov_t *c = multi_enter(m, i);
  rc = c->ops->post_send(c, m->index[peer], buf, len, tag, op);
  if (!rc) {
    m->child[i].sends++;
    m->child[i].send_bytes += len;
  }
  return rc;
}

static int multi_post_recv(prov_t *p, int peer, void *buf, size_t len, uint64_t tag,
                           prov_op_t *op) {
  struct multi_ep *m = to_multi(p);
  int rc;

  if (!m->peers_added || peer < 0 || peer >= m->nranks)
    return -EINVAL;
  int i = m->via[peer];
  prov_t *c = multi_enter(m, i);
  rc = c->ops->post_recv(c, m->index[peer], buf, len, tag, op);
  if (!rc)
    m->child[i].recvs++;
  return rc;
}

/* The child that holds op (it marks ops it owns), or -1. */
static int multi_owner(struct multi_ep *m, const prov_op_t *op) {
  for (int i = 0; i < 2; i++)
    if (m->child[i].p && op && op->internal[PROV_OP_OWNER] == m->child[i].p)
      return i;
  return -1;
}

static int multi_cancel(prov_t *p, prov_op_t *op) {
  struct multi_ep *m = to_multi(p);
  int i = multi_owner(m, op);

  if (i < 0)
    return -ENOENT;
  prov_t *c = multi_enter(m, i);
  return c->ops->cancel(c, op);
}

static int multi_drop_peer(prov_t *p, int peer) {
  struct multi_ep *m = to_multi(p);

  if (!m->peers_added || peer < 0 || peer >= m->nranks)
    return -EINVAL;
  int i = m->via[peer];
  prov_t *c = multi_enter(m, i);
  return c->ops->drop_peer ? c->ops->drop_peer(c, m->index[peer]) : 0;
}

/* From a thread outside the transport: the children as they are (no multi_enter). */
static int multi_unwedge(prov_t *p) {
  struct multi_ep *m = to_multi(p);
  int n = 0;
  for (int i = 0; i < 2; i++)
    if (m->child[i].p && m->child[i].p->ops->unwedge)
      n += m->child[i].p->ops->unwedge(m->child[i].p);
  return n;
}

static int multi_reap(prov_t *p) {
  struct multi_ep *m = to_multi(p);
  int n = 0;
  for (int i = 0; i < 2; i++)
    if (m->child[i].p && m->child[i].p->ops->reap)
      n += m->child[i].p->ops->reap(m->child[i].p);
  return n;
}

static int multi_settle(prov_t *p, double timeout_s) {
  struct multi_ep *m = to_multi(p);

  for (int i = 0; i < 2; i++) {
    prov_t *c = m->child[i].p;
    int rc = c && c->ops->settle ? c->ops->settle(c, timeout_s) : 0;
    if (rc) {
      multi_seterr(m, "%s: %s", m->child_name[i], c->last_error);
      return rc;
    }
  }
  return 0;
}

static void multi_release(prov_t *p, prov_op_t *op) {
  struct multi_ep *m = to_multi(p);
  int i = multi_owner(m, op);

  if (i < 0 || !m->child[i].p->ops->release)
    return;
  prov_t *c = multi_enter(m, i);
  c->ops->release(c, op);
}

static int multi_progress(prov_t *p) {
  struct multi_ep *m = to_multi(p);
  int n = 0, err = 0, err_child = -1;

  for (int i = 0; i < 2; i++) {
    if (!m->child[i].p)
      continue;
    prov_t *c = multi_enter(m, i);
    int rc = c->ops->progress(c);
    if (rc > 0)
      n += rc;
    else if (rc < 0 && !err) {
      err = rc;
      err_child = i;
    }
  }
  if (err_child >= 0)
    multi_enter(m, err_child);
  return n ? n : err;
}

static int multi_wait_fd(prov_t *p) {
  return to_multi(p)->wfd;
}

static int multi_arm(prov_t *p) {
  struct multi_ep *m = to_multi(p);

  for (int i = 0; i < 2; i++) {
    if (!m->child[i].p)
      continue;
    int rc = m->child[i].p->ops->arm(m->child[i].p);
    if (rc) {
      /* the one already armed must not stay armed while we do not sleep */
      for (int j = 0; j < i; j++)
        if (m->child[j].p)
          m->child[j].p->ops->disarm(m->child[j].p);
      return rc;
    }
  }
  return 0;
}

static void multi_disarm(prov_t *p) {
  struct multi_ep *m = to_multi(p);

  for (int i = 0; i < 2; i++)
    if (m->child[i].p)
      m->child[i].p->ops->disarm(m->child[i].p);
}

static size_t multi_max_posted(prov_t *p) {
  struct multi_ep *m = to_multi(p);
  size_t mp = SIZE_MAX;

  for (int i = 0; i < 2; i++)
    if (m->child[i].p) {
      size_t c = m->child[i].p->ops->max_posted(m->child[i].p);
      if (c < mp)
        mp = c;
    }
  return mp;
}

static void multi_close(prov_t *p) {
  multi_free(to_multi(p));
}

int prov_multi_stats(prov_t *p, prov_multi_stats_t *out) {
  if (!p || p->ops != &prov_multi_ops || !out)
    return -EINVAL;
  struct multi_ep *m = to_multi(p);
  memset(out, 0, sizeof(*out));
  for (int i = 0; i < 2; i++) {
    out->child_name[i] = m->child[i].p ? m->child[i].p->name : NULL;
    out->child_nranks[i] = m->child[i].nranks;
    out->sends[i] = m->child[i].sends;
    out->send_bytes[i] = m->child[i].send_bytes;
    out->recvs[i] = m->child[i].recvs;
  }
  return 0;
}

int prov_multi_route(prov_t *p, int peer) {
  if (!p || p->ops != &prov_multi_ops)
    return -1;
  struct multi_ep *m = to_multi(p);
  if (peer < 0 || peer >= m->nranks)
    return -1;
  return m->via[peer];
}

prov_t *prov_multi_child(prov_t *p, int which) {
  if (!p || p->ops != &prov_multi_ops || which < 0 || which > 1)
    return NULL;
  return to_multi(p)->child[which].p;
}

const prov_ops_t prov_multi_ops = {
    .size = sizeof(prov_ops_t),
    .name = "multi",
    .open = multi_open,
    .getname = multi_getname,
    .add_peers = multi_add_peers,
    .post_send = multi_post_send,
    .post_recv = multi_post_recv,
    .cancel = multi_cancel,
    .progress = multi_progress,
    .wait_fd = multi_wait_fd,
    .arm = multi_arm,
    .disarm = multi_disarm,
    .max_posted = multi_max_posted,
    .close = multi_close,
    .release = multi_release,
    .reap = multi_reap,
    .settle = multi_settle,
    .drop_peer = multi_drop_peer,
    .unwedge = multi_unwedge,
};
