#include "optim/adamw.h"

#include <math.h>
#include <stdlib.h>

#include "base/crc.h"
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

struct adamw_k {
	float b1, b2, c1, c2, lr, eps, wd, gs;
};

/* Elements [i0, i1) of the update. */
static void update_range(float *p, uint16_t *pb, const float *g, float *m, float *v, int64_t i0, int64_t i1,
			 const struct adamw_k *k)
{
	float b1 = k->b1, b2 = k->b2, c1 = k->c1, c2 = k->c2, lr = k->lr, eps = k->eps, wd = k->wd, gs = k->gs;
	int64_t i = i0, conv = i0; /* pb written from conv on after the loops */
#if ST_HAVE_AVX512
	/* the bf16 copy rounded as each vector is updated, and streamed past
	 * the caches where aligned: nothing reads it before the next step's
	 * forward, and a plain store would first read its lines from DRAM */
	int stream = pb && ((uintptr_t)(pb + i0) & 31) == 0;
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
		__m512 np = _mm512_sub_ps(pi, _mm512_mul_ps(vlr, u));
		_mm512_storeu_ps(p + i, np);
		if (stream)
			_mm256_stream_si256((__m256i *)(pb + i), st_cvt_bf16_16(np));
		else if (pb)
			_mm256_storeu_si256((__m256i *)(pb + i), st_cvt_bf16_16(np));
	}
	conv = i;
	if (stream)
		_mm_sfence(); /* the streamed stores ordered before what follows */
#elif ST_HAVE_AVX2
	/* the same, 8 lanes at a time */
	__m256 vb1 = _mm256_set1_ps(b1), vb2 = _mm256_set1_ps(b2);
	__m256 va1 = _mm256_set1_ps(1.0f - b1), va2 = _mm256_set1_ps(1.0f - b2);
	__m256 vc1 = _mm256_set1_ps(c1), vc2 = _mm256_set1_ps(c2), vlr = _mm256_set1_ps(lr);
	__m256 veps = _mm256_set1_ps(eps), vwd = _mm256_set1_ps(wd), vgs = _mm256_set1_ps(gs);
	for (; i + 8 <= i1; i += 8) {
		__m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g + i), vgs);
		__m256 mi = _mm256_add_ps(_mm256_mul_ps(vb1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(va1, gi));
		__m256 vi = _mm256_add_ps(_mm256_mul_ps(vb2, _mm256_loadu_ps(v + i)),
					  _mm256_mul_ps(_mm256_mul_ps(va2, gi), gi));
		_mm256_storeu_ps(m + i, mi);
		_mm256_storeu_ps(v + i, vi);
		__m256 pi = _mm256_loadu_ps(p + i);
		__m256 u = _mm256_div_ps(_mm256_mul_ps(mi, vc1),
					 _mm256_add_ps(_mm256_sqrt_ps(_mm256_mul_ps(vi, vc2)), veps));
		u = _mm256_add_ps(u, _mm256_mul_ps(vwd, pi));
		_mm256_storeu_ps(p + i, _mm256_sub_ps(pi, _mm256_mul_ps(vlr, u)));
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
		st_f32_to_bf16_serial(pb + conv, p + conv, i1 - conv);
}

/*
 * The checksums' bookkeeping: the ranges cut at the update's blocks into
 * parts, numbered block by block (a block's parts in range order): block b's
 * first part is sub0[b], of range first[b]. ST_ENOMEM.
 */
struct crc_parts {
	int64_t *first, *sub0, nsub;
	uint32_t *crc; /* [3][nsub] */
};

