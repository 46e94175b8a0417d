#include "model/llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/rng.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/gemm.h"

/* Intermediates of one layer's forward pass (pointers into owned buffers). */
typedef struct layer_acts {
	float *rstd1, *h1, *q, *k, *v, *ctx, *lse, *xmid, *rstd2, *h2, *gate, *up, *act;
} layer_acts;

typedef struct st_llama_acts {
	int64_t B, T, N;
	enum st_remat policy;
	int32_t *inputs, *targets; /* (N) */
	float **xs;                /* L+1 residual-stream buffers (N,E) */
	layer_acts *layer;         /* L: what each layer keeps (per policy) */
	layer_acts scratch;        /* recomputed intermediates */
	float *rstdf, *hf;         /* final norm */
	float *cos_t, *sin_t;      /* RoPE tables (T, D/2) */
	/* gradient buffers */
	float *dx, *dh, *dm1, *dm2, *dctx, *dq, *dk, *dv;
	float *xent;               /* lm-head chunk (chunk_rows, V) */
	float *tp_tmp;             /* (N,E) partial products under tensor parallelism */
	uint16_t *bf16_a, *bf16_b; /* bf16 copies of a product's operands (bf16 mode) */
	int64_t bf16_elems;        /* capacity of each */
	float *xr_f;               /* split cross-entropy: 4 x chunk_rows floats */
	double *xr_d;              /* ... and chunk_rows doubles */
	int64_t chunk_rows;
	int64_t bytes;
	int nblocks;
	void *blocks[64];          /* every allocation, for release */
} st_llama_acts;

void st_llama_shape_from_config(st_llama_shape *s, const st_config *c)
{
	memset(s, 0, sizeof(*s));
	s->V = c->vocab_size;
	s->E = c->emb_dim;
	s->L = c->num_decoder_layers;
	s->H = c->num_query_heads;
	s->K = c->num_kv_heads;
	s->D = c->head_dim;
	s->M = c->mlp_dim;
	s->eps = (float)c->norm_eps;
	s->theta = c->rope_theta;
	s->rope.enabled = c->rope_llama31;
	s->rope.factor = c->rope_scale_factor;
	s->rope.low_freq_factor = c->rope_low_freq_factor;
	s->rope.high_freq_factor = c->rope_high_freq_factor;
	s->rope.original_max_len = (double)c->rope_original_max_len;
}

static int64_t layer_params(const st_llama_shape *s)
{
	return 2 * s->E + s->E * s->H * s->D * 2 + s->E * s->K * s->D * 2 + 3 * s->E * s->M;
}

int64_t st_llama_count_params(const st_llama_shape *s)
{
	return 2 * s->V * s->E + s->E + s->L * layer_params(s);
}

/* rows x cols global (cols 0: 1-D); tp_dim as in st_tensor. */
static void add_tensor(st_llama *m, const char *name, enum st_tensor_kind kind, int64_t rows,
			 int64_t cols, int tp_dim, int64_t *off)
{
	st_tensor *t = &m->tensors[m->ntensors++];
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->offset = *off;
	t->kind = kind;
	t->ndim = cols ? 2 : 1;
	t->global_shape[0] = t->shape[0] = rows;
	t->global_shape[1] = t->shape[1] = cols;
	t->tp_dim = tp_dim;
	if (tp_dim >= 0) {
		t->shape[tp_dim] /= m->tp;
		t->tp_offset[tp_dim] = t->shape[tp_dim] * m->tp_rank;
	}
	t->numel = cols ? t->shape[0] * t->shape[1] : t->shape[0];
	*off += t->numel;
}

/* The view field of tensor i (table order: embedding; per layer ln1, q, k,
 * v, o, ln2, gate, up, down; final norm; output layer). */
static float **view_field(st_llama_view *v, int i, int64_t L)
{
	if (i == 0)
		return &v->embed;
	if (i == 1 + 9 * L)
		return &v->norm;
	if (i == 2 + 9 * L)
		return &v->lm_head;
	st_layer_view *lv = &v->layers[(i - 1) / 9];
	float **f[9] = {&lv->ln1, &lv->wq, &lv->wk, &lv->wv, &lv->wo, &lv->ln2, &lv->wg, &lv->wu, &lv->wd};
	return f[(i - 1) % 9];
}

