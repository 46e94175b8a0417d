/*
 * Kernel checks beyond finite differences (test_ops.c):
 *  - every kernel, and one whole training step through the st_llama API, gives
 *    bit-identical results at 1, 2 and 3 threads (fixed partitions), also
 *    with a workspace sized for fewer threads than OpenMP would use;
 *  - a workspace too small, unaligned or missing is refused (ST_EINVAL, nothing
 *    written);
 *  - the two backward partitions of attention are bit-identical, and the
 *    tiled attention matches a plain float64 reference at sizes that leave
 *    partial tiles and use both the AVX-512 and the plain code paths;
 *  - the same for the bf16 attention (to bf16 accuracy), plus bit-identical
 *    results at 1, 2 and 3 threads, no change from rounding its inputs to
 *    bf16 first, and exact results where the arithmetic is exact;
 *  - st_gemm (both fp32 back ends) and the bf16 products against a float64
 *    reference: transposes, leading dimensions, alpha, beta, K = 0;
 *  - the AMX bf16 products (where the CPU has AMX): bit-exact on integer
 *    data whose sums are exact in any order (every transpose, edges of M, N
 *    and K, K over one block, leading dimensions, beta 0 and 1, bf16 C),
 *    bit-identical at 1, 2 and 3 threads on random data, a bf16 C equal to
 *    the fp32 C rounded, padding untouched, the calls it leaves to oneDNN;
 *    and the bf16 attention's AMX tile products, exact the same way;
 *  - fp32 <-> bf16 conversion on edge cases (ties, NaN, Inf, subnormals,
 *    overflow), array versions equal to the scalar rule at every length;
 *  - the kernel context (kctx.h): every product runs in a context sized
 *    for its shapes by st_gemm_workspace_bytes_list (also one sized for
 *    fewer threads than OpenMP would use: the same bits); a context
 *    missing, uninitialized or too small is refused (ST_EINVAL naming the
 *    kernel and the bytes, C untouched); the primitive table keeps
 *    ST_KCTX_PRIMS entries, replacing the oldest, with the same results;
 *    a model step on the tiles back end (fp32, and bf16 on the fp32
 *    kernels) runs in the context the model sized.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/rng.h"
#include "check.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kctx.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/simd.h"
#include "model/llama.h"

static float *randn(int64_t n, uint64_t stream, double std)
{
	float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
	for (int64_t i = 0; i < n; i++)
		x[i] = (float)(std * st_rng_normal(99, stream, (uint64_t)i));
	return x;
}

static float *copyf(const float *x, int64_t n)
{
	float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
	memcpy(y, x, (size_t)n * sizeof(float));
	return y;
}

static int same(const void *a, const void *b, int64_t bytes) { return memcmp(a, b, (size_t)bytes) == 0; }

/* A kernel workspace of `bytes` for `threads` threads (0: OpenMP's current
 * count). */
static st_ws ws_new(size_t bytes, int threads)
{
	st_ws ws = ST_WS_INIT;
	CHECK(st_ws_init(&ws, bytes, threads ? threads : omp_get_max_threads()) == 0);
	return ws;
}

/* A kernel context for the products of the shapes sh (n of them), sized
 * for whichever fp32 back end needs the most (the tests switch between
 * them) and the AMX path as it stands, its per-thread slices for `threads`
 * (0: OpenMP's count). */
static void kctx_new(st_kctx *kc, const st_gemm_shape *sh, int n, int threads)
{
	int t = threads ? threads : omp_get_max_threads();
	enum st_gemm_backend be = st_gemm_f32_backend();
	static const enum st_gemm_backend all[] = {ST_GEMM_SGEMM, ST_GEMM_MATMUL, ST_GEMM_TILES};
	size_t most = 0;
	for (int b = 0; b < 3; b++) {
		st_gemm_set_f32_backend(all[b]);
		size_t w = st_gemm_workspace_bytes_list(sh, n, t);
		most = w > most ? w : most;
	}
	st_gemm_set_f32_backend(be);
	CHECK(st_kctx_init(kc, most, t) == 0);
}

/* The same for one product shape on all three kernels. */
static void kctx_shape(st_kctx *kc, char ta, char tb, int64_t M, int64_t N, int64_t K, int threads)
{
	st_gemm_shape sh[3] = {{ST_GEMM_F32, ta, tb, M, N, K}, {ST_GEMM_BF16, ta, tb, M, N, K},
			       {ST_GEMM_BF16_OUT, ta, tb, M, N, K}};
	kctx_new(kc, sh, 3, threads);
}

/* ---- every kernel at 1, 2 and 3 threads ---- */

typedef struct outs {
	float *rms, *rstd, *drms_x, *drms_w, *rope, *att, *lse, *dq, *dk, *dv, *act, *dg, *du, *demb,
		*dx, *dW, *gemm, *gemm_bf, *gemm_mm, *gemm_tl;
	uint16_t *bf;
	double loss;
} outs;

enum { KB = 2, KT = 150, KH = 4, KK = 2, KD = 32, KE = 48, KM = 80, KV = 301, KN = KB * KT };

/* Every kernel at `threads` threads, the workspace sized for ws_threads
 * (0: the same). */
static void run_kernels(outs *o, int threads, int ws_threads)
{
	omp_set_num_threads(threads);
	int64_t nq = (int64_t)KN * KH * KD, nk = (int64_t)KN * KK * KD;
	size_t wb = st_attention_workspace_bytes(KB, KT, KH, KK, KD, ws_threads ? ws_threads : threads);
	size_t nb = st_rmsnorm_backward_workspace_bytes(KN, KE);
	st_ws ws = ws_new(wb > nb ? wb : nb, ws_threads);
	float *x = randn(KN * KE, 1, 1.0), *w = randn(KE, 2, 1.0), *g = randn(KN * KE, 3, 1.0);
	o->rms = malloc(KN * KE * sizeof(float));
	o->rstd = malloc(KN * sizeof(float));
	st_rmsnorm_forward(o->rms, o->rstd, x, w, KN, KE, 1e-5f);
	o->drms_x = copyf(g, KN * KE);
	o->drms_w = calloc(KE, sizeof(float));
	CHECK(st_rmsnorm_backward(o->drms_x, o->drms_w, g, x, w, o->rstd, KN, KE, &ws) == 0);

	float *cs = malloc(KT * KD / 2 * sizeof(float)), *sn = malloc(KT * KD / 2 * sizeof(float));
	st_rope_tables(cs, sn, KT, KD, 500000.0, NULL);
	o->rope = randn(nq, 4, 1.0);
	st_rope_forward(o->rope, cs, sn, KB, KT, KH, KD);
	st_rope_backward(o->rope, cs, sn, KB, KT, KH, KD);

	float *q = randn(nq, 5, 1.0), *k = randn(nk, 6, 1.0), *v = randn(nk, 7, 1.0);
	float *dout = randn(nq, 8, 1.0);
	o->att = malloc((size_t)nq * sizeof(float));
	o->lse = malloc(KB * KH * KT * sizeof(float));
	o->dq = malloc((size_t)nq * sizeof(float));
	o->dk = malloc((size_t)nk * sizeof(float));
	o->dv = malloc((size_t)nk * sizeof(float));
	CHECK(st_attention_forward(o->att, o->lse, q, k, v, KB, KT, KH, KK, KD, &ws) == 0);
	CHECK(st_attention_backward(o->dq, o->dk, o->dv, dout, o->att, o->lse, q, k, v, KB, KT, KH,
				    KK, KD, &ws) == 0);

	int64_t ne = KN * KM;
	float *gate = randn(ne, 9, 2.0), *up = randn(ne, 10, 1.0), *da = randn(ne, 11, 1.0);
	o->act = malloc((size_t)ne * sizeof(float));
	o->dg = malloc((size_t)ne * sizeof(float));
	o->du = malloc((size_t)ne * sizeof(float));
	st_swiglu_forward(o->act, gate, up, ne);
	st_swiglu_backward(o->dg, o->du, da, gate, up, ne);

	int32_t *tok = malloc(KN * sizeof(int32_t));
	for (int i = 0; i < KN; i++)
		tok[i] = (int32_t)st_rng_below(3, 0, (uint64_t)i, KV);
	o->demb = calloc((size_t)KV * KE, sizeof(float));
	st_embedding_backward(o->demb, g, tok, KN, KE);

	float *W = randn(KV * KE, 12, 0.3);
	st_ws lw = ws_new(st_lm_head_workspace_bytes(KV, 64), 0);
	/* the products' context, for ws_threads too */
	st_gemm_shape sh[10] = {{ST_GEMM_F32, 'N', 'T', KN, KM, KE}, {ST_GEMM_BF16, 'N', 'T', KN, KM, KE},
				{ST_GEMM_F32, 'T', 'N', KN, KM, KE}, {ST_GEMM_F32, 'T', 'N', KE, KE, KN}};
	int nsh = 4 + st_lm_head_products(KN, KE, KV, 64, sh + 4);
	st_kctx kc;
	kctx_new(&kc, sh, nsh, ws_threads);
	o->dx = malloc(KN * KE * sizeof(float));
	o->dW = calloc((size_t)KV * KE, sizeof(float));
	o->loss = 0;
	CHECK(st_lm_head_xent(&o->loss, o->dx, o->dW, x, W, tok, KN, KE, KV, 1.0f / KN, 64, &lw, &kc) == 0);

	o->gemm = malloc(KN * KM * sizeof(float));
	CHECK(st_gemm('N', 'T', KN, KM, KE, 1.0f, x, KE, gate, KE, 0.0f, o->gemm, KM, &kc) == 0);
	o->bf = malloc((size_t)ne * sizeof(uint16_t));
	st_f32_to_bf16_array(o->bf, gate, ne);
	/* the matmul primitive, fp32 and bf16 (created per thread count) */
	uint16_t *xh = malloc(KN * KE * 2);
	st_f32_to_bf16_array(xh, x, KN * KE);
	o->gemm_bf = calloc(KN * KM, sizeof(float)); /* stays 0 where the CPU has no bf16 products */
	if (st_cpu_has_bf16())
		CHECK(st_gemm_bf16('N', 'T', KN, KM, KE, 1.0f, xh, KE, o->bf, KE, 0.0f, o->gemm_bf, KM, &kc) == 0);
	o->gemm_mm = malloc(KN * KM * sizeof(float));
	enum st_gemm_backend be = st_gemm_f32_backend();
	st_gemm_set_f32_backend(ST_GEMM_MATMUL);
	CHECK(st_gemm('T', 'N', KN, KM, KE, 1.0f, g, KN, gate, KM, 0.0f, o->gemm_mm, KM, &kc) == 0);
	/* tiles of C, on any CPU: a long K over a small C, which oneDNN's AVX2
	 * sgemm splits over the threads */
	o->gemm_tl = malloc(KE * KE * sizeof(float));
	st_gemm_set_f32_backend(ST_GEMM_TILES);
	CHECK(st_gemm('T', 'N', KE, KE, KN, 1.0f, x, KE, x, KE, 0.0f, o->gemm_tl, KE, &kc) == 0);
	st_gemm_set_f32_backend(be);
	free(xh);
	st_kctx_release(&kc);

	free(x), free(w), free(g), free(cs), free(sn), free(q), free(k), free(v), free(dout);
	free(gate), free(up), free(da), free(tok), free(W);
	st_ws_release(&ws), st_ws_release(&lw);
}

static void free_outs(outs *o)
{
	float **f[] = {&o->rms, &o->rstd, &o->drms_x, &o->drms_w, &o->rope, &o->att, &o->lse,
		       &o->dq, &o->dk, &o->dv, &o->act, &o->dg, &o->du, &o->demb, &o->dx, &o->dW,
		       &o->gemm, &o->gemm_bf, &o->gemm_mm, &o->gemm_tl};
	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
		free(*f[i]);
	free(o->bf);
}

