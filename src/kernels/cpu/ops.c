#include "kernels/cpu/ops.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/simd.h"

/*
 * Every loop below is vectorized with AVX-512 (masked tails, no scalar
 * remainder) when the build targets it, with plain loops otherwise. Rows are
 * split over threads with static schedules; each row's arithmetic is the same
 * whichever thread runs it, and reductions across rows use fixed blocks
 * summed in a fixed order, so results do not depend on the thread count.
 */

/* Rows per partial sum in weight-gradient reductions: fixed, so the summation
 * order (and so the result) is the same for any thread count. */
#define RED_ROWS 64

/* Scalar store as fp32 or bf16 (plain-loop builds). */
static inline void put(void *dst, int bf16, int64_t i, float v)
{
	if (bf16)
		((uint16_t *)dst)[i] = st_f32_to_bf16(v);
	else
		((float *)dst)[i] = v;
}

/* Scalar load of an fp32 or bf16 value (plain-loop builds). */
static inline float get(const void *src, int bf16, int64_t i)
{
	return bf16 ? st_bf16_to_f32(((const uint16_t *)src)[i]) : ((const float *)src)[i];
}

#if !ST_HAVE_AVX512 /* the AVX2 tails and the plain loops */
/* put, and where dst32 is given (bf16 dst only) the stored value's exact
 * fp32 copy at dst32[i] too. */
static inline void put_keep(void *dst, int bf16, float *dst32, int64_t i, float v)
{
	put(dst, bf16, i, v);
	if (dst32)
		dst32[i] = get(dst, 1, i);
}

/* v rounded to bf16 and stored at *dst; returns the rounded value (exact). */
static inline float round_keep1(uint16_t *dst, float v)
{
	*dst = st_f32_to_bf16(v);
	return st_bf16_to_f32(*dst);
}
#endif

#if ST_HAVE_AVX2 && !ST_HAVE_AVX512
/* lo, hi (4 doubles each) += a b for the low and high 4 lanes (products
 * exact in double). */
static inline void dot_acc8(__m256d *lo, __m256d *hi, __m256 a, __m256 b)
{
	__m256d a0 = _mm256_cvtps_pd(_mm256_castps256_ps128(a)), a1 = _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1));
	__m256d b0 = _mm256_cvtps_pd(_mm256_castps256_ps128(b)), b1 = _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1));
	*lo = _mm256_add_pd(*lo, _mm256_mul_pd(a0, b0));
	*hi = _mm256_add_pd(*hi, _mm256_mul_pd(a1, b1));
}

/* The 8 lanes of dot_acc8 added in a fixed order. */
static inline double dot_sum8(__m256d lo, __m256d hi)
{
	double l[4], h[4];
	_mm256_storeu_pd(l, lo);
	_mm256_storeu_pd(h, hi);
	return ((l[0] + h[0]) + (l[1] + h[1])) + ((l[2] + h[2]) + (l[3] + h[3]));
}
#endif

/* out32 (bf16 out only, else NULL): the rounded values also in fp32 (exact). */
static void rmsnorm_fwd(void *out, int bf16, float *out32, float *rstd, const float *x,
			const float *w, int64_t N, int64_t C, float eps)
{
#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < N; i++) {
		const float *xi = x + i * C;
#if ST_HAVE_AVX512
		char *oi = (char *)out + i * C * (bf16 ? 2 : 4);
		__m512 acc = _mm512_setzero_ps();
		for (int64_t c = 0; c < C; c += 16) {
			__m512 v = _mm512_maskz_loadu_ps(st_mask16(C - c), xi + c);
			acc = _mm512_fmadd_ps(v, v, acc);
		}
		double ss = (double)_mm512_reduce_add_ps(acc);
		float r = (float)(1.0 / sqrt(ss / (double)C + eps));
		__m512 vr = _mm512_set1_ps(r);
		for (int64_t c = 0; c < C; c += 16) {
			__mmask16 m = st_mask16(C - c);
			__m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xi + c), vr);
			v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + c));
			if (out32)
				_mm512_mask_storeu_ps(out32 + i * C + c, m,
						      st_store16_round((uint16_t *)oi + c, m, v));
			else
				st_store16(oi + c * (bf16 ? 2 : 4), bf16, m, v);
		}
#elif ST_HAVE_AVX2
		__m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
		int64_t c = 0;
		for (; c + 8 <= C; c += 8) {
			__m256 v = _mm256_loadu_ps(xi + c);
			dot_acc8(&lo, &hi, v, v);
		}
		double ss = dot_sum8(lo, hi);
		for (; c < C; c++)
			ss += (double)xi[c] * xi[c];
		float r = (float)(1.0 / sqrt(ss / (double)C + eps));
		char *oi = (char *)out + i * C * (bf16 ? 2 : 4);
		__m256 vr = _mm256_set1_ps(r);
		for (c = 0; c + 8 <= C; c += 8) { /* the tail's formula */
			__m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xi + c), vr), _mm256_loadu_ps(w + c));
			if (out32)
				_mm256_storeu_ps(out32 + i * C + c, st_store8_round((uint16_t *)oi + c, v));
			else
				st_store8(oi + c * (bf16 ? 2 : 4), bf16, v);
		}
		for (; c < C; c++)
			put_keep(out, bf16, out32, i * C + c, xi[c] * r * w[c]);
