/*
 * crc32c.c - CRC-32C (crc32c.h).
 */
#include "crc32c.h"

#include <pthread.h>
#include <string.h>

static uint32_t table[8][256];

static void table_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++)
      c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int t = 1; t < 8; t++)
      table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

/* slicing by 8 */
static uint32_t crc_soft(uint32_t c, const unsigned char *p, size_t n) {
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    v ^= c;
    c = table[7][v & 0xff] ^ table[6][(v >> 8) & 0xff] ^ table[5][(v >> 16) & 0xff] ^
        table[4][(v >> 24) & 0xff] ^ table[3][(v >> 32) & 0xff] ^ table[2][(v >> 40) & 0xff] ^
        table[1][(v >> 48) & 0xff] ^ table[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n--)
    c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
  return c;
}

#if defined(__x86_64__)
#include <nmmintrin.h>

/* c shifted over `bytes` zero bytes (GF(2) polynomial multiply by x^(8n)) */
static uint32_t crc_shift(uint32_t c, size_t bytes) {
  /* operator matrix by squaring: small and only used per block */
  uint32_t odd[32], even[32], row = 1;
  odd[0] = 0x82f63b78u;
  for (int i = 1; i < 32; i++, row <<= 1)
    odd[i] = row;
    /* even = odd^2, odd = even^2 ... (zlib's crc32_combine scheme) */
#define GF2_TIMES(mat, vec, out)                                                                   \
  do {                                                                                             \
    uint32_t s_ = 0, v_ = (vec);                                                                   \
    for (int j_ = 0; v_; v_ >>= 1, j_++)                                                           \
      if (v_ & 1)                                                                                  \
        s_ ^= (mat)[j_];                                                                           \
    (out) = s_;                                                                                    \
  } while (0)
#define GF2_SQUARE(sq, mat)                                                                        \
  for (int n_ = 0; n_ < 32; n_++)                                                                  \
  GF2_TIMES(mat, (mat)[n_], (sq)[n_])
  GF2_SQUARE(even, odd); /* 2 zero bits */
  GF2_SQUARE(odd, even); /* 4 zero bits */
  do {
    GF2_SQUARE(even, odd); /* 8 zero bits first: one byte */
    if (bytes & 1)
      GF2_TIMES(even, c, c);
    bytes >>= 1;
    if (!bytes)
      break;
    GF2_SQUARE(odd, even);
    if (bytes & 1)
      GF2_TIMES(odd, c, c);
    bytes >>= 1;
  } while (bytes);
  return c;
#undef GF2_SQUARE
#undef GF2_TIMES
}

#define HW_BLK 8192
static uint32_t shift_blk[32]; /* the operator "append HW_BLK zero bytes" */

static uint32_t times(const uint32_t *mat, uint32_t v) {
  uint32_t s = 0;
  for (int j = 0; v; v >>= 1, j++)
    if (v & 1)
      s ^= mat[j];
  return s;
}

__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const unsigned char *p,
                                                         size_t n) {
  /* three independent streams hide the instruction's latency */
  const size_t blk = HW_BLK;
  while (n >= 3 * blk) {
    uint64_t c0 = c, c1 = 0, c2 = 0;
    for (size_t i = 0; i < blk; i += 8) {
      uint64_t a, b, d;
      memcpy(&a, p + i, 8);
      memcpy(&b, p + blk + i, 8);
      memcpy(&d, p + 2 * blk + i, 8);
      c0 = _mm_crc32_u64(c0, a);
      c1 = _mm_crc32_u64(c1, b);
      c2 = _mm_crc32_u64(c2, d);
    }
    c = times(shift_blk, (uint32_t)c0) ^ (uint32_t)c1;
    c = times(shift_blk, c) ^ (uint32_t)c2;
    p += 3 * blk;
    n -= 3 * blk;
  }
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    n -= 8;
  }
  c = (uint32_t)c64;
  while (n--)
    c = _mm_crc32_u8(c, *p++);
  return c;
}
#endif

static int mode; /* 0 table, 1 hardware */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void) {
  table_init();
#if defined(__x86_64__)
  __builtin_cpu_init();
  mode = __builtin_cpu_supports("sse4.2") ? 1 : 0;
  for (int j = 0; j < 32; j++)
    shift_blk[j] = crc_shift(1u << j, HW_BLK);
#endif
}

uint32_t crc32c(const void *buf, size_t len) {
  pthread_once(&once, init);
#if defined(__x86_64__)
  if (mode == 1)
    return ~crc_hw(~0u, buf, len);
#endif
  return ~crc_soft(~0u, buf, len);
}