static void test_thread_counts(void)
{
	int64_t nq = (int64_t)KN * KH * KD, nk = (int64_t)KN * KK * KD, ne = KN * KM;
	outs r[4];
	for (int t = 0; t < 3; t++)
		run_kernels(&r[t], t + 1, 0);
	run_kernels(&r[3], 3, 1); /* at 3 OpenMP threads, a workspace for 1 */
	for (int t = 1; t < 4; t++) {
		outs *a = &r[0], *b = &r[t];
#define SAME(f, n) CHECK_MSG(same(a->f, b->f, (n) * (int64_t)sizeof(*a->f)), "%s differs at %d threads", #f, t + 1)
		SAME(rms, KN * KE);
		SAME(rstd, KN);
		SAME(drms_x, KN * KE);
		SAME(drms_w, KE);
		SAME(rope, nq);
		SAME(att, nq);
		SAME(lse, KB * KH * KT);
		SAME(dq, nq);
		SAME(dk, nk);
		SAME(dv, nk);
		SAME(act, ne);
		SAME(dg, ne);
		SAME(du, ne);
		SAME(demb, KV * KE);
		SAME(dx, KN * KE);
		SAME(dW, KV * KE);
		SAME(gemm, KN * KM);
		SAME(gemm_bf, KN * KM);
		SAME(gemm_mm, KN * KM);
		SAME(gemm_tl, KE * KE);
		SAME(bf, ne);
#undef SAME
		CHECK_MSG(a->loss == b->loss, "loss %.17g vs %.17g at %d threads", a->loss, b->loss, t + 1);
	}
	for (int t = 0; t < 4; t++)
		free_outs(&r[t]);
	omp_set_num_threads(omp_get_num_procs());
}

/* x rounded to bf16 (nearest even), in a new array. */
static uint16_t *bf16_copy(const float *x, int64_t n)
{
	uint16_t *h = malloc((size_t)n * sizeof(uint16_t));
	CHECK(h != NULL);
	st_f32_to_bf16_array(h, x, n);
	return h;
}

/* Workspaces a kernel must refuse (ST_EINVAL, output untouched): one byte
 * short, not 16-byte aligned, NULL, sized for no thread. */
static void test_workspace_refused(void)
{
	enum { B = 1, T = 70, H = 2, K = 1, D = 16, N = B * T, C = 32, V = 11, E = 8 };
	int64_t nq = B * T * H * D, nk = B * T * K * D;
	float *q = randn(nq, 60, 1.0), *k = randn(nk, 61, 1.0), *v = randn(nk, 62, 1.0);
	uint16_t *qh = bf16_copy(q, nq), *kh = bf16_copy(k, nk), *vh = bf16_copy(v, nk);
	float *o = malloc((size_t)nq * sizeof(float)), *lse = malloc(B * H * T * sizeof(float));
	float *x = randn(N * C, 63, 1.0), *dx = calloc(N * C, sizeof(float)), dw[C] = {0}, rs[N];
	for (int i = 0; i < N; i++)
		rs[i] = 1.0f;
	float *xe = randn(N * E, 64, 1.0), *W = randn(V * E, 65, 1.0), dxe[N * E];
	int32_t tg[N] = {0};
	size_t need[4] = {st_attention_workspace_bytes(B, T, H, K, D, 1),
			  st_attention_bf16_workspace_bytes(B, T, H, K, D, 1),
			  st_rmsnorm_backward_workspace_bytes(N, C), st_lm_head_workspace_bytes(V, 16)};
	omp_set_num_threads(1);
	st_gemm_shape sh[6];
	st_kctx kc;
	kctx_new(&kc, sh, st_lm_head_products(N, E, V, 16, sh), 1);
	for (int i = 0; i < 4; i++) {
		st_ws good = ws_new(need[i] + 64, 1);
		st_ws bad[4] = {{good.mem, need[i] - 1, 1}, {(char *)good.mem + 8, need[i], 1},
				{NULL, need[i], 1}, {good.mem, need[i], 0}};
		for (int j = 0; j < 5; j++) {
			const st_ws *ws = j < 4 ? &bad[j] : NULL;
			double loss = 0;
			int rc;
			memset(o, 0x7f, (size_t)nq * sizeof(float));
			memset(dx, 0, N * C * sizeof(float));
			/* backward: the larger of the two at this shape */
			if (i == 0)
				rc = st_attention_backward(o, dx, dx, q, q, lse, q, k, v, B, T, H, K, D, ws);
			else if (i == 1)
				rc = st_attention_backward_bf16(o, dx, dx, q, q, lse, qh, kh, vh, B, T, H, K, D, ws);
			else if (i == 2)
				rc = st_rmsnorm_backward(dx, dw, x, x, x, rs, N, C, ws);
			else
				rc = st_lm_head_xent(&loss, dxe, dx, xe, W, tg, N, E, V, 1.0f, 16, ws, &kc);
			CHECK_MSG(rc == ST_EINVAL && strstr(st_errmsg(), "workspace"),
				  "kernel %d accepted bad workspace %d (rc %d)", i, j, rc);
			CHECK(o[0] == o[nq - 1] && dx[0] == 0.0f && loss == 0);
		}
		st_ws_release(&good);
	}
	omp_set_num_threads(omp_get_num_procs());
	st_kctx_release(&kc);
	free(q), free(k), free(v), free(o), free(lse), free(x), free(dx), free(xe), free(W);
	free(qh), free(kh), free(vh);
}

/* ---- attention: partitions and a float64 reference ---- */

static void attention_ref(double *out, double *dq, double *dk, double *dv, const float *q,
			  const float *k, const float *v, const float *dout, int64_t B, int64_t T,
			  int64_t H, int64_t K, int64_t D)
{
	int64_t group = H / K;
	double scale = 1.0 / sqrt((double)D);
	double *p = malloc((size_t)T * sizeof(double)), *dp = malloc((size_t)T * sizeof(double));
	memset(dq, 0, (size_t)(B * T * H * D) * sizeof(double));
	memset(dk, 0, (size_t)(B * T * K * D) * sizeof(double));
	memset(dv, 0, (size_t)(B * T * K * D) * sizeof(double));
	for (int64_t b = 0; b < B; b++)
		for (int64_t h = 0; h < H; h++)
			for (int64_t i = 0; i < T; i++) {
				int64_t kh = h / group;
				const float *qi = q + ((b * T + i) * H + h) * D;
				double mx = -INFINITY, sum = 0;
				for (int64_t j = 0; j <= i; j++) {
					const float *kj = k + ((b * T + j) * K + kh) * D;
					double s = 0;
					for (int64_t d = 0; d < D; d++)
						s += (double)qi[d] * kj[d];
					p[j] = s * scale;
					mx = fmax(mx, p[j]);
				}
				for (int64_t j = 0; j <= i; j++)
					sum += (p[j] = exp(p[j] - mx));
				double *oi = out + ((b * T + i) * H + h) * D;
				const float *gi = dout + ((b * T + i) * H + h) * D;
				for (int64_t d = 0; d < D; d++)
					oi[d] = 0;
				for (int64_t j = 0; j <= i; j++) {
					p[j] /= sum;
					const float *vj = v + ((b * T + j) * K + kh) * D;
					for (int64_t d = 0; d < D; d++)
						oi[d] += p[j] * vj[d];
				}
				double di = 0;
				for (int64_t d = 0; d < D; d++)
					di += gi[d] * oi[d];
				for (int64_t j = 0; j <= i; j++) {
					int64_t kr = ((b * T + j) * K + kh) * D;
					double g = 0;
					for (int64_t d = 0; d < D; d++)
						g += (double)gi[d] * v[kr + d];
					dp[j] = p[j] * (g - di) * scale;
					for (int64_t d = 0; d < D; d++) {
						dq[((b * T + i) * H + h) * D + d] += dp[j] * k[kr + d];
						dk[kr + d] += dp[j] * qi[d];
						dv[kr + d] += p[j] * gi[d];
					}
				}
			}
	free(p);
	free(dp);
}

static double max_rel(const float *x, const double *ref, int64_t n)
{
	double m = 0, s = 0;
	for (int64_t i = 0; i < n; i++) {
		m = fmax(m, fabs(x[i] - ref[i]));
		s = fmax(s, fabs(ref[i]));
	}
	return s > 0 ? m / s : m;
}

static void test_attention_shape(int64_t B, int64_t T, int64_t H, int64_t K, int64_t D)
{
	int64_t nq = B * T * H * D, nk = B * T * K * D;
	float *q = randn(nq, 20, 1.0), *k = randn(nk, 21, 1.0), *v = randn(nk, 22, 1.0);
	float *g = randn(nq, 23, 1.0);
	float *o = malloc((size_t)nq * sizeof(float)), *lse = malloc((size_t)(B * H * T) * sizeof(float));
	float *dq[2], *dk[2], *dv[2];
	st_ws ws = ws_new(st_attention_workspace_bytes(B, T, H, K, D, omp_get_max_threads()), 0);
	CHECK(st_attention_forward(o, lse, q, k, v, B, T, H, K, D, &ws) == 0);
	for (int p = 0; p < 2; p++) {
		dq[p] = malloc((size_t)nq * sizeof(float));
		dk[p] = malloc((size_t)nk * sizeof(float));
		dv[p] = malloc((size_t)nk * sizeof(float));
		st_attention_set_partition(p + 1);
		CHECK(st_attention_backward(dq[p], dk[p], dv[p], g, o, lse, q, k, v, B, T, H, K, D, &ws) == 0);
	}
	st_ws_release(&ws);
	st_attention_set_partition(0);
	CHECK_MSG(same(dq[0], dq[1], nq * 4) && same(dk[0], dk[1], nk * 4) && same(dv[0], dv[1], nk * 4),
		  "attention backward partitions differ (B%lld T%lld H%lld K%lld D%lld)", (long long)B,
		  (long long)T, (long long)H, (long long)K, (long long)D);
	double *ro = malloc((size_t)nq * sizeof(double)), *rq = malloc((size_t)nq * sizeof(double));
	double *rk = malloc((size_t)nk * sizeof(double)), *rv = malloc((size_t)nk * sizeof(double));
	attention_ref(ro, rq, rk, rv, q, k, v, g, B, T, H, K, D);
	double e[4] = {max_rel(o, ro, nq), max_rel(dq[0], rq, nq), max_rel(dk[0], rk, nk),
		       max_rel(dv[0], rv, nk)};
	for (int i = 0; i < 4; i++)
		CHECK_MSG(e[i] < 2e-5, "attention B%lld T%lld H%lld K%lld D%lld: %s error %.2e",
			  (long long)B, (long long)T, (long long)H, (long long)K, (long long)D,
			  (const char *[]){"out", "dq", "dk", "dv"}[i], e[i]);
	printf("attention B%lld T%-3lld H%lld K%lld D%-3lld vs float64: out %.1e dq %.1e dk %.1e dv %.1e\n",
	       (long long)B, (long long)T, (long long)H, (long long)K, (long long)D, e[0], e[1], e[2], e[3]);
	free(q), free(k), free(v), free(g), free(o), free(lse), free(ro), free(rq), free(rk), free(rv);
	for (int p = 0; p < 2; p++)
		free(dq[p]), free(dk[p]), free(dv[p]);
}

/* ---- gemm ---- */

/* C = alpha op(A) op(B) + beta C0 in float64; absC (optional) = the same
 * with absolute values, the scale of rounding errors. */
