/*
 * Causal grouped-query attention, tiled ("flash") on CPU.
 *
 * Queries and keys are cut into blocks of BQ and BK rows. A tile is one
 * (query block, key block) pair of one head: its scores S = scale * Q K^T
 * (BQ x BK) live in a per-thread buffer and nothing of size (T, T) is ever
 * allocated.
 *
 * Forward, one task per (batch, head, query block): walk the key blocks up to
 * the diagonal with an online softmax (running row max m and sum l; the
 * output accumulator is rescaled when m grows), then O /= l and
 * lse = m + log l is kept for backward.
 *
 * Backward recomputes each tile: P = exp(S - lse), dP = dO V^T,
 * dS = scale * P o (dP - rowsum(dO o O)), then dV_j += P^T dO_i,
 * dK_j += dS^T Q_i, dQ_i += dS K_j. Two partitions compute exactly the same
 * floating-point operations in the same order for every output element:
 *   fused: one task per (batch, kv head) owns dK, dV of that head and dQ of
 *          its query heads (5 tile products per tile);
 *   split: one pass of tasks per (batch, head, query block) for dQ, then one
 *          per (batch, kv head, key block) for dK and dV (7 products per
 *          tile, but B*H*T/BQ tasks instead of B*K).
 * dQ_i sums key blocks in increasing order; dK_j and dV_j sum (head, query
 * block) in increasing order. The partition is picked from the amount of
 * parallelism only, and both give bit-identical results, so the output does
 * not depend on the thread count (tests/test_kernels.c checks both).
 *
 * The tile products are AVX-512 micro-kernels (4 rows x 64 columns of fp32
 * accumulators) when head_dim is a multiple of 16, plain loops otherwise.
 * K (and V, in backward) are first transposed per (batch, kv head) into
 * (D, Tpad) arrays so score tiles read contiguous key vectors.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/simd.h"

#define BQ 64
#define BK 64

static int split_mode; /* 0 auto, 1 fused, 2 split (tests) */

void st_attention_set_partition(int mode) { split_mode = mode; }

typedef struct attn {
	int64_t B, T, H, K, D, group, Tpad, nb;
	float scale;
	int vec; /* AVX-512 tile kernels */
} attn;

static void attn_init(attn *a, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D)
{
	a->B = B;
	a->T = T;
	a->H = H;
	a->K = K;
	a->D = D;
	a->group = H / K;
	a->nb = (T + BK - 1) / BK;
	a->Tpad = a->nb * BK;
	a->scale = (float)(1.0 / sqrt((double)D));
	a->vec = ST_HAVE_AVX512 && D % 16 == 0;
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p)
		ST_BUG("out of memory in attention (%zu bytes)", n);
	return p;
}

/* xT (B*K, D, Tpad) = x (B, T, K, D) transposed per (batch, kv head), zero
 * columns past T. */
static float *transpose_kv(const attn *a, const float *x)
{
	float *xt = xmalloc((size_t)(a->B * a->K * a->D * a->Tpad) * sizeof(float));
	int64_t D = a->D, T = a->T, K = a->K, Tpad = a->Tpad;
#pragma omp parallel for schedule(static)
	for (int64_t bk = 0; bk < a->B * a->K; bk++) {
		int64_t b = bk / K, kh = bk % K;
		float *dst = xt + bk * D * Tpad;
		for (int64_t t0 = 0; t0 < Tpad; t0 += 16) {
			for (int64_t d = 0; d < D; d++)
				for (int64_t t = t0; t < t0 + 16; t++)
					dst[d * Tpad + t] = t < T ? x[((b * T + t) * K + kh) * D + d] : 0.0f;
		}
	}
	return xt;
}

/* ---- tile products ---- */

