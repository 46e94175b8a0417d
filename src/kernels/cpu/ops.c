#include "kernels/cpu/ops.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "kernels/cpu/gemm.h"

/* Rows per partial sum in weight-gradient reductions: fixed, so the summation
 * order (and so the result) is the same for any thread count. */
#define RED_ROWS 64

void st_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int64_t N,
			int64_t C, float eps)
{
#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < N; i++) {
		const float *xi = x + i * C;
		float *oi = out + i * C;
		double ss = 0;
		for (int64_t c = 0; c < C; c++)
			ss += (double)xi[c] * xi[c];
		float r = (float)(1.0 / sqrt(ss / (double)C + eps));
		rstd[i] = r;
		for (int64_t c = 0; c < C; c++)
			oi[c] = xi[c] * r * w[c];
	}
}

void st_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
			 const float *rstd, int64_t N, int64_t C)
{
	int64_t nchunks = (N + RED_ROWS - 1) / RED_ROWS;
	float *part = calloc((size_t)(nchunks * C), sizeof(float));
	if (!part)
		ST_BUG("out of memory in rmsnorm backward");
#pragma omp parallel for schedule(static)
	for (int64_t ch = 0; ch < nchunks; ch++) {
		float *p = part + ch * C;
		int64_t end = (ch + 1) * RED_ROWS < N ? (ch + 1) * RED_ROWS : N;
		for (int64_t i = ch * RED_ROWS; i < end; i++) {
			const float *xi = x + i * C, *gi = dout + i * C;
			float *dxi = dx + i * C;
			float r = rstd[i];
			double dot = 0; /* sum_c g_c w_c xhat_c */
			for (int64_t c = 0; c < C; c++) {
				float xhat = xi[c] * r;
				dot += (double)gi[c] * w[c] * xhat;
				p[c] += gi[c] * xhat;
			}
			float m = (float)(dot / (double)C);
			for (int64_t c = 0; c < C; c++)
				dxi[c] += r * (gi[c] * w[c] - xi[c] * r * m);
		}
	}
#pragma omp parallel for schedule(static)
	for (int64_t c = 0; c < C; c++) {
		float s = 0;
		for (int64_t ch = 0; ch < nchunks; ch++)
			s += part[ch * C + c];
		dw[c] += s;
	}
	free(part);
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
			for (int64_t i = 0; i < half; i++) {
				float a = v[i], b = v[i + half], si = sign * s[i];
				v[i] = a * c[i] - b * si;
				v[i + half] = b * c[i] + a * si;
			}
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

static inline float dotf(const float *a, const float *b, int64_t n)
{
	float s = 0;
	for (int64_t i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

void st_attention_forward(float *out, float *lse, const float *q, const float *k,
			  const float *v, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D)
{
	int64_t group = H / K;
	float scale = (float)(1.0 / sqrt((double)D));
#pragma omp parallel
	{
		float *s = malloc((size_t)T * sizeof(float));
		if (!s)
			ST_BUG("out of memory in attention");
#pragma omp for schedule(dynamic, 8)
		for (int64_t bhi = 0; bhi < B * H * T; bhi++) {
			int64_t b = bhi / (H * T), h = (bhi / T) % H, i = bhi % T;
			int64_t kh = h / group;
			const float *qi = q + ((b * T + i) * H + h) * D;
			float mx = -INFINITY;
			for (int64_t j = 0; j <= i; j++) {
				s[j] = scale * dotf(qi, k + ((b * T + j) * K + kh) * D, D);
				mx = s[j] > mx ? s[j] : mx;
			}
			float sum = 0;
			for (int64_t j = 0; j <= i; j++) {
				s[j] = expf(s[j] - mx);
				sum += s[j];
			}
			float inv = 1.0f / sum;
			float *oi = out + ((b * T + i) * H + h) * D;
			memset(oi, 0, (size_t)D * sizeof(float));
			for (int64_t j = 0; j <= i; j++) {
				const float *vj = v + ((b * T + j) * K + kh) * D;
				float p = s[j] * inv;
				for (int64_t d = 0; d < D; d++)
					oi[d] += p * vj[d];
			}
			lse[(b * H + h) * T + i] = mx + logf(sum);
		}
		free(s);
	}
}

void st_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
			   const float *lse, const float *q, const float *k, const float *v,
			   int64_t B, int64_t T, int64_t H, int64_t K, int64_t D)
{
	int64_t group = H / K;
	float scale = (float)(1.0 / sqrt((double)D));
	/* One task per (batch, kv head): it owns dk and dv of that head, so the
	 * accumulation over queries runs in a fixed order without atomics. */
#pragma omp parallel for schedule(dynamic, 1)
	for (int64_t bk = 0; bk < B * K; bk++) {
		int64_t b = bk / K, kh = bk % K;
		for (int64_t j = 0; j < T; j++) {
			memset(dk + ((b * T + j) * K + kh) * D, 0, (size_t)D * sizeof(float));
			memset(dv + ((b * T + j) * K + kh) * D, 0, (size_t)D * sizeof(float));
		}
		for (int64_t h = kh * group; h < (kh + 1) * group; h++) {
			for (int64_t i = 0; i < T; i++) {
				int64_t row = (b * T + i) * H + h;
				const float *qi = q + row * D, *doi = dout + row * D;
				float *dqi = dq + row * D;
				float L = lse[(b * H + h) * T + i];
				float Di = dotf(doi, out + row * D, D);
				memset(dqi, 0, (size_t)D * sizeof(float));
				for (int64_t j = 0; j <= i; j++) {
					int64_t kr = ((b * T + j) * K + kh) * D;
					const float *kj = k + kr, *vj = v + kr;
					float p = expf(scale * dotf(qi, kj, D) - L);
					float ds = p * (dotf(doi, vj, D) - Di) * scale;
					float *dkj = dk + kr, *dvj = dv + kr;
					for (int64_t d = 0; d < D; d++) {
						dqi[d] += ds * kj[d];
						dkj[d] += ds * qi[d];
						dvj[d] += p * doi[d];
					}
				}
			}
		}
	}
}

void st_swiglu_forward(float *act, const float *gate, const float *up, int64_t n)
{
#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < n; i++) {
		float g = gate[i];
		act[i] = g / (1.0f + expf(-g)) * up[i];
	}
}

void st_swiglu_backward(float *dgate, float *dup, const float *dact, const float *gate,
			const float *up, int64_t n)
{
#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < n; i++) {
		float g = gate[i];
		float da = dact[i], u = up[i]; /* read first: outputs may alias inputs */
		float sg = 1.0f / (1.0f + expf(-g));
		dup[i] = da * g * sg;
		dgate[i] = da * u * sg * (1.0f + g * (1.0f - sg));
	}
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
			for (int64_t c = c0; c < c1; c++)
				d[c] += g[c];
		}
	}
}