static void gemm_ref(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
		     int64_t lda, const float *B, int64_t ldb, float beta, const float *C0, double *C,
		     double *absC, int64_t ldc)
{
	for (int64_t i = 0; i < M; i++)
		for (int64_t j = 0; j < N; j++) {
			double s = 0, sa = 0;
			for (int64_t p = 0; p < K; p++) {
				double a = ta == 'N' ? A[i * lda + p] : A[p * lda + i];
				double b = tb == 'N' ? B[p * ldb + j] : B[j * ldb + p];
				s += a * b;
				sa += fabs(a * b);
			}
			double c0 = beta != 0 ? beta * (double)C0[i * ldc + j] : 0.0;
			C[i * ldc + j] = alpha * s + c0;
			if (absC)
				absC[i * ldc + j] = fabs(alpha) * sa + fabs(c0);
		}
}

static void bf16_round(float *x, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		x[i] = st_bf16_to_f32(st_f32_to_bf16(x[i]));
}

/* One call shape through fp32 (both back ends) and bf16 (fp32 and bf16 C). */
static void gemm_case(char ta, char tb, int64_t M, int64_t N, int64_t K, int64_t pad, float alpha,
		      float beta)
{
	int64_t lda = (ta == 'N' ? K : M) + pad, ldb = (tb == 'N' ? N : K) + pad, ldc = N + pad;
	int64_t na = (ta == 'N' ? M : K) * lda, nb = (tb == 'N' ? K : N) * ldb, nc = M * ldc;
	float *A = randn(na, 30, 1.0), *B = randn(nb, 31, 1.0), *C0 = randn(nc, 32, 1.0);
	double *ref = malloc((size_t)nc * sizeof(double)), *ref_abs = malloc((size_t)nc * sizeof(double));
	gemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ref, ref_abs, ldc);
	double scale = sqrt((double)(K > 0 ? K : 1)) + 1.0;
	st_kctx kc;
	kctx_shape(&kc, ta, tb, M, N, K, 0);
	enum st_gemm_backend be0 = st_gemm_f32_backend();
	static const enum st_gemm_backend backends[] = {ST_GEMM_SGEMM, ST_GEMM_MATMUL, ST_GEMM_TILES};
	static const char *const names[] = {"sgemm", "matmul", "tiles"};
	for (int be = 0; be < 3; be++) {
		st_gemm_set_f32_backend(backends[be]);
		float *C = copyf(C0, nc);
		CHECK(st_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, &kc) == 0);
		double err = 0;
		for (int64_t i = 0; i < M; i++)
			for (int64_t j = 0; j < N; j++)
				err = fmax(err, fabs(C[i * ldc + j] - ref[i * ldc + j]) / scale);
		CHECK_MSG(err < 1e-5, "%s gemm %c%c %lldx%lldx%lld beta %g: error %.2e",
			  names[be], ta, tb, (long long)M, (long long)N, (long long)K,
			  (double)beta, err);
		for (int64_t i = 0; i < M; i++) /* padding columns untouched */
			for (int64_t j = N; j < ldc; j++)
				CHECK(C[i * ldc + j] == C0[i * ldc + j]);
		free(C);
	}
	st_gemm_set_f32_backend(be0);
	if (!st_cpu_has_bf16()) { /* oneDNN refuses bf16 products there */
		free(A), free(B), free(C0), free(ref), free(ref_abs);
		st_kctx_release(&kc);
		return;
	}

	/* bf16: against the float64 product of the bf16-rounded inputs (only fp32
	 * accumulation error), and of the fp32 inputs (bf16 rounding error). */
	uint16_t *Ah = malloc((size_t)na * 2), *Bh = malloc((size_t)nb * 2);
	st_f32_to_bf16_array(Ah, A, na);
	st_f32_to_bf16_array(Bh, B, nb);
	float *Ar = copyf(A, na), *Br = copyf(B, nb);
	bf16_round(Ar, na);
	bf16_round(Br, nb);
	double *refr = malloc((size_t)nc * sizeof(double));
	gemm_ref(ta, tb, M, N, K, alpha, Ar, lda, Br, ldb, beta, C0, refr, NULL, ldc);
	float *C = copyf(C0, nc);
	int rc = st_gemm_bf16(ta, tb, M, N, K, alpha, Ah, lda, Bh, ldb, beta, C, ldc, &kc);
	CHECK_MSG(rc == 0, "st_gemm_bf16 failed");
	/* err_bf: relative to sum |a b|, bounded by about 2 * 2^-9 (two roundings) */
	double err_acc = 0, err_bf = 0;
	for (int64_t i = 0; i < M; i++)
		for (int64_t j = 0; j < N; j++) {
			int64_t e = i * ldc + j;
			err_acc = fmax(err_acc, fabs(C[e] - refr[e]) / scale);
			err_bf = fmax(err_bf, fabs(C[e] - ref[e]) / (ref_abs[e] + 1e-30));
		}
	CHECK_MSG(rc || (err_acc < 1e-5 && err_bf < 4.0 / 512),
		  "bf16 gemm %c%c %lldx%lldx%lld: accumulation error %.2e, vs fp32 %.2e", ta, tb,
		  (long long)M, (long long)N, (long long)K, err_acc, err_bf);
	/* bf16 C: the fp32 result rounded once (beta 0), or near it */
	uint16_t *Ch = malloc((size_t)nc * 2);
	st_f32_to_bf16_array(Ch, C0, nc);
	rc = st_gemm_bf16_out(ta, tb, M, N, K, alpha, Ah, lda, Bh, ldb, beta, Ch, ldc, &kc);
	CHECK_MSG(rc == 0, "st_gemm_bf16_out failed");
	double err_h = 0;
	for (int64_t i = 0; i < M; i++)
		for (int64_t j = 0; j < N; j++)
			err_h = fmax(err_h, fabs(st_bf16_to_f32(Ch[i * ldc + j]) - refr[i * ldc + j]) /
						    (fabs(refr[i * ldc + j]) + scale));
	CHECK_MSG(rc || err_h < 1e-2, "bf16-out gemm error %.2e", err_h);
	free(A), free(B), free(C0), free(ref), free(ref_abs), free(Ah), free(Bh), free(Ar), free(Br), free(refr);
	free(C), free(Ch);
	st_kctx_release(&kc);
}

static void test_gemm(void)
{
	const char *tt[] = {"NN", "NT", "TN", "TT"};
	for (int t = 0; t < 4; t++) {
		gemm_case(tt[t][0], tt[t][1], 37, 29, 53, 0, 1.0f, 0.0f);
		gemm_case(tt[t][0], tt[t][1], 37, 29, 53, 3, 1.0f, 1.0f);
		gemm_case(tt[t][0], tt[t][1], 16, 70, 9, 5, 0.5f, -2.0f);
		gemm_case(tt[t][0], tt[t][1], 300, 270, 33, 3, 1.0f, 0.5f); /* several tiles (256 x 256 here) */
	}
	gemm_case('N', 'T', 130, 96, 200, 0, 1.0f, 1.0f);
	gemm_case('T', 'N', 96, 80, 1500, 3, 0.7f, 0.5f); /* long K: the tiles' chunks of tokens */
	gemm_case('T', 'N', 40, 24, 1027, 0, 1.0f, 0.0f);
	gemm_case('T', 'N', 64, 48, 1, 0, 1.0f, 1.0f);
	gemm_case('N', 'N', 5, 7, 0, 0, 1.0f, 0.5f); /* K = 0: C = beta C */
	gemm_case('N', 'N', 5, 7, 0, 0, 1.0f, 0.0f);
	st_kctx kc;
	kctx_shape(&kc, 'N', 'T', 64, 64, 64, 0);
	CHECK(st_gemm('N', 'N', 0, 5, 5, 1.0f, NULL, 5, NULL, 5, 0.0f, NULL, 5, &kc) == 0); /* empty */
	const char *impl = st_gemm_impl(ST_GEMM_BF16, 'N', 'T', 64, 64, 64, 64, 64, 64, 0.0f, &kc);
	printf("bf16 matmul implementation: %s (%s)\n", impl,
	       st_cpu_has_bf16() ? "AVX512_BF16" : st_cpu_bf16_message());
	CHECK(impl[0] != 0 || !st_cpu_has_bf16());
	CHECK(kc.nprims == (st_cpu_has_bf16() ? 1 : 0));
	st_gemm_cache_clear(&kc);
	CHECK(kc.nprims == 0 && !kc.stream);
	/* a cleared table recreates primitives */
	impl = st_gemm_impl(ST_GEMM_BF16, 'N', 'T', 64, 64, 64, 64, 64, 64, 0.0f, &kc);
	CHECK(impl[0] != 0 || !st_cpu_has_bf16());
	st_kctx_release(&kc);
	st_kctx_release(&kc); /* twice is fine */
	gemm_case('N', 'T', 8, 8, 8, 0, 1.0f, 0.0f);
}

/* ---- the AMX bf16 products ---- */

/* Small integers in bf16 (exact), seeded. */
static uint16_t *ints16(int64_t n, uint64_t stream, int range)
{
	uint16_t *x = malloc((size_t)(n > 0 ? n : 1) * 2);
	for (int64_t i = 0; i < n; i++)
		x[i] = st_f32_to_bf16((float)(st_rng_u64(7, stream, (uint64_t)i) % (2 * range + 1)) -
				      (float)range);
	return x;
}

static uint16_t *rand16(int64_t n, uint64_t stream)
{
	float *f = randn(n, stream, 1.0);
	uint16_t *x = malloc((size_t)(n > 0 ? n : 1) * 2);
	st_f32_to_bf16_array(x, f, n);
	free(f);
	return x;
}

/* One shape: exact on integers against an int64 reference (fp32 C, beta 0
 * and 1, and bf16 C), padding of C untouched. */
static void amx_exact_case(char ta, char tb, int64_t M, int64_t N, int64_t K, int64_t pad)
{
	int64_t lda = (ta == 'N' ? K : M) + pad, ldb = (tb == 'N' ? N : K) + pad, ldc = N + pad;
	int64_t na = (ta == 'N' ? M : K) * lda, nb = (tb == 'N' ? K : N) * ldb, nc = M * ldc;
	uint16_t *A = ints16(na, 40 + (uint64_t)M, 8), *B = ints16(nb, 41 + (uint64_t)N, 8);
	float *C = malloc((size_t)nc * sizeof(float)), *C0 = malloc((size_t)nc * sizeof(float));
	for (int64_t i = 0; i < nc; i++)
		C0[i] = (float)(i % 11) - 5.0f;
	st_kctx kc;
	kctx_shape(&kc, ta, tb, M, N, K, 0);
	for (int beta = 0; beta <= 1; beta++) {
		memcpy(C, C0, (size_t)nc * sizeof(float));
		int rc = st_amx_gemm_bf16(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, (float)beta, C, ldc, 0, &kc);
		CHECK_MSG(rc == 1, "AMX %c%c %lldx%lldx%lld beta %d: rc %d", ta, tb, (long long)M,
			  (long long)N, (long long)K, beta, rc);
		int64_t bad = 0, padbad = 0;
		for (int64_t i = 0; i < M; i++) {
			for (int64_t j = 0; j < N; j++) {
				int64_t acc = beta ? (int64_t)C0[i * ldc + j] : 0;
				for (int64_t k = 0; k < K; k++) {
					uint16_t a = ta == 'N' ? A[i * lda + k] : A[k * lda + i];
					uint16_t b = tb == 'N' ? B[k * ldb + j] : B[j * ldb + k];
					acc += (int64_t)st_bf16_to_f32(a) * (int64_t)st_bf16_to_f32(b);
				}
				bad += C[i * ldc + j] != (float)acc;
			}
			for (int64_t j = N; j < ldc; j++)
				padbad += C[i * ldc + j] != C0[i * ldc + j];
		}
		CHECK_MSG(bad == 0 && padbad == 0,
			  "AMX %c%c %lldx%lldx%lld pad %lld beta %d: %lld of %lld wrong, %lld padding "
			  "elements written", ta, tb, (long long)M, (long long)N, (long long)K,
			  (long long)pad, beta, (long long)bad, (long long)(M * N), (long long)padbad);
		if (beta || K > 2048)
			continue;
		/* bf16 C: the exact fp32 result rounded (C was beta 0's result) */
		uint16_t *H = malloc((size_t)nc * 2);
		for (int64_t i = 0; i < nc; i++)
			H[i] = 0x7fc1; /* padding marker */
		CHECK(st_amx_gemm_bf16(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, H, ldc, 1, &kc) == 1);
		int64_t hbad = 0;
		for (int64_t i = 0; i < M; i++)
			for (int64_t j = 0; j < ldc; j++)
				hbad += H[i * ldc + j] != (j < N ? st_f32_to_bf16(C[i * ldc + j]) : 0x7fc1);
		CHECK_MSG(hbad == 0, "AMX bf16 C %c%c %lldx%lldx%lld: %lld elements wrong", ta, tb,
			  (long long)M, (long long)N, (long long)K, (long long)hbad);
		free(H);
	}
	st_kctx_release(&kc);
	free(A), free(B), free(C), free(C0);
}

