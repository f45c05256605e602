/*
 * fuzz_sock_stream.c - the bytes that reach a sock endpoint (prov_sock.c)
 * on an accepted connection: the hello its listener checks, then, from a
 * rank it accepts, the stream of headers and payloads (prov_sock_wire.h)
 * against what this rank has posted.
 *
 * Rank 0 of a job of 2 is opened for real; the peer is the other end of a
 * socketpair handed to it as an accepted connection
 * (prov_sock_test_adopt). Input, split on FUZZ_SEP: piece 0 is a script,
 * two bytes an operation; pieces 1.. are what the peer writes, a piece per
 * W. Operations (first byte % 8; second byte: the argument a):
 *
 *   0 W  the peer writes the next piece (what the socket takes)
 *   1 P  progress, a + 1 rounds
 *   2 R  post a receive from rank 1: tag a & 7, sizes[a >> 3 & 7] bytes
 *   3 S  post a send to rank 1: tag a & 7, sizes[a >> 3 & 7] bytes (past
 *        64 KiB a rendezvous: the peer's CTS lets its DATA go)
 *   4 C  cancel the operation a % posted
 *   5 D  the peer reads what rank 0 wrote to it
 *   6 H  the peer ends its writes (end of file)
 *   7 V  the peer writes a valid hello of rank 1 (cheap to reach the stream)
 *
 * Then rank 0 progresses a while and is closed. Whatever the bytes: no
 * crash, no sanitizer report, no hang, every operation posted completes
 * exactly once, and no receive reports more bytes than its buffer holds.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "prov_internal.h"
#include "prov_sock_wire.h"

#define MAX_OPS 48

static const size_t sizes[8] = {0, 1, 40, 4096, 4097, 65536, 65537, 200000};

struct fop {
  prov_op_t op;
  unsigned char *buf;
  size_t cap;
  int calls;
  bool send;
};

static void fop_done(prov_op_t *op, int status, size_t len) {
  struct fop *f = (struct fop *)(void *)op;

  (void)status;
  f->calls++;
  if (len > f->cap)
    abort(); /* a receive told of more bytes than its buffer holds */
}

static void quiet(void *arg, const char *line) {
  (void)arg;
  (void)line; /* refusals are the point here, not news */
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  signal(SIGPIPE, SIG_IGN);
  return 0;
}

static void peer_drain(int fd) {
  static unsigned char sink[1 << 16];

  while (recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0)
    ;
}

/* Writes p (n bytes) from the peer, driving rank 0 while the socket is
 * full; what does not fit after a few rounds is left out. */
static void peer_write(prov_t *p, int fd, const uint8_t *b, size_t n) {
  for (int tries = 0; n && tries < 64; tries++) {
    ssize_t w = send(fd, b, n, MSG_DONTWAIT | MSG_NOSIGNAL);

    if (w > 0) {
      b += w;
      n -= (size_t)w;
      continue;
    }
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return;
    p->ops->progress(p);
    peer_drain(fd);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *piece[FUZZ_MAX_STREAMS];
  size_t plen[FUZZ_MAX_STREAMS];
  static struct fop ops[MAX_OPS];
  prov_config_t cfg = {
      .name = "sock", .rank = 0, .nranks = 2, .job_id = "fuzz", .iface = "lo", .log = quiet};
  struct sock_addr a[2];
  const void *addrs[2] = {&a[0], &a[1]};
  size_t lens[2] = {sizeof(a[0]), sizeof(a[1])}, alen = sizeof(a[0]);
  int npieces, next = 1, nops = 0, sv[2] = {-1, -1};
  char err[256];
  prov_t *p = NULL;

  npieces = fuzz_split(data, size, piece, plen, FUZZ_MAX_STREAMS);
  if (prov_open(&cfg, &p, err, sizeof(err)))
    abort();
  if (p->ops->getname(p, &a[0], &alen) || alen != sizeof(a[0]))
    abort();
  a[1] = a[0];
  a[1].rank = 1;
  a[1].port = 0; /* rank 0 connects to nobody: rank 1 comes to it */
  if (p->ops->add_peers(p, addrs, lens, 2))
    abort();
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv))
    abort();
  if (prov_sock_test_adopt(p, sv[0]))
    goto out_close;
  for (size_t i = 0; i + 1 < plen[0]; i += 2) {
    uint8_t kind = piece[0][i] % 8, arg = piece[0][i + 1];

    switch (kind) {
    case 0:
      if (next < npieces) {
        peer_write(p, sv[1], piece[next], plen[next]);
        next++;
      }
      break;
    case 1:
      for (int k = 0; k <= arg % 16; k++)
        p->ops->progress(p);
      break;
    case 2:
    case 3: {
      struct fop *f = &ops[nops];
      int rc;

      if (nops == MAX_OPS)
        break;
      memset(f, 0, sizeof(*f));
      f->op.done = fop_done;
      f->op.data = arg;
      f->cap = sizes[arg >> 3 & 7];
      f->buf = malloc(f->cap ? f->cap : 1);
      f->send = kind == 3;
      if (!f->buf)
        abort();
      memset(f->buf, arg, f->cap);
      rc = f->send ? p->ops->post_send(p, 1, f->buf, f->cap, arg & 7, &f->op)
                   : p->ops->post_recv(p, 1, f->buf, f->cap, arg & 7, &f->op);
      if (rc) {
        free(f->buf);
        break;
      }
      nops++;
      break;
    }
    case 4:
      if (nops)
        p->ops->cancel(p, &ops[arg % nops].op);
      break;
    case 5:
      peer_drain(sv[1]);
      break;
    case 6:
      shutdown(sv[1], SHUT_WR);
      break;
    case 7: {
      struct sock_hello h = {.magic = SOCK_HELLO_MAGIC, .rank = 1, .nranks = 2, .job = a[0].job};

      peer_write(p, sv[1], (const uint8_t *)&h, sizeof(h));
      break;
    }
    }
  }
  for (int k = 0; k < 32; k++) {
    p->ops->progress(p);
    peer_drain(sv[1]);
  }
out_close:
  p->ops->close(p);
  for (int i = 0; i < nops; i++) {
    if (ops[i].calls != 1)
      abort(); /* an operation completed twice, or never */
    free(ops[i].buf);
  }
  close(sv[1]);
  return 0;
}
