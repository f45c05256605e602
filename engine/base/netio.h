/*
 * netio.h - blocking-with-a-deadline helpers over nonblocking TCP sockets,
 * shared by the rendezvous client (bootstrap.c) and the TCPStore client
 * (tcpstore.c). Deadlines are CLOCK_MONOTONIC seconds.
 */
#ifndef CHORUS_NETIO_H
#define CHORUS_NETIO_H

#include <netdb.h>

/* Wait until fd is ready for `events` (poll's) or the deadline: 0 (also on
 * POLLERR/POLLHUP: the next send or recv tells what), -ETIMEDOUT or -errno. */
int netio_wait_fd(int fd, short events, double deadline);
/* One nonblocking connect to ai, finished before the deadline, TCP_NODELAY
 * set: the fd (nonblocking, close-on-exec), or -errno; a socket connected
 * to itself (TCP simultaneous open on an ephemeral port nobody listens on)
 * is -ECONNREFUSED, and reset: its port is free again at once. */
int netio_try_connect(const struct addrinfo *ai, double deadline);
/* How many connects so far found themselves connected to themselves. */
unsigned netio_self_connects(void);

#endif
