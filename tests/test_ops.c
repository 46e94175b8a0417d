/*
 * Finite-difference checks of every op's backward, one op at a time.
 * For an op y = f(x) and a fixed random r, L = sum(y * r); backward with
 * dy = r must give dL/dx, which is compared with central differences.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "check.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/ops.h"

static void fill(float *x, int64_t n, uint64_t stream, double std)
{
	for (int64_t i = 0; i < n; i++)
		x[i] = (float)(std * st_rng_normal(1234, stream, (uint64_t)i));
}

static double dotd(const float *a, const float *b, int64_t n)
{
	double s = 0;
	for (int64_t i = 0; i < n; i++)
		s += (double)a[i] * b[i];
	return s;
}

/* One kernel workspace for every call below, as large as the largest
 * (made in main, as the model makes its own once). */
static st_ws ws = ST_WS_INIT;
static st_kctx kctx = ST_KCTX_INIT; /* the output layer's products (kctx.h) */

typedef double (*loss_fn)(void *ctx);

/* Compare analytic gradient g of parameter x (n values) with central
 * differences of loss(ctx) at up to 40 elements; relative to the tensor's
 * largest gradient. */
static void check_grad(const char *what, float *x, const float *g, int64_t n, loss_fn loss,
		       void *ctx)
{
	double gmax = 0;
	for (int64_t i = 0; i < n; i++)
		gmax = fmax(gmax, fabs(g[i]));
	CHECK_MSG(gmax > 0, "%s: gradient is all zero", what);
	int64_t stride = n > 40 ? n / 40 : 1;
	double worst = 0;
	for (int64_t i = 0; i < n; i += stride) {
		float save = x[i];
		float h = 1e-2f * fmaxf(1.0f, fabsf(save));
		x[i] = save + h;
		double lp = loss(ctx);
		x[i] = save - h;
		double lm = loss(ctx);
		x[i] = save;
		double num = (lp - lm) / (2.0 * ((double)(save + h) - (double)save));
		worst = fmax(worst, fabs(num - g[i]) / gmax);
	}
	CHECK_MSG(worst < 2e-3, "%s: finite-difference error %.3g of max |grad| %.3g", what, worst, gmax);
	printf("%-28s max rel err %.2e\n", what, worst);
}

/* ---- rmsnorm ---- */
enum { N = 6, C = 16 };
typedef struct { float x[N * C], w[C], r[N * C]; } norm_ctx;
static double norm_loss(void *p)
{
	norm_ctx *c = p;
	float y[N * C], rs[N];
	st_rmsnorm_forward(y, rs, c->x, c->w, N, C, 1e-5f);
	return dotd(y, c->r, N * C);
}
static void test_rmsnorm(void)
{
	norm_ctx c;
	fill(c.x, N * C, 1, 1.0);
	fill(c.w, C, 2, 1.0);
	fill(c.r, N * C, 3, 1.0);
	float y[N * C], rs[N], dx[N * C] = {0}, dw[C] = {0};
	st_rmsnorm_forward(y, rs, c.x, c.w, N, C, 1e-5f);
	CHECK(st_rmsnorm_backward(dx, dw, c.r, c.x, c.w, rs, N, C, &ws) == 0);
	check_grad("rmsnorm dx", c.x, dx, N * C, norm_loss, &c);
	check_grad("rmsnorm dw", c.w, dw, C, norm_loss, &c);
}

