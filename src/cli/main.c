/*
 * slicetrain - elastic multi-slice training of Llama 3 models.
 *
 * main() parses the subcommand, and is the only place that exits: library
 * errors come back as codes and messages and are mapped to exit statuses
 * here (2 for bad input, 1 for other failures, 128+N when stopped by signal N).
 */
#include <libgen.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "ckpt/ckpt_cli.h"
#include "cli/launch.h"
#include "config/config.h"
#include "comm/comm.h"
#include "train/plan.h"
#include "train/train.h"

#define SLICETRAIN_VERSION "0.1.0"

static const char usage[] =
	"usage: slicetrain <command> [args]\n"
	"\n"
	"commands:\n"
	"  train [CONFIG.yml] [key=value ...]   train a model (MaxText-style config and overrides);\n"
	"                                       without CONFIG.yml, the embedded default job\n"
	"                                       (configs/default.yml: llama3-125m, synthetic data)\n"
	"  launch --num-slices S --devices-per-slice D [--threads-per-device T] -- [CONFIG.yml] [key=value ...]\n"
	"                                       start a worker group on this machine (docs/distributed.md)\n"
	"  export CHECKPOINT_DIR OUT_DIR        write a checkpoint as a Hugging Face model directory\n"
	"  ckpt list|verify DIR                 list checkpoints, or recompute their checksums\n"
	"  plan CONFIG.yml [key=value ...] [--num-slices S --devices-per-slice D] [--memory GiB]\n"
	"                                       per-device memory and FLOPs of a run, and whether it fits\n"
	"  help [command]                       this text, or a command's help\n"
	"  version                              print the version\n"
	"\n"
	"environment:\n"
	"  OMP_NUM_THREADS        threads per device (default: all cores)\n"
	"  SLICETRAIN_CONFIG_DIR  where configs/ lives (default: next to the binary, then ./configs)\n"
	"\n"
	"exit status: 0 success, 1 failure, 2 bad input (config, data, arguments),\n"
	"             128+N stopped by signal N\n";

static const char train_usage[] =
	"usage: slicetrain train [CONFIG.yml] [key=value ...]\n"
	"\n"
	"Loads CONFIG.yml (ours, e.g. configs/base.yml, or MaxText's own base.yml), then\n"
	"configs/models/<model_name>.yml, then the key=value overrides: precedence\n"
	"base < model < command line, as MaxText. Every key is documented in docs/config.md.\n"
	"Common keys: model_name, steps, per_device_batch_size, max_target_length,\n"
	"dataset_type (synthetic|tokens), dataset_path, learning_rate, remat_policy,\n"
	"metrics_file, run_name, base_output_directory.\n"
	"\n"
	"Each step prints MaxText's line:\n"
	"  completed step: N, seconds: X, TFLOP/s/device: X, Tokens/s/device: X, total_weights: N, loss: X\n"
	"\n"
	"example:\n"
	"  slicetrain train configs/base.yml model_name=llama3-test steps=50 per_device_batch_size=4 \\\n"
	"      max_target_length=64 learning_rate=1e-3\n";

/* configs/ next to the binary (build/slicetrain -> ../configs), else ./configs. */
static void find_config_dir(char *out, size_t n)
{
	const char *env = getenv("SLICETRAIN_CONFIG_DIR");
	if (env && *env) {
		snprintf(out, n, "%s", env);
		return;
	}
	char exe[PATH_MAX];
	ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (len > 0) {
		exe[len] = 0;
		char *dir = dirname(exe);
		char cand[PATH_MAX + 32];
		snprintf(cand, sizeof(cand), "%s/../configs", dir);
		if (n >= PATH_MAX && realpath(cand, out))
			return;
		snprintf(cand, sizeof(cand), "%s/configs", dir);
		if (n >= PATH_MAX && realpath(cand, out))
			return;
	}
	snprintf(out, n, "configs");
}

static int has_suffix(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && !strcmp(s + a - b, suf);
}

static int cmd_train(int argc, char **argv)
{
	if (argc > 0 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
		fputs(train_usage, stdout);
		return 0;
	}
	char config_dir[PATH_MAX], default_cfg[PATH_MAX + 16];
	find_config_dir(config_dir, sizeof(config_dir));
	st_config_set_config_dir(config_dir);
	const char *path;
	if (argc > 0 && (has_suffix(argv[0], ".yml") || has_suffix(argv[0], ".yaml"))) {
		path = argv[0];
		argc--;
		argv++;
	} else if (argc > 0 && !strchr(argv[0], '=')) {
		fprintf(stderr, "slicetrain: '%s' is neither a CONFIG.yml nor a key=value override\n", argv[0]);
		return 2;
	} else {
		snprintf(default_cfg, sizeof(default_cfg), "%s/default.yml", config_dir);
		path = default_cfg;
	}
	st_config *c = calloc(1, sizeof(*c));
	if (!c) {
		fprintf(stderr, "slicetrain: out of memory\n");
		return 1;
	}
	/* every rank loads the same config: only rank 0 prints its warnings and summary */
	st_group_env env;
	int rc = st_group_env_read(&env);
	int lead = rc < 0 || env.rank == 0;
	st_log_quiet(!lead);
	if (rc == 0)
		rc = st_config_load(c, path, argc, argv);
	if (rc == 0 && lead)
		st_config_print(c);
	st_log_quiet(0);
	if (rc == 0) {
		st_train_result res;
		rc = st_train(c, &res);
		if (rc == ST_EINTR) {
			fprintf(stderr, "slicetrain: %s\n", st_errmsg());
			free(c);
			return 128 + res.stop_signal;
		}
	}
	free(c);
	if (rc < 0) {
		fprintf(stderr, "slicetrain: error: %s\n", st_errmsg());
		return st_exit_status(rc);
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fputs(usage, stderr);
		return 2;
	}
	const char *cmd = argv[1];
	/* Kernels allocate per-call work buffers of a few MiB (attention's
	 * key/value layouts); glibc would map and unmap each one, and the
	 * training step would pay a page fault per 4 KiB every call. Keep
	 * blocks under 64 MiB on the heap and freed memory for reuse. */
	mallopt(M_MMAP_THRESHOLD, 64 << 20);
	mallopt(M_TRIM_THRESHOLD, 256 << 20);
	if (!strcmp(cmd, "train"))
		return cmd_train(argc - 2, argv + 2);
	if (!strcmp(cmd, "plan")) {
		char dir[PATH_MAX];
		find_config_dir(dir, sizeof(dir));
		st_config_set_config_dir(dir);
		return st_cmd_plan(argc - 2, argv + 2);
	}
	if (!strcmp(cmd, "export"))
		return st_ckpt_cmd_export(argc - 2, argv + 2);
	if (!strcmp(cmd, "ckpt"))
		return st_ckpt_cmd_ckpt(argc - 2, argv + 2);
	if (!strcmp(cmd, "launch"))
		return st_cmd_launch(argc - 2, argv + 2);
	if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
		if (argc > 2 && !strcmp(argv[2], "train"))
			fputs(train_usage, stdout);
		else
			fputs(usage, stdout);
		return 0;
	}
	if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
		printf("slicetrain %s\n", SLICETRAIN_VERSION);
		return 0;
	}
	fprintf(stderr, "slicetrain: unknown command '%s'\n\n%s", cmd, usage);
	return 2;
}
