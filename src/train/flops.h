/*
 * flops.h - MaxText's training-FLOPs formula (calculate_tflops_training_per_device).
 *
 * Per device and step, for per-device batch B and sequence T:
 *   weights = ((2BTME*2 + 2BTME + 2BTE(H+2K)D + 2BTEHD) * L + 2BTEV) * 3
 *   attention = (4 B T^2 H D / 2) * L * 3          (causal: halved)
 *   total = (weights + attention) * gradient_accumulation_steps
 * The embedding lookup is not counted; the output layer is; remat recompute is
 * not (model FLOPs, not hardware FLOPs).
 */
#ifndef ST_TRAIN_FLOPS_H
#define ST_TRAIN_FLOPS_H

#include "config/config.h"

typedef struct st_flops {
	double weights, attention, total; /* FLOPs per device per step */
} st_flops;

/* batch: sequences per device per micro-step. */
st_flops st_training_flops(const st_config *c, double batch);

#endif