#else
		double ss = 0;
		for (int64_t c = 0; c < C; c++)
			ss += (double)xi[c] * xi[c];
		float r = (float)(1.0 / sqrt(ss / (double)C + eps));
		for (int64_t c = 0; c < C; c++)
			put_keep(out, bf16, out32, i * C + c, xi[c] * r * w[c]);
#endif
		rstd[i] = r;
	}
}

void st_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int64_t N,
			int64_t C, float eps)
{
	rmsnorm_fwd(out, 0, NULL, rstd, x, w, N, C, eps);
}

void st_rmsnorm_forward_bf16(uint16_t *out, float *rstd, const float *x, const float *w, int64_t N,
			     int64_t C, float eps)
{
	rmsnorm_fwd(out, 1, NULL, rstd, x, w, N, C, eps);
}

void st_rmsnorm_forward_keep(uint16_t *out, float *out32, float *rstd, const float *x,
			     const float *w, int64_t N, int64_t C, float eps)
{
	rmsnorm_fwd(out, 1, out32, rstd, x, w, N, C, eps);
}

size_t st_rmsnorm_backward_workspace_bytes(int64_t N, int64_t C)
{
	return (size_t)((N + RED_ROWS - 1) / RED_ROWS * C) * sizeof(float);
}

int st_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
			const float *rstd, int64_t N, int64_t C, const st_ws *ws)
{
	int64_t nchunks = (N + RED_ROWS - 1) / RED_ROWS;
	int rc = st_ws_check(ws, st_rmsnorm_backward_workspace_bytes(N, C), "st_rmsnorm_backward");
	if (rc < 0)
		return rc;
	float *part = ws->mem; /* one row of partial sums of dw per chunk */
#pragma omp parallel for schedule(static)
	for (int64_t ch = 0; ch < nchunks; ch++) {
		float *p = part + ch * C;
		memset(p, 0, (size_t)C * sizeof(float));
		int64_t end = (ch + 1) * RED_ROWS < N ? (ch + 1) * RED_ROWS : N;
		for (int64_t i = ch * RED_ROWS; i < end; i++) {
			const float *xi = x + i * C, *gi = dout + i * C;
			float *dxi = dx + i * C;
			float r = rstd[i];
#if ST_HAVE_AVX512
			__m512 vr = _mm512_set1_ps(r), vdot = _mm512_setzero_ps();
			for (int64_t c = 0; c < C; c += 16) {
				__mmask16 mk = st_mask16(C - c);
				__m512 xhat = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, xi + c), vr);
				__m512 g = _mm512_maskz_loadu_ps(mk, gi + c);
				__m512 gw = _mm512_mul_ps(g, _mm512_maskz_loadu_ps(mk, w + c));
				vdot = _mm512_fmadd_ps(gw, xhat, vdot);
				__m512 pv = _mm512_fmadd_ps(g, xhat, _mm512_maskz_loadu_ps(mk, p + c));
				_mm512_mask_storeu_ps(p + c, mk, pv);
			}
			__m512 vm = _mm512_set1_ps(_mm512_reduce_add_ps(vdot) / (float)C);
			for (int64_t c = 0; c < C; c += 16) {
				__mmask16 mk = st_mask16(C - c);
				__m512 xhat = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, xi + c), vr);
				__m512 gw = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, gi + c),
							  _mm512_maskz_loadu_ps(mk, w + c));
				__m512 d = _mm512_mul_ps(vr, _mm512_fnmadd_ps(xhat, vm, gw));
				_mm512_mask_storeu_ps(dxi + c, mk,
						      _mm512_add_ps(_mm512_maskz_loadu_ps(mk, dxi + c), d));
			}
#elif ST_HAVE_AVX2
			/* sum_c g_c w_c xhat_c in double over the float products
			 * g w and x r (the AVX-512 path's), lanes in a fixed order */
			__m256 vr = _mm256_set1_ps(r);
			__m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
			int64_t c = 0;
			for (; c + 8 <= C; c += 8) {
				__m256 xhat = _mm256_mul_ps(_mm256_loadu_ps(xi + c), vr);
				__m256 g = _mm256_loadu_ps(gi + c);
				dot_acc8(&lo, &hi, _mm256_mul_ps(g, _mm256_loadu_ps(w + c)), xhat);
				_mm256_storeu_ps(p + c, _mm256_add_ps(_mm256_loadu_ps(p + c), _mm256_mul_ps(g, xhat)));
			}
			double dot = dot_sum8(lo, hi);
			for (; c < C; c++) {
				float xhat = xi[c] * r;
				dot += (double)(gi[c] * w[c]) * xhat;
				p[c] += gi[c] * xhat;
			}
			float m = (float)(dot / (double)C);
			__m256 vm = _mm256_set1_ps(m);
			for (c = 0; c + 8 <= C; c += 8) { /* the tail's formula */
				__m256 gw = _mm256_mul_ps(_mm256_loadu_ps(gi + c), _mm256_loadu_ps(w + c));
				__m256 xr = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xi + c), vr), vm);
				__m256 d = _mm256_mul_ps(vr, _mm256_sub_ps(gw, xr));
				_mm256_storeu_ps(dxi + c, _mm256_add_ps(_mm256_loadu_ps(dxi + c), d));
			}
			for (; c < C; c++)
				dxi[c] += r * (gi[c] * w[c] - xi[c] * r * m);
