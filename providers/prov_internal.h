/*
 * prov_internal.h - helpers shared by the transport implementations.
 * Private to providers/: the engine includes prov.h only.
 */
#ifndef CHORUS_PROV_INTERNAL_H
#define CHORUS_PROV_INTERNAL_H

#include <stddef.h>

#include "prov.h"

#define PROV_CONTAINER_OF(ptr, type, member)                                                       \
  ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

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

#endif
