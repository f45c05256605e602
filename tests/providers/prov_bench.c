/*
 * prov_bench.c - what a transport costs without the engine: two processes
 * (fork) on one endpoint each, moving messages with post_send/post_recv and
 * progress() alone (busy polling, no progress thread, no schedule).
 *
 *   prov_bench [-p PROVIDER] [-m MODE] [-b MIN] [-e MAX] [-f FACTOR]
 *              [-n ITERS] [-w WARMUP] [-r ROUNDS]
 *
 * MODE
 *   exchange  both ranks post a receive and a send of SIZE bytes to each
 *             other and wait for both (a 2-rank allgather's step has this
 *             shape, with SIZE half the buffer)
 *   stream    rank 0 sends, rank 1 receives, each waits only for its own
 *             operation (a 2-rank bcast called in a loop)
 *   pingpong  rank 0 sends and waits for the answer; one way is half of it
 * Per size: ROUNDS rounds of ITERS timed iterations (after WARMUP), each
 * round's time per iteration on rank 0; the median and the best are
 * printed (one way for pingpong). The ranks meet before every round.
 *
 * A benchmark, not a test: ctest does not run it. It shows the floor that
 * a provider sets under the engine (README, "Benchmarks").
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prov.h"
#include "prov_test.h"

enum mode { M_EXCHANGE, M_STREAM, M_PINGPONG };

struct opts {
  const char *prov;
  enum mode mode;
  size_t minb, maxb, factor;
  int iters, warmup, rounds;
};

#define PB_TIMEOUT_MS 30000.0
#define PB_MAX_ROUNDS 101

static const char *const mode_names[] = {"exchange", "stream", "pingpong"};

static void usage(FILE *f) {
  fputs("usage: prov_bench [-p PROVIDER] [-m exchange|stream|pingpong] [-b MIN] [-e MAX]\n"
        "                  [-f FACTOR] [-n ITERS] [-w WARMUP] [-r ROUNDS]\n"
        "  -p  transport name as CHORUS_PROVIDER takes it (default tcp)\n"
        "  -m  exchange: both send and receive SIZE; stream: 0 sends, 1 receives;\n"
        "      pingpong: 0 sends, 1 answers (one way printed) (default exchange)\n"
        "  -b, -e, -f  sizes MIN..MAX bytes by FACTOR, K/M suffixes (default 1K..1M x4)\n"
        "  -n  timed iterations per round (default 2000)\n"
        "  -w  untimed iterations before each round (default 100)\n"
        "  -r  rounds per size; median and best printed (default 5, at most 101)\n"
        "Two processes on this host; the time is rank 0's, in microseconds per iteration.\n",
        f);
}

static int parse_size(const char *s, size_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || s[0] == '-')
    return -1;
  if (*end == 'K' || *end == 'k')
    v <<= 10, end++;
  else if (*end == 'M' || *end == 'm')
    v <<= 20, end++;
  if (*end || v > (1ULL << 30))
    return -1;
  *out = (size_t)v;
  return 0;
}

static int parse_int(const char *s, int lo, int hi, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi)
    return -1;
  *out = (int)v;
  return 0;
}

static int parse(int argc, char **argv, struct opts *o) {
  int c;
  *o = (struct opts){"tcp", M_EXCHANGE, 1024, 1 << 20, 4, 2000, 100, 5};
  while ((c = getopt(argc, argv, "p:m:b:e:f:n:w:r:h")) != -1) {
    int bad = 0;
    switch (c) {
    case 'p':
      o->prov = optarg;
      break;
    case 'm':
      bad = 1;
      for (int i = 0; i < 3; i++)
        if (strcmp(optarg, mode_names[i]) == 0)
          o->mode = (enum mode)i, bad = 0;
      break;
    case 'b':
      bad = parse_size(optarg, &o->minb);
      break;
    case 'e':
      bad = parse_size(optarg, &o->maxb);
      break;
    case 'f':
      bad = parse_size(optarg, &o->factor) || o->factor < 2;
      break;
    case 'n':
      bad = parse_int(optarg, 1, 100000000, &o->iters);
      break;
    case 'w':
      bad = parse_int(optarg, 0, 100000000, &o->warmup);
      break;
    case 'r':
      bad = parse_int(optarg, 1, PB_MAX_ROUNDS, &o->rounds);
      break;
    case 'h':
      usage(stdout);
      exit(0);
    default:
      usage(stderr);
      return -1;
    }
    if (bad) {
      fprintf(stderr, "prov_bench: bad value '%s' for -%c\n", optarg, c);
      usage(stderr);
      return -1;
    }
  }
  if (optind != argc || o->minb > o->maxb) {
    fprintf(stderr, "prov_bench: %s\n",
            optind != argc ? "unexpected argument" : "-b is larger than -e");
    usage(stderr);
    return -1;
  }
  return 0;
}

/* Both ranks reach this point (one byte each way). */
static int meet(int sock) {
  char b = 0;
  return write(sock, &b, 1) == 1 && read(sock, &b, 1) == 1 ? 0 : -1;
}

/* The first failure of two completed operations (statuses are 0 or < 0). */
static int both_status(const pt_op_t *s, const pt_op_t *r) {
  return s->status ? s->status : r->status;
}

