/*
 * test_reduce.c - the reduction kernels and the float16/bfloat16 conversions
 * against slow, obviously-correct references.
 *
 * References: narrow floats are decoded with ldexp() and encoded by binary
 * search over the ordered bit patterns with an explicit nearest/ties-to-even
 * choice; arithmetic is done in double (exact or innocuously double-rounded
 * for every case here) or in 128-bit integers, then wrapped.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "reduce.h"

/* reduce.c: when set, float16 uses the portable kernels even where F16C exists. */
extern int reduce_portable_only;

/* ---- helpers ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return rng_state = x;
}

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

static float bitsf(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

static uint64_t dbits(double f) {
  uint64_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

/* A narrow float format: 1 sign bit, `ebits` exponent bits, `mbits` mantissa bits. */
typedef struct fmt {
  int ebits, mbits;
} fmt_t;

static const fmt_t F16 = {5, 10};
static const fmt_t BF16 = {8, 7};

static int fmt_bias(fmt_t f) {
  return (1 << (f.ebits - 1)) - 1;
}

static uint16_t fmt_inf(fmt_t f) {
  return (uint16_t)(((1u << f.ebits) - 1) << f.mbits);
}

static int fmt_isnan(fmt_t f, uint16_t h) {
  return (h & 0x7fffu) > fmt_inf(f);
}

/* Value of a non-negative pattern; the inf pattern counts as the next binade's
 * first value (what overflow rounds against). */
static double fmt_mag(fmt_t f, uint16_t p) {
  int e = p >> f.mbits;
  int m = p & ((1 << f.mbits) - 1);
  int bias = fmt_bias(f);
  if (e == 0)
    return ldexp(m, 1 - bias - f.mbits);
  return ldexp((1 << f.mbits) + m, e - bias - f.mbits);
}

static double ref_to_double(fmt_t f, uint16_t h) {
  if (fmt_isnan(f, h))
    return NAN;
  double v = (h & 0x7fffu) == fmt_inf(f) ? INFINITY : fmt_mag(f, h & 0x7fffu);
  return (h & 0x8000u) ? -v : v;
}

/*
 * The pattern nearest to v / n (ties to the even pattern); NaN gives the
 * canonical quiet NaN. Every comparison is exact: a pattern's value (or a
 * midpoint) has at most 12 significant bits and n at most 31, so their product
 * fits a double.
 */
static uint16_t ref_from_ratio(fmt_t f, double v, double n) {
  if (isnan(v))
    return (uint16_t)(fmt_inf(f) | (1u << (f.mbits - 1)));
  uint16_t sign = signbit(v) ? 0x8000u : 0;
  double a = fabs(v);
  uint16_t inf = fmt_inf(f);
  uint16_t p;
  if (a >= fmt_mag(f, inf) * n) {
    p = inf;
  } else {
    uint16_t lo = 0, hi = inf; /* invariant: mag(lo) * n <= a < mag(hi) * n */
    while (hi - lo > 1) {
      uint16_t mid = (uint16_t)((lo + hi) / 2);
      if (fmt_mag(f, mid) * n <= a)
        lo = mid;
      else
        hi = mid;
    }
    double mid = (fmt_mag(f, lo) + fmt_mag(f, hi)) / 2 * n;
    if (a < mid)
      p = lo;
    else if (a > mid)
      p = hi;
    else
      p = (lo & 1) ? hi : lo;
  }
  return (uint16_t)(sign | p);
}

/* Rounding of v itself (n = 1: every comparison is exact). */
static uint16_t ref_from_double(fmt_t f, double v) {
  return ref_from_ratio(f, v, 1.0);
}

/* ---- conversions ---- */

static void check_roundtrip(fmt_t f, float (*to_f)(uint16_t), uint16_t (*from_f)(float),
                            const char *name) {
  uint32_t mshift = 23 - (uint32_t)f.mbits;
  uint16_t quiet = (uint16_t)(1u << (f.mbits - 1));
  for (uint32_t i = 0; i < 65536; i++) {
    uint16_t h = (uint16_t)i;
    float x = to_f(h);
    uint16_t back = from_f(x);
    if (fmt_isnan(f, h)) {
      cr_assert(isnan(x), "%s %#06x: not NaN as float", name, h);
      cr_assert_eq(fbits(x) >> 31, (uint32_t)(h >> 15), "%s %#06x: NaN sign", name, h);
      cr_assert_eq((fbits(x) & 0x7fffffu) >> mshift, (uint32_t)(h & (quiet * 2 - 1)),
                   "%s %#06x: NaN payload", name, h);
      cr_assert(fmt_isnan(f, back), "%s %#06x: NaN lost on the way back (%#06x)", name, h, back);
      cr_assert_eq(back, h | quiet, "%s %#06x: NaN back as %#06x, want it quiet", name, h, back);
    } else {
      double want = ref_to_double(f, h);
      cr_assert_eq(fbits(x), fbits((float)want), "%s %#06x: %a, want %a", name, h, (double)x, want);
      cr_assert_eq(back, h, "%s %#06x: round trip gave %#06x", name, h, back);
    }
  }
}