/* Random data: the same bits at 1, 2 and 3 threads (and at 3 in a context
 * sized for 1), and close to float64. */
static void amx_threads_case(char ta, char tb, int64_t M, int64_t N, int64_t K)
{
	int64_t lda = ta == 'N' ? K : M, ldb = tb == 'N' ? N : K;
	int64_t na = (ta == 'N' ? M : K) * lda, nb = (tb == 'N' ? K : N) * ldb;
	uint16_t *A = rand16(na, 50), *B = rand16(nb, 51);
	float *C[4];
	st_kctx kc, kc1;
	kctx_shape(&kc, ta, tb, M, N, K, 3);
	kctx_shape(&kc1, ta, tb, M, N, K, 1);
	for (int t = 0; t < 4; t++) {
		omp_set_num_threads(t < 3 ? t + 1 : 3);
		C[t] = calloc((size_t)(M * N), sizeof(float));
		CHECK(st_amx_gemm_bf16(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C[t], N, 0,
				       t < 3 ? &kc : &kc1) == 1);
	}
	omp_set_num_threads(omp_get_num_procs());
	st_kctx_release(&kc);
	st_kctx_release(&kc1);
	for (int t = 1; t < 4; t++)
		CHECK_MSG(same(C[0], C[t], M * N * (int64_t)sizeof(float)),
			  "AMX %c%c %lldx%lldx%lld differs at %d threads", ta, tb, (long long)M,
			  (long long)N, (long long)K, t + 1);
	double err = 0, scale = sqrt((double)K) + 1.0;
	for (int64_t i = 0; i < M; i += 7)
		for (int64_t j = 0; j < N; j += 5) {
			double ref = 0;
			for (int64_t k = 0; k < K; k++)
				ref += (double)st_bf16_to_f32(ta == 'N' ? A[i * lda + k] : A[k * lda + i]) *
				       (double)st_bf16_to_f32(tb == 'N' ? B[k * ldb + j] : B[j * ldb + k]);
			err = fmax(err, fabs(C[0][i * N + j] - ref) / scale);
		}
	CHECK_MSG(err < 1e-5, "AMX %c%c %lldx%lldx%lld: error %.2e against float64", ta, tb,
		  (long long)M, (long long)N, (long long)K, err);
	for (int t = 0; t < 4; t++)
		free(C[t]);
	free(A), free(B);
}

static void test_amx(void)
{
	if (!st_amx_available()) {
		printf("AMX products: not in use (no AMX-BF16 on this CPU, no tile state from the "
		       "kernel, a build without AVX-512, or ST_AMX=0; ST_AMX=%s): their checks "
		       "skipped\n", getenv("ST_AMX") ? getenv("ST_AMX") : "unset");
		return;
	}
	const char *tt[] = {"NN", "NT", "TN", "TT"};
	for (int t = 0; t < 4; t++) {
		char ta = tt[t][0], tb = tt[t][1];
		amx_exact_case(ta, tb, 64, 64, 64, 0);     /* whole tiles */
		amx_exact_case(ta, tb, 37, 50, 77, 3);     /* edges of M, N and K, odd K */
		amx_exact_case(ta, tb, 33, 300, 2100, 1);  /* two blocks of N and of K */
		amx_exact_case(ta, tb, 40, 70, 530, 1);    /* 17 k steps */
		amx_exact_case(ta, tb, 96, 32, 1, 0);      /* K = 1 */
		amx_exact_case(ta, tb, 1, 17, 40, 2);      /* one row */
		amx_exact_case(ta, tb, 64, 160, 530, 0);   /* bf16 C rounded as it goes, 5 blocks */
		amx_exact_case(ta, tb, 32, 128, 20, 0);    /* ... with one k step per block */
		amx_threads_case(ta, tb, 200, 290, 300);
	}
	/* calls this path leaves to oneDNN: it returns 0 and writes nothing */
	uint16_t *A = ints16(64 * 64, 60, 3), *B = ints16(64 * 64, 61, 3);
	float C[64 * 64];
	for (int i = 0; i < 64 * 64; i++)
		C[i] = 1.0f;
	st_kctx kc;
	kctx_shape(&kc, 'N', 'N', 64, 64, 64, 0);
	CHECK(st_amx_gemm_bf16('N', 'N', 64, 64, 64, 0.5f, A, 64, B, 64, 0.0f, C, 64, 0, &kc) == 0);
	CHECK(st_amx_gemm_bf16('N', 'N', 64, 64, 64, 1.0f, A, 64, B, 64, 0.5f, C, 64, 0, &kc) == 0);
	CHECK(st_amx_gemm_bf16('N', 'N', 64, 64, 64, 1.0f, A, 64, B, 64, 1.0f, C, 64, 1, &kc) == 0);
	st_amx_set_enabled(0);
	CHECK(!st_amx_available());
	CHECK(st_amx_workspace_bytes('N', 'N', 64, 64, 64, 0, 1) == 0);
	CHECK(st_amx_gemm_bf16('N', 'N', 64, 64, 64, 1.0f, A, 64, B, 64, 0.0f, C, 64, 0, &kc) == 0);
	st_amx_set_enabled(1);
	/* a context too small, or none: refused, nothing written */
	st_kctx small;
	CHECK(st_kctx_init(&small, st_amx_workspace_bytes('N', 'N', 64, 64, 64, 0, 1) - 64, 1) == 0);
	int rc = st_amx_gemm_bf16('N', 'N', 64, 64, 64, 1.0f, A, 64, B, 64, 0.0f, C, 64, 0, &small);
	CHECK_MSG(rc == ST_EINVAL && strstr(st_errmsg(), "AMX"), "AMX product in a small context: rc %d", rc);
	CHECK(st_amx_gemm_bf16('N', 'N', 64, 64, 64, 1.0f, A, 64, B, 64, 0.0f, C, 64, 0, NULL) == ST_EINVAL);
	st_kctx_release(&small);
	int untouched = 1;
	for (int i = 0; i < 64 * 64; i++)
		untouched &= C[i] == 1.0f;
	CHECK(untouched);
	/* long K with a bf16 C goes to oneDNN (its sums would not fit one block) */
	uint16_t *Al = ints16(2 * 2100, 62, 3), *Bl = ints16(2100 * 2, 63, 3), H[4] = {0};
	CHECK(st_amx_workspace_bytes('N', 'N', 2, 2, 2100, 1, 1) == 0);
	CHECK(st_amx_gemm_bf16('N', 'N', 2, 2, 2100, 1.0f, Al, 2100, Bl, 2, 0.0f, H, 2, 1, &kc) == 0);
	st_kctx_release(&kc);
	free(A), free(B), free(Al), free(Bl);
}

/* The residual forms (gemm.h's st_gemm_bf16_res, st_gemm_res): C = R + A B
 * with C's old contents never read, the same bits as copying R into C and
 * accumulating (beta 1), on the AMX path, oneDNN's (ST_AMX off) and fp32;
 * random data, so any change in the order of the sums shows. */
static void gemm_res_case(char ta, char tb, int64_t M, int64_t N, int64_t K)
{
	int64_t lda = ta == 'N' ? K : M, ldb = tb == 'N' ? N : K, ldc = N + 5, nc = M * ldc;
	int64_t na = (ta == 'N' ? M : K) * lda, nb = (tb == 'N' ? K : N) * ldb;
	uint16_t *A = rand16(na, 80), *B = rand16(nb, 81);
	float *Af = malloc((size_t)na * sizeof(float)), *Bf = malloc((size_t)nb * sizeof(float));
	st_bf16_to_f32_array(Af, A, na);
	st_bf16_to_f32_array(Bf, B, nb);
	float *R = randn(nc, 82, 1.0), *want = malloc((size_t)nc * sizeof(float)),
	      *C = malloc((size_t)nc * sizeof(float));
	st_kctx kc;
	kctx_shape(&kc, ta, tb, M, N, K, 0);
	for (int amx = 1; amx >= 0; amx--) {
		st_amx_set_enabled(amx);
		memcpy(want, R, (size_t)nc * sizeof(float));
		CHECK(st_gemm_bf16(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, want, ldc, &kc) == 0);
		for (int64_t i = 0; i < nc; i++)
			C[i] = NAN; /* C's old contents must not matter */
		CHECK(st_gemm_bf16_res(ta, tb, M, N, K, A, lda, B, ldb, R, C, ldc, &kc) == 0);
		/* the padding past N in each row is R's (copied) or untouched (NaN) */
		int64_t bad = 0;
		for (int64_t i = 0; i < M; i++)
			bad += !same(C + i * ldc, want + i * ldc, N * (int64_t)sizeof(float));
		CHECK_MSG(bad == 0, "bf16 residual product %c%c %lldx%lldx%lld (AMX %s): %lld rows differ "
			  "from copy and accumulate", ta, tb, (long long)M, (long long)N, (long long)K,
			  amx && st_amx_available() ? "on" : "off", (long long)bad);
		/* R == C: the plain accumulation */
		memcpy(C, R, (size_t)nc * sizeof(float));
		CHECK(st_gemm_bf16_res(ta, tb, M, N, K, A, lda, B, ldb, C, C, ldc, &kc) == 0);
		CHECK(same(C, want, nc * (int64_t)sizeof(float)));
	}
	st_amx_set_enabled(1);
	memcpy(want, R, (size_t)nc * sizeof(float));
	CHECK(st_gemm(ta, tb, M, N, K, 1.0f, Af, lda, Bf, ldb, 1.0f, want, ldc, &kc) == 0);
	for (int64_t i = 0; i < nc; i++)
		C[i] = NAN;
	CHECK(st_gemm_res(ta, tb, M, N, K, Af, lda, Bf, ldb, R, C, ldc, &kc) == 0);
	int64_t bad = 0;
	for (int64_t i = 0; i < M; i++)
		bad += !same(C + i * ldc, want + i * ldc, N * (int64_t)sizeof(float));
	CHECK_MSG(bad == 0, "fp32 residual product %c%c %lldx%lldx%lld: %lld rows differ", ta, tb,
		  (long long)M, (long long)N, (long long)K, (long long)bad);
	st_kctx_release(&kc);
	free(A), free(B), free(Af), free(Bf), free(R), free(want), free(C);
}

