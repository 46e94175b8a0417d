#include "shard/fsdp.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

/* ---- ZeRO-3 ---- */

struct st_fsdp {
	st_shard *s;
	st_llama *m;
	const st_par *p;
	int F, L;
	float *slot[4];      /* 0, 1: layers (alternating); 2: embedding; 3: output layer */
	int slot_unit[4];    /* unit held, -1 if none or stale */
	float *gslot;        /* one unit's gradients (layers and the final unit) */
	float *rs;           /* one tensor's reduce-scattered gradient */
	/* the embedding, sharded by vocabulary rows and never gathered: every
	 * member looks up its rows for the whole fsdp group's tokens */
	int shard_embed;     /* st_fsdp_shards_embedding: else gathered like the other units */
	int64_t ntok;        /* tokens per micro-batch of one member */
	int64_t *tok_all;    /* the group's tokens (F x ntok) */
	float *emb_all;      /* (F x ntok, E): partial embeddings, or the group's dx */
	int64_t *counts;     /* F entries: per-member counts of a collective */
	int64_t bytes;
	st_llama_hooks hooks;
	/* the prefetch thread */
	pthread_t thread;
	int have_thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int req_unit;        /* unit requested, -1 if none */
	int busy;            /* a gather is running or requested */
	int quit;
	int err;             /* error of the last prefetch */
	char errmsg[512];
};

static int slot_of(const st_fsdp *f, int u)
{
	return u == 0 ? 2 : u == f->L + 1 ? 3 : u % 2;
}

/* All-gather unit u's weights into its slot over communicator c. */
static int gather_unit(st_fsdp *f, int u, st_comm *c)
{
	int t0, nt;
	st_llama_unit(f->m, u, &t0, &nt);
	float *dst = f->slot[slot_of(f, u)];
	int64_t base = f->m->tensors[t0].offset;
	for (int i = t0; i < t0 + nt; i++) {
		int rc = st_comm_allgather(c, f->s->p + f->s->off[i], dst + (f->m->tensors[i].offset - base),
					   f->s->counts + (int64_t)i * f->F, ST_DTYPE_F32);
		if (rc < 0)
			return rc;
	}
	return 0;
}

static void *prefetch_main(void *arg)
{
	st_fsdp *f = arg;
	pthread_mutex_lock(&f->mu);
	for (;;) {
		while (!f->quit && f->req_unit < 0)
			pthread_cond_wait(&f->cv, &f->mu);
		if (f->quit)
			break;
		int u = f->req_unit;
		pthread_mutex_unlock(&f->mu);
		int rc = gather_unit(f, u, f->p->fsdp_prefetch);
		pthread_mutex_lock(&f->mu);
		if (rc < 0) {
			f->err = rc;
			snprintf(f->errmsg, sizeof(f->errmsg), "%s", st_errmsg());
		} else {
			f->slot_unit[slot_of(f, u)] = u;
		}
		f->req_unit = -1;
		f->busy = 0;
		pthread_cond_broadcast(&f->cv);
	}
	pthread_mutex_unlock(&f->mu);
	return NULL;
}

/* Wait for the prefetch in flight; report its error. */
static int prefetch_wait(st_fsdp *f)
{
	pthread_mutex_lock(&f->mu);
	while (f->busy)
		pthread_cond_wait(&f->cv, &f->mu);
	int rc = f->err;
	f->err = 0;
	pthread_mutex_unlock(&f->mu);
	if (rc < 0)
		return st_fail(rc, "%s", f->errmsg);
	return 0;
}

static void prefetch_start(st_fsdp *f, int u)
{
	if (u < 1 || u > f->L + 1 || f->slot_unit[slot_of(f, u)] == u)
		return;
	pthread_mutex_lock(&f->mu);
	f->slot_unit[slot_of(f, u)] = -1;
	f->req_unit = u;
	f->busy = 1;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
}

static int fsdp_acquire(void *ctx, st_llama *m, int u, int for_backward)
{
	st_fsdp *f = ctx;
	int rc;
	/* the embedding's backward needs its gradient space, not its weights */
	if (!(u == 0 && for_backward)) {
		int k = slot_of(f, u);
		if ((rc = prefetch_wait(f)) < 0)
			return rc;
		if (f->slot_unit[k] != u) {
			if ((rc = gather_unit(f, u, f->p->fsdp)) < 0)
				return rc;
			f->slot_unit[k] = u;
		}
		st_llama_bind_unit(m, u, f->slot[k], NULL);
		prefetch_start(f, for_backward ? u - 1 : u + 1);
	}
	if (for_backward) {
		memset(f->gslot, 0, (size_t)st_llama_unit_numel(m, u) * sizeof(float));
		st_llama_bind_unit(m, u, NULL, f->gslot);
	}
	return 0;
}

/* Embedding forward over a vocabulary-sharded table: gather the group's
 * tokens, look up the rows this member holds for all of them (zero rows for
 * the others), and reduce-scatter: member r receives its tokens' rows, each
 * the one nonzero term of its sum, so the result is exact. */