Test(convert, half_roundtrip_exhaustive) {
  check_roundtrip(F16, reduce_half_to_float, reduce_float_to_half, "half");
}

Test(convert, bf16_roundtrip_exhaustive) {
  check_roundtrip(BF16, reduce_bf16_to_float, reduce_float_to_bf16, "bf16");
}

/* Every midpoint between neighbours (ties go to the even pattern), and one
 * float either side of it, for both signs, including max -> inf. */
static void check_ties(fmt_t f, uint16_t (*from_f)(float), const char *name) {
  uint16_t inf = fmt_inf(f);
  for (uint16_t p = 0; p < inf; p++) {
    uint16_t q = (uint16_t)(p + 1);
    double mid = (fmt_mag(f, p) + fmt_mag(f, q)) / 2;
    float m = (float)mid;
    cr_assert_eq((double)m, mid, "%s: midpoint of %#06x not exact", name, p);
    uint16_t even = (p & 1) ? q : p;
    for (int s = 0; s < 2; s++) {
      uint16_t sign = s ? 0x8000u : 0;
      float sm = s ? -m : m;
      cr_assert_eq(from_f(sm), sign | even, "%s: tie %a -> %#06x, want %#06x", name, (double)sm,
                   from_f(sm), sign | even);
      float below = nextafterf(sm, 0.0f), above = nextafterf(sm, s ? -INFINITY : INFINITY);
      cr_assert_eq(from_f(below), sign | p, "%s: just below %a -> %#06x, want %#06x", name,
                   (double)sm, from_f(below), sign | p);
      cr_assert_eq(from_f(above), sign | q, "%s: just above %a -> %#06x, want %#06x", name,
                   (double)sm, from_f(above), sign | q);
    }
  }
}

Test(convert, half_ties_to_even) {
  check_ties(F16, reduce_float_to_half, "half");
}

Test(convert, bf16_ties_to_even) {
  check_ties(BF16, reduce_float_to_bf16, "bf16");
}

Test(convert, half_known_values) {
  cr_assert_eq(reduce_float_to_half(1.0f), 0x3c00);
  cr_assert_eq(reduce_float_to_half(-2.0f), 0xc000);
  cr_assert_eq(reduce_float_to_half(65504.0f), 0x7bff);
  cr_assert_eq(reduce_float_to_half(65519.996f), 0x7bff);
  cr_assert_eq(reduce_float_to_half(65520.0f), 0x7c00); /* tie between max and inf: even */
  cr_assert_eq(reduce_float_to_half(1e9f), 0x7c00);
  cr_assert_eq(reduce_float_to_half(-INFINITY), 0xfc00);
  cr_assert_eq(reduce_float_to_half(0x1p-24f), 0x0001); /* smallest subnormal */
  cr_assert_eq(reduce_float_to_half(0x1p-25f), 0x0000); /* tie with 0: even */
  cr_assert_eq(reduce_float_to_half(0x1.8p-24f), 0x0002);
  cr_assert_eq(reduce_float_to_half(-0x1p-26f), 0x8000);
  cr_assert_eq(reduce_float_to_half(0x1p-14f), 0x0400);        /* smallest normal */
  cr_assert_eq(reduce_float_to_half(0x1.ff8p-15f), 0x03ff);    /* largest subnormal */
  cr_assert_eq(reduce_float_to_half(0x1.ffcp-15f), 0x0400);    /* tie: even, up to normal */
  cr_assert_eq(reduce_float_to_half(1.0f + 0x1p-11f), 0x3c00); /* tie, even down */
  cr_assert_eq(reduce_float_to_half(1.0f + 0x3p-11f), 0x3c02); /* tie, even up */
  cr_assert_eq(reduce_float_to_half(0x1p-149f), 0x0000);       /* float subnormal */
  cr_assert(fmt_isnan(F16, reduce_float_to_half(NAN)));
  cr_assert(fmt_isnan(F16, reduce_float_to_half(bitsf(0x7f800001u)))); /* low payload only */
  cr_assert(fmt_isnan(F16, reduce_float_to_half(bitsf(0xffc00000u))));
  cr_assert_eq(reduce_half_to_float(0x0001), 0x1p-24f);
  cr_assert_eq(reduce_half_to_float(0x03ff), 0x1.ff8p-15f);
  cr_assert_eq(fbits(reduce_half_to_float(0x8000)), 0x80000000u);
  cr_assert(isinf(reduce_half_to_float(0x7c00)));
}

