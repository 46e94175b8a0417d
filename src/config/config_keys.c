/*
 * config_keys.c - the typed key table: every config key slicetrain reads,
 * its type, its field and its built-in default (the same values as
 * configs/base.yml, which are MaxText's defaults where they make sense).
 */
#include "config/config_int.h"

#include "base/err.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(enum st_remat) == sizeof(int), "enum fields are stored as int");
_Static_assert(sizeof(enum st_dtype) == sizeof(int), "enum fields are stored as int");
_Static_assert(sizeof(enum st_dataset_type) == sizeof(int), "enum fields are stored as int");
_Static_assert(sizeof(enum st_ckpt_failure_policy) == sizeof(int), "enum fields are stored as int");
_Static_assert(sizeof(enum st_elastic_batch) == sizeof(int), "enum fields are stored as int");

#define CF(field) offsetof(struct st_cfull, field)
#define I(name, field, def) {name, ST_K_INT, CF(field), 0, def, NULL, NULL}
#define IN(name, field, def) {name, ST_K_INT_NONE, CF(field), 0, def, NULL, NULL}
#define F(name, field, def) {name, ST_K_FLOAT, CF(field), 0, def, NULL, NULL}
#define B(name, field, def) {name, ST_K_BOOL, CF(field), 0, def, NULL, NULL}
#define S(name, field, def) {name, ST_K_STR, CF(field), sizeof(((struct st_cfull *)0)->field), def, NULL, NULL}
#define E(name, field, def, names) {name, ST_K_ENUM, CF(field), 0, def, names, NULL}
#define FIXED(name, accepted) {name, ST_K_FIXED, 0, 0, accepted, NULL, NULL}
#define ALIAS(name, of) {name, ST_K_FLOAT, 0, 0, NULL, NULL, of}

static const struct st_cenum rope_types[] = {
	{"default", ST_ROPE_DEFAULT}, {"llama3.1", ST_ROPE_LLAMA31}, {NULL, 0}};
static const struct st_cenum remat_policies[] = {
	{"full", ST_REMAT_FULL}, {"minimal", ST_REMAT_MINIMAL}, {"none", ST_REMAT_NONE},
	{"save-all", ST_REMAT_NONE}, {NULL, 0}};
static const struct st_cenum dtypes[] = {
	{"float32", ST_DTYPE_F32}, {"bfloat16", ST_DTYPE_BF16}, {NULL, 0}};
static const struct st_cenum weight_dtypes[] = {{"float32", ST_DTYPE_F32}, {NULL, 0}};
static const struct st_cenum failure_policies[] = {
	{"continue", ST_CKPT_FAIL_CONTINUE}, {"stop", ST_CKPT_FAIL_STOP}, {NULL, 0}};
static const struct st_cenum elastic_batches[] = {
	{"constant", ST_ELASTIC_BATCH_CONSTANT}, {"scale", ST_ELASTIC_BATCH_SCALE}, {NULL, 0}};
static const struct st_cenum dataset_types[] = {
	{"synthetic", ST_DATA_SYNTHETIC}, {"tokens", ST_DATA_TOKENS}, {NULL, 0}};

