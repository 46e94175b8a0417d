/*
 * Causal grouped-query attention with bf16 tile products, for the model's
 * dtype=bfloat16 mode (MaxText's semantics: bf16 product inputs, fp32
 * accumulation). The tiling (64 x 64), the tasks, both backward partitions
 * and the order in which tiles add into dq, dk and dv are attention.c's,
 * through the drivers of attention_impl.h; what differs is the tile
 * products and what they read:
 *   - q, k and v come in bf16 (the model's rounded copies, which it keeps
 *     anyway), dout is rounded to bf16 once (st_f32_to_bf16: nearest even,
 *     subnormals kept), into the layouts below;
 *   - each probability tile P, and in backward each dS tile, is rounded to
 *     bf16 (nearest even) before the products that read it;
 *   - the products are VDPBF16PS: pairs of bf16 along the reduction
 *     dimension, multiplied exactly and added into fp32 accumulators, the
 *     pairs in increasing order; where AMX is in use (amx.h), tiles whose
 *     sides are multiples of 16 run on TDPBF16PS instead
 *     (st_amx_dp_tile: the same word layouts, 16 words per step in order,
 *     2.3x the fp32 kernels' speed where VDPBF16PS gave 0.74x: Intel
 *     family 6 model 207, docs/performance.md), the edges on VDPBF16PS.
 * The softmax statistics (row max, row sum, lse), exp, the 1/sqrt(D) scale
 * and rowsum(dO o O) (of the fp32 dout and out) stay fp32, the same code as
 * attention.c's. Results do not depend on the thread count, and the two
 * backward partitions give bit-identical results.
 *
 * Operand layouts, in 32-bit words that each hold two bf16 consecutive
 * along the reduction dimension (the first in the low half); odd tails and
 * positions past T are zero:
 *   rows:   x (rows, D) as bf16 rows of Dp = D rounded up to even: word p
 *           of row r is (x[r][2p], x[r][2p+1]): q and dout, the broadcast
 *           operand of S = Q K^T and dP = dO V^T;
 *   dpairs: per (batch, kv head) (Dp/2, Tpad), word (p, t) = (x[t][2p],
 *           x[t][2p+1]): K for S, V for dP (16 keys per vector);
 *   tpairs: (Tpad/2, D) per head, word (u, d) = (x[2u][d], x[2u+1][d]):
 *           V for O += P V, K for dQ += dS K, dout for dV += P^T dO, q for
 *           dK += dS^T Q (16 values of d per vector).
 * K and V layouts are made once per call (three arrays of half the size of
 * k in backward, two in forward). The query side is converted a query
 * block (64 rows of a head) at a time into the thread's scratch, when a
 * tile of another block comes: tiles of one block follow each other in the
 * forward tasks and the fused backward partition, so q and dout are read
 * about once, and nothing of their size is needed.
 * Workspace (the caller's, workspace.h; one layout function both counts and
 * places it): the K and V layouts, in backward rowsum(dO o O), then one
 * slice per thread, holding first a (T, Dp) bf16 row buffer for making the
 * K and V layouts, then the task's tiles and query block.
 * A tile P or dS (fp32, 64 x 64) is rounded into bf16 rows (the broadcast
 * operand of P V and dS K: pairs of keys) and, in backward, into query-pair
 * words (BQ/2, BK) (the broadcast operand of P^T dO and dS^T Q, read
 * transposed: pairs of queries). On the vector path that rounding is
 * VCVTNE2PS2BF16, which flushes fp32 subnormals to zero; the products treat
 * bf16 subnormal inputs as zero anyway (VDPBF16PS: DAZ, FTZ).
 *
 * Fallback: without AVX512_BF16 in the build (no __AVX512BF16__), or when
 * D is not a multiple of 16, the same tiles, layouts, roundings and order
 * run as plain C loops (each word's two products added high element first,
 * as VDPBF16PS does; P and dS rounded with st_f32_to_bf16): the same
 * semantics, slowly, though not bitwise the vector path's results (expf
 * instead of st_exp16, no DAZ/FTZ).
 */
#include "kernels/cpu/attention_impl.h"

#include <string.h>

#include "kernels/cpu/amx.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/ops.h"

#if ST_HAVE_AVX512 && defined(__AVX512BF16__) && defined(__AVX512BW__)
#define HAVE_DPBF16 1
#else
#define HAVE_DPBF16 0
#endif

