/*
 * simd.h - private vector helpers for the CPU kernels (AVX-512 builds; ST_HAVE_AVX2
 * for the 8-wide paths of builds without AVX-512).
 *
 * st_exp16: e^x for 16 floats, Cody-Waite range reduction and Cephes' expf
 * polynomial, then scalef: about 1 ulp over the whole range, 0 for x below
 * about -104 (and -Inf), +Inf above about 88.7, NaN kept. Deterministic: a
 * fixed sequence of IEEE operations.
 */
#ifndef ST_KERNELS_SIMD_H
#define ST_KERNELS_SIMD_H

/* st_exp16 / st_exp8: x clamped to [ST_EXP_LO, ST_EXP_HI], n = round(x
 * log2 e), r = x - n ln 2 in two parts (Cody-Waite), then e^r by Cephes'
 * expf polynomial: 1 + r + r^2 (C5 + r (C4 + ... r C0)). */
#define ST_EXP_LO (-104.0f)
#define ST_EXP_HI 88.8f
#define ST_EXP_LOG2E 1.44269504088896341f
#define ST_EXP_LN2_HI 0.693359375f
#define ST_EXP_LN2_LO (-2.12194440e-4f)
#define ST_EXP_C0 1.9875691500e-4f
#define ST_EXP_C1 1.3981999507e-3f
#define ST_EXP_C2 8.3334519073e-3f
#define ST_EXP_C3 4.1665795894e-2f
#define ST_EXP_C4 1.6666665459e-1f
#define ST_EXP_C5 5.0000001201e-1f

/* Keep a loaded vector in a register: without this GCC folds the load into
 * every FMA that uses it, one load per use, and the micro-kernels become
 * load-bound (AVX2: or it spills a vector to the stack and
 * reloads it at every use). */
#define ST_KEEP_IN_REGISTER(v) __asm__("" : "+v"(v))

#ifdef __AVX512F__
#include <immintrin.h>
#define ST_HAVE_AVX512 1

static inline __m512 st_exp16(__m512 x)
{
	/* max/min with x second: a NaN in x comes through */
	x = _mm512_max_ps(_mm512_set1_ps(ST_EXP_LO), x);
	x = _mm512_min_ps(_mm512_set1_ps(ST_EXP_HI), x);
	__m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(ST_EXP_LOG2E)),
					_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(ST_EXP_LN2_HI), x);
	r = _mm512_fnmadd_ps(n, _mm512_set1_ps(ST_EXP_LN2_LO), r);
	__m512 p = _mm512_set1_ps(ST_EXP_C0);
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ST_EXP_C1));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ST_EXP_C2));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ST_EXP_C3));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ST_EXP_C4));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ST_EXP_C5));
	p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
	return _mm512_scalef_ps(p, n);
}

/* 16 floats -> 16 bf16 (round to nearest even, subnormals kept, NaN quiet):
 * the same rule as st_f32_to_bf16 in bf16.h. Not VCVTNEPS2BF16, which
 * treats subnormal inputs as zero. */
static inline __m256i st_cvt_bf16_16(__m512 x)
{
	__m512i u = _mm512_castps_si512(x);
	__m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
	__m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
	r = _mm512_srli_epi32(r, 16);
	__mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
	__m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
	r = _mm512_mask_mov_epi32(r, nan, q);
	return _mm512_cvtepi32_epi16(r);
}

/* Store the first lanes (mask) of x to dst, as fp32 or as bf16. */
static inline void st_store16(void *dst, int bf16, __mmask16 m, __m512 x)
{
	if (bf16)
		_mm256_mask_storeu_epi16(dst, m, st_cvt_bf16_16(x));
	else
		_mm512_mask_storeu_ps(dst, m, x);
}

/* x rounded to bf16 (st_cvt_bf16_16) and its first lanes (mask) stored at
 * dst; returns the rounded values, widened (exact). */
