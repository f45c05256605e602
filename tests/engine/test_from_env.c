/*
 * chorus_comm_init_from_env with torch's variables (RANK, WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT): rank 0's address goes through the TCPStore at
 * MASTER_PORT, never a port of Chorus's own there; with nothing listening
 * there rank 0 takes MASTER_PORT+1 and leaves MASTER_PORT free. And the
 * TCPStore client itself (engine/boot/tcpstore.c): both protocol generations on
 * a store written here to torch's rules, a real torch 1.x store, and
 * servers that are no store at all.
 *
 * The real store is /usr/bin/python3's torch.distributed.TCPStore; where
 * torch does not import, those tests say so and skip.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chorus.h"
#include "mp.h"
#include "netio.h"
#include "tcpstore.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- a store written to torch's rules, and servers that are none ---- */

enum emu_kind {
  EMU_V1,         /* torch 1.x: no handshake */
  EMU_V2_CLASSIC, /* torch 2.x classic server: closes a client whose first query is not VALIDATE */
  EMU_V2_LIBUV,   /* torch 2.x libuv server: ignores such a client for good */
  EMU_SILENT,     /* accepts, reads, never answers */
  EMU_CLOSE,      /* accepts and closes */
  EMU_HTTP,       /* answers an HTTP error and closes */
};

#define EMU_CONNS 16
#define EMU_KEYS 16

struct emu_conn {
  int fd;
  uint8_t in[8192];
  size_t len;
  bool validated; /* V2 */
  bool ignored;   /* V2 libuv: its first query was not VALIDATE */
  char waiting[256];
};

struct emu {
  enum emu_kind kind;
  int lfd, port, pipe[2];
  pthread_t thread;
  /* lies, on an otherwise good V1 store */
  bool huge_get;       /* GET answers a length of 2^60 */
  bool bad_wait;       /* WAIT answers 7 */
  atomic_int huge_key; /* a client sent a key length over 64 KiB (V1 reading V2's handshake) */
  atomic_int conns;    /* connections accepted */
  char keys[EMU_KEYS][256];
  uint8_t vals[EMU_KEYS][512];
  size_t vlens[EMU_KEYS];
  int nkeys;
  struct emu_conn c[EMU_CONNS];
};

static int emu_find(struct emu *e, const char *k) {
  for (int i = 0; i < e->nkeys; i++)
    if (!strcmp(e->keys[i], k))
      return i;
  return -1;
}

static uint64_t rd64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* A string at in[*off]: 1 when whole (copied to out), 0 when more bytes are
 * needed, -1 when too long for this store. */
static int emu_str(struct emu *e, struct emu_conn *c, size_t *off, char *out, size_t cap,
                   uint8_t *vout, size_t *vlen) {
  uint64_t n;
  if (c->len - *off < 8)
    return 0;
  n = rd64(c->in + *off);
  if (n > 65536)
    atomic_store(&e->huge_key, 1);
  if (n >= (vout ? 512 : cap))
    return -1;
  if (c->len - *off - 8 < n)
    return 0;
  if (vout) {
    memcpy(vout, c->in + *off + 8, n);
    *vlen = n;
  } else {
    memcpy(out, c->in + *off + 8, n);
    out[n] = '\0';
  }
  *off += 8 + n;
  return 1;
}

static void emu_close(struct emu_conn *c) {
  close(c->fd);
  c->fd = -1;
}

