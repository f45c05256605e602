/*
 * bootstrap.c - rendezvous of the ranks of a job over TCP.
 *
 * Two halves share the wire format of schemas/bootstrap.proto (a 4-byte
 * big-endian length, then one Envelope):
 *
 *  - the client (every rank, rank 0 included): blocking calls over a
 *    nonblocking socket, driven by poll() and deadlines. boot_open()
 *    connects (retrying until the deadline: rank 0 may not listen yet), says
 *    Hello and waits for Welcome; boot_allgather() sends a Contribution and
 *    waits for Gathered.
 *    After any failure the client is broken and keeps returning that error.
 *
 *  - the server (rank 0 only): a libevent loop on a thread of its own.
 *
 *      accept -> PENDING --Hello ok--> JOINED --Bye--> LEFT
 *                   |  \--refused--> CLOSING (Error, drain, close)
 *                   \--silent for BOOT_HELLO_TIMEOUT_S--> CLOSING
 *
 *    Strangers never touch the job: whatever they send (a wrong token,
 *    an oversized or undecodable frame, a bad or taken rank, silence), they
 *    are refused with an Error, closed, and named with the reason in rank
 *    0's log. At most BOOT_MAX_STRANGERS connections beyond the ranks still
 *    expected may wait in PENDING; past that the oldest silent one is
 *    dropped, so idle connections can neither exhaust rank 0's descriptors
 *    nor hold up the accept of the ranks to come.
 *
 *    The job is FORMING until every rank is JOINED; then the listener is
 *    closed (the next communicator may bind the same port), the pending
 *    strangers are dropped, everyone gets Welcome and the job is RUNNING:
 *    rounds of Contribution -> Gathered. Any deadline that expires with ranks
 *    missing, or a JOINED rank vanishing without Bye, FAILs the job: every
 *    JOINED client gets an Error naming the ranks concerned and is closed.
 *
 *    Deadlines are the clients' own: a Hello and a Contribution carry what
 *    is left of the sender's timeout, the server arms a timer per connection
 *    with it, and the client itself waits a little longer (BOOT_CLIENT_SLACK_S)
 *    so that it hears the server's explanation instead of guessing.
 *
 *    boot_close() on rank 0 posts a stop event to the loop (the only
 *    cross-thread call: the base is created with libevent's pthread locking),
 *    waits for the other ranks to leave or BOOT_CLOSE_GRACE_S, joins the
 *    thread and frees everything.
 */
#include "bootstrap.h"
#include "eng.h"
#include "netio.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/thread.h>

#include "bootstrap.pb-c.h"
#include "chorus.h"
#include "fsm.h"
#include "watch_srv.h"

#define BOOT_PROTOCOL_VERSION 1
#define BOOT_MAX_FRAME (64u << 20)       /* any frame after Hello */
#define BOOT_MAX_HELLO_FRAME (64u << 10) /* from a client not yet admitted */
#define BOOT_MAX_HOST 255                /* host identity length */
#define BOOT_MAX_TOKEN 4096
#define BOOT_CLIENT_SLACK_S 2.0 /* client waits this much past its deadline */
#define BOOT_CLOSE_GRACE_S 3.0  /* rank 0's server waits this long for leavers */
#define BOOT_LINGER_S 1.0       /* a refused client has this long to read its Error */
#define BOOT_BYE_TIMEOUT_S 1.0
#define BOOT_HELLO_TIMEOUT_S 5.0 /* a client says Hello right after connecting */
#define BOOT_MAX_STRANGERS 64    /* connections waiting for Hello beyond the ranks expected */
#define BOOT_DROP_SCAN 16        /* silent candidates looked at when too many wait */
#define BOOT_LOG_DROPS 32        /* dropped connections logged one by one a window, then counted */
#define BOOT_LOG_WINDOW_S 10.0

typedef Chorus__Boot__Envelope envelope_t;

/* ------------------------------------------------------------------ */
/* common                                                              */
/* ------------------------------------------------------------------ */

static double now_s(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
  struct timespec ts;

  if (s <= 0)
    return;
  ts.tv_sec = (time_t)s;
  ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
  while (nanosleep(&ts, &ts) && errno == EINTR)
    ;
}

static uint32_t to_ms(double s) {
  if (s <= 0.001)
    return 1;
  if (s > 4e6)
    return 4000000000u;
  return (uint32_t)(s * 1000.0);
}

static struct timeval to_tv(double s) {
  struct timeval tv;

  if (s < 0)
    s = 0;
  tv.tv_sec = (time_t)s;
  tv.tv_usec = (suseconds_t)((s - (double)tv.tv_sec) * 1e6);
  return tv;
}

/* "host:port" or "[v6]:port" -> host (brackets removed) and port. */
static int split_hostport(const char *s, char *host, size_t hlen, char *port, size_t plen) {
  const char *colon = strrchr(s, ':');
  const char *h = s;
  size_t n;
  char *end;
  long p;

  if (!colon || colon == s)
    return -1;
  n = (size_t)(colon - s);
  if (s[0] == '[') {
    if (n < 3 || colon[-1] != ']')
      return -1;
    h = s + 1;
    n -= 2;
  } else if (memchr(s, ':', n)) {
    return -1;
  }
  errno = 0;
  p = strtol(colon + 1, &end, 10);
  if (errno || end == colon + 1 || *end || p < 1 || p > 65535)
    return -1;
  if (n + 1 > hlen || strlen(colon + 1) + 1 > plen)
    return -1;
  memcpy(host, h, n);
  host[n] = '\0';
  snprintf(port, plen, "%ld", p);
  return 0;
}

static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

static uint32_t get_be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* One malloc'd frame (length prefix + message). NULL when out of memory or
 * over BOOT_MAX_FRAME (*len then says how big it would have been). */
static uint8_t *frame_pack(const envelope_t *env, size_t *len) {
  size_t n = chorus__boot__envelope__get_packed_size(env);
  uint8_t *buf;

  *len = n + 4;
  if (n > BOOT_MAX_FRAME)
    return NULL;
  buf = malloc(n + 4);
  if (!buf)
    return NULL;
  put_be32(buf, (uint32_t)n);
  chorus__boot__envelope__pack(env, buf + 4);
  return buf;
}

/* The body of a frame from outside, decoded: NULL when it is not an
 * Envelope or holds no message. Free with ..._envelope__free_unpacked. */
static envelope_t *msg_unpack(const uint8_t *body, size_t n) {
  envelope_t *env = chorus__boot__envelope__unpack(NULL, n, body);

  if (env && env->msg_case == CHORUS__BOOT__ENVELOPE__MSG__NOT_SET) {
    chorus__boot__envelope__free_unpacked(env, NULL);
    return NULL;
  }
  return env;
}

/* Compare tokens without an early exit on the first differing byte. */
static bool token_equal(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen) {
  size_t i, n = alen > blen ? alen : blen;
  volatile uint8_t diff = alen == blen ? 0 : 1;

  for (i = 0; i < n; i++) {
    uint8_t x = i < alen ? a[i] : 0;
    uint8_t y = i < blen ? b[i] : 0;
    diff |= (uint8_t)(x ^ y);
  }
  return diff == 0;
}

/* "rank 3", "ranks 3,5", "ranks 0,2-9" (runs of three or more as ranges). */
static void fmt_ranks(char *buf, size_t len, const int *r, int n) {
  size_t off;
  int i = 0, j;

  off = (size_t)snprintf(buf, len, n == 1 ? "rank " : "ranks ");
  while (i < n && off < len) {
    char item[32];

    for (j = i; j + 1 < n && r[j + 1] == r[j] + 1;)
      j++;
    if (j - i >= 2)
      snprintf(item, sizeof(item), "%d-%d", r[i], r[j]);
    else if (j == i + 1)
      snprintf(item, sizeof(item), "%d,%d", r[i], r[j]);
    else
      snprintf(item, sizeof(item), "%d", r[i]);
    if (off + strlen(item) + 24 >= len) {
      snprintf(buf + off, len - off, ",... (%d in all)", n);
      return;
    }
    off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? "," : "", item);
    i = j + 1;
  }
}

void boot_host_identity(char *out, size_t len) {
  char host[256] = "unknown";
  char id[64] = "unknown";
  ssize_t n;
  int fd;

  if (!out || !len)
    return;
  if (gethostname(host, sizeof(host) - 1) || !host[0])
    snprintf(host, sizeof(host), "unknown");
  host[sizeof(host) - 1] = '\0';
  fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    n = read(fd, id, sizeof(id) - 1);
    if (n > 0) {
      id[n] = '\0';
      id[strcspn(id, "\r\n")] = '\0';
    }
    close(fd);
  }
  snprintf(out, len, "%s/%s", host, id);
}

/* ------------------------------------------------------------------ */
/* server (rank 0)                                                     */
/* ------------------------------------------------------------------ */

enum job_state { JOB_FORMING, JOB_RUNNING, JOB_FAILED };
enum conn_state { CONN_PENDING, CONN_JOINED, CONN_LEFT, CONN_CLOSING };

struct boot_server;

struct srv_conn {
  LIST_ENTRY(srv_conn) link;
  TAILQ_ENTRY(srv_conn) plink; /* in srv->pending, oldest first, while PENDING */
  struct boot_server *srv;
  struct bufferevent *bev; /* owns the fd */
  struct event *timer;     /* Hello, round or linger deadline, per state */
  enum conn_state state;
  bool shut;        /* CLOSING: write side already shut down */
  int rank;         /* -1 until JOINED */
  double timeout_s; /* the client's budget for what it waits on */
  char peer[64];    /* "ip:port", for messages */
  bool watch;       /* JOINED as rank's watchdog connection, not its bootstrap */
  bool watch_bye;   /* said WatchBye: its close is no loss */
};

struct boot_server {
  struct event_base *base;
  struct evconnlistener *lis; /* NULL once the job formed or failed */
  struct event *stop_ev;      /* activated by rank 0's thread */
  struct event *grace_ev;
  struct event *relisten_ev; /* re-enables accept after EMFILE */
  pthread_t thread;
  LIST_HEAD(, srv_conn) conns;
  int nconns;
  TAILQ_HEAD(, srv_conn) pending; /* PENDING connections, oldest first */
  int npending;
  /* The log's rate limit on dropped connections (srv_log_drop), by kind:
   * [0] junk, silence, floods; [1] clients refused at their Hello
   * (note_refusal), which a burst of junk must not hide. */
  struct drop_log {
    double since;      /* the window's start */
    int shown, hidden; /* lines in this window; drops counted, not shown */
    char last[320];    /* the latest of those */
  } drops[2];
  bool hello_refused; /* note_refusal: the drop logged next is a refused Hello */
  bool drops_timer;   /* a summary line is due at the window's end */
  enum job_state state;
  bool stopping;
  int size;
  char addr[512]; /* the rendezvous as the user wrote it */
  uint8_t *token;
  size_t token_len;
  double timeout_s;          /* rank 0's */
  double hello_timeout_s;    /* a connection silent this long is dropped */
  struct srv_conn **by_rank; /* JOINED or LEFT connection of each rank */
  char **hosts;              /* host identity of each rank */
  char **notes;              /* why a client claiming a rank was refused */
  int njoined;
  uint64_t round;
  ProtobufCBinaryData *contrib; /* this round's contributions */
  bool *contributed;
  int ncontrib;
  bool *left; /* said Bye */
  int lost;   /* a rank whose connection closed without Bye between rounds, or -1 */
  /* the watchdog (watch_srv.h), when configured */
  wsrv_t *ws;
  struct event *tick_ev;
  struct srv_conn **watch_by_rank;
};

