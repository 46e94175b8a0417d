/*
 * ckpt.h - checkpoints: sharded, async, atomically committed, restorable
 * onto any mesh; Hugging Face export and import. Format and guarantees:
 * docs/checkpoints.md.
 *
 * Layout, as MaxText: <base_output_directory>/<run_name>/checkpoints/<step>/
 *
 *   shard-00000-of-00004.safetensors   process 0's pieces (one file per process)
 *   done-00000.json                    process 0's record: its pieces and their checksums
 *   ...
 *   manifest.json                      written last, by process 0: the commit marker
 *
 * Under an elastic controller the shards and done records carry the
 * worker group's generation (shard-g000007-00000-of-00004.safetensors,
 * done-g000007-00000.json), and a save is fenced: the controller writes the
 * newest generation to <base_output_directory>/<run_name>/generation before
 * it starts any worker of it, and a save of an older generation (a host
 * that was partitioned away and came back) writes no shard and commits
 * nothing (st_ckpt_opts.generation and .fence).
 *
 * What a process saves is a list of pieces: rectangular boxes of global
 * tensors that this process owns. Parameters use Hugging Face names; AdamW
 * moments are "optimizer.mu.<name>" and "optimizer.nu.<name>". A tensor that
 * data-parallel replicas hold in copies is passed by one replica only (the
 * caller decides), so it is written once. The pieces of all processes must
 * tile each tensor exactly (no gap, no overlap): process 0 checks this before
 * it commits.
 *
 * Saving (every process, same step, same order of calls):
 *
 *   st_ckpt_opts o;
 *   st_ckpt_opts_from_config(&o, &cfg, rank, world_size);  // or fill by hand
 *   st_ckpt_saver *s;
 *   rc = st_ckpt_saver_create(&s, &o);        // process 0: removes uncommitted step dirs
 *   ... (a collective, so that nobody saves before process 0's cleanup) ...
 *   rc = st_ckpt_save(s, &meta, n, pieces);   // copies to host buffers, returns; writes in background
 *   rc = st_ckpt_wait(s);                     // result of the last background save
 *   st_ckpt_saver_free(s);                    // waits
 *
 * Restoring (every process, with its own pieces for the current mesh):
 *
 *   rc = st_ckpt_restore_latest(run_ckpt_dir, comm, &meta, n, pieces, &found);
 *   ...
 *   st_ckpt_meta_release(&meta);
 *
 * Thread safety: one saver is used from one thread (the training thread);
 * its background writer never calls the communicator. Functions that take a
 * communicator call it collectively: every member must make the same call.
 *
 * Errors: 0 or a negative ST_E* code with a one-line message (base/err.h).
 * Bad arguments and bad user input (paths, shapes that do not match the
 * checkpoint): ST_EINVAL. Unreadable or corrupt checkpoints: ST_EIO from
 * the functions that read one given checkpoint; st_ckpt_restore_latest
 * falls back to older ones and returns ST_EINVAL when none is usable.
 */
#ifndef ST_CKPT_CKPT_H
#define ST_CKPT_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "comm/comm.h"

typedef struct st_ckpt_piece {
	const char *name;        /* global tensor name */
	int ndim;                /* 1 or 2 */
	int64_t global_shape[2]; /* shape of the whole tensor */
	int64_t offset[2];       /* corner of this piece in the whole tensor */
	int64_t shape[2];        /* extent of this piece; data is row-major, contiguous */
	float *data;
	/* Optional: the CRC-32 (st_crc32) of data's bytes, known to the caller
	 * (st_adamw_update_crc computes it in the update's pass). When every
	 * piece of a save has one, the saver stores them and does not read the
	 * pieces a second time to checksum them. */
	int has_crc32;
	uint32_t crc32;
} st_ckpt_piece;

typedef struct st_ckpt_meta {
	int64_t step;              /* steps completed when saved */
	int64_t next_sample;       /* global sample index of the next training sample */
	int64_t data_shuffle_seed;
	int64_t init_weights_seed;
	int64_t global_batch;      /* rows per step when saved */
	char mesh[256];            /* human-readable mesh the checkpoint was saved from */
	const char *config_json;   /* the resolved config (save: borrowed; restore: owned, free()) */
	int64_t bytes_direct;      /* restore: bytes read with O_DIRECT straight into the pieces (the
				      rest went through a read buffer); ignored by a save */
} st_ckpt_meta;

