/*
 * config.h - the run configuration, MaxText style.
 *
 * A config is built from a YAML file (our configs/base.yml, or MaxText's own
 * base.yml), then configs/models/<model_name>.yml (looked up next to the
 * config file's directory first: <dir>/models/, then the installed
 * configs/models/), then key=value overrides from the command line.
 * Precedence: base < model < command line. Values are typed (YAML scalars:
 * ints with 1_000 separators, floats like 3.e-5, true/false, None/none).
 *
 *   st_config c;
 *   int rc = st_config_load(&c, "configs/base.yml", argc, argv);   // argv: "key=value" ...
 *   if (rc < 0) { fprintf(stderr, "slicetrain: %s\n", st_errmsg()); exit(st_exit_status(rc)); }
 *
 * Every rejected input returns ST_EINVAL with one line naming the problem
 * (file:line for YAML). Keys MaxText has but slicetrain does not implement are
 * accepted when they hold the value the config file gives them (listed once
 * in a warning) and rejected when the command line changes them.
 */
#ifndef ST_CONFIG_CONFIG_H
#define ST_CONFIG_CONFIG_H

#include <stdint.h>

#include "base/dtype.h"
#include "base/path.h" /* ST_PATH_MAX */

enum st_dataset_type { ST_DATA_SYNTHETIC, ST_DATA_TOKENS };
enum st_remat { ST_REMAT_FULL, ST_REMAT_MINIMAL, ST_REMAT_NONE };
/* checkpoint_failure_policy: a failed background save is reported loudly and the
 * run goes on ("continue"), or the run stops with the error ("stop"). */
enum st_ckpt_failure_policy { ST_CKPT_FAIL_CONTINUE, ST_CKPT_FAIL_STOP };
/* elastic_batch: under an elastic controller (SLICETRAIN_ELASTIC_MAX_DEVICES
 * set) the global batch stays that of the maximum size ("constant": more
 * gradient accumulation on fewer devices), or follows the devices ("scale",
 * MaxText's behaviour). */
enum st_elastic_batch { ST_ELASTIC_BATCH_CONSTANT, ST_ELASTIC_BATCH_SCALE };

#define ST_NAME_MAX 256

typedef struct st_config {
	/* model shape (after global_parameter_scale) */
	char model_name[ST_NAME_MAX];
	int64_t emb_dim;            /* base_emb_dim */
	int64_t num_query_heads;    /* base_num_query_heads */
	int64_t num_kv_heads;       /* base_num_kv_heads */
	int64_t num_decoder_layers; /* base_num_decoder_layers */
	int64_t mlp_dim;            /* base_mlp_dim */
	int64_t head_dim;
	int64_t vocab_size;
	double norm_eps;   /* normalization_layer_epsilon */
	double rope_theta; /* rope_max_timescale */
	/* Llama 3.1 RoPE scaling (rope_type: llama3.1; models named llama3.1-* default to it) */
	int rope_llama31;
	double rope_scale_factor;      /* 8 */
	double rope_low_freq_factor;   /* 1 */
	double rope_high_freq_factor;  /* 4 */
	int64_t rope_original_max_len; /* 8192 */

	/* run */
	char run_name[ST_NAME_MAX];
	int run_name_derived; /* not a key: run_name was empty and is <model_name>_<stamp>[_k] */
	char base_output_directory[ST_PATH_MAX];
	double per_device_batch_size; /* must be a positive integer for now */
	int64_t max_target_length;
	int64_t steps;
	int64_t gradient_accumulation_steps;
	enum st_remat remat_policy;
	enum st_dtype dtype;        /* activations: ST_DTYPE_F32 or ST_DTYPE_BF16 */
	enum st_dtype weight_dtype; /* master weights: ST_DTYPE_F32 only */
	/* dtype bfloat16: the kernel of each product site (model/kplan.h):
	 * "auto" (timed), "bf16", "fp32" or a SITE:bf16|fp32 list of every site */
	char bf16_kernels[384];
	int64_t init_weights_seed;
	int64_t log_period;
	char metrics_file[ST_PATH_MAX]; /* "" = none */
	/* eval and TensorBoard (MaxText's keys; docs/observability.md) */
	int64_t eval_interval; /* -1 (<= 0): no eval; else after step s when (s + 1) % eval_interval == 0 */
	int64_t eval_steps;    /* eval batches per eval; -1 (<= 0): one pass over the eval data, full batches */
	char grain_eval_files[ST_PATH_MAX]; /* dataset_type tokens: the held-out token files (file or glob) */
	int enable_tensorboard; /* true: rank 0 writes <base_output_directory>/<run_name>/tensorboard/ */

	/* data */
	enum st_dataset_type dataset_type;
	char dataset_path[ST_PATH_MAX]; /* file, or glob, for dataset_type=tokens */
	int enable_data_shuffling;
	int64_t data_shuffle_seed;
	/* text -> tokens (slicetrain tokenize; docs/data.md) */
	char tokenizer_path[ST_PATH_MAX]; /* a Hugging Face tokenizer.json, "" = none */
	int add_bos, add_eos;             /* put BOS before / EOS after each document (true, true) */

	/* optimizer and schedule */
	double learning_rate;
	double warmup_steps_fraction;
	double learning_rate_final_fraction; /* alias: cosine_learning_rate_final_fraction */
	int64_t learning_rate_schedule_steps; /* -1 in YAML becomes steps */
	double adam_b1, adam_b2, adam_eps, adam_weight_decay;
	double gradient_clipping_threshold; /* 0 disables */

	/* mesh (MaxText semantics; validated in a later issue, single device for now) */
	int64_t ici_data_parallelism, ici_fsdp_parallelism, ici_tensor_parallelism;
	int64_t dcn_data_parallelism, dcn_fsdp_parallelism, dcn_tensor_parallelism;
	int64_t num_slices;

	/* checkpoints (MaxText keys and defaults; docs/checkpoints.md) */
	int enable_checkpointing;            /* true */
	int async_checkpointing;             /* true */
	int64_t checkpoint_period;           /* 10_000: save after step s when s % period == 0 */
	int save_checkpoint_on_completion;   /* true */
	int64_t max_num_checkpoints_to_keep; /* None in YAML = -1: keep all */
	char load_parameters_path[ST_PATH_MAX]; /* "" = none; a checkpoint step dir or an HF model dir */
	char load_full_state_path[ST_PATH_MAX]; /* "" = none; a checkpoint step dir (at most one of the two) */
	enum st_ckpt_failure_policy checkpoint_failure_policy; /* ours: "continue" (default) or "stop" */
	/* ours, false: a resumed run keeps its checkpoint's global batch and
	 * max_target_length (st_ckpt_check_resume); true: it may change them */
	int resume_allow_batch_change;

	/* elastic (ours; docs/config.md) */
	enum st_elastic_batch elastic_batch; /* "constant" (default) or "scale" */
} st_config;

