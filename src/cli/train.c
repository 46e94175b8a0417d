/*
 * train.c - slicetrain train [CONFIG.yml] [key=value ...]: load the config
 * (every rank of a group loads the same one) and run st_train.
 */
#include "cli/cli.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/err.h"
#include "base/status.h"
#include "comm/comm.h"
#include "config/config.h"
#include "model/llama.h"
#include "train/train.h"

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

int st_cmd_train(int argc, char **argv)
{
	if (argc > 0 && st_cli_is_help(argv[0])) {
		fputs(train_usage, stdout);
		return 0;
	}
	/* the overrides after CONFIG.yml are the config loader's to check */
	st_cli_config_args a;
	int rc = st_cli_config_args_parse(&a, argc, argv, NULL, "train", ST_CLI_LEADING);
	if (rc < 0) {
		fprintf(stderr, "slicetrain: error: %s\n", st_errmsg());
		st_cli_config_args_release(&a);
		return st_exit_status(rc);
	}
	st_config *c = calloc(1, sizeof(*c));
	if (!c) {
		fprintf(stderr, "slicetrain: out of memory\n");
		st_cli_config_args_release(&a);
		return 1;
	}
	/* every rank loads the same config: only rank 0 prints its warnings and summary */
	st_group_env env;
	rc = st_group_env_read(&env);
	int lead = rc < 0 || env.rank == 0;
	st_log_quiet(!lead);
	if (rc == 0)
		rc = st_config_load(c, a.path, a.nkv, a.kv);
	int64_t nparams = 0;
	if (rc == 0)
		rc = st_llama_check_config(c, &nparams); /* the checks that need the model's tensor table */
	/* a derived name is each process's own: a group's processes must be
	 * given theirs (slicetrain launch and the elastic controller pin it) */
	if (rc == 0 && c->run_name_derived && env.world_size > 1)
		rc = st_fail(ST_EINVAL, "run_name is empty, and each of this group's %d processes would derive a "
			     "name of its own (the time it started): set run_name (or JOBSET_NAME) the same for all of "
			     "them, as slicetrain launch does", env.world_size);
	/* before anything of the run is written: its data exists; a derived
	 * name is made this run's own (never an earlier run's directory) */
	if (rc == 0)
		rc = st_cli_check_data(c);
	if (rc == 0)
		rc = st_config_claim_run_dir(c);
	if (rc == 0 && lead)
		st_config_print(c, nparams);
	st_log_quiet(0);
	st_cli_config_args_release(&a);
	if (rc == 0) {
		st_train_result res;
		rc = st_train(c, &res);
		if (rc == ST_EINTR) {
			fprintf(stderr, "slicetrain: %s\n", st_errmsg());
			free(c);
			return st_exit_signal(res.stop_signal);
		}
	}
	free(c);
	if (rc < 0) {
		fprintf(stderr, "slicetrain: error: %s\n", st_errmsg());
		return st_exit_status(rc);
	}
	return 0;
}
