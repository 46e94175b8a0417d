#include "model/kplan.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/rng.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/workspace.h"

/*
 * Each product site as llama.c calls it in bf16 mode: transposes, the
 * dimensions M, N, K of C(M,N) = op(A) op(B) ('N' tokens, 'E' emb, 'Q'
 * heads x head_dim, 'K' kv heads x head_dim, 'M' mlp, 'V' vocabulary rows,
 * 'R' rows of an output-layer chunk), beta, and the operands' kinds:
 *   'w' a weight (fp32 master; bf16 copy resident or converted per call)
 *   'h' an activation kept only in bf16 (the fp32 kernel converts it)
 *   'f' an fp32 buffer (the bf16 kernel reads a bf16 copy made for it; the
 *       SwiGLU gradients are made in fp32 when an fp32 kernel reads them)
 */
static const struct site {
	const char *name;
	char ta, tb, m, n, k;
	float beta;
	char a, b;
} sites[ST_KS_COUNT] = {
	[ST_KS_Q] = {"q", 'N', 'T', 'N', 'Q', 'E', 0, 'h', 'w'},
	[ST_KS_KV] = {"kv", 'N', 'T', 'N', 'K', 'E', 0, 'h', 'w'},
	[ST_KS_O] = {"o", 'N', 'T', 'N', 'E', 'Q', 0, 'f', 'w'},
	[ST_KS_GATE_UP] = {"gate_up", 'N', 'T', 'N', 'M', 'E', 0, 'h', 'w'},
	[ST_KS_DOWN] = {"down", 'N', 'T', 'N', 'E', 'M', 0, 'h', 'w'},
	[ST_KS_LOGITS] = {"logits", 'N', 'T', 'R', 'V', 'E', 0, 'h', 'w'},
	[ST_KS_D_DOWN] = {"d_down", 'N', 'N', 'N', 'M', 'E', 0, 'f', 'w'},
	[ST_KS_D_GATE_UP] = {"d_gate_up", 'N', 'N', 'N', 'E', 'M', 0, 'f', 'w'},
	[ST_KS_D_O] = {"d_o", 'N', 'N', 'N', 'Q', 'E', 0, 'f', 'w'},
	[ST_KS_D_Q] = {"d_q", 'N', 'N', 'N', 'E', 'Q', 0, 'f', 'w'},
	[ST_KS_D_KV] = {"d_kv", 'N', 'N', 'N', 'E', 'K', 1, 'f', 'w'},
	[ST_KS_D_LOGITS] = {"d_logits", 'N', 'N', 'R', 'E', 'V', 0, 'f', 'w'},
	[ST_KS_W_DOWN] = {"w_down", 'T', 'N', 'E', 'M', 'N', 1, 'f', 'h'},
	[ST_KS_W_GATE_UP] = {"w_gate_up", 'T', 'N', 'M', 'E', 'N', 1, 'f', 'h'},
	[ST_KS_W_O] = {"w_o", 'T', 'N', 'E', 'Q', 'N', 1, 'f', 'f'},
	[ST_KS_W_Q] = {"w_q", 'T', 'N', 'Q', 'E', 'N', 1, 'f', 'h'},
	[ST_KS_W_KV] = {"w_kv", 'T', 'N', 'K', 'E', 'N', 1, 'f', 'h'},
	[ST_KS_W_LOGITS] = {"w_logits", 'T', 'N', 'V', 'E', 'R', 1, 'f', 'h'},
	[ST_KS_ATTN] = {"attn", 0, 0, 0, 0, 0, 0, 0, 0},
	[ST_KS_D_ATTN] = {"d_attn", 0, 0, 0, 0, 0, 0, 0, 0},
};

const char *st_ksite_name(int site)
{
	return site >= 0 && site < ST_KS_COUNT ? sites[site].name : "?";
}

int st_kplan_is_auto(const char *s) { return s && !strcasecmp(s, "auto"); }

/* "bf16"/"bfloat16" -> 0, "fp32"/"float32" -> 1, else -1 (n bytes of s). */
static int kind_of(const char *s, size_t n)
{
	if ((n == 4 && !strncasecmp(s, "bf16", 4)) || (n == 8 && !strncasecmp(s, "bfloat16", 8)))
		return 0;
	if ((n == 4 && !strncasecmp(s, "fp32", 4)) || (n == 7 && !strncasecmp(s, "float32", 7)))
		return 1;
	return -1;
}