/* Frees a restored meta's config_json and sets it to NULL. */
void st_ckpt_meta_release(st_ckpt_meta *meta);

/* ------------------------------------------------------------------ saving */

typedef struct st_ckpt_opts {
	const char *dir;         /* the run's checkpoints dir: <base_output_directory>/<run_name>/checkpoints */
	int process, process_count; /* this process's rank and the number of processes that save */
	int async;               /* 1: write in a background thread (async_checkpointing) */
	int64_t max_to_keep;     /* committed checkpoints kept by process 0; <= 0: all (max_num_checkpoints_to_keep) */
	enum st_ckpt_failure_policy failure_policy; /* checkpoint_failure_policy */
	int commit_timeout_ms;   /* process 0's wait for every done record; 0: 1800000 (30 min) */
	uint64_t save_id;        /* optional: the same value on every process of one group (e.g. the
				    rendezvous round); process 0 only accepts done records carrying it */
	/* With async: st_ckpt_save does not copy the pieces; the background thread
	 * writes them straight from the caller's memory where that memory is
	 * aligned to the file system's O_DIRECT block (st_atomic_file_align in
	 * base/file.h; base/pages.h buffers are) and through the host buffer
	 * elsewhere, checksumming as it goes, and
	 * the caller keeps the pieces' memory unchanged until
	 * st_ckpt_saver_release (or the next st_ckpt_save, st_ckpt_wait,
	 * st_ckpt_saver_free), which copies what is not written yet into the host
	 * buffer. A trainer calls the release just before its optimizer update. */
	int defer_copy;
	/* The elastic generation of this process's worker group; ST_CKPT_NO_GENERATION (-1, what
	 * st_ckpt_opts_from_config sets): none, the file names of a run without one. Zero is a
	 * generation: options filled by hand set this. */
	int64_t generation;
	/* Optional, with a generation: the fence file (st_ckpt_fence_path). The writer reads it
	 * before it writes the shard and process 0 again right before it writes the manifest;
	 * one holding a newer generation fails the save ("generation 5 is stale (the run is at
	 * generation 7): not committed"), as does a malformed one. No file: no newer generation. */
	const char *fence;
	/* Test hooks: called by the writer (the background thread when async) before it writes a
	 * save, and by process 0 once it holds every done record, before its last fence check. */
	void (*before_write)(void *arg, int64_t step);
	void (*before_commit)(void *arg, int64_t step);
	void *hook_arg;
} st_ckpt_opts;

#define ST_CKPT_NO_GENERATION (-1)

/* "<base_output_directory>/<run_name>/checkpoints" into buf; ST_EINVAL if it does not fit. */
int st_ckpt_run_dir(const st_config *c, char *buf, size_t cap);

/*
 * Options from the config keys (async_checkpointing, max_num_checkpoints_to_keep,
 * checkpoint_failure_policy) for process `process` of `count`, without a
 * generation. o->dir points into a static per-thread buffer: copy it if the
 * config may change.
 */
int st_ckpt_opts_from_config(st_ckpt_opts *o, const st_config *c, int process, int count);

/* ------------------------------------------------------- the generation fence */

#define ST_CKPT_FENCE_FILE "generation" /* in the run directory: <base_output_directory>/<run_name> */

/* "<base_output_directory>/<run_name>/generation" into buf; ST_EINVAL if it does not fit. */
int st_ckpt_fence_path(const st_config *c, char *buf, size_t cap);

/* Record generation (>= 0) as the run's newest in the fence file at path:
 * its decimal text and a newline, written atomically. The elastic controller
 * calls it before it sends any start or reform of that generation. */
int st_ckpt_fence_write(const char *path, int64_t generation);

/* The generation the fence file at path holds: 1 and *generation; 0 when
 * there is no such file (no newer generation is known). ST_EINVAL naming the
 * file when it holds anything but a decimal number (and one newline);
 * ST_EIO when it cannot be read. */
int st_ckpt_fence_read(const char *path, int64_t *generation);

typedef struct st_ckpt_saver st_ckpt_saver;

