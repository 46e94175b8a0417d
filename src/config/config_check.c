/*
 * config_check.c - values derived from the typed keys (MaxText rules), the
 * checks a Llama run needs, the warnings about the final values, and
 * st_config_print.
 */
#include "config/config_int.h"

#include "base/err.h"
#include "base/file.h"
#include "base/path.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_DIM INT32_MAX /* kernels index one dimension with int */
/* A derived run name's stamp (to the second), an example of its length, and
 * the most _<k> suffixes tried after it. */
#define RUN_STAMP_FORMAT "%Y-%m-%d-%H-%M-%S"
#define RUN_STAMP_EXAMPLE "2026-12-08-10-31-05"
#define MAX_RUN_SUFFIX 1000

struct checker {
	struct st_cfull *f;
	st_cwhere_fn where_fn;
	const void *ctx;
};

static const char *where(const struct checker *ck, const char *key)
{
	return ck->where_fn(ck->ctx, key);
}

/* ---- model shape ---- */

static int check_dim(const struct checker *ck, const char *key, int64_t v)
{
	if (v <= 0)
		return st_fail(ST_EINVAL, "%s: %s must be positive, got %" PRId64, where(ck, key), key, v);
	if (v > MAX_DIM)
		return st_fail(ST_EINVAL, "%s: %s %" PRId64 " is too large (at most %d)", where(ck, key), key, v,
			       MAX_DIM);
	return 0;
}

/* MaxText's get_individual_scales: doublings rotate over heads+mlp, emb, layers. */
static int apply_parameter_scale(const struct checker *ck)
{
	st_config *c = &ck->f->c;
	int64_t scale = ck->f->global_parameter_scale;
	int log2 = 0, base, rem, emb_s, head_s, mlp_s, layer_s;

	if (scale < 1 || (scale & (scale - 1)) != 0)
		return st_fail(ST_EINVAL, "%s: global_parameter_scale must be a power of 2 (1, 2, 4, ...), got %" PRId64
			       "; set base_emb_dim, base_num_query_heads, base_num_kv_heads, base_mlp_dim, "
			       "base_num_decoder_layers for finer control", where(ck, "global_parameter_scale"), scale);
	while ((INT64_C(1) << log2) < scale)
		log2++;
	base = log2 / 3;
	rem = log2 % 3;
	head_s = base + (rem > 0);
	mlp_s = head_s;
	emb_s = base + (rem > 1);
	layer_s = base;
	if (head_s > 30 || c->emb_dim > (MAX_DIM >> emb_s) || c->num_query_heads > (MAX_DIM >> head_s) ||
	    c->num_kv_heads > (MAX_DIM >> head_s) || c->mlp_dim > (MAX_DIM >> mlp_s) ||
	    c->num_decoder_layers > (MAX_DIM >> layer_s))
		return st_fail(ST_EINVAL, "%s: global_parameter_scale %" PRId64 " makes the model too large",
			       where(ck, "global_parameter_scale"), scale);
	c->emb_dim <<= emb_s;
	c->num_query_heads <<= head_s;
	c->num_kv_heads <<= head_s;
	c->mlp_dim <<= mlp_s;
	c->num_decoder_layers <<= layer_s;
	return 0;
}

