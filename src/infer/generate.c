/*
 * generate.c - incremental decoding over a key/value cache, sampling, and
 * the generation loop (generate.h).
 *
 * The decoder runs the model's layers on the new rows only, with the same
 * kernels as training (st_gemm, RMSNorm, RoPE, SwiGLU) and the same order of
 * operations inside each (residual added by the product's beta = 1, as
 * residual_product in model/llama.c), so a token's logits are what the
 * training forward gives for that position up to the rounding of a
 * different attention summation order. What differs is where keys and
 * values live: each layer's cache holds them per kv head, (K, cap, D), so
 * the attention of a new query reads one contiguous (len, D) block per
 * head; RoPE is applied before they are stored, with the tables' rows for
 * the tokens' absolute positions.
 */
#include "infer/generate.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/rng.h"
#include "kernels/cpu/attention_kv.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ops.h"

#define CHUNK_ROWS 64 /* rows of a prompt per pass through the layers */

struct st_decoder {
	const st_llama *m;
	int64_t cap, len, rows;   /* capacity, positions held, rows per pass */
	float *kc, *vc;           /* L caches of (K, cap, D) each, layer after layer */
	float *cos_t, *sin_t;     /* RoPE (cap, D/2) */
	float *x, *h, *qkv, *ctx, *gu, *act, *rstd; /* rows x ...; qkv: q, k, v; gu: gate, up */
	st_ws ws;                 /* attention's score rows */
	st_kctx kctx;             /* the products' context (kernels/cpu/kctx.h) */
	void *blocks[16];
	int nblocks;
};

static void *take(st_decoder *d, int64_t floats)
{
	if (d->nblocks == (int)(sizeof(d->blocks) / sizeof(d->blocks[0])))
		ST_BUG("too many decoder blocks");
	size_t bytes = ((size_t)(floats > 0 ? floats : 1) * sizeof(float) + 63) & ~(size_t)63;
	void *p = aligned_alloc(64, bytes);
	if (p) {
		memset(p, 0, bytes);
		d->blocks[d->nblocks++] = p;
	}
	return p;
}

void st_decoder_free(st_decoder *d)
{
	if (!d)
		return;
	for (int i = 0; i < d->nblocks; i++)
		free(d->blocks[i]);
	st_ws_release(&d->ws);
	st_kctx_release(&d->kctx);
	free(d);
}

int st_decoder_create(st_decoder **out, const st_llama *m, int64_t cap)
{
	const st_llama_shape *s = &m->s;
	*out = NULL;
	if (!m->params || m->tp != 1)
		return st_fail(ST_EINVAL, "the decoder needs the whole model's weights in this process (resident, "
			       "no tensor parallelism)");
	if (cap < 1)
		return st_fail(ST_EINVAL, "a decoder needs room for at least 1 position, got %lld", (long long)cap);
	st_decoder *d = calloc(1, sizeof(*d));
	if (!d)
		return st_fail(ST_ENOMEM, "out of memory");
	int64_t E = s->E, HD = s->H * s->D, KD = s->K * s->D, M = s->M, R = cap < CHUNK_ROWS ? cap : CHUNK_ROWS;
	d->m = m;
	d->cap = cap;
	d->rows = R;
	int64_t cache = s->L * s->K * cap * s->D;
	int ok = (d->kc = take(d, cache)) && (d->vc = take(d, cache)) && (d->cos_t = take(d, cap * (s->D / 2))) &&
		 (d->sin_t = take(d, cap * (s->D / 2))) && (d->x = take(d, R * E)) && (d->h = take(d, R * E)) &&
		 (d->qkv = take(d, R * (HD + 2 * KD))) && (d->ctx = take(d, R * HD)) && (d->gu = take(d, R * 2 * M)) &&
		 (d->act = take(d, R * M)) && (d->rstd = take(d, R));
	int threads = omp_get_max_threads();
	/* the products' shapes, at a pass's most rows and at one (a new token:
	 * q, k, v and gate, up as one product each) */
	st_gemm_shape sh[2 * 7 + 1];
	int n = 0;
	for (int64_t r = R; r >= 1; r = r > 1 ? 1 : 0) {
		sh[n++] = (st_gemm_shape){ST_GEMM_F32, 'N', 'T', r, HD + 2 * KD, E};
		sh[n++] = (st_gemm_shape){ST_GEMM_F32, 'N', 'T', r, HD, E};
		sh[n++] = (st_gemm_shape){ST_GEMM_F32, 'N', 'T', r, KD, E};
		sh[n++] = (st_gemm_shape){ST_GEMM_F32, 'N', 'T', r, 2 * M, E};
		sh[n++] = (st_gemm_shape){ST_GEMM_F32, 'N', 'T', r, M, E};
		sh[n++] = (st_gemm_shape){ST_GEMM_F32, 'N', 'T', r, E, HD};
		sh[n++] = (st_gemm_shape){ST_GEMM_F32, 'N', 'T', r, E, M};
	}
	sh[n++] = (st_gemm_shape){ST_GEMM_F32, 'N', 'T', 1, s->V, E}; /* the logits */
	if (!ok || st_ws_init(&d->ws, st_attention_kv_workspace_bytes(cap, threads), threads) < 0 ||
	    st_kctx_init(&d->kctx, st_gemm_workspace_bytes_list(sh, n, threads), threads) < 0) {
		st_decoder_free(d);
		return st_fail(ST_ENOMEM, "out of memory for a key/value cache of %lld positions (%.1f MiB)",
			       (long long)cap, 2.0 * (double)cache * 4 / (1 << 20));
	}
	st_rope_tables(d->cos_t, d->sin_t, cap, s->D, s->theta, &s->rope);
	*out = d;
	return 0;
}