/* A word of two bf16; read through this type over uint16_t buffers. */
typedef uint32_t pair_t __attribute__((__may_alias__));

typedef struct bfw {
	attn a;
	int64_t Dp, hp;        /* D rounded up to even; words per bf16 row (Dp / 2) */
	const uint16_t *q;     /* bf16; q and dout are laid out per query block, */
	const float *dout;     /* in the thread's scratch */
	pair_t *kd, *vd;       /* dpairs of K, V (B*K, hp, Tpad); vd: backward */
	pair_t *kt, *vt;       /* tpairs of K (backward), V (forward) (B*K, Tpad/2, D) */
	float *dq, *dk, *dv, *di;
	const float *lse;
} bfw;

/* Set w's shapes (the caller sets the rest). */
static void bfw_init(bfw *w, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D)
{
	attn_init(&w->a, B, T, H, K, D);
	w->a.vec = HAVE_DPBF16 && D % 16 == 0;
	w->Dp = D + (D & 1);
	w->hp = w->Dp / 2;
}

/* Sizes of dpairs and tpairs of K or V. */
static size_t dpairs_bytes(const bfw *w)
{
	return (size_t)(w->a.B * w->a.K * w->hp * w->a.Tpad) * sizeof(pair_t);
}

static size_t tpairs_bytes(const bfw *w)
{
	return (size_t)(w->a.B * w->a.K * (w->a.Tpad / 2) * w->a.D) * sizeof(pair_t);
}

/* ---- operand layouts ---- */

/* Rows t0 .. t0+m-1 of head h of x (B, T, nh, D), bf16 -> bf16 rows (m, Dp). */
static void rows16(const bfw *w, uint16_t *dst, const uint16_t *x, int64_t nh, int64_t b, int64_t h,
		   int64_t t0, int64_t m)
{
	int64_t D = w->a.D, Dp = w->Dp;
	for (int64_t r = 0; r < m; r++) {
		memcpy(dst + r * Dp, x + ((b * w->a.T + t0 + r) * nh + h) * D, (size_t)D * sizeof(uint16_t));
		if (Dp > D)
			dst[r * Dp + D] = 0;
	}
}

/* The same from fp32 x, rounded. */
static void to_rows(const bfw *w, uint16_t *dst, const float *x, int64_t nh, int64_t b, int64_t h,
		    int64_t t0, int64_t m)
{
	int64_t D = w->a.D, Dp = w->Dp;
	for (int64_t r = 0; r < m; r++) {
		const float *src = x + ((b * w->a.T + t0 + r) * nh + h) * D;
		uint16_t *o = dst + r * Dp;
#if ST_HAVE_AVX512
		if (D % 16 == 0) {
			for (int64_t d = 0; d < D; d += 16)
				_mm256_storeu_si256((void *)(o + d), st_cvt_bf16_16(_mm512_loadu_ps(src + d)));
			continue;
		}
#endif
		for (int64_t d = 0; d < D; d++)
			o[d] = st_f32_to_bf16(src[d]);
		if (Dp > D)
			o[D] = 0;
	}
}

/* bf16 rows (m, Dp) -> nu rows of tpairs (nu, D): word (u, d) = (rows[2u][d],
 * rows[2u+1][d]), rows past m zero. */
static void to_tpairs(const bfw *w, pair_t *dst, const uint16_t *rows, int64_t m, int64_t nu)
{
	int64_t D = w->a.D, Dp = w->Dp;
	for (int64_t u = 0; u < nu; u++) {
		const uint16_t *r0 = 2 * u < m ? rows + 2 * u * Dp : NULL;
		const uint16_t *r1 = 2 * u + 1 < m ? rows + (2 * u + 1) * Dp : NULL;
		pair_t *o = dst + u * D;
#if ST_HAVE_AVX512
		if (D % 16 == 0) {
			for (int64_t d = 0; d < D; d += 16) {
				__m512i lo = _mm512_setzero_si512(), hi = lo;
				if (r0)
					lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(r0 + d)));
				if (r1)
					hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(r1 + d)));
				_mm512_storeu_si512(o + d, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
			}
			continue;
		}
#endif
		for (int64_t d = 0; d < D; d++)
			o[d] = (r0 ? (uint32_t)r0[d] : 0u) | (r1 ? (uint32_t)r1[d] << 16 : 0u);
	}
}

