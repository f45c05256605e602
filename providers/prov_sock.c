/*
 * prov_sock.c - tagged messages over plain TCP sockets, one connection per
 * pair of ranks ("sock").
 *
 * Why it exists: over libfabric's tcp;ofi_rxm small collectives took about
 * twice as long as over Open MPI's TCP transport (rxm signals each
 * completion through a socket write and read, and sends three control
 * messages per rendezvous); over this transport they take what Open MPI's
 * do (docs/performance.md). A stream per pair with a
 * header per message, written from and read into the caller's buffers, is
 * what Open MPI, Gloo and NCCL's socket transport do; this is that.
 *
 * Wire: on connecting, the higher rank writes a hello (prov_sock_wire.h:
 * magic, job hash, its rank, the job's size); the lower rank accepts and
 * learns who it is. Then each message is a 40-byte header (struct
 * sock_hdr) and, for EAGER and DATA, its payload, in order, both ways:
 *
 *   EAGER  a message of up to SOCK_EAGER_MAX (64 KiB), sent at once;
 *   RTS    a larger one announced (tag, length, the sender's id); the
 *          receiver answers, once a receive matches it, with
 *   CTS    (the sender's id, the receiver's id), and the sender then writes
 *   DATA   the payload, read straight into that receive's buffer.
 *
 *   post_send   queued on the peer's connection; written at once when the
 *               queue was empty (sendmsg of header + payload, nonblocking);
 *               done when the kernel has taken the last byte (a rendezvous
 *               send: of its DATA). A CTS or DATA goes ahead of sends not
 *               yet begun (in their own order). One sendmsg writes as many
 *               queued messages as SOCK_TX_IOV holds; what the headers of
 *               one read ask for (CTSs, DATAs) is written together before
 *               the next read.
 *   receiving   headers are read into a staging buffer; a header is matched
 *               (source, tag, FIFO) against the posted receives: the payload
 *               goes straight into the receive's buffer (large remainders
 *               read there directly, with the next header in the same
 *               recvmsg; while a receive waits for its DATA the stage takes no
 *               more than that header), else into an unexpected message
 *               (past 4 KiB a pooled 64 KiB buffer) that a later post_recv
 *               copies out. While those hold 4 MiB and nothing is posted
 *               with the peer, its connection is not read: TCP holds the
 *               sender; it is read again when a receive finds nothing
 *               waiting for it, or once they are down to 2 MiB.
 *   progress    epoll_wait(0) over the listener and the connections, then
 *               the completions, in order, on the caller's thread; with
 *               completions queued and no receive in flight (sends that
 *               went at once), only those: the next round looks.
 *   waiting     wait_fd() is the epoll set itself: it is readable when a
 *               socket has data, a queued send can go on, or a peer
 *               connects. arm() refuses while completions are queued.
 *
 * A connection that fails (the peer died, reset, closed with our messages
 * outstanding) fails what is posted on it: receives from the peer with
 * -ECONNRESET, sends to it with -EPIPE, and later posts the same way.
 *
 * Interface: cfg->iface (the engine's CHORUS_SOCK_IFACE), else FI_TCP_IFACE,
 * names the network interface to listen on ("lo", "eth0"); neither set:
 * cfg->sock_addr (the engine's: 127.0.0.1 for a job on one host, else the
 * address this rank reached rank 0's rendezvous from), else the first IPv4
 * interface that is up and not loopback, else loopback.
 *
 * The door. The listener is only for the higher ranks of each pair: once
 * every one of them is connected (or lost) it is closed, and with it the
 * connections still waiting there. Until then, an accepted connection
 * must say its hello within SOCK_HELLO_TIMEOUT_S, and at most
 * SOCK_STRANGERS_MAX beyond the ranks still expected may wait for theirs:
 * past that the oldest that said nothing is dropped (a rank writes its
 * hello as soon as it is connected; it is read at the accept). Each
 * connection refused is logged (cfg->log) with the peer's address and why:
 * SOCK_LOG_BURST lines a SOCK_LOG_WINDOW_S window, then one line at the
 * window's end counts the rest. A timerfd in the epoll set wakes a sleeper
 * for the deadlines. Out of descriptors, the listener rests
 * SOCK_ACCEPT_REST_S instead of waking the sleeper over and over.
 *
 * Send buffer: a connection whose two ends have one address (two ranks of
 * this host) takes cfg->sock_sndbuf (the engine's CHORUS_SOCK_SNDBUF) as
 * SO_SNDBUF; others, or all when it is 0, the kernel's autotuning (see
 * conn_tune).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <stdarg.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "prov_internal.h"
#include "prov_sock_wire.h"

#define SOCK_MAX_POSTED 512
#define SOCK_STAGE (64 * 1024) /* staging buffer per connection */
#define SOCK_DIRECT_MIN 8192   /* payload left above this is read in place */
#define SOCK_EVENTS 64
#define SOCK_TX_IOV 16 /* iovec entries one sendmsg writes (queued messages, 2 each) */
/* A connection stops being read while its unexpected messages hold this
 * much and nothing is posted with its peer (TCP then holds the sender). */
#define SOCK_UNEXP_MAX (4u << 20)
/* ... and is read again, once paused, when a receive finds no message
 * waiting for it, or those hold less than this (see sock_post_recv) */
#define SOCK_UNEXP_LOW (SOCK_UNEXP_MAX / 2)
#define SOCK_POOL_MAX 64            /* unexpected eager buffers kept for reuse (4 MiB) */
#define SOCK_POOL_MIN 4096          /* smaller unexpected messages get a buffer of their size */
#define SOCK_READ_BUDGET (4u << 20) /* bytes one connection reads per progress() */
#define SOCK_HELLO_TIMEOUT_S 5.0    /* an accepted connection says its hello within this */
#define SOCK_STRANGERS_MAX 32       /* waiting for a hello, beyond the ranks still expected */
#define SOCK_DROP_SCAN 16           /* the oldest looked at for one that said nothing */
#define SOCK_LOG_BURST 16           /* refusals logged one by one a window, then counted */
#define SOCK_LOG_WINDOW_S 10.0
#define SOCK_ACCEPT_REST_S 0.1 /* out of descriptors: the listener rests this long */

enum sock_where {
  W_NONE,
  W_POSTED,  /* receive, waiting for its message */
  W_CLAIM,   /* receive, waiting for the rest of an unexpected message */
  W_RX,      /* receive, its payload being read */
  W_RNDV_RX, /* receive, its CTS sent, waiting for the DATA */
  W_TXQ,     /* send (or a CTS) in the connection's queue */
  W_RNDV_TX, /* send, its RTS written, waiting for the CTS */
  W_CQ,      /* done, waiting for progress() to report it */
};

struct sock_umsg;

struct sock_req {
  struct sock_req *next;
  prov_op_t *op;
  int peer;
  bool is_send;
  unsigned char where; /* enum sock_where */
  uint64_t tag;
  unsigned char *buf;
  size_t len;
  size_t xfer, msg_len;
  uint64_t data;
  int status;
  struct sock_hdr hdr;     /* send: what goes first */
  struct sock_umsg *claim; /* recv: the unexpected message it waits for */
  uint64_t id;             /* rendezvous: this side's name for it */
  bool ctl;                /* a CTS of the transport's own (no op): freed once written */
};

/* A message that arrived before its receive. */
struct sock_umsg {
  struct sock_umsg *next;
  uint64_t tag, data;
  size_t len, got;
  struct sock_req *claimed; /* a receive waiting for the rest of it */
  unsigned char *buf;       /* NULL for an RTS: the payload is still with the sender */
  bool rts;
  bool pooled;     /* buf is room[]: SOCK_EAGER_MAX bytes, back to the pool when done */
  uint64_t cookie; /* RTS: the sender's id */
  unsigned char room[];
};

enum sock_fd_kind { FD_LISTEN, FD_PEER, FD_PENDING, FD_TIMER };

struct sock_fdent {
  int kind;
  int fd;
};

/* An accepted socket that has not said who it is yet. */
struct sock_pending {
  struct sock_fdent fe; /* fd -1: dropped, waiting in the graves for the end of progress() */
  struct sock_pending *next;
  size_t have;
  double deadline; /* its hello is due (sock_now()) */
  char peer[64];   /* "ip:port", for the log */
  struct sock_hello hello;
};

enum sock_cstate { C_IDLE, C_CONNECTING, C_WAIT_ACCEPT, C_UP, C_DEAD };

