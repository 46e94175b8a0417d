#include "comm/mesh.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

static int fill(int64_t *v, int64_t target, const char *kind)
{
	int unspecified = -1;
	int64_t prod = 1;
	for (int i = 0; i < ST_NAXES; i++) {
		if (v[i] == -1) {
			if (unspecified >= 0)
				return st_fail(ST_EINVAL,
					       "Found unspecified values (-1) for more than one %s parallelism axis. "
					       "At most one axis can be unspecified.", kind);
			unspecified = i;
		} else if (v[i] < 1) {
			return st_fail(ST_EINVAL, "%s parallelism values must be -1 or at least 1, got %lld",
				       kind, (long long)v[i]);
		} else {
			prod *= v[i];
		}
	}
	if (unspecified >= 0) {
		if (target % prod != 0 || target / prod < 1)
			return st_fail(ST_EINVAL,
				       "Unspecified value unable to be determined with the given %s parallelism values",
				       kind);
		v[unspecified] = target / prod;
		prod = target;
	}
	if (prod != target)
		return st_fail(ST_EINVAL, "Number of %s %lld does not match the product of the %s parallelism %lld",
			       kind[0] == 'D' ? "slices" : "devices per slice", (long long)target, kind,
			       (long long)prod);
	return 0;
}

int st_mesh_resolve(st_mesh *m, const st_config *c, int64_t num_slices, int64_t devices_per_slice)
{
	m->num_slices = num_slices;
	m->devices_per_slice = devices_per_slice;
	m->ici[ST_AXIS_DATA] = c->ici_data_parallelism;
	m->ici[ST_AXIS_FSDP] = c->ici_fsdp_parallelism;
	m->ici[ST_AXIS_TENSOR] = c->ici_tensor_parallelism;
	m->dcn[ST_AXIS_DATA] = c->dcn_data_parallelism;
	m->dcn[ST_AXIS_FSDP] = c->dcn_fsdp_parallelism;
	m->dcn[ST_AXIS_TENSOR] = c->dcn_tensor_parallelism;
	int rc = fill(m->ici, devices_per_slice, "ICI");
	if (rc < 0)
		return rc;
	if (num_slices > 1) {
		if ((rc = fill(m->dcn, num_slices, "DCN")) < 0)
			return rc;
	} else {
		for (int i = 0; i < ST_NAXES; i++)
			m->dcn[i] = 1;
	}
	for (int i = 0; i < ST_NAXES; i++)
		m->size[i] = m->ici[i] * m->dcn[i];
	return 0;
}

int st_mesh_rank(const st_mesh *m, const int c[ST_NAXES])
{
	int64_t ic[ST_NAXES], dc[ST_NAXES];
	for (int a = 0; a < ST_NAXES; a++) {
		dc[a] = c[a] / m->ici[a];
		ic[a] = c[a] % m->ici[a];
	}
	int64_t slice = (dc[0] * m->dcn[1] + dc[1]) * m->dcn[2] + dc[2];
	int64_t local = (ic[0] * m->ici[1] + ic[1]) * m->ici[2] + ic[2];
	return (int)(slice * m->devices_per_slice + local);
}

void st_mesh_coords(const st_mesh *m, int rank, int c[ST_NAXES])
{
	int64_t slice = rank / m->devices_per_slice, local = rank % m->devices_per_slice;
	int64_t dc[ST_NAXES], ic[ST_NAXES];
	dc[2] = slice % m->dcn[2];
	dc[1] = (slice / m->dcn[2]) % m->dcn[1];
	dc[0] = slice / (m->dcn[2] * m->dcn[1]);
	ic[2] = local % m->ici[2];
	ic[1] = (local / m->ici[2]) % m->ici[1];
	ic[0] = local / (m->ici[2] * m->ici[1]);
	for (int a = 0; a < ST_NAXES; a++)
		c[a] = (int)(dc[a] * m->ici[a] + ic[a]);
}


/* ---- the communicators of one process ---- */
/* The communicator along the axes in `vary` (others fixed at this process's
 * coordinates), members ordered with the last varying axis fastest. */
static int axis_comm(st_par *p, st_comm **out, int vary_mask)
{
	int n = 1;
	for (int a = 0; a < ST_NAXES; a++)
		if (vary_mask & (1 << a))
			n *= (int)p->mesh.size[a];
	int *ranks = malloc((size_t)n * sizeof(int));
	if (!ranks)
		return st_fail(ST_ENOMEM, "out of memory (communicator)");
	for (int i = 0; i < n; i++) {
		int c[ST_NAXES], rem = i;
		for (int a = ST_NAXES - 1; a >= 0; a--) {
			if (vary_mask & (1 << a)) {
				c[a] = rem % (int)p->mesh.size[a];
				rem /= (int)p->mesh.size[a];
			} else {
				c[a] = p->coord[a];
			}
		}
		ranks[i] = st_mesh_rank(&p->mesh, c);
	}
	int rc = st_comm_create(out, p->group, n, ranks);
	free(ranks);
	return rc;
}

int st_par_init(st_par *p, const st_config *c, st_group *g)
{
	memset(p, 0, sizeof(*p));
	p->group = g;
	p->rank = st_group_rank(g);
	p->world = st_group_size(g);
	int slices = st_group_num_slices(g);
	int rc = st_mesh_resolve(&p->mesh, c, slices, p->world / slices);
	if (rc < 0)
		return rc;
	st_mesh_coords(&p->mesh, p->rank, p->coord);
	enum { D = 1 << ST_AXIS_DATA, F = 1 << ST_AXIS_FSDP, T = 1 << ST_AXIS_TENSOR };
	if ((rc = axis_comm(p, &p->tp, T)) < 0 || (rc = axis_comm(p, &p->fsdp, F)) < 0 ||
	    (rc = axis_comm(p, &p->dp, D)) < 0 || (rc = axis_comm(p, &p->batch, D | F)) < 0 ||
	    (rc = axis_comm(p, &p->world_comm, D | F | T)) < 0 ||
	    (rc = axis_comm(p, &p->fsdp_prefetch, F)) < 0) {
		st_par_release(p);
		return rc;
	}
	p->dp_size = (int)(p->mesh.size[ST_AXIS_DATA] * p->mesh.size[ST_AXIS_FSDP]);
	p->dp_index = (int)(p->coord[ST_AXIS_DATA] * p->mesh.size[ST_AXIS_FSDP] + p->coord[ST_AXIS_FSDP]);
	return 0;
}

void st_par_release(st_par *p)
{
	st_comm_free(p->tp);
	st_comm_free(p->fsdp);
	st_comm_free(p->dp);
	st_comm_free(p->batch);
	st_comm_free(p->world_comm);
	st_comm_free(p->fsdp_prefetch);
	p->tp = p->fsdp = p->dp = p->batch = p->world_comm = p->fsdp_prefetch = NULL;
}

void st_par_describe(const st_par *p, char *buf, size_t n)
{
	const st_mesh *m = &p->mesh;
	snprintf(buf, n,
		 "%lld slice%s x %lld device%s: data %lld (ici %lld, dcn %lld), fsdp %lld (ici %lld, dcn %lld), "
		 "tensor %lld (ici %lld, dcn %lld)",
		 (long long)m->num_slices, m->num_slices > 1 ? "s" : "", (long long)m->devices_per_slice,
		 m->devices_per_slice > 1 ? "s" : "", (long long)m->size[0], (long long)m->ici[0],
		 (long long)m->dcn[0], (long long)m->size[1], (long long)m->ici[1], (long long)m->dcn[1],
		 (long long)m->size[2], (long long)m->ici[2], (long long)m->dcn[2]);
}