static int fsdp_embed_forward(void *ctx, st_llama *m, const int32_t *tokens, int64_t n, float *x)
{
	st_fsdp *f = ctx;
	st_shard *s = f->s;
	int64_t E = m->s.E, r0 = s->row0[0], nr = s->rows[0], *counts = f->counts;
	if (n != f->ntok)
		ST_BUG("fsdp embedding: %lld tokens per micro-batch, set up for %lld", (long long)n,
		       (long long)f->ntok);
	int64_t *mine = f->tok_all + (int64_t)f->p->coord[ST_AXIS_FSDP] * n;
	for (int64_t t = 0; t < n; t++)
		mine[t] = tokens[t];
	for (int j = 0; j < f->F; j++)
		counts[j] = n;
	int rc = st_comm_allgather(f->p->fsdp, mine, f->tok_all, counts, ST_DTYPE_I64);
	if (rc < 0)
		return rc;
	const float *rows = s->p + s->off[0];
#pragma omp parallel for schedule(static)
	for (int64_t t = 0; t < f->F * n; t++) {
		int64_t v = f->tok_all[t] - r0;
		if (v >= 0 && v < nr)
			memcpy(f->emb_all + t * E, rows + v * E, (size_t)E * sizeof(float));
		else
			memset(f->emb_all + t * E, 0, (size_t)E * sizeof(float));
	}
	for (int j = 0; j < f->F; j++)
		counts[j] = n * E;
	return st_comm_reduce_scatter(f->p->fsdp, f->emb_all, x, counts, ST_DTYPE_F32);
}

/* Embedding backward: gather the group's dx; this member adds, in the
 * group's token order, the rows for the tokens it holds into its shard of
 * the gradient. */
static int fsdp_embed_backward(void *ctx, st_llama *m, const int32_t *tokens, int64_t n, const float *dx)
{
	st_fsdp *f = ctx;
	st_shard *s = f->s;
	int64_t E = m->s.E, r0 = s->row0[0], nr = s->rows[0], *counts = f->counts;
	(void)tokens; /* the group's tokens are still in tok_all from the forward pass */
	for (int j = 0; j < f->F; j++)
		counts[j] = n * E;
	int rc = st_comm_allgather(f->p->fsdp, dx, f->emb_all, counts, ST_DTYPE_F32);
	if (rc < 0)
		return rc;
	float *g = s->g + s->off[0];
	/* columns split over threads: each gradient element still adds its terms
	 * in token order */
#pragma omp parallel for schedule(static)
	for (int64_t c0 = 0; c0 < E; c0 += 64) {
		int64_t c1 = c0 + 64 < E ? c0 + 64 : E;
		for (int64_t t = 0; t < f->F * n; t++) {
			int64_t v = f->tok_all[t] - r0;
			if (v < 0 || v >= nr)
				continue;
			const float *d = f->emb_all + t * E;
			float *gr = g + v * E;
			for (int64_t c = c0; c < c1; c++)
				gr[c] += d[c];
		}
	}
	return 0;
}

static int fsdp_grads_ready(void *ctx, st_llama *m, int u)
{
	st_fsdp *f = ctx;
	st_shard *s = f->s;
	int t0, nt;
	st_llama_unit(m, u, &t0, &nt);
	int64_t base = m->tensors[t0].offset;
	for (int i = t0; i < t0 + nt; i++) {
		int rc = st_comm_reduce_scatter(f->p->fsdp, f->gslot + (m->tensors[i].offset - base), f->rs,
						s->counts + (int64_t)i * f->F, ST_DTYPE_F32);
		if (rc < 0)
			return rc;
		float *g = s->g + s->off[i];
		int64_t n = s->rows[i] * s->cols[i];
		for (int64_t j = 0; j < n; j++)
			g[j] += f->rs[j];
	}
	return 0;
}

int st_fsdp_shards_embedding(int64_t F, int64_t ntok, int64_t vocab) { return F * ntok < vocab; }

/* Sizes (elements) of st_fsdp's buffers for model m (its tensor table),
 * fsdp size F and ntok tokens per member: what st_fsdp_create allocates and
 * st_fsdp_bytes_for counts. */
typedef struct fsdp_sizes {
	int shard_embed;
	int64_t slot[4], gslot, rs, tokens; /* tokens: the group's (sharded embedding), 0 if gathered */
} fsdp_sizes;

