/*
 * memcopy.h - a memcpy for the data path.
 *
 * glibc copies large blocks with `rep movsb`, which on this machine's CPU
 * runs at a tenth of its speed when destination and source differ in their
 * offset within a 64-byte line: 256 KiB from a page-aligned buffer into one
 * 16 bytes past a page boundary (what malloc and calloc return for large
 * blocks) took 146 us instead of 12. Copying in pieces below glibc's
 * rep-movsb threshold, the destination aligned first, keeps to its vector
 * loop, which does not care: 22 us misaligned, 9 us aligned. A 2-rank
 * 1 MiB allreduce on such buffers went from 400-700 us to ~100 us.
 *
 * Only such copies go in pieces: where destination and source share their
 * offset within a line, glibc's copy is used in blocks of MEMCOPY_BLOCK.
 * On AMD CPUs glibc copies with `rep movsb` only up to the size of a core's
 * L2 cache, and past it with a loop of vector loads and stores, which on
 * the machine of 2026-12-03 (an EPYC of family 26, 1 MiB L2 a core,
 * glibc's avx512 erms copy) was the slower: page-aligned, the same block
 * copied again and again, 1 MiB took 20.5 us whole against 17.8 in 128 KiB
 * blocks (17.9 with one `rep movsb`), 16 MiB 482 against 403 (398), 64 MiB
 * 2952 against 2454 (2295). In a 2-rank 2 MiB allgather over shm, whose own
 * 1 MiB block is such a copy, `perf` put 22% of the time in that copy
 * against 12% for Open MPI's, which copies in blocks of 128 KiB too (opal's
 * datatype engine); blocks of 64 KiB to 512 KiB all took 2-5 us off each
 * call (a scratch program alternating calls copied each way in blocks of
 * 50 in one process, 6 launches: 80.0-93.7 against 78.3-90.4 us). Where
 * glibc uses `rep movsb` anyway (Intel, blocks below the L2) the blocks
 * cost one call every 128 KiB. The 2 KiB pieces would cost there (same
 * offset): on the machine of 2026-12-01 (an EPYC with AVX-512, glibc's
 * avx512 erms copy), 256 KiB between page-aligned buffers took 15.5 us in
 * pieces against 10.5 (4.7 against 2.4 with both in cache; and 15-16
 * against 11-12 at other offsets too, where that CPU shows no slow case),
 * and the 2-rank 32 KiB broadcast over shm, whose bounce slots are copied
 * into and out of, 6.6-7.0 us a call against 2.9-3.3 (Open MPI 5.2-6.1).
 *
 * From MEMCOPY_STREAM bytes on, the copy goes around the caches
 * (non-temporal stores, whole 64-byte lines): such a block does not stay in
 * them anyway, and ordinary stores first read every destination line. On
 * this machine (32 MiB L3 shared by both vCPUs) a 32 MiB copy took 10.5 ms
 * in 2 KiB pieces, 6.5 ms with glibc's memcpy and 4.2-5.4 ms streamed; 8 MiB
 * 0.8-1.4 ms against ~0.5. Below 8 MiB the pieces were as fast or faster
 * (4 MiB: 24 GB/s against 21).
 */
#ifndef CHORUS_MEMCOPY_H
#define CHORUS_MEMCOPY_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MEMCOPY_PIECE 2048
#define MEMCOPY_BLOCK (128u << 10)
#define MEMCOPY_STREAM (8u << 20)

/* Copies the bytes before the destination's next 64-byte boundary and moves
 * past them (n is larger than a line). */
static inline void memcopy_head(unsigned char **d, const unsigned char **s, size_t *n) {
  size_t head = (64 - ((uintptr_t)*d & 63)) & 63;

  memcpy(*d, *s, head);
  *d += head;
  *s += head;
  *n -= head;
}

/* Copies n bytes with glibc's memcpy, `piece` bytes a call. */
static inline void memcopy_pieces(unsigned char *d, const unsigned char *s, size_t n,
                                  size_t piece) {
  while (n) {
    size_t k = n < piece ? n : piece;
    /* hides k's bound: knowing it (k <= MEMCOPY_PIECE, say), gcc inlines the copy as
     * `rep movsq` instead of calling glibc, which has the same trouble as `rep movsb` at
     * different offsets (the copy in ofi_post_send ran at ~13 GB/s) */
    __asm__("" : "+r"(k));
    memcpy(d, s, k);
    d += k;
    s += k;
    n -= k;
  }
}

#if defined(__SSE2__)
#include <emmintrin.h>

static inline void memcopy_stream(unsigned char *d, const unsigned char *s, size_t n) {
  memcopy_head(&d, &s, &n);
  for (; n >= 64; n -= 64, d += 64, s += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)(const void *)s);
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
    __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
    _mm_stream_si128((__m128i *)(void *)d, a);
    _mm_stream_si128((__m128i *)(void *)(d + 16), b);
    _mm_stream_si128((__m128i *)(void *)(d + 32), c);
    _mm_stream_si128((__m128i *)(void *)(d + 48), e);
  }
  _mm_sfence(); /* the stores are visible before whatever says the copy is done */
  memcpy(d, s, n);
}
#endif

static inline void memcopy(void *dst, const void *src, size_t n) {
  unsigned char *d = dst;
  const unsigned char *s = src;

  if (n <= 4 * MEMCOPY_PIECE) {
    memcpy(d, s, n);
    return;
  }
#if defined(__SSE2__)
  if (n >= MEMCOPY_STREAM) {
    memcopy_stream(d, s, n);
    return;
  }
#endif
  if (!(((uintptr_t)d ^ (uintptr_t)s) & 63)) {
    memcopy_pieces(d, s, n, MEMCOPY_BLOCK); /* blocks glibc copies with `rep movsb` */
    return;
  }
  memcopy_head(&d, &s, &n);
  memcopy_pieces(d, s, n, MEMCOPY_PIECE);
}

/* An allgather's own block, staged (engine/coll.c): n bytes of s into both
 * d1 and d2, reading s once. Block by block, into d1, then from d1, still
 * in the core's L2, into d2 (d2 == s, in place: into d1 only). Against a
 * copy into d1 and a second from d1 once the whole block was in: 2-rank
 * allgathers over shm, 7 interleaved rounds of 300 calls, medians,
 * 2026-12-04, 2 MiB 88.4 against 109.2 us (Open MPI 103.0); 5 rounds, 8
 * ranks on 2 cores 2 MiB 413 against 502, 2 ranks 64 MiB 6.2 against 6.8 ms. */
#define MEMCOPY_TWICE_BLOCK (64u << 10)

static inline void memcopy_twice(void *d1, void *d2, const void *s, size_t n) {
  unsigned char *a = d1, *b = d2;
  const unsigned char *src = s;

  if (d2 == s) {
    memcopy(d1, s, n);
    return;
  }
  for (size_t o = 0; o < n; o += MEMCOPY_TWICE_BLOCK) {
    size_t k = n - o < MEMCOPY_TWICE_BLOCK ? n - o : MEMCOPY_TWICE_BLOCK;
    memcopy(a + o, src + o, k);
    memcopy(b + o, a + o, k);
  }
}

#endif