/* Serves the whole queries in c's buffer; false when c is closed. */
static bool emu_serve(struct emu *e, struct emu_conn *c) {
  bool v2 = e->kind == EMU_V2_CLASSIC || e->kind == EMU_V2_LIBUV;
  int qset = v2 ? 1 : 0, qget = v2 ? 3 : 2, qwait = v2 ? 6 : 5, qnum = v2 ? 7 : 6;

  for (;;) {
    size_t off = 1;
    char key[256];
    uint8_t val[512];
    size_t vlen;
    int q, r, i;

    if (!c->len || c->ignored)
      return true;
    q = c->in[0];
    if (v2 && !c->validated) {
      uint32_t magic;
      if (q != 0) {
        if (e->kind == EMU_V2_CLASSIC) {
          emu_close(c);
          return false;
        }
        c->ignored = true;
        return true;
      }
      if (c->len < 5)
        return true;
      memcpy(&magic, c->in + 1, 4);
      if (magic != 0x3C85F7CEu) {
        emu_close(c);
        return false;
      }
      c->validated = true;
      off = 5;
    } else if (q == qset) {
      if ((r = emu_str(e, c, &off, key, sizeof(key), NULL, NULL)) <= 0 ||
          (r = emu_str(e, c, &off, NULL, 0, val, &vlen)) <= 0) {
        if (r < 0)
          emu_close(c);
        return r == 0;
      }
      i = emu_find(e, key);
      if (i < 0 && e->nkeys < EMU_KEYS)
        i = e->nkeys++;
      if (i >= 0) {
        snprintf(e->keys[i], sizeof(e->keys[i]), "%s", key);
        memcpy(e->vals[i], val, vlen);
        e->vlens[i] = vlen;
      }
      for (int k = 0; k < EMU_CONNS; k++)
        if (e->c[k].fd >= 0 && e->c[k].waiting[0] && !strcmp(e->c[k].waiting, key)) {
          uint8_t b = 0;
          e->c[k].waiting[0] = '\0';
          (void)!write(e->c[k].fd, &b, 1);
        }
    } else if (q == qget) {
      if ((r = emu_str(e, c, &off, key, sizeof(key), NULL, NULL)) <= 0) {
        if (r < 0)
          emu_close(c);
        return r == 0;
      }
      if ((i = emu_find(e, key)) < 0) { /* torch: an exception, the connection closed */
        emu_close(c);
        return false;
      }
      uint64_t n = e->huge_get ? (uint64_t)1 << 60 : e->vlens[i];
      (void)!write(c->fd, &n, 8);
      if (!e->huge_get)
        (void)!write(c->fd, e->vals[i], e->vlens[i]);
    } else if (q == qwait) {
      if (c->len < 9)
        return true;
      if (rd64(c->in + 1) != 1) { /* this client waits for one key */
        emu_close(c);
        return false;
      }
      off = 9;
      if ((r = emu_str(e, c, &off, key, sizeof(key), NULL, NULL)) <= 0) {
        if (r < 0)
          emu_close(c);
        return r == 0;
      }
      if (e->bad_wait) {
        uint8_t b = 7;
        (void)!write(c->fd, &b, 1);
      } else if (emu_find(e, key) >= 0) {
        uint8_t b = 0;
        (void)!write(c->fd, &b, 1);
      } else {
        snprintf(c->waiting, sizeof(c->waiting), "%s", key);
      }
    } else if (q == qnum) {
      int64_t n = e->nkeys;
      (void)!write(c->fd, &n, 8);
    } else {
      emu_close(c);
      return false;
    }
    memmove(c->in, c->in + off, c->len - off);
    c->len -= off;
  }
}

