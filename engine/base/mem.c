/*
 * mem.c - chorus_mem_alloc / chorus_mem_free: buffers peers can map.
 */
#include <errno.h>
#include <string.h>

#include "eng.h"
#include "memreg.h"

CHORUS_API chorus_result chorus_mem_alloc(void **ptr, size_t bytes) {
  if (!ptr)
    return eng_error(CHORUS_ERR_INVALID_ARG, "chorus_mem_alloc: ptr is NULL");
  *ptr = NULL;
  if (bytes == 0)
    return eng_error(CHORUS_ERR_INVALID_ARG, "chorus_mem_alloc: 0 bytes");
  int rc = memreg_alloc(ptr, bytes);
  if (rc == -ENOMEM || rc == -EFBIG)
    return eng_error(CHORUS_ERR_NO_MEMORY, "chorus_mem_alloc(%zu): out of memory", bytes);
  if (rc)
    return eng_error(CHORUS_ERR_NO_MEMORY, "chorus_mem_alloc(%zu): %s", bytes, strerror(-rc));
  return CHORUS_SUCCESS;
}

CHORUS_API chorus_result chorus_mem_free(void *ptr) {
  if (!ptr)
    return CHORUS_SUCCESS; /* like free(NULL) */
  if (memreg_free(ptr))
    return eng_error(CHORUS_ERR_INVALID_ARG,
                     "chorus_mem_free(%p): not a buffer from chorus_mem_alloc (or freed twice)",
                     ptr);
  return CHORUS_SUCCESS;
}