/*
 * Load CONFIG.yml plus overrides (each "key=value"). Fills *c completely.
 * Returns 0, or ST_EINVAL with a message (file:line for YAML problems,
 * the nearest valid key for an unknown command-line key); *c is zeroed then.
 * Derived as MaxText does: emb/heads/mlp/layers scaled by
 * global_parameter_scale, learning_rate_schedule_steps -1 -> steps (and
 * steps -1 -> the schedule), empty base_output_directory ->
 * <cwd>/slicetrain_output, empty run_name -> $JOBSET_NAME or a new run's
 * name, <model_name>_<YYYY-MM-DD-HH-MM-SS>, with _2, _3, ... appended while
 * <base_output_directory>/<name> exists (run_name_derived set; nothing is
 * created: st_config_claim_run_dir). On success it may print these warnings (st_warn,
 * one line each): MaxText keys kept at their file value, dropout ignored,
 * base_output_directory derived. (dtype bfloat16 on a CPU without
 * AVX512_BF16 is warned about by the trainer, which then runs fp32.) Keys and rules: docs/config.md.
 * A path ending in .json, or a file descriptor's (/dev/fd/N,
 * /proc/self/fd/N) whose text opens with '{', is a resolved config as
 * st_config_to_json writes it (what the elastic controller sends its hosts'
 * agents, which pass it to their workers as a memfd), loaded as is: no
 * overrides, no files besides it.
 */
int st_config_load(st_config *c, const char *path, int noverrides, char **overrides);

/*
 * A derived run_name (run_name_derived) made this run's own, once nothing
 * stops the run from starting: creates <base_output_directory> (with its
 * parents) and <base_output_directory>/<run_name>, and when another run
 * made that directory since the name was derived (started in the same
 * second), takes the next free suffix. A run_name that was given, or
 * $JOBSET_NAME: nothing. ST_EIO when a directory cannot be made.
 */
int st_config_claim_run_dir(st_config *c);

/*
 * The installed configs/ directory (holding base.yml, default.yml and
 * models/<name>.yml), searched for models after the config file's own
 * models/ directory. Default "configs" (relative to the working directory);
 * main sets it once, before st_config_load. The string is copied.
 */
void st_config_set_config_dir(const char *dir);
/* The directory set above (never NULL), e.g. to build "<dir>/default.yml". */
const char *st_config_get_config_dir(void);

/*
 * Print the resolved config to stderr through st_info: one line for the
 * model shape (name, parameter count, layers, emb, heads/kv heads, head_dim,
 * mlp, vocab, RoPE), one for the run (seq len, batch, steps, dtype, remat,
 * data, output), one for the optimizer. num_params is the model's count
 * (st_llama_check_config): the tensor table belongs to src/model, which
 * src/config does not see.
 */
void st_config_print(const st_config *c, int64_t num_params);

/*
 * The resolved config as a JSON object (config_json.c), for checkpoint
 * manifests: every st_config field under its MaxText key name (base_emb_dim
 * holds the resolved emb_dim, so global_parameter_scale is not written),
 * enums by name, max_num_checkpoints_to_keep -1 as null, plus "rope_type"
 * ("llama3.1" when the scaling is on). *out is malloc'd compact JSON.
 */
int st_config_to_json(const st_config *c, char **out);
/*
 * Parse JSON written by st_config_to_json into *c (zeroed first; keys
 * missing from the JSON keep the built-in defaults; unknown keys are
 * ignored, so newer manifests still load). ST_EINVAL naming the key for a
 * value of the wrong type or a model shape that is not positive.
 */
int st_config_from_json(st_config *c, const char *json);

/*
 * Levenshtein distance between A and B (strings of at most 256 bytes; a
 * longer one is 1000 away from anything): the config loader's "did you mean"
 * for unknown keys, and the command line's for unknown options (src/cli).
 */
int st_edit_distance(const char *a, const char *b);

#endif
