/*
 * tcpstore.c - a client of PyTorch's TCPStore (see tcpstore.h).
 *
 * Finding the protocol. A V1 server reads V2's VALIDATE (byte 0) as a SET
 * whose key length is the next 8 bytes, the magic included: a key of at
 * least 968 MB, which it would allocate and zero. A V2 server closes
 * (classic) or ignores for good (libuv) a connection whose first query is
 * not VALIDATE. So neither question can be put blindly; but each is
 * harmless to the other server when stopped short, and one connection
 * apiece keeps them apart:
 *
 *   A: [6]            V1's key count. V1 answers 8 bytes; V2 classic
 *                     closes A; V2 libuv says nothing.
 *   B: [0][magic][7]  V2's VALIDATE and key count. V2 answers 8 bytes; V1
 *                     reads 5 of the 8 bytes of a SET's key length and
 *                     waits for the rest, holding its single thread, until
 *                     B closes.
 *
 *   connect A, ask [6] --8 bytes within V1_QUIET--> V1, on A
 *        |--A closed--> connect B, ask --8 bytes--> V2, on B
 *        `--silence--> connect B, ask, wait on both (PROBE_S at most):
 *                        A answers --> V1 (close B: frees V1's thread)
 *                        B answers --> V2 (close A)
 *                        neither: close B, give A one more second (a V1
 *                        server held by B answers then), else fail
 *
 * A V1 server serves its connections in the order it accepted them, so A's
 * question, sent before B exists, is answered before B can hold it.
 */
#include "tcpstore.h"
#include "eng.h"
#include "netio.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define V2_MAGIC 0x3C85F7CEu
#define STOP_WAITING 0              /* a WAIT's answer */
#define MAX_KEYS ((int64_t)1 << 40) /* a key count above this is no store's */
#define A_LAST_CHANCE_S 1.0

enum query { Q_VALIDATE, Q_SET, Q_GET, Q_WAIT, Q_NUM_KEYS, Q_COUNT };

/* The query type bytes of each protocol ([proto - 1][query]); -1: none. */
static const int query_byte[2][Q_COUNT] = {
    {-1, 0, 2, 5, 6},
    {0, 1, 3, 6, 7},
};

struct tcpstore {
  int fd; /* nonblocking, connected, at a query boundary */
  enum tcpstore_proto proto;
  char addr[300]; /* "host:port", for messages */
};

