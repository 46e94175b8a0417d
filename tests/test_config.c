/*
 * test_config.c - st_config_load: our configs, MaxText's base.yml, layer
 * precedence, derived values, and one case per rejected input.
 *
 * Needs ST_ROOT (the repository root; tests/run.sh exports it). MaxText's
 * base.yml is read from $ST_ROOT/../shared/fixtures/maxtext-v0.2.1/ when
 * present; otherwise those cases are reported skipped (a missing dependency).
 */
#include "base/err.h"
#include "config/config.h"
#include "model/llama.h"

#include "check.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *root;
static char tmpdir[256];
static char maxtext_base[4096];
static int have_maxtext;

/* ---- helpers ---- */

/* Path of NAME under the temp dir (a few rotating buffers). */
static const char *tpath(const char *name)
{
	static char bufs[8][512];
	static int next;
	char *b = bufs[next++ % 8];
	snprintf(b, sizeof(bufs[0]), "%s/%s", tmpdir, name);
	return b;
}

static const char *rpath(const char *name)
{
	static char bufs[4][4096];
	static int next;
	char *b = bufs[next++ % 4];
	snprintf(b, sizeof(bufs[0]), "%s/%s", root, name);
	return b;
}

static void write_bytes(const char *name, const char *data, size_t len)
{
	FILE *f = fopen(tpath(name), "wb");
	if (!f) {
		perror(tpath(name));
		exit(1);
	}
	fwrite(data, 1, len, f);
	fclose(f);
}

static void write_file(const char *name, const char *text) { write_bytes(name, text, strlen(text)); }

/* Loads PATH with N overrides; returns rc. */
static int load(st_config *c, const char *path, int n, const char **ov)
{
	return st_config_load(c, path, n, (char **)ov);
}

#define NOV(...) ((int)(sizeof((const char *[]){__VA_ARGS__}) / sizeof(const char *)))
#define LOAD(c, path, ...) load(c, path, NOV(__VA_ARGS__), (const char *[]){__VA_ARGS__})

static void expect_fail_(int line, const char *path, const char *want1, const char *want2, int n, const char **ov)
{
	st_config c;
	int rc = load(&c, path, n, ov);
	const char *msg = st_errmsg();

	if (rc != ST_EINVAL || !strstr(msg, want1) || (want2 && !strstr(msg, want2))) {
		fprintf(stderr, "%s:%d: expected ST_EINVAL with '%s'%s%s%s, got rc %d: %s\n", __FILE__, line, want1,
			want2 ? " and '" : "", want2 ? want2 : "", want2 ? "'" : "", rc, rc ? msg : "(success)");
		check_failures++;
	} else if (getenv("TEST_VERBOSE")) {
		printf("rejected as expected: %s\n", msg);
	}
}

/* FAIL_CASE(path, "must be in message", "also this" or NULL, "key=value", ...) */
#define FAIL_CASE(path, w1, w2, ...) \
	expect_fail_(__LINE__, path, w1, w2, NOV(__VA_ARGS__), (const char *[]){__VA_ARGS__})

/* Runs FN with stderr going to a file; returns what was written (static buffer). */
static const char *capture_stderr(int (*fn)(void *), void *arg, int *rc)
{
	static char out[8192];
	int saved = dup(2), fd = open(tpath("stderr.txt"), O_RDWR | O_CREAT | O_TRUNC, 0600);
	ssize_t got;

	fflush(stderr);
	dup2(fd, 2);
	*rc = fn(arg);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	lseek(fd, 0, SEEK_SET);
	got = read(fd, out, sizeof(out) - 1);
	out[got > 0 ? got : 0] = '\0';
	close(fd);
	return out;
}