/*
 * Create a saver. Creates opts->dir if needed. Process 0 removes step
 * directories without a manifest (uncommitted: left by a crash) and stray
 * temporaries, with one warning per directory, before returning; the caller
 * must make sure no process starts a save before that (a collective between
 * the creation on process 0 and the first save elsewhere). A process 0 whose
 * generation the fence shows stale removes nothing and fails (an uncommitted
 * directory may be a newer generation's save in flight).
 */
int st_ckpt_saver_create(st_ckpt_saver **out, const st_ckpt_opts *opts);

/*
 * Save this process's pieces as checkpoint meta->step. First waits for the
 * previous save of this saver (its failure is returned here under the
 * "stop" policy); then copies the pieces into host buffers (the only part
 * that stalls training: reported in st_ckpt_stats) and, when async, returns
 * while a background thread writes the shard, fsyncs it, renames it into
 * place and writes this process's done record. Process 0 then waits (at
 * most commit_timeout_ms) for every process's done record, checks that the
 * pieces tile every tensor, writes manifest.json (temp, fsync, rename, fsync
 * the directories) and removes the oldest committed checkpoints beyond
 * max_to_keep. meta->config_json (the resolved config, JSON) is required on
 * process 0 and ignored elsewhere. A step that is already committed is
 * skipped (an info line, as MaxText does).
 *
 * Every failure of a save prints one "slicetrain: warning: checkpoint step N
 * FAILED: ..." line when it happens. Under the "continue" policy the run goes
 * on (the failure is counted in st_ckpt_stats); under "stop" it is returned
 * by the next st_ckpt_save or st_ckpt_wait. Invalid pieces or meta are
 * ST_EINVAL at once, whatever the policy. In synchronous mode everything
 * happens inside this call and a failure is returned (stop) or warned
 * (continue) here.
 */
int st_ckpt_save(st_ckpt_saver *s, const st_ckpt_meta *meta, int n, const st_ckpt_piece *pieces);

/*
 * Optional, once, early (e.g. right after creating the saver): allocate the
 * host buffer for saves of these pieces, so that a save does not fail for
 * memory later. Unless saves are async with defer_copy (which write from the
 * pieces and touch the buffer only for what a release copies), also touch its
 * pages in the background, so that the first st_ckpt_save stalls only for the
 * copy: on these virtual machines a fresh 1.5 GB buffer takes 3-7 s of CPU to
 * fault in, the copy itself ~0.1 s; the next st_ckpt_save waits for it.
 * ST_ENOMEM if the buffer cannot be had.
 */
int st_ckpt_saver_reserve(st_ckpt_saver *s, int n, const st_ckpt_piece *pieces);

/*
 * defer_copy: return once the save in flight no longer reads the pieces'
 * memory, copying what the background thread has not copied yet on this
 * thread (and helpers) at once. 1 and *held_s (the time it blocked) when a
 * save's pieces were held, 0 when none were (then *held_s = 0).
 */
int st_ckpt_saver_release(st_ckpt_saver *s, double *held_s);

/* Wait for the save in flight, if any. Returns its error under "stop", else 0. */
int st_ckpt_wait(st_ckpt_saver *s);

/*
 * Make the save in flight give up waiting for other processes' done records
 * as soon as possible (the elastic layer calls this after a peer failure,
 * before st_ckpt_saver_free). Safe from any thread.
 */
void st_ckpt_saver_abort(st_ckpt_saver *s);

/* Wait for the save in flight and free everything. NULL is fine. */
void st_ckpt_saver_free(st_ckpt_saver *s);

typedef struct st_ckpt_stats {
	int64_t saves;            /* st_ckpt_save calls that started a save */
	int64_t committed;        /* saves whose commit this process saw (process 0: manifest written;
				     others: done record written) */
	int64_t failed;           /* saves that failed (each one warned) */
	int64_t skipped;          /* steps already committed */
	int64_t last_step;        /* step of the last save started, -1 if none */
	double last_stall_s;      /* time the last st_ckpt_save blocked its caller (wait + copy) */
	double last_wait_s;       /* ... of which waiting for the previous save */
	double last_copy_s;       /* ... of which copying pieces to host buffers (defer_copy: 0, the
				     pieces are written from where they are; see last_hold_s) */
	double last_hold_s;       /* defer_copy: time st_ckpt_saver_release blocked its caller */
	double last_write_s;      /* background: shard write + fsync + rename + done record */
	double last_commit_s;     /* process 0: waiting for done records + manifest + prune */
	int64_t last_bytes;       /* bytes of this process's last shard file */
	int64_t last_direct_bytes; /* defer_copy: ... of which written straight from the caller's pieces (the
				     rest went through the host buffer: unaligned, or copied by the release) */
	int last_crc_given;       /* the last save's checksums were the caller's (st_ckpt_piece.crc32) */
	double last_bg_cpu_s;     /* CPU time of the last save's background threads (copy, checksum, write, commit) */
	double total_bg_cpu_s;    /* ... summed over every save */
	char last_error[512];     /* message of the last failure, "" if none */
} st_ckpt_stats;