void st_llama_unit(const st_llama *m, int u, int *t0, int *nt)
{
	int64_t L = m->s.L;
	*t0 = u == 0 ? 0 : u <= L ? 1 + 9 * (u - 1) : 1 + 9 * (int)L;
	*nt = u == 0 ? 1 : u <= L ? 9 : 2;
}

void st_llama_bind_unit(st_llama *m, int u, float *p, float *g)
{
	int t0, nt;
	st_llama_unit(m, u, &t0, &nt);
	int64_t base = m->tensors[t0].offset;
	for (int i = t0; i < t0 + nt; i++) {
		if (p)
			*view_field(&m->p, i, m->s.L) = p + (m->tensors[i].offset - base);
		if (g)
			*view_field(&m->g, i, m->s.L) = g + (m->tensors[i].offset - base);
	}
}

int64_t st_llama_unit_numel(const st_llama *m, int u)
{
	int t0, nt;
	st_llama_unit(m, u, &t0, &nt);
	int64_t n = 0;
	for (int i = t0; i < t0 + nt; i++)
		n += m->tensors[i].numel;
	return n;
}

int st_llama_init(st_llama *m, const st_llama_shape *s) { return st_llama_init_tp(m, s, 1, 0, NULL, 1); }

int st_llama_init_tp(st_llama *m, const st_llama_shape *s, int tp, int tp_rank, st_comm *tp_comm,
		     int resident)
{
	memset(m, 0, sizeof(*m));
	if (tp < 1 || s->H % tp || s->K % tp || s->M % tp || s->V % tp)
		return st_fail(ST_EINVAL,
			       "tensor parallelism %d must divide the query heads (%lld), kv heads (%lld), "
			       "mlp_dim (%lld) and vocab_size (%lld)",
			       tp, (long long)s->H, (long long)s->K, (long long)s->M, (long long)s->V);
	m->s = *s;
	m->ls = *s;
	m->ls.H /= tp;
	m->ls.K /= tp;
	m->ls.M /= tp;
	m->ls.V /= tp;
	m->tp = tp;
	m->tp_rank = tp_rank;
	m->tp_comm = tp > 1 ? tp_comm : NULL;
	/* this process's piece: replicated embedding, norms; the rest split by tp */
	m->nparams = s->V * s->E + s->E + m->ls.V * s->E + s->L * layer_params(&m->ls);
	int64_t L = s->L, E = s->E, HD = s->H * s->D, KD = s->K * s->D, M = s->M;
	m->tensors = calloc((size_t)(3 + 9 * L), sizeof(st_tensor));
	m->p.layers = calloc((size_t)L, sizeof(st_layer_view));
	m->g.layers = calloc((size_t)L, sizeof(st_layer_view));
	if (resident) {
		m->params = calloc((size_t)m->nparams, sizeof(float));
		m->grads = calloc((size_t)m->nparams, sizeof(float));
	}
	if (!m->tensors || !m->p.layers || !m->g.layers || (resident && (!m->params || !m->grads))) {
		st_llama_release(m);
		return st_fail(ST_ENOMEM, "out of memory for %lld parameters", (long long)m->nparams);
	}
	int64_t off = 0;
	char n[80];
	add_tensor(m, "model.embed_tokens.weight", ST_T_EMBED, s->V, E, -1, &off);
	for (int64_t l = 0; l < L; l++) {
#define T(suffix, kind, r, c, dim)                                                 \
	snprintf(n, sizeof(n), "model.layers.%lld.%s", (long long)l, suffix);            \
	add_tensor(m, n, kind, r, c, dim, &off)
		T("input_layernorm.weight", ST_T_NORM, E, 0, -1);
		T("self_attn.q_proj.weight", ST_T_LINEAR, HD, E, 0);
		T("self_attn.k_proj.weight", ST_T_LINEAR, KD, E, 0);
		T("self_attn.v_proj.weight", ST_T_LINEAR, KD, E, 0);
		T("self_attn.o_proj.weight", ST_T_LINEAR, E, HD, 1);
		T("post_attention_layernorm.weight", ST_T_NORM, E, 0, -1);
		T("mlp.gate_proj.weight", ST_T_LINEAR, M, E, 0);
		T("mlp.up_proj.weight", ST_T_LINEAR, M, E, 0);
		T("mlp.down_proj.weight", ST_T_LINEAR, E, M, 1);
#undef T
	}
	add_tensor(m, "model.norm.weight", ST_T_NORM, E, 0, -1, &off);
	add_tensor(m, "lm_head.weight", ST_T_LINEAR, s->V, E, 0, &off);
	if (off != m->nparams)
		ST_BUG("parameter table covers %lld of %lld", (long long)off, (long long)m->nparams);
	if (resident)
		for (int i = 0; i < m->ntensors; i++) {
			*view_field(&m->p, i, L) = m->params + m->tensors[i].offset;
			*view_field(&m->g, i, L) = m->grads + m->tensors[i].offset;
		}
	return 0;
}

