/*
 * Causal grouped-query attention, tiled ("flash") on CPU.
 *
 * Queries and keys are cut into blocks of BQ and BK rows. A tile is one
 * (query block, key block) pair of one head: its scores S = scale * Q K^T
 * (BQ x BK) live in a per-thread slice of the workspace and nothing of size
 * (T, T) exists.
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
 * The tile products are AVX-512 micro-kernels (6 rows x 64 columns of fp32
 * accumulators) when head_dim is a multiple of 16; in builds without
 * AVX-512, AVX2 ones (6 rows x 16 columns, the same FMAs in the same order,
 * so the same results) when it is a multiple of 8; plain loops otherwise.
 * The AVX2 ones skip the zero terms of the diagonal tiles (TRI_* below),
 * which changes no bit.
 * K (and V, in backward) are first transposed per (batch, kv head) into
 * (D, Tpad) arrays so score tiles read contiguous key vectors.
 *
 * Workspace (the caller's, workspace.h; one layout function both counts
 * and places it): K^T, in backward also V^T and rowsum(dO o O), then one
 * slice per thread with its score tiles (forward: S and the output
 * accumulator; backward: P and dS).
 *
 * The tasks, the online softmax and the elementwise backward step live in
 * attention_impl.h, shared with the bf16 kernels (attention_bf16.c); this
 * file supplies the fp32 tile products.
 */
#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/ops.h"

static int split_mode; /* 0 auto, 1 fused, 2 split (tests) */

void st_attention_set_partition(int mode) { split_mode = mode; }

int st_attention_partition_mode(void) { return split_mode; }

/* The leading dimension of K^T and V^T: Tpad and one cache line more. With
 * rows exactly Tpad floats apart (a power of two for the usual lengths) the
 * D rows that a score tile reads for its key block map to a few of L1's
 * sets; one line more spreads them (a gain of 2-3% in bench/attention on a
 * Zen 3, within its noise). The columns past Tpad are never read. */
static int64_t ldt(const attn *a) { return a->Tpad + 16; }

/* xt (B*K, D, ldt) = x (B, T, K, D) transposed per (batch, kv head), zero
 * columns past T. */
static void transpose_kv(const attn *a, float *xt, const float *x)
{
	int64_t D = a->D, T = a->T, K = a->K, Tpad = a->Tpad, ld = ldt(a);
#pragma omp parallel for schedule(static)
	for (int64_t bk = 0; bk < a->B * a->K; bk++) {
		int64_t b = bk / K, kh = bk % K;
		float *dst = xt + bk * D * ld;
		for (int64_t t0 = 0; t0 < Tpad; t0 += 16) {
			for (int64_t d = 0; d < D; d++)
				for (int64_t t = t0; t < t0 + 16; t++)
					dst[d * ld + t] = t < T ? x[((b * T + t) * K + kh) * D + d] : 0.0f;
		}
	}
}

/* Backward tile scratch: P and dS. */
#define BWD_SCRATCH ((size_t)(2 * BQ * BK) * sizeof(float))

/* Bytes of K^T or V^T. */
static size_t kv_bytes(const attn *a) { return (size_t)(a->B * a->K * a->D * ldt(a)) * sizeof(float); }

/* ---- tile products ---- */

/* The zero terms of a diagonal tile (query block ib = key block jb, so
 * row r of P, dP and dS is zero past column r), which the AVX2 tile
 * products skip. Each skipped term would add an exact zero to a sum that
 * never is -0 (sums start at +0 and x + (-x) is +0), so the results are
 * bit for bit those of the full products (and of the AVX-512 kernels,
 * which compute every term). */
enum {
	TRI_NONE,
	TRI_C_LOWER, /* only C(r, c) with c <= r is needed (c a column of the
			tile): the others are set to 0 (the zero form only) */
	TRI_A_LOWER, /* a(r, k) = 0 for k > r: row r sums k <= r */
	TRI_A_UPPER, /* a(r, k) = 0 for k < r: row r sums k >= r */
};