static void test_gemm_res(void)
{
	gemm_res_case('N', 'T', 64, 96, 768);   /* whole strips */
	gemm_res_case('N', 'T', 50, 70, 300);   /* edges of M and N: the scratch strip */
	gemm_res_case('T', 'N', 96, 40, 2100);  /* two blocks of K */
	gemm_res_case('N', 'N', 33, 600, 128);  /* two blocks of N */
}

/* st_amx_dp_tile, the bf16 attention's tile products: exact on integer
 * words against int64, A read by rows (sc 1) and transposed (sr 1), C
 * accumulated or scaled, strided C; and the shapes it leaves to the caller. */
static void amx_dp_case(int64_t m, int64_t N, int64_t np, int transposed, int acc)
{
	int64_t ldb = N + 16, ldc = N + 3, sr = transposed ? 1 : np + 5, sc = transposed ? m + 7 : 1;
	int64_t na = transposed ? np * sc : m * sr;
	uint16_t *A = ints16(2 * na, 70 + (uint64_t)m, 6), *B = ints16(2 * np * ldb, 71 + (uint64_t)N, 6);
	const uint32_t *Aw = (const uint32_t *)A, *Bw = (const uint32_t *)B;
	float *C = malloc((size_t)(m * ldc) * sizeof(float)), *C0 = malloc((size_t)(m * ldc) * sizeof(float));
	for (int64_t i = 0; i < m * ldc; i++)
		C0[i] = C[i] = (float)(i % 9) - 4.0f;
	float scale = acc ? 1.0f : 0.25f;
	CHECK(st_amx_dp_tile(C, ldc, m, N, Aw, sr, sc, np, Bw, ldb, acc, scale) == 1);
	int64_t bad = 0;
	for (int64_t r = 0; r < m; r++)
		for (int64_t j = 0; j < ldc; j++) {
			if (j >= N) {
				bad += C[r * ldc + j] != C0[r * ldc + j];
				continue;
			}
			int64_t s = 0;
			for (int64_t p = 0; p < np; p++) {
				const uint16_t *a = A + 2 * (r * sr + p * sc), *b = B + 2 * (p * ldb + j);
				s += (int64_t)st_bf16_to_f32(a[0]) * (int64_t)st_bf16_to_f32(b[0]) +
				     (int64_t)st_bf16_to_f32(a[1]) * (int64_t)st_bf16_to_f32(b[1]);
			}
			float want = acc ? C0[r * ldc + j] + (float)s : scale * (float)s;
			bad += C[r * ldc + j] != want;
		}
	CHECK_MSG(bad == 0, "AMX tile product %lldx%lldx%lld %s acc %d: %lld wrong", (long long)m,
		  (long long)N, (long long)np, transposed ? "transposed" : "rows", acc, (long long)bad);
	free(A), free(B), free(C), free(C0);
}

static void test_amx_dp_tile(void)
{
	if (!st_amx_available())
		return; /* test_amx said why */
	for (int tr = 0; tr <= 1; tr++)
		for (int acc = 0; acc <= 1; acc++) {
			amx_dp_case(64, 64, 32, tr, acc);
			amx_dp_case(48, 16, 64, tr, acc); /* odd numbers of tiles */
			amx_dp_case(16, 80, 16, tr, acc);
		}
	/* shapes for the caller's vector path: 0, nothing written */
	uint32_t w[64 * 64] = {0};
	float c[64 * 64];
	c[0] = 5.0f;
	CHECK(st_amx_dp_tile(c, 64, 24, 64, w, 32, 1, 32, w, 64, 1, 1.0f) == 0); /* m */
	CHECK(st_amx_dp_tile(c, 64, 64, 40, w, 32, 1, 32, w, 64, 1, 1.0f) == 0); /* N */
	CHECK(st_amx_dp_tile(c, 64, 64, 64, w, 40, 1, 24, w, 64, 1, 1.0f) == 0); /* np */
	CHECK(st_amx_dp_tile(c, 64, 80, 64, w, 32, 1, 32, w, 64, 1, 1.0f) == 0); /* m > 64 */
	CHECK(st_amx_dp_tile(c, 64, 64, 64, w, 2, 3, 32, w, 64, 1, 1.0f) == 0);  /* strides */
	CHECK(c[0] == 5.0f);
}

/* ---- bf16 conversions ---- */

static uint32_t bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float from_bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static void test_bf16_conversion(void)
{
	struct { uint32_t in; uint16_t out; } cases[] = {
		{0x3f800000, 0x3f80}, /* 1 */
		{0x3f808000, 0x3f80}, /* tie, even stays: 1 + 2^-8 -> 1 */
		{0x3f818000, 0x3f82}, /* tie, odd rounds up */
		{0x3f808001, 0x3f81}, /* above the tie */
		{0x3f807fff, 0x3f80}, /* below the tie */
		{0x80000000, 0x8000}, /* -0 */
		{0x7f800000, 0x7f80}, /* +Inf */
		{0xff800000, 0xff80}, /* -Inf */
		{0x7f7fffff, 0x7f80}, /* FLT_MAX rounds to Inf */
		{0x7f7f7fff, 0x7f7f}, /* largest that stays finite */
		{0x00000001, 0x0000}, /* smallest subnormal rounds to 0 */
		{0x00008000, 0x0000}, /* subnormal tie, even */
		{0x00018000, 0x0002}, /* subnormal tie, odd up */
		{0x00400000, 0x0040}, /* subnormal kept (no flush to zero) */
		{0x807fffff, 0x8080}, /* negative subnormal rounds up to -FLT_MIN */
		{0x7fc00000, 0x7fc0}, /* quiet NaN */
		{0x7f800001, 0x7fc0}, /* signalling NaN with low payload: stays NaN */
		{0xff800001, 0xffc0}, /* negative NaN keeps its sign */
		{0x7fffffff, 0x7fff}, /* NaN that rounding would carry into the sign */
	};
	int n = (int)(sizeof(cases) / sizeof(cases[0]));
	float in[64];
	uint16_t out[64];
	for (int i = 0; i < n; i++) {
		uint16_t h = st_f32_to_bf16(from_bits(cases[i].in));
		CHECK_MSG(h == cases[i].out, "bf16(0x%08x) = 0x%04x, want 0x%04x", cases[i].in, h,
			  cases[i].out);
		in[i] = from_bits(cases[i].in);
	}
	st_f32_to_bf16_array(out, in, n); /* vector path with a masked tail */
	for (int i = 0; i < n; i++)
		CHECK_MSG(out[i] == cases[i].out, "array bf16(0x%08x) = 0x%04x", cases[i].in, out[i]);
	/* every bf16 value converts back exactly and round-trips */
	for (uint32_t h = 0; h < 65536; h++) {
		float f = st_bf16_to_f32((uint16_t)h);
		CHECK(bits(f) == h << 16);
		if (!isnan(f))
			CHECK(st_f32_to_bf16(f) == h);
	}
	/* arrays of every length up to 100 (and a large one) equal the scalar rule */
	int64_t big = 3 * 32768 + 17;
	float *x = randn(big, 40, 100.0);
	for (int64_t i = 0; i < big; i += 97)
		x[i] = from_bits((uint32_t)st_rng_below(41, 0, (uint64_t)i, 0xffffffffu)); /* any bits */
	uint16_t *h = malloc((size_t)big * 2);
	float *back = malloc((size_t)big * sizeof(float));
	for (int64_t len = 0; len <= 100; len++) {
		memset(h, 0xab, 202);
		st_f32_to_bf16_array(h, x, len);
		for (int64_t i = 0; i < len; i++)
			CHECK(h[i] == st_f32_to_bf16(x[i]));
		CHECK(h[len] == 0xabab); /* nothing written past the end */
	}
	st_f32_to_bf16_array(h, x, big);
	st_bf16_to_f32_array(back, h, big);
	int64_t bad = 0;
	for (int64_t i = 0; i < big; i++)
		bad += h[i] != st_f32_to_bf16(x[i]) || bits(back[i]) != (uint32_t)h[i] << 16;
	CHECK_MSG(bad == 0, "%lld array conversions differ from the scalar rule", (long long)bad);
	/* round in place, keeping the bits (every length up to 100, tails, and the large one) */
	for (int64_t len = 0; len <= 100; len++) {
		memcpy(back, x, (size_t)(len + 1) * sizeof(float));
		memset(h, 0xab, 202);
		st_bf16_round_keep(h, back, len);
		for (int64_t i = 0; i < len; i++)
			CHECK(h[i] == st_f32_to_bf16(x[i]) && bits(back[i]) == (uint32_t)h[i] << 16);
		CHECK(h[len] == 0xabab && bits(back[len]) == bits(x[len]));
	}
	memcpy(back, x, (size_t)big * sizeof(float));
	st_bf16_round_keep(h, back, big);
	bad = 0;
	for (int64_t i = 0; i < big; i++)
		bad += h[i] != st_f32_to_bf16(x[i]) || bits(back[i]) != (uint32_t)h[i] << 16;
	CHECK_MSG(bad == 0, "%lld in-place roundings differ from the scalar rule", (long long)bad);
	free(x), free(h), free(back);
}

