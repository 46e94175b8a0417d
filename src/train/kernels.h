/*
 * kernels.h - the kernel plan of a bfloat16 run (model/kplan.h): which
 * kernel, bf16 or fp32, each product site and attention pass runs on.
 *
 * Decided before the activations are allocated, collectively: the
 * bf16_kernels key when explicit; else the restored checkpoint's plan;
 * else on a CPU without bf16 products every site on fp32; else rank 0 times
 * both kernels at this run's shape. Rank 0's plan is broadcast, so every
 * process runs the same one; the lead process logs it with the key value
 * that repeats it.
 */
#ifndef ST_TRAIN_KERNELS_H
#define ST_TRAIN_KERNELS_H

#include <stdint.h>

#include "comm/mesh.h"
#include "config/config.h"
#include "model/llama.h"

/* Into m->kplan. ckpt_plan: the restored checkpoint's explicit plan, "" or
 * NULL none; rows x T: one micro-batch of this process. ST_EINVAL for a
 * bf16_kernels value this CPU cannot run. */
int st_train_choose_kernels(st_llama *m, const st_config *c, const st_par *p, const char *ckpt_plan, int64_t rows,
			    int64_t T, int lead);

#endif
