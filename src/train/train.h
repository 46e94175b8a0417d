/*
 * train.h - the training loop of one device.
 *
 *   rc = st_train(&cfg, &result);
 *
 * Builds the model from the config, initializes the weights from
 * init_weights_seed, reads batches by global sample index, and runs `steps`
 * steps of forward + backward (over gradient_accumulation_steps micro-batches),
 * global-norm clipping and AdamW on MaxText's schedule. Each step prints
 * MaxText's line on stdout:
 *   completed step: N, seconds: X.XXX, TFLOP/s/device: X.XXX, Tokens/s/device: X.XXX, total_weights: N, loss: X.XXX
 * and, with metrics_file set, appends one JSON object with MaxText's keys;
 * rank 0 writes the same scalars to TensorBoard (enable_tensorboard: an event
 * file under <base_output_directory>/<run_name>/tensorboard/). With
 * eval_interval > 0 the eval loss over the eval data follows every
 * eval_interval-th step: MaxText's "eval metrics after step: N, loss=...,
 * total_weights=..." line, an eval/... record and scalars (train/eval.h;
 * docs/observability.md).
 * SIGINT, SIGTERM (a preemption notice) and SIGUSR1 (an elastic resize
 * request) stop the whole group after the same step (agreed by every rank);
 * with checkpointing on, the state after that step is saved and committed
 * first; then ST_EINTR with result->stop_signal set (exit status 128 + N).
 * Under an elastic controller (SLICETRAIN_ELASTIC_MAX_DEVICES=W_max) the
 * global batch stays that of W_max devices unless elastic_batch=scale, and
 * with SLICETRAIN_GENERATION set metrics_file is appended to.
 */
#ifndef ST_TRAIN_TRAIN_H
#define ST_TRAIN_TRAIN_H

#include <stdint.h>

#include "config/config.h"

typedef struct st_train_result {
	int64_t steps_done;
	double first_loss, last_loss;
	int stop_signal; /* signal that stopped the run, or 0 */
} st_train_result;

int st_train(const st_config *c, st_train_result *res);

#endif