int64_t st_decoder_len(const st_decoder *d) { return d->len; }
int64_t st_decoder_capacity(const st_decoder *d) { return d->cap; }
void st_decoder_reset(st_decoder *d) { d->len = 0; }

/*
 * y (r, n) = h (r, E) W^T for the consecutive weights W0 (n0, E), W1 (n1,
 * E), ... that a layer's table order puts end to end in the parameter
 * block (q, k, v; gate, up): one product over all of them when r == 1 (a
 * new token: one matrix-vector pass and one parallel region instead of
 * several; the outputs end to end in y), else one per weight, each output
 * (r, ni) at y + r * (n0 + ... + ni-1).
 */
static int products(st_decoder *d, const float *h, int64_t r, int64_t E, const float *const *W,
		    const int64_t *n, int nw, float *y)
{
	int64_t total = 0, off = 0;
	int adjacent = r == 1, rc;
	for (int i = 0; i < nw; i++) {
		adjacent &= i == 0 || W[i] == W[i - 1] + n[i - 1] * E;
		total += n[i];
	}
	if (adjacent)
		return st_gemm('N', 'T', 1, total, E, 1.0f, h, E, W[0], E, 0.0f, y, total, &d->kctx);
	for (int i = 0; i < nw; off += r * n[i++])
		if ((rc = st_gemm('N', 'T', r, n[i], E, 1.0f, h, E, W[i], E, 0.0f, y + off, n[i], &d->kctx)) < 0)
			return rc;
	return 0;
}

/* Layer l on rows x (r, E) at positions p0..p0+r-1, in place. */
static int layer_rows(st_decoder *d, int64_t l, int64_t p0, int64_t r)
{
	const st_llama_shape *s = &d->m->s;
	const st_layer_view *w = &d->m->p.layers[l];
	int64_t E = s->E, HD = s->H * s->D, KD = s->K * s->D, M = s->M, D = s->D, half = D / 2;
	float *kc = d->kc + l * s->K * d->cap * D, *vc = d->vc + l * s->K * d->cap * D;
	float *q = d->qkv, *k = q + r * HD, *v = k + r * KD, *gate = d->gu, *up = gate + r * M;
	const float *qkv_w[3] = {w->wq, w->wk, w->wv}, *gu_w[2] = {w->wg, w->wu};
	const int64_t qkv_n[3] = {HD, KD, KD}, gu_n[2] = {M, M};
	int rc;

	st_rmsnorm_forward(d->h, d->rstd, d->x, w->ln1, r, E, s->eps);
	if ((rc = products(d, d->h, r, E, qkv_w, qkv_n, 3, d->qkv)) < 0)
		return rc;
	st_rope_forward(q, d->cos_t + p0 * half, d->sin_t + p0 * half, 1, r, s->H, D);
	st_rope_forward(k, d->cos_t + p0 * half, d->sin_t + p0 * half, 1, r, s->K, D);
	for (int64_t i = 0; i < r; i++)
		for (int64_t j = 0; j < s->K; j++) {
			memcpy(kc + (j * d->cap + p0 + i) * D, k + i * KD + j * D, (size_t)D * sizeof(float));
			memcpy(vc + (j * d->cap + p0 + i) * D, v + i * KD + j * D, (size_t)D * sizeof(float));
		}
	if ((rc = st_attention_kv_forward(d->ctx, q, kc, vc, d->cap, p0, r, s->H, s->K, D, &d->ws)) < 0 ||
	    (rc = st_gemm('N', 'T', r, E, HD, 1.0f, d->ctx, HD, w->wo, HD, 1.0f, d->x, E, &d->kctx)) < 0)
		return rc;
	st_rmsnorm_forward(d->h, d->rstd, d->x, w->ln2, r, E, s->eps);
	if ((rc = products(d, d->h, r, E, gu_w, gu_n, 2, d->gu)) < 0)
		return rc;
	st_swiglu_forward(d->act, gate, up, r * M);
	return st_gemm('N', 'T', r, E, M, 1.0f, d->act, M, w->wd, M, 1.0f, d->x, E, &d->kctx);
}