static int check_shape(const struct checker *ck)
{
	st_config *c = &ck->f->c;
	int rc;

	if ((rc = check_dim(ck, "base_emb_dim", c->emb_dim)) < 0 ||
	    (rc = check_dim(ck, "base_num_query_heads", c->num_query_heads)) < 0 ||
	    (rc = check_dim(ck, "base_num_kv_heads", c->num_kv_heads)) < 0 ||
	    (rc = check_dim(ck, "base_num_decoder_layers", c->num_decoder_layers)) < 0 ||
	    (rc = check_dim(ck, "base_mlp_dim", c->mlp_dim)) < 0 ||
	    (rc = check_dim(ck, "head_dim", c->head_dim)) < 0 ||
	    (rc = check_dim(ck, "vocab_size", c->vocab_size)) < 0)
		return rc;
	if ((rc = apply_parameter_scale(ck)) < 0)
		return rc;
	if (c->emb_dim % c->num_query_heads != 0)
		return st_fail(ST_EINVAL, "%s: emb_dim %" PRId64 " (base_emb_dim) is not divisible by num_query_heads %"
			       PRId64 " (base_num_query_heads)", where(ck, "base_num_query_heads"), c->emb_dim,
			       c->num_query_heads);
	if (c->num_query_heads % c->num_kv_heads != 0)
		return st_fail(ST_EINVAL, "%s: num_query_heads %" PRId64 " (base_num_query_heads) is not divisible by "
			       "num_kv_heads %" PRId64 " (base_num_kv_heads)", where(ck, "base_num_kv_heads"),
			       c->num_query_heads, c->num_kv_heads);
	return 0; /* the parameter count is the model's to check: st_llama_check_config */
}

static int positive_float(const struct checker *ck, const char *key, double v)
{
	if (v > 0)
		return 0;
	return st_fail(ST_EINVAL, "%s: %s must be positive, got %g", where(ck, key), key, v);
}

/* MaxText turns Llama 3.1 scaling on by model name as well as by rope_type. */
static int derive_rope(const struct checker *ck)
{
	struct st_cfull *f = ck->f;
	st_config *c = &f->c;
	int rc;

	if ((rc = positive_float(ck, "rope_max_timescale", c->rope_theta)) < 0 ||
	    (rc = positive_float(ck, "normalization_layer_epsilon", c->norm_eps)) < 0)
		return rc;
	c->rope_llama31 = (f->rope_type == ST_ROPE_LLAMA31 || strncmp(c->model_name, "llama3.1", 8) == 0) &&
			  f->rope_use_scale;
	if (!c->rope_llama31)
		return 0;
	if ((rc = positive_float(ck, "rope_scale_factor", c->rope_scale_factor)) < 0 ||
	    (rc = positive_float(ck, "rope_low_freq_factor", c->rope_low_freq_factor)) < 0)
		return rc;
	if (c->rope_high_freq_factor <= c->rope_low_freq_factor)
		return st_fail(ST_EINVAL, "%s: rope_high_freq_factor (%g) must be greater than rope_low_freq_factor (%g)",
			       where(ck, "rope_high_freq_factor"), c->rope_high_freq_factor, c->rope_low_freq_factor);
	if (c->rope_original_max_len <= 0)
		return st_fail(ST_EINVAL, "%s: rope_original_max_position must be positive, got %" PRId64,
			       where(ck, "rope_original_max_position"), c->rope_original_max_len);
	return 0;
}

/* ---- run ---- */

static int check_batch(const struct checker *ck)
{
	st_config *c = &ck->f->c;
	double b = c->per_device_batch_size;
	int rc;

	if (b <= 0)
		return st_fail(ST_EINVAL, "%s: per_device_batch_size must be positive, got %g",
			       where(ck, "per_device_batch_size"), b);
	if (b != floor(b) || b < 1)
		return st_fail(ST_EINVAL, "%s: per_device_batch_size %g: fractional batch sizes are not supported by "
			       "slicetrain yet; use a whole number >= 1", where(ck, "per_device_batch_size"), b);
	if (b > MAX_DIM)
		return st_fail(ST_EINVAL, "%s: per_device_batch_size %g is too large", where(ck, "per_device_batch_size"),
			       b);
	if ((rc = check_dim(ck, "max_target_length", c->max_target_length)) < 0 ||
	    (rc = check_dim(ck, "gradient_accumulation_steps", c->gradient_accumulation_steps)) < 0)
		return rc;
	if (b * (double)c->max_target_length * (double)c->gradient_accumulation_steps > 1e15)
		return st_fail(ST_EINVAL, "per_device_batch_size x max_target_length x gradient_accumulation_steps "
			       "(%g tokens per step) is too large", b * (double)c->max_target_length *
			       (double)c->gradient_accumulation_steps);
	return 0;
}