int st_kplan_parse(st_kplan *p, const char *s)
{
	memset(p, 0, sizeof(*p));
	if (!s || !*s)
		return st_fail(ST_EINVAL, "bf16_kernels: empty (auto, bf16, fp32 or SITE:bf16|fp32,... for "
				"every site)");
	int all = kind_of(s, strlen(s));
	if (all >= 0) {
		memset(p->f32, all, sizeof(p->f32));
		return 0;
	}
	int seen[ST_KS_COUNT] = {0};
	for (const char *c = s; *c;) {
		const char *end = strchr(c, ',');
		size_t len = end ? (size_t)(end - c) : strlen(c);
		const char *colon = memchr(c, ':', len);
		if (!colon)
			return st_fail(ST_EINVAL, "bf16_kernels: '%.*s' is not SITE:bf16 or SITE:fp32", (int)len, c);
		size_t nl = (size_t)(colon - c);
		int site = -1;
		for (int i = 0; i < ST_KS_COUNT; i++)
			if (strlen(sites[i].name) == nl && !strncmp(sites[i].name, c, nl))
				site = i;
		if (site < 0)
			return st_fail(ST_EINVAL, "bf16_kernels: unknown site '%.*s' (sites: q, kv, o, gate_up, down, "
					"logits, their d_ and w_ forms, attn, d_attn)", (int)nl, c);
		int k = kind_of(colon + 1, len - nl - 1);
		if (k < 0)
			return st_fail(ST_EINVAL, "bf16_kernels: site %s: '%.*s' is neither bf16 nor fp32",
				       sites[site].name, (int)(len - nl - 1), colon + 1);
		if (seen[site]++)
			return st_fail(ST_EINVAL, "bf16_kernels: site %s given twice", sites[site].name);
		p->f32[site] = (unsigned char)k;
		c = end ? end + 1 : c + len;
		if (end && !*c)
			return st_fail(ST_EINVAL, "bf16_kernels: a trailing comma");
	}
	for (int i = 0; i < ST_KS_COUNT; i++)
		if (!seen[i])
			return st_fail(ST_EINVAL, "bf16_kernels: site %s is missing (a list names every site)",
				       sites[i].name);
	return 0;
}

int st_kplan_check(const char *s)
{
	st_kplan p;
	return st_kplan_is_auto(s) ? 0 : st_kplan_parse(&p, s);
}

void st_kplan_format(const st_kplan *p, char *out, size_t n)
{
	size_t off = 0;
	if (n)
		out[0] = 0;
	for (int i = 0; i < ST_KS_COUNT && off < n; i++) {
		int w = snprintf(out + off, n - off, "%s%s:%s", i ? "," : "", sites[i].name,
				 p->f32[i] ? "fp32" : "bf16");
		off += w > 0 ? (size_t)w : 0;
	}
}

int st_kplan_count_f32(const st_kplan *p)
{
	int n = 0;
	for (int i = 0; i < ST_KS_COUNT; i++)
		n += p->f32[i] != 0;
	return n;
}

/* ---- timing ---- */

/* Dimensions of the timing runs are capped: the rate at 2048 is the rate of
 * the larger products, and the buffers stay small (the output layer's full
 * vocabulary would need gigabytes on a large model). */
#define DIM_CAP 2048

static int64_t dim_of(const st_kshape *s, char d, int64_t cap)
{
	int64_t v = d == 'N' ? s->B * s->T : d == 'E' ? s->E : d == 'Q' ? s->H * s->D
		  : d == 'K' ? s->K * s->D : d == 'M' ? s->M : d == 'V' ? s->V : d == 'R' ? s->R : 0;
	return v > cap ? cap : v < 1 ? 1 : v;
}

static int64_t dim(const st_kshape *s, char d) { return dim_of(s, d, DIM_CAP); }

void st_kplan_scratch(const st_kplan *p, const st_kshape *s, unsigned given, int64_t *a_elems,
		      int64_t *b_elems)
{
	*a_elems = *b_elems = 0;
	for (int i = 0; i < ST_KS_ATTN; i++) {
		if (!p->f32[i] || given >> i & 1)
			continue;
		int64_t M = dim_of(s, sites[i].m, INT64_MAX), N = dim_of(s, sites[i].n, INT64_MAX);
		int64_t K = dim_of(s, sites[i].k, INT64_MAX);
		if (sites[i].a == 'h' && M * K > *a_elems)
			*a_elems = M * K;
		if (sites[i].b == 'h' && K * N > *b_elems)
			*b_elems = K * N;
	}
}

