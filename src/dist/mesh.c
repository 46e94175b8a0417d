#include "dist/mesh.h"

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