/* Bytes of kv_layouts' row buffer, in each thread's slice. */
static size_t kv_rows_bytes(const bfw *w) { return (size_t)(w->a.T * w->Dp) * sizeof(uint16_t); }

/* x (B, T, K, D) -> dpairs (B*K, hp, Tpad) into dp and tpairs (B*K, Tpad/2,
 * D) into tp (either may be NULL); a row buffer per thread at the start of
 * its slice. */
static void kv_layouts(const bfw *w, const uint16_t *x, pair_t *dp, pair_t *tp, const attn_slices *sl)
{
	int64_t T = w->a.T, Tpad = w->a.Tpad, K = w->a.K, D = w->a.D, hp = w->hp;
#pragma omp parallel num_threads(sl->threads)
	{
		uint16_t *rows = (uint16_t *)attn_slice(sl);
		const pair_t *rw = (const pair_t *)rows;
#pragma omp for schedule(static)
		for (int64_t bk = 0; bk < w->a.B * K; bk++) {
			rows16(w, rows, x, K, bk / K, bk % K, 0, T);
			if (tp)
				to_tpairs(w, tp + bk * (Tpad / 2) * D, rows, T, Tpad / 2);
			if (dp) {
				pair_t *o = dp + bk * hp * Tpad;
				for (int64_t t0 = 0; t0 < Tpad; t0 += 16)
					for (int64_t p = 0; p < hp; p++)
						for (int64_t t = t0; t < t0 + 16; t++)
							o[p * Tpad + t] = t < T ? rw[t * hp + p] : 0;
			}
		}
	}
}

/*
 * The query-side operands of query block ib of head h, converted when a tile
 * of another block comes (cached in the thread's scratch): q as bf16 rows
 * (the broadcast operand of S), and in backward dout as rows (dP) and q and
 * dout as tpairs (the B operand of dK += dS^T Q and dV += P^T dO).
 */
typedef struct qblock {
	int64_t key; /* 1 + (b*H + h)*nb + ib of the block held; 0 none */
	uint16_t *qr, *dor;
	pair_t *qt, *dot;
} qblock;

/* Bytes of a qblock's arrays (backward: all four; forward: qr). */
static size_t qblock_bytes(const bfw *w, int bwd)
{
	size_t rows = (size_t)(BQ * w->Dp) * sizeof(uint16_t);
	size_t tp = (size_t)(BQ / 2 * w->a.D) * sizeof(pair_t);
	return bwd ? 2 * rows + 2 * tp : rows;
}

/* Point qb's arrays into mem (qblock_bytes). */
static void qblock_place(const bfw *w, qblock *qb, char *mem, int bwd)
{
	size_t rows = (size_t)(BQ * w->Dp) * sizeof(uint16_t);
	qb->qr = (uint16_t *)mem;
	if (bwd) {
		qb->dor = (uint16_t *)(mem + rows);
		qb->qt = (pair_t *)(mem + 2 * rows);
		qb->dot = qb->qt + BQ / 2 * w->a.D;
	}
}

/* Make qb hold query block ib of head h of batch b. */
static void qblock_load(const bfw *w, qblock *qb, int64_t b, int64_t h, int64_t ib, int bwd)
{
	const attn *a = &w->a;
	int64_t key = 1 + (b * a->H + h) * a->nb + ib, q0 = ib * BQ;
	if (qb->key == key)
		return;
	int64_t m = a->T - q0 < BQ ? a->T - q0 : BQ;
	rows16(w, qb->qr, w->q, a->H, b, h, q0, m);
	if (bwd) {
		to_rows(w, qb->dor, w->dout, a->H, b, h, q0, m);
		to_tpairs(w, qb->qt, qb->qr, m, (m + 1) / 2);
		to_tpairs(w, qb->dot, qb->dor, m, (m + 1) / 2);
	}
	qb->key = key;
}

/* ---- tiles ---- */

/* P (m x BK fp32) -> bf16 rows (m x BK). */
static void round_rows(const bfw *w, uint16_t *dst, const float *P, int64_t m)
{
#if HAVE_DPBF16
	if (w->a.vec) {
		for (int64_t r = 0; r < m; r++)
			#pragma GCC unroll 2
			for (int j = 0; j < BK; j += 32)
				_mm512_storeu_si512(dst + r * BK + j,
						    (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(P + r * BK + j + 16),
										 _mm512_loadu_ps(P + r * BK + j)));
		return;
	}
#endif
	for (int64_t r = 0; r < m; r++)
		for (int64_t j = 0; j < BK; j++)
			dst[r * BK + j] = st_f32_to_bf16(P[r * BK + j]);
}

