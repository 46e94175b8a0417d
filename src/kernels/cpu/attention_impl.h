/*
 * attention_impl.h - private to attention.c (fp32 tile products) and
 * attention_bf16.c (bf16 tile products): what the two share. The tiling,
 * the online softmax of a forward row, the elementwise step of a backward
 * tile, and the task drivers: forward tasks per (batch, head, query block)
 * and the two backward partitions (attention.c's header comment describes
 * them). A precision supplies its tile products as callbacks; everything
 * else, and so the order in which the tiles add into the outputs, is the
 * same code for both.
 *
 * Memory: nothing is allocated here. Each kernel lays out its caller's
 * workspace (workspace.h) as its K/V layouts followed by one slice per
 * thread (attn_ws_place); the drivers below take the slices and run on that
 * many threads at most.
 */
#ifndef ST_KERNELS_ATTENTION_IMPL_H
#define ST_KERNELS_ATTENTION_IMPL_H

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/workspace.h"

#define BQ 64
#define BK 64

typedef struct attn {
	int64_t B, T, H, K, D, group, Tpad, nb;
	float scale;
	int vec;  /* AVX-512 code paths */
	int vec8; /* AVX2+FMA paths where vec is 0: fp32 tile products (attention.c), softmax rows */
} attn;

/* The partition set by st_attention_set_partition (0 auto, 1 fused, 2 split). */
int st_attention_partition_mode(void);

static inline void attn_init(attn *a, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D)
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
	a->vec8 = !a->vec && ST_HAVE_AVX2 && D % 8 == 0;
}

/* Per-thread slices of a workspace: `threads` of `bytes` each from mem.
 * The callbacks' part of a slice is zeroed at the start of every call, so
 * that they can keep state from one tile to the next (a cache key starting
 * at 0). */
typedef struct attn_slices {
	char *mem;
	size_t bytes;
	int threads;
} attn_slices;

static inline char *attn_slice(const attn_slices *sl)
{
	return sl->mem + (size_t)omp_get_thread_num() * sl->bytes;
}

/* The slices, `threads` of `bytes` each, as the next piece of a layout
 * (st_ws_take). */
static inline void attn_take_slices(char *base, size_t *off, attn_slices *sl, size_t bytes,
				    int threads)
{
	sl->bytes = st_ws_round(bytes);
	sl->threads = threads;
	sl->mem = st_ws_take(base, off, (size_t)threads * sl->bytes);
}

/* A kernel's workspace layout: K/V layouts into ctx, then the slices for
 * `threads` threads, placed at base or only counted (base NULL); returns
 * the bytes. */
typedef size_t (*attn_layout_fn)(void *ctx, int threads, char *base, attn_slices *sl);

/* Check ws against layout (for st_ws_threads(ws) threads) and place it:
 * 0, or ST_EINVAL naming kernel with nothing placed. */
static inline int attn_ws_place(const st_ws *ws, const char *kernel, attn_layout_fn layout,
				void *ctx, attn_slices *sl)
{
	int threads = st_ws_threads(ws);
	int rc = st_ws_check(ws, layout(ctx, threads, NULL, sl), kernel);
	if (rc == 0)
		layout(ctx, threads, ws->mem, sl);
	return rc;
}

/* One thread's slice in the forward driver, placed at mine or only
 * counted (mine NULL): the score tile S, the output accumulator O, then the
 * callbacks' scratch; returns its bytes. */
static inline size_t attn_fwd_slice(const attn *a, char *mine, size_t scratch_bytes, float **S,
				    float **O, void **scratch)
{
	size_t off = 0;
	*S = st_ws_take(mine, &off, (size_t)(BQ * BK) * sizeof(float));
	*O = st_ws_take(mine, &off, (size_t)(BQ * a->D) * sizeof(float));
	*scratch = st_ws_take(mine, &off, scratch_bytes);
	return off;
}

static inline size_t attn_fwd_slice_bytes(const attn *a, size_t scratch_bytes)
{
	float *S, *O;
	void *scratch;
	return attn_fwd_slice(a, NULL, scratch_bytes, &S, &O, &scratch);
}

/* One thread's slice in the backward drivers: the callbacks' scratch. */
static inline size_t attn_bwd_slice_bytes(size_t scratch_bytes) { return st_ws_round(scratch_bytes); }

/* Valid keys of row r in tile (query block ib, key block jb): causal and < T. */
static inline int64_t row_limit(const attn *a, int64_t ib, int64_t jb, int64_t r)
{
	int64_t n = a->T - jb * BK < BK ? a->T - jb * BK : BK;
	if (ib == jb && r + 1 < n)
		return r + 1;
	return n;
}

/* One row of a forward tile: s (BK scores) -> p = exp(s - m_new) for the
 * first `lim` keys, 0 after; returns the row sum; updates *m, returns the
 * rescale factor of the old accumulator in *alpha. */
