/*
 * memreg.h - memory that peers on the same host can map (chorus_mem_alloc).
 *
 * A region is a memfd mapped shared into this process. A sender whose
 * buffer lies in a region tells the receiver (region id, memfd number,
 * inode, offset); the receiver maps the memfd through /proc/<pid>/fd/<fd>
 * (the same permission CMA needs) and reads the data in place, without the
 * kernel's page pinning and copy. Region ids are never reused within a
 * process, so a receiver's cached mapping of a freed region can never be
 * mistaken for a newer one.
 */
#ifndef CHORUS_MEMREG_H
#define CHORUS_MEMREG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct memreg_info {
  uint64_t id;  /* unique in this process, never 0 */
  int32_t fd;   /* the memfd, valid while the region lives */
  uint64_t ino; /* its inode, checked by the peer that opens it */
  uint64_t off; /* offset of the looked-up address in the region */
  uint64_t size;
} memreg_info_t;

/* Returns 0 or -errno (-EINVAL for bytes 0, -ENOMEM, -EMFILE...). */
int memreg_alloc(void **ptr, size_t bytes);
/* Returns 0, or -ENOENT when ptr is not the start of a live region. */
int memreg_free(void *ptr);
/* True when [p, p+len) lies inside one live region; fills *out. */
bool memreg_lookup(const void *p, size_t len, memreg_info_t *out);

#endif