/* bf16-output kernels: the fp32 result rounded once, bit for bit */
static void test_bf16_outputs(void)
{
	enum { N = 7, C = 50, n = 1000 };
	float *x = randn(N * C, 50, 1.0), *w = randn(C, 51, 1.0), *y = malloc(N * C * sizeof(float));
	float r1[N], r2[N];
	uint16_t *yh = malloc(N * C * 2);
	st_rmsnorm_forward(y, r1, x, w, N, C, 1e-5f);
	st_rmsnorm_forward_bf16(yh, r2, x, w, N, C, 1e-5f);
	int bad = memcmp(r1, r2, sizeof(r1)) != 0;
	for (int i = 0; i < N * C; i++)
		bad += yh[i] != st_f32_to_bf16(y[i]);
	CHECK_MSG(bad == 0, "rmsnorm bf16 output differs from the rounded fp32 output (%d)", bad);
	/* the same rounded values, and their exact fp32 copies in the same pass */
	uint16_t *yk = malloc(N * C * 2);
	float *y32 = malloc(N * C * sizeof(float)), r3[N];
	st_rmsnorm_forward_keep(yk, y32, r3, x, w, N, C, 1e-5f);
	bad = memcmp(r1, r3, sizeof(r1)) != 0 || memcmp(yk, yh, N * C * 2) != 0;
	for (int i = 0; i < N * C; i++)
		bad += bits(y32[i]) != (uint32_t)yh[i] << 16;
	CHECK_MSG(bad == 0, "rmsnorm's kept bf16 output or its fp32 copy differs (%d)", bad);
	free(yk), free(y32);
	float *g = randn(n, 52, 2.0), *u = randn(n, 53, 1.0), *d = randn(n, 54, 1.0);
	float *a = malloc(n * sizeof(float)), *dg = malloc(n * sizeof(float)), *du = malloc(n * sizeof(float));
	uint16_t *ah = malloc(n * 2), *dgh = malloc(n * 2), *duh = malloc(n * 2);
	/* bf16 mode keeps gate and up rounded: the backward reads those bf16
	 * values, and must equal the fp32 backward on the same (rounded) values */
	bf16_round(g, n), bf16_round(u, n);
	uint16_t *gh = malloc(n * 2), *uh = malloc(n * 2);
	for (int i = 0; i < n; i++)
		gh[i] = st_f32_to_bf16(g[i]), uh[i] = st_f32_to_bf16(u[i]);
	float *dg2 = malloc(n * sizeof(float)), *du2 = malloc(n * sizeof(float));
	st_swiglu_forward(a, g, u, n);
	st_swiglu_forward_bf16(ah, g, u, n);
	st_swiglu_backward(dg, du, d, g, u, n);
	st_swiglu_backward_bf16(dgh, duh, d, gh, uh, n);
	memcpy(du2, d, n * sizeof(float)); /* dup over dact, as the model calls it */
	st_swiglu_backward_gu16(dg2, du2, du2, gh, uh, n);
	uint16_t *ah2 = malloc(n * 2);
	st_swiglu_forward_gu16(ah2, gh, uh, n);
	CHECK_MSG(memcmp(ah, ah2, n * 2) == 0, "swiglu forward from bf16 gate/up differs");
	free(ah2);
	bad = 0;
	for (int i = 0; i < n; i++)
		bad += ah[i] != st_f32_to_bf16(a[i]) || dgh[i] != st_f32_to_bf16(dg[i]) ||
		       duh[i] != st_f32_to_bf16(du[i]);
	CHECK_MSG(bad == 0, "swiglu bf16 outputs differ from the rounded fp32 outputs (%d)", bad);
	CHECK_MSG(memcmp(dg, dg2, n * sizeof(float)) == 0 && memcmp(du, du2, n * sizeof(float)) == 0,
		  "swiglu backward from bf16 gate/up differs from the fp32 one on the same values");
	/* each value by the same formula wherever it lies (vector body or tail) */
	bad = 0;
	for (int i = n - 20; i < n; i++) {
		float a1, dg1, du1;
		st_swiglu_forward(&a1, g + i, u + i, 1);
		st_swiglu_backward(&dg1, &du1, d + i, g + i, u + i, 1);
		bad += memcmp(&a1, a + i, 4) || memcmp(&dg1, dg + i, 4) || memcmp(&du1, du + i, 4);
	}
	CHECK_MSG(bad == 0, "swiglu of one value differs from the same value among %d (%d)", n, bad);
	free(x), free(w), free(y), free(yh), free(g), free(u), free(d), free(a), free(dg), free(du);
	free(ah), free(dgh), free(duh), free(gh), free(uh), free(dg2), free(du2);

	/* SwiGLU from unrounded fp32 gate and up, rounding them as it reads them:
	 * the kept copies as st_f32_to_bf16 gives them, act as _gu16 from those,
	 * act's fp32 copy exact, also when it is written over gate itself (n: a
	 * tail in one block, and several blocks with a tail) */
	int64_t ns[] = {1003, 3 * 4096 + 21};
	for (int k = 0; k < 2; k++) {
		int64_t nk = ns[k];
		float *gf = randn(nk, 60 + k, 2.0), *uf = randn(nk, 62 + k, 1.0);
		float *a32 = malloc(nk * sizeof(float)), *gal = malloc(nk * sizeof(float));
		uint16_t *g16 = malloc(nk * 2), *u16 = malloc(nk * 2), *ak = malloc(nk * 2),
			 *aref = malloc(nk * 2), *ak2 = malloc(nk * 2), *g16b = malloc(nk * 2),
			 *u16b = malloc(nk * 2);
		memcpy(gal, gf, nk * sizeof(float));
		st_swiglu_forward_keep(ak, a32, g16, u16, gf, uf, nk);
		st_swiglu_forward_keep(ak2, gal, g16b, u16b, gal, uf, nk); /* act32 over gate */
		bad = 0;
		for (int64_t i = 0; i < nk; i++)
			bad += g16[i] != st_f32_to_bf16(gf[i]) || u16[i] != st_f32_to_bf16(uf[i]);
		st_swiglu_forward_gu16(aref, g16, u16, nk);
		bad += memcmp(ak, aref, nk * 2) != 0 || memcmp(ak2, aref, nk * 2) != 0 ||
		       memcmp(g16b, g16, nk * 2) != 0 || memcmp(u16b, u16, nk * 2) != 0;
		for (int64_t i = 0; i < nk; i++)
			bad += bits(a32[i]) != (uint32_t)aref[i] << 16 || bits(gal[i]) != bits(a32[i]);
		CHECK_MSG(bad == 0, "swiglu rounding fp32 gate/up as it reads them differs (n %lld: %d)",
			  (long long)nk, bad);
		free(gf), free(uf), free(a32), free(gal), free(g16), free(u16), free(ak), free(aref);
		free(ak2), free(g16b), free(u16b);
	}

	/* cross-entropy gradient rows in bf16: to a separate array, and in place
	 * over the logits' own rows (ldo = 2V), identical */
	enum { R = 5, V = 1003 };
	float *l = randn(R * V, 55, 0.1), *l2 = malloc(R * V * sizeof(float)), rs[R];
	int32_t tg[R] = {0, 1002, 17, 500, 999};
	double sum[R];
	float mx[R], tl[R];
	st_xent_rows_exp(l, mx, sum, tl, tg, 0, R, V);
	for (int r = 0; r < R; r++)
		rs[r] = (float)(0.5 / sum[r]);
	memcpy(l2, l, R * V * sizeof(float));
	uint16_t *sep = malloc(R * V * 2), *inp = (uint16_t *)l2;
	st_xent_rows_grad_bf16(sep, V, l, rs, tg, 0, R, V, 0.5f);
	st_xent_rows_grad_bf16(inp, 2 * V, l2, rs, tg, 0, R, V, 0.5f);
	st_xent_rows_grad(l, rs, tg, 0, R, V, 0.5f);
	bad = 0;
	for (int r = 0; r < R; r++)
		for (int c = 0; c < V; c++)
			bad += sep[r * V + c] != st_f32_to_bf16(l[r * V + c]) ||
			       inp[r * 2 * V + c] != sep[r * V + c];
	CHECK_MSG(bad == 0, "bf16 cross-entropy gradient rows differ (separate or in place: %d)", bad);
	free(l), free(l2), free(sep);

	/* rows rounded in place (rows of 37, and of 2048 so that threads split
	 * them): each value as st_f32_to_bf16 gives it, row r at 2 * cols * r */
	int64_t shapes[][2] = {{9, 37}, {64, 2048}};
	for (int k = 0; k < 2; k++) {
		int64_t nr = shapes[k][0], nc = shapes[k][1];
		float *v = randn(nr * nc, 56 + k, 3.0), *keep = malloc(nr * nc * sizeof(float));
		v[0] = NAN, v[nc + 1] = 1e-40f, v[2] = -INFINITY; /* quiet NaN, subnormal kept */
		memcpy(keep, v, nr * nc * sizeof(float));
		uint16_t *h = st_bf16_rows_in_place(v, nr, nc);
		bad = (void *)h != (void *)v;
		for (int64_t r = 0; r < nr; r++)
			for (int64_t c = 0; c < nc; c++)
				bad += h[r * 2 * nc + c] != st_f32_to_bf16(keep[r * nc + c]);
		CHECK_MSG(bad == 0, "st_bf16_rows_in_place %lld x %lld: %d values differ", (long long)nr,
			  (long long)nc, bad);
		free(v), free(keep);
	}
}

/* ---- bf16 attention ---- */

typedef struct att_out {
	float *o, *lse, *dq, *dk, *dv;
} att_out;

/* st_attention_forward_bf16, then st_attention_backward_bf16 in partition
 * `part` (1 fused, 2 split), at `threads` threads. */
static void att_bf16_run(att_out *r, const float *q, const float *k, const float *v,
			 const float *g, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D,
			 int part, int threads)
{
	int64_t nq = B * T * H * D, nk = B * T * K * D;
	r->o = malloc((size_t)nq * sizeof(float));
	r->lse = malloc((size_t)(B * H * T) * sizeof(float));
	r->dq = malloc((size_t)nq * sizeof(float));
	r->dk = malloc((size_t)nk * sizeof(float));
	r->dv = malloc((size_t)nk * sizeof(float));
	/* the kernel's inputs: q, k, v rounded to bf16, as the model keeps them */
	uint16_t *qh = bf16_copy(q, nq), *kh = bf16_copy(k, nk), *vh = bf16_copy(v, nk);
	omp_set_num_threads(threads);
	st_ws ws = ws_new(st_attention_bf16_workspace_bytes(B, T, H, K, D, threads), threads);
	CHECK(st_attention_forward_bf16(r->o, r->lse, qh, kh, vh, B, T, H, K, D, &ws) == 0);
	st_attention_set_partition(part);
	CHECK(st_attention_backward_bf16(r->dq, r->dk, r->dv, g, r->o, r->lse, qh, kh, vh, B, T, H, K,
					 D, &ws) == 0);
	st_attention_set_partition(0);
	st_ws_release(&ws);
	free(qh), free(kh), free(vh);
	omp_set_num_threads(omp_get_num_procs());
}

static int att_same(const att_out *a, const att_out *b, int64_t B, int64_t T, int64_t H,
		    int64_t K, int64_t D)
{
	int64_t nq = B * T * H * D, nk = B * T * K * D;
	return same(a->o, b->o, nq * 4) && same(a->lse, b->lse, B * H * T * 4) &&
	       same(a->dq, b->dq, nq * 4) && same(a->dk, b->dk, nk * 4) && same(a->dv, b->dv, nk * 4);
}

static void att_free(att_out *r) { free(r->o), free(r->lse), free(r->dq), free(r->dk), free(r->dv); }

/*
 * Against the float64 reference, as max |error| / max |reference| per
 * output: of the exact inputs, within 1.5e-2 (bf16 keeps 8 bits: 2^-9
 * relative rounding per input; seen: 2.5e-3 to 6e-3); of the inputs rounded
 * to bf16, what is left is the rounding of P (out: within 3e-3, seen 1e-3)
 * and of dS (gradients: within 1e-2, seen up to 4e-3). The two backward
 * partitions agree bitwise, and rounding q, k and v to bf16 first changes no
 * bit of any output (the kernel rounds them once itself).
 */
static void test_attention_bf16_shape(int64_t B, int64_t T, int64_t H, int64_t K, int64_t D)
{
	int64_t nq = B * T * H * D, nk = B * T * K * D;
	float *q = randn(nq, 30, 1.0), *k = randn(nk, 31, 1.0), *v = randn(nk, 32, 1.0);
	float *g = randn(nq, 33, 1.0);
	att_out r[2], rr;
	for (int p = 0; p < 2; p++)
		att_bf16_run(&r[p], q, k, v, g, B, T, H, K, D, p + 1, 1);
	CHECK_MSG(att_same(&r[0], &r[1], B, T, H, K, D),
		  "bf16 attention backward partitions differ (B%lld T%lld H%lld K%lld D%lld)",
		  (long long)B, (long long)T, (long long)H, (long long)K, (long long)D);

	double *ro = malloc((size_t)nq * sizeof(double)), *rq = malloc((size_t)nq * sizeof(double));
	double *rk = malloc((size_t)nk * sizeof(double)), *rv = malloc((size_t)nk * sizeof(double));
	float *qh = copyf(q, nq), *kh = copyf(k, nk), *vh = copyf(v, nk), *gh = copyf(g, nq);
	bf16_round(qh, nq), bf16_round(kh, nk), bf16_round(vh, nk), bf16_round(gh, nq);
	double e[2][4];
	for (int x = 0; x < 2; x++) {
		if (x == 0)
			attention_ref(ro, rq, rk, rv, q, k, v, g, B, T, H, K, D);
		else
			attention_ref(ro, rq, rk, rv, qh, kh, vh, gh, B, T, H, K, D);
		e[x][0] = max_rel(r[0].o, ro, nq);
		e[x][1] = max_rel(r[0].dq, rq, nq);
		e[x][2] = max_rel(r[0].dk, rk, nk);
		e[x][3] = max_rel(r[0].dv, rv, nk);
		for (int i = 0; i < 4; i++)
			CHECK_MSG(e[x][i] < (x == 0 ? 1.5e-2 : i == 0 ? 3e-3 : 1e-2),
				  "bf16 attention B%lld T%lld H%lld K%lld D%lld: %s error %.2e vs the "
				  "float64 reference of the %s inputs",
				  (long long)B, (long long)T, (long long)H, (long long)K, (long long)D,
				  (const char *[]){"out", "dq", "dk", "dv"}[i], e[x][i],
				  x ? "bf16-rounded" : "exact");
	}
	printf("bf16 attention B%lld T%-3lld H%lld K%lld D%-3lld vs float64: out %.1e dq %.1e dk %.1e "
	       "dv %.1e; of bf16 inputs: out %.1e dq %.1e dk %.1e dv %.1e\n",
	       (long long)B, (long long)T, (long long)H, (long long)K, (long long)D, e[0][0], e[0][1],
	       e[0][2], e[0][3], e[1][0], e[1][1], e[1][2], e[1][3]);

	att_bf16_run(&rr, qh, kh, vh, g, B, T, H, K, D, 1, 1);
	CHECK_MSG(att_same(&r[0], &rr, B, T, H, K, D),
		  "bf16 attention: inputs rounded to bf16 beforehand change the results (B%lld T%lld "
		  "H%lld K%lld D%lld)",
		  (long long)B, (long long)T, (long long)H, (long long)K, (long long)D);
	att_free(&r[0]), att_free(&r[1]), att_free(&rr);
	free(q), free(k), free(v), free(g), free(qh), free(kh), free(vh), free(gh);
	free(ro), free(rq), free(rk), free(rv);
}

