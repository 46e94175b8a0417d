#include "model/llama.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/pages.h"
#include "base/rng.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/gemm.h"

/*
 * Intermediates of one layer's forward pass (pointers into owned buffers).
 * The inputs of matrix products (h1, h2, ctx, act) exist in fp32 in fp32
 * mode and in bf16 (the *b fields) in bf16 mode; ctx is kept in fp32 in both
 * (attention backward reads it). Unused fields are NULL.
 */
typedef struct layer_acts {
	float *rstd1, *h1, *q, *k, *v, *ctx, *lse, *xmid, *rstd2, *h2, *gate, *up, *act;
	uint16_t *h1b, *h2b, *ctxb, *actb;
	/* bf16 mode: q, k, v, gate, up (and ctx, ctxb above) kept in bf16; the
	 * layer in use has their values in fp32 in the acts' q32 ... up32 */
	uint16_t *qb, *kb, *vb, *xmidb, *gateb, *upb;
} layer_acts;

typedef struct st_llama_acts {
	int64_t B, T, N;
	enum st_remat policy;
	int32_t *inputs, *targets; /* (N) */
	float **xs;                /* L+1 residual-stream buffers (N,E), fp32 mode */
	uint16_t **xsb;            /* the same in bf16 (bf16 mode, as MaxText's bf16 activations) */
	float *xin, *xout;         /* bf16 mode: a layer's input and output in fp32 (N,E) */
	/* bf16 mode: q, k, v, ctx, gate, up of the layer in use in fp32 (each
	 * value bf16-exact: what the layer keeps in bf16) */
	float *q32, *k32, *v32, *ctx32, *xmid32, *gate32, *up32;
	layer_acts *layer;         /* L: what each layer keeps (per policy) */
	layer_acts scratch;        /* recomputed intermediates */
	float *rstdf, *hf;         /* final norm (hf: fp32 mode) */
	uint16_t *hfb;             /* final norm output (bf16 mode) */
	float *cos_t, *sin_t;      /* RoPE tables (T, D/2) */
	/* gradient buffers (dm2: fp32 mode; the *b: bf16 copies, bf16 mode) */
	float *dx, *dh, *dm1, *dm2, *dctx, *dq, *dk, *dv;
	uint16_t *dxb, *dm1b, *dm2b, *dqb, *dkb, *dvb;
	float *xent;               /* lm-head chunk (chunk_rows, V); fused path: st_lm_head_xent's workspace */
	st_ws xent_ws;             /* ... as that workspace (fused path) */
	st_ws ws;                  /* the kernels' workspace: attention, RMSNorm backward */
	st_kctx kc;                /* the matrix products' context: their scratch, primitive table */
	float *tp_tmp;             /* (N,E) partial products under tensor parallelism */
	uint16_t *wtmp;            /* bf16 mode, weights not resident: a weight's bf16 copy */
	int64_t wtmp_elems;        /* its capacity */
	/* bf16 mode, fp32 kernels: fp32 copies of bf16-only first (ka) and
	 * second (kb) operands, each remembered until a bf16 operand is written
	 * (bf16_written), so that products reading the same one convert it once */
	struct kcopy {
		float *buf;
		int64_t cap;          /* elements */
		const uint16_t *src;  /* what buf holds a copy of (NULL: nothing) */
		int64_t n;
	} ka, kb;
	float *xr_f;               /* split cross-entropy: 4 x chunk_rows floats */
	double *xr_d;              /* ... and chunk_rows doubles */
	int64_t chunk_rows;
	int64_t bytes;             /* activations */
	int64_t ws_bytes;          /* the kernels' workspace (ws) */
	int64_t kc_bytes;          /* the products' context (kc) */
	int nblocks;
	void *blocks[64];          /* every allocation, for release (st_pages_free) */
	size_t block_bytes[64];
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

/* One layer's tensors in table order. rows, cols: 'E' emb, 'Q' heads x
 * head_dim, 'K' kv heads x head_dim, 'M' mlp, 0 none (1-D). */
static const struct {
	const char *suffix;
	enum st_tensor_kind kind;
	char rows, cols;
	int tp_dim; /* Megatron: q/k/v, gate/up by rows (heads, mlp); o, down by columns */
} layer_tensors[ST_LAYER_TENSORS] = {
	{"input_layernorm.weight", ST_T_NORM, 'E', 0, -1},
	{"self_attn.q_proj.weight", ST_T_LINEAR, 'Q', 'E', 0},
	{"self_attn.k_proj.weight", ST_T_LINEAR, 'K', 'E', 0},
	{"self_attn.v_proj.weight", ST_T_LINEAR, 'K', 'E', 0},
	{"self_attn.o_proj.weight", ST_T_LINEAR, 'E', 'Q', 1},
	{"post_attention_layernorm.weight", ST_T_NORM, 'E', 0, -1},
	{"mlp.gate_proj.weight", ST_T_LINEAR, 'M', 'E', 0},
	{"mlp.up_proj.weight", ST_T_LINEAR, 'M', 'E', 0},
	{"mlp.down_proj.weight", ST_T_LINEAR, 'E', 'M', 1},
};

static int64_t layer_dim(const st_llama_shape *s, char d)
{
	return d == 'E' ? s->E : d == 'M' ? s->M : d == 'Q' ? s->H * s->D : d == 'K' ? s->K * s->D : 0;
}

int64_t st_llama_num_tensors(const st_llama_shape *s) { return 3 + ST_LAYER_TENSORS * s->L; }

/* Tensor `slot` of layer l (0..8 in table order), or with l < 0 the
 * embedding (slot 0), final norm (1) or output layer (2). */
static void table_entry(const st_llama_shape *s, int64_t l, int slot, st_tensor *t)
{
	int64_t rows, cols;
	memset(t, 0, sizeof(*t));
	if (l >= 0) {
		snprintf(t->name, sizeof(t->name), "model.layers.%lld.%s", (long long)l, layer_tensors[slot].suffix);
		t->kind = layer_tensors[slot].kind;
		t->tp_dim = layer_tensors[slot].tp_dim;
		rows = layer_dim(s, layer_tensors[slot].rows);
		cols = layer_dim(s, layer_tensors[slot].cols);
	} else {
		static const char *const name[3] = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"};
		static const enum st_tensor_kind kind[3] = {ST_T_EMBED, ST_T_NORM, ST_T_LINEAR};
		snprintf(t->name, sizeof(t->name), "%s", name[slot]);
		t->kind = kind[slot];
		t->tp_dim = slot == 2 ? 0 : -1; /* the output layer by vocabulary rows */
		rows = slot == 1 ? s->E : s->V;
		cols = slot == 1 ? 0 : s->E;
	}
	t->ndim = cols ? 2 : 1;
	t->global_shape[0] = t->shape[0] = rows;
	t->global_shape[1] = t->shape[1] = cols;
	if (__builtin_mul_overflow(rows, cols ? cols : 1, &t->numel))
		t->numel = -1;
}

void st_llama_tensor_at(const st_llama_shape *s, int64_t i, st_tensor *t)
{
	int64_t L = s->L;
	if (i < 0 || i >= st_llama_num_tensors(s))
		ST_BUG("tensor %lld of a table of %lld", (long long)i, (long long)st_llama_num_tensors(s));
	if (i == 0 || i > ST_LAYER_TENSORS * L)
		table_entry(s, -1, i == 0 ? 0 : (int)(i - ST_LAYER_TENSORS * L), t);
	else
		table_entry(s, (i - 1) / ST_LAYER_TENSORS, (int)((i - 1) % ST_LAYER_TENSORS), t);
}

int64_t st_llama_count_params(const st_llama_shape *s)
{
	int64_t layer = 0, total = 0;
	st_tensor t;
	for (int slot = 0; slot < ST_LAYER_TENSORS; slot++) { /* every layer has layer 0's tensors */
		table_entry(s, 0, slot, &t);
		if (t.numel < 0 || __builtin_add_overflow(layer, t.numel, &layer))
			return -1;
	}
	if (__builtin_mul_overflow(layer, s->L, &total))
		return -1;
	for (int slot = 0; slot < 3; slot++) {
		table_entry(s, -1, slot, &t);
		if (t.numel < 0 || __builtin_add_overflow(total, t.numel, &total))
			return -1;
	}
	return total;
}

int st_llama_check_config(const st_config *c, int64_t *num_params)
{
	st_llama_shape s;
	st_llama_shape_from_config(&s, c);
	int64_t n = st_llama_count_params(&s);
	if (n < 0)
		return st_fail(ST_EINVAL, "model %s is too large: its parameter count overflows 64 bits", c->model_name);
	int rc = st_kplan_check(c->bf16_kernels);
	if (rc < 0)
		return rc;
	if (num_params)
		*num_params = n;
	return 0;
}

/* Append table entry i as this process holds it: tp_dim divided by tp. */
static void add_tensor(st_llama *m, int64_t i, int64_t *off)
{
	st_tensor *t = &m->tensors[m->ntensors++];
	st_llama_tensor_at(&m->s, i, t);
	t->offset = *off;
	if (t->tp_dim >= 0) {
		t->shape[t->tp_dim] /= m->tp;
		t->tp_offset[t->tp_dim] = t->shape[t->tp_dim] * m->tp_rank;
	}
	t->numel = t->ndim == 2 ? t->shape[0] * t->shape[1] : t->shape[0];
	*off += t->numel;
}

/* The view field of tensor i (table order: embedding; per layer ln1, q, k,
 * v, o, ln2, gate, up, down; final norm; output layer). */
static float **view_field(st_llama_view *v, int i, int64_t L)
{
	if (i == 0)
		return &v->embed;
	if (i == 1 + ST_LAYER_TENSORS * L)
		return &v->norm;
	if (i == 2 + ST_LAYER_TENSORS * L)
		return &v->lm_head;
	st_layer_view *lv = &v->layers[(i - 1) / ST_LAYER_TENSORS];
	float **f[ST_LAYER_TENSORS] = {&lv->ln1, &lv->wq, &lv->wk, &lv->wv, &lv->wo, &lv->ln2, &lv->wg, &lv->wu, &lv->wd};
	return f[(i - 1) % ST_LAYER_TENSORS];
}

void st_llama_unit(const st_llama *m, int u, int *t0, int *nt)
{
	int64_t L = m->s.L;
	*t0 = u == 0 ? 0 : u <= L ? 1 + ST_LAYER_TENSORS * (u - 1) : 1 + ST_LAYER_TENSORS * (int)L;
	*nt = u == 0 ? 1 : u <= L ? ST_LAYER_TENSORS : 2;
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
	if (tp < 1)
		return st_fail(ST_EINVAL, "tensor parallelism %d: must be at least 1", tp);
	const char *what[4] = {"num_query_heads", "num_kv_heads", "mlp_dim", "vocab_size"};
	const int64_t dim[4] = {s->H, s->K, s->M, s->V};
	for (int i = 0; i < 4; i++)
		if (dim[i] % tp)
			return st_fail(ST_EINVAL,
				       "%s %lld is not divisible by the tensor parallelism %d "
				       "(ici_tensor_parallelism x dcn_tensor_parallelism)",
				       what[i], (long long)dim[i], tp);
	m->s = *s;
	m->ls = *s;
	m->ls.H /= tp;
	m->ls.K /= tp;
	m->ls.M /= tp;
	m->ls.V /= tp;
	m->tp = tp;
	m->tp_rank = tp_rank;
	m->tp_comm = tp > 1 ? tp_comm : NULL;
	/* this process's table: replicated embedding and norms, the rest split by tp */
	int64_t L = s->L, nt = st_llama_num_tensors(s), off = 0;
	m->tensors = calloc((size_t)nt, sizeof(st_tensor));
	m->p.layers = calloc((size_t)L, sizeof(st_layer_view));
	m->g.layers = calloc((size_t)L, sizeof(st_layer_view));
	if (m->tensors)
		for (int64_t i = 0; i < nt; i++)
			add_tensor(m, i, &off);
	m->nparams = off;
	if (resident && m->tensors) {
		/* page-aligned: a checkpoint writes them with O_DIRECT (base/pages.h) */
		m->params = st_pages_alloc((size_t)m->nparams * sizeof(float));
		m->grads = st_pages_alloc((size_t)m->nparams * sizeof(float));
	}
	if (!m->tensors || !m->p.layers || !m->g.layers || (resident && (!m->params || !m->grads))) {
		st_llama_release(m);
		return st_fail(ST_ENOMEM, "out of memory for %lld parameters", (long long)off);
	}
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
	if (!m->grads) /* the gradient slots are zeroed as units are acquired */
		return;
	if (m->hooks)
		memset(m->grads, 0, (size_t)m->nparams * sizeof(float));
	else /* written, not added to, by the next backward (gbeta) */
		m->gfresh = 1;
}

/* beta of a weight's gradient product, its first (or only) one in this
 * backward: 0 when the gradients are fresh (st_llama_zero_grads), else 1. */
static float gbeta(const st_llama *m)
{
	return m->gfresh ? 0.0f : 1.0f;
}

/* A gradient that is only ever added to (norms, embedding), cleared when
 * the gradients are fresh. */
static void gclear(const st_llama *m, float *g, int64_t n)
{
	if (m->gfresh)
		memset(g, 0, (size_t)n * sizeof(float));
}

int64_t st_llama_largest_linear(const st_llama *m)
{
	int64_t n = 0;
	for (int i = 0; i < m->ntensors; i++)
		if (m->tensors[i].kind == ST_T_LINEAR && m->tensors[i].numel > n)
			n = m->tensors[i].numel;
	return n;
}

const st_tensor *st_llama_find(const st_llama *m, const char *name)
{
	for (int i = 0; i < m->ntensors; i++)
		if (!strcmp(m->tensors[i].name, name))
			return &m->tensors[i];
	return NULL;
}

/* ---- activations ---- */

/*
 * One function lays out every activation buffer, both to allocate them
 * (st_llama_alloc_acts) and to count their bytes without allocating
 * (st_llama_act_bytes_for, which `slicetrain plan` uses), so the two cannot
 * disagree. Each piece is rounded up to 64 bytes.
 */
typedef struct carver {
	st_llama_acts *a; /* NULL: count only */
	int64_t bytes;    /* activations */
	int64_t ws_bytes; /* the kernels' workspace, counted apart (take_as) */
	int64_t kc_bytes; /* the products' context, counted apart */
	int oom;
} carver;

static int64_t align64(int64_t n) { return (n + 63) & ~(int64_t)63; }

/* What a buffer is counted as. */
enum { ACTS, WORKSPACE, KCTX };

static int64_t *count_of(int64_t *acts, int64_t *ws, int64_t *kc, int what)
{
	return what == WORKSPACE ? ws : what == KCTX ? kc : acts;
}

/* A buffer of the activations, the kernels' workspace or the products'
 * context (what). */
static void *take_as(carver *c, int64_t bytes, int what)
{
	bytes = align64(bytes > 0 ? bytes : 1);
	*count_of(&c->bytes, &c->ws_bytes, &c->kc_bytes, what) += bytes;
	st_llama_acts *a = c->a;
	if (!a || c->oom)
		return NULL;
	if (a->nblocks == (int)(sizeof(a->blocks) / sizeof(a->blocks[0])))
		ST_BUG("too many activation blocks");
	/* zeroed; from 2 MiB on in transparent huge pages: the products read
	 * activations across rows kilobytes apart, and with 4 KiB pages their
	 * packing walked the page tables (the bf16 step -5.6% at 1 thread, -3%
	 * at 2, docs/performance.md) */
	void *p = st_pages_alloc((size_t)bytes);
	if (!p) {
		c->oom = 1;
		return NULL;
	}
	a->block_bytes[a->nblocks] = (size_t)bytes;
	a->blocks[a->nblocks++] = p;
	*count_of(&a->bytes, &a->ws_bytes, &a->kc_bytes, what) += bytes;
	return p;
}

static void *take(carver *c, int64_t bytes) { return take_as(c, bytes, ACTS); }

static void acts_free(st_llama_acts *a)
{
	if (!a)
		return;
	st_kctx_release(&a->kc); /* its primitives; its memory is a block below */
	for (int i = 0; i < a->nblocks; i++)
		st_pages_free(a->blocks[i], a->block_bytes[i]);
	free(a->xs);
	free(a->xsb);
	free(a->layer);
	free(a);
}

/* In a layout function: field f of *obj at base + off (base NULL: only
 * counted), n elements of `size` bytes, rounded up to 64 bytes. */
#define PLACE(obj, f, n, size)                                 \
	do {                                                   \
		if (base)                                      \
			(obj)->f = (void *)(base + off);       \
		off += align64((n) * (int64_t)(size));         \
	} while (0)

/* The fields of a layer_acts set; `which` selects them. */
enum { K_NORMS = 1, K_MM = 2, K_ATTN = 4, K_ACT = 8 };

/* Lay out the selected fields of one layer in a block at base (NULL: only
 * count); returns the block's bytes. */
static int64_t layer_layout(layer_acts *la, char *base, const st_llama_shape *s, int64_t B,
			    int64_t T, int which, int bf16)
{
	int64_t N = B * T, E = s->E, HD = s->H * s->D, KD = s->K * s->D, M = s->M, off = 0;
#define TAKE(f, n, size) PLACE(la, f, n, size)
#define F32(f, n) TAKE(f, n, sizeof(float))
#define KEPT(f, n) /* bf16 in bf16 mode: a product input, or an intermediate kept \
			  rounded (the layer in use has it in fp32, acts' f##32) */ \
	do {                                                   \
		if (bf16)                                      \
			TAKE(f##b, n, sizeof(uint16_t));       \
		else                                           \
			F32(f, n);                             \
	} while (0)
	if (which & K_NORMS) {
		F32(rstd1, N);
		KEPT(h1, N * E);
		F32(rstd2, N);
		KEPT(h2, N * E);
	}
	if (which & K_MM) {
		KEPT(q, N * HD);
		KEPT(k, N * KD);
		KEPT(v, N * KD);
		KEPT(xmid, N * E);
		KEPT(gate, N * M);
		KEPT(up, N * M);
	}
	if (which & K_ATTN) {
		KEPT(ctx, N * HD);
		F32(lse, B * s->H * T);
	}
	if (which & K_ACT)
		KEPT(act, N * M);
#undef KEPT
#undef F32
#undef TAKE
	return off;
}

/* Fill the fields a layer does not keep from the shared scratch set. */
static void layer_merge(layer_acts *d, const layer_acts *s)
{
#define MERGE(f)              \
	if (!d->f)            \
		d->f = s->f
	MERGE(rstd1); MERGE(h1); MERGE(q); MERGE(k); MERGE(v); MERGE(ctx); MERGE(lse);
	MERGE(xmid); MERGE(rstd2); MERGE(h2); MERGE(gate); MERGE(up); MERGE(act);
	MERGE(h1b); MERGE(h2b); MERGE(ctxb); MERGE(actb);
	MERGE(qb); MERGE(kb); MERGE(vb); MERGE(xmidb); MERGE(gateb); MERGE(upb);
#undef MERGE
}

/* Rows of logits per cross-entropy chunk: at most 64 MiB of logits of
 * `size` bytes each (fp32 4, or 2 in bf16 mode, which keeps them in bf16):
 * large enough that the output layer's weight-gradient product, whose inner
 * dimension is the chunk's rows, runs near full speed. The rows are spread
 * evenly over the chunks that takes, rounded up to a multiple of 32 where
 * that stays within the 64 MiB (whole 32-row strips for the products:
 * llama3-125m at 4 x 512 tokens gives 4 x 512 rows in fp32, 2 x 1024 in
 * bf16). */
static int64_t xent_chunk_rows(int64_t V, int64_t N, int size)
{
	int64_t r = (64 << 20) / size / V;
	if (r < 1)
		return 1;
	if (r >= N)
		return N;
	int64_t chunks = (N + r - 1) / r, even = (N + chunks - 1) / chunks;
	int64_t r32 = (even + 31) / 32 * 32;
	return r32 <= r ? r32 : even;
}

static int keep_mask(enum st_remat policy)
{
	int all = K_NORMS | K_MM | K_ATTN | K_ACT;
	return policy == ST_REMAT_NONE ? all : policy == ST_REMAT_MINIMAL ? K_MM : 0;
}

/* What phase_layout lays out. */
typedef struct phase_set {
	int bf16;       /* bf16 mode */
	int fused_xent; /* fp32 mode, no tensor parallelism: st_lm_head_xent's workspace */
	int dm2;        /* bf16 mode: the fp32 SwiGLU gate gradient (an fp32 kernel reads it) */
	/* bf16 mode: the gradients' bf16 copies a bf16 kernel reads (grad_op):
	 * of dx, of the SwiGLU gradients, of dq, of dk and dv */
	int dxb, gub, dqb, dkvb;
} phase_set;

/* What the plan p needs (NULL: every site bf16). */
static phase_set phase_needs(int bf16, int tp, const st_kplan *p)
{
	phase_set ps = {.bf16 = bf16, .fused_xent = !bf16 && tp <= 1};
	if (!bf16)
		return ps;
#define BF(site) (!p || !p->f32[site])
#define F32(site) (p && p->f32[site])
	ps.dm2 = F32(ST_KS_D_GATE_UP) || F32(ST_KS_W_GATE_UP);
	ps.dxb = BF(ST_KS_D_DOWN) || BF(ST_KS_W_DOWN) || BF(ST_KS_D_O) || BF(ST_KS_W_O);
	ps.gub = BF(ST_KS_D_GATE_UP) && BF(ST_KS_W_GATE_UP); /* else rounded in place */
	ps.dqb = BF(ST_KS_D_Q) || BF(ST_KS_W_Q);
	ps.dkvb = BF(ST_KS_D_KV) || BF(ST_KS_W_KV);
#undef F32
#undef BF
	return ps;
}

/* The logits chunk: R rows of fp32, or in bf16 mode of bf16 (when an fp32
 * kernel runs one of the output layer's products, R / 2 rows of fp32 at a
 * time, at least one: lm_head_xent_split). */
static int64_t xent_bytes(const st_llama_shape *s, int64_t R, const phase_set *ps)
{
	if (ps->fused_xent)
		return (int64_t)st_lm_head_workspace_bytes(s->V, R);
	return ps->bf16 ? (R > 1 ? R : 2) * s->V * 2 : R * s->V * 4;
}

/*
 * The buffers each of which lives within one phase of a step share one block
 * (laid out at base; base NULL: only counted; returns its bytes):
 *  - a layer's backward: the gradient buffers; the MLP's (dm1, dm2 and their
 *    bf16 copies) and the attention's (dctx, dq, dk, dv, theirs) overlap, the
 *    MLP's backward ending before the attention's begins;
 *  - a layer's forward (bf16 mode, also when recomputed in the backward): the
 *    fp32 gate and up, over the gradient buffers (free then: the backward
 *    reads the kept bf16 gate and up);
 *  - both (bf16 mode): the fp32 set of the layer in use;
 *  - the output layer, between the last layer's forward and its backward:
 *    the logits chunk over everything above (the gradient it feeds the
 *    final norm goes to dh, outside the block). The logits' gradient is
 *    written over the chunk itself: over the bf16 logits, or in bf16 each
 *    row over the first half of its own fp32 storage (lm_head_xent_split).
 * dx (the layers' output gradient, live across phases) and dh are outside.
 */
static int64_t phase_layout(st_llama_acts *a, char *base, const st_llama_shape *s, int64_t N,
			    int64_t R, const phase_set *ps)
{
	int64_t E = s->E, HD = s->H * s->D, KD = s->K * s->D, M = s->M, off = 0, end;
	int bf = ps->bf16;
#define PUT(f, n, size) PLACE(a, f, n, size)
#define FURTHEST(x) (off > (x) ? off : (x))
	if (bf) {
		PUT(xin, N * E, 4);
		PUT(xout, N * E, 4);
		PUT(q32, N * HD, 4);
		PUT(k32, N * KD, 4);
		PUT(v32, N * KD, 4);
		PUT(ctx32, N * HD, 4);
		PUT(xmid32, N * E, 4);
	}
	int64_t part = off;
	PUT(dm1, N * M, 4); /* the MLP's */
	if (!bf || ps->dm2)
		PUT(dm2, N * M, 4);
	if (ps->gub) {
		PUT(dm1b, N * M, 2);
		PUT(dm2b, N * M, 2);
	}
	int64_t mlp_end = off;
	end = off;
	off = part; /* the attention's */
	PUT(dctx, N * HD, 4);
	PUT(dq, N * HD, 4);
	PUT(dk, N * KD, 4);
	PUT(dv, N * KD, 4);
	if (ps->dqb)
		PUT(dqb, N * HD, 2);
	if (ps->dkvb) {
		PUT(dkb, N * KD, 2);
		PUT(dvb, N * KD, 2);
	}
	end = FURTHEST(end);
	if (ps->dxb) {
		/* read by the first products of each part only: over the end of
		 * the MLP's last buffer (written after), clear of dm1 and dctx
		 * (written while it is read) */
		int64_t m1 = align64(N * M * 4), c1 = align64(N * HD * 4);
		off = mlp_end - align64(N * E * 2);
		if (off < part + (m1 > c1 ? m1 : c1))
			off = part + (m1 > c1 ? m1 : c1);
		PUT(dxb, N * E, 2);
		end = FURTHEST(end);
	}
	if (bf) { /* a layer's forward */
		off = part;
		PUT(gate32, N * M, 4);
		PUT(up32, N * M, 4);
		end = FURTHEST(end);
	}
	off = 0; /* the output layer */
	PUT(xent, xent_bytes(s, R, ps), 1);
#undef FURTHEST
#undef PUT
	return off > end ? off : end;
}

/* Enough for model_products: 15 sites on three kernels, and the output
 * layer's 3 on three kernels at up to 4 chunk lengths. */
#define MAX_PRODUCTS (15 * 3 + 3 * 3 * 4)

/* The output layer's chunk lengths for chunks of `step` rows (a whole
 * chunk, and the last, shorter one) appended to out[0..n) where not there
 * yet; returns the new count. */
static int chunk_lengths(int64_t N, int64_t step, int64_t *out, int n)
{
	int64_t len[2] = {step < N ? step : N, N % step};
	for (int i = 0; i < 2; i++) {
		int dup = len[i] <= 0;
		for (int j = 0; j < n; j++)
			dup |= out[j] == len[i];
		if (!dup)
			out[n++] = len[i];
	}
	return n;
}

/*
 * The shape of every matrix product the model runs (s: this process's
 * shape, N tokens, R rows of an output-layer chunk), for sizing its kernel
 * context: the product sites of kplan.h, in bf16 mode on both kernels (as
 * any plan picks; on a given CPU at most one of them takes scratch: AMX
 * for bf16, the tiles for fp32 where oneDNN has no AVX-512) and with a bf16
 * output where the site has one (gate_up, logits); the output layer at each
 * chunk length it runs (lm_head_xent_split: R, or R / 2 rows where an fp32
 * kernel reads the fp32 logits; the fused fp32 path: st_lm_head_products).
 * Returns the count (at most MAX_PRODUCTS).
 */
static int64_t model_products(const st_llama_shape *s, int64_t N, int64_t R, int bf16,
			      const phase_set *ps, st_gemm_shape *out)
{
	st_kshape ks = {.B = 1, .T = N, .E = s->E, .H = s->H, .K = s->K, .D = s->D, .M = s->M,
			.V = s->V, .R = R};
	int64_t n = 0, rows[4];
	int nrows = chunk_lengths(N, R, rows, 0);
	if (bf16)
		nrows = chunk_lengths(N, R / 2 > 0 ? R / 2 : 1, rows, nrows);
	for (int i = 0; i < ST_KS_ATTN; i++) {
		int out_layer = i == ST_KS_LOGITS || i == ST_KS_D_LOGITS || i == ST_KS_W_LOGITS;
		if (out_layer && ps->fused_xent)
			continue;
		for (int r = 0; r < (out_layer ? nrows : 1); r++) {
			st_ksite_product(&ks, i, rows[r], ST_GEMM_F32, &out[n++]);
			if (!bf16)
				continue;
			st_ksite_product(&ks, i, rows[r], ST_GEMM_BF16, &out[n++]);
			if (i == ST_KS_GATE_UP || i == ST_KS_LOGITS)
				st_ksite_product(&ks, i, rows[r], ST_GEMM_BF16_OUT, &out[n++]);
		}
	}
	if (ps->fused_xent)
		n += st_lm_head_products(N, s->E, s->V, R, out + n);
	if (n > MAX_PRODUCTS)
		ST_BUG("model_products: %lld products, room for %d", (long long)n, MAX_PRODUCTS);
	return n;
}

/* Every buffer, in one order: allocates into c->a, or only counts. */
static void acts_layout(carver *c, const st_llama_shape *s, int64_t B, int64_t T,
			enum st_remat policy, const st_llama_act_opts *o)
{
	st_llama_acts dummy = {0}, *a = c->a ? c->a : &dummy;
	int64_t L = s->L, N = B * T, E = s->E, HD = s->H * s->D, M = s->M;
	int64_t mx = HD > E ? HD : E, R = xent_chunk_rows(s->V, N, o->bf16 ? 2 : 4);
	int bf = o->bf16;
	int keep = keep_mask(policy), shared = (K_NORMS | K_MM | K_ATTN | K_ACT) & ~keep;
	char *blk;
	if (shared && (blk = take(c, layer_layout(NULL, NULL, s, B, T, shared, bf))))
		layer_layout(&a->scratch, blk, s, B, T, shared, bf);
	for (int64_t l = 0; l < L; l++) {
		if (keep && (blk = take(c, layer_layout(NULL, NULL, s, B, T, keep, bf))))
			layer_layout(&a->layer[l], blk, s, B, T, keep, bf);
		if (c->a)
			layer_merge(&a->layer[l], &a->scratch);
	}
	for (int64_t l = 0; l <= L; l++) { /* the residual stream between layers */
		void *x = take(c, N * E * (bf ? 2 : 4));
		if (c->a && bf)
			a->xsb[l] = x;
		else if (c->a)
			a->xs[l] = x;
	}
	a->rstdf = take(c, N * 4);
	if (bf)
		a->hfb = take(c, N * E * 2);
	else
		a->hf = take(c, N * E * 4);
	a->cos_t = take(c, T * (s->D / 2) * 4);
	a->sin_t = take(c, T * (s->D / 2) * 4);
	a->dx = take(c, N * E * 4);
	a->dh = take(c, N * mx * 4); /* also the output layer's dx */
	a->chunk_rows = R;
	phase_set ps = phase_needs(bf, o->tp, o->kplan);
	blk = take(c, phase_layout(NULL, NULL, s, N, R, &ps));
	if (c->a && blk)
		phase_layout(a, blk, s, N, R, &ps);
	a->xent_ws = (st_ws){.mem = a->xent, .bytes = (size_t)xent_bytes(s, R, &ps), .threads = 1};
	if (bf && o->kplan) {
		st_kshape ks = {.B = B, .T = T, .E = E, .H = s->H, .K = s->K, .D = s->D, .M = M,
				.V = s->V, .R = R};
		int64_t na, nb;
		/* act's copies go to dm1 (layer_forward, layer_backward) */
		st_kplan_scratch(o->kplan, &ks, 1u << ST_KS_DOWN | 1u << ST_KS_W_DOWN, &na, &nb);
		if (na)
			a->ka.buf = take(c, na * 4);
		if (nb)
			a->kb.buf = take(c, nb * 4);
		a->ka.cap = na;
		a->kb.cap = nb;
	}
	if (bf && o->weight_copy_elems > 0) {
		a->wtmp = take(c, o->weight_copy_elems * 2);
		a->wtmp_elems = o->weight_copy_elems;
	}
	if (o->tp > 1)
		a->tp_tmp = take(c, N * E * 4);
	if (o->tp > 1 || bf) {
		a->xr_f = take(c, 4 * R * 4);
		a->xr_d = take(c, R * 8);
	}
	a->inputs = take(c, N * 4);
	a->targets = take(c, N * 4);
	/* the kernels' workspace: one block for all calls (they run one at a
	 * time), as large as the largest; its per-thread slices for o->threads */
	int threads = o->threads > 0 ? o->threads : omp_get_max_threads();
	size_t attn = st_attention_workspace_bytes(B, T, s->H, s->K, s->D, threads);
	if (bf) { /* either attention kernel, as the plan says */
		size_t a16 = st_attention_bf16_workspace_bytes(B, T, s->H, s->K, s->D, threads);
		attn = a16 > attn ? a16 : attn;
	}
	size_t norm = st_rmsnorm_backward_workspace_bytes(N, E);
	a->ws = (st_ws){.bytes = attn > norm ? attn : norm, .threads = threads};
	a->ws.mem = take_as(c, (int64_t)a->ws.bytes, WORKSPACE);
	/* the matrix products' context: scratch for the largest of their
	 * shapes on this CPU (kctx.h), per-thread slices for the same threads,
	 * and the primitive table */
	st_gemm_shape sh[MAX_PRODUCTS];
	int64_t np = model_products(s, N, R, bf, &ps, sh);
	size_t kb = st_kctx_bytes(st_gemm_workspace_bytes_list(sh, np, threads));
	void *kmem = take_as(c, (int64_t)kb, KCTX);
	if (c->a && kmem && st_kctx_init_at(&a->kc, kmem, kb, threads) < 0)
		c->oom = 1; /* cannot happen: the block is 64-byte aligned and large enough */
}

/* acts_layout counting only (o NULL: one process, fp32). any_plan: the
 * most over the plans, which differ in the backward's sites (each of their
 * gradients has a bf16 copy when a bf16 kernel reads it, an fp32 one when
 * an fp32 kernel does); forward sites on fp32 take the most (their operand
 * copies). */
static carver layout_count(const st_llama_shape *s, int64_t B, int64_t T, enum st_remat policy,
			   const st_llama_act_opts *o)
{
	st_llama_act_opts fp32 = {.tp = 1};
	carver c = {0};
	if (!o || !o->bf16 || !o->any_plan) {
		acts_layout(&c, s, B, T, policy, o ? o : &fp32);
		return c;
	}
	enum { NB = ST_KS_W_LOGITS - ST_KS_D_DOWN + 1 };
	st_llama_act_opts one = *o;
	st_kplan p;
	memset(&p, 0, sizeof(p));
	one.kplan = &p;
	one.any_plan = 0;
	for (int i = 0; i < ST_KS_D_DOWN; i++)
		p.f32[i] = 1;
	for (unsigned bits = 0; bits < 1u << NB; bits++) {
		for (int i = 0; i < NB; i++)
			p.f32[ST_KS_D_DOWN + i] = bits >> i & 1;
		carver t = {0};
		acts_layout(&t, s, B, T, policy, &one);
		if (t.bytes > c.bytes)
			c = t;
	}
	return c;
}

int64_t st_llama_act_bytes_for(const st_llama_shape *s, int64_t B, int64_t T, enum st_remat policy,
			       const st_llama_act_opts *o)
{
	return layout_count(s, B, T, policy, o).bytes;
}

int64_t st_llama_workspace_bytes_for(const st_llama_shape *s, int64_t B, int64_t T,
				     enum st_remat policy, const st_llama_act_opts *o)
{
	return layout_count(s, B, T, policy, o).ws_bytes;
}

int64_t st_llama_kctx_bytes_for(const st_llama_shape *s, int64_t B, int64_t T, enum st_remat policy,
				const st_llama_act_opts *o)
{
	return layout_count(s, B, T, policy, o).kc_bytes;
}

int st_llama_alloc_acts(st_llama *m, int64_t B, int64_t T, enum st_remat policy)
{
	const st_llama_shape *s = &m->ls;
	acts_free(m->acts);
	st_llama_acts *a = m->acts = calloc(1, sizeof(*a));
	if (!a)
		return st_fail(ST_ENOMEM, "out of memory for activations");
	a->B = B;
	a->T = T;
	a->N = B * T;
	a->policy = policy;
	a->xs = calloc((size_t)(s->L + 1), sizeof(float *));
	a->xsb = calloc((size_t)(s->L + 1), sizeof(uint16_t *));
	a->layer = calloc((size_t)s->L, sizeof(layer_acts));
	st_llama_act_opts o = {.tp = m->tp_comm ? m->tp : 1, .bf16 = m->bf16,
			       .kplan = m->bf16 ? &m->kplan : NULL};
	if (m->bf16 && !m->params) /* weights bound per unit (ZeRO-3): converted per product */
		o.weight_copy_elems = st_llama_largest_linear(m);
	carver c = {.a = a};
	if (a->xs && a->xsb && a->layer)
		acts_layout(&c, s, B, T, policy, &o);
	if (!a->xs || !a->xsb || !a->layer || c.oom) {
		acts_free(a);
		m->acts = NULL;
		return st_fail(ST_ENOMEM, "out of memory for activations (batch %lld x %lld)",
			       (long long)B, (long long)T);
	}
	st_rope_tables(a->cos_t, a->sin_t, T, s->D, s->theta, &s->rope);
	return 0;
}

int64_t st_llama_act_bytes(const st_llama *m) { return m->acts ? m->acts->bytes : 0; }

int64_t st_llama_workspace_bytes(const st_llama *m) { return m->acts ? m->acts->ws_bytes : 0; }

int64_t st_llama_kctx_bytes(const st_llama *m) { return m->acts ? m->acts->kc_bytes : 0; }

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
	return m->tp_comm ? st_comm_allreduce(m->tp_comm, buf, n, ST_DTYPE_F32, ST_SUM) : 0;
}

/*
 * A matrix-product operand: fp32 (f) in fp32 mode, bf16 (h) in bf16 mode.
 * Activations are made in the mode's type where they are produced (norms,
 * SwiGLU, gradient buffers converted once before their products); weights
 * are passed as fp32 and mm finds their bf16 copy.
 */
typedef struct opnd {
	const float *f;
	const uint16_t *h;
} opnd;

#define OPF(p) ((opnd){.f = (p)})
/* A layer_acts field: fp32 or bf16, whichever this mode keeps. */
#define OPA(la, field) ((opnd){.f = (la)->field, .h = (la)->field##b})

static opnd op_at(opnd x, int64_t off)
{
	return (opnd){.f = x.f ? x.f + off : NULL, .h = x.h ? x.h + off : NULL};
}

/* Does product site `site` run on the fp32 kernel (always in fp32 mode)? */
static int on_f32(const st_llama *m, int site) { return !m->bf16 || m->kplan.f32[site]; }

/* An attention site runs on the fp32 kernel, which reads q, k and v in fp32
 * (the bf16 one reads the kept bf16 copies). */
static int attn_reads_f32(const st_llama *m)
{
	return on_f32(m, ST_KS_ATTN) || on_f32(m, ST_KS_D_ATTN);
}

/* A bf16 product operand was (re)written: the fp32 copies no longer hold it.
 * Called by every writer of a bf16 operand (norms, SwiGLU, gradient
 * companions, cross-entropy gradients, ctx's copy). */
static void bf16_written(const st_llama *m)
{
	if (m->bf16 && m->acts)
		m->acts->ka.src = m->acts->kb.src = NULL;
}

/* An fp32 gradient buffer as the operand of sites s1 and s2: in bf16 mode
 * rounded once into its bf16 companion when either runs on the bf16 kernel
 * (then read by every bf16 product that uses it). */
static opnd grad_op(const st_llama *m, const float *f, uint16_t *h, int64_t n, int s1, int s2)
{
	if (on_f32(m, s1) && on_f32(m, s2))
		return OPF(f);
	st_f32_to_bf16_array(h, f, n);
	bf16_written(m);
	return (opnd){.f = f, .h = h};
}

/* An operand for the fp32 kernel: its fp32 values, or its bf16 values
 * converted (exactly) into k's buffer, once until the next bf16_written
 * (rows x ld elements are read). */
static const float *f32_operand(opnd x, struct kcopy *k, int64_t rows, int64_t ld)
{
	if (x.f)
		return x.f;
	int64_t n = rows * ld;
	if (!x.h || !k->buf || n > k->cap)
		ST_BUG("fp32 kernel: no fp32 copy for a bf16 operand (%lld elements, room for %lld)",
		       (long long)n, (long long)k->cap);
	if (k->src != x.h || k->n != n) {
		st_bf16_to_f32_array(k->buf, x.h, n);
		k->src = x.h;
		k->n = n;
	}
	return k->buf;
}

/* The bf16 second operand of a bf16 product: its bf16 values, or for a
 * weight its resident bf16 copy, or one made now in acts' weight buffer. */
static const uint16_t *bf16_second(st_llama *m, opnd B, char tb, int64_t N, int64_t K, int64_t ldb)
{
	if (B.h)
		return B.h;
	if (m->wbf16 && B.f >= m->params && B.f < m->params + m->nparams)
		return m->wbf16 + (B.f - m->params); /* a resident weight: its bf16 copy */
	st_llama_acts *a = m->acts;
	int64_t nb = (tb == 'N' ? K : N) * ldb;
	if (nb > a->wtmp_elems)
		ST_BUG("bf16 weight copy too small: %lld > %lld", (long long)nb, (long long)a->wtmp_elems);
	st_f32_to_bf16_array(a->wtmp, B.f, nb);
	return a->wtmp;
}

/*
 * Every matrix product of the model. In bf16 mode (dtype=bfloat16) both
 * operands are bf16 and the product accumulates in fp32 (MaxText's bf16
 * compute with fp32 weights); A must already be bf16, B may be a weight,
 * whose bf16 copy is the resident one (st_llama_weights_changed) or made
 * here. Else plain fp32. R: C = R + A B (a residual add, gemm.h's _res
 * forms; beta unused), else NULL.
 */
static int mm_r(st_llama *m, int site, char ta, char tb, int64_t M, int64_t N, int64_t K, opnd A,
		int64_t lda, opnd B, int64_t ldb, float beta, const float *R, float *C, int64_t ldc)
{
	const float *af = A.f, *bf = B.f;
	if (m->bf16 && m->kplan.f32[site]) { /* bf16 mode, the fp32 kernel (kplan.h) */
		st_llama_acts *a = m->acts;
		af = f32_operand(A, &a->ka, ta == 'N' ? M : K, lda);
		bf = f32_operand(B, &a->kb, tb == 'N' ? K : N, ldb);
	} else if (m->bf16) {
		if (!A.h)
			ST_BUG("bf16 product without a bf16 first operand");
		const uint16_t *bh = bf16_second(m, B, tb, N, K, ldb);
		return R ? st_gemm_bf16_res(ta, tb, M, N, K, A.h, lda, bh, ldb, R, C, ldc, &m->acts->kc)
			 : st_gemm_bf16(ta, tb, M, N, K, 1.0f, A.h, lda, bh, ldb, beta, C, ldc,
					&m->acts->kc);
	} else if (!af || !bf)
		ST_BUG("fp32 product without fp32 operands");
	return R ? st_gemm_res(ta, tb, M, N, K, af, lda, bf, ldb, R, C, ldc, &m->acts->kc)
		 : st_gemm(ta, tb, M, N, K, 1.0f, af, lda, bf, ldb, beta, C, ldc, &m->acts->kc);
}

static int mm(st_llama *m, int site, char ta, char tb, int64_t M, int64_t N, int64_t K, opnd A,
	      int64_t lda, opnd B, int64_t ldb, float beta, float *C, int64_t ldc)
{
	return mm_r(m, site, ta, tb, M, N, K, A, lda, B, ldb, beta, NULL, C, ldc);
}

/* A bf16 product's output rounded to bf16 by the product itself (in place
 * of an fp32 output rounded by st_bf16_round_keep), for a site on the bf16
 * kernel: C16 = A B^T, B a weight (N, K). */
static int mm_out16(st_llama *m, int64_t M, int64_t N, int64_t K, opnd A, const float *W,
		    uint16_t *C16)
{
	if (!A.h)
		ST_BUG("bf16 product without a bf16 first operand");
	return st_gemm_bf16_out('N', 'T', M, N, K, 1.0f, A.h, K, bf16_second(m, OPF(W), 'T', N, K, K),
				K, 0, C16, N, &m->acts->kc);
}

/* out(N,E) = res + a(N,k) W^T, W (E,k): a residual add of a row-parallel
 * product. Under tensor parallelism each process holds k/tp of the inner
 * dimension, so the partial products are summed over the group first. */
static int residual_product(st_llama *m, int site, float *out, const float *res, opnd a,
			    const float *W, int64_t k)
{
	st_llama_acts *ac = m->acts;
	int64_t N = ac->N, E = m->s.E;
	if (!m->tp_comm)
		return mm_r(m, site, 'N', 'T', N, E, k, a, k, OPF(W), k, 1, res, out, E);
	TRY(mm(m, site, 'N', 'T', N, E, k, a, k, OPF(W), k, 0, ac->tp_tmp, E));
	TRY(tp_sum(m, ac->tp_tmp, N * E));
#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < N * E; i++)
		out[i] = res[i] + ac->tp_tmp[i];
	return 0;
}

/* RMSNorm forward into h (fp32 mode) or hb (bf16 mode). f32_next: in bf16
 * mode an fp32 kernel's product reads hb next as its first operand; its
 * fp32 values are then made in the same pass, as that operand's copy
 * (f32_operand finds them there). */
static void norm_forward(const st_llama *m, float *h, uint16_t *hb, float *rstd, const float *x,
			 const float *w, int f32_next)
{
	st_llama_acts *a = m->acts;
	int64_t n = a->N * m->s.E;
	if (m->bf16 && f32_next && a->ka.buf && a->ka.cap >= n) {
		st_rmsnorm_forward_keep(hb, a->ka.buf, rstd, x, w, a->N, m->s.E, m->s.eps);
		bf16_written(m);
		a->ka.src = hb;
		a->ka.n = n;
	} else if (m->bf16) {
		st_rmsnorm_forward_bf16(hb, rstd, x, w, a->N, m->s.E, m->s.eps);
		bf16_written(m);
	} else
		st_rmsnorm_forward(h, rstd, x, w, a->N, m->s.E, m->s.eps);
}

/* The residual stream at layer l's input (l = L: the final norm's input) in
 * fp32: the kept buffer, or in bf16 mode its values converted into a->xin. */
static const float *stream_in(const st_llama *m, int64_t l)
{
	st_llama_acts *a = m->acts;
	if (!m->bf16)
		return a->xs[l];
	st_bf16_to_f32_array(a->xin, a->xsb[l], a->N * m->s.E);
	return a->xin;
}

/* Where layer l-1 (or the embedding, l = 0) writes its fp32 output, and
 * stream_keep(m, l) after it: in bf16 mode the output is kept rounded. */
static float *stream_out(const st_llama *m, int64_t l)
{
	return m->bf16 ? m->acts->xout : m->acts->xs[l];
}

static void stream_keep(const st_llama *m, int64_t l)
{
	if (m->bf16)
		st_f32_to_bf16_array(m->acts->xsb[l], m->acts->xout, m->acts->N * m->s.E);
}

/* The fp32 values of the intermediates a layer keeps in bf16 in bf16 mode
 * (the acts' shared fp32 copies), or the kept fp32 buffers themselves. */
typedef struct kept_f32 {
	float *q, *k, *v, *ctx, *xmid, *gate, *up;
} kept_f32;

static kept_f32 kept_views(const st_llama *m, const layer_acts *A)
{
	const st_llama_acts *a = m->acts;
	if (!m->bf16)
		return (kept_f32){A->q, A->k, A->v, A->ctx, A->xmid, A->gate, A->up};
	return (kept_f32){a->q32, a->k32, a->v32, a->ctx32, a->xmid32, a->gate32, a->up32};
}

/* The SwiGLU output as the operand of site (down or w_down): in bf16 mode
 * on the fp32 kernel, its exact fp32 values in dm1, which is free while
 * either product runs (phase_layout: over the forward's used-up gate and
 * up; in the backward, before d_down fills it), in place of a kernel copy
 * buffer as large. */
static opnd act_operand(const st_llama *m, const layer_acts *A, int site)
{
	opnd act = OPA(A, act);
	if (m->bf16 && on_f32(m, site)) {
		st_bf16_to_f32_array(m->acts->dm1, A->actb, m->acts->N * m->ls.M);
		act.f = m->acts->dm1;
	}
	return act;
}

/* One layer on input x (stream_in). do_mm: run the matrix products (else q,
 * k, v, xmid, gate, up are already there, kept by the remat policy). out:
 * write the layer output. */
static int layer_forward(st_llama *m, int64_t l, const layer_acts *A, const float *x, int do_mm,
			 float *out)
{
	const st_llama_shape *s = &m->ls;
	st_llama_acts *a = m->acts;
	const st_layer_view *w = &m->p.layers[l];
	int64_t N = a->N, E = s->E, HD = s->H * s->D, KD = s->K * s->D, M = s->M;
	opnd h1 = OPA(A, h1), h2 = OPA(A, h2);

	/* in bf16 mode q, k, v, ctx, xmid, gate and up are kept rounded to bf16
	 * (st_bf16_round_keep: the bits kept, the rounded values in use), and
	 * forward and backward alike use the rounded values (kv: their fp32 copies) */
	kept_f32 kv = kept_views(m, A);
	norm_forward(m, A->h1, A->h1b, A->rstd1, x, w->ln1,
		     do_mm && (on_f32(m, ST_KS_Q) || on_f32(m, ST_KS_KV)));
	if (do_mm) {
		TRY(mm(m, ST_KS_Q, 'N', 'T', N, HD, E, h1, E, OPF(w->wq), E, 0, kv.q, HD));
		TRY(mm(m, ST_KS_KV, 'N', 'T', N, KD, E, h1, E, OPF(w->wk), E, 0, kv.k, KD));
		TRY(mm(m, ST_KS_KV, 'N', 'T', N, KD, E, h1, E, OPF(w->wv), E, 0, kv.v, KD));
		st_rope_forward(kv.q, a->cos_t, a->sin_t, a->B, a->T, s->H, s->D);
		st_rope_forward(kv.k, a->cos_t, a->sin_t, a->B, a->T, s->K, s->D);
		if (m->bf16 && attn_reads_f32(m)) { /* the rounded values in fp32 too */
			st_bf16_round_keep(A->qb, kv.q, N * HD);
			st_bf16_round_keep(A->kb, kv.k, N * KD);
			st_bf16_round_keep(A->vb, kv.v, N * KD);
		} else if (m->bf16) {
			st_f32_to_bf16_array(A->qb, kv.q, N * HD);
			st_f32_to_bf16_array(A->kb, kv.k, N * KD);
			st_f32_to_bf16_array(A->vb, kv.v, N * KD);
		}
	} else if (m->bf16 && attn_reads_f32(m)) { /* kept: their fp32 values */
		st_bf16_to_f32_array(kv.q, A->qb, N * HD);
		st_bf16_to_f32_array(kv.k, A->kb, N * KD);
		st_bf16_to_f32_array(kv.v, A->vb, N * KD);
	}
	if (on_f32(m, ST_KS_ATTN))
		TRY(st_attention_forward(kv.ctx, A->lse, kv.q, kv.k, kv.v, a->B, a->T, s->H, s->K, s->D,
					 &a->ws));
	else
		TRY(st_attention_forward_bf16(kv.ctx, A->lse, A->qb, A->kb, A->vb, a->B, a->T, s->H, s->K,
					      s->D, &a->ws));
	if (m->bf16) {
		st_bf16_round_keep(A->ctxb, kv.ctx, N * HD);
		bf16_written(m);
	}
	opnd ctx = {.f = kv.ctx, .h = A->ctxb};
	if (do_mm) {
		TRY(residual_product(m, ST_KS_O, kv.xmid, x, ctx, w->wo, HD));
		if (m->bf16)
			st_bf16_round_keep(A->xmidb, kv.xmid, N * E);
	} else if (m->bf16) {
		st_bf16_to_f32_array(kv.xmid, A->xmidb, N * E);
	}
	norm_forward(m, A->h2, A->h2b, A->rstd2, kv.xmid, w->ln2, do_mm && on_f32(m, ST_KS_GATE_UP));
	/* in bf16 mode gate and up are kept in bf16 only: made so by the bf16
	 * kernel's product itself, or by rounding the fp32 kernel's output as
	 * the SwiGLU reads it; the SwiGLU uses them in bf16 (kv.gate, kv.up are
	 * scratch). For a down product on the fp32 kernel, the rounding SwiGLU
	 * also writes act's fp32 values over kv.gate, which is dm1
	 * (act_operand) */
	opnd act = OPA(A, act);
	if (do_mm && m->bf16 && !on_f32(m, ST_KS_GATE_UP)) {
		TRY(mm_out16(m, N, M, E, h2, w->wg, A->gateb));
		TRY(mm_out16(m, N, M, E, h2, w->wu, A->upb));
	} else if (do_mm) {
		TRY(mm(m, ST_KS_GATE_UP, 'N', 'T', N, M, E, h2, E, OPF(w->wg), E, 0, kv.gate, M));
		TRY(mm(m, ST_KS_GATE_UP, 'N', 'T', N, M, E, h2, E, OPF(w->wu), E, 0, kv.up, M));
	}
	if (m->bf16 && do_mm && on_f32(m, ST_KS_GATE_UP)) {
		float *act32 = NULL; /* act's fp32 values for the down product */
		if (out && on_f32(m, ST_KS_DOWN)) {
			if (kv.gate != a->dm1)
				ST_BUG("act's fp32 copy (dm1) is not over the fp32 gate");
			act.f = act32 = a->dm1;
		}
		st_swiglu_forward_keep(A->actb, act32, A->gateb, A->upb, kv.gate, kv.up, N * M);
		bf16_written(m);
	} else if (m->bf16) {
		st_swiglu_forward_gu16(A->actb, A->gateb, A->upb, N * M);
		bf16_written(m);
		if (out)
			act = act_operand(m, A, ST_KS_DOWN);
	} else
		st_swiglu_forward(A->act, kv.gate, kv.up, N * M);
	if (out)
		TRY(residual_product(m, ST_KS_DOWN, out, kv.xmid, act, w->wd, M));
	return 0;
}

/* The gate and up projections' gradient products from dgate, dup (N, M),
 * leading dimension ld: those on the fp32 kernel (f32 1) or those on the
 * bf16 one (0). dh (N, E) is written, the weight gradients accumulated. */
static int gate_up_grads(st_llama *m, int f32, opnd dgate, opnd dup, int64_t ld, opnd h2,
			 const st_layer_view *w, const st_layer_view *g)
{
	st_llama_acts *a = m->acts;
	int64_t N = a->N, E = m->ls.E, M = m->ls.M;
	if (on_f32(m, ST_KS_D_GATE_UP) == f32) {
		TRY(mm(m, ST_KS_D_GATE_UP, 'N', 'N', N, E, M, dgate, ld, OPF(w->wg), E, 0, a->dh, E));
		TRY(mm(m, ST_KS_D_GATE_UP, 'N', 'N', N, E, M, dup, ld, OPF(w->wu), E, 1, a->dh, E));
	}
	if (on_f32(m, ST_KS_W_GATE_UP) == f32) {
		TRY(mm(m, ST_KS_W_GATE_UP, 'T', 'N', M, E, N, dgate, ld, h2, E, gbeta(m), g->wg, E));
		TRY(mm(m, ST_KS_W_GATE_UP, 'T', 'N', M, E, N, dup, ld, h2, E, gbeta(m), g->wu, E));
	}
	return 0;
}

/* a->dx holds d/d(layer output) on entry and d/d(layer input) x on return. */
static int layer_backward(st_llama *m, int64_t l, const layer_acts *A, const float *x)
{
	const st_llama_shape *s = &m->ls;
	st_llama_acts *a = m->acts;
	const st_layer_view *w = &m->p.layers[l];
	const st_layer_view *g = &m->g.layers[l];
	int64_t N = a->N, E = s->E, HD = s->H * s->D, KD = s->K * s->D, M = s->M;
	float *dx = a->dx;
	opnd h1 = OPA(A, h1), h2 = OPA(A, h2);

	/* MLP: out = xmid + down(swiglu(gate(h2), up(h2))); the weight
	 * gradient first, as act's fp32 copy may be in dm1 */
	opnd dxo = grad_op(m, dx, a->dxb, N * E, ST_KS_D_DOWN, ST_KS_W_DOWN);
	TRY(mm(m, ST_KS_W_DOWN, 'T', 'N', E, M, N, dxo, E, act_operand(m, A, ST_KS_W_DOWN), M, gbeta(m),
	       g->wd, M));
	TRY(mm(m, ST_KS_D_DOWN, 'N', 'N', N, M, E, dxo, E, OPF(w->wd), M, 0, a->dm1, M));
	/* the kept intermediates (bf16 mode: their fp32 values, already there
	 * when the forward pass was just recomputed) */
	kept_f32 kv = kept_views(m, A);
	if (m->bf16 && a->policy == ST_REMAT_NONE) {
		if (on_f32(m, ST_KS_D_ATTN)) { /* the bf16 attention reads the bf16 copies */
			st_bf16_to_f32_array(kv.q, A->qb, N * HD);
			st_bf16_to_f32_array(kv.k, A->kb, N * KD);
			st_bf16_to_f32_array(kv.v, A->vb, N * KD);
		}
		st_bf16_to_f32_array(kv.ctx, A->ctxb, N * HD);
		st_bf16_to_f32_array(kv.xmid, A->xmidb, N * E);
	}
	/* in bf16 mode the SwiGLU backward reads the kept bf16 gate and up (their
	 * fp32 copies lie under dm1 by now: phase_layout) */
	int fd = on_f32(m, ST_KS_D_GATE_UP), fw = on_f32(m, ST_KS_W_GATE_UP);
	if (!m->bf16) {
		st_swiglu_backward(a->dm2, a->dm1, a->dm1, kv.gate, kv.up, N * M);
		TRY(gate_up_grads(m, 1, OPF(a->dm2), OPF(a->dm1), M, h2, w, g));
	} else if (fd || fw) {
		/* fp32 gradients for the fp32 kernel's products; then, for a bf16
		 * one, rounded in place (each row over the first half of its own
		 * storage: ld 2M) */
		st_swiglu_backward_gu16(a->dm2, a->dm1, a->dm1, A->gateb, A->upb, N * M);
		TRY(gate_up_grads(m, 1, OPF(a->dm2), OPF(a->dm1), M, h2, w, g));
		if (!fd || !fw) {
			opnd dg = {.h = st_bf16_rows_in_place(a->dm2, N, M)};
			opnd du = {.h = st_bf16_rows_in_place(a->dm1, N, M)};
			bf16_written(m);
			TRY(gate_up_grads(m, 0, dg, du, 2 * M, h2, w, g));
		}
	} else {
		st_swiglu_backward_bf16(a->dm2b, a->dm1b, a->dm1, A->gateb, A->upb, N * M);
		bf16_written(m);
		TRY(gate_up_grads(m, 0, (opnd){.h = a->dm2b}, (opnd){.h = a->dm1b}, M, h2, w, g));
	}
	TRY(tp_sum(m, a->dh, N * E));
	gclear(m, g->ln2, E);
	TRY(st_rmsnorm_backward(dx, g->ln2, a->dh, kv.xmid, w->ln2, A->rstd2, N, E, &a->ws));

	/* attention: xmid = x + o(attn(rope(q(h1)), rope(k(h1)), v(h1))) */
	dxo = grad_op(m, dx, a->dxb, N * E, ST_KS_D_O, ST_KS_W_O);
	TRY(mm(m, ST_KS_D_O, 'N', 'N', N, HD, E, dxo, E, OPF(w->wo), HD, 0, a->dctx, HD));
	TRY(mm(m, ST_KS_W_O, 'T', 'N', E, HD, N, dxo, E, (opnd){.f = kv.ctx, .h = A->ctxb}, HD, gbeta(m),
	       g->wo, HD));
	if (on_f32(m, ST_KS_D_ATTN))
		TRY(st_attention_backward(a->dq, a->dk, a->dv, a->dctx, kv.ctx, A->lse, kv.q, kv.k, kv.v,
					  a->B, a->T, s->H, s->K, s->D, &a->ws));
	else
		TRY(st_attention_backward_bf16(a->dq, a->dk, a->dv, a->dctx, kv.ctx, A->lse, A->qb, A->kb,
					       A->vb, a->B, a->T, s->H, s->K, s->D, &a->ws));
	st_rope_backward(a->dq, a->cos_t, a->sin_t, a->B, a->T, s->H, s->D);
	st_rope_backward(a->dk, a->cos_t, a->sin_t, a->B, a->T, s->K, s->D);
	opnd dq = grad_op(m, a->dq, a->dqb, N * HD, ST_KS_D_Q, ST_KS_W_Q);
	opnd dk = grad_op(m, a->dk, a->dkb, N * KD, ST_KS_D_KV, ST_KS_W_KV);
	opnd dv = grad_op(m, a->dv, a->dvb, N * KD, ST_KS_D_KV, ST_KS_W_KV);
	TRY(mm(m, ST_KS_D_Q, 'N', 'N', N, E, HD, dq, HD, OPF(w->wq), E, 0, a->dh, E));
	TRY(mm(m, ST_KS_D_KV, 'N', 'N', N, E, KD, dk, KD, OPF(w->wk), E, 1, a->dh, E));
	TRY(mm(m, ST_KS_D_KV, 'N', 'N', N, E, KD, dv, KD, OPF(w->wv), E, 1, a->dh, E));
	TRY(mm(m, ST_KS_W_Q, 'T', 'N', HD, E, N, dq, HD, h1, E, gbeta(m), g->wq, E));
	TRY(mm(m, ST_KS_W_KV, 'T', 'N', KD, E, N, dk, KD, h1, E, gbeta(m), g->wk, E));
	TRY(mm(m, ST_KS_W_KV, 'T', 'N', KD, E, N, dv, KD, h1, E, gbeta(m), g->wv, E));
	TRY(tp_sum(m, a->dh, N * E));
	gclear(m, g->ln1, E);
	TRY(st_rmsnorm_backward(dx, g->ln1, a->dh, x, w->ln1, A->rstd1, N, E, &a->ws));
	return 0;
}

/* The output layer's gradient products for a chunk of nr rows (x: its
 * inputs) from dl (nr, Vl) with leading dimension ld: those on the fp32
 * kernel (f32 1) or those on the bf16 one (0). dx (nr, E) is written, dW
 * accumulated. */
static int logits_grads(st_llama *m, int f32, opnd dl, int64_t ld, opnd x, int64_t nr, float *dx,
			float *dW, float *wbeta)
{
	int64_t E = m->s.E, Vl = m->ls.V;
	if (on_f32(m, ST_KS_D_LOGITS) == f32)
		TRY(mm(m, ST_KS_D_LOGITS, 'N', 'N', nr, E, Vl, dl, ld, OPF(m->p.lm_head), E, 0, dx, E));
	if (on_f32(m, ST_KS_W_LOGITS) == f32) {
		TRY(mm(m, ST_KS_W_LOGITS, 'T', 'N', Vl, E, nr, dl, ld, x, E, *wbeta, dW, E));
		*wbeta = 1.0f; /* the later chunks add */
	}
	return 0;
}

/*
 * Output layer and cross-entropy over a vocabulary split (tensor parallelism;
 * or the whole vocabulary in bf16 mode, where the products go through mm):
 * this process holds rows [v0, v0+Vl) of lm_head. Per chunk of rows: local logits, the row max
 * and the sum of exponentials combined over the group, the target's logit
 * from the process that holds it. dx (N,E) = summed partial products;
 * dW += local. Same contract as st_lm_head_xent (dx NULL: loss only).
 *
 * In bf16 mode the logits are bf16 (as MaxText's and PyTorch autocast's:
 * the product's fp32 sums rounded once): with the three products on the
 * bf16 kernel, the logits product writes them in bf16 (a chunk of R rows),
 * the softmax reads them and the gradient is written over them; with any of
 * them on the fp32 kernel, the fp32 logits (R / 2 rows at a time, the same
 * bytes) are rounded to bf16's values and go the fp32 way.
 */
static int lm_head_xent_split(st_llama *m, double *loss_sum, float *dx, float *dW, float scale)
{
	st_llama_acts *a = m->acts;
	int64_t N = a->N, E = m->s.E, Vl = m->ls.V, v0 = Vl * m->tp_rank, R = a->chunk_rows;
	const float *W = m->p.lm_head;
	opnd x = {.f = a->hf, .h = a->hfb};
	float *lmax = a->xr_f, *gmax = lmax + R, *tlog = gmax + R, *rscale = tlog + R;
	double *rsum = a->xr_d, total = 0;
	float wbeta = gbeta(m);
	int fl = on_f32(m, ST_KS_LOGITS), fd = on_f32(m, ST_KS_D_LOGITS), fw = on_f32(m, ST_KS_W_LOGITS);
	int all16 = m->bf16 && !fl && !fd && !fw;
	int64_t step = m->bf16 && !all16 ? (R / 2 > 0 ? R / 2 : 1) : R;
	for (int64_t r0 = 0; r0 < N; r0 += step) {
		int64_t nr = N - r0 < step ? N - r0 : step;
		float *l = a->xent;
		uint16_t *l16 = (uint16_t *)a->xent;
		if (all16) {
			TRY(mm_out16(m, nr, Vl, E, op_at(x, r0 * E), W, l16));
			st_xent_rows_exp16(l16, Vl, lmax, rsum, tlog, a->targets + r0, v0, nr, Vl);
		} else {
			TRY(mm(m, ST_KS_LOGITS, 'N', 'T', nr, Vl, E, op_at(x, r0 * E), E, OPF(W), E, 0, l,
			       Vl));
			if (m->bf16)
				st_bf16_round_values(l, nr * Vl);
			st_xent_rows_exp(l, lmax, rsum, tlog, a->targets + r0, v0, nr, Vl);
		}
		memcpy(gmax, lmax, (size_t)nr * sizeof(float));
		if (m->tp_comm)
			TRY(st_comm_allreduce(m->tp_comm, gmax, nr, ST_DTYPE_F32, ST_MAX));
		for (int64_t r = 0; r < nr; r++)
			rsum[r] *= exp((double)lmax[r] - (double)gmax[r]);
		if (m->tp_comm) {
			TRY(st_comm_allreduce(m->tp_comm, rsum, nr, ST_DTYPE_F64, ST_SUM));
			TRY(st_comm_allreduce(m->tp_comm, tlog, nr, ST_DTYPE_F32, ST_SUM)); /* one holder each */
		}
		for (int64_t r = 0; r < nr; r++)
			total += (double)gmax[r] + log(rsum[r]) - (double)tlog[r];
		if (!dx)
			continue;
		for (int64_t r = 0; r < nr; r++)
			rscale[r] = (float)(scale * exp((double)lmax[r] - (double)gmax[r]) / rsum[r]);
		if (all16) {
			st_xent_rows_grad16(l16, Vl, lmax, rscale, a->targets + r0, v0, nr, Vl, scale);
			bf16_written(m);
			TRY(logits_grads(m, 0, (opnd){.h = l16}, Vl, op_at(x, r0 * E), nr, dx + r0 * E, dW,
					 &wbeta));
			continue;
		}
		/* the gradient over the logits, in fp32 when an fp32 kernel reads
		 * it; then, for a bf16 one, rounded in place (each row over the
		 * first half of its own storage: ld 2 Vl) */
		if (fd || fw) {
			st_xent_rows_grad(l, rscale, a->targets + r0, v0, nr, Vl, scale);
			TRY(logits_grads(m, 1, OPF(l), Vl, op_at(x, r0 * E), nr, dx + r0 * E, dW,
					 &wbeta));
			if (!fd || !fw)
				st_bf16_rows_in_place(l, nr, Vl);
		} else {
			st_xent_rows_grad_bf16(l16, 2 * Vl, l, rscale, a->targets + r0, v0, nr, Vl, scale);
		}
		if (!fd || !fw) {
			bf16_written(m);
			TRY(logits_grads(m, 0, (opnd){.h = l16}, 2 * Vl, op_at(x, r0 * E), nr, dx + r0 * E,
					 dW, &wbeta));
		}
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
				       a->chunk_rows, &a->xent_ws, &a->kc);
	gclear(m, m->g.lm_head, m->ls.V * m->s.E); /* st_lm_head_xent adds */
	return st_lm_head_xent(loss_sum, dx, m->g.lm_head, a->hf, m->p.lm_head, a->targets, a->N,
			       m->s.E, m->s.V, scale, a->chunk_rows, &a->xent_ws, &a->kc);
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
	if (m->hooks && m->hooks->embed_forward) {
		TRY(m->hooks->embed_forward(m->hooks->ctx, m, a->inputs, a->N, stream_out(m, 0)));
	} else {
		TRY(acquire(m, 0, 0));
		st_embedding_forward(stream_out(m, 0), m->p.embed, a->inputs, a->N, m->s.E);
	}
	stream_keep(m, 0);
	for (int l = 0; l < L; l++) {
		TRY(acquire(m, l + 1, 0));
		TRY(layer_forward(m, l, &a->layer[l], stream_in(m, l), 1, stream_out(m, l + 1)));
		stream_keep(m, l + 1);
	}
	TRY(acquire(m, L + 1, 0));
	norm_forward(m, a->hf, a->hfb, a->rstdf, stream_in(m, L), m->p.norm, 0);
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
	gclear(m, m->g.norm, E);
	TRY(st_rmsnorm_backward(a->dx, m->g.norm, a->dh, stream_in(m, L), m->p.norm, a->rstdf, N, E,
				&a->ws));
	TRY(grads_ready(m, L + 1));

	for (int l = L - 1; l >= 0; l--) {
		const layer_acts *A = &a->layer[l];
		TRY(acquire(m, l + 1, 1));
		const float *x = stream_in(m, l);
		if (a->policy != ST_REMAT_NONE) /* minimal: the products' outputs are kept */
			TRY(layer_forward(m, l, A, x, a->policy == ST_REMAT_FULL, NULL));
		TRY(layer_backward(m, l, A, x));
		TRY(grads_ready(m, l + 1));
	}
	if (m->hooks && m->hooks->embed_backward)
		return m->hooks->embed_backward(m->hooks->ctx, m, a->inputs, N, a->dx);
	TRY(acquire(m, 0, 1));
	gclear(m, m->g.embed, m->s.V * E);
	st_embedding_backward(m->g.embed, a->dx, a->inputs, N, E);
	m->gfresh = 0;
	return grads_ready(m, 0);
}

int st_llama_bf16_weights(st_llama *m, uint16_t **out)
{
	*out = NULL;
	if (!m->bf16 || !m->params || !st_kplan_bf16_weights(&m->kplan))
		return 0;
	if (!m->wbf16 && !(m->wbf16 = st_pages_alloc((size_t)m->nparams * sizeof(uint16_t))))
		return st_fail(ST_ENOMEM, "out of memory for the bf16 weight copy");
	*out = m->wbf16;
	return 0;
}

int st_llama_weights_changed(st_llama *m)
{
	uint16_t *wb;
	int rc = st_llama_bf16_weights(m, &wb);
	if (rc == 0 && wb)
		st_f32_to_bf16_array(wb, m->params, m->nparams);
	return rc;
}

void st_llama_kernel_shape(const st_llama *m, int64_t B, int64_t T, st_kshape *out)
{
	const st_llama_shape *s = &m->ls;
	*out = (st_kshape){.B = B, .T = T, .E = s->E, .H = s->H, .K = s->K, .D = s->D, .M = s->M,
			   .V = s->V, .R = xent_chunk_rows(s->V, B * T, m->bf16 ? 2 : 4),
			   .resident = m->params != NULL};
}

int st_llama_set_kernels(st_llama *m, const st_kplan *p)
{
	if (!m->bf16)
		return 0;
	int changed = memcmp(&m->kplan, p, sizeof(*p)) != 0;
	m->kplan = *p;
	st_llama_acts *a = m->acts;
	if (a && changed) { /* the layout follows the plan (fp32 operand copies, fp32 SwiGLU gradients) */
		int rc = st_llama_alloc_acts(m, a->B, a->T, a->policy);
		if (rc < 0)
			return rc;
	}
	if (!st_kplan_bf16_weights(p)) { /* no product reads the weights' bf16 copy */
		st_pages_free(m->wbf16, (size_t)m->nparams * sizeof(uint16_t));
		m->wbf16 = NULL;
		return 0;
	}
	return m->wbf16 || !m->params ? 0 : st_llama_weights_changed(m);
}

void st_llama_release(st_llama *m)
{
	st_pages_free(m->wbf16, (size_t)m->nparams * sizeof(uint16_t));
	acts_free(m->acts);
	st_pages_free(m->params, (size_t)m->nparams * sizeof(float));
	st_pages_free(m->grads, (size_t)m->nparams * sizeof(float));
	free(m->tensors);
	free(m->p.layers);
	free(m->g.layers);
	memset(m, 0, sizeof(*m));
}