static void *emu_main(void *arg) {
  struct emu *e = arg;

  for (;;) {
    struct pollfd p[EMU_CONNS + 2];
    int map[EMU_CONNS + 2], n = 0;

    p[n] = (struct pollfd){.fd = e->pipe[0], .events = POLLIN};
    map[n++] = -2;
    p[n] = (struct pollfd){.fd = e->lfd, .events = POLLIN};
    map[n++] = -1;
    for (int i = 0; i < EMU_CONNS; i++)
      if (e->c[i].fd >= 0) {
        p[n] = (struct pollfd){.fd = e->c[i].fd, .events = POLLIN};
        map[n++] = i;
      }
    if (poll(p, (nfds_t)n, -1) < 0)
      continue;
    if (p[0].revents)
      break;
    if (p[1].revents & POLLIN) {
      int fd = accept(e->lfd, NULL, NULL);
      if (fd >= 0) {
        atomic_fetch_add(&e->conns, 1);
        if (e->kind == EMU_CLOSE) {
          close(fd);
        } else {
          int i;
          for (i = 0; i < EMU_CONNS && e->c[i].fd >= 0; i++)
            ;
          if (i == EMU_CONNS) {
            close(fd);
          } else {
            memset(&e->c[i], 0, sizeof(e->c[i]));
            e->c[i].fd = fd;
          }
        }
      }
    }
    for (int k = 2; k < n; k++) {
      struct emu_conn *c = &e->c[map[k]];
      ssize_t r;
      if (!p[k].revents || c->fd < 0)
        continue;
      r = read(c->fd, c->in + c->len, sizeof(c->in) - c->len);
      if (r <= 0) {
        emu_close(c);
        continue;
      }
      c->len += (size_t)r;
      if (e->kind == EMU_SILENT) {
        c->len = 0;
      } else if (e->kind == EMU_HTTP) {
        static const char http[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
        (void)!write(c->fd, http, sizeof(http) - 1);
        emu_close(c);
      } else {
        emu_serve(e, c);
      }
    }
  }
  for (int i = 0; i < EMU_CONNS; i++)
    if (e->c[i].fd >= 0)
      close(e->c[i].fd);
  return NULL;
}

static struct emu *emu_start(enum emu_kind kind) {
  struct emu *e = calloc(1, sizeof(*e));
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof(a);

  cr_assert(e);
  e->kind = kind;
  for (int i = 0; i < EMU_CONNS; i++)
    e->c[i].fd = -1;
  e->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert(e->lfd >= 0);
  cr_assert_eq(bind(e->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
  cr_assert_eq(listen(e->lfd, 64), 0);
  cr_assert_eq(getsockname(e->lfd, (struct sockaddr *)&a, &al), 0);
  e->port = ntohs(a.sin_port);
  cr_assert_eq(pipe(e->pipe), 0);
  cr_assert_eq(pthread_create(&e->thread, NULL, emu_main, e), 0);
  return e;
}

static void emu_stop(struct emu *e) {
  (void)!write(e->pipe[1], "x", 1);
  pthread_join(e->thread, NULL);
  close(e->lfd);
  close(e->pipe[0]);
  close(e->pipe[1]);
  free(e);
}

static void port_str(int port, char *out, size_t len) {
  snprintf(out, len, "%d", port);
}

/* ---- a real torch TCPStore, in /usr/bin/python3 ---- */

struct torch_store {
  pid_t pid;
  int in; /* its stdin: the store lives until this closes */
  int port;
};

/* Starts TCPStore('127.0.0.1', port, 1, True) (port 0: the kernel's
 * choice). Returns 0, or skips the test when torch does not import. */
static void torch_store_start(struct torch_store *t, int port) {
  static const char prog[] =
      "import sys\n"
      "try:\n"
      "    import datetime, torch.distributed as d\n"
      "except Exception as e:\n"
      "    print('NOTORCH', repr(e), flush=True); sys.exit(3)\n"
      "s = d.TCPStore('127.0.0.1', int(sys.argv[1]), 1, True, datetime.timedelta(seconds=120))\n"
      "print('PORT', s.port, flush=True)\n"
      "sys.stdin.read()\n";
  int to[2], from[2];
  char arg[16], line[512];
  size_t got = 0;
  double deadline = now_s() + 90;

  cr_assert_eq(pipe(to), 0);
  cr_assert_eq(pipe(from), 0);
  snprintf(arg, sizeof(arg), "%d", port);
  fflush(stdout);
  fflush(stderr);
  t->pid = fork();
  cr_assert(t->pid >= 0);
  if (t->pid == 0) {
    dup2(to[0], 0);
    dup2(from[1], 1);
    close(to[1]);
    close(from[0]);
    execl("/usr/bin/python3", "python3", "-c", prog, arg, (char *)NULL);
    printf("NOTORCH cannot run /usr/bin/python3: %s\n", strerror(errno));
    fflush(stdout);
    _exit(3);
  }
  close(to[0]);
  close(from[1]);
  t->in = to[1];
  fcntl(t->in, F_SETFD, FD_CLOEXEC);
  while (got < sizeof(line) - 1 && !memchr(line, '\n', got)) {
    struct pollfd p = {.fd = from[0], .events = POLLIN};
    ssize_t r;
    if (poll(&p, 1, (int)((deadline - now_s()) * 1000)) <= 0)
      break;
    r = read(from[0], line + got, sizeof(line) - 1 - got);
    if (r <= 0)
      break;
    got += (size_t)r;
  }
  line[got] = '\0';
  close(from[0]);
  if (sscanf(line, "PORT %d", &t->port) == 1)
    return;
  close(t->in);
  kill(t->pid, SIGKILL);
  waitpid(t->pid, NULL, 0);
  if (!strncmp(line, "NOTORCH", 7))
    cr_skip_test("SKIPPED: torch does not import in /usr/bin/python3, no real TCPStore to test "
                 "against: %s",
                 line);
  cr_assert_fail("python3's TCPStore did not start: '%s'", line);
}

static void torch_store_stop(struct torch_store *t) {
  close(t->in);
  for (int i = 0; i < 500 && waitpid(t->pid, NULL, WNOHANG) == 0; i++)
    usleep(10000);
  if (waitpid(t->pid, NULL, WNOHANG) == 0) {
    kill(t->pid, SIGKILL);
    waitpid(t->pid, NULL, 0);
  }
}

/* ---- the client ---- */

TestSuite(tcpstore, .timeout = 120);

static void roundtrip(int port, enum tcpstore_proto want) {
  char p[16], err[512], val[64];
  tcpstore_t *s;
  size_t len;
  int64_t n;

  port_str(port, p, sizeof(p));
  cr_assert_eq(tcpstore_open("127.0.0.1", p, 10, &s, err, sizeof(err)), 0, "%s", err);
  cr_expect_eq(tcpstore_protocol(s), want, "protocol %d, expected %d", tcpstore_protocol(s), want);
  cr_assert_eq(tcpstore_set(s, "/chorus/t", "value", 5, 5, err, sizeof(err)), 0, "%s", err);
  cr_assert_eq(tcpstore_wait(s, "/chorus/t", 5, err, sizeof(err)), 0, "%s", err);
  cr_assert_eq(tcpstore_get(s, "/chorus/t", val, sizeof(val), &len, 5, err, sizeof(err)), 0, "%s",
               err);
  cr_expect(len == 5 && !memcmp(val, "value", 5), "got %zu bytes '%.*s'", len, (int)len, val);
  cr_assert_eq(tcpstore_num_keys(s, &n, 5, err, sizeof(err)), 0, "%s", err);
  cr_expect(n >= 1, "%lld keys", (long long)n);
  tcpstore_close(s);
}

Test(tcpstore, v1_store) {
  struct emu *e = emu_start(EMU_V1);
  roundtrip(e->port, TCPSTORE_V1);
  cr_expect_eq(atomic_load(&e->huge_key), 0, "the client made a V1 store read a huge key length");
  cr_expect_eq(atomic_load(&e->conns), 1, "%d connections for a store that answers at once",
               atomic_load(&e->conns));
  emu_stop(e);
}

Test(tcpstore, v2_classic_store) {
  struct emu *e = emu_start(EMU_V2_CLASSIC);
  roundtrip(e->port, TCPSTORE_V2);
  emu_stop(e);
}

Test(tcpstore, v2_libuv_store) {
  struct emu *e = emu_start(EMU_V2_LIBUV);
  double t0 = now_s();
  roundtrip(e->port, TCPSTORE_V2);
  cr_expect_lt(now_s() - t0, 2.0, "found V2 in %.2f s", now_s() - t0);
  emu_stop(e);
}

Test(tcpstore, nothing_listens) {
  char p[16], err[512];
  tcpstore_t *s;
  double t0 = now_s();

  port_str(mp_free_port(), p, sizeof(p));
  cr_expect_eq(tcpstore_open("127.0.0.1", p, 10, &s, err, sizeof(err)), -ECONNREFUSED);
  cr_expect(strstr(err, "nothing listens"), "message: %s", err);
  cr_expect_lt(now_s() - t0, 1.0);
}

static void open_fails(enum emu_kind kind, int want, const char *words, double within) {
  struct emu *e = emu_start(kind);
  char p[16], err[512];
  tcpstore_t *s = NULL;
  double t0 = now_s();

  port_str(e->port, p, sizeof(p));
  cr_expect_eq(tcpstore_open("127.0.0.1", p, 30, &s, err, sizeof(err)), want, "%s", err);
  cr_expect_null(s);
  cr_expect(strstr(err, words), "message: %s", err);
  cr_expect_lt(now_s() - t0, within, "took %.1f s", now_s() - t0);
  emu_stop(e);
}

Test(tcpstore, an_http_server_is_named) {
  open_fails(EMU_HTTP, -EPROTO, "is not a TCPStore", 2.0);
  open_fails(EMU_HTTP, -EPROTO, "HTTP", 2.0);
}

Test(tcpstore, a_server_that_closes) {
  open_fails(EMU_CLOSE, -EPROTO, "closed the connection", 2.0);
}

Test(tcpstore, a_silent_server_times_out) {
  open_fails(EMU_SILENT, -ETIMEDOUT, "did not answer", TCPSTORE_PROBE_S + 3.0);
}

Test(tcpstore, wait_times_out) {
  struct emu *e = emu_start(EMU_V1);
  char p[16], err[512];
  tcpstore_t *s;
  double t0;

  port_str(e->port, p, sizeof(p));
  cr_assert_eq(tcpstore_open("127.0.0.1", p, 10, &s, err, sizeof(err)), 0, "%s", err);
  t0 = now_s();
  cr_expect_eq(tcpstore_wait(s, "/never", 0.3, err, sizeof(err)), -ETIMEDOUT);
  cr_expect(now_s() - t0 >= 0.29 && now_s() - t0 < 2.0, "waited %.2f s", now_s() - t0);
  cr_expect(strstr(err, "/never"), "message: %s", err);
  tcpstore_close(s);
  emu_stop(e);
}

Test(tcpstore, lying_answers) {
  struct emu *e = emu_start(EMU_V1);
  char p[16], err[512], val[64];
  tcpstore_t *s;
  size_t len;

  e->huge_get = true;
  port_str(e->port, p, sizeof(p));
  cr_assert_eq(tcpstore_open("127.0.0.1", p, 10, &s, err, sizeof(err)), 0, "%s", err);
  cr_assert_eq(tcpstore_set(s, "/k", "v", 1, 5, err, sizeof(err)), 0, "%s", err);
  cr_expect_eq(tcpstore_get(s, "/k", val, sizeof(val), &len, 5, err, sizeof(err)), -EMSGSIZE);
  cr_expect(strstr(err, "1152921504606846976 bytes"), "message: %s", err);
  tcpstore_close(s);
  e->huge_get = false;
  e->bad_wait = true;
  cr_assert_eq(tcpstore_open("127.0.0.1", p, 10, &s, err, sizeof(err)), 0, "%s", err);
  cr_expect_eq(tcpstore_wait(s, "/k", 5, err, sizeof(err)), -EPROTO);
  cr_expect(strstr(err, "with 7"), "message: %s", err);
  tcpstore_close(s);
  emu_stop(e);
}

/* Whatever a server answers, the client ends cleanly (the fuzz target's
 * entry, on a few answers written by hand). */
Test(tcpstore, client_bytes) {
  uint8_t good[8 + 8 + 1 + 8 + 1] = {0};
  good[8] = 1;    /* key count after the set: 1 */
  good[16] = 0;   /* the wait: stop waiting */
  good[17] = 1;   /* the get: 1 byte... */
  good[25] = 'v'; /* ...'v' */
  cr_expect_eq(tcpstore_client_bytes(TCPSTORE_V1, good, sizeof(good)), 0);
  cr_expect_eq(tcpstore_client_bytes(TCPSTORE_V2, good, sizeof(good)), 0);
  cr_expect_eq(tcpstore_client_bytes(TCPSTORE_V1, good, 20), -EPIPE);
  cr_expect_eq(tcpstore_client_bytes(TCPSTORE_V1, NULL, 0), -EPIPE);
  good[18] = 0xff; /* a value far too long */
  cr_expect_eq(tcpstore_client_bytes(TCPSTORE_V1, good, sizeof(good)), -EMSGSIZE);
  memset(good, 0xff, 8); /* a negative key count */
  cr_expect_eq(tcpstore_client_bytes(TCPSTORE_V1, good, sizeof(good)), -EPROTO);
}

Test(tcpstore, real_torch_store) {
  struct torch_store t;
  char p[16], err[512];
  tcpstore_t *s;

  torch_store_start(&t, 0);
  roundtrip(t.port, TCPSTORE_V1);
  port_str(t.port, p, sizeof(p));
  /* a wait given up on, and V2's handshake stopped short: the store goes on */
  cr_assert_eq(tcpstore_open("127.0.0.1", p, 10, &s, err, sizeof(err)), 0, "%s", err);
  cr_expect_eq(tcpstore_wait(s, "/never", 0.2, err, sizeof(err)), -ETIMEDOUT);
  tcpstore_close(s);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)t.port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  static const uint8_t v2[6] = {0, 0xce, 0xf7, 0x85, 0x3c, 7};
  cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  cr_assert_eq(write(fd, v2, sizeof(v2)), (ssize_t)sizeof(v2));
  usleep(200000);
  close(fd);
  roundtrip(t.port, TCPSTORE_V1);
  torch_store_stop(&t);
}

/* ---- chorus_comm_init_from_env ---- */

struct fe_job {
  int inits; /* communicators to make one after the other */
};

static int allreduce_ok(chorus_comm_t *c, int rank, int size) {
  float v[1000];
  for (int i = 0; i < 1000; i++)
    v[i] = (float)(rank + i);
  chorus_result rc = chorus_allreduce(c, v, v, 1000, CHORUS_FLOAT32, CHORUS_SUM);
  if (rc) {
    fprintf(stderr, "rank %d: allreduce: %s: %s\n", rank, chorus_strerror(rc),
            chorus_comm_last_error(c));
    return 1;
  }
  for (int i = 0; i < 1000; i++)
    if (v[i] != (float)(size * (size - 1) / 2 + size * i)) {
      fprintf(stderr, "rank %d: v[%d] = %g\n", rank, i, v[i]);
      return 1;
    }
  return 0;
}

/* Whether this process can bind 127.0.0.1:port (then nobody holds it). */
static bool port_free(int port) {
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  bool ok;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(fd, 1) == 0;
  close(fd);
  return ok;
}

static void torch_env(int rank, int size) {
  char r[16], s[16];
  snprintf(r, sizeof(r), "%d", rank);
  snprintf(s, sizeof(s), "%d", size);
  unsetenv("CHORUS_RANK");
  unsetenv("CHORUS_WORLD_SIZE");
  unsetenv("CHORUS_RENDEZVOUS");
  setenv("RANK", r, 1);
  setenv("WORLD_SIZE", s, 1);
  setenv("LOCAL_RANK", r, 1);
  setenv("LOCAL_WORLD_SIZE", s, 1);
}

static int rank_from_env(int rank, int size, const char *rv, void *arg) {
  struct fe_job *j = arg;
  (void)rv;

  torch_env(rank, size);
  for (int i = 0; i < j->inits; i++) {
    chorus_comm_t *c;
    chorus_result rc = chorus_comm_init_from_env(&c);
    if (rc) {
      fprintf(stderr, "rank %d: init %d: %s: %s\n", rank, i + 1, chorus_strerror(rc),
              chorus_last_error());
      return 1;
    }
    if (allreduce_ok(c, rank, size))
      return 1;
    if (chorus_barrier(c) || chorus_comm_destroy(c))
      return 1;
  }
  return 0;
}

TestSuite(from_env, .timeout = 240);

static void through_torch_store(int nranks, const char *restart, const char *key) {
  struct torch_store t;
  char penv[32], renv[64], p[16], err[512], val[300];
  tcpstore_t *s;
  size_t len;

  torch_store_start(&t, 0);
  snprintf(penv, sizeof(penv), "MASTER_PORT=%d", t.port);
  snprintf(renv, sizeof(renv), "TORCHELASTIC_RESTART_COUNT=%s", restart ? restart : "");
  const char *env[] = {"MASTER_ADDR=127.0.0.1", penv, renv, "CHORUS_CONNECT_TIMEOUT=60", NULL};
  struct fe_job j = {.inits = 2};
  mp_result_t r = mp_run(nranks, rank_from_env, &j, 180, env);
  cr_expect_eq(r.failed, 0, "%d ranks failed", r.failed);
  /* rank 0's address went through the store, under the key every rank agreed on */
  port_str(t.port, p, sizeof(p));
  cr_assert_eq(tcpstore_open("127.0.0.1", p, 10, &s, err, sizeof(err)), 0, "%s", err);
  cr_expect_eq(tcpstore_get(s, key, val, sizeof(val) - 1, &len, 5, err, sizeof(err)), 0,
               "key %s: %s", key, err);
  val[len] = '\0';
  cr_expect(!strncmp(val, "chorus-uid-1 ", 13), "value '%s'", val);
  tcpstore_close(s);
  torch_store_stop(&t);
}

Test(from_env, two_ranks_through_torch_store) {
  through_torch_store(2, NULL, "/chorus/from_env/0/2");
}

Test(from_env, four_ranks_through_torch_store) {
  through_torch_store(4, "3", "/chorus/from_env/3/1");
}

/* MASTER_PORT as a later dist.init_process_group would need it: bound by
 * this process, not listening (a connection is refused), and without
 * SO_REUSEADDR, so that any bind of it by Chorus fails. Returns the fd.
 *
 * The port is below the kernel's ephemeral range, with MASTER_PORT+1 free
 * too: ports the kernel hands to the suite's other tests running alongside
 * (listeners on port 0, outgoing connections) never land on MASTER_PORT+1.
 * With `next`, MASTER_PORT+1 is held too, listening (someone else's). */
static int reserve_pair(int *port, int *next) {
  int lo = 32768, hi = 60999;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");

  if (f) {
    if (fscanf(f, "%d %d", &lo, &hi) != 2)
      lo = 32768;
    fclose(f);
  }
  cr_assert(lo > 2048, "ephemeral ports start at %d: no room below them", lo);
  srand((unsigned)getpid() ^ (unsigned)time(NULL));
  for (int tries = 0; tries < 500; tries++) {
    int p = lo / 2 + rand() % (lo / 2 - 2), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)p),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), nfd;

    cr_assert(fd >= 0);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a))) {
      close(fd);
      continue;
    }
    a.sin_port = htons((uint16_t)(p + 1));
    nfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(nfd >= 0);
    setsockopt(nfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(nfd, (struct sockaddr *)&a, sizeof(a)) || listen(nfd, 1)) {
      close(nfd);
      close(fd);
      continue;
    }
    if (next)
      *next = nfd;
    else
      close(nfd);
    *port = p;
    return fd;
  }
  cr_assert_fail("no free pair of ports below %d in 500 tries", lo);
  return -1;
}