int st_decoder_feed(st_decoder *d, const int32_t *tokens, int64_t n, float *logits)
{
	const st_llama *m = d->m;
	const st_llama_shape *s = &m->s;
	int rc;
	if (n < 0 || d->len + n > d->cap)
		return st_fail(ST_EINVAL, "%lld more tokens do not fit: the decoder holds %lld of %lld positions",
			       (long long)n, (long long)d->len, (long long)d->cap);
	for (int64_t i = 0; i < n; i++)
		if (tokens[i] < 0 || tokens[i] >= s->V)
			return st_fail(ST_EINVAL, "token id %d is outside the model's vocabulary (0..%lld)", (int)tokens[i],
				       (long long)s->V - 1);
	for (int64_t i0 = 0; i0 < n; i0 += d->rows) {
		int64_t r = n - i0 < d->rows ? n - i0 : d->rows;
		st_embedding_forward(d->x, m->p.embed, tokens + i0, r, s->E);
		for (int64_t l = 0; l < s->L; l++)
			if ((rc = layer_rows(d, l, d->len, r)) < 0)
				return rc;
		d->len += r;
	}
	if (!logits || n == 0)
		return 0;
	/* the last row of the last chunk */
	int64_t last = (n - 1) % d->rows;
	st_rmsnorm_forward(d->h, d->rstd, d->x + last * s->E, m->p.norm, 1, s->E, s->eps);
	return st_gemm('N', 'T', 1, s->V, s->E, 1.0f, d->h, s->E, m->p.lm_head, s->E, 0.0f, logits, s->V,
		       &d->kctx);
}

/* ---- sampling ---- */

int st_sampler_init(st_sampler *s, int64_t V, double temperature, double top_p, uint64_t seed)
{
	memset(s, 0, sizeof(*s));
	if (!(temperature >= 0) || !isfinite(temperature))
		return st_fail(ST_EINVAL, "temperature %g: must be a finite number >= 0 (0: greedy)", temperature);
	if (!(top_p > 0 && top_p <= 1))
		return st_fail(ST_EINVAL, "top_p %g: must be in (0, 1]", top_p);
	if (V < 1)
		return st_fail(ST_EINVAL, "a vocabulary of %lld tokens", (long long)V);
	s->temperature = temperature;
	s->top_p = top_p;
	s->seed = seed;
	s->V = V;
	if (temperature > 0 && (!(s->prob = malloc((size_t)V * sizeof(double))) ||
				!(s->idx = malloc((size_t)V * sizeof(int32_t))))) {
		st_sampler_release(s);
		return st_fail(ST_ENOMEM, "out of memory");
	}
	return 0;
}

void st_sampler_release(st_sampler *s)
{
	free(s->prob);
	free(s->idx);
	memset(s, 0, sizeof(*s));
}

static const double *sort_prob; /* qsort has no context argument; set around the call */

/* More likely first; the lower id first among equals. */
static int by_prob(const void *a, const void *b)
{
	int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
	double pi = sort_prob[i], pj = sort_prob[j];
	return pi > pj ? -1 : pi < pj ? 1 : (i > j) - (i < j);
}

