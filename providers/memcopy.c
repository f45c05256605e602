/*
 * memcopy.c - the one choice memcopy (memcopy.h) makes per process: whether
 * copies between different offsets within a line go in pieces. glibc's
 * `rep movsb` is ten times slower there on some CPUs and as fast as ever on
 * others, where the pieces cost a third; so both ways are timed once, on a
 * block of the size bounce slots carry, and the faster kept.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "memcopy.h"

/* Until memcopy_init has timed them: pieces, the way that is never far off. */
_Atomic int memcopy_pieces_pay = 1;

#define MEMCOPY_TRY_BYTES (64u << 10)
#define MEMCOPY_TRIES 8

static uint64_t memcopy_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* One way (memcopy_apart) for a block that differs in its offset within a
 * line (16 bytes, as malloc's blocks do). */
static uint64_t memcopy_time(unsigned char *d, const unsigned char *s, size_t n, int pieces) {
  uint64_t t0 = memcopy_now_ns();
  memcopy_apart(d, s, n, pieces);
  __asm__ volatile("" : : "r"(d) : "memory"); /* the copy is used */
  return memcopy_now_ns() - t0;
}

static void memcopy_choose(void) {
  unsigned char *a = NULL, *b = NULL;
  uint64_t best[2] = {UINT64_MAX, UINT64_MAX};

  if (posix_memalign((void **)&a, 4096, MEMCOPY_TRY_BYTES + 64) ||
      posix_memalign((void **)&b, 4096, MEMCOPY_TRY_BYTES + 64)) {
    free(a);
    return; /* keeps the pieces */
  }
  memset(a, 1, MEMCOPY_TRY_BYTES + 64);
  memset(b, 2, MEMCOPY_TRY_BYTES + 64);
  /* alternated, the least of each: a try the thread lost its core in is
   * not the one that counts */
  for (int i = 0; i < MEMCOPY_TRIES; i++)
    for (int pieces = 0; pieces < 2; pieces++) {
      uint64_t t = memcopy_time(b, a + 16, MEMCOPY_TRY_BYTES, pieces);
      if (t < best[pieces])
        best[pieces] = t;
    }
  /* pieces only where they are clearly the faster */
  memcopy_pieces_pay = best[1] * 5 < best[0] * 4;
  free(a);
  free(b);
}

void memcopy_init(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, memcopy_choose);
}