/* MaxText: a schedule length of -1 follows steps, and steps of -1 follows the schedule. */
static int derive_steps(const struct checker *ck)
{
	st_config *c = &ck->f->c;

	if (c->steps < -1 || c->steps == 0)
		return st_fail(ST_EINVAL, "%s: steps must be positive (or -1: learning_rate_schedule_steps), got %" PRId64,
			       where(ck, "steps"), c->steps);
	if (c->learning_rate_schedule_steps < -1 || c->learning_rate_schedule_steps == 0)
		return st_fail(ST_EINVAL, "%s: learning_rate_schedule_steps must be positive (or -1: steps), got %" PRId64,
			       where(ck, "learning_rate_schedule_steps"), c->learning_rate_schedule_steps);
	if (c->learning_rate_schedule_steps == -1)
		c->learning_rate_schedule_steps = c->steps;
	if (c->steps == -1)
		c->steps = c->learning_rate_schedule_steps;
	if (c->steps == -1)
		return st_fail(ST_EINVAL, "%s: steps and learning_rate_schedule_steps are both -1; set steps",
			       where(ck, "steps"));
	return 0;
}

static int in_range(const struct checker *ck, const char *key, double v, double lo, double hi, int hi_open)
{
	if (v >= lo && (hi_open ? v < hi : v <= hi))
		return 0;
	if (isinf(hi))
		return st_fail(ST_EINVAL, "%s: %s must be >= %g, got %g", where(ck, key), key, lo, v);
	return st_fail(ST_EINVAL, "%s: %s must be in [%g, %g%s, got %g", where(ck, key), key, lo, hi,
		       hi_open ? ")" : "]", v);
}

static int check_optimizer(const struct checker *ck)
{
	st_config *c = &ck->f->c;
	int rc;

	if ((rc = in_range(ck, "learning_rate", c->learning_rate, 0, HUGE_VAL, 0)) < 0 ||
	    (rc = in_range(ck, "warmup_steps_fraction", c->warmup_steps_fraction, 0, 1, 0)) < 0 ||
	    (rc = in_range(ck, "learning_rate_final_fraction", c->learning_rate_final_fraction, 0, HUGE_VAL, 0)) < 0 ||
	    (rc = in_range(ck, "adam_b1", c->adam_b1, 0, 1, 1)) < 0 ||
	    (rc = in_range(ck, "adam_b2", c->adam_b2, 0, 1, 1)) < 0 ||
	    (rc = positive_float(ck, "adam_eps", c->adam_eps)) < 0 ||
	    (rc = in_range(ck, "adam_weight_decay", c->adam_weight_decay, 0, HUGE_VAL, 0)) < 0 ||
	    (rc = in_range(ck, "gradient_clipping_threshold", c->gradient_clipping_threshold, 0, HUGE_VAL, 0)) < 0 ||
	    (rc = in_range(ck, "dropout_rate", ck->f->dropout_rate, 0, 1, 1)) < 0)
		return rc;
	return 0;
}

static int check_mesh_value(const struct checker *ck, const char *key, int64_t v)
{
	if (v == -1 || v >= 1)
		return 0;
	return st_fail(ST_EINVAL, "%s: %s must be a positive count or -1 (filled in), got %" PRId64, where(ck, key),
		       key, v);
}