static pthread_once_t evthread_once = PTHREAD_ONCE_INIT;
static int evthread_rc;

static void evthread_init(void) {
  evthread_rc = evthread_use_pthreads();
}

static void srv_check_exit(struct boot_server *srv) {
  if (srv->stopping && srv->nconns == 0)
    event_base_loopbreak(srv->base);
}

/* A connection leaves PENDING: it joined, was refused or is gone. */
static void conn_unpend(struct srv_conn *c) {
  if (c->state == CONN_PENDING) {
    TAILQ_REMOVE(&c->srv->pending, c, plink);
    c->srv->npending--;
  }
}

/* The drops counted but not shown, one line per kind. */
static void srv_log_flush(struct boot_server *srv) {
  static const char *const what[2] = {"connections dropped", "clients refused at their Hello"};
  double now = now_s();

  for (int k = 0; k < 2; k++) {
    struct drop_log *d = &srv->drops[k];

    if (!d->hidden)
      continue;
    eng_log(ENG_WARN, 0, "bootstrap",
            "rendezvous %s: %d more %s in the last %.0f s, not shown one by one (the latest %s)",
            srv->addr, d->hidden, what[k], now - d->since, d->last);
    d->hidden = 0;
  }
}

static void on_drops_timer(evutil_socket_t fd, short what, void *arg) {
  struct boot_server *srv = arg;

  (void)fd;
  (void)what;
  srv->drops_timer = false;
  srv_log_flush(srv);
}

/* One line per connection dropped, naming it and why, at the default
 * level: BOOT_LOG_DROPS of each kind a BOOT_LOG_WINDOW_S window; past that
 * they are counted and told in one line when the window ends. A refused
 * Hello (wrong token, version, size, duplicate rank) has a budget of its
 * own: a flood of junk does not hide it. */
static void srv_log_drop(struct boot_server *srv, const struct srv_conn *c, const char *why) {
  struct drop_log *d = &srv->drops[srv->hello_refused];
  double now = now_s();

  srv->hello_refused = false;
  if (now - d->since >= BOOT_LOG_WINDOW_S) {
    srv_log_flush(srv);
    d->since = now;
    d->shown = 0;
  }
  if (d->shown < BOOT_LOG_DROPS) {
    eng_log(ENG_WARN, 0, "bootstrap", "rendezvous %s: dropped the connection from %s: %s",
            srv->addr, c->peer, why);
    if (++d->shown == BOOT_LOG_DROPS)
      eng_log(ENG_WARN, 0, "bootstrap",
              "rendezvous %s: %d %s in %.1f s; until %.0f s have passed, further ones are "
              "counted and told in one line",
              srv->addr, BOOT_LOG_DROPS, d == srv->drops ? "connections dropped" : "Hellos refused",
              now - d->since, BOOT_LOG_WINDOW_S);
    return;
  }
  d->hidden++;
  snprintf(d->last, sizeof(d->last), "from %.64s: %.240s", c->peer, why);
  if (!srv->drops_timer) {
    struct timeval tv = to_tv(d->since + BOOT_LOG_WINDOW_S - now);

    srv->drops_timer = event_base_once(srv->base, -1, EV_TIMEOUT, on_drops_timer, srv, &tv) == 0;
  }
}

static void conn_free(struct srv_conn *c) {
  struct boot_server *srv = c->srv;

  conn_unpend(c);
  LIST_REMOVE(c, link);
  srv->nconns--;
  if (c->rank >= 0 && srv->by_rank[c->rank] == c)
    srv->by_rank[c->rank] = NULL;
  if (c->rank >= 0 && srv->watch_by_rank && srv->watch_by_rank[c->rank] == c)
    srv->watch_by_rank[c->rank] = NULL;
  event_free(c->timer);
  bufferevent_free(c->bev);
  free(c);
  srv_check_exit(srv);
}

static void conn_shutdown_write(struct srv_conn *c) {
  if (!c->shut) {
    c->shut = true;
    shutdown(bufferevent_getfd(c->bev), SHUT_WR);
  }
}

/* Flush `frame` (may be NULL), shut the write side, drain what the client
 * still sends and free the connection on its EOF or after BOOT_LINGER_S.
 * Closing at once would reset the connection and could lose the frame. */
static void conn_close(struct srv_conn *c, const uint8_t *frame, size_t len) {
  struct timeval tv = to_tv(BOOT_LINGER_S);

  if (c->state == CONN_CLOSING)
    return;
  conn_unpend(c);
  c->state = CONN_CLOSING;
  if (frame)
    bufferevent_write(c->bev, frame, len);
  if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
    conn_shutdown_write(c);
  evtimer_add(c->timer, &tv);
}

static uint8_t *error_frame(Chorus__Boot__ErrorCode code, const char *msg, const int *ranks,
                            int nranks, size_t *len) {
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  Chorus__Boot__Error e = CHORUS__BOOT__ERROR__INIT;
  uint32_t *r = NULL;
  uint8_t *frame;
  int i;

  if (nranks > 0) {
    r = calloc((size_t)nranks, sizeof(*r));
    if (r) {
      for (i = 0; i < nranks; i++)
        r[i] = (uint32_t)ranks[i];
      e.n_ranks = (size_t)nranks;
      e.ranks = r;
    }
  }
  e.code = code;
  e.message = (char *)msg;
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_ERROR;
  env.error = &e;
  frame = frame_pack(&env, len);
  free(r);
  return frame;
}

/* Refuse a client that is not (yet) part of the job, with an Error saying
 * why and a line in rank 0's log naming it; the others go on. */