/* S (m x BK, ld BK) = scale * A (m x D, ld lda) BT (D x BK, ld ldb). */
static void tile_scores(const attn *a, float *S, const float *A, int64_t lda, int64_t m,
			const float *BT, int64_t ldb)
{
	int64_t D = a->D;
	float scale = a->scale;
#if ST_HAVE_AVX512
	if (a->vec) {
		__m512 vs = _mm512_set1_ps(scale);
		int64_t r = 0;
		for (; r + 4 <= m; r += 4) {
			__m512 c[4][4];
			#pragma GCC unroll 4
			for (int i = 0; i < 4; i++)
				#pragma GCC unroll 4
				for (int j = 0; j < 4; j++)
					c[i][j] = _mm512_setzero_ps();
			const float *a0 = A + r * lda;
			for (int64_t d = 0; d < D; d++) {
				const float *b = BT + d * ldb;
				__m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
				__m512 b2 = _mm512_loadu_ps(b + 32), b3 = _mm512_loadu_ps(b + 48);
				ST_KEEP_IN_REGISTER(b0);
				ST_KEEP_IN_REGISTER(b1);
				ST_KEEP_IN_REGISTER(b2);
				ST_KEEP_IN_REGISTER(b3);
				#pragma GCC unroll 4
				for (int i = 0; i < 4; i++) {
					__m512 x = _mm512_set1_ps(a0[i * lda + d]);
					c[i][0] = _mm512_fmadd_ps(x, b0, c[i][0]);
					c[i][1] = _mm512_fmadd_ps(x, b1, c[i][1]);
					c[i][2] = _mm512_fmadd_ps(x, b2, c[i][2]);
					c[i][3] = _mm512_fmadd_ps(x, b3, c[i][3]);
				}
			}
			#pragma GCC unroll 4
			for (int i = 0; i < 4; i++)
				#pragma GCC unroll 4
				for (int j = 0; j < 4; j++)
					_mm512_storeu_ps(S + (r + i) * BK + 16 * j, _mm512_mul_ps(c[i][j], vs));
		}
		for (; r < m; r++) {
			__m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
			const float *a0 = A + r * lda;
			for (int64_t d = 0; d < D; d++) {
				const float *b = BT + d * ldb;
				__m512 x = _mm512_set1_ps(a0[d]);
				c0 = _mm512_fmadd_ps(x, _mm512_loadu_ps(b), c0);
				c1 = _mm512_fmadd_ps(x, _mm512_loadu_ps(b + 16), c1);
				c2 = _mm512_fmadd_ps(x, _mm512_loadu_ps(b + 32), c2);
				c3 = _mm512_fmadd_ps(x, _mm512_loadu_ps(b + 48), c3);
			}
			_mm512_storeu_ps(S + r * BK, _mm512_mul_ps(c0, vs));
			_mm512_storeu_ps(S + r * BK + 16, _mm512_mul_ps(c1, vs));
			_mm512_storeu_ps(S + r * BK + 32, _mm512_mul_ps(c2, vs));
			_mm512_storeu_ps(S + r * BK + 48, _mm512_mul_ps(c3, vs));
		}
		return;
	}
#endif
	for (int64_t r = 0; r < m; r++) {
		float *s = S + r * BK;
		for (int64_t j = 0; j < BK; j++)
			s[j] = 0.0f;
		for (int64_t d = 0; d < D; d++) {
			float x = A[r * lda + d];
			const float *b = BT + d * ldb;
			for (int64_t j = 0; j < BK; j++)
				s[j] += x * b[j];
		}
		for (int64_t j = 0; j < BK; j++)
			s[j] *= scale;
	}
}