static int check_misc(const struct checker *ck)
{
	st_config *c = &ck->f->c;
	int rc;

	if (c->dataset_type == ST_DATA_TOKENS && !c->dataset_path[0])
		return st_fail(ST_EINVAL, "%s: dataset_type tokens needs dataset_path (a token file or glob)",
			       where(ck, "dataset_type"));
	if (c->eval_interval > 0 && c->dataset_type == ST_DATA_TOKENS && !c->grain_eval_files[0])
		return st_fail(ST_EINVAL, "%s: eval_interval %" PRId64 " with dataset_type tokens needs grain_eval_files "
			       "(the held-out token files: a file or a glob), or eval_interval -1",
			       where(ck, "eval_interval"), c->eval_interval);
	if (c->log_period < 1)
		return st_fail(ST_EINVAL, "%s: log_period must be positive, got %" PRId64, where(ck, "log_period"),
			       c->log_period);
	if ((rc = check_mesh_value(ck, "ici_data_parallelism", c->ici_data_parallelism)) < 0 ||
	    (rc = check_mesh_value(ck, "ici_fsdp_parallelism", c->ici_fsdp_parallelism)) < 0 ||
	    (rc = check_mesh_value(ck, "ici_tensor_parallelism", c->ici_tensor_parallelism)) < 0 ||
	    (rc = check_mesh_value(ck, "dcn_data_parallelism", c->dcn_data_parallelism)) < 0 ||
	    (rc = check_mesh_value(ck, "dcn_fsdp_parallelism", c->dcn_fsdp_parallelism)) < 0 ||
	    (rc = check_mesh_value(ck, "dcn_tensor_parallelism", c->dcn_tensor_parallelism)) < 0 ||
	    (rc = check_mesh_value(ck, "num_slices", c->num_slices)) < 0)
		return rc;
	return 0;
}

/* MaxText's rules for the checkpoint keys (pyconfig: at most one load path). */
static int check_checkpointing(const struct checker *ck)
{
	st_config *c = &ck->f->c;

	if (c->load_parameters_path[0] && c->load_full_state_path[0])
		return st_fail(ST_EINVAL, "%s: At most one of `load_parameters_path` or `load_full_state_path` should be set",
			       where(ck, "load_full_state_path"));
	if (c->checkpoint_period < 1)
		return st_fail(ST_EINVAL, "%s: checkpoint_period must be positive, got %" PRId64,
			       where(ck, "checkpoint_period"), c->checkpoint_period);
	if (c->max_num_checkpoints_to_keep == 0 || c->max_num_checkpoints_to_keep < -1)
		return st_fail(ST_EINVAL, "%s: max_num_checkpoints_to_keep must be positive, or None (-1) to keep all, "
			       "got %" PRId64, where(ck, "max_num_checkpoints_to_keep"), c->max_num_checkpoints_to_keep);
	return 0;
}

/* MaxText: an empty run_name becomes $JOBSET_NAME, else <model_name>_<YYYY-MM-DD-HH-MM>. */
/* A derived run name: <model_name>_<stamp>, and _<k> after it for k >= 2. */
static int run_name_candidate(st_config *c, const char *model, const char *stamp, int k)
{
	int n = k < 2 ? snprintf(c->run_name, sizeof(c->run_name), "%s_%s", model, stamp)
		      : snprintf(c->run_name, sizeof(c->run_name), "%s_%s_%d", model, stamp, k);
	if (n < 0 || (size_t)n >= sizeof(c->run_name))
		return st_fail(ST_EINVAL, "run_name is empty and the derived name is too long; set run_name");
	return 0;
}

/* <base_output_directory>/<run_name> exists (a directory or anything else). */
static int run_dir_exists(const st_config *c)
{
	char p[ST_PATH_MAX];
	struct stat st;
	return st_path_join(p, sizeof(p), c->base_output_directory, c->run_name) < 0 || lstat(p, &st) == 0;
}

/* The first candidate from k on whose directory does not exist; *k is its suffix. */
static int first_free_name(st_config *c, const char *model, const char *stamp, int *k)
{
	int rc;
	for (; *k <= MAX_RUN_SUFFIX; *k = *k < 2 ? 2 : *k + 1)
		if ((rc = run_name_candidate(c, model, stamp, *k)) < 0 || !run_dir_exists(c))
			return rc;
	return st_fail(ST_EINVAL, "run_name is empty and %s/%s_%s ... _%d all exist; set run_name",
		       c->base_output_directory, model, stamp, MAX_RUN_SUFFIX);
}