static void conn_refuse(struct srv_conn *c, Chorus__Boot__ErrorCode code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void conn_refuse(struct srv_conn *c, Chorus__Boot__ErrorCode code, const char *fmt, ...) {
  char msg[1024];
  uint8_t *frame;
  size_t len;
  va_list ap;

  if (c->state == CONN_CLOSING)
    return;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  srv_log_drop(c->srv, c, msg);
  frame = error_frame(code, msg, NULL, 0, &len);
  conn_close(c, frame, len);
  free(frame);
}

static void free_contributions(struct boot_server *srv) {
  int r;

  for (r = 0; r < srv->size; r++) {
    free(srv->contrib[r].data);
    srv->contrib[r].data = NULL;
    srv->contrib[r].len = 0;
    srv->contributed[r] = false;
  }
  srv->ncontrib = 0;
}

static void srv_close_listener(struct boot_server *srv) {
  if (srv->lis) {
    evconnlistener_free(srv->lis);
    srv->lis = NULL;
  }
  evtimer_del(srv->relisten_ev);
}

/* The job cannot go on: tell every member why and close them all. */
static void job_fail(struct boot_server *srv, Chorus__Boot__ErrorCode code, const int *ranks,
                     int nranks, const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void job_fail(struct boot_server *srv, Chorus__Boot__ErrorCode code, const int *ranks,
                     int nranks, const char *fmt, ...) {
  struct srv_conn *c, *next;
  uint8_t *frame;
  char msg[1024];
  size_t len;
  va_list ap;

  if (srv->state == JOB_FAILED)
    return;
  srv->state = JOB_FAILED;
  srv_close_listener(srv);
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  frame = error_frame(code, msg, ranks, nranks, &len);
  for (c = LIST_FIRST(&srv->conns); c; c = next) {
    next = LIST_NEXT(c, link);
    if (c->state == CONN_JOINED) /* a watchdog connection got the verdict first */
      conn_close(c, frame, len);
    else if (c->state == CONN_PENDING)
      conn_close(c, NULL, 0);
  }
  free(frame);
  free_contributions(srv);
}

/* Ranks not joined (forming) or not contributed (running). */
static int missing_ranks(const struct boot_server *srv, int *out) {
  int r, n = 0;

  for (r = 0; r < srv->size; r++) {
    bool here = srv->state == JOB_FORMING ? srv->by_rank[r] != NULL : srv->contributed[r];
    if (!here)
      out[n++] = r;
  }
  return n;
}

static void fail_missing(struct boot_server *srv, double waited_s) {
  char list[512], notes[512] = "";
  size_t off = 0;
  int *miss, n, i, shown = 0;

  miss = calloc((size_t)srv->size, sizeof(*miss));
  if (!miss) {
    job_fail(srv, CHORUS__BOOT__ERROR_CODE__ERROR_TIMEOUT, NULL, 0,
             "ranks never arrived at the rendezvous %s within %.1f s", srv->addr, waited_s);
    return;
  }
  n = missing_ranks(srv, miss);
  fmt_ranks(list, sizeof(list), miss, n);
  for (i = 0; i < n && shown < 3; i++) {
    const char *note = srv->notes[miss[i]];
    if (note && off < sizeof(notes)) {
      off += (size_t)snprintf(notes + off, sizeof(notes) - off, "%s%s", shown ? "; " : " (", note);
      shown++;
    }
  }
  if (shown && off < sizeof(notes))
    snprintf(notes + off, sizeof(notes) - off, ")");
  if (srv->state == JOB_FORMING)
    job_fail(srv, CHORUS__BOOT__ERROR_CODE__ERROR_TIMEOUT, miss, n,
             "%s never arrived at the rendezvous %s within %.1f s%s", list, srv->addr, waited_s,
             notes);
  else
    job_fail(srv, CHORUS__BOOT__ERROR_CODE__ERROR_TIMEOUT, miss, n,
             "%s never reached bootstrap round %llu at the rendezvous %s within %.1f s", list,
             (unsigned long long)srv->round, srv->addr, waited_s);
  free(miss);
}

/* One packed frame referenced by the output buffers of every member: the
 * host table and each round's answer are O(size) bytes, and copying them per
 * client would make the server hold O(size^2). Only the server thread
 * touches the count. */
struct shared_frame {
  int refs;
  size_t len;
  uint8_t *data;
};

static void shared_frame_unref(const void *data, size_t len, void *arg) {
  struct shared_frame *f = arg;

  if (--f->refs == 0) {
    free(f->data);
    free(f);
  }
}

/* Send env to every JOINED client and stop their timers. Returns 0, or -1
 * when the frame cannot be built (*len then says how big it would be). */
static int send_all_joined(struct boot_server *srv, const envelope_t *env, size_t *len) {
  struct shared_frame *f = calloc(1, sizeof(*f));
  struct srv_conn *c;

  if (!f)
    return -1;
  f->data = frame_pack(env, len);
  if (!f->data) {
    free(f);
    return -1;
  }
  f->len = *len;
  f->refs = 1;
  LIST_FOREACH(c, &srv->conns, link) {
    if (c->state != CONN_JOINED)
      continue;
    evtimer_del(c->timer);
    f->refs++;
    if (evbuffer_add_reference(bufferevent_get_output(c->bev), f->data, f->len, shared_frame_unref,
                               f))
      f->refs--; /* that client will time out and fail the job */
  }
  shared_frame_unref(f->data, f->len, f);
  return 0;
}

static void job_welcome(struct boot_server *srv) {
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  Chorus__Boot__Welcome w = CHORUS__BOOT__WELCOME__INIT;
  struct srv_conn *c, *next;
  size_t len;

  srv->state = JOB_RUNNING;
  srv_close_listener(srv);
  for (c = LIST_FIRST(&srv->conns); c; c = next) {
    next = LIST_NEXT(c, link);
    if (c->state == CONN_PENDING) {
      srv_log_drop(srv, c, "the job formed before it said Hello");
      conn_close(c, NULL, 0);
    }
  }
  w.size = (uint32_t)srv->size;
  w.n_hosts = (size_t)srv->size;
  w.hosts = srv->hosts;
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_WELCOME;
  env.welcome = &w;
  if (send_all_joined(srv, &env, &len))
    job_fail(srv, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, NULL, 0,
             "the rendezvous %s could not build its host table (%zu bytes)", srv->addr, len);
}

static void note_refusal(struct boot_server *srv, struct srv_conn *c, uint32_t rank,
                         const char *why) {
  char buf[256];

  srv->hello_refused = true; /* the drop that follows is logged as one */
  if (rank >= (uint32_t)srv->size)
    return;
  snprintf(buf, sizeof(buf), "rank %u: a client from %s claiming it was refused: %s", rank, c->peer,
           why);
  free(srv->notes[rank]);
  srv->notes[rank] = strdup(buf);
}

/* A host identity goes into every rank's topology and into messages: no
 * empty one, no control characters (bytes of UTF-8 names pass). */
static bool host_valid(const char *h) {
  const unsigned char *p = (const unsigned char *)h;

  if (!*p)
    return false;
  for (; *p; p++)
    if (*p < 0x20 || *p == 0x7f)
      return false;
  return true;
}

static void on_hello(struct srv_conn *c, const Chorus__Boot__Hello *h) {
  struct boot_server *srv = c->srv;
  struct timeval tv;
  uint32_t r = h->rank;

  if (c->state != CONN_PENDING) {
    if (c->state == CONN_JOINED)
      job_fail(srv, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, &c->rank, 1,
               "rank %d said Hello twice at the rendezvous %s", c->rank, srv->addr);
    return;
  }
  if (h->version != BOOT_PROTOCOL_VERSION) {
    note_refusal(srv, c, r, "protocol version mismatch");
    conn_refuse(c, CHORUS__BOOT__ERROR_CODE__ERROR_VERSION,
                "bootstrap protocol version %u refused by the rendezvous %s, which speaks "
                "version %u (mixed Chorus versions in one job?)",
                h->version, srv->addr, BOOT_PROTOCOL_VERSION);
    return;
  }
  if (!token_equal(h->token.data, h->token.len, srv->token, srv->token_len)) {
    note_refusal(srv, c, r, "wrong job token");
    conn_refuse(c, CHORUS__BOOT__ERROR_CODE__ERROR_AUTH,
                "job token mismatch: the rendezvous %s refused rank %u because its job token "
                "(CHORUS_JOB_TOKEN) differs from rank 0's",
                srv->addr, r);
    return;
  }
  if (h->size != (uint32_t)srv->size) {
    note_refusal(srv, c, r, "job size mismatch");
    conn_refuse(c, CHORUS__BOOT__ERROR_CODE__ERROR_SIZE_MISMATCH,
                "job size mismatch: rank %u says the job has %u ranks, rank 0 at the rendezvous "
                "%s says %d",
                r, h->size, srv->addr, srv->size);
    return;
  }
  if (r >= (uint32_t)srv->size) {
    conn_refuse(c, CHORUS__BOOT__ERROR_CODE__ERROR_BAD_RANK,
                "rank %u is out of range for a job of %d ranks (rendezvous %s)", r, srv->size,
                srv->addr);
    return;
  }
  if (srv->by_rank[r]) {
    note_refusal(srv, c, r, "duplicate rank");
    conn_refuse(c, CHORUS__BOOT__ERROR_CODE__ERROR_DUPLICATE_RANK,
                "rank %u is already taken at the rendezvous %s by %s (host %s): two processes "
                "were given the same rank",
                r, srv->addr, srv->by_rank[r]->peer, srv->hosts[r] ? srv->hosts[r] : "?");
    return;
  }
  if (strlen(h->host) > BOOT_MAX_HOST) {
    conn_refuse(c, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL,
                "host identity of rank %u is too long (%zu bytes, at most %d)", r, strlen(h->host),
                BOOT_MAX_HOST);
    return;
  }
  if (!host_valid(h->host)) {
    conn_refuse(c, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL,
                "host identity of rank %u is empty or holds control characters", r);
    return;
  }
  free(srv->hosts[r]);
  srv->hosts[r] = strdup(h->host);
  if (!srv->hosts[r]) {
    conn_refuse(c, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, "rendezvous out of memory");
    return;
  }
  conn_unpend(c);
  c->rank = (int)r;
  c->state = CONN_JOINED;
  c->timeout_s = h->timeout_ms ? h->timeout_ms / 1000.0 : srv->timeout_s;
  srv->by_rank[r] = c;
  srv->njoined++;
  tv = to_tv(c->timeout_s);
  evtimer_add(c->timer, &tv);
  if (srv->njoined == srv->size)
    job_welcome(srv);
}

static void round_complete(struct boot_server *srv) {
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  Chorus__Boot__Gathered g = CHORUS__BOOT__GATHERED__INIT;
  size_t len;

  g.round = srv->round;
  g.n_data = (size_t)srv->size;
  g.data = srv->contrib;
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_GATHERED;
  env.gathered = &g;
  if (send_all_joined(srv, &env, &len)) {
    job_fail(srv, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, NULL, 0,
             "bootstrap round %llu: the gathered contributions take %zu bytes, over the "
             "%u-byte frame limit (or out of memory)",
             (unsigned long long)srv->round, len, BOOT_MAX_FRAME);
    return;
  }
  free_contributions(srv);
  srv->round++;
}

static void on_contribution(struct srv_conn *c, Chorus__Boot__Contribution *m) {
  struct boot_server *srv = c->srv;
  struct timeval tv;
  int r = c->rank, i;

  if (c->state != CONN_JOINED || srv->state != JOB_RUNNING) {
    if (c->state == CONN_JOINED)
      job_fail(srv, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, &r, 1,
               "rank %d sent a bootstrap round before the job formed", r);
    else
      conn_refuse(c, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL,
                  "a Contribution from a client that is not part of the job");
    return;
  }
  if (m->round != srv->round || srv->contributed[r]) {
    job_fail(srv, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, &r, 1,
             "rank %d sent bootstrap round %llu while the rendezvous %s is at round %llu%s", r,
             (unsigned long long)m->round, srv->addr, (unsigned long long)srv->round,
             srv->contributed[r] ? " (twice)" : "");
    return;
  }
  for (i = 0; i < srv->size; i++) {
    if (srv->left[i]) {
      job_fail(srv, CHORUS__BOOT__ERROR_CODE__ERROR_PEER_LOST, &i, 1,
               "bootstrap round %llu cannot complete: rank %d already closed its bootstrap "
               "(ranks must make the same bootstrap calls in the same order)",
               (unsigned long long)srv->round, i);
      return;
    }
  }
  if (srv->lost >= 0) {
    /* e.g. a rank killed after its Hello, before the rounds that form the
     * communicator: nobody waits for it until the connect timeout */
    int l = srv->lost;
    job_fail(srv, CHORUS__BOOT__ERROR_CODE__ERROR_PEER_LOST, &l, 1,
             "bootstrap round %llu cannot complete: rank %d (%s) closed its rendezvous "
             "connection without saying goodbye (did the process die?)",
             (unsigned long long)srv->round, l, srv->hosts[l] ? srv->hosts[l] : "?");
    return;
  }
  /* Take the bytes over from the unpacked message: it is freed after us. */
  srv->contrib[r] = m->data;
  m->data.data = NULL;
  m->data.len = 0;
  srv->contributed[r] = true;
  srv->ncontrib++;
  c->timeout_s = m->timeout_ms ? m->timeout_ms / 1000.0 : srv->timeout_s;
  tv = to_tv(c->timeout_s);
  evtimer_add(c->timer, &tv);
  if (srv->ncontrib == srv->size)
    round_complete(srv);
}

static void on_bye(struct srv_conn *c) {
  struct boot_server *srv = c->srv;
  int r = c->rank;

  if (c->state != CONN_JOINED) {
    conn_close(c, NULL, 0);
    return;
  }
  c->state = CONN_LEFT;
  srv->left[r] = true;
  evtimer_del(c->timer);
  if (srv->state == JOB_FORMING)
    job_fail(srv, CHORUS__BOOT__ERROR_CODE__ERROR_PEER_LOST, &r, 1,
             "rank %d left the rendezvous %s before all ranks arrived", r, srv->addr);
  else if (srv->state == JOB_RUNNING && srv->ncontrib > 0)
    job_fail(srv, CHORUS__BOOT__ERROR_CODE__ERROR_PEER_LOST, &r, 1,
             "rank %d closed its bootstrap while round %llu was in progress", r,
             (unsigned long long)srv->round);
}

/* A rank's watchdog connection (bootstrap.proto): admitted like a Hello,
 * once the job runs. */
static void on_watch_hello(struct srv_conn *c, const Chorus__Boot__WatchHello *h) {
  struct boot_server *srv = c->srv;
  uint32_t r = h->rank;

  if (c->state != CONN_PENDING) {
    conn_refuse(c, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, "WatchHello twice");
    return;
  }
  if (h->version != BOOT_PROTOCOL_VERSION ||
      !token_equal(h->token.data, h->token.len, srv->token, srv->token_len) ||
      h->size != (uint32_t)srv->size || r >= (uint32_t)srv->size) {
    conn_refuse(c, CHORUS__BOOT__ERROR_CODE__ERROR_AUTH,
                "the rendezvous %s refused a watchdog connection (claiming rank %u of %u): wrong "
                "version, token, size or rank",
                srv->addr, r, h->size);
    return;
  }
  if (!srv->ws || srv->state == JOB_FAILED || srv->watch_by_rank[r]) {
    conn_refuse(c, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, "the rendezvous %s has %s for rank %u",
                srv->addr,
                !srv->ws                   ? "no watchdog"
                : srv->state == JOB_FAILED ? "no job"
                                           : "a watchdog connection already",
                r);
    return;
  }
  conn_unpend(c);
  evtimer_del(c->timer);
  c->rank = (int)r;
  c->state = CONN_JOINED;
  c->watch = true;
  srv->watch_by_rank[r] = c;
  wsrv_join(srv->ws, (int)r, now_s());

  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  Chorus__Boot__WatchWelcome w = CHORUS__BOOT__WATCH_WELCOME__INIT;
  size_t len;
  w.t_client_ns = h->t_client_ns;
  w.t_server_ns = fsm_now_ns();
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_WATCH_WELCOME;
  env.watch_welcome = &w;
  uint8_t *frame = frame_pack(&env, &len);
  if (frame)
    bufferevent_write(c->bev, frame, len);
  free(frame);
}

static void on_watch_message(struct srv_conn *c, envelope_t *env) {
  struct boot_server *srv = c->srv;

  switch (env->msg_case) {
  case CHORUS__BOOT__ENVELOPE__MSG_BEAT:
    wsrv_beat(srv->ws, c->rank, env->beat, now_s());
    break;
  case CHORUS__BOOT__ENVELOPE__MSG_WATCH_BYE:
    c->watch_bye = true;
    wsrv_bye(srv->ws, c->rank);
    break;
  default:
    eng_log(ENG_WARN, 0, "bootstrap", "rendezvous %s: rank %d's watchdog sent message kind %d",
            srv->addr, c->rank, (int)env->msg_case);
    break;
  }
}

/* Into the kernel at once where nothing is queued before it: a verdict must
 * reach every rank even when rank 0's process exits right after its own
 * copy made it fail (an application that exits on the error without
 * destroying): the event loop's write would never come, and the others
 * would read only "rank 0 is lost". */
static void ws_send(void *arg, int rank, const uint8_t *frame, size_t len) {
  struct boot_server *srv = arg;
  struct srv_conn *c = srv->watch_by_rank ? srv->watch_by_rank[rank] : NULL;

  if (!c || c->state != CONN_JOINED)
    return;
  if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0) {
    ssize_t n = send(bufferevent_getfd(c->bev), frame, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      frame += n;
      len -= (size_t)n;
    }
  }
  if (len)
    bufferevent_write(c->bev, frame, len);
}

static void on_watch_tick(evutil_socket_t fd, short what, void *arg) {
  struct boot_server *srv = arg;

  if (srv->ws)
    wsrv_tick(srv->ws, now_s());
}

static void on_message(struct srv_conn *c, envelope_t *env) {
  int r = c->rank;

  if (c->watch) {
    on_watch_message(c, env);
    return;
  }
  switch (env->msg_case) {
  case CHORUS__BOOT__ENVELOPE__MSG_WATCH_HELLO:
    on_watch_hello(c, env->watch_hello);
    break;
  case CHORUS__BOOT__ENVELOPE__MSG_HELLO:
    on_hello(c, env->hello);
    break;
  case CHORUS__BOOT__ENVELOPE__MSG_CONTRIBUTION:
    on_contribution(c, env->contribution);
    break;
  case CHORUS__BOOT__ENVELOPE__MSG_BYE:
    on_bye(c);
    break;
  default:
    if (c->state == CONN_JOINED)
      job_fail(c->srv, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, &r, 1,
               "rank %d sent an unexpected message (kind %d) to the rendezvous %s", r,
               (int)env->msg_case, c->srv->addr);
    else
      conn_refuse(c, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL,
                  "unexpected message (kind %d): the rendezvous %s expects a Hello",
                  (int)env->msg_case, c->srv->addr);
    break;
  }
}

static void on_protocol_error(struct srv_conn *c, const char *what, size_t n) {
  struct boot_server *srv = c->srv;
  int r = c->rank;

  if (c->state == CONN_JOINED)
    job_fail(srv, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, &r, 1,
             "rank %d sent a %s (%zu bytes) to the rendezvous %s", r, what, n, srv->addr);
  else
    conn_refuse(c, CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL,
                "the rendezvous %s refused a %s (%zu bytes); is this a Chorus client?", srv->addr,
                what, n);
  conn_close(c, NULL, 0); /* no-op when closing already; the reader must not loop */
}

static void on_read(struct bufferevent *bev, void *arg) {
  struct srv_conn *c = arg;
  struct evbuffer *in = bufferevent_get_input(bev);

  for (;;) {
    size_t avail = evbuffer_get_length(in);
    uint32_t max, n;
    uint8_t hdr[4];
    envelope_t *env;
    unsigned char *body;

    if (c->state == CONN_CLOSING || c->state == CONN_LEFT) {
      evbuffer_drain(in, avail);
      return;
    }
    if (avail < 4)
      return;
    evbuffer_copyout(in, hdr, 4);
    n = get_be32(hdr);
    max = c->state == CONN_PENDING ? BOOT_MAX_HELLO_FRAME : BOOT_MAX_FRAME;
    if (n > max) {
      on_protocol_error(c, "frame over the size limit", n);
      continue;
    }
    if (avail < (size_t)n + 4)
      return;
    evbuffer_drain(in, 4);
    body = evbuffer_pullup(in, n);
    env = msg_unpack(body, n);
    evbuffer_drain(in, n);
    if (!env) {
      on_protocol_error(c, "malformed message", n);
      continue;
    }
    on_message(c, env);
    chorus__boot__envelope__free_unpacked(env, NULL);
  }
}

static void on_write(struct bufferevent *bev, void *arg) {
  struct srv_conn *c = arg;

  if (c->state == CONN_CLOSING && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
    conn_shutdown_write(c);
}

static void on_conn_event(struct bufferevent *bev, short what, void *arg) {
  struct srv_conn *c = arg;
  struct boot_server *srv = c->srv;
  int r = c->rank;

  if (!(what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)))
    return;
  if (c->watch) {
    if (c->state == CONN_JOINED && !c->watch_bye && srv->ws)
      wsrv_lost(srv->ws, r, "its watchdog connection closed without goodbye (did the process die?)",
                now_s());
    conn_free(c);
    return;
  }
  if (c->state == CONN_JOINED && srv->state == JOB_RUNNING && srv->ws && srv->ncontrib == 0) {
    /* the watchdog tells every rank, naming where they wait */
    c->state = CONN_CLOSING;
    if (srv->lost < 0)
      srv->lost = r; /* a later round can not complete: it fails at once */
    wsrv_lost(srv->ws, r, "its rendezvous connection closed without goodbye (did the process die?)",
              now_s());
    conn_free(c);
    return;
  }
  if (c->state == CONN_JOINED) {
    /* Out of the recipients before the job fails: it cannot hear anymore. */
    c->state = CONN_CLOSING;
    if (srv->state == JOB_FORMING)
      job_fail(srv, CHORUS__BOOT__ERROR_CODE__ERROR_PEER_LOST, &r, 1,
               "rank %d (%s) left the rendezvous %s before all ranks arrived", r,
               srv->hosts[r] ? srv->hosts[r] : "?", srv->addr);
    else
      job_fail(srv, CHORUS__BOOT__ERROR_CODE__ERROR_PEER_LOST, &r, 1,
               "rank %d (%s) closed its rendezvous connection without saying goodbye (did the "
               "process die?)",
               r, srv->hosts[r] ? srv->hosts[r] : "?");
  }
  conn_free(c);
}

static void on_conn_timer(evutil_socket_t fd, short what, void *arg) {
  struct srv_conn *c = arg;
  struct boot_server *srv = c->srv;

  switch (c->state) {
  case CONN_PENDING:
    conn_refuse(c, CHORUS__BOOT__ERROR_CODE__ERROR_TIMEOUT,
                "no Hello within %.1f s: the rendezvous %s closes this connection",
                srv->hello_timeout_s, srv->addr);
    break;
  case CONN_JOINED:
    if (srv->state == JOB_FORMING || (srv->state == JOB_RUNNING && srv->ncontrib > 0))
      fail_missing(srv, c->timeout_s);
    break;
  case CONN_CLOSING:
    conn_free(c);
    break;
  case CONN_LEFT:
    break;
  }
}

/* "ip:port" of a peer; "[v6]:port"; an IPv4 client of the dual-stack
 * listener as plain IPv4. */
static void fmt_peer(const struct sockaddr *sa, char *out, size_t len) {
  char ip[INET6_ADDRSTRLEN] = "?";

  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
    snprintf(out, len, "%s:%d", ip, ntohs(in->sin_port));
  } else if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], ip, sizeof(ip));
      snprintf(out, len, "%s:%d", ip, ntohs(in6->sin6_port));
    } else {
      inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
      snprintf(out, len, "[%s]:%d", ip, ntohs(in6->sin6_port));
    }
  } else {
    snprintf(out, len, "?");
  }
}

