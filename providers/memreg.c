/*
 * memreg.c - mappable memory regions (see memreg.h).
 *
 * Regions are few and long-lived (a trainer's gradient buckets), so a small
 * sorted array under a read-write lock is enough: lookups (every large
 * send) take the read lock and binary-search.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "memreg.h"

typedef struct region {
  uintptr_t base;
  size_t size; /* mapped bytes (page multiple) */
  uint64_t id;
  int fd;
  uint64_t ino;
} region_t;

static pthread_rwlock_t lock = PTHREAD_RWLOCK_INITIALIZER;
static region_t *regions; /* sorted by base */
static size_t nregions, cap;
static uint64_t next_id = 1;

/* index of the first region with base > p */
static size_t upper(uintptr_t p) {
  size_t lo = 0, hi = nregions;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (regions[mid].base <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

int memreg_alloc(void **ptr, size_t bytes) {
  long pg = sysconf(_SC_PAGESIZE);
  size_t size;
  struct stat st;
  int fd, rc;
  void *p;

  if (!ptr || bytes == 0)
    return -EINVAL;
  *ptr = NULL;
  if (bytes > SIZE_MAX - (size_t)pg)
    return -ENOMEM;
  size = (bytes + (size_t)pg - 1) / (size_t)pg * (size_t)pg;
  fd = memfd_create("chorus-mem", MFD_CLOEXEC);
  if (fd < 0)
    return -errno;
  if (ftruncate(fd, (off_t)size) || fstat(fd, &st)) {
    rc = -errno;
    close(fd);
    return rc;
  }
  p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    rc = -errno;
    close(fd);
    return rc;
  }
  pthread_rwlock_wrlock(&lock);
  if (nregions == cap) {
    size_t ncap = cap ? 2 * cap : 16;
    region_t *n = realloc(regions, ncap * sizeof(*n));
    if (!n) {
      pthread_rwlock_unlock(&lock);
      munmap(p, size);
      close(fd);
      return -ENOMEM;
    }
    regions = n;
    cap = ncap;
  }
  size_t i = upper((uintptr_t)p);
  memmove(&regions[i + 1], &regions[i], (nregions - i) * sizeof(*regions));
  regions[i] = (region_t){(uintptr_t)p, size, next_id++, fd, (uint64_t)st.st_ino};
  nregions++;
  pthread_rwlock_unlock(&lock);
  *ptr = p;
  return 0;
}

int memreg_free(void *ptr) {
  region_t r;

  if (!ptr)
    return -ENOENT;
  pthread_rwlock_wrlock(&lock);
  size_t i = upper((uintptr_t)ptr);
  if (i == 0 || regions[i - 1].base != (uintptr_t)ptr) {
    pthread_rwlock_unlock(&lock);
    return -ENOENT;
  }
  r = regions[i - 1];
  memmove(&regions[i - 1], &regions[i], (nregions - i) * sizeof(*regions));
  nregions--;
  if (nregions == 0) {
    free(regions);
    regions = NULL;
    cap = 0;
  }
  pthread_rwlock_unlock(&lock);
  munmap((void *)r.base, r.size);
  close(r.fd);
  return 0;
}

bool memreg_lookup(const void *p, size_t len, memreg_info_t *out) {
  uintptr_t a = (uintptr_t)p;
  bool found = false;

  pthread_rwlock_rdlock(&lock);
  size_t i = nregions ? upper(a) : 0;
  if (i > 0) {
    const region_t *r = &regions[i - 1];
    if (a - r->base <= r->size && len <= r->size - (a - r->base)) {
      *out = (memreg_info_t){r->id, r->fd, r->ino, a - r->base, r->size};
      found = true;
    }
  }
  pthread_rwlock_unlock(&lock);
  return found;
}