#else
			double dot = 0; /* sum_c g_c w_c xhat_c */
			for (int64_t c = 0; c < C; c++) {
				float xhat = xi[c] * r;
				dot += (double)gi[c] * w[c] * xhat;
				p[c] += gi[c] * xhat;
			}
			float m = (float)(dot / (double)C);
			for (int64_t c = 0; c < C; c++)
				dxi[c] += r * (gi[c] * w[c] - xi[c] * r * m);
#endif
		}
	}
	/* columns in blocks of 16 (one vector) per task, chunks summed in order */
	int64_t ncb = (C + 15) / 16;
#pragma omp parallel for schedule(static)
	for (int64_t cb = 0; cb < ncb; cb++) {
		int64_t c0 = cb * 16, c1 = c0 + 16 < C ? c0 + 16 : C;
		for (int64_t c = c0; c < c1; c++) {
			float s = 0;
			for (int64_t ch = 0; ch < nchunks; ch++)
				s += part[ch * C + c];
			dw[c] += s;
		}
	}
	return 0;
}

void st_rope_tables(float *cos_t, float *sin_t, int64_t T, int64_t D, double theta,
		    const st_rope_scaling *sc)
{
	int64_t half = D / 2;
	for (int64_t i = 0; i < half; i++) {
		double inv = pow(theta, -(double)(2 * i) / (double)D);
		if (sc && sc->enabled) {
			double wavelen = 2.0 * M_PI / inv;
			double low_wl = sc->original_max_len / sc->low_freq_factor;
			double high_wl = sc->original_max_len / sc->high_freq_factor;
			if (wavelen > low_wl) {
				inv = inv / sc->factor;
			} else if (wavelen >= high_wl) {
				double smooth = (sc->original_max_len / wavelen - sc->low_freq_factor) /
						(sc->high_freq_factor - sc->low_freq_factor);
				inv = (1.0 - smooth) * inv / sc->factor + smooth * inv;
			}
		}
		for (int64_t t = 0; t < T; t++) {
			double a = (double)t * inv;
			cos_t[t * half + i] = (float)cos(a);
			sin_t[t * half + i] = (float)sin(a);
		}
	}
}

static void rope_apply(float *x, const float *cos_t, const float *sin_t, int64_t B, int64_t T,
		       int64_t nh, int64_t D, float sign)
{
	int64_t half = D / 2;
#pragma omp parallel for schedule(static)
	for (int64_t bt = 0; bt < B * T; bt++) {
		int64_t t = bt % T;
		const float *c = cos_t + t * half, *s = sin_t + t * half;
		for (int64_t h = 0; h < nh; h++) {
			float *v = x + (bt * nh + h) * D;
#if ST_HAVE_AVX512
			__m512 vsg = _mm512_set1_ps(sign);
			for (int64_t i = 0; i < half; i += 16) {
				__mmask16 mk = st_mask16(half - i);
				__m512 a = _mm512_maskz_loadu_ps(mk, v + i);
				__m512 b = _mm512_maskz_loadu_ps(mk, v + i + half);
				__m512 cv = _mm512_maskz_loadu_ps(mk, c + i);
				__m512 sv = _mm512_mul_ps(vsg, _mm512_maskz_loadu_ps(mk, s + i));
				_mm512_mask_storeu_ps(v + i, mk, _mm512_fmsub_ps(a, cv, _mm512_mul_ps(b, sv)));
				_mm512_mask_storeu_ps(v + i + half, mk,
						      _mm512_fmadd_ps(b, cv, _mm512_mul_ps(a, sv)));
			}
#else
			for (int64_t i = 0; i < half; i++) {
				float a = v[i], b = v[i + half], si = sign * s[i];
				v[i] = a * c[i] - b * si;
				v[i + half] = b * c[i] + a * si;
			}
#endif
		}
	}
}

void st_rope_forward(float *x, const float *cos_t, const float *sin_t, int64_t B, int64_t T,
		     int64_t nh, int64_t D)
{
	rope_apply(x, cos_t, sin_t, B, T, nh, D, 1.0f);
}

void st_rope_backward(float *dx, const float *cos_t, const float *sin_t, int64_t B, int64_t T,
		      int64_t nh, int64_t D)
{
	rope_apply(dx, cos_t, sin_t, B, T, nh, D, -1.0f);
}

/* Elementwise loops run over blocks of EW_BLOCK values: one task each. */
#define EW_BLOCK 4096