#if ST_HAVE_AVX2
/* R rows x NV 8-float vectors of C (ld ldc) from sum_k a(r, k) B[k] (k
 * increasing, one FMA each), a(r, k) = A[r*sr + k*sc], B[k] = Bm + k*ldb:
 * zero: C = sum; else C += sum. 12 accumulators, 2 vectors of B and a
 * broadcast: 15 of the 16 registers. */
static inline __attribute__((always_inline)) void acc_block8(float *C, int64_t ldc, const float *A,
							      int64_t sr, int64_t sc, int64_t kn,
							      const float *Bm, int64_t ldb, int R,
							      int NV, int zero)
{
	__m256 c[6][2];
	#pragma GCC unroll 6
	for (int i = 0; i < R; i++)
		#pragma GCC unroll 2
		for (int j = 0; j < NV; j++)
			c[i][j] = zero ? _mm256_setzero_ps() : _mm256_loadu_ps(C + i * ldc + 8 * j);
	for (int64_t k = 0; k < kn; k++) {
		__m256 b[2];
		#pragma GCC unroll 2
		for (int j = 0; j < NV; j++) {
			b[j] = _mm256_loadu_ps(Bm + k * ldb + 8 * j);
			ST_KEEP_IN_REGISTER(b[j]);
		}
		#pragma GCC unroll 6
		for (int i = 0; i < R; i++) {
			__m256 x = _mm256_broadcast_ss(A + i * sr + k * sc);
			#pragma GCC unroll 2
			for (int j = 0; j < NV; j++)
				c[i][j] = _mm256_fmadd_ps(x, b[j], c[i][j]);
		}
	}
	#pragma GCC unroll 6
	for (int i = 0; i < R; i++)
		#pragma GCC unroll 2
		for (int j = 0; j < NV; j++)
			_mm256_storeu_ps(C + i * ldc + 8 * j, c[i][j]);
}

/* C (m x ncols, ld ldc; ncols a multiple of 8) from A (m x kn, read as in
 * acc_block8) and Bm (kn x ncols, ld ldb), in blocks of 6 rows x 16
 * columns, skipping the zero terms that `tri` names. `zero` is a constant
 * at each call (acc_tiles8 below), and a scale is applied by the caller
 * after: with both forms in one loop, or the scale kept for after it, GCC
 * ran out of the 16 registers and reloaded a B vector from the stack at
 * every FMA that used it. */
static inline __attribute__((always_inline)) void acc_tiles8_form(
	float *C, int64_t ldc, int64_t m, int64_t ncols, const float *A, int64_t sr, int64_t sc,
	int64_t kn, const float *Bm, int64_t ldb, int zero, int tri)
{
	/* rows r .. r+R-1 sum k in [k0, k1) */
#define ACC8(R)                                                                                    \
	do {                                                                                       \
		int64_t k0 = tri == TRI_A_UPPER ? (r < kn ? r : kn) : 0;                            \
		int64_t k1 = tri == TRI_A_LOWER && r + (R) < kn ? r + (R) : kn;                     \
		const float *ak = ar + k0 * sc, *bk = b + k0 * ldb;                                 \
		if (nv == 2)                                                                        \
			acc_block8(c, ldc, ak, sr, sc, k1 - k0, bk, ldb, R, 2, zero);               \
		else                                                                                \
			acc_block8(c, ldc, ak, sr, sc, k1 - k0, bk, ldb, R, 1, zero);               \
	} while (0)
	for (int64_t c0 = 0; c0 < ncols; c0 += 16) {
		int nv = ncols - c0 >= 16 ? 2 : 1;
		const float *b = Bm + c0;
		int64_t r = 0;
		if (tri == TRI_C_LOWER) /* rows above c0: no needed column in this strip */
			for (; r < m && r < c0; r++)
				memset(C + r * ldc + c0, 0, (size_t)(8 * nv) * sizeof(float));
		for (; r + 6 <= m; r += 6) {
			float *c = C + r * ldc + c0;
			const float *ar = A + r * sr;
			ACC8(6);
		}
		float *c = C + r * ldc + c0;
		const float *ar = A + r * sr;
		switch (m - r) {
		case 5: ACC8(5); break;
		case 4: ACC8(4); break;
		case 3: ACC8(3); break;
		case 2: ACC8(2); break;
		case 1: ACC8(1); break;
		default: break;
		}
	}
#undef ACC8
}

