/*
 * prov_test.c - helpers shared by the transport tests.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "prov_test.h"

void pt_op_init(pt_op_t *t) {
  memset(t, 0, sizeof(*t));
  t->op.done = pt_done;
  t->status = 1; /* not a code any callback reports */
}

void pt_done(prov_op_t *op, int status, size_t len) {
  pt_op_t *t = (pt_op_t *)(void *)((char *)op - offsetof(pt_op_t, op));

  t->calls++;
  t->status = status;
  t->len = len;
}

double pt_now_ms(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void progress_all(prov_t **eps, int neps) {
  for (int i = 0; i < neps; i++)
    if (eps[i])
      eps[i]->ops->progress(eps[i]);
}

static bool all_done(pt_op_t **ops, int nops) {
  for (int i = 0; i < nops; i++)
    if (ops[i] && ops[i]->calls == 0)
      return false;
  return true;
}

bool pt_drive(prov_t **eps, int neps, pt_op_t **ops, int nops, double timeout_ms) {
  double end = pt_now_ms() + timeout_ms;

  while (!all_done(ops, nops)) {
    if (pt_now_ms() > end)
      return false;
    progress_all(eps, neps);
  }
  return true;
}

static int post_retry(prov_t **eps, int neps, prov_t *p, int peer, pt_op_t *t, size_t len,
                      uint64_t tag, double timeout_ms, bool send) {
  double end = pt_now_ms() + timeout_ms;
  int rc;

  t->tag = tag;
  for (;;) {
    rc = send ? p->ops->post_send(p, peer, t->buf, len, tag, &t->op)
              : p->ops->post_recv(p, peer, t->buf, len, tag, &t->op);
    if (rc != -EAGAIN)
      return rc;
    if (pt_now_ms() > end)
      return -ETIMEDOUT;
    progress_all(eps, neps);
  }
}

int pt_send(prov_t **eps, int neps, prov_t *p, int peer, pt_op_t *t, size_t len, uint64_t tag,
            double timeout_ms) {
  return post_retry(eps, neps, p, peer, t, len, tag, timeout_ms, true);
}

int pt_recv(prov_t **eps, int neps, prov_t *p, int peer, pt_op_t *t, size_t len, uint64_t tag,
            double timeout_ms) {
  return post_retry(eps, neps, p, peer, t, len, tag, timeout_ms, false);
}

static uint8_t pattern_byte(size_t i, uint64_t seed) {
  uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15ull + seed * 0xbf58476d1ce4e5b9ull;

  return (uint8_t)(x >> 56 ^ x >> 24 ^ i);
}

void pt_fill(void *buf, size_t len, uint64_t seed) {
  uint8_t *b = buf;

  for (size_t i = 0; i < len; i++)
    b[i] = pattern_byte(i, seed);
}

size_t pt_check(const void *buf, size_t len, uint64_t seed) {
  const uint8_t *b = buf;

  for (size_t i = 0; i < len; i++)
    if (b[i] != pattern_byte(i, seed))
      return i;
  return (size_t)-1;
}

int pt_open_job(const char *cfg_name, void *world, int n, prov_t **eps, char *err, size_t errlen) {
  prov_config_t base = {.name = cfg_name};

  return pt_open_job_cfg(&base, world, n, eps, err, errlen);
}

int pt_open_job_cfg(const prov_config_t *base, void *world, int n, prov_t **eps, char *err,
                    size_t errlen) {
  static unsigned job_seq;
  char job[64];
  void *addrs[n];
  const void *caddrs[n];
  size_t lens[n];
  int rc = 0, i;

  snprintf(job, sizeof(job), "pt-%d-%u", (int)getpid(), job_seq++);
  memset(eps, 0, sizeof(eps[0]) * (size_t)n);
  memset(addrs, 0, sizeof(addrs));
  for (i = 0; i < n; i++) {
    prov_config_t cfg = *base;

    cfg.rank = i;
    cfg.nranks = n;
    cfg.job_id = job;
    cfg.inproc_world = world;

    rc = prov_open(&cfg, &eps[i], err, errlen);
    if (rc)
      goto out_close;
    lens[i] = 512;
    addrs[i] = malloc(lens[i]);
    rc = eps[i]->ops->getname(eps[i], addrs[i], &lens[i]);
    if (rc) {
      snprintf(err, errlen, "getname of rank %d: %d", i, rc);
      goto out_close;
    }
    caddrs[i] = addrs[i];
  }
  for (i = 0; i < n; i++) {
    rc = eps[i]->ops->add_peers(eps[i], caddrs, lens, n);
    if (rc) {
      snprintf(err, errlen, "add_peers of rank %d: %d (%s)", i, rc, eps[i]->last_error);
      goto out_close;
    }
  }
  for (i = 0; i < n; i++) {
    rc = eps[i]->ops->settle ? eps[i]->ops->settle(eps[i], 10.0) : 0;
    if (rc) {
      snprintf(err, errlen, "settle of rank %d: %d (%s)", i, rc, eps[i]->last_error);
      goto out_close;
    }
  }
  for (i = 0; i < n; i++)
    free(addrs[i]);
  return 0;

out_close:
  for (i = 0; i < n; i++)
    free(addrs[i]);
  pt_close_job(eps, n);
  return rc;
}

int pt_open_peer(const char *cfg_name, const char *job_id, int rank, int sock, prov_t **out,
                 char *err, size_t errlen) {
  prov_config_t cfg = {.name = cfg_name, .rank = rank, .nranks = 2, .job_id = job_id};
  unsigned char mine[512], theirs[512];
  const void *addrs[2];
  size_t lens[2], mylen = sizeof(mine);
  prov_t *p;
  int rc;

  *out = NULL;
  if ((rc = prov_open(&cfg, &p, err, errlen)))
    return rc;
  if ((rc = p->ops->getname(p, mine, &mylen))) {
    snprintf(err, errlen, "getname: %d", rc);
    goto fail;
  }
  ssize_t got = -1;
  if (write(sock, mine, mylen) == (ssize_t)mylen)
    got = read(sock, theirs, sizeof(theirs));
  if (got <= 0) {
    snprintf(err, errlen, "address exchange with the peer process failed");
    rc = -EIO;
    goto fail;
  }
  addrs[rank] = mine;
  lens[rank] = mylen;
  addrs[1 - rank] = theirs;
  lens[1 - rank] = (size_t)got;
  if ((rc = p->ops->add_peers(p, addrs, lens, 2))) {
    snprintf(err, errlen, "add_peers: %s", p->last_error);
    goto fail;
  }
  if (p->ops->settle && (rc = p->ops->settle(p, 10.0))) {
    snprintf(err, errlen, "settle: %s", p->last_error);
    goto fail;
  }
  *out = p;
  return 0;
fail:
  p->ops->close(p);
  return rc;
}

void pt_close_job(prov_t **eps, int n) {
  /* Let every endpoint take in what its peers sent last (shm connection
   * requests above all): libfabric 1.17's shm crashes in fi_cq_read when it
   * handles a request from an endpoint of its own process already closed. */
  for (int round = 0; round < 4; round++)
    progress_all(eps, n);
  for (int i = 0; i < n; i++) {
    if (eps[i])
      eps[i]->ops->close(eps[i]);
    eps[i] = NULL;
  }
}

bool pt_arm(prov_t *p, double timeout_ms) {
  double end = pt_now_ms() + timeout_ms;

  while (p->ops->arm(p) != 0) {
    if (pt_now_ms() > end)
      return false;
    p->ops->progress(p);
  }
  return true;
}

int pt_poll_fd(prov_t *p, int timeout_ms) {
  struct pollfd pfd = {.fd = p->ops->wait_fd(p), .events = POLLIN};

  return poll(&pfd, 1, timeout_ms);
}

bool pt_sleepy_drive(prov_t *p, pt_op_t **ops, int nops, double timeout_ms, int poll_ms,
                     int *lost_wakeups) {
  double end = pt_now_ms() + timeout_ms;
  int fd = p->ops->wait_fd(p);

  for (;;) {
    p->ops->progress(p);
    if (all_done(ops, nops))
      return true;
    if (pt_now_ms() > end)
      return false;
    if (p->ops->arm(p) != 0)
      continue;
    if (fd >= 0) {
      if (pt_poll_fd(p, poll_ms) == 0) {
        fprintf(stderr, "%s: no wake-up in %d ms, pending tags:", p->name, poll_ms);
        for (int i = 0; i < nops; i++)
          if (ops[i] && !ops[i]->calls)
            fprintf(stderr, " %#llx", (unsigned long long)ops[i]->tag);
        fprintf(stderr, "\n");
        if (lost_wakeups)
          (*lost_wakeups)++;
      }
    } else {
      struct timespec nap = {0, 1000 * 1000};

      nanosleep(&nap, NULL);
    }
    p->ops->disarm(p);
  }
}
