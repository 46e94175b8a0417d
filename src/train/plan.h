/*
 * plan.h - what a training run needs per device, before running it: the
 * counterpart of MaxText's ahead-of-time compile check (`slicetrain plan`,
 * whose command line is src/cli/plan.c).
 *
 *   st_plan p;
 *   rc = st_plan_compute(&p, &cfg, num_slices, devices_per_slice);
 *   st_plan_print(&p, &cfg, stdout);
 *
 * Sharding model (docs/plan.md):
 *   tensor (tp)  Megatron-style: q/k/v/o heads, the MLP width and the output
 *                layer's vocabulary are divided by tp; embeddings and norms are
 *                replicated. Activations use the per-device shape (H/tp, K/tp,
 *                M/tp, V/tp); a tensor-parallel group works on the rows of its
 *                tp devices together (per_device_batch_size x tp sequences per
 *                micro-batch), as MaxText's global batch = per-device batch x
 *                devices and as src/train/train.c does.
 *   fsdp         ZeRO-3: weights, gradients and AdamW state (each tensor's tp
 *                piece) divided by fsdp, plus one layer's gathered weights as
 *                a working buffer when fsdp > 1.
 *   data         replicas: divide nothing.
 * Bytes: weights, gradients and AdamW state fp32 (weight_dtype float32);
 * activations as src/model/llama.c allocates them (fp32; with dtype bfloat16
 * plus its bf16 operand buffers, and a bf16 copy of the resident weights: the
 * tp piece, or one gathered layer under fsdp). The workspace line adds the
 * kernels' workspace as the model allocates it (st_llama_workspace_bytes_for),
 * the token batch and a fixed 64 MiB for the runtime (libraries,
 * oneDNN's JIT code and scratch), so the total is comparable with a process's
 * peak resident memory. The kernel context line is the matrix products'
 * context as the model allocates it (st_llama_kctx_bytes_for,
 * kernels/cpu/kctx.h): their primitive table and their scratch on the CPU
 * that plans (the AMX packing where the CPU has AMX, the fp32 tiles'
 * packing and partial sums where oneDNN runs without AVX-512; none on
 * oneDNN's own paths).
 */
#ifndef ST_TRAIN_PLAN_H
#define ST_TRAIN_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "config/config.h"
#include "comm/mesh.h"
#include "model/llama.h"
#include "train/flops.h"

typedef struct st_plan {
	st_mesh mesh;
	int64_t devices;        /* num_slices x devices_per_slice */
	st_llama_shape shape;   /* the whole model */
	st_llama_shape local;   /* one device's piece: H, K, M, V divided by tensor */
	int64_t params;         /* whole model */
	int64_t params_piece;   /* one tensor-parallel piece (what a tp rank's model holds) */
	int64_t params_device;  /* after fsdp sharding: this device's share of the piece */
	int64_t layer_piece;    /* one layer's parameters in a tp piece (fsdp working buffer) */
	int64_t rows;           /* sequences per micro-batch of a tensor-parallel group */
	int64_t T;
	int64_t global_batch;   /* sequences per step, all devices, all micro-batches */
	/* bytes per device */
	int64_t weights, grads, optimizer, fsdp_buffer, bf16_weights, activations, workspace, total;
	int64_t kernel_ctx;     /* the matrix products' kernel context (in total) */
	int64_t checkpoint;     /* enable_checkpointing: the saver's host buffer (in total) */
	double memory;          /* bytes the plan is checked against */
	int fits;
	st_flops flops;         /* per device per step */
} st_plan;

/*
 * Plan the run of config c on num_slices slices of devices_per_slice devices.
 * memory_bytes: what one device may use (0: this machine's RAM). Returns 0,
 * or ST_EINVAL with a one-line message (mesh that does not resolve, heads or
 * widths not divisible by the tensor parallelism, batch not whole).
 */
int st_plan_compute(st_plan *p, const st_config *c, int64_t num_slices, int64_t devices_per_slice,
		    double memory_bytes);

/* The most devices per slice a suggestion asks for. */
#define ST_PLAN_MAX_DEVICES_PER_SLICE 4096

/* A variant of a run that does not fit, one that does (st_plan_suggest). */
typedef struct st_plan_suggestion {
	int found;
	char overrides[512];       /* key=value ... to add, "" when only the devices change */
	int64_t devices_per_slice; /* the same as the plan's, or more */
	st_plan plan;              /* the variant's plan (fits) */
} st_plan_suggestion;

/*
 * When p (of config c, memory_bytes as given to st_plan_compute) does not
 * fit: the variant of the run that fits and asks least of the user, among
 * the combinations of: remat_policy=full; the data axes folded into fsdp
 * (the same devices, the same results); per_device_batch_size halved, as
 * often as it halves, with as much more gradient accumulation (the same
 * global batch); dtype=bfloat16; 2, 4, 8 or 16 times the devices per slice,
 * in the slice's fsdp axis. The cost of a variant is the sum of its
 * changes', in that order (remat 1, fsdp 2, each halving 3, bf16 6, each
 * doubling of the devices 8). Returns 1 with *out filled, 0 when p fits or
 * no variant fits (out->found 0), ST_ENOMEM.
 */
int st_plan_suggest(const st_plan *p, const st_config *c, double memory_bytes, st_plan_suggestion *out);

/* Human-readable report; s (NULL: none) adds the suggestion's line, or
 * that none was found, when p does not fit. */
void st_plan_print(const st_plan *p, const st_config *c, const st_plan_suggestion *s, FILE *out);
/* One JSON object (all figures, bytes and FLOPs), one line; with s, when p
 * does not fit, "suggestion": {"overrides", "devices_per_slice",
 * "total_bytes"} or null. */
void st_plan_print_json(const st_plan *p, const st_config *c, const st_plan_suggestion *s, FILE *out);

#endif