/* P (m x BK fp32) -> query-pair words (ceil(m/2) x BK): word (u, j) =
 * (P[2u][j], P[2u+1][j]), the row past m zero. */
static void round_qpairs(const bfw *w, uint16_t *dst, const float *P, int64_t m)
{
#if HAVE_DPBF16
	if (w->a.vec) {
		/* interleave the 16 bf16 of row 2u (low half) with those of row 2u+1 */
		const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10,
						     25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3,
						     18, 2, 17, 1, 16, 0);
		for (int64_t u = 0; 2 * u < m; u++) {
			const float *p0 = P + 2 * u * BK, *p1 = p0 + BK;
			int odd = 2 * u + 1 < m;
			#pragma GCC unroll 4
			for (int j = 0; j < BK; j += 16) {
				__m512 x1 = odd ? _mm512_loadu_ps(p1 + j) : _mm512_setzero_ps();
				__m512i x = (__m512i)_mm512_cvtne2ps_pbh(x1, _mm512_loadu_ps(p0 + j));
				_mm512_storeu_si512(dst + 2 * (u * BK + j), _mm512_permutexvar_epi16(idx, x));
			}
		}
		return;
	}
#endif
	for (int64_t u = 0; 2 * u < m; u++)
		for (int64_t j = 0; j < BK; j++) {
			dst[2 * (u * BK + j)] = st_f32_to_bf16(P[2 * u * BK + j]);
			dst[2 * (u * BK + j) + 1] = 2 * u + 1 < m ? st_f32_to_bf16(P[(2 * u + 1) * BK + j]) : 0;
		}
}

#if HAVE_DPBF16
/* R rows x NV vectors of C (+)= sum over p < np of a(r, p) . B(p), a(r, p)
 * the word A[r*sr + p*sc] broadcast, B(p) the words Bm[p*ldb + 16j ...];
 * acc: added to C, else C = scale * the sum. */
static inline __attribute__((always_inline)) void dp_block(float *C, int64_t ldc, const pair_t *A,
							    int64_t sr, int64_t sc, int64_t np,
							    const pair_t *Bm, int64_t ldb, int R,
							    int NV, int acc, float scale)
{
	__m512 c[6][4];
	#pragma GCC unroll 6
	for (int i = 0; i < R; i++)
		#pragma GCC unroll 4
		for (int j = 0; j < NV; j++)
			c[i][j] = acc ? _mm512_loadu_ps(C + i * ldc + 16 * j) : _mm512_setzero_ps();
	for (int64_t p = 0; p < np; p++) {
		__m512i b[4];
		#pragma GCC unroll 4
		for (int j = 0; j < NV; j++)
			b[j] = _mm512_loadu_si512(Bm + p * ldb + 16 * j);
		#pragma GCC unroll 4
		for (int j = 0; j < NV; j++)
			ST_KEEP_IN_REGISTER(b[j]);
		#pragma GCC unroll 6
		for (int i = 0; i < R; i++) {
			__m512bh x = (__m512bh)_mm512_set1_epi32((int)A[i * sr + p * sc]);
			#pragma GCC unroll 4
			for (int j = 0; j < NV; j++)
				c[i][j] = _mm512_dpbf16_ps(c[i][j], x, (__m512bh)b[j]);
		}
	}
	__m512 vs = _mm512_set1_ps(scale);
	#pragma GCC unroll 6
	for (int i = 0; i < R; i++)
		#pragma GCC unroll 4
		for (int j = 0; j < NV; j++)
			_mm512_storeu_ps(C + i * ldc + 16 * j, acc ? c[i][j] : _mm512_mul_ps(c[i][j], vs));
}

/* One function per shape, so that each gets its own register allocation. */
#define DP_FN(R, NV, acc)                                                                        \
	static __attribute__((noinline)) void dp_##R##_##NV##_##acc(                             \
		float *C, int64_t ldc, const pair_t *A, int64_t sr, int64_t sc, int64_t np,     \
		const pair_t *Bm, int64_t ldb, float scale)                                     \
	{                                                                                        \
		dp_block(C, ldc, A, sr, sc, np, Bm, ldb, R, NV, acc, scale);                     \
	}