Test(convert, bf16_known_values) {
  cr_assert_eq(reduce_float_to_bf16(1.0f), 0x3f80);
  cr_assert_eq(reduce_float_to_bf16(bitsf(0x3f808000u)), 0x3f80); /* tie, even down */
  cr_assert_eq(reduce_float_to_bf16(bitsf(0x3f818000u)), 0x3f82); /* tie, even up */
  cr_assert_eq(reduce_float_to_bf16(bitsf(0x3f808001u)), 0x3f81);
  cr_assert_eq(reduce_float_to_bf16(bitsf(0x7f7fffffu)), 0x7f80); /* FLT_MAX rounds to inf */
  cr_assert_eq(reduce_float_to_bf16(bitsf(0x7f7f7fffu)), 0x7f7f);
  cr_assert_eq(reduce_float_to_bf16(bitsf(0x00008000u)), 0x0000); /* subnormal tie, even */
  cr_assert_eq(reduce_float_to_bf16(bitsf(0x80018000u)), 0x8002);
  cr_assert(fmt_isnan(BF16, reduce_float_to_bf16(bitsf(0x7f800001u)))); /* low payload only */
  cr_assert(fmt_isnan(BF16, reduce_float_to_bf16(bitsf(0xffffffffu))));
  cr_assert_eq(reduce_float_to_bf16(-INFINITY), 0xff80);
}

/* A wide sample of float bit patterns against the reference rounding. */
static void check_sweep(fmt_t f, uint16_t (*from_f)(float), const char *name) {
  for (uint64_t u = 0; u < (1ull << 32); u += 4093) {
    float x = bitsf((uint32_t)u);
    uint16_t got = from_f(x);
    if (isnan(x)) {
      cr_assert(fmt_isnan(f, got), "%s: NaN %#010x -> %#06x", name, (uint32_t)u, got);
      continue;
    }
    uint16_t want = ref_from_double(f, (double)x);
    cr_assert_eq(got, want, "%s: %a (%#010x) -> %#06x, want %#06x", name, (double)x, (uint32_t)u,
                 got, want);
  }
}

Test(convert, half_float_sweep) {
  check_sweep(F16, reduce_float_to_half, "half");
}

Test(convert, bf16_float_sweep) {
  check_sweep(BF16, reduce_float_to_bf16, "bf16");
}

/* ---- kernels against the reference ---- */

static size_t esize(chorus_dtype dt) {
  static const size_t sz[CHORUS_DTYPE_COUNT] = {1, 1, 4, 8, 2, 2, 4, 8};
  return sz[dt];
}

/* Random element: full-range bits for integers (exercises wraparound); for
 * floats mostly ordinary values with NaN, infinities, signed zeros,
 * subnormals and huge values mixed in. */
static void random_element(chorus_dtype dt, void *out) {
  uint64_t r = rng();
  unsigned kind = (unsigned)(r >> 56) % 32;
  double v = ((double)(int64_t)(r & 0xffffffffu) - 2147483648.0) / 16777216.0; /* +-128 */
  switch (dt) {
  case CHORUS_INT8:
  case CHORUS_UINT8:
  case CHORUS_INT32:
  case CHORUS_INT64:
    memcpy(out, &r, esize(dt));
    if (kind == 0) /* extremes */
      memset(out, (r >> 8) & 1 ? 0xff : 0x00, esize(dt));
    return;
  case CHORUS_FLOAT16:
  case CHORUS_BFLOAT16: {
    fmt_t f = dt == CHORUS_FLOAT16 ? F16 : BF16;
    uint16_t h = kind < 8 ? (uint16_t)r : ref_from_double(f, v); /* any pattern, or ordinary */
    memcpy(out, &h, 2);
    return;
  }
  case CHORUS_FLOAT32:
  case CHORUS_FLOAT64: {
    double specials[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0, -0.0, 1e-40, -1e-310, 3e38, -1e308};
    if (kind < 6)
      v = specials[(r >> 8) % (sizeof(specials) / sizeof(specials[0]))];
    if (dt == CHORUS_FLOAT32) {
      float x = (float)v;
      if (kind == 6)
        x = bitsf((uint32_t)r); /* any pattern */
      memcpy(out, &x, 4);
    } else {
      memcpy(out, &v, 8);
    }
    return;
  }
  default:
    cr_assert_fail("bad dtype");
  }
}

/* min/max on doubles with the documented rule: NaN if either is NaN, else the
 * smaller (larger), the second operand when they compare equal. */
static double ref_minmax(chorus_op op, double x, double y) {
  if (isnan(x) || isnan(y))
    return NAN;
  if (op == CHORUS_MIN)
    return x < y ? x : y;
  return x > y ? x : y;
}

static double ref_fop(chorus_op op, double x, double y) {
  switch (op) {
  case CHORUS_SUM:
  case CHORUS_AVG:
    return x + y;
  case CHORUS_PROD:
    return x * y;
  default:
    return ref_minmax(op, x, y);
  }
}

static __int128 ref_iop(chorus_op op, __int128 x, __int128 y) {
  switch (op) {
  case CHORUS_SUM:
  case CHORUS_AVG:
    return x + y;
  case CHORUS_PROD:
    return x * y;
  case CHORUS_MIN:
    return x < y ? x : y;
  default:
    return x > y ? x : y;
  }
}