/* ---- rope ---- */
enum { RB = 2, RT = 5, RH = 3, RD = 8 };
typedef struct { float x[RB * RT * RH * RD], r[RB * RT * RH * RD], cs[RT * RD / 2], sn[RT * RD / 2]; } rope_ctx;
static double rope_loss(void *p)
{
	rope_ctx *c = p;
	float y[RB * RT * RH * RD];
	memcpy(y, c->x, sizeof(y));
	st_rope_forward(y, c->cs, c->sn, RB, RT, RH, RD);
	return dotd(y, c->r, RB * RT * RH * RD);
}
static void test_rope(int llama31)
{
	rope_ctx c;
	int64_t n = RB * RT * RH * RD;
	st_rope_scaling sc = {llama31, 8, 1, 4, 4};
	st_rope_tables(c.cs, c.sn, RT, RD, 10000.0, &sc);
	fill(c.x, n, 4, 1.0);
	fill(c.r, n, 5, 1.0);
	float dx[RB * RT * RH * RD];
	memcpy(dx, c.r, sizeof(dx));
	st_rope_backward(dx, c.cs, c.sn, RB, RT, RH, RD);
	check_grad(llama31 ? "rope (llama3.1) dx" : "rope dx", c.x, dx, n, rope_loss, &c);
	/* rotation keeps norms: |rope(x)| = |x| per head vector */
	float y[RB * RT * RH * RD];
	memcpy(y, c.x, sizeof(y));
	st_rope_forward(y, c.cs, c.sn, RB, RT, RH, RD);
	CHECK_NEAR(dotd(y, y, n), dotd(c.x, c.x, n), 1e-5);
	/* position 0 is the identity */
	CHECK(memcmp(y, c.x, RH * RD * sizeof(float)) == 0);
}

/* ---- attention ---- */
enum { AB = 2, AT = 7, AH = 4, AK = 2, AD = 8 };
#define QN (AB * AT * AH * AD)
#define KN (AB * AT * AK * AD)
typedef struct { float q[QN], k[KN], v[KN], r[QN]; } attn_ctx;
static double attn_loss(void *p)
{
	attn_ctx *c = p;
	float y[QN], lse[AB * AH * AT];
	CHECK(st_attention_forward(y, lse, c->q, c->k, c->v, AB, AT, AH, AK, AD, &ws) == 0);
	return dotd(y, c->r, QN);
}
static void test_attention(void)
{
	attn_ctx c;
	fill(c.q, QN, 6, 1.0);
	fill(c.k, KN, 7, 1.0);
	fill(c.v, KN, 8, 1.0);
	fill(c.r, QN, 9, 1.0);
	float y[QN], lse[AB * AH * AT], dq[QN], dk[KN], dv[KN];
	CHECK(st_attention_forward(y, lse, c.q, c.k, c.v, AB, AT, AH, AK, AD, &ws) == 0);
	CHECK(st_attention_backward(dq, dk, dv, c.r, y, lse, c.q, c.k, c.v, AB, AT, AH, AK, AD, &ws) == 0);
	check_grad("attention dq", c.q, dq, QN, attn_loss, &c);
	check_grad("attention dk", c.k, dk, KN, attn_loss, &c);
	check_grad("attention dv", c.v, dv, KN, attn_loss, &c);
	/* causality: the first query sees only the first key, so its output is v_0 */
	for (int d = 0; d < AD; d++)
		CHECK_NEAR(y[d], c.v[d], 1e-6);
}

/* Tiled path: head_dim 16 (AVX-512 micro-kernels), T = 70 (a full and a
 * partial 64-row tile, so off-diagonal and diagonal tiles both count). */
enum { TB = 1, TT = 70, TH = 2, TK = 1, TD = 16 };
#define TQN (TB * TT * TH * TD)
#define TKN (TB * TT * TK * TD)
typedef struct { float q[TQN], k[TKN], v[TKN], r[TQN]; } tattn_ctx;
static double tattn_loss(void *p)
{
	tattn_ctx *c = p;
	static float y[TQN], lse[TB * TH * TT];
	CHECK(st_attention_forward(y, lse, c->q, c->k, c->v, TB, TT, TH, TK, TD, &ws) == 0);
	return dotd(y, c->r, TQN);
}
static void test_attention_tiled(void)
{
	static tattn_ctx c;
	fill(c.q, TQN, 30, 1.0);
	fill(c.k, TKN, 31, 1.0);
	fill(c.v, TKN, 32, 1.0);
	fill(c.r, TQN, 33, 1.0);
	static float y[TQN], lse[TB * TH * TT], dq[TQN], dk[TKN], dv[TKN];
	CHECK(st_attention_forward(y, lse, c.q, c.k, c.v, TB, TT, TH, TK, TD, &ws) == 0);
	CHECK(st_attention_backward(dq, dk, dv, c.r, y, lse, c.q, c.k, c.v, TB, TT, TH, TK, TD, &ws) == 0);
	check_grad("attention (tiled) dq", c.q, dq, TQN, tattn_loss, &c);
	check_grad("attention (tiled) dk", c.k, dk, TKN, tattn_loss, &c);
	check_grad("attention (tiled) dv", c.v, dv, TKN, tattn_loss, &c);
}