void st_llama_init_rows(const st_llama *m, uint64_t seed, int i, int64_t row0, int64_t rows, float *dst)
{
	const st_tensor *t = &m->tensors[i];
	int64_t gcols = t->ndim == 2 ? t->global_shape[1] : 1, cols = t->ndim == 2 ? t->shape[1] : 1;
	double std = t->kind == ST_T_EMBED ? 1.0 : t->kind == ST_T_LINEAR ? 1.0 / sqrt((double)gcols) : 0;
#pragma omp parallel for schedule(static)
	for (int64_t j = 0; j < rows * cols; j++) {
		/* the element's index in the global tensor */
		int64_t g = (row0 + j / cols + t->tp_offset[0]) * gcols + j % cols + t->tp_offset[1];
		dst[j] = t->kind == ST_T_NORM ? 1.0f : (float)(std * st_rng_normal(seed, (uint64_t)i, (uint64_t)g));
	}
}

void st_llama_init_weights(st_llama *m, uint64_t seed)
{
	for (int i = 0; i < m->ntensors; i++)
		st_llama_init_rows(m, seed, i, 0, m->tensors[i].shape[0], m->params + m->tensors[i].offset);
}

void st_llama_zero_grads(st_llama *m)
{
	if (m->grads) /* else the gradient slots are zeroed as units are acquired */
		memset(m->grads, 0, (size_t)m->nparams * sizeof(float));
}

const st_tensor *st_llama_find(const st_llama *m, const char *name)
{
	for (int i = 0; i < m->ntensors; i++)
		if (!strcmp(m->tensors[i].name, name))
			return &m->tensors[i];
	return NULL;
}

/* ---- activations ---- */

static float *acts_alloc(st_llama_acts *a, int64_t nfloats)
{
	if (a->nblocks == (int)(sizeof(a->blocks) / sizeof(a->blocks[0])))
		ST_BUG("too many activation blocks");
	float *p = calloc((size_t)(nfloats > 0 ? nfloats : 1), sizeof(float));
	if (p) {
		a->blocks[a->nblocks++] = p;
		a->bytes += nfloats * (int64_t)sizeof(float);
	}
	return p;
}

static void acts_free(st_llama_acts *a)
{
	if (!a)
		return;
	for (int i = 0; i < a->nblocks; i++)
		free(a->blocks[i]);
	free(a->xs);
	free(a->layer);
	free(a);
}

/* Carve one layer_acts set out of a block; `which` selects the fields kept. */
enum { K_NORMS = 1, K_MM = 2, K_ATTN = 4, K_ACT = 8 };

static int64_t layer_floats(const st_llama_shape *s, int64_t B, int64_t T, int which)
{
	int64_t N = B * T, E = s->E, HD = s->H * s->D, KD = s->K * s->D, M = s->M;
	int64_t n = 0;
	if (which & K_NORMS)
		n += 2 * N + 2 * N * E;                /* rstd1, h1, rstd2, h2 */
	if (which & K_MM)
		n += N * HD + 2 * N * KD + N * E + 2 * N * M; /* q, k, v, xmid, gate, up */
	if (which & K_ATTN)
		n += N * HD + B * s->H * T;            /* ctx, lse */
	if (which & K_ACT)
		n += N * M;
	return n;
}

static void layer_carve(layer_acts *la, float *p, const st_llama_shape *s, int64_t B, int64_t T,
			int which)
{
	int64_t N = B * T, E = s->E, HD = s->H * s->D, KD = s->K * s->D, M = s->M;
#define TAKE(f, n) (la->f = p, p += (n))
	if (which & K_NORMS) {
		TAKE(rstd1, N);
		TAKE(h1, N * E);
		TAKE(rstd2, N);
		TAKE(h2, N * E);
	}
	if (which & K_MM) {
		TAKE(q, N * HD);
		TAKE(k, N * KD);
		TAKE(v, N * KD);
		TAKE(xmid, N * E);
		TAKE(gate, N * M);
		TAKE(up, N * M);
	}
	if (which & K_ATTN) {
		TAKE(ctx, N * HD);
		TAKE(lse, B * s->H * T);
	}
	if (which & K_ACT)
		TAKE(act, N * M);
#undef TAKE
}