/* out = x op y for one element. Floats of 32 bits and less are computed in
 * double, then rounded once: correct, as double has more than 2p+2 bits. */
static void ref_element(chorus_dtype dt, chorus_op op, const void *x, const void *y, void *out) {
  switch (dt) {
  case CHORUS_INT8: {
    int8_t a, b;
    memcpy(&a, x, 1);
    memcpy(&b, y, 1);
    uint8_t r = (uint8_t)ref_iop(op, a, b);
    memcpy(out, &r, 1);
    return;
  }
  case CHORUS_UINT8: {
    uint8_t a, b;
    memcpy(&a, x, 1);
    memcpy(&b, y, 1);
    uint8_t r = (uint8_t)ref_iop(op, a, b);
    memcpy(out, &r, 1);
    return;
  }
  case CHORUS_INT32: {
    int32_t a, b;
    memcpy(&a, x, 4);
    memcpy(&b, y, 4);
    uint32_t r = (uint32_t)ref_iop(op, a, b);
    memcpy(out, &r, 4);
    return;
  }
  case CHORUS_INT64: {
    int64_t a, b;
    memcpy(&a, x, 8);
    memcpy(&b, y, 8);
    uint64_t r = (uint64_t)(unsigned __int128)ref_iop(op, a, b);
    memcpy(out, &r, 8);
    return;
  }
  case CHORUS_FLOAT16:
  case CHORUS_BFLOAT16: {
    fmt_t f = dt == CHORUS_FLOAT16 ? F16 : BF16;
    uint16_t a, b;
    memcpy(&a, x, 2);
    memcpy(&b, y, 2);
    uint16_t r = ref_from_double(f, ref_fop(op, ref_to_double(f, a), ref_to_double(f, b)));
    memcpy(out, &r, 2);
    return;
  }
  case CHORUS_FLOAT32: {
    float a, b;
    memcpy(&a, x, 4);
    memcpy(&b, y, 4);
    float r = (float)ref_fop(op, a, b);
    memcpy(out, &r, 4);
    return;
  }
  case CHORUS_FLOAT64: {
    double a, b, r;
    memcpy(&a, x, 8);
    memcpy(&b, y, 8);
    if (op == CHORUS_SUM || op == CHORUS_AVG)
      r = a + b;
    else if (op == CHORUS_PROD)
      r = a * b;
    else
      r = ref_minmax(op, a, b);
    memcpy(out, &r, 8);
    return;
  }
  default:
    cr_assert_fail("bad dtype");
  }
}

/* Equal bits, or both NaN for the float types (NaN payloads are not specified). */
static int element_matches(chorus_dtype dt, const void *got, const void *want) {
  switch (dt) {
  case CHORUS_FLOAT16:
  case CHORUS_BFLOAT16: {
    fmt_t f = dt == CHORUS_FLOAT16 ? F16 : BF16;
    uint16_t g, w;
    memcpy(&g, got, 2);
    memcpy(&w, want, 2);
    return g == w || (fmt_isnan(f, g) && fmt_isnan(f, w));
  }
  case CHORUS_FLOAT32: {
    float g, w;
    memcpy(&g, got, 4);
    memcpy(&w, want, 4);
    return fbits(g) == fbits(w) || (isnan(g) && isnan(w));
  }
  case CHORUS_FLOAT64: {
    double g, w;
    memcpy(&g, got, 8);
    memcpy(&w, want, 8);
    return dbits(g) == dbits(w) || (isnan(g) && isnan(w));
  }
  default:
    return memcmp(got, want, esize(dt)) == 0;
  }
}

enum alias { ALIAS_NONE, ALIAS_DST_A, ALIAS_DST_B, ALIAS_ALL, ALIAS_A_B, ALIAS_COUNT };

static const char *alias_name[ALIAS_COUNT] = {"none", "dst==a", "dst==b", "dst==a==b", "a==b"};

/* One reduce_apply call, checked element by element, with a guard element on
 * each side of dst that must stay untouched. */