/* Whether a client waiting for its Hello sent anything yet. */
static bool conn_has_spoken(const struct srv_conn *c) {
  char b;

  if (evbuffer_get_length(bufferevent_get_input(c->bev)) > 0)
    return true;
  return recv(bufferevent_getfd(c->bev), &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

/* Too many connections wait for their Hello: drop one, so that strangers
 * hold a bounded number of rank 0's descriptors and never stop the accept of
 * the ranks still to come. The victim is the oldest that sent nothing yet
 * among the BOOT_DROP_SCAN oldest (a rank says Hello as soon as it is
 * connected, so its bytes are likely already here even in a burst of
 * connections), else the oldest. Its Error is written straight to the
 * socket, best effort (nothing was queued for it yet), and it is closed at
 * once rather than lingering on a descriptor. */
static void srv_drop_pending(struct boot_server *srv) {
  struct srv_conn *c, *victim = TAILQ_FIRST(&srv->pending);
  uint8_t *frame;
  char msg[1024];
  bool silent = false;
  size_t len;
  int i = 0;

  TAILQ_FOREACH(c, &srv->pending, plink) {
    if (i++ == BOOT_DROP_SCAN)
      break;
    if (!conn_has_spoken(c)) {
      victim = c;
      silent = true;
      break;
    }
  }
  snprintf(msg, sizeof(msg),
           "%d connections are waiting to say Hello at the rendezvous %s (at most %d while %d "
           "ranks are expected); the oldest %sis dropped",
           srv->npending, srv->addr, srv->size - srv->njoined + BOOT_MAX_STRANGERS,
           srv->size - srv->njoined, silent ? "that said nothing " : "");
  srv_log_drop(srv, victim, msg);
  frame = error_frame(CHORUS__BOOT__ERROR_CODE__ERROR_PROTOCOL, msg, NULL, 0, &len);
  if (frame)
    (void)send(bufferevent_getfd(victim->bev), frame, len, MSG_DONTWAIT | MSG_NOSIGNAL);
  free(frame);
  conn_free(victim);
}

/* Take a connected socket as a new client (PENDING, with its Hello
 * deadline). The fd is closed on failure. */
static void srv_adopt(struct boot_server *srv, evutil_socket_t fd, const char *peer) {
  struct timeval tv = to_tv(srv->hello_timeout_s);
  struct srv_conn *c;
  int one = 1;

  if (srv->state != JOB_FORMING || srv->stopping)
    goto out_close_fd;
  while (srv->npending > 0 && srv->npending >= srv->size - srv->njoined + BOOT_MAX_STRANGERS)
    srv_drop_pending(srv);
  c = calloc(1, sizeof(*c));
  if (!c)
    goto out_close_fd;
  c->srv = srv;
  c->rank = -1;
  c->state = CONN_PENDING;
  snprintf(c->peer, sizeof(c->peer), "%s", peer);
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  c->timer = evtimer_new(srv->base, on_conn_timer, c);
  if (!c->timer)
    goto out_free_conn;
  c->bev = bufferevent_socket_new(srv->base, fd, BEV_OPT_CLOSE_ON_FREE);
  if (!c->bev)
    goto out_free_timer;
  bufferevent_setcb(c->bev, on_read, on_write, on_conn_event, c);
  if (bufferevent_enable(c->bev, EV_READ | EV_WRITE))
    goto out_free_bev;
  LIST_INSERT_HEAD(&srv->conns, c, link);
  srv->nconns++;
  TAILQ_INSERT_TAIL(&srv->pending, c, plink);
  srv->npending++;
  evtimer_add(c->timer, &tv);
  return;

out_free_bev:
  bufferevent_free(c->bev); /* closes fd */
  event_free(c->timer);
  free(c);
  return;
out_free_timer:
  event_free(c->timer);
out_free_conn:
  free(c);
out_close_fd:
  evutil_closesocket(fd);
}

static void on_accept(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa,
                      int salen, void *arg) {
  char peer[64];

  fmt_peer(sa, peer, sizeof(peer));
  srv_adopt(arg, fd, peer);
}

static void on_relisten(evutil_socket_t fd, short what, void *arg) {
  struct boot_server *srv = arg;

  if (srv->lis)
    evconnlistener_enable(srv->lis);
}

/* accept() failed (EMFILE...): pause instead of spinning on a readable socket. */
static void on_accept_error(struct evconnlistener *lis, void *arg) {
  struct boot_server *srv = arg;
  struct timeval tv = to_tv(0.1);

  evconnlistener_disable(lis);
  evtimer_add(srv->relisten_ev, &tv);
}

static void on_grace(evutil_socket_t fd, short what, void *arg) {
  struct boot_server *srv = arg;

  event_base_loopbreak(srv->base);
}

static void on_stop(evutil_socket_t fd, short what, void *arg) {
  struct boot_server *srv = arg;
  struct timeval tv = to_tv(BOOT_CLOSE_GRACE_S);
  struct srv_conn *c, *next;

  srv->stopping = true;
  srv_close_listener(srv);
  /* Strangers, and clients whose last words are flushed, are not waited for;
   * only members still speaking (or still being told something) are. */
  for (c = LIST_FIRST(&srv->conns); c; c = next) {
    next = LIST_NEXT(c, link);
    if (c->state == CONN_PENDING || (c->state == CONN_CLOSING && c->shut))
      conn_free(c);
  }
  if (srv->nconns == 0)
    event_base_loopbreak(srv->base);
  else
    evtimer_add(srv->grace_ev, &tv);
}

static void *srv_main(void *arg) {
  struct boot_server *srv = arg;

  event_base_loop(srv->base, EVLOOP_NO_EXIT_ON_EMPTY);
  /* Whoever did not leave within the grace period is cut off here. */
  srv->stopping = false;
  while (!LIST_EMPTY(&srv->conns))
    conn_free(LIST_FIRST(&srv->conns));
  return NULL;
}

/* A numeric host (an IPv4 or IPv6 literal) as a socket address with `port`;
 * false for a name. */
static bool numeric_addr(const char *host, uint16_t port, struct sockaddr_storage *ss,
                         socklen_t *sl) {
  struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
  struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;

  memset(ss, 0, sizeof(*ss));
  if (host && inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons(port);
    *sl = sizeof(*a4);
    return true;
  }
  if (host && inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(port);
    *sl = sizeof(*a6);
    return true;
  }
  return false;
}

/* One listening socket on ss, or -errno. */
static int listen_on(const struct sockaddr_storage *ss, socklen_t sl, bool dual_stack) {
  int one = 1, zero = 0, fd, rc;

  fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (dual_stack)
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  if (bind(fd, (const struct sockaddr *)ss, sl) == 0 && listen(fd, 4096) == 0)
    return fd;
  rc = -errno;
  close(fd);
  return rc;
}

/* Bind the rendezvous port: on host's address only when host is numeric
 * (what the ranks connect to is then exactly that address), else on all
 * interfaces, IPv6 dual-stack or IPv4. Retries while the port is in use
 * (the previous communicator's server may still be closing) until the
 * deadline. Returns the fd or -errno. */
static int srv_listen_fd(const char *host, const char *port, double deadline) {
  uint16_t p = (uint16_t)atoi(port);
  struct sockaddr_storage ss;
  socklen_t sl;
  int fam, fd, rc = 0;

  for (;;) {
    if (numeric_addr(host, p, &ss, &sl)) {
      fd = listen_on(&ss, sl, false);
      if (fd >= 0)
        return fd;
      rc = fd;
    } else {
      for (fam = 0; fam < 2; fam++) {
        memset(&ss, 0, sizeof(ss));
        if (fam == 0) {
          struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
          a->sin6_family = AF_INET6;
          a->sin6_addr = in6addr_any;
          a->sin6_port = htons(p);
          sl = sizeof(*a);
        } else {
          struct sockaddr_in *a = (struct sockaddr_in *)&ss;
          a->sin_family = AF_INET;
          a->sin_addr.s_addr = htonl(INADDR_ANY);
          a->sin_port = htons(p);
          sl = sizeof(*a);
        }
        fd = listen_on(&ss, sl, fam == 0);
        if (fd >= 0)
          return fd;
        rc = fd;
        if (rc == -EADDRINUSE)
          break; /* the port, not the family, is the problem */
      }
    }
    if (rc != -EADDRINUSE || now_s() + 0.05 >= deadline)
      return rc;
    sleep_s(0.05);
  }
}

/* Whether a name resolves to an address of this host (one a socket can
 * bind). */
static bool name_is_local(const char *host) {
  struct addrinfo hints, *res, *ai;
  bool local = false;

  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host, "0", &hints, &res))
    return false;
  for (ai = res; ai && !local; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
      continue;
    local = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    close(fd);
  }
  freeaddrinfo(res);
  return local;
}