#define DP_FNS(R, acc) DP_FN(R, 1, acc) DP_FN(R, 2, acc) DP_FN(R, 3, acc) DP_FN(R, 4, acc)
DP_FNS(6, 0)
DP_FNS(6, 1)
DP_FNS(4, 0)
DP_FNS(4, 1)
DP_FNS(1, 0)
DP_FNS(1, 1)

typedef void (*dp_fn)(float *, int64_t, const pair_t *, int64_t, int64_t, int64_t, const pair_t *,
		      int64_t, float);
/* [acc][R: 1, 4, 6][NV - 1] */
static const dp_fn dp_fns[2][3][4] = {
	{{dp_1_1_0, dp_1_2_0, dp_1_3_0, dp_1_4_0}, {dp_4_1_0, dp_4_2_0, dp_4_3_0, dp_4_4_0},
	 {dp_6_1_0, dp_6_2_0, dp_6_3_0, dp_6_4_0}},
	{{dp_1_1_1, dp_1_2_1, dp_1_3_1, dp_1_4_1}, {dp_4_1_1, dp_4_2_1, dp_4_3_1, dp_4_4_1},
	 {dp_6_1_1, dp_6_2_1, dp_6_3_1, dp_6_4_1}},
};
#endif

/*
 * C (m x N, ld ldc) += A B (acc), or = scale * A B: A (m x np words), its
 * word (r, p) at A[r*sr + p*sc]; B (np words x N), word (p, c) at
 * Bm[p*ldb + c]. Each element of C adds its words in increasing p, each
 * word as VDPBF16PS does (high products first, then low).
 */
static void dp_tile(const bfw *w, float *C, int64_t ldc, int64_t m, int64_t N, const pair_t *A,
		    int64_t sr, int64_t sc, int64_t np, const pair_t *Bm, int64_t ldb, int acc,
		    float scale)
{
#if HAVE_DPBF16
	if (w->a.vec && st_amx_dp_tile(C, ldc, m, N, A, sr, sc, np, Bm, ldb, acc, scale))
		return;
	if (w->a.vec) {
		for (int64_t n0 = 0; n0 < N; n0 += 64) {
			int nv = N - n0 >= 64 ? 4 : (int)((N - n0) / 16);
			dp_fn f4 = dp_fns[acc != 0][1][nv - 1], f1 = dp_fns[acc != 0][0][nv - 1];
			dp_fn f6 = dp_fns[acc != 0][2][nv - 1];
			int64_t r = 0;
			for (; r + 6 <= m; r += 6)
				f6(C + r * ldc + n0, ldc, A + r * sr, sr, sc, np, Bm + n0, ldb, scale);
			for (; r + 4 <= m; r += 4)
				f4(C + r * ldc + n0, ldc, A + r * sr, sr, sc, np, Bm + n0, ldb, scale);
			for (; r < m; r++)
				f1(C + r * ldc + n0, ldc, A + r * sr, sr, sc, np, Bm + n0, ldb, scale);
		}
		return;
	}
#endif
	for (int64_t r = 0; r < m; r++)
		for (int64_t c = 0; c < N; c++) {
			float s = acc ? C[r * ldc + c] : 0.0f;
			for (int64_t p = 0; p < np; p++) {
				uint32_t x = A[r * sr + p * sc], y = Bm[p * ldb + c];
				s += st_bf16_to_f32((uint16_t)(x >> 16)) * st_bf16_to_f32((uint16_t)(y >> 16));
				s += st_bf16_to_f32((uint16_t)x) * st_bf16_to_f32((uint16_t)y);
			}
			C[r * ldc + c] = acc ? s : s * scale;
		}
}

/* S (mrows x BK) = scale * X Y_j^T: X (mrows, Dp) bf16 rows of the query
 * block, Y_j key block jb of the dpairs of kv head bk. */
static void tile_scores(const bfw *w, float *S, const uint16_t *X, const pair_t *dpairs,
			int64_t bk, int64_t jb, int64_t mrows, float scale)
{
	const attn *a = &w->a;
	const pair_t *Y = dpairs + bk * w->hp * a->Tpad + jb * BK;
	dp_tile(w, S, BK, mrows, BK, (const pair_t *)X, w->hp, 1, w->hp, Y, a->Tpad, 0, scale);
}