/* ---- swiglu ---- */
enum { SN = 50 };
typedef struct { float g[SN], u[SN], r[SN]; } swiglu_ctx;
static double swiglu_loss(void *p)
{
	swiglu_ctx *c = p;
	float y[SN];
	st_swiglu_forward(y, c->g, c->u, SN);
	return dotd(y, c->r, SN);
}
static void test_swiglu(void)
{
	swiglu_ctx c;
	fill(c.g, SN, 10, 2.0);
	fill(c.u, SN, 11, 1.0);
	fill(c.r, SN, 12, 1.0);
	float dg[SN], du[SN];
	st_swiglu_backward(dg, du, c.r, c.g, c.u, SN);
	check_grad("swiglu dgate", c.g, dg, SN, swiglu_loss, &c);
	check_grad("swiglu dup", c.u, du, SN, swiglu_loss, &c);
}

/* ---- embedding ---- */
enum { EV = 9, EC = 5, EN = 12 };
typedef struct { float emb[EV * EC], r[EN * EC]; int32_t tok[EN]; } emb_ctx;
static double emb_loss(void *p)
{
	emb_ctx *c = p;
	float y[EN * EC];
	st_embedding_forward(y, c->emb, c->tok, EN, EC);
	return dotd(y, c->r, EN * EC);
}
static void test_embedding(void)
{
	emb_ctx c;
	fill(c.emb, EV * EC, 13, 1.0);
	fill(c.r, EN * EC, 14, 1.0);
	for (int i = 0; i < EN; i++)
		c.tok[i] = (int32_t)st_rng_below(5, 0, (uint64_t)i, EV);
	c.tok[3] = c.tok[7]; /* a repeated token accumulates */
	float d[EV * EC] = {0};
	st_embedding_backward(d, c.r, c.tok, EN, EC);
	check_grad("embedding demb", c.emb, d, EV * EC, emb_loss, &c);
}

/* ---- output layer + cross-entropy ---- */
enum { XN = 10, XE = 8, XV = 13 };
typedef struct { float x[XN * XE], W[XV * XE]; int32_t tg[XN]; int64_t chunk; } xent_ctx;
static double xent_loss(void *p)
{
	xent_ctx *c = p;
	double s = 0;
	CHECK(st_lm_head_loss(&s, c->x, c->W, c->tg, XN, XE, XV, c->chunk, &ws, &kctx) == 0);
	return s / XN;
}
static void test_xent(int64_t chunk)
{
	xent_ctx c = {.chunk = chunk};
	fill(c.x, XN * XE, 15, 1.0);
	fill(c.W, XV * XE, 16, 0.5);
	for (int i = 0; i < XN; i++)
		c.tg[i] = (int32_t)st_rng_below(6, 0, (uint64_t)i, XV);
	float dx[XN * XE], dW[XV * XE] = {0};
	double s = 0;
	CHECK(st_lm_head_xent(&s, dx, dW, c.x, c.W, c.tg, XN, XE, XV, 1.0f / XN, chunk, &ws, &kctx) == 0);
	CHECK_NEAR(s / XN, xent_loss(&c), 1e-6);
	check_grad("lm head + xent dx", c.x, dx, XN * XE, xent_loss, &c);
	check_grad("lm head + xent dW", c.W, dW, XV * XE, xent_loss, &c);
}

