/*
 * eval.h - the eval loss of a training run: MaxText's eval_interval and
 * eval_steps, over the eval data (grain_eval_files, or a synthetic batch of
 * its own; data.h st_dataset_open_eval). docs/observability.md.
 *
 *   st_eval ev = {0};
 *   rc = st_eval_open(&ev, c, G, lead);        // nothing to open when eval_interval <= 0
 *   ... after step s, when st_eval_due(c, s):
 *   rc = st_eval_run(&ev, &job, &res);         // every process of the group, collective
 *   st_eval_close(&ev);
 *
 * An eval is eval batches of the training's global batch G (per_device_batch_size
 * x devices x micro-batches: the elastic constant batch stays G at any group
 * size), read like a training step: each process forwards its batch shard's
 * rows, micro-batch by micro-batch, with the training's sharding (tensor,
 * fsdp: ZeRO-3 gathers), and the loss sums are all-reduced over the batch
 * shards like the training loss. Batch k covers eval samples k*G .. k*G+G-1
 * by global sample index (unshuffled), so every eval evaluates the same
 * samples whatever the mesh. The loss is exact: forward only, no dropout
 * (slicetrain has none), every token of every full batch counted.
 *
 * Eval leaves no trace in training: it reads its own dataset, writes only
 * activations (the next step recomputes them) and the lent token buffer, and
 * leaves ZeRO-3's gathered weights stale as the optimizer step left them, so
 * the training's losses and weights are the same bits with eval on or off.
 */
#ifndef ST_TRAIN_EVAL_H
#define ST_TRAIN_EVAL_H

#include <stdint.h>

#include "comm/mesh.h"
#include "config/config.h"
#include "data/data.h"
#include "model/llama.h"
#include "shard/fsdp.h"

typedef struct st_eval {
	st_dataset *data; /* NULL: eval is off */
	int64_t batches;  /* eval batches per eval: eval_steps, or as many full batches as the data holds */
	int64_t G;        /* rows per eval batch (the training's global batch) */
} st_eval;

/* What the trainer lends to an eval: its model and this process's place. */
typedef struct st_eval_job {
	st_llama *model;
	st_fsdp *fsdp;     /* ZeRO-3 runtime, or NULL (resident model) */
	const st_par *par;
	int32_t *tokens;   /* room for rows x (T+1) ids */
	int64_t rows;      /* rows of one micro-batch of this batch shard */
	int64_t accum;     /* micro-batches per batch: G = rows x par->dp_size x accum, as in training */
	int64_t T;
} st_eval_job;

typedef struct st_eval_result {
	double total_loss;     /* eval/total_loss: the sum of every target token's cross-entropy */
	int64_t total_weights; /* eval/total_weights: target tokens counted */
	double avg_loss;       /* eval/avg_loss: total_loss / total_weights */
	double seconds;
} st_eval_result;

/* 1 when an eval follows step (0-based) step: eval_interval > 0 and
 * (step + 1) % eval_interval == 0 (MaxText's rule, at the same steps
 * whether the run started at 0 or resumed). */
int st_eval_due(const st_config *c, int64_t step);
/* Open the eval data for eval batches of G rows (eval_interval > 0, else a
 * no-op). ST_EINVAL (naming grain_eval_files) when the data does not open or
 * holds less than one batch and eval_steps is not set; lead: this process
 * logs what an eval covers. */
int st_eval_open(st_eval *e, const st_config *c, int64_t G, int lead);
/* One eval; collective over the whole group (ST_EPEER when a peer fails). */
int st_eval_run(st_eval *e, const st_eval_job *job, st_eval_result *res);
void st_eval_close(st_eval *e);

#endif
