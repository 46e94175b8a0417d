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
#ifndef ST_COMM_MESH_H
#define ST_COMM_MESH_H

#include <stdint.h>

#include "comm/comm.h"
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

/* Global rank of the process at mesh coordinates c (see "how one process
 * fits in the mesh" below), and the inverse. */
int st_mesh_rank(const st_mesh *m, const int c[ST_NAXES]);
void st_mesh_coords(const st_mesh *m, int rank, int c[ST_NAXES]);

/*
 * How one training process fits in the mesh.
 *
 * Mesh coordinates follow MaxText's hybrid mesh: global ranks are
 * slice-major; inside a slice the devices form an ici_data x ici_fsdp x
 * ici_tensor grid (tensor fastest), across slices the slices form a
 * dcn_data x dcn_fsdp x dcn_tensor grid; each axis coordinate is
 * dcn_coord * ici_size + ici_coord.
 *
 * Communicators (every process creates them in the same order):
 *   tp     same data and fsdp coordinates, ordered by tensor coordinate
 *   fsdp   same data and tensor, ordered by fsdp
 *   dp     same fsdp and tensor, ordered by data
 *   batch  same tensor: all data x fsdp shards (loss sum)
 *   world  everyone (gradient norm)
 */
typedef struct st_par {
	st_group *group; /* NULL: one process */
	int rank, world;
	st_mesh mesh;
	int coord[ST_NAXES]; /* data, fsdp, tensor coordinates of this process */
	st_comm *tp, *fsdp, *dp, *batch, *world_comm;
	st_comm *fsdp_prefetch; /* a second fsdp communicator, for the gather thread */
	int dp_index, dp_size; /* index and count of (data x fsdp) batch shards */
} st_par;

/* Resolve the mesh for the group (NULL: a single process) and build the
 * communicators. ST_EINVAL for a mesh that does not fit the group. */
int st_par_init(st_par *p, const st_config *c, st_group *g);
void st_par_release(st_par *p);
/* A one-line description, e.g. "2 slices x 2 devices: data 2 (dcn 2), fsdp 2, tensor 1". */
void st_par_describe(const st_par *p, char *buf, size_t n);

#endif