static inline __m512 st_store16_round(uint16_t *dst, __mmask16 m, __m512 x)
{
	__m256i h = st_cvt_bf16_16(x);
	_mm256_mask_storeu_epi16(dst, m, h);
	return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Load the first lanes (mask) of src, fp32 or bf16 (widened exactly); the
 * other lanes are 0. */
static inline __m512 st_load16(const void *src, int bf16, __mmask16 m)
{
	if (!bf16)
		return _mm512_maskz_loadu_ps(m, src);
	__m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src));
	return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* Mask of the first n lanes (n in 0..16). */
static inline __mmask16 st_mask16(int64_t n)
{
	return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}
#else
#define ST_HAVE_AVX512 0
#endif

/* AVX2 with FMA (every x86-64 CPU since about 2013): 8-wide fp32 paths of
 * some kernels where the build has no AVX-512 (attention's tile products). */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define ST_HAVE_AVX2 1

/* st_exp16's e^x for 8 floats: the same reduction and polynomial; 2^n as
 * two normal powers of two (n in -150..128), so that results below 2^-126
 * come out subnormal as with scalef. */
static inline __m256 st_exp8(__m256 x)
{
	x = _mm256_max_ps(_mm256_set1_ps(ST_EXP_LO), x); /* x second: a NaN comes through */
	x = _mm256_min_ps(_mm256_set1_ps(ST_EXP_HI), x);
	__m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(ST_EXP_LOG2E)),
				   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(ST_EXP_LN2_HI), x);
	r = _mm256_fnmadd_ps(n, _mm256_set1_ps(ST_EXP_LN2_LO), r);
	__m256 p = _mm256_set1_ps(ST_EXP_C0);
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ST_EXP_C1));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ST_EXP_C2));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ST_EXP_C3));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ST_EXP_C4));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ST_EXP_C5));
	p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
	__m256i ni = _mm256_cvtps_epi32(n), bias = _mm256_set1_epi32(127);
	__m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
	__m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
	__m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
	return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

/* 8 floats -> 8 bf16, st_cvt_bf16_16's rule (round to nearest even,
 * subnormals kept, NaN quiet). */
static inline __m128i st_cvt_bf16_8(__m256 x)
{
	__m256i u = _mm256_castps_si256(x);
	__m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
	__m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
	__m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
	r = _mm256_blendv_epi8(r, q, _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
	/* 32 -> 16 bits (every value fits): per 128-bit lane, then the two
	 * lanes' low halves together */
	__m256i p = _mm256_packus_epi32(r, r);
	return _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08));
}

/* 8 bf16 -> 8 floats (exact). */
static inline __m256 st_widen_bf16_8(const uint16_t *src)
{
	__m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)src));
	return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* st_store16_round for 8 floats. */
static inline __m256 st_store8_round(uint16_t *dst, __m256 x)
{
	__m128i h = st_cvt_bf16_8(x);
	_mm_storeu_si128((__m128i *)dst, h);
	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 values of fp32 or bf16 (then widened, exact) at src. */
static inline __m256 st_load8(const void *src, int bf16)
{
	return bf16 ? st_widen_bf16_8(src) : _mm256_loadu_ps(src);
}

/* 8 floats to dst as fp32 or bf16 (st_cvt_bf16_8's rounding). */
static inline void st_store8(void *dst, int bf16, __m256 x)
{
	if (bf16)
		_mm_storeu_si128(dst, st_cvt_bf16_8(x));
	else
		_mm256_storeu_ps(dst, x);
}

/* Lanes 8*j + i < lim: all ones (i = 0..7). */
static inline __m256 st_lanes_below8(int64_t lim, int j)
{
	__m256i idx = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 * j));
	int l = lim < 0 ? 0 : lim > 1 << 20 ? 1 << 20 : (int)lim;
	return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(l), idx));
}

static inline float st_hmax8(__m256 v)
{
	__m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	m = _mm_max_ps(m, _mm_movehl_ps(m, m));
	m = _mm_max_ss(m, _mm_movehdup_ps(m));
	return _mm_cvtss_f32(m);
}

static inline float st_hsum8(__m256 v)
{
	__m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	m = _mm_add_ps(m, _mm_movehl_ps(m, m));
	m = _mm_add_ss(m, _mm_movehdup_ps(m));
	return _mm_cvtss_f32(m);
}
#else
#define ST_HAVE_AVX2 0
#endif

#endif