/* Fill the fields a layer does not keep from the shared scratch set. */
static void layer_merge(layer_acts *dst, const layer_acts *scratch)
{
	float **d = (float **)dst;
	float *const *s = (float *const *)scratch;
	for (size_t i = 0; i < sizeof(layer_acts) / sizeof(float *); i++)
		if (!d[i])
			d[i] = s[i];
}

/* Rows of logits per cross-entropy chunk: 16 MiB of fp32 logits. */
static int64_t xent_chunk_rows(int64_t V, int64_t N)
{
	int64_t r = (16 << 20) / (int64_t)sizeof(float) / V;
	return r < 1 ? 1 : r > N ? N : r;
}

static int keep_mask(enum st_remat policy)
{
	int all = K_NORMS | K_MM | K_ATTN | K_ACT;
	return policy == ST_REMAT_NONE ? all : policy == ST_REMAT_MINIMAL ? K_MM : 0;
}

int64_t st_llama_act_bytes_for(const st_llama_shape *s, int64_t B, int64_t T, enum st_remat policy)
{
	int all = K_NORMS | K_MM | K_ATTN | K_ACT, keep = keep_mask(policy);
	int64_t N = B * T, E = s->E, HD = s->H * s->D, KD = s->K * s->D, M = s->M;
	int64_t mx = HD > E ? HD : E;
	int64_t f = layer_floats(s, B, T, all & ~keep) + s->L * layer_floats(s, B, T, keep);
	f += (s->L + 1) * N * E;                           /* residual stream per layer */
	f += N + N * E + 2 * T * (s->D / 2);               /* final norm, RoPE tables */
	f += N * E + N * mx + 2 * N * M + 2 * N * HD + 2 * N * KD; /* gradient buffers */
	f += xent_chunk_rows(s->V, N) * s->V + 2 * N;      /* logits chunk, token ids */
	return f * (int64_t)sizeof(float);
}

int st_llama_alloc_acts(st_llama *m, int64_t B, int64_t T, enum st_remat policy)
{
	const st_llama_shape *s = &m->ls;
	acts_free(m->acts);
	st_llama_acts *a = m->acts = calloc(1, sizeof(*a));
	if (!a)
		return st_fail(ST_ENOMEM, "out of memory for activations");
	int64_t L = s->L, N = B * T, E = s->E, HD = s->H * s->D, KD = s->K * s->D, M = s->M;
	a->B = B;
	a->T = T;
	a->N = N;
	a->policy = policy;
	a->xs = calloc((size_t)(L + 1), sizeof(float *));
	a->layer = calloc((size_t)L, sizeof(layer_acts));
	if (!a->xs || !a->layer)
		goto oom;
	int keep = keep_mask(policy);
	int shared = (K_NORMS | K_MM | K_ATTN | K_ACT) & ~keep;
	float *blk;
	if (shared) {
		if (!(blk = acts_alloc(a, layer_floats(s, B, T, shared))))
			goto oom;
		layer_carve(&a->scratch, blk, s, B, T, shared);
	}
	for (int64_t l = 0; l < L; l++) {
		if (keep) {
			if (!(blk = acts_alloc(a, layer_floats(s, B, T, keep))))
				goto oom;
			layer_carve(&a->layer[l], blk, s, B, T, keep);
		}
		layer_merge(&a->layer[l], &a->scratch);
	}
	for (int64_t l = 0; l <= L; l++)
		if (!(a->xs[l] = acts_alloc(a, N * E)))
			goto oom;
	a->chunk_rows = xent_chunk_rows(s->V, N);
	int64_t mx = HD > E ? HD : E;
	if (!(a->rstdf = acts_alloc(a, N)) || !(a->hf = acts_alloc(a, N * E)) ||
	    !(a->cos_t = acts_alloc(a, T * (s->D / 2))) || !(a->sin_t = acts_alloc(a, T * (s->D / 2))) ||
	    !(a->dx = acts_alloc(a, N * E)) || !(a->dh = acts_alloc(a, N * mx)) ||
	    !(a->dm1 = acts_alloc(a, N * M)) || !(a->dm2 = acts_alloc(a, N * M)) ||
	    !(a->dctx = acts_alloc(a, N * HD)) || !(a->dq = acts_alloc(a, N * HD)) ||
	    !(a->dk = acts_alloc(a, N * KD)) || !(a->dv = acts_alloc(a, N * KD)) ||
	    !(a->xent = acts_alloc(a, a->chunk_rows * s->V)))
		goto oom;
	if (m->tp_comm && !(a->tp_tmp = acts_alloc(a, N * E)))
		goto oom;
	if ((m->tp_comm || m->bf16) && (!(a->xr_f = acts_alloc(a, 4 * a->chunk_rows)) ||
					!(a->xr_d = (double *)acts_alloc(a, 2 * a->chunk_rows))))
		goto oom;
	if (m->bf16) {
		/* the largest operand: an activation, a weight piece, or a logits chunk */
		int64_t big = N * (E > M ? E : M);
		big = N * HD > big ? N * HD : big;
		big = a->chunk_rows * s->V > big ? a->chunk_rows * s->V : big;
		for (int i = 0; i < m->ntensors; i++)
			big = m->tensors[i].numel > big ? m->tensors[i].numel : big;
		a->bf16_elems = big;
		if (!(a->bf16_a = (uint16_t *)acts_alloc(a, (big + 1) / 2)) ||
		    !(a->bf16_b = (uint16_t *)acts_alloc(a, (big + 1) / 2)))
			goto oom;
	}
	a->inputs = (int32_t *)acts_alloc(a, N);
	a->targets = (int32_t *)acts_alloc(a, N);
	if (!a->inputs || !a->targets)
		goto oom;
	st_rope_tables(a->cos_t, a->sin_t, T, s->D, s->theta, &s->rope);
	return 0;
oom:
	acts_free(a);
	m->acts = NULL;
	return st_fail(ST_ENOMEM, "out of memory for activations (batch %lld x %lld)", (long long)B,
		       (long long)T);
}

