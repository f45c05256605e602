/*
 * prov_internal.h - helpers shared by the transport implementations.
 * Private to providers/: the engine includes prov.h only.
 */
#ifndef CHORUS_PROV_INTERNAL_H
#define CHORUS_PROV_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "prov.h"

#define PROV_CONTAINER_OF(ptr, type, member)                                                       \
  ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

/* getname()'s contract for an address of n bytes at name: copies it to
 * addr when *len (in) leaves room, and sets *len to n; -ENOSPC when it
 * does not fit (or addr is NULL), -EINVAL when len is NULL. */
int prov_copy_name(const void *name, size_t n, void *addr, size_t *len);

/* Writes a formatted reason into errbuf (may be NULL or errlen 0). */
void prov_errf(char *errbuf, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The op bookkeeping every implementation keeps in prov_op.internal[]:
 * [PROV_OP_OWNER] is the prov_t the op is posted on (NULL when not posted),
 * [PROV_OP_REQ] the implementation's own record for it. The rest is free. */
enum { PROV_OP_OWNER = 0, PROV_OP_REQ = 1 };

/* Tests only: the shm doorbell's backstop timer off, so that a test can see
 * that the rings alone wake a sleeper (single-threaded tests, where shm's
 * put-off completions can not happen). No effect on other providers. */
void prov_ofi_test_no_backstop(prov_t *p);
/* Tests only: whether ofi_reap counts process pid as gone (its shm region
 * may be removed): gone, a zombie, exiting, or SIGKILL pending. */
bool prov_ofi_test_pid_dead(int32_t pid);

/* Tests only: rank's queue lock in libfabric 1.17's shm (see "Locks left
 * held" in prov_ofi.c), as ofi_unwedge knows it; NULL when not known (not
 * shm, another libfabric) or p is not ofi. */
void *prov_ofi_test_queue_lock(prov_t *p, int rank);

/* Tests only: the shm doorbell page's layout for a job of nranks: where
 * bounce_done[], taken[], taken_want[] and ack_ring[] begin (off[0..3]; 0
 * for ack_ring[] in a job too large to have one); returns the bytes the
 * page needs. */
size_t prov_ofi_test_db_layout(int nranks, size_t off[4]);

/* Fuzzing only (tests/fuzz/fuzz_peer_record.c): how the ofi and multi
 * transports decode the address a peer published (its endpoint record's
 * `address`) before they trust it, without opening a transport.
 *
 * prov_ofi_test_addr_decode: addr_parse, then, for a transport with the
 * shm doorbell (doorbell: only addresses with one are accepted), what
 * add_peers keeps of it before any system call: the socket's address and
 * the shm region's name. Returns 0 or -EINVAL; fab points into addr. */
typedef struct prov_ofi_test_addr {
  const unsigned char *fab; /* the libfabric name */
  size_t fab_len;
  bool has_db;
  size_t salen;       /* doorbell: the socket address's length */
  char sun_path[108]; /* doorbell: the socket's name (abstract: starts with NUL) */
  char region[96];    /* doorbell: NAME of "chorus://NAME", or "" */
} prov_ofi_test_addr_t;
int prov_ofi_test_addr_decode(const void *addr, size_t len, bool doorbell,
                              prov_ofi_test_addr_t *out);
/* prov_multi's split of an address into its two children's (0: absent):
 * 0 or -EINVAL. */
int prov_multi_test_addr_parse(const void *addr, size_t len, const unsigned char **part,
                               size_t *plen);
/* prov_ofi's single-copy rendezvous: the checks a descriptor a peer sent
 * (a message of len bytes) goes through before data is copied, for a
 * receive buffer of rlen bytes and, when the descriptor names a region
 * (rid), a mapped region of region_size bytes. Returns 1: not a descriptor
 * (an ordinary message), -EPROTO: malformed, -EMSGSIZE: longer than the
 * buffer, 2: not inside the region (the data would come by
 * process_vm_readv: *n bytes), 0: *n bytes to copy from the region at *off. */
int prov_ofi_test_rndv_desc(const void *msg, size_t len, size_t rlen, uint64_t region_size,
                            uint64_t *off, uint64_t *n);
/* Fuzzing and tests only (tests/fuzz/fuzz_sock_stream.c): hands fd, a
 * connected stream socket, to sock endpoint p as if its listener had just
 * accepted it from a stranger: what comes in on it meets the hello's
 * checks and then, from a rank it accepts, the stream decoder, as a
 * peer's bytes would. 0, or -errno with fd closed. */
int prov_sock_test_adopt(prov_t *p, int fd);

#endif