int boot_listen(const char *host, int *fd_out, char *addr, size_t addrlen, char *err,
                size_t errlen) {
  struct sockaddr_storage ss, bound;
  socklen_t sl, bl = sizeof(bound);
  bool v6;
  int fd, n;

  *fd_out = -1;
  if (!host || !*host || strlen(host) > 253) {
    eng_errf(err, errlen, "no usable rendezvous address to listen on (\"%s\")", host ? host : "");
    return CHORUS_ERR_BOOTSTRAP;
  }
  if (numeric_addr(host, 0, &ss, &sl)) {
    fd = listen_on(&ss, sl, false);
  } else if (!name_is_local(host)) {
    fd = -EADDRNOTAVAIL;
  } else {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
    memset(&ss, 0, sizeof(ss));
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_any;
    fd = listen_on(&ss, sizeof(*a), true);
    if (fd < 0) {
      struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
      memset(&ss, 0, sizeof(ss));
      a4->sin_family = AF_INET;
      a4->sin_addr.s_addr = htonl(INADDR_ANY);
      fd = listen_on(&ss, sizeof(*a4), false);
    }
  }
  if (fd < 0) {
    eng_errf(err, errlen, "cannot listen for the rendezvous on %s: %s%s", host, strerror(-fd),
             fd == -EADDRNOTAVAIL ? " (that address is not one of this host's)" : "");
    return CHORUS_ERR_BOOTSTRAP;
  }
  if (getsockname(fd, (struct sockaddr *)&bound, &bl)) {
    eng_errf(err, errlen, "cannot read the rendezvous port: %s", strerror(errno));
    close(fd);
    return CHORUS_ERR_BOOTSTRAP;
  }
  v6 = strchr(host, ':') != NULL;
  n = snprintf(addr, addrlen, v6 ? "[%s]:%u" : "%s:%u", host,
               (unsigned)ntohs(bound.ss_family == AF_INET6
                                   ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                   : ((struct sockaddr_in *)&bound)->sin_port));
  if (n < 0 || (size_t)n >= addrlen) {
    eng_errf(err, errlen, "rendezvous address %s is too long", host);
    close(fd);
    return CHORUS_ERR_BOOTSTRAP;
  }
  *fd_out = fd;
  return 0;
}

int boot_iface_address(const char *iface, char *out, size_t len, char *err, size_t errlen) {
  struct ifaddrs *ifs, *i;
  bool found = false;

  snprintf(out, len, "127.0.0.1");
  if (iface && !*iface)
    iface = NULL;
  if (getifaddrs(&ifs) < 0) {
    if (!iface)
      return 0;
    eng_errf(err, errlen, "getifaddrs: %s", strerror(errno));
    return -1;
  }
  for (i = ifs; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP))
      continue;
    if (iface ? strcmp(i->ifa_name, iface) != 0 : (i->ifa_flags & IFF_LOOPBACK) != 0)
      continue;
    found = inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr, out,
                      (socklen_t)len) != NULL;
  }
  freeifaddrs(ifs);
  if (iface && !found) {
    eng_errf(err, errlen, "interface \"%s\" has no IPv4 address that is up", iface);
    return -1;
  }
  return 0;
}

static void srv_free(struct boot_server *srv) {
  int r;

  srv_log_flush(srv); /* what the last window counted */
  if (srv->lis)
    evconnlistener_free(srv->lis);
  if (srv->relisten_ev)
    event_free(srv->relisten_ev);
  if (srv->grace_ev)
    event_free(srv->grace_ev);
  if (srv->stop_ev)
    event_free(srv->stop_ev);
  if (srv->tick_ev)
    event_free(srv->tick_ev);
  wsrv_free(srv->ws);
  free(srv->watch_by_rank);
  if (srv->base)
    event_base_free(srv->base);
  for (r = 0; r < srv->size; r++) {
    if (srv->hosts)
      free(srv->hosts[r]);
    if (srv->notes)
      free(srv->notes[r]);
    if (srv->contrib)
      free(srv->contrib[r].data);
  }
  free(srv->hosts);
  free(srv->notes);
  free(srv->contrib);
  free(srv->contributed);
  free(srv->left);
  free(srv->by_rank);
  free(srv->token);
  free(srv);
}

static void srv_stop(struct boot_server *srv) {
  event_active(srv->stop_ev, EV_READ, 0);
  pthread_join(srv->thread, NULL);
  srv_free(srv);
}

/* Everything of a server but its socket and thread. */
static int srv_new(const boot_config_t *cfg, struct boot_server **out, char *err, size_t errlen) {
  struct boot_server *srv;
  size_t n = (size_t)cfg->size;

  pthread_once(&evthread_once, evthread_init);
  if (evthread_rc) {
    eng_errf(err, errlen, "bootstrap: libevent has no pthread support");
    return CHORUS_ERR_INTERNAL;
  }
  srv = calloc(1, sizeof(*srv));
  if (!srv)
    goto out_nomem;
  LIST_INIT(&srv->conns);
  TAILQ_INIT(&srv->pending);
  srv->size = cfg->size;
  srv->timeout_s = cfg->timeout_s;
  srv->hello_timeout_s =
      cfg->timeout_s < BOOT_HELLO_TIMEOUT_S ? cfg->timeout_s : BOOT_HELLO_TIMEOUT_S;
  snprintf(srv->addr, sizeof(srv->addr), "%s", cfg->rendezvous);
  srv->token_len = strlen(cfg->token);
  srv->token = malloc(srv->token_len + 1);
  srv->by_rank = calloc(n, sizeof(*srv->by_rank));
  srv->hosts = calloc(n, sizeof(*srv->hosts));
  srv->notes = calloc(n, sizeof(*srv->notes));
  srv->contrib = calloc(n, sizeof(*srv->contrib));
  srv->contributed = calloc(n, sizeof(*srv->contributed));
  srv->left = calloc(n, sizeof(*srv->left));
  srv->lost = -1;
  if (!srv->token || !srv->by_rank || !srv->hosts || !srv->notes || !srv->contrib ||
      !srv->contributed || !srv->left)
    goto out_free_srv;
  memcpy(srv->token, cfg->token, srv->token_len + 1);
  srv->base = event_base_new();
  if (!srv->base)
    goto out_free_srv;
  srv->stop_ev = event_new(srv->base, -1, 0, on_stop, srv);
  srv->grace_ev = evtimer_new(srv->base, on_grace, srv);
  srv->relisten_ev = evtimer_new(srv->base, on_relisten, srv);
  if (!srv->stop_ev || !srv->grace_ev || !srv->relisten_ev)
    goto out_free_srv;
  if (cfg->watch_tick_s > 0) {
    wsrv_config_t wc = {.size = cfg->size,
                        .timeout_s = cfg->watch_timeout_s,
                        .peer_timeout_s = cfg->watch_peer_timeout_s,
                        .tick_s = cfg->watch_tick_s,
                        .send = ws_send,
                        .arg = srv};
    struct timeval tv = to_tv(cfg->watch_tick_s);
    srv->ws = wsrv_new(&wc, now_s());
    srv->watch_by_rank = calloc(n, sizeof(*srv->watch_by_rank));
    srv->tick_ev = event_new(srv->base, -1, EV_PERSIST, on_watch_tick, srv);
    if (!srv->ws || !srv->watch_by_rank || !srv->tick_ev || event_add(srv->tick_ev, &tv))
      goto out_free_srv;
  }
  *out = srv;
  return 0;

out_free_srv:
  srv_free(srv);
out_nomem:
  eng_errf(err, errlen, "bootstrap: out of memory starting the rendezvous server");
  return CHORUS_ERR_NO_MEMORY;
}