/* Nothing listens at MASTER_PORT (torchrun --standalone before
 * dist.init_process_group): the ranks meet on MASTER_PORT+1 and never bind
 * MASTER_PORT, which is free again after the job. */
static void nothing_at_master_port(int nranks) {
  int port, held = reserve_pair(&port, NULL);
  char penv[32];

  snprintf(penv, sizeof(penv), "MASTER_PORT=%d", port);
  const char *env[] = {"MASTER_ADDR=127.0.0.1", penv, NULL};
  struct fe_job j = {.inits = 2};
  mp_result_t r = mp_run(nranks, rank_from_env, &j, 180, env);
  cr_expect_eq(r.failed, 0, "%d ranks failed", r.failed);
  close(held);
  cr_expect(port_free(port), "MASTER_PORT %d is bound after the job", port);
}

Test(from_env, two_ranks_nothing_at_master_port) {
  nothing_at_master_port(2);
}

Test(from_env, four_ranks_nothing_at_master_port) {
  nothing_at_master_port(4);
}

Test(from_env, rendezvous_port_overrides_master_port_plus_one) {
  int port, held, own = mp_free_port(), master = reserve_pair(&port, &held);
  char penv[32], oenv[48];

  /* MASTER_PORT+1 is someone else's: CHORUS_RENDEZVOUS_PORT goes elsewhere */
  snprintf(penv, sizeof(penv), "MASTER_PORT=%d", port);
  snprintf(oenv, sizeof(oenv), "CHORUS_RENDEZVOUS_PORT=%d", own);
  const char *env[] = {"MASTER_ADDR=127.0.0.1", penv, oenv, NULL};
  struct fe_job j = {.inits = 1};
  mp_result_t r = mp_run(2, rank_from_env, &j, 120, env);
  cr_expect_eq(r.failed, 0, "%d ranks failed", r.failed);
  close(held);
  close(master);
}