/* gate and up are fp32, or bf16 when in16 (their exact fp32 values used).
 * g16, u16 (fp32 inputs only, both or neither): gate and up are first
 * rounded to bf16, kept there, and used rounded. act32 (bf16 act only):
 * act's values also in fp32 (exact); it may be gate itself, as each value
 * is read before its slot is written. */
static void swiglu_fwd(void *act, int bf16, const void *gate, const void *up, int in16,
		       uint16_t *g16, uint16_t *u16, float *act32, int64_t n)
{
	int64_t nb = (n + EW_BLOCK - 1) / EW_BLOCK;
#pragma omp parallel for schedule(static)
	for (int64_t blk = 0; blk < nb; blk++) {
		int64_t i0 = blk * EW_BLOCK, i1 = i0 + EW_BLOCK < n ? i0 + EW_BLOCK : n;
#if ST_HAVE_AVX512
		__m512 one = _mm512_set1_ps(1.0f);
		size_t isz = in16 ? 2 : 4;
		for (int64_t i = i0; i < i1; i += 16) {
			__mmask16 mk = st_mask16(i1 - i);
			__m512 g = st_load16((const char *)gate + i * isz, in16, mk);
			__m512 u = st_load16((const char *)up + i * isz, in16, mk);
			if (g16) {
				g = st_store16_round(g16 + i, mk, g);
				u = st_store16_round(u16 + i, mk, u);
			}
			__m512 e = st_exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
			__m512 r = _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), u);
			if (act32)
				_mm512_mask_storeu_ps(act32 + i, mk, st_store16_round((uint16_t *)act + i, mk, r));
			else
				st_store16((char *)act + i * (bf16 ? 2 : 4), bf16, mk, r);
		}
#elif ST_HAVE_AVX2
		__m256 one = _mm256_set1_ps(1.0f);
		size_t isz = in16 ? 2 : 4, osz = bf16 ? 2 : 4;
		int64_t i = i0;
		for (; i + 8 <= i1; i += 8) { /* the tail's formula, 8 at a time */
			__m256 g = st_load8((const char *)gate + i * isz, in16);
			__m256 u = st_load8((const char *)up + i * isz, in16);
			if (g16) {
				g = st_store8_round(g16 + i, g);
				u = st_store8_round(u16 + i, u);
			}
			__m256 e = st_exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
			__m256 r = _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
			if (act32)
				_mm256_storeu_ps(act32 + i, st_store8_round((uint16_t *)act + i, r));
			else
				st_store8((char *)act + i * osz, bf16, r);
		}
		for (; i < i1; i += 8) { /* e^-g 8 at a time */
			int n8 = i1 - i < 8 ? (int)(i1 - i) : 8;
			float g[8] = {0}, u[8], e[8];
			for (int k = 0; k < n8; k++) {
				g[k] = get(gate, in16, i + k);
				u[k] = get(up, in16, i + k);
				if (g16) {
					g[k] = round_keep1(g16 + i + k, g[k]);
					u[k] = round_keep1(u16 + i + k, u[k]);
				}
			}
			_mm256_storeu_ps(e, st_exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_loadu_ps(g))));
			for (int k = 0; k < n8; k++)
				put_keep(act, bf16, act32, i + k, g[k] / (1.0f + e[k]) * u[k]);
		}
#else
		for (int64_t i = i0; i < i1; i++) {
			float g = get(gate, in16, i), u = get(up, in16, i);
			if (g16) {
				g = round_keep1(g16 + i, g);
				u = round_keep1(u16 + i, u);
			}
			put_keep(act, bf16, act32, i, g / (1.0f + expf(-g)) * u);
		}
#endif
	}
}

void st_swiglu_forward(float *act, const float *gate, const float *up, int64_t n)
{
	swiglu_fwd(act, 0, gate, up, 0, NULL, NULL, NULL, n);
}

void st_swiglu_forward_bf16(uint16_t *act, const float *gate, const float *up, int64_t n)
{
	swiglu_fwd(act, 1, gate, up, 0, NULL, NULL, NULL, n);
}

void st_swiglu_forward_gu16(uint16_t *act, const uint16_t *gate, const uint16_t *up, int64_t n)
{
	swiglu_fwd(act, 1, gate, up, 1, NULL, NULL, NULL, n);
}

void st_swiglu_forward_keep(uint16_t *act, float *act32, uint16_t *g16, uint16_t *u16,
			    const float *gate, const float *up, int64_t n)
{
	swiglu_fwd(act, 1, gate, up, 0, g16, u16, act32, n);
}

