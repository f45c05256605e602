/*
 * reduce.h - reduction kernels and datatype helpers.
 *
 * Kernels are plain loops over restrict pointers that the compiler
 * vectorizes; float16 and bfloat16 are widened to float32, reduced, and
 * rounded back to nearest-even. CHORUS_AVG reduces as a sum; the owner of the
 * final value then calls reduce_scale_avg().
 */
#ifndef CHORUS_REDUCE_H
#define CHORUS_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "chorus.h"

/* dst[i] = a[i] op b[i] for i < count. dst may alias a or b (exactly), not partially. */
void reduce_apply(void *dst, const void *a, const void *b, size_t count, chorus_dtype dtype,
                  chorus_op op);
/* buf[i] = buf[i] / n (integer types truncate toward zero; fp16/bf16 via fp32). */
void reduce_scale_avg(void *buf, size_t count, chorus_dtype dtype, int n);

/* Conversions (round to nearest even; NaN stays NaN). */
float reduce_half_to_float(uint16_t h);
uint16_t reduce_float_to_half(float f);
float reduce_bf16_to_float(uint16_t h);
uint16_t reduce_float_to_bf16(float f);

#endif