/* A consistent snapshot of the saver's counters (safe while a save runs). */
void st_ckpt_saver_stats(st_ckpt_saver *s, st_ckpt_stats *out);

/* ---------------------------------------------------------------- restoring */

/*
 * Restore from the newest committed checkpoint under dir (a run's
 * checkpoints dir). *found = 0 and 0 returned when dir holds no committed
 * checkpoint (or does not exist). Otherwise fills every piece's data and
 * *meta (config_json malloc'd: st_ckpt_meta_release) and sets *found = 1.
 *
 * Each process reads only the stored pieces that intersect its own pieces
 * (any mesh, any number of processes, as long as global shapes match); a
 * stored piece is read whole and its checksum verified before the
 * intersection is copied. A checkpoint with a bad manifest, a missing,
 * truncated or unreadable shard, or a checksum mismatch is skipped with a
 * warning naming the file and tensor, and the previous committed one is
 * tried. With comm (all processes of the group, collectively), process 0
 * lists the candidates, and every candidate is accepted only if it worked on
 * every process (an allreduce of failure flags), so all processes restore
 * the same step. No usable checkpoint: ST_EINVAL ("no usable checkpoint in
 * DIR: ..."). A requested tensor missing from a checkpoint, or a global
 * shape that differs from the stored one, is ST_EINVAL at once (a different
 * model, not a damaged checkpoint). On error the pieces' contents are
 * unspecified: never train on them.
 */
int st_ckpt_restore_latest(const char *dir, st_comm *comm, st_ckpt_meta *meta, int n, st_ckpt_piece *pieces,
			   int *found);

/*
 * After a restore of a full state (st_ckpt_restore_latest: the run's own
 * newest checkpoint, or st_ckpt_restore_step: load_full_state_path), before
 * training on it: the run trains the batch the checkpoint was trained with.
 * meta: the restored checkpoint's; global_batch: this run's rows per step
 * (all devices, all micro-batches). The sequence length (max_target_length
 * of the saved config) must be the same, and the global batch too (a
 * change of mesh or of per_device_batch_size that keeps it is fine); with
 * batch_may_scale (the global batch follows the device count:
 * elastic_batch=scale under an elastic controller) per_device_batch_size x
 * gradient_accumulation_steps instead. 0, or ST_EINVAL naming the saved and
 * the new values ("... trained with max_target_length 16, a global batch
 * of 8 sequences; this run has max_target_length 32, a global batch of 4
 * sequences: ..."), unless c->resume_allow_batch_change. Values the
 * checkpoint does not record are not compared.
 */
int st_ckpt_check_resume(const st_ckpt_meta *meta, const st_config *c, int64_t global_batch, int batch_may_scale);

/*
 * Restore one committed step directory (load_full_state_path), no fallback:
 * ST_EIO for a damaged checkpoint, ST_EINVAL for a directory that is not a
 * committed checkpoint or a shape mismatch. With comm, every process returns
 * an error if any failed.
 */
int st_ckpt_restore_step(const char *step_dir, st_comm *comm, st_ckpt_meta *meta, int n, st_ckpt_piece *pieces);

/*
 * Load parameters only (load_parameters_path) from path, which is either
 * - a committed slicetrain step directory (as st_ckpt_restore_step; only the
 *   requested pieces are read, so the optimizer moments are ignored), or
 * - a Hugging Face model directory: config.json plus model.safetensors, or
 *   model.safetensors.index.json and its shards. config.json must describe
 *   the model of c (hidden_size, intermediate_size, num_attention_heads,
 *   num_key_value_heads, head_dim, num_hidden_layers, vocab_size: ST_EINVAL
 *   naming the first that differs); rope_theta, rms_norm_eps or rope_scaling
 *   that differ only warn. F32, BF16, F16 and F64 weights are converted to
 *   float. With tie_word_embeddings, lm_head.weight is read from
 *   model.embed_tokens.weight.
 * Progress goes to stderr when it takes more than a few seconds. With comm,
 * every process returns an error if any failed.
 */
