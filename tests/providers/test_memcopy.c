/*
 * test_memcopy.c - memcopy (providers/memcopy.h), the data path's memcpy in
 * pieces: every byte lands, nothing around the destination is touched, for
 * sizes around its thresholds and every offset of destination and source
 * within a cache line.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

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
  for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++)
    for (size_t doff = 0; doff < 64; doff += 7)
      for (size_t soff = 0; soff < 64; soff += 13)
        check(sizes[k], doff, soff);
}