static const struct st_ckey keys[] = {
	/* model shape */
	S("model_name", c.model_name, "default"),
	I("base_emb_dim", c.emb_dim, "2048"),
	I("base_num_query_heads", c.num_query_heads, "16"),
	I("base_num_kv_heads", c.num_kv_heads, "16"),
	I("base_num_decoder_layers", c.num_decoder_layers, "16"),
	I("base_mlp_dim", c.mlp_dim, "7168"),
	I("head_dim", c.head_dim, "128"),
	I("vocab_size", c.vocab_size, "32_000"),
	F("normalization_layer_epsilon", c.norm_eps, "1.e-05"),
	F("rope_max_timescale", c.rope_theta, "10_000"),
	E("rope_type", rope_type, "default", rope_types),
	B("rope_use_scale", rope_use_scale, "true"),
	F("rope_scale_factor", c.rope_scale_factor, "8"),
	F("rope_low_freq_factor", c.rope_low_freq_factor, "1"),
	F("rope_high_freq_factor", c.rope_high_freq_factor, "4"),
	I("rope_original_max_position", c.rope_original_max_len, "8192"),
	I("global_parameter_scale", global_parameter_scale, "1"),
	B("override_model_config", override_model_config, "false"),
	{"base_config", ST_K_LOADER, 0, 0, NULL, NULL, NULL},

	/* run */
	S("run_name", c.run_name, "\"\""),
	S("base_output_directory", c.base_output_directory, "\"\""),
	F("per_device_batch_size", c.per_device_batch_size, "12.0"),
	I("max_target_length", c.max_target_length, "2048"),
	I("steps", c.steps, "150_001"),
	I("gradient_accumulation_steps", c.gradient_accumulation_steps, "1"),
	E("remat_policy", c.remat_policy, "full", remat_policies),
	E("dtype", c.dtype, "float32", dtypes),
	E("weight_dtype", c.weight_dtype, "float32", weight_dtypes),
	S("bf16_kernels", c.bf16_kernels, "auto"),
	I("init_weights_seed", c.init_weights_seed, "0"),
	I("log_period", c.log_period, "100"),
	S("metrics_file", c.metrics_file, "\"\""),
	I("eval_interval", c.eval_interval, "-1"),
	I("eval_steps", c.eval_steps, "-1"),
	S("grain_eval_files", c.grain_eval_files, "''"),
	B("enable_tensorboard", c.enable_tensorboard, "True"),
	B("enable_dropout", enable_dropout, "true"),
	F("dropout_rate", dropout_rate, "0.0"),

	/* data */
	E("dataset_type", c.dataset_type, "synthetic", dataset_types),
	S("dataset_path", c.dataset_path, "\"\""),
	B("enable_data_shuffling", c.enable_data_shuffling, "true"),
	I("data_shuffle_seed", c.data_shuffle_seed, "0"),
	S("tokenizer_path", c.tokenizer_path, "\"\""),
	B("add_bos", c.add_bos, "True"),
	B("add_eos", c.add_eos, "True"),

	/* optimizer and schedule */
	F("learning_rate", c.learning_rate, "3.e-5"),
	F("warmup_steps_fraction", c.warmup_steps_fraction, "0.1"),
	F("learning_rate_final_fraction", c.learning_rate_final_fraction, "0.1"),
	ALIAS("cosine_learning_rate_final_fraction", "learning_rate_final_fraction"),
	I("learning_rate_schedule_steps", c.learning_rate_schedule_steps, "-1"),
	F("adam_b1", c.adam_b1, "0.9"),
	F("adam_b2", c.adam_b2, "0.95"),
	F("adam_eps", c.adam_eps, "1.e-8"),
	F("adam_weight_decay", c.adam_weight_decay, "0.1"),
	F("gradient_clipping_threshold", c.gradient_clipping_threshold, "1.0"),

	/* mesh */
	I("ici_data_parallelism", c.ici_data_parallelism, "1"),
	I("ici_fsdp_parallelism", c.ici_fsdp_parallelism, "-1"),
	I("ici_tensor_parallelism", c.ici_tensor_parallelism, "1"),
	I("dcn_data_parallelism", c.dcn_data_parallelism, "-1"),
	I("dcn_fsdp_parallelism", c.dcn_fsdp_parallelism, "1"),
	I("dcn_tensor_parallelism", c.dcn_tensor_parallelism, "1"),
	I("num_slices", c.num_slices, "-1"),

	/* checkpoints (MaxText's defaults; checkpoint_failure_policy is ours) */
	B("enable_checkpointing", c.enable_checkpointing, "True"),
	B("async_checkpointing", c.async_checkpointing, "True"),
	I("checkpoint_period", c.checkpoint_period, "10_000"),
	B("save_checkpoint_on_completion", c.save_checkpoint_on_completion, "True"),
	IN("max_num_checkpoints_to_keep", c.max_num_checkpoints_to_keep, "None"),
	S("load_parameters_path", c.load_parameters_path, "\"\""),
	S("load_full_state_path", c.load_full_state_path, "\"\""),
	E("checkpoint_failure_policy", c.checkpoint_failure_policy, "continue", failure_policies),
	/* ours: a resumed run may train another batch than its checkpoint's */
	B("resume_allow_batch_change", c.resume_allow_batch_change, "False"),

	/* elastic (ours): the global batch when the group's size changes */
	E("elastic_batch", c.elastic_batch, "constant", elastic_batches),

	/* MaxText keys that change the model or the update rule: only the
	 * value that matches our Llama (the Llama 3 model files' value) works */
	FIXED("mlp_activations", "[\"silu\", \"linear\"]"),
	FIXED("logits_via_embedding", "false"),
	FIXED("decoder_block", "llama2"),
	FIXED("num_experts", "1"),
	FIXED("attention_type", "global"),
	FIXED("attention_bias", "false"),
	FIXED("attention_sink", "false"),
	FIXED("share_kv_projections", "false"),
	FIXED("mlp_bias", "false"),
	FIXED("mlp_activations_limit", "-1"),
	FIXED("use_qk_norm", "false"),
	FIXED("use_post_attn_norm", "false"),
	FIXED("use_post_ffw_norm", "false"),
	FIXED("attn_logits_soft_cap", "0 | None"),
	FIXED("final_logits_soft_cap", "0 | None"),
	FIXED("use_untrainable_positional_embedding", "false"),
	FIXED("trainable_position_size", "-1"),
	FIXED("rope_linear_scaling_factor", "1"),
	FIXED("partial_rotary_factor", "1"),
	FIXED("mtp_num_layers", "0"),
	FIXED("use_multimodal", "false"),
	FIXED("quantization", "\"\" | None"),
	FIXED("z_loss_multiplier", "0"),
	FIXED("opt_type", "adamw"),
	FIXED("lr_schedule_type", "cosine"),
	FIXED("adam_eps_root", "0"),
	FIXED("adamw_mask", "[] | None"),
	FIXED("trainable_parameters_mask", "[] | None"),
};