static double now_s(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Waits for events on fd until the deadline: 0, -ETIMEDOUT or -errno. */
static int send_all(int fd, const uint8_t *buf, size_t len, double deadline) {
  while (len) {
    ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
    int rc;

    if (n > 0) {
      buf += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return -errno;
    if ((rc = netio_wait_fd(fd, POLLOUT, deadline)))
      return rc;
  }
  return 0;
}

/* Exactly n bytes: 0, -EPIPE at end of file (*got says how far it came),
 * -ETIMEDOUT or -errno. */
static int recv_exact(int fd, uint8_t *buf, size_t n, size_t *got, double deadline) {
  *got = 0;
  while (*got < n) {
    ssize_t r = recv(fd, buf + *got, n - *got, 0);
    int rc;

    if (r > 0) {
      *got += (size_t)r;
      continue;
    }
    if (r == 0)
      return -EPIPE;
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return -errno;
    if ((rc = netio_wait_fd(fd, POLLIN, deadline)))
      return rc;
  }
  return 0;
}

/* Up to 16 bytes as hex, then as text where printable: "48 54 54 50 ("HTTP")". */
static void quote_bytes(const uint8_t *b, size_t n, char *out, size_t len) {
  size_t i, k = n > 16 ? 16 : n, o = 0;

  out[0] = '\0';
  for (i = 0; i < k && o + 4 < len; i++)
    o += (size_t)snprintf(out + o, len - o, "%s%02x", i ? " " : "", b[i]);
  if (n > k && o + 5 < len)
    o += (size_t)snprintf(out + o, len - o, " ...");
  if (o + 4 < len) {
    o += (size_t)snprintf(out + o, len - o, " (\"");
    for (i = 0; i < k && o + 3 < len; i++)
      out[o++] = b[i] >= 0x20 && b[i] < 0x7f ? (char)b[i] : '.';
    snprintf(out + o, len - o, "\")");
  }
}

static void put_u64(uint8_t *p, uint64_t v) {
  memcpy(p, &v, sizeof(v)); /* torch sends host byte order */
}

static uint64_t get_u64(const uint8_t *p) {
  uint64_t v;

  memcpy(&v, p, sizeof(v));
  return v;
}

/* ---- connecting and finding the protocol ---- */

/* A connection to host:port: fd, or -ECONNREFUSED when every address
 * refused, -ENOENT when host does not resolve, else the last -errno. */
static int store_connect(const char *host, const char *port, double deadline, char *err,
                         size_t errlen) {
  struct addrinfo hints, *res, *ai;
  bool all_refused = true;
  int g, fd = -ETIMEDOUT, last = ETIMEDOUT;

  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  g = getaddrinfo(host, port, &hints, &res);
  if (g) {
    eng_errf(err, errlen, "cannot resolve %s: %s", host, gai_strerror(g));
    return -ENOENT;
  }
  for (ai = res; ai; ai = ai->ai_next) {
    fd = netio_try_connect(ai, deadline);
    if (fd >= 0)
      break;
    last = -fd;
    all_refused = all_refused && fd == -ECONNREFUSED;
  }
  freeaddrinfo(res);
  if (fd >= 0)
    return fd;
  if (all_refused) {
    eng_errf(err, errlen, "nothing listens at %s:%s (connection refused)", host, port);
    return -ECONNREFUSED;
  }
  eng_errf(err, errlen, "cannot connect to %s:%s: %s", host, port, strerror(last));
  return -last;
}

/* A probe connection and what came back on it. */
struct probe {
  int fd;
  uint8_t buf[64];
  size_t got;
  bool eof;
};

enum probe_state { PROBE_PENDING, PROBE_ANSWERED, PROBE_CLOSED, PROBE_GARBAGE };

/* Reads what is there without waiting; returns where the probe stands. */
static enum probe_state probe_read(struct probe *p) {
  while (!p->eof && p->got < sizeof(p->buf)) {
    ssize_t r = recv(p->fd, p->buf + p->got, sizeof(p->buf) - p->got, MSG_DONTWAIT);

    if (r > 0) {
      p->got += (size_t)r;
    } else if (r == 0) {
      p->eof = true;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      break;
    } else if (errno != EINTR) {
      p->eof = true; /* reset: the server closed it */
    }
  }
  if (p->got > 8) /* a key count is 8 bytes and nothing after it */
    return PROBE_GARBAGE;
  if (p->got == 8) {
    int64_t n = (int64_t)get_u64(p->buf);
    return n >= 0 && n <= MAX_KEYS ? PROBE_ANSWERED : PROBE_GARBAGE;
  }
  if (p->eof)
    return p->got ? PROBE_GARBAGE : PROBE_CLOSED;
  return PROBE_PENDING;
}

/* Waits until one of the open probes can be read, or the deadline. */
static void probe_poll(struct probe *const *ps, int n, double deadline) {
  struct pollfd pfd[2];
  int k = 0;
  double left = deadline - now_s();

  for (int i = 0; i < n; i++)
    if (ps[i]->fd >= 0 && !ps[i]->eof)
      pfd[k++] = (struct pollfd){.fd = ps[i]->fd, .events = POLLIN};
  if (!k || left <= 0)
    return;
  if (poll(pfd, (nfds_t)k, left * 1000 > INT_MAX - 1 ? INT_MAX : (int)(left * 1000) + 1) < 0 &&
      errno != EINTR)
    usleep(1000); /* poll itself failed: the next look finds it again */
}

static void probe_close(struct probe *p) {
  if (p->fd >= 0)
    close(p->fd);
  p->fd = -1;
}

static int probe_garbage(const struct probe *p, const char *host, const char *port, char *err,
                         size_t errlen) {
  char q[120];

  quote_bytes(p->buf, p->got, q, sizeof(q));
  eng_errf(err, errlen,
           "%s:%s is not a TCPStore: asked for its key count it answered %zu bytes, %s%s (a "
           "TCPStore answers 8 bytes, a count)",
           host, port, p->got, q, p->eof ? ", and closed the connection" : "");
  return -EPROTO;
}

/* Opens B and asks V2's question on it. */
static int probe_open_v2(struct probe *b, const char *host, const char *port, double deadline,
                         char *err, size_t errlen) {
  uint8_t q[6];
  uint32_t magic = V2_MAGIC;
  int rc;

  b->fd = store_connect(host, port, deadline, err, errlen);
  if (b->fd < 0)
    return b->fd;
  q[0] = (uint8_t)query_byte[1][Q_VALIDATE];
  memcpy(q + 1, &magic, sizeof(magic));
  q[5] = (uint8_t)query_byte[1][Q_NUM_KEYS];
  if ((rc = send_all(b->fd, q, sizeof(q), deadline))) {
    eng_errf(err, errlen, "%s:%s: sending the TCPStore's handshake: %s", host, port, strerror(-rc));
    probe_close(b);
  }
  return rc;
}

static int store_new(int fd, enum tcpstore_proto proto, const char *host, const char *port,
                     tcpstore_t **out, char *err, size_t errlen) {
  tcpstore_t *s = calloc(1, sizeof(*s));
  bool v6 = strchr(host, ':') != NULL;

  if (!s) {
    close(fd);
    eng_errf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  s->fd = fd;
  s->proto = proto;
  snprintf(s->addr, sizeof(s->addr), v6 ? "[%s]:%s" : "%s:%s", host, port);
  *out = s;
  return 0;
}

int tcpstore_open(const char *host, const char *port, double timeout_s, tcpstore_t **out, char *err,
                  size_t errlen) {
  struct probe a = {.fd = -1}, b = {.fd = -1};
  struct probe *both[2] = {&a, &b};
  enum probe_state sa, sb = PROBE_PENDING;
  double deadline, quiet, probe_end, t0;
  uint8_t q;
  int rc;

  if (!out || !host || !port || !*host || !*port || !(timeout_s > 0)) {
    eng_errf(err, errlen, "tcpstore_open: bad arguments");
    return -EINVAL;
  }
  *out = NULL;
  t0 = now_s();
  deadline = t0 + timeout_s;
  a.fd = store_connect(host, port, deadline, err, errlen);
  if (a.fd < 0)
    return a.fd;
  probe_end = now_s() + (timeout_s < TCPSTORE_PROBE_S ? timeout_s : TCPSTORE_PROBE_S);
  q = (uint8_t)query_byte[0][Q_NUM_KEYS];
  if ((rc = send_all(a.fd, &q, 1, probe_end))) {
    eng_errf(err, errlen, "%s:%s: sending a TCPStore query: %s", host, port, strerror(-rc));
    goto out_close;
  }
  quiet = now_s() + TCPSTORE_V1_QUIET_S;
  while ((sa = probe_read(&a)) == PROBE_PENDING && now_s() < quiet)
    probe_poll(both, 1, quiet);
  if (sa == PROBE_ANSWERED) {
    rc = store_new(a.fd, TCPSTORE_V1, host, port, out, err, errlen);
    a.fd = -1;
    goto out_close;
  }
  if (sa == PROBE_GARBAGE) {
    rc = probe_garbage(&a, host, port, err, errlen);
    goto out_close;
  }
  if (sa == PROBE_CLOSED)
    probe_close(&a);
  if ((rc = probe_open_v2(&b, host, port, probe_end, err, errlen)))
    goto out_close;
  for (;;) {
    sa = a.fd >= 0 ? probe_read(&a) : PROBE_CLOSED;
    sb = probe_read(&b);
    if (sa == PROBE_ANSWERED || sb == PROBE_ANSWERED)
      break;
    if (sa == PROBE_GARBAGE || sb == PROBE_GARBAGE) {
      rc = probe_garbage(sa == PROBE_GARBAGE ? &a : &b, host, port, err, errlen);
      goto out_close;
    }
    if (sa == PROBE_CLOSED && sb == PROBE_CLOSED) {
      eng_errf(err, errlen,
               "%s:%s is not a TCPStore: it closed the connection at a TCPStore's key-count query "
               "of torch 1.x and at that of torch 2.x (with its handshake)",
               host, port);
      rc = -EPROTO;
      goto out_close;
    }
    if (now_s() >= probe_end)
      break;
    probe_poll(both, 2, probe_end);
  }
  if (sb == PROBE_ANSWERED) {
    rc = store_new(b.fd, TCPSTORE_V2, host, port, out, err, errlen);
    b.fd = -1;
    goto out_close;
  }
  if (sa != PROBE_ANSWERED && a.fd >= 0) {
    /* a V1 server may be held by B's half-read question: free it */
    double last = now_s() + A_LAST_CHANCE_S;

    probe_close(&b);
    while ((sa = probe_read(&a)) == PROBE_PENDING && now_s() < last)
      probe_poll(both, 1, last);
  }
  if (sa == PROBE_ANSWERED) {
    rc = store_new(a.fd, TCPSTORE_V1, host, port, out, err, errlen);
    a.fd = -1;
    goto out_close;
  }
  if (sa == PROBE_GARBAGE) {
    rc = probe_garbage(&a, host, port, err, errlen);
    goto out_close;
  }
  eng_errf(err, errlen,
           "%s:%s accepted a connection but did not answer a TCPStore's key-count query (of torch "
           "1.x, nor of torch 2.x with its handshake) within %.1f s: is it a TCPStore?",
           host, port, now_s() - t0);
  rc = -ETIMEDOUT;

out_close:
  probe_close(&a);
  probe_close(&b);
  return rc;
}

int tcpstore_from_fd(int fd, enum tcpstore_proto proto, const char *addr, tcpstore_t **out,
                     char *err, size_t errlen) {
  tcpstore_t *s;
  int fl, rc;

  if (!out || fd < 0 || (proto != TCPSTORE_V1 && proto != TCPSTORE_V2)) {
    if (fd >= 0)
      close(fd);
    eng_errf(err, errlen, "tcpstore_from_fd: bad arguments");
    return -EINVAL;
  }
  *out = NULL;
  fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
    rc = -errno;
    close(fd);
    eng_errf(err, errlen, "tcpstore_from_fd: %s", strerror(-rc));
    return rc;
  }
  if (!(s = calloc(1, sizeof(*s)))) {
    close(fd);
    eng_errf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  s->fd = fd;
  s->proto = proto;
  snprintf(s->addr, sizeof(s->addr), "%s", addr ? addr : "(socket)");
  if (proto == TCPSTORE_V2) {
    uint8_t q[5];
    uint32_t magic = V2_MAGIC;

    q[0] = (uint8_t)query_byte[1][Q_VALIDATE];
    memcpy(q + 1, &magic, sizeof(magic));
    if ((rc = send_all(fd, q, sizeof(q), now_s() + TCPSTORE_PROBE_S))) {
      eng_errf(err, errlen, "%s: sending the TCPStore's handshake: %s", s->addr, strerror(-rc));
      tcpstore_close(s);
      return rc;
    }
  }
  *out = s;
  return 0;
}

enum tcpstore_proto tcpstore_protocol(const tcpstore_t *s) {
  return s->proto;
}

const char *tcpstore_addr(const tcpstore_t *s) {
  return s->addr;
}

void tcpstore_close(tcpstore_t *s) {
  if (!s)
    return;
  if (s->fd >= 0)
    close(s->fd);
  free(s);
}

/* ---- queries ---- */

/* Sends query q: [type], then [1] for a WAIT, then the key and the value
 * when given, each as a length and its bytes. */
static int send_query(tcpstore_t *s, enum query q, const char *key, const void *val, size_t vlen,
                      double deadline, char *err, size_t errlen) {
  size_t klen = key ? strlen(key) : 0, n = 0;
  uint8_t *buf;
  int rc;

  if (key && (!klen || klen > TCPSTORE_MAX_KEY)) {
    eng_errf(err, errlen, "TCPStore key of %zu bytes (1 to %d)", klen, TCPSTORE_MAX_KEY);
    return -EINVAL;
  }
  if (val && vlen > TCPSTORE_MAX_VALUE) {
    eng_errf(err, errlen, "TCPStore value of %zu bytes (at most %u)", vlen, TCPSTORE_MAX_VALUE);
    return -EINVAL;
  }
  if (!(buf = malloc(1 + 8 + 8 + klen + 8 + (val ? vlen : 0)))) {
    eng_errf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  buf[n++] = (uint8_t)query_byte[s->proto - 1][q];
  if (q == Q_WAIT) {
    put_u64(buf + n, 1);
    n += 8;
  }
  if (key) {
    put_u64(buf + n, klen);
    memcpy(buf + n + 8, key, klen);
    n += 8 + klen;
  }
  if (val) {
    put_u64(buf + n, vlen);
    if (vlen)
      memcpy(buf + n + 8, val, vlen);
    n += 8 + vlen;
  }
  rc = send_all(s->fd, buf, n, deadline);
  free(buf);
  if (rc)
    eng_errf(err, errlen, "sending to the TCPStore at %s: %s", s->addr, strerror(-rc));
  return rc;
}

/* n bytes of an answer to `what`, with a message when they do not come. */
static int recv_answer(tcpstore_t *s, uint8_t *buf, size_t n, const char *what, double t0,
                       double deadline, char *err, size_t errlen) {
  size_t got;
  int rc = recv_exact(s->fd, buf, n, &got, deadline);

  if (rc == -EPIPE || rc == -ECONNRESET)
    eng_errf(err, errlen, "the TCPStore at %s closed the connection %s (after %zu of %zu bytes)",
             s->addr, what, got, n);
  else if (rc == -ETIMEDOUT)
    eng_errf(err, errlen, "no answer from the TCPStore at %s %s within %.1f s", s->addr, what,
             now_s() - t0);
  else if (rc)
    eng_errf(err, errlen, "reading from the TCPStore at %s %s: %s", s->addr, what, strerror(-rc));
  return rc == -ECONNRESET ? -EPIPE : rc;
}

int tcpstore_num_keys(tcpstore_t *s, int64_t *n, double timeout_s, char *err, size_t errlen) {
  double t0 = now_s(), deadline = t0 + timeout_s;
  uint8_t b[8];
  int rc;

  if ((rc = send_query(s, Q_NUM_KEYS, NULL, NULL, 0, deadline, err, errlen)) ||
      (rc = recv_answer(s, b, 8, "asked for its key count", t0, deadline, err, errlen)))
    return rc;
  *n = (int64_t)get_u64(b);
  if (*n < 0 || *n > MAX_KEYS) {
    char q[120];

    quote_bytes(b, 8, q, sizeof(q));
    eng_errf(err, errlen, "%s answered a key count of %lld (%s): not a TCPStore", s->addr,
             (long long)*n, q);
    return -EPROTO;
  }
  return 0;
}

int tcpstore_set(tcpstore_t *s, const char *key, const void *val, size_t len, double timeout_s,
                 char *err, size_t errlen) {
  double deadline = now_s() + timeout_s;
  int64_t n;
  int rc;

  if (!key || (!val && len)) {
    eng_errf(err, errlen, "tcpstore_set: bad arguments");
    return -EINVAL;
  }
  if ((rc = send_query(s, Q_SET, key, val ? val : "", len, deadline, err, errlen)))
    return rc;
  /* a SET has no answer: a round trip behind it says the store took it */
  return tcpstore_num_keys(s, &n, deadline - now_s(), err, errlen);
}

int tcpstore_wait(tcpstore_t *s, const char *key, double timeout_s, char *err, size_t errlen) {
  double t0 = now_s(), deadline = t0 + timeout_s;
  char what[TCPSTORE_MAX_KEY + 64];
  uint8_t b;
  int rc;

  if (!key) {
    eng_errf(err, errlen, "tcpstore_wait: no key");
    return -EINVAL;
  }
  if ((rc = send_query(s, Q_WAIT, key, NULL, 0, deadline, err, errlen)))
    return rc;
  snprintf(what, sizeof(what), "while waiting for key '%s'", key);
  if ((rc = recv_answer(s, &b, 1, what, t0, deadline, err, errlen)))
    return rc;
  if (b != STOP_WAITING) {
    eng_errf(err, errlen, "the TCPStore at %s answered a wait for key '%s' with %u, not %u",
             s->addr, key, b, STOP_WAITING);
    return -EPROTO;
  }
  return 0;
}

int tcpstore_get(tcpstore_t *s, const char *key, void *buf, size_t cap, size_t *len,
                 double timeout_s, char *err, size_t errlen) {
  double t0 = now_s(), deadline = t0 + timeout_s;
  char what[TCPSTORE_MAX_KEY + 64];
  uint8_t b[8];
  uint64_t n;
  int rc;

  if (!key || !len || (!buf && cap)) {
    eng_errf(err, errlen, "tcpstore_get: bad arguments");
    return -EINVAL;
  }
  *len = 0;
  if ((rc = send_query(s, Q_GET, key, NULL, 0, deadline, err, errlen)))
    return rc;
  snprintf(what, sizeof(what), "asked for key '%s'", key);
  if ((rc = recv_answer(s, b, 8, what, t0, deadline, err, errlen)))
    return rc;
  n = get_u64(b);
  if (n > cap) {
    eng_errf(err, errlen,
             "the value of key '%s' in the TCPStore at %s is %llu bytes, more than the %zu "
             "expected",
             key, s->addr, (unsigned long long)n, cap);
    return -EMSGSIZE;
  }
  if (n && (rc = recv_answer(s, buf, (size_t)n, what, t0, deadline, err, errlen)))
    return rc;
  *len = (size_t)n;
  return 0;
}

/* ---- fuzzing ---- */

int tcpstore_client_bytes(enum tcpstore_proto proto, const uint8_t *bytes, size_t len) {
  char err[512], val[256];
  tcpstore_t *s;
  size_t vlen, off = 0;
  int64_t n;
  int sv[2], rc;

  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
    return -errno;
  /* what does not fit in the socket's buffer is left out */
  fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) | O_NONBLOCK);
  while (off < len) {
    ssize_t w = send(sv[1], bytes + off, len - off, MSG_NOSIGNAL);
    if (w <= 0)
      break;
    off += (size_t)w;
  }
  shutdown(sv[1], SHUT_WR);
  rc = tcpstore_from_fd(sv[0], proto, "fuzz", &s, err, sizeof(err));
  if (rc)
    goto out_close;
  if (!(rc = tcpstore_num_keys(s, &n, 0.5, err, sizeof(err))) &&
      !(rc = tcpstore_set(s, "/chorus/k", "v", 1, 0.5, err, sizeof(err))) &&
      !(rc = tcpstore_wait(s, "/chorus/k", 0.5, err, sizeof(err))))
    rc = tcpstore_get(s, "/chorus/k", val, sizeof(val), &vlen, 0.5, err, sizeof(err));
  tcpstore_close(s);
out_close:
  close(sv[1]);
  return rc;
}