/* The words of kv head bk of tpairs x from key k0 (even) on. */
static const pair_t *tpairs_at(const bfw *w, const pair_t *x, int64_t bk, int64_t k0)
{
	return x + (bk * (w->a.Tpad / 2) + k0 / 2) * w->a.D;
}

/* ---- workspace ---- */

/* The forward tasks' scratch (FWD_P, FWD_Q). */
static size_t fwd_scratch_bytes(const bfw *w)
{
	_Static_assert(sizeof(qblock) <= 64, "qblock header");
	return 64 + (size_t)(BQ * BK) * sizeof(uint16_t) + qblock_bytes(w, 0);
}

/* The backward tiles' scratch (bwd_tile). */
static size_t bwd_scratch_bytes(const bfw *w)
{
	return 64 + (size_t)(2 * BQ * BK) * sizeof(float) + (size_t)(3 * BQ * BK) * sizeof(uint16_t) +
	       qblock_bytes(w, 1);
}

/* The slices: kv_layouts' row buffer, then the tasks' memory. */
static void take_slices(const bfw *w, char *base, size_t *off, attn_slices *sl, size_t tasks,
			int threads)
{
	attn_take_slices(base, off, sl, kv_rows_bytes(w) > tasks ? kv_rows_bytes(w) : tasks, threads);
}

/* The forward workspace (attn_layout_fn): K as dpairs, V as tpairs, then
 * the slices. */
static size_t fwd_layout(void *ctx, int threads, char *base, attn_slices *sl)
{
	bfw *w = ctx;
	size_t off = 0;
	w->kd = st_ws_take(base, &off, dpairs_bytes(w));
	w->vt = st_ws_take(base, &off, tpairs_bytes(w));
	take_slices(w, base, &off, sl, attn_fwd_slice_bytes(&w->a, fwd_scratch_bytes(w)), threads);
	return off;
}

/* The backward workspace (attn_layout_fn): K and V as dpairs, K as tpairs,
 * rowsum(dO o O), then the slices. */
static size_t bwd_layout(void *ctx, int threads, char *base, attn_slices *sl)
{
	bfw *w = ctx;
	size_t off = 0;
	w->kd = st_ws_take(base, &off, dpairs_bytes(w));
	w->vd = st_ws_take(base, &off, dpairs_bytes(w));
	w->kt = st_ws_take(base, &off, tpairs_bytes(w));
	w->di = st_ws_take(base, &off, (size_t)(w->a.B * w->a.H * w->a.T) * sizeof(float));
	take_slices(w, base, &off, sl, attn_bwd_slice_bytes(bwd_scratch_bytes(w)), threads);
	return off;
}

size_t st_attention_bf16_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t K, int64_t D,
					 int threads)
{
	bfw w = {0};
	bfw_init(&w, B, T, H, K, D);
	attn_slices sl;
	size_t f = fwd_layout(&w, threads, NULL, &sl), b = bwd_layout(&w, threads, NULL, &sl);
	return f > b ? f : b;
}

/* ---- forward ---- */

/* scratch: a qblock, then P as bf16 rows (BQ x BK), then the qblock's arrays. */
#define FWD_P(scratch) ((uint16_t *)((char *)(scratch) + 64))
#define FWD_Q(scratch) ((char *)(scratch) + 64 + (size_t)(BQ * BK) * sizeof(uint16_t))

static void fwd_scores(const void *ctx, float *S, void *scratch, int64_t b, int64_t h, int64_t ib,
		       int64_t jb, int64_t mrows)
{
	const bfw *w = ctx;
	qblock *qb = scratch;
	qblock_place(w, qb, FWD_Q(scratch), 0);
	qblock_load(w, qb, b, h, ib, 0);
	tile_scores(w, S, qb->qr, w->kd, b * w->a.K + h / w->a.group, jb, mrows, w->a.scale);
}

/* O += P V_j, P rounded to bf16 rows. */
static void fwd_pv(const void *ctx, float *O, const float *S, void *scratch, int64_t b, int64_t kh,
		   int64_t ib, int64_t jb, int64_t mrows, int64_t n)
{
	const bfw *w = ctx;
	int64_t D = w->a.D;
	uint16_t *P = FWD_P(scratch);
	round_rows(w, P, S, mrows);
	dp_tile(w, O, D, mrows, D, (const pair_t *)P, BK / 2, 1, (n + 1) / 2,
		tpairs_at(w, w->vt, b * w->a.K + kh, jb * BK), D, 1, 1.0f);
}