int64_t st_llama_act_bytes(const st_llama *m) { return m->acts ? m->acts->bytes : 0; }

/* ---- forward and backward ---- */

#define TRY(x)                                                                           \
	do {                                                                             \
		int rc_ = (x);                                                           \
		if (rc_ < 0)                                                             \
			return rc_;                                                      \
	} while (0)

/* Sum over the tensor-parallel group, in place (nothing to do without one). */
static int tp_sum(st_llama *m, float *buf, int64_t n)
{
	return m->tp_comm ? st_comm_allreduce(m->tp_comm, buf, n, ST_C_F32, ST_SUM) : 0;
}

/*
 * Every matrix product of the model. In bf16 mode (dtype=bfloat16) both
 * operands are rounded to bf16 on the way in and the product accumulates in
 * fp32 (MaxText's bf16 compute with fp32 weights); else plain fp32.
 */
static int mm(st_llama *m, char ta, char tb, int64_t M, int64_t N, int64_t K, const float *A,
	      int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
	st_llama_acts *a = m->acts;
	if (!m->bf16)
		return st_gemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
	int64_t na = (ta == 'N' ? M : K) * lda, nb = (tb == 'N' ? K : N) * ldb;
	if (na > a->bf16_elems || nb > a->bf16_elems)
		ST_BUG("bf16 scratch too small: %lld, %lld > %lld", (long long)na, (long long)nb,
		       (long long)a->bf16_elems);
	const uint16_t *bb = a->bf16_b;
	if (m->wbf16 && B >= m->params && B < m->params + m->nparams)
		bb = m->wbf16 + (B - m->params); /* a resident weight: its bf16 copy */
	else
		st_f32_to_bf16_array(a->bf16_b, B, nb);
	st_f32_to_bf16_array(a->bf16_a, A, na);
	return st_gemm_bf16(ta, tb, M, N, K, 1.0f, a->bf16_a, lda, bb, ldb, beta, C, ldc);
}

/* out(N,E) = res + a(N,k) W^T, W (E,k): a residual add of a row-parallel
 * product. Under tensor parallelism each process holds k/tp of the inner
 * dimension, so the partial products are summed over the group first. */
static int residual_product(st_llama *m, float *out, const float *res, const float *a,
			    const float *W, int64_t k)
{
	st_llama_acts *ac = m->acts;
	int64_t N = ac->N, E = m->s.E;
	if (!m->tp_comm) {
		memcpy(out, res, (size_t)(N * E) * sizeof(float));
		return mm(m, 'N', 'T', N, E, k, a, k, W, k, 1, out, E);
	}
	TRY(mm(m, 'N', 'T', N, E, k, a, k, W, k, 0, ac->tp_tmp, E));
	TRY(tp_sum(m, ac->tp_tmp, N * E));
	for (int64_t i = 0; i < N * E; i++)
		out[i] = res[i] + ac->tp_tmp[i];
	return 0;
}

