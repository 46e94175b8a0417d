/*
 * fsdp.h - the ZeRO-3 runtime: weights gathered per unit just before use,
 * gradients reduce-scattered right after.
 */
#ifndef ST_SHARD_FSDP_H
#define ST_SHARD_FSDP_H

#include <stdint.h>

#include "shard/shard.h"

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