#if ST_HAVE_AVX512
/* R rows x NV vectors of C += sum_k a(r, k) B[k], a(r, k) = A[r*sr + k*sc]. */
static inline __attribute__((always_inline)) void acc_block(float *C, int64_t ldc,
							     const float *A, int64_t sr,
							     int64_t sc, int64_t kn,
							     const float *Bm, int64_t ldb, int R,
							     int NV)
{
	__m512 c[4][4];
	#pragma GCC unroll 4
	for (int i = 0; i < R; i++)
		#pragma GCC unroll 4
		for (int j = 0; j < NV; j++)
			c[i][j] = _mm512_loadu_ps(C + i * ldc + 16 * j);
	for (int64_t k = 0; k < kn; k++) {
		__m512 b[4];
		#pragma GCC unroll 4
		for (int j = 0; j < NV; j++)
			b[j] = _mm512_loadu_ps(Bm + k * ldb + 16 * j);
#pragma GCC unroll 4
		for (int j = 0; j < NV; j++)
			ST_KEEP_IN_REGISTER(b[j]);
		#pragma GCC unroll 4
		for (int i = 0; i < R; i++) {
			__m512 x = _mm512_set1_ps(A[i * sr + k * sc]);
			#pragma GCC unroll 4
			for (int j = 0; j < NV; j++)
				c[i][j] = _mm512_fmadd_ps(x, b[j], c[i][j]);
		}
	}
	#pragma GCC unroll 4
	for (int i = 0; i < R; i++)
		#pragma GCC unroll 4
		for (int j = 0; j < NV; j++)
			_mm512_storeu_ps(C + i * ldc + 16 * j, c[i][j]);
}
#endif

/*
 * C (m x D, ld ldc) += Amat Bm, Amat (m x kn) read as a(r, k) = A[r*sr + k*sc]
 * (sr = ld, sc = 1: A as stored; sr = 1, sc = ld: A transposed), Bm (kn x D,
 * ld ldb). Each element of C adds its kn terms in increasing k.
 */
static void tile_acc(const attn *a, float *C, int64_t ldc, int64_t m, const float *A, int64_t sr,
		     int64_t sc, int64_t kn, const float *Bm, int64_t ldb)
{
	int64_t D = a->D;
#if ST_HAVE_AVX512
	if (a->vec) {
		for (int64_t d0 = 0; d0 < D; d0 += 64) {
			int nv = D - d0 >= 64 ? 4 : (int)((D - d0) / 16);
			int64_t r = 0;
			for (; r + 4 <= m; r += 4) {
				float *c = C + r * ldc + d0;
				const float *ar = A + r * sr;
				switch (nv) {
				case 4: acc_block(c, ldc, ar, sr, sc, kn, Bm + d0, ldb, 4, 4); break;
				case 3: acc_block(c, ldc, ar, sr, sc, kn, Bm + d0, ldb, 4, 3); break;
				case 2: acc_block(c, ldc, ar, sr, sc, kn, Bm + d0, ldb, 4, 2); break;
				default: acc_block(c, ldc, ar, sr, sc, kn, Bm + d0, ldb, 4, 1); break;
				}
			}
			for (; r < m; r++) {
				float *c = C + r * ldc + d0;
				const float *ar = A + r * sr;
				switch (nv) {
				case 4: acc_block(c, ldc, ar, sr, sc, kn, Bm + d0, ldb, 1, 4); break;
				case 3: acc_block(c, ldc, ar, sr, sc, kn, Bm + d0, ldb, 1, 3); break;
				case 2: acc_block(c, ldc, ar, sr, sc, kn, Bm + d0, ldb, 1, 2); break;
				default: acc_block(c, ldc, ar, sr, sc, kn, Bm + d0, ldb, 1, 1); break;
				}
			}
		}
		return;
	}
#endif
	for (int64_t r = 0; r < m; r++) {
		float *c = C + r * ldc;
		for (int64_t k = 0; k < kn; k++) {
			float x = A[r * sr + k * sc];
			const float *b = Bm + k * ldb;
			for (int64_t d = 0; d < D; d++)
				c[d] += x * b[d];
		}
	}
}

/* Valid keys of row r in tile (query block ib, key block jb): causal and < T. */
static inline int64_t row_limit(const attn *a, int64_t ib, int64_t jb, int64_t r)
{
	int64_t n = a->T - jb * BK < BK ? a->T - jb * BK : BK;
	if (ib == jb && r + 1 < n)
		return r + 1;
	return n;
}

/* ---- forward ---- */

/* One row of a forward tile: s (BK scores) -> p = exp(s - m_new) for the
 * first `lim` keys, 0 after; returns the row sum; updates *m, returns the
 * rescale factor of the old accumulator in *alpha. */
