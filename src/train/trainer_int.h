/*
 * trainer_int.h - the trainer's state, shared by the files of the training
 * loop (not an API: train/train.h is):
 *   train.c   the loop and the step
 *   setup.c   the group, the model and what is bound to the group, from
 *             the start and after a re-formation; their release
 *   reform.c  re-forming the group in place (elastic runs)
 * What the trainer uses has modules of its own: train/metrics.h (the
 * sinks), train/checkpoint.h (saves and restore), train/kernels.h (the
 * bf16 kernel plan), train/knobs.h (test knobs), comm/comm.h's
 * st_elastic_env (the launcher's variables).
 */
#ifndef ST_TRAIN_TRAINER_INT_H
#define ST_TRAIN_TRAINER_INT_H

#include <stdint.h>

#include "comm/comm.h"
#include "comm/mesh.h"
#include "config/config.h"
#include "data/data.h"
#include "elastic/worker.h"
#include "model/llama.h"
#include "shard/fsdp.h"
#include "shard/shard.h"
#include "train/checkpoint.h"
#include "train/eval.h"
#include "train/flops.h"
#include "train/knobs.h"
#include "train/watchdog.h"
#include "train/metrics.h"

/* After a peer failure, how long a worker waits for the agent's reform. */
#define ST_REFORM_WAIT_MS 60000

typedef struct trainer {
	const st_config *c;
	st_elastic_env env;   /* the elastic launcher's variables (read once; a reform brings new ones) */
	st_test_knobs knobs;
	/* the group */
	st_group *group;
	st_par par;
	int lead;             /* this process prints the log line and writes the sinks */
	char mesh_desc[256];
	/* the batch */
	int64_t B, T;         /* per_device_batch_size, sequence length */
	int64_t rows;         /* rows per micro-batch of a batch shard: B x tensor */
	int64_t accum;        /* micro-batches per step: gradient_accumulation_steps, or more on fewer
				 devices under an elastic controller (setup.c, elastic_accum) */
	int64_t G;            /* global rows per step: B x devices x accum */
	int64_t max_devices;  /* the elastic group's devices at its maximum size; 0: not elastic */
	st_flops flops;
	/* the model, its state and buffers */
	st_llama model;
	st_shard shard;       /* this process's part of weights, gradients, AdamW moments */
	st_fsdp *fsdp;        /* ZeRO-3 gathers when fsdp > 1, else NULL (resident model) */
	int kernels_set;      /* bf16: model.kplan is decided */
	int32_t *tokens;      /* one micro-batch of this batch shard: rows x (T+1) */
	float *gsum;          /* accum > 1, resident model: the step's finished micro-batches' gradients */
	/* bound to the group */
	st_dataset *data;
	st_eval eval;         /* the eval data (eval_interval > 0) */
	st_metrics out;
	st_run_ckpt ckpt;
	/* where the run is */
	int64_t step0;        /* first step of this group (after a restore or re-formation) */
	int64_t sample0;      /* global sample index of step0's first sample */
	int64_t done;         /* completed steps this process's state holds; -1: none yet (a joiner) */
	int64_t generation;   /* elastic generation, -1: none */
	char origin[200];     /* where this group's state came from */
	/* elastic re-formation in place (docs/elastic.md) */
	st_worker_ctl *ctl;   /* the agent's control channel, NULL without one */
	st_watchdog *wd;      /* the step watchdog (with ctl and SLICETRAIN_STEP_WATCHDOG_MS), or NULL */
	double compute_s;     /* the last step's compute up to its gradient collective */
	st_reform pending;    /* a reform message taken at a step boundary */
	int have_pending;
} trainer;

/* setup.c */
int trainer_setup(trainer *t);
void trainer_release(trainer *t, int failed);
int group_setup(trainer *t, const st_group_env *env);
void group_release(trainer *t);
int bound_setup(trainer *t, int reformed);
void bound_release(trainer *t, int failed);
/* The sinks' description of this group (after its origin is known). */
void describe_run(trainer *t);

/* reform.c */
/* At a step boundary: take a reform the agent sent (a grow), to act on
 * once the group agrees. */
int trainer_poll_reform(trainer *t);
/* The one way on after a failed step (rc < 0) or an agreed re-formation
 * (rc 0): re-form in place with the agent's reform message, the state kept
 * in memory, and return the step to go on from; or a negative error (rc
 * itself when it is not a peer's failure or there is no agent). */
int64_t trainer_reform(trainer *t, int rc);
/* Every process ends with the state of the most completed steps any of
 * them holds (a joiner receives it from a peer). Collective. */
int trainer_sync_state(trainer *t);

#endif