const struct st_ckey *st_ckey_table(size_t *n)
{
	*n = sizeof(keys) / sizeof(keys[0]);
	return keys;
}

const struct st_ckey *st_ckey_find(const char *name)
{
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (strcmp(keys[i].name, name) == 0)
			return &keys[i];
	return NULL;
}

const char *st_ckey_canonical(const char *name)
{
	const struct st_ckey *k = st_ckey_find(name);
	return k && k->alias_of ? k->alias_of : name;
}

const char *st_ckey_enum_name(const struct st_ckey *k, int v)
{
	for (const struct st_cenum *e = k->enums; e && e->name; e++)
		if (e->value == v)
			return e->name;
	return NULL;
}

/* ---- command-line values ---- */

static int is_quoted(const char *s, size_t len)
{
	return len >= 2 && (s[0] == '"' || s[0] == '\'') && s[len - 1] == s[0];
}

int st_cvalue_parse(const char *key, const char *text, st_ynode **out)
{
	size_t len = strlen(text);
	char name[300];
	int rc;

	*out = NULL;
	if (len == 0 || !(text[0] == '[' || text[0] == '{' || is_quoted(text, len))) {
		*out = st_ynode_new_scalar(text, 0, 0, 0);
		return *out ? 0 : st_fail(ST_ENOMEM, "out of memory");
	}
	snprintf(name, sizeof(name), "value of '%.200s'", key);
	if ((rc = st_yaml_parse(name, text, len, out)) < 0) {
		return st_wrap(rc, "command line: cannot parse %.200s=%.200s", key, text);
	}
	if (!*out || (*out)->kind != (text[0] == '[' ? ST_Y_SEQ : text[0] == '{' ? ST_Y_MAP : ST_Y_SCALAR)) {
		st_ynode_free(*out);
		*out = NULL;
		return st_fail(ST_EINVAL, "command line: cannot parse the value of '%s': %s", key, text);
	}
	return 0;
}