/* One layer. do_mm: run the matrix products (else q, k, v, xmid, gate, up are
 * already there, kept by the remat policy). out: write the layer output. */
static int layer_forward(st_llama *m, int64_t l, const layer_acts *A, int do_mm, float *out)
{
	const st_llama_shape *s = &m->ls;
	st_llama_acts *a = m->acts;
	const st_layer_view *w = &m->p.layers[l];
	int64_t N = a->N, E = s->E, HD = s->H * s->D, KD = s->K * s->D, M = s->M;
	const float *x = a->xs[l];

	st_rmsnorm_forward(A->h1, A->rstd1, x, w->ln1, N, E, s->eps);
	if (do_mm) {
		TRY(mm(m, 'N', 'T', N, HD, E, A->h1, E, w->wq, E, 0, A->q, HD));
		TRY(mm(m, 'N', 'T', N, KD, E, A->h1, E, w->wk, E, 0, A->k, KD));
		TRY(mm(m, 'N', 'T', N, KD, E, A->h1, E, w->wv, E, 0, A->v, KD));
		st_rope_forward(A->q, a->cos_t, a->sin_t, a->B, a->T, s->H, s->D);
		st_rope_forward(A->k, a->cos_t, a->sin_t, a->B, a->T, s->K, s->D);
	}
	st_attention_forward(A->ctx, A->lse, A->q, A->k, A->v, a->B, a->T, s->H, s->K, s->D);
	if (do_mm)
		TRY(residual_product(m, A->xmid, x, A->ctx, w->wo, HD));
	st_rmsnorm_forward(A->h2, A->rstd2, A->xmid, w->ln2, N, E, s->eps);
	if (do_mm) {
		TRY(mm(m, 'N', 'T', N, M, E, A->h2, E, w->wg, E, 0, A->gate, M));
		TRY(mm(m, 'N', 'T', N, M, E, A->h2, E, w->wu, E, 0, A->up, M));
	}
	st_swiglu_forward(A->act, A->gate, A->up, N * M);
	if (out)
		TRY(residual_product(m, out, A->xmid, A->act, w->wd, M));
	return 0;
}

/* a->dx holds d/d(layer output) on entry and d/d(layer input) on return. */
static int layer_backward(st_llama *m, int64_t l, const layer_acts *A)
{
	const st_llama_shape *s = &m->ls;
	st_llama_acts *a = m->acts;
	const st_layer_view *w = &m->p.layers[l];
	const st_layer_view *g = &m->g.layers[l];
	int64_t N = a->N, E = s->E, HD = s->H * s->D, KD = s->K * s->D, M = s->M;
	float *dx = a->dx;

	/* MLP: out = xmid + down(swiglu(gate(h2), up(h2))) */
	TRY(mm(m, 'N', 'N', N, M, E, dx, E, w->wd, M, 0, a->dm1, M));
	TRY(mm(m, 'T', 'N', E, M, N, dx, E, A->act, M, 1, g->wd, M));
	st_swiglu_backward(a->dm2, a->dm1, a->dm1, A->gate, A->up, N * M); /* dm2=dgate, dm1=dup */
	TRY(mm(m, 'N', 'N', N, E, M, a->dm2, M, w->wg, E, 0, a->dh, E));
	TRY(mm(m, 'N', 'N', N, E, M, a->dm1, M, w->wu, E, 1, a->dh, E));
	TRY(mm(m, 'T', 'N', M, E, N, a->dm2, M, A->h2, E, 1, g->wg, E));
	TRY(mm(m, 'T', 'N', M, E, N, a->dm1, M, A->h2, E, 1, g->wu, E));
	TRY(tp_sum(m, a->dh, N * E));
	st_rmsnorm_backward(dx, g->ln2, a->dh, A->xmid, w->ln2, A->rstd2, N, E);

	/* attention: xmid = x + o(attn(rope(q(h1)), rope(k(h1)), v(h1))) */
	TRY(mm(m, 'N', 'N', N, HD, E, dx, E, w->wo, HD, 0, a->dctx, HD));
	TRY(mm(m, 'T', 'N', E, HD, N, dx, E, A->ctx, HD, 1, g->wo, HD));
	st_attention_backward(a->dq, a->dk, a->dv, a->dctx, A->ctx, A->lse, A->q, A->k, A->v, a->B,
			      a->T, s->H, s->K, s->D);
	st_rope_backward(a->dq, a->cos_t, a->sin_t, a->B, a->T, s->H, s->D);
	st_rope_backward(a->dk, a->cos_t, a->sin_t, a->B, a->T, s->K, s->D);
	TRY(mm(m, 'N', 'N', N, E, HD, a->dq, HD, w->wq, E, 0, a->dh, E));
	TRY(mm(m, 'N', 'N', N, E, KD, a->dk, KD, w->wk, E, 1, a->dh, E));
	TRY(mm(m, 'N', 'N', N, E, KD, a->dv, KD, w->wv, E, 1, a->dh, E));
	TRY(mm(m, 'T', 'N', HD, E, N, a->dq, HD, A->h1, E, 1, g->wq, E));
	TRY(mm(m, 'T', 'N', KD, E, N, a->dk, KD, A->h1, E, 1, g->wk, E));
	TRY(mm(m, 'T', 'N', KD, E, N, a->dv, KD, A->h1, E, 1, g->wv, E));
	TRY(tp_sum(m, a->dh, N * E));
	st_rmsnorm_backward(dx, g->ln1, a->dh, a->xs[l], w->ln1, A->rstd1, N, E);
	return 0;
}