static int srv_start(const boot_config_t *cfg, const char *host, const char *port, double deadline,
                     struct boot_server **out, char *err, size_t errlen) {
  struct boot_server *srv;
  sigset_t all, old;
  int fd, rc;

  rc = srv_new(cfg, &srv, err, errlen);
  if (rc) {
    if (cfg->has_listen_fd)
      close(cfg->listen_fd);
    return rc;
  }
  fd = cfg->has_listen_fd ? cfg->listen_fd : srv_listen_fd(host, port, deadline);
  if (fd < 0) {
    eng_errf(err, errlen, "rank 0 cannot listen on port %s for the rendezvous %s: %s%s", port,
             cfg->rendezvous, strerror(-fd),
             fd == -EADDRINUSE ? " (is another job using this port?)" : "");
    rc = CHORUS_ERR_BOOTSTRAP;
    goto out_free_srv;
  }
  srv->lis = evconnlistener_new(srv->base, on_accept, srv,
                                LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 0, fd);
  if (!srv->lis) {
    close(fd);
    eng_errf(err, errlen, "bootstrap: out of memory starting the rendezvous server");
    rc = CHORUS_ERR_NO_MEMORY;
    goto out_free_srv;
  }
  evconnlistener_set_error_cb(srv->lis, on_accept_error);

  /* Signals belong to the application's threads (and SIGPIPE from a write
   * to a vanished client stays pending on this thread, harmlessly). */
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  rc = pthread_create(&srv->thread, NULL, srv_main, srv);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc) {
    eng_errf(err, errlen, "bootstrap: cannot start the rendezvous thread: %s", strerror(rc));
    rc = CHORUS_ERR_INTERNAL;
    goto out_free_srv;
  }
  *out = srv;
  return 0;

out_free_srv:
  srv_free(srv);
  return rc;
}

/* ------------------------------------------------------------------ */
/* client (every rank)                                                 */
/* ------------------------------------------------------------------ */

struct boot {
  int rank, size;
  int fd;           /* connection to rank 0's server */
  double timeout_s; /* default for rounds */
  uint64_t round;   /* next boot_allgather */
  char addr[512];   /* the rendezvous, for messages */
  char **hosts;     /* one block: size pointers, then the strings */
  int failed;       /* sticky chorus_result once the channel broke */
  char failmsg[1024];
  struct boot_server *srv;  /* rank 0 only */
  char host[256], port[16]; /* the rendezvous, split (the watchdog connects again) */
  char *token;
  int watch_fd; /* the watchdog's connection until boot_watch_connect takes it */
  int64_t watch_offset_ns;
  char watch_err[512];
};

static int send_all(int fd, const uint8_t *p, size_t len, double deadline) {
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    int rc;

    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      rc = netio_wait_fd(fd, POLLOUT, deadline);
      if (rc)
        return rc;
      continue;
    }
    return -errno;
  }
  return 0;
}

/* The first bytes of an answer, kept to say what answered when it is not
 * a Chorus rendezvous. */
struct frame_peek {
  uint8_t b[64];
  size_t n;
};

/* recv_all, keeping what came in peek (up to its size); -EPIPE on end of
 * file. */
static int recv_peek(int fd, uint8_t *p, size_t len, double deadline, struct frame_peek *peek) {
  while (len) {
    ssize_t n = recv(fd, p, len, 0);
    int rc;

    if (n > 0) {
      if (peek && peek->n < sizeof(peek->b)) {
        size_t k = sizeof(peek->b) - peek->n < (size_t)n ? sizeof(peek->b) - peek->n : (size_t)n;

        memcpy(peek->b + peek->n, p, k);
        peek->n += k;
      }
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n == 0)
      return -EPIPE;
    if (errno == EINTR)
      continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      rc = netio_wait_fd(fd, POLLIN, deadline);
      if (rc)
        return rc;
      continue;
    }
    return -errno;
  }
  return 0;
}

/* Whether byte k of a frame's body can start an Envelope: every message a
 * rendezvous sends is one field of the oneof (field 1..15, length-delimited,
 * so its key is one byte). */
static bool envelope_key(uint8_t k) {
  return (k & 7) == 2 && (k >> 3) >= 1 && (k >> 3) <= 15;
}

/* One frame of at most max bytes. 0 or -errno (-EPIPE: end of file;
 * -EBADMSG: garbage); -EPROTO when what came can not be what a Chorus
 * rendezvous sends (a length over max or 0, a body that starts with no
 * Envelope key): that is known from the first bytes, without waiting for
 * the rest. With peek, the first bytes are kept there. */
static int recv_frame_max(int fd, double deadline, uint32_t max, envelope_t **out,
                          struct frame_peek *peek) {
  uint8_t hdr[4], *buf;
  uint32_t n;
  int rc;

  rc = recv_peek(fd, hdr, 4, deadline, peek);
  if (rc)
    return rc;
  n = get_be32(hdr);
  if (n > max)
    return peek ? -EPROTO : -EMSGSIZE;
  if (peek && n == 0)
    return -EPROTO;
  buf = malloc(n ? n : 1);
  if (!buf)
    return -ENOMEM;
  rc = n ? recv_peek(fd, buf, 1, deadline, peek) : 0;
  if (!rc && n && peek && !envelope_key(buf[0]))
    rc = -EPROTO;
  if (!rc && n > 1)
    rc = recv_peek(fd, buf + 1, n - 1, deadline, peek);
  if (!rc) {
    *out = msg_unpack(buf, n);
    if (!*out)
      rc = peek ? -EPROTO : -EBADMSG;
  }
  free(buf);
  return rc;
}

static int recv_frame(int fd, double deadline, envelope_t **out) {
  return recv_frame_max(fd, deadline, BOOT_MAX_FRAME, out, NULL);
}

/* What the bytes of a peer that is no Chorus rendezvous look like, for the
 * message: HTTP (its status line), text, or the first bytes in hex. What
 * more is there to read comes first (a status line is longer than a
 * frame's header), briefly. */
static void describe_stranger(int fd, struct frame_peek *peek, char *out, size_t len) {
  double until = now_s() + 0.2;
  size_t i, text = 0;
  int o;

  while (peek->n < sizeof(peek->b) && netio_wait_fd(fd, POLLIN, until) == 0) {
    ssize_t k = recv(fd, peek->b + peek->n, sizeof(peek->b) - peek->n, MSG_DONTWAIT);

    if (k <= 0)
      break;
    peek->n += (size_t)k;
  }
  for (i = 0; i < peek->n; i++) {
    uint8_t c = peek->b[i];

    if (c == '\r' || c == '\n')
      break;
    if (c < 0x20 || c > 0x7e)
      break;
  }
  text = i;
  if (text >= 4) {
    bool http = peek->n >= 5 && memcmp(peek->b, "HTTP/", 5) == 0;

    snprintf(out, len, "%s: \"%.*s\"", http ? "it looks like HTTP" : "it sent text", (int)text,
             (const char *)peek->b);
    return;
  }
  o = snprintf(out, len, "its first bytes:");
  for (i = 0; i < peek->n && i < 16 && o > 0 && (size_t)o < len; i++)
    o += snprintf(out + o, len - (size_t)o, " %02x", peek->b[i]);
}

static int send_env(int fd, const envelope_t *env, double deadline) {
  uint8_t *frame;
  size_t len;
  int rc;

  frame = frame_pack(env, &len);
  if (!frame)
    return len > BOOT_MAX_FRAME ? -EMSGSIZE : -ENOMEM;
  rc = send_all(fd, frame, len, deadline);
  free(frame);
  return rc;
}

