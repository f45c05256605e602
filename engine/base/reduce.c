/*
 * reduce.c - reduction kernels: dst[i] = a[i] op b[i] for every dtype and op.
 *
 * Each (dtype, op) pair is an element function `T name(T x, T y)`; the
 * REDUCE_KERNELS macro stamps out four loops around it, one per aliasing case,
 * so that every pointer declared restrict really is the only path to the
 * memory it writes:
 *
 *   k3    dst, a, b all distinct      d[i] = f(a[i], b[i])
 *   ka    dst == a                    d[i] = f(d[i], b[i])
 *   kb    dst == b                    d[i] = f(a[i], d[i])
 *   kab   dst == a == b               d[i] = f(d[i], d[i])
 *
 * (a == b with dst distinct is k3: restrict only constrains memory that is
 * written.) The loops are plain and branch-free so that gcc -O3 vectorizes
 * them, including the float16/bfloat16 conversions, which are bit
 * manipulation with selects rather than branches or tables. Two refinements:
 * bfloat16 loops take the values in pairs (32-bit lanes, no packing), and on
 * x86-64 CPUs that have F16C (checked at run time) float16 uses the hardware
 * conversions; reduce_portable_only turns that off for tests.
 *
 * Semantics
 *  - Integer sum and prod wrap modulo 2^bits (computed in unsigned types).
 *  - float min/max: if either operand is NaN the result is NaN; otherwise the
 *    smaller (larger) operand, and the second operand when they compare equal
 *    (so min(+0, -0) is -0 and min(-0, +0) is +0).
 *  - float16 and bfloat16 are widened to float32, combined and rounded back to
 *    nearest-even. float32 has 24 bits of precision, at least 2p+2 for both
 *    (p = 11 and 8), so for + and * of two narrow values this double rounding
 *    gives the correctly rounded result, as if done in the narrow type.
 *  - CHORUS_AVG reduces as CHORUS_SUM; reduce_scale_avg() divides at the end.
 *  - Buffers may have any alignment: the loops read and write through the
 *    ua_* types below (alignment 1), which is defined behaviour for any
 *    address and compiles to the same vector code (x86-64 vector loads and
 *    stores do not need alignment; gcc emits the unaligned forms for these
 *    loops either way).
 */
#include "reduce.h"

#include <math.h>
#include <string.h>

/* Element types as they lie in a caller's buffer: any address. */
typedef int8_t ua_i8 __attribute__((aligned(1)));
typedef uint8_t ua_u8 __attribute__((aligned(1)));
typedef int32_t ua_i32 __attribute__((aligned(1)));
typedef int64_t ua_i64 __attribute__((aligned(1)));
typedef uint16_t ua_u16 __attribute__((aligned(1)));
typedef float ua_f32 __attribute__((aligned(1)));
typedef double ua_f64 __attribute__((aligned(1)));

/* ---- bit casts (compile to register moves; vectorizable) ---- */

static inline uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

static inline float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

/*
 * Branch-free selection. Every candidate is computed unconditionally and the
 * result picked with masks: a ternary over floating-point work is control flow
 * that gcc will not if-convert (the work might trap), and that stops the
 * vectorizer.
 */
static inline uint32_t mask32(int cond) {
  return 0u - (uint32_t)cond;
}

static inline uint32_t select32(uint32_t mask, uint32_t yes, uint32_t no) {
  return (yes & mask) | (no & ~mask);
}

/* ---- float16 <-> float32 ---- */

