/*
 * ckpt.h - checkpoints: sharded, async, atomically committed, restorable
 * onto any mesh. (Contract; see docs/checkpoints.md once written.)
 *
 * Layout, as MaxText: <base_output_directory>/<run_name>/checkpoints/<step>/
 * holding per-process shard files (safetensors) and a manifest written last.
 *
 * What a process saves is a list of pieces: rectangular boxes of global
 * tensors that this process owns. Parameters use Hugging Face names; AdamW
 * moments are "optimizer.mu.<name>" and "optimizer.nu.<name>". A tensor that
 * data-parallel replicas hold in copies is passed by one replica only (the
 * caller decides), so it is written once.
 *
 *   st_ckpt_saver *s;
 *   rc = st_ckpt_saver_create(&s, &opts);
 *   rc = st_ckpt_save(s, &meta, n, pieces);   // copies to host buffers, returns; writes in background
 *   rc = st_ckpt_wait(s);                     // result of the last background save
 *   st_ckpt_saver_free(s);                    // waits
 *
 *   rc = st_ckpt_restore_latest(run_ckpt_dir, comm, &meta, n, pieces, &found);  // fills pieces
 */
#ifndef ST_CKPT_CKPT_H
#define ST_CKPT_CKPT_H

#include <stdint.h>

#include "dist/comm.h"

typedef struct st_ckpt_piece {
	const char *name;        /* global tensor name */
	int ndim;                /* 1 or 2 */
	int64_t global_shape[2]; /* shape of the whole tensor */
	int64_t offset[2];       /* corner of this piece in the whole tensor */
	int64_t shape[2];        /* extent of this piece; data is row-major, contiguous */
	float *data;
} st_ckpt_piece;

typedef struct st_ckpt_meta {
	int64_t step;              /* steps completed when saved */
	int64_t next_sample;       /* global sample index of the next training sample */
	int64_t data_shuffle_seed;
	int64_t init_weights_seed;
	int64_t global_batch;      /* rows per step when saved */
	char mesh[256];            /* human-readable mesh the checkpoint was saved from */
	const char *config_json;   /* the resolved config (save: borrowed; restore: owned, free()) */
} st_ckpt_meta;

#endif