/*
 * An empty run_name, as MaxText: $JOBSET_NAME (the same on every restart of a
 * JobSet: it resumes), else a new run's name, <model_name>_<YYYY-MM-DD-HH-MM-SS>
 * (MaxText stamps to the minute, which let a run started in the same minute
 * resume another's checkpoints), with _2, _3, ... appended while
 * <base_output_directory>/<name> exists. After derive_output_dir.
 */
static int derive_run_name(st_config *c)
{
	const char *jobset = getenv("JOBSET_NAME");
	char stamp[32];
	struct tm tm;
	time_t now = time(NULL);
	int k = 1;

	c->run_name_derived = 0;
	if (c->run_name[0])
		return 0;
	if (jobset && jobset[0]) {
		int n = snprintf(c->run_name, sizeof(c->run_name), "%s", jobset);
		if (n < 0 || (size_t)n >= sizeof(c->run_name))
			return st_fail(ST_EINVAL, "run_name is empty and $JOBSET_NAME is too long; set run_name");
		return 0;
	}
	localtime_r(&now, &tm);
	strftime(stamp, sizeof(stamp), RUN_STAMP_FORMAT, &tm);
	c->run_name_derived = 1;
	return first_free_name(c, c->model_name, stamp, &k);
}

int st_config_claim_run_dir(st_config *c)
{
	char p[ST_PATH_MAX], model_stamp[ST_NAME_MAX], stamp[32];
	int rc, k = 1;

	if (!c->run_name_derived)
		return 0;
	/* the name is <model>_<stamp>[_<k>]: take it apart to count on from k */
	size_t ml = strlen(c->model_name), sl = strlen(RUN_STAMP_EXAMPLE);
	if (strlen(c->run_name) < ml + 1 + sl || strncmp(c->run_name, c->model_name, ml) || c->run_name[ml] != '_')
		ST_BUG("derived run_name '%s' is not <model_name>_<stamp>", c->run_name);
	snprintf(model_stamp, sizeof(model_stamp), "%s", c->model_name);
	snprintf(stamp, sizeof(stamp), "%.*s", (int)sl, c->run_name + ml + 1);
	if (c->run_name[ml + 1 + sl] == '_')
		k = atoi(c->run_name + ml + 2 + sl);
	if ((rc = st_mkdir_p(c->base_output_directory)) < 0)
		return rc;
	for (;;) {
		if ((rc = st_path_join(p, sizeof(p), c->base_output_directory, c->run_name)) < 0)
			return rc;
		if (mkdir(p, 0777) == 0)
			return 0;
		if (errno != EEXIST)
			return st_fail(ST_EIO, "cannot make the run's directory %s: %s", p, strerror(errno));
		/* another run made it since the name was derived: the next one */
		k = k < 2 ? 2 : k + 1;
		if ((rc = first_free_name(c, model_stamp, stamp, &k)) < 0)
			return rc;
	}
}

/* MaxText uses abspath("maxtext_output") with a warning; we use slicetrain_output. */
static int derive_output_dir(st_config *c, int *derived)
{
	char cwd[ST_PATH_MAX];
	int n;

	*derived = 0;
	if (c->base_output_directory[0])
		return 0;
	if (!getcwd(cwd, sizeof(cwd)))
		return st_fail(ST_EINVAL, "base_output_directory is empty and the current directory is unknown; "
			       "set base_output_directory");
	n = snprintf(c->base_output_directory, sizeof(c->base_output_directory), "%s/slicetrain_output",
		     strcmp(cwd, "/") == 0 ? "" : cwd);
	if (n < 0 || (size_t)n >= sizeof(c->base_output_directory))
		return st_fail(ST_EINVAL, "base_output_directory is empty and the current directory path is too "
			       "long; set base_output_directory");
	*derived = 1;
	return 0;
}