static inline float half_to_float(uint16_t h) {
  uint32_t x = (uint32_t)(h & 0x7fffu) << 13; /* exponent and mantissa, float-aligned */
  uint32_t e = x & 0x0f800000u;               /* the half exponent field */
  uint32_t normal = x + 0x38000000u;          /* rebias 15 -> 127 */
  uint32_t special = x + 0x70000000u;         /* exponent 31 -> 255: inf, NaN (payload kept) */
  /* subnormal: read m as 1.m * 2^-14, then subtract 2^-14 (exact) */
  uint32_t sub = f32_bits(bits_f32(x + 0x38800000u) - bits_f32(0x38800000u));
  uint32_t r = select32(mask32(e == 0), sub, normal);
  r = select32(mask32(e == 0x0f800000u), special, r);
  return bits_f32(r | ((uint32_t)(h & 0x8000u) << 16));
}

static inline uint16_t float_to_half(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  /* normal result: rebias 127 -> 15 and round the 13 dropped bits to nearest
   * even; a carry out of the mantissa bumps the exponent (up to inf) */
  uint32_t normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
  /* subnormal or zero: adding 0.5 (ulp 2^-24, the half subnormal step) lets the
   * FPU round; the low bits are then the half's bits */
  uint32_t sub = f32_bits(bits_f32(a) + 0.5f) - 0x3f000000u;
  /* NaN stays NaN (quiet, top payload bits kept); anything >= 2^16 is inf */
  uint32_t special = select32(mask32(a > 0x7f800000u), 0x7e00u | ((a >> 13) & 0x3ffu), 0x7c00u);
  uint32_t r = select32(mask32(a < 0x38800000u), sub, normal);
  r = select32(mask32(a >= 0x47800000u), special, r);
  return (uint16_t)(r | sign);
}

/* ---- bfloat16 <-> float32 ---- */

static inline float bf16_to_float(uint16_t h) {
  return bits_f32((uint32_t)h << 16);
}

/* Round to nearest even; the bfloat16 is returned in the high half (low half
 * zero). NaN stays NaN, made quiet (a payload only in the low bits would be
 * lost otherwise). */
static inline uint32_t bf16_round_hi(float f) {
  uint32_t u = f32_bits(f);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  uint32_t nan = (u | 0x00400000u) & 0xffff0000u;
  return select32(mask32((u & 0x7fffffffu) > 0x7f800000u), nan, rounded);
}

static inline uint16_t float_to_bf16(float f) {
  return (uint16_t)(bf16_round_hi(f) >> 16);
}

float reduce_half_to_float(uint16_t h) {
  return half_to_float(h);
}

uint16_t reduce_float_to_half(float f) {
  return float_to_half(f);
}

float reduce_bf16_to_float(uint16_t h) {
  return bf16_to_float(h);
}

uint16_t reduce_float_to_bf16(float f) {
  return float_to_bf16(f);
}

/* ---- element functions ---- */

/*
 * NaN-propagating min/max. `x < y ? x : y` already yields y when y is NaN (the
 * comparison is false); the second select catches a NaN in x. Both selects
 * pick between loaded values, which gcc turns into vector compares and blends.
 */
#define FLOAT_MINMAX(NAME, T)                                                                      \
  static inline T NAME##_min(T x, T y) {                                                           \
    T m = x < y ? x : y;                                                                           \
    return x != x ? x : m;                                                                         \
  }                                                                                                \
  static inline T NAME##_max(T x, T y) {                                                           \
    T m = x > y ? x : y;                                                                           \
    return x != x ? x : m;                                                                         \
  }

#define INT_MINMAX(NAME, T)                                                                        \
  static inline T NAME##_min(T x, T y) {                                                           \
    return x < y ? x : y;                                                                          \
  }                                                                                                \
  static inline T NAME##_max(T x, T y) {                                                           \
    return x > y ? x : y;                                                                          \
  }

/* Wrapping arithmetic: operate in the unsigned type U, convert back (gcc
 * defines the out-of-range unsigned -> signed conversion as modulo 2^N). */
#define INT_ARITH(NAME, T, U)                                                                      \
  static inline T NAME##_sum(T x, T y) {                                                           \
    return (T)(U)((U)x + (U)y);                                                                    \
  }                                                                                                \
  static inline T NAME##_prod(T x, T y) {                                                          \
    return (T)(U)((U)x * (U)y);                                                                    \
  }

