/*
 * shard.h - the sharded (ZeRO) training state of one process.
 *
 * Sharding of the training state (ZeRO): each tensor's tensor-parallel piece
 * (rows R) is split by rows over the fsdp group, fsdp rank f owning rows
 * [R f / F, R (f+1) / F). The shard of every tensor, laid end to end, forms
 * this process's shard block; master weights, gradients and both AdamW
 * moments live there. After backward, full-piece gradients are
 * reduce-scattered into the shard over fsdp, then summed over dp; AdamW
 * updates the shard; updated shards are all-gathered back into the model.
 */
#ifndef ST_SHARD_SHARD_H
#define ST_SHARD_SHARD_H

#include <stdint.h>

#include "comm/mesh.h"
#include "model/llama.h"

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
/* Share the gradients with the data replicas on this host (st_comm_share on
 * p->dp), so that st_shard_reduce_grads sums them without copies; nothing
 * without data parallelism. Collective over p->dp: every member calls it
 * after each (re)forming of the group. */
int st_shard_share(st_shard *s, const st_par *p);
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

#endif