int st_cfull_finish(struct st_cfull *f, st_cwhere_fn where_fn, const void *ctx)
{
	struct checker ck = {f, where_fn, ctx};
	st_config *c = &f->c;
	int rc, derived_output;

	if ((rc = check_shape(&ck)) < 0 || (rc = derive_rope(&ck)) < 0 || (rc = check_batch(&ck)) < 0 ||
	    (rc = derive_steps(&ck)) < 0 || (rc = check_optimizer(&ck)) < 0 || (rc = check_misc(&ck)) < 0 ||
	    (rc = check_checkpointing(&ck)) < 0)
		return rc;
	if ((rc = derive_output_dir(c, &derived_output)) < 0 || (rc = derive_run_name(c)) < 0)
		return rc;
	if (f->enable_dropout && f->dropout_rate > 0)
		st_warn("dropout_rate %g ignored: slicetrain does not implement dropout", f->dropout_rate);
	if (derived_output)
		st_warn("base_output_directory is empty; using %s", c->base_output_directory);
	return 0;
}

/* ---- shape summary ---- */

static const char *human_count(int64_t n, char *buf, size_t cap)
{
	if (n >= 1000000000)
		snprintf(buf, cap, "%.2fB", (double)n / 1e9);
	else if (n >= 1000000)
		snprintf(buf, cap, "%.1fM", (double)n / 1e6);
	else if (n >= 1000)
		snprintf(buf, cap, "%.1fK", (double)n / 1e3);
	else
		snprintf(buf, cap, "%" PRId64, n);
	return buf;
}

/* An enum field's value by its config name, as the key table spells it. */
static const char *enum_name(const char *key, int v)
{
	const char *name = st_ckey_enum_name(st_ckey_find(key), v);
	return name ? name : "?";
}

void st_config_print(const st_config *c, int64_t n)
{
	char params[32], rope[160];

	if (c->rope_llama31)
		snprintf(rope, sizeof(rope), "rope %g with llama3.1 scaling (factor %g, low %g, high %g, original %" PRId64
			 ")", c->rope_theta, c->rope_scale_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
			 c->rope_original_max_len);
	else
		snprintf(rope, sizeof(rope), "rope %g", c->rope_theta);
	st_info("model %s: %s parameters (%" PRId64 "), %" PRId64 " layers, emb_dim %" PRId64 ", heads %" PRId64
		" (kv %" PRId64 "), head_dim %" PRId64 ", mlp_dim %" PRId64 ", vocab %" PRId64 ", %s, norm eps %g",
		c->model_name, human_count(n, params, sizeof(params)), n, c->num_decoder_layers, c->emb_dim,
		c->num_query_heads, c->num_kv_heads, c->head_dim, c->mlp_dim, c->vocab_size, rope, c->norm_eps);
	st_info("run %s: seq len %" PRId64 ", per_device_batch_size %g, gradient_accumulation_steps %" PRId64
		", steps %" PRId64 ", dtype %s, remat %s, data %s%s, output %s",
		c->run_name, c->max_target_length, c->per_device_batch_size, c->gradient_accumulation_steps, c->steps,
		enum_name("dtype", (int)c->dtype), enum_name("remat_policy", (int)c->remat_policy),
		c->dataset_type == ST_DATA_TOKENS ? "tokens " : "synthetic",
		c->dataset_type == ST_DATA_TOKENS ? c->dataset_path : "", c->base_output_directory);
	st_info("optimizer adamw: lr %g (warmup %g, final %g, schedule %" PRId64 " steps), b1 %g, b2 %g, eps %g, "
		"weight decay %g, clip %g", c->learning_rate, c->warmup_steps_fraction,
		c->learning_rate_final_fraction, c->learning_rate_schedule_steps, c->adam_b1, c->adam_b2, c->adam_eps,
		c->adam_weight_decay, c->gradient_clipping_threshold);
}