/* gate and up are fp32, or bf16 when in16 (their exact fp32 values used) */
static void swiglu_bwd(void *dgate, void *dup, int bf16, const float *dact, const void *gate,
		       const void *up, int in16, int64_t n)
{
	int64_t nb = (n + EW_BLOCK - 1) / EW_BLOCK;
#pragma omp parallel for schedule(static)
	for (int64_t blk = 0; blk < nb; blk++) {
		int64_t i0 = blk * EW_BLOCK, i1 = i0 + EW_BLOCK < n ? i0 + EW_BLOCK : n;
#if ST_HAVE_AVX512
		__m512 one = _mm512_set1_ps(1.0f);
		size_t sz = bf16 ? 2 : 4, isz = in16 ? 2 : 4;
		for (int64_t i = i0; i < i1; i += 16) {
			__mmask16 mk = st_mask16(i1 - i);
			/* read everything first: outputs may alias inputs */
			__m512 g = st_load16((const char *)gate + i * isz, in16, mk);
			__m512 da = _mm512_maskz_loadu_ps(mk, dact + i);
			__m512 u = st_load16((const char *)up + i * isz, in16, mk);
			__m512 e = st_exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
			__m512 sg = _mm512_div_ps(one, _mm512_add_ps(one, e));
			__m512 dasg = _mm512_mul_ps(da, sg);
			__m512 t = _mm512_fmadd_ps(g, _mm512_sub_ps(one, sg), one);
			st_store16((char *)dup + i * sz, bf16, mk, _mm512_mul_ps(dasg, g));
			st_store16((char *)dgate + i * sz, bf16, mk, _mm512_mul_ps(_mm512_mul_ps(dasg, u), t));
		}
#elif ST_HAVE_AVX2
		__m256 one = _mm256_set1_ps(1.0f);
		size_t isz = in16 ? 2 : 4, osz = bf16 ? 2 : 4;
		int64_t i = i0;
		for (; i + 8 <= i1; i += 8) { /* the tail's formula, 8 at a time */
			/* read everything first: outputs may alias inputs */
			__m256 g = st_load8((const char *)gate + i * isz, in16);
			__m256 da = _mm256_loadu_ps(dact + i);
			__m256 u = st_load8((const char *)up + i * isz, in16);
			__m256 e = st_exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
			__m256 sg = _mm256_div_ps(one, _mm256_add_ps(one, e));
			__m256 dasg = _mm256_mul_ps(da, sg);
			__m256 t = _mm256_add_ps(one, _mm256_mul_ps(g, _mm256_sub_ps(one, sg)));
			st_store8((char *)dup + i * osz, bf16, _mm256_mul_ps(dasg, g));
			st_store8((char *)dgate + i * osz, bf16, _mm256_mul_ps(_mm256_mul_ps(dasg, u), t));
		}
		for (; i < i1; i += 8) { /* e^-g 8 at a time */
			int n8 = i1 - i < 8 ? (int)(i1 - i) : 8;
			float g[8] = {0}, da[8], u[8], e[8];
			for (int k = 0; k < n8; k++) { /* read first: outputs may alias inputs */
				g[k] = get(gate, in16, i + k);
				da[k] = dact[i + k];
				u[k] = get(up, in16, i + k);
			}
			_mm256_storeu_ps(e, st_exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_loadu_ps(g))));
			for (int k = 0; k < n8; k++) {
				float sg = 1.0f / (1.0f + e[k]);
				put(dup, bf16, i + k, da[k] * sg * g[k]);
				put(dgate, bf16, i + k, da[k] * sg * u[k] * (1.0f + g[k] * (1.0f - sg)));
			}
		}
#else
		for (int64_t i = i0; i < i1; i++) {
			float g = get(gate, in16, i);
			float da = dact[i], u = get(up, in16, i); /* read first: outputs may alias inputs */
			float sg = 1.0f / (1.0f + expf(-g));
			put(dup, bf16, i, da * sg * g);
			put(dgate, bf16, i, da * sg * u * (1.0f + g * (1.0f - sg)));
		}
#endif
	}
}

void st_swiglu_backward(float *dgate, float *dup, const float *dact, const float *gate,
			const float *up, int64_t n)
{
	swiglu_bwd(dgate, dup, 0, dact, gate, up, 0, n);
}

void st_swiglu_backward_gu16(float *dgate, float *dup, const float *dact, const uint16_t *gate,
			     const uint16_t *up, int64_t n)
{
	swiglu_bwd(dgate, dup, 0, dact, gate, up, 1, n);
}

void st_swiglu_backward_bf16(uint16_t *dgate, uint16_t *dup, const float *dact,
			     const uint16_t *gate, const uint16_t *up, int64_t n)
{
	swiglu_bwd(dgate, dup, 1, dact, gate, up, 1, n);
}

void st_embedding_forward(float *x, const float *emb, const int32_t *tokens, int64_t N,
			  int64_t C)
{
#pragma omp parallel for schedule(static)
	for (int64_t t = 0; t < N; t++)
		memcpy(x + t * C, emb + (int64_t)tokens[t] * C, (size_t)C * sizeof(float));
}

void st_embedding_backward(float *demb, const float *dx, const int32_t *tokens, int64_t N,
			   int64_t C)
{
	/* Columns split across threads; each column sums tokens in order. */
#pragma omp parallel
	{
		int nt = omp_get_num_threads(), id = omp_get_thread_num();
		int64_t c0 = C * id / nt, c1 = C * (id + 1) / nt;
		for (int64_t t = 0; t < N; t++) {
			float *d = demb + (int64_t)tokens[t] * C;
			const float *g = dx + t * C;
#if ST_HAVE_AVX512
			for (int64_t c = c0; c < c1; c += 16) {
				__mmask16 mk = st_mask16(c1 - c);
				_mm512_mask_storeu_ps(d + c, mk,
						      _mm512_add_ps(_mm512_maskz_loadu_ps(mk, d + c),
								    _mm512_maskz_loadu_ps(mk, g + c)));
			}
#else
			for (int64_t c = c0; c < c1; c++)
				d[c] += g[c];
#endif
		}
	}
}