static int client_fail(boot_t *b, int code, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int client_fail(boot_t *b, int code, char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(b->failmsg, sizeof(b->failmsg), fmt, ap);
  va_end(ap);
  b->failed = code;
  eng_errf(err, errlen, "%s", b->failmsg);
  return code;
}

static int code_of(Chorus__Boot__ErrorCode code) {
  switch (code) {
  case CHORUS__BOOT__ERROR_CODE__ERROR_AUTH:
    return CHORUS_ERR_AUTH;
  case CHORUS__BOOT__ERROR_CODE__ERROR_TIMEOUT:
    return CHORUS_ERR_TIMEOUT;
  case CHORUS__BOOT__ERROR_CODE__ERROR_PEER_LOST:
    return CHORUS_ERR_PEER_LOST;
  default:
    return CHORUS_ERR_BOOTSTRAP;
  }
}

/* Receive the `want` message, or turn whatever happened into an error.
 * `what` names what we wait for; `waited_s` is for the timeout message. */
static int client_recv(boot_t *b, Chorus__Boot__Envelope__MsgCase want, const char *what,
                       double deadline, double waited_s, envelope_t **out, char *err,
                       size_t errlen) {
  /* the first answer is a Welcome (a host table) or an Error: bounded */
  uint32_t max = want == CHORUS__BOOT__ENVELOPE__MSG_WELCOME
                     ? (64u << 10) + (uint32_t)b->size * (BOOT_MAX_HOST + 16)
                     : BOOT_MAX_FRAME;
  struct frame_peek peek = {.n = 0};
  envelope_t *env = NULL;
  int rc = recv_frame_max(b->fd, deadline, max, &env, &peek);

  /* bytes no rendezvous sends, or a piece of a frame's length and the end */
  if (rc == -EPROTO || (rc == -EPIPE && peek.n > 0 && peek.n < 4)) {
    char what_came[160];

    describe_stranger(b->fd, &peek, what_came, sizeof(what_came));
    return client_fail(b, CHORUS_ERR_BOOTSTRAP, err, errlen,
                       "the rendezvous address %s answered with something that is not a Chorus "
                       "rendezvous (%s) while we waited for %s: is another service listening "
                       "there? (MASTER_ADDR:MASTER_PORT, or the rendezvous address given)",
                       b->addr, what_came, what);
  }
  if (rc == -ETIMEDOUT)
    return client_fail(b, CHORUS_ERR_TIMEOUT, err, errlen,
                       "no %s from the rendezvous server %s within %.1f s", what, b->addr,
                       waited_s);
  if (rc == -EPIPE || rc == -ECONNRESET)
    return client_fail(b, CHORUS_ERR_PEER_LOST, err, errlen,
                       "the rendezvous server %s closed the connection while we waited "
                       "for %s (did rank 0 exit?)",
                       b->addr, what);
  if (rc)
    return client_fail(b, CHORUS_ERR_BOOTSTRAP, err, errlen,
                       "reading %s from the rendezvous server %s failed: %s", what, b->addr,
                       strerror(-rc));
  if (env->msg_case == CHORUS__BOOT__ENVELOPE__MSG_ERROR) {
    rc = client_fail(b, code_of(env->error->code), err, errlen, "%s", env->error->message);
    chorus__boot__envelope__free_unpacked(env, NULL);
    return rc;
  }
  if (env->msg_case != want) {
    rc = client_fail(b, CHORUS_ERR_BOOTSTRAP, err, errlen,
                     "the rendezvous server %s sent message kind %d instead of %s", b->addr,
                     (int)env->msg_case, what);
    chorus__boot__envelope__free_unpacked(env, NULL);
    return rc;
  }
  *out = env;
  return 0;
}

static int client_connect(boot_t *b, int *fd_out, const char *host, const char *port, double start,
                          double deadline, char *err, size_t errlen) {
  struct addrinfo hints, *res, *ai;
  double backoff = 0.005;
  int last = ETIMEDOUT, g, fd;

  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  for (;;) {
    g = getaddrinfo(host, port, &hints, &res);
    if (g == 0) {
      fd = -1;
      for (ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = netio_try_connect(ai, deadline);
        if (fd < 0)
          last = -fd;
      }
      freeaddrinfo(res);
      if (fd >= 0) {
        *fd_out = fd;
        return 0;
      }
    } else if (g != EAI_AGAIN && g != EAI_NONAME && g != EAI_FAIL && g != EAI_SYSTEM) {
      return client_fail(b, CHORUS_ERR_BOOTSTRAP, err, errlen,
                         "cannot resolve the rendezvous host '%s' of %s: %s", host, b->addr,
                         gai_strerror(g));
    }
    /* A name may resolve only once the job's other pods/nodes are up. */
    if (now_s() >= deadline)
      break;
    /* One last try at the deadline itself: rank 0 may just have come up. */
    sleep_s(deadline - now_s() < backoff ? deadline - now_s() : backoff);
    backoff = backoff * 2 > 0.25 ? 0.25 : backoff * 2;
  }
  if (g)
    return client_fail(b, CHORUS_ERR_TIMEOUT, err, errlen,
                       "could not resolve the rendezvous host '%s' of %s within %.1f s: %s", host,
                       b->addr, now_s() - start, gai_strerror(g));
  return client_fail(b, CHORUS_ERR_TIMEOUT, err, errlen,
                     "could not connect to the rendezvous server %s within %.1f s "
                     "(last error: %s); is rank 0 running and listening there?",
                     b->addr, now_s() - start, strerror(last));
}

static int client_take_hosts(boot_t *b, const Chorus__Boot__Welcome *w, char *err, size_t errlen) {
  size_t total = 0, off;
  char *p;
  int r;

  if (w->size != (uint32_t)b->size || w->n_hosts != (size_t)b->size)
    return client_fail(b, CHORUS_ERR_BOOTSTRAP, err, errlen,
                       "the rendezvous server %s sent a host table of %zu entries for "
                       "a job of %d ranks",
                       b->addr, w->n_hosts, b->size);
  for (r = 0; r < b->size; r++)
    total += strlen(w->hosts[r]) + 1;
  off = (size_t)b->size * sizeof(char *);
  b->hosts = malloc(off + total);
  if (!b->hosts)
    return client_fail(b, CHORUS_ERR_NO_MEMORY, err, errlen, "out of memory");
  p = (char *)b->hosts + off;
  for (r = 0; r < b->size; r++) {
    size_t n = strlen(w->hosts[r]) + 1;
    memcpy(p, w->hosts[r], n);
    b->hosts[r] = p;
    p += n;
  }
  return 0;
}

static int client_hello(boot_t *b, const boot_config_t *cfg, const char *token, double start,
                        double deadline, char *err, size_t errlen) {
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  Chorus__Boot__Hello h = CHORUS__BOOT__HELLO__INIT;
  envelope_t *reply = NULL;
  char me[BOOT_MAX_HOST + 1];
  int rc;

  boot_host_identity(me, sizeof(me));
  h.version = BOOT_PROTOCOL_VERSION;
  h.token.data = (uint8_t *)token;
  h.token.len = strlen(token);
  h.rank = (uint32_t)cfg->rank;
  h.size = (uint32_t)cfg->size;
  h.host = me;
  h.timeout_ms = to_ms(deadline - now_s());
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_HELLO;
  env.hello = &h;
  rc = send_env(b->fd, &env, deadline + BOOT_CLIENT_SLACK_S);
  if (rc)
    return client_fail(b, rc == -ETIMEDOUT ? CHORUS_ERR_TIMEOUT : CHORUS_ERR_BOOTSTRAP, err, errlen,
                       "cannot send Hello to the rendezvous server %s: %s", b->addr, strerror(-rc));
  rc = client_recv(b, CHORUS__BOOT__ENVELOPE__MSG_WELCOME, "Welcome (all ranks arrived)",
                   deadline + BOOT_CLIENT_SLACK_S, deadline + BOOT_CLIENT_SLACK_S - start, &reply,
                   err, errlen);
  if (rc)
    return rc;
  rc = client_take_hosts(b, reply->welcome, err, errlen);
  chorus__boot__envelope__free_unpacked(reply, NULL);
  return rc;
}

static int watch_handshake(boot_t *b, double deadline, char *err, size_t errlen);

int boot_open(const boot_config_t *cfg, boot_t **out, char *err, size_t errlen) {
  char host[256], port[16];
  const char *token;
  double start = now_s(), deadline;
  /* the caller's listener: ours to close until srv_start takes it */
  int lfd = cfg && cfg->has_listen_fd ? cfg->listen_fd : -1;
  boot_t *b;
  int rc;

  if (out)
    *out = NULL;
  if (!cfg || !out || !cfg->rendezvous) {
    eng_errf(err, errlen, "boot_open: NULL %s", !cfg ? "config" : !out ? "out" : "rendezvous");
    rc = CHORUS_ERR_INVALID_ARG;
    goto out_close_listener;
  }
  if (cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size) {
    eng_errf(err, errlen, "boot_open: rank %d out of range for a job of %d ranks", cfg->rank,
             cfg->size);
    rc = CHORUS_ERR_INVALID_ARG;
    goto out_close_listener;
  }
  if (split_hostport(cfg->rendezvous, host, sizeof(host), port, sizeof(port))) {
    eng_errf(err, errlen, "boot_open: rendezvous '%s' is not host:port (port 1-65535)",
             cfg->rendezvous);
    rc = CHORUS_ERR_INVALID_ARG;
    goto out_close_listener;
  }
  if (!(cfg->timeout_s > 0) || !isfinite(cfg->timeout_s)) {
    eng_errf(err, errlen, "boot_open: timeout %g s is not positive", cfg->timeout_s);
    rc = CHORUS_ERR_INVALID_ARG;
    goto out_close_listener;
  }
  token = cfg->token ? cfg->token : "";
  if (strlen(token) > BOOT_MAX_TOKEN) {
    eng_errf(err, errlen, "boot_open: job token longer than %d bytes", BOOT_MAX_TOKEN);
    rc = CHORUS_ERR_INVALID_ARG;
    goto out_close_listener;
  }
  deadline = start + cfg->timeout_s;

  b = calloc(1, sizeof(*b));
  if (!b) {
    eng_errf(err, errlen, "boot_open: out of memory");
    rc = CHORUS_ERR_NO_MEMORY;
    goto out_close_listener;
  }
  b->rank = cfg->rank;
  b->size = cfg->size;
  b->fd = -1;
  b->timeout_s = cfg->timeout_s;
  snprintf(b->addr, sizeof(b->addr), "%s", cfg->rendezvous);

  if (cfg->rank == 0) {
    boot_config_t c = *cfg;
    c.token = token;
    c.has_listen_fd = lfd >= 0;
    c.listen_fd = lfd;
    lfd = -1; /* srv_start's now, whatever happens */
    rc = srv_start(&c, host, port, deadline, &b->srv, err, errlen);
    if (rc)
      goto out_free;
  } else if (lfd >= 0) {
    close(lfd); /* only rank 0 serves */
    lfd = -1;
  }
  snprintf(b->host, sizeof(b->host), "%s", host);
  snprintf(b->port, sizeof(b->port), "%s", port);
  b->token = strdup(token);
  if (!b->token) {
    eng_errf(err, errlen, "boot_open: out of memory");
    rc = CHORUS_ERR_NO_MEMORY;
    goto out_stop_server;
  }
  b->watch_fd = -1;
  rc = client_connect(b, &b->fd, host, port, start, deadline, err, errlen);
  if (rc)
    goto out_stop_server;
  if (cfg->watch_tick_s > 0 && watch_handshake(b, deadline < now_s() + 10 ? deadline : now_s() + 10,
                                               b->watch_err, sizeof(b->watch_err)))
    b->watch_fd = -1; /* the job runs without a watchdog (watch_start says so) */
  rc = client_hello(b, cfg, token, start, deadline, err, errlen);
  if (rc)
    goto out_close;
  *out = b;
  return 0;

out_close:
  close(b->fd);
  if (b->watch_fd >= 0)
    close(b->watch_fd);
out_stop_server:
  if (b->srv)
    srv_stop(b->srv);
out_free:
  free(b->token);
  free(b->hosts);
  free(b);
out_close_listener:
  if (lfd >= 0)
    close(lfd);
  return rc;
}

/* The watchdog's connection is made before the Hello: the server stops
 * listening once every rank said Hello. Its answer comes at once (even
 * while the job forms), so the round trip dates rank 0's clock. */
static int watch_handshake(boot_t *b, double deadline, char *err, size_t errlen) {
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  Chorus__Boot__WatchHello h = CHORUS__BOOT__WATCH_HELLO__INIT;
  envelope_t *reply = NULL;
  double start = now_s();
  int fd = -1, rc;

  int failed = b->failed; /* a failure here is the watchdog's, not the bootstrap's */
  rc = client_connect(b, &fd, b->host, b->port, start, deadline, err, errlen);
  b->failed = failed;
  if (rc)
    return rc;
  h.version = BOOT_PROTOCOL_VERSION;
  h.token.data = (uint8_t *)b->token;
  h.token.len = strlen(b->token);
  h.rank = (uint32_t)b->rank;
  h.size = (uint32_t)b->size;
  h.t_client_ns = fsm_now_ns();
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_WATCH_HELLO;
  env.watch_hello = &h;
  rc = send_env(fd, &env, deadline);
  if (!rc)
    rc = recv_frame(fd, deadline, &reply);
  uint64_t t1 = fsm_now_ns();
  if (rc) {
    eng_errf(err, errlen, "watchdog connection to %s: %s", b->addr, strerror(-rc));
    close(fd);
    return rc == -ETIMEDOUT ? CHORUS_ERR_TIMEOUT : CHORUS_ERR_BOOTSTRAP;
  }
  if (reply->msg_case != CHORUS__BOOT__ENVELOPE__MSG_WATCH_WELCOME) {
    eng_errf(err, errlen, "watchdog connection to %s refused: %s", b->addr,
             reply->msg_case == CHORUS__BOOT__ENVELOPE__MSG_ERROR && reply->error->message
                 ? reply->error->message
                 : "unexpected answer");
    chorus__boot__envelope__free_unpacked(reply, NULL);
    close(fd);
    return CHORUS_ERR_BOOTSTRAP;
  }
  /* the server answered halfway through our round trip, give or take */
  const Chorus__Boot__WatchWelcome *w = reply->watch_welcome;
  b->watch_offset_ns = (int64_t)w->t_server_ns - (int64_t)((w->t_client_ns + t1) / 2);
  chorus__boot__envelope__free_unpacked(reply, NULL);
  b->watch_fd = fd;
  return 0;
}

int boot_watch_connect(boot_t *b, int64_t *offset_ns, char *err, size_t errlen) {
  if (b->watch_fd < 0) {
    eng_errf(err, errlen, "%s", b->watch_err[0] ? b->watch_err : "no watchdog connection");
    return CHORUS_ERR_BOOTSTRAP;
  }
  int fd = b->watch_fd;
  b->watch_fd = -1;
  *offset_ns = b->watch_offset_ns;
  return fd;
}

int boot_send_envelope(int fd, const struct Chorus__Boot__Envelope *env, double timeout_s) {
  return send_env(fd, env, now_s() + timeout_s);
}

int boot_recv_envelope(int fd, double timeout_s, struct Chorus__Boot__Envelope **env) {
  return recv_frame(fd, now_s() + timeout_s, env);
}

const char *boot_host_of(const boot_t *b, int r) {
  if (!b || !b->hosts || r < 0 || r >= b->size)
    return NULL;
  return b->hosts[r];
}

#define BOOT_ALIGN 16

static int client_take_gathered(boot_t *b, const Chorus__Boot__Gathered *g, void ***out_ptrs,
                                size_t **out_lens, char *err, size_t errlen) {
  size_t head = (size_t)b->size * sizeof(void *), total = 0, off;
  size_t *lens;
  void **ptrs;
  int r;

  if (g->round != b->round || g->n_data != (size_t)b->size)
    return client_fail(b, CHORUS_ERR_BOOTSTRAP, err, errlen,
                       "the rendezvous server %s answered round %llu with %zu entries; "
                       "expected round %llu with %d",
                       b->addr, (unsigned long long)g->round, g->n_data,
                       (unsigned long long)b->round, b->size);
  head = (head + BOOT_ALIGN - 1) & ~(size_t)(BOOT_ALIGN - 1);
  for (r = 0; r < b->size; r++)
    total += (g->data[r].len + BOOT_ALIGN - 1) & ~(size_t)(BOOT_ALIGN - 1);
  ptrs = malloc(head + total);
  lens = malloc((size_t)b->size * sizeof(*lens));
  if (!ptrs || !lens) {
    free(ptrs);
    free(lens);
    return client_fail(b, CHORUS_ERR_NO_MEMORY, err, errlen, "out of memory");
  }
  off = head;
  for (r = 0; r < b->size; r++) {
    ptrs[r] = (char *)ptrs + off;
    lens[r] = g->data[r].len;
    if (lens[r])
      memcpy(ptrs[r], g->data[r].data, lens[r]);
    off += (lens[r] + BOOT_ALIGN - 1) & ~(size_t)(BOOT_ALIGN - 1);
  }
  *out_ptrs = ptrs;
  *out_lens = lens;
  return 0;
}

int boot_allgather(boot_t *b, const void *mine, size_t len, void ***out_ptrs, size_t **out_lens,
                   double timeout_s, char *err, size_t errlen) {
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  Chorus__Boot__Contribution m = CHORUS__BOOT__CONTRIBUTION__INIT;
  envelope_t *reply = NULL;
  double start = now_s(), deadline;
  char what[64];
  int rc;

  if (!b || (!mine && len) || !out_ptrs || !out_lens) {
    eng_errf(err, errlen, "boot_allgather: NULL argument");
    return CHORUS_ERR_INVALID_ARG;
  }
  *out_ptrs = NULL;
  *out_lens = NULL;
  if (b->failed) {
    eng_errf(err, errlen, "%s", b->failmsg);
    return b->failed;
  }
  if (len > BOOT_MAX_FRAME - 64) {
    eng_errf(err, errlen, "boot_allgather: %zu bytes is over the %u-byte bootstrap limit", len,
             BOOT_MAX_FRAME - 64);
    return CHORUS_ERR_INVALID_ARG;
  }
  if (!(timeout_s > 0) || !isfinite(timeout_s))
    timeout_s = b->timeout_s;
  deadline = start + timeout_s;

  m.round = b->round;
  m.data.data = (uint8_t *)mine;
  m.data.len = len;
  m.timeout_ms = to_ms(timeout_s);
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_CONTRIBUTION;
  env.contribution = &m;
  rc = send_env(b->fd, &env, deadline);
  if (rc == -ETIMEDOUT)
    return client_fail(b, CHORUS_ERR_TIMEOUT, err, errlen,
                       "cannot send bootstrap round %llu to %s within %.1f s",
                       (unsigned long long)b->round, b->addr, timeout_s);
  if (rc)
    return client_fail(b, CHORUS_ERR_PEER_LOST, err, errlen,
                       "cannot send bootstrap round %llu to %s: %s", (unsigned long long)b->round,
                       b->addr, strerror(-rc));
  snprintf(what, sizeof(what), "answer to bootstrap round %llu", (unsigned long long)b->round);
  rc = client_recv(b, CHORUS__BOOT__ENVELOPE__MSG_GATHERED, what, deadline + BOOT_CLIENT_SLACK_S,
                   timeout_s + BOOT_CLIENT_SLACK_S, &reply, err, errlen);
  if (rc)
    return rc;
  rc = client_take_gathered(b, reply->gathered, out_ptrs, out_lens, err, errlen);
  chorus__boot__envelope__free_unpacked(reply, NULL);
  if (!rc)
    b->round++;
  return rc;
}

int boot_barrier(boot_t *b, double timeout_s, char *err, size_t errlen) {
  void **ptrs = NULL;
  size_t *lens = NULL;
  int rc;

  rc = boot_allgather(b, NULL, 0, &ptrs, &lens, timeout_s, err, errlen);
  free(ptrs);
  free(lens);
  return rc;
}

int boot_fd(const boot_t *b) {
  return b ? b->fd : -1;
}

void boot_close(boot_t *b) {
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  Chorus__Boot__Bye bye = CHORUS__BOOT__BYE__INIT;

  if (!b)
    return;
  if (b->fd >= 0) {
    if (!b->failed) {
      env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_BYE;
      env.bye = &bye;
      send_env(b->fd, &env, now_s() + BOOT_BYE_TIMEOUT_S);
    }
    close(b->fd);
  }
  if (b->watch_fd >= 0)
    close(b->watch_fd);
  if (b->srv)
    srv_stop(b->srv);
  free(b->token);
  free(b->hosts);
  free(b);
}

/* ------------------------------------------------------------------ */
/* byte buffers in place of peers (tests, fuzzing)                     */
/* ------------------------------------------------------------------ */

#define BOOT_BYTES_MAX_STREAMS 16
#define BOOT_BYTES_MAX_LOOPS 100000

/* A connected pair of nonblocking sockets; `bytes` (as much as the socket
 * buffer holds) are waiting to be read on (*mine) and then end of file. */
static int bytes_pair(const uint8_t *bytes, size_t len, int *mine, int *theirs) {
  int sv[2];

  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv))
    return -errno;
  while (len) {
    ssize_t k = send(sv[1], bytes, len, MSG_NOSIGNAL);
    if (k <= 0)
      break;
    bytes += k;
    len -= (size_t)k;
  }
  shutdown(sv[1], SHUT_WR);
  *mine = sv[0];
  *theirs = sv[1];
  return 0;
}