/*
 * Output layer and cross-entropy over a vocabulary split (tensor parallelism;
 * or the whole vocabulary in bf16 mode, where the products go through mm):
 * this process holds rows [v0, v0+Vl) of lm_head. Per chunk of rows: local logits, the row max
 * and the sum of exponentials combined over the group, the target's logit
 * from the process that holds it. dx (N,E) = summed partial products;
 * dW += local. Same contract as st_lm_head_xent (dx NULL: loss only).
 */
static int lm_head_xent_split(st_llama *m, double *loss_sum, float *dx, float *dW, float scale)
{
	st_llama_acts *a = m->acts;
	int64_t N = a->N, E = m->s.E, Vl = m->ls.V, v0 = Vl * m->tp_rank, R = a->chunk_rows;
	const float *x = a->hf, *W = m->p.lm_head;
	float *lmax = a->xr_f, *gmax = lmax + R, *tlog = gmax + R, *rscale = tlog + R;
	double *rsum = a->xr_d, total = 0;
	for (int64_t r0 = 0; r0 < N; r0 += R) {
		int64_t nr = N - r0 < R ? N - r0 : R;
		float *l = a->xent;
		TRY(mm(m, 'N', 'T', nr, Vl, E, x + r0 * E, E, W, E, 0, l, Vl));
		st_xent_rows_exp(l, lmax, rsum, tlog, a->targets + r0, v0, nr, Vl);
		memcpy(gmax, lmax, (size_t)nr * sizeof(float));
		if (m->tp_comm)
			TRY(st_comm_allreduce(m->tp_comm, gmax, nr, ST_C_F32, ST_MAX));
		for (int64_t r = 0; r < nr; r++)
			rsum[r] *= exp((double)lmax[r] - (double)gmax[r]);
		if (m->tp_comm) {
			TRY(st_comm_allreduce(m->tp_comm, rsum, nr, ST_C_F64, ST_SUM));
			TRY(st_comm_allreduce(m->tp_comm, tlog, nr, ST_C_F32, ST_SUM)); /* one holder each */
		}
		for (int64_t r = 0; r < nr; r++)
			total += (double)gmax[r] + log(rsum[r]) - (double)tlog[r];
		if (!dx)
			continue;
		for (int64_t r = 0; r < nr; r++)
			rscale[r] = (float)(scale * exp((double)lmax[r] - (double)gmax[r]) / rsum[r]);
		st_xent_rows_grad(l, rscale, a->targets + r0, v0, nr, Vl, scale);
		TRY(mm(m, 'N', 'N', nr, E, Vl, l, Vl, W, E, 0, dx + r0 * E, E));
		TRY(mm(m, 'T', 'N', Vl, E, nr, l, Vl, x + r0 * E, E, 1, dW, E));
	}
	if (dx)
		TRY(tp_sum(m, dx, N * E));
	*loss_sum += total;
	return 0;
}