/* ---- typed setters ---- */

static int bad_value(const struct st_ckey *k, const st_ynode *v, const char *where, const char *expected)
{
	char val[128];
	if (v->kind == ST_Y_SCALAR && !v->quoted && !v->text[0])
		return st_fail(ST_EINVAL, "%s: key '%s': empty value, expected %s", where, k->name, expected);
	return st_fail(ST_EINVAL, "%s: key '%s': invalid value '%s', expected %s", where, k->name,
		       st_ynode_format(v, val, sizeof(val)), expected);
}

static int out_of_range(const struct st_ckey *k, const st_ynode *v, const char *where, const char *what)
{
	char val[128];
	return st_fail(ST_EINVAL, "%s: key '%s': value '%s' is out of range (expected %s)", where, k->name,
		       st_ynode_format(v, val, sizeof(val)), what);
}

static int set_int(const struct st_ckey *k, const st_ynode *v, const char *where, int64_t *field)
{
	st_yvalue val = st_ynode_value(v);

	if (val.type == ST_YV_INT) {
		if (val.overflow)
			return out_of_range(k, v, where, "a 64-bit integer");
		*field = val.i;
		return 0;
	}
	if (val.type == ST_YV_FLOAT && isfinite(val.f) && val.f == floor(val.f)) {
		if (val.f < -9.2e18 || val.f > 9.2e18)
			return out_of_range(k, v, where, "a 64-bit integer");
		*field = (int64_t)val.f;
		return 0;
	}
	return bad_value(k, v, where, "an integer");
}

static int set_float(const struct st_ckey *k, const st_ynode *v, const char *where, double *field)
{
	st_yvalue val = st_ynode_value(v);

	if (val.type != ST_YV_INT && val.type != ST_YV_FLOAT)
		return bad_value(k, v, where, "a number");
	if (val.overflow || !isfinite(val.f))
		return out_of_range(k, v, where, "a finite number");
	*field = val.f;
	return 0;
}

static int set_bool(const struct st_ckey *k, const st_ynode *v, const char *where, int *field)
{
	st_yvalue val = st_ynode_value(v);

	if (val.type != ST_YV_BOOL)
		return bad_value(k, v, where, "true or false");
	*field = val.b;
	return 0;
}

static int set_str(const struct st_ckey *k, const st_ynode *v, const char *where, char *field)
{
	st_yvalue val = st_ynode_value(v);
	size_t len;

	if (v->kind != ST_Y_SCALAR)
		return bad_value(k, v, where, "a string");
	if (val.type == ST_YV_NULL) {
		field[0] = '\0';
		return 0;
	}
	len = strlen(v->text);
	if (len >= k->size)
		return st_fail(ST_EINVAL, "%s: key '%s': value is too long (%zu bytes, at most %zu)", where,
			       k->name, len, k->size - 1);
	memcpy(field, v->text, len + 1);
	return 0;
}

static void join_enum_names(const struct st_cenum *e, char *buf, size_t cap)
{
	size_t len = 0;
	buf[0] = '\0';
	for (; e->name && len < cap; e++)
		len += snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", e->name);
}

static int set_enum(const struct st_ckey *k, const st_ynode *v, const char *where, int *field)
{
	char val[128], names[256];

	if (v->kind == ST_Y_SCALAR) {
		for (const struct st_cenum *e = k->enums; e->name; e++) {
			if (strcmp(v->text, e->name) == 0) {
				*field = e->value;
				return 0;
			}
		}
	}
	join_enum_names(k->enums, names, sizeof(names));
	return st_fail(ST_EINVAL, "%s: %s '%s' is not supported by slicetrain; supported: %s", where, k->name,
		       st_ynode_format(v, val, sizeof(val)), names);
}