static void check_kernel(chorus_dtype dt, chorus_op op, size_t count, enum alias al,
                         size_t offset) {
  size_t es = esize(dt), total = count + offset + 2;
  unsigned char *a = malloc(total * es), *b = malloc(total * es), *d = malloc(total * es);
  unsigned char *want = malloc((count + 1) * es);
  unsigned char *in_a = malloc((count + 1) * es), *in_b = malloc((count + 1) * es);
  cr_assert(a && b && d && want && in_a && in_b);
  for (size_t i = 0; i < total; i++) {
    random_element(dt, a + i * es);
    random_element(dt, b + i * es);
  }
  memset(d, 0xa5, total * es);
  unsigned char *pa = a + (offset + 1) * es, *pb = b + (offset + 1) * es;
  unsigned char *pd = d + (offset + 1) * es;
  switch (al) {
  case ALIAS_DST_A:
    pd = pa;
    break;
  case ALIAS_DST_B:
    pd = pb;
    break;
  case ALIAS_ALL:
    pd = pb = pa;
    break;
  case ALIAS_A_B:
    pb = pa;
    break;
  default:
    break;
  }
  for (size_t i = 0; i < count; i++)
    ref_element(dt, op, pa + i * es, pb + i * es, want + i * es);
  memcpy(in_a, pa, count * es);
  memcpy(in_b, pb, count * es);
  unsigned char guard_lo[8], guard_hi[8];
  memcpy(guard_lo, pd - es, es);
  memcpy(guard_hi, pd + count * es, es);

  reduce_apply(pd, pa, pb, count, dt, op);

  for (size_t i = 0; i < count; i++) {
    if (!element_matches(dt, pd + i * es, want + i * es)) {
      uint64_t g = 0, w = 0, x = 0, y = 0;
      memcpy(&g, pd + i * es, es);
      memcpy(&w, want + i * es, es);
      memcpy(&x, in_a + i * es, es);
      memcpy(&y, in_b + i * es, es);
      cr_assert_fail("%s %s count %zu %s offset %zu: element %zu: %#llx op %#llx is %#llx, "
                     "want %#llx",
                     chorus_dtype_name(dt), chorus_op_name(op), count, alias_name[al], offset, i,
                     (unsigned long long)x, (unsigned long long)y, (unsigned long long)g,
                     (unsigned long long)w);
    }
  }
  cr_assert(memcmp(guard_lo, pd - es, es) == 0, "%s %s: wrote before dst", chorus_dtype_name(dt),
            chorus_op_name(op));
  cr_assert(memcmp(guard_hi, pd + count * es, es) == 0, "%s %s count %zu: wrote past dst",
            chorus_dtype_name(dt), chorus_op_name(op), count);
  free(a);
  free(b);
  free(d);
  free(want);
  free(in_a);
  free(in_b);
}

typedef struct kparam {
  chorus_dtype dtype;
  chorus_op op;
} kparam_t;

ParameterizedTestParameters(kernels, matrix) {
  static kparam_t params[CHORUS_DTYPE_COUNT * CHORUS_OP_COUNT];
  size_t n = 0;
  for (int dt = 0; dt < CHORUS_DTYPE_COUNT; dt++)
    for (int op = 0; op < CHORUS_OP_COUNT; op++)
      params[n++] = (kparam_t){(chorus_dtype)dt, (chorus_op)op};
  return cr_make_param_array(kparam_t, params, n);
}

ParameterizedTest(kparam_t *p, kernels, matrix) {
  static const size_t counts[] = {0,  1,  2,  3,  5,  7,  8,  9,    13,
                                  15, 16, 17, 31, 33, 64, 97, 1021, 4099};
  for (int portable = 0; portable < 2; portable++) {
    reduce_portable_only = portable;
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
      for (int al = 0; al < ALIAS_COUNT; al++)
        for (size_t off = 0; off < 2; off++)
          check_kernel(p->dtype, p->op, counts[c], (enum alias)al, off);
  }
  reduce_portable_only = 0;
}

/* ---- any alignment ---- */

/* One reduce_apply over buffers at byte offsets (od, oa, ob) from an aligned
 * base (as a user's slice of a byte buffer would be), against the same call
 * on aligned copies: the same bits, nothing written outside dst. In the
 * sanitizer build a misaligned load or store in a kernel is a UBSan abort. */
static void check_misaligned(chorus_dtype dt, chorus_op op, size_t count, enum alias al, size_t od,
                             size_t oa, size_t ob) {
  size_t es = esize(dt), n = count * es, room = (n + 16 + 63) / 64 * 64;
  unsigned char *a = aligned_alloc(64, room), *b = aligned_alloc(64, room);
  unsigned char *d = aligned_alloc(64, room), *ra = aligned_alloc(64, room);
  unsigned char *rb = aligned_alloc(64, room), *rd = aligned_alloc(64, room);
  unsigned char *pa = a + oa, *pb = b + ob, *pd = d + od, *qa = ra, *qb = rb, *qd = rd;
  cr_assert(a && b && d && ra && rb && rd);
  memset(d, 0x5a, room);
  for (size_t i = 0; i < count; i++) {
    random_element(dt, ra + i * es);
    random_element(dt, rb + i * es);
  }
  memcpy(pa, ra, n);
  memcpy(pb, rb, n);
  switch (al) {
  case ALIAS_DST_A:
    pd = pa;
    qd = qa;
    break;
  case ALIAS_DST_B:
    pd = pb;
    qd = qb;
    break;
  case ALIAS_ALL:
    pd = pb = pa;
    qd = qb = qa;
    break;
  case ALIAS_A_B:
    pb = pa;
    qb = qa;
    break;
  default:
    break;
  }
  reduce_apply(qd, qa, qb, count, dt, op); /* the aligned reference */
  reduce_apply(pd, pa, pb, count, dt, op);
  for (size_t i = 0; i < count; i++)
    cr_assert(element_matches(dt, pd + i * es, qd + i * es),
              "%s %s count %zu %s, byte offsets dst %zu a %zu b %zu: element %zu differs from "
              "the aligned result",
              chorus_dtype_name(dt), chorus_op_name(op), count, alias_name[al], od, oa, ob, i);
  if (pd == d + od) {
    for (size_t i = 0; i < od; i++)
      cr_assert_eq(d[i], 0x5a, "%s %s: wrote before dst", chorus_dtype_name(dt),
                   chorus_op_name(op));
    for (size_t i = od + n; i < room; i++)
      cr_assert_eq(d[i], 0x5a, "%s %s: wrote past dst", chorus_dtype_name(dt), chorus_op_name(op));
  }
  /* avg's final division, in place at that offset */
  if (op == CHORUS_AVG) {
    memcpy(qd, pd, n);
    reduce_scale_avg(qd, count, dt, 3);
    reduce_scale_avg(pd, count, dt, 3);
    for (size_t i = 0; i < count; i++)
      cr_assert(element_matches(dt, pd + i * es, qd + i * es),
                "%s avg scale at byte offset %zu: element %zu differs from the aligned result",
                chorus_dtype_name(dt), (size_t)((uintptr_t)pd % 64), i);
  }
  free(a);
  free(b);
  free(d);
  free(ra);
  free(rb);
  free(rd);
}