/* uint8 and int8 products promote to int; 255 * 255 cannot overflow it. */
INT_ARITH(i8, int8_t, uint8_t)
INT_ARITH(u8, uint8_t, uint8_t)
INT_ARITH(i32, int32_t, uint32_t)
INT_ARITH(i64, int64_t, uint64_t)
INT_MINMAX(i8, int8_t)
INT_MINMAX(u8, uint8_t)
INT_MINMAX(i32, int32_t)
INT_MINMAX(i64, int64_t)

#define FLOAT_ARITH(NAME, T)                                                                       \
  static inline T NAME##_sum(T x, T y) {                                                           \
    return x + y;                                                                                  \
  }                                                                                                \
  static inline T NAME##_prod(T x, T y) {                                                          \
    return x * y;                                                                                  \
  }

FLOAT_ARITH(f32, float)
FLOAT_ARITH(f64, double)
FLOAT_MINMAX(f32, float)
FLOAT_MINMAX(f64, double)

/* Narrow floats: widen, apply the float32 function, round back. */
#define NARROW_OPS(NAME, TO_F, FROM_F)                                                             \
  static inline uint16_t NAME##_sum(uint16_t x, uint16_t y) {                                      \
    return FROM_F(f32_sum(TO_F(x), TO_F(y)));                                                      \
  }                                                                                                \
  static inline uint16_t NAME##_prod(uint16_t x, uint16_t y) {                                     \
    return FROM_F(f32_prod(TO_F(x), TO_F(y)));                                                     \
  }                                                                                                \
  static inline uint16_t NAME##_min(uint16_t x, uint16_t y) {                                      \
    return FROM_F(f32_min(TO_F(x), TO_F(y)));                                                      \
  }                                                                                                \
  static inline uint16_t NAME##_max(uint16_t x, uint16_t y) {                                      \
    return FROM_F(f32_max(TO_F(x), TO_F(y)));                                                      \
  }

NARROW_OPS(f16, half_to_float, float_to_half)
NARROW_OPS(bf16, bf16_to_float, float_to_bf16)

/* ---- loops ---- */

typedef void (*kern3_fn)(void *dst, const void *a, const void *b, size_t n);
typedef void (*kern2_fn)(void *inout, const void *other, size_t n);
typedef void (*kern1_fn)(void *inout, size_t n);

typedef struct reduce_kernel {
  kern3_fn k3;  /* dst, a, b distinct (a == b allowed) */
  kern2_fn ka;  /* dst == a */
  kern2_fn kb;  /* dst == b */
  kern1_fn kab; /* dst == a == b */
} reduce_kernel_t;

#define REDUCE_KERNELS(FN, T)                                                                      \
  static inline void FN##_l3(T *restrict d, const T *restrict x, const T *restrict y, size_t n) {  \
    for (size_t i = 0; i < n; i++)                                                                 \
      d[i] = FN(x[i], y[i]);                                                                       \
  }                                                                                                \
  static inline void FN##_la(T *restrict d, const T *restrict y, size_t n) {                       \
    for (size_t i = 0; i < n; i++)                                                                 \
      d[i] = FN(d[i], y[i]);                                                                       \
  }                                                                                                \
  static inline void FN##_lb(T *restrict d, const T *restrict x, size_t n) {                       \
    for (size_t i = 0; i < n; i++)                                                                 \
      d[i] = FN(x[i], d[i]);                                                                       \
  }                                                                                                \
  static inline void FN##_lab(T *restrict d, size_t n) {                                           \
    for (size_t i = 0; i < n; i++)                                                                 \
      d[i] = FN(d[i], d[i]);                                                                       \
  }                                                                                                \
  REDUCE_ENTRY_POINTS(FN, T)

