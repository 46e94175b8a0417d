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
	st_comm *fsdp_prefetch; /* a second fsdp communicator, for the gather thread */
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
	int alias;                   /* p and g are the model's blocks (fsdp 1, resident) */
} st_shard;

/* Lay out the shard of model m (weights not yet set, moments zero). */
int st_shard_init(st_shard *s, const st_llama *m, const st_par *p);
/* Fill the shard's weights with their initial values (init_weights_seed):
 * the same values on every mesh. Not needed when a checkpoint fills them. */
void st_shard_init_weights(st_shard *s, const st_llama *m, uint64_t seed);
void st_shard_release(st_shard *s);
/* Model gradients -> shard gradients: reduce-scatter over fsdp (unless the
 * ZeRO-3 hooks did it already), sum over dp. */
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

/*
 * ZeRO-3: the model is not resident; weights are gathered over fsdp one unit
 * (layer, output layer) at a time just before use, into two alternating
 * layer buffers (and one for the output layer), while a thread gathers the
 * next unit in the order of the pass (forward: up, backward: down) over its
 * own communicator. Each unit's gradients are reduce-scattered into the
 * shard right after its backward and accumulated over micro-batches. The
 * embedding is gathered the same way unless the group's tokens per
 * micro-batch are fewer than the vocabulary (st_fsdp_shards_embedding): then
 * it stays sharded by vocabulary rows, each member looks up its rows for the
 * whole group's tokens (a reduce-scatter delivers each member its tokens'
 * rows) and adds the group's gathered dx into its rows of the gradient,
 * moving tokens x E values instead of vocabulary x E.
 *
 *   st_fsdp *f;
 *   rc = st_fsdp_create(&f, &shard, &model, &par, rows * T);   // sets model.hooks
 *   per step: st_fsdp_begin_step(f) ... forward/backward ... st_fsdp_end_step(f) after AdamW
 */
typedef struct st_fsdp st_fsdp;
/* 1 when F members with ntok tokens each keep the embedding sharded (F x
 * ntok < vocab), 0 when they gather it. */
int st_fsdp_shards_embedding(int64_t F, int64_t ntok, int64_t vocab);
/* The bytes st_fsdp_create allocates for model m (only its tensor table is
 * read: a non-resident st_llama will do), fsdp size F, ntok tokens per member. */
int64_t st_fsdp_bytes_for(const st_llama *m, int64_t F, int64_t ntok);
/* ntok: tokens per micro-batch of this member (rows x T). */
int st_fsdp_create(st_fsdp **out, st_shard *s, st_llama *m, const st_par *p, int64_t ntok);
/* Zero the shard gradients (before the first micro-batch). */
void st_fsdp_begin_step(st_fsdp *f);
/* The weights changed (after AdamW): gathered copies are stale. */
void st_fsdp_end_step(st_fsdp *f);
/* Bytes of the gather and gradient buffers. */
int64_t st_fsdp_buffer_bytes(const st_fsdp *f);
void st_fsdp_free(st_fsdp *f);

#endif