static int lm_head(st_llama *m, double *loss_sum, float *dx, float scale)
{
	st_llama_acts *a = m->acts;
	if (m->tp_comm || m->bf16)
		return lm_head_xent_split(m, loss_sum, dx, dx ? m->g.lm_head : NULL, scale);
	if (!dx)
		return st_lm_head_loss(loss_sum, a->hf, m->p.lm_head, a->targets, a->N, m->s.E, m->s.V,
				       a->xent, a->chunk_rows);
	return st_lm_head_xent(loss_sum, dx, m->g.lm_head, a->hf, m->p.lm_head, a->targets, a->N,
			       m->s.E, m->s.V, scale, a->xent, a->chunk_rows);
}

static void split_tokens(st_llama_acts *a, const int32_t *tokens)
{
	for (int64_t b = 0; b < a->B; b++)
		for (int64_t t = 0; t < a->T; t++) {
			a->inputs[b * a->T + t] = tokens[b * (a->T + 1) + t];
			a->targets[b * a->T + t] = tokens[b * (a->T + 1) + t + 1];
		}
}

/* Weights (and, for backward, zeroed gradient space) of unit u, from the
 * hooks when the model is not resident. */
static int acquire(st_llama *m, int u, int for_backward)
{
	return m->hooks ? m->hooks->acquire(m->hooks->ctx, m, u, for_backward) : 0;
}

static int grads_ready(st_llama *m, int u)
{
	return m->hooks ? m->hooks->grads_ready(m->hooks->ctx, m, u) : 0;
}

static int forward(st_llama *m, const int32_t *tokens)
{
	st_llama_acts *a = m->acts;
	int L = (int)m->s.L;
	if (!a)
		ST_BUG("forward before st_llama_alloc_acts");
	split_tokens(a, tokens);
	TRY(acquire(m, 0, 0));
	st_embedding_forward(a->xs[0], m->p.embed, a->inputs, a->N, m->s.E);
	for (int l = 0; l < L; l++) {
		TRY(acquire(m, l + 1, 0));
		TRY(layer_forward(m, l, &a->layer[l], 1, a->xs[l + 1]));
	}
	TRY(acquire(m, L + 1, 0));
	st_rmsnorm_forward(a->hf, a->rstdf, a->xs[L], m->p.norm, a->N, m->s.E, m->s.eps);
	return 0;
}

int st_llama_forward_loss(st_llama *m, const int32_t *tokens, double *loss_sum)
{
	TRY(forward(m, tokens));
	return lm_head(m, loss_sum, NULL, 0.0f);
}

int st_llama_forward_backward(st_llama *m, const int32_t *tokens, float loss_scale,
			      double *loss_sum)
{
	TRY(forward(m, tokens));
	st_llama_acts *a = m->acts;
	int64_t N = a->N, E = m->s.E;

	int L = (int)m->s.L;

	/* loss and its gradient at the final norm's output, chunked over rows */
	TRY(acquire(m, L + 1, 1));
	TRY(lm_head(m, loss_sum, a->dh, loss_scale));
	memset(a->dx, 0, (size_t)(N * E) * sizeof(float));
	st_rmsnorm_backward(a->dx, m->g.norm, a->dh, a->xs[L], m->p.norm, a->rstdf, N, E);
	TRY(grads_ready(m, L + 1));

	for (int l = L - 1; l >= 0; l--) {
		const layer_acts *A = &a->layer[l];
		TRY(acquire(m, l + 1, 1));
		if (a->policy == ST_REMAT_FULL)
			TRY(layer_forward(m, l, A, 1, NULL));
		else if (a->policy == ST_REMAT_MINIMAL)
			TRY(layer_forward(m, l, A, 0, NULL));
		TRY(layer_backward(m, l, A));
		TRY(grads_ready(m, l + 1));
	}
	TRY(acquire(m, 0, 1));
	st_embedding_backward(m->g.embed, a->dx, a->inputs, N, E);
	return grads_ready(m, 0);
}

int st_llama_weights_changed(st_llama *m)
{
	if (!m->bf16 || !m->params)
		return 0;
	if (!m->wbf16 && !(m->wbf16 = malloc((size_t)m->nparams * sizeof(uint16_t))))
		return st_fail(ST_ENOMEM, "out of memory for the bf16 weight copy");
	st_f32_to_bf16_array(m->wbf16, m->params, m->nparams);
	return 0;
}

void st_llama_release(st_llama *m)
{
	free(m->wbf16);
	acts_free(m->acts);
	free(m->params);
	free(m->grads);
	free(m->tensors);
	free(m->p.layers);
	free(m->g.layers);
	memset(m, 0, sizeof(*m));
}