static inline float softmax_row(const attn *a, float *s, int64_t lim, float *m, float *alpha)
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
#if ST_HAVE_AVX2
	if (a->vec8) {
		__m256 vmax = _mm256_set1_ps(-INFINITY);
		#pragma GCC unroll 8
		for (int j = 0; j < BK / 8; j++)
			vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_loadu_ps(s + 8 * j),
								     st_lanes_below8(lim, j)));
		mx = st_hmax8(vmax);
		float mnew = mx > mold ? mx : mold;
		__m256 vm = _mm256_set1_ps(mnew), vsum = _mm256_setzero_ps();
		#pragma GCC unroll 8
		for (int j = 0; j < BK / 8; j++) {
			__m256 p = st_exp8(_mm256_sub_ps(_mm256_loadu_ps(s + 8 * j), vm));
			p = _mm256_and_ps(p, st_lanes_below8(lim, j));
			_mm256_storeu_ps(s + 8 * j, p);
			vsum = _mm256_add_ps(vsum, p);
		}
		sum = st_hsum8(vsum);
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

/*
 * Forward. The tile products of a precision, ctx being its own data:
 *   scores: S (mrows x BK, ld BK) = scale * Q_i K_j^T for query block ib of
 *           head h and key block jb;
 *   pv:     O (mrows x D, ld D) += P V_j, P (mrows x n) in S (ld BK), zero
 *           past each row's valid keys (for query block ib);
 * both with the thread's scratch (scratch_bytes, zeroed per call).
 * One task per (batch, head, query block), largest first; online softmax
 * over the key blocks up to the diagonal, then out = O / l and
 * lse = m + log l. Each slice of sl holds at least attn_fwd_slice_bytes(a,
 * scratch_bytes).
 */
typedef void (*attn_scores_fn)(const void *ctx, float *S, void *scratch, int64_t b, int64_t h,
			       int64_t ib, int64_t jb, int64_t mrows);
typedef void (*attn_pv_fn)(const void *ctx, float *O, const float *S, void *scratch, int64_t b,
			   int64_t kh, int64_t ib, int64_t jb, int64_t mrows, int64_t n);

static inline void attn_forward_tasks(const attn *a, float *out, float *lse, const void *ctx,
				      attn_scores_fn scores, attn_pv_fn pv, size_t scratch_bytes,
				      const attn_slices *sl)
{
	int64_t nb = a->nb, T = a->T, H = a->H, D = a->D, ntask = a->B * H * nb;
#pragma omp parallel num_threads(sl->threads)
	{
		float *S, *O;
		void *scratch;
		attn_fwd_slice(a, attn_slice(sl), scratch_bytes, &S, &O, &scratch);
		memset(scratch, 0, scratch_bytes);
		float m[BQ], l[BQ];
		/* largest tasks (last query blocks) first, for balance */
#pragma omp for schedule(dynamic, 1)
		for (int64_t t = 0; t < ntask; t++) {
			int64_t ib = nb - 1 - t % nb, bh = t / nb, b = bh / H, h = bh % H;
			int64_t kh = h / a->group, q0 = ib * BQ;
			int64_t mrows = T - q0 < BQ ? T - q0 : BQ;
			memset(O, 0, (size_t)(mrows * D) * sizeof(float));
			for (int64_t r = 0; r < mrows; r++) {
				m[r] = -INFINITY;
				l[r] = 0.0f;
			}
			for (int64_t jb = 0; jb <= ib; jb++) {
				int64_t k0 = jb * BK, n = T - k0 < BK ? T - k0 : BK;
				scores(ctx, S, scratch, b, h, ib, jb, mrows);
				for (int64_t r = 0; r < mrows; r++) {
					float alpha;
					float s = softmax_row(a, S + r * BK, row_limit(a, ib, jb, r), &m[r],
							      &alpha);
					l[r] = l[r] * alpha + s;
					/* also when alpha is 1 (exact): no branch to mispredict */
					float *o = O + r * D;
#pragma omp simd
					for (int64_t d = 0; d < D; d++)
						o[d] *= alpha;
				}
				pv(ctx, O, S, scratch, b, kh, ib, jb, mrows, n);
			}
			for (int64_t r = 0; r < mrows; r++) {
				float inv = 1.0f / l[r];
				float *o = out + ((b * T + q0 + r) * H + h) * D, *acc = O + r * D;
#pragma omp simd
				for (int64_t d = 0; d < D; d++)
					o[d] = acc[d] * inv;
				lse[(b * H + h) * T + q0 + r] = m[r] + logf(l[r]);
			}
		}
	}
}

/* ---- backward ---- */

