/*
 * test_memcopy.c - memcopy (providers/memcopy.h), the data path's memcpy in
 * pieces: every byte lands, nothing around the destination is touched, for
 * sizes around its thresholds and every offset of destination and source
 * within a cache line, both ways of copying between different offsets
 * (in pieces or not, memcopy_pieces_pay), and for the streamed copy of
 * large blocks (MEMCOPY_STREAM and up).
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "memcopy.h"

static void check(size_t n, size_t doff, size_t soff) {
  static unsigned char src[70000 + 128], dst[70000 + 256];
  for (size_t i = 0; i < sizeof(src); i++)
    src[i] = (unsigned char)(i * 131 + n);
  memset(dst, 0xa5, sizeof(dst));
  memcopy(dst + 64 + doff, src + soff, n);
  for (size_t i = 0; i < sizeof(dst); i++) {
    unsigned char want = i >= 64 + doff && i < 64 + doff + n ? src[soff + i - 64 - doff] : 0xa5;
    if (dst[i] != want)
      cr_assert_fail("n %zu, dst +%zu, src +%zu: byte %zu is %#x, expected %#x", n, doff, soff, i,
                     dst[i], want);
  }
}

Test(memcopy, sizes_and_offsets) {
  static const size_t sizes[] = {0,    1,    63,   64,   2047,  2048,  2049, 8191,
                                 8192, 8193, 8255, 9000, 65536, 65599, 70000};
  for (int pieces = 0; pieces < 2; pieces++) {
    memcopy_pieces_pay = pieces;
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++)
      for (size_t doff = 0; doff < 64; doff += 7)
        for (size_t soff = 0; soff < 64; soff += 13)
          check(sizes[k], doff, soff);
  }
  memcopy_pieces_pay = 1;
}

/* memcopy_init chooses once: 0 or 1, and a second call (or one from another
 * thread) leaves the choice as it is. */
Test(memcopy, init_chooses_once) {
  memcopy_init();
  int first = memcopy_pieces_pay;
  cr_assert(first == 0 || first == 1, "memcopy_pieces_pay is %d", first);
  memcopy_pieces_pay = !first;
  memcopy_init();
  cr_assert_eq(memcopy_pieces_pay, !first, "a second memcopy_init chose again");
}

/* Large blocks take the streamed path: sizes at and around its threshold,
 * tails of every length mod 64, destinations and sources at several offsets
 * within a line; every byte checked, and the guard bytes on both sides. */
Test(memcopy, streamed_large_blocks) {
  const size_t big = MEMCOPY_STREAM + 4096;
  unsigned char *src = malloc(big + 128), *dst = malloc(big + 256);
  static const size_t sizes[] = {MEMCOPY_STREAM - 1, MEMCOPY_STREAM, MEMCOPY_STREAM + 1,
                                 MEMCOPY_STREAM + 63, MEMCOPY_STREAM + 4095};
  static const size_t offs[][2] = {{0, 0}, {16, 0}, {0, 48}, {1, 3}, {63, 17}, {32, 32}};

  cr_assert(src && dst);
  for (size_t i = 0; i < big + 128; i++)
    src[i] = (unsigned char)(i * 131 + (i >> 12));
  for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++)
    for (size_t o = 0; o < sizeof(offs) / sizeof(offs[0]); o++) {
      size_t n = sizes[k], doff = offs[o][0], soff = offs[o][1];

      memset(dst, 0xa5, big + 256);
      memcopy(dst + 64 + doff, src + soff, n);
      for (size_t i = 0; i < 64 + doff; i++)
        cr_assert_eq(dst[i], 0xa5, "n %zu: byte %zu before the copy touched", n, i);
      cr_assert_eq(memcmp(dst + 64 + doff, src + soff, n), 0, "n %zu, dst +%zu, src +%zu: data", n,
                   doff, soff);
      for (size_t i = 64 + doff + n; i < big + 256; i++)
        cr_assert_eq(dst[i], 0xa5, "n %zu: byte %zu after the copy touched", n, i);
    }
  free(src);
  free(dst);
}

/* Destination and source at the same offset within a line take glibc's copy
 * in blocks of MEMCOPY_BLOCK: sizes at and around one and several blocks,
 * at several such offsets; every byte checked, and the guard bytes. */
Test(memcopy, blocks_at_the_same_offset) {
  const size_t big = 3 * MEMCOPY_BLOCK + 4096;
  unsigned char *src = malloc(big + 128), *dst = malloc(big + 256);
  static const size_t sizes[] = {MEMCOPY_BLOCK - 1, MEMCOPY_BLOCK,
                                 MEMCOPY_BLOCK + 1, 2 * MEMCOPY_BLOCK - 64,
                                 2 * MEMCOPY_BLOCK, 3 * MEMCOPY_BLOCK + 4095};
  static const size_t offs[] = {0, 1, 16, 63};

  cr_assert(src && dst);
  cr_assert_lt(3 * MEMCOPY_BLOCK + 4095, MEMCOPY_STREAM, "these sizes must stay below the stream");
  for (size_t i = 0; i < big + 128; i++)
    src[i] = (unsigned char)(i * 131 + (i >> 12));
  /* malloc's blocks may start at any offset within a line: align both */
  unsigned char *s0 = src + ((64 - ((uintptr_t)src & 63)) & 63);
  unsigned char *d0 = dst + ((64 - ((uintptr_t)dst & 63)) & 63);
  for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++)
    for (size_t o = 0; o < sizeof(offs) / sizeof(offs[0]); o++) {
      size_t n = sizes[k], off = offs[o];

      memset(dst, 0xa5, big + 256);
      memcopy(d0 + 64 + off, s0 + off, n);
      for (unsigned char *p = dst; p < d0 + 64 + off; p++)
        cr_assert_eq(*p, 0xa5, "n %zu: byte %td before the copy touched", n, p - dst);
      cr_assert_eq(memcmp(d0 + 64 + off, s0 + off, n), 0, "n %zu, offset %zu: data", n, off);
      for (unsigned char *p = d0 + 64 + off + n; p < dst + big + 256; p++)
        cr_assert_eq(*p, 0xa5, "n %zu: byte %td after the copy touched", n, p - dst);
    }
  free(src);
  free(dst);
}
