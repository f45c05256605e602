/*
 * bootstrap.h - rendezvous of the ranks of a job over TCP.
 *
 * Rank 0 serves a small store on its rendezvous address (a libevent loop on a
 * thread of its own); every rank, rank 0 included, connects to it as a
 * client and keeps that connection open for the communicator's lifetime (it
 * is the liveness channel). Messages are length-prefixed protobuf
 * (schemas/bootstrap.proto). The first message of a client is a Hello with
 * the job token, rank, size and host identity; a wrong token, a rank out of
 * range, a duplicate rank or a size mismatch is refused with an Error that
 * the client reports. Once all ranks said Hello, the server answers each
 * with the whole table of host identities.
 *
 * After that, collective rounds: every rank calls boot_allgather() in the
 * same order; the server answers a round when all ranks contributed.
 * A rank that never arrives makes boot_open() fail on every other rank
 * after the timeout with a message naming the missing ranks.
 */
#ifndef CHORUS_BOOTSTRAP_H
#define CHORUS_BOOTSTRAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct boot boot_t;

typedef struct boot_config {
  int rank;
  int size;
  const char *rendezvous; /* "host:port"; rank 0 listens on port (host's address when host is
                             a numeric address, else every interface) */
  const char *token;      /* job token; "" when none */
  double timeout_s;       /* connect + first round */
  /* rank 0: the watchdog's judge (watch_srv.h) in the server; tick 0: none */
  double watch_tick_s, watch_timeout_s, watch_peer_timeout_s;
  /* rank 0: serve on listen_fd (made by boot_listen) instead of binding the
   * rendezvous port; boot_open owns it from then on, failure included */
  bool has_listen_fd;
  int listen_fd;
} boot_config_t;

/* A rendezvous listener on a port the kernel picks, bound to `host` (a
 * numeric address binds that address only; a name binds every interface,
 * since a host's own name may resolve to a loopback address there). On
 * success *fd is the listening socket and addr the "host:port" to give the
 * ranks. Returns 0 or CHORUS_ERR_BOOTSTRAP with the reason in err. */
int boot_listen(const char *host, int *fd, char *addr, size_t addrlen, char *err, size_t errlen);
/* The IPv4 address of interface `iface`, else ("" or NULL) of the first up
 * interface that is not loopback, else 127.0.0.1, as text. Returns 0, or -1
 * with the reason in err when a named interface has no such address. */
int boot_iface_address(const char *iface, char *out, size_t len, char *err, size_t errlen);

/* Host identity of this machine ("hostname/boot_id"). */
void boot_host_identity(char *out, size_t len);

/* Returns 0 or a negative chorus_result (CHORUS_ERR_BOOTSTRAP, _AUTH, _TIMEOUT)
 * with the reason in err. */
int boot_open(const boot_config_t *cfg, boot_t **out, char *err, size_t errlen);
/* Host identity of rank r (valid after boot_open), or NULL. */
const char *boot_host_of(const boot_t *b, int r);
/* Everyone contributes `len` bytes (lengths may differ between ranks); on
 * success *out is one malloc'd block: out[i] points to rank i's bytes and
 * lens[i] is its length; free it with free(*out_ptrs) and free(*out_lens).
 * Returns 0 or a negative chorus_result with the reason in err. */
int boot_allgather(boot_t *b, const void *mine, size_t len, void ***out_ptrs, size_t **out_lens,
                   double timeout_s, char *err, size_t errlen);
/* boot_allgather of nothing. */
int boot_barrier(boot_t *b, double timeout_s, char *err, size_t errlen);
/* The client's connection to rank 0 (for a liveness watch), or -1. */
int boot_fd(const boot_t *b);
/* The watchdog's own connection to rank 0's server (engine/watch/watch.c):
 * connects, says WatchHello and reads WatchWelcome. Returns the connected
 * fd (nonblocking), with *offset_ns = rank 0's clock - ours, or a negative
 * chorus_result with the reason in err. */
int boot_watch_connect(boot_t *b, int64_t *offset_ns, char *err, size_t errlen);
/* One frame of the bootstrap protocol (a Chorus__Boot__Envelope) on fd,
 * within timeout_s. 0 or -errno (-EPIPE: end of file; -EBADMSG: garbage).
 * Free a received envelope with chorus__boot__envelope__free_unpacked. */
struct Chorus__Boot__Envelope;
int boot_send_envelope(int fd, const struct Chorus__Boot__Envelope *env, double timeout_s);
int boot_recv_envelope(int fd, double timeout_s, struct Chorus__Boot__Envelope **env);
/* Close the client (and on rank 0, stop the server after every client left
 * or a grace period passed). */
void boot_close(boot_t *b);

/* ---- byte buffers in place of peers, for tests and fuzzing ---- */

/* Runs a rendezvous server of `size` ranks with job token `token` (NULL:
 * none) on n (<= 16) connections, connection i sending streams[i] (lens[i]
 * bytes) and then closing, until the server has dealt with every one; then
 * frees all it holds. Returns 0, -EINVAL, -ENOMEM, or -EDEADLK when the
 * server kept a connection after its end of file (a bug). */
int boot_serve_bytes(int size, const char *token, const uint8_t *const *streams, const size_t *lens,
                     int n);
/* Runs the client of `rank` in a job of `size` (token none) against a
 * server whose whole answer is `bytes` (framed messages) and then end of
 * file: Hello, then up to `rounds` boot_allgather calls while they succeed,
 * then boot_close. Returns 0 or the first failure's chorus_result. */
int boot_client_bytes(int rank, int size, const uint8_t *bytes, size_t len, int rounds);

#endif
