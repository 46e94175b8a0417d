/*
 * mesh.h - the device mesh, MaxText semantics.
 *
 * Three axes, data x fsdp x tensor, each the product of an in-slice (ICI)
 * and a cross-slice (DCN) factor. In each list (ICI, DCN) at most one value
 * may be -1; it is filled so the product matches the devices per slice (ICI)
 * or the number of slices (DCN). With one slice the DCN values are ignored
 * (all 1), as MaxText does since its PR #228. Errors use MaxText's words:
 *   "Found unspecified values (-1) for more than one ICI parallelism axis. ..."
 *   "Unspecified value unable to be determined with the given DCN parallelism values"
 *   "Number of devices per slice 4 does not match the product of the ICI parallelism 16"
 */
#ifndef ST_DIST_MESH_H
#define ST_DIST_MESH_H

#include <stdint.h>

#include "config/config.h"

enum { ST_AXIS_DATA, ST_AXIS_FSDP, ST_AXIS_TENSOR, ST_NAXES };

typedef struct st_mesh {
	int64_t num_slices, devices_per_slice;
	int64_t ici[ST_NAXES], dcn[ST_NAXES]; /* resolved factors */
	int64_t size[ST_NAXES];               /* ici * dcn */
} st_mesh;

/* Resolve the config's parallelism keys for a group of num_slices slices of
 * devices_per_slice devices each. Returns 0 or ST_EINVAL with MaxText's message. */
int st_mesh_resolve(st_mesh *m, const st_config *c, int64_t num_slices, int64_t devices_per_slice);

#endif