/* ---- cross-entropy rows split over a vocabulary (as tensor parallelism) ---- */
static void test_xent_rows_split(void)
{
	enum { R = 5, V = 23, V0 = 9 };
	float l[R * V], a[R * V], b[R * V - R * V0];
	int32_t tg[R] = {0, 8, 9, 22, 15};
	fill(l, R * V, 40, 3.0);
	/* whole vocabulary */
	float mx[R], tl[R], sc[R];
	double sm[R];
	memcpy(a, l, sizeof(l));
	st_xent_rows_exp(a, mx, sm, tl, tg, 0, R, V);
	for (int r = 0; r < R; r++)
		sc[r] = (float)(0.5 / sm[r]);
	st_xent_rows_grad(a, sc, tg, 0, R, V, 0.5f);
	/* two pieces: columns [0, V0) and [V0, V), combined as the header says */
	float p0[R * V0], m0[R], m1[R], t0[R], t1[R], s0[R], s1[R];
	double u0[R], u1[R];
	for (int r = 0; r < R; r++) {
		memcpy(p0 + r * V0, l + r * V, V0 * sizeof(float));
		memcpy(b + r * (V - V0), l + r * V + V0, (V - V0) * sizeof(float));
	}
	st_xent_rows_exp(p0, m0, u0, t0, tg, 0, R, V0);
	st_xent_rows_exp(b, m1, u1, t1, tg, V0, R, V - V0);
	for (int r = 0; r < R; r++) {
		float M = fmaxf(m0[r], m1[r]);
		double S = u0[r] * exp((double)m0[r] - M) + u1[r] * exp((double)m1[r] - M);
		double lw = mx[r] + log(sm[r]) - tl[r], lp = M + log(S) - (t0[r] + t1[r]);
		CHECK_NEAR(lp, lw, 1e-6);
		s0[r] = (float)(0.5 * exp((double)m0[r] - M) / S);
		s1[r] = (float)(0.5 * exp((double)m1[r] - M) / S);
	}
	st_xent_rows_grad(p0, s0, tg, 0, R, V0, 0.5f);
	st_xent_rows_grad(b, s1, tg, V0, R, V - V0, 0.5f);
	double worst = 0, sum = 0;
	for (int r = 0; r < R; r++) {
		for (int c = 0; c < V; c++) {
			float g = c < V0 ? p0[r * V0 + c] : b[r * (V - V0) + c - V0];
			worst = fmax(worst, fabs(g - a[r * V + c]));
			sum += a[r * V + c];
		}
	}
	CHECK_MSG(worst < 1e-6, "split cross-entropy gradient differs by %.2e", worst);
	CHECK_NEAR(sum + 1.0, 1.0, 1e-6); /* softmax - onehot sums to 0 per row */
	printf("%-28s max abs diff %.2e\n", "xent rows split in 2", worst);
}

/* ---- cross-entropy rows over bf16 logits (the bf16 mode's output layer) ----
 * st_xent_rows_exp16 and st_xent_rows_grad16 over bf16 logits (rows with a
 * leading dimension past V, V not a multiple of 16 or 8, targets in and out
 * of this process's columns) give bit for bit what the fp32 kernels give
 * over the same values widened to fp32, the gradient rounded once to bf16
 * (st_xent_rows_grad_bf16); the padding past V is left as it was. */