ParameterizedTestParameters(kernels, misaligned) {
  static kparam_t params[CHORUS_DTYPE_COUNT * CHORUS_OP_COUNT];
  size_t n = 0;
  for (int dt = 0; dt < CHORUS_DTYPE_COUNT; dt++)
    for (int op = 0; op < CHORUS_OP_COUNT; op++)
      params[n++] = (kparam_t){(chorus_dtype)dt, (chorus_op)op};
  return cr_make_param_array(kparam_t, params, n);
}

/* Every op and dtype over pointers 1, 2 and 3 bytes off their alignment
 * (each pointer on its own and all together), every aliasing case, counts
 * around the vector widths; both the portable and the F16C float16 loops. */
ParameterizedTest(kparam_t *p, kernels, misaligned) {
  static const size_t counts[] = {1, 3, 9, 33, 1021};
  static const size_t offs[][3] = {{1, 0, 0}, {0, 2, 0}, {0, 0, 3}, {3, 3, 3}, {1, 2, 3}};
  for (int portable = 0; portable < 2; portable++) {
    reduce_portable_only = portable;
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
      for (int al = 0; al < ALIAS_COUNT; al++)
        for (size_t o = 0; o < sizeof(offs) / sizeof(offs[0]); o++)
          check_misaligned(p->dtype, p->op, counts[c], (enum alias)al, offs[o][0], offs[o][1],
                           offs[o][2]);
  }
  reduce_portable_only = 0;
}

/* Out-of-range dtype or op, and count 0, touch nothing. */
Test(kernels, invalid_and_empty_touch_nothing) {
  float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, d[4] = {0, 0, 0, 0};
  reduce_apply(d, a, b, 4, CHORUS_DTYPE_COUNT, CHORUS_SUM);
  reduce_apply(d, a, b, 4, CHORUS_FLOAT32, CHORUS_OP_COUNT);
  reduce_apply(d, a, b, 0, CHORUS_FLOAT32, CHORUS_SUM);
  reduce_apply(NULL, NULL, NULL, 0, CHORUS_FLOAT32, CHORUS_SUM);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(d[i], 0.0f);
}

Test(kernels, integer_wraparound) {
  int8_t a8[3] = {127, -128, 100}, b8[3] = {1, -1, 3}, d8[3];
  reduce_apply(d8, a8, b8, 3, CHORUS_INT8, CHORUS_SUM);
  cr_assert(d8[0] == -128 && d8[1] == 127 && d8[2] == 103);
  reduce_apply(d8, a8, b8, 3, CHORUS_INT8, CHORUS_PROD);
  cr_assert(d8[0] == 127 && d8[1] == -128 && d8[2] == 44); /* 300 mod 256 */
  uint8_t au[2] = {255, 16}, bu[2] = {1, 16}, du[2];
  reduce_apply(du, au, bu, 2, CHORUS_UINT8, CHORUS_SUM);
  cr_assert(du[0] == 0 && du[1] == 32);
  reduce_apply(du, au, bu, 2, CHORUS_UINT8, CHORUS_PROD);
  cr_assert(du[0] == 255 && du[1] == 0);
  int32_t a32[2] = {INT32_MAX, INT32_MIN}, b32[2] = {1, INT32_MIN}, d32[2];
  reduce_apply(d32, a32, b32, 2, CHORUS_INT32, CHORUS_SUM);
  cr_assert(d32[0] == INT32_MIN && d32[1] == 0);
  reduce_apply(d32, a32, b32, 2, CHORUS_INT32, CHORUS_PROD);
  cr_assert(d32[0] == INT32_MAX && d32[1] == 0);
  int64_t a64[2] = {INT64_MAX, INT64_MIN}, b64[2] = {2, -1}, d64[2];
  reduce_apply(d64, a64, b64, 2, CHORUS_INT64, CHORUS_SUM);
  cr_assert(d64[0] == INT64_MIN + 1 && d64[1] == INT64_MAX);
  reduce_apply(d64, a64, b64, 2, CHORUS_INT64, CHORUS_PROD);
  cr_assert(d64[0] == -2 && d64[1] == INT64_MIN);
}