int st_attention_forward_bf16(float *out, float *lse, const uint16_t *q, const uint16_t *k,
			      const uint16_t *v, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D,
			      const st_ws *ws)
{
	bfw w = {.q = q};
	bfw_init(&w, B, T, H, K, D);
	attn_slices sl;
	int rc = attn_ws_place(ws, "st_attention_forward_bf16", fwd_layout, &w, &sl);
	if (rc < 0)
		return rc;
	kv_layouts(&w, k, w.kd, NULL, &sl);
	kv_layouts(&w, v, NULL, w.vt, &sl);
	attn_forward_tasks(&w.a, out, lse, &w, fwd_scores, fwd_pv, fwd_scratch_bytes(&w), &sl);
	return 0;
}

/* ---- backward ---- */

/* scratch: a qblock; P, dS (fp32, BQ x BK each); bf16 P and dS as query-pair
 * words and dS as rows (BQ x BK each); the qblock's arrays. */
static void bwd_tile(const void *ctx, int64_t b, int64_t h, int64_t ib, int64_t jb, void *scratch,
		     int which)
{
	const bfw *w = ctx;
	const attn *a = &w->a;
	qblock *qb = scratch;
	float *P = (float *)((char *)scratch + 64), *dS = P + BQ * BK;
	uint16_t *Pq = (uint16_t *)(dS + BQ * BK), *dSq = Pq + BQ * BK, *dSr = dSq + BQ * BK;
	qblock_place(w, qb, (char *)(dSr + BQ * BK), 1);
	qblock_load(w, qb, b, h, ib, 1);
	int64_t T = a->T, H = a->H, D = a->D, kh = h / a->group, q0 = ib * BQ, k0 = jb * BK;
	int64_t mrows = T - q0 < BQ ? T - q0 : BQ, n = T - k0 < BK ? T - k0 : BK;
	int64_t bh = b * H + h, bk = b * a->K + kh;
	tile_scores(w, P, qb->qr, w->kd, bk, jb, mrows, a->scale);
	tile_scores(w, dS, qb->dor, w->vd, bk, jb, mrows, 1.0f); /* dP = dO V^T */
	attn_grads_rows(a, ib, jb, mrows, P, dS, w->lse + bh * T + q0, w->di + bh * T + q0);
	if (which & G_DKV) {
		int64_t koff = ((b * T + k0) * a->K + kh) * D, ldk = a->K * D, nu = (mrows + 1) / 2;
		round_qpairs(w, Pq, P, mrows);
		round_qpairs(w, dSq, dS, mrows);
		dp_tile(w, w->dv + koff, ldk, n, D, (const pair_t *)Pq, 1, BK, nu, qb->dot, D, 1, 1.0f);
		dp_tile(w, w->dk + koff, ldk, n, D, (const pair_t *)dSq, 1, BK, nu, qb->qt, D, 1, 1.0f);
	}
	if (which & G_DQ) {
		round_rows(w, dSr, dS, mrows);
		dp_tile(w, w->dq + ((b * T + q0) * H + h) * D, H * D, mrows, D, (const pair_t *)dSr,
			BK / 2, 1, (n + 1) / 2, tpairs_at(w, w->kt, bk, k0), D, 1, 1.0f);
	}
}

int st_attention_backward_bf16(float *dq, float *dk, float *dv, const float *dout,
			       const float *out, const float *lse, const uint16_t *q, const uint16_t *k,
			       const uint16_t *v, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D,
			       const st_ws *ws)
{
	bfw w = {.q = q, .dout = dout, .dq = dq, .dk = dk, .dv = dv, .lse = lse};
	bfw_init(&w, B, T, H, K, D);
	attn_slices sl;
	int rc = attn_ws_place(ws, "st_attention_backward_bf16", bwd_layout, &w, &sl);
	if (rc < 0)
		return rc;
	kv_layouts(&w, k, w.kd, w.kt, &sl);
	kv_layouts(&w, v, w.vd, NULL, &sl);
	attn_backward_init(&w.a, w.di, dq, dk, dv, dout, out);
	attn_backward_tasks(&w.a, &w, bwd_tile, bwd_scratch_bytes(&w), &sl);
	return 0;
}