/* ---- cross-entropy rows ---- */

/* Row r of the logits at l + r * ld elements, fp32 or bf16 (l16): rmax,
 * rsum, tlogit as st_xent_rows_exp says; the exponentials written to row r
 * of p (ld V; may be l itself) unless p is NULL. */
static void xent_rows_exp(const void *l, int l16, int64_t ld, float *p, float *rmax, double *rsum,
			  float *tlogit, const int32_t *targets, int64_t v0, int64_t nr, int64_t V)
{
	size_t sz = l16 ? 2 : 4;
#pragma omp parallel for schedule(static)
	for (int64_t r = 0; r < nr; r++) {
		const char *lr = (const char *)l + (size_t)(r * ld) * sz;
		float *pr = p ? p + r * V : NULL;
		int64_t tg = targets ? (int64_t)targets[r] - v0 : -1;
		if (tlogit)
			tlogit[r] = tg >= 0 && tg < V ? get(lr, l16, tg) : 0.0f;
		float mx = -INFINITY;
		double sum = 0;
#if ST_HAVE_AVX512
		__m512 vmax = _mm512_set1_ps(-INFINITY);
		for (int64_t c = 0; c < V; c += 16)
			vmax = _mm512_mask_max_ps(vmax, st_mask16(V - c), vmax,
						  st_load16(lr + c * sz, l16, st_mask16(V - c)));
		mx = _mm512_reduce_max_ps(vmax);
		__m512 vm = _mm512_set1_ps(mx);
		__m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
		for (int64_t c = 0; c < V; c += 16) {
			__mmask16 mk = st_mask16(V - c);
			__m512 p = st_exp16(_mm512_sub_ps(st_load16(lr + c * sz, l16, mk), vm));
			p = _mm512_maskz_mov_ps(mk, p);
			if (pr)
				_mm512_mask_storeu_ps(pr + c, mk, p);
			s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(p)));
			s1 = _mm512_add_pd(
				s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(p), 1))));
		}
		sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
#elif ST_HAVE_AVX2
		__m256 vmax = _mm256_set1_ps(-INFINITY);
		int64_t c = 0;
		for (; c + 8 <= V; c += 8)
			vmax = _mm256_max_ps(vmax, st_load8(lr + c * sz, l16));
		mx = st_hmax8(vmax);
		for (; c < V; c++)
			mx = get(lr, l16, c) > mx ? get(lr, l16, c) : mx;
		__m256 vm = _mm256_set1_ps(mx);
		__m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
		for (c = 0; c < V; c += 8) {
			int n8 = V - c < 8 ? (int)(V - c) : 8;
			float x[8], y[8]; /* the row's last partial block only */
			for (int k = 0; n8 < 8 && k < 8; k++)
				x[k] = k < n8 ? get(lr, l16, c + k) : -INFINITY; /* e^-Inf = 0 past the row */
			__m256 p = st_exp8(_mm256_sub_ps(n8 == 8 ? st_load8(lr + c * sz, l16) : _mm256_loadu_ps(x), vm));
			if (pr) {
				_mm256_storeu_ps(n8 == 8 ? pr + c : y, p);
				if (n8 < 8)
					memcpy(pr + c, y, (size_t)n8 * sizeof(float));
			}
			s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(p)));
			s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(p, 1)));
		}
		double part[4];
		_mm256_storeu_pd(part, _mm256_add_pd(s0, s1));
		sum = (part[0] + part[1]) + (part[2] + part[3]);
#else
		for (int64_t c = 0; c < V; c++)
			mx = get(lr, l16, c) > mx ? get(lr, l16, c) : mx;
		for (int64_t c = 0; c < V; c++) {
			float p = expf(get(lr, l16, c) - mx);
			if (pr)
				pr[c] = p;
			sum += p;
		}
#endif
		rmax[r] = mx;
		rsum[r] = sum;
	}
}

void st_xent_rows_exp(float *l, float *rmax, double *rsum, float *tlogit, const int32_t *targets,
		      int64_t v0, int64_t nr, int64_t V)
{
	xent_rows_exp(l, 0, V, l, rmax, rsum, tlogit, targets, v0, nr, V);
}

void st_xent_rows_exp16(const uint16_t *l, int64_t ld, float *rmax, double *rsum, float *tlogit,
			const int32_t *targets, int64_t v0, int64_t nr, int64_t V)
{
	xent_rows_exp(l, 1, ld, NULL, rmax, rsum, tlogit, targets, v0, nr, V);
}