static void acc_tiles8(float *C, int64_t ldc, int64_t m, int64_t ncols, const float *A, int64_t sr,
		       int64_t sc, int64_t kn, const float *Bm, int64_t ldb, int zero, int tri)
{
	if (zero)
		acc_tiles8_form(C, ldc, m, ncols, A, sr, sc, kn, Bm, ldb, 1, tri);
	else
		acc_tiles8_form(C, ldc, m, ncols, A, sr, sc, kn, Bm, ldb, 0, tri);
}
#endif

#if ST_HAVE_AVX512
/* R (at most 6) rows of S (ld BK) = scale * (R rows of A, ld lda) BT: 4
 * vectors of keys per row, each sum over d in increasing order. 6 rows: 24
 * accumulators, the 4 vectors of BT and a broadcast in 29 of the 32
 * registers (10% faster than 4 rows in bench/attention, Intel family 6
 * model 167). */
static inline __attribute__((always_inline)) void scores_block(float *S, const float *A, int64_t lda,
								int64_t D, const float *BT, int64_t ldb,
								int R, __m512 vs)
{
	__m512 c[6][4];
	#pragma GCC unroll 6
	for (int i = 0; i < R; i++)
		#pragma GCC unroll 4
		for (int j = 0; j < 4; j++)
			c[i][j] = _mm512_setzero_ps();
	for (int64_t d = 0; d < D; d++) {
		const float *b = BT + d * ldb;
		__m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
		__m512 b2 = _mm512_loadu_ps(b + 32), b3 = _mm512_loadu_ps(b + 48);
		ST_KEEP_IN_REGISTER(b0);
		ST_KEEP_IN_REGISTER(b1);
		ST_KEEP_IN_REGISTER(b2);
		ST_KEEP_IN_REGISTER(b3);
		#pragma GCC unroll 6
		for (int i = 0; i < R; i++) {
			__m512 x = _mm512_set1_ps(A[i * lda + d]);
			c[i][0] = _mm512_fmadd_ps(x, b0, c[i][0]);
			c[i][1] = _mm512_fmadd_ps(x, b1, c[i][1]);
			c[i][2] = _mm512_fmadd_ps(x, b2, c[i][2]);
			c[i][3] = _mm512_fmadd_ps(x, b3, c[i][3]);
		}
	}
	#pragma GCC unroll 6
	for (int i = 0; i < R; i++)
		#pragma GCC unroll 4
		for (int j = 0; j < 4; j++)
			_mm512_storeu_ps(S + i * BK + 16 * j, _mm512_mul_ps(c[i][j], vs));
}
#endif

/* S (m x BK, ld BK) = scale * A (m x D, ld lda) BT (D x BK, ld ldb); tri:
 * TRI_NONE, or TRI_C_LOWER for a diagonal tile (AVX2: the entries past the
 * diagonal are 0 instead; the other kernels compute them). */