/* One iteration; 0 or a negative code. */
static int step(prov_t *p, int rank, enum mode mode, pt_op_t *s, pt_op_t *r, size_t len) {
  int peer = 1 - rank, rc = 0;
  pt_op_t *ops[2] = {s, r};
  void *sb = s->buf, *rb = r->buf;

  pt_op_init(s);
  pt_op_init(r);
  s->buf = sb;
  r->buf = rb;
  switch (mode) {
  case M_EXCHANGE:
    if ((rc = pt_recv(&p, 1, p, peer, r, len, 1, PB_TIMEOUT_MS)) ||
        (rc = pt_send(&p, 1, p, peer, s, len, 1, PB_TIMEOUT_MS)))
      return rc;
    return pt_drive(&p, 1, ops, 2, PB_TIMEOUT_MS) ? both_status(s, r) : -ETIMEDOUT;
  case M_STREAM:
    if (rank == 0)
      rc = pt_send(&p, 1, p, peer, s, len, 1, PB_TIMEOUT_MS);
    else
      rc = pt_recv(&p, 1, p, peer, r, len, 1, PB_TIMEOUT_MS);
    if (rc)
      return rc;
    if (!pt_drive(&p, 1, rank == 0 ? ops : ops + 1, 1, PB_TIMEOUT_MS))
      return -ETIMEDOUT;
    return rank == 0 ? s->status : r->status;
  case M_PINGPONG:
    if ((rc = pt_recv(&p, 1, p, peer, r, len, 1, PB_TIMEOUT_MS)))
      return rc;
    if (rank == 0 && (rc = pt_send(&p, 1, p, peer, s, len, 1, PB_TIMEOUT_MS)))
      return rc;
    if (!pt_drive(&p, 1, ops + 1, 1, PB_TIMEOUT_MS))
      return -ETIMEDOUT;
    if (rank == 1 && (rc = pt_send(&p, 1, p, peer, s, len, 1, PB_TIMEOUT_MS)))
      return rc;
    return pt_drive(&p, 1, ops, 1, PB_TIMEOUT_MS) ? both_status(s, r) : -ETIMEDOUT;
  }
  return -EINVAL;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int run(const struct opts *o, int rank, int sock) {
  char err[256];
  prov_t *p;
  pt_op_t s, r;
  int rc = 0;

  if (pt_open_peer(o->prov, "prov-bench", rank, sock, &p, err, sizeof(err))) {
    fprintf(stderr, "prov_bench: rank %d: open %s: %s\n", rank, o->prov, err);
    return 1;
  }
  /* page-aligned, as chorus-perf's (malloc gives large blocks 16 bytes past
   * a page, and copies between differently aligned buffers can run several
   * times slower on this machine) */
  size_t cap = ((o->maxb ? o->maxb : 1) + 4095) / 4096 * 4096;
  s.buf = aligned_alloc(4096, cap);
  r.buf = aligned_alloc(4096, cap);
  if (!s.buf || !r.buf) {
    fprintf(stderr, "prov_bench: out of memory\n");
    rc = 1;
    goto out;
  }
  memset(s.buf, rank + 1, o->maxb);
  memset(r.buf, 0, o->maxb);
  if (rank == 0)
    printf("# prov_bench: provider %s, mode %s, %d rounds of %d iterations (+%d warmup)\n"
           "# %10s %14s %12s\n",
           p->name, mode_names[o->mode], o->rounds, o->iters, o->warmup, "bytes",
           o->mode == M_PINGPONG ? "one-way us" : "us/iter", "best");
  for (size_t len = o->minb;; len = len ? len * o->factor : 1) {
    double t[PB_MAX_ROUNDS];
    for (int k = 0; k < o->rounds && !rc; k++) {
      if (meet(sock)) {
        rc = 1;
        break;
      }
      double t0 = 0;
      for (int i = -o->warmup; i < o->iters; i++) {
        if (i == 0)
          t0 = pt_now_ms();
        int e = step(p, rank, o->mode, &s, &r, len);
        if (e) {
          fprintf(stderr, "prov_bench: rank %d, %zu bytes: %s %s\n", rank, len, strerror(-e),
                  p->last_error);
          rc = 1;
          break;
        }
      }
      t[k] = (pt_now_ms() - t0) * 1000.0 / o->iters / (o->mode == M_PINGPONG ? 2 : 1);
    }
    if (rc)
      break;
    qsort(t, (size_t)o->rounds, sizeof(t[0]), cmp_double);
    if (rank == 0) {
      printf("  %10zu %14.2f %12.2f\n", len, t[o->rounds / 2], t[0]);
      fflush(stdout);
    }
    if (len >= o->maxb || len > o->maxb / o->factor)
      break;
  }
  if (!rc && meet(sock))
    rc = 1;
out:
  free(s.buf);
  free(r.buf);
  p->ops->close(p);
  return rc;
}

int main(int argc, char **argv) {
  struct opts o;
  int sv[2], st, rc;

  if (parse(argc, argv, &o))
    return 2;
  if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv)) {
    perror("prov_bench: socketpair");
    return 1;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    perror("prov_bench: fork");
    return 1;
  }
  if (pid == 0) {
    close(sv[0]);
    _exit(run(&o, 1, sv[1]));
  }
  close(sv[1]);
  rc = run(&o, 0, sv[0]);
  close(sv[0]); /* a rank 1 still waiting to meet sees EOF */
  if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st))
    rc = 1;
  return rc;
}
