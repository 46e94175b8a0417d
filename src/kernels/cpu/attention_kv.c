/*
 * attention_kv.c - attention of new queries over a key/value cache
 * (attention_kv.h). Decoding reads the whole cache once per new token, a
 * (len, D) matrix-vector product each way, so this is two plain passes per
 * (query, head) rather than the training kernels' tiles: scores against
 * every cached key, then the probabilities' weighted sum of the values.
 * AVX-512 for the length-D vectors when D is a multiple of 16, plain loops
 * otherwise; either way one fixed order of operations per output.
 */
#include "kernels/cpu/attention_kv.h"

#include <math.h>
#include <omp.h>

#include "base/err.h"
#include "kernels/cpu/simd.h"

size_t st_attention_kv_workspace_bytes(int64_t cap, int threads)
{
	return (size_t)(threads > 0 ? threads : 1) * st_ws_round((size_t)cap * sizeof(float));
}

static float dot(const float *a, const float *b, int64_t D)
{
#if ST_HAVE_AVX512
	if (D % 16 == 0) {
		__m512 acc = _mm512_setzero_ps();
		for (int64_t d = 0; d < D; d += 16)
			acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), acc);
		return _mm512_reduce_add_ps(acc);
	}
#endif
	float s = 0;
	for (int64_t d = 0; d < D; d++)
		s += a[d] * b[d];
	return s;
}

/* out (D) = sum_t p[t] v[t] */
static void weighted_sum(float *out, const float *p, const float *v, int64_t len, int64_t D)
{
#if ST_HAVE_AVX512
	if (D % 16 == 0) {
		for (int64_t d = 0; d < D; d += 16) {
			__m512 acc = _mm512_setzero_ps();
			for (int64_t t = 0; t < len; t++)
				acc = _mm512_fmadd_ps(_mm512_set1_ps(p[t]), _mm512_loadu_ps(v + t * D + d), acc);
			_mm512_storeu_ps(out + d, acc);
		}
		return;
	}
#endif
	for (int64_t d = 0; d < D; d++)
		out[d] = 0;
	for (int64_t t = 0; t < len; t++)
		for (int64_t d = 0; d < D; d++)
			out[d] += p[t] * v[t * D + d];
}

int st_attention_kv_forward(float *out, const float *q, const float *kc, const float *vc, int64_t cap,
			    int64_t p0, int64_t n, int64_t H, int64_t K, int64_t D, const st_ws *ws)
{
	int threads = st_ws_threads(ws);
	size_t slice = st_ws_round((size_t)cap * sizeof(float));
	int rc = st_ws_check(ws, st_attention_kv_workspace_bytes(cap, threads), "st_attention_kv_forward");
	if (rc < 0)
		return rc;
	if (p0 < 0 || n < 0 || p0 + n > cap || H % K)
		return st_fail(ST_EINVAL, "st_attention_kv_forward: positions %lld..%lld of a cache of %lld, %lld heads "
			       "over %lld kv heads", (long long)p0, (long long)(p0 + n), (long long)cap, (long long)H,
			       (long long)K);
	float scale = (float)(1.0 / sqrt((double)D));
	int64_t group = H / K;
#pragma omp parallel num_threads(threads)
	{
		float *p = (float *)((char *)ws->mem + (size_t)omp_get_thread_num() * slice);
#pragma omp for schedule(static)
		for (int64_t task = 0; task < n * H; task++) {
			int64_t i = task / H, h = task % H, len = p0 + i + 1;
			const float *qv = q + task * D;
			const float *k = kc + (h / group) * cap * D, *v = vc + (h / group) * cap * D;
			float mx = -INFINITY, sum = 0;
			for (int64_t t = 0; t < len; t++) {
				p[t] = dot(qv, k + t * D, D) * scale;
				mx = p[t] > mx ? p[t] : mx;
			}
			for (int64_t t = 0; t < len; t++) {
				p[t] = expf(p[t] - mx);
				sum += p[t];
			}
			float inv = 1.0f / sum;
			for (int64_t t = 0; t < len; t++)
				p[t] *= inv;
			weighted_sum(out + task * D, p, v, len, D);
		}
	}
	return 0;
}