void st_xent_rows_grad16(uint16_t *l, int64_t ld, const float *rmax, const float *rscale,
			 const int32_t *targets, int64_t v0, int64_t nr, int64_t V, float scale)
{
#pragma omp parallel for schedule(static)
	for (int64_t r = 0; r < nr; r++) {
		uint16_t *lr = l + r * ld;
		int64_t tg = targets ? (int64_t)targets[r] - v0 : -1;
		int has_t = tg >= 0 && tg < V;
		float mx = rmax[r], tval = 0.0f;
#if ST_HAVE_AVX512
		__m512 f = _mm512_set1_ps(rscale[r]), vm = _mm512_set1_ps(mx);
		if (has_t) /* the target's exponential as the loop computes it */
			tval = _mm512_cvtss_f32(st_exp16(_mm512_set1_ps(st_bf16_to_f32(lr[tg]) - mx))) *
				       rscale[r] - scale;
		for (int64_t c = 0; c < V; c += 16) {
			__mmask16 mk = st_mask16(V - c);
			__m512 p = st_exp16(_mm512_sub_ps(st_load16(lr + c, 1, mk), vm));
			st_store16(lr + c, 1, mk, _mm512_mul_ps(p, f));
		}
#elif ST_HAVE_AVX2
		__m256 f = _mm256_set1_ps(rscale[r]), vm = _mm256_set1_ps(mx);
		if (has_t)
			tval = _mm256_cvtss_f32(st_exp8(_mm256_set1_ps(st_bf16_to_f32(lr[tg]) - mx))) *
				       rscale[r] - scale;
		int64_t c = 0;
		for (; c + 8 <= V; c += 8)
			st_store8(lr + c, 1, _mm256_mul_ps(st_exp8(_mm256_sub_ps(st_load8(lr + c, 1), vm)), f));
		for (; c < V; c++) { /* as the vector lanes do */
			float x[8] = {st_bf16_to_f32(lr[c]) - mx};
			lr[c] = st_f32_to_bf16(_mm256_cvtss_f32(st_exp8(_mm256_loadu_ps(x))) * rscale[r]);
		}
#else
		if (has_t)
			tval = expf(st_bf16_to_f32(lr[tg]) - mx) * rscale[r] - scale;
		for (int64_t c = 0; c < V; c++)
			lr[c] = st_f32_to_bf16(expf(st_bf16_to_f32(lr[c]) - mx) * rscale[r]);
#endif
		if (has_t)
			lr[tg] = st_f32_to_bf16(tval);
	}
}

/* dst row r (at dst + r * ldd elements) = l row r * rscale[r], minus scale at
 * the target column; dst is fp32 (may be l itself, ldd = V) or bf16 (may be
 * l itself with ldd = 2V: each row over the first half of its own fp32
 * storage; each block of values is read before its results are stored, and
 * those land on values already read). */
static void xent_rows_grad(void *dst, int bf16, int64_t ldd, const float *l, const float *rscale,
			   const int32_t *targets, int64_t v0, int64_t nr, int64_t V, float scale)
{
	size_t sz = bf16 ? 2 : 4;
#pragma omp parallel for schedule(static)
	for (int64_t r = 0; r < nr; r++) {
		const float *lr = l + r * V;
		char *dr = (char *)dst + (size_t)(r * ldd) * sz;
		int64_t tg = targets ? (int64_t)targets[r] - v0 : -1;
		float tval = tg >= 0 && tg < V ? lr[tg] * rscale[r] - scale : 0.0f;
#if ST_HAVE_AVX512
		__m512 f = _mm512_set1_ps(rscale[r]);
		for (int64_t c = 0; c < V; c += 16) {
			__mmask16 mk = st_mask16(V - c);
			st_store16(dr + c * sz, bf16, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, lr + c), f));
		}
		if (tg >= 0 && tg < V)
			put(dr, bf16, tg, tval);
#elif ST_HAVE_AVX2
		/* stores in increasing c, each after its loads (dst may overlay l) */
		__m256 f = _mm256_set1_ps(rscale[r]);
		int64_t c = 0;
		for (; c + 8 <= V; c += 8)
			st_store8(dr + c * sz, bf16, _mm256_mul_ps(_mm256_loadu_ps(lr + c), f));
		for (; c < V; c++) {
			float v = lr[c] * rscale[r];
			uint16_t h = st_f32_to_bf16(v);
			memcpy(dr + (size_t)c * sz, bf16 ? (const void *)&h : (const void *)&v, sz);
		}
		if (tg >= 0 && tg < V)
			put(dr, bf16, tg, tval);
#else
		for (int64_t c = 0; c < V; c++) {
			/* stored through memcpy: the compiler must keep each store
			 * after the loads before it (dst may overlay l) */
			float v = c == tg ? tval : lr[c] * rscale[r];
			uint16_t h = st_f32_to_bf16(v);
			memcpy(dr + (size_t)c * sz, bf16 ? (const void *)&h : (const void *)&v, sz);
		}
#endif
	}
}

void st_xent_rows_grad(float *l, const float *rscale, const int32_t *targets, int64_t v0,
		       int64_t nr, int64_t V, float scale)
{
	xent_rows_grad(l, 0, V, l, rscale, targets, v0, nr, V, scale);
}

