/*
 * fuzz_common.h - input splitting shared by the fuzz targets.
 */
#ifndef CHORUS_FUZZ_COMMON_H
#define CHORUS_FUZZ_COMMON_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_SEP "\xf5\x5e\xf5\x5e" /* between streams; not a likely frame byte run */
#define FUZZ_SEP_LEN 4
#define FUZZ_MAX_STREAMS 16

/* Split data on FUZZ_SEP into at most max pieces (the last takes the rest). */
static inline int fuzz_split(const uint8_t *data, size_t size, const uint8_t **out, size_t *lens,
                             int max) {
  int n = 0;

  while (n < max - 1) {
    const uint8_t *sep = size >= FUZZ_SEP_LEN ? memmem(data, size, FUZZ_SEP, FUZZ_SEP_LEN) : NULL;
    if (!sep)
      break;
    out[n] = data;
    lens[n++] = (size_t)(sep - data);
    size -= (size_t)(sep - data) + FUZZ_SEP_LEN;
    data = sep + FUZZ_SEP_LEN;
  }
  out[n] = data;
  lens[n++] = size;
  return n;
}

/* A NUL-terminated copy of data (cut at its first NUL), or NULL. */
static inline char *fuzz_string(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);

  if (!s)
    return NULL;
  memcpy(s, data, size);
  s[size] = '\0';
  return s;
}

#endif