/* "a | b" as "a or b" */
static const char *accepted_list(const char *def, char *buf, size_t cap)
{
	const char *bar;
	size_t len = 0;

	buf[0] = '\0';
	while ((bar = strstr(def, " | ")) && len < cap) {
		len += snprintf(buf + len, cap - len, "%.*s or ", (int)(bar - def), def);
		def = bar + 3;
	}
	if (len < cap)
		snprintf(buf + len, cap - len, "%s", def);
	return buf;
}

/* V must equal one of the " | "-separated YAML values in k->def. */
static int check_fixed(const struct st_ckey *k, const st_ynode *v, const char *where)
{
	char one[128], val[128];
	const char *p = k->def, *bar;
	st_ynode *accepted;
	int rc, equal;

	for (;;) {
		bar = strstr(p, " | ");
		snprintf(one, sizeof(one), "%.*s", bar ? (int)(bar - p) : (int)strlen(p), p);
		if ((rc = st_cvalue_parse(k->name, one, &accepted)) < 0)
			return rc;
		equal = st_ynode_equal(v, accepted);
		st_ynode_free(accepted);
		if (equal)
			return 0;
		if (!bar)
			break;
		p = bar + 3;
	}
	return st_fail(ST_EINVAL, "%s: %s = %s is not supported by slicetrain; supported: %s", where, k->name,
		       st_ynode_format(v, val, sizeof(val)), accepted_list(k->def, one, sizeof(one)));
}

int st_ckey_set(struct st_cfull *f, const struct st_ckey *k, const st_ynode *v, const char *where)
{
	char *field;

	if (k->alias_of)
		k = st_ckey_find(k->alias_of);
	field = (char *)f + k->off;
	switch (k->type) {
	case ST_K_INT:
		return set_int(k, v, where, (int64_t *)(void *)field);
	case ST_K_INT_NONE:
		if (v->kind == ST_Y_SCALAR && st_ynode_value(v).type == ST_YV_NULL) {
			*(int64_t *)(void *)field = -1;
			return 0;
		}
		return set_int(k, v, where, (int64_t *)(void *)field);
	case ST_K_FLOAT:
		return set_float(k, v, where, (double *)(void *)field);
	case ST_K_BOOL:
		return set_bool(k, v, where, (int *)(void *)field);
	case ST_K_STR:
		return set_str(k, v, where, field);
	case ST_K_ENUM:
		return set_enum(k, v, where, (int *)(void *)field);
	case ST_K_FIXED:
		return check_fixed(k, v, where);
	case ST_K_LOADER:
		if (v->kind != ST_Y_SCALAR || st_ynode_value(v).type != ST_YV_STR)
			return bad_value(k, v, where, "a file name");
		return 0;
	}
	ST_BUG("key type %d", (int)k->type);
}

void st_ckeys_set_defaults(struct st_cfull *f)
{
	st_ynode *v;

	memset(f, 0, sizeof(*f));
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		const struct st_ckey *k = &keys[i];
		if (!k->def || k->type == ST_K_FIXED || k->alias_of)
			continue;
		if (st_cvalue_parse(k->name, k->def, &v) < 0 || st_ckey_set(f, k, v, "default") < 0)
			ST_BUG("built-in default of %s: %s", k->name, st_errmsg());
		st_ynode_free(v);
	}
}

/* ---- suggestions ---- */

int st_edit_distance(const char *a, const char *b)
{
	int row[257], n = (int)strlen(b), m = (int)strlen(a);

	if (n > 256 || m > 256)
		return 1000;
	for (int j = 0; j <= n; j++)
		row[j] = j;
	for (int i = 1; i <= m; i++) {
		int diag = row[0];
		row[0] = i;
		for (int j = 1; j <= n; j++) {
			int up = row[j];
			int best = diag + (a[i - 1] != b[j - 1]);
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			if (up + 1 < best)
				best = up + 1;
			row[j] = best;
			diag = up;
		}
	}
	return row[n];
}