/* Bit-identical results at 1, 2 and 3 threads, in both backward partitions. */
static void test_attention_bf16_threads(int64_t B, int64_t T, int64_t H, int64_t K, int64_t D)
{
	int64_t nq = B * T * H * D, nk = B * T * K * D;
	float *q = randn(nq, 40, 1.0), *k = randn(nk, 41, 1.0), *v = randn(nk, 42, 1.0);
	float *g = randn(nq, 43, 1.0);
	att_out r0;
	att_bf16_run(&r0, q, k, v, g, B, T, H, K, D, 1, 1);
	for (int t = 1; t <= 3; t++)
		for (int p = 1; p <= 2; p++) {
			att_out r;
			att_bf16_run(&r, q, k, v, g, B, T, H, K, D, p, t);
			CHECK_MSG(att_same(&r0, &r, B, T, H, K, D),
				  "bf16 attention (B%lld T%lld H%lld K%lld D%lld) at %d threads, "
				  "partition %d differs from 1 thread, partition 1",
				  (long long)B, (long long)T, (long long)H, (long long)K, (long long)D, t,
				  p);
			att_free(&r);
		}
	att_free(&r0);
	free(q), free(k), free(v), free(g);
}

/* Small integers: every product and sum below is exact in bf16 and fp32. */
static float *small_ints(int64_t n, uint64_t stream)
{
	float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
	for (int64_t i = 0; i < n; i++)
		x[i] = (float)((int)(st_rng_normal(99, stream, (uint64_t)i) * 1.5) % 4);
	return x;
}

/*
 * Exact expectations, on inputs that are small integers.
 * T = 1: one key, P = 1: out = v, lse = scale * q.k, dv = dout, and
 * dP = dout.v = rowsum(dout o out) exactly, so dq = dk = 0.
 * q = 0: every score 0, uniform attention over the keys up to each query
 * (across tiles, T = 150): out[t] = (sum of v[0..t]) * (1 / (t+1)) and
 * lse[t] = log(t+1), in fp32 as the kernel does it.
 */
static void test_attention_bf16_exact(int64_t B, int64_t H, int64_t K, int64_t D)
{
	int64_t T = 1, nq = B * H * D, nk = B * K * D, group = H / K, bad = 0;
	float *q = small_ints(nq, 50), *k = small_ints(nk, 51), *v = small_ints(nk, 52);
	float *g = small_ints(nq, 53), scale = (float)(1.0 / sqrt((double)D));
	att_out r;
	att_bf16_run(&r, q, k, v, g, B, T, H, K, D, 1, 1);
	for (int64_t b = 0; b < B; b++)
		for (int64_t h = 0; h < H; h++) {
			const float *qi = q + (b * H + h) * D, *vj = v + (b * K + h / group) * D;
			const float *kj = k + (b * K + h / group) * D;
			float dot = 0.0f;
			for (int64_t d = 0; d < D; d++) {
				dot += qi[d] * kj[d];
				bad += r.o[(b * H + h) * D + d] != vj[d];
				bad += r.dq[(b * H + h) * D + d] != 0.0f;
			}
			bad += r.lse[b * H + h] != dot * scale;
		}
	for (int64_t i = 0; i < nk; i++) {
		/* dv sums dout over the group's heads, in head order */
		int64_t bk = i / D, d = i % D;
		float s = 0.0f;
		for (int64_t h = (bk % K) * group; h < (bk % K + 1) * group; h++)
			s += g[((bk / K) * H + h) * D + d];
		bad += r.dv[i] != s || r.dk[i] != 0.0f;
	}
	CHECK_MSG(bad == 0, "bf16 attention T=1 (B%lld H%lld K%lld D%lld): %lld values differ from "
		  "the exact ones", (long long)B, (long long)H, (long long)K, (long long)D, (long long)bad);
	att_free(&r);
	free(q), free(k), free(v), free(g);

	T = 150;
	nq = B * T * H * D, nk = B * T * K * D;
	q = calloc((size_t)nq, sizeof(float));
	k = small_ints(nk, 54), v = small_ints(nk, 55), g = small_ints(nq, 56);
	att_bf16_run(&r, q, k, v, g, B, T, H, K, D, 2, 1);
	bad = 0;
	float *sum = malloc((size_t)D * sizeof(float));
	for (int64_t b = 0; b < B; b++)
		for (int64_t h = 0; h < H; h++) {
			memset(sum, 0, (size_t)D * sizeof(float));
			for (int64_t t = 0; t < T; t++) {
				float inv = 1.0f / (float)(t + 1);
				for (int64_t d = 0; d < D; d++) {
					sum[d] += v[((b * T + t) * K + h / group) * D + d];
					bad += r.o[((b * T + t) * H + h) * D + d] != sum[d] * inv;
				}
				bad += r.lse[(b * H + h) * T + t] != logf((float)(t + 1));
			}
		}
	CHECK_MSG(bad == 0, "bf16 attention, uniform (B%lld T%lld H%lld K%lld D%lld): %lld values "
		  "differ from the exact ones", (long long)B, (long long)T, (long long)H, (long long)K,
		  (long long)D, (long long)bad);
	att_free(&r);
	free(q), free(k), free(v), free(g), free(sum);
}

/* ---- one model step at 1 and 2 threads ---- */

/* bf16: 0 fp32, 1 bf16 mode on the fp32 kernels (every site fp32). */
static void model_step(int threads, int bf16, double *loss, float **grads, int64_t *n)
{
	omp_set_num_threads(threads);
	/* head_dim 16 (vector attention), T = 70 (two query tiles, one partial) */
	st_llama_shape s = {.V = 101, .E = 64, .L = 2, .H = 4, .K = 2, .D = 16, .M = 96,
			    .eps = 1e-5f, .theta = 10000.0};
	enum { B = 2, T = 70 };
	st_llama m = ST_LLAMA_INIT;
	CHECK(st_llama_init(&m, &s) == 0);
	st_llama_init_weights(&m, 5);
	m.bf16 = bf16;
	memset(m.kplan.f32, 1, sizeof(m.kplan.f32));
	CHECK(st_llama_alloc_acts(&m, B, T, ST_REMAT_NONE) == 0);
	CHECK(st_llama_kctx_bytes(&m) >= (int64_t)st_kctx_bytes(0));
	if (st_gemm_f32_backend() == ST_GEMM_TILES) /* the weight gradients' packing */
		CHECK(st_llama_kctx_bytes(&m) > (int64_t)st_kctx_bytes(0));
	int32_t tok[B * (T + 1)];
	for (int i = 0; i < B * (T + 1); i++)
		tok[i] = (int32_t)st_rng_below(8, 0, (uint64_t)i, (uint64_t)s.V);
	st_llama_zero_grads(&m);
	*loss = 0;
	CHECK(st_llama_forward_backward(&m, tok, 1.0f / (B * T), loss) == 0);
	*n = m.nparams;
	*grads = copyf(m.grads, m.nparams);
	st_llama_release(&m);
}

/* The same bits at 1 and 2 threads; on the default fp32 back end, and on
 * the tiles (fp32, and bf16 mode on the fp32 kernels), whose scratch the
 * model's context must hold for every product (else ST_EINVAL). */
static void test_model_threads(void)
{
	enum st_gemm_backend be = st_gemm_f32_backend();
	for (int c = 0; c < 3; c++) {
		if (c > 0)
			st_gemm_set_f32_backend(ST_GEMM_TILES);
		double l1, l2;
		float *g1, *g2;
		int64_t n1, n2;
		model_step(1, c == 2, &l1, &g1, &n1);
		model_step(2, c == 2, &l2, &g2, &n2);
		CHECK(n1 == n2);
		CHECK_MSG(l1 == l2, "model loss %.17g (1 thread) vs %.17g (2 threads), case %d", l1, l2, c);
		CHECK_MSG(same(g1, g2, n1 * 4), "model gradients differ between 1 and 2 threads, case %d", c);
		free(g1), free(g2);
	}
	st_gemm_set_f32_backend(be);
	omp_set_num_threads(omp_get_num_procs());
}

/* st_exp8 (the AVX2 builds' e^x of the softmax rows): within 2 ulp of e^x
 * over the normal range, subnormal results close to it, 0 far below, +Inf
 * above about 88.7, -Inf -> 0, NaN kept. */
static void test_exp8(void)
{
#if ST_HAVE_AVX2
	double worst = 0;
	for (int i = 0; i <= 200000; i++) {
		float x[8], y[8];
		for (int l = 0; l < 8; l++)
			x[l] = -87.0f + 175.0f * (float)(i * 8 + l) / (200001.0f * 8);
		_mm256_storeu_ps(y, st_exp8(_mm256_loadu_ps(x)));
		for (int l = 0; l < 8; l++) {
			double e = exp((double)x[l]), ulp = nextafterf((float)e, INFINITY) - (float)e;
			if (e < 3.0e38)
				worst = fmax(worst, fabs(y[l] - e) / ulp);
		}
	}
	CHECK_MSG(worst <= 2.0, "st_exp8: %.2f ulp from e^x", worst);
	float x[8] = {-100.0f, -95.0f, -110.0f, -INFINITY, 89.0f, INFINITY, NAN, 0.0f}, y[8];
	_mm256_storeu_ps(y, st_exp8(_mm256_loadu_ps(x)));
	CHECK(y[0] > 0 && fabs(y[0] - exp(-100.0)) <= 2e-45 && fabs(y[1] - exp(-95.0)) / exp(-95.0) < 1e-3);
	CHECK(y[2] == 0.0f && y[3] == 0.0f && isinf(y[4]) && isinf(y[5]) && isnan(y[6]) && y[7] == 1.0f);
	printf("st_exp8: worst %.2f ulp over [-87, 88]\n", worst);
#else
	check_skip_hw("st_exp8: a build without AVX2 and FMA");
#endif
}

/* The tiles' weight-gradient form with a long K (chunks of tokens, summed
 * in order) and a short one (tiles with packed blocks): the same bits at 1,
 * 2 and 3 threads, and at 3 threads in a context sized for 1; alpha and
 * beta applied once (checked against the float64 product in test_gemm). */