/* Rank 0 alone, for its error: the message, and how long it took. */
struct fe_fail {
  int rank;
  chorus_result want;
  const char *words[3];
  double within;
};

static int rank_fails(int rank, int size, const char *rv, void *arg) {
  struct fe_fail *f = arg;
  chorus_comm_t *c;
  double t0 = now_s();
  (void)rank;
  (void)size;
  (void)rv;

  torch_env(f->rank, 2);
  chorus_result rc = chorus_comm_init_from_env(&c);
  double took = now_s() - t0;
  if (rc != f->want) {
    fprintf(stderr, "rank %d: got %s, expected %s: %s\n", f->rank, chorus_strerror(rc),
            chorus_strerror(f->want), chorus_last_error());
    return 1;
  }
  for (int i = 0; i < 3 && f->words[i]; i++)
    if (!strstr(chorus_last_error(), f->words[i])) {
      fprintf(stderr, "rank %d: no '%s' in: %s\n", f->rank, f->words[i], chorus_last_error());
      return 1;
    }
  if (took > f->within) {
    fprintf(stderr, "rank %d: failing took %.1f s: %s\n", f->rank, took, chorus_last_error());
    return 1;
  }
  return 0;
}

static void expect_failure(const char *const *env, struct fe_fail *f) {
  mp_result_t r = mp_run(1, rank_fails, f, 60, env);
  cr_expect_eq(r.failed, 0, "the failure was not as expected (see above)");
}

