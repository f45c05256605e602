/*
 * fuzz_peer_record.c - the endpoint records peers send when a communicator
 * is made or split (schemas/endpoint.proto), down to the transport address
 * each one carries: every decoding a peer's bytes go through before they
 * are trusted.
 *
 * Input: one byte of setup, then one record per rank separated by FUZZ_SEP
 * (the communicator has as many ranks as there are records, up to 16).
 * Setup bits 0-3: this rank (mod the size); bits 4-5: the transport, which
 * decides how addresses are read: "shm" (an ofi address with the doorbell),
 * "tcp;ofi_rxm" (an ofi address), "shm+tcp;ofi_rxm" (a multi address of the
 * two) or "verbs;ofi_rxm" (ofi); bit 6: CHORUS_TOPO checked across records
 * (chorus_comm_create) or not (chorus_comm_split); bit 7: the records come
 * as a split sees them, through its member list: the first record belongs
 * to a rank left out, the others to the members in reverse order.
 *
 * comm_add_peer_records runs on a communicator holding what it reads (rank,
 * size, lock, transport). The transport is a stand-in whose add_peers
 * decodes each address as prov_ofi and prov_multi do before trusting it
 * (the test hooks of prov_internal.h): no libfabric, no peer process
 * touched. Either outcome must be clean: success, or an error with its
 * reason; what is accepted lies inside the record; nothing leaks.
 * FUZZ_VERBOSE=1 in the environment prints each outcome (to check seeds).
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "comm.h"
#include "eng.h"
#include "fuzz_common.h"
#include "prov_internal.h"

enum { T_SHM, T_TCP, T_MULTI, T_VERBS };
static const char *const names[] = {"shm", "tcp;ofi_rxm", "shm+tcp;ofi_rxm", "verbs;ofi_rxm"};

typedef struct stand_in {
  prov_t base;
  int kind;
  char err[128];
} stand_in_t;

static void inside(const void *part, size_t len, const void *addr, size_t alen) {
  const unsigned char *p = part, *a = addr;

  if (len && (p < a || p > a + alen || len > (size_t)(a + alen - p)))
    abort();
}

/* An ofi address as prov_ofi's add_peers reads it. */
static int ofi_decode(const void *addr, size_t len, bool doorbell) {
  prov_ofi_test_addr_t o;

  if (prov_ofi_test_addr_decode(addr, len, doorbell, &o))
    return -EINVAL;
  if (!o.fab_len || (doorbell && !o.has_db))
    abort();
  inside(o.fab, o.fab_len, addr, len);
  if (doorbell) {
    if (o.salen < offsetof(struct sockaddr_un, sun_path) || o.salen > sizeof(struct sockaddr_un))
      abort();
    if (strnlen(o.region, sizeof(o.region)) == sizeof(o.region) || strchr(o.region, '/'))
      abort();
  }
  return 0;
}

static int stand_in_add_peers(prov_t *p, const void *const *addrs, const size_t *lens, int n) {
  stand_in_t *s = (stand_in_t *)p;

  for (int i = 0; i < n; i++) {
    int rc = 0;

    if (s->kind == T_MULTI) {
      const unsigned char *part[2];
      size_t plen[2];

      rc = prov_multi_test_addr_parse(addrs[i], lens[i], part, plen);
      if (!rc) {
        inside(part[0], plen[0], addrs[i], lens[i]);
        inside(part[1], plen[1], addrs[i], lens[i]);
        if (plen[0] + plen[1] + 8 != lens[i])
          abort();
        /* the host's child reads its part on the ranks of our host only */
        if (plen[0])
          rc = ofi_decode(part[0], plen[0], true);
        if (!rc)
          rc = plen[1] ? ofi_decode(part[1], plen[1], false) : -EINVAL;
      }
    } else {
      rc = ofi_decode(addrs[i], lens[i], s->kind == T_SHM);
    }
    if (rc) {
      snprintf(s->err, sizeof(s->err), "address of rank %d is not a chorus %s address", i,
               names[s->kind]);
      return rc;
    }
  }
  return 0;
}

static const prov_ops_t stand_in_ops = {
    .size = sizeof(prov_ops_t), .name = "fuzz", .add_peers = stand_in_add_peers};

static bool verbose;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  eng_log_level = -1; /* one refusal per input would flood the output */
  verbose = getenv("FUZZ_VERBOSE") != NULL;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *recs[FUZZ_MAX_STREAMS];
  size_t lens[FUZZ_MAX_STREAMS];
  int members[FUZZ_MAX_STREAMS], n, nrecs;
  stand_in_t prov = {.base = {.ops = &stand_in_ops}};
  chorus_comm_t *c;
  chorus_result ret;
  bool split;

  if (size < 1)
    return 0;
  nrecs = fuzz_split(data + 1, size - 1, recs, lens, FUZZ_MAX_STREAMS);
  split = data[0] & 0x80;
  n = split ? nrecs - 1 : nrecs;
  if (n < 1)
    return 0;
  for (int i = 0; i < n; i++)
    members[i] = nrecs - 1 - i;
  prov.kind = (data[0] >> 4) & 3;
  prov.base.name = names[prov.kind];
  prov.base.last_error = prov.err;
  c = calloc(1, sizeof(*c));
  if (!c)
    return 0;
  c->size = n;
  c->rank = (data[0] & 15) % n;
  c->prov = &prov.base;
  pthread_mutex_init(&c->lock, NULL);
  ret = comm_add_peer_records(c, (void *const *)recs, lens, split ? members : NULL, data[0] & 0x40);
  if (verbose)
    fprintf(stderr, "fuzz_peer_record: %d ranks, rank %d, %s: %s\n", n, c->rank, prov.base.name,
            ret ? c->last_error : "accepted");
  if (ret != CHORUS_SUCCESS &&
      (strnlen(c->last_error, sizeof(c->last_error)) == sizeof(c->last_error) ||
       strncmp(c->last_error, "rank ", 5) != 0))
    abort();
  pthread_mutex_destroy(&c->lock);
  free(c);
  return 0;
}