static void tile_scores(const attn *a, float *S, const float *A, int64_t lda, int64_t m,
			const float *BT, int64_t ldb, int tri)
{
	int64_t D = a->D;
	float scale = a->scale;
#if ST_HAVE_AVX512
	if (a->vec) {
		__m512 vs = _mm512_set1_ps(scale);
		int64_t r = 0;
		for (; r + 6 <= m; r += 6)
			scores_block(S + r * BK, A + r * lda, lda, D, BT, ldb, 6, vs);
		for (; r + 4 <= m; r += 4)
			scores_block(S + r * BK, A + r * lda, lda, D, BT, ldb, 4, vs);
		for (; r < m; r++)
			scores_block(S + r * BK, A + r * lda, lda, D, BT, ldb, 1, vs);
		return;
	}
#endif
#if ST_HAVE_AVX2
	if (a->vec8) {
		acc_tiles8(S, BK, m, BK, A, lda, 1, D, BT, ldb, 1, tri);
		__m256 vs = _mm256_set1_ps(scale); /* the same rounding as scaling each sum */
		for (int64_t i = 0; i < m * BK; i += 8)
			_mm256_storeu_ps(S + i, _mm256_mul_ps(_mm256_loadu_ps(S + i), vs));
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
/* R (at most 6) rows x NV vectors of C += sum_k a(r, k) B[k], a(r, k) =
 * A[r*sr + k*sc] (as scores_block: 6 x 4 where D allows). */
static inline __attribute__((always_inline)) void acc_block(float *C, int64_t ldc,
							     const float *A, int64_t sr,
							     int64_t sc, int64_t kn,
							     const float *Bm, int64_t ldb, int R,
							     int NV)
{
	__m512 c[6][4];
	#pragma GCC unroll 6
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
		#pragma GCC unroll 6
		for (int i = 0; i < R; i++) {
			__m512 x = _mm512_set1_ps(A[i * sr + k * sc]);
			#pragma GCC unroll 4
			for (int j = 0; j < NV; j++)
				c[i][j] = _mm512_fmadd_ps(x, b[j], c[i][j]);
		}
	}
	#pragma GCC unroll 6
	for (int i = 0; i < R; i++)
		#pragma GCC unroll 4
		for (int j = 0; j < NV; j++)
			_mm512_storeu_ps(C + i * ldc + 16 * j, c[i][j]);
}
#endif

/*
 * C (m x D, ld ldc) += Amat Bm, Amat (m x kn) read as a(r, k) = A[r*sr + k*sc]
 * (sr = ld, sc = 1: A as stored; sr = 1, sc = ld: A transposed), Bm (kn x D,
 * ld ldb). Each element of C adds its kn terms in increasing k; tri: the
 * zero terms of Amat, which the AVX2 kernel skips (TRI_NONE, TRI_A_LOWER,
 * TRI_A_UPPER).
 */
static void tile_acc(const attn *a, float *C, int64_t ldc, int64_t m, const float *A, int64_t sr,
		     int64_t sc, int64_t kn, const float *Bm, int64_t ldb, int tri)
{
	int64_t D = a->D;
#if ST_HAVE_AVX512
	if (a->vec) {
		/* In the model's layout (B, T, heads, D) Bm's rows lie heads * D
		 * floats apart (1 and 3 KiB at llama3-125m): its kn rows map to
		 * a quarter of L1's sets and evict each other while each row
		 * block reads them all again. A contiguous copy (exact) spreads
		 * them: 4% off bench/attention's fp32 time (model 167). */
		static _Thread_local float bc[BK * 64] __attribute__((aligned(64)));
		if (ldb != D && kn <= BK && D <= 64) {
			for (int64_t k = 0; k < kn; k++)
				for (int64_t d = 0; d < D; d += 16) /* D: a multiple of 16 (vec) */
					_mm512_store_ps(bc + k * D + d, _mm512_loadu_ps(Bm + k * ldb + d));
			Bm = bc;
			ldb = D;
		}
		for (int64_t d0 = 0; d0 < D; d0 += 64) {
			int nv = D - d0 >= 64 ? 4 : (int)((D - d0) / 16);
			int64_t r = 0;
			if (nv == 4)
				for (; r + 6 <= m; r += 6)
					acc_block(C + r * ldc + d0, ldc, A + r * sr, sr, sc, kn, Bm + d0, ldb, 6, 4);
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
#if ST_HAVE_AVX2
	if (a->vec8) {
		acc_tiles8(C, ldc, m, D, A, sr, sc, kn, Bm, ldb, 0, tri);
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

/* ---- forward ---- */

typedef struct fwd {
	attn a;
	const float *q, *v;
	float *kt; /* K^T (B*K, D, ldt) */
} fwd;

/* The forward workspace (attn_layout_fn): K^T, then the slices. */
static size_t fwd_layout(void *ctx, int threads, char *base, attn_slices *sl)
{
	fwd *f = ctx;
	size_t off = 0;
	f->kt = st_ws_take(base, &off, kv_bytes(&f->a));
	attn_take_slices(base, &off, sl, attn_fwd_slice_bytes(&f->a, 0), threads);
	return off;
}

static void fwd_scores(const void *ctx, float *S, void *scratch, int64_t b, int64_t h, int64_t ib,
		       int64_t jb, int64_t mrows)
{
	const fwd *f = ctx;
	const attn *a = &f->a;
	const float *Q = f->q + ((b * a->T + ib * BQ) * a->H + h) * a->D;
	const float *KT = f->kt + (b * a->K + h / a->group) * a->D * ldt(a) + jb * BK;
	tile_scores(a, S, Q, a->H * a->D, mrows, KT, ldt(a), ib == jb ? TRI_C_LOWER : TRI_NONE);
}

static void fwd_pv(const void *ctx, float *O, const float *S, void *scratch, int64_t b, int64_t kh,
		   int64_t ib, int64_t jb, int64_t mrows, int64_t n)
{
	const fwd *f = ctx;
	const attn *a = &f->a;
	tile_acc(a, O, a->D, mrows, S, BK, 1, n, f->v + ((b * a->T + jb * BK) * a->K + kh) * a->D,
		 a->K * a->D, ib == jb ? TRI_A_LOWER : TRI_NONE);
}

int st_attention_forward(float *out, float *lse, const float *q, const float *k,
			 const float *v, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D,
			 const st_ws *ws)
{
	fwd f = {.q = q, .v = v};
	attn_init(&f.a, B, T, H, K, D);
	attn_slices sl;
	int rc = attn_ws_place(ws, "st_attention_forward", fwd_layout, &f, &sl);
	if (rc < 0)
		return rc;
	transpose_kv(&f.a, f.kt, k);
	attn_forward_tasks(&f.a, out, lse, &f, fwd_scores, fwd_pv, 0, &sl);
	return 0;
}

/* ---- backward ---- */

typedef struct bwd {
	attn a;
	float *dq, *dk, *dv;
	const float *dout, *lse, *q, *k, *v;
	float *kt, *vt, *di; /* K^T, V^T (B*K, D, ldt); rowsum(dO o O) (B, H, T) */
} bwd;

/* The backward workspace (attn_layout_fn): K^T, V^T, rowsum(dO o O), then
 * the slices. */
static size_t bwd_layout(void *ctx, int threads, char *base, attn_slices *sl)
{
	bwd *w = ctx;
	size_t off = 0;
	w->kt = st_ws_take(base, &off, kv_bytes(&w->a));
	w->vt = st_ws_take(base, &off, kv_bytes(&w->a));
	w->di = st_ws_take(base, &off, (size_t)(w->a.B * w->a.H * w->a.T) * sizeof(float));
	attn_take_slices(base, &off, sl, attn_bwd_slice_bytes(BWD_SCRATCH), threads);
	return off;
}

size_t st_attention_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t K, int64_t D,
				    int threads)
{
	fwd f;
	bwd w;
	attn_slices sl;
	attn_init(&f.a, B, T, H, K, D);
	w.a = f.a;
	size_t nf = fwd_layout(&f, threads, NULL, &sl), nb = bwd_layout(&w, threads, NULL, &sl);
	return nf > nb ? nf : nb;
}

/* P and dS of tile (b, h, ib, jb) into P and dS (mrows x BK each). */
static void tile_grads(const bwd *w, int64_t b, int64_t h, int64_t ib, int64_t jb, float *P,
		       float *dS)
{
	const attn *a = &w->a;
	int64_t T = a->T, D = a->D, kh = h / a->group, q0 = ib * BQ, k0 = jb * BK;
	int64_t mrows = T - q0 < BQ ? T - q0 : BQ, ldq = a->H * D;
	const float *Q = w->q + ((b * T + q0) * a->H + h) * D;
	const float *dO = w->dout + ((b * T + q0) * a->H + h) * D;
	int64_t kv = (b * a->K + kh) * D * ldt(a) + k0;
	int tri = ib == jb ? TRI_C_LOWER : TRI_NONE;
	tile_scores(a, P, Q, ldq, mrows, w->kt + kv, ldt(a), tri);
	/* dP = dO V^T, through the same kernel with scale 1 */
	attn one = *a;
	one.scale = 1.0f;
	tile_scores(&one, dS, dO, ldq, mrows, w->vt + kv, ldt(a), tri);
	attn_grads_rows(a, ib, jb, mrows, P, dS, w->lse + (b * a->H + h) * T + q0,
			w->di + (b * a->H + h) * T + q0);
}

/* Accumulate the gradients `which` of one tile; scratch: P and dS. */
static void tile_backward(const void *ctx, int64_t b, int64_t h, int64_t ib, int64_t jb,
			  void *scratch, int which)
{
	const bwd *w = ctx;
	const attn *a = &w->a;
	float *P = scratch, *dS = P + BQ * BK;
	int64_t T = a->T, D = a->D, kh = h / a->group, q0 = ib * BQ, k0 = jb * BK;
	int64_t mrows = T - q0 < BQ ? T - q0 : BQ, n = T - k0 < BK ? T - k0 : BK;
	int64_t ldq = a->H * D, ldk = a->K * D;
	int64_t qoff = ((b * T + q0) * a->H + h) * D, koff = ((b * T + k0) * a->K + kh) * D;
	int diag = ib == jb;
	tile_grads(w, b, h, ib, jb, P, dS);
	if (which & G_DKV) {
		/* P^T and dS^T: row c (a key) is zero before column c */
		int tri = diag ? TRI_A_UPPER : TRI_NONE;
		tile_acc(a, w->dv + koff, ldk, n, P, 1, BK, mrows, w->dout + qoff, ldq, tri);
		tile_acc(a, w->dk + koff, ldk, n, dS, 1, BK, mrows, w->q + qoff, ldq, tri);
	}
	if (which & G_DQ)
		tile_acc(a, w->dq + qoff, ldq, mrows, dS, BK, 1, n, w->k + koff, ldk,
			 diag ? TRI_A_LOWER : TRI_NONE);
}

int st_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
			  const float *lse, const float *q, const float *k, const float *v,
			  int64_t B, int64_t T, int64_t H, int64_t K, int64_t D, const st_ws *ws)
{
	bwd w = {.dq = dq, .dk = dk, .dv = dv, .dout = dout, .lse = lse, .q = q, .k = k, .v = v};
	attn_init(&w.a, B, T, H, K, D);
	attn_slices sl;
	int rc = attn_ws_place(ws, "st_attention_backward", bwd_layout, &w, &sl);
	if (rc < 0)
		return rc;
	transpose_kv(&w.a, w.kt, k);
	transpose_kv(&w.a, w.vt, v);
	attn_backward_init(&w.a, w.di, dq, dk, dv, dout, out);
	attn_backward_tasks(&w.a, &w, tile_backward, BWD_SCRATCH, &sl);
	return 0;
}