void st_xent_rows_grad_bf16(uint16_t *out, int64_t ldo, const float *l, const float *rscale,
			    const int32_t *targets, int64_t v0, int64_t nr, int64_t V, float scale)
{
	xent_rows_grad(out, 1, ldo, l, rscale, targets, v0, nr, V, scale);
}

/* The output layer's workspace: a chunk of logits, then per row the sum of
 * exponentials, the max, the target logit and the gradient factor. Placed at
 * base, or only counted (base NULL); returns its bytes. */
typedef struct lm_ws {
	float *logits, *rmax, *tlog, *rsc;
	double *rsum;
} lm_ws;

static size_t lm_ws_layout(lm_ws *l, char *base, int64_t V, int64_t chunk_rows)
{
	size_t off = 0, R = (size_t)chunk_rows;
	l->logits = st_ws_take(base, &off, R * (size_t)V * sizeof(float));
	l->rsum = st_ws_take(base, &off, R * sizeof(double));
	l->rmax = st_ws_take(base, &off, R * sizeof(float));
	l->tlog = st_ws_take(base, &off, R * sizeof(float));
	l->rsc = st_ws_take(base, &off, R * sizeof(float));
	return off;
}

size_t st_lm_head_workspace_bytes(int64_t V, int64_t chunk_rows)
{
	lm_ws l;
	return lm_ws_layout(&l, NULL, V, chunk_rows);
}

int st_lm_head_products(int64_t N, int64_t E, int64_t V, int64_t chunk_rows, st_gemm_shape out[6])
{
	int n = 0;
	int64_t last = chunk_rows > 0 ? N % chunk_rows : 0;
	for (int c = 0; c < 2; c++) {
		int64_t r = c == 0 ? (chunk_rows < N ? chunk_rows : N) : last;
		if (r <= 0 || (c == 1 && n > 0 && r == out[0].M))
			continue;
		out[n++] = (st_gemm_shape){ST_GEMM_F32, 'N', 'T', r, V, E}; /* logits */
		out[n++] = (st_gemm_shape){ST_GEMM_F32, 'N', 'N', r, E, V}; /* dx */
		out[n++] = (st_gemm_shape){ST_GEMM_F32, 'T', 'N', V, E, r}; /* dW */
	}
	return n;
}

static int lm_head(double *loss_sum, float *dx, float *dW, const float *x, const float *W,
		   const int32_t *targets, int64_t N, int64_t E, int64_t V, float scale,
		   int64_t chunk_rows, const st_ws *ws, st_kctx *kc)
{
	lm_ws l;
	int rc = st_ws_check(ws, lm_ws_layout(&l, NULL, V, chunk_rows),
			     dx ? "st_lm_head_xent" : "st_lm_head_loss");
	if (rc < 0)
		return rc;
	lm_ws_layout(&l, ws->mem, V, chunk_rows);
	float *scratch = l.logits, *rmax = l.rmax, *tlog = l.tlog, *rsc = l.rsc;
	double *rsum = l.rsum, total = 0;
	for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
		int64_t nr = N - r0 < chunk_rows ? N - r0 : chunk_rows;
		rc = st_gemm('N', 'T', nr, V, E, 1.0f, x + r0 * E, E, W, E, 0.0f, scratch, V, kc);
		if (rc < 0)
			break;
		st_xent_rows_exp(scratch, rmax, rsum, tlog, targets + r0, 0, nr, V);
		for (int64_t r = 0; r < nr; r++) {
			total += (double)rmax[r] + log(rsum[r]) - (double)tlog[r];
			rsc[r] = (float)((double)scale / rsum[r]);
		}
		if (!dx)
			continue;
		st_xent_rows_grad(scratch, rsc, targets + r0, 0, nr, V, scale);
		rc = st_gemm('N', 'N', nr, E, V, 1.0f, scratch, V, W, E, 0.0f, dx + r0 * E, E, kc);
		if (rc == 0)
			rc = st_gemm('T', 'N', V, E, nr, 1.0f, scratch, V, x + r0 * E, E, 1.0f, dW, E, kc);
		if (rc < 0)
			break;
	}
	if (rc == 0)
		*loss_sum += total;
	return rc;
}

int st_lm_head_xent(double *loss_sum, float *dx, float *dW, const float *x, const float *W,
		    const int32_t *targets, int64_t N, int64_t E, int64_t V, float scale,
		    int64_t chunk_rows, const st_ws *ws, st_kctx *kc)
{
	return lm_head(loss_sum, dx, dW, x, W, targets, N, E, V, scale, chunk_rows, ws, kc);
}

int st_lm_head_loss(double *loss_sum, const float *x, const float *W, const int32_t *targets,
		    int64_t N, int64_t E, int64_t V, int64_t chunk_rows, const st_ws *ws,
		    st_kctx *kc)
{
	return lm_head(loss_sum, NULL, NULL, x, W, targets, N, E, V, 0.0f, chunk_rows, ws, kc);
}