static int count_lines(const char *s)
{
	int n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

/* ---- our configs ---- */

static void test_default_job(void)
{
	st_config c;
	int64_t n;
	int rc = LOAD(&c, rpath("configs/default.yml"), "log_period=10");

	CHECK_MSG(rc == 0, "%s", st_errmsg());
	CHECK(strcmp(c.model_name, "llama3-16m") == 0);
	CHECK(c.emb_dim == 384 && c.num_decoder_layers == 6 && c.num_query_heads == 6 && c.num_kv_heads == 2);
	CHECK(c.head_dim == 64 && c.mlp_dim == 1024 && c.vocab_size == 8192);
	CHECK_NEAR(c.rope_theta, 500000, 1e-12);
	CHECK_NEAR(c.norm_eps, 1e-5, 1e-12);
	CHECK(!c.rope_llama31);
	CHECK(strcmp(c.run_name, "default") == 0);
	CHECK(strcmp(c.base_output_directory, "slicetrain_output") == 0);
	CHECK(c.steps == 100 && c.learning_rate_schedule_steps == 100);
	CHECK(c.max_target_length == 256 && c.per_device_batch_size == 4.0);
	CHECK(c.dataset_type == ST_DATA_TOKENS && c.enable_data_shuffling && !strcmp(c.dataset_path, "data/default/train.bin"));
	CHECK(!strcmp(c.tokenizer_path, "data/default/tokenizer.json"));
	CHECK(c.metrics_file[0] == '\0');
	CHECK_NEAR(c.learning_rate, 3e-3, 1e-12);
	CHECK_NEAR(c.warmup_steps_fraction, 0.1, 1e-12);
	CHECK_NEAR(c.learning_rate_final_fraction, 0.1, 1e-12);
	CHECK_NEAR(c.adam_b1, 0.9, 1e-12);
	CHECK_NEAR(c.adam_b2, 0.95, 1e-12);
	CHECK_NEAR(c.adam_eps, 1e-8, 1e-12);
	CHECK_NEAR(c.adam_weight_decay, 0.1, 1e-12);
	CHECK_NEAR(c.gradient_clipping_threshold, 1.0, 1e-12);
	CHECK(c.dtype == ST_DTYPE_F32 && c.weight_dtype == ST_DTYPE_F32 && c.remat_policy == ST_REMAT_FULL);
	CHECK(c.log_period == 10 && c.gradient_accumulation_steps == 1 && c.init_weights_seed == 0);
	CHECK(c.ici_fsdp_parallelism == -1 && c.ici_data_parallelism == 1 && c.dcn_data_parallelism == -1);
	CHECK(c.num_slices == -1);
	CHECK(st_llama_check_config(&c, &n) == 0 && n == 15733632);
}

static int load_default_job(void *arg)
{
	st_config *c = arg;
	return LOAD(c, rpath("configs/default.yml"), "steps=3");
}

static int load_bf16(void *arg)
{
	st_config *c = arg;
	return LOAD(c, rpath("configs/default.yml"), "dtype=bfloat16");
}

static void test_warnings(void)
{
	st_config c;
	int rc;
	const char *err = capture_stderr(load_default_job, &c, &rc);

	CHECK(rc == 0);
	CHECK_MSG(err[0] == '\0', "the default job should load without warnings: %s", err);

	err = capture_stderr(load_bf16, &c, &rc);
	CHECK(rc == 0 && c.dtype == ST_DTYPE_BF16);
	/* bf16 is a supported dtype: loading it warns about nothing (the trainer
	 * says so only on a CPU without bf16 instructions) */
	CHECK_MSG(err[0] == '\0', "dtype=bfloat16 should load without warnings: %s", err);

	st_config_print(&c, 124668672); /* smoke: must not crash */
}

static void test_base_defaults(void)
{
	st_config c;
	int rc = LOAD(&c, rpath("configs/base.yml"), "run_name=r", "base_output_directory=/tmp/o");

	CHECK_MSG(rc == 0, "%s", st_errmsg());
	CHECK(strcmp(c.model_name, "default") == 0);
	CHECK(c.emb_dim == 2048 && c.num_query_heads == 16 && c.num_kv_heads == 16 && c.num_decoder_layers == 16);
	CHECK(c.mlp_dim == 7168 && c.head_dim == 128 && c.vocab_size == 32000);
	CHECK_NEAR(c.rope_theta, 10000, 1e-12);
	CHECK(c.steps == 150001 && c.max_target_length == 2048 && c.per_device_batch_size == 12.0);
	CHECK_NEAR(c.learning_rate, 3e-5, 1e-12);
	CHECK(c.dataset_type == ST_DATA_SYNTHETIC && c.dtype == ST_DTYPE_F32);
	CHECK_NEAR(c.rope_scale_factor, 8, 0);
	CHECK_NEAR(c.rope_low_freq_factor, 1, 0);
	CHECK_NEAR(c.rope_high_freq_factor, 4, 0);
	CHECK(c.rope_original_max_len == 8192);
}

/* base < model < command line; the config's own models/ dir before the installed one */
static void test_precedence(void)
{
	char text[8192];
	st_config c;
	int rc;

	snprintf(text, sizeof(text),
		 "base_config: \"%s\"\n"
		 "model_name: llama3-test\n"
		 "steps: 2_000\n"
		 "vocab_size: 999\n"
		 "max_target_length: 64\n"
		 "run_name: prec\n"
		 "debug:\n  rl: False\n"
		 "scan_layers: True\n"
		 "max_num_checkpoints_to_keep: None\n",
		 rpath("configs/base.yml"));
	write_file("prec.yml", text);
	rc = LOAD(&c, tpath("prec.yml"), "max_target_length=1_024", "base_output_directory=/tmp/o");
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	CHECK(c.steps == 2000);             /* file over base */
	CHECK(c.vocab_size == 256);         /* model over file */
	CHECK(c.max_target_length == 1024); /* command line over file */
	CHECK(c.emb_dim == 64 && c.num_query_heads == 4 && c.num_kv_heads == 2 && c.num_decoder_layers == 2);
	CHECK(c.mlp_dim == 128 && c.head_dim == 16);
	CHECK_NEAR(c.rope_theta, 500000, 0);
	CHECK(strcmp(c.run_name, "prec") == 0);

	/* a models/ directory next to the config wins over the installed one */
	mkdir(tpath("models"), 0700);
	write_file("models/llama3-test.yml", "base_emb_dim: 96\nbase_num_query_heads: 6\nbase_num_kv_heads: 3\n");
	rc = LOAD(&c, tpath("prec.yml"), "base_output_directory=/tmp/o");
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	CHECK(c.emb_dim == 96 && c.num_query_heads == 6 && c.num_kv_heads == 3 && c.vocab_size == 999);
	unlink(tpath("models/llama3-test.yml"));

	/* the same MaxText key on the command line with its file value is fine */
	rc = LOAD(&c, tpath("prec.yml"), "scan_layers=true", "max_num_checkpoints_to_keep=None");
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	FAIL_CASE(tpath("prec.yml"), "key 'scan_layers' is not supported by slicetrain", "True", "scan_layers=false");
}

static void test_values(void)
{
	st_config c;
	int rc;

	rc = LOAD(&c, rpath("configs/default.yml"), "steps=1_000", "metrics_file=None", "run_name='a b'",
		  "dataset_type=tokens", "dataset_path=/data/shard_*.bin", "remat_policy=save-all",
		  "data_shuffle_seed=-7", "enable_data_shuffling=False", "attn_logits_soft_cap=None",
		  "final_logits_soft_cap=0.0", "mlp_activations=[silu, linear]", "decoder_block=\"llama2\"",
		  "learning_rate=3.e-5", "per_device_batch_size=2.0", "init_weights_seed=1e3");
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	CHECK(c.steps == 1000);
	CHECK(c.metrics_file[0] == '\0');
	CHECK(strcmp(c.run_name, "a b") == 0);
	CHECK(c.dataset_type == ST_DATA_TOKENS && strcmp(c.dataset_path, "/data/shard_*.bin") == 0);
	CHECK(c.remat_policy == ST_REMAT_NONE);
	CHECK(c.data_shuffle_seed == -7 && !c.enable_data_shuffling);
	CHECK_NEAR(c.learning_rate, 3e-5, 1e-12);
	CHECK(c.per_device_batch_size == 2.0);
	CHECK(c.init_weights_seed == 1000);

	rc = LOAD(&c, rpath("configs/default.yml"), "remat_policy=minimal", "steps=5", "steps=6");
	CHECK_MSG(rc == 0 && c.remat_policy == ST_REMAT_MINIMAL && c.steps == 6, "%s", st_errmsg());
}

static void test_alias(void)
{
	st_config c;
	int rc = LOAD(&c, rpath("configs/default.yml"), "cosine_learning_rate_final_fraction=0.05");

	CHECK_MSG(rc == 0, "%s", st_errmsg());
	CHECK_NEAR(c.learning_rate_final_fraction, 0.05, 1e-12);

	write_file("alias.yml", "cosine_learning_rate_final_fraction: 0.25\nlearning_rate_final_fraction: 0.25\n"
				"run_name: a\nbase_output_directory: /tmp/o\n");
	rc = LOAD(&c, tpath("alias.yml"), "steps=10");
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	CHECK_NEAR(c.learning_rate_final_fraction, 0.25, 1e-12);
	rc = LOAD(&c, tpath("alias.yml"), "learning_rate_final_fraction=0.5");
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	CHECK_NEAR(c.learning_rate_final_fraction, 0.5, 1e-12);
}

static void test_parameter_scale(void)
{
	st_config c;
	int rc = LOAD(&c, rpath("configs/default.yml"), "model_name=llama3-test", "global_parameter_scale=8");

	CHECK_MSG(rc == 0, "%s", st_errmsg());
	CHECK(c.emb_dim == 128 && c.num_query_heads == 8 && c.num_kv_heads == 4 && c.mlp_dim == 256);
	CHECK(c.num_decoder_layers == 4 && c.head_dim == 16);

	rc = LOAD(&c, rpath("configs/default.yml"), "model_name=llama3-test", "global_parameter_scale=4");
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	CHECK(c.emb_dim == 128 && c.num_query_heads == 8 && c.num_kv_heads == 4 && c.mlp_dim == 256);
	CHECK(c.num_decoder_layers == 2);

	rc = LOAD(&c, rpath("configs/default.yml"), "model_name=llama3-test", "global_parameter_scale=2");
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	CHECK(c.emb_dim == 64 && c.num_query_heads == 8 && c.num_kv_heads == 4 && c.mlp_dim == 256);
	CHECK(c.num_decoder_layers == 2);
}

static void test_rope(void)
{
	st_config c;
	int64_t n;
	int rc = LOAD(&c, rpath("configs/default.yml"), "model_name=llama3.1-8b");

	CHECK_MSG(rc == 0, "%s", st_errmsg());
	CHECK(c.rope_llama31 && c.emb_dim == 4096 && c.vocab_size == 128256);
	CHECK_NEAR(c.rope_scale_factor, 8, 0);
	CHECK_NEAR(c.rope_low_freq_factor, 1, 0);
	CHECK_NEAR(c.rope_high_freq_factor, 4, 0);
	CHECK(c.rope_original_max_len == 8192);
	CHECK(st_llama_check_config(&c, &n) == 0 && n == INT64_C(8030261248));
	/* a shape whose parameter count overflows int64 loads; the model's check refuses it */
	rc = LOAD(&c, rpath("configs/default.yml"), "model_name=llama3-test", "override_model_config=true",
		  "base_emb_dim=2147483647", "base_mlp_dim=2147483647", "base_num_query_heads=1",
		  "base_num_kv_heads=1", "head_dim=1");
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	CHECK(st_llama_check_config(&c, &n) == ST_EINVAL &&
	      !strcmp(st_errmsg(), "model llama3-test is too large: its parameter count overflows 64 bits"));

	rc = LOAD(&c, rpath("configs/default.yml"), "model_name=llama3-8b");
	CHECK_MSG(rc == 0 && !c.rope_llama31, "%s", st_errmsg());
	rc = LOAD(&c, rpath("configs/default.yml"), "model_name=llama3-70b");
	CHECK_MSG(rc == 0 && !c.rope_llama31 && c.emb_dim == 8192 && c.num_decoder_layers == 80 &&
			  c.num_query_heads == 64 && c.mlp_dim == 28672, "%s", st_errmsg());
	rc = LOAD(&c, rpath("configs/default.yml"), "model_name=llama3-test", "rope_type=llama3.1",
		  "rope_scale_factor=32");
	CHECK_MSG(rc == 0 && c.rope_llama31, "%s", st_errmsg());
	CHECK_NEAR(c.rope_scale_factor, 32, 0);
	/* MaxText's rope_use_scale=false turns the scaling off even for llama3.1 models */
	rc = LOAD(&c, rpath("configs/default.yml"), "model_name=llama3.1-8b", "rope_use_scale=false");
	CHECK_MSG(rc == 0 && !c.rope_llama31, "%s", st_errmsg());
}

static void test_model_override(void)
{
	st_config c;
	int rc = LOAD(&c, rpath("configs/default.yml"), "model_name=llama3-8b", "override_model_config=true",
		      "base_emb_dim=256");

	CHECK_MSG(rc == 0 && c.emb_dim == 256 && c.num_query_heads == 32, "%s", st_errmsg());
	FAIL_CASE(rpath("configs/default.yml"), "override_model_config", "'base_emb_dim'", "model_name=llama3-8b",
		  "base_emb_dim=256");
	/* the model's own value on the command line is not a conflict */
	rc = LOAD(&c, rpath("configs/default.yml"), "model_name=llama3-8b", "base_emb_dim=4096",
		  "rope_max_timescale=500000");
	CHECK_MSG(rc == 0, "%s", st_errmsg());
}

static void test_derived(void)
{
	st_config c;
	int rc;

	rc = LOAD(&c, rpath("configs/default.yml"), "steps=-1", "learning_rate_schedule_steps=50");
	CHECK_MSG(rc == 0 && c.steps == 50 && c.learning_rate_schedule_steps == 50, "%s", st_errmsg());
	rc = LOAD(&c, rpath("configs/default.yml"), "steps=30", "learning_rate_schedule_steps=100");
	CHECK_MSG(rc == 0 && c.steps == 30 && c.learning_rate_schedule_steps == 100, "%s", st_errmsg());

	unsetenv("JOBSET_NAME");
	rc = LOAD(&c, rpath("configs/default.yml"), "run_name=", "base_output_directory=");
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	/* llama3-16m_YYYY-MM-DD-HH-MM-SS: a new run's name, stamped to the second */
	CHECK_MSG(strncmp(c.run_name, "llama3-16m_", 11) == 0 && strlen(c.run_name) == 11 + 19 && c.run_name_derived,
		  "%s", c.run_name);
	CHECK(c.base_output_directory[0] == '/');
	CHECK(strstr(c.base_output_directory, "/slicetrain_output") != NULL);

	/* a derived name whose directory exists (another run's, this second)
	 * takes the next suffix; nothing is created until the run claims it */
	char out[600], taken[900], runs[520], *ov = out;
	snprintf(runs, sizeof(runs), "%s", tpath("runs"));
	snprintf(out, sizeof(out), "base_output_directory=%s", runs);
	for (int attempt = 0; attempt < 3; attempt++) { /* the second may turn between the loads */
		rc = LOAD(&c, rpath("configs/default.yml"), "run_name=", ov);
		CHECK_MSG(rc == 0, "%s", st_errmsg());
		snprintf(taken, sizeof(taken), "%s/%s", runs, c.run_name);
		CHECK(mkdir(runs, 0777) == 0 || errno == EEXIST);
		CHECK(mkdir(taken, 0777) == 0);
		char first[ST_NAME_MAX];
		snprintf(first, sizeof(first), "%s", c.run_name);
		rc = LOAD(&c, rpath("configs/default.yml"), "run_name=", ov);
		CHECK_MSG(rc == 0, "%s", st_errmsg());
		if (strncmp(c.run_name, first, strlen(first)))
			continue; /* another second: try again */
		CHECK_MSG(!strcmp(c.run_name + strlen(first), "_2"), "%s after %s", c.run_name, first);
		snprintf(taken, sizeof(taken), "%s/%s", runs, c.run_name);
		CHECK(access(taken, F_OK) != 0); /* not created by the load */
		/* the claim makes it; a run that made it in between pushes it on */
		CHECK(mkdir(taken, 0777) == 0);
		CHECK_MSG(st_config_claim_run_dir(&c) == 0, "%s", st_errmsg());
		CHECK_MSG(!strcmp(c.run_name + strlen(first), "_3"), "%s after %s_2", c.run_name, first);
		snprintf(taken, sizeof(taken), "%s/%s", runs, c.run_name);
		CHECK(access(taken, F_OK) == 0);
		break;
	}
	/* a given name: nothing to claim */
	rc = LOAD(&c, rpath("configs/default.yml"), "run_name=given", ov);
	CHECK(rc == 0 && !c.run_name_derived && st_config_claim_run_dir(&c) == 0);
	snprintf(taken, sizeof(taken), "%s/given", runs);
	CHECK(access(taken, F_OK) != 0);

	setenv("JOBSET_NAME", "jobset-7", 1);
	rc = LOAD(&c, rpath("configs/default.yml"), "run_name=\"\"");
	CHECK_MSG(rc == 0 && strcmp(c.run_name, "jobset-7") == 0 && !c.run_name_derived, "%s", st_errmsg());
	unsetenv("JOBSET_NAME");
}

/* The tutorial's command line against MaxText's own base.yml, unchanged. */
static int load_maxtext_tutorial(void *arg)
{
	st_config *c = arg;
	return LOAD(c, maxtext_base, "model_name=llama3-8b", "dataset_type=synthetic", "per_device_batch_size=4",
		    "max_target_length=4096", "steps=100", "run_name=x", "base_output_directory=/tmp/x");
}

static void test_maxtext_base(void)
{
	st_config c;
	const char *err;
	int rc;

	if (!have_maxtext) {
		check_skip_dep("MaxText base.yml cases (also in test_checkpoint_keys): %s not found (shared fixtures)",
			       maxtext_base);
		return;
	}
	err = capture_stderr(load_maxtext_tutorial, &c, &rc);
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	CHECK(strcmp(c.model_name, "llama3-8b") == 0);
	CHECK(c.emb_dim == 4096 && c.num_query_heads == 32 && c.num_kv_heads == 8 && c.num_decoder_layers == 32);
	CHECK(c.mlp_dim == 14336 && c.head_dim == 128 && c.vocab_size == 128256);
	CHECK_NEAR(c.rope_theta, 500000, 0);
	CHECK_NEAR(c.norm_eps, 1e-5, 1e-12);
	CHECK(!c.rope_llama31);
	CHECK(c.per_device_batch_size == 4 && c.max_target_length == 4096);
	CHECK(c.steps == 100 && c.learning_rate_schedule_steps == 100);
	CHECK(strcmp(c.run_name, "x") == 0 && strcmp(c.base_output_directory, "/tmp/x") == 0);
	CHECK(c.dtype == ST_DTYPE_BF16 && c.weight_dtype == ST_DTYPE_F32);
	CHECK(c.remat_policy == ST_REMAT_FULL && c.dataset_type == ST_DATA_SYNTHETIC);
	CHECK(c.ici_fsdp_parallelism == -1 && c.dcn_data_parallelism == -1 && c.num_slices == -1);
	CHECK_NEAR(c.learning_rate, 3e-5, 1e-12);
	CHECK_NEAR(c.learning_rate_final_fraction, 0.1, 1e-12);
	/* one warning line: the MaxText keys kept at their values */
	CHECK_MSG(count_lines(err) == 1 && strstr(err, "not implemented by slicetrain"), "%s", err);

	/* model_name=llama3.1-8b from MaxText's models/: scaling by name */
	rc = LOAD(&c, maxtext_base, "model_name=llama3.1-8b", "dataset_type=synthetic", "run_name=x");
	CHECK_MSG(rc == 0 && c.rope_llama31, "%s", st_errmsg());

	rc = LOAD(&c, maxtext_base, "model_name=llama3-70b", "dataset_type=synthetic", "run_name=x", "hardware=tpu",
		  "enable_checkpointing=True");
	CHECK_MSG(rc == 0 && c.num_decoder_layers == 80, "%s", st_errmsg());

	FAIL_CASE(maxtext_base, "dataset_type 'tfds' is not supported by slicetrain", "base.yml:", "model_name=llama3-8b");
	FAIL_CASE(maxtext_base, "key 'hardware' is not supported by slicetrain", "tpu", "dataset_type=synthetic",
		  "hardware=gpu");
	/* list and map values equal to the file's */
	rc = LOAD(&c, maxtext_base, "dataset_type=synthetic", "vllm_hf_overrides={}", "mrope_section=[24, 20, 20]",
		  "adamw_mask=[]", "run_name=x");
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	FAIL_CASE(maxtext_base, "mrope_section", "not supported", "dataset_type=synthetic", "mrope_section=[1,2]");
	FAIL_CASE(maxtext_base, "did you mean 'learning_rate'", NULL, "dataset_type=synthetic", "lerning_rate=1");
	FAIL_CASE(maxtext_base, "override_model_config", "base_num_decoder_layers", "dataset_type=synthetic",
		  "model_name=llama3-8b", "base_num_decoder_layers=2");
}

/* ---- rejected input ---- */

static void test_bad_files(void)
{
	char deep[1200], text[4096];
	const char *base = rpath("configs/base.yml");

	FAIL_CASE(tpath("missing.yml"), "cannot read config", "missing.yml", "steps=1");
	FAIL_CASE(tmpdir, "cannot read config", NULL, "steps=1"); /* a directory */

	write_file("malformed.yml", "steps: 10\nrun_name: [a, b\nlearning_rate: 1\n");
	FAIL_CASE(tpath("malformed.yml"), "malformed.yml:", NULL, "steps=1");
	write_file("badindent.yml", "steps: 10\n  run_name: x\n");
	FAIL_CASE(tpath("badindent.yml"), "badindent.yml:2:", NULL, "steps=1");
	write_file("tab.yml", "steps:\t10\n\tbad: 1\n");
	FAIL_CASE(tpath("tab.yml"), "tab.yml:", NULL, "steps=1");

	write_file("empty.yml", "");
	FAIL_CASE(tpath("empty.yml"), "empty config", NULL, "steps=1");
	write_file("comments.yml", "# only a comment\n");
	FAIL_CASE(tpath("comments.yml"), "empty config", NULL, "steps=1");

	write_bytes("garbage.yml", "\x7f" "ELF\x02\x01\x01\x00\x00\xff\xfe\x03garbage", 20);
	FAIL_CASE(tpath("garbage.yml"), "garbage.yml:1:", NULL, "steps=1");
	write_bytes("nul.yml", "steps: 1\nrun_name: a\0b\n", 22);
	FAIL_CASE(tpath("nul.yml"), "nul.yml:2:", NULL, "steps=1");
	write_bytes("badutf8.yml", "run_name: \xc3\x28\n", 13);
	FAIL_CASE(tpath("badutf8.yml"), "badutf8.yml:1:", NULL, "steps=1");

	write_file("list.yml", "- steps\n- 10\n");
	FAIL_CASE(tpath("list.yml"), "top level", "list.yml:1", "steps=1");
	write_file("scalar.yml", "just some text\n");
	FAIL_CASE(tpath("scalar.yml"), "top level", NULL, "steps=1");

	write_file("dup.yml", "steps: 10\nrun_name: a\nsteps: 11\n");
	FAIL_CASE(tpath("dup.yml"), "duplicate key 'steps'", "dup.yml:3", "run_name=b");

	memset(deep, '[', 600);
	memset(deep + 600, ']', 600);
	snprintf(text, sizeof(text), "steps: %.1200s\n", deep);
	write_file("deep.yml", text);
	FAIL_CASE(tpath("deep.yml"), "nested more than", "deep.yml:", "run_name=b");

	write_file("alias_node.yml", "a: &x 1\nsteps: *x\n");
	FAIL_CASE(tpath("alias_node.yml"), "aliases", "alias_node.yml:2", "run_name=b");
	write_file("twodocs.yml", "steps: 1\n---\nsteps: 2\n");
	FAIL_CASE(tpath("twodocs.yml"), "more than one YAML document", NULL, "run_name=b");
	write_file("complexkey.yml", "? [a, b]\n: 1\n");
	FAIL_CASE(tpath("complexkey.yml"), "complexkey.yml:1", "keys", "run_name=b");

	snprintf(text, sizeof(text), "base_config: \"%s\"\nsteps: 999999999999999999999\n", base);
	write_file("huge.yml", text);
	FAIL_CASE(tpath("huge.yml"), "huge.yml:2", "out of range", "run_name=b");
	snprintf(text, sizeof(text), "base_config: \"%s\"\nsteps: abc\n", base);
	write_file("badtype.yml", text);
	FAIL_CASE(tpath("badtype.yml"), "badtype.yml:2: key 'steps': invalid value 'abc'", "integer", "run_name=b");
	snprintf(text, sizeof(text), "base_config: \"%s\"\nsteps: {a: 1}\n", base);
	write_file("maptype.yml", text);
	FAIL_CASE(tpath("maptype.yml"), "maptype.yml:2", "steps", "run_name=b");
	snprintf(text, sizeof(text), "base_config: \"%s\"\nnum_experts: 8\n", base);
	write_file("moe.yml", text);
	FAIL_CASE(tpath("moe.yml"), "moe.yml:2", "num_experts", "run_name=b");
	write_file("aliasconflict.yml", "learning_rate_final_fraction: 0.1\ncosine_learning_rate_final_fraction: 0.2\n");
	FAIL_CASE(tpath("aliasconflict.yml"), "cosine_learning_rate_final_fraction", "aliasconflict.yml:2",
		  "run_name=b");

	/* base_config chains */
	write_file("cycle_a.yml", "base_config: cycle_b.yml\nsteps: 1\n");
	write_file("cycle_b.yml", "base_config: \"cycle_a.yml\"\nsteps: 2\n");
	FAIL_CASE(tpath("cycle_a.yml"), "cycle", "cycle_a.yml", "run_name=b");
	write_file("self.yml", "base_config: self.yml\n");
	FAIL_CASE(tpath("self.yml"), "cycle", NULL, "run_name=b");
	write_file("noparent.yml", "base_config: nowhere.yml\n");
	FAIL_CASE(tpath("noparent.yml"), "cannot read config", "nowhere.yml", "run_name=b");
	write_file("badparent.yml", "base_config: [a]\n");
	FAIL_CASE(tpath("badparent.yml"), "base_config", "badparent.yml:1", "run_name=b");
}

static void test_bad_overrides(void)
{
	char longkey[400], longval[400];
	const char *cfg = rpath("configs/default.yml");

	FAIL_CASE(cfg, "unknown key 'lerning_rate'; did you mean 'learning_rate'?", NULL, "lerning_rate=0.1");
	FAIL_CASE(cfg, "unknown key 'qqqqqqqqqqqqqqqqqqqqqqq'", NULL, "qqqqqqqqqqqqqqqqqqqqqqq=1");
	FAIL_CASE(cfg, "unknown key 'scan_layers'", NULL, "scan_layers=true"); /* not in any loaded file */
	FAIL_CASE(cfg, "no key before '='", NULL, "=value");
	FAIL_CASE(cfg, "not a key=value", "steps", "steps");
	FAIL_CASE(cfg, "key 'steps': empty value", "integer", "steps=");
	FAIL_CASE(cfg, "command line: key 'steps': invalid value 'abc', expected an integer", NULL, "steps=abc");
	FAIL_CASE(cfg, "key 'steps': invalid value '1.5'", "command line", "steps=1.5");
	FAIL_CASE(cfg, "steps", "integer", "steps=[1, 2]");
	FAIL_CASE(cfg, "steps", "out of range", "steps=99999999999999999999999");
	FAIL_CASE(cfg, "learning_rate", "out of range", "learning_rate=1e999");
	FAIL_CASE(cfg, "learning_rate", "finite", "learning_rate=.nan");
	FAIL_CASE(cfg, "learning_rate", "a number", "learning_rate=fast");
	FAIL_CASE(cfg, "enable_data_shuffling", "true or false", "enable_data_shuffling=maybe");
	FAIL_CASE(cfg, "cannot parse", "run_name", "run_name=[a");
	FAIL_CASE(cfg, "base_config", NULL, "base_config=x.yml");
	FAIL_CASE(cfg, "cosine_learning_rate_final_fraction", NULL, "learning_rate_final_fraction=0.1",
		  "cosine_learning_rate_final_fraction=0.2");

	memset(longkey, 'k', 300);
	strcpy(longkey + 300, "=1");
	FAIL_CASE(cfg, "not a valid key name", NULL, longkey);
	FAIL_CASE(cfg, "not a valid key name", NULL, "st eps=1");
	memcpy(longval, "run_name=", 9);
	memset(longval + 9, 'r', 300);
	longval[309] = '\0';
	FAIL_CASE(cfg, "run_name", "too long", longval);

	/* models */
	FAIL_CASE(cfg, "unknown model_name 'llama9-1t'", "available: ", "model_name=llama9-1t");
	FAIL_CASE(cfg, "llama3-test", "llama3.1-8b", "model_name=llama9-1t");
	FAIL_CASE(cfg, "invalid model_name", NULL, "model_name=../../etc/passwd");
	FAIL_CASE(cfg, "model_name", NULL, "model_name=None");
	FAIL_CASE(cfg, "override_model_config", "base_num_query_heads", "model_name=llama3-test",
		  "base_num_query_heads=8");
	FAIL_CASE(cfg, "override_model_config", "true or false", "override_model_config=yes please");
}

static void test_bad_values(void)
{
	const char *cfg = rpath("configs/default.yml");

	/* sizes */
	FAIL_CASE(cfg, "base_emb_dim must be positive", NULL, "model_name=default", "base_emb_dim=0");
	FAIL_CASE(cfg, "base_num_query_heads must be positive", NULL, "model_name=default", "base_num_query_heads=-1");
	FAIL_CASE(cfg, "base_num_kv_heads must be positive", NULL, "model_name=default", "base_num_kv_heads=0");
	FAIL_CASE(cfg, "base_num_decoder_layers must be positive", NULL, "model_name=default",
		  "base_num_decoder_layers=0");
	FAIL_CASE(cfg, "base_mlp_dim must be positive", NULL, "model_name=default", "base_mlp_dim=-5");
	FAIL_CASE(cfg, "head_dim must be positive", NULL, "model_name=default", "head_dim=0");
	FAIL_CASE(cfg, "vocab_size must be positive", NULL, "model_name=default", "vocab_size=0");
	FAIL_CASE(cfg, "base_emb_dim", "too large", "model_name=default", "base_emb_dim=4294967296");
	FAIL_CASE(cfg, "max_target_length must be positive", NULL, "max_target_length=0");
	FAIL_CASE(cfg, "steps must be positive", NULL, "steps=0");
	FAIL_CASE(cfg, "steps must be positive", NULL, "steps=-2");
	FAIL_CASE(cfg, "both -1", NULL, "steps=-1");
	FAIL_CASE(cfg, "learning_rate_schedule_steps", NULL, "learning_rate_schedule_steps=0");
	FAIL_CASE(cfg, "per_device_batch_size must be positive", NULL, "per_device_batch_size=0");
	FAIL_CASE(cfg, "per_device_batch_size must be positive", NULL, "per_device_batch_size=-1");
	FAIL_CASE(cfg, "fractional", "per_device_batch_size", "per_device_batch_size=0.5");
	FAIL_CASE(cfg, "fractional", "per_device_batch_size", "per_device_batch_size=2.5");
	FAIL_CASE(cfg, "gradient_accumulation_steps must be positive", NULL, "gradient_accumulation_steps=0");
	FAIL_CASE(cfg, "log_period", NULL, "log_period=0");
	FAIL_CASE(cfg, "not divisible by num_query_heads", "base_num_query_heads", "model_name=default",
		  "base_num_query_heads=3");
	FAIL_CASE(cfg, "not divisible by num_kv_heads", "base_num_kv_heads", "model_name=default",
		  "base_num_kv_heads=3");
	FAIL_CASE(cfg, "global_parameter_scale", "power of 2", "global_parameter_scale=3");
	FAIL_CASE(cfg, "global_parameter_scale", "power of 2", "global_parameter_scale=0");
	FAIL_CASE(cfg, "global_parameter_scale", "too large", "global_parameter_scale=4611686018427387904");

	/* enums */
	FAIL_CASE(cfg, "dataset_type 'tfds' is not supported by slicetrain; supported: synthetic, tokens", NULL,
		  "dataset_type=tfds");
	FAIL_CASE(cfg, "dataset_type 'hf'", "synthetic, tokens", "dataset_type=hf");
	FAIL_CASE(cfg, "dataset_type 'grain'", "synthetic, tokens", "dataset_type=grain");
	FAIL_CASE(cfg, "dataset_path", NULL, "dataset_type=tokens", "dataset_path=");
	FAIL_CASE(cfg, "remat_policy 'minimal_with_context' is not supported", "full, minimal, none, save-all",
		  "remat_policy=minimal_with_context");
	FAIL_CASE(cfg, "remat_policy 'save_qkv_proj'", "full, minimal, none, save-all", "remat_policy=save_qkv_proj");
	FAIL_CASE(cfg, "dtype 'float16'", "float32, bfloat16", "dtype=float16");
	FAIL_CASE(cfg, "weight_dtype 'bfloat16'", "supported: float32", "weight_dtype=bfloat16");
	FAIL_CASE(cfg, "rope_type 'yarn'", "default, llama3.1", "rope_type=yarn");

	/* optimizer */
	FAIL_CASE(cfg, "learning_rate", NULL, "learning_rate=-1e-3");
	FAIL_CASE(cfg, "warmup_steps_fraction", NULL, "warmup_steps_fraction=1.5");
	FAIL_CASE(cfg, "warmup_steps_fraction", NULL, "warmup_steps_fraction=-0.1");
	FAIL_CASE(cfg, "adam_b1", NULL, "adam_b1=1");
	FAIL_CASE(cfg, "adam_b2", NULL, "adam_b2=-0.5");
	FAIL_CASE(cfg, "adam_eps", NULL, "adam_eps=0");
	FAIL_CASE(cfg, "adam_weight_decay", NULL, "adam_weight_decay=-1");
	FAIL_CASE(cfg, "gradient_clipping_threshold", NULL, "gradient_clipping_threshold=-1");
	FAIL_CASE(cfg, "rope_high_freq_factor", NULL, "model_name=llama3.1-8b", "rope_high_freq_factor=0.5");
	FAIL_CASE(cfg, "rope_max_timescale", NULL, "model_name=default", "rope_max_timescale=0");
	FAIL_CASE(cfg, "normalization_layer_epsilon", NULL, "model_name=default", "normalization_layer_epsilon=0");

	/* mesh */
	FAIL_CASE(cfg, "ici_data_parallelism", NULL, "ici_data_parallelism=0");
	FAIL_CASE(cfg, "num_slices", NULL, "num_slices=-3");

	/* architecture keys our Llama needs at one value */
	FAIL_CASE(cfg, "mlp_activations", "\"silu\", \"linear\"", "override_model_config=true", "mlp_activations=[gelu]");
	FAIL_CASE(cfg, "logits_via_embedding", "false", "override_model_config=true", "logits_via_embedding=true");
	FAIL_CASE(cfg, "decoder_block", "llama2", "override_model_config=true", "decoder_block=gemma2");
	FAIL_CASE(cfg, "attention_type", "global", "attention_type=local_sliding");
	FAIL_CASE(cfg, "final_logits_soft_cap", NULL, "final_logits_soft_cap=30.0");
	FAIL_CASE(cfg, "opt_type", "adamw", "opt_type=sgd");
}

static void remove_tree(const char *dir)
{
	char path[1024];
	struct dirent *d;
	DIR *dp = opendir(dir);

	if (!dp)
		return;
	while ((d = readdir(dp))) {
		if (strcmp(d->d_name, ".") == 0 || strcmp(d->d_name, "..") == 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, d->d_name);
		if (d->d_type == DT_DIR)
			remove_tree(path);
		else
			unlink(path);
	}
	closedir(dp);
	rmdir(dir);
}

/* checkpoint keys: MaxText's defaults, None, the load-path rule, ours; JSON round trip */
static void test_checkpoint_keys(void)
{
	st_config c, back;
	char *json = NULL;
	int rc;

	rc = LOAD(&c, rpath("configs/base.yml"), "run_name=x", "base_output_directory=/tmp/x");
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	CHECK(c.enable_checkpointing && c.async_checkpointing && c.save_checkpoint_on_completion);
	CHECK(c.checkpoint_period == 10000 && c.max_num_checkpoints_to_keep == -1);
	CHECK(!c.load_parameters_path[0] && !c.load_full_state_path[0]);
	CHECK(c.checkpoint_failure_policy == ST_CKPT_FAIL_CONTINUE);
	rc = LOAD(&c, rpath("configs/base.yml"), "run_name=x", "base_output_directory=/tmp/x",
		  "max_num_checkpoints_to_keep=3", "checkpoint_failure_policy=stop", "async_checkpointing=false",
		  "load_parameters_path=/m/hf", "checkpoint_period=5");
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	CHECK(c.max_num_checkpoints_to_keep == 3 && c.checkpoint_failure_policy == ST_CKPT_FAIL_STOP);
	CHECK(!c.async_checkpointing && c.checkpoint_period == 5 && !strcmp(c.load_parameters_path, "/m/hf"));
	FAIL_CASE(rpath("configs/base.yml"), "At most one of `load_parameters_path` or `load_full_state_path`", NULL,
		  "load_parameters_path=/a", "load_full_state_path=/b");
	FAIL_CASE(rpath("configs/base.yml"), "max_num_checkpoints_to_keep must be positive", NULL,
		  "max_num_checkpoints_to_keep=0");
	FAIL_CASE(rpath("configs/base.yml"), "checkpoint_period must be positive", NULL, "checkpoint_period=0");
	FAIL_CASE(rpath("configs/base.yml"), "checkpoint_failure_policy 'later' is not supported", "continue, stop",
		  "checkpoint_failure_policy=later");
	/* elastic_batch (ours): constant by default, scale, nothing else */
	rc = LOAD(&c, rpath("configs/base.yml"), "run_name=x", "base_output_directory=/tmp/x");
	CHECK_MSG(rc == 0 && c.elastic_batch == ST_ELASTIC_BATCH_CONSTANT, "%s", st_errmsg());
	rc = LOAD(&c, rpath("configs/base.yml"), "run_name=x", "base_output_directory=/tmp/x", "elastic_batch=scale");
	CHECK_MSG(rc == 0 && c.elastic_batch == ST_ELASTIC_BATCH_SCALE, "%s", st_errmsg());
	FAIL_CASE(rpath("configs/base.yml"), "elastic_batch 'follow' is not supported", "constant, scale",
		  "elastic_batch=follow");
	if (have_maxtext) {
		rc = LOAD(&c, maxtext_base, "model_name=llama3.1-8b", "dataset_type=synthetic", "run_name=x",
			  "max_num_checkpoints_to_keep=None");
		CHECK_MSG(rc == 0 && c.max_num_checkpoints_to_keep == -1 && c.checkpoint_period == 10000,
			  "%s", st_errmsg());
	}

	/* the resolved config survives JSON (the checkpoint manifest's copy) */
	rc = LOAD(&c, rpath("configs/default.yml"), "rope_type=llama3.1", "max_num_checkpoints_to_keep=2",
		  "run_name=j\"s", "global_parameter_scale=2", "elastic_batch=scale");
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	CHECK(st_config_to_json(&c, &json) == 0 && json);
	CHECK_MSG(json && strstr(json, "\"base_emb_dim\":") && strstr(json, "\"rope_type\":\"llama3.1\"") &&
		  strstr(json, "\"elastic_batch\":\"scale\"") &&
		  !strstr(json, "global_parameter_scale"), "%s", json ? json : "");
	rc = json ? st_config_from_json(&back, json) : -1;
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	CHECK(memcmp(&c, &back, sizeof(c)) == 0);
	free(json);
	CHECK(st_config_from_json(&back, "{\"base_emb_dim\": \"x\"}") == ST_EINVAL);
	CHECK(strstr(st_errmsg(), "base_emb_dim"));
	CHECK(st_config_from_json(&back, "[1]") == ST_EINVAL);
	CHECK(st_config_from_json(&back, "{\"vocab_size\": 5}") == ST_EINVAL);
	CHECK(strstr(st_errmsg(), "missing or not positive"));
}

int main(void)
{
	char cfgdir[4096];
	const char *tmp = getenv("TMPDIR");

	root = getenv("ST_ROOT");
	if (!root || !*root) {
		fprintf(stderr, "test_config: ST_ROOT is not set (the repository root)\n");
		return 1;
	}
	snprintf(tmpdir, sizeof(tmpdir), "%s/st_config.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(cfgdir, sizeof(cfgdir), "%s/configs", root);
	st_config_set_config_dir(cfgdir);
	CHECK(strcmp(st_config_get_config_dir(), cfgdir) == 0);
	snprintf(maxtext_base, sizeof(maxtext_base), "%s/../shared/fixtures/maxtext-v0.2.1/base.yml", root);
	have_maxtext = access(maxtext_base, R_OK) == 0;

	test_default_job();
	test_warnings();
	test_base_defaults();
	test_precedence();
	test_values();
	test_alias();
	test_parameter_scale();
	test_rope();
	test_model_override();
	test_derived();
	test_maxtext_base();
	test_bad_files();
	test_bad_overrides();
	test_bad_values();
	test_checkpoint_keys();

	remove_tree(tmpdir);
	if (check_failures)
		fprintf(stderr, "test_config: %d check(s) failed\n", check_failures);
	else
		printf("test_config: all checks passed\n");
	return check_result();
}
