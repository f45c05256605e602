/*
 * memcopy.h - a memcpy for the data path.
 *
 * glibc copies large blocks with `rep movsb`, which on some CPUs (the
 * development machine's among them) runs at a fraction of its speed when
 * destination and source differ in their offset within a 64-byte line -
 * what malloc's 16-byte offset does to every large block. Copying in pieces
 * below glibc's rep-movsb threshold, the destination aligned first, keeps
 * to its vector loop, which does not care. Where `rep movsb` does not slow
 * down (other CPUs), the pieces are the slower; memcopy_init() times both
 * ways once per process and keeps the faster (memcopy.c).
 *
 * Only such copies go in pieces: where destination and source share their
 * offset within a line, glibc's copy is used in blocks of MEMCOPY_BLOCK.
 * On AMD CPUs glibc copies with `rep movsb` only up to the size of a core's
 * L2 cache, and past it with a loop of vector loads and stores, which was
 * the slower there; Open MPI copies in blocks of 128 KiB too. Where glibc
 * uses `rep movsb` anyway the blocks cost one call every 128 KiB, and the
 * pieces would cost more than they save, so same-offset copies never go in
 * pieces.
 *
 * From MEMCOPY_STREAM bytes on, the copy goes around the caches
 * (non-temporal stores, whole 64-byte lines): such a block does not stay in
 * them anyway, and ordinary stores first read every destination line.
 */
#ifndef CHORUS_MEMCOPY_H
#define CHORUS_MEMCOPY_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MEMCOPY_PIECE 2048
#define MEMCOPY_BLOCK (128u << 10)
#define MEMCOPY_STREAM (8u << 20)

/* Whether copies between different offsets within a line go in pieces: 1
 * until memcopy_init() chose, once per process, by timing both ways. */
extern _Atomic int memcopy_pieces_pay;
/* Times both ways the first time it is called (a fraction of a millisecond);
 * thread safe. The transports call it when they open (prov_open). */
void memcopy_init(void);

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
     * different offsets */
    __asm__("" : "+r"(k));
    memcpy(d, s, k);
    d += k;
    s += k;
    n -= k;
  }
}

/* A copy between different offsets within a line: in pieces, the
 * destination aligned first, or in blocks (memcopy_pieces_pay says which;
 * memcopy_init times both through here). n is larger than a line. */
static inline void memcopy_apart(unsigned char *d, const unsigned char *s, size_t n, int pieces) {
  if (!pieces) {
    memcopy_pieces(d, s, n, MEMCOPY_BLOCK);
    return;
  }
  memcopy_head(&d, &s, &n);
  memcopy_pieces(d, s, n, MEMCOPY_PIECE);
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
  memcopy_apart(d, s, n, atomic_load_explicit(&memcopy_pieces_pay, memory_order_relaxed));
}

/* An allgather's own block, staged (engine/comm/coll.c): n bytes of s into both
 * d1 and d2, reading s once. Block by block, into d1, then from d1, still
 * in the core's L2, into d2 (d2 == s, in place: into d1 only), rather than a
 * second copy from d1 once the whole block is in, when it has left the L2.
 */
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