Test(kernels, float_minmax_nan) {
  float a[6] = {NAN, 1.0f, NAN, -INFINITY, 0.0f, -0.0f};
  float b[6] = {1.0f, NAN, NAN, 2.0f, -0.0f, 0.0f};
  float d[6];
  reduce_apply(d, a, b, 6, CHORUS_FLOAT32, CHORUS_MIN);
  cr_assert(isnan(d[0]) && isnan(d[1]) && isnan(d[2]));
  cr_assert(d[3] == -INFINITY);
  cr_assert(signbit(d[4]) && !signbit(d[5]), "equal operands give the second");
  reduce_apply(d, a, b, 6, CHORUS_FLOAT32, CHORUS_MAX);
  cr_assert(isnan(d[0]) && isnan(d[1]) && isnan(d[2]));
  cr_assert(d[3] == 2.0f);
  double da[2] = {NAN, 3.0}, db[2] = {3.0, NAN}, dd[2];
  reduce_apply(dd, da, db, 2, CHORUS_FLOAT64, CHORUS_MAX);
  cr_assert(isnan(dd[0]) && isnan(dd[1]));
  for (int portable = 0; portable < 2; portable++) {
    reduce_portable_only = portable;
    uint16_t ha[9], hb[9], hd[9];
    for (int i = 0; i < 9; i++) {
      ha[i] = reduce_float_to_half((float)i);
      hb[i] = 0x7e00; /* NaN */
    }
    reduce_apply(hd, ha, hb, 9, CHORUS_FLOAT16, CHORUS_MIN);
    for (int i = 0; i < 9; i++)
      cr_assert(fmt_isnan(F16, hd[i]), "half min(x, NaN) lane %d", i);
    reduce_apply(hd, hb, ha, 9, CHORUS_FLOAT16, CHORUS_MAX);
    for (int i = 0; i < 9; i++)
      cr_assert(fmt_isnan(F16, hd[i]), "half max(NaN, x) lane %d", i);
  }
  reduce_portable_only = 0;
}

/* In float16, 2048 + 1 is a tie that rounds to even (2048); 2048 + 3 rounds up to 2052. */
Test(kernels, half_sum_rounds_to_even) {
  for (int portable = 0; portable < 2; portable++) {
    reduce_portable_only = portable;
    uint16_t a[9], b[9], d[9];
    for (int i = 0; i < 9; i++) {
      a[i] = reduce_float_to_half(2048.0f);
      b[i] = reduce_float_to_half(i % 2 ? 1.0f : 3.0f);
    }
    reduce_apply(d, a, b, 9, CHORUS_FLOAT16, CHORUS_SUM);
    for (int i = 0; i < 9; i++)
      cr_assert_eq(reduce_half_to_float(d[i]), i % 2 ? 2048.0f : 2052.0f, "lane %d", i);
    /* overflow to inf */
    for (int i = 0; i < 9; i++)
      a[i] = b[i] = reduce_float_to_half(40000.0f);
    reduce_apply(d, a, b, 9, CHORUS_FLOAT16, CHORUS_SUM);
    for (int i = 0; i < 9; i++)
      cr_assert_eq(d[i], 0x7c00, "lane %d", i);
  }
  reduce_portable_only = 0;
}

/* ---- avg scaling ---- */

