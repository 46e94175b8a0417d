/*
 * parallel.h - how one training process fits in the mesh, and the sharded
 * training state.
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
 *
 * Sharding of the training state (ZeRO): each tensor's tensor-parallel piece
 * (rows R) is split by rows over the fsdp group, fsdp rank f owning rows
 * [R f / F, R (f+1) / F). The shard of every tensor, laid end to end, forms
 * this process's shard block; master weights, gradients and both AdamW
 * moments live there. After backward, full-piece gradients are
 * reduce-scattered into the shard over fsdp, then summed over dp; AdamW
 * updates the shard; updated shards are all-gathered back into the model.
 */
#ifndef ST_TRAIN_PARALLEL_H
#define ST_TRAIN_PARALLEL_H

#include <stdint.h>

#include "config/config.h"
#include "dist/comm.h"
#include "dist/mesh.h"
#include "model/llama.h"

typedef struct st_par {
	st_group *group; /* NULL: one process */
	int rank, world;
	st_mesh mesh;
	int coord[ST_NAXES]; /* data, fsdp, tensor coordinates of this process */
	st_comm *tp, *fsdp, *dp, *batch, *world_comm;
	int dp_index, dp_size; /* index and count of (data x fsdp) batch shards */
} st_par;

/* Resolve the mesh for the group (NULL: a single process) and build the
 * communicators. ST_EINVAL for a mesh that does not fit the group. */
int st_par_init(st_par *p, const st_config *c, st_group *g);
void st_par_release(st_par *p);
/* A one-line description, e.g. "2 slices x 2 devices: data 2 (dcn 2), fsdp 2, tensor 1". */
void st_par_describe(const st_par *p, char *buf, size_t n);

typedef struct st_shard {
	int ntensors;
	int64_t *row0, *rows, *cols; /* per tensor: first row, row count, columns (1-D: 1) */
	int64_t *off;                /* per tensor: offset in the shard block */
	int64_t *counts;             /* per tensor, per fsdp rank: elements (ntensors x F) */
	int64_t n;                   /* elements in the shard block */
	float *p, *g, *m, *v;        /* master weights, gradients, AdamW moments */
} st_shard;

/* Lay out the shard of model m (already initialized, weights set) and copy
 * this process's rows of the weights into it. */
int st_shard_init(st_shard *s, const st_llama *m, const st_par *p);
void st_shard_release(st_shard *s);
/* Model gradients -> shard gradients: reduce-scatter over fsdp, sum over dp. */
int st_shard_reduce_grads(st_shard *s, const st_llama *m, const st_par *p);
/* Sum of squares of the gradients this process owns uniquely, summed over
 * the world: replicated tensors counted once. Returns the global norm. */
int st_shard_grad_norm(const st_shard *s, const st_llama *m, const st_par *p, double *norm);
/* Shard weights -> model weights: all-gather over fsdp. */
int st_shard_gather_params(const st_shard *s, st_llama *m, const st_par *p);

/*
 * The shard as checkpoint pieces: for every tensor, the box of the global
 * tensor this process holds, pointing at the shard's weights, and (with
 * moments) at its AdamW moments, named "optimizer.mu.<name>" and
 * "optimizer.nu.<name>". unique: only the pieces this process must write
 * (data replica 0; tensors replicated over the tensor group from tensor
 * rank 0 only), so that the pieces of all processes tile every tensor once.
 * Fills *pieces (malloc'd, with their names: st_shard_pieces_free).
 */
struct st_ckpt_piece;
int st_shard_pieces(const st_shard *s, const st_llama *m, const st_par *p, int moments, int unique,
		    struct st_ckpt_piece **pieces, int *n);
void st_shard_pieces_free(struct st_ckpt_piece *pieces, int n);

#endif