static float softmax_row(const attn *a, float *s, int64_t lim, float *m, float *alpha)
{
	float mold = *m, mx = -INFINITY, sum = 0.0f;
#if ST_HAVE_AVX512
	if (a->vec) {
		__m512 vmax = _mm512_set1_ps(-INFINITY);
		#pragma GCC unroll 4
		for (int j = 0; j < BK / 16; j++)
			vmax = _mm512_mask_max_ps(vmax, st_mask16(lim - 16 * j), vmax,
						  _mm512_loadu_ps(s + 16 * j));
		mx = _mm512_reduce_max_ps(vmax);
		float mnew = mx > mold ? mx : mold;
		__m512 vm = _mm512_set1_ps(mnew), vsum = _mm512_setzero_ps();
		#pragma GCC unroll 4
		for (int j = 0; j < BK / 16; j++) {
			__m512 p = st_exp16(_mm512_sub_ps(_mm512_loadu_ps(s + 16 * j), vm));
			p = _mm512_maskz_mov_ps(st_mask16(lim - 16 * j), p);
			_mm512_storeu_ps(s + 16 * j, p);
			vsum = _mm512_add_ps(vsum, p);
		}
		sum = _mm512_reduce_add_ps(vsum);
		*alpha = mold == -INFINITY ? 0.0f : expf(mold - mnew);
		*m = mnew;
		return sum;
	}
#endif
	for (int64_t j = 0; j < lim; j++)
		mx = s[j] > mx ? s[j] : mx;
	float mnew = mx > mold ? mx : mold;
	for (int64_t j = 0; j < BK; j++) {
		s[j] = j < lim ? expf(s[j] - mnew) : 0.0f;
		sum += s[j];
	}
	*alpha = mold == -INFINITY ? 0.0f : expf(mold - mnew);
	*m = mnew;
	return sum;
}

void st_attention_forward(float *out, float *lse, const float *q, const float *k,
			  const float *v, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D)
{
	attn a;
	attn_init(&a, B, T, H, K, D);
	float *kt = transpose_kv(&a, k);
	int64_t nb = a.nb, ntask = B * H * nb, ldq = H * D, ldk = K * D;
#pragma omp parallel
	{
		float *S = xmalloc((size_t)(BQ * BK) * sizeof(float));
		float *O = xmalloc((size_t)(BQ * D) * sizeof(float));
		float m[BQ], l[BQ];
		/* largest tasks (last query blocks) first, for balance */
#pragma omp for schedule(dynamic, 1)
		for (int64_t t = 0; t < ntask; t++) {
			int64_t ib = nb - 1 - t % nb, bh = t / nb, b = bh / H, h = bh % H;
			int64_t kh = h / a.group, q0 = ib * BQ;
			int64_t mrows = T - q0 < BQ ? T - q0 : BQ;
			const float *Q = q + ((b * T + q0) * H + h) * D;
			const float *KT = kt + (b * K + kh) * D * a.Tpad;
			memset(O, 0, (size_t)(mrows * D) * sizeof(float));
			for (int64_t r = 0; r < mrows; r++) {
				m[r] = -INFINITY;
				l[r] = 0.0f;
			}
			for (int64_t jb = 0; jb <= ib; jb++) {
				int64_t k0 = jb * BK, n = T - k0 < BK ? T - k0 : BK;
				tile_scores(&a, S, Q, ldq, mrows, KT + k0, a.Tpad);
				for (int64_t r = 0; r < mrows; r++) {
					float alpha;
					float s = softmax_row(&a, S + r * BK, row_limit(&a, ib, jb, r), &m[r],
							      &alpha);
					l[r] = l[r] * alpha + s;
					if (alpha != 1.0f)
						for (int64_t d = 0; d < D; d++)
							O[r * D + d] *= alpha;
				}
				tile_acc(&a, O, D, mrows, S, BK, 1, n, v + ((b * T + k0) * K + kh) * D, ldk);
			}
			for (int64_t r = 0; r < mrows; r++) {
				float inv = 1.0f / l[r];
				float *o = out + ((b * T + q0 + r) * H + h) * D;
				for (int64_t d = 0; d < D; d++)
					o[d] = O[r * D + d] * inv;
				lse[(b * H + h) * T + q0 + r] = m[r] + logf(l[r]);
			}
		}
		free(S);
		free(O);
	}
	free(kt);
}