/* On x86-64 the two hot loops are also built for AVX2 and picked at load
 * time (the loops are memory bound; wider vectors still save issue slots). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                             \
    !defined(__SANITIZE_ADDRESS__)
#define REDUCE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define REDUCE_CLONES
#endif

/* The table's entry points: untyped pointers in, the typed restrict loops. */
#define REDUCE_ENTRY_POINTS(FN, T)                                                                 \
  REDUCE_CLONES static void FN##_k3(void *dst, const void *a, const void *b, size_t n) {           \
    FN##_l3(dst, a, b, n);                                                                         \
  }                                                                                                \
  REDUCE_CLONES static void FN##_ka(void *inout, const void *b, size_t n) {                        \
    FN##_la(inout, b, n);                                                                          \
  }                                                                                                \
  static void FN##_kb(void *inout, const void *a, size_t n) {                                      \
    FN##_lb(inout, a, n);                                                                          \
  }                                                                                                \
  static void FN##_kab(void *inout, size_t n) {                                                    \
    FN##_lab(inout, n);                                                                            \
  }

#define REDUCE_KERNELS_ALL(NAME, T)                                                                \
  REDUCE_KERNELS(NAME##_sum, T)                                                                    \
  REDUCE_KERNELS(NAME##_prod, T)                                                                   \
  REDUCE_KERNELS(NAME##_min, T)                                                                    \
  REDUCE_KERNELS(NAME##_max, T)

REDUCE_KERNELS_ALL(i8, ua_i8)
REDUCE_KERNELS_ALL(u8, ua_u8)
REDUCE_KERNELS_ALL(i32, ua_i32)
REDUCE_KERNELS_ALL(i64, ua_i64)
REDUCE_KERNELS_ALL(f16, ua_u16)

/*
 * bfloat16 two at a time: a 32-bit word holds two values and each widens in
 * place (w << 16 for the low one, w & 0xffff0000 for the high one), so the
 * loop runs in 32-bit lanes without packing and unpacking. Byte order does not
 * matter: both halves get the same treatment. An odd last element goes alone.
 */
static inline uint32_t load2(const ua_u16 *p) {
  uint32_t w;
  memcpy(&w, p, sizeof(w));
  return w;
}

static inline void store2(ua_u16 *p, uint32_t w) {
  memcpy(p, &w, sizeof(w));
}

#define BF16_PAIR_KERNELS(OP)                                                                      \
  static inline uint32_t bf16x2_##OP(uint32_t x, uint32_t y) {                                     \
    uint32_t lo = bf16_round_hi(f32_##OP(bits_f32(x << 16), bits_f32(y << 16)));                   \
    uint32_t hi = bf16_round_hi(f32_##OP(bits_f32(x & 0xffff0000u), bits_f32(y & 0xffff0000u)));   \
    return (lo >> 16) | hi;                                                                        \
  }                                                                                                \
  static inline void bf16_##OP##_l3(ua_u16 *restrict d, const ua_u16 *restrict x,                  \
                                    const ua_u16 *restrict y, size_t n) {                          \
    for (size_t i = 0; i < n / 2; i++)                                                             \
      store2(d + 2 * i, bf16x2_##OP(load2(x + 2 * i), load2(y + 2 * i)));                          \
    if (n & 1)                                                                                     \
      d[n - 1] = bf16_##OP(x[n - 1], y[n - 1]);                                                    \
  }                                                                                                \
  static inline void bf16_##OP##_la(ua_u16 *restrict d, const ua_u16 *restrict y, size_t n) {      \
    for (size_t i = 0; i < n / 2; i++)                                                             \
      store2(d + 2 * i, bf16x2_##OP(load2(d + 2 * i), load2(y + 2 * i)));                          \
    if (n & 1)                                                                                     \
      d[n - 1] = bf16_##OP(d[n - 1], y[n - 1]);                                                    \
  }                                                                                                \
  static inline void bf16_##OP##_lb(ua_u16 *restrict d, const ua_u16 *restrict x, size_t n) {      \
    for (size_t i = 0; i < n / 2; i++)                                                             \
      store2(d + 2 * i, bf16x2_##OP(load2(x + 2 * i), load2(d + 2 * i)));                          \
    if (n & 1)                                                                                     \
      d[n - 1] = bf16_##OP(x[n - 1], d[n - 1]);                                                    \
  }                                                                                                \
  static inline void bf16_##OP##_lab(ua_u16 *restrict d, size_t n) {                               \
    for (size_t i = 0; i < n / 2; i++) {                                                           \
      uint32_t w = load2(d + 2 * i);                                                               \
      store2(d + 2 * i, bf16x2_##OP(w, w));                                                        \
    }                                                                                              \
    if (n & 1)                                                                                     \
      d[n - 1] = bf16_##OP(d[n - 1], d[n - 1]);                                                    \
  }                                                                                                \
  REDUCE_ENTRY_POINTS(bf16_##OP, ua_u16)

BF16_PAIR_KERNELS(sum)
BF16_PAIR_KERNELS(prod)
BF16_PAIR_KERNELS(min)
BF16_PAIR_KERNELS(max)
REDUCE_KERNELS_ALL(f32, ua_f32)
REDUCE_KERNELS_ALL(f64, ua_f64)

#define KERNEL(FN)                                                                                 \
  { FN##_k3, FN##_ka, FN##_kb, FN##_kab }
/* One row per dtype; columns sum, prod, min, max, avg (avg reduces as sum). */
#define KERNEL_ROW(NAME)                                                                           \
  {                                                                                                \
    KERNEL(NAME##_sum), KERNEL(NAME##_prod), KERNEL(NAME##_min), KERNEL(NAME##_max),               \
        KERNEL(NAME##_sum)                                                                         \
  }

static const reduce_kernel_t kernels[CHORUS_DTYPE_COUNT][CHORUS_OP_COUNT] = {
    [CHORUS_INT8] = KERNEL_ROW(i8),     [CHORUS_UINT8] = KERNEL_ROW(u8),
    [CHORUS_INT32] = KERNEL_ROW(i32),   [CHORUS_INT64] = KERNEL_ROW(i64),
    [CHORUS_FLOAT16] = KERNEL_ROW(f16), [CHORUS_BFLOAT16] = KERNEL_ROW(bf16),
    [CHORUS_FLOAT32] = KERNEL_ROW(f32), [CHORUS_FLOAT64] = KERNEL_ROW(f64),
};

/*
 * float16 on x86-64 with F16C: the hardware conversions (vcvtph2ps and
 * vcvtps2ph with round-to-nearest-even) replace the bit manipulation, eight
 * lanes at a time. Used only when the CPU reports AVX and F16C at run time.
 * The results are the same bits as the portable kernels (the conversions are
 * exact or correctly rounded in both; min/max use the same selects), except
 * possibly which payload a NaN result carries.
 */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define REDUCE_HAVE_F16C 1
#include <immintrin.h>

#define F16C_TARGET __attribute__((target("avx,f16c")))

F16C_TARGET static inline __m256 f16c_load(const ua_u16 *p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

F16C_TARGET static inline void f16c_store(ua_u16 *p, __m256 v) {
  _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

F16C_TARGET static inline __m256 f16c_vsum(__m256 x, __m256 y) {
  return _mm256_add_ps(x, y);
}

F16C_TARGET static inline __m256 f16c_vprod(__m256 x, __m256 y) {
  return _mm256_mul_ps(x, y);
}

/* vminps(x, y) is x < y ? x : y (y when either is NaN); then keep a NaN x. */
F16C_TARGET static inline __m256 f16c_vmin(__m256 x, __m256 y) {
  return _mm256_blendv_ps(_mm256_min_ps(x, y), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

F16C_TARGET static inline __m256 f16c_vmax(__m256 x, __m256 y) {
  return _mm256_blendv_ps(_mm256_max_ps(x, y), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* Eight lanes with the vector op, the last count % 8 with the portable one. */
#define F16C_KERNELS(OP)                                                                           \
  F16C_TARGET static void f16c_##OP##_k3(void *dst, const void *a, const void *b, size_t n) {      \
    ua_u16 *restrict d = dst;                                                                      \
    const ua_u16 *restrict x = a;                                                                  \
    const ua_u16 *restrict y = b;                                                                  \
    size_t i = 0;                                                                                  \
    for (; i + 8 <= n; i += 8)                                                                     \
      f16c_store(d + i, f16c_v##OP(f16c_load(x + i), f16c_load(y + i)));                           \
    f16_##OP##_l3(d + i, x + i, y + i, n - i);                                                     \
  }                                                                                                \
  F16C_TARGET static void f16c_##OP##_ka(void *inout, const void *b, size_t n) {                   \
    ua_u16 *restrict d = inout;                                                                    \
    const ua_u16 *restrict y = b;                                                                  \
    size_t i = 0;                                                                                  \
    for (; i + 8 <= n; i += 8)                                                                     \
      f16c_store(d + i, f16c_v##OP(f16c_load(d + i), f16c_load(y + i)));                           \
    f16_##OP##_la(d + i, y + i, n - i);                                                            \
  }                                                                                                \
  F16C_TARGET static void f16c_##OP##_kb(void *inout, const void *a, size_t n) {                   \
    ua_u16 *restrict d = inout;                                                                    \
    const ua_u16 *restrict x = a;                                                                  \
    size_t i = 0;                                                                                  \
    for (; i + 8 <= n; i += 8)                                                                     \
      f16c_store(d + i, f16c_v##OP(f16c_load(x + i), f16c_load(d + i)));                           \
    f16_##OP##_lb(d + i, x + i, n - i);                                                            \
  }                                                                                                \
  F16C_TARGET static void f16c_##OP##_kab(void *inout, size_t n) {                                 \
    ua_u16 *restrict d = inout;                                                                    \
    size_t i = 0;                                                                                  \
    for (; i + 8 <= n; i += 8) {                                                                   \
      __m256 v = f16c_load(d + i);                                                                 \
      f16c_store(d + i, f16c_v##OP(v, v));                                                         \
    }                                                                                              \
    f16_##OP##_lab(d + i, n - i);                                                                  \
  }

F16C_KERNELS(sum)
F16C_KERNELS(prod)
F16C_KERNELS(min)
F16C_KERNELS(max)

static const reduce_kernel_t f16c_kernels[CHORUS_OP_COUNT] = KERNEL_ROW(f16c);

static int f16c_usable(void) {
  return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
}
#endif /* F16C */

/* Tests set this to exercise the portable kernels on any CPU. */
int reduce_portable_only;

_Static_assert(CHORUS_SUM == 0 && CHORUS_PROD == 1 && CHORUS_MIN == 2 && CHORUS_MAX == 3 &&
                   CHORUS_AVG == 4 && CHORUS_OP_COUNT == 5,
               "kernel table columns follow chorus_op");

void reduce_apply(void *dst, const void *a, const void *b, size_t count, chorus_dtype dtype,
                  chorus_op op) {
  if (count == 0 || (unsigned)dtype >= CHORUS_DTYPE_COUNT || (unsigned)op >= CHORUS_OP_COUNT)
    return;
  const reduce_kernel_t *k = &kernels[dtype][op];
#ifdef REDUCE_HAVE_F16C
  if (dtype == CHORUS_FLOAT16 && !reduce_portable_only && f16c_usable())
    k = &f16c_kernels[op];
#endif
  if (dst == a && dst == b)
    k->kab(dst, count);
  else if (dst == a)
    k->ka(dst, b, count);
  else if (dst == b)
    k->kb(dst, a, count);
  else
    k->k3(dst, a, b, count);
}

/* ---- avg scaling ---- */

/*
 * Small integers divide through floating point so the loop vectorizes: with
 * |x| <= 2^p / 2 (float: int8/uint8, p = 24; double: int32, p = 53) the rounded
 * quotient x / n is off by at most |x / n| * 2^-p < 1 / n, less than the
 * distance from a non-integer x / n to the next integer, so truncating it
 * gives exactly C's x / n.
 */
static void scale_i8(ua_i8 *restrict p, size_t count, int n) {
  float fn = (float)n;
  for (size_t i = 0; i < count; i++)
    p[i] = (int8_t)((float)p[i] / fn);
}

static void scale_u8(ua_u8 *restrict p, size_t count, int n) {
  float fn = (float)n;
  for (size_t i = 0; i < count; i++)
    p[i] = (uint8_t)((float)p[i] / fn);
}

static void scale_i32(ua_i32 *restrict p, size_t count, int n) {
  double dn = (double)n;
  for (size_t i = 0; i < count; i++)
    p[i] = (int32_t)((double)p[i] / dn);
}

static void scale_i64(ua_i64 *restrict p, size_t count, int n) {
  int64_t d = n;
  for (size_t i = 0; i < count; i++)
    p[i] /= d;
}

/*
 * float16/bfloat16: x / n in double (n may have up to 31 bits, so float32 is
 * not enough for a correct result), narrowed to float32 rounding to odd, then
 * to the narrow type rounding to nearest even. Round-to-odd keeps the sticky
 * information, so with float32 at least 2 bits finer than the narrow type
 * everywhere (subnormals included) the two roundings give the correctly
 * rounded quotient.
 */
static inline float f64_to_f32_odd(double d) {
  float f = (float)d;
  uint32_t u = f32_bits(f);
  if ((double)f != d && d == d && (u & 1u) == 0) /* inexact and even: take the odd neighbour */
    u = fabs((double)f) > fabs(d) ? u - 1 : u + 1;
  return bits_f32(u);
}

static void scale_f16(ua_u16 *restrict p, size_t count, int n) {
  double dn = (double)n;
  for (size_t i = 0; i < count; i++)
    p[i] = float_to_half(f64_to_f32_odd((double)half_to_float(p[i]) / dn));
}

static void scale_bf16(ua_u16 *restrict p, size_t count, int n) {
  double dn = (double)n;
  for (size_t i = 0; i < count; i++)
    p[i] = float_to_bf16(f64_to_f32_odd((double)bf16_to_float(p[i]) / dn));
}

static void scale_f32(ua_f32 *restrict p, size_t count, int n) {
  float fn = (float)n;
  for (size_t i = 0; i < count; i++)
    p[i] /= fn;
}

static void scale_f64(ua_f64 *restrict p, size_t count, int n) {
  double dn = (double)n;
  for (size_t i = 0; i < count; i++)
    p[i] /= dn;
}

/* n <= 1 leaves the buffer as it is (there is nothing to divide by). */
void reduce_scale_avg(void *buf, size_t count, chorus_dtype dtype, int n) {
  if (n <= 1 || count == 0)
    return;
  switch (dtype) {
  case CHORUS_INT8:
    scale_i8(buf, count, n);
    break;
  case CHORUS_UINT8:
    scale_u8(buf, count, n);
    break;
  case CHORUS_INT32:
    scale_i32(buf, count, n);
    break;
  case CHORUS_INT64:
    scale_i64(buf, count, n);
    break;
  case CHORUS_FLOAT16:
    scale_f16(buf, count, n);
    break;
  case CHORUS_BFLOAT16:
    scale_bf16(buf, count, n);
    break;
  case CHORUS_FLOAT32:
    scale_f32(buf, count, n);
    break;
  case CHORUS_FLOAT64:
    scale_f64(buf, count, n);
    break;
  default:
    break;
  }
}
