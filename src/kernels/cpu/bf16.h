/*
 * bf16.h - bfloat16 storage: conversions and the CPU capability check.
 *
 * A bf16 value is the upper 16 bits of an IEEE fp32 (uint16_t here, so the
 * API needs no compiler support for a bf16 type). fp32 -> bf16 rounds to
 * nearest, ties to even, keeps subnormals (no flush to zero), maps +-Inf to
 * +-Inf, overflows to +-Inf as IEEE rounding does, and turns every NaN into
 * a quiet NaN of the same sign (never into Inf, which plain truncation or
 * rounding of the bit pattern could do). bf16 -> fp32 is exact.
 *
 * The array versions are vectorized (AVX-512 when built for it) and threaded
 * over fixed blocks; each element is independent, so results do not depend
 * on the thread count.
 */
#ifndef ST_KERNELS_BF16_H
#define ST_KERNELS_BF16_H

#include <stdint.h>
#include <string.h>

static inline uint16_t st_f32_to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep the sign, set the quiet bit */
		return (uint16_t)((u >> 16) | 0x0040u);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

static inline float st_bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

/* dst[i] = bf16(src[i]), i < n. */
void st_f32_to_bf16_array(uint16_t *dst, const float *src, int64_t n);
/* The same on the calling thread only (for use inside parallel loops). */
void st_f32_to_bf16_serial(uint16_t *dst, const float *src, int64_t n);
/* dst[i] = fp32(src[i]), i < n. */
void st_bf16_to_f32_array(float *dst, const uint16_t *src, int64_t n);
/* h[i] = bf16(x[i]) and x[i] = fp32(h[i]) (x rounded to bf16 in place), in
 * one pass, i < n. */
void st_bf16_round_keep(uint16_t *h, float *x, int64_t n);
/* x[i] = fp32(bf16(x[i])): x rounded to bf16's values in place, i < n. */
void st_bf16_round_values(float *x, int64_t n);
/* x (rows, cols) rounded to bf16 in place, each row's values over the first
 * half of its own storage: returns them as bf16 (rows, cols) with leading
 * dimension 2 * cols (x's values are gone). Rows are independent, so threads
 * never write what another one reads. */
uint16_t *st_bf16_rows_in_place(float *x, int64_t rows, int64_t cols);

/*
 * 1 when bf16 matrix products run natively: the CPU has AVX512_BF16 (cpuid
 * leaf 7.1 EAX bit 5) and oneDNN will use it (its effective ISA, which
 * honours DNNL_MAX_CPU_ISA and the OS's AVX-512 state). 0 otherwise: oneDNN
 * refuses bf16 products, so callers run them on the fp32 kernels (the
 * trainer keeps bf16 storage with every kernel-plan site on fp32) and say so,
 * e.g. with st_cpu_bf16_message().
 */
int st_cpu_has_bf16(void);
/* One line explaining why bf16 is unavailable ("" when it is available). */
const char *st_cpu_bf16_message(void);

#endif