static void site_product(const st_kshape *s, int i, int64_t rows, int64_t cap,
			 enum st_gemm_dtype dtype, st_gemm_shape *out)
{
	st_kshape t = *s;
	t.R = rows;
	*out = (st_gemm_shape){dtype, sites[i].ta, sites[i].tb, dim_of(&t, sites[i].m, cap),
			       dim_of(&t, sites[i].n, cap), dim_of(&t, sites[i].k, cap)};
}

void st_ksite_product(const st_kshape *s, int site, int64_t rows, enum st_gemm_dtype dtype,
		      st_gemm_shape *out)
{
	if (site < 0 || site >= ST_KS_ATTN)
		ST_BUG("st_ksite_product: site %d is not a product", site);
	site_product(s, site, rows, INT64_MAX, dtype, out);
}

int st_kplan_bf16_weights(const st_kplan *p)
{
	for (int i = 0; i < ST_KS_ATTN; i++)
		if (!p->f32[i] && sites[i].b == 'w')
			return 1;
	return 0;
}

typedef struct tbufs {
	float *af, *bf, *c;
	uint16_t *ah, *bh;
	st_kctx kc; /* the products' context, sized for the timed shapes */
} tbufs;

/* One run of site i on one kernel: its conversions and its product. */
static int run_product(const st_kshape *s, int i, int f32, tbufs *b)
{
	const struct site *t = &sites[i];
	int64_t M = dim(s, t->m), N = dim(s, t->n), K = dim(s, t->k);
	int64_t lda = t->ta == 'N' ? K : M, ldb = t->tb == 'T' ? K : N;
	if (f32) {
		if (t->a == 'h')
			st_bf16_to_f32_array(b->af, b->ah, M * K);
		if (t->b == 'h')
			st_bf16_to_f32_array(b->bf, b->bh, K * N);
		return st_gemm(t->ta, t->tb, M, N, K, 1.0f, b->af, lda, b->bf, ldb, t->beta, b->c, N,
			       &b->kc);
	}
	if (t->a == 'f')
		st_f32_to_bf16_array(b->ah, b->af, M * K);
	if (t->b == 'f' || (t->b == 'w' && !s->resident))
		st_f32_to_bf16_array(b->bh, b->bf, K * N);
	return st_gemm_bf16(t->ta, t->tb, M, N, K, 1.0f, b->ah, lda, b->bh, ldb, t->beta, b->c, N,
			    &b->kc);
}

typedef struct abufs {
	float *q, *k, *v, *ctx, *lse, *dctx, *dq, *dk, *dv;
	uint16_t *qh, *kh, *vh; /* q, k, v rounded: the bf16 attention's inputs */
	st_ws ws;
	int64_t B;
} abufs;

static int run_attention(const st_kshape *s, int backward, int f32, abufs *a)
{
	if (!backward)
		return f32 ? st_attention_forward(a->ctx, a->lse, a->q, a->k, a->v, a->B, s->T, s->H,
						  s->K, s->D, &a->ws)
			   : st_attention_forward_bf16(a->ctx, a->lse, a->qh, a->kh, a->vh, a->B, s->T,
						       s->H, s->K, s->D, &a->ws);
	return f32 ? st_attention_backward(a->dq, a->dk, a->dv, a->dctx, a->ctx, a->lse, a->q, a->k,
					   a->v, a->B, s->T, s->H, s->K, s->D, &a->ws)
		   : st_attention_backward_bf16(a->dq, a->dk, a->dv, a->dctx, a->ctx, a->lse, a->qh,
						a->kh, a->vh, a->B, s->T, s->H, s->K, s->D, &a->ws);
}

static void fill(float *x, uint16_t *h, int64_t n, uint64_t stream, float scale)
{
	for (int64_t i = 0; i < n; i++)
		x[i] = scale * (float)(2.0 * st_rng_uniform(12345, stream, (uint64_t)i) - 1.0);
	if (h)
		st_f32_to_bf16_array(h, x, n);
}

static int run_site(const st_kshape *s, int i, int f32, tbufs *b, abufs *a)
{
	if (i == ST_KS_ATTN || i == ST_KS_D_ATTN)
		return run_attention(s, i == ST_KS_D_ATTN, f32, a);
	return run_product(s, i, f32, b);
}

