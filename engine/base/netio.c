/* netio.c - see netio.h. */
#include "netio.h"

#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static atomic_uint self_connects;

unsigned netio_self_connects(void) {
  return atomic_load(&self_connects);
}

static double now_s(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int netio_wait_fd(int fd, short events, double deadline) {
  for (;;) {
    struct pollfd p = {.fd = fd, .events = events};
    double left = deadline - now_s();
    int n;

    if (left <= 0)
      return -ETIMEDOUT;
    n = poll(&p, 1, left > 1e6 ? 1000000000 : (int)ceil(left * 1000.0));
    if (n < 0 && errno != EINTR)
      return -errno;
    if (n > 0)
      return 0;
  }
}

int netio_try_connect(const struct addrinfo *ai, double deadline) {
  struct sockaddr_storage me, peer;
  socklen_t ml = sizeof(me), pl = sizeof(peer), el = sizeof(int);
  int fd, rc = 0, one = 1, soerr = 0;

  fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  if (connect(fd, ai->ai_addr, ai->ai_addrlen)) {
    if (errno != EINPROGRESS) {
      rc = -errno;
      goto out_close;
    }
    rc = netio_wait_fd(fd, POLLOUT, deadline);
    if (rc)
      goto out_close;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &el) || soerr) {
      rc = soerr ? -soerr : -errno;
      goto out_close;
    }
  }
  if (getsockname(fd, (struct sockaddr *)&me, &ml) ||
      getpeername(fd, (struct sockaddr *)&peer, &pl)) {
    rc = -errno;
    goto out_close;
  }
  if (ml == pl && !memcmp(&me, &peer, ml)) {
    /* Connected to itself: nothing listens at a port of the ephemeral
     * range and the kernel picked that very port for us. A plain close
     * would leave it in TIME_WAIT for a minute, and rank 0 could then not
     * listen there (MASTER_PORT+1 under torchrun --standalone): reset it. */
    struct linger now = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &now, sizeof(now));
    atomic_fetch_add(&self_connects, 1);
    rc = -ECONNREFUSED;
    goto out_close;
  }
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;

out_close:
  close(fd);
  return rc;
}