/* ---- backward ---- */

typedef struct bwd {
	attn a;
	float *dq, *dk, *dv;
	const float *dout, *lse, *q, *k, *v;
	float *kt, *vt, *di; /* K^T, V^T (B*K, D, Tpad); rowsum(dO o O) (B, H, T) */
} bwd;

/* P and dS of tile (b, h, ib, jb) into P and dS (mrows x BK each). */
static void tile_grads(const bwd *w, int64_t b, int64_t h, int64_t ib, int64_t jb, float *P,
		       float *dS)
{
	const attn *a = &w->a;
	int64_t T = a->T, D = a->D, kh = h / a->group, q0 = ib * BQ, k0 = jb * BK;
	int64_t mrows = T - q0 < BQ ? T - q0 : BQ, ldq = a->H * D;
	const float *Q = w->q + ((b * T + q0) * a->H + h) * D;
	const float *dO = w->dout + ((b * T + q0) * a->H + h) * D;
	int64_t kv = (b * a->K + kh) * D * a->Tpad + k0;
	tile_scores(a, P, Q, ldq, mrows, w->kt + kv, a->Tpad);
	/* dP = dO V^T, through the same kernel with scale 1 */
	attn one = *a;
	one.scale = 1.0f;
	tile_scores(&one, dS, dO, ldq, mrows, w->vt + kv, a->Tpad);
	const float *L = w->lse + (b * a->H + h) * T + q0, *Di = w->di + (b * a->H + h) * T + q0;
	float scale = a->scale;
	for (int64_t r = 0; r < mrows; r++) {
		int64_t lim = row_limit(a, ib, jb, r);
		float *p = P + r * BK, *ds = dS + r * BK;
#if ST_HAVE_AVX512
		if (a->vec) {
			__m512 vl = _mm512_set1_ps(L[r]), vd = _mm512_set1_ps(Di[r]);
			__m512 vs = _mm512_set1_ps(scale);
			#pragma GCC unroll 4
			for (int j = 0; j < BK / 16; j++) {
				__mmask16 mk = st_mask16(lim - 16 * j);
				__m512 pv = _mm512_maskz_mov_ps(
					mk, st_exp16(_mm512_sub_ps(_mm512_loadu_ps(p + 16 * j), vl)));
				__m512 g = _mm512_sub_ps(_mm512_loadu_ps(ds + 16 * j), vd);
				_mm512_storeu_ps(p + 16 * j, pv);
				_mm512_storeu_ps(ds + 16 * j, _mm512_mul_ps(_mm512_mul_ps(pv, g), vs));
			}
			continue;
		}
#endif
		for (int64_t j = 0; j < BK; j++) {
			float pv = j < lim ? expf(p[j] - L[r]) : 0.0f;
			p[j] = pv;
			ds[j] = pv * (ds[j] - Di[r]) * scale;
		}
	}
}

enum { G_DQ = 1, G_DKV = 2 };

/* Accumulate the gradients `which` of one tile. */
static void tile_backward(const bwd *w, int64_t b, int64_t h, int64_t ib, int64_t jb, float *P,
			  float *dS, int which)
{
	const attn *a = &w->a;
	int64_t T = a->T, D = a->D, kh = h / a->group, q0 = ib * BQ, k0 = jb * BK;
	int64_t mrows = T - q0 < BQ ? T - q0 : BQ, n = T - k0 < BK ? T - k0 : BK;
	int64_t ldq = a->H * D, ldk = a->K * D;
	int64_t qoff = ((b * T + q0) * a->H + h) * D, koff = ((b * T + k0) * a->K + kh) * D;
	tile_grads(w, b, h, ib, jb, P, dS);
	if (which & G_DKV) {
		tile_acc(a, w->dv + koff, ldk, n, P, 1, BK, mrows, w->dout + qoff, ldq);
		tile_acc(a, w->dk + koff, ldk, n, dS, 1, BK, mrows, w->q + qoff, ldq);
	}
	if (which & G_DQ)
		tile_acc(a, w->dq + qoff, ldq, mrows, dS, BK, 1, n, w->k + koff, ldk);
}