int st_kplan_time(const st_kshape *s, int reps, st_kplan *out, double ratio[ST_KS_COUNT])
{
	memset(out, 0, sizeof(*out));
	int64_t na = 1, nb = 1, nc = 1;
	for (int i = 0; i < ST_KS_ATTN; i++) {
		int64_t M = dim(s, sites[i].m), N = dim(s, sites[i].n), K = dim(s, sites[i].k);
		na = M * K > na ? M * K : na;
		nb = K * N > nb ? K * N : nb;
		nc = M * N > nc ? M * N : nc;
	}
	tbufs b = {malloc((size_t)na * 4), malloc((size_t)nb * 4), calloc((size_t)nc, 4),
		   malloc((size_t)na * 2), malloc((size_t)nb * 2), ST_KCTX_INIT};
	st_gemm_shape shapes[2 * ST_KS_ATTN];
	for (int i = 0; i < ST_KS_ATTN; i++) {
		site_product(s, i, s->R, DIM_CAP, ST_GEMM_F32, &shapes[2 * i]);
		site_product(s, i, s->R, DIM_CAP, ST_GEMM_BF16, &shapes[2 * i + 1]);
	}
	/* attention on one sequence of the run's length */
	abufs a = {.B = 1};
	int64_t T = s->T, nq = T * s->H * s->D, nk = T * s->K * s->D;
	float **qkv[] = {&a.q, &a.ctx, &a.dctx, &a.dq, &a.k, &a.v, &a.dk, &a.dv, &a.lse};
	int64_t sz[] = {nq, nq, nq, nq, nk, nk, nk, nk, s->H * T};
	int oom = !b.af || !b.bf || !b.c || !b.ah || !b.bh;
	for (int j = 0; j < 9; j++)
		oom |= !(*qkv[j] = malloc((size_t)sz[j] * sizeof(float)));
	uint16_t **qkvh[] = {&a.qh, &a.kh, &a.vh};
	for (int j = 0; j < 3; j++)
		oom |= !(*qkvh[j] = malloc((size_t)(j ? nk : nq) * sizeof(uint16_t)));
	int threads = omp_get_max_threads();
	size_t w32 = st_attention_workspace_bytes(1, T, s->H, s->K, s->D, threads);
	size_t w16 = st_attention_bf16_workspace_bytes(1, T, s->H, s->K, s->D, threads);
	int rc = oom ? st_fail(ST_ENOMEM, "out of memory timing the bf16 and fp32 kernels")
		     : st_ws_init(&a.ws, w32 > w16 ? w32 : w16, threads);
	if (rc == 0)
		rc = st_kctx_init(&b.kc, st_gemm_workspace_bytes_list(shapes, 2 * ST_KS_ATTN, threads),
				  threads);
	if (rc == 0) {
		fill(b.af, b.ah, na, 1, 0.5f);
		fill(b.bf, b.bh, nb, 2, 0.5f);
		for (int j = 0; j < 9; j++)
			fill(*qkv[j], NULL, sz[j], 3 + (uint64_t)j, j == 8 ? 0.0f : 0.5f);
		st_f32_to_bf16_array(a.qh, a.q, nq);
		st_f32_to_bf16_array(a.kh, a.k, nk);
		st_f32_to_bf16_array(a.vh, a.v, nk);
		rc = run_attention(s, 0, 1, &a); /* a consistent ctx and lse for backward */
	}
	for (int i = 0; i < ST_KS_COUNT && rc == 0; i++) {
		double best[2] = {1e300, 1e300};
		for (int r = 0; r <= reps && rc == 0; r++) /* run 0 warms up (primitive creation) */
			for (int k = 0; k < 2 && rc == 0; k++) {
				int f32 = (r + k) & 1; /* alternate which kernel goes first */
				double t0 = st_mono_s();
				rc = run_site(s, i, f32, &b, &a);
				double dt = st_mono_s() - t0;
				if (r > 0 && dt < best[f32])
					best[f32] = dt;
			}
		out->f32[i] = best[1] < best[0];
		if (ratio)
			ratio[i] = best[1] / (best[0] > 0 ? best[0] : 1e-12);
	}
	free(b.af), free(b.bf), free(b.c), free(b.ah), free(b.bh);
	for (int j = 0; j < 9; j++)
		free(*qkv[j]);
	for (int j = 0; j < 3; j++)
		free(*qkvh[j]);
	st_ws_release(&a.ws);
	st_kctx_release(&b.kc);
	return rc;
}