int st_ckpt_load_params(const char *path, const st_config *c, st_comm *comm, int n, st_ckpt_piece *pieces);

/*
 * The model a directory holds, as a config, for reading its parameters
 * outside a training run (slicetrain generate; model_dir.c). dir is
 * - a committed step directory, or a checkpoints or run directory (then
 *   its newest committed step): *c is the config the checkpoint was saved
 *   with (max_target_length its context, tokenizer_path, add_bos ...);
 * - a Hugging Face model directory (config.json, no manifest): *c holds the
 *   shape, rms_norm_eps, rope_theta and Llama 3.1 rope_scaling of
 *   config.json, max_target_length its max_position_embeddings (default
 *   2048, as transformers), every other key its default. model_type,
 *   hidden_act, attention_bias and mlp_bias other than a Llama's, other
 *   RoPE scalings, and missing or ill-typed keys are ST_EINVAL naming the
 *   file and key.
 * path (cap bytes) receives the directory to pass to st_ckpt_load_params
 * (the step directory, or dir); *hf is 1 for Hugging Face. ST_EINVAL when
 * dir holds neither; ST_EIO for a manifest that cannot be read.
 */
int st_ckpt_model_config(const char *dir, st_config *c, char *path, size_t cap, int *hf);

/* ------------------------------------------------------------- maintenance */

/* Remove uncommitted step directories under dir (process 0 only; see st_ckpt_saver_create). */
int st_ckpt_cleanup(const char *dir);

typedef struct st_ckpt_step_info {
	int64_t step;
	int committed;         /* manifest.json present */
	int64_t bytes;         /* all files in the step directory */
	int nshards, ndone;    /* shard files and done records present (of every generation) */
	int process_count;     /* from the manifest (committed) or the shard names, 0 if unknown */
	char mesh[256];        /* from the manifest, "" if uncommitted */
	double time_unix;      /* manifest's save time, else the directory's mtime */
} st_ckpt_step_info;

/* The step directories under dir, ascending; *out malloc'd (free()). A missing dir gives 0 steps. */
int st_ckpt_list(const char *dir, st_ckpt_step_info **out, int *n);

/* What a user may name as "the checkpoints": a checkpoints directory, or a
 * run directory holding one (DIR/checkpoints, unless DIR's own name is a
 * step number). Writes the checkpoints directory to buf. */
void st_ckpt_resolve_dir(const char *dir, char *buf, size_t cap);

/* The committed step directories that `ckpt verify ARG` checks: ARG itself
 * when it is a step directory (has a manifest), else every committed step of
 * the checkpoints directory ARG names (st_ckpt_resolve_dir), ascending.
 * *dirs: malloc'd array of malloc'd paths (st_ckpt_free_dirs). ST_EINVAL when
 * ARG is not a directory or holds no committed checkpoint. */
int st_ckpt_verify_targets(const char *arg, char ***dirs, int *n);
void st_ckpt_free_dirs(char **dirs, int n);

/*
 * Recompute every checksum of the committed checkpoint in step_dir and check
 * each shard's safetensors header against the manifest. Returns 0 if all
 * match; otherwise ST_EIO with a message naming the first bad file and
 * tensor (every problem is also printed on stderr as it is found). Progress
 * on stderr for long runs.
 */
int st_ckpt_verify(const char *step_dir, int64_t *pieces_checked, int64_t *bytes_checked);

/*
 * Export a committed checkpoint as a Hugging Face model directory out_dir
 * (created if needed): config.json (LlamaForCausalLM, float32) and
 * model.safetensors, or, when the parameters exceed shard_bytes (<= 0:
 * 5 GB, as transformers' save_pretrained), model-0000k-of-0000n.safetensors
 * files of at most shard_bytes each (a larger tensor gets a file of its own)
 * plus model.safetensors.index.json (metadata.total_size, weight_map).
 * ckpt is a committed step dir, or a checkpoints dir meaning its newest
 * committed step. Files are written atomically; progress on stderr.
 */
int st_ckpt_export_hf(const char *ckpt, const char *out_dir, int64_t shard_bytes);

#endif
