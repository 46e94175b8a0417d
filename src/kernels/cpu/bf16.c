#include "kernels/cpu/bf16.h"

#include <cpuid.h>
#include <string.h>
#include <oneapi/dnnl/dnnl.h>

#include "kernels/cpu/simd.h"

/* Elements per parallel block; below two blocks the loop stays serial. */
#define CONV_BLOCK 32768

void st_f32_to_bf16_serial(uint16_t *dst, const float *src, int64_t n)
{
	int64_t i = 0;
#ifdef __AVX512F__
	for (; i + 16 <= n; i += 16)
		_mm256_storeu_si256((__m256i *)(dst + i), st_cvt_bf16_16(_mm512_loadu_ps(src + i)));
	if (i < n) {
		__mmask16 m = (__mmask16)((1u << (n - i)) - 1);
		__m256i h = st_cvt_bf16_16(_mm512_maskz_loadu_ps(m, src + i));
		_mm256_mask_storeu_epi16(dst + i, m, h);
		i = n;
	}
#elif ST_HAVE_AVX2
	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128((__m128i *)(dst + i), st_cvt_bf16_8(_mm256_loadu_ps(src + i)));
#endif
	for (; i < n; i++)
		dst[i] = st_f32_to_bf16(src[i]);
}

static void to_f32_range(float *dst, const uint16_t *src, int64_t n)
{
	int64_t i = 0;
#ifdef __AVX512F__
	for (; i + 16 <= n; i += 16) {
		__m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
		_mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(u, 16)));
	}
#elif ST_HAVE_AVX2
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(dst + i, st_widen_bf16_8(src + i));
#endif
	for (; i < n; i++)
		dst[i] = st_bf16_to_f32(src[i]);
}

void st_f32_to_bf16_array(uint16_t *dst, const float *src, int64_t n)
{
	int64_t nb = (n + CONV_BLOCK - 1) / CONV_BLOCK;
#pragma omp parallel for schedule(static) if (nb > 1)
	for (int64_t b = 0; b < nb; b++) {
		int64_t i0 = b * CONV_BLOCK, len = n - i0 < CONV_BLOCK ? n - i0 : CONV_BLOCK;
		st_f32_to_bf16_serial(dst + i0, src + i0, len);
	}
}

void st_bf16_to_f32_array(float *dst, const uint16_t *src, int64_t n)
{
	int64_t nb = (n + CONV_BLOCK - 1) / CONV_BLOCK;
#pragma omp parallel for schedule(static) if (nb > 1)
	for (int64_t b = 0; b < nb; b++) {
		int64_t i0 = b * CONV_BLOCK, len = n - i0 < CONV_BLOCK ? n - i0 : CONV_BLOCK;
		to_f32_range(dst + i0, src + i0, len);
	}
}

uint16_t *st_bf16_rows_in_place(float *x, int64_t rows, int64_t cols)
{
#pragma omp parallel for schedule(static) if (rows * cols > 2 * CONV_BLOCK)
	for (int64_t r = 0; r < rows; r++) {
		const float *src = x + r * cols;
		char *dst = (char *)src; /* each block is read before its results land on it */
		int64_t c = 0;
#ifdef __AVX512F__
		for (; c < cols; c += 16) {
			__mmask16 m = cols - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (cols - c)) - 1);
			__m256i h = st_cvt_bf16_16(_mm512_maskz_loadu_ps(m, src + c));
			_mm256_mask_storeu_epi16(dst + 2 * c, m, h);
		}
#elif ST_HAVE_AVX2
		for (; c + 8 <= cols; c += 8) /* 32 bytes read, then 16 stored below them */
			_mm_storeu_si128((__m128i *)(dst + 2 * c), st_cvt_bf16_8(_mm256_loadu_ps(src + c)));
#endif
		for (; c < cols; c++) { /* stored through memcpy: kept after the loads before it */
			uint16_t h = st_f32_to_bf16(src[c]);
			memcpy(dst + 2 * c, &h, sizeof(h));
		}
	}
	return (uint16_t *)x;
}

static void round_range(uint16_t *h, float *x, int64_t n)
{
	int64_t i = 0;
#ifdef __AVX512F__
	for (; i + 16 <= n; i += 16) {
		__m256i b = st_cvt_bf16_16(_mm512_loadu_ps(x + i));
		_mm256_storeu_si256((__m256i *)(h + i), b);
		_mm512_storeu_ps(x + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)));
	}
#elif ST_HAVE_AVX2
	for (; i + 8 <= n; i += 8) {
		_mm_storeu_si128((__m128i *)(h + i), st_cvt_bf16_8(_mm256_loadu_ps(x + i)));
		_mm256_storeu_ps(x + i, st_widen_bf16_8(h + i));
	}
#endif
	for (; i < n; i++) {
		h[i] = st_f32_to_bf16(x[i]);
		x[i] = st_bf16_to_f32(h[i]);
	}
}

void st_bf16_round_keep(uint16_t *h, float *x, int64_t n)
{
	int64_t nb = (n + CONV_BLOCK - 1) / CONV_BLOCK;
#pragma omp parallel for schedule(static) if (nb > 1)
	for (int64_t b = 0; b < nb; b++) {
		int64_t i0 = b * CONV_BLOCK, len = n - i0 < CONV_BLOCK ? n - i0 : CONV_BLOCK;
		round_range(h + i0, x + i0, len);
	}
}

void st_bf16_round_values(float *x, int64_t n)
{
	int64_t nb = (n + CONV_BLOCK - 1) / CONV_BLOCK;
#pragma omp parallel for schedule(static) if (nb > 1)
	for (int64_t b = 0; b < nb; b++) {
		int64_t i0 = b * CONV_BLOCK, i1 = n - i0 < CONV_BLOCK ? n : i0 + CONV_BLOCK;
		uint16_t h[1024];
		for (int64_t i = i0; i < i1; i += 1024)
			round_range(h, x + i, i1 - i < 1024 ? i1 - i : 1024);
	}
}

static int cpuid_has_avx512_bf16(void)
{
	unsigned a, b, c, d;
	if (!__get_cpuid_count(7, 1, &a, &b, &c, &d))
		return 0;
	return (a >> 5) & 1;
}

static int onednn_has_bf16(void)
{
	unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
	unsigned bf16 = (unsigned)dnnl_cpu_isa_avx512_core_bf16;
	return (isa & bf16) == bf16;
}

int st_cpu_has_bf16(void) { return cpuid_has_avx512_bf16() && onednn_has_bf16(); }

const char *st_cpu_bf16_message(void)
{
	if (!cpuid_has_avx512_bf16())
		return "this CPU has no AVX512_BF16 instructions (no bf16 matrix products for it in oneDNN)";
	if (!onednn_has_bf16())
		return "oneDNN will not use AVX512_BF16 here (DNNL_MAX_CPU_ISA, or the OS does not "
		       "enable AVX-512 state)";
	return "";
}