Test(from_env, master_port_plus_one_held) {
  int port, held, master = reserve_pair(&port, &held);
  char penv[32];

  close(master); /* MASTER_PORT free, MASTER_PORT+1 held */
  snprintf(penv, sizeof(penv), "MASTER_PORT=%d", port);
  const char *env[] = {"MASTER_ADDR=127.0.0.1", penv, NULL};
  struct fe_fail f = {.rank = 0,
                      .want = CHORUS_ERR_BOOTSTRAP,
                      .words = {"another process holds it", "CHORUS_RENDEZVOUS_PORT"},
                      .within = 5};
  expect_failure(env, &f);
  close(held);
}

Test(from_env, not_a_store_at_master_port) {
  struct emu *e = emu_start(EMU_HTTP);
  char penv[32];

  snprintf(penv, sizeof(penv), "MASTER_PORT=%d", e->port);
  const char *env[] = {"MASTER_ADDR=127.0.0.1", penv, NULL};
  struct fe_fail f = {.rank = 1,
                      .want = CHORUS_ERR_BOOTSTRAP,
                      .words = {"MASTER_ADDR:MASTER_PORT", "is not a TCPStore", "HTTP"},
                      .within = 3};
  expect_failure(env, &f);
  f.rank = 0;
  expect_failure(env, &f);
  emu_stop(e);
}