static void tiles_threads_case(int64_t M, int64_t N, int64_t K)
{
	int64_t lda = M + 5, ldb = N + 2, ldc = N + 3;
	float *A = randn(K * lda, 40, 1.0), *B = randn(K * ldb, 41, 1.0);
	float *C0 = randn(M * ldc, 42, 1.0), *C[4];
	enum st_gemm_backend be = st_gemm_f32_backend();
	st_gemm_set_f32_backend(ST_GEMM_TILES);
	st_gemm_shape sh = {ST_GEMM_F32, 'T', 'N', M, N, K};
	st_kctx kc, kc1;
	CHECK(st_kctx_init(&kc, st_gemm_workspace_bytes(&sh, 3), 3) == 0);
	CHECK(st_kctx_init(&kc1, st_gemm_workspace_bytes(&sh, 1), 1) == 0);
	CHECK(st_gemm_workspace_bytes(&sh, 1) > 0);
	for (int t = 0; t < 4; t++) {
		omp_set_num_threads(t < 3 ? t + 1 : 3);
		C[t] = copyf(C0, M * ldc);
		CHECK(st_gemm('T', 'N', M, N, K, 0.5f, A, lda, B, ldb, 0.25f, C[t], ldc,
			      t < 3 ? &kc : &kc1) == 0);
	}
	st_gemm_set_f32_backend(be);
	omp_set_num_threads(omp_get_num_procs());
	for (int t = 1; t < 4; t++)
		CHECK_MSG(same(C[0], C[t], M * ldc * (int64_t)sizeof(float)),
			  "TN %lldx%lldx%lld differs at %d threads%s", (long long)M, (long long)N,
			  (long long)K, t < 3 ? t + 1 : 3, t < 3 ? "" : " (a context for 1)");
	st_kctx_release(&kc);
	st_kctx_release(&kc1);
	free(A), free(B), free(C0), free(C[0]), free(C[1]), free(C[2]), free(C[3]);
}

static void test_gemm_ksplit_threads(void)
{
	tiles_threads_case(70, 52, 1301);  /* chunks of tokens */
	tiles_threads_case(300, 270, 200); /* packed tiles */
}

/* The kernel context itself: sizes on each back end, refusals, and the
 * primitive table's capacity and order. */
static void test_kctx(void)
{
	enum st_gemm_backend be = st_gemm_f32_backend();
	st_gemm_shape nt = {ST_GEMM_F32, 'N', 'T', 300, 270, 200}, tn = {ST_GEMM_F32, 'T', 'N', 300, 270, 200},
		      ks = {ST_GEMM_F32, 'T', 'N', 70, 52, 1301};
	/* only the tiles take scratch for fp32, and only for A^T B: per
	 * thread K x (tile rows + columns) floats (tiles of 256 x 256 here),
	 * or 3 copies of C for the chunks of tokens */
	st_gemm_set_f32_backend(ST_GEMM_SGEMM);
	CHECK(st_gemm_workspace_bytes(&tn, 4) == 0);
	st_gemm_set_f32_backend(ST_GEMM_MATMUL);
	CHECK(st_gemm_workspace_bytes(&tn, 4) == 0);
	st_gemm_set_f32_backend(ST_GEMM_TILES);
	CHECK(st_gemm_workspace_bytes(&nt, 4) == 0);
	CHECK_MSG(st_gemm_workspace_bytes(&tn, 2) == 2 * st_ws_round(200 * (256 + 256) * 4),
		  "tiles' packing: %zu bytes", st_gemm_workspace_bytes(&tn, 2));
	CHECK(st_gemm_workspace_bytes(&tn, 4) == 2 * st_gemm_workspace_bytes(&tn, 2));
	CHECK(st_gemm_workspace_bytes(&ks, 1) == st_ws_round(3 * 70 * 52 * 4));
	CHECK(st_gemm_workspace_bytes(&ks, 8) == st_gemm_workspace_bytes(&ks, 1)); /* not per thread */
	st_gemm_shape two[2] = {tn, ks};
	CHECK(st_gemm_workspace_bytes_list(two, 2, 1) == st_gemm_workspace_bytes(&tn, 1));
	if (!st_amx_available()) {
		st_gemm_shape h = {ST_GEMM_BF16, 'T', 'N', 300, 270, 200};
		CHECK(st_gemm_workspace_bytes(&h, 4) == 0);
	}
	CHECK(st_kctx_bytes(0) >= ST_KCTX_PRIMS * sizeof(st_kprim) && st_kctx_bytes(0) % 64 == 0);

	/* refused: no context, one not initialized, one too small (by 64
	 * bytes, and at 2 threads one sized for 1 is still too small for this
	 * one thread less 64); nothing written */
	omp_set_num_threads(1);
	float *A = randn(200 * 300, 90, 1.0), *B = randn(200 * 270, 91, 1.0), *C = malloc(300 * 270 * 4);
	for (int i = 0; i < 300 * 270; i++)
		C[i] = 7.0f;
	st_kctx none = ST_KCTX_INIT, small;
	CHECK(st_kctx_init(&small, st_gemm_workspace_bytes(&tn, 1) - 64, 1) == 0);
	int rc = st_gemm('T', 'N', 300, 270, 200, 1.0f, A, 300, B, 270, 0.0f, C, 270, &small);
	CHECK_MSG(rc == ST_EINVAL && strstr(st_errmsg(), "st_gemm (tiles)") && strstr(st_errmsg(), "needs"),
		  "a product in a small context: rc %d, %s", rc, st_errmsg());
	CHECK(st_gemm('T', 'N', 300, 270, 200, 1.0f, A, 300, B, 270, 0.0f, C, 270, NULL) == ST_EINVAL);
	CHECK(strstr(st_errmsg(), "st_gemm: no kernel context") != NULL);
	CHECK(st_gemm('T', 'N', 300, 270, 200, 1.0f, A, 300, B, 270, 0.0f, C, 270, &none) == ST_EINVAL);
	CHECK(st_gemm_res('T', 'N', 300, 270, 200, A, 300, B, 270, C, C, 270, NULL) == ST_EINVAL);
	uint16_t h[4] = {0};
	float c4[4] = {7.0f, 7.0f, 7.0f, 7.0f};
	CHECK(st_gemm_bf16('N', 'N', 2, 2, 2, 1.0f, h, 2, h, 2, 0.0f, c4, 2, NULL) == ST_EINVAL);
	CHECK(st_gemm_bf16_out('N', 'N', 2, 2, 2, 1.0f, h, 2, h, 2, 0.0f, h, 2, &none) == ST_EINVAL);
	CHECK(st_gemm_bf16_res('N', 'N', 2, 2, 2, h, 2, h, 2, c4, c4, 2, NULL) == ST_EINVAL);
	CHECK(st_gemm_impl(ST_GEMM_F32, 'N', 'N', 2, 2, 2, 2, 2, 2, 0.0f, NULL)[0] == 0);
	int untouched = c4[0] == 7.0f;
	for (int i = 0; i < 300 * 270; i++)
		untouched &= C[i] == 7.0f;
	CHECK(untouched);
	st_kctx_release(&small);
	st_kctx_release(&none);
	/* init_at: the caller's memory, aligned and large enough */
	char *mem = aligned_alloc(64, st_kctx_bytes(1024) + 64);
	st_kctx at;
	CHECK(st_kctx_init_at(&at, mem + 8, st_kctx_bytes(1024), 1) == ST_EINVAL);
	CHECK(st_kctx_init_at(&at, mem, 64, 1) == ST_EINVAL);
	CHECK(st_kctx_init_at(&at, mem, st_kctx_bytes(1024), 0) == ST_EINVAL);
	CHECK(st_kctx_init_at(&at, mem, st_kctx_bytes(1024), 2) == 0);
	CHECK(at.ws.bytes == 1024 && at.ws.threads == 2 && !at.owned);
	st_kctx_release(&at);
	free(mem);

	/* the table: ST_KCTX_PRIMS + 5 shapes on the matmul primitive; the
	 * first 5 replaced (the oldest), each product's bits the same when
	 * its primitive is made again */
	st_gemm_set_f32_backend(ST_GEMM_MATMUL);
	st_kctx kc;
	CHECK(st_kctx_init(&kc, 0, 1) == 0);
	enum { NS = ST_KCTX_PRIMS + 5 };
	float *first[5];
	for (int i = 0; i < NS; i++) {
		int64_t m = 1 + i % 7, n = 1 + i / 7;
		CHECK(st_gemm('N', 'N', m, n, 9, 1.0f, A, 9, B, n, 0.0f, C, n, &kc) == 0);
		if (i < 5)
			first[i] = copyf(C, m * n);
	}
	CHECK_MSG(kc.nprims == ST_KCTX_PRIMS && kc.oldest == 5, "table: %d entries, oldest %d", kc.nprims,
		  kc.oldest);
	int found = 0;
	for (int j = 0; j < kc.nprims; j++)
		found += kc.prims[j].key.M == 1 && kc.prims[j].key.N == 1; /* shape 0 */
	CHECK(found == 0);
	for (int i = 0; i < 5; i++) {
		int64_t m = 1 + i % 7, n = 1 + i / 7;
		CHECK(st_gemm('N', 'N', m, n, 9, 1.0f, A, 9, B, n, 0.0f, C, n, &kc) == 0);
		CHECK_MSG(same(C, first[i], m * n * 4), "shape %d: other bits from a new primitive", i);
		free(first[i]);
	}
	CHECK(kc.nprims == ST_KCTX_PRIMS && kc.oldest == 10);
	st_kctx_release(&kc);
	st_gemm_set_f32_backend(be);
	omp_set_num_threads(omp_get_num_procs());
	free(A), free(B), free(C);
}

int main(void)
{
	test_exp8();
	test_bf16_conversion();
	test_gemm();
	test_amx();
	test_gemm_res();
	test_amx_dp_tile();
	test_gemm_ksplit_threads();
	test_kctx();
	test_bf16_outputs();
	test_attention_shape(1, 1, 1, 1, 16);
	test_attention_shape(2, 70, 4, 2, 16);
	test_attention_shape(1, 130, 2, 1, 64);
	test_attention_shape(1, 300, 2, 1, 64); /* five blocks, the last partial */
	test_attention_shape(2, 260, 4, 2, 16); /* the same, AVX2 tiles in builds without AVX-512 */
	test_attention_shape(1, 64, 2, 2, 48);
	test_attention_shape(1, 100, 4, 1, 128);
	test_attention_shape(2, 33, 4, 4, 8); /* plain loops with AVX-512, AVX2 ones without */
	test_attention_shape(1, 65, 3, 3, 20);
	test_attention_bf16_shape(2, 70, 4, 2, 16);
	test_attention_bf16_shape(1, 130, 3, 1, 64);
	test_attention_bf16_shape(2, 129, 6, 2, 64); /* odd T, B > 1, GQA 3 */
	test_attention_bf16_shape(1, 64, 2, 2, 48);
	test_attention_bf16_shape(1, 100, 4, 4, 128);
	test_attention_bf16_shape(2, 33, 4, 4, 8); /* plain loops from here */
	test_attention_bf16_shape(1, 65, 3, 3, 20);
	test_attention_bf16_shape(2, 37, 3, 1, 5); /* odd D */
	test_attention_bf16_threads(2, 150, 6, 2, 32);
	test_attention_bf16_threads(1, 70, 3, 1, 20);
	test_attention_bf16_exact(2, 6, 2, 64);
	test_attention_bf16_exact(2, 4, 4, 6);
	test_thread_counts();
	test_workspace_refused();
	test_model_threads();
	return check_result();
}