/* di (B, H, T) = rowsum(dout o out) in fp32, sequential over d; dq, dk, dv = 0. */
static inline void attn_backward_init(const attn *a, float *di, float *dq, float *dk, float *dv,
				      const float *dout, const float *out)
{
	int64_t T = a->T, H = a->H, K = a->K, D = a->D;
#pragma omp parallel for schedule(static)
	for (int64_t bt = 0; bt < a->B * T; bt++) {
		int64_t b = bt / T, t = bt % T;
		for (int64_t h = 0; h < H; h++) {
			const float *g = dout + (bt * H + h) * D, *o = out + (bt * H + h) * D;
			float s = 0.0f;
			for (int64_t d = 0; d < D; d++)
				s += g[d] * o[d];
			di[(b * H + h) * T + t] = s;
		}
		memset(dq + bt * H * D, 0, (size_t)(H * D) * sizeof(float));
		memset(dk + bt * K * D, 0, (size_t)(K * D) * sizeof(float));
		memset(dv + bt * K * D, 0, (size_t)(K * D) * sizeof(float));
	}
}

/* The elementwise step of backward tile (ib, jb), in place: P holds the
 * scores S, dS holds dP = dO V^T; L and Di point at the rows' lse and
 * rowsum(dO o O). Then P = exp(S - lse) (0 past each row's valid keys) and
 * dS = scale * P o (dP - Di). */
static inline void attn_grads_rows(const attn *a, int64_t ib, int64_t jb, int64_t mrows, float *P,
				   float *dS, const float *L, const float *Di)
{
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
#if ST_HAVE_AVX2
		if (a->vec8) {
			__m256 vl = _mm256_set1_ps(L[r]), vd = _mm256_set1_ps(Di[r]);
			__m256 vs = _mm256_set1_ps(scale);
			#pragma GCC unroll 8
			for (int j = 0; j < BK / 8; j++) {
				__m256 pv = _mm256_and_ps(st_exp8(_mm256_sub_ps(_mm256_loadu_ps(p + 8 * j), vl)),
							  st_lanes_below8(lim, j));
				__m256 g = _mm256_sub_ps(_mm256_loadu_ps(ds + 8 * j), vd);
				_mm256_storeu_ps(p + 8 * j, pv);
				_mm256_storeu_ps(ds + 8 * j, _mm256_mul_ps(_mm256_mul_ps(pv, g), vs));
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

/* Accumulate the gradients `which` (G_DQ: dq of the query block; G_DKV: dk,
 * dv of the key block) of tile (b, h, ib, jb); scratch: the per-thread
 * bytes given to attn_backward_tasks. */
typedef void (*attn_tile_bwd_fn)(const void *ctx, int64_t b, int64_t h, int64_t ib, int64_t jb,
				 void *scratch, int which);

/* Run the tiles of backward in the partition set by
 * st_attention_set_partition, or by the amount of parallelism. dQ_i sums
 * key blocks in increasing order, dK_j and dV_j (head, query block) in
 * increasing order, in both partitions. Each slice of sl holds at least
 * attn_bwd_slice_bytes(scratch_bytes). */
static inline void attn_backward_tasks(const attn *a, const void *ctx, attn_tile_bwd_fn tile,
				       size_t scratch_bytes, const attn_slices *sl)
{
	int64_t B = a->B, H = a->H, K = a->K, nb = a->nb, group = a->group;
	int mode = st_attention_partition_mode();
	if (mode == 0)
		mode = B * K >= 2 * (int64_t)sl->threads ? 1 : 2;
	if (mode == 1) {
#pragma omp parallel num_threads(sl->threads)
		{
			void *scratch = attn_slice(sl);
			memset(scratch, 0, scratch_bytes);
#pragma omp for schedule(dynamic, 1)
			for (int64_t bk = 0; bk < B * K; bk++) {
				int64_t b = bk / K, kh = bk % K;
				for (int64_t h = kh * group; h < (kh + 1) * group; h++)
					for (int64_t ib = 0; ib < nb; ib++)
						for (int64_t jb = 0; jb <= ib; jb++)
							tile(ctx, b, h, ib, jb, scratch, G_DQ | G_DKV);
			}
		}
	} else {
#pragma omp parallel num_threads(sl->threads)
		{
			void *scratch = attn_slice(sl);
			memset(scratch, 0, scratch_bytes);
#pragma omp for schedule(dynamic, 1)
			for (int64_t t = 0; t < B * H * nb; t++) {
				int64_t ib = nb - 1 - t % nb, bh = t / nb;
				for (int64_t jb = 0; jb <= ib; jb++)
					tile(ctx, bh / H, bh % H, ib, jb, scratch, G_DQ);
			}
#pragma omp for schedule(dynamic, 1)
			for (int64_t t = 0; t < B * K * nb; t++) {
				int64_t jb = t % nb, bk = t / nb, b = bk / K, kh = bk % K;
				for (int64_t h = kh * group; h < (kh + 1) * group; h++)
					for (int64_t ib = jb; ib < nb; ib++)
						tile(ctx, b, h, ib, jb, scratch, G_DKV);
			}
		}
	}
}

#endif