Test(from_env, rank_0_never_comes) {
  struct emu *e = emu_start(EMU_V2_LIBUV);
  char penv[32];

  snprintf(penv, sizeof(penv), "MASTER_PORT=%d", e->port);
  const char *env[] = {"MASTER_ADDR=127.0.0.1", penv, "CHORUS_CONNECT_TIMEOUT=1", NULL};
  struct fe_fail f = {
      .rank = 1,
      .want = CHORUS_ERR_TIMEOUT,
      .words = {"'/chorus/from_env/0/1'", "rank 0 did not put", "CHORUS_CONNECT_TIMEOUT"},
      .within = 4};
  expect_failure(env, &f);
  emu_stop(e);
}

Test(from_env, bad_launcher_values) {
  struct fe_fail f = {
      .rank = 0, .want = CHORUS_ERR_ENV, .words = {"CHORUS_RENDEZVOUS_PORT"}, .within = 2};
  int port = mp_free_port();
  char penv[32];

  snprintf(penv, sizeof(penv), "MASTER_PORT=%d", port);
  const char *env1[] = {"MASTER_ADDR=127.0.0.1", penv, "CHORUS_RENDEZVOUS_PORT=70000", NULL};
  expect_failure(env1, &f);
  const char *env2[] = {"MASTER_ADDR=127.0.0.1", penv, "TORCHELASTIC_RESTART_COUNT=x", NULL};
  f.words[0] = "TORCHELASTIC_RESTART_COUNT";
  expect_failure(env2, &f);
}