static void test_xent_rows_bf16(void)
{
	enum { R = 6, V = 1013, LD = 1040, V0 = 100 };
	static uint16_t h[R * LD];
	static float f[R * V], sc[R];
	static uint16_t want[R * V];
	int32_t tg[R] = {100, 1112, 99, 600, 101 + 17, 5000}; /* v0 = 100: 0, 1012, out, 500, 17, out */
	float l[LD];
	for (int r = 0; r < R; r++) {
		fill(l, LD, 41 + (uint64_t)r, 4.0);
		for (int c = 0; c < LD; c++)
			h[r * LD + c] = st_f32_to_bf16(l[c]);
		for (int c = 0; c < V; c++)
			f[r * V + c] = st_bf16_to_f32(h[r * LD + c]);
	}
	float m32[R], t32[R], m16[R], t16[R];
	double s32[R], s16[R];
	st_xent_rows_exp(f, m32, s32, t32, tg, V0, R, V);
	st_xent_rows_exp16(h, LD, m16, s16, t16, tg, V0, R, V);
	int same = 1;
	for (int r = 0; r < R; r++) {
		same &= m16[r] == m32[r] && s16[r] == s32[r] && t16[r] == t32[r];
		sc[r] = (float)(0.25 / s32[r]);
	}
	CHECK_MSG(same, "bf16 logits: row max, sum or target logit differ from the fp32 kernel's");
	CHECK_MSG(t16[2] == 0.0f && t16[5] == 0.0f && t16[0] != 0.0f, "target logits outside the columns");
	st_xent_rows_grad_bf16(want, V, f, sc, tg, V0, R, V, 0.25f);
	uint16_t pad[R * (LD - V)];
	for (int r = 0; r < R; r++)
		memcpy(pad + r * (LD - V), h + r * LD + V, (LD - V) * sizeof(uint16_t));
	st_xent_rows_grad16(h, LD, m16, sc, tg, V0, R, V, 0.25f);
	int64_t bad = 0;
	for (int r = 0; r < R; r++)
		for (int c = 0; c < V; c++)
			bad += h[r * LD + c] != want[r * V + c];
	CHECK_MSG(bad == 0, "bf16 cross-entropy gradient: %lld of %d values differ from the fp32 kernel's",
		  (long long)bad, R * V);
	int kept = 1;
	for (int r = 0; r < R; r++)
		kept &= memcmp(pad + r * (LD - V), h + r * LD + V, (LD - V) * sizeof(uint16_t)) == 0;
	CHECK_MSG(kept, "bf16 cross-entropy gradient wrote past the row's V values");
	double sum = 0; /* softmax - onehot: about 0 per row where the target is local */
	for (int c = 0; c < V; c++)
		sum += st_bf16_to_f32(h[c]);
	CHECK_MSG(fabs(sum) < 2e-3, "bf16 cross-entropy gradient: row 0 sums to %.3g, not about 0", sum);
	printf("%-28s bit-identical to the fp32 kernels over bf16 values\n", "xent rows over bf16 logits");
}

int main(void)
{
	size_t need[] = {st_rmsnorm_backward_workspace_bytes(N, C),
			 st_attention_workspace_bytes(AB, AT, AH, AK, AD, omp_get_max_threads()),
			 st_attention_workspace_bytes(TB, TT, TH, TK, TD, omp_get_max_threads()),
			 st_lm_head_workspace_bytes(XV, XN)};
	size_t most = 0;
	for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++)
		most = need[i] > most ? need[i] : most;
	CHECK(st_ws_init(&ws, most, omp_get_max_threads()) == 0);
	st_gemm_shape sh[12];
	int n = st_lm_head_products(XN, XE, XV, XN, sh);
	n += st_lm_head_products(XN, XE, XV, 3, sh + n);
	CHECK(st_kctx_init(&kctx, st_gemm_workspace_bytes_list(sh, n, omp_get_max_threads()),
			   omp_get_max_threads()) == 0);
	test_rmsnorm();
	test_rope(0);
	test_rope(1);
	test_attention();
	test_attention_tiled();
	test_swiglu();
	test_embedding();
	test_xent(XN);
	test_xent(3); /* chunked rows give the same gradients */
	test_xent_rows_split();
	test_xent_rows_bf16();
	st_ws_release(&ws);
	st_kctx_release(&kctx);
	return check_result();
}