static fsdp_sizes fsdp_layout(const st_llama *m, int64_t F, int64_t ntok)
{
	fsdp_sizes z = {.shard_embed = st_fsdp_shards_embedding(F, ntok, m->s.V)};
	int L = (int)m->s.L, u0 = z.shard_embed ? 1 : 0; /* a sharded embedding (unit 0) is never gathered */
	int64_t layer = st_llama_unit_numel(m, 1);
	z.slot[0] = z.slot[1] = layer;
	z.slot[2] = z.shard_embed ? 0 : st_llama_unit_numel(m, 0);
	z.slot[3] = st_llama_unit_numel(m, L + 1);
	z.gslot = layer;
	for (int u = u0; u <= L + 1; u++)
		z.gslot = st_llama_unit_numel(m, u) > z.gslot ? st_llama_unit_numel(m, u) : z.gslot;
	for (int i = u0; i < m->ntensors; i++) { /* the largest member's piece of a tensor */
		const st_tensor *t = &m->tensors[i];
		int64_t R = t->shape[0], C = t->ndim == 2 ? t->shape[1] : 1, piece = (R + F - 1) / F * C;
		z.rs = piece > z.rs ? piece : z.rs;
	}
	z.tokens = z.shard_embed ? F * ntok : 0;
	return z;
}

static int64_t fsdp_bytes(const fsdp_sizes *z, int64_t E)
{
	int64_t n = z->gslot + z->rs + z->tokens * E;
	for (int k = 0; k < 4; k++)
		n += z->slot[k];
	return n * (int64_t)sizeof(float) + z->tokens * (int64_t)sizeof(int64_t);
}

int64_t st_fsdp_bytes_for(const st_llama *m, int64_t F, int64_t ntok)
{
	fsdp_sizes z = fsdp_layout(m, F, ntok);
	return fsdp_bytes(&z, m->s.E);
}

/* malloc of n elements of size sz (at least one byte). */
static void *alloc_n(int64_t n, size_t sz) { return malloc(n > 0 ? (size_t)n * sz : 1); }

int st_fsdp_create(st_fsdp **out, st_shard *s, st_llama *m, const st_par *p, int64_t ntok)
{
	st_fsdp *f = calloc(1, sizeof(*f));
	if (!f)
		return st_fail(ST_ENOMEM, "out of memory (fsdp)");
	f->s = s;
	f->m = m;
	f->p = p;
	f->F = (int)p->mesh.size[ST_AXIS_FSDP];
	f->L = (int)m->s.L;
	f->ntok = ntok;
	fsdp_sizes z = fsdp_layout(m, f->F, ntok);
	f->shard_embed = z.shard_embed;
	int ok = 1;
	for (int k = 0; k < 4; k++) {
		ok &= (f->slot[k] = alloc_n(z.slot[k], sizeof(float))) != NULL;
		f->slot_unit[k] = -1;
	}
	ok &= (f->gslot = alloc_n(z.gslot, sizeof(float))) != NULL;
	ok &= (f->rs = alloc_n(z.rs, sizeof(float))) != NULL;
	ok &= (f->tok_all = alloc_n(z.tokens, sizeof(int64_t))) != NULL;
	ok &= (f->emb_all = alloc_n(z.tokens * m->s.E, sizeof(float))) != NULL;
	ok &= (f->counts = alloc_n(f->F, sizeof(int64_t))) != NULL;
	f->bytes = fsdp_bytes(&z, m->s.E);
	f->req_unit = -1;
	pthread_mutex_init(&f->mu, NULL);
	pthread_cond_init(&f->cv, NULL);
	if (!ok || pthread_create(&f->thread, NULL, prefetch_main, f) != 0) {
		st_fsdp_free(f);
		return st_fail(ST_ENOMEM, "cannot set up FSDP buffers or its gather thread");
	}
	f->have_thread = 1;
	f->hooks = (st_llama_hooks){.acquire = fsdp_acquire, .grads_ready = fsdp_grads_ready, .ctx = f};
	if (f->shard_embed) {
		f->hooks.embed_forward = fsdp_embed_forward;
		f->hooks.embed_backward = fsdp_embed_backward;
	}
	m->hooks = &f->hooks;
	*out = f;
	return 0;
}

void st_fsdp_begin_step(st_fsdp *f) { memset(f->s->g, 0, (size_t)f->s->n * sizeof(float)); }

void st_fsdp_end_step(st_fsdp *f)
{
	prefetch_wait(f); /* a gather of old weights may still run; its error resurfaces as a peer error later */
	for (int k = 0; k < 4; k++)
		f->slot_unit[k] = -1;
}

int64_t st_fsdp_buffer_bytes(const st_fsdp *f) { return f->bytes; }

void st_fsdp_free(st_fsdp *f)
{
	if (!f)
		return;
	if (f->have_thread) {
		pthread_mutex_lock(&f->mu);
		f->quit = 1;
		pthread_cond_broadcast(&f->cv);
		pthread_mutex_unlock(&f->mu);
		pthread_join(f->thread, NULL);
	}
	pthread_mutex_destroy(&f->mu);
	pthread_cond_destroy(&f->cv);
	f->m->hooks = NULL;
	for (int k = 0; k < 4; k++)
		free(f->slot[k]);
	free(f->gslot);
	free(f->rs);
	free(f->tok_all);
	free(f->emb_all);
	free(f->counts);
	free(f);
}