static int64_t rmin(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t rmax(int64_t a, int64_t b) { return a > b ? a : b; }

static int crc_parts_plan(struct crc_parts *cp, const st_adamw_crc *c, int64_t n, int64_t nb)
{
	*cp = (struct crc_parts){0};
	cp->first = malloc((size_t)(nb + 1) * sizeof(*cp->first));
	cp->sub0 = malloc((size_t)(nb + 1) * sizeof(*cp->sub0));
	if (!cp->first || !cp->sub0)
		return st_fail(ST_ENOMEM, "out of memory (update checksums)");
	int64_t r = 0, ns = 0;
	for (int64_t b = 0; b < nb; b++) {
		int64_t i0 = b * UPDATE_BLOCK, i1 = rmin(i0 + UPDATE_BLOCK, n);
		while (r < c->nranges && c->start[r] + c->len[r] <= i0)
			r++;
		cp->first[b] = r;
		cp->sub0[b] = ns;
		for (int64_t q = r; q < c->nranges && c->start[q] < i1; q++)
			ns++;
	}
	cp->first[nb] = r;
	cp->sub0[nb] = cp->nsub = ns;
	if (!(cp->crc = malloc((size_t)(3 * ns + 1) * sizeof(*cp->crc))))
		return st_fail(ST_ENOMEM, "out of memory (update checksums)");
	return 0;
}

/* The parts of block b [i0, i1): arrays p, m, v, each part's CRC-32. */
static void crc_block(const struct crc_parts *cp, const st_adamw_crc *c, int64_t b, int64_t i0, int64_t i1,
		      const float *const arr[3])
{
	int64_t s = cp->sub0[b];
	for (int64_t q = cp->first[b]; q < c->nranges && c->start[q] < i1; q++) {
		int64_t a = rmax(c->start[q], i0), e = rmin(c->start[q] + c->len[q], i1);
		for (int k = 0; k < 3; k++)
			cp->crc[k * cp->nsub + s] = st_crc32(0, arr[k] + a, (size_t)(e - a) * sizeof(float));
		s++;
	}
}

/* Each range's CRC-32: its parts combined in order. */
static void crc_combine(const struct crc_parts *cp, const st_adamw_crc *c)
{
	uint32_t op = st_crc32_combine_gen((uint64_t)UPDATE_BLOCK * sizeof(float));
	for (int q = 0; q < c->nranges; q++) {
		int64_t s0 = c->start[q], s1 = s0 + c->len[q];
		uint32_t acc[3] = {0, 0, 0};
		for (int64_t b = s0 / UPDATE_BLOCK; b * UPDATE_BLOCK < s1; b++) {
			int64_t a = rmax(s0, b * UPDATE_BLOCK), e = rmin(s1, (b + 1) * UPDATE_BLOCK);
			int64_t s = cp->sub0[b] + (q - cp->first[b]);
			uint64_t bytes = (uint64_t)(e - a) * sizeof(float);
			for (int k = 0; k < 3; k++) {
				uint32_t part = cp->crc[k * cp->nsub + s];
				acc[k] = a == s0 ? part
					 : bytes == (uint64_t)UPDATE_BLOCK * sizeof(float)
					     ? st_crc32_combine_op(acc[k], part, op)
					     : st_crc32_combine(acc[k], part, bytes);
			}
		}
		for (int k = 0; k < 3; k++)
			c->crc[k * c->nranges + q] = acc[k];
	}
}

int st_adamw_update_crc(float *p, uint16_t *pb, const float *g, float *m, float *v, int64_t n, const st_adamw *h,
			const st_adamw_crc *crc)
{
	struct adamw_k k = {
		.b1 = (float)h->b1, .b2 = (float)h->b2,
		.c1 = (float)(1.0 / (1.0 - pow(h->b1, (double)h->t))),
		.c2 = (float)(1.0 / (1.0 - pow(h->b2, (double)h->t))),
		.lr = (float)h->lr, .eps = (float)h->eps, .wd = (float)h->wd, .gs = h->grad_scale,
	};
	int64_t nb = (n + UPDATE_BLOCK - 1) / UPDATE_BLOCK;
	struct crc_parts cp = {0};
	int rc = 0;
	if (crc) {
		for (int q = 0; q < crc->nranges; q++)
			if (crc->len[q] <= 0 || crc->start[q] < (q ? crc->start[q - 1] + crc->len[q - 1] : 0) ||
			    crc->start[q] + crc->len[q] > n)
				return st_fail(ST_EINVAL, "update checksums: range %d [%lld, +%lld) is empty, or not sorted, "
					       "disjoint and inside the %lld parameters", q, (long long)crc->start[q],
					       (long long)crc->len[q], (long long)n);
		if ((rc = crc_parts_plan(&cp, crc, n, nb)) < 0)
			goto out;
	}
	const float *const arr[3] = {p, m, v};
#pragma omp parallel for schedule(static)
	for (int64_t b = 0; b < nb; b++) {
		int64_t i0 = b * UPDATE_BLOCK, i1 = rmin(i0 + UPDATE_BLOCK, n);
		update_range(p, pb, g, m, v, i0, i1, &k);
		if (crc) /* while the block is still in cache */
			crc_block(&cp, crc, b, i0, i1, arr);
	}
	if (crc)
		crc_combine(&cp, crc);
out:
	free(cp.first);
	free(cp.sub0);
	free(cp.crc);
	return rc;
}

void st_adamw_update_bf16(float *p, uint16_t *pb, const float *g, float *m, float *v, int64_t n,
			  const st_adamw *h)
{
	st_adamw_update_crc(p, pb, g, m, v, n, h, NULL);
}

void st_adamw_update(float *p, const float *g, float *m, float *v, int64_t n, const st_adamw *h)
{
	st_adamw_update_bf16(p, NULL, g, m, v, n, h);
}