int32_t st_sampler_pick(st_sampler *s, const float *logits, uint64_t step)
{
	int64_t V = s->V, best = 0;
	for (int64_t i = 1; i < V; i++) /* NaN never wins */
		if (logits[i] > logits[best] || (isnan(logits[best]) && !isnan(logits[i])))
			best = i;
	if (s->temperature == 0)
		return (int32_t)best;
	double mx = logits[best], total = 0, *p = s->prob;
	for (int64_t i = 0; i < V; i++) {
		p[i] = isnan(logits[i]) ? 0 : exp(((double)logits[i] - mx) / s->temperature);
		total += p[i];
	}
	/* The nucleus is inside {p >= t} as soon as that set holds top_p of
	 * the mass: it is the most likely tokens' prefix. Lower t until it does
	 * (t = 0: every token), then sort only that set. */
	int64_t n = 0;
	double mass = 0;
	for (double t = s->top_p < 1 ? p[best] * 1e-3 : 0;; t = t > 1e-300 ? t / 64 : 0) {
		n = 0;
		mass = 0;
		for (int64_t i = 0; i < V; i++)
			if (p[i] >= t && p[i] > 0) {
				s->idx[n++] = (int32_t)i;
				mass += p[i];
			}
		if (mass >= s->top_p * total || t == 0)
			break;
	}
	if (s->top_p < 1) {
		sort_prob = p;
		qsort(s->idx, (size_t)n, sizeof(int32_t), by_prob);
		sort_prob = NULL;
		double cum = 0;
		int64_t keep = 0;
		while (keep < n && !(cum >= s->top_p * total))
			cum += p[s->idx[keep++]];
		n = keep;
		mass = cum;
	}
	double u = st_rng_uniform(s->seed, ST_SAMPLER_STREAM, step) * mass, cum = 0;
	for (int64_t k = 0; k < n; k++) {
		cum += p[s->idx[k]];
		if (u < cum)
			return s->idx[k];
	}
	return n ? s->idx[n - 1] : (int32_t)best; /* u within rounding of the end */
}

/* ---- the loop ---- */

const char *st_gen_stop_name(enum st_gen_stop stop)
{
	static const char *const names[] = {"eos", "max_tokens", "context", "caller"};
	return (unsigned)stop < sizeof(names) / sizeof(names[0]) ? names[stop] : "?";
}

int st_generate(st_decoder *d, st_sampler *s, const int32_t *prompt, int64_t n, const st_gen_opts *o,
		st_gen_token_fn fn, void *ctx, st_gen_result *r)
{
	int rc = 0;
	memset(r, 0, sizeof(*r));
	if (n < 1 || o->max_tokens < 1)
		return st_fail(ST_EINVAL, "generate needs a prompt of at least 1 token and max_tokens >= 1");
	if (n > d->cap)
		return st_fail(ST_EINVAL, "a prompt of %lld tokens does not fit a decoder of %lld positions",
			       (long long)n, (long long)d->cap);
	float *logits = malloc((size_t)d->m->s.V * sizeof(float));
	if (!logits)
		return st_fail(ST_ENOMEM, "out of memory");
	st_decoder_reset(d);
	r->prompt_tokens = n;
	double t0 = st_mono_s();
	if ((rc = st_decoder_feed(d, prompt, n, logits)) < 0)
		goto out;
	double t1 = st_mono_s();
	r->prefill_s = t1 - t0;
	for (;;) {
		int32_t id = st_sampler_pick(s, logits, (uint64_t)r->new_tokens);
		int is_eos = 0;
		for (int i = 0; i < o->neos; i++)
			is_eos |= id == o->eos[i];
		r->new_tokens++;
		int cb = fn ? fn(ctx, id, is_eos) : 0;
		if (cb < 0) {
			rc = cb;
			break;
		}
		if (is_eos || cb || r->new_tokens >= o->max_tokens || d->len >= d->cap) {
			r->stop = is_eos ? ST_GEN_EOS : cb ? ST_GEN_CALLER : r->new_tokens >= o->max_tokens
				? ST_GEN_MAX_TOKENS : ST_GEN_CONTEXT;
			break;
		}
		if ((rc = st_decoder_feed(d, &id, 1, logits)) < 0)
			break;
	}
	r->decode_s = st_mono_s() - t1;
out:
	free(logits);
	return rc;
}