struct sock_conn {
  struct sock_fdent fe;
  int peer;
  int state;
  bool want_out;   /* EPOLLOUT wanted: a send waits for room */
  bool paused;     /* not reading: too much unexpected data and nothing to read for */
  bool kick;       /* resumed with messages in the stage: progress() parses them */
  uint32_t events; /* registered with epoll */
  /* tx */
  struct sock_hello hello;
  size_t hello_off; /* bytes of the hello written (connector) */
  bool hello_due;
  struct sock_req *txq, *txq_tail;
  size_t tx_off; /* bytes of the head (header + payload) written */
  bool tx_hold;  /* being read: tx_urgent queues, conn_read writes */
  bool tx_held;  /* tx_urgent queued while tx_hold */
  /* rx */
  struct sock_req *posted, *posted_tail;   /* receives from this peer, FIFO */
  struct sock_umsg *unexp, *unexp_tail;    /* arrived first, FIFO */
  size_t unexp_bytes;                      /* memory they hold (umsg_footprint) */
  struct sock_req *rndv_tx, *rndv_tx_tail; /* sends waiting for their CTS */
  struct sock_req *rndv_rx, *rndv_rx_tail; /* receives waiting for their DATA */
  unsigned char *stage;
  size_t st_pos, st_end;
  /* the message being read: into req (a receive) or umsg, or discarded */
  bool in_body;
  struct sock_req *rx_req;
  struct sock_umsg *rx_umsg;
  size_t rx_left; /* payload bytes still to come */
  size_t rx_keep; /* of those, how many land in the buffer (rest discarded) */
  unsigned char *rx_dst;
};

struct sock_ep {
  prov_t base;
  int rank, nranks;
  uint64_t job;
  int epfd;
  struct sock_fdent lfe; /* listener; -1 once every higher rank is connected */
  struct sock_fdent tfe; /* timerfd: the hellos' deadlines, the log's window; -1 with lfe */
  struct sockaddr_in me;
  char where[64];                              /* me as "ip:port", for the log */
  struct sock_conn *conns;                     /* [nranks] */
  struct sock_pending *pending, *pending_tail; /* waiting for their hello, oldest first */
  int npending;
  /* Dropped while progress() may still hold epoll events that point at
   * them: freed at its end. */
  struct sock_pending *graves;
  double accept_rest; /* out of descriptors: the listener is out of the set until then */
  /* the refusal log (door_refused) */
  void (*log)(void *arg, const char *line);
  void *log_arg;
  double log_since;   /* the window's start */
  int log_shown;      /* lines in this window */
  int log_hidden;     /* refusals counted, not shown */
  char log_last[256]; /* the latest of those */
  struct sock_req *cq, *cq_tail;
  size_t nsend, nrecv;
  uint64_t next_id; /* rendezvous ids */
  /* Unexpected eager messages reuse their buffers: fresh ones cost page
   * faults on every message of a stream that runs ahead of its receives. */
  struct sock_umsg *pool;
  int npool;
  bool peers_added, closing;
  bool kick;  /* a connection has kick set */
  int sndbuf; /* SO_SNDBUF inside the host (prov_config_t.sock_sndbuf), 0: the kernel's */
  prov_sock_stats_t stats;
  char errmsg[256];
};

static struct sock_ep *to_sock(prov_t *p) {
  return PROV_CONTAINER_OF(p, struct sock_ep, base);
}

