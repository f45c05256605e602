/*
 * check.h - reference results for allreduce tests (shared by the
 * multi-process and in-process tests).
 *
 * Inputs are small integers so that every dtype and op has one exact
 * answer: sums stay below 128 (int8) and below 2048 (float16 is exact);
 * products only multiply 1s and 2s (powers of two, exact in every float
 * type; the integer types wrap the same way everywhere).
 */
#ifndef CHORUS_TEST_CHECK_H
#define CHORUS_TEST_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "chorus.h"
#include "reduce.h"

static inline double chk_input(int rank, size_t i, chorus_op op) {
  if (op == CHORUS_PROD)
    return (double)(1 + (int)((rank + i) % 2));
  return (double)(1 + (int)(((size_t)rank * 7 + i) % 5));
}

static inline void chk_set(void *buf, size_t i, chorus_dtype dt, double v) {
  switch (dt) {
  case CHORUS_INT8:
    ((int8_t *)buf)[i] = (int8_t)(int64_t)v;
    break;
  case CHORUS_UINT8:
    ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v;
    break;
  case CHORUS_INT32:
    ((int32_t *)buf)[i] = (int32_t)(int64_t)v;
    break;
  case CHORUS_INT64:
    ((int64_t *)buf)[i] = (int64_t)v;
    break;
  case CHORUS_FLOAT16:
    ((uint16_t *)buf)[i] = reduce_float_to_half((float)v);
    break;
  case CHORUS_BFLOAT16:
    ((uint16_t *)buf)[i] = reduce_float_to_bf16((float)v);
    break;
  case CHORUS_FLOAT32:
    ((float *)buf)[i] = (float)v;
    break;
  case CHORUS_FLOAT64:
    ((double *)buf)[i] = v;
    break;
  default:
    break;
  }
}

static inline double chk_get(const void *buf, size_t i, chorus_dtype dt) {
  switch (dt) {
  case CHORUS_INT8:
    return ((const int8_t *)buf)[i];
  case CHORUS_UINT8:
    return ((const uint8_t *)buf)[i];
  case CHORUS_INT32:
    return ((const int32_t *)buf)[i];
  case CHORUS_INT64:
    return (double)((const int64_t *)buf)[i];
  case CHORUS_FLOAT16:
    return reduce_half_to_float(((const uint16_t *)buf)[i]);
  case CHORUS_BFLOAT16:
    return reduce_bf16_to_float(((const uint16_t *)buf)[i]);
  case CHORUS_FLOAT32:
    return ((const float *)buf)[i];
  case CHORUS_FLOAT64:
    return ((const double *)buf)[i];
  default:
    return NAN;
  }
}

static inline void chk_fill(void *buf, size_t count, chorus_dtype dt, chorus_op op, int rank) {
  for (size_t i = 0; i < count; i++)
    chk_set(buf, i, dt, chk_input(rank, i, op));
}

/* The expected element i, stored in `dt` (so wrapping and rounding apply). */
static inline double chk_expect(size_t i, chorus_dtype dt, chorus_op op, int nranks) {
  double acc = chk_input(0, i, op);
  int64_t iacc = (int64_t)acc;
  for (int r = 1; r < nranks; r++) {
    double v = chk_input(r, i, op);
    switch (op) {
    case CHORUS_SUM:
    case CHORUS_AVG:
      acc += v;
      break;
    case CHORUS_PROD:
      acc *= v;
      iacc *= (int64_t)v;
      break;
    case CHORUS_MIN:
      acc = v < acc ? v : acc;
      break;
    case CHORUS_MAX:
      acc = v > acc ? v : acc;
      break;
    default:
      break;
    }
  }
  if (op == CHORUS_PROD && nranks > 1)
    acc = (double)iacc;
  if (op == CHORUS_AVG) {
    switch (dt) {
    case CHORUS_INT8:
    case CHORUS_UINT8:
    case CHORUS_INT32:
    case CHORUS_INT64:
      acc = (double)((int64_t)acc / nranks);
      break;
    case CHORUS_FLOAT64:
      acc = acc / nranks;
      break;
    default:
      acc = (double)((float)acc / (float)nranks);
      break;
    }
  }
  uint8_t tmp[8];
  chk_set(tmp, 0, dt, acc);
  return chk_get(tmp, 0, dt);
}

/* Number of wrong elements; prints the first few. */
static inline size_t chk_verify(const void *buf, size_t count, chorus_dtype dt, chorus_op op,
                                int nranks, int rank, const char *what) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; i++) {
    double got = chk_get(buf, i, dt), want = chk_expect(i, dt, op, nranks);
    if (memcmp(&got, &want, sizeof(got)) != 0) {
      if (wrong < 3)
        fprintf(stderr, "rank %d %s %s/%s n=%d count=%zu: [%zu] = %g, want %g\n", rank, what,
                chorus_dtype_name(dt), chorus_op_name(op), nranks, count, i, got, want);
      wrong++;
    }
  }
  return wrong;
}

#endif