static void check_scale(chorus_dtype dt, size_t count, int n) {
  size_t es = esize(dt);
  unsigned char *buf = malloc(count * es + 1), *orig = malloc(count * es + 1);
  cr_assert(buf && orig);
  for (size_t i = 0; i < count; i++)
    random_element(dt, buf + i * es);
  memcpy(orig, buf, count * es);
  reduce_scale_avg(buf, count, dt, n);
  for (size_t i = 0; i < count; i++) {
    unsigned char want[8];
    const unsigned char *x = orig + i * es;
    switch (dt) {
    case CHORUS_INT8: {
      int8_t v = (int8_t)x[0];
      int8_t w = (int8_t)(n > 1 ? v / n : v);
      memcpy(want, &w, 1);
      break;
    }
    case CHORUS_UINT8: {
      uint8_t w = (uint8_t)(n > 1 ? x[0] / n : x[0]);
      memcpy(want, &w, 1);
      break;
    }
    case CHORUS_INT32: {
      int32_t v;
      memcpy(&v, x, 4);
      int32_t w = n > 1 ? v / n : v;
      memcpy(want, &w, 4);
      break;
    }
    case CHORUS_INT64: {
      int64_t v;
      memcpy(&v, x, 8);
      int64_t w = n > 1 ? v / n : v;
      memcpy(want, &w, 8);
      break;
    }
    case CHORUS_FLOAT16:
    case CHORUS_BFLOAT16: {
      fmt_t f = dt == CHORUS_FLOAT16 ? F16 : BF16;
      uint16_t v;
      memcpy(&v, x, 2);
      uint16_t w = n > 1 ? ref_from_ratio(f, ref_to_double(f, v), n) : v;
      memcpy(want, &w, 2);
      break;
    }
    case CHORUS_FLOAT32: {
      float v;
      memcpy(&v, x, 4);
      float w = n > 1 ? v / (float)n : v;
      memcpy(want, &w, 4);
      break;
    }
    default: {
      double v;
      memcpy(&v, x, 8);
      double w = n > 1 ? v / n : v;
      memcpy(want, &w, 8);
      break;
    }
    }
    if (!element_matches(dt, buf + i * es, want)) {
      uint64_t g = 0, w = 0, o = 0;
      memcpy(&g, buf + i * es, es);
      memcpy(&w, want, es);
      memcpy(&o, x, es);
      cr_assert_fail("%s avg / %d: element %zu: %#llx -> %#llx, want %#llx", chorus_dtype_name(dt),
                     n, i, (unsigned long long)o, (unsigned long long)g, (unsigned long long)w);
    }
  }
  free(buf);
  free(orig);
}

Test(avg, scale_matches_reference) {
  static const int ns[] = {1, 2, 3, 4, 7, 8, 1000, 65537, INT32_MAX};
  for (int dt = 0; dt < CHORUS_DTYPE_COUNT; dt++)
    for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++)
      for (size_t count = 0; count < 40; count += 13)
        check_scale((chorus_dtype)dt, count * 37 + 1, ns[k]);
}

Test(avg, integers_truncate_toward_zero) {
  int8_t i8[4] = {-7, 7, -128, 127};
  reduce_scale_avg(i8, 4, CHORUS_INT8, 2);
  cr_assert(i8[0] == -3 && i8[1] == 3 && i8[2] == -64 && i8[3] == 63);
  uint8_t u8[2] = {255, 5};
  reduce_scale_avg(u8, 2, CHORUS_UINT8, 3);
  cr_assert(u8[0] == 85 && u8[1] == 1);
  int32_t i32[3] = {INT32_MIN, -5, INT32_MAX};
  reduce_scale_avg(i32, 3, CHORUS_INT32, 3);
  cr_assert(i32[0] == INT32_MIN / 3 && i32[1] == -1 && i32[2] == INT32_MAX / 3);
  int64_t i64[2] = {INT64_MIN, -9};
  reduce_scale_avg(i64, 2, CHORUS_INT64, 4);
  cr_assert(i64[0] == INT64_MIN / 4 && i64[1] == -2);
}

/* Quotients just above a tie: float32 alone would round onto the tie and then
 * to even (down); the exact quotient must round up. */
Test(avg, narrow_division_rounds_once) {
  uint16_t b = 0x0c00; /* 2^-103 */
  reduce_scale_avg(&b, 1, CHORUS_BFLOAT16, INT32_MAX);
  cr_assert_eq(b, 0x0001, "bf16 2^-103 / (2^31 - 1) gave %#06x", b); /* > 2^-134, the tie */
  uint16_t h = 0x3c00;                                               /* 1.0 */
  reduce_scale_avg(&h, 1, CHORUS_FLOAT16, 2047); /* 1/2047 = 2^-11 (1 + 2^-11 + ...) */
  cr_assert_eq(h, ref_from_ratio(F16, 1.0, 2047.0));
}

/* allreduce(avg) over 4 ranks as the engine does it: sum, then scale once. */
Test(avg, sum_then_scale) {
  float r[4][5] = {{1, 2, 3, 4, 5}, {1, 2, 3, 4, 5}, {2, 2, 2, 2, 2}, {0, 0, 1, 0, 0}};
  float acc[5];
  memcpy(acc, r[0], sizeof(acc));
  for (int k = 1; k < 4; k++)
    reduce_apply(acc, acc, r[k], 5, CHORUS_FLOAT32, CHORUS_AVG);
  reduce_scale_avg(acc, 5, CHORUS_FLOAT32, 4);
  float want[5] = {1.0f, 1.5f, 2.25f, 2.5f, 3.0f};
  for (int i = 0; i < 5; i++)
    cr_assert_eq(acc[i], want[i], "element %d: %g", i, (double)acc[i]);
  uint16_t h[3] = {reduce_float_to_half(3.0f), reduce_float_to_half(-1.0f), 0x7e00};
  reduce_scale_avg(h, 3, CHORUS_FLOAT16, 2);
  cr_assert(h[0] == reduce_float_to_half(1.5f) && h[1] == reduce_float_to_half(-0.5f));
  cr_assert(fmt_isnan(F16, h[2]));
}