void st_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
			   const float *lse, const float *q, const float *k, const float *v,
			   int64_t B, int64_t T, int64_t H, int64_t K, int64_t D)
{
	bwd w = {.dq = dq, .dk = dk, .dv = dv, .dout = dout, .lse = lse, .q = q, .k = k, .v = v};
	attn_init(&w.a, B, T, H, K, D);
	w.kt = transpose_kv(&w.a, k);
	w.vt = transpose_kv(&w.a, v);
	w.di = xmalloc((size_t)(B * H * T) * sizeof(float));
	int64_t nb = w.a.nb, group = w.a.group;

	/* rowsum(dO o O) per (b, h, t); zero the outputs */
#pragma omp parallel for schedule(static)
	for (int64_t bt = 0; bt < B * T; bt++) {
		int64_t b = bt / T, t = bt % T;
		for (int64_t h = 0; h < H; h++) {
			const float *g = dout + (bt * H + h) * D, *o = out + (bt * H + h) * D;
			float s = 0.0f;
			for (int64_t d = 0; d < D; d++)
				s += g[d] * o[d];
			w.di[(b * H + h) * T + t] = s;
		}
		memset(dq + bt * H * D, 0, (size_t)(H * D) * sizeof(float));
		memset(dk + bt * K * D, 0, (size_t)(K * D) * sizeof(float));
		memset(dv + bt * K * D, 0, (size_t)(K * D) * sizeof(float));
	}

	int mode = split_mode;
	if (mode == 0)
		mode = B * K >= 2 * (int64_t)omp_get_max_threads() ? 1 : 2;
	if (mode == 1) {
#pragma omp parallel
		{
			float *P = xmalloc((size_t)(BQ * BK) * sizeof(float));
			float *dS = xmalloc((size_t)(BQ * BK) * sizeof(float));
#pragma omp for schedule(dynamic, 1)
			for (int64_t bk = 0; bk < B * K; bk++) {
				int64_t b = bk / K, kh = bk % K;
				for (int64_t h = kh * group; h < (kh + 1) * group; h++)
					for (int64_t ib = 0; ib < nb; ib++)
						for (int64_t jb = 0; jb <= ib; jb++)
							tile_backward(&w, b, h, ib, jb, P, dS, G_DQ | G_DKV);
			}
			free(P);
			free(dS);
		}
	} else {
#pragma omp parallel
		{
			float *P = xmalloc((size_t)(BQ * BK) * sizeof(float));
			float *dS = xmalloc((size_t)(BQ * BK) * sizeof(float));
#pragma omp for schedule(dynamic, 1)
			for (int64_t t = 0; t < B * H * nb; t++) {
				int64_t ib = nb - 1 - t % nb, bh = t / nb;
				for (int64_t jb = 0; jb <= ib; jb++)
					tile_backward(&w, bh / H, bh % H, ib, jb, P, dS, G_DQ);
			}
#pragma omp for schedule(dynamic, 1)
			for (int64_t t = 0; t < B * K * nb; t++) {
				int64_t jb = t % nb, bk = t / nb, b = bk / K, kh = bk % K;
				for (int64_t h = kh * group; h < (kh + 1) * group; h++)
					for (int64_t ib = jb; ib < nb; ib++)
						tile_backward(&w, b, h, ib, jb, P, dS, G_DKV);
			}
			free(P);
			free(dS);
		}
	}
	free(w.kt);
	free(w.vt);
	free(w.di);
}