/* torchrun --standalone picks MASTER_PORT with bind(0): an odd port of the
 * ephemeral range, and the kernel gives even ones to connect(). A rank that
 * connects to MASTER_PORT+1 before rank 0 listens there may be handed that
 * very port and connect to itself; closed as usual, the socket would sit in
 * TIME_WAIT for a minute and rank 0 could not listen (seen in the suite:
 * "MASTER_PORT+1 ... another process holds it"). netio resets it instead. */
Test(netio, a_connection_to_itself_leaves_the_port_free) {
  int lo = 32768, hi = 60999, port = -1, one = 1, zero = 0;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");

  if (f) {
    if (fscanf(f, "%d %d", &lo, &hi) != 2)
      lo = 32768, hi = 60999;
    fclose(f);
  }
  srand((unsigned)getpid() ^ (unsigned)time(NULL));
  for (int tries = 0; tries < 100 && port < 0; tries++) {
    int p = (lo + rand() % (hi - lo)) & ~1; /* even: connect()'s kind */
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)p),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
      port = p;
    close(fd);
  }
  cr_assert_geq(port, 0, "no free port in the ephemeral range");

  char ps[16];
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
  snprintf(ps, sizeof(ps), "%d", port);
  cr_assert_eq(getaddrinfo("127.0.0.1", ps, &hints, &ai), 0);
  unsigned before = netio_self_connects();
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  long n = 0;
  for (; netio_self_connects() == before && n < 200000; n++) {
    int rc = netio_try_connect(ai, 1e18);
    cr_assert_eq(rc, -ECONNREFUSED, "connect %ld to 127.0.0.1:%d: %d", n, port, rc);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  freeaddrinfo(ai);
  cr_assert_gt(netio_self_connects(), before,
               "no connect to 127.0.0.1:%d came back to itself in %ld tries", port, n);
  cr_log_info("connected to itself after %ld tries (%.2f s)", n,
              (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);

  /* what rank 0 does next (launch.c's own_listen) */
  struct sockaddr_in6 b = {
      .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port), .sin6_addr = in6addr_any};
  int s = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(s, 0);
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  cr_assert_eq(bind(s, (struct sockaddr *)&b, sizeof(b)), 0, "bind [::]:%d: %s", port,
               strerror(errno));
  close(s);
}