static uint64_t job_hash(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;

  for (; s && *s; s++)
    h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

static void sock_seterr(struct sock_ep *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void sock_seterr(struct sock_ep *e, const char *fmt, ...) {
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(e->errmsg, sizeof(e->errmsg), fmt, ap);
  va_end(ap);
}

/* ---- completion queue ---- */

static void list_push(struct sock_req **head, struct sock_req **tail, struct sock_req *r) {
  r->next = NULL;
  if (*tail)
    (*tail)->next = r;
  else
    *head = r;
  *tail = r;
}

static void cq_push(struct sock_ep *e, struct sock_req *r, int status, size_t xfer) {
  r->status = status;
  r->xfer = xfer;
  r->where = W_CQ;
  list_push(&e->cq, &e->cq_tail, r);
}

/* Unlinks r from a singly linked list; true if it was there. */
static bool list_unlink(struct sock_req **head, struct sock_req **tail, struct sock_req *r) {
  struct sock_req *prev = NULL, *x;

  for (x = *head; x; prev = x, x = x->next) {
    if (x != r)
      continue;
    if (prev)
      prev->next = x->next;
    else
      *head = x->next;
    if (*tail == x)
      *tail = prev;
    x->next = NULL;
    return true;
  }
  return false;
}

/* ---- epoll ---- */

static int ep_ctl(struct sock_ep *e, int op, struct sock_fdent *fe, uint32_t events) {
  struct epoll_event ev = {.events = events, .data.ptr = fe};

  return epoll_ctl(e->epfd, op, fe->fd, &ev) ? -errno : 0;
}

/* Registers what c waits for. Nothing (paused, no send waiting): not in
 * the set at all, so that a peer's hang-up, which epoll reports whatever
 * the mask, does not wake a sleeper over and over; it is read on resume. */
static void conn_events(struct sock_ep *e, struct sock_conn *c) {
  uint32_t ev = (c->paused ? 0 : EPOLLIN) | (c->want_out ? EPOLLOUT : 0);
  int op = !c->events ? EPOLL_CTL_ADD : !ev ? EPOLL_CTL_DEL : EPOLL_CTL_MOD;

  if (c->fe.fd < 0 || ev == c->events)
    return;
  if (op == EPOLL_CTL_DEL ? epoll_ctl(e->epfd, op, c->fe.fd, NULL) == 0
                          : ep_ctl(e, op, &c->fe, ev) == 0)
    c->events = ev;
}

static void conn_want_out(struct sock_ep *e, struct sock_conn *c, bool on) {
  c->want_out = on;
  conn_events(e, c);
}

/* Something was posted with c's peer that needs its connection read: read
 * again. What the stage still holds is parsed by the next progress() (epoll
 * reports only what the socket has). */
static void conn_resume(struct sock_ep *e, struct sock_conn *c) {
  if (c->paused) {
    c->paused = false;
    conn_events(e, c);
    if (c->st_pos < c->st_end)
      c->kick = e->kick = true;
  }
}

/* ---- failure of a connection ---- */

/* An unexpected message of len bytes, its buffer included (none for an
 * RTS). NULL when out of memory. */
static struct sock_umsg *umsg_alloc(struct sock_ep *e, size_t len, bool with_buf) {
  struct sock_umsg *m;

  if (with_buf && len > SOCK_POOL_MIN && len <= SOCK_EAGER_MAX) {
    m = e->pool;
    if (m) {
      e->pool = m->next;
      e->npool--;
    } else if (!(m = malloc(sizeof(*m) + SOCK_EAGER_MAX))) {
      return NULL;
    }
    memset(m, 0, sizeof(*m));
    m->pooled = true;
    m->buf = m->room;
    return m;
  }
  m = calloc(1, sizeof(*m));
  if (m && with_buf && len && !(m->buf = malloc(len))) {
    free(m);
    return NULL;
  }
  return m;
}

/* What an unexpected message holds, for SOCK_UNEXP_MAX: a pooled buffer
 * whatever its length, else its length (an RTS: nothing). */
static size_t umsg_footprint(const struct sock_umsg *m) {
  return m->pooled ? SOCK_EAGER_MAX : m->buf ? m->len : 0;
}

static void umsg_free(struct sock_ep *e, struct sock_umsg *m) {
  if (m->pooled && e->npool < SOCK_POOL_MAX) {
    m->next = e->pool;
    e->pool = m;
    e->npool++;
    return;
  }
  if (!m->pooled)
    free(m->buf);
  free(m);
}

static void umsg_unlink(struct sock_conn *c, struct sock_umsg *m);

/* Fails everything posted on c (status for receives -ECONNRESET, sends
 * -EPIPE; or -ECANCELED when closing) and closes its socket. err 0: the
 * peer closed with nothing owed either way. Messages that had arrived
 * whole stay for the receives still to be posted. */
static void conn_fail(struct sock_ep *e, struct sock_conn *c, int err, bool cancel) {
  struct sock_req *r, *next;
  struct sock_umsg *m, *mnext;

  if (c->state != C_DEAD && !cancel && err)
    sock_seterr(e, "sock rank %d: connection with rank %d lost: %s", e->rank, c->peer,
                strerror(err));
  c->state = C_DEAD;
  if (c->fe.fd >= 0) {
    epoll_ctl(e->epfd, EPOLL_CTL_DEL, c->fe.fd, NULL);
    close(c->fe.fd);
    c->fe.fd = -1;
  }
  c->want_out = c->paused = false;
  c->events = 0;
  for (r = c->txq; r; r = next) {
    next = r->next;
    if (r->ctl)
      free(r);
    else
      cq_push(e, r, cancel ? -ECANCELED : -EPIPE, 0);
  }
  c->txq = c->txq_tail = NULL;
  for (r = c->rndv_tx; r; r = next) {
    next = r->next;
    cq_push(e, r, cancel ? -ECANCELED : -EPIPE, 0);
  }
  c->rndv_tx = c->rndv_tx_tail = NULL;
  for (r = c->rndv_rx; r; r = next) {
    next = r->next;
    cq_push(e, r, cancel ? -ECANCELED : -ECONNRESET, 0);
  }
  c->rndv_rx = c->rndv_rx_tail = NULL;
  c->tx_off = 0;
  c->hello_due = false;
  for (r = c->posted; r; r = next) {
    next = r->next;
    cq_push(e, r, cancel ? -ECANCELED : -ECONNRESET, 0);
  }
  c->posted = c->posted_tail = NULL;
  if (c->rx_req)
    cq_push(e, c->rx_req, cancel ? -ECANCELED : -ECONNRESET, 0);
  c->rx_req = NULL;
  /* messages that arrived whole stay for their receives (unless closing);
   * one cut off in the middle is gone */
  for (m = c->unexp; m; m = mnext) {
    mnext = m->next;
    if (!cancel && m->got == m->len)
      continue;
    if (m->claimed)
      cq_push(e, m->claimed, cancel ? -ECANCELED : -ECONNRESET, 0);
    umsg_unlink(c, m);
    umsg_free(e, m);
  }
  c->rx_umsg = NULL;
  c->in_body = false;
  free(c->stage);
  c->stage = NULL;
  c->st_pos = c->st_end = 0;
}

/* ---- sending ---- */

/* One nonblocking sendmsg of iov[0..n) on c: bytes written, or -1 when c
 * takes no more now (it then waits for room, or has failed). */
static ssize_t tx_send(struct sock_ep *e, struct sock_conn *c, struct iovec *iov, size_t n) {
  struct msghdr mh = {.msg_iov = iov, .msg_iovlen = n};
  ssize_t w;

  do
    w = sendmsg(c->fe.fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (w < 0 && errno == EINTR);
  if (w >= 0)
    return w;
  if (errno == EAGAIN || errno == EWOULDBLOCK)
    conn_want_out(e, c, true);
  else
    conn_fail(e, c, errno, false);
  return -1;
}

/* Bytes of r on the wire: its header and, for EAGER and DATA, its payload. */
static size_t tx_total(const struct sock_req *r) {
  return sizeof(r->hdr) + (r->hdr.type == H_EAGER || r->hdr.type == H_DATA ? r->len : 0);
}

/* r is all written: it leaves c's queue (the head) and goes where it waits
 * next. */
static void tx_done(struct sock_ep *e, struct sock_conn *c, struct sock_req *r) {
  c->tx_off = 0;
  c->txq = r->next;
  if (!c->txq)
    c->txq_tail = NULL;
  if (r->ctl) {
    free(r);
  } else if (r->hdr.type == H_RTS) {
    r->where = W_RNDV_TX;
    list_push(&c->rndv_tx, &c->rndv_tx_tail, r);
    conn_resume(e, c); /* its CTS must be read */
  } else {
    cq_push(e, r, 0, r->len);
  }
}

/* Writes what c's queue holds until the kernel takes no more: as many
 * queued messages as SOCK_TX_IOV entries hold go in one sendmsg (a
 * receiver's CTSs for several RTSs, a stream of small eager sends), the
 * head from where it was left. */
static void conn_flush(struct sock_ep *e, struct sock_conn *c) {
  if (c->state != C_UP)
    return;
  while (c->hello_due) {
    struct iovec v = {(char *)&c->hello + c->hello_off, sizeof(c->hello) - c->hello_off};
    ssize_t n = tx_send(e, c, &v, 1);

    if (n < 0)
      return;
    c->hello_off += (size_t)n;
    if (c->hello_off == sizeof(c->hello))
      c->hello_due = false;
  }
  while (c->txq) {
    struct iovec iov[SOCK_TX_IOV];
    size_t niov = 0, off = c->tx_off, n;
    ssize_t w;

    for (struct sock_req *r = c->txq; r && niov + 2 <= SOCK_TX_IOV; r = r->next, off = 0) {
      size_t total = tx_total(r), body = total - sizeof(r->hdr);

      if (off < sizeof(r->hdr)) {
        iov[niov++] = (struct iovec){(char *)&r->hdr + off, sizeof(r->hdr) - off};
        if (body)
          iov[niov++] = (struct iovec){r->buf, body};
      } else {
        iov[niov++] = (struct iovec){r->buf + (off - sizeof(r->hdr)), total - off};
      }
    }
    w = tx_send(e, c, iov, niov);
    if (w < 0)
      return;
    /* what was written completes messages from the head on */
    for (n = (size_t)w; c->txq && n >= tx_total(c->txq) - c->tx_off;) {
      n -= tx_total(c->txq) - c->tx_off;
      tx_done(e, c, c->txq);
    }
    c->tx_off += n;
  }
  conn_want_out(e, c, false);
}

/* ---- receiving ---- */

static struct sock_req *posted_take(struct sock_conn *c, uint64_t tag) {
  struct sock_req *r;

  for (r = c->posted; r; r = r->next) {
    if (r->tag == tag) {
      list_unlink(&c->posted, &c->posted_tail, r);
      return r;
    }
  }
  return NULL;
}

/* Copies an unexpected message into its receive and completes it. */
static void umsg_deliver(struct sock_ep *e, struct sock_req *r, struct sock_umsg *m) {
  size_t n = m->len < r->len ? m->len : r->len;

  if (n)
    memcpy(r->buf, m->buf, n);
  r->data = m->data;
  r->msg_len = m->len;
  cq_push(e, r, m->len > r->len ? -EMSGSIZE : 0, n);
}

static void umsg_unlink(struct sock_conn *c, struct sock_umsg *m) {
  struct sock_umsg *prev = NULL, *x;

  c->unexp_bytes -= umsg_footprint(m);

  for (x = c->unexp; x; prev = x, x = x->next) {
    if (x != m)
      continue;
    if (prev)
      prev->next = x->next;
    else
      c->unexp = x->next;
    if (c->unexp_tail == x)
      c->unexp_tail = prev;
    return;
  }
}

/* The current message's payload is all in. */
static void rx_finish(struct sock_ep *e, struct sock_conn *c) {
  if (c->rx_req) {
    struct sock_req *r = c->rx_req;

    cq_push(e, r, r->msg_len > r->len ? -EMSGSIZE : 0, c->rx_keep);
  } else if (c->rx_umsg) {
    struct sock_umsg *m = c->rx_umsg;

    m->got = m->len;
    if (m->claimed) {
      umsg_unlink(c, m);
      umsg_deliver(e, m->claimed, m);
      umsg_free(e, m);
    }
  }
  c->rx_req = NULL;
  c->rx_umsg = NULL;
  c->in_body = false;

  c->rx_left = c->rx_keep = 0;
  c->rx_dst = NULL;
}

/* Queues r to go next on c: after the head when the head is partly on the
 * wire, and after the CTSs and DATAs queued before it (a CTS or a DATA
 * should not wait behind other sends; among themselves they keep their
 * order). Written at once, unless c is being read (tx_hold): conn_read
 * writes what its headers queued together, before it reads again. */
static void tx_urgent(struct sock_ep *e, struct sock_conn *c, struct sock_req *r) {
  struct sock_req **at = &c->txq, *prev = NULL;

  r->where = W_TXQ;
  if (*at && c->tx_off) {
    prev = *at;
    at = &prev->next;
  }
  while (*at && ((*at)->ctl || (*at)->hdr.type == H_DATA)) {
    prev = *at;
    at = &prev->next;
  }
  r->next = *at;
  *at = r;
  if (c->txq_tail == prev)
    c->txq_tail = r;
  if (c->tx_hold)
    c->tx_held = true;
  else
    conn_flush(e, c);
}

/* A receive meets the RTS of its message: it will take the payload when
 * the DATA comes; the sender is told to send it. */
static void rndv_accept(struct sock_ep *e, struct sock_conn *c, struct sock_req *r, size_t len,
                        uint64_t data, uint64_t cookie) {
  struct sock_req *cts = calloc(1, sizeof(*cts));

  r->data = data;
  r->msg_len = len;
  r->id = ++e->next_id;
  if (!cts) {
    sock_seterr(e, "sock rank %d: out of memory for a CTS to rank %d", e->rank, c->peer);
    cq_push(e, r, -ENOMEM, 0);
    return;
  }
  r->where = W_RNDV_RX;
  list_push(&c->rndv_rx, &c->rndv_rx_tail, r);
  cts->ctl = true;
  cts->peer = c->peer;
  cts->hdr =
      (struct sock_hdr){.magic = SOCK_HDR_MAGIC, .type = H_CTS, .data = r->id, .cookie = cookie};
  tx_urgent(e, c, cts);
}

static struct sock_req *take_by_id(struct sock_req **head, struct sock_req **tail, uint64_t id) {
  struct sock_req *r;

  for (r = *head; r; r = r->next) {
    if (r->id == id) {
      list_unlink(head, tail, r);
      return r;
    }
  }
  return NULL;
}

static struct sock_umsg *umsg_new(struct sock_ep *e, struct sock_conn *c, const struct sock_hdr *h,
                                  bool with_buf) {
  struct sock_umsg *m = umsg_alloc(e, (size_t)h->len, with_buf);

  if (!m)
    return NULL;
  m->tag = h->tag;
  m->data = h->data;
  m->len = (size_t)h->len;
  c->unexp_bytes += umsg_footprint(m);
  if (c->unexp_tail)
    c->unexp_tail->next = m;
  else
    c->unexp = m;
  c->unexp_tail = m;
  return m;
}

/* A header is in: where does its payload go. 0, or -errno (bad stream). */
static int rx_header(struct sock_ep *e, struct sock_conn *c, const struct sock_hdr *h) {
  struct sock_req *r;

  if (h->magic != SOCK_HDR_MAGIC || h->len > (uint64_t)SIZE_MAX / 2 || h->type < H_EAGER ||
      h->type > H_DATA || (h->type == H_EAGER && h->len > SOCK_EAGER_MAX)) {
    sock_seterr(e, "sock rank %d: garbled stream from rank %d (header %#x type %u, length %llu)",
                e->rank, c->peer, h->magic, h->type, (unsigned long long)h->len);
    return -EPROTO;
  }
  if (h->type == H_RTS) {
    struct sock_umsg *m;

    r = posted_take(c, h->tag);
    if (r) {
      rndv_accept(e, c, r, (size_t)h->len, h->data, h->cookie);
      return 0;
    }
    m = umsg_new(e, c, h, false);
    if (!m)
      goto out_nomem;
    m->rts = true;
    m->cookie = h->cookie;
    m->got = m->len;
    return 0;
  }
  if (h->type == H_CTS) {
    r = take_by_id(&c->rndv_tx, &c->rndv_tx_tail, h->cookie);
    if (!r) {
      sock_seterr(e, "sock rank %d: rank %d cleared a send this rank does not have", e->rank,
                  c->peer);
      return -EPROTO;
    }
    r->hdr.type = H_DATA;
    r->hdr.tag = h->data;
    tx_urgent(e, c, r);
    return 0;
  }
  c->rx_left = (size_t)h->len;
  if (h->type == H_DATA) {
    r = take_by_id(&c->rndv_rx, &c->rndv_rx_tail, h->tag);
    if (!r || r->msg_len != h->len) {
      if (r) /* out of the list: it fails here, not with the connection */
        cq_push(e, r, -EPROTO, 0);
      sock_seterr(e, "sock rank %d: rank %d sent data no receive asked for", e->rank, c->peer);
      return -EPROTO;
    }
    r->where = W_RX;
    c->rx_req = r;
    c->rx_keep = r->len < h->len ? r->len : (size_t)h->len;
    c->rx_dst = r->buf;
  } else if ((r = posted_take(c, h->tag))) {
    r->where = W_RX;
    r->data = h->data;
    r->msg_len = (size_t)h->len;
    c->rx_req = r;
    c->rx_keep = r->len < h->len ? r->len : (size_t)h->len;
    c->rx_dst = r->buf;
  } else {
    struct sock_umsg *m = umsg_new(e, c, h, true);

    if (!m)
      goto out_nomem;
    c->rx_umsg = m;
    c->rx_keep = m->len;
    c->rx_dst = m->buf;
  }
  c->in_body = true;
  if (!c->rx_left)
    rx_finish(e, c);
  return 0;

out_nomem:
  sock_seterr(e, "sock rank %d: out of memory for a %llu-byte message from rank %d", e->rank,
              (unsigned long long)h->len, c->peer);
  return -ENOMEM;
}

/* n payload bytes at src for the current message. */
static void rx_take(struct sock_ep *e, struct sock_conn *c, const unsigned char *src, size_t n) {
  size_t done = (c->rx_umsg ? c->rx_umsg->len : c->rx_req->msg_len) - c->rx_left;

  if (done < c->rx_keep) {
    size_t k = c->rx_keep - done < n ? c->rx_keep - done : n;

    memcpy(c->rx_dst + done, src, k);
  }
  c->rx_left -= n;
  if (c->rx_umsg)
    c->rx_umsg->got += n;
  if (!c->rx_left)
    rx_finish(e, c);
}

/* Between messages, with SOCK_UNEXP_MAX held by unexpected ones and
 * nothing posted with the peer: nobody waits for what comes next, so the
 * connection is not read (TCP holds the sender) until a post (conn_resume). */
static bool conn_pause_if_full(struct sock_ep *e, struct sock_conn *c) {
  if (c->in_body || c->unexp_bytes < SOCK_UNEXP_MAX || c->posted || c->rndv_tx || c->rndv_rx)
    return false;
  c->paused = true;
  e->stats.pauses++;
  conn_events(e, c);
  return true;
}

/* Consumes what the stage holds: payload, headers. false: stop reading
 * (paused, or the connection failed). */
static bool stage_parse(struct sock_ep *e, struct sock_conn *c) {
  while (c->st_pos < c->st_end && c->state == C_UP) {
    size_t avail = c->st_end - c->st_pos;
    struct sock_hdr h;
    int rc;

    if (c->in_body) {
      size_t k = avail < c->rx_left ? avail : c->rx_left;

      rx_take(e, c, c->stage + c->st_pos, k);
      c->st_pos += k;
      continue;
    }
    if (conn_pause_if_full(e, c))
      return false;
    if (avail < sizeof(struct sock_hdr))
      break;
    memcpy(&h, c->stage + c->st_pos, sizeof(h));
    c->st_pos += sizeof(h);
    rc = rx_header(e, c, &h);
    if (rc) {
      conn_fail(e, c, -rc, false);
      return false;
    }
  }
  if (c->st_pos == c->st_end)
    c->st_pos = c->st_end = 0;
  return c->state == C_UP && !conn_pause_if_full(e, c);
}

/* What the stage reads next when it is empty and body bytes of the current
 * payload come through it first: when a receive waits for its DATA, no more
 * than those and the next header (a DATA's payload then goes straight to
 * its buffer, not through the stage); else all it holds. */
static size_t stage_want(const struct sock_conn *c, size_t body) {
  size_t upto = sizeof(struct sock_hdr) + body;

  return c->rndv_rx && upto < SOCK_STAGE ? upto : SOCK_STAGE;
}

/* Writes what tx_urgent queued while c was being read (tx_held). */
static void tx_release(struct sock_ep *e, struct sock_conn *c) {
  if (c->tx_held) {
    c->tx_held = false;
    conn_flush(e, c);
  }
}

static void conn_read_some(struct sock_ep *e, struct sock_conn *c) {
  unsigned char scratch[4096];
  size_t budget = SOCK_READ_BUDGET;
  /* A read that returned less than it asked for emptied the socket: the next
   * one would only say EAGAIN, a system call for nothing. What arrives later makes the fd readable
   * again. */
  bool drained = false;

  if (!c->stage && !(c->stage = malloc(SOCK_STAGE))) {
    conn_fail(e, c, ENOMEM, false);
    return;
  }
  while (c->state == C_UP) {
    ssize_t n;

    /* what the stage holds is parsed before any return: a read can bring
     * the next header with a payload, and the socket may say nothing more
     * (its sender waits for the CTS that header asks for) */
    if (!stage_parse(e, c) || drained || !budget)
      return;
    /* the CTSs (and DATAs) the parsed headers queued, in one write */
    tx_release(e, c);
    if (c->state != C_UP)
      return;
    if (c->in_body && c->rx_left >= SOCK_DIRECT_MIN && c->st_pos == c->st_end) {
      /* read the payload where it belongs; where that is the rest of the
       * message, what follows it (the next header) comes into the stage in
       * the same call */
      size_t done = (c->rx_umsg ? c->rx_umsg->len : c->rx_req->msg_len) - c->rx_left;
      unsigned char *dst = done < c->rx_keep ? c->rx_dst + done : scratch;
      size_t want = done < c->rx_keep ? c->rx_keep - done : c->rx_left;
      struct iovec iov[2];
      struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 1};

      if (dst == scratch && want > sizeof(scratch))
        want = sizeof(scratch);
      iov[0] = (struct iovec){dst, want};
      c->st_pos = c->st_end = 0;
      if (want == c->rx_left) {
        iov[1] = (struct iovec){c->stage, stage_want(c, 0)};
        mh.msg_iovlen = 2;
      }
      n = recvmsg(c->fe.fd, &mh, MSG_DONTWAIT);
      if (n > 0) {
        size_t body = (size_t)n < want ? (size_t)n : want;

        drained = (size_t)n < want + (mh.msg_iovlen == 2 ? iov[1].iov_len : 0);
        budget = (size_t)n < budget ? budget - (size_t)n : 0;
        c->rx_left -= body;
        if (c->rx_umsg)
          c->rx_umsg->got += body;
        c->st_end = (size_t)n - body;
        if (!c->rx_left)
          rx_finish(e, c);
        continue;
      }
    } else {
      size_t room;

      if (c->st_pos == c->st_end)
        c->st_pos = c->st_end = 0;
      else if (c->st_pos && SOCK_STAGE - c->st_end < sizeof(struct sock_hdr)) {
        memmove(c->stage, c->stage + c->st_pos, c->st_end - c->st_pos);
        c->st_end -= c->st_pos;
        c->st_pos = 0;
      }
      room = c->st_end == 0 ? stage_want(c, c->in_body ? c->rx_left : 0) : SOCK_STAGE - c->st_end;
      n = recv(c->fe.fd, c->stage + c->st_end, room, MSG_DONTWAIT);
      if (n > 0) {
        drained = (size_t)n < room;
        budget = (size_t)n < budget ? budget - (size_t)n : 0;
        c->st_end += (size_t)n;
        continue; /* parsed at the top */
      }
    }
    if (n == 0) {
      /* the peer closed: fine when nothing more was owed either way */
      bool owed =
          c->in_body || c->st_end > c->st_pos || c->posted || c->txq || c->rndv_tx || c->rndv_rx;

      if (owed)
        conn_fail(e, c, ECONNRESET, false);
      else
        conn_fail(e, c, 0, false);
      return;
    }
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      conn_fail(e, c, errno, false);
    return;
  }
}

/* Reads what c's socket holds (up to SOCK_READ_BUDGET) and acts on it; what
 * its headers ask to send (CTSs, DATAs) goes out together, before each read
 * and at the end. */
static void conn_read(struct sock_ep *e, struct sock_conn *c) {
  c->tx_hold = true;
  conn_read_some(e, c);
  c->tx_hold = false;
  tx_release(e, c);
}

/* ---- connections ---- */

static void conn_up(struct sock_ep *e, struct sock_conn *c) {
  c->state = C_UP;
  conn_flush(e, c);
  if (c->state == C_UP)
    conn_read(e, c);
}

static void sock_nodelay(int fd) {
  int one = 1;

  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* A connection up whose two ends have one address joins two ranks of this
 * host: the kernel's TCP is then two memory copies, the sender's into its
 * socket and the receiver's out of it, and what lies between them is what
 * the send buffer lets in flight. Autotuned, that grows to megabytes and
 * the receiver reads from memory the caches no longer hold; capped, it
 * reads what was just written (several times faster for 1 MiB exchanges
 * over loopback; the kernel doubles the value for its bookkeeping). Between
 * hosts the NIC reads
 * the data and the buffer must cover the path's bandwidth-delay product:
 * the kernel's autotuning stays. */
static void conn_tune(struct sock_ep *e, int fd) {
  struct sockaddr_in me, peer;
  socklen_t ml = sizeof(me), pl = sizeof(peer);

  if (getsockname(fd, (struct sockaddr *)&me, &ml) < 0 ||
      getpeername(fd, (struct sockaddr *)&peer, &pl) < 0 || me.sin_family != AF_INET ||
      peer.sin_family != AF_INET || me.sin_addr.s_addr != peer.sin_addr.s_addr)
    return;
  e->stats.host_conns++;
  if (e->sndbuf && setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &e->sndbuf, sizeof(e->sndbuf)) == 0)
    e->stats.sndbuf_set++;
}

/* ---- the door: the listener and the strangers at it ---- */

static double sock_now(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "ip:port" of an accepted peer. */
static void fmt_peer(const struct sockaddr_storage *sa, socklen_t len, char *out, size_t outlen) {
  char ip[INET6_ADDRSTRLEN] = "?";

  if (sa->ss_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;

    inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
    snprintf(out, outlen, "%s:%u", ip, ntohs(in->sin_port));
  } else if (sa->ss_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;

    inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
    snprintf(out, outlen, "[%s]:%u", ip, ntohs(in6->sin6_port));
  } else {
    snprintf(out, outlen, "a socket of family %d", (int)sa->ss_family);
  }
}

static void door_emit(struct sock_ep *e, const char *line) {
  if (e->log)
    e->log(e->log_arg, line);
  else
    fprintf(stderr, "chorus[%d] warn sock: %s\n", e->rank, line);
}

/* Tells the refusals counted in the window, in one line. */
static void door_log_flush(struct sock_ep *e) {
  char line[512];

  if (!e->log_hidden)
    return;
  snprintf(line, sizeof(line),
           "rank %d's listener %s: %d more connections refused in the last %.0f s, not shown one "
           "by one (the latest %s)",
           e->rank, e->where, e->log_hidden, sock_now() - e->log_since, e->log_last);
  e->log_hidden = 0;
  door_emit(e, line);
}

/* Sets the timer to the next thing due: the oldest hello's deadline, the
 * end of a log window with refusals counted, the end of the listener's
 * rest. */
static void door_timer(struct sock_ep *e) {
  struct itimerspec it = {{0, 0}, {0, 0}};
  double due = 0;

  if (e->tfe.fd < 0)
    return;
  if (e->pending)
    due = e->pending->deadline;
  if (e->log_hidden && (!due || e->log_since + SOCK_LOG_WINDOW_S < due))
    due = e->log_since + SOCK_LOG_WINDOW_S;
  if (e->accept_rest && (!due || e->accept_rest < due))
    due = e->accept_rest;
  if (due) {
    it.it_value.tv_sec = (time_t)due;
    it.it_value.tv_nsec = (long)((due - (double)(time_t)due) * 1e9);
    if (!it.it_value.tv_sec && !it.it_value.tv_nsec)
      it.it_value.tv_nsec = 1; /* zero would disarm it */
  }
  timerfd_settime(e->tfe.fd, TFD_TIMER_ABSTIME, &it, NULL);
}

/* One connection refused, in the log with the peer's address and why: the
 * first SOCK_LOG_BURST of a window line by line, the rest counted and told
 * at the window's end. */
static void door_refused(struct sock_ep *e, const char *peer, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void door_refused(struct sock_ep *e, const char *peer, const char *fmt, ...) {
  char why[256], line[512];
  double now = sock_now();
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(why, sizeof(why), fmt, ap);
  va_end(ap);
  e->stats.refused++;
  if (now - e->log_since >= SOCK_LOG_WINDOW_S) {
    door_log_flush(e);
    e->log_since = now;
    e->log_shown = 0;
  }
  if (e->log_shown < SOCK_LOG_BURST) {
    e->log_shown++;
    snprintf(line, sizeof(line), "rank %d's listener %s refused the connection from %s: %s",
             e->rank, e->where, peer, why);
    door_emit(e, line);
    return;
  }
  e->log_hidden++;
  snprintf(e->log_last, sizeof(e->log_last), "from %.63s: %.180s", peer, why);
}

/* Out of the waiting list and closed; freed once progress() is done with
 * its events (one of them may point at it). */
static void pending_drop(struct sock_ep *e, struct sock_pending *pd, bool close_fd) {
  struct sock_pending **pp, *prev = NULL;

  for (pp = &e->pending; *pp; prev = *pp, pp = &(*pp)->next) {
    if (*pp == pd) {
      *pp = pd->next;
      if (e->pending_tail == pd)
        e->pending_tail = prev;
      e->npending--;
      break;
    }
  }
  epoll_ctl(e->epfd, EPOLL_CTL_DEL, pd->fe.fd, NULL);
  if (close_fd)
    close(pd->fe.fd);
  pd->fe.fd = -1;
  pd->next = e->graves;
  e->graves = pd;
}

static void graves_free(struct sock_ep *e) {
  while (e->graves) {
    struct sock_pending *pd = e->graves;

    e->graves = pd->next;
    free(pd);
  }
}

/* Higher ranks that have not connected yet (they will). */
static int ranks_expected(const struct sock_ep *e) {
  int n = 0;

  for (int i = e->rank + 1; i < e->nranks; i++)
    n += e->conns[i].state == C_IDLE || e->conns[i].state == C_WAIT_ACCEPT;
  return n;
}

/* Every higher rank is connected (or lost): nobody is to come, the door
 * closes, and the connections waiting there with it. */
static void door_close(struct sock_ep *e, const char *why) {
  if (e->lfe.fd >= 0) {
    epoll_ctl(e->epfd, EPOLL_CTL_DEL, e->lfe.fd, NULL);
    close(e->lfe.fd);
    e->lfe.fd = -1;
  }
  while (e->pending) {
    door_refused(e, e->pending->peer, "%s", why);
    pending_drop(e, e->pending, true);
  }
  door_log_flush(e);
  if (e->tfe.fd >= 0) {
    epoll_ctl(e->epfd, EPOLL_CTL_DEL, e->tfe.fd, NULL);
    close(e->tfe.fd);
    e->tfe.fd = -1;
  }
}

static void door_check(struct sock_ep *e) {
  if (e->lfe.fd >= 0 && e->peers_added && ranks_expected(e) == 0)
    door_close(e, "every rank that connects to this one has: the listener closes");
}

/* Whether a waiting connection has sent anything yet. */
static bool pending_spoke(const struct sock_pending *pd) {
  char b;

  return pd->have > 0 || recv(pd->fe.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

/* Too many wait for their hello: the oldest that said nothing among the
 * SOCK_DROP_SCAN oldest (a rank's hello is there at once), else the
 * oldest, is dropped. */
static void pending_evict(struct sock_ep *e, int cap) {
  struct sock_pending *pd, *victim = e->pending;
  bool silent = false;
  int i = 0;

  for (pd = e->pending; pd && i < SOCK_DROP_SCAN; pd = pd->next, i++) {
    if (!pending_spoke(pd)) {
      victim = pd;
      silent = true;
      break;
    }
  }
  door_refused(e, victim->peer,
               "%d connections wait for their hello (at most %d while %d ranks are to connect): "
               "the oldest %sis dropped",
               e->npending, cap, ranks_expected(e), silent ? "that said nothing " : "");
  pending_drop(e, victim, true);
}

/* Why hello h is refused, or NULL: it is a higher rank of this job that
 * has not connected yet. */
static const char *hello_refusal(const struct sock_ep *e, const struct sock_hello *h, char *why,
                                 size_t len) {
  const unsigned char *b = (const unsigned char *)h;

  if (h->magic != SOCK_HELLO_MAGIC)
    snprintf(why, len,
             "not a Chorus sock hello (its first bytes: %02x %02x %02x %02x %02x %02x %02x %02x)",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]);
  else if (h->job != e->job)
    snprintf(why, len, "the hello of another job (job hash %#llx, this job's is %#llx)",
             (unsigned long long)h->job, (unsigned long long)e->job);
  else if (h->nranks != e->nranks)
    snprintf(why, len, "a hello for a job of %d ranks; this one has %d", (int)h->nranks, e->nranks);
  else if (h->rank <= e->rank || h->rank >= e->nranks)
    snprintf(why, len, "a hello of rank %d, which does not connect to rank %d", (int)h->rank,
             e->rank);
  else if (e->conns[h->rank].state == C_DEAD)
    snprintf(why, len, "a hello of rank %d, whose connection was lost", (int)h->rank);
  else if (e->conns[h->rank].fe.fd >= 0)
    snprintf(why, len, "a hello of rank %d, which is connected already", (int)h->rank);
  else
    return NULL;
  return why;
}

/* Reads an accepted socket's hello (exactly: what follows is the stream). */
static void pending_read(struct sock_ep *e, struct sock_pending *pd) {
  for (;;) {
    ssize_t n =
        recv(pd->fe.fd, (char *)&pd->hello + pd->have, sizeof(pd->hello) - pd->have, MSG_DONTWAIT);
    struct sock_conn *c;
    char why[160];
    int fd;

    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (n <= 0) {
      if (n == 0)
        door_refused(e, pd->peer, "it closed after %zu of the hello's %zu bytes", pd->have,
                     sizeof(pd->hello));
      else
        door_refused(e, pd->peer, "%s before its hello", strerror(errno));
      pending_drop(e, pd, true);
      return;
    }
    pd->have += (size_t)n;
    if (pd->have < sizeof(pd->hello))
      continue;
    /* who is it? a stranger, or a rank we do not accept from: hang up */
    if (hello_refusal(e, &pd->hello, why, sizeof(why))) {
      door_refused(e, pd->peer, "%s", why);
      pending_drop(e, pd, true);
      return;
    }
    c = &e->conns[pd->hello.rank];
    fd = pd->fe.fd;
    pending_drop(e, pd, false);
    conn_tune(e, fd);
    c->fe.fd = fd;
    c->events = EPOLLIN;
    if (ep_ctl(e, EPOLL_CTL_ADD, &c->fe, EPOLLIN)) {
      conn_fail(e, c, errno, false);
    } else {
      conn_up(e, c);
    }
    door_check(e);
    return;
  }
}

/* Takes fd, just accepted from peer, as a connection waiting for its hello
 * (read at once: a rank's is usually there). 0, or -errno with fd closed. */
static int pending_add(struct sock_ep *e, int fd, const char *peer) {
  int cap = SOCK_STRANGERS_MAX + ranks_expected(e);
  struct sock_pending *pd;
  int rc;

  while (e->npending >= cap)
    pending_evict(e, cap);
  pd = calloc(1, sizeof(*pd));
  if (!pd) {
    close(fd);
    door_refused(e, peer, "out of memory");
    return -ENOMEM;
  }
  sock_nodelay(fd);
  pd->fe.kind = FD_PENDING;
  pd->fe.fd = fd;
  pd->deadline = sock_now() + SOCK_HELLO_TIMEOUT_S;
  snprintf(pd->peer, sizeof(pd->peer), "%s", peer);
  rc = ep_ctl(e, EPOLL_CTL_ADD, &pd->fe, EPOLLIN);
  if (rc) {
    close(fd);
    free(pd);
    door_refused(e, peer, "epoll: %s", strerror(-rc));
    return rc;
  }
  if (e->pending_tail)
    e->pending_tail->next = pd;
  else
    e->pending = pd;
  e->pending_tail = pd;
  if ((uint32_t)++e->npending > e->stats.pending_max)
    e->stats.pending_max = (uint32_t)e->npending;
  pending_read(e, pd);
  return 0;
}

/* Out of descriptors with none waiting to give back: the listener leaves
 * the epoll set for SOCK_ACCEPT_REST_S (it would stay readable, and a
 * sleeper would wake over and over); the kernel's backlog holds the rest. */
static void door_rest(struct sock_ep *e, int err) {
  if (e->accept_rest)
    return;
  epoll_ctl(e->epfd, EPOLL_CTL_DEL, e->lfe.fd, NULL);
  e->accept_rest = sock_now() + SOCK_ACCEPT_REST_S;
  door_refused(e, "the kernel's backlog", "accept: %s; not accepting for %.1f s", strerror(err),
               SOCK_ACCEPT_REST_S);
}

static void do_accept(struct sock_ep *e) {
  while (e->lfe.fd >= 0 && !e->accept_rest) {
    struct sockaddr_storage sa;
    socklen_t sl = sizeof(sa);
    int fd = accept4(e->lfe.fd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    char peer[64];

    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        if (e->pending) { /* give one back: the oldest waiting */
          door_refused(e, e->pending->peer, "out of descriptors: the oldest waiting is dropped");
          pending_drop(e, e->pending, true);
          continue;
        }
        door_rest(e, errno);
      }
      break; /* EAGAIN: all taken */
    }
    fmt_peer(&sa, sl, peer, sizeof(peer));
    pending_add(e, fd, peer);
  }
  door_timer(e);
}

/* The timer: hellos past their deadline, a log window's end, the end of
 * the listener's rest. */
static void door_tick(struct sock_ep *e) {
  uint64_t ticks;
  double now = sock_now();

  if (e->tfe.fd < 0)
    return;
  while (read(e->tfe.fd, &ticks, sizeof(ticks)) > 0)
    ;
  while (e->pending && e->pending->deadline <= now) {
    door_refused(e, e->pending->peer, "no hello within %.1f s (%zu of its %zu bytes came)",
                 SOCK_HELLO_TIMEOUT_S, e->pending->have, sizeof(e->pending->hello));
    pending_drop(e, e->pending, true);
  }
  if (e->log_hidden && now - e->log_since >= SOCK_LOG_WINDOW_S) {
    door_log_flush(e);
    e->log_since = now;
    e->log_shown = 0;
  }
  if (e->accept_rest && e->accept_rest <= now) {
    e->accept_rest = 0;
    if (e->lfe.fd >= 0 && ep_ctl(e, EPOLL_CTL_ADD, &e->lfe, EPOLLIN) == 0)
      do_accept(e);
  }
  door_timer(e);
}

int prov_sock_test_adopt(prov_t *p, int fd) {
  struct sock_ep *e;
  int rc;

  if (!p || p->ops != &prov_sock_ops) {
    close(fd);
    return -EINVAL;
  }
  e = to_sock(p);
  rc = pending_add(e, fd, "the test's socket");
  door_timer(e);
  return rc;
}

/* A connect finished (or failed). */
static void conn_connected(struct sock_ep *e, struct sock_conn *c) {
  int err = 0;
  socklen_t len = sizeof(err);

  if (getsockopt(c->fe.fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
    err = errno;
  if (err) {
    conn_fail(e, c, err, false);
    return;
  }
  conn_tune(e, c->fe.fd);
  c->hello_due = true;
  c->hello_off = 0;
  conn_up(e, c);
}

static void conn_event(struct sock_ep *e, struct sock_conn *c, uint32_t ev) {
  if (c->state == C_CONNECTING) {
    if (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))
      conn_connected(e, c);
    return;
  }
  if (c->state != C_UP)
    return;
  if (ev & (EPOLLIN | EPOLLERR | EPOLLHUP))
    conn_read(e, c);
  if (c->state == C_UP && (ev & EPOLLOUT))
    conn_flush(e, c);
}

/* ---- interface address ---- */

static int pick_address(const char *want, const char *addr, struct in_addr *out, char *why,
                        size_t whylen) {
  struct ifaddrs *ifs, *i;
  bool found = false;

  if (!want || !want[0])
    want = getenv("FI_TCP_IFACE");
  if (want && !want[0])
    want = NULL;
  if (!want && addr && addr[0]) {
    if (inet_pton(AF_INET, addr, out) != 1) {
      snprintf(why, whylen, "the address to listen on, \"%s\", is not an IPv4 address", addr);
      return -EINVAL;
    }
    return 0;
  }
  out->s_addr = htonl(INADDR_LOOPBACK);
  if (getifaddrs(&ifs) < 0) {
    if (!want)
      return 0;
    snprintf(why, whylen, "getifaddrs: %s", strerror(errno));
    return -errno;
  }
  for (i = ifs; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP))
      continue;
    if (want ? strcmp(i->ifa_name, want) != 0 : (i->ifa_flags & IFF_LOOPBACK) != 0)
      continue;
    *out = ((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr;
    found = true;
  }
  freeifaddrs(ifs);
  if (want && !found) {
    snprintf(why, whylen, "interface \"%s\" has no IPv4 address that is up", want);
    return -ENODEV;
  }
  return 0;
}

/* ---- ops ---- */

static int sock_open(const prov_config_t *cfg, prov_t **out, char *errbuf, size_t errlen) {
  struct sock_ep *e;
  socklen_t alen = sizeof(e->me);
  char why[160] = "";
  int rc, i, one = 1;

  *out = NULL;
  e = calloc(1, sizeof(*e));
  if (!e || !(e->conns = calloc((size_t)cfg->nranks, sizeof(*e->conns)))) {
    free(e);
    prov_errf(errbuf, errlen, "sock: out of memory");
    return -ENOMEM;
  }
  e->base.ops = &prov_sock_ops;
  e->base.name = "sock";
  e->base.last_error = e->errmsg;
  e->rank = cfg->rank;
  e->nranks = cfg->nranks;
  e->job = job_hash(cfg->job_id);
  e->sndbuf = cfg->sock_sndbuf > INT_MAX / 2 ? INT_MAX / 2 : (int)cfg->sock_sndbuf;
  e->epfd = -1;
  e->lfe.kind = FD_LISTEN;
  e->lfe.fd = -1;
  e->tfe.kind = FD_TIMER;
  e->tfe.fd = -1;
  e->log = cfg->log;
  e->log_arg = cfg->log_arg;
  for (i = 0; i < e->nranks; i++) {
    e->conns[i].fe.kind = FD_PEER;
    e->conns[i].fe.fd = -1;
    e->conns[i].peer = i;
  }
  e->me.sin_family = AF_INET;
  rc = pick_address(cfg->iface, cfg->sock_addr, &e->me.sin_addr, why, sizeof(why));
  if (rc) {
    prov_errf(errbuf, errlen, "sock: %s", why);
    goto out_free;
  }
  e->epfd = epoll_create1(EPOLL_CLOEXEC);
  e->lfe.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  e->tfe.fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (e->epfd < 0 || e->lfe.fd < 0 || e->tfe.fd < 0) {
    rc = -errno;
    prov_errf(errbuf, errlen, "sock: %s", strerror(errno));
    goto out_free;
  }
  setsockopt(e->lfe.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(e->lfe.fd, (struct sockaddr *)&e->me, sizeof(e->me)) < 0 ||
      listen(e->lfe.fd, SOMAXCONN) < 0 ||
      getsockname(e->lfe.fd, (struct sockaddr *)&e->me, &alen) < 0) {
    rc = -errno;
    prov_errf(errbuf, errlen, "sock: listening on %s: %s", inet_ntoa(e->me.sin_addr),
              strerror(errno));
    goto out_free;
  }
  snprintf(e->where, sizeof(e->where), "%s:%u", inet_ntoa(e->me.sin_addr), ntohs(e->me.sin_port));
  rc = ep_ctl(e, EPOLL_CTL_ADD, &e->lfe, EPOLLIN);
  if (!rc)
    rc = ep_ctl(e, EPOLL_CTL_ADD, &e->tfe, EPOLLIN);
  if (rc) {
    prov_errf(errbuf, errlen, "sock: epoll: %s", strerror(-rc));
    goto out_free;
  }
  *out = &e->base;
  return 0;

out_free:
  if (e->tfe.fd >= 0)
    close(e->tfe.fd);
  if (e->lfe.fd >= 0)
    close(e->lfe.fd);
  if (e->epfd >= 0)
    close(e->epfd);
  free(e->conns);
  free(e);
  return rc;
}

static int sock_getname(prov_t *p, void *addr, size_t *len) {
  struct sock_ep *e = to_sock(p);
  struct sock_addr a = {.magic = SOCK_ADDR_MAGIC,
                        .ip = e->me.sin_addr.s_addr,
                        .port = e->me.sin_port,
                        .rank = e->rank,
                        .job = e->job};

  return prov_copy_name(&a, sizeof(a), addr, len);
}

static int sock_add_peers(prov_t *p, const void *const *addrs, const size_t *lens, int n) {
  struct sock_ep *e = to_sock(p);
  int i;

  if (e->peers_added) {
    sock_seterr(e, "sock: add_peers called twice");
    return -EINVAL;
  }
  if (n != e->nranks || !addrs || !lens) {
    sock_seterr(e, "sock: add_peers got %d of %d ranks", n, e->nranks);
    return -EINVAL;
  }
  for (i = 0; i < n; i++) {
    struct sock_addr a;

    if (!addrs[i] || lens[i] != sizeof(a))
      goto out_bad;
    memcpy(&a, addrs[i], sizeof(a));
    if (a.magic != SOCK_ADDR_MAGIC || a.rank != i || a.job != e->job)
      goto out_bad;
  }
  e->peers_added = true;
  /* the higher rank of each pair connects; the lower accepts */
  for (i = 0; i < n; i++) {
    struct sock_conn *c = &e->conns[i];
    struct sockaddr_in sa = {.sin_family = AF_INET};
    struct sock_addr a;
    int fd;

    if (i == e->rank)
      continue;
    if (i > e->rank) {
      if (c->state == C_IDLE) /* else it has connected already */
        c->state = C_WAIT_ACCEPT;
      continue;
    }
    memcpy(&a, addrs[i], sizeof(a));
    sa.sin_addr.s_addr = a.ip;
    sa.sin_port = a.port;
    c->hello = (struct sock_hello){
        .magic = SOCK_HELLO_MAGIC, .rank = e->rank, .nranks = e->nranks, .job = e->job};
    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      conn_fail(e, c, errno, false);
      continue;
    }
    sock_nodelay(fd);
    c->fe.fd = fd;
    c->events = EPOLLIN | EPOLLOUT;
    if (ep_ctl(e, EPOLL_CTL_ADD, &c->fe, EPOLLIN | EPOLLOUT)) {
      conn_fail(e, c, errno, false);
      continue;
    }
    c->want_out = true;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
      conn_connected(e, c);
    } else if (errno == EINPROGRESS || errno == EINTR) {
      c->state = C_CONNECTING;
    } else {
      conn_fail(e, c, errno, false);
    }
  }
  door_check(e); /* the highest rank: nobody connects to it */
  return 0;

out_bad:
  sock_seterr(e, "sock: the address of rank %d is not a sock address of this job", i);
  return -EINVAL;
}

static int check_post(struct sock_ep *e, int peer, size_t len, const void *buf, prov_op_t *op,
                      size_t posted) {
  if (e->closing)
    return -ESHUTDOWN;
  if (!op || !op->done || peer < 0 || peer >= e->nranks || (len && !buf))
    return -EINVAL;
  if (!e->peers_added) {
    sock_seterr(e, "sock: post before add_peers");
    return -ENOTCONN;
  }
  if (posted >= SOCK_MAX_POSTED)
    return -EAGAIN;
  return 0;
}

static struct sock_req *req_new(prov_t *p, prov_op_t *op, int peer, void *buf, size_t len,
                                uint64_t tag, bool is_send) {
  struct sock_req *r = calloc(1, sizeof(*r));

  if (!r)
    return NULL;
  r->op = op;
  r->peer = peer;
  r->buf = buf;
  r->len = len;
  r->tag = tag;
  r->is_send = is_send;
  op->internal[PROV_OP_OWNER] = p;
  op->internal[PROV_OP_REQ] = r;
  return r;
}

/* A message to ourselves: straight to the receive, or parked unexpected. */
static int self_send(struct sock_ep *e, struct sock_req *s) {
  struct sock_conn *c = &e->conns[e->rank];
  struct sock_req *r = posted_take(c, s->tag);

  if (r) {
    size_t n = s->len < r->len ? s->len : r->len;

    if (n)
      memcpy(r->buf, s->buf, n);
    r->data = s->hdr.data;
    r->msg_len = s->len;
    cq_push(e, r, s->len > r->len ? -EMSGSIZE : 0, n);
  } else {
    struct sock_umsg *m = umsg_new(e, c, &s->hdr, true); /* tag, len, data as sent */

    if (!m)
      return -ENOMEM;
    if (s->len)
      memcpy(m->buf, s->buf, s->len);
    m->got = s->len;
  }
  cq_push(e, s, 0, s->len);
  return 0;
}

static int sock_post_send(prov_t *p, int peer, const void *buf, size_t len, uint64_t tag,
                          prov_op_t *op) {
  struct sock_ep *e = to_sock(p);
  struct sock_conn *c;
  struct sock_req *r;
  int rc = check_post(e, peer, len, buf, op, e->nsend);

  if (rc)
    return rc;
  r = req_new(p, op, peer, (void *)(uintptr_t)buf, len, tag, true);
  if (!r)
    return -ENOMEM;
  r->hdr = (struct sock_hdr){.magic = SOCK_HDR_MAGIC,
                             .type = len > SOCK_EAGER_MAX ? H_RTS : H_EAGER,
                             .tag = tag,
                             .len = len,
                             .data = op->data & ~PROV_DATA_VALID};
  if (r->hdr.type == H_RTS)
    r->hdr.cookie = r->id = ++e->next_id;
  e->nsend++;
  if (peer == e->rank) {
    rc = self_send(e, r);
    if (rc) {
      e->nsend--;
      op->internal[PROV_OP_OWNER] = NULL;
      free(r);
    }
    return rc;
  }
  c = &e->conns[peer];
  if (c->state == C_DEAD) {
    cq_push(e, r, -EPIPE, 0);
    return 0;
  }
  r->where = W_TXQ;
  list_push(&c->txq, &c->txq_tail, r);
  if (c->txq == r)
    conn_flush(e, c);
  return 0;
}

static int sock_post_recv(prov_t *p, int peer, void *buf, size_t len, uint64_t tag, prov_op_t *op) {
  struct sock_ep *e = to_sock(p);
  struct sock_conn *c;
  struct sock_umsg *m;
  struct sock_req *r;
  int rc = check_post(e, peer, len, buf, op, e->nrecv);

  if (rc)
    return rc;
  r = req_new(p, op, peer, buf, len, tag, false);
  if (!r)
    return -ENOMEM;
  e->nrecv++;
  c = &e->conns[peer];
  for (m = c->unexp; m; m = m->next) {
    if (m->tag != tag || m->claimed)
      continue;
    if (m->rts) {
      umsg_unlink(c, m);
      conn_resume(e, c); /* the DATA must be read */
      if (c->state == C_DEAD)
        cq_push(e, r, -ECONNRESET, 0);
      else
        rndv_accept(e, c, r, m->len, m->data, m->cookie);
      umsg_free(e, m);
    } else if (m->got == m->len) {
      umsg_unlink(c, m);
      umsg_deliver(e, r, m);
      umsg_free(e, m);
      /* Served from what waits: a paused connection stays so until that
       * is down to half (SOCK_UNEXP_LOW), not one message at a time. A
       * sender running ahead (a broadcast's root) kept the receiver at the
       * limit, and each receive took its connection out of the epoll set
       * and put it back: two system calls a message. */
      if (c->unexp_bytes < SOCK_UNEXP_LOW)
        conn_resume(e, c);
    } else {
      conn_resume(e, c); /* the rest must be read */
      m->claimed = r;
      r->claim = m;
      r->where = W_CLAIM;
    }
    return 0;
  }
  conn_resume(e, c);
  if (c->state == C_DEAD) {
    cq_push(e, r, -ECONNRESET, 0);
    return 0;
  }
  r->where = W_POSTED;
  list_push(&c->posted, &c->posted_tail, r);
  return 0;
}

static int sock_cancel(prov_t *p, prov_op_t *op) {
  struct sock_ep *e = to_sock(p);
  struct sock_req *r;
  struct sock_conn *c;

  if (!op || op->internal[PROV_OP_OWNER] != p)
    return -ENOENT;
  r = op->internal[PROV_OP_REQ];
  c = &e->conns[r->peer];
  switch (r->where) {
  case W_POSTED:
    if (list_unlink(&c->posted, &c->posted_tail, r))
      cq_push(e, r, -ECANCELED, 0);
    break;
  case W_CLAIM:
    r->claim->claimed = NULL;
    r->claim = NULL;
    cq_push(e, r, -ECANCELED, 0);
    break;
  case W_TXQ:
    /* a send whose first byte is on the wire finishes: the stream needs it;
     * so does a DATA: its receive waits for it */
    if (r->hdr.type != H_DATA && (c->txq != r || c->tx_off == 0) &&
        list_unlink(&c->txq, &c->txq_tail, r))
      cq_push(e, r, -ECANCELED, 0);
    break;
  default: /* being received, or already done */
    break;
  }
  return 0;
}

static int sock_drop_peer(prov_t *p, int peer) {
  struct sock_ep *e = to_sock(p);

  if (peer < 0 || peer >= e->nranks || peer == e->rank)
    return -EINVAL;
  conn_fail(e, &e->conns[peer], ECONNABORTED, true);
  return 0;
}

/* Delivers the queued completions (only those queued on entry). */
static int cq_deliver(struct sock_ep *e) {
  struct sock_req *r = e->cq, *next;
  int n = 0;

  e->cq = e->cq_tail = NULL;
  for (; r; r = next) {
    prov_op_t *op = r->op;
    int status = r->status;
    size_t xfer = r->xfer;

    next = r->next;
    if (r->is_send) {
      e->nsend--;
    } else {
      e->nrecv--;
      op->data = status == 0 || status == -EMSGSIZE ? PROV_DATA_VALID | r->data : 0;
      if (status == -EMSGSIZE)
        sock_seterr(e, "sock rank %d: message from rank %d tag %#llx truncated: %zu bytes into %zu",
                    e->rank, r->peer, (unsigned long long)r->tag, r->msg_len, r->len);
    }
    op->internal[PROV_OP_OWNER] = NULL;
    op->internal[PROV_OP_REQ] = NULL;
    free(r);
    op->done(op, status, xfer);
    n++;
  }
  return n;
}

static int sock_progress(prov_t *p) {
  struct sock_ep *e = to_sock(p);
  struct epoll_event ev[SOCK_EVENTS];
  int n, i;

  if (e->kick) {
    e->kick = false;
    for (i = 0; i < e->nranks; i++) {
      if (e->conns[i].kick) {
        e->conns[i].kick = false;
        conn_read(e, &e->conns[i]);
      }
    }
  }
  /* Completions queued and no receive in flight (a send that went at once,
   * a broadcast root's): hand them back without a look at the sockets; the
   * next round looks. Each look is an epoll_wait. */
  if (e->cq && !e->nrecv)
    return cq_deliver(e);
  e->stats.polls++;
  n = epoll_wait(e->epfd, ev, SOCK_EVENTS, 0);
  for (i = 0; i < n; i++) {
    struct sock_fdent *fe = ev[i].data.ptr;

    switch (fe->kind) {
    case FD_LISTEN:
      do_accept(e);
      break;
    case FD_TIMER:
      door_tick(e);
      break;
    case FD_PENDING:
      if (fe->fd >= 0) /* else dropped by an earlier event of this batch */
        pending_read(e, PROV_CONTAINER_OF(fe, struct sock_pending, fe));
      break;
    default:
      conn_event(e, PROV_CONTAINER_OF(fe, struct sock_conn, fe), ev[i].events);
      break;
    }
  }
  if (e->graves)
    graves_free(e);
  return e->cq ? cq_deliver(e) : 0;
}

/* Write what the queues hold (a CTS, a hello), deliver the completions
 * held (sends that went out at once), and leave the sockets unpolled: at
 * the end of a call, with nothing of the caller's in flight, a poll cost
 * every blocking call an epoll_wait that found nothing; what
 * peers send meanwhile waits in the kernel for the next call, or wakes a
 * sleeper. */
static int sock_flush(prov_t *p) {
  struct sock_ep *e = to_sock(p);

  for (int i = 0; i < e->nranks; i++) {
    struct sock_conn *c = &e->conns[i];

    if (c->txq || c->hello_due)
      conn_flush(e, c);
  }
  return e->cq ? cq_deliver(e) : 0;
}

static int sock_wait_fd(prov_t *p) {
  return to_sock(p)->epfd;
}

static int sock_arm(prov_t *p) {
  struct sock_ep *e = to_sock(p);

  return e->cq || e->kick ? -EAGAIN : 0;
}

static void sock_disarm(prov_t *p) {
  (void)p;
}

static size_t sock_max_posted(prov_t *p) {
  (void)p;
  return SOCK_MAX_POSTED;
}

static void sock_close(prov_t *p) {
  struct sock_ep *e = to_sock(p);
  int i;

  e->closing = true;
  for (i = 0; i < e->nranks; i++) {
    struct sock_conn *c = &e->conns[i];

    /* read what is left so that closing does not reset the peer's side
     * before it has read what we sent */
    if (c->fe.fd >= 0 && c->state == C_UP && !c->txq) {
      char sink[4096];

      while (recv(c->fe.fd, sink, sizeof(sink), MSG_DONTWAIT) > 0)
        ;
    }
    conn_fail(e, c, 0, true);
  }
  while (e->pending)
    pending_drop(e, e->pending, true);
  graves_free(e);
  door_log_flush(e);
  while (e->cq)
    cq_deliver(e);
  while (e->pool) {
    struct sock_umsg *m = e->pool;

    e->pool = m->next;
    free(m);
  }
  if (e->lfe.fd >= 0)
    close(e->lfe.fd);
  if (e->tfe.fd >= 0)
    close(e->tfe.fd);
  close(e->epfd);
  free(e->conns);
  free(e);
}

int prov_sock_stats(prov_t *p, prov_sock_stats_t *out) {
  struct sock_ep *e;

  if (!p || p->ops != &prov_sock_ops || !out)
    return -EINVAL;
  e = to_sock(p);
  *out = e->stats;
  out->listening = e->lfe.fd >= 0;
  out->sndbuf_max = 0;
  for (int i = 0; i < e->nranks; i++) {
    int v = 0;
    socklen_t len = sizeof(v);

    if (e->conns[i].state == C_UP &&
        getsockopt(e->conns[i].fe.fd, SOL_SOCKET, SO_SNDBUF, &v, &len) == 0 && v > out->sndbuf_max)
      out->sndbuf_max = v;
  }
  return 0;
}

const prov_ops_t prov_sock_ops = {
    .size = sizeof(prov_ops_t),
    .name = "sock",
    .open = sock_open,
    .getname = sock_getname,
    .add_peers = sock_add_peers,
    .post_send = sock_post_send,
    .post_recv = sock_post_recv,
    .cancel = sock_cancel,
    .drop_peer = sock_drop_peer,
    .progress = sock_progress,
    .wait_fd = sock_wait_fd,
    .arm = sock_arm,
    .disarm = sock_disarm,
    .max_posted = sock_max_posted,
    .close = sock_close,
    .flush = sock_flush,
};
