#include "optim/adamw.h"

#include <math.h>
#include <stdlib.h>

#include "base/err.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/simd.h"

double st_lr_at(const st_config *c, int64_t step)
{
	int64_t len = c->learning_rate_schedule_steps;
	double lr = c->learning_rate, final = lr * c->learning_rate_final_fraction;
	int64_t warm = (int64_t)floor((double)len * c->warmup_steps_fraction);
	if (step >= len)
		return 0.0;
	if (step < warm)
		return lr * (double)step / (double)warm;
	int64_t cos_len = len - warm; /* >= 1 here, since warm <= step < len */
	double pct = (double)(step - warm) / (double)cos_len;
	double a = 0.5 * (cos(M_PI * pct) + 1.0);
	return lr * a + final * (1.0 - a);
}

#define NORM_BLOCK 4096

double st_global_norm(const float *g, int64_t n) { return sqrt(st_sum_squares(g, n)); }

double st_sum_squares(const float *g, int64_t n)
{
	int64_t nb = (n + NORM_BLOCK - 1) / NORM_BLOCK;
	double *part = malloc((size_t)(nb > 0 ? nb : 1) * sizeof(double));
	if (!part)
		ST_BUG("out of memory in global norm");
#pragma omp parallel for schedule(static)
	for (int64_t b = 0; b < nb; b++) {
		double s = 0;
		int64_t end = (b + 1) * NORM_BLOCK < n ? (b + 1) * NORM_BLOCK : n;
		/* vector lanes in a fixed pattern: the same result for any thread count */
#pragma omp simd reduction(+ : s)
		for (int64_t i = b * NORM_BLOCK; i < end; i++)
			s += (double)g[i] * g[i];
		part[b] = s;
	}
	double s = 0;
	for (int64_t b = 0; b < nb; b++)
		s += part[b];
	free(part);
	return s;
}

/* Elements per parallel block of the update (fixed: each element's result
 * depends only on its own values, so any partition gives the same bits). */
#define UPDATE_BLOCK 16384

void st_adamw_update_bf16(float *p, uint16_t *pb, const float *g, float *m, float *v, int64_t n,
			  const st_adamw *h)
{
	float b1 = (float)h->b1, b2 = (float)h->b2;
	float c1 = (float)(1.0 / (1.0 - pow(h->b1, (double)h->t)));
	float c2 = (float)(1.0 / (1.0 - pow(h->b2, (double)h->t)));
	float lr = (float)h->lr, eps = (float)h->eps, wd = (float)h->wd, gs = h->grad_scale;
	int64_t nb = (n + UPDATE_BLOCK - 1) / UPDATE_BLOCK;
#pragma omp parallel for schedule(static)
	for (int64_t b = 0; b < nb; b++) {
		int64_t i0 = b * UPDATE_BLOCK, i1 = i0 + UPDATE_BLOCK < n ? i0 + UPDATE_BLOCK : n;
		int64_t i = i0;
#if ST_HAVE_AVX512
		/* the scalar loop below, 16 lanes at a time, the same IEEE operations
		 * in the same order (GCC does not vectorize it: sqrtf and errno) */
		__m512 vb1 = _mm512_set1_ps(b1), vb2 = _mm512_set1_ps(b2);
		__m512 va1 = _mm512_set1_ps(1.0f - b1), va2 = _mm512_set1_ps(1.0f - b2);
		__m512 vc1 = _mm512_set1_ps(c1), vc2 = _mm512_set1_ps(c2), vlr = _mm512_set1_ps(lr);
		__m512 veps = _mm512_set1_ps(eps), vwd = _mm512_set1_ps(wd), vgs = _mm512_set1_ps(gs);
		for (; i + 16 <= i1; i += 16) {
			__m512 gi = _mm512_mul_ps(_mm512_loadu_ps(g + i), vgs);
			__m512 mi = _mm512_add_ps(_mm512_mul_ps(vb1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(va1, gi));
			__m512 vi = _mm512_add_ps(_mm512_mul_ps(vb2, _mm512_loadu_ps(v + i)),
						  _mm512_mul_ps(_mm512_mul_ps(va2, gi), gi));
			_mm512_storeu_ps(m + i, mi);
			_mm512_storeu_ps(v + i, vi);
			__m512 pi = _mm512_loadu_ps(p + i);
			__m512 u = _mm512_div_ps(_mm512_mul_ps(mi, vc1),
						 _mm512_add_ps(_mm512_sqrt_ps(_mm512_mul_ps(vi, vc2)), veps));
			u = _mm512_add_ps(u, _mm512_mul_ps(vwd, pi));
			_mm512_storeu_ps(p + i, _mm512_sub_ps(pi, _mm512_mul_ps(vlr, u)));
		}
#endif
		for (; i < i1; i++) {
			float gi = g[i] * gs;
			float mi = b1 * m[i] + (1.0f - b1) * gi;
			float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
			m[i] = mi;
			v[i] = vi;
			p[i] -= lr * ((mi * c1) / (sqrtf(vi * c2) + eps) + wd * p[i]);
		}
		if (pb) /* while the block is still in cache */
			st_f32_to_bf16_serial(pb + i0, p + i0, i1 - i0);
	}
}

void st_adamw_update(float *p, const float *g, float *m, float *v, int64_t n, const st_adamw *h)
{
	st_adamw_update_bf16(p, NULL, g, m, v, n, h);
}
