/*
 * checkpoint.h - a training run's checkpoints (docs/checkpoints.md): where
 * they go, when one is due, saving in the background with the update's
 * checksums, the save at an agreed stop, and the restore at the start.
 *
 *   st_run_ckpt k = ST_RUN_CKPT_INIT;
 *   rc = st_run_ckpt_open(&k, c, &shard, &model, &par, plan, gen, &knobs); // per group; saver only with checkpointing
 *   rc = st_run_ckpt_restore(&k, &shard, &model, &par, G, scale, lead, &r); // newest checkpoint, else
 *                                                                 // load_full_state_path / load_parameters_path
 *   each step:
 *     st_run_ckpt_before_update(&k, step, lead);                  // a save's background copy has the state
 *     rc = st_adamw_update_crc(..., st_run_ckpt_crc_request(&k, step + 1));
 *     st_run_ckpt_crc_taken(&k, step + 1);                        // after a successful update
 *     rc = st_run_ckpt_maybe_save(&k, step + 1, &state);          // 1 when it saved
 *   rc = st_run_ckpt_stop(&k, done, saved, sig, &state, &par);     // an agreed stop: save, wait, ST_EINTR
 *   rc = st_run_ckpt_finish(&k, lead);                            // the last save committed
 *   st_run_ckpt_close(&k, failed);
 *
 * Checksums: when a save of the update's result is due, the update computes
 * the CRC-32 of each piece this process writes while it is in cache
 * (st_adamw_update_crc), and the save passes them on, so the saver does not
 * read 3 x 4 bytes per parameter again. Where the pieces are not one range
 * of the shard each (weights, then the same ranges of the two moments), the
 * saver checksums them itself.
 */
#ifndef ST_TRAIN_CHECKPOINT_H
#define ST_TRAIN_CHECKPOINT_H

#include <stdint.h>

#include "base/path.h"
#include "ckpt/ckpt.h"
#include "comm/mesh.h"
#include "model/kplan.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "shard/shard.h"
#include "train/knobs.h"

typedef struct st_run_ckpt {
	const st_config *c;
	char dir[ST_PATH_MAX];      /* <base_output_directory>/<run_name>/checkpoints */
	st_ckpt_saver *saver;       /* NULL: checkpointing is off */
	st_ckpt_piece *pieces;      /* what this process writes: weights, m, v */
	int npieces;
	char *config_json;          /* the config the checkpoints store (bf16_kernels explicit) */
	/* the update's checksums: one range of the shard per weight piece */
	int64_t *start, *len;
	uint32_t *crc;
	st_adamw_crc request;       /* nranges 0: the pieces are not such ranges */
	int64_t crc_for;            /* the state (completed steps) a request is out for; -1: none */
	int64_t crc_done;           /* the pieces' crc32 are of the state after this many steps; -1: none */
} st_run_ckpt;

#define ST_RUN_CKPT_INIT {.crc_for = -1, .crc_done = -1}

/* The state a save records besides the pieces. */
typedef struct st_run_state {
	int64_t next_sample;  /* global sample index of the next step's first sample */
	int64_t global_batch;
	const char *mesh;     /* st_par_describe */
	int lead;             /* this process logs */
} st_run_state;

/* What a restore found. */
typedef struct st_run_restored {
	int found;              /* the weights were filled (else they need their initial values) */
	int64_t step, next_sample;
	char kernels[ST_KPLAN_STR_MAX]; /* the checkpoint's explicit kernel plan, "" none */
} st_run_restored;

/* The checkpoint directory, and with enable_checkpointing the saver and
 * this process's pieces (collective: nobody saves before process 0 has
 * removed uncommitted steps). plan: the kernel plan the run uses, recorded
 * in the stored config; NULL while it is not decided. generation: the
 * group's elastic generation (-1: none), which the saves carry and are
 * fenced by (the run directory's generation file, ckpt.h); a re-formed
 * group opens anew with its new one. knobs (NULL: none): the test knobs
 * (SLICETRAIN_TEST_SAVE_SECONDS slows each save's writer). */
int st_run_ckpt_open(st_run_ckpt *k, const st_config *c, st_shard *sh, st_llama *m, const st_par *p,
		     const st_kplan *plan, int64_t generation, const st_test_knobs *knobs);
/* The saver's host buffers touched in the background, so that a save only
 * copies (after a restore, faulting them in competes with its reads). */
int st_run_ckpt_reserve(st_run_ckpt *k);
/* Record the decided kernel plan in the stored config. */
int st_run_ckpt_set_kernels(st_run_ckpt *k, const st_kplan *plan);
/* MaxText's order: the run's own newest checkpoint (auto-resume), then
 * load_full_state_path, then load_parameters_path (weights only). A
 * checkpoint trained with another sequence length or global batch
 * (global_batch: this run's rows per step; batch_may_scale: elastic_batch
 * scale under an elastic controller) is refused, naming both
 * (st_ckpt_check_resume), unless resume_allow_batch_change. Collective. */
int st_run_ckpt_restore(st_run_ckpt *k, st_shard *sh, st_llama *m, const st_par *p, int64_t global_batch,
			int batch_may_scale, int lead, st_run_restored *r);

/* A periodic or final save follows `done` completed steps. */
int st_run_ckpt_due(const st_run_ckpt *k, int64_t done);
/* Before the update of step `step`: a save's background copy takes the
 * state it must have (the update overwrites it). */
void st_run_ckpt_before_update(st_run_ckpt *k, int64_t step, int lead);
/* The checksums the update producing state `done` computes, when a save of
 * it is due; else NULL. */
const st_adamw_crc *st_run_ckpt_crc_request(st_run_ckpt *k, int64_t done);
/* The update producing state `done` succeeded: its checksums are the pieces'. */
void st_run_ckpt_crc_taken(st_run_ckpt *k, int64_t done);
/* Save the state after `done` completed steps when due: 1 when it saved,
 * 0 when none was due, or an error. */
int st_run_ckpt_maybe_save(st_run_ckpt *k, int64_t done, const st_run_state *s);
/*
 * The group agreed to stop on signal `sig` after `done` completed steps:
 * save that state (unless `saved` says the period just did) and wait until
 * it is committed, so that no completed step is lost. Every process calls
 * this after the same step. Then ST_EINTR (the caller's exit status 128 +
 * sig), or the save's error.
 */
int st_run_ckpt_stop(st_run_ckpt *k, int64_t done, int saved, int sig, const st_run_state *s, const st_par *p);
/* After the last step: the last save committed, its figures logged (lead). */
int st_run_ckpt_finish(st_run_ckpt *k, int lead);
/* failed: a save in flight is abandoned (it can no longer commit); else
 * waited for. */
void st_run_ckpt_close(st_run_ckpt *k, int failed);

#endif
