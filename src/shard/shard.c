#include "shard/shard.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/pages.h"
#include "ckpt/ckpt.h"
#include "optim/adamw.h"


int st_shard_init(st_shard *s, const st_llama *m, const st_par *p)
{
	memset(s, 0, sizeof(*s));
	int nt = m->ntensors, F = (int)p->mesh.size[ST_AXIS_FSDP], f = p->coord[ST_AXIS_FSDP];
	s->ntensors = nt;
	s->row0 = calloc((size_t)nt, sizeof(int64_t));
	s->rows = calloc((size_t)nt, sizeof(int64_t));
	s->cols = calloc((size_t)nt, sizeof(int64_t));
	s->off = calloc((size_t)nt, sizeof(int64_t));
	s->counts = calloc((size_t)(nt * F), sizeof(int64_t));
	if (!s->row0 || !s->rows || !s->cols || !s->off || !s->counts)
		goto oom;
	for (int i = 0; i < nt; i++) {
		const st_tensor *t = &m->tensors[i];
		int64_t R = t->shape[0], C = t->ndim == 2 ? t->shape[1] : 1;
		for (int j = 0; j < F; j++)
			s->counts[i * F + j] = (R * (j + 1) / F - R * j / F) * C;
		s->row0[i] = R * f / F;
		s->rows[i] = R * (f + 1) / F - s->row0[i];
		s->cols[i] = C;
		s->off[i] = s->n;
		s->n += s->rows[i] * C;
	}
	/* one fsdp member with a resident model: the shard is the model's own
	 * blocks (same layout), so no copies between them */
	s->alias = F == 1 && m->params;
	/* page-aligned: a checkpoint writes them with O_DIRECT (base/pages.h) */
	size_t bytes = (size_t)s->n * sizeof(float);
	s->p = s->alias ? m->params : st_pages_alloc(bytes);
	s->g = s->alias ? m->grads : st_pages_alloc(bytes);
	s->m = st_pages_alloc(bytes);
	s->v = st_pages_alloc(bytes);
	if (!s->p || !s->g || !s->m || !s->v)
		goto oom;
	return 0;
oom:
	st_shard_release(s);
	return st_fail(ST_ENOMEM, "out of memory for the sharded optimizer state");
}

int st_shard_share(st_shard *s, const st_par *p)
{
	if (p->mesh.size[ST_AXIS_DATA] < 2 || s->n == 0)
		return 0;
	return st_comm_share(p->dp, s->g, (size_t)s->n * sizeof(float));
}

void st_shard_init_weights(st_shard *s, const st_llama *m, uint64_t seed)
{
	for (int i = 0; i < s->ntensors; i++)
		st_llama_init_rows(m, seed, i, s->row0[i], s->rows[i], s->p + s->off[i]);
}

void st_shard_release(st_shard *s)
{
	free(s->row0);
	free(s->rows);
	free(s->cols);
	free(s->off);
	free(s->counts);
	size_t bytes = (size_t)s->n * sizeof(float);
	if (!s->alias) {
		st_pages_free(s->p, bytes);
		st_pages_free(s->g, bytes);
	}
	st_pages_free(s->m, bytes);
	st_pages_free(s->v, bytes);
	memset(s, 0, sizeof(*s));
}

int st_shard_reduce_grads(st_shard *s, const st_llama *m, const st_par *p)
{
	int F = (int)p->mesh.size[ST_AXIS_FSDP];
	for (int i = 0; !m->hooks && !s->alias && i < s->ntensors; i++) { /* ZeRO-3 did this unit by unit */
		int rc = st_comm_reduce_scatter(p->fsdp, m->grads + m->tensors[i].offset, s->g + s->off[i],
						s->counts + (int64_t)i * F, ST_DTYPE_F32);
		if (rc < 0)
			return rc;
	}
	if (p->mesh.size[ST_AXIS_DATA] > 1)
		return st_comm_allreduce(p->dp, s->g, s->n, ST_DTYPE_F32, ST_SUM);
	return 0;
}

int st_shard_grad_norm(const st_shard *s, const st_llama *m, const st_par *p, double *norm)
{
	double sum = 0;
	if (p->coord[ST_AXIS_DATA] == 0) { /* data replicas hold the same gradients */
		for (int i = 0; i < s->ntensors; i++) {
			if (m->tensors[i].tp_dim < 0 && p->coord[ST_AXIS_TENSOR] != 0)
				continue; /* replicated over the tensor group: count once */
			sum += st_sum_squares(s->g + s->off[i], s->rows[i] * s->cols[i]);
		}
	}
	int rc = st_comm_allreduce(p->world_comm, &sum, 1, ST_DTYPE_F64, ST_SUM);
	*norm = sqrt(sum);
	return rc;
}

int st_shard_gather_params(const st_shard *s, st_llama *m, const st_par *p)
{
	int F = (int)p->mesh.size[ST_AXIS_FSDP];
	for (int i = 0; !s->alias && i < s->ntensors; i++) {
		int rc = st_comm_allgather(p->fsdp, s->p + s->off[i], m->params + m->tensors[i].offset,
					   s->counts + (int64_t)i * F, ST_DTYPE_F32);
		if (rc < 0)
			return rc;
	}
	return 0;
}

int st_shard_pieces(const st_shard *s, const st_llama *m, const st_par *p, int moments, int unique,
		    st_ckpt_piece **pieces, int *n)
{
	int kinds = moments ? 3 : 1, k = 0;
	st_ckpt_piece *out = calloc((size_t)(s->ntensors * kinds), sizeof(*out));
	if (!out)
		return st_fail(ST_ENOMEM, "out of memory (checkpoint pieces)");
	if (unique && p->coord[ST_AXIS_DATA] != 0) { /* another replica writes them */
		*pieces = out;
		*n = 0;
		return 0;
	}
	static const char *prefix[3] = {"", "optimizer.mu.", "optimizer.nu."};
	float *block[3] = {s->p, s->m, s->v};
	for (int kind = 0; kind < kinds; kind++) {
		for (int i = 0; i < s->ntensors; i++) {
			const st_tensor *t = &m->tensors[i];
			if (unique && t->tp_dim < 0 && p->coord[ST_AXIS_TENSOR] != 0)
				continue;
			st_ckpt_piece *pc = &out[k];
			size_t len = strlen(prefix[kind]) + strlen(t->name) + 1;
			char *name = malloc(len);
			if (!name) {
				st_shard_pieces_free(out, k);
				return st_fail(ST_ENOMEM, "out of memory (checkpoint pieces)");
			}
			snprintf(name, len, "%s%s", prefix[kind], t->name);
			pc->name = name;
			pc->ndim = t->ndim;
			pc->global_shape[0] = t->global_shape[0];
			pc->global_shape[1] = t->ndim == 2 ? t->global_shape[1] : 0;
			pc->offset[0] = t->tp_offset[0] + s->row0[i];
			pc->offset[1] = t->ndim == 2 ? t->tp_offset[1] : 0;
			pc->shape[0] = s->rows[i];
			pc->shape[1] = t->ndim == 2 ? s->cols[i] : 0;
			pc->data = block[kind] + s->off[i];
			k++;
		}
	}
	*pieces = out;
	*n = k;
	return 0;
}

void st_shard_pieces_free(st_ckpt_piece *pieces, int n)
{
	for (int i = 0; i < n; i++)
		free((char *)pieces[i].name);
	free(pieces);
}