/* Logits of rows [r0, r0+nr) into scratch, then per row: softmax, loss. When
 * scale != 0, scratch becomes scale * (softmax - onehot). Row losses go to
 * rowloss[0..nr) for an in-order sum. */
static int xent_chunk(double *rowloss, float *scratch, const float *x, const float *W,
		      const int32_t *targets, int64_t r0, int64_t nr, int64_t E, int64_t V,
		      float scale)
{
	int rc = st_gemm('N', 'T', nr, V, E, 1.0f, x + r0 * E, E, W, E, 0.0f, scratch, V);
	if (rc < 0)
		return rc;
#pragma omp parallel for schedule(static)
	for (int64_t r = 0; r < nr; r++) {
		float *l = scratch + r * V;
		float mx = -INFINITY;
		for (int64_t c = 0; c < V; c++)
			mx = l[c] > mx ? l[c] : mx;
		double sum = 0;
		for (int64_t c = 0; c < V; c++)
			sum += exp((double)(l[c] - mx));
		double lse = mx + log(sum);
		int32_t tg = targets[r0 + r];
		rowloss[r] = lse - (double)l[tg];
		if (scale != 0.0f) {
			for (int64_t c = 0; c < V; c++)
				l[c] = scale * (float)exp((double)l[c] - lse);
			l[tg] -= scale;
		}
	}
	return 0;
}

static int lm_head(double *loss_sum, float *dx, float *dW, const float *x, const float *W,
		   const int32_t *targets, int64_t N, int64_t E, int64_t V, float scale,
		   float *scratch, int64_t chunk_rows)
{
	double *rowloss = malloc((size_t)chunk_rows * sizeof(double));
	if (!rowloss)
		return st_fail(ST_ENOMEM, "out of memory (cross-entropy rows)");
	int rc = 0;
	double total = 0;
	for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
		int64_t nr = N - r0 < chunk_rows ? N - r0 : chunk_rows;
		rc = xent_chunk(rowloss, scratch, x, W, targets, r0, nr, E, V, dx ? scale : 0.0f);
		if (rc < 0)
			break;
		for (int64_t r = 0; r < nr; r++)
			total += rowloss[r];
		if (!dx)
			continue;
		rc = st_gemm('N', 'N', nr, E, V, 1.0f, scratch, V, W, E, 0.0f, dx + r0 * E, E);
		if (rc == 0)
			rc = st_gemm('T', 'N', V, E, nr, 1.0f, scratch, V, x + r0 * E, E, 1.0f, dW, E);
		if (rc < 0)
			break;
	}
	free(rowloss);
	if (rc == 0)
		*loss_sum += total;
	return rc;
}

int st_lm_head_xent(double *loss_sum, float *dx, float *dW, const float *x, const float *W,
		    const int32_t *targets, int64_t N, int64_t E, int64_t V, float scale,
		    float *scratch, int64_t chunk_rows)
{
	return lm_head(loss_sum, dx, dW, x, W, targets, N, E, V, scale, scratch, chunk_rows);
}

int st_lm_head_loss(double *loss_sum, const float *x, const float *W, const int32_t *targets,
		    int64_t N, int64_t E, int64_t V, float *scratch, int64_t chunk_rows)
{
	return lm_head(loss_sum, NULL, NULL, x, W, targets, N, E, V, 0.0f, scratch, chunk_rows);
}