int boot_serve_bytes(int size, const char *token, const uint8_t *const *streams, const size_t *lens,
                     int n) {
  boot_config_t cfg = {.rank = 0,
                       .size = size,
                       .rendezvous = "(bytes)",
                       .token = token ? token : "",
                       .timeout_s = 60.0};
  int peers[BOOT_BYTES_MAX_STREAMS];
  struct boot_server *srv;
  int i, loops, rc = 0, npeers = 0;

  if (size < 1 || size > 32767 || n < 0 || n > BOOT_BYTES_MAX_STREAMS || (n && (!streams || !lens)))
    return -EINVAL;
  if (srv_new(&cfg, &srv, NULL, 0))
    return -ENOMEM;
  for (i = 0; i < n; i++) {
    char peer[32];
    int fd;

    rc = bytes_pair(streams[i], lens[i], &fd, &peers[npeers]);
    if (rc)
      goto out_free;
    npeers++;
    snprintf(peer, sizeof(peer), "(stream %d)", i);
    srv_adopt(srv, fd, peer);
  }
  /* Every connection ends at its end of file: none may be left. */
  for (loops = 0; srv->nconns > 0 && loops < BOOT_BYTES_MAX_LOOPS; loops++)
    event_base_loop(srv->base, EVLOOP_NONBLOCK);
  if (srv->nconns > 0)
    rc = -EDEADLK;

out_free:
  while (!LIST_EMPTY(&srv->conns))
    conn_free(LIST_FIRST(&srv->conns));
  srv_free(srv);
  for (i = 0; i < npeers; i++)
    close(peers[i]);
  return rc;
}

int boot_client_bytes(int rank, int size, const uint8_t *bytes, size_t len, int rounds) {
  boot_config_t cfg = {.rank = rank, .size = size, .rendezvous = "(bytes)", .token = ""};
  double start = now_s();
  char err[256];
  int i, rc, peer;
  boot_t *b;

  if (size < 1 || size > 32767 || rank < 0 || rank >= size || (len && !bytes))
    return CHORUS_ERR_INVALID_ARG;
  b = calloc(1, sizeof(*b));
  if (!b)
    return CHORUS_ERR_NO_MEMORY;
  b->rank = rank;
  b->size = size;
  b->timeout_s = 10.0;
  snprintf(b->addr, sizeof(b->addr), "%s", cfg.rendezvous);
  if (bytes_pair(bytes, len, &b->fd, &peer)) {
    free(b);
    return CHORUS_ERR_INTERNAL;
  }
  rc = client_hello(b, &cfg, "", start, start + b->timeout_s, err, sizeof(err));
  for (i = 0; !rc && i < rounds; i++) {
    void **ptrs;
    size_t *lens;

    rc = boot_allgather(b, &i, sizeof(i), &ptrs, &lens, b->timeout_s, err, sizeof(err));
    if (!rc) {
      free(ptrs);
      free(lens);
    }
  }
  boot_close(b);
  close(peer);
  return rc;
}
