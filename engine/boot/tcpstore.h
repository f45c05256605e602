/*
 * tcpstore.h - a client of PyTorch's TCPStore (torch.distributed.TCPStore),
 * just enough of it to hand a rendezvous id through the store a launcher
 * already runs: torchrun's agent store at MASTER_ADDR:MASTER_PORT, or the
 * one dist.init_process_group starts there (engine/comm/launch.c).
 *
 * The wire protocol is torch's own, in host byte order: a query type byte,
 * then its arguments, each string or value as a 64-bit length and its bytes.
 * Two generations are spoken, found when connecting (tcpstore_open):
 *  - V1 (torch 1.x to 2.0): no handshake; SET 0, GET 2, WAIT 5, GETNUMKEYS 6.
 *  - V2 (later 2.x, both the classic and the libuv server): a connection's
 *    first query must be VALIDATE (0) with the magic 0x3C85F7CE, or the
 *    server closes it (classic) or ignores it (libuv); then SET 1, GET 3,
 *    WAIT 6, GETNUMKEYS 7.
 * Every read has a deadline and a bound; a server that answers what no
 * TCPStore would is named with the first bytes it sent (-EPROTO).
 *
 * Keys are used as written: torch's Python API prefixes its own with "/"
 * (store.get("a") reads the key "/a").
 */
#ifndef CHORUS_TCPSTORE_H
#define CHORUS_TCPSTORE_H

#include <stddef.h>
#include <stdint.h>

typedef struct tcpstore tcpstore_t;

enum tcpstore_proto {
  TCPSTORE_V1 = 1, /* torch 1.x - 2.0: no handshake */
  TCPSTORE_V2 = 2, /* torch 2.x: VALIDATE first */
};

/* Longest key and value this client sends or accepts. */
#define TCPSTORE_MAX_KEY 1024
#define TCPSTORE_MAX_VALUE (1u << 20)

/* Quiet time before the V2 probe (see tcpstore.c, "Finding the protocol"),
 * and the most any probe waits for an answer. */
#define TCPSTORE_V1_QUIET_S 0.05
#define TCPSTORE_PROBE_S 5.0

/*
 * Connects to the store at host:port (host a name or a numeric address) and
 * finds the protocol it speaks, within timeout_s (the probe itself within
 * TCPSTORE_PROBE_S of that). Returns 0 with *out, or with the reason in err:
 *   -ECONNREFUSED  nothing listens there (every address of host refused);
 *   -EPROTO        something answered that is not a TCPStore;
 *   -ETIMEDOUT     no connection, or no answer as either generation;
 *   -ENOENT        host does not resolve;
 *   another -errno from the socket calls.
 */
int tcpstore_open(const char *host, const char *port, double timeout_s, tcpstore_t **out, char *err,
                  size_t errlen);
/* The same over a connected socket (tests, fuzzing): speaks proto at once,
 * sending V2's VALIDATE first; takes fd (closed by tcpstore_close, or here
 * on failure). addr names the server in messages. */
int tcpstore_from_fd(int fd, enum tcpstore_proto proto, const char *addr, tcpstore_t **out,
                     char *err, size_t errlen);
enum tcpstore_proto tcpstore_protocol(const tcpstore_t *s);
/* "host:port" of the server, for messages. */
const char *tcpstore_addr(const tcpstore_t *s);

/* Sets key to the len bytes of val, then waits for the store to answer a
 * round trip (so it has the value when this returns 0). */
int tcpstore_set(tcpstore_t *s, const char *key, const void *val, size_t len, double timeout_s,
                 char *err, size_t errlen);
/* Waits until key is set; -ETIMEDOUT after timeout_s (the connection is
 * then unusable: close it). */
int tcpstore_wait(tcpstore_t *s, const char *key, double timeout_s, char *err, size_t errlen);
/* The value of key (which must be set: a TCPStore closes the connection of
 * a GET of a missing key, -EPIPE) into buf, *len bytes; -EMSGSIZE when it
 * is longer than cap (nothing read). */
int tcpstore_get(tcpstore_t *s, const char *key, void *buf, size_t cap, size_t *len,
                 double timeout_s, char *err, size_t errlen);
/* The number of keys in the store (a round trip). */
int tcpstore_num_keys(tcpstore_t *s, int64_t *n, double timeout_s, char *err, size_t errlen);
void tcpstore_close(tcpstore_t *s);

/* Fuzzing: runs the client speaking proto against a server whose whole
 * answer is bytes, then end of file: a key count, a set, a wait and a get
 * while they succeed. Returns the first failure (negative) or 0. */
int tcpstore_client_bytes(enum tcpstore_proto proto, const uint8_t *bytes, size_t len);

#endif
